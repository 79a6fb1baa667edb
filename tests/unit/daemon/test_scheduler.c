/* Scheduler policy: priority then submission order, head-of-line waits,
 * impossible requests reported, lowest free devices chosen; EASY backfill
 * (only what cannot delay the head's reservation, checked case by case and
 * in scripted simulations against strict priority); placement on the
 * p3.16xlarge's NVLink matrix (tests/fixtures/topo/p3.16xlarge.txt, as
 * nvidia-smi topo -m prints it); preemption (the fewest victims of lower
 * priority that are preemptible, only when the head then starts, never of
 * equal priority, held victims wait for their preemptor). And CPU-slot
 * discovery; the executable
 * that runs against the stand-in NVML (fake_nvml.c, FAKE_NVML_TOPO) also
 * checks that discovery reads the NVLink pairs. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/devices.h"
#include "daemon/scheduler.h"

static void test_priority_then_fifo(void **state)
{
	(void)state;
	sched_job q[] = {
		{"a", 0, 3, 1}, {"b", 5, 9, 1}, {"c", 5, 4, 1}, {"d", -1, 1, 1},
	};
	bool busy[4] = {false, false, false, false};
	size_t j;
	int dev[4];
	assert_int_equal(sched_pick(q, 4, busy, 4, &j, dev), SCHED_START);
	assert_string_equal(q[j].id, "c"); /* highest priority, earlier of b/c */
	assert_int_equal(dev[0], 0);
}

static void test_head_waits_no_backfill(void **state)
{
	(void)state;
	sched_job q[] = {{"big", 0, 1, 2}, {"small", 0, 2, 1}};
	bool busy[2] = {true, false};
	size_t j = 99;
	int dev[2];
	assert_int_equal(sched_pick(q, 2, busy, 2, &j, dev), SCHED_NONE);
	busy[0] = false;
	assert_int_equal(sched_pick(q, 2, busy, 2, &j, dev), SCHED_START);
	assert_string_equal(q[j].id, "big");
	assert_int_equal(dev[0], 0);
	assert_int_equal(dev[1], 1);
}

static void test_lowest_free_devices(void **state)
{
	(void)state;
	sched_job q[] = {{"x", 0, 1, 2}};
	bool busy[4] = {true, false, true, false};
	size_t j;
	int dev[4];
	assert_int_equal(sched_pick(q, 1, busy, 4, &j, dev), SCHED_START);
	assert_int_equal(dev[0], 1);
	assert_int_equal(dev[1], 3);
}

static void test_impossible(void **state)
{
	(void)state;
	sched_job q[] = {{"ok", 9, 1, 1}, {"huge", 0, 2, 8}};
	bool busy[2] = {false, false};
	size_t j;
	int dev[2];
	assert_int_equal(sched_pick(q, 2, busy, 2, &j, dev), SCHED_IMPOSSIBLE);
	assert_string_equal(q[j].id, "huge");
	assert_int_equal(sched_pick(q, 1, busy, 2, &j, dev), SCHED_START);
	assert_int_equal(sched_pick(q, 0, busy, 2, &j, dev), SCHED_NONE);
}

/* ---- topology: the p3.16xlarge's matrix ---- */

/* Parses `nvidia-smi topo -m` text: a pair whose cell is NV# is linked.
 * Returns the number of GPUs (rows). */
static int topo_parse(const char *path, uint64_t *peers)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char line[512];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		int row;
		if (sscanf(line, "GPU%d", &row) != 1)
			continue;
		assert_true(row >= 0 && row < 64);
		peers[row] = 0;
		char *save = NULL;
		strtok_r(line, "\t\n", &save);
		for (int col = 0;; col++) {
			char *cell = strtok_r(NULL, "\t\n", &save);
			if (!cell || strncmp(cell, "GPU", 3) == 0 || col >= 64)
				break;
			if (strncmp(cell, "NV", 2) == 0)
				peers[row] |= (uint64_t)1 << col;
		}
		n = row + 1 > n ? row + 1 : n;
	}
	fclose(f);
	return n;
}

static int p3_peers(uint64_t *peers)
{
	const char *root = getenv("BERTD_SOURCE_ROOT");
	char path[1024];
	snprintf(path, sizeof path, "%s/tests/fixtures/topo/p3.16xlarge.txt", root ? root : ".");
	int n = topo_parse(path, peers);
	assert_int_equal(n, 8);
	return n;
}

static uint64_t mask_of(const int *dev, int n)
{
	uint64_t m = 0;
	for (int i = 0; i < n; i++)
		m |= (uint64_t)1 << dev[i];
	return m;
}

#define M(...) mask_of((const int[]){__VA_ARGS__}, (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)))

static void test_place_p3(void **state)
{
	(void)state;
	uint64_t peers[64];
	int n = p3_peers(peers);
	uint64_t all = 0xff;
	bool c;
	/* hybrid cube-mesh: two NVLink quads, and i linked to i+4 */
	assert_int_equal(sched_place(4, all, peers, n, &c), M(0, 1, 2, 3));
	assert_true(c);
	assert_int_equal(sched_place(4, all & ~M(0), peers, n, &c), M(4, 5, 6, 7));
	assert_true(c);
	/* no linked quad left: the lowest four, said to be not connected */
	assert_int_equal(sched_place(4, all & ~M(0, 4), peers, n, &c), M(1, 2, 3, 5));
	assert_false(c);
	/* lowest-free would give {3,4}, which have no NVLink; the pair is {3,7} */
	assert_int_equal(sched_place(2, M(3, 4, 5, 6, 7) & ~M(5, 6), peers, n, &c), M(3, 7));
	assert_true(c);
	assert_int_equal(sched_place(2, M(1, 4, 6), peers, n, &c), M(4, 6));
	assert_true(c);
	assert_int_equal(sched_place(3, M(0, 1, 4, 5, 6), peers, n, &c), M(4, 5, 6));
	assert_true(c);
	assert_int_equal(sched_place(8, all, peers, n, &c), all);
	assert_false(c);
	assert_int_equal(sched_place(3, M(0, 5), peers, n, &c), 0); /* too few */
	/* no topology known: lowest free */
	assert_int_equal(sched_place(2, M(3, 4, 7), NULL, n, &c), M(3, 4));
	assert_false(c);
}

static void test_decide_topology(void **state)
{
	(void)state;
	uint64_t peers[64];
	int n = p3_peers(peers);
	bool busy[8] = {false, false, true, false, false, false, false, false}; /* 2 taken */
	sched_running rs[] = {{M(2), 1000}};
	sched_machine m = {.ndev = (size_t)n, .busy = busy, .peers = peers, .running = rs, .nrunning = 1, .now_ms = 0};
	sched_job q[] = {{"four", 0, 1, 4}};
	sched_decision d;
	sched_decide(q, NULL, 1, &m, &d);
	assert_int_equal(d.verdict, SCHED_START);
	assert_int_equal(mask_of(d.dev, d.ndev), M(4, 5, 6, 7));
	assert_true(d.connected);
	assert_false(d.backfill);
	m.peers = NULL; /* same machine without topology: lowest free */
	sched_decide(q, NULL, 1, &m, &d);
	assert_int_equal(mask_of(d.dev, d.ndev), M(0, 1, 3, 4));
	assert_false(d.connected);
}

/* ---- EASY backfill, case by case ---- */

static void test_backfill_bounded_before_head(void **state)
{
	(void)state;
	/* 4 devices; a job on {0,1} ends at 100; the head wants all 4 */
	bool busy[4] = {true, true, false, false};
	sched_running rs[] = {{M(0, 1), 100}};
	sched_machine m = {.ndev = 4, .busy = busy, .running = rs, .nrunning = 1, .now_ms = 10};
	sched_job q[] = {{"head", 5, 1, 4}, {"long", 0, 2, 1}, {"open", 0, 3, 1}, {"short", 0, 4, 2}};
	int64_t limit[] = {
		0,
		500,   /* long: would run past the head's start on its devices */
		0,     /* open: no bound, could run forever */
		90,    /* short: 10 + 90 = 100, done when the head may start */
	};
	sched_decision d;
	sched_decide(q, limit, 4, &m, &d);
	assert_int_equal(d.verdict, SCHED_START);
	assert_string_equal(q[d.job_idx].id, "short");
	assert_true(d.backfill);
	assert_int_equal(d.head_start_ms, 100);
	assert_int_equal(d.reserved, M(0, 1, 2, 3));
	assert_int_equal(mask_of(d.dev, d.ndev), M(2, 3));
	/* without it nothing may jump ahead */
	sched_decide(q, limit, 3, &m, &d);
	assert_int_equal(d.verdict, SCHED_NONE);
	assert_int_equal(d.head_start_ms, 100);
	/* 1 ms too long: it would delay the head */
	limit[3] = 91;
	sched_decide(q, limit, 4, &m, &d);
	assert_int_equal(d.verdict, SCHED_NONE);
}

static void test_backfill_beside_reservation(void **state)
{
	(void)state;
	/* a job on {1,2} ends at 100; the head wants 3: it is promised {0,1,2}
	 * (linked devices not being known, the lowest), so device 3 may take a
	 * job of any length, but not one wanting two */
	bool busy[4] = {false, true, true, false};
	sched_running rs[] = {{M(1, 2), 100}};
	sched_machine m = {.ndev = 4, .busy = busy, .running = rs, .nrunning = 1, .now_ms = 0};
	sched_job q[] = {{"head", 0, 1, 3}, {"pair", 0, 2, 2}, {"one", 0, 3, 1}};
	sched_decision d;
	sched_decide(q, NULL, 3, &m, &d);
	assert_int_equal(d.verdict, SCHED_START);
	assert_string_equal(q[d.job_idx].id, "one");
	assert_int_equal(d.dev[0], 3);
	assert_int_equal(d.reserved, M(0, 1, 2));
	sched_decide(q, NULL, 2, &m, &d);
	assert_int_equal(d.verdict, SCHED_NONE);
}

static void test_reservation_prefers_released_devices(void **state)
{
	(void)state;
	/* device 0 is free, 1 runs with no estimate, {2,3} end at 50; the head
	 * wants 2: at 50 it could have {0,2} or {2,3}. It is promised the
	 * released {2,3}, so device 0 stays open to a job of any length. */
	bool busy[4] = {false, true, true, true};
	sched_running rs[] = {{M(1), SCHED_NEVER}, {M(2, 3), 50}};
	sched_machine m = {.ndev = 4, .busy = busy, .running = rs, .nrunning = 2, .now_ms = 0};
	sched_job q[] = {{"head", 0, 1, 2}, {"one", 0, 2, 1}};
	sched_decision d;
	sched_decide(q, NULL, 2, &m, &d);
	assert_int_equal(d.verdict, SCHED_START);
	assert_string_equal(q[d.job_idx].id, "one");
	assert_int_equal(d.dev[0], 0);
	assert_int_equal(d.reserved, M(2, 3));
	assert_int_equal(d.head_start_ms, 50);
}

static void test_no_estimate_no_backfill(void **state)
{
	(void)state;
	bool busy[2] = {true, false};
	sched_running rs[] = {{M(0), SCHED_NEVER}};
	sched_machine m = {.ndev = 2, .busy = busy, .running = rs, .nrunning = 1, .now_ms = 0};
	sched_job q[] = {{"head", 0, 1, 2}, {"short", 0, 2, 1}};
	int64_t limit[] = {0, 1};
	sched_decision d;
	sched_decide(q, limit, 2, &m, &d);
	assert_int_equal(d.verdict, SCHED_NONE);
	assert_true(d.head_start_ms == SCHED_NEVER);
	rs[0].end_ms = 5; /* estimated now: the 1 ms job fits before */
	sched_decide(q, limit, 2, &m, &d);
	assert_int_equal(d.verdict, SCHED_START);
	assert_string_equal(q[d.job_idx].id, "short");
	assert_true(d.backfill);
}

/* ---- scripted simulations: backfill against strict priority ---- */

#define SIM_MAX 64

typedef struct sim_job {
	int want;
	int64_t dur;      /* how long it really runs */
	bool bounded;     /* its limit (= dur) is told to the scheduler */
	int64_t start, end;
	uint64_t devs;
} sim_job;

typedef struct sim_result {
	int64_t makespan;
	double used;      /* device-time busy / (ndev * makespan) */
	int64_t start[SIM_MAX];
} sim_result;

/* Runs jobs (priority = order given reversed: job 0 highest) on ndev
 * devices from time 0; backfill: sched_decide, else sched_pick. Running
 * jobs are reported with their true end when bounded, else unknown. */
static void simulate(const sim_job *in, int n, int ndev, const uint64_t *peers, bool backfill, sim_result *res)
{
	sim_job j[SIM_MAX];
	memcpy(j, in, (size_t)n * sizeof *j);
	char ids[SIM_MAX][8];
	for (int i = 0; i < n; i++) {
		j[i].start = j[i].end = -1;
		snprintf(ids[i], sizeof ids[i], "j%d", i);
	}
	int64_t now = 0, busy_time = 0;
	int done = 0;
	for (int guard = 0; done < n; guard++) {
		assert_true(guard < 10 * n + 10);
		for (;;) {
			bool busy[SIM_MAX] = {false};
			sched_running rs[SIM_MAX];
			sched_job q[SIM_MAX];
			int64_t lim[SIM_MAX];
			int qi[SIM_MAX], nq = 0, nr = 0;
			for (int i = 0; i < n; i++) {
				if (j[i].start < 0) {
					q[nq] = (sched_job){ids[i], n - i, i, j[i].want};
					lim[nq] = j[i].bounded ? j[i].dur : 0;
					qi[nq++] = i;
				} else if (j[i].end > now) {
					for (int d = 0; d < ndev; d++)
						busy[d] |= (j[i].devs >> d) & 1;
					rs[nr++] = (sched_running){j[i].devs, j[i].bounded ? j[i].end : SCHED_NEVER};
				}
			}
			int pick = -1, dev[SIM_MAX], ndv = 0;
			if (backfill) {
				sched_machine m = {.ndev = (size_t)ndev, .busy = busy, .peers = peers, .running = rs,
						   .nrunning = (size_t)nr, .now_ms = now};
				sched_decision d;
				sched_decide(q, lim, (size_t)nq, &m, &d);
				assert_int_not_equal(d.verdict, SCHED_IMPOSSIBLE);
				if (d.verdict == SCHED_START) {
					pick = qi[d.job_idx];
					ndv = d.ndev;
					memcpy(dev, d.dev, sizeof(int) * (size_t)ndv);
				}
			} else {
				size_t k;
				if (sched_pick(q, (size_t)nq, busy, (size_t)ndev, &k, dev) == SCHED_START) {
					pick = qi[k];
					ndv = j[pick].want;
				}
			}
			if (pick < 0)
				break;
			assert_int_equal(ndv, j[pick].want);
			j[pick].devs = 0;
			for (int k = 0; k < ndv; k++) {
				assert_false(busy[dev[k]]); /* never on a taken device */
				j[pick].devs |= (uint64_t)1 << dev[k];
			}
			j[pick].start = now;
			j[pick].end = now + j[pick].dur;
			busy_time += j[pick].dur * ndv;
		}
		/* next event: the earliest end after now */
		int64_t next = INT64_MAX;
		for (int i = 0; i < n; i++)
			if (j[i].start >= 0 && j[i].end > now && j[i].end < next)
				next = j[i].end;
		if (next == INT64_MAX)
			break;
		now = next;
		done = 0;
		for (int i = 0; i < n; i++)
			done += j[i].start >= 0 && j[i].end <= now;
	}
	res->makespan = now;
	res->used = (double)busy_time / ((double)ndev * (double)now);
	for (int i = 0; i < n; i++) {
		assert_true(j[i].start >= 0);
		res->start[i] = j[i].start;
	}
}

static void test_simulation_team_server(void **state)
{
	(void)state;
	uint64_t peers[64];
	int ndev = p3_peers(peers);
	/* one 4-GPU run going, then an 8-GPU job at the head (submitted
	 * second, so the 4-GPU one already runs), then 1-GPU jobs */
	sim_job jobs[12] = {{4, 100, true, 0, 0, 0}, {8, 50, true, 0, 0, 0}};
	for (int i = 2; i < 10; i++)
		jobs[i] = (sim_job){1, 30, true, 0, 0, 0};
	jobs[10] = (sim_job){1, 40, false, 0, 0, 0}; /* no bound: may not jump */
	jobs[11] = (sim_job){2, 200, true, 0, 0, 0}; /* too long to fit before the head */
	sim_result strict, easy;
	simulate(jobs, 12, ndev, peers, false, &strict);
	simulate(jobs, 12, ndev, peers, true, &easy);
	assert_int_equal(strict.start[1], 100);
	assert_true(easy.start[1] <= strict.start[1]); /* the head is not delayed */
	assert_int_equal(easy.start[1], 100);
	assert_int_equal(easy.start[2], 0);           /* backfilled beside the 4-GPU run */
	assert_true(easy.start[10] >= 100);           /* the unbounded one waited */
	assert_true(easy.start[11] >= 150);           /* so did the long pair */
	assert_true(easy.makespan < strict.makespan);
	assert_true(easy.used > strict.used);
	print_message("team server: strict makespan %lld used %.2f; backfill makespan %lld used %.2f\n",
		      (long long)strict.makespan, strict.used, (long long)easy.makespan, easy.used);
}

static void test_simulation_random_queues(void **state)
{
	(void)state;
	uint64_t peers[64];
	int ndev = p3_peers(peers);
	uint64_t seed = 12345;
	const int sizes[] = {1, 1, 1, 2, 2, 4, 8};
	int better = 0;
	for (int round = 0; round < 40; round++) {
		sim_job jobs[24];
		int n = 24;
		for (int i = 0; i < n; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			int want = sizes[(seed >> 33) % 7];
			int64_t dur = 10 + (int64_t)((seed >> 20) % 200);
			bool bounded = ((seed >> 45) % 4) != 0; /* a quarter unbounded */
			jobs[i] = (sim_job){want, dur, bounded, 0, 0, 0};
		}
		/* the queue's head: an 8-GPU job behind what already runs */
		jobs[3] = (sim_job){8, 60, true, 0, 0, 0};
		sim_result strict, easy;
		simulate(jobs, n, ndev, round % 2 ? peers : NULL, false, &strict);
		simulate(jobs, n, ndev, round % 2 ? peers : NULL, true, &easy);
		/* the highest-priority job that had to wait: backfill never starts
		 * it later than strict priority does */
		for (int i = 0; i < n; i++) {
			if (strict.start[i] == 0)
				continue;
			assert_true(easy.start[i] <= strict.start[i]);
			break;
		}
		better += easy.used > strict.used;
	}
	assert_true(better > 0);
}

static void test_cpu_slots(void **state)
{
	(void)state;
	device *d = NULL;
	size_t n = 0;
	assert_int_equal(devices_discover("cpu", 3, &d, &n), 0);
	assert_int_equal(n, 3);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(d[i].kind, DEVICE_CPU);
		assert_int_equal(d[i].index, (int)i);
	}
	assert_true(d[0].peers_known);
	assert_int_equal(d[0].peers, M(1, 2)); /* CPU slots share memory: all linked */
	free(d);
	assert_int_equal(devices_discover("cpu", 0, &d, &n), 0);
	assert_true(n >= 1);
	free(d);
	assert_int_equal(devices_discover("tpu", 0, &d, &n), -EINVAL);
}

/* devices_discover through the stand-in NVML serving the p3.16xlarge's
 * matrix: NVML's P2P status becomes each GPU's peers. */
static void test_discover_nvlink(void **state)
{
	(void)state;
	if (!getenv("BERTD_TEST_FAKE_NVML")) {
		skip();
		return;
	}
	uint64_t want[64];
	int nt = p3_peers(want);
	device *d = NULL;
	size_t n = 0;
	assert_int_equal(devices_discover("cuda", 0, &d, &n), 0);
	assert_int_equal(n, (size_t)nt);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(d[i].kind, DEVICE_CUDA);
		assert_true(d[i].peers_known);
		assert_int_equal(d[i].peers, want[i]);
	}
	assert_int_equal(d[0].peers, M(1, 2, 3, 4));
	assert_int_equal(d[6].peers, M(2, 4, 5, 7));
	free(d);
}


/* ---- preemption (sched_preempt) ---- */

/* Four devices, all busy; the victims' order: lowest priority first, then
 * the most recently started. */
static void test_preempt_lowest_then_latest(void **state)
{
	(void)state;
	bool busy[4] = {true, true, true, true};
	sched_machine m = {.ndev = 4, .busy = busy};
	sched_victim v[] = {
		{M(0), 0, 10, true, false},  /* a: priority 0, started first */
		{M(1), 0, 20, true, false},  /* b: priority 0, started last */
		{M(2), -1, 5, true, false},  /* c: the lowest priority */
		{M(3), 3, 30, true, false},  /* d: priority 3 */
	};
	sched_job q[] = {{"low", -5, 1, 1}, {"head", 5, 2, 2}};
	sched_preemption p;
	sched_preempt(q, 2, &m, v, 4, &p);
	assert_true(p.preempt);
	assert_string_equal(q[p.job_idx].id, "head");
	assert_int_equal(p.nvictims, 2);
	assert_int_equal(p.victim[0], 2); /* c */
	assert_int_equal(p.victim[1], 1); /* b, started after a */
	/* one device wanted: one victim, c */
	q[1].want = 1;
	sched_preempt(q, 2, &m, v, 4, &p);
	assert_true(p.preempt);
	assert_int_equal(p.nvictims, 1);
	assert_int_equal(p.victim[0], 2);
	/* all four: d (priority 3) is below 5 too */
	q[1].want = 4;
	sched_preempt(q, 2, &m, v, 4, &p);
	assert_true(p.preempt);
	assert_int_equal(p.nvictims, 4);
	assert_int_equal(p.victim[3], 3);
}

/* Equal priority never preempts, nor does a lower one; a job that is not
 * preemptible is never chosen. */
static void test_preempt_only_lower_and_preemptible(void **state)
{
	(void)state;
	bool busy[2] = {true, true};
	sched_machine m = {.ndev = 2, .busy = busy};
	sched_victim v[] = {{M(0), 5, 10, true, false}, {M(1), 2, 20, false, false}};
	sched_job q[] = {{"head", 5, 1, 1}};
	sched_preemption p;
	sched_preempt(q, 1, &m, v, 2, &p);
	assert_false(p.preempt); /* 5 vs 5: equal; 2 is lower but not preemptible */
	q[0].priority = 6;
	sched_preempt(q, 1, &m, v, 2, &p);
	assert_true(p.preempt);
	assert_int_equal(p.nvictims, 1);
	assert_int_equal(p.victim[0], 0);
	/* the preempted job, queued again below its preemptor, cannot take
	 * its devices back: the preemptor runs at a higher priority */
	sched_victim after[] = {{M(0), 6, 40, true, false}, {M(1), 2, 20, false, false}};
	sched_job back[] = {{"victim", 5, 0, 1}};
	sched_preempt(back, 1, &m, after, 2, &p);
	assert_false(p.preempt);
}

/* Nothing is preempted for a job that could not start with every eligible
 * victim gone, nor when it already fits on free devices. */
static void test_preempt_only_when_it_then_starts(void **state)
{
	(void)state;
	bool busy[4] = {true, true, true, true};
	sched_machine m = {.ndev = 4, .busy = busy};
	sched_victim v[] = {{M(0, 1), 0, 10, true, false}, {M(2, 3), 0, 20, false, false}};
	sched_job q[] = {{"head", 9, 1, 4}};
	sched_preemption p;
	sched_preempt(q, 1, &m, v, 2, &p);
	assert_false(p.preempt); /* {2,3} stays: 2 devices at most */
	q[0].want = 8;           /* more than exist */
	sched_preempt(q, 1, &m, v, 2, &p);
	assert_false(p.preempt);
	q[0].want = 2;
	busy[0] = busy[1] = false;
	sched_victim w[] = {{M(2, 3), 0, 20, true, false}};
	sched_preempt(q, 1, &m, w, 1, &p);
	assert_false(p.preempt); /* {0,1} are free */
	/* one free device and one taken: one 1-device victim is enough */
	busy[0] = true;
	sched_victim x[] = {{M(0), 0, 30, true, false}, {M(2, 3), 0, 20, true, false}};
	q[0].want = 2;
	sched_preempt(q, 1, &m, x, 2, &p);
	assert_true(p.preempt);
	assert_int_equal(p.nvictims, 1);
	assert_int_equal(p.victim[0], 0);
}

/* The fewest victims: a low-priority job taken first but not needed once a
 * larger one is in stays running. */
static void test_preempt_fewest(void **state)
{
	(void)state;
	bool busy[4] = {true, true, true, true};
	sched_machine m = {.ndev = 4, .busy = busy};
	sched_victim v[] = {
		{M(0), 0, 10, true, false},     /* one device, lowest priority */
		{M(1, 2), 1, 10, true, false},  /* two devices */
		{M(3), 50, 10, true, false},    /* above the head */
	};
	sched_job q[] = {{"head", 5, 1, 2}};
	sched_preemption p;
	sched_preempt(q, 1, &m, v, 3, &p);
	assert_true(p.preempt);
	assert_int_equal(p.nvictims, 1);
	assert_int_equal(p.victim[0], 1);
}

/* Victims already leaving are waited for, never preempted again; when
 * their devices are not enough, only what is missing is preempted. */
static void test_preempt_waits_for_leaving(void **state)
{
	(void)state;
	bool busy[3] = {true, true, true};
	sched_machine m = {.ndev = 3, .busy = busy};
	sched_victim v[] = {{M(0, 1), 0, 10, true, true}, {M(2), 0, 20, true, false}};
	sched_job q[] = {{"head", 5, 1, 2}};
	sched_preemption p;
	sched_preempt(q, 1, &m, v, 2, &p);
	assert_false(p.preempt); /* {0,1} are on their way out */
	q[0].want = 3;
	sched_preempt(q, 1, &m, v, 2, &p);
	assert_true(p.preempt);
	assert_int_equal(p.nvictims, 1);
	assert_int_equal(p.victim[0], 1);
}

/* A held job (preempted for a job that has not started yet) neither
 * starts, nor is backfilled, nor preempts; the preemptor starts first. */
static void test_held_job_waits_for_its_preemptor(void **state)
{
	(void)state;
	bool busy[2] = {false, false};
	const bool held[2] = {true, false};
	sched_machine m = {.ndev = 2, .busy = busy, .held = held};
	sched_job q[] = {{"victim", 0, 1, 1}};
	sched_decision d;
	sched_decide(q, NULL, 1, &m, &d);
	assert_int_equal(d.verdict, SCHED_NONE);
	m.held = NULL; /* not held: it starts */
	sched_decide(q, NULL, 1, &m, &d);
	assert_int_equal(d.verdict, SCHED_START);
	m.held = held;
	sched_job q2[] = {{"victim", 0, 1, 1}, {"preemptor", 5, 2, 2}};
	sched_decide(q2, NULL, 2, &m, &d);
	assert_int_equal(d.verdict, SCHED_START);
	assert_string_equal(q2[d.job_idx].id, "preemptor");
	/* a held job is not backfilled beside a waiting head either */
	busy[0] = true;
	sched_running rs[] = {{M(0), 1000}};
	m.running = rs;
	m.nrunning = 1;
	int64_t limit[] = {1, 0};
	sched_decide(q2, limit, 2, &m, &d);
	assert_int_equal(d.verdict, SCHED_NONE);
	/* nor does it preempt */
	sched_victim v[] = {{M(0), -3, 10, true, false}};
	sched_preemption p;
	sched_preempt(q, 1, &m, v, 1, &p);
	assert_false(p.preempt);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_priority_then_fifo),
		cmocka_unit_test(test_head_waits_no_backfill),
		cmocka_unit_test(test_lowest_free_devices),
		cmocka_unit_test(test_impossible),
		cmocka_unit_test(test_place_p3),
		cmocka_unit_test(test_decide_topology),
		cmocka_unit_test(test_backfill_bounded_before_head),
		cmocka_unit_test(test_backfill_beside_reservation),
		cmocka_unit_test(test_reservation_prefers_released_devices),
		cmocka_unit_test(test_no_estimate_no_backfill),
		cmocka_unit_test(test_simulation_team_server),
		cmocka_unit_test(test_simulation_random_queues),
		cmocka_unit_test(test_preempt_lowest_then_latest),
		cmocka_unit_test(test_preempt_only_lower_and_preemptible),
		cmocka_unit_test(test_preempt_only_when_it_then_starts),
		cmocka_unit_test(test_preempt_fewest),
		cmocka_unit_test(test_preempt_waits_for_leaving),
		cmocka_unit_test(test_held_job_waits_for_its_preemptor),
		cmocka_unit_test(test_cpu_slots),
		cmocka_unit_test(test_discover_nvlink),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
