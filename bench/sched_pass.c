/* sched_pass — times one scheduler pass over a queue of jobs, as the
 * supervisor's tick_schedule (daemon/supervisor.c) makes it at every tick:
 * the queued and restarting rows read from the store (at most `limit` of
 * them; the supervisor reads 1000), resources.gpus read from each stored
 * spec, then sched_pick over them (the tick now calls sched_decide, whose
 * cost bench_sched measures: this bench is for the rows and spec parses). All 8 devices are busy (a full 8-GPU
 * server with a sweep waiting): nothing can start, so a pass is one pick,
 * the state a queued sweep spends its time in. It replicates the per-job
 * work of tick_schedule (not the dataset check, one lookup per distinct
 * dataset name); it must never write the database.
 * Usage: sched_pass DB_PATH PASSES LIMIT...   (DB_PATH: api_seed --queued's)
 * Prints a table, then per limit one line:
 *   "BENCH sched_pass limit=... rows=... ms_per_pass=... ms_store=... ms_specs=... ms_pick=..." */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/scheduler.h"
#include "daemon/store.h"

#define NDEV 8

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One pass; adds its phases' times (ms) to t[0..3) and returns the rows read, or -1. */
static long one_pass(store *st, int limit, double t[3])
{
	store_job *jobs = NULL;
	size_t n = 0;
	int64_t next = 0;
	double t0 = now_ms();
	if (store_job_list(st, JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_RESTARTING), 0, limit, &jobs, &n, &next) < 0)
		return -1;
	double t1 = now_ms();
	sched_job *q = calloc(n ? n : 1, sizeof *q);
	size_t nq = 0;
	if (!q) {
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
		json_decref(js);
		if (!multinode) /* Slurm places those, not this machine's devices */
			q[nq++] = (sched_job){jobs[i].id, jobs[i].priority, jobs[i].seq, want};
	}
	double t2 = now_ms();
	bool busy[NDEV];
	int dev[NDEV];
	for (int d = 0; d < NDEV; d++)
		busy[d] = true;
	size_t pick = 0;
	enum sched_verdict v = sched_pick(q, nq, busy, NDEV, &pick, dev);
	double t3 = now_ms();
	if (v == SCHED_START) /* the devices are all busy: nothing can start */
		fprintf(stderr, "sched_pass: unexpected start\n");
	t[0] += t1 - t0;
	t[1] += t2 - t1;
	t[2] += t3 - t2;
	free(q);
	store_jobs_free(jobs, n);
	return (long)n;
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
	store *st = NULL;
	int rc = store_open(&st, argv[1]);
	if (rc < 0) {
		fprintf(stderr, "sched_pass: cannot open %s (%d)\n", argv[1], rc);
		return 1;
	}
	printf("%-8s %8s %12s %10s %10s %10s\n", "limit", "rows", "ms/pass", "store", "specs", "pick");
	char lines[16][200];
	int nl = 0;
	for (int a = 3; a < argc && nl < 16; a++) {
		int limit = atoi(argv[a]);
		double t[3] = {0, 0, 0};
		long rows = 0;
		one_pass(st, limit, t); /* warm the page cache and the statement */
		t[0] = t[1] = t[2] = 0;
		for (int p = 0; p < passes; p++)
			if ((rows = one_pass(st, limit, t)) < 0) {
				fprintf(stderr, "sched_pass: store read failed\n");
				store_close(st);
				return 1;
			}
		double tot = (t[0] + t[1] + t[2]) / passes;
		printf("%-8d %8ld %12.3f %10.3f %10.3f %10.3f\n", limit, rows, tot, t[0] / passes, t[1] / passes,
		       t[2] / passes);
		snprintf(lines[nl++], sizeof lines[0],
			 "BENCH sched_pass limit=%d rows=%ld ms_per_pass=%.3f ms_store=%.3f ms_specs=%.3f ms_pick=%.3f",
			 limit, rows, tot, t[0] / passes, t[1] / passes, t[2] / passes);
	}
	for (int i = 0; i < nl; i++)
		puts(lines[i]);
	store_close(st);
	return 0;
}
