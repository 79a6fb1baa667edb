/* test_determinism_cuda — every CUDA backward that reduces into a parameter
 * gradient gives the same bits twice: the bias gradient of
 * cuda_matmul_backward_dt, LayerNorm and residual + dropout + LayerNorm
 * weight/bias gradients, the embedding gradients (word rows with many
 * repeated ids, positions, types; both the trainer's ordered entry and the
 * test one), and the MLM row scatter. Each op runs twice on the same inputs
 * from the same starting gradients (they are +=) and the two results must
 * be bit-identical and differ from the start. That is what lets a job
 * resumed from a checkpoint end bit-identical to an uninterrupted one
 * (tests/cudasim/test_daemon_job.c). Exits 77 without a GPU.
 *
 * Under the CPU stand-in (suite cudasim) every launch runs its blocks, and
 * the threads of each block, in another shuffled order, so two runs differ
 * in every order a GPU could vary; float atomics show as different bits.
 * Shown (each edit made, run under the stand-in, undone): the old
 * kernels/cuda/matmul.cu (one atomicAdd per block and column) fails both
 * "bias_backward twice" lines; in kernels/cuda/layernorm.cuh, an atomicAdd
 * per row in the word-embedding kernel fails both embedding lines, and the
 * LayerNorm chunk sums atomically added instead of stored fail both
 * LayerNorm lines, in fp32 and fp16. On a GPU the hardware's own
 * scheduling varies.
 *
 * Shapes are small (the stand-in runs on a CPU) but give every old atomic
 * path several blocks: N = 2048 rows for the bias (8 row blocks before),
 * 1024 LayerNorm rows, 1024 positions over 50 ids for the embeddings.
 */
#include "tests/gpu/gpu_check.h"

/* Runs op twice from the same starting gradients g0 (n floats each of
 * `outs` device buffers) and compares the bits. */
typedef void (*op_fn)(float **grads, void *ctx);

static void twice(const char *what, kdtype dt, op_fn op, void *ctx, int outs, const size_t *n)
{
    float *g0[4], *got[2][4], *d[4];
    int same = 1, moved = 0, finite = 1;
    for (int k = 0; k < outs; k++)
        g0[k] = host_rand(n[k], 1, 0);
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < outs; k++)
            d[k] = dev_from(g0[k], n[k], KDT_F32);
        op(d, ctx);
        TCHECK(cudaDeviceSynchronize());
        for (int k = 0; k < outs; k++) {
            got[r][k] = malloc(n[k] * sizeof(float));
            dev_to(got[r][k], d[k], n[k], KDT_F32);
            TCHECK(cudaFree(d[k]));
        }
    }
    for (int k = 0; k < outs; k++) {
        same &= !memcmp(got[0][k], got[1][k], n[k] * sizeof(float));
        for (size_t i = 0; i < n[k]; i++) {
            moved |= got[0][k][i] != g0[k][i];
            finite &= isfinite(got[0][k][i]) != 0;
        }
    }
    int ok = same && moved && finite;
    printf("%-4s %-44s %s %s\n", ok ? "ok" : "FAIL", what, kdtype_name(dt),
           !finite ? "NaN or inf" : !moved ? "gradient unchanged" :
           same ? "bit-identical" : "the bits differ between two runs");
    gpu_failures += !ok;
    for (int k = 0; k < outs; k++) {
        free(g0[k]);
        free(got[0][k]);
        free(got[1][k]);
    }
}

/* ---- bias (and weight) gradient of a linear layer ---- */
struct mm { void *dout, *inp, *w; int N, C, OC; kdtype dt; };

static void mm_op(float **g, void *ctx)
{
    struct mm *m = ctx;
    cuda_matmul_backward_dt(NULL, g[0], g[1], m->dout, m->inp, m->w, m->N, m->C, m->OC, m->dt, 0);
}

static void test_bias(kdtype dt)
{
    struct mm m = {.N = 2048, .C = 16, .OC = 96, .dt = dt};
    float *dout = host_rand((size_t)m.N * m.OC, 1, 0), *inp = host_rand((size_t)m.N * m.C, 1, 0),
          *w = host_rand((size_t)m.OC * m.C, 1, 0);
    m.dout = dev_from(dout, (size_t)m.N * m.OC, dt);
    m.inp = dev_from(inp, (size_t)m.N * m.C, dt);
    m.w = dev_from(w, (size_t)m.OC * m.C, dt);
    size_t n[2] = {(size_t)m.OC * m.C, (size_t)m.OC};
    twice("bias_backward twice (dweight, dbias)", dt, mm_op, &m, 2, n);
    free(dout); free(inp); free(w);
    cudaFree(m.dout); cudaFree(m.inp); cudaFree(m.w);
}

/* ---- LayerNorm and residual + dropout + LayerNorm ---- */
struct ln { void *dinp, *dy, *dout, *dout2, *inp; float *w, *mean, *rstd; philox_stream rng;
            int N, C, fused; kdtype dt; };

static void ln_op(float **g, void *ctx)
{
    struct ln *l = ctx;
    if (l->fused)
        cuda_residual_dropout_layernorm_backward_dt(l->dinp, l->dy, g[0], g[1], l->dout, l->dout2,
                                                    l->inp, l->w, l->mean, l->rstd, &l->rng,
                                                    0.1f, l->N, l->C, l->dt, 0);
    else
        cuda_layernorm_backward_dt(l->dinp, g[0], g[1], l->dout, l->inp, l->w, l->mean, l->rstd,
                                   l->N, l->C, l->dt, 0);
}

static void test_layernorm(kdtype dt, int fused)
{
    struct ln l = {.N = 1024, .C = 96, .fused = fused, .dt = dt};
    size_t n = (size_t)l.N * l.C;
    philox_stream_init(&l.rng, 99, 0, 3, 1, 2, DROPOUT_SITE_FFN_OUT);
    float *x = host_rand(n, 2, 0), *dout = host_rand(n, 1, 0), *dout2 = host_rand(n, 1, 0),
          *w = host_rand((size_t)l.C, 0.5f, 1), *b = host_rand((size_t)l.C, 0.5f, 0);
    l.inp = dev_from(x, n, dt);
    l.dout = dev_from(dout, n, dt);
    l.dout2 = fused ? dev_from(dout2, n, dt) : NULL;
    l.w = dev_from(w, (size_t)l.C, KDT_F32);
    float *db = dev_from(b, (size_t)l.C, KDT_F32);
    l.mean = dev_alloc((size_t)l.N * 4);
    l.rstd = dev_alloc((size_t)l.N * 4);
    l.dinp = dev_alloc(n * kdtype_size(dt));
    l.dy = dev_alloc(n * kdtype_size(dt));
    void *out = dev_alloc(n * kdtype_size(dt));
    cuda_layernorm_forward_dt(out, l.mean, l.rstd, l.inp, l.w, db, l.N, l.C, 1e-12f, dt, 0);
    size_t nn[2] = {(size_t)l.C, (size_t)l.C};
    twice(fused ? "residual_dropout_layernorm_backward twice" : "layernorm_backward twice", dt,
          ln_op, &l, 2, nn);
    free(x); free(dout); free(dout2); free(w); free(b);
    cudaFree(l.inp); cudaFree(l.dout); cudaFree(l.dout2); cudaFree(l.w); cudaFree(db);
    cudaFree(l.mean); cudaFree(l.rstd); cudaFree(l.dinp); cudaFree(l.dy); cudaFree(out);
}

/* ---- embeddings ---- */
struct emb { void *dout; int32_t *ids, *tt, *order; int B, T, C, V, U, ordered; kdtype dt; };

static void emb_op(float **g, void *ctx)
{
    struct emb *e = ctx;
    if (e->ordered)
        cuda_embeddings_backward_ordered_dt(g[0], g[1], g[2], e->dout, e->ids, e->tt, e->order,
                                            e->order + e->B * e->T, e->U, e->B, e->T, e->C, 2,
                                            e->dt, 0);
    else
        cuda_embeddings_backward_dt(g[0], g[1], g[2], e->dout, e->ids, e->tt, e->B, e->T, e->C,
                                    e->dt, 0);
}

static void test_embeddings(kdtype dt, int ordered)
{
    struct emb e = {.B = 16, .T = 64, .C = 64, .V = 50, .ordered = ordered, .dt = dt};
    int N = e.B * e.T;
    int32_t *ids = malloc((size_t)N * 4), *tt = malloc((size_t)N * 4),
            *ord = malloc((size_t)(2 * N + 1) * 4);
    for (int i = 0; i < N; i++) {
        /* id 3 on a third of the positions: one long run, as [MASK] or [PAD] */
        ids[i] = i % 3 == 0 ? 3 : (int32_t)((i * 7919u) % (unsigned)e.V);
        tt[i] = (i % e.T) >= e.T / 2;
    }
    e.U = cuda_embeddings_order(ord, ord + N, ids, N, e.V);
    int sorted = e.U > 0 && e.U <= e.V && ord[N + e.U] == N;
    for (int k = 1; sorted && k < N; k++)
        sorted = ids[ord[k - 1]] < ids[ord[k]] ||
                 (ids[ord[k - 1]] == ids[ord[k]] && ord[k - 1] < ord[k]);
    if (!sorted) {
        printf("FAIL cuda_embeddings_order: not a stable order by id (U = %d)\n", e.U);
        gpu_failures++;
    }
    float *dout = host_rand((size_t)N * e.C, 1, 0);
    e.dout = dev_from(dout, (size_t)N * e.C, dt);
    e.ids = dev_ints(ids, (size_t)N);
    e.tt = dev_ints(tt, (size_t)N);
    e.order = dev_ints(ord, (size_t)(2 * N + 1));
    size_t n[3] = {(size_t)e.V * e.C, (size_t)e.T * e.C, 2 * (size_t)e.C};
    twice(ordered ? "embeddings_backward_ordered twice" : "embeddings_backward twice", dt, emb_op,
          &e, 3, n);
    free(ids); free(tt); free(ord); free(dout);
    cudaFree(e.dout); cudaFree(e.ids); cudaFree(e.tt); cudaFree(e.order);
}

/* ---- the MLM row scatter: distinct rows, one add per element ---- */
struct sc { void *dout; int32_t *rows; int M, C; kdtype dt; };

static void sc_op(float **g, void *ctx)
{
    struct sc *s = ctx;
    cuda_gather_rows_backward_dt(g[0], s->dout, s->rows, s->M, s->C, s->dt, 0);
}

static void test_scatter(void)
{
    struct sc s = {.M = 150, .C = 64, .dt = KDT_F32};
    int N = 1024;
    int32_t rows[150];
    for (int i = 0; i < s.M; i++)
        rows[i] = (int32_t)((i * 677) % N); // distinct, as MLM positions are
    float *dout = host_rand((size_t)s.M * s.C, 1, 0);
    s.dout = dev_from(dout, (size_t)s.M * s.C, KDT_F32);
    s.rows = dev_ints(rows, (size_t)s.M);
    size_t n[1] = {(size_t)N * s.C};
    twice("gather_rows_backward twice", KDT_F32, sc_op, &s, 1, n);
    free(dout);
    cudaFree(s.dout); cudaFree(s.rows);
}

int main(void)
{
    gpu_require_device();
    if (cuda_kernels_init() != 0)
        return 1;
    kdtype dts[2] = {KDT_F32, KDT_F16}; // fp16 runs on every part (bf16 needs sm_80)
    for (int i = 0; i < 2; i++) {
        test_bias(dts[i]);
        test_layernorm(dts[i], 0);
        test_layernorm(dts[i], 1);
        test_embeddings(dts[i], 1);
        test_embeddings(dts[i], 0);
    }
    test_scatter();
    cuda_kernels_shutdown(); /* the CPU stand-in reports device memory left behind */
    printf("%d failure(s)\n", gpu_failures);
    return gpu_failures ? 1 : 0;
}
