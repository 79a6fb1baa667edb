/* matmul — nn.Linear on the GPU through cuBLAS (row-major helpers over
 * column-major cuBLAS), fp32 compute always (CUBLAS_COMPUTE_32F: fp32 inputs
 * stay true fp32, never TF32, so the fp32 path can be checked against the CPU
 * to 1e-5; bf16/fp16 inputs run on tensor cores with fp32 accumulation).
 * Weight gradients are produced in fp32 straight from 16-bit operands
 * (GemmEx with an fp32 C and beta = 1), so no 16-bit gradient ever exists.
 * Also the per-thread cuBLAS handle that the attention GEMMs share.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

#include <errno.h>

namespace {

struct cublas_state {
    cublasHandle_t handle = nullptr;
    void *workspace = nullptr;
    cudaStream_t stream = nullptr; /* the handle's stream, once set */
    bool stream_set = false;
    /* no destructor: at process exit the driver may be gone already, and the
     * context's teardown frees both anyway */
};
thread_local cublas_state tls;

constexpr size_t CUBLAS_WORKSPACE = 32u << 20; // Hopper kernels want 32 MiB

/* Pass 1 of dbias (OC) += column sums of dout (N,OC), deterministic (no
 * atomics: the bits never depend on which block runs first, so a resumed
 * job ends bit-identical to an uninterrupted one): chunk r's column sums
 * into partial (COLSUM_CHUNKS, OC); common.cuh "deterministic column sums". */
template <typename T>
__global__ void __launch_bounds__(32 * COLSUM_PHASES)
bias_backward_kernel(float *partial, const T *dout, int N, int OC)
{
    __shared__ float sh[COLSUM_PHASES * 33];
    int c = blockIdx.x * 32 + threadIdx.x, r = blockIdx.y;
    int hi = colsum_row(N, r + 1);
    float s = 0.0f;
    if (c < OC)
        for (int n = colsum_row(N, r) + threadIdx.y; n < hi; n += blockDim.y)
            s += to_f(dout[(size_t)n * OC + c]);
    s = col_phase_sum(s, sh);
    if (threadIdx.y == 0 && c < OC)
        partial[(size_t)r * OC + c] = s;
}

} // namespace

cublasHandle_t kernels_cublas(cudaStream_t stream)
{
    if (!tls.handle) {
        if (cuda_kernels_init() != 0) {
            fprintf(stderr, "cuBLAS could not be initialised\n");
            abort();
        }
    }
    /* cublasSetStream puts the handle back on cuBLAS's own workspace pool
     * (documented), so ours is set again with every stream change, as
     * PyTorch's handle pool does; unchanged streams skip both calls */
    if (!tls.stream_set || tls.stream != stream) {
        CUBLAS_CHECK(cublasSetStream(tls.handle, stream));
        CUBLAS_CHECK(cublasSetWorkspace(tls.handle, tls.workspace, CUBLAS_WORKSPACE));
        tls.stream = stream;
        tls.stream_set = true;
    }
    return tls.handle;
}

void gemm_rm(bool transA, bool transB, int m, int n, int k, float alpha, const void *A,
             cudaDataType_t tA, int lda, long long strideA, const void *B, cudaDataType_t tB,
             int ldb, long long strideB, float beta, void *C, cudaDataType_t tC, int ldc,
             long long strideC, int batch, cudaStream_t stream)
{
    if (m <= 0 || n <= 0 || batch <= 0)
        return;
    cublasHandle_t h = kernels_cublas(stream);
    /* Row-major C (m,n) = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
     * swap the operands, keep each one's transpose flag. */
    cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        CUBLAS_CHECK(cublasGemmEx(h, opB, opA, n, m, k, &alpha, B, tB, ldb, A, tA, lda, &beta, C,
                                  tC, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opB, opA, n, m, k, &alpha, B, tB, ldb,
                                                strideB, A, tA, lda, strideA, &beta, C, tC, ldc,
                                                strideC, batch, CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT));
}

static cudaDataType_t cuda_type(kdtype dt)
{
    return dt == KDT_BF16 ? CUDA_R_16BF : dt == KDT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

extern "C" {

int cuda_kernels_init(void)
{
    if (tls.handle)
        return 0;
    cublasStatus_t st = cublasCreate(&tls.handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate: %s\n", cublasGetStatusString(st));
        tls.handle = nullptr;
        return -EIO;
    }
    cudaError_t err = cudaMalloc(&tls.workspace, CUBLAS_WORKSPACE);
    if (err != cudaSuccess) {
        fprintf(stderr, "cuBLAS workspace: %s\n", cudaGetErrorString(err));
        cublasDestroy(tls.handle);
        tls.handle = nullptr;
        tls.workspace = nullptr;
        return -EIO;
    }
    CUBLAS_CHECK(cublasSetWorkspace(tls.handle, tls.workspace, CUBLAS_WORKSPACE));
    /* Default math with CUBLAS_COMPUTE_32F never downgrades fp32 to TF32
     * (that needs CUBLAS_TF32_TENSOR_OP_MATH), and 16-bit operands still use
     * tensor cores. */
    CUBLAS_CHECK(cublasSetMathMode(tls.handle, CUBLAS_DEFAULT_MATH));
    return 0;
}

void cuda_kernels_shutdown(void)
{
    cuda_lt_shutdown(); /* the thread's cuBLASLt state goes with it */
    if (tls.handle)
        cublasDestroy(tls.handle);
    if (tls.workspace)
        cudaFree(tls.workspace);
    tls.handle = nullptr;
    tls.workspace = nullptr;
    tls.stream_set = false;
}

void cuda_matmul_forward_dt(void *out, const void *inp, const void *weight, const float *bias,
                            int N, int C, int OC, kdtype dt, cudaStream_t stream)
{
    cudaDataType_t t = cuda_type(dt);
    // out (N,OC) = inp (N,C) @ weight (OC,C)^T
    gemm_rm(false, true, N, OC, C, 1.0f, inp, t, C, 0, weight, t, C, 0, 0.0f, out, t, OC, 0, 1,
            stream);
    cuda_add_bias_dt(out, bias, N, OC, dt, stream);
}

void cuda_matmul_backward_dt(void *dinp, float *dweight, float *dbias, const void *dout,
                             const void *inp, const void *weight, int N, int C, int OC,
                             kdtype dt, cudaStream_t stream)
{
    cudaDataType_t t = cuda_type(dt);
    if (dinp) // (N,C) = (N,OC) @ (OC,C)
        gemm_rm(false, false, N, C, OC, 1.0f, dout, t, OC, 0, weight, t, C, 0, 0.0f, dinp, t, C,
                0, 1, stream);
    // dweight (OC,C) += dout^T (OC,N) @ inp (N,C), accumulated in fp32
    gemm_rm(true, false, OC, C, N, 1.0f, dout, t, OC, 0, inp, t, C, 0, 1.0f, dweight, CUDA_R_32F,
            C, 0, 1, stream);
    if (dbias && N > 0) {
        float *partial = nullptr; // (COLSUM_CHUNKS, OC), stream-ordered
        CUDA_CHECK(cudaMallocAsync((void **)&partial, (size_t)COLSUM_CHUNKS * OC * 4, stream));
        dim3 grid((OC + 31) / 32, COLSUM_CHUNKS), block(32, COLSUM_PHASES);
        DT_DISPATCH(dt, KLAUNCH(grid, block, 0, stream, bias_backward_kernel<T>)(
                            partial, (const T *)dout, N, OC));
        LAUNCH_CHECK();
        KLAUNCH((OC + 255) / 256, 256, 0, stream, colsum_finish_kernel)(dbias, nullptr, partial, OC);
        LAUNCH_CHECK();
        CUDA_CHECK(cudaFreeAsync(partial, stream));
    }
}

void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC, cudaStream_t stream)
{
    cuda_matmul_forward_dt(out, inp, weight, bias, N, C, OC, KDT_F32, stream);
}

void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC,
                          cudaStream_t stream)
{
    cuda_matmul_backward_dt(dinp, dweight, dbias, dout, inp, weight, N, C, OC, KDT_F32, stream);
}

} // extern "C"
