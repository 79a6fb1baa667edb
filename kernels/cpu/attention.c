/* attention — scaled dot-product self-attention with a key padding mask and
 * dropout on the probabilities, over a fused QKV projection. The QKV and
 * output projections themselves are matmul ops.
 *
 * OpenMP over (b, h); inside, single-threaded GEMMs on strided views of qkv
 * (leading dim 3C), restricted to the len = seq_lens[b] real keys. Dropped
 * probabilities are never stored: forward and backward rebuild them from att
 * and the Philox mask, ROWBLOCK rows at a time in a fixed stack buffer, so
 * the op allocates nothing. */
#include "kernels/cpu/kcpu.h"
#include <string.h>

#define ROWBUF 8192 /* elements of the per-thread masked-probability buffer */

/* dst[k] = draw of element start + k, k < n <= 256: whole Philox blocks of
 * 8 calls (32 draws) at a time so they vectorize. */
static void draws(const philox_stream *s, uint64_t start, int n, uint32_t *dst)
{
    uint64_t g0 = start >> 2, g1 = (start + (uint64_t)n - 1) >> 2;
    for (uint64_t g = g0; g <= g1; g += 8) {
        uint32_t ctr0[8], u[4][8];
        for (int l = 0; l < 8; l++)
            ctr0[l] = (uint32_t)(g + (uint64_t)l);
        philox4x32_10_x8(u, ctr0, s->ctr, s->key);
        for (int l = 0; l < 8; l++)
            for (int w = 0; w < 4; w++) {
                uint64_t idx = (g + (uint64_t)l) * 4 + (uint64_t)w;
                if (idx >= start && idx < start + (uint64_t)n)
                    dst[idx - start] = u[w][l];
            }
    }
}

/* x[j] = keep ? x[j] * scale : 0 for j < len, mask of elements base + j. */
static void apply_mask(kreal *dst, const kreal *src, int len, uint64_t base,
                       const philox_stream *rng, uint32_t thresh, kreal scale)
{
    uint32_t u[256];
    for (int j0 = 0; j0 < len; j0 += 256) {
        int n = len - j0 < 256 ? len - j0 : 256;
        draws(rng, base + (uint64_t)j0, n, u);
        for (int k = 0; k < n; k++)
            dst[j0 + k] = u[k] >= thresh ? src[j0 + k] * scale : 0;
    }
}

static inline int key_len(const int32_t *seq_lens, int b, int T)
{
    /* A zero length would mask every key; treat it as one real token so the
     * row stays a distribution (the loader never produces empty rows). */
    int n = seq_lens ? seq_lens[b] : T;
    return n < 1 ? 1 : (n > T ? T : n);
}

/* buf (rows, len) = att rows [r0, r0+rows) masked by dropout and rescaled. */
static void dropped_rows(kreal *buf, const kreal *A, int r0, int rows, int len, int T,
                         size_t base, const philox_stream *rng, uint32_t thresh, kreal keep)
{
    for (int r = 0; r < rows; r++)
        apply_mask(buf + (size_t)r * len, A + (size_t)(r0 + r) * T, len,
                   base + (size_t)(r0 + r) * T, rng, thresh, keep);
}

void KOP(attention_forward)(kreal *out, kreal *att, const kreal *qkv, const int32_t *seq_lens,
                            const philox_stream *rng, float p, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    kreal scale = (kreal)(1.0 / sqrt((double)hs));
    int drop = rng && p > 0.0f;
    uint32_t thresh = dropout_threshold(p);
    kreal keep = drop ? (kreal)(1.0 / (1.0 - (double)p)) : (kreal)1;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int len = key_len(seq_lens, b, T);
            const kreal *Q = qkv + (size_t)b * T * C3 + h * hs, *K = Q + C, *V = Q + 2 * C;
            kreal *A = att + ((size_t)b * NH + h) * T * T; // (T,T)
            kreal *O = out + (size_t)b * T * C + h * hs;   // (T,hs) ld C
            size_t base = ((size_t)b * NH + h) * T * T;
            // scores (T,len) = scale * Q K^T
            K_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, T, len, hs, scale, Q, C3, K, C3, 0.0,
                   A, T);
            for (int i = 0; i < T; i++) {
                kreal *a = A + (size_t)i * T, maxv = -INFINITY, sum = 0;
                for (int j = 0; j < len; j++)
                    maxv = a[j] > maxv ? a[j] : maxv;
                for (int j = 0; j < len; j++) {
                    a[j] = K_EXP(a[j] - maxv);
                    sum += a[j];
                }
                kreal inv = 1 / sum;
                for (int j = 0; j < len; j++)
                    a[j] *= inv;
                for (int j = len; j < T; j++)
                    a[j] = 0;
            }
            // context (T,hs) = P_dropped (T,len) @ V (len,hs)
            if (!drop) {
                K_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, len, 1.0, A, T, V, C3,
                       0.0, O, C);
                continue;
            }
            kreal buf[ROWBUF];
            int R = ROWBUF / len > 0 ? ROWBUF / len : 1;
            for (int r0 = 0; r0 < T; r0 += R) {
                int rows = r0 + R < T ? R : T - r0;
                dropped_rows(buf, A, r0, rows, len, T, base, rng, thresh, keep);
                K_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, len, 1.0, buf, len,
                       V, C3, 0.0, O + (size_t)r0 * C, C);
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
    kreal keep = drop ? (kreal)(1.0 / (1.0 - (double)p)) : (kreal)1;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int len = key_len(seq_lens, b, T);
            const kreal *Q = qkv + (size_t)b * T * C3 + h * hs, *K = Q + C, *V = Q + 2 * C;
            kreal *dQ = dqkv + (size_t)b * T * C3 + h * hs, *dK = dQ + C, *dV = dQ + 2 * C;
            const kreal *A = att + ((size_t)b * NH + h) * T * T;
            const kreal *dO = dout + (size_t)b * T * C + h * hs;
            kreal *D = datt + ((size_t)b * NH + h) * T * T;
            size_t base = ((size_t)b * NH + h) * T * T;
            for (int t = 0; t < T; t++) {
                kreal *g = dQ + (size_t)t * C3;
                memset(g, 0, hs * sizeof(kreal));
                memset(g + C, 0, hs * sizeof(kreal));
                memset(g + 2 * C, 0, hs * sizeof(kreal));
            }
            // d P_dropped (T,len) = dO V^T
            K_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, T, len, hs, 1.0, dO, C, V, C3, 0.0, D,
                   T);
            // dV (len,hs) = P_dropped^T dO
            if (!drop) {
                K_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, len, hs, T, 1.0, A, T, dO, C, 0.0,
                       dV, C3);
            } else {
                kreal buf[ROWBUF];
                int R = ROWBUF / len > 0 ? ROWBUF / len : 1;
                for (int r0 = 0; r0 < T; r0 += R) {
                    int rows = r0 + R < T ? R : T - r0;
                    dropped_rows(buf, A, r0, rows, len, T, base, rng, thresh, keep);
                    K_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, len, hs, rows, 1.0, buf, len,
                           dO + (size_t)r0 * C, C, 1.0, dV, C3);
                }
            }
            // through the dropout mask and the softmax; dS lands in D, scaled
            for (int i = 0; i < T; i++) {
                const kreal *a = A + (size_t)i * T;
                kreal *d = D + (size_t)i * T;
                if (drop)
                    apply_mask(d, d, len, base + (size_t)i * T, rng, thresh, keep);
                kreal dot = 0;
                for (int j = 0; j < len; j++)
                    dot += a[j] * d[j];
                for (int j = 0; j < len; j++)
                    d[j] = a[j] * (d[j] - dot) * scale;
                for (int j = len; j < T; j++)
                    d[j] = 0;
            }
            // dQ (T,hs) = dS K ; dK (len,hs) = dS^T Q
            K_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, len, 1.0, D, T, K, C3, 0.0,
                   dQ, C3);
            K_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, len, hs, T, 1.0, D, T, Q, C3, 0.0, dK,
                   C3);
        }
    }
}
