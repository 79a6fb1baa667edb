/* Philox4x32-10 against the Random123 known-answer vectors (kat_vectors,
 * Random123 1.14), plus the helpers' ranges. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loader/philox.h"

static void test_kat(void **state)
{
	(void)state;
	static const struct {
		uint32_t ctr[4], key[2], want[4];
	} kat[] = {
		{{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
		 {0xffffffff, 0xffffffff},
		 {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
		 {0xa4093822, 0x299f31d0},
		 {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	};
	for (size_t i = 0; i < sizeof(kat) / sizeof(kat[0]); i++) {
		uint32_t out[4];
		philox4x32_10(out, kat[i].ctr, kat[i].key);
		for (int j = 0; j < 4; j++)
			assert_int_equal(out[j], kat[i].want[j]);
	}
}

static void test_block_matches_raw(void **state)
{
	(void)state;
	uint32_t a[4], b[4];
	philox_block(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull, a);
	philox4x32_10(b, (const uint32_t[4]){0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
		      (const uint32_t[2]){0xa4093822, 0x299f31d0});
	for (int j = 0; j < 4; j++)
		assert_int_equal(a[j], b[j]);
}

static void test_helpers_range(void **state)
{
	(void)state;
	assert_int_equal(philox_below(0xffffffffu, 10), 9);
	assert_int_equal(philox_below(0, 10), 0);
	assert_true(philox_unit(0xffffffffu) < 1.0f);
	assert_true(philox_unit(0) == 0.0f);
	/* below() over a full block sweep hits every bucket about equally */
	uint32_t hist[7] = {0};
	for (uint32_t i = 0; i < 70000; i++) {
		uint32_t out[4];
		philox_block(7, i, 0, out);
		hist[philox_below(out[0], 7)]++;
	}
	for (int k = 0; k < 7; k++) /* mean 10000, sd ~93: 6 sigma */
		assert_true(hist[k] > 9440 && hist[k] < 10560);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kat),
		cmocka_unit_test(test_block_matches_raw),
		cmocka_unit_test(test_helpers_range),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
