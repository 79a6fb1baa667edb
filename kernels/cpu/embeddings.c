/* embeddings — BERT input embedding sum (word + position + token type).
 * LayerNorm and dropout that follow are separate ops. Dims as in kernels.h. */
#include "kernels/cpu/kcpu.h"

void KOP(embeddings_forward)(kreal *out, const int32_t *inp, const int32_t *tok_type,
                             const kreal *wte, const kreal *wpe, const kreal *wtt,
                             int B, int T, int C)
{
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        kreal *o = out + (size_t)bt * C;
        const kreal *w = wte + (size_t)inp[bt] * C;
        const kreal *p = wpe + (size_t)t * C;
        const kreal *y = wtt + (size_t)tok_type[bt] * C;
        for (int c = 0; c < C; c++)
            o[c] = w[c] + p[c] + y[c];
    }
}

void KOP(embeddings_backward)(kreal *dwte, kreal *dwpe, kreal *dwtt, const kreal *dout,
                              const int32_t *inp, const int32_t *tok_type, int B, int T, int C)
{
    /* Serial over rows: the same token id may appear in many rows. Parallel over
     * channels instead, which never collide. */
#pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int bt = 0; bt < B * T; bt++) {
            kreal d = dout[(size_t)bt * C + c];
            dwte[(size_t)inp[bt] * C + c] += d;
            dwpe[(size_t)(bt % T) * C + c] += d;
            dwtt[(size_t)tok_type[bt] * C + c] += d;
        }
    }
}
