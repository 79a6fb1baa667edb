/* checkpoint — see checkpoint.h. */
#include "worker/checkpoint.h"
#include "worker/best.h"
#include "worker/fence.h"
#include "worker/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_file_durable(const char *dir, const char *name, const char *text)
{
    char tmp[4200], path[4200];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    size_t len = strlen(text), off = 0;
    int rc = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        off += (size_t)w;
    }
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0)
        unlink(tmp);
    else
        rc = st_fsync_dir(dir);
    return rc;
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path); // checkpoints hold plain files only
    }
    closedir(d);
    rmdir(dir);
}

/* Parses "ckpt-<digits>" exactly; -1 otherwise. */
static long parse_ckpt_name(const char *name)
{
    if (strncmp(name, "ckpt-", 5) != 0 || !name[5])
        return -1;
    char *end;
    errno = 0;
    long v = strtol(name + 5, &end, 10);
    if (*end || errno || v < 0 || name[5] < '0' || name[5] > '9')
        return -1;
    return v;
}

static int is_complete(const char *root, const char *name)
{
    char path[4400];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/DONE", root, name);
    return stat(path, &st) == 0;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static void prune(const char *root, int keep_last, long protect)
{
    DIR *d = opendir(root);
    if (!d)
        return;
    long *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "ckpt-", 5) == 0 && len > 4 &&
            strcmp(e->d_name + len - 4, ".tmp") == 0) {
            /* a save that crashed part-way: one writer per job, so any .tmp
             * left when a save has just succeeded is stale */
            snprintf(path, sizeof path, "%s/%s", root, e->d_name);
            remove_tree(path);
            continue;
        }
        long s = parse_ckpt_name(e->d_name);
        if (s < 0 || !is_complete(root, e->d_name))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *ns = realloc(steps, cap * sizeof *ns);
            if (!ns)
                break;
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    bool *keep = n ? calloc(n, sizeof *keep) : NULL;
    if (n && keep) {
        qsort(steps, n, sizeof *steps, cmp_long);
        best_retention(steps, n, keep_last, protect, keep);
        for (size_t i = 0; i < n; i++) {
            if (keep[i])
                continue;
            snprintf(path, sizeof path, "%s/ckpt-%ld", root, steps[i]);
            remove_tree(path);
        }
    }
    free(keep);
    free(steps);
    st_fsync_dir(root);
}

static json_t *optim_json(const optim *o)
{
    static const char *kinds[] = {"adamw", "lamb"};
    const optim_config *c = &o->cfg;
    return json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:I, s:I, s:I}", "optim",
                     kinds[c->kind], "learning_rate", (double)c->lr, "adam_beta1",
                     (double)c->beta1, "adam_beta2", (double)c->beta2, "adam_epsilon",
                     (double)c->eps, "weight_decay", (double)c->weight_decay, "max_grad_norm",
                     (double)c->max_grad_norm, "lr_scheduler_type", sched_kind_name(c->sched),
                     "warmup_steps", (json_int_t)c->warmup_steps, "max_steps",
                     (json_int_t)c->total_steps, "updates", (json_int_t)o->t);
}

checkpoint_scaler checkpoint_scaler_disabled(void)
{
    return (checkpoint_scaler){.scale = 1.0f, .enabled = 0, .growth_interval = 2000};
}

static json_t *scaler_json(const checkpoint_scaler *ls)
{
    return json_pack("{s:b, s:f, s:i, s:i, s:I}", "enabled", ls->enabled, "scale",
                     (double)ls->scale, "growth_interval", ls->growth_interval, "good_steps",
                     ls->good_steps, "skipped", (json_int_t)ls->skipped);
}

int checkpoint_save(const char *root, long step, const bert_model *m, const optim *o,
                    const json_t *extra, int keep_last, char *err, size_t errlen)
{
    return checkpoint_save_scaled(root, step, m, o, NULL, extra, keep_last, err, errlen);
}

int checkpoint_save_scaled(const char *root, long step, const bert_model *m, const optim *o,
                           const checkpoint_scaler *ls, const json_t *extra, int keep_last,
                           char *err, size_t errlen)
{
    char tmpdir[4200], final[4200], path[4300];
    json_t *state = NULL;
    char *text = NULL;
    int rc;
    checkpoint_scaler off = checkpoint_scaler_disabled();
    if (!ls)
        ls = &off;
    /* JSON has no inf/NaN, and a reader refuses a scale of 0: say so now
     * rather than write a checkpoint nobody can resume from */
    if (!isfinite(ls->scale) || ls->scale <= 0.0f) {
        snprintf(err, errlen, "loss scale %g cannot be saved (must be finite and > 0)",
                 (double)ls->scale);
        return -EINVAL;
    }
    if (mkdir(root, 0755) < 0 && errno != EEXIST) {
        rc = -errno;
        snprintf(err, errlen, "mkdir %s: %s", root, strerror(errno));
        return rc;
    }
    snprintf(tmpdir, sizeof tmpdir, "%s/ckpt-%ld.tmp", root, step);
    snprintf(final, sizeof final, "%s/ckpt-%ld", root, step);
    remove_tree(tmpdir); // leftover of a crashed save of the same step
    if (mkdir(tmpdir, 0755) < 0) {
        rc = -errno;
        snprintf(err, errlen, "mkdir %s: %s", tmpdir, strerror(errno));
        return rc;
    }
    st_entry pe = {.name = "params", .ndim = 1, .shape = {(int64_t)m->num_params},
                   .data = m->params_memory};
    snprintf(path, sizeof path, "%s/params.safetensors", tmpdir);
    if ((rc = st_write(path, &pe, 1, NULL)) < 0) {
        snprintf(err, errlen, "write %s: %s", path, strerror(-rc));
        goto out;
    }
    if (o) {
        st_entry oe[2] = {
            {.name = "exp_avg", .ndim = 1, .shape = {(int64_t)o->num_params}, .data = o->m},
            {.name = "exp_avg_sq", .ndim = 1, .shape = {(int64_t)o->num_params}, .data = o->v}};
        snprintf(path, sizeof path, "%s/optim.safetensors", tmpdir);
        if ((rc = st_write(path, oe, 2, NULL)) < 0) {
            snprintf(err, errlen, "write %s: %s", path, strerror(-rc));
            goto out;
        }
    }
    json_t *tensors = json_array();
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
        json_array_append_new(tensors, json_pack("{s:s, s:I}", "name", bert_param_name(i),
                                                 "numel", (json_int_t)m->param_sizes[i]));
    /* "loss_scale" is format 1's original key (always 1.0 then); it stays,
     * equal to loss_scaler.scale, for readers that know only it */
    state = json_pack("{s:s, s:i, s:I, s:I, s:f, s:o, s:o, s:o, s:o}", "format",
                      "bertd-checkpoint", "version", CHECKPOINT_FORMAT_VERSION, "step",
                      (json_int_t)step, "num_params", (json_int_t)m->num_params, "loss_scale",
                      (double)ls->scale, "loss_scaler", scaler_json(ls), "model",
                      bert_config_to_json(&m->cfg), "param_tensors", tensors, "optimizer",
                      o ? optim_json(o) : json_null());
    if (!state) {
        rc = -ENOMEM;
        goto out;
    }
    json_object_set_new(json_object_get(state, "model"), "nsp", json_boolean(m->cfg.nsp));
    if (extra)
        json_object_set(state, "training_args", (json_t *)extra);
    text = json_dumps(state, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text || (rc = write_file_durable(tmpdir, "state.json", text)) < 0) {
        rc = text ? rc : -ENOMEM;
        snprintf(err, errlen, "write %s/state.json: %s", tmpdir, strerror(-rc));
        goto out;
    }
    // a multi-node rank whose attempt is over (its node cut off) puts nothing in place
    if ((rc = fence_check(err, errlen)) < 0)
        goto out;
    remove_tree(final); // an incomplete directory of the same step (no DONE)
    if (rename(tmpdir, final) < 0) {
        rc = -errno;
        snprintf(err, errlen, "rename %s -> %s: %s", tmpdir, final, strerror(errno));
        goto out;
    }
    if ((rc = st_fsync_dir(root)) < 0)
        goto out;
    char done[64];
    snprintf(done, sizeof done, "step %ld\n", step);
    if ((rc = write_file_durable(final, "DONE", done)) < 0) {
        snprintf(err, errlen, "write %s/DONE: %s", final, strerror(-rc));
        goto out;
    }
    if (keep_last > 0)
        prune(root, keep_last, -1);
out:
    if (rc < 0)
        remove_tree(tmpdir);
    free(text);
    json_decref(state);
    return rc;
}

void checkpoint_prune(const char *root, int keep_last, long protect)
{
    if (keep_last > 0)
        prune(root, keep_last, protect);
}

int checkpoint_latest(const char *root, long *step, char *path, size_t pathlen)
{
    DIR *d = opendir(root);
    if (!d)
        return -ENOENT;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = parse_ckpt_name(e->d_name);
        if (s > best && is_complete(root, e->d_name))
            best = s;
    }
    closedir(d);
    if (best < 0)
        return -ENOENT;
    *step = best;
    snprintf(path, pathlen, "%s/ckpt-%ld", root, best);
    return 0;
}

static json_t *load_state(const char *dir, char *err, size_t errlen)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/DONE", dir);
    struct stat st;
    if (stat(path, &st) < 0) {
        snprintf(err, errlen, "%s: checkpoint is incomplete (no DONE marker)", dir);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/state.json", dir);
    json_error_t jerr;
    json_t *s = json_load_file(path, 0, &jerr);
    if (!s) {
        /* jansson's text may quote the file's bytes: say where, not what */
        snprintf(err, errlen, "%s: unreadable or not valid JSON (line %d, column %d)", path,
                 jerr.line, jerr.column);
        return NULL;
    }
    json_t *fmt = json_object_get(s, "format"), *ver = json_object_get(s, "version");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "bertd-checkpoint") != 0 ||
        !json_is_integer(ver) || json_integer_value(ver) != CHECKPOINT_FORMAT_VERSION) {
        snprintf(err, errlen, "%s: not a bertd checkpoint of format version %d", path,
                 CHECKPOINT_FORMAT_VERSION);
        json_decref(s);
        return NULL;
    }
    return s;
}

/* An integer member of o in [lo, hi] into *v; -EINVAL naming it otherwise. */
static int scaler_int(const json_t *o, const char *key, long long lo, long long hi, long long *v,
                      const char *dir, char *err, size_t errlen)
{
    json_t *j = json_object_get(o, key);
    if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi) {
        snprintf(err, errlen, "%s: state.json loss_scaler.%s must be an integer in [%lld, %lld]",
                 dir, key, lo, hi);
        return -EINVAL;
    }
    *v = json_integer_value(j);
    return 0;
}

/* state.json's loss scaler: 0 and *out, 1 when absent (format 1 as first
 * written, whose "loss_scale" was always 1 and is not read), -EINVAL. */
static int parse_scaler(const json_t *state, const char *dir, checkpoint_scaler *out, char *err,
                        size_t errlen)
{
    *out = checkpoint_scaler_disabled();
    json_t *o = json_object_get(state, "loss_scaler");
    if (!o)
        return 1;
    if (!json_is_object(o)) {
        snprintf(err, errlen, "%s: state.json loss_scaler must be an object", dir);
        return -EINVAL;
    }
    json_t *en = json_object_get(o, "enabled"), *sc = json_object_get(o, "scale");
    if (!json_is_boolean(en)) {
        snprintf(err, errlen, "%s: state.json loss_scaler.enabled must be true or false", dir);
        return -EINVAL;
    }
    double scale = json_is_number(sc) ? json_number_value(sc) : NAN;
    if (!(scale > 0.0 && scale <= FLT_MAX) || (!json_is_true(en) && scale != 1.0)) {
        snprintf(err, errlen,
                 "%s: state.json loss_scaler.scale must be a number in (0, %g] (1 when disabled)",
                 dir, (double)FLT_MAX);
        return -EINVAL;
    }
    long long gi, good, skipped;
    int rc;
    if ((rc = scaler_int(o, "growth_interval", 1, INT_MAX, &gi, dir, err, errlen)) < 0 ||
        (rc = scaler_int(o, "good_steps", 0, gi - 1, &good, dir, err, errlen)) < 0 ||
        (rc = scaler_int(o, "skipped", 0, LONG_MAX, &skipped, dir, err, errlen)) < 0)
        return rc;
    json_t *legacy = json_object_get(state, "loss_scale");
    if (legacy && (!json_is_number(legacy) || json_number_value(legacy) != scale)) {
        snprintf(err, errlen, "%s: state.json loss_scale disagrees with loss_scaler.scale %g", dir,
                 scale);
        return -EINVAL;
    }
    *out = (checkpoint_scaler){.scale = (float)scale, .enabled = json_is_true(en),
                               .growth_interval = (int)gi, .good_steps = (int)good,
                               .skipped = (long)skipped};
    return 0;
}

int checkpoint_read_scaler(const char *dir, checkpoint_scaler *out, char *err, size_t errlen)
{
    *out = checkpoint_scaler_disabled();
    json_t *s = load_state(dir, err, errlen);
    if (!s)
        return -EINVAL;
    int rc = parse_scaler(s, dir, out, err, errlen);
    json_decref(s);
    return rc;
}

json_t *checkpoint_read_training_args(const char *dir)
{
    char err[512];
    json_t *s = load_state(dir, err, sizeof err);
    json_t *ta = json_object_get(s, "training_args");
    if (ta)
        json_incref(ta);
    json_decref(s);
    return ta;
}

int checkpoint_read_config(const char *dir, bert_config *cfg, char *err, size_t errlen)
{
    json_t *s = load_state(dir, err, errlen);
    if (!s)
        return -EINVAL;
    json_t *mc = json_object_get(s, "model");
    bert_config_preset(cfg, NULL);
    int rc = bert_config_apply_json(cfg, mc, err, errlen);
    cfg->nsp = json_is_true(json_object_get(mc, "nsp"));
    if (rc == 0)
        rc = bert_config_validate(cfg, err, errlen);
    json_decref(s);
    return rc;
}

static int load_span(const char *path, const char *name, float *dst, size_t n, char *err,
                     size_t errlen)
{
    st_file *f = NULL;
    int rc = st_open(&f, path, err, errlen);
    if (rc < 0)
        return rc;
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != ST_F32 || st_numel(t) != n) {
        snprintf(err, errlen, "%s: tensor '%s' missing or not F32 of %zu elements", path, name,
                 n);
        rc = -EINVAL;
    } else {
        rc = st_read_f32(f, t, dst, n);
    }
    st_close(f);
    return rc;
}

int checkpoint_load(const char *dir, bert_model *m, optim *o, long *step, char *err,
                    size_t errlen)
{
    json_t *s = load_state(dir, err, errlen);
    if (!s)
        return -EINVAL;
    int rc = -EINVAL;
    char path[4300];
    checkpoint_scaler ls;
    if (parse_scaler(s, dir, &ls, err, errlen) < 0)
        goto out; // rc is -EINVAL: refuse a damaged state.json before loading anything
    json_t *np = json_object_get(s, "num_params"), *st = json_object_get(s, "step");
    if (!json_is_integer(np) || (size_t)json_integer_value(np) != m->num_params ||
        !json_is_integer(st)) {
        snprintf(err, errlen, "%s: checkpoint has %lld parameters, the model %zu", dir,
                 json_is_integer(np) ? (long long)json_integer_value(np) : -1LL, m->num_params);
        goto out;
    }
    snprintf(path, sizeof path, "%s/params.safetensors", dir);
    if ((rc = load_span(path, "params", m->params_memory, m->num_params, err, errlen)) < 0)
        goto out;
    if (o) {
        json_t *oj = json_object_get(s, "optimizer"), *upd = json_object_get(oj, "updates");
        if (!json_is_integer(upd) || o->num_params != m->num_params) {
            snprintf(err, errlen, "%s: no optimizer state to resume from", dir);
            rc = -EINVAL;
            goto out;
        }
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        if ((rc = load_span(path, "exp_avg", o->m, o->num_params, err, errlen)) < 0 ||
            (rc = load_span(path, "exp_avg_sq", o->v, o->num_params, err, errlen)) < 0)
            goto out;
        o->t = (long)json_integer_value(upd);
    }
    if (step)
        *step = (long)json_integer_value(st);
    rc = 0;
out:
    json_decref(s);
    return rc;
}
