/* nccl.cpp — cudasim's NCCL: the calls worker/comm_nccl.cu makes, between
 * PROCESSES of one host (one per rank, as on a GPU box) over one POSIX
 * shared-memory segment per communicator. Signatures: the toolkit's nccl.h.
 *
 * The unique id holds a magic and the segment's name, "/bertd-ncclsim-
 * <pid>-<n>-<random>". The segment has a fixed size, so every rank can
 * shm_open(O_CREAT) + ftruncate it in any order (a size computed from
 * nranks would let a rank that disagrees shrink it under its peers):
 *   [0, 4 KiB)  magic, nranks; per rank, one cache line each:
 *               pid, joined, left (1 aborted, 2 destroyed), posted, done
 *   then kMaxRanks slots of kChunk (1 MiB), one per rank.
 * Whoever first sees every rank joined unlinks the name, so nothing stays
 * in /dev/shm even after kill -9; a teardown before that unlinks it too.
 *
 * Data moves in chunks, numbered per communicator when the operation is
 * queued (so a communicator's operations run in call order even from
 * different streams, as NCCL serialises them). Under stream capture the
 * call only checks its arguments and leaves a node; every cudaGraphLaunch
 * makes a new operation from it and numbers its chunks then, in the order
 * the host queues calls and launches: ranks that make the same calls and
 * launches match, as with eager calls. The node holds a reference to the
 * communicator; launching it after ncclCommDestroy/Abort is a fault. Chunk s: a sending rank waits for
 * every rank's done >= s-1 (nobody still reads its slot), copies its part
 * of sendbuff into its slot, sets posted = s; it waits for posted >= s of
 * every rank (broadcast: of the root), combines the slots into recvbuff
 * and sets done = s. In place works: a chunk is copied out before it is
 * written. __atomic acquire/release on the mapping, no process-shared
 * mutex (a killed holder would wedge its peers).
 *
 * Arithmetic: every rank combines the slots in rank order 0..n-1, so all
 * get the same bits. half/bf16 go through float and are rounded back
 * after every operation, which is the correctly rounded result in the
 * 16-bit type (float has >= 2p+2 bits for both): a reduction in that type.
 * ncclAvg as NCCL does it for floating types: every contribution is first
 * multiplied by 1/nranks rounded to the type, then they are summed.
 *
 * Progress: a collective is a polled state machine queued on the stream
 * (cudasim::enqueue); each poll does what it can without blocking.
 *
 * Liveness: each rank holds an OFD lock on byte <rank> of the segment,
 * which the kernel drops when the process ends, however it ends, even if
 * it stays an unreaped zombie (where kill(pid, 0) still succeeds: in
 * tests/gpu/test_comm_nccl.c a dead rank waits for its parent that way).
 * A rank waiting on a peer probes it (at most every ms); a peer gone or
 * with its left flag set, or no progress for CUDASIM_NCCL_TIMEOUT_S
 * (default 120), puts the communicator in an asynchronous error
 * (ncclRemoteError, ncclSystemError) that ncclCommGetAsyncError and later
 * calls report, explained by ncclGetLastError. The stuck operation then:
 * - CUDASIM_STREAMS=sync: it runs inside the NCCL call, so it completes at
 *   once (nobody could abort it), output undefined; the call returns the
 *   error.
 * - deferred: it stays pending, like a kernel spinning on a lost peer,
 *   until ncclCommAbort/Destroy (or one more timeout: no stream is wedged
 *   for ever). Completing it at once would let a caller that queries the
 *   stream before the communicator (comm_nccl's wait_stream) see a drained
 *   stream and miss the error that a real GPU would show.
 * Non-blocking communicators: init returns ncclInProgress until all have
 * joined; collectives return ncclSuccess once queued; ncclCommFinalize
 * gives ncclSuccess when nothing is queued, else ncclInProgress until the
 * queue drains.
 *
 * Groups: as in NCCL, a collective called between ncclGroupStart and
 * ncclGroupEnd is only recorded; the outermost ncclGroupEnd queues the
 * group's operations, in call order, on their streams (nodes, when the
 * stream captures). Misuse is a fault
 * (abort, naming it): ncclGroupEnd without a start, a group still open when
 * the communicator is polled, finalized, destroyed or aborted (its
 * operations would never run), one group spanning several streams (bertd
 * launches a bucket on one stream). cudasim_nccl_groups() counts the groups
 * that queued work, so a test can check that a bucket was one group.
 *
 * Loading: bertd-worker resolves NCCL by name (worker/nccl_abi.h); under the
 * stand-in cudasim_nccl_sym hands it these functions, or nothing at all
 * with CUDASIM_NCCL=absent (a host without libnccl.so.2).
 *
 * Not simulated: transports, topology, protocols, performance, NCCL's
 * reduction order (ring/tree: the last bits may differ from real NCCL,
 * never between ranks), more than kMaxRanks ranks, integer and fp8
 * reductions, user ops, point to point, split, registration. One thread
 * driving several ranks in a group would hang.
 */
#include <nccl.h>

#include "tests/cudasim/cudasim.h"
#include "worker/nccl_abi.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

/* worker/nccl_abi.h declares NCCL's ABI by hand: it must be nccl.h's */
static_assert((int)NCCL_OK == (int)ncclSuccess && (int)NCCL_IN_PROGRESS == (int)ncclInProgress &&
                  (int)NCCL_REMOTE_ERROR == (int)ncclRemoteError && (int)NCCL_INVALID_USAGE == (int)ncclInvalidUsage,
              "nccl_abi.h result codes");
static_assert((int)NCCL_UINT8 == (int)ncclUint8 && (int)NCCL_FLOAT16 == (int)ncclFloat16 && (int)NCCL_FLOAT32 == (int)ncclFloat32 &&
                  (int)NCCL_FLOAT64 == (int)ncclFloat64 && (int)NCCL_BFLOAT16 == (int)ncclBfloat16,
              "nccl_abi.h data types");
static_assert((int)NCCL_SUM == (int)ncclSum && (int)NCCL_AVG == (int)ncclAvg, "nccl_abi.h reduction ops");
static_assert(sizeof(nccl_unique_id) == sizeof(ncclUniqueId), "nccl_abi.h unique id");
static_assert(offsetof(nccl_config, blocking) == offsetof(ncclConfig_t, blocking) &&
                  offsetof(nccl_config, netName) == offsetof(ncclConfig_t, netName) &&
                  sizeof(nccl_config) <= sizeof(ncclConfig_t),
              "nccl_abi.h config: a prefix of nccl.h's");

namespace ncclsim {

constexpr uint64_t kIdMagic = 0x62657274644e4931ull;  /* "bertdNI1" */
constexpr uint64_t kSegMagic = 0x62657274644e5331ull; /* "bertdNS1" */
constexpr int kMaxRanks = 8;
constexpr size_t kChunk = (size_t)1 << 20;
constexpr size_t kHeader = 4096;
constexpr size_t kSegBytes = kHeader + kMaxRanks * kChunk;

struct alignas(64) shm_rank {
    int32_t pid;
    uint32_t joined;
    uint32_t left;   /* 1: aborted, 2: destroyed */
    uint64_t posted; /* last chunk written into this rank's slot */
    uint64_t done;   /* last chunk this rank has finished */
};

struct shm_header {
    uint64_t magic;
    int32_t nranks;
    shm_rank rank[kMaxRanks];
};
static_assert(sizeof(shm_header) <= kHeader, "header overflows its page");

struct id_layout {
    uint64_t magic;
    char name[64];
};
static_assert(sizeof(id_layout) <= sizeof(ncclUniqueId), "id does not fit");

} // namespace ncclsim

using namespace ncclsim;

struct ncclComm {
    int refs = 1; /* the handle + queued operations (atomic) */
    std::mutex mu; /* keeps teardown out while an operation uses the mapping */
    int rank = 0, nranks = 0;
    bool blocking = true, joined = false, finalizing = false;
    char name[64] = {}; /* until unlinked */
    int fd = -1;
    shm_header *hdr = nullptr; /* null once torn down */
    char *slots = nullptr;
    int state = ncclInProgress; /* atomic: init, then ncclSuccess or the error */
    uint64_t error_ns = 0;      /* atomic */
    int pending = 0;            /* atomic: queued operations */
    uint64_t next_seq = 1;      /* calling thread: next chunk number */
    uint64_t complete_seq = 0;  /* under mu: last chunk finished here */
    uint64_t start_ns = 0, next_probe_ns = 0;
};

namespace {

/* The calling thread's open group (see the header). */
struct grouped_op {
    ncclComm *c;
    cudaStream_t stream;
    const char *what;
    cudasim::work_maker make;
};
thread_local int group_depth;
thread_local std::vector<grouped_op> group_ops;
long groups_launched; /* atomic */

void group_closed_or_fault(const char *what)
{
    if (group_depth > 0)
        cudasim::fault("nccl: %s inside an open ncclGroupStart (%d deep, %zu operations never launched): "
                       "ncclGroupEnd is missing",
                       what, group_depth, group_ops.size());
}

template <typename T> T ld_acq(const T *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
template <typename T> void st_rel(T *p, T v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

std::mutex err_mu;
char err_msg[256] = "no error";
thread_local char err_copy[256];

void vset_last(const char *fmt, va_list ap)
{
    std::lock_guard<std::mutex> g(err_mu);
    vsnprintf(err_msg, sizeof(err_msg), fmt, ap);
}

ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset_last(fmt, ap);
    va_end(ap);
    return r;
}

uint64_t timeout_ns()
{
    static const uint64_t t = [] {
        const char *e = getenv("CUDASIM_NCCL_TIMEOUT_S");
        double s = e ? strtod(e, NULL) : 0;
        return (uint64_t)((s > 0 ? s : 120.0) * 1e9);
    }();
    return t;
}

void nap()
{
    struct timespec ts = {0, 100000L};
    nanosleep(&ts, NULL);
}

/* The first error wins: it is the one the caller is told about. */
void comm_error(ncclComm *c, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void comm_error(ncclComm *c, ncclResult_t r, const char *fmt, ...)
{
    int cur = ld_acq(&c->state);
    while (cur == ncclSuccess || cur == ncclInProgress) {
        /* before the state: whoever sees the error sees its time */
        __atomic_store_n(&c->error_ns, cudasim::now_ns(), __ATOMIC_RELAXED);
        if (__atomic_compare_exchange_n(&c->state, &cur, (int)r, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            va_list ap;
            va_start(ap, fmt);
            vset_last(fmt, ap);
            va_end(ap);
            return;
        }
    }
}

/* An OFD lock request on byte r of the segment (see the header). */
int lock_byte(int fd, int cmd, int r, struct flock *fl)
{
    memset(fl, 0, sizeof(*fl));
    fl->l_type = F_WRLCK;
    fl->l_whence = SEEK_SET;
    fl->l_start = r;
    fl->l_len = 1;
    return fcntl(fd, cmd, fl);
}

/* Whether rank r has gone (process ended, or it aborted/destroyed its
 * communicator); records the error. Lock first, then the flag: a rank sets
 * its flag before it closes the segment, so the message says which. */
bool peer_gone(ncclComm *c, int r)
{
    struct flock fl;
    bool dead = lock_byte(c->fd, F_OFD_GETLK, r, &fl) == 0 && fl.l_type == F_UNLCK;
    const shm_rank *p = &c->hdr->rank[r];
    uint32_t left = ld_acq(&p->left);
    if (!dead && !left)
        return false;
    comm_error(c, ncclRemoteError, "rank %d (pid %d) %s", r, (int)p->pid,
               left == 1 ? "aborted its communicator" : left == 2 ? "destroyed its communicator" : "exited");
    return true;
}

/* Unmaps and closes (which drops our lock: peers see us gone); sets our
 * left flag first so they know why. Unlinks a name still there. */
void teardown(ncclComm *c, uint32_t left)
{
    std::lock_guard<std::mutex> g(c->mu);
    if (c->hdr) {
        if (c->joined)
            st_rel(&c->hdr->rank[c->rank].left, left);
        munmap(c->hdr, kSegBytes);
        c->hdr = nullptr;
    }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->joined && c->name[0])
        shm_unlink(c->name);
    c->name[0] = 0;
}

void comm_unref(ncclComm *c)
{
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        teardown(c, 2);
        delete c;
    }
}

/* Init's progress: done once every rank has joined, even one that has
 * gone since (the first collective finds out, as with NCCL). */
void init_poll(ncclComm *c)
{
    std::lock_guard<std::mutex> g(c->mu);
    if (!c->hdr || ld_acq(&c->state) != ncclInProgress)
        return;
    int joined = 0;
    for (int r = 0; r < c->nranks; r++)
        joined += ld_acq(&c->hdr->rank[r].joined) != 0;
    uint64_t now = cudasim::now_ns();
    if (joined < c->nranks && now >= c->next_probe_ns) {
        c->next_probe_ns = now + 1000000;
        for (int r = 0; r < c->nranks; r++)
            if (r != c->rank && ld_acq(&c->hdr->rank[r].joined) && peer_gone(c, r))
                return;
    }
    if (joined == c->nranks) {
        /* everyone has it mapped: the name can go */
        shm_unlink(c->name);
        c->name[0] = 0;
        int cur = ncclInProgress;
        __atomic_compare_exchange_n(&c->state, &cur, (int)ncclSuccess, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    } else if (now - c->start_ns > timeout_ns()) {
        comm_error(c, ncclSystemError, "rank %d: not all %d ranks joined %s within %.0f s (CUDASIM_NCCL_TIMEOUT_S)",
                   c->rank, c->nranks, c->name, timeout_ns() / 1e9);
    }
}

ncclResult_t join(ncclComm *c)
{
    c->fd = shm_open(c->name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (c->fd < 0)
        return fail(ncclSystemError, "shm_open %s: %s", c->name, strerror(errno));
    if (ftruncate(c->fd, (off_t)kSegBytes) != 0)
        return fail(ncclSystemError, "ftruncate %s: %s", c->name, strerror(errno));
    void *m = mmap(NULL, kSegBytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (m == MAP_FAILED)
        return fail(ncclSystemError, "mmap %s: %s", c->name, strerror(errno));
    c->hdr = (shm_header *)m;
    c->slots = (char *)m + kHeader;
    /* the lock the kernel drops when this process ends (see the header) */
    struct flock fl;
    if (lock_byte(c->fd, F_OFD_SETLK, c->rank, &fl) != 0)
        return fail(ncclInvalidUsage, "rank %d of %s is already taken (%s)", c->rank, c->name, strerror(errno));
    shm_header *h = c->hdr;
    uint64_t magic = 0;
    int32_t n = 0;
    if (!__atomic_compare_exchange_n(&h->magic, &magic, kSegMagic, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        magic != kSegMagic)
        return fail(ncclInternalError, "%s is not a cudasim NCCL segment", c->name);
    if (!__atomic_compare_exchange_n(&h->nranks, &n, c->nranks, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        n != c->nranks)
        return fail(ncclInvalidArgument, "rank %d: nranks %d, but a peer joined with nranks %d", c->rank, c->nranks,
                    n);
    h->rank[c->rank].pid = (int32_t)getpid();
    uint32_t j = 0;
    if (!__atomic_compare_exchange_n(&h->rank[c->rank].joined, &j, 1u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return fail(ncclInvalidUsage, "rank %d joined %s twice", c->rank, c->name);
    c->joined = true;
    return ncclSuccess;
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

float h2f(__half x) { return __half2float(x); }
__half f2h(float x) { return __float2half_rn(x); }
float b2f(__nv_bfloat16 x) { return __bfloat162float(x); }
__nv_bfloat16 f2b(float x) { return __float2bfloat16_rn(x); }
template <typename T> T same(T x) { return x; }

/* S is stored, F computed in; st rounds back to S after every operation. */
template <typename S, typename F, F (*ld)(S), S (*st)(F)>
void reduce_fp(char *out, const char *const *in, int n, size_t cnt, ncclRedOp_t op)
{
    F scale = ld(st((F)(1.0 / n))); /* NCCL's ncclAvg scalar, in the type */
    for (size_t i = 0; i < cnt; i++) {
        F acc = 0;
        for (int r = 0; r < n; r++) {
            S v;
            memcpy(&v, in[r] + i * sizeof(S), sizeof(S));
            F x = ld(v);
            if (op == ncclAvg)
                x = ld(st(x * scale));
            if (r == 0)
                acc = x;
            else if (op == ncclProd)
                acc = ld(st(acc * x));
            else if (op == ncclMax)
                acc = x > acc ? x : acc;
            else if (op == ncclMin)
                acc = x < acc ? x : acc;
            else
                acc = ld(st(acc + x));
        }
        S o = st(acc);
        memcpy(out + i * sizeof(S), &o, sizeof(S));
    }
}

void reduce(char *out, const char *const *in, int n, size_t cnt, ncclDataType_t t, ncclRedOp_t op)
{
    switch (t) {
    case ncclFloat16: reduce_fp<__half, float, h2f, f2h>(out, in, n, cnt, op); break;
    case ncclBfloat16: reduce_fp<__nv_bfloat16, float, b2f, f2b>(out, in, n, cnt, op); break;
    case ncclFloat32: reduce_fp<float, float, same<float>, same<float>>(out, in, n, cnt, op); break;
    case ncclFloat64: reduce_fp<double, double, same<double>, same<double>>(out, in, n, cnt, op); break;
    default: break; /* refused at the call */
    }
}

/* A reference to a communicator held by a graph node (so a graph may
 * outlive the communicator's handle; replaying it then is a fault). */
struct comm_hold {
    ncclComm *c;
    explicit comm_hold(ncclComm *comm) : c(comm) { __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL); }
    ~comm_hold() { comm_unref(c); }
    comm_hold(const comm_hold &) = delete;
    comm_hold &operator=(const comm_hold &) = delete;
};

struct op {
    ncclComm *c = nullptr;
    bool bcast = false, posted = false, finished = false;
    const char *send = nullptr;
    char *recv = nullptr;
    size_t bytes = 0, nchunks = 0, k = 0;
    ncclDataType_t type = ncclUint8;
    ncclRedOp_t redop = ncclSum;
    int root = 0;
    uint64_t seq0 = 0, progress_ns = 0;
    op() = default;
    op(const op &) = default; /* the prototype a maker copies, before c is set */
    ~op()
    {
        if (!c)
            return;
        if (!finished)
            __atomic_sub_fetch(&c->pending, 1, __ATOMIC_ACQ_REL);
        comm_unref(c);
    }
};

bool finish(op *o)
{
    o->finished = true;
    __atomic_sub_fetch(&o->c->pending, 1, __ATOMIC_ACQ_REL);
    return true;
}

/* o waits on rank r (r == own rank: on an earlier operation here). */
void blocked(op *o, int r, uint64_t now)
{
    ncclComm *c = o->c;
    if (r != c->rank && now >= c->next_probe_ns) {
        c->next_probe_ns = now + 1000000;
        if (peer_gone(c, r))
            return;
    }
    if (now - o->progress_ns > timeout_ns())
        comm_error(c, ncclSystemError, "rank %d: no progress for %.0f s waiting for rank %d (CUDASIM_NCCL_TIMEOUT_S)",
                   c->rank, timeout_ns() / 1e9, r);
}

bool op_poll(op *o)
{
    ncclComm *c = o->c;
    std::lock_guard<std::mutex> g(c->mu);
    uint64_t now = cudasim::now_ns();
    if (!o->progress_ns)
        o->progress_ns = now;
    for (;;) {
        if (!c->hdr)
            return finish(o); /* aborted or destroyed */
        if (ld_acq(&c->state) != ncclSuccess) {
            /* see the header: stuck until abort in deferred mode */
            if (cudasim::streams_deferred() &&
                now - __atomic_load_n(&c->error_ns, __ATOMIC_RELAXED) < timeout_ns())
                return false;
            return finish(o);
        }
        if (o->k == o->nchunks)
            return finish(o);
        uint64_t s = o->seq0 + o->k;
        if (c->complete_seq != s - 1) {
            blocked(o, c->rank, now);
            return false;
        }
        shm_rank *R = c->hdr->rank;
        int n = c->nranks, me = c->rank;
        size_t off = o->k * kChunk, len = o->bytes - off < kChunk ? o->bytes - off : kChunk;
        if (!o->posted) {
            if (!o->bcast || me == o->root) {
                for (int r = 0; r < n; r++)
                    if (ld_acq(&R[r].done) < s - 1) {
                        blocked(o, r, now);
                        return false;
                    }
                memcpy(c->slots + (size_t)me * kChunk, o->send + off, len);
                st_rel(&R[me].posted, s);
            }
            o->posted = true;
        }
        for (int r = o->bcast ? o->root : 0; r < (o->bcast ? o->root + 1 : n); r++)
            if (ld_acq(&R[r].posted) < s) {
                blocked(o, r, now);
                return false;
            }
        if (!o->bcast) {
            const char *in[kMaxRanks];
            for (int r = 0; r < n; r++)
                in[r] = c->slots + (size_t)r * kChunk;
            reduce(o->recv + off, in, n, len / type_size(o->type), o->type, o->redop);
        } else if (me != o->root) {
            memcpy(o->recv + off, c->slots + (size_t)o->root * kChunk, len);
        } else if (o->recv != o->send) {
            memmove(o->recv + off, o->send + off, len);
        }
        st_rel(&R[me].done, s);
        c->complete_seq = s;
        o->k++;
        o->posted = false;
        o->progress_ns = now;
    }
}

/* Waits (bounded) until nothing is queued on the communicator. */
ncclResult_t drain(ncclComm *c)
{
    uint64_t deadline = cudasim::now_ns() + timeout_ns();
    for (;;) {
        int st = ld_acq(&c->state);
        if (st != ncclSuccess || ld_acq(&c->pending) == 0)
            return (ncclResult_t)st;
        if (cudasim::now_ns() >= deadline) {
            comm_error(c, ncclSystemError, "rank %d: queued operations did not finish", c->rank);
            return ncclSystemError;
        }
        nap();
    }
}

/* Like NCCL, refuses to queue on a communicator that is not ready. */
ncclResult_t ready(ncclComm *c, const char *what)
{
    if (ld_acq(&c->state) == ncclInProgress)
        init_poll(c);
    int st = ld_acq(&c->state);
    if (st == ncclInProgress)
        return fail(ncclInvalidUsage, "%s: the communicator's init has not finished (poll ncclCommGetAsyncError)",
                    what);
    if (st == ncclSuccess && c->finalizing)
        return fail(ncclInvalidUsage, "%s: after ncclCommFinalize", what);
    return (ncclResult_t)st;
}

ncclResult_t launch(const char *what, bool bcast, const void *send, void *recv, size_t count, ncclDataType_t type,
                    ncclRedOp_t redop, int root, ncclComm *c, cudaStream_t stream)
{
    if (!c)
        return fail(ncclInvalidArgument, "%s: comm is NULL", what);
    size_t es = type_size(type);
    if (!es)
        return fail(ncclInvalidArgument, "%s: invalid datatype %d", what, (int)type);
    if (!bcast && ((int)redop < 0 || (int)redop >= (int)ncclNumOps))
        return fail(ncclInvalidArgument, "%s: invalid or user-defined reduction op %d (not simulated)", what,
                    (int)redop);
    if (!bcast && type != ncclFloat16 && type != ncclBfloat16 && type != ncclFloat32 && type != ncclFloat64)
        return fail(ncclInvalidArgument, "%s: reductions of datatype %d are not simulated", what, (int)type);
    if (bcast && (root < 0 || root >= c->nranks))
        return fail(ncclInvalidArgument, "%s: root %d not in [0, %d)", what, root, c->nranks);
    ncclResult_t r = ready(c, what);
    if (r != ncclSuccess || count == 0)
        return r;
    if (count > SIZE_MAX / es)
        return fail(ncclInvalidArgument, "%s: count %zu too large", what, count);
    size_t bytes = count * es;
    /* real NCCL refuses what the device cannot address */
    if ((!bcast || c->rank == root) && (!send || !cudasim::device_accessible(send, bytes)))
        return fail(ncclInvalidArgument, "%s: sendbuff %p (%zu bytes) is not device memory", what, send, bytes);
    if (!recv || !cudasim::device_accessible(recv, bytes))
        return fail(ncclInvalidArgument, "%s: recvbuff %p (%zu bytes) is not device memory", what, recv, bytes);

    /* The collective is made (chunk numbers taken, counted pending) when
     * it is queued: at the call, at the outermost ncclGroupEnd, or, when
     * the stream captures, at every cudaGraphLaunch of the graph, each
     * launch a new collective. Chunk numbers thus follow the order in
     * which the host queues collectives (calls and launches), the same on
     * every rank that makes the same calls, as for eager calls; taking
     * them when the work first runs would leave the order to the device
     * threads' scheduling, which differs between ranks. */
    std::shared_ptr<comm_hold> hold = std::make_shared<comm_hold>(c);
    op proto;
    proto.bcast = bcast;
    proto.send = (const char *)send;
    proto.recv = (char *)recv;
    proto.bytes = bytes;
    proto.type = type;
    proto.redop = redop;
    proto.root = root;
    proto.nchunks = (bytes + kChunk - 1) / kChunk;
    cudasim::work_maker make = [hold, proto, what]() -> std::function<bool()> {
        ncclComm *c = hold->c;
        {
            std::lock_guard<std::mutex> g(c->mu);
            if (!c->hdr)
                cudasim::fault("nccl: %s of a graph launched after its communicator was destroyed or aborted",
                               what);
        }
        std::shared_ptr<op> o = std::make_shared<op>(proto);
        __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
        __atomic_add_fetch(&c->pending, 1, __ATOMIC_ACQ_REL);
        o->c = c;
        o->seq0 = c->next_seq;
        c->next_seq += o->nchunks;
        return [o]() { return op_poll(o.get()); };
    };
    if (group_depth > 0) { /* queued at the outermost ncclGroupEnd */
        group_ops.push_back({c, stream, what, make});
        return ncclSuccess;
    }
    cudaError_t e = cudasim::enqueue_made(stream, what, make);
    if (e != cudaSuccess)
        return fail(ncclUnhandledCudaError, "%s: %s", what, cudaGetErrorString(e));
    /* sync streams ran it already: an error it met is this call's */
    return (ncclResult_t)ld_acq(&c->state);
}


} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* Like NCCL's, the last error of the process (comm is not consulted); a
 * per-thread copy, so a concurrent error cannot tear the caller's string. */
const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    std::lock_guard<std::mutex> g(err_mu);
    memcpy(err_copy, err_msg, sizeof(err_copy));
    return err_copy;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    static unsigned counter;
    if (!uniqueId)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
        rnd = (uint32_t)cudasim::now_ns();
    id_layout id;
    memset(&id, 0, sizeof(id));
    id.magic = kIdMagic;
    snprintf(id.name, sizeof(id.name), "/bertd-ncclsim-%d-%u-%08x", (int)getpid(),
             __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED), rnd);
    memset(uniqueId, 0, sizeof(*uniqueId));
    memcpy(uniqueId->internal, &id, sizeof(id));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > kMaxRanks)
        return fail(ncclInvalidArgument, "nranks %d: cudasim simulates 1..%d ranks", nranks, kMaxRanks);
    if (rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "rank %d not in [0, %d)", rank, nranks);
    bool blocking = true;
    if (config) {
        if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
            return fail(ncclInvalidArgument, "config not set up with NCCL_CONFIG_INITIALIZER");
        if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
            return fail(ncclInvalidArgument, "config.blocking %d: 0 or 1", config->blocking);
        blocking = config->blocking != 0;
    }
    id_layout id;
    memcpy(&id, commId.internal, sizeof(id));
    if (id.magic != kIdMagic || id.name[0] != '/' || !memchr(id.name, 0, sizeof(id.name)))
        return fail(ncclInvalidArgument, "unique id not made by ncclGetUniqueId");

    ncclComm *c = new ncclComm;
    c->rank = rank;
    c->nranks = nranks;
    c->blocking = blocking;
    c->start_ns = cudasim::now_ns();
    memcpy(c->name, id.name, sizeof(c->name));
    ncclResult_t r = join(c);
    if (r == ncclSuccess && blocking) {
        init_poll(c);
        while (ld_acq(&c->state) == ncclInProgress) {
            nap();
            init_poll(c);
        }
        r = (ncclResult_t)ld_acq(&c->state);
    }
    if (r != ncclSuccess) {
        teardown(c, 1);
        delete c;
        return r;
    }
    *comm = c;
    return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    group_closed_or_fault("ncclCommGetAsyncError");
    if (!comm || !asyncError)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    if (ld_acq(&comm->state) == ncclInProgress)
        init_poll(comm);
    int st = ld_acq(&comm->state);
    if (st == ncclSuccess && comm->finalizing && ld_acq(&comm->pending) > 0)
        st = ncclInProgress;
    *asyncError = (ncclResult_t)st;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    group_closed_or_fault("ncclCommFinalize");
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    ncclResult_t r = ready(comm, "ncclCommFinalize");
    if (r != ncclSuccess)
        return r;
    comm->finalizing = true;
    if (ld_acq(&comm->pending) == 0)
        return ncclSuccess;
    return comm->blocking ? drain(comm) : ncclInProgress;
}

/* Always blocking, as in NCCL; waits (bounded) for queued work first, the
 * implicit finalize NCCL does when the caller did not. */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    group_closed_or_fault("ncclCommDestroy");
    if (!comm)
        return ncclSuccess;
    drain(comm);
    teardown(comm, 2);
    comm_unref(comm);
    return ncclSuccess;
}

/* Queued operations complete at their next poll, output undefined. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    group_closed_or_fault("ncclCommAbort");
    if (!comm)
        return ncclSuccess;
    teardown(comm, 1);
    comm_unref(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return fail(ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return launch("ncclAllReduce", false, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    return launch("ncclBroadcast", true, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE; /* the toolkit header's: the stand-in speaks its API */
    return ncclSuccess;
}

ncclResult_t ncclGroupStart()
{
    group_depth++;
    return ncclSuccess;
}

/* The outermost end queues the group's operations (see the header). */
ncclResult_t ncclGroupEnd()
{
    if (group_depth == 0)
        cudasim::fault("nccl: ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0)
        return ncclSuccess;
    std::vector<grouped_op> ops;
    ops.swap(group_ops);
    for (const grouped_op &g : ops)
        if (g.stream != ops[0].stream)
            cudasim::fault("nccl: one group on two streams (%p, then %p for %s)", (void *)ops[0].stream,
                           (void *)g.stream, g.what);
    ncclResult_t r = ncclSuccess;
    for (const grouped_op &g : ops) {
        cudaError_t e = cudasim::enqueue_made(g.stream, g.what, g.make);
        if (e != cudaSuccess)
            return fail(ncclUnhandledCudaError, "ncclGroupEnd: %s: %s", g.what, cudaGetErrorString(e));
        if (r == ncclSuccess) /* sync streams ran it already: an error it met is the group's */
            r = (ncclResult_t)ld_acq(&g.c->state);
    }
    if (!ops.empty())
        __atomic_add_fetch(&groups_launched, 1, __ATOMIC_RELAXED);
    return r;
}

long cudasim_nccl_groups(void)
{
    return __atomic_load_n(&groups_launched, __ATOMIC_RELAXED);
}

void *cudasim_nccl_sym(const char *name)
{
    static const bool absent = [] {
        const char *e = getenv("CUDASIM_NCCL");
        return e && strcmp(e, "absent") == 0;
    }();
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"ncclGetVersion", (void *)ncclGetVersion},
        {"ncclGetUniqueId", (void *)ncclGetUniqueId},
        {"ncclCommInitRankConfig", (void *)ncclCommInitRankConfig},
        {"ncclCommGetAsyncError", (void *)ncclCommGetAsyncError},
        {"ncclCommFinalize", (void *)ncclCommFinalize},
        {"ncclCommDestroy", (void *)ncclCommDestroy},
        {"ncclCommAbort", (void *)ncclCommAbort},
        {"ncclGetErrorString", (void *)ncclGetErrorString},
        {"ncclGetLastError", (void *)ncclGetLastError},
        {"ncclAllReduce", (void *)ncclAllReduce},
        {"ncclBroadcast", (void *)ncclBroadcast},
        {"ncclGroupStart", (void *)ncclGroupStart},
        {"ncclGroupEnd", (void *)ncclGroupEnd},
    };
    if (absent || !name)
        return NULL;
    for (const auto &e : table)
        if (strcmp(e.name, name) == 0)
            return e.fn;
    return NULL;
}

} // extern "C"
