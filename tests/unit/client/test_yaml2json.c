/* client_yaml2json — bertctl's YAML to JSON conversion (client/yaml2json.c):
 *   - typed scalars checked by hand against the YAML 1.2 core schema (null
 *     and ~, booleans, decimal/octal/hex integers, floats incl. 1e-4 and
 *     .5, quoted and tagged scalars staying what they say), integer vs
 *     float kept apart;
 *   - refusals naming line and column: .inf and .nan, duplicate keys, a
 *     second document, an unknown alias, a merge key, a non-scalar key, an
 *     integer beyond 64 bits, a foreign tag, a syntax error;
 *   - specs compared with PyYAML (/usr/bin/python3's yaml.safe_load, the
 *     independent reference; skipped when it is not importable): every
 *     recipe of docs/recipes written as YAML by PyYAML's safe_dump, and
 *     hand-written specs in block and flow style with anchors, comments
 *     and block scalars (typed the same way by YAML 1.1 and 1.2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "client/yaml2json.h"

static json_t *conv(const char *yaml, char *err, size_t errn)
{
	return yaml2json_load(yaml, strlen(yaml), err, errn);
}

static void test_typed_scalars(void **state)
{
	(void)state;
	static const char *const cases[][2] = {
		{"a: 1e-4", "{\"a\": 0.0001}"},
		{"a: 1.5E+3", "{\"a\": 1500.0}"},
		{"a: .5", "{\"a\": 0.5}"},
		{"a: -2.", "{\"a\": -2.0}"},
		{"a: 1.0", "{\"a\": 1.0}"},
		{"a: 12", "{\"a\": 12}"},
		{"a: +12", "{\"a\": 12}"},
		{"a: -7", "{\"a\": -7}"},
		{"a: 012", "{\"a\": 12}"},
		{"a: 0o17", "{\"a\": 15}"},
		{"a: 0x1F", "{\"a\": 31}"},
		{"a: 9223372036854775807", "{\"a\": 9223372036854775807}"},
		{"a: ~", "{\"a\": null}"},
		{"a:", "{\"a\": null}"},
		{"a: Null", "{\"a\": null}"},
		{"a: NULL", "{\"a\": null}"},
		{"a: true", "{\"a\": true}"},
		{"a: False", "{\"a\": false}"},
		{"a: TRUE", "{\"a\": true}"},
		/* YAML 1.1's booleans and 1_000 are plain strings in 1.2 */
		{"a: yes", "{\"a\": \"yes\"}"},
		{"a: off", "{\"a\": \"off\"}"},
		{"a: 1_000", "{\"a\": \"1_000\"}"},
		{"a: 1e", "{\"a\": \"1e\"}"},
		{"a: nulls", "{\"a\": \"nulls\"}"},
		{"a: '12'", "{\"a\": \"12\"}"},
		{"a: \"true\"", "{\"a\": \"true\"}"},
		{"a: 'null'", "{\"a\": \"null\"}"},
		{"a: !!str 12", "{\"a\": \"12\"}"},
		{"a: !!float 1", "{\"a\": 1.0}"},
		{"a: !!int 7", "{\"a\": 7}"},
		{"a: ! 7", "{\"a\": \"7\"}"},
		{"a: |\n  x\n  y\n", "{\"a\": \"x\\ny\\n\"}"},
		{"a: >-\n  x\n  y\n", "{\"a\": \"x y\"}"},
		{"1: x\ntrue: y", "{\"1\": \"x\", \"true\": \"y\"}"},
		{"a: &n [1, {b: 2}]\nc: *n", "{\"a\": [1, {\"b\": 2}], \"c\": [1, {\"b\": 2}]}"},
		{"---\na: 1\n...\n", "{\"a\": 1}"},
		{"[1, 2.5, x]", "[1, 2.5, \"x\"]"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char err[300] = "";
		json_t *got = conv(cases[i][0], err, sizeof err);
		json_t *want = json_loads(cases[i][1], 0, NULL);
		assert_non_null(want);
		if (!got || !json_equal(got, want)) {
			char *g = got ? json_dumps(got, JSON_COMPACT) : NULL;
			fail_msg("%s: got %s (%s), want %s", cases[i][0], g ? g : "NULL", err, cases[i][1]);
		}
		json_decref(got);
		json_decref(want);
	}
}

static void test_refused(void **state)
{
	(void)state;
	/* the text, and what the error must hold */
	static const char *const cases[][2] = {
		{"a: .inf", "line 1, column 4: .inf: JSON has no infinity"},
		{"a:\n  b: -.Inf", "line 2, column 6"},
		{"a: .NaN", "NaN"},
		{"a: 1\nb: 2\na: 3", "line 3, column 1: the key \"a\" appears twice"},
		{"a: 1\n---\nb: 2", "line 2, column 1: a second document"},
		{"a: *x", "the alias *x names no anchor"},
		{"b: &x {c: 1}\n<<: *x", "line 2, column 1: merge keys"},
		{"? [a]\n: 1", "a key must be a scalar"},
		{"a: 99999999999999999999", "does not fit in 64 bits"},
		{"a: 1e999", "out of range"},
		{"a: !foo x", "the tag !foo"},
		{"a: !!int x", "\"x\" is not a int"},
		{"a: [1, 2\nb: 3", "line "},
		{"a: b: c", "line 1, column"},
		{"", "no document"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char err[300] = "";
		json_t *got = conv(cases[i][0], err, sizeof err);
		if (got || !strstr(err, cases[i][1]))
			fail_msg("%s: %s, error \"%s\", want one holding \"%s\"", cases[i][0],
				 got ? "accepted" : "refused", err, cases[i][1]);
		json_decref(got);
	}
}

/* ------------------------------------------------------------ PyYAML */

static int have_pyyaml(void)
{
	return system("/usr/bin/python3 -c 'import yaml' >/dev/null 2>&1") == 0;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	return strdup(buf);
}

/* Our conversion of the YAML file at path equals PyYAML's safe_load. */
static void check_against_pyyaml(const char *path, const char *dir)
{
	char cmd[1200], out[600];
	snprintf(out, sizeof out, "%s/pyyaml.json", dir);
	snprintf(cmd, sizeof cmd,
		 "/usr/bin/python3 -c 'import sys, json, yaml; "
		 "json.dump(yaml.safe_load(open(sys.argv[1])), open(sys.argv[2], \"w\"))' '%s' '%s'",
		 path, out);
	assert_int_equal(system(cmd), 0);
	json_error_t e;
	json_t *want = json_load_file(out, 0, &e);
	assert_non_null(want);
	char *text = slurp(path), err[300] = "";
	json_t *got = conv(text, err, sizeof err);
	if (!got || !json_equal(got, want)) {
		char *g = got ? json_dumps(got, JSON_COMPACT) : NULL, *w = json_dumps(want, JSON_COMPACT);
		fail_msg("%s: got %s (%s), PyYAML %s", path, g ? g : "NULL", err, w);
	}
	json_decref(got);
	json_decref(want);
	free(text);
}

static const char *const hand_specs[] = {
	"# a job in block style\n"
	"name: tiny-yaml   # a comment\n"
	"dataset: shakes\n"
	"tags: [a, 'b c', \"d\"]\n"
	"model:\n"
	"  preset: bert-tiny\n"
	"  hidden_size: 32\n"
	"training_args:\n"
	"  max_steps: 30\n"
	"  learning_rate: 0.002\n"
	"  adam_epsilon: 1.0e-06\n"
	"  warmup_ratio: .1\n"
	"  max_grad_norm: -1.5e+3\n"
	"  optim: adamw\n"
	"mlm: {nsp: false, mlm_probability: 0.15, whole_word: true}\n"
	"notes: ~\n"
	"resources:\n"
	"  gpus: 1\n",

	"defaults: &ta\n"
	"  max_steps: 10\n"
	"  lr_scheduler_type: linear\n"
	"phases:\n"
	"  - name: one\n"
	"    training_args: *ta\n"
	"  - name: two\n"
	"    quoted: '10'\n"
	"    empty: ''\n"
	"    nothing:\n"
	"    list:\n"
	"    - 1\n"
	"    - -2\n"
	"    - 3.25\n"
	"    - null\n"
	"notes: |\n"
	"  line one\n"
	"  line two\n"
	"folded: >\n"
	"  a\n"
	"  b\n"
	"unicode: \"caf\\u00e9 \\t tab\"\n",

	"{\"dataset\": \"shakes\", \"model\": {\"preset\": \"bert-tiny\"}, \"training_args\": {\"max_steps\": 5}}\n",
};

static void test_against_pyyaml(void **state)
{
	(void)state;
	if (!have_pyyaml())
		skip();
	char dir[] = "/tmp/test_yaml2json.XXXXXX", path[600], cmd[1600];
	assert_non_null(mkdtemp(dir));
	for (size_t i = 0; i < sizeof hand_specs / sizeof hand_specs[0]; i++) {
		snprintf(path, sizeof path, "%s/hand%zu.yaml", dir, i);
		FILE *f = fopen(path, "w");
		assert_non_null(f);
		fputs(hand_specs[i], f);
		fclose(f);
		check_against_pyyaml(path, dir);
	}
	/* each recipe, as YAML written by PyYAML: equal to the recipe's JSON too */
	static const char *const recipes[] = {"bert-base-phase1", "bert-base-phase2", "domain-from-hub",
					      "nvidia-lamb-phase1", "nvidia-lamb-phase2", "roberta-style"};
	for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++) {
		char src[600];
		snprintf(src, sizeof src, "%s/docs/recipes/%s.json", SRC_ROOT, recipes[i]);
		snprintf(path, sizeof path, "%s/%s.yaml", dir, recipes[i]);
		snprintf(cmd, sizeof cmd,
			 "/usr/bin/python3 -c 'import sys, json, yaml; "
			 "open(sys.argv[2], \"w\").write(yaml.safe_dump(json.load(open(sys.argv[1])), "
			 "default_flow_style=False))' '%s' '%s'",
			 src, path);
		assert_int_equal(system(cmd), 0);
		check_against_pyyaml(path, dir);
		char *text = slurp(path), err[300] = "";
		json_t *got = conv(text, err, sizeof err), *want = json_load_file(src, 0, NULL);
		assert_non_null(want);
		if (!got || !json_equal(got, want))
			fail_msg("%s: the YAML differs from the recipe's JSON (%s)", recipes[i], err);
		json_decref(got);
		json_decref(want);
		free(text);
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_typed_scalars),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_against_pyyaml),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
