/* sched_pass — times the supervisor's scheduling pass over a queued sweep
 * (daemon/supervisor.c tick_schedule), as it was and as it is, side by side
 * in one run on the same database:
 *   before   the queued and restarting rows read from the store (at most
 *            LIMIT; the tick read 1,000), every stored spec parsed for
 *            resources.gpus / nodes / max_runtime_seconds, sched_decide;
 *   after    jobqueue_refresh (only rows changed since the last pass are
 *            read and parsed: none here), the queue's datasets looked up
 *            once each, sched_decide over the whole queue;
 *   after+1  the same with one job's priority changed before each pass (a
 *            PATCH; the write is not timed, its row's re-read is);
 *   cold     the first refreshes: the whole queue read in one snapshot and
 *            parsed JOBQUEUE_SLICE specs a refresh (the tick decides
 *            nothing until it is whole): the longest refresh and the sum.
 * The decision is the backfill case: on 8 devices, 4 are held by a run
 * estimated to end in 20 minutes, and one more job is added at the top
 * priority asking for all 8: it waits with a reservation of every device,
 * and every other queued job (1 device, no run-time bound) is examined for
 * backfill and refused, so nothing starts and each pass is a full scan.
 * Works on a copy of DB_PATH (store_backup, beside it); DB_PATH itself is
 * never written.
 * Usage: sched_pass DB_PATH PASSES LIMIT...   (DB_PATH: api_seed --queued's)
 * Prints a table, then one line per case:
 *   "BENCH sched_pass case=... queue=... rows=... ms_per_pass=... ms_read=... ms_parse=...
 *    ms_decide=... starts=S/PASSES" */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/jobqueue.h"
#include "daemon/scheduler.h"
#include "daemon/store.h"

#define NDEV 8
#define HEAD_ID "job-ffffffffffffffff"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The machine of every pass: devices 0-3 held until 20 minutes from now. */
static bool busy[NDEV] = {true, true, true, true, false, false, false, false};
static const sched_running held = {.devs = 0xf, .end_ms = 1000 + 20 * 60 * 1000};
static const sched_machine machine = {.ndev = NDEV, .busy = busy, .running = &held, .nrunning = 1,
				      .now_ms = 1000};

/* Passes that started a job: with the whole queue, none (the head waits
 * and nothing may jump it); a pass that does not see the head starts one. */
static int starts;

static void check(const sched_decision *d)
{
	starts += d->verdict != SCHED_NONE;
}

/* One pass as the tick made it before; adds read, parse and decide times
 * (ms) to t and returns the rows read, or -1. */
static long pass_before(store *st, int limit, double t[3])
{
	store_job *jobs = NULL;
	size_t n = 0;
	int64_t next = 0;
	double t0 = now_ms();
	if (store_job_list(st, JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_RESTARTING), 0, limit, &jobs, &n, &next) < 0)
		return -1;
	double t1 = now_ms();
	sched_job *q = calloc(n ? n : 1, sizeof *q);
	int64_t *limits = calloc(n ? n : 1, sizeof *limits);
	size_t nq = 0;
	if (!q || !limits) {
		free(q);
		free(limits);
		store_jobs_free(jobs, n);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *js = json_loads(jobs[i].spec_json, 0, NULL);
		json_t *g = json_object_get(json_object_get(js, "resources"), "gpus");
		int want = json_is_integer(g) && json_integer_value(g) >= 1 && json_integer_value(g) <= 64
				   ? (int)json_integer_value(g) : 1;
		json_t *nodes = json_object_get(json_object_get(js, "resources"), "nodes");
		bool multinode = json_is_integer(nodes) && json_integer_value(nodes) > 1;
		json_t *mr = json_object_get(json_object_get(js, "stopping_condition"), "max_runtime_seconds");
		int64_t limit_ms = json_is_integer(mr) && json_integer_value(mr) > 0 ? json_integer_value(mr) * 1000 : 0;
		json_decref(js);
		if (multinode)
			continue;
		limits[nq] = limit_ms;
		q[nq++] = (sched_job){jobs[i].id, jobs[i].priority, jobs[i].seq, want};
	}
	double t2 = now_ms();
	sched_decision dec;
	sched_decide(q, limits, nq, &machine, &dec);
	double t3 = now_ms();
	check(&dec);
	t[0] += t1 - t0;
	t[1] += t2 - t1;
	t[2] += t3 - t2;
	free(q);
	free(limits);
	store_jobs_free(jobs, n);
	return (long)n;
}

/* One pass as the tick makes it now (jobqueue); times into t as above
 * (read+parse are the refresh, decide includes building the arrays and the
 * datasets' lookups). Returns the rows the refresh read, or -1. */
static long pass_after(store *st, jobqueue *jq, double t[3], size_t *nqueue)
{
	size_t nread = 0, n = 0;
	double t0 = now_ms();
	if (jobqueue_refresh(jq, st, &nread) < 0)
		return -1;
	double t1 = now_ms();
	const jobqueue_entry *e = jobqueue_entries(jq, &n);
	sched_job *q = calloc(n ? n : 1, sizeof *q);
	int64_t *limits = calloc(n ? n : 1, sizeof *limits);
	if (!q || !limits) {
		free(q);
		free(limits);
		return -1;
	}
	for (int i = 0; i < jobqueue_ndatasets(jq); i++) { /* the tick asks once per name */
		store_dataset ds;
		if (store_dataset_get_by_name(st, jobqueue_dataset(jq, i), &ds) == 0)
			store_dataset_free(&ds);
	}
	size_t nq = 0;
	for (size_t i = 0; i < n; i++) {
		if (e[i].multinode)
			continue;
		limits[nq] = jobqueue_limit_ms(&e[i]);
		q[nq++] = (sched_job){e[i].id, e[i].priority, e[i].seq, e[i].want};
	}
	sched_decision dec;
	sched_decide(q, limits, nq, &machine, &dec);
	double t2 = now_ms();
	check(&dec);
	t[0] += t1 - t0;
	t[2] += t2 - t1;
	free(q);
	free(limits);
	*nqueue = n;
	return (long)nread;
}

typedef struct result {
	char name[32];
	long rows;
	int starts;
	double t[3];
	int passes;
} result;

static void report(result *r)
{
	double tot = (r->t[0] + r->t[1] + r->t[2]) / r->passes;
	printf("%-14s %8ld %12.3f %10.3f %10.3f %10.3f %8d\n", r->name, r->rows, tot, r->t[0] / r->passes,
	       r->t[1] / r->passes, r->t[2] / r->passes, r->starts);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: sched_pass DB_PATH PASSES LIMIT...\n");
		return 2;
	}
	int passes = atoi(argv[2]);
	if (passes < 1) {
		fprintf(stderr, "sched_pass: PASSES must be >= 1\n");
		return 2;
	}
	char copy[4200], why[300];
	snprintf(copy, sizeof copy, "%s.sched_pass-%d", argv[1], (int)getpid());
	if (store_backup(argv[1], copy, why, sizeof why) < 0) {
		fprintf(stderr, "sched_pass: cannot copy %s: %s\n", argv[1], why);
		return 1;
	}
	store *st = NULL;
	jobqueue *jq = NULL;
	result res[20];
	int nres = 0, rc = 1;
	if (store_open(&st, copy) < 0 || jobqueue_create(&jq) < 0) {
		fprintf(stderr, "sched_pass: cannot open %s\n", copy);
		goto out;
	}
	/* the head: top priority, every device */
	store_job head = {.id = (char *)HEAD_ID, .name = (char *)"head", .priority = 100, .owner = (char *)"bench",
			  .spec_json = (char *)"{\"dataset\":\"pubmed\",\"resources\":{\"gpus\":8}}"};
	if (store_job_insert(st, &head, NULL, NULL, NULL, NULL, NULL, NULL) < 0) {
		fprintf(stderr, "sched_pass: cannot add the head job\n");
		goto out;
	}
	printf("%-14s %8s %12s %10s %10s %10s %8s\n", "case", "rows", "ms/pass", "read", "parse", "decide",
	       "starts");
	for (int a = 3; a < argc && nres < 16; a++) {
		result *r = &res[nres++];
		*r = (result){.passes = passes};
		snprintf(r->name, sizeof r->name, "before-%d", atoi(argv[a]));
		double warm[3] = {0, 0, 0};
		pass_before(st, atoi(argv[a]), warm); /* the page cache and the statement */
		starts = 0;
		for (int p = 0; p < passes; p++)
			if ((r->rows = pass_before(st, atoi(argv[a]), r->t)) < 0)
				goto out;
		r->starts = starts;
		report(r);
	}
	/* cold: the whole queue read once and parsed a slice per refresh (the
	 * tick decides nothing meanwhile) */
	int cold_calls = 0;
	double cold_total = 0, cold_longest = 0;
	do {
		double t0 = now_ms();
		if (jobqueue_refresh(jq, st, NULL) < 0)
			goto out;
		double d = now_ms() - t0;
		cold_total += d;
		cold_longest = d > cold_longest ? d : cold_longest;
		cold_calls++;
	} while (jobqueue_loading(jq));
	size_t nqueue = 0;
	jobqueue_entries(jq, &nqueue);
	printf("%-14s %8zu %12.3f   (longest of %d refreshes; %.3f ms in all)\n", "cold", nqueue, cold_longest,
	       cold_calls, cold_total);
	result *after = &res[nres++];
	*after = (result){.name = "after", .passes = passes};
	starts = 0;
	for (int p = 0; p < passes; p++)
		if ((after->rows = pass_after(st, jq, after->t, &nqueue)) < 0)
			goto out;
	after->starts = starts;
	report(after);
	result *one = &res[nres++];
	*one = (result){.name = "after+1", .passes = passes};
	size_t n;
	starts = 0;
	for (int p = 0; p < passes; p++) {
		const jobqueue_entry *e = jobqueue_entries(jq, &n);
		store_job_change c = {.set_priority = true, .priority = p % 7};
		char *changed = NULL;
		store_job_change_apply(st, e[(size_t)(p * 7919) % n].id, &c, &changed, NULL);
		free(changed);
		if ((one->rows = pass_after(st, jq, one->t, &nqueue)) < 0)
			goto out;
	}
	one->starts = starts;
	report(one);
	printf("(queue: %zu jobs; rows: read by the pass; starts: passes that started a job, where the head\n"
	       " waits and nothing may: a pass that does not see the head starts one)\n", nqueue);
	printf("BENCH sched_pass case=cold queue=%zu refreshes=%d ms_longest=%.3f ms_total=%.3f\n", nqueue, cold_calls,
	       cold_longest, cold_total);
	for (int i = 0; i < nres; i++) {
		result *r = &res[i];
		printf("BENCH sched_pass case=%s queue=%zu rows=%ld ms_per_pass=%.3f ms_read=%.3f ms_parse=%.3f "
		       "ms_decide=%.3f starts=%d/%d\n", r->name, nqueue, r->rows,
		       (r->t[0] + r->t[1] + r->t[2]) / r->passes, r->t[0] / r->passes, r->t[1] / r->passes,
		       r->t[2] / r->passes, r->starts, r->passes);
	}
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "sched_pass: a pass failed\n");
	jobqueue_destroy(jq);
	store_close(st);
	static const char *const suffix[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		char p[4300];
		snprintf(p, sizeof p, "%s%s", copy, suffix[i]);
		unlink(p);
	}
	return rc;
}
