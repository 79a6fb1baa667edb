/* test_layernorm_emu — runs the kernels of kernels/cuda/layernorm.cu (their
 * source, kernels/cuda/layernorm.cuh) on the CPU under the SIMT emulator of
 * cuda_emu.h and compares them with the CPU ops of kernels/cpu on the same
 * rounded inputs: LayerNorm forward/backward, the fused residual + dropout +
 * LayerNorm forward/backward (against dropout_forward + residual_forward +
 * layernorm_forward and residual sum + layernorm_backward + dropout_backward),
 * and the embedding sum forward/backward, in fp32, bf16 and fp16.
 *
 * Launch geometry is the launchers' own (LN_BLOCK, ln_grid, grid_for from the
 * .cuh); the backward grid cap, which the launcher takes from the SM count,
 * is set to 4 blocks here so the grid-stride loop runs. Shapes are small and
 * odd: C below, at and off a multiple of the warp, rows not a multiple of the
 * warps per block. Outputs start NaN with NaN guards after them; parameter
 * gradients start random (they are +=). Tolerances as tests/gpu: fp32 1e-5,
 * 16-bit 1e-2 (normwise relative); the fp32 parameter gradients 1e-5 in
 * every type (sums of the same rounded values). NaN never passes.
 *
 * The parameter gradients are run twice (the emulator shuffles block and
 * thread order on every launch) and must come out bit-identical.
 *
 * Every case runs with the plain row kernels, and again with the packed ones
 * of the lever CUDA_LEVER_LN_VEC where C fits their packs ("packed rows").
 * The packed pass runs only what the lever changes: the row kernels
 * (forward; backward's dinp, dres, dy) of the cases whose C fits. The
 * parameter-gradient kernels and the embedding kernels have no packed form
 * (the same launches on the same shapes as the plain pass), and a case
 * whose C does not fit runs the plain row kernels again, so those repeat
 * nothing that could fail differently; left out, they halve the run
 * (the parameter gradients' 32 x 256-thread column blocks are most of it).
 *
 * Shown to fail: with `base + c` replaced by `base + c + 1` in the dropout
 * index of layernorm_forward_kernel, and with the dweight partial
 * `sw += xhat * g` changed to `sw += g`, this test fails (checked by hand;
 * both restored); so does the packed pass with layernorm_backward_vec_kernel's
 * dinp scaled by 1.05.
 */
#include "tests/unit/kernels/cuda_emu.h"

#include "kernels/cuda/layernorm.cuh"
#include "kernels/kernels.h"

namespace {

using emu::check;
using emu::frand;
using emu::from_t;
using emu::poisoned;
using emu::to_t;

constexpr float EPS = 1e-12f;
constexpr int BWD_MAX_BLOCKS = 4; // the launcher's 4 * SM count, for 1 SM

template <typename T> double tol() { return sizeof(T) == 4 ? 1e-5 : 1e-2; }

/* n random elements of T, and their values as float (what the CPU sees) */
template <typename T> void rand_t(std::vector<T> &t, std::vector<float> &f, size_t n, float amp = 1)
{
    t.assign(n + emu::GUARD, to_t<T>(NAN));
    f.resize(n);
    for (size_t i = 0; i < n; i++) {
        t[i] = to_t<T>(amp * frand());
        f[i] = from_t(t[i]);
    }
}
std::vector<float> rand_f(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (float &x : v)
        x = lo + (hi - lo) * 0.5f * (frand() + 1.0f);
    return v;
}

/* The speed lever CUDA_LEVER_LN_VEC as the launchers read it: the packed
 * row kernels where they fit (main runs every case with it off and on). */
bool g_vec = false;

/* ---- the launchers of layernorm.cu, with emu::launch for <<<>>> ---- */
template <typename T, bool RES>
void ln_forward(T *out, T *res, float *mean, float *rstd, const T *x, const T *y,
                const philox_stream *rng, float p, const float *w, const float *b, int N, int C)
{
    drop_args d = RES ? make_drop(rng, p) : drop_args{};
    if (g_vec && ln_vec_fits<T>(C, out, res, x, y))
        emu::launch(ln_grid(N, 1 << 20), LN_BLOCK, 0, layernorm_forward_vec_kernel<T, RES>, out,
                    res, mean, rstd, x, y, d, w, b, N, C, EPS);
    else
        emu::launch(ln_grid(N, 1 << 20), LN_BLOCK, 0, layernorm_forward_kernel<T, RES>, out, res,
                    mean, rstd, x, y, d, w, b, N, C, EPS);
}

template <typename T, bool FUSED>
void ln_backward(T *dinp, T *dy, float *dw, float *db, const T *dout, const T *dout2,
                 const T *inp, const float *w, const float *mean, const float *rstd,
                 const philox_stream *rng, float p, int N, int C)
{
    drop_args d = FUSED ? make_drop(rng, p) : drop_args{};
    if (g_vec && ln_vec_fits<T>(C, dinp, dy, dout, dout2, inp))
        emu::launch(ln_grid(N, BWD_MAX_BLOCKS), LN_BLOCK, 0, layernorm_backward_vec_kernel<T, FUSED>,
                    dinp, dy, dout, dout2, inp, w, mean, rstd, d, N, C);
    else
        emu::launch(ln_grid(N, BWD_MAX_BLOCKS), LN_BLOCK, 0, layernorm_backward_kernel<T, FUSED>,
                    dinp, dy, dout, dout2, inp, w, mean, rstd, d, N, C);
    if (g_vec)
        return; /* the parameter gradients: no packed form, run by the plain pass */
    std::vector<float> partial(2 * (size_t)COLSUM_CHUNKS * C);
    emu::launch(dim3((C + 31) / 32, COLSUM_CHUNKS), dim3(32, COLSUM_PHASES), 0,
                layernorm_param_backward_kernel<T>, partial.data(), dout, dout2, inp, mean, rstd,
                N, C);
    emu::launch((C + 255) / 256, 256, 0, colsum_finish_kernel, dw, db,
                (const float *)partial.data(), C);
}

/* The embedding backward as cuda_embeddings_backward_ordered_dt launches it */
template <typename T>
void emb_backward(float *dwte, float *dwpe, float *dwtt, const T *dout, const int32_t *inp,
                  const int32_t *tt, int B, int T_, int C, int V, int TV)
{
    int BT = B * T_;
    std::vector<int32_t> order((size_t)BT), seg((size_t)BT + 1);
    int U = emb_order(order.data(), seg.data(), inp, BT, V);
    if (U <= 0)
        emu::fail("emb_order");
    emu::launch(dim3((unsigned)U, (unsigned)(C + EMB_COLS - 1) / EMB_COLS), dim3(32, EMB_PHASES),
                0, embeddings_wte_backward_kernel<T>, dwte, dout, inp,
                (const int32_t *)order.data(), (const int32_t *)seg.data(), C);
    emu::launch(dim3((unsigned)T_, (unsigned)(C + 31) / 32), dim3(32, EMB_PHASES), 0,
                embeddings_wpe_backward_kernel<T>, dwpe, dout, B, T_, C);
    emu::launch(dim3((unsigned)TV, (unsigned)(C + 31) / 32), dim3(32, TT_PHASES), 0,
                embeddings_wtt_backward_kernel<T>, dwtt, dout, tt, BT, C);
}

template <typename T> void layernorm_case(int N, int C)
{
    if (g_vec && C % pack<T>::n)
        return; /* the plain row kernels again: the plain pass ran them */
    printf("--- layernorm N%d C%d %s%s\n", N, C, emu::tname<T>(),
           g_vec && C % pack<T>::n == 0 ? " (packed rows)" : "");
    size_t n = (size_t)N * C;
    std::vector<T> x, dout;
    std::vector<float> xf, doutf;
    rand_t(x, xf, n, 2.0f);
    rand_t(dout, doutf, n);
    std::vector<float> w = rand_f(C, 0.5f, 1.5f), b = rand_f(C, -0.5f, 0.5f);
    std::vector<float> dw0 = rand_f(C, -1, 1), db0 = rand_f(C, -1, 1);

    std::vector<float> ref(n), rmean(N), rrstd(N), rdinp(n), rdw = dw0, rdb = db0;
    layernorm_forward(ref.data(), rmean.data(), rrstd.data(), xf.data(), w.data(), b.data(), N,
                      C, EPS);
    layernorm_backward(rdinp.data(), rdw.data(), rdb.data(), doutf.data(), xf.data(), w.data(),
                       rmean.data(), rrstd.data(), N, C);

    auto out = poisoned<T>(n), dinp = poisoned<T>(n);
    auto mean = poisoned<float>(N), rstd = poisoned<float>(N);
    ln_forward<T, false>(out.data(), nullptr, mean.data(), rstd.data(), x.data(), nullptr,
                         nullptr, 0.0f, w.data(), b.data(), N, C);
    check("layernorm_forward out", out, ref, n, tol<T>());
    check("layernorm_forward mean", mean, rmean, N, 1e-5);
    check("layernorm_forward rstd", rstd, rrstd, N, 1e-5);

    auto dw = poisoned<float>(C), db = poisoned<float>(C);
    std::copy(dw0.begin(), dw0.end(), dw.begin());
    std::copy(db0.begin(), db0.end(), db.begin());
    ln_backward<T, false>(dinp.data(), nullptr, dw.data(), db.data(), dout.data(), nullptr,
                          x.data(), w.data(), rmean.data(), rrstd.data(), nullptr, 0.0f, N, C);
    check("layernorm_backward dinp", dinp, rdinp, n, tol<T>());
    if (g_vec)
        return; /* the parameter gradients: the plain pass */
    check("layernorm_backward dweight (+=)", dw, rdw, C, 1e-5);
    check("layernorm_backward dbias (+=)", db, rdb, C, 1e-5);
    /* a second run (other block and thread orders) gives the same bits */
    auto dw2 = poisoned<float>(C), db2 = poisoned<float>(C);
    std::copy(dw0.begin(), dw0.end(), dw2.begin());
    std::copy(db0.begin(), db0.end(), db2.begin());
    ln_backward<T, false>(dinp.data(), nullptr, dw2.data(), db2.data(), dout.data(), nullptr,
                          x.data(), w.data(), rmean.data(), rrstd.data(), nullptr, 0.0f, N, C);
    bool same = !memcmp(dw.data(), dw2.data(), C * 4) && !memcmp(db.data(), db2.data(), C * 4);
    printf("%s layernorm_backward dweight/dbias twice: %s\n", same ? "ok  " : "FAIL",
           same ? "bit-identical" : "the bits differ");
    emu::failures += !same;
}

template <typename T> void fused_case(int N, int C, float p, bool two_grads)
{
    if (g_vec && C % pack<T>::n)
        return; /* the plain row kernels again: the plain pass ran them */
    printf("--- residual_dropout_layernorm N%d C%d p%.1f dout2 %s %s%s\n", N, C, p,
           two_grads ? "yes" : "no", emu::tname<T>(),
           g_vec && C % pack<T>::n == 0 ? " (packed rows)" : "");
    size_t n = (size_t)N * C;
    philox_stream rs;
    philox_stream_init(&rs, 77, 0, 5, 2, 3, DROPOUT_SITE_FFN_OUT);
    const philox_stream *rng = p > 0 ? &rs : nullptr;
    std::vector<T> x, y, dout, dout2;
    std::vector<float> xf, yf, doutf, dout2f;
    rand_t(x, xf, n, 2.0f);
    rand_t(y, yf, n);
    rand_t(dout, doutf, n);
    rand_t(dout2, dout2f, n);
    std::vector<float> w = rand_f(C, 0.5f, 1.5f), b = rand_f(C, -0.5f, 0.5f);
    std::vector<float> dw0 = rand_f(C, -1, 1), db0 = rand_f(C, -1, 1);

    /* the unfused CPU composition */
    std::vector<float> yd(n), res(n), ref(n), rmean(N), rrstd(N);
    dropout_forward(yd.data(), yf.data(), rng, p, n);
    residual_forward(res.data(), xf.data(), yd.data(), n);
    layernorm_forward(ref.data(), rmean.data(), rrstd.data(), res.data(), w.data(), b.data(), N,
                      C, EPS);

    auto out = poisoned<T>(n), resg = poisoned<T>(n);
    auto mean = poisoned<float>(N), rstd = poisoned<float>(N);
    ln_forward<T, true>(out.data(), resg.data(), mean.data(), rstd.data(), x.data(), y.data(),
                        rng, p, w.data(), b.data(), N, C);
    check("fused fwd res", resg, res, n, tol<T>());
    check("fused fwd out", out, ref, n, tol<T>());
    check("fused fwd mean", mean, rmean, N, tol<T>());
    check("fused fwd rstd", rstd, rrstd, N, tol<T>());

    /* backward on the kernel's own res (rounded) with the CPU statistics of it */
    std::vector<float> resf(n), g(n), rdres(n), rdy(n), rdw = dw0, rdb = db0;
    for (size_t i = 0; i < n; i++)
        resf[i] = from_t(resg[i]);
    layernorm_forward(ref.data(), rmean.data(), rrstd.data(), resf.data(), w.data(), b.data(), N,
                      C, EPS);
    if (two_grads)
        residual_forward(g.data(), doutf.data(), dout2f.data(), n);
    else
        g = doutf;
    layernorm_backward(rdres.data(), rdw.data(), rdb.data(), g.data(), resf.data(), w.data(),
                       rmean.data(), rrstd.data(), N, C);
    dropout_backward(rdy.data(), rdres.data(), rng, p, n);

    auto dres = poisoned<T>(n), dy = poisoned<T>(n);
    auto dw = poisoned<float>(C), db = poisoned<float>(C);
    std::copy(dw0.begin(), dw0.end(), dw.begin());
    std::copy(db0.begin(), db0.end(), db.begin());
    ln_backward<T, true>(dres.data(), dy.data(), dw.data(), db.data(), dout.data(),
                         two_grads ? dout2.data() : nullptr, resg.data(), w.data(), rmean.data(),
                         rrstd.data(), rng, p, N, C);
    check("fused bwd dres", dres, rdres, n, tol<T>());
    check("fused bwd dy", dy, rdy, n, tol<T>());
    if (g_vec)
        return; /* the parameter gradients: the plain pass */
    check("fused bwd dweight (+=)", dw, rdw, C, 1e-5);
    check("fused bwd dbias (+=)", db, rdb, C, 1e-5);
}

template <typename T> void embeddings_case(int B, int T_, int C, int V)
{
    if (g_vec)
        return; /* no packed form: the plain pass ran these kernels */
    printf("--- embeddings B%d T%d C%d V%d %s\n", B, T_, C, V, emu::tname<T>());
    int BT = B * T_;
    size_t n = (size_t)BT * C;
    std::vector<int32_t> inp(BT), tt(BT);
    for (int i = 0; i < BT; i++) {
        inp[i] = (int32_t)(emu::urand() % (uint64_t)V); // repeats: runs of several rows
        tt[i] = (int32_t)(emu::urand() % 2);
    }
    std::vector<float> wte = rand_f((size_t)V * C, -1, 1), wpe = rand_f((size_t)T_ * C, -1, 1),
                       wtt = rand_f(2 * (size_t)C, -1, 1);
    std::vector<float> ref(n);
    embeddings_forward(ref.data(), inp.data(), tt.data(), wte.data(), wpe.data(), wtt.data(), B,
                       T_, C);
    auto out = poisoned<T>(n);
    emu::launch(grid_for(n, 256), 256, 0, embeddings_forward_kernel<T>, out.data(), inp.data(),
                tt.data(), wte.data(), wpe.data(), wtt.data(), BT, T_, C);
    check("embeddings_forward out", out, ref, n, tol<T>());

    std::vector<T> dout;
    std::vector<float> doutf;
    rand_t(dout, doutf, n);
    std::vector<float> g0 = rand_f(((size_t)V + T_ + 2) * C, -1, 1);
    std::vector<float> rg = g0;
    float *rwte = rg.data(), *rwpe = rwte + (size_t)V * C, *rwtt = rwpe + (size_t)T_ * C;
    embeddings_backward(rwte, rwpe, rwtt, doutf.data(), inp.data(), tt.data(), B, T_, C);
    auto gg = poisoned<float>(g0.size());
    std::copy(g0.begin(), g0.end(), gg.begin());
    float *gwte = gg.data(), *gwpe = gwte + (size_t)V * C, *gwtt = gwpe + (size_t)T_ * C;
    emb_backward<T>(gwte, gwpe, gwtt, dout.data(), inp.data(), tt.data(), B, T_, C, V, 2);
    check("embeddings_backward dwte|dwpe|dwtt (+=)", gg, rg, g0.size(), 1e-5);
    /* a second run (other block and thread orders) gives the same bits */
    auto g2 = poisoned<float>(g0.size());
    std::copy(g0.begin(), g0.end(), g2.begin());
    float *hwte = g2.data(), *hwpe = hwte + (size_t)V * C, *hwtt = hwpe + (size_t)T_ * C;
    emb_backward<T>(hwte, hwpe, hwtt, dout.data(), inp.data(), tt.data(), B, T_, C, V, 2);
    bool same = memcmp(gg.data(), g2.data(), g0.size() * sizeof(float)) == 0;
    printf("%s embeddings_backward twice: %s\n", same ? "ok  " : "FAIL",
           same ? "bit-identical" : "the bits differ");
    emu::failures += !same;
}

template <typename T> void run_type()
{
    layernorm_case<T>(19, 40); // 3 forward blocks, C off the warp
    layernorm_case<T>(37, 7);  // C below a warp; backward grid-strides (4 blocks x 8 rows)
    fused_case<T>(37, 64, 0.1f, true);
    fused_case<T>(5, 33, 0.1f, false);
    fused_case<T>(9, 32, 0.0f, true); // no dropout
    embeddings_case<T>(3, 7, 40, 5);  // 840 elements: 4 blocks
}

} // namespace

int main()
{
    for (int vec = 0; vec <= 1; vec++) {
        g_vec = vec;
        run_type<float>();
        run_type<__nv_bfloat16>();
        run_type<__half>();
    }
    printf("%d failure(s)\n", emu::failures);
    return emu::failures ? 1 : 0;
}
