/* hf_export_tool — test helper for check_export.py: builds a bertd-born model
 * (seeded init, then perturbed so biases and LayerNorms are not trivial) with
 * the fixture's config, exports it in HF format to OUT_DIR and writes the
 * logits bertd computes on the fixture batch to OUT_DIR/bertd_logits.safetensors.
 * Usage: hf_export_tool FIXTURE_DIR OUT_DIR */
#include "tests/unit/worker/ref_batch.h"
#include "worker/hf.h"

#include <stdio.h>
#include <stdlib.h>

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
    ref_batch rb;
    if (ref_batch_load(&rb, argv[1]) < 0)
        return 1;
    const bert_batch *b = &rb.b;
    if (bert_model_forward(m, b, NULL) < 0)
        return 1;
    snprintf(path, sizeof path, "%s/hf_tiny/vocab.txt", argv[1]);
    if (hf_export(m, argv[2], path, true, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    st_entry e[2] = {{.name = "logits", .ndim = 2, .shape = {b->M, cfg.vocab_size},
                      .data = m->acts.logits},
                     {.name = "loss", .ndim = 1, .shape = {1}, .data = &m->loss}};
    snprintf(path, sizeof path, "%s/bertd_logits.safetensors", argv[2]);
    if (st_write(path, e, 2, NULL) < 0)
        return 1;
    ref_batch_free(&rb);
    bert_model_destroy(m);
    return 0;
}
