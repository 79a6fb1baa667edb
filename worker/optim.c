/* optim — see optim.h. The AdamW arithmetic follows torch's
 * _single_tensor_adamw operation by operation (float32 tensors, double
 * scalars cast to float where torch casts them) so 10 steps agree with
 * PyTorch to float rounding. LAMB follows apex multi_tensor_lamb. */
#include "worker/optim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void optim_config_default(optim_config *c, optim_kind kind)
{
    *c = (optim_config){.kind = kind, .lr = 5e-5f, .beta1 = 0.9f, .beta2 = 0.999f,
                        .eps = kind == OPTIM_LAMB ? 1e-6f : 1e-8f, .weight_decay = 0.0f,
                        .max_grad_norm = 1.0f, .sched = SCHED_LINEAR, .warmup_steps = 0,
                        .total_steps = 1, .lr_end = 1e-7, .power = 1.0, .num_cycles = 0.5};
}

int optim_config_validate(const optim_config *c, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -EINVAL; } while (0)
    if (c->kind != OPTIM_ADAMW && c->kind != OPTIM_LAMB) BAD("optim: unknown optimizer");
    if (!(c->lr >= 0 && isfinite(c->lr))) BAD("learning_rate must be >= 0");
    if (!(c->beta1 >= 0 && c->beta1 < 1)) BAD("adam_beta1 must be in [0,1)");
    if (!(c->beta2 >= 0 && c->beta2 < 1)) BAD("adam_beta2 must be in [0,1)");
    if (!(c->eps > 0)) BAD("adam_epsilon must be > 0");
    if (!(c->weight_decay >= 0)) BAD("weight_decay must be >= 0");
    if (c->warmup_steps < 0) BAD("warmup_steps must be >= 0");
    if (c->total_steps < 1) BAD("max_steps must be >= 1");
    if (c->sched < SCHED_LINEAR || c->sched >= SCHED_COUNT)
        BAD("lr_scheduler_type: unknown schedule");
    /* the bounds common/jobspec.c puts on lr_scheduler_kwargs */
    if (c->sched == SCHED_POLYNOMIAL && !(c->lr_end >= 0)) // below lr: common/jobspec.c
        BAD("lr_scheduler_kwargs.lr_end must be >= 0");
    if (c->sched == SCHED_POLYNOMIAL && !(c->power > 0 && c->power <= 100))
        BAD("lr_scheduler_kwargs.power must be in (0, 100]");
    if (!(c->num_cycles > 0 && c->num_cycles <= 1000))
        BAD("lr_scheduler_kwargs.num_cycles must be in (0, 1000]");
    if (!(c->min_lr_rate >= 0 && c->min_lr_rate <= 1))
        BAD("lr_scheduler_kwargs.min_lr_rate must be in [0, 1]");
    if (!(c->min_lr_ratio >= 0 && c->min_lr_ratio <= 1))
        BAD("lr_scheduler_kwargs.min_lr_ratio must be in [0, 1]");
    if (c->num_stable_steps < 0 || c->num_decay_steps < 0)
        BAD("lr_scheduler_kwargs: num_stable_steps and num_decay_steps must be >= 0");
    return 0;
#undef BAD
}

int optim_kind_parse(const char *s, optim_kind *out)
{
    if (strcmp(s, "adamw") == 0 || strcmp(s, "adamw_torch") == 0)
        *out = OPTIM_ADAMW;
    else if (strcmp(s, "lamb") == 0)
        *out = OPTIM_LAMB;
    else
        return -EINVAL;
    return 0;
}

static const char *const sched_names[SCHED_COUNT] = {
    "linear", "cosine", "constant", "constant_with_warmup", "polynomial", "cosine_with_min_lr",
    "warmup_stable_decay"};

int sched_kind_parse(const char *s, sched_kind *out)
{
    for (int i = 0; i < SCHED_COUNT; i++)
        if (strcmp(s, sched_names[i]) == 0) {
            *out = (sched_kind)i;
            return 0;
        }
    return -EINVAL;
}

const char *sched_kind_name(sched_kind k)
{
    return k >= 0 && k < SCHED_COUNT ? sched_names[k] : "unknown";
}

int optim_create(optim **out, const optim_config *c, const size_t *sizes, const int *decays,
                 int num_tensors)
{
    optim *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    o->cfg = *c;
    o->sizes = sizes;
    o->decays = decays;
    o->num_tensors = num_tensors;
    for (int i = 0; i < num_tensors; i++)
        o->num_params += sizes[i];
    o->state_memory = calloc(2 * o->num_params + 1, sizeof(float));
    if (!o->state_memory) {
        free(o);
        return -ENOMEM;
    }
    o->m = o->state_memory;
    o->v = o->state_memory + o->num_params;
    *out = o;
    return 0;
}

void optim_destroy(optim *o)
{
    if (!o)
        return;
    free(o->state_memory);
    free(o);
}

/* Each case is the lr_lambda of transformers 4.44 optimization.py for that
 * SchedulerType, in double as Python computes it; the warmup all but
 * constant share comes first. */
double optim_lr_at(const optim_config *c, long step)
{
    double w = (double)c->warmup_steps, tot = (double)c->total_steps, s = (double)step, f;
    if (c->sched != SCHED_CONSTANT && s < w)
        return c->lr * (s / (w > 1 ? w : 1));
    switch (c->sched) {
    case SCHED_LINEAR: {
        double den = tot - w > 1 ? tot - w : 1;
        f = (tot - s) / den;
        f = f > 0 ? f : 0;
        break;
    }
    case SCHED_COSINE:
    case SCHED_COSINE_WITH_MIN_LR: {
        double den = tot - w > 1 ? tot - w : 1, progress = (s - w) / den;
        double rate = c->sched == SCHED_COSINE_WITH_MIN_LR ? c->min_lr_rate : 0.0;
        f = 0.5 * (1.0 + cos(M_PI * c->num_cycles * 2.0 * progress));
        f = f * (1 - rate) + rate;
        f = f > 0 ? f : 0;
        break;
    }
    case SCHED_POLYNOMIAL: {
        /* lr_end itself past the end; get_polynomial_decay_schedule_with_warmup
         * divides by zero at the last step when warmup is all of it: lr_end */
        double lr_init = c->lr, decay_steps = tot - w;
        if (s > tot || decay_steps <= 0)
            return c->lr_end;
        double pct_remaining = 1 - (s - w) / decay_steps;
        return (lr_init - c->lr_end) * pow(pct_remaining, c->power) + c->lr_end;
    }
    case SCHED_WARMUP_STABLE_DECAY: {
        double stable = (double)c->num_stable_steps, decay = (double)c->num_decay_steps;
        if (s < w + stable) {
            f = 1.0;
        } else if (s < w + stable + decay) {
            double progress = (s - w - stable) / (decay > 1 ? decay : 1);
            double value = 0.5 * (1.0 + cos(M_PI * c->num_cycles * 2.0 * progress));
            value = value > 0 ? value : 0;
            f = (1.0 - c->min_lr_ratio) * value + c->min_lr_ratio;
        } else {
            f = c->min_lr_ratio;
        }
        break;
    }
    default:
        f = 1.0;
    }
    return c->lr * f;
}

/* Sum of squares in fixed chunks added in a fixed order: OpenMP reductions
 * combine in thread arrival order, which would make a resumed run differ in
 * the last bit from an uninterrupted one. */
#define NORM_CHUNKS 64
static double sumsq(const float *x, size_t n)
{
    double part[NORM_CHUNKS];
    size_t per = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
#pragma omp parallel for
    for (int c = 0; c < NORM_CHUNKS; c++) {
        size_t lo = (size_t)c * per, hi = lo + per < n ? lo + per : n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++)
            s += (double)x[i] * x[i];
        part[c] = s;
    }
    double s = 0.0;
    for (int c = 0; c < NORM_CHUNKS; c++)
        s += part[c];
    return s;
}

double optim_global_norm(const float *x, size_t n)
{
    return sqrt(sumsq(x, n));
}

static void adamw_tensor(float *p, const float *g, float *m, float *v, size_t n, double lr,
                         double wd, const optim_config *c, long t)
{
    float decay = (float)(1.0 - lr * wd), b1w = (float)(1.0 - c->beta1), b2 = c->beta2,
          b2w = (float)(1.0 - c->beta2);
    double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps = c->eps;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float pi = p[i] * decay;
        float mi = m[i] + b1w * (g[i] - m[i]); // torch lerp_
        float vi = v[i] * b2 + b2w * g[i] * g[i];
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

static void lamb_tensor(float *p, const float *g, float *m, float *v, size_t n, double lr,
                        double wd, const optim_config *c, long t, float clip)
{
    float b1 = c->beta1, b2 = c->beta2, b1w = 1.0f - c->beta1, b2w = 1.0f - c->beta2;
    float bc1 = (float)(1.0 - pow(c->beta1, (double)t)),
          bc2 = (float)(1.0 - pow(c->beta2, (double)t)), eps = c->eps, fwd = (float)wd;
    /* pass 1: moments, and norms of weight and update in fixed chunks (see
     * sumsq); the update is recomputed in pass 2 rather than stored */
    double wpart[NORM_CHUNKS], upart[NORM_CHUNKS];
    size_t per = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
#pragma omp parallel for
    for (int c = 0; c < NORM_CHUNKS; c++) {
        size_t lo = (size_t)c * per, hi = lo + per < n ? lo + per : n;
        double ws = 0.0, us = 0.0;
        for (size_t i = lo; i < hi; i++) {
            float gi = g[i] * clip;
            float mi = m[i] * b1 + gi * b1w;
            float vi = v[i] * b2 + gi * gi * b2w;
            m[i] = mi;
            v[i] = vi;
            float u = (mi / bc1) / (sqrtf(vi / bc2) + eps) + fwd * p[i];
            ws += (double)p[i] * p[i];
            us += (double)u * u;
        }
        wpart[c] = ws;
        upart[c] = us;
    }
    double wn = 0.0, un = 0.0;
    for (int c = 0; c < NORM_CHUNKS; c++) {
        wn += wpart[c];
        un += upart[c];
    }
    wn = sqrt(wn);
    un = sqrt(un);
    /* apex: trust ratio only where weight decay applies (use_nvlamb=False) */
    double ratio = (wd != 0.0 && wn != 0.0 && un != 0.0) ? wn / un : 1.0;
    float step = (float)(lr * ratio);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float u = (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps) + fwd * p[i];
        p[i] -= step * u;
    }
}

int optim_step(optim *o, float *params, float *grads, double *lr_out, double *gnorm_out)
{
    const optim_config *c = &o->cfg;
    double lr = optim_lr_at(c, o->t);
    double gnorm = optim_global_norm(grads, o->num_params);
    if (!isfinite(gnorm))
        return -ERANGE; // caller decides: skip step (fp16) or fail the job
    float clip = 1.0f;
    if (c->max_grad_norm > 0) {
        if (c->kind == OPTIM_ADAMW) {
            /* torch.nn.utils.clip_grad_norm_: always multiplies by the clamped coef */
            double coef = (double)c->max_grad_norm / (gnorm + 1e-6);
            clip = (float)(coef < 1.0 ? coef : 1.0);
        } else {
            /* apex FusedLAMB: max_norm / max(norm, max_norm) */
            clip = (float)((double)c->max_grad_norm /
                           (gnorm > c->max_grad_norm ? gnorm : c->max_grad_norm));
        }
    }
    o->t++;
    size_t off = 0;
    for (int i = 0; i < o->num_tensors; i++) {
        size_t n = o->sizes[i];
        if (!n)
            continue;
        double wd = o->decays[i] ? c->weight_decay : 0.0;
        float *p = params + off, *g = grads + off, *m = o->m + off, *v = o->v + off;
        if (c->kind == OPTIM_ADAMW) {
            if (c->max_grad_norm > 0)
                for (size_t k = 0; k < n; k++)
                    g[k] *= clip;
            adamw_tensor(p, g, m, v, n, lr, wd, c, o->t);
        } else {
            lamb_tensor(p, g, m, v, n, lr, wd, c, o->t, clip);
        }
        off += n;
    }
    if (lr_out)
        *lr_out = lr;
    if (gnorm_out)
        *gnorm_out = gnorm;
    return 0;
}
