/* layernorm — LayerNorm forward/backward on the GPU, one warp per row, fp32
 * statistics; plus the fused residual + dropout + LayerNorm of every
 * post-LN BERT sublayer (forward and backward), and the embedding sum.
 * Parameter gradients reduce per block in shared memory, then one float
 * atomicAdd per block and channel (the order of those few adds may vary from
 * run to run; the value only by rounding).
 * The kernels live in layernorm.cuh (run on the CPU by
 * tests/unit/kernels/test_layernorm_emu); this file is the host launchers.
 */
#include "kernels/cuda/layernorm.cuh"

namespace {

/* Backward grids are capped so that the per-block atomics stay few. */
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
    size_t shmem = 2 * (size_t)C * sizeof(float);
    if (shmem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<T, FUSED>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
    KLAUNCH(ln_grid(N, backward_blocks()), LN_BLOCK, shmem, stream, layernorm_backward_kernel<T, FUSED>)(
        (T *)dinp, (T *)dy, dweight, dbias, (const T *)dout, (const T *)dout2, (const T *)inp,
        weight, mean, rstd, d, N, C);
    LAUNCH_CHECK();
}

} // namespace

extern "C" {

void cuda_layernorm_forward_dt(void *out, float *mean, float *rstd, const void *inp,
                               const float *weight, const float *bias, int N, int C, float eps,
                               kdtype dt, cudaStream_t stream)
{
    if (N <= 0)
        return;
    drop_args d = {};
    DT_DISPATCH(dt, KLAUNCH(ln_grid(N, 1 << 20), LN_BLOCK, 0, stream, layernorm_forward_kernel<T, false>)(
                        (T *)out, nullptr, mean, rstd, (const T *)inp, nullptr, d, weight, bias,
                        N, C, eps));
    LAUNCH_CHECK();
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
    DT_DISPATCH(dt, KLAUNCH(ln_grid(N, 1 << 20), LN_BLOCK, 0, stream, layernorm_forward_kernel<T, true>)(
                        (T *)out, (T *)res, mean, rstd, (const T *)x, (const T *)y, d, weight,
                        bias, N, C, eps));
    LAUNCH_CHECK();
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

void cuda_embeddings_backward_dt(float *dwte, float *dwpe, float *dwtt, const void *dout,
                                 const int32_t *inp, const int32_t *tok_type, int B, int T_,
                                 int C, kdtype dt, cudaStream_t stream)
{
    size_t n = (size_t)B * T_ * C;
    if (!n)
        return;
    DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, embeddings_backward_kernel<T>)(
                        dwte, dwpe, dwtt, (const T *)dout, inp, tok_type, B * T_, T_, C));
    LAUNCH_CHECK();
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
