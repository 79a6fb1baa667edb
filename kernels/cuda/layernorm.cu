/* layernorm — LayerNorm forward/backward on the GPU, one warp per row, fp32
 * statistics; plus the fused residual + dropout + LayerNorm of every
 * post-LN BERT sublayer (forward and backward), and the embedding sum.
 * The row kernels have a vectorized form (lever CUDA_LEVER_LN_VEC,
 * layernorm.cuh), taken per call where it fits.
 * Parameter gradients (LayerNorm weight/bias, embeddings) are summed in a
 * fixed order, never with float atomics, so their bits do not depend on
 * scheduling: a job resumed from a checkpoint ends bit-identical to an
 * uninterrupted one (docs/cuda.md, "Deterministic gradients").
 * The kernels live in layernorm.cuh (run on the CPU by
 * tests/unit/kernels/test_layernorm_emu); this file is the host launchers.
 */
#include "kernels/cuda/layernorm.cuh"

namespace {

/* Backward grids are capped: a block strides over rows. */
static int backward_blocks(void)
{
    int dev = 0, sms = 80;
    if (cudaGetDevice(&dev) == cudaSuccess)
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return 4 * sms;
}

template <typename T, bool FUSED>
void ln_backward_launch(void *dinp, void *dy, float *dweight, float *dbias, const void *dout,
                        const void *dout2, const void *inp, const float *weight,
                        const float *mean, const float *rstd, drop_args d, int N, int C,
                        cudaStream_t stream)
{
    unsigned grid = ln_grid(N, backward_blocks());
    if ((cuda_levers() & CUDA_LEVER_LN_VEC) && ln_vec_fits<T>(C, dinp, dy, dout, dout2, inp))
        KLAUNCH(grid, LN_BLOCK, 0, stream, layernorm_backward_vec_kernel<T, FUSED>)(
            (T *)dinp, (T *)dy, (const T *)dout, (const T *)dout2, (const T *)inp, weight, mean,
            rstd, d, N, C);
    else
        KLAUNCH(grid, LN_BLOCK, 0, stream, layernorm_backward_kernel<T, FUSED>)(
            (T *)dinp, (T *)dy, (const T *)dout, (const T *)dout2, (const T *)inp, weight, mean,
            rstd, d, N, C);
    LAUNCH_CHECK();
    float *partial = nullptr; // (2, COLSUM_CHUNKS, C), stream-ordered
    CUDA_CHECK(cudaMallocAsync((void **)&partial, 2 * (size_t)COLSUM_CHUNKS * C * 4, stream));
    KLAUNCH(dim3((C + 31) / 32, COLSUM_CHUNKS), dim3(32, COLSUM_PHASES), 0, stream,
            layernorm_param_backward_kernel<T>)(partial, (const T *)dout, (const T *)dout2,
                                                (const T *)inp, mean, rstd, N, C);
    LAUNCH_CHECK();
    KLAUNCH((C + 255) / 256, 256, 0, stream, colsum_finish_kernel)(dweight, dbias, partial, C);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(partial, stream));
}

template <typename T, bool RES>
void ln_forward_launch(void *out, void *res, float *mean, float *rstd, const void *x,
                       const void *y, drop_args d, const float *weight, const float *bias, int N,
                       int C, float eps, cudaStream_t stream)
{
    unsigned grid = ln_grid(N, 1 << 20);
    if ((cuda_levers() & CUDA_LEVER_LN_VEC) && ln_vec_fits<T>(C, out, res, x, y))
        KLAUNCH(grid, LN_BLOCK, 0, stream, layernorm_forward_vec_kernel<T, RES>)(
            (T *)out, (T *)res, mean, rstd, (const T *)x, (const T *)y, d, weight, bias, N, C, eps);
    else
        KLAUNCH(grid, LN_BLOCK, 0, stream, layernorm_forward_kernel<T, RES>)(
            (T *)out, (T *)res, mean, rstd, (const T *)x, (const T *)y, d, weight, bias, N, C, eps);
    LAUNCH_CHECK();
}

} // namespace

extern "C" {

int cuda_layernorm_vectorized(int C, kdtype dt)
{
    int fits = 0;
    DT_DISPATCH(dt, fits = ln_vec_fits<T>(C, nullptr));
    return (cuda_levers() & CUDA_LEVER_LN_VEC) && fits;
}

void cuda_layernorm_forward_dt(void *out, float *mean, float *rstd, const void *inp,
                               const float *weight, const float *bias, int N, int C, float eps,
                               kdtype dt, cudaStream_t stream)
{
    if (N <= 0)
        return;
    drop_args d = {};
    DT_DISPATCH(dt, (ln_forward_launch<T, false>(out, nullptr, mean, rstd, inp, nullptr, d, weight,
                                                 bias, N, C, eps, stream)));
}

void cuda_layernorm_backward_dt(void *dinp, float *dweight, float *dbias, const void *dout,
                                const void *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C, kdtype dt, cudaStream_t stream)
{
    if (N <= 0)
        return;
    drop_args d = {};
    DT_DISPATCH(dt, (ln_backward_launch<T, false>(dinp, nullptr, dweight, dbias, dout, nullptr,
                                                  inp, weight, mean, rstd, d, N, C, stream)));
}

void cuda_residual_dropout_layernorm_forward_dt(void *out, void *res, float *mean, float *rstd,
                                                const void *x, const void *y,
                                                const philox_stream *rng, float p,
                                                const float *weight, const float *bias, int N,
                                                int C, float eps, kdtype dt, cudaStream_t stream)
{
    if (N <= 0)
        return;
    drop_args d = make_drop(rng, p);
    DT_DISPATCH(dt, (ln_forward_launch<T, true>(out, res, mean, rstd, x, y, d, weight, bias, N, C,
                                                eps, stream)));
}

void cuda_residual_dropout_layernorm_backward_dt(void *dres, void *dy, float *dweight,
                                                 float *dbias, const void *dout,
                                                 const void *dout2, const void *res,
                                                 const float *weight, const float *mean,
                                                 const float *rstd, const philox_stream *rng,
                                                 float p, int N, int C, kdtype dt,
                                                 cudaStream_t stream)
{
    if (N <= 0)
        return;
    drop_args d = make_drop(rng, p);
    DT_DISPATCH(dt, (ln_backward_launch<T, true>(dres, dy, dweight, dbias, dout, dout2, res,
                                                 weight, mean, rstd, d, N, C, stream)));
}

void cuda_embeddings_forward_dt(void *out, const int32_t *inp, const int32_t *tok_type,
                                const float *wte, const float *wpe, const float *wtt, int B,
                                int T_, int C, kdtype dt, cudaStream_t stream)
{
    size_t n = (size_t)B * T_ * C;
    if (!n)
        return;
    DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, embeddings_forward_kernel<T>)(
                        (T *)out, inp, tok_type, wte, wpe, wtt, B * T_, T_, C));
    LAUNCH_CHECK();
}

int cuda_embeddings_order(int32_t *order, int32_t *seg, const int32_t *ids, int N, int V)
{
    return emb_order(order, seg, ids, N, V);
}

/* The position and token-type rows of the embedding backward (the word
 * rows are the caller's launch). */
static void emb_wpe_wtt_backward(float *dwpe, float *dwtt, const void *dout,
                                 const int32_t *tok_type, int B, int T_, int C, int TV, kdtype dt,
                                 cudaStream_t stream)
{
    unsigned ctiles = (unsigned)(C + 31) / 32;
    DT_DISPATCH(dt, KLAUNCH(dim3((unsigned)T_, ctiles), dim3(32, EMB_PHASES), 0, stream,
                            embeddings_wpe_backward_kernel<T>)(dwpe, (const T *)dout, B, T_, C));
    LAUNCH_CHECK();
    if (TV > 0) {
        DT_DISPATCH(dt, KLAUNCH(dim3((unsigned)TV, ctiles), dim3(32, TT_PHASES), 0, stream,
                                embeddings_wtt_backward_kernel<T>)(dwtt, (const T *)dout, tok_type,
                                                                   B * T_, C));
        LAUNCH_CHECK();
    }
}

void cuda_embeddings_backward_ordered_dt(float *dwte, float *dwpe, float *dwtt, const void *dout,
                                         const int32_t *inp, const int32_t *tok_type,
                                         const int32_t *order, const int32_t *seg, int U, int B,
                                         int T_, int C, int TV, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0 || C <= 0)
        return;
    if (U > 0) {
        dim3 grid((unsigned)U, (unsigned)(C + EMB_COLS - 1) / EMB_COLS);
        DT_DISPATCH(dt, KLAUNCH(grid, dim3(32, EMB_PHASES), 0, stream, embeddings_wte_backward_kernel<T>)(
                            dwte, (const T *)dout, inp, order, seg, C));
        LAUNCH_CHECK();
    }
    emb_wpe_wtt_backward(dwpe, dwtt, dout, tok_type, B, T_, C, TV, dt, stream);
}

void cuda_embeddings_backward_ordered_dev(float *dwte, float *dwpe, float *dwtt,
                                          const void *dout, const int32_t *inp,
                                          const int32_t *tok_type, const int32_t *order,
                                          const int32_t *seg, const int32_t *dU, int Umax, int B,
                                          int T_, int C, int TV, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0 || C <= 0)
        return;
    if (Umax > 0) {
        dim3 grid((unsigned)Umax, (unsigned)(C + EMB_COLS - 1) / EMB_COLS);
        DT_DISPATCH(dt, KLAUNCH(grid, dim3(32, EMB_PHASES), 0, stream,
                                embeddings_wte_backward_dev_kernel<T>)(
                            dwte, (const T *)dout, inp, order, seg, dU, C));
        LAUNCH_CHECK();
    }
    emb_wpe_wtt_backward(dwpe, dwtt, dout, tok_type, B, T_, C, TV, dt, stream);
}

void cuda_embeddings_backward_dt(float *dwte, float *dwpe, float *dwtt, const void *dout,
                                 const int32_t *inp, const int32_t *tok_type, int B, int T_,
                                 int C, kdtype dt, cudaStream_t stream)
{
    size_t N = (size_t)B * T_;
    if (!N || C <= 0)
        return;
    /* the order the trainer uploads with its batch, made here from a copy
     * of the ids: synchronous, for tests and one-off callers */
    int32_t *h = (int32_t *)malloc(N * 2 * sizeof *h), *hord = (int32_t *)malloc((2 * N + 1) * 4);
    if (!h || !hord) {
        fprintf(stderr, "cuda_embeddings_backward: out of host memory\n");
        abort();
    }
    CUDA_CHECK(cudaMemcpyAsync(h, inp, N * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(h + N, tok_type, N * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    int V = 1, TV = 1;
    for (size_t i = 0; i < N; i++) {
        V = h[i] >= V ? h[i] + 1 : V;
        TV = h[N + i] >= TV ? h[N + i] + 1 : TV;
    }
    int U = cuda_embeddings_order(hord, hord + N, h, (int)N, V);
    if (U < 0) {
        fprintf(stderr, "cuda_embeddings_backward: cannot order the token ids: %d\n", U);
        abort();
    }
    int32_t *dord = nullptr;
    CUDA_CHECK(cudaMalloc((void **)&dord, (2 * N + 1) * 4));
    CUDA_CHECK(cudaMemcpyAsync(dord, hord, (N + (size_t)U + 1) * 4, cudaMemcpyHostToDevice, stream));
    cuda_embeddings_backward_ordered_dt(dwte, dwpe, dwtt, dout, inp, tok_type, dord, dord + N, U,
                                        B, T_, C, TV, dt, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaFree(dord));
    free(h);
    free(hord);
}

/* ---- fp32 twins ---- */
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps,
                            cudaStream_t stream)
{
    cuda_layernorm_forward_dt(out, mean, rstd, inp, weight, bias, N, C, eps, KDT_F32, stream);
}
void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C, cudaStream_t stream)
{
    cuda_layernorm_backward_dt(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                               KDT_F32, stream);
}
void cuda_embeddings_forward(float *out, const int32_t *inp, const int32_t *tok_type,
                             const float *wte, const float *wpe, const float *wtt, int B, int T,
                             int C, cudaStream_t stream)
{
    cuda_embeddings_forward_dt(out, inp, tok_type, wte, wpe, wtt, B, T, C, KDT_F32, stream);
}
void cuda_embeddings_backward(float *dwte, float *dwpe, float *dwtt, const float *dout,
                              const int32_t *inp, const int32_t *tok_type, int B, int T, int C,
                              cudaStream_t stream)
{
    cuda_embeddings_backward_dt(dwte, dwpe, dwtt, dout, inp, tok_type, B, T, C, KDT_F32, stream);
}

} // extern "C"
