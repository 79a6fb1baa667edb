/* gemm.cuh — the row-major GEMM helper shared by matmul.cu and attention.cu.
 * Private to kernels/cuda/. */
#ifndef BERTD_KERNELS_CUDA_GEMM_CUH
#define BERTD_KERNELS_CUDA_GEMM_CUH

#include <cublas_v2.h>

/* Row-major C (m,n) = alpha * op(A) op(B) + beta * C, op = transpose when the
 * flag is set; A is (m,k) or, transposed, (k,m), with leading dimension lda
 * (likewise B). batch > 1 strides each operand by its stride (elements).
 * fp32 accumulation always (CUBLAS_COMPUTE_32F). */
void gemm_rm(bool transA, bool transB, int m, int n, int k, float alpha, const void *A,
             cudaDataType_t tA, int lda, long long strideA, const void *B, cudaDataType_t tB,
             int ldb, long long strideB, float beta, void *C, cudaDataType_t tC, int ldc,
             long long strideC, int batch, cudaStream_t stream);

#endif
