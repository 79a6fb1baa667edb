/* matmul — nn.Linear: out = inp @ weight^T + bias, through BLAS GEMM.
 * One thread pool only: each OpenMP thread runs a single-threaded GEMM on its
 * own block of rows (the process sets OpenBLAS to 1 thread). Letting OpenBLAS
 * spawn its own threads next to OpenMP's made the two pools spin against each
 * other on a 2-core box and cost 5x in wall time. */
#include "kernels/cpu/kcpu.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows [lo, hi) of n for this thread, in multiples of 8 for aligned blocks. */
static void my_rows(int n, int *lo, int *hi)
{
#ifdef _OPENMP
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
    int nt = 1, id = 0;
#endif
    int per = ((n + nt - 1) / nt + 7) & ~7;
    *lo = id * per < n ? id * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

void KOP(matmul_forward)(kreal *out, const kreal *inp, const kreal *weight, const kreal *bias,
                         int N, int C, int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        my_rows(N, &lo, &hi);
        if (hi > lo) {
            if (bias)
                for (int n = lo; n < hi; n++)
                    for (int o = 0; o < OC; o++)
                        out[(size_t)n * OC + o] = bias[o];
            K_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, OC, C, 1.0,
                   inp + (size_t)lo * C, C, weight, C, bias ? 1.0 : 0.0,
                   out + (size_t)lo * OC, OC);
        }
    }
}

void KOP(matmul_backward)(kreal *dinp, kreal *dweight, kreal *dbias, const kreal *dout,
                          const kreal *inp, const kreal *weight, int N, int C, int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        if (dinp) { // (N,C) = (N,OC) @ (OC,C), split over rows of N
            my_rows(N, &lo, &hi);
            if (hi > lo)
                K_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, hi - lo, C, OC, 1.0,
                       dout + (size_t)lo * OC, OC, weight, C, 0.0, dinp + (size_t)lo * C, C);
        }
        // (OC,C) += (N,OC)^T @ (N,C), split over rows of OC
        my_rows(OC, &lo, &hi);
        if (hi > lo) {
            K_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, C, N, 1.0, dout + lo, OC,
                   inp, C, 1.0, dweight + (size_t)lo * C, C);
            /* column sums walked row by row (unit stride), 256 columns at a time */
            for (int o0 = lo; dbias && o0 < hi; o0 += 256) {
                int w = hi - o0 < 256 ? hi - o0 : 256;
                double acc[256] = {0};
                for (int n = 0; n < N; n++) {
                    const kreal *d = dout + (size_t)n * OC + o0;
                    for (int k = 0; k < w; k++)
                        acc[k] += d[k];
                }
                for (int k = 0; k < w; k++)
                    dbias[o0 + k] += (kreal)acc[k];
            }
        }
    }
}
