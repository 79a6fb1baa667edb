/* comm + model + optim: data parallelism is the same training as one big
 * batch. For AdamW and LAMB, 20 steps of
 *   (a) 1 process, batch 2B,
 *   (b) 1 process, batch B, 2 accumulation micro-steps (loss scale 1/2 each),
 *   (c) 2 forked rank processes, batch B each, gradients meaned by
 *       comm_allreduce_mean over the shm backend,
 * must give the same weights to fp32 rounding, and (c)'s two ranks must hold
 * bit-identical weights. Once with direct model/optim calls, once through
 * the host trainer as the CPU device of the training loop steps it
 * (trainer_micro per micro-batch, comm_allreduce_mean, optim_step).
 *
 * Why not bit-equal across (a), (b), (c): the gradient mean is summed in a
 * different order. (a) sums all 2B*T rows in one GEMM and scales the loss by
 * 1/(2M); (c) sums each half separately, scales by 1/M, then (g0 + g1) / 2;
 * (b) accumulates two halves with scale 1/2. Each gradient element therefore
 * differs by a few ulp (relative ~1e-7).
 *
 * Tolerance. Adam's and LAMB's update m/(sqrt(v) + eps) is invariant to the
 * gradient's scale while |g| >> eps, so a relative gradient difference of
 * ~1e-7 changes an update of size ~lr = 1e-3 by ~1e-10; over 20 steps, with
 * the differences fed back through the forward pass, that is ~1e-8 .. 1e-7.
 * (An element whose gradient is itself at rounding-noise level and below
 * eps = 1e-8 could differ by up to lr * noise / eps; none does in this
 * fixed, seeded setup — the measured maximum is ~1.5e-7.) The bound used is
 * max |w_a - w_b| <= 2e-6 absolute: above that estimate and the measurement
 * with headroom for BLAS kernel choices, yet four orders of magnitude below
 * how far the weights move over the run (> 1e-3, asserted; ~1e-2 measured),
 * so a wrong mean (a sum, a rank's gradient dropped, a stale gradient) fails.
 *
 * Dropout is off: masks are drawn per rank (docs/formats.md), so with
 * dropout the runs are different (equally valid) samples, not equal.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "worker/comm.h"
#include "tests/unit/worker/comm_ranks.h"
#include "worker/model.h"
#include "worker/optim.h"
#include "worker/train.h"

#define NB 4     /* B of the header: sequences per rank (per micro-batch) */
#define NT 16
#define NK 3     /* masked positions per sequence: equal M on every rank */
#define STEPS 20
#define SEED 1234
#define TOL 2e-6
#define MIN_MOVE 1e-3

static void tiny_config(bert_config *c)
{
    assert_int_equal(bert_config_preset(c, "bert-tiny"), 0);
    c->vocab_size = 256;
    c->hidden_size = 32;
    c->num_hidden_layers = 2;
    c->num_attention_heads = 2;
    c->intermediate_size = 64;
    c->max_position_embeddings = 32;
    char err[256];
    assert_int_equal(bert_config_validate(c, err, sizeof(err)), 0);
}

typedef struct batch_buf {
    int32_t ids[2 * NB * NT], tt[2 * NB * NT], lens[2 * NB], pos[2 * NB * NK], labels[2 * NB * NK];
    bert_batch b;
} batch_buf;

/* Sequences j0 .. j0+nb-1 of global step s: a pure function of (s, j), so
 * every variant sees the same data. */
static void make_batch(batch_buf *bb, int s, int j0, int nb, int V)
{
    for (int k = 0; k < nb; k++) {
        int j = j0 + k;
        uint64_t h = comm_ranks_mix((uint64_t)s * 1000003u + (uint64_t)j);
        int len = NT - (int)(h % 5); /* 12..16 */
        bb->lens[k] = len;
        for (int t = 0; t < NT; t++) {
            uint64_t ht = comm_ranks_mix(h + (uint64_t)t + 1);
            bb->ids[k * NT + t] = t < len ? 5 + (int32_t)(ht % (uint64_t)(V - 5)) : 0;
            bb->tt[k * NT + t] = t < len / 2 ? 0 : 1;
        }
        for (int q = 0; q < NK; q++) {
            int t = 1 + q * 4 + (int)((h >> 8) % 4); /* distinct, < 12 */
            bb->pos[k * NK + q] = k * NT + t;
            bb->labels[k * NK + q] = 5 + (int32_t)(comm_ranks_mix(h ^ (uint64_t)(q + 77)) % (uint64_t)(V - 5));
        }
    }
    bb->b = (bert_batch){.B = nb, .T = NT, .M = nb * NK, .input_ids = bb->ids, .token_type_ids = bb->tt,
                         .seq_lens = bb->lens, .mlm_positions = bb->pos, .mlm_labels = bb->labels,
                         .nsp_labels = NULL};
}

typedef struct local_trainer {
    bert_model *m;
    optim *o;
    size_t *sizes;
    int *decays;
} local_trainer;

static int local_init(local_trainer *tr, optim_kind kind)
{
    bert_config cfg;
    tiny_config(&cfg);
    if (bert_model_create(&tr->m, &cfg) != 0)
        return -1;
    bert_model_init_weights(tr->m, SEED);
    optim_config oc;
    optim_config_default(&oc, kind);
    oc.lr = 1e-3f;
    oc.weight_decay = 0.01f;
    oc.warmup_steps = 3;
    oc.total_steps = STEPS;
    oc.max_grad_norm = 1.0f;
    int nseg = bert_param_segments(&cfg, NULL, NULL, 0);
    tr->sizes = calloc((size_t)nseg, sizeof(*tr->sizes));
    tr->decays = calloc((size_t)nseg, sizeof(*tr->decays));
    if (!tr->sizes || !tr->decays)
        return -1;
    bert_param_segments(&cfg, tr->sizes, tr->decays, nseg);
    return optim_create(&tr->o, &oc, tr->sizes, tr->decays, nseg);
}

static void local_free(local_trainer *tr)
{
    optim_destroy(tr->o);
    bert_model_destroy(tr->m);
    free(tr->sizes);
    free(tr->decays);
}

/* One process: micro micro-batches of 2B/micro sequences per step. Writes the
 * final weights to out and step 0's loss to *loss0. */
static int train_local(optim_kind kind, int micro, float *out, double *loss0)
{
    local_trainer tr;
    if (local_init(&tr, kind) != 0)
        return -1;
    batch_buf *bb = malloc(sizeof(*bb));
    int rc = bb ? 0 : -1;
    int nb = 2 * NB / micro;
    for (int s = 0; s < STEPS && rc == 0; s++) {
        bert_model_zero_grad(tr.m);
        double loss = 0;
        for (int u = 0; u < micro && rc == 0; u++) {
            make_batch(bb, s, u * nb, nb, tr.m->cfg.vocab_size);
            rc = bert_model_forward(tr.m, &bb->b, NULL);
            if (rc == 0)
                rc = bert_model_backward(tr.m, 1.0f / (float)micro);
            loss += tr.m->loss / micro;
        }
        double lr, gn;
        if (rc == 0)
            rc = optim_step(tr.o, tr.m->params_memory, tr.m->grads_memory, &lr, &gn);
        if (s == 0)
            *loss0 = loss;
    }
    memcpy(out, tr.m->params_memory, tr.m->num_params * sizeof(float));
    free(bb);
    local_free(&tr);
    return rc;
}

/* One rank of the data-parallel run (in a forked child). */
static int train_rank(optim_kind kind, const char *name, int rank, float *out, double *loss0)
{
    bert_set_threads(1);
    local_trainer tr;
    if (local_init(&tr, kind) != 0)
        return 2;
    comm *c = NULL;
    if (comm_create_shm(&c, name, rank, 2, 1 << 16, 60000) != 0)
        return 3;
    batch_buf *bb = malloc(sizeof(*bb));
    int rc = bb ? 0 : -1;
    for (int s = 0; s < STEPS && rc == 0; s++) {
        bert_model_zero_grad(tr.m);
        make_batch(bb, s, rank * NB, NB, tr.m->cfg.vocab_size);
        rc = bert_model_forward(tr.m, &bb->b, NULL);
        if (rc == 0)
            rc = bert_model_backward(tr.m, 1.0f);
        if (rc == 0)
            rc = comm_allreduce_mean(c, tr.m->grads_memory, tr.m->num_params);
        double loss = tr.m->loss;
        if (rc == 0)
            rc = comm_allreduce_sum_f64(c, &loss, 1);
        if (s == 0)
            *loss0 = loss / 2;
        double lr, gn;
        if (rc == 0)
            rc = optim_step(tr.o, tr.m->params_memory, tr.m->grads_memory, &lr, &gn);
    }
    memcpy(out, tr.m->params_memory, tr.m->num_params * sizeof(float));
    comm_destroy(c);
    free(bb);
    local_free(&tr);
    return rc == 0 ? 0 : 4;
}

/* ---- the same through the host trainer (train.h), as worker/device_cpu.c
 * steps it ---- */

/* micro micro-batches of 2B/(world*micro) sequences per rank and step */
static int train_loop(optim_kind kind, int micro, int rank, int world, const char *name, float *out,
                      double *loss0)
{
    train_config tc = {0};
    tiny_config(&tc.model);
    tc.model.hidden_dropout_prob = 0.0f; /* see the file header */
    tc.model.attention_probs_dropout_prob = 0.0f;
    optim_config_default(&tc.optim, kind);
    tc.optim.lr = 1e-3f;
    tc.optim.weight_decay = 0.01f;
    tc.optim.warmup_steps = 3;
    tc.optim.total_steps = STEPS;
    tc.optim.max_grad_norm = 1.0f;
    tc.seed = SEED;
    tc.rank = (uint32_t)rank;
    tc.threads = 1;
    comm *c = NULL;
    if (world > 1 && comm_create_shm(&c, name, rank, world, 1 << 16, 60000) != 0)
        return 3;
    trainer *t = NULL;
    char err[256] = "";
    int rc = trainer_create(&t, &tc, err, sizeof(err));
    batch_buf *bb = calloc((size_t)micro, sizeof(*bb));
    bert_batch mb[4];
    int nb = 2 * NB / (world * micro);
    for (int s = 0; s < STEPS && rc == 0 && bb; s++) {
        for (int u = 0; u < micro; u++) {
            make_batch(&bb[u], s, rank * micro * nb + u * nb, nb, tc.model.vocab_size);
            mb[u] = bb[u].b;
        }
        bert_model *m = t->model;
        double loss = 0, lr, gn;
        bert_model_zero_grad(m);
        for (int u = 0; u < micro && rc == 0; u++)
            rc = trainer_micro(t, &mb[u], u, micro, &loss, err, sizeof(err));
        loss /= micro;
        if (rc == 0 && c) {
            rc = comm_allreduce_mean(c, m->grads_memory, m->num_params);
            if (rc == 0)
                rc = comm_allreduce_sum_f64(c, &loss, 1); /* as the loop's per-step sums */
            loss /= world;
        }
        if (rc == 0)
            rc = optim_step(t->opt, m->params_memory, m->grads_memory, &lr, &gn);
        t->step++;
        if (s == 0)
            *loss0 = loss;
    }
    if (rc != 0)
        fprintf(stderr, "rank %d: %s (%s)\n", rank, err, strerror(-rc));
    if (t)
        memcpy(out, t->model->params_memory, t->model->num_params * sizeof(float));
    trainer_destroy(t);
    comm_destroy(c);
    free(bb);
    return rc == 0 && bb ? 0 : 4;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++)
        w = fmax(w, fabs((double)a[i] - (double)b[i]));
    return w;
}

/* Shared memory for two forked ranks' final weights (np floats each) and
 * their step-0 losses, and the job's comm name. */
typedef struct two_ranks {
    size_t np, bytes;
    float *shared;    /* (2, np) */
    double *loss_ddp; /* (2) */
    char name[COMM_NAME_MAX];
    pid_t pids[2];
} two_ranks;

static void ranks_map(two_ranks *t, const char *prefix, const char *label)
{
    bert_config cfg;
    tiny_config(&cfg);
    size_t sizes[BERT_NUM_PARAM_TENSORS];
    bert_param_sizes(&cfg, sizes);
    t->np = 0;
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
        t->np += sizes[i];
    t->bytes = t->np * sizeof(float) * 2 + 4096;
    t->shared = mmap(NULL, t->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(t->shared != MAP_FAILED);
    t->loss_ddp = (double *)(t->shared + 2 * t->np);
    char job[64];
    snprintf(job, sizeof(job), "%s-%d-%s", prefix, (int)getpid(), label);
    assert_int_equal(comm_name_for_job(t->name, sizeof(t->name), job), 0);
}

/* Both ranks exited 0 and hold bit-identical weights. */
static void ranks_wait(two_ranks *t)
{
    for (int r = 0; r < 2; r++) {
        int st;
        assert_int_equal(waitpid(t->pids[r], &st, 0), t->pids[r]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    assert_memory_equal(t->shared, t->shared + t->np, t->np * sizeof(float));
    assert_memory_equal(&t->loss_ddp[0], &t->loss_ddp[1], sizeof(double));
}

static void check(optim_kind kind, const char *label)
{
    bert_config cfg;
    tiny_config(&cfg);
    two_ranks t;
    ranks_map(&t, "ddp", label);
    size_t np = t.np;
    float *shared = t.shared;
    double *loss_ddp = t.loss_ddp;
    /* the ranks first: nothing in this process has started BLAS/OpenMP
     * threads yet, so the children inherit none */
    for (int r = 0; r < 2; r++) {
        t.pids[r] = fork();
        assert_true(t.pids[r] >= 0);
        if (t.pids[r] == 0)
            _exit(train_rank(kind, t.name, r, shared + (size_t)r * np, &loss_ddp[r]));
    }
    float *big = malloc(np * sizeof(float)), *accum = malloc(np * sizeof(float));
    float *init = malloc(np * sizeof(float));
    assert_non_null(big);
    assert_non_null(accum);
    assert_non_null(init);
    double loss_big = 0, loss_accum = 0;
    assert_int_equal(train_local(kind, 1, big, &loss_big), 0);
    assert_int_equal(train_local(kind, 2, accum, &loss_accum), 0);
    ranks_wait(&t); /* the two ranks: bit-identical */
    {
        bert_model *m = NULL;
        assert_int_equal(bert_model_create(&m, &cfg), 0);
        bert_model_init_weights(m, SEED);
        memcpy(init, m->params_memory, np * sizeof(float));
        bert_model_destroy(m);
    }
    double d_ddp = max_abs_diff(shared, big, np);
    double d_acc = max_abs_diff(accum, big, np);
    double moved = max_abs_diff(big, init, np);
    print_message("  %s: max |w| diff vs 1x2B: 2 ranks %.3g, 2 micro-steps %.3g (tol %.1g); weights moved %.3g;"
                  " step-0 loss 1x2B %.7f ddp %.7f\n",
                  label, d_ddp, d_acc, TOL, moved, loss_big, loss_ddp[0]);
    assert_true(moved > MIN_MOVE);
    assert_true(d_ddp <= TOL);
    assert_true(d_acc <= TOL);
    /* step-0 loss: mean of the two ranks' means == the big batch's mean
     * (equal M per rank), to float rounding */
    assert_true(fabs(loss_ddp[0] - loss_big) <= 1e-6 * fabs(loss_big));
    assert_true(fabs(loss_accum - loss_big) <= 1e-6 * fabs(loss_big));
    free(big);
    free(accum);
    free(init);
    munmap(t.shared, t.bytes);
}

static void check_loop(optim_kind kind, const char *label)
{
    two_ranks t;
    ranks_map(&t, "loop", label);
    size_t np = t.np;
    float *shared = t.shared;
    double *loss_ddp = t.loss_ddp;
    for (int r = 0; r < 2; r++) {
        t.pids[r] = fork();
        assert_true(t.pids[r] >= 0);
        if (t.pids[r] == 0)
            _exit(train_loop(kind, 1, r, 2, t.name, shared + (size_t)r * np, &loss_ddp[r]));
    }
    float *big = malloc(np * sizeof(float)), *accum = malloc(np * sizeof(float));
    float *direct = malloc(np * sizeof(float));
    assert_non_null(big);
    assert_non_null(accum);
    assert_non_null(direct);
    double loss_big = 0, loss_accum = 0, loss_direct = 0;
    assert_int_equal(train_loop(kind, 1, 0, 1, NULL, big, &loss_big), 0);
    assert_int_equal(train_loop(kind, 2, 0, 1, NULL, accum, &loss_accum), 0);
    assert_int_equal(train_local(kind, 1, direct, &loss_direct), 0);
    ranks_wait(&t);
    double d_ddp = max_abs_diff(shared, big, np);
    double d_acc = max_abs_diff(accum, big, np);
    double d_direct = max_abs_diff(direct, big, np);
    print_message("  %s via the host trainer: max |w| diff vs 1x2B: 2 ranks %.3g, 2 micro-steps %.3g,"
                  " direct model/optim calls %.3g (tol %.1g)\n",
                  label, d_ddp, d_acc, d_direct, TOL);
    assert_true(d_ddp <= TOL);
    assert_true(d_acc <= TOL);
    assert_true(d_direct <= TOL);
    assert_true(fabs(loss_ddp[0] - loss_big) <= 1e-6 * fabs(loss_big));
    free(big);
    free(accum);
    free(direct);
    munmap(t.shared, t.bytes);
}

static void test_loop_adamw(void **state)
{
    (void)state;
    check_loop(OPTIM_ADAMW, "adamw");
}

static void test_loop_lamb(void **state)
{
    (void)state;
    check_loop(OPTIM_LAMB, "lamb");
}

static void test_ddp_adamw(void **state)
{
    (void)state;
    check(OPTIM_ADAMW, "adamw");
}

static void test_ddp_lamb(void **state)
{
    (void)state;
    check(OPTIM_LAMB, "lamb");
}

int main(void)
{
    bert_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddp_adamw),
        cmocka_unit_test(test_ddp_lamb),
        cmocka_unit_test(test_loop_adamw),
        cmocka_unit_test(test_loop_lamb),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
