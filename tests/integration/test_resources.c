/* The daemon's other resources end to end: /v1/datasets (validation, data
 * root confinement, preparation run by the supervisor), /v1/devices, and a
 * job's metrics, checkpoints and logs sub-resources. One fresh daemon and
 * state dir per test. */
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

typedef it_fx fx;       /* data: the data root */
static char outside[160]; /* root/outside: a directory that is not a data root */

static int setup(void **state)
{
	it_daemon_opts o = {.cpu_slots = "3", .schedule = "false"};
	it_fx *f = it_daemon_start(&o, 0);
	if (f) {
		snprintf(outside, sizeof outside, "%s/outside", f->d.root);
		mkdir(outside, 0700);
	}
	return it_setup_end(state, f, true);
}

static void expect_problem(const bertd *d, const char *body, long status, const char *code,
			   const char *field)
{
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/datasets", body, &r), 0);
	if (r.status != status)
		fail_msg("%s -> %ld (want %ld): %s", body, r.status, status, r.body);
	char type[128];
	snprintf(type, sizeof type, "urn:bertd:problem:%s", code);
	assert_string_equal(it_jstr(r.json, "type"), type);
	if (field)
		assert_string_equal(it_jstr(r.json, "field"), field);
	http_resp_free(&r);
}

/* Posts body, expects a path problem on field whose detail holds the path
 * as resolved (want) and names the configured data roots. */
static void expect_path_detail(const fx *f, const char *body, long status, const char *field, const char *want)
{
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets", body, &r), 0);
	assert_int_equal(r.status, status);
	assert_string_equal(it_jstr(r.json, "field"), field);
	const char *detail = it_jstr(r.json, "detail");
	char roots[200];
	snprintf(roots, sizeof roots, "data_roots: %s", f->data);
	if (!strstr(detail, want) || !strstr(detail, roots))
		fail_msg("%s -> detail '%s' lacks '%s' or '%s'", body, detail, want, roots);
	http_resp_free(&r);
}

/* POST /v1/jobs of a job of only dataset and, unless NULL, init_from
 * (JSON text) into r. */
static void post_bare_job(const bertd *d, const char *dataset, const char *init_from, http_resp *r)
{
	char *spec = it_job_spec(NULL, dataset, "model", "null", "training_args", "null", "resources", "null",
				 "init_from", init_from ? init_from : "null", NULL);
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, r), 0);
	free(spec);
}

static void test_dataset_validation(void **state)
{
	fx *f = *state;
	char p[256], body[1024];
	snprintf(p, sizeof p, "%s/corpus.txt", f->data);
	it_write_file(p, "Hello world.\nSecond sentence.\n\nNew document.\n");
	snprintf(p, sizeof p, "%s/secret.txt", outside);
	it_write_file(p, "not yours\n");
	snprintf(p, sizeof p, "%s/link.txt", f->data);
	char target[256];
	snprintf(target, sizeof target, "%s/secret.txt", outside);
	assert_int_equal(symlink(target, p), 0);

	snprintf(body, sizeof body, "{\"name\":\"x\",\"source\":\"%s/secret.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		 outside);
	expect_problem(&f->d, body, 403, "path-forbidden", "source");
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"link.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		       403, "path-forbidden", "source");
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"../outside/secret.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		       422, "invalid-request", "source");
	/* a NUL byte never reaches path handling: the JSON parser refuses it */
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"corpus.txt\\u0000x\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		       400, "malformed-json", NULL);
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"nope.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		       422, "invalid-request", "source");
	/* the details name the path as bertd resolved it and the data roots */
	char want[512];
	snprintf(want, sizeof want, "no such file or directory: %s/nope.txt", f->data);
	expect_path_detail(f, "{\"name\":\"x\",\"source\":\"nope.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
			   422, "source", want);
	snprintf(want, sizeof want, "no such file or directory: %s/pubmed/", f->data);
	expect_path_detail(f, "{\"name\":\"x\",\"source\":\"pubmed/\",\"vocab\":{\"file\":\"v.txt\"}}", 422,
			   "source", want);
	snprintf(want, sizeof want, "no such file or directory: %s/bert-base-uncased-vocab.txt", f->data);
	expect_path_detail(f, "{\"name\":\"x\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"bert-base-uncased-vocab.txt\"}}",
			   422, "vocab.file", want);
	snprintf(want, sizeof want, "%s/secret.txt is outside the configured data_roots", outside);
	snprintf(body, sizeof body, "{\"name\":\"x\",\"source\":\"%s/secret.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		 outside);
	expect_path_detail(f, body, 403, "source", want);
	char real[PATH_MAX];
	assert_non_null(realpath(target, real));
	snprintf(want, sizeof want, "%s/link.txt resolves to %s, outside", f->data, real);
	expect_path_detail(f, "{\"name\":\"x\",\"source\":\"link.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
			   403, "source", want);
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"corpus.txt\"}", 422, "invalid-request", "vocab");
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"/etc/passwd\"}}", 403,
		       "path-forbidden", "vocab.file");
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"corpus.txt\",\"vocab\":{\"train\":{\"vocab_size\":5}}}", 422,
		       "invalid-request", "vocab.train.vocab_size");
	expect_problem(&f->d, "{\"name\":\"../x\",\"source\":\"corpus.txt\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		       422, "invalid-request", "name");
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"corpus.txt\",\"colour\":1,\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		       422, "invalid-request", "colour");
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"corpus.txt\",\"format\":\"xml\",\"vocab\":{\"train\":{\"vocab_size\":500}}}",
		       422, "invalid-request", "format");
	expect_problem(&f->d, "{\"name\":\"x\",\"source\":\"corpus.txt\",\"vocab\":{\"train\":{\"vocab_size\":500,\"lowercase\":1}}}",
		       422, "invalid-request", "vocab.train.lowercase");
	expect_problem(&f->d, "[1]", 400, "bad-request", NULL);

	http_resp r;
	assert_int_equal(http_get(&f->d, "/v1/datasets", &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "datasets")), 0); /* nothing stored */
	http_resp_free(&r);
	assert_int_equal(http_get(&f->d, "/v1/datasets/nope", &r), 0);
	assert_int_equal(r.status, 404);
	http_resp_free(&r);
}

/* Polls (bounded) until the dataset leaves `preparing`. */
static json_t *wait_dataset(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/datasets/%s", id);
	for (int i = 0; i < 600; i++) {
		http_resp r;
		assert_int_equal(http_get(d, path, &r), 0);
		assert_int_equal(r.status, 200);
		const char *st = it_jstr(r.json, "state");
		if (strcmp(st, "preparing") != 0 && strcmp(st, "queued") != 0) {
			json_t *o = json_incref(r.json);
			http_resp_free(&r);
			return o;
		}
		http_resp_free(&r);
		struct timespec ts = {0, 100 * 1000 * 1000};
		nanosleep(&ts, NULL); /* the state changes asynchronously; poll, bounded at 60 s */
	}
	fail_msg("dataset %s still preparing after 60 s", id);
	return NULL;
}

static void test_dataset_prepare(void **state)
{
	fx *f = *state;
	char p[256];
	snprintf(p, sizeof p, "%s/corpus.txt", f->data);
	const char *text = "Hello world.\nSecond sentence here.\n\nA new document starts.\nIt ends.\n";
	it_write_file(p, text);
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets",
					"{\"name\":\"tiny\",\"source\":\"corpus.txt\","
					"\"vocab\":{\"train\":{\"vocab_size\":200}}}", &r), 0);
	if (r.status != 201)
		fail_msg("status %ld: %s", r.status, r.body);
	char loc[128];
	assert_non_null(http_header(&r, "Location", loc, sizeof loc));
	char *id = strdup(it_jstr(r.json, "id"));
	assert_string_equal(it_jstr(r.json, "name"), "tiny");
	/* queued until the supervisor's next tick starts its bertd-prepare */
	const char *st = it_jstr(r.json, "state");
	if (strcmp(st, "queued") != 0 && strcmp(st, "preparing") != 0)
		fail_msg("state %s after POST", st);
	assert_string_equal(it_jstr(json_object_get(r.json, "progress"), "phase"),
			    strcmp(st, "queued") == 0 ? "queued" : "starting");
	json_t *req = json_object_get(r.json, "request");
	assert_true(json_is_null(json_object_get(req, "lowercase"))); /* inferred */
	assert_string_equal(json_string_value(json_object_get(req, "format")), "text");
	http_resp_free(&r);

	/* the same name again */
	expect_problem(&f->d, "{\"name\":\"tiny\",\"source\":\"corpus.txt\",\"vocab\":{\"train\":{\"vocab_size\":200}}}",
		       409, "dataset-exists", "name");
	/* by name works as well as by id */
	assert_int_equal(http_get(&f->d, "/v1/datasets/tiny", &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(it_jstr(r.json, "id"), id);
	http_resp_free(&r);

	json_t *done = wait_dataset(&f->d, id);
	const char *expect = getenv("BERTD_EXPECT_PREPARE");
	if (expect && strcmp(expect, "ready") == 0) {
		assert_string_equal(it_jstr(done, "state"), "ready");
		assert_true(json_is_object(json_object_get(done, "stats")));
		/* ready reads the corpus size once, complete; the
		 * 12 words cannot fill 200 entries: the size reached is reported */
		json_t *pg = json_object_get(done, "progress");
		assert_string_equal(it_jstr(pg, "phase"), "done");
		assert_int_equal(json_integer_value(json_object_get(pg, "bytes_done")), strlen(text));
		assert_int_equal(json_integer_value(json_object_get(pg, "bytes_total")), strlen(text));
		assert_true(json_real_value(json_object_get(pg, "fraction")) == 1.0);
		json_t *stats = json_object_get(done, "stats");
		json_int_t vs = json_integer_value(json_object_get(stats, "vocab_size"));
		assert_true(vs > 5 && vs < 200);
		assert_int_equal(json_integer_value(json_object_get(stats, "vocab_size_requested")), 200);
	} else {
		/* this build has no bertd-prepare: the supervisor must say so */
		assert_string_equal(it_jstr(done, "state"), "failed");
		assert_non_null(strstr(it_jstr(done, "error"), "bertd-prepare"));
	}
	json_decref(done);
	free(id);
}

/* The daemon dies while a dataset is preparing, and its bertd-prepare
 * goes without an exit record (killed too; perhaps after renaming its
 * output into place): the next daemon cannot adopt it and prepares it
 * again from scratch, so no half dataset is ever ready. */
static void test_dataset_restart(void **state)
{
	fx *f = *state;
	if (!getenv("BERTD_EXPECT_PREPARE") || strcmp(getenv("BERTD_EXPECT_PREPARE"), "ready") != 0)
		skip();
	char p[256];
	snprintf(p, sizeof p, "%s/corpus.txt", f->data);
	it_write_file(p, "One sentence.\nAnother one.\n\nSecond document here.\n");
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets",
					"{\"name\":\"again\",\"source\":\"corpus.txt\","
					"\"vocab\":{\"train\":{\"vocab_size\":150}}}", &r), 0);
	assert_int_equal(r.status, 201);
	char id[64];
	snprintf(id, sizeof id, "%s", it_jstr(r.json, "id"));
	http_resp_free(&r);
	bertd_kill9(&f->d);
	char dir[300], junk[400];
	snprintf(dir, sizeof dir, "%s/datasets/again", f->data);
	/* bertd-prepare outlives the daemon: killed here, and its exit record
	 * (if it ended first) removed, so that nothing can be adopted */
	pid_t pid[4];
	for (int i = 0, n = it_find_pids("bertd-prepare", dir, pid, 4); i < n; i++)
		kill(pid[i], SIGKILL);
	for (int i = 0; i < 300 && it_find_pids("bertd-prepare", dir, pid, 4) > 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids("bertd-prepare", dir, pid, 4), 0);
	snprintf(junk, sizeof junk, "%s/datasets/ch/%s.exit", f->d.state_dir, id);
	unlink(junk);
	/* what a half-finished attempt could leave behind */
	char parent[300];
	snprintf(parent, sizeof parent, "%s/datasets", f->data);
	mkdir(parent, 0700);
	mkdir(dir, 0700);
	snprintf(junk, sizeof junk, "%s/half-written.bin", dir);
	it_write_file(junk, "garbage");
	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *done = wait_dataset(&f->d, id);
	assert_string_equal(it_jstr(done, "state"), "ready");
	assert_int_equal(access(junk, F_OK), -1); /* prepared afresh */
	snprintf(junk, sizeof junk, "%s/manifest.json", dir);
	assert_int_equal(access(junk, R_OK), 0);
	json_decref(done);
}

static void test_devices(void **state)
{
	fx *f = *state;
	http_resp r;
	assert_int_equal(http_get(&f->d, "/v1/devices", &r), 0);
	assert_int_equal(r.status, 200);
	json_t *devs = json_object_get(r.json, "devices");
	assert_int_equal(json_array_size(devs), 3);
	for (size_t i = 0; i < 3; i++) {
		json_t *d = json_array_get(devs, i);
		assert_string_equal(it_jstr(d, "kind"), "cpu");
		assert_int_equal(json_integer_value(json_object_get(d, "index")), (json_int_t)i);
		assert_true(json_is_null(json_object_get(d, "job")));
	}
	http_resp_free(&r);
}

/* Stores dataset `name` from a small corpus; returns its id (caller frees). */
static char *add_tiny(fx *f, const char *name)
{
	char p[256], body[256];
	snprintf(p, sizeof p, "%s/corpus.txt", f->data);
	it_write_file(p, "Hello world.\nSecond sentence here.\n\nA new document starts.\nIt ends.\n");
	snprintf(body, sizeof body,
		 "{\"name\":\"%s\",\"source\":\"corpus.txt\",\"vocab\":{\"train\":{\"vocab_size\":200}}}", name);
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets", body, &r), 0);
	if (r.status != 201)
		fail_msg("status %ld: %s", r.status, r.body);
	char *id = strdup(it_jstr(r.json, "id"));
	http_resp_free(&r);
	return id;
}

static long do_delete(const bertd *d, const char *path, http_resp *r)
{
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, 1, r), 0);
	return r->status;
}

/* DELETE /v1/datasets/{id}: refused while preparing or while a
 * live job names it, then removes the row and its shards; unknown is 404. */
static void test_dataset_delete(void **state)
{
	fx *f = *state;
	http_resp r;
	char *id = add_tiny(f, "gone");
	char path[160], dir[300];
	snprintf(path, sizeof path, "/v1/datasets/%s", id);
	/* a job may name a dataset that exists but is still preparing: it waits */
	post_bare_job(&f->d, "gone", NULL, &r);
	if (r.status != 201)
		fail_msg("job on a preparing dataset -> %ld: %s", r.status, r.body);
	char job[64];
	snprintf(job, sizeof job, "%s", it_jstr(r.json, "id"));
	http_resp_free(&r);
	/* still preparing (if bertd-prepare has not finished yet) is a 409 */
	if (do_delete(&f->d, path, &r) != 409)
		fail_msg("delete while preparing/used -> %ld: %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:dataset-state-conflict");
	http_resp_free(&r);
	json_decref(wait_dataset(&f->d, id));
	/* used by a queued job (the queue is held): 409 naming the job */
	assert_int_equal(do_delete(&f->d, "/v1/datasets/gone", &r), 409);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:dataset-state-conflict");
	assert_non_null(strstr(it_jstr(r.json, "detail"), job));
	http_resp_free(&r);
	char cancel[160];
	snprintf(cancel, sizeof cancel, "/v1/jobs/%s/cancel", job);
	assert_int_equal(http_do(&f->d, "POST", cancel, NULL, 0, NULL, 1, &r), 0);
	assert_int_equal(r.status, 200);
	http_resp_free(&r);
	snprintf(dir, sizeof dir, "%s/datasets/gone", f->data);
	mkdir(dir, 0700); /* whether or not prepare ran, there are files to remove */
	char junk[400];
	snprintf(junk, sizeof junk, "%s/shard.bin", dir);
	it_write_file(junk, "x");
	assert_int_equal(do_delete(&f->d, path, &r), 204);
	http_resp_free(&r);
	assert_int_equal(access(dir, F_OK), -1); /* its files are gone */
	assert_int_equal(access(f->data, F_OK), 0); /* the root is not */
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 404);
	http_resp_free(&r);
	assert_int_equal(do_delete(&f->d, path, &r), 404);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:dataset-not-found");
	http_resp_free(&r);
	/* and the name is free again; a job naming it now is refused */
	post_bare_job(&f->d, "gone", NULL, &r);
	assert_int_equal(r.status, 422);
	assert_string_equal(it_jstr(r.json, "field"), "dataset");
	http_resp_free(&r);
	free(id);
}

static void test_job_subresources(void **state)
{
	fx *f = *state;
	http_resp r;
	free(add_tiny(f, "tiny")); /* jobs must name a dataset that exists */
	post_bare_job(&f->d, "tiny", NULL, &r);
	assert_int_equal(r.status, 201);
	char id[64];
	snprintf(id, sizeof id, "%s", it_jstr(r.json, "id"));
	http_resp_free(&r);

	char path[160];
	snprintf(path, sizeof path, "/v1/jobs/%s/metrics", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "metrics")), 0);
	assert_true(json_is_null(json_object_get(r.json, "next_since_step")));
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/metrics?since_step=abc", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 400);
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "checkpoints")), 0);
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=0&tail=10", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(r.len, 0); /* never started: empty log */
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/logs?tail=0", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 400);
	http_resp_free(&r);
	assert_int_equal(http_get(&f->d, "/v1/jobs/job-00000000000000ff/metrics", &r), 0);
	assert_int_equal(r.status, 404);
	http_resp_free(&r);
}

static bool prepare_expected(void)
{
	const char *e = getenv("BERTD_EXPECT_PREPARE");
	return e && strcmp(e, "ready") == 0;
}

static bool file_contains(const char *path, const char *needle)
{
	FILE *fp = fopen(path, "rb");
	assert_non_null(fp);
	static char buf[1 << 20];
	size_t n = fread(buf, 1, sizeof buf - 1, fp);
	fclose(fp);
	buf[n] = 0;
	return memmem(buf, n, needle, strlen(needle)) != NULL;
}

/* A link planted in a source directory pointed at a file outside
 * the data roots, and the file was tokenized into the dataset. Links that
 * lead out are skipped (one inside is followed); the outside word reaches
 * neither the trained vocab nor the shards' counts. */
static void test_dataset_links_confined(void **state)
{
	fx *f = *state;
	if (!prepare_expected())
		skip();
	char p[300], target[300];
	snprintf(p, sizeof p, "%s/corp", f->data);
	mkdir(p, 0700);
	snprintf(p, sizeof p, "%s/corp/a.txt", f->data);
	it_write_file(p, "Hello world.\nSecond sentence here.\n\nA new document starts.\nIt ends.\n");
	snprintf(p, sizeof p, "%s/secret.txt", outside);
	FILE *fp = fopen(p, "w");
	assert_non_null(fp);
	for (int i = 0; i < 200; i++) /* frequent enough to be a vocab entry of its own */
		fputs("zqxsecretword zqxsecretword\n", fp);
	fclose(fp);
	snprintf(p, sizeof p, "%s/corp/leak.txt", f->data);
	assert_int_equal(symlink("../../outside/secret.txt", p), 0); /* relative, climbing out */
	snprintf(target, sizeof target, "%s/secret.txt", outside);
	snprintf(p, sizeof p, "%s/corp/leak-abs.txt", f->data);
	assert_int_equal(symlink(target, p), 0);
	snprintf(p, sizeof p, "%s/corp/etc", f->data);
	assert_int_equal(symlink(outside, p), 0); /* a directory outside */
	snprintf(p, sizeof p, "%s/corp/same.txt", f->data);
	assert_int_equal(symlink("a.txt", p), 0); /* inside: followed */
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets",
					"{\"name\":\"linked\",\"source\":\"corp\","
					"\"vocab\":{\"train\":{\"vocab_size\":200}}}", &r), 0);
	if (r.status != 201)
		fail_msg("status %ld: %s", r.status, r.body);
	char id[64];
	snprintf(id, sizeof id, "%s", it_jstr(r.json, "id"));
	http_resp_free(&r);
	json_t *done = wait_dataset(&f->d, id);
	if (strcmp(it_jstr(done, "state"), "ready") != 0)
		fail_msg("dataset %s: %s", it_jstr(done, "state"), json_dumps(done, 0));
	json_t *stats = json_object_get(done, "stats");
	assert_int_equal(json_integer_value(json_object_get(stats, "files")), 2); /* a.txt, same.txt */
	assert_int_equal(json_integer_value(json_object_get(stats, "unk")), 0);
	json_decref(done);
	snprintf(p, sizeof p, "%s/datasets/linked/vocab.txt", f->data);
	assert_false(file_contains(p, "zqx"));
	assert_true(file_contains(p, "hello"));
}

/* A preparation that never ends (a link loop once; here its vocab
 * is a FIFO nobody writes, so it waits for ever) could not be stopped, and a
 * restart began it again. DELETE cancels it: the dataset is failed at once,
 * bertd-prepare is killed, its partial output removed; a second DELETE
 * removes the row. */
static void test_dataset_cancel(void **state)
{
	fx *f = *state;
	if (!prepare_expected())
		skip();
	char p[300];
	snprintf(p, sizeof p, "%s/corpus.txt", f->data);
	it_write_file(p, "Hello world.\nSecond sentence here.\n");
	snprintf(p, sizeof p, "%s/vocab.fifo", f->data);
	assert_int_equal(mkfifo(p, 0600), 0);
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets",
					"{\"name\":\"stuck\",\"source\":\"corpus.txt\","
					"\"vocab\":{\"file\":\"vocab.fifo\"}}", &r), 0);
	if (r.status != 201)
		fail_msg("status %ld: %s", r.status, r.body);
	char id[64], path[160], outdir[300];
	snprintf(id, sizeof id, "%s", it_jstr(r.json, "id"));
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/datasets/%s", id);
	snprintf(outdir, sizeof outdir, "%s/datasets/stuck", f->data);
	/* its bertd-prepare runs (bounded wait: the supervisor starts it within a tick) */
	pid_t pid[4];
	int n = 0;
	for (int i = 0; i < 300 && (n = it_find_pids("bertd-prepare", outdir, pid, 4)) == 0; i++)
		it_pause_ms(100);
	if (n != 1)
		fail_msg("%d bertd-prepare processes for %s", n, outdir);
	json_t *now = it_get_json(&f->d, path);
	assert_string_equal(it_jstr(now, "state"), "preparing");
	json_decref(now);

	if (do_delete(&f->d, path, &r) != 202)
		fail_msg("DELETE while preparing -> %ld: %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "state"), "failed");
	assert_non_null(strstr(it_jstr(r.json, "error"), "canceled"));
	http_resp_free(&r);
	/* the process goes (bounded), and with it what it wrote */
	pid_t was = pid[0];
	for (int i = 0; i < 300 && it_find_pids("bertd-prepare", outdir, pid, 4) > 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids("bertd-prepare", outdir, pid, 4), 0);
	char tmpdir[400];
	snprintf(tmpdir, sizeof tmpdir, "%s.tmp-%ld", outdir, (long)was);
	assert_int_equal(access(tmpdir, F_OK), -1);
	assert_int_equal(access(outdir, F_OK), -1);
	/* a canceled dataset is not prepared again by the next daemon */
	bertd_kill9(&f->d);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	now = it_get_json(&f->d, path);
	assert_string_equal(it_jstr(now, "state"), "failed");
	assert_non_null(strstr(it_jstr(now, "error"), "canceled"));
	json_decref(now);
	/* DELETE again removes it */
	assert_int_equal(do_delete(&f->d, path, &r), 204);
	http_resp_free(&r);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 404);
	http_resp_free(&r);
}

/* init_from may name a directory inside a data root whose
 * model.safetensors links to a file elsewhere; the worker then read it and
 * its failure quoted the file's first bytes. Submit refuses such a link
 * (403 naming the link, never the target's content); one inside is fine. */
static void test_init_from_link_refused(void **state)
{
	fx *f = *state;
	char p[300];
	snprintf(p, sizeof p, "%s/secret.bin", outside);
	it_write_file(p, "zqxsecretword: not a model\n");
	static const char *const dirs[] = {"hf", "ck"};
	for (int k = 0; k < 2; k++) {
		snprintf(p, sizeof p, "%s/%s", f->data, dirs[k]);
		mkdir(p, 0700);
		snprintf(p, sizeof p, "%s/%s/%s", f->data, dirs[k], k ? "state.json" : "config.json");
		it_write_file(p, "{}\n");
		if (k) {
			snprintf(p, sizeof p, "%s/ck/DONE", f->data);
			it_write_file(p, "");
		}
		snprintf(p, sizeof p, "%s/%s/%s", f->data, dirs[k], k ? "params.safetensors" : "model.safetensors");
		assert_int_equal(symlink("../../outside/secret.bin", p), 0);
		char init[300];
		snprintf(init, sizeof init, "\"%s\"", dirs[k]);
		http_resp r;
		post_bare_job(&f->d, "none", init, &r);
		if (r.status != 403)
			fail_msg("init_from %s -> %ld: %s", init, r.status, r.body);
		assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:path-forbidden");
		assert_string_equal(it_jstr(r.json, "field"), "init_from");
		const char *detail = it_jstr(r.json, "detail");
		if (!strstr(detail, k ? "params.safetensors" : "model.safetensors") ||
		    !strstr(detail, "symbolic link") || strstr(detail, "zqx"))
			fail_msg("detail: %s", detail);
		http_resp_free(&r);
	}
	/* a link that stays in the root passes this check (the job is then
	 * refused for its missing dataset, a later check) */
	snprintf(p, sizeof p, "%s/real.safetensors", f->data);
	it_write_file(p, "x");
	snprintf(p, sizeof p, "%s/hf/model.safetensors", f->data);
	assert_int_equal(unlink(p), 0);
	assert_int_equal(symlink("../real.safetensors", p), 0);
	http_resp r;
	post_bare_job(&f->d, "none", "\"hf\"", &r);
	if (r.status != 422 || strcmp(it_jstr(r.json, "field"), "dataset") != 0)
		fail_msg("in-root link -> %ld: %s", r.status, r.body);
	http_resp_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_dataset_validation, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_dataset_prepare, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_dataset_restart, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_devices, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_dataset_delete, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_job_subresources, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_dataset_links_confined, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_dataset_cancel, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_init_from_link_refused, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
