/* cblas.h (device-check shim) — the two CBLAS calls kernels/cpu uses, for a
 * GPU box that has the CUDA toolkit but no BLAS development headers. Used
 * only by scripts/device-check to build the CPU reference that the GPU tests
 * compare against; never part of a bertd build. Row-major only. */
#ifndef BERTD_SHIM_CBLAS_H
#define BERTD_SHIM_CBLAS_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
                 int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc);
void cblas_dgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
                 int N, int K, double alpha, const double *A, int lda, const double *B, int ldb,
                 double beta, double *C, int ldc);
void openblas_set_num_threads(int n);

#endif
