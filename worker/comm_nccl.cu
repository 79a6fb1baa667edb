/* comm_nccl — the NCCL backend of comm.h for CUDA workers (one process per
 * GPU, as in nccl-tests and llm.c's multi-GPU trainer).
 *
 * Bootstrap without MPI: rank 0 makes the ncclUniqueId and hands its bytes to
 * the caller's send callback (the worker relays it through the daemon); the
 * other ranks get them from recv. The communicator is created non-blocking
 * (config.blocking = 0) so that init and every later wait can be bounded:
 * we poll ncclCommGetAsyncError against a deadline and ncclCommAbort when it
 * passes or NCCL reports an error — a lost peer therefore costs at most
 * timeout_ms, never a hang.
 *
 * Gradients are reduced in buckets on a dedicated comm stream, ordered with
 * events (never device-wide syncs): record on the compute stream after the
 * backward has produced a bucket, cudaStreamWaitEvent on the comm stream,
 * (convert to bf16/fp16), ncclAllReduce(ncclAvg), (convert back), and one
 * event the compute stream waits on before the optimizer.
 *
 * This file must never block the host without a deadline, and never touch
 * the compute stream except through events.
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "common/log.h"
#include "kernels/cuda/kernels_cuda.h"
}
#include "worker/comm.h"
#include "worker/comm_backend.h"

typedef struct comm_nccl {
    comm base;
    ncclComm_t nc;
    int device;
    comm_dtype dtype;
    int timeout_ms;
    int dead;                  /* aborted: every call returns -EPIPE */
    cudaStream_t stream;       /* the comm stream */
    cudaEvent_t ready;         /* recorded on the compute stream per bucket */
    cudaEvent_t done;          /* recorded on the comm stream after each bucket */
    void *lowp;                /* (lowp_cap) bf16/fp16 staging, stream-ordered alloc */
    size_t lowp_cap;
    void *scratch;             /* (scratch_cap bytes) device side of f64/broadcast/barrier */
    void *host;                /* (scratch_cap bytes) page-locked host side of the same: a
                                * copy to or from pageable memory would block the host until
                                * the collective ends, before any deadline applies */
    size_t scratch_cap;
} comm_nccl;

static int nccl_allreduce_mean(comm *c, float *buf, size_t n);
static int nccl_allreduce_sum_f64(comm *c, double *vals, int n);
static int nccl_barrier(comm *c);
static int nccl_broadcast(comm *c, void *buf, size_t bytes, int root);
static void nccl_abort(comm *c, int err);
static void nccl_destroy(comm *c);

static const comm_ops nccl_ops = {
    "nccl", nccl_allreduce_mean, nccl_allreduce_sum_f64, nccl_barrier, nccl_broadcast, nccl_abort, nccl_destroy,
};

/* Both report file:line, the call and the library's own message, then take
 * the error path; they need `int rc` and an `out:` label in scope. */
#define CUDA_CHECK(call)                                                                         \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            log_error("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));       \
            rc = e_ == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;                               \
            goto out;                                                                            \
        }                                                                                        \
    } while (0)

#define NCCL_CHECK(s, call)                                                                      \
    do {                                                                                         \
        ncclResult_t r_ = (call);                                                                \
        if (r_ != ncclSuccess && r_ != ncclInProgress) {                                         \
            log_error("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call, ncclGetErrorString(r_),   \
                      ncclGetLastError((s)->nc));                                                \
            rc = -EPIPE;                                                                         \
            goto out;                                                                            \
        }                                                                                        \
        if (r_ == ncclInProgress && (rc = settle(s, #call)) != 0)                                \
            goto out;                                                                            \
    } while (0)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

static void nap(void)
{
    struct timespec ts = {0, 100000L}; /* 0.1 ms: polling a device, not papering over a race */
    nanosleep(&ts, NULL);
}

static void kill_comm(comm_nccl *s, const char *why)
{
    if (s->dead)
        return;
    log_error("comm nccl: rank %d: %s; aborting the communicator", s->base.rank, why);
    s->dead = 1;
    if (s->nc)
        ncclCommAbort(s->nc);
    s->nc = NULL;
}

/* Waits (bounded) until the non-blocking communicator has finished the
 * call that returned ncclInProgress. 0, or -EPIPE after aborting it. */
static int settle(comm_nccl *s, const char *what)
{
    uint64_t deadline = now_ms() + (uint64_t)s->timeout_ms;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(s->nc, &st);
        if (r == ncclSuccess && st == ncclSuccess)
            return 0;
        if (r != ncclSuccess || st != ncclInProgress) {
            log_error("comm nccl: %s: %s (%s)", what, ncclGetErrorString(r != ncclSuccess ? r : st),
                      ncclGetLastError(s->nc));
            kill_comm(s, "NCCL error");
            return -EPIPE;
        }
        if (now_ms() >= deadline) {
            kill_comm(s, "NCCL operation did not complete in time (peer lost?)");
            return -EPIPE;
        }
        nap();
    }
}

/* Waits (bounded) until everything queued on the comm stream has run, while
 * watching NCCL for asynchronous errors (a dead peer). 0 or -EPIPE. */
static int wait_stream(comm_nccl *s)
{
    uint64_t deadline = now_ms() + (uint64_t)s->timeout_ms;
    for (;;) {
        cudaError_t e = cudaStreamQuery(s->stream);
        if (e == cudaSuccess) {
            /* a drained stream is not a successful collective: after an
             * error NCCL promises nothing about what was enqueued */
            ncclResult_t st = ncclSuccess;
            if (ncclCommGetAsyncError(s->nc, &st) != ncclSuccess ||
                (st != ncclSuccess && st != ncclInProgress)) {
                log_error("comm nccl: async error: %s (%s)", ncclGetErrorString(st),
                          ncclGetLastError(s->nc));
                kill_comm(s, "NCCL reported an asynchronous error");
                return -EPIPE;
            }
            return 0;
        }
        if (e != cudaErrorNotReady) {
            log_error("comm nccl: comm stream: %s", cudaGetErrorString(e));
            kill_comm(s, "CUDA error on the comm stream");
            return -EPIPE;
        }
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(s->nc, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            log_error("comm nccl: async error: %s (%s)", ncclGetErrorString(st), ncclGetLastError(s->nc));
            kill_comm(s, "NCCL reported an asynchronous error");
            return -EPIPE;
        }
        if (now_ms() >= deadline) {
            kill_comm(s, "collective did not complete in time (peer lost?)");
            return -EPIPE;
        }
        nap();
    }
}

static int ensure_scratch(comm_nccl *s, size_t bytes)
{
    int rc = 0;
    if (bytes <= s->scratch_cap)
        return 0;
    /* stream-ordered: earlier users of the old buffer on the comm stream
     * finish before it is freed; every user of the host side waited for its
     * copies (wait_stream) before returning */
    if (s->scratch)
        CUDA_CHECK(cudaFreeAsync(s->scratch, s->stream));
    if (s->host)
        CUDA_CHECK(cudaFreeHost(s->host));
    s->scratch = NULL;
    s->host = NULL;
    s->scratch_cap = 0;
    CUDA_CHECK(cudaMallocAsync(&s->scratch, bytes, s->stream));
    CUDA_CHECK(cudaMallocHost(&s->host, bytes));
    s->scratch_cap = bytes;
out:
    return rc;
}

static int bucket_enqueue(comm_nccl *s, float *dev_buf, size_t n)
{
    int rc = 0;
    if (s->dtype == COMM_FP32) {
        NCCL_CHECK(s, ncclAllReduce(dev_buf, dev_buf, n, ncclFloat32, ncclAvg, s->nc, s->stream));
        goto out;
    }
    if (n > s->lowp_cap) {
        if (s->lowp)
            CUDA_CHECK(cudaFreeAsync(s->lowp, s->stream));
        s->lowp = NULL;
        s->lowp_cap = 0;
        CUDA_CHECK(cudaMallocAsync(&s->lowp, n * 2, s->stream));
        s->lowp_cap = n;
    }
    {
        /* kernels/cuda's cast (the same one the model uses): fp32 -> 16 bits,
         * reduce, back */
        kdtype lt = s->dtype == COMM_BF16 ? KDT_BF16 : KDT_F16;
        ncclDataType_t nt = s->dtype == COMM_BF16 ? ncclBfloat16 : ncclFloat16;
        cuda_cast(s->lowp, lt, dev_buf, KDT_F32, n, s->stream);
        NCCL_CHECK(s, ncclAllReduce(s->lowp, s->lowp, n, nt, ncclAvg, s->nc, s->stream));
        cuda_cast(dev_buf, KDT_F32, s->lowp, lt, n, s->stream);
    }
out:
    if (rc == -EIO)
        kill_comm(s, "CUDA error while enqueueing a bucket");
    return rc == 0 ? 0 : -EPIPE;
}

extern "C" int comm_nccl_bucket_start(comm *c, float *dev_buf, size_t n, void *compute_stream)
{
    comm_nccl *s = (comm_nccl *)c;
    int rc = 0;
    if (c->ops != &nccl_ops)
        return -EINVAL;
    if (s->dead)
        return -EPIPE;
    CUDA_CHECK(cudaSetDevice(s->device));
    CUDA_CHECK(cudaEventRecord(s->ready, (cudaStream_t)compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->ready, 0));
    rc = bucket_enqueue(s, dev_buf, n);
    if (rc != 0) {
        kill_comm(s, "enqueueing a bucket failed"); /* NCCL: abort after an error */
        return rc;
    }
    CUDA_CHECK(cudaEventRecord(s->done, s->stream));
out:
    if (rc != 0 && !s->dead)
        kill_comm(s, "CUDA error");
    return rc == 0 ? 0 : -EPIPE;
}

extern "C" int comm_nccl_drain(comm *c)
{
    comm_nccl *s = (comm_nccl *)c;
    if (c->ops != &nccl_ops)
        return -EINVAL;
    if (s->dead)
        return -EPIPE;
    if (cudaSetDevice(s->device) != cudaSuccess) {
        kill_comm(s, "cudaSetDevice failed");
        return -EPIPE;
    }
    return wait_stream(s);
}

extern "C" int comm_nccl_buckets_wait(comm *c, void *compute_stream)
{
    comm_nccl *s = (comm_nccl *)c;
    int rc = 0;
    if (c->ops != &nccl_ops)
        return -EINVAL;
    if (s->dead)
        return -EPIPE;
    CUDA_CHECK(cudaSetDevice(s->device));
    /* done was re-recorded after each bucket; waiting on its last record
     * covers all of them (one stream) */
    CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)compute_stream, s->done, 0));
    {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(s->nc, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            log_error("comm nccl: async error: %s (%s)", ncclGetErrorString(st), ncclGetLastError(s->nc));
            kill_comm(s, "NCCL reported an asynchronous error");
            return -EPIPE;
        }
    }
out:
    if (rc != 0)
        kill_comm(s, "CUDA error");
    return rc == 0 ? 0 : -EPIPE;
}

static int nccl_allreduce_mean(comm *c, float *buf, size_t n)
{
    comm_nccl *s = (comm_nccl *)c;
    if (s->dead)
        return -EPIPE;
    if (n == 0)
        return 0;
    int rc = comm_nccl_bucket_start(c, buf, n, NULL);
    return rc ? rc : wait_stream(s);
}

static int nccl_allreduce_sum_f64(comm *c, double *vals, int n)
{
    comm_nccl *s = (comm_nccl *)c;
    int rc = 0;
    size_t bytes = (size_t)n * sizeof(double);
    if (s->dead)
        return -EPIPE;
    if (n == 0)
        return 0;
    CUDA_CHECK(cudaSetDevice(s->device));
    rc = ensure_scratch(s, bytes);
    if (rc != 0)
        goto out;
    memcpy(s->host, vals, bytes);
    CUDA_CHECK(cudaMemcpyAsync(s->scratch, s->host, bytes, cudaMemcpyHostToDevice, s->stream));
    NCCL_CHECK(s, ncclAllReduce(s->scratch, s->scratch, (size_t)n, ncclFloat64, ncclSum, s->nc, s->stream));
    CUDA_CHECK(cudaMemcpyAsync(s->host, s->scratch, bytes, cudaMemcpyDeviceToHost, s->stream));
    rc = wait_stream(s);
    if (rc == 0)
        memcpy(vals, s->host, bytes);
out:
    if (rc != 0 && !s->dead)
        kill_comm(s, "error in allreduce_sum_f64");
    return rc == 0 ? 0 : -EPIPE;
}

static int nccl_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    comm_nccl *s = (comm_nccl *)c;
    int rc = 0;
    if (s->dead)
        return -EPIPE;
    if (bytes == 0)
        return 0;
    CUDA_CHECK(cudaSetDevice(s->device));
    rc = ensure_scratch(s, bytes);
    if (rc != 0)
        goto out;
    if (c->rank == root) {
        memcpy(s->host, buf, bytes);
        CUDA_CHECK(cudaMemcpyAsync(s->scratch, s->host, bytes, cudaMemcpyHostToDevice, s->stream));
    }
    NCCL_CHECK(s, ncclBroadcast(s->scratch, s->scratch, bytes, ncclUint8, root, s->nc, s->stream));
    if (c->rank != root)
        CUDA_CHECK(cudaMemcpyAsync(s->host, s->scratch, bytes, cudaMemcpyDeviceToHost, s->stream));
    rc = wait_stream(s);
    if (rc == 0 && c->rank != root)
        memcpy(buf, s->host, bytes);
out:
    if (rc != 0 && !s->dead)
        kill_comm(s, "error in broadcast");
    return rc == 0 ? 0 : -EPIPE;
}

/* NCCL has no barrier: a one-element allreduce completes on a rank only
 * after every rank has contributed. */
static int nccl_barrier(comm *c)
{
    comm_nccl *s = (comm_nccl *)c;
    int rc = 0;
    if (s->dead)
        return -EPIPE;
    CUDA_CHECK(cudaSetDevice(s->device));
    rc = ensure_scratch(s, sizeof(float));
    if (rc != 0)
        goto out;
    NCCL_CHECK(s, ncclAllReduce(s->scratch, s->scratch, 1, ncclFloat32, ncclSum, s->nc, s->stream));
    rc = wait_stream(s);
out:
    if (rc != 0 && !s->dead)
        kill_comm(s, "error in barrier");
    return rc == 0 ? 0 : -EPIPE;
}

static void nccl_abort(comm *c, int err)
{
    comm_nccl *s = (comm_nccl *)c;
    char why[64];
    snprintf(why, sizeof(why), "local error %d", -err);
    kill_comm(s, why);
}

static void nccl_destroy(comm *c)
{
    comm_nccl *s = (comm_nccl *)c;
    cudaSetDevice(s->device);
    if (s->nc && !s->dead) {
        /* finalize flushes outstanding work; bounded like everything else */
        ncclResult_t r = ncclCommFinalize(s->nc);
        int rc = 0;
        if (r == ncclInProgress)
            rc = settle(s, "ncclCommFinalize");
        else if (r != ncclSuccess)
            rc = -EPIPE;
        if (rc == 0 && s->nc)
            ncclCommDestroy(s->nc);
        else if (s->nc)
            kill_comm(s, "finalize failed");
        s->nc = NULL;
    }
    if (s->stream) {
        if (s->lowp)
            cudaFreeAsync(s->lowp, s->stream);
        if (s->scratch)
            cudaFreeAsync(s->scratch, s->stream);
        if (!s->dead)
            cudaStreamSynchronize(s->stream);
        cudaStreamDestroy(s->stream);
    }
    if (s->host)
        cudaFreeHost(s->host); /* after the stream: no copy uses it any more */
    if (s->ready)
        cudaEventDestroy(s->ready);
    if (s->done)
        cudaEventDestroy(s->done);
    free(s);
}


extern "C" int comm_create_nccl(comm **out, int rank, int world, int device, comm_dtype reduce_dtype,
                                comm_id_send_fn send, comm_id_recv_fn recv, void *ctx, int timeout_ms)
{
    int rc = 0, ndev = 0;
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    comm_nccl *s = NULL;
    if (world < 1 || rank < 0 || rank >= world || device < 0 || !send || !recv ||
        (reduce_dtype != COMM_FP32 && reduce_dtype != COMM_BF16 && reduce_dtype != COMM_FP16))
        return -EINVAL;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || device >= ndev) {
        log_error("comm nccl: rank %d: no CUDA device %d (%d found)", rank, device, ndev);
        return -ENODEV;
    }
    s = (comm_nccl *)calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->base.ops = &nccl_ops;
    s->base.rank = rank;
    s->base.world = world;
    s->device = device;
    s->dtype = reduce_dtype;
    s->timeout_ms = timeout_ms > 0 ? timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));

    memset(&id, 0, sizeof(id));
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            log_error("%s:%d: ncclGetUniqueId: %s", __FILE__, __LINE__, ncclGetErrorString(r));
            rc = -EIO;
            goto out;
        }
        rc = send(ctx, &id, sizeof(id));
    } else {
        rc = recv(ctx, &id, sizeof(id));
    }
    if (rc != 0) {
        log_error("comm nccl: rank %d: passing the unique id failed (%d)", rank, rc);
        goto out;
    }
    config.blocking = 0;
    NCCL_CHECK(s, ncclCommInitRankConfig(&s->nc, world, id, rank, &config));
    /* non-blocking init may report success before the comm is usable */
    rc = settle(s, "ncclCommInitRankConfig");
    if (rc != 0)
        goto out;
    *out = &s->base;
    s = NULL;
out:
    if (s) {
        if (rc == -EPIPE && !s->dead)
            kill_comm(s, "init failed");
        nccl_destroy(&s->base);
    }
    return rc;
}
