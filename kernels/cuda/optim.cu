/* optim — optimizer kernels over the whole parameter span in one launch each
 * (multi-tensor: the span is cut into chunks that each belong to one
 * tensor), the global sum of squares with a non-finite flag (gradient
 * clipping and fp16 overflow detection in one pass), and AdamW / LAMB with
 * an optional refresh of the 16-bit weight copy in the same pass, and
 * optionally zero_grad folded in (each gradient element set to 0 by the
 * thread that read it: no memset pass before the next step).
 * The arithmetic follows worker/optim.c operation by operation with
 * explicitly rounded intrinsics (no FMA contraction), so fp32 results match
 * the CPU reference exactly for AdamW and up to the norm sums for LAMB.
 * The norms are summed deterministically (optim.cuh says why).
 * The _dev forms take lr, the bias corrections, the clip/unscale factor and
 * the fp16 skip from a device block (cuda_opt_args_write on the host,
 * cuda_opt_clip on the device from the sum of squares), so a step captured
 * in a CUDA graph needs no host sync between backward and the update; same
 * arithmetic, same bits.
 * The kernels live in optim.cuh (run on the CPU by
 * tests/unit/kernels/test_optim_emu); this file is the host launchers.
 */
#include "kernels/cuda/optim.cuh"

#include <errno.h>
#include <string.h>

extern "C" {

void cuda_sumsq_check(double *sumsq, int *nonfinite, const float *x, size_t n,
                      cudaStream_t stream)
{
    if (!n)
        return;
    unsigned g = sumsq_grid(n);
    KLAUNCH(g, OPT_BLOCK, 0, stream, sumsq_check_kernel)(nonfinite, x, n);
    LAUNCH_CHECK();
    KLAUNCH(1, OPT_BLOCK, 0, stream, sumsq_finish_kernel)(sumsq, g);
    LAUNCH_CHECK();
}

void cuda_adamw_step(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                     const cuda_chunk *chunks, int num_chunks, const uint8_t *decay, double lr,
                     float beta1, float beta2, float eps, float weight_decay, float clip, long t,
                     int zero_g, cudaStream_t stream)
{
    if (num_chunks <= 0)
        return;
    adamw_args a = adamw_args_make(lr, beta1, beta2, eps, weight_decay, clip, t);
    a.gz = zero_g ? g : nullptr;
    if (!p_lp)
        lp_dt = KDT_F32;
    DT_DISPATCH(lp_dt, KLAUNCH(num_chunks, OPT_BLOCK, 0, stream, adamw_kernel<T>)(
                           p, p_lp, g, m, v, chunks, decay, a));
    LAUNCH_CHECK();
}

void cuda_lamb_step(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                    const cuda_chunk *chunks, int num_chunks, const uint8_t *decay,
                    double *norms, int num_segs, double lr, float beta1, float beta2, float eps,
                    float weight_decay, float clip, long t, int zero_g, cudaStream_t stream)
{
    if (num_chunks <= 0)
        return;
    lamb_args a = lamb_args_make(lr, beta1, beta2, eps, weight_decay, clip, t);
    a.gz = zero_g ? g : nullptr;
    if (num_chunks > LAMB_MAX_CHUNKS) {
        /* a model past ~2e9 parameters: more chunks than the scratch holds */
        fprintf(stderr, "cuda_lamb_step: %d chunks, at most %d\n", num_chunks, LAMB_MAX_CHUNKS);
        abort();
    }
    KLAUNCH(num_chunks, OPT_BLOCK, 0, stream, lamb_moments_kernel)(p, g, m, v, chunks, decay, a);
    LAUNCH_CHECK();
    KLAUNCH(num_segs, OPT_BLOCK, 0, stream, lamb_norms_kernel)(norms, chunks, num_chunks);
    LAUNCH_CHECK();
    if (!p_lp)
        lp_dt = KDT_F32;
    DT_DISPATCH(lp_dt, KLAUNCH(num_chunks, OPT_BLOCK, 0, stream, lamb_apply_kernel<T>)(
                           p, p_lp, m, v, chunks, decay, norms, a));
    LAUNCH_CHECK();
}

/* ---- the same with the step's values in a device block ---- */
size_t cuda_opt_args_bytes(void)
{
    return sizeof(opt_block);
}

int cuda_opt_args_write(void *dblock, int lamb, double lr, float beta1, float beta2, float eps,
                        float weight_decay, long t, cudaStream_t stream)
{
    if (!dblock || t < 1)
        return -EINVAL;
    opt_block b;
    memset(&b, 0, sizeof b);
    if (lamb)
        b.lamb = lamb_args_make(lr, beta1, beta2, eps, weight_decay, 1.0f, t);
    else
        b.adamw = adamw_args_make(lr, beta1, beta2, eps, weight_decay, 1.0f, t);
    b.skip = 0;
    /* b is pageable: the runtime stages it before returning, so it may go
     * out of scope (and the next step's call may overwrite its slot) before
     * the copy runs */
    cudaError_t e = cudaMemcpyAsync(dblock, &b, sizeof b, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "cuda_opt_args_write: %s\n", cudaGetErrorString(e));
        return -EIO;
    }
    return 0;
}

void cuda_opt_clip(void *dblock, int lamb, const double *sumsq, const int *nonfinite,
                   float max_grad_norm, float loss_scale, double *gnorm_out, int *skip_out,
                   cudaStream_t stream)
{
    KLAUNCH(1, 1, 0, stream, opt_clip_kernel)((opt_block *)dblock, lamb, sumsq, nonfinite,
                                              max_grad_norm, loss_scale, gnorm_out, skip_out);
    LAUNCH_CHECK();
}

void cuda_adamw_step_dev(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                         const cuda_chunk *chunks, int num_chunks, const uint8_t *decay,
                         const void *dblock, int zero_g, cudaStream_t stream)
{
    if (num_chunks <= 0)
        return;
    if (!p_lp)
        lp_dt = KDT_F32;
    const opt_block *blk = (const opt_block *)dblock;
    float *gz = zero_g ? g : nullptr;
    DT_DISPATCH(lp_dt, KLAUNCH(num_chunks, OPT_BLOCK, 0, stream, adamw_dev_kernel<T>)(
                           p, p_lp, g, m, v, chunks, decay, blk, gz));
    LAUNCH_CHECK();
}

void cuda_lamb_step_dev(float *p, void *p_lp, kdtype lp_dt, float *g, float *m, float *v,
                        const cuda_chunk *chunks, int num_chunks, const uint8_t *decay,
                        double *norms, int num_segs, const void *dblock, int zero_g,
                        cudaStream_t stream)
{
    if (num_chunks <= 0)
        return;
    if (num_chunks > LAMB_MAX_CHUNKS) {
        fprintf(stderr, "cuda_lamb_step_dev: %d chunks, at most %d\n", num_chunks,
                LAMB_MAX_CHUNKS);
        abort();
    }
    const opt_block *blk = (const opt_block *)dblock;
    KLAUNCH(num_chunks, OPT_BLOCK, 0, stream, lamb_moments_dev_kernel)(
        p, g, m, v, chunks, decay, blk, zero_g ? g : nullptr);
    LAUNCH_CHECK();
    /* runs on a skipped step too: it only rewrites the norms scratch */
    KLAUNCH(num_segs, OPT_BLOCK, 0, stream, lamb_norms_kernel)(norms, chunks, num_chunks);
    LAUNCH_CHECK();
    if (!p_lp)
        lp_dt = KDT_F32;
    DT_DISPATCH(lp_dt, KLAUNCH(num_chunks, OPT_BLOCK, 0, stream, lamb_apply_dev_kernel<T>)(
                           p, p_lp, m, v, chunks, decay, norms, blk));
    LAUNCH_CHECK();
}

} // extern "C"
