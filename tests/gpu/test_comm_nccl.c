/* comm (NCCL backend) on real GPUs: world 1, and 2..4 forked ranks (one per
 * GPU) when the machine has them. The allreduce result is compared with the
 * mean the parent computes on the CPU in double, within a tolerance stated
 * per reduce precision; the bucket API is checked through a compute stream;
 * a rank that disappears must end its peer's collective with -EPIPE.
 * Exits 77 (skip) when no GPU is present; a CUDA that is there but
 * unusable (a driver too old for the runtime) fails.
 *
 * CUDA is never touched in the parent before fork (a CUDA context must not
 * cross fork): the device count comes from a short-lived child.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "tests/gpu/gpu_check.h"
#include "worker/comm.h"
#ifdef BERTD_CUDASIM
#include "worker/nccl_abi.h" /* cudasim_nccl_groups */
#endif

#define N 100003 /* odd, several buckets */
#define MAXW 4
#define TIMEOUT_MS 60000

static int failures; /* this test's own count (gpu_check's gpu_failures is unused) */

#define EXPECT(cond, ...)                                                           \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, "\n");                                                  \
            failures++;                                                             \
        }                                                                           \
    } while (0)

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static float value(int rank, size_t i)
{
    uint64_t h = mix(((uint64_t)rank << 40) ^ (uint64_t)i ^ 0x1234567ull);
    float v = (float)((double)(h & 0xffffff) / 16777216.0 * 4.0 - 2.0);
    return v == 0.0f ? 0.5f : v;
}

/* Round-to-nearest-even float -> bf16 -> float, independent of CUDA. */
static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* One rank: every collective, results written to out (N floats per dtype). */
static int rank_main(gpu_ranks *p, int rank, int world, float *out, int lose_peer)
{
    p->rank = rank;
    comm_dtype dts[3] = {COMM_FP32, COMM_BF16, COMM_FP16};
    float *host = malloc(N * sizeof(float));
    float *dev = NULL;
    cudaStream_t compute = NULL, nonblocking = NULL;
    int code = 0;
    if (!host || cudaSetDevice(rank) != cudaSuccess || cudaMalloc((void **)&dev, N * sizeof(float)) != cudaSuccess ||
        cudaStreamCreate(&compute) != cudaSuccess ||
        cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking) != cudaSuccess)
        return 10;
    for (int d = 0; d < 3 && code == 0; d++) {
        comm *c = NULL;
        int rc = comm_create_nccl(&c, rank, world, rank, dts[d], gpu_ranks_id_send, gpu_ranks_id_recv, p, lose_peer ? 5000 : TIMEOUT_MS);
        if (rc != 0)
            return 11;
        if (lose_peer) {
            if (rank == 1)
                _exit(0); /* vanish without a word */
            for (size_t i = 0; i < N; i++)
                host[i] = value(rank, i);
            cudaMemcpy(dev, host, N * sizeof(float), cudaMemcpyHostToDevice);
            rc = comm_allreduce_mean(c, dev, N);
            int rc2 = comm_barrier(c);
            comm_destroy(c);
            return rc == -EPIPE && rc2 == -EPIPE ? 0 : 12;
        }
        for (size_t i = 0; i < N; i++)
            host[i] = value(rank, i);
#ifdef BERTD_CUDASIM
        long groups0 = cudasim_nccl_groups();
#endif
        if (d == 0) {
            /* the synchronous call with its stream: the values are written
             * on a non-blocking stream, which the legacy default stream
             * does not order against, so the reduction must order after
             * the stream it is given (and the stream after it) */
            cudaMemset(dev, 0, N * sizeof(float));
            cudaMemcpyAsync(dev, host, N * sizeof(float), cudaMemcpyHostToDevice, nonblocking);
            if (comm_nccl_allreduce_mean(c, dev, N, nonblocking) != 0)
                code = 13;
            cudaMemcpyAsync(host, dev, N * sizeof(float), cudaMemcpyDeviceToHost, nonblocking);
            cudaStreamSynchronize(nonblocking);
        } else {
            /* buckets through a compute stream: the copy is queued on
             * compute, the buckets must wait for it, and the copy back must
             * wait for the buckets; fp16 as one bucket of two ranges */
            cudaMemcpyAsync(dev, host, N * sizeof(float), cudaMemcpyHostToDevice, compute);
            size_t half = N / 2, ns[2] = {half, N - half};
            float *bufs[2] = {dev, dev + half};
            if ((d == 1 ? comm_nccl_bucket_start(c, dev, half, compute) != 0 ||
                              comm_nccl_bucket_start(c, dev + half, N - half, compute) != 0
                        : comm_nccl_bucket_start_ranges(c, bufs, ns, 2, compute) != 0) ||
                comm_nccl_buckets_wait(c, compute) != 0 || comm_nccl_drain(c) != 0)
                code = 14;
            cudaMemcpyAsync(host, dev, N * sizeof(float), cudaMemcpyDeviceToHost, compute);
            cudaStreamSynchronize(compute);
        }
#ifdef BERTD_CUDASIM
        /* each bucket is one NCCL group, however many ranges it has */
        long groups = cudasim_nccl_groups() - groups0, want = d == 1 ? 2 : 1;
        if (code == 0 && groups != want) {
            fprintf(stderr, "rank %d dtype %d: %ld NCCL groups, want %ld\n", rank, d, groups, want);
            code = 20;
        }
#endif
        memcpy(out + (size_t)d * N, host, N * sizeof(float));
        double v[2] = {rank + 1.0, 1e15};
        if (code == 0 && comm_allreduce_sum_f64(c, v, 2) != 0)
            code = 15;
        if (code == 0 && (v[0] != world * (world + 1) / 2.0 || v[1] != world * 1e15))
            code = 16;
        char bytes[777];
        for (int i = 0; i < 777; i++)
            bytes[i] = rank == world - 1 ? (char)(i * 5) : 0;
        if (code == 0 && comm_broadcast(c, bytes, sizeof(bytes), world - 1) != 0)
            code = 17;
        for (int i = 0; i < 777 && code == 0; i++)
            if (bytes[i] != (char)(i * 5))
                code = 18;
        if (code == 0 && comm_barrier(c) != 0)
            code = 19;
        comm_destroy(c);
    }
    cudaFree(dev);
    cudaStreamDestroy(compute);
    cudaStreamDestroy(nonblocking);
    free(host);
    return code;
}

static void check_world(int world, int lose_peer)
{
    gpu_ranks p = {.world = world};
    float *out = mmap(NULL, sizeof(float) * 3 * N * MAXW, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) {
        failures++;
        return;
    }
    for (int g = 0; g < world; g++)
        if (pipe(p.fds[g]) != 0)
            failures++;
    pid_t pids[MAXW];
    for (int g = 0; g < world; g++) {
        pids[g] = fork();
        if (pids[g] == 0) {
            /* only rank 0 writes ids: if it dies, the others read EOF
             * instead of waiting forever */
            for (int k = 0; k < world && g > 0; k++)
                close(p.fds[k][1]);
            _exit(rank_main(&p, g, world, out + (size_t)g * 3 * N, lose_peer));
        }
    }
    for (int g = 0; g < world; g++)
        close(p.fds[g][1]);
    for (int g = 0; g < world; g++) {
        int st;
        waitpid(pids[g], &st, 0);
        EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "world %d lose %d rank %d: status %d", world, lose_peer, g,
               st);
    }
    if (!lose_peer) {
        /* tolerances: fp32 reduces in float with NCCL's order and its own
         * division by G: a few ulp of the largest term; bf16/fp16 round
         * every input (and partial sum) to 8 or 11 mantissa bits. */
        double tol_rel[3] = {4.0 * 0x1p-24, (world + 1) * 0x1p-8, (world + 1) * 0x1p-11};
        for (int d = 0; d < 3; d++) {
            double worst = 0;
            for (size_t i = 0; i < N; i++) {
                double ref = 0, mag = 0;
                for (int g = 0; g < world; g++) {
                    double x = d == 1 && world == 1 ? round_bf16(value(g, i)) : value(g, i);
                    ref += x;
                    mag = fmax(mag, fabs(x));
                }
                ref /= world;
                for (int g = 0; g < world; g++) {
                    double err = fabs(out[((size_t)g * 3 + d) * N + i] - ref);
                    worst = fmax(worst, err / mag);
                    /* all ranks hold the same bits */
                    EXPECT(memcmp(&out[((size_t)g * 3 + d) * N + i], &out[(size_t)d * N + i], 4) == 0,
                           "dtype %d elem %zu rank %d differs from rank 0", d, i, g);
                }
            }
            printf("world %d dtype %d: worst relative error %.3g (tolerance %.3g)\n", world, d, worst, tol_rel[d]);
            EXPECT(worst <= tol_rel[d], "world %d dtype %d: %.3g > %.3g", world, d, worst, tol_rel[d]);
            if (world == 1 && d == 1) {
                /* one rank in bf16: exactly the bf16 rounding of the input */
                for (size_t i = 0; i < N; i++)
                    EXPECT(out[N + i] == round_bf16(value(0, i)), "bf16 world 1 elem %zu", i);
            }
        }
    }
    for (int g = 0; g < world; g++)
        close(p.fds[g][0]);
    munmap(out, sizeof(float) * 3 * N * MAXW);
}

int main(void)
{
    /* the NCCL-only calls refuse a comm of the shm backend */
    comm *shm = NULL;
    char name[64];
    snprintf(name, sizeof(name), "/bertd-gputest-%d-comm", (int)getpid());
    EXPECT(comm_create_shm(&shm, name, 0, 1, 16, 1000) == 0, "shm comm");
    if (shm) {
        EXPECT(comm_nccl_bucket_start(shm, NULL, 1, NULL) == -EINVAL, "bucket_start on shm");
        EXPECT(comm_nccl_buckets_wait(shm, NULL) == -EINVAL, "buckets_wait on shm");
        EXPECT(comm_nccl_drain(shm) == -EINVAL, "drain on shm");
        EXPECT(comm_nccl_allreduce_mean(shm, NULL, 1, NULL) == -EINVAL, "allreduce_mean with a stream on shm");
        comm_destroy(shm);
    }
    if (failures)
        return 1;
    int ndev = gpu_device_count_forked();
    if (ndev < 0) {
        printf("FAIL cannot count the CUDA devices\n");
        return 1;
    }
    if (ndev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    /* NCCL is opened at run time: no libnccl.so.2, no communicator (and a
     * message naming it), never a crash */
    char msg[640] = "";
    int lrc = comm_nccl_load(msg, sizeof(msg));
    const char *absent = getenv("CUDASIM_NCCL");
    if (absent && strcmp(absent, "absent") == 0) {
        comm *c = NULL;
        EXPECT(lrc == -ENOENT && strstr(msg, "libnccl.so.2"), "load without NCCL: %d %s", lrc, msg);
        gpu_ranks p = {.world = 1};
        EXPECT(comm_create_nccl(&c, 0, 1, 0, COMM_FP32, gpu_ranks_id_send, gpu_ranks_id_recv, &p, 1000) == -ENOENT &&
                   !c,
               "comm_create_nccl without NCCL");
        printf("without NCCL: %s\n", msg);
        return failures ? 1 : 0;
    }
    if (lrc != 0) {
        printf("NCCL cannot be loaded (%s): skipped\n", msg);
        return 77;
    }
    printf("%s\n", msg);
    check_world(1, 0);
    int w = ndev < MAXW ? ndev : MAXW;
    if (w >= 2) {
        check_world(w, 0);
        check_world(2, 1);
    } else {
        printf("one GPU: multi-rank checks need 2+ GPUs, not run\n");
    }
    printf("%s (%d failures)\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
