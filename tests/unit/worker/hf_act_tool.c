/* hf_act_tool — test helper for check_export_act.py: imports an HF model
 * directory (hf_init_from), trains it 3 AdamW steps on the fixture batch
 * (dropout on), exports it in HF format to OUT_DIR and writes the logits of
 * the trained model (dropout off) on that batch to
 * OUT_DIR/bertd_logits.safetensors.
 * Usage: hf_act_tool HF_DIR FIXTURE_DIR OUT_DIR */
#include "tests/unit/worker/ref_batch.h"
#include "worker/hf.h"
#include "worker/optim.h"

#include <stdio.h>
#include <stdlib.h>

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
    ref_batch rb;
    if (ref_batch_load(&rb, argv[2]) < 0)
        return 1;
    const bert_batch *b = &rb.b;
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
        if (bert_model_forward(m, b, &d) < 0 || bert_model_backward(m, 1.0f) < 0 ||
            optim_step(o, m->params_memory, m->grads_memory, NULL, NULL) < 0)
            return 1;
        printf("step %d loss %.6f\n", s + 1, m->loss);
    }
    if (bert_model_forward(m, b, NULL) < 0)
        return 1;
    snprintf(path, sizeof path, "%s/hf_tiny/vocab.txt", argv[2]);
    if (hf_export(m, argv[3], path, true, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    st_entry e[1] = {{.name = "logits", .ndim = 2, .shape = {b->M, m->cfg.vocab_size},
                      .data = m->acts.logits}};
    snprintf(path, sizeof path, "%s/bertd_logits.safetensors", argv[3]);
    if (st_write(path, e, 1, NULL) < 0)
        return 1;
    free(sizes); free(decays);
    optim_destroy(o);
    ref_batch_free(&rb);
    bert_model_destroy(m);
    return 0;
}
