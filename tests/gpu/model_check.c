/* model_check — see model_check.h. */
#include "tests/gpu/model_check.h"

kdtype mc_start(void)
{
    gpu_require_device();
    bert_set_threads(4);
    char err[128];
    kdtype best;
    if (gpu_precision_pick("auto", 0, &best, err, sizeof err) != 0) {
        printf("FAIL precision pick: %s\n", err);
        exit(1);
    }
    return best;
}

optim_config mc_optim_config(void)
{
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    oc.lr = 1e-3f;
    oc.weight_decay = 0.01f;
    oc.warmup_steps = 2;
    oc.total_steps = 10;
    return oc;
}

double mc_norm2_rel(const float *got, const float *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        double d = (double)got[i] - ref[i];
        e += d * d;
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : INFINITY;
}

void mc_report(int ok, const char *what, kdtype dt, double val, double tol)
{
    printf("%-4s %-44s %-4s rel=%.3g (tol %.0e)\n", ok ? "ok" : "FAIL", what, kdtype_name(dt), val,
           tol);
    gpu_failures += !ok;
}

char *mc_env_set(const char *var, const char *value)
{
    const char *v = getenv(var);
    char *saved = v ? strdup(v) : NULL;
    if (value)
        setenv(var, value, 1);
    else
        unsetenv(var);
    return saved;
}

void mc_env_restore(const char *var, char *saved)
{
    if (saved)
        setenv(var, saved, 1);
    else
        unsetenv(var);
    free(saved);
}

bert_model *mc_cpu_model(const bert_config *c, uint64_t seed)
{
    bert_model *cpu = NULL;
    if (bert_model_create(&cpu, c) != 0)
        abort();
    bert_model_init_weights(cpu, seed);
    return cpu;
}

gpu_model *mc_model(const bert_config *c, kdtype dt, int B, int T, int M, const optim_config *oc,
                    const float *params, const char *what)
{
    gpu_model *g = NULL;
    char err[256] = "";
    if (gpu_model_create(&g, c, dt, 0, B, T, M, oc, err, sizeof err) != 0 ||
        gpu_model_set_params(g, params) != 0) {
        printf("FAIL gpu_model_create %s: %s\n", what, err);
        gpu_failures++;
        gpu_model_destroy(g);
        return NULL;
    }
    return g;
}

int mc_check_loss(float gl, const bert_model *cpu, kdtype dt, double ltol)
{
    double lrel = fabs((double)gl - cpu->loss) / fabs((double)cpu->loss);
    int ok = isfinite(gl) && lrel <= ltol;
    mc_report(ok, "model loss (dropout on)", dt, lrel, ltol);
    return ok;
}

void mc_check_grads(const float *grads, const bert_model *cpu, kdtype dt, double gtol)
{
    size_t off = 0;
    for (int i = 0; i < BERT_NUM_PARAM_TENSORS; i++) {
        size_t sz = cpu->param_sizes[i];
        if (sz) {
            char name[64];
            snprintf(name, sizeof name, "model grad %s", bert_param_name(i));
            check_close(name, dt, grads + off, cpu->grads_memory + off, sz, gtol);
        }
        off += sz;
    }
}

float mc_forward_backward(gpu_model *g, bert_model *cpu, const bert_batch *b,
                          const bert_dropout *d, kdtype dt, double ltol)
{
    char err[256];
    if (bert_model_forward(cpu, b, d) != 0)
        abort();
    bert_model_zero_grad(cpu);
    bert_model_backward(cpu, 1.0f);
    if (gpu_model_upload(g, b, err, sizeof err) != 0) {
        printf("FAIL upload: %s\n", err);
        abort();
    }
    gpu_model_zero_grad(g);
    float scale = gpu_model_loss_scale(g); // 1 unless fp16
    gpu_model_forward(g, d, scale);
    mc_check_loss(gpu_model_loss(g), cpu, dt, ltol);
    gpu_model_backward(g);
    return scale;
}

void mc_check_model_grads(gpu_model *g, const bert_model *cpu, float scale, kdtype dt, double gtol)
{
    size_t n = cpu->num_params;
    float *gg = malloc(n * sizeof *gg);
    if (gpu_model_get_grads(g, gg) != 0)
        abort();
    for (size_t i = 0; i < n; i++)
        gg[i] /= scale;
    mc_check_grads(gg, cpu, dt, gtol);
    free(gg);
}

float mc_train_step(gpu_model *g, const bert_batch *b, const bert_dropout *d, int step,
                    double *gnorm)
{
    char err[256];
    if (gpu_model_upload(g, b, err, sizeof err) != 0) {
        printf("FAIL upload: %s\n", err);
        abort();
    }
    gpu_model_zero_grad(g);
    gpu_model_forward(g, d, gpu_model_loss_scale(g));
    float loss = gpu_model_loss(g);
    gpu_model_backward(g);
    int skipped = 0;
    if (gpu_model_step(g, NULL, gnorm, &skipped) != 0 || skipped) {
        printf("FAIL gpu_model_step %d (skipped %d)\n", step, skipped);
        gpu_failures++;
    }
    return loss;
}

float *mc_adamw_steps(gpu_model *g, bert_model *cpu, optim_config *oc, int steps, mc_batch_fn next,
                      void *ctx, kdtype dt, double ltol)
{
    size_t n = cpu->num_params;
    oc->eps = (float)(optim_global_norm(cpu->grads_memory, n) / sqrt((double)n));
    g->ocfg.eps = oc->eps;
    printf("     AdamW eps for the step comparison: %.3g\n", oc->eps);
    size_t nseg = (size_t)bert_param_segments(&cpu->cfg, NULL, NULL, 0);
    size_t *segs = calloc(nseg, sizeof *segs);
    int *decays = calloc(nseg, sizeof *decays);
    bert_param_segments(&cpu->cfg, segs, decays, (int)nseg);
    optim *o = NULL;
    if (optim_create(&o, oc, segs, decays, (int)nseg) != 0)
        abort();
    float *p0 = host_copy(cpu->params_memory, n);
    double worst_loss = 0;
    for (int k = 0; k < steps; k++) {
        const bert_batch *b = next(ctx, &cpu->cfg, k + 1);
        bert_dropout dk = {.train = 1, .seed = 99, .rank = 0, .step = (uint32_t)k + 1};
        bert_model_forward(cpu, b, &dk);
        bert_model_zero_grad(cpu);
        bert_model_backward(cpu, 1.0f);
        if (optim_step(o, cpu->params_memory, cpu->grads_memory, NULL, NULL) != 0)
            abort();
        float l = mc_train_step(g, b, &dk, k, NULL);
        double e = isfinite(l) ? fabs((double)l - cpu->loss) / fabs((double)cpu->loss) : INFINITY;
        worst_loss = e > worst_loss ? e : worst_loss;
    }
    char what[64];
    snprintf(what, sizeof what, "%d AdamW steps: worst step loss", steps);
    mc_report(worst_loss <= ltol * 2, what, dt, worst_loss, ltol * 2);
    free(segs);
    free(decays);
    optim_destroy(o);
    return p0;
}

void mc_check_update(gpu_model *g, bert_model *cpu, float *p0, const char *what, kdtype dt,
                     double utol)
{
    size_t n = cpu->num_params;
    float *gp = malloc(n * sizeof *gp);
    if (gpu_model_get_params(g, gp) != 0)
        abort();
    for (size_t i = 0; i < n; i++) {
        gp[i] -= p0[i];
        cpu->params_memory[i] -= p0[i];
    }
    double ur = mc_norm2_rel(gp, cpu->params_memory, n);
    mc_report(ur <= utol, what, dt, ur, utol);
    free(gp);
    free(p0);
}

size_t mc_differ(const void *a, const void *b, size_t n, size_t size)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0;
    return d;
}
