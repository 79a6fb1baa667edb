/* philox — Philox4x32-10 counter-based random numbers (Salmon et al., SC'11,
 * "Parallel random numbers: as easy as 1, 2, 3"), the only randomness the
 * loader uses: every choice is philox(key = seed, counter = what is being
 * decided), so any batch can be rebuilt by any process in any order.
 *
 * Must never hold state: there is no "next" function on purpose.
 */
#ifndef BERTD_LOADER_PHILOX_H
#define BERTD_LOADER_PHILOX_H

#include <stdint.h>

/* One Philox4x32-10 block: out = philox(ctr, key). Defined once, in
 * kernels/cpu/philox.c (philox_lib), so dropout masks and batch choices
 * come from the same code; this is the same declaration as kernels.h's.
 * Matches the Random123 known-answer vectors (tests/unit/loader/test_philox.c). */
void philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]);

/* Convenience: the block for counter (a, b) under a 64-bit key, with the two
 * 64-bit counter halves split into 32-bit words little-end first. */
void philox_block(uint64_t key, uint64_t a, uint64_t b, uint32_t out[4]);

/* Uniform integer in [0, n) from one 32-bit draw (Lemire's multiply-shift;
 * bias below 2^-32 * n, irrelevant for n << 2^32). n must be > 0. */
uint32_t philox_below(uint32_t r, uint32_t n);

/* Uniform float in [0, 1) with 24 random bits. */
float philox_unit(uint32_t r);

#endif
