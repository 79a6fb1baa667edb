/* test_kernels_cuda — every CUDA op against its CPU reference (kernels/cpu,
 * worker/optim.c) on fresh random inputs, in fp32, bf16 and fp16, with
 * NaN-poisoned outputs and the tolerance rule of gpu_check.h (fp32 1e-5,
 * 16-bit 1e-2, normwise relative). Dropout masks must match the CPU's
 * exactly (Philox bit-identity). Exits 77 without a GPU.
 *
 * Shapes are small and deliberately not multiples of 4, 8 or 32 (T = 13,
 * V = 1001) so tails, unaligned packs and partial warps are exercised, plus
 * one BERT-base-sized GEMM and LayerNorm so multi-block paths run too.
 *
 * The forms that read per-step values from device memory (for CUDA graph
 * replay: philox_stream.dev_ctr, the _dev loss, embedding and optimizer
 * launchers, cuda_opt_clip) are checked bit for bit against the by-value
 * forms, and each with a changed device value to show it is really read.
 */
#include <errno.h>

#include "tests/gpu/gpu_check.h"
#include "kernels/kernels.h"
#include "worker/optim.h"

static const float P_DROP = 0.1f;

static void test_philox(void)
{
    philox_stream s;
    philox_stream_init(&s, 0x123456789ABCDEFull, 3, 77, 2, 11, DROPOUT_SITE_ATTN_PROBS);
    size_t n = 100003;
    uint32_t *d = dev_alloc(n * sizeof(uint32_t)), *h = malloc(n * sizeof(uint32_t));
    cuda_philox_u32(d, &s, n, 0);
    TCHECK(cudaMemcpy(h, d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += h[i] != philox_stream_u32(&s, i);
    printf("%-4s %-44s      n=%zu mismatches=%zu\n", diff ? "FAIL" : "ok", "philox u32 bit-identical",
           n, diff);
    gpu_failures += diff != 0;
    free(h);
    TCHECK(cudaFree(d));
}

static void test_embeddings(kdtype dt)
{
    int B = 3, T = 13, C = 40, V = 57, P = 20;
    size_t N = (size_t)B * T;
    int32_t ids[3 * 13], tt[3 * 13];
    for (size_t i = 0; i < N; i++) {
        ids[i] = (int32_t)((i * 7) % V);
        tt[i] = (int32_t)(i % 2);
    }
    ids[5] = ids[6] = ids[20]; // repeated ids accumulate
    float *wte = host_rand((size_t)V * C, 1, 0), *wpe = host_rand((size_t)P * C, 1, 0),
          *wtt = host_rand(2 * (size_t)C, 1, 0), *ref = malloc(N * C * sizeof(float)),
          *got = malloc(N * C * sizeof(float));
    embeddings_forward(ref, ids, tt, wte, wpe, wtt, B, T, C);
    round_to(ref, N * C, dt); // the GPU sums in fp32 and rounds once
    void *dout = dev_nan(N * C, dt);
    float *dwte = dev_from(wte, (size_t)V * C, KDT_F32), *dwpe = dev_from(wpe, (size_t)P * C, KDT_F32),
          *dwtt = dev_from(wtt, 2 * (size_t)C, KDT_F32);
    int32_t *dids = dev_ints(ids, N), *dtt = dev_ints(tt, N);
    cuda_embeddings_forward_dt(dout, dids, dtt, dwte, dwpe, dwtt, B, T, C, dt, 0);
    dev_to(got, dout, N * C, dt);
    check_close("embeddings_forward", dt, got, ref, N * C, tol_for(dt));

    float *g = host_rand(N * C, 1, 0);
    round_to(g, N * C, dt);
    void *dg = dev_from(g, N * C, dt);
    /* parameter grads accumulate: start from random values on both sides */
    float *gwte = host_rand((size_t)V * C, 1, 0), *gwpe = host_rand((size_t)P * C, 1, 0),
          *gwtt = host_rand(2 * (size_t)C, 1, 0);
    float *dgwte = dev_from(gwte, (size_t)V * C, KDT_F32), *dgwpe = dev_from(gwpe, (size_t)P * C, KDT_F32),
          *dgwtt = dev_from(gwtt, 2 * (size_t)C, KDT_F32);
    embeddings_backward(gwte, gwpe, gwtt, g, ids, tt, B, T, C);
    cuda_embeddings_backward_dt(dgwte, dgwpe, dgwtt, dg, dids, dtt, B, T, C, dt, 0);
    float *h = malloc((size_t)V * C * sizeof(float));
    dev_to(h, dgwte, (size_t)V * C, KDT_F32);
    check_close("embeddings_backward dwte", dt, h, gwte, (size_t)V * C, tol_for(KDT_F32));
    dev_to(h, dgwpe, (size_t)P * C, KDT_F32);
    check_close("embeddings_backward dwpe", dt, h, gwpe, (size_t)P * C, tol_for(KDT_F32));
    dev_to(h, dgwtt, 2 * (size_t)C, KDT_F32);
    check_close("embeddings_backward dwtt", dt, h, gwtt, 2 * (size_t)C, tol_for(KDT_F32));
    free(h); free(g); free(gwte); free(gwpe); free(gwtt); free(wte); free(wpe); free(wtt);
    free(ref); free(got);
    cudaFree(dout); cudaFree(dwte); cudaFree(dwpe); cudaFree(dwtt); cudaFree(dids); cudaFree(dtt);
    cudaFree(dg); cudaFree(dgwte); cudaFree(dgwpe); cudaFree(dgwtt);
}

static void test_layernorm(kdtype dt, int N, int C)
{
    size_t n = (size_t)N * C;
    float *x = host_rand(n, 2, 0.5f), *w = host_rand(C, 0.5f, 1), *b = host_rand(C, 0.5f, 0);
    round_to(x, n, dt);
    float *ref = malloc(n * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4), *got = malloc(n * 4);
    layernorm_forward(ref, mean, rstd, x, w, b, N, C, 1e-12f);
    void *dx = dev_from(x, n, dt), *dout = dev_nan(n, dt);
    float *dw = dev_from(w, C, KDT_F32), *db = dev_from(b, C, KDT_F32);
    float *dmean = dev_nan(N, KDT_F32), *drstd = dev_nan(N, KDT_F32);
    cuda_layernorm_forward_dt(dout, dmean, drstd, dx, dw, db, N, C, 1e-12f, dt, 0);
    char name[64];
    snprintf(name, sizeof name, "layernorm_forward %dx%d", N, C);
    dev_to(got, dout, n, dt);
    check_close(name, dt, got, ref, n, tol_for(dt));
    float *gm = malloc(N * 4);
    dev_to(gm, drstd, N, KDT_F32);
    check_close("layernorm_forward rstd", dt, gm, rstd, N, tol_for(dt));

    float *dy = host_rand(n, 1, 0);
    round_to(dy, n, dt);
    float *gw = host_rand(C, 1, 0), *gb = host_rand(C, 1, 0), *dref = malloc(n * 4);
    float *dgw = dev_from(gw, C, KDT_F32), *dgb = dev_from(gb, C, KDT_F32);
    void *ddy = dev_from(dy, n, dt), *ddx = dev_nan(n, dt);
    /* backward uses each side's own statistics */
    layernorm_backward(dref, gw, gb, dy, x, w, mean, rstd, N, C);
    cuda_layernorm_backward_dt(ddx, dgw, dgb, ddy, dx, dw, dmean, drstd, N, C, dt, 0);
    dev_to(got, ddx, n, dt);
    snprintf(name, sizeof name, "layernorm_backward dinp %dx%d", N, C);
    check_close(name, dt, got, dref, n, tol_for(dt));
    float *hw = malloc(C * 4);
    dev_to(hw, dgw, C, KDT_F32);
    check_close("layernorm_backward dweight", dt, hw, gw, C, tol_for(dt));
    dev_to(hw, dgb, C, KDT_F32);
    check_close("layernorm_backward dbias", dt, hw, gb, C, tol_for(dt));
    free(x); free(w); free(b); free(ref); free(mean); free(rstd); free(got); free(gm); free(dy);
    free(gw); free(gb); free(dref); free(hw);
    cudaFree(dx); cudaFree(dout); cudaFree(dw); cudaFree(db); cudaFree(dmean); cudaFree(drstd);
    cudaFree(dgw); cudaFree(dgb); cudaFree(ddy); cudaFree(ddx);
}

static void test_matmul(kdtype dt, int N, int C, int OC)
{
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *x = host_rand(ni, 1, 0), *w = host_rand(nw, 0.1f, 0), *b = host_rand(OC, 1, 0);
    round_to(x, ni, dt);
    round_to(w, nw, dt);
    float *ref = malloc(no * 4), *got = malloc(no * 4);
    matmul_forward(ref, x, w, b, N, C, OC);
    void *dx = dev_from(x, ni, dt), *dw = dev_from(w, nw, dt), *dout = dev_nan(no, dt);
    float *db = dev_from(b, OC, KDT_F32);
    cuda_matmul_forward_dt(dout, dx, dw, db, N, C, OC, dt, 0);
    dev_to(got, dout, no, dt);
    char name[64];
    snprintf(name, sizeof name, "matmul_forward %dx%dx%d", N, C, OC);
    check_close(name, dt, got, ref, no, tol_for(dt));

    float *dy = host_rand(no, 1, 0);
    round_to(dy, no, dt);
    float *gw = host_rand(nw, 1, 0), *gb = host_rand(OC, 1, 0), *dref = malloc(ni * 4),
          *dgot = malloc(ni * 4), *hw = malloc(nw * 4);
    float *dgw = dev_from(gw, nw, KDT_F32), *dgb = dev_from(gb, OC, KDT_F32);
    void *ddy = dev_from(dy, no, dt), *ddx = dev_nan(ni, dt);
    matmul_backward(dref, gw, gb, dy, x, w, N, C, OC);
    cuda_matmul_backward_dt(ddx, dgw, dgb, ddy, dx, dw, N, C, OC, dt, 0);
    dev_to(dgot, ddx, ni, dt);
    snprintf(name, sizeof name, "matmul_backward dinp %dx%dx%d", N, C, OC);
    check_close(name, dt, dgot, dref, ni, tol_for(dt));
    dev_to(hw, dgw, nw, KDT_F32);
    check_close("matmul_backward dweight (+=)", dt, hw, gw, nw, tol_for(dt));
    dev_to(hw, dgb, OC, KDT_F32);
    check_close("matmul_backward dbias (+=)", dt, hw, gb, OC, tol_for(dt));
    free(x); free(w); free(b); free(ref); free(got); free(dy); free(gw); free(gb); free(dref);
    free(dgot); free(hw);
    cudaFree(dx); cudaFree(dw); cudaFree(dout); cudaFree(db); cudaFree(dgw); cudaFree(dgb);
    cudaFree(ddy); cudaFree(ddx);
}

static void test_attention(kdtype dt, int B, int T, int C, int NH, float p)
{
    size_t N = (size_t)B * T, nq = N * 3 * C, na = (size_t)B * NH * T * T, nc = N * C;
    int32_t lens[4] = {T, T - 5 > 0 ? T - 5 : 1, 1, T};
    philox_stream rs;
    philox_stream_init(&rs, 42, 0, 9, 0, 2, DROPOUT_SITE_ATTN_PROBS);
    const philox_stream *r = p > 0 ? &rs : NULL;
    float *qkv = host_rand(nq, 1, 0); // scores are stored in dt before the softmax: keep them O(1)
    round_to(qkv, nq, dt);
    float *out = malloc(nc * 4), *att = malloc(na * 4), *got = malloc(na * 4);
    attention_forward(out, att, qkv, lens, r, p, B, T, C, NH);
    void *dqkv = dev_from(qkv, nq, dt), *dout = dev_nan(nc, dt), *datt = dev_nan(na, dt),
         *dqkvr = dev_nan(nq, dt), *scratch = dev_nan(na + nc, dt);
    int32_t *dlens = dev_ints(lens, B);
    cuda_attention_forward_dt(dout, dqkvr, datt, scratch, dqkv, dlens, r, p, B, T, C, NH, dt, 0);
    char name[80];
    snprintf(name, sizeof name, "attention_forward B%d T%d C%d NH%d p%.1f", B, T, C, NH, p);
    dev_to(got, dout, nc, dt);
    check_close(name, dt, got, out, nc, tol_for(dt));
    dev_to(got, datt, na, dt);
    check_close("attention_forward probs", dt, got, att, na, tol_for(dt));

    float *dy = host_rand(nc, 1, 0);
    round_to(dy, nc, dt);
    float *dref = malloc(nq * 4), *dattc = malloc(na * 4), *dgot = malloc(nq * 4);
    attention_backward(dref, dattc, dy, qkv, att, lens, r, p, B, T, C, NH);
    void *ddy = dev_from(dy, nc, dt), *ddqkv = dev_nan(nq, dt), *ddqkvr = dev_nan(nq, dt),
         *ddatt = dev_nan(na, dt);
    cuda_attention_backward_dt(ddqkv, ddqkvr, ddatt, scratch, ddy, dqkvr, datt, dlens, r, p, B, T,
                               C, NH, dt, 0);
    dev_to(dgot, ddqkv, nq, dt);
    snprintf(name, sizeof name, "attention_backward dqkv B%d T%d p%.1f", B, T, p);
    /* 16-bit: probabilities, their gradient and dS are all stored rounded */
    check_close(name, dt, dgot, dref, nq, dt == KDT_F32 ? 1e-5 : 2e-2);
    free(qkv); free(out); free(att); free(got); free(dy); free(dref); free(dattc); free(dgot);
    cudaFree(dqkv); cudaFree(dout); cudaFree(datt); cudaFree(dqkvr); cudaFree(scratch);
    cudaFree(dlens); cudaFree(ddy); cudaFree(ddqkv); cudaFree(ddqkvr); cudaFree(ddatt);
}

static void test_pointwise(kdtype dt)
{
    size_t n = 10007;
    float *x = host_rand(n, 3, 0), *y = host_rand(n, 1, 0), *d = host_rand(n, 1, 0);
    round_to(x, n, dt);
    round_to(y, n, dt);
    round_to(d, n, dt);
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    void *dx = dev_from(x, n, dt), *dy = dev_from(y, n, dt), *dd = dev_from(d, n, dt);
    void *o = dev_nan(n, dt);

    gelu_forward(ref, x, n);
    cuda_gelu_forward_dt(o, dx, n, dt, 0);
    dev_to(got, o, n, dt);
    check_close("gelu_forward", dt, got, ref, n, tol_for(dt));
    gelu_backward(ref, x, d, n);
    cuda_fill_nan(o, dt, n, 0);
    cuda_gelu_backward_dt(o, dx, dd, n, dt, 0);
    dev_to(got, o, n, dt);
    check_close("gelu_backward", dt, got, ref, n, tol_for(dt));
    gelu_tanh_forward(ref, x, n);
    cuda_fill_nan(o, dt, n, 0);
    cuda_gelu_tanh_forward_dt(o, dx, n, dt, 0);
    dev_to(got, o, n, dt);
    check_close("gelu_tanh_forward", dt, got, ref, n, tol_for(dt));
    gelu_tanh_backward(ref, x, d, n);
    cuda_fill_nan(o, dt, n, 0);
    cuda_gelu_tanh_backward_dt(o, dx, dd, n, dt, 0);
    dev_to(got, o, n, dt);
    check_close("gelu_tanh_backward", dt, got, ref, n, tol_for(dt));
    tanh_forward(ref, x, n);
    cuda_fill_nan(o, dt, n, 0);
    cuda_tanh_forward_dt(o, dx, n, dt, 0);
    dev_to(got, o, n, dt);
    check_close("tanh_forward", dt, got, ref, n, tol_for(dt));
    tanh_backward(ref, y, d, n);
    cuda_fill_nan(o, dt, n, 0);
    cuda_tanh_backward_dt(o, dy, dd, n, dt, 0);
    dev_to(got, o, n, dt);
    check_close("tanh_backward", dt, got, ref, n, tol_for(dt));
    residual_forward(ref, x, y, n);
    cuda_fill_nan(o, dt, n, 0);
    cuda_residual_forward_dt(o, dx, dy, n, dt, 0);
    dev_to(got, o, n, dt);
    check_close("residual_forward", dt, got, ref, n, tol_for(dt));

    philox_stream s;
    philox_stream_init(&s, 7, 1, 5, 0, 3, DROPOUT_SITE_FFN_OUT);
    dropout_forward(ref, x, &s, P_DROP, n);
    cuda_fill_nan(o, dt, n, 0);
    cuda_dropout_forward_dt(o, dx, &s, P_DROP, n, dt, 0);
    dev_to(got, o, n, dt);
    size_t zdiff = 0, zeros = 0;
    for (size_t i = 0; i < n; i++) {
        zdiff += (ref[i] == 0.0f) != (got[i] == 0.0f);
        zeros += ref[i] == 0.0f;
    }
    printf("%-4s %-44s %-4s dropped %zu of %zu, mask mismatches %zu\n",
           zdiff || !zeros ? "FAIL" : "ok", "dropout mask identical to CPU", kdtype_name(dt), zeros,
           n, zdiff);
    gpu_failures += zdiff != 0 || zeros == 0;
    check_close("dropout_forward", dt, got, ref, n, tol_for(dt));
    if (dt == KDT_F32) {
        cuda_fill_nan(o, dt, n, 0);
        cuda_dropout_backward(o, dd, &s, P_DROP, n, 0);
        dropout_backward(ref, d, &s, P_DROP, n);
        dev_to(got, o, n, dt);
        check_close("dropout_backward", dt, got, ref, n, tol_for(dt));
    }
    free(x); free(y); free(d); free(ref); free(got);
    cudaFree(dx); cudaFree(dy); cudaFree(dd); cudaFree(o);
}

static void test_bias_gelu(kdtype dt)
{
    int N = 37, OC = 131;
    size_t n = (size_t)N * OC;
    float *pre = host_rand(n, 2, 0), *b = host_rand(OC, 1, 0), *ref = malloc(n * 4),
          *refg = malloc(n * 4), *got = malloc(n * 4);
    round_to(pre, n, dt);
    for (size_t i = 0; i < n; i++)
        ref[i] = pre[i] + b[i % OC];
    round_to(ref, n, dt);
    gelu_forward(refg, ref, n);
    void *dpre = dev_from(pre, n, dt), *dact = dev_nan(n, dt);
    float *db = dev_from(b, OC, KDT_F32);
    cuda_bias_gelu_forward_dt(dact, dpre, db, N, OC, dt, 0);
    dev_to(got, dpre, n, dt);
    check_close("bias_gelu_forward pre", dt, got, ref, n, tol_for(dt));
    dev_to(got, dact, n, dt);
    check_close("bias_gelu_forward act", dt, got, refg, n, tol_for(dt));
    /* the tanh form (hidden_act "gelu_new") */
    gelu_tanh_forward(refg, ref, n);
    cudaFree(dpre);
    dpre = dev_from(pre, n, dt);
    cuda_fill_nan(dact, dt, n, 0);
    cuda_bias_gelu_tanh_forward_dt(dact, dpre, db, N, OC, dt, 0);
    dev_to(got, dpre, n, dt);
    check_close("bias_gelu_tanh_forward pre", dt, got, ref, n, tol_for(dt));
    dev_to(got, dact, n, dt);
    check_close("bias_gelu_tanh_forward act", dt, got, refg, n, tol_for(dt));
    free(pre); free(b); free(ref); free(refg); free(got);
    cudaFree(dpre); cudaFree(dact); cudaFree(db);
}

/* fused residual+dropout+LN vs the CPU composition of the same three ops */
static void test_res_drop_ln(kdtype dt, int C)
{
    int N = 29;
    size_t n = (size_t)N * C;
    philox_stream s;
    philox_stream_init(&s, 11, 0, 3, 1, 4, DROPOUT_SITE_ATTN_OUT);
    float *x = host_rand(n, 1, 0), *y = host_rand(n, 1, 0), *w = host_rand(C, 0.5f, 1),
          *b = host_rand(C, 0.5f, 0);
    round_to(x, n, dt);
    round_to(y, n, dt);
    float *tmp = malloc(n * 4), *res = malloc(n * 4), *out = malloc(n * 4), *mean = malloc(N * 4),
          *rstd = malloc(N * 4), *got = malloc(n * 4);
    dropout_forward(tmp, y, &s, P_DROP, n);
    residual_forward(res, x, tmp, n);
    round_to(res, n, dt); // the fused kernel normalizes the stored (rounded) sum
    layernorm_forward(out, mean, rstd, res, w, b, N, C, 1e-12f);
    void *dx = dev_from(x, n, dt), *dy = dev_from(y, n, dt), *dres = dev_nan(n, dt),
         *dout = dev_nan(n, dt);
    float *dw = dev_from(w, C, KDT_F32), *db = dev_from(b, C, KDT_F32), *dmean = dev_nan(N, KDT_F32),
          *drstd = dev_nan(N, KDT_F32);
    cuda_residual_dropout_layernorm_forward_dt(dout, dres, dmean, drstd, dx, dy, &s, P_DROP, dw,
                                               db, N, C, 1e-12f, dt, 0);
    dev_to(got, dres, n, dt);
    check_close("residual_dropout_layernorm fwd res", dt, got, res, n, tol_for(dt));
    dev_to(got, dout, n, dt);
    check_close("residual_dropout_layernorm fwd out", dt, got, out, n, tol_for(dt));

    float *g1 = host_rand(n, 1, 0), *g2 = host_rand(n, 1, 0);
    round_to(g1, n, dt);
    round_to(g2, n, dt);
    float *gw = host_rand(C, 1, 0), *gb = host_rand(C, 1, 0), *dres_ref = malloc(n * 4),
          *dy_ref = malloc(n * 4);
    /* seed the device gradients before the CPU accumulates into gw, gb */
    float *dgw = dev_from(gw, C, KDT_F32), *dgb = dev_from(gb, C, KDT_F32);
    residual_forward(tmp, g1, g2, n);
    layernorm_backward(dres_ref, gw, gb, tmp, res, w, mean, rstd, N, C);
    dropout_backward(dy_ref, dres_ref, &s, P_DROP, n);
    void *dg1 = dev_from(g1, n, dt), *dg2 = dev_from(g2, n, dt), *ddres = dev_nan(n, dt),
         *ddy = dev_nan(n, dt);
    cuda_residual_dropout_layernorm_backward_dt(ddres, ddy, dgw, dgb, dg1, dg2, dres, dw, dmean,
                                                drstd, &s, P_DROP, N, C, dt, 0);
    dev_to(got, ddres, n, dt);
    check_close("residual_dropout_layernorm bwd dres", dt, got, dres_ref, n, tol_for(dt));
    dev_to(got, ddy, n, dt);
    check_close("residual_dropout_layernorm bwd dy", dt, got, dy_ref, n, tol_for(dt));
    dev_to(got, dgw, C, KDT_F32);
    check_close("residual_dropout_layernorm bwd dweight", dt, got, gw, C, tol_for(dt));
    dev_to(got, dgb, C, KDT_F32);
    check_close("residual_dropout_layernorm bwd dbias", dt, got, gb, C, tol_for(dt));
    free(x); free(y); free(w); free(b); free(tmp); free(res); free(out); free(mean); free(rstd);
    free(got); free(g1); free(g2); free(gw); free(gb); free(dres_ref); free(dy_ref);
    cudaFree(dx); cudaFree(dy); cudaFree(dres); cudaFree(dout); cudaFree(dw); cudaFree(db);
    cudaFree(dmean); cudaFree(drstd); cudaFree(dg1); cudaFree(dg2); cudaFree(ddres); cudaFree(ddy);
    cudaFree(dgw); cudaFree(dgb);
}

static void test_gather(kdtype dt)
{
    int N = 50, C = 24, M = 9;
    int32_t rows[9] = {3, 0, 49, 17, 18, 5, 40, 41, 22};
    float *x = host_rand((size_t)N * C, 1, 0), *ref = malloc((size_t)M * C * 4),
          *got = malloc((size_t)N * C * 4);
    round_to(x, (size_t)N * C, dt);
    gather_rows_forward(ref, x, rows, M, C);
    void *dx = dev_from(x, (size_t)N * C, dt), *dout = dev_nan((size_t)M * C, dt);
    int32_t *drows = dev_ints(rows, M);
    cuda_gather_rows_forward_dt(dout, dx, drows, M, C, dt, 0);
    dev_to(got, dout, (size_t)M * C, dt);
    check_close("gather_rows_forward", dt, got, ref, (size_t)M * C, tol_for(dt));
    float *g = host_rand((size_t)M * C, 1, 0), *dref = host_rand((size_t)N * C, 1, 0);
    round_to(g, (size_t)M * C, dt);
    round_to(dref, (size_t)N * C, dt);
    void *dd = dev_from(dref, (size_t)N * C, dt), *dg = dev_from(g, (size_t)M * C, dt);
    gather_rows_backward(dref, g, rows, M, C);
    cuda_gather_rows_backward_dt(dd, dg, drows, M, C, dt, 0);
    dev_to(got, dd, (size_t)N * C, dt);
    check_close("gather_rows_backward (+=)", dt, got, dref, (size_t)N * C, tol_for(dt));
    free(x); free(ref); free(got); free(g); free(dref);
    cudaFree(dx); cudaFree(dout); cudaFree(drows); cudaFree(dd); cudaFree(dg);
}

static void test_xent(kdtype dt)
{
    int M = 7, V = 1001;
    size_t n = (size_t)M * V;
    int32_t tg[7] = {0, 1000, 5, 77, 500, 999, 3};
    float *lg = host_rand(n, 6, 0);
    round_to(lg, n, dt);
    float *loss = malloc(M * 4), *probs = malloc(n * 4), *dl = malloc(M * 4), *dref = malloc(n * 4),
          *got = malloc(n * 4), *gl = malloc(M * 4);
    float g = 0.37f;
    for (int i = 0; i < M; i++)
        dl[i] = g;
    crossentropy_softmax_forward(loss, probs, lg, tg, M, V);
    crossentropy_softmax_backward(dref, probs, tg, dl, M, V);
    int32_t *dtg = dev_ints(tg, M);
    void *dlg = dev_from(lg, n, dt);
    float *dloss = dev_nan(M, KDT_F32);
    cuda_mlm_xent_fused_dt(dloss, dlg, dtg, g, M, V, dt, 0);
    dev_to(gl, dloss, M, KDT_F32);
    check_close("mlm_xent_fused losses", dt, gl, loss, M, tol_for(dt));
    dev_to(got, dlg, n, dt);
    check_close("mlm_xent_fused dlogits (in place)", dt, got, dref, n, tol_for(dt));
    if (dt == KDT_F32) {
        float *dprobs = dev_nan(n, KDT_F32), *ddl = dev_from(dl, M, KDT_F32);
        float *dlg2 = dev_from(lg, n, KDT_F32);
        cuda_fill_nan(dloss, KDT_F32, M, 0);
        cuda_crossentropy_softmax_forward(dloss, dprobs, dlg2, dtg, M, V, 0);
        dev_to(gl, dloss, M, KDT_F32);
        check_close("crossentropy_softmax_forward losses", dt, gl, loss, M, 1e-5);
        dev_to(got, dprobs, n, KDT_F32);
        check_close("crossentropy_softmax_forward probs", dt, got, probs, n, 1e-5);
        cuda_crossentropy_softmax_backward(dprobs, dprobs, dtg, ddl, M, V, 0);
        dev_to(got, dprobs, n, KDT_F32);
        check_close("crossentropy_softmax_backward", dt, got, dref, n, 1e-5);
        cudaFree(dprobs); cudaFree(ddl); cudaFree(dlg2);
    }
    free(lg); free(loss); free(probs); free(dl); free(dref); free(got); free(gl);
    cudaFree(dtg); cudaFree(dlg); cudaFree(dloss);
}

/* Chunks of at most 1000 elements per segment, uploaded. */
static cuda_chunk *make_chunks(const size_t *sizes, int nseg, int *count)
{
    static cuda_chunk h[4096];
    int c = 0;
    size_t off = 0;
    for (int s = 0; s < nseg; s++) {
        for (size_t k = 0; k < sizes[s]; k += 1000) {
            size_t len = sizes[s] - k < 1000 ? sizes[s] - k : 1000;
            h[c++] = (cuda_chunk){.off = off + k, .len = (uint32_t)len, .seg = (uint32_t)s};
        }
        off += sizes[s];
    }
    *count = c;
    cuda_chunk *d = dev_alloc(c * sizeof(cuda_chunk));
    TCHECK(cudaMemcpy(d, h, c * sizeof(cuda_chunk), cudaMemcpyHostToDevice));
    return d;
}

/* zero: with zero_grad folded in (lever CUDA_LEVER_OPT_ZERO): the same
 * results, and every gradient element left exactly 0 */
static void test_optim(optim_kind kind, int zero)
{
    size_t sizes[4] = {2500, 7, 4099, 300};
    int decays[4] = {1, 0, 1, 0};
    uint8_t dec8[4] = {1, 0, 1, 0};
    size_t n = 0;
    for (int i = 0; i < 4; i++)
        n += sizes[i];
    optim_config c;
    optim_config_default(&c, kind);
    c.lr = 1e-3f;
    c.weight_decay = 0.01f;
    c.max_grad_norm = 1.0f;
    c.warmup_steps = 2;
    c.total_steps = 10;
    optim *o = NULL;
    if (optim_create(&o, &c, sizes, decays, 4) != 0)
        abort();
    float *p = host_rand(n, 0.5f, 0);
    float *dp = dev_from(p, n, KDT_F32), *dm = dev_nan(n, KDT_F32), *dv = dev_nan(n, KDT_F32);
    TCHECK(cudaMemset(dm, 0, n * 4));
    TCHECK(cudaMemset(dv, 0, n * 4));
    void *dlp = dev_nan(n, KDT_BF16);
    int nch = 0;
    cuda_chunk *dch = make_chunks(sizes, 4, &nch);
    uint8_t *ddec = dev_alloc(4);
    TCHECK(cudaMemcpy(ddec, dec8, 4, cudaMemcpyHostToDevice));
    double *norms = dev_alloc(8 * sizeof(double)), *sumsq = dev_alloc(sizeof(double));
    int *nonfinite = dev_alloc(sizeof(int));
    for (int step = 0; step < 3; step++) {
        float *g = host_rand(n, 0.05f, 0);
        float *dg = dev_from(g, n, KDT_F32);
        TCHECK(cudaMemset(sumsq, 0, sizeof(double)));
        TCHECK(cudaMemset(nonfinite, 0, sizeof(int)));
        cuda_sumsq_check(sumsq, nonfinite, dg, n, 0);
        double ss;
        int nf;
        TCHECK(cudaMemcpy(&ss, sumsq, sizeof ss, cudaMemcpyDeviceToHost));
        TCHECK(cudaMemcpy(&nf, nonfinite, sizeof nf, cudaMemcpyDeviceToHost));
        double gn_ref = optim_global_norm(g, n), gn = sqrt(ss);
        double lr = optim_lr_at(&c, o->t);
        float clip;
        if (kind == OPTIM_ADAMW) {
            double coef = (double)c.max_grad_norm / (gn_ref + 1e-6);
            clip = (float)(coef < 1.0 ? coef : 1.0);
        } else {
            clip = (float)((double)c.max_grad_norm /
                           (gn_ref > c.max_grad_norm ? gn_ref : c.max_grad_norm));
        }
        double gnerr = fabs(gn - gn_ref) / gn_ref;
        printf("%-4s %-44s      rel=%.3g nonfinite=%d\n", gnerr < 1e-12 && !nf ? "ok" : "FAIL",
               "global grad norm", gnerr, nf);
        gpu_failures += !(gnerr < 1e-12 && !nf);
        long t = o->t + 1;
        if (kind == OPTIM_ADAMW)
            cuda_adamw_step(dp, dlp, KDT_BF16, dg, dm, dv, dch, nch, ddec, lr, c.beta1, c.beta2,
                            c.eps, c.weight_decay, clip, t, zero, 0);
        else
            cuda_lamb_step(dp, dlp, KDT_BF16, dg, dm, dv, dch, nch, ddec, norms, 4, lr, c.beta1,
                           c.beta2, c.eps, c.weight_decay, clip, t, zero, 0);
        if (optim_step(o, p, g, NULL, NULL) != 0)
            abort();
        dev_to(g, dg, n, KDT_F32);
        size_t left = 0; // elements the step left nonzero (all of them without zero)
        for (size_t i = 0; i < n; i++)
            left += g[i] != 0.0f;
        int zok = zero ? left == 0 : left > n / 2;
        printf("%-4s %-44s      zero_g=%d nonzero after=%zu of %zu\n", zok ? "ok" : "FAIL",
               kind == OPTIM_ADAMW ? "adamw gradients after the step" : "lamb gradients after the step",
               zero, left, n);
        gpu_failures += !zok;
        free(g);
        cudaFree(dg);
    }
    float *got = malloc(n * 4);
    dev_to(got, dp, n, KDT_F32);
    check_close(kind == OPTIM_ADAMW ? "adamw 3 steps params" : "lamb 3 steps params", KDT_F32, got,
                p, n, 1e-6);
    dev_to(got, dv, n, KDT_F32);
    check_close(kind == OPTIM_ADAMW ? "adamw 3 steps v" : "lamb 3 steps v", KDT_F32, got, o->v, n,
                1e-6);
    dev_to(got, dp, n, KDT_F32);
    float *pr = host_copy(got, n); // the copy must be the GPU's own params, rounded
    round_to(pr, n, KDT_BF16);
    dev_to(got, dlp, n, KDT_BF16);
    check_close("optimizer bf16 weight copy", KDT_BF16, got, pr, n, 0.0);

    /* an inf in the gradients must raise the flag */
    float inf = INFINITY;
    float *dg = dev_from(p, n, KDT_F32);
    TCHECK(cudaMemcpy(dg + 4321, &inf, sizeof inf, cudaMemcpyHostToDevice));
    TCHECK(cudaMemset(sumsq, 0, sizeof(double)));
    TCHECK(cudaMemset(nonfinite, 0, sizeof(int)));
    cuda_sumsq_check(sumsq, nonfinite, dg, n, 0);
    int nf = 0;
    TCHECK(cudaMemcpy(&nf, nonfinite, sizeof nf, cudaMemcpyDeviceToHost));
    printf("%-4s %-44s      flag=%d\n", nf ? "ok" : "FAIL", "non-finite gradient detected", nf);
    gpu_failures += !nf;
    free(p); free(got); free(pr);
    optim_destroy(o);
    cudaFree(dp); cudaFree(dm); cudaFree(dv); cudaFree(dlp); cudaFree(dch); cudaFree(ddec);
    cudaFree(norms); cudaFree(sumsq); cudaFree(nonfinite); cudaFree(dg);
}

/* The norms must not depend on the order blocks finish in: data-parallel
 * ranks compute them on their own from the same all-reduced gradients, and
 * a clip factor or trust ratio that differed in its last bit would make the
 * replicas drift apart. Float atomics made exactly that happen; now every
 * repeat must give the same bits (2.9M elements: the sum of squares runs
 * its full 1024 blocks; 2,902 LAMB chunks of at most 1000 elements). */
static void test_optim_deterministic(void)
{
    size_t sizes[3] = {1500000, 999, 1400001};
    uint8_t dec8[3] = {1, 0, 1};
    size_t n = sizes[0] + sizes[1] + sizes[2];
    float *g = host_rand(n, 0.05f, 0), *p = host_rand(n, 0.5f, 0);
    float *dg = dev_from(g, n, KDT_F32);
    double *sumsq = dev_alloc(sizeof(double)), ref = 0;
    int *nonfinite = dev_alloc(sizeof(int));
    int same = 1;
    for (int r = 0; r < 5; r++) {
        TCHECK(cudaMemset(sumsq, 0, sizeof(double)));
        cuda_sumsq_check(sumsq, nonfinite, dg, n, 0);
        double ss;
        TCHECK(cudaMemcpy(&ss, sumsq, sizeof ss, cudaMemcpyDeviceToHost));
        if (r == 0)
            ref = ss;
        same &= memcmp(&ss, &ref, sizeof ss) == 0;
    }
    printf("%-4s %-44s\n", same ? "ok" : "FAIL", "sum of squares: same bits in 5 repeats");
    gpu_failures += !same;

    static cuda_chunk h[4096];
    int nch = 0;
    size_t off = 0;
    for (int sg = 0; sg < 3; sg++) {
        for (size_t k = 0; k < sizes[sg]; k += 1000)
            h[nch++] = (cuda_chunk){.off = off + k,
                                    .len = (uint32_t)(sizes[sg] - k < 1000 ? sizes[sg] - k : 1000),
                                    .seg = (uint32_t)sg};
        off += sizes[sg];
    }
    cuda_chunk *dch = dev_alloc(nch * sizeof(cuda_chunk));
    TCHECK(cudaMemcpy(dch, h, nch * sizeof(cuda_chunk), cudaMemcpyHostToDevice));
    uint8_t *ddec = dev_alloc(3);
    TCHECK(cudaMemcpy(ddec, dec8, 3, cudaMemcpyHostToDevice));
    double *norms = dev_alloc(6 * sizeof(double));
    float *first = malloc(n * 4), *got = malloc(n * 4);
    same = 1;
    for (int r = 0; r < 3; r++) {
        float *dp = dev_from(p, n, KDT_F32), *dm = dev_alloc(n * 4), *dv = dev_alloc(n * 4);
        TCHECK(cudaMemset(dm, 0, n * 4));
        TCHECK(cudaMemset(dv, 0, n * 4));
        cuda_lamb_step(dp, NULL, KDT_F32, dg, dm, dv, dch, nch, ddec, norms, 3, 1e-3, 0.9f, 0.999f,
                       1e-6f, 0.01f, 1.0f, 1, 0, 0);
        TCHECK(cudaMemcpy(r == 0 ? first : got, dp, n * 4, cudaMemcpyDeviceToHost));
        if (r > 0)
            same &= memcmp(first, got, n * 4) == 0;
        cudaFree(dp); cudaFree(dm); cudaFree(dv);
    }
    printf("%-4s %-44s\n", same ? "ok" : "FAIL", "LAMB step: same bits in 3 repeats");
    gpu_failures += !same;
    free(g); free(p); free(first); free(got);
    cudaFree(dg); cudaFree(sumsq); cudaFree(nonfinite); cudaFree(dch); cudaFree(ddec); cudaFree(norms);
}

/* The LayerNorm family with the vectorized-rows lever off and on: the same
 * CPU references and tolerances either way. C = 72 and 768 fit its packs in
 * every type (the lever's kernel runs, checked), C = 70 does not (the plain
 * kernel runs with the lever on). */
static void test_ln_levers(kdtype dt)
{
    unsigned saved = cuda_levers();
    for (int on = 0; on <= 1; on++) {
        cuda_levers_set(on ? saved | CUDA_LEVER_LN_VEC : saved & ~(unsigned)CUDA_LEVER_LN_VEC);
        int vec72 = cuda_layernorm_vectorized(72, dt), vec70 = cuda_layernorm_vectorized(70, dt);
        int ok = vec72 == on && vec70 == 0 && cuda_layernorm_vectorized(768, dt) == on;
        printf("%-4s %-44s %-4s lever=%d C=72:%d C=70:%d\n", ok ? "ok" : "FAIL",
               "layernorm vectorized rows where they fit", kdtype_name(dt), on, vec72, vec70);
        gpu_failures += !ok;
        test_layernorm(dt, 37, 72);
        test_layernorm(dt, 2048, 768);
        test_res_drop_ln(dt, 72);
        test_res_drop_ln(dt, 70);
    }
    cuda_levers_set(saved);
}

/* ---- the optimizer with its step values in a device block ----
 * cuda_opt_args_write + cuda_opt_clip + cuda_{adamw,lamb}_step_dev against
 * the by-value launchers given the clip factor worker/gpu_model.c
 * gpu_model_step computes on the host (the formula is copied here as the
 * reference): p, the 16-bit copy, m, v and g must have the same bits after
 * each step; on a non-finite gradient nothing may change at all. */
static int dev_same(const void *a, const void *b, size_t bytes)
{
    unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
    TCHECK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
    TCHECK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
    int same = memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return same;
}

/* gpu_model_step's host computation, copied: the unscale-and-clip factor */
static float host_gmul(optim_kind kind, double sumsq, float max_grad_norm, float scale,
                       double *gnorm_out)
{
    double gnorm = sqrt(sumsq) / (double)scale;
    float clip = 1.0f;
    if (max_grad_norm > 0) {
        if (kind == OPTIM_ADAMW) {
            double coef = (double)max_grad_norm / (gnorm + 1e-6);
            clip = (float)(coef < 1.0 ? coef : 1.0);
        } else {
            clip = (float)((double)max_grad_norm /
                           (gnorm > max_grad_norm ? gnorm : max_grad_norm));
        }
    }
    *gnorm_out = gnorm;
    return scale == 1.0f ? clip : (float)((double)clip / scale);
}

typedef struct opt_set {
    float *p, *m, *v, *g;
    void *lp;
} opt_set;

static void test_optim_dev(optim_kind kind, kdtype lp_dt, float scale, float mgn, int zero)
{
    size_t sizes[4] = {2500, 7, 4099, 300};
    uint8_t dec8[4] = {1, 0, 1, 0};
    size_t n = 2500 + 7 + 4099 + 300;
    int lamb = kind == OPTIM_LAMB, use_lp = lp_dt != KDT_F32;
    size_t lpb = n * kdtype_size(lp_dt);
    float *p = host_rand(n, 0.5f, 0);
    opt_set s[2]; // 0: by value, 1: device block
    for (int k = 0; k < 2; k++) {
        s[k].p = dev_from(p, n, KDT_F32);
        s[k].m = dev_alloc(n * 4);
        s[k].v = dev_alloc(n * 4);
        TCHECK(cudaMemset(s[k].m, 0, n * 4));
        TCHECK(cudaMemset(s[k].v, 0, n * 4));
        s[k].lp = use_lp ? dev_nan(n, lp_dt) : NULL;
        s[k].g = NULL;
    }
    int nch = 0;
    cuda_chunk *dch = make_chunks(sizes, 4, &nch);
    uint8_t *ddec = dev_alloc(4);
    TCHECK(cudaMemcpy(ddec, dec8, 4, cudaMemcpyHostToDevice));
    double *norms = dev_alloc(8 * sizeof(double)), *sumsq = dev_alloc(sizeof(double));
    double *dgnorm = dev_alloc(sizeof(double));
    int *nonfinite = dev_alloc(sizeof(int)), *dskip = dev_alloc(sizeof(int));
    void *blk = dev_alloc(cuda_opt_args_bytes());
    const double lrs[4] = {1e-3, 5e-4, 2.5e-4, 1e-4};
    char name[96];
    for (int step = 1; step <= 4; step++) {
        /* step 4: an inf in the gradient, the update must be skipped */
        float *g = host_rand(n, 0.05f * scale, 0);
        if (step == 4)
            g[4321] = INFINITY;
        for (int k = 0; k < 2; k++)
            s[k].g = dev_from(g, n, KDT_F32);
        TCHECK(cudaMemset(sumsq, 0, sizeof(double)));
        TCHECK(cudaMemset(nonfinite, 0, sizeof(int)));
        cuda_sumsq_check(sumsq, nonfinite, s[0].g, n, 0);
        double ss;
        int nf;
        TCHECK(cudaMemcpy(&ss, sumsq, sizeof ss, cudaMemcpyDeviceToHost));
        TCHECK(cudaMemcpy(&nf, nonfinite, sizeof nf, cudaMemcpyDeviceToHost));
        int skip_ref = nf || !isfinite(ss);
        double gn_ref = INFINITY;
        float gmul = skip_ref ? 1.0f : host_gmul(kind, ss, mgn, scale, &gn_ref);
        if (!skip_ref) {
            if (lamb)
                cuda_lamb_step(s[0].p, s[0].lp, lp_dt, s[0].g, s[0].m, s[0].v, dch, nch, ddec,
                               norms, 4, lrs[step - 1], 0.9f, 0.999f, 1e-6f, 0.01f, gmul, step,
                               zero, 0);
            else
                cuda_adamw_step(s[0].p, s[0].lp, lp_dt, s[0].g, s[0].m, s[0].v, dch, nch, ddec,
                                lrs[step - 1], 0.9f, 0.999f, 1e-8f, 0.01f, gmul, step, zero, 0);
        }
        /* the device path, as a captured step would run it */
        int rc = cuda_opt_args_write(blk, lamb, lrs[step - 1], 0.9f, 0.999f,
                                     lamb ? 1e-6f : 1e-8f, 0.01f, step, 0);
        cuda_opt_clip(blk, lamb, sumsq, nonfinite, mgn, scale, dgnorm, dskip, 0);
        if (lamb)
            cuda_lamb_step_dev(s[1].p, s[1].lp, lp_dt, s[1].g, s[1].m, s[1].v, dch, nch, ddec,
                               norms, 4, blk, zero, 0);
        else
            cuda_adamw_step_dev(s[1].p, s[1].lp, lp_dt, s[1].g, s[1].m, s[1].v, dch, nch, ddec,
                                blk, zero, 0);
        double gn;
        int sk;
        TCHECK(cudaMemcpy(&gn, dgnorm, sizeof gn, cudaMemcpyDeviceToHost));
        TCHECK(cudaMemcpy(&sk, dskip, sizeof sk, cudaMemcpyDeviceToHost));
        int gn_ok = memcmp(&gn, &gn_ref, sizeof gn) == 0 && sk == skip_ref && rc == 0;
        /* a skipped step: s[0] was not touched at all, so s[1] must equal it */
        int same = dev_same(s[0].p, s[1].p, n * 4) && dev_same(s[0].m, s[1].m, n * 4) &&
                   dev_same(s[0].v, s[1].v, n * 4) && dev_same(s[0].g, s[1].g, n * 4) &&
                   (!use_lp || dev_same(s[0].lp, s[1].lp, lpb));
        snprintf(name, sizeof name, "%s_step_dev t=%d%s scale=%g mgn=%g zero_g=%d",
                 lamb ? "lamb" : "adamw", step, skip_ref ? " (skip)" : "", scale, mgn, zero);
        printf("%-4s %-58s %-4s same bits=%d gnorm/skip=%d\n", same && gn_ok ? "ok" : "FAIL", name,
               kdtype_name(lp_dt), same, gn_ok);
        gpu_failures += !(same && gn_ok);
        free(g);
        for (int k = 0; k < 2; k++)
            cudaFree(s[k].g);
    }
    /* bad input: a clear error, nothing enqueued */
    int bad_t = cuda_opt_args_write(blk, lamb, 1e-3, 0.9f, 0.999f, 1e-8f, 0.01f, 0, 0);
    printf("%-4s %-58s rc=%d\n", bad_t == -EINVAL ? "ok" : "FAIL", "opt_args_write t=0 refused",
           bad_t);
    gpu_failures += bad_t != -EINVAL;
    free(p);
    for (int k = 0; k < 2; k++) {
        cudaFree(s[k].p); cudaFree(s[k].m); cudaFree(s[k].v);
        if (s[k].lp)
            cudaFree(s[k].lp);
    }
    cudaFree(dch); cudaFree(ddec); cudaFree(norms); cudaFree(sumsq); cudaFree(dgnorm);
    cudaFree(nonfinite); cudaFree(dskip); cudaFree(blk);
}

/* The fused MLM loss with the gradient scale in device memory, and padding
 * rows (target -1): the _dev forms must give the by-value bits; a batch of
 * M rows padded with 64 rows of NaN logits and target -1 must give the M
 * rows' losses and gradient rows bit for bit, loss 0 and all-zero gradient
 * rows (every ld column) for the padding, and the same loss sum. */
static void test_xent_dev(kdtype dt, int V, int ld)
{
    int M = 7, MP = M + 64;
    size_t es = kdtype_size(dt), row = (size_t)ld * es;
    int32_t tg[7 + 64] = {0, V - 1, 5, 77, 500, V - 2, 3};
    for (int i = M; i < MP; i++)
        tg[i] = -1;
    float *lg = host_rand((size_t)M * ld, 6, 0);
    int32_t *dtg = dev_ints(tg, MP);
    void *a = dev_from(lg, (size_t)M * ld, dt), *b = dev_from(lg, (size_t)M * ld, dt);
    float *la = dev_nan(MP, KDT_F32), *lb = dev_nan(MP, KDT_F32);
    float *dscale = dev_alloc(sizeof(float)), *sums = dev_alloc(2 * sizeof(float));
    char name[96];
    const float scales[3] = {0.37f, 0.0f, 0.5f};
    for (int k = 0; k < 2; k++) {
        float gs = scales[k];
        TCHECK(cudaMemcpy(dscale, &gs, sizeof gs, cudaMemcpyHostToDevice));
        if (ld == V) {
            cuda_mlm_xent_fused_dt(la, a, dtg, gs, M, V, dt, 0);
            cuda_mlm_xent_fused_dev(lb, b, dtg, dscale, M, V, dt, 0);
        } else {
            cuda_mlm_xent_fused_ld_dt(la, a, dtg, gs, M, V, ld, dt, 0);
            cuda_mlm_xent_fused_ld_dev(lb, b, dtg, dscale, M, V, ld, dt, 0);
        }
        int same = dev_same(la, lb, M * sizeof(float)) && dev_same(a, b, M * row);
        snprintf(name, sizeof name, "mlm_xent_fused%s_dev scale %g V%d", ld == V ? "" : "_ld", gs, V);
        printf("%-4s %-58s %-4s same bits=%d\n", same ? "ok" : "FAIL", name, kdtype_name(dt), same);
        gpu_failures += !same;
    }
    /* the scale is read when the kernel runs: another scale, other bits */
    TCHECK(cudaMemcpy(a, b, M * row, cudaMemcpyDeviceToDevice));
    cuda_mlm_xent_fused_ld_dev(la, a, dtg, dscale, M, V, ld, dt, 0); // 0: logits stay
    TCHECK(cudaMemcpy(dscale, &scales[2], sizeof(float), cudaMemcpyHostToDevice));
    cuda_mlm_xent_fused_ld_dev(lb, b, dtg, dscale, M, V, ld, dt, 0);
    int moved = !dev_same(a, b, M * row);
    printf("%-4s %-58s %-4s\n", moved ? "ok" : "FAIL", "mlm_xent_fused_dev scale read on the device",
           kdtype_name(dt));
    gpu_failures += !moved;
    cudaFree(a);
    cudaFree(b);

    /* padding: by value and on the device, with the ld and plain forms */
    for (int dev = 0; dev <= 1; dev++) {
        float gs = 0.37f;
        TCHECK(cudaMemcpy(dscale, &gs, sizeof gs, cudaMemcpyHostToDevice));
        void *ref = dev_from(lg, (size_t)M * ld, dt), *pad = dev_nan((size_t)MP * ld, dt);
        TCHECK(cudaMemcpy(pad, ref, M * row, cudaMemcpyDeviceToDevice));
        if (dev) {
            cuda_mlm_xent_fused_ld_dev(la, ref, dtg, dscale, M, V, ld, dt, 0);
            cuda_mlm_xent_fused_ld_dev(lb, pad, dtg, dscale, MP, V, ld, dt, 0);
        } else if (ld == V) {
            cuda_mlm_xent_fused_dt(la, ref, dtg, gs, M, V, dt, 0);
            cuda_mlm_xent_fused_dt(lb, pad, dtg, gs, MP, V, dt, 0);
        } else {
            cuda_mlm_xent_fused_ld_dt(la, ref, dtg, gs, M, V, ld, dt, 0);
            cuda_mlm_xent_fused_ld_dt(lb, pad, dtg, gs, MP, V, ld, dt, 0);
        }
        cuda_sum(sums, la, M, 0);
        cuda_sum(sums + 1, lb, MP, 0);
        int real = dev_same(la, lb, M * sizeof(float)) && dev_same(ref, pad, M * row);
        float *hl = malloc(MP * sizeof(float)), hs[2];
        unsigned char *hp = malloc(64 * row);
        TCHECK(cudaMemcpy(hl, lb, MP * sizeof(float), cudaMemcpyDeviceToHost));
        TCHECK(cudaMemcpy(hp, (char *)pad + M * row, 64 * row, cudaMemcpyDeviceToHost));
        TCHECK(cudaMemcpy(hs, sums, sizeof hs, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (int i = M; i < MP; i++)
            bad += memcmp(&hl[i], &(float){0.0f}, sizeof(float)) != 0;
        for (size_t i = 0; i < 64 * row; i++)
            bad += hp[i] != 0; // +0.0 in every type is all zero bytes
        int ok = real && bad == 0 && memcmp(&hs[0], &hs[1], sizeof(float)) == 0;
        snprintf(name, sizeof name, "mlm_xent%s padded M%d+64 (label -1) V%d ld%d",
                 dev ? "_dev" : "", M, V, ld);
        printf("%-4s %-58s %-4s real rows same=%d pad not zero=%zu\n", ok ? "ok" : "FAIL", name,
               kdtype_name(dt), real, bad);
        gpu_failures += !ok;
        free(hl);
        free(hp);
        cudaFree(ref);
        cudaFree(pad);
    }
    free(lg);
    cudaFree(dtg); cudaFree(la); cudaFree(lb); cudaFree(dscale); cudaFree(sums);
}

/* The embedding backward with the run count in device memory, on a grid
 * for B*T runs: the by-value bits; and with one run fewer on the device,
 * other bits (the count is really read). */
static void test_emb_dev(kdtype dt)
{
    int B = 3, T = 13, C = 72, V = 57, P = 20;
    int N = B * T;
    int32_t ids[3 * 13], tt[3 * 13], ord[2 * 3 * 13 + 1];
    for (int i = 0; i < N; i++) {
        ids[i] = (int32_t)((i * 7) % V);
        tt[i] = (int32_t)(i % 2);
    }
    ids[5] = ids[6] = ids[20];
    int U = cuda_embeddings_order(ord, ord + N, ids, N, V);
    float *g = host_rand((size_t)N * C, 1, 0);
    float *gw[3] = {host_rand((size_t)V * C, 1, 0), host_rand((size_t)P * C, 1, 0),
                    host_rand(2 * (size_t)C, 1, 0)};
    size_t sz[3] = {(size_t)V * C, (size_t)P * C, 2 * (size_t)C};
    void *dg = dev_from(g, (size_t)N * C, dt);
    int32_t *dids = dev_ints(ids, N), *dtt = dev_ints(tt, N), *dord = dev_ints(ord, N + U + 1);
    int32_t *dU = dev_ints(&U, 1);
    float *r[3], *d[3];
    for (int k = 0; k < 3; k++) {
        r[k] = dev_from(gw[k], sz[k], KDT_F32);
        d[k] = dev_from(gw[k], sz[k], KDT_F32);
    }
    cuda_embeddings_backward_ordered_dt(r[0], r[1], r[2], dg, dids, dtt, dord, dord + N, U, B, T,
                                        C, 2, dt, 0);
    cuda_embeddings_backward_ordered_dev(d[0], d[1], d[2], dg, dids, dtt, dord, dord + N, dU, N,
                                         B, T, C, 2, dt, 0);
    int same = 1;
    for (int k = 0; k < 3; k++)
        same &= dev_same(r[k], d[k], sz[k] * sizeof(float));
    /* one run fewer: the last id's row of dwte is not added to */
    int U1 = U - 1;
    TCHECK(cudaMemcpy(dU, &U1, sizeof U1, cudaMemcpyHostToDevice));
    TCHECK(cudaMemcpy(d[0], gw[0], sz[0] * sizeof(float), cudaMemcpyHostToDevice));
    cuda_embeddings_backward_ordered_dev(d[0], d[1], d[2], dg, dids, dtt, dord, dord + N, dU, N,
                                         B, T, C, 2, dt, 0);
    int moved = !dev_same(r[0], d[0], sz[0] * sizeof(float));
    printf("%-4s %-58s %-4s U=%d same bits=%d, U-1 differs=%d\n", same && moved ? "ok" : "FAIL",
           "embeddings_backward_ordered_dev", kdtype_name(dt), U, same, moved);
    gpu_failures += !(same && moved);
    free(g);
    for (int k = 0; k < 3; k++) {
        free(gw[k]);
        cudaFree(r[k]);
        cudaFree(d[k]);
    }
    cudaFree(dg); cudaFree(dids); cudaFree(dtt); cudaFree(dord); cudaFree(dU);
}

/* ---- per-step values from device memory (lever CUDA_LEVER_GRAPH) ----
 * Every launcher that draws dropout, with philox_stream.dev_ctr pointing at
 * {step, micro} in device memory, must give the bits of the by-value call
 * with the same step and micro, whatever the host-side ctr[0] and ctr[2]
 * hold, and other bits when the device step or micro changes. */
typedef struct rng_bufs {
    kdtype dt;
    int B, T, C, NH;
    uint32_t *dctr;                                     // (2) {step, micro}
    uint32_t *u32;                                      // (1001)
    void *qkv, *out, *qkvr, *att, *scratch;              // attention forward
    void *dy, *dqkv, *dqkvr, *datt;                      // attention backward
    int32_t *lens;                                       // (B)
    float *lse, *dscr;                                   // (B,NH,T) flash
    void *x, *y, *res, *lnout, *g1, *g2, *dres, *ddy;    // (N,C) LayerNorm
    float *w, *b, *mean, *rstd, *gw, *gb;                // (C), (N)
} rng_bufs;

static void rng_bufs_make(rng_bufs *r, kdtype dt, int B, int T, int C, int NH)
{
    size_t N = (size_t)B * T, nq = N * 3 * C, na = (size_t)B * NH * T * T, nc = N * C;
    r->dt = dt;
    r->B = B; r->T = T; r->C = C; r->NH = NH;
    r->dctr = dev_alloc(2 * sizeof(uint32_t));
    r->u32 = dev_alloc(1001 * sizeof(uint32_t));
    float *h = host_rand(nq, 1, 0);
    r->qkv = dev_from(h, nq, dt);
    free(h);
    h = host_rand(nc, 1, 0);
    r->dy = dev_from(h, nc, dt);
    r->x = dev_from(h, nc, dt);
    free(h);
    h = host_rand(nc, 1, 0);
    r->y = dev_from(h, nc, dt);
    r->g2 = dev_from(h, nc, dt);
    free(h);
    h = host_rand(nc, 1, 0);
    r->g1 = dev_from(h, nc, dt);
    free(h);
    r->out = dev_nan(nc, dt); r->qkvr = dev_nan(nq, dt); r->att = dev_nan(na, dt);
    r->scratch = dev_nan(na + nc, dt); r->dqkv = dev_nan(nq, dt); r->dqkvr = dev_nan(nq, dt);
    r->datt = dev_nan(na, dt);
    int32_t lens[4] = {T, T - 5, 1, T};
    r->lens = dev_ints(lens, B);
    r->lse = dev_nan(N * NH, KDT_F32); r->dscr = dev_nan(N * NH, KDT_F32);
    r->res = dev_nan(nc, dt); r->lnout = dev_nan(nc, dt); r->dres = dev_nan(nc, dt);
    r->ddy = dev_nan(nc, dt);
    h = host_rand(C, 0.5f, 1);
    r->w = dev_from(h, C, KDT_F32);
    free(h);
    h = host_rand(C, 0.5f, 0);
    r->b = dev_from(h, C, KDT_F32);
    free(h);
    r->mean = dev_nan(N, KDT_F32); r->rstd = dev_nan(N, KDT_F32);
    r->gw = dev_nan(C, KDT_F32); r->gb = dev_nan(C, KDT_F32);
}

static void rng_bufs_free(rng_bufs *r)
{
    void *all[] = {r->dctr, r->u32, r->qkv, r->out, r->qkvr, r->att, r->scratch, r->dy, r->dqkv,
                   r->dqkvr, r->datt, r->lens, r->lse, r->dscr, r->x, r->y, r->res, r->lnout,
                   r->g1, r->g2, r->dres, r->ddy, r->w, r->b, r->mean, r->rstd, r->gw, r->gb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cudaFree(all[i]);
}

static void op_philox(rng_bufs *r, const philox_stream *s)
{
    cuda_philox_u32(r->u32, s, 1001, 0);
}
static void op_dropout(rng_bufs *r, const philox_stream *s)
{
    cuda_dropout_forward_dt(r->out, r->x, s, P_DROP, (size_t)r->B * r->T * r->C, r->dt, 0);
}
static void op_dropout_bwd(rng_bufs *r, const philox_stream *s)
{
    cuda_dropout_backward(r->out, r->x, s, P_DROP, (size_t)r->B * r->T * r->C, 0);
}
static void op_attn_fwd(rng_bufs *r, const philox_stream *s)
{
    cuda_attention_forward_dt(r->out, r->qkvr, r->att, r->scratch, r->qkv, r->lens, s, P_DROP,
                              r->B, r->T, r->C, r->NH, r->dt, 0);
}
/* qkvr and att as the last op_attn_fwd left them (they do not depend on the
 * mask) */
static void op_attn_bwd(rng_bufs *r, const philox_stream *s)
{
    cuda_attention_backward_dt(r->dqkv, r->dqkvr, r->datt, r->scratch, r->dy, r->qkvr, r->att,
                               r->lens, s, P_DROP, r->B, r->T, r->C, r->NH, r->dt, 0);
}
static void op_ln_fwd(rng_bufs *r, const philox_stream *s)
{
    cuda_residual_dropout_layernorm_forward_dt(r->lnout, r->res, r->mean, r->rstd, r->x, r->y, s,
                                               P_DROP, r->w, r->b, r->B * r->T, r->C, 1e-12f,
                                               r->dt, 0);
}
/* res, mean and rstd as the last op_ln_fwd left them */
static void op_ln_bwd(rng_bufs *r, const philox_stream *s)
{
    TCHECK(cudaMemset(r->gw, 0, r->C * sizeof(float)));
    TCHECK(cudaMemset(r->gb, 0, r->C * sizeof(float)));
    cuda_residual_dropout_layernorm_backward_dt(r->dres, r->ddy, r->gw, r->gb, r->g1, r->g2,
                                                r->res, r->w, r->mean, r->rstd, s, P_DROP,
                                                r->B * r->T, r->C, r->dt, 0);
}
static void op_flash_fwd(rng_bufs *r, const philox_stream *s)
{
    cuda_flash_attention_forward_dt(r->out, r->lse, r->qkv, r->lens, s, P_DROP, r->B, r->T, r->C,
                                    r->NH, r->dt, 0);
}
/* out and lse as the last op_flash_fwd left them */
static void op_flash_bwd(rng_bufs *r, const philox_stream *s)
{
    cuda_flash_attention_backward_dt(r->dqkv, r->dscr, r->dy, r->qkv, r->out, r->lse, r->lens, s,
                                     P_DROP, r->B, r->T, r->C, r->NH, r->dt, 0);
}

static void set_ctr(uint32_t *dctr, uint32_t step, uint32_t micro)
{
    uint32_t c[2] = {step, micro};
    TCHECK(cudaMemcpy(dctr, c, sizeof c, cudaMemcpyHostToDevice));
}

/* Runs op by value with {step 9, micro 2}, then with dev_ctr holding the
 * same, {10, 2} and {9, 3}; out (bytes) is what op writes from the mask,
 * poisoned before each run. */
static void dev_ctr_check(const char *name, rng_bufs *r, void (*op)(rng_bufs *, const philox_stream *),
                          void *out, size_t bytes)
{
    philox_stream rs, rd;
    philox_stream_init(&rs, 0x9E3779B97F4A7C15ull, 1, 9, 2, 3, DROPOUT_SITE_ATTN_PROBS);
    rd = rs;
    rd.ctr[0] = rd.ctr[2] = 0xFFFFFFFFu; // the kernels must take the device's
    rd.dev_ctr = r->dctr;
    unsigned char *got[4];
    const uint32_t ctr[4][2] = {{9, 2}, {9, 2}, {10, 2}, {9, 3}};
    for (int k = 0; k < 4; k++) {
        set_ctr(r->dctr, ctr[k][0], ctr[k][1]);
        TCHECK(cudaMemset(out, 0xFF, bytes));
        op(r, k == 0 ? &rs : &rd);
        got[k] = malloc(bytes);
        TCHECK(cudaMemcpy(got[k], out, bytes, cudaMemcpyDeviceToHost));
    }
    int same = memcmp(got[0], got[1], bytes) == 0;
    int moved = memcmp(got[0], got[2], bytes) != 0 && memcmp(got[0], got[3], bytes) != 0;
    printf("%-4s %-44s %-4s same bits=%d, other step/micro differ=%d\n",
           same && moved ? "ok" : "FAIL", name, kdtype_name(r->dt), same, moved);
    gpu_failures += !(same && moved);
    for (int k = 0; k < 4; k++)
        free(got[k]);
}

static void test_dev_ctr(kdtype dt)
{
    unsigned saved = cuda_levers();
    size_t es = kdtype_size(dt);
    /* T % 4 == 0 (attention draws a Philox group per 4 keys) and T % 4 != 0
     * (one draw per element); head dim 32 so flash attention runs */
    int Ts[2] = {72, 70};
    for (int k = 0; k < 2; k++) {
        rng_bufs r;
        rng_bufs_make(&r, dt, 3, Ts[k], 96, 3);
        size_t nc = (size_t)r.B * r.T * r.C, nq = 3 * nc;
        char name[64];
        if (k == 0) {
            dev_ctr_check("dev_ctr philox_u32", &r, op_philox, r.u32, 1001 * sizeof(uint32_t));
            dev_ctr_check("dev_ctr dropout_forward", &r, op_dropout, r.out, nc * es);
            if (dt == KDT_F32)
                dev_ctr_check("dev_ctr dropout_backward", &r, op_dropout_bwd, r.out, nc * es);
        }
        snprintf(name, sizeof name, "dev_ctr attention_forward T%d", r.T);
        dev_ctr_check(name, &r, op_attn_fwd, r.out, nc * es);
        snprintf(name, sizeof name, "dev_ctr attention_backward T%d", r.T);
        dev_ctr_check(name, &r, op_attn_bwd, r.dqkv, nq * es);
        for (int on = 0; on <= 1; on++) {
            cuda_levers_set(on ? saved | CUDA_LEVER_LN_VEC : saved & ~(unsigned)CUDA_LEVER_LN_VEC);
            snprintf(name, sizeof name, "dev_ctr res_drop_ln fwd C%d ln_vec=%d", r.C, on);
            dev_ctr_check(name, &r, op_ln_fwd, r.lnout, nc * es);
            snprintf(name, sizeof name, "dev_ctr res_drop_ln bwd dy C%d ln_vec=%d", r.C, on);
            dev_ctr_check(name, &r, op_ln_bwd, r.ddy, nc * es);
            cuda_levers_set(on ? saved | CUDA_LEVER_FLASH2 : saved & ~(unsigned)CUDA_LEVER_FLASH2);
            snprintf(name, sizeof name, "dev_ctr flash fwd T%d flash2=%d", r.T, on);
            dev_ctr_check(name, &r, op_flash_fwd, r.out, nc * es);
            snprintf(name, sizeof name, "dev_ctr flash bwd T%d flash2=%d", r.T, on);
            dev_ctr_check(name, &r, op_flash_bwd, r.dqkv, nq * es);
        }
        cuda_levers_set(saved);
        rng_bufs_free(&r);
    }
}

int main(void)
{
    gpu_require_device();
    if (cuda_kernels_init() != 0)
        return 1;
    test_philox();
    kdtype dts[3] = {KDT_F32, KDT_BF16, KDT_F16};
    for (int i = 0; i < 3; i++) {
        kdtype dt = dts[i];
        if (dt == KDT_BF16 && !gpu_has_bf16())
            continue;
        test_embeddings(dt);
        test_ln_levers(dt);
        test_matmul(dt, 37, 72, 101);
        test_matmul(dt, 1024, 768, 3072);
        test_attention(dt, 3, 13, 48, 4, 0.0f);
        test_attention(dt, 2, 70, 64, 2, P_DROP); // T % 4 != 0: per-element Philox
        test_attention(dt, 3, 72, 96, 3, P_DROP); // T % 4 == 0: one Philox group per 4 keys
        test_pointwise(dt);
        test_bias_gelu(dt);
        test_gather(dt);
        test_xent(dt);
        test_dev_ctr(dt);
        test_xent_dev(dt, 1001, 1001);
        test_xent_dev(dt, 1001, 1024); // a vocabulary padded to ld (lever VOCAB_PAD)
        test_emb_dev(dt);
    }
    test_optim(OPTIM_ADAMW, 0);
    test_optim(OPTIM_LAMB, 0);
    test_optim(OPTIM_ADAMW, 1);
    test_optim(OPTIM_LAMB, 1);
    test_optim_deterministic();
    for (int lamb = 0; lamb <= 1; lamb++) {
        optim_kind kind = lamb ? OPTIM_LAMB : OPTIM_ADAMW;
        for (int zero = 0; zero <= 1; zero++) {
            test_optim_dev(kind, KDT_F32, 1.0f, 1.0f, zero);  // clipping active
            test_optim_dev(kind, KDT_BF16, 1.0f, 0.0f, zero); // max_grad_norm 0: no clip
            test_optim_dev(kind, KDT_F16, 1024.0f, 1.0f, zero); // fp16 loss scale
        }
        test_optim_dev(kind, KDT_BF16, 1.0f, 100.0f, 0); // clip factor exactly 1
    }
    TCHECK(cudaDeviceSynchronize());
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown(); /* the CPU stand-in reports device memory left behind */
    return gpu_failures ? 1 : 0;
}
