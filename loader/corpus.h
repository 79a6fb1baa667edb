/* corpus — a read-only view of tokenized text with sentence and document
 * boundaries: what a token shard (shard.h) exposes once mmap'ed, and what the
 * MLM sample builder (mlm.h) consumes. Nothing here owns memory.
 *
 * Sentence s spans tokens [sent_off[s], sent_off[s+1]); document d spans
 * sentences [doc_off[d], doc_off[d+1]). Both arrays have one more entry than
 * they have items, and are monotonic.
 */
#ifndef BERTD_LOADER_CORPUS_H
#define BERTD_LOADER_CORPUS_H

#include <stdint.h>

typedef struct corpus_special {
	uint32_t pad, unk, cls, sep, mask; /* token ids in the dataset's vocab */
} corpus_special;

typedef struct corpus_view {
	const void *tokens;      /* (n_tokens,) uint16 or uint32, little-endian */
	int token_bytes;         /* 2 or 4 */
	uint64_t n_tokens;
	const uint64_t *sent_off; /* (n_sents + 1,) token offsets */
	uint64_t n_sents;
	const uint64_t *doc_off;  /* (n_docs + 1,) sentence offsets */
	uint64_t n_docs;
	uint32_t vocab_size;
	corpus_special special;
} corpus_view;

/* Token i of the view (no bounds check: i < n_tokens is the caller's job). */
uint32_t corpus_token(const corpus_view *c, uint64_t i);

#endif
