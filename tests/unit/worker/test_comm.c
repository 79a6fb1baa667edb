/* comm (shm backend): real forked rank processes.
 *
 * Allreduce results must equal, bit for bit, the mean the parent computes
 * with the definition's summation order (float, ranks 0..G-1, then / G), on
 * every rank, for 1..4 ranks and sizes around the chunk and segment
 * boundaries. A rank killed with SIGKILL, stopped with SIGSTOP, aborting, or
 * never showing up must end every other rank's call with an error, never a
 * hang, and leave nothing in /dev/shm.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "worker/comm.h"
#include "tests/unit/worker/comm_ranks.h"

#define MAXF 1000 /* max_floats of the test groups: small, so chunking is exercised */
/* Generous: a healthy run never comes near it; the failure tests that rely
 * on it pass their own. */
#define TIMEOUT_MS 20000

static const size_t sizes[] = {1, 7, 15, 16, 17, 33, 999, 1000, 1001, 2000, 2049, 3333};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define TOTAL_FLOATS 20000 /* >= sum of sizes */

static int name_counter;

static void test_name(char *buf, size_t n)
{
    char job[64];
    snprintf(job, sizeof(job), "test-%d-%d", (int)getpid(), name_counter++);
    assert_int_equal(comm_name_for_job(buf, n, job), 0);
}

static void assert_unlinked(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(errno, ENOENT);
}

typedef int (*rank_fn)(int rank, int world, const char *name, void *arg);

/* Forks one process per entry of ranks[] and returns their exit codes (or
 * 128 + signal) in codes. */
static void run_ranks(const int *ranks, int n, int world, const char *name, rank_fn fn, void *arg,
                      int *codes, pid_t *pids_out)
{
    pid_t pids[COMM_MAX_WORLD];
    for (int k = 0; k < n; k++) {
        pids[k] = fork();
        assert_true(pids[k] >= 0);
        if (pids[k] == 0)
            _exit(fn(ranks[k], world, name, arg));
        if (pids_out)
            pids_out[k] = pids[k];
    }
    if (!codes)
        return;
    for (int k = 0; k < n; k++) {
        int st;
        assert_int_equal(waitpid(pids[k], &st, 0), pids[k]);
        codes[k] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
}

static void run_all(int world, const char *name, rank_fn fn, void *arg, int *codes)
{
    int ranks[COMM_MAX_WORLD];
    for (int g = 0; g < world; g++)
        ranks[g] = g;
    run_ranks(ranks, world, world, name, fn, arg, codes, NULL);
}

/* ---- correctness ---- */

typedef struct exact_arg {
    float *out;     /* (world, TOTAL_FLOATS) each rank's results, sizes packed */
    double *f64;    /* (world, 3) */
    uint8_t *bcast; /* (world, 5000) */
} exact_arg;

static int exact_rank(int rank, int world, const char *name, void *argp)
{
    exact_arg *a = argp;
    comm *c = NULL;
    int rc = comm_create_shm(&c, name, rank, world, MAXF, TIMEOUT_MS);
    if (rc != 0)
        return RC_CREATE;
    int code = RC_OK;
    float *out = a->out + (size_t)rank * TOTAL_FLOATS;
    for (size_t k = 0; k < NSIZES && code == RC_OK; k++) {
        for (size_t i = 0; i < sizes[k]; i++)
            out[i] = comm_ranks_value(rank, (int)k, i);
        if (comm_allreduce_mean(c, out, sizes[k]) != 0)
            code = RC_ALLREDUCE;
        out += sizes[k];
    }
    double *v = a->f64 + rank * 3;
    v[0] = 0.1 * (rank + 1);
    v[1] = 1e16;
    v[2] = -(double)rank;
    if (code == RC_OK && comm_allreduce_sum_f64(c, v, 3) != 0)
        code = RC_F64;
    /* broadcast from the last rank, more bytes than one slab half */
    uint8_t *b = a->bcast + (size_t)rank * 5000;
    for (int i = 0; i < 5000; i++)
        b[i] = rank == world - 1 ? (uint8_t)(i * 7 + 3) : 0;
    if (code == RC_OK && comm_broadcast(c, b, 5000, world - 1) != 0)
        code = RC_BCAST;
    if (code == RC_OK && comm_barrier(c) != 0)
        code = RC_BARRIER;
    comm_destroy(c);
    return code;
}

static void check_exact(int world)
{
    char name[COMM_NAME_MAX];
    test_name(name, sizeof(name));
    exact_arg a = {
        .out = comm_ranks_shared_alloc(sizeof(float) * TOTAL_FLOATS * (size_t)world),
        .f64 = comm_ranks_shared_alloc(sizeof(double) * 3 * (size_t)world),
        .bcast = comm_ranks_shared_alloc(5000 * (size_t)world),
    };
    int codes[COMM_MAX_WORLD];
    run_all(world, name, exact_rank, &a, codes);
    for (int g = 0; g < world; g++)
        assert_int_equal(codes[g], RC_OK);

    size_t off = 0;
    for (size_t k = 0; k < NSIZES; k++) {
        for (size_t i = 0; i < sizes[k]; i++) {
            float acc = comm_ranks_value(0, (int)k, i);
            for (int g = 1; g < world; g++)
                acc += comm_ranks_value(g, (int)k, i);
            float want = acc / (float)world;
            for (int g = 0; g < world; g++) {
                float got = a.out[(size_t)g * TOTAL_FLOATS + off + i];
                if (memcmp(&got, &want, sizeof(float)) != 0)
                    fail_msg("world %d size %zu elem %zu rank %d: got %a want %a", world, sizes[k], i, g,
                             (double)got, (double)want);
            }
        }
        off += sizes[k];
    }
    double want[3] = {0, 0, 0};
    for (int g = 0; g < world; g++) {
        want[0] += 0.1 * (g + 1);
        want[1] += 1e16;
        want[2] += -(double)g;
    }
    for (int g = 0; g < world; g++)
        for (int j = 0; j < 3; j++)
            assert_memory_equal(&a.f64[g * 3 + j], &want[j], sizeof(double));
    for (int g = 0; g < world; g++)
        for (int i = 0; i < 5000; i++)
            assert_int_equal(a.bcast[(size_t)g * 5000 + i], (uint8_t)(i * 7 + 3));
    assert_unlinked(name);
    munmap(a.out, sizeof(float) * TOTAL_FLOATS * (size_t)world);
    munmap(a.f64, sizeof(double) * 3 * (size_t)world);
    munmap(a.bcast, 5000 * (size_t)world);
}

static void test_exact_1(void **state)
{
    (void)state;
    check_exact(1);
}

static void test_exact_2(void **state)
{
    (void)state;
    check_exact(2);
}

static void test_exact_3(void **state)
{
    (void)state;
    check_exact(3);
}

static void test_exact_4(void **state)
{
    (void)state;
    check_exact(4);
}

/* The sum order matters: for these values, summing in another order gives a
 * different float in some element, so the bit-equality above really pins the
 * rank order (and is not satisfied by any order at all). */
static void test_order_matters(void **state)
{
    (void)state;
    int differs = 0;
    for (size_t i = 0; i < 1000 && !differs; i++) {
        float fwd = comm_ranks_value(0, 0, i) + comm_ranks_value(1, 0, i) + comm_ranks_value(2, 0, i);
        float rev = comm_ranks_value(2, 0, i) + comm_ranks_value(1, 0, i) + comm_ranks_value(0, 0, i);
        differs = memcmp(&fwd, &rev, sizeof(float)) != 0;
    }
    assert_true(differs);
}

/* ---- failures ---- */

typedef struct fail_arg {
    int victim;
    int die_at;         /* iteration at which the victim dies (-1: killed from outside) */
    int how;            /* 0 SIGKILL, 1 SIGSTOP, 2 comm_abort then pause */
    int timeout_ms;
    int *fail_iter;     /* (world) shared: iteration whose call failed */
    volatile int *progress; /* (world) shared: allreduces completed */
} fail_arg;

static int fail_rank(int rank, int world, const char *name, void *argp)
{
    fail_arg *a = argp;
    comm *c = NULL;
    int rc = comm_create_shm(&c, name, rank, world, MAXF, a->timeout_ms);
    if (rc != 0)
        return RC_CREATE;
    float buf[2500];
    for (int it = 0;; it++) {
        if (rank == a->victim && it == a->die_at) {
            if (a->how == 0)
                raise(SIGKILL);
            if (a->how == 1)
                raise(SIGSTOP);
            comm_abort(c, -EIO);
            for (;;)
                pause();
        }
        for (size_t i = 0; i < 2500; i++)
            buf[i] = comm_ranks_value(rank, it, i);
        rc = comm_allreduce_mean(c, buf, 2500);
        if (rc != 0) {
            a->fail_iter[rank] = it;
            break;
        }
        a->progress[rank] = it + 1;
        if (it > 100000000)
            break; /* unreachable in a passing run */
    }
    /* a dead comm stays dead */
    int rc2 = comm_barrier(c);
    comm_destroy(c);
    if (rc2 != -EPIPE)
        return RC_OTHER;
    return comm_ranks_code_of(rc);
}

static void check_peer_loss(int world, int victim, int die_at, int how, int timeout_ms)
{
    char name[COMM_NAME_MAX];
    test_name(name, sizeof(name));
    fail_arg a = {.victim = victim, .die_at = die_at, .how = how, .timeout_ms = timeout_ms,
                  .fail_iter = comm_ranks_shared_alloc(sizeof(int) * COMM_MAX_WORLD),
                  .progress = comm_ranks_shared_alloc(sizeof(int) * COMM_MAX_WORLD)};
    int ranks[COMM_MAX_WORLD];
    pid_t pids[COMM_MAX_WORLD];
    for (int g = 0; g < world; g++)
        ranks[g] = g;
    run_ranks(ranks, world, world, name, fail_rank, &a, NULL, pids);
    if (die_at < 0) {
        /* kill from outside at an arbitrary moment of the allreduce loop,
         * once the group is up and running */
        struct timespec ts = {0, 1000000L};
        while (a.progress[victim] < 20)
            nanosleep(&ts, NULL);
        kill(pids[victim], SIGKILL);
    }
    for (int g = 0; g < world; g++) {
        if (g == victim)
            continue;
        int st;
        assert_int_equal(waitpid(pids[g], &st, 0), pids[g]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), RC_EPIPE);
        if (die_at >= 0)
            assert_int_equal(a.fail_iter[g], die_at); /* every earlier allreduce completed */
    }
    kill(pids[victim], SIGKILL); /* the stopped or pausing victim */
    int st;
    assert_int_equal(waitpid(pids[victim], &st, 0), pids[victim]);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    assert_unlinked(name);
    munmap(a.fail_iter, sizeof(int) * COMM_MAX_WORLD);
    munmap((void *)a.progress, sizeof(int) * COMM_MAX_WORLD);
}

/* The survivors only learn of the death through the liveness check: the
 * timeout is far beyond the meson limit, so relying on it would fail. */
static void test_kill9_rank1_of_3(void **state)
{
    (void)state;
    check_peer_loss(3, 1, 5, 0, 600000);
}

static void test_kill9_rank0_of_4(void **state)
{
    (void)state;
    check_peer_loss(4, 0, 3, 0, 600000);
}

static void test_kill9_outside_2(void **state)
{
    (void)state;
    check_peer_loss(2, 1, -1, 0, 600000);
}

/* A stopped rank is alive: only the timeout can end the wait. */
static void test_stuck_rank(void **state)
{
    (void)state;
    check_peer_loss(3, 2, 4, 1, 2000);
}

/* comm_abort reaches the others promptly: again the timeout is out of reach. */
static void test_abort(void **state)
{
    (void)state;
    check_peer_loss(3, 1, 2, 2, 600000);
}

typedef struct join_arg {
    int timeout_ms;
    size_t max_floats[COMM_MAX_WORLD];
} join_arg;

static int join_rank(int rank, int world, const char *name, void *argp)
{
    join_arg *a = argp;
    comm *c = NULL;
    size_t mf = a->max_floats[rank] ? a->max_floats[rank] : MAXF;
    int rc = comm_create_shm(&c, name, rank, world, mf, a->timeout_ms);
    if (rc == 0) {
        rc = comm_barrier(c);
        comm_destroy(c);
        return rc == 0 ? RC_OK : comm_ranks_code_of(rc);
    }
    return comm_ranks_code_of(rc);
}

static void test_rank_never_joins(void **state)
{
    (void)state;
    char name[COMM_NAME_MAX];
    test_name(name, sizeof(name));
    join_arg a = {.timeout_ms = 300};
    int ranks[2] = {0, 1}, codes[2];
    run_ranks(ranks, 2, 3, name, join_rank, &a, codes, NULL); /* rank 2 of 3 missing */
    assert_int_equal(codes[0], RC_ETIMEDOUT);
    assert_int_equal(codes[1], RC_ETIMEDOUT);
    assert_unlinked(name);
}

static void test_rank0_never_creates(void **state)
{
    (void)state;
    char name[COMM_NAME_MAX];
    test_name(name, sizeof(name));
    join_arg a = {.timeout_ms = 300};
    int ranks[1] = {1}, codes[1];
    run_ranks(ranks, 1, 2, name, join_rank, &a, codes, NULL);
    assert_int_equal(codes[0], RC_ETIMEDOUT);
    assert_unlinked(name);
}

/* A rank configured differently must not join and corrupt the group, and
 * rank 0 must hear of it at once (its timeout is out of reach). */
static void test_geometry_mismatch(void **state)
{
    (void)state;
    char name[COMM_NAME_MAX];
    test_name(name, sizeof(name));
    join_arg a = {.timeout_ms = 600000, .max_floats = {MAXF, MAXF + 1}};
    int codes[2];
    run_all(2, name, join_rank, &a, codes);
    assert_int_equal(codes[0], RC_EPROTO);
    assert_int_equal(codes[1], RC_EPROTO);
    assert_unlinked(name);
}

/* A leftover segment of a dead run under the same name is replaced, and a
 * late rank never joins the leftover. */
static void test_stale_segment(void **state)
{
    (void)state;
    char name[COMM_NAME_MAX];
    test_name(name, sizeof(name));
    /* leave a joined-but-abandoned segment: rank 0 of a group of 2 whose
     * process is gone (it registered, then died before rank 1 joined) */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        comm *c = NULL;
        comm_create_shm(&c, name, 0, 2, MAXF, 600000); /* killed while waiting */
        _exit(1);
    }
    char path[256];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    struct timespec ts = {0, 1000000L};
    while (access(path, F_OK) != 0)
        nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    assert_int_equal(access(path, F_OK), 0); /* the leftover */

    join_arg a = {.timeout_ms = TIMEOUT_MS};
    int ranks[2] = {1, 0}, codes[2]; /* rank 1 first, so it meets the leftover */
    run_ranks(ranks, 2, 2, name, join_rank, &a, codes, NULL);
    assert_int_equal(codes[0], RC_OK);
    assert_int_equal(codes[1], RC_OK);
    assert_unlinked(name);
}

typedef struct mismatch_arg {
    size_t n[2];
} mismatch_arg;

static int mismatch_rank(int rank, int world, const char *name, void *argp)
{
    mismatch_arg *a = argp;
    comm *c = NULL;
    if (comm_create_shm(&c, name, rank, world, MAXF, TIMEOUT_MS) != 0)
        return RC_CREATE;
    float buf[64] = {0};
    int rc = comm_allreduce_mean(c, buf, a->n[rank]);
    comm_destroy(c);
    return rc == 0 ? RC_OK : comm_ranks_code_of(rc);
}

/* Ranks that disagree on the size get an error, not a silently wrong mean.
 * (-EPROTO on the rank that notices; the other sees the abort as -EPROTO
 * too, or -EPIPE if the abort wins the race.) */
static void test_size_mismatch(void **state)
{
    (void)state;
    char name[COMM_NAME_MAX];
    test_name(name, sizeof(name));
    mismatch_arg a = {.n = {10, 11}};
    int codes[2];
    run_all(2, name, mismatch_rank, &a, codes);
    for (int g = 0; g < 2; g++)
        assert_true(codes[g] == RC_EPROTO || codes[g] == RC_EPIPE);
    assert_true(codes[0] == RC_EPROTO || codes[1] == RC_EPROTO);
}

/* ---- replica check ---- */

typedef struct agree_arg {
    int odd_rank;   /* this rank's buffer differs, -1 for none */
    size_t odd_at;  /* in which byte */
    size_t bytes;
} agree_arg;

enum { RC_AGREE = 40, RC_DIFFER = 41 };

static int agree_rank(int rank, int world, const char *name, void *argp)
{
    agree_arg *a = argp;
    comm *c = NULL;
    if (comm_create_shm(&c, name, rank, world, MAXF, TIMEOUT_MS) != 0)
        return RC_CREATE;
    unsigned char *buf = malloc(a->bytes);
    for (size_t i = 0; i < a->bytes; i++)
        buf[i] = (unsigned char)(comm_ranks_mix(i) >> 7);
    if (rank == a->odd_rank)
        buf[a->odd_at] ^= 0x10; /* one bit, as a flipped or stale value would */
    int rc = comm_replicas_agree(c, buf, a->bytes);
    free(buf);
    comm_destroy(c);
    return rc == 1 ? RC_AGREE : rc == 0 ? RC_DIFFER : comm_ranks_code_of(rc);
}

/* Equal buffers agree on every rank; one bit off on one rank — in a whole
 * 8-byte word or in the tail — is seen by every rank. */
static void test_replicas_agree(void **state)
{
    (void)state;
    static const agree_arg cases[] = {
        {-1, 0, 4003}, {2, 0, 4003}, {1, 2000, 4003}, {0, 4002, 4003}, {2, 1, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char name[COMM_NAME_MAX];
        test_name(name, sizeof(name));
        agree_arg a = cases[k];
        int codes[3];
        run_all(3, name, agree_rank, &a, codes);
        for (int g = 0; g < 3; g++)
            assert_int_equal(codes[g], a.odd_rank < 0 ? RC_AGREE : RC_DIFFER);
        assert_unlinked(name);
    }
}

static void test_bad_args(void **state)
{
    (void)state;
    comm *c = NULL;
    char buf[COMM_NAME_MAX];
    assert_int_equal(comm_create_shm(&c, "/x", 2, 2, 10, 100), -EINVAL);
    assert_int_equal(comm_create_shm(&c, "/x", 0, 0, 10, 100), -EINVAL);
    assert_int_equal(comm_create_shm(&c, "/x", 0, COMM_MAX_WORLD + 1, 10, 100), -EINVAL);
    assert_int_equal(comm_create_shm(&c, "/x", 0, 1, 0, 100), -EINVAL);
    assert_int_equal(comm_create_shm(&c, "x", 0, 1, 10, 100), -EINVAL);
    assert_int_equal(comm_name_for_job(buf, sizeof(buf), "a/b"), -EINVAL);
    assert_int_equal(comm_name_for_job(buf, sizeof(buf), ""), -EINVAL);
    assert_int_equal(comm_name_for_job(buf, sizeof(buf), "job-1"), 0);
    assert_string_equal(buf, "/bertd-job-1-comm");
    /* world 1: no peers, the mean is the buffer itself */
    test_name(buf, sizeof(buf));
    assert_int_equal(comm_create_shm(&c, buf, 0, 1, 10, 100), 0);
    assert_int_equal(comm_broadcast(c, buf, 1, 1), -EINVAL);
    assert_int_equal(comm_allreduce_sum_f64(c, NULL, -1), -EINVAL);
    comm_destroy(c);
    assert_unlinked(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replicas_agree),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_order_matters),
        cmocka_unit_test(test_exact_1),
        cmocka_unit_test(test_exact_2),
        cmocka_unit_test(test_exact_3),
        cmocka_unit_test(test_exact_4),
        cmocka_unit_test(test_kill9_rank1_of_3),
        cmocka_unit_test(test_kill9_rank0_of_4),
        cmocka_unit_test(test_kill9_outside_2),
        cmocka_unit_test(test_stuck_rank),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_rank_never_joins),
        cmocka_unit_test(test_rank0_never_creates),
        cmocka_unit_test(test_geometry_mismatch),
        cmocka_unit_test(test_stale_segment),
        cmocka_unit_test(test_size_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
