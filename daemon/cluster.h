/* cluster — the Slurm side of multi-node jobs (docs/multinode.md): one
 * attempt's relay listener and token, srun's command line and environment,
 * the dataset check across nodes, and scancel. The supervisor wires these
 * into its runs; this module knows nothing of runs, children or the store.
 *
 * An attempt: bertd listens on a TCP port (the relay), starts
 *   srun --nodes=N --ntasks-per-node=G --immediate=S --job-name=<name>
 *        <bin>/bertd-worker --job <job.json>
 * (no --kill-on-bad-exit: a stopping job's ranks exit 6 while rank 0 still
 * writes the stop checkpoint; a rank's bad exit reaches the daemon as its
 * "bye" or its lost connection, and the daemon ends the step)
 * with BERTD_RELAY=<host>:<port> and BERTD_RELAY_TOKEN=<token> in the
 * environment srun exports to every task; each rank connects back, says
 * {"type":"relay","token","rank","node","dataset_sha256"} and then speaks
 * the worker protocol of docs/formats.md over that connection.
 *
 * Never blocks: the listener is non-blocking; scancel is started detached.
 * The one exception is cluster_sinfo (the submit-time node check), which
 * waits for sinfo up to its deadline.
 */
#ifndef BERTD_DAEMON_CLUSTER_H
#define BERTD_DAEMON_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/childenv.h"

#define CLUSTER_TOKEN_HEX 64
#define CLUSTER_ARGV_MAX 16
#define CLUSTER_ENV_OWN 9
#define CLUSTER_RELAY_TIMEOUT_MS 30000

typedef struct cluster_attempt {
	int listen_fd;                        /* relay listener, -1 when closed */
	char addr[300];                       /* "host:port" the ranks connect to */
	char token[CLUSTER_TOKEN_HEX + 1];    /* per attempt, hex */
	char slurm_name[96];                  /* srun --job-name, unique per attempt; also the
					       * attempt's name in the fence file */
	char fence[1100];                     /* <job dir>/attempt once cluster_fence_open ran */
	int relay_timeout_ms;                 /* the relay's keepalive bound (common/keepalive.h) */
} cluster_attempt;

/* Opens the relay listener of an attempt of job_id: binds relay_host when
 * it is a numeric address (else every address) on an ephemeral port, makes
 * the token and the Slurm job name. relay_host "" or NULL: advertised as
 * gethostname(). relay_timeout_ms is CLUSTER_RELAY_TIMEOUT_MS (the caller
 * may change it before cluster_srun_env). 0, or a negative errno
 * (a->listen_fd stays -1). */
int cluster_attempt_open(cluster_attempt *a, const char *relay_host, const char *job_id);

/* A later daemon's relay of the same attempt (docs/multinode.md, "A
 * daemon restart"): a's addr, token, slurm_name, fence and
 * relay_timeout_ms as the attempt record has them; listens again on
 * addr's port (SO_REUSEADDR), bound as cluster_attempt_open binds
 * relay_host. -EADDRNOTAVAIL when relay_host now names another address
 * than addr's (the ranks would dial the old one); -EINVAL for a damaged
 * addr or token; else 0 or bind's negative errno. */
int cluster_attempt_reopen(cluster_attempt *a, const char *relay_host);

/* Closes the listener (idempotent). */
void cluster_attempt_close(cluster_attempt *a);

/* Whether token is the attempt's (compared in constant time). */
bool cluster_token_ok(const cluster_attempt *a, const char *token);

/* srun's argv (NULL-ended, pointing into out and the arguments).
 * gpus_per_node > 0 adds --gpus-per-node (a GPU job: Slurm hands each node's
 * task that many GPUs where the cluster schedules them as GRES). */
typedef struct cluster_argv {
	char num[5][128];
	char *argv[CLUSTER_ARGV_MAX];
} cluster_argv;
void cluster_srun_argv(cluster_argv *out, const char *srun, int nodes, int per_node, int gpus_per_node,
		       int immediate_s, const cluster_attempt *a, const char *worker_bin, const char *job_json);

/* srun's environment: base (a childenv's NULL-ended envp) plus
 * OMP_NUM_THREADS/OPENBLAS_NUM_THREADS (threads), BERTD_RELAY,
 * BERTD_RELAY_TOKEN, BERTD_RELAY_TIMEOUT_MS, SLURM_CONF (slurm_conf not
 * empty) and, once cluster_fence_open ran, BERTD_ATTEMPT and BERTD_FENCE
 * (worker/fence.h). *out is
 * caller-owned (free()), pointing into itself and base. 0 or -ENOMEM. */
typedef struct cluster_env {
	char own[CLUSTER_ENV_OWN][1100];
	char *envp[];
} cluster_env;
int cluster_srun_env(cluster_env **out, char *const base[], int threads, const cluster_attempt *a,
		     const char *slurm_conf);

/* The dataset check: every rank's node and its dataset's content digest
 * (worker/relay.c; "" = absent there). 0 when all agree; -ENOENT with why
 * naming a node that has none; -EINVAL with why naming the nodes on each
 * side (the first node's digest against the first that differs). */
int cluster_dataset_verdict(const char (*node)[64], const char (*sha)[CLUSTER_TOKEN_HEX + 1], int world,
			    const char *dataset, char *why, size_t cap);

/* The fence (docs/multinode.md, "The attempt fence"): <job_dir>/attempt
 * names the attempt whose ranks may put checkpoints and exports into place
 * (written atomically: tmp, fsync, rename). cluster_fence_open records the
 * path in a and names a's attempt there; cluster_fence_close names none
 * ("over"), so a rank of this attempt that is still running somewhere
 * (its node cut off) writes nothing into the job directory any more.
 * 0 or a negative errno. */
int cluster_fence_open(cluster_attempt *a, const char *job_dir);
int cluster_fence_close(const cluster_attempt *a);

/* Runs `scancel --name=<a->slurm_name>` (SLURM_CONF=slurm_conf) detached:
 * what is left of the attempt's Slurm job on any node is killed. The
 * daemon does not wait for it. */
void cluster_scancel(const cluster_attempt *a, const char *srun, const char *slurm_conf);

/* The submit-time node check (docs/multinode.md, "A node down at submit").
 * sinfo lists a node once per partition; each counts once. A node is down
 * when its state (sinfo's %t, flags such as "*" kept) is down, drained or
 * draining, failed or failing, in maintenance, unknown, future, invalid or
 * not responding ("*"); any other state (idle, mix, alloc, comp, boot,
 * powered off in a cloud "~", ...) is up: srun waits for busy nodes. */
#define CLUSTER_SINFO_TIMEOUT_MS 5000
typedef struct cluster_nodes {
	int total, up, ndown;
	char down[512]; /* "n2 (down*), n3 (drain)"; ", ..." when it does not fit */
	bool cut;       /* down ends with ", ..." */
} cluster_nodes;

/* Parses `sinfo -h -N -o "%N %t"` output. 0, or -EINVAL with why naming
 * the line that is not "<name> <state>". */
int cluster_sinfo_parse(const char *text, cluster_nodes *out, char *why, size_t cap);

/* Runs `sinfo -h -N -o "%N %t"` (the sinfo beside srun, else PATH's;
 * SLURM_CONF=slurm_conf when not empty) for at most timeout_ms and parses
 * it. 0; -ETIMEDOUT (sinfo killed); or another negative errno with why
 * saying what failed (sinfo's exit status and the first line it wrote to
 * stderr). Blocks its caller for up to timeout_ms. */
int cluster_sinfo(const char *srun, const char *slurm_conf, int timeout_ms, cluster_nodes *out, char *why,
		  size_t cap);

/* Slurm's own state of the attempt's job after srun ended badly: sacct
 * (where the cluster keeps accounting), else squeue's record of it, asked
 * again while it is still completing; at most timeout_ms in all (blocks
 * its caller that long at most). out: "NODE_FAIL", "CANCELLED",
 * "TIMEOUT", "FAILED (NonZeroExitCode)", ... or, past the deadline, the
 * last state seen. 0, or -ENOENT when Slurm has no record of it. */
#define CLUSTER_STATE_TIMEOUT_MS 2000
/* Whether state (cluster_slurm_state's out) is Slurm's own decision (node
 * failure, cancel, time limit, preemption, boot failure, deadline, OOM),
 * not the FAILED/COMPLETED that bertd ending srun itself leaves. */
bool cluster_state_own(const char *state);
int cluster_slurm_state(const cluster_attempt *a, const char *srun, const char *slurm_conf, int timeout_ms,
			char *out, size_t cap);

#endif
