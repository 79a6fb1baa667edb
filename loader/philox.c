/* philox — Philox4x32-10 (see philox.h). Straight from the paper's round
 * function; constants are the published multipliers and Weyl increments. */
#include "loader/philox.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
	uint64_t p = (uint64_t)a * b;
	*hi = (uint32_t)(p >> 32);
	*lo = (uint32_t)p;
}

void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
	uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
	uint32_t k0 = key[0], k1 = key[1];
	for (int round = 0; round < 10; round++) {
		uint32_t hi0, lo0, hi1, lo1;
		mulhilo(PHILOX_M0, c0, &hi0, &lo0);
		mulhilo(PHILOX_M1, c2, &hi1, &lo1);
		uint32_t n0 = hi1 ^ c1 ^ k0;
		uint32_t n2 = hi0 ^ c3 ^ k1;
		c0 = n0;
		c1 = lo1;
		c2 = n2;
		c3 = lo0;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

void philox_block(uint64_t key, uint64_t a, uint64_t b, uint32_t out[4])
{
	uint32_t ctr[4] = {(uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b, (uint32_t)(b >> 32)};
	uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
	philox4x32_10(ctr, k, out);
}

uint32_t philox_below(uint32_t r, uint32_t n)
{
	return (uint32_t)(((uint64_t)r * n) >> 32);
}

float philox_unit(uint32_t r)
{
	return (float)(r >> 8) * (1.0f / 16777216.0f);
}
