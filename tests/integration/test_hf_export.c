/* HF exports out of every checkpoint, the export of a canceled job, the
 * best checkpoint, and max_runtime_seconds across restarts:
 *   - GET /v1/jobs/{id}/checkpoints/{step}/export is a tar that unpacks to
 *     the export's five files; at the step the job ended on they are byte
 *     for byte the job's export; at an earlier step transformers loads them
 *     and every weight equals the checkpoint's (check_ckpt_export.py, which
 *     cuts params.safetensors itself); `bertd export` on the checkpoint
 *     directory writes the same files (and refuses an existing OUT_DIR, a
 *     checkpoint outside a job without --dataset); a damaged checkpoint is
 *     500 export-failed naming the file, with nothing left behind; no
 *     checkpoint 404, no number 400;
 *   - a canceled job has an export of its stop checkpoint, the job says
 *     which step ({"step", "source": "stopped"}), and it is that
 *     checkpoint's model; a job canceled while queued after a daemon
 *     restart (no worker to stop) gets its newest checkpoint's export on
 *     its first GET /export, and then shows it;
 *   - save_total_limit 1 with evaluation keeps the best checkpoint when the
 *     later ones are worse (a learning rate warmed up to 0.5: the first
 *     eval is the best, deterministically); the job's best_model is the
 *     argmin of the eval_loss rows at checkpoint steps, computed here; with
 *     load_best_model_at_end the export is the best checkpoint's weights;
 *     without it, the last step's (the best is still kept);
 *   - max_runtime_seconds across a kill -9 of the worker: the restarted
 *     attempt gets what the first left, so the attempts together stop at
 *     the budget, not at the first attempt's time plus a whole budget. */
#include <errno.h>
#include <math.h>
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

#define DEADLINE_S 240

typedef it_fx fx;

static int setup(void **state)
{
	const char *extra[] = {"--stop-timeout-s", "60", NULL};
	it_daemon_opts o = {.cpu_slots = "1", .extra = extra, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 2000, .vocab_size = 400};
	return it_setup(state, &o, DEADLINE_S);
}

/* GET path into file tar: must be a 200 tar whose Content-Length is the
 * bytes received. */
static void get_tar(const bertd *d, const char *path, const char *tar)
{
	char v[256];
	http_resp r;
	assert_int_equal(http_get(d, path, &r), 0);
	if (r.status != 200)
		fail_msg("GET %s: %ld %s", path, r.status, r.body);
	assert_string_equal(http_header(&r, "Content-Type", v, sizeof v), "application/x-tar");
	assert_int_equal(strtoull(http_header(&r, "Content-Length", v, sizeof v), NULL, 10), r.len);
	FILE *f = fopen(tar, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(r.body, 1, r.len, f), r.len);
	assert_int_equal(fclose(f), 0);
	http_resp_free(&r);
}

/* GET /v1/jobs/{id}/checkpoints/{step}/export, unpacked under root:
 * out gets the directory it unpacked to (<name>-ckpt-<step>-export). */
static void get_ckpt_export(const fx *f, const char *id, const char *name, long step, char *out, size_t cap)
{
	char path[200], tar[300], dir[300];
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/%ld/export", id, step);
	snprintf(tar, sizeof tar, "%s/%s-%ld.tar", f->d.root, name, step);
	snprintf(dir, sizeof dir, "%s/x-%s-%ld", f->d.root, name, step);
	get_tar(&f->d, path, tar);
	mkdir(dir, 0700);
	assert_int_equal(it_system("tar -xf '%s' -C '%s'", tar, dir), 0);
	snprintf(out, cap, "%s/%s-ckpt-%ld-export", dir, name, step);
	static const char *const files[] = {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json",
					    "special_tokens_map.json"};
	assert_int_equal(it_system("test \"$(ls -A '%s' | tr '\\n' ' ')\" = 'config.json model.safetensors "
				   "special_tokens_map.json tokenizer_config.json vocab.txt '", out), 0);
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		assert_int_equal(it_system("test -s '%s/%s'", out, files[i]), 0);
}

/* Whether every file of a is in b with the same bytes (and the same names). */
static bool same_files(const char *a, const char *b)
{
	return it_system("test \"$(ls -A '%s')\" = \"$(ls -A '%s')\" && for f in '%s'/*; do "
			 "cmp -s \"$f\" '%s'/\"$(basename \"$f\")\" || exit 1; done", a, b, a, b) == 0;
}

/* transformers loads model_dir and its weights are ckpt's (77: not
 * installed, this part skipped). */
static void check_weights(const char *model_dir, const char *ckpt)
{
	const char *src = getenv("BERTD_SOURCE_ROOT");
	assert_non_null(src);
	if (access("/usr/bin/python3", X_OK) != 0) {
		fprintf(stderr, "transformers check skipped: no /usr/bin/python3\n");
		return;
	}
	int rc = it_system("/usr/bin/python3 '%s/tests/integration/check_ckpt_export.py' '%s' '%s'", src, model_dir,
			   ckpt);
	if (rc == 77)
		fprintf(stderr, "transformers check skipped: not installed\n");
	else
		assert_int_equal(rc, 0);
}

static void ckpt_dir(const fx *f, const char *id, long step, char *out, size_t cap)
{
	snprintf(out, cap, "%s/jobs/%s/checkpoints/ckpt-%ld", f->d.state_dir, id, step);
}

/* The steps GET /v1/jobs/{id}/checkpoints lists, ascending, into steps. */
static size_t checkpoint_steps(const fx *f, const char *id, long *steps, size_t cap)
{
	char path[160];
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
	json_t *r = it_get_json(&f->d, path), *c;
	size_t i, n = 0;
	json_array_foreach(json_object_get(r, "checkpoints"), i, c) {
		assert_true(n < cap);
		steps[n++] = (long)json_integer_value(json_object_get(c, "step"));
	}
	json_decref(r);
	for (size_t a = 1; a < n; a++) /* insertion sort: a handful */
		for (size_t b = a; b > 0 && steps[b - 1] > steps[b]; b--) {
			long t = steps[b];
			steps[b] = steps[b - 1];
			steps[b - 1] = t;
		}
	return n;
}

/* The tiny job name on shakes for steps steps saving every save, without
 * warm-up; more overrides (dotted path, JSON text) before the NULL. */
#define JOB(name, steps, save, ...)                                                                   \
	it_job_spec(name, "shakes", "training_args.max_steps", steps, "training_args.save_steps", save, \
		    "training_args.warmup_steps", "null", __VA_ARGS__)

/* Submits spec and frees it; returns the job's id (caller frees). */
static char *submit(const bertd *d, char *spec)
{
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static void test_checkpoint_export(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, JOB("cx", "20", "10", NULL));
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	const char *model_dir = it_jstr(job, "model_dir");
	json_t *ex = json_object_get(job, "export");
	assert_int_equal(json_integer_value(json_object_get(ex, "step")), 20);
	assert_string_equal(it_jstr(ex, "source"), "final");

	/* the step the job ended on: the job's own export, byte for byte */
	char d20[400], d10[400], ck[400], cli[400];
	get_ckpt_export(f, id, "cx", 20, d20, sizeof d20);
	assert_true(same_files(model_dir, d20));
	/* an earlier one: another model, the checkpoint's weights */
	get_ckpt_export(f, id, "cx", 10, d10, sizeof d10);
	assert_int_not_equal(it_system("cmp -s '%s/model.safetensors' '%s/model.safetensors'", d10, d20), 0);
	ckpt_dir(f, id, 10, ck, sizeof ck);
	check_weights(d10, ck);

	/* bertd export on disk: the same files */
	const char *bin = getenv("BERTD_BIN");
	snprintf(cli, sizeof cli, "%s/cli-10", f->d.root);
	assert_int_equal(it_system("'%s' export '%s' '%s'", bin, ck, cli), 0);
	assert_true(same_files(cli, d10));
	assert_int_not_equal(it_system("'%s' export '%s' '%s' 2>/dev/null", bin, ck, cli), 0); /* exists */
	/* a checkpoint outside its job: the vocab's dataset must be named */
	char lone[400], lone_out[400];
	snprintf(lone, sizeof lone, "%s/lone/ckpt-10", f->d.root);
	snprintf(lone_out, sizeof lone_out, "%s/lone-out", f->d.root);
	assert_int_equal(it_system("mkdir -p '%s/lone' && cp -r '%s' '%s'", f->d.root, ck, lone), 0);
	assert_int_not_equal(it_system("'%s' export '%s' '%s' 2>/dev/null", bin, lone, lone_out), 0);
	json_t *ds = it_get_json(&f->d, "/v1/datasets/shakes");
	assert_int_equal(it_system("'%s' export '%s' '%s' --dataset '%s'", bin, lone, lone_out, it_jstr(ds, "path")), 0);
	json_decref(ds);
	assert_true(same_files(lone_out, d10));

	/* no checkpoint at 7, "x7" no step */
	http_resp r;
	char path[200];
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/7/export", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 404);
	assert_non_null(strstr(it_jstr(r.json, "detail"), "no complete checkpoint at step 7"));
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/x7/export", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 400);
	assert_string_equal(it_jstr(r.json, "field"), "step");
	http_resp_free(&r);
	/* a damaged checkpoint: the conversion fails, says why, leaves nothing */
	assert_int_equal(it_system("truncate -s 100 '%s/params.safetensors'", ck), 0);
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/10/export", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 500);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:export-failed");
	assert_non_null(strstr(it_jstr(r.json, "detail"), "params.safetensors"));
	http_resp_free(&r);
	assert_int_equal(it_system("test -z \"$(ls -A '%s/jobs/%s' | grep '^\\.export')\"", f->d.state_dir, id), 0);
	json_decref(job);
	free(id);
}

static void test_cancel_exports_last_checkpoint(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, JOB("cancel-x", "1000000", "7", NULL));
	it_wait_step(&f->d, id, 10, DEADLINE_S);
	it_cancel_job(&f->d, id, DEADLINE_S);
	json_t *job = it_wait_job(&f->d, id, "canceled", DEADLINE_S);
	long steps[16];
	size_t n = checkpoint_steps(f, id, steps, 16);
	assert_true(n > 0);
	long last = steps[n - 1];
	assert_true(last >= 10);
	json_t *ex = json_object_get(job, "export");
	if (!json_is_object(ex))
		fail_msg("a canceled job at step %ld has no export: %s", last, json_dumps(job, 0));
	assert_int_equal(json_integer_value(json_object_get(ex, "step")), last);
	assert_string_equal(it_jstr(ex, "source"), "stopped");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(job, "last_checkpoint"), "step")), last);
	const char *model_dir = it_jstr(job, "model_dir");

	/* GET /export streams it; it is the stop checkpoint's model */
	char path[200], tar[300], out[300], got[400], conv[400], ck[400];
	snprintf(path, sizeof path, "/v1/jobs/%s/export", id);
	snprintf(tar, sizeof tar, "%s/cancel-export.tar", f->d.root);
	snprintf(out, sizeof out, "%s/cancel-export", f->d.root);
	get_tar(&f->d, path, tar);
	mkdir(out, 0700);
	assert_int_equal(it_system("tar -xf '%s' -C '%s'", tar, out), 0);
	snprintf(got, sizeof got, "%s/cancel-x-export", out);
	assert_true(same_files(model_dir, got));
	get_ckpt_export(f, id, "cancel-x", last, conv, sizeof conv);
	assert_true(same_files(got, conv));
	ckpt_dir(f, id, last, ck, sizeof ck);
	check_weights(got, ck);
	json_decref(job);
	free(id);
}

static void test_canceled_while_queued_exports_on_request(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, JOB("queued-x", "1000000", "5", NULL));
	it_wait_step(&f->d, id, 10, DEADLINE_S);
	/* a shutdown puts it back in the queue (no export: it will resume) */
	assert_int_equal(bertd_stop(&f->d), 0);
	const char *extra[] = {"--stop-timeout-s", "60", NULL};
	it_daemon_opts o = {.cpu_slots = "1", .schedule = "false", .extra = extra};
	assert_int_equal(it_daemon_run(f, &o), 0);
	char path[200];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *job = it_get_json(&f->d, path);
	assert_string_equal(it_jstr(job, "state"), "queued");
	assert_true(json_is_null(json_object_get(job, "export")));
	json_decref(job);
	it_cancel_job(&f->d, id, DEADLINE_S);
	job = it_get_json(&f->d, path);
	assert_true(json_is_null(json_object_get(job, "export")));
	json_decref(job);
	long steps[16];
	size_t n = checkpoint_steps(f, id, steps, 16);
	assert_true(n > 0);
	long last = steps[n - 1];

	/* GET /export converts the newest checkpoint, once */
	char tar[300], out[300], got[400], conv[400], ck[400];
	snprintf(path, sizeof path, "/v1/jobs/%s/export", id);
	snprintf(tar, sizeof tar, "%s/queued-export.tar", f->d.root);
	snprintf(out, sizeof out, "%s/queued-export", f->d.root);
	get_tar(&f->d, path, tar);
	mkdir(out, 0700);
	assert_int_equal(it_system("tar -xf '%s' -C '%s'", tar, out), 0);
	snprintf(got, sizeof got, "%s/queued-x-export", out);
	get_ckpt_export(f, id, "queued-x", last, conv, sizeof conv);
	assert_true(same_files(got, conv));
	ckpt_dir(f, id, last, ck, sizeof ck);
	check_weights(got, ck);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	job = it_get_json(&f->d, path);
	json_t *ex = json_object_get(job, "export");
	assert_int_equal(json_integer_value(json_object_get(ex, "step")), last);
	assert_string_equal(it_jstr(ex, "source"), "stopped");
	assert_true(same_files(it_jstr(job, "model_dir"), got));
	json_decref(job);
	free(id);
}

/* The eval_loss of each metrics row with one, by step. */
static size_t eval_rows(const fx *f, const char *id, long *step, double *loss, size_t cap)
{
	json_t *rows = it_metrics_of(&f->d, id), *row;
	size_t i, n = 0;
	json_array_foreach(rows, i, row) {
		json_t *v = json_object_get(row, "eval_loss");
		if (!json_is_number(v))
			continue;
		assert_true(n < cap);
		step[n] = (long)json_integer_value(json_object_get(row, "step"));
		loss[n++] = json_number_value(v);
	}
	json_decref(rows);
	return n;
}

/* lr warmed up to 0.5 over the whole run: the first evaluation is the
 * best, the later ones are worse (the learning rate overshoots). */
#define BEST_JOB(name, load_best)                                                                       \
	it_job_spec(name, "shakes", "training_args.save_steps", "5", "training_args.learning_rate", "0.5",     \
		    "training_args.warmup_steps", "20", "training_args.eval_strategy", "\"steps\"",             \
		    "training_args.eval_steps", "5", "training_args.max_eval_batches", "4",                     \
		    "training_args.save_total_limit", "1", "training_args.load_best_model_at_end", load_best, NULL)

static void test_best_checkpoint_kept_and_exported(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	const char *const names[2] = {"best-at-end", "best-kept"};
	char *ids[2] = {submit(&f->d, BEST_JOB("best-at-end", "true")), submit(&f->d, BEST_JOB("best-kept", "false"))};
	for (int k = 0; k < 2; k++) {
		json_t *job = it_wait_job(&f->d, ids[k], "completed|failed|canceled", DEADLINE_S);
		it_assert_completed(&f->d, job);
		/* the best, computed here from the eval rows (all at checkpoint steps) */
		long st[16];
		double loss[16];
		size_t n = eval_rows(f, ids[k], st, loss, 16);
		assert_int_equal(n, 4);
		size_t b = 0;
		for (size_t i = 1; i < n; i++)
			if (loss[i] < loss[b])
				b = i;
		if (st[b] == 20)
			fail_msg("%s: the last evaluation is the best (%g): this test needs a later, worse one",
				 names[k], loss[b]);
		json_t *best = json_object_get(job, "best_model");
		assert_int_equal(json_integer_value(json_object_get(best, "step")), st[b]);
		assert_string_equal(it_jstr(best, "metric"), "eval_loss");
		assert_true(fabs(json_number_value(json_object_get(best, "value")) - loss[b]) <= 1e-12 * fabs(loss[b]));
		/* save_total_limit 1 kept the newest and the best */
		long kept[16];
		assert_int_equal(checkpoint_steps(f, ids[k], kept, 16), 2);
		assert_int_equal(kept[0], st[b]);
		assert_int_equal(kept[1], 20);
		char ck[400], best_conv[400], last_conv[400];
		for (size_t i = 0; i < n; i++) {
			ckpt_dir(f, ids[k], st[i], ck, sizeof ck);
			struct stat sb;
			assert_int_equal(stat(ck, &sb) == 0, st[i] == st[b] || st[i] == 20);
		}
		/* the export: the best checkpoint's weights, or the last step's */
		json_t *ex = json_object_get(job, "export");
		long want = k == 0 ? st[b] : 20;
		assert_int_equal(json_integer_value(json_object_get(ex, "step")), want);
		assert_string_equal(it_jstr(ex, "source"), k == 0 ? "best" : "final");
		const char *model_dir = it_jstr(job, "model_dir");
		get_ckpt_export(f, ids[k], names[k], st[b], best_conv, sizeof best_conv);
		get_ckpt_export(f, ids[k], names[k], 20, last_conv, sizeof last_conv);
		assert_true(same_files(model_dir, k == 0 ? best_conv : last_conv));
		assert_false(same_files(model_dir, k == 0 ? last_conv : best_conv));
		ckpt_dir(f, ids[k], want, ck, sizeof ck);
		check_weights(model_dir, ck);
		json_decref(job);
		free(ids[k]);
	}
}

/* Epoch ms of an event's "time" ("2026-12-01T21:05:37.051Z"). */
static int64_t event_ms(json_t *e)
{
	const char *t = it_jstr(e, "time");
	struct tm tm = {0};
	int ms = 0;
	assert_int_equal(sscanf(t, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
				&tm.tm_min, &tm.tm_sec, &ms), 7);
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (int64_t)timegm(&tm) * 1000 + ms;
}

/* The time of the n-th (0-based) event that entered state to. */
static int64_t nth_entry_ms(json_t *ev, const char *to, int n)
{
	size_t i;
	json_t *e;
	json_array_foreach(ev, i, e)
		if (strcmp(it_jstr(e, "to"), to) == 0 && n-- == 0)
			return event_ms(e);
	fail_msg("no event #%d into %s", n, to);
	return 0;
}

static void test_max_runtime_across_restart(void **state)
{
	fx *f = *state;
	const int budget_s = 20;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, JOB("runtime", "100000000", "20", "stopping_condition", "{\"max_runtime_seconds\":20}",
				     "retry_policy", "{\"max_restarts\":2}", NULL));
	/* let the first attempt run about half the budget (from when it was
	 * first seen running, by this clock), then kill its worker */
	char path[160];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	struct timespec t0 = {0}, now;
	for (;;) {
		json_t *j = it_get_json(&f->d, path);
		const char *st = it_jstr(j, "state");
		bool early = strcmp(st, "queued") == 0 || strcmp(st, "starting") == 0 || strcmp(st, "running") == 0;
		if (!early)
			fail_msg("job %s is %s before its worker was killed", id, st);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (strcmp(st, "running") == 0 && t0.tv_sec == 0)
			t0 = now;
		json_decref(j);
		int64_t ran_ms = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (t0.tv_sec && ran_ms >= budget_s * 1000 / 2)
			break;
		it_pause_ms(100);
	}
	pid_t pid;
	assert_int_equal(it_find_pids("bertd-worker", id, &pid, 1), 1);
	assert_int_equal(kill(pid, SIGKILL), 0);
	json_t *job = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "canceled");
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 1);
	json_t *ev = it_events_of(&f->d, id);
	assert_non_null(it_event_with(ev, "max_runtime_seconds reached"));
	assert_non_null(it_event_with(ev, "of stopping_condition.max_runtime_seconds left"));
	/* attempt 1: starting -> restarting; attempt 2: starting -> stopping */
	int64_t a1 = nth_entry_ms(ev, "restarting", 0) - nth_entry_ms(ev, "starting", 0);
	int64_t a2 = nth_entry_ms(ev, "stopping", 0) - nth_entry_ms(ev, "starting", 1);
	fprintf(stderr, "attempt 1 ran %lld ms, attempt 2 %lld ms until stopped; budget %d s, runtime %.3f s\n",
		(long long)a1, (long long)a2, budget_s, json_number_value(json_object_get(job, "runtime_seconds")));
	assert_true(a1 >= budget_s * 1000 / 2);
	/* the second attempt got what the first left, not a whole budget: with
	 * a fresh budget it would run budget_s, half of a1 more than this */
	assert_true(a2 < budget_s * 1000 - a1 / 2);
	/* and the two together used the budget */
	assert_true(json_number_value(json_object_get(job, "runtime_seconds")) >= budget_s);
	/* the stop exported the model */
	json_t *ex = json_object_get(job, "export");
	assert_string_equal(it_jstr(ex, "source"), "stopped");
	long steps[16];
	size_t n = checkpoint_steps(f, id, steps, 16);
	assert_int_equal(json_integer_value(json_object_get(ex, "step")), steps[n - 1]);
	json_decref(ev);
	json_decref(job);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_checkpoint_export, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_cancel_exports_last_checkpoint, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_canceled_while_queued_exports_on_request, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_best_checkpoint_kept_and_exported, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_max_runtime_across_restart, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
