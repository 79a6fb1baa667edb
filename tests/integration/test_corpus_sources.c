/* Corpora as they arrive, through the API: a directory of *.jsonl.gz with a
 * README.md beside them is prepared with "exclude" into the same shards as
 * the plain .jsonl files (and fails naming README.md without it); "source"
 * as a list of a directory and a glob; a binary file fails naming it and
 * the offset; the 422s of "source", "include" and "exclude" name the field.
 * The .gz files are made by gzip(1) here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

typedef it_fx fx; /* data: the data root */

static int setup(void **state)
{
	it_daemon_opts o = {.cpu_slots = "1", .schedule = "false"};
	return it_setup(state, &o, 0);
}

/* n JSON lines of real text: non-blank lines of it_make_corpus's after the
 * first `first` of them, two a document. */
static void write_jsonl(const fx *f, const char *path, int first, int n)
{
	it_make_corpus(f->data, "lines.txt", 4 * (first + 2 * n));
	char p[512];
	snprintf(p, sizeof p, "%s/lines.txt", f->data);
	FILE *in = fopen(p, "r"), *out = fopen(path, "w");
	assert_non_null(in);
	assert_non_null(out);
	char line[4096], prev[4096] = "";
	int j = 0, docs = 0;
	while (docs < n && fgets(line, sizeof line, in)) {
		line[strcspn(line, "\n")] = 0;
		if (strspn(line, " \t\r") == strlen(line) || j++ < first)
			continue;
		if ((j - first) % 2 == 1) {
			snprintf(prev, sizeof prev, "%s", line);
			continue;
		}
		json_t *o = json_pack("{s:s++}", "text", prev, "\n", line);
		char *s = json_dumps(o, JSON_COMPACT);
		fprintf(out, "%s\n", s);
		free(s);
		json_decref(o);
		docs++;
	}
	assert_int_equal(docs, n);
	fclose(in);
	fclose(out);
	unlink(p);
}

static json_t *wait_done(const fx *f, const char *name)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/datasets/%s", name);
	json_t *ds = it_wait_state(&f->d, path, "ready|failed", 120);
	assert_non_null(ds);
	return ds;
}

static void expect_ready(const fx *f, const char *name)
{
	json_t *ds = wait_done(f, name);
	if (strcmp(it_jstr(ds, "state"), "ready") != 0) {
		char *s = json_dumps(ds, JSON_COMPACT);
		fail_msg("dataset %s: %s", name, s);
	}
	json_decref(ds);
}

/* The shards of datasets a and b: the same bytes, and as many. */
static void same_shards(const fx *f, const char *a, const char *b)
{
	int k = 0;
	for (;; k++) {
		char pa[512], pb[512];
		snprintf(pa, sizeof pa, "%s/datasets/%s/shard-%05d.bin", f->data, a, k);
		snprintf(pb, sizeof pb, "%s/datasets/%s/shard-%05d.bin", f->data, b, k);
		size_t na = 0, nb = 0;
		char *x = it_slurp(pa, &na), *y = it_slurp(pb, &nb);
		assert_true(!x == !y);
		if (!x)
			break;
		assert_int_equal(na, nb);
		assert_memory_equal(x, y, na);
		free(x);
		free(y);
	}
	assert_true(k > 0);
}

static long long stat_of(const fx *f, const char *name, const char *key)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/datasets/%s", name);
	json_t *ds = it_get_json(&f->d, path);
	long long v = json_integer_value(json_object_get(json_object_get(ds, "stats"), key));
	json_decref(ds);
	return v;
}

static void test_gz_dir_with_readme(void **state)
{
	fx *f = *state;
	char p[512];
	snprintf(p, sizeof p, "%s/plain", f->data);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof p, "%s/gz", f->data);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof p, "%s/plain/part-0.jsonl", f->data);
	write_jsonl(f, p, 0, 150);
	snprintf(p, sizeof p, "%s/plain/part-1.jsonl", f->data);
	write_jsonl(f, p, 300, 150);
	assert_int_equal(it_system("cd '%s' && for x in part-0 part-1; do gzip -c plain/$x.jsonl > gz/$x.jsonl.gz; done",
				   f->data), 0);
	snprintf(p, sizeof p, "%s/gz/README.md", f->data);
	it_write_file(p, "# The corpus\n\nTwo parts of JSON lines, gzip'd.\n");

	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"plain\",\"source\":\"plain/\",\"format\":\"jsonl\","
		"\"vocab\":{\"train\":{\"vocab_size\":300}}}"), 0);
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"gz\",\"source\":\"gz/\",\"format\":\"jsonl\",\"exclude\":[\"README*\"],"
		"\"vocab\":{\"train\":{\"vocab_size\":300}}}"), 0);
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"gz-readme\",\"source\":\"gz\",\"format\":\"jsonl\","
		"\"vocab\":{\"train\":{\"vocab_size\":300}}}"), 0);
	expect_ready(f, "plain");
	expect_ready(f, "gz");
	same_shards(f, "plain", "gz");
	assert_int_equal(stat_of(f, "gz", "documents"), 300);
	assert_int_equal(stat_of(f, "gz", "files"), 2);
	/* the effective request keeps the patterns */
	json_t *ds = it_get_json(&f->d, "/v1/datasets/gz");
	json_t *ex = json_object_get(json_object_get(ds, "request"), "exclude");
	assert_int_equal(json_array_size(ex), 1);
	assert_string_equal(json_string_value(json_array_get(ex, 0)), "README*");
	json_decref(ds);
	/* without exclude the README is read as JSON lines, and named */
	ds = wait_done(f, "gz-readme");
	assert_string_equal(it_jstr(ds, "state"), "failed");
	const char *err = it_jstr(ds, "error");
	assert_non_null(err);
	if (!strstr(err, "README.md:1"))
		fail_msg("error %s does not name README.md:1", err);
	json_decref(ds);

	/* a list: a directory and a glob, include choosing among found files */
	snprintf(p, sizeof p, "%s/extra", f->data);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(it_system("cd '%s' && gzip -c plain/part-0.jsonl > extra/more.jsonl.gz && "
				   "cp gz/README.md extra/", f->data), 0);
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"list\",\"source\":[\"gz/\",\"extra/*.gz\"],\"format\":\"jsonl\","
		"\"include\":[\"*.jsonl*\"],\"vocab\":{\"train\":{\"vocab_size\":300}}}"), 0);
	expect_ready(f, "list");
	assert_int_equal(stat_of(f, "list", "files"), 3);
	assert_int_equal(stat_of(f, "list", "documents"), 450);
}

static void test_binary_named(void **state)
{
	fx *f = *state;
	char p[512];
	snprintf(p, sizeof p, "%s/bin", f->data);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof p, "%s/bin/a.txt", f->data);
	it_write_file(p, "hello world\nfine text\n");
	/* a NUL byte at decompressed offset 5 of the second file */
	assert_int_equal(it_system("cd '%s/bin' && printf 'hello\\000world\\n' | gzip > b.txt.gz", f->data), 0);
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"bin\",\"source\":\"bin\",\"vocab\":{\"train\":{\"vocab_size\":128}}}"), 0);
	json_t *ds = wait_done(f, "bin");
	assert_string_equal(it_jstr(ds, "state"), "failed");
	const char *err = it_jstr(ds, "error");
	if (!err || !strstr(err, "b.txt.gz: binary data") || !strstr(err, "byte offset 5 of the decompressed"))
		fail_msg("error %s does not name b.txt.gz and offset 5", err ? err : "(none)");
	json_decref(ds);
}

static void expect_422(const fx *f, const char *body, const char *field, const char *detail)
{
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets", body, &r), 0);
	if (r.status != 422)
		fail_msg("%s -> %ld (want 422): %s", body, r.status, r.body);
	assert_string_equal(it_jstr(r.json, "field"), field);
	if (detail && !strstr(it_jstr(r.json, "detail"), detail))
		fail_msg("%s: detail %s lacks %s", body, it_jstr(r.json, "detail"), detail);
	http_resp_free(&r);
}

static void test_422(void **state)
{
	fx *f = *state;
	char p[512];
	snprintf(p, sizeof p, "%s/c.txt", f->data);
	it_write_file(p, "hello\n");
#define V ",\"vocab\":{\"train\":{\"vocab_size\":128}}}"
	expect_422(f, "{\"name\":\"e1\",\"source\":[]" V, "source", "1..64");
	expect_422(f, "{\"name\":\"e2\",\"source\":[\"c.txt\",7]" V, "source[1]", "string");
	expect_422(f, "{\"name\":\"e3\",\"source\":[\"c.txt\",\"nowhere/*.gz\"]" V, "source[1]", "no such file");
	expect_422(f, "{\"name\":\"e4\",\"source\":[\"*.parquet\"]" V, "source[0]", "no file matches");
	expect_422(f, "{\"name\":\"e5\",\"source\":[\"c.txt\",\"x/../*.txt\"]" V, "source[1]", NULL);
	expect_422(f, "{\"name\":\"e6\",\"source\":\"c.txt\",\"include\":\"*.txt\"" V, "include", "list");
	expect_422(f, "{\"name\":\"e7\",\"source\":\"c.txt\",\"include\":[\"*.txt\",\"\"]" V, "include[1]", NULL);
	expect_422(f, "{\"name\":\"e8\",\"source\":\"c.txt\",\"exclude\":[3]" V, "exclude[0]", NULL);
	expect_422(f, "{\"name\":\"e9\",\"source\":\"c.txt\",\"exclude\":{}" V, "exclude", NULL);
	/* none of them was stored */
	json_t *l = it_get_json(&f->d, "/v1/datasets");
	assert_int_equal(json_array_size(json_object_get(l, "datasets")), 0);
	json_decref(l);
#undef V
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_gz_dir_with_readme, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_binary_named, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_422, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
