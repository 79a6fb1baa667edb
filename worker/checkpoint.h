/* checkpoint — durable training checkpoints for exact resume.
 *
 * Layout (docs/formats.md): <root>/ckpt-<step>/ holding
 * params.safetensors (the flat parameter span), optim.safetensors (the flat
 * AdamW/LAMB moments), state.json (format version, step, model config,
 * optimizer config and counters, loss scale) and DONE, written last. Every
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

/* Saves under root (created if missing). keep_last > 0 prunes older ones.
 * extra (may be NULL) is stored as state.json "training_args". 0 or -errno. */
int checkpoint_save(const char *root, long step, const bert_model *m, const optim *o,
                    const json_t *extra, int keep_last, char *err, size_t errlen);
/* Finds the complete checkpoint (DONE present) with the highest step:
 * 0 and *step/path set, -ENOENT if none. */
int checkpoint_latest(const char *root, long *step, char *path, size_t pathlen);
/* Reads the model config stored in a checkpoint directory. */
int checkpoint_read_config(const char *dir, bert_config *cfg, char *err, size_t errlen);
/* Loads params (and optimizer state if o is not NULL) into an already created
 * model of the same config. -EINVAL on any mismatch or corruption. */
int checkpoint_load(const char *dir, bert_model *m, optim *o, long *step, char *err,
                    size_t errlen);

#endif
