/* Synthetic corpora for the loader tests: documents of sentences whose token
 * ids follow their corpus position (id = 5 + pos % (V - 5)), so a test can
 * tell exactly which source tokens a packed sample holds. Special ids:
 * pad 0, unk 1, cls 2, sep 3, mask 4. */
#ifndef BERTD_TEST_MLM_FIXTURE_H
#define BERTD_TEST_MLM_FIXTURE_H

#include <stdint.h>

#include "loader/corpus.h"

typedef struct synth_corpus {
	corpus_view view;
	void *tokens;       /* (n_tokens,) uint16 or uint32 */
	uint64_t *sent_off; /* (n_sents + 1,) */
	uint64_t *doc_off;  /* (n_docs + 1,) */
} synth_corpus;

typedef struct synth_spec {
	uint32_t n_docs;
	uint32_t min_sents, max_sents; /* per document */
	uint32_t min_len, max_len;     /* tokens per sentence */
	uint32_t empty_doc_every;      /* 0: none; k: every k-th document has no tokens */
	uint32_t vocab_size;           /* >= 6 */
	int token_bytes;               /* 2 or 4 */
	unsigned seed;                 /* for the test's own rand_r */
} synth_spec;

/* Returns 0 or -ENOMEM. */
int synth_build(synth_corpus *c, const synth_spec *spec);
void synth_free(synth_corpus *c);

#endif
