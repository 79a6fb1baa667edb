/* comm_ranks — the comm tests' shared rank-process helpers (comm_ranks.h).
 * Test-only; never linked into a product binary. */
#include "comm_ranks.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <cmocka.h>

uint64_t comm_ranks_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

float comm_ranks_value(int rank, int iter, size_t i)
{
    uint64_t h = comm_ranks_mix(((uint64_t)rank << 48) ^ ((uint64_t)iter << 32) ^ (uint64_t)i ^
                                0x9e3779b97f4a7c15ull);
    float mant = 1.0f + (float)(h & 0xffffff) / 16777216.0f;
    int e = (int)((h >> 24) % 17) - 8;
    return ((h >> 40) & 1 ? -1.0f : 1.0f) * ldexpf(mant, e);
}

void *comm_ranks_shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 0, bytes);
    return p;
}

int comm_ranks_code_of(int rc)
{
    return rc == -EPIPE ? RC_EPIPE : rc == -ETIMEDOUT ? RC_ETIMEDOUT : rc == -EPROTO ? RC_EPROTO : RC_OTHER;
}
