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
 * With the lever GRAPH (BERTD_LEVER_GRAPH=1) every run takes 3 steps, and
 * each bucketed one runs again with its steps as CUDA graphs
 * (gpu_model_train_micro: step 1 eager, 2 captured with its NCCL buckets,
 * 3 replayed): the same checks, each rank's capture and launch counts, and
 * every gradient and parameter equal to the eager run's bit for bit; then
 * rank 1 vanishes after the captured step and rank 0's replay must end in
 * a bounded -EPIPE (the settle hook after the launch).
 *
 * Needs W devices (skips the worlds it cannot run). On the CPU stand-in
 * (tests/cudasim) it runs with CUDASIM_DEVICES=4, in both stream modes.
 * Shown to fail under the stand-in's deferred streams: with the
 * cudaStreamWaitEvent of comm_nccl_bucket_start removed, every multi-rank
 * run reduces gradients backward has not written yet (rel 1.0-2.2, and the
 * replicas differ); its sync mode cannot show that. The graph runs, shown
 * to fail: with the compute stream's join left out of the capture
 * (comm_nccl_buckets_wait), every rank's capture fails as unjoined and
 * falls back to eager (NCCL group and capture counts); without the settle
 * before gpu_model_step_wait's event wait, the lost peer goes unreported.
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

enum { MAXW = 3, B = 6, T = 24, MPR = 4, STEPS_MAX = 3 };

/* steps per run: 2, or 3 with the lever GRAPH (eager, captured, replayed) */
static int STEPS = 2;

static int bucket(void *ctx, float *const *grads, const size_t *n, int k, cudaStream_t s)
{
    return comm_nccl_bucket_start_ranges(ctx, grads, n, k, s);
}

static int bucket_finish(void *ctx, cudaStream_t s)
{
    int rc = comm_nccl_buckets_wait(ctx, s);
    return rc ? rc : comm_nccl_drain(ctx);
}

/* lever GRAPH: the bounded wait after a launch that holds the buckets */
static int bucket_settle(void *ctx, cudaEvent_t done)
{
    return comm_nccl_wait_event(ctx, done);
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
static int rank_main(gpu_ranks *p, int rank, int world, comm_dtype rd, int overlap, int graph, int lose,
                     float *out)
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
        if (comm_create_nccl(&cm, rank, world, rank, rd, gpu_ranks_id_send, gpu_ranks_id_recv, p,
                             lose ? 5000 : 60000) != 0)
            return 13;
        if (gpu_model_set_allreduce(g, whole, cm, g->compute) != 0)
            return 14;
        if (overlap && gpu_model_set_buckets(g, bucket, bucket_finish, cm) != 0)
            return 15;
        if (graph)
            gpu_model_set_bucket_settle(g, bucket_settle);
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
        int skipped = 0, last = s == STEPS - 1;
        if (lose && last && rank == 1)
            _exit(0); /* vanish without a word before the replayed step */
        gpu_model_zero_grad(g);
        if (overlap && world > 1 && !graph)
            gpu_model_reduce_in_next_backward(g); /* as bertd-worker arms its last micro-batch */
        /* graph: two uploads keep every step on the second of the two
         * slots (a graph is per slot), so the steps are eager, captured,
         * replayed */
        if (gpu_model_upload(g, &b, err, sizeof err) != 0 ||
            (graph && gpu_model_upload(g, &b, err, sizeof err) != 0))
            code = 16;
        else if (graph ? gpu_model_train_micro(g, NULL, 1.0f, 1) != 0
                       : gpu_model_forward(g, NULL, 1.0f) != 0 || gpu_model_backward(g) != 0)
            code = 17;
        else if (lose && last) /* the replay's collective waits for the lost peer: bounded */
            code = gpu_model_step_wait(g, NULL, NULL, &skipped) == -EPIPE ? 0 : 22;
        else if ((graph ? gpu_model_step_wait(g, NULL, NULL, &skipped)
                        : gpu_model_step(g, NULL, NULL, &skipped)) != 0 || skipped)
            code = 18;
        else if (gpu_model_get_grads(g, out + (size_t)s * 2 * cpu->num_params) != 0 ||
                 gpu_model_get_params(g, out + ((size_t)s * 2 + 1) * cpu->num_params) != 0)
            code = 19;
    }
#ifdef BERTD_CUDASIM
    /* one NCCL group per bucket (L layers, the rest, the embeddings), or
     * one per step for the single all-reduce; graph: the replayed step
     * makes no NCCL call on the host (the stand-in counts a captured group
     * at its ncclGroupEnd, as the eager one) */
    long groups = cudasim_nccl_groups() - groups0,
         want = world == 1 ? 0 : overlap ? (long)(STEPS - graph) * (c.num_hidden_layers + 2) : STEPS;
    if (code == 0 && groups != want) {
        fprintf(stderr, "rank %d: %ld NCCL groups in %d steps, want %ld\n", rank, groups, STEPS, want);
        code = 20;
    }
#endif
    /* the graph path really taken: step 2 captured, steps 2 and 3 launched */
    if (code == 0 && graph && (g->graph_captures != 1 || g->graph_launches != STEPS - 1)) {
        fprintf(stderr, "rank %d: %ld capture(s), %ld graph launch(es) in %d steps, want 1 and %d\n",
                rank, g->graph_captures, g->graph_launches, STEPS, STEPS - 1);
        code = 21;
    }
    comm_destroy(cm);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
    cuda_kernels_shutdown();
    return code;
}

/* A run's checks: each step's reduced gradient against one rank's on the
 * whole batch (ref), and the replicas bit for bit. */
static void check_run(const char *run, int W, const float *got, const float *ref, size_t n, double tol)
{
    for (int s = 0; s < STEPS; s++) {
        char what[160];
        snprintf(what, sizeof what, "%s, step %d gradient", run, s + 1);
        check_close(what, KDT_F32, got + (size_t)s * 2 * n, ref + (size_t)s * 2 * n, n, tol);
        size_t differ = 0;
        for (int g = 1; g < W; g++)
            differ += memcmp(got + ((size_t)g * STEPS * 2 + s * 2 + 1) * n, got + ((size_t)s * 2 + 1) * n,
                             n * sizeof(float)) != 0;
        printf("%-4s %-44s %zu rank(s) differ from rank 0\n", differ ? "FAIL" : "ok", "replicas bit-identical",
               differ);
        gpu_failures += differ != 0;
    }
}

/* Runs `world` ranks; each one's results land in out + rank * STEPS * 2n. */
static int run_world(int world, comm_dtype rd, int overlap, int graph, int lose, float *out, size_t n)
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
            _exit(rank_main(&p, g, world, rd, overlap, graph, lose, out + (size_t)g * STEPS * 2 * n));
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
    /* lever GRAPH: each bucketed run again with its steps as graphs
     * (gpu_model_train_micro), which must equal the eager run bit for bit */
    unsigned levers = 0;
    char lerr[160];
    if (gpu_levers_from_env(&levers, lerr, sizeof lerr) != 0) {
        printf("FAIL %s\n", lerr);
        return 1;
    }
    int graph = (levers & CUDA_LEVER_GRAPH) != 0;
    STEPS = graph ? 3 : 2;
    bert_config c = gpu_test_config(4, 0);
    bert_model *tmp = NULL;
    if (bert_model_create(&tmp, &c) != 0)
        return 1;
    size_t n = tmp->num_params;
    bert_model_destroy(tmp);
    size_t per = (size_t)MAXW * STEPS_MAX * 2 * n * sizeof(float);
    float *ref = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *got = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *gr = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ref == MAP_FAILED || got == MAP_FAILED || gr == MAP_FAILED)
        return 1;
    if (run_world(1, COMM_FP32, 1, 0, 0, ref, n) != 0)
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
        if (run_world(W, runs[i].rd, runs[i].overlap, 0, 0, got, n) != 0) {
            gpu_failures++;
            continue;
        }
        check_run(runs[i].what, W, got, ref, n, runs[i].tol);
        if (!graph || !runs[i].overlap)
            continue;
        char what[160];
        snprintf(what, sizeof what, "%s, as CUDA graphs", runs[i].what);
        memset(gr, 0, per);
        if (run_world(W, runs[i].rd, 1, 1, 0, gr, n) != 0) {
            gpu_failures++;
            continue;
        }
        check_run(what, W, gr, ref, n, runs[i].tol);
        size_t all = (size_t)W * STEPS * 2 * n, differ = 0;
        for (size_t k = 0; k < all; k++)
            differ += memcmp(gr + k, got + k, sizeof(float)) != 0;
        printf("%-4s %s: = eager bit for bit (%zu of %zu floats differ)\n", differ ? "FAIL" : "ok", what,
               differ, all);
        gpu_failures += differ != 0;
    }
    /* graph: rank 1 gone after the captured step; rank 0's replay must end
     * in -EPIPE after the comm's timeout (5 s here), not hang */
    if (graph && ndev >= 2) {
        int rc = run_world(2, COMM_FP32, 1, 1, 1, gr, n);
        printf("%-4s lost peer during a replayed step: bounded -EPIPE\n", rc ? "FAIL" : "ok");
        gpu_failures += rc != 0;
    }
    printf("%d failure(s)\n", gpu_failures);
    return gpu_failures ? 1 : 0;
}
