/* hf_act_tool — test helper for check_export_act.py: imports an HF model
 * directory (hf_init_from), trains it 3 AdamW steps on the fixture batch
 * (dropout on), exports it in HF format to OUT_DIR and writes the logits of
 * the trained model (dropout off) on that batch to
 * OUT_DIR/bertd_logits.safetensors.
 * Usage: hf_act_tool HF_DIR FIXTURE_DIR OUT_DIR */
#include "worker/hf.h"
#include "worker/optim.h"

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
    if (argc != 4) {
        fprintf(stderr, "usage: %s HF_DIR FIXTURE_DIR OUT_DIR\n", argv[0]);
        return 2;
    }
    char path[4200], err[512];
    bert_model *m = NULL;
    if (hf_init_from(&m, argv[1], -1, 7, err, sizeof err) < 0) {
        fprintf(stderr, "hf_init_from: %s\n", err);
        return 1;
    }
    printf("imported %s: hidden_act %s\n", argv[1], bert_act_name(m->cfg.act));
    st_file *ref = NULL;
    snprintf(path, sizeof path, "%s/reference.safetensors", argv[2]);
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
    /* a few steps with dropout on, as a job trains it */
    m->cfg.hidden_dropout_prob = m->cfg.attention_probs_dropout_prob = 0.1f;
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    oc.lr = 1e-3f;
    oc.total_steps = 3;
    int nseg = bert_param_segments(&m->cfg, NULL, NULL, 0);
    size_t *sizes = calloc((size_t)nseg, sizeof *sizes);
    int *decays = calloc((size_t)nseg, sizeof *decays);
    bert_param_segments(&m->cfg, sizes, decays, nseg);
    optim *o = NULL;
    if (optim_create(&o, &oc, sizes, decays, nseg) < 0)
        return 1;
    for (int s = 0; s < 3; s++) {
        bert_dropout d = {.train = 1, .seed = 5, .step = (uint32_t)s};
        bert_model_zero_grad(m);
        if (bert_model_forward(m, &b, &d) < 0 || bert_model_backward(m, 1.0f) < 0 ||
            optim_step(o, m->params_memory, m->grads_memory, NULL, NULL) < 0)
            return 1;
        printf("step %d loss %.6f\n", s + 1, m->loss);
    }
    if (bert_model_forward(m, &b, NULL) < 0)
        return 1;
    snprintf(path, sizeof path, "%s/hf_tiny/vocab.txt", argv[2]);
    if (hf_export(m, argv[3], path, true, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    st_entry e[1] = {{.name = "logits", .ndim = 2, .shape = {b.M, m->cfg.vocab_size},
                      .data = m->acts.logits}};
    snprintf(path, sizeof path, "%s/bertd_logits.safetensors", argv[3]);
    if (st_write(path, e, 1, NULL) < 0)
        return 1;
    free(ids); free(tt); free(lens); free(pos); free(lab); free(sizes); free(decays);
    optim_destroy(o);
    st_close(ref);
    bert_model_destroy(m);
    return 0;
}
