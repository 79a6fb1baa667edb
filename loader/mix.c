/* mix — the interleave of a mixture's components and its batches (mix.h). */
#include "loader/mix.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/log.h"
#include "common/sha256.h"

int mix_schedule_init(mix_schedule *m, const double *proportions, uint32_t K)
{
	memset(m, 0, sizeof(*m));
	if (K < 1 || K > MIX_MAX)
		return -EINVAL;
	double sum = 0;
	for (uint32_t k = 0; k < K; k++) {
		if (!(proportions[k] > 0) || !isfinite(proportions[k]))
			return -EINVAL;
		sum += proportions[k];
	}
	/* largest remainder: floor each share, then hand the units left to the
	 * largest fractions (lowest index first on ties) */
	double frac[MIX_MAX];
	uint64_t used = 0;
	for (uint32_t k = 0; k < K; k++) {
		double x = proportions[k] / sum * MIX_SCALE;
		m->w[k] = (uint64_t)floor(x);
		if (m->w[k] < 1)
			m->w[k] = 1;
		frac[k] = x - floor(x);
		used += m->w[k];
	}
	while (used < MIX_SCALE) {
		uint32_t best = 0;
		for (uint32_t k = 1; k < K; k++)
			if (frac[k] > frac[best])
				best = k;
		m->w[best]++;
		frac[best] = -1;
		used++;
	}
	while (used > MIX_SCALE) { /* only when a tiny share was raised to 1 */
		uint32_t big = 0;
		for (uint32_t k = 1; k < K; k++)
			if (m->w[k] > m->w[big])
				big = k;
		m->w[big]--;
		used--;
	}
	m->K = K;
	uint64_t r = 0;
	for (uint32_t k = K; k-- > 0;) {
		r += m->w[k];
		m->rest[k] = r;
	}
	return 0;
}

/* ceil(p * w / r) without overflow: how many of positions [0, p) a
 * component of share w of r takes */
static uint64_t taken_before(uint64_t p, uint64_t w, uint64_t r)
{
	unsigned __int128 x = (unsigned __int128)p * w + (r - 1);
	return (uint64_t)(x / r);
}

uint32_t mix_locate(const mix_schedule *m, uint64_t p, uint64_t *rank)
{
	for (uint32_t k = 0; k + 1 < m->K; k++) {
		uint64_t before = taken_before(p, m->w[k], m->rest[k]);
		if (taken_before(p + 1, m->w[k], m->rest[k]) > before) {
			*rank = before;
			return k;
		}
		p -= before; /* p's rank among the positions the later components share */
	}
	*rank = p;
	return m->K - 1;
}

uint64_t mix_epoch_length(const mix_schedule *m, const uint64_t *n_samples)
{
	uint32_t ref = 0;
	for (uint32_t k = 1; k < m->K; k++)
		if (m->w[k] > m->w[ref])
			ref = k;
	unsigned __int128 x = (unsigned __int128)n_samples[ref] * MIX_SCALE + (m->w[ref] - 1);
	return (uint64_t)(x / m->w[ref]);
}

uint64_t mix_component_seed(uint64_t seed, uint32_t k, uint32_t K)
{
	if (K <= 1)
		return seed;
	uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return z & 0x7fffffffffffffffull; /* a job seed's range */
}

uint64_t mix_digest(const mix_schedule *m)
{
	if (m->K <= 1)
		return 0;
	sha256_ctx h;
	uint8_t d[32];
	sha256_init(&h);
	sha256_update(&h, "mix-v1", 6);
	sha256_update(&h, &m->K, sizeof(m->K));
	sha256_update(&h, m->w, sizeof(m->w[0]) * m->K);
	sha256_final(&h, d);
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | d[i];
	return v;
}

int mix_batch_build(const mlm_dataset *const *ds, const mix_schedule *m, const batch_layout *l,
		    uint32_t G, uint32_t M, uint64_t global, void *slot)
{
	if (G == 0 || M == 0 || m->K < 1)
		return -EINVAL;
	uint64_t n_samples[MIX_MAX];
	for (uint32_t k = 0; k < m->K; k++) {
		const mlm_config *cfg = mlm_dataset_config(ds[k]);
		if (l->T != cfg->max_seq_len || l->P != cfg->max_pred ||
		    cfg->nsp != mlm_dataset_config(ds[0])->nsp)
			return -EINVAL;
		mlm_stats st;
		mlm_dataset_stats(ds[k], &st);
		n_samples[k] = st.n_samples;
		if (n_samples[k] == 0) {
			log_error("mix: component %u has no sample", k);
			return -ENODATA;
		}
	}
	uint8_t *base = slot;
	batch_header *h = slot;
	batch_header_init(h, l, global, G, M, mlm_dataset_config(ds[0])->nsp);
	h->epoch = global * l->B / mix_epoch_length(m, n_samples);
	int32_t *ids = (int32_t *)(base + l->off_input_ids);       /* (B, T) */
	int32_t *tt = (int32_t *)(base + l->off_token_type_ids);   /* (B, T) */
	int32_t *lens = (int32_t *)(base + l->off_seq_lens);       /* (B,) */
	int32_t *pos = (int32_t *)(base + l->off_mlm_positions);   /* (B, P) */
	int32_t *lab = (int32_t *)(base + l->off_mlm_labels);      /* (B, P) */
	int32_t *nsp = (int32_t *)(base + l->off_nsp_labels);      /* (B,) */
	int32_t *npred = (int32_t *)(base + l->off_n_pred);        /* (B,) */
	uint64_t n_tokens = 0, n_pred_total = 0;
	for (uint32_t j = 0; j < l->B; j++) {
		uint64_t r;
		uint32_t k = mix_locate(m, global * l->B + j, &r);
		uint64_t epoch = r / n_samples[k];
		uint64_t s = mlm_epoch_index(ds[k], epoch, r % n_samples[k]);
		int len = mlm_sample_pack(ds[k], s, ids + (size_t)j * l->T, tt + (size_t)j * l->T, nsp + j);
		if (len < 0)
			return len;
		lens[j] = len;
		npred[j] = mlm_sample_mask(ds[k], epoch, s, ids + (size_t)j * l->T, len,
					   pos + (size_t)j * l->P, lab + (size_t)j * l->P);
		n_tokens += (uint64_t)len;
		n_pred_total += (uint64_t)npred[j];
	}
	h->n_tokens = (uint32_t)n_tokens;
	h->n_pred = (uint32_t)n_pred_total;
	batch_zero_gaps(slot, l);
	return 0;
}
