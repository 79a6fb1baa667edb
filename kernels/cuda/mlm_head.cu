/* mlm_head — the MLM head's own ops on the GPU: row gather/scatter of masked
 * positions, softmax cross-entropy (the fp32 twin that keeps probabilities,
 * and the fused one that turns 16-bit logits into losses and, in place,
 * their gradient, so full fp32 logits never exist), and a deterministic sum.
 * One block per vocabulary row; reductions in fp32 registers.
 * The kernels live in mlm_head.cuh (run on the CPU by
 * tests/unit/kernels/test_mlm_head_emu); this file is the host launchers.
 */
#include "kernels/cuda/mlm_head.cuh"

extern "C" {

void cuda_gather_rows_forward_dt(void *out, const void *inp, const int32_t *rows, int M, int C,
                                 kdtype dt, cudaStream_t stream)
{
    size_t n = (size_t)M * C;
    if (!n)
        return;
    DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, gather_rows_kernel<T>)(
                        (T *)out, (const T *)inp, rows, M, C));
    LAUNCH_CHECK();
}

void cuda_gather_rows_backward_dt(void *dinp, const void *dout, const int32_t *rows, int M,
                                  int C, kdtype dt, cudaStream_t stream)
{
    size_t n = (size_t)M * C;
    if (!n)
        return;
    if (dt == KDT_F32)
        KLAUNCH(grid_for(n, 256), 256, 0, stream, scatter_rows_atomic_kernel)(
            (float *)dinp, (const float *)dout, rows, M, C);
    else
        DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, scatter_rows_kernel<T>)(
                            (T *)dinp, (const T *)dout, rows, M, C));
    LAUNCH_CHECK();
}

void cuda_mlm_xent_fused_ld_dt(float *losses, void *logits, const int32_t *targets,
                               float grad_scale, int M, int V, int ld, kdtype dt,
                               cudaStream_t stream)
{
    if (M <= 0)
        return;
    if (grad_scale != 0.0f)
        DT_DISPATCH(dt, (KLAUNCH(M, XENT_BLOCK, 0, stream, xent_kernel<T, false, true>)(
                            losses, nullptr, (T *)logits, targets, grad_scale, V, ld)));
    else
        DT_DISPATCH(dt, (KLAUNCH(M, XENT_BLOCK, 0, stream, xent_kernel<T, false, false>)(
                            losses, nullptr, (T *)logits, targets, 0.0f, V, ld)));
    LAUNCH_CHECK();
}

void cuda_mlm_xent_fused_dt(float *losses, void *logits, const int32_t *targets, float grad_scale,
                            int M, int V, kdtype dt, cudaStream_t stream)
{
    cuda_mlm_xent_fused_ld_dt(losses, logits, targets, grad_scale, M, V, V, dt, stream);
}

void cuda_mlm_xent_fused_ld_dev(float *losses, void *logits, const int32_t *targets,
                                const float *dgrad_scale, int M, int V, int ld, kdtype dt,
                                cudaStream_t stream)
{
    if (M <= 0)
        return;
    DT_DISPATCH(dt, KLAUNCH(M, XENT_BLOCK, 0, stream, xent_dev_kernel<T>)(
                        losses, (T *)logits, targets, dgrad_scale, V, ld));
    LAUNCH_CHECK();
}

void cuda_mlm_xent_fused_dev(float *losses, void *logits, const int32_t *targets,
                             const float *dgrad_scale, int M, int V, kdtype dt,
                             cudaStream_t stream)
{
    cuda_mlm_xent_fused_ld_dev(losses, logits, targets, dgrad_scale, M, V, V, dt, stream);
}

void cuda_sum(float *out, const float *x, int n, cudaStream_t stream)
{
    KLAUNCH(1, 1024, 0, stream, sum_kernel)(out, x, n);
    LAUNCH_CHECK();
}

/* ---- fp32 twins ---- */
void cuda_gather_rows_forward(float *out, const float *inp, const int32_t *rows, int M, int C,
                              cudaStream_t stream)
{
    cuda_gather_rows_forward_dt(out, inp, rows, M, C, KDT_F32, stream);
}

void cuda_gather_rows_backward(float *dinp, const float *dout, const int32_t *rows, int M, int C,
                               cudaStream_t stream)
{
    cuda_gather_rows_backward_dt(dinp, dout, rows, M, C, KDT_F32, stream);
}

void cuda_crossentropy_softmax_forward(float *losses, float *probs, const float *logits,
                                       const int32_t *targets, int M, int V, cudaStream_t stream)
{
    if (M <= 0)
        return;
    /* logits are only read on this path (GRAD off) */
    KLAUNCH(M, XENT_BLOCK, 0, stream, xent_kernel<float, true, false>)(
        losses, probs, const_cast<float *>(logits), targets, 0.0f, V, V);
    LAUNCH_CHECK();
}

void cuda_crossentropy_softmax_backward(float *dlogits, const float *probs,
                                        const int32_t *targets, const float *dlosses, int M,
                                        int V, cudaStream_t stream)
{
    if (M <= 0)
        return;
    KLAUNCH(M, 256, 0, stream, xent_backward_kernel)(dlogits, probs, targets, dlosses, V);
    LAUNCH_CHECK();
}

} // extern "C"
