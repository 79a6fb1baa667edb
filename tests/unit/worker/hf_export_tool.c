/* hf_export_tool — test helper for check_export.py: builds a bertd-born model
 * (seeded init, then perturbed so biases and LayerNorms are not trivial) with
 * the fixture's config, exports it in HF format to OUT_DIR and writes the
 * logits bertd computes on the fixture batch to OUT_DIR/bertd_logits.safetensors.
 * Usage: hf_export_tool FIXTURE_DIR OUT_DIR */
#include "worker/hf.h"

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

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s FIXTURE_DIR OUT_DIR\n", argv[0]);
        return 2;
    }
    char path[4200], err[512];
    bert_config cfg;
    snprintf(path, sizeof path, "%s/hf_tiny", argv[1]);
    if (hf_read_config(path, &cfg, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    bert_model *m = NULL;
    if (bert_model_create(&m, &cfg) < 0)
        return 1;
    bert_model_init_weights(m, 2024);
    for (size_t i = 0; i < m->num_params; i++)
        m->params_memory[i] += 0.05f * (float)(((i * 2654435761u) >> 7) % 1000) / 1000.0f - 0.025f;
    st_file *ref = NULL;
    snprintf(path, sizeof path, "%s/reference.safetensors", argv[1]);
    if (st_open(&ref, path, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    size_t n0, n1, n2, n3, n4;
    int32_t *ids = ints(ref, "batch.input_ids", &n0), *tt = ints(ref, "batch.token_type_ids", &n1),
            *lens = ints(ref, "batch.seq_lens", &n2), *pos = ints(ref, "batch.mlm_positions", &n3),
            *lab = ints(ref, "batch.mlm_labels", &n4);
    if (!ids || !tt || !lens || !pos || !lab)
        return 1;
    bert_batch b = {.B = (int)n2, .T = (int)(n0 / n2), .M = (int)n3, .input_ids = ids,
                    .token_type_ids = tt, .seq_lens = lens, .mlm_positions = pos,
                    .mlm_labels = lab};
    if (bert_model_forward(m, &b, NULL) < 0)
        return 1;
    snprintf(path, sizeof path, "%s/hf_tiny/vocab.txt", argv[1]);
    if (hf_export(m, argv[2], path, true, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    st_entry e[2] = {{.name = "logits", .ndim = 2, .shape = {b.M, cfg.vocab_size},
                      .data = m->acts.logits},
                     {.name = "loss", .ndim = 1, .shape = {1}, .data = &m->loss}};
    snprintf(path, sizeof path, "%s/bertd_logits.safetensors", argv[2]);
    if (st_write(path, e, 2, NULL) < 0)
        return 1;
    free(ids); free(tt); free(lens); free(pos); free(lab);
    st_close(ref);
    bert_model_destroy(m);
    return 0;
}
