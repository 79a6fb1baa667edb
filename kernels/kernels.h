/* kernels — backend-neutral signatures of every op the BERT model is built from.
 *
 * The CPU backend (kernels/cpu/) is the fp32 reference; the CUDA twins
 * (kernels/cuda/) keep these names and argument order and only add a stream.
 * Argument order: outputs, saved-for-backward, inputs, weights, dims.
 * Backward writes its gradients first. Gradient rule: parameter gradients are
 * accumulated (+=), activation gradients are overwritten (=).
 *
 * Dimension letters: B batch, T sequence, C hidden, NH heads, I intermediate,
 * V vocab, N = B*T rows, M masked positions, P max positions.
 * Weights use PyTorch's nn.Linear layout: (out_features, in_features).
 *
 * The same sources are also compiled with KERNELS_F64 defined: kreal becomes
 * double and every op name gains an _f64 suffix. That variant exists only so
 * tests can check backward passes by float64 finite differences of the very
 * code the backend runs. This module never allocates and never touches
 * anything but its arguments.
 */
#if defined(KERNELS_F64) ? !defined(BERTD_KERNELS_F64_H) : !defined(BERTD_KERNELS_H)
#ifdef KERNELS_F64
#define BERTD_KERNELS_F64_H
typedef double kreal;
#define KOP(name) name##_f64
#else
#define BERTD_KERNELS_H
typedef float kreal;
#define KOP(name) name
#endif

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- counter-based RNG (Philox4x32-10), exact resume, docs/formats.md ----
 * A dropout mask is a pure function of (seed, rank, step, micro, layer, site,
 * element index), so a resumed job redraws exactly the masks it would have
 * drawn, and backward regenerates the mask instead of storing it. */
#ifndef BERTD_PHILOX_DECLARED
#define BERTD_PHILOX_DECLARED
typedef struct philox_stream {
    uint32_t key[2];   /* seed, rank */
    uint32_t ctr[3];   /* step, layer << 8 | site, micro; word 0 is the element group */
    /* CUDA launches only (CPU code never reads it): NULL, or a DEVICE
     * pointer to two uint32 {step, micro} that the kernels read at their
     * start in place of ctr[0] and ctr[2], so a captured CUDA graph replays
     * with the values of the step it runs (kernels_cuda.h, docs/cuda.md). */
    const uint32_t *dev_ctr;
} philox_stream;

/* Dropout sites within a layer; the embedding dropout uses layer = L. */
enum { DROPOUT_SITE_EMB = 0, DROPOUT_SITE_ATTN_PROBS = 1, DROPOUT_SITE_ATTN_OUT = 2,
       DROPOUT_SITE_FFN_OUT = 3 };

void philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]);
/* Eight calls at once: counters (ctr0[l], ctr_hi[0..2]); out[w][l] is word w
 * of lane l. Same bits as philox4x32_10, vectorizable. */
void philox4x32_10_x8(uint32_t out[4][8], const uint32_t ctr0[8], const uint32_t ctr_hi[3],
                      const uint32_t key[2]);
/* Sets every field; dev_ctr = NULL. */
void philox_stream_init(philox_stream *s, uint64_t seed, uint32_t rank, uint32_t step,
                        uint32_t micro, uint32_t layer, uint32_t site);
/* The uint32 drawn for element i of the stream (4 per Philox call). */
uint32_t philox_stream_u32(const philox_stream *s, uint64_t i);
/* Keep threshold for drop probability p: element kept iff u32 >= threshold. */
uint32_t dropout_threshold(float p);
#endif

/* Embedding sum: out = wte[inp] + wpe[t] + wtt[token_type]. */
void KOP(embeddings_forward)(kreal *out,              // (B,T,C)
                             const int32_t *inp,      // (B,T)
                             const int32_t *tok_type, // (B,T)
                             const kreal *wte,        // (V,C)
                             const kreal *wpe,        // (P,C)
                             const kreal *wtt,        // (2,C)
                             int B, int T, int C);
void KOP(embeddings_backward)(kreal *dwte, kreal *dwpe, kreal *dwtt, const kreal *dout,
                              const int32_t *inp, const int32_t *tok_type, int B, int T, int C);

/* LayerNorm over the last dim of N rows; mean and rstd are saved for backward. */
void KOP(layernorm_forward)(kreal *out, kreal *mean, kreal *rstd, // (N,C) (N) (N)
                            const kreal *inp, const kreal *weight, const kreal *bias,
                            int N, int C, float eps);
void KOP(layernorm_backward)(kreal *dinp, kreal *dweight, kreal *dbias, const kreal *dout,
                             const kreal *inp, const kreal *weight, const kreal *mean,
                             const kreal *rstd, int N, int C);

/* out (N,OC) = inp (N,C) @ weight^T (OC,C) + bias (OC, may be NULL). */
void KOP(matmul_forward)(kreal *out, const kreal *inp, const kreal *weight, const kreal *bias,
                         int N, int C, int OC);
/* dinp (may be NULL) =, dweight +=, dbias (may be NULL) +=. */
void KOP(matmul_backward)(kreal *dinp, kreal *dweight, kreal *dbias, const kreal *dout,
                          const kreal *inp, const kreal *weight, int N, int C, int OC);

/* Self-attention core on a fused QKV projection (B,T,3C) laid out [q|k|v],
 * heads contiguous within each part. Keys at t >= seq_lens[b] are masked out
 * (HF's additive finfo.min mask underflows to exactly 0 probability, as here).
 * att keeps the softmax probabilities before dropout; dropout on the
 * probabilities is drawn from `rng` (NULL or p == 0: none). */
void KOP(attention_forward)(kreal *out,       // (B,T,C) context
                            kreal *att,       // (B,NH,T,T) probabilities
                            const kreal *qkv, // (B,T,3C)
                            const int32_t *seq_lens, // (B)
                            const philox_stream *rng, float p,
                            int B, int T, int C, int NH);
void KOP(attention_backward)(kreal *dqkv,     // (B,T,3C)
                             kreal *datt,     // (B,NH,T,T) scratch
                             const kreal *dout, const kreal *qkv, const kreal *att,
                             const int32_t *seq_lens, const philox_stream *rng, float p,
                             int B, int T, int C, int NH);

/* GELU, erf form (HF hidden_act "gelu"). */
void KOP(gelu_forward)(kreal *out, const kreal *inp, size_t N);
void KOP(gelu_backward)(kreal *dinp, const kreal *inp, const kreal *dout, size_t N);
/* GELU, tanh form (HF hidden_act "gelu_new" and "gelu_pytorch_tanh"):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). inp is saved for backward. */
void KOP(gelu_tanh_forward)(kreal *out, const kreal *inp, size_t N);
void KOP(gelu_tanh_backward)(kreal *dinp, const kreal *inp, const kreal *dout, size_t N);

/* tanh (BERT pooler). out is saved for backward. */
void KOP(tanh_forward)(kreal *out, const kreal *inp, size_t N);
void KOP(tanh_backward)(kreal *dinp, const kreal *out, const kreal *dout, size_t N);

/* Inverted dropout: out = inp * keep / (1-p). p == 0 or rng NULL copies. */
void KOP(dropout_forward)(kreal *out, const kreal *inp, const philox_stream *rng, float p,
                          size_t N);
void KOP(dropout_backward)(kreal *dinp, const kreal *dout, const philox_stream *rng, float p,
                           size_t N);

/* out = a + b; backward: da = db = dout. */
void KOP(residual_forward)(kreal *out, const kreal *a, const kreal *b, size_t N);
void KOP(residual_backward)(kreal *da, kreal *db, const kreal *dout, size_t N);

/* Row gather for the MLM head: out[m] = inp[rows[m]]; backward scatters into
 * dinp, which the caller must have zeroed (rows are distinct in practice, but
 * repeated rows accumulate correctly). */
void KOP(gather_rows_forward)(kreal *out, const kreal *inp, const int32_t *rows, int M, int C);
void KOP(gather_rows_backward)(kreal *dinp, const kreal *dout, const int32_t *rows, int M, int C);

/* Fused softmax + cross-entropy over V classes for M rows. probs are saved.
 * losses[m] = -log softmax(logits[m])[targets[m]]. */
void KOP(crossentropy_softmax_forward)(kreal *losses, kreal *probs, // (M) (M,V)
                                       const kreal *logits, const int32_t *targets,
                                       int M, int V);
/* dlogits = (probs - onehot(target)) * dlosses[m]. */
void KOP(crossentropy_softmax_backward)(kreal *dlogits, const kreal *probs,
                                        const int32_t *targets, const kreal *dlosses,
                                        int M, int V);

#ifdef __cplusplus
}
#endif
#endif
