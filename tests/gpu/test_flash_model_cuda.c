/* test_flash_model_cuda — the GPU model (worker/gpu_model.c) with the fused
 * (flash) attention in both of its forms, the first one and the second
 * (lever CUDA_LEVER_FLASH2, BERTD_LEVER_FLASH2: kernels/cuda/flash_attention2.cuh),
 * as the whole model runs them:
 *   - against the CPU model (worker/model.c), each form: loss and every
 *     parameter gradient of one forward/backward with dropout on, then 10
 *     AdamW steps (worst step loss, update p10 - p0), in bf16 (fp16 on a
 *     part without bf16), at test_model_cuda's 16-bit tolerances and with
 *     its eps rule (see there: gradients 5e-2, losses 1e-2, update 5e-2
 *     normwise); the model must report the fused attention
 *     (gpu_model_attention_fused) and the lever as asked, in its mask and
 *     in the kernels' (cuda_levers); BERTD_ATTENTION (device-check sets it
 *     to unfused after a failed flash test) is unset while models are made;
 *   - FLASH2 resumed, fp16 (so the loss scaler is part of the state): a
 *     model runs steps 0-2, its state (fp32 parameters, optimizer state and
 *     step, loss scaler: what a checkpoint holds) goes into a fresh model,
 *     and both run steps 3-5 with dropout and clipping on: losses, gradient
 *     norms, parameters and optimizer state must be the same bits, and the
 *     parameters must have moved.
 * test_model_cuda's model has head dim 16 and T 24, which the fused
 * attention does not take (test_flash_attention runs one forward/backward
 * of a head-dim-32 model at T 24, a single tile); here head dim 32 (2
 * heads of hidden 64), the NSP head, and
 * T 80: two key tiles forward (64 + 16) and backward (64 + 16), three query
 * tiles of 32 in FLASH2's backward, the last ones partial, so the online
 * softmax merges tiles, dQ is summed over key tiles, and the short
 * sequence's second key tile is skipped.
 *
 * Under the CPU stand-in (suite cudasim, deferred streams) blocks and the
 * threads of each block start in another shuffled order on every launch.
 * Shown (each edit made, run, undone; the FLASH2-off part passing each
 * time): FLASH2's backward skipping its last key tile fails 17 gradient
 * lines and the update of the FLASH2 comparison, and the resume (its
 * steps NaN); the barrier before its dQ update removed fails the same, and
 * the two runs of steps 3-5 differ in every parameter. Not caught here: dQ
 * summed with float atomics by the four warps (an order that varies per
 * launch) kept the bits, since dQ is rounded once to 16 bits and at these
 * gradient sizes the fp32 order differences did not cross a rounding
 * boundary; test_flash_attention's bitwise check, which runs fp32 too,
 * fails on that edit (cudasim_flash_attention_flash2_deferred).
 * Exits 77 without a GPU, or on a part whose shared memory the flash
 * kernels do not fit (a T4: the model takes the unfused path there).
 */
#include "tests/gpu/model_check.h"

enum { FB = 3, FT = 80, FM = 24 };

typedef struct fbatch {
    int32_t ids[FB * FT], types[FB * FT], lens[FB], pos[FM], labels[FM], nsp[FB];
    bert_batch b;
} fbatch;

/* Batch k: one full sequence, one ending inside the second key tile, one
 * shorter than the first (10..16 tokens); distinct masked positions
 * inside each sequence's length. */
static void make_fbatch(fbatch *s, const bert_config *c, int k)
{
    for (int i = 0; i < FB * FT; i++) {
        s->ids[i] = (int32_t)((i * 37 + k * 101 + 5) % c->vocab_size);
        s->types[i] = (i % FT) >= FT / 2;
    }
    s->lens[0] = FT;
    s->lens[1] = FT - 13;
    s->lens[2] = 10 + k % 7;
    for (int m = 0; m < FM; m++) {
        int b = m % FB, t = (m * 7 + k) % s->lens[b];
        s->pos[m] = b * FT + t;
        s->labels[m] = (int32_t)((m * 131 + k * 7 + 1) % c->vocab_size);
    }
    for (int m = 0; m < FM; m++) /* positions must be distinct: move repeats on in their row */
        for (int j = 0; j < m; j++)
            if (s->pos[j] == s->pos[m]) {
                int b = s->pos[m] / FT, t = s->pos[m] % FT;
                s->pos[m] = b * FT + (t + 1) % s->lens[b];
                j = -1;
            }
    for (int b = 0; b < FB; b++)
        s->nsp[b] = (b + k) % 2;
    s->b = (bert_batch){.B = FB, .T = FT, .M = FM, .input_ids = s->ids,
                        .token_type_ids = s->types, .seq_lens = s->lens,
                        .mlm_positions = s->pos, .mlm_labels = s->labels,
                        .nsp_labels = c->nsp ? s->nsp : NULL};
}

/* test_model_cuda's model (gpu_test_config) with 2 heads and room for T 80 */
static bert_config flash_config(void)
{
    bert_config c = gpu_test_config(2, 1);
    c.max_position_embeddings = 128;
    return c;
}

/* make_fbatch into the fbatch ctx (mc_batch_fn) */
static const bert_batch *next_fbatch(void *ctx, const bert_config *c, int k)
{
    fbatch *s = ctx;
    make_fbatch(s, c, k);
    return &s->b;
}

/* A GPU model created with BERTD_LEVER_FLASH2 set to flash2 and
 * BERTD_ATTENTION unset (the caller's settings back after); it must run the
 * fused attention with the lever as asked (a failure is counted and NULL
 * returned otherwise). */
static gpu_model *make_flash_model(const bert_config *c, kdtype dt, const optim_config *oc,
                                   int flash2, const float *params)
{
    char *keep_flash2 = mc_env_set("BERTD_LEVER_FLASH2", flash2 ? "1" : "0"),
         *keep_attention = mc_env_set("BERTD_ATTENTION", NULL);
    gpu_model *g = mc_model(c, dt, FB, FT, FM, oc, params, kdtype_name(dt));
    mc_env_restore("BERTD_LEVER_FLASH2", keep_flash2);
    mc_env_restore("BERTD_ATTENTION", keep_attention);
    if (!g)
        return NULL;
    int fused = gpu_model_attention_fused(g), lever = (g->levers & CUDA_LEVER_FLASH2) != 0,
        kernels = (cuda_levers() & CUDA_LEVER_FLASH2) != 0;
    int ok = fused && lever == flash2 && kernels == flash2;
    printf("%-4s model attention: %s, FLASH2 %s (kernels' mask: %s)\n", ok ? "ok" : "FAIL",
           fused ? "fused" : "unfused", lever ? "on" : "off", kernels ? "on" : "off");
    if (!ok) {
        gpu_failures++;
        gpu_model_destroy(g);
        return NULL;
    }
    if (dt == KDT_F16) /* as test_model_cuda: a scale that does not overflow */
        g->scaler.scale = 1024.0f;
    return g;
}

/* The whole model with the fused attention (FLASH2 off or on) against the
 * CPU model: test_model_cuda's test_forward_backward_steps at this shape. */
static void test_against_cpu(kdtype dt, int flash2)
{
    printf("--- whole model, fused attention, FLASH2 %s, %s, head dim 32, T %d\n",
           flash2 ? "on" : "off", kdtype_name(dt), FT);
    bert_config c = flash_config();
    optim_config oc = mc_optim_config();
    bert_model *cpu = mc_cpu_model(&c, 1234);
    gpu_model *g = make_flash_model(&c, dt, &oc, flash2, cpu->params_memory);
    if (!g) {
        bert_model_destroy(cpu);
        return;
    }
    double gtol = 5e-2, ltol = 1e-2;

    fbatch bs;
    make_fbatch(&bs, &c, 0);
    bert_dropout d = {.train = 1, .seed = 99, .rank = 0, .step = 0, .micro = 0};
    float scale = mc_forward_backward(g, cpu, &bs.b, &d, dt, ltol);
    mc_check_model_grads(g, cpu, scale, dt, gtol);

    /* 10 AdamW steps, eps at the gradient's RMS on both sides (test_model_cuda) */
    float *p0 = mc_adamw_steps(g, cpu, &oc, 10, next_fbatch, &bs, dt, ltol);
    mc_check_update(g, cpu, p0, "10 AdamW steps: update p10 - p0", dt, 5e-2);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

/* Steps [from, to) of the resume test: batch s + 40, dropout on (step s),
 * clipping on; each step's loss and gradient norm kept. */
static void run_steps(gpu_model *g, const bert_config *c, int from, int to, float *loss,
                      double *gnorm)
{
    for (int s = from; s < to; s++) {
        fbatch bs;
        make_fbatch(&bs, c, s + 40);
        bert_dropout d = {.train = 1, .seed = 11, .rank = 0, .step = (uint32_t)s};
        loss[s] = mc_train_step(g, &bs.b, &d, s, &gnorm[s]);
    }
}

/* FLASH2 on: a model checkpointed after step 2 and resumed in a fresh model
 * ends steps 3-5 with the same bits as the one that went on. */
static void test_flash2_resume(kdtype dt)
{
    printf("--- FLASH2 on, resumed after step 2 vs uninterrupted, %s\n", kdtype_name(dt));
    bert_config c = flash_config();
    optim_config oc = mc_optim_config();
    oc.max_grad_norm = 1.0f;
    bert_model *cpu = mc_cpu_model(&c, 2468);
    size_t n = cpu->num_params;
    gpu_model *a = make_flash_model(&c, dt, &oc, 1, cpu->params_memory);
    gpu_model *r = a ? make_flash_model(&c, dt, &oc, 1, cpu->params_memory) : NULL;
    if (!r) {
        gpu_model_destroy(a);
        bert_model_destroy(cpu);
        return;
    }
    enum { RS = 3, NS = 6 };
    float la[NS], lr[NS];
    double ga[NS], gr[NS];
    float *p = malloc(n * 4), *o = malloc(2 * n * 4), *pa = malloc(n * 4), *pr = malloc(n * 4),
          *oa = malloc(2 * n * 4), *orr = malloc(2 * n * 4);
    run_steps(a, &c, 0, RS, la, ga);
    /* the checkpoint: fp32 parameters, optimizer state and step, scaler */
    gpu_loss_scaler sc;
    gpu_model_get_scaler(a, &sc);
    if (gpu_model_get_params(a, p) != 0 || gpu_model_get_opt_state(a, o) != 0 ||
        gpu_model_set_params(r, p) != 0 || gpu_model_set_opt_state(r, o, a->t) != 0 ||
        gpu_model_set_scaler(r, &sc) != 0)
        abort();
    run_steps(a, &c, RS, NS, la, ga);
    run_steps(r, &c, RS, NS, lr, gr);
    if (gpu_model_get_params(a, pa) != 0 || gpu_model_get_opt_state(a, oa) != 0 ||
        gpu_model_get_params(r, pr) != 0 || gpu_model_get_opt_state(r, orr) != 0)
        abort();
    size_t dl = mc_differ(la + RS, lr + RS, NS - RS, sizeof *la),
           dg = mc_differ(ga + RS, gr + RS, NS - RS, sizeof *ga), dp = mc_differ(pa, pr, n, 4),
           dopt = mc_differ(oa, orr, 2 * n, 4), moved = mc_differ(p, pa, n, 4);
    int finite = 1;
    for (int s = 0; s < NS; s++)
        finite &= isfinite(la[s]) && isfinite(ga[s]);
    int ok = dl == 0 && dg == 0 && dp == 0 && dopt == 0 && moved > n / 2 && finite;
    printf("%-4s resumed at step %d, after step %d: %zu losses, %zu gradient norms, %zu parameters, "
           "%zu optimizer floats differ (%zu of %zu parameters moved since the checkpoint%s)\n",
           ok ? "ok" : "FAIL", RS, NS - 1, dl, dg, dp, dopt, moved, n, finite ? "" : "; NaN or inf");
    gpu_failures += !ok;
    free(p); free(o); free(pa); free(pr); free(oa); free(orr);
    gpu_model_destroy(a);
    gpu_model_destroy(r);
    bert_model_destroy(cpu);
}

int main(void)
{
    gpu_require_device();
    bert_set_threads(4);
    kdtype dt = gpu_has_bf16() ? KDT_BF16 : KDT_F16;
    bert_config c = flash_config();
    if (!cuda_flash_attention_supported(FT, c.hidden_size, c.num_attention_heads, dt)) {
        printf("skip: no flash attention on this device at T %d, head dim %d, %s\n", FT,
               c.hidden_size / c.num_attention_heads, kdtype_name(dt));
        return 77;
    }
    test_against_cpu(dt, 0);
    test_against_cpu(dt, 1);
    test_flash2_resume(KDT_F16);
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown(); /* the CPU stand-in reports device memory left behind */
    return gpu_failures ? 1 : 0;
}
