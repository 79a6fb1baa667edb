/* mlm_head.cuh — the device code of kernels/cuda/mlm_head.cu (row
 * gather/scatter, the softmax cross-entropy kernels, the deterministic sum),
 * kept apart from the host launchers so that
 * tests/unit/kernels/test_mlm_head_emu can compile these very lines on the
 * CPU under the SIMT emulator (tests/unit/kernels/cuda_emu.h) and run them
 * without a GPU. Private to kernels/cuda/mlm_head.cu (and that test).
 */
#ifndef BERTD_KERNELS_CUDA_MLM_HEAD_CUH
#define BERTD_KERNELS_CUDA_MLM_HEAD_CUH

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

/* fp32 dinp[rows[m]] += dout[m]. Deterministic in the trainer although it
 * uses float atomics: the MLM positions it scatters are distinct (the loader
 * picks them from a bitmap, worker/loop.c keeps each once), so every element
 * gets exactly one add, and the CLS rows are another launch, in stream
 * order. Even a row given twice onto zeros would not vary (0 + a + b and
 * 0 + b + a are both exactly the one rounding of a + b); a row given three
 * times or more would sum in an order that scheduling decides. */
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

/* One block per row of ld >= V logits (ld > V: a padded vocabulary whose
 * columns V..ld-1 are not part of the softmax): max, sum of exp, loss;
 * PROBS writes probabilities (rows of V), GRAD overwrites the logits with
 * (softmax - onehot) * grad_scale and the padding columns with 0.
 * A target < 0 is a padding row (M padded up to a fixed size): loss 0,
 * PROBS a row of 0, GRAD a row of exact 0 (all ld columns); its logits are
 * not read. sh: 32 floats of shared memory. */
template <typename T, bool PROBS, bool GRAD>
__device__ __forceinline__ void xent_row(float *sh, float *losses, float *probs, T *logits,
                                         const int32_t *targets, float grad_scale, int V, int ld)
{
    int m = blockIdx.x;
    T *l = logits + (size_t)m * ld;
    int tgt = targets[m];
    if (tgt < 0) { // the same for every thread of the block
        if (threadIdx.x == 0)
            losses[m] = 0.0f;
        if (PROBS)
            for (int v = threadIdx.x; v < V; v += blockDim.x)
                probs[(size_t)m * V + v] = 0.0f;
        if (GRAD)
            for (int v = threadIdx.x; v < ld; v += blockDim.x)
                l[v] = from_f<T>(0.0f);
        return;
    }
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, to_f(l[v]));
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        sum += expf(to_f(l[v]) - mx);
    sum = block_sum(sum, sh);
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
    if (GRAD)
        for (int v = V + threadIdx.x; v < ld; v += blockDim.x)
            l[v] = from_f<T>(0.0f);
}

template <typename T, bool PROBS, bool GRAD>
__global__ void __launch_bounds__(XENT_BLOCK)
xent_kernel(float *losses, float *probs, T *logits, const int32_t *targets, float grad_scale,
            int V, int ld)
{
    __shared__ float sh[32];
    xent_row<T, PROBS, GRAD>(sh, losses, probs, logits, targets, grad_scale, V, ld);
}

/* The fused loss with the gradient scale read from device memory when the
 * kernel runs (a captured graph replays with its step's scale): the same
 * rows as xent_kernel<T, false, GRAD> with GRAD = (*dgrad_scale != 0). */
template <typename T>
__global__ void __launch_bounds__(XENT_BLOCK)
xent_dev_kernel(float *losses, T *logits, const int32_t *targets, const float *dgrad_scale,
                int V, int ld)
{
    __shared__ float sh[32];
    float gs = *dgrad_scale;
    if (gs != 0.0f)
        xent_row<T, false, true>(sh, losses, nullptr, logits, targets, gs, V, ld);
    else
        xent_row<T, false, false>(sh, losses, nullptr, logits, targets, 0.0f, V, ld);
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

#endif
