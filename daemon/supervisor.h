/* supervisor — runs jobs and dataset preparations as child processes and
 * drives their states in the store. Lives on the event loop thread only:
 * it registers each child's pidfd and socket with the loop, and its
 * supervisor_tick is called from the daemon's one-second cron.
 *
 * Per job: G bertd-worker processes (rank 0..G-1, one per device) and L
 * bertd-loader processes, all in the job directory
 * <state_dir>/jobs/<id>/ (job.json, logs/, checkpoints/, export/). A worker
 * or loader that dies takes the job down; a retryable failure restarts the
 * job from its last checkpoint (up to retry_policy.max_restarts). So does a
 * stall: workers that report nothing (no message of any type) for
 * stall_timeout_ms are killed and the attempt fails with "rank N made no
 * progress for T s". A loss or gradient norm that is not finite fails the
 * job at once (a restart would repeat it).
 *
 * Per dataset: one bertd-prepare process writing <data_root>/datasets/<name>.
 *
 * The supervisor never blocks the loop except in supervisor_shutdown.
 */
#ifndef BERTD_DAEMON_SUPERVISOR_H
#define BERTD_DAEMON_SUPERVISOR_H

#include <stddef.h>

#include "daemon/devices.h"
#include "daemon/loop.h"
#include "daemon/store.h"

typedef struct supervisor supervisor;

/* How long a job's workers may say nothing before their first step (model
 * build, checkpoint load, dataset open, NCCL set-up), when stall_timeout_ms
 * is shorter: 10 minutes, the slow_start rule's default (docs/diagnosis.md). */
#define SUPERVISOR_STARTUP_ALLOWANCE_MS 600000

typedef struct supervisor_config {
	const char *state_dir;
	const char *bin_dir;          /* where bertd-worker, -loader, -prepare are */
	const char *dataset_root;     /* datasets are created under <dataset_root>/datasets */
	int stop_timeout_ms;          /* grace between a stop request and SIGKILL */
	int stall_timeout_ms;         /* a job whose workers report nothing this long fails the
				       * attempt as stalled (retried); before the first step the
				       * allowance is at least SUPERVISOR_STARTUP_ALLOWANCE_MS;
				       * <= 0: 300000 */
	bool hold_queue;              /* true: start no queued job (datasets still prepare) */
	int prepare_concurrency;      /* bertd-prepare processes at once, oldest dataset first;
				       * the others wait (preparing, phase "queued": the
				       * API's state "queued"); 0 = one per online CPU, < 0 = half, >= 1 */
	const char *pass_env;         /* what children inherit of the daemon's environment
				       * (childenv.h); NULL = nothing */
	/* multi-node jobs (daemon/cluster.h, docs/multinode.md) */
	const char *slurm_srun;       /* "" or NULL: multi-node jobs fail at start */
	const char *slurm_conf;       /* "" or NULL: Slurm's default */
	const char *relay_host;       /* "" or NULL: gethostname() */
	const char *multinode_comm;   /* "auto" (NULL, ""): ranks on one host share memory, else the
				       * network backend; "net": the network backend always */
	int slurm_immediate_s;
	int relay_timeout_ms;         /* the relay's keepalive bound; <= 0: CLUSTER_RELAY_TIMEOUT_MS */
	bool slurm_gpus_per_node;     /* srun --gpus-per-node for GPU jobs (the cluster has GPU GRES) */
} supervisor_config;

/* devices is copied. *out caller-owned (supervisor_destroy). -EINVAL for a
 * pass_env childenv_pass_parse refuses (config_load has checked it).
 * Also recovers: jobs the store shows as starting/running/restarting are
 * marked restarting ("daemon restarted") and will resume from their last
 * checkpoint; stopping ones become canceled; datasets still preparing are
 * prepared again from scratch. */
int supervisor_create(supervisor **out, const supervisor_config *cfg, loop *lp, store *st,
		      const device *devices, size_t ndev);

/* Starts what can start, stops what was asked to stop, enforces run-time
 * limits. Called once a second, and whenever the API signals a change. */
void supervisor_tick(supervisor *sv);

/* Device table with the job (or NULL) on each, for GET /v1/devices.
 * Returns the count; *devs and *job_ids point into the supervisor (valid
 * until the next tick; loop thread only). */
size_t supervisor_devices(supervisor *sv, const device **devs, const char *const **job_ids);

/* Stops every running job (stop request, grace period, then SIGKILL) and
 * puts them back to queued so the next start resumes them; waits for every
 * child, reading what the workers report meanwhile (the stop checkpoint's
 * row). Blocks up to about stop_timeout_ms. */
void supervisor_shutdown(supervisor *sv);
/* The exit that leaves jobs running (SIGQUIT; a restart or an upgrade):
 * the jobs' workers and loaders are let go, untouched, still running in
 * the store, for the next daemon to adopt (daemon/adopt.c); dataset
 * preparations are stopped as supervisor_shutdown stops them. */
void supervisor_shutdown_detach(supervisor *sv);
void supervisor_destroy(supervisor *sv);

/* A configuration reload (daemon/reload.h): the stop grace, the stall
 * timeout (both ms, <= 0 = the default) and whether the queue is held, for
 * whatever the supervisor does from now on (a stop already under way keeps
 * its deadline). Loop thread only, like every supervisor call. */
void supervisor_set_limits(supervisor *sv, int stop_timeout_ms, int stall_timeout_ms, bool hold_queue);

#endif
