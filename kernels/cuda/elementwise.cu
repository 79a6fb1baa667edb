/* elementwise — pointwise CUDA ops: GELU (erf form), tanh, inverted dropout
 * (Philox, same stream as the CPU), residual add, bias add, fused bias+GELU,
 * casts, fills and scaling. Each thread handles one 16-byte pack (4 fp32 or
 * 8 bf16/fp16) with one vector load when the pointer is aligned; math is fp32.
 * The kernels live in elementwise.cuh (run on the CPU by
 * tests/unit/kernels/test_elementwise_emu); this file is the host launchers.
 */
#include "kernels/cuda/elementwise.cuh"

/* the speed levers' mask (kernels_cuda.h): process-wide, set before launches */
static unsigned g_levers = CUDA_LEVERS_DEFAULT;

/* this thread's capture (cuda_capture_begin): the checks' tolerance (common.cuh) */
static thread_local launch_capture g_capture = {0, cudaSuccess};

void cuda_check_at(cudaError_t err, const char *file, int line)
{
    if (err == cudaSuccess)
        return;
    if (g_capture.on && is_stream_capture_error(err)) {
        if (g_capture.err == cudaSuccess)
            g_capture.err = err;
        return;
    }
    fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err), file, line,
            cudaGetErrorString(err));
    abort();
}

void cublas_check_at(cublasStatus_t st, const char *file, int line)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return;
    if (g_capture.on && is_stream_capture_error(cudaPeekAtLastError())) {
        cuda_check_at(cudaGetLastError(), file, line);
        return;
    }
    fprintf(stderr, "cuBLAS error %d (%s) at %s:%d\n", (int)st, cublasGetStatusString(st), file, line);
    abort();
}

extern "C" {

void cuda_levers_set(unsigned mask)
{
    g_levers = mask;
}

unsigned cuda_levers(void)
{
    return g_levers;
}

void cuda_capture_begin(void)
{
    g_capture.on = 1;
    g_capture.err = cudaSuccess;
}

int cuda_capture_end(void)
{
    g_capture.on = 0;
    return (int)g_capture.err;
}

size_t kdtype_size(kdtype dt)
{
    return dt == KDT_F32 ? 4 : 2;
}

const char *kdtype_name(kdtype dt)
{
    return dt == KDT_F32 ? "fp32" : dt == KDT_BF16 ? "bf16" : dt == KDT_F16 ? "fp16" : "?";
}

void cuda_gelu_forward_dt(void *out, const void *inp, size_t N, kdtype dt, cudaStream_t stream)
{
    if (!N)
        return;
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, gelu_forward_kernel<T>)(
                        (T *)out, (const T *)inp, N));
    LAUNCH_CHECK();
}

void cuda_gelu_backward_dt(void *dinp, const void *inp, const void *dout, size_t N, kdtype dt,
                           cudaStream_t stream)
{
    if (!N)
        return;
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, gelu_backward_kernel<T>)(
                        (T *)dinp, (const T *)inp, (const T *)dout, N));
    LAUNCH_CHECK();
}

void cuda_gelu_tanh_forward_dt(void *out, const void *inp, size_t N, kdtype dt,
                               cudaStream_t stream)
{
    if (!N)
        return;
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, gelu_tanh_forward_kernel<T>)(
                        (T *)out, (const T *)inp, N));
    LAUNCH_CHECK();
}

void cuda_gelu_tanh_backward_dt(void *dinp, const void *inp, const void *dout, size_t N,
                                kdtype dt, cudaStream_t stream)
{
    if (!N)
        return;
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, gelu_tanh_backward_kernel<T>)(
                        (T *)dinp, (const T *)inp, (const T *)dout, N));
    LAUNCH_CHECK();
}

void cuda_tanh_forward_dt(void *out, const void *inp, size_t N, kdtype dt, cudaStream_t stream)
{
    if (!N)
        return;
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, tanh_forward_kernel<T>)(
                        (T *)out, (const T *)inp, N));
    LAUNCH_CHECK();
}

void cuda_tanh_backward_dt(void *dinp, const void *out, const void *dout, size_t N, kdtype dt,
                           cudaStream_t stream)
{
    if (!N)
        return;
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, tanh_backward_kernel<T>)(
                        (T *)dinp, (const T *)out, (const T *)dout, N));
    LAUNCH_CHECK();
}

void cuda_dropout_forward_dt(void *out, const void *inp, const philox_stream *rng, float p,
                             size_t N, kdtype dt, cudaStream_t stream)
{
    if (!N)
        return;
    if (!rng || p <= 0.0f) {
        if (out != inp)
            CUDA_CHECK(cudaMemcpyAsync(out, inp, N * kdtype_size(dt), cudaMemcpyDeviceToDevice,
                                       stream));
        return;
    }
    uint32_t thresh = dropout_threshold(p);
    float keep_scale = (float)(1.0 / (1.0 - (double)p));
    philox_dev s = philox_dev_from(rng);
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, dropout_forward_kernel<T>)(
                        (T *)out, (const T *)inp, s, thresh, keep_scale, N));
    LAUNCH_CHECK();
}

void cuda_residual_forward_dt(void *out, const void *a, const void *b, size_t N, kdtype dt,
                              cudaStream_t stream)
{
    if (!N)
        return;
    DT_DISPATCH(dt, KLAUNCH(pack_grid<T>(N, 256), 256, 0, stream, residual_forward_kernel<T>)(
                        (T *)out, (const T *)a, (const T *)b, N));
    LAUNCH_CHECK();
}

void cuda_add_bias_dt(void *out, const float *bias, int N, int OC, kdtype dt,
                      cudaStream_t stream)
{
    size_t n = (size_t)N * OC;
    if (!n || !bias)
        return;
    DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, bias_act_kernel<T, 0>)(
                        (T *)out, (T *)out, bias, (size_t)N, OC));
    LAUNCH_CHECK();
}

void cuda_bias_gelu_forward_dt(void *act, void *pre, const float *bias, int N, int OC, kdtype dt,
                               cudaStream_t stream)
{
    size_t n = (size_t)N * OC;
    if (!n)
        return;
    if (!bias) {
        cuda_gelu_forward_dt(act, pre, n, dt, stream);
        return;
    }
    DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, bias_act_kernel<T, 1>)(
                        (T *)act, (T *)pre, bias, (size_t)N, OC));
    LAUNCH_CHECK();
}

void cuda_bias_gelu_tanh_forward_dt(void *act, void *pre, const float *bias, int N, int OC,
                                    kdtype dt, cudaStream_t stream)
{
    size_t n = (size_t)N * OC;
    if (!n)
        return;
    if (!bias) {
        cuda_gelu_tanh_forward_dt(act, pre, n, dt, stream);
        return;
    }
    DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, bias_act_kernel<T, 2>)(
                        (T *)act, (T *)pre, bias, (size_t)N, OC));
    LAUNCH_CHECK();
}

void cuda_cast(void *dst, kdtype dst_dt, const void *src, kdtype src_dt, size_t n,
               cudaStream_t stream)
{
    if (!n)
        return;
    if (dst_dt == src_dt) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n * kdtype_size(dst_dt), cudaMemcpyDeviceToDevice,
                                   stream));
        return;
    }
    unsigned g = grid_for(n, 256);
    DT_DISPATCH(dst_dt, {
        typedef T TD;
        DT_DISPATCH(src_dt, KLAUNCH(g, 256, 0, stream, cast_kernel<TD, T>)((TD *)dst, (const T *)src,
                                                                      n));
    });
    LAUNCH_CHECK();
}

void cuda_fill_nan(void *dst, kdtype dt, size_t n, cudaStream_t stream)
{
    if (!n)
        return;
    DT_DISPATCH(dt, KLAUNCH(grid_for(n, 256), 256, 0, stream, fill_nan_kernel<T>)((T *)dst, n));
    LAUNCH_CHECK();
}

void cuda_scale(float *x, float s, size_t n, cudaStream_t stream)
{
    if (!n)
        return;
    KLAUNCH(grid_for(n, 256), 256, 0, stream, scale_kernel)(x, s, n);
    LAUNCH_CHECK();
}

void cuda_philox_u32(uint32_t *out, const philox_stream *s, size_t n, cudaStream_t stream)
{
    if (!n)
        return;
    KLAUNCH(grid_for(n, 256), 256, 0, stream, philox_u32_kernel)(out, philox_dev_from(s), n);
    LAUNCH_CHECK();
}

/* ---- fp32 twins ---- */
void cuda_gelu_forward(float *out, const float *inp, size_t N, cudaStream_t stream)
{
    cuda_gelu_forward_dt(out, inp, N, KDT_F32, stream);
}
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N,
                        cudaStream_t stream)
{
    cuda_gelu_backward_dt(dinp, inp, dout, N, KDT_F32, stream);
}
void cuda_tanh_forward(float *out, const float *inp, size_t N, cudaStream_t stream)
{
    cuda_tanh_forward_dt(out, inp, N, KDT_F32, stream);
}
void cuda_tanh_backward(float *dinp, const float *out, const float *dout, size_t N,
                        cudaStream_t stream)
{
    cuda_tanh_backward_dt(dinp, out, dout, N, KDT_F32, stream);
}
void cuda_dropout_forward(float *out, const float *inp, const philox_stream *rng, float p,
                          size_t N, cudaStream_t stream)
{
    cuda_dropout_forward_dt(out, inp, rng, p, N, KDT_F32, stream);
}
void cuda_dropout_backward(float *dinp, const float *dout, const philox_stream *rng, float p,
                           size_t N, cudaStream_t stream)
{
    /* the mask is regenerated: backward is forward applied to the gradient */
    cuda_dropout_forward_dt(dinp, dout, rng, p, N, KDT_F32, stream);
}
void cuda_residual_forward(float *out, const float *a, const float *b, size_t N,
                           cudaStream_t stream)
{
    cuda_residual_forward_dt(out, a, b, N, KDT_F32, stream);
}
void cuda_residual_backward(float *da, float *db, const float *dout, size_t N,
                            cudaStream_t stream)
{
    if (da != dout)
        CUDA_CHECK(cudaMemcpyAsync(da, dout, N * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    if (db != dout)
        CUDA_CHECK(cudaMemcpyAsync(db, dout, N * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

} // extern "C"
