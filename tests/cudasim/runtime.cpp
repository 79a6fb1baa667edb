/* runtime.cpp — the CUDA runtime subset bertd calls, on the host (see
 * cudasim.h for the execution model). Test-only; linked instead of libcudart.
 *
 * What it checks, beyond running the work:
 * - device memory: guard zones before and after every cudaMalloc block (and
 *   the slack up to its 256-byte rounding), checked at cudaFree, at every
 *   device-wide sync and at exit; poisoned by ASan where the build has it, so
 *   a kernel that writes one byte past its buffer stops at the write. Fresh
 *   blocks are filled with 0xFF (NaN in every float type, -1 as an index) and
 *   freed ones with 0xFB, so reading memory nobody wrote shows.
 * - copies: the kind must agree with where the pointers are (device memory
 *   vs host), and the device side must lie inside one live allocation.
 *   Async copies from pageable memory are staged at the call, as the driver
 *   does; from page-locked memory they read the source when they run, so a
 *   buffer reused before its copy's event shows as wrong data.
 *   Device-to-pageable copies return only after the copy, as CUDA's do.
 * - launches: block and grid limits and dynamic shared memory against the
 *   device profile and cudaFuncSetAttribute, reported as CUDA reports them
 *   (cudaGetLastError, sticky until read); a pointer argument that is not
 *   device-accessible is a fault.
 * - events and streams: stream order, cudaStreamWaitEvent, the legacy
 *   default stream's implicit synchronization with blocking streams;
 *   cudaEventElapsedTime only between completed, timing-enabled events.
 * - stream capture and graphs: while a stream captures, its work becomes
 *   nodes of a graph (kernel arguments copied at the call, memory read when
 *   a launch runs them); an event recorded there is a capture point whose
 *   wait forks another stream into the capture or joins it back;
 *   cudaGraphLaunch queues the nodes on its stream in capture order (a
 *   topological order), each made afresh (an NCCL collective is a new one
 *   at every launch), after the exec's previous launch wherever that ran.
 *   cudaMallocAsync/cudaFreeAsync in a capture are memory nodes (the block
 *   the graph's, one address for every launch, refilled 0xFF at the alloc
 *   node and 0xFB at the free). The rules, each with CUDA's error and the
 *   capture invalidated: syncs and queries of a capturing stream, of the
 *   device, of a captured event; cudaMalloc/cudaFree(Host) and synchronous
 *   copies/memsets by the thread's mode (cudaThreadExchangeStreamCaptureMode,
 *   global/thread-local/relaxed); async copies with pageable memory; the
 *   legacy stream while a blocking stream captures; a wait on an event
 *   recorded outside the capture (isolation); unjoined forks at
 *   cudaStreamEndCapture; a merge of two captures; ending on the wrong
 *   stream or thread. Not simulated (a clear error, never silence): child
 *   graphs (cudaGraphLaunch on a capturing stream), external event waits,
 *   graph-allocated blocks that outlive their graph's launch, a captured
 *   cudaFreeAsync of memory from outside the capture, graph update and the
 *   explicit node-building API, upload and device-launch instantiation.
 *   Stricter than documented: an event last recorded in a capture that has
 *   ended is refused by query, sync and wait (cudaErrorCapturedEvent).
 * - a leak report at exit (device blocks, streams, events, graphs and graph
 *   execs never freed): printed always; a failure (exit status 3) when
 *   CUDASIM_LEAKS=fail.
 *
 * What it cannot show: anything about the hardware's memory model, inter-
 * block races, performance, driver or pinning behaviour, and a graph's
 * concurrency (its branches run one after the other here).
 */
#include "tests/cudasim/cudasim.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SIM_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define SIM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SIM_POISON(p, n) ((void)(p), (void)(n))
#define SIM_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct CUstream_st;
struct CUgraph_st;

namespace cudasim {

/* ---- device profiles (the documented figures of each part) ---- */
static const profile profiles[] = {
    {"h200", "NVIDIA H200 (cudasim)", 9, 0, 141ull << 30, 132, 48 << 10, 227 << 10, 228 << 10, 1024,
     65536},
    {"v100", "Tesla V100-SXM2-16GB (cudasim)", 7, 0, 16ull << 30, 80, 48 << 10, 96 << 10, 96 << 10,
     1024, 65536},
    {"v100-32", "Tesla V100-SXM2-32GB (cudasim)", 7, 0, 32ull << 30, 80, 48 << 10, 96 << 10,
     96 << 10, 1024, 65536},
    {"t4", "Tesla T4 (cudasim)", 7, 5, 15ull << 30, 40, 48 << 10, 64 << 10, 64 << 10, 1024, 65536},
};

uint64_t now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fault(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cudasim: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* ---- the state of the process's simulated devices ---- */

struct op {
    uint64_t seq;
    const char *what;
    std::function<bool()> fn;
    std::vector<std::shared_ptr<op>> deps;
    bool done = false;
    uint64_t done_ns = 0;
    uint64_t retry_ns = 0; /* a polled op that said "not yet" is retried after this */
};
typedef std::shared_ptr<op> op_ptr;

enum mem_kind { MEM_DEVICE, MEM_PINNED, MEM_REGISTERED };
struct block {
    unsigned char *base; /* what the caller sees */
    size_t size;         /* what the caller asked for */
    size_t span;         /* size rounded up to 256 */
    unsigned char *raw;  /* the allocation, guard zones included */
    mem_kind kind;
    int device;
};
constexpr size_t GUARD = 256;
constexpr unsigned char GUARD_BYTE = 0xFD, FRESH_BYTE = 0xFF, FREED_BYTE = 0xFB;

/* One capture sequence: the origin stream and the streams that joined it
 * through event waits, all adding nodes to one graph. */
struct capture {
    unsigned long long id;
    CUgraph_st *g;       /* owned until cudaStreamEndCapture hands it out */
    CUstream_st *origin;
    cudaStreamCaptureMode mode;
    std::thread::id thread; /* that began it */
    bool invalid = false, ended = false;
    std::vector<CUstream_st *> streams; /* the origin first */
};
typedef std::shared_ptr<capture> capture_ptr;

struct state {
    std::recursive_mutex m; /* every API call; the device thread drops it while running an op */
    std::condition_variable_any cv;
    const profile *prof;
    int ndev;
    size_t mem_cap;
    size_t mem_used = 0;
    bool deferred;
    uint64_t seq = 0, rng;
    std::map<uintptr_t, block> blocks;
    std::vector<CUstream_st *> streams; /* live, the legacy one first */
    std::map<const void *, int> func_smem; /* cudaFuncAttributeMaxDynamicSharedMemorySize */
    long live_events = 0;
    std::thread dev;
    bool dev_started = false, stop = false;
    int waiters = 0; /* host threads blocked on the device */
    std::deque<std::pair<unsigned char *, size_t>> quarantine;
    size_t quarantine_bytes = 0;
    std::vector<capture_ptr> captures; /* active ones */
    unsigned long long capture_ids = 0;
    std::set<CUgraph_st *> graphs;
    std::set<struct CUgraphExec_st *> execs;
    std::set<void *> graph_blocks; /* device blocks that graphs own */
};

} // namespace cudasim

struct CUstream_st {
    std::deque<cudasim::op_ptr> q;
    cudasim::op_ptr last; /* the newest op ever queued (done or not) */
    unsigned flags;
    bool legacy = false, destroyed = false;
    cudasim::capture_ptr cap;     /* the capture it takes part in, or null */
    std::vector<size_t> cap_deps; /* the nodes its next captured node depends on */
    std::vector<cudaGraphNode_t> info_deps; /* cudaStreamGetCaptureInfo's arrays */
    std::vector<cudaGraphEdgeData> info_edges;
};
struct CUevent_st {
    unsigned flags;
    cudasim::op_ptr rec;          /* the last record, or null */
    cudasim::capture_ptr cap;     /* the last record was in this capture */
    std::vector<size_t> cap_deps; /* the capturing stream's nodes at that record */
};

/* A graph: nodes in capture order, each depending on earlier ones only (so
 * the index order respects every dependency). */
struct CUgraphNode_st {
    CUgraph_st *g;
    size_t index;
};
namespace cudasim {
struct gnode {
    const char *what;
    work_maker make;
    std::vector<size_t> deps;
};
/* A block a capture allocated (cudaMallocAsync on a capturing stream): the
 * graph's, at one address for every launch, as CUDA keeps it; released
 * when the graph and its exec are gone and no launch still runs. */
struct graph_mem {
    void *p;
    ~graph_mem();
};
struct graph_mem_set {
    std::vector<std::shared_ptr<graph_mem>> blocks;
    int execs = 0; /* live instantiations */
};
} // namespace cudasim
struct CUgraph_st {
    std::vector<cudasim::gnode> nodes;
    std::vector<std::unique_ptr<CUgraphNode_st>> handles;
    std::shared_ptr<cudasim::graph_mem_set> mem = std::make_shared<cudasim::graph_mem_set>();
    std::set<void *> mem_live; /* during capture: allocated and not yet freed */
};
struct CUgraphExec_st {
    std::vector<cudasim::gnode> nodes;
    std::shared_ptr<cudasim::graph_mem_set> mem;
    cudasim::op_ptr last; /* the last op of the newest launch */
};

namespace cudasim {

static thread_local cudaError_t last_error = cudaSuccess;
static thread_local int cur_device = 0;

static cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

static const profile *find_profile(const char *key)
{
    for (const profile &p : profiles)
        if (!strcmp(p.key, key))
            return &p;
    fprintf(stderr, "cudasim: unknown CUDASIM_DEVICE '%s' (h200, v100, v100-32, t4)\n", key);
    exit(2);
}

static void at_exit();
static void at_fork_child();

static state &S()
{
    static state *s = [] {
        state *n = new state; /* never destroyed: work may run during exit */
        const char *d = getenv("CUDASIM_DEVICE");
        n->prof = find_profile(d && *d ? d : "h200");
        const char *c = getenv("CUDASIM_DEVICES");
        n->ndev = c && *c ? atoi(c) : 1;
        if (n->ndev < 0 || n->ndev > 16)
            n->ndev = 1;
        /* CUDA_VISIBLE_DEVICES narrows what the process sees, as in CUDA:
         * a list of valid indexes or GPU-<uuid> names (any uuid is one of
         * the simulated devices); an invalid entry ends the list */
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        if (vis) {
            int seen = 0;
            for (const char *p = vis; *p && seen < n->ndev;) {
                const char *end;
                if (!strncmp(p, "GPU-", 4)) {
                    end = p + strcspn(p, ",");
                } else {
                    char *e;
                    long i = strtol(p, &e, 10);
                    if (e == p || i < 0 || i >= n->ndev)
                        break;
                    end = e;
                }
                seen++;
                if (*end != ',')
                    break;
                p = end + 1;
            }
            n->ndev = seen;
        }
        const char *mb = getenv("CUDASIM_MEM_MB");
        /* the device's memory, but never more than half the host's: a
         * "largest batch that fits" must really be allocatable here */
        size_t host = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
        n->mem_cap = mb && *mb ? (size_t)atoll(mb) << 20 : std::min(n->prof->total_mem, host / 2);
        const char *mode = getenv("CUDASIM_STREAMS");
        n->deferred = mode && !strcmp(mode, "deferred");
        if (mode && *mode && !n->deferred && strcmp(mode, "sync")) {
            fprintf(stderr, "cudasim: CUDASIM_STREAMS is sync or deferred, not '%s'\n", mode);
            exit(2);
        }
        const char *seed = getenv("CUDASIM_SEED");
        n->rng = 0x9E3779B97F4A7C15ull ^ (seed ? strtoull(seed, NULL, 0) : 1);
        CUstream_st *legacy = new CUstream_st;
        legacy->flags = 0;
        legacy->legacy = true;
        n->streams.push_back(legacy);
        atexit(at_exit);
        pthread_atfork(NULL, NULL, at_fork_child);
        return n;
    }();
    return *s;
}

const profile &device_profile() { return *S().prof; }
bool streams_deferred() { return S().deferred; }

static uint64_t rnd(state &s)
{
    s.rng ^= s.rng << 13;
    s.rng ^= s.rng >> 7;
    s.rng ^= s.rng << 17;
    return s.rng;
}

/* ---- memory registry ---- */

/* The block holding [p, p + n), or null. */
static block *find_block(state &s, const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = s.blocks.upper_bound(a);
    if (it == s.blocks.begin())
        return nullptr;
    --it;
    block &b = it->second;
    /* a bare pointer (n 0) may sit one past the end, as C allows */
    if (a < (uintptr_t)b.base || a - (uintptr_t)b.base > b.size)
        return nullptr;
    if (n > b.size - (a - (uintptr_t)b.base))
        return nullptr;
    return &b;
}

bool device_accessible(const void *p, size_t bytes)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    return find_block(s, p, bytes) != nullptr;
}

bool is_device_memory(const void *p, size_t bytes)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    block *b = find_block(s, p, bytes);
    return b && b->kind == MEM_DEVICE;
}

/* Whether p lies anywhere in device memory (even partly past the block). */
static block *device_block_at(state &s, const void *p)
{
    block *b = find_block(s, p, 0);
    return b && b->kind == MEM_DEVICE ? b : nullptr;
}

static void check_guards(const block &b)
{
    const unsigned char *lo = b.raw, *hi = b.base + b.size;
    size_t hin = b.span - b.size + GUARD;
    SIM_UNPOISON(b.raw, GUARD);
    SIM_UNPOISON(b.base + b.size, hin);
    for (size_t i = 0; i < GUARD; i++)
        if (lo[i] != GUARD_BYTE)
            fault("device block %p (%zu bytes): written %zu bytes before its start", (void *)b.base,
                  b.size, GUARD - i);
    for (size_t i = 0; i < hin; i++)
        if (hi[i] != GUARD_BYTE)
            fault("device block %p (%zu bytes): written past its end (byte %zu after it)",
                  (void *)b.base, b.size, i);
    SIM_POISON(b.raw, GUARD);
    SIM_POISON(b.base + b.size, hin);
}

static void check_all_guards(state &s)
{
    for (auto &kv : s.blocks)
        if (kv.second.kind == MEM_DEVICE)
            check_guards(kv.second);
}

static cudaError_t device_alloc(void **out, size_t size)
{
    state &s = S();
    if (!out)
        return fail(cudaErrorInvalidValue);
    *out = nullptr;
    if (cur_device >= s.ndev)
        return fail(cudaErrorNoDevice);
    if (size == 0)
        return cudaSuccess; /* CUDA answers a 0-byte request with NULL */
    size_t span = (size + 255) & ~(size_t)255;
    if (span < size || span > s.mem_cap - std::min(s.mem_cap, s.mem_used))
        return fail(cudaErrorMemoryAllocation);
    unsigned char *raw = (unsigned char *)aligned_alloc(256, span + 2 * GUARD);
    if (!raw)
        return fail(cudaErrorMemoryAllocation);
    block b = {raw + GUARD, size, span, raw, MEM_DEVICE, cur_device};
    memset(raw, GUARD_BYTE, GUARD);
    memset(b.base, FRESH_BYTE, size);
    memset(b.base + size, GUARD_BYTE, span - size + GUARD);
    SIM_POISON(raw, GUARD);
    SIM_POISON(b.base + size, span - size + GUARD);
    s.blocks[(uintptr_t)b.base] = b;
    s.mem_used += span;
    *out = b.base;
    return cudaSuccess;
}

/* Frees a device block now (the caller has made sure no work uses it). */
static void device_release(state &s, block &b)
{
    check_guards(b);
    SIM_UNPOISON(b.raw, b.span + 2 * GUARD);
    s.mem_used -= b.span;
    unsigned char *raw = b.raw;
    size_t bytes = b.span + 2 * GUARD;
    s.blocks.erase((uintptr_t)b.base);
#if defined(__SANITIZE_ADDRESS__)
    (void)bytes;
    free(raw); /* ASan's own quarantine reports any later use */
#else
    /* kept poisoned a while, so a late reader sees 0xFB, not a new block */
    memset(raw, FREED_BYTE, bytes);
    s.quarantine.push_back({raw, bytes});
    s.quarantine_bytes += bytes;
    while (s.quarantine_bytes > (64u << 20)) {
        free(s.quarantine.front().first);
        s.quarantine_bytes -= s.quarantine.front().second;
        s.quarantine.pop_front();
    }
#endif
}

/* ---- the device: queued work ---- */

static bool ready(const op &o)
{
    for (const op_ptr &d : o.deps)
        if (!d->done)
            return false;
    return true;
}

static void finish(state &s, CUstream_st *st)
{
    op_ptr o = st->q.front();
    o->done = true;
    o->done_ns = now_ns();
    o->fn = nullptr;
    o->deps.clear();
    st->q.pop_front();
    if (st->destroyed && st->q.empty()) {
        s.streams.erase(std::find(s.streams.begin(), s.streams.end(), st));
        delete st;
    }
    s.cv.notify_all();
}

static size_t pending_ops(state &s)
{
    size_t n = 0;
    for (CUstream_st *st : s.streams)
        n += st->q.size();
    return n;
}

/* The device thread (deferred mode): lets work pile up until the host waits
 * on it, much is queued, or the oldest piece is 2 ms old; then runs ready
 * stream heads, the newest one three times in four, a random one else. */
static void device_main()
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    uint64_t oldest_seen = 0;
    while (!s.stop) {
        size_t n = pending_ops(s);
        if (n == 0) {
            oldest_seen = 0;
            s.cv.wait(lk);
            continue;
        }
        uint64_t t = now_ns();
        if (!oldest_seen)
            oldest_seen = t;
        if (s.waiters == 0 && n < 32 && t - oldest_seen < 2000000) {
            s.cv.wait_for(lk, std::chrono::microseconds(500));
            continue;
        }
        std::vector<CUstream_st *> cand;
        uint64_t next_retry = UINT64_MAX;
        for (CUstream_st *st : s.streams) {
            if (st->q.empty() || !ready(*st->q.front()))
                continue;
            if (st->q.front()->retry_ns > t) {
                next_retry = std::min(next_retry, st->q.front()->retry_ns);
                continue;
            }
            cand.push_back(st);
        }
        if (cand.empty()) {
            if (next_retry != UINT64_MAX)
                s.cv.wait_for(lk, std::chrono::nanoseconds(next_retry - t));
            else
                s.cv.wait_for(lk, std::chrono::milliseconds(1)); /* blocked on another op */
            continue;
        }
        CUstream_st *pick = cand[0];
        if (rnd(s) % 4 != 0) {
            for (CUstream_st *st : cand)
                if (st->q.front()->seq > pick->q.front()->seq)
                    pick = st;
        } else {
            pick = cand[rnd(s) % cand.size()];
        }
        op_ptr o = pick->q.front();
        lk.unlock();
        bool ok = o->fn(); /* in place: a polled op keeps its state in fn */
        lk.lock();
        if (ok)
            finish(s, pick);
        else
            o->retry_ns = now_ns() + 100000;
        oldest_seen = pending_ops(s) ? now_ns() : 0;
    }
}

static CUstream_st *resolve(state &s, cudaStream_t h)
{
    if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread)
        return s.streams[0];
    if (std::find(s.streams.begin(), s.streams.end(), h) == s.streams.end() || h->destroyed)
        return nullptr;
    return h;
}

/* Queues o on st with the legacy stream's implicit dependencies. */
static void push(state &s, CUstream_st *st, const op_ptr &o)
{
    if (st->legacy) {
        for (CUstream_st *b : s.streams)
            if (b != st && !(b->flags & cudaStreamNonBlocking) && b->last && !b->last->done)
                o->deps.push_back(b->last);
    } else if (!(st->flags & cudaStreamNonBlocking)) {
        CUstream_st *l = s.streams[0];
        if (l->last && !l->last->done)
            o->deps.push_back(l->last);
    }
    st->last = o;
    st->q.push_back(o);
}

/* Runs everything o needs and o itself on this thread (sync mode). */
static void run_inline(state &s, CUstream_st *st, const op_ptr &o)
{
    (void)st;
    for (const op_ptr &d : o->deps)
        if (!d->done)
            fault("sync mode: '%s' depends on unfinished work", o->what);
    while (!o->fn()) {
        s.m.unlock();
        usleep(100);
        s.m.lock();
    }
    finish(s, st);
}

static op_ptr enqueue_op(state &s, CUstream_st *st, const char *what, std::function<bool()> fn,
                         const op_ptr &after = nullptr)
{
    op_ptr o = std::make_shared<op>();
    o->seq = ++s.seq;
    o->what = what;
    o->fn = std::move(fn);
    if (after && !after->done)
        o->deps.push_back(after);
    push(s, st, o);
    if (!s.deferred) {
        run_inline(s, st, o);
        return o;
    }
    if (!s.dev_started) {
        s.dev_started = true;
        s.dev = std::thread(device_main);
    }
    s.cv.notify_all();
    return o;
}

/* ---- stream capture: the rules ----
 * Which error each misuse gets, from the runtime API's documentation
 * (cuda_runtime_api.h, driver_types.h); where it names none, the choice is
 * said at the check. A misuse invalidates the capture it concerns: its
 * cudaStreamEndCapture then answers cudaErrorStreamCaptureInvalidated. */

static thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

static const char *mode_name(cudaStreamCaptureMode m)
{
    return m == cudaStreamCaptureModeGlobal ? "global" : m == cudaStreamCaptureModeThreadLocal ? "thread-local" : "relaxed";
}

static cudaError_t capture_error(capture *c, cudaError_t e, const char *what)
{
    fprintf(stderr, "cudasim: %s during stream capture %llu: %s, the capture invalidated\n", what, c->id,
            cudaGetErrorName(e));
    c->invalid = true;
    return fail(e);
}

/* CUDASIM_CAPTURE_FAIL=end|instantiate|launch: a capture fails as a
 * driver may make it fail, for tests of a caller's fallback: "end", every
 * cudaStreamEndCapture answers cudaErrorStreamCaptureInvalidated (the
 * capture discarded); "instantiate", every cudaGraphInstantiate(WithFlags)
 * answers cudaErrorNotSupported (the graph stays the caller's); "launch",
 * the first kernel launch on a capturing stream invalidates its capture
 * (cudaErrorStreamCaptureUnsupported, as a call the capture may not hold),
 * so that launch and later work captured there are refused
 * (cudaErrorStreamCaptureInvalidated) and EndCapture answers so too. Read
 * at each use, so a test can change it between captures. */
static bool capture_fail_is(const char *what)
{
    const char *f = getenv("CUDASIM_CAPTURE_FAIL");
    if (!f || !*f)
        return false;
    if (strcmp(f, "end") && strcmp(f, "instantiate") && strcmp(f, "launch")) {
        fprintf(stderr, "cudasim: CUDASIM_CAPTURE_FAIL is end, instantiate or launch, not '%s'\n", f);
        exit(2);
    }
    return !strcmp(f, what);
}

/* A "potentially unsafe" call (cudaThreadExchangeStreamCaptureMode's list:
 * one not ordered on any stream, so a graph could not replay it): refused,
 * with cudaErrorStreamCaptureUnsupported ("the operation is not permitted
 * when the stream is capturing"), when this thread's mode forbids it: it
 * has a capture of its own not begun relaxed, or (thread mode global)
 * another thread has one begun global. */
static cudaError_t unsafe_call(state &s, const char *what)
{
    if (thread_mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    cudaError_t e = cudaSuccess;
    for (const capture_ptr &c : s.captures) {
        bool mine = c->thread == std::this_thread::get_id();
        if (mine ? c->mode != cudaStreamCaptureModeRelaxed
                 : thread_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal) {
            fprintf(stderr, "cudasim: %s is not allowed during a %s stream capture (%llu, on %s thread; this "
                            "thread's mode %s)\n",
                    what, mode_name(c->mode), c->id, mine ? "this" : "another", mode_name(thread_mode));
            e = capture_error(c.get(), cudaErrorStreamCaptureUnsupported, what);
        }
    }
    return e;
}

/* The legacy stream synchronizes with every blocking stream, so using it
 * while one captures would make the capture depend on work outside it:
 * cudaErrorStreamCaptureImplicit, that capture invalidated. */
static cudaError_t legacy_check(state &s, CUstream_st *st, const char *what)
{
    if (!st->legacy)
        return cudaSuccess;
    cudaError_t e = cudaSuccess;
    for (const capture_ptr &c : s.captures)
        for (CUstream_st *b : c->streams)
            if (!(b->flags & cudaStreamNonBlocking)) {
                fprintf(stderr, "cudasim: %s on the legacy default stream while a blocking stream captures\n",
                        what);
                e = capture_error(c.get(), cudaErrorStreamCaptureImplicit, what);
                break;
            }
    return e;
}

static bool any_blocking_capture(state &s)
{
    for (const capture_ptr &c : s.captures)
        for (CUstream_st *b : c->streams)
            if (!(b->flags & cudaStreamNonBlocking))
                return true;
    return false;
}

/* Adds a node to st's capture after st's current dependencies. */
static void capture_node(CUstream_st *st, const char *what, work_maker make)
{
    CUgraph_st *g = st->cap->g;
    g->nodes.push_back({what, std::move(make), st->cap_deps});
    g->handles.emplace_back(new CUgraphNode_st{g, g->nodes.size() - 1});
    st->cap_deps.assign(1, g->nodes.size() - 1);
}

/* Work for st: a node when st captures, else queued now (*out: its op). */
static cudaError_t submit(state &s, CUstream_st *st, const char *what, const work_maker &make,
                          op_ptr *out = nullptr)
{
    if (out)
        *out = nullptr;
    cudaError_t e = legacy_check(s, st, what);
    if (e != cudaSuccess)
        return e;
    if (st->cap) {
        if (st->cap->invalid)
            return fail(cudaErrorStreamCaptureInvalidated);
        capture_node(st, what, make);
        return cudaSuccess;
    }
    op_ptr o = enqueue_op(s, st, what, make());
    if (out)
        *out = o;
    return cudaSuccess;
}

cudaError_t enqueue_made(cudaStream_t h, const char *what, work_maker make)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    return submit(s, st, what, make);
}

cudaError_t enqueue(cudaStream_t h, const char *what, std::function<bool()> fn)
{
    return enqueue_made(h, what, [fn] { return fn; });
}

/* Blocks until done() (the device thread runs the work; in sync mode
 * everything is done already). */
template <typename F> static void wait_until(state &s, std::unique_lock<std::recursive_mutex> &lk, F done)
{
    if (done())
        return;
    if (!s.deferred)
        fault("sync mode: waiting on work that cannot finish");
    s.waiters++;
    s.cv.notify_all();
    while (!done())
        s.cv.wait_for(lk, std::chrono::milliseconds(5));
    s.waiters--;
}

static void device_sync(state &s, std::unique_lock<std::recursive_mutex> &lk)
{
    wait_until(s, lk, [&] { return pending_ops(s) == 0; });
    check_all_guards(s);
}

/* Lets the device thread run a little while the host polls a query. */
static void nudge(state &s)
{
    if (s.deferred && s.dev_started) {
        s.waiters++;
        s.cv.notify_all();
        s.m.unlock();
        usleep(50);
        s.m.lock();
        s.waiters--;
    }
}

static void at_exit()
{
    state &s = S();
    {
        std::lock_guard<std::recursive_mutex> lk(s.m);
        s.stop = true;
        s.cv.notify_all();
    }
    if (s.dev_started && s.dev.joinable())
        s.dev.join();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    size_t nb = 0, bytes = 0;
    for (auto &kv : s.blocks)
        if (kv.second.kind == MEM_DEVICE) {
            check_guards(kv.second);
            nb++;
            bytes += kv.second.size;
        }
    long nstreams = (long)s.streams.size() - 1;
    if (nb || nstreams > 0 || s.live_events > 0 || !s.graphs.empty() || !s.execs.empty()) {
        fprintf(stderr, "cudasim: at exit: %zu device blocks (%zu bytes), %ld streams, %ld events, %zu graphs, "
                        "%zu graph execs never freed\n",
                nb, bytes, nstreams, s.live_events, s.graphs.size(), s.execs.size());
        const char *l = getenv("CUDASIM_LEAKS");
        if (l && !strcmp(l, "fail"))
            _exit(3);
    }
}

static void at_fork_child()
{
    /* threads do not cross fork: a child that goes on using the simulated
     * device (CUDA forbids it after init; tests fork before) starts over
     * without the device thread */
    state &s = S();
    new (&s.m) std::recursive_mutex();
    new (&s.cv) std::condition_variable_any();
    if (s.dev_started) {
        new (&s.dev) std::thread();
        s.dev_started = false;
    }
}

/* ---- copies ---- */

static cudaError_t check_copy(state &s, void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    block *bd = device_block_at(s, dst), *bs = device_block_at(s, src);
    bool dd = bd != nullptr, sd = bs != nullptr;
    const char *kn[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
    bool ok = true;
    switch (kind) {
    case cudaMemcpyHostToHost: ok = !dd && !sd; break;
    case cudaMemcpyHostToDevice: ok = dd && !sd; break;
    case cudaMemcpyDeviceToHost: ok = !dd && sd; break;
    case cudaMemcpyDeviceToDevice: ok = dd && sd; break;
    case cudaMemcpyDefault: break;
    default: return fail(cudaErrorInvalidMemcpyDirection);
    }
    if (!ok) {
        fprintf(stderr, "cudasim: cudaMemcpy%s from %s %p to %s %p\n", kn[kind], sd ? "device" : "host",
                src, dd ? "device" : "host", dst);
        return fail(cudaErrorInvalidValue);
    }
    if (dd && !find_block(s, dst, n))
        fault("copy of %zu bytes to device %p runs past its block (%zu bytes at %p)", n, dst,
              bd->size, (void *)bd->base);
    if (sd && !find_block(s, src, n))
        fault("copy of %zu bytes from device %p runs past its block (%zu bytes at %p)", n, src,
              bs->size, (void *)bs->base);
    return cudaSuccess;
}

static bool pageable(state &s, const void *p, size_t n)
{
    block *b = find_block(s, p, n);
    return !b || b->kind == MEM_DEVICE;
}

static cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t h,
                        bool async)
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    if (n == 0)
        return cudaSuccess;
    if (!dst || !src)
        return fail(cudaErrorInvalidValue);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = async ? cudaSuccess : unsafe_call(s, "a synchronous cudaMemcpy");
    if (e != cudaSuccess)
        return e;
    e = check_copy(s, dst, src, n, kind);
    if (e != cudaSuccess)
        return e;
    bool from_host = !device_block_at(s, src), to_host = !device_block_at(s, dst);
    /* a graph replays a copy from the host reading the host memory then:
     * pageable memory cannot be (the driver stages it at the call) */
    if (st->cap && ((from_host && pageable(s, src, n)) || (to_host && pageable(s, dst, n))))
        return capture_error(st->cap.get(), cudaErrorStreamCaptureUnsupported,
                             "cudaMemcpyAsync with pageable host memory");
    std::shared_ptr<std::vector<unsigned char>> staged;
    if (async && from_host && pageable(s, src, n)) {
        /* the driver stages pageable sources before returning */
        staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                              (const unsigned char *)src + n);
        src = staged->data();
    }
    op_ptr o;
    e = submit(s, st, "memcpy", [dst, src, n, staged] {
        return std::function<bool()>([dst, src, n, staged] {
            memmove(dst, src, n);
            return true;
        });
    }, &o);
    if (e != cudaSuccess)
        return e;
    if (o && (!async || (to_host && pageable(s, dst, n))))
        wait_until(s, lk, [&] { return o->done; });
    return cudaSuccess;
}

static cudaError_t set(void *dst, int v, size_t n, cudaStream_t h, bool async)
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    if (n == 0)
        return cudaSuccess;
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = async ? cudaSuccess : unsafe_call(s, "a synchronous cudaMemset");
    if (e != cudaSuccess)
        return e;
    if (!find_block(s, dst, n) || find_block(s, dst, n)->kind != MEM_DEVICE) {
        fprintf(stderr, "cudasim: cudaMemset of %zu bytes at %p: not device memory\n", n, dst);
        return fail(cudaErrorInvalidValue);
    }
    op_ptr o;
    e = submit(s, st, "memset", [dst, v, n] {
        return std::function<bool()>([dst, v, n] {
            memset(dst, v, n);
            return true;
        });
    }, &o);
    if (e != cudaSuccess)
        return e;
    if (o && !async)
        wait_until(s, lk, [&] { return o->done; });
    return cudaSuccess;
}

/* ---- launches (tests/cudasim/device.h calls these) ---- */

cudaError_t launch_check(const void *func, dim3 g, dim3 b, size_t smem, cudaStream_t h,
                         const char *name)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    const profile &p = *s.prof;
    if (cur_device >= s.ndev)
        return fail(cudaErrorNoDevice);
    if (!resolve(s, h))
        return fail(cudaErrorInvalidResourceHandle);
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (threads == 0 || threads > (unsigned)p.max_threads_per_block || b.x > 1024 || b.y > 1024 ||
        b.z > 64 || g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 ||
        g.z > 65535) {
        fprintf(stderr, "cudasim: launch of %s: grid (%u,%u,%u) block (%u,%u,%u): invalid configuration\n",
                name, g.x, g.y, g.z, b.x, b.y, b.z);
        return fail(cudaErrorInvalidConfiguration);
    }
    auto it = s.func_smem.find(func);
    size_t limit = it != s.func_smem.end() ? (size_t)std::max(it->second, 0) : 0;
    if (smem > std::max(limit, (size_t)p.smem_per_block)) {
        fprintf(stderr, "cudasim: launch of %s: %zu bytes of dynamic shared memory, the limit is %zu "
                        "(cudaFuncSetAttribute raises it up to %d on %s)\n",
                name, smem, std::max(limit, (size_t)p.smem_per_block), p.smem_per_block_optin,
                p.key);
        return fail(cudaErrorInvalidValue);
    }
    CUstream_st *st = resolve(s, h);
    if (st->cap && !st->cap->invalid && capture_fail_is("launch"))
        return capture_error(st->cap.get(), cudaErrorStreamCaptureUnsupported,
                             "a kernel launch (CUDASIM_CAPTURE_FAIL=launch)");
    return cudaSuccess;
}

} // namespace cudasim

using namespace cudasim;

/* ---- the C entry points ---- */
extern "C" {

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
#define N(x) case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation)
        N(cudaErrorInitializationError) N(cudaErrorInvalidConfiguration)
        N(cudaErrorInvalidMemcpyDirection) N(cudaErrorInvalidDevice) N(cudaErrorNoDevice)
        N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady) N(cudaErrorInsufficientDriver)
        N(cudaErrorHostMemoryAlreadyRegistered) N(cudaErrorHostMemoryNotRegistered)
        N(cudaErrorLaunchOutOfResources) N(cudaErrorIllegalAddress) N(cudaErrorNotSupported)
        N(cudaErrorStreamCaptureUnsupported) N(cudaErrorStreamCaptureInvalidated)
        N(cudaErrorStreamCaptureMerge) N(cudaErrorStreamCaptureUnmatched)
        N(cudaErrorStreamCaptureUnjoined) N(cudaErrorStreamCaptureIsolation)
        N(cudaErrorStreamCaptureImplicit) N(cudaErrorCapturedEvent)
        N(cudaErrorStreamCaptureWrongThread) N(cudaErrorIllegalState)
#undef N
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n)
        return fail(cudaErrorInvalidValue);
    *n = S().ndev;
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= S().ndev)
        return fail(S().ndev ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    cur_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    if (!d)
        return fail(cudaErrorInvalidValue);
    if (!S().ndev)
        return fail(cudaErrorNoDevice);
    *d = cur_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    state &s = S();
    if (!p)
        return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= s.ndev)
        return fail(cudaErrorInvalidDevice);
    const profile &f = *s.prof;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", f.name);
    p->major = f.major;
    p->minor = f.minor;
    p->totalGlobalMem = s.mem_cap;
    p->multiProcessorCount = f.sms;
    p->sharedMemPerBlock = (size_t)f.smem_per_block;
    p->sharedMemPerBlockOptin = (size_t)f.smem_per_block_optin;
    p->sharedMemPerMultiprocessor = (size_t)f.smem_per_sm;
    p->maxThreadsPerBlock = f.max_threads_per_block;
    p->maxThreadsPerMultiProcessor = 2048;
    p->regsPerBlock = f.regs_per_block;
    p->warpSize = 32;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->pciBusID = d;
    p->unifiedAddressing = 1;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    state &s = S();
    if (!v)
        return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= s.ndev)
        return fail(cudaErrorInvalidDevice);
    const profile &f = *s.prof;
    switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = f.sms; break;
    case cudaDevAttrComputeCapabilityMajor: *v = f.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = f.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = f.smem_per_block; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = f.smem_per_block_optin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = f.smem_per_sm; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = f.max_threads_per_block; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrPciBusId: *v = d; break;
    case cudaDevAttrUnifiedAddressing: *v = 1; break;
    default:
        fprintf(stderr, "cudasim: cudaDeviceGetAttribute(%d) is not simulated\n", (int)a);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!func)
        return fail(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        /* the limit is the opt-in figure (less the kernel's static shared
         * memory, which the stand-in does not know: taken as 0) */
        if (value < 0 || value > s.prof->smem_per_block_optin) {
            fprintf(stderr, "cudasim: cudaFuncSetAttribute: %d bytes of dynamic shared memory, "
                            "%s allows %d\n", value, s.prof->key, s.prof->smem_per_block_optin);
            return fail(cudaErrorInvalidValue);
        }
        s.func_smem[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return cudaSuccess;
    return fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!free_b || !total)
        return fail(cudaErrorInvalidValue);
    *total = s.mem_cap;
    *free_b = s.mem_cap - std::min(s.mem_cap, s.mem_used);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    cudaError_t e = unsafe_call(s, "cudaMalloc");
    if (e != cudaSuccess) {
        if (p)
            *p = nullptr;
        return e;
    }
    return device_alloc(p, size);
}

cudaError_t cudaFree(void *p)
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    if (!p)
        return cudaSuccess;
    block *b = find_block(s, p, 0);
    if (!b || b->kind != MEM_DEVICE || b->base != p) {
        fprintf(stderr, "cudasim: cudaFree(%p): not the start of a device block\n", p);
        return fail(cudaErrorInvalidValue);
    }
    if (s.graph_blocks.count(p)) {
        fprintf(stderr, "cudasim: cudaFree(%p): memory a graph allocated (its cudaFreeAsync is in it)\n", p);
        return fail(cudaErrorInvalidValue);
    }
    cudaError_t e = unsafe_call(s, "cudaFree");
    if (e != cudaSuccess)
        return e;
    /* cudaFree synchronizes with the device before releasing */
    device_sync(s, lk);
    b = find_block(s, p, 0);
    device_release(s, *b);
    return cudaSuccess;
}

graph_mem::~graph_mem()
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    s.graph_blocks.erase(p);
    block *b = find_block(s, p, 0);
    if (b && b->base == p)
        device_release(s, *b);
}

/* On a capturing stream: a memory node, as CUDA makes one. The block is
 * the graph's, at the address returned now, for every launch; the node
 * fills it with 0xFF (fresh) each launch and the matching cudaFreeAsync's
 * node with 0xFB (freed), so a launch that reads what an earlier one left
 * shows. */
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t h)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = legacy_check(s, st, "cudaMallocAsync");
    if (e != cudaSuccess)
        return e;
    if (!st->cap)
        return device_alloc(p, size);
    if (st->cap->invalid)
        return fail(cudaErrorStreamCaptureInvalidated);
    e = device_alloc(p, size);
    if (e != cudaSuccess || !*p)
        return e;
    void *m = *p;
    CUgraph_st *g = st->cap->g;
    g->mem->blocks.push_back(std::make_shared<graph_mem>());
    g->mem->blocks.back()->p = m;
    s.graph_blocks.insert(m);
    g->mem_live.insert(m);
    std::shared_ptr<graph_mem> keep = g->mem->blocks.back();
    capture_node(st, "cudaMallocAsync (graph)", [keep, size] {
        return std::function<bool()>([keep, size] {
            memset(keep->p, FRESH_BYTE, size);
            return true;
        });
    });
    return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t h)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!p)
        return cudaSuccess;
    block *b = find_block(s, p, 0);
    if (!b || b->kind != MEM_DEVICE || b->base != p) {
        fprintf(stderr, "cudasim: cudaFreeAsync(%p): not the start of a device block\n", p);
        return fail(cudaErrorInvalidValue);
    }
    cudaError_t e = legacy_check(s, st, "cudaFreeAsync");
    if (e != cudaSuccess)
        return e;
    if (st->cap) {
        if (st->cap->invalid)
            return fail(cudaErrorStreamCaptureInvalidated);
        CUgraph_st *g = st->cap->g;
        if (!g->mem_live.count(p)) {
            /* CUDA captures it as a free node of memory allocated outside
             * the graph (only one launch could then run): not simulated */
            fprintf(stderr, "cudasim: cudaFreeAsync(%p) in a capture of memory the capture did not "
                            "allocate: not simulated\n", p);
            return fail(cudaErrorNotSupported);
        }
        g->mem_live.erase(p);
        size_t n = b->size;
        capture_node(st, "cudaFreeAsync (graph)", [p, n] {
            return std::function<bool()>([p, n] {
                memset(p, FREED_BYTE, n);
                return true;
            });
        });
        return cudaSuccess;
    }
    if (s.graph_blocks.count(p)) {
        fprintf(stderr, "cudasim: cudaFreeAsync(%p): memory of a graph (its own cudaFreeAsync is in it)\n", p);
        return fail(cudaErrorInvalidValue);
    }
    enqueue_op(s, st, "cudaFreeAsync", [p] {
        state &s2 = S();
        std::lock_guard<std::recursive_mutex> lk2(s2.m);
        block *b2 = find_block(s2, p, 0);
        if (!b2 || b2->base != p)
            fault("cudaFreeAsync(%p): freed twice", p);
        device_release(s2, *b2);
        return true;
    });
    return cudaSuccess;
}

static cudaError_t host_register(void *p, size_t size, mem_kind kind)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!p || !size)
        return fail(cudaErrorInvalidValue);
    uintptr_t a = (uintptr_t)p;
    auto it = s.blocks.lower_bound(a);
    bool overlap = it != s.blocks.end() && it->first < a + size;
    if (it != s.blocks.begin()) {
        --it;
        overlap |= it->first + it->second.size > a;
    }
    if (overlap)
        return fail(kind == MEM_REGISTERED ? cudaErrorHostMemoryAlreadyRegistered
                                           : cudaErrorInvalidValue);
    block b = {(unsigned char *)p, size, size, (unsigned char *)p, kind, cur_device};
    s.blocks[a] = b;
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    (void)flags;
    return host_register(p, size, MEM_REGISTERED);
}

cudaError_t cudaHostUnregister(void *p)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    auto it = s.blocks.find((uintptr_t)p);
    if (it == s.blocks.end() || it->second.kind != MEM_REGISTERED)
        return fail(cudaErrorHostMemoryNotRegistered);
    s.blocks.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    *p = nullptr;
    void *m = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
    if (!m)
        return fail(cudaErrorMemoryAllocation);
    cudaError_t e = host_register(m, size ? size : 1, MEM_PINNED);
    if (e != cudaSuccess) {
        free(m);
        return e;
    }
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    if (!p)
        return cudaSuccess;
    auto it = s.blocks.find((uintptr_t)p);
    if (it == s.blocks.end() || it->second.kind != MEM_PINNED)
        return fail(cudaErrorInvalidValue);
    cudaError_t e = unsafe_call(s, "cudaFreeHost");
    if (e != cudaSuccess)
        return e;
    device_sync(s, lk); /* like cudaFree: no queued copy may still use it */
    s.blocks.erase((uintptr_t)p);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    return copy(dst, src, n, k, nullptr, false);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t h)
{
    return copy(dst, src, n, k, h, true);
}
cudaError_t cudaMemset(void *dst, int v, size_t n) { return set(dst, v, n, nullptr, false); }
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t h)
{
    return set(dst, v, n, h, true);
}

/* Waiting for the device waits for the capturing streams, which cannot be
 * (their work is not queued): refused while any stream captures, whatever
 * the mode, with cudaErrorStreamCaptureUnsupported (the documentation
 * names no code for it), every capture invalidated. */
cudaError_t cudaDeviceSynchronize(void)
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    cudaError_t e = cudaSuccess;
    for (const capture_ptr &c : s.captures)
        e = capture_error(c.get(), cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize");
    if (e != cudaSuccess)
        return e;
    device_sync(s, lk);
    return cudaSuccess;
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *h, unsigned int flags)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!h || (flags & ~(unsigned)cudaStreamNonBlocking))
        return fail(cudaErrorInvalidValue);
    CUstream_st *st = new CUstream_st;
    st->flags = flags;
    s.streams.push_back(st);
    *h = st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *h) { return cudaStreamCreateWithFlags(h, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st || st->legacy)
        return fail(cudaErrorInvalidResourceHandle);
    /* the documentation names no code: the stand-in refuses it */
    if (st->cap)
        return capture_error(st->cap.get(), cudaErrorStreamCaptureUnsupported, "cudaStreamDestroy");
    /* queued work still runs; the stream goes when it is empty */
    st->destroyed = true;
    if (st->q.empty()) {
        s.streams.erase(std::find(s.streams.begin(), s.streams.end(), st));
        delete st;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = legacy_check(s, st, "cudaStreamSynchronize");
    if (e != cudaSuccess)
        return e;
    if (st->cap)
        return capture_error(st->cap.get(), cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize");
    op_ptr last = st->last;
    if (last)
        wait_until(s, lk, [&] { return last->done; });
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = legacy_check(s, st, "cudaStreamQuery");
    if (e != cudaSuccess)
        return e;
    if (st->cap)
        return capture_error(st->cap.get(), cudaErrorStreamCaptureUnsupported, "cudaStreamQuery");
    if (!st->last || st->last->done)
        return cudaSuccess;
    nudge(s);
    return st->last->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t ev, unsigned int flags)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st || !ev)
        return fail(cudaErrorInvalidResourceHandle);
    if (flags != 0)
        return fail(cudaErrorInvalidValue);
    cudaError_t e = legacy_check(s, st, "cudaStreamWaitEvent");
    if (e != cudaSuccess)
        return e;
    if (ev->cap && !ev->cap->ended) {
        /* an event recorded in a capture: a fork into st, or a join */
        capture_ptr c = ev->cap;
        if (st->cap == c) {
            for (size_t d : ev->cap_deps)
                if (std::find(st->cap_deps.begin(), st->cap_deps.end(), d) == st->cap_deps.end())
                    st->cap_deps.push_back(d);
            return cudaSuccess;
        }
        if (st->cap) {
            capture_error(st->cap.get(), cudaErrorStreamCaptureMerge, "cudaStreamWaitEvent");
            return capture_error(c.get(), cudaErrorStreamCaptureMerge, "cudaStreamWaitEvent");
        }
        if (st->legacy) /* it cannot capture (cudaStreamBeginCapture's rule) */
            return capture_error(c.get(), cudaErrorStreamCaptureImplicit, "cudaStreamWaitEvent on the legacy stream");
        if (c->invalid)
            return fail(cudaErrorStreamCaptureInvalidated);
        st->cap = c;
        st->cap_deps = ev->cap_deps;
        c->streams.push_back(st);
        return cudaSuccess;
    }
    if (st->cap) {
        /* without cudaEventWaitExternal a capture may not depend on work
         * outside it; an event never recorded is no work at all */
        if (!ev->rec && !ev->cap)
            return cudaSuccess;
        return capture_error(st->cap.get(), cudaErrorStreamCaptureIsolation,
                             "cudaStreamWaitEvent on an event recorded outside the capture");
    }
    if (ev->cap) {
        /* recorded in a capture that has ended: what would it wait for?
         * The documentation does not say; the stand-in refuses it with
         * cudaErrorCapturedEvent rather than wait for nothing */
        fprintf(stderr, "cudasim: cudaStreamWaitEvent on an event last recorded in a capture (%llu, ended)\n",
                ev->cap->id);
        return fail(cudaErrorCapturedEvent);
    }
    op_ptr rec = ev->rec; /* the record as of now; a later one does not count */
    if (!rec || rec->done)
        return cudaSuccess;
    op_ptr o = std::make_shared<op>();
    o->seq = ++s.seq;
    o->what = "cudaStreamWaitEvent";
    o->fn = [] { return true; };
    o->deps.push_back(rec);
    push(s, st, o);
    if (!s.deferred)
        run_inline(s, st, o);
    s.cv.notify_all();
    return cudaSuccess;
}

/* A host function holds back its own stream only: in deferred mode it runs
 * on a thread of its own, polled like an NCCL wait, so that the device
 * thread goes on with the other streams meanwhile (as a GPU's copy and
 * compute engines do while one stream waits on the host). */
struct host_call {
    std::thread t;
    std::atomic<bool> started{false}, done{false};
};

/* one run of a host function in deferred mode (see above) */
static std::function<bool()> host_func_run(cudaHostFn_t fn, void *arg)
{
    std::shared_ptr<host_call> c = std::make_shared<host_call>();
    return [fn, arg, c] {
        if (!c->started) {
            c->started = true;
            c->t = std::thread([fn, arg, c] {
                fn(arg);
                c->done = true;
            });
            return false;
        }
        if (!c->done)
            return false;
        c->t.join();
        return true;
    };
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *arg)
{
    if (!fn)
        return fail(cudaErrorInvalidValue);
    if (!S().deferred)
        return enqueue(h, "cudaLaunchHostFunc", [fn, arg] {
            fn(arg);
            return true;
        });
    return enqueue_made(h, "cudaLaunchHostFunc", [fn, arg] { return host_func_run(fn, arg); });
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!ev || (flags & ~(unsigned)(cudaEventDisableTiming | cudaEventBlockingSync)))
        return fail(cudaErrorInvalidValue);
    *ev = new CUevent_st;
    (*ev)->flags = flags;
    s.live_events++;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    s.live_events--;
    delete ev; /* a pending record keeps its op alive by itself */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t h)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!ev || !st)
        return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = legacy_check(s, st, "cudaEventRecord");
    if (e != cudaSuccess)
        return e;
    if (st->cap) {
        /* a capture point, no node: what a wait on it joins */
        if (st->cap->invalid)
            return fail(cudaErrorStreamCaptureInvalidated);
        ev->cap = st->cap;
        ev->cap_deps = st->cap_deps;
        ev->rec = nullptr;
        return cudaSuccess;
    }
    ev->cap = nullptr;
    ev->cap_deps.clear();
    ev->rec = enqueue_op(s, st, "cudaEventRecord", [] { return true; });
    return cudaSuccess;
}

/* An event last recorded in a capture has no work to wait for or query:
 * cudaErrorCapturedEvent, the capture (if still on) invalidated. After its
 * capture ended the documentation is silent; the stand-in keeps refusing
 * rather than answer for work that never ran. */
static cudaError_t captured_event(cudaEvent_t ev, const char *what)
{
    if (!ev->cap->ended)
        return capture_error(ev->cap.get(), cudaErrorCapturedEvent, what);
    fprintf(stderr, "cudasim: %s on an event last recorded in a capture (%llu, ended)\n", what, ev->cap->id);
    return fail(cudaErrorCapturedEvent);
}

cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    if (ev->cap)
        return captured_event(ev, "cudaEventQuery");
    if (!ev->rec || ev->rec->done)
        return cudaSuccess;
    nudge(s);
    return ev->rec->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    state &s = S();
    std::unique_lock<std::recursive_mutex> lk(s.m);
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    if (ev->cap)
        return captured_event(ev, "cudaEventSynchronize");
    op_ptr rec = ev->rec;
    if (rec)
        wait_until(s, lk, [&] { return rec->done; });
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!ms || !a || !b)
        return fail(cudaErrorInvalidValue);
    if (a->cap || b->cap)
        return captured_event(a->cap ? a : b, "cudaEventElapsedTime");
    if ((a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming) || !a->rec ||
        !b->rec)
        return fail(cudaErrorInvalidResourceHandle);
    if (!a->rec->done || !b->rec->done)
        return fail(cudaErrorNotReady);
    *ms = (float)(((double)b->rec->done_ns - (double)a->rec->done_ns) / 1e6);
    return cudaSuccess;
}


/* ---- stream capture and graphs ---- */

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (!mode || (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
                  *mode != cudaStreamCaptureModeRelaxed))
        return fail(cudaErrorInvalidValue);
    std::swap(*mode, thread_mode);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    /* "may not be initiated if stream is cudaStreamLegacy": no code named,
     * the stand-in answers cudaErrorStreamCaptureUnsupported */
    if (st->legacy) {
        fprintf(stderr, "cudasim: cudaStreamBeginCapture on the legacy default stream\n");
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (st->cap) { /* "only if the stream is not already in capture mode" */
        fprintf(stderr, "cudasim: cudaStreamBeginCapture on a stream already capturing\n");
        return fail(cudaErrorInvalidValue);
    }
    capture_ptr c = std::make_shared<capture>();
    c->id = ++s.capture_ids;
    c->g = new CUgraph_st;
    c->origin = st;
    c->mode = mode;
    c->thread = std::this_thread::get_id();
    c->streams.push_back(st);
    st->cap = c;
    st->cap_deps.clear();
    s.captures.push_back(c);
    return cudaSuccess;
}

/* The nodes n reaches through its dependencies, n included. */
static void ancestors(const CUgraph_st *g, const std::vector<size_t> &from, std::vector<bool> &seen)
{
    std::vector<size_t> todo(from);
    while (!todo.empty()) {
        size_t n = todo.back();
        todo.pop_back();
        if (seen[n])
            continue;
        seen[n] = true;
        for (size_t d : g->nodes[n].deps)
            todo.push_back(d);
    }
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *pGraph)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!pGraph)
        return fail(cudaErrorInvalidValue);
    *pGraph = nullptr;
    if (!st->cap) {
        fprintf(stderr, "cudasim: cudaStreamEndCapture on a stream not capturing\n");
        return fail(cudaErrorInvalidValue);
    }
    capture_ptr c = st->cap;
    if (c->origin != st) {
        fprintf(stderr, "cudasim: cudaStreamEndCapture on a stream that joined capture %llu, not its origin\n",
                c->id);
        return capture_error(c.get(), cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture");
    }
    if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
        return fail(cudaErrorStreamCaptureWrongThread);
    /* every stream that joined must have been joined back into the origin */
    CUgraph_st *g = c->g;
    std::vector<bool> reached(g->nodes.size(), false);
    ancestors(g, st->cap_deps, reached);
    size_t unjoined = 0;
    for (CUstream_st *b : c->streams)
        for (size_t d : b->cap_deps)
            unjoined += !reached[d];
    for (CUstream_st *b : c->streams) {
        b->cap = nullptr;
        b->cap_deps.clear();
    }
    c->ended = true;
    s.captures.erase(std::find(s.captures.begin(), s.captures.end(), c));
    cudaError_t e = cudaSuccess;
    if (c->invalid) {
        e = cudaErrorStreamCaptureInvalidated;
    } else if (capture_fail_is("end")) {
        fprintf(stderr, "cudasim: cudaStreamEndCapture fails (CUDASIM_CAPTURE_FAIL=end)\n");
        e = cudaErrorStreamCaptureInvalidated;
    } else if (unjoined) {
        fprintf(stderr, "cudasim: cudaStreamEndCapture: %zu stream(s) of capture %llu never joined back into "
                        "the origin stream (an event recorded there, waited on by the origin)\n",
                unjoined, c->id);
        e = cudaErrorStreamCaptureUnjoined;
    } else if (!g->mem_live.empty()) {
        /* CUDA lets such a block outlive the launch (freed outside the
         * graph before the next one): not simulated */
        fprintf(stderr, "cudasim: cudaStreamEndCapture: %zu block(s) of cudaMallocAsync in capture %llu not freed "
                        "in it (cudaFreeAsync on a captured stream): not simulated\n",
                g->mem_live.size(), c->id);
        e = cudaErrorNotSupported;
    }
    if (e != cudaSuccess) {
        delete g;
        c->g = nullptr;
        return fail(e);
    }
    s.graphs.insert(g);
    c->g = nullptr;
    *pGraph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *status)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!status)
        return fail(cudaErrorInvalidValue);
    /* the one legacy-stream use that does not invalidate (documented) */
    if (st->legacy && any_blocking_capture(s))
        return fail(cudaErrorStreamCaptureImplicit);
    *status = !st->cap ? cudaStreamCaptureStatusNone
              : st->cap->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t h, enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id_out, cudaGraph_t *graph_out,
                                     const cudaGraphNode_t **deps_out, const cudaGraphEdgeData **edges_out,
                                     size_t *ndeps_out)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!status || (edges_out && !deps_out))
        return fail(cudaErrorInvalidValue);
    if (st->legacy && any_blocking_capture(s))
        return fail(cudaErrorStreamCaptureImplicit);
    cudaError_t e = cudaStreamIsCapturing(h, status);
    if (e != cudaSuccess || *status != cudaStreamCaptureStatusActive)
        return e;
    if (id_out)
        *id_out = st->cap->id;
    if (graph_out)
        *graph_out = st->cap->g;
    st->info_deps.clear();
    for (size_t d : st->cap_deps)
        st->info_deps.push_back(st->cap->g->handles[d].get());
    st->info_edges.assign(st->info_deps.size(), cudaGraphEdgeData{});
    if (deps_out)
        *deps_out = st->info_deps.data();
    if (edges_out)
        *edges_out = st->info_edges.data();
    if (ndeps_out)
        *ndeps_out = st->info_deps.size();
    return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *num)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    bool capturing = false;
    for (const capture_ptr &c : s.captures)
        capturing |= c->g == g;
    if (!g || !num || (!capturing && !s.graphs.count(g)))
        return fail(cudaErrorInvalidValue);
    size_t n = g->nodes.size();
    if (nodes)
        for (size_t i = 0; i < *num; i++)
            nodes[i] = i < n ? g->handles[i].get() : nullptr;
    *num = n < *num || !nodes ? n : *num;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!g || !s.graphs.count(g))
        return fail(cudaErrorInvalidValue);
    s.graphs.erase(g);
    delete g; /* its execs keep what they need */
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!out)
        return fail(cudaErrorInvalidValue);
    *out = nullptr;
    if (!g || !s.graphs.count(g))
        return fail(cudaErrorInvalidValue);
    /* upload and device launch are not simulated */
    if (flags & ~(unsigned long long)(cudaGraphInstantiateFlagAutoFreeOnLaunch |
                                      cudaGraphInstantiateFlagUseNodePriority)) {
        fprintf(stderr, "cudasim: cudaGraphInstantiate flags %#llx not simulated\n", flags);
        return fail(cudaErrorInvalidValue);
    }
    if (capture_fail_is("instantiate")) {
        fprintf(stderr, "cudasim: cudaGraphInstantiate fails (CUDASIM_CAPTURE_FAIL=instantiate)\n");
        return fail(cudaErrorNotSupported);
    }
    /* a graph with memory nodes has one instantiation at a time: its
     * blocks have one address (the documentation's rule; its code for the
     * breach is not named, the stand-in answers cudaErrorNotSupported) */
    if (!g->mem->blocks.empty() && g->mem->execs > 0) {
        fprintf(stderr, "cudasim: cudaGraphInstantiate: a graph with memory nodes instantiated twice\n");
        return fail(cudaErrorNotSupported);
    }
    CUgraphExec_st *x = new CUgraphExec_st;
    x->nodes = g->nodes;
    x->mem = g->mem;
    x->mem->execs++;
    s.execs.insert(x);
    *out = x;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(out, g, flags);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    if (!x || !s.execs.count(x))
        return fail(cudaErrorInvalidValue);
    s.execs.erase(x);
    x->mem->execs--;
    delete x; /* a launch still queued keeps its own work (and blocks) */
    return cudaSuccess;
}

/* Queues the graph's nodes on the stream in index order (which respects
 * every dependency: a node only depends on earlier ones), each made afresh;
 * the first waits for the exec's previous launch, wherever that runs. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t h)
{
    state &s = S();
    std::lock_guard<std::recursive_mutex> lk(s.m);
    CUstream_st *st = resolve(s, h);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!x || !s.execs.count(x))
        return fail(cudaErrorInvalidValue);
    cudaError_t e = legacy_check(s, st, "cudaGraphLaunch");
    if (e != cudaSuccess)
        return e;
    if (st->cap) { /* CUDA adds a child graph node: not simulated */
        fprintf(stderr, "cudasim: cudaGraphLaunch on a capturing stream (a child graph) is not simulated\n");
        return capture_error(st->cap.get(), cudaErrorNotSupported, "cudaGraphLaunch");
    }
    op_ptr after = x->last;
    for (const gnode &n : x->nodes) {
        x->last = enqueue_op(s, st, n.what, n.make(), after);
        after = nullptr;
    }
    return cudaSuccess;
}

} // extern "C"
