/* philox — Philox4x32-10 counter-based RNG (Salmon et al., SC'11), the only
 * source of randomness in the model (dropout). Pure functions of their
 * arguments: no state, no seeding, no allocation. The CUDA twin must produce
 * the same bits for the same (key, counter). */
#include "kernels/kernels.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
        uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

void philox4x32_10_x8(uint32_t out[4][8], const uint32_t ctr0[8], const uint32_t ctr_hi[3],
                      const uint32_t key[2])
{
    /* eight independent counters, lane-major so the compiler vectorizes the
     * 32x32->64 multiplies; bit-identical to eight philox4x32_10 calls */
    uint32_t c0[8], c1[8], c2[8], c3[8];
    for (int l = 0; l < 8; l++) {
        c0[l] = ctr0[l];
        c1[l] = ctr_hi[0];
        c2[l] = ctr_hi[1];
        c3[l] = ctr_hi[2];
    }
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        for (int l = 0; l < 8; l++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[l], p1 = (uint64_t)PHILOX_M1 * c2[l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1;
            c3[l] = (uint32_t)p0;
            c0[l] = n0;
            c2[l] = n2;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int l = 0; l < 8; l++) {
        out[0][l] = c0[l];
        out[1][l] = c1[l];
        out[2][l] = c2[l];
        out[3][l] = c3[l];
    }
}

void philox_stream_init(philox_stream *s, uint64_t seed, uint32_t rank, uint32_t step,
                        uint32_t micro, uint32_t layer, uint32_t site)
{
    /* The seed's high half is folded in so 64-bit seeds stay distinct. */
    s->key[0] = (uint32_t)seed ^ (uint32_t)(seed >> 32);
    s->key[1] = rank;
    s->ctr[0] = step;
    s->ctr[1] = (layer << 8) | (site & 0xFFu);
    s->ctr[2] = micro;
    s->dev_ctr = NULL;
}

uint32_t philox_stream_u32(const philox_stream *s, uint64_t i)
{
    uint32_t ctr[4] = {(uint32_t)(i >> 2), s->ctr[0], s->ctr[1], s->ctr[2]}, out[4];
    philox4x32_10(out, ctr, s->key);
    return out[i & 3];
}

uint32_t dropout_threshold(float p)
{
    if (p <= 0.0f)
        return 0;
    double t = (double)p * 4294967296.0;
    return t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}
