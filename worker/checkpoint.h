/* checkpoint — durable training checkpoints for exact resume.
 *
 * Layout (docs/formats.md): <root>/ckpt-<step>/ holding
 * params.safetensors (the flat parameter span), optim.safetensors (the flat
 * AdamW/LAMB moments), state.json (format version, step, model config,
 * optimizer config and counters, the fp16 loss scaler) and DONE, written last. Every
 * file goes tmp -> fsync -> rename -> fsync(dir); the directory is built as
 * ckpt-<step>.tmp and renamed into place before DONE, so a crash leaves either
 * nothing or an incomplete directory that readers skip. Keep-last-N prunes
 * older complete checkpoints after a successful save. Because every random
 * choice is a function of (seed, step, ...), step is all the RNG state there
 * is. Never decides policy (when to save): train.c does.
 */
#ifndef BERTD_WORKER_CHECKPOINT_H
#define BERTD_WORKER_CHECKPOINT_H

#include "worker/model.h"
#include "worker/optim.h"

#define CHECKPOINT_FORMAT_VERSION 1

/* Dynamic loss-scaling state (fp16 on a GPU, torch.cuda.amp.GradScaler's
 * policy), kept so that a resumed fp16 job goes on at the scale it had
 * reached instead of backing off from 65536 again. A run without loss
 * scaling (CPU, bf16, fp32) saves enabled 0 and scale 1. Plain C on purpose:
 * the GPU model's gpu_loss_scaler has the same fields, the worker copies. */
typedef struct checkpoint_scaler {
    float scale;         // multiplier of the loss: finite, > 0; 1 when disabled
    int enabled;
    int growth_interval; // good steps before the scale doubles, >= 1
    int good_steps;      // good steps since the scale last changed, [0, growth_interval)
    long skipped;        // steps skipped for overflow so far, >= 0
} checkpoint_scaler;

/* The state of a run without loss scaling: enabled 0, scale 1,
 * growth_interval 2000, no steps counted. */
checkpoint_scaler checkpoint_scaler_disabled(void);

/* Saves under root (created if missing). keep_last > 0 prunes older ones.
 * extra (may be NULL) is stored as state.json "training_args". The loss
 * scaler is saved as disabled (the CPU trainer never scales). 0 or -errno. */
int checkpoint_save(const char *root, long step, const bert_model *m, const optim *o,
                    const json_t *extra, int keep_last, char *err, size_t errlen);
/* checkpoint_save with the loss scaler's state ls (NULL: disabled). A scale
 * that is not finite and > 0 is -EINVAL (nothing written). */
int checkpoint_save_scaled(const char *root, long step, const bert_model *m, const optim *o,
                           const checkpoint_scaler *ls, const json_t *extra, int keep_last,
                           char *err, size_t errlen);
/* Keeps the keep_last newest complete checkpoints under root and the one
 * of step protect (the best checkpoint, never pruned; -1: none), removes
 * the others and any ckpt-*.tmp left by a crashed save. keep_last <= 0
 * removes nothing. */
void checkpoint_prune(const char *root, int keep_last, long protect);
/* Reads the loss scaler of the complete checkpoint in dir: 0 with *out set;
 * 1 when the checkpoint predates it (format 1 as first written: *out is
 * checkpoint_scaler_disabled(), and a caller that scales keeps its own
 * defaults); -EINVAL with err naming the key when it is malformed or the
 * checkpoint is unreadable. */
int checkpoint_read_scaler(const char *dir, checkpoint_scaler *out, char *err, size_t errlen);
/* Finds the complete checkpoint (DONE present) with the highest step:
 * 0 and *step/path set, -ENOENT if none. */
int checkpoint_latest(const char *root, long *step, char *path, size_t pathlen);
/* The "training_args" object a complete checkpoint in dir was saved with
 * (checkpoint_save's extra): caller owns it (json_decref); NULL when the
 * checkpoint is unreadable or has none. */
json_t *checkpoint_read_training_args(const char *dir);
/* Reads the model config stored in a checkpoint directory. */
int checkpoint_read_config(const char *dir, bert_config *cfg, char *err, size_t errlen);
/* Loads params (and optimizer state if o is not NULL) into an already created
 * model of the same config. -EINVAL on any mismatch or corruption, a
 * malformed loss scaler included (checkpoint_read_scaler reads it). */
int checkpoint_load(const char *dir, bert_model *m, optim *o, long *step, char *err,
                    size_t errlen);

#endif
