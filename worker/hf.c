/* hf — see hf.h. */
#include "worker/hf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/checkpoint.h"
#include "worker/ptbin.h"

static void add(hf_tensor *out, int cap, int *n, const char *name, size_t offset, int ndim,
                int64_t d0, int64_t d1)
{
    if (*n < cap) {
        hf_tensor *t = &out[*n];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->ndim = ndim;
        t->shape[0] = d0;
        t->shape[1] = d1;
        t->offset = offset;
        t->numel = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1);
    }
    (*n)++;
}

int hf_tensor_table(const bert_model *m, hf_tensor *out, int cap)
{
    const bert_config *c = &m->cfg;
    const bert_params *p = &m->params;
    int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    int n = 0;
    char nm[96];
#define OFF(ptr) ((size_t)((ptr) - m->params_memory))
    add(out, cap, &n, "bert.embeddings.word_embeddings.weight", OFF(p->wte), 2, V, C);
    add(out, cap, &n, "bert.embeddings.position_embeddings.weight", OFF(p->wpe), 2,
        c->max_position_embeddings, C);
    add(out, cap, &n, "bert.embeddings.token_type_embeddings.weight", OFF(p->wtt), 2,
        c->type_vocab_size, C);
    add(out, cap, &n, "bert.embeddings.LayerNorm.weight", OFF(p->emb_lnw), 1, C, 0);
    add(out, cap, &n, "bert.embeddings.LayerNorm.bias", OFF(p->emb_lnb), 1, C, 0);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        static const char *qkv[3] = {"query", "key", "value"};
        for (int k = 0; k < 3; k++) {
            snprintf(nm, sizeof nm, "bert.encoder.layer.%d.attention.self.%s.weight", l, qkv[k]);
            add(out, cap, &n, nm, OFF(p->qkvw) + ((size_t)l * 3 + k) * C * C, 2, C, C);
            snprintf(nm, sizeof nm, "bert.encoder.layer.%d.attention.self.%s.bias", l, qkv[k]);
            add(out, cap, &n, nm, OFF(p->qkvb) + ((size_t)l * 3 + k) * C, 1, C, 0);
        }
#define LAYER(suffix, ptr, nd, d0, d1)                                                       \
    do {                                                                                     \
        snprintf(nm, sizeof nm, "bert.encoder.layer.%d.%s", l, suffix);                      \
        add(out, cap, &n, nm, OFF(ptr) + (size_t)l * (d0) * ((nd) == 2 ? (d1) : 1), nd, d0, d1); \
    } while (0)
        LAYER("attention.output.dense.weight", p->attprojw, 2, C, C);
        LAYER("attention.output.dense.bias", p->attprojb, 1, C, 0);
        LAYER("attention.output.LayerNorm.weight", p->ln1w, 1, C, 0);
        LAYER("attention.output.LayerNorm.bias", p->ln1b, 1, C, 0);
        LAYER("intermediate.dense.weight", p->fcw, 2, I, C);
        LAYER("intermediate.dense.bias", p->fcb, 1, I, 0);
        LAYER("output.dense.weight", p->fcprojw, 2, C, I);
        LAYER("output.dense.bias", p->fcprojb, 1, C, 0);
        LAYER("output.LayerNorm.weight", p->ln2w, 1, C, 0);
        LAYER("output.LayerNorm.bias", p->ln2b, 1, C, 0);
#undef LAYER
    }
    if (c->nsp) {
        add(out, cap, &n, "bert.pooler.dense.weight", OFF(p->pool_w), 2, C, C);
        add(out, cap, &n, "bert.pooler.dense.bias", OFF(p->pool_b), 1, C, 0);
    }
    add(out, cap, &n, "cls.predictions.transform.dense.weight", OFF(p->head_w), 2, C, C);
    add(out, cap, &n, "cls.predictions.transform.dense.bias", OFF(p->head_b), 1, C, 0);
    add(out, cap, &n, "cls.predictions.transform.LayerNorm.weight", OFF(p->head_lnw), 1, C, 0);
    add(out, cap, &n, "cls.predictions.transform.LayerNorm.bias", OFF(p->head_lnb), 1, C, 0);
    add(out, cap, &n, "cls.predictions.bias", OFF(p->dec_b), 1, V, 0);
    if (c->nsp) {
        add(out, cap, &n, "cls.seq_relationship.weight", OFF(p->nsp_w), 2, 2, C);
        add(out, cap, &n, "cls.seq_relationship.bias", OFF(p->nsp_b), 1, 2, 0);
    }
#undef OFF
    return n;
}

/* The tensors of an HF model directory: one file, or the shards of an
 * index (model.safetensors.index.json, pytorch_model.bin.index.json), each
 * an st_file (safetensors, or a torch zip read by ptbin.c). */
typedef struct hf_source {
    st_file **files;
    int n;
    char what[64]; /* the file (or index) the tensors come from, for messages */
} hf_source;

static const st_tensor *find_in(const hf_source *src, const char *name, const st_file **in)
{
    for (int i = 0; i < src->n; i++) {
        const st_tensor *t = st_find(src->files[i], name);
        if (t) {
            *in = src->files[i];
            return t;
        }
    }
    return NULL;
}

/* Finds name with or without the "bert." prefix (BertModel checkpoints
 * have none), and under the old TF-port LayerNorm names gamma/beta. */
static const st_tensor *find_alias(const hf_source *src, const char *name, const st_file **in)
{
    const st_tensor *t = find_in(src, name, in);
    if (t)
        return t;
    char alt[128];
    if (strncmp(name, "bert.", 5) == 0 && (t = find_in(src, name + 5, in)))
        return t;
    const char *ln = strstr(name, "LayerNorm.");
    if (ln) {
        const char *what = ln + strlen("LayerNorm.");
        const char *repl = strcmp(what, "weight") == 0 ? "gamma" : "beta";
        snprintf(alt, sizeof alt, "%.*sLayerNorm.%s", (int)(ln - name), name, repl);
        if ((t = find_in(src, alt, in)))
            return t;
        if (strncmp(alt, "bert.", 5) == 0 && (t = find_in(src, alt + 5, in)))
            return t;
    }
    if (strcmp(name, "cls.predictions.bias") == 0)
        return find_in(src, "cls.predictions.decoder.bias", in);
    return NULL;
}

/* The heads: a checkpoint without them gets them initialised as
 * transformers does (a BertModel has no MLM head, a BertForMaskedLM no
 * pooler or NSP head); every other tensor must be there. */
static bool is_head(const char *name)
{
    return strncmp(name, "cls.", 4) == 0 || strncmp(name, "bert.pooler.", 12) == 0;
}

/* Copies every parameter of m from src. A missing head tensor keeps what m
 * holds (the caller initialised it) when heads_optional, and *missing_heads
 * counts them; anything else missing or mis-shaped is -EINVAL. */
static int load_weights(bert_model *m, const hf_source *src, bool heads_optional,
                        int *missing_heads, char *err, size_t errlen)
{
    int n = hf_tensor_table(m, NULL, 0);
    hf_tensor *tab = calloc((size_t)n, sizeof *tab);
    if (!tab)
        return -ENOMEM;
    hf_tensor_table(m, tab, n);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const st_file *f = NULL;
        const st_tensor *t = find_alias(src, tab[i].name, &f);
        if (!t && heads_optional && is_head(tab[i].name)) {
            if (missing_heads)
                (*missing_heads)++;
            continue;
        }
        if (!t) {
            snprintf(err, errlen, "%s has no tensor '%s'", src->what, tab[i].name);
            rc = -EINVAL;
            goto out;
        }
        int shape_ok = t->ndim == tab[i].ndim && t->shape[0] == tab[i].shape[0] &&
                       (tab[i].ndim == 1 || t->shape[1] == tab[i].shape[1]);
        if (!shape_ok) {
            snprintf(err, errlen, "tensor '%s' has shape [%lld%s%lld] but the config needs "
                     "[%lld, %lld]", tab[i].name, (long long)t->shape[0],
                     t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL,
                     (long long)tab[i].shape[0], (long long)tab[i].shape[1]);
            rc = -EINVAL;
            goto out;
        }
        if (st_read_f32(f, t, m->params_memory + tab[i].offset, tab[i].numel) < 0) {
            snprintf(err, errlen, "tensor '%s' is not a floating-point tensor", tab[i].name);
            rc = -EINVAL;
            goto out;
        }
    }
out:
    free(tab);
    return rc;
}

int hf_load_weights(bert_model *m, const st_file *f, char *err, size_t errlen)
{
    st_file *one = (st_file *)f;
    hf_source src = {.files = &one, .n = 1};
    snprintf(src.what, sizeof src.what, "model.safetensors");
    return load_weights(m, &src, false, NULL, err, errlen);
}

int hf_read_config(const char *dir, bert_config *cfg, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t jerr;
    json_t *o = json_load_file(path, 0, &jerr);
    if (!o) {
        /* jansson's text may quote the bytes it choked on; init_from can
         * name any file under the data roots, so say where, never what */
        if (access(path, R_OK) < 0)
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
        else
            snprintf(err, errlen, "%s: not valid JSON (line %d, column %d)", path, jerr.line,
                     jerr.column);
        return -EINVAL;
    }
    if (!json_is_object(o)) {
        snprintf(err, errlen, "%s: not a JSON object", path);
        json_decref(o);
        return -EINVAL;
    }
    bert_config_preset(cfg, NULL);
    int rc = bert_config_apply_json(cfg, o, err, errlen);
    json_t *arch = json_object_get(o, "architectures");
    if (rc == 0 && json_is_array(arch) && json_is_string(json_array_get(arch, 0)) &&
        strcmp(json_string_value(json_array_get(arch, 0)), "BertForPreTraining") == 0)
        cfg->nsp = 1;
    json_decref(o);
    if (rc == 0)
        rc = bert_config_validate(cfg, err, errlen);
    return rc;
}

/* The NSP tensors (pooler, seq_relationship) come last in the parameter
 * span (model.h's enum), so a model with them is the model without them plus
 * a tail. Makes *m a model with nsp, keeping every other parameter: the tail
 * is dropped, or added initialised as transformers does (weights
 * N(0, initializer_range) drawn from seed, biases 0). */
static int set_nsp(bert_model **m, int nsp, uint64_t seed, char *err, size_t errlen)
{
    bert_config cfg = (*m)->cfg;
    if (cfg.nsp == nsp)
        return 0;
    cfg.nsp = nsp;
    bert_model *n = NULL;
    int rc = bert_model_create(&n, &cfg);
    if (rc < 0) {
        snprintf(err, errlen, "cannot allocate the model: %s", strerror(-rc));
        return rc;
    }
    const bert_model *with = nsp ? n : *m, *without = nsp ? *m : n;
    assert((size_t)(with->params.pool_w - with->params_memory) == without->num_params);
    if (nsp)
        bert_model_init_weights(n, seed);
    memcpy(n->params_memory, (*m)->params_memory, without->num_params * sizeof(float));
    bert_model_destroy(*m);
    *m = n;
    return 0;
}

/* A bertd checkpoint: its config and parameters; the optimizer moments and
 * the step stay behind (a new job starts its own schedule from step 0). */
static int init_from_checkpoint(bert_model **out, const char *dir, int nsp, uint64_t seed,
                                char *err, size_t errlen)
{
    bert_config cfg;
    bert_model *m = NULL;
    int rc = checkpoint_read_config(dir, &cfg, err, errlen);
    if (rc < 0)
        goto out;
    rc = bert_model_create(&m, &cfg);
    if (rc < 0) {
        snprintf(err, errlen, "cannot allocate the model: %s", strerror(-rc));
        goto out;
    }
    rc = checkpoint_load(dir, m, NULL, NULL, err, errlen);
    if (rc < 0)
        goto out;
    if (nsp >= 0 && (rc = set_nsp(&m, nsp, seed, err, errlen)) < 0)
        goto out;
    *out = m;
    m = NULL;
out:
    bert_model_destroy(m);
    return rc;
}

static bool has_file(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void source_close(hf_source *src)
{
    for (int i = 0; i < src->n; i++)
        st_close(src->files[i]);
    free(src->files);
    src->files = NULL;
    src->n = 0;
}

static int open_weights(st_file **f, const char *path, bool torch, char *err, size_t errlen)
{
    return torch ? ptbin_open(f, path, err, errlen) : st_open(f, path, err, errlen);
}

/* Opens every shard an index names (its "weight_map" values: file names in
 * dir, each opened once). */
static int open_index(hf_source *src, const char *dir, const char *index, bool torch,
                      char *err, size_t errlen)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, index);
    json_error_t jerr;
    json_t *o = json_load_file(path, 0, &jerr), *map = json_object_get(o, "weight_map");
    const char *key;
    json_t *v;
    int rc = -EINVAL;
    if (!o) {
        if (access(path, R_OK) < 0)
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
        else
            snprintf(err, errlen, "%s: not valid JSON (line %d, column %d)", path, jerr.line,
                     jerr.column);
        goto out;
    }
    if (!json_is_object(map) || json_object_size(map) == 0) {
        snprintf(err, errlen, "%s: no \"weight_map\" object naming the shards", path);
        goto out;
    }
    /* at most one shard per tensor */
    src->files = calloc(json_object_size(map), sizeof *src->files);
    const char **names = calloc(json_object_size(map), sizeof *names);
    if (!src->files || !names) {
        free(names);
        rc = -ENOMEM;
        goto out;
    }
    json_object_foreach(map, key, v) {
        const char *shard = json_string_value(v);
        if (!shard || !shard[0] || strchr(shard, '/') || strcmp(shard, ".") == 0 ||
            strcmp(shard, "..") == 0) {
            snprintf(err, errlen, "%s: weight_map entry of tensor '%s' is not a file name in "
                     "the directory", path, key);
            free(names);
            goto out;
        }
        bool seen = false;
        for (int i = 0; i < src->n && !seen; i++)
            seen = strcmp(names[i], shard) == 0;
        if (seen)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        if ((rc = open_weights(&src->files[src->n], path, torch, err, errlen)) < 0) {
            free(names);
            goto out;
        }
        names[src->n++] = shard;
    }
    free(names);
    rc = 0;
out:
    json_decref(o);
    return rc;
}

/* The weights of an HF directory, in transformers' order of preference. */
static int open_source(hf_source *src, const char *dir, char *err, size_t errlen)
{
    static const struct { const char *file; bool torch, index; } layouts[] = {
        {"model.safetensors", false, false},
        {"model.safetensors.index.json", false, true},
        {"pytorch_model.bin", true, false},
        {"pytorch_model.bin.index.json", true, true},
    };
    char path[4300];
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        if (!has_file(dir, layouts[i].file))
            continue;
        snprintf(src->what, sizeof src->what, "%s", layouts[i].file);
        if (layouts[i].index)
            return open_index(src, dir, layouts[i].file, layouts[i].torch, err, errlen);
        src->files = calloc(1, sizeof *src->files);
        if (!src->files)
            return -ENOMEM;
        snprintf(path, sizeof path, "%s/%s", dir, layouts[i].file);
        int rc = open_weights(&src->files[0], path, layouts[i].torch, err, errlen);
        if (rc == 0)
            src->n = 1;
        return rc < 0 ? rc : 0;
    }
    const char *why = hf_init_from_missing(dir);
    snprintf(err, errlen, "%s %s", dir, why ? why : "holds no weights");
    return -EINVAL;
}

const char *hf_init_from_missing(const char *dir)
{
    static const char *const weights[] = {"model.safetensors", "model.safetensors.index.json",
                                          "pytorch_model.bin", "pytorch_model.bin.index.json"};
    struct stat sb;
    if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode))
        return "is not a directory";
    if (!has_file(dir, "config.json")) {
        if (has_file(dir, "state.json"))
            return NULL;
        return "holds no model: neither config.json with model.safetensors or "
               "pytorch_model.bin (an HF model directory) nor state.json (a bertd checkpoint)";
    }
    for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++)
        if (has_file(dir, weights[i]))
            return NULL;
    if (has_file(dir, "tf_model.h5"))
        return "holds only TensorFlow weights (tf_model.h5): convert them with transformers, "
               "BertForPreTraining.from_pretrained(dir, from_tf=True).save_pretrained(new_dir), "
               "and give new_dir";
    if (has_file(dir, "flax_model.msgpack"))
        return "holds only Flax weights (flax_model.msgpack): convert them with transformers, "
               "BertForPreTraining.from_pretrained(dir, from_flax=True).save_pretrained(new_dir), "
               "and give new_dir";
    return "has config.json but no weights (model.safetensors, model.safetensors.index.json, "
           "pytorch_model.bin or pytorch_model.bin.index.json)";
}

int hf_init_from(bert_model **out, const char *dir, int nsp, uint64_t seed, char *err,
                 size_t errlen)
{
    struct stat sb;
    if (stat(dir, &sb) < 0) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -EINVAL;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "%s: not a directory", dir);
        return -EINVAL;
    }
    if (!has_file(dir, "config.json")) {
        if (has_file(dir, "state.json"))
            return init_from_checkpoint(out, dir, nsp, seed, err, errlen);
        snprintf(err, errlen, "%s: neither an HF model directory (no config.json) nor a bertd "
                 "checkpoint (no state.json)", dir);
        return -EINVAL;
    }
    bert_config cfg;
    hf_source src = {0};
    bert_model *m = NULL;
    int rc = hf_read_config(dir, &cfg, err, errlen);
    if (rc < 0)
        goto out;
    if ((rc = open_source(&src, dir, err, errlen)) < 0)
        goto out;
    const st_file *f;
    if (nsp >= 0) /* the job decides */
        cfg.nsp = nsp;
    else if (find_in(&src, "cls.seq_relationship.weight", &f))
        cfg.nsp = 1; /* an NSP checkpoint named BertForMaskedLM still brings its pooler */
    rc = bert_model_create(&m, &cfg);
    if (rc < 0) {
        snprintf(err, errlen, "cannot allocate the model: %s", strerror(-rc));
        goto out;
    }
    /* a head the checkpoint lacks starts as transformers initialises it */
    int missing = 0;
    if ((rc = load_weights(m, &src, true, &missing, err, errlen)) < 0)
        goto out;
    if (missing) {
        bert_model_init_weights(m, seed);
        if ((rc = load_weights(m, &src, true, NULL, err, errlen)) < 0)
            goto out;
    }
    *out = m;
    m = NULL;
out:
    bert_model_destroy(m);
    source_close(&src);
    return rc;
}

static int copy_file(const char *src, const char *dst)
{
    int rc = 0;
    FILE *in = fopen(src, "rb"), *outf = NULL;
    char tmp[4200];
    if (!in)
        return -errno;
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    outf = fopen(tmp, "wb");
    if (!outf) {
        rc = -errno;
        goto out;
    }
    char buf[65536];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, r, outf) != r) {
            rc = -EIO;
            goto out;
        }
    if (ferror(in) || fflush(outf) != 0 || fsync(fileno(outf)) != 0)
        rc = -EIO;
out:
    if (in)
        fclose(in);
    if (outf && fclose(outf) != 0 && rc == 0)
        rc = -EIO;
    if (rc == 0 && rename(tmp, dst) < 0)
        rc = -errno;
    if (rc < 0 && outf)
        unlink(tmp);
    return rc;
}

/* Writes o to dir/name through name.tmp, fsync and rename, like every
 * other file of the export. */
static int write_json(const char *dir, const char *name, const json_t *o, char *err,
                      size_t errlen)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    if (!text) {
        snprintf(err, errlen, "write %s: out of memory", path);
        return -ENOMEM;
    }
    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = -errno;
    } else {
        size_t n = strlen(text);
        if (fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF || fflush(f) != 0 ||
            fsync(fileno(f)) != 0)
            rc = -EIO;
        if (fclose(f) != 0 && rc == 0)
            rc = -EIO;
        if (rc == 0 && rename(tmp, path) < 0)
            rc = -errno;
        if (rc < 0)
            unlink(tmp);
    }
    free(text);
    if (rc < 0)
        snprintf(err, errlen, "write %s: %s", path, strerror(-rc));
    return rc;
}

/* What transformers.AutoTokenizer reads besides vocab.txt, as
 * BertTokenizer.save_pretrained writes it. Without it AutoTokenizer falls
 * back to BertTokenizer's defaults: do_lower_case true (a cased model would
 * see "GNU" as "gnu") and no model_max_length. strip_accents null follows
 * do_lower_case, which is what loader/wordpiece.c does. */
static int export_tokenizer(const bert_model *m, const char *dir, bool lowercase, char *err,
                            size_t errlen)
{
    json_t *special = json_pack("{s:s, s:s, s:s, s:s, s:s}", "unk_token", "[UNK]", "sep_token",
                                "[SEP]", "pad_token", "[PAD]", "cls_token", "[CLS]", "mask_token",
                                "[MASK]");
    json_t *tc = json_pack("{s:s, s:b, s:b, s:n, s:b, s:n, s:I, s:b, s:s, s:s, s:s, s:s, s:s}",
                           "tokenizer_class", "BertTokenizer", "do_lower_case", lowercase,
                           "do_basic_tokenize", 1, "never_split", "tokenize_chinese_chars", 1,
                           "strip_accents", "model_max_length",
                           (json_int_t)m->cfg.max_position_embeddings,
                           "clean_up_tokenization_spaces", 1, "unk_token", "[UNK]", "sep_token",
                           "[SEP]", "pad_token", "[PAD]", "cls_token", "[CLS]", "mask_token",
                           "[MASK]");
    int rc = -ENOMEM;
    if (!special || !tc) {
        snprintf(err, errlen, "tokenizer files: out of memory");
        goto out;
    }
    if ((rc = write_json(dir, "tokenizer_config.json", tc, err, errlen)) < 0)
        goto out;
    rc = write_json(dir, "special_tokens_map.json", special, err, errlen);
out:
    json_decref(special);
    json_decref(tc);
    return rc;
}

int hf_export(const bert_model *m, const char *dir, const char *vocab_path, bool lowercase,
              char *err, size_t errlen)
{
    int rc = 0;
    char path[4096];
    st_entry *ents = NULL;
    hf_tensor *tab = NULL;
    json_t *cfg = NULL, *meta = NULL;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        rc = -errno;
        snprintf(err, errlen, "mkdir %s: %s", dir, strerror(errno));
        return rc;
    }
    int n = hf_tensor_table(m, NULL, 0);
    tab = calloc((size_t)n, sizeof *tab);
    ents = calloc((size_t)n, sizeof *ents);
    if (!tab || !ents) {
        rc = -ENOMEM;
        goto out;
    }
    hf_tensor_table(m, tab, n);
    for (int i = 0; i < n; i++) {
        ents[i].name = tab[i].name;
        ents[i].ndim = tab[i].ndim;
        ents[i].shape[0] = tab[i].shape[0];
        ents[i].shape[1] = tab[i].shape[1];
        ents[i].data = m->params_memory + tab[i].offset;
    }
    meta = json_pack("{s:s}", "format", "pt");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = st_write(path, ents, n, meta);
    if (rc < 0) {
        snprintf(err, errlen, "write %s: %s", path, strerror(-rc));
        goto out;
    }
    cfg = bert_config_to_json(&m->cfg);
    if ((rc = write_json(dir, "config.json", cfg, err, errlen)) < 0)
        goto out;
    if (vocab_path) {
        snprintf(path, sizeof path, "%s/vocab.txt", dir);
        rc = copy_file(vocab_path, path);
        if (rc < 0) {
            snprintf(err, errlen, "copy %s -> %s: %s", vocab_path, path, strerror(-rc));
            goto out;
        }
        if ((rc = export_tokenizer(m, dir, lowercase, err, errlen)) < 0)
            goto out;
    }
    rc = st_fsync_dir(dir);
out:
    json_decref(cfg);
    json_decref(meta);
    free(tab);
    free(ents);
    return rc;
}
