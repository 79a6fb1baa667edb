/* train — see train.h. */
#include "worker/train.h"
#include "worker/hf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int train_config_from_jobspec(train_config *cfg, const jobspec *spec, int threads, uint32_t rank,
                              char *err, size_t errlen)
{
    const jobspec_model *jm = &spec->model;
    const jobspec_training *jt = &spec->training;
    memset(cfg, 0, sizeof *cfg);
    bert_config *m = &cfg->model;
    bert_config_preset(m, NULL);
    m->act = bert_act_parse(jm->hidden_act);
    if (m->act < 0) {
        snprintf(err, errlen, "model.hidden_act: only %s is supported", BERT_ACT_SUPPORTED);
        return -EINVAL;
    }
    m->vocab_size = jm->vocab_size;
    m->hidden_size = jm->hidden_size;
    m->num_hidden_layers = jm->num_hidden_layers;
    m->num_attention_heads = jm->num_attention_heads;
    m->intermediate_size = jm->intermediate_size;
    m->max_position_embeddings = jm->max_position_embeddings;
    m->type_vocab_size = jm->type_vocab_size;
    m->hidden_dropout_prob = (float)jm->hidden_dropout_prob;
    m->attention_probs_dropout_prob = (float)jm->attention_probs_dropout_prob;
    m->layer_norm_eps = (float)jm->layer_norm_eps;
    m->initializer_range = (float)jm->initializer_range;
    m->nsp = spec->mlm.nsp;
    int rc = bert_config_validate(m, err, errlen);
    if (rc < 0)
        return rc;
    optim_kind kind;
    if (optim_kind_parse(jt->optim, &kind) < 0) {
        snprintf(err, errlen, "training_args.optim: unknown optimizer '%s'", jt->optim);
        return -EINVAL;
    }
    optim_config *o = &cfg->optim;
    optim_config_default(o, kind);
    if (sched_kind_parse(jt->lr_scheduler_type, &o->sched) < 0) {
        snprintf(err, errlen, "training_args.lr_scheduler_type: unknown schedule '%s'",
                 jt->lr_scheduler_type);
        return -EINVAL;
    }
    o->lr = (float)jt->learning_rate;
    o->beta1 = (float)jt->adam_beta1;
    o->beta2 = (float)jt->adam_beta2;
    o->eps = (float)jt->adam_epsilon;
    o->weight_decay = (float)jt->weight_decay;
    o->max_grad_norm = (float)jt->max_grad_norm;
    o->total_steps = jt->max_steps;
    o->lr_end = jt->lr_end;
    /* 0 is no valid power or cycle count: a typed view filled by hand
     * rather than by jobspec_from_json leaves them at HF's defaults */
    if (jt->power > 0)
        o->power = jt->power;
    if (jt->num_cycles > 0)
        o->num_cycles = jt->num_cycles;
    o->min_lr_rate = jt->min_lr_rate;
    o->min_lr_ratio = jt->min_lr_ratio;
    o->num_stable_steps = (long)jt->num_stable_steps;
    o->num_decay_steps = (long)jt->num_decay_steps;
    /* transformers TrainingArguments.get_warmup_steps */
    o->warmup_steps = jt->warmup_steps > 0 ? jt->warmup_steps
                                           : (long)ceil((double)jt->max_steps * jt->warmup_ratio);
    if ((rc = optim_config_validate(o, err, errlen)) < 0)
        return rc;
    cfg->seed = jt->seed;
    cfg->rank = rank;
    cfg->threads = threads;
    cfg->init_from = spec->init_from[0] ? spec->init_from : NULL;
    return 0;
}

void trainer_destroy(trainer *t)
{
    if (!t)
        return;
    optim_destroy(t->opt);
    bert_model_destroy(t->model);
    free(t->seg_sizes);
    free(t->seg_decays);
    free(t);
}

int trainer_create(trainer **out, const train_config *cfg, char *err, size_t errlen)
{
    int rc;
    trainer *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->cfg = *cfg;
    if ((rc = optim_config_validate(&cfg->optim, err, errlen)) < 0)
        goto out;
    bert_set_threads(cfg->threads > 0 ? cfg->threads : 1);
    if (cfg->init_from) {
        if ((rc = hf_init_from(&t->model, cfg->init_from, cfg->model.nsp, cfg->seed, err, errlen)) < 0)
            goto out;
        /* dropout comes from the job, not from the pretrained config */
        t->model->cfg.hidden_dropout_prob = cfg->model.hidden_dropout_prob;
        t->model->cfg.attention_probs_dropout_prob = cfg->model.attention_probs_dropout_prob;
    } else {
        if ((rc = bert_config_validate(&cfg->model, err, errlen)) < 0)
            goto out;
        if ((rc = bert_model_create(&t->model, &cfg->model)) < 0) {
            snprintf(err, errlen, "cannot allocate the model: %s", strerror(-rc));
            goto out;
        }
        bert_model_init_weights(t->model, cfg->seed);
    }
    t->nseg = bert_param_segments(&t->model->cfg, NULL, NULL, 0);
    t->seg_sizes = calloc((size_t)t->nseg, sizeof *t->seg_sizes);
    t->seg_decays = calloc((size_t)t->nseg, sizeof *t->seg_decays);
    if (!t->seg_sizes || !t->seg_decays) {
        rc = -ENOMEM;
        goto out;
    }
    bert_param_segments(&t->model->cfg, t->seg_sizes, t->seg_decays, t->nseg);
    if ((rc = optim_create(&t->opt, &cfg->optim, t->seg_sizes, t->seg_decays, t->nseg)) < 0)
        goto out;
    *out = t;
    t = NULL;
out:
    trainer_destroy(t);
    return rc;
}

int trainer_resume(trainer *t, const char *dir, char *err, size_t errlen)
{
    long step = 0;
    int rc = checkpoint_load(dir, t->model, t->opt, &step, err, errlen);
    if (rc < 0)
        return rc;
    t->step = step;
    return 0;
}

int trainer_micro(trainer *t, const bert_batch *b, int k, int n_micro, double *loss, char *err,
                  size_t errlen)
{
    bert_model *m = t->model;
    bert_dropout d = {.train = 1, .seed = t->cfg.seed, .rank = t->cfg.rank,
                      .step = (uint32_t)t->step, .micro = (uint32_t)k};
    int rc = bert_batch_validate(m, b, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = bert_model_forward(m, b, &d)) < 0 ||
        (rc = bert_model_backward(m, 1.0f / (float)n_micro)) < 0) {
        snprintf(err, errlen, "forward/backward failed: %s", strerror(-rc));
        return rc;
    }
    *loss += m->loss;
    return 0;
}
