/* train — the host trainer: a model and its optimizer, made from a job spec
 * (seeded init or init_from) or resumed from a checkpoint, and the forward +
 * backward of one micro-batch. The training loop (worker/loop.c) steps it on
 * the CPU and writes checkpoints and the export from it; a GPU device keeps
 * it as its host mirror. Batches come from the caller; this module never
 * builds data, never talks to other ranks (comm.c does) and never exits.
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
    uint64_t seed;
    uint32_t rank;
    int threads;             // OpenMP + OpenBLAS threads for this process
    const char *init_from;   // HF BERT directory or NULL (random init from seed)
} train_config;

typedef struct trainer {
    train_config cfg;
    bert_model *model;
    optim *opt;
    size_t *seg_sizes;       // (nseg) per-HF-tensor segments of the parameter span
    int *seg_decays;         // (nseg)
    int nseg;
    long step;               // optimizer updates done (the caller counts them)
} trainer;

/* Fills cfg from an effective job spec (common/jobspec.h): BertConfig from
 * spec->model (vocab_size 0 must have been resolved by the caller), optimizer
 * and schedule from spec->training, nsp from spec->mlm. HF semantics:
 * warmup_ratio applies when warmup_steps is 0; the lr_scheduler_kwargs come
 * from spec->training (power and num_cycles 0: HF's defaults, 1 and 0.5).
 * init_from is borrowed from the spec. -EINVAL with a message. */
int train_config_from_jobspec(train_config *cfg, const jobspec *spec, int threads, uint32_t rank,
                              char *err, size_t errlen);
/* Creates model (init_from or seeded init) and optimizer. Caller owns. */
int trainer_create(trainer **out, const train_config *cfg, char *err, size_t errlen);
void trainer_destroy(trainer *t);
/* Restores params, optimizer state and step from checkpoint dir. */
int trainer_resume(trainer *t, const char *dir, char *err, size_t errlen);
/* Forward and backward of micro-batch k of n_micro (gradients +=, of loss /
 * n_micro), adding its loss to *loss; the batch is validated first (-EINVAL
 * with err). Dropout is philox(seed, step, layer, rank, micro = k). A step is
 * bert_model_zero_grad, trainer_micro for k = 0..n_micro-1, the gradients
 * averaged over the ranks, optim_step (worker/device_cpu.c). */
int trainer_micro(trainer *t, const bert_batch *b, int k, int n_micro, double *loss, char *err,
                  size_t errlen);

#endif
