/* bench_train_step — times bertd's CPU training step (forward, backward,
 * AdamW with clipping) on random token batches with ~15% masked positions.
 * Prints "bertd_steps_ms <t1> ... <tSTEPS>" (wall), "bertd_cpu_ms ..." (process
 * CPU time, all threads) then "masked <M> loss <x>" for
 * train_step_vs_torch.py,
 * which runs PyTorch on the same config in the same run and makes the table.
 * Usage: bench_train_step PRESET B T THREADS STEPS */
#include "worker/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s PRESET B T THREADS STEPS\n", argv[0]);
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]), threads = atoi(argv[4]), steps = atoi(argv[5]);
    train_config tc = {0};
    if (bert_config_preset(&tc.model, argv[1]) < 0 || B < 1 || T < 2 || steps < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    optim_config_default(&tc.optim, OPTIM_ADAMW);
    tc.optim.lr = 1e-4f;
    tc.optim.weight_decay = 0.01f;
    tc.optim.warmup_steps = 10;
    tc.optim.total_steps = 1000;
    tc.seed = 42;
    tc.threads = threads;
    char err[256];
    trainer *t = NULL;
    if (trainer_create(&t, &tc, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int V = tc.model.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * B * T), *tt = calloc((size_t)B * T, sizeof(int32_t)),
            *lens = malloc(sizeof(int32_t) * B), *pos = malloc(sizeof(int32_t) * B * T),
            *lab = malloc(sizeof(int32_t) * B * T);
    uint64_t rng = 88172645463325252ull;
    int M = 0;
    for (int b = 0; b < B; b++) {
        lens[b] = T; // packed sequences, as the loader produces
        for (int i = 0; i < T; i++) {
            ids[b * T + i] = 1000 + (int)(xs(&rng) % (uint64_t)(V - 1000));
            if (i > 0 && xs(&rng) % 100 < 15) {
                pos[M] = b * T + i;
                lab[M++] = ids[b * T + i];
                ids[b * T + i] = 103;
            }
        }
    }
    bert_batch batch = {.B = B, .T = T, .M = M, .input_ids = ids, .token_type_ids = tt,
                        .seq_lens = lens, .mlm_positions = pos, .mlm_labels = lab};
    double *ms = malloc(sizeof(double) * steps), *cpu = malloc(sizeof(double) * steps);
    double loss = 0, lr, gnorm;
    for (int s = -2; s < steps; s++) { // two warm-up steps
        struct timespec a, b2, ca, cb;
        clock_gettime(CLOCK_MONOTONIC, &a);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
        /* one step as the CPU device of the training loop takes it (worker/device_cpu.c) */
        loss = 0;
        bert_model_zero_grad(t->model);
        if (trainer_micro(t, &batch, 0, 1, &loss, err, sizeof err) < 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        if (optim_step(t->opt, t->model->params_memory, t->model->grads_memory, &lr, &gnorm) < 0) {
            fprintf(stderr, "gradient norm is not finite\n");
            return 1;
        }
        t->step++;
        clock_gettime(CLOCK_MONOTONIC, &b2);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
        if (s >= 0) {
            ms[s] = (b2.tv_sec - a.tv_sec) * 1e3 + (b2.tv_nsec - a.tv_nsec) / 1e6;
            cpu[s] = (cb.tv_sec - ca.tv_sec) * 1e3 + (cb.tv_nsec - ca.tv_nsec) / 1e6;
        }
    }
    printf("bertd_steps_ms");
    for (int s = 0; s < steps; s++)
        printf(" %.2f", ms[s]);
    printf("\nbertd_cpu_ms");
    for (int s = 0; s < steps; s++)
        printf(" %.2f", cpu[s]);
    printf("\nmasked %d loss %.4f\n", M, loss);
    free(ms); free(cpu); free(ids); free(tt); free(lens); free(pos); free(lab);
    trainer_destroy(t);
    return 0;
}
