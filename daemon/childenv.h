/* childenv — the environment of every process the daemon starts. A child
 * gets only what bertd chooses (proc_spawn passes nothing else):
 *   - what the supervisor sets itself: PATH, and for a worker
 *     CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, OMP_NUM_THREADS,
 *     OPENBLAS_NUM_THREADS, and NCCL_SOCKET_IFNAME=lo unless the operator
 *     passes their own;
 *   - for a worker, bertd's own switches of the CUDA path (BERTD_GEMM,
 *     BERTD_ATTENTION, BERTD_DDP_OVERLAP, the speed levers BERTD_LEVER_*,
 *     docs/cuda.md) when the daemon has them;
 *   - the variables of the daemon's environment that the pass_env setting
 *     names, so that a box's dynamic-loader path and NCCL / libfabric / CUDA
 *     tuning reach the workers while the rest of the daemon's environment
 *     (its BERTD_<KEY> settings, NOTIFY_SOCKET, whatever a shell carried)
 *     stays out.
 *
 * pass_env is a ':'-separated list of entries, each a variable name
 * (LD_LIBRARY_PATH) or a prefix pattern (NCCL_*: a prefix, then '*' as the
 * last character). The names the supervisor sets itself and every BERTD_*
 * name never pass, whatever the list says: naming one is an error, and a
 * pattern that covers one (CUDA_*, OMP_*) passes the rest of what it matches.
 *
 * This module never reads the process environment: callers hand it in.
 */
#ifndef BERTD_DAEMON_CHILDENV_H
#define BERTD_DAEMON_CHILDENV_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/devices.h"

/* The default pass_env, argued in childenv.c. */
#define CHILDENV_DEFAULT_PASS "LD_LIBRARY_PATH:NCCL_*:FI_*:UCX_*:CUDA_*:CUBLAS_*:CUBLASLT_*"
#define CHILDENV_MAX_PATTERNS 64

typedef struct childenv_pass {
	char buf[1024];                          /* the list, each ':' made a NUL */
	const char *pat[CHILDENV_MAX_PATTERNS];  /* entries, pointers into buf */
	size_t n;
} childenv_pass;

/* Parses a pass_env list into *out (which must not be copied afterwards: it
 * points into itself). Empty entries are skipped; an empty list passes
 * nothing. Returns 0, or -EINVAL with a one-line reason in err naming the
 * entry: not a name or PREFIX* (a character outside [A-Za-z0-9_], a '*'
 * before the end, a leading digit), a lone '*' (the daemon's whole
 * environment), a name bertd sets itself or a BERTD_ name, too many entries,
 * too long. */
int childenv_pass_parse(childenv_pass *out, const char *list, char *err, size_t errlen);

/* Whether the variable var ("NAME=value", or a bare NAME) passes: an entry of
 * p matches its name and it is not one bertd sets itself or a BERTD_ name. */
bool childenv_passes(const childenv_pass *p, const char *var);

#define CHILDENV_OWN 6 /* assignments bertd makes itself, at most */

typedef struct childenv {
	char own[CHILDENV_OWN][128]; /* "NAME=value" that bertd sets */
	char *envp[];                /* NULL-ended: own ones, then passed ones of src */
} childenv;

/* The environment of the bertd-worker on device d: PATH=/usr/bin:/bin,
 * CUDA_VISIBLE_DEVICES (d's NVML UUID, else its NVML index; -1 for a CPU
 * slot), CUDA_DEVICE_ORDER=PCI_BUS_ID, OMP_NUM_THREADS and
 * OPENBLAS_NUM_THREADS = threads, then BERTD_GEMM, BERTD_ATTENTION,
 * BERTD_DDP_OVERLAP and BERTD_LEVER_* where src has them, then what pass lets through of src
 * (a NULL-ended "NAME=value" array, usually environ), and last
 * NCCL_SOCKET_IFNAME=lo unless what passed sets it (a worker of this
 * machine's job; multi-node ranks get the helper environment through srun
 * and so NCCL's own interface choice). *out is caller-owned
 * (free()); its envp points into src, which must outlive it.
 * 0 or -ENOMEM. */
int childenv_worker(childenv **out, const childenv_pass *pass, const device *d, int threads,
		    char *const src[]);

/* The environment of a bertd-loader or bertd-prepare: PATH=/usr/bin:/bin,
 * then what pass lets through of src. Ownership as childenv_worker. */
int childenv_helper(childenv **out, const childenv_pass *pass, char *const src[]);

#endif
