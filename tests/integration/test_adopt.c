/* Adoption: a job's workers and loaders outlive the daemon, and the next
 * daemon on the same state dir adopts them.
 *   - kill -9 of the daemon during a 2-rank CPU job (one loader): the job
 *     keeps stepping with no daemon (a checkpoint past the one it had
 *     appears in its directory), the next daemon adopts it (an event, no
 *     restart), the job completes, its export is byte-for-byte the one of
 *     an undisturbed run of the same spec, and its metrics have every
 *     logged step exactly once, with the undisturbed run's losses;
 *   - the daemon gone while a job completes: the next daemon finds its
 *     processes ended with exit records and marks it completed, with its
 *     export, and its metrics have no gap;
 *   - SIGQUIT: the daemon exits 5 (jobs left running) leaving the job running; the next one
 *     adopts it and it completes;
 *   - kill -9 of the daemon, then a newer bertd on the state dir (built
 *     with one more schema migration): it migrates the store, adopts the
 *     job, and the job completes with every step logged once;
 *   - workers that speak a worker protocol version the daemon does not
 *     know (a bertd-worker built with another CHAN_PROTO) are refused after
 *     a kill -9 of the daemon: an event names both versions, the attempt
 *     is killed and the job resumes from its checkpoint, no restart
 *     counted, and completes.
 * Waiting is polling with a deadline; the tests assert on states and
 * files, never on timing. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300

typedef it_fx fx;

static const char *const daemon_args[] = {"--stop-timeout-s", "60", NULL};
static const it_daemon_opts daemon_opts = {.cpu_slots = "2", .extra = daemon_args, .dataset = "shakes",
					   .corpus = "shakes.txt", .corpus_lines = 3000, .vocab_size = 400};

static int setup(void **state) { return it_setup(state, &daemon_opts, DEADLINE_S); }

/* The tiny job, 2 ranks and 1 loader, steps steps (checkpoints every 10,
 * metrics every 5). */
static char *submit(const bertd *d, const char *name, const char *steps)
{
	char *spec = it_job_spec(name, "shakes", "training_args.max_steps", steps, "resources.gpus", "2",
				 "training_args.dataloader_num_workers", "1", NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static void test_kill9_daemon_job_adopted(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *ref = submit(&f->d, "ref", "300");
	json_t *jref = it_wait_completed(&f->d, ref, DEADLINE_S);

	char *id = submit(&f->d, "adopted", "300");
	it_wait_step(&f->d, id, 15, DEADLINE_S); /* past the step-10 checkpoint */
	bertd_kill9(&f->d);
	long before = it_newest_checkpoint(f->d.state_dir, id);
	assert_true(before >= 10);
	/* with no daemon, the job goes on: a newer checkpoint appears */
	pid_t pids[8];
	int i;
	for (i = 0; i < DEADLINE_S * 10 && it_newest_checkpoint(f->d.state_dir, id) <= before; i++)
		it_pause_ms(100);
	long alone = it_newest_checkpoint(f->d.state_dir, id);
	assert_true(alone > before);
	fprintf(stderr, "adopt: checkpoint %ld before the kill, %ld written with no daemon\n", before, alone);
	assert_int_equal(it_find_pids(id, "bertd-worker", pids, 8), 2); /* both ranks still run */
	/* held while the daemon starts, so that it surely finds them running */
	for (int k = 0; k < 2; k++)
		assert_int_equal(kill(pids[k], SIGSTOP), 0);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *j0 = it_wait_job(&f->d, id, "running", DEADLINE_S);
	json_decref(j0);
	assert_true(it_has_event(&f->d, id, "adopted the running attempt (3 process(es) running, 0 ended"));
	for (int k = 0; k < 2; k++)
		assert_int_equal(kill(pids[k], SIGCONT), 0);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_false(it_has_event(&f->d, id, "resuming from checkpoint"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);

	char a[65], b[65];
	it_sha_of_export(jref, a);
	it_sha_of_export(job, b);
	assert_string_equal(a, b); /* bit-identical to the undisturbed run */
	it_assert_metrics_every(&f->d, id, 300, 5);
	json_t *ma = it_metrics_of(&f->d, ref), *mb = it_metrics_of(&f->d, id);
	for (size_t k = 0; k < json_array_size(ma); k++)
		assert_true(json_number_value(json_object_get(json_array_get(ma, k), "loss")) ==
			    json_number_value(json_object_get(json_array_get(mb, k), "loss")));
	json_decref(ma);
	json_decref(mb);
	assert_int_equal(it_find_pids(id, NULL, pids, 8), 0); /* nothing of it left */
	json_decref(job);
	json_decref(jref);
	free(id);
	free(ref);
}

static void test_job_completes_without_daemon(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "alone", "40");
	it_wait_step(&f->d, id, 5, DEADLINE_S);
	bertd_kill9(&f->d);
	/* the ranks finish with no daemon; the loader waits to be told to go */
	pid_t pids[8];
	for (int i = 0; i < DEADLINE_S * 10 && it_find_pids(id, "bertd-worker", pids, 8) > 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids(id, "bertd-worker", pids, 8), 0);
	char rec[400];
	struct stat st;
	snprintf(rec, sizeof rec, "%s/jobs/%s/ch/rank-0.exit", f->d.state_dir, id);
	assert_int_equal(stat(rec, &st), 0);

	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_true(it_has_event(&f->d, id, "adopted the running attempt"));
	json_t *ex = json_object_get(json_object_get(job, "outcome"), "export");
	if (!ex)
		ex = json_object_get(job, "export");
	assert_non_null(ex); /* its final export, reported while no daemon was there */
	char sha[65];
	it_sha_of_export(job, sha);
	it_assert_metrics_every(&f->d, id, 40, 5);
	for (int i = 0; i < DEADLINE_S * 10 && it_find_pids(id, NULL, pids, 8) > 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids(id, NULL, pids, 8), 0); /* the loader too */
	json_decref(job);
	free(id);
}

static void test_sigquit_leaves_job_running(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "quit", "200");
	it_wait_step(&f->d, id, 5, DEADLINE_S);
	assert_int_equal(kill(f->d.pid, SIGQUIT), 0);
	int st;
	assert_int_equal(waitpid(f->d.pid, &st, 0), f->d.pid);
	f->d.pid = 0;
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 5);
	pid_t pids[8];
	assert_int_equal(it_find_pids(id, "bertd-worker", pids, 8), 2);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_true(it_has_event(&f->d, id, "adopted the running attempt"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	it_assert_metrics_every(&f->d, id, 200, 5);
	json_decref(job);
	free(id);
}

static void test_newer_daemon_adopts(void **state)
{
	fx *f = *state;
	const char *next = getenv("IT_BERTD_NEXT"), *bin = getenv("BERTD_BIN");
	if (!next || !bin)
		fail_msg("IT_BERTD_NEXT or BERTD_BIN is not set (tests/integration/meson.build)");
	char *old_bin = strdup(bin), dir[400];
	snprintf(dir, sizeof dir, "%s", old_bin);
	*strrchr(dir, '/') = 0; /* the workers beside the older bertd */
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "upgraded", "200");
	it_wait_step(&f->d, id, 15, DEADLINE_S);
	bertd_kill9(&f->d);
	long before = it_store_user_version(&f->d);

	setenv("BERTD_BIN", next, 1);
	const char *extra[] = {"--stop-timeout-s", "60", "--bin-dir", dir, NULL};
	it_daemon_opts o = daemon_opts;
	o.extra = extra;
	int rc = it_daemon_run(f, &o);
	setenv("BERTD_BIN", old_bin, 1);
	assert_int_equal(rc, 0);
	assert_int_equal(it_store_user_version(&f->d), before + 1); /* the newer one's migration ran */
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_true(it_has_event(&f->d, id, "adopted the running attempt"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	it_assert_metrics_every(&f->d, id, 200, 5);
	json_decref(job);
	free(id);
	free(old_bin);
}

static void test_unknown_protocol_refused(void **state)
{
	fx *f = *state;
	const char *w99 = getenv("IT_PROTO_WORKER"), *loader = getenv("IT_LOADER");
	if (!w99 || !loader)
		fail_msg("IT_PROTO_WORKER or IT_LOADER is not set (tests/integration/meson.build)");
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char bin[300], link[400];
	snprintf(bin, sizeof bin, "%s/bin99", f->d.root);
	assert_int_equal(mkdir(bin, 0700), 0);
	snprintf(link, sizeof link, "%s/bertd-worker", bin);
	assert_int_equal(symlink(w99, link), 0);
	snprintf(link, sizeof link, "%s/bertd-loader", bin);
	assert_int_equal(symlink(loader, link), 0);
	assert_int_equal(bertd_stop(&f->d), 0);
	const char *extra[] = {"--stop-timeout-s", "60", "--bin-dir", bin, NULL};
	it_daemon_opts o = daemon_opts;
	o.extra = extra;
	assert_int_equal(it_daemon_run(f, &o), 0);

	char *id = submit(&f->d, "proto99", "200");
	it_wait_step(&f->d, id, 15, DEADLINE_S); /* past the step-10 checkpoint */
	bertd_kill9(&f->d);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_t *ev = it_events_of(&f->d, id);
	const char *why = it_event_with(ev, "worker protocol version 99");
	assert_non_null(why);
	assert_non_null(strstr(why, "adopts versions 1 to 1"));
	assert_non_null(it_event_with(ev, "resuming from checkpoint"));
	json_decref(ev);
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	it_assert_metrics_every(&f->d, id, 200, 5);
	json_decref(job);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_kill9_daemon_job_adopted, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_job_completes_without_daemon, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_sigquit_leaves_job_running, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_newer_daemon_adopts, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_unknown_protocol_refused, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
