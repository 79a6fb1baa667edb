/* flash_attention — fused self-attention for BERT (bidirectional, key
 * padding mask, Philox dropout on the probabilities) that never materialises
 * the (B, NH, T, T) probabilities: FlashAttention-2 style tiling with an
 * online softmax. Forward saves only the output and the per-row logsumexp;
 * backward recomputes the probabilities tile by tile.
 *
 * NEVER YET EXECUTED ON A GPU: written and compiled on a machine without
 * one. The algorithm (tile order, online softmax, recomputation, dropout
 * indexing) is mirrored in plain C by tests/unit/kernels/test_flash_algo.c
 * and checked there against kernels/cpu/attention.c; the kernels' own source
 * (flash_attention.cuh, split out for this) runs on the CPU under the SIMT
 * emulator of tests/unit/kernels/test_flash_emu.cpp (threads, barriers,
 * shuffles, wmma emulated); tests/gpu/test_flash_attention.c checks it on a
 * GPU against the CPU op and the unfused CUDA path.
 * worker/gpu_model.c falls back to the unfused path with
 * BERTD_ATTENTION=unfused.
 *
 * Shapes: qkv (B,T,3C) laid out [q|k|v] with heads contiguous in each part,
 * out (B,T,C), lse (B,NH,T) fp32, hs = C/NH in {32, 64, 128}, T <= 512.
 * Element (b,h,i,j) of the probability matrix (query i, key j) draws Philox
 * element ((b*NH+h)*T+i)*T+j of the stream: the index kernels/cpu/attention.c
 * and kernels/cuda/attention.cu use, so the three paths drop the same
 * probabilities. Keys j >= len = clamp(seq_lens[b], 1, T) get probability 0;
 * every query row (padded ones too) is computed, as the CPU op does.
 *
 * Math (s = scale * q.k, scale = 1/sqrt(hs), m = keep bit, k = 1/(1-p)):
 *   forward   P = softmax(s) over real keys, Pd = P*m*k, O = Pd V,
 *             lse_i = max_j s_ij + log sum_j exp(s_ij - max) (online, per tile)
 *   backward  D_i = dO_i . O_i (= sum_j Pd_ij dPd_ij), P_ij = exp(s_ij - lse_i),
 *             dPd = dO V^T, dV = Pd^T dO, dS = P * (dPd*m*k - D) * scale,
 *             dQ = dS K, dK = dS^T Q.
 * Backward runs as two kernels without atomics (deterministic): the first
 * owns query tiles and writes dQ (and D for the second), the second owns key
 * tiles and writes dK and dV. The QK^T and dO V^T products are therefore
 * computed twice in backward; FlashAttention-2 computes them once and
 * accumulates dQ with float atomics.
 *
 * Tensor cores: the 16-bit types use wmma 16x16x16 with fp32 accumulators;
 * fp32 (kept so the kernel logic can be checked against the CPU to 1e-5)
 * multiplies the same shared-memory tiles with scalar FMA. Every matrix
 * product in this file goes through warp_mma(): C (16 x N, fp32, shared)
 * (+)= A (16 x K) op(B), all operands in shared memory, so the two paths share
 * every index computation. Softmax statistics, dropout and the per-element
 * backward are fp32 registers; one rounding to the element type where a
 * product's operand is stored (P, dS) and on the final store.
 *
 * Block organisation (all three kernels): NW warps; each warp owns 16 rows
 * of the block's tile (query rows in forward and dQ, key rows in dK/dV) and
 * everything derived from those rows in shared memory (its rows of S, P, the
 * fp32 accumulator), so the softmax needs no cross-warp reduction and warps
 * synchronise with each other only around loads of the shared K/V (or Q/dO)
 * tiles. Shared memory is dynamic, laid out by the *_smem structs, at most
 * 96 KiB per block (the sm_70 opt-in limit), checked by static_assert.
 *
 * With the lever CUDA_LEVER_FLASH2 the same launchers run the second form
 * of the kernels (flash_attention2.cuh: accumulators in registers, one
 * backward kernel, cp.async tiles from sm_80); it needs a dQ scratch of
 * B*NH*T*HS floats (T rounded up to its query tile), taken with
 * cudaMallocAsync on the op's stream and given back there.
 *
 * Otherwise this module never allocates; it never synchronises the device.
 */
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_attention2.cuh"

#include <algorithm>
#include <initializer_list>

namespace {

using namespace flash;

/* Opts the kernel in to more than 48 KiB of dynamic shared memory. Cheap,
 * and per device, so it is done before every launch rather than cached. */
template <typename K>
void set_smem(K kernel, size_t bytes)
{
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)bytes));
}

flash_args make_args(const philox_stream *rng, float p, int B, int T_, int C, int NH)
{
    flash_args a;
    a.B = B;
    a.T = T_;
    a.C = C;
    a.NH = NH;
    a.scale = (float)(1.0 / sqrt((double)(C / NH)));
    a.drop = rng && p > 0.0f;
    a.rng = a.drop ? philox_dev_from(rng) : philox_dev{};
    a.thresh = dropout_threshold(p);
    a.keep_scale = a.drop ? (float)(1.0 / (1.0 - (double)p)) : 1.0f;
    return a;
}

template <typename T, int HS>
void forward_hs(T *out, float *lse, const T *qkv, const int32_t *seq_lens, const flash_args &a,
                cudaStream_t stream)
{
    typedef flash_cfg<T, HS> F;
    typedef fwd_smem<T, HS, F::FWD_NW, F::FWD_BC> L;
    auto kern = flash_forward_kernel<T, HS, F::FWD_NW, F::FWD_BC>;
    set_smem(kern, L::bytes);
    dim3 grid((unsigned)(a.B * a.NH), (unsigned)((a.T + L::BR - 1) / L::BR));
    KLAUNCH(grid, F::FWD_NW * 32, L::bytes, stream, kern)(out, lse, qkv, seq_lens, a);
    LAUNCH_CHECK();
}

template <typename T, int HS>
void backward_hs(T *dqkv, float *dbuf, const T *dout, const T *qkv, const T *out,
                 const float *lse, const int32_t *seq_lens, const flash_args &a,
                 cudaStream_t stream)
{
    typedef flash_cfg<T, HS> F;
    typedef dq_smem<T, HS, F::DQ_NW, F::DQ_BC> LQ;
    typedef dkv_smem<T, HS, F::KV_NW, F::KV_BRQ> LK;
    auto kq = flash_backward_dq_kernel<T, HS, F::DQ_NW, F::DQ_BC>;
    auto kk = flash_backward_dkv_kernel<T, HS, F::KV_NW, F::KV_BRQ>;
    set_smem(kq, LQ::bytes);
    set_smem(kk, LK::bytes);
    dim3 gq((unsigned)(a.B * a.NH), (unsigned)((a.T + LQ::BR - 1) / LQ::BR));
    KLAUNCH(gq, F::DQ_NW * 32, LQ::bytes, stream, kq)(dqkv, dbuf, dout, qkv, out, lse, seq_lens, a);
    LAUNCH_CHECK();
    /* same stream: part 2 reads the D that part 1 wrote */
    dim3 gk((unsigned)(a.B * a.NH), (unsigned)((a.T + LK::BK - 1) / LK::BK));
    KLAUNCH(gk, F::KV_NW * 32, LK::bytes, stream, kk)(dqkv, dout, qkv, lse, dbuf, seq_lens, a);
    LAUNCH_CHECK();
}

/* ---- lever CUDA_LEVER_FLASH2 (flash_attention2.cuh) ---- */

/* Pipeline depth of the second form on the current device: two stages
 * where cp.async exists (sm_80+), one (plain loads) below. */
int flash2_stages()
{
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 8 ? 2 : 1;
}

template <typename T, int HS, int ST>
void forward2_hs(T *out, float *lse, const T *qkv, const int32_t *seq_lens, const flash_args &a,
                 cudaStream_t stream)
{
    typedef flash2::flash2_cfg<T, HS, ST> F;
    typedef typename F::F L;
    auto kern = flash2::flash2_forward_kernel<T, HS, F::FWD_NW, F::FWD_BC, ST>;
    set_smem(kern, L::bytes);
    dim3 grid((unsigned)(a.B * a.NH), (unsigned)((a.T + L::BR - 1) / L::BR));
    KLAUNCH(grid, F::FWD_NW * 32, L::bytes, stream, kern)(out, lse, qkv, seq_lens, a);
    LAUNCH_CHECK();
}

/* One kernel; dQ is summed in fp32 in a stream-ordered scratch of
 * (B*NH, Tq, HS) floats (Tq = T rounded up to the query tile), taken from
 * and given back to the device's default pool on the op's stream. */
template <typename T, int HS, int ST>
void backward2_hs(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse,
                  const int32_t *seq_lens, const flash_args &a, cudaStream_t stream)
{
    typedef flash2::flash2_cfg<T, HS, ST> F;
    typedef typename F::Bw L;
    auto kern = flash2::flash2_backward_kernel<T, HS, F::BWD_NW, F::BWD_BRQ, ST>;
    size_t Tq = (size_t)(a.T + F::BWD_BRQ - 1) / F::BWD_BRQ * F::BWD_BRQ;
    float *acc = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&acc, (size_t)a.B * a.NH * Tq * HS * 4, stream));
    set_smem(kern, L::bytes);
    KLAUNCH(dim3((unsigned)(a.B * a.NH)), F::BWD_NW * 32, L::bytes, stream, kern)(
        dqkv, acc, dout, qkv, out, lse, seq_lens, a);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaFreeAsync(acc, stream));
}

/* Dynamic shared memory the largest kernel needs: the three of the first
 * form, and the second form's two at the device's pipeline depth (so that
 * switching the lever never changes what is supported). */
template <typename T, int HS> size_t smem_need(int stages)
{
    typedef flash_cfg<T, HS> F;
    typedef flash2::flash2_cfg<T, HS, 1> F1;
    typedef flash2::flash2_cfg<T, HS, 2> F2;
    size_t two = stages == 2 ? std::max((size_t)F2::F::bytes, (size_t)F2::Bw::bytes)
                             : std::max((size_t)F1::F::bytes, (size_t)F1::Bw::bytes);
    return std::max({(size_t)fwd_smem<T, HS, F::FWD_NW, F::FWD_BC>::bytes,
                     (size_t)dq_smem<T, HS, F::DQ_NW, F::DQ_BC>::bytes,
                     (size_t)dkv_smem<T, HS, F::KV_NW, F::KV_BRQ>::bytes, two});
}

void check_call(const char *what, int T_, int C, int NH, kdtype dt,
                std::initializer_list<const void *> ptrs)
{
    if (!cuda_flash_attention_supported(T_, C, NH, dt)) {
        fprintf(stderr, "%s: unsupported shape T=%d C=%d NH=%d dt=%s (callers must check "
                "cuda_flash_attention_supported)\n", what, T_, C, NH, kdtype_name(dt));
        abort();
    }
    for (const void *p : ptrs)
        if ((uintptr_t)p & 15) {
            fprintf(stderr, "%s: buffer %p is not 16-byte aligned\n", what, p);
            abort();
        }
}

} // namespace

extern "C" {

#define FLASH_HS_DISPATCH(hs, ...)                                                        \
    do {                                                                                  \
        switch (hs) {                                                                     \
        case 32: { constexpr int HS = 32; __VA_ARGS__; } break;                           \
        case 64: { constexpr int HS = 64; __VA_ARGS__; } break;                           \
        default: { constexpr int HS = 128; __VA_ARGS__; } break;                          \
        }                                                                                 \
    } while (0)

/* The shape rule, bf16 only from sm_80, then the current device's opt-in shared-memory limit:
 * 16-bit tiles need up to ~91 KiB, more than a T4 (sm_75, 64 KiB) allows, and
 * a launch over the limit would fail (set_smem aborts); the caller takes the
 * unfused path instead. */
int cuda_flash_attention_supported(int T, int C, int NH, kdtype dt)
{
    if (T < 1 || T > MAX_T || NH < 1 || C % NH != 0)
        return 0;
    if (dt != KDT_F32 && dt != KDT_BF16 && dt != KDT_F16)
        return 0;
    int hs = C / NH;
    if (hs != 32 && hs != 64 && hs != 128)
        return 0;
    int dev = 0, optin = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* no device: nothing is supported, and no error is left */
        return 0;
    }
    size_t need = 0;
    DT_DISPATCH(dt, FLASH_HS_DISPATCH(hs, need = smem_need<T, HS>(major >= 8 ? 2 : 1)));
    /* bf16 arithmetic needs sm_80: below it (a V100) the bf16 instantiation
     * traps and takes the context with it */
    if (dt == KDT_BF16 && major < 8)
        return 0;
    return need <= (size_t)optin;
}

void cuda_flash_attention_forward_dt(void *out, float *lse, const void *qkv,
                                     const int32_t *seq_lens, const philox_stream *rng, float p,
                                     int B, int T_, int C, int NH, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0)
        return;
    check_call("cuda_flash_attention_forward_dt", T_, C, NH, dt, {out, qkv});
    flash_args a = make_args(rng, p, B, T_, C, NH);
    if (cuda_levers() & CUDA_LEVER_FLASH2) {
        if (flash2_stages() == 2)
            DT_DISPATCH(dt, FLASH_HS_DISPATCH(C / NH, forward2_hs<T, HS, 2>(
                                                          (T *)out, lse, (const T *)qkv, seq_lens,
                                                          a, stream)));
        else
            DT_DISPATCH(dt, FLASH_HS_DISPATCH(C / NH, forward2_hs<T, HS, 1>(
                                                          (T *)out, lse, (const T *)qkv, seq_lens,
                                                          a, stream)));
        return;
    }
    DT_DISPATCH(dt, FLASH_HS_DISPATCH(C / NH, forward_hs<T, HS>((T *)out, lse, (const T *)qkv,
                                                                  seq_lens, a, stream)));
}

void cuda_flash_attention_backward_dt(void *dqkv, float *dscratch, const void *dout,
                                      const void *qkv, const void *out, const float *lse,
                                      const int32_t *seq_lens, const philox_stream *rng, float p,
                                      int B, int T_, int C, int NH, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0)
        return;
    check_call("cuda_flash_attention_backward_dt", T_, C, NH, dt, {dqkv, dout, qkv, out});
    flash_args a = make_args(rng, p, B, T_, C, NH);
    if (cuda_levers() & CUDA_LEVER_FLASH2) { /* dscratch is not used */
        if (flash2_stages() == 2)
            DT_DISPATCH(dt, FLASH_HS_DISPATCH(C / NH, backward2_hs<T, HS, 2>(
                                                          (T *)dqkv, (const T *)dout,
                                                          (const T *)qkv, (const T *)out, lse,
                                                          seq_lens, a, stream)));
        else
            DT_DISPATCH(dt, FLASH_HS_DISPATCH(C / NH, backward2_hs<T, HS, 1>(
                                                          (T *)dqkv, (const T *)dout,
                                                          (const T *)qkv, (const T *)out, lse,
                                                          seq_lens, a, stream)));
        return;
    }
    DT_DISPATCH(dt, FLASH_HS_DISPATCH(C / NH, backward_hs<T, HS>(
                                                  (T *)dqkv, dscratch, (const T *)dout,
                                                  (const T *)qkv, (const T *)out, lse, seq_lens,
                                                  a, stream)));
}

} // extern "C"
