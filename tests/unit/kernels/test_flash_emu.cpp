/* test_flash_emu — runs the flash-attention CUDA kernels' own source
 * (kernels/cuda/flash_attention.cuh) on the CPU, under a small SIMT emulator,
 * and compares forward and backward with the CPU attention op. No GPU here:
 * this is the only execution those lines get before a GPU run.
 *
 * The emulator (tests/unit/kernels/cuda_emu.h, shared with the other
 * test_*_emu tests): every CUDA thread of a block is an OS thread, barriers
 * for __syncthreads/__syncwarp (no lockstep), shuffles through per-warp
 * slots, NaN-filled dynamic shared memory with a canary tail, wmma at its
 * documented interface (alignment and ldm rules checked, lane 0 stores).
 * Global outputs start as NaN with NaN guards after their ends.
 *
 * What it cannot check: real wmma fragment mechanics, memory-model effects
 * of real hardware, performance. Tolerances as in tests/gpu (fp32 1e-5;
 * 16-bit 1e-2 forward, 2e-2 backward), against kernels/cpu/attention.c on the
 * rounded inputs.
 */
#include "tests/unit/kernels/cuda_emu.h"

#include "kernels/cuda/flash_attention.cuh"
#include "kernels/kernels.h"

namespace {

using emu::check;
using emu::frand;
using emu::from_t;
using emu::GUARD;
using emu::launch;
using emu::to_t;

flash::flash_args make_args(const philox_stream *rng, float p, int B, int T, int C, int NH)
{
    flash::flash_args a;
    a.B = B;
    a.T = T;
    a.C = C;
    a.NH = NH;
    a.scale = (float)(1.0 / sqrt((double)(C / NH)));
    a.drop = rng && p > 0.0f;
    a.rng = a.drop ? philox_dev_from(rng) : philox_dev{};
    a.thresh = dropout_threshold(p);
    a.keep_scale = a.drop ? (float)(1.0 / (1.0 - (double)p)) : 1.0f;
    return a;
}

/* the launchers of flash_attention.cu, with launch() for <<<>>> */
template <typename T, int HS>
void run_forward(T *out, float *lse, const T *qkv, const int32_t *lens,
                 const flash::flash_args &a)
{
    typedef flash::flash_cfg<T, HS> F;
    typedef flash::fwd_smem<T, HS, F::FWD_NW, F::FWD_BC> L;
    dim3 grid((unsigned)(a.B * a.NH), (unsigned)((a.T + L::BR - 1) / L::BR));
    launch(grid, F::FWD_NW * 32, L::bytes, flash::flash_forward_kernel<T, HS, F::FWD_NW, F::FWD_BC>,
           out, lse, qkv, lens, a);
}

template <typename T, int HS>
void run_backward(T *dqkv, float *dbuf, const T *dout, const T *qkv, const T *out,
                  const float *lse, const int32_t *lens, const flash::flash_args &a)
{
    typedef flash::flash_cfg<T, HS> F;
    typedef flash::dq_smem<T, HS, F::DQ_NW, F::DQ_BC> LQ;
    typedef flash::dkv_smem<T, HS, F::KV_NW, F::KV_BRQ> LK;
    dim3 gq((unsigned)(a.B * a.NH), (unsigned)((a.T + LQ::BR - 1) / LQ::BR));
    launch(gq, F::DQ_NW * 32, LQ::bytes,
           flash::flash_backward_dq_kernel<T, HS, F::DQ_NW, F::DQ_BC>, dqkv, dbuf, dout, qkv, out,
           lse, lens, a);
    dim3 gk((unsigned)(a.B * a.NH), (unsigned)((a.T + LK::BK - 1) / LK::BK));
    launch(gk, F::KV_NW * 32, LK::bytes,
           flash::flash_backward_dkv_kernel<T, HS, F::KV_NW, F::KV_BRQ>, dqkv, dout, qkv, lse,
           dbuf, lens, a);
}

template <typename T, int HS>
void run_case(int B, int T_, int NH, std::vector<int32_t> lens, float p)
{
    int C = NH * HS;
    size_t N = (size_t)B * T_, nq = N * 3 * C, nc = N * C, nl = (size_t)B * NH * T_,
           na = (size_t)B * NH * T_ * T_;
    philox_stream rs;
    philox_stream_init(&rs, 4242, 1, 31, 1, 3, DROPOUT_SITE_ATTN_PROBS);
    const philox_stream *r = p > 0 ? &rs : nullptr;
    printf("--- B%d T%d NH%d hs%d p%.1f lens", B, T_, NH, HS, p);
    for (int32_t l : lens)
        printf(" %d", l);
    printf("\n");

    std::vector<T> qkv(nq), dy(nc);
    std::vector<float> qkvf(nq), dyf(nc);
    for (size_t i = 0; i < nq; i++) {
        qkv[i] = to_t<T>(frand());
        qkvf[i] = from_t(qkv[i]); // the CPU sees exactly the rounded inputs
    }
    for (size_t i = 0; i < nc; i++) {
        dy[i] = to_t<T>(frand());
        dyf[i] = from_t(dy[i]);
    }
    std::vector<float> ref(nc), att(na), dref(nq), datt(na);
    attention_forward(ref.data(), att.data(), qkvf.data(), lens.data(), r, p, B, T_, C, NH);
    attention_backward(dref.data(), datt.data(), dyf.data(), qkvf.data(), att.data(), lens.data(),
                       r, p, B, T_, C, NH);

    const T nan_t = to_t<T>(NAN);
    std::vector<T> out(nc + GUARD, nan_t), dqkv(nq + GUARD, nan_t);
    std::vector<float> lse(nl + GUARD, NAN), dbuf(nl + GUARD, NAN);
    flash::flash_args a = make_args(r, p, B, T_, C, NH);
    run_forward<T, HS>(out.data(), lse.data(), qkv.data(), lens.data(), a);
    bool is32 = sizeof(T) == 4;
    check("forward out vs CPU", out, ref, nc, is32 ? 1e-5 : 1e-2);
    /* lse against the CPU's probabilities: exp(scale q.k - lse) = P */
    std::vector<float> pr(na, 0.0f);
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, len = std::min(std::max((int)lens[b], 1), T_);
        for (int i = 0; i < T_; i++)
            for (int j = 0; j < len; j++) {
                double s = 0;
                for (int c = 0; c < HS; c++)
                    s += (double)qkvf[((size_t)b * T_ + i) * 3 * C + (size_t)h * HS + c] *
                         qkvf[((size_t)b * T_ + j) * 3 * C + C + (size_t)h * HS + c];
                pr[((size_t)bh * T_ + i) * T_ + j] =
                    (float)exp(s * (double)a.scale - (double)lse[(size_t)bh * T_ + i]);
            }
    }
    std::vector<float> prg(na + GUARD, NAN);
    std::copy(pr.begin(), pr.end(), prg.begin());
    check("forward lse: exp(s - lse) vs CPU probs", prg, att, na, 1e-5);
    check("forward lse guard", lse, std::vector<float>(lse.begin(), lse.begin() + nl), nl, 0.0);

    run_backward<T, HS>(dqkv.data(), dbuf.data(), dy.data(), qkv.data(), out.data(), lse.data(),
                        lens.data(), a);
    check("backward dqkv vs CPU", dqkv, dref, nq, is32 ? 1e-5 : 2e-2);
}

template <typename T>
void run_type()
{
    run_case<T, 32>(3, 13, 2, {13, 8, 1}, 0.1f); // odd T, unaligned Philox, a 1-key row
    run_case<T, 64>(2, 70, 1, {70, 33}, 0.1f);   // partly and wholly masked key tiles
    run_case<T, 128>(2, 37, 1, {37, 20}, 0.1f);  // head dim 128 (narrower tiles)
    run_case<T, 64>(1, 128, 2, {97}, 0.0f);      // no dropout, several query tiles
}

} // namespace

int main()
{
    run_type<float>();
    run_type<__nv_bfloat16>();
    run_type<__half>();
    run_case<__nv_bfloat16, 64>(1, 512, 1, {389}, 0.1f); // the longest T
    printf("%d failure(s)\n", emu::failures);
    return emu::failures ? 1 : 0;
}
