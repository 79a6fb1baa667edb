/* Chaos: random kill -9 of the daemon, a worker, a loader or
 * bertd-prepare, and SIGSTOP/SIGCONT of a worker, during a CPU job and
 * during a burst of submissions. Afterwards:
 *   - every acknowledged (201) submission exists, and every job the daemon
 *     knows is terminal: completed, or canceled where a cancel was
 *     acknowledged;
 *   - the disturbed job's export and final checkpoint are bit-identical to
 *     an undisturbed run of the same spec (CPU resume is exact, from
 *     whichever checkpoint the restart picked);
 *   - a SIGSTOP shorter than stall_timeout_s restarts nothing;
 *   - a kill -9 of the daemon leaves the job running (its workers and
 *     loaders outlive it; the next daemon adopts them, no restart); at the
 *     end no process of the test's daemon is left, and nothing of its jobs
 *     is left in /dev/shm;
 *   - a dataset whose bertd-prepare (or daemon) was killed ends ready or
 *     failed with a reason, never stuck preparing, and leaves no working
 *     directory of bertd-prepare (".<name>.partial") in the data root; one
 *     whose daemon was killed ends ready, its bertd-prepare adopted by the
 *     next daemon (or, killed before its record was written, started
 *     again), and that bertd-prepare is gone once it is ready.
 * A seeded PRNG picks the disturbances, their order and the moments (steps)
 * they land at; the seed is printed, and BERTD_CHAOS_SEED replays a run.
 * The test is bounded by counts (rounds, submissions), never by time:
 * every wait polls observable state (the API, /proc) with a deadline. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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
#define ROUNDS 10      /* disturbances of the chaos job, besides the burst's and the last one */
#define BURST 20       /* acknowledged submissions wanted from the burst */
#define BURST_TRIES 40 /* submissions tried at most (some meet a dead daemon) */
#define MAX_STEPS 600
#define MAX_IDS 128

/* ---- the PRNG: splitmix64, so a seed replays the same choices ---- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static int rng_between(int lo, int hi)
{
	return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

static void rng_seed(void)
{
	const char *s = getenv("BERTD_CHAOS_SEED");
	uint64_t seed = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	rng_state = seed;
	fprintf(stderr, "chaos: seed %llu (replay with BERTD_CHAOS_SEED=%llu)\n", (unsigned long long)seed,
		(unsigned long long)seed);
}

/* ---- the fixture ---- */

typedef struct counts {
	int worker_kills, loader_kills, daemon_kills, prepare_kills, stops;
	int acked, unacked, cancels_acked, jobs_checked;
	long long bytes_compared;
} counts;

typedef it_fx fx;
static counts tally; /* what the test did, for its summary (setup zeroes it) */

static int setup(void **state)
{
	static const char *const extra[] = {"--stop-timeout-s", "60", "--stall-timeout-s", "20", NULL};
	it_daemon_opts o = {.cpu_slots = "2", .extra = extra};
	memset(&tally, 0, sizeof tally);
	return it_setup(state, &o, 0);
}

#define STR_(x) #x
#define STR(x) STR_(x)
/* it_job_spec's tiny job on shakes (a model small enough to train in
 * seconds on two cores) for MAX_STEPS steps: two ranks and two loaders, a
 * checkpoint every 10 steps, restarts enough for every disturbance; submits
 * it and returns its id (caller frees). */
static char *submit_long(fx *f, const char *name)
{
	char *spec = it_job_spec(name, "shakes", "training_args.max_steps", STR(MAX_STEPS), "training_args.save_steps",
				 "10", "resources.gpus", "2", "training_args.dataloader_num_workers", "2", "retry_policy",
				 "{\"max_restarts\":50}", NULL);
	char *id = it_submit(&f->d, spec);
	free(spec);
	return id;
}

/* ---- observing ---- */

static json_t *job_of(fx *f, const char *id)
{
	char path[160];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	return it_get_json(&f->d, path);
}

static long job_step(json_t *j)
{
	return (long)json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
}

static int job_restarts(json_t *j)
{
	return (int)json_integer_value(json_object_get(j, "restart_count"));
}

static bool is_terminal(const char *st)
{
	return !strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "canceled");
}

/* Polls (every 20 ms) until the job is in one of the '|'-separated states
 * with step >= step logged. A job that ends first fails the test, unless
 * may_end (then the ended job is returned). Returns the job (caller
 * decrefs). */
static json_t *wait_live_at(fx *f, const char *id, const char *states, long step, bool may_end)
{
	char want[64], have[64];
	snprintf(want, sizeof want, "|%s|", states);
	for (int i = 0; i < DEADLINE_S * 50; i++) {
		json_t *j = job_of(f, id);
		const char *st = it_jstr(j, "state");
		snprintf(have, sizeof have, "|%s|", st);
		if (strstr(want, have) && job_step(j) >= step)
			return j;
		if (is_terminal(st)) {
			if (may_end)
				return j;
			bertd_print_log(&f->d);
			fail_msg("job %s ended %s (%s) before step %ld", id, st,
				 json_string_value(json_object_get(j, "failure_reason")), step);
		}
		json_decref(j);
		it_pause_ms(20);
	}
	bertd_print_log(&f->d);
	fail_msg("job %s: not %s at step %ld after %d s", id, states, step, DEADLINE_S);
	return NULL;
}

/* Polls until the job's restart_count exceeds before (the daemon saw the
 * attempt die and put it back to restarting) or the job ended; returns the
 * job (caller decrefs). */
static json_t *wait_restarts_or_end(fx *f, const char *id, int before)
{
	for (int i = 0; i < DEADLINE_S * 50; i++) {
		json_t *j = job_of(f, id);
		if (job_restarts(j) > before || is_terminal(it_jstr(j, "state")))
			return j;
		json_decref(j);
		it_pause_ms(20);
	}
	bertd_print_log(&f->d);
	fail_msg("job %s: the kill was not noticed within %d s", id, DEADLINE_S);
	return NULL;
}

/* Live processes whose command line names the test's root (the daemon,
 * its workers, loaders and bertd-prepare all do: state dir, job.json,
 * dataset dir). Waits for them to go, at most deadline_s; fails the test
 * naming the first one left. */
static void assert_none_of(fx *f, const char *what, const char *when, int deadline_s)
{
	pid_t pids[16];
	int n = 0;
	for (int i = 0; i < deadline_s * 50; i++) {
		if ((n = it_find_pids(f->d.root, what, pids, 16)) == 0)
			return;
		it_pause_ms(20);
	}
	char path[64], cmd[512] = "";
	snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pids[0]);
	FILE *p = fopen(path, "r");
	if (p) {
		size_t len = fread(cmd, 1, sizeof cmd - 1, p);
		for (size_t i = 0; i < len; i++)
			if (!cmd[i])
				cmd[i] = ' ';
		cmd[len] = 0;
		fclose(p);
	}
	fail_msg("%s: %d process(es) left after %d s, e.g. pid %d: %s", when, n, deadline_s, (int)pids[0], cmd);
}

static void assert_no_processes(fx *f, const char *when, int deadline_s)
{
	assert_none_of(f, NULL, when, deadline_s);
}

/* kill -9 of the daemon: a job's workers and loaders and bertd-prepare
 * outlive it, and a new daemon starts on the same state dir (and adopts
 * them). */
static void kill_daemon_and_restart(fx *f)
{
	bertd_kill9(&f->d);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	tally.daemon_kills++;
}

/* One live process of the job matching what ("bertd-worker",
 * "bertd-loader"), picked by the PRNG; polls until there is one. With
 * may_end, 0 once the job has ended instead. */
static pid_t pick_process(fx *f, const char *what, const char *id, bool may_end)
{
	pid_t pids[8];
	for (int i = 0; i < DEADLINE_S * 50; i++) {
		int n = it_find_pids(what, id, pids, 8);
		if (n > 0)
			return pids[rng_between(0, n - 1)];
		if (may_end) {
			json_t *j = job_of(f, id);
			bool ended = is_terminal(it_jstr(j, "state"));
			json_decref(j);
			if (ended)
				return 0;
		}
		it_pause_ms(20);
	}
	fail_msg("job %s: no %s process within %d s", id, what, DEADLINE_S);
	return -1;
}

/* ---- the burst: a thread submitting while the main thread kills the
 * daemon (which only the main thread restarts: the daemon dies with the
 * thread that started it, PR_SET_PDEATHSIG) ---- */

typedef struct burst {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bertd d;        /* a copy of the daemon's address and token */
	int generation; /* bumped by every restart */
	char *ids[MAX_IDS];
	bool cancel_acked[MAX_IDS];
	int acked, unacked, cancels;
	bool done;
} burst;

/* Waits (at most DEADLINE_S) for a daemon newer than gen. */
static void burst_wait_restart(burst *b, int gen)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += DEADLINE_S;
	pthread_mutex_lock(&b->mu);
	while (b->generation == gen)
		if (pthread_cond_timedwait(&b->cv, &b->mu, &until) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&b->mu);
}

static void *burst_main(void *arg)
{
	burst *b = arg;
	for (int t = 0; t < BURST_TRIES && b->acked < BURST; t++) {
		pthread_mutex_lock(&b->mu);
		bertd d = b->d;
		int gen = b->generation;
		pthread_mutex_unlock(&b->mu);
		char name[32];
		snprintf(name, sizeof name, "burst-%d", t);
		char *spec = it_job_spec(name, "shakes", "training_args.max_steps", "6", "training_args.save_steps", "3",
					 "training_args.logging_steps", "3", NULL);
		http_resp r;
		int rc = http_post_json(&d, "/v1/jobs", spec, &r);
		free(spec);
		const char *id = rc == 0 && r.status == 201 ? json_string_value(json_object_get(r.json, "id")) : NULL;
		bool acked = id != NULL;
		pthread_mutex_lock(&b->mu);
		if (acked) {
			b->ids[b->acked++] = strdup(id);
		} else {
			b->unacked++;
			if (rc == 0)
				fprintf(stderr, "chaos: burst submission %d answered %ld: %s\n", t, r.status, r.body);
		}
		pthread_cond_broadcast(&b->cv);
		pthread_mutex_unlock(&b->mu);
		http_resp_free(&r);
		if (rc != 0) {
			burst_wait_restart(b, gen); /* the daemon is down: go on with the next one */
			continue;
		}
		if (acked && b->acked % 4 == 0) { /* every fourth one is canceled at once */
			char path[160];
			snprintf(path, sizeof path, "/v1/jobs/%s/cancel", b->ids[b->acked - 1]);
			rc = http_post_json(&d, path, "{}", &r);
			if (rc == 0 && (r.status == 200 || r.status == 202)) {
				pthread_mutex_lock(&b->mu);
				b->cancel_acked[b->acked - 1] = true;
				b->cancels++;
				pthread_mutex_unlock(&b->mu);
			}
			http_resp_free(&r);
			if (rc != 0)
				burst_wait_restart(b, gen);
		}
	}
	pthread_mutex_lock(&b->mu);
	b->done = true;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* The burst: after kill_after acknowledged submissions the daemon is
 * killed (mid-request, most likely) and restarted. */
static void run_burst(fx *f, burst *b)
{
	int kill_after = rng_between(2, BURST - 5);
	fprintf(stderr, "chaos: burst of %d submissions, daemon killed after %d\n", BURST, kill_after);
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	b->d = f->d;
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, burst_main, b), 0);
	pthread_mutex_lock(&b->mu);
	while (b->acked < kill_after && !b->done)
		pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
	kill_daemon_and_restart(f);
	pthread_mutex_lock(&b->mu);
	b->d = f->d;
	b->generation++;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	pthread_join(th, NULL);
	tally.acked += b->acked;
	tally.unacked += b->unacked;
	tally.cancels_acked += b->cancels;
	fprintf(stderr, "chaos: burst acknowledged %d, not acknowledged %d, cancels acknowledged %d\n", b->acked,
		b->unacked, b->cancels);
	assert_int_equal(b->acked, BURST);
}

/* ---- comparing ---- */

/* Whole file (it_slurp; caller frees), its length in *n. Fails the test
 * if unreadable. */
static unsigned char *slurp(const char *path, size_t *n)
{
	char *buf = it_slurp(path, n);
	if (!buf)
		fail_msg("cannot read %s: %s", path, strerror(errno));
	return (unsigned char *)buf;
}

/* a/name and b/name are byte for byte the same; counts the bytes. */
static void assert_same_file(const char *a, const char *b, const char *name)
{
	char pa[1400], pb[1400];
	snprintf(pa, sizeof pa, "%s/%s", a, name);
	snprintf(pb, sizeof pb, "%s/%s", b, name);
	size_t nx, ny;
	unsigned char *x = slurp(pa, &nx), *y = slurp(pb, &ny);
	if (nx != ny || memcmp(x, y, nx) != 0) {
		size_t at = 0;
		while (at < nx && at < ny && x[at] == y[at])
			at++;
		fail_msg("%s differs from the undisturbed run's (%zu vs %zu bytes, first difference at byte %zu)", pb,
			 ny, nx, at);
	}
	tally.bytes_compared += (long long)nx;
	free(x);
	free(y);
}

static void ckpt_dir(fx *f, const char *id, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/jobs/%s/checkpoints/ckpt-%d", f->d.state_dir, id, MAX_STEPS);
}

/* Every GET /v1/jobs page: the jobs' ids (caller frees each and out). */
static int list_jobs(fx *f, char ***out)
{
	char **ids = NULL;
	int n = 0;
	char cursor[64] = "";
	do {
		char path[160];
		snprintf(path, sizeof path, "/v1/jobs?limit=100%s%s", cursor[0] ? "&cursor=" : "", cursor);
		json_t *page = it_get_json(&f->d, path);
		size_t i;
		json_t *j;
		json_array_foreach(json_object_get(page, "jobs"), i, j) {
			ids = realloc(ids, sizeof *ids * (size_t)(n + 1));
			ids[n++] = strdup(it_jstr(j, "id"));
		}
		const char *next = json_string_value(json_object_get(page, "next_cursor"));
		snprintf(cursor, sizeof cursor, "%s", next ? next : "");
		json_decref(page);
	} while (cursor[0]);
	*out = ids;
	return n;
}

/* Nothing in /dev/shm names any of the jobs (rings "/bertd-<id>", their
 * ".init-<pid>" drafts, comm segments "/bertd-<id>-comm"). */
static void assert_shm_clean(char **ids, int n)
{
	DIR *dir = opendir("/dev/shm");
	assert_non_null(dir);
	struct dirent *e;
	while ((e = readdir(dir)))
		for (int i = 0; i < n; i++)
			if (strstr(e->d_name, ids[i])) {
				closedir(dir);
				fail_msg("/dev/shm/%s is left of job %s", e->d_name, ids[i]);
			}
	closedir(dir);
}

/* ---- the tests ---- */

enum disturbance { KILL_WORKER, KILL_LOADER, KILL_DAEMON, STOP_WORKER, NDISTURBANCES };
static const char *const disturbance_name[] = {"kill -9 a worker", "kill -9 a loader", "kill -9 the daemon",
					       "SIGSTOP a worker, then SIGCONT"};

static int cmp_long(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return (x > y) - (x < y);
}

/* One disturbance of the chaos job, planned by the PRNG. */
typedef struct round {
	long at;      /* the step the job must have logged */
	int kind;     /* enum disturbance */
	bool early;   /* also while the job is starting (its processes coming up) */
	bool burst;   /* a daemon kill during a burst of submissions */
	bool endgame; /* at the last steps: the job may end first (then skipped) */
} round;

/* ROUNDS disturbances at sorted random steps, every kind at least once;
 * the burst among them; one more at the end (final checkpoint, export).
 * Returns how many. */
static int plan_rounds(round *plan)
{
	int kinds[ROUNDS];
	long at[ROUNDS];
	for (int r = 0; r < ROUNDS; r++) {
		kinds[r] = r < NDISTURBANCES ? r : rng_between(0, NDISTURBANCES - 1);
		at[r] = rng_between(5, MAX_STEPS * 3 / 4);
	}
	for (int r = ROUNDS - 1; r > 0; r--) {
		int k = rng_between(0, r), t = kinds[r];
		kinds[r] = kinds[k];
		kinds[k] = t;
	}
	qsort(at, ROUNDS, sizeof at[0], cmp_long);
	int burst_at = rng_between(0, ROUNDS), n = 0;
	for (int r = 0; r < ROUNDS; r++) {
		if (r == burst_at)
			plan[n++] = (round){.at = r ? at[r - 1] : 5, .kind = KILL_DAEMON, .burst = true};
		plan[n++] = (round){.at = at[r], .kind = kinds[r], .early = rng_between(0, 3) == 0};
	}
	if (burst_at == ROUNDS)
		plan[n++] = (round){.at = at[ROUNDS - 1], .kind = KILL_DAEMON, .burst = true};
	plan[n++] = (round){.at = MAX_STEPS - rng_between(0, 10), .kind = rng_between(KILL_WORKER, KILL_DAEMON),
			    .endgame = true};
	return n;
}

/* Does one disturbance of job id, seen at step with before restarts, and
 * waits until the daemon has dealt with it. */
static void disturb(fx *f, const char *id, int kind, long step, int before, bool endgame)
{
	switch (kind) {
	case KILL_WORKER:
	case KILL_LOADER: {
		pid_t pid = pick_process(f, kind == KILL_WORKER ? "bertd-worker" : "bertd-loader", id, endgame);
		if (pid == 0) {
			fprintf(stderr, "chaos: too late, the job ended\n");
			break;
		}
		assert_int_equal(kill(pid, SIGKILL), 0);
		if (endgame) {
			/* the process may have been on its way out, done: then the
			 * job completes, and the comparison below judges it */
			json_decref(wait_restarts_or_end(f, id, before));
		} else {
			json_t *j = wait_restarts_or_end(f, id, before);
			if (job_restarts(j) <= before) {
				bertd_print_log(&f->d);
				fail_msg("job %s ended %s after a kill at step %ld, without a restart", id,
					 it_jstr(j, "state"), step);
			}
			json_decref(j);
		}
		if (kind == KILL_WORKER)
			tally.worker_kills++;
		else
			tally.loader_kills++;
		break;
	}
	case KILL_DAEMON: {
		kill_daemon_and_restart(f);
		/* its workers outlived it and the new daemon adopted them: the job
		 * goes on, two logging windows further, without a restart */
		json_t *j = wait_live_at(f, id, "running", step + 10, endgame);
		if (job_restarts(j) != before) {
			bertd_print_log(&f->d);
			fail_msg("job %s restarted after a kill -9 of the daemon at step %ld (%d -> %d restarts)", id,
				 step, before, job_restarts(j));
		}
		json_decref(j);
		break;
	}
	case STOP_WORKER: {
		pid_t pid = pick_process(f, "bertd-worker", id, false);
		assert_int_equal(kill(pid, SIGSTOP), 0);
		it_pause_ms(rng_between(50, 1000)); /* "a moment": far below stall_timeout_s (20 s) */
		assert_int_equal(kill(pid, SIGCONT), 0);
		/* it goes on, two logging windows further, without a restart */
		json_t *j = wait_live_at(f, id, "running", step + 10, false);
		assert_int_equal(job_restarts(j), before);
		json_decref(j);
		tally.stops++;
		break;
	}
	}
}

static void test_chaos_job_and_burst(void **state)
{
	fx *f = *state;
	rng_seed();
	it_make_corpus(f->data, "shakes.txt", 3000);
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"shakes\",\"source\":\"shakes.txt\","
					       "\"vocab\":{\"train\":{\"vocab_size\":400}}}"), 0);
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);

	/* the undisturbed run */
	char *ref = submit_long(f, "reference");
	json_t *rj = it_wait_completed(&f->d, ref, DEADLINE_S);
	assert_int_equal(job_restarts(rj), 0);
	char ref_export[1100], ref_ckpt[1100];
	snprintf(ref_export, sizeof ref_export, "%s", it_jstr(rj, "model_dir"));
	ckpt_dir(f, ref, ref_ckpt, sizeof ref_ckpt);
	json_decref(rj);

	/* the same job under chaos */
	char *id = submit_long(f, "chaos");
	round plan[ROUNDS + 2];
	int nplan = plan_rounds(plan);
	burst b = {0};
	for (int r = 0; r < nplan; r++) {
		const round *p = &plan[r];
		json_t *j = wait_live_at(f, id, p->early ? "starting|running" : "running", p->at, p->endgame);
		int before = job_restarts(j);
		long step = job_step(j);
		bool ended = is_terminal(it_jstr(j, "state"));
		json_decref(j);
		fprintf(stderr, "chaos: round %d at step %ld (restarts %d%s): %s%s%s\n", r, step, before,
			p->early ? ", starting or running" : "", disturbance_name[p->kind],
			p->burst ? " during a burst of submissions" : "", ended ? ": too late, the job ended" : "");
		if (ended)
			continue;
		if (p->burst)
			run_burst(f, &b);
		else
			disturb(f, id, p->kind, step, before, p->endgame);
	}

	/* the chaos job ends as the undisturbed one did, byte for byte */
	json_t *cj = it_wait_completed(&f->d, id, DEADLINE_S);
	fprintf(stderr, "chaos: job completed after %d restart(s)\n", job_restarts(cj));
	char ck[1100];
	ckpt_dir(f, id, ck, sizeof ck);
	assert_same_file(ref_export, it_jstr(cj, "model_dir"), "model.safetensors");
	assert_same_file(ref_ckpt, ck, "params.safetensors");
	assert_same_file(ref_ckpt, ck, "optim.safetensors");
	json_decref(cj);

	/* every acknowledged submission exists; every job ends terminal:
	 * canceled where the cancel was acknowledged, else completed */
	for (int i = 0; i < b.acked; i++) {
		json_t *j = it_wait_job(&f->d, b.ids[i], "completed|failed|canceled", DEADLINE_S);
		const char *st = it_jstr(j, "state");
		const char *want = b.cancel_acked[i] ? "canceled" : "completed";
		if (strcmp(st, want) != 0) {
			bertd_print_log(&f->d);
			fail_msg("burst job %s ended %s (%s), want %s", b.ids[i], st,
				 json_string_value(json_object_get(j, "failure_reason")), want);
		}
		json_decref(j);
	}
	char **all = NULL;
	int nall = list_jobs(f, &all);
	for (int i = 0; i < nall; i++) {
		json_t *j = it_wait_job(&f->d, all[i], "completed|failed|canceled", DEADLINE_S);
		if (!strcmp(it_jstr(j, "state"), "failed")) {
			bertd_print_log(&f->d);
			fail_msg("job %s failed: %s", all[i], json_string_value(json_object_get(j, "failure_reason")));
		}
		json_decref(j);
	}
	tally.jobs_checked = nall;
	assert_true(nall >= 2 + b.acked); /* the reference, the chaos job, the burst's */

	/* stopped: nothing left running, nothing left in /dev/shm */
	assert_int_equal(bertd_stop(&f->d), 0);
	assert_no_processes(f, "after the daemon stopped", 30);
	assert_shm_clean(all, nall);

	fprintf(stderr,
		"CHAOS jobs kills_survived=%d worker_kills=%d loader_kills=%d daemon_kills=%d stops=%d "
		"acked=%d unacked=%d cancels_acked=%d jobs_checked=%d bytes_compared=%lld\n",
		tally.worker_kills + tally.loader_kills + tally.daemon_kills, tally.worker_kills, tally.loader_kills,
		tally.daemon_kills, tally.stops, tally.acked, tally.unacked, tally.cancels_acked, tally.jobs_checked,
		tally.bytes_compared);
	for (int i = 0; i < nall; i++)
		free(all[i]);
	free(all);
	for (int i = 0; i < b.acked; i++)
		free(b.ids[i]);
	free(id);
	free(ref);
}

/* A corpus of copies of the test text, large enough that bertd-prepare is
 * still at work when it is found (a few MB). */
static void make_big_corpus(fx *f, const char *name)
{
	it_make_corpus(f->data, "one.txt", 1000000);
	char one[300], big[300];
	snprintf(one, sizeof one, "%s/one.txt", f->data);
	snprintf(big, sizeof big, "%s/%s", f->data, name);
	size_t len;
	unsigned char *text = slurp(one, &len);
	FILE *out = fopen(big, "wb");
	assert_non_null(out);
	for (size_t n = 0; n < (size_t)16 << 20; n += len)
		assert_int_equal(fwrite(text, 1, len, out), len);
	assert_int_equal(fclose(out), 0);
	free(text);
	unlink(one);
}

/* Waits until dataset name's bertd-prepare runs and, with written, has
 * written its trained vocab into its working directory ".<name>.partial"
 * (it tokenizes into it next; without written, any moment: mostly the
 * vocab pass, before). Returns its pid; 0 when the preparation ended
 * first. */
static pid_t find_prepare(fx *f, const char *name, bool written)
{
	char dir[400], path[200], tmp[480];
	snprintf(tmp, sizeof tmp, "%s/datasets/.%s.partial/resume.json", f->data, name);
	snprintf(dir, sizeof dir, "%s/datasets/%s", f->data, name);
	snprintf(path, sizeof path, "/v1/datasets/%s", name);
	for (int i = 0; i < DEADLINE_S * 200; i++) {
		pid_t pid;
		if (it_find_pids("bertd-prepare", dir, &pid, 1) == 1 && (!written || access(tmp, F_OK) == 0))
			return pid;
		json_t *ds = it_get_json(&f->d, path);
		const char *st = it_jstr(ds, "state");
		bool over = strcmp(st, "preparing") != 0 && strcmp(st, "queued") != 0;
		json_decref(ds);
		if (over)
			return 0;
		it_pause_ms(5);
	}
	fail_msg("dataset %s: no bertd-prepare within %d s", name, DEADLINE_S);
	return 0;
}

/* The dataset ends ready or failed with a reason, never stuck preparing;
 * returns its state. */
static const char *dataset_outcome(fx *f, const char *name, char *buf, size_t cap)
{
	char path[200];
	snprintf(path, sizeof path, "/v1/datasets/%s", name);
	json_t *ds = it_wait_state(&f->d, path, "ready|failed", DEADLINE_S);
	snprintf(buf, cap, "%s", it_jstr(ds, "state"));
	if (!strcmp(buf, "failed")) {
		const char *why = json_string_value(json_object_get(ds, "error"));
		if (!why || !*why)
			fail_msg("dataset %s failed without a reason", name);
		fprintf(stderr, "chaos: dataset %s failed: %s\n", name, why);
	}
	json_decref(ds);
	return buf;
}

/* No working directory of a bertd-prepare (".<name>.partial", or an older
 * one's "<name>.tmp-<pid>") is left beside the dataset in the data root (a
 * partial copy of the shards) once it is ready or failed. */
static void assert_no_prepare_tmp(fx *f, const char *name)
{
	char dir[300], prefix[100], work[100];
	snprintf(dir, sizeof dir, "%s/datasets", f->data);
	snprintf(prefix, sizeof prefix, "%s.tmp-", name);
	snprintf(work, sizeof work, ".%s.partial", name);
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *e;
	while ((e = readdir(d)))
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 || strcmp(e->d_name, work) == 0) {
			closedir(d);
			fail_msg("%s/%s is left of a killed bertd-prepare", dir, e->d_name);
		}
	closedir(d);
}

static void test_chaos_prepare(void **state)
{
	fx *f = *state;
	rng_seed();
	make_big_corpus(f, "big.txt");
	/* kill -9 of bertd-prepare, or of the daemon, early or once it writes
	 * into its working directory; the PRNG orders the four */
	static const char *const phases[2] = {"early", "writing"};
	int order[4] = {0, 1, 2, 3};
	for (int i = 3; i > 0; i--) {
		int k = rng_between(0, i), t = order[i];
		order[i] = order[k];
		order[k] = t;
	}
	for (int i = 0; i < 4; i++) {
		bool daemon = order[i] & 1;
		const char *phase = phases[order[i] >> 1];
		char name[64], body[300], st[32];
		snprintf(name, sizeof name, "victim-%s-%s", daemon ? "daemon" : "prepare", phase);
		snprintf(body, sizeof body,
			 "{\"name\":\"%s\",\"source\":\"big.txt\",\"vocab\":{\"train\":{\"vocab_size\":2000}}}", name);
		assert_int_equal(it_add_dataset(&f->d, body), 0);
		pid_t pid = find_prepare(f, name, order[i] >> 1);
		if (!pid) {
			fprintf(stderr, "chaos: dataset %s finished before it was seen %s\n", name, phase);
			dataset_outcome(f, name, st, sizeof st);
			assert_no_prepare_tmp(f, name);
			continue;
		}
		it_pause_ms(rng_between(0, 100)); /* ready or failed are both right if it finishes meanwhile */
		if (!daemon) {
			fprintf(stderr, "chaos: kill -9 of bertd-prepare (pid %d) of %s, %s\n", (int)pid,
				name, phase);
			assert_int_equal(kill(pid, SIGKILL), 0);
			tally.prepare_kills++;
			dataset_outcome(f, name, st, sizeof st);
		} else {
			fprintf(stderr, "chaos: kill -9 of the daemon while %s prepares, %s\n", name, phase);
			kill_daemon_and_restart(f);
			/* adopted (or started again, resuming): ready */
			assert_string_equal(dataset_outcome(f, name, st, sizeof st), "ready");
			char ps = it_proc_state(pid);
			if (ps && ps != 'Z')
				fail_msg("dataset %s is ready and its bertd-prepare %d still runs", name, (int)pid);
		}
		assert_no_prepare_tmp(f, name);
	}
	assert_int_equal(bertd_stop(&f->d), 0);
	assert_no_processes(f, "after the daemon stopped", 30);
	fprintf(stderr, "CHAOS prepare prepare_kills=%d daemon_kills=%d\n", tally.prepare_kills, tally.daemon_kills);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_chaos_job_and_burst, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_chaos_prepare, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
