/* flash_attention.cuh — the device code of kernels/cuda/flash_attention.cu
 * (helpers, shared-memory layouts, the three kernels, tile choices), kept
 * apart from the host launchers so that tests/unit/kernels/test_flash_emu
 * can compile these very lines on the CPU under a SIMT emulator (threads,
 * barriers, shuffles and wmma emulated) and run them without a GPU.
 * See flash_attention.cu for the algorithm and what each thread owns.
 * Private to kernels/cuda/ (and that test).
 */
#ifndef BERTD_KERNELS_CUDA_FLASH_ATTENTION_CUH
#define BERTD_KERNELS_CUDA_FLASH_ATTENTION_CUH

#include "kernels/cuda/common.cuh"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>
#ifndef FLASH_EMU
#include <mma.h>
#endif

/* the block's dynamic shared memory (the emulator supplies its own) */
#ifndef FLASH_SMEM
#define FLASH_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace flash {


constexpr int MAX_T = 512;
constexpr size_t SMEM_LIMIT = 96 * 1024;

constexpr size_t align128(size_t x)
{
    return (x + 127) & ~(size_t)127;
}

/* Padding of shared rows: 16 bytes, which keeps every row start 16-byte
 * aligned (vector stores), every 16-row fragment start 32-byte aligned (the
 * wmma pointer rule) and the leading dimension a multiple of 16 bytes (the
 * wmma ldm rule), and shifts consecutive rows by 4 banks. */
template <typename T> constexpr int pad_of() { return 16 / (int)sizeof(T); }
constexpr int PADF = 4; // fp32 rows

/* ---- warp-level tile product ----
 * C (16 x N fp32, row-major, ldc) = (ACC ? C : 0) + A (16 x K, row-major, lda) * op(B)
 * op(B) = B (K x N, row-major, ldb) or, when BT, B^T with B stored (N x K,
 * row-major, ldb). All pointers are shared memory; the whole warp calls it.
 * Entry and exit __syncwarp: lanes' plain stores into A/B/C before the call
 * are visible to the product, and C is visible to every lane after it. */
template <typename T, int N, int K, bool BT, bool ACC>
struct warp_mma_impl {
    static __device__ __forceinline__ void run(float *C, int ldc, const T *A, int lda, const T *B,
                                               int ldb)
    {
        static_assert(N % 16 == 0 && K % 16 == 0, "tiles are multiples of 16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
        /* No bf16 tensor cores (nor bf16 wmma fragments) before sm_80: that
         * instantiation is compiled but never launched there
         * (gpu_precision_pick refuses bf16 below sm_80). */
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            __trap();
        } else
#endif
        {
            using namespace nvcuda;
            typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type
                b_layout;
            __syncwarp();
#pragma unroll
            for (int n = 0; n < N / 16; n++) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                if (ACC)
                    wmma::load_matrix_sync(acc, C + n * 16, ldc, wmma::mem_row_major);
                else
                    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
                for (int k = 0; k < K / 16; k++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, b_layout> b;
                    wmma::load_matrix_sync(a, A + k * 16, lda);
                    /* B^T (K x N) col-major is B (N x K) row-major: element
                     * (kk, nn) at B + nn*ldb + kk */
                    wmma::load_matrix_sync(b, BT ? B + n * 16 * ldb + k * 16
                                                 : B + k * 16 * ldb + n * 16,
                                           ldb);
                    wmma::mma_sync(acc, a, b, acc);
                }
                wmma::store_matrix_sync(C + n * 16, acc, ldc, wmma::mem_row_major);
            }
            __syncwarp();
        }
    }
};

/* fp32: scalar FMA, lane owns output elements e = lane, lane+32, ... */
template <int N, int K, bool BT, bool ACC>
struct warp_mma_impl<float, N, K, BT, ACC> {
    static __device__ __forceinline__ void run(float *C, int ldc, const float *A, int lda,
                                               const float *B, int ldb)
    {
        __syncwarp();
        int lane = threadIdx.x & 31;
        for (int e = lane; e < 16 * N; e += 32) {
            int r = e / N, c = e % N;
            float s = ACC ? C[r * ldc + c] : 0.0f;
            for (int k = 0; k < K; k++)
                s = fmaf(A[r * lda + k], BT ? B[c * ldb + k] : B[k * ldb + c], s);
            C[r * ldc + c] = s;
        }
        __syncwarp();
    }
};


template <typename T, int N, int K, bool BT, bool ACC>
__device__ __forceinline__ void warp_mma(float *C, int ldc, const T *A, int lda, const T *B,
                                         int ldb)
{
    warp_mma_impl<T, N, K, BT, ACC>::run(C, ldc, A, lda, B, ldb);
}

/* ---- dropout bits ----
 * Bit e (0..3) of the result is set iff Philox element idx0 + e is kept
 * (word >= thresh): the element's group is (uint32)((idx0+e) >> 2) and its
 * word (idx0+e) & 3, exactly philox_stream_u32. When idx0 is a multiple of 4
 * (T % 4 == 0 and 4-aligned key offsets, the common case) one Philox call
 * serves the 4 elements; otherwise two. */
__device__ __forceinline__ uint32_t word_of(const uint4 &a, const uint4 &b, int k)
{
    // k in 0..7: words of a, then of b
    uint32_t v0 = k & 4 ? b.x : a.x, v1 = k & 4 ? b.y : a.y, v2 = k & 4 ? b.z : a.z,
             v3 = k & 4 ? b.w : a.w;
    int w = k & 3;
    return w == 0 ? v0 : w == 1 ? v1 : w == 2 ? v2 : v3;
}

__device__ __forceinline__ uint32_t keep4(const philox_dev &s, uint64_t idx0, uint32_t thresh)
{
    uint32_t g0 = (uint32_t)(idx0 >> 2);
    int off = (int)(idx0 & 3);
    uint4 a = philox_group(s, g0), b = make_uint4(0, 0, 0, 0);
    if (off)
        b = philox_group(s, g0 + 1u); // wraps like the CPU's 32-bit truncation
    uint32_t bits = 0;
#pragma unroll
    for (int e = 0; e < 4; e++)
        bits |= (word_of(a, b, off + e) >= thresh ? 1u : 0u) << e;
    return bits;
}

__device__ __forceinline__ int key_len(const int32_t *seq_lens, int b, int T)
{
    int n = seq_lens ? seq_lens[b] : T;
    return n < 1 ? 1 : (n > T ? T : n);
}

/* ---- block-wide tile loads and row stores (16-byte vectors) ----
 * dst (ROWS x HS, shared, row stride ldd) = rows 0..ROWS-1 of src (global,
 * row stride sstride elements); rows r >= nvalid are zero (padding queries,
 * masked keys, rows past T: never read from global). Thread t moves vectors
 * v = t, t + blockDim, ... of the ROWS x (HS/VEC) grid. Needs src, sstride
 * and HS in 16-byte units (checked by the launcher). */
template <typename T, int HS, int ROWS>
__device__ __forceinline__ void load_tile(T *dst, int ldd, const T *src, size_t sstride,
                                          int nvalid)
{
    constexpr int VEC = 16 / (int)sizeof(T), VPR = HS / VEC;
    for (int v = threadIdx.x; v < ROWS * VPR; v += blockDim.x) {
        int r = v / VPR, c = (v % VPR) * VEC;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r < nvalid)
            x = *reinterpret_cast<const uint4 *>(src + (size_t)r * sstride + c);
        *reinterpret_cast<uint4 *>(dst + r * ldd + c) = x;
    }
}

/* dst[0..n) = src[0..n) * mul rounded to T, n a multiple of the vector width,
 * dst 16-byte aligned. */
template <typename T, int n>
__device__ __forceinline__ void store_row(T *dst, const float *src, float mul)
{
    constexpr int VEC = 16 / (int)sizeof(T);
#pragma unroll
    for (int c = 0; c < n; c += VEC) {
        union {
            uint4 u;
            unsigned short s[8];
            float f[4];
        } pk;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            T t = from_f<T>(src[c + e] * mul);
            if (sizeof(T) == 2)
                memcpy(&pk.s[e], &t, 2);
            else
                memcpy(&pk.f[e], &t, 4);
        }
        *reinterpret_cast<uint4 *>(dst + c) = pk.u;
    }
}

/* ---- shared-memory layouts (byte offsets) ---- */
template <typename T, int HS, int NW, int BC>
struct fwd_smem {
    static constexpr int BR = 16 * NW, LDT = HS + pad_of<T>(), LDO = HS + PADF,
                         LDS = BC + PADF, LDP = BC + pad_of<T>();
    static constexpr size_t q = 0;                                      // (BR, LDT) T
    static constexpr size_t k = q + align128((size_t)BR * LDT * sizeof(T)); // (BC, LDT) T
    static constexpr size_t v = k + align128((size_t)BC * LDT * sizeof(T)); // (BC, LDT) T
    static constexpr size_t o = v + align128((size_t)BC * LDT * sizeof(T)); // (BR, LDO) f32
    static constexpr size_t s = o + align128((size_t)BR * LDO * 4);         // (BR, LDS) f32
    static constexpr size_t p = s + align128((size_t)BR * LDS * 4);         // (BR, LDP) T
    static constexpr size_t bytes = p + align128((size_t)BR * LDP * sizeof(T));
    static_assert(bytes <= SMEM_LIMIT, "forward tile does not fit in 96 KiB");
};

template <typename T, int HS, int NW, int BC>
struct dq_smem {
    static constexpr int BR = 16 * NW, LDT = HS + pad_of<T>(), LDO = HS + PADF,
                         LDS = BC + PADF, LDP = BC + pad_of<T>();
    static constexpr size_t q = 0;                                           // (BR, LDT) T
    static constexpr size_t dout = q + align128((size_t)BR * LDT * sizeof(T));  // (BR, LDT) T
    static constexpr size_t k = dout + align128((size_t)BR * LDT * sizeof(T));  // (BC, LDT) T
    static constexpr size_t v = k + align128((size_t)BC * LDT * sizeof(T));     // (BC, LDT) T
    static constexpr size_t dq = v + align128((size_t)BC * LDT * sizeof(T));    // (BR, LDO) f32
    static constexpr size_t s = dq + align128((size_t)BR * LDO * 4);            // (BR, LDS) f32
    static constexpr size_t dp = s + align128((size_t)BR * LDS * 4);            // (BR, LDS) f32
    static constexpr size_t ds = dp + align128((size_t)BR * LDS * 4);           // (BR, LDP) T
    static constexpr size_t bytes = ds + align128((size_t)BR * LDP * sizeof(T));
    static_assert(bytes <= SMEM_LIMIT, "dq tile does not fit in 96 KiB");
};

template <typename T, int HS, int NW, int BRQ>
struct dkv_smem {
    static constexpr int BK = 16 * NW, LDT = HS + pad_of<T>(), LDO = HS + PADF,
                         LDS = BRQ + PADF, LDP = BRQ + pad_of<T>();
    static constexpr size_t k = 0;                                          // (BK, LDT) T
    static constexpr size_t v = k + align128((size_t)BK * LDT * sizeof(T));    // (BK, LDT) T
    static constexpr size_t q = v + align128((size_t)BK * LDT * sizeof(T));    // (BRQ, LDT) T
    static constexpr size_t dout = q + align128((size_t)BRQ * LDT * sizeof(T)); // (BRQ, LDT) T
    static constexpr size_t dk = dout + align128((size_t)BRQ * LDT * sizeof(T)); // (BK, LDO) f32
    static constexpr size_t dv = dk + align128((size_t)BK * LDO * 4);           // (BK, LDO) f32
    static constexpr size_t st = dv + align128((size_t)BK * LDO * 4);           // (BK, LDS) f32
    static constexpr size_t dpt = st + align128((size_t)BK * LDS * 4);          // (BK, LDS) f32
    static constexpr size_t pt = dpt + align128((size_t)BK * LDS * 4);          // (BK, LDP) T
    static constexpr size_t dst = pt + align128((size_t)BK * LDP * sizeof(T));  // (BK, LDP) T
    static constexpr size_t lse = dst + align128((size_t)BK * LDP * sizeof(T)); // (BRQ) f32
    static constexpr size_t d = lse + align128((size_t)BRQ * 4);                // (BRQ) f32
    static constexpr size_t bytes = d + align128((size_t)BRQ * 4);
    static_assert(bytes <= SMEM_LIMIT, "dk/dv tile does not fit in 96 KiB");
};

struct flash_args {
    int B, T, C, NH;
    float scale;      // 1/sqrt(hs)
    philox_dev rng;
    uint32_t thresh;  // keep iff word >= thresh
    float keep_scale; // 1/(1-p)
    int drop;
};

/* ---- forward ----
 * grid (B*NH, ceil(T/BR)), NW warps. Block (bh, qt) owns query rows
 * q0 = qt*BR .. q0+BR-1 of head bh; warp w owns rows q0+16w .. q0+16w+15 and
 * their rows of S, P and O in shared memory. Within the warp, lane pair
 * (2r, 2r+1) owns row r = lane>>1 of those 16: lane half = lane&1 handles
 * columns half*BC/2 .. of S/P (BC/2 consecutive keys) and half*HS/2 .. of O.
 * The pair's two lanes hold the same running max m and sum l (combined with
 * one shuffle), so both apply the same rescale factor to their halves of O.
 * Key tiles: k0 = 0, BC, ... < len (tiles past the last real key are
 * skipped; the first tile always holds key 0, so m is finite after it). */
template <typename T, int HS, int NW, int BC>
__global__ void __launch_bounds__(NW * 32)
flash_forward_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv,
                     const int32_t *__restrict__ seq_lens, flash_args a)
{
    a.rng = philox_dev_load(a.rng);
    typedef fwd_smem<T, HS, NW, BC> L;
    constexpr int BR = L::BR, CH = BC / 2, OH = HS / 2;
    FLASH_SMEM(smem);
    T *Qs = reinterpret_cast<T *>(smem + L::q), *Ks = reinterpret_cast<T *>(smem + L::k),
      *Vs = reinterpret_cast<T *>(smem + L::v), *Ps = reinterpret_cast<T *>(smem + L::p);
    float *Os = reinterpret_cast<float *>(smem + L::o), *Ss = reinterpret_cast<float *>(smem + L::s);

    const int T_ = a.T, C = a.C, C3 = 3 * C;
    const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
    const int q0 = blockIdx.y * BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, half = lane & 1;
    const int row = warp * 16 + r; // this lane pair's row within the block tile
    const int i = q0 + row;        // its query index (may be >= T: padding, not stored)
    const int len = key_len(seq_lens, b, T_);
    const T *qbase = qkv + (size_t)b * T_ * C3 + (size_t)h * HS; // row t at + t*C3

    load_tile<T, HS, BR>(Qs, L::LDT, qbase + (size_t)q0 * C3, C3, T_ - q0);
    for (int e = threadIdx.x; e < BR * L::LDO; e += blockDim.x)
        Os[e] = 0.0f;

    float m_run = -INFINITY, l_run = 0.0f;
    float *srow = Ss + row * L::LDS + half * CH; // this lane's BC/2 scores
    T *prow = Ps + row * L::LDP + half * CH;
    float *orow = Os + row * L::LDO + half * OH; // this lane's HS/2 outputs
    const uint64_t rowbase = ((uint64_t)bh * T_ + (uint64_t)i) * (uint64_t)T_;

    for (int k0 = 0; k0 < len; k0 += BC) {
        __syncthreads(); // every warp is done with the previous K/V (and Q/O init)
        load_tile<T, HS, BC>(Ks, L::LDT, qbase + C + (size_t)k0 * C3, C3, len - k0);
        load_tile<T, HS, BC>(Vs, L::LDT, qbase + 2 * C + (size_t)k0 * C3, C3, len - k0);
        __syncthreads();
        // S (16 x BC) = Q_w (16 x HS) K^T
        warp_mma<T, BC, HS, true, false>(Ss + warp * 16 * L::LDS, L::LDS,
                                         Qs + warp * 16 * L::LDT, L::LDT, Ks, L::LDT);
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
#pragma unroll 8
        for (int c = 0; c < OH; c++)
            orow[c] *= alpha;
        // O_w (16 x HS) += Pd_w (16 x BC) V (BC x HS); entry __syncwarp orders
        // the lanes' P and O writes before the product
        warp_mma<T, HS, BC, false, true>(Os + warp * 16 * L::LDO, L::LDO,
                                         Ps + warp * 16 * L::LDP, L::LDP, Vs, L::LDT);
    }
    if (i < T_) {
        store_row<T, OH>(out + ((size_t)b * T_ + i) * C + (size_t)h * HS + half * OH, orow,
                         1.0f / l_run);
        if (half == 0)
            lse[(size_t)bh * T_ + i] = m_run + logf(l_run);
    }
}

/* ---- backward, part 1: dQ and D ----
 * grid (B*NH, ceil(T/BR)), NW warps. Block (bh, qt) owns query rows
 * q0..q0+BR-1; warp w owns 16 of them with their rows of S, dPd, dS and the
 * dQ accumulator; lane pair (2r, 2r+1) owns row r of those, lane half = lane&1
 * columns half*BC/2.. of the score tiles and half*HS/2.. of dO, O and dQ.
 * First the pair computes D_i = dO_i . O_i (fp32, from the stored 16-bit
 * values) and writes it to dbuf for part 2. Key tiles as in forward. */
template <typename T, int HS, int NW, int BC>
__global__ void __launch_bounds__(NW * 32)
flash_backward_dq_kernel(T *__restrict__ dqkv, float *__restrict__ dbuf,
                         const T *__restrict__ dout, const T *__restrict__ qkv,
                         const T *__restrict__ out, const float *__restrict__ lse,
                         const int32_t *__restrict__ seq_lens, flash_args a)
{
    a.rng = philox_dev_load(a.rng);
    typedef dq_smem<T, HS, NW, BC> L;
    constexpr int BR = L::BR, CH = BC / 2, OH = HS / 2;
    FLASH_SMEM(smem);
    T *Qs = reinterpret_cast<T *>(smem + L::q), *dOs = reinterpret_cast<T *>(smem + L::dout),
      *Ks = reinterpret_cast<T *>(smem + L::k), *Vs = reinterpret_cast<T *>(smem + L::v),
      *dSs = reinterpret_cast<T *>(smem + L::ds);
    float *dQs = reinterpret_cast<float *>(smem + L::dq), *Ss = reinterpret_cast<float *>(smem + L::s),
          *dPs = reinterpret_cast<float *>(smem + L::dp);

    const int T_ = a.T, C = a.C, C3 = 3 * C;
    const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
    const int q0 = blockIdx.y * BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = lane >> 1, half = lane & 1;
    const int row = warp * 16 + r;
    const int i = q0 + row;
    const int len = key_len(seq_lens, b, T_);
    const T *qbase = qkv + (size_t)b * T_ * C3 + (size_t)h * HS;

    load_tile<T, HS, BR>(Qs, L::LDT, qbase + (size_t)q0 * C3, C3, T_ - q0);
    load_tile<T, HS, BR>(dOs, L::LDT, dout + ((size_t)b * T_ + q0) * C + (size_t)h * HS, C,
                         T_ - q0);
    for (int e = threadIdx.x; e < BR * L::LDO; e += blockDim.x)
        dQs[e] = 0.0f;
    __syncthreads();

    /* D_i = dO_i . O_i; rows past T: 0 (their dO row is 0 too) */
    float D = 0.0f, lse_i = 0.0f;
    if (i < T_) {
        const T *orow_g = out + ((size_t)b * T_ + i) * C + (size_t)h * HS + half * OH;
        const T *dorow = dOs + row * L::LDT + half * OH;
        for (int c = 0; c < OH; c++)
            D = fmaf(to_f(dorow[c]), to_f(orow_g[c]), D);
        lse_i = lse[(size_t)bh * T_ + i];
    }
    D += __shfl_xor_sync(0xffffffffu, D, 1);
    if (i < T_ && half == 0)
        dbuf[(size_t)bh * T_ + i] = D;

    float *srow = Ss + row * L::LDS + half * CH, *dprow = dPs + row * L::LDS + half * CH;
    T *dsrow = dSs + row * L::LDP + half * CH;
    const uint64_t rowbase = ((uint64_t)bh * T_ + (uint64_t)i) * (uint64_t)T_;

    for (int k0 = 0; k0 < len; k0 += BC) {
        __syncthreads();
        load_tile<T, HS, BC>(Ks, L::LDT, qbase + C + (size_t)k0 * C3, C3, len - k0);
        load_tile<T, HS, BC>(Vs, L::LDT, qbase + 2 * C + (size_t)k0 * C3, C3, len - k0);
        __syncthreads();
        // S = Q_w K^T, dPd = dO_w V^T (16 x BC each)
        warp_mma<T, BC, HS, true, false>(Ss + warp * 16 * L::LDS, L::LDS,
                                         Qs + warp * 16 * L::LDT, L::LDT, Ks, L::LDT);
        warp_mma<T, BC, HS, true, false>(dPs + warp * 16 * L::LDS, L::LDS,
                                         dOs + warp * 16 * L::LDT, L::LDT, Vs, L::LDT);
        const int j0 = k0 + half * CH;
#pragma unroll
        for (int c = 0; c < CH; c += 4) {
            uint32_t bits = a.drop ? keep4(a.rng, rowbase + (uint64_t)(j0 + c), a.thresh) : 0xFu;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = j0 + c + e < len ? expf(srow[c + e] * a.scale - lse_i) : 0.0f;
                float mk = a.drop ? ((bits >> e) & 1u ? a.keep_scale : 0.0f) : 1.0f;
                dsrow[c + e] = from_f<T>(p * (dprow[c + e] * mk - D) * a.scale);
            }
        }
        // dQ_w (16 x HS) += dS_w (16 x BC) K (BC x HS)
        warp_mma<T, HS, BC, false, true>(dQs + warp * 16 * L::LDO, L::LDO,
                                         dSs + warp * 16 * L::LDP, L::LDP, Ks, L::LDT);
    }
    if (i < T_)
        store_row<T, OH>(dqkv + ((size_t)b * T_ + i) * C3 + (size_t)h * HS + half * OH,
                         dQs + row * L::LDO + half * OH, 1.0f);
}

/* ---- backward, part 2: dK and dV ----
 * grid (B*NH, ceil(T/BK)), NW warps. Block (bh, kt) owns keys
 * k0 = kt*BK .. k0+BK-1; warp w owns keys k0+16w .. k0+16w+15: their rows of
 * the transposed tiles S^T, dPd^T, Pd^T, dS^T (keys x queries) and of the dK,
 * dV accumulators. Query tiles q0 = 0, BRQ, ... < T (all queries, padded
 * ones included). The per-element step needs no reduction, so the lane
 * mapping follows Philox: lane = 4*qq + kg handles the 4 consecutive keys
 * 4kg .. 4kg+3 of the warp's 16 (kg = lane&3) for queries qq, qq+8, ...
 * (qq = lane>>2), i.e. one Philox group per (query, 4 keys) when T % 4 == 0.
 * Blocks whose keys are all masked (k0 >= len) write zero gradients and exit. */
template <typename T, int HS, int NW, int BRQ>
__global__ void __launch_bounds__(NW * 32)
flash_backward_dkv_kernel(T *__restrict__ dqkv, const T *__restrict__ dout,
                          const T *__restrict__ qkv, const float *__restrict__ lse,
                          const float *__restrict__ dbuf, const int32_t *__restrict__ seq_lens,
                          flash_args a)
{
    a.rng = philox_dev_load(a.rng);
    typedef dkv_smem<T, HS, NW, BRQ> L;
    constexpr int BK = L::BK, OH = HS / 2;
    FLASH_SMEM(smem);
    T *Ks = reinterpret_cast<T *>(smem + L::k), *Vs = reinterpret_cast<T *>(smem + L::v),
      *Qs = reinterpret_cast<T *>(smem + L::q), *dOs = reinterpret_cast<T *>(smem + L::dout),
      *PTs = reinterpret_cast<T *>(smem + L::pt), *dSTs = reinterpret_cast<T *>(smem + L::dst);
    float *dKs = reinterpret_cast<float *>(smem + L::dk), *dVs = reinterpret_cast<float *>(smem + L::dv),
          *STs = reinterpret_cast<float *>(smem + L::st), *dPTs = reinterpret_cast<float *>(smem + L::dpt),
          *lses = reinterpret_cast<float *>(smem + L::lse), *Ds = reinterpret_cast<float *>(smem + L::d);

    const int T_ = a.T, C = a.C, C3 = 3 * C;
    const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
    const int k0 = blockIdx.y * BK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int len = key_len(seq_lens, b, T_);
    const T *qbase = qkv + (size_t)b * T_ * C3 + (size_t)h * HS;
    T *dkbase = dqkv + (size_t)b * T_ * C3 + C + (size_t)h * HS, *dvbase = dkbase + C;

    if (k0 >= len) { // the whole block is masked keys: their gradients are 0
        constexpr int VEC = 16 / (int)sizeof(T), VPR = HS / VEC;
        int rows = T_ - k0 < BK ? T_ - k0 : BK;
        for (int v = threadIdx.x; v < rows * VPR; v += blockDim.x) {
            size_t o = (size_t)(k0 + v / VPR) * C3 + (v % VPR) * VEC;
            *reinterpret_cast<uint4 *>(dkbase + o) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4 *>(dvbase + o) = make_uint4(0, 0, 0, 0);
        }
        return; // uniform over the block: no barrier is skipped by part of it
    }

    load_tile<T, HS, BK>(Ks, L::LDT, qbase + C + (size_t)k0 * C3, C3, len - k0);
    load_tile<T, HS, BK>(Vs, L::LDT, qbase + 2 * C + (size_t)k0 * C3, C3, len - k0);
    for (int e = threadIdx.x; e < BK * L::LDO; e += blockDim.x) {
        dKs[e] = 0.0f;
        dVs[e] = 0.0f;
    }

    const int kg = lane & 3, qq = lane >> 2;
    const int kr = warp * 16 + 4 * kg; // block-tile row of this lane's first key
    const int j = k0 + kr;             // its key index (keys j .. j+3)

    for (int q0 = 0; q0 < T_; q0 += BRQ) {
        __syncthreads(); // previous Q/dO/lse/D tiles are no longer read
        load_tile<T, HS, BRQ>(Qs, L::LDT, qbase + (size_t)q0 * C3, C3, T_ - q0);
        load_tile<T, HS, BRQ>(dOs, L::LDT, dout + ((size_t)b * T_ + q0) * C + (size_t)h * HS, C,
                              T_ - q0);
        for (int e = threadIdx.x; e < BRQ; e += blockDim.x) {
            int i = q0 + e;
            lses[e] = i < T_ ? lse[(size_t)bh * T_ + i] : 0.0f;
            Ds[e] = i < T_ ? dbuf[(size_t)bh * T_ + i] : 0.0f;
        }
        __syncthreads();
        // S^T = K_w Q^T, dPd^T = V_w dO^T (16 keys x BRQ queries each)
        warp_mma<T, BRQ, HS, true, false>(STs + warp * 16 * L::LDS, L::LDS,
                                          Ks + warp * 16 * L::LDT, L::LDT, Qs, L::LDT);
        warp_mma<T, BRQ, HS, true, false>(dPTs + warp * 16 * L::LDS, L::LDS,
                                          Vs + warp * 16 * L::LDT, L::LDT, dOs, L::LDT);
#pragma unroll
        for (int c = qq; c < BRQ; c += 8) {
            const int i = q0 + c;
            const uint64_t idx0 = ((uint64_t)bh * T_ + (uint64_t)i) * (uint64_t)T_ + (uint64_t)j;
            uint32_t bits = a.drop ? keep4(a.rng, idx0, a.thresh) : 0xFu;
            const float lse_i = lses[c], D = Ds[c];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kk = kr + e;
                float p = (i < T_ && j + e < len) ? expf(STs[kk * L::LDS + c] * a.scale - lse_i)
                                                  : 0.0f;
                float mk = a.drop ? ((bits >> e) & 1u ? a.keep_scale : 0.0f) : 1.0f;
                PTs[kk * L::LDP + c] = from_f<T>(p * mk);
                dSTs[kk * L::LDP + c] = from_f<T>(p * (dPTs[kk * L::LDS + c] * mk - D) * a.scale);
            }
        }
        // dV_w (16 x HS) += Pd^T_w (16 x BRQ) dO (BRQ x HS); dK_w += dS^T_w Q
        warp_mma<T, HS, BRQ, false, true>(dVs + warp * 16 * L::LDO, L::LDO,
                                          PTs + warp * 16 * L::LDP, L::LDP, dOs, L::LDT);
        warp_mma<T, HS, BRQ, false, true>(dKs + warp * 16 * L::LDO, L::LDO,
                                          dSTs + warp * 16 * L::LDP, L::LDP, Qs, L::LDT);
    }
    /* lane pair (2r, 2r+1) stores key row warp*16 + r, half = lane&1 of it;
     * warp_mma's exit __syncwarp made the warp's accumulator rows visible */
    const int r = lane >> 1, half = lane & 1, krow = warp * 16 + r, jr = k0 + krow;
    if (jr < T_) {
        store_row<T, OH>(dkbase + (size_t)jr * C3 + half * OH, dKs + krow * L::LDO + half * OH,
                         1.0f);
        store_row<T, OH>(dvbase + (size_t)jr * C3 + half * OH, dVs + krow * L::LDO + half * OH,
                         1.0f);
    }
}

/* ---- tile choices ----
 * 16-bit: 4 warps (64-row tiles) where they fit in 96 KiB, 2 for head dim
 * 128 in backward. fp32 (checking only): 2 warps and narrow tiles. */
template <typename T, int HS>
struct flash_cfg {
    static constexpr bool wide = sizeof(T) == 2;
    static constexpr int FWD_NW = wide ? 4 : 2, FWD_BC = wide ? (HS <= 64 ? 64 : 32) : 32;
    static constexpr int DQ_NW = wide ? (HS <= 64 ? 4 : 2) : 2, DQ_BC = wide && HS <= 32 ? 64 : 32;
    static constexpr int KV_NW = wide ? (HS <= 64 ? 4 : 2) : 2,
                         KV_BRQ = wide ? 32 : (HS <= 64 ? 32 : 16);
};

} // namespace flash

#endif
