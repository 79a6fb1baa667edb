/* gpu_bench — bertd's GPU training step (worker/gpu_model.c, bf16 by
 * default) on bert-base at max_seq_length 128 and 512: the bertd rows of
 * scripts/device-check's benchmark table. The reference, HuggingFace
 * BertForMaskedLM + torch (bf16 autocast, fused AdamW; bench/gpu_hf.py) on
 * the same shape, batch, masked positions and FLOP count, is run beside it
 * by scripts/device-check, one process per row, so that a fault in either
 * costs one row, never the table; this program never starts Python.
 *
 * For each sequence length (--seq picks one) it times full training steps
 * (upload, zero_grad, forward, backward, AdamW) with CUDA events per phase,
 * and prints its row as soon as that row is done: tokens/s, the step-time
 * breakdown, achieved TFLOP/s and MFU against the chip's dense bf16 peak
 * (--peak-tflops, default 989 = H100/H200 SXM datasheet), then one line
 * starting "BENCH gpu_train seq=" for scripts. A later row that crashes or
 * hangs cannot take back a row already printed. --preset runs another model
 * size (bert-tiny: a quick check of this program on the CPU stand-in);
 * device-check's table and its reference are bert-base. --act sets
 * hidden_act (gelu_new: the tanh-GELU model that lever GELU_EPI applies to). The speed levers
 * (BERTD_LEVER_* in the environment, docs/perf.md) are the model's: the
 * BENCH line names the mask it ran with (levers=0x...), so device-check runs
 * this program once more per lever with that lever off.
 *
 * FLOPs per step (step_flops) are the model's useful work: encoder GEMMs and
 * attention on all tokens, MLM head on the masked 15%, x3 for forward +
 * backward; scripts/device-check counts the reference's the same way, so
 * MFU compares like with like even though HF's head computes logits for
 * every token.
 *
 * Every call is checked: a failed row prints "failed" and its reason, and
 * the run exits 1 after the remaining rows; a CUDA error exits 1 at once
 * (the rows before it are out already). Exit 77 only when there is no CUDA
 * device at all; a driver the runtime cannot use (too old, mismatched) is a
 * failure that prints both versions.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/gpu_model.h"
#include "worker/model.h"

#define BCHECK(call)                                                                      \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "gpu_bench: %s: %s\n", #call, cudaGetErrorString(e_));        \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* A gpu_model call that returns 0 or a negative errno; on failure prints
 * the call and the error and leaves through out. */
#define MCHECK(call)                                                                      \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        if (rc_ != 0) {                                                                   \
            fprintf(stderr, "gpu_bench: %s failed: %s (%d)\n", #call, strerror(-rc_), rc_); \
            goto out;                                                                     \
        }                                                                                 \
    } while (0)

typedef struct result {
    double tok_s, step_ms, fwd_ms, bwd_ms, opt_ms, tflops, mfu;
    int ok;
    unsigned levers; // the CUDA_LEVER_* mask the model ran with (BERTD_LEVER_*)
} result;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Training FLOPs of one step (see the file header). */
static double step_flops(const bert_config *c, int B, int T, int M)
{
    double C = c->hidden_size, I = c->intermediate_size, L = c->num_hidden_layers,
           V = c->vocab_size, N = (double)B * T;
    double enc = 2.0 * N * L * (4 * C * C + 2 * C * I); // QKV, proj, FC1, FC2
    double att = 2.0 * 2.0 * (double)B * T * T * C * L;  // QK^T and PV, all heads
    double head = 2.0 * M * (C * C + C * V);             // transform + decoder
    return 3.0 * (enc + att + head);
}

typedef struct batch_buf {
    int32_t *ids, *types, *lens, *pos, *labels;
    bert_batch b;
} batch_buf;

/* Full-length sequences, 15% of positions masked (distinct, spread out). */
static void make_batch(batch_buf *bb, const bert_config *c, int B, int T, int k)
{
    size_t N = (size_t)B * T;
    int M = (int)(0.15 * (double)N);
    bb->ids = malloc(N * 4);
    bb->types = malloc(N * 4);
    bb->lens = malloc((size_t)B * 4);
    bb->pos = malloc((size_t)(M ? M : 1) * 4);
    bb->labels = malloc((size_t)(M ? M : 1) * 4);
    if (!bb->ids || !bb->types || !bb->lens || !bb->pos || !bb->labels)
        abort();
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(k + 1);
    for (size_t i = 0; i < N; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        bb->ids[i] = 1000 + (int32_t)(s % (uint64_t)(c->vocab_size - 1000));
        bb->types[i] = (int32_t)(i % T) >= T / 2;
    }
    for (int b = 0; b < B; b++)
        bb->lens[b] = T;
    /* stride 6 or 7 (about 1 in 6.7) from a per-batch offset: distinct */
    for (int m = 0; m < M; m++) {
        bb->pos[m] = (int32_t)(((size_t)m * N / M + k) % N);
        bb->labels[m] = bb->ids[bb->pos[m]];
    }
    bb->b = (bert_batch){.B = B, .T = T, .M = M, .input_ids = bb->ids,
                         .token_type_ids = bb->types, .seq_lens = bb->lens,
                         .mlm_positions = bb->pos, .mlm_labels = bb->labels};
}

static void free_batch(batch_buf *bb)
{
    free(bb->ids); free(bb->types); free(bb->lens); free(bb->pos); free(bb->labels);
}

static result bench_bertd(const bert_config *c, const float *params, kdtype dt, int B, int T,
                          int warmup, int steps, double peak)
{
    result r = {0};
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    oc.lr = 1e-4f;
    oc.weight_decay = 0.01f;
    oc.total_steps = 100000;
    batch_buf bb[2];
    make_batch(&bb[0], c, B, T, 0);
    make_batch(&bb[1], c, B, T, 1);
    int M = bb[0].b.M;
    gpu_model *g = NULL;
    cudaEvent_t ev[4] = {0};
    char err[512];
    int rc = gpu_model_create(&g, c, dt, 0, B, T, M, &oc, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "gpu_bench: gpu_model_create B=%d T=%d failed (%d): %s\n", B, T, rc, err);
        goto out;
    }
    r.levers = g->levers;
    /* lever GRAPH: each step as one replayed graph (gpu_model_train_micro) */
    int graph = (g->levers & CUDA_LEVER_GRAPH) != 0;
    MCHECK(gpu_model_set_params(g, params));
    for (int i = 0; i < 4; i++)
        BCHECK(cudaEventCreate(&ev[i]));
    double fwd = 0, bwd = 0, opt = 0, t0 = 0;
    if ((rc = gpu_model_upload(g, &bb[0].b, err, sizeof err)) != 0) {
        fprintf(stderr, "gpu_bench: gpu_model_upload failed (%d): %s\n", rc, err);
        goto out;
    }
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) {
            BCHECK(cudaStreamSynchronize(g->compute));
            t0 = now_s();
        }
        bert_dropout d = {.train = 1, .seed = 1, .step = (uint32_t)s};
        BCHECK(cudaEventRecord(ev[0], g->compute));
        gpu_model_zero_grad(g);
        if (graph) {
            /* the whole step is one launch: its time goes in the forward
             * column, backward and optimizer read 0 */
            MCHECK(gpu_model_train_micro(g, &d, gpu_model_loss_scale(g), 1));
            BCHECK(cudaEventRecord(ev[1], g->compute));
            BCHECK(cudaEventRecord(ev[2], g->compute));
            BCHECK(cudaEventRecord(ev[3], g->compute));
            if ((rc = gpu_model_upload(g, &bb[(s + 1) % 2].b, err, sizeof err)) != 0) {
                fprintf(stderr, "gpu_bench: gpu_model_upload failed (%d): %s\n", rc, err);
                goto out;
            }
            int skipped = 0;
            if ((rc = gpu_model_step_wait(g, NULL, NULL, &skipped)) != 0) {
                fprintf(stderr, "gpu_bench: gpu_model_step_wait failed at step %d: %s (%d)\n", s,
                        strerror(-rc), rc);
                goto out;
            }
        } else {
            MCHECK(gpu_model_forward(g, &d, gpu_model_loss_scale(g)));
            BCHECK(cudaGetLastError());
            BCHECK(cudaEventRecord(ev[1], g->compute));
            /* the next batch's copy overlaps this step's compute */
            if ((rc = gpu_model_upload(g, &bb[(s + 1) % 2].b, err, sizeof err)) != 0) {
                fprintf(stderr, "gpu_bench: gpu_model_upload failed (%d): %s\n", rc, err);
                goto out;
            }
            MCHECK(gpu_model_backward(g));
            BCHECK(cudaGetLastError());
            BCHECK(cudaEventRecord(ev[2], g->compute));
            int skipped = 0;
            rc = gpu_model_step(g, NULL, NULL, &skipped);
            if (rc != 0) {
                fprintf(stderr, "gpu_bench: gpu_model_step failed at step %d: %s (%d)%s\n", s,
                        strerror(-rc), rc, rc == -ERANGE ? ": non-finite gradients" : "");
                goto out;
            }
            BCHECK(cudaEventRecord(ev[3], g->compute));
        }
        if (s >= warmup) {
            BCHECK(cudaEventSynchronize(ev[3]));
            float a, b2, c2;
            BCHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
            BCHECK(cudaEventElapsedTime(&b2, ev[1], ev[2]));
            BCHECK(cudaEventElapsedTime(&c2, ev[2], ev[3]));
            fwd += a;
            bwd += b2;
            opt += c2;
        }
    }
    BCHECK(cudaStreamSynchronize(g->compute));
    double wall = now_s() - t0;
    float loss = gpu_model_loss(g);
    r.step_ms = wall * 1e3 / steps;
    r.fwd_ms = fwd / steps;
    r.bwd_ms = bwd / steps;
    r.opt_ms = opt / steps;
    r.tok_s = (double)B * T * steps / wall;
    r.tflops = step_flops(c, B, T, M) / (wall / steps) / 1e12;
    r.mfu = r.tflops / peak;
    r.ok = isfinite(loss);
    fprintf(stderr, "gpu_bench: bertd %s B=%d T=%d: last loss %.4f\n", kdtype_name(dt), B, T, loss);
    if (graph) /* a failed capture falls back to eager: the row then measures that */
        fprintf(stderr, "gpu_bench: lever GRAPH: %ld captures, %ld graph launches%s\n",
                g->graph_captures, g->graph_launches,
                g->graph_off ? " (a capture failed: the other steps ran eagerly)" : "");
    if (!r.ok)
        fprintf(stderr, "gpu_bench: bertd %s B=%d T=%d: loss is not finite\n", kdtype_name(dt), B, T);
out:
    for (int i = 0; i < 4; i++)
        if (ev[i])
            BCHECK(cudaEventDestroy(ev[i]));
    gpu_model_destroy(g);
    free_batch(&bb[0]);
    free_batch(&bb[1]);
    return r;
}

/* HF _init_weights' distribution (N(0, 0.02) matrices, LayerNorm 1, biases
 * 0) from a fast xorshift + Box-Muller: bert_model_init_weights' Philox draw
 * is exact but takes seconds per 100M parameters on one core. */
static void quick_init(bert_model *m)
{
    float **p = (float **)&m->params;
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
        int ln = i == BP_EMB_LNW || i == BP_LN1W || i == BP_LN2W || i == BP_HEAD_LNW;
        for (size_t k = 0; k < m->param_sizes[i]; k++) {
            float v = ln ? 1.0f : 0.0f;
            if (bert_param_decays(i)) {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                double u1 = ((double)(s >> 11) + 1.0) / 9007199254740993.0;
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                double u2 = (double)(s >> 11) / 9007199254740992.0;
                v = (float)(m->cfg.initializer_range * sqrt(-2.0 * log(u1)) *
                            cos(6.283185307179586 * u2));
            }
            p[i][k] = v;
        }
    }
}

/* Prints one finished row, for a person and for scripts, and flushes it:
 * whatever happens to the rows after it, this one is out. */
static void row(int T, int B, const char *preset, kdtype dt, const char *device, double peak,
                const result *r)
{
    char name[40];
    snprintf(name, sizeof name, "bertd %s", kdtype_name(dt));
    if (r->ok)
        printf("%5d %5d %-16s %12.0f %9.2f %8.2f %8.2f %8.2f %8.1f %6.1f%%\n", T, B, name, r->tok_s,
               r->step_ms, r->fwd_ms, r->bwd_ms, r->opt_ms, r->tflops, 100.0 * r->mfu);
    else
        printf("%5d %5d %-16s %12s\n", T, B, name, "failed");
    printf("BENCH gpu_train seq=%d batch=%d impl=bertd preset=%s precision=%s device=\"%s\" "
           "peak_tflops=%.0f levers=0x%x status=%s",
           T, B, preset, kdtype_name(dt), device, peak, r->levers, r->ok ? "ok" : "failed");
    if (r->ok)
        printf(" tok_s=%.0f step_ms=%.3f fwd_ms=%.3f bwd_ms=%.3f opt_ms=%.3f tflops=%.2f mfu=%.4f",
               r->tok_s, r->step_ms, r->fwd_ms, r->bwd_ms, r->opt_ms, r->tflops, r->mfu);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *prec = "auto", *preset = "bert-base", *act = "gelu";
    double peak = 989.0;
    int b128 = 128, b512 = 32, steps = 20, warmup = 5, only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--precision") && i + 1 < argc) prec = argv[++i];
        else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc) peak = atof(argv[++i]);
        else if (!strcmp(argv[i], "--batch128") && i + 1 < argc) b128 = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch512") && i + 1 < argc) b512 = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "--act") && i + 1 < argc) act = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--seq 128|512] [--precision auto|bf16|fp16|fp32] "
                    "[--batch128 N] [--batch512 N] [--steps N] [--warmup N] [--peak-tflops X] "
                    "[--preset NAME] [--act gelu|gelu_new|gelu_pytorch_tanh]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0 || b128 < 1 || b512 < 1 || !(peak > 0)) {
        fprintf(stderr, "gpu_bench: steps, batches and peak must be positive\n");
        return 2;
    }
    if (only != 0 && only != 128 && only != 512) {
        fprintf(stderr, "gpu_bench: --seq %d: the rows are 128 and 512\n", only);
        return 2;
    }
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n < 1) {
        int drv = 0, rt = 0;
        cudaDriverGetVersion(&drv); /* 0: no driver installed */
        cudaRuntimeGetVersion(&rt);
        /* no device, or no driver at all: nothing to run on (77). A driver
         * that is there but unusable (too old for this runtime, mismatched
         * kernel module) is a failure. */
        bool no_driver = ce == cudaErrorInsufficientDriver && drv == 0;
        bool none = ce == cudaSuccess || ce == cudaErrorNoDevice || no_driver;
        const char *why = ce == cudaSuccess ? "0 devices"
                          : no_driver       ? "no NVIDIA driver installed"
                                            : cudaGetErrorString(ce);
        fprintf(stderr, "gpu_bench: %s: cudaGetDeviceCount: %s (driver %d.%d, runtime %d.%d)\n",
                none ? "no CUDA device" : "CUDA is unusable", why, drv / 1000, drv % 1000 / 10,
                rt / 1000, rt % 1000 / 10);
        return none ? 77 : 1;
    }
    struct cudaDeviceProp prop;
    BCHECK(cudaGetDeviceProperties(&prop, 0));
    kdtype dt;
    char err[256];
    if (gpu_precision_pick(prec, 0, &dt, err, sizeof err) != 0) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 2;
    }
    bert_config c;
    if (bert_config_preset(&c, preset) != 0) {
        fprintf(stderr, "gpu_bench: --preset %s: not a model preset (bert-base, bert-tiny, ...)\n", preset);
        return 2;
    }
    c.act = bert_act_parse(act);
    if (c.act < 0) {
        fprintf(stderr, "gpu_bench: --act %s: only %s\n", act, BERT_ACT_SUPPORTED);
        return 2;
    }
    bert_model *host = NULL;
    int rc = bert_model_create(&host, &c);
    if (rc != 0) {
        fprintf(stderr, "gpu_bench: bert_model_create failed: %s (%d)\n", strerror(-rc), rc);
        return 1;
    }
    quick_init(host);
    printf("gpu_bench: %s (%zu params, hidden_act %s), %s on %s (sm_%d%d), peak %.0f TFLOP/s dense bf16\n"
           "(reference: bench/gpu_hf.py on the same shapes, run beside this program by "
           "scripts/device-check)\n",
           preset, host->num_params, act, kdtype_name(dt), prop.name, prop.major, prop.minor, peak);
    printf("\n%5s %5s %-16s %12s %9s %8s %8s %8s %8s %7s\n", "seq", "batch", "implementation",
           "tokens/s", "step ms", "fwd ms", "bwd ms", "opt ms", "TFLOP/s", "MFU");
    fflush(stdout);

    int Ts[2] = {128, 512}, Bs[2] = {b128, b512}, failed = 0;
    for (int k = 0; k < 2; k++) {
        if (only && Ts[k] != only)
            continue;
        result r = bench_bertd(&c, host->params_memory, dt, Bs[k], Ts[k], warmup, steps, peak);
        row(Ts[k], Bs[k], preset, dt, prop.name, peak, &r);
        if (!r.ok) {
            fprintf(stderr, "gpu_bench: FAILED at seq %d\n", Ts[k]);
            failed = 1;
        }
    }
    printf("(MFU = model FLOPs / step time / %.0f TFLOP/s)\n", peak);
    bert_model_destroy(host);
    cuda_kernels_shutdown(); /* this thread's cuBLAS(Lt) workspaces: nothing left on the device */
    return failed;
}
