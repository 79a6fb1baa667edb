/* test_hf_init — init_from over the HF directories users download
 * (tests/integration/hf_init_dirs.py makes them with transformers'
 * save_pretrained; the test skips, exit 77, without torch/transformers):
 *   - pytorch_model.bin (torch's zip, read by worker/ptbin.c), sharded
 *     safetensors, sharded pytorch_model.bin and a BertForMaskedLM config carrying NSP weights give
 *     bit for bit the parameters model.safetensors gives;
 *   - the job's nsp decides: 0 drops a checkpoint's pooler/NSP head, 1 keeps
 *     them; 1 from a BertForMaskedLM adds them as transformers initialises
 *     them (weights N(0, 0.02), biases 0); a BertModel gets its MLM head
 *     initialised (dense N(0, 0.02), LayerNorm 1/0, biases 0), and every
 *     tensor the checkpoint has is taken as it is (compared with
 *     safetensors' own reader, st_open);
 *   - the same rule for a bertd checkpoint as init_from;
 *   - a TensorFlow-only or Flax-only directory is refused naming the
 *     conversion, and a
 *     pytorch_model.bin whose pickle calls os.system is refused naming the
 *     file, without quoting it. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "worker/checkpoint.h"
#include "worker/hf.h"

static char g_dir[256];

static bert_model *load(const char *sub, int nsp)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    bert_model *m = NULL;
    if (hf_init_from(&m, path, nsp, 7, err, sizeof err) < 0)
        fail_msg("hf_init_from(%s, nsp %d): %s", sub, nsp, err);
    assert_int_equal(m->cfg.nsp, nsp);
    return m;
}

static void assert_same(const bert_model *a, const bert_model *b)
{
    assert_int_equal(a->num_params, b->num_params);
    assert_memory_equal(a->params_memory, b->params_memory, a->num_params * sizeof(float));
}

static void test_formats_agree(void **state)
{
    (void)state;
    for (int nsp = 0; nsp <= 1; nsp++) {
        bert_model *ref = load("pt_st", nsp);
        static const char *const others[] = {"pt_bin", "sharded", "sharded_bin", "mlmnsp_st",
                                             "mlmnsp_bin"};
        for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
            bert_model *m = load(others[i], nsp);
            assert_same(ref, m);
            bert_model_destroy(m);
        }
        bert_model_destroy(ref);
    }
    /* nsp 0 is nsp 1 without the tail: the same encoder and MLM head */
    bert_model *with = load("pt_bin", 1), *without = load("pt_bin", 0);
    assert_memory_equal(with->params_memory, without->params_memory,
                        without->num_params * sizeof(float));
    assert_true(with->num_params > without->num_params);
    bert_model_destroy(with);
    bert_model_destroy(without);
}

/* Every tensor of m named in hf_tensor_table that file has equals it. */
static int compare_with_file(const bert_model *m, const char *sub, const char *file)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, file);
    st_file *f = NULL;
    if (st_open(&f, path, err, sizeof err) < 0)
        fail_msg("%s", err);
    int n = hf_tensor_table(m, NULL, 0), found = 0;
    hf_tensor *tab = calloc((size_t)n, sizeof *tab);
    hf_tensor_table(m, tab, n);
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_find(f, tab[i].name);
        if (!t && strncmp(tab[i].name, "bert.", 5) == 0)
            t = st_find(f, tab[i].name + 5);
        if (!t)
            continue;
        float *buf = malloc(tab[i].numel * sizeof *buf);
        assert_int_equal(st_read_f32(f, t, buf, tab[i].numel), 0);
        assert_memory_equal(buf, m->params_memory + tab[i].offset, tab[i].numel * sizeof *buf);
        free(buf);
        found++;
    }
    free(tab);
    st_close(f);
    return found;
}

static void stats(const float *p, size_t n, double *mean, double *sd, double *maxabs)
{
    double s = 0, s2 = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        s += p[i];
        s2 += (double)p[i] * p[i];
        mx = fmax(mx, fabs(p[i]));
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
    *maxabs = mx;
}

static void assert_normal(const float *p, size_t n, double std)
{
    double mean, sd, mx;
    stats(p, n, &mean, &sd, &mx);
    print_message("  N(0, %.3g)? %zu values: mean %.2g sd %.4g\n", std, n, mean, sd);
    assert_true(fabs(mean) < 4 * std / sqrt((double)n));
    assert_true(fabs(sd - std) < 0.1 * std);
}

static void assert_const(const float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        assert_true(p[i] == v);
}

static void test_nsp_head_added(void **state)
{
    (void)state;
    bert_model *m = load("mlm_st", 1);
    const bert_config *c = &m->cfg;
    size_t C = (size_t)c->hidden_size;
    /* everything but the pooler and the NSP head is the checkpoint's */
    int n_nsp = hf_tensor_table(m, NULL, 0);
    assert_int_equal(compare_with_file(m, "mlm_st", "model.safetensors"), n_nsp - 4);
    assert_normal(m->params.pool_w, C * C, c->initializer_range);
    assert_const(m->params.pool_b, C, 0.0f);
    assert_normal(m->params.nsp_w, 2 * C, c->initializer_range);
    assert_const(m->params.nsp_b, 2, 0.0f);
    bert_model_destroy(m);
}

static void test_mlm_head_added(void **state)
{
    (void)state;
    bert_model *m = load("bare_st", 0);
    const bert_config *c = &m->cfg;
    size_t C = (size_t)c->hidden_size;
    int n = hf_tensor_table(m, NULL, 0);
    /* BertModel names have no "bert." prefix; all but the 5 MLM head tensors */
    assert_int_equal(compare_with_file(m, "bare_st", "model.safetensors"), n - 5);
    assert_normal(m->params.head_w, C * C, c->initializer_range);
    assert_const(m->params.head_b, C, 0.0f);
    assert_const(m->params.head_lnw, C, 1.0f);
    assert_const(m->params.head_lnb, C, 0.0f);
    assert_const(m->params.dec_b, (size_t)c->vocab_size, 0.0f);
    bert_model_destroy(m);
    /* with nsp the BertModel's own pooler is kept, the NSP head is new */
    m = load("bare_st", 1);
    n = hf_tensor_table(m, NULL, 0);
    assert_int_equal(compare_with_file(m, "bare_st", "model.safetensors"), n - 7);
    assert_normal(m->params.nsp_w, 2 * C, m->cfg.initializer_range);
    bert_model_destroy(m);
}

/* A bertd checkpoint as init_from: the job's nsp decides there too. */
static void test_checkpoint_nsp(void **state)
{
    (void)state;
    char root[512], ckpt[600], err[512];
    bert_model *with = load("pt_st", 1), *without = load("pt_st", 0);
    for (int saved = 0; saved <= 1; saved++) {
        snprintf(root, sizeof root, "%s/ckpts-%d", g_dir, saved);
        assert_int_equal(checkpoint_save(root, 5, saved ? with : without, NULL, NULL, 0, err,
                                         sizeof err), 0);
        snprintf(ckpt, sizeof ckpt, "%s/ckpt-5", root);
        for (int nsp = 0; nsp <= 1; nsp++) {
            bert_model *m = NULL;
            if (hf_init_from(&m, ckpt, nsp, 7, err, sizeof err) < 0)
                fail_msg("checkpoint saved with nsp %d, nsp %d: %s", saved, nsp, err);
            assert_int_equal(m->cfg.nsp, nsp);
            if (nsp <= saved) { /* kept or dropped: the checkpoint's */
                assert_same(nsp ? with : without, m);
            } else { /* added: the rest is the checkpoint's, the head new */
                assert_memory_equal(m->params_memory, without->params_memory,
                                    without->num_params * sizeof(float));
                assert_normal(m->params.nsp_w, 2 * (size_t)m->cfg.hidden_size,
                              m->cfg.initializer_range);
                assert_const(m->params.pool_b, (size_t)m->cfg.hidden_size, 0.0f);
            }
            bert_model_destroy(m);
        }
    }
    bert_model_destroy(with);
    bert_model_destroy(without);
}

static void refuse(const char *sub, const char *must, const char *must_not)
{
    char path[512], err[1024] = "";
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    bert_model *m = NULL;
    assert_int_equal(hf_init_from(&m, path, 0, 7, err, sizeof err), -EINVAL);
    assert_null(m);
    print_message("  %s: %s\n", sub, err);
    if (!strstr(err, must))
        fail_msg("'%s' does not say '%s'", err, must);
    if (must_not && strstr(err, must_not))
        fail_msg("'%s' quotes the file ('%s')", err, must_not);
}

static void test_refusals(void **state)
{
    (void)state;
    refuse("tf_only", "from_tf=True", NULL);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/flax_only' && cp '%s/tf_only/config.json' '%s/flax_only/' && "
             ": > '%s/flax_only/flax_model.msgpack'", g_dir, g_dir, g_dir, g_dir);
    assert_int_equal(system(cmd), 0);
    refuse("flax_only", "from_flax=True", NULL);
    refuse("evil_bin", "pytorch_model.bin: data.pkl imports a global", "system");
    char path[512];
    snprintf(path, sizeof path, "%s/tf_only", g_dir);
    assert_non_null(strstr(hf_init_from_missing(path), "from_tf=True"));
    snprintf(path, sizeof path, "%s/pt_bin", g_dir);
    assert_null(hf_init_from_missing(path));
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/bertd-hfinit-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    const char *src = getenv("BERTD_SOURCE_ROOT");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s/tests/integration/hf_init_dirs.py' '%s' "
             "'%s/tests/data/bert-base-uncased-vocab.txt' >/dev/null",
             src ? src : ".", g_dir, src ? src : ".");
    int rc = system(cmd);
    return WIFEXITED(rc) && WEXITSTATUS(rc) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import torch, transformers' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skip: /usr/bin/python3 with torch and transformers needed\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_agree),
        cmocka_unit_test(test_nsp_head_added),
        cmocka_unit_test(test_mlm_head_added),
        cmocka_unit_test(test_checkpoint_nsp),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
