/* tbevents — TensorBoard event files for each job's metrics rows.
 *
 * Every metrics row the daemon stores is also appended, as one Event of
 * scalars, to <job dir>/tensorboard/events.out.tfevents.<unix seconds>.
 * <hostname>.<pid>.0, so `tensorboard --logdir <state_dir>/jobs` shows every
 * job side by side. Tags and file layout: docs/formats.md. */
#ifndef BERTD_DAEMON_TBEVENTS_H
#define BERTD_DAEMON_TBEVENTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tbevents_scalar {
	const char *tag;
	float value;
} tbevents_scalar;

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's masked form of it. */
uint32_t tbevents_crc32c(const void *data, size_t n);
uint32_t tbevents_masked_crc(uint32_t crc);

/* Serializes an Event protobuf (wall_time, step, file_version when not NULL,
 * a Summary of n simple_value scalars) into out. Returns its length; when
 * that exceeds cap, nothing past cap was written (call again bigger). */
size_t tbevents_encode_event(uint8_t *out, size_t cap, double wall_time, int64_t step,
			     const char *file_version, const tbevents_scalar *v, size_t n);

/* Frames n bytes as one TFRecord (length, masked CRC of the length, data,
 * masked CRC of the data) into out, which holds n + 16 bytes. Returns n + 16. */
size_t tbevents_frame(uint8_t *out, const uint8_t *data, size_t n);

/* Appends a metrics row (the stored JSON object: loss, learning_rate,
 * grad_norm, tokens_per_s, step_time_ms, phases_ms, eval_loss) as scalars
 * of the given step to this process's event file in job_dir/tensorboard,
 * creating both (and the file's version record) on first use. Fields that
 * are absent or not finite numbers are left out. Returns 0 or a negative
 * errno; a failure is logged unless the last one logged was the same job
 * directory's, and the caller goes on (TensorBoard output never fails a job). */
int tbevents_append_row(const char *job_dir, int64_t step, int64_t wall_ms, json_t *row);

#endif
