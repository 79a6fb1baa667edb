/* jobqueue — the scheduler's view of the queue: for every queued and
 * restarting job, what a scheduling pass needs of it (priority, submission
 * order, devices, nodes, run-time bound, datasets), parsed once per change
 * of the job's row rather than once per pass. jobqueue_refresh reads only
 * the rows that changed since the last call (store_queue_changes), so a
 * pass over a queue of 10,000 jobs that did not change reads no spec.
 *
 * Holds no lock and calls nothing but the store: the supervisor's tick (one
 * thread) owns it, as a tool or a test may. Must never decide anything
 * (daemon/scheduler.c does) or write the store.
 */
#ifndef BERTD_DAEMON_JOBQUEUE_H
#define BERTD_DAEMON_JOBQUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store.h"

/* One queued or restarting job. */
typedef struct jobqueue_entry {
	char *id;
	uint64_t id_hash;       /* of id: jobqueue_find compares it first */
	int64_t seq;            /* submission order */
	enum job_state state;   /* JOB_QUEUED or JOB_RESTARTING */
	int priority;
	int64_t runtime_ms;     /* wall time of its attempts so far */
	int want;               /* resources.gpus (1..64; 1 when absent or out of range) */
	bool multinode;         /* resources.nodes > 1: Slurm places it */
	int64_t max_runtime_s;  /* stopping_condition.max_runtime_seconds, 0 for none */
	int *datasets;          /* (ndatasets,) indices into jobqueue_dataset names */
	int ndatasets;
} jobqueue_entry;

typedef struct jobqueue jobqueue;

/* *out is caller-owned (jobqueue_destroy); empty until the first refresh.
 * -ENOMEM. */
int jobqueue_create(jobqueue **out);
void jobqueue_destroy(jobqueue *q);

/* Specs parsed by one refresh at most while a whole queue is read (the
 * first refresh, or after a change the revisions cannot name): ~0.1-0.2 s
 * on a loaded 2-core machine. */
#define JOBQUEUE_SLICE 2000

/* Brings q up to date with the store: the rows changed since the last call,
 * each changed job's spec parsed again. A whole queue (the first call) of
 * more than JOBQUEUE_SLICE jobs is read in one snapshot and parsed a slice
 * per call: meanwhile jobqueue_loading is true, the entries are the first
 * slices only, and a call reads nothing from the store. *nread (if
 * non-NULL) gets the rows read from the store. On a store error q is
 * unchanged and the error is returned; -ENOMEM leaves q empty, to be read
 * whole by the next call. */
int jobqueue_refresh(jobqueue *q, store *st, size_t *nread);
/* True while a whole queue is being parsed over several refreshes: the
 * entries are not the whole queue yet, so nothing may be decided on them. */
bool jobqueue_loading(const jobqueue *q);

/* The entries, in submission order (seq ascending); valid until the next
 * jobqueue_refresh or jobqueue_destroy. */
const jobqueue_entry *jobqueue_entries(const jobqueue *q, size_t *n);
/* The index of job id among the entries, or -1. */
long jobqueue_find(const jobqueue *q, const char *id);
/* The dataset name entries' datasets[] index i stands for (a mixture's
 * components are separate names); valid as long as q. */
const char *jobqueue_dataset(const jobqueue *q, int i);
/* How many dataset names there are (indices 0..n-1). */
int jobqueue_ndatasets(const jobqueue *q);

/* A run-time bound for sched_decide: what max_runtime_seconds leaves after
 * the job's earlier attempts (>= 1 ms), or 0 without one. */
int64_t jobqueue_limit_ms(const jobqueue_entry *e);

#endif
