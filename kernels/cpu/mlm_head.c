/* mlm_head — the pieces of the MLM head that are not matmul/GELU/LayerNorm:
 * the gather of masked rows (the head runs on masked positions only) and the
 * fused softmax cross-entropy over the vocabulary. */
#include "kernels/cpu/kcpu.h"
#include <string.h>

void KOP(gather_rows_forward)(kreal *out, const kreal *inp, const int32_t *rows, int M, int C)
{
#pragma omp parallel for
    for (int m = 0; m < M; m++)
        memcpy(out + (size_t)m * C, inp + (size_t)rows[m] * C, (size_t)C * sizeof(kreal));
}

void KOP(gather_rows_backward)(kreal *dinp, const kreal *dout, const int32_t *rows, int M, int C)
{
    for (int m = 0; m < M; m++) {
        kreal *d = dinp + (size_t)rows[m] * C;
        const kreal *s = dout + (size_t)m * C;
        for (int c = 0; c < C; c++)
            d[c] += s[c];
    }
}

void KOP(crossentropy_softmax_forward)(kreal *losses, kreal *probs, const kreal *logits,
                                       const int32_t *targets, int M, int V)
{
#pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const kreal *l = logits + (size_t)m * V;
        kreal *pr = probs + (size_t)m * V;
        kreal maxv = -INFINITY;
        for (int v = 0; v < V; v++)
            if (l[v] > maxv)
                maxv = l[v];
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            pr[v] = K_EXP(l[v] - maxv);
            sum += pr[v];
        }
        kreal inv = (kreal)(1.0 / sum);
        for (int v = 0; v < V; v++)
            pr[v] *= inv;
        /* log-sum-exp form keeps the loss exact even when the target prob underflows */
        losses[m] = (kreal)(log(sum) - (double)(l[targets[m]] - maxv));
    }
}

void KOP(crossentropy_softmax_backward)(kreal *dlogits, const kreal *probs,
                                        const int32_t *targets, const kreal *dlosses,
                                        int M, int V)
{
#pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const kreal *pr = probs + (size_t)m * V;
        kreal *d = dlogits + (size_t)m * V;
        kreal g = dlosses[m];
        for (int v = 0; v < V; v++)
            d[v] = pr[v] * g;
        d[targets[m]] -= g;
    }
}
