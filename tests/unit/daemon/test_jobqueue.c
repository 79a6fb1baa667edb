/* jobqueue: the scheduler's view of the queue over a real SQLite file — the
 * whole queue however long (no cap: the 10,001st job is decided on like the
 * first), parsed in slices when read whole, only changed rows read again (a
 * pass over an unchanged queue reads none), and every change that matters reaching it: a submission, a
 * priority change, a cancel, a start, a requeue, the runtime of a
 * restarting job, and rows changed or deleted by another process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/jobqueue.h"
#include "daemon/scheduler.h"
#include "daemon/store.h"

typedef struct fixture {
	char dir[256];
	char path[300];
	store *s;
	jobqueue *q;
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof *f);
	const char *tmp = getenv("TMPDIR");
	snprintf(f->dir, sizeof f->dir, "%s/bertd-jobqueue-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->path, sizeof f->path, "%s/bertd.db", f->dir);
	if (store_open(&f->s, f->path) != 0 || jobqueue_create(&f->q) != 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;
	char p[320];
	jobqueue_destroy(f->q);
	store_close(f->s);
	static const char *const suffix[] = {"", "-wal", "-shm"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s", f->path, suffix[i]);
		unlink(p);
	}
	rmdir(f->dir);
	free(f);
	return 0;
}

static void job_id(char *buf, size_t cap, int i)
{
	snprintf(buf, cap, "job-%016x", i);
}

/* n queued jobs, ids job-<first..>, in one group commit. */
static void add_jobs(store *s, int first, int n, int priority, const char *spec)
{
	store_job *jobs = calloc((size_t)n, sizeof *jobs);
	store_insert *ins = calloc((size_t)n, sizeof *ins);
	char (*ids)[32] = calloc((size_t)n, sizeof *ids);
	for (int i = 0; i < n; i++) {
		job_id(ids[i], sizeof ids[i], first + i);
		jobs[i] = (store_job){.id = ids[i], .name = (char *)"sweep", .spec_json = (char *)spec,
				      .priority = priority, .owner = (char *)"default"};
		ins[i].job = &jobs[i];
	}
	assert_int_equal(store_job_insert_group(s, ins, (size_t)n), 0);
	for (int i = 0; i < n; i++)
		assert_int_equal(ins[i].rc, 0);
	free(ids);
	free(ins);
	free(jobs);
}

static const jobqueue_entry *entry(fixture *f, int i)
{
	char id[32];
	job_id(id, sizeof id, i);
	long k = jobqueue_find(f->q, id);
	if (k < 0)
		return NULL;
	size_t n;
	return &jobqueue_entries(f->q, &n)[k];
}

static size_t refresh(fixture *f)
{
	size_t nread = 0;
	assert_int_equal(jobqueue_refresh(f->q, f->s, &nread), 0);
	return nread;
}

static void raw_exec(const char *path, const char *sql)
{
	sqlite3 *db = NULL;
	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	char *err = NULL;
	if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
		fail_msg("%s: %s", sql, err);
	sqlite3_close(db);
}

#define SPEC_1 "{\"dataset\":\"wiki\",\"resources\":{\"gpus\":1}}"

/* 10,000 queued jobs, then one more of higher priority asking for 2
 * devices with a run-time bound: all 10,001 are in the view, in seq order,
 * and the scheduler starts the last one first. */
static void test_whole_queue(void **state)
{
	fixture *f = *state;
	add_jobs(f->s, 1, 10000, 0, SPEC_1);
	add_jobs(f->s, 10001, 1, 9,
		 "{\"dataset\":[{\"name\":\"wiki\",\"proportion\":0.5},{\"name\":\"books\",\"proportion\":0.5}],"
		 "\"resources\":{\"gpus\":2},\"stopping_condition\":{\"max_runtime_seconds\":60}}");
	/* read in one go, parsed a slice per refresh: nothing to decide on
	 * until the whole queue is parsed */
	assert_int_equal(refresh(f), 10001);
	size_t n;
	int calls = 1;
	while (jobqueue_loading(f->q)) {
		jobqueue_entries(f->q, &n);
		assert_int_equal(n, (size_t)calls * JOBQUEUE_SLICE);
		assert_int_equal(refresh(f), 0);
		calls++;
	}
	assert_int_equal(calls, (10001 + JOBQUEUE_SLICE - 1) / JOBQUEUE_SLICE);
	const jobqueue_entry *e = jobqueue_entries(f->q, &n);
	assert_int_equal(n, 10001);
	for (size_t i = 1; i < n; i++)
		assert_true(e[i - 1].seq < e[i].seq);
	const jobqueue_entry *last = entry(f, 10001);
	assert_non_null(last);
	assert_int_equal(last->want, 2);
	assert_int_equal(last->priority, 9);
	assert_int_equal(jobqueue_limit_ms(last), 60000);
	assert_int_equal(last->ndatasets, 2);
	assert_string_equal(jobqueue_dataset(f->q, last->datasets[0]), "wiki");
	assert_string_equal(jobqueue_dataset(f->q, last->datasets[1]), "books");
	assert_int_equal(entry(f, 1)->want, 1);
	assert_int_equal(jobqueue_limit_ms(entry(f, 1)), 0);

	sched_job *q = calloc(n, sizeof *q);
	for (size_t i = 0; i < n; i++)
		q[i] = (sched_job){e[i].id, e[i].priority, e[i].seq, e[i].want};
	bool busy[8] = {false};
	sched_machine m = {.ndev = 8, .busy = busy, .now_ms = 1000};
	sched_decision dec;
	sched_decide(q, NULL, n, &m, &dec);
	assert_int_equal(dec.verdict, SCHED_START);
	assert_string_equal(q[dec.job_idx].id, "job-0000000000002711"); /* 10001 */
	free(q);

	/* nothing changed: the next pass reads no row */
	assert_int_equal(refresh(f), 0);
	assert_int_equal(jobqueue_entries(f->q, &n)[0].seq, e[0].seq);
}

/* Each change of a queued job reaches the view, reading only its row. */
static void test_changes(void **state)
{
	fixture *f = *state;
	add_jobs(f->s, 1, 5, 0, SPEC_1);
	assert_int_equal(refresh(f), 5);
	char id[32];

	/* PATCH priority */
	job_id(id, sizeof id, 3);
	store_job_change c = {.set_priority = true, .priority = 7};
	char *changed = NULL;
	assert_int_equal(store_job_change_apply(f->s, id, &c, &changed, NULL), 0);
	free(changed);
	assert_int_equal(refresh(f), 1);
	assert_int_equal(entry(f, 3)->priority, 7);

	/* a submission */
	add_jobs(f->s, 6, 1, 0, "{\"dataset\":\"wiki\",\"resources\":{\"gpus\":4,\"nodes\":2}}");
	assert_int_equal(refresh(f), 1);
	assert_int_equal(entry(f, 6)->want, 4);
	assert_true(entry(f, 6)->multinode);

	/* a cancel and a start leave the queue */
	job_id(id, sizeof id, 2);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_CANCELED, "x", NULL), 0);
	job_id(id, sizeof id, 4);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_STARTING, "x", NULL), 0);
	assert_int_equal(refresh(f), 2);
	assert_null(entry(f, 2));
	assert_null(entry(f, 4));
	size_t n;
	jobqueue_entries(f->q, &n);
	assert_int_equal(n, 4);

	/* running jobs' writes are not the queue's */
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_STARTING), JOB_RUNNING, "x", NULL), 0);
	assert_int_equal(refresh(f), 0);
	assert_int_equal(store_job_set_runtime(f->s, id, 5000), 0);
	assert_int_equal(store_job_set_devices(f->s, id, "[0]"), 0);
	assert_int_equal(refresh(f), 0);

	/* a requeue comes back, in seq order, with the runtime it used */
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_RUNNING), JOB_RESTARTING, "x", NULL), 0);
	assert_int_equal(refresh(f), 1);
	const jobqueue_entry *e = jobqueue_entries(f->q, &n);
	assert_int_equal(n, 5);
	for (size_t i = 1; i < n; i++)
		assert_true(e[i - 1].seq < e[i].seq);
	assert_int_equal(entry(f, 4)->state, JOB_RESTARTING);
	assert_int_equal(entry(f, 4)->runtime_ms, 5000);
	assert_int_equal(store_job_set_runtime(f->s, id, 6000), 0);
	assert_int_equal(refresh(f), 1);
	assert_int_equal(entry(f, 4)->runtime_ms, 6000);
}

/* Another process's writes: an update is read as a change, a deleted
 * queued row makes the next refresh read the whole queue. */
static void test_other_process(void **state)
{
	fixture *f = *state;
	add_jobs(f->s, 1, 3, 0, SPEC_1);
	assert_int_equal(refresh(f), 3);
	raw_exec(f->path, "UPDATE jobs SET priority = 4 WHERE id = 'job-0000000000000001'");
	assert_int_equal(refresh(f), 1);
	assert_int_equal(entry(f, 1)->priority, 4);
	raw_exec(f->path, "DELETE FROM jobs WHERE id = 'job-0000000000000002'");
	assert_int_equal(refresh(f), 2); /* the whole queue again */
	assert_null(entry(f, 2));
	assert_non_null(entry(f, 1));
	assert_non_null(entry(f, 3));
	assert_int_equal(refresh(f), 0);
}

/* A change written while the whole queue is parsed in slices is read by
 * the first refresh after it: the slices are of one snapshot, the changes
 * after it come as changes. */
static void test_change_while_loading(void **state)
{
	fixture *f = *state;
	add_jobs(f->s, 1, JOBQUEUE_SLICE + 10, 0, SPEC_1);
	assert_int_equal(refresh(f), JOBQUEUE_SLICE + 10);
	assert_true(jobqueue_loading(f->q));
	char id[32];
	job_id(id, sizeof id, JOBQUEUE_SLICE + 5); /* not parsed yet */
	store_job_change c = {.set_priority = true, .priority = 3};
	char *changed = NULL;
	assert_int_equal(store_job_change_apply(f->s, id, &c, &changed, NULL), 0);
	free(changed);
	job_id(id, sizeof id, 1); /* parsed already */
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_CANCELED, "x", NULL), 0);
	assert_int_equal(refresh(f), 0);
	assert_false(jobqueue_loading(f->q));
	assert_int_equal(entry(f, JOBQUEUE_SLICE + 5)->priority, 0); /* the snapshot's */
	assert_non_null(entry(f, 1));
	assert_int_equal(refresh(f), 2);
	assert_int_equal(entry(f, JOBQUEUE_SLICE + 5)->priority, 3);
	assert_null(entry(f, 1));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_whole_queue, setup, teardown),
		cmocka_unit_test_setup_teardown(test_changes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_other_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_change_while_loading, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
