/* test_cudasim — the stand-in's own checks, each shown to fire: what the
 * stand-in must catch for the cudasim suite to mean anything. Plain C over
 * the CUDA runtime API and two kernels/cuda launchers (cuda_fill_nan,
 * cuda_scale); cases that must crash run in a forked child and must die by
 * SIGABRT (a device fault, ASan's report, or a guard check).
 *
 * - a kernel that writes one element past its block (guard zone);
 * - a host pointer passed to a kernel;
 * - a copy that runs past a device block, a copy whose kind contradicts the
 *   pointers (cudaErrorInvalidValue);
 * - deferred mode: a copy on stream B of what stream A writes, without an
 *   event wait, reads stale data in some of 20 tries; with the wait, never;
 * - async copies: from page-locked memory they read the source when they
 *   run (a buffer changed after the call changes the result), from pageable
 *   memory at the call;
 * - cudaEventElapsedTime refuses events created without timing;
 * - a block never freed fails the process at exit under CUDASIM_LEAKS=fail;
 *   so do a graph and an exec never destroyed;
 * - stream capture: a capture runs nothing; three replays of a kernel read
 *   the device scalar the host changed between them, by-value arguments stay
 *   the capture's; fork/join over two streams through events (both branches
 *   run, the join before the sum), an unjoined fork fails EndCapture, so
 *   does ending on the forked stream or from another thread, a wait on an
 *   event from outside fails (isolation); twelve misuses (stream,
 *   device and event syncs and queries, pageable async copies, cudaMalloc,
 *   cudaFree, synchronous copies, the legacy stream) each answer CUDA's
 *   error and invalidate the capture, relaxed mode allows what it should,
 *   another thread may cudaMalloc beside a thread-local capture only; a
 *   launch runs between earlier and later work of its stream, two launches
 *   of one exec on two streams one after the other; memory nodes; an NCCL
 *   all-reduce captured in a group, replayed 3 times on 2 ranks between
 *   eager calls, sums right each time.
 *
 * Shown to fail: with runtime.cpp's guard check removed (check_guards
 * returning at once) the first case survives and this test fails (ASan
 * builds catch it anyway); with the stream order in device_main ignored
 * (every op taken as ready) the "with the wait" case reads stale data.
 * The capture cases each failed with their piece of runtime.cpp/nccl.cpp
 * broken: work run while capturing (hangs: the NCCL ranks never match),
 * no unjoined check, the join's dependencies dropped, no isolation check,
 * a stream sync / pageable copy / legacy stream allowed, launches not
 * serialised (deferred: 6 of 10), nodes queued on the legacy stream instead
 * of the launch's (deferred), a graph launched only once, NCCL chunk
 * numbers fixed at the capture, graphs not counted at exit, memory-node
 * rules off, GetCaptureInfo without dependencies, the origin and thread
 * checks of EndCapture off, a thread-local capture treated as global.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "tests/gpu/gpu_check.h"

static int failures;

static void ok_if(int cond, const char *what)
{
    printf("%-4s %s\n", cond ? "ok" : "FAIL", what);
    fflush(stdout); /* a leak report at exit ends the process with _exit */
    if (!cond)
        failures++;
}

/* Runs fn in a child (stderr silenced); returns its wait status. */
static int in_child(void (*fn)(void), int quiet)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (quiet && !freopen("/dev/null", "w", stderr))
            _exit(99);
        fn();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static int died_by_abort(int st) { return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT; }

static void write_past_end(void)
{
    float *d = NULL;
    TCHECK(cudaMalloc((void **)&d, 100 * sizeof(float)));
    cuda_fill_nan(d, KDT_F32, 101, 0); /* one element too many */
    TCHECK(cudaDeviceSynchronize());
    TCHECK(cudaFree(d));
}

static void host_pointer_to_kernel(void)
{
    float h[64] = {0};
    cuda_scale(h, 2.0f, 64, 0);
    TCHECK(cudaDeviceSynchronize());
}

static void copy_past_end(void)
{
    float *d = NULL, h[65] = {0};
    TCHECK(cudaMalloc((void **)&d, 64 * sizeof(float)));
    (void)cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
}

static void leak_one(void)
{
    void *d = NULL;
    TCHECK(cudaMalloc(&d, 4096));
    exit(0); /* through atexit, like a process that forgot cudaFree */
}

/* dst = src copied on stream b after stream a filled src with 0x01 bytes,
 * with or without an event between; returns 1 if dst holds the new bytes. */
static int cross_stream(int with_wait, cudaStream_t a, cudaStream_t b, cudaEvent_t ev,
                        unsigned char *src, unsigned char *dst, size_t n, unsigned char *host)
{
    TCHECK(cudaMemset(src, 0, n));
    TCHECK(cudaMemset(dst, 0, n));
    TCHECK(cudaMemsetAsync(src, 1, n, a));
    if (with_wait) {
        TCHECK(cudaEventRecord(ev, a));
        TCHECK(cudaStreamWaitEvent(b, ev, 0));
    }
    TCHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, b));
    TCHECK(cudaDeviceSynchronize());
    TCHECK(cudaMemcpy(host, dst, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        if (host[i] != 1)
            return 0;
    return 1;
}

/* A closed gate on a stream: a host function that returns once *open. */
static void CUDART_CB gate_fn(void *arg)
{
    atomic_int *open = arg;
    while (!atomic_load(open))
        usleep(100);
}

static void test_stream_order(void)
{
    const char *mode = getenv("CUDASIM_STREAMS");
    int deferred = mode && !strcmp(mode, "deferred");
    size_t n = 1 << 16;
    unsigned char *src, *dst, *host = malloc(n);
    cudaStream_t a, b;
    cudaEvent_t ev;
    TCHECK(cudaMalloc((void **)&src, n));
    TCHECK(cudaMalloc((void **)&dst, n));
    TCHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    TCHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    TCHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    int stale = 0, stale_waited = 0;
    for (int i = 0; i < 20; i++) {
        stale += !cross_stream(0, a, b, ev, src, dst, n, host);
        stale_waited += !cross_stream(1, a, b, ev, src, dst, n, host);
    }
    char what[160];
    snprintf(what, sizeof what, "no event wait: %d of 20 copies read stale data (%s mode)", stale,
             deferred ? "deferred" : "sync");
    ok_if(deferred ? stale > 0 : stale == 0, what);
    snprintf(what, sizeof what, "with the event wait: %d of 20 stale", stale_waited);
    ok_if(stale_waited == 0, what);

    /* a page-locked source is read when the copy runs, a pageable one at
     * the call (the driver stages it); in deferred mode a gate on the
     * stream holds both copies until the host has changed the sources */
    unsigned char *pinned = NULL, pageable[256];
    atomic_int open = 0;
    TCHECK(cudaMallocHost((void **)&pinned, 256));
    memset(pinned, 7, 256);
    memset(pageable, 7, 256);
    if (deferred)
        TCHECK(cudaLaunchHostFunc(a, gate_fn, &open));
    TCHECK(cudaMemcpyAsync(dst, pinned, 256, cudaMemcpyHostToDevice, a));
    TCHECK(cudaMemcpyAsync(dst + 256, pageable, 256, cudaMemcpyHostToDevice, a));
    memset(pinned, 9, 256);
    memset(pageable, 9, 256);
    atomic_store(&open, 1);
    TCHECK(cudaStreamSynchronize(a));
    TCHECK(cudaMemcpy(host, dst, 512, cudaMemcpyDeviceToHost));
    ok_if(host[256] == 7, "pageable source staged at the call");
    ok_if(deferred ? host[0] == 9 : host[0] == 7,
          deferred ? "page-locked source read when the copy runs"
                   : "sync mode: page-locked copy done at the call");

    float ms = 0;
    TCHECK(cudaEventRecord(ev, a));
    TCHECK(cudaEventSynchronize(ev));
    cudaError_t e = cudaEventElapsedTime(&ms, ev, ev);
    (void)cudaGetLastError();
    ok_if(e == cudaErrorInvalidResourceHandle, "elapsed time refused without timing");

    e = cudaMemcpy(dst, host, 16, cudaMemcpyDeviceToHost);
    (void)cudaGetLastError();
    ok_if(e == cudaErrorInvalidValue, "a copy whose kind contradicts its pointers is refused");

    TCHECK(cudaFreeHost(pinned));
    TCHECK(cudaEventDestroy(ev));
    TCHECK(cudaStreamDestroy(a));
    TCHECK(cudaStreamDestroy(b));
    TCHECK(cudaFree(src));
    TCHECK(cudaFree(dst));
    free(host);
}


/* ---- stream capture and graphs ---- */

static int all_equal(const float *x, size_t n, float want)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != want)
            return 0;
    return 1;
}

/* Captures x = 0; x += *bias; x *= scale on s: three nodes, nothing run. */
static cudaGraphExec_t capture_bias_scale(cudaStream_t s, float *x, const float *bias, float scale, size_t n)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    TCHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TCHECK(cudaMemsetAsync(x, 0, n * sizeof(float), s));
    cuda_add_bias_dt(x, bias, (int)n, 1, KDT_F32, s);
    cuda_scale(x, scale, n, s);
    TCHECK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    TCHECK(cudaGraphGetNodes(g, NULL, &nodes));
    ok_if(nodes == 3, "capture: memset + 2 kernels are 3 nodes");
    TCHECK(cudaGraphInstantiate(&ge, g, 0));
    TCHECK(cudaGraphDestroy(g)); /* the exec keeps what it needs */
    return ge;
}

static void set_scalar(float *d, float v) { TCHECK(cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice)); }

/* Replays read device memory when they run (the bias the host changes
 * between launches) and keep by-value arguments as captured; capturing runs
 * nothing. */
static void test_capture_replay(cudaStream_t s, float *x, float *bias, float *host, size_t n)
{
    float scale = 3.0f;
    set_scalar(bias, 1.0f);
    TCHECK(cudaMemcpy(x, host, n * sizeof(float), cudaMemcpyHostToDevice)); /* host holds 7s */
    cudaGraphExec_t ge = capture_bias_scale(s, x, bias, scale, n);
    scale = 5.0f; /* by value: the graph keeps 3 */
    TCHECK(cudaMemcpy(host, x, n * sizeof(float), cudaMemcpyDeviceToHost));
    ok_if(all_equal(host, n, 7.0f), "capture: nothing ran while capturing");
    int good = 0;
    for (int r = 1; r <= 3; r++) {
        set_scalar(bias, (float)(10 * r));
        TCHECK(cudaGraphLaunch(ge, s));
        TCHECK(cudaStreamSynchronize(s));
        TCHECK(cudaMemcpy(host, x, n * sizeof(float), cudaMemcpyDeviceToHost));
        good += all_equal(host, n, 3.0f * (float)(10 * r));
    }
    (void)scale;
    char what[120];
    snprintf(what, sizeof what, "replay: %d of 3 launches read the new bias and kept scale 3", good);
    ok_if(good == 3, what);
    TCHECK(cudaGraphExecDestroy(ge));
}


/* Fork/join over two streams: x = bias on a, y = 2 * bias on b, joined,
 * then x += y on a: both branches ran and the join came before the sum.
 * Without the join the capture fails (cudaErrorStreamCaptureUnjoined). */
static cudaError_t capture_fork_join(cudaStream_t a, cudaStream_t b, cudaEvent_t fork, cudaEvent_t join,
                                     float *x, float *y, const float *bias, size_t n, int joined,
                                     cudaGraph_t *g)
{
    TCHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    TCHECK(cudaMemsetAsync(x, 0, n * sizeof(float), a));
    TCHECK(cudaMemsetAsync(y, 0, n * sizeof(float), a));
    TCHECK(cudaEventRecord(fork, a));
    TCHECK(cudaStreamWaitEvent(b, fork, 0));
    cuda_add_bias_dt(x, bias, (int)n, 1, KDT_F32, a);
    cuda_add_bias_dt(y, bias, (int)n, 1, KDT_F32, b);
    cuda_scale(y, 2.0f, n, b);
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long ida = 0, idb = 1;
    cudaGraph_t ga = NULL, gb = NULL;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 0;
    TCHECK(cudaStreamGetCaptureInfo(a, &st, &ida, &ga, NULL, NULL, NULL));
    TCHECK(cudaStreamGetCaptureInfo(b, &st, &idb, &gb, &deps, NULL, &ndeps));
    ok_if(st == cudaStreamCaptureStatusActive && ida == idb && ga && ga == gb && ndeps == 1 && deps && deps[0],
          "cudaStreamGetCaptureInfo: the forked stream is in the origin's capture, after one node");
    TCHECK(cudaEventRecord(join, b));
    if (joined)
        TCHECK(cudaStreamWaitEvent(a, join, 0));
    cuda_residual_forward(x, x, y, n, a);
    return cudaStreamEndCapture(a, g);
}

struct end_capture {
    cudaStream_t s;
    cudaGraph_t g;
    cudaError_t e;
};
static void *end_capture_fn(void *arg)
{
    struct end_capture *c = arg;
    c->e = cudaStreamEndCapture(c->s, &c->g);
    return NULL;
}

static void test_fork_join(cudaStream_t a, cudaStream_t b, float *x, float *y, float *bias, float *host,
                           size_t n)
{
    cudaEvent_t fork, join;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    TCHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    TCHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    TCHECK(capture_fork_join(a, b, fork, join, x, y, bias, n, 1, &g));
    size_t nodes = 0;
    TCHECK(cudaGraphGetNodes(g, NULL, &nodes));
    ok_if(nodes == 6, "fork/join: 6 nodes, the events none");
    TCHECK(cudaGraphInstantiate(&ge, g, 0));
    int good = 0;
    for (int r = 1; r <= 2; r++) {
        set_scalar(bias, (float)r);
        TCHECK(cudaGraphLaunch(ge, a));
        TCHECK(cudaStreamSynchronize(a));
        TCHECK(cudaMemcpy(host, x, n * sizeof(float), cudaMemcpyDeviceToHost));
        good += all_equal(host, n, 3.0f * (float)r);
    }
    ok_if(good == 2, "fork/join: both branches ran before the join's sum, 2 launches");
    TCHECK(cudaGraphExecDestroy(ge));
    TCHECK(cudaGraphDestroy(g));

    cudaError_t e = capture_fork_join(a, b, fork, join, x, y, bias, n, 0, &g);
    (void)cudaGetLastError();
    enum cudaStreamCaptureStatus sa = cudaStreamCaptureStatusActive, sb = cudaStreamCaptureStatusActive;
    TCHECK(cudaStreamIsCapturing(a, &sa));
    TCHECK(cudaStreamIsCapturing(b, &sb));
    ok_if(e == cudaErrorStreamCaptureUnjoined && g == NULL && sa == cudaStreamCaptureStatusNone &&
              sb == cudaStreamCaptureStatusNone,
          "an unjoined fork fails cudaStreamEndCapture (cudaErrorStreamCaptureUnjoined), capture over");
    cudaError_t end;

    /* ended on the forked stream, not the origin; then from another thread */
    TCHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    TCHECK(cudaEventRecord(fork, a));
    TCHECK(cudaStreamWaitEvent(b, fork, 0));
    e = cudaStreamEndCapture(b, &g);
    end = cudaStreamEndCapture(a, &g);
    (void)cudaGetLastError();
    ok_if(e == cudaErrorStreamCaptureUnmatched && end == cudaErrorStreamCaptureInvalidated,
          "cudaStreamEndCapture on a forked stream: cudaErrorStreamCaptureUnmatched, capture invalidated");
    TCHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    struct end_capture other = {a, NULL, cudaSuccess};
    pthread_t t;
    pthread_create(&t, NULL, end_capture_fn, &other);
    pthread_join(t, NULL);
    TCHECK(cudaStreamEndCapture(a, &g));
    (void)cudaGetLastError();
    ok_if(other.e == cudaErrorStreamCaptureWrongThread && g,
          "a global capture ended by another thread: cudaErrorStreamCaptureWrongThread");
    TCHECK(cudaGraphDestroy(g));

    /* a wait on an event recorded outside the capture */
    TCHECK(cudaEventRecord(join, b));
    TCHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    e = cudaStreamWaitEvent(a, join, 0);
    end = cudaStreamEndCapture(a, &g);
    (void)cudaGetLastError();
    ok_if(e == cudaErrorStreamCaptureIsolation && end == cudaErrorStreamCaptureInvalidated,
          "waiting on an event from outside the capture: cudaErrorStreamCaptureIsolation");
    TCHECK(cudaEventDestroy(fork));
    TCHECK(cudaEventDestroy(join));
}

/* Memory nodes: a scratch block allocated and freed inside the capture
 * (as kernels/cuda's launchers do with cudaMallocAsync) keeps its address
 * on every launch; y = 2 * x through it. Not freed in the capture: refused
 * (not simulated). */
static void test_graph_memory(cudaStream_t a, float *x, float *y, float *host, size_t n)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    float *tmp = NULL, *tmp2 = NULL;
    TCHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    TCHECK(cudaMallocAsync((void **)&tmp, n * sizeof(float), a));
    TCHECK(cudaMemcpyAsync(tmp, x, n * sizeof(float), cudaMemcpyDeviceToDevice, a));
    cuda_scale(tmp, 2.0f, n, a);
    TCHECK(cudaMemcpyAsync(y, tmp, n * sizeof(float), cudaMemcpyDeviceToDevice, a));
    TCHECK(cudaFreeAsync(tmp, a));
    TCHECK(cudaStreamEndCapture(a, &g));
    TCHECK(cudaGraphInstantiate(&ge, g, 0));
    cudaGraphExec_t ge2 = NULL;
    cudaError_t twice = cudaGraphInstantiate(&ge2, g, 0);
    (void)cudaGetLastError();
    int good = 0;
    for (int r = 1; r <= 2; r++) {
        for (size_t i = 0; i < n; i++)
            host[i] = (float)(r * (int)(i % 5));
        TCHECK(cudaMemcpy(x, host, n * sizeof(float), cudaMemcpyHostToDevice));
        TCHECK(cudaGraphLaunch(ge, a));
        TCHECK(cudaStreamSynchronize(a));
        TCHECK(cudaMemcpy(host, y, n * sizeof(float), cudaMemcpyDeviceToHost));
        int ok = 1;
        for (size_t i = 0; i < n; i++)
            ok &= host[i] == 2.0f * (float)(r * (int)(i % 5));
        good += ok;
    }
    ok_if(good == 2 && twice == cudaErrorNotSupported,
          "memory nodes: a block allocated and freed in the capture serves 2 launches; one exec at a time");
    TCHECK(cudaGraphExecDestroy(ge));
    TCHECK(cudaGraphDestroy(g));

    g = NULL;
    TCHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    TCHECK(cudaMallocAsync((void **)&tmp2, 256, a));
    cudaError_t e = cudaStreamEndCapture(a, &g);
    (void)cudaGetLastError();
    ok_if(e == cudaErrorNotSupported && g == NULL, "a block the capture allocates and never frees: refused");
}

/* One misuse inside a capture on s: the call's error, then EndCapture's. */
struct misuse {
    const char *what;
    cudaError_t want;
};

static void check_misuse(cudaStream_t s, enum cudaStreamCaptureMode mode, const struct misuse *m,
                         cudaError_t got)
{
    cudaGraph_t g = NULL;
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    TCHECK(cudaStreamIsCapturing(s, &st));
    cudaError_t end = cudaStreamEndCapture(s, &g);
    (void)cudaGetLastError();
    char what[200];
    snprintf(what, sizeof what, "%s (%s mode): %s, capture invalidated", m->what,
             mode == cudaStreamCaptureModeRelaxed ? "relaxed" : "global", cudaGetErrorName(m->want));
    ok_if(got == m->want && st == cudaStreamCaptureStatusInvalidated && end == cudaErrorStreamCaptureInvalidated &&
              g == NULL,
          what);
    if (g)
        TCHECK(cudaGraphDestroy(g));
}

static void *malloc_fn(void *arg)
{
    cudaError_t *e = arg;
    void *p = NULL;
    *e = cudaMalloc(&p, 256);
    if (*e == cudaSuccess)
        *e = cudaFree(p);
    return NULL;
}

/* cudaMalloc on another thread (its mode global) while this one captures:
 * refused beside a global capture, allowed beside a thread-local one. */
static cudaError_t malloc_beside(cudaStream_t s, enum cudaStreamCaptureMode mode, cudaError_t *end)
{
    cudaError_t e = cudaErrorUnknown;
    cudaGraph_t g = NULL;
    pthread_t t;
    TCHECK(cudaStreamBeginCapture(s, mode));
    pthread_create(&t, NULL, malloc_fn, &e);
    pthread_join(t, NULL);
    *end = cudaStreamEndCapture(s, &g);
    (void)cudaGetLastError();
    if (g)
        TCHECK(cudaGraphDestroy(g));
    return e;
}

static void test_capture_errors(cudaStream_t nb, float *x, float *host)
{
    cudaStream_t blocking;
    cudaEvent_t ev;
    float *pinned = NULL;
    void *p = NULL;
    TCHECK(cudaStreamCreate(&blocking)); /* synchronizes with the legacy stream */
    TCHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    TCHECK(cudaMallocHost((void **)&pinned, 64));
    static const struct misuse m[] = {
        {"cudaStreamSynchronize of the capturing stream", cudaErrorStreamCaptureUnsupported},
        {"cudaStreamQuery of the capturing stream", cudaErrorStreamCaptureUnsupported},
        {"cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported},
        {"cudaEventSynchronize of an event recorded in the capture", cudaErrorCapturedEvent},
        {"cudaEventQuery of an event recorded in the capture", cudaErrorCapturedEvent},
        {"cudaMemcpyAsync from pageable memory", cudaErrorStreamCaptureUnsupported},
        {"cudaMemcpyAsync to pageable memory", cudaErrorStreamCaptureUnsupported},
        {"cudaMalloc", cudaErrorStreamCaptureUnsupported},
        {"cudaFree", cudaErrorStreamCaptureUnsupported},
        {"a synchronous cudaMemcpy", cudaErrorStreamCaptureUnsupported},
        {"a synchronous cudaMemset", cudaErrorStreamCaptureUnsupported},
        {"the legacy stream while a blocking stream captures", cudaErrorStreamCaptureImplicit},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        cudaStream_t s = i == 11 ? blocking : nb;
        TCHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        TCHECK(cudaMemsetAsync(x, 0, 64, s));
        cudaError_t e = cudaSuccess;
        switch (i) {
        case 0: e = cudaStreamSynchronize(s); break;
        case 1: e = cudaStreamQuery(s); break;
        case 2: e = cudaDeviceSynchronize(); break;
        case 3: TCHECK(cudaEventRecord(ev, s)); e = cudaEventSynchronize(ev); break;
        case 4: TCHECK(cudaEventRecord(ev, s)); e = cudaEventQuery(ev); break;
        case 5: e = cudaMemcpyAsync(x, host, 64, cudaMemcpyHostToDevice, s); break;
        case 6: e = cudaMemcpyAsync(host, x, 64, cudaMemcpyDeviceToHost, s); break;
        case 7: e = cudaMalloc(&p, 256); break;
        case 8: e = cudaFree(x); break;
        case 9: e = cudaMemcpy(x, pinned, 64, cudaMemcpyHostToDevice); break;
        case 10: e = cudaMemset(x, 0, 64); break;
        case 11: e = cudaMemsetAsync(x, 0, 64, 0); break;
        }
        check_misuse(s, cudaStreamCaptureModeGlobal, &m[i], e);
    }
    /* the one legacy-stream query CUDA allows: an error, no invalidation */
    cudaGraph_t g = NULL;
    enum cudaStreamCaptureStatus st;
    TCHECK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal));
    cudaError_t e = cudaStreamIsCapturing(0, &st);
    (void)cudaGetLastError();
    cudaError_t end = cudaStreamEndCapture(blocking, &g);
    ok_if(e == cudaErrorStreamCaptureImplicit && end == cudaSuccess && g,
          "cudaStreamIsCapturing(legacy) while a blocking stream captures: implicit, capture intact");
    TCHECK(cudaGraphDestroy(g));

    cudaError_t end_g, end_t;
    cudaError_t in_g = malloc_beside(nb, cudaStreamCaptureModeGlobal, &end_g);
    cudaError_t in_t = malloc_beside(nb, cudaStreamCaptureModeThreadLocal, &end_t);
    ok_if(in_g == cudaErrorStreamCaptureUnsupported && end_g == cudaErrorStreamCaptureInvalidated &&
              in_t == cudaSuccess && end_t == cudaSuccess,
          "cudaMalloc on another thread: refused beside a global capture, allowed beside a thread-local one");

    /* relaxed: cudaMalloc/cudaFree and the legacy stream (beside a
     * non-blocking capture) are allowed; an async copy from pinned memory
     * is fine in any mode */
    g = NULL;
    TCHECK(cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed));
    e = cudaMalloc(&p, 256);
    cudaError_t e2 = p ? cudaFree(p) : cudaErrorUnknown;
    cudaError_t e3 = cudaMemset(x, 0, 64);
    cudaError_t e4 = cudaMemcpyAsync(x, pinned, 64, cudaMemcpyHostToDevice, nb);
    end = cudaStreamEndCapture(nb, &g);
    ok_if(e == cudaSuccess && e2 == cudaSuccess && e3 == cudaSuccess && e4 == cudaSuccess && end == cudaSuccess,
          "relaxed mode: cudaMalloc, cudaFree, a legacy-stream memset and a pinned async copy allowed");
    if (g)
        TCHECK(cudaGraphDestroy(g));
    TCHECK(cudaFreeHost(pinned));
    TCHECK(cudaEventDestroy(ev));
    TCHECK(cudaStreamDestroy(blocking));
}

/* A gate (deferred mode) holds stream b while, in that order, a copy sets
 * the bias to 10, the graph (x = 3 * bias) is launched and x is halved:
 * 15 only if the launch ran after the copy and before the halving. Then
 * two launches of one exec on two streams, no event between, of a graph
 * x = 2 * (x + bias): 2(2(x + b) + b) only if one ran after the other. */
static void test_launch_order(cudaStream_t a, cudaStream_t b, float *x, float *bias, float *host, size_t n)
{
    const char *mode = getenv("CUDASIM_STREAMS");
    int deferred = mode && !strcmp(mode, "deferred");
    float *ten = NULL;
    atomic_int open = 0;
    TCHECK(cudaMallocHost((void **)&ten, sizeof(float)));
    *ten = 10.0f;
    set_scalar(bias, 1.0f);
    cudaGraphExec_t ge = capture_bias_scale(a, x, bias, 3.0f, n);
    if (deferred)
        TCHECK(cudaLaunchHostFunc(b, gate_fn, &open));
    TCHECK(cudaMemcpyAsync(bias, ten, sizeof(float), cudaMemcpyHostToDevice, b));
    TCHECK(cudaGraphLaunch(ge, b));
    cuda_scale(x, 0.5f, n, b);
    atomic_store(&open, 1);
    TCHECK(cudaStreamSynchronize(b));
    TCHECK(cudaMemcpy(host, x, n * sizeof(float), cudaMemcpyDeviceToHost));
    ok_if(all_equal(host, n, 15.0f), "a graph launch runs after earlier work on its stream, before later work");
    TCHECK(cudaGraphExecDestroy(ge));

    /* x = 2 * (x + bias) four times: from 0 with bias 1, 30 after one
     * launch, 510 after two run one after the other; interleaved nodes
     * (the deferred mode's random picks among ready streams) give less */
    cudaGraph_t g = NULL;
    TCHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 4; i++) {
        cuda_add_bias_dt(x, bias, (int)n, 1, KDT_F32, a);
        cuda_scale(x, 2.0f, n, a);
    }
    TCHECK(cudaStreamEndCapture(a, &g));
    TCHECK(cudaGraphInstantiate(&ge, g, 0));
    set_scalar(bias, 1.0f);
    int serial = 0;
    for (int t = 0; t < 10; t++) {
        TCHECK(cudaMemset(x, 0, n * sizeof(float)));
        atomic_store(&open, 0);
        if (deferred) { /* both launches queued before either may run */
            TCHECK(cudaLaunchHostFunc(a, gate_fn, &open));
            TCHECK(cudaLaunchHostFunc(b, gate_fn, &open));
        }
        TCHECK(cudaGraphLaunch(ge, a));
        TCHECK(cudaGraphLaunch(ge, b));
        atomic_store(&open, 1);
        TCHECK(cudaStreamSynchronize(a));
        TCHECK(cudaStreamSynchronize(b));
        TCHECK(cudaMemcpy(host, x, n * sizeof(float), cudaMemcpyDeviceToHost));
        serial += all_equal(host, n, 510.0f);
    }
    char what[120];
    snprintf(what, sizeof what, "two launches of one exec on two streams, no event: %d of 10 ran one after the other",
             serial);
    ok_if(serial == 10, what);
    TCHECK(cudaGraphExecDestroy(ge));
    TCHECK(cudaGraphDestroy(g));
    TCHECK(cudaFreeHost(ten));
}

/* Children for the leak report: a graph and an exec left alive fail the
 * process under CUDASIM_LEAKS=fail; destroyed, they do not. */
static void graph_leak(int destroy)
{
    cudaStream_t s;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    float *x = NULL;
    TCHECK(cudaMalloc((void **)&x, 256));
    TCHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TCHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TCHECK(cudaMemsetAsync(x, 0, 256, s));
    TCHECK(cudaStreamEndCapture(s, &g));
    TCHECK(cudaGraphInstantiate(&ge, g, 0));
    TCHECK(cudaGraphLaunch(ge, s));
    TCHECK(cudaStreamSynchronize(s));
    if (destroy) {
        TCHECK(cudaGraphExecDestroy(ge));
        TCHECK(cudaGraphDestroy(g));
    }
    TCHECK(cudaStreamDestroy(s));
    TCHECK(cudaFree(x));
    exit(0);
}
static void graph_leak_kept(void) { graph_leak(0); }
static void graph_leak_destroyed(void) { graph_leak(1); }

/* Two ranks (processes) capture one all-reduce in a group and replay it
 * three times with new inputs, an eager all-reduce between replays: each
 * replay is a new collective, matched across ranks in call order. */
static ncclUniqueId nccl_id;
static int nccl_rank;

static void nccl_graph_rank(void)
{
    size_t n = 300000; /* two of the stand-in's 1 MiB chunks */
    int rank = nccl_rank, bad = 0;
    ncclComm_t comm;
    cudaStream_t s;
    float *x, *y, *h = malloc(n * sizeof(float));
    if (ncclCommInitRank(&comm, 2, nccl_id, rank) != ncclSuccess)
        exit(10);
    TCHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TCHECK(cudaMalloc((void **)&x, n * sizeof(float)));
    TCHECK(cudaMalloc((void **)&y, n * sizeof(float)));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    TCHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (ncclGroupStart() != ncclSuccess ||
        ncclAllReduce(x, y, n, ncclFloat32, ncclSum, comm, s) != ncclSuccess || ncclGroupEnd() != ncclSuccess)
        exit(11);
    TCHECK(cudaStreamEndCapture(s, &g));
    TCHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 1; r <= 3; r++) {
        for (size_t i = 0; i < n; i++)
            h[i] = (float)((rank + 1) * r) + (float)(i % 7);
        TCHECK(cudaMemcpy(x, h, n * sizeof(float), cudaMemcpyHostToDevice));
        TCHECK(cudaGraphLaunch(ge, s));
        TCHECK(cudaStreamSynchronize(s));
        TCHECK(cudaMemcpy(h, y, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            bad += h[i] != (float)(3 * r) + 2.0f * (float)(i % 7);
        /* an eager one between the replays: y = 2 * y */
        if (ncclAllReduce(y, y, n, ncclFloat32, ncclAvg, comm, s) != ncclSuccess)
            exit(12);
        cuda_scale(y, 2.0f, n, s);
        TCHECK(cudaStreamSynchronize(s));
        TCHECK(cudaMemcpy(h, y, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            bad += h[i] != 2.0f * ((float)(3 * r) + 2.0f * (float)(i % 7));
    }
    TCHECK(cudaGraphExecDestroy(ge));
    TCHECK(cudaGraphDestroy(g));
    ncclCommDestroy(comm);
    TCHECK(cudaStreamDestroy(s));
    TCHECK(cudaFree(x));
    TCHECK(cudaFree(y));
    free(h);
    exit(bad ? 13 : 0);
}

static void test_nccl_graph(void)
{
    if (ncclGetUniqueId(&nccl_id) != ncclSuccess) {
        ok_if(0, "ncclGetUniqueId");
        return;
    }
    fflush(stdout);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            nccl_rank = r;
            nccl_graph_rank();
        }
    }
    int good = 0;
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        good += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    ok_if(good == 2, "NCCL: an all-reduce captured in a group on 2 ranks, 3 replays with eager calls between, right sums");
}

static void test_capture(void)
{
    size_t n = 1000;
    float *x, *bias, *host = malloc(n * sizeof(float));
    float *y;
    cudaStream_t a, b;
    TCHECK(cudaMalloc((void **)&x, n * sizeof(float)));
    TCHECK(cudaMalloc((void **)&y, n * sizeof(float)));
    TCHECK(cudaMalloc((void **)&bias, sizeof(float)));
    TCHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    TCHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    for (size_t i = 0; i < n; i++)
        host[i] = 7.0f;
    test_capture_replay(a, x, bias, host, n);
    test_fork_join(a, b, x, y, bias, host, n);
    test_graph_memory(a, x, y, host, n);
    test_capture_errors(a, x, host);
    test_launch_order(a, b, x, bias, host, n);
    TCHECK(cudaStreamDestroy(a));
    TCHECK(cudaStreamDestroy(b));
    TCHECK(cudaFree(y));
    TCHECK(cudaFree(x));
    TCHECK(cudaFree(bias));
    free(host);
}

int main(void)
{
    /* the forked cases first: CUDA state must not cross fork */
    ok_if(died_by_abort(in_child(write_past_end, 1)), "a kernel writing past its block aborts");
    ok_if(died_by_abort(in_child(host_pointer_to_kernel, 1)), "a host pointer to a kernel aborts");
    ok_if(died_by_abort(in_child(copy_past_end, 1)), "a copy past a device block aborts");
    setenv("CUDASIM_LEAKS", "fail", 1);
    int st = in_child(leak_one, 1);
    ok_if(WIFEXITED(st) && WEXITSTATUS(st) == 3, "a leaked block fails the process at exit");
    st = in_child(graph_leak_kept, 1);
    ok_if(WIFEXITED(st) && WEXITSTATUS(st) == 3, "a graph and an exec never destroyed fail the process at exit");
    st = in_child(graph_leak_destroyed, 1);
    ok_if(WIFEXITED(st) && WEXITSTATUS(st) == 0, "destroyed, they do not");
    test_nccl_graph();

    test_stream_order();
    test_capture();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
