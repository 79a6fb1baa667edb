/* attention — scaled dot-product self-attention with a key padding mask and
 * dropout on the probabilities, over a fused QKV projection. The projections
 * themselves are matmul ops. Loops are OpenMP over (b, h) and never call BLAS,
 * so they do not fight OpenBLAS's own threads. */
#include "kernels/cpu/kcpu.h"
#include <string.h>

static inline int key_len(const int32_t *seq_lens, int b, int T)
{
    /* A zero length would mask every key; treat it as one real token so the
     * row stays a distribution (the loader never produces empty rows). */
    int n = seq_lens ? seq_lens[b] : T;
    return n < 1 ? 1 : (n > T ? T : n);
}

void KOP(attention_forward)(kreal *out, kreal *att, const kreal *qkv, const int32_t *seq_lens,
                            const philox_stream *rng, float p, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    kreal scale = (kreal)(1.0 / sqrt((double)hs));
    int drop = rng && p > 0.0f;
    uint32_t thresh = dropout_threshold(p);
    kreal keep_scale = drop ? (kreal)(1.0 / (1.0 - (double)p)) : (kreal)1;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int len = key_len(seq_lens, b, T);
            for (int i = 0; i < T; i++) {
                const kreal *q = qkv + ((size_t)b * T + i) * C3 + h * hs;
                kreal *a = att + (((size_t)b * NH + h) * T + i) * T;
                kreal maxv = -INFINITY;
                for (int j = 0; j < len; j++) {
                    const kreal *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    kreal s = 0;
                    for (int d = 0; d < hs; d++)
                        s += q[d] * k[d];
                    s *= scale;
                    a[j] = s;
                    if (s > maxv)
                        maxv = s;
                }
                kreal sum = 0;
                for (int j = 0; j < len; j++) {
                    a[j] = K_EXP(a[j] - maxv);
                    sum += a[j];
                }
                kreal inv = 1 / sum;
                for (int j = 0; j < len; j++)
                    a[j] *= inv;
                for (int j = len; j < T; j++)
                    a[j] = 0;
                kreal *o = out + ((size_t)b * T + i) * C + h * hs;
                for (int d = 0; d < hs; d++)
                    o[d] = 0;
                size_t base = (((size_t)b * NH + h) * T + i) * T;
                for (int j = 0; j < len; j++) {
                    kreal w = a[j];
                    if (drop)
                        w = philox_stream_u32(rng, base + j) >= thresh ? w * keep_scale : 0;
                    const kreal *v = qkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    for (int d = 0; d < hs; d++)
                        o[d] += w * v[d];
                }
            }
        }
    }
}

void KOP(attention_backward)(kreal *dqkv, kreal *datt, const kreal *dout, const kreal *qkv,
                             const kreal *att, const int32_t *seq_lens,
                             const philox_stream *rng, float p, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    kreal scale = (kreal)(1.0 / sqrt((double)hs));
    int drop = rng && p > 0.0f;
    uint32_t thresh = dropout_threshold(p);
    kreal keep_scale = drop ? (kreal)(1.0 / (1.0 - (double)p)) : (kreal)1;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int len = key_len(seq_lens, b, T);
            for (int t = 0; t < T; t++) {
                kreal *g = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                for (int d = 0; d < hs; d++)
                    g[d] = g[C + d] = g[2 * C + d] = 0;
            }
            for (int i = 0; i < T; i++) {
                const kreal *a = att + (((size_t)b * NH + h) * T + i) * T;
                kreal *da = datt + (((size_t)b * NH + h) * T + i) * T;
                const kreal *go = dout + ((size_t)b * T + i) * C + h * hs;
                size_t base = (((size_t)b * NH + h) * T + i) * T;
                /* through the context matmul and the dropout mask */
                for (int j = 0; j < len; j++) {
                    kreal m = keep_scale;
                    if (drop && philox_stream_u32(rng, base + j) < thresh)
                        m = 0;
                    const kreal *v = qkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    kreal *dv = dqkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    kreal s = 0, w = a[j] * m;
                    for (int d = 0; d < hs; d++) {
                        s += go[d] * v[d];
                        dv[d] += w * go[d];
                    }
                    da[j] = s * m;
                }
                /* through the softmax */
                kreal dot = 0;
                for (int j = 0; j < len; j++)
                    dot += a[j] * da[j];
                for (int j = 0; j < len; j++)
                    da[j] = a[j] * (da[j] - dot) * scale;
                for (int j = len; j < T; j++)
                    da[j] = 0;
                /* through the scores q.k */
                const kreal *q = qkv + ((size_t)b * T + i) * C3 + h * hs;
                kreal *dq = dqkv + ((size_t)b * T + i) * C3 + h * hs;
                for (int j = 0; j < len; j++) {
                    const kreal *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    kreal *dk = dqkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    kreal s = da[j];
                    for (int d = 0; d < hs; d++) {
                        dq[d] += s * k[d];
                        dk[d] += s * q[d];
                    }
                }
            }
        }
    }
}
