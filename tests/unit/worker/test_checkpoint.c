/* test_checkpoint — the fp16 loss scaler in checkpoints (worker/checkpoint.c):
 *  - round trip: checkpoint_save_scaled then checkpoint_read_scaler gives the
 *    same state bit for bit (a non-power-of-two scale included), and
 *    state.json, read here with jansson, carries it where docs/formats.md
 *    says (loss_scaler object, loss_scale mirror);
 *  - the CPU writer (checkpoint_save) saves a disabled scaler, scale 1;
 *  - a checkpoint without "loss_scaler" (format 1 as first written, whose
 *    loss_scale was always 1.0) still loads, and reads back as "absent" (1)
 *    with the disabled defaults;
 *  - every malformed value is -EINVAL from both checkpoint_read_scaler and
 *    checkpoint_load, with a message naming the key, never a crash;
 *  - a scale that cannot be saved (inf, NaN, 0) is refused before anything
 *    is written;
 *  - init_from a checkpoint (worker/hf.c hf_init_from): the model comes back
 *    with the saved config and bit-identical parameters; an incomplete
 *    checkpoint, a directory with no model and unparsable JSON are -EINVAL
 *    with a message naming the path and what is missing, never quoting the
 *    file's bytes;
 *  - the attempt fence (worker/fence.c): a multi-node rank whose attempt the
 *    fence file no longer names ("over", another attempt, no file) puts no
 *    checkpoint in place (-ESTALE / -EIO, the directory is left as it was);
 *    the attempt it names, or no fence at all, writes as before.
 */
#include "worker/checkpoint.h"
#include "worker/fence.h"
#include "worker/hf.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

typedef struct fixture {
    char dir[64];
    bert_model *m;
    optim *o;
    size_t *segs;
    int *decays;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/bertd-ckpt-scaler-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    bert_config c;
    bert_config_preset(&c, "bert-tiny");
    c.vocab_size = 64;
    c.hidden_size = 16;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.intermediate_size = 32;
    c.max_position_embeddings = 16;
    assert_int_equal(bert_model_create(&f->m, &c), 0);
    bert_model_init_weights(f->m, 11);
    int nseg = bert_param_segments(&c, NULL, NULL, 0);
    f->segs = calloc((size_t)nseg, sizeof *f->segs);
    f->decays = calloc((size_t)nseg, sizeof *f->decays);
    assert_non_null(f->segs);
    assert_non_null(f->decays);
    bert_param_segments(&c, f->segs, f->decays, nseg);
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    assert_int_equal(optim_create(&f->o, &oc, f->segs, f->decays, nseg), 0);
    f->o->t = 5;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    optim_destroy(f->o);
    bert_model_destroy(f->m);
    free(f->segs);
    free(f->decays);
    free(f);
    return rc == 0 ? 0 : -1;
}

static json_t *read_state(const fixture *f, long step)
{
    char path[256];
    snprintf(path, sizeof path, "%s/ckpt-%ld/state.json", f->dir, step);
    json_error_t jerr;
    json_t *s = json_load_file(path, 0, &jerr);
    if (!s)
        fail_msg("%s: %s", path, jerr.text);
    return s;
}

static void write_state(const fixture *f, long step, json_t *s)
{
    char path[256];
    snprintf(path, sizeof path, "%s/ckpt-%ld/state.json", f->dir, step);
    assert_int_equal(json_dump_file(s, path, JSON_INDENT(2)), 0);
}

static void ckpt_path(const fixture *f, long step, char *out, size_t n)
{
    snprintf(out, n, "%s/ckpt-%ld", f->dir, step);
}

static void test_round_trip(void **state)
{
    fixture *f = *state;
    char err[256], path[256];
    /* 3.3f is not a power of two: its float bits must survive JSON */
    const float scales[] = {8192.0f, 3.3f, 0x1p-20f};
    for (int i = 0; i < 3; i++) {
        long step = 10 + i;
        checkpoint_scaler in = {.scale = scales[i], .enabled = 1, .growth_interval = 2000,
                                .good_steps = 17 + i, .skipped = 3L + 1000000000000L * i};
        assert_int_equal(checkpoint_save_scaled(f->dir, step, f->m, f->o, &in, NULL, 0, err,
                                                sizeof err), 0);
        ckpt_path(f, step, path, sizeof path);
        checkpoint_scaler out;
        memset(&out, 0xA5, sizeof out);
        assert_int_equal(checkpoint_read_scaler(path, &out, err, sizeof err), 0);
        assert_memory_equal(&out.scale, &in.scale, sizeof in.scale);
        assert_int_equal(out.enabled, 1);
        assert_int_equal(out.growth_interval, 2000);
        assert_int_equal(out.good_steps, in.good_steps);
        assert_int_equal(out.skipped, in.skipped);

        /* the file itself, as docs/formats.md describes it */
        json_t *s = read_state(f, step), *ls = json_object_get(s, "loss_scaler");
        assert_true(json_is_object(ls));
        assert_true(json_is_true(json_object_get(ls, "enabled")));
        assert_true(json_number_value(json_object_get(ls, "scale")) == (double)scales[i]);
        assert_true(json_number_value(json_object_get(s, "loss_scale")) == (double)scales[i]);
        assert_int_equal(json_integer_value(json_object_get(ls, "good_steps")), 17 + i);
        assert_int_equal(json_integer_value(json_object_get(ls, "skipped")), in.skipped);
        assert_int_equal(json_integer_value(json_object_get(s, "version")), 1);
        json_decref(s);

        /* and the rest of the checkpoint still loads */
        long got_step = -1;
        assert_int_equal(checkpoint_load(path, f->m, f->o, &got_step, err, sizeof err), 0);
        assert_int_equal(got_step, step);
    }
}

/* hidden_act is part of the model a checkpoint records: each name comes
 * back as it was saved (state.json's model.hidden_act) */
static void test_hidden_act_round_trip(void **state)
{
    fixture *f = *state;
    char err[256], path[256];
    for (int act = BERT_ACT_GELU; act <= BERT_ACT_GELU_PYTORCH_TANH; act++) {
        f->m->cfg.act = act;
        long step = 20 + act;
        assert_int_equal(checkpoint_save(f->dir, step, f->m, f->o, NULL, 0, err, sizeof err), 0);
        json_t *s = read_state(f, step);
        assert_string_equal(json_string_value(json_object_get(json_object_get(s, "model"),
                                                              "hidden_act")),
                            bert_act_name(act));
        json_decref(s);
        ckpt_path(f, step, path, sizeof path);
        bert_config c;
        assert_int_equal(checkpoint_read_config(path, &c, err, sizeof err), 0);
        assert_int_equal(c.act, act);
    }
    f->m->cfg.act = BERT_ACT_GELU;
}

static void test_cpu_writes_disabled(void **state)
{
    fixture *f = *state;
    char err[256], path[256];
    assert_int_equal(checkpoint_save(f->dir, 20, f->m, f->o, NULL, 0, err, sizeof err), 0);
    ckpt_path(f, 20, path, sizeof path);
    checkpoint_scaler out;
    assert_int_equal(checkpoint_read_scaler(path, &out, err, sizeof err), 0);
    assert_int_equal(out.enabled, 0);
    assert_true(out.scale == 1.0f);
    assert_int_equal(out.good_steps, 0);
    assert_int_equal(out.skipped, 0);
    json_t *s = read_state(f, 20);
    assert_true(json_is_false(json_object_get(json_object_get(s, "loss_scaler"), "enabled")));
    assert_true(json_number_value(json_object_get(s, "loss_scale")) == 1.0);
    json_decref(s);
}

static void test_old_format_loads_with_defaults(void **state)
{
    fixture *f = *state;
    char err[256], path[256];
    checkpoint_scaler in = {.scale = 512.0f, .enabled = 1, .growth_interval = 2000,
                            .good_steps = 4, .skipped = 2};
    assert_int_equal(checkpoint_save_scaled(f->dir, 30, f->m, f->o, &in, NULL, 0, err,
                                            sizeof err), 0);
    /* what the first format-1 writer produced: no loss_scaler, loss_scale 1.0 */
    json_t *s = read_state(f, 30);
    assert_int_equal(json_object_del(s, "loss_scaler"), 0);
    json_object_set_new(s, "loss_scale", json_real(1.0));
    write_state(f, 30, s);
    json_decref(s);
    ckpt_path(f, 30, path, sizeof path);
    checkpoint_scaler out;
    memset(&out, 0xA5, sizeof out);
    assert_int_equal(checkpoint_read_scaler(path, &out, err, sizeof err), 1);
    assert_int_equal(out.enabled, 0);
    assert_true(out.scale == 1.0f);
    assert_int_equal(out.growth_interval, 2000);
    assert_int_equal(out.good_steps, 0);
    assert_int_equal(out.skipped, 0);
    long step = -1;
    assert_int_equal(checkpoint_load(path, f->m, f->o, &step, err, sizeof err), 0);
    assert_int_equal(step, 30);
}

/* One malformed variant: key in loss_scaler (NULL: the top level) set to v
 * (NULL: deleted); want names what the message must mention. */
typedef struct bad_case {
    const char *key;
    const char *json; // the new value as JSON text; NULL deletes the key
    const char *want;
} bad_case;

static void write_fence(const fixture *f, const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/attempt", f->dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void test_fence_refuses_an_attempt_that_is_over(void **state)
{
    fixture *f = *state;
    char err[256], path[256], fence[128];
    snprintf(fence, sizeof fence, "%s/attempt", f->dir);
    setenv("BERTD_FENCE", fence, 1);
    setenv("BERTD_ATTEMPT", "bertd-job-1-aaaa", 1);
    write_fence(f, "bertd-job-1-aaaa\n"); /* this attempt's: written */
    assert_int_equal(checkpoint_save(f->dir, 10, f->m, f->o, NULL, 0, err, sizeof err), 0);
    write_fence(f, "bertd-job-1-bbbb\n"); /* the next attempt's */
    assert_int_equal(checkpoint_save(f->dir, 20, f->m, f->o, NULL, 0, err, sizeof err), -ESTALE);
    assert_non_null(strstr(err, "attempt bertd-job-1-aaaa is over"));
    assert_non_null(strstr(err, "bertd-job-1-bbbb"));
    write_fence(f, "over\n"); /* the job between attempts */
    assert_int_equal(checkpoint_save(f->dir, 30, f->m, f->o, NULL, 0, err, sizeof err), -ESTALE);
    unlink(fence); /* the shared directory unreadable: not writing is the safe side */
    assert_int_equal(fence_check(err, sizeof err), -EIO);
    assert_int_equal(checkpoint_save(f->dir, 40, f->m, f->o, NULL, 0, err, sizeof err), -EIO);
    long step = -1;
    assert_int_equal(checkpoint_latest(f->dir, &step, path, sizeof path), 0);
    assert_int_equal(step, 10);
    for (long s = 20; s <= 40; s += 10) {
        ckpt_path(f, s, path, sizeof path);
        assert_int_equal(access(path, F_OK), -1);
    }
    unsetenv("BERTD_ATTEMPT"); /* a single-node worker: never fenced */
    assert_int_equal(checkpoint_save(f->dir, 50, f->m, f->o, NULL, 0, err, sizeof err), 0);
    unsetenv("BERTD_FENCE");
}

static void test_malformed_is_a_clear_error(void **state)
{
    fixture *f = *state;
    char err[256], path[256];
    const bad_case cases[] = {
        {"scale", "\"big\"", "loss_scaler.scale"},
        {"scale", "0", "loss_scaler.scale"},
        {"scale", "-2.0", "loss_scaler.scale"},
        {"scale", "1e39", "loss_scaler.scale"}, // beyond a float
        {"scale", "null", "loss_scaler.scale"},
        {"scale", NULL, "loss_scaler.scale"},
        {"enabled", "\"yes\"", "loss_scaler.enabled"},
        {"enabled", NULL, "loss_scaler.enabled"},
        {"growth_interval", "0", "loss_scaler.growth_interval"},
        {"growth_interval", "2.5", "loss_scaler.growth_interval"},
        {"growth_interval", "4294967296", "loss_scaler.growth_interval"},
        {"good_steps", "2000", "loss_scaler.good_steps"}, // == growth_interval
        {"good_steps", "-1", "loss_scaler.good_steps"},
        {"skipped", "-1", "loss_scaler.skipped"},
        {"skipped", "\"3\"", "loss_scaler.skipped"},
        {NULL, "[1, 2]", "loss_scaler must be an object"},
        {NULL, "true", "loss_scaler must be an object"},
    };
    checkpoint_scaler in = {.scale = 1024.0f, .enabled = 1, .growth_interval = 2000,
                            .good_steps = 9, .skipped = 1};
    assert_int_equal(checkpoint_save_scaled(f->dir, 40, f->m, f->o, &in, NULL, 0, err,
                                            sizeof err), 0);
    json_t *orig = read_state(f, 40);
    ckpt_path(f, 40, path, sizeof path);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        json_t *s = json_deep_copy(orig);
        json_t *v = c->json ? json_loads(c->json, JSON_DECODE_ANY, NULL) : NULL;
        if (c->json)
            assert_non_null(v);
        if (c->key) {
            json_t *ls = json_object_get(s, "loss_scaler");
            if (v)
                json_object_set_new(ls, c->key, v);
            else
                json_object_del(ls, c->key);
        } else {
            json_object_set_new(s, "loss_scaler", v);
        }
        write_state(f, 40, s);
        json_decref(s);
        checkpoint_scaler out;
        err[0] = '\0';
        assert_int_equal(checkpoint_read_scaler(path, &out, err, sizeof err), -EINVAL);
        if (!strstr(err, c->want))
            fail_msg("case %zu (%s = %s): message \"%s\" does not name %s", i,
                     c->key ? c->key : "loss_scaler", c->json ? c->json : "(deleted)", err,
                     c->want);
        long step;
        err[0] = '\0';
        assert_int_equal(checkpoint_load(path, f->m, f->o, &step, err, sizeof err), -EINVAL);
        assert_non_null(strstr(err, c->want));
    }
    print_message("  e.g. %s\n", err);

    /* the two scale keys must agree; a disabled scaler must have scale 1 */
    json_t *s = json_deep_copy(orig);
    json_object_set_new(s, "loss_scale", json_real(2048.0));
    write_state(f, 40, s);
    json_decref(s);
    checkpoint_scaler out;
    assert_int_equal(checkpoint_read_scaler(path, &out, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "loss_scale disagrees"));
    s = json_deep_copy(orig);
    json_object_set_new(json_object_get(s, "loss_scaler"), "enabled", json_false());
    write_state(f, 40, s);
    json_decref(s);
    assert_int_equal(checkpoint_read_scaler(path, &out, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "loss_scaler.scale"));

    /* the untouched state reads again: the cases above really were the cause */
    write_state(f, 40, orig);
    assert_int_equal(checkpoint_read_scaler(path, &out, err, sizeof err), 0);
    assert_true(out.scale == 1024.0f);
    json_decref(orig);
}

static void test_unsavable_scale_refused(void **state)
{
    fixture *f = *state;
    char err[256], path[256];
    const float bad[] = {INFINITY, NAN, 0.0f, -1.0f};
    for (int i = 0; i < 4; i++) {
        checkpoint_scaler in = {.scale = bad[i], .enabled = 1, .growth_interval = 2000};
        err[0] = '\0';
        assert_int_equal(checkpoint_save_scaled(f->dir, 50 + i, f->m, f->o, &in, NULL, 0, err,
                                                sizeof err), -EINVAL);
        assert_non_null(strstr(err, "loss scale"));
        struct stat st;
        ckpt_path(f, 50 + i, path, sizeof path);
        assert_int_equal(stat(path, &st), -1);
    }
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void test_init_from_checkpoint(void **state)
{
    fixture *f = *state;
    char err[512], path[256];
    long step = 0;
    for (size_t i = 0; i < f->m->num_params; i++) // not only the init pattern
        f->m->params_memory[i] += 1e-3f * (float)((i * 2654435761u) % 1000) / 1000.0f;
    assert_int_equal(checkpoint_save(f->dir, 30, f->m, f->o, NULL, 0, err, sizeof err), 0);
    assert_int_equal(checkpoint_latest(f->dir, &step, path, sizeof path), 0);
    bert_model *back = NULL;
    if (hf_init_from(&back, path, -1, 0, err, sizeof err) < 0)
        fail_msg("hf_init_from(%s): %s", path, err);
    assert_int_equal(back->cfg.hidden_size, 16);
    assert_int_equal(back->cfg.vocab_size, 64);
    assert_int_equal(back->num_params, f->m->num_params);
    assert_memory_equal(back->params_memory, f->m->params_memory,
                        f->m->num_params * sizeof(float));
    bert_model_destroy(back);

    /* incomplete: DONE is written last */
    char done[300];
    snprintf(done, sizeof done, "%s/DONE", path);
    assert_int_equal(unlink(done), 0);
    back = NULL;
    assert_int_equal(hf_init_from(&back, path, -1, 0, err, sizeof err), -EINVAL);
    assert_null(back);
    print_message("  incomplete checkpoint: %s\n", err);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "DONE"));

    /* a state.json that is not JSON: where, never what */
    write_file(path, "DONE", "");
    write_file(path, "state.json", "SECRET-LINE-1 of some file\n");
    assert_int_equal(hf_init_from(&back, path, -1, 0, err, sizeof err), -EINVAL);
    print_message("  garbage state.json: %s\n", err);
    assert_non_null(strstr(err, "state.json"));
    assert_null(strstr(err, "SECRET"));
    /* the same for an HF config.json (which is looked at first) */
    write_file(path, "config.json", "SECRET-LINE-1 of some file\n");
    assert_int_equal(hf_init_from(&back, path, -1, 0, err, sizeof err), -EINVAL);
    print_message("  garbage config.json: %s\n", err);
    assert_non_null(strstr(err, "config.json"));
    assert_null(strstr(err, "SECRET"));

    /* neither kind of model */
    char empty[300];
    snprintf(empty, sizeof empty, "%s/empty", f->dir);
    assert_int_equal(mkdir(empty, 0700), 0);
    assert_int_equal(hf_init_from(&back, empty, -1, 0, err, sizeof err), -EINVAL);
    print_message("  empty directory: %s\n", err);
    assert_non_null(strstr(err, empty));
    assert_non_null(strstr(err, "config.json"));
    assert_non_null(strstr(err, "state.json"));
    /* not a directory */
    assert_int_equal(hf_init_from(&back, done, -1, 0, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "not a directory"));
    assert_null(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hidden_act_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cpu_writes_disabled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_format_loads_with_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_is_a_clear_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsavable_scale_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_from_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fence_refuses_an_attempt_that_is_over, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
