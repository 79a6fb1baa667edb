/* Adoption across binaries built from different commits: an upgrade of
 * bertd while a job runs, and a downgrade refused.
 * The older side is bertd, bertd-worker, bertd-loader and bertd-prepare
 * built from a pinned earlier commit of this repository by oldbin_build.sh,
 * which this test runs first (tests/integration/meson.build names the
 * script, the commit, the directory and the compiler; the script's stamp
 * says whether the build succeeded, <dir>/bin holds its programs). That
 * commit is the first on main with adoption; its schema is one migration
 * behind this tree's, and its workers speak the protocol they were built
 * with.
 *   - upgrade: the older bertd prepares the dataset (its bertd-prepare) and
 *     runs a 2-rank CPU job (its workers and loader); kill -9 of it; this
 *     tree's bertd starts on the same state dir, migrates the store
 *     (PRAGMA user_version goes up), adopts the older workers and loader
 *     (an event, no restart, no checkpoint resumed) and the job completes:
 *     its export has the sha256 of an undisturbed run of the same spec by
 *     this tree's bertd and workers, and its metrics have every logged
 *     step once, with that run's losses;
 *   - downgrade: kill -9 of this tree's bertd during a job; the older bertd
 *     on the migrated state dir refuses to start (its log names both schema
 *     versions) and leaves the job's processes alone; this tree's bertd
 *     adopts them again and the job completes with every step once.
 * Skips (77) only where the older commit cannot be had: no git history
 * (a source tarball) or a shallow clone. The workers are held (SIGSTOP)
 * from before the kill until the next daemon has adopted them, so where the
 * kill lands does not depend on machine speed. Waiting is polling with a
 * deadline; the tests assert on states and files, never on timing. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300
/* enough that the ranks are still far from the end when they are held, on a fast machine too */
#define STEPS 200
#define STEPS_S "200"

typedef it_fx fx;

static char old_bin[600];   /* IT_OLDBIN_BIN: the older programs */
static char old_bertd[700]; /* and its bertd */
static char cur_bertd[600]; /* BERTD_BIN: this tree's bertd */

static const char *const old_args[] = {"--stop-timeout-s", "60", "--bin-dir", old_bin, NULL};
static const char *const cur_args[] = {"--stop-timeout-s", "60", NULL};

/* The daemon of the fixture is the older bertd (and its programs). */
static int setup_old(void **state)
{
	it_daemon_opts o = {.cpu_slots = "2", .extra = old_args, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 3000, .vocab_size = 400, .wait_ready = true};
	setenv("BERTD_BIN", old_bertd, 1);
	int rc = it_setup(state, &o, DEADLINE_S);
	setenv("BERTD_BIN", cur_bertd, 1);
	return rc;
}

/* The daemon of the fixture is this tree's bertd. */
static int setup_current(void **state)
{
	it_daemon_opts o = {.cpu_slots = "2", .extra = cur_args, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 3000, .vocab_size = 400, .wait_ready = true};
	return it_setup(state, &o, DEADLINE_S);
}

/* (Re)starts bin (a bertd) on f's state dir with args. bertd_start's answer. */
static int start_with(fx *f, const char *bin, const char *const *args)
{
	it_daemon_opts o = {.cpu_slots = "2", .extra = args};
	setenv("BERTD_BIN", bin, 1);
	int rc = it_daemon_run(f, &o);
	setenv("BERTD_BIN", cur_bertd, 1);
	return rc;
}

/* The tiny job, 2 ranks and 1 loader, STEPS steps (checkpoints every 10,
 * metrics every 5); the same spec for every daemon. */
static char *submit(const bertd *d, const char *name)
{
	char *spec = it_job_spec(name, "shakes", "training_args.max_steps", STEPS_S, "resources.gpus", "2",
				 "training_args.dataloader_num_workers", "1", NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

/* How often text occurs in the daemons' log (appended across restarts). */
static int log_count(const fx *f, const char *text)
{
	char p[200];
	snprintf(p, sizeof p, "%s/bertd.log", f->d.root);
	char *log = it_slurp(p, NULL);
	int n = 0;
	for (char *at = log; at && (at = strstr(at, text)); at += strlen(text))
		n++;
	free(log);
	return n;
}

/* Past step 15 (the step-10 checkpoint written), job id's two ranks are
 * held (SIGSTOP; their pids into pids), then the daemon is killed -9.
 * Its loader goes on: it only fills its ring. */
static void hold_and_kill(fx *f, const char *id, pid_t pids[2])
{
	it_wait_step(&f->d, id, 15, DEADLINE_S);
	assert_int_equal(it_find_pids(id, "bertd-worker", pids, 2), 2);
	for (int k = 0; k < 2; k++)
		assert_int_equal(kill(pids[k], SIGSTOP), 0);
	bertd_kill9(&f->d);
}

static void release(const pid_t pids[2])
{
	for (int k = 0; k < 2; k++)
		assert_int_equal(kill(pids[k], SIGCONT), 0);
}

/* The job completed on its first attempt: adopted, never resumed from a
 * checkpoint, no restart, every step once; nothing of it left running. */
static json_t *assert_adopted_completed(fx *f, const char *id)
{
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_false(it_has_event(&f->d, id, "resuming from checkpoint"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	it_assert_metrics_every(&f->d, id, STEPS, 5);
	pid_t left[8];
	for (int i = 0; i < DEADLINE_S * 10 && it_find_pids(id, NULL, left, 8) > 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids(id, NULL, left, 8), 0);
	return job;
}

static void test_older_daemon_upgraded(void **state)
{
	fx *f = *state;
	char *id = submit(&f->d, "upgraded");
	pid_t pids[2];
	hold_and_kill(f, id, pids);
	long before = it_store_user_version(&f->d);
	char want[700], exe[700], link[64];
	assert_non_null(realpath(old_bin, want));
	for (int k = 0; k < 2; k++) { /* the older commit's workers */
		snprintf(link, sizeof link, "/proc/%d/exe", (int)pids[k]);
		ssize_t n = readlink(link, exe, sizeof exe - 1);
		assert_true(n > 0);
		exe[n] = 0;
		assert_true(strncmp(exe, want, strlen(want)) == 0 && exe[strlen(want)] == '/');
	}

	assert_int_equal(start_with(f, cur_bertd, cur_args), 0);
	long after = it_store_user_version(&f->d);
	fprintf(stderr, "oldbin: the older bertd's store at schema version %ld, this one's migrated it to %ld\n",
		before, after);
	assert_true(after > before); /* this tree's migrations ran on the older store */
	json_t *j0 = it_wait_job(&f->d, id, "running", DEADLINE_S);
	json_decref(j0);
	/* the older workers and loader, all three, adopted while still running */
	assert_true(it_has_event(&f->d, id, "adopted the running attempt (3 process(es) running, 0 ended"));
	release(pids);
	json_t *job = assert_adopted_completed(f, id);
	/* they spoke the older commit's worker protocol, which this bertd adopts */
	assert_int_equal(log_count(f, "rank 0 attached (protocol 1,"), 1);
	assert_int_equal(log_count(f, "rank 1 attached (protocol 1,"), 1);

	/* the same spec undisturbed, on this tree's daemon and workers */
	char *ref = submit(&f->d, "ref");
	json_t *jref = it_wait_completed(&f->d, ref, DEADLINE_S);
	char a[65], b[65];
	it_sha_of_export(jref, a);
	it_sha_of_export(job, b);
	assert_string_equal(a, b);
	json_t *ma = it_metrics_of(&f->d, ref), *mb = it_metrics_of(&f->d, id);
	assert_int_equal(json_array_size(ma), json_array_size(mb));
	for (size_t k = 0; k < json_array_size(ma); k++)
		assert_true(json_number_value(json_object_get(json_array_get(ma, k), "loss")) ==
			    json_number_value(json_object_get(json_array_get(mb, k), "loss")));
	json_decref(ma);
	json_decref(mb);
	json_decref(jref);
	json_decref(job);
	free(ref);
	free(id);
}

static void test_older_daemon_refuses_newer_store(void **state)
{
	fx *f = *state;
	char *id = submit(&f->d, "downgraded");
	pid_t pids[2];
	hold_and_kill(f, id, pids);
	long v = it_store_user_version(&f->d);

	/* the older bertd does not start on a store it does not know */
	assert_int_equal(start_with(f, old_bertd, old_args), -ECHILD);
	char said[200];
	snprintf(said, sizeof said, "has schema version %ld but this bertd knows only up to", v);
	assert_int_equal(log_count(f, said), 1);
	assert_int_equal(it_store_user_version(&f->d), v); /* untouched */
	pid_t now[2];
	assert_int_equal(it_find_pids(id, "bertd-worker", now, 2), 2); /* left running */

	assert_int_equal(start_with(f, cur_bertd, cur_args), 0);
	json_t *j0 = it_wait_job(&f->d, id, "running", DEADLINE_S);
	json_decref(j0);
	assert_true(it_has_event(&f->d, id, "adopted the running attempt (3 process(es) running, 0 ended"));
	release(pids);
	json_t *job = assert_adopted_completed(f, id);
	json_decref(job);
	free(id);
}

int main(void)
{
	const char *script = getenv("IT_OLDBIN_SCRIPT"), *src = getenv("IT_OLDBIN_SRC"),
		   *commit = getenv("IT_OLDBIN_COMMIT"), *dir = getenv("IT_OLDBIN_DIR"), *cc = getenv("IT_OLDBIN_CC"),
		   *cur = getenv("BERTD_BIN");
	if (!script || !src || !commit || !dir || !cc || !cur) {
		fprintf(stderr, "IT_OLDBIN_SCRIPT, _SRC, _COMMIT, _DIR, _CC or BERTD_BIN is not set "
				"(tests/integration/meson.build)\n");
		return 1;
	}
	char stamp[600], bin[600];
	snprintf(stamp, sizeof stamp, "%s.stamp", dir);
	snprintf(bin, sizeof bin, "%s/bin", dir);
	unlink(stamp);
	if (it_system("CC='%s' bash '%s' '%s' '%s' '%s' '%s'", cc, script, src, commit, dir, stamp) != 0) {
		fprintf(stderr, "%s did not run\n", script);
		return 1;
	}
	char *verdict = it_slurp(stamp, NULL);
	if (!verdict) {
		fprintf(stderr, "%s: %s\n", stamp, strerror(errno));
		return 1;
	}
	fprintf(stderr, "the older commit's build: %s", verdict);
	if (strncmp(verdict, "skip:", 5) == 0) {
		free(verdict);
		return 77;
	}
	if (strncmp(verdict, "ok ", 3) != 0) {
		free(verdict);
		return 1;
	}
	free(verdict);
	snprintf(old_bin, sizeof old_bin, "%s", bin);
	snprintf(old_bertd, sizeof old_bertd, "%s/bertd", bin);
	snprintf(cur_bertd, sizeof cur_bertd, "%s", cur);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_older_daemon_upgraded, setup_old, it_teardown),
		cmocka_unit_test_setup_teardown(test_older_daemon_refuses_newer_store, setup_current, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
