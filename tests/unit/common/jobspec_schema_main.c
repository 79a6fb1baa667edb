/* jobspec-schema — prints docs/openapi.yaml's JobSpecInput block, generated
 * from the table common/jobspec.c validates with (jobspec_schema()). The
 * block is JSON (which YAML reads as flow style), indented under the
 * "    JobSpecInput:" line it prints first; replace that block in the doc
 * with this output. common_jobspec fails while the two differ.
 *
 *   build/tests/unit/common/jobspec-schema > /tmp/block.yaml
 *
 * A leaf key's schema is one line; objects with properties open up. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"

#define FLAGS (JSON_REAL_PRECISION(15) | JSON_ENCODE_ANY)

static void indent(int n)
{
	printf("%*s", n, "");
}

/* Prints JSON text s with every exponent-form number given a fraction
 * ("5e-05" -> "5.0e-05"): YAML 1.1 readers (PyYAML) take a float only with
 * a dot, and would read 5e-05 as a string. */
static void put_yaml_safe(const char *s)
{
	bool in_str = false, in_num = false, dot = false;
	for (const char *p = s; *p; p++) {
		char c = *p;
		if (in_str) {
			if (c == '\\' && p[1])
				putchar(*p++);
			else if (c == '"')
				in_str = false;
		} else if (c == '"') {
			in_str = true;
		} else if (!in_num && (c == '-' || (c >= '0' && c <= '9'))) {
			in_num = true;
			dot = false;
		} else if (in_num && c == '.') {
			dot = true;
		} else if (in_num && (c == 'e' || c == 'E')) {
			if (!dot)
				fputs(".0", stdout);
			in_num = false;
		} else if (in_num && !(c >= '0' && c <= '9')) {
			in_num = false;
		}
		putchar(*p);
	}
}

/* Prints k as a JSON string and ": " (keys may need escaping). */
static void print_key(const char *k)
{
	json_t *j = json_string(k);
	char *s = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
	printf("%s: ", s ? s : "\"\"");
	free(s);
	json_decref(j);
}

static int print_schema(json_t *o, int ind)
{
	if (!json_object_get(o, "properties")) {
		char *s = json_dumps(o, FLAGS);
		if (!s)
			return -1;
		put_yaml_safe(s);
		free(s);
		return 0;
	}
	printf("{\n");
	const char *k;
	json_t *v;
	size_t i = 0, n = json_object_size(o);
	json_object_foreach(o, k, v) {
		indent(ind + 2);
		print_key(k);
		if (strcmp(k, "properties") == 0) {
			printf("{\n");
			const char *pk;
			json_t *pv;
			size_t j = 0, m = json_object_size(v);
			json_object_foreach(v, pk, pv) {
				indent(ind + 4);
				print_key(pk);
				if (print_schema(pv, ind + 4) < 0)
					return -1;
				printf("%s\n", ++j < m ? "," : "");
			}
			indent(ind + 2);
			printf("}");
		} else {
			char *s = json_dumps(v, FLAGS);
			if (!s)
				return -1;
			put_yaml_safe(s);
			free(s);
		}
		printf("%s\n", ++i < n ? "," : "");
	}
	indent(ind);
	printf("}");
	return 0;
}

int main(void)
{
	json_t *s = jobspec_schema();
	if (!s) {
		fprintf(stderr, "jobspec-schema: out of memory\n");
		return 1;
	}
	printf("    JobSpecInput:\n");
	indent(6);
	int rc = print_schema(s, 6);
	printf("\n");
	json_decref(s);
	return rc < 0 || fflush(stdout) != 0 ? 1 : 0;
}
