/* test_ptbin — worker/ptbin.c on the files of tests/fuzz/ptbin_corpus
 * (torch.save output, made by tests/fuzz/make_ptbin_seeds.py):
 *   - plain dicts, an OrderedDict with _metadata, pickle protocol 4, one
 *     storage under several tensors and an offset, a 0-dim tensor and an
 *     int64 buffer: names, dtypes, shapes and values as torch saved them;
 *   - refused, with a message that names the problem and never quotes the
 *     file: a non-contiguous view, a pickle that calls os.system, a file that
 *     is no zip (the legacy format), a compressed entry;
 *   - every prefix of every seed and every single-byte change of plain.bin's
 *     pickle either parses to in-range tensors or is refused (ASan/UBSan in
 *     the sanitizer run). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "worker/ptbin.h"

static uint8_t *slurp(const char *name, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/fuzz/ptbin_corpus/%s", getenv("BERTD_SOURCE_ROOT"), name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len ? *len : 1);
    assert_int_equal(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

static st_file *parse_ok(const char *name, uint8_t **buf)
{
    size_t len;
    *buf = slurp(name, &len);
    st_file *f = NULL;
    char err[512];
    if (ptbin_parse(&f, *buf, len, err, sizeof err) != 0)
        fail_msg("%s: %s", name, err);
    return f;
}

static void expect(const st_file *f, const char *name, st_dtype dt, int ndim, int64_t d0, int64_t d1,
                   const float *want, size_t n)
{
    const st_tensor *t = st_find(f, name);
    if (!t)
        fail_msg("no tensor %s", name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, ndim);
    if (ndim > 0)
        assert_int_equal(t->shape[0], d0);
    if (ndim > 1)
        assert_int_equal(t->shape[1], d1);
    if (!want)
        return;
    float got[16];
    assert_int_equal(st_read_f32(f, t, got, n), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(got[i] == want[i]);
}

static void test_plain_and_protocol4(void **state)
{
    (void)state;
    static const char *const seeds[] = {"plain.bin", "proto4.bin"};
    for (int s = 0; s < 2; s++) {
        uint8_t *buf;
        st_file *f = parse_ok(seeds[s], &buf);
        assert_int_equal(f->n, 3);
        const float a[] = {0, 0.5f, 1, 1.5f, 2, 2.5f}, b[] = {0, 0.25f, 0.5f, 0.75f},
                    c[] = {0, 0.125f, 0.25f, 0.375f};
        expect(f, "a", ST_F32, 2, 2, 3, a, 6);
        expect(f, "b", ST_F16, 1, 4, 0, b, 4);
        expect(f, "c", ST_BF16, 2, 2, 2, c, 4);
        st_close(f);
        free(buf);
    }
}

static void test_ordered_shared_scalar(void **state)
{
    (void)state;
    uint8_t *buf;
    st_file *f = parse_ok("ordered.bin", &buf);
    const float w[] = {0, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f}, bias[] = {1, 2};
    assert_int_equal(f->n, 2);
    expect(f, "weight", ST_F32, 2, 2, 3, w, 6);
    expect(f, "bias", ST_F32, 1, 2, 0, bias, 2);
    st_close(f);
    free(buf);

    f = parse_ok("shared.bin", &buf);
    const float t[] = {0, 1, 2, 3, 4};
    expect(f, "w", ST_F32, 1, 5, 0, t, 5);
    expect(f, "tied", ST_F32, 1, 5, 0, t, 5);
    expect(f, "tail", ST_F32, 1, 4, 0, t + 1, 4);
    assert_int_equal(st_find(f, "tail")->begin, st_find(f, "w")->begin + 4);
    st_close(f);
    free(buf);

    f = parse_ok("scalar.bin", &buf);
    const float s[] = {3.5f};
    expect(f, "s", ST_F32, 0, 0, 0, s, 1);
    expect(f, "position_ids", ST_I64, 2, 1, 4, NULL, 0);
    st_close(f);
    free(buf);
}

static void refused(const uint8_t *buf, size_t len, const char *must)
{
    st_file *f = NULL;
    char err[512] = "";
    assert_int_equal(ptbin_parse(&f, buf, len, err, sizeof err), -EINVAL);
    assert_null(f);
    print_message("  refused: %s\n", err);
    if (!strstr(err, must))
        fail_msg("'%s' does not say '%s'", err, must);
    assert_null(strstr(err, "system"));
}

static void test_refusals(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b = slurp("transposed.bin", &len);
    refused(b, len, "not contiguous");
    free(b);
    b = slurp("evil.bin", &len);
    refused(b, len, "imports a global other than");
    free(b);
    /* the legacy (pre-1.6) format starts with a pickle, not a zip header */
    static const uint8_t legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
    refused(legacy, sizeof legacy, "not in PyTorch's zip format");
    /* method 8 (deflate) in the first central directory entry */
    b = slurp("plain.bin", &len);
    size_t cd = 0;
    for (size_t i = 0; i + 4 <= len; i++)
        if (b[i] == 0x50 && b[i + 1] == 0x4b && b[i + 2] == 1 && b[i + 3] == 2) {
            cd = i;
            break;
        }
    assert_true(cd > 0);
    b[cd + 10] = 8;
    refused(b, len, "compressed");
    free(b);
}

/* Whatever comes out of a damaged file lies inside it. */
static void parse_any(const uint8_t *buf, size_t len)
{
    st_file *f = NULL;
    char err[512];
    err[0] = 0;
    int rc = ptbin_parse(&f, buf, len, err, sizeof err);
    if (rc != 0) {
        assert_true(rc == -EINVAL || rc == -ENOMEM);
        assert_true(err[0] != 0);
        return;
    }
    for (int i = 0; i < f->n; i++)
        assert_true(f->tensors[i].begin <= f->tensors[i].end && f->tensors[i].end <= len);
    st_close(f);
}

static void test_damaged(void **state)
{
    (void)state;
    static const char *const seeds[] = {"plain.bin", "ordered.bin", "shared.bin", "proto4.bin",
                                        "scalar.bin", "transposed.bin", "evil.bin"};
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t len;
        uint8_t *b = slurp(seeds[s], &len);
        for (size_t n = 0; n < len; n++) {
            uint8_t *cut = malloc(n ? n : 1); /* exactly n bytes: ASan sees any overread */
            memcpy(cut, b, n);
            parse_any(cut, n);
            free(cut);
        }
        free(b);
    }
    size_t len;
    uint8_t *b = slurp("plain.bin", &len);
    for (size_t i = 0; i < len; i++) {
        uint8_t keep = b[i];
        for (int v = 0; v < 256; v += 51) {
            b[i] = (uint8_t)(keep ^ (v | 1));
            parse_any(b, len);
        }
        b[i] = keep;
    }
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_and_protocol4),
        cmocka_unit_test(test_ordered_shared_scalar),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_damaged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
