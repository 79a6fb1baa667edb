/* attention — self-attention on the GPU as two strided-batched cuBLAS GEMMs
 * per direction around one fused kernel (scale, key-padding mask, softmax,
 * Philox dropout) per direction. q, k, v are first regrouped per head so every
 * (b, h) pair is one matrix at a fixed stride:
 *   S  = Q K^T             (B*NH, T, T)   GEMM
 *   P  = softmax(scale*S)  masked, saved  fused kernel, also Pd = dropout(P)
 *   Y  = Pd V              (B*NH, T, hs)  GEMM, then back to (B, T, C)
 * Dropout element (b, h, i, j) draws Philox index ((b*NH+h)*T+i)*T+j, as the
 * CPU op does, so masks are bit-identical. Masked keys get exactly 0.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

#include <math.h>

namespace {

__device__ __forceinline__ int key_len(const int32_t *seq_lens, int b, int T)
{
    int n = seq_lens ? seq_lens[b] : T;
    return n < 1 ? 1 : (n > T ? T : n);
}

/* qkv (B,T,3,NH,hs) -> qkvr (3,B,NH,T,hs); reverse when BACK (then the
 * (3,B,NH,T,hs) input is written to (B,T,3,NH,hs)). parts = 3 or 1. */
template <typename T, bool BACK>
__global__ void permute_kernel(T *dst, const T *src, int B, int T_, int NH, int hs, int parts)
{
    size_t n = (size_t)parts * B * NH * T_ * hs;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        // idx walks the (parts,B,NH,T,hs) layout
        int d = (int)(idx % hs);
        size_t r = idx / hs;
        int t = (int)(r % T_);
        r /= T_;
        int h = (int)(r % NH);
        r /= NH;
        int b = (int)(r % B);
        int part = (int)(r / B);
        size_t flat = (((size_t)b * T_ + t) * parts + part) * NH * hs + (size_t)h * hs + d;
        if (BACK)
            dst[flat] = src[idx];
        else
            dst[idx] = src[flat];
    }
}

/* One warp per row (b, h, i) of scores. In place: att = P. pd = dropout(P)
 * when drop (pd may then alias nothing else). */
template <typename T>
__global__ void softmax_forward_kernel(T *att, T *pd, const int32_t *seq_lens, float scale,
                                       philox_dev s, uint32_t thresh, float keep_scale, int drop,
                                       int B, int NH, int T_)
{
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    size_t rows = (size_t)B * NH * T_;
    for (size_t row = (size_t)blockIdx.x * warps + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * warps) {
        int b = (int)(row / ((size_t)NH * T_));
        int len = key_len(seq_lens, b, T_);
        T *a = att + row * T_;
        float mx = -INFINITY;
        for (int j = lane; j < len; j += 32)
            mx = fmaxf(mx, to_f(a[j]) * scale);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < len; j += 32)
            sum += expf(to_f(a[j]) * scale - mx);
        float inv = 1.0f / warp_sum(sum);
        size_t base = row * T_;
        if (drop && (T_ & 3) == 0) {
            /* rows start on a Philox group: one draw serves 4 keys */
            for (int q = lane; 4 * q < T_; q += 32) {
                uint4 r = philox_group(s, (uint32_t)((base >> 2) + q));
                uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = 4 * q + e;
                    float p = j < len ? expf(to_f(a[j]) * scale - mx) * inv : 0.0f;
                    T pt = from_f<T>(p);
                    a[j] = pt;
                    pd[base + j] = from_f<T>(w[e] >= thresh ? to_f(pt) * keep_scale : 0.0f);
                }
            }
            continue;
        }
        for (int j = lane; j < T_; j += 32) {
            float p = j < len ? expf(to_f(a[j]) * scale - mx) * inv : 0.0f;
            T pt = from_f<T>(p);
            a[j] = pt;
            if (drop)
                pd[base + j] = from_f<T>(
                    philox_u32(s, base + j) >= thresh ? to_f(pt) * keep_scale : 0.0f);
        }
    }
}

/* pd = dropout(att), regenerated for backward. The Philox element index is
 * the flat index into att, so each thread takes one group of 4. */
template <typename T>
__global__ void dropout_probs_kernel(T *pd, const T *att, philox_dev s, uint32_t thresh,
                                     float keep_scale, size_t n)
{
    size_t groups = (n + 3) / 4;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < groups;
         q += (size_t)gridDim.x * blockDim.x) {
        uint4 r = philox_group(s, (uint32_t)q);
        uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            size_t i = 4 * q + e;
            if (i < n)
                pd[i] = from_f<T>(w[e] >= thresh ? to_f(att[i]) * keep_scale : 0.0f);
        }
    }
}

/* In place on datt: d(scores) from d(dropped probs), through the mask and
 * the softmax, times scale; masked keys 0. */
template <typename T>
__global__ void softmax_backward_kernel(T *datt, const T *att, const int32_t *seq_lens,
                                        float scale, philox_dev s, uint32_t thresh,
                                        float keep_scale, int drop, int B, int NH, int T_)
{
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    size_t rows = (size_t)B * NH * T_;
    for (size_t row = (size_t)blockIdx.x * warps + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * warps) {
        int b = (int)(row / ((size_t)NH * T_));
        int len = key_len(seq_lens, b, T_);
        size_t base = row * T_;
        const T *a = att + base;
        T *da = datt + base;
        if (drop && (T_ & 3) == 0) {
            /* rows start on a Philox group: one draw serves 4 keys */
            float dot = 0.0f;
            for (int q = lane; 4 * q < len; q += 32) {
                uint4 r = philox_group(s, (uint32_t)((base >> 2) + q));
                uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = 4 * q + e;
                    if (j < len)
                        dot += to_f(a[j]) * to_f(da[j]) * (w[e] >= thresh ? keep_scale : 0.0f);
                }
            }
            dot = warp_sum(dot);
            for (int q = lane; 4 * q < T_; q += 32) {
                uint4 r = philox_group(s, (uint32_t)((base >> 2) + q));
                uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = 4 * q + e;
                    float g = 0.0f;
                    if (j < len)
                        g = to_f(a[j]) * (to_f(da[j]) * (w[e] >= thresh ? keep_scale : 0.0f) - dot) *
                            scale;
                    da[j] = from_f<T>(g);
                }
            }
            continue;
        }
        float dot = 0.0f;
        for (int j = lane; j < len; j += 32) {
            float m = drop ? (philox_u32(s, base + j) >= thresh ? keep_scale : 0.0f) : 1.0f;
            dot += to_f(a[j]) * to_f(da[j]) * m;
        }
        dot = warp_sum(dot);
        for (int j = lane; j < T_; j += 32) {
            float g = 0.0f;
            if (j < len) {
                float m = drop ? (philox_u32(s, base + j) >= thresh ? keep_scale : 0.0f) : 1.0f;
                g = to_f(a[j]) * (to_f(da[j]) * m - dot) * scale;
            }
            da[j] = from_f<T>(g);
        }
    }
}

static unsigned warp_rows_grid(size_t rows)
{
    size_t g = (rows + 7) / 8; // 256 threads = 8 warps = 8 rows
    return (unsigned)(g < (1u << 20) ? (g ? g : 1) : (1u << 20));
}

template <typename T>
void attention_forward_t(T *out, T *qkvr, T *att, T *scratch, const T *qkv,
                         const int32_t *seq_lens, const philox_stream *rng, float p, int B,
                         int T_, int C, int NH, cudaStream_t stream)
{
    int hs = C / NH;
    size_t NC = (size_t)B * T_ * C, TT = (size_t)T_ * T_, BNH = (size_t)B * NH;
    cudaDataType_t t = dt_traits<T>::cuda;
    permute_kernel<T, false><<<grid_for(3 * NC, 256), 256, 0, stream>>>(qkvr, qkv, B, T_, NH,
                                                                          hs, 3);
    LAUNCH_CHECK();
    const T *q = qkvr, *k = qkvr + NC, *v = qkvr + 2 * NC;
    // S (T,T) = Q (T,hs) @ K^T, per (b,h)
    gemm_rm(false, true, T_, T_, hs, 1.0f, q, t, hs, (long long)T_ * hs, k, t, hs,
            (long long)T_ * hs, 0.0f, att, t, T_, (long long)TT, (int)BNH, stream);
    int drop = rng && p > 0.0f;
    philox_dev s = drop ? philox_dev_from(rng) : philox_dev{};
    uint32_t thresh = dropout_threshold(p);
    float keep_scale = drop ? (float)(1.0 / (1.0 - (double)p)) : 1.0f;
    T *pd = drop ? scratch : att;
    softmax_forward_kernel<T><<<warp_rows_grid(BNH * T_), 256, 0, stream>>>(
        att, scratch, seq_lens, (float)(1.0 / sqrt((double)hs)), s, thresh, keep_scale, drop, B,
        NH, T_);
    LAUNCH_CHECK();
    T *yr = scratch + BNH * TT; // (B,NH,T,hs)
    // Y (T,hs) = Pd (T,T) @ V (T,hs)
    gemm_rm(false, false, T_, hs, T_, 1.0f, pd, t, T_, (long long)TT, v, t, hs,
            (long long)T_ * hs, 0.0f, yr, t, hs, (long long)T_ * hs, (int)BNH, stream);
    permute_kernel<T, true><<<grid_for(NC, 256), 256, 0, stream>>>(out, yr, B, T_, NH, hs, 1);
    LAUNCH_CHECK();
}

template <typename T>
void attention_backward_t(T *dqkv, T *dqkvr, T *datt, T *scratch, const T *dout, const T *qkvr,
                          const T *att, const int32_t *seq_lens, const philox_stream *rng,
                          float p, int B, int T_, int C, int NH, cudaStream_t stream)
{
    int hs = C / NH;
    size_t NC = (size_t)B * T_ * C, TT = (size_t)T_ * T_, BNH = (size_t)B * NH;
    long long sT = (long long)T_ * hs;
    cudaDataType_t t = dt_traits<T>::cuda;
    const T *q = qkvr, *k = qkvr + NC, *v = qkvr + 2 * NC;
    T *dq = dqkvr, *dk = dqkvr + NC, *dv = dqkvr + 2 * NC;
    T *dyr = scratch + BNH * TT; // (B,NH,T,hs)
    permute_kernel<T, false><<<grid_for(NC, 256), 256, 0, stream>>>(dyr, dout, B, T_, NH, hs, 1);
    LAUNCH_CHECK();
    // dPd (T,T) = dY (T,hs) @ V^T
    gemm_rm(false, true, T_, T_, hs, 1.0f, dyr, t, hs, sT, v, t, hs, sT, 0.0f, datt, t, T_,
            (long long)TT, (int)BNH, stream);
    int drop = rng && p > 0.0f;
    philox_dev s = drop ? philox_dev_from(rng) : philox_dev{};
    uint32_t thresh = dropout_threshold(p);
    float keep_scale = drop ? (float)(1.0 / (1.0 - (double)p)) : 1.0f;
    const T *pd = att;
    if (drop) {
        dropout_probs_kernel<T><<<grid_for((BNH * TT + 3) / 4, 256), 256, 0, stream>>>(
            scratch, att, s, thresh, keep_scale, BNH * TT);
        LAUNCH_CHECK();
        pd = scratch;
    }
    // dV (T,hs) = Pd^T (T,T) @ dY (T,hs)
    gemm_rm(true, false, T_, hs, T_, 1.0f, pd, t, T_, (long long)TT, dyr, t, hs, sT, 0.0f, dv, t,
            hs, sT, (int)BNH, stream);
    softmax_backward_kernel<T><<<warp_rows_grid(BNH * T_), 256, 0, stream>>>(
        datt, att, seq_lens, (float)(1.0 / sqrt((double)hs)), s, thresh, keep_scale, drop, B,
        NH, T_);
    LAUNCH_CHECK();
    // dQ = dS @ K ; dK = dS^T @ Q
    gemm_rm(false, false, T_, hs, T_, 1.0f, datt, t, T_, (long long)TT, k, t, hs, sT, 0.0f, dq, t,
            hs, sT, (int)BNH, stream);
    gemm_rm(true, false, T_, hs, T_, 1.0f, datt, t, T_, (long long)TT, q, t, hs, sT, 0.0f, dk, t,
            hs, sT, (int)BNH, stream);
    permute_kernel<T, true><<<grid_for(3 * NC, 256), 256, 0, stream>>>(dqkv, dqkvr, B, T_, NH,
                                                                         hs, 3);
    LAUNCH_CHECK();
}

} // namespace

extern "C" {

void cuda_attention_forward_dt(void *out, void *qkvr, void *att, void *scratch, const void *qkv,
                               const int32_t *seq_lens, const philox_stream *rng, float p, int B,
                               int T_, int C, int NH, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0)
        return;
    DT_DISPATCH(dt, attention_forward_t<T>((T *)out, (T *)qkvr, (T *)att, (T *)scratch,
                                           (const T *)qkv, seq_lens, rng, p, B, T_, C, NH,
                                           stream));
}

void cuda_attention_backward_dt(void *dqkv, void *dqkvr, void *datt, void *scratch,
                                const void *dout, const void *qkvr, const void *att,
                                const int32_t *seq_lens, const philox_stream *rng, float p,
                                int B, int T_, int C, int NH, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0)
        return;
    DT_DISPATCH(dt, attention_backward_t<T>((T *)dqkv, (T *)dqkvr, (T *)datt, (T *)scratch,
                                            (const T *)dout, (const T *)qkvr, (const T *)att,
                                            seq_lens, rng, p, B, T_, C, NH, stream));
}

void cuda_attention_forward(float *out, float *qkvr, float *att, float *scratch,
                            const float *qkv, const int32_t *seq_lens, const philox_stream *rng,
                            float p, int B, int T, int C, int NH, cudaStream_t stream)
{
    cuda_attention_forward_dt(out, qkvr, att, scratch, qkv, seq_lens, rng, p, B, T, C, NH,
                              KDT_F32, stream);
}

void cuda_attention_backward(float *dqkv, float *dqkvr, float *datt, float *scratch,
                             const float *dout, const float *qkvr, const float *att,
                             const int32_t *seq_lens, const philox_stream *rng, float p, int B,
                             int T, int C, int NH, cudaStream_t stream)
{
    cuda_attention_backward_dt(dqkv, dqkvr, datt, scratch, dout, qkvr, att, seq_lens, rng, p, B,
                               T, C, NH, KDT_F32, stream);
}

} // extern "C"
