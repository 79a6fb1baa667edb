/* kernels_cuda — the CUDA twins of kernels/kernels.h, plus the fused and
 * mixed-precision ops only the GPU backend has.
 *
 * Naming: the twin of CPU op `x` is `cuda_x`, same argument order, fp32, with
 * a trailing cudaStream_t. `cuda_x_dt` is the same op with activations in
 * the element type `dt` (fp32, bf16 or fp16; passed as void *) and fp32
 * accumulation; parameters (LayerNorm weights, biases, embedding tables),
 * parameter gradients, LayerNorm statistics and losses stay fp32. GEMM weights
 * are read in the activation type: the caller keeps a low-precision copy of
 * the fp32 master weights (the optimizer kernels refresh it).
 * Gradient rule as on the CPU: parameter gradients +=, activation gradients =.
 *
 * Where the CPU op needs no workspace but the GPU one does (attention), the
 * twin takes the scratch right after the outputs, as llm.c does.
 * All launches are asynchronous on `stream`; errors in arguments that the CPU
 * would not see (a launch failure) abort through CUDA_CHECK with file:line,
 * as llm.c does: they are programming errors, not bad input. This module
 * allocates device memory only in cuda_kernels_init (the cuBLAS handle and
 * its workspace), cuda_lt_init (the cuBLASLt workspace) and, stream-ordered
 * (cudaMallocAsync/cudaFreeAsync on the op's stream), the chunk partials of
 * the bias and LayerNorm parameter gradients (2 x 32 x C floats), never
 * synchronizes the device (one exception: cuda_embeddings_backward[_dt], for
 * tests; the trainer calls cuda_embeddings_backward_ordered_dt), and never
 * validates user data: callers (worker/gpu_model.c) check shapes and ids
 * first.
 * Every reduction into a parameter gradient has a fixed summation order (no
 * float atomics): the gradients' bits do not depend on scheduling, so a job
 * resumed from a checkpoint ends bit-identical to an uninterrupted one.
 *
 * Dims as in kernels.h: B, T, C, NH, I, V, N = B*T, M masked rows.
 */
#ifndef BERTD_KERNELS_CUDA_H
#define BERTD_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kdtype { KDT_F32 = 0, KDT_BF16 = 1, KDT_F16 = 2 } kdtype;
/* Bytes per element of dt. */
size_t kdtype_size(kdtype dt);
const char *kdtype_name(kdtype dt);

/* ---- speed levers (docs/perf.md, "GPU speed levers") ----
 * Process-wide switches of alternative kernels that compute the same op
 * faster (expected; none measured on a GPU yet). Each is a bit of the mask;
 * worker/gpu_model.c sets the mask from BERTD_LEVER_* when a model is
 * created, tests set it directly. Launchers read it at launch time; a lever
 * whose preconditions a call does not meet falls back to the plain kernel
 * for that call. Not thread-safe against concurrent launches: set it before
 * the first launch. */
enum {
    /* LayerNorm and residual+dropout+LayerNorm rows in 16-byte packs kept
     * in registers, one Philox call per 4 elements (the same mask bits) */
    CUDA_LEVER_LN_VEC = 1u << 0,
    /* zero_grad folded into the AdamW/LAMB kernels (worker/gpu_model.c
     * passes zero_g; the kernels themselves do not read this bit) */
    CUDA_LEVER_OPT_ZERO = 1u << 1,
    /* cuBLASLt: the heuristic's first 4 algorithms per plan timed once per
     * process on the real shapes, the fastest kept (lt.cu). Off by default:
     * timing noise can pick other algorithms in a resumed process, whose
     * results differ in the last bits, so resume is no longer bitwise */
    CUDA_LEVER_LT_TUNE = 1u << 2,
    /* the vocabulary padded to a multiple of 64 on the device: the tied
     * word-embedding/decoder weight and the decoder bias take zero rows in
     * the device spans, the decoder GEMMs run at the padded width, the
     * loss masks the padding (worker/gpu_model.c; the kernels do not read
     * this bit). Off by default until a GPU has measured it */
    CUDA_LEVER_VOCAB_PAD = 1u << 3,
    /* flash attention, second form (flash_attention2.cuh): output and
     * dK/dV accumulators in registers, one backward kernel per head (dQ
     * summed in fp32 in a fixed order, no atomics), K/V and Q/dO tiles
     * double-buffered with cp.async from sm_80. Off by default until a GPU
     * has measured it. A bit of its own, away from the low bits other
     * levers take */
    CUDA_LEVER_FLASH2 = 1u << 8,
    /* the training step captured once per shape in a CUDA graph and
     * replayed (worker/gpu_model.c; the kernels do not read this bit). The
     * step's changing values then live in device memory: the _dev forms
     * below and philox_stream.dev_ctr. Off by default until a GPU has
     * measured it */
    CUDA_LEVER_GRAPH = 1u << 9,
    /* GELU in the FC1 GEMM's cuBLASLt epilogue, both directions: forward
     * GELU_AUX_BIAS (the pre-activation stored as the aux), backward the
     * FC2 dX GEMM with DGELU reading it (worker/gpu_model.c; the kernels do
     * not read this bit). cuBLASLt's GELU is the tanh form, so it applies
     * to tanh-GELU models only (hidden_act "gelu_new", "gelu_pytorch_tanh").
     * Off by default until a GPU has measured it */
    CUDA_LEVER_GELU_EPI = 1u << 10,
};
#define CUDA_LEVERS_DEFAULT ((unsigned)(CUDA_LEVER_LN_VEC | CUDA_LEVER_OPT_ZERO))
void cuda_levers_set(unsigned mask);
unsigned cuda_levers(void);
/* A stream capture by the caller (gpu_model's CUDA graph, lever GRAPH) on
 * this thread: between cuda_capture_begin and cuda_capture_end a kernel
 * launch that fails with a stream-capture error (cudaErrorStreamCapture*,
 * e.g. the capture invalidated by an earlier call) does not abort, as
 * LAUNCH_CHECK does for every other launch error: the first such error is
 * kept, and cuda_capture_end returns it (0: none), so that the caller can
 * end the capture, discard it and run the work eagerly. Nothing runs during
 * a capture, so a launch left out of it leaves no half-done work. */
void cuda_capture_begin(void);
int cuda_capture_end(void);
/* 1 when LayerNorm rows of width C in dt take the vectorized kernel (the
 * lever is on, C is a multiple of the 16-byte pack of dt and C <= 1024),
 * given 16-byte aligned tensors (cudaMalloc's are; a call on less aligned
 * pointers falls back on its own). */
int cuda_layernorm_vectorized(int C, kdtype dt);

/* ---- library state: one cuBLAS handle per thread, bound to a stream ---- */
/* Creates the calling thread's cuBLAS handle and workspace if needed.
 * Returns 0 or -EIO (message logged to stderr). */
int cuda_kernels_init(void);
/* Frees the calling thread's cuBLAS and cuBLASLt handles and workspaces. */
void cuda_kernels_shutdown(void);

/* ---- nn.Linear GEMMs through cuBLASLt with fused epilogues (lt.cu) ----
 * The calling thread's cuBLASLt handle, 32 MiB workspace and 1 MiB of
 * bias-gradient scratch (one cudaMalloc), and its cache of per-shape matmul
 * plans. Like the cuBLAS workspace, one thread's calls must not run on two
 * streams at once. 0, -EIO (no cuBLASLt) or -ENOMEM. */
int cuda_lt_init(void);
void cuda_lt_shutdown(void);
/* Plans cached so far and heuristic queries made, for this thread. */
void cuda_lt_stats(long *plans, long *heuristic_queries);
/* Plans of this thread whose algorithm was picked by timing
 * (CUDA_LEVER_LT_TUNE). */
long cuda_lt_tuned_plans(void);
/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias, all of type dt; bias (OC)
 * is in dt too (the GEMM's bias epilogue reads the output type) and may be
 * NULL. pre != NULL selects the GELU epilogue, which is the TANH form (HF
 * "gelu_new"), not BERT's erf "gelu": pre (N,OC) receives inp@W^T + bias and
 * out = gelu_tanh(pre); it needs OC % 8 == 0.
 * Returns 0, or -ENOTSUP having enqueued nothing when cuBLASLt has no
 * algorithm for this shape, dtype, epilogue and alignment (bias and pre must
 * be 16-byte aligned), or cuda_lt_init has not run on this thread: the
 * caller then uses cuda_matmul_forward_dt. */
int cuda_lt_matmul_forward_dt(void *out, void *pre, const void *inp, const void *weight,
                              const void *bias, int N, int C, int OC, kdtype dt,
                              cudaStream_t stream);
/* The backward of that: dinp (N,C, may be NULL) = dout @ weight, or with pre
 * (N,C: the saved pre-activation of the GELU that produced inp; needs dinp,
 * C % 8 == 0 and 16-byte alignment) dinp = (dout @ weight) * gelu_tanh'(pre); dweight (OC,C)
 * fp32 += dout^T @ inp; dbias (OC, fp32, may be NULL) += column sums of dout
 * (the BGRADB epilogue of the dweight GEMM). Returns 0; -ENOTSUP when
 * cuBLASLt cannot run it: then dweight and dbias are untouched (dinp may have
 * been written) and the caller runs cuda_matmul_backward_dt; -EINVAL for pre
 * without dinp. */
int cuda_lt_matmul_backward_dt(void *dinp, float *dweight, float *dbias, const void *dout,
                               const void *inp, const void *weight, const void *pre, int N,
                               int C, int OC, kdtype dt, cudaStream_t stream);

/* ---- conversions and fills ---- */
void cuda_cast(void *dst, kdtype dst_dt, const void *src, kdtype src_dt, size_t n,
               cudaStream_t stream);
/* Writes a quiet NaN into n elements of dt (tests poison outputs with it). */
void cuda_fill_nan(void *dst, kdtype dt, size_t n, cudaStream_t stream);

/* ---- Philox on the device: must equal kernels/cpu/philox.c bit for bit ----
 * Every launcher that draws dropout (dropout, attention, flash attention,
 * residual+dropout+LayerNorm) honours philox_stream.dev_ctr: when set, each
 * kernel reads {step, micro} from that device memory once at its start in
 * place of ctr[0] and ctr[2]; the same values give the same bits. */
/* out[i] = philox_stream_u32(s, i) for i < n (tests compare it with the CPU). */
void cuda_philox_u32(uint32_t *out, const philox_stream *s, size_t n, cudaStream_t stream);

/* ---- the twins (fp32) ---- */
void cuda_embeddings_forward(float *out, const int32_t *inp, const int32_t *tok_type,
                             const float *wte, const float *wpe, const float *wtt,
                             int B, int T, int C, cudaStream_t stream);
/* Deterministic (fixed summation order). Copies the ids to the host to order
 * them and synchronizes `stream`: for tests; the trainer uploads the order
 * with its batch and calls cuda_embeddings_backward_ordered_dt. */
void cuda_embeddings_backward(float *dwte, float *dwpe, float *dwtt, const float *dout,
                              const int32_t *inp, const int32_t *tok_type, int B, int T, int C,
                              cudaStream_t stream);
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps,
                            cudaStream_t stream);
void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C, cudaStream_t stream);
void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC, cudaStream_t stream);
void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC,
                          cudaStream_t stream);
/* qkvr (3,B,NH,T,hs): q, k, v regrouped per head, saved for backward.
 * scratch: at least B*NH*T*T + B*T*C elements (dropped probabilities and the
 * per-head context); free for other use after the call. */
void cuda_attention_forward(float *out, float *qkvr, float *att, float *scratch,
                            const float *qkv, const int32_t *seq_lens,
                            const philox_stream *rng, float p, int B, int T, int C, int NH,
                            cudaStream_t stream);
/* dqkvr (3,B,NH,T,hs) scratch; datt (B,NH,T,T) scratch; scratch as in forward. */
void cuda_attention_backward(float *dqkv, float *dqkvr, float *datt, float *scratch,
                             const float *dout, const float *qkvr, const float *att,
                             const int32_t *seq_lens, const philox_stream *rng, float p,
                             int B, int T, int C, int NH, cudaStream_t stream);
void cuda_gelu_forward(float *out, const float *inp, size_t N, cudaStream_t stream);
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N,
                        cudaStream_t stream);
void cuda_tanh_forward(float *out, const float *inp, size_t N, cudaStream_t stream);
void cuda_tanh_backward(float *dinp, const float *out, const float *dout, size_t N,
                        cudaStream_t stream);
void cuda_dropout_forward(float *out, const float *inp, const philox_stream *rng, float p,
                          size_t N, cudaStream_t stream);
void cuda_dropout_backward(float *dinp, const float *dout, const philox_stream *rng, float p,
                           size_t N, cudaStream_t stream);
void cuda_residual_forward(float *out, const float *a, const float *b, size_t N,
                           cudaStream_t stream);
void cuda_residual_backward(float *da, float *db, const float *dout, size_t N,
                            cudaStream_t stream);
void cuda_gather_rows_forward(float *out, const float *inp, const int32_t *rows, int M, int C,
                              cudaStream_t stream);
void cuda_gather_rows_backward(float *dinp, const float *dout, const int32_t *rows, int M, int C,
                               cudaStream_t stream);
void cuda_crossentropy_softmax_forward(float *losses, float *probs, const float *logits,
                                       const int32_t *targets, int M, int V,
                                       cudaStream_t stream);
void cuda_crossentropy_softmax_backward(float *dlogits, const float *probs,
                                        const int32_t *targets, const float *dlosses, int M,
                                        int V, cudaStream_t stream);

/* ---- the same ops with activations of type dt (void * = dt elements) ---- */
void cuda_embeddings_forward_dt(void *out, const int32_t *inp, const int32_t *tok_type,
                                const float *wte, const float *wpe, const float *wtt,
                                int B, int T, int C, kdtype dt, cudaStream_t stream);
void cuda_embeddings_backward_dt(float *dwte, float *dwpe, float *dwtt, const void *dout,
                                 const int32_t *inp, const int32_t *tok_type, int B, int T,
                                 int C, kdtype dt, cudaStream_t stream);
/* Host code: the batch positions (N = B*T) in a stable order by token id,
 * order (N) the positions, seg (U+1) where each id's run starts in order
 * (seg[U] = N). Returns U (the distinct ids), -EINVAL for an id outside
 * [0, V), -ENOMEM. worker/gpu_model.c runs it on each batch's ids before
 * upload. */
int cuda_embeddings_order(int32_t *order, int32_t *seg, const int32_t *ids, int N, int V);
/* dwte (V,C), dwpe (T..,C), dwtt (TV,C) += the embedding gradients of dout
 * (B,T,C), summed in a fixed order: dwte one block per run of equal ids in
 * order/seg (device copies of cuda_embeddings_order's output for inp, U
 * runs), position and type rows owned by one block each. Deterministic. */
void cuda_embeddings_backward_ordered_dt(float *dwte, float *dwpe, float *dwtt, const void *dout,
                                         const int32_t *inp, const int32_t *tok_type,
                                         const int32_t *order, const int32_t *seg, int U, int B,
                                         int T, int C, int TV, kdtype dt, cudaStream_t stream);
/* The same with the run count read from device *dU (<= Umax) when the
 * kernel runs: the grid is sized for Umax (B*T at most) and blocks past U
 * return, so one captured launch serves every batch. Same bits as the
 * by-value form with U = *dU. */
void cuda_embeddings_backward_ordered_dev(float *dwte, float *dwpe, float *dwtt,
                                          const void *dout, const int32_t *inp,
                                          const int32_t *tok_type, const int32_t *order,
                                          const int32_t *seg, const int32_t *dU, int Umax, int B,
                                          int T, int C, int TV, kdtype dt, cudaStream_t st);
void cuda_layernorm_forward_dt(void *out, float *mean, float *rstd, const void *inp,
                               const float *weight, const float *bias, int N, int C, float eps,
                               kdtype dt, cudaStream_t stream);
void cuda_layernorm_backward_dt(void *dinp, float *dweight, float *dbias, const void *dout,
                                const void *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C, kdtype dt,
                                cudaStream_t stream);
/* weight is (OC,C) in dt; bias fp32 (may be NULL). */
void cuda_matmul_forward_dt(void *out, const void *inp, const void *weight, const float *bias,
                            int N, int C, int OC, kdtype dt, cudaStream_t stream);
/* dweight and dbias are fp32 (+=); dinp (may be NULL) in dt. */
void cuda_matmul_backward_dt(void *dinp, float *dweight, float *dbias, const void *dout,
                             const void *inp, const void *weight, int N, int C, int OC,
                             kdtype dt, cudaStream_t stream);
void cuda_attention_forward_dt(void *out, void *qkvr, void *att, void *scratch, const void *qkv,
                               const int32_t *seq_lens, const philox_stream *rng, float p,
                               int B, int T, int C, int NH, kdtype dt, cudaStream_t stream);
void cuda_attention_backward_dt(void *dqkv, void *dqkvr, void *datt, void *scratch,
                                const void *dout, const void *qkvr, const void *att,
                                const int32_t *seq_lens, const philox_stream *rng, float p,
                                int B, int T, int C, int NH, kdtype dt, cudaStream_t stream);
void cuda_gelu_forward_dt(void *out, const void *inp, size_t N, kdtype dt, cudaStream_t stream);
/* GELU's tanh form (HF "gelu_new", "gelu_pytorch_tanh"), as kernels.h's
 * gelu_tanh_forward / gelu_tanh_backward. */
void cuda_gelu_tanh_forward_dt(void *out, const void *inp, size_t N, kdtype dt,
                               cudaStream_t stream);
void cuda_gelu_tanh_backward_dt(void *dinp, const void *inp, const void *dout, size_t N,
                                kdtype dt, cudaStream_t stream);
void cuda_gelu_backward_dt(void *dinp, const void *inp, const void *dout, size_t N, kdtype dt,
                           cudaStream_t stream);
void cuda_tanh_forward_dt(void *out, const void *inp, size_t N, kdtype dt, cudaStream_t stream);
void cuda_tanh_backward_dt(void *dinp, const void *out, const void *dout, size_t N, kdtype dt,
                           cudaStream_t stream);
void cuda_dropout_forward_dt(void *out, const void *inp, const philox_stream *rng, float p,
                             size_t N, kdtype dt, cudaStream_t stream);
void cuda_residual_forward_dt(void *out, const void *a, const void *b, size_t N, kdtype dt,
                              cudaStream_t stream);
void cuda_gather_rows_forward_dt(void *out, const void *inp, const int32_t *rows, int M, int C,
                                 kdtype dt, cudaStream_t stream);
/* For 16-bit dt the rows must be distinct (no atomics on 16-bit types before
 * sm_80); MLM positions are. fp32 accumulates repeated rows correctly, with
 * float atomics: deterministic while no row repeats more than twice (the
 * trainer's rows are distinct; kernels/cuda/mlm_head.cuh). */
void cuda_gather_rows_backward_dt(void *dinp, const void *dout, const int32_t *rows, int M,
                                  int C, kdtype dt, cudaStream_t stream);

/* ---- fused (flash) attention: never materialises (B,NH,T,T) ----
 * Same op as cuda_attention_*_dt (same Philox element per probability, so the
 * same dropout mask) on qkv (B,T,3C) as the QKV GEMM writes it: no per-head
 * regrouping. NEVER YET RUN ON A GPU (kernels/cuda/flash_attention.cu).
 * 1 when head dim C/NH is 32, 64 or 128, 1 <= T <= 512 and dt is any kdtype
 * (fp32 exists for checking; it is slow). The ops below abort on anything
 * else and on buffers that are not 16-byte aligned. */
int cuda_flash_attention_supported(int T, int C, int NH, kdtype dt);
/* out (B,T,C) context; lse (B,NH,T) fp32 per-row logsumexp of the scaled
 * scores, saved for backward (with qkv and out). */
void cuda_flash_attention_forward_dt(void *out, float *lse, const void *qkv,
                                     const int32_t *seq_lens, const philox_stream *rng, float p,
                                     int B, int T, int C, int NH, kdtype dt, cudaStream_t stream);
/* dqkv (B,T,3C) =; dscratch (B,NH,T) fp32 scratch; out and lse as forward
 * wrote them. Deterministic (no atomics). Under CUDA_LEVER_FLASH2 dscratch
 * is not touched and a (B,NH,T,HS) fp32 scratch is taken from the device's
 * default pool on the stream for the call. */
void cuda_flash_attention_backward_dt(void *dqkv, float *dscratch, const void *dout,
                                      const void *qkv, const void *out, const float *lse,
                                      const int32_t *seq_lens, const philox_stream *rng, float p,
                                      int B, int T, int C, int NH, kdtype dt,
                                      cudaStream_t stream);

/* ---- fused ops ---- */
/* out (N,OC) += bias (OC) broadcast over rows, in place. */
void cuda_add_bias_dt(void *out, const float *bias, int N, int OC, kdtype dt,
                      cudaStream_t stream);
/* pre (N,OC) += bias; act = gelu(pre). One pass after the FC1 GEMM. */
void cuda_bias_gelu_forward_dt(void *act, void *pre, const float *bias, int N, int OC, kdtype dt,
                               cudaStream_t stream);
/* The same with GELU's tanh form. */
void cuda_bias_gelu_tanh_forward_dt(void *act, void *pre, const float *bias, int N, int OC,
                                    kdtype dt, cudaStream_t stream);
/* res = x + dropout(y); out = layernorm(res). res is kept for backward. */
void cuda_residual_dropout_layernorm_forward_dt(void *out, void *res, float *mean, float *rstd,
                                                const void *x, const void *y,
                                                const philox_stream *rng, float p,
                                                const float *weight, const float *bias, int N,
                                                int C, float eps, kdtype dt,
                                                cudaStream_t stream);
/* The backward of that, with the residual sum of the two gradients that
 * reach `out` folded in: g = dout + dout2 (dout2 may be NULL);
 * dres = layernorm_backward(g) (the gradient of x and of res);
 * dy = dropout_backward(dres). */
void cuda_residual_dropout_layernorm_backward_dt(void *dres, void *dy, float *dweight,
                                                 float *dbias, const void *dout,
                                                 const void *dout2, const void *res,
                                                 const float *weight, const float *mean,
                                                 const float *rstd, const philox_stream *rng,
                                                 float p, int N, int C, kdtype dt,
                                                 cudaStream_t stream);
/* MLM loss over M rows of V logits of type dt, softmax and cross-entropy in
 * one pass per row in fp32 registers: losses[m] (fp32) is written and, when
 * grad_scale != 0, logits are overwritten in place by the gradient
 * (softmax - onehot) * grad_scale. Full fp32 logits never exist. */
void cuda_mlm_xent_fused_dt(float *losses, void *logits, const int32_t *targets, float grad_scale,
                            int M, int V, kdtype dt, cudaStream_t stream);
/* The same over rows of ld >= V logits (a vocabulary padded to ld, lever
 * CUDA_LEVER_VOCAB_PAD): the softmax and the loss see columns 0..V-1 only;
 * when grad_scale != 0 columns V..ld-1 are overwritten with 0, so the
 * padding adds nothing to any gradient whatever the forward left there. */
void cuda_mlm_xent_fused_ld_dt(float *losses, void *logits, const int32_t *targets,
                               float grad_scale, int M, int V, int ld, kdtype dt,
                               cudaStream_t stream);
/* The same two with the gradient scale read from device memory when the
 * kernel runs (*dgrad_scale == 0: no gradient written), so a captured graph
 * replays with the scale of its step. In these and the two forms above a
 * target < 0 marks a padding row: loss 0 and, with a gradient, a row of
 * exact zeros (M padded up to a fixed size with label -1 rows). */
void cuda_mlm_xent_fused_dev(float *losses, void *logits, const int32_t *targets,
                             const float *dgrad_scale, int M, int V, kdtype dt, cudaStream_t st);
void cuda_mlm_xent_fused_ld_dev(float *losses, void *logits, const int32_t *targets,
                                const float *dgrad_scale, int M, int V, int ld, kdtype dt,
                                cudaStream_t st);
/* out[m] = sum over rows (the loss sum, deterministic single block). */
void cuda_sum(float *out, const float *x, int n, cudaStream_t stream);

/* ---- optimizer over the parameter span ---- */
/* A run of one parameter tensor inside the span, as bert_param_segments. */
typedef struct cuda_chunk { uint64_t off; uint32_t len; uint32_t seg; } cuda_chunk;
/* sum of squares (double, +=) of x, and *nonfinite |= 1 if any x is not
 * finite. sumsq and nonfinite are device pointers the caller zeroed. */
void cuda_sumsq_check(double *sumsq, int *nonfinite, const float *x, size_t n,
                      cudaStream_t stream);
/* x *= s over n elements (loss-scale unscaling, clipping). */
void cuda_scale(float *x, float s, size_t n, cudaStream_t stream);
/* One AdamW step (torch semantics, as worker/optim.c, the same float
 * operations in the same order without FMA contraction, so it agrees with the
 * CPU bit for bit) over every chunk: g is multiplied by clip first (pass 1.0
 * for none). decay[seg] (device) says whether weight decay applies; t is the
 * 1-based step for bias correction. Chunks are device memory.
 * p_lp (may be NULL) receives p converted to lp_dt. zero_g != 0 folds
 * zero_grad in: g is left all zero (chunks must cover it), each element
 * cleared right after it is read; 0 leaves g untouched. */
void cuda_adamw_step(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                     const cuda_chunk *chunks, int num_chunks, const uint8_t *decay,
                     double lr, float beta1, float beta2, float eps, float weight_decay,
                     float clip, long t, int zero_g, cudaStream_t stream);
/* One LAMB step (apex FusedLAMB, as worker/optim.c). norms: device scratch of
 * 2 * num_segs doubles. chunks must be in segment order (every segment's
 * chunks in a row, segments ascending), as gpu_model cuts them. zero_g as
 * for cuda_adamw_step. */
void cuda_lamb_step(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                    const cuda_chunk *chunks, int num_chunks, const uint8_t *decay,
                    double *norms, int num_segs, double lr, float beta1, float beta2, float eps,
                    float weight_decay, float clip, long t, int zero_g, cudaStream_t stream);

/* ---- the optimizer with its per-step values in device memory ----
 * For a captured CUDA graph: lr, the bias corrections, the clip/unscale
 * factor and the fp16 skip flag sit in one device block per model that the
 * kernels read at their start, so neither the host nor a host sync sits
 * between backward and the update. */
/* Bytes of the device block (cudaMalloc'd by the caller). */
size_t cuda_opt_args_bytes(void);
/* Computes the step's arguments on the host exactly as the by-value
 * launchers do (clip 1, skip 0) and copies them into dblock (device)
 * asynchronously on st. The host source is staged at the call, so the
 * caller may call again before the copy has run. lamb selects the LAMB
 * layout. 0, or -EINVAL for t < 1 or a NULL dblock. */
int cuda_opt_args_write(void *dblock, int lamb, double lr, float beta1, float beta2, float eps,
                        float weight_decay, long t, cudaStream_t st);
/* One thread on st: gnorm = sqrt(*sumsq) / loss_scale (double);
 * skip = *nonfinite || !isfinite(gnorm); the clip factor as
 * worker/gpu_model.c computes it on the host (AdamW min(1, mgn / (gnorm +
 * 1e-6)), LAMB mgn / max(gnorm, mgn), 1 for max_grad_norm <= 0), times
 * 1 / loss_scale when loss_scale != 1, written with skip into dblock.
 * *gnorm_out = gnorm (INFINITY when skipped), *skip_out = skip: device
 * pointers for the host to copy back. sumsq and nonfinite are those
 * cuda_sumsq_check filled. */
void cuda_opt_clip(void *dblock, int lamb, const double *sumsq, const int *nonfinite,
                   float max_grad_norm, float loss_scale, double *gnorm_out, int *skip_out,
                   cudaStream_t st);
/* cuda_adamw_step / cuda_lamb_step with lr, betas, eps, weight decay, clip
 * and t from dblock (written by cuda_opt_args_write and cuda_opt_clip with
 * the same lamb). When the block's skip is set they change nothing: p,
 * p_lp, m, v and g (even with zero_g) are left as they were. */
void cuda_adamw_step_dev(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                         const cuda_chunk *chunks, int num_chunks, const uint8_t *decay,
                         const void *dblock, int zero_g, cudaStream_t st);
void cuda_lamb_step_dev(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                        const cuda_chunk *chunks, int num_chunks, const uint8_t *decay,
                        double *norms, int num_segs, const void *dblock, int zero_g,
                        cudaStream_t st);

#ifdef __cplusplus
}
#endif
#endif
