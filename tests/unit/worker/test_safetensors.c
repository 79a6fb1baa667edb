/* test_safetensors — the safetensors reader rejects malformed files with a
 * clear error (never a crash), round-trips what the writer writes, and the
 * HF export/import pair is lossless (export -> hf_init_from gives the same
 * bytes). Whether transformers itself loads the export is check_export.py's job. */
#include "worker/safetensors.h"
#include "worker/hf.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

/* Builds a file image: 8-byte length + header + ndata zero bytes. */
static uint8_t *image(const char *hdr, size_t ndata, size_t *len)
{
    size_t h = strlen(hdr);
    *len = 8 + h + ndata;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    return b;
}

static void expect_reject(const char *what, const uint8_t *buf, size_t len, const char *needle)
{
    st_file *f = NULL;
    char err[256] = "";
    int rc = st_parse(&f, buf, len, err, sizeof err);
    if (rc != -EINVAL)
        fail_msg("%s: accepted (rc %d)", what, rc);
    assert_null(f);
    print_message("  %-22s -> %s\n", what, err);
    if (!strstr(err, needle))
        fail_msg("%s: message '%s' does not mention '%s'", what, err, needle);
}

static void reject_hdr(const char *what, const char *hdr, size_t ndata, const char *needle)
{
    size_t len;
    uint8_t *b = image(hdr, ndata, &len);
    expect_reject(what, b, len, needle);
    free(b);
}

static void test_malformed_headers_rejected(void **state)
{
    (void)state;
    uint8_t tiny[4] = {0};
    expect_reject("shorter than 8 bytes", tiny, sizeof tiny, "shorter");
    uint8_t huge[16] = {0};
    huge[5] = 0x10; // 2^44-byte header
    expect_reject("absurd header size", huge, sizeof huge, "limit");
    uint8_t past[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    expect_reject("header past EOF", past, sizeof past, "past the end");
    reject_hdr("bad JSON", "{\"a\": {\"dtype\": \"F32\",", 0, "not valid JSON");
    reject_hdr("not an object", "[1, 2, 3]", 0, "not a JSON object");
    reject_hdr("unknown dtype",
               "{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    reject_hdr("missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    reject_hdr("negative shape",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape");
    reject_hdr("offsets out of range",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside");
    reject_hdr("offsets reversed",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "outside");
    reject_hdr("size does not match shape",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12, "need");
    reject_hdr("wrong dtype for bytes",
               "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "need");
    reject_hdr("overlapping tensors",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap");
    reject_hdr("duplicate names",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "JSON");
    reject_hdr("offsets not integers",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", 4,
               "data_offsets");
    reject_hdr("metadata not strings", "{\"__metadata__\":{\"x\":1}}", 0, "__metadata__");

    /* and a well-formed one parses */
    size_t len;
    uint8_t *b = image("{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]}}  ",
                       12, &len);
    float one = 1.0f;
    memcpy(b + len - 12 + 4, &one, 4);
    b[len - 2] = 0x80; // bf16 -2.0 = 0xC000
    b[len - 1] = 0x3F; // bf16 1.0 = 0x3F80 at element 1 of b
    b[len - 4] = 0x00;
    b[len - 3] = 0xC0;
    st_file *f = NULL;
    char err[256];
    assert_int_equal(st_parse(&f, b, len, err, sizeof err), 0);
    assert_int_equal(f->n, 2);
    float a[2], bb[2];
    assert_int_equal(st_read_f32(f, st_find(f, "a"), a, 2), 0);
    assert_true(a[0] == 0.0f && a[1] == 1.0f);
    assert_int_equal(st_read_f32(f, st_find(f, "b"), bb, 2), 0);
    assert_true(bb[0] == -2.0f && bb[1] == 1.0f);
    assert_int_equal(st_read_f32(f, st_find(f, "a"), a, 3), -EINVAL); // wrong count
    st_close(f);
    free(b);
}

/* init_from could name any file (a link to /etc/shadow, say) and
 * the error quoted its first 8 bytes as a "header length", or the bytes
 * jansson choked on. Neither may reach the message. */
static void test_message_never_echoes_content(void **state)
{
    (void)state;
    const char text[] = "root:x:0:0:root:/root:/bin/bash\n";
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | (uint8_t)text[i];
    char num[32], err[256] = "";
    snprintf(num, sizeof num, "%llu", (unsigned long long)hlen);
    st_file *f = NULL;
    assert_int_equal(st_parse(&f, text, sizeof text - 1, err, sizeof err), -EINVAL);
    print_message("  text file -> %s\n", err);
    assert_non_null(strstr(err, "not a safetensors file"));
    assert_null(strstr(err, num));
    /* a length that fits, then a header quoting a secret word */
    size_t len;
    uint8_t *b = image("{\"zqxsecretword", 0, &len);
    err[0] = 0;
    assert_int_equal(st_parse(&f, b, len, err, sizeof err), -EINVAL);
    print_message("  bad JSON  -> %s\n", err);
    assert_non_null(strstr(err, "not valid JSON"));
    assert_null(strstr(err, "zqxsecret"));
    free(b);
}

static void test_write_read_roundtrip(void **state)
{
    (void)state;
    char dir[] = "/tmp/bertd-st-XXXXXX", path[256], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    float x[6] = {1, -2, 3.5f, 1e-30f, -0.0f, 7}, y[3] = {9, 8, 7};
    st_entry e[2] = {{.name = "x", .ndim = 2, .shape = {2, 3}, .data = x},
                     {.name = "y", .ndim = 1, .shape = {3}, .data = y}};
    assert_int_equal(st_write(path, e, 2, NULL), 0);
    st_file *f = NULL;
    assert_int_equal(st_open(&f, path, err, sizeof err), 0);
    const st_tensor *t = st_find(f, "x");
    assert_non_null(t);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 3);
    float back[6];
    assert_int_equal(st_read_f32(f, t, back, 6), 0);
    assert_memory_equal(back, x, sizeof x);
    assert_int_equal((t->begin + 8) % 8, 0); // data 8-byte aligned after the padded header
    st_close(f);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/x.safetensors.tmp", dir);
    assert_int_equal(access(path, F_OK), -1); // no tmp left behind
    assert_int_equal(st_open(&f, "/nonexistent/file", err, sizeof err), -ENOENT);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_hf_export_import_lossless(void **state)
{
    (void)state;
    bert_config cfg;
    bert_config_preset(&cfg, "bert-tiny");
    cfg.vocab_size = 100;
    cfg.max_position_embeddings = 16;
    cfg.hidden_size = 16;
    cfg.intermediate_size = 24;
    cfg.nsp = 1; // exercises the pooler and seq_relationship names too
    bert_model *m = NULL, *back = NULL;
    assert_int_equal(bert_model_create(&m, &cfg), 0);
    bert_model_init_weights(m, 3);
    for (size_t i = 0; i < m->num_params; i++) // biases and LN too, not only the init pattern
        m->params_memory[i] += 1e-3f * (float)((i * 2654435761u) % 1000) / 1000.0f;
    char dir[] = "/tmp/bertd-hf-XXXXXX", err[256];
    assert_non_null(mkdtemp(dir));
    const char *fixtures = getenv("BERTD_MODEL_FIXTURES");
    assert_non_null(fixtures);
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s/hf_tiny/vocab.txt", fixtures);
    int rc = hf_export(m, dir, vocab, true, err, sizeof err);
    if (rc < 0)
        fail_msg("export: %s", err);
    rc = hf_init_from(&back, dir, -1, 0, err, sizeof err);
    if (rc < 0)
        fail_msg("init_from: %s", err);
    assert_int_equal(back->cfg.nsp, 1);
    assert_int_equal(back->cfg.hidden_size, 16);
    assert_int_equal(back->num_params, m->num_params);
    assert_memory_equal(back->params_memory, m->params_memory, m->num_params * sizeof(float));
    /* vocab.txt travels with the export, byte for byte */
    char vpath[4200], cmd0[8500];
    snprintf(vpath, sizeof vpath, "%s/vocab.txt", dir);
    snprintf(cmd0, sizeof cmd0, "cmp -s '%s' '%s'", vocab, vpath);
    assert_int_equal(system(cmd0), 0);
    /* the export leaves the tied decoder weight out, as HF does */
    st_file *f = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(st_open(&f, path, err, sizeof err), 0);
    assert_null(st_find(f, "cls.predictions.decoder.weight"));
    assert_non_null(st_find(f, "bert.encoder.layer.1.attention.self.value.weight"));
    st_close(f);
    /* a config the weights do not fit is refused with the tensor's name */
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *cf = fopen(path, "w");
    fprintf(cf, "{\"hidden_size\": 16, \"num_attention_heads\": 2, \"num_hidden_layers\": 2,"
                " \"intermediate_size\": 24, \"vocab_size\": 101,"
                " \"max_position_embeddings\": 16}");
    fclose(cf);
    bert_model *bad = NULL;
    assert_int_equal(hf_init_from(&bad, dir, -1, 0, err, sizeof err), -EINVAL);
    print_message("  mismatched config: %s\n", err);
    assert_non_null(strstr(err, "word_embeddings"));
    /* broken or unsupported config.json: clear errors */
    static const char *bad_cfgs[] = {"{\"hidden_size\": ", "{\"hidden_size\": \"16\"}",
                                     "{\"hidden_act\": \"relu\"}",
                                     "{\"num_attention_heads\": 5, \"hidden_size\": 16}"};
    for (int i = 0; i < 4; i++) {
        cf = fopen(path, "w");
        fputs(bad_cfgs[i], cf);
        fclose(cf);
        assert_int_equal(hf_init_from(&bad, dir, -1, 0, err, sizeof err), -EINVAL);
        assert_null(bad);
        print_message("  bad config.json: %s\n", err);
    }
    bert_model_destroy(m);
    bert_model_destroy(back);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_headers_rejected),
        cmocka_unit_test(test_message_never_echoes_content),
        cmocka_unit_test(test_write_read_roundtrip),
        cmocka_unit_test(test_hf_export_import_lossless),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
