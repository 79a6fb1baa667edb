/* test_gpu_io_cuda — what the GPU model takes from the host and gives back
 * for a resume, outside the maths that test_model_cuda checks:
 *  - batch upload from a real job ring (loader/ring.c) slot: in place from the
 *    cudaHostRegister'ed slot area, in place from the same slot unregistered
 *    (pageable), and staged through the model's pinned buffer all put the
 *    same bytes in the device slot, equal to the expected layout built here
 *    independently (ids, types, lens, flattened masked positions and labels,
 *    NSP labels, CLS rows); two geometries, one where the ring's ids, types
 *    and lens are back to back (one DMA) and one where they are not; and a
 *    forward pass gives bit-identical losses from each;
 *  - the release rule: with the copy held back on the device (a host-function
 *    gate on the compute stream that the copy stream waits for), an in-place
 *    upload's event is still pending and the bytes that land are those in
 *    the slot when the DMA runs, so a slot may be handed back to the loaders
 *    only after gpu_model_upload_wait; a staged upload has taken its bytes
 *    when it returns;
 *  - the fp16 loss scaler's state: read, restored (a restored good_steps
 *    counts towards the next growth), ignored by a model that does not
 *    scale, and impossible states refused with the model unchanged.
 * Exits 77 without a GPU. On the CPU stand-in (tests/cudasim) the release
 * rule runs in the deferred stream mode only (the sync mode completes every
 * copy at its call, so nothing can be pending).
 */
#include "tests/gpu/gpu_check.h"
#include "loader/batch.h"
#include "loader/ring.h"
#include "worker/gpu_model.h"

#include <errno.h>
#include <stdatomic.h>
#include <unistd.h>

enum { CAP_B = 3, CAP_T = 24, P = 4 };

static void ok_if(int ok, const char *what, const char *detail)
{
    printf("%-4s %-58s %s\n", ok ? "ok" : "FAIL", what, detail ? detail : "");
    gpu_failures += !ok;
}

/* Batch k's content, defined once: (b, t) -> token, masked positions per
 * sequence ascending and below its length. */
static int32_t tok(const bert_config *c, int b, int t, int k)
{
    return (int32_t)((b * 131 + t * 7 + k * 17 + 5) % c->vocab_size);
}
static int32_t seq_len(int T, int b, int k)
{
    return T - b - k % 3;
}
static int n_pred(int b, int k)
{
    return 1 + (b + k) % P;
}

/* Writes batch k into a ring slot with layout l, as a loader would. */
static void fill_slot(void *slot, const batch_layout *l, const bert_config *c, int k)
{
    memset(slot, 0, l->slot_bytes);
    batch_header *h = slot;
    *h = (batch_header){.magic = BATCH_MAGIC, .version = BATCH_VERSION, .n_seq = l->B,
                        .max_seq_len = l->T, .max_pred = l->P, .flags = BATCH_FLAG_NSP,
                        .off_input_ids = l->off_input_ids,
                        .off_token_type_ids = l->off_token_type_ids,
                        .off_seq_lens = l->off_seq_lens, .off_mlm_positions = l->off_mlm_positions,
                        .off_mlm_labels = l->off_mlm_labels, .off_nsp_labels = l->off_nsp_labels,
                        .off_n_pred = l->off_n_pred, .slot_bytes = l->slot_bytes};
    char *base = slot;
    int32_t *ids = (int32_t *)(base + l->off_input_ids), *tt = (int32_t *)(base + l->off_token_type_ids),
            *lens = (int32_t *)(base + l->off_seq_lens), *pos = (int32_t *)(base + l->off_mlm_positions),
            *lab = (int32_t *)(base + l->off_mlm_labels), *nsp = (int32_t *)(base + l->off_nsp_labels),
            *np = (int32_t *)(base + l->off_n_pred);
    int B = (int)l->B, T = (int)l->T;
    for (int b = 0; b < B; b++) {
        lens[b] = seq_len(T, b, k);
        nsp[b] = (b + k) % 2;
        np[b] = n_pred(b, k);
        for (int t = 0; t < T; t++) {
            ids[b * T + t] = tok(c, b, t, k);
            tt[b * T + t] = t >= T / 2;
        }
        for (int i = 0; i < P; i++) {
            pos[b * P + i] = i < np[b] ? 1 + 2 * i : 0;
            lab[b * P + i] = i < np[b] ? (int32_t)((b * P + i + k * 3 + 1) % c->vocab_size) : -1;
        }
    }
}

/* The worker's view of a slot (worker/loop.c slot_to_batch): ids, types,
 * lens and NSP labels point into the slot; masked positions flattened to
 * b*T+t in fp/fl. */
static bert_batch slot_view(const void *slot, const batch_layout *l, int32_t *fp, int32_t *fl)
{
    const char *base = slot;
    const int32_t *pos = (const int32_t *)(base + l->off_mlm_positions),
                  *lab = (const int32_t *)(base + l->off_mlm_labels),
                  *np = (const int32_t *)(base + l->off_n_pred);
    int m = 0;
    for (uint32_t b = 0; b < l->B; b++)
        for (int i = 0; i < np[b]; i++) {
            fp[m] = (int32_t)(b * l->T) + pos[b * l->P + i];
            fl[m] = lab[b * l->P + i];
            m++;
        }
    return (bert_batch){.B = (int)l->B, .T = (int)l->T, .M = m,
                        .input_ids = (const int32_t *)(base + l->off_input_ids),
                        .token_type_ids = (const int32_t *)(base + l->off_token_type_ids),
                        .seq_lens = (const int32_t *)(base + l->off_seq_lens),
                        .mlm_positions = fp, .mlm_labels = fl,
                        .nsp_labels = (const int32_t *)(base + l->off_nsp_labels)};
}

/* The device slot batch k must produce, from the definition above (not from
 * the slot): ids, types, lens, positions, labels, nsp, CLS rows b*T. */
static size_t expected_slot(int32_t *e, const bert_config *c, int B, int T, int k)
{
    size_t n = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            e[n++] = tok(c, b, t, k);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            e[n++] = t >= T / 2;
    for (int b = 0; b < B; b++)
        e[n++] = seq_len(T, b, k);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n_pred(b, k); i++)
            e[n++] = b * T + 1 + 2 * i;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n_pred(b, k); i++)
            e[n++] = (int32_t)((b * P + i + k * 3 + 1) % c->vocab_size);
    for (int b = 0; b < B; b++)
        e[n++] = (b + k) % 2;
    for (int b = 0; b < B; b++)
        e[n++] = b * T;
    return n;
}

/* Publishes batch k through the ring as a loader would and takes it as the
 * rank-0 consumer; the caller releases it. */
static void *ring_batch(ring *r, const batch_layout *l, const bert_config *c, int k)
{
    uint64_t n;
    void *slot, *got = NULL;
    if (ring_claim(r, NULL, &n, &slot) != 0 || n != (uint64_t)k)
        abort();
    fill_slot(slot, l, c, k);
    ring_publish(r, n);
    if (ring_next(r, 0, 5000, &got) != 0 || got != slot)
        abort();
    return got;
}

static int slot_matches(gpu_model *g, const int32_t *want, size_t n, const char *what)
{
    int32_t *got = calloc(n, sizeof *got);
    int rc = gpu_model_read_staged(g, got, n);
    size_t bad = n;
    for (size_t i = 0; rc == 0 && i < n && bad == n; i++)
        if (got[i] != want[i])
            bad = i;
    char d[160];
    if (rc != 0)
        snprintf(d, sizeof d, "read back failed: %d", rc);
    else if (bad < n)
        snprintf(d, sizeof d, "int %zu of %zu: %d, want %d", bad, n, got[bad], want[bad]);
    else
        snprintf(d, sizeof d, "%zu ints equal", n);
    ok_if(rc == 0 && bad == n, what, d);
    free(got);
    return rc == 0 && bad == n;
}

static float eval_loss(gpu_model *g)
{
    if (gpu_model_forward(g, NULL, 0.0f) != 0)
        return NAN;
    return gpu_model_loss(g);
}

/* The three upload paths from one ring slot of a B x T geometry. */
static void test_upload_paths(int B, int T)
{
    printf("--- upload paths, batch %d x %d\n", B, T);
    bert_config c = gpu_test_config(4, 1);
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    batch_layout l;
    if (batch_layout_init(&l, (uint32_t)B, (uint32_t)T, P) != 0)
        abort();
    int contiguous = l.off_token_type_ids == l.off_input_ids + 4u * B * T &&
                     l.off_seq_lens == l.off_token_type_ids + 4u * B * T;
    printf("     ring slot: ids | types | lens %s\n",
           contiguous ? "back to back (one DMA)" : "with gaps (one DMA each)");
    char name[64], err[256];
    snprintf(name, sizeof name, "/bertd-test-gpuio-%d-%dx%d", (int)getpid(), B, T);
    ring_unlink(name);
    ring_params rp = {.G = 1, .S = 2, .M = 1, .layout = l, .start_batch = 0,
                      .end_batch = UINT64_MAX};
    ring *r = NULL;
    if (ring_create(&r, name, &rp) != 0 || ring_producer_register(r) != 0)
        abort();
    size_t area_bytes;
    void *area = ring_slot_area(r, &area_bytes);
    TCHECK(cudaHostRegister(area, area_bytes, cudaHostRegisterDefault));

    bert_model *cpu = NULL;
    if (bert_model_create(&cpu, &c) != 0)
        abort();
    bert_model_init_weights(cpu, 5);
    gpu_model *g = NULL;
    if (gpu_model_create(&g, &c, KDT_F32, 0, CAP_B, T, CAP_B * P, &oc, err, sizeof err) != 0) {
        printf("FAIL gpu_model_create: %s\n", err);
        abort();
    }
    if (gpu_model_set_params(g, cpu->params_memory) != 0)
        abort();

    int32_t fp[CAP_B * P], fl[CAP_B * P];
    int32_t *want = calloc((size_t)2 * B * T + 3 * B + 2 * B * P, sizeof *want);
    size_t n = expected_slot(want, &c, B, T, 0);
    void *slot = ring_batch(r, &l, &c, 0);
    bert_batch b = slot_view(slot, &l, fp, fl);

    int rc = gpu_model_upload_inplace(g, &b, err, sizeof err);
    ok_if(rc == 0 && gpu_model_upload_wait(g) == 0, "in place from the registered ring slot",
          rc ? err : NULL);
    slot_matches(g, want, n, "  device slot = expected layout");
    float l_pinned = eval_loss(g);

    rc = gpu_model_upload(g, &b, err, sizeof err);
    ok_if(rc == 0, "staged through the pinned buffer", rc ? err : NULL);
    slot_matches(g, want, n, "  device slot = expected layout");
    float l_staged = eval_loss(g);

    TCHECK(cudaHostUnregister(area));
    rc = gpu_model_upload_inplace(g, &b, err, sizeof err);
    ok_if(rc == 0 && gpu_model_upload_wait(g) == 0, "in place from the pageable (unregistered) slot",
          rc ? err : NULL);
    slot_matches(g, want, n, "  device slot = expected layout");
    float l_pageable = eval_loss(g);
    ring_release(r, 0);

    char d[160];
    snprintf(d, sizeof d, "%.9g %.9g %.9g", l_pinned, l_staged, l_pageable);
    ok_if(isfinite(l_pinned) && memcmp(&l_pinned, &l_staged, 4) == 0 &&
              memcmp(&l_pinned, &l_pageable, 4) == 0,
          "forward losses bit-identical over the three paths", d);

    free(want);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
    ring_detach(r);
    ring_unlink(name);
}

/* A closed gate on a stream: a host function that returns once *open. */
static void CUDART_CB gate_fn(void *arg)
{
    atomic_int *open = arg;
    while (!atomic_load(open))
        usleep(100);
}

/* Holds the copy of the next upload back behind a gate: upload A into one
 * device slot, gate on compute, forward/backward A (that slot's "free" event
 * now follows the gate), upload A again (the other slot, not held). Returns
 * with the gate closed; the next upload goes to A's first slot again, so its
 * copy waits on the device for the gate. */
static void hold_copies(gpu_model *g, const bert_batch *a, atomic_int *open)
{
    char err[256];
    if (gpu_model_upload(g, a, err, sizeof err) != 0)
        abort();
    TCHECK(cudaLaunchHostFunc(g->compute, gate_fn, open));
    if (gpu_model_forward(g, NULL, 1.0f) != 0 || gpu_model_backward(g) != 0)
        abort();
    if (gpu_model_upload(g, a, err, sizeof err) != 0)
        abort();
}

static void test_release_rule(void)
{
    printf("--- the slot is released only after the copy's event\n");
    /* the CPU stand-in's synchronous mode (tests/cudasim) finishes every
     * call before it returns, like CUDA_LAUNCH_BLOCKING=1: a gate on a
     * stream would hold the host itself */
    const char *sim = getenv("CUDASIM_STREAMS");
    if (sim && !strcmp(sim, "sync")) {
        printf("skip the release rule: CUDASIM_STREAMS=sync has no pending copies\n");
        return;
    }
    bert_config c = gpu_test_config(4, 1);
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    int B = 2, T = 24;
    batch_layout l;
    if (batch_layout_init(&l, (uint32_t)B, (uint32_t)T, P) != 0)
        abort();
    char err[256];
    void *slot = NULL;
    if (posix_memalign(&slot, BATCH_ALIGN, l.slot_bytes) != 0)
        abort();
    TCHECK(cudaHostRegister(slot, l.slot_bytes, cudaHostRegisterDefault));
    gpu_model *g = NULL;
    if (gpu_model_create(&g, &c, KDT_F32, 0, CAP_B, T, CAP_B * P, &oc, err, sizeof err) != 0)
        abort();
    int32_t fp[CAP_B * P], fl[CAP_B * P], fp2[CAP_B * P], fl2[CAP_B * P];
    int32_t *want0 = calloc((size_t)2 * B * T + 5 * B + 2 * B * P, sizeof *want0);
    int32_t *want1 = calloc((size_t)2 * B * T + 5 * B + 2 * B * P, sizeof *want1);
    size_t n = expected_slot(want0, &c, B, T, 0);
    expected_slot(want1, &c, B, T, 1);
    batch_layout la = l;
    void *other = NULL;
    if (posix_memalign(&other, BATCH_ALIGN, la.slot_bytes) != 0)
        abort();
    fill_slot(other, &la, &c, 7);
    bert_batch a = slot_view(other, &la, fp2, fl2);

    /* in place: the DMA reads the slot when it runs, not when enqueued */
    atomic_int open = 0;
    hold_copies(g, &a, &open);
    fill_slot(slot, &l, &c, 0);
    bert_batch b = slot_view(slot, &l, fp, fl);
    if (gpu_model_upload_inplace(g, &b, err, sizeof err) != 0)
        abort();
    cudaError_t q = cudaEventQuery(g->slot_ready[g->staged]);
    (void)cudaGetLastError(); // "not ready" must not reach the next launch check
    ok_if(q == cudaErrorNotReady, "in place: copy still pending behind the step",
          cudaGetErrorName(q));
    /* a loader overwriting the slot now (as it would after an early
     * release) changes what the device gets: ids, types and lens are read
     * from the slot at DMA time */
    int32_t fp1[CAP_B * P], fl1[CAP_B * P];
    fill_slot(slot, &l, &c, 1);
    (void)slot_view(slot, &l, fp1, fl1);
    atomic_store(&open, 1);
    ok_if(gpu_model_upload_wait(g) == 0 && cudaEventQuery(g->slot_ready[g->staged]) == cudaSuccess,
          "in place: upload_wait returns once the copy is done", NULL);
    /* the head (ids, types, lens) is batch 1's; the staged rest batch 0's */
    size_t head = 2 * (size_t)B * T + B;
    int32_t *mix = calloc(n, sizeof *mix);
    memcpy(mix, want1, head * 4);
    memcpy(mix + head, want0 + head, (n - head) * 4);
    slot_matches(g, mix, n, "  device got the slot's bytes at DMA time");
    TCHECK(cudaDeviceSynchronize());

    /* staged: the bytes are taken when gpu_model_upload returns */
    atomic_store(&open, 0);
    hold_copies(g, &a, &open);
    fill_slot(slot, &l, &c, 0);
    b = slot_view(slot, &l, fp, fl);
    if (gpu_model_upload(g, &b, err, sizeof err) != 0)
        abort();
    q = cudaEventQuery(g->slot_ready[g->staged]);
    (void)cudaGetLastError();
    ok_if(q == cudaErrorNotReady, "staged: copy still pending behind the step",
          cudaGetErrorName(q));
    fill_slot(slot, &l, &c, 1);
    atomic_store(&open, 1);
    ok_if(gpu_model_upload_wait(g) == 0, "staged: upload_wait", NULL);
    slot_matches(g, want0, n, "  device got the bytes of upload time");
    TCHECK(cudaDeviceSynchronize());

    free(mix);
    free(want0);
    free(want1);
    gpu_model_destroy(g);
    TCHECK(cudaHostUnregister(slot));
    free(slot);
    free(other);
}

static int scaler_eq(const gpu_loss_scaler *a, const gpu_loss_scaler *b)
{
    return a->scale == b->scale && a->enabled == b->enabled &&
           a->growth_interval == b->growth_interval && a->good_steps == b->good_steps &&
           a->skipped == b->skipped;
}

static void test_scaler_state(void)
{
    printf("--- loss scaler state (checkpoints)\n");
    bert_config c = gpu_test_config(4, 1);
    c.nsp = 0;
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    char err[256];
    kdtype dt;
    gpu_model *g = NULL;

    /* a model that does not scale ignores a saved fp16 state */
    if (gpu_model_create(&g, &c, KDT_F32, 0, CAP_B, CAP_T, CAP_B * P, &oc, err, sizeof err) != 0)
        abort();
    gpu_loss_scaler saved = {.scale = 1024.0f, .enabled = 1, .growth_interval = 3,
                             .good_steps = 2, .skipped = 4};
    int rc = gpu_model_set_scaler(g, &saved);
    ok_if(rc == 0 && gpu_model_loss_scale(g) == 1.0f && !g->scaler.enabled,
          "fp32 model ignores a saved fp16 scale", NULL);
    gpu_model_destroy(g);

    if (gpu_precision_pick("fp16", 0, &dt, err, sizeof err) != 0) {
        printf("skip fp16 scaler tests: %s\n", err);
        return;
    }
    bert_model *cpu = NULL;
    if (bert_model_create(&cpu, &c) != 0)
        abort();
    bert_model_init_weights(cpu, 21);
    g = NULL;
    if (gpu_model_create(&g, &c, KDT_F16, 0, CAP_B, CAP_T, CAP_B * P, &oc, err, sizeof err) != 0)
        abort();
    gpu_model_set_params(g, cpu->params_memory);
    gpu_loss_scaler s0, s;
    gpu_model_get_scaler(g, &s0);
    ok_if(s0.enabled && s0.scale == 65536.0f && s0.good_steps == 0 && s0.skipped == 0,
          "fp16 defaults: 65536, no steps", NULL);

    const gpu_loss_scaler bad[] = {
        {.scale = 0.0f, .enabled = 1, .growth_interval = 3},
        {.scale = NAN, .enabled = 1, .growth_interval = 3},
        {.scale = INFINITY, .enabled = 1, .growth_interval = 3},
        {.scale = 8.0f, .enabled = 1, .growth_interval = 0},
        {.scale = 8.0f, .enabled = 1, .growth_interval = 3, .good_steps = 3},
        {.scale = 8.0f, .enabled = 1, .growth_interval = 3, .skipped = -1},
    };
    int all = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = gpu_model_set_scaler(g, &bad[i]);
        gpu_model_get_scaler(g, &s);
        all &= rc == -EINVAL && scaler_eq(&s, &s0);
    }
    ok_if(all, "impossible states refused, model unchanged", NULL);

    gpu_loss_scaler off = {.scale = 1.0f, .enabled = 0, .growth_interval = 2000};
    rc = gpu_model_set_scaler(g, &off);
    gpu_model_get_scaler(g, &s);
    ok_if(rc == 0 && scaler_eq(&s, &s0), "a saved disabled state keeps the fp16 defaults", NULL);

    rc = gpu_model_set_scaler(g, &saved);
    gpu_model_get_scaler(g, &s);
    ok_if(rc == 0 && scaler_eq(&s, &saved) && gpu_model_loss_scale(g) == 1024.0f,
          "saved fp16 state restored exactly", NULL);

    /* good_steps 2 of 3 restored: one clean step completes the interval */
    int32_t ids[CAP_B * CAP_T], types[CAP_B * CAP_T] = {0}, lens[CAP_B], pos[4], labels[4];
    for (int i = 0; i < CAP_B * CAP_T; i++)
        ids[i] = (int32_t)((i * 37 + 5) % c.vocab_size);
    for (int b = 0; b < CAP_B; b++)
        lens[b] = CAP_T - b;
    for (int m = 0; m < 4; m++) {
        pos[m] = m * 7 + 1;
        labels[m] = (int32_t)(m * 131 + 1);
    }
    bert_batch b = {.B = CAP_B, .T = CAP_T, .M = 4, .input_ids = ids, .token_type_ids = types,
                    .seq_lens = lens, .mlm_positions = pos, .mlm_labels = labels};
    int skipped = -1;
    rc = gpu_model_upload(g, &b, err, sizeof err);
    gpu_model_zero_grad(g);
    if (rc == 0)
        rc = gpu_model_forward(g, NULL, gpu_model_loss_scale(g));
    if (rc == 0)
        rc = gpu_model_backward(g);
    if (rc == 0)
        rc = gpu_model_step(g, NULL, NULL, &skipped);
    gpu_model_get_scaler(g, &s);
    char d[128];
    snprintf(d, sizeof d, "rc %d skipped %d: scale %g good %d", rc, skipped, (double)s.scale,
             s.good_steps);
    ok_if(rc == 0 && skipped == 0 && s.scale == 2048.0f && s.good_steps == 0 && s.skipped == 4,
          "restored good_steps count: the next clean step doubles", d);
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

int main(void)
{
    gpu_require_device();
    bert_set_threads(2);
    test_upload_paths(3, 24); // ids | types | lens with gaps: 72 ints is not a multiple of 16
    test_upload_paths(2, 24); // 48 ints: back to back, one DMA
    test_release_rule();
    test_scaler_state();
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown(); /* the CPU stand-in reports device memory left behind */
    return gpu_failures ? 1 : 0;
}
