/* gpu_check — see gpu_check.h. */
#include "tests/gpu/gpu_check.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

int gpu_failures;

/* The rule in gpu_check.h: a skip only when there is nothing to run on. */
void gpu_require_device(void)
{
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&drv);  /* 0 when no driver is installed */
    cudaRuntimeGetVersion(&rt);
    if (e != cudaSuccess || n < 1) {
        int no_driver = e == cudaErrorInsufficientDriver && drv == 0;
        const char *why = e == cudaSuccess ? "count 0"
                          : no_driver      ? "no NVIDIA driver installed"
                                           : cudaGetErrorString(e);
        if (e == cudaSuccess || e == cudaErrorNoDevice || no_driver) {
            printf("SKIP: no CUDA device (%s; driver %d.%d, runtime %d.%d)\n", why, drv / 1000,
                   drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
            exit(77);
        }
        printf("FAIL CUDA is unusable: cudaGetDeviceCount: %s (%s); driver %d.%d, runtime %d.%d\n",
               cudaGetErrorName(e), why, drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        exit(1);
    }
    struct cudaDeviceProp prop;
    TCHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s, sm_%d%d, %.1f GiB\n", prop.name, prop.major, prop.minor,
           prop.totalGlobalMem / 1073741824.0);
}

int gpu_has_bf16(void)
{
    int dev = 0, major = 0, minor = 0;
    TCHECK(cudaGetDevice(&dev));
    TCHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    TCHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major >= 8)
        return 1;
    static int said;
    if (!said++)
        printf("skip bf16: sm_%d%d has no bf16 arithmetic (needs sm_80)\n", major, minor);
    return 0;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
float frand(void) // uniform in (-1, 1)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

float *host_rand(size_t n, float scale, float offset)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h)
        abort();
    for (size_t i = 0; i < n; i++)
        h[i] = offset + scale * frand();
    return h;
}

float *host_copy(const float *src, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h)
        abort();
    memcpy(h, src, n * sizeof(float));
    return h;
}

void *dev_alloc(size_t bytes)
{
    void *d = NULL;
    TCHECK(cudaMalloc(&d, bytes ? bytes : 16));
    return d;
}

/* Device buffer of n elements of dt holding h (converted on the device). */
void *dev_from(const float *h, size_t n, kdtype dt)
{
    float *tmp = dev_alloc(n * sizeof(float));
    TCHECK(cudaMemcpy(tmp, h, n * sizeof(float), cudaMemcpyHostToDevice));
    if (dt == KDT_F32)
        return tmp;
    void *d = dev_alloc(n * kdtype_size(dt));
    cuda_cast(d, dt, tmp, KDT_F32, n, 0);
    TCHECK(cudaDeviceSynchronize());
    TCHECK(cudaFree(tmp));
    return d;
}

void dev_to(float *h, const void *d, size_t n, kdtype dt)
{
    if (dt == KDT_F32) {
        TCHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
        return;
    }
    float *tmp = dev_alloc(n * sizeof(float));
    cuda_cast(tmp, KDT_F32, d, dt, n, 0);
    TCHECK(cudaMemcpy(h, tmp, n * sizeof(float), cudaMemcpyDeviceToHost));
    TCHECK(cudaFree(tmp));
}

void *dev_nan(size_t n, kdtype dt)
{
    void *d = dev_alloc(n * kdtype_size(dt));
    cuda_fill_nan(d, dt, n, 0);
    return d;
}

int32_t *dev_ints(const int32_t *h, size_t n)
{
    int32_t *d = dev_alloc(n * sizeof(int32_t));
    TCHECK(cudaMemcpy(d, h, n * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
}

/* Rounds h in place to what dt can hold, so the CPU sees the GPU's inputs. */
void round_to(float *h, size_t n, kdtype dt)
{
    if (dt == KDT_F32)
        return;
    void *d = dev_from(h, n, dt);
    dev_to(h, d, n, dt);
    TCHECK(cudaFree(d));
}

double tol_for(kdtype dt)
{
    return dt == KDT_F32 ? 1e-5 : 1e-2;
}

/* The comparison rule in the file header; prints one line; counts failures. */
int check_close(const char *what, kdtype dt, const float *got, const float *ref, size_t n,
                       double tol)
{
    double maxref = 0.0, maxerr = 0.0;
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)ref[i]);
        if (r > maxref)
            maxref = r;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            bad++;
            worst = i;
            continue;
        }
        double e = fabs((double)got[i] - (double)ref[i]);
        if (e > maxerr) {
            maxerr = e;
            if (!bad)
                worst = i;
        }
    }
    double rel = maxref > 0 ? maxerr / maxref : maxerr;
    int ok = bad == 0 && rel <= tol && n > 0 && maxref > 0;
    printf("%-4s %-44s %-4s n=%-8zu rel=%.3g (tol %.0e)%s", ok ? "ok" : "FAIL", what,
           kdtype_name(dt), n, rel, tol, bad ? " NON-FINITE" : "");
    if (!ok && n)
        printf("  [%zu] got %.8g ref %.8g", worst, got[worst], ref[worst]);
    if (maxref == 0)
        printf("  (reference is all zeros: test input is wrong)");
    printf("\n");
    if (!ok)
        gpu_failures++;
    return ok;
}


bert_config gpu_test_config(int heads, int nsp)
{
    bert_config c;
    bert_config_preset(&c, NULL);
    c.vocab_size = 997;
    c.hidden_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = heads;
    c.intermediate_size = 160;
    c.max_position_embeddings = 40;
    c.hidden_dropout_prob = 0.1f;
    c.attention_probs_dropout_prob = 0.1f;
    c.layer_norm_eps = 1e-12f;
    c.nsp = nsp;
    return c;
}

int gpu_ranks_id_send(void *ctx, const void *id, size_t len)
{
    gpu_ranks *p = ctx;
    for (int g = 1; g < p->world; g++)
        if (write(p->fds[g][1], id, len) != (ssize_t)len)
            return -EIO;
    return 0;
}

int gpu_ranks_id_recv(void *ctx, void *id, size_t len)
{
    gpu_ranks *p = ctx;
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(p->fds[p->rank][0], (char *)id + got, len - got);
        if (n <= 0)
            return -EIO;
        got += (size_t)n;
    }
    return 0;
}

/* See gpu_check.h. */
int gpu_device_count_forked(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        int n = 0, drv = 0, rt = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        if (e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && drv == 0)) {
            printf("no CUDA device (%s; driver %d.%d, runtime %d.%d)\n",
                   drv == 0 ? "no NVIDIA driver installed" : cudaGetErrorString(e), drv / 1000,
                   drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
            n = 0;
        } else if (e != cudaSuccess) {
            printf("FAIL CUDA is unusable: cudaGetDeviceCount: %s (%s); driver %d.%d, runtime %d.%d\n",
                   cudaGetErrorName(e), cudaGetErrorString(e), drv / 1000, drv % 1000 / 10,
                   rt / 1000, rt % 1000 / 10);
            n = -1;
        }
        fflush(stdout);
        ssize_t w = write(fds[1], &n, sizeof(n));
        _exit(w == sizeof(n) ? 0 : 1);
    }
    close(fds[1]);
    int n = -1;
    if (read(fds[0], &n, sizeof(n)) != sizeof(n))
        n = -1; /* the child died before it could say */
    close(fds[0]);
    waitpid(pid, NULL, 0);
    return n;
}

