/* resume — which checkpoint a job can resume from, judged on disk.
 *
 * The worker writes checkpoints (worker/checkpoint.c, docs/formats.md
 * "Training checkpoint") and reports each one to the daemon; a report can
 * be lost (a daemon that stopped reading while it drained) and a complete
 * directory can be damaged afterwards (a truncated file). This module
 * checks a directory the way the worker's reader would load it, so the
 * supervisor hands a worker only a checkpoint it can load, and finds
 * complete checkpoints the store has no row for.
 *
 * Reads files only; never writes, never talks to the store.
 */
#ifndef BERTD_DAEMON_RESUME_H
#define BERTD_DAEMON_RESUME_H

#include <stddef.h>
#include <stdint.h>

/* Checks that dir is a checkpoint of step the worker can load: DONE marker,
 * state.json of the checkpoint format (format, version, this step,
 * num_params), params.safetensors holding "params" F32 (num_params,) and,
 * when state.json names an optimizer, optim.safetensors holding "exp_avg"
 * and "exp_avg_sq" F32 (num_params,) each. The safetensors files are
 * checked by worker/safetensors.c's reader (header, offsets, file length),
 * so a truncated file is caught. 0, or -ENOENT (no DONE marker: incomplete)
 * / -EINVAL (damaged) with why filled in. */
int resume_check(const char *dir, int64_t step, char *why, size_t cap);

/* The steps of the complete checkpoints (ckpt-<digits> holding DONE) under
 * root, newest first. *steps caller-owned (free); *n 0 and *steps NULL when
 * there are none or root does not exist. 0 or -ENOMEM. */
int resume_scan(const char *root, int64_t **steps, size_t *n);

#endif
