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
#include "tests/gpu/gpu_check.h"
#include "worker/gpu_model.h"
#include "worker/model.h"
#include "worker/optim.h"

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

static optim_config flash_optim_config(void)
{
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    oc.lr = 1e-3f;
    oc.weight_decay = 0.01f;
    oc.warmup_steps = 2;
    oc.total_steps = 10;
    return oc;
}

static void report(int ok, const char *what, kdtype dt, double val, double tol)
{
    printf("%-4s %-48s %-4s rel=%.3g (tol %.0e)\n", ok ? "ok" : "FAIL", what, kdtype_name(dt), val,
           tol);
    gpu_failures += !ok;
}

static double norm2_rel(const float *got, const float *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        double d = (double)got[i] - ref[i];
        e += d * d;
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : INFINITY;
}

/* A GPU model created with BERTD_LEVER_FLASH2 set to flash2 and
 * BERTD_ATTENTION unset (the caller's settings back after); it must run the
 * fused attention with the lever as asked (a failure is counted and NULL
 * returned otherwise). */
static gpu_model *make_flash_model(const bert_config *c, kdtype dt, const optim_config *oc,
                                   int flash2, const float *params)
{
    static const char *const vars[2] = {"BERTD_LEVER_FLASH2", "BERTD_ATTENTION"};
    char *keep[2];
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(vars[i]);
        keep[i] = v ? strdup(v) : NULL;
    }
    setenv(vars[0], flash2 ? "1" : "0", 1);
    unsetenv(vars[1]);
    gpu_model *g = NULL;
    char err[256] = "";
    int rc = gpu_model_create(&g, c, dt, 0, FB, FT, FM, oc, err, sizeof err);
    for (int i = 0; i < 2; i++) {
        if (keep[i])
            setenv(vars[i], keep[i], 1);
        else
            unsetenv(vars[i]);
        free(keep[i]);
    }
    if (rc != 0) {
        printf("FAIL gpu_model_create %s: %s\n", kdtype_name(dt), err);
        gpu_failures++;
        return NULL;
    }
    int fused = gpu_model_attention_fused(g), lever = (g->levers & CUDA_LEVER_FLASH2) != 0,
        kernels = (cuda_levers() & CUDA_LEVER_FLASH2) != 0;
    int ok = fused && lever == flash2 && kernels == flash2;
    printf("%-4s model attention: %s, FLASH2 %s (kernels' mask: %s)\n", ok ? "ok" : "FAIL",
           fused ? "fused" : "unfused", lever ? "on" : "off", kernels ? "on" : "off");
    if (!ok || gpu_model_set_params(g, params) != 0) {
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
    optim_config oc = flash_optim_config();
    bert_model *cpu = NULL;
    if (bert_model_create(&cpu, &c) != 0)
        abort();
    bert_model_init_weights(cpu, 1234);
    gpu_model *g = make_flash_model(&c, dt, &oc, flash2, cpu->params_memory);
    if (!g) {
        bert_model_destroy(cpu);
        return;
    }
    char err[256];
    size_t n = cpu->num_params;
    double gtol = 5e-2, ltol = 1e-2;

    fbatch bs;
    make_fbatch(&bs, &c, 0);
    bert_dropout d = {.train = 1, .seed = 99, .rank = 0, .step = 0, .micro = 0};
    if (bert_model_forward(cpu, &bs.b, &d) != 0)
        abort();
    bert_model_zero_grad(cpu);
    bert_model_backward(cpu, 1.0f);
    if (gpu_model_upload(g, &bs.b, err, sizeof err) != 0) {
        printf("FAIL upload: %s\n", err);
        abort();
    }
    gpu_model_zero_grad(g);
    float scale = gpu_model_loss_scale(g);
    gpu_model_forward(g, &d, scale);
    float gl = gpu_model_loss(g);
    double lrel = fabs((double)gl - cpu->loss) / fabs((double)cpu->loss);
    report(isfinite(gl) && lrel <= ltol, "model loss (dropout on)", dt, lrel, ltol);
    gpu_model_backward(g);
    float *gg = malloc(n * 4);
    if (gpu_model_get_grads(g, gg) != 0)
        abort();
    for (size_t i = 0; i < n; i++)
        gg[i] /= scale;
    size_t off = 0;
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
        size_t sz = cpu->param_sizes[i];
        if (sz) {
            char name[64];
            snprintf(name, sizeof name, "model grad %s", bert_param_name(i));
            check_close(name, dt, gg + off, cpu->grads_memory + off, sz, gtol);
        }
        off += sz;
    }

    /* 10 AdamW steps, eps at the gradient's RMS on both sides (test_model_cuda) */
    oc.eps = (float)(optim_global_norm(cpu->grads_memory, n) / sqrt((double)n));
    g->ocfg.eps = oc.eps;
    size_t nseg = (size_t)bert_param_segments(&c, NULL, NULL, 0);
    size_t *segs = calloc(nseg, sizeof *segs);
    int *decays = calloc(nseg, sizeof *decays);
    bert_param_segments(&c, segs, decays, (int)nseg);
    optim *o = NULL;
    if (optim_create(&o, &oc, segs, decays, (int)nseg) != 0)
        abort();
    float *p0 = host_copy(cpu->params_memory, n);
    double worst_loss = 0;
    for (int k = 0; k < 10; k++) {
        make_fbatch(&bs, &c, k + 1);
        bert_dropout dk = {.train = 1, .seed = 99, .rank = 0, .step = (uint32_t)k + 1};
        bert_model_forward(cpu, &bs.b, &dk);
        bert_model_zero_grad(cpu);
        bert_model_backward(cpu, 1.0f);
        if (optim_step(o, cpu->params_memory, cpu->grads_memory, NULL, NULL) != 0)
            abort();
        if (gpu_model_upload(g, &bs.b, err, sizeof err) != 0)
            abort();
        gpu_model_zero_grad(g);
        gpu_model_forward(g, &dk, gpu_model_loss_scale(g));
        float l = gpu_model_loss(g);
        double e = isfinite(l) ? fabs((double)l - cpu->loss) / fabs((double)cpu->loss) : INFINITY;
        worst_loss = e > worst_loss ? e : worst_loss;
        gpu_model_backward(g);
        int skipped = 0;
        if (gpu_model_step(g, NULL, NULL, &skipped) != 0 || skipped) {
            printf("FAIL gpu_model_step %d (skipped %d)\n", k, skipped);
            gpu_failures++;
        }
    }
    report(worst_loss <= ltol * 2, "10 AdamW steps: worst step loss", dt, worst_loss, ltol * 2);
    float *gp = malloc(n * 4);
    if (gpu_model_get_params(g, gp) != 0)
        abort();
    for (size_t i = 0; i < n; i++) {
        gp[i] -= p0[i];
        cpu->params_memory[i] -= p0[i];
    }
    double ur = norm2_rel(gp, cpu->params_memory, n);
    report(ur <= 5e-2, "10 AdamW steps: update p10 - p0", dt, ur, 5e-2);
    free(gg); free(gp); free(p0); free(segs); free(decays);
    optim_destroy(o);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

/* Steps [from, to) of the resume test: batch s + 40, dropout on (step s),
 * clipping on; each step's loss and gradient norm kept. */
static void run_steps(gpu_model *g, const bert_config *c, int from, int to, float *loss,
                      double *gnorm)
{
    char err[256];
    for (int s = from; s < to; s++) {
        fbatch bs;
        make_fbatch(&bs, c, s + 40);
        bert_dropout d = {.train = 1, .seed = 11, .rank = 0, .step = (uint32_t)s};
        if (gpu_model_upload(g, &bs.b, err, sizeof err) != 0)
            abort();
        gpu_model_zero_grad(g);
        gpu_model_forward(g, &d, gpu_model_loss_scale(g));
        loss[s] = gpu_model_loss(g);
        gpu_model_backward(g);
        int skipped = 0;
        if (gpu_model_step(g, NULL, &gnorm[s], &skipped) != 0 || skipped) {
            printf("FAIL gpu_model_step %d (skipped %d)\n", s, skipped);
            gpu_failures++;
        }
    }
}

static size_t differ(const void *a, const void *b, size_t n, size_t size)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0;
    return d;
}

/* FLASH2 on: a model checkpointed after step 2 and resumed in a fresh model
 * ends steps 3-5 with the same bits as the one that went on. */
static void test_flash2_resume(kdtype dt)
{
    printf("--- FLASH2 on, resumed after step 2 vs uninterrupted, %s\n", kdtype_name(dt));
    bert_config c = flash_config();
    optim_config oc = flash_optim_config();
    oc.max_grad_norm = 1.0f;
    bert_model *cpu = NULL;
    if (bert_model_create(&cpu, &c) != 0)
        abort();
    bert_model_init_weights(cpu, 2468);
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
    size_t dl = differ(la + RS, lr + RS, NS - RS, sizeof *la),
           dg = differ(ga + RS, gr + RS, NS - RS, sizeof *ga), dp = differ(pa, pr, n, 4),
           dopt = differ(oa, orr, 2 * n, 4), moved = differ(p, pa, n, 4);
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
