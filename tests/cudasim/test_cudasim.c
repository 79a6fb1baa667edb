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
 * - a block never freed fails the process at exit under CUDASIM_LEAKS=fail.
 *
 * Shown to fail: with runtime.cpp's guard check removed (check_guards
 * returning at once) the first case survives and this test fails (ASan
 * builds catch it anyway); with the stream order in device_main ignored
 * (every op taken as ready) the "with the wait" case reads stale data.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "tests/gpu/gpu_check.h"

static int failures;

static void ok_if(int cond, const char *what)
{
    printf("%-4s %s\n", cond ? "ok" : "FAIL", what);
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

static void test_capture(void)
{
    size_t n = 1000;
    float *x, *bias, *host = malloc(n * sizeof(float));
    cudaStream_t a;
    TCHECK(cudaMalloc((void **)&x, n * sizeof(float)));
    TCHECK(cudaMalloc((void **)&bias, sizeof(float)));
    TCHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    for (size_t i = 0; i < n; i++)
        host[i] = 7.0f;
    test_capture_replay(a, x, bias, host, n);
    TCHECK(cudaStreamDestroy(a));
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

    test_stream_order();
    test_capture();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
