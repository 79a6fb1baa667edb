/* elementwise — GELU (erf and tanh forms), tanh, inverted dropout and residual add.
 * Pointwise ops, OpenMP over elements. Dropout masks come from Philox and are
 * regenerated in backward rather than stored. */
#include "kernels/cpu/kcpu.h"
#include <string.h>

void KOP(gelu_forward)(kreal *out, const kreal *inp, size_t N)
{
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        kreal x = inp[i];
        out[i] = (kreal)0.5 * x * (1 + K_ERF(x * (kreal)M_SQRT1_2));
    }
}

void KOP(gelu_backward)(kreal *dinp, const kreal *inp, const kreal *dout, size_t N)
{
    const kreal inv_sqrt_2pi = (kreal)(0.5 * M_2_SQRTPI * M_SQRT1_2);
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        kreal x = inp[i];
        kreal cdf = (kreal)0.5 * (1 + K_ERF(x * (kreal)M_SQRT1_2));
        kreal pdf = inv_sqrt_2pi * K_EXP((kreal)-0.5 * x * x);
        dinp[i] = dout[i] * (cdf + x * pdf);
    }
}

/* sqrt(2/pi) and the cubic coefficient of the tanh form */
#define GELU_TANH_S 0.79788456080286535588
#define GELU_TANH_A 0.044715

void KOP(gelu_tanh_forward)(kreal *out, const kreal *inp, size_t N)
{
    const kreal s = (kreal)GELU_TANH_S, a = (kreal)GELU_TANH_A;
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        kreal x = inp[i];
        out[i] = (kreal)0.5 * x * (1 + K_TANH(s * (x + a * x * x * x)));
    }
}

void KOP(gelu_tanh_backward)(kreal *dinp, const kreal *inp, const kreal *dout, size_t N)
{
    const kreal s = (kreal)GELU_TANH_S, a = (kreal)GELU_TANH_A;
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        kreal x = inp[i];
        kreal t = K_TANH(s * (x + a * x * x * x));
        kreal dt = s * (1 + 3 * a * x * x); // d/dx of tanh's argument
        dinp[i] = dout[i] * ((kreal)0.5 * (1 + t) + (kreal)0.5 * x * (1 - t * t) * dt);
    }
}

void KOP(tanh_forward)(kreal *out, const kreal *inp, size_t N)
{
#pragma omp parallel for
    for (size_t i = 0; i < N; i++)
        out[i] = K_TANH(inp[i]);
}

void KOP(tanh_backward)(kreal *dinp, const kreal *out, const kreal *dout, size_t N)
{
#pragma omp parallel for
    for (size_t i = 0; i < N; i++)
        dinp[i] = dout[i] * (1 - out[i] * out[i]);
}

void KOP(dropout_forward)(kreal *out, const kreal *inp, const philox_stream *rng, float p,
                          size_t N)
{
    if (!rng || p <= 0.0f) {
        if (out != inp)
            memmove(out, inp, N * sizeof(kreal));
        return;
    }
    uint32_t thresh = dropout_threshold(p);
    kreal scale = (kreal)(1.0 / (1.0 - (double)p));
    /* one Philox call yields the draws of 4 consecutive elements; 8 calls
     * (32 elements) are made at once so they vectorize */
    size_t blocks = (N + 31) / 32;
#pragma omp parallel for
    for (size_t blk = 0; blk < blocks; blk++) {
        uint32_t ctr0[8], u[4][8];
        for (int l = 0; l < 8; l++)
            ctr0[l] = (uint32_t)(blk * 8 + l);
        philox4x32_10_x8(u, ctr0, rng->ctr, rng->key);
        for (size_t k = 0, i = 32 * blk; k < 32 && i < N; k++, i++)
            out[i] = u[k & 3][k >> 2] >= thresh ? inp[i] * scale : 0;
    }
}

void KOP(dropout_backward)(kreal *dinp, const kreal *dout, const philox_stream *rng, float p,
                           size_t N)
{
    KOP(dropout_forward)(dinp, dout, rng, p, N);
}

void KOP(residual_forward)(kreal *out, const kreal *a, const kreal *b, size_t N)
{
#pragma omp parallel for
    for (size_t i = 0; i < N; i++)
        out[i] = a[i] + b[i];
}

void KOP(residual_backward)(kreal *da, kreal *db, const kreal *dout, size_t N)
{
    if (da != dout)
        memmove(da, dout, N * sizeof(kreal));
    if (db != dout)
        memmove(db, dout, N * sizeof(kreal));
}
