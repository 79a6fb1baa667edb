/* test_kernels_cuda — every CUDA op against its CPU reference (kernels/cpu,
 * worker/optim.c) on fresh random inputs, in fp32, bf16 and fp16, with
 * NaN-poisoned outputs and the tolerance rule of gpu_check.h (fp32 1e-5,
 * 16-bit 1e-2, normwise relative). Dropout masks must match the CPU's
 * exactly (Philox bit-identity). Exits 77 without a GPU.
 *
 * Shapes are small and deliberately not multiples of 4, 8 or 32 (T = 13,
 * V = 1001) so tails, unaligned packs and partial warps are exercised, plus
 * one BERT-base-sized GEMM and LayerNorm so multi-block paths run too.
 */
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
    }
    test_optim(OPTIM_ADAMW, 0);
    test_optim(OPTIM_LAMB, 0);
    test_optim(OPTIM_ADAMW, 1);
    test_optim(OPTIM_LAMB, 1);
    test_optim_deterministic();
    TCHECK(cudaDeviceSynchronize());
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown(); /* the CPU stand-in reports device memory left behind */
    return gpu_failures ? 1 : 0;
}
