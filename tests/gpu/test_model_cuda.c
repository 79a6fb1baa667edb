/* test_model_cuda — the GPU model (worker/gpu_model.c) against the CPU model
 * (worker/model.c, itself checked against HuggingFace): loss and every
 * parameter gradient of one forward/backward with dropout on, then 10
 * AdamW steps, in fp32 and bf16 (and fp16 where the device has it), MLM
 * alone and with the NSP head (BertForPreTraining); fp16
 * loss scaling (an injected inf skips the step, keeps the weights, halves the
 * scale); the memory plan's refusal naming the largest batch that fits, and
 * that batch then really fitting; bad batches refused; the held-out eval
 * (gpu_model_eval: loss sum, masked and correct counts) against the CPU
 * model's bert_model_eval. Exits 77 without a GPU. Run with
 * BERTD_LEVER_VOCAB_PAD=1 it also checks the padded vocabulary's rows stay
 * zero in every device span, and a padded model against an unpadded one.
 *
 * Tolerances (normwise relative, gpu_check.h): one op is held to 1e-5 (fp32)
 * in test_kernels_cuda; a whole model composes ~20 ops per layer whose
 * float summation orders differ (cuBLAS vs OpenBLAS, atomics vs serial
 * loops), so fp32 gradients get 1e-4. 16-bit activations round every stored
 * tensor to 8 (bf16) or 11 (fp16) bits: gradients get 5e-2, losses 1e-2.
 * After 10 AdamW steps the parameter updates (p10 - p0) are compared in the
 * 2-norm (fp32 1e-4, 16-bit 5e-2). Adam's first steps are nearly sign(g), so
 * with the default eps a gradient element below the rounding noise would
 * flip its update by 2*lr on one side only, turning rounding into an O(lr)
 * difference; the test therefore sets eps to the RMS of the first gradient,
 * which keeps each update a smooth function of its gradient (elements far
 * above the noise still take sign-like steps). The AdamW arithmetic itself is
 * checked bit for bit in test_kernels_cuda.
 */
#include "tests/gpu/model_check.h"

#include <errno.h>
#include <unistd.h>

enum { TB = 3, TT = 24, TM = 11 };

typedef struct batch_store {
    int32_t ids[TB * TT], types[TB * TT], lens[TB], pos[TM], labels[TM], nsp[TB];
    bert_batch b;
} batch_store;

static void make_batch(batch_store *s, const bert_config *c, int k)
{
    for (int i = 0; i < TB * TT; i++) {
        s->ids[i] = (int32_t)((i * 37 + k * 101 + 5) % c->vocab_size);
        s->types[i] = (i % TT) >= TT / 2;
    }
    s->lens[0] = TT;
    s->lens[1] = TT - 7;
    s->lens[2] = 9 + k % 5;
    for (int m = 0; m < TM; m++) {
        int b = m % TB, t = (m * 5 + k) % s->lens[b];
        s->pos[m] = b * TT + t;
        s->labels[m] = (int32_t)((m * 131 + k * 7 + 1) % c->vocab_size);
    }
    /* positions must be distinct: nudge repeats */
    for (int m = 0; m < TM; m++)
        for (int j = 0; j < m; j++)
            if (s->pos[j] == s->pos[m]) {
                s->pos[m] = (s->pos[m] + 1) % (TB * TT);
                j = -1;
            }
    for (int b = 0; b < TB; b++)
        s->nsp[b] = (b + k) % 2;
    s->b = (bert_batch){.B = TB, .T = TT, .M = TM, .input_ids = s->ids,
                        .token_type_ids = s->types, .seq_lens = s->lens,
                        .mlm_positions = s->pos, .mlm_labels = s->labels,
                        .nsp_labels = c->nsp ? s->nsp : NULL};
}

/* make_batch into the batch_store ctx (mc_batch_fn) */
static const bert_batch *next_batch(void *ctx, const bert_config *c, int k)
{
    batch_store *s = ctx;
    make_batch(s, c, k);
    return &s->b;
}

/* A CPU model with seeded weights and a GPU model holding the same ones;
 * NULL (counted as a failure, *cpu freed) when the GPU model cannot be made. */
static gpu_model *make_pair(const bert_config *c, kdtype dt, const optim_config *oc, uint64_t seed,
                            bert_model **cpu)
{
    *cpu = mc_cpu_model(c, seed);
    gpu_model *g = mc_model(c, dt, TB, TT, TM, oc, (*cpu)->params_memory, kdtype_name(dt));
    if (!g)
        bert_model_destroy(*cpu);
    return g;
}

/* Lever CUDA_LEVER_VOCAB_PAD (BERTD_LEVER_VOCAB_PAD=1; the suite runs this
 * whole test with it, cudasim_model_cuda_vocab_pad_*): the padding rows of
 * the word embeddings (tied to the decoder) and of the decoder bias must be
 * exactly zero in a device span (fp32 `base`, or the 16-bit copy with
 * lp = 1): a nonzero one would have leaked into the logits, the loss or a
 * real gradient. Counts a failure and says which span otherwise; nothing
 * without the lever. */
static void check_vocab_padding(gpu_model *g, const void *base, int lp, const char *what)
{
    size_t V = (size_t)g->cfg.vocab_size, Vp = (size_t)g->vocab_ld, C = (size_t)g->cfg.hidden_size;
    if (Vp == V)
        return;
    size_t es = lp ? kdtype_size(g->dt) : 4, dec = 0;
    for (int i = 0; i < BP_DEC_B; i++)
        dec += g->param_sizes[i];
    size_t ranges[2][2] = {{V * C, Vp * C}, {dec + V, dec + Vp}}, bad = 0;
    TCHECK(cudaDeviceSynchronize());
    for (int r = 0; r < 2; r++) {
        size_t nb = (ranges[r][1] - ranges[r][0]) * es;
        unsigned char *h = malloc(nb);
        TCHECK(cudaMemcpy(h, (const char *)base + ranges[r][0] * es, nb, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nb; i++)
            bad += h[i] != 0;
        free(h);
    }
    int ok = bad == 0 && Vp % 64 == 0 && Vp - V < 64 && g->dev_params == g->num_params + (Vp - V) * (C + 1);
    printf("%-4s vocabulary padding %zu -> %zu zero in %-22s (%zu nonzero bytes)\n", ok ? "ok" : "FAIL",
           V, Vp, what, bad);
    gpu_failures += !ok;
}

static void test_forward_backward_steps(kdtype dt, int nsp)
{
    printf("--- whole model, %s%s\n", kdtype_name(dt), nsp ? ", with the NSP head" : "");
    bert_config c = gpu_test_config(4, nsp);
    optim_config oc = mc_optim_config();
    bert_model *cpu = NULL;
    gpu_model *g = make_pair(&c, dt, &oc, 1234, &cpu);
    if (!g)
        return;
    /* GradScaler starts at 65536 and backs off on the first overflows; this
     * test compares steps one for one, so fp16 starts at a scale that does
     * not overflow (the backing off has its own test below) */
    if (dt == KDT_F16)
        g->scaler.scale = 1024.0f;
    double gtol = dt == KDT_F32 ? 1e-4 : 5e-2, ltol = dt == KDT_F32 ? 1e-5 : 1e-2;

    /* one forward/backward with dropout on */
    batch_store bs;
    make_batch(&bs, &c, 0);
    bert_dropout d = {.train = 1, .seed = 99, .rank = 0, .step = 0, .micro = 0};
    float scale = mc_forward_backward(g, cpu, &bs.b, &d, dt, ltol);
    check_vocab_padding(g, g->grads_memory, 0, "gradients (backward)");
    mc_check_model_grads(g, cpu, scale, dt, gtol);

    /* 10 AdamW steps over changing batches and dropout masks; eps at the
     * gradient scale (see the file header), the same on both sides */
    float *p0 = mc_adamw_steps(g, cpu, &oc, 10, next_batch, &bs, dt, ltol);
    check_vocab_padding(g, g->params_memory, 0, "parameters (10 steps)");
    if (dt != KDT_F32)
        check_vocab_padding(g, g->params_lp_memory, 1, "16-bit copy (10 steps)");
    check_vocab_padding(g, g->opt_memory, 0, "Adam m (10 steps)");
    check_vocab_padding(g, g->opt_memory + g->dev_params, 0, "Adam v (10 steps)");
    mc_check_update(g, cpu, p0, "10 AdamW steps: update p10 - p0", dt,
                    dt == KDT_F32 ? 1e-4 : 5e-2);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

/* Held-out evaluation (gpu_model_eval) against the CPU model's
 * (bert_model_eval) on the same weights and batches: the summed loss within
 * the loss tolerance, the masked-token count equal, and in fp32 the correct
 * count equal; in 16-bit the argmax may differ where two logits round
 * together, so at most one token in ten. The CPU eval itself is its no-dropout
 * forward: its loss sum over the count is that forward's MLM loss. */
static void test_eval(kdtype dt, int nsp)
{
    printf("--- held-out eval, %s%s\n", kdtype_name(dt), nsp ? ", with the NSP head" : "");
    bert_config c = gpu_test_config(4, nsp);
    optim_config oc = mc_optim_config();
    bert_model *cpu = NULL;
    gpu_model *g = make_pair(&c, dt, &oc, 4321, &cpu);
    if (!g)
        return;
    char err[256];
    bert_eval_sums ce = {0}, ge = {0};
    double single = 0;
    for (int k = 0; k < 3; k++) {
        batch_store bs;
        make_batch(&bs, &c, k + 20);
        /* every other label made the CPU's argmax, so the correct counts
         * compared below are not both zero */
        bert_dropout off0 = {.train = 0};
        bert_model_forward(cpu, &bs.b, &off0);
        for (int m = 0; m < TM; m += 2) {
            const float *row = cpu->acts.logits + (size_t)m * c.vocab_size;
            int best = 0;
            for (int v = 1; v < c.vocab_size; v++)
                best = row[v] > row[best] ? v : best;
            bs.labels[m] = best;
        }
        bert_eval_sums one = {0};
        if (bert_model_eval(cpu, &bs.b, &one) != 0)
            abort();
        bert_dropout offd = {.train = 0};
        bert_model_forward(cpu, &bs.b, &offd);
        double e1 = fabs(one.loss_sum / one.count - cpu->mlm_loss) / fabs((double)cpu->mlm_loss);
        if (e1 > single)
            single = e1;
        ce.loss_sum += one.loss_sum;
        ce.count += one.count;
        ce.correct += one.correct;
        if (gpu_model_eval(g, &bs.b, &ge, err, sizeof err) != 0) {
            printf("FAIL gpu_model_eval: %s\n", err);
            gpu_failures++;
            break;
        }
    }
    mc_report(single <= 1e-6, "CPU eval = its no-dropout forward's MLM loss", dt, single, 1e-6);
    double ltol = dt == KDT_F32 ? 1e-5 : 1e-2;
    double lrel = fabs(ge.loss_sum - ce.loss_sum) / fabs(ce.loss_sum);
    mc_report(isfinite(ge.loss_sum) && lrel <= ltol, "eval loss sum vs CPU", dt, lrel, ltol);
    mc_report(ce.correct >= 3 * ((TM + 1) / 2), "CPU eval counts its argmax labels", dt, ce.correct,
           3 * ((TM + 1) / 2));
    mc_report(ge.count == ce.count && ce.count == 3 * TM, "eval masked-token count vs CPU", dt,
           fabs(ge.count - ce.count), 0);
    double dc = fabs(ge.correct - ce.correct), ctol = dt == KDT_F32 ? 0 : floor(ce.count / 10);
    mc_report(dc <= ctol, "eval correct count vs CPU", dt, dc, ctol);
    printf("     eval loss %.6f (CPU %.6f), accuracy %.0f/%.0f (CPU %.0f)\n", ge.loss_sum / ge.count,
           ce.loss_sum / ce.count, ge.correct, ge.count, ce.correct);
    /* a batch of twice the capacity (6 sequences, 22 masked) is evaluated in
     * runs that fit: the same sums as the CPU's one pass */
    {
        batch_store a, b2;
        make_batch(&a, &c, 30);
        make_batch(&b2, &c, 31);
        int32_t ids[2 * TB * TT], types[2 * TB * TT], lens[2 * TB], pos[2 * TM], labels[2 * TM], nsp[2 * TB];
        memcpy(ids, a.ids, sizeof a.ids);
        memcpy(ids + TB * TT, b2.ids, sizeof b2.ids);
        memcpy(types, a.types, sizeof a.types);
        memcpy(types + TB * TT, b2.types, sizeof b2.types);
        memcpy(lens, a.lens, sizeof a.lens);
        memcpy(lens + TB, b2.lens, sizeof b2.lens);
        memcpy(nsp, a.nsp, sizeof a.nsp);
        memcpy(nsp + TB, b2.nsp, sizeof b2.nsp);
        for (int m = 0; m < TM; m++) {
            pos[m] = a.pos[m];
            labels[m] = a.labels[m];
            pos[TM + m] = b2.pos[m] + TB * TT;
            labels[TM + m] = b2.labels[m];
        }
        bert_batch big = {.B = 2 * TB, .T = TT, .M = 2 * TM, .input_ids = ids, .token_type_ids = types,
                          .seq_lens = lens, .mlm_positions = pos, .mlm_labels = labels,
                          .nsp_labels = c.nsp ? nsp : NULL};
        bert_eval_sums cb = {0}, gb = {0};
        if (bert_model_eval(cpu, &big, &cb) != 0)
            abort();
        int brc = gpu_model_eval(g, &big, &gb, err, sizeof err);
        double brel = fabs(gb.loss_sum - cb.loss_sum) / fabs(cb.loss_sum);
        mc_report(brc == 0 && gb.count == cb.count && brel <= ltol, "eval of a batch twice the capacity", dt,
               brel, ltol);
    }
    /* training goes on after an eval: the next step's loss still matches */
    batch_store bs;
    make_batch(&bs, &c, 1);
    bert_dropout d = {.train = 1, .seed = 5, .rank = 0, .step = 3, .micro = 0};
    bert_model_forward(cpu, &bs.b, &d);
    if (gpu_model_upload(g, &bs.b, err, sizeof err) != 0)
        abort();
    gpu_model_zero_grad(g);
    gpu_model_forward(g, &d, gpu_model_loss_scale(g));
    float gl = gpu_model_loss(g);
    double trel = fabs((double)gl - cpu->loss) / fabs((double)cpu->loss);
    mc_report(isfinite(gl) && trel <= ltol, "training forward after an eval", dt, trel, ltol);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

static void test_loss_scaling(void)
{
    bert_config c = gpu_test_config(4, 0);
    optim_config oc = mc_optim_config();
    /* no warmup: the clean step below is the first that runs (t 0), and a
     * warmup's lr at t 0 is 0, which would leave the parameters unchanged */
    oc.warmup_steps = 0;
    char err[256];
    kdtype dt;
    if (gpu_precision_pick("fp16", 0, &dt, err, sizeof err) != 0) {
        printf("skip loss scaling: %s\n", err);
        return;
    }
    bert_model *cpu = mc_cpu_model(&c, 77);
    gpu_model *g = NULL;
    if (gpu_model_create(&g, &c, KDT_F16, 0, TB, TT, TM, &oc, err, sizeof err) != 0) {
        printf("FAIL create fp16: %s\n", err);
        gpu_failures++;
        bert_model_destroy(cpu);
        return;
    }
    gpu_model_set_params(g, cpu->params_memory);
    size_t n = cpu->num_params;
    float *before = malloc(n * 4), *after = malloc(n * 4);
    batch_store bs;
    make_batch(&bs, &c, 3);
    g->scaler.scale = 2048.0f; // small enough that only the injected inf overflows
    float s0 = gpu_model_loss_scale(g);
    gpu_model_upload(g, &bs.b, err, sizeof err);
    gpu_model_zero_grad(g);
    gpu_model_forward(g, NULL, s0);
    gpu_model_backward(g);
    /* inject an overflow into one gradient (after backward has finished:
     * the model's streams do not synchronise with the legacy stream) */
    TCHECK(cudaStreamSynchronize(g->compute));
    float inf = INFINITY;
    TCHECK(cudaMemcpy(g->grads_memory + n / 3, &inf, sizeof inf, cudaMemcpyHostToDevice));
    TCHECK(cudaDeviceSynchronize()); // a pageable copy may still be in flight

    gpu_model_get_params(g, before);
    int skipped = 0;
    long t0 = g->t;
    int rc = gpu_model_step(g, NULL, NULL, &skipped);
    gpu_model_get_params(g, after);
    int same = memcmp(before, after, n * 4) == 0;
    float s1 = gpu_model_loss_scale(g);
    int ok = rc == 0 && skipped == 1 && same && s1 == s0 * 0.5f && g->t == t0;
    printf("%-4s %-44s fp16 skipped=%d params unchanged=%d scale %g -> %g\n", ok ? "ok" : "FAIL",
           "overflow skips the step, halves the scale", skipped, same, s0, s1);
    gpu_failures += !ok;

    /* a clean step runs, unscales: its gradient norm matches fp32's */
    gpu_model_zero_grad(g);
    gpu_model_forward(g, NULL, s1);
    gpu_model_backward(g);
    double gn16 = 0, gn32 = 0;
    rc = gpu_model_step(g, NULL, &gn16, &skipped);
    bert_model_forward(cpu, &bs.b, NULL);
    bert_model_zero_grad(cpu);
    bert_model_backward(cpu, 1.0f);
    gn32 = optim_global_norm(cpu->grads_memory, n);
    double rel = fabs(gn16 - gn32) / gn32;
    gpu_model_get_params(g, after);
    ok = rc == 0 && !skipped && memcmp(before, after, n * 4) != 0 && rel < 5e-2 &&
         gpu_model_loss_scale(g) == s1;
    printf("%-4s %-44s fp16 gnorm %.6g vs fp32 %.6g (rel %.3g) rc=%d skipped=%d scale %g -> %g\n",
           ok ? "ok" : "FAIL", "scaled step unscales and updates", gn16, gn32, rel, rc, skipped,
           s1, gpu_model_loss_scale(g));
    gpu_failures += !ok;
    free(before); free(after);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

/* Below sm_80 gpu_model_create refuses bf16 before any kernel runs (the
 * bf16 kernels would trap there); from sm_80 it accepts it. */
static void test_bf16_refused_below_sm80(void)
{
    bert_config c = gpu_test_config(2, 0);
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    char err[256] = "";
    gpu_model *g = NULL;
    int rc = gpu_model_create(&g, &c, KDT_BF16, 0, 2, 16, 8, &oc, err, sizeof err);
    int has = gpu_has_bf16();
    int ok = has ? rc == 0 && g : rc == -ENOTSUP && !g && strstr(err, "8.0");
    printf("%-4s %-44s (%s)\n", ok ? "ok" : "FAIL", "bf16 model refused exactly below sm_80",
           rc == 0 ? "created" : err);
    gpu_failures += !ok;
    gpu_model_destroy(g);
}

static void test_memory_plan(void)
{
    bert_config c;
    bert_config_preset(&c, "bert-base");
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    char err[512];
    gpu_model *g = NULL;
    int want = 1000000;
    kdtype dt = gpu_has_bf16() ? KDT_BF16 : KDT_F16; /* the plan of a 16-bit model */
    int rc = gpu_model_create(&g, &c, dt, 0, want, 512, want * 80, &oc, err, sizeof err);
    const char *key = "largest per-device batch that fits is ";
    const char *at = strstr(err, key);
    int fit = at ? atoi(at + strlen(key)) : 0;
    int ok = rc == -ENOMEM && !g && fit > 0 && fit < want;
    printf("%-4s %-44s rc=%d: %s\n", ok ? "ok" : "FAIL", "oversized batch refused with advice", rc,
           err);
    gpu_failures += !ok;
    if (g)
        gpu_model_destroy(g);
    if (fit > 0) {
        g = NULL;
        rc = gpu_model_create(&g, &c, dt, 0, fit, 512, (int)((long long)want * 80 * fit / want),
                              &oc, err, sizeof err);
        printf("%-4s %-44s batch %d x 512: rc=%d %s\n", rc == 0 ? "ok" : "FAIL",
               "the advised batch fits", fit, rc, rc ? err : "");
        gpu_failures += rc != 0;
        gpu_model_destroy(g);
    }
}

static void test_bad_batches(void)
{
    bert_config c = gpu_test_config(4, 0);
    optim_config oc = mc_optim_config();
    char err[256];
    gpu_model *g = NULL;
    if (gpu_model_create(&g, &c, KDT_BF16, 0, TB, TT, TM, &oc, err, sizeof err) != 0) {
        printf("skip bad batches: %s\n", err);
        return;
    }
    batch_store bs;
    make_batch(&bs, &c, 0);
    bs.pos[3] = bs.pos[1];
    int rc = gpu_model_upload(g, &bs.b, err, sizeof err);
    printf("%-4s %-44s rc=%d %s\n", rc == -EINVAL ? "ok" : "FAIL", "repeated mlm position refused",
           rc, err);
    gpu_failures += rc != -EINVAL;
    make_batch(&bs, &c, 0);
    bs.ids[4] = c.vocab_size;
    rc = gpu_model_upload(g, &bs.b, err, sizeof err);
    printf("%-4s %-44s rc=%d %s\n", rc == -EINVAL ? "ok" : "FAIL", "token id outside vocab refused",
           rc, err);
    gpu_failures += rc != -EINVAL;
    rc = gpu_model_backward(g);
    printf("%-4s %-44s rc=%d\n", rc == -EINVAL ? "ok" : "FAIL", "backward without forward refused",
           rc);
    gpu_failures += rc != -EINVAL;
    gpu_model_destroy(g);
}

/* ---- overlapped gradient buckets ----
 * A bucket hook that, stream-ordered on the compute stream, snapshots each
 * range into a shadow buffer and marks it covered. After backward: every
 * parameter covered exactly once, and every snapshot equal to the final
 * gradient — a bucket enqueued before backward had finished writing its
 * range would have snapshotted a partial value. Then finish + step must run
 * through the bucket path (exposed time measured, >= 0). */
typedef struct shadow {
    float *dev;          /* (n) device snapshot */
    unsigned char *seen; /* (n) host coverage count */
    const float *base;   /* g->grads_memory */
    int finished, calls;
    int last_k;          /* ranges of the last bucket enqueued */
    size_t last_off0;    /* its first range's offset */
} shadow;

static int shadow_bucket(void *ctx, float *const *grads, const size_t *n, int k, cudaStream_t s)
{
    shadow *sh = ctx;
    sh->last_k = k;
    sh->last_off0 = k > 0 ? (size_t)(grads[0] - sh->base) : (size_t)-1;
    for (int r = 0; r < k; r++) {
        size_t off = (size_t)(grads[r] - sh->base);
        TCHECK(cudaMemcpyAsync(sh->dev + off, grads[r], n[r] * sizeof(float), cudaMemcpyDeviceToDevice, s));
        for (size_t i = 0; i < n[r]; i++)
            sh->seen[off + i]++;
    }
    sh->calls++;
    return 0;
}

static int shadow_finish(void *ctx, cudaStream_t s)
{
    (void)s;
    ((shadow *)ctx)->finished++;
    return 0;
}

static void test_buckets_final_and_complete(int nsp)
{
    printf("--- gradient buckets during backward%s\n", nsp ? " (NSP head)" : "");
    bert_config c = gpu_test_config(4, nsp);
    optim_config oc = mc_optim_config();
    bert_model *cpu = NULL;
    gpu_model *g = make_pair(&c, KDT_F32, &oc, 77, &cpu);
    if (!g)
        return;
    char err[256];
    size_t n = g->dev_params; /* the device span: with CUDA_LEVER_VOCAB_PAD, padding included */
    shadow sh = {.seen = calloc(n, 1), .base = g->grads_memory};
    TCHECK(cudaMalloc((void **)&sh.dev, n * sizeof(float)));
    gpu_model_set_buckets(g, shadow_bucket, shadow_finish, &sh);
    batch_store bs;
    bert_dropout d = {.train = 1, .seed = 5, .rank = 0, .step = 0};
    gpu_model_zero_grad(g);
    for (int k = 0; k < 2; k++) { /* two micro-batches: only the last one buckets */
        make_batch(&bs, &c, k);
        d.micro = (uint32_t)k;
        if (gpu_model_upload(g, &bs.b, err, sizeof err) != 0)
            abort();
        if (k == 1)
            gpu_model_reduce_in_next_backward(g);
        gpu_model_forward(g, &d, 1.0f);
        gpu_model_backward(g);
        if (k == 0 && sh.calls != 0) {
            printf("FAIL buckets enqueued during an unarmed backward (%d)\n", sh.calls);
            gpu_failures++;
        }
    }
    float *final = malloc(n * 4), *snap = malloc(n * 4);
    TCHECK(cudaDeviceSynchronize());
    TCHECK(cudaMemcpy(final, g->grads_memory, n * 4, cudaMemcpyDeviceToHost));
    TCHECK(cudaMemcpy(snap, sh.dev, n * 4, cudaMemcpyDeviceToHost));
    size_t bad_cover = 0, bad_value = 0;
    for (size_t i = 0; i < n; i++) {
        bad_cover += sh.seen[i] != 1;
        bad_value += sh.seen[i] == 1 && memcmp(&snap[i], &final[i], 4) != 0;
    }
    mc_report(bad_cover == 0, "bucket coverage: params not bucketed exactly once", KDT_F32, (double)bad_cover, 0);
    mc_report(bad_value == 0, "bucket snapshots differing from final grads", KDT_F32, (double)bad_value, 0);
    /* the embeddings (the tied word embeddings first, at offset 0) are the
     * last bucket, alone: the rest of the non-layer parameters went before
     * the embedding backward (L layer buckets + 2) */
    if (sh.calls != c.num_hidden_layers + 2 || sh.last_k != 1 || sh.last_off0 != 0) {
        printf("FAIL bucket order: %d buckets (want %d), the last with %d ranges from offset %zu "
               "(want the embeddings alone, from 0)\n", sh.calls, c.num_hidden_layers + 2, sh.last_k,
               sh.last_off0);
        gpu_failures++;
    } else {
        printf("ok   %d buckets, the embeddings last and alone\n", sh.calls);
    }
    int skipped = 0;
    if (gpu_model_step(g, NULL, NULL, &skipped) != 0 || sh.finished != 1) {
        printf("FAIL step through the bucket path (finish called %d times)\n", sh.finished);
        gpu_failures++;
    }
    float ms = gpu_model_exposed_comm_ms(g);
    mc_report(isfinite(ms) && ms >= 0, "exposed comm ms (finite, >= 0)", KDT_F32, ms, 0);
    /* the next step without arming falls back: no new buckets, no finish */
    gpu_model_zero_grad(g);
    gpu_model_upload(g, &bs.b, err, sizeof err);
    gpu_model_forward(g, &d, 1.0f);
    gpu_model_backward(g);
    gpu_model_step(g, NULL, NULL, &skipped);
    if (sh.finished != 1) {
        printf("FAIL finish called after an unarmed backward\n");
        gpu_failures++;
    }
    cudaFree(sh.dev);
    free(sh.seen); free(final); free(snap);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

/* BERTD_LEVER_*: 1/on and 0/off set and clear their lever, unset keeps the
 * default, anything else is refused naming the variable; a created model
 * records the mask and hands it to the kernels. The suite also runs this
 * whole test with every lever off (cudasim_model_cuda_levers_off_*). */
static size_t host_params(const bert_config *c)
{
    size_t s[BERT_NUM_PARAM_TENSORS], n = 0;
    bert_param_sizes(c, s);
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
        n += s[i];
    return n;
}

static void test_lever_switches(void)
{
    static const char *const vars[] = {"BERTD_LEVER_LN_VEC", "BERTD_LEVER_OPT_ZERO",
                                       "BERTD_LEVER_VOCAB_PAD", "BERTD_LEVER_GRAPH"};
    enum { NV = sizeof vars / sizeof vars[0] };
    char *saved[NV];
    for (int i = 0; i < NV; i++) /* this test's own settings; the caller's come back after */
        saved[i] = mc_env_set(vars[i], NULL);
    char err[160] = "";
    unsigned m = 0;
    int ok = gpu_levers_from_env(&m, err, sizeof err) == 0 && m == CUDA_LEVERS_DEFAULT;
    setenv("BERTD_LEVER_LN_VEC", "0", 1);
    ok &= gpu_levers_from_env(&m, err, sizeof err) == 0 && m == (CUDA_LEVERS_DEFAULT & ~CUDA_LEVER_LN_VEC);
    setenv("BERTD_LEVER_OPT_ZERO", "off", 1);
    setenv("BERTD_LEVER_LN_VEC", "on", 1);
    ok &= gpu_levers_from_env(&m, err, sizeof err) == 0 && (m & CUDA_LEVER_LN_VEC) &&
          !(m & CUDA_LEVER_OPT_ZERO);
    setenv("BERTD_LEVER_LN_VEC", "fast", 1);
    int bad = gpu_levers_from_env(&m, err, sizeof err);
    ok &= bad == -EINVAL && strstr(err, "BERTD_LEVER_LN_VEC") && strstr(err, "fast");
    char refused[160];
    snprintf(refused, sizeof refused, "%s", err);
    /* a model created under BERTD_LEVER_LN_VEC=0 turns the kernels' lever off */
    setenv("BERTD_LEVER_LN_VEC", "0", 1);
    bert_config c = gpu_test_config(4, 0);
    optim_config oc = mc_optim_config();
    gpu_model *g = NULL;
    int rc = gpu_model_create(&g, &c, KDT_F32, 0, TB, TT, TM, &oc, err, sizeof err);
    ok &= rc == 0 && g && !(g->levers & CUDA_LEVER_LN_VEC) && !(cuda_levers() & CUDA_LEVER_LN_VEC);
    ok &= g && g->vocab_ld == c.vocab_size && g->dev_params == g->num_params; /* off by default */
    gpu_model_destroy(g);
    /* BERTD_LEVER_VOCAB_PAD=1: 997 words padded to 1024 on the device only */
    setenv("BERTD_LEVER_VOCAB_PAD", "1", 1);
    g = NULL;
    rc = gpu_model_create(&g, &c, KDT_F32, 0, TB, TT, TM, &oc, err, sizeof err);
    ok &= rc == 0 && g && (g->levers & CUDA_LEVER_VOCAB_PAD) && g->vocab_ld == 1024 &&
          g->num_params == host_params(&c) &&
          g->dev_params == g->num_params + (size_t)(1024 - 997) * (c.hidden_size + 1);
    gpu_model_destroy(g);
    for (int i = 0; i < NV; i++)
        mc_env_restore(vars[i], saved[i]);
    if (gpu_levers_from_env(&m, err, sizeof err) == 0)
        cuda_levers_set(m); /* back to what the rest of the test runs with */
    printf("%-4s %-44s      refused: \"%s\"\n", ok ? "ok" : "FAIL", "BERTD_LEVER_* switches", refused);
    gpu_failures += !ok;
}

/* Lever CUDA_LEVER_VOCAB_PAD resumed, and against the unpadded model,
 * fp32, dropout on, clipping at 1.0. A padded model runs 5 AdamW steps; its
 * state after step 3 (parameters and optimizer state in the host layout,
 * as a checkpoint holds them) is loaded into a fresh padded model, which
 * runs steps 4 and 5: both must end with the same parameters and optimizer
 * state bit for bit (resume). An unpadded model from the same weights runs
 * steps 1-3: not bitwise, since the decoder's d hidden GEMM sums K = Vpad
 * terms instead of V and the padding's zeros change how the sum is cut into
 * partial sums (the stand-in's 16 lanes, a GPU's tiles), so fp32 rounding
 * differs; held to 1e-5 normwise on the update p3 - p0 and on the gradient
 * norms. Runs in the suite's vocab_pad entries only. */
static void run_steps(gpu_model *g, const bert_config *c, int from, int to, double *gnorms)
{
    for (int s = from; s < to; s++) {
        batch_store bs;
        make_batch(&bs, c, s + 40);
        bert_dropout d = {.train = 1, .seed = 11, .rank = 0, .step = (uint32_t)s};
        mc_train_step(g, &bs.b, &d, s, gnorms ? &gnorms[s] : NULL); /* fp32: loss scale 1 */
    }
}

/* The setting of the resume and lever tests below: the NSP model, AdamW
 * clipping at 1.0, a CPU model with seeded weights (theirs to start from). */
static bert_model *clipped_setup(bert_config *c, optim_config *oc, uint64_t seed)
{
    *c = gpu_test_config(4, 1);
    *oc = mc_optim_config();
    oc->max_grad_norm = 1.0f;
    return mc_cpu_model(c, seed);
}

static void test_vocab_pad_resume_vs_unpadded(void)
{
    printf("--- vocabulary padding: resume, and on vs off, fp32\n");
    bert_config c;
    optim_config oc;
    bert_model *cpu = clipped_setup(&c, &oc, 2468);
    size_t n = cpu->num_params;
    gpu_model *gm[3] = {NULL, NULL, NULL}; /* unpadded, padded, padded resumed */
    char *keep = mc_env_set("BERTD_LEVER_VOCAB_PAD", NULL);
    int made = 1;
    for (int k = 0; k < 3 && made; k++) {
        setenv("BERTD_LEVER_VOCAB_PAD", k ? "1" : "0", 1);
        made = (gm[k] = mc_model(&c, KDT_F32, TB, TT, TM, &oc, cpu->params_memory,
                                 k ? "(vocabulary padded)" : "(unpadded)")) != NULL;
    }
    mc_env_restore("BERTD_LEVER_VOCAB_PAD", keep);
    if (!made || gm[1]->vocab_ld != 1024 || gm[0]->vocab_ld != 997) {
        printf("FAIL vocabulary padding: %s\n", made ? "not 997 -> 1024" : "a model not made");
        gpu_failures++;
        for (int k = 0; k < 3; k++)
            gpu_model_destroy(gm[k]);
        bert_model_destroy(cpu);
        return;
    }
    double gn[2][5];
    float *p3 = malloc(n * 4), *o3 = malloc(2 * n * 4), *pa = malloc(n * 4), *pb = malloc(n * 4),
          *oa = malloc(2 * n * 4), *ob = malloc(2 * n * 4);
    run_steps(gm[0], &c, 0, 3, gn[0]);
    run_steps(gm[1], &c, 0, 3, gn[1]);
    /* a checkpoint of the padded model after step 3, resumed by another */
    if (gpu_model_get_params(gm[1], p3) != 0 || gpu_model_get_opt_state(gm[1], o3) != 0 ||
        gpu_model_set_params(gm[2], p3) != 0 || gpu_model_set_opt_state(gm[2], o3, gm[1]->t) != 0)
        abort();
    double worst = 0;
    for (int s = 0; s < 3; s++) {
        double r = fabs(gn[1][s] - gn[0][s]) / gn[0][s];
        worst = r > worst ? r : worst;
    }
    mc_report(worst <= 1e-5, "padded vs unpadded: gradient norms", KDT_F32, worst, 1e-5);
    if (gpu_model_get_params(gm[0], pa) != 0)
        abort();
    for (size_t i = 0; i < n; i++) {
        pa[i] -= cpu->params_memory[i];
        pb[i] = p3[i] - cpu->params_memory[i];
    }
    double ur = mc_norm2_rel(pb, pa, n);
    mc_report(ur <= 1e-5, "padded vs unpadded: update p3 - p0", KDT_F32, ur, 1e-5);
    run_steps(gm[1], &c, 3, 5, NULL);
    run_steps(gm[2], &c, 3, 5, NULL);
    if (gpu_model_get_params(gm[1], pa) != 0 || gpu_model_get_opt_state(gm[1], oa) != 0 ||
        gpu_model_get_params(gm[2], pb) != 0 || gpu_model_get_opt_state(gm[2], ob) != 0)
        abort();
    size_t dp = 0, dopt = 0;
    for (size_t i = 0; i < n; i++)
        dp += memcmp(&pa[i], &pb[i], 4) != 0;
    for (size_t i = 0; i < 2 * n; i++)
        dopt += memcmp(&oa[i], &ob[i], 4) != 0;
    int same = dp == 0 && dopt == 0;
    printf("%-4s padded, resumed after step 3: %zu parameters, %zu optimizer floats differ at step 5\n",
           same ? "ok" : "FAIL", dp, dopt);
    gpu_failures += !same;
    free(p3); free(o3); free(pa); free(pb); free(oa); free(ob);
    for (int k = 0; k < 3; k++)
        gpu_model_destroy(gm[k]);
    bert_model_destroy(cpu);
}

/* ---- lever CUDA_LEVER_GRAPH (the suite's graph entry runs this test with
 * BERTD_LEVER_GRAPH=1: the whole model against the CPU as above, and the
 * checks below) ---- */

/* Creates a model with BERTD_LEVER_GRAPH set to on (1) or off (0) for this
 * creation only. */
static gpu_model *create_graph_lever(int on, const bert_config *c, kdtype dt,
                                     const optim_config *oc, const float *params)
{
    char *keep = mc_env_set("BERTD_LEVER_GRAPH", on ? "1" : "0");
    gpu_model *g = mc_model(c, dt, TB, TT, TM, oc, params, on ? "(lever GRAPH 1)" : "(lever GRAPH 0)");
    mc_env_restore("BERTD_LEVER_GRAPH", keep);
    return g;
}

/* Steps from..to-1 of run_graph_steps's schedule: dropout on, the batch and
 * the Philox step changing every step; gnorms[s] the reported norm. */
static void run_graph_steps(gpu_model *g, const bert_config *c, int from, int to, double *gnorms,
                            int *rcs)
{
    char err[256];
    for (int s = from; s < to; s++) {
        batch_store bs;
        make_batch(&bs, c, s + 60);
        bert_dropout d = {.train = 1, .seed = 13, .rank = 0, .step = (uint32_t)s};
        gpu_model_upload(g, &bs.b, err, sizeof err);
        gpu_model_zero_grad(g);
        gpu_model_forward(g, &d, gpu_model_loss_scale(g));
        gpu_model_backward(g);
        int skipped = 0;
        rcs[s] = gpu_model_step(g, NULL, &gnorms[s], &skipped);
        rcs[s] = rcs[s] ? rcs[s] : skipped ? 1 : 0;
    }
}

/* The lever's masked-row padding, its device-side norm, clip and skip, and
 * the lever on against off (the by-value kernels, the host's clip), fp32
 * with the NSP head, dropout on, clipping at 1.0 (the first steps clip):
 * - the slot holds 64 masked rows, the real ones first, then label -1 rows
 *   at positions no real row has, each once;
 * - 4 AdamW steps: the gradient norms and the update p4 - p0 held to 1e-5
 *   (not bitwise: the head's GEMMs sum over 64 rows, 53 of them zero, so
 *   their partial sums are cut differently), t counts every step;
 * - an injected inf in the gradients: the step returns -ERANGE (fp32 never
 *   overflows benignly) and leaves parameters, optimizer state and t as
 *   they were, exactly as the host path. */
static void test_graph_lever_eager(void)
{
    printf("--- lever GRAPH: padded masked rows, the step's norm and clip on the device, fp32\n");
    bert_config c;
    optim_config oc;
    bert_model *cpu = clipped_setup(&c, &oc, 1357);
    size_t n = cpu->num_params;
    gpu_model *off = create_graph_lever(0, &c, KDT_F32, &oc, cpu->params_memory);
    gpu_model *on = create_graph_lever(1, &c, KDT_F32, &oc, cpu->params_memory);
    if (!off || !on) {
        gpu_model_destroy(off);
        gpu_model_destroy(on);
        bert_model_destroy(cpu);
        return;
    }
    /* the padded slot */
    char err[256];
    batch_store bs;
    make_batch(&bs, &c, 7);
    int Mp = 64;
    size_t N = (size_t)TB * TT, slot = 2 * N + 3 * TB + 2 * (size_t)Mp;
    int32_t *h = calloc(slot, 4);
    int ok = on->dev_scalars && !off->dev_scalars && gpu_model_upload(on, &bs.b, err, sizeof err) == 0 &&
             on->mpad[on->staged] == Mp && gpu_model_read_staged(on, h, slot) == 0;
    const int32_t *pos = h + 2 * N + TB, *lab = pos + Mp;
    unsigned char *seen = calloc(N, 1);
    for (int i = 0; ok && i < Mp; i++) {
        ok &= pos[i] >= 0 && (size_t)pos[i] < N && !seen[pos[i]]++;
        ok &= i < TM ? pos[i] == bs.pos[i] && lab[i] == bs.labels[i] : lab[i] == -1;
    }
    printf("%-4s %-44s %d rows for M %d\n", ok ? "ok" : "FAIL", "masked rows padded, distinct", Mp, TM);
    gpu_failures += !ok;
    free(seen);
    free(h);
    /* lever on vs off */
    double gn[2][4];
    int rcs[2][4];
    float *p0 = host_copy(cpu->params_memory, n), *pa = malloc(n * 4), *pb = malloc(n * 4);
    run_graph_steps(off, &c, 0, 4, gn[0], rcs[0]);
    run_graph_steps(on, &c, 0, 4, gn[1], rcs[1]);
    double worst = 0;
    int clipped = 0;
    ok = on->t == 4 && off->t == 4;
    for (int s = 0; s < 4; s++) {
        double r = fabs(gn[1][s] - gn[0][s]) / gn[0][s];
        worst = r > worst ? r : worst;
        clipped += gn[0][s] > oc.max_grad_norm;
        ok &= rcs[0][s] == 0 && rcs[1][s] == 0;
    }
    mc_report(ok && worst <= 1e-5, "lever on vs off: gradient norms (4 steps)", KDT_F32, worst, 1e-5);
    if (gpu_model_get_params(off, pa) != 0 || gpu_model_get_params(on, pb) != 0)
        abort();
    for (size_t i = 0; i < n; i++) {
        pa[i] -= p0[i];
        pb[i] -= p0[i];
    }
    double ur = mc_norm2_rel(pb, pa, n);
    mc_report(clipped > 0 && ur <= 1e-5, "lever on vs off: update p4 - p0 (clipped)", KDT_F32, ur, 1e-5);
    /* a non-finite gradient: -ERANGE, nothing changed */
    float *o0 = malloc(2 * n * 4), *o1 = malloc(2 * n * 4);
    make_batch(&bs, &c, 9);
    bert_dropout d = {.train = 1, .seed = 13, .rank = 0, .step = 4};
    gpu_model_upload(on, &bs.b, err, sizeof err);
    gpu_model_zero_grad(on);
    gpu_model_forward(on, &d, 1.0f);
    gpu_model_backward(on);
    TCHECK(cudaStreamSynchronize(on->compute));
    float inf = INFINITY;
    TCHECK(cudaMemcpy(on->grads_memory + n / 2, &inf, sizeof inf, cudaMemcpyHostToDevice));
    TCHECK(cudaDeviceSynchronize());
    if (gpu_model_get_params(on, pa) != 0 || gpu_model_get_opt_state(on, o0) != 0)
        abort();
    int skipped = 0;
    double gnorm = 0;
    int rc = gpu_model_step(on, NULL, &gnorm, &skipped);
    if (gpu_model_get_params(on, pb) != 0 || gpu_model_get_opt_state(on, o1) != 0)
        abort();
    ok = rc == -ERANGE && on->t == 4 && memcmp(pa, pb, n * 4) == 0 && memcmp(o0, o1, 2 * n * 4) == 0;
    printf("%-4s %-44s rc=%d t=%ld\n", ok ? "ok" : "FAIL", "non-finite gradient: -ERANGE, unchanged", rc,
           on->t);
    gpu_failures += !ok;
    free(o0); free(o1); free(p0); free(pa); free(pb);
    gpu_model_destroy(off);
    gpu_model_destroy(on);
    bert_model_destroy(cpu);
}

/* One training step of the graph tests: `micro` micro-batches (dropout on,
 * batch and Philox counters changing), eagerly (gpu_model_forward,
 * _backward, _step) or through gpu_model_train_micro and
 * gpu_model_step_wait. Returns the step's rc, 1 when skipped; *gnorm the
 * norm it reported. */
static int graph_step(gpu_model *g, const bert_config *c, int step, int micro, int replay,
                      double *gnorm)
{
    char err[256];
    int rc = 0, skipped = 0;
    gpu_model_zero_grad(g);
    float scale = gpu_model_loss_scale(g) / (float)micro;
    for (int k = 0; k < micro && rc == 0; k++) {
        batch_store bs;
        make_batch(&bs, c, 80 + step * micro + k);
        bert_dropout d = {.train = 1, .seed = 17, .rank = 0, .step = (uint32_t)step,
                          .micro = (uint32_t)k};
        if ((rc = gpu_model_upload(g, &bs.b, err, sizeof err)) != 0)
            break;
        if (replay) {
            rc = gpu_model_train_micro(g, &d, scale, k == micro - 1);
        } else if ((rc = gpu_model_forward(g, &d, scale)) == 0) {
            rc = gpu_model_backward(g);
        }
        (void)gpu_model_loss(g);
    }
    if (rc == 0)
        rc = replay ? gpu_model_step_wait(g, NULL, gnorm, &skipped)
                    : gpu_model_step(g, NULL, gnorm, &skipped);
    return rc ? rc : skipped;
}

/* Bitwise equality of two models' parameters, optimizer state, t and loss
 * scaler; prints what differs. */
static int same_state(gpu_model *a, gpu_model *b, const char *what)
{
    size_t n = a->num_params;
    float *pa = malloc(n * 4), *pb = malloc(n * 4), *oa = malloc(2 * n * 4), *ob = malloc(2 * n * 4);
    if (gpu_model_get_params(a, pa) || gpu_model_get_params(b, pb) ||
        gpu_model_get_opt_state(a, oa) || gpu_model_get_opt_state(b, ob))
        abort();
    size_t dp = 0, dopt = 0;
    for (size_t i = 0; i < n; i++)
        dp += memcmp(&pa[i], &pb[i], 4) != 0;
    for (size_t i = 0; i < 2 * n; i++)
        dopt += memcmp(&oa[i], &ob[i], 4) != 0;
    int ok = dp == 0 && dopt == 0 && a->t == b->t && a->scaler.scale == b->scaler.scale &&
             a->scaler.skipped == b->scaler.skipped;
    printf("%-4s %-44s %zu params, %zu optimizer floats differ; t %ld/%ld; scale %g/%g\n",
           ok ? "ok" : "FAIL", what, dp, dopt, a->t, b->t, a->scaler.scale, b->scaler.scale);
    free(pa); free(pb); free(oa); free(ob);
    return ok;
}

/* Replayed graphs against the eager launches of the lever, bit for bit:
 * fp32 with the NSP head, clipping at 1.0, 5 steps of 2 micro-batches
 * (the first step of each key runs eagerly, the second captures, the rest
 * replay), and a model resumed after step 2 from the replayed one's state
 * (as a checkpoint holds it) ending at the same bits. Then fp16, 10 steps
 * of 2 micro-batches with the loss scale doubling after every good step
 * from 2^14: the scale changes every step (a new key for the last
 * micro-batch's graph, whose clip reads the scale), reaches an overflow
 * (here at 2^20: the step skipped on the device, the scale halved) and
 * then goes back and forth between two scales (both keys captured, the
 * overflowing one replayed as a skip); the graphs must report the same
 * norms and skip the same steps with the same scales as the eager
 * launches (a key without the scale replays a stale one and fails here). */
static void test_graph_replay(int with_fp16)
{
    printf("--- lever GRAPH: replayed graphs vs the eager launches, bitwise\n");
    bert_config c;
    optim_config oc;
    bert_model *cpu = clipped_setup(&c, &oc, 8642);
    gpu_model *eager = create_graph_lever(1, &c, KDT_F32, &oc, cpu->params_memory);
    gpu_model *graph = create_graph_lever(1, &c, KDT_F32, &oc, cpu->params_memory);
    gpu_model *resumed = create_graph_lever(1, &c, KDT_F32, &oc, cpu->params_memory);
    if (!eager || !graph || !resumed)
        goto out;
    int rcs = 0, gdiff = 0; /* gnorm reported: the same bits too */
    double ga = 0, gb = 0, gr = 0;
    for (int s = 0; s < 5; s++) {
        rcs |= graph_step(eager, &c, s, 2, 0, &ga);
        rcs |= graph_step(graph, &c, s, 2, 1, &gb);
        gdiff += memcmp(&ga, &gb, sizeof ga) != 0;
        if (s == 1) { /* a checkpoint after step 2 */
            size_t n = graph->num_params;
            float *p = malloc(n * 4), *o = malloc(2 * n * 4);
            if (gpu_model_get_params(graph, p) || gpu_model_get_opt_state(graph, o) ||
                gpu_model_set_params(resumed, p) || gpu_model_set_opt_state(resumed, o, graph->t))
                abort();
            free(p);
            free(o);
        }
        if (s >= 2) {
            rcs |= graph_step(resumed, &c, s, 2, 1, &gr);
            gdiff += memcmp(&gr, &gb, sizeof gr) != 0;
        }
    }
    int ok = rcs == 0 && gdiff == 0 && graph->graph_captures == 2 && graph->graph_launches == 8 &&
             !graph->graph_off;
    printf("%-4s %-44s captures %ld, launches %ld, rc %d, %d gnorms differ\n", ok ? "ok" : "FAIL",
           "fp32, 5 steps x 2 micro-batches", graph->graph_captures, graph->graph_launches, rcs,
           gdiff);
    gpu_failures += !ok;
    gpu_failures += !same_state(eager, graph, "replayed = eager (fp32, dropout, clip)");
    gpu_failures += !same_state(graph, resumed, "resumed after step 2 = uninterrupted");
    gpu_model_destroy(eager);
    gpu_model_destroy(graph);
    gpu_model_destroy(resumed);
    eager = graph = resumed = NULL;

    char err[128];
    kdtype f16;
    if (!with_fp16)
        goto out;
    if (gpu_precision_pick("fp16", 0, &f16, err, sizeof err) != 0) {
        printf("skip fp16 graphs: %s\n", err);
        goto out;
    }
    eager = create_graph_lever(1, &c, KDT_F16, &oc, cpu->params_memory);
    graph = create_graph_lever(1, &c, KDT_F16, &oc, cpu->params_memory);
    if (!eager || !graph)
        goto out;
    for (int k = 0; k < 2; k++) {
        gpu_model *g = k ? graph : eager;
        g->scaler.scale = 16384.0f;
        g->scaler.growth_interval = 1;
    }
    int skips = 0, diverged = 0;
    for (int s = 0; s < 10; s++) {
        int a = graph_step(eager, &c, s, 2, 0, &ga), b = graph_step(graph, &c, s, 2, 1, &gb);
        skips += a == 1;
        diverged |= a != b || a < 0 || memcmp(&ga, &gb, sizeof ga) != 0;
    }
    ok = !diverged && skips > 0 && graph->graph_captures >= 2 && graph->graph_launches >= 1;
    printf("%-4s %-44s %d skipped, captures %ld, launches %ld\n", ok ? "ok" : "FAIL",
           "fp16, loss scale changing and overflowing", skips, graph->graph_captures,
           graph->graph_launches);
    gpu_failures += !ok;
    gpu_failures += !same_state(eager, graph, "replayed = eager (fp16, skips)");
out:
    gpu_model_destroy(eager);
    gpu_model_destroy(graph);
    gpu_model_destroy(resumed);
    bert_model_destroy(cpu);
}

#ifdef BERTD_CUDASIM
/* A capture that fails (the stand-in's CUDASIM_CAPTURE_FAIL: at
 * cudaStreamEndCapture, at instantiation, or a kernel launch refused
 * half-way through the capture, which the launchers' checks must not abort
 * on): the model turns its graphs off with one log line naming the cause
 * and trains eagerly, to the same bits as the eager launches of the lever
 * (fp32, dropout, clip, 3 steps of 2 micro-batches: the first micro-batch
 * of step 1 is the first capture). */
static void test_graph_fallback(void)
{
    printf("--- lever GRAPH: a failed capture falls back to eager launches\n");
    static const char *const modes[][2] = {{"end", "(cudaStreamEndCapture: "},
                                           {"instantiate", "(cudaGraphInstantiateWithFlags: "},
                                           {"launch", "(a kernel launch: "}};
    bert_config c;
    optim_config oc;
    bert_model *cpu = clipped_setup(&c, &oc, 8642);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        gpu_model *eager = create_graph_lever(1, &c, KDT_F32, &oc, cpu->params_memory);
        gpu_model *fb = create_graph_lever(1, &c, KDT_F32, &oc, cpu->params_memory);
        if (!eager || !fb)
            abort();
        /* the model's stderr, to count its log lines */
        FILE *log = tmpfile();
        fflush(stderr);
        int saved = dup(2);
        if (!log || saved < 0 || dup2(fileno(log), 2) < 0)
            abort();
        setenv("CUDASIM_CAPTURE_FAIL", modes[m][0], 1);
        int rcs = 0, gdiff = 0;
        double ga = 0, gb = 0;
        for (int s = 0; s < 3; s++) {
            rcs |= graph_step(eager, &c, s, 2, 0, &ga);
            rcs |= graph_step(fb, &c, s, 2, 1, &gb);
            gdiff += memcmp(&ga, &gb, sizeof ga) != 0;
        }
        unsetenv("CUDASIM_CAPTURE_FAIL");
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        rewind(log);
        char line[512];
        int lines = 0, cause = 0, lt_dropped = 0;
        while (fgets(line, sizeof line, log)) {
            if (strstr(line, "gpu_model: ")) { /* the model's one line */
                lines++;
                cause += strstr(line, "gpu_model: capturing the training step failed") &&
                         strstr(line, modes[m][1]);
            }
            /* a GEMM refused by the capture keeps its cuBLASLt plan */
            lt_dropped += strstr(line, "goes to cuBLAS from now on") != NULL;
            fputs(line, stderr);
        }
        fclose(log);
        int ok = rcs == 0 && gdiff == 0 && fb->graph_off && fb->graph_captures == 0 &&
                 fb->graph_launches == 0 && lines == 1 && cause == 1 && lt_dropped == 0;
        char what[64];
        snprintf(what, sizeof what, "CUDASIM_CAPTURE_FAIL=%s", modes[m][0]);
        printf("%-4s %-44s off %d, captures %ld, launches %ld, %d log line(s) (%d naming the cause), "
               "%d cuBLASLt plan(s) dropped, rc %d, %d gnorms differ\n",
               ok ? "ok" : "FAIL", what, fb->graph_off, fb->graph_captures, fb->graph_launches, lines,
               cause, lt_dropped, rcs, gdiff);
        gpu_failures += !ok;
        gpu_failures += !same_state(eager, fb, "fallen back = eager (fp32, dropout, clip)");
        gpu_model_destroy(eager);
        gpu_model_destroy(fb);
    }
    bert_model_destroy(cpu);
}
#endif

int main(void)
{
    kdtype best = mc_start();
    char err[128];
    printf("auto precision: %s\n", kdtype_name(best));
    const char *vp = getenv("BERTD_LEVER_VOCAB_PAD"), *gv = getenv("BERTD_LEVER_GRAPH");
    int vocab_pad_run = vp && (strcmp(vp, "1") == 0 || strcmp(vp, "on") == 0);
    int graph_run = gv && (strcmp(gv, "1") == 0 || strcmp(gv, "on") == 0);
    test_lever_switches();
    if (graph_run) {
        /* the lever's own checks and the parts of the model its kernels
         * change (the loss heads, the embedding backward, the optimizer,
         * fp16 skipping), not the whole test again: CI time */
        /* TEST_GRAPH_ONLY=1 (the suite's sync-mode entry): the fp32
         * replay and resume only; the rest repeats the deferred entry's
         * calls in the same order */
        const char *only = getenv("TEST_GRAPH_ONLY");
        int all = !(only && strcmp(only, "1") == 0);
        if (all)
            test_graph_lever_eager();
        test_graph_replay(all);
#ifdef BERTD_CUDASIM
        test_graph_fallback();
#endif
        if (all) {
            test_forward_backward_steps(KDT_F32, 1);
            if (best == KDT_BF16)
                test_forward_backward_steps(KDT_BF16, 0);
            test_eval(KDT_F32, 0);
            test_loss_scaling();
        }
        printf("%d failure(s)\n", gpu_failures);
        cuda_kernels_shutdown();
        return gpu_failures ? 1 : 0;
    }
    if (vocab_pad_run)
        test_vocab_pad_resume_vs_unpadded();
    test_forward_backward_steps(KDT_F32, 0);
    test_forward_backward_steps(KDT_F32, 1);
    if (best == KDT_BF16) {
        test_forward_backward_steps(KDT_BF16, 0);
        test_forward_backward_steps(KDT_BF16, 1);
    }
    kdtype f16;
    if (gpu_precision_pick("fp16", 0, &f16, err, sizeof err) == 0)
        test_forward_backward_steps(KDT_F16, 0);
    test_eval(KDT_F32, 0);
    test_eval(KDT_F32, 1);
    if (best == KDT_BF16)
        test_eval(KDT_BF16, 0);
    test_loss_scaling();
    test_buckets_final_and_complete(0);
    test_buckets_final_and_complete(1);
    test_bad_batches();
    test_memory_plan();
    test_bf16_refused_below_sm80();
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown(); /* the CPU stand-in reports device memory left behind */
    return gpu_failures ? 1 : 0;
}
