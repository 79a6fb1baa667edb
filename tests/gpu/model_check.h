/* model_check — the GPU model (worker/gpu_model.c) against the CPU model
 * (worker/model.c), the helpers the whole-model GPU tests share
 * (test_model_cuda, test_flash_model_cuda, test_gelu_tanh_cuda): making a
 * GPU model on given weights, the loss and per-tensor gradient comparison
 * of one forward/backward, a training step, AdamW steps side by side with
 * the CPU model and the update they make, and a lever variable set for one
 * model's creation. Tolerances stay with the callers (test_model_cuda's
 * header says why they are what they are). Linked into those tests with
 * gpu_check.c. */
#ifndef BERTD_TESTS_MODEL_CHECK_H
#define BERTD_TESTS_MODEL_CHECK_H

#include "tests/gpu/gpu_check.h"
#include "worker/gpu_model.h"
#include "worker/model.h"
#include "worker/optim.h"

/* Batch k of a test's schedule, into storage the callback owns. */
typedef const bert_batch *(*mc_batch_fn)(void *ctx, const bert_config *c, int k);

/* A test's start: exits 77 without a device (gpu_require_device), 4 CPU
 * threads for the CPU model, and the precision "auto" picks (a FAIL line
 * and exit 1 when it cannot pick). */
kdtype mc_start(void);
/* AdamW, lr 1e-3, weight decay 0.01, 2 warmup steps of 10. */
optim_config mc_optim_config(void);
/* ||got - ref||_2 / ||ref||_2; inf when got has a non-finite element or ref is 0. */
double mc_norm2_rel(const float *got, const float *ref, size_t n);
/* One "ok"/"FAIL" line (what, dtype, value, tolerance); counts a failure. */
void mc_report(int ok, const char *what, kdtype dt, double val, double tol);
/* *saved := the variable's value (NULL if unset, caller passes it back to
 * mc_env_restore), then sets it to value (unsets it when value is NULL). */
char *mc_env_set(const char *var, const char *value);
void mc_env_restore(const char *var, char *saved);
/* A CPU model with weights from bert_model_init_weights(seed); aborts when
 * it cannot be made. */
bert_model *mc_cpu_model(const bert_config *c, uint64_t seed);
/* A GPU model of B x T with M masked rows holding params; NULL (a FAIL line
 * naming what and the error, counted) when it cannot be made or loaded. */
gpu_model *mc_model(const bert_config *c, kdtype dt, int B, int T, int M, const optim_config *oc,
                    const float *params, const char *what);
/* |gl - cpu->loss| / |cpu->loss| reported as "model loss (dropout on)",
 * within ltol and finite. Returns whether it passed. */
int mc_check_loss(float gl, const bert_model *cpu, kdtype dt, double ltol);
/* Every parameter tensor of grads (host layout) against cpu's gradients,
 * one check_close line each at gtol. */
void mc_check_grads(const float *grads, const bert_model *cpu, kdtype dt, double gtol);
/* One forward/backward of both models on b with dropout d: the CPU model's
 * loss and gradients, the GPU model's loss compared (mc_check_loss).
 * Returns the GPU model's loss scale; its gradients are left on the device
 * for mc_check_model_grads. */
float mc_forward_backward(gpu_model *g, bert_model *cpu, const bert_batch *b,
                          const bert_dropout *d, kdtype dt, double ltol);
/* The GPU model's gradients divided by scale, compared as mc_check_grads. */
void mc_check_model_grads(gpu_model *g, const bert_model *cpu, float scale, kdtype dt,
                          double gtol);
/* One training step of g on b: upload, forward at the model's loss scale,
 * backward, step (a failed or skipped step is a counted FAIL line naming
 * step). Returns the loss; *gnorm (if not NULL) the step's gradient norm. */
float mc_train_step(gpu_model *g, const bert_batch *b, const bert_dropout *d, int step,
                    double *gnorm);
/* steps AdamW steps of both models on batches next(k + 1), dropout on
 * (seed 99, step k + 1), after setting eps on both sides to the RMS of the
 * CPU model's present gradients (printed); reports the worst step's loss
 * difference at 2 * ltol. Returns the CPU parameters from before the steps
 * (p0, for mc_check_update). */
float *mc_adamw_steps(gpu_model *g, bert_model *cpu, optim_config *oc, int steps, mc_batch_fn next,
                      void *ctx, kdtype dt, double ltol);
/* The update since p0 (freed here), GPU against CPU, 2-norm within utol;
 * what names it. Leaves cpu's parameters as p - p0. */
void mc_check_update(gpu_model *g, bert_model *cpu, float *p0, const char *what, kdtype dt,
                     double utol);
/* How many of n elements of size bytes differ in their bits. */
size_t mc_differ(const void *a, const void *b, size_t n, size_t size);

#endif
