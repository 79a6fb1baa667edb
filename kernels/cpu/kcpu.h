/* kcpu — private helpers shared by the CPU op sources: precision-dependent
 * math and BLAS names, so each op is written once and builds as fp32 (the
 * backend) and fp64 (finite-difference tests only). Never included outside
 * kernels/cpu/. */
#ifndef BERTD_KERNELS_CPU_KCPU_H
#define BERTD_KERNELS_CPU_KCPU_H

#include "kernels/kernels.h"
#include <cblas.h>
#include <math.h>

#ifdef KERNELS_F64
#define K_GEMM cblas_dgemm
#define K_EXP exp
#define K_ERF erf
#define K_SQRT sqrt
#define K_TANH tanh
#define K_LOG log
#else
#define K_GEMM cblas_sgemm
#define K_EXP expf
#define K_ERF erff
#define K_SQRT sqrtf
#define K_TANH tanhf
#define K_LOG logf
#endif

#endif
