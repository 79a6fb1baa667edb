/* common.cuh — private helpers of the CUDA ops: error checks that report
 * file:line, element-type traits (fp32 / bf16 / fp16 with fp32 math), the
 * device Philox, 16-byte pack loads/stores and the dropout mask of a pack,
 * warp/block reductions and the dtype dispatch. Included only
 * by the .cu files of kernels/cuda/. Declares inline device code and one
 * file-local kernel (colsum_finish_kernel); defines no globals (LAUNCH_CHECK's
 * capture state lives in elementwise.cu).
 */
#ifndef BERTD_KERNELS_CUDA_COMMON_CUH
#define BERTD_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/kernels_cuda.h"

/* A failed launch or CUDA call inside an op is a bug or a dead device, never
 * bad user input (callers validate shapes first), so it aborts with the
 * location, as llm.c does. */
#define CUDA_CHECK(call) cuda_check_at((call), __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check_at((call), __FILE__, __LINE__)
/* Except for one case: a stream-capture error while the caller captures
 * (cuda_capture_begin, kernels_cuda.h), from a CUDA call, a launch or a
 * cuBLAS(Lt) call whose kernel launch the capture refused (the CUDA error
 * left behind tells), which is kept for cuda_capture_end instead: the
 * capture is then discarded and its work run eagerly. */
struct launch_capture {
    int on;
    cudaError_t err;
};
static inline bool is_stream_capture_error(cudaError_t e)
{
    return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
           e == cudaErrorStreamCaptureMerge || e == cudaErrorStreamCaptureUnmatched ||
           e == cudaErrorStreamCaptureUnjoined || e == cudaErrorStreamCaptureIsolation ||
           e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureWrongThread;
}
void cuda_check_at(cudaError_t err, const char *file, int line);        // elementwise.cu
void cublas_check_at(cublasStatus_t st, const char *file, int line);   // elementwise.cu
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* Every kernel launch in kernels/cuda is KLAUNCH(grid, block, smem, stream,
 * kernel)(args...): <<<>>> under nvcc; tests/cudasim/device.h defines it first
 * as a checked launch on the CPU stand-in, so the same launchers run there.
 * The kernel comes last because its template arguments may hold commas. */
#ifndef KLAUNCH
#define KLAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

/* ---- element types: load as float, store from float ---- */
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x)
{
    return __float2bfloat16(x); // round to nearest even
}
template <> __device__ __forceinline__ __half from_f<__half>(float x)
{
    return __float2half(x); // round to nearest even; saturates to inf
}

template <typename T> struct dt_traits;
template <> struct dt_traits<float> { static constexpr cudaDataType_t cuda = CUDA_R_32F; };
template <> struct dt_traits<__nv_bfloat16> { static constexpr cudaDataType_t cuda = CUDA_R_16BF; };
template <> struct dt_traits<__half> { static constexpr cudaDataType_t cuda = CUDA_R_16F; };

/* Runs `body` with T bound to the C type of dt. */
#define DT_DISPATCH(dt, ...)                                                              \
    do {                                                                                  \
        switch (dt) {                                                                     \
        case KDT_F32: { typedef float T; __VA_ARGS__; } break;                            \
        case KDT_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                   \
        case KDT_F16: { typedef __half T; __VA_ARGS__; } break;                           \
        default: fprintf(stderr, "bad kdtype %d at %s:%d\n", (int)(dt), __FILE__, __LINE__); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* ---- Philox4x32-10, the same rounds and constants as kernels/cpu/philox.c ---- */
/* c1 step, c2 layer << 8 | site, c3 micro. dctr: philox_stream.dev_ctr,
 * {step, micro} in device memory that replace c1 and c3 when the kernel
 * starts (philox_dev_load), or NULL. */
struct philox_dev { uint32_t k0, k1, c1, c2, c3; const uint32_t *dctr; };

static inline philox_dev philox_dev_from(const philox_stream *s)
{
    philox_dev d = {s->key[0], s->key[1], s->ctr[0], s->ctr[1], s->ctr[2], s->dev_ctr};
    return d;
}

/* Every kernel that draws calls this once at its start on its by-value
 * philox_dev: the per-step counters are then read from device memory once
 * per thread, not per draw, and a captured graph's replay draws the masks
 * of the step whose values sit in dctr at that time. */
__device__ __forceinline__ philox_dev philox_dev_load(philox_dev s)
{
    if (s.dctr) {
        s.c1 = s.dctr[0];
        s.c3 = s.dctr[1];
        s.dctr = nullptr;
    }
    return s;
}

/* The four uint32 of element group g: elements 4g .. 4g+3 of the stream. */
__device__ __forceinline__ uint4 philox_group(const philox_dev &s, uint32_t g)
{
    uint32_t c0 = g, c1 = s.c1, c2 = s.c2, c3 = s.c3, k0 = s.k0, k1 = s.k1;
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
        uint32_t lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return make_uint4(c0, c1, c2, c3);
}

/* philox_stream_u32(s, i). Element groups index with i >> 2 truncated to 32
 * bits, exactly as the CPU does. */
__device__ __forceinline__ uint32_t philox_u32(const philox_dev &s, uint64_t i)
{
    uint4 r = philox_group(s, (uint32_t)(i >> 2));
    switch (i & 3) {
    case 0: return r.x;
    case 1: return r.y;
    case 2: return r.z;
    default: return r.w;
    }
}

/* ---- 16-byte packs: P elements of T moved by one vector load or store ---- */
namespace {

template <typename T> struct pack {
    static constexpr int n = 16 / sizeof(T);
    T v[n];
};

/* Loads elements [i, i+P) of x; lanes past n read 0. */
template <typename T> __device__ __forceinline__ void load_pack(float *out, const T *x, size_t i,
                                                                size_t n)
{
    constexpr int P = pack<T>::n;
    if (i + P <= n && ((uintptr_t)(x + i) & 15) == 0) {
        int4 raw = *reinterpret_cast<const int4 *>(x + i);
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int k = 0; k < P; k++)
            out[k] = to_f(e[k]);
    } else {
#pragma unroll
        for (int k = 0; k < P; k++)
            out[k] = i + k < n ? to_f(x[i + k]) : 0.0f;
    }
}

template <typename T> __device__ __forceinline__ void store_pack(T *x, const float *in, size_t i,
                                                                 size_t n)
{
    constexpr int P = pack<T>::n;
    if (i + P <= n && ((uintptr_t)(x + i) & 15) == 0) {
        int4 raw;
        T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int k = 0; k < P; k++)
            e[k] = from_f<T>(in[k]);
        *reinterpret_cast<int4 *>(x + i) = raw;
    } else {
#pragma unroll
        for (int k = 0; k < P; k++)
            if (i + k < n)
                x[i + k] = from_f<T>(in[k]);
    }
}

/* Keep multipliers for elements [i, i+P): 0 or keep_scale. i is a multiple of
 * 4 (P is 4 or 8), so whole Philox groups are used. */
template <int P> __device__ __forceinline__ void dropout_mask(float *mk, const philox_dev &s,
                                                              size_t i, uint32_t thresh,
                                                              float keep_scale)
{
#pragma unroll
    for (int g = 0; g < P / 4; g++) {
        uint4 r = philox_group(s, (uint32_t)((i >> 2) + g));
        mk[4 * g + 0] = r.x >= thresh ? keep_scale : 0.0f;
        mk[4 * g + 1] = r.y >= thresh ? keep_scale : 0.0f;
        mk[4 * g + 2] = r.z >= thresh ? keep_scale : 0.0f;
        mk[4 * g + 3] = r.w >= thresh ? keep_scale : 0.0f;
    }
}

} // namespace

/* ---- reductions ---- */
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, <= 1024); every
 * thread gets the result. shared must hold 32 floats. */
__device__ __forceinline__ float block_sum(float v, float *shared)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); // shared may still be read by a previous call
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *shared)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : -INFINITY;
    return warp_max(v);
}
__device__ __forceinline__ double block_sum_d(double v, double *shared)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : 0.0;
    return warp_sum_d(v);
}

/* ---- deterministic column sums (bias, LayerNorm weight/bias gradients):
 * no float atomics, so the bits never depend on scheduling ----
 * Two passes. Pass 1 (the op's own kernel): grid (ceil(C/32), COLSUM_CHUNKS),
 * block (32, COLSUM_PHASES); block (tile, r) owns 32 columns of the fixed
 * row chunk r = [colsum_row(N, r), colsum_row(N, r + 1)); thread (x, y) sums
 * the chunk's rows y, y + COLSUM_PHASES, ... in order, col_phase_sum adds the
 * phases in a fixed tree, and the chunk's sum goes to partial (outs, CHUNKS,
 * C). Pass 2 (colsum_finish_kernel): one thread per column adds the chunks
 * in order onto the gradient. The chunks depend on N only, not on the
 * device, and give the first pass enough blocks to fill a GPU. */
constexpr int COLSUM_CHUNKS = 32, COLSUM_PHASES = 8;

__device__ __forceinline__ int colsum_row(int N, int r)
{
    return (int)((long long)N * r / COLSUM_CHUNKS);
}

/* A block of (32, blockDim.y) threads, blockDim.y a power of two <= 32,
 * thread (x, y) holding its partial sum of column x over row phase y. Sums
 * the phases in a fixed tree; every thread gets column x's total. shared
 * holds blockDim.y * 33 floats; every thread of the block must call it. */
__device__ __forceinline__ float col_phase_sum(float v, float *shared)
{
    int x = threadIdx.x, y = threadIdx.y;
    __syncthreads(); // shared may still be read by a previous call
    shared[y * 33 + x] = v;
    __syncthreads();
    for (int s = (int)blockDim.y >> 1; s > 0; s >>= 1) {
        if (y < s)
            shared[y * 33 + x] += shared[(y + s) * 33 + x];
        __syncthreads();
    }
    return shared[x];
}

namespace {
/* Pass 2: out0 (C) += sum over chunks of partial[0], out1 (C, may be NULL)
 * += the same of partial[1]; partial (2 or 1, COLSUM_CHUNKS, C). */
__global__ void colsum_finish_kernel(float *out0, float *out1, const float *partial, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0.0f;
    for (int r = 0; r < COLSUM_CHUNKS; r++)
        s += partial[(size_t)r * C + c];
    out0[c] += s;
    if (out1) {
        const float *p1 = partial + (size_t)COLSUM_CHUNKS * C;
        float t = 0.0f;
        for (int r = 0; r < COLSUM_CHUNKS; r++)
            t += p1[(size_t)r * C + c];
        out1[c] += t;
    }
}
} // namespace

static inline unsigned grid_for(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    /* grid-stride loops cover the rest */
    return (unsigned)(g < 65535u * 16u ? (g ? g : 1) : 65535u * 16u);
}

/* The calling thread's cuBLAS handle, bound to stream (matmul.cu). */
cublasHandle_t kernels_cublas(cudaStream_t stream);

#endif
