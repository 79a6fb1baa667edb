/* flash_attention2.cuh — the device code of the second form of the flash
 * attention kernels (lever CUDA_LEVER_FLASH2, BERTD_LEVER_FLASH2): the same
 * math, tiles and dropout indexing as flash_attention.cuh, whose helpers it
 * reuses, with
 *   - the output tile (forward) and the dK/dV tiles (backward) accumulated
 *     in registers (wmma accumulator fragments; an fp32 stand-in of the
 *     same interface for the fp32 checking form), the row max and sum in
 *     registers as before;
 *   - one backward kernel per (batch, head) instead of two passes: dK and
 *     dV of a key tile in registers over every query tile, dQ summed in
 *     fp32 in a buffer only that block touches, key tiles in ascending
 *     order, so the result is the same bits on every run (no atomics);
 *   - K/V tiles (forward) and Q/dO tiles (backward) double-buffered with
 *     cp.async on sm_80+ (STAGES 2); sm_70/75 take one stage and plain
 *     loads (STAGES 1), which keeps two blocks per SM on a V100.
 * Kept apart from the launchers (flash_attention.cu) so that the CPU
 * stand-in (tests/cudasim) runs these very lines. Private to kernels/cuda/.
 * Never allocates; never synchronises the device.
 *
 * Dimension letters: B batch, T sequence, C channels, NH heads, HS = C/NH.
 */
#ifndef BERTD_KERNELS_CUDA_FLASH_ATTENTION2_CUH
#define BERTD_KERNELS_CUDA_FLASH_ATTENTION2_CUH

#include "kernels/cuda/flash_attention.cuh"

namespace flash2 {

using flash::align128;
using flash::flash_args;
using flash::key_len;
using flash::keep4;
using flash::load_tile;
using flash::pad_of;
using flash::PADF;
using flash::store_row;
using flash::warp_mma;

/* ---- a 16x16 fp32 accumulator tile held in a warp's registers ----
 * 16-bit types: the wmma accumulator fragment, whose element-to-(row, col)
 * mapping is unspecified but fixed for a type on an architecture, so a
 * kernel learns each element's row by loading a tile of row numbers into a
 * fragment of the same type (rows()). fp32 (the checking form): 8 floats a
 * lane, element i of lane l = tile element l + 32 i (row-major).
 * mma<ACOL, K>: this += A (16 x K) B (K x 16); A row-major (ACOL false) or
 * column-major (element (r, k) at A[k*lda + r]), B row-major; operands in
 * shared memory, the whole warp calls it. load/store: row-major fp32 tile
 * (shared or global); a store is visible to the other lanes only after the
 * caller's __syncwarp. */
template <typename T, bool WIDE = (sizeof(T) == 2)> struct acc16;

template <typename T> struct acc16<T, true> {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f;
    static constexpr int count = decltype(f)::num_elements;
    __device__ __forceinline__ float &at(int e) { return f.x[e]; }
    __device__ __forceinline__ void zero() { nvcuda::wmma::fill_fragment(f, 0.0f); }
    __device__ __forceinline__ void load(const float *p, int ld)
    {
        nvcuda::wmma::load_matrix_sync(f, p, (unsigned)ld, nvcuda::wmma::mem_row_major);
    }
    __device__ __forceinline__ void store(float *p, int ld) const
    {
        nvcuda::wmma::store_matrix_sync(p, f, (unsigned)ld, nvcuda::wmma::mem_row_major);
    }
    template <bool ACOL, int K>
    __device__ __forceinline__ void mma(const T *A, int lda, const T *B, int ldb)
    {
        static_assert(K % 16 == 0, "K is a multiple of 16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
        /* no bf16 wmma before sm_80: compiled, never launched there */
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            __trap();
        } else
#endif
        {
            using namespace nvcuda;
            typedef typename std::conditional<ACOL, wmma::col_major, wmma::row_major>::type la;
#pragma unroll
            for (int k = 0; k < K / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, la> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
                wmma::load_matrix_sync(a, ACOL ? A + k * 16 * lda : A + k * 16, (unsigned)lda);
                wmma::load_matrix_sync(b, B + k * 16 * ldb, (unsigned)ldb);
                wmma::mma_sync(f, a, b, f);
            }
        }
    }
};

template <typename T> struct acc16<T, false> {
    float x[8];
    static constexpr int count = 8;
    __device__ __forceinline__ float &at(int e) { return x[e]; }
    __device__ __forceinline__ void zero()
    {
#pragma unroll
        for (int e = 0; e < 8; e++)
            x[e] = 0.0f;
    }
    __device__ __forceinline__ void load(const float *p, int ld)
    {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int e = 0; e < 8; e++)
            x[e] = p[((lane >> 4) + 2 * e) * ld + (lane & 15)];
    }
    __device__ __forceinline__ void store(float *p, int ld) const
    {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int e = 0; e < 8; e++)
            p[((lane >> 4) + 2 * e) * ld + (lane & 15)] = x[e];
    }
    template <bool ACOL, int K>
    __device__ __forceinline__ void mma(const T *A, int lda, const T *B, int ldb)
    {
        const int lane = threadIdx.x & 31, c = lane & 15;
        for (int e = 0; e < 8; e++) {
            const int r = (lane >> 4) + 2 * e;
            float s = x[e];
            for (int k = 0; k < K; k++)
                s = fmaf(ACOL ? A[k * lda + r] : A[r * lda + k], B[k * ldb + c], s);
            x[e] = s;
        }
    }
};

/* ---- asynchronous 16-byte copies global -> shared ----
 * sm_80+: cp.async (cg: L2 only, the tile is used once per block); older
 * parts: a plain 16-byte load and store, so cp_commit/cp_wait are nothing.
 * Under the stand-in's emulator the copies land at the cp_wait that covers
 * them (the latest moment the hardware allows), so a read before the wait
 * sees the old contents. cp_wait<N>: all but the N most recently committed
 * groups of this thread are done; other threads see them after a barrier. */
__device__ __forceinline__ void cp16(void *dst, const void *src)
{
#if defined(CUDA_EMU)
    emu::cp_async16(dst, src);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#else
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
#endif
}

__device__ __forceinline__ void cp_commit()
{
#if defined(CUDA_EMU)
    emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void cp_wait()
{
#if defined(CUDA_EMU)
    emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* load_tile (flash_attention.cuh) through cp16: rows r < nvalid copied,
 * the others zeroed with plain stores. */
template <typename T, int HS, int ROWS>
__device__ __forceinline__ void load_tile_async(T *dst, int ldd, const T *src, size_t sstride,
                                                int nvalid)
{
    constexpr int VEC = 16 / (int)sizeof(T), VPR = HS / VEC;
    for (int v = threadIdx.x; v < ROWS * VPR; v += blockDim.x) {
        int r = v / VPR, c = (v % VPR) * VEC;
        if (r < nvalid)
            cp16(dst + r * ldd + c, src + (size_t)r * sstride + c);
        else
            *reinterpret_cast<uint4 *>(dst + r * ldd + c) = make_uint4(0, 0, 0, 0);
    }
}

/* Waits for the tile of iteration t of a STAGES-deep pipeline whose tile
 * t+1 (STAGES 2) was just issued and committed; with one stage, tile t was
 * the last committed group. */
template <int STAGES> __device__ __forceinline__ void pipe_wait()
{
    if (STAGES == 2)
        cp_wait<1>();
    else
        cp_wait<0>();
}

/* A warp's 16 rows of an accumulator tile row-major into dst (row stride
 * ld elements, 16-byte aligned rows): through a 16 x 16 fp32 staging tile
 * (stage, row stride lds >= 16, the warp's own shared memory); lane pair
 * (2r, 2r+1) stores row r, 8 columns each, times mul[r's lane]. Rows whose
 * `valid` is false are not stored. */
template <typename T, int NF>
__device__ __forceinline__ void store_rows(T *dst, size_t ld, acc16<T> *acc, float *stage,
                                           int lds, bool valid, float mul)
{
    const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
#pragma unroll
    for (int n = 0; n < NF; n++) {
        acc[n].store(stage, lds);
        __syncwarp(); // lane 0's (wmma) or every lane's stores are visible
        if (valid)
            store_row<T, 8>(dst + (size_t)r * ld + 16 * n + half * 8, stage + r * lds + half * 8,
                            mul);
        __syncwarp(); // read before the next tile overwrites the stage
    }
}

/* ---- forward ----
 * Shared memory: Q (BR, LDT); STAGES x {K (BC, LDT), V (BC, LDT)}; S
 * (BR, LDS) fp32, over which each warp writes its P rows (16-bit, row
 * stride LDS*4 bytes) in place; per-warp row factors (NW, 16). O is not in
 * shared memory. */
template <typename T, int HS, int NW, int BC, int STAGES>
struct fwd2_smem {
    static constexpr int BR = 16 * NW, LDT = HS + pad_of<T>(), LDS = BC + PADF;
    static constexpr size_t tile = align128((size_t)BC * LDT * sizeof(T));
    static constexpr size_t q = 0;                                          // (BR, LDT) T
    static constexpr size_t kv = q + align128((size_t)BR * LDT * sizeof(T)); // STAGES x (K, V)
    static constexpr size_t s = kv + (size_t)STAGES * 2 * tile;             // (BR, LDS) f32
    static constexpr size_t al = s + align128((size_t)BR * LDS * 4);         // (NW, 16) f32
    static constexpr size_t bytes = al + align128((size_t)NW * 16 * 4);
    static_assert(LDS >= 16, "a 16 x 16 staging tile fits in a warp's S rows");
    static_assert(bytes <= flash::SMEM_LIMIT, "forward tile does not fit in 96 KiB");
};

/* grid (B*NH, ceil(T/BR)), NW warps; the block, warp and lane-pair roles of
 * flash_forward_kernel. Each warp keeps its 16 x HS output as HS/16
 * accumulator fragments; after each key tile's softmax the lane pairs put
 * their rows' rescale factor alpha in the warp's 16-float slot, and every
 * lane multiplies its fragment elements by the factor of their row. Key
 * tile t+1 is copied (cp.async) while tile t is computed when STAGES is 2. */
template <typename T, int HS, int NW, int BC, int STAGES>
__global__ void __launch_bounds__(NW * 32)
flash2_forward_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv,
                      const int32_t *__restrict__ seq_lens, flash_args a)
{
    a.rng = philox_dev_load(a.rng);
    typedef fwd2_smem<T, HS, NW, BC, STAGES> L;
    constexpr int BR = L::BR, CH = BC / 2, NF = HS / 16, LDP = L::LDS * 4 / (int)sizeof(T);
    FLASH_SMEM(smem);
    T *Qs = reinterpret_cast<T *>(smem + L::q);
    const int T_ = a.T, C = a.C, C3 = 3 * C;
    const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
    const int q0 = blockIdx.y * BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, half = lane & 1;
    const int i = q0 + warp * 16 + r; // this lane pair's query (may be >= T: not stored)
    const int len = key_len(seq_lens, b, T_);
    const T *qbase = qkv + (size_t)b * T_ * C3 + (size_t)h * HS; // row t at + t*C3
    float *Sw = reinterpret_cast<float *>(smem + L::s) + warp * 16 * L::LDS; // (16, LDS)
    T *Pw = reinterpret_cast<T *>(Sw);                                       // (16, LDP), in place
    float *alw = reinterpret_cast<float *>(smem + L::al) + warp * 16;         // (16)

    /* the row of each fragment element, learnt through the fragment's own load */
    for (int e = lane; e < 256; e += 32)
        Sw[(e >> 4) * L::LDS + (e & 15)] = (float)(e >> 4);
    __syncwarp();
    acc16<T> rid;
    rid.load(Sw, L::LDS);
    acc16<T> o[NF];
#pragma unroll
    for (int n = 0; n < NF; n++)
        o[n].zero();

    const int ntile = (len + BC - 1) / BC; // tiles past the last real key are skipped
    auto kv_stage = [&](int t) { return reinterpret_cast<T *>(smem + L::kv + (size_t)(t % STAGES) * 2 * L::tile); };
    auto issue = [&](int t) {
        T *Kd = kv_stage(t);
        const int k0 = t * BC;
        load_tile_async<T, HS, BC>(Kd, L::LDT, qbase + C + (size_t)k0 * C3, C3, len - k0);
        load_tile_async<T, HS, BC>(Kd + L::tile / sizeof(T), L::LDT,
                                   qbase + 2 * C + (size_t)k0 * C3, C3, len - k0);
    };
    load_tile<T, HS, BR>(Qs, L::LDT, qbase + (size_t)q0 * C3, C3, T_ - q0);
    issue(0);
    cp_commit();

    float m_run = -INFINITY, l_run = 0.0f;
    const uint64_t rowbase = ((uint64_t)bh * T_ + (uint64_t)i) * (uint64_t)T_;
    for (int t = 0; t < ntile; t++) {
        if (STAGES == 2) {
            if (t + 1 < ntile)
                issue(t + 1);
            cp_commit(); // possibly empty: keeps the group count per iteration fixed
        } else if (t > 0) {
            issue(t);
            cp_commit();
        }
        pipe_wait<STAGES>();
        __syncthreads(); // tile t (and Q) visible to every warp
        const T *Ks = kv_stage(t), *Vs = Ks + L::tile / sizeof(T);
        const int k0 = t * BC;
        // S (16 x BC) = Q_w K^T
        warp_mma<T, BC, HS, true, false>(Sw, L::LDS, Qs + warp * 16 * L::LDT, L::LDT, Ks, L::LDT);
        const float *srow = Sw + r * L::LDS + half * CH;
        const int j0 = k0 + half * CH; // key of this lane's first column
        float sv[CH];
        float mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            sv[c] = j0 + c < len ? srow[c] * a.scale : -INFINITY;
            mx = fmaxf(mx, sv[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_new = fmaxf(m_run, mx); // finite: key k0 < len is in this tile
        const float alpha = expf(m_run - m_new); // 0 on the first tile
        __syncwarp(); // every lane has read its S before P overwrites the rows
        T *prow = Pw + r * LDP + half * CH;
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < CH; c += 4) {
            uint32_t bits = a.drop ? keep4(a.rng, rowbase + (uint64_t)(j0 + c), a.thresh) : 0xFu;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = expf(sv[c + e] - m_new); // masked keys: exp(-inf) = 0
                sum += p;
                float pd = a.drop ? ((bits >> e) & 1u ? p * a.keep_scale : 0.0f) : p;
                prow[c + e] = from_f<T>(pd);
            }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l_run = l_run * alpha + sum;
        m_run = m_new;
        if (half == 0)
            alw[r] = alpha;
        __syncwarp(); // P and the factors visible to the warp
#pragma unroll
        for (int n = 0; n < NF; n++) {
            for (int e = 0; e < acc16<T>::count; e++)
                o[n].at(e) *= alw[(int)rid.at(e)];
            // O_w[:, 16n..] += Pd_w (16 x BC) V[:, 16n..] (BC x 16)
            o[n].template mma<false, BC>(Pw, LDP, Vs + 16 * n, L::LDT);
        }
        __syncthreads(); // every warp is done with this stage before it is refilled
    }
    /* out = O / l through the warp's S rows; the row's logsumexp */
    store_rows<T, NF>(out + ((size_t)b * T_ + q0 + warp * 16) * C + (size_t)h * HS, (size_t)C, o,
                      Sw, L::LDS, i < T_, 1.0f / l_run);
    if (i < T_ && half == 0)
        lse[(size_t)bh * T_ + i] = m_run + logf(l_run);
}

/* ---- backward, one pass ----
 * Shared memory: K, V (BK, LDT); STAGES x {Q (BRQ, LDT), dO (BRQ, LDT)};
 * S^T (BK, LDS) fp32 with P^T written over it in place, dP^T (BK, LDS) fp32
 * with dS^T over it; lse and D of every query row (MAX_T each). */
template <typename T, int HS, int NW, int BRQ, int STAGES>
struct bwd2_smem {
    static constexpr int BK = 16 * NW, LDT = HS + pad_of<T>(), LDS = BRQ + PADF;
    static constexpr size_t ktile = align128((size_t)BK * LDT * sizeof(T));
    static constexpr size_t qtile = align128((size_t)BRQ * LDT * sizeof(T));
    static constexpr size_t k = 0;                                     // (BK, LDT) T
    static constexpr size_t v = k + ktile;                             // (BK, LDT) T
    static constexpr size_t qd = v + ktile;                            // STAGES x (Q, dO)
    static constexpr size_t st = qd + (size_t)STAGES * 2 * qtile;      // (BK, LDS) f32
    static constexpr size_t dpt = st + align128((size_t)BK * LDS * 4); // (BK, LDS) f32
    static constexpr size_t lse = dpt + align128((size_t)BK * LDS * 4); // (MAX_T) f32
    static constexpr size_t d = lse + (size_t)flash::MAX_T * 4;        // (MAX_T) f32
    static constexpr size_t bytes = d + (size_t)flash::MAX_T * 4;
    static_assert(LDS >= 16, "a 16 x 16 staging tile fits in a warp's S^T rows");
    static_assert(flash::MAX_T % BRQ == 0, "query tiles tile MAX_T");
    static_assert(bytes <= flash::SMEM_LIMIT, "backward tile does not fit in 96 KiB");
};

/* grid (B*NH), NW warps. Block bh owns the whole head: first D_i = dO_i.O_i
 * and lse_i of every query row into shared memory (warp per row); then key
 * tiles k0 = 0, BK, ... (tiles wholly past len write zero dK/dV rows and are
 * skipped); warp w owns keys k0+16w..+15 and their dK, dV fragments; for
 * every query tile q0 = 0, BRQ, ... < T (padded queries included, as the
 * CPU op does) it forms S^T, dP^T (keys x queries), P^T and dS^T with the
 * lane mapping and Philox grouping of flash_backward_dkv_kernel, adds
 * P^T dO and dS^T Q to its fragments, and after a barrier the block adds
 * dS K (every key of the tile) to dQ rows q0.. in dqacc: unit (16 rows,
 * 16 columns) u of the tile belongs to warp u % NW for every key tile, so a
 * unit is read and written by one warp, in key-tile order: no atomics, the
 * same bits on every run. At the end dQ is rounded into dqkv.
 * dqacc: (B*NH, Tq, HS) fp32, Tq = T rounded up to BRQ; no initial contents
 * are read (key tile 0 starts each unit from zero). */
template <typename T, int HS, int NW, int BRQ, int STAGES>
__global__ void __launch_bounds__(NW * 32)
flash2_backward_kernel(T *__restrict__ dqkv, float *__restrict__ dqacc,
                       const T *__restrict__ dout, const T *__restrict__ qkv,
                       const T *__restrict__ out, const float *__restrict__ lse,
                       const int32_t *__restrict__ seq_lens, flash_args a)
{
    a.rng = philox_dev_load(a.rng);
    typedef bwd2_smem<T, HS, NW, BRQ, STAGES> L;
    constexpr int BK = L::BK, NF = HS / 16, LDP = L::LDS * 4 / (int)sizeof(T), QC = BRQ / 8;
    FLASH_SMEM(smem);
    T *Ks = reinterpret_cast<T *>(smem + L::k), *Vs = reinterpret_cast<T *>(smem + L::v);
    float *STs = reinterpret_cast<float *>(smem + L::st),
          *dPTs = reinterpret_cast<float *>(smem + L::dpt),
          *lses = reinterpret_cast<float *>(smem + L::lse), *Ds = reinterpret_cast<float *>(smem + L::d);
    T *PTs = reinterpret_cast<T *>(STs), *dSTs = reinterpret_cast<T *>(dPTs); // (BK, LDP), in place

    const int T_ = a.T, C = a.C, C3 = 3 * C;
    const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int len = key_len(seq_lens, b, T_);
    const int Tq = (T_ + BRQ - 1) / BRQ * BRQ;
    const T *qbase = qkv + (size_t)b * T_ * C3 + (size_t)h * HS;
    const T *dobase = dout + (size_t)b * T_ * C + (size_t)h * HS; // row t at + t*C
    T *dqbase = dqkv + (size_t)b * T_ * C3 + (size_t)h * HS, *dkbase = dqbase + C,
      *dvbase = dkbase + C;
    float *dqa = dqacc + (size_t)bh * Tq * HS; // (Tq, HS), this block's alone

    /* D_i = dO_i . O_i and lse_i; rows past T: 0 (their dO rows are 0 too) */
    for (int i = warp; i < Tq; i += NW) { // warp-uniform: the shuffles see every lane
        float d = 0.0f;
        if (i < T_) {
            const T *orow = out + ((size_t)b * T_ + i) * C + (size_t)h * HS;
            for (int c = lane; c < HS; c += 32)
                d = fmaf(to_f(dobase[(size_t)i * C + c]), to_f(orow[c]), d);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            d += __shfl_xor_sync(0xffffffffu, d, o);
        if (lane == 0) {
            Ds[i] = d;
            lses[i] = i < T_ ? lse[(size_t)bh * T_ + i] : 0.0f;
        }
    }

    const int kg = lane & 3, qq = lane >> 2;
    const int kr = warp * 16 + 4 * kg; // block-tile row of this lane's first key
    const int nq = Tq / BRQ;
    float *STw = STs + warp * 16 * L::LDS;
    auto qd_stage = [&](int t) { return reinterpret_cast<T *>(smem + L::qd + (size_t)(t % STAGES) * 2 * L::qtile); };
    auto issue = [&](int t) {
        T *Qd = qd_stage(t);
        const int q0 = t * BRQ;
        load_tile_async<T, HS, BRQ>(Qd, L::LDT, qbase + (size_t)q0 * C3, C3, T_ - q0);
        load_tile_async<T, HS, BRQ>(Qd + L::qtile / sizeof(T), L::LDT, dobase + (size_t)q0 * C, C,
                                    T_ - q0);
    };

    for (int k0 = 0; k0 < T_; k0 += BK) {
        if (k0 >= len) { // only masked keys from here: their gradients are 0
            constexpr int VEC = 16 / (int)sizeof(T), VPR = HS / VEC;
            int rows = T_ - k0 < BK ? T_ - k0 : BK;
            for (int v = threadIdx.x; v < rows * VPR; v += blockDim.x) {
                size_t o = (size_t)(k0 + v / VPR) * C3 + (v % VPR) * VEC;
                *reinterpret_cast<uint4 *>(dkbase + o) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4 *>(dvbase + o) = make_uint4(0, 0, 0, 0);
            }
            continue; // uniform over the block
        }
        /* K, V of this tile and the first Q/dO tile, one group; the barrier
         * that ended the previous key tile freed K, V and the stages */
        load_tile_async<T, HS, BK>(Ks, L::LDT, qbase + C + (size_t)k0 * C3, C3, len - k0);
        load_tile_async<T, HS, BK>(Vs, L::LDT, qbase + 2 * C + (size_t)k0 * C3, C3, len - k0);
        issue(0);
        cp_commit();
        acc16<T> dk[NF], dv[NF];
#pragma unroll
        for (int n = 0; n < NF; n++) {
            dk[n].zero();
            dv[n].zero();
        }
        const int j = k0 + kr; // this lane's keys j .. j+3
        for (int t = 0; t < nq; t++) {
            if (STAGES == 2) {
                if (t + 1 < nq)
                    issue(t + 1);
                cp_commit();
            } else if (t > 0) {
                issue(t);
                cp_commit();
            }
            pipe_wait<STAGES>();
            __syncthreads(); // tile t (and K, V, lse, D) visible to every warp
            const T *Qs = qd_stage(t), *dOs = Qs + L::qtile / sizeof(T);
            const int q0 = t * BRQ;
            // S^T_w = K_w Q^T, dPd^T_w = V_w dO^T (16 keys x BRQ queries each)
            warp_mma<T, BRQ, HS, true, false>(STw, L::LDS, Ks + warp * 16 * L::LDT, L::LDT, Qs,
                                              L::LDT);
            warp_mma<T, BRQ, HS, true, false>(dPTs + warp * 16 * L::LDS, L::LDS,
                                              Vs + warp * 16 * L::LDT, L::LDT, dOs, L::LDT);
            /* P^T and dS^T go over S^T and dP^T in place: every lane reads
             * its elements first */
            float sv[QC][4], pv[QC][4];
#pragma unroll
            for (int cc = 0; cc < QC; cc++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    sv[cc][e] = STs[(kr + e) * L::LDS + qq + 8 * cc];
                    pv[cc][e] = dPTs[(kr + e) * L::LDS + qq + 8 * cc];
                }
            __syncwarp();
#pragma unroll
            for (int cc = 0; cc < QC; cc++) {
                const int c = qq + 8 * cc, i = q0 + c;
                const uint64_t idx0 = ((uint64_t)bh * T_ + (uint64_t)i) * (uint64_t)T_ + (uint64_t)j;
                uint32_t bits = a.drop && i < T_ ? keep4(a.rng, idx0, a.thresh) : 0xFu;
                const float lse_i = lses[q0 + c], D = Ds[q0 + c];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int kk = kr + e;
                    float p = (i < T_ && j + e < len) ? expf(sv[cc][e] * a.scale - lse_i) : 0.0f;
                    float mk = a.drop ? ((bits >> e) & 1u ? a.keep_scale : 0.0f) : 1.0f;
                    PTs[kk * LDP + c] = from_f<T>(p * mk);
                    dSTs[kk * LDP + c] = from_f<T>(p * (pv[cc][e] * mk - D) * a.scale);
                }
            }
            __syncwarp(); // the warp's P^T, dS^T rows visible to its lanes
#pragma unroll
            for (int n = 0; n < NF; n++) {
                // dV_w += Pd^T_w (16 x BRQ) dO (BRQ x 16); dK_w += dS^T_w Q
                dv[n].template mma<false, BRQ>(PTs + warp * 16 * LDP, LDP, dOs + 16 * n, L::LDT);
                dk[n].template mma<false, BRQ>(dSTs + warp * 16 * LDP, LDP, Qs + 16 * n, L::LDT);
            }
            __syncthreads(); // every warp's dS^T rows are written
            // dQ (16 rows x 16 columns per unit) += dS (16 x BK) K (BK x 16)
            for (int u = warp; u < (BRQ / 16) * NF; u += NW) {
                const int qb = u / NF, n = u % NF;
                float *g = dqa + (size_t)(q0 + 16 * qb) * HS + 16 * n;
                acc16<T> dq;
                if (k0 == 0)
                    dq.zero();
                else
                    dq.load(g, HS);
                dq.template mma<true, BK>(dSTs + 16 * qb, LDP, Ks + 16 * n, L::LDT);
                dq.store(g, HS);
            }
            __syncthreads(); // the stage, S^T and dS^T are free for the next tile
        }
        /* this warp's 16 keys: dK, dV through its S^T rows (free after the barrier) */
        const int jr = k0 + warp * 16 + (lane >> 1);
        store_rows<T, NF>(dkbase + (size_t)(k0 + warp * 16) * C3, (size_t)C3, dk, STw, L::LDS,
                          jr < T_, 1.0f);
        store_rows<T, NF>(dvbase + (size_t)(k0 + warp * 16) * C3, (size_t)C3, dv, STw, L::LDS,
                          jr < T_, 1.0f);
        __syncthreads(); // K, V and the S^T rows are free for the next key tile
    }
    /* dQ, rounded once: 8 columns per thread and step */
    for (int v = threadIdx.x; v < T_ * (HS / 8); v += blockDim.x) {
        const int i = v / (HS / 8), c = (v % (HS / 8)) * 8;
        store_row<T, 8>(dqbase + (size_t)i * C3 + c, dqa + (size_t)i * HS + c, 1.0f);
    }
}

/* ---- tile choices ----
 * 16-bit: 4 warps; forward key tiles of 64 (32 at head dim 128); backward
 * query tiles of 32 with two stages, 16 with one (so that a V100 holds two
 * blocks per SM). fp32 (checking only): 2 warps, narrow tiles. docs/cuda.md
 * has the occupancy arithmetic. */
template <typename T, int HS, int STAGES>
struct flash2_cfg {
    static constexpr bool wide = sizeof(T) == 2;
    static constexpr int FWD_NW = wide ? 4 : 2, FWD_BC = wide ? (HS <= 64 ? 64 : 32) : 32;
    static constexpr int BWD_NW = wide ? 4 : 2, BWD_BRQ = wide && STAGES == 2 ? 32 : 16;
    typedef fwd2_smem<T, HS, FWD_NW, FWD_BC, STAGES> F;
    typedef bwd2_smem<T, HS, BWD_NW, BWD_BRQ, STAGES> Bw;
};

} // namespace flash2

#endif
