/* lt — the GEMMs of nn.Linear through cuBLASLt, with the bias, bias-gradient
 * and (tanh) GELU work folded into the GEMM's epilogue instead of separate
 * passes over the output: forward CUBLASLT_EPILOGUE_BIAS (or GELU_AUX_BIAS,
 * which also stores the pre-activation as the aux output), backward dX with
 * DEFAULT (or DGELU, reading that aux) and dW with BGRADB (the bias gradient
 * as a by-product of the weight-gradient GEMM).
 *
 * Numerics: cuBLASLt's GELU is the tanh approximation (PyTorch checks its
 * `_addmm_activation(use_gelu=True)`, which is this epilogue, against
 * gelu(approximate="tanh") on CUDA; test_gemm_lt measures which form the
 * device computes). BERT's "gelu" is the erf form, so the model uses only the
 * BIAS / BGRADB epilogues and keeps its own GELU kernel; the GELU epilogues
 * are for a hidden_act of "gelu_new" (tanh form). fp32 accumulation always
 * (CUBLAS_COMPUTE_32F): fp32 operands stay true fp32 (never TF32), bf16/fp16
 * operands run on tensor cores. The bias is read in the output type (the
 * documented rule for regular types: bias type = D type), i.e. the caller's
 * dt copy of the bias; the bias gradient of dW comes out in fp32 (dW's type).
 *
 * With the lever CUDA_LEVER_LT_TUNE (off by default) a plan keeps the
 * heuristic's first LT_TUNE_ALGOS answers and times them at its first run
 * (tune): the algorithm is then the fastest measured in this process, which
 * may differ from run to run (see docs/cuda.md: bitwise resume needs the
 * same algorithms).
 *
 * Plans: one matmul descriptor, three layouts and the heuristic's algorithm
 * per (direction, dtype, epilogue, m, n, k, pointer alignments), made the
 * first time a shape is seen and cached for the thread, so the training step
 * never queries heuristics for a shape it has run before (the MLM head's
 * masked-row count M varies by batch: each new M is one heuristic query, a
 * host-only call; the cache holds at most LT_MAX_PLANS). A combination
 * cuBLASLt has no algorithm for (an epilogue it does not offer for a dtype,
 * an alignment its kernels cannot take) is remembered as unsupported and the
 * call returns -ENOTSUP having enqueued nothing, so the caller takes the
 * cuBLAS path (matmul.cu). The heuristic is the authority on support: the
 * documentation does not tabulate epilogue x dtype x alignment.
 *
 * Memory: one cudaMalloc per thread in cuda_lt_init: LT_BGRAD_FLOATS fp32 of
 * bias-gradient scratch (BGRADB overwrites its output while our gradients
 * accumulate, so it lands here and one small kernel adds it into dbias),
 * then the cuBLASLt workspace. Never synchronizes the device; all work is on
 * the caller's stream. Dims as kernels.h: N rows, C in, OC out features.
 */
#include "kernels/cuda/common.cuh"

#include <cublasLt.h>
#include <errno.h>
#include <new>
#include <stdint.h>
#include <string.h>
#include <unordered_map>

namespace {

constexpr size_t LT_WORKSPACE = 32u << 20;        // what Hopper's kernels ask for
constexpr size_t LT_BGRAD_FLOATS = 256u << 10;    // 1 MiB: OC up to 262144 (vocab sizes)
constexpr size_t LT_SCRATCH_BYTES = LT_BGRAD_FLOATS * sizeof(float); // keeps 256 B alignment
constexpr size_t LT_MAX_PLANS = 4096;
constexpr int LT_TUNE_ALGOS = 4; // lever CUDA_LEVER_LT_TUNE: candidates timed per plan
constexpr int LT_TUNE_REPS = 3;  // timed runs of each

enum lt_dir { DIR_FWD = 0, DIR_DINP = 1, DIR_DWEIGHT = 2 };

/* Everything the heuristic's answer depends on. Only 4-byte fields: no
 * padding, so the bytes hash and compare. */
struct lt_key {
    int32_t dir, dt, epilogue, tune; // tune: made under CUDA_LEVER_LT_TUNE
    int32_t m, n, k;                                      // column-major GEMM dims
    uint32_t al_a, al_b, al_c, al_bias, al_aux;           // pointer alignments, bytes
    bool operator==(const lt_key &o) const { return memcmp(this, &o, sizeof o) == 0; }
};
struct lt_key_hash {
    size_t operator()(const lt_key &k) const
    {
        const unsigned char *p = reinterpret_cast<const unsigned char *>(&k);
        uint64_t h = 1469598103934665603ull; // FNV-1a
        for (size_t i = 0; i < sizeof k; i++)
            h = (h ^ p[i]) * 1099511628211ull;
        return (size_t)h;
    }
};

struct lt_plan {
    bool ok = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr; // D uses c's layout
    cublasLtMatmulAlgo_t algo;
    size_t ws = 0;
    /* lever CUDA_LEVER_LT_TUNE: the heuristic's first answers, timed once
     * at the plan's first run (tune), which then keeps the fastest in algo */
    cublasLtMatmulAlgo_t cand[LT_TUNE_ALGOS];
    int ncand = 0;
    bool tuned = true;
    int m = 0, n = 0;
    size_t d_elt = 0; // bytes per element of D
};

typedef std::unordered_map<lt_key, lt_plan, lt_key_hash> plan_map;

struct lt_state {
    cublasLtHandle_t handle = nullptr;
    char *mem = nullptr;          // [bias-grad scratch | workspace]
    plan_map *plans = nullptr;
    long queries = 0;             // heuristic queries made (tests read it)
    long tuned = 0;               // plans whose algorithm was picked by timing
    /* no destructor: at process exit the driver may be gone already (as the
     * cuBLAS handle in matmul.cu); cuda_lt_shutdown frees explicitly */
};
thread_local lt_state lt;

float *bgrad_scratch() { return reinterpret_cast<float *>(lt.mem); }
void *workspace() { return lt.mem + LT_SCRATCH_BYTES; }

uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 1;
    if (!a)
        return 256;
    while (al < 256 && !(a & al))
        al <<= 1;
    return al;
}

/* Bias and aux vectors are read by the epilogue itself, whose alignment
 * needs are not documented (marian-nmt found its bias epilogue failing below
 * 16 bytes on A100): a misaligned one declines to the cuBLAS path rather than
 * risk a faulting kernel. NULL is fine. */
bool epilogue_aligned(const void *p)
{
    return !p || align_of(p) >= 16;
}

cudaDataType_t lt_type(kdtype dt)
{
    return dt == KDT_BF16 ? CUDA_R_16BF : dt == KDT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

const char *epilogue_name(int e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "?";
    }
}

void plan_free(lt_plan *p)
{
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->c)
        cublasLtMatrixLayoutDestroy(p->c);
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    *p = lt_plan();
}

#define LT_TRY(call)                                                                      \
    do {                                                                                  \
        st = (call);                                                                      \
        if (st != CUBLAS_STATUS_SUCCESS)                                                  \
            goto out;                                                                     \
    } while (0)

/* The operand layouts of each direction, column-major (a row-major (r, c)
 * matrix is a column-major (c, r) one), with W (OC, C), X (N, C), Y (N, OC):
 *   fwd:     Y^T (OC x N)  = op_T(W^T: C x OC) . X^T (C x N)      m OC, n N, k C
 *   dinp:    dX^T (C x N)  = W^T (C x OC) . dY^T (OC x N)         m C,  n N, k OC
 *   dweight: dW^T (C x OC) += X^T (C x N) . op_T(dY^T: OC x N)    m C,  n OC, k N
 * so the bias of fwd runs along D's rows (OC) and BGRADB sums op(B) = dY
 * over k = N, giving one value per column of D (OC): the bias gradient. */
bool plan_make(const lt_key &k, lt_plan *p, const void *bias, const void *aux)
{
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref = nullptr;
    cudaDataType_t t = lt_type((kdtype)k.dt), tc = k.dir == DIR_DWEIGHT ? CUDA_R_32F : t;
    cublasOperation_t ta = k.dir == DIR_FWD ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = k.dir == DIR_DWEIGHT ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k.epilogue;
    uint64_t ws = LT_WORKSPACE;
    cublasLtMatmulHeuristicResult_t res[LT_TUNE_ALGOS];
    int found = 0, want = k.tune ? LT_TUNE_ALGOS : 1;
    /* stored (rows, cols, ld) of A and B before op() */
    uint64_t ar = k.dir == DIR_FWD ? k.k : k.m, ac = k.dir == DIR_FWD ? k.m : k.k;
    uint64_t br = k.dir == DIR_DWEIGHT ? k.n : k.k, bc = k.dir == DIR_DWEIGHT ? k.k : k.n;

    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                          sizeof epi));
    if (bias) {
        /* bias: D's type (fwd); bias gradient: fp32, dW's type */
        int32_t bt = (int32_t)(k.dir == DIR_DWEIGHT ? CUDA_R_32F : t);
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                              sizeof bt));
        /* the heuristic reads the pointer's alignment */
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    }
    if (aux) {
        int64_t ld = k.m; // the aux matrix is shaped as D
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &aux, sizeof aux));
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                              sizeof ld));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&p->a, t, ar, ac, (int64_t)ar));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->b, t, br, bc, (int64_t)br));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->c, tc, (uint64_t)k.m, (uint64_t)k.n, (int64_t)k.m));

    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws));
    /* the default assumes 256-byte aligned buffers; per-layer slices of the
     * parameter and activation spans are often less aligned than that */
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &k.al_a, sizeof k.al_a));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &k.al_b, sizeof k.al_b));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &k.al_c, sizeof k.al_c));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &k.al_c, sizeof k.al_c));
    lt.queries++;
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt.handle, p->desc, p->a, p->b, p->c, p->c, pref, want,
                                          res, &found));
    if (found < 1 || res[0].state != CUBLAS_STATUS_SUCCESS) {
        st = CUBLAS_STATUS_NOT_SUPPORTED;
        goto out;
    }
    p->algo = res[0].algo;
    p->ws = res[0].workspaceSize;
    for (int i = 0; i < found && i < want; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS)
            p->cand[p->ncand++] = res[i].algo;
    p->tuned = !k.tune;
    p->m = k.m;
    p->n = k.n;
    p->d_elt = k.dir == DIR_DWEIGHT ? 4 : kdtype_size((kdtype)k.dt);
    p->ok = true;
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (!p->ok) {
        fprintf(stderr,
                "lt: no cuBLASLt algorithm for %s %s m=%d n=%d k=%d epilogue %s (alignments "
                "%u/%u/%u bytes): %s; the cuBLAS path runs it\n",
                k.dir == DIR_FWD ? "forward" : k.dir == DIR_DINP ? "dinp" : "dweight",
                kdtype_name((kdtype)k.dt), k.m, k.n, k.k, epilogue_name(k.epilogue), k.al_a,
                k.al_b, k.al_c, cublasLtGetStatusString(st));
        plan_free(p);
    }
    return p->ok;
}

/* The cached plan for k (made now if new), or NULL when cuBLASLt cannot run it. */
lt_plan *plan_get(const lt_key &k, const void *bias, const void *aux)
{
    if (!lt.handle || !lt.plans)
        return nullptr;
    auto it = lt.plans->find(k);
    if (it != lt.plans->end())
        return it->second.ok ? &it->second : nullptr;
    if (lt.plans->size() >= LT_MAX_PLANS)
        return nullptr;
    lt_plan p;
    plan_make(k, &p, bias, aux);
    try {
        auto ins = lt.plans->emplace(k, p);
        return ins.first->second.ok ? &ins.first->second : nullptr;
    } catch (...) { // out of host memory: run this one on cuBLAS
        plan_free(&p);
        return nullptr;
    }
}

lt_key key_of(lt_dir dir, kdtype dt, cublasLtEpilogue_t epi, int m, int n, int k, const void *A,
              const void *B, const void *C, const void *bias, const void *aux)
{
    lt_key key;
    memset(&key, 0, sizeof key);
    key.dir = dir;
    key.dt = dt;
    key.epilogue = (int32_t)epi;
    key.tune = (cuda_levers() & CUDA_LEVER_LT_TUNE) != 0;
    key.m = m;
    key.n = n;
    key.k = k;
    key.al_a = align_of(A);
    key.al_b = align_of(B);
    key.al_c = align_of(C);
    key.al_bias = bias ? align_of(bias) : 0;
    key.al_aux = aux ? align_of(aux) : 0;
    return key;
}

/* Lever CUDA_LEVER_LT_TUNE, at a plan's first run: every candidate the
 * heuristic offered runs LT_TUNE_REPS times on the real operands into a
 * scratch D (beta 0: nothing the step accumulates is touched; an epilogue's
 * outputs, the bias-gradient scratch and the aux matrix, are rewritten by the
 * real run that follows), timed with events on the stream, and the fastest
 * becomes the plan's algorithm. The host waits for the stream here, once per
 * plan. A candidate that fails is skipped; if none runs, or the scratch
 * cannot be had, the heuristic's first answer stays. */
void tune(lt_plan *p, const void *A, const void *B, cudaStream_t stream)
{
    const float alpha = 1.0f, beta = 0.0f;
    void *scratch = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    float best_ms = 0.0f;
    int best = -1;
    p->tuned = true;
    lt.tuned++;
    if (cudaMallocAsync(&scratch, (size_t)p->m * p->n * p->d_elt, stream) != cudaSuccess ||
        cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
        cudaGetLastError(); // not sticky: the step goes on with the heuristic's choice
        goto out;
    }
    for (int c = 0; c < p->ncand; c++) {
        bool ran = cudaEventRecord(ev[0], stream) == cudaSuccess;
        for (int r = 0; r < LT_TUNE_REPS && ran; r++)
            ran = cublasLtMatmul(lt.handle, p->desc, &alpha, A, p->a, B, p->b, &beta, scratch, p->c,
                                 scratch, p->c, &p->cand[c], workspace(), LT_WORKSPACE,
                                 stream) == CUBLAS_STATUS_SUCCESS;
        float ms = 0.0f;
        if (ran && cudaEventRecord(ev[1], stream) == cudaSuccess &&
            cudaEventSynchronize(ev[1]) == cudaSuccess &&
            cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess && (best < 0 || ms < best_ms)) {
            best = c;
            best_ms = ms;
        }
    }
    if (best >= 0)
        p->algo = p->cand[best];
out:
    if (scratch)
        cudaFreeAsync(scratch, stream);
    for (cudaEvent_t e : ev)
        if (e)
            cudaEventDestroy(e);
}

/* D = alpha op(A) op(B) + beta C with C = D. A failure here (after the
 * heuristic accepted the plan) marks the plan unusable: the caller falls back. */
bool plan_run(lt_plan *p, const void *bias, const void *aux, const void *A, const void *B,
              float beta, void *D, cudaStream_t stream)
{
    const float alpha = 1.0f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (bias)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    if (aux)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &aux, sizeof aux));
    if (!p->tuned)
        tune(p, A, B, stream);
    LT_TRY(cublasLtMatmul(lt.handle, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c,
                          &p->algo, workspace(), LT_WORKSPACE, stream));
out:
    if (st != CUBLAS_STATUS_SUCCESS) {
        /* refused by a stream capture (one invalidated half-way, which the
         * capturing caller discards and runs eagerly: common.cuh): not this
         * shape's fault, so its plan stays for the eager run */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone)
            return false;
        fprintf(stderr, "lt: cublasLtMatmul failed (%s); this shape goes to cuBLAS from now on\n",
                cublasLtGetStatusString(st));
        plan_free(p); // stays in the map with ok = false
        return false;
    }
    return true;
}

#undef LT_TRY

__global__ void add_f32_kernel(float *dst, const float *src, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] += src[i];
}

} // namespace

extern "C" {

int cuda_lt_init(void)
{
    if (lt.handle)
        return 0;
    cublasStatus_t st = cublasLtCreate(&lt.handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasLtCreate: %s\n", cublasLtGetStatusString(st));
        lt.handle = nullptr;
        return -EIO;
    }
    cudaError_t err = cudaMalloc((void **)&lt.mem, LT_SCRATCH_BYTES + LT_WORKSPACE);
    if (err != cudaSuccess) {
        fprintf(stderr, "cuBLASLt workspace: %s\n", cudaGetErrorString(err));
        cublasLtDestroy(lt.handle);
        lt.handle = nullptr;
        lt.mem = nullptr;
        return -ENOMEM;
    }
    lt.plans = new (std::nothrow) plan_map();
    if (!lt.plans) {
        cuda_lt_shutdown();
        return -ENOMEM;
    }
    return 0;
}

void cuda_lt_shutdown(void)
{
    if (lt.plans) {
        for (auto &kv : *lt.plans)
            plan_free(&kv.second);
        delete lt.plans;
    }
    if (lt.mem)
        cudaFree(lt.mem);
    if (lt.handle)
        cublasLtDestroy(lt.handle);
    lt = lt_state();
}

long cuda_lt_tuned_plans(void)
{
    return lt.tuned;
}

void cuda_lt_stats(long *plans, long *heuristic_queries)
{
    if (plans)
        *plans = lt.plans ? (long)lt.plans->size() : 0;
    if (heuristic_queries)
        *heuristic_queries = lt.queries;
}

int cuda_lt_matmul_forward_dt(void *out, void *pre, const void *inp, const void *weight,
                              const void *bias, int N, int C, int OC, kdtype dt,
                              cudaStream_t stream)
{
    if (N <= 0 || OC <= 0)
        return 0;
    if (C <= 0 || (pre && OC % 8)) // the aux leading dimension must be a multiple of 8
        return -ENOTSUP;
    if (!epilogue_aligned(bias) || !epilogue_aligned(pre))
        return -ENOTSUP;
    cublasLtEpilogue_t epi =
        pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
            : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    lt_key k = key_of(DIR_FWD, dt, epi, OC, N, C, weight, inp, out, bias, pre);
    lt_plan *p = plan_get(k, bias, pre);
    if (!p || !plan_run(p, bias, pre, weight, inp, 0.0f, out, stream))
        return -ENOTSUP;
    return 0;
}

int cuda_lt_matmul_backward_dt(void *dinp, float *dweight, float *dbias, const void *dout,
                               const void *inp, const void *weight, const void *pre, int N,
                               int C, int OC, kdtype dt, cudaStream_t stream)
{
    if (pre && !dinp)
        return -EINVAL;
    if (N <= 0) // nothing to add; dinp has no rows
        return 0;
    if (OC <= 0 || C <= 0) // degenerate GEMMs: the cuBLAS path writes the zeros
        return -ENOTSUP;
    if ((pre && C % 8) || (dbias && (size_t)OC > LT_BGRAD_FLOATS) || !epilogue_aligned(pre))
        return -ENOTSUP;
    /* both plans before anything runs: -ENOTSUP means nothing was enqueued */
    lt_plan *pd = nullptr, *pw;
    if (dinp) {
        cublasLtEpilogue_t e = pre ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
        pd = plan_get(key_of(DIR_DINP, dt, e, C, N, OC, weight, dout, dinp, nullptr, pre), nullptr,
                      pre);
        if (!pd)
            return -ENOTSUP;
    }
    float *scratch = dbias ? bgrad_scratch() : nullptr;
    cublasLtEpilogue_t ew = dbias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    pw = plan_get(key_of(DIR_DWEIGHT, dt, ew, C, OC, N, inp, dout, dweight, scratch, nullptr),
                  scratch, nullptr);
    if (!pw)
        return -ENOTSUP;
    /* dX may be recomputed by the caller's fallback (it is written, =), but
     * dW and dbias accumulate, so they run last and only once */
    if (pd && !plan_run(pd, nullptr, pre, weight, dout, 0.0f, dinp, stream))
        return -ENOTSUP;
    if (!plan_run(pw, scratch, nullptr, inp, dout, 1.0f, dweight, stream))
        return -ENOTSUP;
    if (dbias) {
        KLAUNCH((OC + 255) / 256, 256, 0, stream, add_f32_kernel)(dbias, scratch, OC);
        LAUNCH_CHECK();
    }
    return 0;
}

} // extern "C"
