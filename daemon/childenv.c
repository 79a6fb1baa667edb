/* childenv — see childenv.h.
 *
 * The default pass_env (CHILDENV_DEFAULT_PASS) is what the libraries a
 * worker loads read from the environment, and nothing generic:
 *   LD_LIBRARY_PATH  where a box keeps libcudart, libnccl, libcublas outside
 *                    the loader's default path (/usr/local/cuda/lib64, a pip
 *                    wheel's lib directory); the daemon itself may start
 *                    only because of it, and so then do its children
 *   NCCL_*           NCCL's tuning: NCCL_SOCKET_IFNAME, NCCL_IB_HCA,
 *                    NCCL_DEBUG, NCCL_P2P_LEVEL, NCCL_TOPO_FILE, ...
 *   FI_*             libfabric, under NCCL's AWS EFA plugin (FI_PROVIDER,
 *                    FI_EFA_USE_DEVICE_RDMA)
 *   UCX_*            UCX, under NCCL's UCX plugin (UCX_NET_DEVICES)
 *   CUDA_*           the CUDA runtime and driver: CUDA_MODULE_LOADING,
 *                    CUDA_CACHE_PATH, CUDA_MPS_PIPE_DIRECTORY,
 *                    CUDA_LAUNCH_BLOCKING (less the two bertd sets)
 *   CUBLAS_*, CUBLASLT_*  cuBLAS and cuBLASLt (CUBLAS_WORKSPACE_CONFIG,
 *                    CUBLASLT_LOG_LEVEL)
 * Left out on purpose: HOME, USER, LANG and the like (no worker reads them),
 * LD_PRELOAD (code injected into every worker should be asked for by name),
 * OMP_* (bertd sets the thread count; OMP_PROC_BIND and friends are the
 * operator's to add), NOTIFY_SOCKET (the daemon's, not its children's).
 */
#include "daemon/childenv.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Set by the supervisor for its children: never taken from the daemon. */
static const char *const reserved[] = {"PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
				       "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
#define N_RESERVED (sizeof reserved / sizeof reserved[0])
#define BERTD_PREFIX "BERTD_"

/* bertd's switches of the CUDA path, passed to workers by name (docs/cuda.md). */
static const char *const worker_switches[] = {"BERTD_GEMM", "BERTD_ATTENTION", "BERTD_DDP_OVERLAP",
					      "BERTD_NCCL_PATH", "BERTD_LEVER_LN_VEC",
					      "BERTD_LEVER_OPT_ZERO", "BERTD_LEVER_LT_TUNE",
					      "BERTD_LEVER_VOCAB_PAD",
					      "BERTD_LEVER_FLASH2", "BERTD_LEVER_GRAPH",
					      "BERTD_LEVER_GELU_EPI"};
#define N_SWITCHES (sizeof worker_switches / sizeof worker_switches[0])

static size_t name_len(const char *var)
{
	const char *eq = strchr(var, '=');
	return eq ? (size_t)(eq - var) : strlen(var);
}

static bool is_reserved(const char *name, size_t n)
{
	if (n >= strlen(BERTD_PREFIX) && memcmp(name, BERTD_PREFIX, strlen(BERTD_PREFIX)) == 0)
		return true;
	for (size_t i = 0; i < N_RESERVED; i++)
		if (strlen(reserved[i]) == n && memcmp(reserved[i], name, n) == 0)
			return true;
	return false;
}

static bool entry_matches(const char *pat, const char *name, size_t n)
{
	size_t pl = strlen(pat);
	if (pat[pl - 1] == '*')
		return n >= pl - 1 && memcmp(pat, name, pl - 1) == 0;
	return n == pl && memcmp(pat, name, n) == 0;
}

static int check_entry(const char *e, char *err, size_t errlen)
{
	if (strcmp(e, "*") == 0) {
		snprintf(err, errlen, "\"*\" would pass the daemon's whole environment; "
			 "list variable names or PREFIX* patterns");
		return -EINVAL;
	}
	bool ok = !isdigit((unsigned char)e[0]);
	for (const char *c = e; *c && ok; c++)
		ok = *c == '_' || isalnum((unsigned char)*c) || (*c == '*' && c[1] == 0);
	if (!ok) {
		snprintf(err, errlen, "\"%s\" is not a variable name or a PREFIX* pattern "
			 "(entries are ':'-separated, e.g. LD_LIBRARY_PATH:NCCL_*)", e);
		return -EINVAL;
	}
	if (strncmp(e, BERTD_PREFIX, strlen(BERTD_PREFIX)) == 0) {
		snprintf(err, errlen, "\"%s\": BERTD_ variables are bertd's own settings and never "
			 "pass (BERTD_GEMM, BERTD_ATTENTION, BERTD_DDP_OVERLAP, BERTD_NCCL_PATH reach workers without "
			 "this)", e);
		return -EINVAL;
	}
	if (is_reserved(e, strlen(e))) {
		snprintf(err, errlen, "\"%s\" is set by bertd itself for each process it starts; "
			 "it cannot be passed", e);
		return -EINVAL;
	}
	return 0;
}

int childenv_pass_parse(childenv_pass *out, const char *list, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	if (strlen(list) >= sizeof out->buf) {
		snprintf(err, errlen, "the list is too long (at most %zu bytes)", sizeof out->buf - 1);
		return -EINVAL;
	}
	memcpy(out->buf, list, strlen(list) + 1);
	char *e = out->buf;
	while (e) {
		char *colon = strchr(e, ':');
		if (colon)
			*colon = 0;
		if (*e) {
			int rc = check_entry(e, err, errlen);
			if (rc < 0)
				return rc;
			if (out->n == CHILDENV_MAX_PATTERNS) {
				snprintf(err, errlen, "at most %d entries", CHILDENV_MAX_PATTERNS);
				return -EINVAL;
			}
			out->pat[out->n++] = e;
		}
		e = colon ? colon + 1 : NULL;
	}
	return 0;
}

bool childenv_passes(const childenv_pass *p, const char *var)
{
	size_t n = name_len(var);
	if (n == 0 || is_reserved(var, n))
		return false;
	for (size_t i = 0; i < p->n; i++)
		if (entry_matches(p->pat[i], var, n))
			return true;
	return false;
}

/* A childenv with room for bertd's own assignments, the worker switches
 * and every entry of src. */
static childenv *alloc_env(char *const src[])
{
	size_t n = 0;
	while (src && src[n])
		n++;
	return calloc(1, sizeof(childenv) + (CHILDENV_OWN + N_SWITCHES + n + 1) * sizeof(char *));
}

/* Appends the entries of src that pass after the ne already in envp, and
 * the closing NULL; returns the new count (the NULL not counted). */
static size_t add_passed(childenv *ce, size_t ne, const childenv_pass *pass, char *const src[])
{
	for (size_t i = 0; src && src[i]; i++)
		if (strchr(src[i], '=') && childenv_passes(pass, src[i]))
			ce->envp[ne++] = src[i];
	ce->envp[ne] = NULL;
	return ne;
}

static bool has_var(char *const envp[], const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 0; envp[i]; i++)
		if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=')
			return true;
	return false;
}

int childenv_worker(childenv **out, const childenv_pass *pass, const device *d, int threads,
		    char *const src[])
{
	childenv *ce = alloc_env(src);
	if (!ce)
		return -ENOMEM;
	/* Which GPU: bertd numbers devices by NVML, CUDA by its own order
	 * (fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID), so NVML's index
	 * in CUDA_VISIBLE_DEVICES can name another physical GPU. The UUID NVML
	 * reported names exactly the GPU the scheduler chose, whatever order
	 * either library enumerates in (NVML's own order is not promised to be
	 * stable), so it goes first. Without one (an NVML too old for
	 * nvmlDeviceGetUUID, or the call failed) the index is right only in PCI
	 * bus order, NVML's enumeration order, hence CUDA_DEVICE_ORDER always:
	 * it also makes any ordinal the worker or its libraries print mean what
	 * nvidia-smi shows. */
	if (d->kind == DEVICE_CUDA && d->uuid[0])
		snprintf(ce->own[0], sizeof ce->own[0], "CUDA_VISIBLE_DEVICES=%s", d->uuid);
	else
		snprintf(ce->own[0], sizeof ce->own[0], "CUDA_VISIBLE_DEVICES=%d",
			 d->kind == DEVICE_CUDA ? d->index : -1);
	snprintf(ce->own[1], sizeof ce->own[1], "CUDA_DEVICE_ORDER=PCI_BUS_ID");
	snprintf(ce->own[2], sizeof ce->own[2], "OMP_NUM_THREADS=%d", threads);
	snprintf(ce->own[3], sizeof ce->own[3], "OPENBLAS_NUM_THREADS=%d", threads);
	snprintf(ce->own[4], sizeof ce->own[4], "PATH=/usr/bin:/bin");
	size_t ne = 0;
	for (size_t i = 0; i < CHILDENV_OWN - 1; i++) /* the last: NCCL_SOCKET_IFNAME, below */
		ce->envp[ne++] = ce->own[i];
	/* The operator's way back to the plain CUDA paths if a fast one
	 * misbehaves on their GPUs (docs/cuda.md): always passed, by name. */
	for (size_t s = 0; s < N_SWITCHES; s++) {
		size_t n = strlen(worker_switches[s]);
		for (size_t i = 0; src && src[i]; i++) {
			if (strncmp(src[i], worker_switches[s], n) == 0 && src[i][n] == '=') {
				ce->envp[ne++] = src[i];
				break;
			}
		}
	}
	ne = add_passed(ce, ne, pass, src);
	/* NCCL's bootstrap of a job on this machine stays on loopback. NCCL's
	 * interface search skips lo and binds the host's first other interface
	 * (the ENA on a p3), which the unit's IPAddressAllow=localhost drops:
	 * every multi-GPU job would time out in ncclCommInitRank. Ranks on one
	 * machine move their data over NVLink/PCIe/shared memory anyway; only
	 * the bootstrap and the proxy's connections use the socket. The
	 * operator's own NCCL_SOCKET_IFNAME (through pass_env) wins. Multi-node
	 * ranks are started by srun with the helper environment and never get
	 * this. */
	if (!has_var(ce->envp, "NCCL_SOCKET_IFNAME")) {
		snprintf(ce->own[CHILDENV_OWN - 1], sizeof ce->own[0], "NCCL_SOCKET_IFNAME=lo");
		ce->envp[ne++] = ce->own[CHILDENV_OWN - 1];
		ce->envp[ne] = NULL;
	}
	*out = ce;
	return 0;
}

int childenv_helper(childenv **out, const childenv_pass *pass, char *const src[])
{
	childenv *ce = alloc_env(src);
	if (!ce)
		return -ENOMEM;
	snprintf(ce->own[0], sizeof ce->own[0], "PATH=/usr/bin:/bin");
	ce->envp[0] = ce->own[0];
	add_passed(ce, 1, pass, src);
	*out = ce;
	return 0;
}
