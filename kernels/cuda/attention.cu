/* attention — self-attention on the GPU as two strided-batched cuBLAS GEMMs
 * per direction around one fused kernel (scale, key-padding mask, softmax,
 * Philox dropout) per direction. q, k, v are first regrouped per head so every
 * (b, h) pair is one matrix at a fixed stride:
 *   S  = Q K^T             (B*NH, T, T)   GEMM
 *   P  = softmax(scale*S)  masked, saved  fused kernel, also Pd = dropout(P)
 *   Y  = Pd V              (B*NH, T, hs)  GEMM, then back to (B, T, C)
 * Dropout element (b, h, i, j) draws Philox index ((b*NH+h)*T+i)*T+j, as the
 * CPU op does, so masks are bit-identical. Masked keys get exactly 0.
 * The kernels live in attention.cuh (run on the CPU by
 * tests/unit/kernels/test_attention_emu); this file is the host code.
 */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/gemm.cuh"

#include <math.h>

namespace {

template <typename T>
void attention_forward_t(T *out, T *qkvr, T *att, T *scratch, const T *qkv,
                         const int32_t *seq_lens, const philox_stream *rng, float p, int B,
                         int T_, int C, int NH, cudaStream_t stream)
{
    int hs = C / NH;
    size_t NC = (size_t)B * T_ * C, TT = (size_t)T_ * T_, BNH = (size_t)B * NH;
    cudaDataType_t t = dt_traits<T>::cuda;
    KLAUNCH(grid_for(3 * NC, 256), 256, 0, stream, permute_kernel<T, false>)(qkvr, qkv, B, T_, NH,
                                                                          hs, 3);
    LAUNCH_CHECK();
    const T *q = qkvr, *k = qkvr + NC, *v = qkvr + 2 * NC;
    // S (T,T) = Q (T,hs) @ K^T, per (b,h)
    gemm_rm(false, true, T_, T_, hs, 1.0f, q, t, hs, (long long)T_ * hs, k, t, hs,
            (long long)T_ * hs, 0.0f, att, t, T_, (long long)TT, (int)BNH, stream);
    int drop = rng && p > 0.0f;
    philox_dev s = drop ? philox_dev_from(rng) : philox_dev{};
    uint32_t thresh = dropout_threshold(p);
    float keep_scale = drop ? (float)(1.0 / (1.0 - (double)p)) : 1.0f;
    T *pd = drop ? scratch : att;
    KLAUNCH(warp_rows_grid(BNH * T_), 256, 0, stream, softmax_forward_kernel<T>)(
        att, scratch, seq_lens, (float)(1.0 / sqrt((double)hs)), s, thresh, keep_scale, drop, B,
        NH, T_);
    LAUNCH_CHECK();
    T *yr = scratch + BNH * TT; // (B,NH,T,hs)
    // Y (T,hs) = Pd (T,T) @ V (T,hs)
    gemm_rm(false, false, T_, hs, T_, 1.0f, pd, t, T_, (long long)TT, v, t, hs,
            (long long)T_ * hs, 0.0f, yr, t, hs, (long long)T_ * hs, (int)BNH, stream);
    KLAUNCH(grid_for(NC, 256), 256, 0, stream, permute_kernel<T, true>)(out, yr, B, T_, NH, hs, 1);
    LAUNCH_CHECK();
}

template <typename T>
void attention_backward_t(T *dqkv, T *dqkvr, T *datt, T *scratch, const T *dout, const T *qkvr,
                          const T *att, const int32_t *seq_lens, const philox_stream *rng,
                          float p, int B, int T_, int C, int NH, cudaStream_t stream)
{
    int hs = C / NH;
    size_t NC = (size_t)B * T_ * C, TT = (size_t)T_ * T_, BNH = (size_t)B * NH;
    long long sT = (long long)T_ * hs;
    cudaDataType_t t = dt_traits<T>::cuda;
    const T *q = qkvr, *k = qkvr + NC, *v = qkvr + 2 * NC;
    T *dq = dqkvr, *dk = dqkvr + NC, *dv = dqkvr + 2 * NC;
    T *dyr = scratch + BNH * TT; // (B,NH,T,hs)
    KLAUNCH(grid_for(NC, 256), 256, 0, stream, permute_kernel<T, false>)(dyr, dout, B, T_, NH, hs, 1);
    LAUNCH_CHECK();
    // dPd (T,T) = dY (T,hs) @ V^T
    gemm_rm(false, true, T_, T_, hs, 1.0f, dyr, t, hs, sT, v, t, hs, sT, 0.0f, datt, t, T_,
            (long long)TT, (int)BNH, stream);
    int drop = rng && p > 0.0f;
    philox_dev s = drop ? philox_dev_from(rng) : philox_dev{};
    uint32_t thresh = dropout_threshold(p);
    float keep_scale = drop ? (float)(1.0 / (1.0 - (double)p)) : 1.0f;
    const T *pd = att;
    if (drop) {
        KLAUNCH(grid_for((BNH * TT + 3) / 4, 256), 256, 0, stream, dropout_probs_kernel<T>)(
            scratch, att, s, thresh, keep_scale, BNH * TT);
        LAUNCH_CHECK();
        pd = scratch;
    }
    // dV (T,hs) = Pd^T (T,T) @ dY (T,hs)
    gemm_rm(true, false, T_, hs, T_, 1.0f, pd, t, T_, (long long)TT, dyr, t, hs, sT, 0.0f, dv, t,
            hs, sT, (int)BNH, stream);
    KLAUNCH(warp_rows_grid(BNH * T_), 256, 0, stream, softmax_backward_kernel<T>)(
        datt, att, seq_lens, (float)(1.0 / sqrt((double)hs)), s, thresh, keep_scale, drop, B,
        NH, T_);
    LAUNCH_CHECK();
    // dQ = dS @ K ; dK = dS^T @ Q
    gemm_rm(false, false, T_, hs, T_, 1.0f, datt, t, T_, (long long)TT, k, t, hs, sT, 0.0f, dq, t,
            hs, sT, (int)BNH, stream);
    gemm_rm(true, false, T_, hs, T_, 1.0f, datt, t, T_, (long long)TT, q, t, hs, sT, 0.0f, dk, t,
            hs, sT, (int)BNH, stream);
    KLAUNCH(grid_for(3 * NC, 256), 256, 0, stream, permute_kernel<T, true>)(dqkv, dqkvr, B, T_, NH,
                                                                         hs, 3);
    LAUNCH_CHECK();
}

} // namespace

extern "C" {

void cuda_attention_forward_dt(void *out, void *qkvr, void *att, void *scratch, const void *qkv,
                               const int32_t *seq_lens, const philox_stream *rng, float p, int B,
                               int T_, int C, int NH, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0)
        return;
    DT_DISPATCH(dt, attention_forward_t<T>((T *)out, (T *)qkvr, (T *)att, (T *)scratch,
                                           (const T *)qkv, seq_lens, rng, p, B, T_, C, NH,
                                           stream));
}

void cuda_attention_backward_dt(void *dqkv, void *dqkvr, void *datt, void *scratch,
                                const void *dout, const void *qkvr, const void *att,
                                const int32_t *seq_lens, const philox_stream *rng, float p,
                                int B, int T_, int C, int NH, kdtype dt, cudaStream_t stream)
{
    if (B <= 0 || T_ <= 0)
        return;
    DT_DISPATCH(dt, attention_backward_t<T>((T *)dqkv, (T *)dqkvr, (T *)datt, (T *)scratch,
                                            (const T *)dout, (const T *)qkvr, (const T *)att,
                                            seq_lens, rng, p, B, T_, C, NH, stream));
}

void cuda_attention_forward(float *out, float *qkvr, float *att, float *scratch,
                            const float *qkv, const int32_t *seq_lens, const philox_stream *rng,
                            float p, int B, int T, int C, int NH, cudaStream_t stream)
{
    cuda_attention_forward_dt(out, qkvr, att, scratch, qkv, seq_lens, rng, p, B, T, C, NH,
                              KDT_F32, stream);
}

void cuda_attention_backward(float *dqkv, float *dqkvr, float *datt, float *scratch,
                             const float *dout, const float *qkvr, const float *att,
                             const int32_t *seq_lens, const philox_stream *rng, float p, int B,
                             int T, int C, int NH, cudaStream_t stream)
{
    cuda_attention_backward_dt(dqkv, dqkvr, datt, scratch, dout, qkvr, att, seq_lens, rng, p, B,
                               T, C, NH, KDT_F32, stream);
}

} // extern "C"
