/* test_mlm_head_emu — runs the kernels of kernels/cuda/mlm_head.cu (their
 * source, kernels/cuda/mlm_head.cuh) on the CPU under the SIMT emulator of
 * cuda_emu.h and compares them with the CPU ops of kernels/cpu/mlm_head.c on
 * the same rounded inputs: row gather and scatter (the fp32 atomic scatter
 * with repeated rows, the 16-bit one with distinct rows), the fp32
 * softmax cross-entropy twin (losses and probabilities) and its backward, the
 * fused 16-bit form (losses, and the logits overwritten in place by
 * (softmax - onehot) * grad_scale, or left alone when grad_scale is 0), and
 * the single-block sum.
 *
 * Launch geometry as the launchers of mlm_head.cu: grid_for(n, 256) x 256,
 * one XENT_BLOCK block per row, 256 threads per row for the backward, one
 * block of 1024 for the sum. V below, at and above the block size; targets
 * at 0 and V-1. Outputs start NaN with NaN guards. Tolerances as tests/gpu:
 * fp32 1e-5, 16-bit 1e-2; NaN never passes.
 *
 * Shown to fail: with the loss written as `logf(sum) - lt` (the max not
 * subtracted) in xent_kernel, and with `i % C` replaced by `i % M` in
 * gather_rows_kernel, this test fails (checked by hand; both restored).
 */
#include "tests/unit/kernels/cuda_emu.h"

#include "kernels/cuda/mlm_head.cuh"
#include "kernels/kernels.h"

namespace {

using emu::check;
using emu::frand;
using emu::from_t;
using emu::poisoned;
using emu::to_t;

template <typename T> double tol() { return sizeof(T) == 4 ? 1e-5 : 1e-2; }

template <typename T> void rand_t(std::vector<T> &t, std::vector<float> &f, size_t n, float amp)
{
    t.assign(n + emu::GUARD, to_t<T>(NAN));
    f.resize(n);
    for (size_t i = 0; i < n; i++) {
        t[i] = to_t<T>(amp * frand());
        f[i] = from_t(t[i]);
    }
}

/* M distinct rows of N, or (repeats) M draws with at least one repeat */
std::vector<int32_t> pick_rows(int M, int N, bool repeats)
{
    std::vector<int32_t> all(N), rows(M);
    for (int i = 0; i < N; i++)
        all[i] = i;
    for (int i = N - 1; i > 0; i--)
        std::swap(all[i], all[emu::urand() % (uint64_t)(i + 1)]);
    for (int m = 0; m < M; m++)
        rows[m] = repeats ? all[m / 2] : all[m];
    return rows;
}

template <typename T> void gather_case(int N, int M, int C, bool repeats)
{
    printf("--- gather/scatter rows N%d M%d C%d %s rows %s\n", N, M, C,
           repeats ? "repeated" : "distinct", emu::tname<T>());
    size_t n = (size_t)M * C, ni = (size_t)N * C;
    std::vector<int32_t> rows = pick_rows(M, N, repeats);
    std::vector<T> inp, dout, dinp;
    std::vector<float> inpf, doutf, dinpf;
    rand_t(inp, inpf, ni, 1.0f);
    rand_t(dout, doutf, n, 1.0f);
    rand_t(dinp, dinpf, ni, 1.0f); // the scatter adds into it

    std::vector<float> ref(n);
    gather_rows_forward(ref.data(), inpf.data(), rows.data(), M, C);
    auto out = poisoned<T>(n);
    emu::launch(grid_for(n, 256), 256, 0, gather_rows_kernel<T>, out.data(),
                (const T *)inp.data(), (const int32_t *)rows.data(), M, C);
    check("gather_rows_forward (exact)", out, ref, n, 0.0);

    gather_rows_backward(dinpf.data(), doutf.data(), rows.data(), M, C);
    if (std::is_same<T, float>::value)
        emu::launch(grid_for(n, 256), 256, 0, scatter_rows_atomic_kernel, (float *)dinp.data(),
                    (const float *)dout.data(), (const int32_t *)rows.data(), M, C);
    else
        emu::launch(grid_for(n, 256), 256, 0, scatter_rows_kernel<T>, dinp.data(),
                    (const T *)dout.data(), (const int32_t *)rows.data(), M, C);
    check("gather_rows_backward dinp (+=)", dinp, dinpf, ni, tol<T>());
}

void xent_twin_case(int M, int V)
{
    printf("--- crossentropy_softmax (fp32 twin) M%d V%d\n", M, V);
    size_t n = (size_t)M * V;
    std::vector<float> logits(n);
    for (float &x : logits)
        x = 8.0f * frand();
    std::vector<int32_t> tg(M);
    for (int m = 0; m < M; m++)
        tg[m] = m == 0 ? 0 : m == 1 ? V - 1 : (int32_t)(emu::urand() % (uint64_t)V);
    std::vector<float> rl(M), rp(n);
    crossentropy_softmax_forward(rl.data(), rp.data(), logits.data(), tg.data(), M, V);
    auto losses = poisoned<float>(M), probs = poisoned<float>(n);
    std::vector<float> lg = logits;
    emu::launch(M, XENT_BLOCK, 0, xent_kernel<float, true, false>, losses.data(), probs.data(),
                lg.data(), (const int32_t *)tg.data(), 0.0f, V, V);
    check("xent forward losses", losses, rl, M, 1e-5);
    check("xent forward probs", probs, rp, n, 1e-5);
    bool same = memcmp(lg.data(), logits.data(), n * sizeof(float)) == 0;
    printf("%-4s xent forward leaves the logits alone\n", same ? "ok" : "FAIL");
    emu::failures += !same;

    std::vector<float> dl(M);
    for (float &x : dl)
        x = frand();
    std::vector<float> rd(n);
    crossentropy_softmax_backward(rd.data(), rp.data(), tg.data(), dl.data(), M, V);
    auto d = poisoned<float>(n);
    emu::launch(M, 256, 0, xent_backward_kernel, d.data(), (const float *)rp.data(),
                (const int32_t *)tg.data(), (const float *)dl.data(), V);
    check("xent backward dlogits", d, rd, n, 1e-5);
}

template <typename T> void xent_fused_case(int M, int V, float grad_scale)
{
    printf("--- mlm_xent_fused M%d V%d grad_scale %g %s\n", M, V, grad_scale, emu::tname<T>());
    size_t n = (size_t)M * V;
    std::vector<T> lg;
    std::vector<float> lf;
    rand_t(lg, lf, n, 8.0f);
    std::vector<int32_t> tg(M);
    for (int m = 0; m < M; m++)
        tg[m] = m == 0 ? V - 1 : m == 1 ? 0 : (int32_t)(emu::urand() % (uint64_t)V);
    std::vector<float> rl(M), rp(n), rd(n), dl(M, grad_scale);
    crossentropy_softmax_forward(rl.data(), rp.data(), lf.data(), tg.data(), M, V);
    crossentropy_softmax_backward(rd.data(), rp.data(), tg.data(), dl.data(), M, V);

    auto losses = poisoned<float>(M);
    std::vector<T> before = lg;
    if (grad_scale != 0.0f)
        emu::launch(M, XENT_BLOCK, 0, xent_kernel<T, false, true>, losses.data(),
                    (float *)nullptr, lg.data(), (const int32_t *)tg.data(), grad_scale, V, V);
    else
        emu::launch(M, XENT_BLOCK, 0, xent_kernel<T, false, false>, losses.data(),
                    (float *)nullptr, lg.data(), (const int32_t *)tg.data(), 0.0f, V, V);
    check("fused losses (fp32 math on the same inputs)", losses, rl, M, 1e-5);
    if (grad_scale != 0.0f) {
        check("fused dlogits (in place)", lg, rd, n, tol<T>());
    } else {
        bool same = memcmp(lg.data(), before.data(), lg.size() * sizeof(T)) == 0;
        printf("%-4s fused with grad_scale 0 leaves the logits alone\n", same ? "ok" : "FAIL");
        emu::failures += !same;
    }
}

/* A vocabulary padded to ld > V (lever CUDA_LEVER_VOCAB_PAD): the padding
 * columns hold a large value that would dominate the softmax if it were
 * read; losses and the real gradient columns must equal the unpadded
 * kernel's bit for bit, and the padding columns must come back 0. */
template <typename T> void xent_padded_case(int M, int V, int ld, float grad_scale)
{
    printf("--- mlm_xent_fused padded M%d V%d ld%d %s\n", M, V, ld, emu::tname<T>());
    size_t n = (size_t)M * V;
    std::vector<T> lg;
    std::vector<float> lf;
    rand_t(lg, lf, n, 8.0f);
    std::vector<int32_t> tg(M);
    for (int m = 0; m < M; m++)
        tg[m] = m == 0 ? V - 1 : (int32_t)(emu::urand() % (uint64_t)V);
    std::vector<T> pad((size_t)M * ld, from_f<T>(1000.0f));
    for (int m = 0; m < M; m++)
        memcpy(&pad[(size_t)m * ld], &lg[(size_t)m * V], V * sizeof(T));
    auto l1 = poisoned<float>(M), l2 = poisoned<float>(M);
    emu::launch(M, XENT_BLOCK, 0, xent_kernel<T, false, true>, l1.data(), (float *)nullptr,
                lg.data(), (const int32_t *)tg.data(), grad_scale, V, V);
    emu::launch(M, XENT_BLOCK, 0, xent_kernel<T, false, true>, l2.data(), (float *)nullptr,
                pad.data(), (const int32_t *)tg.data(), grad_scale, V, ld);
    size_t bad_loss = 0, bad_real = 0, bad_pad = 0;
    for (int m = 0; m < M; m++) {
        bad_loss += memcmp(&l1[m], &l2[m], sizeof(float)) != 0;
        bad_real += memcmp(&lg[(size_t)m * V], &pad[(size_t)m * ld], V * sizeof(T)) != 0;
        for (int v = V; v < ld; v++)
            bad_pad += to_f(pad[(size_t)m * ld + v]) != 0.0f;
    }
    bool ok = bad_loss == 0 && bad_real == 0 && bad_pad == 0;
    printf("%-4s padded rows: losses and real gradients as unpadded, padding zeroed "
           "(%zu/%zu/%zu differ)\n", ok ? "ok" : "FAIL", bad_loss, bad_real, bad_pad);
    emu::failures += !ok;
}

void sum_case(int n)
{
    printf("--- sum n%d\n", n);
    std::vector<float> x(n);
    double s = 0.0;
    for (float &v : x) {
        v = frand();
        s += v;
    }
    auto out = poisoned<float>(1);
    emu::launch(1, 1024, 0, sum_kernel, out.data(), (const float *)x.data(), n);
    std::vector<double> ref{s};
    check("sum (one block, double partials)", out, ref, 1, 1e-6);
}

template <typename T> void run_type()
{
    gather_case<T>(30, 13, 40, false);
    if (std::is_same<T, float>::value)
        gather_case<T>(30, 14, 37, true); // colliding atomics
    xent_fused_case<T>(3, 517, 0.37f);    // V above the block
    xent_fused_case<T>(3, 37, 1.0f);      // V below a block: idle threads
    xent_fused_case<T>(2, 512, 0.0f);     // V the block; loss only
    xent_padded_case<T>(3, 517, 576, 0.37f); // V above the block, padded to 64
    xent_padded_case<T>(2, 37, 64, 1.0f);    // V below a block
}

} // namespace

int main()
{
    run_type<float>();
    run_type<__nv_bfloat16>();
    run_type<__half>();
    xent_twin_case(3, 517);
    xent_twin_case(2, 31);
    sum_case(1);
    sum_case(3001);
    printf("%d failure(s)\n", emu::failures);
    return emu::failures ? 1 : 0;
}
