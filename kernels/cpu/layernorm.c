/* layernorm — LayerNorm over the last dim (HF BertLayerNorm, eps from config).
 * Statistics accumulate in double so fp32 matches PyTorch closely. */
#include "kernels/cpu/kcpu.h"

void KOP(layernorm_forward)(kreal *out, kreal *mean, kreal *rstd, const kreal *inp,
                            const kreal *weight, const kreal *bias, int N, int C, float eps)
{
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const kreal *x = inp + (size_t)n * C;
        double m = 0.0;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= C;
        double v = 0.0;
        for (int c = 0; c < C; c++) {
            double d = x[c] - m;
            v += d * d;
        }
        v /= C;
        double s = 1.0 / sqrt(v + eps);
        kreal *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] = (kreal)((x[c] - m) * s) * weight[c] + bias[c];
        mean[n] = (kreal)m;
        rstd[n] = (kreal)s;
    }
}

void KOP(layernorm_backward)(kreal *dinp, kreal *dweight, kreal *dbias, const kreal *dout,
                             const kreal *inp, const kreal *weight, const kreal *mean,
                             const kreal *rstd, int N, int C)
{
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const kreal *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        kreal m = mean[n], s = rstd[n];
        double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            double dn = (double)weight[c] * d[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * xhat;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        kreal *di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            double dn = (double)weight[c] * d[c];
            di[c] = (kreal)((dn - dnorm_mean - xhat * dnorm_norm_mean) * s);
        }
    }
    /* Parameter gradients reduce over rows; parallel over channels. */
#pragma omp parallel for
    for (int c = 0; c < C; c++) {
        double dw = 0.0, db = 0.0;
        for (int n = 0; n < N; n++) {
            kreal d = dout[(size_t)n * C + c];
            dw += (double)(inp[(size_t)n * C + c] - mean[n]) * rstd[n] * d;
            db += d;
        }
        dweight[c] += (kreal)dw;
        dbias[c] += (kreal)db;
    }
}
