/* optim — AdamW (torch.optim.AdamW semantics) and LAMB (NVIDIA apex
 * FusedLAMB), global-norm gradient clipping and HF get_scheduler learning-rate
 * schedules, over parameters and gradients held as one contiguous span with
 * a per-tensor size table (model.h). Optimizer state (m, v) is one allocation
 * of 2 * num_params floats so checkpoints and sharding treat it as a span.
 * Never touches the model's layout beyond the size table and decay flags.
 */
#ifndef BERTD_WORKER_OPTIM_H
#define BERTD_WORKER_OPTIM_H

#include <stddef.h>

typedef enum optim_kind { OPTIM_ADAMW = 0, OPTIM_LAMB = 1 } optim_kind;
typedef enum sched_kind { SCHED_LINEAR = 0, SCHED_COSINE, SCHED_CONSTANT,
                          SCHED_CONSTANT_WITH_WARMUP, SCHED_POLYNOMIAL, SCHED_COSINE_WITH_MIN_LR,
                          SCHED_WARMUP_STABLE_DECAY, SCHED_COUNT } sched_kind;

typedef struct optim_config {
    optim_kind kind;
    float lr;            // peak learning rate
    float beta1, beta2, eps;
    float weight_decay;  // decoupled; only on tensors whose decay flag is set
    float max_grad_norm; // <= 0: no clipping
    sched_kind sched;
    long warmup_steps;
    long total_steps;    // schedule length (max_steps)
    /* lr_scheduler_kwargs (transformers 4.44 names), used by the schedules
     * that take them; optim_config_default sets HF's defaults */
    double lr_end;          // polynomial: the learning rate after the decay (< lr)
    double power;           // polynomial: exponent of the decay, > 0
    double num_cycles;      // cosine, cosine_with_min_lr, warmup_stable_decay: 0.5 = half a wave
    double min_lr_rate;     // cosine_with_min_lr: the floor as a fraction of lr
    long num_stable_steps;  // warmup_stable_decay: steps at lr after the warmup
    long num_decay_steps;   // warmup_stable_decay: steps of the cosine decay after those
    double min_lr_ratio;    // warmup_stable_decay: the floor as a fraction of lr
} optim_config;

typedef struct optim {
    optim_config cfg;
    size_t num_params;
    int num_tensors;
    const size_t *sizes;   // (num_tensors) borrowed from the model
    const int *decays;     // (num_tensors) 1 = apply weight decay
    float *state_memory;   // (2, num_params): m then v
    float *m, *v;          // pointers into state_memory
    long t;                // updates applied so far (bias-correction step)
} optim;

/* HF defaults for kind: AdamW lr 5e-5, betas 0.9/0.999, eps 1e-8, wd 0,
 * clip 1.0, linear schedule; LAMB the same with eps 1e-6. The schedule
 * kwargs get get_scheduler's defaults (lr_end 1e-7, power 1, num_cycles
 * 0.5, floors 0, no stable or decay steps). */
void optim_config_default(optim_config *c, optim_kind kind);
/* Returns -EINVAL with a message for impossible values. */
int optim_config_validate(const optim_config *c, char *err, size_t errlen);
/* Parses "adamw"|"lamb" and the schedule names of sched_kind_name. */
int optim_kind_parse(const char *s, optim_kind *out);
int sched_kind_parse(const char *s, sched_kind *out);
/* transformers' SchedulerType value of k ("linear", "polynomial",
 * "warmup_stable_decay", ...); a static string. */
const char *sched_kind_name(sched_kind k);

/* sizes and decays are borrowed and must outlive the optimizer. Caller owns. */
int optim_create(optim **out, const optim_config *c, const size_t *sizes, const int *decays,
                 int num_tensors);
void optim_destroy(optim *o);

/* The learning rate the schedule gives for 0-based update index step
 * (transformers.get_scheduler, LambdaLR semantics). */
double optim_lr_at(const optim_config *c, long step);
/* L2 norm of a span, accumulated in double. */
double optim_global_norm(const float *x, size_t n);

/* One update of params from grads (grads are scaled in place by clipping).
 * The learning rate comes from the schedule at index o->t. Reports the lr used
 * and the gradient norm before clipping. */
int optim_step(optim *o, float *params, float *grads, double *lr_out, double *gnorm_out);

#endif
