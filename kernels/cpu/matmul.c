/* matmul — nn.Linear: out = inp @ weight^T + bias, through BLAS GEMM.
 * Called outside OpenMP regions so OpenBLAS may use its own threads. */
#include "kernels/cpu/kcpu.h"

void KOP(matmul_forward)(kreal *out, const kreal *inp, const kreal *weight, const kreal *bias,
                         int N, int C, int OC)
{
    if (bias) {
#pragma omp parallel for
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++)
                out[(size_t)n * OC + o] = bias[o];
    }
    K_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0, inp, C, weight, C,
           bias ? 1.0 : 0.0, out, OC);
}

void KOP(matmul_backward)(kreal *dinp, kreal *dweight, kreal *dbias, const kreal *dout,
                          const kreal *inp, const kreal *weight, int N, int C, int OC)
{
    if (dinp) // (N,C) = (N,OC) @ (OC,C)
        K_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0, dout, OC, weight, C,
               0.0, dinp, C);
    // (OC,C) += (N,OC)^T @ (N,C)
    K_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0, dout, OC, inp, C, 1.0,
           dweight, C);
    if (dbias) {
#pragma omp parallel for
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int n = 0; n < N; n++)
                s += dout[(size_t)n * OC + o];
            dbias[o] += (kreal)s;
        }
    }
}
