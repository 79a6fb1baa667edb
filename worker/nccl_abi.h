/* nccl_abi — the part of NCCL's C ABI that bertd uses, declared here so
 * that a CUDA build needs no nccl.h: NCCL is opened at run time
 * (common/nccl_lib.h) and its functions are called through nccl_api.
 * The values are NCCL's own (stable since 2.x; nccl.h of 2.21 and 2.28
 * agree, and tests/cudasim/nccl.cpp checks them against the toolkit's
 * nccl.h at compile time). The config struct is NCCL 2.14's layout
 * (ncclConfig_v21400); newer NCCLs read a config by its size and version,
 * so an older layout stays valid. bertd needs NCCL 2.14 or newer
 * (ncclCommInitRankConfig, non-blocking communicators).
 *
 * Declarations only: no NCCL types leak beyond worker/comm_nccl.cu.
 */
#ifndef BERTD_WORKER_NCCL_ABI_H
#define BERTD_WORKER_NCCL_ABI_H

#include <limits.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nccl_comm_opaque *nccl_comm_t; /* ncclComm_t */
typedef struct {
    char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} nccl_unique_id;         /* ncclUniqueId */

typedef int nccl_result; /* ncclResult_t */
enum {
    NCCL_OK = 0,                  /* ncclSuccess */
    NCCL_UNHANDLED_CUDA_ERROR = 1,
    NCCL_SYSTEM_ERROR = 2,
    NCCL_INTERNAL_ERROR = 3,
    NCCL_INVALID_ARGUMENT = 4,
    NCCL_INVALID_USAGE = 5,
    NCCL_REMOTE_ERROR = 6,
    NCCL_IN_PROGRESS = 7,         /* ncclInProgress */
};

typedef int nccl_dtype; /* ncclDataType_t */
enum { NCCL_UINT8 = 1, NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9 };

typedef int nccl_redop; /* ncclRedOp_t */
enum { NCCL_SUM = 0, NCCL_AVG = 4 };

#define NCCL_ABI_VERSION 21400 /* NCCL_VERSION(2, 14, 0): the config layout below */
#define NCCL_ABI_CONFIG_MAGIC 0xcafebeefu
#define NCCL_ABI_UNDEF_INT INT_MIN /* NCCL_CONFIG_UNDEF_INT */

typedef struct nccl_config { /* ncclConfig_v21400 */
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
} nccl_config;

#define NCCL_ABI_CONFIG_INITIALIZER                                                              \
    {                                                                                            \
        sizeof(nccl_config), NCCL_ABI_CONFIG_MAGIC, NCCL_ABI_VERSION, NCCL_ABI_UNDEF_INT,        \
            NCCL_ABI_UNDEF_INT, NCCL_ABI_UNDEF_INT, NCCL_ABI_UNDEF_INT, NULL                     \
    }

/* The entry points bertd calls, resolved by name (the symbol is the field
 * name). stream arguments are cudaStream_t. */
typedef struct nccl_api {
    nccl_result (*ncclGetVersion)(int *version);
    nccl_result (*ncclGetUniqueId)(nccl_unique_id *id);
    nccl_result (*ncclCommInitRankConfig)(nccl_comm_t *comm, int nranks, nccl_unique_id id, int rank,
                                          nccl_config *config);
    nccl_result (*ncclCommGetAsyncError)(nccl_comm_t comm, nccl_result *async_error);
    nccl_result (*ncclCommFinalize)(nccl_comm_t comm);
    nccl_result (*ncclCommDestroy)(nccl_comm_t comm);
    nccl_result (*ncclCommAbort)(nccl_comm_t comm);
    const char *(*ncclGetErrorString)(nccl_result r);
    const char *(*ncclGetLastError)(nccl_comm_t comm);
    nccl_result (*ncclAllReduce)(const void *send, void *recv, size_t count, nccl_dtype type, nccl_redop op,
                                 nccl_comm_t comm, void *stream);
    nccl_result (*ncclBroadcast)(const void *send, void *recv, size_t count, nccl_dtype type, int root,
                                 nccl_comm_t comm, void *stream);
    nccl_result (*ncclGroupStart)(void);
    nccl_result (*ncclGroupEnd)(void);
} nccl_api;

/* The names above, in field order (for the resolver and its messages). */
#define NCCL_API_NAMES                                                                           \
    "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommGetAsyncError",      \
        "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclGetErrorString",            \
        "ncclGetLastError", "ncclAllReduce", "ncclBroadcast", "ncclGroupStart", "ncclGroupEnd"

#ifdef BERTD_CUDASIM
/* tests/cudasim/nccl.cpp: the stand-in's function for name, or NULL (all of
 * them NULL with CUDASIM_NCCL=absent: a host without NCCL). */
void *cudasim_nccl_sym(const char *name);
/* How many NCCL groups have queued work in this process so far (tests). */
long cudasim_nccl_groups(void);
#endif

#ifdef __cplusplus
}
#endif

#endif
