/* The REST API end to end: every v1 jobs/system endpoint against the real
 * bertd binary (BERTD_BIN) on a loopback ephemeral port, one fresh daemon
 * and state dir per test. Checks status codes, the headers clients rely on
 * (Location, Content-Type, Allow, WWW-Authenticate) and bodies, the limits
 * (413 by Content-Length and chunked, 415, JSON depth), idempotent submit,
 * cursor paging, cancel/delete rules, and that a job acknowledged with 201
 * survives kill -9 of the daemon. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/store.h"
#include "harness.h"
#include "it_store.h"
#include "it_util.h"

#define MAX_BODY 4096
#define MAX_BODY_S "4096"
/* Jobs must stay where the test put them: the supervisor holds the queue. */
#define HOLD "--schedule", "false"
/* The smallest spec a user would send: everything else is defaulted. */
#define SPEC_OK "{\"name\":\"it-job\",\"dataset\":\"wikitext2\"}"

static int setup(void **state)
{
	const char *extra[] = {"--max-body-bytes", MAX_BODY_S, HOLD, NULL};
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	return it_setup_end(state, f,
			    f && !it_store_seed_dataset(&f->d, NULL) &&
				    !it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}));
}

/* Creates dir/name holding the files named, '|'-separated: what a model
 * directory looks like to the API (it checks which files exist and reads
 * the model's config: an empty one, BertConfig's defaults; the worker reads
 * the rest). Every other file is empty. */
static int model_dir(const char *dir, const char *name, const char *files)
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	if (mkdir(p, 0700) && errno != EEXIST)
		return -1;
	for (const char *f = files; *f;) {
		size_t n = strcspn(f, "|");
		snprintf(p, sizeof p, "%s/%s/%.*s", dir, name, (int)n, f);
		FILE *fp = fopen(p, "w");
		if (!fp)
			return -1;
		if (n == 11 && strncmp(f, "config.json", n) == 0)
			fputs("{}\n", fp);
		else if (n == 10 && strncmp(f, "state.json", n) == 0)
			fputs("{\"model\": {}}\n", fp);
		fclose(fp);
		f += n + (f[n] == '|');
	}
	return 0;
}

#define HF_FILES "config.json|model.safetensors"
#define CKPT_FILES "state.json|params.safetensors|optim.safetensors|DONE"
#define DONE_JOB "job-00000000000000c1"   /* completed, export and checkpoints */
#define FAILED_JOB "job-00000000000000c2" /* failed, nothing on disk */

/* Two finished jobs in the database and on disk, as the supervisor leaves
 * them: DONE_JOB with its export and checkpoints 10 (complete) and 20 (no
 * DONE: the save was cut short), FAILED_JOB with nothing. */
static int seed_finished_jobs(const bertd *d)
{
	char db[200], dir[300], ck[400];
	store *st = NULL;
	snprintf(db, sizeof db, "%s/bertd.db", d->state_dir);
	int rc = store_open(&st, db);
	struct {
		const char *id;
		enum job_state state;
	} jobs[] = {{DONE_JOB, JOB_COMPLETED}, {FAILED_JOB, JOB_FAILED}};
	for (size_t i = 0; rc == 0 && i < 2; i++) {
		store_job j = {.id = (char *)jobs[i].id, .name = (char *)jobs[i].id,
			       .spec_json = "{\"dataset\":\"wikitext2\"}", .created_ms = 1, .updated_ms = 1};
		rc = store_job_insert(st, &j, NULL, NULL, NULL, NULL, NULL, NULL);
		if (rc == 0) /* inserted queued; the supervisor's path to the end */
			rc = store_job_transition(st, j.id, JOB_MASK(JOB_QUEUED), JOB_RUNNING, NULL, NULL);
		if (rc == 0)
			rc = store_job_transition(st, j.id, JOB_MASK(JOB_RUNNING), jobs[i].state,
						  "seeded by the test", NULL);
	}
	snprintf(dir, sizeof dir, "%s/jobs", d->state_dir);
	mkdir(dir, 0700);
	snprintf(dir, sizeof dir, "%s/jobs/%s", d->state_dir, DONE_JOB);
	mkdir(dir, 0700);
	if (rc == 0)
		rc = model_dir(dir, "export", HF_FILES "|vocab.txt");
	snprintf(ck, sizeof ck, "%s/checkpoints", dir);
	mkdir(ck, 0700);
	if (rc == 0)
		rc = model_dir(ck, "ckpt-10", CKPT_FILES);
	if (rc == 0)
		rc = model_dir(ck, "ckpt-20", "state.json|params.safetensors|optim.safetensors");
	for (int step = 10; rc == 0 && step <= 20; step += 10) {
		char path[500];
		snprintf(path, sizeof path, "%s/ckpt-%d", ck, step);
		store_checkpoint c = {.step = step, .path = path, .bytes = 1};
		rc = store_checkpoint_insert(st, DONE_JOB, &c);
	}
	store_close(st);
	return rc;
}

/* A daemon whose only data root is <root>/data, holding a checkpoint dir, an
 * HF model dir, directories that are not models and a symlink that points out
 * of the root (at the state dir); and two finished jobs. */
static int setup_roots(void **state)
{
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	if (!f)
		return -1;
	bertd *d = &f->d;
	const char *data = f->data;
	char p[256];
	if (it_store_seed_dataset(d, NULL) || seed_finished_jobs(d))
		return it_setup_end(state, f, false);
	if (model_dir(data, "ckpt-100", CKPT_FILES) || model_dir(data, "hf", HF_FILES) || model_dir(data, "empty", "") ||
	    model_dir(data, "half-hf", "config.json") || model_dir(data, "cut-ckpt", "state.json|params.safetensors"))
		return it_setup_end(state, f, false);
	snprintf(p, sizeof p, "%s/escape", data);
	if (symlink(d->state_dir, p))
		return it_setup_end(state, f, false);
	const char *extra[] = {"--data-roots", data, HOLD, NULL};
	return it_setup_end(state, f, !it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}));
}

static bool matches(const char *s, const char *re)
{
	regex_t r;
	if (regcomp(&r, re, REG_EXTENDED | REG_NOSUB))
		return false;
	bool ok = regexec(&r, s, 0, NULL, 0) == 0;
	regfree(&r);
	return ok;
}

static void check_problem(const http_resp *r, long status, const char *code, const char *field)
{
	char ct[128], type[128];
	if (r->status != status)
		fail_msg("status %ld, want %ld; body: %s", r->status, status, r->body);
	assert_non_null(http_header(r, "Content-Type", ct, sizeof ct));
	assert_string_equal(ct, "application/problem+json");
	assert_non_null(r->json);
	snprintf(type, sizeof type, "urn:bertd:problem:%s", code);
	assert_string_equal(it_jstr(r->json, "type"), type);
	assert_int_equal(json_integer_value(json_object_get(r->json, "status")), status);
	assert_true(strlen(it_jstr(r->json, "title")) > 0);
	assert_true(strlen(it_jstr(r->json, "detail")) > 0);
	if (field)
		assert_string_equal(it_jstr(r->json, "field"), field);
}

static void check_json_ct(const http_resp *r)
{
	char ct[128];
	assert_non_null(http_header(r, "Content-Type", ct, sizeof ct));
	assert_string_equal(ct, "application/json");
}

static void post_path(const bertd *d, const char *fmt, const char *id, http_resp *r)
{
	char path[128];
	snprintf(path, sizeof path, fmt, id);
	assert_int_equal(http_do(d, "POST", path, NULL, 0, NULL, H_AUTH, r), 0);
}

static void get_path(const bertd *d, const char *fmt, const char *id, http_resp *r)
{
	char path[128];
	snprintf(path, sizeof path, fmt, id);
	assert_int_equal(http_get(d, path, r), 0);
}

/* ------------------------------------------------------------ system */

static void test_healthz_and_version(void **state)
{
	bertd *d = *state;
	http_resp r;
	char v[256];
	assert_int_equal(http_do(d, "GET", "/v1/healthz", NULL, 0, NULL, H_NO_AUTH, &r), 0);
	assert_int_equal(r.status, 200);
	check_json_ct(&r);
	assert_string_equal(it_jstr(r.json, "status"), "ok");
	http_resp_free(&r);

	assert_int_equal(http_do(d, "HEAD", "/v1/healthz", NULL, 0, NULL, H_NO_AUTH, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(r.len, 0);
	http_resp_free(&r);

	assert_int_equal(http_get(d, "/v1/version", &r), 0);
	assert_int_equal(r.status, 200);
	check_json_ct(&r);
	assert_string_equal(it_jstr(r.json, "api"), "v1");
	assert_true(matches(it_jstr(r.json, "version"), "^[0-9]+\\.[0-9]+\\.[0-9]+"));
	assert_true(json_is_boolean(json_object_get(r.json, "cuda")));
	json_t *nccl = json_object_get(r.json, "nccl"); /* the NCCL the daemon loaded, or null */
	assert_true(nccl && (json_is_null(nccl) || matches(json_string_value(nccl), "^[0-9]+\\.[0-9]+\\.[0-9]+$")));
	assert_non_null(http_header(&r, "Cache-Control", v, sizeof v));
	assert_string_equal(v, "no-store");
	http_resp_free(&r);
}

static void test_auth(void **state)
{
	bertd *d = *state;
	http_resp r;
	char v[256];
	assert_int_equal(http_do(d, "GET", "/v1/version", NULL, 0, NULL, H_NO_AUTH, &r), 0);
	check_problem(&r, 401, "unauthorized", NULL);
	assert_non_null(http_header(&r, "WWW-Authenticate", v, sizeof v));
	assert_true(matches(v, "^Bearer "));
	http_resp_free(&r);

	const char *wrong[] = {"Authorization: Bearer 0000", NULL};
	assert_int_equal(http_do(d, "GET", "/v1/jobs", NULL, 0, wrong, H_NO_AUTH, &r), 0);
	check_problem(&r, 401, "unauthorized", NULL);
	assert_non_null(http_header(&r, "WWW-Authenticate", v, sizeof v));
	assert_true(matches(v, "^Bearer .*error=\"invalid_token\""));
	http_resp_free(&r);

	/* The right token with one character changed is still wrong. */
	char h[300];
	snprintf(h, sizeof h, "Authorization: Bearer %s", d->token);
	h[strlen(h) - 1] = h[strlen(h) - 1] == 'a' ? 'b' : 'a';
	const char *almost[] = {h, NULL};
	assert_int_equal(http_do(d, "GET", "/v1/jobs", NULL, 0, almost, H_NO_AUTH, &r), 0);
	check_problem(&r, 401, "unauthorized", NULL);
	http_resp_free(&r);

	/* Auth comes before looking at the body: no token, bad media type. */
	const char *text[] = {"Content-Type: text/plain", NULL};
	assert_int_equal(http_do(d, "POST", "/v1/jobs", "x", 1, text, H_NO_AUTH, &r), 0);
	check_problem(&r, 401, "unauthorized", NULL);
	http_resp_free(&r);

	/* Nothing was created by refused requests. */
	assert_int_equal(http_get(d, "/v1/jobs", &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), 0);
	http_resp_free(&r);
}

static void test_404_and_405(void **state)
{
	bertd *d = *state;
	http_resp r;
	char v[256];
	assert_int_equal(http_get(d, "/v1/nope", &r), 0);
	check_problem(&r, 404, "not-found", NULL);
	assert_string_equal(it_jstr(r.json, "instance"), "/v1/nope");
	http_resp_free(&r);
	assert_int_equal(http_get(d, "/v1/jobs/", &r), 0);
	check_problem(&r, 404, "not-found", NULL);
	http_resp_free(&r);

	assert_int_equal(http_do(d, "PUT", "/v1/jobs", "{}", 2, NULL, H_AUTH, &r), 0);
	check_problem(&r, 405, "method-not-allowed", NULL);
	assert_non_null(http_header(&r, "Allow", v, sizeof v));
	assert_string_equal(v, "POST, GET, HEAD");
	http_resp_free(&r);
	assert_int_equal(http_do(d, "DELETE", "/v1/healthz", NULL, 0, NULL, H_AUTH, &r), 0);
	check_problem(&r, 405, "method-not-allowed", NULL);
	assert_non_null(http_header(&r, "Allow", v, sizeof v));
	assert_string_equal(v, "GET, HEAD");
	http_resp_free(&r);
	assert_int_equal(http_get(d, "/v1/jobs/job-0123456789abcdef/cancel", &r), 0);
	check_problem(&r, 405, "method-not-allowed", NULL);
	assert_non_null(http_header(&r, "Allow", v, sizeof v));
	assert_string_equal(v, "POST");
	http_resp_free(&r);
}

/* ------------------------------------------------------------ submit */

static void test_submit_and_get(void **state)
{
	bertd *d = *state;
	http_resp r, g;
	char loc[256], path[128];
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	if (r.status != 201)
		fail_msg("status %ld: %s", r.status, r.body);
	check_json_ct(&r);
	const char *id = it_jstr(r.json, "id");
	assert_true(matches(id, "^job-[0-9a-f]{16}$"));
	assert_non_null(http_header(&r, "Location", loc, sizeof loc));
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	assert_string_equal(loc, path);
	assert_string_equal(it_jstr(r.json, "name"), "it-job");
	assert_string_equal(it_jstr(r.json, "state"), "queued");
	assert_true(matches(it_jstr(r.json, "created_at"),
			    "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?Z$"));
	assert_int_equal(json_integer_value(json_object_get(r.json, "restart_count")), 0);
	assert_true(json_is_null(json_object_get(r.json, "failure_reason")));
	json_t *spec = json_object_get(r.json, "spec");
	assert_true(json_is_object(spec));
	/* The effective spec: what was sent, plus every default filled in. */
	assert_string_equal(it_jstr(spec, "dataset"), "wikitext2");
	assert_true(json_object_size(spec) > 2);
	assert_true(json_is_object(json_object_get(spec, "training_args")));

	assert_int_equal(http_get(d, loc, &g), 0);
	assert_int_equal(g.status, 200);
	check_json_ct(&g);
	assert_string_equal(it_jstr(g.json, "id"), id);
	assert_string_equal(it_jstr(g.json, "state"), "queued");
	assert_true(json_equal(json_object_get(g.json, "spec"), spec));
	/* the 201 body is the same representation GET gives while queued */
	assert_string_equal(it_jstr(g.json, "created_at"), it_jstr(r.json, "created_at"));
	assert_true(json_equal(json_object_get(g.json, "progress"), json_object_get(r.json, "progress")));
	assert_true(json_equal(json_object_get(g.json, "devices"), json_object_get(r.json, "devices")));
	assert_true(json_is_null(json_object_get(g.json, "last_checkpoint")));
	http_resp_free(&g);
	http_resp_free(&r);

	assert_int_equal(http_get(d, "/v1/jobs/job-0000000000000000", &g), 0);
	check_problem(&g, 404, "job-not-found", NULL);
	http_resp_free(&g);
	assert_int_equal(http_get(d, "/v1/jobs/not-an-id", &g), 0);
	check_problem(&g, 404, "job-not-found", NULL);
	http_resp_free(&g);
}

static void test_415(void **state)
{
	bertd *d = *state;
	http_resp r;
	const char *text[] = {"Content-Type: text/plain", NULL};
	assert_int_equal(http_do(d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), text, H_AUTH, &r), 0);
	check_problem(&r, 415, "unsupported-media-type", NULL);
	http_resp_free(&r);
	const char *form[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
	assert_int_equal(http_do(d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), form, H_AUTH, &r), 0);
	check_problem(&r, 415, "unsupported-media-type", NULL);
	http_resp_free(&r);
	const char *none[] = {"Content-Type:", NULL};
	assert_int_equal(http_do(d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), none, H_AUTH, &r), 0);
	check_problem(&r, 415, "unsupported-media-type", NULL);
	http_resp_free(&r);
	/* Parameters on the media type are fine. */
	const char *cs[] = {"Content-Type: application/json; charset=utf-8", NULL};
	assert_int_equal(http_do(d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), cs, H_AUTH, &r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
}

static void test_400_bad_json(void **state)
{
	bertd *d = *state;
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", "{\"dataset\": ", &r), 0);
	check_problem(&r, 400, "malformed-json", NULL);
	http_resp_free(&r);
	assert_int_equal(http_post_json(d, "/v1/jobs", "{\"dataset\":\"a\",\"dataset\":\"b\"}", &r), 0);
	check_problem(&r, 400, "malformed-json", NULL);
	http_resp_free(&r);
	assert_int_equal(http_do(d, "POST", "/v1/jobs", NULL, 0, NULL, H_AUTH, &r), 0);
	check_problem(&r, 400, "bad-request", NULL);
	http_resp_free(&r);
	/* A JSON array is JSON, but not a spec. */
	assert_int_equal(http_post_json(d, "/v1/jobs", "[1,2]", &r), 0);
	check_problem(&r, 400, "malformed-spec", NULL);
	http_resp_free(&r);

	/* 33 levels: refused for depth, not parsed. 32 levels parse (and then
	 * fail as a spec, which is a different code). */
	char deep[200] = "{\"x\":", ok[200] = "{\"x\":";
	for (int i = 0; i < 32; i++)
		strcat(deep, "[");
	for (int i = 0; i < 32; i++)
		strcat(deep, "]");
	strcat(deep, "}");
	assert_int_equal(http_post_json(d, "/v1/jobs", deep, &r), 0);
	check_problem(&r, 400, "json-too-deep", NULL);
	http_resp_free(&r);
	for (int i = 0; i < 31; i++)
		strcat(ok, "[");
	for (int i = 0; i < 31; i++)
		strcat(ok, "]");
	strcat(ok, "}");
	assert_int_equal(http_post_json(d, "/v1/jobs", ok, &r), 0);
	assert_true(r.status == 400 || r.status == 422);
	assert_string_not_equal(it_jstr(r.json, "type"), "urn:bertd:problem:json-too-deep");
	http_resp_free(&r);
}

static void test_422_names_field(void **state)
{
	bertd *d = *state;
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", "{\"dataset\":\"wikitext2\",\"bogus_key\":1}",
					&r), 0);
	check_problem(&r, 422, "invalid-spec", "bogus_key");
	http_resp_free(&r);
	assert_int_equal(http_post_json(d, "/v1/jobs",
					"{\"dataset\":\"wikitext2\",\"training_args\":"
					"{\"learning_rate\":-1}}", &r), 0);
	check_problem(&r, 422, "invalid-spec", "training_args.learning_rate");
	http_resp_free(&r);
}

/* What a job needs is checked at submit, not a moment later. An
 * unknown dataset or more devices than the machine has is a 422 naming the
 * field and what exists; nothing is stored. */
static void test_422_unknown_dataset_or_too_many_devices(void **state)
{
	bertd *d = *state;
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", "{\"dataset\":\"wikitext3\"}", &r), 0);
	check_problem(&r, 422, "invalid-spec", "dataset");
	assert_non_null(strstr(it_jstr(r.json, "detail"), "no dataset \"wikitext3\""));
	assert_non_null(strstr(it_jstr(r.json, "detail"), "\"wikitext2\"")); /* what exists */
	http_resp_free(&r);

	assert_int_equal(http_get(d, "/v1/devices", &r), 0);
	size_t ndev = json_array_size(json_object_get(r.json, "devices"));
	http_resp_free(&r);
	assert_true(ndev >= 1);
	if (ndev < 64) { /* jobspec caps resources.gpus at 64 */
		char spec[128], want[96];
		snprintf(spec, sizeof spec, "{\"dataset\":\"wikitext2\",\"resources\":{\"gpus\":%zu}}", ndev + 1);
		assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
		check_problem(&r, 422, "invalid-spec", "resources.gpus");
		snprintf(want, sizeof want, "asks for %zu devices; this machine has %zu", ndev + 1, ndev);
		assert_non_null(strstr(it_jstr(r.json, "detail"), want));
		http_resp_free(&r);
		/* exactly what the machine has is fine */
		snprintf(spec, sizeof spec, "{\"dataset\":\"wikitext2\",\"resources\":{\"gpus\":%zu}}", ndev);
		assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
		assert_int_equal(r.status, 201);
		http_resp_free(&r);
	}
	assert_int_equal(http_get(d, "/v1/jobs", &r), 0);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), ndev < 64 ? 1 : 0);
	http_resp_free(&r);
}

/* A body of exactly the limit is accepted; one byte more is 413, whether
 * the size is announced (Content-Length) or only discovered (chunked). */
static void test_413(void **state)
{
	bertd *d = *state;
	http_resp r;
	char *body = malloc(MAX_BODY + 2);
	memset(body, ' ', MAX_BODY + 1);
	memcpy(body, SPEC_OK, strlen(SPEC_OK));
	body[MAX_BODY + 1] = 0;

	assert_int_equal(http_do(d, "POST", "/v1/jobs", body, MAX_BODY, NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
	const char *expect[] = {"Expect: 100-continue", NULL};
	assert_int_equal(http_do(d, "POST", "/v1/jobs", body, MAX_BODY + 1, expect, H_AUTH, &r), 0);
	check_problem(&r, 413, "body-too-large", NULL);
	http_resp_free(&r);

	assert_int_equal(http_post_chunked(d, "/v1/jobs", body, MAX_BODY, 1000, &r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
	assert_int_equal(http_post_chunked(d, "/v1/jobs", body, MAX_BODY + 1, 1000, &r), 0);
	check_problem(&r, 413, "body-too-large", NULL);
	http_resp_free(&r);
	/* Much larger than the limit, in small pieces: still a clean 413. */
	char *big = malloc(3 * MAX_BODY);
	memset(big, ' ', 3 * MAX_BODY);
	big[0] = '{';
	assert_int_equal(http_post_chunked(d, "/v1/jobs", big, 3 * MAX_BODY, 100, &r), 0);
	check_problem(&r, 413, "body-too-large", NULL);
	http_resp_free(&r);
	free(big);
	free(body);

	/* Exactly two jobs got in. */
	assert_int_equal(http_get(d, "/v1/jobs", &r), 0);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), 2);
	http_resp_free(&r);
}

static void test_idempotent_submit(void **state)
{
	bertd *d = *state;
	http_resp a, b, c;
	char la[256], lb[256], replay[32];
	const char *key[] = {"Idempotency-Key: 7d3b0c9e-retry-1", NULL};
	const char *spec2 = "{\"name\":\"other\",\"dataset\":\"wikitext2\"}";

	assert_int_equal(http_do(d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), key, H_AUTH, &a), 0);
	assert_int_equal(a.status, 201);
	assert_non_null(http_header(&a, "Location", la, sizeof la));
	assert_int_equal(http_do(d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), key, H_AUTH, &b), 0);
	assert_int_equal(b.status, 201);
	assert_non_null(http_header(&b, "Location", lb, sizeof lb));
	assert_string_equal(la, lb);
	/* The same bytes, so the same id, times and spec. */
	assert_int_equal(a.len, b.len);
	assert_memory_equal(a.body, b.body, a.len);
	assert_non_null(http_header(&b, "Idempotent-Replayed", replay, sizeof replay));
	assert_null(http_header(&a, "Idempotent-Replayed", replay, sizeof replay));

	assert_int_equal(http_do(d, "POST", "/v1/jobs", spec2, strlen(spec2), key, H_AUTH, &c), 0);
	check_problem(&c, 422, "idempotency-key-reused", "Idempotency-Key");
	http_resp_free(&c);

	/* Without a key, the same body is a new job. */
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &c), 0);
	assert_int_equal(c.status, 201);
	assert_string_not_equal(it_jstr(c.json, "id"), it_jstr(a.json, "id"));
	http_resp_free(&c);

	const char *badkey[] = {"Idempotency-Key: has space", NULL};
	assert_int_equal(http_do(d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), badkey, H_AUTH,
				 &c), 0);
	check_problem(&c, 400, "invalid-parameter", "Idempotency-Key");
	http_resp_free(&c);

	assert_int_equal(http_get(d, "/v1/jobs", &c), 0);
	assert_int_equal(json_array_size(json_object_get(c.json, "jobs")), 2);
	http_resp_free(&c);
	http_resp_free(&a);
	http_resp_free(&b);
}

/* Retries racing each other (a client that timed out and retried while the
 * first attempt was still in flight) still make exactly one job. */
struct racer {
	const bertd *d;
	http_resp r;
};

static void *race_submit(void *arg)
{
	struct racer *x = arg;
	const char *key[] = {"Idempotency-Key: race-0001", NULL};
	http_do(x->d, "POST", "/v1/jobs", SPEC_OK, strlen(SPEC_OK), key, H_AUTH, &x->r);
	return NULL;
}

static void test_idempotent_submit_concurrent(void **state)
{
	bertd *d = *state;
	enum { N = 8 };
	struct racer x[N];
	pthread_t t[N];
	for (int i = 0; i < N; i++) {
		x[i].d = d;
		assert_int_equal(pthread_create(&t[i], NULL, race_submit, &x[i]), 0);
	}
	for (int i = 0; i < N; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < N; i++) {
		assert_int_equal(x[i].r.curl_rc, 0);
		if (x[i].r.status != 201)
			fail_msg("racer %d: %ld %s", i, x[i].r.status, x[i].r.body);
		assert_string_equal(x[i].r.body, x[0].r.body);
	}
	for (int i = 0; i < N; i++)
		http_resp_free(&x[i].r);
	http_resp r;
	assert_int_equal(http_get(d, "/v1/jobs", &r), 0);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), 1);
	http_resp_free(&r);
}

/* ------------------------------------------------------------ list */

/* Walks every page with the given limit ("" = default); returns the page
 * count and appends ids to seen. */
static int walk(const bertd *d, const char *limit, const char *filter, char ids[][32], int *n,
		int *sizes)
{
	char path[256], cursor[128] = "";
	int pages = 0;
	for (;;) {
		http_resp r;
		snprintf(path, sizeof path, "/v1/jobs?%s%s%s%s%s", filter, limit[0] ? "&limit=" : "",
			 limit, cursor[0] ? "&cursor=" : "", cursor);
		assert_int_equal(http_get(d, path, &r), 0);
		if (r.status != 200)
			fail_msg("%s: %ld %s", path, r.status, r.body);
		json_t *jobs = json_object_get(r.json, "jobs");
		assert_true(json_is_array(jobs));
		sizes[pages++] = (int)json_array_size(jobs);
		for (size_t i = 0; i < json_array_size(jobs); i++)
			snprintf(ids[(*n)++], 32, "%s", it_jstr(json_array_get(jobs, i), "id"));
		json_t *next = json_object_get(r.json, "next_cursor");
		assert_true(json_is_null(next) || json_is_string(next));
		if (json_is_null(next)) {
			http_resp_free(&r);
			return pages;
		}
		snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
		http_resp_free(&r);
		assert_true(pages < 20);
	}
}

static void test_list_paging(void **state)
{
	bertd *d = *state;
	char made[25][32], seen[40][32];
	int n = 0, sizes[20];
	for (int i = 0; i < 25; i++) {
		char *id = it_submit(d, SPEC_OK);
		snprintf(made[i], 32, "%s", id);
		free(id);
	}
	assert_int_equal(walk(d, "", "state=queued", seen, &n, sizes), 2);
	assert_int_equal(sizes[0], 20);
	assert_int_equal(sizes[1], 5);
	assert_int_equal(n, 25);
	for (int i = 0; i < 25; i++)
		assert_string_equal(seen[i], made[i]); /* submission order, no repeats */

	n = 0;
	assert_int_equal(walk(d, "7", "", seen, &n, sizes), 4);
	assert_int_equal(sizes[0], 7);
	assert_int_equal(sizes[3], 4);
	for (int i = 0; i < 25; i++)
		assert_string_equal(seen[i], made[i]);

	n = 0;
	assert_int_equal(walk(d, "100", "", seen, &n, sizes), 1);
	assert_int_equal(n, 25);

	const char *bad[][2] = {
		{"/v1/jobs?limit=0", "limit"},      {"/v1/jobs?limit=101", "limit"},
		{"/v1/jobs?limit=abc", "limit"},    {"/v1/jobs?limit=-1", "limit"},
		{"/v1/jobs?limit=", "limit"},       {"/v1/jobs?cursor=@@@", "cursor"},
		{"/v1/jobs?cursor=MTIzYQ", "cursor"}, /* base64url of "123a" */
		{"/v1/jobs?cursor=", "cursor"},     {"/v1/jobs?sort=id", "sort"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		http_resp r;
		assert_int_equal(http_get(d, bad[i][0], &r), 0);
		check_problem(&r, 400, "invalid-parameter", bad[i][1]);
		http_resp_free(&r);
	}
}

static void test_filter_by_state(void **state)
{
	bertd *d = *state;
	char *a = it_submit(d, SPEC_OK), *b = it_submit(d, SPEC_OK), *c = it_submit(d, SPEC_OK);
	http_resp r;
	post_path(d, "/v1/jobs/%s/cancel", b, &r);
	assert_int_equal(r.status, 200);
	http_resp_free(&r);

	char seen[10][32];
	int n = 0, sizes[20];
	walk(d, "", "state=canceled", seen, &n, sizes);
	assert_int_equal(n, 1);
	assert_string_equal(seen[0], b);
	n = 0;
	walk(d, "", "state=queued", seen, &n, sizes);
	assert_int_equal(n, 2);
	assert_string_equal(seen[0], a);
	assert_string_equal(seen[1], c);
	n = 0;
	walk(d, "1", "state=queued,canceled", seen, &n, sizes);
	assert_int_equal(n, 3);
	n = 0;
	walk(d, "", "state=running,completed", seen, &n, sizes);
	assert_int_equal(n, 0);

	const char *bad[] = {"/v1/jobs?state=bogus", "/v1/jobs?state=queued,", "/v1/jobs?state=",
			     "/v1/jobs?state=queued,,running", "/v1/jobs?state=QUEUED"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_int_equal(http_get(d, bad[i], &r), 0);
		check_problem(&r, 400, "invalid-parameter", "state");
		http_resp_free(&r);
	}
	free(a), free(b), free(c);
}

/* ------------------------------------------------------------ lifecycle */

static void test_cancel_and_events(void **state)
{
	bertd *d = *state;
	char *id = it_submit(d, SPEC_OK);
	http_resp r;
	post_path(d, "/v1/jobs/%s/cancel", id, &r);
	assert_int_equal(r.status, 200);
	check_json_ct(&r);
	assert_string_equal(it_jstr(r.json, "id"), id);
	assert_string_equal(it_jstr(r.json, "state"), "canceled");
	assert_true(json_is_string(json_object_get(r.json, "finished_at")));
	http_resp_free(&r);

	get_path(d, "/v1/jobs/%s/events", id, &r);
	assert_int_equal(r.status, 200);
	check_json_ct(&r);
	json_t *ev = json_object_get(r.json, "events");
	assert_int_equal(json_array_size(ev), 2);
	json_t *e0 = json_array_get(ev, 0), *e1 = json_array_get(ev, 1);
	assert_string_equal(it_jstr(e0, "to"), "queued");
	assert_string_equal(it_jstr(e1, "from"), "queued");
	assert_string_equal(it_jstr(e1, "to"), "canceled");
	assert_string_equal(it_jstr(e1, "reason"), "canceled by default");
	assert_true(matches(it_jstr(e1, "time"), "^[0-9]{4}-[0-9]{2}-[0-9]{2}T.*Z$"));
	assert_true(strcmp(it_jstr(e0, "time"), it_jstr(e1, "time")) <= 0);
	http_resp_free(&r);

	/* Terminal: a second cancel conflicts and changes nothing. */
	post_path(d, "/v1/jobs/%s/cancel", id, &r);
	check_problem(&r, 409, "job-state-conflict", NULL);
	http_resp_free(&r);
	get_path(d, "/v1/jobs/%s/events", id, &r);
	assert_int_equal(json_array_size(json_object_get(r.json, "events")), 2);
	http_resp_free(&r);

	post_path(d, "/v1/jobs/%s/cancel", "job-00000000000000ff", &r);
	check_problem(&r, 404, "job-not-found", NULL);
	http_resp_free(&r);
	get_path(d, "/v1/jobs/%s/events", "job-00000000000000ff", &r);
	check_problem(&r, 404, "job-not-found", NULL);
	http_resp_free(&r);
	free(id);
}

static void test_delete(void **state)
{
	bertd *d = *state;
	char *id = it_submit(d, SPEC_OK), path[128];
	http_resp r;
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, H_AUTH, &r), 0);
	check_problem(&r, 409, "job-state-conflict", NULL);
	http_resp_free(&r);
	assert_int_equal(http_get(d, path, &r), 0);
	assert_int_equal(r.status, 200); /* still there */
	http_resp_free(&r);

	post_path(d, "/v1/jobs/%s/cancel", id, &r);
	assert_int_equal(r.status, 200);
	http_resp_free(&r);
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 204);
	assert_int_equal(r.len, 0);
	http_resp_free(&r);
	assert_int_equal(http_get(d, path, &r), 0);
	check_problem(&r, 404, "job-not-found", NULL);
	http_resp_free(&r);
	get_path(d, "/v1/jobs/%s/events", id, &r);
	check_problem(&r, 404, "job-not-found", NULL);
	http_resp_free(&r);
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, H_AUTH, &r), 0);
	check_problem(&r, 404, "job-not-found", NULL);
	http_resp_free(&r);
	free(id);
}

static void submit_init_from_json(const bertd *d, const char *init_from, http_resp *r)
{
	char spec[1024];
	snprintf(spec, sizeof spec, "{\"dataset\":\"wikitext2\",\"init_from\":%s}", init_from);
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, r), 0);
}

static void submit_init_from(const bertd *d, const char *path, http_resp *r)
{
	char quoted[600];
	snprintf(quoted, sizeof quoted, "\"%s\"", path);
	submit_init_from_json(d, quoted, r);
}

/* Submits init_from (JSON text), which must be accepted as the canonical
 * path of want (a path the test made); counts it in *n. */
static void init_from_accepted(const bertd *d, const char *init_from, const char *want, size_t *n)
{
	http_resp r;
	submit_init_from_json(d, init_from, &r);
	if (r.status != 201)
		fail_msg("init_from %s: %ld %s", init_from, r.status, r.body);
	char *real = realpath(want, NULL);
	assert_non_null(real);
	assert_string_equal(it_jstr(json_object_get(r.json, "spec"), "init_from"), real);
	free(real);
	http_resp_free(&r);
	(*n)++;
}

/* A 422 on field (init_from or a key of it) whose detail holds each
 * '|'-separated part. */
static void refused_on(const bertd *d, const char *init_from, const char *field, const char *parts)
{
	http_resp r;
	submit_init_from_json(d, init_from, &r);
	check_problem(&r, 422, "invalid-spec", field);
	it_assert_refused(&r, field, parts);
}

static void init_from_refused(const bertd *d, const char *init_from, const char *parts)
{
	refused_on(d, init_from, "init_from", parts);
}

/* init_from must resolve inside a data root or a job's outputs (symlinks are
 * followed first) and hold a model, HF or bertd checkpoint; a path may be
 * relative to the data root; a job reference names a finished job's export
 * or one of its checkpoints. */
static void test_init_from_confined_to_data_roots(void **state)
{
	bertd *d = *state;
	http_resp r;
	char p[256], q[600], want[600];
	size_t accepted = 0;
	snprintf(p, sizeof p, "%s/data/ckpt-100", d->root);
	snprintf(q, sizeof q, "\"%s\"", p);
	init_from_accepted(d, q, p, &accepted);
	init_from_accepted(d, "\"ckpt-100\"", p, &accepted); /* relative, like a dataset source */
	snprintf(p, sizeof p, "%s/data/hf", d->root);
	init_from_accepted(d, "\"hf/\"", p, &accepted);

	/* a job's outputs, by reference or by the path GET /v1/jobs answers */
	snprintf(want, sizeof want, "%s/jobs/%s/export", d->state_dir, DONE_JOB);
	init_from_accepted(d, "{\"job\":\"" DONE_JOB "\"}", want, &accepted);
	snprintf(q, sizeof q, "\"%s\"", want);
	init_from_accepted(d, q, want, &accepted);
	init_from_accepted(d, "\"escape/jobs/" DONE_JOB "/export\"", want, &accepted);
	snprintf(want, sizeof want, "%s/jobs/%s/checkpoints/ckpt-10", d->state_dir, DONE_JOB);
	init_from_accepted(d, "{\"job\":\"" DONE_JOB "\",\"checkpoint\":10}", want, &accepted);
	/* latest complete: ckpt-20 has no DONE */
	init_from_accepted(d, "{\"job\":\"" DONE_JOB "\",\"checkpoint\":\"latest\"}", want, &accepted);

	submit_init_from(d, "/etc", &r);
	check_problem(&r, 403, "path-forbidden", "init_from");
	http_resp_free(&r);
	snprintf(p, sizeof p, "%s/data/escape", d->root); /* -> the state dir */
	submit_init_from(d, p, &r);
	check_problem(&r, 403, "path-forbidden", "init_from");
	http_resp_free(&r);
	submit_init_from(d, "escape/bertd.db", &r); /* the state dir is not a job output */
	check_problem(&r, 403, "path-forbidden", "init_from");
	http_resp_free(&r);
	submit_init_from(d, "escape/jobs/" DONE_JOB "/checkpoints", &r);
	check_problem(&r, 403, "path-forbidden", "init_from");
	http_resp_free(&r);
	snprintf(p, sizeof p, "%s/datax", d->root); /* a sibling sharing the prefix */
	mkdir(p, 0700);
	submit_init_from(d, p, &r);
	check_problem(&r, 403, "path-forbidden", "init_from");
	http_resp_free(&r);
	snprintf(p, sizeof p, "%s/data/missing", d->root);
	submit_init_from(d, p, &r);
	check_problem(&r, 422, "invalid-spec", "init_from");
	http_resp_free(&r);
	init_from_refused(d, "\"../data/hf\"", "\"..\"");
	init_from_refused(d, "\"\"", "path");

	/* directories that hold no (complete) model: the detail names the
	 * resolved path and what is missing */
	snprintf(q, sizeof q, "%s/data/empty|config.json|state.json", d->root);
	init_from_refused(d, "\"empty\"", q);
	snprintf(q, sizeof q, "%s/data/half-hf|model.safetensors", d->root);
	init_from_refused(d, "\"half-hf\"", q);
	snprintf(q, sizeof q, "%s/data/cut-ckpt|DONE", d->root);
	init_from_refused(d, "\"cut-ckpt\"", q);
	init_from_refused(d, "{\"job\":\"" DONE_JOB "\",\"checkpoint\":20}", "ckpt-20|DONE");

	/* job references that name nothing usable */
	init_from_refused(d, "{\"job\":\"job-00000000000000ff\"}", "no job job-00000000000000ff");
	refused_on(d, "{\"job\":\"nope\"}", "init_from.job", "job id");
	refused_on(d, "{\"job\":5}", "init_from.job", "job id");
	refused_on(d, "{}", "init_from.job", "job id");
	init_from_refused(d, "{\"job\":\"" FAILED_JOB "\"}", FAILED_JOB "|failed");
	init_from_refused(d, "{\"job\":\"" FAILED_JOB "\",\"checkpoint\":\"latest\"}",
			  FAILED_JOB "|no complete checkpoint");
	init_from_refused(d, "{\"job\":\"" DONE_JOB "\",\"checkpoint\":30}", "step 30|10, 20");
	refused_on(d, "{\"job\":\"" DONE_JOB "\",\"checkpoint\":-1}", "init_from.checkpoint", "latest");
	refused_on(d, "{\"job\":\"" DONE_JOB "\",\"checkpoint\":\"newest\"}", "init_from.checkpoint",
		   "latest");
	refused_on(d, "{\"job\":\"" DONE_JOB "\",\"step\":10}", "init_from.step", "unknown key");
	snprintf(q, sizeof q, "\"%s/jobs/%s/export\"", d->state_dir, FAILED_JOB);
	init_from_refused(d, q, "no such file");
	submit_init_from_json(d, "5", &r); /* neither a path nor a job: jobspec's call */
	check_problem(&r, 422, "invalid-spec", "init_from");
	http_resp_free(&r);

	/* Nothing but the accepted ones got in (plus the two seeded). */
	assert_int_equal(http_get(d, "/v1/jobs?limit=100", &r), 0);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), accepted + 2);
	http_resp_free(&r);
}

/* Until the supervisor exists nothing moves a job to running, so the test
 * plays the scheduler: it opens the daemon's database itself (WAL allows a
 * second connection) and makes the same compare-and-set transitions. */
static void test_cancel_running_moves_to_stopping(void **state)
{
	bertd *d = *state;
	char *id = it_submit(d, SPEC_OK), db[160], path[128];
	http_resp r;
	store *st = NULL;
	snprintf(db, sizeof db, "%s/bertd.db", d->state_dir);
	assert_int_equal(store_open(&st, db), 0);
	assert_int_equal(store_job_transition(st, id, JOB_MASK(JOB_QUEUED), JOB_STARTING,
					      "test: scheduled", NULL), 0);
	assert_int_equal(store_job_transition(st, id, JOB_MASK(JOB_STARTING), JOB_RUNNING,
					      "test: workers up", NULL), 0);

	post_path(d, "/v1/jobs/%s/cancel", id, &r);
	if (r.status != 202)
		fail_msg("cancel of a running job: %ld %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "state"), "stopping");
	http_resp_free(&r);
	/* Asking again while it stops is not an error and changes nothing. */
	post_path(d, "/v1/jobs/%s/cancel", id, &r);
	assert_int_equal(r.status, 202);
	assert_string_equal(it_jstr(r.json, "state"), "stopping");
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, H_AUTH, &r), 0);
	check_problem(&r, 409, "job-state-conflict", NULL);
	http_resp_free(&r);

	get_path(d, "/v1/jobs/%s/events", id, &r);
	json_t *ev = json_object_get(r.json, "events");
	assert_int_equal(json_array_size(ev), 4); /* submitted, starting, running, stopping */
	json_t *last = json_array_get(ev, 3);
	assert_string_equal(it_jstr(last, "from"), "running");
	assert_string_equal(it_jstr(last, "to"), "stopping");
	assert_string_equal(it_jstr(last, "reason"), "cancel requested by default");
	http_resp_free(&r);

	/* The supervisor finishes the stop; then the job is deletable. */
	assert_int_equal(store_job_transition(st, id, JOB_MASK(JOB_STOPPING), JOB_CANCELED,
					      "test: stopped", NULL), 0);
	store_close(st);
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 204);
	http_resp_free(&r);
	free(id);
}

/* A listen address reachable from the network needs allow_remote: without
 * it the daemon refuses to start (and never reports READY). */
static void test_refuses_remote_listen(void **state)
{
	(void)state;
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	assert_non_null(f);
	const char *extra[] = {"--listen", "0.0.0.0", HOLD, NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}), -ECHILD);
	assert_int_equal(it_daemon_stop(f), 0);
}

/* 201 means committed: kill -9 right after it, restart on the same state
 * dir, and the job is there with the same spec, state and events. */
static void test_job_survives_kill9(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	http_resp r, g;
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	assert_int_equal(r.status, 201);
	bertd_kill9(d);
	char token_before[256];
	snprintf(token_before, sizeof token_before, "%s", d->token);

	assert_int_equal(it_daemon_run(f, NULL), 0); /* the arguments of setup */
	assert_string_equal(d->token, token_before); /* the token file is reused */
	get_path(d, "/v1/jobs/%s", it_jstr(r.json, "id"), &g);
	assert_int_equal(g.status, 200);
	assert_string_equal(it_jstr(g.json, "state"), "queued");
	assert_string_equal(it_jstr(g.json, "name"), "it-job");
	assert_true(json_equal(json_object_get(g.json, "spec"), json_object_get(r.json, "spec")));
	http_resp_free(&g);
	get_path(d, "/v1/jobs/%s/events", it_jstr(r.json, "id"), &g);
	assert_int_equal(g.status, 200);
	json_t *ev = json_object_get(g.json, "events");
	assert_int_equal(json_array_size(ev), 1);
	assert_string_equal(it_jstr(json_array_get(ev, 0), "to"), "queued");
	http_resp_free(&g);
	http_resp_free(&r);
}

/* Many clients submitting at once (their inserts share group commits):
 * every one gets its 201, and after kill -9 right after the last 201 every
 * acknowledged job is there, each with its own spec and its one event. */
enum { BURST_THREADS = 8, BURST_EACH = 25 };

struct burst {
	const bertd *d;
	int t;
	char ids[BURST_EACH][32];
	int failures;
};

static void *burst_submit(void *arg)
{
	struct burst *b = arg;
	for (int i = 0; i < BURST_EACH; i++) {
		char spec[128];
		snprintf(spec, sizeof spec, "{\"name\":\"burst-%d-%d\",\"dataset\":\"wikitext2\"}", b->t, i);
		http_resp r;
		if (http_post_json(b->d, "/v1/jobs", spec, &r) != 0 || r.status != 201 ||
		    !it_jstr(r.json, "id")) {
			b->failures++;
		} else {
			snprintf(b->ids[i], sizeof b->ids[i], "%s", it_jstr(r.json, "id"));
		}
		http_resp_free(&r);
	}
	return NULL;
}

static void test_burst_survives_kill9(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	struct burst b[BURST_THREADS];
	pthread_t t[BURST_THREADS];
	for (int i = 0; i < BURST_THREADS; i++) {
		b[i] = (struct burst){.d = d, .t = i};
		assert_int_equal(pthread_create(&t[i], NULL, burst_submit, &b[i]), 0);
	}
	for (int i = 0; i < BURST_THREADS; i++)
		pthread_join(t[i], NULL);
	bertd_kill9(d);
	for (int i = 0; i < BURST_THREADS; i++)
		assert_int_equal(b[i].failures, 0);

	assert_int_equal(it_daemon_run(f, NULL), 0); /* the arguments of setup */
	for (int i = 0; i < BURST_THREADS; i++) {
		for (int k = 0; k < BURST_EACH; k++) {
			http_resp g;
			char want[64];
			get_path(d, "/v1/jobs/%s", b[i].ids[k], &g);
			if (g.status != 200)
				fail_msg("acknowledged job %s (client %d, #%d) is gone after kill -9: %ld",
					 b[i].ids[k], i, k, g.status);
			snprintf(want, sizeof want, "burst-%d-%d", i, k);
			assert_string_equal(it_jstr(g.json, "name"), want);
			assert_string_equal(it_jstr(g.json, "state"), "queued");
			http_resp_free(&g);
			get_path(d, "/v1/jobs/%s/events", b[i].ids[k], &g);
			assert_int_equal(json_array_size(json_object_get(g.json, "events")), 1);
			http_resp_free(&g);
		}
	}
	/* and nothing else: the list holds exactly the acknowledged jobs */
	http_resp r;
	int n = 0;
	char path[160], cursor[128] = "";
	for (;;) {
		snprintf(path, sizeof path, "/v1/jobs?limit=100%s%s", cursor[0] ? "&cursor=" : "", cursor);
		assert_int_equal(http_get(d, path, &r), 0);
		assert_int_equal(r.status, 200);
		n += (int)json_array_size(json_object_get(r.json, "jobs"));
		const char *next = json_string_value(json_object_get(r.json, "next_cursor"));
		snprintf(cursor, sizeof cursor, "%s", next ? next : "");
		http_resp_free(&r);
		if (!cursor[0])
			break;
	}
	assert_int_equal(n, BURST_THREADS * BURST_EACH);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_healthz_and_version, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_auth, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_404_and_405, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_submit_and_get, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_415, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_400_bad_json, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_422_names_field, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_422_unknown_dataset_or_too_many_devices, setup,
						it_teardown),
		cmocka_unit_test_setup_teardown(test_413, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_idempotent_submit, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_idempotent_submit_concurrent, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_list_paging, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_filter_by_state, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_cancel_and_events, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_delete, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_cancel_running_moves_to_stopping, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_job_survives_kill9, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_burst_survives_kill9, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_init_from_confined_to_data_roots, setup_roots,
						it_teardown),
		cmocka_unit_test(test_refuses_remote_listen),
	};
	return IT_RUN(tests, NULL, NULL);
}
