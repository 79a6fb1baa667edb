/* comm_nccl — the NCCL backend of comm.h for CUDA workers (one process per
 * GPU, as in nccl-tests and llm.c's multi-GPU trainer).
 *
 * NCCL is not linked: libnccl.so.2 is opened at the first comm_nccl_load
 * (common/nccl_lib.h says where it looks) and the few entry points bertd
 * calls are resolved into a table (worker/nccl_abi.h), so one CUDA build
 * runs with or without NCCL installed and a box that has it uses it. Under
 * the CPU stand-in the table comes from tests/cudasim/nccl.cpp.
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
 * events (never device-wide syncs): record on the caller's compute stream
 * after the backward has produced a bucket, cudaStreamWaitEvent on the comm
 * stream, (convert to bf16/fp16), one ncclGroupStart/End around the
 * bucket's ncclAllReduce(ncclAvg) calls (one launch for its ranges), (convert
 * back), and one event the compute stream waits on before the optimizer.
 *
 * This file must never block the host without a deadline, and never touch
 * the compute stream except through events.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "common/log.h"
#include "common/nccl_lib.h"
#include "kernels/cuda/kernels_cuda.h"
}
#include "worker/comm.h"
#include "worker/comm_backend.h"
#include "worker/nccl_abi.h"

/* The resolved library (loaded once per process: load_once). */
static nccl_api N;
static int api_rc = -ENOENT;
static char api_msg[640];
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void load_once(void)
{
    static const char *const names[] = {NCCL_API_NAMES};
    void **slot = (void **)&N;
    char path[4096] = "";
    static_assert(sizeof(N) == sizeof(names) / sizeof(names[0]) * sizeof(void *), "nccl_api and its names");
#ifdef BERTD_CUDASIM
    void *lib = NULL;
    snprintf(path, sizeof(path), "the CUDA stand-in's NCCL");
    if (!cudasim_nccl_sym("ncclGetVersion")) {
        snprintf(api_msg, sizeof(api_msg), "libnccl.so.2 not found (CUDASIM_NCCL=absent)");
        return;
    }
#else
    void *lib = nccl_lib_open(path, sizeof(path), api_msg, sizeof(api_msg));
    if (!lib)
        return;
#endif
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
#ifdef BERTD_CUDASIM
        slot[i] = cudasim_nccl_sym(names[i]);
#else
        slot[i] = dlsym(lib, names[i]);
#endif
        if (!slot[i]) {
            snprintf(api_msg, sizeof(api_msg), "%s has no %s: NCCL 2.14 or newer is needed", path, names[i]);
            memset(&N, 0, sizeof(N));
            if (lib)
                dlclose(lib);
            api_rc = -ENOSYS;
            return;
        }
    }
    int v = 0;
    if (N.ncclGetVersion(&v) != NCCL_OK || v < 21400) {
        snprintf(api_msg, sizeof(api_msg), "%s is NCCL version code %d: NCCL 2.14 or newer is needed", path, v);
        api_rc = -ENOSYS;
        return; /* the handle stays open: N's pointers are not used */
    }
    snprintf(api_msg, sizeof(api_msg), "NCCL %d.%d.%d from %s", v / 10000, v / 100 % 100, v % 100, path);
    api_rc = 0;
}

extern "C" int comm_nccl_load(char *msg, size_t n)
{
    pthread_once(&api_once, load_once);
    if (msg && n)
        snprintf(msg, n, "%s", api_msg);
    return api_rc;
}

typedef struct comm_nccl {
    comm base;
    nccl_comm_t nc;
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
        nccl_result r_ = (call);                                                                \
        if (r_ != NCCL_OK && r_ != NCCL_IN_PROGRESS) {                                         \
            log_error("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call, N.ncclGetErrorString(r_),   \
                      N.ncclGetLastError((s)->nc));                                                \
            rc = -EPIPE;                                                                         \
            goto out;                                                                            \
        }                                                                                        \
        if (r_ == NCCL_IN_PROGRESS && (rc = settle(s, #call)) != 0)                                \
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
        N.ncclCommAbort(s->nc);
    s->nc = NULL;
}

/* Waits (bounded) until the non-blocking communicator has finished the
 * call that returned NCCL_IN_PROGRESS. 0, or -EPIPE after aborting it. */
static int settle(comm_nccl *s, const char *what)
{
    uint64_t deadline = now_ms() + (uint64_t)s->timeout_ms;
    for (;;) {
        nccl_result st = NCCL_IN_PROGRESS;
        nccl_result r = N.ncclCommGetAsyncError(s->nc, &st);
        if (r == NCCL_OK && st == NCCL_OK)
            return 0;
        if (r != NCCL_OK || st != NCCL_IN_PROGRESS) {
            log_error("comm nccl: %s: %s (%s)", what, N.ncclGetErrorString(r != NCCL_OK ? r : st),
                      N.ncclGetLastError(s->nc));
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

/* NCCL's asynchronous error (a dead peer): 1 after aborting the communicator.
 * IN_PROGRESS is not one: a non-blocking call still running. */
static int async_failed(comm_nccl *s)
{
    nccl_result st = NCCL_OK;
    if (N.ncclCommGetAsyncError(s->nc, &st) == NCCL_OK && (st == NCCL_OK || st == NCCL_IN_PROGRESS))
        return 0;
    log_error("comm nccl: async error: %s (%s)", N.ncclGetErrorString(st), N.ncclGetLastError(s->nc));
    kill_comm(s, "NCCL reported an asynchronous error");
    return 1;
}

/* Waits (bounded) until event has completed, or with event NULL everything
 * queued on the comm stream has run, while watching NCCL for asynchronous
 * errors: a drained stream is not a successful collective, after an error
 * NCCL promises nothing about what was enqueued. 0 or -EPIPE. */
static int wait_done(comm_nccl *s, cudaEvent_t event, const char *what)
{
    uint64_t deadline = now_ms() + (uint64_t)s->timeout_ms;
    for (;;) {
        cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(s->stream);
        if (async_failed(s))
            return -EPIPE;
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady) {
            log_error("comm nccl: waiting for %s: %s", what, cudaGetErrorString(e));
            kill_comm(s, "CUDA error while waiting for the collectives");
            return -EPIPE;
        }
        if (now_ms() >= deadline) {
            kill_comm(s, "collectives did not complete in time (peer lost?)");
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
     * copies (wait_done) before returning */
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

/* A call inside ncclGroupStart/End: queued, launched at ncclGroupEnd, so an
 * ncclInProgress here is settled after the group (NCCL_CHECK does it for
 * ncclGroupEnd), never inside it. */
#define NCCL_GROUPED(s, call)                                                                    \
    do {                                                                                         \
        nccl_result r_ = (call);                                                                 \
        if (r_ != NCCL_OK && r_ != NCCL_IN_PROGRESS) {                                           \
            log_error("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call, N.ncclGetErrorString(r_), \
                      N.ncclGetLastError((s)->nc));                                              \
            rc = -EPIPE;                                                                         \
            goto out;                                                                            \
        }                                                                                        \
    } while (0)

/* One bucket on the comm stream: its k ranges (device fp32) in one NCCL
 * group, so NCCL launches them together; bf16/fp16 reductions go through
 * one staging buffer holding every range back to back. */
static int bucket_enqueue(comm_nccl *s, float *const *bufs, const size_t *ns, int k)
{
    int rc = 0, grouped = 0;
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += ns[i];
    kdtype lt = s->dtype == COMM_BF16 ? KDT_BF16 : KDT_F16;
    nccl_dtype nt = s->dtype == COMM_FP32 ? NCCL_FLOAT32 : s->dtype == COMM_BF16 ? NCCL_BFLOAT16 : NCCL_FLOAT16;
    if (s->dtype != COMM_FP32 && total > s->lowp_cap) {
        if (s->lowp)
            CUDA_CHECK(cudaFreeAsync(s->lowp, s->stream));
        s->lowp = NULL;
        s->lowp_cap = 0;
        CUDA_CHECK(cudaMallocAsync(&s->lowp, total * 2, s->stream));
        s->lowp_cap = total;
    }
    /* kernels/cuda's cast (the same one the model uses): fp32 -> 16 bits,
     * reduce, back */
    for (size_t i = 0, at = 0; s->dtype != COMM_FP32 && i < (size_t)k; at += ns[i], i++)
        cuda_cast((char *)s->lowp + at * 2, lt, bufs[i], KDT_F32, ns[i], s->stream);
    NCCL_GROUPED(s, N.ncclGroupStart());
    grouped = 1;
    for (size_t i = 0, at = 0; i < (size_t)k; at += ns[i], i++) {
        void *p = s->dtype == COMM_FP32 ? (void *)bufs[i] : (void *)((char *)s->lowp + at * 2);
        if (ns[i])
            NCCL_GROUPED(s, N.ncclAllReduce(p, p, ns[i], nt, NCCL_AVG, s->nc, s->stream));
    }
    grouped = 0;
    NCCL_CHECK(s, N.ncclGroupEnd());
    for (size_t i = 0, at = 0; s->dtype != COMM_FP32 && i < (size_t)k; at += ns[i], i++)
        cuda_cast(bufs[i], KDT_F32, (char *)s->lowp + at * 2, lt, ns[i], s->stream);
out:
    if (grouped) /* balance the group even on the error path; nothing it held is used */
        (void)N.ncclGroupEnd();
    if (rc == -EIO)
        kill_comm(s, "CUDA error while enqueueing a bucket");
    return rc == 0 ? 0 : -EPIPE;
}

/* Whether stream is being captured into a CUDA graph (lever GRAPH): its
 * work and the comm stream's forked from it only record until the launch. */
static int capturing(cudaStream_t stream)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone;
}

extern "C" int comm_nccl_bucket_start_ranges(comm *c, float *const *dev_bufs, const size_t *n, int k,
                                             void *compute_stream)
{
    comm_nccl *s = (comm_nccl *)c;
    int rc = 0;
    if (c->ops != &nccl_ops || k < 0 || (k > 0 && (!dev_bufs || !n)))
        return -EINVAL;
    if (s->dead)
        return -EPIPE;
    CUDA_CHECK(cudaSetDevice(s->device));
    /* Captured (the record and the wait below fork the comm stream into
     * the capture; comm_nccl_buckets_wait joins it back): the staging
     * buffer cannot grow there, its allocation would outlive the graph.
     * An eager run of the same step sized it; refused, not an abort: the
     * caller's capture fails and it runs the step eagerly. */
    if (s->dtype != COMM_FP32 && capturing((cudaStream_t)compute_stream)) {
        size_t total = 0;
        for (int i = 0; i < k; i++)
            total += n[i];
        if (total > s->lowp_cap) {
            log_error("comm nccl: rank %d: a captured bucket needs a larger staging buffer (%zu "
                      "elements, %zu held): run the step eagerly first", c->rank, total, s->lowp_cap);
            return -EBUSY;
        }
    }
    CUDA_CHECK(cudaEventRecord(s->ready, (cudaStream_t)compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->ready, 0));
    rc = bucket_enqueue(s, dev_bufs, n, k);
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

extern "C" int comm_nccl_bucket_start(comm *c, float *dev_buf, size_t n, void *compute_stream)
{
    return comm_nccl_bucket_start_ranges(c, &dev_buf, &n, 1, compute_stream);
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
    /* the comm stream is part of a capture: nothing on it runs before the
     * graph's launch (querying it would also end the capture); the caller
     * waits after the launch (comm_nccl_wait_event) */
    if (capturing(s->stream))
        return 0;
    return wait_done(s, NULL, "the comm stream");
}

extern "C" int comm_nccl_wait_event(comm *c, void *event)
{
    comm_nccl *s = (comm_nccl *)c;
    if (c->ops != &nccl_ops || !event)
        return -EINVAL;
    if (s->dead)
        return -EPIPE;
    if (cudaSetDevice(s->device) != cudaSuccess) {
        kill_comm(s, "cudaSetDevice failed");
        return -EPIPE;
    }
    return wait_done(s, (cudaEvent_t)event, "the step");
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
    if (async_failed(s))
        return -EPIPE;
out:
    if (rc != 0)
        kill_comm(s, "CUDA error");
    return rc == 0 ? 0 : -EPIPE;
}

extern "C" int comm_nccl_allreduce_mean(comm *c, float *dev_buf, size_t n, void *stream)
{
    comm_nccl *s = (comm_nccl *)c;
    if (c->ops != &nccl_ops)
        return -EINVAL;
    if (s->dead)
        return -EPIPE;
    if (n == 0)
        return 0;
    int rc = comm_nccl_bucket_start(c, dev_buf, n, stream);
    if (rc == 0)
        rc = comm_nccl_buckets_wait(c, stream);
    return rc ? rc : wait_done(s, NULL, "the comm stream");
}

/* comm_allreduce_mean has no stream: ordered after the legacy default
 * stream (comm.h); device code on streams of its own calls
 * comm_nccl_allreduce_mean with the stream that wrote buf. */
static int nccl_allreduce_mean(comm *c, float *buf, size_t n)
{
    return comm_nccl_allreduce_mean(c, buf, n, NULL);
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
    NCCL_CHECK(s, N.ncclAllReduce(s->scratch, s->scratch, (size_t)n, NCCL_FLOAT64, NCCL_SUM, s->nc, s->stream));
    CUDA_CHECK(cudaMemcpyAsync(s->host, s->scratch, bytes, cudaMemcpyDeviceToHost, s->stream));
    rc = wait_done(s, NULL, "the comm stream");
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
    NCCL_CHECK(s, N.ncclBroadcast(s->scratch, s->scratch, bytes, NCCL_UINT8, root, s->nc, s->stream));
    if (c->rank != root)
        CUDA_CHECK(cudaMemcpyAsync(s->host, s->scratch, bytes, cudaMemcpyDeviceToHost, s->stream));
    rc = wait_done(s, NULL, "the comm stream");
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
    NCCL_CHECK(s, N.ncclAllReduce(s->scratch, s->scratch, 1, NCCL_FLOAT32, NCCL_SUM, s->nc, s->stream));
    rc = wait_done(s, NULL, "the comm stream");
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
        nccl_result r = N.ncclCommFinalize(s->nc);
        int rc = 0;
        if (r == NCCL_IN_PROGRESS)
            rc = settle(s, "ncclCommFinalize");
        else if (r != NCCL_OK)
            rc = -EPIPE;
        if (rc == 0 && s->nc)
            N.ncclCommDestroy(s->nc);
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
    nccl_unique_id id;
    nccl_config config = NCCL_ABI_CONFIG_INITIALIZER;
    comm_nccl *s = NULL;
    if (world < 1 || rank < 0 || rank >= world || device < 0 || !send || !recv ||
        (reduce_dtype != COMM_FP32 && reduce_dtype != COMM_BF16 && reduce_dtype != COMM_FP16))
        return -EINVAL;
    {
        char why[640];
        if ((rc = comm_nccl_load(why, sizeof(why))) < 0) {
            log_error("comm nccl: rank %d: %s", rank, why);
            return rc;
        }
    }
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
        nccl_result r = N.ncclGetUniqueId(&id);
        if (r != NCCL_OK) {
            log_error("%s:%d: ncclGetUniqueId: %s", __FILE__, __LINE__, N.ncclGetErrorString(r));
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
    NCCL_CHECK(s, N.ncclCommInitRankConfig(&s->nc, world, id, rank, &config));
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
