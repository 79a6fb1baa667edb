/* comm — the generic comm_* entry points and the shm backend for CPU workers
 * (protocol and layout: docs/formats.md).
 *
 * Every collective is a sequence of sync points. At a sync point a rank
 * bumps its own phase counter (with a signature of the operation, so ranks
 * that disagree on what they are doing get -EPROTO instead of garbage),
 * bumps the segment's futex word and waits until every rank's phase has
 * reached its own. Slab memory alternates between two halves from one
 * collective (chunk) to the next, which is why a collective needs no
 * trailing sync: a rank can only write into a half again after every rank
 * has reached the next collective's first sync point, i.e. has finished
 * reading that half.
 *
 * All shared words are C11 atomics with sequential consistency; the slab
 * data is ordered by them (written before the phase store, read after the
 * phase load).
 */
#include "common/procstat.h"
#include "worker/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "worker/comm_backend.h"

/* ---- generic entry points ---- */

int comm_rank(const comm *c)
{
    return c->rank;
}

int comm_world(const comm *c)
{
    return c->world;
}

int comm_allreduce_mean(comm *c, float *buf, size_t n)
{
    return c->ops->allreduce_mean(c, buf, n);
}

int comm_allreduce_sum_f64(comm *c, double *vals, int n)
{
    if (n < 0)
        return -EINVAL;
    return c->ops->allreduce_sum_f64(c, vals, n);
}

int comm_barrier(comm *c)
{
    return c->ops->barrier(c);
}

int comm_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->world)
        return -EINVAL;
    return c->ops->broadcast(c, buf, bytes, root);
}

int comm_replicas_agree(comm *c, const void *buf, size_t bytes)
{
    const unsigned char *p = buf;
    uint64_t h = 14695981039346656037ull;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (; i < bytes; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    double v[8]; /* [piece 0..3, piece^2 0..3] */
    for (int k = 0; k < 4; k++) {
        double x = (double)((h >> (16 * k)) & 0xffffu);
        v[k] = x;
        v[4 + k] = x * x;
    }
    int rc = comm_allreduce_sum_f64(c, v, 8);
    if (rc < 0)
        return rc;
    for (int k = 0; k < 4; k++)
        if ((double)c->world * v[4 + k] != v[k] * v[k])
            return 0;
    return 1;
}

void comm_abort(comm *c, int err)
{
    c->ops->abort(c, err);
}

void comm_destroy(comm *c)
{
    if (c)
        c->ops->destroy(c);
}

int comm_name_for_job(char *buf, size_t n, const char *job_id)
{
    size_t len = strlen(job_id);
    if (len == 0 || len > 100)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        char ch = job_id[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_'))
            return -EINVAL;
    }
    if ((size_t)snprintf(buf, n, "/bertd-%s-comm", job_id) >= n)
        return -EINVAL;
    return 0;
}

/* ---- shm backend ---- */

#define COMM_MAGIC 0x4D4D4F43u /* "COMM" */
#define COMM_VERSION 1u
#define CACHELINE 64
#define HALF_ALIGN 4096
#define SEG_ALIGN 16           /* floats: per-rank reduce segments start on cachelines */
#define CHECK_MS 100           /* peer liveness check period while waiting */
#define JOIN_POLL_MS 10        /* how often a joining rank looks for the segment */
#define SPIN 256               /* polls before sleeping on the futex */
#define REDUCE_BLOCK 512       /* floats summed per pass (stack accumulator) */

enum { OP_ALLREDUCE_IN = 1, OP_ALLREDUCE_OUT, OP_SUM_F64, OP_BCAST, OP_BARRIER };
#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() atomic_signal_fence(memory_order_seq_cst)
#endif

#define SIG(op, n) (((uint64_t)(op) << 56) | ((uint64_t)(n) & ((1ull << 56) - 1)))

typedef struct comm_rank_ctl {
    _Atomic int32_t pid;        /* 0 = not joined */
    _Atomic uint32_t left;      /* 1 once the rank has called comm_destroy */
    _Atomic uint64_t starttime; /* /proc/<pid>/stat field 22: guards against pid reuse */
    _Atomic uint64_t phase;     /* sync points this rank has reached */
    _Atomic uint64_t sig[2];    /* signature of the op at phase p, in sig[p & 1] */
    uint8_t pad[CACHELINE - 40];
} comm_rank_ctl;

typedef struct comm_ctl {
    _Atomic uint32_t magic;     /* written last by rank 0 */
    uint32_t version;
    uint32_t world;
    uint32_t reserved;
    uint64_t max_floats;
    uint64_t half_bytes;        /* one half of a rank's slab */
    uint64_t off_slabs;         /* slab of rank g, half h: off_slabs + (2g + h) * half_bytes */
    uint64_t total_bytes;
    _Atomic uint32_t futex;     /* bumped on every arrival, join, leave and abort */
    _Atomic int32_t abort_err;  /* 0, or the negative errno that ended the group */
    _Atomic uint32_t joined;
    _Atomic uint32_t attached;
    _Alignas(CACHELINE) comm_rank_ctl ranks[COMM_MAX_WORLD]; /* offset 64: one line per rank */
} comm_ctl;

_Static_assert(sizeof(comm_rank_ctl) == CACHELINE, "comm_rank_ctl is one cache line");
_Static_assert(offsetof(comm_ctl, ranks) == CACHELINE, "rank entries start on the second line");

typedef struct comm_shm {
    comm base;
    char name[COMM_NAME_MAX];
    uint8_t *mem;
    size_t bytes;
    comm_ctl *ctl;
    dev_t dev;                  /* identity of our segment, so we never unlink a successor's */
    ino_t ino;
    uint64_t off_slabs, half_bytes, max_floats; /* local copies: the header shares a
                                                 * cache line with the busy futex word */
    uint64_t phase;             /* local copy of ranks[me].phase */
    unsigned half;              /* slab half the next collective uses */
    int timeout_ms;
} comm_shm;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Shared (not FUTEX_PRIVATE) wait: the word lives in a MAP_SHARED segment
 * that other processes wake. Returns 0 (woken, value changed, timeout or
 * signal: the caller re-checks everything anyway). */
static void futex_wait(_Atomic uint32_t *w, uint32_t v, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0);
}

static void futex_bump_wake(_Atomic uint32_t *w)
{
    atomic_fetch_add(w, 1);
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}


static inline float *slab(comm_shm *s, int g, unsigned h)
{
    return (float *)(s->mem + s->off_slabs + (2 * (uint64_t)g + h) * s->half_bytes);
}

/* Ends the group: the first caller's reason is the one logged and kept. */
static void shm_abort_reason(comm_shm *s, int err, const char *fmt, int peer, int arg)
{
    int32_t zero = 0;
    if (atomic_compare_exchange_strong(&s->ctl->abort_err, &zero, err)) {
        char why[160];
        snprintf(why, sizeof(why), fmt, peer, arg);
        log_error("comm %s: rank %d: %s; aborting the group", s->name, s->base.rank, why);
    }
    futex_bump_wake(&s->ctl->futex);
}

/* Returns 0 unless a peer that blocks us is lost, else aborts the group and
 * returns -EPIPE. In a collective (joining = 0) only peers that have not
 * reached phase p block us: one that has may legitimately finish and exit
 * meanwhile. While joining, every registered peer counts. A peer whose
 * registration is half done (start time not yet written) is skipped. */
static int check_peers(comm_shm *s, uint64_t p, int check_procs, int joining)
{
    comm_ctl *c = s->ctl;
    for (int g = 0; g < (int)c->world; g++) {
        if (g == s->base.rank)
            continue;
        comm_rank_ctl *r = &c->ranks[g];
        pid_t pid = atomic_load(&r->pid);
        uint64_t st = atomic_load(&r->starttime);
        if (pid == 0 || st == 0)
            continue;
        if (!joining && atomic_load(&r->phase) >= p)
            continue;
        /* a peer that left on purpose either finished (then it is not
         * blocking us: its phase is final) or gave up and set abort_err */
        if (atomic_load(&r->left)) {
            if (joining)
                continue;
            shm_abort_reason(s, -EPIPE, "rank %d left the group before phase %d", g, (int)p);
            return -EPIPE;
        }
        if (check_procs && !procstat_alive(pid, st)) {
            if (atomic_load(&r->left) && (joining || atomic_load(&r->phase) >= p))
                continue; /* it left cleanly while we looked */
            shm_abort_reason(s, -EPIPE, "rank %d (pid %d) died", g, (int)pid);
            return -EPIPE;
        }
    }
    return 0;
}

static int all_arrived(comm_ctl *c, uint64_t p)
{
    for (uint32_t g = 0; g < c->world; g++)
        if (atomic_load(&c->ranks[g].phase) < p)
            return 0;
    return 1;
}

/* One sync point: announce arrival with signature sig, wait (bounded) for
 * every rank. 0, -EPIPE (peer lost, timeout, abort) or -EPROTO (ranks are in
 * different collectives). */
static int shm_sync(comm_shm *s, uint64_t sig)
{
    comm_ctl *c = s->ctl;
    comm_rank_ctl *me = &c->ranks[s->base.rank];
    uint64_t p = ++s->phase;
    atomic_store(&me->sig[p & 1], sig);
    atomic_store(&me->phase, p);
    futex_bump_wake(&c->futex);

    int arrived = 0;
    for (int i = 0; i < SPIN && !(arrived = all_arrived(c, p)); i++)
        cpu_relax();
    uint64_t start = now_ms();
    uint64_t deadline = start + (uint64_t)s->timeout_ms;
    uint64_t next_check = start + CHECK_MS;
    while (!arrived) {
        uint32_t v = atomic_load(&c->futex);
        if (all_arrived(c, p))
            break;
        if (atomic_load(&c->abort_err))
            return -EPIPE;
        uint64_t now = now_ms();
        int due = now >= next_check;
        if (check_peers(s, p, due, 0) != 0)
            return -EPIPE;
        if (due)
            next_check = now + CHECK_MS;
        if (now >= deadline) {
            for (int g = 0; g < (int)c->world; g++)
                if (atomic_load(&c->ranks[g].phase) < p) {
                    shm_abort_reason(s, -EPIPE, "rank %d did not reach the collective within %d ms", g,
                                     s->timeout_ms);
                    break;
                }
            return -EPIPE;
        }
        uint64_t until = next_check < deadline ? next_check : deadline;
        futex_wait(&c->futex, v, (int)(until > now ? until - now : 1));
    }
    for (int g = 0; g < (int)c->world; g++) {
        if (atomic_load(&c->ranks[g].sig[p & 1]) != sig) {
            shm_abort_reason(s, -EPROTO, "rank %d is in a different collective (or size) than this rank at phase %d",
                             g, (int)p);
            return -EPROTO;
        }
    }
    return 0;
}

static int shm_enter(comm_shm *s)
{
    return atomic_load(&s->ctl->abort_err) ? -EPIPE : 0;
}

/* Start of rank g's reduce segment in a chunk of nc floats. */
static size_t seg_lo(size_t nc, int g, int world)
{
    if (g >= world)
        return nc;
    size_t lo = nc * (size_t)g / (size_t)world;
    return lo / SEG_ALIGN * SEG_ALIGN;
}

static int shm_allreduce_mean(comm *cm, float *buf, size_t n)
{
    comm_shm *s = (comm_shm *)cm;
    int rc = shm_enter(s);
    int G = cm->world, me = cm->rank;
    size_t max = s->max_floats;
    for (size_t off = 0; rc == 0 && off < n; off += max) {
        size_t nc = n - off < max ? n - off : max;
        unsigned h = s->half;
        s->half ^= 1u;
        float *mine = slab(s, me, h);
        memcpy(mine, buf + off, nc * sizeof(float));
        rc = shm_sync(s, SIG(OP_ALLREDUCE_IN, nc));
        if (rc != 0)
            break;
        /* reduce-scatter: this rank owns [lo, hi) of the chunk; each element
         * is summed over ranks 0..G-1 in that order, then divided by G */
        size_t lo = seg_lo(nc, me, G), hi = seg_lo(nc, me + 1, G);
        for (size_t b = lo; b < hi; b += REDUCE_BLOCK) {
            size_t nb = hi - b < REDUCE_BLOCK ? hi - b : REDUCE_BLOCK;
            float acc[REDUCE_BLOCK];
            const float *s0 = slab(s, 0, h) + b;
            for (size_t j = 0; j < nb; j++)
                acc[j] = s0[j];
            for (int g = 1; g < G; g++) {
                const float *sg = slab(s, g, h) + b;
                for (size_t j = 0; j < nb; j++)
                    acc[j] += sg[j];
            }
            for (size_t j = 0; j < nb; j++)
                mine[b + j] = acc[j] / (float)G;
        }
        rc = shm_sync(s, SIG(OP_ALLREDUCE_OUT, nc));
        if (rc != 0)
            break;
        /* all-gather: each rank's reduced segment lives in its own slab */
        for (int g = 0; g < G; g++) {
            size_t glo = seg_lo(nc, g, G), ghi = seg_lo(nc, g + 1, G);
            memcpy(buf + off + glo, slab(s, g, h) + glo, (ghi - glo) * sizeof(float));
        }
    }
    return rc;
}

static int shm_allreduce_sum_f64(comm *cm, double *vals, int n)
{
    comm_shm *s = (comm_shm *)cm;
    int rc = shm_enter(s);
    size_t max = s->half_bytes / sizeof(double);
    for (size_t off = 0; rc == 0 && off < (size_t)n; off += max) {
        size_t nc = (size_t)n - off < max ? (size_t)n - off : max;
        unsigned h = s->half;
        s->half ^= 1u;
        memcpy(slab(s, cm->rank, h), vals + off, nc * sizeof(double));
        rc = shm_sync(s, SIG(OP_SUM_F64, nc));
        if (rc != 0)
            break;
        for (size_t i = 0; i < nc; i++) {
            double acc = 0.0;
            for (int g = 0; g < cm->world; g++)
                acc += ((const double *)slab(s, g, h))[i];
            vals[off + i] = acc;
        }
    }
    return rc;
}

static int shm_barrier(comm *cm)
{
    comm_shm *s = (comm_shm *)cm;
    int rc = shm_enter(s);
    return rc ? rc : shm_sync(s, SIG(OP_BARRIER, 0));
}

static int shm_broadcast(comm *cm, void *buf, size_t bytes, int root)
{
    comm_shm *s = (comm_shm *)cm;
    int rc = shm_enter(s);
    size_t max = s->half_bytes;
    for (size_t off = 0; rc == 0 && off < bytes; off += max) {
        size_t nc = bytes - off < max ? bytes - off : max;
        unsigned h = s->half;
        s->half ^= 1u;
        if (cm->rank == root)
            memcpy(slab(s, root, h), (uint8_t *)buf + off, nc);
        rc = shm_sync(s, SIG(OP_BCAST, (nc << 8) | (unsigned)root));
        if (rc == 0 && cm->rank != root)
            memcpy((uint8_t *)buf + off, slab(s, root, h), nc);
    }
    return rc;
}

static void shm_abort(comm *cm, int err)
{
    shm_abort_reason((comm_shm *)cm, err < 0 ? err : -EPIPE, "local error %d on rank %d", -err, cm->rank);
}

/* Unlinks the name only while it still names our segment: a restarted job
 * may already have created its own under the same name. */
static void unlink_if_ours(comm_shm *s)
{
    int fd = shm_open(s->name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino)
        shm_unlink(s->name);
    close(fd);
}

static void shm_destroy(comm *cm)
{
    comm_shm *s = (comm_shm *)cm;
    if (s->ctl) {
        comm_rank_ctl *me = &s->ctl->ranks[cm->rank];
        if (atomic_load(&me->pid) == (int32_t)getpid()) {
            atomic_store(&me->left, 1);
            uint32_t left = atomic_fetch_sub(&s->ctl->attached, 1) - 1;
            futex_bump_wake(&s->ctl->futex);
            if (cm->rank == 0 || left == 0 || atomic_load(&s->ctl->abort_err))
                unlink_if_ours(s);
        }
    }
    if (s->mem)
        munmap(s->mem, s->bytes);
    free(s);
}

static const comm_ops shm_ops = {
    .name = "shm",
    .allreduce_mean = shm_allreduce_mean,
    .allreduce_sum_f64 = shm_allreduce_sum_f64,
    .barrier = shm_barrier,
    .broadcast = shm_broadcast,
    .abort = shm_abort,
    .destroy = shm_destroy,
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static int map_fd(comm_shm *s, int fd, size_t bytes)
{
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = -errno;
        munmap(mem, bytes);
        return rc;
    }
    s->mem = mem;
    s->bytes = bytes;
    s->ctl = mem;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    return 0;
}

static void unmap(comm_shm *s)
{
    if (s->mem)
        munmap(s->mem, s->bytes);
    s->mem = NULL;
    s->ctl = NULL;
}

static int create_segment(comm_shm *s, int world, size_t max_floats)
{
    uint64_t half = align_up((uint64_t)max_floats * sizeof(float), HALF_ALIGN);
    uint64_t off = align_up(sizeof(comm_ctl), HALF_ALIGN);
    uint64_t total = off + 2 * (uint64_t)world * half;
    if (shm_unlink(s->name) == 0)
        log_warn("comm %s: removed a stale segment left by an earlier run", s->name);
    int rc = 0;
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)total) != 0) {
        rc = -errno;
        goto out;
    }
    rc = map_fd(s, fd, total);
    if (rc != 0)
        goto out;
    comm_ctl *c = s->ctl;
    c->version = COMM_VERSION;
    c->world = (uint32_t)world;
    c->max_floats = max_floats;
    c->half_bytes = half;
    c->off_slabs = off;
    c->total_bytes = total;
    atomic_store(&c->magic, COMM_MAGIC);
out:
    if (rc != 0)
        shm_unlink(s->name);
    close(fd);
    return rc;
}

/* One attempt to map rank 0's segment: 0, -EAGAIN (not there or not ready
 * yet, or stale: try again), or a hard error. */
static int attach_segment(comm_shm *s, int world, size_t max_floats)
{
    int fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return errno == ENOENT ? -EAGAIN : -errno;
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto out;
    }
    if ((size_t)st.st_size < sizeof(comm_ctl)) {
        rc = -EAGAIN; /* rank 0 is between shm_open and ftruncate */
        goto out;
    }
    rc = map_fd(s, fd, (size_t)st.st_size);
    if (rc != 0)
        goto out;
    comm_ctl *c = s->ctl;
    if (atomic_load(&c->magic) != COMM_MAGIC) {
        rc = -EAGAIN;
    } else if (c->version != COMM_VERSION || c->total_bytes != (uint64_t)st.st_size) {
        log_error("comm %s: segment is not a bertd comm segment of version %u", s->name, COMM_VERSION);
        rc = -EPROTO;
    } else {
        /* a segment whose creator is gone is a leftover of a dead run that
         * rank 0 is about to replace */
        comm_rank_ctl *r0 = &c->ranks[0];
        pid_t pid = atomic_load(&r0->pid);
        if (pid == 0 || !procstat_alive(pid, atomic_load(&r0->starttime)) || atomic_load(&c->abort_err)) {
            rc = -EAGAIN;
        } else if (c->world != (uint32_t)world || c->max_floats != max_floats) {
            /* ranks started with different settings: fail the whole group now
             * rather than let rank 0 wait out its timeout */
            log_error("comm %s: segment is for world %u, max_floats %llu; rank %d expects %d, %zu", s->name,
                      c->world, (unsigned long long)c->max_floats, s->base.rank, world, max_floats);
            int32_t zero = 0;
            atomic_compare_exchange_strong(&c->abort_err, &zero, -EPROTO);
            futex_bump_wake(&c->futex);
            rc = -EPROTO;
        }
    }
    if (rc != 0)
        unmap(s);
out:
    close(fd);
    return rc;
}

static int register_self(comm_shm *s)
{
    comm_rank_ctl *r = &s->ctl->ranks[s->base.rank];
    pid_t me = getpid();
    char state;
    uint64_t st = procstat_starttime(me, &state); /* 0 only without /proc: then peers never check us */
    int32_t zero = 0;
    if (!atomic_compare_exchange_strong(&r->pid, &zero, (int32_t)me)) {
        log_error("comm %s: rank %d is already held by pid %d", s->name, s->base.rank, (int)zero);
        return -EBUSY;
    }
    atomic_store(&r->starttime, st);
    atomic_fetch_add(&s->ctl->attached, 1);
    atomic_fetch_add(&s->ctl->joined, 1);
    futex_bump_wake(&s->ctl->futex);
    return 0;
}

int comm_create_shm(comm **out, const char *name, int rank, int world, size_t max_floats,
                    int timeout_ms)
{
    if (!name || name[0] != '/' || strlen(name) >= COMM_NAME_MAX || world < 1 ||
        world > COMM_MAX_WORLD || rank < 0 || rank >= world || max_floats == 0 ||
        max_floats > ((size_t)1 << 40))
        return -EINVAL;
    if (timeout_ms <= 0)
        timeout_ms = COMM_DEFAULT_TIMEOUT_MS;
    comm_shm *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->base.ops = &shm_ops;
    s->base.rank = rank;
    s->base.world = world;
    s->timeout_ms = timeout_ms;
    strcpy(s->name, name);
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int rc;
    if (rank == 0) {
        rc = create_segment(s, world, max_floats);
    } else {
        while ((rc = attach_segment(s, world, max_floats)) == -EAGAIN && now_ms() < deadline)
            sleep_ms(JOIN_POLL_MS);
        if (rc == -EAGAIN) {
            log_error("comm %s: rank %d: rank 0 did not create the group within %d ms", name, rank,
                      timeout_ms);
            rc = -ETIMEDOUT;
        }
    }
    if (rc != 0)
        goto out;
    s->off_slabs = s->ctl->off_slabs;
    s->half_bytes = s->ctl->half_bytes;
    s->max_floats = s->ctl->max_floats;
    rc = register_self(s);
    if (rc != 0) {
        unmap(s);
        goto out;
    }
    /* rendezvous: wait until all world ranks have joined */
    comm_ctl *c = s->ctl;
    uint64_t next_check = now_ms() + CHECK_MS;
    for (;;) {
        uint32_t v = atomic_load(&c->futex);
        if (atomic_load(&c->joined) == (uint32_t)world)
            break;
        if (atomic_load(&c->abort_err)) {
            int err = atomic_load(&c->abort_err);
            rc = err == -ETIMEDOUT || err == -EPROTO ? err : -EPIPE;
            goto out;
        }
        uint64_t now = now_ms();
        if (now >= next_check) {
            if (check_peers(s, 0, 1, 1) != 0) {
                int err = atomic_load(&c->abort_err);
                rc = err == -ETIMEDOUT || err == -EPROTO ? err : -EPIPE;
                goto out;
            }
            next_check = now + CHECK_MS;
        }
        if (now >= deadline) {
            char missing[256] = "";
            size_t len = 0;
            for (int g = 0; g < world && len < sizeof(missing) - 8; g++)
                if (atomic_load(&c->ranks[g].pid) == 0)
                    len += (size_t)snprintf(missing + len, sizeof(missing) - len, " %d", g);
            log_error("comm %s: rank %d: rank(s)%s of %d did not join within %d ms", name, rank, missing,
                      world, timeout_ms);
            int32_t zero = 0;
            atomic_compare_exchange_strong(&c->abort_err, &zero, -ETIMEDOUT);
            futex_bump_wake(&c->futex);
            rc = -ETIMEDOUT;
            goto out;
        }
        uint64_t until = next_check < deadline ? next_check : deadline;
        futex_wait(&c->futex, v, (int)(until > now ? until - now : 1));
    }
    /* every rank has the segment mapped: the name is no longer needed, and
     * removing it now means no crash can leak it */
    if (rank == 0)
        unlink_if_ours(s);
    *out = &s->base;
    s = NULL;
out:
    if (s)
        shm_destroy(&s->base);
    return rc;
}

/* ---- net backend: worker/comm_net.cc, built only with libgloo-dev ---- */
#ifndef BERTD_GLOO
int comm_net_available(void)
{
    return 0;
}

int comm_create_net(comm **out, int rank, int world, const comm_kv *kv, const comm_net_opts *opts)
{
    (void)out, (void)world, (void)kv, (void)opts;
    log_error("comm: rank %d: the ranks are on several hosts, and this bertd-worker was built without "
              "libgloo-dev (the network backend); install it and rebuild", rank);
    return -ENOTSUP;
}
#endif
