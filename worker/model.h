/* model — post-LayerNorm BERT exactly as HF BertForMaskedLM (and, with nsp,
 * BertForPreTraining): layout of parameters, forward and backward composed
 * from kernels/ ops, initialisation.
 *
 * Parameters, gradients and activations each live in ONE allocation with a
 * size table and a pointer table aimed into it, so all-reduce, checkpointing,
 * the optimizer and zeroing treat them as spans. The decoder of the MLM head
 * is tied to the word embeddings (it is wte). Q, K and V are stored fused as
 * qkvw (L, 3C, C) = [query; key; value]; hf.c splits and joins them.
 * This module never does I/O and never decides to exit.
 *
 * Dims: B batch, T seq, C hidden, NH heads, I intermediate, L layers,
 * V vocab, P max positions, N = B*T, M masked positions.
 */
#ifndef BERTD_WORKER_MODEL_H
#define BERTD_WORKER_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

typedef struct bert_config {
    int vocab_size;              // V
    int hidden_size;             // C
    int num_hidden_layers;       // L
    int num_attention_heads;     // NH
    int intermediate_size;       // I
    int max_position_embeddings; // P
    int type_vocab_size;
    int pad_token_id;
    float hidden_dropout_prob;
    float attention_probs_dropout_prob;
    float layer_norm_eps;
    float initializer_range;
    int nsp;                     // 1: pooler + next-sentence head (BertForPreTraining)
    int act;                     // hidden_act, a bert_act (0: "gelu")
} bert_config;

/* hidden_act: the activation of the FFN and of the MLM head transform.
 * GELU's erf form is HF "gelu"; its tanh form is HF "gelu_new" and
 * "gelu_pytorch_tanh" (the same function; the name is kept so that an
 * export writes back what was imported). */
typedef enum bert_act {
    BERT_ACT_GELU = 0,
    BERT_ACT_GELU_NEW,
    BERT_ACT_GELU_PYTORCH_TANH,
} bert_act;
/* The HF name of act; NULL if act is out of range. */
const char *bert_act_name(int act);
/* The bert_act named name, or -1 when unsupported. */
int bert_act_parse(const char *name);
/* 1 when act is GELU's tanh form. */
int bert_act_is_tanh(int act);
/* The message for an unsupported hidden_act: it names the supported ones. */
#define BERT_ACT_SUPPORTED "\"gelu\" (erf form), \"gelu_new\" or \"gelu_pytorch_tanh\" (tanh form)"

/* Fills cfg from a preset name (bert-tiny, bert-mini, bert-small, bert-medium,
 * bert-base, bert-large), HF BertConfig defaults otherwise. -ENOENT if unknown. */
int bert_config_preset(bert_config *cfg, const char *name);
/* Applies BertConfig keys from obj over cfg (unknown keys are ignored only if
 * they are HF bookkeeping; wrong types are -EINVAL). err gets a message. */
int bert_config_apply_json(bert_config *cfg, const json_t *obj, char *err, size_t errlen);
/* 0, or -EINVAL with a message naming the field. */
int bert_config_validate(const bert_config *cfg, char *err, size_t errlen);
/* A new reference to an HF config.json object for cfg. Caller owns. */
json_t *bert_config_to_json(const bert_config *cfg);

enum {
    BP_WTE, BP_WPE, BP_WTT, BP_EMB_LNW, BP_EMB_LNB,
    BP_QKVW, BP_QKVB, BP_ATTPROJW, BP_ATTPROJB, BP_LN1W, BP_LN1B,
    BP_FCW, BP_FCB, BP_FCPROJW, BP_FCPROJB, BP_LN2W, BP_LN2B,
    BP_HEAD_W, BP_HEAD_B, BP_HEAD_LNW, BP_HEAD_LNB, BP_DEC_B,
    BP_POOL_W, BP_POOL_B, BP_NSP_W, BP_NSP_B,
    BERT_NUM_PARAM_TENSORS
};

typedef struct bert_params {
    float *wte;      // (V,C)  also the MLM decoder weight
    float *wpe;      // (P,C)
    float *wtt;      // (type_vocab,C)
    float *emb_lnw;  // (C)
    float *emb_lnb;  // (C)
    float *qkvw;     // (L,3C,C)
    float *qkvb;     // (L,3C)
    float *attprojw; // (L,C,C)
    float *attprojb; // (L,C)
    float *ln1w;     // (L,C)
    float *ln1b;     // (L,C)
    float *fcw;      // (L,I,C)
    float *fcb;      // (L,I)
    float *fcprojw;  // (L,C,I)
    float *fcprojb;  // (L,C)
    float *ln2w;     // (L,C)
    float *ln2b;     // (L,C)
    float *head_w;   // (C,C)  cls.predictions.transform.dense
    float *head_b;   // (C)
    float *head_lnw; // (C)
    float *head_lnb; // (C)
    float *dec_b;    // (V)    cls.predictions.bias
    float *pool_w;   // (C,C)  nsp only
    float *pool_b;   // (C)
    float *nsp_w;    // (2,C)
    float *nsp_b;    // (2)
} bert_params;

/* Sizes in floats of each parameter tensor (0 for absent NSP tensors). */
void bert_param_sizes(const bert_config *cfg, size_t sizes[BERT_NUM_PARAM_TENSORS]);
/* 1 if weight decay applies to tensor i (not biases, not LayerNorm). */
int bert_param_decays(int i);
const char *bert_param_name(int i);
/* The parameter span cut into HF's tensors (per layer, Q/K/V apart), in memory
 * order: sizes and decay flags, for per-tensor optimizer math (LAMB trust
 * ratios). Returns the count; writes at most cap entries. */
int bert_param_segments(const bert_config *cfg, size_t *sizes, int *decays, int cap);

/* Gradient buckets, for all-reducing gradients while backward still runs
 * (CUDA data parallel). Backward finishes layer L-1 first and the
 * embeddings last; a layer's four weight matrices (QKV, attention output,
 * FFN in and out: >99% of a layer's parameters) are final once that layer's
 * backward is done, each one contiguous range of the span. Bucket l (0..L-1)
 * is layer l's four matrices; bucket L is everything else — embeddings and
 * the decoder weight tied to them, every layer's biases and LayerNorms, the
 * heads — final only when backward ends. Writes the bucket's ranges as
 * (offset, floats) into off/n, adjacent ranges merged; returns how many (at
 * most BERT_BUCKET_MAX_RANGES), or -EINVAL for a bucket outside 0..L. Over
 * buckets 0..L the ranges cover the span exactly once. */
#define BERT_BUCKET_MAX_RANGES 8
int bert_grad_bucket(const bert_config *cfg, int bucket, size_t off[BERT_BUCKET_MAX_RANGES],
                     size_t n[BERT_BUCKET_MAX_RANGES]);

enum {
    BA_EMB, BA_EMB_LN, BA_EMB_MEAN, BA_EMB_RSTD, BA_X0,
    BA_QKV, BA_ATT, BA_ATTY, BA_ATTPROJ, BA_RES1, BA_LN1, BA_LN1_MEAN, BA_LN1_RSTD,
    BA_FCH, BA_FCH_GELU, BA_FCPROJ, BA_RES2, BA_LN2, BA_LN2_MEAN, BA_LN2_RSTD,
    BA_DROP, BA_HSEL, BA_HD, BA_HG, BA_HLN, BA_H_MEAN, BA_H_RSTD, BA_LOGITS, BA_PROBS,
    BA_LOSSES, BA_CLS, BA_POOL_PRE, BA_POOLED, BA_NSP_LOGITS, BA_NSP_PROBS, BA_NSP_LOSSES,
    /* backward scratch, shared by all layers */
    BA_D_RES, BA_D_TMP, BA_D_TMP2, BA_D_QKV, BA_D_ATT, BA_D_FCH, BA_D_FCH_GELU,
    BA_D_H1, BA_D_H2, BA_D_LOSSES, BA_D_CLS, BA_D_POOL, BA_D_NSP,
    BERT_NUM_ACT_TENSORS
};

typedef struct bert_acts {
    float *emb, *emb_ln, *emb_mean, *emb_rstd, *x0;       // (N,C) (N,C) (N) (N) (N,C)
    float *qkv;                                            // (L,N,3C)
    float *att;                                            // (L,B,NH,T,T) probs before dropout
    float *atty, *attproj, *res1, *ln1, *ln1_mean, *ln1_rstd; // (L,N,C) x4, (L,N) x2
    float *fch, *fch_gelu;                                 // (L,N,I)
    float *fcproj, *res2, *ln2, *ln2_mean, *ln2_rstd;      // (L,N,C) x3, (L,N) x2
    float *drop;                                           // (N,C) dropout output scratch
    float *hsel, *hd, *hg, *hln, *h_mean, *h_rstd;         // (M,C) x4, (M) x2
    float *logits, *probs, *losses;                        // (M,V) (M,V) (M)
    float *cls, *pool_pre, *pooled, *nsp_logits, *nsp_probs, *nsp_losses; // (B,C)x3 (B,2)x2 (B)
    float *d_res, *d_tmp, *d_tmp2, *d_qkv, *d_att, *d_fch, *d_fch_gelu;  // (N,C)x3 (N,3C) (B,NH,T,T) (N,I)x2
    float *d_h1, *d_h2, *d_losses, *d_cls, *d_pool, *d_nsp;           // (M,C)x2 (M) (B,C)x2 (B,2)
} bert_acts;

typedef struct bert_batch {
    int B, T, M;
    const int32_t *input_ids;      // (B,T)
    const int32_t *token_type_ids; // (B,T)
    const int32_t *seq_lens;       // (B) attention mask = t < seq_lens[b]
    const int32_t *mlm_positions;  // (M) flattened b*T+t
    const int32_t *mlm_labels;     // (M)
    const int32_t *nsp_labels;     // (B) or NULL
} bert_batch;

/* Which dropout masks a forward pass draws (docs/formats.md: dropout and exact resume). */
typedef struct bert_dropout {
    int train;        // 0: no dropout at all (eval)
    uint64_t seed;
    uint32_t rank, step, micro;
} bert_dropout;

typedef struct bert_model {
    bert_config cfg;
    size_t param_sizes[BERT_NUM_PARAM_TENSORS];
    size_t num_params;
    float *params_memory;           // (num_params)
    bert_params params;             // pointers into params_memory
    float *grads_memory;            // (num_params)
    bert_params grads;
    size_t act_sizes[BERT_NUM_ACT_TENSORS];
    size_t num_acts;
    float *acts_memory;
    bert_acts acts;
    int act_B, act_T, act_M;        // capacity of the activation buffers
    /* state of the last forward, needed by backward */
    bert_batch batch;
    bert_dropout dropout;
    int have_forward;
    float loss, mlm_loss, nsp_loss; // of the last forward (mean over M / over B)
} bert_model;

/* Allocates parameters (zeroed) and gradients for cfg. Caller owns; free with
 * bert_model_destroy. -EINVAL for a bad config, -ENOMEM. */
int bert_model_create(bert_model **out, const bert_config *cfg);
void bert_model_destroy(bert_model *m);
/* HF _init_weights: Linear/Embedding ~ N(0, initializer_range), padding row
 * and biases 0, LayerNorm 1/0. Deterministic in seed (Philox). */
void bert_model_init_weights(bert_model *m, uint64_t seed);
/* 0, or -EINVAL if the batch does not fit the config (ids, lengths, positions). */
int bert_batch_validate(const bert_model *m, const bert_batch *b, char *err, size_t errlen);
/* Forward pass; sets m->loss. Keeps pointers to b's arrays until backward. */
int bert_model_forward(bert_model *m, const bert_batch *b, const bert_dropout *d);
/* Sums of a held-out evaluation (worker/eval.c): masked-LM cross-entropy
 * summed over masked tokens (nats), the masked-token count, and how many of
 * them the argmax of the logits predicts (ties: the lowest id, as
 * torch.argmax). Doubles, so the ranks' shares add up exactly enough. */
typedef struct bert_eval_sums {
    double loss_sum, count, correct;
} bert_eval_sums;
/* Forward of b without dropout, adding its masked-LM sums to *acc (+=).
 * Overwrites the activations: no backward may follow. 0 or as forward. */
int bert_model_eval(bert_model *m, const bert_batch *b, bert_eval_sums *acc);
/* Adds to *acc the sums over the M masked rows of logits (M,V) with
 * per-row losses (M,) and labels (M,): shared with gpu_model's eval. */
void bert_eval_accumulate(const float *logits, const float *losses, const int32_t *labels, int M, int V,
                          bert_eval_sums *acc);
void bert_model_zero_grad(bert_model *m);
/* Accumulates (+=) into m->grads the gradient of loss_scale * m->loss. */
int bert_model_backward(bert_model *m, float loss_scale);
/* Sets the OpenMP thread count for this process; OpenBLAS is kept at one
 * thread because matmul.c runs one GEMM per OpenMP thread. */
void bert_set_threads(int n);

#endif
