/* test_ddp_cuda — data parallelism on the GPU path end to end: W ranks (one
 * process and one device each, NCCL through worker/comm_nccl.cu, gradients
 * reduced in per-layer buckets during backward as bertd-worker does it)
 * training on W slices of a batch must equal one rank training on the whole
 * batch. World 1, 2 and 3 with buckets, and world 2 with the single
 * all-reduce after backward (BERTD_DDP_OVERLAP=0's path). Compared: the
 * reduced gradient of every step against one rank's whole-batch gradient,
 * fp32 with the fp32 reduction to 1e-5 normwise (tests/gpu's fp32 rule: the
 * ranks' sums are the whole batch's in another order), world 2 with a bf16
 * reduction to 1e-2 (tests/gpu's 16-bit rule); and after each step every
 * rank must hold the same parameters bit for bit (the replicas).
 * Parameters are not compared with one rank's: AdamW's first steps move
 * each weight by about lr * sign(g), so a gradient element at rounding-noise
 * level may move either way in either run.
 *
 * The batch: 6 rows of T tokens, 4 masked positions per row, so every
 * slice has as many masked tokens as every other and the mean of the
 * ranks' mean losses is the whole batch's mean; no dropout (its masks
 * depend on the rank). Two steps of AdamW without warmup.
 *
 * Needs W devices (skips the worlds it cannot run). On the CPU stand-in
 * (tests/cudasim) it runs with CUDASIM_DEVICES=4, in both stream modes.
 * Shown to fail under the stand-in's deferred streams: with the
 * cudaStreamWaitEvent of comm_nccl_bucket_start removed, every multi-rank
 * run reduces gradients backward has not written yet (rel 1.0-2.2, and the
 * replicas differ); its sync mode cannot show that.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/gpu/gpu_check.h"
#include "worker/comm.h"
#include "worker/gpu_model.h"
#ifdef BERTD_CUDASIM
#include "worker/nccl_abi.h" /* cudasim_nccl_groups */
#endif
#include "worker/model.h"
#include "worker/optim.h"

enum { MAXW = 3, B = 6, T = 24, MPR = 4, STEPS = 2 };

static int bucket(void *ctx, float *const *grads, const size_t *n, int k, cudaStream_t s)
{
    return comm_nccl_bucket_start_ranges(ctx, grads, n, k, s);
}

static int bucket_finish(void *ctx, cudaStream_t s)
{
    int rc = comm_nccl_buckets_wait(ctx, s);
    return rc ? rc : comm_nccl_drain(ctx);
}

/* given the compute stream, as bertd-worker does */
static int whole(void *ctx, float *grads, size_t n, cudaStream_t s)
{
    return comm_nccl_allreduce_mean(ctx, grads, n, s);
}

/* The whole batch, deterministic. */
typedef struct batch_data {
    int32_t ids[B * T], types[B * T], lens[B], pos[B * MPR], labels[B * MPR];
} batch_data;

static void make_data(batch_data *d, const bert_config *c)
{
    for (int i = 0; i < B * T; i++) {
        d->ids[i] = (int32_t)((i * 131 + 7) % c->vocab_size);
        d->types[i] = (i % T) >= T / 2;
    }
    for (int b = 0; b < B; b++) {
        d->lens[b] = T - 3 * b;
        for (int k = 0; k < MPR; k++) {
            d->pos[b * MPR + k] = b * T + (k * 5 + b) % d->lens[b];
            d->labels[b * MPR + k] = (int32_t)((b * 37 + k * 11 + 3) % c->vocab_size);
        }
    }
}

/* rows [r0, r0 + nb) of d, positions re-based to the slice */
static bert_batch slice(batch_data *d, int32_t *pos, int r0, int nb)
{
    for (int m = 0; m < nb * MPR; m++)
        pos[m] = d->pos[r0 * MPR + m] - r0 * T;
    bert_batch b = {.B = nb, .T = T, .M = nb * MPR, .input_ids = d->ids + r0 * T,
                    .token_type_ids = d->types + r0 * T, .seq_lens = d->lens + r0,
                    .mlm_positions = pos, .mlm_labels = d->labels + r0 * MPR};
    return b;
}

/* One rank: STEPS steps on its slice; per step the reduced gradient and
 * the parameters after it to out (STEPS x 2 x n floats). Exit code 0 or
 * the failing stage. */
static int rank_main(gpu_ranks *p, int rank, int world, comm_dtype rd, int overlap, float *out)
{
    p->rank = rank;
    bert_config c = gpu_test_config(4, 0);
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    oc.lr = 1e-3f;
    oc.weight_decay = 0.01f;
    oc.warmup_steps = 0;
    oc.total_steps = 10;
    bert_model *cpu = NULL;
    if (cudaSetDevice(rank) != cudaSuccess || bert_model_create(&cpu, &c) != 0)
        return 10;
    bert_model_init_weights(cpu, 2024);
    int nb = B / world;
    char err[256];
    gpu_model *g = NULL;
    if (gpu_model_create(&g, &c, KDT_F32, rank, nb, T, nb * MPR, &oc, err, sizeof err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 11;
    }
    if (gpu_model_set_params(g, cpu->params_memory) != 0)
        return 12;
    comm *cm = NULL;
    if (world > 1) {
        if (comm_create_nccl(&cm, rank, world, rank, rd, gpu_ranks_id_send, gpu_ranks_id_recv, p, 60000) != 0)
            return 13;
        if (gpu_model_set_allreduce(g, whole, cm, g->compute) != 0)
            return 14;
        if (overlap && gpu_model_set_buckets(g, bucket, bucket_finish, cm) != 0)
            return 15;
    }
    batch_data d;
    int32_t pos[B * MPR];
    make_data(&d, &c);
    bert_batch b = slice(&d, pos, rank * nb, nb);
    int code = 0;
#ifdef BERTD_CUDASIM
    long groups0 = cudasim_nccl_groups();
#endif
    for (int s = 0; s < STEPS && code == 0; s++) {
        int skipped = 0;
        gpu_model_zero_grad(g);
        if (overlap && world > 1)
            gpu_model_reduce_in_next_backward(g); /* as bertd-worker arms its last micro-batch */
        if (gpu_model_upload(g, &b, err, sizeof err) != 0)
            code = 16;
        else if (gpu_model_forward(g, NULL, 1.0f) != 0 || gpu_model_backward(g) != 0)
            code = 17;
        else if (gpu_model_step(g, NULL, NULL, &skipped) != 0 || skipped)
            code = 18;
        else if (gpu_model_get_grads(g, out + (size_t)s * 2 * cpu->num_params) != 0 ||
                 gpu_model_get_params(g, out + ((size_t)s * 2 + 1) * cpu->num_params) != 0)
            code = 19;
    }
#ifdef BERTD_CUDASIM
    /* one NCCL group per bucket (L layers, the rest, the embeddings), or
     * one per step for the single all-reduce */
    long groups = cudasim_nccl_groups() - groups0,
         want = world == 1 ? 0 : overlap ? (long)STEPS * (c.num_hidden_layers + 2) : STEPS;
    if (code == 0 && groups != want) {
        fprintf(stderr, "rank %d: %ld NCCL groups in %d steps, want %ld\n", rank, groups, STEPS, want);
        code = 20;
    }
#endif
    comm_destroy(cm);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
    cuda_kernels_shutdown();
    return code;
}

/* Runs `world` ranks; each one's results land in out + rank * STEPS * 2n. */
static int run_world(int world, comm_dtype rd, int overlap, float *out, size_t n)
{
    gpu_ranks p = {.world = world};
    for (int g = 0; g < world; g++)
        if (pipe(p.fds[g]) != 0)
            return -1;
    pid_t pids[MAXW];
    fflush(stdout);
    for (int g = 0; g < world; g++) {
        pids[g] = fork();
        if (pids[g] == 0) {
            for (int k = 0; k < world && g > 0; k++)
                close(p.fds[k][1]); /* rank 0 dead: the others read EOF */
            _exit(rank_main(&p, g, world, rd, overlap, out + (size_t)g * STEPS * 2 * n));
        }
    }
    int ok = 1;
    for (int g = 0; g < world; g++) {
        close(p.fds[g][1]);
        int st;
        waitpid(pids[g], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("FAIL world %d rank %d: status %d\n", world, g, st);
            ok = 0;
        }
        close(p.fds[g][0]);
    }
    return ok ? 0 : -1;
}

int main(void)
{
    int ndev = gpu_device_count_forked();
    if (ndev < 0) {
        printf("FAIL cannot count the CUDA devices\n");
        return 1;
    }
    if (ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    /* every rank reads each step's reduced gradients after gpu_model_step,
     * which the zero_grad-folding lever clears; its correctness is
     * test_model_cuda's (and the parameters compared here would show it too) */
    setenv("BERTD_LEVER_OPT_ZERO", "0", 1);
    bert_config c = gpu_test_config(4, 0);
    bert_model *tmp = NULL;
    if (bert_model_create(&tmp, &c) != 0)
        return 1;
    size_t n = tmp->num_params;
    bert_model_destroy(tmp);
    size_t per = (size_t)MAXW * STEPS * 2 * n * sizeof(float);
    float *ref = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *got = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ref == MAP_FAILED || got == MAP_FAILED)
        return 1;
    if (run_world(1, COMM_FP32, 1, ref, n) != 0)
        return 1;

    struct { int world; comm_dtype rd; int overlap; double tol; const char *what; } runs[] = {
        {2, COMM_FP32, 1, 1e-5, "2 ranks, buckets during backward, fp32"},
        {3, COMM_FP32, 1, 1e-5, "3 ranks, buckets during backward, fp32"},
        {2, COMM_FP32, 0, 1e-5, "2 ranks, one all-reduce after backward, fp32"},
        {2, COMM_BF16, 1, 1e-2, "2 ranks, buckets during backward, bf16 reduction"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        int W = runs[i].world;
        if (W > ndev) {
            printf("skip %s: %d device(s)\n", runs[i].what, ndev);
            continue;
        }
        memset(got, 0, per);
        if (run_world(W, runs[i].rd, runs[i].overlap, got, n) != 0) {
            gpu_failures++;
            continue;
        }
        for (int s = 0; s < STEPS; s++) {
            char what[128];
            snprintf(what, sizeof what, "%s, step %d gradient", runs[i].what, s + 1);
            check_close(what, KDT_F32, got + (size_t)s * 2 * n, ref + (size_t)s * 2 * n, n,
                        runs[i].tol);
            size_t differ = 0;
            for (int g = 1; g < W; g++)
                differ += memcmp(got + ((size_t)g * STEPS * 2 + s * 2 + 1) * n,
                                 got + ((size_t)s * 2 + 1) * n, n * sizeof(float)) != 0;
            printf("%-4s %-44s %zu rank(s) differ from rank 0\n", differ ? "FAIL" : "ok",
                   "replicas bit-identical", differ);
            gpu_failures += differ != 0;
        }
    }
    printf("%d failure(s)\n", gpu_failures);
    return gpu_failures ? 1 : 0;
}
