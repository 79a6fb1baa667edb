/* test_ops_fd — every op's backward against float64 central finite
 * differences. Approach: the kernel sources are compiled a second time with
 * KERNELS_F64 (kreal = double, names suffixed _f64), so the very code the fp32
 * backend runs is differentiated numerically in double. For each op the
 * scalar is L = sum(out * w) with a fixed random w; every input element x_i is
 * perturbed by +-h (h = 1e-6) and (L(x+h) - L(x-h)) / 2h is compared with the
 * backward's gradient: ||analytic - numeric||_2 / ||numeric||_2 <= 1e-6.
 * The gradient rule is checked too: parameter gradients are pre-filled with
 * 1.0 and must be accumulated onto it (+=); activation gradients are
 * pre-filled with NaN and must be overwritten (=). */
#define KERNELS_F64
#include "kernels/kernels.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define H 1e-6
#define TOL 1e-6

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static double *rnd(size_t n, double scale)
{
    double *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = urand() * scale;
    return x;
}
static double *filled(size_t n, double v)
{
    double *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    return x;
}

/* The op under test: writes out (nout) from whatever inputs ctx points at. */
typedef struct op_case {
    void (*forward)(struct op_case *c);
    double *out, *w;
    size_t nout;
    void *ctx;
} op_case;

static double objective(op_case *c)
{
    c->forward(c);
    double s = 0;
    for (size_t i = 0; i < c->nout; i++)
        s += c->out[i] * c->w[i];
    return s;
}

/* analytic: the gradient wrt x from backward, with `base` already subtracted
 * (1.0 for accumulated parameter gradients, 0 otherwise). */
static void check_grad(const char *what, op_case *c, double *x, size_t n, const double *analytic,
                       double base)
{
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + H;
        double lp = objective(c);
        x[i] = keep - H;
        double lm = objective(c);
        x[i] = keep;
        double num = (lp - lm) / (2 * H), an = analytic[i] - base;
        if (isnan(an))
            fail_msg("%s[%zu]: gradient not written (NaN)", what, i);
        d2 += (an - num) * (an - num);
        n2 += num * num;
    }
    objective(c); // restore out for the caller
    double e = sqrt(d2) / (sqrt(n2) > 1e-12 ? sqrt(n2) : 1e-12);
    print_message("  %-28s rel err %.2e (|g| %.3g)\n", what, e, sqrt(n2));
    if (!(e <= TOL))
        fail_msg("%s: relative error %.3g > %.1g", what, e, TOL);
}

/* ---- matmul ---- */
struct mm { double *inp, *weight, *bias; int N, C, OC; };
static void mm_fwd(op_case *c)
{
    struct mm *m = c->ctx;
    matmul_forward_f64(c->out, m->inp, m->weight, m->bias, m->N, m->C, m->OC);
}
static void test_matmul(void **state)
{
    (void)state;
    struct mm m = {.N = 5, .C = 7, .OC = 6};
    m.inp = rnd(35, 1);
    m.weight = rnd(42, 1);
    m.bias = rnd(6, 1);
    op_case c = {mm_fwd, malloc(30 * sizeof(double)), rnd(30, 1), 30, &m};
    objective(&c);
    double *dinp = filled(35, NAN), *dw = filled(42, 1), *db = filled(6, 1);
    matmul_backward_f64(dinp, dw, db, c.w, m.inp, m.weight, m.N, m.C, m.OC);
    check_grad("matmul dinp", &c, m.inp, 35, dinp, 0);
    check_grad("matmul dweight", &c, m.weight, 42, dw, 1);
    check_grad("matmul dbias", &c, m.bias, 6, db, 1);
    free(m.inp); free(m.weight); free(m.bias); free(c.out); free(c.w);
    free(dinp); free(dw); free(db);
}

/* ---- layernorm ---- */
struct ln { double *inp, *weight, *bias, *mean, *rstd; int N, C; };
static void ln_fwd(op_case *c)
{
    struct ln *l = c->ctx;
    layernorm_forward_f64(c->out, l->mean, l->rstd, l->inp, l->weight, l->bias, l->N, l->C,
                          1e-5f);
}
static void test_layernorm(void **state)
{
    (void)state;
    struct ln l = {.N = 4, .C = 9};
    l.inp = rnd(36, 2);
    l.weight = rnd(9, 1);
    l.bias = rnd(9, 1);
    l.mean = malloc(4 * sizeof(double));
    l.rstd = malloc(4 * sizeof(double));
    op_case c = {ln_fwd, malloc(36 * sizeof(double)), rnd(36, 1), 36, &l};
    objective(&c);
    double *dinp = filled(36, NAN), *dw = filled(9, 1), *db = filled(9, 1);
    layernorm_backward_f64(dinp, dw, db, c.w, l.inp, l.weight, l.mean, l.rstd, l.N, l.C);
    check_grad("layernorm dinp", &c, l.inp, 36, dinp, 0);
    check_grad("layernorm dweight", &c, l.weight, 9, dw, 1);
    check_grad("layernorm dbias", &c, l.bias, 9, db, 1);
    free(l.inp); free(l.weight); free(l.bias); free(l.mean); free(l.rstd);
    free(c.out); free(c.w); free(dinp); free(dw); free(db);
}

/* ---- embeddings ---- */
struct emb { int32_t *inp, *tt; double *wte, *wpe, *wtt; int B, T, C; };
static void emb_fwd(op_case *c)
{
    struct emb *e = c->ctx;
    embeddings_forward_f64(c->out, e->inp, e->tt, e->wte, e->wpe, e->wtt, e->B, e->T, e->C);
}
static void test_embeddings(void **state)
{
    (void)state;
    int32_t inp[6] = {3, 1, 3, 0, 2, 3}, tt[6] = {0, 1, 1, 0, 0, 1};
    struct emb e = {inp, tt, rnd(4 * 5, 1), rnd(3 * 5, 1), rnd(2 * 5, 1), 2, 3, 5};
    op_case c = {emb_fwd, malloc(30 * sizeof(double)), rnd(30, 1), 30, &e};
    objective(&c);
    double *dwte = filled(20, 1), *dwpe = filled(15, 1), *dwtt = filled(10, 1);
    embeddings_backward_f64(dwte, dwpe, dwtt, c.w, inp, tt, e.B, e.T, e.C);
    check_grad("embeddings dwte", &c, e.wte, 20, dwte, 1);
    check_grad("embeddings dwpe", &c, e.wpe, 15, dwpe, 1);
    check_grad("embeddings dwtt", &c, e.wtt, 10, dwtt, 1);
    free(e.wte); free(e.wpe); free(e.wtt); free(c.out); free(c.w);
    free(dwte); free(dwpe); free(dwtt);
}

/* ---- attention (padding mask, with and without dropout) ---- */
struct at { double *qkv, *att; int32_t *lens; philox_stream *rng; float p; int B, T, C, NH; };
static void at_fwd(op_case *c)
{
    struct at *a = c->ctx;
    attention_forward_f64(c->out, a->att, a->qkv, a->lens, a->rng, a->p, a->B, a->T, a->C, a->NH);
}
static void attention_case(float p)
{
    int B = 2, T = 5, C = 6, NH = 2;
    int32_t lens[2] = {5, 3};
    philox_stream s;
    philox_stream_init(&s, 7, 0, 3, 0, 1, DROPOUT_SITE_ATTN_PROBS);
    struct at a = {rnd((size_t)B * T * 3 * C, 1.5), malloc(sizeof(double) * B * NH * T * T), lens,
                   p > 0 ? &s : NULL, p, B, T, C, NH};
    size_t nout = (size_t)B * T * C, nqkv = (size_t)B * T * 3 * C;
    op_case c = {at_fwd, malloc(nout * sizeof(double)), rnd(nout, 1), nout, &a};
    objective(&c);
    /* the padding mask: probabilities on keys at t >= len are exactly 0 */
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < T; i++)
            for (int j = lens[1]; j < T; j++)
                assert_true(a.att[(((size_t)1 * NH + h) * T + i) * T + j] == 0.0);
    if (p > 0) { /* kept probabilities follow the per-element Philox stream */
        /* with V = one-hot of key j in channel 0 of head 0, out[b,i,0] = Pdrop[b,0,i,j] */
        double *q2 = malloc(nqkv * sizeof(double)), *o2 = malloc(nout * sizeof(double));
        memcpy(q2, a.qkv, nqkv * sizeof(double));
        uint32_t th = dropout_threshold(p);
        for (int j = 0; j < T; j++) {
            for (int bt = 0; bt < B * T; bt++)
                q2[(size_t)bt * 3 * C + 2 * C] = (bt % T) == j;
            attention_forward_f64(o2, a.att, q2, lens, &s, p, B, T, C, NH);
            for (int b = 0; b < B; b++)
                for (int i = 0; i < T; i++) {
                    size_t e = (((size_t)b * NH + 0) * T + i) * T + j;
                    int kept = philox_stream_u32(&s, e) >= th;
                    double want = kept && j < lens[b] ? a.att[e] / (1 - p) : 0;
                    assert_true(fabs(o2[((size_t)b * T + i) * C] - want) < 1e-6);
                }
        }
        free(q2);
        free(o2);
        objective(&c);
    }
    double *dqkv = filled(nqkv, NAN), *datt = malloc(sizeof(double) * B * NH * T * T);
    attention_backward_f64(dqkv, datt, c.w, a.qkv, a.att, lens, a.rng, p, B, T, C, NH);
    check_grad(p > 0 ? "attention dqkv (dropout 0.3)" : "attention dqkv", &c, a.qkv, nqkv, dqkv, 0);
    free(a.qkv); free(a.att); free(c.out); free(c.w); free(dqkv); free(datt);
}
static void test_attention(void **state)
{
    (void)state;
    attention_case(0.0f);
    attention_case(0.3f);
}

/* ---- pointwise ops ---- */
/* the fp32 op (kernels.h declares it without KERNELS_F64; one header form per unit) */
void gelu_tanh_forward(float *out, const float *inp, size_t N);
enum { PW_GELU, PW_TANH, PW_DROPOUT, PW_GELU_TANH };
struct pw { int which; double *inp; philox_stream *rng; size_t n; };
static void pw_fwd(op_case *c)
{
    struct pw *p = c->ctx;
    if (p->which == PW_GELU)
        gelu_forward_f64(c->out, p->inp, p->n);
    else if (p->which == PW_TANH)
        tanh_forward_f64(c->out, p->inp, p->n);
    else if (p->which == PW_GELU_TANH)
        gelu_tanh_forward_f64(c->out, p->inp, p->n);
    else
        dropout_forward_f64(c->out, p->inp, p->rng, 0.25f, p->n);
}
static void test_pointwise(void **state)
{
    (void)state;
    size_t n = 40;
    philox_stream s;
    philox_stream_init(&s, 11, 1, 5, 2, 3, DROPOUT_SITE_FFN_OUT);
    for (int which = 0; which < 4; which++) {
        struct pw p = {which, rnd(n, 3), &s, n};
        op_case c = {pw_fwd, malloc(n * sizeof(double)), rnd(n, 1), n, &p};
        objective(&c);
        double *d = filled(n, NAN);
        if (which == PW_GELU)
            gelu_backward_f64(d, p.inp, c.w, n);
        else if (which == PW_TANH)
            tanh_backward_f64(d, c.out, c.w, n);
        else if (which == PW_GELU_TANH)
            gelu_tanh_backward_f64(d, p.inp, c.w, n);
        else
            dropout_backward_f64(d, c.w, &s, 0.25f, n);
        static const char *names[] = {"gelu dinp", "tanh dinp", "dropout dinp",
                                      "gelu_tanh dinp"};
        check_grad(names[which], &c, p.inp, n, d, 0);
        if (which == PW_GELU) { /* erf form, not the tanh approximation */
            double x = 1.5, y;
            gelu_forward_f64(&y, &x, 1);
            assert_true(fabs(y - 0.5 * x * (1 + erf(x / sqrt(2.0)))) < 1e-15);
        }
        if (which == PW_GELU_TANH) { /* HF gelu_new's formula, constants written out here */
            for (size_t i = 0; i < n; i++) {
                double x = p.inp[i];
                double want = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * pow(x, 3))));
                assert_true(fabs(c.out[i] - want) < 1e-15 * (1 + fabs(want)));
            }
            /* and in float: the kernel the model runs, within float rounding */
            float xf[3] = {-3.0f, 0.7f, 2.5f}, yf[3];
            gelu_tanh_forward(yf, xf, 3);
            for (int i = 0; i < 3; i++) {
                double x = xf[i], want = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
                assert_true(fabs(yf[i] - want) < 1e-6 * (1 + fabs(want)));
            }
        }
        if (which == PW_DROPOUT) { /* kept elements scaled by 1/(1-p), some dropped */
            int dropped = 0;
            for (size_t i = 0; i < n; i++) {
                if (c.out[i] == 0)
                    dropped++;
                else
                    assert_true(fabs(c.out[i] - p.inp[i] / 0.75) < 1e-12);
            }
            assert_true(dropped > 0 && dropped < (int)n);
            /* the mask is exactly the per-element Philox stream (the CUDA twin's contract) */
            uint32_t th = dropout_threshold(0.25f);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(c.out[i] != 0, philox_stream_u32(&s, i) >= th);
        }
        free(p.inp); free(c.out); free(c.w); free(d);
    }
}

/* ---- residual ---- */
struct rs { double *a, *b; size_t n; };
static void rs_fwd(op_case *c)
{
    struct rs *r = c->ctx;
    residual_forward_f64(c->out, r->a, r->b, r->n);
}
static void test_residual(void **state)
{
    (void)state;
    struct rs r = {rnd(12, 1), rnd(12, 1), 12};
    op_case c = {rs_fwd, malloc(12 * sizeof(double)), rnd(12, 1), 12, &r};
    objective(&c);
    double *da = filled(12, NAN), *db = filled(12, NAN);
    residual_backward_f64(da, db, c.w, 12);
    check_grad("residual da", &c, r.a, 12, da, 0);
    check_grad("residual db", &c, r.b, 12, db, 0);
    free(r.a); free(r.b); free(c.out); free(c.w); free(da); free(db);
}

/* ---- gather rows + fused softmax cross-entropy (the MLM head's own ops) ---- */
struct ce { double *hidden, *logits_w, *sel, *logits, *probs; int32_t *rows, *targets; int M, N, C, V; };
static void ce_fwd(op_case *c)
{
    struct ce *e = c->ctx;
    /* hidden (N,C) -> gather (M,C) -> logits = sel @ logits_w^T (M,V) -> CE */
    gather_rows_forward_f64(e->sel, e->hidden, e->rows, e->M, e->C);
    matmul_forward_f64(e->logits, e->sel, e->logits_w, NULL, e->M, e->C, e->V);
    crossentropy_softmax_forward_f64(c->out, e->probs, e->logits, e->targets, e->M, e->V);
}
static void test_gather_crossentropy(void **state)
{
    (void)state;
    int M = 3, N = 6, C = 4, V = 7;
    int32_t rows[3] = {4, 1, 5}, targets[3] = {2, 6, 0};
    struct ce e = {rnd((size_t)N * C, 1), rnd((size_t)V * C, 2), malloc(sizeof(double) * M * C),
                   malloc(sizeof(double) * M * V), malloc(sizeof(double) * M * V), rows, targets,
                   M, N, C, V};
    op_case c = {ce_fwd, malloc(M * sizeof(double)), rnd(M, 1), (size_t)M, &e};
    objective(&c);
    /* the loss is -log softmax at the target */
    for (int m = 0; m < M; m++) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, e.logits[m * V + v]);
        for (int v = 0; v < V; v++)
            s += exp(e.logits[m * V + v] - mx);
        assert_true(fabs(c.out[m] - (log(s) + mx - e.logits[m * V + targets[m]])) < 1e-12);
    }
    double *dlogits = filled((size_t)M * V, NAN), *dsel = filled((size_t)M * C, NAN),
           *dW = filled((size_t)V * C, 1), *dhidden = filled((size_t)N * C, 0);
    crossentropy_softmax_backward_f64(dlogits, e.probs, targets, c.w, M, V);
    matmul_backward_f64(dsel, dW, NULL, dlogits, e.sel, e.logits_w, M, C, V);
    gather_rows_backward_f64(dhidden, dsel, rows, M, C);
    check_grad("crossentropy+gather dhidden", &c, e.hidden, (size_t)N * C, dhidden, 0);
    check_grad("crossentropy dW", &c, e.logits_w, (size_t)V * C, dW, 1);
    free(e.hidden); free(e.logits_w); free(e.sel); free(e.logits); free(e.probs);
    free(c.out); free(c.w); free(dlogits); free(dsel); free(dW); free(dhidden);
}

/* Philox4x32-10 known-answer vectors from the Random123 distribution (kat_vectors). */
static void test_philox_known_answers(void **state)
{
    (void)state;
    uint32_t out[4];
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    philox4x32_10(out, c0, k0);
    assert_int_equal(out[0], 0x6627e8d5u);
    assert_int_equal(out[1], 0xe169c58du);
    assert_int_equal(out[2], 0xbc57ac4cu);
    assert_int_equal(out[3], 0x9b00dbd8u);
    const uint32_t c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                   k1[2] = {0xffffffffu, 0xffffffffu};
    philox4x32_10(out, c1, k1);
    assert_int_equal(out[0], 0x408f276du);
    assert_int_equal(out[1], 0x41c83b0eu);
    assert_int_equal(out[2], 0xa20bc7c6u);
    assert_int_equal(out[3], 0x6d5451fdu);
    const uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                   k2[2] = {0xa4093822u, 0x299f31d0u};
    philox4x32_10(out, c2, k2);
    assert_int_equal(out[0], 0xd16cfe09u);
    assert_int_equal(out[1], 0x94fdccebu);
    assert_int_equal(out[2], 0x5001e420u);
    assert_int_equal(out[3], 0x24126ea1u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_embeddings),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_pointwise),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_gather_crossentropy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
