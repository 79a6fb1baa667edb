/* restore — init_from_restore "all" (docs/jobspec.md#init_from): a job
 * that continues another job's run from one of its checkpoints, restoring
 * what the worker's own resume restores (weights, optimizer moments,
 * scheduler position, loss scaler, data position). Checked at submit, so a
 * job that cannot continue that run is a 422 naming the key, never a worker
 * that fails later. Reads the checkpoint's state.json; never writes
 * anything.
 */
#ifndef BERTD_API_RESTORE_H
#define BERTD_API_RESTORE_H

#include <jansson.h>
#include <stdbool.h>

#include "api/http.h"

/* For spec's init_from_restore "all" (any other value: true at once): ref
 * must be the {"job", "checkpoint"} object init_from was submitted as (NULL:
 * it was a path, refused) and dir that checkpoint, resolved. dir must be a
 * bertd checkpoint with optimizer state, of the model spec describes, at a
 * step below spec's max_steps, whose optimizer averaged with spec's
 * adam_beta1 and adam_beta2. Batch, accumulation, max_seq_length and world
 * size may differ from the source job's (two-phase BERT: seq 128, then 512):
 * the moments do not depend on them. Returns true, or replies 422
 * (invalid-spec, the offending key as field) and sets *ret. */
bool api_restore_check(api_request *req, const json_t *spec, const json_t *ref, const char *dir,
		       enum MHD_Result *ret);

#endif
