/* hfexport — a checkpoint into a HuggingFace model directory, made by a
 * child process: `bertd-worker --export CKPT OUT` (worker/convert.h).
 *
 * The daemon never runs model code (docs/architecture.md): the conversion
 * allocates a whole model and reads and writes its weights, so it runs in a
 * child that a deadline bounds (killed, with its process group, when it
 * runs past it) and whose crash is only a failed conversion. Called on an
 * HTTP thread (GET /v1/jobs/{id}/checkpoints/{step}/export); at most
 * HFEXPORT_MAX_RUNNING run at once, so conversions never take every HTTP
 * thread. Never touches the store or the supervisor's children.
 */
#ifndef BERTD_DAEMON_HFEXPORT_H
#define BERTD_DAEMON_HFEXPORT_H

#include <stddef.h>

#define HFEXPORT_MAX_RUNNING 2
#define HFEXPORT_TIMEOUT_MS 300000 /* bert-large is 1.3 GB read and written */

/* Runs <bin_dir>/bertd-worker --export ckpt_dir out_dir, waiting at most
 * timeout_ms. out_dir must not exist; on success it holds the model. 0;
 * -EBUSY HFEXPORT_MAX_RUNNING conversions are running (nothing started);
 * -ETIMEDOUT it ran past the deadline (killed); -EIO it failed (why: its
 * own last line of stderr, or how it died); another -errno when it could
 * not be started. why always says what happened on failure. */
int hfexport_checkpoint(const char *bin_dir, const char *ckpt_dir, const char *out_dir, int timeout_ms, char *why,
			size_t cap);

#endif
