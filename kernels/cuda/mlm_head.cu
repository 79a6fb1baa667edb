/* mlm_head — the MLM head's own ops on the GPU: row gather/scatter of masked
 * positions, softmax cross-entropy (the fp32 twin that keeps probabilities,
 * and the fused one that turns 16-bit logits into losses and, in place,
 * their gradient, so full fp32 logits never exist), and a deterministic sum.
 * One block per vocabulary row; reductions in fp32 registers.
 */
#include "kernels/cuda/common.cuh"

#include <math.h>

namespace {

constexpr int XENT_BLOCK = 512;

template <typename T>
__global__ void gather_rows_kernel(T *out, const T *inp, const int32_t *rows, int M, int C)
{
    size_t n = (size_t)M * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / C;
        out[i] = inp[(size_t)rows[m] * C + i % C];
    }
}

__global__ void scatter_rows_atomic_kernel(float *dinp, const float *dout, const int32_t *rows,
                                           int M, int C)
{
    size_t n = (size_t)M * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&dinp[(size_t)rows[i / C] * C + i % C], dout[i]);
}

/* distinct rows only: no two threads ever touch one element */
template <typename T>
__global__ void scatter_rows_kernel(T *dinp, const T *dout, const int32_t *rows, int M, int C)
{
    size_t n = (size_t)M * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t j = (size_t)rows[i / C] * C + i % C;
        dinp[j] = from_f<T>(to_f(dinp[j]) + to_f(dout[i]));
    }
}

/* One block per row: max, sum of exp, loss; PROBS writes probabilities,
 * GRAD overwrites the logits with (softmax - onehot) * grad_scale. */
template <typename T, bool PROBS, bool GRAD>
__global__ void __launch_bounds__(XENT_BLOCK)
xent_kernel(float *losses, float *probs, T *logits, const int32_t *targets, float grad_scale,
            int V)
{
    __shared__ float sh[32];
    int m = blockIdx.x;
    T *l = logits + (size_t)m * V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, to_f(l[v]));
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        sum += expf(to_f(l[v]) - mx);
    sum = block_sum(sum, sh);
    int tgt = targets[m];
    float lt = to_f(l[tgt]); // read before any thread overwrites it
    __syncthreads();
    if (threadIdx.x == 0)
        losses[m] = logf(sum) - (lt - mx);
    float inv = 1.0f / sum;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float pr = expf(to_f(l[v]) - mx) * inv;
        if (PROBS)
            probs[(size_t)m * V + v] = pr;
        if (GRAD)
            l[v] = from_f<T>((pr - (v == tgt ? 1.0f : 0.0f)) * grad_scale);
    }
}

__global__ void xent_backward_kernel(float *dlogits, const float *probs, const int32_t *targets,
                                     const float *dlosses, int V)
{
    int m = blockIdx.x;
    float g = dlosses[m];
    int tgt = targets[m];
    const float *pr = probs + (size_t)m * V;
    float *d = dlogits + (size_t)m * V;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        d[v] = pr[v] * g - (v == tgt ? g : 0.0f);
}

__global__ void __launch_bounds__(1024) sum_kernel(float *out, const float *x, int n)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += x[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0)
        *out = (float)s;
}

} // namespace

extern "C" {

void cuda_gather_rows_forward_dt(void *out, const void *inp, const int32_t *rows, int M, int C,
                                 kdtype dt, cudaStream_t stream)
{
    size_t n = (size_t)M * C;
    if (!n)
        return;
    DT_DISPATCH(dt, gather_rows_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(
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
        scatter_rows_atomic_kernel<<<grid_for(n, 256), 256, 0, stream>>>(
            (float *)dinp, (const float *)dout, rows, M, C);
    else
        DT_DISPATCH(dt, scatter_rows_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(
                            (T *)dinp, (const T *)dout, rows, M, C));
    LAUNCH_CHECK();
}

void cuda_mlm_xent_fused_dt(float *losses, void *logits, const int32_t *targets, float grad_scale,
                            int M, int V, kdtype dt, cudaStream_t stream)
{
    if (M <= 0)
        return;
    if (grad_scale != 0.0f)
        DT_DISPATCH(dt, (xent_kernel<T, false, true><<<M, XENT_BLOCK, 0, stream>>>(
                            losses, nullptr, (T *)logits, targets, grad_scale, V)));
    else
        DT_DISPATCH(dt, (xent_kernel<T, false, false><<<M, XENT_BLOCK, 0, stream>>>(
                            losses, nullptr, (T *)logits, targets, 0.0f, V)));
    LAUNCH_CHECK();
}

void cuda_sum(float *out, const float *x, int n, cudaStream_t stream)
{
    sum_kernel<<<1, 1024, 0, stream>>>(out, x, n);
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
    xent_kernel<float, true, false><<<M, XENT_BLOCK, 0, stream>>>(
        losses, probs, const_cast<float *>(logits), targets, 0.0f, V);
    LAUNCH_CHECK();
}

void cuda_crossentropy_softmax_backward(float *dlogits, const float *probs,
                                        const int32_t *targets, const float *dlosses, int M,
                                        int V, cudaStream_t stream)
{
    if (M <= 0)
        return;
    xent_backward_kernel<<<M, 256, 0, stream>>>(dlogits, probs, targets, dlosses, V);
    LAUNCH_CHECK();
}

} // extern "C"
