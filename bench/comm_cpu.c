/* bench_comm_cpu — the shm allreduce (worker/comm.c) on a bert-mini-sized
 * gradient buffer, against plain memcpy measured in the same run, and CPU
 * data-parallel training throughput of bert-mini with 1 and 2 worker
 * processes.
 *
 * References. The shm allreduce moves, per rank, one copy in (n floats), a
 * reduce of its 1/G share over G slabs, and one copy out (n floats): about
 * three memcpy's of the buffer when every rank runs at once. So the roofline
 * is "G processes each doing 3 memcpy's of n floats concurrently", timed
 * here too, and the table reports allreduce time as a multiple of it.
 *
 * Training: the training loop (worker/train.c) is not merged yet, so the
 * scaling rows drive model.h/optim.h directly with the calls that loop
 * makes (forward, backward, comm_allreduce_mean of the gradient span,
 * optim_step), 1 process x T threads vs G processes x T/G threads, equal
 * per-process batch (weak scaling, as DDP is used).
 *
 * Allreduce and memcpy figures are medians over iterations (per rank; the
 * slowest rank's median is reported). Prints a table and one line starting
 * "BENCH comm_cpu" for scripts.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "worker/comm.h"
#include "worker/model.h"
#include "worker/optim.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct opts {
    int world;
    size_t floats;      /* 0 = bert-mini parameter count */
    size_t chunk;       /* max_floats of the comm group */
    int iters;
    int train_steps;    /* 0 = skip the training rows */
    int batch, seq;
    int threads;        /* total cores to use */
} opts;

/* per-rank results written by the children */
typedef struct shared_out {
    double allreduce_s[64];
    double memcpy3_s[64];
    double train_s[64];
    int rc[64];
} shared_out;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void fill(float *x, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 2654435761u + (unsigned)rank * 40503u) % 1000u) * 1e-3f + 0.5f;
}

static int rank_allreduce(const opts *o, const char *name, int rank, shared_out *out)
{
    comm *c = NULL;
    int rc = comm_create_shm(&c, name, rank, o->world, o->chunk, 60000);
    if (rc != 0)
        return 1;
    float *buf = malloc(o->floats * sizeof(float));
    float *dst = malloc(o->floats * sizeof(float));
    if (!buf || !dst)
        return 2;
    fill(buf, o->floats, rank);
    fill(dst, o->floats, rank + 1);
    /* warm up: fault in the buffers and the segment */
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = comm_allreduce_mean(c, buf, o->floats);
    if (rc == 0)
        rc = comm_barrier(c);
    /* per-iteration times, median reported: the VM is shared, and a
     * preempted iteration should not decide the figure */
    double *t = calloc((size_t)o->iters, sizeof(double));
    if (!t)
        return 2;
    for (int i = 0; i < o->iters && rc == 0; i++) {
        double t0 = now_s();
        rc = comm_allreduce_mean(c, buf, o->floats);
        t[i] = now_s() - t0;
    }
    out->allreduce_s[rank] = median(t, o->iters);
    /* the roofline: 3 memcpy's of the buffer per iteration, all ranks at once */
    for (int i = 0; i < o->iters && rc == 0; i++) {
        rc = comm_barrier(c);
        double t0 = now_s();
        memcpy(dst, buf, o->floats * sizeof(float));
        memcpy(buf, dst, o->floats * sizeof(float));
        memcpy(dst, buf, o->floats * sizeof(float));
        __asm__ volatile("" ::"r"(dst) : "memory");
        t[i] = now_s() - t0;
    }
    out->memcpy3_s[rank] = median(t, o->iters);
    if (rc == 0)
        rc = comm_barrier(c);
    free(t);
    free(buf);
    free(dst);
    comm_destroy(c);
    return rc == 0 ? 0 : 3;
}

/* Random MLM batch: 15% of positions masked (at least one per sequence). */
static void make_batch(bert_batch *b, int32_t *ids, int32_t *tt, int32_t *lens, int32_t *pos, int32_t *lab,
                       int B, int T, int V, int step, int rank)
{
    int M = 0;
    uint64_t h = (uint64_t)step * 7919u + (uint64_t)rank * 104729u + 1;
    for (int s = 0; s < B; s++) {
        lens[s] = T;
        for (int t = 0; t < T; t++) {
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            ids[s * T + t] = 1000 + (int32_t)((h >> 33) % (uint64_t)(V - 1000));
            tt[s * T + t] = t < T / 2 ? 0 : 1;
            if (t % 7 == 3) {
                pos[M] = s * T + t;
                lab[M++] = 1000 + (int32_t)((h >> 17) % (uint64_t)(V - 1000));
            }
        }
    }
    *b = (bert_batch){.B = B, .T = T, .M = M, .input_ids = ids, .token_type_ids = tt, .seq_lens = lens,
                      .mlm_positions = pos, .mlm_labels = lab, .nsp_labels = NULL};
}

/* One training process: steps of batch x seq; world 1 runs without comm. */
static int rank_train(const opts *o, const char *name, int rank, int world, int threads, shared_out *out)
{
    bert_set_threads(threads);
    bert_config cfg;
    bert_model *m = NULL;
    optim *op = NULL;
    comm *c = NULL;
    if (bert_config_preset(&cfg, "bert-mini") != 0 || bert_model_create(&m, &cfg) != 0)
        return 1;
    bert_model_init_weights(m, 42);
    int nseg = bert_param_segments(&cfg, NULL, NULL, 0);
    size_t *sizes = calloc((size_t)nseg, sizeof(*sizes));
    int *decays = calloc((size_t)nseg, sizeof(*decays));
    bert_param_segments(&cfg, sizes, decays, nseg);
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    oc.total_steps = 1000;
    if (optim_create(&op, &oc, sizes, decays, nseg) != 0)
        return 2;
    if (world > 1 && comm_create_shm(&c, name, rank, world, o->chunk, 60000) != 0)
        return 3;
    size_t bt = (size_t)o->batch * o->seq;
    int32_t *ids = malloc(bt * 4), *tt = malloc(bt * 4), *pos = malloc(bt * 4), *lab = malloc(bt * 4);
    int32_t *lens = malloc((size_t)o->batch * 4);
    bert_batch b;
    int rc = 0;
    double t0 = 0;
    for (int s = 0; s < o->train_steps + 1 && rc == 0; s++) {
        if (s == 1) { /* step 0 is warm-up */
            if (c)
                rc = comm_barrier(c);
            t0 = now_s();
        }
        make_batch(&b, ids, tt, lens, pos, lab, o->batch, o->seq, cfg.vocab_size, s, rank);
        bert_model_zero_grad(m);
        rc = bert_model_forward(m, &b, NULL);
        if (rc == 0)
            rc = bert_model_backward(m, 1.0f);
        if (rc == 0 && c)
            rc = comm_allreduce_mean(c, m->grads_memory, m->num_params);
        double lr, gn;
        if (rc == 0)
            rc = optim_step(op, m->params_memory, m->grads_memory, &lr, &gn);
    }
    out->train_s[rank] = (now_s() - t0) / o->train_steps;
    comm_destroy(c);
    free(ids), free(tt), free(pos), free(lab), free(lens);
    optim_destroy(op);
    free(sizes), free(decays);
    bert_model_destroy(m);
    return rc == 0 ? 0 : 4;
}

static int run_group(int world, shared_out *out, int (*fn)(int rank, void *), void *arg)
{
    pid_t pids[64];
    for (int g = 0; g < world; g++) {
        pids[g] = fork();
        if (pids[g] < 0)
            return -errno;
        if (pids[g] == 0)
            _exit(fn(g, arg));
    }
    int bad = 0;
    for (int g = 0; g < world; g++) {
        int st;
        waitpid(pids[g], &st, 0);
        out->rc[g] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        bad |= out->rc[g] != 0;
    }
    return bad ? -EIO : 0;
}

typedef struct job {
    const opts *o;
    char name[COMM_NAME_MAX];
    shared_out *out;
    int world, threads;
} job;

static int job_allreduce(int rank, void *arg)
{
    job *j = arg;
    return rank_allreduce(j->o, j->name, rank, j->out);
}

static int job_train(int rank, void *arg)
{
    job *j = arg;
    return rank_train(j->o, j->name, rank, j->world, j->threads, j->out);
}

static double maxv(const double *v, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

int main(int argc, char **argv)
{
    opts o = {.world = 2, .floats = 0, .chunk = COMM_DEFAULT_MAX_FLOATS, .iters = 20, .train_steps = 4,
              .batch = 8, .seq = 128,
              .threads = (int)sysconf(_SC_NPROCESSORS_ONLN)};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--world"))
            o.world = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--floats"))
            o.floats = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--chunk"))
            o.chunk = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--iters"))
            o.iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--train-steps"))
            o.train_steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            o.batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            o.threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--world G] [--floats N] [--chunk F] [--iters R] [--train-steps S]"
                            " [--batch B] [--threads T]\n", argv[0]);
            return 2;
        }
    }
    if (o.world < 2 || o.world > 64 || o.iters < 1 || o.chunk == 0 || o.batch < 1 || o.threads < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    bert_config mini;
    bert_config_preset(&mini, "bert-mini");
    size_t sizes[BERT_NUM_PARAM_TENSORS], np = 0;
    bert_param_sizes(&mini, sizes);
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
        np += sizes[i];
    if (o.floats == 0)
        o.floats = np;

    shared_out *out = mmap(NULL, sizeof(*out), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED)
        return 1;
    job j = {.o = &o, .out = out, .world = o.world};
    snprintf(j.name, sizeof(j.name), "/bertd-bench-%d-comm", (int)getpid());
    printf("shm allreduce: world %d, %zu floats (%.1f MB; bert-mini has %zu parameters), chunk %zu floats,"
           " %d iterations, %ld online CPUs\n\n",
           o.world, o.floats, o.floats * 4.0 / 1e6, np, o.chunk, o.iters, sysconf(_SC_NPROCESSORS_ONLN));
    if (run_group(o.world, out, job_allreduce, &j) != 0) {
        fprintf(stderr, "allreduce run failed\n");
        return 1;
    }
    double ar = maxv(out->allreduce_s, o.world), mc3 = maxv(out->memcpy3_s, o.world);
    double bytes = o.floats * 4.0;
    double algbw = bytes / ar / 1e9;
    double busbw = algbw * 2.0 * (o.world - 1) / o.world;
    double mcbw = bytes / (mc3 / 3.0) / 1e9;
    printf("%-40s %12s %12s\n", "path (median)", "ms/op", "GB/s");
    printf("%-40s %12.2f %12.2f  (algbw; busbw %.2f)\n", "comm_allreduce_mean", ar * 1e3, algbw, busbw);
    printf("%-40s %12.2f %12.2f  (per memcpy, %d procs at once)\n", "reference: 3 x memcpy per rank", mc3 * 1e3,
           mcbw, o.world);
    printf("allreduce / 3-memcpy roofline: %.2fx\n\n", ar / mc3);

    double t1 = 0, tg = 0;
    if (o.train_steps > 0) {
        int per = o.threads / o.world > 0 ? o.threads / o.world : 1;
        printf("bert-mini training (AdamW, batch %d x seq %d per process, %d timed steps after 1 warm-up)\n",
               o.batch, o.seq, o.train_steps);
        j.world = 1;
        j.threads = o.threads;
        if (run_group(1, out, job_train, &j) != 0) {
            fprintf(stderr, "training (1 process) failed\n");
            return 1;
        }
        t1 = out->train_s[0];
        snprintf(j.name, sizeof(j.name), "/bertd-bench-%d-train", (int)getpid());
        j.world = o.world;
        j.threads = per;
        if (run_group(o.world, out, job_train, &j) != 0) {
            fprintf(stderr, "training (%d processes) failed\n", o.world);
            return 1;
        }
        tg = maxv(out->train_s, o.world);
        double tok = (double)o.batch * o.seq;
        printf("%-40s %12s %12s %10s\n", "workers", "s/step", "tokens/s", "scaling");
        printf("%-40s %12.3f %12.0f %10s\n", "1 process", t1, tok / t1, "1.00x");
        char label[64];
        snprintf(label, sizeof(label), "%d processes x %d threads + allreduce", o.world, per);
        printf("%-40s %12.3f %12.0f %9.2fx\n", label, tg, tok * o.world / tg, (tok * o.world / tg) / (tok / t1));
        printf("(1 process uses %d threads; the allreduce is %.1f%% of a %d-process step)\n\n", o.threads,
               100.0 * ar / tg, o.world);
    }
    printf("BENCH comm_cpu world=%d floats=%zu chunk=%zu allreduce_ms=%.3f algbw_gbs=%.3f busbw_gbs=%.3f"
           " memcpy3_ms=%.3f ratio_vs_memcpy3=%.3f",
           o.world, o.floats, o.chunk, ar * 1e3, algbw, busbw, mc3 * 1e3, ar / mc3);
    if (o.train_steps > 0)
        printf(" train_s_1=%.4f train_s_%d=%.4f scaling=%.3f", t1, o.world, tg, t1 * o.world / tg);
    printf("\n");
    munmap(out, sizeof(*out));
    return 0;
}
