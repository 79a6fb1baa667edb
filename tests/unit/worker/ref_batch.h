/* ref_batch — the fixture batch (batch.* in FIXTURE_DIR/reference.safetensors,
 * made by make_fixtures.py) for the plain-C export tools (hf_export_tool,
 * hf_act_tool), which run without cmocka and report errors on stderr
 * (fixture.h is the cmocka tests' loader). */
#ifndef BERTD_TESTS_WORKER_REF_BATCH_H
#define BERTD_TESTS_WORKER_REF_BATCH_H

#include "worker/model.h"
#include "worker/safetensors.h"

typedef struct ref_batch {
    st_file *ref;
    int32_t *ids, *tt, *lens, *pos, *lab;
    bert_batch b; // points into the arrays above
} ref_batch;

/* Opens the fixture and copies its batch out. 0, or -1 (a line on stderr
 * when the file cannot be opened; rb freed either way on failure). */
int ref_batch_load(ref_batch *rb, const char *fixture_dir);
void ref_batch_free(ref_batch *rb);

#endif
