/* layernorm.cuh — the device code of kernels/cuda/layernorm.cu (the
 * LayerNorm, fused residual+dropout+LayerNorm and embedding kernels, their
 * dropout helper and the launch geometry), kept apart from the host launchers
 * so that tests/unit/kernels/test_layernorm_emu can compile these very lines
 * on the CPU under the SIMT emulator (tests/unit/kernels/cuda_emu.h) and run
 * them without a GPU. Private to kernels/cuda/layernorm.cu (and that test).
 */
#ifndef BERTD_KERNELS_CUDA_LAYERNORM_CUH
#define BERTD_KERNELS_CUDA_LAYERNORM_CUH

#include "kernels/cuda/common.cuh"

#include <errno.h>

/* the block's dynamic shared memory (the emulator supplies its own) */
#ifndef KERNEL_DYN_SMEM
#define KERNEL_DYN_SMEM(T, name) extern __shared__ T name[]
#endif

namespace {


constexpr int LN_BLOCK = 256; // 8 warps, one row each at a time

struct drop_args {
    philox_dev s;
    uint32_t thresh;
    float keep_scale;
    int on;
};

static drop_args make_drop(const philox_stream *rng, float p)
{
    drop_args d = {};
    d.on = rng && p > 0.0f;
    if (d.on) {
        d.s = philox_dev_from(rng);
        d.thresh = dropout_threshold(p);
        d.keep_scale = (float)(1.0 / (1.0 - (double)p));
    }
    return d;
}

__device__ __forceinline__ float drop_mul(const drop_args &d, size_t idx)
{
    if (!d.on)
        return 1.0f;
    return philox_u32(d.s, idx) >= d.thresh ? d.keep_scale : 0.0f;
}

/* RES: res = x + dropout(y) is formed, stored, and normalized; else inp = x. */
template <typename T, bool RES>
__global__ void __launch_bounds__(LN_BLOCK)
layernorm_forward_kernel(T *out, T *res, float *mean, float *rstd, const T *x, const T *y,
                         drop_args d, const float *weight, const float *bias, int N, int C,
                         float eps)
{
    d.s = philox_dev_load(d.s);
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        size_t base = (size_t)row * C;
        const T *src = x + base;
        float sum = 0.0f;
        if (RES) {
            for (int c = lane; c < C; c += 32) {
                float v = to_f(x[base + c]) + to_f(y[base + c]) * drop_mul(d, base + c);
                T vt = from_f<T>(v);
                res[base + c] = vt;
                sum += to_f(vt); // statistics of what backward will read
            }
            src = res + base;
        } else {
            for (int c = lane; c < C; c += 32)
                sum += to_f(src[c]);
        }
        float m = warp_sum(sum) / C;
        float var = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float dv = to_f(src[c]) - m;
            var += dv * dv;
        }
        float s = rsqrtf(warp_sum(var) / C + eps);
        for (int c = lane; c < C; c += 32)
            out[base + c] = from_f<T>((to_f(src[c]) - m) * s * weight[c] + bias[c]);
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = s;
        }
    }
}

/* g = dout (+ dout2); dinp = LN backward of g; FUSED: dy = dinp * mask.
 * The weight/bias gradients are layernorm_param_backward_kernel's. */
template <typename T, bool FUSED>
__global__ void __launch_bounds__(LN_BLOCK)
layernorm_backward_kernel(T *dinp, T *dy, const T *dout, const T *dout2, const T *inp,
                          const float *weight, const float *mean, const float *rstd, drop_args d,
                          int N, int C)
{
    d.s = philox_dev_load(d.s);
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        size_t base = (size_t)row * C;
        float m = mean[row], s = rstd[row];
        float a = 0.0f, b = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float g = to_f(dout[base + c]) + (dout2 ? to_f(dout2[base + c]) : 0.0f);
            float xhat = (to_f(inp[base + c]) - m) * s;
            float dn = weight[c] * g;
            a += dn;
            b += dn * xhat;
        }
        a = warp_sum(a) / C;
        b = warp_sum(b) / C;
        for (int c = lane; c < C; c += 32) {
            float g = to_f(dout[base + c]) + (dout2 ? to_f(dout2[base + c]) : 0.0f);
            float xhat = (to_f(inp[base + c]) - m) * s;
            float di = (weight[c] * g - a - xhat * b) * s;
            dinp[base + c] = from_f<T>(di);
            if (FUSED)
                dy[base + c] = from_f<T>(di * drop_mul(d, base + c));
        }
    }
}

/* ---- the vectorized row kernels (lever CUDA_LEVER_LN_VEC) ----
 * The same ops as the two kernels above, one warp per row, but lane l moves
 * the row in 16-byte packs (P = 4 fp32 or 8 bf16/fp16): packs l, l + 32,
 * ... (consecutive lanes, consecutive 16 bytes: one 512-byte transaction
 * per warp and pack), kept in registers between the statistics and the
 * output, so a row is read once instead of three times. The dropout mask is
 * drawn one Philox call per 4 elements (dropout_mask): for element i it is
 * word i & 3 of the call for group i >> 2, exactly philox_stream_u32(s, i),
 * so the mask is the same function of (seed, rank, step, micro, layer,
 * site, i) as the scalar kernels' and the CPU's. Only the order in which a
 * row's sums are added differs (a lane sums its packs, then the warp), so
 * results can differ from the scalar kernels in the last bits; for the same
 * inputs they are the same bits on every run. Preconditions (ln_vec_fits):
 * C % P == 0, C <= 32 * LNV_PER_LANE, every T pointer 16-byte aligned. */
constexpr int LNV_PER_LANE = 32; // elements a lane holds: rows up to 1024 wide

template <typename T> __host__ __device__ constexpr int lnv_packs()
{
    return LNV_PER_LANE / pack<T>::n;
}

template <typename T> static bool ln_vec_fits(int C, const void *a, const void *b = nullptr,
                                              const void *c = nullptr, const void *d = nullptr,
                                              const void *e = nullptr)
{
    const void *ptrs[5] = {a, b, c, d, e};
    if (C <= 0 || C % pack<T>::n || C > 32 * LNV_PER_LANE)
        return false;
    for (const void *p : ptrs)
        if (((uintptr_t)p & 15) != 0)
            return false;
    return true;
}

/* P consecutive fp32 parameters from c on (16-byte loads when aligned) */
template <int P> __device__ __forceinline__ void load_params(float *out, const float *w, int c)
{
    if (((uintptr_t)(w + c) & 15) == 0) {
#pragma unroll
        for (int k = 0; k < P; k += 4) {
            float4 q = *reinterpret_cast<const float4 *>(w + c + k);
            out[k] = q.x;
            out[k + 1] = q.y;
            out[k + 2] = q.z;
            out[k + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < P; k++)
            out[k] = w[c + k];
    }
}

template <typename T, bool RES>
__global__ void __launch_bounds__(LN_BLOCK)
layernorm_forward_vec_kernel(T *out, T *res, float *mean, float *rstd, const T *x, const T *y,
                             drop_args d, const float *weight, const float *bias, int N, int C,
                             float eps)
{
    d.s = philox_dev_load(d.s);
    constexpr int P = pack<T>::n, K = lnv_packs<T>();
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        size_t base = (size_t)row * C, end = base + C;
        float v[K][P];
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = (k * 32 + lane) * P;
            if (c >= C)
                break;
            load_pack(v[k], x, base + c, end);
            if (RES) {
                float yv[P], mk[P];
                load_pack(yv, y, base + c, end);
                if (d.on)
                    dropout_mask<P>(mk, d.s, base + c, d.thresh, d.keep_scale);
#pragma unroll
                for (int j = 0; j < P; j++) // what is stored is what is normalized
                    v[k][j] = to_f(from_f<T>(v[k][j] + yv[j] * (d.on ? mk[j] : 1.0f)));
                store_pack(res, v[k], base + c, end);
            }
#pragma unroll
            for (int j = 0; j < P; j++)
                sum += v[k][j];
        }
        float m = warp_sum(sum) / C;
        float var = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = (k * 32 + lane) * P;
            if (c >= C)
                break;
#pragma unroll
            for (int j = 0; j < P; j++) {
                float dv = v[k][j] - m;
                var += dv * dv;
            }
        }
        float s = rsqrtf(warp_sum(var) / C + eps);
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = (k * 32 + lane) * P;
            if (c >= C)
                break;
            float w[P], b[P], o[P];
            load_params<P>(w, weight, c);
            load_params<P>(b, bias, c);
#pragma unroll
            for (int j = 0; j < P; j++)
                o[j] = (v[k][j] - m) * s * w[j] + b[j];
            store_pack(out, o, base + c, end);
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = s;
        }
    }
}

template <typename T, bool FUSED>
__global__ void __launch_bounds__(LN_BLOCK)
layernorm_backward_vec_kernel(T *dinp, T *dy, const T *dout, const T *dout2, const T *inp,
                              const float *weight, const float *mean, const float *rstd,
                              drop_args d, int N, int C)
{
    d.s = philox_dev_load(d.s);
    constexpr int P = pack<T>::n, K = lnv_packs<T>();
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        size_t base = (size_t)row * C, end = base + C;
        float m = mean[row], s = rstd[row];
        float dn[K][P], xh[K][P]; // weight * g and xhat, kept for the second pass
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = (k * 32 + lane) * P;
            if (c >= C)
                break;
            float g[P], w[P];
            load_pack(g, dout, base + c, end);
            if (dout2) {
                float g2[P];
                load_pack(g2, dout2, base + c, end);
#pragma unroll
                for (int j = 0; j < P; j++)
                    g[j] += g2[j];
            }
            load_pack(xh[k], inp, base + c, end);
            load_params<P>(w, weight, c);
#pragma unroll
            for (int j = 0; j < P; j++) {
                xh[k][j] = (xh[k][j] - m) * s;
                dn[k][j] = w[j] * g[j];
                a += dn[k][j];
                b += dn[k][j] * xh[k][j];
            }
        }
        a = warp_sum(a) / C;
        b = warp_sum(b) / C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int c = (k * 32 + lane) * P;
            if (c >= C)
                break;
            float di[P];
#pragma unroll
            for (int j = 0; j < P; j++)
                di[j] = (dn[k][j] - a - xh[k][j] * b) * s;
            store_pack(dinp, di, base + c, end);
            if (FUSED) {
                float mk[P];
                if (d.on)
                    dropout_mask<P>(mk, d.s, base + c, d.thresh, d.keep_scale);
#pragma unroll
                for (int j = 0; j < P; j++)
                    di[j] *= d.on ? mk[j] : 1.0f;
                store_pack(dy, di, base + c, end);
            }
        }
    }
}

/* Pass 1 of dweight (C) += sum_n xhat*g, dbias (C) += sum_n g, g = dout
 * (+ dout2), deterministic: a pass of its own that reads g and inp once more
 * (docs/cuda.md counts the bytes), chunk r's sums into partial (2,
 * COLSUM_CHUNKS, C), colsum_finish_kernel adds them in order; common.cuh
 * "deterministic column sums". */
template <typename T>
__global__ void __launch_bounds__(32 * COLSUM_PHASES)
layernorm_param_backward_kernel(float *partial, const T *dout, const T *dout2, const T *inp,
                                const float *mean, const float *rstd, int N, int C)
{
    __shared__ float sh[COLSUM_PHASES * 33];
    int c = blockIdx.x * 32 + threadIdx.x, r = blockIdx.y;
    int hi = colsum_row(N, r + 1);
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int n = colsum_row(N, r) + threadIdx.y; n < hi; n += blockDim.y) {
            size_t i = (size_t)n * C + c;
            float g = to_f(dout[i]) + (dout2 ? to_f(dout2[i]) : 0.0f);
            float xhat = (to_f(inp[i]) - mean[n]) * rstd[n];
            sw += xhat * g;
            sb += g;
        }
    sw = col_phase_sum(sw, sh);
    sb = col_phase_sum(sb, sh);
    if (threadIdx.y == 0 && c < C) {
        partial[(size_t)r * C + c] = sw;
        partial[((size_t)COLSUM_CHUNKS + r) * C + c] = sb;
    }
}

static unsigned ln_grid(int N, int max_blocks)
{
    int warps = LN_BLOCK / 32;
    int g = (N + warps - 1) / warps;
    return (unsigned)(g < max_blocks ? (g ? g : 1) : max_blocks);
}

template <typename T>
__global__ void embeddings_forward_kernel(T *out, const int32_t *inp, const int32_t *tok_type,
                                          const float *wte, const float *wpe, const float *wtt,
                                          int BT, int T_, int C)
{
    size_t n = (size_t)BT * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_);
        out[i] = from_f<T>(wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c] +
                           wtt[(size_t)tok_type[bt] * C + c]);
    }
}

/* cuda_embeddings_order (kernels_cuda.h): host code, here so that the
 * emulator test orders its batches with these very lines. */
static int emb_order(int32_t *order, int32_t *seg, const int32_t *ids, int N, int V)
{
    if (N < 0 || V <= 0)
        return -EINVAL;
    /* a stable counting sort: count[v + 1] = how many ids are v, then the
     * running sum is where v's run starts */
    int32_t *count = (int32_t *)calloc((size_t)V + 1, sizeof *count);
    if (!count)
        return -ENOMEM;
    for (int i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            free(count);
            return -EINVAL;
        }
        count[ids[i] + 1]++;
    }
    for (int v = 0; v < V; v++)
        count[v + 1] += count[v];
    for (int i = 0; i < N; i++)
        order[count[ids[i]]++] = i;
    free(count);
    int U = 0;
    for (int k = 0; k < N; k++)
        if (k == 0 || ids[order[k]] != ids[order[k - 1]])
            seg[U++] = k;
    seg[U] = N;
    return U;
}

/* The embedding gradients, deterministic (no atomics). dwte: one block of
 * (32, EMB_PHASES) threads per run of equal token ids in `order` (the batch
 * positions sorted by token id, stable: cuda_embeddings_order) and per
 * EMB_COLS channels; thread (x, y) sums the run's rows y, y + EMB_PHASES, ...
 * in order, col_phase_sum the phases in a fixed tree, one += per element of
 * the token's row. seg (U+1): where each run starts in order. */
constexpr int EMB_PHASES = 8, EMB_COLS = 64;

template <typename T>
__device__ __forceinline__ void emb_wte_run(float *sh, float *dwte, const T *dout,
                                            const int32_t *inp, const int32_t *order,
                                            const int32_t *seg, int C)
{
    int lo = seg[blockIdx.x], hi = seg[blockIdx.x + 1];
    size_t tok = (size_t)inp[order[lo]];
    int c_end = (int)(blockIdx.y + 1) * EMB_COLS < C ? (int)(blockIdx.y + 1) * EMB_COLS : C;
    for (int c0 = blockIdx.y * EMB_COLS; c0 < c_end; c0 += 32) { // uniform over the block
        int c = c0 + threadIdx.x;
        float s = 0.0f;
        if (c < c_end)
            for (int i = lo + threadIdx.y; i < hi; i += blockDim.y)
                s += to_f(dout[(size_t)order[i] * C + c]);
        s = col_phase_sum(s, sh);
        if (threadIdx.y == 0 && c < c_end)
            dwte[tok * C + c] += s;
    }
}

template <typename T>
__global__ void __launch_bounds__(32 * EMB_PHASES)
embeddings_wte_backward_kernel(float *dwte, const T *dout, const int32_t *inp,
                               const int32_t *order, const int32_t *seg, int C)
{
    __shared__ float sh[EMB_PHASES * 33];
    emb_wte_run<T>(sh, dwte, dout, inp, order, seg, C);
}

/* The same with the run count U read from device *dU: the grid covers the
 * most runs a batch can have, the blocks past U return at once (a captured
 * graph serves every batch of its shape). */
template <typename T>
__global__ void __launch_bounds__(32 * EMB_PHASES)
embeddings_wte_backward_dev_kernel(float *dwte, const T *dout, const int32_t *inp,
                                   const int32_t *order, const int32_t *seg, const int32_t *dU,
                                   int C)
{
    __shared__ float sh[EMB_PHASES * 33];
    if ((int)blockIdx.x >= *dU) // the same for every thread of the block
        return;
    emb_wte_run<T>(sh, dwte, dout, inp, order, seg, C);
}

/* dwpe (T,C) += sum over b of dout[b,t]: block (t, 32 channels), thread
 * (x, y) sums b = y, y + EMB_PHASES, ... in order. */
template <typename T>
__global__ void __launch_bounds__(32 * EMB_PHASES)
embeddings_wpe_backward_kernel(float *dwpe, const T *dout, int B, int T_, int C)
{
    __shared__ float sh[EMB_PHASES * 33];
    int t = blockIdx.x, c = blockIdx.y * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int b = threadIdx.y; b < B; b += blockDim.y)
            s += to_f(dout[((size_t)b * T_ + t) * C + c]);
    s = col_phase_sum(s, sh);
    if (threadIdx.y == 0 && c < C)
        dwpe[(size_t)t * C + c] += s;
}

/* dwtt (TV,C) += sum over rows of type v: block (v, 32 channels), thread
 * (x, y) sums the rows n = y, y + TT_PHASES, ... of type v in order: one
 * launch per step, over TV (2) x C/32 blocks, so no chunks. */
constexpr int TT_PHASES = 32;

template <typename T>
__global__ void __launch_bounds__(32 * TT_PHASES)
embeddings_wtt_backward_kernel(float *dwtt, const T *dout, const int32_t *tok_type, int BT,
                               int C)
{
    __shared__ float sh[TT_PHASES * 33];
    int v = blockIdx.x, c = blockIdx.y * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < BT; n += blockDim.y)
            if (tok_type[n] == v)
                s += to_f(dout[(size_t)n * C + c]);
    s = col_phase_sum(s, sh);
    if (threadIdx.y == 0 && c < C)
        dwtt[(size_t)v * C + c] += s;
}

} // namespace

#endif
