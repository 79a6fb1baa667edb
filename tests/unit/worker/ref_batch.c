/* ref_batch — see ref_batch.h. */
#include "tests/unit/worker/ref_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int32_t *ints(const st_file *f, const char *name, size_t *n)
{
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != ST_I32)
        return NULL;
    *n = st_numel(t);
    int32_t *out = malloc(*n * sizeof *out + 4);
    if (out)
        memcpy(out, f->data + t->begin, *n * sizeof *out);
    return out;
}

int ref_batch_load(ref_batch *rb, const char *fixture_dir)
{
    memset(rb, 0, sizeof *rb);
    char path[4200], err[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", fixture_dir);
    if (st_open(&rb->ref, path, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    size_t n0, n1, n2, n3, n4;
    rb->ids = ints(rb->ref, "batch.input_ids", &n0);
    rb->tt = ints(rb->ref, "batch.token_type_ids", &n1);
    rb->lens = ints(rb->ref, "batch.seq_lens", &n2);
    rb->pos = ints(rb->ref, "batch.mlm_positions", &n3);
    rb->lab = ints(rb->ref, "batch.mlm_labels", &n4);
    if (!rb->ids || !rb->tt || !rb->lens || !rb->pos || !rb->lab) {
        ref_batch_free(rb);
        return -1;
    }
    rb->b = (bert_batch){.B = (int)n2, .T = (int)(n0 / n2), .M = (int)n3, .input_ids = rb->ids,
                         .token_type_ids = rb->tt, .seq_lens = rb->lens,
                         .mlm_positions = rb->pos, .mlm_labels = rb->lab};
    return 0;
}

void ref_batch_free(ref_batch *rb)
{
    free(rb->ids); free(rb->tt); free(rb->lens); free(rb->pos); free(rb->lab);
    if (rb->ref)
        st_close(rb->ref);
    memset(rb, 0, sizeof *rb);
}
