/* supervisor — see supervisor.h. This file: the supervisor object, the
 * one-second tick (stop requests, run-time limits, the stall check,
 * scheduling queued jobs), the telemetry sampling timer, and recovery at
 * start (adopting the attempts whose processes outlived the daemon before,
 * daemon/adopt.c). It is the top of the supervisor's files (daemon/sv_internal.h
 * gives their call order); none of them calls it:
 *   sv_run.c       a run's small helpers: clock, verdict, kill, run list, free
 *   sv_jobfile.c   the job.json a job's processes read
 *   sv_child.c     a run's child processes on the loop: spawn, read, exit
 *   sv_stall.c     the stall watch
 *   sv_report.c    what a job's workers report, into the store
 *   sv_relay.c     a multi-node attempt's relay: the ranks' connections
 *   sv_finish.c    the end of a job's attempt: the job's next state
 *   sv_prepare.c   dataset preparations (bertd-prepare)
 *   sv_slurm.c     a multi-node attempt: srun and its end
 *   sv_launch.c    starting an attempt: resume point, local ranks
 *   sv_preempt.c   preempting running jobs for the queue's head
 *   sv_shutdown.c  draining at shutdown
 * Never blocks the loop (only supervisor_shutdown does, in sv_shutdown.c)
 * and never interprets a child's messages itself (sv_report, sv_prepare).
 *
 * Job life on this side:
 *   queued/restarting --tick: devices free--> starting (children spawned)
 *   starting --first metrics or every worker said hello--> running
 *   all workers exit 0 --> completed
 *   stop requested (state stopping) --> workers get {"type":"stop"},
 *       checkpoint, exit 6 --> canceled
 *   a child dies otherwise --> the rest are killed; retryable and restarts
 *       left --> restarting (resumes from the last checkpoint), else failed.
 *   workers silent past the stall limit --> killed, as a retryable failure
 *       (sv_stall.c).
 *   preempted for a job of higher priority (sv_preempt.c) --> workers get
 *       {"type":"stop","reason":"preempt"}, checkpoint, exit 6 --> queued,
 *       held until that job has started, then resumed.
 *   a loss or gradient norm that is not finite --> failed, never retried.
 */
#include "daemon/sv_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "common/jobspec.h"
#include "common/log.h"
#include "common/msg.h"
#include "daemon/jobqueue.h"
#include "daemon/proc.h"
#include "daemon/scheduler.h"
#include "daemon/telemetry_sampler.h"

#define TELEMETRY_SAMPLE_MS 500 /* GPU/host sampling period of running jobs */

static void tick_running(supervisor *sv)
{
	int64_t now = sv_now_ms();
	for (run *r = sv->runs; r; r = r->next) {
		if (r->is_dataset)
			continue;
		if (r->killing) {
			if (now > r->stop_deadline_ms)
				for (int i = 0; i < r->nkids; i++)
					if (!r->kids[i]->exited && !r->kids[i]->relayed)
						proc_signal(&r->kids[i]->p, SIGKILL);
			continue;
		}
		store_job j;
		if (store_job_get(sv->st, r->id, &j) < 0)
			continue;
		bool stop = j.state == JOB_STOPPING;
		store_job_free(&j);
		if (!stop && r->max_runtime_ms && now - r->start_ms > r->max_runtime_ms) {
			store_job_transition(sv->st, r->id, JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING),
					     JOB_STOPPING, "stopping_condition.max_runtime_seconds reached", NULL);
			r->stop_why = "stopped at stopping_condition.max_runtime_seconds (checkpoint kept)";
			stop = true;
		}
		if (stop && r->preempted_by[0])
			sv_preempt_canceled(sv, r); /* canceled while stopping for a preemption */
		if (stop && !r->stop_sent) {
			json_t *m = json_pack("{s:s, s:s}", "type", "stop", "reason", "cancel");
			for (int i = 0; i < r->nkids; i++)
				if (r->kids[i]->role == ROLE_WORKER && !r->kids[i]->exited)
					msg_send(r->kids[i]->p.sock, m);
			json_decref(m);
			r->stop_sent = true;
			r->stop_deadline_ms = now + sv->cfg.stop_timeout_ms;
		} else if (r->stop_sent && now > r->stop_deadline_ms) {
			log_warn("job %s did not stop within %d ms; killing it", r->id, sv->cfg.stop_timeout_ms);
			sv_run_kill_all(r, SIGKILL);
		} else if (!r->stop_sent) {
			sv_stall_check(sv, r, now);
		}
	}
}

/* Whether the queue's dataset name i is still being prepared (or waits in
 * the preparation queue), asked of the store once per pass: asked (the
 * queue's ndatasets,) 0 not yet, 1 no, 2 yes. */
static bool dataset_preparing(supervisor *sv, int i, unsigned char *asked)
{
	if (!asked[i]) {
		store_dataset ds;
		bool preparing = false;
		if (store_dataset_get_by_name(sv->st, jobqueue_dataset(sv->jq, i), &ds) == 0) {
			preparing = ds.state == DATASET_PREPARING;
			store_dataset_free(&ds);
		}
		asked[i] = preparing ? 2 : 1;
	}
	return asked[i] == 2;
}

/* A job waits for its datasets while any of them is queued or preparing. */
static bool job_data_preparing(supervisor *sv, const jobqueue_entry *e, unsigned char *asked)
{
	for (int k = 0; k < e->ndatasets; k++)
		if (dataset_preparing(sv, e->datasets[k], asked))
			return true;
	return false;
}

/* When run r is estimated to end (monotonic ms, as sv_now_ms), for the
 * scheduler's reservation: the steps left at its latest measured step time,
 * or the end of its share of max_runtime_seconds, whichever comes first;
 * SCHED_NEVER when neither is known (before its first metrics, no limit). */
static int64_t run_estimated_end(supervisor *sv, const run *r, int64_t now)
{
	if (r->killing || r->preempted_by[0])
		return now; /* on its way out */
	int64_t end = r->max_runtime_ms > 0 && r->start_ms > 0 ? r->start_ms + r->max_runtime_ms : SCHED_NEVER;
	store_metric m;
	if (store_metric_latest(sv->st, r->id, &m) == 0) {
		json_t *v = json_loads(m.values_json, 0, NULL);
		json_t *st = json_object_get(v, "step_time_ms");
		json_int_t max_steps =
			json_integer_value(json_object_get(json_object_get(r->spec, "training_args"), "max_steps"));
		if (json_is_number(st) && json_number_value(st) > 0 && max_steps >= m.step) {
			double left = (double)(max_steps - m.step) * json_number_value(st);
			if (left < 1e15 && now + (int64_t)left < end)
				end = now + (int64_t)left;
		}
		json_decref(v);
		free(m.values_json);
	}
	return end;
}

/* The scheduler's view of this machine's devices (busy, topology, what
 * runs on them until when) into busy, peers and rs (each sized ndev). */
static void machine_view(supervisor *sv, bool *busy, uint64_t *peers, sched_running *rs, sched_machine *m)
{
	bool topo = sv->ndev <= SCHED_MAX_DEV;
	for (size_t d = 0; d < sv->ndev; d++) {
		busy[d] = sv->dev_job[d] != NULL;
		peers[d] = sv->devs[d].peers;
		topo = topo && sv->devs[d].peers_known;
	}
	*m = (sched_machine){.ndev = sv->ndev, .busy = busy, .peers = topo ? peers : NULL, .running = rs,
			     .nrunning = 0, .now_ms = sv_now_ms()};
	for (run *r = sv->runs; r; r = r->next) {
		if (r->is_dataset || r->multinode || r->ndev <= 0 || m->nrunning >= sv->ndev)
			continue;
		uint64_t devs = 0;
		for (int i = 0; i < r->ndev; i++)
			if (r->dev[i] >= 0 && r->dev[i] < SCHED_MAX_DEV)
				devs |= (uint64_t)1 << r->dev[i];
		rs[m->nrunning++] = (sched_running){devs, run_estimated_end(sv, r, m->now_ms)};
	}
}

/* Starts queued entry e (dev: its devices; NULL for a multi-node job) from
 * its row as it is now; false when the row could not be read or the job
 * left the queue meanwhile (a cancel: the next refresh sees it). */
static bool start_entry(supervisor *sv, const jobqueue_entry *e, const int *dev, int ndev)
{
	store_job j;
	if (store_job_get(sv->st, e->id, &j) < 0)
		return false;
	bool queued = j.state == JOB_QUEUED || j.state == JOB_RESTARTING;
	if (queued)
		sv_launch_start_job(sv, &j, dev, ndev, j.state == JOB_RESTARTING);
	store_job_free(&j);
	return queued;
}

/* One scheduling pass over the whole queue: the queue as the jobqueue keeps
 * it (only rows changed since the last pass are read and their specs
 * parsed), sched_decide, act, and again after each start until nothing
 * starts or nothing changed. */
static void tick_schedule(supervisor *sv)
{
	if (!sv->jq && jobqueue_create(&sv->jq) < 0)
		return; /* out of memory: the next tick tries again */
	/* Decisions per tick: every device started, and as many jobs failed at
	 * their start (a missing binary fails each queued job in turn); the
	 * rest wait for the next tick, so a long queue of such jobs never holds
	 * the event loop (signals, workers' messages) for all of them. */
	int budget = (int)sv->ndev + 16;
	for (bool first = true; budget-- > 0; first = false) {
		size_t nread = 0, n = 0;
		if (jobqueue_refresh(sv->jq, sv->st, &nread) < 0 || jobqueue_loading(sv->jq))
			return; /* a long queue read at start: parsed a slice per tick, decided on whole */
		if (!first && nread == 0)
			return; /* what was acted on did not reach the store: deciding again gives the same */
		const jobqueue_entry *e = jobqueue_entries(sv->jq, &n);
		int nds = jobqueue_ndatasets(sv->jq);
		sched_job *q = calloc(n ? n : 1, sizeof *q);
		size_t *map = calloc(n ? n : 1, sizeof *map);
		int64_t *limits = calloc(n ? n : 1, sizeof *limits); /* (nq,) run-time bounds */
		bool *skip = calloc(n ? n : 1, sizeof *skip);
		unsigned char *asked = calloc(nds ? (size_t)nds : 1, 1);
		size_t nd = sv->ndev ? sv->ndev : 1;
		bool *busy = calloc(nd, sizeof *busy);
		uint64_t *peers = calloc(nd, sizeof *peers);
		sched_running *rs = calloc(nd, sizeof *rs);
		sched_decision *dec = calloc(1, sizeof *dec);
		bool *held = calloc(n ? n : 1, sizeof *held); /* (nq,) waits for its preemptor */
		bool again = false;
		if (!q || !map || !limits || !skip || !asked || !busy || !peers || !rs || !dec || !held)
			goto next; /* out of memory: the next tick tries again */
		/* jobs whose attempt is still being torn down are not candidates */
		for (run *r = sv->runs; r; r = r->next) {
			long k = r->is_dataset ? -1 : jobqueue_find(sv->jq, r->id);
			if (k >= 0)
				skip[k] = true;
		}
		size_t nq = 0;
		for (size_t i = 0; i < n; i++) {
			if (skip[i] || job_data_preparing(sv, &e[i], asked))
				continue;
			if (e[i].multinode) { /* Slurm places it, not this machine's device table */
				again |= start_entry(sv, &e[i], NULL, 0);
				continue;
			}
			q[nq] = (sched_job){e[i].id, e[i].priority, e[i].seq, e[i].want};
			limits[nq] = jobqueue_limit_ms(&e[i]);
			map[nq++] = i;
		}
		sched_machine m;
		machine_view(sv, busy, peers, rs, &m);
		sv_preempt_hold(sv, q, nq, held);
		m.held = held;
		sched_decide(q, limits, nq, &m, dec);
		if (dec->verdict == SCHED_IMPOSSIBLE) {
			char why[200];
			snprintf(why, sizeof why, "asks for %d devices; this machine has %zu", q[dec->job_idx].want,
				 sv->ndev);
			sv_fail_job_now(sv, q[dec->job_idx].id, JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_RESTARTING), why);
			again = true;
		} else if (dec->verdict == SCHED_START) {
			const jobqueue_entry *j = &e[map[dec->job_idx]];
			if (dec->backfill)
				log_info("job %s backfilled on %d device(s): the queue's head is estimated to start in %lld s",
					 j->id, dec->ndev, (long long)((dec->head_start_ms - m.now_ms) / 1000));
			start_entry(sv, j, dec->dev, dec->ndev);
			again = true;
		} else {
			sv_preempt_consider(sv, q, nq, &m);
		}
	next:
		free(held);
		free(rs);
		free(peers);
		free(dec);
		free(busy);
		free(q);
		free(map);
		free(limits);
		free(skip);
		free(asked);
		if (!again)
			return;
	}
}

/* Telemetry timer: one sample of every running job's devices, host CPU
 * and loaders (folded into its next metrics row). */
static void on_sample(loop *l, int fd, uint32_t events, void *arg)
{
	(void)l;
	(void)events;
	supervisor *sv = arg;
	uint64_t expirations;
	if (read(fd, &expirations, sizeof expirations) < 0)
		return;
	int64_t now = sv_now_ms();
	for (run *r = sv->runs; r; r = r->next) {
		if (r->is_dataset || r->killing || !r->ts)
			continue;
		pid_t lp[TSAMPLER_MAX_LOADERS];
		int nl = 0;
		for (int i = 0; i < r->nkids && nl < TSAMPLER_MAX_LOADERS; i++)
			if (r->kids[i]->role == ROLE_LOADER && !r->kids[i]->exited)
				lp[nl++] = r->kids[i]->p.pid;
		tsampler_sample(r->ts, lp, nl, now);
	}
}

/* Telemetry is optional: without the timer jobs run, rows just lack samples. */
static void sample_timer_start(supervisor *sv)
{
	sv->sample_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (sv->sample_fd < 0) {
		log_warn("telemetry sampling off: timerfd: %s", strerror(errno));
		return;
	}
	struct itimerspec its = {
		.it_interval = {TELEMETRY_SAMPLE_MS / 1000, (TELEMETRY_SAMPLE_MS % 1000) * 1000000L},
		.it_value = {TELEMETRY_SAMPLE_MS / 1000, (TELEMETRY_SAMPLE_MS % 1000) * 1000000L},
	};
	if (timerfd_settime(sv->sample_fd, 0, &its, NULL) < 0 ||
	    loop_add(sv->lp, sv->sample_fd, EPOLLIN, on_sample, sv) < 0) {
		log_warn("telemetry sampling off: cannot arm its timer");
		close(sv->sample_fd);
		sv->sample_fd = -1;
	}
}

void supervisor_tick(supervisor *sv)
{
	sv_prepare_tick(sv);
	tick_running(sv);
	if (!sv->cfg.hold_queue)
		tick_schedule(sv);
}

/* ---- lifecycle ---- */

static void recover(supervisor *sv)
{
	sv_adopt_datasets(sv); /* bertd-prepare outlives the daemon: adopted, or queued again below */
	sv_prepare_recover(sv);
	store_job *jobs = NULL;
	size_t n = 0;
	int64_t next = 0;
	unsigned mask = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING) | JOB_MASK(JOB_STOPPING);
	if (store_job_list(sv->st, mask, 0, 100000, &jobs, &n, &next) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		/* its workers may have outlived the daemon before: adopted */
		if (sv_adopt_job(sv, &jobs[i]) == 1)
			continue;
		char shm[120];
		sv_shm_name_for(jobs[i].id, shm, sizeof shm);
		shm_unlink(shm); /* segments left by the previous daemon's job */
		snprintf(shm, sizeof shm, "/bertd-%s-comm", jobs[i].id);
		shm_unlink(shm);
		if (jobs[i].state == JOB_STOPPING) {
			char who[200], why[260];
			snprintf(why, sizeof why, "%s (daemon restarted during the cancel)",
				 sv_canceled_by(sv, jobs[i].id, who, sizeof who));
			store_job_transition(sv->st, jobs[i].id, JOB_MASK(JOB_STOPPING), JOB_CANCELED, why, NULL);
		} else {
			store_job_transition(sv->st, jobs[i].id, mask, JOB_RESTARTING,
					     "daemon restarted; resuming from the last checkpoint", NULL);
		}
	}
	store_jobs_free(jobs, n);
}

int supervisor_create(supervisor **out, const supervisor_config *cfg, loop *lp, store *st,
		      const device *devices, size_t ndev)
{
	supervisor *sv = calloc(1, sizeof *sv);
	if (!sv)
		return -ENOMEM;
	sv->cfg = *cfg;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 1)
		ncpu = 1;
	sv->prepare_limit = cfg->prepare_concurrency > 0 ? cfg->prepare_concurrency
			    : cfg->prepare_concurrency == 0 ? (int)ncpu
			    : (int)(ncpu / 2 > 1 ? ncpu / 2 : 1);
	snprintf(sv->state_dir, sizeof sv->state_dir, "%s", cfg->state_dir);
	snprintf(sv->bin_dir, sizeof sv->bin_dir, "%s", cfg->bin_dir);
	snprintf(sv->dataset_root, sizeof sv->dataset_root, "%s", cfg->dataset_root);
	sv->cfg.state_dir = sv->state_dir;
	sv->cfg.bin_dir = sv->bin_dir;
	sv->cfg.dataset_root = sv->dataset_root;
	char why[300];
	if (childenv_pass_parse(&sv->pass_env, cfg->pass_env ? cfg->pass_env : "", why, sizeof why) < 0) {
		log_error("pass_env: %s", why);
		free(sv);
		return -EINVAL;
	}
	sv->cfg.pass_env = NULL; /* parsed into sv->pass_env */
	if (sv->cfg.stop_timeout_ms <= 0)
		sv->cfg.stop_timeout_ms = 120000;
	if (sv->cfg.stall_timeout_ms <= 0)
		sv->cfg.stall_timeout_ms = 300000;
	sv->lp = lp;
	sv->st = st;
	sv->sample_fd = -1;
	sv->devs = calloc(ndev ? ndev : 1, sizeof *sv->devs);
	sv->dev_job = calloc(ndev ? ndev : 1, sizeof *sv->dev_job);
	if (!sv->devs || !sv->dev_job) {
		supervisor_destroy(sv);
		return -ENOMEM;
	}
	memcpy(sv->devs, devices, ndev * sizeof *devices);
	sv->ndev = ndev;
	sv_preempt_load(sv); /* before adoption: an adopted victim's stop is asked again */
	recover(sv);
	sample_timer_start(sv);
	*out = sv;
	return 0;
}

size_t supervisor_devices(supervisor *sv, const device **devs, const char *const **job_ids)
{
	*devs = sv->devs;
	*job_ids = sv->dev_job;
	return sv->ndev;
}

void supervisor_destroy(supervisor *sv)
{
	if (!sv)
		return;
	while (sv->runs) {
		run *r = sv->runs;
		sv->runs = r->next;
		sv_run_free(r);
	}
	for (size_t d = 0; d < sv->ndev; d++)
		free((char *)(sv->dev_job ? sv->dev_job[d] : NULL));
	free(sv->dev_job);
	free(sv->devs);
	jobqueue_destroy(sv->jq);
	if (sv->sample_fd >= 0) {
		loop_del(sv->lp, sv->sample_fd);
		close(sv->sample_fd);
	}
	free(sv);
}

void supervisor_set_limits(supervisor *sv, int stop_timeout_ms, int stall_timeout_ms, bool hold_queue)
{
	sv->cfg.stop_timeout_ms = stop_timeout_ms > 0 ? stop_timeout_ms : 120000;
	sv->cfg.stall_timeout_ms = stall_timeout_ms > 0 ? stall_timeout_ms : 300000;
	sv->cfg.hold_queue = hold_queue;
}
