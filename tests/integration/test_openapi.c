/* The daemon's real answers against docs/openapi.yaml: a dataset (preparing
 * and ready), a job trained on the CPU backend (submit, get, list, metrics
 * with the timing breakdown, checkpoints, events, diagnosis, logs), the
 * devices, and problem bodies, each checked with openapi_check against the
 * schema the document gives for that operation and status. A key whose
 * type the document misstates fails here with its JSON path. Also: logs of
 * a rank or loader the job does not have are 400 naming the parameter, and
 * training by epochs (num_train_epochs) is resolved into max_steps at
 * submit from the dataset's totals, compared with the sequences the loader
 * really packs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <math.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"
#include "openapi_check.h"

#define DEADLINE_S 240

typedef it_fx fx;
static json_t *doc; /* docs/openapi.yaml as JSON (group setup) */

static json_t *load_doc(void)
{
	const char *root = getenv("BERTD_SOURCE_ROOT");
	char path[4096], err[512];
	snprintf(path, sizeof path, "%s/docs/openapi.yaml", root ? root : ".");
	json_t *doc = openapi_load(path, err, sizeof err);
	if (!doc)
		fprintf(stderr, "%s\n", err);
	return doc;
}

static int group_setup(void **state)
{
	(void)state;
	return (doc = load_doc()) ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	json_decref(doc);
	return 0;
}

static int setup(void **state)
{
	it_daemon_opts o = {.cpu_slots = "2", .dataset = "shakes", .corpus = "shakes.txt", .corpus_lines = 3000,
			    .vocab_size = 400};
	return it_setup(state, &o, 0);
}

static void expect_schema(const char *tmpl, const char *method, const http_resp *r,
			  const char *ctype)
{
	char status[8], err[1024];
	snprintf(status, sizeof status, "%ld", r->status);
	json_t *s = openapi_response_schema(doc, tmpl, method, status, ctype);
	if (!s)
		fail_msg("docs/openapi.yaml has no %s schema for %s %s %s", ctype, method, tmpl, status);
	if (!r->json)
		fail_msg("%s %s: the body is not JSON: %.200s", method, tmpl, r->body);
	if (openapi_check(doc, s, r->json, err, sizeof err) != 0)
		fail_msg("%s %s %s: the answer disagrees with docs/openapi.yaml at %s\nbody: %.2000s", method,
			 tmpl, status, err, r->body);
}

/* GET path, expecting want; checks the body against tmpl's schema. The
 * caller frees r. */
static void get_checked(fx *f, const char *path, const char *tmpl, long want, http_resp *r)
{
	assert_int_equal(http_get(&f->d, path, r), 0);
	if (r->status != want)
		fail_msg("GET %s: %ld, want %ld: %s", path, r->status, want, r->body);
	expect_schema(tmpl, "get", r, want < 400 ? "application/json" : "application/problem+json");
}

/* The checker itself refuses what the schema rules out (a test of the test). */
static void test_checker_refuses_wrong_types(void **state)
{
	(void)state;
	json_t *row = json_object_get(json_object_get(doc, "components"), "schemas");
	json_t *s = json_object_get(row, "MetricsRow");
	assert_non_null(s);
	char err[512];
	json_t *ok = json_loads("{\"step\":5,\"time\":\"2026-11-30T11:18:20.566Z\",\"epoch\":0,"
				"\"loss\":5.9,\"phases_ms\":{\"compute\":1.5},\"rank_step_ms\":[1.0,2.0]}", 0, NULL);
	assert_int_equal(openapi_check(doc, s, ok, err, sizeof err), 0);
	static const char *const bad[] = {
		"{\"step\":5,\"time\":\"t\",\"loss\":\"5.9\"}",            /* a string for a number */
		"{\"step\":5,\"time\":\"t\",\"phases_ms\":{\"compute\":\"x\"}}",
		"{\"step\":5,\"time\":\"t\",\"epoch\":0.5}",              /* a real for an integer */
		"{\"time\":\"t\"}",                                      /* step is required */
		"{\"step\":5,\"time\":\"t\",\"rank_step_ms\":{}}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		json_t *v = json_loads(bad[i], 0, NULL);
		assert_non_null(v);
		if (openapi_check(doc, s, v, err, sizeof err) == 0)
			fail_msg("the checker accepted %s", bad[i]);
		json_decref(v);
	}
	/* the schema this document had before: objects in a row where it said numbers */
	json_t *old = json_loads("{\"type\":\"object\",\"required\":[\"step\",\"time\"],"
				 "\"properties\":{\"step\":{\"type\":\"integer\"}},"
				 "\"additionalProperties\":{\"type\":\"number\"}}", 0, NULL);
	assert_int_not_equal(openapi_check(doc, old, ok, err, sizeof err), 0);
	json_decref(old);
	json_decref(ok);
	/* a problem body without its required keys */
	json_t *prob = json_loads("{\"title\":\"x\",\"status\":400}", 0, NULL);
	json_t *ps = json_object_get(row, "Problem");
	assert_int_not_equal(openapi_check(doc, ps, prob, err, sizeof err), 0);
	json_decref(prob);
}


static void test_answers_match_schema(void **state)
{
	fx *f = *state;
	http_resp r;
	char path[256];

	get_checked(f, "/v1/datasets/shakes", "/v1/datasets/{id}", 200, &r); /* preparing or ready */
	http_resp_free(&r);
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	get_checked(f, "/v1/datasets/shakes", "/v1/datasets/{id}", 200, &r);
	assert_true(json_is_null(json_object_get(r.json, "error"))); /* present, null: not failed */
	http_resp_free(&r);
	get_checked(f, "/v1/datasets", "/v1/datasets", 200, &r);
	http_resp_free(&r);

	char *spec = it_job_spec("two", "shakes", "training_args.max_steps", "10", "training_args.save_steps", "5",
				 "training_args.warmup_steps", "null", "training_args.dataloader_num_workers", "1",
				 "resources.gpus", "2", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	assert_int_equal(r.status, 201);
	expect_schema("/v1/jobs", "post", &r, "application/json");
	char id[32];
	snprintf(id, sizeof id, "%s", it_jstr(r.json, "id"));
	http_resp_free(&r);
	/* PATCH: 200 while the job lives (409 if it already ended), then 409 and 422 */
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	static const char change[] = "{\"priority\": 3, \"tags\": [\"exp:openapi\"], \"notes\": \"n\"}";
	assert_int_equal(http_do(&f->d, "PATCH", path, change, strlen(change), NULL, H_AUTH, &r), 0);
	assert_true(r.status == 200 || r.status == 409);
	expect_schema("/v1/jobs/{id}", "patch", &r, r.status == 200 ? "application/json" : "application/problem+json");
	http_resp_free(&r);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_decref(job);
	assert_int_equal(http_do(&f->d, "PATCH", path, change, strlen(change), NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 409);
	expect_schema("/v1/jobs/{id}", "patch", &r, "application/problem+json");
	http_resp_free(&r);
	assert_int_equal(http_do(&f->d, "PATCH", path, "{\"seed\": 1}", 11, NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 422);
	expect_schema("/v1/jobs/{id}", "patch", &r, "application/problem+json");
	http_resp_free(&r);

	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	get_checked(f, path, "/v1/jobs/{id}", 200, &r);
	http_resp_free(&r);
	get_checked(f, "/v1/jobs", "/v1/jobs", 200, &r);
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/metrics", id);
	get_checked(f, path, "/v1/jobs/{id}/metrics", 200, &r);
	/* the rows carry the timing breakdown, so its objects were checked */
	json_t *rows = json_object_get(r.json, "metrics");
	assert_int_equal(json_array_size(rows), 2); /* steps 5 and 10 */
	json_t *last = json_array_get(rows, 1);
	assert_true(json_is_object(json_object_get(last, "phases_ms")));
	assert_true(json_is_array(json_object_get(last, "rank_step_ms")));
	assert_true(json_is_object(json_object_get(last, "loader")));
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
	get_checked(f, path, "/v1/jobs/{id}/checkpoints", 200, &r);
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
	get_checked(f, path, "/v1/jobs/{id}/events", 200, &r);
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/diagnosis", id);
	get_checked(f, path, "/v1/jobs/{id}/diagnosis", 200, &r);
	http_resp_free(&r);
	get_checked(f, "/v1/devices", "/v1/devices", 200, &r);
	http_resp_free(&r);
	get_checked(f, "/v1/version", "/v1/version", 200, &r);
	http_resp_free(&r);
	get_checked(f, "/v1/jobs/job-0000000000000000", "/v1/jobs/{id}", 404, &r);
	http_resp_free(&r);
	get_checked(f, "/v1/datasets/nope", "/v1/datasets/{id}", 404, &r);
	http_resp_free(&r);

	/* logs: the job's two ranks and one loader exist; others are 400 */
	static const struct {
		const char *query, *field;
		long status;
	} logs[] = {
		{"rank=0", NULL, 200}, {"rank=1", NULL, 200}, {"rank=2", "rank", 400},
		{"rank=9", "rank", 400}, {"loader=0", NULL, 200}, {"loader=1", "loader", 400},
	};
	for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
		snprintf(path, sizeof path, "/v1/jobs/%s/logs?%s", id, logs[i].query);
		assert_int_equal(http_get(&f->d, path, &r), 0);
		if (r.status != logs[i].status)
			fail_msg("GET %s: %ld, want %ld: %s", path, r.status, logs[i].status, r.body);
		if (logs[i].field) {
			expect_schema("/v1/jobs/{id}/logs", "get", &r, "application/problem+json");
			assert_string_equal(it_jstr(r.json, "field"), logs[i].field);
			assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:invalid-parameter");
		} else {
			assert_true(r.len > 0); /* every process of a finished job logged */
		}
		http_resp_free(&r);
	}
}

/* The loader's "N sequences/epoch" line in its log. */
static long long loader_sequences(fx *f, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/logs?loader=0&tail=10000", id);
	http_resp r;
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 200);
	long long n = -1;
	for (char *p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		char *hit = strstr(p, " sequences/epoch");
		char *nl = strchr(p, '\n');
		if (hit && (!nl || hit < nl)) {
			char *b = hit;
			while (b > p && b[-1] >= '0' && b[-1] <= '9')
				b--;
			n = strtoll(b, NULL, 10);
			break;
		}
	}
	http_resp_free(&r);
	if (n < 0)
		fail_msg("no \"sequences/epoch\" line in job %s's loader log", id);
	return n;
}

/* num_train_epochs alone trains by epochs: the 201 already holds max_steps,
 * worked out here from the dataset's totals by the formula of
 * docs/jobspec.md; the job then runs that many steps. The estimate is
 * compared with the sequences the loader packs (printed; within 15%). */
static void test_train_by_epochs(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	json_t *ds = it_get_json(&f->d, "/v1/datasets/shakes");
	json_t *stats = json_object_get(ds, "stats");
	double tokens = (double)json_integer_value(json_object_get(stats, "tokens"));
	double sentences = (double)json_integer_value(json_object_get(stats, "sentences"));
	double documents = (double)json_integer_value(json_object_get(stats, "documents"));
	json_decref(ds);
	assert_true(tokens > 0 && sentences > 0 && documents > 0);
	/* T 128, short_seq_prob 0.1 (default), no NSP: room 126; the corpus
	 * cut into samples of the target, a [SEP] between documents */
	double room = 126, target = 0.9 * room + 0.1 * (2 + room) / 2;
	double seqs = ceil((tokens + documents) / target);
	long long want = (long long)ceil(2.0 * seqs / 8.0 - 1e-9); /* 2 epochs, batch 8, 1 rank */

	http_resp r;
	/* BERT's phase-1 sequence length, so the packing is the usual one
	 * (several sentences a sample); epochs, not steps */
	char *spec = it_job_spec("epochs", "shakes", "model.max_position_embeddings", "128",
				 "training_args.max_seq_length", "128", "training_args.save_steps", "1000",
				 "training_args.dataloader_num_workers", "1", "training_args.warmup_steps", "null",
				 "training_args.max_steps", "null", "training_args.num_train_epochs", "2", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status != 201)
		fail_msg("%ld %s", r.status, r.body);
	expect_schema("/v1/jobs", "post", &r, "application/json");
	json_t *ta = json_object_get(json_object_get(r.json, "spec"), "training_args");
	assert_int_equal(json_integer_value(json_object_get(ta, "max_steps")), want);
	assert_true(json_real_value(json_object_get(ta, "num_train_epochs")) == 2.0);
	char id[32];
	snprintf(id, sizeof id, "%s", it_jstr(r.json, "id"));
	http_resp_free(&r);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_decref(job);
	json_t *m = it_metrics_of(&f->d, id);
	json_t *lastrow = json_array_get(m, json_array_size(m) - 1);
	assert_int_equal(json_integer_value(json_object_get(lastrow, "step")), want);
	long long epoch = json_integer_value(json_object_get(lastrow, "epoch"));
	json_decref(m);
	long long real = loader_sequences(f, id);
	fprintf(stderr, "by epochs: %.0f tokens, %.0f sentences: estimate %.0f sequences/epoch, "
			"loader packed %lld (%+.1f%%); %lld steps; last batch in epoch %lld\n",
		tokens, sentences, seqs, real, 100.0 * (seqs - (double)real) / (double)real, want, epoch);
	assert_true(fabs(seqs - (double)real) <= 0.15 * (double)real);
	assert_true(epoch >= 1 && epoch <= 2); /* 2 passes: the last batch is in the second (from 0) */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_checker_refuses_wrong_types),
		cmocka_unit_test_setup_teardown(test_answers_match_schema, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_train_by_epochs, setup, it_teardown),
	};
	return IT_RUN(tests, group_setup, group_teardown);
}
