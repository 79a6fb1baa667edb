/* test_flash_emu — runs the flash-attention CUDA kernels' own source
 * (kernels/cuda/flash_attention.cuh) on the CPU, under a small SIMT emulator,
 * and compares forward and backward with the CPU attention op. No GPU here:
 * this is the only execution those lines get before a GPU run.
 *
 * The emulator: every CUDA thread of a block is an OS thread; __syncthreads
 * is a barrier over the block and __syncwarp one over the warp (the threads
 * do NOT run in lockstep, so code that relies on implicit warp synchrony
 * fails here instead of passing by luck); __shfl_xor_sync exchanges through
 * a per-warp slot array between two warp barriers; the dynamic shared memory
 * is a fresh heap block filled with 0xFF (NaN in every float type, so a read
 * of shared memory nobody wrote poisons the result) with a canary tail that
 * must survive (no write past the layout's size). wmma is emulated at its
 * documented interface: a fragment holds the whole 16x16 tile in every lane
 * (the hardware layout is opaque anyway), load/store check the alignment and
 * ldm rules (32-byte pointers, 16-byte leading dimensions), mma accumulates
 * in fp32, and only lane 0 stores (visibility to the other lanes then needs
 * the kernel's own __syncwarp, as on hardware).
 * Global outputs start as NaN with NaN guards after their ends.
 *
 * What it cannot check: real wmma fragment mechanics, memory-model effects
 * of real hardware, performance. Tolerances as in tests/gpu (fp32 1e-5;
 * 16-bit 1e-2 forward, 2e-2 backward), against kernels/cpu/attention.c on the
 * rounded inputs.
 */
#define FLASH_EMU 1

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace emu {

struct barrier {
    std::mutex m;
    std::condition_variable cv;
    int n = 0, count = 0;
    unsigned long gen = 0;
    void wait()
    {
        std::unique_lock<std::mutex> lk(m);
        unsigned long g = gen;
        if (++count == n) {
            count = 0;
            gen++;
            cv.notify_all();
            return;
        }
        cv.wait(lk, [&] { return gen != g; });
    }
};

struct warp_state {
    barrier bar;
    double xch[32];
};

struct block_state {
    barrier bar;
    std::vector<warp_state> warps;
    unsigned char *smem = nullptr;
};

thread_local uint3 t_thread, t_block;
thread_local dim3 t_bdim;
thread_local block_state *t_blk;

inline warp_state &warp() { return t_blk->warps[t_thread.x / 32]; }

int failures = 0;
void fail(const char *what)
{
    fprintf(stderr, "emulator: %s\n", what);
    abort(); // a broken rule is a kernel bug: stop at it
}

} // namespace emu

#define threadIdx (emu::t_thread)
#define blockIdx (emu::t_block)
#define blockDim (emu::t_bdim)

inline void __syncthreads() { emu::t_blk->bar.wait(); }
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    if (mask != 0xffffffffu)
        emu::fail("__syncwarp with a partial mask");
    emu::warp().bar.wait();
}
template <typename V>
inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask)
{
    if (mask != 0xffffffffu)
        emu::fail("__shfl_xor_sync with a partial mask");
    emu::warp_state &w = emu::warp();
    int lane = (int)(emu::t_thread.x & 31);
    w.xch[lane] = (double)v;
    w.bar.wait();
    V r = (V)w.xch[lane ^ lane_mask];
    w.bar.wait();
    return r;
}
inline unsigned __umulhi(unsigned a, unsigned b)
{
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline void __trap() { emu::fail("__trap"); }

/* ---- wmma at its documented interface ---- */
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    float x[256]; // (16,16) row-major, the same in every lane
};

inline float elem_f(float v) { return v; }
inline float elem_f(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float elem_f(__half v) { return __half2float(v); }

inline void check_ptr(const void *p, unsigned ldm, size_t esize)
{
    if ((uintptr_t)p % 32)
        emu::fail("wmma pointer not 256-bit aligned");
    if ((ldm * esize) % 16)
        emu::fail("wmma ldm not a multiple of 16 bytes");
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm)
{
    check_ptr(p, ldm, sizeof(T));
    const bool col = std::is_same<Layout, col_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = elem_f(col ? p[c * ldm + r] : p[r * ldm + c]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t l)
{
    check_ptr(p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v)
{
    for (float &e : f.x)
        e = v;
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
              const fragment<matrix_a, 16, 16, 16, T, LA> &a,
              const fragment<matrix_b, 16, 16, 16, T, LB> &b,
              const fragment<accumulator, 16, 16, 16, float> &c)
{
    float out[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r * 16 + n];
            for (int k = 0; k < 16; k++)
                s += a.x[r * 16 + k] * b.x[k * 16 + n];
            out[r * 16 + n] = s;
        }
    memcpy(d.x, out, sizeof out);
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t l)
{
    check_ptr(p, ldm, 4);
    if ((emu::t_thread.x & 31) != 0)
        return; // lane 0 writes; the kernel's __syncwarp publishes it
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}
} // namespace wmma
} // namespace nvcuda

#define FLASH_SMEM(name) unsigned char *name = emu::t_blk->smem
#undef __launch_bounds__
#define __launch_bounds__(...)
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/kernels.h"

namespace {

constexpr size_t CANARY = 256;

/* Runs kern over grid with `threads` threads per block and `smem` bytes of
 * dynamic shared memory, one block at a time. */
template <typename K, typename... A>
void launch(dim3 grid, int threads, size_t smem, K kern, A... args)
{
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            emu::block_state blk;
            blk.bar.n = threads;
            blk.warps = std::vector<emu::warp_state>((size_t)threads / 32);
            for (auto &w : blk.warps)
                w.bar.n = 32;
            blk.smem = (unsigned char *)aligned_alloc(128, (smem + CANARY + 127) & ~(size_t)127);
            memset(blk.smem, 0xFF, smem);
            memset(blk.smem + smem, 0xA5, CANARY);
            std::vector<std::thread> ts;
            for (int t = 0; t < threads; t++)
                ts.emplace_back([&, t] {
                    emu::t_thread = make_uint3((unsigned)t, 0, 0);
                    emu::t_block = make_uint3(bx, by, 0);
                    emu::t_bdim = dim3((unsigned)threads, 1, 1);
                    emu::t_blk = &blk;
                    kern(args...);
                });
            for (auto &t : ts)
                t.join();
            for (size_t i = 0; i < CANARY; i++)
                if (blk.smem[smem + i] != 0xA5)
                    emu::fail("write past the end of dynamic shared memory");
            free(blk.smem);
        }
}

flash::flash_args make_args(const philox_stream *rng, float p, int B, int T, int C, int NH)
{
    flash::flash_args a;
    a.B = B;
    a.T = T;
    a.C = C;
    a.NH = NH;
    a.scale = (float)(1.0 / sqrt((double)(C / NH)));
    a.drop = rng && p > 0.0f;
    a.rng = a.drop ? philox_dev_from(rng) : philox_dev{0, 0, 0, 0, 0};
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

template <typename T> T to_t(float x);
template <> float to_t<float>(float x) { return x; }
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __half to_t<__half>(float x) { return __float2half(x); }
inline float from_t(float v) { return v; }
inline float from_t(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float from_t(__half v) { return __half2float(v); }

uint64_t rng_state = 0x9E3779B97F4A7C15ull;
float frand() // uniform in (-1, 1)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

template <typename T> const char *tname();
template <> const char *tname<float>() { return "fp32"; }
template <> const char *tname<__nv_bfloat16>() { return "bf16"; }
template <> const char *tname<__half>() { return "fp16"; }

/* normwise relative error of got (n elements, then GUARD that must still be
 * NaN) against ref; NaN never passes */
enum { GUARD = 16 };
template <typename T>
bool check(const char *what, const std::vector<T> &got, const std::vector<float> &ref, size_t n,
           double tol)
{
    double maxref = 0, maxerr = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = from_t(got[i]), r = ref[i];
        if (!std::isfinite(g)) {
            bad++;
            continue;
        }
        maxref = std::max(maxref, std::fabs(r));
        maxerr = std::max(maxerr, std::fabs(g - r));
    }
    size_t guard_bad = 0;
    for (size_t i = n; i < n + GUARD; i++)
        guard_bad += !std::isnan(from_t(got[i]));
    double rel = maxref > 0 ? maxerr / maxref : INFINITY;
    bool ok = bad == 0 && guard_bad == 0 && rel <= tol;
    printf("%-4s %-40s %-4s rel=%.3g (tol %.0e)%s%s\n", ok ? "ok" : "FAIL", what, tname<T>(), rel,
           tol, bad ? " NON-FINITE" : "", guard_bad ? " GUARD OVERWRITTEN" : "");
    emu::failures += !ok;
    return ok;
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
