/* elementwise.cuh — the device code of kernels/cuda/elementwise.cu (the
 * pointwise kernels, on common.cuh's 16-byte packs) with its launch geometry,
 * kept apart from the host launchers so that
 * tests/unit/kernels/test_elementwise_emu can compile these very lines on
 * the CPU under the SIMT emulator (tests/unit/kernels/cuda_emu.h) and run
 * them without a GPU. Private to kernels/cuda/elementwise.cu (and that test).
 */
#ifndef BERTD_KERNELS_CUDA_ELEMENTWISE_CUH
#define BERTD_KERNELS_CUDA_ELEMENTWISE_CUH

#include "kernels/cuda/common.cuh"

#include <math.h>

namespace {

#define PACK_LOOP(T, i, count)                                                            \
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * pack<T>::n;          \
         i < (count); i += (size_t)gridDim.x * blockDim.x * pack<T>::n)

__device__ __forceinline__ float gelu_f(float x)
{
    return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
}
__device__ __forceinline__ float gelu_grad_f(float x)
{
    const float inv_sqrt_2pi = (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
    float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
    float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
    return cdf + x * pdf;
}

/* GELU's tanh form (HF "gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
__device__ __forceinline__ float gelu_tanh_f(float x)
{
    const float s = 0.79788456080286535588f, a = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(s * (x + a * x * x * x)));
}
__device__ __forceinline__ float gelu_tanh_grad_f(float x)
{
    const float s = 0.79788456080286535588f, a = 0.044715f;
    float t = tanhf(s * (x + a * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * s * (1.0f + 3.0f * a * x * x);
}

/* The element-wise pattern once: out = op(a[, b]) in 16-byte packs of T,
 * float arithmetic; the named kernels below differ only in op. */
template <typename T, typename Op>
__device__ __forceinline__ void map1(T *out, const T *a, size_t n, Op op)
{
    constexpr int P = pack<T>::n;
    PACK_LOOP(T, i, n) {
        float x[P];
        load_pack(x, a, i, n);
#pragma unroll
        for (int k = 0; k < P; k++)
            x[k] = op(x[k]);
        store_pack(out, x, i, n);
    }
}

template <typename T, typename Op>
__device__ __forceinline__ void map2(T *out, const T *a, const T *b, size_t n, Op op)
{
    constexpr int P = pack<T>::n;
    PACK_LOOP(T, i, n) {
        float x[P], y[P];
        load_pack(x, a, i, n);
        load_pack(y, b, i, n);
#pragma unroll
        for (int k = 0; k < P; k++)
            x[k] = op(x[k], y[k]);
        store_pack(out, x, i, n);
    }
}

struct gelu_op {
    __device__ float operator()(float x) const { return gelu_f(x); }
};
struct gelu_grad_op { // (x, dout)
    __device__ float operator()(float x, float d) const { return d * gelu_grad_f(x); }
};
struct gelu_tanh_op {
    __device__ float operator()(float x) const { return gelu_tanh_f(x); }
};
struct gelu_tanh_grad_op { // (x, dout)
    __device__ float operator()(float x, float d) const { return d * gelu_tanh_grad_f(x); }
};
struct tanh_op {
    __device__ float operator()(float x) const { return tanhf(x); }
};
struct tanh_grad_op { // (y = tanh(x), dout)
    __device__ float operator()(float y, float d) const { return d * (1.0f - y * y); }
};
struct add_op {
    __device__ float operator()(float x, float y) const { return x + y; }
};

template <typename T> __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n)
{
    map1(out, inp, n, gelu_op{});
}

template <typename T>
__global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n)
{
    map2(dinp, inp, dout, n, gelu_grad_op{});
}

template <typename T> __global__ void gelu_tanh_forward_kernel(T *out, const T *inp, size_t n)
{
    map1(out, inp, n, gelu_tanh_op{});
}

template <typename T>
__global__ void gelu_tanh_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n)
{
    map2(dinp, inp, dout, n, gelu_tanh_grad_op{});
}

template <typename T> __global__ void tanh_forward_kernel(T *out, const T *inp, size_t n)
{
    map1(out, inp, n, tanh_op{});
}

template <typename T>
__global__ void tanh_backward_kernel(T *dinp, const T *out, const T *dout, size_t n)
{
    map2(dinp, out, dout, n, tanh_grad_op{});
}

template <typename T>
__global__ void dropout_forward_kernel(T *out, const T *inp, philox_dev s, uint32_t thresh,
                                       float keep_scale, size_t n)
{
    s = philox_dev_load(s);
    constexpr int P = pack<T>::n;
    PACK_LOOP(T, i, n) {
        float x[P], mk[P];
        load_pack(x, inp, i, n);
        dropout_mask<P>(mk, s, i, thresh, keep_scale);
#pragma unroll
        for (int k = 0; k < P; k++)
            x[k] *= mk[k];
        store_pack(out, x, i, n);
    }
}

template <typename T>
__global__ void residual_forward_kernel(T *out, const T *a, const T *b, size_t n)
{
    map2(out, a, b, n, add_op{});
}

/* Rows of OC: one thread per pack of a row, grid-stride over the matrix.
 * ACT: 0 the bias only, 1 then GELU (erf form), 2 then GELU (tanh form). */
template <typename T, int ACT>
__global__ void bias_act_kernel(T *act, T *pre, const float *bias, size_t rows, int OC)
{
    size_t n = rows * (size_t)OC;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = to_f(pre[i]) + bias[i % OC];
        pre[i] = from_f<T>(x);
        if (ACT == 1)
            act[i] = from_f<T>(gelu_f(to_f(pre[i])));
        else if (ACT == 2)
            act[i] = from_f<T>(gelu_tanh_f(to_f(pre[i])));
    }
}

template <typename TD, typename TS>
__global__ void cast_kernel(TD *dst, const TS *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f<TD>(to_f(src[i]));
}

template <typename T> __global__ void fill_nan_kernel(T *dst, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f<T>(__int_as_float(0x7fc00000));
}

__global__ void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

__global__ void philox_u32_kernel(uint32_t *out, philox_dev s, size_t n)
{
    s = philox_dev_load(s);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = philox_u32(s, i);
}

template <typename T> unsigned pack_grid(size_t n, unsigned block)
{
    return grid_for((n + pack<T>::n - 1) / pack<T>::n, block);
}

} // namespace

#endif
