/* train — the single-process training loop: owns a model and its optimizer,
 * runs one optimizer step over gradient_accumulation_steps micro-batches,
 * logs every logging_steps and checkpoints every save_steps. Batches come
 * from the caller (the loader's ring or a test); this module never builds
 * data, never talks to other ranks (comm.c does) and never exits.
 */
#ifndef BERTD_WORKER_TRAIN_H
#define BERTD_WORKER_TRAIN_H

#include "common/jobspec.h"
#include "worker/checkpoint.h"
#include "worker/model.h"
#include "worker/optim.h"

typedef struct train_config {
    bert_config model;
    optim_config optim;      // optim.total_steps = max_steps
    int grad_accum;          // gradient_accumulation_steps (>= 1)
    int logging_steps;       // 0: never log
    int save_steps;          // 0: never save
    int save_total_limit;    // keep-last-N; 0 keeps all
    uint64_t seed;
    uint32_t rank;
    int threads;             // OpenMP + OpenBLAS threads for this process
    const char *output_dir;  // checkpoints go to output_dir/ckpt-<step>; may be NULL
    const char *init_from;   // HF BERT directory or NULL (random init from seed)
    // Data parallel: called once per step after every micro-batch's backward
    // and before the optimizer, with the whole gradient span and the step's
    // mean loss; it must leave both averaged over ranks (worker/comm.c).
    // NULL for a single process. A negative return aborts the step.
    int (*grad_sync)(void *ctx, float *grads, size_t n, double *loss);
    void *grad_sync_ctx;
} train_config;

typedef struct train_result {
    long step;               // updates done after this call
    double loss;             // mean over the micro-batches
    double lr;               // learning rate applied
    double grad_norm;        // global gradient norm before clipping
} train_result;

typedef struct trainer {
    train_config cfg;
    bert_model *model;
    optim *opt;
    size_t *seg_sizes;       // (nseg) per-HF-tensor segments of the parameter span
    int *seg_decays;         // (nseg)
    int nseg;
    long step;               // optimizer updates done
} trainer;

/* Fills cfg from an effective job spec (common/jobspec.h): BertConfig from
 * spec->model (vocab_size 0 must have been resolved by the caller), optimizer,
 * schedule and loop settings from spec->training, nsp from spec->mlm. HF
 * semantics: warmup_ratio applies when warmup_steps is 0. output_dir and
 * init_from are borrowed from the arguments / spec. -EINVAL with a message. */
int train_config_from_jobspec(train_config *cfg, const jobspec *spec, const char *output_dir,
                              int threads, uint32_t rank, char *err, size_t errlen);
/* Creates model (init_from or seeded init) and optimizer. Caller owns. */
int trainer_create(trainer **out, const train_config *cfg, char *err, size_t errlen);
void trainer_destroy(trainer *t);
/* Restores params, optimizer state and step from checkpoint dir. */
int trainer_resume(trainer *t, const char *dir, char *err, size_t errlen);
/* Forward and backward of micro-batch k of n_micro (gradients +=, of loss /
 * n_micro), adding its loss to *loss; the batch is validated first (-EINVAL
 * with err). Dropout is philox(seed, step, layer, rank, micro = k). */
int trainer_micro(trainer *t, const bert_batch *b, int k, int n_micro, double *loss, char *err,
                  size_t errlen);
/* One optimizer step over micro[0..n_micro) (n_micro must equal grad_accum).
 * Dropout of micro-batch k is philox(seed, step, layer, rank, micro = k). */
int trainer_step(trainer *t, const bert_batch *micro, int n_micro, train_result *res,
                 char *err, size_t errlen);

#endif
