/* test_optim_emu — runs the kernels of kernels/cuda/optim.cu (their source,
 * kernels/cuda/optim.cuh) on the CPU under the SIMT emulator of cuda_emu.h
 * and compares them with the CPU optimizer of worker/optim.c (optim_step):
 * the sum of squares with its non-finite flag, multi-tensor AdamW and LAMB
 * over a span of odd-sized tensors (one empty, one of 1 element, decay on and
 * off) cut into chunks the way worker/gpu_model.c cuts them (at most a fixed
 * length per chunk, one tensor per chunk; the length here is 300 rather than
 * 32768 so a tensor spans several chunks and a chunk is longer than a block),
 * for several steps, with and without the 16-bit weight copy.
 *
 * The kernels' scalar arguments come from the .cuh's own adamw_args_make /
 * lamb_args_make and the sum-of-squares grid from sumsq_grid, as the
 * launchers use them. The clip factor is the one optim_step derives from
 * the global norm (the caller's job on the GPU too).
 * Expectations, from optim.cu's own contract: AdamW p, m, v bit-exact with the
 * CPU; LAMB m, v bit-exact and the update p1 - p0 within 1e-5 (the norm sums
 * are added in another order); the sum of squares within 1e-12 (double) and
 * the same bits whatever order the blocks run in (the emulator shuffles it;
 * with the atomicAdd the kernel had before, the repeat check fails);
 * the 16-bit copy equal to the CPU's p rounded to nearest even. Outputs that
 * are not updated in place start NaN with NaN guards.
 *
 * Shown to fail: with lamb_moments_kernel adding the update norm into the
 * weight norm's slot (norms[2 * seg] for norms[2 * seg + 1]), and with
 * `bad |= !isfinite(v)` removed from sumsq_check_kernel, this test fails
 * (checked by hand; both restored). (A LAMB kernel that read the decay flag
 * of the wrong tensor in pass 1 only is invisible by construction: the trust
 * ratio of a tensor without decay is 1 whatever its norms.)
 */
#include "tests/unit/kernels/cuda_emu.h"

#include "kernels/cuda/optim.cuh"

#include <string>
extern "C" {
#include "worker/optim.h"
}

namespace {

using emu::check;
using emu::frand;
using emu::from_t;
using emu::to_t;

constexpr uint32_t CHUNK = 300;

struct span {
    std::vector<size_t> sizes;
    std::vector<int> decays;
    std::vector<uint8_t> decay8;
    std::vector<cuda_chunk> chunks;
    size_t n = 0;
};

span make_span()
{
    span s;
    s.sizes = {300, 1, 0, 1000, 257, 33};
    s.decays = {1, 0, 0, 1, 1, 0};
    size_t off = 0;
    for (size_t t = 0; t < s.sizes.size(); t++) {
        s.decay8.push_back((uint8_t)s.decays[t]);
        for (size_t i = 0; i < s.sizes[t]; i += CHUNK) {
            uint32_t len = (uint32_t)std::min<size_t>(CHUNK, s.sizes[t] - i);
            s.chunks.push_back(cuda_chunk{off + i, len, (uint32_t)t});
        }
        off += s.sizes[t];
    }
    s.n = off;
    return s;
}

size_t count_diff(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

void report_exact(const char *what, size_t diff, size_t n)
{
    bool ok = diff == 0 && n > 0;
    printf("%-4s %-44s %zu of %zu elements differ\n", ok ? "ok" : "FAIL", what, diff, n);
    emu::failures += !ok;
}

/* the sum-of-squares launcher: returns the sum, sets *flag */
double run_sumsq(const float *x, size_t n, int *flag)
{
    std::vector<double> sum(1 + emu::GUARD, NAN);
    std::vector<int> nf(1 + emu::GUARD, -1);
    sum[0] = 0.0;
    nf[0] = 0;
    unsigned g = sumsq_grid(n);
    emu::launch(g, OPT_BLOCK, 0, sumsq_check_kernel, nf.data(), x, n);
    emu::launch(1, OPT_BLOCK, 0, sumsq_finish_kernel, sum.data(), g);
    for (int i = 1; i <= emu::GUARD; i++)
        if (!std::isnan(sum[i]) || nf[i] != -1) {
            printf("FAIL sumsq wrote past its outputs\n");
            emu::failures++;
        }
    *flag = nf[0];
    return sum[0];
}

void sumsq_cases()
{
    printf("--- sumsq_check\n");
    for (size_t n : {(size_t)1, (size_t)255, (size_t)3001}) {
        std::vector<float> x(n);
        for (float &v : x)
            v = 3.0f * frand();
        double ref = optim_global_norm(x.data(), n);
        ref *= ref;
        int flag = -1;
        double got = run_sumsq(x.data(), n, &flag);
        std::vector<double> g1{got}, r1{ref};
        char what[64];
        snprintf(what, sizeof what, "sumsq n=%zu", n);
        check(what, g1, r1, 1, 1e-12, false);
        snprintf(what, sizeof what, "sumsq n=%zu finite: flag 0", n);
        bool ok = flag == 0;
        printf("%-4s %s (flag %d)\n", ok ? "ok" : "FAIL", what, flag);
        emu::failures += !ok;
        /* one non-finite value anywhere (the last element: the grid-stride
         * tail) sets the flag */
        for (float bad : {INFINITY, -INFINITY, NAN}) {
            x[n - 1] = bad;
            run_sumsq(x.data(), n, &flag);
            ok = flag == 1;
            printf("%-4s sumsq n=%zu with %g: flag 1 (flag %d)\n", ok ? "ok" : "FAIL", n, bad,
                   flag);
            emu::failures += !ok;
        }
    }
    /* the emulator runs blocks in a shuffled order on every launch: a sum
     * that depended on the order (float atomics) would change its bits */
    std::vector<float> x(8000);
    for (float &v : x)
        v = frand();
    int flag = 0;
    double first = run_sumsq(x.data(), x.size(), &flag);
    bool same = true;
    for (int r = 0; r < 4; r++) {
        double again = run_sumsq(x.data(), x.size(), &flag);
        same &= memcmp(&again, &first, sizeof again) == 0;
    }
    printf("%-4s sumsq n=8000 (%u blocks): same bits in 5 shuffled runs\n", same ? "ok" : "FAIL",
           sumsq_grid(x.size()));
    emu::failures += !same;
}

template <typename TL>
void check_lp(const char *what, const std::vector<TL> &lp, const std::vector<float> &p, size_t n)
{
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) {
        TL r = to_t<TL>(p[i]);
        diff += memcmp(&lp[i], &r, sizeof(TL)) != 0;
    }
    for (size_t i = n; i < n + emu::GUARD; i++)
        diff += !std::isnan(from_t(lp[i]));
    std::string buf = std::string(what) + " (" + emu::tname<TL>() + ", guards NaN)";
    report_exact(buf.c_str(), diff, n);
}

/* One optimizer step on the CPU (optim_step) and on the emulated GPU, from
 * the same state; then the GPU state is compared with the CPU's and both go
 * on from their own values. lp_dt: the 16-bit copy written (KDT_F32: none). */
struct opt_run {
    span s;
    optim_config cfg;
    optim *o = nullptr;
    std::vector<float> p, m, v;      // GPU side
    std::vector<float> cp;           // CPU params (its m, v live in o)
    std::vector<double> norms;

    explicit opt_run(optim_kind kind)
    {
        s = make_span();
        optim_config_default(&cfg, kind);
        cfg.lr = 1e-2f;
        cfg.weight_decay = 0.01f;
        cfg.max_grad_norm = 1.0f;
        cfg.sched = SCHED_CONSTANT;
        cfg.total_steps = 100;
        if (optim_create(&o, &cfg, s.sizes.data(), s.decays.data(), (int)s.sizes.size())) {
            fprintf(stderr, "optim_create failed\n");
            abort();
        }
        p.resize(s.n);
        for (float &x : p)
            x = frand();
        cp = p;
        m.assign(s.n, 0.0f);
        v.assign(s.n, 0.0f);
        norms.assign(2 * s.sizes.size(), NAN);
    }
    ~opt_run() { optim_destroy(o); }

    template <typename TL> void step(int k)
    {
        size_t n = s.n;
        std::vector<float> g(n), cg(n);
        for (size_t i = 0; i < n; i++)
            g[i] = cg[i] = 0.2f * frand(); // global norm > 1: clipping is active
        std::vector<float> p0 = p;
        double lr = 0, gnorm = 0;
        if (optim_step(o, cp.data(), cg.data(), &lr, &gnorm)) {
            fprintf(stderr, "optim_step failed\n");
            abort();
        }
        /* the clip factor optim_step applied, as the GPU caller computes it */
        float clip;
        if (cfg.kind == OPTIM_ADAMW) {
            double coef = (double)cfg.max_grad_norm / (gnorm + 1e-6);
            clip = (float)(coef < 1.0 ? coef : 1.0);
        } else {
            clip = (float)((double)cfg.max_grad_norm /
                           (gnorm > cfg.max_grad_norm ? gnorm : cfg.max_grad_norm));
        }
        long t = o->t;

        std::vector<TL> lp = emu::poisoned<TL>(n);
        void *p_lp = std::is_same<TL, float>::value ? nullptr : lp.data();
        int nc = (int)s.chunks.size();
        if (cfg.kind == OPTIM_ADAMW) {
            adamw_args a = adamw_args_make(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
                                           clip, t);
            emu::launch(nc, OPT_BLOCK, 0, adamw_kernel<TL>, p.data(), p_lp,
                        (const float *)g.data(), m.data(), v.data(),
                        (const cuda_chunk *)s.chunks.data(), (const uint8_t *)s.decay8.data(), a);
        } else {
            lamb_args a = lamb_args_make(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
                                         clip, t);
            std::fill(norms.begin(), norms.end(), NAN); // lamb_norms_kernel writes every entry
            emu::launch(nc, OPT_BLOCK, 0, lamb_moments_kernel, (const float *)p.data(),
                        (const float *)g.data(), m.data(), v.data(),
                        (const cuda_chunk *)s.chunks.data(), (const uint8_t *)s.decay8.data(), a);
            emu::launch((unsigned)s.sizes.size(), OPT_BLOCK, 0, lamb_norms_kernel, norms.data(),
                        (const cuda_chunk *)s.chunks.data(), nc);
            emu::launch(nc, OPT_BLOCK, 0, lamb_apply_kernel<TL>, p.data(), p_lp,
                        (const float *)m.data(), (const float *)v.data(),
                        (const cuda_chunk *)s.chunks.data(), (const uint8_t *)s.decay8.data(),
                        (const double *)norms.data(), a);
        }
        const char *kn = cfg.kind == OPTIM_ADAMW ? "adamw" : "lamb";
        char what[96];
        printf("--- %s step %d (t=%ld, clip %.4f)\n", kn, k, t, clip);
        snprintf(what, sizeof what, "%s m bit-exact", kn);
        report_exact(what, count_diff(m.data(), o->m, n), n);
        snprintf(what, sizeof what, "%s v bit-exact", kn);
        report_exact(what, count_diff(v.data(), o->v, n), n);
        if (cfg.kind == OPTIM_ADAMW) {
            snprintf(what, sizeof what, "%s p bit-exact", kn);
            report_exact(what, count_diff(p.data(), cp.data(), n), n);
        } else {
            std::vector<float> du(n), dref(n);
            for (size_t i = 0; i < n; i++) {
                du[i] = p[i] - p0[i];
                dref[i] = cp[i] - p0[i];
            }
            snprintf(what, sizeof what, "%s update p1 - p0", kn);
            check(what, du, dref, n, 1e-5, false);
            /* each tensor's update on its own: a tensor with a wrong trust
             * ratio could hide in the span's norm */
            size_t off = 0;
            for (size_t tn = 0; tn < s.sizes.size(); off += s.sizes[tn], tn++) {
                if (!s.sizes[tn])
                    continue;
                std::vector<float> a(du.begin() + off, du.begin() + off + s.sizes[tn]),
                    b(dref.begin() + off, dref.begin() + off + s.sizes[tn]);
                snprintf(what, sizeof what, "%s update of tensor %zu (decay %d)", kn, tn,
                         s.decays[tn]);
                check(what, a, b, a.size(), 1e-5, false);
            }
        }
        if (p_lp) {
            snprintf(what, sizeof what, "%s p_lp = rn(p)", kn);
            check_lp(what, lp, p, n);
        }
        /* each side goes on from its own state (already equal or close) */
    }
};

void opt_cases(optim_kind kind)
{
    opt_run r(kind);
    r.step<float>(1);
    r.step<float>(2);
    r.step<__nv_bfloat16>(3);
    r.step<__half>(4);
}

} // namespace

int main()
{
    sumsq_cases();
    opt_cases(OPTIM_ADAMW);
    opt_cases(OPTIM_LAMB);
    printf("%d failure(s)\n", emu::failures);
    return emu::failures ? 1 : 0;
}
