/* cblas_shim — straightforward GEMM for the device-check shim (see cblas.h
 * beside it): accumulates in double, OpenMP over rows of C. Slow but exact
 * enough to serve as the CPU reference of the GPU tests. Every inner loop
 * walks memory with stride 1: a transposed B (the x·Wᵀ of every linear
 * layer) is a dot product per element, not an axpy striding by ldb. */
#include "cblas.h"

#include <stdio.h>
#include <stdlib.h>

#define SHIM_GEMM(NAME, REAL)                                                             \
    void NAME(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,   \
              int M, int N, int K, REAL alpha, const REAL *A, int lda, const REAL *B,     \
              int ldb, REAL beta, REAL *C, int ldc)                                       \
    {                                                                                     \
        if (order != CblasRowMajor) {                                                     \
            fprintf(stderr, "cblas shim: row-major only\n");                              \
            abort();                                                                      \
        }                                                                                 \
        int tA = ta == CblasTrans, tB = tb == CblasTrans;                                 \
        _Pragma("omp parallel for") for (int i = 0; i < M; i++)                           \
        {                                                                                 \
            /* row i of op(A), contiguous; acc[0..N) the row of op(A)·op(B) */           \
            double *acc = calloc((size_t)N + (size_t)K + 1, sizeof(double));              \
            if (!acc)                                                                     \
                abort();                                                                  \
            double *arow = acc + N;                                                       \
            for (int k = 0; k < K; k++)                                                   \
                arow[k] = tA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];           \
            if (tB) /* B is (N, K): dot products walk both rows with stride 1 */          \
                for (int j = 0; j < N; j++) {                                             \
                    const REAL *b = &B[(size_t)j * ldb];                                  \
                    double s = 0;                                                         \
                    for (int k = 0; k < K; k++)                                           \
                        s += arow[k] * b[k];                                              \
                    acc[j] = s;                                                           \
                }                                                                         \
            else /* B is (K, N): axpy of its rows, stride 1 too */                        \
                for (int k = 0; k < K; k++) {                                             \
                    const REAL *b = &B[(size_t)k * ldb];                                  \
                    double a = arow[k];                                                   \
                    for (int j = 0; j < N; j++)                                           \
                        acc[j] += a * b[j];                                               \
                }                                                                         \
            for (int j = 0; j < N; j++) {                                                 \
                REAL *c = &C[(size_t)i * ldc + j];                                        \
                /* beta == 0 overwrites (C may hold NaN), as BLAS does */                 \
                *c = (REAL)(alpha * acc[j] + (beta == 0 ? 0.0 : beta * (double)*c));      \
            }                                                                             \
            free(acc);                                                                    \
        }                                                                                 \
    }

SHIM_GEMM(cblas_sgemm, float)
SHIM_GEMM(cblas_dgemm, double)

void openblas_set_num_threads(int n)
{
    (void)n;
}
