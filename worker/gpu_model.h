/* gpu_model — the BERT-for-MLM model of worker/model.h on one CUDA device:
 * the same parameter layout (size table, one span), forward and backward
 * composed from kernels/cuda ops in the activation precision of choice, the
 * optimizer (AdamW / LAMB of worker/optim.h) as multi-tensor kernels over the
 * span, dynamic loss scaling for fp16 (state readable and restorable for
 * checkpoints), and batch upload into two device slots on a copy stream:
 * staged through the model's pinned buffers, or DMA'd straight from the
 * caller's memory (a cudaHostRegister'ed ring slot) with an event the caller
 * waits on before it hands that memory back.
 *
 * Memory: one cudaMalloc per category: parameters (fp32 master span + its
 * 16-bit copy that GEMMs read), gradients (fp32 span), optimizer state
 * (m, v: 2 fp32 spans) and activations (sized for B_max x T x M_max by
 * gpu_model_act_bytes; includes the two device batch slots). A batch that
 * does not fit is refused at create time with the largest B that would.
 * Outside the categories, per thread and inside the SLACK the plan keeps
 * free: the cuBLAS workspace (32 MiB, kernels/cuda/matmul.cu) and, on the
 * cuBLASLt path, one more allocation of 33 MiB (cuBLASLt workspace + fp32
 * bias-gradient scratch, kernels/cuda/lt.cu), both made once at create.
 *
 * GEMMs: the linear layers run through cuBLASLt with the bias added (and the
 * bias gradient summed) in the GEMM's epilogue where cuBLASLt has an
 * algorithm for the shape, else through cuBLAS plus separate bias passes.
 * BERTD_GEMM=cublas in the environment forces the cuBLAS path (read at
 * create; "cublaslt" requires cuBLASLt; unset or "auto" prefers it).
 *
 * Speed levers: BERTD_LEVER_<NAME> (1/on, 0/off; unset: the default) picks
 * the kernels' CUDA_LEVER_* mask at create (gpu_levers_from_env), which the
 * kernels then use process-wide (one model per process). BERTD_LEVER_VOCAB_PAD
 * pads the vocabulary of the device spans to a multiple of 64 (see
 * param_sizes below); what goes in and out of the model stays unpadded.
 *
 * Streams: `compute` runs every kernel; `copy` runs H2D batch copies, ordered
 * with events (a slot is rewritten only after the step that read it is done).
 * A communication hook (gpu_model_set_allreduce) runs between backward and
 * the optimizer on the caller's stream, ordered by events.
 *
 * With nsp = 1 the pooler and next-sentence head of BertForPreTraining run
 * too, and the loss is MLM + NSP as in worker/model.c.
 * This module never exits the process and never does file I/O.
 * Dims: B batch, T seq, C hidden, NH heads, I intermediate, L layers, V vocab,
 * N = B*T, M masked positions.
 */
#ifndef BERTD_WORKER_GPU_MODEL_H
#define BERTD_WORKER_GPU_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#include "kernels/cuda/kernels_cuda.h"
#include "worker/model.h"
#include "worker/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "auto" picks from the device's compute capability: bf16 on sm_80+, fp16
 * (with loss scaling) on sm_70/75, fp32 below. "bf16" | "fp16" | "fp32"
 * force one; bf16 on a device below sm_80 is -ENOTSUP (no bf16 tensor cores).
 * Returns 0 or a negative errno. */
int gpu_precision_pick(const char *want, int device, kdtype *out, char *err, size_t errlen);

/* Device bytes of activations (including batch slots) for a B x T batch with
 * up to M masked positions. */
size_t gpu_model_act_bytes(const bert_config *cfg, kdtype dt, int B, int T, int M);
/* Device bytes of parameters (+16-bit copy), gradients and optimizer state. */
size_t gpu_model_state_bytes(const bert_config *cfg, kdtype dt);

typedef struct gpu_acts gpu_acts; // layout private to gpu_model.c

/* fp16 dynamic loss scaling (torch.cuda.amp.GradScaler defaults). */
typedef struct gpu_loss_scaler {
    float scale;         // current multiplier of the loss; 1 when disabled
    int enabled;
    int growth_interval; // good steps before the scale doubles
    int good_steps;
    long skipped;        // steps skipped for overflow so far
} gpu_loss_scaler;

/* Reduces grads (num floats, device) across ranks, in place, enqueued on
 * stream. Returns 0 or a negative errno. */
typedef int (*gpu_allreduce_fn)(void *ctx, float *grads, size_t num, cudaStream_t stream);

/* Gradient buckets, reduced while backward still runs (bert_grad_bucket):
 * bucket enqueues the reduction of one bucket, its k ranges grads[i][0..
 * num[i]) (one NCCL group), after the work already on the compute stream,
 * without blocking it; finish makes the compute stream wait (on the
 * device) for every bucket enqueued. 0 or a negative errno. */
typedef int (*gpu_bucket_fn)(void *ctx, float *const *grads, const size_t *num, int k, cudaStream_t compute);
typedef int (*gpu_bucket_finish_fn)(void *ctx, cudaStream_t compute);
/* Lever CUDA_LEVER_GRAPH with buckets: the host's bounded wait (a lost
 * peer: -EPIPE, never a hang) for done, an event recorded on the compute
 * stream after a graph launch whose capture holds the buckets. finish runs
 * inside that capture too, where it must only join (make the compute
 * stream wait on the device), never wait on the host. */
typedef int (*gpu_bucket_settle_fn)(void *ctx, cudaEvent_t done);

typedef struct gpu_model {
    bert_config cfg;
    kdtype dt;                     // activation / GEMM operand type
    int gemm_lt;                   // 1: linear layers through cuBLASLt epilogues (BERTD_GEMM)
    unsigned levers;               // CUDA_LEVER_* mask in force (BERTD_LEVER_*)
    int grads_zero;                // 1: grads_memory is known to be all zero
    int device;
    /* Device sizes: as bert_param_sizes, but with the lever
     * CUDA_LEVER_VOCAB_PAD the word embeddings (tied to the decoder) are
     * (Vpad, C) and the decoder bias (Vpad), their rows V..Vpad-1 zero and
     * never updated. num_params is the host layout (checkpoints, HF export,
     * gpu_model_get/set_*), dev_params the device spans' length. */
    size_t param_sizes[BERT_NUM_PARAM_TENSORS];
    size_t num_params;             // host (unpadded) parameter count
    size_t dev_params;             // device span length: num_params + the padding
    int vocab_ld;                  // Vpad: decoder width and logits row length (V without the lever)
    void *params_alloc;            // category 1: [fp32 master | dt copy]
    float *params_memory;          // (dev_params) fp32 master
    bert_params params;            // fp32 pointers into params_memory
    void *params_lp_memory;        // (dev_params) in dt; == params_memory for fp32
    float *grads_memory;           // category 2: (dev_params) fp32
    bert_params grads;
    float *opt_memory;             // category 3: (2, dev_params) m then v
    void *acts_memory;             // category 4
    size_t acts_bytes;
    gpu_acts *acts;
    int max_B, T, max_M;           // capacity of the activations
    /* optimizer */
    optim_config ocfg;
    long t;                        // updates applied so far
    cuda_chunk *chunks;            // device (num_chunks)
    int num_chunks, num_segs;
    uint8_t *seg_decay;            // device (num_segs)
    double *seg_norms;             // device (2, num_segs) LAMB scratch
    double *sumsq;                 // device (1)
    int *nonfinite;                // device (1)
    gpu_loss_scaler scaler;
    /* streams and batch staging */
    cudaStream_t compute, copy;
    cudaEvent_t slot_ready[2], slot_free[2], loss_ready;
    int32_t *host_slot[2];         // pinned staging, each laid out as a device slot
    int staged, cur;               // slot of the last upload / of the last forward (-1 none)
    bert_batch batch[2];           // shapes of each slot (B, T, M only)
    int emb_runs[2];               // distinct token ids of each slot's batch (its order's runs)
    float *loss_host;              // pinned (2): sums of the MLM and NSP losses of the last forward
    double *norm_host;             // pinned (1)
    int *flag_host;                // pinned (1)
    gpu_allreduce_fn allreduce;
    void *allreduce_ctx;
    cudaStream_t comm;             // stream given to allreduce (its own, or compute)
    cudaEvent_t grads_ready, comm_done;
    gpu_bucket_fn bucket;          // overlapped reduction (gpu_model_set_buckets)
    gpu_bucket_finish_fn bucket_finish;
    gpu_bucket_settle_fn bucket_settle; // NULL: data parallel steps are not captured
    int comm_pending;              // a launched step's buckets the host has not waited for
    void *bucket_ctx;
    int bucket_armed;              // the next backward enqueues buckets
    int buckets_started;           // the last backward did: step only waits
    cudaEvent_t t_bwd_done, t_comm_waited; // timing: compute stream before/after the comm wait
    float exposed_comm_ms;         // of the last step (GPU timeline), 0 without comm
    int own_comm;                  // comm was created here
    int have_forward;
    bert_dropout dropout_cur;      // masks of the last forward, redrawn in backward
    float loss_scale_fwd;          // loss scale the last forward wrote gradients for
    /* lever CUDA_LEVER_GRAPH (docs/cuda.md, "The step with per-step values
     * on the device"): the kernels read what changes from step to step
     * from device memory, M is padded to a multiple of 64 and the host no
     * longer waits between backward and the optimizer */
    int dev_scalars;               // the lever is on
    int act_M;                     // masked rows the activations and slots hold (padded)
    int mpad[2];                   // rows of each slot's masked block: M, padded with the lever
    void *dscal;                   // device: the per-step scalars (private layout)
    void *opt_args;                // device: the optimizer's argument block (cuda_opt_args_bytes)
    cudaEvent_t step_done;         // after the step's gnorm and skip copies to the host
    int step_pending;              // a step enqueued whose result the host has not read
    int step_timed;                // ... with the exposed communication timed
    double step_lr;                // ... its learning rate
    void *graphs;                  // the captured micro-batches (gpu_model_train_micro)
    int graph_off;                 // a capture failed: eager from then on
    long graph_captures, graph_launches; // captures made, graph launches (for tests)
} gpu_model;

/* Creates the model on `device` with activations for up to max_B x T with up
 * to max_M masked positions, parameters zeroed, optimizer oc. Checks the
 * memory first: when the whole does not fit in free device memory, returns
 * -ENOMEM with err naming what was needed, what is free and the largest
 * max_B that fits (max_M scaled with it). Caller owns; gpu_model_destroy. */
/* The CUDA_LEVER_* mask the environment asks for: CUDA_LEVERS_DEFAULT with
 * each BERTD_LEVER_<NAME> that is set (1/on, 0/off) applied. 0, or -EINVAL
 * with err naming the variable and its bad value. */
int gpu_levers_from_env(unsigned *out, char *err, size_t errlen);
int gpu_model_create(gpu_model **out, const bert_config *cfg, kdtype dt, int device, int max_B,
                     int T, int max_M, const optim_config *oc, char *err, size_t errlen);
/* The same, keeping `reserve` bytes free besides for what is created later
 * on the device (gpu_model_comm_reserve_bytes for a data-parallel worker). */
int gpu_model_create_reserving(gpu_model **out, const bert_config *cfg, kdtype dt, int device,
                               int max_B, int T, int max_M, const optim_config *oc,
                               size_t reserve, char *err, size_t errlen);
/* Device memory a data-parallel worker's communicator needs after the model
 * exists: NCCL's buffers (an estimate) and, with a 16-bit reduction
 * (lowp_reduce), the staging of the gradients; 0 for world 1. */
size_t gpu_model_comm_reserve_bytes(const bert_config *cfg, int world, int lowp_reduce);
void gpu_model_destroy(gpu_model *g);

/* Copies fp32 parameters (num_params, host, the unpadded layout of
 * worker/model.h) in, refreshing the 16-bit copy; and out. Synchronous. The
 * get/set functions below all speak the host layout, whatever the device
 * padding (CUDA_LEVER_VOCAB_PAD). */
int gpu_model_set_params(gpu_model *g, const float *host);
int gpu_model_get_params(gpu_model *g, float *host);
/* The gradients as they are now: after gpu_model_step with the lever
 * CUDA_LEVER_OPT_ZERO on (the default) they are all zero, since the
 * optimizer cleared them; read them between backward and step. */
int gpu_model_get_grads(gpu_model *g, float *host);
/* Optimizer state (2*num_params: m then v, host layout) in and out, for
 * checkpoints. */
int gpu_model_get_opt_state(gpu_model *g, float *host);
int gpu_model_set_opt_state(gpu_model *g, const float *host, long t);

/* Validates b and enqueues its copy into the next device slot (pinned
 * staging, copy stream). Returns once b's arrays are copied into the staging
 * buffer: the caller may reuse them at once; the next forward uses the slot.
 * -EINVAL with err for a batch that does not fit the model or capacity. */
int gpu_model_upload(gpu_model *g, const bert_batch *b, char *err, size_t errlen);
/* As gpu_model_upload, but input_ids, token_type_ids and seq_lens (2N + B
 * ints, the bulk of a batch) are DMA'd on the copy stream straight from the
 * caller's memory, without a host copy: a true asynchronous DMA when that
 * memory is page-locked (a cudaHostRegister'ed ring slot area), the driver's
 * staged pageable copy otherwise. The rest (masked positions and labels, NSP
 * labels, CLS rows: 2M + 2B ints, flattened on the host anyway) still goes
 * through the pinned staging buffer. The caller must keep those three arrays
 * unchanged until gpu_model_upload_wait has returned 0 (a ring slot is
 * released only then). */
int gpu_model_upload_inplace(gpu_model *g, const bert_batch *b, char *err, size_t errlen);
/* Blocks until the last upload's copy has finished reading host memory: a
 * cudaEventSynchronize on that copy's event alone, never a device-wide or
 * compute-stream sync (the copy may still wait, on the device, for the step
 * that last read its device slot). 0, -EINVAL without an upload, or -EIO. */
int gpu_model_upload_wait(gpu_model *g);
/* Copies the device slot of the last upload back, synchronously (tests and
 * debugging): n must be 2N + 3B + 2M for that batch; host gets ids (N),
 * types (N), lens (B), positions (M), labels (M), NSP labels (B), CLS rows
 * (B). With the lever CUDA_LEVER_GRAPH, M is the padded count (mpad): the
 * real rows first, then label -1 rows. 0, -EINVAL, or -EIO. */
int gpu_model_read_staged(gpu_model *g, int32_t *host, size_t n);
/* Forward on the last uploaded batch. loss_scale > 0: training; the MLM head
 * writes the gradient of loss_scale * loss in place for backward. 0: eval
 * only. Asynchronous; gpu_model_loss waits for the loss. */
int gpu_model_forward(gpu_model *g, const bert_dropout *d, float loss_scale);
/* Loss of the last forward, mean MLM (+ mean NSP when nsp = 1), as
 * worker/model.c's m->loss (waits for it). */
float gpu_model_loss(gpu_model *g);
/* Held-out evaluation of b (worker/eval.c): uploads it, runs the forward
 * without dropout and without a gradient, and adds its masked-LM sums to
 * *acc as bert_model_eval does: per-token losses from the device (fp32,
 * from logits in the activation precision), argmax over the logits copied to
 * the host (M x V of them per batch). Synchronous; the next training step
 * starts as after any forward. A batch larger than the capacity (max_B,
 * max_M) is evaluated in runs of sequences that fit (the sums add up).
 * -EINVAL with err for a batch the model cannot take (another T, bad ids),
 * -ENOMEM, -EIO for a CUDA error. */
int gpu_model_eval(gpu_model *g, const bert_batch *b, bert_eval_sums *acc, char *err, size_t errlen);
/* Zeroes the gradients (one memset on the compute stream). With the lever
 * CUDA_LEVER_OPT_ZERO on, nothing when they are known to be zero already:
 * fresh, or cleared by the optimizer or an earlier zero_grad (a backward or
 * a skipped step makes them nonzero). */
void gpu_model_zero_grad(gpu_model *g);
/* Accumulates (+=) into grads the gradient of loss_scale * loss of the last
 * forward, which must have been a training forward. */
int gpu_model_backward(gpu_model *g);

/* The communication hook; NULL fn removes it. stream NULL: a stream of the
 * model's own is created for it. */
int gpu_model_set_allreduce(gpu_model *g, gpu_allreduce_fn fn, void *ctx, cudaStream_t stream);

/* Overlapped reduction: bucket/finish hooks (NULL bucket removes them).
 * Used only for a backward armed by gpu_model_reduce_in_next_backward; a
 * step after an unarmed backward falls back to the all-reduce hook. */
int gpu_model_set_buckets(gpu_model *g, gpu_bucket_fn bucket, gpu_bucket_finish_fn finish, void *ctx);
/* Arms the bucket hooks for the next gpu_model_backward only: call it before
 * the backward of a step's last micro-batch (earlier micro-batches still add
 * to the gradients, so their buckets would not be final). As that backward
 * finishes layer l (L-1 first) it enqueues bucket l; after layer 0, bucket
 * L but its first range (biases, LayerNorms, heads: final by then); right
 * after the embedding backward, that first range (the tied word embeddings,
 * position and type embeddings, embedding LayerNorm), the last bucket.
 * gpu_model_step then only waits for them. */
void gpu_model_reduce_in_next_backward(gpu_model *g);
/* Lever CUDA_LEVER_GRAPH: lets gpu_model_train_micro capture a data
 * parallel step (its last micro-batch's buckets and the step), the
 * bucket hooks' context passed to settle. Without it (or without bucket
 * hooks) gpu_model_train_micro refuses a model with a communication hook. */
void gpu_model_set_bucket_settle(gpu_model *g, gpu_bucket_settle_fn settle);
/* Milliseconds the compute stream waited for gradient communication in the
 * last gpu_model_step (the exposed all-reduce, measured with CUDA events on
 * the GPU timeline); 0 when nothing was reduced. */
float gpu_model_exposed_comm_ms(const gpu_model *g);
/* Whether the model runs the fused (flash) attention kernels: 16-bit
 * activations, a head dim and length cuda_flash_attention_supported takes,
 * and BERTD_ATTENTION not "unfused" at create; which form of them
 * (CUDA_LEVER_FLASH2) is in g->levers. Fixed for the model's life. */
int gpu_model_attention_fused(const gpu_model *g);

/* One optimizer update from the accumulated (loss-scaled) gradients:
 * all-reduce hook, global norm, overflow check (fp16: a non-finite gradient
 * skips the update and halves the scale; otherwise non-finite is -ERANGE),
 * unscale and clip folded into the update, lr from the schedule at index t.
 * *skipped is set to 1 when the step was skipped. Reports lr and the
 * unscaled gradient norm. Synchronizes once: for the norm, between the
 * norm and the update; with the lever CUDA_LEVER_GRAPH the norm, clip and
 * skip are decided on the device and the wait comes after the update.
 * -EINVAL while a gpu_model_train_micro step is unread. */
int gpu_model_step(gpu_model *g, double *lr_out, double *gnorm_out, int *skipped);

/* Lever CUDA_LEVER_GRAPH (created with BERTD_LEVER_GRAPH=1), a model
 * without communication hooks (one device), or with bucket hooks and
 * gpu_model_set_bucket_settle (data parallel: with last = 1 the buckets
 * are reduced in its backward, armed here, and the step waits for them,
 * inside the graph; gpu_model_loss and gpu_model_step_wait first wait
 * through settle, bounded): forward and backward of the
 * uploaded batch, and with last = 1 the optimizer step after them, as one
 * CUDA graph launch (captured at the second call with the same shapes,
 * replayed from then on; the first runs the same kernels eagerly, and so
 * does every call after a capture failed). The same bits as
 * gpu_model_forward + gpu_model_backward (+ gpu_model_step) with the lever.
 * Asynchronous: gpu_model_loss waits for the loss; after last = 1,
 * gpu_model_step_wait must read the step's result before the next
 * train_micro. loss_scale > 0 (training). -EINVAL when the lever is off,
 * nothing is uploaded, a step's result is unread or other hooks are set;
 * -EIO; a bucket hook's error (-EPIPE). */
int gpu_model_train_micro(gpu_model *g, const bert_dropout *d, float loss_scale, int last);
/* Waits for the step train_micro(last = 1) enqueued and reports it as
 * gpu_model_step does (lr, gnorm, skipped; -ERANGE for a non-finite norm
 * without loss scaling). -EINVAL when no step is pending. */
int gpu_model_step_wait(gpu_model *g, double *lr_out, double *gnorm_out, int *skipped);

/* Loss scale to pass to the next forward (1 unless fp16). */
float gpu_model_loss_scale(const gpu_model *g);
/* The loss scaler's state, for checkpoints. */
void gpu_model_get_scaler(const gpu_model *g, gpu_loss_scaler *out);
/* Restores a saved state (resume). A model that does not scale (bf16, fp32)
 * ignores it and keeps scale 1; a saved state that did not scale (a CPU,
 * bf16 or fp32 run) leaves this model's defaults. -EINVAL, model unchanged,
 * for an impossible state: scale not finite or <= 0, growth_interval < 1,
 * good_steps outside [0, growth_interval), skipped < 0. */
int gpu_model_set_scaler(gpu_model *g, const gpu_loss_scaler *s);

#ifdef __cplusplus
}
#endif
#endif
