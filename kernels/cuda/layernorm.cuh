/* layernorm.cuh — the device code of kernels/cuda/layernorm.cu (the
 * LayerNorm, fused residual+dropout+LayerNorm and embedding kernels, their
 * dropout helper and the launch geometry), kept apart from the host launchers
 * so that tests/unit/kernels/test_layernorm_emu can compile these very lines
 * on the CPU under the SIMT emulator (tests/unit/kernels/cuda_emu.h) and run
 * them without a GPU. Private to kernels/cuda/layernorm.cu (and that test).
 */
#ifndef BERTD_KERNELS_CUDA_LAYERNORM_CUH
#define BERTD_KERNELS_CUDA_LAYERNORM_CUH

#include "kernels/cuda/common.cuh"

/* the block's dynamic shared memory (the emulator supplies its own) */
#ifndef KERNEL_DYN_SMEM
#define KERNEL_DYN_SMEM(T, name) extern __shared__ T name[]
#endif

namespace {


constexpr int LN_BLOCK = 256; // 8 warps, one row each at a time

struct drop_args {
    philox_dev s;
    uint32_t thresh;
    float keep_scale;
    int on;
};

static drop_args make_drop(const philox_stream *rng, float p)
{
    drop_args d = {};
    d.on = rng && p > 0.0f;
    if (d.on) {
        d.s = philox_dev_from(rng);
        d.thresh = dropout_threshold(p);
        d.keep_scale = (float)(1.0 / (1.0 - (double)p));
    }
    return d;
}

__device__ __forceinline__ float drop_mul(const drop_args &d, size_t idx)
{
    if (!d.on)
        return 1.0f;
    return philox_u32(d.s, idx) >= d.thresh ? d.keep_scale : 0.0f;
}

/* RES: res = x + dropout(y) is formed, stored, and normalized; else inp = x. */
template <typename T, bool RES>
__global__ void __launch_bounds__(LN_BLOCK)
layernorm_forward_kernel(T *out, T *res, float *mean, float *rstd, const T *x, const T *y,
                         drop_args d, const float *weight, const float *bias, int N, int C,
                         float eps)
{
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        size_t base = (size_t)row * C;
        const T *src = x + base;
        float sum = 0.0f;
        if (RES) {
            for (int c = lane; c < C; c += 32) {
                float v = to_f(x[base + c]) + to_f(y[base + c]) * drop_mul(d, base + c);
                T vt = from_f<T>(v);
                res[base + c] = vt;
                sum += to_f(vt); // statistics of what backward will read
            }
            src = res + base;
        } else {
            for (int c = lane; c < C; c += 32)
                sum += to_f(src[c]);
        }
        float m = warp_sum(sum) / C;
        float var = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float dv = to_f(src[c]) - m;
            var += dv * dv;
        }
        float s = rsqrtf(warp_sum(var) / C + eps);
        for (int c = lane; c < C; c += 32)
            out[base + c] = from_f<T>((to_f(src[c]) - m) * s * weight[c] + bias[c]);
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = s;
        }
    }
}

/* g = dout (+ dout2); dinp = LN backward of g; FUSED: dy = dinp * mask.
 * shared: 2*C floats for the dweight/dbias partials of this block. */
template <typename T, bool FUSED>
__global__ void __launch_bounds__(LN_BLOCK)
layernorm_backward_kernel(T *dinp, T *dy, float *dweight, float *dbias, const T *dout,
                          const T *dout2, const T *inp, const float *weight, const float *mean,
                          const float *rstd, drop_args d, int N, int C)
{
    KERNEL_DYN_SMEM(float, sh); // (2,C)
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x)
        sh[c] = 0.0f;
    __syncthreads();
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        size_t base = (size_t)row * C;
        float m = mean[row], s = rstd[row];
        float a = 0.0f, b = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float g = to_f(dout[base + c]) + (dout2 ? to_f(dout2[base + c]) : 0.0f);
            float xhat = (to_f(inp[base + c]) - m) * s;
            float dn = weight[c] * g;
            a += dn;
            b += dn * xhat;
            atomicAdd(&sh[c], xhat * g);
            atomicAdd(&sh[C + c], g);
        }
        a = warp_sum(a) / C;
        b = warp_sum(b) / C;
        for (int c = lane; c < C; c += 32) {
            float g = to_f(dout[base + c]) + (dout2 ? to_f(dout2[base + c]) : 0.0f);
            float xhat = (to_f(inp[base + c]) - m) * s;
            float di = (weight[c] * g - a - xhat * b) * s;
            dinp[base + c] = from_f<T>(di);
            if (FUSED)
                dy[base + c] = from_f<T>(di * drop_mul(d, base + c));
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        atomicAdd(&dweight[c], sh[c]);
        atomicAdd(&dbias[c], sh[C + c]);
    }
}

static unsigned ln_grid(int N, int max_blocks)
{
    int warps = LN_BLOCK / 32;
    int g = (N + warps - 1) / warps;
    return (unsigned)(g < max_blocks ? (g ? g : 1) : max_blocks);
}

template <typename T>
__global__ void embeddings_forward_kernel(T *out, const int32_t *inp, const int32_t *tok_type,
                                          const float *wte, const float *wpe, const float *wtt,
                                          int BT, int T_, int C)
{
    size_t n = (size_t)BT * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_);
        out[i] = from_f<T>(wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c] +
                           wtt[(size_t)tok_type[bt] * C + c]);
    }
}

template <typename T>
__global__ void embeddings_backward_kernel(float *dwte, float *dwpe, float *dwtt, const T *dout,
                                           const int32_t *inp, const int32_t *tok_type, int BT,
                                           int T_, int C)
{
    size_t n = (size_t)BT * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_);
        float d = to_f(dout[i]);
        atomicAdd(&dwte[(size_t)inp[bt] * C + c], d);
        atomicAdd(&dwpe[(size_t)t * C + c], d);
        atomicAdd(&dwtt[(size_t)tok_type[bt] * C + c], d);
    }
}

} // namespace

#endif
