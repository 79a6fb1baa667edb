/* blas.cpp — cudasim's cuBLAS and cuBLASLt: the subset bertd calls
 * (kernels/cuda/matmul.cu, attention.cu through gemm_rm, lt.cu), computed on
 * the host from NVIDIA's documented semantics by a plain GEMM of its own
 * (op() packing, double accumulation): an independent check of the project's
 * GPU code, sharing nothing with its CPU ops. Test-only.
 *
 * Implements, with the CUDA 13 headers' signatures: cublasCreate, Destroy,
 * SetStream, SetWorkspace, SetMathMode, GetStatusString, GemmEx,
 * GemmStridedBatchedEx; cublasLtCreate, Destroy, GetStatusString,
 * MatmulDesc{Create,Destroy,SetAttribute}, MatrixLayout{Create,Destroy},
 * MatmulPreference{Create,Destroy,SetAttribute}, MatmulAlgoGetHeuristic,
 * Matmul. Types: A = B in fp32, bf16 or fp16, C/D the same type or fp32,
 * compute CUBLAS_COMPUTE_32F(_PEDANTIC), scale fp32. cuBLASLt epilogues:
 * DEFAULT, BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU, BGRADA,
 * BGRADB; GELU is the tanh form.
 *
 * Deliberately not: performance, real heuristics (one algorithm, no
 * workspace), device pointer mode, batched or non-column-major cuBLASLt
 * layouts, ReLU epilogues, DGELU_BGRAD, fp8/int8/fp64/complex, the _FAST_
 * compute types, TF32 through the math mode (exact here). A valid request
 * outside this subset answers CUBLAS_STATUS_NOT_SUPPORTED, so a caller's
 * fallback runs rather than a plausible wrong answer.
 *
 * The rules, from the cuBLAS library guide ("docs") and the comments of the
 * toolkit's cublasLt.h ("hdr"):
 * - NULL or destroyed handle: NOT_INITIALIZED (docs); destroying an object
 *   twice faults, as the double free would.
 * - GEMM (docs, cublas<t>gemm / cublasGemmEx): m, n, k, batchCount < 0, an
 *   op other than N/T/C (C = T for real types), lda < max(1, m for N else k),
 *   ldb < max(1, k for N else n), ldc < max(1, m), NULL alpha/beta:
 *   INVALID_VALUE; types outside the cublasGemmEx table, unknown algo:
 *   NOT_SUPPORTED. beta == 0: C is not read ("C does not have to be a valid
 *   input"). alpha/beta are host values, read at the call.
 * - cublasSetWorkspace: not 256-byte aligned: INVALID_VALUE; cublasSetStream
 *   drops the user workspace for the default pool (docs).
 * - cuBLASLt: D = act(alpha op(A) op(B) + beta C + bias); layout ld >= rows,
 *   TRANSC only N (hdr); C == D needs one ld and type for both (else D's
 *   writes land on C elements not yet read: no defined result).
 *   BIAS: length rows of D, broadcast along columns. BGRADA / BGRADB: op(A)
 *   summed over k (rows of D) / op(B) summed over k (columns of D), written
 *   to the bias pointer. GELU_AUX*: aux gets the GELU input (after the bias);
 *   DGELU: result times gelu'(aux). Aux type = D type, AUX_LD a multiple of
 *   8 and >= rows of D (hdr). Bias type = D type (hdr) or fp32 (cuBLASLt
 *   11.11.3 on, which NVIDIA's nvmath-python relies on). DGELU with k == 1:
 *   NOT_SUPPORTED (nvmath-python's tests expect cuBLASLt to refuse it).
 * - The heuristic records the MIN_ALIGNMENT preferences (default 256 bytes)
 *   and the bias/aux pointers' alignment (hdr: it reads their values for
 *   that) in the algorithm; cublasLtMatmul refuses less aligned pointers
 *   (INVALID_VALUE with a note): the chosen kernel may rely on them.
 * - Every device pointer is checked over what the call touches given its
 *   ld, stride and batch: outside device memory, or misaligned for its
 *   element, it is a device fault (cudasim::fault), as on a GPU.
 */
#include "tests/cudasim/cudasim.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

struct cublasContext {
    cudaStream_t stream;
    int math_mode;
};
struct cublasLtContext {
    int unused;
};

namespace {

/* ---- live objects, so that a use after destroy is an error status ---- */
enum { OBJ_BLAS = 1, OBJ_LT, OBJ_DESC, OBJ_LAYOUT, OBJ_PREF };
enum { REG_ADD, REG_LIVE, REG_REMOVE };

bool reg(const void *p, int kind, int op, const char *fn = "")
{
    static std::mutex mu;
    static auto *m = new std::unordered_map<const void *, int>(); // outlives exit-time callers
    std::lock_guard<std::mutex> g(mu);
    if (op == REG_ADD) {
        (*m)[p] = kind;
        return true;
    }
    auto it = m->find(p);
    bool ok = p && it != m->end() && it->second == kind;
    if (op == REG_REMOVE) {
        if (!ok)
            cudasim::fault("%s(%p): not a live object (destroyed twice?)", fn, p);
        m->erase(it);
    }
    return ok;
}
bool live(const void *p, int kind)
{
    return reg(p, kind, REG_LIVE);
}

/* ---- elements ---- */
size_t elem_size(int t)
{
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 0;
}
float load(const void *p, int t, int64_t i)
{
    if (t == CUDA_R_16BF)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (t == CUDA_R_16F)
        return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
/* Through float: the device rounds its fp32 result to the 16-bit type (RNE). */
void store(void *p, int t, int64_t i, double v)
{
    float f = (float)v;
    if (t == CUDA_R_16BF)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16(f);
    else if (t == CUDA_R_16F)
        ((__half *)p)[i] = __float2half(f);
    else
        ((float *)p)[i] = f;
}

/* The 32F-compute rows of the cublasGemmEx table, also cuBLASLt's for these
 * "regular" types (where Ctype = Dtype): A = B; fp32 -> fp32, 16-bit -> the
 * same 16-bit or fp32. */
bool types_ok(int compute, int a, int b, int c)
{
    if (a != b || (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC))
        return false;
    return (a == CUDA_R_32F && c == CUDA_R_32F) ||
           ((a == CUDA_R_16F || a == CUDA_R_16BF) && (c == a || c == CUDA_R_32F));
}
bool op_ok(int op)
{
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}
int64_t imax1(int64_t a)
{
    return a > 1 ? a : 1;
}

/* ---- device memory ---- */
/* Elements a column-major rows x cols matrix with leading dimension ld spans. */
int64_t span(int64_t rows, int64_t cols, int64_t ld)
{
    return rows > 0 && cols > 0 ? (cols - 1) * ld + rows : 0;
}
/* The device touches `extent` elements from p in each of `batch` instances
 * `stride` elements apart. */
void check_mem(const char *fn, const char *what, const void *p, int t, int64_t extent,
               int64_t stride = 0, int64_t batch = 1)
{
    if (extent <= 0 || batch <= 0)
        return;
    size_t es = elem_size(t);
    if ((uintptr_t)p % es)
        cudasim::fault("%s: %s = %p is not aligned to its %zu-byte elements (misaligned address)",
                       fn, what, p, es);
    int64_t last = (batch - 1) * stride, lo = last < 0 ? last : 0;
    int64_t hi = (last > 0 ? last : 0) + extent;
    const char *base = (const char *)p + lo * (int64_t)es;
    if (!cudasim::device_accessible(base, (size_t)(hi - lo) * es))
        cudasim::fault("%s: %s: [%p, +%zu bytes) is not device memory (wrong pointer, leading "
                       "dimension or stride?)",
                       fn, what, (const void *)base, (size_t)(hi - lo) * es);
}
uint32_t ptr_align(const void *p)
{
    uint32_t al = 1;
    if (!p)
        return 256;
    while (al < 256 && !((uintptr_t)p & al))
        al <<= 1;
    return al;
}

/* ---- the GEMM and its epilogues ---- */
struct epi_info {
    bool bias, gelu, aux_out, dgelu;
    int bgrad; /* 0, 'A' or 'B' */
};
bool epilogue_info(uint32_t e, epi_info *x)
{
    *x = epi_info();
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return true;
    case CUBLASLT_EPILOGUE_BIAS: x->bias = true; return true;
    case CUBLASLT_EPILOGUE_GELU: x->gelu = true; return true;
    case CUBLASLT_EPILOGUE_GELU_BIAS: x->gelu = x->bias = true; return true;
    case CUBLASLT_EPILOGUE_GELU_AUX: x->gelu = x->aux_out = true; return true;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: x->gelu = x->aux_out = x->bias = true; return true;
    case CUBLASLT_EPILOGUE_DGELU: x->dgelu = true; return true;
    case CUBLASLT_EPILOGUE_BGRADA: x->bgrad = 'A'; return true;
    case CUBLASLT_EPILOGUE_BGRADB: x->bgrad = 'B'; return true;
    default: return false;
    }
}
const double GELU_S = 0.79788456080286535588; // sqrt(2/pi)
double gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(GELU_S * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x)
{
    double t = tanh(GELU_S * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_S * (1.0 + 3.0 * 0.044715 * x * x);
}

struct operand {
    const char *p;
    int t;
    int64_t ld, stride; /* elements */
    bool trans;
};
/* Everything one call does, copied at the call: the work runs later. */
struct job {
    int64_t m, n, k, batch;
    operand a, b, c, d; /* c.p NULL: C is not read (beta == 0) */
    float alpha, beta;
    epi_info epi;
    char *bias, *aux;
    int bias_t, aux_t;
    int64_t aux_ld;
};

/* The two hot loops are left uninstrumented in sanitized builds (the
 * reference GEMM would dominate the suite's time there): every operand's
 * extent was checked against device memory when the call was made. */
#define HOT_LOOP __attribute__((no_sanitize("address", "undefined")))

/* out[r * K + l] = op(X)(r, l) for the R x K matrix op(X). */
HOT_LOOP void pack(const operand &x, const char *p, bool trans, int64_t R, int64_t K, float *out)
{
    for (int64_t r = 0; r < R; r++)
        for (int64_t l = 0; l < K; l++)
            out[r * K + l] = load(p, x.t, trans ? l + r * x.ld : r + l * x.ld);
}
/* fp32 products summed in 16 independent fp32 lanes (vectorizable; cuBLAS
 * accumulates in fp32 too), the lanes then in double */
HOT_LOOP double dot(const float *x, const float *y, int64_t k)
{
    float s[16] = {0};
    int64_t l = 0;
    for (; l + 16 <= k; l += 16)
        for (int u = 0; u < 16; u++)
            s[u] += x[l + u] * y[l + u];
    double t = 0;
    for (; l < k; l++)
        t += (double)x[l] * y[l];
    for (int u = 0; u < 16; u++)
        t += s[u];
    return t;
}
const char *nth(const operand &x, int64_t q)
{
    return x.p ? x.p + q * x.stride * (int64_t)elem_size(x.t) : nullptr;
}

bool run(const job &j)
{
    /* op(A) by rows, op(B) by columns, both packed before D is written, so
     * an output aliasing an input cannot change the sums */
    std::vector<float> ap((size_t)(j.m * j.k)), bp((size_t)(j.n * j.k));
    for (int64_t q = 0; q < j.batch; q++) {
        const char *C = nth(j.c, q);
        char *D = (char *)nth(j.d, q);
        pack(j.a, nth(j.a, q), j.a.trans, j.m, j.k, ap.data());
        pack(j.b, nth(j.b, q), !j.b.trans, j.n, j.k, bp.data());
        if (j.epi.bgrad) {
            const float *x = j.epi.bgrad == 'A' ? ap.data() : bp.data();
            for (int64_t r = 0; r < (j.epi.bgrad == 'A' ? j.m : j.n); r++) {
                double s = 0;
                for (int64_t l = 0; l < j.k; l++)
                    s += x[r * j.k + l];
                store(j.bias, j.bias_t, r, s);
            }
        }
        for (int64_t c = 0; c < j.n; c++)
            for (int64_t r = 0; r < j.m; r++) {
                double v = (double)j.alpha * dot(ap.data() + r * j.k, bp.data() + c * j.k, j.k);
                if (C)
                    v += (double)j.beta * load(C, j.c.t, r + c * j.c.ld);
                if (j.epi.bias)
                    v += load(j.bias, j.bias_t, r);
                if (j.epi.aux_out)
                    store(j.aux, j.aux_t, r + c * j.aux_ld, v);
                if (j.epi.gelu)
                    v = gelu(v);
                if (j.epi.dgelu)
                    v *= gelu_grad(load(j.aux, j.aux_t, r + c * j.aux_ld));
                store(D, j.d.t, r + c * j.d.ld, v);
            }
    }
    return true;
}
cublasStatus_t submit(const char *fn, cudaStream_t stream, const job &j)
{
    if (cudasim::enqueue(stream, fn, [j]() { return run(j); }) != cudaSuccess)
        return CUBLAS_STATUS_EXECUTION_FAILED; // "the function failed to launch on the GPU"
    return CUBLAS_STATUS_SUCCESS;
}

bool algo_ok(int a)
{
    return a == CUBLAS_GEMM_DEFAULT || (a >= CUBLAS_GEMM_ALGO0 && a <= CUBLAS_GEMM_ALGO23) ||
           (a >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && a <= CUBLAS_GEMM_ALGO15_TENSOR_OP) ||
           a == CUBLAS_GEMM_AUTOTUNE;
}

cublasStatus_t gemm(const char *fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
                    long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                    const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                    cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    if (!live(h, OBJ_BLAS))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    bool tra = ta != CUBLAS_OP_N, trb = tb != CUBLAS_OP_N;
    if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta ||
        lda < imax1(tra ? k : m) || ldb < imax1(trb ? n : k) || ldc < imax1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!types_ok(compute, at, bt, ct) || !algo_ok(algo))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    job j = job();
    memcpy(&j.alpha, alpha, sizeof(float)); // the scale type of 32F compute
    memcpy(&j.beta, beta, sizeof(float));
    j.m = m, j.n = n, j.k = k, j.batch = batch;
    j.a = operand{(const char *)A, at, lda, sa, tra};
    j.b = operand{(const char *)B, bt, ldb, sb, trb};
    j.c = operand{j.beta != 0.0f ? (const char *)C : nullptr, ct, ldc, sc, false};
    j.d = operand{(const char *)C, ct, ldc, sc, false};
    if (k > 0) {
        check_mem(fn, "A", A, at, tra ? span(k, m, lda) : span(m, k, lda), sa, batch);
        check_mem(fn, "B", B, bt, trb ? span(n, k, ldb) : span(k, n, ldb), sb, batch);
    }
    check_mem(fn, "C", C, ct, span(m, n, ldc), sc, batch);
    return submit(fn, h->stream, j);
}

/* ---- cuBLASLt objects: our structs, stored in the header's opaque ones ---- */
struct lt_desc {
    int32_t compute, scale, pointer_mode, transa, transb, transc, fill;
    uint32_t epilogue;
    int32_t bias_type, aux_type; /* -1: D's type */
    const void *bias, *aux;
    int64_t aux_ld;
    int32_t unsupported; /* an attribute this stand-in does not implement was set */
};
struct lt_layout {
    int32_t type, order;
    uint64_t rows, cols;
    int64_t ld;
};
struct lt_pref {
    uint32_t search;
    uint64_t max_workspace;
    uint32_t align[4]; /* A, B, C, D */
};
const uint64_t ALGO_MAGIC = 0x6375646173696d31ull; /* "cudasim1" */
struct lt_algo {
    uint64_t magic;
    uint32_t align[6]; /* A, B, C, D, bias, aux: what the algorithm may assume */
};
static_assert(sizeof(lt_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "lt_desc fits");
static_assert(sizeof(lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "lt_layout fits");
static_assert(sizeof(lt_pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "lt_pref fits");
static_assert(sizeof(lt_algo) <= sizeof(cublasLtMatmulAlgo_t), "lt_algo fits");

template <typename T, typename O> T get(const O *o)
{
    T t;
    memcpy(&t, o, sizeof t);
    return t;
}
template <typename O, typename T> void put(O *o, const T &t)
{
    memcpy((void *)o, &t, sizeof t);
}
template <typename O, typename T> cublasStatus_t create(O **out, const T &init, int kind)
{
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    O *o = new (std::nothrow) O();
    if (!o)
        return CUBLAS_STATUS_ALLOC_FAILED;
    put(o, init);
    reg(o, kind, REG_ADD);
    *out = o;
    return CUBLAS_STATUS_SUCCESS;
}
template <typename O> cublasStatus_t destroy(O *o, int kind, const char *fn)
{
    if (o) {
        reg(o, kind, REG_REMOVE, fn);
        delete o;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The end of a SetAttribute: the documented size check, then the store
 * (dst NULL: an attribute accepted and ignored). */
template <typename O, typename T>
cublasStatus_t set_field(O *o, T &v, void *dst, size_t want, const void *buf, size_t size)
{
    if (size != want)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (dst)
        memcpy(dst, buf, want);
    put(o, v);
    return CUBLAS_STATUS_SUCCESS;
}

/* One cuBLASLt problem, checked as cublasLtMatmul would run it. */
struct lt_problem {
    lt_desc d;
    lt_layout a, b, c, dd;
    int64_t m, n, k;
    int bias_t, aux_t;
    epi_info epi;
};
cublasStatus_t lt_check(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                        cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                        cublasLtMatrixLayout_t D, lt_problem *p)
{
    if (!live(desc, OBJ_DESC) || !live(A, OBJ_LAYOUT) || !live(B, OBJ_LAYOUT) ||
        !live(C, OBJ_LAYOUT) || !live(D, OBJ_LAYOUT))
        return CUBLAS_STATUS_INVALID_VALUE;
    const lt_desc &d = p->d = get<lt_desc>(desc);
    p->a = get<lt_layout>(A), p->b = get<lt_layout>(B);
    p->c = get<lt_layout>(C), p->dd = get<lt_layout>(D);
    if (!op_ok(d.transa) || !op_ok(d.transb))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (d.unsupported || d.pointer_mode != CUBLASLT_POINTER_MODE_HOST ||
        d.fill != CUBLAS_FILL_MODE_FULL || d.transc != CUBLAS_OP_N || d.scale != CUDA_R_32F ||
        !epilogue_info(d.epilogue, &p->epi))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    for (const lt_layout *l : {&p->a, &p->b, &p->c, &p->dd}) {
        if (l->order != CUBLASLT_ORDER_COL || l->rows > INT32_MAX || l->cols > INT32_MAX)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        if (l->ld < imax1((int64_t)l->rows))
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    bool ta = d.transa != CUBLAS_OP_N, tb = d.transb != CUBLAS_OP_N;
    p->m = (int64_t)(ta ? p->a.cols : p->a.rows);
    p->k = (int64_t)(ta ? p->a.rows : p->a.cols);
    p->n = (int64_t)(tb ? p->b.rows : p->b.cols);
    if ((int64_t)(tb ? p->b.cols : p->b.rows) != p->k || (int64_t)p->dd.rows != p->m ||
        (int64_t)p->dd.cols != p->n || p->c.rows != p->dd.rows || p->c.cols != p->dd.cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (p->c.type != p->dd.type || !types_ok(d.compute, p->a.type, p->b.type, p->dd.type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p->bias_t = d.bias_type == -1 ? p->dd.type : d.bias_type;
    if ((p->epi.bias || p->epi.bgrad) && p->bias_t != p->dd.type && p->bias_t != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p->aux_t = d.aux_type == -1 ? p->dd.type : d.aux_type;
    if (p->epi.aux_out || p->epi.dgelu) {
        if (p->aux_t != p->dd.type || (p->epi.dgelu && p->k == 1))
            return CUBLAS_STATUS_NOT_SUPPORTED;
        if (!d.aux || d.aux_ld < p->m || d.aux_ld % 8)
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

const char *status_string(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the requested functionality requires a license";
    default: return "unknown error";
    }
}

} // namespace

extern "C" {

/* ---- cuBLAS ---- */
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    return create(handle, cublasContext(), OBJ_BLAS);
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cudaDeviceSynchronize(); // documented: releasing a handle synchronizes the device
    return destroy(handle, OBJ_BLAS, "cublasDestroy");
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    if (!live(handle, OBJ_BLAS))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    /* documented: this also drops a user workspace for the default pool
     * (unobservable here: nothing uses a workspace) */
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace,
                                     size_t workspaceSizeInBytes)
{
    if (!live(handle, OBJ_BLAS))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((uintptr_t)workspace % 256)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (workspaceSizeInBytes && !cudasim::device_accessible(workspace, workspaceSizeInBytes))
        cudasim::fault("cublasSetWorkspace: [%p, +%zu bytes) is not device memory", workspace,
                       workspaceSizeInBytes);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!live(handle, OBJ_BLAS))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH &&
        base != CUBLAS_PEDANTIC_MATH && base != CUBLAS_TF32_TENSOR_OP_MATH &&
        base != CUBLAS_FP32_EMULATED_BF16X9_MATH && base != CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    return status_string(status);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B,
                Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype,
                lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                computeType, algo);
}

/* ---- cuBLASLt ---- */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    return create(lightHandle, cublasLtContext(), OBJ_LT);
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!lightHandle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cudaDeviceSynchronize(); // documented, as for cublasDestroy
    return destroy(lightHandle, OBJ_LT, "cublasLtDestroy");
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return status_string(status);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    lt_desc d = lt_desc();
    d.compute = computeType, d.scale = scaleType, d.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d.transa = d.transb = d.transc = CUBLAS_OP_N, d.fill = CUBLAS_FILL_MODE_FULL;
    d.epilogue = CUBLASLT_EPILOGUE_DEFAULT, d.bias_type = d.aux_type = -1;
    return create(matmulDesc, d, OBJ_DESC);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    return destroy(matmulDesc, OBJ_DESC, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    if (!live(matmulDesc, OBJ_DESC) || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    lt_desc d = get<lt_desc>(matmulDesc);
    void *dst = nullptr;
    size_t want = 4;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: dst = &d.compute; break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: dst = &d.scale; break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: dst = &d.pointer_mode; break;
    case CUBLASLT_MATMUL_DESC_TRANSA: dst = &d.transa; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: dst = &d.transb; break;
    case CUBLASLT_MATMUL_DESC_TRANSC: dst = &d.transc; break;
    case CUBLASLT_MATMUL_DESC_FILL_MODE: dst = &d.fill; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: dst = &d.epilogue; break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: dst = &d.bias_type; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: dst = &d.aux_type; break;
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: break; /* a performance hint */
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: dst = &d.bias, want = sizeof(void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: dst = &d.aux, want = sizeof(void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: dst = &d.aux_ld, want = 8; break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: /* used only by batched layouts: none here */
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: want = 8; break;
    default:
        /* the scale/amax pointers, scale modes, fast accumulation, emulation:
         * valid, not implemented, so heuristic and matmul say NOT_SUPPORTED */
        if (attr > CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR)
            return CUBLAS_STATUS_INVALID_VALUE;
        d.unsupported = 1;
        put(matmulDesc, d);
        return CUBLAS_STATUS_SUCCESS;
    }
    return set_field(matmulDesc, d, dst, want, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    return create(matLayout, lt_layout{type, CUBLASLT_ORDER_COL, rows, cols, ld}, OBJ_LAYOUT);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    return destroy(matLayout, OBJ_LAYOUT, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    return create(pref, lt_pref{CUBLASLT_SEARCH_BEST_FIT, 0, {256, 256, 256, 256}}, OBJ_PREF);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    return destroy(pref, OBJ_PREF, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    if (!live(pref, OBJ_PREF) || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    lt_pref p = get<lt_pref>(pref);
    void *dst = nullptr;
    size_t want = 4;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: dst = &p.search; break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: dst = &p.max_workspace, want = 8; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: dst = &p.align[0]; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: dst = &p.align[1]; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: dst = &p.align[2]; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: dst = &p.align[3]; break;
    /* filters that our one algorithm (no reduction, one wave) always passes */
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: break;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: want = 8; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return set_field(pref, p, dst, want, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                              cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference,
                                              int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount)
{
    if (!live(lightHandle, OBJ_LT))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount ||
        !live(preference, OBJ_PREF))
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    lt_problem p;
    cublasStatus_t st = lt_check(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    lt_pref pr = get<lt_pref>(preference);
    if (pr.search != CUBLASLT_SEARCH_BEST_FIT)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    lt_algo a = {ALGO_MAGIC, {}};
    const lt_layout *ls[4] = {&p.a, &p.b, &p.c, &p.dd};
    for (int i = 0; i < 4; i++) {
        /* promised less alignment than one element: no kernel could load it */
        if (pr.align[i] < elem_size(ls[i]->type))
            return CUBLAS_STATUS_NOT_SUPPORTED;
        a.align[i] = pr.align[i] < 256 ? pr.align[i] : 256;
    }
    a.align[4] = p.epi.bias || p.epi.bgrad ? ptr_align(p.d.bias) : 1;
    a.align[5] = p.epi.aux_out || p.epi.dgelu ? ptr_align(p.d.aux) : 1;
    cublasLtMatmulHeuristicResult_t &r = heuristicResultsArray[0];
    memset(&r, 0, sizeof r);
    put(&r.algo, a);
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    const char *fn = "cublasLtMatmul";
    if (!live(lightHandle, OBJ_LT))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    lt_problem p;
    cublasStatus_t st = lt_check(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    job j = job();
    memcpy(&j.alpha, alpha, sizeof(float));
    memcpy(&j.beta, beta, sizeof(float));
    bool reads_c = j.beta != 0.0f, has_bias = p.epi.bias || p.epi.bgrad;
    bool has_aux = p.epi.aux_out || p.epi.dgelu;
    if ((reads_c && !C) || (C == D && (p.c.ld != p.dd.ld || p.c.type != p.dd.type)) ||
        (has_bias && !p.d.bias))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (algo) { /* NULL: the library runs its own heuristic, any alignment */
        lt_algo a = get<lt_algo>(algo);
        if (a.magic != ALGO_MAGIC)
            return CUBLAS_STATUS_INVALID_VALUE;
        const void *ptrs[6] = {A, B, reads_c ? C : nullptr, D, has_bias ? p.d.bias : nullptr,
                               has_aux ? p.d.aux : nullptr};
        static const char *const names[6] = {"A", "B", "C", "D", "bias", "aux"};
        for (int i = 0; i < 6; i++)
            if (ptrs[i] && ptr_align(ptrs[i]) < a.align[i]) {
                fprintf(stderr,
                        "cudasim: cublasLtMatmul: %s = %p is %u-byte aligned, its algorithm "
                        "was chosen for %u bytes\n",
                        names[i], ptrs[i], ptr_align(ptrs[i]), a.align[i]);
                return CUBLAS_STATUS_INVALID_VALUE;
            }
    }
    if (workspace && workspaceSizeInBytes &&
        !cudasim::device_accessible(workspace, workspaceSizeInBytes))
        cudasim::fault("%s: workspace [%p, +%zu bytes) is not device memory", fn, workspace,
                       workspaceSizeInBytes);
    if (p.k > 0) {
        check_mem(fn, "A", A, p.a.type, span((int64_t)p.a.rows, (int64_t)p.a.cols, p.a.ld));
        check_mem(fn, "B", B, p.b.type, span((int64_t)p.b.rows, (int64_t)p.b.cols, p.b.ld));
    }
    if (reads_c)
        check_mem(fn, "C", C, p.c.type, span(p.m, p.n, p.c.ld));
    check_mem(fn, "D", D, p.dd.type, span(p.m, p.n, p.dd.ld));
    if (has_bias)
        check_mem(fn, "bias", p.d.bias, p.bias_t, p.epi.bgrad == 'B' ? p.n : p.m);
    if (has_aux)
        check_mem(fn, "aux", p.d.aux, p.aux_t, span(p.m, p.n, p.d.aux_ld));
    j.m = p.m, j.n = p.n, j.k = p.k, j.batch = 1, j.epi = p.epi;
    j.a = operand{(const char *)A, p.a.type, p.a.ld, 0, p.d.transa != CUBLAS_OP_N};
    j.b = operand{(const char *)B, p.b.type, p.b.ld, 0, p.d.transb != CUBLAS_OP_N};
    j.c = operand{reads_c ? (const char *)C : nullptr, p.c.type, p.c.ld, 0, false};
    j.d = operand{(const char *)D, p.dd.type, p.dd.ld, 0, false};
    j.bias = (char *)p.d.bias, j.bias_t = p.bias_t;
    j.aux = (char *)p.d.aux, j.aux_t = p.aux_t, j.aux_ld = p.d.aux_ld;
    return submit(fn, stream, j);
}

} // extern "C"
