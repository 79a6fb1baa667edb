/* test_flash_algo — the algorithm of kernels/cuda/flash_attention.cu, written
 * out in plain C with the kernel's tile order, online softmax, logsumexp,
 * recomputation and dropout indexing, checked against the CPU attention op
 * (kernels/cpu/attention.c). The CUDA kernel cannot run here (no GPU); this
 * checks the math it implements, so a GPU-side mismatch points at the CUDA
 * mechanics (indexing, wmma, synchronisation) rather than at the algorithm.
 *
 * What mirrors the kernel, one C function per kernel:
 *   fa_forward     query tiles of BR rows, key tiles of BC keys up to len,
 *                  running max/sum per row, each row split into the two
 *                  halves that the two lanes of a pair reduce, O rescaled by
 *                  alpha, lse = m + log l, O / l at the end;
 *   fa_backward_dq D_i = dO_i . O_i from the stored output, P recomputed as
 *                  exp(scale*s - lse), dS = P (dPd*m*k - D) scale, dQ += dS K;
 *   fa_backward_dkv key tiles of BK keys (all-masked tiles write zeros),
 *                  query tiles of BRQ rows over all T queries, transposed
 *                  tiles S^T = K Q^T and dPd^T = V dO^T, one keep4 per
 *                  (query, 4 keys), dV += Pd^T dO, dK += dS^T Q;
 *   keep4          the kernel's Philox grouping (one or two calls per 4
 *                  consecutive elements), checked against philox_stream_u32.
 * Rows past T and keys past len are zero-filled tiles, as in shared memory.
 *
 * Built twice: with FA_REAL=double against the _f64 ops (tolerance 1e-12,
 * normwise relative: the two differ only by summation order) and with
 * FA_REAL=float against the fp32 ops (1e-5, the GPU tests' fp32 rule).
 * Nothing is finite-differenced: the CPU op is the reference, itself checked
 * by finite differences in test_ops_fd and against HuggingFace in the model
 * tests.
 */
#ifdef FA_F64
#define KERNELS_F64
#endif
#include "kernels/kernels.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#ifdef FA_F64
typedef double real;
#define TOL 1e-12
#else
typedef float real;
#define TOL 1e-5
#endif

/* tile sizes of one kernel configuration (kernels/cuda/flash_attention.cu
 * flash_cfg: 16-bit hs <= 64, 16-bit hs 128, fp32) */
typedef struct tiles {
    int br, bc;      // forward: query rows per block, keys per tile
    int br_dq, bc_dq; // backward dQ kernel
    int bk, brq;     // backward dK/dV kernel: keys per block, queries per tile
} tiles;

static const tiles CFG[] = {
    {64, 64, 64, 32, 64, 32}, // 16-bit, hs 64 (hs 32: dq keys 64)
    {64, 32, 32, 32, 32, 32}, // 16-bit, hs 128
    {32, 32, 32, 32, 32, 16}, // fp32
    {64, 64, 64, 64, 64, 32}, // 16-bit, hs 32
};

static int key_len(const int32_t *lens, int b, int T)
{
    int n = lens ? lens[b] : T;
    return n < 1 ? 1 : (n > T ? T : n);
}

/* bit e set iff element idx0 + e is kept: the kernel's keep4 */
static uint32_t keep4(const philox_stream *s, uint64_t idx0, uint32_t thresh)
{
    uint32_t g0 = (uint32_t)(idx0 >> 2), w[8] = {0};
    int off = (int)(idx0 & 3);
    uint32_t c0[4] = {g0, s->ctr[0], s->ctr[1], s->ctr[2]};
    philox4x32_10(w, c0, s->key);
    if (off) {
        uint32_t c1[4] = {g0 + 1u, s->ctr[0], s->ctr[1], s->ctr[2]};
        philox4x32_10(w + 4, c1, s->key);
    }
    uint32_t bits = 0;
    for (int e = 0; e < 4; e++)
        bits |= (w[off + e] >= thresh ? 1u : 0u) << e;
    return bits;
}

typedef struct fa_op {
    int B, T, C, NH, hs, drop;
    real scale, keep_scale;
    uint32_t thresh;
    const philox_stream *rng;
    const int32_t *lens;
} fa_op;

static fa_op fa_make(const int32_t *lens, const philox_stream *rng, float p, int B, int T, int C,
                     int NH)
{
    fa_op o = {.B = B, .T = T, .C = C, .NH = NH, .hs = C / NH, .lens = lens, .rng = rng};
    o.scale = (real)(1.0 / sqrt((double)o.hs));
    o.drop = rng && p > 0.0f;
    o.thresh = dropout_threshold(p);
    o.keep_scale = o.drop ? (real)(1.0 / (1.0 - (double)p)) : (real)1;
    return o;
}

/* dst (rows, hs) = rows [r0, r0+rows) of a (B,T,stride) tensor at column
 * offset col for batch b; rows >= nvalid (relative) are zero */
static void load_tile(real *dst, const real *src, int b, int T, size_t stride, size_t col,
                      int r0, int rows, int nvalid, int hs)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < hs; c++)
            dst[(size_t)r * hs + c] =
                r < nvalid ? src[((size_t)b * T + r0 + r) * stride + col + c] : (real)0;
}

/* C (m,n) (+)= A (m,k) op(B); op(B) = B (k,n) or, bt, B^T with B (n,k) */
static void mm(real *Cm, const real *A, const real *Bm, int m, int n, int k, int bt, int acc)
{
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++) {
            real s = acc ? Cm[(size_t)r * n + c] : (real)0;
            for (int kk = 0; kk < k; kk++)
                s += A[(size_t)r * k + kk] * (bt ? Bm[(size_t)c * k + kk] : Bm[(size_t)kk * n + c]);
            Cm[(size_t)r * n + c] = s;
        }
}

static void *xmalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    assert_non_null(p);
    return p;
}

/* lse is fp32 on the GPU, as in the float build; the double build keeps it
 * in double so that 1e-12 measures the algorithm, not the storage */
#ifdef FA_F64
typedef double lse_t;
#else
typedef float lse_t;
#endif

static void fa_forward(real *out, lse_t *lse, const real *qkv, const fa_op *o, int BR, int BC)
{
    int T = o->T, C = o->C, hs = o->hs;
    size_t C3 = 3 * (size_t)C;
    real *Q = xmalloc(sizeof(real) * BR * hs), *K = xmalloc(sizeof(real) * BC * hs),
         *V = xmalloc(sizeof(real) * BC * hs), *O = xmalloc(sizeof(real) * BR * hs),
         *S = xmalloc(sizeof(real) * BR * BC), *P = xmalloc(sizeof(real) * BR * BC),
         *m_run = xmalloc(sizeof(real) * BR), *l_run = xmalloc(sizeof(real) * BR);
    for (int bh = 0; bh < o->B * o->NH; bh++) {
        int b = bh / o->NH, h = bh % o->NH, len = key_len(o->lens, b, T);
        for (int q0 = 0; q0 < T; q0 += BR) {
            load_tile(Q, qkv, b, T, C3, (size_t)h * hs, q0, BR, T - q0, hs);
            memset(O, 0, sizeof(real) * BR * hs);
            for (int r = 0; r < BR; r++) {
                m_run[r] = -INFINITY;
                l_run[r] = 0;
            }
            for (int k0 = 0; k0 < len; k0 += BC) {
                load_tile(K, qkv, b, T, C3, C + (size_t)h * hs, k0, BC, len - k0, hs);
                load_tile(V, qkv, b, T, C3, 2 * (size_t)C + (size_t)h * hs, k0, BC, len - k0, hs);
                mm(S, Q, K, BR, BC, hs, 1, 0);
                for (int r = 0; r < BR; r++) {
                    int i = q0 + r;
                    uint64_t rowbase = ((uint64_t)bh * T + (uint64_t)i) * (uint64_t)T;
                    real sv[64], mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0, 0};
                    for (int c = 0; c < BC; c++) {
                        sv[c] = k0 + c < len ? S[(size_t)r * BC + c] * o->scale : -INFINITY;
                        int half = c >= BC / 2;
                        mx[half] = sv[c] > mx[half] ? sv[c] : mx[half];
                    }
                    real mxa = mx[0] > mx[1] ? mx[0] : mx[1];
                    real m_new = m_run[r] > mxa ? m_run[r] : mxa;
                    assert_true(isfinite((double)m_new)); // the kernel relies on it
                    real alpha = (real)exp((double)(m_run[r] - m_new));
                    for (int c = 0; c < BC; c += 4) {
                        uint32_t bits = o->drop ? keep4(o->rng, rowbase + (uint64_t)(k0 + c),
                                                        o->thresh)
                                                : 0xFu;
                        for (int e = 0; e < 4; e++) {
                            real p = (real)exp((double)(sv[c + e] - m_new));
                            sum[c >= BC / 2] += p;
                            P[(size_t)r * BC + c + e] =
                                o->drop ? ((bits >> e) & 1u ? p * o->keep_scale : 0) : p;
                        }
                    }
                    l_run[r] = l_run[r] * alpha + (sum[0] + sum[1]);
                    m_run[r] = m_new;
                    for (int c = 0; c < hs; c++)
                        O[(size_t)r * hs + c] *= alpha;
                }
                mm(O, P, V, BR, hs, BC, 0, 1);
            }
            for (int r = 0; r < BR && q0 + r < T; r++) {
                int i = q0 + r;
                for (int c = 0; c < hs; c++)
                    out[((size_t)b * T + i) * C + (size_t)h * hs + c] =
                        O[(size_t)r * hs + c] * (1 / l_run[r]);
                lse[(size_t)bh * T + i] = (lse_t)(m_run[r] + (real)log((double)l_run[r]));
            }
        }
    }
    free(Q); free(K); free(V); free(O); free(S); free(P); free(m_run); free(l_run);
}


static void fa_backward_dq(real *dqkv, lse_t *dbuf, const real *dout, const real *qkv,
                           const real *out, const lse_t *lse, const fa_op *o, int BR, int BC)
{
    int T = o->T, C = o->C, hs = o->hs;
    size_t C3 = 3 * (size_t)C;
    real *Q = xmalloc(sizeof(real) * BR * hs), *dO = xmalloc(sizeof(real) * BR * hs),
         *K = xmalloc(sizeof(real) * BC * hs), *V = xmalloc(sizeof(real) * BC * hs),
         *dQ = xmalloc(sizeof(real) * BR * hs), *S = xmalloc(sizeof(real) * BR * BC),
         *dP = xmalloc(sizeof(real) * BR * BC), *dS = xmalloc(sizeof(real) * BR * BC),
         *D = xmalloc(sizeof(real) * BR), *L = xmalloc(sizeof(real) * BR);
    for (int bh = 0; bh < o->B * o->NH; bh++) {
        int b = bh / o->NH, h = bh % o->NH, len = key_len(o->lens, b, T);
        for (int q0 = 0; q0 < T; q0 += BR) {
            load_tile(Q, qkv, b, T, C3, (size_t)h * hs, q0, BR, T - q0, hs);
            load_tile(dO, dout, b, T, C, (size_t)h * hs, q0, BR, T - q0, hs);
            memset(dQ, 0, sizeof(real) * BR * hs);
            for (int r = 0; r < BR; r++) {
                int i = q0 + r;
                real d[2] = {0, 0};
                if (i < T)
                    for (int c = 0; c < hs; c++)
                        d[c >= hs / 2] += dO[(size_t)r * hs + c] *
                                          out[((size_t)b * T + i) * C + (size_t)h * hs + c];
                D[r] = d[0] + d[1];
                L[r] = i < T ? (real)lse[(size_t)bh * T + i] : 0;
                if (i < T)
                    dbuf[(size_t)bh * T + i] = (lse_t)D[r];
            }
            for (int k0 = 0; k0 < len; k0 += BC) {
                load_tile(K, qkv, b, T, C3, C + (size_t)h * hs, k0, BC, len - k0, hs);
                load_tile(V, qkv, b, T, C3, 2 * (size_t)C + (size_t)h * hs, k0, BC, len - k0, hs);
                mm(S, Q, K, BR, BC, hs, 1, 0);
                mm(dP, dO, V, BR, BC, hs, 1, 0);
                for (int r = 0; r < BR; r++) {
                    uint64_t rowbase = ((uint64_t)bh * T + (uint64_t)(q0 + r)) * (uint64_t)T;
                    for (int c = 0; c < BC; c += 4) {
                        uint32_t bits = o->drop ? keep4(o->rng, rowbase + (uint64_t)(k0 + c),
                                                        o->thresh)
                                                : 0xFu;
                        for (int e = 0; e < 4; e++) {
                            size_t x = (size_t)r * BC + c + e;
                            real p = k0 + c + e < len
                                         ? (real)exp((double)(S[x] * o->scale - L[r]))
                                         : 0;
                            real mk = o->drop ? ((bits >> e) & 1u ? o->keep_scale : 0) : 1;
                            dS[x] = p * (dP[x] * mk - D[r]) * o->scale;
                        }
                    }
                }
                mm(dQ, dS, K, BR, hs, BC, 0, 1);
            }
            for (int r = 0; r < BR && q0 + r < T; r++)
                for (int c = 0; c < hs; c++)
                    dqkv[((size_t)b * T + q0 + r) * C3 + (size_t)h * hs + c] = dQ[(size_t)r * hs + c];
        }
    }
    free(Q); free(dO); free(K); free(V); free(dQ); free(S); free(dP); free(dS); free(D); free(L);
}

static void fa_backward_dkv(real *dqkv, const real *dout, const real *qkv, const lse_t *lse,
                            const lse_t *dbuf, const fa_op *o, int BK, int BRQ)
{
    int T = o->T, C = o->C, hs = o->hs;
    size_t C3 = 3 * (size_t)C;
    real *K = xmalloc(sizeof(real) * BK * hs), *V = xmalloc(sizeof(real) * BK * hs),
         *Q = xmalloc(sizeof(real) * BRQ * hs), *dO = xmalloc(sizeof(real) * BRQ * hs),
         *dK = xmalloc(sizeof(real) * BK * hs), *dV = xmalloc(sizeof(real) * BK * hs),
         *ST = xmalloc(sizeof(real) * BK * BRQ), *dPT = xmalloc(sizeof(real) * BK * BRQ),
         *PT = xmalloc(sizeof(real) * BK * BRQ), *dST = xmalloc(sizeof(real) * BK * BRQ),
         *L = xmalloc(sizeof(real) * BRQ), *D = xmalloc(sizeof(real) * BRQ);
    for (int bh = 0; bh < o->B * o->NH; bh++) {
        int b = bh / o->NH, h = bh % o->NH, len = key_len(o->lens, b, T);
        for (int k0 = 0; k0 < T; k0 += BK) {
            real *dkrow = dqkv + (size_t)b * T * C3 + C + (size_t)h * hs, *dvrow = dkrow + C;
            if (k0 >= len) { // all keys masked: zero gradients
                for (int j = k0; j < T && j < k0 + BK; j++)
                    for (int c = 0; c < hs; c++)
                        dkrow[(size_t)j * C3 + c] = dvrow[(size_t)j * C3 + c] = 0;
                continue;
            }
            load_tile(K, qkv, b, T, C3, C + (size_t)h * hs, k0, BK, len - k0, hs);
            load_tile(V, qkv, b, T, C3, 2 * (size_t)C + (size_t)h * hs, k0, BK, len - k0, hs);
            memset(dK, 0, sizeof(real) * BK * hs);
            memset(dV, 0, sizeof(real) * BK * hs);
            for (int q0 = 0; q0 < T; q0 += BRQ) {
                load_tile(Q, qkv, b, T, C3, (size_t)h * hs, q0, BRQ, T - q0, hs);
                load_tile(dO, dout, b, T, C, (size_t)h * hs, q0, BRQ, T - q0, hs);
                for (int c = 0; c < BRQ; c++) {
                    L[c] = q0 + c < T ? (real)lse[(size_t)bh * T + q0 + c] : 0;
                    D[c] = q0 + c < T ? (real)dbuf[(size_t)bh * T + q0 + c] : 0;
                }
                mm(ST, K, Q, BK, BRQ, hs, 1, 0);
                mm(dPT, V, dO, BK, BRQ, hs, 1, 0);
                for (int kr = 0; kr < BK; kr += 4) { // one lane: 4 keys x one query
                    int j = k0 + kr;
                    for (int c = 0; c < BRQ; c++) {
                        int i = q0 + c;
                        uint64_t idx0 = ((uint64_t)bh * T + (uint64_t)i) * (uint64_t)T + (uint64_t)j;
                        uint32_t bits = o->drop ? keep4(o->rng, idx0, o->thresh) : 0xFu;
                        for (int e = 0; e < 4; e++) {
                            size_t x = (size_t)(kr + e) * BRQ + c;
                            real p = (i < T && j + e < len)
                                         ? (real)exp((double)(ST[x] * o->scale - L[c]))
                                         : 0;
                            real mk = o->drop ? ((bits >> e) & 1u ? o->keep_scale : 0) : 1;
                            PT[x] = p * mk;
                            dST[x] = p * (dPT[x] * mk - D[c]) * o->scale;
                        }
                    }
                }
                mm(dV, PT, dO, BK, hs, BRQ, 0, 1);
                mm(dK, dST, Q, BK, hs, BRQ, 0, 1);
            }
            for (int r = 0; r < BK && k0 + r < T; r++)
                for (int c = 0; c < hs; c++) {
                    dkrow[(size_t)(k0 + r) * C3 + c] = dK[(size_t)r * hs + c];
                    dvrow[(size_t)(k0 + r) * C3 + c] = dV[(size_t)r * hs + c];
                }
        }
    }
    free(K); free(V); free(Q); free(dO); free(dK); free(dV); free(ST); free(dPT); free(PT);
    free(dST); free(L); free(D);
}

/* ---- checks ---- */
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static double urand(void) // uniform in [-1, 1)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* normwise relative error; a non-finite got is a failure */
static double rel_err(const real *got, const real *ref, size_t n)
{
    double maxref = 0, maxerr = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite((double)got[i]))
            return INFINITY;
        double r = fabs((double)ref[i]), e = fabs((double)got[i] - (double)ref[i]);
        maxref = r > maxref ? r : maxref;
        maxerr = e > maxerr ? e : maxerr;
    }
    assert_true(maxref > 0); // an all-zero reference would make the test vacuous
    return maxerr / maxref;
}

static void check_case(int B, int T, int NH, int hs, const int32_t *lens, float p, const tiles *tl)
{
    int C = NH * hs;
    size_t N = (size_t)B * T, nq = N * 3 * C, nc = N * C, na = (size_t)B * NH * T * T,
           nl = (size_t)B * NH * T;
    philox_stream rs;
    philox_stream_init(&rs, 0xFEEDull + (uint64_t)T, 1, 17, 2, 5, DROPOUT_SITE_ATTN_PROBS);
    const philox_stream *r = p > 0 ? &rs : NULL;
    real *qkv = xmalloc(nq * sizeof(real)), *dy = xmalloc(nc * sizeof(real));
    for (size_t i = 0; i < nq; i++)
        qkv[i] = (real)(2.0 * urand()); // scores of a few units: a peaked softmax
    for (size_t i = 0; i < nc; i++)
        dy[i] = (real)urand();
    real *ref = xmalloc(nc * sizeof(real)), *att = xmalloc(na * sizeof(real)),
         *dref = xmalloc(nq * sizeof(real)), *datt = xmalloc(na * sizeof(real)),
         *out = xmalloc(nc * sizeof(real)), *dqkv = xmalloc(nq * sizeof(real));
    lse_t *lse = xmalloc(nl * sizeof(lse_t)), *dbuf = xmalloc(nl * sizeof(lse_t));
    KOP(attention_forward)(ref, att, qkv, lens, r, p, B, T, C, NH);
    KOP(attention_backward)(dref, datt, dy, qkv, att, lens, r, p, B, T, C, NH);

    for (size_t i = 0; i < nc; i++)
        out[i] = (real)NAN; // poisoned: every element must be written
    for (size_t i = 0; i < nq; i++)
        dqkv[i] = (real)NAN;
    for (size_t i = 0; i < nl; i++)
        lse[i] = dbuf[i] = (lse_t)NAN;
    fa_op o = fa_make(lens, r, p, B, T, C, NH);
    fa_forward(out, lse, qkv, &o, tl->br, tl->bc);
    double ef = rel_err(out, ref, nc);

    /* lse: exp(scale q_i.k_j - lse_i) must reproduce the CPU's probabilities
     * (the backward recomputes them exactly so); max absolute error */
    double el = 0;
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, len = key_len(lens, b, T);
        for (int i = 0; i < T; i++) {
            const real *q = qkv + ((size_t)b * T + i) * 3 * C + (size_t)h * hs;
            for (int j = 0; j < len; j++) {
                const real *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                double s = 0;
                for (int c = 0; c < hs; c++)
                    s += (double)q[c] * (double)k[c];
                double pr = exp(s * (double)o.scale - (double)lse[(size_t)bh * T + i]);
                double e = fabs(pr - (double)att[((size_t)bh * T + i) * T + j]);
                el = e > el || !isfinite(e) ? e : el;
            }
        }
    }
    fa_backward_dq(dqkv, dbuf, dy, qkv, out, lse, &o, tl->br_dq, tl->bc_dq);
    fa_backward_dkv(dqkv, dy, qkv, lse, dbuf, &o, tl->bk, tl->brq);
    double eb = rel_err(dqkv, dref, nq);
    printf("  B%d T%-3d NH%d hs%-3d p%.1f tiles %d/%d %d/%d %d/%d: fwd %.2e lse %.2e bwd %.2e\n",
           B, T, NH, hs, p, tl->br, tl->bc, tl->br_dq, tl->bc_dq, tl->bk, tl->brq, ef, el, eb);
    assert_true(ef <= TOL);
    assert_true(el <= TOL); // probabilities are <= 1: absolute = relative to scale
    assert_true(eb <= TOL);
    free(qkv); free(dy); free(ref); free(att); free(dref); free(datt); free(out); free(dqkv);
    free(lse); free(dbuf);
}

/* keep4's grouping equals element-wise philox_stream_u32, aligned or not */
static void test_keep4(void **state)
{
    (void)state;
    philox_stream s;
    philox_stream_init(&s, 99, 3, 4, 1, 7, DROPOUT_SITE_ATTN_PROBS);
    uint32_t thresh = dropout_threshold(0.5f);
    uint64_t bases[] = {0, 1, 2, 3, 4, 4093, 70 * 70 + 13, (1ull << 34) - 6, (1ull << 34) - 1};
    int kept = 0, total = 0;
    for (size_t bi = 0; bi < sizeof bases / sizeof *bases; bi++)
        for (uint64_t d = 0; d < 64; d++) {
            uint64_t idx0 = bases[bi] + d;
            uint32_t bits = keep4(&s, idx0, thresh);
            for (int e = 0; e < 4; e++) {
                int want = philox_stream_u32(&s, idx0 + (uint64_t)e) >= thresh;
                assert_int_equal((int)((bits >> e) & 1u), want);
                kept += want;
                total++;
            }
        }
    assert_true(kept > total / 4 && kept < 3 * total / 4); // p = 0.5 really drops
}

static void test_small_odd(void **state)
{
    (void)state;
    int32_t lens[3] = {13, 8, 1}; // T % 4 != 0: unaligned Philox groups; a 1-key row
    for (size_t t = 0; t < sizeof CFG / sizeof *CFG; t++) {
        check_case(3, 13, 2, 32, lens, 0.0f, &CFG[t]);
        check_case(3, 13, 2, 32, lens, 0.1f, &CFG[t]);
    }
}

static void test_t70_padding(void **state)
{
    (void)state;
    int32_t lens[2] = {70, 33}; // key tiles partly masked, whole masked key blocks
    check_case(2, 70, 2, 64, lens, 0.1f, &CFG[0]);
    check_case(2, 70, 1, 128, lens, 0.1f, &CFG[1]);
    check_case(2, 70, 2, 64, lens, 0.1f, &CFG[2]);
}

static void test_t128(void **state)
{
    (void)state;
    int32_t lens[2] = {128, 77};
    check_case(2, 128, 2, 64, lens, 0.1f, &CFG[0]);
    check_case(2, 128, 3, 32, lens, 0.0f, &CFG[3]);
    check_case(1, 128, 1, 128, lens + 1, 0.1f, &CFG[1]);
}

static void test_t512(void **state)
{
    (void)state;
    int32_t lens[1] = {389};
    check_case(1, 512, 1, 64, lens, 0.1f, &CFG[0]);
    check_case(1, 512, 1, 32, lens, 0.1f, &CFG[2]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep4),
        cmocka_unit_test(test_small_odd),
        cmocka_unit_test(test_t70_padding),
        cmocka_unit_test(test_t128),
        cmocka_unit_test(test_t512),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
