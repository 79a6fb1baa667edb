/* mlm — builds BERT masked-language-model samples and whole batches from a
 * tokenized corpus (an array of corpus_views, one per shard).
 *
 * Everything here is a pure function of (config, corpus, counters): the same
 * global batch number gives byte-identical slots in any process, in any order,
 * which is what lets L loader processes race freely and a resumed job continue
 * from nothing but its step (docs/formats.md). The packing and masking
 * rules are written down in docs/formats.md.
 *
 * Dimension letters as in batch.h: B sequences, T max_seq_length,
 * P max_predictions_per_seq; G consumer ranks, M micro-batches per step.
 *
 * This module must never read or write files (errors are only logged),
 * allocate per batch, or keep an RNG state.
 */
#ifndef BERTD_LOADER_MLM_H
#define BERTD_LOADER_MLM_H

#include <stddef.h>
#include <stdint.h>

#include "loader/batch.h"
#include "loader/corpus.h"

typedef struct mlm_config {
	uint64_t seed;
	uint32_t max_seq_len;        /* T, 8..8192 */
	uint32_t max_pred;           /* P, 1..T; see mlm_config_defaults */
	float mlm_probability;       /* share of maskable tokens predicted (0.15) */
	float mask_replace_prob;     /* of predicted tokens, share set to [MASK] (0.8) */
	float random_replace_prob;   /* of predicted tokens, share set to a random id (0.1) */
	float short_seq_prob;        /* share of samples with a shorter random target (0.1) */
	int nsp;                     /* 1: BERT sentence pairs + NSP labels; 0: full-sentences packing */
	int whole_word_mask;         /* 1: mask whole words (needs is_continuation) */
	/* 0 (default): no corpus token is left out: a sentence longer than
	 * what is left of a sample continues in the next one (full sentences),
	 * or is split into pieces that become segments (NSP). 1: the packing
	 * of whole sentences, where a sentence longer than a sample is cut and
	 * its remainder dropped (full sentences), and sentence pairs are cut
	 * by BERT's truncate_seq_pair (NSP). docs/formats.md has both. */
	int drop_long_sentences;
	/* Bit v (byte v/8, bit v%8) set when vocab id v continues the previous
	 * token's word (WordPiece "##" pieces). Borrowed; NULL without WWM. */
	const uint8_t *is_continuation;
	/* Held-out documents (validation_split_percentage): 0 = none, every
	 * document is in the training split. Otherwise ceil(holdout_pct% of the
	 * non-empty documents), at least 1 and at most all but one, picked by a
	 * permutation keyed by seed; `split` says which side this dataset
	 * indexes. Samples never mix the two sides. */
	uint32_t holdout_pct;        /* 0..99 */
	int split;                   /* MLM_SPLIT_TRAIN or MLM_SPLIT_EVAL */
} mlm_config;

enum { MLM_SPLIT_TRAIN = 0, MLM_SPLIT_EVAL = 1 };

/* Fills the HuggingFace/BERT defaults for max_seq_length T:
 * 0.15 / 0.8 / 0.1, short_seq_prob 0.1, no NSP, no WWM, seed 42, and
 * P = jobspec_default_max_predictions(T, 0.15): 15% of T rounded up to a
 * multiple of 4 (20 at 128, 80 at 512, as in BERT's scripts). */
void mlm_config_defaults(mlm_config *c, uint32_t max_seq_len);

/* A digest of every field that changes batch bytes (not the bitmap's
 * address), for checking that all loaders of a job agree (ring job_tag). */
uint64_t mlm_config_digest(const mlm_config *c);

typedef struct mlm_dataset mlm_dataset;

/* Sample-index counters, fixed at create time. */
typedef struct mlm_stats {
	uint64_t n_samples;          /* samples per epoch */
	uint64_t n_docs;             /* documents with at least one token, in this split */
	uint64_t n_docs_other;       /* non-empty documents of the other split (held out or trained on) */
	uint64_t n_empty_docs;       /* documents skipped for having no tokens */
	uint64_t n_tokens_packed;    /* tokens placed in samples, incl. [CLS]/[SEP] */
	uint64_t n_tokens_corpus;    /* tokens of this split's documents: what an epoch should hold */
	uint64_t n_tokens_other;     /* tokens of the other split's documents (held out or trained on) */
	uint64_t n_tokens_truncated; /* of n_tokens_corpus, tokens no sample of an epoch holds
				      * (only with drop_long_sentences) */
	uint64_t longest_sentence;   /* tokens of this split's longest sentence */
	double pad_fraction;         /* 1 - n_tokens_packed / (n_samples * T) */
	uint64_t index_bytes;        /* sample index each process holds (8 B/sample, 40 with NSP) */
} mlm_stats;

/* Indexes the corpus into samples (one sequential O(sentences) pass; keeps
 * 8 bytes per sample, 40 with NSP). The views and cfg->is_continuation are borrowed
 * and must outlive the dataset; *out is owned by the caller
 * (mlm_dataset_destroy). Errors: -EINVAL bad config (message logged),
 * -EBADMSG malformed view (offsets not monotonic or out of range, special id
 * or token width invalid), -ENODATA no document has a token or the corpus has
 * fewer tokens than one sequence, -ENOMEM. */
int mlm_dataset_create(mlm_dataset **out, const corpus_view *shards, uint32_t n_shards,
		       const mlm_config *cfg);
void mlm_dataset_destroy(mlm_dataset *ds);

const mlm_config *mlm_dataset_config(const mlm_dataset *ds);
void mlm_dataset_stats(const mlm_dataset *ds, mlm_stats *out);

/* 1 when non-empty document number i (of n, counted over the shards in
 * order, empty documents skipped) is held out under cfg (holdout_pct,
 * seed); 0 when cfg holds nothing out. Pure: the same answer in every
 * process. */
int mlm_doc_held_out(const mlm_config *cfg, uint64_t i, uint64_t n);

/* Sample id at position i (< n_samples) of epoch `epoch`: a keyed bijection
 * of [0, n_samples) (Feistel network with cycle-walking; no O(N) state). */
uint64_t mlm_epoch_index(const mlm_dataset *ds, uint64_t epoch, uint64_t i);

/* Lays out sample s (< n_samples) unmasked: ids (T,) and token_type_ids (T,)
 * padded with the pad id / 0; *nsp_label (may be NULL) is 1 when segment B
 * came from a random document. Returns the length (<= T), or -EBADMSG when a
 * token id is >= vocab_size. */
int mlm_sample_pack(const mlm_dataset *ds, uint64_t s, int32_t *ids, int32_t *token_type_ids,
		    int32_t *nsp_label);

/* Masks the len tokens of ids (T,) in place for (epoch, sample s): writes the
 * chosen positions ascending to positions (P,) and the original ids to
 * labels (P,), filling the rest with 0 / BATCH_LABEL_NONE. Returns n_pred. */
int mlm_sample_mask(const mlm_dataset *ds, uint64_t epoch, uint64_t s, int32_t *ids, int32_t len,
		    int32_t *positions, int32_t *labels);

/* Writes the whole slot (header and arrays) of global batch `global` for a
 * job with G ranks and M micro-batches per step into slot (l->slot_bytes,
 * 64-byte aligned). Sequence j of the batch is position global*B + j of the
 * endless stream epoch 0, epoch 1, ... so every batch is full. This is also
 * the serial path for dataloader_num_workers = 0. Returns 0, -EINVAL when l
 * disagrees with the config (T, P) or G/M is 0, -ENODATA when the dataset has
 * fewer than B samples, -EBADMSG on a bad token id. */
int mlm_batch_build(const mlm_dataset *ds, const batch_layout *l, uint32_t G, uint32_t M,
		    uint64_t global, void *slot);

#endif
