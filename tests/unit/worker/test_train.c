/* test_train — the host trainer, stepped as the CPU device of the training
 * loop steps it, really learns, and checkpoints resume bit-for-bit.
 *  - learns: bert-tiny (vocab overridden to 512 to stay fast) on a synthetic
 *    but structured corpus (every row repeats one of 8 random 5-token motifs,
 *    so a masked token is predictable from its neighbours): the mean MLM loss
 *    of the last 20 of 150 steps must fall below a third of the first 5's.
 *  - exact resume: 6 steps straight versus 3 steps, checkpoint, a fresh
 *    process-like trainer resumed from it, 3 more steps; parameters and
 *    optimizer moments must be memcmp-identical (dropout on, grad accum 2).
 *  - keep-last-N pruning and incomplete checkpoints being skipped. */
#include "worker/train.h"
#include "worker/checkpoint.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

typedef struct batch_buf {
    int32_t *ids, *tt, *lens, *pos, *labels;
    bert_batch b;
} batch_buf;

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Rows repeat a motif; ~15% of positions 1.. are masked (id 3), labels = originals. */
static void make_batch(batch_buf *bb, uint64_t *rng, int B, int T, int V, int motifs[][5],
                       int nmotifs)
{
    bb->ids = malloc(sizeof(int32_t) * B * T);
    bb->tt = calloc((size_t)B * T, sizeof(int32_t));
    bb->lens = malloc(sizeof(int32_t) * B);
    bb->pos = malloc(sizeof(int32_t) * B * T);
    bb->labels = malloc(sizeof(int32_t) * B * T);
    int M = 0;
    for (int b = 0; b < B; b++) {
        int len = T - (int)(xs(rng) % 4); // some padding
        bb->lens[b] = len;
        int *mo = motifs[xs(rng) % nmotifs];
        int shift = (int)(xs(rng) % 5);
        for (int t = 0; t < T; t++) {
            int id = t == 0 ? 2 : t < len ? mo[(t + shift) % 5] : 0;
            bb->ids[b * T + t] = id;
            if (t > 0 && t < len && xs(rng) % 100 < 15) {
                bb->pos[M] = b * T + t;
                bb->labels[M] = id;
                bb->ids[b * T + t] = 3;
                M++;
            }
        }
    }
    if (M == 0) { // never an empty MLM batch
        bb->pos[0] = 1;
        bb->labels[0] = bb->ids[1];
        bb->ids[1] = 3;
        M = 1;
    }
    (void)V;
    bb->b = (bert_batch){.B = B, .T = T, .M = M, .input_ids = bb->ids,
                         .token_type_ids = bb->tt, .seq_lens = bb->lens,
                         .mlm_positions = bb->pos, .mlm_labels = bb->labels};
}

static void free_batch(batch_buf *bb)
{
    free(bb->ids);
    free(bb->tt);
    free(bb->lens);
    free(bb->pos);
    free(bb->labels);
}

/* One optimizer step over micro-batches mb[0..n), as the CPU device of the
 * training loop takes it on one rank (worker/device_cpu.c). Returns the
 * step's mean loss. */
static double train_step(trainer *t, const bert_batch *mb, int n)
{
    char err[256];
    bert_model *m = t->model;
    double loss = 0, lr, gnorm;
    bert_model_zero_grad(m);
    for (int k = 0; k < n; k++)
        if (trainer_micro(t, &mb[k], k, n, &loss, err, sizeof err) < 0)
            fail_msg("step %ld: %s", t->step, err);
    assert_int_equal(optim_step(t->opt, m->params_memory, m->grads_memory, &lr, &gnorm), 0);
    t->step++;
    return loss / n;
}

static void init_motifs(int motifs[][5], int n, int V, uint64_t *rng)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 5; k++)
            motifs[i][k] = 5 + (int)(xs(rng) % (uint64_t)(V - 5));
}

#define STEPS 150
static void test_learns_structured_corpus(void **state)
{
    (void)state;
    train_config tc = {0};
    assert_int_equal(bert_config_preset(&tc.model, "bert-tiny"), 0);
    tc.model.vocab_size = 512;
    tc.model.max_position_embeddings = 64;
    optim_config_default(&tc.optim, OPTIM_ADAMW);
    tc.optim.lr = 3e-3f;
    tc.optim.weight_decay = 0.01f;
    tc.optim.warmup_steps = 15;
    tc.optim.total_steps = STEPS;
    tc.seed = 42;
    tc.threads = 1; // cheapest on a shared CI box; the resume test covers 2 threads
    char err[256];
    trainer *t = NULL;
    int rc = trainer_create(&t, &tc, err, sizeof err);
    if (rc < 0)
        fail_msg("%s", err);
    uint64_t rng = 12345;
    int motifs[8][5];
    init_motifs(motifs, 8, 512, &rng);
    double first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        batch_buf bb;
        make_batch(&bb, &rng, 16, 32, 512, motifs, 8);
        double loss = train_step(t, &bb.b, 1);
        if (s < 5)
            first += loss / 5;
        if (s >= STEPS - 20)
            last += loss / 20;
        free_batch(&bb);
    }
    print_message("  mean MLM loss: first 5 steps %.3f, last 20 steps %.3f (ln V = %.3f)\n",
                  first, last, log(512.0));
    assert_true(first > 5.0);      // starts near chance
    assert_true(last < first / 3); // and really learns the motifs
    trainer_destroy(t);
}

static train_config small_config(void)
{
    train_config tc = {0};
    bert_config_preset(&tc.model, "bert-tiny");
    tc.model.vocab_size = 128;
    tc.model.hidden_size = 32;
    tc.model.num_attention_heads = 4;
    tc.model.intermediate_size = 64;
    tc.model.max_position_embeddings = 32;
    optim_config_default(&tc.optim, OPTIM_ADAMW);
    tc.optim.lr = 1e-3f;
    tc.optim.weight_decay = 0.01f;
    tc.optim.warmup_steps = 2;
    tc.optim.total_steps = 6;
    tc.seed = 7;
    tc.threads = 2;
    return tc;
}

/* steps of 2 micro-batches; save_dir: a checkpoint after each, keeping keep_last */
static void run(trainer *t, int steps, uint64_t seed_for_step0, const char *save_dir, int keep_last)
{
    char err[256];
    int motifs[8][5];
    for (int s = 0; s < steps; s++) {
        /* batches depend only on the step number, as the loader guarantees */
        uint64_t rng = seed_for_step0 + 1000 * (uint64_t)t->step;
        init_motifs(motifs, 8, 128, &rng);
        batch_buf bb[2];
        make_batch(&bb[0], &rng, 3, 16, 128, motifs, 8);
        make_batch(&bb[1], &rng, 3, 16, 128, motifs, 8);
        bert_batch mb[2] = {bb[0].b, bb[1].b};
        train_step(t, mb, 2);
        if (save_dir && checkpoint_save(save_dir, t->step, t->model, t->opt, NULL, keep_last, err,
                                        sizeof err) < 0)
            fail_msg("%s", err);
        free_batch(&bb[0]);
        free_batch(&bb[1]);
    }
}

static void rm_rf(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_exact_resume(void **state)
{
    (void)state;
    char dir[] = "/tmp/bertd-ckpt-XXXXXX", err[256];
    assert_non_null(mkdtemp(dir));
    /* A: six steps without stopping (saves nothing) */
    train_config tca = small_config();
    trainer *a = NULL, *b = NULL;
    assert_int_equal(trainer_create(&a, &tca, err, sizeof err), 0);
    run(a, 6, 99, NULL, 0);
    /* B: three steps, checkpoint at 3, a brand-new trainer resumes */
    train_config tcb = small_config();
    assert_int_equal(trainer_create(&b, &tcb, err, sizeof err), 0);
    run(b, 2, 99, NULL, 0);
    run(b, 1, 99, dir, 0);
    trainer_destroy(b);
    b = NULL;
    long step;
    char path[4200];
    assert_int_equal(checkpoint_latest(dir, &step, path, sizeof path), 0);
    assert_int_equal(step, 3);
    tcb.seed = 12345; // init weights differ: everything must come from the checkpoint
    assert_int_equal(trainer_create(&b, &tcb, err, sizeof err), 0);
    tcb.seed = 7;
    b->cfg.seed = 7;  // dropout seed is part of the job spec, not of the checkpoint
    int rc = trainer_resume(b, path, err, sizeof err);
    if (rc < 0)
        fail_msg("%s", err);
    assert_int_equal(b->step, 3);
    run(b, 3, 99, NULL, 0);
    assert_int_equal(a->model->num_params, b->model->num_params);
    assert_memory_equal(a->model->params_memory, b->model->params_memory,
                        a->model->num_params * sizeof(float));
    assert_memory_equal(a->opt->state_memory, b->opt->state_memory,
                        2 * a->opt->num_params * sizeof(float));
    /* and dropout was really on: an eval forward differs from a train forward */
    trainer_destroy(a);
    trainer_destroy(b);
    rm_rf(dir);
}

static void test_dropout_is_active_and_deterministic(void **state)
{
    (void)state;
    char err[256];
    train_config tc = small_config();
    trainer *t = NULL;
    assert_int_equal(trainer_create(&t, &tc, err, sizeof err), 0);
    uint64_t rng = 5;
    int motifs[8][5];
    init_motifs(motifs, 8, 128, &rng);
    batch_buf bb;
    make_batch(&bb, &rng, 3, 16, 128, motifs, 8);
    bert_dropout d = {.train = 1, .seed = 7, .step = 4};
    assert_int_equal(bert_model_forward(t->model, &bb.b, &d), 0);
    float l1 = t->model->loss;
    assert_int_equal(bert_model_forward(t->model, &bb.b, &d), 0);
    float l2 = t->model->loss;
    assert_int_equal(bert_model_forward(t->model, &bb.b, NULL), 0);
    float l_eval = t->model->loss;
    d.step = 5;
    assert_int_equal(bert_model_forward(t->model, &bb.b, &d), 0);
    float l_other = t->model->loss;
    assert_true(l1 == l2);          // same counters, same masks
    assert_true(l1 != l_eval);      // dropout changes the result
    assert_true(l1 != l_other);     // another step draws other masks
    free_batch(&bb);
    trainer_destroy(t);
}

static void test_keep_last_and_incomplete(void **state)
{
    (void)state;
    char dir[] = "/tmp/bertd-ckpt-XXXXXX", err[256], path[4200];
    assert_non_null(mkdtemp(dir));
    train_config tc = small_config();
    trainer *t = NULL;
    assert_int_equal(trainer_create(&t, &tc, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/ckpt-77.tmp", dir); // debris of a crashed save
    assert_int_equal(mkdir(path, 0755), 0);
    run(t, 4, 1, dir, 2); // keeps the last 2
    assert_int_equal(access(path, F_OK), -1); // pruned with the old checkpoints
    struct stat st;
    for (int s = 1; s <= 4; s++) {
        snprintf(path, sizeof path, "%s/ckpt-%d/DONE", dir, s);
        assert_int_equal(stat(path, &st) == 0, s >= 3);
    }
    /* a newer directory without DONE (crash mid-save) is not "latest" */
    snprintf(path, sizeof path, "%s/ckpt-9", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    long step;
    assert_int_equal(checkpoint_latest(dir, &step, path, sizeof path), 0);
    assert_int_equal(step, 4);
    snprintf(path, sizeof path, "%s/ckpt-9", dir);
    assert_int_equal(checkpoint_load(path, t->model, t->opt, &step, err, sizeof err), -EINVAL);
    print_message("  incomplete checkpoint: %s\n", err);
    /* a checkpoint of another model size is refused, naming the mismatch */
    train_config other = tc;
    other.model.hidden_size = 64;
    trainer *o = NULL;
    assert_int_equal(trainer_create(&o, &other, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/ckpt-4", dir);
    assert_int_equal(trainer_resume(o, path, err, sizeof err), -EINVAL);
    print_message("  mismatched checkpoint: %s\n", err);
    /* a damaged checkpoint is an error, not a crash: truncate params */
    char pfile[4300];
    snprintf(pfile, sizeof pfile, "%s/params.safetensors", path);
    assert_int_equal(truncate(pfile, 1000), 0);
    assert_int_equal(checkpoint_load(path, t->model, t->opt, &step, err, sizeof err) < 0, 1);
    print_message("  truncated checkpoint: %s\n", err);
    bert_config rc_cfg;
    assert_int_equal(checkpoint_read_config(path, &rc_cfg, err, sizeof err), 0);
    assert_int_equal(rc_cfg.hidden_size, 32);
    assert_int_equal(rc_cfg.vocab_size, 128);
    trainer_destroy(o);
    trainer_destroy(t);
    rm_rf(dir);
}

static void test_config_from_jobspec(void **state)
{
    (void)state;
    jobspec js;
    memset(&js, 0, sizeof js);
    js.model = (jobspec_model){.vocab_size = 1000, .hidden_size = 64, .num_hidden_layers = 2,
                               .num_attention_heads = 4, .intermediate_size = 256,
                               .hidden_act = "gelu", .hidden_dropout_prob = 0.1,
                               .attention_probs_dropout_prob = 0.1,
                               .max_position_embeddings = 128, .type_vocab_size = 2,
                               .initializer_range = 0.02, .layer_norm_eps = 1e-12};
    js.training = (jobspec_training){.gradient_accumulation_steps = 2, .learning_rate = 1e-4,
                                     .lr_scheduler_type = "cosine", .warmup_steps = 0,
                                     .warmup_ratio = 0.06, .weight_decay = 0.01,
                                     .adam_beta1 = 0.9, .adam_beta2 = 0.98, .adam_epsilon = 1e-6,
                                     .max_grad_norm = 1.0, .max_steps = 1001, .optim = "lamb",
                                     .seed = 42, .logging_steps = 50, .save_steps = 500,
                                     .save_total_limit = 3};
    js.mlm.nsp = true;
    train_config tc;
    char err[256];
    assert_int_equal(train_config_from_jobspec(&tc, &js, 2, 1, err, sizeof err), 0);
    assert_int_equal(tc.model.hidden_size, 64);
    assert_int_equal(tc.model.nsp, 1);
    assert_int_equal(tc.optim.kind, OPTIM_LAMB);
    assert_int_equal(tc.optim.sched, SCHED_COSINE);
    assert_int_equal(tc.optim.warmup_steps, 61); // ceil(1001 * 0.06), as HF
    assert_true(tc.optim.beta2 == 0.98f);
    assert_int_equal(tc.rank, 1);
    assert_int_equal(tc.threads, 2);
    assert_null(tc.init_from);
    strcpy(js.model.hidden_act, "relu");
    assert_int_equal(train_config_from_jobspec(&tc, &js, 1, 0, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "gelu_new")); // the message names what is supported
    /* GELU's tanh form under both HF names, each kept for the export */
    strcpy(js.model.hidden_act, "gelu_new");
    assert_int_equal(train_config_from_jobspec(&tc, &js, 1, 0, err, sizeof err), 0);
    assert_int_equal(tc.model.act, BERT_ACT_GELU_NEW);
    strcpy(js.model.hidden_act, "gelu_pytorch_tanh");
    assert_int_equal(train_config_from_jobspec(&tc, &js, 1, 0, err, sizeof err), 0);
    assert_int_equal(tc.model.act, BERT_ACT_GELU_PYTORCH_TANH);
    assert_string_equal(bert_act_name(tc.model.act), "gelu_pytorch_tanh");
    strcpy(js.model.hidden_act, "gelu");
    js.model.num_attention_heads = 5; // does not divide 64
    assert_int_equal(train_config_from_jobspec(&tc, &js, 1, 0, err, sizeof err), -EINVAL);
    print_message("  bad spec: %s\n", err);
    assert_non_null(strstr(err, "num_attention_heads"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_from_jobspec),
        cmocka_unit_test(test_dropout_is_active_and_deterministic),
        cmocka_unit_test(test_exact_resume),
        cmocka_unit_test(test_keep_last_and_incomplete),
        cmocka_unit_test(test_learns_structured_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
