/* Nothing hangs, nothing is lost, on the CPU backend with the
 * real daemon, workers and loaders:
 *   - a daemon drained (SIGTERM) before the job's first periodic checkpoint
 *     records the workers' stop checkpoint; the next daemon resumes from it
 *     (step > 0) and the export is bit-identical to an uninterrupted run;
 *   - a complete checkpoint whose record was lost (as a daemon that stopped
 *     reading while it drained lost it) is found in the job directory;
 *   - a truncated newest checkpoint is skipped with an event and the job
 *     resumes from the older complete one, bit-identical again;
 *   - a loss that is not finite fails the job once, not retried, with the
 *     step in failure_reason;
 *   - a worker stopped with SIGSTOP is a stall: the attempt fails with "rank
 *     0 made no progress for T s" and the job restarts and completes;
 *   - while it is stopped, before the limit, the store names it as the
 *     suspect and the stalled rule of the diagnosis names it; continued, it
 *     is cleared and the job completes without a restart.
 * Waiting is polling the API with a deadline; the tests assert on states and
 * events, never on timing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/diagnosis.h"
#include "daemon/store.h"
#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

typedef it_fx fx;

/* stall_s: --stall-timeout-s, or NULL for the default. */
static int setup_with(void **state, const char *stall_s)
{
	const char *extra[] = {"--stop-timeout-s", "60", stall_s ? "--stall-timeout-s" : NULL, stall_s, NULL};
	it_daemon_opts o = {.cpu_slots = "2", .extra = extra, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 3000, .vocab_size = 400};
	return it_setup(state, &o, 0);
}

static int setup(void **state)
{
	return setup_with(state, NULL);
}

/* A stall timeout of 3 s: the stall test's jobs report every step. */
static int setup_stall(void **state)
{
	return setup_with(state, "3");
}

/* 40 s: long enough to watch a suspect before the attempt fails. */
static int setup_stall_slow(void **state)
{
	return setup_with(state, "40");
}

/* A model small enough to train in seconds on two cores (it_job_spec's
 * tiny job on shakes): steps, save_steps, logging_steps, ranks and loaders
 * given, then more overrides (dotted path, JSON text) up to the NULL;
 * caller frees. */
#define JOB(name, steps, save, log, gpus, loaders, ...)                                                      \
	it_job_spec(name, "shakes", "training_args.max_steps", steps, "training_args.save_steps", save,         \
		    "training_args.logging_steps", log, "resources.gpus", gpus, "training_args.dataloader_num_workers", \
		    loaders, __VA_ARGS__)

/* Submits spec and frees it; returns the job's id (caller frees). */
static char *submit(const bertd *d, char *spec)
{
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

/* The step of the last "resuming from checkpoint at step N" event; -1 if none. */
static long resumed_step(json_t *ev)
{
	long step = -1;
	size_t i;
	json_t *e;
	json_array_foreach(ev, i, e) {
		const char *r = json_string_value(json_object_get(e, "reason"));
		const char *p = r ? strstr(r, "resuming from checkpoint at step ") : NULL;
		if (p)
			step = strtol(p + strlen("resuming from checkpoint at step "), NULL, 10);
	}
	return step;
}

/* The uninterrupted run's export digest. */
static void reference(fx *f, const char *spec, char sha[65])
{
	char *ref = it_submit(&f->d, spec);
	json_t *j = it_wait_completed(&f->d, ref, DEADLINE_S);
	it_sha_of_export(j, sha);
	json_decref(j);
	free(ref);
}

static void ckpt_dir(fx *f, const char *id, long step, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/jobs/%s/checkpoints/ckpt-%ld", f->d.state_dir, id, step);
}

/* The highest step among the job's ckpt-<step> directories with DONE. */
static long newest_on_disk(fx *f, const char *id)
{
	char root[300];
	snprintf(root, sizeof root, "%s/jobs/%s/checkpoints", f->d.state_dir, id);
	DIR *d = opendir(root);
	assert_non_null(d);
	long best = -1;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end, p[600];
		if (strncmp(e->d_name, "ckpt-", 5) != 0)
			continue;
		long s = strtol(e->d_name + 5, &end, 10);
		snprintf(p, sizeof p, "%s/%s/DONE", root, e->d_name);
		if (!*end && end != e->d_name + 5 && access(p, F_OK) == 0 && s > best)
			best = s;
	}
	closedir(d);
	return best;
}

/* SIGTERM before the first periodic checkpoint (save_steps 100000): the
 * stop checkpoint is recorded and resumed from, exactly. */
/* gpus, loaders: 2 ranks agree on the step they stop at; 1 stops at once. */
static void drain_resumes_from_stop_checkpoint(fx *f, const char *ref_spec, const char *spec)
{
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char a[65], b[65];
	reference(f, ref_spec, a);

	char *id = it_submit(&f->d, spec);
	it_wait_step(&f->d, id, 10, DEADLINE_S);
	assert_int_equal(bertd_stop(&f->d), 0); /* drains: the workers write their stop checkpoint */
	long stop_step = newest_on_disk(f, id);
	assert_true(stop_step >= 10);
	assert_int_equal(it_daemon_run(f, NULL), 0);

	/* recorded by the draining daemon, not found later on disk */
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
	json_t *ck = it_get_json(&f->d, path);
	json_t *rows = json_object_get(ck, "checkpoints");
	assert_int_equal(json_array_size(rows), 1); /* no periodic one: save_steps 100000 */
	assert_int_equal(json_integer_value(json_object_get(json_array_get(rows, 0), "step")), stop_step);
	json_decref(ck);

	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_t *ev = it_events_of(&f->d, id);
	assert_non_null(it_event_with(ev, "daemon shutting down")); /* drained, not finished first */
	assert_int_equal(resumed_step(ev), stop_step);
	assert_null(it_event_with(ev, "without a record"));
	it_sha_of_export(job, b);
	assert_string_equal(a, b); /* bit-identical to the uninterrupted run */
	json_decref(ev);
	json_decref(job);
	free(id);
}

static void test_drain_resumes_from_stop_checkpoint(void **state)
{
	char *ref = JOB("ref", "200", "100000", "5", "2", "1", NULL);
	char *spec = JOB("drained", "200", "100000", "5", "2", "1", NULL);
	drain_resumes_from_stop_checkpoint(*state, ref, spec);
	free(ref);
	free(spec);
}

/* One rank, its own batches: once the final checkpoint and export of a
 * stopped single-rank job made it look completed. */
static void test_drain_one_rank_resumes(void **state)
{
	char *ref = JOB("ref", "400", "100000", "5", "1", "0", NULL);
	char *spec = JOB("drained", "400", "100000", "5", "1", "0", NULL);
	drain_resumes_from_stop_checkpoint(*state, ref, spec);
	free(ref);
	free(spec);
}

/* The stop checkpoint's record is lost (what a daemon that stopped reading
 * while it drained did): the next daemon finds it in the job directory. */
static void test_unrecorded_checkpoint_found(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, JOB("lost", "100000", "100000", "5", "1", "0", NULL));
	it_wait_step(&f->d, id, 10, DEADLINE_S);
	assert_int_equal(bertd_stop(&f->d), 0);
	long stop_step = newest_on_disk(f, id);
	assert_true(stop_step >= 10);

	char db[200];
	snprintf(db, sizeof db, "%s/bertd.db", f->d.state_dir);
	store *st = NULL;
	assert_int_equal(store_open(&st, db), 0);
	assert_int_equal(store_checkpoint_delete(st, id, stop_step), 0);
	store_close(st);

	assert_int_equal(it_daemon_run(f, NULL), 0);
	it_wait_step(&f->d, id, stop_step + 5, DEADLINE_S); /* resumed and training */
	json_t *ev = it_events_of(&f->d, id);
	assert_non_null(it_event_with(ev, "without a record"));
	assert_int_equal(resumed_step(ev), stop_step);
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
	json_t *ck = it_get_json(&f->d, path); /* the row is back */
	assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(ck, "checkpoints"), 0),
							    "step")), stop_step);
	json_decref(ck);
	json_decref(ev);
	it_cancel_job(&f->d, id, DEADLINE_S);
	free(id);
}

/* The newest checkpoint is truncated after the fact: the job resumes from
 * the older complete one, says so in an event, and ends as if never
 * interrupted. */
static void test_truncated_newest_falls_back(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char a[65], b[65];
	char *ref = JOB("ref", "300", "10", "5", "1", "1", NULL);
	reference(f, ref, a);
	free(ref);

	char *id = submit(&f->d, JOB("truncated", "300", "10", "5", "1", "1", NULL));
	it_wait_step(&f->d, id, 25, DEADLINE_S); /* checkpoints 10 and 20 exist */
	assert_int_equal(bertd_stop(&f->d), 0);
	long newest = newest_on_disk(f, id);
	assert_true(newest >= 25);
	char p[400];
	ckpt_dir(f, id, newest, p, sizeof p);
	strncat(p, "/params.safetensors", sizeof p - strlen(p) - 1);
	struct stat sb;
	assert_int_equal(stat(p, &sb), 0);
	assert_int_equal(truncate(p, sb.st_size / 2), 0);

	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_t *ev = it_events_of(&f->d, id);
	assert_non_null(it_event_with(ev, "daemon shutting down")); /* drained, not finished first */
	char want[80];
	snprintf(want, sizeof want, "checkpoint at step %ld is unusable", newest);
	assert_non_null(it_event_with(ev, want));
	long resumed = resumed_step(ev);
	assert_true(resumed > 0 && resumed < newest);
	it_sha_of_export(job, b);
	assert_string_equal(a, b);
	json_decref(ev);
	json_decref(job);
	free(id);
}

/* Copies dir/name to to/name. */
static void copy_file(const char *dir, const char *to, const char *name)
{
	char src[400], dst[400];
	snprintf(src, sizeof src, "%s/%s", dir, name);
	snprintf(dst, sizeof dst, "%s/%s", to, name);
	FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
	assert_non_null(in);
	assert_non_null(out);
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, in)) > 0)
		assert_int_equal(fwrite(buf, 1, n, out), n);
	fclose(in);
	assert_int_equal(fclose(out), 0);
}

/* A job starting from weights that are all NaN: its loss is not finite at
 * the first step. It fails once (restart_count 0 of 2 allowed) with the
 * step and the reason. */
static void test_nonfinite_loss_fails_once(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *base = submit(&f->d, JOB("base", "10", "10", "5", "1", "0", NULL));
	json_t *j = it_wait_completed(&f->d, base, DEADLINE_S);
	json_decref(j);

	/* its ckpt-10, copied into the data root with every parameter NaN */
	char src[400], poison[300];
	ckpt_dir(f, base, 10, src, sizeof src);
	snprintf(poison, sizeof poison, "%s/poison", f->data);
	assert_int_equal(mkdir(poison, 0700), 0);
	static const char *const files[] = {"params.safetensors", "optim.safetensors", "state.json", "DONE"};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		copy_file(src, poison, files[i]);
	char p[400];
	snprintf(p, sizeof p, "%s/params.safetensors", poison);
	int fd = open(p, O_RDWR);
	assert_true(fd >= 0);
	uint8_t hl[8];
	assert_int_equal(pread(fd, hl, 8, 0), 8);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | hl[i];
	struct stat sb;
	assert_int_equal(fstat(fd, &sb), 0);
	static uint8_t nan_bytes[65536];
	memset(nan_bytes, 0xff, sizeof nan_bytes); /* 0xffffffff is a NaN */
	for (off_t off = (off_t)(8 + hlen); off < sb.st_size;) {
		size_t n = (size_t)(sb.st_size - off) < sizeof nan_bytes ? (size_t)(sb.st_size - off) : sizeof nan_bytes;
		assert_int_equal(pwrite(fd, nan_bytes, n, off), (ssize_t)n);
		off += (off_t)n;
	}
	close(fd);

	char init[310];
	snprintf(init, sizeof init, "\"%s\"", poison);
	char *id = submit(&f->d, JOB("diverges", "40", "10", "5", "1", "0", "init_from", init, "retry_policy",
				     "{\"max_restarts\":2}", NULL));
	json_t *job = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "failed");
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	const char *why = it_jstr(job, "failure_reason");
	fprintf(stderr, "non-finite loss: %s\n", why);
	assert_non_null(strstr(why, "training diverged after step 0: rank 0: "));
	assert_non_null(strstr(why, "not finite"));
	assert_non_null(strstr(why, "not retried"));
	json_decref(job);
	free(id);
	free(base);
}

/* kill -STOP of the only worker: the stall watch fails the attempt, the job
 * restarts and completes. logging_steps 1, so that metrics flow every step
 * (a worker without the progress heartbeat reports nothing else). */
static void test_stopped_worker_is_a_stall(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	/* long enough never to end on its own: a short one could finish
	 * before the test finds its worker; canceled at the end */
	char *id = submit(&f->d, JOB("stuck", "1000000", "20", "1", "1", "0", "retry_policy", "{\"max_restarts\":3}", NULL));
	it_wait_step(&f->d, id, 30, DEADLINE_S); /* past the step-20 checkpoint */
	pid_t pid;
	assert_int_equal(it_find_pids("bertd-worker", id, &pid, 1), 1);
	assert_int_equal(kill(pid, SIGSTOP), 0);
	/* until the attempt has failed as a stall */
	const char *why = NULL;
	json_t *ev = NULL;
	for (int i = 0; i < DEADLINE_S * 10 && !why; i++) {
		json_decref(ev);
		ev = it_events_of(&f->d, id);
		why = it_event_with(ev, "rank 0 made no progress for ");
		if (!why)
			it_pause_ms(100);
	}
	if (!why) {
		kill(pid, SIGCONT);
		bertd_print_log(&f->d);
		fail_msg("job %s: no stall after %d s", id, DEADLINE_S);
	}
	fprintf(stderr, "stall: %s\n", why ? why : "(none)"); /* gcc: fail_msg may return */
	assert_non_null(strstr(why, "restart 1 of 3"));
	json_decref(ev);
	kill(pid, SIGCONT); /* killed by the daemon already: a no-op, or ESRCH */
	/* the next attempt resumes from the step-20 checkpoint */
	long resumed = -1;
	for (int i = 0; i < DEADLINE_S * 10 && resumed < 20; i++) {
		ev = it_events_of(&f->d, id);
		resumed = resumed_step(ev);
		json_decref(ev);
		if (resumed < 20)
			it_pause_ms(100);
	}
	assert_true(resumed >= 20);
	json_t *job = it_poll_job(&f->d, id, "running", resumed + 1, DEADLINE_S, NULL, NULL);
	assert_true(json_integer_value(json_object_get(job, "restart_count")) >= 1);
	json_decref(job);
	it_cancel_job(&f->d, id, DEADLINE_S);
	free(id);
}

/* The job's stall_json, read from the daemon's store (WAL: a second
 * connection reads beside the daemon's); NULL when none (caller frees). */
static char *stall_of(fx *f, const char *id)
{
	char db[200];
	snprintf(db, sizeof db, "%s/bertd.db", f->d.state_dir);
	store *st = NULL;
	assert_int_equal(store_open(&st, db), 0);
	store_job j;
	assert_int_equal(store_job_get(st, id, &j), 0);
	char *s = j.stall_json ? strdup(j.stall_json) : NULL;
	store_job_free(&j);
	store_close(st);
	return s;
}

static void test_stopped_worker_is_suspected(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, JOB("paused", "1000000", "20", "1", "1", "0", NULL)); /* canceled at the end */
	it_wait_step(&f->d, id, 10, DEADLINE_S);
	assert_null(stall_of(f, id)); /* reporting every step: nobody suspected */
	pid_t pid;
	assert_int_equal(it_find_pids("bertd-worker", id, &pid, 1), 1);
	assert_int_equal(kill(pid, SIGSTOP), 0);
	/* a quarter of the 40 s limit in, the stall watch names it */
	char *text = NULL;
	for (int i = 0; i < DEADLINE_S * 10 && !text; i++) {
		text = stall_of(f, id);
		if (!text)
			it_pause_ms(100);
	}
	kill(pid, SIGCONT);
	if (!text)
		fail_msg("job %s: no stall suspect recorded", id);
	fprintf(stderr, "suspect: %s\n", text);
	diag_job dj = {.running = true, .started = true};
	diag_job_stall_from_json(&dj, text);
	assert_true(dj.stall);
	assert_int_equal(dj.stall_rank, 0);
	assert_true(dj.stall_stopped);
	assert_true(dj.stall_limit_s >= 40);
	/* the diagnosis at the limit, as GET /diagnosis would show it then */
	dj.now_ms = dj.stall_since_ms + (int64_t)(dj.stall_limit_s * 1000);
	diag_config cfg;
	diag_config_default(&cfg);
	diag_report rep;
	diag_run(&cfg, &dj, NULL, 0, &rep);
	assert_int_equal(rep.r[DIAG_STALLED].status, DIAG_ISSUE);
	assert_non_null(strstr(rep.summary, "stalled: rank 0 is stuck"));
	free(text);

	/* continued before the limit: cleared, and nothing restarted */
	for (int i = 0; i < DEADLINE_S * 10 && (text = stall_of(f, id)); i++) {
		free(text);
		it_pause_ms(100);
	}
	assert_null(text);
	json_t *job = it_poll_job(&f->d, id, "running", 0, DEADLINE_S, NULL, NULL);
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	json_decref(job);
	it_cancel_job(&f->d, id, DEADLINE_S);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_drain_resumes_from_stop_checkpoint, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_drain_one_rank_resumes, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_unrecorded_checkpoint_found, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_truncated_newest_falls_back, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_nonfinite_loss_fails_once, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_stopped_worker_is_a_stall, setup_stall, it_teardown),
		cmocka_unit_test_setup_teardown(test_stopped_worker_is_suspected, setup_stall_slow, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
