/* test_mix — the mixture interleave and its batches (loader/mix.h):
 * realised proportions over an epoch within 1% of the asked ones, each
 * component's own epochs are whole permutations, batches are identical in
 * another process and in any order, and a one-component mixture is the
 * plain dataset's batch stream byte for byte. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "loader/mix.h"
#include "loader/mlm.h"
#include "test_mlm_fixture.h"

#define NT 64
#define NB 8
#define NBATCH 40

/* Over a mixture epoch, component k's share is within 1% (relative) of
 * proportions[k]; and every prefix stays within K positions of its share. */
static void check_proportions(const double *prop, uint32_t K, uint64_t n_ref)
{
	mix_schedule m;
	assert_int_equal(mix_schedule_init(&m, prop, K), 0);
	uint64_t n[MIX_MAX];
	for (uint32_t k = 0; k < K; k++)
		n[k] = n_ref;
	uint64_t E = mix_epoch_length(&m, n);
	uint64_t count[MIX_MAX] = {0};
	for (uint64_t p = 0; p < E; p++) {
		uint64_t r;
		uint32_t k = mix_locate(&m, p, &r);
		assert_true(k < K);
		/* ranks are consecutive: the component's own stream, no gap, no repeat */
		assert_int_equal(r, count[k]);
		count[k]++;
		for (uint32_t j = 0; j < K; j++) {
			double want = (double)(p + 1) * prop[j];
			assert_true((double)count[j] < want + K + 1 && (double)count[j] > want - K - 1);
		}
	}
	for (uint32_t k = 0; k < K; k++) {
		double got = (double)count[k] / (double)E;
		print_message("K=%u epoch %llu: component %u asked %.6f realised %.6f (%+.4f%% relative)\n", K,
			      (unsigned long long)E, k, prop[k], got, 100.0 * (got - prop[k]) / prop[k]);
		if (!(got >= prop[k] * 0.99 && got <= prop[k] * 1.01))
			fail_msg("component %u: realised %.6f, asked %.6f over %llu", k, got, prop[k],
				 (unsigned long long)E);
	}
}

static void test_proportions(void **state)
{
	(void)state;
	const double a[] = {0.7, 0.3};
	const double b[] = {0.5, 0.3, 0.2};
	const double c[] = {0.05, 0.95};
	const double d[] = {0.25, 0.25, 0.25, 0.125, 0.125};
	check_proportions(a, 2, 1000);
	check_proportions(b, 3, 5000);
	check_proportions(c, 2, 3000);
	check_proportions(d, 5, 2000);
	/* the largest-proportion component goes once through its epoch */
	mix_schedule m;
	assert_int_equal(mix_schedule_init(&m, a, 2), 0);
	uint64_t n[2] = {700, 1000000};
	assert_int_equal(mix_epoch_length(&m, n), 1000);
}

static void test_schedule_init_refuses(void **state)
{
	(void)state;
	mix_schedule m;
	const double bad[] = {0.5, 0.0};
	assert_int_equal(mix_schedule_init(&m, bad, 2), -EINVAL);
	assert_int_equal(mix_schedule_init(&m, bad, 0), -EINVAL);
	const double ok[] = {1.0 / 3, 1.0 / 3, 1.0 / 3};
	assert_int_equal(mix_schedule_init(&m, ok, 3), 0);
	assert_int_equal(m.w[0] + m.w[1] + m.w[2], MIX_SCALE);
}

static struct {
	synth_corpus sc[3];
	mlm_dataset *ds[3];
	batch_layout l;
	mix_schedule m;
} fx;

static int setup(void **state)
{
	(void)state;
	for (int k = 0; k < 3; k++) {
		synth_spec sp = {.n_docs = 40 + 30 * (uint32_t)k, .min_sents = 1, .max_sents = 6, .min_len = 1,
				 .max_len = 30, .vocab_size = 30522, .token_bytes = 2, .seed = 11u + (unsigned)k};
		if (synth_build(&fx.sc[k], &sp))
			return -1;
		mlm_config cfg;
		mlm_config_defaults(&cfg, NT);
		cfg.seed = mix_component_seed(99, (uint32_t)k, 3);
		if (mlm_dataset_create(&fx.ds[k], &fx.sc[k].view, 1, &cfg))
			return -1;
	}
	const double prop[] = {0.6, 0.3, 0.1};
	if (mix_schedule_init(&fx.m, prop, 3) || batch_layout_init(&fx.l, NB, NT, 12))
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int k = 0; k < 3; k++) {
		mlm_dataset_destroy(fx.ds[k]);
		synth_free(&fx.sc[k]);
	}
	return 0;
}

/* Batches 0..NBATCH-1 built in order here and in reverse order in a child
 * process are the same bytes. */
static void test_batches_identical_across_processes_and_orders(void **state)
{
	(void)state;
	size_t sz = fx.l.slot_bytes;
	uint8_t *here = aligned_alloc(BATCH_ALIGN, sz * NBATCH);
	uint8_t *there = mmap(NULL, sz * NBATCH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_non_null(here);
	assert_true(there != MAP_FAILED);
	for (uint64_t n = 0; n < NBATCH; n++)
		assert_int_equal(mix_batch_build((const mlm_dataset *const *)fx.ds, &fx.m, &fx.l, 2, 2, n,
						 here + n * sz), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		for (uint64_t n = NBATCH; n-- > 0;)
			if (mix_batch_build((const mlm_dataset *const *)fx.ds, &fx.m, &fx.l, 2, 2, n,
					    there + n * sz))
				_exit(1);
		_exit(0);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_memory_equal(here, there, sz * NBATCH);
	/* a different mixture gives different batches (the test can fail) */
	const double other[] = {0.2, 0.3, 0.5};
	mix_schedule m2;
	assert_int_equal(mix_schedule_init(&m2, other, 3), 0);
	assert_int_equal(mix_batch_build((const mlm_dataset *const *)fx.ds, &m2, &fx.l, 2, 2, 0, there), 0);
	assert_true(memcmp(here, there, sz) != 0);
	free(here);
	munmap(there, sz * NBATCH);
}

/* Sequence j of each batch is exactly component k's sample at its own
 * stream position (mix_locate), packed and masked as mlm does; over one
 * epoch of the smallest component every one of its samples appears once. */
static void test_sequences_come_from_their_component(void **state)
{
	(void)state;
	mlm_stats st[3];
	for (int k = 0; k < 3; k++)
		mlm_dataset_stats(fx.ds[k], &st[k]);
	uint8_t *slot = aligned_alloc(BATCH_ALIGN, fx.l.slot_bytes);
	int32_t ids[NT], tt[NT], nsp, pos[12], lab[12];
	uint64_t n2 = st[2].n_samples;
	uint8_t *seen = calloc(n2, 1);
	uint64_t seen2 = 0;
	for (uint64_t n = 0; seen2 < n2 && n < 100000; n++) {
		assert_int_equal(mix_batch_build((const mlm_dataset *const *)fx.ds, &fx.m, &fx.l, 1, 1, n, slot), 0);
		const int32_t *bids = (const int32_t *)((uint8_t *)slot + fx.l.off_input_ids);
		for (uint32_t j = 0; j < NB; j++) {
			uint64_t r;
			uint32_t k = mix_locate(&fx.m, n * NB + j, &r);
			uint64_t e = r / st[k].n_samples, s = mlm_epoch_index(fx.ds[k], e, r % st[k].n_samples);
			int len = mlm_sample_pack(fx.ds[k], s, ids, tt, &nsp);
			mlm_sample_mask(fx.ds[k], e, s, ids, len, pos, lab);
			assert_memory_equal(bids + (size_t)j * NT, ids, sizeof ids);
			if (k == 2 && e == 0) {
				assert_int_equal(seen[s], 0);
				seen[s] = 1;
				seen2++;
			}
		}
	}
	assert_int_equal(seen2, n2);
	free(seen);
	free(slot);
}

/* One component: the plain dataset's batches, byte for byte. */
static void test_one_component_is_the_dataset(void **state)
{
	(void)state;
	mlm_config cfg;
	mlm_config_defaults(&cfg, NT);
	cfg.seed = mix_component_seed(99, 0, 1);
	assert_int_equal(cfg.seed, 99);
	mlm_dataset *d = NULL;
	assert_int_equal(mlm_dataset_create(&d, &fx.sc[0].view, 1, &cfg), 0);
	mix_schedule one;
	const double p1[] = {1.0};
	assert_int_equal(mix_schedule_init(&one, p1, 1), 0);
	uint8_t *a = aligned_alloc(BATCH_ALIGN, fx.l.slot_bytes), *b = aligned_alloc(BATCH_ALIGN, fx.l.slot_bytes);
	for (uint64_t n = 0; n < NBATCH; n++) {
		assert_int_equal(mlm_batch_build(d, &fx.l, 2, 1, n, a), 0);
		assert_int_equal(mix_batch_build((const mlm_dataset *const *)&d, &one, &fx.l, 2, 1, n, b), 0);
		assert_memory_equal(a, b, fx.l.slot_bytes);
	}
	free(a);
	free(b);
	mlm_dataset_destroy(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_proportions),
		cmocka_unit_test(test_schedule_init_refuses),
		cmocka_unit_test(test_batches_identical_across_processes_and_orders),
		cmocka_unit_test(test_sequences_come_from_their_component),
		cmocka_unit_test(test_one_component_is_the_dataset),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
