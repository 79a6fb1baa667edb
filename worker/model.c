/* model — BERT (post-LayerNorm, HF BertForMaskedLM / BertForPreTraining)
 * composed from kernels/ ops. See model.h for layout and dims.
 * Gradient rule: parameter gradients +=, activation gradients =. */
#include "worker/model.h"
#include "kernels/kernels.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* OpenBLAS's own thread control; declared here since cblas.h of other
 * BLAS builds lacks it. */
void openblas_set_num_threads(int num_threads);

static const struct preset { const char *name; int L, C, NH; } presets[] = {
    {"bert-tiny", 2, 128, 2},   {"bert-mini", 4, 256, 4},   {"bert-small", 4, 512, 8},
    {"bert-medium", 8, 512, 8}, {"bert-base", 12, 768, 12}, {"bert-large", 24, 1024, 16},
};

int bert_config_preset(bert_config *cfg, const char *name)
{
    *cfg = (bert_config){.vocab_size = 30522, .hidden_size = 768, .num_hidden_layers = 12,
                         .num_attention_heads = 12, .intermediate_size = 3072,
                         .max_position_embeddings = 512, .type_vocab_size = 2,
                         .pad_token_id = 0, .hidden_dropout_prob = 0.1f,
                         .attention_probs_dropout_prob = 0.1f, .layer_norm_eps = 1e-12f,
                         .initializer_range = 0.02f, .nsp = 0};
    if (!name)
        return 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            cfg->num_hidden_layers = presets[i].L;
            cfg->hidden_size = presets[i].C;
            cfg->num_attention_heads = presets[i].NH;
            cfg->intermediate_size = 4 * presets[i].C;
            return 0;
        }
    }
    return -ENOENT;
}

static const char *const act_names[] = {"gelu", "gelu_new", "gelu_pytorch_tanh"};

const char *bert_act_name(int act)
{
    return act >= 0 && act < (int)(sizeof act_names / sizeof act_names[0]) ? act_names[act] : NULL;
}

int bert_act_parse(const char *name)
{
    for (size_t i = 0; name && i < sizeof act_names / sizeof act_names[0]; i++)
        if (strcmp(act_names[i], name) == 0)
            return (int)i;
    return -1;
}

int bert_act_is_tanh(int act)
{
    return act == BERT_ACT_GELU_NEW || act == BERT_ACT_GELU_PYTORCH_TANH;
}

static const struct cfg_field { const char *name; size_t off; int is_float; } cfg_fields[] = {
    {"vocab_size", offsetof(bert_config, vocab_size), 0},
    {"hidden_size", offsetof(bert_config, hidden_size), 0},
    {"num_hidden_layers", offsetof(bert_config, num_hidden_layers), 0},
    {"num_attention_heads", offsetof(bert_config, num_attention_heads), 0},
    {"intermediate_size", offsetof(bert_config, intermediate_size), 0},
    {"max_position_embeddings", offsetof(bert_config, max_position_embeddings), 0},
    {"type_vocab_size", offsetof(bert_config, type_vocab_size), 0},
    {"pad_token_id", offsetof(bert_config, pad_token_id), 0},
    {"hidden_dropout_prob", offsetof(bert_config, hidden_dropout_prob), 1},
    {"attention_probs_dropout_prob", offsetof(bert_config, attention_probs_dropout_prob), 1},
    {"layer_norm_eps", offsetof(bert_config, layer_norm_eps), 1},
    {"initializer_range", offsetof(bert_config, initializer_range), 1},
};

int bert_config_apply_json(bert_config *cfg, const json_t *obj, char *err, size_t errlen)
{
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "config is not a JSON object");
        return -EINVAL;
    }
    for (size_t i = 0; i < sizeof cfg_fields / sizeof cfg_fields[0]; i++) {
        json_t *v = json_object_get(obj, cfg_fields[i].name);
        if (!v || json_is_null(v))
            continue;
        char *dst = (char *)cfg + cfg_fields[i].off;
        if (cfg_fields[i].is_float) {
            if (!json_is_number(v)) {
                snprintf(err, errlen, "%s: expected a number", cfg_fields[i].name);
                return -EINVAL;
            }
            float f = (float)json_number_value(v);
            memcpy(dst, &f, sizeof f);
        } else {
            if (!json_is_integer(v) || json_integer_value(v) < -1 ||
                json_integer_value(v) > (1 << 30)) {
                snprintf(err, errlen, "%s: expected an integer", cfg_fields[i].name);
                return -EINVAL;
            }
            int x = (int)json_integer_value(v);
            memcpy(dst, &x, sizeof x);
        }
    }
    json_t *act = json_object_get(obj, "hidden_act");
    if (act) {
        int a = json_is_string(act) ? bert_act_parse(json_string_value(act)) : -1;
        if (a < 0) {
            snprintf(err, errlen, "hidden_act: only %s is supported", BERT_ACT_SUPPORTED);
            return -EINVAL;
        }
        cfg->act = a;
    }
    json_t *pe = json_object_get(obj, "position_embedding_type");
    if (pe && !(json_is_string(pe) && strcmp(json_string_value(pe), "absolute") == 0)) {
        snprintf(err, errlen, "position_embedding_type: only \"absolute\" is supported");
        return -EINVAL;
    }
    return 0;
}

int bert_config_validate(const bert_config *c, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -EINVAL; } while (0)
    if (c->vocab_size < 1) BAD("vocab_size must be >= 1");
    if (c->hidden_size < 1) BAD("hidden_size must be >= 1");
    if (c->num_hidden_layers < 1 || c->num_hidden_layers > 4095)
        BAD("num_hidden_layers must be in 1..4095");
    if (c->num_attention_heads < 1 || c->hidden_size % c->num_attention_heads)
        BAD("num_attention_heads (%d) must divide hidden_size (%d)", c->num_attention_heads,
            c->hidden_size);
    if (c->intermediate_size < 1) BAD("intermediate_size must be >= 1");
    if (c->max_position_embeddings < 1) BAD("max_position_embeddings must be >= 1");
    if (c->type_vocab_size < 1) BAD("type_vocab_size must be >= 1");
    if (c->pad_token_id < -1 || c->pad_token_id >= c->vocab_size)
        BAD("pad_token_id out of range");
    if (!(c->hidden_dropout_prob >= 0 && c->hidden_dropout_prob < 1))
        BAD("hidden_dropout_prob must be in [0,1)");
    if (!(c->attention_probs_dropout_prob >= 0 && c->attention_probs_dropout_prob < 1))
        BAD("attention_probs_dropout_prob must be in [0,1)");
    if (!(c->layer_norm_eps > 0)) BAD("layer_norm_eps must be > 0");
    if (!(c->initializer_range >= 0)) BAD("initializer_range must be >= 0");
    if (!bert_act_name(c->act)) BAD("hidden_act: only %s is supported", BERT_ACT_SUPPORTED);
    return 0;
#undef BAD
}

json_t *bert_config_to_json(const bert_config *c)
{
    json_t *o = json_pack("{s:[s], s:s, s:s, s:s, s:b}", "architectures",
                          c->nsp ? "BertForPreTraining" : "BertForMaskedLM", "model_type",
                          "bert", "hidden_act", bert_act_name(c->act) ? bert_act_name(c->act) : "?",
                          "position_embedding_type", "absolute",
                          "tie_word_embeddings", 1);
    if (!o)
        return NULL;
    for (size_t i = 0; i < sizeof cfg_fields / sizeof cfg_fields[0]; i++) {
        const char *src = (const char *)c + cfg_fields[i].off;
        if (cfg_fields[i].is_float) {
            float f;
            memcpy(&f, src, sizeof f);
            /* the shortest decimal that reads back as the same float, so 0.1f
             * is written 0.1 as HF's config.json has it */
            char buf[32];
            for (int prec = 6; prec <= 9; prec++) {
                snprintf(buf, sizeof buf, "%.*g", prec, f);
                if ((float)strtod(buf, NULL) == f)
                    break;
            }
            json_object_set_new(o, cfg_fields[i].name, json_real(strtod(buf, NULL)));
        } else {
            int x;
            memcpy(&x, src, sizeof x);
            json_object_set_new(o, cfg_fields[i].name, json_integer(x));
        }
    }
    return o;
}

void bert_param_sizes(const bert_config *c, size_t s[BERT_NUM_PARAM_TENSORS])
{
    size_t V = c->vocab_size, C = c->hidden_size, L = c->num_hidden_layers,
           I = c->intermediate_size, P = c->max_position_embeddings, TV = c->type_vocab_size;
    s[BP_WTE] = V * C;
    s[BP_WPE] = P * C;
    s[BP_WTT] = TV * C;
    s[BP_EMB_LNW] = s[BP_EMB_LNB] = C;
    s[BP_QKVW] = L * 3 * C * C;
    s[BP_QKVB] = L * 3 * C;
    s[BP_ATTPROJW] = L * C * C;
    s[BP_ATTPROJB] = s[BP_LN1W] = s[BP_LN1B] = L * C;
    s[BP_FCW] = L * I * C;
    s[BP_FCB] = L * I;
    s[BP_FCPROJW] = L * C * I;
    s[BP_FCPROJB] = s[BP_LN2W] = s[BP_LN2B] = L * C;
    s[BP_HEAD_W] = C * C;
    s[BP_HEAD_B] = s[BP_HEAD_LNW] = s[BP_HEAD_LNB] = C;
    s[BP_DEC_B] = V;
    s[BP_POOL_W] = c->nsp ? C * C : 0;
    s[BP_POOL_B] = c->nsp ? C : 0;
    s[BP_NSP_W] = c->nsp ? 2 * C : 0;
    s[BP_NSP_B] = c->nsp ? 2 : 0;
}

static const char *param_names[BERT_NUM_PARAM_TENSORS] = {
    "wte", "wpe", "wtt", "emb_lnw", "emb_lnb", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln1w", "ln1b", "fcw", "fcb", "fcprojw", "fcprojb", "ln2w", "ln2b", "head_w", "head_b",
    "head_lnw", "head_lnb", "dec_b", "pool_w", "pool_b", "nsp_w", "nsp_b"};

const char *bert_param_name(int i)
{
    return i >= 0 && i < BERT_NUM_PARAM_TENSORS ? param_names[i] : "?";
}

int bert_param_decays(int i)
{
    /* HF Trainer: no decay for biases and LayerNorm parameters. */
    switch (i) {
    case BP_WTE: case BP_WPE: case BP_WTT: case BP_QKVW: case BP_ATTPROJW: case BP_FCW:
    case BP_FCPROJW: case BP_HEAD_W: case BP_POOL_W: case BP_NSP_W:
        return 1;
    default:
        return 0;
    }
}

int bert_param_segments(const bert_config *cfg, size_t *sizes, int *decays, int cap)
{
    size_t s[BERT_NUM_PARAM_TENSORS];
    bert_param_sizes(cfg, s);
    int n = 0, L = cfg->num_hidden_layers;
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
        if (!s[i])
            continue;
        int per_layer = i >= BP_QKVW && i <= BP_LN2B;
        int pieces = per_layer ? L * (i == BP_QKVW || i == BP_QKVB ? 3 : 1) : 1;
        for (int k = 0; k < pieces; k++, n++) {
            if (n < cap) {
                sizes[n] = s[i] / (size_t)pieces;
                decays[n] = bert_param_decays(i);
            }
        }
    }
    return n;
}

static int is_layer_matrix(int i)
{
    return i == BP_QKVW || i == BP_ATTPROJW || i == BP_FCW || i == BP_FCPROJW;
}

int bert_grad_bucket(const bert_config *cfg, int bucket, size_t off[BERT_BUCKET_MAX_RANGES],
                     size_t n[BERT_BUCKET_MAX_RANGES])
{
    int L = cfg->num_hidden_layers;
    if (bucket < 0 || bucket > L)
        return -EINVAL;
    size_t s[BERT_NUM_PARAM_TENSORS], at = 0;
    bert_param_sizes(cfg, s);
    int k = 0;
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; at += s[i], i++) {
        size_t o, len;
        if (bucket < L && is_layer_matrix(i)) { /* layer `bucket`'s slice */
            len = s[i] / (size_t)L;
            o = at + (size_t)bucket * len;
        } else if (bucket == L && !is_layer_matrix(i) && s[i]) {
            o = at;
            len = s[i];
        } else {
            continue;
        }
        if (k > 0 && off[k - 1] + n[k - 1] == o) { /* adjacent: merge */
            n[k - 1] += len;
            continue;
        }
        if (k == BERT_BUCKET_MAX_RANGES)
            return -EINVAL; /* cannot happen with this layout (at most 5) */
        off[k] = o;
        n[k++] = len;
    }
    return k;
}

static float *alloc_floats(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)) != 0)
        return NULL;
    memset(p, 0, (n ? n : 1) * sizeof(float));
    return p;
}

static void point_into(float **ptrs, float *mem, const size_t *sizes, int n)
{
    for (int i = 0; i < n; i++) {
        ptrs[i] = mem;
        mem += sizes[i];
    }
}

int bert_model_create(bert_model **out, const bert_config *cfg)
{
    char err[160];
    int rc = bert_config_validate(cfg, err, sizeof err);
    if (rc < 0)
        return rc;
    bert_model *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->cfg = *cfg;
    bert_param_sizes(cfg, m->param_sizes);
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
        m->num_params += m->param_sizes[i];
    m->params_memory = alloc_floats(m->num_params);
    m->grads_memory = alloc_floats(m->num_params);
    if (!m->params_memory || !m->grads_memory) {
        bert_model_destroy(m);
        return -ENOMEM;
    }
    point_into((float **)&m->params, m->params_memory, m->param_sizes, BERT_NUM_PARAM_TENSORS);
    point_into((float **)&m->grads, m->grads_memory, m->param_sizes, BERT_NUM_PARAM_TENSORS);
    *out = m;
    return 0;
}

void bert_model_destroy(bert_model *m)
{
    if (!m)
        return;
    free(m->params_memory);
    free(m->grads_memory);
    free(m->acts_memory);
    free(m);
}

/* Standard normal from Philox via Box-Muller; index i picks the pair. */
static float philox_normal(const philox_stream *s, uint64_t i)
{
    uint32_t a = philox_stream_u32(s, 2 * i), b = philox_stream_u32(s, 2 * i + 1);
    double u1 = ((double)a + 1.0) / 4294967297.0, u2 = (double)b / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void bert_model_init_weights(bert_model *m, uint64_t seed)
{
    const bert_config *c = &m->cfg;
    float **p = (float **)&m->params;
    memset(m->params_memory, 0, m->num_params * sizeof(float));
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
        int is_ln_weight = i == BP_EMB_LNW || i == BP_LN1W || i == BP_LN2W || i == BP_HEAD_LNW;
        if (is_ln_weight) {
            for (size_t k = 0; k < m->param_sizes[i]; k++)
                p[i][k] = 1.0f;
        } else if (bert_param_decays(i)) {
            philox_stream s;
            /* step 0xFFFFFFFF keeps init draws apart from every dropout draw */
            philox_stream_init(&s, seed, 0, 0xFFFFFFFFu, 0, (uint32_t)i, 0xFF);
            for (size_t k = 0; k < m->param_sizes[i]; k++)
                p[i][k] = c->initializer_range * philox_normal(&s, k);
        }
    }
    if (c->pad_token_id >= 0)
        memset(m->params.wte + (size_t)c->pad_token_id * c->hidden_size, 0,
               (size_t)c->hidden_size * sizeof(float));
}

static int ensure_acts(bert_model *m, int B, int T, int M)
{
    if (m->acts_memory && B <= m->act_B && T == m->act_T && M <= m->act_M)
        return 0;
    if (m->acts_memory && T == m->act_T) { // grow, never shrink, to avoid churn
        if (B < m->act_B) B = m->act_B;
        if (M < m->act_M) M = m->act_M;
    }
    const bert_config *c = &m->cfg;
    size_t L = c->num_hidden_layers, C = c->hidden_size, I = c->intermediate_size,
           V = c->vocab_size, NH = c->num_attention_heads, N = (size_t)B * T, Mz = M ? M : 1,
           Bz = B, nspB = c->nsp ? Bz : 0;
    size_t *s = m->act_sizes;
    s[BA_EMB] = s[BA_EMB_LN] = s[BA_X0] = N * C;
    s[BA_EMB_MEAN] = s[BA_EMB_RSTD] = N;
    s[BA_QKV] = L * N * 3 * C;
    s[BA_ATT] = L * Bz * NH * T * T;
    s[BA_ATTY] = s[BA_ATTPROJ] = s[BA_RES1] = s[BA_LN1] = L * N * C;
    s[BA_LN1_MEAN] = s[BA_LN1_RSTD] = L * N;
    s[BA_FCH] = s[BA_FCH_GELU] = L * N * I;
    s[BA_FCPROJ] = s[BA_RES2] = s[BA_LN2] = L * N * C;
    s[BA_LN2_MEAN] = s[BA_LN2_RSTD] = L * N;
    s[BA_DROP] = N * C;
    s[BA_HSEL] = s[BA_HD] = s[BA_HG] = s[BA_HLN] = Mz * C;
    s[BA_H_MEAN] = s[BA_H_RSTD] = Mz;
    s[BA_LOGITS] = s[BA_PROBS] = Mz * V;
    s[BA_LOSSES] = Mz;
    s[BA_CLS] = s[BA_POOL_PRE] = s[BA_POOLED] = nspB * C;
    s[BA_NSP_LOGITS] = s[BA_NSP_PROBS] = nspB * 2;
    s[BA_NSP_LOSSES] = nspB;
    s[BA_D_RES] = s[BA_D_TMP] = s[BA_D_TMP2] = N * C;
    s[BA_D_QKV] = N * 3 * C;
    s[BA_D_ATT] = Bz * NH * T * T;
    s[BA_D_FCH] = s[BA_D_FCH_GELU] = N * I;
    s[BA_D_H1] = s[BA_D_H2] = Mz * C;
    s[BA_D_LOSSES] = Mz > Bz ? Mz : Bz;
    s[BA_D_CLS] = s[BA_D_POOL] = nspB * C;
    s[BA_D_NSP] = nspB * 2;
    size_t total = 0;
    for (int i = 0; i < BERT_NUM_ACT_TENSORS; i++)
        total += s[i];
    float *mem = alloc_floats(total);
    if (!mem)
        return -ENOMEM;
    free(m->acts_memory);
    m->acts_memory = mem;
    m->num_acts = total;
    point_into((float **)&m->acts, mem, s, BERT_NUM_ACT_TENSORS);
    m->act_B = B;
    m->act_T = T;
    m->act_M = (int)Mz;
    return 0;
}

int bert_batch_validate(const bert_model *m, const bert_batch *b, char *err, size_t errlen)
{
    const bert_config *c = &m->cfg;
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -EINVAL; } while (0)
    if (b->B < 1 || b->T < 1) BAD("batch of %d x %d", b->B, b->T);
    if (b->T > c->max_position_embeddings)
        BAD("sequence length %d > max_position_embeddings %d", b->T, c->max_position_embeddings);
    if (b->M < 0 || (size_t)b->M > (size_t)b->B * b->T) BAD("mlm count %d out of range", b->M);
    if (!b->input_ids || !b->token_type_ids || !b->seq_lens || (b->M && (!b->mlm_positions ||
        !b->mlm_labels)))
        BAD("batch is missing an array");
    if (c->nsp && !b->nsp_labels) BAD("nsp model needs nsp_labels");
    for (int i = 0; i < b->B; i++)
        if (b->seq_lens[i] < 1 || b->seq_lens[i] > b->T)
            BAD("seq_lens[%d] = %d outside 1..%d", i, b->seq_lens[i], b->T);
    for (size_t i = 0; i < (size_t)b->B * b->T; i++) {
        if (b->input_ids[i] < 0 || b->input_ids[i] >= c->vocab_size)
            BAD("input_ids[%zu] = %d outside the vocabulary", i, b->input_ids[i]);
        if (b->token_type_ids[i] < 0 || b->token_type_ids[i] >= c->type_vocab_size)
            BAD("token_type_ids[%zu] = %d out of range", i, b->token_type_ids[i]);
    }
    for (int i = 0; i < b->M; i++) {
        if (b->mlm_positions[i] < 0 || b->mlm_positions[i] >= b->B * b->T)
            BAD("mlm_positions[%d] = %d out of range", i, b->mlm_positions[i]);
        if (b->mlm_labels[i] < 0 || b->mlm_labels[i] >= c->vocab_size)
            BAD("mlm_labels[%d] = %d outside the vocabulary", i, b->mlm_labels[i]);
    }
    if (c->nsp)
        for (int i = 0; i < b->B; i++)
            if (b->nsp_labels[i] < 0 || b->nsp_labels[i] > 1)
                BAD("nsp_labels[%d] = %d not 0/1", i, b->nsp_labels[i]);
    return 0;
#undef BAD
}

/* The Philox stream of one dropout site, or NULL when that dropout is off. */
static const philox_stream *site_rng(philox_stream *s, const bert_dropout *d, float p,
                                     int layer, int site)
{
    if (!d || !d->train || p <= 0.0f)
        return NULL;
    philox_stream_init(s, d->seed, d->rank, d->step, d->micro, (uint32_t)layer,
                       (uint32_t)site);
    return s;
}

void bert_eval_accumulate(const float *logits, const float *losses, const int32_t *labels, int M, int V,
                          bert_eval_sums *acc)
{
    for (int i = 0; i < M; i++) {
        const float *row = logits + (size_t)i * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best])
                best = v;
        acc->loss_sum += losses[i];
        acc->count += 1.0;
        acc->correct += best == labels[i];
    }
}

int bert_model_eval(bert_model *m, const bert_batch *b, bert_eval_sums *acc)
{
    const bert_dropout off = {.train = 0};
    int rc = bert_model_forward(m, b, &off);
    if (rc < 0)
        return rc;
    m->have_forward = 0; /* nothing of this pass is for a backward */
    bert_eval_accumulate(m->acts.logits, m->acts.losses, b->mlm_labels, b->M, m->cfg.vocab_size, acc);
    return 0;
}

/* hidden_act of the FFN and the MLM head transform: GELU, erf or tanh form */
static void act_forward(const bert_config *c, float *out, const float *inp, size_t n)
{
    if (bert_act_is_tanh(c->act))
        gelu_tanh_forward(out, inp, n);
    else
        gelu_forward(out, inp, n);
}
static void act_backward(const bert_config *c, float *dinp, const float *inp, const float *dout,
                         size_t n)
{
    if (bert_act_is_tanh(c->act))
        gelu_tanh_backward(dinp, inp, dout, n);
    else
        gelu_backward(dinp, inp, dout, n);
}

int bert_model_forward(bert_model *m, const bert_batch *b, const bert_dropout *d)
{
    char err[160];
    int rc = bert_batch_validate(m, b, err, sizeof err);
    if (rc < 0)
        return rc;
    rc = ensure_acts(m, b->B, b->T, b->M);
    if (rc < 0)
        return rc;
    const bert_config *c = &m->cfg;
    int B = b->B, T = b->T, C = c->hidden_size, NH = c->num_attention_heads,
        I = c->intermediate_size, L = c->num_hidden_layers, V = c->vocab_size, M = b->M;
    size_t N = (size_t)B * T;
    float eps = c->layer_norm_eps, ph = c->hidden_dropout_prob,
          pa = c->attention_probs_dropout_prob;
    bert_params *p = &m->params;
    bert_acts *a = &m->acts;
    philox_stream rs;
    const philox_stream *r;

    embeddings_forward(a->emb, b->input_ids, b->token_type_ids, p->wte, p->wpe, p->wtt, B, T, C);
    layernorm_forward(a->emb_ln, a->emb_mean, a->emb_rstd, a->emb, p->emb_lnw, p->emb_lnb,
                      (int)N, C, eps);
    r = site_rng(&rs, d, ph, L, DROPOUT_SITE_EMB);
    dropout_forward(a->x0, a->emb_ln, r, ph, N * C);

    for (int l = 0; l < L; l++) {
        const float *x = l == 0 ? a->x0 : a->ln2 + (l - 1) * N * C; // (N,C)
        float *qkv = a->qkv + l * N * 3 * C;
        float *att = a->att + (size_t)l * B * NH * T * T;
        float *atty = a->atty + l * N * C, *attproj = a->attproj + l * N * C;
        float *res1 = a->res1 + l * N * C, *ln1 = a->ln1 + l * N * C;
        float *fch = a->fch + l * N * I, *fch_gelu = a->fch_gelu + l * N * I;
        float *fcproj = a->fcproj + l * N * C, *res2 = a->res2 + l * N * C;
        float *ln2 = a->ln2 + l * N * C;

        matmul_forward(qkv, x, p->qkvw + (size_t)l * 3 * C * C, p->qkvb + l * 3 * C, (int)N, C,
                       3 * C);
        r = site_rng(&rs, d, pa, l, DROPOUT_SITE_ATTN_PROBS);
        attention_forward(atty, att, qkv, b->seq_lens, r, pa, B, T, C, NH);
        matmul_forward(attproj, atty, p->attprojw + (size_t)l * C * C, p->attprojb + l * C,
                       (int)N, C, C);
        r = site_rng(&rs, d, ph, l, DROPOUT_SITE_ATTN_OUT);
        dropout_forward(a->drop, attproj, r, ph, N * C);
        residual_forward(res1, x, a->drop, N * C);
        layernorm_forward(ln1, a->ln1_mean + l * N, a->ln1_rstd + l * N, res1,
                          p->ln1w + l * C, p->ln1b + l * C, (int)N, C, eps);
        matmul_forward(fch, ln1, p->fcw + (size_t)l * I * C, p->fcb + (size_t)l * I, (int)N, C, I);
        act_forward(&m->cfg, fch_gelu, fch, N * I);
        matmul_forward(fcproj, fch_gelu, p->fcprojw + (size_t)l * C * I, p->fcprojb + l * C,
                       (int)N, I, C);
        r = site_rng(&rs, d, ph, l, DROPOUT_SITE_FFN_OUT);
        dropout_forward(a->drop, fcproj, r, ph, N * C);
        residual_forward(res2, ln1, a->drop, N * C);
        layernorm_forward(ln2, a->ln2_mean + l * N, a->ln2_rstd + l * N, res2,
                          p->ln2w + l * C, p->ln2b + l * C, (int)N, C, eps);
    }
    const float *hidden = a->ln2 + (size_t)(L - 1) * N * C; // (N,C) sequence output

    /* MLM head on the masked rows only */
    double mlm = 0.0;
    if (M > 0) {
        gather_rows_forward(a->hsel, hidden, b->mlm_positions, M, C);
        matmul_forward(a->hd, a->hsel, p->head_w, p->head_b, M, C, C);
        act_forward(&m->cfg, a->hg, a->hd, (size_t)M * C);
        layernorm_forward(a->hln, a->h_mean, a->h_rstd, a->hg, p->head_lnw, p->head_lnb, M, C,
                          eps);
        matmul_forward(a->logits, a->hln, p->wte, p->dec_b, M, C, V);
        crossentropy_softmax_forward(a->losses, a->probs, a->logits, b->mlm_labels, M, V);
        for (int i = 0; i < M; i++)
            mlm += a->losses[i];
        mlm /= M;
    }
    double nsp = 0.0;
    if (c->nsp) {
        for (int i = 0; i < B; i++)
            memcpy(a->cls + (size_t)i * C, hidden + (size_t)i * T * C, C * sizeof(float));
        matmul_forward(a->pool_pre, a->cls, p->pool_w, p->pool_b, B, C, C);
        tanh_forward(a->pooled, a->pool_pre, (size_t)B * C);
        matmul_forward(a->nsp_logits, a->pooled, p->nsp_w, p->nsp_b, B, C, 2);
        crossentropy_softmax_forward(a->nsp_losses, a->nsp_probs, a->nsp_logits, b->nsp_labels,
                                     B, 2);
        for (int i = 0; i < B; i++)
            nsp += a->nsp_losses[i];
        nsp /= B;
    }
    m->mlm_loss = (float)mlm;
    m->nsp_loss = (float)nsp;
    m->loss = (float)(mlm + nsp);
    m->batch = *b;
    if (d)
        m->dropout = *d;
    else
        m->dropout = (bert_dropout){0};
    m->have_forward = 1;
    return 0;
}

void bert_model_zero_grad(bert_model *m)
{
    memset(m->grads_memory, 0, m->num_params * sizeof(float));
}

int bert_model_backward(bert_model *m, float loss_scale)
{
    if (!m->have_forward)
        return -EINVAL;
    const bert_config *c = &m->cfg;
    const bert_batch *b = &m->batch;
    const bert_dropout *d = &m->dropout;
    int B = b->B, T = b->T, C = c->hidden_size, NH = c->num_attention_heads,
        I = c->intermediate_size, L = c->num_hidden_layers, V = c->vocab_size, M = b->M;
    size_t N = (size_t)B * T;
    float ph = c->hidden_dropout_prob, pa = c->attention_probs_dropout_prob;
    bert_params *p = &m->params, *g = &m->grads;
    bert_acts *a = &m->acts;
    philox_stream rs;
    const philox_stream *r;

    memset(a->d_res, 0, N * C * sizeof(float)); // d hidden, filled by scatter below
    if (M > 0) {
        for (int i = 0; i < M; i++)
            a->d_losses[i] = loss_scale / (float)M;
        /* dlogits overwrite probs in place: probs are not needed afterwards */
        float *dlogits = a->probs; // (M,V)
        crossentropy_softmax_backward(dlogits, a->probs, b->mlm_labels, a->d_losses, M, V);
        matmul_backward(a->d_h1, g->wte, g->dec_b, dlogits, a->hln, p->wte, M, C, V);
        layernorm_backward(a->d_h2, g->head_lnw, g->head_lnb, a->d_h1, a->hg, p->head_lnw,
                           a->h_mean, a->h_rstd, M, C);
        act_backward(&m->cfg, a->d_h1, a->hd, a->d_h2, (size_t)M * C);
        matmul_backward(a->d_h2, g->head_w, g->head_b, a->d_h1, a->hsel, p->head_w, M, C, C);
        gather_rows_backward(a->d_res, a->d_h2, b->mlm_positions, M, C);
    }
    if (c->nsp) {
        for (int i = 0; i < B; i++)
            a->d_losses[i] = loss_scale / (float)B;
        crossentropy_softmax_backward(a->d_nsp, a->nsp_probs, b->nsp_labels, a->d_losses, B, 2);
        matmul_backward(a->d_pool, g->nsp_w, g->nsp_b, a->d_nsp, a->pooled, p->nsp_w, B, C, 2);
        tanh_backward(a->d_cls, a->pooled, a->d_pool, (size_t)B * C);
        matmul_backward(a->d_pool, g->pool_w, g->pool_b, a->d_cls, a->cls, p->pool_w, B, C, C);
        for (int i = 0; i < B; i++)
            for (int k = 0; k < C; k++)
                a->d_res[(size_t)i * T * C + k] += a->d_pool[(size_t)i * C + k];
    }

    for (int l = L - 1; l >= 0; l--) {
        const float *x = l == 0 ? a->x0 : a->ln2 + (l - 1) * N * C;
        float *qkv = a->qkv + l * N * 3 * C;
        float *att = a->att + (size_t)l * B * NH * T * T;
        float *atty = a->atty + l * N * C, *res1 = a->res1 + l * N * C, *ln1 = a->ln1 + l * N * C;
        float *fch = a->fch + l * N * I, *fch_gelu = a->fch_gelu + l * N * I;
        float *res2 = a->res2 + l * N * C;

        /* d_res holds d(layer output); LN2 */
        layernorm_backward(a->d_tmp, g->ln2w + l * C, g->ln2b + l * C, a->d_res, res2,
                           p->ln2w + l * C, a->ln2_mean + l * N, a->ln2_rstd + l * N, (int)N, C);
        /* res2 = ln1 + dropout(fcproj): d_tmp is d ln1 (residual part) and d dropped */
        r = site_rng(&rs, d, ph, l, DROPOUT_SITE_FFN_OUT);
        dropout_backward(a->d_tmp2, a->d_tmp, r, ph, N * C);
        matmul_backward(a->d_fch_gelu, g->fcprojw + (size_t)l * C * I, g->fcprojb + l * C,
                        a->d_tmp2, fch_gelu, p->fcprojw + (size_t)l * C * I, (int)N, I, C);
        act_backward(&m->cfg, a->d_fch, fch, a->d_fch_gelu, N * I);
        matmul_backward(a->d_tmp2, g->fcw + (size_t)l * I * C, g->fcb + (size_t)l * I, a->d_fch,
                        ln1, p->fcw + (size_t)l * I * C, (int)N, C, I);
        residual_forward(a->d_tmp, a->d_tmp, a->d_tmp2, N * C); // d ln1 total
        layernorm_backward(a->d_res, g->ln1w + l * C, g->ln1b + l * C, a->d_tmp, res1,
                           p->ln1w + l * C, a->ln1_mean + l * N, a->ln1_rstd + l * N, (int)N, C);
        /* res1 = x + dropout(attproj): d_res is d x (residual part) and d dropped */
        r = site_rng(&rs, d, ph, l, DROPOUT_SITE_ATTN_OUT);
        dropout_backward(a->d_tmp2, a->d_res, r, ph, N * C);
        matmul_backward(a->d_tmp, g->attprojw + (size_t)l * C * C, g->attprojb + l * C,
                        a->d_tmp2, atty, p->attprojw + (size_t)l * C * C, (int)N, C, C);
        r = site_rng(&rs, d, pa, l, DROPOUT_SITE_ATTN_PROBS);
        attention_backward(a->d_qkv, a->d_att, a->d_tmp, qkv, att, b->seq_lens, r, pa, B, T, C,
                           NH);
        matmul_backward(a->d_tmp2, g->qkvw + (size_t)l * 3 * C * C, g->qkvb + l * 3 * C,
                        a->d_qkv, x, p->qkvw + (size_t)l * 3 * C * C, (int)N, C, 3 * C);
        residual_forward(a->d_res, a->d_res, a->d_tmp2, N * C); // d x total
    }
    r = site_rng(&rs, d, ph, L, DROPOUT_SITE_EMB);
    dropout_backward(a->d_tmp, a->d_res, r, ph, N * C);
    layernorm_backward(a->d_tmp2, g->emb_lnw, g->emb_lnb, a->d_tmp, a->emb, p->emb_lnw,
                       a->emb_mean, a->emb_rstd, (int)N, C);
    embeddings_backward(g->wte, g->wpe, g->wtt, a->d_tmp2, b->input_ids, b->token_type_ids, B, T,
                        C);
    /* probs were overwritten; a second backward needs a new forward */
    m->have_forward = 0;
    return 0;
}

void bert_set_threads(int n)
{
    if (n < 1)
        n = 1;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(1); // GEMMs run inside OpenMP threads (matmul.c)
}
