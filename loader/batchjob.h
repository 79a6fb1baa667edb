/* batchjob — what a job's batch pipeline is, derived once from the job file
 * (docs/formats.md: job.json) so that every bertd-loader and every
 * bertd-worker of the job computes the same MLM options, ring geometry and
 * start/end batch, and opens the same dataset.
 *
 * Batch numbering (docs/formats.md): global batch n = (step*M + micro)*G
 * + rank, G = world_size, M = gradient_accumulation_steps; a job resumed from
 * checkpoints/ckpt-<k> starts at step k (k steps are done), n = k*M*G, and
 * ends before max_steps*M*G.
 *
 * Never talks to the daemon and never writes files.
 */
#ifndef BERTD_LOADER_BATCHJOB_H
#define BERTD_LOADER_BATCHJOB_H

#include <jansson.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "loader/mix.h"
#include "loader/mlm.h"
#include "loader/ring.h"
#include "loader/shard.h"

typedef struct batchjob {
	jobspec spec;
	char job_id[128];
	char dataset_dir[4096];  /* the dataset; a mixture's first component */
	uint32_t n_datasets;     /* K: 1, or a mixture's components (spec.datasets) */
	char dataset_dirs[MIX_MAX][4096]; /* (K,) "dataset_dirs" of the job file, or dataset_dir */
	mix_schedule mix;        /* K weights from spec.datasets' proportions */
	char shm_name[RING_NAME_MAX];
	uint32_t world_size;     /* G */
	int64_t start_step;      /* 0, or k from resume_from ".../ckpt-<k>" */
	mlm_config mlm;          /* is_continuation set by batchjob_data_open */
	ring_params ring;        /* G, S, M, layout (B, T, P), start/end batch, job_tag */
} batchjob;

/* Fills *out from a parsed job file. A mixture (spec "dataset" a list) has
 * "dataset_dirs", one per component in the spec's order. Returns 0, or
 * -EINVAL with the reason logged (missing key,
 * spec not in effective form, a geometry the slot format cannot hold).
 * Pure apart from logging. */
int batchjob_from_json(const json_t *job, batchjob *out);

/* Reads and parses the job file at path, then batchjob_from_json. -errno
 * when it cannot be read, -EBADMSG when it is not JSON. */
int batchjob_load(const char *path, batchjob *out);
/* A multi-node job's ring on one node, fed by loaders started there: it
 * carries world ranks first .. first + count - 1 (ring.h's W and R0), its
 * start and end count that node's batches, and its name gets "-<tag>"
 * (the attempt and the node: two nodes may share /dev/shm, and a killed
 * attempt's ring must not be met again). 0, or -EINVAL (said in the log)
 * for ranks outside the world or a tag that does not fit a ring name. */
int batchjob_ring_on_node(batchjob *bj, uint32_t first, uint32_t count, const char *tag);
/* BERTD_RING_NODE="<first>,<count>,<tag>" (set by the rank that starts a
 * node's loaders, for them and its node's ranks) into batchjob_ring_on_node;
 * 0 when it is not set, -EINVAL when it is malformed. */
int batchjob_ring_from_env(batchjob *bj);

/* Component k's MLM options: bj->mlm with the component's seed
 * (mix_component_seed) and the given split. */
mlm_config batchjob_component_config(const batchjob *bj, uint32_t k, int split);

/* The dataset side: shards mapped, WWM bitmap, sample index; one of each
 * per component of a mixture. */
typedef struct batchjob_data {
	shard_dataset *shards;   /* component 0's (the dataset of a job on one) */
	uint8_t *continuation;   /* (vocab_size/8 + 1,) from the vocab.txt, shared by all */
	mlm_dataset *ds;         /* component 0's */
	uint32_t n;              /* components */
	shard_dataset *part_shards[MIX_MAX];   /* (n,) */
	mlm_dataset *part_ds[MIX_MAX];         /* (n,) */
	const mix_schedule *mix; /* bj's */
} batchjob_data;

/* Opens every dataset dir (shard_dataset_open), builds the "##" bitmap
 * from the vocab.txt when whole_word_mask is on, and indexes the samples.
 * Refuses a dataset with fewer samples than one batch, and a mixture whose
 * components' vocabs differ (the token ids would mean different words).
 * Returns 0 (caller owns *out, batchjob_data_close), -ENODATA / -EBADMSG /
 * -errno for dataset problems (logged), -EINVAL for options the data cannot
 * serve or vocabs that differ. */
int batchjob_data_open(batchjob *bj, batchjob_data *out);
void batchjob_data_close(batchjob_data *d);

/* Global batch `global` of the job into slot: mlm_batch_build on one
 * dataset, mix_batch_build on a mixture (same contract). */
int batchjob_batch_build(const batchjob_data *d, const batch_layout *l, uint32_t G, uint32_t M,
			 uint64_t global, void *slot);

/* profiler.simulate_data_delay_ms: sleeps that long (0 = returns at once; a
 * signal cuts the sleep short),
 * called once per batch by whoever builds it — each loader, or the worker on
 * the serial path — so a slow data source (network storage, a cold page
 * cache) can be had on demand. A sleep, not CPU work: it models waiting for
 * storage, which parallel loaders hide and the serial path cannot. */
void batchjob_simulated_delay(const batchjob *bj);

/* Bit v set when line v of the vocab file starts with "##". Returns a new
 * bitmap of vocab_size/8 + 1 bytes (caller frees), or NULL (logged). */
uint8_t *batchjob_continuation_bitmap(const char *vocab_path, uint32_t vocab_size);

#endif
