/* scheduler — decides which queued job starts next and on which devices.
 * Pure: no I/O, no clock, no globals, no allocation; the supervisor feeds
 * it the queue, the devices (free or not, and which pairs are directly
 * linked), the running jobs with their estimated ends and the time, and
 * acts on its answer.
 *
 * Policy: strict priority, then submission order, with EASY backfill (as
 * Slurm's backfill plugin): the head of the queue gets a reservation, the
 * earliest time enough devices are estimated to be free (running jobs
 * ending in order of their estimated end) and the devices it would then
 * take. A job behind the head may start now, on free devices, only when it
 * cannot delay that reservation: its own run-time bound ends it before the
 * head's estimated start, or it leaves the reserved devices alone. When the
 * head's start cannot be estimated (a running job with no estimate holds
 * devices it needs), nothing jumps ahead of it. A job that asks for more
 * devices than the machine has can never run: it is reported so the caller
 * fails it with a reason instead of queueing forever.
 *
 * Placement: a k-device job gets k devices that are pairwise directly
 * linked (NVLink) when such a set is among the devices it may use (the
 * first such set in index order), else the lowest free ones. Never
 * reorders a job's devices: ranks map to ascending device indices.
 *
 * Preemption (sched_preempt): when the head cannot start, it may stop
 * running jobs of strictly lower priority that are preemptible: the fewest
 * needed, lowest priority first, the most recently started first, and only
 * when it can be placed once they are gone. A job it preempted is held
 * (sched_machine.held) until it has started, so a victim never starts ahead of
 * its preemptor, and nothing of equal priority is ever preempted, so two
 * jobs cannot take turns stopping each other.
 */
#ifndef BERTD_DAEMON_SCHEDULER_H
#define BERTD_DAEMON_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SCHED_MAX_DEV 64        /* device table entries the scheduler handles */
#define SCHED_NEVER INT64_MAX   /* an end or start time that is not known */

typedef struct sched_job {
	const char *id;
	int priority;       /* higher first */
	int64_t seq;        /* submission order (store seq), lower first */
	int want;           /* devices asked for (resources.gpus) */
} sched_job;

/* A job holding devices now. */
typedef struct sched_running {
	uint64_t devs;      /* bit d: it holds device d */
	int64_t end_ms;     /* estimated end, same clock as sched_machine.now_ms;
			     * SCHED_NEVER when not known (it never ends, for the reservation) */
} sched_running;

typedef struct sched_machine {
	size_t ndev;                  /* <= SCHED_MAX_DEV */
	const bool *busy;             /* (ndev,) true = device taken */
	const uint64_t *peers;        /* (ndev,) bit j of peers[i]: i and j directly linked;
				       * NULL: topology not known (lowest free devices) */
	const sched_running *running; /* (nrunning,) */
	size_t nrunning;
	int64_t now_ms;
	const bool *held;             /* (n queued,) true: that job may not start now, a job it was
				       * preempted for has not started yet (neither the head nor
				       * backfilled; still reported when impossible); NULL: none */
} sched_machine;

enum sched_verdict {
	SCHED_NONE = 0,     /* nothing can start now */
	SCHED_START,        /* start job_idx on the devices in dev */
	SCHED_IMPOSSIBLE,   /* job_idx wants more devices than exist */
};

typedef struct sched_decision {
	enum sched_verdict verdict;
	size_t job_idx;
	int ndev;                     /* SCHED_START: devices in dev (= the job's want) */
	int dev[SCHED_MAX_DEV];       /* ascending device indices */
	bool connected;               /* every pair of dev directly linked (false when peers is NULL and ndev > 1) */
	bool backfill;                /* started ahead of a waiting head */
	int64_t head_start_ms;        /* SCHED_NONE or backfill: the head's estimated start
				       * (SCHED_NEVER: not known); else now_ms */
	uint64_t reserved;            /* bit d: device d is held for the head at head_start_ms */
} sched_decision;

/* Decides one start among n queued jobs (any order) on machine m. limit_ms
 * (n,): the longest each can run once started (what is left of its
 * stopping_condition.max_runtime_seconds), 0 for no bound; NULL when none
 * has one. At most one job is started per call; the caller acts, updates
 * busy and running and calls again until SCHED_NONE. */
void sched_decide(const sched_job *queued, const int64_t *limit_ms, size_t n, const sched_machine *m,
		  sched_decision *out);

/* Strict priority without backfill, topology or holds, kept for callers
 * that only know which devices are busy: the queue's head on the lowest
 * free devices.
 * On SCHED_START, dev_out[0..want) receives device indices. dev_out must
 * hold ndev entries. */
enum sched_verdict sched_pick(const sched_job *queued, size_t n, const bool *busy, size_t ndev,
			      size_t *job_idx, int *dev_out);

/* k devices out of allowed (bitmask), pairwise linked under peers when such
 * a set exists (the first in index order), else the lowest k. Returns the
 * set as a bitmask (0 when allowed has fewer than k) and *connected. peers
 * NULL: the lowest k, connected only when k is 1. */
uint64_t sched_place(int k, uint64_t allowed, const uint64_t *peers, size_t ndev, bool *connected);

/* A running job as a possible victim of preemption. */
typedef struct sched_victim {
	uint64_t devs;      /* bit d: it holds device d */
	int priority;       /* its priority now */
	int64_t start_ms;   /* when its attempt started (any clock): the latest is preempted first */
	bool preemptible;   /* its spec says "preemptible": true */
	bool leaving;       /* already on its way out (stopping, preempted, killed): its
			     * devices count as coming free, it is not preempted again */
} sched_victim;

typedef struct sched_preemption {
	bool preempt;                  /* true: stop victim[0..nvictims) for queued[job_idx] */
	size_t job_idx;
	size_t nvictims;
	size_t victim[SCHED_MAX_DEV];  /* indices into the victims array, in the order chosen */
} sched_preemption;

/* Whether the head of the n queued jobs (held ones skipped) should preempt
 * some of the nv running jobs in victims (every job holding devices on m,
 * leaving or not) to start: only when it cannot be placed on the free
 * devices plus those of leaving victims; then the fewest victims of
 * strictly lower priority with preemptible set, chosen lowest priority
 * first and among equals the most recently started first (a victim that
 * turns out not to be needed once later ones are in is left running), such
 * that the head can be placed once they are gone. No preemption when the
 * head waits for leaving victims, wants more devices than exist, or could
 * not be placed even with every eligible victim gone. m->running is not
 * read. */
void sched_preempt(const sched_job *queued, size_t n, const sched_machine *m, const sched_victim *victims,
		   size_t nv, sched_preemption *out);

#endif
