/* initmodel — the model a job's init_from names, held against the job at
 * submit (docs/jobspec.md#init_from). The job trains that model, so its
 * dimensions become the effective spec's model section, and a model.* key
 * the submitter gave that says otherwise is a 422 naming both values, never
 * silently overridden. The dataset must be tokenized with the vocab the
 * model was trained with: the dataset's vocab file against the model's
 * vocab.txt line by line, and against its word-embedding rows (vocab_size
 * of config.json or state.json, and the tensor's rows in model.safetensors).
 *
 * Reads config.json, state.json, vocab files and a safetensors header;
 * never loads weights, never writes. Error details name files, line numbers
 * and at most two short printable tokens, never what a file holds beyond
 * that.
 */
#ifndef BERTD_API_INITMODEL_H
#define BERTD_API_INITMODEL_H

#include <jansson.h>
#include <stdbool.h>

#include "api/http.h"

/* For an effective *spec whose init_from is a resolved model directory
 * (null: true at once). in is the spec as submitted, for the model.* keys
 * the submitter gave. *spec is replaced by the effective spec of in with
 * the directory's model (normalized again, so every rule between keys
 * holds for that model). When the vocab could be compared only by size (no
 * vocab.txt beside the model) or not at all (the dataset's vocab is not
 * found), *note gets the warning for the job's events (caller frees); else
 * it stays NULL. Returns true, or replies 422 (invalid-spec; field
 * model.<key>, init_from or dataset) and sets *ret. */
bool api_initmodel_apply(api_request *req, const json_t *in, json_t **spec, char **note,
			 enum MHD_Result *ret);

#endif
