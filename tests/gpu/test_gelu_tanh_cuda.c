/* test_gelu_tanh_cuda — the GPU model with hidden_act "gelu_new" (GELU's
 * tanh form) against the CPU model (itself checked against transformers in
 * worker_model_hf): loss and every parameter gradient of one
 * forward/backward with dropout on, with lever CUDA_LEVER_GELU_EPI off (the
 * tanh-GELU kernels) and on (cuBLASLt's GELU_AUX_BIAS forward and DGELU
 * backward epilogues), in fp32 and, where the device has it, bf16. Then the
 * erf "gelu" model with the lever on: the lever must not apply there, so its
 * gradients are the lever-off ones bit for bit.
 *
 * The weights before the GELUs (FC1 and the MLM head transform) are scaled
 * up so that the GELU inputs spread over about +-5, where the tanh and erf
 * forms differ by up to 5e-4; at the init's scale they agree to ~1e-6 and
 * the comparison could not tell one form from the other. Tolerances as
 * test_model_cuda (fp32 gradients 1e-4, loss 1e-5; 16-bit 5e-2 and 1e-2).
 * Exits 77 without a GPU. */
#include "tests/gpu/model_check.h"

enum { TB = 2, TT = 16, TM = 7 };

typedef struct batch_store {
    int32_t ids[TB * TT], types[TB * TT], lens[TB], pos[TM], labels[TM];
    bert_batch b;
} batch_store;

static void make_batch(batch_store *s, const bert_config *c)
{
    for (int i = 0; i < TB * TT; i++) {
        s->ids[i] = (int32_t)((i * 37 + 5) % c->vocab_size);
        s->types[i] = (i % TT) >= TT / 2;
    }
    s->lens[0] = TT;
    s->lens[1] = TT - 5;
    for (int m = 0; m < TM; m++) { // distinct rows: b = m % 2, t = 2m/2 + 1
        s->pos[m] = (m % TB) * TT + m + 1;
        s->labels[m] = (int32_t)((m * 131 + 1) % c->vocab_size);
    }
    s->b = (bert_batch){.B = TB, .T = TT, .M = TM, .input_ids = s->ids, .token_type_ids = s->types,
                        .seq_lens = s->lens, .mlm_positions = s->pos, .mlm_labels = s->labels};
}

/* One forward/backward of the GPU model on cpu's weights; its gradients
 * (divided by the loss scale) into grads, its loss returned. NaN when the
 * model cannot be made (counted as a failure). */
static float gpu_run(const bert_config *c, kdtype dt, const float *params, const batch_store *bs,
                     const bert_dropout *d, float *grads)
{
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    gpu_model *g = mc_model(c, dt, TB, TT, TM, &oc, params, kdtype_name(dt));
    if (!g)
        return NAN;
    char err[256];
    if (gpu_model_upload(g, &bs->b, err, sizeof err) != 0)
        abort();
    gpu_model_zero_grad(g);
    float scale = gpu_model_loss_scale(g);
    gpu_model_forward(g, d, scale);
    float loss = gpu_model_loss(g);
    gpu_model_backward(g);
    size_t n = 0, s[BERT_NUM_PARAM_TENSORS];
    bert_param_sizes(c, s);
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++)
        n += s[i];
    if (gpu_model_get_grads(g, grads) != 0)
        abort();
    for (size_t i = 0; i < n; i++)
        grads[i] /= scale;
    gpu_model_destroy(g);
    return loss;
}

static void set_lever(int on)
{
    setenv("BERTD_LEVER_GELU_EPI", on ? "1" : "0", 1);
}

/* The CPU model with the weights before the GELUs scaled (see the header). */
static bert_model *make_cpu(const bert_config *c)
{
    bert_model *cpu = mc_cpu_model(c, 1234);
    size_t fc = (size_t)c->num_hidden_layers * c->intermediate_size * c->hidden_size;
    for (size_t i = 0; i < fc; i++)
        cpu->params.fcw[i] *= 20.0f;
    for (size_t i = 0; i < (size_t)c->hidden_size * c->hidden_size; i++)
        cpu->params.head_w[i] *= 20.0f;
    return cpu;
}

static void test_tanh_model(kdtype dt)
{
    bert_config c = gpu_test_config(4, 0);
    c.act = BERT_ACT_GELU_NEW;
    bert_model *cpu = make_cpu(&c);
    batch_store bs;
    make_batch(&bs, &c);
    bert_dropout d = {.train = 1, .seed = 99};
    if (bert_model_forward(cpu, &bs.b, &d) != 0)
        abort();
    bert_model_zero_grad(cpu);
    bert_model_backward(cpu, 1.0f);
    size_t n = cpu->num_params;
    float *gg = malloc(n * sizeof *gg);
    double gtol = dt == KDT_F32 ? 1e-4 : 5e-2, ltol = dt == KDT_F32 ? 1e-5 : 1e-2;
    for (int lever = 0; lever < 2; lever++) {
        printf("--- gelu_new model, %s, lever GELU_EPI %s\n", kdtype_name(dt), lever ? "on" : "off");
        set_lever(lever);
        float gl = gpu_run(&c, dt, cpu->params_memory, &bs, &d, gg);
        mc_check_loss(gl, cpu, dt, ltol);
        if (isfinite(gl))
            mc_check_grads(gg, cpu, dt, gtol);
    }
    unsetenv("BERTD_LEVER_GELU_EPI");
    free(gg);
    bert_model_destroy(cpu);
}

/* erf "gelu": cuBLASLt's GELU would change the model, so the lever is not
 * taken: the same bits as with it off. */
static void test_erf_model_ignores_lever(void)
{
    printf("--- gelu (erf) model, fp32: lever GELU_EPI on changes nothing\n");
    bert_config c = gpu_test_config(4, 0);
    bert_model *cpu = make_cpu(&c);
    batch_store bs;
    make_batch(&bs, &c);
    bert_dropout d = {.train = 1, .seed = 99};
    size_t n = cpu->num_params;
    float *g0 = malloc(n * sizeof *g0), *g1 = malloc(n * sizeof *g1);
    set_lever(0);
    float l0 = gpu_run(&c, KDT_F32, cpu->params_memory, &bs, &d, g0);
    set_lever(1);
    float l1 = gpu_run(&c, KDT_F32, cpu->params_memory, &bs, &d, g1);
    unsetenv("BERTD_LEVER_GELU_EPI");
    size_t diff = mc_differ(g0, g1, n, sizeof *g0);
    int ok = isfinite(l0) && memcmp(&l0, &l1, sizeof l0) == 0 && diff == 0;
    printf("%-4s erf model, lever on vs off: loss %s, %zu of %zu gradients differ\n",
           ok ? "ok" : "FAIL", memcmp(&l0, &l1, sizeof l0) == 0 ? "same" : "differs", diff, n);
    gpu_failures += !ok;
    free(g0);
    free(g1);
    bert_model_destroy(cpu);
}

int main(void)
{
    kdtype best = mc_start();
    test_tanh_model(KDT_F32);
    if (best == KDT_BF16)
        test_tanh_model(KDT_BF16);
    test_erf_model_ignores_lever();
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown();
    return gpu_failures ? 1 : 0;
}
