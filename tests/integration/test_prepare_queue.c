/* Dataset preparations go through a queue: with prepare_concurrency 1
 * at most one bertd-prepare runs at a time, oldest dataset first; the ones
 * waiting show "queued"; DELETE cancels a queued one like a preparing one.
 * A vocab file that is a FIFO keeps the first preparation stuck until it
 * is canceled. */
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
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

static int setup_with(void **state, const char *schedule)
{
	const char *extra[] = {"--prepare-concurrency", "1", NULL};
	it_daemon_opts o = {.cpu_slots = "1", .schedule = schedule, .extra = extra};
	return it_setup(state, &o, 0);
}

static int setup(void **state)
{
	return setup_with(state, "false");
}

static int setup_scheduling(void **state)
{
	return setup_with(state, "true");
}

/* The parent of pid, or -1. */
static pid_t parent_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char *ok = fgets(buf, sizeof buf, f);
	fclose(f);
	char *rp = ok ? strrchr(buf, ')') : NULL;
	char st;
	int ppid;
	return rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2 ? (pid_t)ppid : -1;
}

/* The bertd-prepare processes of this test's data root; fails the test
 * when more than one runs. A process started by a bertd-prepare is not
 * another preparation: under AddressSanitizer the leak check at exit runs
 * in a clone of the exiting process, with its command line. */
static int prepares(const fx *f)
{
	pid_t pid[8];
	int found = it_find_pids("bertd-prepare", f->data, pid, 8), n = 0;
	for (int i = 0; i < found; i++) {
		pid_t pp = parent_of(pid[i]);
		bool child = false;
		for (int k = 0; k < found; k++)
			child |= pid[k] == pp;
		if (!child)
			pid[n++] = pid[i];
	}
	if (n > 1)
		fail_msg("%d bertd-prepare processes at once with prepare_concurrency 1", n);
	return n;
}

static const char *state_of(const fx *f, const char *name, char *buf, size_t cap)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/datasets/%s", name);
	json_t *o = it_get_json(&f->d, path);
	snprintf(buf, cap, "%s", it_jstr(o, "state"));
	json_decref(o);
	return buf;
}

static void test_prepare_queue(void **state)
{
	fx *f = *state;
	const char *e = getenv("BERTD_EXPECT_PREPARE");
	if (!e || strcmp(e, "ready") != 0)
		skip();
	char p[300], st[32];
	snprintf(p, sizeof p, "%s/corpus.txt", f->data);
	it_write_file(p, "Hello world.\nSecond sentence here.\n\nA new document starts.\nIt ends.\n");
	snprintf(p, sizeof p, "%s/vocab.fifo", f->data);
	assert_int_equal(mkfifo(p, 0600), 0);

	/* the oldest is stuck reading its FIFO vocab */
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"stuck\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.fifo\"}}"), 0);
	char outdir[300];
	snprintf(outdir, sizeof outdir, "%s/datasets/stuck", f->data);
	pid_t pid[4];
	for (int i = 0; i < 300 && it_find_pids("bertd-prepare", outdir, pid, 4) == 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids("bertd-prepare", outdir, pid, 4), 1);
	assert_string_equal(state_of(f, "stuck", st, sizeof st), "preparing");

	/* three more at once: they wait */
	const char *names[] = {"q1", "q2", "q3"};
	for (int i = 0; i < 3; i++) {
		char body[200];
		snprintf(body, sizeof body,
			 "{\"name\":\"%s\",\"source\":\"corpus.txt\",\"vocab\":{\"train\":{\"vocab_size\":200}}}",
			 names[i]);
		assert_int_equal(it_add_dataset(&f->d, body), 0);
	}
	/* several ticks pass (a tick is a second): still one process, all queued */
	for (int i = 0; i < 25; i++) {
		assert_int_equal(prepares(f), 1);
		it_pause_ms(100);
	}
	for (int i = 0; i < 3; i++) {
		assert_string_equal(state_of(f, names[i], st, sizeof st), "queued");
		char path[128];
		snprintf(path, sizeof path, "/v1/datasets/%s", names[i]);
		json_t *o = it_get_json(&f->d, path);
		assert_string_equal(it_jstr(json_object_get(o, "progress"), "phase"), "queued");
		json_decref(o);
	}
	assert_int_equal(it_find_pids("bertd-prepare", outdir, pid, 4), 1); /* still the stuck one */

	/* DELETE of a queued one cancels it like a preparing one */
	http_resp r;
	assert_int_equal(http_do(&f->d, "DELETE", "/v1/datasets/q3", NULL, 0, NULL, 1, &r), 0);
	if (r.status != 202)
		fail_msg("DELETE while queued -> %ld: %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "state"), "failed");
	assert_non_null(strstr(it_jstr(r.json, "error"), "canceled"));
	http_resp_free(&r);

	/* canceling the stuck one lets the queue move, one at a time, oldest first */
	assert_int_equal(http_do(&f->d, "DELETE", "/v1/datasets/stuck", NULL, 0, NULL, 1, &r), 0);
	if (r.status != 202)
		fail_msg("DELETE while preparing -> %ld: %s", r.status, r.body);
	http_resp_free(&r);
	bool ready1 = false, ready2 = false;
	for (int i = 0; i < 600 && !(ready1 && ready2); i++) {
		prepares(f);
		ready1 = strcmp(state_of(f, "q1", st, sizeof st), "ready") == 0;
		if (strcmp(st, "failed") == 0) {
			bertd_print_log(&f->d);
			fail_msg("q1 failed");
		}
		ready2 = strcmp(state_of(f, "q2", st, sizeof st), "ready") == 0;
		if (strcmp(st, "failed") == 0) {
			bertd_print_log(&f->d);
			fail_msg("q2 failed");
		}
		if (ready2 && !ready1)
			fail_msg("q2 ready before q1 (not oldest first)");
		it_pause_ms(100);
	}
	if (!(ready1 && ready2)) {
		bertd_print_log(&f->d);
		fail_msg("q1/q2 not ready within 60 s");
	}
	/* the canceled queued one never started */
	assert_string_equal(state_of(f, "q3", st, sizeof st), "failed");
	snprintf(p, sizeof p, "%s/datasets/q3", f->data);
	assert_int_equal(access(p, F_OK), -1);
	assert_int_equal(prepares(f), 0);
}

/* A job whose dataset is still being prepared waits in the queue (it once
 * failed at once with "not ready"); when the preparation fails, so does the
 * job, naming the dataset. */
static void test_job_waits_for_its_dataset(void **state)
{
	fx *f = *state;
	const char *e = getenv("BERTD_EXPECT_PREPARE");
	if (!e || strcmp(e, "ready") != 0)
		skip();
	char p[300];
	snprintf(p, sizeof p, "%s/corpus.txt", f->data);
	it_write_file(p, "Hello world.\nSecond sentence here.\n\nA new document starts.\nIt ends.\n");
	snprintf(p, sizeof p, "%s/vocab.fifo", f->data);
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"stuck\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.fifo\"}}"), 0);
	char *spec = it_job_spec(NULL, "stuck", "model", "{\"preset\":\"bert-tiny\"}", "training_args",
				 "{\"max_steps\":2}", "resources", "null", NULL);
	char *id = it_submit(&f->d, spec);
	free(spec);
	/* several scheduler ticks (a tick is a second): the job stays queued */
	for (int i = 0; i < 25; i++) {
		char path[128];
		snprintf(path, sizeof path, "/v1/jobs/%s", id);
		json_t *j = it_get_json(&f->d, path);
		if (strcmp(it_jstr(j, "state"), "queued") != 0)
			fail_msg("job %s is %s (%s) while its dataset prepares", id, it_jstr(j, "state"),
				 it_jstr(j, "failure_reason"));
		json_decref(j);
		it_pause_ms(100);
	}
	/* the preparation dies (DELETE is refused while a job names it): a
	 * bertd-prepare killed from outside is started again 3 times, so the
	 * fourth kill fails the dataset */
	char outdir[300];
	snprintf(outdir, sizeof outdir, "%s/datasets/stuck", f->data);
	pid_t pid, last = 0;
	for (int k = 0; k < 4; k++) {
		int i = 0;
		while ((it_find_pids("bertd-prepare", outdir, &pid, 1) != 1 || pid == last) && i++ < 600)
			it_pause_ms(100);
		if (i > 600)
			fail_msg("no bertd-prepare after kill %d", k);
		assert_int_equal(kill(pid, SIGKILL), 0);
		last = pid;
	}
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", 60);
	assert_string_equal(it_jstr(j, "state"), "failed");
	assert_non_null(strstr(it_jstr(j, "failure_reason"), "dataset \"stuck\""));
	json_decref(j);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_prepare_queue, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_job_waits_for_its_dataset, setup_scheduling, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
