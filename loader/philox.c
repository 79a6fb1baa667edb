/* philox — Philox4x32-10 (see philox.h). Straight from the paper's round
 * function; constants are the published multipliers and Weyl increments. */
#include "loader/philox.h"

void philox_block(uint64_t key, uint64_t a, uint64_t b, uint32_t out[4])
{
	uint32_t ctr[4] = {(uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b, (uint32_t)(b >> 32)};
	uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
	philox4x32_10(out, ctr, k);
}

uint32_t philox_below(uint32_t r, uint32_t n)
{
	return (uint32_t)(((uint64_t)r * n) >> 32);
}

float philox_unit(uint32_t r)
{
	return (float)(r >> 8) * (1.0f / 16777216.0f);
}
