/* sched_bench — times the scheduler's decision over a long queue: one
 * sched_decide call (EASY backfill, NVLink placement on the p3.16xlarge's
 * matrix) and a whole pass (decide, start, decide again until nothing
 * starts) over 10,000 queued jobs, beside strict priority (sched_pick) on
 * the same queue as the reference. Only the scheduler: the supervisor's
 * reading of the queue from the store is not in it. Never writes files.
 *
 * Usage: bench_sched [N_JOBS [REPEATS]]   (10000, 200)
 * Prints a table, then one line: BENCH_SCHED n=... key=value ...
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/scheduler.h"

#define NDEV 8

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* `nvidia-smi topo -m` text: a pair whose cell is NV# is linked. */
static int topo_load(const char *path, uint64_t *peers)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char line[512];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		int row;
		if (sscanf(line, "GPU%d", &row) != 1 || row < 0 || row >= NDEV)
			continue;
		peers[row] = 0;
		char *save = NULL;
		strtok_r(line, "\t\n", &save);
		for (int col = 0; col < NDEV; col++) {
			char *cell = strtok_r(NULL, "\t\n", &save);
			if (!cell)
				break;
			if (strncmp(cell, "NV", 2) == 0)
				peers[row] |= (uint64_t)1 << col;
		}
		n = row + 1 > n ? row + 1 : n;
	}
	fclose(f);
	return n;
}

typedef struct stats {
	double median, p99, max;
} stats;

static stats summarize(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return (stats){v[n / 2], v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1], v[n - 1]};
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10000;
	int reps = argc > 2 ? atoi(argv[2]) : 200;
	if (n < 1 || reps < 1) {
		fprintf(stderr, "usage: bench_sched [N_JOBS [REPEATS]]\n");
		return 2;
	}
	uint64_t peers[NDEV];
	if (topo_load(BENCH_TOPO, peers) != NDEV) {
		fprintf(stderr, "bench_sched: cannot read the 8-GPU matrix %s\n", BENCH_TOPO);
		return 1;
	}
	sched_job *q = calloc((size_t)n, sizeof *q);
	int64_t *lim = calloc((size_t)n, sizeof *lim); /* (n,) run-time bounds, ms */
	char (*ids)[16] = calloc((size_t)n, sizeof *ids);
	double *t = calloc((size_t)reps, sizeof *t);
	if (!q || !lim || !ids || !t)
		return 1;
	/* a team's queue: mostly 1- and 2-GPU jobs, some 4 and 8, three
	 * priorities, three quarters with a run-time bound (10 min .. 3 h) */
	uint64_t seed = 42;
	const int sizes[] = {1, 1, 1, 2, 2, 4, 8};
	for (int i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		snprintf(ids[i], sizeof ids[i], "j%d", i);
		q[i] = (sched_job){ids[i], (int)((seed >> 40) % 3), i, sizes[(seed >> 33) % 7]};
		lim[i] = (seed >> 50) % 4 ? (int64_t)(600 + (seed >> 20) % 10200) * 1000 : 0;
	}
	/* The worst case for one decision: the head (an 8-GPU job, top
	 * priority) waits for a 4-GPU run on {0,1,2,3} that ends in 20 min, so
	 * every other job is examined for backfill onto {4..7}. */
	q[n / 2] = (sched_job){ids[n / 2], 9, 0, 8};
	lim[n / 2] = 0;
	bool busy[NDEV] = {true, true, true, true, false, false, false, false};
	sched_running rs[] = {{0x0f, 1200000}};
	sched_machine m = {.ndev = NDEV, .busy = busy, .peers = peers, .running = rs, .nrunning = 1, .now_ms = 0};
	sched_decision d;
	int starts = 0;
	for (int r = 0; r < reps; r++) {
		double t0 = now_us();
		sched_decide(q, lim, (size_t)n, &m, &d);
		t[r] = now_us() - t0;
	}
	stats backfill = summarize(t, reps);
	const char *bf_id = d.verdict == SCHED_START ? q[d.job_idx].id : "-";
	bool bf = d.backfill;
	/* the reference: strict priority's decision on the same queue */
	size_t k;
	int dev[NDEV];
	for (int r = 0; r < reps; r++) {
		double t0 = now_us();
		sched_pick(q, (size_t)n, busy, NDEV, &k, dev);
		t[r] = now_us() - t0;
	}
	stats strict = summarize(t, reps);
	/* A pass as the supervisor's tick makes it: decide, mark the devices
	 * taken, decide again, until nothing starts; each repeat from the same
	 * machine state (started jobs leave the queue copy). */
	sched_job *qq = calloc((size_t)n, sizeof *qq);
	int64_t *ll = calloc((size_t)n, sizeof *ll);
	if (!qq || !ll)
		return 1;
	for (int r = 0; r < reps; r++) {
		memcpy(qq, q, (size_t)n * sizeof *qq);
		memcpy(ll, lim, (size_t)n * sizeof *ll);
		size_t nq = (size_t)n;
		bool b[NDEV];
		memcpy(b, busy, sizeof b);
		sched_running rr[NDEV + 1] = {{0x0f, 1200000}};
		sched_machine mm = {.ndev = NDEV, .busy = b, .peers = peers, .running = rr, .nrunning = 1, .now_ms = 0};
		starts = 0;
		double t0 = now_us();
		for (;;) {
			sched_decide(qq, ll, nq, &mm, &d);
			if (d.verdict != SCHED_START)
				break;
			uint64_t devs = 0;
			for (int i = 0; i < d.ndev; i++) {
				b[d.dev[i]] = true;
				devs |= (uint64_t)1 << d.dev[i];
			}
			rr[mm.nrunning++] = (sched_running){devs, ll[d.job_idx] ? ll[d.job_idx] : SCHED_NEVER};
			qq[d.job_idx] = qq[--nq];
			ll[d.job_idx] = ll[nq];
			starts++;
		}
		t[r] = now_us() - t0;
	}
	stats pass = summarize(t, reps);
	printf("scheduler over %d queued jobs, 8 GPUs (p3.16xlarge NVLink matrix), %d repeats, microseconds\n", n, reps);
	printf("%-40s %10s %10s %10s\n", "", "median", "p99", "max");
	printf("%-40s %10.1f %10.1f %10.1f\n", "sched_decide, head waits (backfill scan)", backfill.median, backfill.p99,
	       backfill.max);
	printf("%-40s %10.1f %10.1f %10.1f\n", "pass: decide until none starts", pass.median, pass.p99, pass.max);
	printf("%-40s %10.1f %10.1f %10.1f\n", "reference: sched_pick (strict, no backfill)", strict.median, strict.p99,
	       strict.max);
	printf("decision: %s (backfill %s); the pass started %d job(s)\n", bf_id, bf ? "yes" : "no", starts);
	printf("BENCH_SCHED n=%d decide_median_us=%.1f decide_max_us=%.1f pass_median_us=%.1f pass_max_us=%.1f "
	       "pass_starts=%d strict_median_us=%.1f\n",
	       n, backfill.median, backfill.max, pass.median, pass.max, starts, strict.median);
	free(qq);
	free(ll);
	free(q);
	free(lim);
	free(ids);
	free(t);
	return 0;
}
