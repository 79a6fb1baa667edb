/* nodeloaders — a multi-node job's loaders on this node. Under srun no
 * daemon runs beside the ranks of the other nodes, so each node feeds its
 * own ranks: every rank of the node opens the node's ring (batchjob's
 * batchjob_ring_on_node, from Slurm's view of the node), and the node's
 * first rank starts the job's dataloader_num_workers bertd-loader
 * processes on it, stops them and removes the ring when it ends.
 * Used by worker_main.c only; never on a single-host job (the daemon
 * starts those loaders) and never with the daemon's socket: the loaders
 * log to the job's logs directory and report through the ring. */
#ifndef BERTD_WORKER_NODELOADERS_H
#define BERTD_WORKER_NODELOADERS_H

#include <stdbool.h>
#include <sys/types.h>

#include "loader/batchjob.h"

#define NODELOADERS_MAX 64

typedef struct nodeloaders {
	pid_t pid[NODELOADERS_MAX];
	int n;                  /* started */
	char shm[RING_NAME_MAX]; /* the node's ring, removed at the end */
} nodeloaders;

/* This rank's node from Slurm's environment (SLURM_LOCALID,
 * SLURM_NTASKS_PER_NODE, SLURM_NODEID, BERTD_ATTEMPT; block placement:
 * a node's ranks are consecutive): sets BERTD_RING_NODE for the loaders,
 * narrows bj's ring to the node (batchjob_ring_from_env) and returns the
 * rank's index in that ring in *ring_rank and whether it is the node's
 * first in *first. 0, or -EINVAL with why (cap bytes) filled. */
int nodeloaders_plan(batchjob *bj, int rank, int *ring_rank, bool *first, char *why, size_t cap);

/* Starts bj's dataloader_num_workers loaders (the bertd-loader beside exe,
 * this worker's path as srun started it) for the job file job_path, each
 * logging to <job file's directory>/logs/loader-<tag>-<i>.log. 0, or a
 * negative errno with why filled (those started are stopped). */
int nodeloaders_start(nodeloaders *nl, const batchjob *bj, const char *exe, const char *job_path, char *why,
		      size_t cap);

/* Whether every loader started is still running: 0, or -EPIPE with why
 * filled for the first that ended (a loader ends only when stopped, so any
 * end is a failure: the node's ranks would wait for batches forever). */
int nodeloaders_check(nodeloaders *nl, char *why, size_t cap);

/* SIGTERM to the loaders, waits for them (bounded, then SIGKILL) and
 * removes the node's ring. No-op when none were started. */
void nodeloaders_stop(nodeloaders *nl);

#endif
