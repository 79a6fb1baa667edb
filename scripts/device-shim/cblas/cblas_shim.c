/* cblas_shim — straightforward GEMM for the device-check shim (see cblas.h
 * beside it): accumulates in double, OpenMP over rows of C. Slow but exact
 * enough to serve as the CPU reference of the GPU tests. */
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
            double *acc = calloc((size_t)N + 1, sizeof(double));                          \
            if (!acc)                                                                     \
                abort();                                                                  \
            for (int k = 0; k < K; k++) {                                                 \
                double a = tA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];          \
                if (tB)                                                                   \
                    for (int j = 0; j < N; j++)                                           \
                        acc[j] += a * B[(size_t)j * ldb + k];                             \
                else                                                                      \
                    for (int j = 0; j < N; j++)                                           \
                        acc[j] += a * B[(size_t)k * ldb + j];                             \
            }                                                                             \
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
