/* Synthetic corpora for loader tests (see test_mlm_fixture.h). */
#include "test_mlm_fixture.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t between(unsigned *st, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rand_r(st) % (hi - lo + 1));
}

int synth_build(synth_corpus *c, const synth_spec *sp)
{
	memset(c, 0, sizeof(*c));
	unsigned st = sp->seed;
	uint64_t n_sents = 0, n_tokens = 0;
	/* first pass: sizes, replayed with the same seed below */
	for (uint32_t d = 0; d < sp->n_docs; d++) {
		int empty = sp->empty_doc_every && (d % sp->empty_doc_every) == sp->empty_doc_every - 1;
		uint32_t ns = between(&st, sp->min_sents, sp->max_sents);
		n_sents += ns;
		for (uint32_t s = 0; s < ns; s++) {
			uint32_t len = between(&st, sp->min_len, sp->max_len);
			if (!empty)
				n_tokens += len;
		}
	}
	c->tokens = malloc((size_t)(n_tokens ? n_tokens : 1) * (size_t)sp->token_bytes);
	c->sent_off = malloc(sizeof(uint64_t) * (n_sents + 1));
	c->doc_off = malloc(sizeof(uint64_t) * (sp->n_docs + 1));
	if (!c->tokens || !c->sent_off || !c->doc_off) {
		synth_free(c);
		return -ENOMEM;
	}
	st = sp->seed;
	uint64_t si = 0, ti = 0;
	c->sent_off[0] = 0;
	for (uint32_t d = 0; d < sp->n_docs; d++) {
		int empty = sp->empty_doc_every && (d % sp->empty_doc_every) == sp->empty_doc_every - 1;
		c->doc_off[d] = si;
		uint32_t ns = between(&st, sp->min_sents, sp->max_sents);
		for (uint32_t s = 0; s < ns; s++) {
			uint32_t len = between(&st, sp->min_len, sp->max_len);
			if (empty)
				len = 0;
			for (uint32_t k = 0; k < len; k++, ti++) {
				uint32_t id = 5 + (uint32_t)(ti % (sp->vocab_size - 5));
				if (sp->token_bytes == 2)
					((uint16_t *)c->tokens)[ti] = (uint16_t)id;
				else
					((uint32_t *)c->tokens)[ti] = id;
			}
			c->sent_off[++si] = ti;
		}
	}
	c->doc_off[sp->n_docs] = si;
	c->view = (corpus_view){
		.tokens = c->tokens, .token_bytes = sp->token_bytes, .n_tokens = ti,
		.sent_off = c->sent_off, .n_sents = si, .doc_off = c->doc_off, .n_docs = sp->n_docs,
		.vocab_size = sp->vocab_size,
		.special = {.pad = 0, .unk = 1, .cls = 2, .sep = 3, .mask = 4},
	};
	return 0;
}

void synth_free(synth_corpus *c)
{
	free(c->tokens);
	free(c->sent_off);
	free(c->doc_off);
	memset(c, 0, sizeof(*c));
}
