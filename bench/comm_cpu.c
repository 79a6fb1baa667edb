/* bench_comm_cpu — the shm allreduce (worker/comm.c) and the net backend's
 * (worker/comm_net.cc: Gloo TCP over loopback, the same fixed-order
 * reduce-scatter + all-gather) on a bert-mini-sized gradient buffer, against
 * plain memcpy measured in the same run, and CPU data-parallel training
 * throughput of bert-mini with 1 and 2 worker processes (shm).
 *
 * References. The shm allreduce moves, per rank, one copy in (n floats), a
 * reduce of its 1/G share over G slabs, and one copy out (n floats): about
 * three memcpy's of the buffer when every rank runs at once. So the roofline
 * is "G processes each doing 3 memcpy's of n floats concurrently", timed
 * here too, and the table reports allreduce time as a multiple of it.
 *
 * Training: the host trainer stepped as the training loop's CPU device steps
 * it (dropout on, AdamW, comm_allreduce_mean of the gradients and the loss on
 * the shm comm): 1 process x 1 thread (the baseline),
 * 1 process x T threads (what one process gets out of all cores), and G
 * processes x T/G threads, equal per-process batch (weak scaling, as DDP is
 * used).
 *
 * Allreduce and memcpy figures are medians over iterations (per rank; the
 * slowest rank's median is reported). Prints a table and one line starting
 * "BENCH comm_cpu" for scripts.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "worker/comm.h"
#include "worker/model.h"
#include "worker/optim.h"
#include "worker/train.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
    int rounds;         /* alternating repetitions of the training rows */
} opts;

/* per-rank results written by the children */
typedef struct shared_out {
    double allreduce_s[64];
    double memcpy3_s[64];
    double train_s[64];
    double train_cpu_s[64];     /* CPU seconds per step of the process (all its threads) */
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

/* The net backend's rendezvous: one file per key in a directory. */
static int dir_set(void *ctx, const char *key, const void *val, size_t len)
{
    char tmp[512], path[512];
    snprintf(tmp, sizeof tmp, "%s/.%s.%d", (const char *)ctx, key, (int)getpid());
    snprintf(path, sizeof path, "%s/%s", (const char *)ctx, key);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return -errno;
    size_t w = fwrite(val, 1, len, f);
    if (fclose(f) != 0 || w != len)
        return -EIO;
    return rename(tmp, path) == 0 ? 0 : -errno;
}

static int dir_get(void *ctx, const char *key, void *val, size_t cap, size_t *len, int timeout_ms)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", (const char *)ctx, key);
    for (int waited = 0;; waited += 2) {
        FILE *f = fopen(path, "rb");
        if (f) {
            *len = fread(val, 1, cap, f);
            fclose(f);
            return 0;
        }
        if (waited >= timeout_ms)
            return -ETIMEDOUT;
        usleep(2000);
    }
}

/* net: the rendezvous directory (the net backend), or NULL (shm). */
static int rank_allreduce(const opts *o, const char *name, const char *net, int rank, shared_out *out)
{
    comm *c = NULL;
    comm_kv kv = {.ctx = (void *)net, .set = dir_set, .get = dir_get};
    comm_net_opts no = {.bind_addr = "127.0.0.1", .timeout_ms = 60000};
    int rc = net ? comm_create_net(&c, rank, o->world, &kv, &no)
                 : comm_create_shm(&c, name, rank, o->world, o->chunk, 60000);
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

/* One training process: steps of batch x seq as worker/device_cpu.c takes
 * them (the shm allreduce of gradients and loss); world 1 runs without comm. */
static int rank_train(const opts *o, const char *name, int rank, int world, int threads, shared_out *out)
{
    train_config tc = {0};
    comm *c = NULL;
    trainer *t = NULL;
    char err[256] = "";
    if (bert_config_preset(&tc.model, "bert-mini") != 0)
        return 1;
    optim_config_default(&tc.optim, OPTIM_ADAMW);
    tc.optim.total_steps = 1000;
    tc.seed = 42;
    tc.rank = (uint32_t)rank;
    tc.threads = threads;
    if (world > 1 && comm_create_shm(&c, name, rank, world, o->chunk, 60000) != 0)
        return 3;
    if (trainer_create(&t, &tc, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 2;
    }
    size_t bt = (size_t)o->batch * o->seq;
    int32_t *ids = malloc(bt * 4), *tt = malloc(bt * 4), *pos = malloc(bt * 4), *lab = malloc(bt * 4);
    int32_t *lens = malloc((size_t)o->batch * 4);
    double *ts = calloc((size_t)o->train_steps + 1, sizeof(double));
    double *cs = calloc((size_t)o->train_steps + 1, sizeof(double));
    if (!ids || !tt || !pos || !lab || !lens || !ts || !cs)
        return 2;
    bert_batch b;
    int rc = 0;
    for (int s = 0; s < o->train_steps + 1 && rc == 0; s++) {
        /* ranks start each step together, so a step's time is the slowest
         * rank's compute plus the allreduce; step 0 is warm-up */
        if (c)
            rc = comm_barrier(c);
        double t0 = now_s(), c0 = cpu_s();
        make_batch(&b, ids, tt, lens, pos, lab, o->batch, o->seq, tc.model.vocab_size, s, rank);
        bert_model *m = t->model;
        double loss = 0, lr, gn;
        bert_model_zero_grad(m);
        if (rc == 0)
            rc = trainer_micro(t, &b, 0, 1, &loss, err, sizeof(err));
        if (rc == 0 && c)
            rc = comm_allreduce_mean(c, m->grads_memory, m->num_params);
        if (rc == 0 && c)
            rc = comm_allreduce_sum_f64(c, &loss, 1);
        if (rc == 0)
            rc = optim_step(t->opt, m->params_memory, m->grads_memory, &lr, &gn);
        t->step++;
        ts[s] = now_s() - t0;
        cs[s] = cpu_s() - c0;
    }
    if (rc != 0)
        fprintf(stderr, "rank %d: %s\n", rank, err);
    out->train_s[rank] = median(ts + 1, o->train_steps);
    out->train_cpu_s[rank] = median(cs + 1, o->train_steps);
    free(ts);
    free(cs);
    free(ids), free(tt), free(pos), free(lab), free(lens);
    trainer_destroy(t);
    comm_destroy(c);
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
    const char *net;            /* allreduce: the net backend's rendezvous directory, or NULL */
    shared_out *out;
    int world, threads;
} job;

static int job_allreduce(int rank, void *arg)
{
    job *j = arg;
    return rank_allreduce(j->o, j->name, j->net, rank, j->out);
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
              .threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .rounds = 2};
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
        else if (!strcmp(argv[i], "--rounds"))
            o.rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--world G] [--floats N] [--chunk F] [--iters R] [--train-steps S]"
                            " [--batch B] [--threads T] [--rounds N]\n", argv[0]);
            return 2;
        }
    }
    if (o.world < 2 || o.world > 64 || o.iters < 1 || o.chunk == 0 || o.batch < 1 || o.threads < 1 || o.rounds < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a net rank writing to a dead peer gets EPIPE, not killed */
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
    printf("shm and net allreduce: world %d, %zu floats (%.1f MB; bert-mini has %zu parameters), chunk %zu floats,"
           " %d iterations, %ld online CPUs\n\n",
           o.world, o.floats, o.floats * 4.0 / 1e6, np, o.chunk, o.iters, sysconf(_SC_NPROCESSORS_ONLN));
    if (run_group(o.world, out, job_allreduce, &j) != 0) {
        fprintf(stderr, "allreduce run failed\n");
        return 1;
    }
    double ar = maxv(out->allreduce_s, o.world), mc3 = maxv(out->memcpy3_s, o.world);
    /* the net backend on the same sizes, ranks over loopback TCP */
    double net_ar = -1, net_algbw = 0;
    if (comm_net_available()) {
        char dir[128];
        snprintf(dir, sizeof dir, "/tmp/bertd-bench-comm-%d", (int)getpid());
        if (mkdir(dir, 0700) != 0) {
            perror(dir);
            return 1;
        }
        j.net = dir;
        int bad = run_group(o.world, out, job_allreduce, &j);
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
        j.net = NULL;
        if (bad != 0) {
            fprintf(stderr, "net allreduce run failed\n");
            return 1;
        }
        net_ar = maxv(out->allreduce_s, o.world);
    }
    double bytes = o.floats * 4.0;
    double algbw = bytes / ar / 1e9;
    double busbw = algbw * 2.0 * (o.world - 1) / o.world;
    double mcbw = bytes / (mc3 / 3.0) / 1e9;
    printf("%-40s %12s %12s\n", "path (median)", "ms/op", "GB/s");
    printf("%-40s %12.2f %12.2f  (algbw; busbw %.2f)\n", "comm_allreduce_mean (shm)", ar * 1e3, algbw, busbw);
    if (net_ar > 0) {
        net_algbw = bytes / net_ar / 1e9;
        printf("%-40s %12.2f %12.2f  (algbw; busbw %.2f; %.2fx shm)\n", "comm_allreduce_mean (net, loopback)",
               net_ar * 1e3, net_algbw, net_algbw * 2.0 * (o.world - 1) / o.world, net_ar / ar);
    } else {
        printf("%-40s %12s  (built without libgloo-dev)\n", "comm_allreduce_mean (net)", "-");
    }
    printf("%-40s %12.2f %12.2f  (per memcpy, %d procs at once)\n", "reference: 3 x memcpy per rank", mc3 * 1e3,
           mcbw, o.world);
    printf("allreduce / 3-memcpy roofline: shm %.2fx", ar / mc3);
    if (net_ar > 0)
        printf(", net %.2fx", net_ar / mc3);
    printf("\n\n");

    /* Three configurations, in alternating rounds (the VM is shared and its
     * load drifts); each reports the per-step median, best round kept. */
    double t11 = 1e30, t12 = 1e30, tg = 1e30;
    double c11 = 1e30, cg = 1e30; /* CPU seconds per step, all processes together */
    int per = o.threads / o.world > 0 ? o.threads / o.world : 1;
    if (o.train_steps > 0) {
        printf("bert-mini trainer_step (AdamW, dropout 0.1, batch %d x seq %d per process,\n"
               "per-step median of %d steps after 1 warm-up, best of %d rounds)\n",
               o.batch, o.seq, o.train_steps, o.rounds);
        for (int r = 0; r < o.rounds; r++) {
            j.world = 1;
            j.threads = 1;
            if (run_group(1, out, job_train, &j) != 0)
                goto train_failed;
            t11 = out->train_s[0] < t11 ? out->train_s[0] : t11;
            c11 = out->train_cpu_s[0] < c11 ? out->train_cpu_s[0] : c11;
            if (o.threads > 1) {
                j.threads = o.threads;
                if (run_group(1, out, job_train, &j) != 0)
                    goto train_failed;
                t12 = out->train_s[0] < t12 ? out->train_s[0] : t12;
            }
            snprintf(j.name, sizeof(j.name), "/bertd-bench-%d-train%d", (int)getpid(), r);
            j.world = o.world;
            j.threads = per;
            if (run_group(o.world, out, job_train, &j) != 0)
                goto train_failed;
            double t = maxv(out->train_s, o.world), cpu = 0;
            for (int g = 0; g < o.world; g++)
                cpu += out->train_cpu_s[g];
            tg = t < tg ? t : tg;
            cg = cpu < cg ? cpu : cg;
        }
        double tok = (double)o.batch * o.seq;
        printf("%-44s %10s %10s %12s\n", "workers", "s/step", "tokens/s", "vs 1x1");
        printf("%-44s %10.3f %10.0f %11.2fx\n", "1 process x 1 thread", t11, tok / t11, 1.0);
        if (o.threads > 1)
            printf("%-44s %10.3f %10.0f %11.2fx\n", "1 process x all threads (reference)", t12, tok / t12,
                   t11 / t12);
        char label[64];
        snprintf(label, sizeof(label), "%d processes x %d thread(s) + allreduce", o.world, per);
        printf("%-44s %10.3f %10.0f %11.2fx\n", label, tg, tok * o.world / tg, t11 * o.world / tg);
        printf("(the shm allreduce above is %.1f%% of a %d-process step)\n", 100.0 * ar / tg, o.world);
        /* CPU time is what contention on a shared machine disturbs least:
         * tokens per CPU-second, G processes vs 1, is the parallel
         * efficiency the sync costs (1.00 = free) */
        printf("CPU seconds per step: 1x1 %.3f, %d processes %.3f in total -> efficiency %.3f\n\n", c11, o.world,
               cg, c11 * o.world / cg);
    }
    printf("BENCH comm_cpu world=%d floats=%zu chunk=%zu allreduce_ms=%.3f algbw_gbs=%.3f busbw_gbs=%.3f"
           " memcpy3_ms=%.3f ratio_vs_memcpy3=%.3f",
           o.world, o.floats, o.chunk, ar * 1e3, algbw, busbw, mc3 * 1e3, ar / mc3);
    if (net_ar > 0)
        printf(" net_allreduce_ms=%.3f net_algbw_gbs=%.3f net_ratio_vs_shm=%.3f net_ratio_vs_memcpy3=%.3f",
               net_ar * 1e3, net_algbw, net_ar / ar, net_ar / mc3);
    if (o.train_steps > 0)
        printf(" train_s_1x1=%.4f train_s_1x%d=%.4f train_s_%dx%d=%.4f scaling_vs_1x1=%.3f"
               " cpu_efficiency=%.3f", t11, o.threads,
               o.threads > 1 ? t12 : t11, o.world, per, tg, t11 * o.world / tg, c11 * o.world / cg);
    printf("\n");
    munmap(out, sizeof(*out));
    return 0;
train_failed:
    fprintf(stderr, "training run failed\n");
    return 1;
}
