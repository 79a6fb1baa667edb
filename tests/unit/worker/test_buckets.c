/* bert_grad_bucket: the gradient buckets the CUDA data-parallel path
 * all-reduces while backward runs. Checked against the model's own tensor
 * pointers (bert_model_create lays the span out; the bucket plan computes
 * offsets from the size table alone), so a plan that names the wrong layer's
 * slice, skips a tensor or reduces one twice fails here, on the CPU, before
 * any GPU runs it:
 *   - bucket l is exactly layer l's QKV, attention-output, FFN-in and
 *     FFN-out weight slices;
 *   - buckets 0..L tile the span [0, num_params) with no gap or overlap;
 *   - buckets outside 0..L are refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "worker/model.h"

typedef struct range {
    size_t off, n;
} range;

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void check_config(const char *preset, int nsp, int layers)
{
    bert_config cfg;
    assert_int_equal(bert_config_preset(&cfg, preset), 0);
    cfg.nsp = nsp;
    cfg.vocab_size = 1000; /* keeps the model small; the plan does not care */
    if (layers)
        cfg.num_hidden_layers = layers;
    bert_model *m = NULL;
    assert_int_equal(bert_model_create(&m, &cfg), 0);
    int L = cfg.num_hidden_layers;
    size_t C = (size_t)cfg.hidden_size, I = (size_t)cfg.intermediate_size;
    const float *base = m->params_memory;
    const bert_params *p = &m->params;

    range *all = calloc((size_t)(L + 1) * BERT_BUCKET_MAX_RANGES, sizeof *all);
    size_t nall = 0;
    for (int b = 0; b <= L; b++) {
        size_t off[BERT_BUCKET_MAX_RANGES], n[BERT_BUCKET_MAX_RANGES];
        int k = bert_grad_bucket(&cfg, b, off, n);
        assert_true(k >= 1 && k <= BERT_BUCKET_MAX_RANGES);
        if (b < L) {
            /* layer b's four matrices, from the model's own pointers */
            range want[4] = {
                {(size_t)(p->qkvw - base) + (size_t)b * 3 * C * C, 3 * C * C},
                {(size_t)(p->attprojw - base) + (size_t)b * C * C, C * C},
                {(size_t)(p->fcw - base) + (size_t)b * I * C, I * C},
                {(size_t)(p->fcprojw - base) + (size_t)b * C * I, C * I},
            };
            assert_int_equal(k, 4);
            for (int i = 0; i < 4; i++) {
                assert_int_equal(off[i], want[i].off);
                assert_int_equal(n[i], want[i].n);
            }
        } else {
            /* the rest holds the embeddings (with the tied decoder weight)
             * and the first layer's QKV bias, and no layer matrix */
            int has_wte = 0, has_qkvb = 0;
            for (int i = 0; i < k; i++) {
                size_t lo = off[i], hi = off[i] + n[i];
                has_wte |= (size_t)(p->wte - base) >= lo && (size_t)(p->wte - base) < hi;
                has_qkvb |= (size_t)(p->qkvb - base) >= lo && (size_t)(p->qkvb - base) < hi;
                assert_false((size_t)(p->qkvw - base) >= lo && (size_t)(p->qkvw - base) < hi);
                assert_false((size_t)(p->fcw - base) >= lo && (size_t)(p->fcw - base) < hi);
            }
            assert_true(has_wte && has_qkvb);
        }
        for (int i = 0; i < k; i++) {
            assert_true(n[i] > 0);
            all[nall++] = (range){off[i], n[i]};
        }
    }
    qsort(all, nall, sizeof *all, cmp_range);
    size_t at = 0;
    for (size_t i = 0; i < nall; i++) {
        assert_int_equal(all[i].off, at); /* no gap, no overlap */
        at += all[i].n;
    }
    assert_int_equal(at, m->num_params);

    size_t off[BERT_BUCKET_MAX_RANGES], n[BERT_BUCKET_MAX_RANGES];
    assert_int_equal(bert_grad_bucket(&cfg, -1, off, n), -EINVAL);
    assert_int_equal(bert_grad_bucket(&cfg, L + 1, off, n), -EINVAL);
    free(all);
    bert_model_destroy(m);
}

static void test_tiny(void **state)
{
    (void)state;
    check_config("bert-tiny", 0, 0);
}

static void test_mini_nsp(void **state)
{
    (void)state;
    check_config("bert-mini", 1, 0);
}

static void test_one_layer(void **state)
{
    (void)state;
    check_config("bert-tiny", 1, 1);
}

static void test_base_layout(void **state)
{
    (void)state;
    check_config("bert-base", 0, 3); /* bert-base widths, 3 layers to stay small */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_mini_nsp),
        cmocka_unit_test(test_one_layer),
        cmocka_unit_test(test_base_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
