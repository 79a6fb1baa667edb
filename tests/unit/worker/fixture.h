/* fixture — helpers shared by the worker tests: load the HF reference
 * fixture (tests/fixtures/model, made by make_fixtures.py) and compare
 * tensors by relative L2 error. Test-only; declares, test_fixture.c defines. */
#ifndef BERTD_TESTS_WORKER_FIXTURE_H
#define BERTD_TESTS_WORKER_FIXTURE_H

#include "worker/model.h"
#include "worker/safetensors.h"

typedef struct ref_fixture {
    st_file *ref;        // reference.safetensors
    char dir[4096];      // tests/fixtures/model
    char hf_dir[4200];   // .../hf_tiny
    int32_t *ids, *tt, *lens, *pos, *labels;
    bert_batch batch;
} ref_fixture;

/* Loads the fixture; fails the test (cmocka) on any error. */
void fixture_load(ref_fixture *f);
void fixture_free(ref_fixture *f);
/* float copy of a reference tensor, caller frees; n gets the element count. */
float *fixture_tensor(const ref_fixture *f, const char *name, size_t *n);
/* ||a - b||_2 / max(||b||_2, floor), in double. The floor keeps tensors whose
 * true value is exactly zero (the key biases' gradients: softmax ignores a
 * per-row shift) from turning rounding noise into a huge relative error. */
double rel_l2(const float *a, const float *b, size_t n, double floor);

#endif
