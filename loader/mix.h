/* mix — a job's batches drawn from a mixture of datasets with proportions
 * (docs/formats.md "Mixtures"), built above one mlm_dataset per component.
 *
 * Position p of the job's sample stream (sequence j of global batch n is
 * p = n*B + j, as for one dataset) goes to one component by a deterministic
 * low-discrepancy interleave: component 0 takes the positions where
 * ceil(p * w0 / R0) steps up (R0 = the sum of every weight), the rest go on
 * to component 1 with their rank among the rest, and so on; so the count of
 * component k among the first N positions is within K of N * w_k / SCALE at
 * every N. The rank r of p within its component is that component's own
 * stream position: its epoch r / n_k and the permutation of that epoch, its
 * masking, exactly as a job on that dataset alone. Everything is a pure
 * function of (weights, the components, p): any process, any order.
 *
 * An epoch of a mixture is mix_epoch_length positions: the number in which
 * the component with the largest proportion (the first such) goes once
 * through its own epoch; the others go through theirs proportionally more
 * or fewer times.
 *
 * Must never read files, allocate, log per batch, or keep state between
 * calls.
 */
#ifndef BERTD_LOADER_MIX_H
#define BERTD_LOADER_MIX_H

#include <stdint.h>

#include "loader/batch.h"
#include "loader/mlm.h"

#define MIX_MAX 16               /* components; JOBSPEC_MAX_DATASETS */
#define MIX_SCALE 1000000u       /* weights are proportions in millionths */

typedef struct mix_schedule {
	uint32_t K;                  /* components, 1..MIX_MAX */
	uint64_t w[MIX_MAX];         /* (K,) integer weights >= 1, summing to MIX_SCALE */
	uint64_t rest[MIX_MAX];      /* (K,) rest[k] = w[k] + ... + w[K-1] */
} mix_schedule;

/* Quantizes proportions (K,) (each > 0, summing to 1 within 1e-6) into
 * weights of MIX_SCALE (largest remainder, each at least 1). Returns 0, or
 * -EINVAL for K outside 1..MIX_MAX or a proportion that is not > 0. */
int mix_schedule_init(mix_schedule *m, const double *proportions, uint32_t K);

/* The component of stream position p, and in *rank p's position within
 * that component's own stream (how many earlier positions it has). */
uint32_t mix_locate(const mix_schedule *m, uint64_t p, uint64_t *rank);

/* Positions in one epoch of the mixture, given each component's samples
 * per epoch n_samples (K,): ceil(n_ref * SCALE / w_ref), ref the first
 * component of the largest weight. */
uint64_t mix_epoch_length(const mix_schedule *m, const uint64_t *n_samples);

/* The seed component k's masking, permutation and held-out split use:
 * seed itself when K is 1 (a job on one dataset keeps its batches), else a
 * SplitMix64 of (seed, k), so two components never share their draws. */
uint64_t mix_component_seed(uint64_t seed, uint32_t k, uint32_t K);

/* A digest of the weights, mixed into the ring's job_tag (0 when K is 1). */
uint64_t mix_digest(const mix_schedule *m);

/* Writes global batch `global` of a job with G ranks and M micro-batches
 * into slot, sequence j at stream position global*B + j taken from the
 * component mix_locate names (ds (K,), each built with that component's
 * config; T and P equal). The header's epoch is the mixture's epoch of the
 * batch's first position. Same contract and errors as mlm_batch_build;
 * -ENODATA when a component has no sample. */
int mix_batch_build(const mlm_dataset *const *ds, const mix_schedule *m, const batch_layout *l,
		    uint32_t G, uint32_t M, uint64_t global, void *slot);

#endif
