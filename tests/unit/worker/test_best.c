/* test_best — best-checkpoint tracking and the retention choice
 * (worker/best.c), and checkpoint_prune on disk (worker/checkpoint.c):
 *  - best_offer: the first finite value is the best; then only a strictly
 *    better one (lower, or greater with greater_is_better); a tie keeps the
 *    earlier step (HF's strict comparison); NaN and inf never become best;
 *  - best_retention: the keep_last newest are kept, the best wherever it
 *    is (so save_total_limit 1 keeps two when the best is not the last),
 *    in any input order; keep_last <= 0 keeps all; protect -1 protects none;
 *  - checkpoint_prune removes exactly the others from a checkpoint root
 *    (and a stale ckpt-*.tmp), never the protected step.
 */
#include "worker/best.h"
#include "worker/checkpoint.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

static void test_offer_lower_is_better(void **state)
{
    (void)state;
    best_state b = best_none();
    assert_int_equal(b.step, -1);
    assert_false(best_offer(&b, 5, NAN, false)); /* not finite: never the best */
    assert_int_equal(b.step, -1);
    assert_true(best_offer(&b, 10, 6.2, false));
    assert_false(best_offer(&b, 20, 7.4, false)); /* worse */
    assert_false(best_offer(&b, 30, 6.2, false)); /* a tie keeps the earlier */
    assert_int_equal(b.step, 10);
    assert_false(best_offer(&b, 35, -INFINITY, false));
    assert_true(best_offer(&b, 40, 6.1, false));
    assert_int_equal(b.step, 40);
    assert_true(b.value == 6.1);
}

static void test_offer_greater_is_better(void **state)
{
    (void)state;
    best_state b = best_none();
    assert_true(best_offer(&b, 5, 0.10, true));
    assert_false(best_offer(&b, 10, 0.05, true));
    assert_false(best_offer(&b, 15, INFINITY, true));
    assert_true(best_offer(&b, 20, 0.30, true));
    assert_false(best_offer(&b, 25, 0.30, true));
    assert_int_equal(b.step, 20);
}

static size_t kept_steps(const long *steps, size_t n, int keep_last, long protect, long *out)
{
    bool keep[16];
    size_t k = best_retention(steps, n, keep_last, protect, keep), m = 0;
    for (size_t i = 0; i < n; i++)
        if (keep[i])
            out[m++] = steps[i];
    assert_int_equal(m, k);
    return m;
}

static void test_retention(void **state)
{
    (void)state;
    long out[16];
    const long s[] = {20, 5, 15, 10}; /* any order */
    /* limit 1, best is the oldest: the newest and the best */
    assert_int_equal(kept_steps(s, 4, 1, 5, out), 2);
    assert_int_equal(out[0], 20);
    assert_int_equal(out[1], 5);
    /* limit 1, the newest is the best: only it */
    assert_int_equal(kept_steps(s, 4, 1, 20, out), 1);
    assert_int_equal(out[0], 20);
    /* limit 2, best among them: the two newest */
    assert_int_equal(kept_steps(s, 4, 2, 15, out), 2);
    assert_int_equal(out[0], 20);
    assert_int_equal(out[1], 15);
    /* limit 2, best older: three */
    assert_int_equal(kept_steps(s, 4, 2, 10, out), 3);
    /* no best: the newest keep_last */
    assert_int_equal(kept_steps(s, 4, 3, -1, out), 3);
    assert_int_equal(out[0], 20);
    assert_int_equal(out[1], 15);
    assert_int_equal(out[2], 10);
    /* no limit: all */
    assert_int_equal(kept_steps(s, 4, 0, -1, out), 4);
    /* a best that is not among them changes nothing */
    assert_int_equal(kept_steps(s, 4, 1, 99, out), 1);
    assert_int_equal(kept_steps(s, 0, 1, 5, out), 0);
}

/* A directory that looks like a complete checkpoint to the pruner. */
static void make_ckpt(const char *root, const char *name, bool done)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, name);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/%s/%s", root, name, done ? "DONE" : "params.safetensors");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
}

static bool exists(const char *root, const char *name)
{
    char p[512];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", root, name);
    return stat(p, &sb) == 0;
}

static void test_prune_on_disk(void **state)
{
    (void)state;
    char root[] = "/tmp/bertd-best-XXXXXX";
    assert_non_null(mkdtemp(root));
    const char *names[] = {"ckpt-5", "ckpt-10", "ckpt-15", "ckpt-20"};
    for (int i = 0; i < 4; i++)
        make_ckpt(root, names[i], true);
    make_ckpt(root, "ckpt-25.tmp", false);
    checkpoint_prune(root, 1, 5);
    assert_true(exists(root, "ckpt-5"));  /* the best */
    assert_true(exists(root, "ckpt-20")); /* the newest */
    assert_false(exists(root, "ckpt-10"));
    assert_false(exists(root, "ckpt-15"));
    assert_false(exists(root, "ckpt-25.tmp"));
    /* the best moves on: the old one is an ordinary checkpoint again */
    make_ckpt(root, "ckpt-30", true);
    checkpoint_prune(root, 1, 30);
    assert_false(exists(root, "ckpt-5"));
    assert_false(exists(root, "ckpt-20"));
    assert_true(exists(root, "ckpt-30"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offer_lower_is_better),
        cmocka_unit_test(test_offer_greater_is_better),
        cmocka_unit_test(test_retention),
        cmocka_unit_test(test_prune_on_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
