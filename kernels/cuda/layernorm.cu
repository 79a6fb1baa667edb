/* layernorm — LayerNorm forward/backward on the GPU, one warp per row, fp32
 * statistics; plus the fused residual + dropout + LayerNorm of every
 * post-LN BERT sublayer (forward and backward), and the embedding sum.
 * Parameter gradients reduce per block in shared memory, then one float
 * atomicAdd per block and channel (the order of those few adds may vary from
 * run to run; the value only by rounding).
 */
#include "kernels/cuda/common.cuh"

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
    extern __shared__ float sh[]; // (2,C)
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
    layernorm_backward_kernel<T, FUSED><<<ln_grid(N, backward_blocks()), LN_BLOCK, shmem,
                                          stream>>>(
        (T *)dinp, (T *)dy, dweight, dbias, (const T *)dout, (const T *)dout2, (const T *)inp,
        weight, mean, rstd, d, N, C);
    LAUNCH_CHECK();
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

extern "C" {

void cuda_layernorm_forward_dt(void *out, float *mean, float *rstd, const void *inp,
                               const float *weight, const float *bias, int N, int C, float eps,
                               kdtype dt, cudaStream_t stream)
{
    if (N <= 0)
        return;
    drop_args d = {};
    DT_DISPATCH(dt, layernorm_forward_kernel<T, false><<<ln_grid(N, 1 << 20), LN_BLOCK, 0,
                                                         stream>>>(
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
    DT_DISPATCH(dt, layernorm_forward_kernel<T, true><<<ln_grid(N, 1 << 20), LN_BLOCK, 0,
                                                        stream>>>(
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
    DT_DISPATCH(dt, embeddings_forward_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(
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
    DT_DISPATCH(dt, embeddings_backward_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(
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
