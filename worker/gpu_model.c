/* gpu_model — see gpu_model.h. The forward and backward follow
 * worker/model.c op for op (same dropout streams, same order of gradient
 * accumulation), with the fused kernels of kernels/cuda in place of op pairs:
 * residual+dropout+LayerNorm, bias+GELU, softmax+cross-entropy(+its grad).
 * Gradient rule: parameter gradients +=, activation gradients =.
 */
#include "worker/gpu_model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Set while graph_capture records the step on this thread: a call the
 * capture refuses (a stream-capture error, cudaErrorStreamCaptureUnsupported
 * .. WrongThread) is then reported once, by graph_capture, not by GPU_TRY. */
static _Thread_local int capturing;

/* Host-side CUDA calls in this module return errors to the caller. */
#define GPU_TRY(call)                                                                     \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            if (!capturing || e_ < cudaErrorStreamCaptureUnsupported ||                   \
                e_ > cudaErrorStreamCaptureWrongThread)                                   \
                fprintf(stderr, "gpu_model: %s at %s:%d: %s\n", #call, __FILE__,          \
                        __LINE__, cudaGetErrorString(e_));                                \
            rc = -EIO;                                                                    \
            goto out;                                                                     \
        }                                                                                 \
    } while (0)

enum { OPT_CHUNK = 32768 };             // elements per optimizer block
static const size_t SLACK = 384u << 20; // cuBLAS workspace, context growth, fragmentation

struct gpu_acts {
    void *emb, *emb_ln, *x0;              // (N,C)
    float *emb_mean, *emb_rstd;           // (N)
    void *qkv_s;                          // (N,3C) scratch: fused QKV projection (unfused only)
    int fused;                            // flash attention (attention_fused)
    void *qkvr;                           // (L,3,N,C) q,k,v per head, saved; fused: (L,N,3C)
                                          // the QKV GEMM output itself
    void *att;                            // (L,B,NH,T,T) probabilities, saved; fused:
                                          // (L,B,NH,T) fp32 logsumexp
    void *att_scratch;                    // (B*NH*T*T + N*C); fused: (B,NH,T) fp32
    void *atty, *res1, *ln1, *res2, *ln2; // (L,N,C)
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd; // (L,N)
    void *proj_s;                         // (N,C) scratch: attention / FFN output projection
    void *fch, *fch_gelu;                 // (L,N,I)
    void *hsel, *hd, *hg, *hln;           // (M,C)
    float *h_mean, *h_rstd, *losses;      // (M)
    float *loss_sum;                      // (2) sums of the MLM and NSP losses
    void *logits;                         // (M,V) logits, then their gradient in place
    void *d_res, *d_a, *d_b, *d_c;        // (N,C) backward scratch
    void *d_qkv, *d_qkvr;                 // (N,3C); d_qkvr unfused only
    void *d_att;                          // (B,NH,T,T) unfused only
    void *d_fch, *d_fch_gelu;             // (N,I)
    void *d_h1, *d_h2;                    // (M,C)
    void *cls, *pool_pre, *pooled;        // (B,C) NSP head (nsp = 1 only)
    void *nsp_logits;                     // (B,2) logits, then their gradient in place
    float *nsp_losses;                    // (B)
    void *d_cls, *d_pool;                 // (B,C)
    int32_t *slot[2]; // each: ids (N), types (N), lens (B), positions (M), labels (M),
                      // nsp labels (B), CLS rows b*T (B)
};

/* Lever CUDA_LEVER_GRAPH: what changes from one micro-batch to the next,
 * in device memory (g->dscal) for the kernels to read, so that the same
 * kernel launches (and a captured graph of them) serve every step. The
 * inputs are written by one async copy on the compute stream before the
 * forward that uses them (and its backward after it, in stream order); the
 * outputs by cuda_opt_clip in the step. */
typedef struct step_scalars {
    uint32_t ctr[2]; // Philox {step, micro} of every dropout site (philox_stream.dev_ctr)
    int32_t U;       // runs of the batch's token order (the embedding backward's blocks)
    float mlm_gs;    // loss_scale / M (the real M), 0 for an eval forward
    float nsp_gs;    // loss_scale / B
    int32_t skip;    // out: the step changed nothing (non-finite gradients)
    double gnorm;    // out: the unscaled gradient norm, INFINITY when skipped
} step_scalars;
#define STEP_SCALARS_IN offsetof(step_scalars, skip) // bytes the host writes

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

/* Lever CUDA_LEVER_GRAPH: masked rows padded to a multiple of 64 (so that
 * the shapes, and a graph, repeat), within what the activations hold and
 * at most the n positions of the batch (a padding row takes a position no
 * other row has: the 16-bit scatter of the head's gradient has no atomics). */
static void graphs_free(gpu_model *g);

static int mask_pad64(int M, int cap, long long n)
{
    if (M <= 0)
        return 0;
    long long p = ((long long)M + 63) & ~63LL;
    if (p > cap)
        p = cap;
    if (p > n)
        p = n;
    return (int)(p > M ? p : M);
}

/* The vocabulary rounded up to a multiple of 64 (lever CUDA_LEVER_VOCAB_PAD). */
static size_t vocab_pad64(size_t V)
{
    return (V + 63) & ~(size_t)63;
}

/* ... and after them the batch positions ordered by token id with their
 * runs (cuda_embeddings_order: order (N), seg (N+1)), for the deterministic
 * word-embedding backward */
static size_t slot_ints(int B, int T, int M)
{
    return 4 * (size_t)B * T + 1 + 3 * (size_t)B + 2 * (size_t)(M > 0 ? M : 1);
}

/* Flash attention (kernels/cuda/flash_attention.cu) when it supports the
 * shape: 16-bit activations (fp32 keeps the path that matches the CPU to
 * 1e-5), head dim 32, 64 or 128, T <= 512. BERTD_ATTENTION=unfused forces
 * the GEMM-softmax-GEMM path: the fused kernel has not yet run on a GPU, so
 * a first GPU run must be able to fall back without a rebuild. */
static int attention_fused(const bert_config *c, kdtype dt, int T)
{
    const char *e = getenv("BERTD_ATTENTION");
    if (e && strcmp(e, "unfused") == 0)
        return 0;
    return dt != KDT_F32 &&
           cuda_flash_attention_supported(T, c->hidden_size, c->num_attention_heads, dt);
}

/* Lays the activations out from base (or only sizes them when a is NULL).
 * The single source of truth for both sizing and pointers. */
static size_t act_layout(const bert_config *c, kdtype dt, int B, int T, int M, char *base,
                         gpu_acts *a)
{
    size_t es = kdtype_size(dt), L = c->num_hidden_layers, C = c->hidden_size,
           I = c->intermediate_size, V = c->vocab_size, NH = c->num_attention_heads,
           N = (size_t)B * T, Mz = M > 0 ? (size_t)M : 1, BHTT = (size_t)B * NH * T * T,
           nB = c->nsp ? (size_t)B : 0, BHT = (size_t)B * NH * T;
    int fused = attention_fused(c, dt, T);
    size_t off = 0;
    if (a)
        a->fused = fused;
#define TAKE(field, count, esize)                                                         \
    do {                                                                                  \
        if (a)                                                                            \
            a->field = (void *)(base + off);                                              \
        off += align256((size_t)(count) * (esize));                                       \
    } while (0)
    TAKE(emb, N * C, es);
    TAKE(emb_ln, N * C, es);
    TAKE(x0, N * C, es);
    TAKE(emb_mean, N, 4);
    TAKE(emb_rstd, N, 4);
    TAKE(qkv_s, fused ? 0 : N * 3 * C, es);
    TAKE(qkvr, L * 3 * N * C, es);
    /* fused: no (B,NH,T,T) buffer at all, the per-row logsumexp instead */
    TAKE(att, fused ? L * BHT : L * BHTT, fused ? 4 : es);
    TAKE(att_scratch, fused ? BHT : BHTT + N * C, fused ? 4 : es);
    TAKE(atty, L * N * C, es);
    TAKE(res1, L * N * C, es);
    TAKE(ln1, L * N * C, es);
    TAKE(res2, L * N * C, es);
    TAKE(ln2, L * N * C, es);
    TAKE(ln1_mean, L * N, 4);
    TAKE(ln1_rstd, L * N, 4);
    TAKE(ln2_mean, L * N, 4);
    TAKE(ln2_rstd, L * N, 4);
    TAKE(proj_s, N * C, es);
    TAKE(fch, L * N * I, es);
    TAKE(fch_gelu, L * N * I, es);
    TAKE(hsel, Mz * C, es);
    TAKE(hd, Mz * C, es);
    TAKE(hg, Mz * C, es);
    TAKE(hln, Mz * C, es);
    TAKE(h_mean, Mz, 4);
    TAKE(h_rstd, Mz, 4);
    TAKE(losses, Mz, 4);
    TAKE(loss_sum, 2, 4);
    /* at the padded width (CUDA_LEVER_VOCAB_PAD) whether or not the lever
     * is on: at most 63 columns more, and the plan does not depend on it */
    TAKE(logits, Mz * vocab_pad64(V), es);
    TAKE(d_res, N * C, es);
    TAKE(d_a, N * C, es);
    TAKE(d_b, N * C, es);
    TAKE(d_c, N * C, es);
    TAKE(d_qkv, N * 3 * C, es);
    TAKE(d_qkvr, fused ? 0 : N * 3 * C, es);
    TAKE(d_att, fused ? 0 : BHTT, es);
    TAKE(d_fch, N * I, es);
    TAKE(d_fch_gelu, N * I, es);
    TAKE(d_h1, Mz * C, es);
    TAKE(d_h2, Mz * C, es);
    TAKE(cls, nB * C, es);
    TAKE(pool_pre, nB * C, es);
    TAKE(pooled, nB * C, es);
    TAKE(nsp_logits, nB * 2, es);
    TAKE(nsp_losses, nB, 4);
    TAKE(d_cls, nB * C, es);
    TAKE(d_pool, nB * C, es);
    TAKE(slot[0], slot_ints(B, T, M), 4);
    TAKE(slot[1], slot_ints(B, T, M), 4);
#undef TAKE
    return off;
}

size_t gpu_model_act_bytes(const bert_config *cfg, kdtype dt, int B, int T, int M)
{
    return act_layout(cfg, dt, B, T, M, NULL, NULL);
}

static size_t count_params(const bert_config *cfg)
{
    size_t s[BERT_NUM_PARAM_TENSORS], n = 0;
    bert_param_sizes(cfg, s);
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
        n += s[i];
    return n;
}

/* Device bytes of the parameter, gradient and optimizer spans of n floats. */
static size_t state_bytes_n(size_t n, kdtype dt)
{
    size_t lp = dt == KDT_F32 ? 0 : n * kdtype_size(dt);
    return align256(align256(n * 4) + lp) + align256(n * 4) + align256(2 * n * 4);
}

size_t gpu_model_state_bytes(const bert_config *cfg, kdtype dt)
{
    return state_bytes_n(count_params(cfg), dt);
}

/* Lever CUDA_LEVER_VOCAB_PAD: the host layout (bert_param_sizes) and the
 * device one (g->param_sizes) differ only in the padding rows at the end of
 * the word embeddings and of the decoder bias. dev_pos maps a host offset
 * that starts a run to its device offset, dev_end one that ends a run (a
 * run ending with a padded tensor takes its padding along). */
static size_t dev_map(const gpu_model *g, size_t off, int end)
{
    size_t hs[BERT_NUM_PARAM_TENSORS], h = 0, d = 0;
    bert_param_sizes(&g->cfg, hs);
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
        if (end ? (off > h && off <= h + hs[i]) : (off >= h && off < h + hs[i]))
            return end && off == h + hs[i] ? d + g->param_sizes[i] : d + (off - h);
        h += hs[i];
        d += g->param_sizes[i];
    }
    return d; // the end of the span
}
static size_t dev_pos(const gpu_model *g, size_t host_off)
{
    return dev_map(g, host_off, 0);
}
static size_t dev_end(const gpu_model *g, size_t host_end)
{
    return dev_map(g, host_end, 1);
}

/* Copies a span of floats between the host layout and the device one, one
 * copy per run the padding does not interrupt, on the compute stream, then
 * waits for it (the padding itself is neither read nor written).
 * spans: 1 for parameters or gradients, 2 for the optimizer state (m then
 * v, each laid out as the parameters). */
static int span_copy(gpu_model *g, float *dev, float *host, int spans, int to_dev)
{
    int rc = 0;
    size_t hs[BERT_NUM_PARAM_TENSORS];
    bert_param_sizes(&g->cfg, hs);
    for (int k = 0; k < spans; k++) {
        float *dv = dev + (size_t)k * g->dev_params, *hv = host + (size_t)k * g->num_params;
        size_t h = 0, d = 0, run_h = 0, run_d = 0, run_n = 0;
        for (int i = 0; i <= BERT_NUM_PARAM_TENSORS; i++) {
            /* a run ends where a device offset stops following its host one */
            if (i == BERT_NUM_PARAM_TENSORS || (run_n && d != run_d + run_n)) {
                if (run_n)
                    GPU_TRY(to_dev ? cudaMemcpyAsync(dv + run_d, hv + run_h, run_n * 4,
                                                     cudaMemcpyHostToDevice, g->compute)
                                   : cudaMemcpyAsync(hv + run_h, dv + run_d, run_n * 4,
                                                     cudaMemcpyDeviceToHost, g->compute));
                if (i == BERT_NUM_PARAM_TENSORS)
                    break;
                run_h = h;
                run_d = d;
                run_n = 0;
            }
            run_n += hs[i];
            h += hs[i];
            d += g->param_sizes[i];
        }
    }
    GPU_TRY(cudaStreamSynchronize(g->compute));
out:
    return rc;
}

int gpu_precision_pick(const char *want, int device, kdtype *out, char *err, size_t errlen)
{
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        snprintf(err, errlen, "CUDA device %d is not usable", device);
        return -ENODEV;
    }
    if (!want || strcmp(want, "auto") == 0) {
        *out = major >= 8 ? KDT_BF16 : major == 7 ? KDT_F16 : KDT_F32;
        return 0;
    }
    if (strcmp(want, "fp32") == 0) {
        *out = KDT_F32;
    } else if (strcmp(want, "fp16") == 0) {
        if (major < 7) {
            snprintf(err, errlen, "fp16 needs tensor cores (sm_70+); device is sm_%d%d", major,
                     minor);
            return -ENOTSUP;
        }
        *out = KDT_F16;
    } else if (strcmp(want, "bf16") == 0) {
        if (major < 8) {
            snprintf(err, errlen, "bf16 needs sm_80+; device is sm_%d%d (use fp16)", major,
                     minor);
            return -ENOTSUP;
        }
        *out = KDT_BF16;
    } else {
        snprintf(err, errlen, "precision \"%s\": expected auto, bf16, fp16 or fp32", want);
        return -EINVAL;
    }
    return 0;
}

static void point_params(bert_params *p, float *mem, const size_t *sizes)
{
    float **ptrs = (float **)p;
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
        ptrs[i] = mem;
        mem += sizes[i];
    }
}

static int scaled_M(int max_M, int max_B, int b)
{
    return (int)(((long long)max_M * b + max_B - 1) / max_B);
}

/* BERTD_GEMM: unset or "auto" prefers cuBLASLt and falls back to cuBLAS when
 * it cannot start; "cublaslt" insists on it; "cublas" forces the cuBLAS path
 * (the way back if the cuBLASLt path misbehaves on some GPU or driver). */
static int gemm_pick(gpu_model *g, char *err, size_t errlen)
{
    const char *v = getenv("BERTD_GEMM");
    int need = 0;
    g->gemm_lt = 0;
    if (v && strcmp(v, "cublas") == 0)
        return 0;
    if (v && strcmp(v, "cublaslt") == 0) {
        need = 1;
    } else if (v && *v && strcmp(v, "auto") != 0) {
        snprintf(err, errlen, "BERTD_GEMM=\"%s\": expected cublas, cublaslt or auto", v);
        return -EINVAL;
    }
    int rc = cuda_lt_init();
    if (rc < 0) {
        if (need) {
            snprintf(err, errlen, "BERTD_GEMM=cublaslt, but cuBLASLt could not start on device %d",
                     g->device);
            return rc;
        }
        fprintf(stderr, "gpu_model: cuBLASLt unavailable (%s): linear layers use cuBLAS\n",
                strerror(-rc));
        return 0;
    }
    g->gemm_lt = 1;
    return 0;
}

/* The speed levers (docs/perf.md, "GPU speed levers"): BERTD_LEVER_<NAME>
 * set to 1/on or 0/off turns one on or off; unset keeps its default
 * (CUDA_LEVERS_DEFAULT). Anything else is refused, naming the variable. */
static const struct {
    const char *env;
    unsigned bit;
} lever_env[] = {
    {"BERTD_LEVER_LN_VEC", CUDA_LEVER_LN_VEC},
    {"BERTD_LEVER_OPT_ZERO", CUDA_LEVER_OPT_ZERO},
    {"BERTD_LEVER_LT_TUNE", CUDA_LEVER_LT_TUNE},
    {"BERTD_LEVER_VOCAB_PAD", CUDA_LEVER_VOCAB_PAD},
    {"BERTD_LEVER_FLASH2", CUDA_LEVER_FLASH2},
    {"BERTD_LEVER_GRAPH", CUDA_LEVER_GRAPH},
    {"BERTD_LEVER_GELU_EPI", CUDA_LEVER_GELU_EPI},
};

int gpu_levers_from_env(unsigned *out, char *err, size_t errlen)
{
    unsigned mask = CUDA_LEVERS_DEFAULT;
    for (size_t i = 0; i < sizeof lever_env / sizeof lever_env[0]; i++) {
        const char *v = getenv(lever_env[i].env);
        if (!v || !*v)
            continue;
        if (strcmp(v, "1") == 0 || strcmp(v, "on") == 0) {
            mask |= lever_env[i].bit;
        } else if (strcmp(v, "0") == 0 || strcmp(v, "off") == 0) {
            mask &= ~lever_env[i].bit;
        } else {
            snprintf(err, errlen, "%s=\"%s\": expected 1, on, 0 or off", lever_env[i].env, v);
            return -EINVAL;
        }
    }
    *out = mask;
    return 0;
}

int gpu_model_create(gpu_model **out, const bert_config *cfg, kdtype dt, int device, int max_B,
                     int T, int max_M, const optim_config *oc, char *err, size_t errlen)
{
    return gpu_model_create_reserving(out, cfg, dt, device, max_B, T, max_M, oc, 0, err, errlen);
}

size_t gpu_model_comm_reserve_bytes(const bert_config *cfg, int world, int lowp_reduce)
{
    if (world <= 1)
        return 0;
    /* NCCL's own buffers: NCCL_BUFFSIZE (4 MiB) per channel, protocol and
     * direction, connected lazily at the first collective (NCCL_RUNTIME_CONNECT),
     * so after this plan was made; 32 channels x 2 x ~8.9 MiB (Simple + LL128
     * + LL) is ~570 MiB on an NVLink box. An estimate, named as one. */
    size_t nccl = 576u << 20;
    /* the bf16/fp16 reduction stages a bucket in 16 bits (cudaMallocAsync on
     * the comm stream); a whole-model bound covers the unbucketed path */
    size_t staging = lowp_reduce ? count_params(cfg) * 2 : 0;
    return nccl + staging;
}

int gpu_model_create_reserving(gpu_model **out, const bert_config *cfg, kdtype dt, int device,
                               int max_B, int T, int max_M, const optim_config *oc,
                               size_t reserve, char *err, size_t errlen)
{
    if (errlen)
        err[0] = '\0';
    int rc = bert_config_validate(cfg, err, errlen);
    if (rc < 0)
        return rc;
    if (max_B < 1 || T < 1 || T > cfg->max_position_embeddings || max_M < 0 ||
        (long long)max_M > (long long)max_B * T) {
        snprintf(err, errlen, "capacity %d x %d with %d masked positions is impossible", max_B, T,
                 max_M);
        return -EINVAL;
    }
    rc = optim_config_validate(oc, err, errlen);
    if (rc < 0)
        return rc;
    gpu_model *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    g->cfg = *cfg;
    g->dt = dt;
    g->device = device;
    g->max_B = max_B;
    g->T = T;
    g->max_M = max_M;
    g->ocfg = *oc;
    g->staged = g->cur = -1;
    bert_param_sizes(cfg, g->param_sizes);
    g->num_params = count_params(cfg);
    g->dev_params = g->num_params;
    g->vocab_ld = cfg->vocab_size;
    size_t *segs = NULL;
    int *decays = NULL;
    cuda_chunk *chunks = NULL;
    uint8_t *dec8 = NULL;

    GPU_TRY(cudaSetDevice(device));
    /* bf16 arithmetic needs sm_80; below it (a V100) the bf16 kernels trap
     * and take the context with them: refuse before anything runs */
    if (dt == KDT_BF16) {
        int major = 0, minor = 0;
        GPU_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        GPU_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        if (major < 8) {
            snprintf(err, errlen, "bf16 needs compute capability 8.0 or newer; device %d is "
                     "%d.%d (train in fp16 or fp32)", device, major, minor);
            rc = -ENOTSUP;
            goto out;
        }
    }
    rc = gpu_levers_from_env(&g->levers, err, errlen);
    if (rc < 0)
        goto out;
    if (g->levers & CUDA_LEVER_VOCAB_PAD) {
        /* the tied word-embedding/decoder weight and the decoder bias take
         * zero rows up to the padded width in every device span */
        size_t C = (size_t)cfg->hidden_size, Vp = vocab_pad64((size_t)cfg->vocab_size);
        g->vocab_ld = (int)Vp;
        g->param_sizes[BP_WTE] = Vp * C;
        g->param_sizes[BP_DEC_B] = Vp;
        g->dev_params = 0;
        for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
            g->dev_params += g->param_sizes[i];
    }
    /* lever CUDA_LEVER_GRAPH: room for the masked rows padded up to 64 */
    g->dev_scalars = (g->levers & CUDA_LEVER_GRAPH) != 0;
    g->act_M = g->dev_scalars ? mask_pad64(max_M, INT_MAX, (long long)max_B * T) : max_M;
    /* the memory plan first: refuse clearly rather than fail half-way */
    size_t free_b = 0, total_b = 0;
    GPU_TRY(cudaMemGetInfo(&free_b, &total_b));
    size_t state = state_bytes_n(g->dev_params, dt);
    size_t acts = gpu_model_act_bytes(cfg, dt, max_B, T, g->act_M);
    size_t slack = SLACK + reserve;
    if (state + acts + slack > free_b) {
        int lo = 0, hi = max_B; // largest b in [1, max_B] that fits, 0 if none
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            int mM = scaled_M(max_M, max_B, mid);
            if (g->dev_scalars)
                mM = mask_pad64(mM, INT_MAX, (long long)mid * T);
            size_t need = state + gpu_model_act_bytes(cfg, dt, mid, T, mM);
            if (need + slack <= free_b)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (lo > 0)
            snprintf(err, errlen,
                     "batch %d x %d (%s) needs %.2f GiB of activations + %.2f GiB of "
                     "parameters, gradients and optimizer state, but %.2f GiB of %.2f GiB are free "
                     "on device %d: the largest per-device batch that fits is %d",
                     max_B, T, kdtype_name(dt), acts / 1073741824.0, state / 1073741824.0,
                     free_b / 1073741824.0, total_b / 1073741824.0, device, lo);
        else
            snprintf(err, errlen,
                     "even a batch of 1 x %d (%s) does not fit: %.2f GiB of parameters, gradients "
                     "and optimizer state with %.2f GiB free on device %d",
                     T, kdtype_name(dt), state / 1073741824.0, free_b / 1073741824.0, device);
        rc = -ENOMEM;
        goto out;
    }
    rc = cuda_kernels_init();
    if (rc < 0) {
        snprintf(err, errlen, "cuBLAS initialisation failed on device %d", device);
        goto out;
    }
    rc = gemm_pick(g, err, errlen);
    if (rc < 0)
        goto out;
    cuda_levers_set(g->levers);

    size_t n = g->dev_params, lp_bytes = dt == KDT_F32 ? 0 : n * kdtype_size(dt);
    // the 16-bit copy starts at the next 256-byte boundary after the fp32 span
    GPU_TRY(cudaMalloc(&g->params_alloc, align256(n * 4) + lp_bytes));
    g->params_memory = g->params_alloc;
    g->params_lp_memory = dt == KDT_F32 ? (void *)g->params_memory
                                        : (void *)((char *)g->params_alloc + align256(n * 4));
    GPU_TRY(cudaMalloc((void **)&g->grads_memory, n * 4));
    GPU_TRY(cudaMalloc((void **)&g->opt_memory, 2 * n * 4));
    g->acts_bytes = acts;
    GPU_TRY(cudaMalloc(&g->acts_memory, acts));
    GPU_TRY(cudaMemset(g->params_alloc, 0, align256(n * 4) + lp_bytes));
    GPU_TRY(cudaMemset(g->grads_memory, 0, n * 4));
    g->grads_zero = 1;
    GPU_TRY(cudaMemset(g->opt_memory, 0, 2 * n * 4));
    point_params(&g->params, g->params_memory, g->param_sizes);
    point_params(&g->grads, g->grads_memory, g->param_sizes);
    g->acts = calloc(1, sizeof *g->acts);
    if (!g->acts) {
        rc = -ENOMEM;
        goto out;
    }
    act_layout(cfg, dt, max_B, T, g->act_M, g->acts_memory, g->acts);

    /* optimizer: HF tensors (per layer, Q/K/V apart) cut into chunks */
    int nseg = bert_param_segments(cfg, NULL, NULL, 0);
    segs = calloc(nseg, sizeof *segs);
    decays = calloc(nseg, sizeof *decays);
    dec8 = calloc(nseg, 1);
    if (!segs || !decays || !dec8) {
        rc = -ENOMEM;
        goto out;
    }
    bert_param_segments(cfg, segs, decays, nseg);
    int nch = 0;
    for (int s = 0; s < nseg; s++)
        nch += (int)((segs[s] + OPT_CHUNK - 1) / OPT_CHUNK);
    chunks = calloc(nch ? nch : 1, sizeof *chunks);
    if (!chunks) {
        rc = -ENOMEM;
        goto out;
    }
    size_t off = 0;
    int k = 0;
    for (int s = 0; s < nseg; s++) {
        /* chunk offsets are device offsets: with the vocabulary padded the
         * padding rows belong to no chunk and are never updated */
        size_t doff = dev_pos(g, off);
        for (size_t i = 0; i < segs[s]; i += OPT_CHUNK) {
            size_t len = segs[s] - i < OPT_CHUNK ? segs[s] - i : OPT_CHUNK;
            chunks[k++] = (cuda_chunk){.off = doff + i, .len = (uint32_t)len, .seg = (uint32_t)s};
        }
        off += segs[s];
        dec8[s] = (uint8_t)decays[s];
    }
    g->num_chunks = nch;
    g->num_segs = nseg;
    GPU_TRY(cudaMalloc((void **)&g->chunks, (nch ? nch : 1) * sizeof *chunks));
    GPU_TRY(cudaMemcpy(g->chunks, chunks, nch * sizeof *chunks, cudaMemcpyHostToDevice));
    GPU_TRY(cudaMalloc((void **)&g->seg_decay, nseg));
    GPU_TRY(cudaMemcpy(g->seg_decay, dec8, nseg, cudaMemcpyHostToDevice));
    GPU_TRY(cudaMalloc((void **)&g->seg_norms, 2 * (size_t)nseg * sizeof(double)));
    GPU_TRY(cudaMalloc((void **)&g->sumsq, sizeof(double)));
    GPU_TRY(cudaMalloc((void **)&g->nonfinite, sizeof(int)));

    GPU_TRY(cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking));
    GPU_TRY(cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking));
    g->comm = g->compute;
    for (int i = 0; i < 2; i++) {
        GPU_TRY(cudaEventCreateWithFlags(&g->slot_ready[i], cudaEventDisableTiming));
        GPU_TRY(cudaEventCreateWithFlags(&g->slot_free[i], cudaEventDisableTiming));
        GPU_TRY(cudaMallocHost((void **)&g->host_slot[i],
                               slot_ints(max_B, T, g->act_M) * sizeof(int32_t)));
    }
    GPU_TRY(cudaEventCreateWithFlags(&g->loss_ready, cudaEventDisableTiming));
    GPU_TRY(cudaEventCreateWithFlags(&g->grads_ready, cudaEventDisableTiming));
    GPU_TRY(cudaEventCreateWithFlags(&g->comm_done, cudaEventDisableTiming));
    GPU_TRY(cudaEventCreate(&g->t_bwd_done)); // timed: exposed communication
    GPU_TRY(cudaEventCreate(&g->t_comm_waited));
    GPU_TRY(cudaMallocHost((void **)&g->loss_host, 2 * sizeof(float)));
    GPU_TRY(cudaMallocHost((void **)&g->norm_host, sizeof(double)));
    GPU_TRY(cudaMallocHost((void **)&g->flag_host, sizeof(int)));
    if (g->dev_scalars) {
        GPU_TRY(cudaMalloc(&g->dscal, sizeof(step_scalars)));
        GPU_TRY(cudaMemset(g->dscal, 0, sizeof(step_scalars)));
        GPU_TRY(cudaMalloc(&g->opt_args, cuda_opt_args_bytes()));
        GPU_TRY(cudaMemset(g->opt_args, 0, cuda_opt_args_bytes()));
        GPU_TRY(cudaEventCreateWithFlags(&g->step_done, cudaEventDisableTiming));
    }

    /* The memsets and copies above ran on the legacy stream, which the
     * model's non-blocking streams do not wait for: finish them now. */
    GPU_TRY(cudaDeviceSynchronize());
    /* torch.cuda.amp.GradScaler defaults; only fp16 needs it */
    g->scaler = (gpu_loss_scaler){.scale = dt == KDT_F16 ? 65536.0f : 1.0f,
                                  .enabled = dt == KDT_F16, .growth_interval = 2000};
    *out = g;
    g = NULL;
    rc = 0;
out:
    if (rc < 0 && err[0] == '\0')
        snprintf(err, errlen, "CUDA setup failed on device %d (see log)", device);
    free(segs);
    free(decays);
    free(dec8);
    free(chunks);
    gpu_model_destroy(g);
    return rc;
}

void gpu_model_destroy(gpu_model *g)
{
    if (!g)
        return;
    if (g->compute)
        cudaStreamSynchronize(g->compute);
    if (g->copy)
        cudaStreamSynchronize(g->copy);
    graphs_free(g);
    cudaFree(g->params_alloc);
    cudaFree(g->grads_memory);
    cudaFree(g->opt_memory);
    cudaFree(g->acts_memory);
    cudaFree(g->chunks);
    cudaFree(g->seg_decay);
    cudaFree(g->seg_norms);
    cudaFree(g->sumsq);
    cudaFree(g->nonfinite);
    cudaFree(g->dscal);
    cudaFree(g->opt_args);
    if (g->step_done)
        cudaEventDestroy(g->step_done);
    for (int i = 0; i < 2; i++) {
        if (g->slot_ready[i])
            cudaEventDestroy(g->slot_ready[i]);
        if (g->slot_free[i])
            cudaEventDestroy(g->slot_free[i]);
        cudaFreeHost(g->host_slot[i]);
    }
    if (g->loss_ready)
        cudaEventDestroy(g->loss_ready);
    if (g->grads_ready)
        cudaEventDestroy(g->grads_ready);
    if (g->comm_done)
        cudaEventDestroy(g->comm_done);
    if (g->t_bwd_done)
        cudaEventDestroy(g->t_bwd_done);
    if (g->t_comm_waited)
        cudaEventDestroy(g->t_comm_waited);
    cudaFreeHost(g->loss_host);
    cudaFreeHost(g->norm_host);
    cudaFreeHost(g->flag_host);
    if (g->own_comm)
        cudaStreamDestroy(g->comm);
    if (g->compute)
        cudaStreamDestroy(g->compute);
    if (g->copy)
        cudaStreamDestroy(g->copy);
    free(g->acts);
    free(g);
}

int gpu_model_set_params(gpu_model *g, const float *host)
{
    int rc = span_copy(g, g->params_memory, (float *)host, 1, 1);
    if (rc < 0)
        return rc;
    if (g->dt != KDT_F32) // the padding rows are zero in both copies
        cuda_cast(g->params_lp_memory, g->dt, g->params_memory, KDT_F32, g->dev_params,
                  g->compute);
    GPU_TRY(cudaStreamSynchronize(g->compute));
out:
    return rc;
}

int gpu_model_get_params(gpu_model *g, float *host)
{
    return span_copy(g, g->params_memory, host, 1, 0);
}

int gpu_model_get_grads(gpu_model *g, float *host)
{
    return span_copy(g, g->grads_memory, host, 1, 0);
}

int gpu_model_get_opt_state(gpu_model *g, float *host)
{
    return span_copy(g, g->opt_memory, host, 2, 0);
}

int gpu_model_set_opt_state(gpu_model *g, const float *host, long t)
{
    if (t < 0)
        return -EINVAL;
    g->t = t;
    return span_copy(g, g->opt_memory, (float *)host, 2, 1);
}

/* Ints of a device slot a B x T batch with M masked positions really uses:
 * ids (N), types (N), lens (B), positions (M), labels (M), nsp (B), CLS rows
 * (B). slot_ints is the capacity. */
static size_t slot_used(int B, int T, int M)
{
    return 2 * (size_t)B * T + 3 * (size_t)B + 2 * (size_t)M;
}

/* Lever CUDA_LEVER_GRAPH: masked rows M..Mp-1 of a slot are padding: label
 * -1 (the loss kernels give them loss 0 and a gradient row of exact zeros)
 * at the first positions no real row has, so that no two rows of the
 * head's gradient scatter meet at one position (N >= Mp positions). */
static int pad_masked(int32_t *pos, int32_t *labels, int M, int Mp, size_t N)
{
    unsigned char *taken = calloc(N, 1);
    if (!taken)
        return -ENOMEM;
    for (int i = 0; i < M; i++)
        taken[pos[i]] = 1;
    size_t p = 0;
    for (int i = M; i < Mp; i++) {
        while (taken[p])
            p++;
        pos[i] = (int32_t)p++;
        labels[i] = -1;
    }
    free(taken);
    return 0;
}

/* Both uploads: validate, pick the device slot, fill the pinned staging
 * buffer (all of it, or with inplace only the part after ids/types/lens),
 * then on the copy stream wait until the slot's last reader is done, copy,
 * record slot_ready. */
static int upload_batch(gpu_model *g, const bert_batch *b, int inplace, char *err, size_t errlen)
{
    int rc;
    /* bert_batch_validate reads only the config of the model it is given */
    bert_model view;
    memset(&view, 0, sizeof view);
    view.cfg = g->cfg;
    rc = bert_batch_validate(&view, b, err, errlen);
    if (rc < 0)
        return rc;
    if (b->B > g->max_B || b->T > g->T || b->M > g->max_M) {
        snprintf(err, errlen, "batch %d x %d with %d masked positions exceeds the capacity %d x %d "
                 "with %d", b->B, b->T, b->M, g->max_B, g->T, g->max_M);
        return -EINVAL;
    }
    if (g->dt != KDT_F32 && b->M > 0) {
        /* 16-bit gradient scatter has no atomics: positions must be distinct */
        size_t N = (size_t)b->B * b->T;
        unsigned char *seen = calloc(N, 1);
        if (!seen)
            return -ENOMEM;
        for (int i = 0; i < b->M; i++) {
            if (seen[b->mlm_positions[i]]++) {
                snprintf(err, errlen, "mlm_positions[%d] = %d repeats an earlier position", i,
                         b->mlm_positions[i]);
                free(seen);
                return -EINVAL;
            }
        }
        free(seen);
    }
    int s = g->staged < 0 ? 0 : 1 - g->staged;
    if (s == g->cur && g->have_forward) {
        /* only two slots: the one in use by a pending backward is never reused */
        s = 1 - s;
    }
    size_t N = (size_t)b->B * b->T, head = 2 * N + (size_t)b->B; // ids, types, lens
    /* lever CUDA_LEVER_GRAPH: Mp >= M rows, the real ones first */
    int Mp = g->dev_scalars ? mask_pad64(b->M, g->act_M, (long long)N) : b->M;
    size_t used = slot_used(b->B, b->T, Mp);
    /* the pinned slot may still be feeding its previous copy */
    GPU_TRY(cudaEventSynchronize(g->slot_ready[s]));
    int32_t *h = g->host_slot[s];
    /* the word-embedding gradient sums each token's positions in this
     * order (no float atomics: the same bits on every run) */
    int U = cuda_embeddings_order(h + used, h + used + N, b->input_ids, (int)N,
                                  g->cfg.vocab_size);
    if (U < 0) {
        snprintf(err, errlen, "cannot order the batch's token ids: %s", strerror(-U));
        return U;
    }
    if (!inplace) {
        memcpy(h, b->input_ids, N * 4);
        memcpy(h + N, b->token_type_ids, N * 4);
        memcpy(h + 2 * N, b->seq_lens, (size_t)b->B * 4);
    }
    if (b->M > 0) {
        memcpy(h + head, b->mlm_positions, (size_t)b->M * 4);
        memcpy(h + head + Mp, b->mlm_labels, (size_t)b->M * 4);
    }
    if (Mp > b->M && (rc = pad_masked(h + head, h + head + Mp, b->M, Mp, N)) < 0)
        return rc;
    int32_t *nsp = h + head + 2 * (size_t)Mp, *cls = nsp + b->B;
    for (int i = 0; i < b->B; i++) {
        nsp[i] = g->cfg.nsp ? b->nsp_labels[i] : 0;
        cls[i] = i * b->T;
    }
    /* the device slot may still be read by the step that used it last */
    GPU_TRY(cudaStreamWaitEvent(g->copy, g->slot_free[s], 0));
    int32_t *d = g->acts->slot[s];
    size_t sent = used + N + (size_t)U + 1; // the order and its runs too
    if (inplace) {
        /* one DMA per contiguous run of the caller's ids | types | lens (a
         * ring slot has them back to back when B*T is a multiple of 16) */
        const int32_t *src[3] = {b->input_ids, b->token_type_ids, b->seq_lens};
        size_t cnt[3] = {N, N, (size_t)b->B}, off = 0;
        for (int i = 0; i < 3;) {
            const int32_t *p = src[i];
            size_t n = cnt[i++];
            while (i < 3 && src[i] == p + n)
                n += cnt[i++];
            GPU_TRY(cudaMemcpyAsync(d + off, p, n * 4, cudaMemcpyHostToDevice, g->copy));
            off += n;
        }
        GPU_TRY(cudaMemcpyAsync(d + head, h + head, (sent - head) * 4, cudaMemcpyHostToDevice,
                                g->copy));
    } else {
        GPU_TRY(cudaMemcpyAsync(d, h, sent * 4, cudaMemcpyHostToDevice, g->copy));
    }
    GPU_TRY(cudaEventRecord(g->slot_ready[s], g->copy));
    /* only the shapes are kept: after gpu_model_upload the caller's arrays
     * may go away; after gpu_model_upload_inplace, once upload_wait returns */
    g->batch[s] = (bert_batch){.B = b->B, .T = b->T, .M = b->M};
    g->mpad[s] = Mp;
    g->emb_runs[s] = U;
    g->staged = s;
    rc = 0;
out:
    return rc;
}

int gpu_model_upload(gpu_model *g, const bert_batch *b, char *err, size_t errlen)
{
    return upload_batch(g, b, 0, err, errlen);
}

int gpu_model_upload_inplace(gpu_model *g, const bert_batch *b, char *err, size_t errlen)
{
    return upload_batch(g, b, 1, err, errlen);
}

int gpu_model_upload_wait(gpu_model *g)
{
    int rc = 0;
    if (g->staged < 0)
        return -EINVAL;
    GPU_TRY(cudaEventSynchronize(g->slot_ready[g->staged]));
out:
    return rc;
}

int gpu_model_read_staged(gpu_model *g, int32_t *host, size_t n)
{
    int rc = 0;
    if (g->staged < 0)
        return -EINVAL;
    const bert_batch *b = &g->batch[g->staged];
    if (n != slot_used(b->B, b->T, g->mpad[g->staged]))
        return -EINVAL;
    GPU_TRY(cudaEventSynchronize(g->slot_ready[g->staged]));
    GPU_TRY(cudaMemcpyAsync(host, g->acts->slot[g->staged], n * 4, cudaMemcpyDeviceToHost,
                            g->copy));
    GPU_TRY(cudaStreamSynchronize(g->copy));
out:
    return rc;
}

/* Device address of a field of the per-step scalars (lever CUDA_LEVER_GRAPH). */
#define DSCAL(g, field) ((void *)((char *)(g)->dscal + offsetof(step_scalars, field)))

/* The Philox stream of one dropout site, or NULL when that dropout is off
 * (worker/model.c site_rng, same arguments). With the lever
 * CUDA_LEVER_GRAPH the kernels take {step, micro} from the per-step
 * scalars (written by the forward) in place of the values here. */
static const philox_stream *site_rng(const gpu_model *g, philox_stream *s, const bert_dropout *d,
                                     float p, int layer, int site)
{
    if (!d || !d->train || p <= 0.0f)
        return NULL;
    philox_stream_init(s, d->seed, d->rank, d->step, d->micro, (uint32_t)layer, (uint32_t)site);
    if (g->dev_scalars)
        s->dev_ctr = DSCAL(g, ctr);
    return s;
}

/* pointer to element idx of a dt buffer */
static void *el(void *base, size_t idx, kdtype dt)
{
    return (char *)base + idx * kdtype_size(dt);
}

/* the dt copy of parameter tensor i, at element offset k within it */
static void *lp(gpu_model *g, int i, size_t k)
{
    size_t off = 0;
    for (int j = 0; j < i; j++)
        off += g->param_sizes[j];
    return el(g->params_lp_memory, off + k, g->dt);
}

/* fp32 parameter tensor i and its gradient, at element offset k within it */
static size_t param_at(const gpu_model *g, int i, size_t k)
{
    for (int j = 0; j < i; j++)
        k += g->param_sizes[j];
    return k;
}
static float *pf(gpu_model *g, int i, size_t k)
{
    return g->params_memory + param_at(g, i, k);
}
static float *gf(gpu_model *g, int i, size_t k)
{
    return g->grads_memory + param_at(g, i, k);
}

/* The linear layers: weight tensor wi at element offset woff, bias tensor bi
 * at boff. cuBLASLt with the bias in the GEMM's epilogue (it reads the
 * bias's dt copy) when g->gemm_lt and cuBLASLt has an algorithm for the
 * shape; else cuBLAS and a bias pass over the output (fp32 bias). */
static void linear_forward(gpu_model *g, void *out, const void *inp, int wi, size_t woff, int bi,
                           size_t boff, int N, int C, int OC)
{
    const void *w = lp(g, wi, woff);
    if (g->gemm_lt && cuda_lt_matmul_forward_dt(out, NULL, inp, w, lp(g, bi, boff), N, C, OC,
                                                g->dt, g->compute) == 0)
        return;
    cuda_matmul_forward_dt(out, inp, w, pf(g, bi, boff), N, C, OC, g->dt, g->compute);
}

/* pre = inp @ W^T + b, act = gelu(pre), GELU in the form of hidden_act:
 * erf ("gelu") or tanh ("gelu_new", "gelu_pytorch_tanh"). cuBLASLt's GELU
 * epilogue is the tanh form: with lever CUDA_LEVER_GELU_EPI a tanh-GELU
 * model runs it (GELU_AUX_BIAS, pre as the aux); otherwise on the cuBLASLt
 * path only the bias is fused and the GELU stays a pass of its own; the
 * cuBLAS path keeps its fused bias+GELU pass. */
static void linear_gelu_forward(gpu_model *g, void *act, void *pre, const void *inp, int wi,
                                size_t woff, int bi, size_t boff, int N, int C, int OC)
{
    const void *w = lp(g, wi, woff);
    int tanh_form = bert_act_is_tanh(g->cfg.act);
    if (g->gemm_lt && tanh_form && (g->levers & CUDA_LEVER_GELU_EPI) &&
        cuda_lt_matmul_forward_dt(act, pre, inp, w, lp(g, bi, boff), N, C, OC, g->dt,
                                  g->compute) == 0)
        return;
    if (g->gemm_lt && cuda_lt_matmul_forward_dt(pre, NULL, inp, w, lp(g, bi, boff), N, C, OC,
                                                g->dt, g->compute) == 0) {
        if (tanh_form)
            cuda_gelu_tanh_forward_dt(act, pre, (size_t)N * OC, g->dt, g->compute);
        else
            cuda_gelu_forward_dt(act, pre, (size_t)N * OC, g->dt, g->compute);
        return;
    }
    cuda_matmul_forward_dt(pre, inp, w, NULL, N, C, OC, g->dt, g->compute);
    if (tanh_form)
        cuda_bias_gelu_tanh_forward_dt(act, pre, pf(g, bi, boff), N, OC, g->dt, g->compute);
    else
        cuda_bias_gelu_forward_dt(act, pre, pf(g, bi, boff), N, OC, g->dt, g->compute);
}

/* dpre = gelu'(pre) * dact in the form of hidden_act */
static void act_backward(gpu_model *g, void *dpre, const void *pre, const void *dact, size_t n)
{
    if (bert_act_is_tanh(g->cfg.act))
        cuda_gelu_tanh_backward_dt(dpre, pre, dact, n, g->dt, g->compute);
    else
        cuda_gelu_backward_dt(dpre, pre, dact, n, g->dt, g->compute);
}

/* dinp (may be NULL) =, dW +=, db += (BGRADB epilogue on the cuBLASLt path). */
static void linear_backward(gpu_model *g, void *dinp, const void *dout, const void *inp, int wi,
                            size_t woff, int bi, size_t boff, int N, int C, int OC)
{
    const void *w = lp(g, wi, woff);
    float *dw = gf(g, wi, woff), *db = gf(g, bi, boff);
    if (g->gemm_lt && cuda_lt_matmul_backward_dt(dinp, dw, db, dout, inp, w, NULL, N, C, OC,
                                                 g->dt, g->compute) == 0)
        return;
    cuda_matmul_backward_dt(dinp, dw, db, dout, inp, w, N, C, OC, g->dt, g->compute);
}

/* Writes the per-step scalars of a forward of slot s (lever
 * CUDA_LEVER_GRAPH): read by that forward and its backward, after it on the
 * compute stream. A pageable source: the copy is staged before the call
 * returns (and so stays outside any capture). */
static int write_scalars(gpu_model *g, int s, const bert_dropout *d, float loss_scale)
{
    int rc = 0;
    const bert_batch *b = &g->batch[s];
    step_scalars in = {
        .ctr = {d && d->train ? d->step : 0, d && d->train ? d->micro : 0},
        .U = g->emb_runs[s],
        .mlm_gs = loss_scale > 0 && b->M > 0 ? loss_scale / (float)b->M : 0.0f,
        .nsp_gs = loss_scale > 0 ? loss_scale / (float)b->B : 0.0f,
    };
    GPU_TRY(cudaMemcpyAsync(g->dscal, &in, STEP_SCALARS_IN, cudaMemcpyHostToDevice, g->compute));
out:
    return rc;
}

/* The forward's work on the compute stream (what a graph captures): from
 * the embeddings to the loss sums' copy into loss_host. */
static int forward_kernels(gpu_model *g, int s, const bert_dropout *d, float loss_scale)
{
    int rc = 0;
    const bert_batch *b = &g->batch[s];
    const bert_config *c = &g->cfg;
    int B = b->B, T = b->T, C = c->hidden_size, NH = c->num_attention_heads,
        I = c->intermediate_size, L = c->num_hidden_layers, V = c->vocab_size,
        M = g->mpad[s]; // the slot's masked rows: with CUDA_LEVER_GRAPH padded past b->M
    size_t N = (size_t)B * T, NC = N * C;
    float eps = c->layer_norm_eps, ph = c->hidden_dropout_prob,
          pa = c->attention_probs_dropout_prob;
    kdtype dt = g->dt;
    cudaStream_t st = g->compute;
    bert_params *p = &g->params;
    gpu_acts *a = g->acts;
    philox_stream rs;
    const philox_stream *r;
    const int32_t *ids = g->acts->slot[s], *tt = ids + N, *lens = tt + N, *pos = lens + B,
                  *labels = pos + M, *nsp_labels = labels + M, *cls_rows = nsp_labels + B;

    cuda_embeddings_forward_dt(a->emb, ids, tt, p->wte, p->wpe, p->wtt, B, T, C, dt, st);
    cuda_layernorm_forward_dt(a->emb_ln, a->emb_mean, a->emb_rstd, a->emb, p->emb_lnw, p->emb_lnb,
                              (int)N, C, eps, dt, st);
    r = site_rng(g, &rs, d, ph, L, DROPOUT_SITE_EMB);
    cuda_dropout_forward_dt(a->x0, a->emb_ln, r, ph, NC, dt, st);

    for (int l = 0; l < L; l++) {
        const void *x = l == 0 ? a->x0 : el(a->ln2, (size_t)(l - 1) * NC, dt); // (N,C)
        void *qkvr = el(a->qkvr, (size_t)l * 3 * NC, dt);
        void *att = a->fused ? (void *)((float *)a->att + (size_t)l * B * NH * T)
                             : el(a->att, (size_t)l * B * NH * T * T, dt);
        void *atty = el(a->atty, l * NC, dt), *res1 = el(a->res1, l * NC, dt),
             *ln1 = el(a->ln1, l * NC, dt), *res2 = el(a->res2, l * NC, dt),
             *ln2 = el(a->ln2, l * NC, dt);
        /* fused: the QKV GEMM writes straight into the saved (N,3C) slot */
        void *qkv = a->fused ? qkvr : a->qkv_s;
        void *fch = el(a->fch, (size_t)l * N * I, dt), *fch_gelu = el(a->fch_gelu, (size_t)l * N * I, dt);

        linear_forward(g, qkv, x, BP_QKVW, (size_t)l * 3 * C * C, BP_QKVB, (size_t)l * 3 * C,
                       (int)N, C, 3 * C);
        r = site_rng(g, &rs, d, pa, l, DROPOUT_SITE_ATTN_PROBS);
        if (a->fused)
            cuda_flash_attention_forward_dt(atty, att, qkv, lens, r, pa, B, T, C, NH, dt, st);
        else
            cuda_attention_forward_dt(atty, qkvr, att, a->att_scratch, qkv, lens, r, pa, B, T, C,
                                      NH, dt, st);
        linear_forward(g, a->proj_s, atty, BP_ATTPROJW, (size_t)l * C * C, BP_ATTPROJB,
                       (size_t)l * C, (int)N, C, C);
        r = site_rng(g, &rs, d, ph, l, DROPOUT_SITE_ATTN_OUT);
        cuda_residual_dropout_layernorm_forward_dt(ln1, res1, a->ln1_mean + l * N,
                                                   a->ln1_rstd + l * N, x, a->proj_s, r, ph,
                                                   p->ln1w + (size_t)l * C, p->ln1b + (size_t)l * C,
                                                   (int)N, C, eps, dt, st);
        linear_gelu_forward(g, fch_gelu, fch, ln1, BP_FCW, (size_t)l * I * C, BP_FCB,
                            (size_t)l * I, (int)N, C, I);
        linear_forward(g, a->proj_s, fch_gelu, BP_FCPROJW, (size_t)l * C * I, BP_FCPROJB,
                       (size_t)l * C, (int)N, I, C);
        r = site_rng(g, &rs, d, ph, l, DROPOUT_SITE_FFN_OUT);
        cuda_residual_dropout_layernorm_forward_dt(ln2, res2, a->ln2_mean + l * N,
                                                   a->ln2_rstd + l * N, ln1, a->proj_s, r, ph,
                                                   p->ln2w + (size_t)l * C, p->ln2b + (size_t)l * C,
                                                   (int)N, C, eps, dt, st);
    }
    const void *hidden = el(a->ln2, (size_t)(L - 1) * NC, dt); // (N,C)

    /* MLM head on the masked rows only; the loss gradient is written in
     * place of the logits right away (the logits are not needed again) */
    if (M > 0) {
        cuda_gather_rows_forward_dt(a->hsel, hidden, pos, M, C, dt, st);
        linear_gelu_forward(g, a->hg, a->hd, a->hsel, BP_HEAD_W, 0, BP_HEAD_B, 0, M, C, C);
        cuda_layernorm_forward_dt(a->hln, a->h_mean, a->h_rstd, a->hg, p->head_lnw, p->head_lnb, M,
                                  C, eps, dt, st);
        /* at the padded width with CUDA_LEVER_VOCAB_PAD: the loss sees
         * the first V columns and zeroes the gradient of the rest */
        linear_forward(g, a->logits, a->hln, BP_WTE, 0, BP_DEC_B, 0, M, C, g->vocab_ld);
        if (g->dev_scalars) // padding rows (label -1): loss 0, gradient 0
            cuda_mlm_xent_fused_ld_dev(a->losses, a->logits, labels, DSCAL(g, mlm_gs), M, V,
                                       g->vocab_ld, dt, st);
        else
            cuda_mlm_xent_fused_ld_dt(a->losses, a->logits, labels,
                                      loss_scale > 0 ? loss_scale / (float)M : 0.0f, M, V,
                                      g->vocab_ld, dt, st);
        cuda_sum(a->loss_sum, a->losses, M, st);
    } else {
        GPU_TRY(cudaMemsetAsync(a->loss_sum, 0, sizeof(float), st));
    }
    /* NSP head (BertForPreTraining): pooler on the CLS rows, 2-way loss */
    if (c->nsp) {
        cuda_gather_rows_forward_dt(a->cls, hidden, cls_rows, B, C, dt, st);
        linear_forward(g, a->pool_pre, a->cls, BP_POOL_W, 0, BP_POOL_B, 0, B, C, C);
        cuda_tanh_forward_dt(a->pooled, a->pool_pre, (size_t)B * C, dt, st);
        linear_forward(g, a->nsp_logits, a->pooled, BP_NSP_W, 0, BP_NSP_B, 0, B, C, 2);
        if (g->dev_scalars)
            cuda_mlm_xent_fused_dev(a->nsp_losses, a->nsp_logits, nsp_labels, DSCAL(g, nsp_gs),
                                    B, 2, dt, st);
        else
            cuda_mlm_xent_fused_dt(a->nsp_losses, a->nsp_logits, nsp_labels,
                                   loss_scale > 0 ? loss_scale / (float)B : 0.0f, B, 2, dt, st);
        cuda_sum(a->loss_sum + 1, a->nsp_losses, B, st);
    } else {
        GPU_TRY(cudaMemsetAsync(a->loss_sum + 1, 0, sizeof(float), st));
    }
    GPU_TRY(cudaMemcpyAsync(g->loss_host, a->loss_sum, 2 * sizeof(float), cudaMemcpyDeviceToHost,
                            st));
out:
    return rc;
}

/* The host's part before a forward of the staged slot: the compute stream
 * waits for its copy; the per-step scalars; the dropout its backward
 * redraws. */
static int forward_begin(gpu_model *g, const bert_dropout *d, float loss_scale)
{
    int rc = 0, s = g->staged;
    GPU_TRY(cudaStreamWaitEvent(g->compute, g->slot_ready[s], 0));
    g->cur = s;
    g->dropout_cur = d ? *d : (bert_dropout){0};
    if (g->dev_scalars)
        rc = write_scalars(g, s, d, loss_scale);
out:
    return rc;
}

/* ... and after it: the events the host and the copy stream wait on. */
static int forward_end(gpu_model *g, float loss_scale)
{
    int rc = 0;
    GPU_TRY(cudaEventRecord(g->loss_ready, g->compute));
    GPU_TRY(cudaEventRecord(g->slot_free[g->cur], g->compute));
    g->have_forward = loss_scale > 0;
    g->loss_scale_fwd = loss_scale;
out:
    return rc;
}

int gpu_model_forward(gpu_model *g, const bert_dropout *d, float loss_scale)
{
    if (g->staged < 0)
        return -EINVAL;
    int rc = forward_begin(g, d, loss_scale);
    if (rc == 0)
        rc = forward_kernels(g, g->cur, d, loss_scale);
    if (rc == 0)
        rc = forward_end(g, loss_scale);
    return rc;
}

static int comm_settle(gpu_model *g);

float gpu_model_loss(gpu_model *g)
{
    /* a launched data parallel step: the loss comes after its buckets */
    if (g->cur < 0 || comm_settle(g) < 0 || cudaEventSynchronize(g->loss_ready) != cudaSuccess)
        return NAN;
    int M = g->batch[g->cur].M, B = g->batch[g->cur].B;
    float mlm = M > 0 ? g->loss_host[0] / (float)M : 0.0f;
    return g->cfg.nsp ? mlm + g->loss_host[1] / (float)B : mlm;
}

/* IEEE half / bfloat16 bits to float, on the host (eval's argmax). */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* gpu_model_eval of a batch that fits the capacity. */
static int eval_fitting(gpu_model *g, const bert_batch *b, bert_eval_sums *acc, char *err, size_t errlen)
{
    int rc = gpu_model_upload(g, b, err, errlen);
    if (rc < 0)
        return rc;
    const bert_dropout off = {.train = 0};
    rc = gpu_model_forward(g, &off, 0.0f); /* 0: eval, the logits stay logits */
    if (rc < 0)
        return rc;
    const int M = b->M, V = g->cfg.vocab_size, ld = g->vocab_ld;
    const size_t esz = kdtype_size(g->dt), n = (size_t)M * V;
    void *raw = NULL;
    float *logits = NULL, *losses = NULL;
    GPU_TRY(cudaStreamSynchronize(g->compute));
    if (M == 0)
        goto out;
    raw = malloc((size_t)M * ld * esz);
    logits = g->dt == KDT_F32 ? raw : malloc(n * 4);
    losses = malloc((size_t)M * 4);
    if (!raw || !logits || !losses) {
        snprintf(err, errlen, "out of host memory for %d x %d eval logits", M, V);
        rc = -ENOMEM;
        goto out;
    }
    GPU_TRY(cudaMemcpy(raw, g->acts->logits, (size_t)M * ld * esz, cudaMemcpyDeviceToHost));
    GPU_TRY(cudaMemcpy(losses, g->acts->losses, (size_t)M * 4, cudaMemcpyDeviceToHost));
    if (ld != V) /* rows of ld (CUDA_LEVER_VOCAB_PAD) packed to rows of V, in place */
        for (int m = 1; m < M; m++)
            memmove((char *)raw + (size_t)m * V * esz, (char *)raw + (size_t)m * ld * esz,
                    (size_t)V * esz);
    if (g->dt != KDT_F32) {
        const uint16_t *h = raw;
        for (size_t i = 0; i < n; i++) {
            if (g->dt == KDT_F16) {
                logits[i] = half_to_float(h[i]);
            } else {
                uint32_t bits = (uint32_t)h[i] << 16;
                memcpy(&logits[i], &bits, 4);
            }
        }
    }
    bert_eval_accumulate(logits, losses, b->mlm_labels, M, V, acc);
out:
    if (logits != raw)
        free(logits);
    free(raw);
    free(losses);
    return rc;
}

int gpu_model_eval(gpu_model *g, const bert_batch *b, bert_eval_sums *acc, char *err, size_t errlen)
{
    if (b->B <= g->max_B && b->M <= g->max_M)
        return eval_fitting(g, b, acc, err, errlen);
    /* Larger than the training capacity (per_device_eval_batch_size above
     * the training batch): the sums add up, so evaluate it in runs of
     * sequences that fit, their masked positions re-based. */
    if (b->T > g->T || b->M < 0) {
        snprintf(err, errlen, "eval batch of T=%d does not fit the model's T=%d", b->T, g->T);
        return -EINVAL;
    }
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(b->M > 0 ? b->M : 1));
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)(b->M > 0 ? b->M : 1));
    int rc = pos && lab ? 0 : -ENOMEM;
    for (int j0 = 0; j0 < b->B && rc == 0;) {
        int n = b->B - j0 < g->max_B ? b->B - j0 : g->max_B;
        int m;
        for (;;) { /* shrink the run until its masked positions fit too */
            m = 0;
            for (int i = 0; i < b->M; i++) {
                int j = b->mlm_positions[i] / b->T;
                if (j >= j0 && j < j0 + n) {
                    pos[m] = b->mlm_positions[i] - j0 * b->T;
                    lab[m++] = b->mlm_labels[i];
                }
            }
            if (m <= g->max_M || n == 1)
                break;
            n /= 2;
        }
        const size_t o = (size_t)j0 * b->T;
        bert_batch sub = {
            .B = n, .T = b->T, .M = m,
            .input_ids = b->input_ids + o, .token_type_ids = b->token_type_ids + o,
            .seq_lens = b->seq_lens + j0, .mlm_positions = pos, .mlm_labels = lab,
            .nsp_labels = b->nsp_labels ? b->nsp_labels + j0 : NULL,
        };
        rc = eval_fitting(g, &sub, acc, err, errlen);
        j0 += n;
    }
    free(pos);
    free(lab);
    return rc;
}

void gpu_model_zero_grad(gpu_model *g)
{
    /* lever CUDA_LEVER_OPT_ZERO: nothing to do when the optimizer (or a
     * previous zero_grad, or create) left them zero; off: always the memset */
    if ((g->levers & CUDA_LEVER_OPT_ZERO) && g->grads_zero)
        return;
    cudaError_t e = cudaMemsetAsync(g->grads_memory, 0, g->dev_params * 4, g->compute);
    if (e != cudaSuccess)
        fprintf(stderr, "gpu_model: zero_grad: %s\n", cudaGetErrorString(e));
    else
        g->grads_zero = 1;
}

/* Enqueues ranges [first, last) of bucket b (bert_grad_bucket) through the
 * bucket hook, as one bucket (last -1: to the end). */
static int reduce_bucket(gpu_model *g, int b, int first, int last)
{
    size_t off[BERT_BUCKET_MAX_RANGES], n[BERT_BUCKET_MAX_RANGES];
    float *p[BERT_BUCKET_MAX_RANGES];
    int k = bert_grad_bucket(&g->cfg, b, off, n);
    if (k < 0)
        return k;
    if (last < 0 || last > k)
        last = k;
    for (int i = first; i < last; i++) { /* device ranges, padding included */
        size_t d = dev_pos(g, off[i]);
        n[i] = dev_end(g, off[i] + n[i]) - d;
        p[i] = g->grads_memory + d;
    }
    return first < last ? g->bucket(g->bucket_ctx, p + first, n + first, last - first, g->compute) : 0;
}

/* The backward's work on the compute stream (what a graph captures), with
 * the bucket hooks when armed. */
static int backward_kernels(gpu_model *g)
{
    int rc = 0;
    int s = g->cur;
    const bert_batch *b = &g->batch[s];
    const bert_config *c = &g->cfg;
    const bert_dropout *d = &g->dropout_cur;
    int B = b->B, T = b->T, C = c->hidden_size, NH = c->num_attention_heads,
        I = c->intermediate_size, L = c->num_hidden_layers, M = g->mpad[s];
    size_t N = (size_t)B * T, NC = N * C;
    float ph = c->hidden_dropout_prob, pa = c->attention_probs_dropout_prob;
    kdtype dt = g->dt;
    cudaStream_t st = g->compute;
    bert_params *p = &g->params, *gr = &g->grads;
    gpu_acts *a = g->acts;
    philox_stream rs;
    const philox_stream *r;
    const int32_t *ids = a->slot[s], *tt = ids + N, *lens = tt + N, *pos = lens + B,
                  *cls_rows = pos + 2 * (size_t)M + B;

    GPU_TRY(cudaMemsetAsync(a->d_res, 0, NC * kdtype_size(dt), st)); // d hidden, scattered below
    if (M > 0) {
        /* a->logits holds d(loss_scale * loss)/d logits since forward */
        linear_backward(g, a->d_h1, a->logits, a->hln, BP_WTE, 0, BP_DEC_B, 0, M, C,
                        g->vocab_ld);
        cuda_layernorm_backward_dt(a->d_h2, gr->head_lnw, gr->head_lnb, a->d_h1, a->hg,
                                   p->head_lnw, a->h_mean, a->h_rstd, M, C, dt, st);
        act_backward(g, a->d_h1, a->hd, a->d_h2, (size_t)M * C);
        linear_backward(g, a->d_h2, a->d_h1, a->hsel, BP_HEAD_W, 0, BP_HEAD_B, 0, M, C, C);
        cuda_gather_rows_backward_dt(a->d_res, a->d_h2, pos, M, C, dt, st);
    }
    if (c->nsp) {
        /* a->nsp_logits holds the gradient of loss_scale * nsp loss */
        linear_backward(g, a->d_pool, a->nsp_logits, a->pooled, BP_NSP_W, 0, BP_NSP_B, 0, B, C, 2);
        cuda_tanh_backward_dt(a->d_cls, a->pooled, a->d_pool, (size_t)B * C, dt, st);
        linear_backward(g, a->d_pool, a->d_cls, a->cls, BP_POOL_W, 0, BP_POOL_B, 0, B, C, C);
        cuda_gather_rows_backward_dt(a->d_res, a->d_pool, cls_rows, B, C, dt, st); // rows b*T
    }
    /* d(layer output) = d_res + d_extra (the second piece, from the next
     * layer's QKV projection; none for the last layer) */
    const void *d_extra = NULL;
    for (int l = L - 1; l >= 0; l--) {
        const void *x = l == 0 ? a->x0 : el(a->ln2, (size_t)(l - 1) * NC, dt);
        void *qkvr = el(a->qkvr, (size_t)l * 3 * NC, dt);
        void *att = a->fused ? (void *)((float *)a->att + (size_t)l * B * NH * T)
                             : el(a->att, (size_t)l * B * NH * T * T, dt);
        void *atty = el(a->atty, l * NC, dt), *res1 = el(a->res1, l * NC, dt),
             *ln1 = el(a->ln1, l * NC, dt), *res2 = el(a->res2, l * NC, dt);
        void *fch = el(a->fch, (size_t)l * N * I, dt), *fch_gelu = el(a->fch_gelu, (size_t)l * N * I, dt);

        /* LN2 over res2 = ln1 + dropout(fcproj): d_a = d ln1 (residual part),
         * d_c = d fcproj */
        r = site_rng(g, &rs, d, ph, l, DROPOUT_SITE_FFN_OUT);
        cuda_residual_dropout_layernorm_backward_dt(
            a->d_a, a->d_c, gr->ln2w + (size_t)l * C, gr->ln2b + (size_t)l * C, a->d_res, d_extra,
            res2, p->ln2w + (size_t)l * C, a->ln2_mean + l * N, a->ln2_rstd + l * N, r, ph, (int)N,
            C, dt, st);
        /* FC2 backward, then GELU's: with lever CUDA_LEVER_GELU_EPI (tanh
         * form) one cuBLASLt GEMM whose DGELU epilogue reads pre = fch */
        if (!(g->gemm_lt && bert_act_is_tanh(c->act) && (g->levers & CUDA_LEVER_GELU_EPI) &&
              cuda_lt_matmul_backward_dt(a->d_fch, gf(g, BP_FCPROJW, (size_t)l * C * I),
                                         gf(g, BP_FCPROJB, (size_t)l * C), a->d_c, fch_gelu,
                                         lp(g, BP_FCPROJW, (size_t)l * C * I), fch, (int)N, I, C,
                                         dt, st) == 0)) {
            linear_backward(g, a->d_fch_gelu, a->d_c, fch_gelu, BP_FCPROJW, (size_t)l * C * I,
                            BP_FCPROJB, (size_t)l * C, (int)N, I, C);
            act_backward(g, a->d_fch, fch, a->d_fch_gelu, N * I);
        }
        linear_backward(g, a->d_b, a->d_fch, ln1, BP_FCW, (size_t)l * I * C, BP_FCB, (size_t)l * I,
                        (int)N, C, I);
        /* LN1 over res1 = x + dropout(attproj), fed d ln1 = d_a + d_b:
         * d_res = d x (residual part), d_c = d attproj */
        r = site_rng(g, &rs, d, ph, l, DROPOUT_SITE_ATTN_OUT);
        cuda_residual_dropout_layernorm_backward_dt(
            a->d_res, a->d_c, gr->ln1w + (size_t)l * C, gr->ln1b + (size_t)l * C, a->d_a, a->d_b,
            res1, p->ln1w + (size_t)l * C, a->ln1_mean + l * N, a->ln1_rstd + l * N, r, ph, (int)N,
            C, dt, st);
        linear_backward(g, a->d_a, a->d_c, atty, BP_ATTPROJW, (size_t)l * C * C, BP_ATTPROJB,
                        (size_t)l * C, (int)N, C, C);
        r = site_rng(g, &rs, d, pa, l, DROPOUT_SITE_ATTN_PROBS);
        if (a->fused) // qkvr holds qkv (N,3C), atty the output, att the logsumexp
            cuda_flash_attention_backward_dt(a->d_qkv, a->att_scratch, a->d_a, qkvr, atty, att,
                                             lens, r, pa, B, T, C, NH, dt, st);
        else
            cuda_attention_backward_dt(a->d_qkv, a->d_qkvr, a->d_att, a->att_scratch, a->d_a,
                                       qkvr, att, lens, r, pa, B, T, C, NH, dt, st);
        linear_backward(g, a->d_b, a->d_qkv, x, BP_QKVW, (size_t)l * 3 * C * C, BP_QKVB,
                        (size_t)l * 3 * C, (int)N, C, 3 * C);
        d_extra = a->d_b;
        /* layer l's weight matrices are final: reduce them while the
         * layers below run backward */
        if (g->bucket_armed && (rc = reduce_bucket(g, l, 0, -1)) < 0)
            goto out;
    }
    /* Bucket L but its first range: every layer's biases and LayerNorms and
     * the heads are final now; their reduction overlaps the embedding
     * backward below, so the embeddings are all that is left after it. */
    if (g->bucket_armed && (rc = reduce_bucket(g, L, 1, -1)) < 0)
        goto out;
    /* x0 = dropout(LN(emb)): d x0 = d_res + d_b */
    cuda_residual_forward_dt(a->d_a, a->d_res, a->d_b, NC, dt, st);
    r = site_rng(g, &rs, d, ph, L, DROPOUT_SITE_EMB);
    cuda_dropout_forward_dt(a->d_c, a->d_a, r, ph, NC, dt, st); // backward = same mask
    cuda_layernorm_backward_dt(a->d_b, gr->emb_lnw, gr->emb_lnb, a->d_c, a->emb, p->emb_lnw,
                               a->emb_mean, a->emb_rstd, (int)N, C, dt, st);
    const int32_t *order = ids + slot_used(B, T, M); // upload_batch put it there
    if (g->dev_scalars) // the run count from the per-step scalars, blocks for up to N runs
        cuda_embeddings_backward_ordered_dev(gr->wte, gr->wpe, gr->wtt, a->d_b, ids, tt, order,
                                             order + N, DSCAL(g, U), (int)N, B, T, C,
                                             c->type_vocab_size, dt, st);
    else
        cuda_embeddings_backward_ordered_dt(gr->wte, gr->wpe, gr->wtt, a->d_b, ids, tt, order,
                                            order + N, g->emb_runs[s], B, T, C,
                                            c->type_vocab_size, dt, st);
    /* Bucket L's first range (the word embeddings tied to the decoder, the
     * position and type embeddings, the embedding LayerNorm): final only
     * now, since the decoder's share came first in backward and the
     * embeddings' share needs d x0, the end of the chain. Started as the
     * last kernel that writes it is queued. */
    if (g->bucket_armed) {
        if ((rc = reduce_bucket(g, L, 0, 1)) < 0)
            goto out;
        g->bucket_armed = 0;
        g->buckets_started = 1;
    }
out:
    return rc;
}

int gpu_model_backward(gpu_model *g)
{
    if (!g->have_forward || g->cur < 0)
        return -EINVAL;
    g->grads_zero = 0;
    int rc = backward_kernels(g);
    if (rc < 0)
        return rc;
    GPU_TRY(cudaEventRecord(g->slot_free[g->cur], g->compute));
    /* the logits now hold gradients: another backward needs a new forward */
    g->have_forward = 0;
out:
    return rc;
}

int gpu_model_set_allreduce(gpu_model *g, gpu_allreduce_fn fn, void *ctx, cudaStream_t stream)
{
    int rc = 0;
    if (g->comm && g->comm != g->compute) {
        GPU_TRY(cudaStreamSynchronize(g->comm));
        if (g->own_comm)
            GPU_TRY(cudaStreamDestroy(g->comm));
    }
    g->comm = g->compute;
    g->own_comm = 0;
    g->allreduce = fn;
    g->allreduce_ctx = ctx;
    if (!fn)
        return 0;
    if (stream) {
        g->comm = stream;
    } else {
        GPU_TRY(cudaStreamCreateWithFlags(&g->comm, cudaStreamNonBlocking));
        g->own_comm = 1;
    }
out:
    return rc;
}

int gpu_model_set_buckets(gpu_model *g, gpu_bucket_fn bucket, gpu_bucket_finish_fn finish, void *ctx)
{
    if (bucket && !finish)
        return -EINVAL;
    g->bucket = bucket;
    g->bucket_finish = bucket ? finish : NULL;
    g->bucket_ctx = bucket ? ctx : NULL;
    g->bucket_armed = g->buckets_started = 0;
    return 0;
}

void gpu_model_set_bucket_settle(gpu_model *g, gpu_bucket_settle_fn settle)
{
    g->bucket_settle = settle;
}

void gpu_model_reduce_in_next_backward(gpu_model *g)
{
    g->bucket_armed = g->bucket != NULL;
}

float gpu_model_exposed_comm_ms(const gpu_model *g)
{
    return g->exposed_comm_ms;
}

int gpu_model_attention_fused(const gpu_model *g)
{
    return g->acts->fused;
}

float gpu_model_loss_scale(const gpu_model *g)
{
    return g->scaler.enabled ? g->scaler.scale : 1.0f;
}

void gpu_model_get_scaler(const gpu_model *g, gpu_loss_scaler *out)
{
    *out = g->scaler;
}

int gpu_model_set_scaler(gpu_model *g, const gpu_loss_scaler *s)
{
    if (!isfinite(s->scale) || s->scale <= 0.0f || s->growth_interval < 1 || s->good_steps < 0 ||
        s->good_steps >= s->growth_interval || s->skipped < 0)
        return -EINVAL;
    /* bf16/fp32 never scale, and a run that did not scale has no state an
     * fp16 run could go on from: keep this model's own */
    if (!g->scaler.enabled || !s->enabled)
        return 0;
    g->scaler = *s;
    return 0;
}

/* Lever CUDA_LEVER_GRAPH: the step's arguments into the device block (a
 * staged pageable copy on the compute stream, outside any capture); lr
 * kept for the step's result. */
static int step_args(gpu_model *g)
{
    const optim_config *c = &g->ocfg;
    g->step_lr = optim_lr_at(c, g->t);
    /* the update's t counts it (the host path's g->t after its ++) */
    return cuda_opt_args_write(g->opt_args, c->kind != OPTIM_ADAMW, g->step_lr, c->beta1,
                               c->beta2, c->eps, c->weight_decay, g->t + 1, g->compute);
}

/* ... the step's work on the compute stream (what a graph captures): the
 * norm, the clip factor and the skip decided on the device (cuda_opt_clip,
 * the same IEEE double operations as the host path of gpu_model_step), the
 * optimizer right behind them reading its arguments from the block (a
 * skipped step changes nothing there), the norm and the skip copied to the
 * host. */
static int step_kernels(gpu_model *g)
{
    int rc = 0;
    const optim_config *c = &g->ocfg;
    cudaStream_t st = g->compute;
    int lamb = c->kind != OPTIM_ADAMW;
    GPU_TRY(cudaMemsetAsync(g->sumsq, 0, sizeof(double), st));
    GPU_TRY(cudaMemsetAsync(g->nonfinite, 0, sizeof(int), st));
    cuda_sumsq_check(g->sumsq, g->nonfinite, g->grads_memory, g->dev_params, st);
    cuda_opt_clip(g->opt_args, lamb, g->sumsq, g->nonfinite, c->max_grad_norm,
                  gpu_model_loss_scale(g), DSCAL(g, gnorm), DSCAL(g, skip), st);
    float *m = g->opt_memory, *v = g->opt_memory + g->dev_params;
    void *plp = g->dt == KDT_F32 ? NULL : g->params_lp_memory;
    int zero_g = (g->levers & CUDA_LEVER_OPT_ZERO) != 0;
    if (lamb)
        cuda_lamb_step_dev(g->params_memory, plp, g->dt, g->grads_memory, m, v, g->chunks,
                           g->num_chunks, g->seg_decay, g->seg_norms, g->num_segs, g->opt_args,
                           zero_g, st);
    else
        cuda_adamw_step_dev(g->params_memory, plp, g->dt, g->grads_memory, m, v, g->chunks,
                            g->num_chunks, g->seg_decay, g->opt_args, zero_g, st);
    GPU_TRY(cudaMemcpyAsync(g->norm_host, DSCAL(g, gnorm), sizeof(double), cudaMemcpyDeviceToHost,
                            st));
    GPU_TRY(cudaMemcpyAsync(g->flag_host, DSCAL(g, skip), sizeof(int), cudaMemcpyDeviceToHost, st));
out:
    return rc;
}

/* ... and its end: marks the step enqueued (step_done after it). */
static int step_end(gpu_model *g)
{
    int rc = 0;
    GPU_TRY(cudaEventRecord(g->step_done, g->compute));
    g->step_pending = 1;
out:
    return rc;
}

/* Non-finite gradients: -ERANGE without loss scaling (the caller fails the
 * job: bf16/fp32 never overflow benignly); with fp16 scaling the update is
 * skipped and the scale backed off. */
static int scaler_overflow(gpu_model *g, int *skipped, double *gnorm_out)
{
    if (!g->scaler.enabled)
        return -ERANGE;
    g->scaler.scale = gpu_model_loss_scale(g) * 0.5f;
    g->scaler.good_steps = 0;
    g->scaler.skipped++;
    if (skipped)
        *skipped = 1;
    if (gnorm_out)
        *gnorm_out = INFINITY;
    return 0;
}

/* An update made: the fp16 scale grows after growth_interval of them. */
static void scaler_good_step(gpu_model *g)
{
    if (g->scaler.enabled && ++g->scaler.good_steps >= g->scaler.growth_interval) {
        g->scaler.scale = g->scaler.scale * 2.0f;
        g->scaler.good_steps = 0;
    }
}

/* The host waits once, after the update, for its norm and skip, then keeps
 * its books (t, the loss scaler, -ERANGE for bf16/fp32) as the host path of
 * gpu_model_step does. */
static int step_result(gpu_model *g, double *lr_out, double *gnorm_out, int *skipped)
{
    int rc = 0;
    if (skipped)
        *skipped = 0;
    if (!g->step_pending)
        return -EINVAL;
    g->step_pending = 0;
    if ((rc = comm_settle(g)) < 0)
        goto out;
    GPU_TRY(cudaEventSynchronize(g->step_done));
    if (g->step_timed)
        GPU_TRY(cudaEventElapsedTime(&g->exposed_comm_ms, g->t_bwd_done, g->t_comm_waited));
    if (lr_out)
        *lr_out = g->step_lr;
    if (*g->flag_host) { // the kernels left parameters, state and gradients as they were
        rc = scaler_overflow(g, skipped, gnorm_out);
        goto out;
    }
    g->t++;
    g->grads_zero = (g->levers & CUDA_LEVER_OPT_ZERO) != 0;
    scaler_good_step(g);
    if (gnorm_out)
        *gnorm_out = *g->norm_host;
out:
    return rc;
}

int gpu_model_step(gpu_model *g, double *lr_out, double *gnorm_out, int *skipped)
{
    if (g->step_pending) // gpu_model_train_micro's step: gpu_model_step_wait reads it
        return -EINVAL;
    int rc = 0;
    const optim_config *c = &g->ocfg;
    cudaStream_t st = g->compute;
    if (skipped)
        *skipped = 0;
    /* The compute stream's wait for communication, timed between two
     * events on it: what the reduction did not hide behind backward. */
    int timed = g->buckets_started || g->allreduce;
    g->exposed_comm_ms = 0;
    if (timed)
        GPU_TRY(cudaEventRecord(g->t_bwd_done, st));
    if (g->buckets_started) {
        g->buckets_started = 0;
        if ((rc = g->bucket_finish(g->bucket_ctx, st)) < 0)
            goto out;
    } else if (g->allreduce) {
        GPU_TRY(cudaEventRecord(g->grads_ready, st));
        GPU_TRY(cudaStreamWaitEvent(g->comm, g->grads_ready, 0));
        rc = g->allreduce(g->allreduce_ctx, g->grads_memory, g->dev_params, g->comm);
        if (rc < 0)
            goto out;
        GPU_TRY(cudaEventRecord(g->comm_done, g->comm));
        GPU_TRY(cudaStreamWaitEvent(st, g->comm_done, 0));
    }
    if (timed)
        GPU_TRY(cudaEventRecord(g->t_comm_waited, st));
    if (g->dev_scalars) {
        g->step_timed = timed;
        if ((rc = step_args(g)) < 0 || (rc = step_kernels(g)) < 0 || (rc = step_end(g)) < 0)
            goto out;
        rc = step_result(g, lr_out, gnorm_out, skipped);
        goto out;
    }
    GPU_TRY(cudaMemsetAsync(g->sumsq, 0, sizeof(double), st));
    GPU_TRY(cudaMemsetAsync(g->nonfinite, 0, sizeof(int), st));
    cuda_sumsq_check(g->sumsq, g->nonfinite, g->grads_memory, g->dev_params, st);
    GPU_TRY(cudaMemcpyAsync(g->norm_host, g->sumsq, sizeof(double), cudaMemcpyDeviceToHost, st));
    GPU_TRY(cudaMemcpyAsync(g->flag_host, g->nonfinite, sizeof(int), cudaMemcpyDeviceToHost, st));
    GPU_TRY(cudaStreamSynchronize(st));
    if (timed)
        GPU_TRY(cudaEventElapsedTime(&g->exposed_comm_ms, g->t_bwd_done, g->t_comm_waited));
    float scale = gpu_model_loss_scale(g);
    if (*g->flag_host || !isfinite(*g->norm_host)) {
        if ((rc = scaler_overflow(g, skipped, gnorm_out)) == 0 && lr_out)
            *lr_out = optim_lr_at(c, g->t);
        goto out;
    }
    double gnorm = sqrt(*g->norm_host) / (double)scale;
    float clip = 1.0f;
    if (c->max_grad_norm > 0) {
        if (c->kind == OPTIM_ADAMW) {
            double coef = (double)c->max_grad_norm / (gnorm + 1e-6);
            clip = (float)(coef < 1.0 ? coef : 1.0);
        } else {
            clip = (float)((double)c->max_grad_norm /
                           (gnorm > c->max_grad_norm ? gnorm : c->max_grad_norm));
        }
    }
    /* unscaling folds into the clip multiplier: one pass over the gradients */
    float gmul = scale == 1.0f ? clip : (float)((double)clip / scale);
    double lr = optim_lr_at(c, g->t);
    g->t++;
    float *m = g->opt_memory, *v = g->opt_memory + g->dev_params;
    void *plp = g->dt == KDT_F32 ? NULL : g->params_lp_memory;
    /* lever CUDA_LEVER_OPT_ZERO: the kernel clears each gradient as it reads
     * it, so the next zero_grad has nothing to do (a skipped step keeps its
     * gradients, and the next zero_grad clears them with a memset) */
    int zero_g = (g->levers & CUDA_LEVER_OPT_ZERO) != 0;
    if (c->kind == OPTIM_ADAMW)
        cuda_adamw_step(g->params_memory, plp, g->dt, g->grads_memory, m, v, g->chunks,
                        g->num_chunks, g->seg_decay, lr, c->beta1, c->beta2, c->eps,
                        c->weight_decay, gmul, g->t, zero_g, st);
    else
        cuda_lamb_step(g->params_memory, plp, g->dt, g->grads_memory, m, v, g->chunks,
                       g->num_chunks, g->seg_decay, g->seg_norms, g->num_segs, lr, c->beta1,
                       c->beta2, c->eps, c->weight_decay, gmul, g->t, zero_g, st);
    g->grads_zero = zero_g;
    scaler_good_step(g);
    if (lr_out)
        *lr_out = lr;
    if (gnorm_out)
        *gnorm_out = gnorm;
out:
    return rc;
}

/* ---- lever CUDA_LEVER_GRAPH: the micro-batch as one replayed graph ----
 * One graph exec per key: everything a captured launch bakes in that can
 * change between calls (the slot's device addresses, the shapes, whether
 * the step rides along and the loss scale its clip reads, the dropout's
 * on/off and its Philox key). A key's first call runs eagerly (cuBLAS(Lt)
 * plans and any lazy allocation happen outside a capture), its second is
 * captured, later ones replay. Least recently used exec evicted past
 * GRAPH_CACHE. */
enum { GRAPH_CACHE = 8, GRAPH_KEY = 6 };

typedef struct graph_entry {
    uint64_t key[GRAPH_KEY];
    cudaGraph_t graph;
    cudaGraphExec_t exec; // NULL: not captured (yet)
    int seen;             // ran eagerly once: the next call captures
    long used;            // the cache's clock at its last use
} graph_entry;

typedef struct graph_cache {
    graph_entry e[GRAPH_CACHE];
    int n;
    long clock;
} graph_cache;

static void graph_entry_free(graph_entry *e)
{
    if (e->exec)
        cudaGraphExecDestroy(e->exec);
    if (e->graph)
        cudaGraphDestroy(e->graph);
    memset(e, 0, sizeof *e);
}

static void graphs_free(gpu_model *g)
{
    graph_cache *gc = g->graphs;
    if (!gc)
        return;
    for (int i = 0; i < gc->n; i++)
        graph_entry_free(&gc->e[i]);
    free(gc);
    g->graphs = NULL;
}

/* The cache entry of this call's key, made (evicting the least recently
 * used) on first sight; NULL without memory for the cache. */
static graph_entry *graph_find(gpu_model *g, const bert_dropout *d, int last)
{
    graph_cache *gc = g->graphs;
    if (!gc && !(gc = g->graphs = calloc(1, sizeof *gc)))
        return NULL;
    const bert_batch *b = &g->batch[g->cur];
    float scale = gpu_model_loss_scale(g);
    uint32_t sbits;
    memcpy(&sbits, &scale, sizeof sbits);
    int train = d && d->train;
    uint64_t key[GRAPH_KEY] = {
        (uint64_t)g->cur | (uint64_t)(last != 0) << 1 | (uint64_t)train << 2,
        (uint64_t)b->B << 32 | (uint64_t)b->T, (uint64_t)g->mpad[g->cur],
        last ? sbits : 0, train ? d->seed : 0, train ? d->rank : 0,
    };
    gc->clock++;
    for (int i = 0; i < gc->n; i++) {
        if (memcmp(gc->e[i].key, key, sizeof key) == 0) {
            gc->e[i].used = gc->clock;
            return &gc->e[i];
        }
    }
    int i = gc->n;
    if (i == GRAPH_CACHE) { // the least recently used goes
        i = 0;
        for (int j = 1; j < GRAPH_CACHE; j++)
            i = gc->e[j].used < gc->e[i].used ? j : i;
        graph_entry_free(&gc->e[i]);
    } else {
        gc->n++;
    }
    memcpy(gc->e[i].key, key, sizeof key);
    gc->e[i].used = gc->clock;
    return &gc->e[i];
}

/* Enqueues the micro-batch's work: forward, backward (the buckets when
 * armed), the step when last, after the compute stream's join with the
 * buckets (bucket_finish: captured, the join only; comm_settle waits
 * after the launch). */
static int micro_kernels(gpu_model *g, const bert_dropout *d, float loss_scale, int last)
{
    int rc = forward_kernels(g, g->cur, d, loss_scale);
    if (rc == 0)
        rc = backward_kernels(g);
    if (rc == 0 && g->buckets_started) {
        g->buckets_started = 0;
        rc = g->bucket_finish(g->bucket_ctx, g->compute);
    }
    if (rc == 0 && last)
        rc = step_kernels(g);
    return rc;
}

/* The host's bounded wait for a launched step's buckets (settle hook), on
 * the step_done recorded after the launch; before any unbounded wait on
 * the compute stream. 0 when none is pending, or the hook's error. */
static int comm_settle(gpu_model *g)
{
    if (!g->comm_pending)
        return 0;
    int rc = g->bucket_settle(g->bucket_ctx, g->step_done);
    if (rc == 0)
        g->comm_pending = 0;
    return rc;
}

/* Captures e's graph from the micro-batch's work and instantiates it. On
 * any failure nothing has run (a capture only records): the lever's graphs
 * are turned off for this model, with one log line, and the caller runs
 * the work eagerly. A kernel launch refused by the capture (a
 * stream-capture error) is kept by the launchers instead of aborting
 * (cuda_capture_begin) and reported here as the cause. */
static int graph_capture(gpu_model *g, graph_entry *e, const bert_dropout *d, float loss_scale,
                         int last)
{
    cudaGraph_t graph = NULL;
    const char *what = "cudaStreamBeginCapture";
    cudaError_t ce = cudaStreamBeginCapture(g->compute, cudaStreamCaptureModeThreadLocal);
    if (ce == cudaSuccess) {
        cuda_capture_begin();
        capturing = 1;
        int krc = micro_kernels(g, d, loss_scale, last);
        capturing = 0;
        cudaError_t launch_err = (cudaError_t)cuda_capture_end();
        what = "cudaStreamEndCapture";
        ce = cudaStreamEndCapture(g->compute, &graph);
        if (launch_err != cudaSuccess) {
            what = "a kernel launch";
            ce = launch_err;
        } else if (ce == cudaSuccess && krc < 0) {
            what = "an operation of the step";
            ce = cudaErrorStreamCaptureUnsupported;
        }
    }
    if (ce == cudaSuccess) {
        what = "cudaGraphInstantiateWithFlags";
        ce = cudaGraphInstantiateWithFlags(&e->exec, graph, 0); // CUDA 11.4+ and 12+ alike
    }
    if (ce == cudaSuccess) {
        e->graph = graph;
        g->graph_captures++;
        return 0;
    }
    (void)cudaGetLastError(); // not sticky: later launch checks must not see it
    if (graph)
        cudaGraphDestroy(graph);
    e->exec = NULL;
    fprintf(stderr, "gpu_model: capturing the training step failed (%s: %s); steps run without "
            "CUDA graphs from now on\n", what, cudaGetErrorString(ce));
    g->graph_off = 1;
    return -1;
}

int gpu_model_train_micro(gpu_model *g, const bert_dropout *d, float loss_scale, int last)
{
    /* data parallel: the buckets only (the single all-reduce after
     * backward waits on the host), with the bounded wait after the launch */
    int ddp = g->bucket && g->bucket_settle;
    if (!g->dev_scalars || g->staged < 0 || !(loss_scale > 0) || (last && g->step_pending) ||
        ((g->allreduce || g->bucket) && !ddp))
        return -EINVAL;
    int rc = forward_begin(g, d, loss_scale);
    if (rc == 0 && last) {
        g->step_timed = 0; // events in a graph time nothing: not measured
        g->exposed_comm_ms = 0;
        rc = step_args(g);
    }
    if (rc < 0)
        return rc;
    g->bucket_armed = last && ddp;
    g->buckets_started = 0;
    g->grads_zero = 0;
    graph_entry *e = g->graph_off ? NULL : graph_find(g, d, last);
    int replay = 0; // else eagerly: first sight of the key, or graphs off
    if (e && e->exec) {
        replay = 1;
    } else if (e && e->seen && graph_capture(g, e, d, loss_scale, last) == 0) {
        replay = 1;
    } else if (e) {
        e->seen = 1;
    }
    g->bucket_armed = last && ddp; // a capture disarmed it; an eager fallback needs it again
    g->buckets_started = 0;
    if (replay) {
        GPU_TRY(cudaGraphLaunch(e->exec, g->compute));
        g->graph_launches++;
    } else {
        rc = micro_kernels(g, d, loss_scale, last);
    }
    g->bucket_armed = g->buckets_started = 0;
    if (rc < 0)
        return rc;
    if ((rc = forward_end(g, loss_scale)) < 0)
        return rc;
    g->have_forward = 0; // its backward ran
    if (last && (rc = step_end(g)) == 0)
        g->comm_pending = ddp;
    return rc;
out:
    g->bucket_armed = g->buckets_started = 0;
    return rc;
}

int gpu_model_step_wait(gpu_model *g, double *lr_out, double *gnorm_out, int *skipped)
{
    return step_result(g, lr_out, gnorm_out, skipped);
}
