/* attention.cuh — the device code of kernels/cuda/attention.cu (the
 * per-head regrouping, the fused scale + mask + softmax + dropout kernel, the
 * dropout regeneration and the softmax backward; the GEMMs between them are
 * cuBLAS calls in attention.cu) with its launch geometry, kept apart from the
 * host code so that tests/unit/kernels/test_attention_emu can compile these
 * very lines on the CPU under the SIMT emulator
 * (tests/unit/kernels/cuda_emu.h) and run them without a GPU.
 * Private to kernels/cuda/attention.cu (and that test).
 */
#ifndef BERTD_KERNELS_CUDA_ATTENTION_CUH
#define BERTD_KERNELS_CUDA_ATTENTION_CUH

#include "kernels/cuda/common.cuh"

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
    s = philox_dev_load(s);
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
    s = philox_dev_load(s);
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
    s = philox_dev_load(s);
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

} // namespace

#endif
