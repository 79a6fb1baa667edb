/* optim.cuh — the device code of kernels/cuda/optim.cu (sum of squares
 * with the non-finite flag, multi-tensor AdamW and LAMB) with its launch
 * geometry and the host computation of the kernels' scalar arguments, kept
 * apart from the launchers so that tests/unit/kernels/test_optim_emu can
 * compile these very lines on the CPU under the SIMT emulator
 * (tests/unit/kernels/cuda_emu.h) and run them without a GPU.
 * Private to kernels/cuda/optim.cu (and that test).
 */
#ifndef BERTD_KERNELS_CUDA_OPTIM_CUH
#define BERTD_KERNELS_CUDA_OPTIM_CUH

#include "kernels/cuda/common.cuh"

#include <math.h>

namespace {

constexpr int OPT_BLOCK = 256;
constexpr unsigned SUMSQ_MAX_GRID = 1024;
constexpr int LAMB_MAX_CHUNKS = 1 << 16; // bert-large: about 11k chunks of OPT_CHUNK

/* The norms are deterministic: every block writes its partial sum to its
 * own scratch entry and one more pass adds the entries in a fixed order (no
 * float atomics, whose order varies from run to run). This is what keeps
 * data-parallel replicas bit-identical: each rank computes the norms of the
 * same all-reduced gradients on its own, and a clip factor or LAMB trust
 * ratio that differed in its last bit between ranks would make their
 * parameters drift apart. The scratch is module-level device memory, so
 * these launches must not run concurrently on one device (one model per
 * bertd-worker process, one stream). */
__device__ double g_sumsq_part[SUMSQ_MAX_GRID];     // one partial per block
__device__ double g_lamb_part[2 * LAMB_MAX_CHUNKS]; // (chunk, {p^2, u^2})

__global__ void sumsq_check_kernel(int *nonfinite, const float *x, size_t n)
{
    __shared__ double sh[32];
    double s = 0.0;
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        bad |= !isfinite(v);
        s += (double)v * (double)v;
    }
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0)
        g_sumsq_part[blockIdx.x] = s;
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        atomicOr(nonfinite, 1); // an OR: order does not matter
}

/* One block: thread t adds partials t, t + blockDim, ... in that order, then
 * the block's fixed tree; the same bits for the same inputs, every run. */
__global__ void sumsq_finish_kernel(double *sumsq, unsigned nparts)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (unsigned k = threadIdx.x; k < nparts; k += blockDim.x)
        s += g_sumsq_part[k];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0)
        *sumsq += s;
}

template <typename TL> __device__ __forceinline__ void store_lp(void *p_lp, size_t i, float v)
{
    if (p_lp)
        ((TL *)p_lp)[i] = from_f<TL>(v);
}

struct adamw_args {
    float decay_on, decay_off; // (float)(1 - lr*wd), 1
    float b1w, b2, b2w, step_size, bc2_sqrt, eps, clip;
    float *gz; // the gradient span itself, zeroed after it is read (zero_grad folded in); or NULL
};

template <typename TL>
__device__ __forceinline__ void adamw_chunk(float *p, void *p_lp, const float *g, float *m,
                                            float *v, const cuda_chunk *chunks,
                                            const uint8_t *decay, const adamw_args &a)
{
    cuda_chunk ch = chunks[blockIdx.x];
    float dec = decay[ch.seg] ? a.decay_on : a.decay_off;
    for (uint32_t k = threadIdx.x; k < ch.len; k += blockDim.x) {
        size_t i = ch.off + k;
        float gi = __fmul_rn(g[i], a.clip);
        if (a.gz)
            a.gz[i] = 0.0f; // the thread's own element, already read
        float pi = __fmul_rn(p[i], dec);
        float mi = __fadd_rn(m[i], __fmul_rn(a.b1w, __fsub_rn(gi, m[i])));
        float vi = __fadd_rn(__fmul_rn(v[i], a.b2), __fmul_rn(__fmul_rn(a.b2w, gi), gi));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
        float pn = __fsub_rn(pi, __fmul_rn(a.step_size, __fdiv_rn(mi, denom)));
        p[i] = pn;
        m[i] = mi;
        v[i] = vi;
        store_lp<TL>(p_lp, i, pn);
    }
}

template <typename TL>
__global__ void adamw_kernel(float *p, void *p_lp, const float *g, float *m, float *v,
                             const cuda_chunk *chunks, const uint8_t *decay, adamw_args a)
{
    adamw_chunk<TL>(p, p_lp, g, m, v, chunks, decay, a);
}

struct lamb_args {
    float b1, b2, b1w, b2w, bc1, bc2, eps, wd, clip;
    double lr;
    float *gz; // as adamw_args.gz: zeroed by the moments pass, the only one reading g
};

/* The step's arguments in device memory (cuda_opt_args_write,
 * cuda_opt_clip): the selected optimizer's (gz unused: the launch passes
 * it) and the fp16 overflow flag that turns the update into nothing. */
struct opt_block {
    adamw_args adamw;
    lamb_args lamb;
    int skip;
};

/* The same with the arguments read from blk at the start; nothing at all
 * when blk->skip. gz as adamw_args.gz. */
template <typename TL>
__global__ void adamw_dev_kernel(float *p, void *p_lp, const float *g, float *m, float *v,
                                 const cuda_chunk *chunks, const uint8_t *decay,
                                 const opt_block *blk, float *gz)
{
    if (blk->skip)
        return;
    adamw_args a = blk->adamw;
    a.gz = gz;
    adamw_chunk<TL>(p, p_lp, g, m, v, chunks, decay, a);
}

__device__ __forceinline__ float lamb_update(float mi, float vi, float pi, float fwd,
                                             const lamb_args &a)
{
    float r = __fdiv_rn(__fdiv_rn(mi, a.bc1), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, a.bc2)), a.eps));
    return __fadd_rn(r, __fmul_rn(fwd, pi));
}

/* pass 1: moments, and per-chunk sums of p^2 and update^2 (g_lamb_part) */
__device__ __forceinline__ void lamb_moments_chunk(double *sh, const float *p, const float *g,
                                                   float *m, float *v, const cuda_chunk *chunks,
                                                   const uint8_t *decay, const lamb_args &a)
{
    cuda_chunk ch = chunks[blockIdx.x];
    float fwd = decay[ch.seg] ? a.wd : 0.0f;
    double wn = 0.0, un = 0.0;
    for (uint32_t k = threadIdx.x; k < ch.len; k += blockDim.x) {
        size_t i = ch.off + k;
        float gi = __fmul_rn(g[i], a.clip);
        if (a.gz)
            a.gz[i] = 0.0f;
        float mi = __fadd_rn(__fmul_rn(m[i], a.b1), __fmul_rn(gi, a.b1w));
        float vi = __fadd_rn(__fmul_rn(v[i], a.b2), __fmul_rn(__fmul_rn(gi, gi), a.b2w));
        m[i] = mi;
        v[i] = vi;
        float u = lamb_update(mi, vi, p[i], fwd, a);
        wn += (double)p[i] * p[i];
        un += (double)u * u;
    }
    wn = block_sum_d(wn, sh);
    un = block_sum_d(un, sh);
    if (threadIdx.x == 0) {
        g_lamb_part[2 * (size_t)blockIdx.x] = wn;
        g_lamb_part[2 * (size_t)blockIdx.x + 1] = un;
    }
}

__global__ void lamb_moments_kernel(const float *p, const float *g, float *m, float *v,
                                    const cuda_chunk *chunks, const uint8_t *decay, lamb_args a)
{
    __shared__ double sh[32];
    lamb_moments_chunk(sh, p, g, m, v, chunks, decay, a);
}

/* The same with the arguments from blk; nothing when blk->skip (the whole
 * block returns before the block-wide sums). gz as lamb_args.gz. */
__global__ void lamb_moments_dev_kernel(const float *p, const float *g, float *m, float *v,
                                        const cuda_chunk *chunks, const uint8_t *decay,
                                        const opt_block *blk, float *gz)
{
    if (blk->skip)
        return;
    lamb_args a = blk->lamb;
    a.gz = gz;
    __shared__ double sh[32];
    lamb_moments_chunk(sh, p, g, m, v, chunks, decay, a);
}

/* First chunk of segment >= seg: chunks are in segment order (one tensor's
 * chunks in a row, worker/gpu_model.c), so a binary search finds a
 * segment's range. */
__device__ __forceinline__ int first_chunk_of(const cuda_chunk *chunks, int num_chunks, unsigned seg)
{
    int lo = 0, hi = num_chunks;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (chunks[mid].seg < seg)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* pass 1b, one block per tensor (segment): the partials of its chunks, in
 * chunk order per thread, then the block's fixed tree. */
__global__ void lamb_norms_kernel(double *norms, const cuda_chunk *chunks, int num_chunks)
{
    __shared__ double sh[32];
    unsigned seg = blockIdx.x;
    int k0 = first_chunk_of(chunks, num_chunks, seg), k1 = first_chunk_of(chunks, num_chunks, seg + 1);
    double wn = 0.0, un = 0.0;
    for (int k = k0 + (int)threadIdx.x; k < k1; k += blockDim.x) {
        wn += g_lamb_part[2 * (size_t)k];
        un += g_lamb_part[2 * (size_t)k + 1];
    }
    wn = block_sum_d(wn, sh);
    un = block_sum_d(un, sh);
    if (threadIdx.x == 0) {
        norms[2 * seg] = wn;
        norms[2 * seg + 1] = un;
    }
}

template <typename TL>
__device__ __forceinline__ void lamb_apply_chunk(float *p, void *p_lp, const float *m,
                                                 const float *v, const cuda_chunk *chunks,
                                                 const uint8_t *decay, const double *norms,
                                                 const lamb_args &a)
{
    cuda_chunk ch = chunks[blockIdx.x];
    int dec = decay[ch.seg];
    float fwd = dec ? a.wd : 0.0f;
    double wn = sqrt(norms[2 * ch.seg]), un = sqrt(norms[2 * ch.seg + 1]);
    /* apex: trust ratio only where weight decay applies (use_nvlamb=False) */
    double ratio = ((double)fwd != 0.0 && wn != 0.0 && un != 0.0) ? wn / un : 1.0;
    float step = (float)(a.lr * ratio);
    for (uint32_t k = threadIdx.x; k < ch.len; k += blockDim.x) {
        size_t i = ch.off + k;
        float u = lamb_update(m[i], v[i], p[i], fwd, a);
        float pn = __fsub_rn(p[i], __fmul_rn(step, u));
        p[i] = pn;
        store_lp<TL>(p_lp, i, pn);
    }
}

template <typename TL>
__global__ void lamb_apply_kernel(float *p, void *p_lp, const float *m, const float *v,
                                  const cuda_chunk *chunks, const uint8_t *decay,
                                  const double *norms, lamb_args a)
{
    lamb_apply_chunk<TL>(p, p_lp, m, v, chunks, decay, norms, a);
}

template <typename TL>
__global__ void lamb_apply_dev_kernel(float *p, void *p_lp, const float *m, const float *v,
                                      const cuda_chunk *chunks, const uint8_t *decay,
                                      const double *norms, const opt_block *blk)
{
    if (blk->skip)
        return;
    lamb_args a = blk->lamb;
    lamb_apply_chunk<TL>(p, p_lp, m, v, chunks, decay, norms, a);
}

/* One thread: the clip/unscale factor and the skip flag from the summed
 * squares, with the double operations of worker/gpu_model.c
 * gpu_model_step, so the factor has the host's bits. */
__global__ void opt_clip_kernel(opt_block *blk, int lamb, const double *sumsq,
                                const int *nonfinite, float max_grad_norm, float loss_scale,
                                double *gnorm_out, int *skip_out)
{
    double gnorm = sqrt(*sumsq) / (double)loss_scale;
    int skip = *nonfinite || !isfinite(gnorm);
    float clip = 1.0f;
    if (!skip && max_grad_norm > 0) {
        if (!lamb) {
            double coef = (double)max_grad_norm / (gnorm + 1e-6);
            clip = (float)(coef < 1.0 ? coef : 1.0);
        } else {
            clip = (float)((double)max_grad_norm /
                           (gnorm > max_grad_norm ? gnorm : max_grad_norm));
        }
    }
    float gmul = loss_scale == 1.0f ? clip : (float)((double)clip / loss_scale);
    if (lamb)
        blk->lamb.clip = gmul;
    else
        blk->adamw.clip = gmul;
    blk->skip = skip;
    if (gnorm_out)
        *gnorm_out = skip ? INFINITY : gnorm;
    if (skip_out)
        *skip_out = skip;
}


/* ---- launch geometry and kernel arguments (host) ---- */
static unsigned sumsq_grid(size_t n)
{
    unsigned g = grid_for(n, OPT_BLOCK);
    if (g > SUMSQ_MAX_GRID)
        g = SUMSQ_MAX_GRID; // each thread loops; g depends on n only
    return g;
}

static adamw_args adamw_args_make(double lr, float beta1, float beta2, float eps,
                                  float weight_decay, float clip, long t)
{
    /* scalars exactly as worker/optim.c adamw_tensor computes them */
    double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    adamw_args a;
    a.decay_on = (float)(1.0 - lr * (double)weight_decay);
    a.decay_off = (float)(1.0 - lr * 0.0);
    a.b1w = (float)(1.0 - beta1);
    a.b2 = beta2;
    a.b2w = (float)(1.0 - beta2);
    a.step_size = (float)(lr / bc1);
    a.bc2_sqrt = (float)sqrt(bc2);
    a.eps = eps;
    a.clip = clip;
    a.gz = nullptr;
    return a;
}

static lamb_args lamb_args_make(double lr, float beta1, float beta2, float eps,
                                float weight_decay, float clip, long t)
{
    lamb_args a;
    a.b1 = beta1;
    a.b2 = beta2;
    a.b1w = 1.0f - beta1;
    a.b2w = 1.0f - beta2;
    a.bc1 = (float)(1.0 - pow(beta1, (double)t));
    a.bc2 = (float)(1.0 - pow(beta2, (double)t));
    a.eps = eps;
    a.wd = weight_decay;
    a.clip = clip;
    a.lr = lr;
    a.gz = nullptr;
    return a;
}

} // namespace

#endif
