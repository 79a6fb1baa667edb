/* fixture — see fixture.h. */
#include "tests/unit/worker/fixture.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static int32_t *ints(const ref_fixture *f, const char *name, size_t *n)
{
    const st_tensor *t = st_find(f->ref, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_I32);
    *n = st_numel(t);
    int32_t *out = malloc(*n * sizeof *out + 4);
    assert_non_null(out);
    memcpy(out, f->ref->data + t->begin, *n * sizeof *out);
    return out;
}

void fixture_load(ref_fixture *f)
{
    memset(f, 0, sizeof *f);
    const char *d = getenv("BERTD_MODEL_FIXTURES");
    assert_non_null(d);
    snprintf(f->dir, sizeof f->dir, "%s", d);
    snprintf(f->hf_dir, sizeof f->hf_dir, "%s/hf_tiny", d);
    char path[4300], err[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", d);
    int rc = st_open(&f->ref, path, err, sizeof err);
    if (rc < 0)
        fail_msg("%s", err);
    size_t nid, ntt, nl, np, nlab;
    f->ids = ints(f, "batch.input_ids", &nid);
    f->tt = ints(f, "batch.token_type_ids", &ntt);
    f->lens = ints(f, "batch.seq_lens", &nl);
    f->pos = ints(f, "batch.mlm_positions", &np);
    f->labels = ints(f, "batch.mlm_labels", &nlab);
    const st_tensor *t = st_find(f->ref, "batch.input_ids");
    f->batch = (bert_batch){.B = (int)t->shape[0], .T = (int)t->shape[1], .M = (int)np,
                            .input_ids = f->ids, .token_type_ids = f->tt, .seq_lens = f->lens,
                            .mlm_positions = f->pos, .mlm_labels = f->labels};
}

void fixture_free(ref_fixture *f)
{
    free(f->ids);
    free(f->tt);
    free(f->lens);
    free(f->pos);
    free(f->labels);
    st_close(f->ref);
}

float *fixture_tensor(const ref_fixture *f, const char *name, size_t *n)
{
    const st_tensor *t = st_find(f->ref, name);
    if (!t)
        fail_msg("reference has no tensor %s", name);
    *n = st_numel(t);
    float *out = malloc(*n * sizeof *out + 4);
    assert_non_null(out);
    assert_int_equal(st_read_f32(f->ref, t, out, *n), 0);
    return out;
}

double rel_l2(const float *a, const float *b, size_t n, double floor)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        d += e * e;
        r += (double)b[i] * b[i];
    }
    r = sqrt(r);
    return sqrt(d) / (r > floor ? r : floor);
}
