/* test_flash_attention — the fused (flash) attention kernel
 * (kernels/cuda/flash_attention.cu) on a GPU, against the CPU attention op
 * (kernels/cpu/attention.c) and against the unfused CUDA path
 * (kernels/cuda/attention.cu), forward and backward, on fresh random inputs
 * with key padding, in fp32, bf16 (sm_80+) and fp16. Exits 77 without a GPU.
 *
 * Rules as in gpu_check.h: outputs and scratch start as NaN (an element the
 * kernel forgot fails, NaN never passes), normwise relative error, fp32 1e-5,
 * 16-bit 1e-2 forward and 2e-2 backward (P and dS are rounded to 16 bits
 * before their products, as in the unfused path). Each output buffer has a
 * NaN guard after its end that must survive (no write past the end).
 *
 * Also:
 *   - the dropout mask, exactly: with V = one-hot rows (T <= head dim) the
 *     output row i is the dropped probability row, so its zeros must be
 *     exactly the elements philox_stream_u32 drops; with dO = one-hot rows
 *     the same holds for dV (the dK/dV kernel's transposed indexing);
 *   - the logsumexp saved for backward against one computed on the host;
 *   - backward is bitwise deterministic (no atomics);
 *   - the model (worker/gpu_model.c) with fused attention against the same
 *     model forced unfused (BERTD_ATTENTION=unfused) and against the CPU
 *     model: loss and every parameter gradient, and that the fused layout
 *     really is the smaller one.
 * Shapes: T = 13 (odd, unaligned Philox groups, a 1-token row), 70, 128 and
 * 512, head dims 32, 64 and 128, lengths that cut key tiles.
 * The kernels run are those the speed levers of the environment pick
 * (gpu_levers_from_env): BERTD_LEVER_FLASH2=1 checks the second form
 * (flash_attention2.cuh) by all the same rules.
 */
#include "tests/gpu/gpu_check.h"
#include "kernels/kernels.h"
#include "worker/gpu_model.h"
#include "worker/model.h"
#include "worker/optim.h"

#include <stdlib.h>

enum { GUARD = 64 };

static int have_bf16;
/* every supported shape fits the device's opt-in shared memory (96 KiB and
 * up: V100 and later); below that (T4: 64 KiB) 16-bit tiles do not, and the
 * kernel must say so rather than fail at launch */
static int big_smem;

typedef struct shape {
    int B, T, NH, hs;
    int32_t lens[4];
    float p;
} shape;

/* n elements of dt then GUARD more, all NaN */
static void *dev_nan_guarded(size_t n, kdtype dt)
{
    return dev_nan(n + GUARD, dt);
}

/* the GUARD elements after n are still NaN */
static void check_guard(const char *what, const void *d, size_t n, kdtype dt)
{
    float *h = malloc((n + GUARD) * sizeof(float));
    dev_to(h, d, n + GUARD, dt);
    int bad = 0;
    for (size_t i = n; i < n + GUARD; i++)
        bad += !isnan(h[i]);
    printf("%-4s %-44s %-4s guard of %d after %zu elements\n", bad ? "FAIL" : "ok", what,
           kdtype_name(dt), GUARD, n);
    gpu_failures += bad != 0;
    free(h);
}

static int key_len(const int32_t *lens, int b, int T)
{
    int n = lens[b];
    return n < 1 ? 1 : (n > T ? T : n);
}

/* lse (B,NH,T) of scale * q.k over the real keys, in double */
static void host_lse(float *lse, const float *qkv, const int32_t *lens, int B, int T, int C,
                     int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * 3 * C + (size_t)h * hs;
                int len = key_len(lens, b, T);
                double mx = -INFINITY, sum = 0, *s = malloc(len * sizeof(double));
                for (int j = 0; j < len; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                    double d = 0;
                    for (int c = 0; c < hs; c++)
                        d += (double)q[c] * k[c];
                    s[j] = d * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j < len; j++)
                    sum += exp(s[j] - mx);
                lse[((size_t)b * NH + h) * T + i] = (float)(mx + log(sum));
                free(s);
            }
}

static void test_op(kdtype dt, const shape *sh)
{
    int B = sh->B, T = sh->T, NH = sh->NH, C = NH * sh->hs;
    size_t N = (size_t)B * T, nq = N * 3 * C, nc = N * C, nl = (size_t)B * NH * T,
           na = (size_t)B * NH * T * T;
    float p = sh->p;
    philox_stream rs;
    philox_stream_init(&rs, 4242, 1, 31, 1, 3, DROPOUT_SITE_ATTN_PROBS);
    const philox_stream *r = p > 0 ? &rs : NULL;
    char name[96];
    printf("--- flash attention %s B%d T%d NH%d hs%d lens %d,%d p%.1f\n", kdtype_name(dt), B, T,
           NH, sh->hs, sh->lens[0], B > 1 ? sh->lens[1] : -1, p);
    if (!cuda_flash_attention_supported(T, C, NH, dt)) {
        int ok = !big_smem;
        printf("%-4s %-44s %s\n", ok ? "skip" : "FAIL", "not supported on this device",
               ok ? "(shared memory)" : "on a device with 96 KiB or more");
        gpu_failures += !ok;
        return;
    }

    float *qkv = host_rand(nq, 1, 0), *dy = host_rand(nc, 1, 0);
    round_to(qkv, nq, dt);
    round_to(dy, nc, dt);
    float *ref = malloc(nc * 4), *att = malloc(na * 4), *dref = malloc(nq * 4),
          *datt = malloc(na * 4), *lref = malloc(nl * 4), *got = malloc(nq * 4),
          *got2 = malloc(nq * 4);
    attention_forward(ref, att, qkv, sh->lens, r, p, B, T, C, NH);
    attention_backward(dref, datt, dy, qkv, att, sh->lens, r, p, B, T, C, NH);
    host_lse(lref, qkv, sh->lens, B, T, C, NH);

    void *dqkv = dev_from(qkv, nq, dt), *ddy = dev_from(dy, nc, dt);
    int32_t *dlens = dev_ints(sh->lens, B);
    void *dout = dev_nan_guarded(nc, dt), *ddqkv = dev_nan_guarded(nq, dt);
    float *dlse = dev_nan_guarded(nl, KDT_F32), *dscr = dev_nan_guarded(nl, KDT_F32);

    cuda_flash_attention_forward_dt(dout, dlse, dqkv, dlens, r, p, B, T, C, NH, dt, 0);
    TCHECK(cudaDeviceSynchronize());
    dev_to(got, dout, nc, dt);
    snprintf(name, sizeof name, "flash fwd out vs CPU T%d hs%d", T, sh->hs);
    check_close(name, dt, got, ref, nc, tol_for(dt));
    check_guard("flash fwd out", dout, nc, dt);
    dev_to(got, dlse, nl, KDT_F32);
    /* inputs are exact in every dt and S accumulates in fp32: lse is fp32-accurate */
    check_close("flash fwd logsumexp vs host", KDT_F32, got, lref, nl, dt == KDT_F32 ? 1e-5 : 1e-4);
    check_guard("flash fwd lse", dlse, nl, KDT_F32);

    cuda_flash_attention_backward_dt(ddqkv, dscr, ddy, dqkv, dout, dlse, dlens, r, p, B, T, C, NH,
                                     dt, 0);
    TCHECK(cudaDeviceSynchronize());
    dev_to(got, ddqkv, nq, dt);
    double btol = dt == KDT_F32 ? 1e-5 : 2e-2;
    snprintf(name, sizeof name, "flash bwd dqkv vs CPU T%d hs%d", T, sh->hs);
    check_close(name, dt, got, dref, nq, btol);
    check_guard("flash bwd dqkv", ddqkv, nq, dt);
    check_guard("flash bwd scratch", dscr, nl, KDT_F32);

    /* deterministic: the same call again gives the same bits */
    void *ddqkv2 = dev_nan(nq, dt);
    cuda_flash_attention_backward_dt(ddqkv2, dscr, ddy, dqkv, dout, dlse, dlens, r, p, B, T, C,
                                     NH, dt, 0);
    TCHECK(cudaDeviceSynchronize());
    dev_to(got2, ddqkv2, nq, dt);
    size_t diff = 0;
    for (size_t i = 0; i < nq; i++)
        diff += memcmp(&got[i], &got2[i], sizeof(float)) != 0;
    printf("%-4s %-44s %-4s %zu of %zu differ\n", diff ? "FAIL" : "ok",
           "flash bwd bitwise deterministic", kdtype_name(dt), diff, nq);
    gpu_failures += diff != 0;

    /* the unfused CUDA path on the same device inputs */
    void *uout = dev_nan(nc, dt), *uqkvr = dev_nan(nq, dt), *uatt = dev_nan(na, dt),
         *uscr = dev_nan(na + nc, dt), *udqkv = dev_nan(nq, dt), *udqkvr = dev_nan(nq, dt),
         *udatt = dev_nan(na, dt);
    cuda_attention_forward_dt(uout, uqkvr, uatt, uscr, dqkv, dlens, r, p, B, T, C, NH, dt, 0);
    cuda_attention_backward_dt(udqkv, udqkvr, udatt, uscr, ddy, uqkvr, uatt, dlens, r, p, B, T, C,
                               NH, dt, 0);
    TCHECK(cudaDeviceSynchronize());
    float *uref = malloc(nq * 4);
    dev_to(uref, uout, nc, dt);
    dev_to(got, dout, nc, dt);
    snprintf(name, sizeof name, "flash fwd out vs unfused T%d hs%d", T, sh->hs);
    check_close(name, dt, got, uref, nc, tol_for(dt));
    dev_to(uref, udqkv, nq, dt);
    dev_to(got, ddqkv, nq, dt);
    snprintf(name, sizeof name, "flash bwd dqkv vs unfused T%d hs%d", T, sh->hs);
    check_close(name, dt, got, uref, nq, btol);

    free(qkv); free(dy); free(ref); free(att); free(dref); free(datt); free(lref); free(got);
    free(got2); free(uref);
    cudaFree(dqkv); cudaFree(ddy); cudaFree(dlens); cudaFree(dout); cudaFree(ddqkv);
    cudaFree(dlse); cudaFree(dscr); cudaFree(ddqkv2); cudaFree(uout); cudaFree(uqkvr);
    cudaFree(uatt); cudaFree(uscr); cudaFree(udqkv); cudaFree(udqkvr); cudaFree(udatt);
}

/* The dropout mask, exactly. V = one-hot rows (V_j = e_j, T <= hs) makes
 * out_i = the dropped probabilities of row i; dO = one-hot rows makes
 * dV_j[c] = Pd_cj. Their zeros must be the elements the CPU's Philox drops. */
static void test_mask(kdtype dt, int T, int len1)
{
    int B = 2, NH = 2, hs = 32, C = NH * hs;
    size_t N = (size_t)B * T, nq = N * 3 * C, nc = N * C, nl = (size_t)B * NH * T;
    int32_t lens[2] = {T, len1};
    float p = 0.5f;
    if (!cuda_flash_attention_supported(T, C, NH, dt)) {
        printf("%-4s mask T%d %s: not supported on this device\n", big_smem ? "FAIL" : "skip", T,
               kdtype_name(dt));
        gpu_failures += big_smem;
        return;
    }
    philox_stream rs;
    philox_stream_init(&rs, 77, 2, 5, 0, 1, DROPOUT_SITE_ATTN_PROBS);
    uint32_t thresh = dropout_threshold(p);
    float *qkv = host_rand(nq, 1, 0), *dy = calloc(nc, 4), *h = malloc(nq * 4);
    for (size_t t = 0; t < N; t++)
        for (int hh = 0; hh < NH; hh++)
            for (int c = 0; c < hs; c++) {
                int i = (int)(t % T);
                qkv[t * 3 * C + 2 * C + (size_t)hh * hs + c] = c == i ? 1.0f : 0.0f;
                dy[t * C + (size_t)hh * hs + c] = c == i ? 1.0f : 0.0f;
            }
    round_to(qkv, nq, dt);
    void *dqkv = dev_from(qkv, nq, dt), *ddy = dev_from(dy, nc, dt), *dout = dev_nan(nc, dt),
         *ddqkv = dev_nan(nq, dt);
    float *dlse = dev_nan(nl, KDT_F32), *dscr = dev_nan(nl, KDT_F32);
    int32_t *dlens = dev_ints(lens, B);
    cuda_flash_attention_forward_dt(dout, dlse, dqkv, dlens, &rs, p, B, T, C, NH, dt, 0);
    cuda_flash_attention_backward_dt(ddqkv, dscr, ddy, dqkv, dout, dlse, dlens, &rs, p, B, T, C,
                                     NH, dt, 0);
    TCHECK(cudaDeviceSynchronize());
    size_t fwd_bad = 0, bwd_bad = 0, dropped = 0, total = 0;
    dev_to(h, dout, nc, dt);
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < NH; hh++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    float v = h[((size_t)b * T + i) * C + (size_t)hh * hs + j];
                    uint64_t idx = (((uint64_t)b * NH + hh) * T + i) * T + j;
                    int keep = philox_stream_u32(&rs, idx) >= thresh;
                    int len = key_len(lens, b, T);
                    int want_zero = j >= len || !keep;
                    fwd_bad += !isfinite(v) || (v == 0.0f) != want_zero;
                    dropped += j < len && !keep;
                    total += j < len;
                }
    dev_to(h, ddqkv, nq, dt);
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < NH; hh++)
            for (int j = 0; j < T; j++)
                for (int i = 0; i < T; i++) { // dV_j[i] = Pd_ij
                    float v = h[((size_t)b * T + j) * 3 * C + 2 * C + (size_t)hh * hs + i];
                    uint64_t idx = (((uint64_t)b * NH + hh) * T + i) * T + j;
                    int keep = philox_stream_u32(&rs, idx) >= thresh;
                    int want_zero = j >= key_len(lens, b, T) || !keep;
                    bwd_bad += !isfinite(v) || (v == 0.0f) != want_zero;
                }
    int ok = fwd_bad == 0 && bwd_bad == 0 && dropped > total / 4 && dropped < 3 * total / 4;
    char name[80];
    snprintf(name, sizeof name, "flash dropout mask = CPU's, T%d len %d", T, len1);
    printf("%-4s %-44s %-4s dropped %zu of %zu; mismatches fwd %zu, dV %zu\n", ok ? "ok" : "FAIL",
           name, kdtype_name(dt), dropped, total, fwd_bad, bwd_bad);
    gpu_failures += !ok;
    free(qkv); free(dy); free(h);
    cudaFree(dqkv); cudaFree(ddy); cudaFree(dout); cudaFree(ddqkv); cudaFree(dlse);
    cudaFree(dscr); cudaFree(dlens);
}

/* ---- the model: fused vs BERTD_ATTENTION=unfused vs the CPU model ---- */
enum { MB = 3, MT = 24, MM = 11 };

/* loss and fp32 gradients (n) of one forward/backward with dropout; 0 or -1 */
static int model_run(const bert_config *c, kdtype dt, const float *params, const bert_batch *b,
                     const bert_dropout *d, float *loss, float *grads, size_t n)
{
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    gpu_model *g = NULL;
    char err[256];
    if (gpu_model_create(&g, c, dt, 0, MB, MT, MM, &oc, err, sizeof err) != 0) {
        printf("FAIL gpu_model_create %s: %s\n", kdtype_name(dt), err);
        gpu_failures++;
        return -1;
    }
    if (gpu_model_set_params(g, params) != 0 || gpu_model_upload(g, b, err, sizeof err) != 0)
        abort();
    float scale = dt == KDT_F16 ? 1024.0f : 1.0f; // no fp16 overflow at this size
    gpu_model_zero_grad(g);
    gpu_model_forward(g, d, scale);
    *loss = gpu_model_loss(g);
    gpu_model_backward(g);
    if (gpu_model_get_grads(g, grads) != 0)
        abort();
    for (size_t i = 0; i < n; i++)
        grads[i] /= scale;
    gpu_model_destroy(g);
    return 0;
}

static void test_model(kdtype dt)
{
    printf("--- model with fused attention vs unfused vs CPU, %s\n", kdtype_name(dt));
    bert_config c = gpu_test_config(2, 0); /* head dim 32: the fused kernel's smallest */
    int32_t ids[MB * MT], types[MB * MT], lens[MB] = {MT, MT - 7, 9}, pos[MM], labels[MM];
    for (int i = 0; i < MB * MT; i++) {
        ids[i] = (int32_t)((i * 37 + 5) % c.vocab_size);
        types[i] = (i % MT) >= MT / 2;
    }
    for (int m = 0; m < MM; m++) {
        int b = m % MB;
        pos[m] = b * MT + (m * 5) % lens[b]; // distinct: m differs in b or in 5m mod len
        labels[m] = (int32_t)((m * 131 + 1) % c.vocab_size);
    }
    bert_batch bt = {.B = MB, .T = MT, .M = MM, .input_ids = ids, .token_type_ids = types,
                     .seq_lens = lens, .mlm_positions = pos, .mlm_labels = labels};
    bert_dropout d = {.train = 1, .seed = 99, .rank = 0, .step = 3, .micro = 0};

    const char *saved = getenv("BERTD_ATTENTION");
    char *saved_copy = saved ? strdup(saved) : NULL;
    unsetenv("BERTD_ATTENTION");
    size_t fused_bytes = gpu_model_act_bytes(&c, dt, MB, MT, MM);
    setenv("BERTD_ATTENTION", "unfused", 1);
    size_t unfused_bytes = gpu_model_act_bytes(&c, dt, MB, MT, MM);
    /* where the device cannot run the kernel the model falls back to the
     * unfused path by itself: the same plan */
    int fused = cuda_flash_attention_supported(MT, c.hidden_size, c.num_attention_heads, dt);
    int ok = fused ? fused_bytes < unfused_bytes : fused_bytes == unfused_bytes;
    printf("%-4s %-44s %-4s %zu %s %zu bytes\n", ok ? "ok" : "FAIL",
           fused ? "fused activation plan is the smaller one"
                 : "unsupported here: the model falls back (same plan)",
           kdtype_name(dt), fused_bytes, fused ? "<" : "==", unfused_bytes);
    gpu_failures += !ok;

    bert_model *cpu = NULL;
    if (bert_model_create(&cpu, &c) != 0)
        abort();
    bert_model_init_weights(cpu, 4321);
    size_t n = cpu->num_params;
    if (bert_model_forward(cpu, &bt, &d) != 0)
        abort();
    bert_model_zero_grad(cpu);
    bert_model_backward(cpu, 1.0f);

    float lu = NAN, lf = NAN, *gu = malloc(n * 4), *gf = malloc(n * 4);
    int ru = model_run(&c, dt, cpu->params_memory, &bt, &d, &lu, gu, n); // unfused (env set)
    unsetenv("BERTD_ATTENTION");
    int rf = model_run(&c, dt, cpu->params_memory, &bt, &d, &lf, gf, n); // fused
    if (saved_copy)
        setenv("BERTD_ATTENTION", saved_copy, 1);
    free(saved_copy);
    if (ru == 0 && rf == 0) {
        double ltol = 1e-2, gtol = 5e-2; // test_model_cuda's 16-bit whole-model rule
        double e1 = fabs((double)lf - cpu->loss) / fabs((double)cpu->loss),
               e2 = fabs((double)lf - lu) / fabs((double)lu);
        int ok1 = isfinite(lf) && e1 <= ltol, ok2 = isfinite(lf) && e2 <= ltol;
        printf("%-4s %-44s %-4s rel=%.3g (tol %.0e)\n", ok1 ? "ok" : "FAIL",
               "model loss fused vs CPU", kdtype_name(dt), e1, ltol);
        printf("%-4s %-44s %-4s rel=%.3g (tol %.0e)\n", ok2 ? "ok" : "FAIL",
               "model loss fused vs unfused", kdtype_name(dt), e2, ltol);
        gpu_failures += !ok1 + !ok2;
        size_t off = 0;
        for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
            size_t sz = cpu->param_sizes[i];
            if (sz) {
                char name[80];
                snprintf(name, sizeof name, "model grad %s fused vs CPU", bert_param_name(i));
                check_close(name, dt, gf + off, cpu->grads_memory + off, sz, gtol);
                snprintf(name, sizeof name, "model grad %s fused vs unfused", bert_param_name(i));
                check_close(name, dt, gf + off, gu + off, sz, gtol);
            }
            off += sz;
        }
    }
    free(gu);
    free(gf);
    bert_model_destroy(cpu);
}

int main(void)
{
    gpu_require_device();
    if (cuda_kernels_init() != 0)
        return 1;
    struct cudaDeviceProp prop;
    TCHECK(cudaGetDeviceProperties(&prop, 0));
    have_bf16 = prop.major >= 8;
    big_smem = prop.sharedMemPerBlockOptin >= 96 * 1024;
    printf("opt-in shared memory per block: %zu bytes\n", (size_t)prop.sharedMemPerBlockOptin);
    /* the speed levers as the model takes them: BERTD_LEVER_FLASH2=1 runs
     * every check below on the second form of the kernels */
    unsigned levers = 0;
    char lerr[160];
    if (gpu_levers_from_env(&levers, lerr, sizeof lerr) != 0) {
        fprintf(stderr, "%s\n", lerr);
        return 1;
    }
    cuda_levers_set(levers);
    printf("flash attention kernels: %s\n",
           levers & CUDA_LEVER_FLASH2 ? "second form (BERTD_LEVER_FLASH2 on)" : "first form");

    /* what the model may route to the kernel: on a 64 KiB part the 16-bit
     * head-dim-64 tiles (71,680 bytes forward) must be refused */
    int sup = (big_smem ? cuda_flash_attention_supported(512, 768, 12, KDT_F16) &&
                              cuda_flash_attention_supported(128, 128, 4, KDT_F16) &&
                              cuda_flash_attention_supported(13, 1024, 8, KDT_F32)
                        : !cuda_flash_attention_supported(512, 768, 12, KDT_F16)) &&
              !cuda_flash_attention_supported(513, 768, 12, KDT_BF16) &&
              !cuda_flash_attention_supported(128, 64, 4, KDT_BF16) && // head dim 16
              !cuda_flash_attention_supported(128, 100, 3, KDT_BF16) &&
              !cuda_flash_attention_supported(0, 768, 12, KDT_BF16);
    printf("%-4s %-44s\n", sup ? "ok" : "FAIL", "cuda_flash_attention_supported table");
    gpu_failures += !sup;
    /* bf16 only from sm_80: below it the bf16 instantiation would trap and
     * take the context with it, so the model must never be routed there */
    int bf = cuda_flash_attention_supported(128, 768, 12, KDT_BF16);
    int bf_ok = have_bf16 ? (big_smem ? bf : 1) : !bf;
    printf("%-4s %-44s (sm_%d%d: %s)\n", bf_ok ? "ok" : "FAIL", "bf16 supported exactly from sm_80",
           prop.major, prop.minor, bf ? "yes" : "no");
    gpu_failures += !bf_ok;

    const shape shapes[] = {
        {3, 13, 2, 32, {13, 8, 1}, 0.1f},   // odd T, a 1-key row, unaligned Philox
        {3, 13, 2, 64, {13, 8, 1}, 0.0f},   // no dropout
        {2, 70, 2, 64, {70, 33}, 0.1f},     // T % 4 != 0, masked key blocks
        {2, 77, 1, 128, {77, 5}, 0.1f},     // odd T, head dim 128
        {2, 128, 4, 64, {128, 77}, 0.1f},   // BERT-base-like T
        {2, 128, 2, 128, {101, 128}, 0.0f}, // head dim 128
        {2, 128, 3, 32, {128, 64}, 0.1f},   // head dim 32, tile-aligned length
        {2, 512, 2, 64, {512, 389}, 0.1f},  // longest T
        {1, 512, 1, 128, {451}, 0.1f},
        {1, 512, 2, 32, {300}, 0.1f},
    };
    kdtype dts[3] = {KDT_F32, KDT_BF16, KDT_F16};
    for (int k = 0; k < 3; k++) {
        kdtype dt = dts[k];
        if (dt == KDT_BF16 && !have_bf16) {
            printf("skip bf16: sm_%d%d has no bf16 tensor cores\n", prop.major, prop.minor);
            continue;
        }
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            test_op(dt, &shapes[s]);
        test_mask(dt, 13, 9);
        test_mask(dt, 24, 24);
        test_mask(dt, 31, 17);
    }
    if (have_bf16)
        test_model(KDT_BF16);
    test_model(KDT_F16);
    TCHECK(cudaDeviceSynchronize());
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown(); /* the CPU stand-in reports device memory left behind */
    return gpu_failures ? 1 : 0;
}
