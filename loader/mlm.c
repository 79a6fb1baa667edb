/* mlm — sample index, packing, masking and batch assembly (see mlm.h and
 * docs/formats.md for the rules).
 *
 * Randomness: every draw is philox(key = seed, counter = (what, which, j)),
 * where `what` names the decision (PURPOSE_*), `which` the sample (or sample
 * number during indexing) and j counts blocks inside that decision. Nothing
 * depends on call order across samples.
 */
#include "loader/mlm.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"
#include "common/log.h"
#include "common/sha256.h"
#include "loader/philox.h"

enum {
	PURPOSE_TARGET = 1, /* short_seq_prob target length, per emitted sample */
	PURPOSE_PAIR = 2,   /* NSP: split point, random-next, random doc/start */
	PURPOSE_TRUNC = 3,  /* NSP: front/back truncation bits, per sample id */
	PURPOSE_MASK = 4,   /* masking, per (epoch, sample id) */
	PURPOSE_PERM = 5,   /* epoch permutation round keys */
	PURPOSE_SPLIT = 6,  /* held-out document permutation round keys */
};

/* One NSP sample: segment A = tokens [a_tok, a_tok + a_len) of shard a_shard,
 * segment B likewise (b_len = 0 without NSP); each lies inside one document.
 * Lengths are before truncate_seq_pair, which only has work to do with
 * drop_long_sentences (otherwise A + B always fits). */
typedef struct sample_ref {
	uint64_t a_tok, b_tok;
	uint32_t a_shard, b_shard;
	uint32_t a_len, b_len;
	uint32_t random_next;
	uint32_t reserved;
} sample_ref;

struct mlm_dataset {
	mlm_config cfg;
	const corpus_view *shards; /* (n_shards,) borrowed */
	uint32_t n_shards;
	/* Full-sentences samples are consecutive runs of tokens, so sample i is
	 * global tokens [starts[i], starts[i+1]) cut at its shard's end and at
	 * T-2 content tokens (with drop_long_sentences a sample starts at a
	 * sentence and the cut drops the rest of a long one): 8 bytes per
	 * sample. NSP samples need both segments: refs. */
	uint64_t *starts;          /* (n_samples + 1,) full-sentences only */
	/* (n_samples,) one past each sample's last global token: only when
	 * documents are held out, where the next sample may start after a
	 * skipped document; NULL otherwise (a sample ends where the next starts) */
	uint64_t *ends;
	sample_ref *refs;          /* (n_samples,) NSP only */
	uint64_t *shard_tok0;      /* (n_shards + 1,) global index of each shard's first token */
	uint64_t n_samples, cap;
	mlm_stats stats;
	uint32_t perm_half_bits;   /* Feistel half width for n_samples */
	uint8_t *special_bits;     /* (vocab_size/8 + 1,) never-masked ids */
	/* while indexing with holdout_pct: bit g set when global document g
	 * (shard_doc0[k] + d, empty ones counted) is in this dataset's split */
	uint8_t *in_split;
	uint64_t *shard_doc0;      /* (n_shards + 1,) while indexing with holdout_pct */
};

/* A counter-addressed stream of 32-bit draws for one decision. */
typedef struct draw_stream {
	uint32_t key[2];
	uint32_t ctr[4];
	uint32_t buf[4];
	int used;
} draw_stream;

static void stream_init(draw_stream *st, uint64_t seed, uint32_t purpose, uint64_t which, uint32_t epoch)
{
	st->key[0] = (uint32_t)seed;
	st->key[1] = (uint32_t)(seed >> 32);
	st->ctr[0] = (uint32_t)which;
	st->ctr[1] = (uint32_t)(which >> 32);
	st->ctr[2] = 0;
	st->ctr[3] = (purpose << 24) | (epoch & 0xFFFFFFu);
	st->used = 4;
}

static inline uint32_t stream_next(draw_stream *st)
{
	if (st->used == 4) {
		philox4x32_10(st->buf, st->ctr, st->key);
		st->ctr[2]++;
		st->used = 0;
	}
	return st->buf[st->used++];
}

static inline uint32_t tok_at(const corpus_view *c, uint64_t i)
{
	if (c->token_bytes == 2)
		return ((const uint16_t *)c->tokens)[i];
	return ((const uint32_t *)c->tokens)[i];
}

static inline uint64_t sent_len(const corpus_view *c, uint64_t s)
{
	return c->sent_off[s + 1] - c->sent_off[s];
}

void mlm_config_defaults(mlm_config *c, uint32_t max_seq_len)
{
	memset(c, 0, sizeof(*c));
	c->seed = 42;
	c->max_seq_len = max_seq_len;
	/* the job spec's default, so hand runs and jobs agree */
	c->max_pred = (uint32_t)jobspec_default_max_predictions((int)max_seq_len, 0.15);
	c->mlm_probability = 0.15f;
	c->mask_replace_prob = 0.8f;
	c->random_replace_prob = 0.1f;
	c->short_seq_prob = 0.1f;
}

uint64_t mlm_config_digest(const mlm_config *c)
{
	char buf[256];
	int n = snprintf(buf, sizeof(buf), "mlm-v2 seed=%llu T=%u P=%u mlm=%a mask=%a rand=%a short=%a nsp=%d wwm=%d drop=%d",
			 (unsigned long long)c->seed, c->max_seq_len, c->max_pred, (double)c->mlm_probability,
			 (double)c->mask_replace_prob, (double)c->random_replace_prob,
			 (double)c->short_seq_prob, c->nsp, c->whole_word_mask, c->drop_long_sentences);
	/* appended only when on, so a job without a held-out share keeps its tag */
	if (c->holdout_pct && n > 0 && (size_t)n < sizeof(buf))
		n += snprintf(buf + n, sizeof(buf) - (size_t)n, " holdout=%u split=%d", c->holdout_pct, c->split);
	if (n < 0 || (size_t)n >= sizeof(buf))
		n = (int)strlen(buf);
	sha256_ctx h;
	uint8_t d[32];
	sha256_init(&h);
	sha256_update(&h, buf, (size_t)n);
	sha256_final(&h, d);
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | d[i];
	return v;
}

static int config_check(const mlm_config *c)
{
	if (c->max_seq_len < 8 || c->max_seq_len > 8192) {
		log_error("mlm: max_seq_length %u outside [8, 8192]", c->max_seq_len);
		return -EINVAL;
	}
	if (c->max_pred == 0 || c->max_pred > c->max_seq_len) {
		log_error("mlm: max_predictions_per_seq %u outside [1, max_seq_length=%u]", c->max_pred,
			  c->max_seq_len);
		return -EINVAL;
	}
	if (!(c->mlm_probability > 0.0f && c->mlm_probability <= 1.0f) ||
	    !(c->mask_replace_prob >= 0.0f && c->random_replace_prob >= 0.0f) ||
	    !(c->mask_replace_prob + c->random_replace_prob <= 1.0f + 1e-6f) ||
	    !(c->short_seq_prob >= 0.0f && c->short_seq_prob <= 1.0f)) {
		log_error("mlm: probabilities out of range (mlm %g, mask %g, random %g, short %g)",
			  (double)c->mlm_probability, (double)c->mask_replace_prob,
			  (double)c->random_replace_prob, (double)c->short_seq_prob);
		return -EINVAL;
	}
	if (c->holdout_pct > 99 || (c->split != MLM_SPLIT_TRAIN && c->split != MLM_SPLIT_EVAL) ||
	    (c->split == MLM_SPLIT_EVAL && c->holdout_pct == 0)) {
		log_error("mlm: held-out share %u%% / split %d is not a valid split", c->holdout_pct, c->split);
		return -EINVAL;
	}
	if (c->whole_word_mask && !c->is_continuation) {
		log_error("mlm: whole_word_mask needs the vocab's continuation bitmap");
		return -EINVAL;
	}
	return 0;
}

static int view_check(const corpus_view *c, uint32_t k)
{
	const corpus_special *sp = &c->special;
	if (c->token_bytes != 2 && c->token_bytes != 4) {
		log_error("mlm: shard %u: token width %d, want 2 or 4", k, c->token_bytes);
		return -EBADMSG;
	}
	if (c->vocab_size == 0 || sp->pad >= c->vocab_size || sp->unk >= c->vocab_size ||
	    sp->cls >= c->vocab_size || sp->sep >= c->vocab_size || sp->mask >= c->vocab_size) {
		log_error("mlm: shard %u: special token id outside vocab of %u", k, c->vocab_size);
		return -EBADMSG;
	}
	if (!c->sent_off || !c->doc_off || (c->n_tokens > 0 && !c->tokens)) {
		log_error("mlm: shard %u: missing arrays", k);
		return -EBADMSG;
	}
	if (c->sent_off[0] != 0 || c->sent_off[c->n_sents] != c->n_tokens || c->doc_off[0] != 0 ||
	    c->doc_off[c->n_docs] != c->n_sents) {
		log_error("mlm: shard %u: offsets do not span the tokens/sentences", k);
		return -EBADMSG;
	}
	for (uint64_t s = 0; s < c->n_sents; s++)
		if (c->sent_off[s + 1] < c->sent_off[s]) {
			log_error("mlm: shard %u: sentence offsets decrease at %llu", k, (unsigned long long)s);
			return -EBADMSG;
		}
	for (uint64_t d = 0; d < c->n_docs; d++)
		if (c->doc_off[d + 1] < c->doc_off[d]) {
			log_error("mlm: shard %u: document offsets decrease at %llu", k, (unsigned long long)d);
			return -EBADMSG;
		}
	return 0;
}

static int refs_push(mlm_dataset *ds, const sample_ref *r)
{
	if (ds->n_samples == ds->cap) {
		uint64_t cap = ds->cap ? ds->cap * 2 : 1024;
		sample_ref *p = realloc(ds->refs, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		ds->refs = p;
		ds->cap = cap;
	}
	ds->refs[ds->n_samples++] = *r;
	return 0;
}

/* Appends a full-sentences sample starting at global sentence g (sample
 * count unchanged when sentinel: the end marker after the last sample). */
static int starts_push(mlm_dataset *ds, uint64_t g, int sentinel)
{
	if (ds->n_samples + 1 >= ds->cap) {
		uint64_t cap = ds->cap ? ds->cap * 2 : 1024;
		uint64_t *p = realloc(ds->starts, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		ds->starts = p;
		if (ds->in_split) {
			p = realloc(ds->ends, cap * sizeof(*p));
			if (!p)
				return -ENOMEM;
			ds->ends = p;
		}
		ds->cap = cap;
	}
	ds->starts[ds->n_samples] = g;
	if (!sentinel)
		ds->n_samples++;
	return 0;
}

/* Target content length for the sample about to be started: cap, or with
 * short_seq_prob a uniform length in [2, cap] (BERT's short sequences). */
static uint64_t draw_target(const mlm_dataset *ds, uint64_t cap)
{
	draw_stream st;
	stream_init(&st, ds->cfg.seed, PURPOSE_TARGET, ds->n_samples, 0);
	uint32_t u = stream_next(&st), r = stream_next(&st);
	if (cap > 2 && philox_unit(u) < ds->cfg.short_seq_prob)
		return 2 + philox_below(r, (uint32_t)(cap - 1));
	return cap;
}

static inline int doc_in_split(const mlm_dataset *ds, uint32_t k, uint64_t d)
{
	if (!ds->in_split)
		return 1;
	uint64_t g = ds->shard_doc0[k] + d;
	return ds->in_split[g >> 3] >> (g & 7) & 1;
}

typedef struct doc_ref {
	uint32_t shard;
	uint64_t doc;
} doc_ref;

static uint64_t range_tokens(const corpus_view *c, uint64_t s0, uint64_t s1)
{
	return c->sent_off[s1] - c->sent_off[s0];
}

/* Token offsets of document d of c: [doc_tok0(c, d), doc_tok0(c, d + 1)). */
static inline uint64_t doc_tok0(const corpus_view *c, uint64_t d)
{
	return c->sent_off[c->doc_off[d]];
}

/* Closes the open full-sentences sample of shard k after `used` content
 * tokens, its last token being local token end - 1. */
static void close_sample(mlm_dataset *ds, uint32_t k, uint64_t used, uint64_t end)
{
	ds->stats.n_tokens_packed += used + 2;
	if (ds->ends)
		ds->ends[ds->n_samples - 1] = ds->shard_tok0[k] + end;
}

/* Full sentences, nothing dropped (HF run_mlm's group_texts: concatenate,
 * then cut): the documents of a shard back to back, one [SEP] between two
 * documents, cut into samples of exactly the target; a sentence longer
 * than what is left of a sample continues in the next. A sample ends early
 * only at its shard's end, before a document of the other split, or where
 * the next document's [SEP] and first token do not both fit. */
static int index_concat(mlm_dataset *ds)
{
	const uint64_t cap = ds->cfg.max_seq_len - 2;
	for (uint32_t k = 0; k < ds->n_shards; k++) {
		const corpus_view *c = &ds->shards[k];
		uint64_t used = 0, end = 0, target = draw_target(ds, cap);
		int open = 0;
		for (uint64_t d = 0; d < c->n_docs; d++) {
			uint64_t t = doc_tok0(c, d), te = doc_tok0(c, d + 1);
			if (t == te)
				continue;
			if (!doc_in_split(ds, k, d)) {
				if (open) {
					close_sample(ds, k, used, end);
					open = 0;
					target = draw_target(ds, cap);
				}
				continue;
			}
			if (open && used + 2 > target) { /* no room for [SEP] and a token */
				close_sample(ds, k, used, end);
				open = 0;
				target = draw_target(ds, cap);
			}
			uint64_t sep = open ? 1 : 0;
			while (t < te) {
				if (!open) {
					int rc = starts_push(ds, ds->shard_tok0[k] + t, 0);
					if (rc)
						return rc;
					open = 1;
					used = 0;
					sep = 0;
				}
				uint64_t take = te - t < target - used - sep ? te - t : target - used - sep;
				used += sep + take;
				t += take;
				end = t;
				sep = 0;
				if (used >= target) {
					close_sample(ds, k, used, end);
					open = 0;
					target = draw_target(ds, cap);
				}
			}
		}
		if (open)
			close_sample(ds, k, used, end);
	}
	return starts_push(ds, ds->shard_tok0[ds->n_shards], 1);
}

/* drop_long_sentences: RoBERTa FULL-SENTENCES with whole sentences, in
 * order, packed up to the target; a sample may run on into the next
 * document of the same shard, with one [SEP] between documents. A sentence
 * longer than the space alone is cut and the rest dropped. Documents of the
 * other split are skipped and end the open sample, so a sample never
 * reaches across one. */
static int index_full_sentences(mlm_dataset *ds)
{
	const uint64_t cap = ds->cfg.max_seq_len - 2;
	for (uint32_t k = 0; k < ds->n_shards; k++) {
		const corpus_view *c = &ds->shards[k];
		uint64_t used = 0, last_doc = UINT64_MAX, target = draw_target(ds, cap);
		int open = 0;
		uint64_t d = 0, last_end = 0; /* one past the open sample's last sentence */
		for (uint64_t s = 0; s < c->n_sents; s++) {
			while (d < c->n_docs && c->doc_off[d + 1] <= s)
				d++;
			uint64_t len = sent_len(c, s);
			if (len == 0)
				continue;
			if (!doc_in_split(ds, k, d)) {
				if (open) {
					close_sample(ds, k, used, c->sent_off[last_end]);
					open = 0;
					used = 0;
					target = draw_target(ds, cap);
				}
				continue;
			}
			uint64_t sep = (open && d != last_doc) ? 1 : 0;
			if (open && used + sep + len > target) {
				close_sample(ds, k, used, c->sent_off[last_end]);
				open = 0;
				used = 0;
				sep = 0;
				target = draw_target(ds, cap);
			}
			if (!open) {
				int rc = starts_push(ds, ds->shard_tok0[k] + c->sent_off[s], 0);
				if (rc)
					return rc;
				open = 1;
			}
			last_end = s + 1;
			uint64_t take = len;
			if (used + sep + take > cap) {
				ds->stats.n_tokens_truncated += used + sep + take - cap;
				take = cap - used - sep;
			}
			used += sep + take;
			last_doc = d;
		}
		if (open)
			close_sample(ds, k, used, c->sent_off[last_end]);
	}
	return starts_push(ds, ds->shard_tok0[ds->n_shards], 1);
}

/* Segment B from a random document other than di (up to 10 draws): whole
 * sentences from a uniform random start until target_b tokens (at least
 * one sentence), as BERT does. */
static void random_b(const mlm_dataset *ds, const doc_ref *docs, uint64_t n_docs, uint64_t di,
		     uint64_t target_b, draw_stream *st, sample_ref *r)
{
	uint64_t rd = di;
	for (int tries = 0; tries < 10 && (rd == di); tries++)
		rd = philox_below(stream_next(st), (uint32_t)n_docs);
	const corpus_view *rc_view = &ds->shards[docs[rd].shard];
	uint64_t r0 = rc_view->doc_off[docs[rd].doc], r1 = rc_view->doc_off[docs[rd].doc + 1];
	uint64_t start = r0 + philox_below(stream_next(st), (uint32_t)(r1 - r0));
	if (range_tokens(rc_view, start, r1) == 0)
		start = r0; /* only empty sentences after the draw */
	uint64_t e = start, b_len = 0;
	while (e < r1 && b_len < target_b)
		b_len += sent_len(rc_view, e++);
	r->random_next = 1;
	r->b_shard = docs[rd].shard;
	r->b_tok = rc_view->sent_off[start];
	r->b_len = (uint32_t)b_len;
}

/* drop_long_sentences with NSP: BERT's create_instances_from_document, with
 * every random choice drawn from philox keyed by the number of the sample
 * being made; truncate_seq_pair (at pack time) drops what does not fit. */
static int index_pairs_truncating(mlm_dataset *ds, const doc_ref *docs, uint64_t n_docs)
{
	const uint64_t max_tokens = ds->cfg.max_seq_len - 3;
	uint64_t *chunk = malloc(sizeof(uint64_t) * (max_tokens + 1));
	if (!chunk)
		return -ENOMEM;
	int rc = 0;
	for (uint64_t di = 0; di < n_docs; di++) {
		const corpus_view *c = &ds->shards[docs[di].shard];
		uint64_t s0 = c->doc_off[docs[di].doc], s1 = c->doc_off[docs[di].doc + 1];
		uint64_t target = draw_target(ds, max_tokens);
		uint64_t n_chunk = 0, cur_len = 0;
		uint64_t last_nonempty = s0;
		for (uint64_t s = s0; s < s1; s++)
			if (sent_len(c, s) > 0)
				last_nonempty = s;
		for (uint64_t s = s0; s < s1; s++) {
			uint64_t len = sent_len(c, s);
			if (len == 0)
				continue;
			chunk[n_chunk++] = s;
			cur_len += len;
			if (s != last_nonempty && cur_len < target && n_chunk <= max_tokens)
				continue;
			draw_stream st;
			stream_init(&st, ds->cfg.seed, PURPOSE_PAIR, ds->n_samples, 0);
			uint64_t a_end = 1;
			if (n_chunk >= 2)
				a_end = 1 + philox_below(stream_next(&st), (uint32_t)(n_chunk - 1));
			uint32_t u_next = stream_next(&st);
			sample_ref r = {.a_shard = docs[di].shard, .a_tok = c->sent_off[chunk[0]]};
			uint64_t a_len = range_tokens(c, chunk[0], chunk[a_end - 1] + 1);
			r.a_len = (uint32_t)a_len;
			if (n_chunk == 1 || philox_unit(u_next) < 0.5f) {
				random_b(ds, docs, n_docs, di, target > a_len ? target - a_len : 1, &st, &r);
				/* BERT puts the unused segments of the chunk back. */
				if (a_end < n_chunk)
					s = chunk[a_end] - 1;
			} else {
				r.b_shard = docs[di].shard;
				r.b_tok = c->sent_off[chunk[a_end]];
				r.b_len = (uint32_t)range_tokens(c, chunk[a_end], chunk[n_chunk - 1] + 1);
			}
			/* what truncate_seq_pair will cut: the longer side, a token
			 * at a time; corpus tokens lost are A's and a chunk B's */
			uint64_t la = r.a_len, lb = r.b_len;
			while (la + lb > max_tokens) {
				if (la > lb)
					la--;
				else
					lb--;
			}
			ds->stats.n_tokens_truncated += (r.a_len - la) + (r.random_next ? 0 : r.b_len - lb);
			ds->stats.n_tokens_packed += la + lb + 3;
			rc = refs_push(ds, &r);
			if (rc)
				goto out;
			n_chunk = 0;
			cur_len = 0;
			target = draw_target(ds, max_tokens);
		}
	}
out:
	free(chunk);
	return rc;
}

/* One segment of a chunk: local tokens [t0, t1) inside sentence `sent`. */
typedef struct seg {
	uint64_t t0, t1, sent;
	int piece; /* cut from a longer sentence */
} seg;

/* NSP, nothing dropped: BERT's create_instances_from_document over a
 * stream of segments. Per document, segments accumulate into a chunk up to
 * the target: a sentence that does not fit what is left starts the next
 * chunk when it fits a fresh one, and is otherwise split, its first piece
 * filling the chunk and the rest continuing. A chunk of a single piece (or
 * of one sentence of the whole room) is split in two halves so that it
 * makes a pair. A is the first a_end segments; B is the rest of the chunk,
 * or with probability 0.5 (always for a single segment) whole sentences of
 * a random document cut to the room A leaves, the unused segments then
 * being put back. A + B never exceeds T-3, so truncate_seq_pair never cuts. */
static int index_pairs(mlm_dataset *ds, const doc_ref *docs, uint64_t n_docs)
{
	const uint64_t max_tokens = ds->cfg.max_seq_len - 3;
	seg *segs = malloc(sizeof(seg) * (max_tokens + 2));
	if (!segs)
		return -ENOMEM;
	int rc = 0;
	for (uint64_t di = 0; di < n_docs; di++) {
		const corpus_view *c = &ds->shards[docs[di].shard];
		uint64_t s = c->doc_off[docs[di].doc];
		uint64_t t = c->sent_off[s], doc_end = doc_tok0(c, docs[di].doc + 1);
		uint64_t target = draw_target(ds, max_tokens);
		uint64_t n_seg = 0, cur = 0;
		while (t < doc_end) {
			while (c->sent_off[s + 1] <= t) /* the sentence holding token t */
				s++;
			uint64_t len = c->sent_off[s + 1] - t;
			int emit;
			if (len <= target - cur) {
				segs[n_seg++] = (seg){t, t + len, s, t > c->sent_off[s]};
				cur += len;
				t += len;
				emit = cur >= target || t == doc_end;
			} else if (n_seg > 0 && len <= target) {
				emit = 1; /* the sentence starts the next chunk, whole */
			} else {
				uint64_t take = target - cur;
				segs[n_seg++] = (seg){t, t + take, s, 1};
				cur = target;
				t += take;
				emit = 1;
			}
			if (!emit)
				continue;
			if (n_seg == 1 && segs[0].t1 - segs[0].t0 >= 2 &&
			    (segs[0].piece || segs[0].t1 - segs[0].t0 >= max_tokens)) {
				uint64_t mid = segs[0].t0 + (segs[0].t1 - segs[0].t0) / 2;
				segs[1] = (seg){mid, segs[0].t1, segs[0].sent, 1};
				segs[0].t1 = mid;
				n_seg = 2;
			}
			draw_stream st;
			stream_init(&st, ds->cfg.seed, PURPOSE_PAIR, ds->n_samples, 0);
			uint64_t a_end = 1;
			if (n_seg >= 2)
				a_end = 1 + philox_below(stream_next(&st), (uint32_t)(n_seg - 1));
			uint32_t u_next = stream_next(&st);
			uint64_t a_len = segs[a_end - 1].t1 - segs[0].t0;
			sample_ref r = {.a_shard = docs[di].shard, .a_tok = segs[0].t0, .a_len = (uint32_t)a_len};
			if (n_seg == 1 || philox_unit(u_next) < 0.5f) {
				random_b(ds, docs, n_docs, di, target > a_len ? target - a_len : 1, &st, &r);
				if (r.b_len > max_tokens - a_len) /* a copy from elsewhere: cut, never A */
					r.b_len = (uint32_t)(max_tokens - a_len);
				if (a_end < n_seg) { /* put the unused segments back */
					t = segs[a_end].t0;
					s = segs[a_end].sent;
				}
			} else {
				r.b_shard = docs[di].shard;
				r.b_tok = segs[a_end].t0;
				r.b_len = (uint32_t)(segs[n_seg - 1].t1 - segs[a_end].t0);
			}
			ds->stats.n_tokens_packed += (uint64_t)r.a_len + r.b_len + 3;
			rc = refs_push(ds, &r);
			if (rc)
				goto out;
			n_seg = 0;
			cur = 0;
			target = draw_target(ds, max_tokens);
		}
	}
out:
	free(segs);
	return rc;
}

static uint32_t half_bits_for(uint64_t n)
{
	uint32_t bits = 2;
	while (bits < 64 && (1ull << bits) < n)
		bits += 2;
	return bits / 2;
}

/* Keeps the documents of cfg.split in docs (*nd of them, non-empty, in
 * order) and marks them in ds->in_split for index_full_sentences. */
static int split_docs(mlm_dataset *ds, doc_ref *docs, uint64_t *nd)
{
	const uint64_t n = *nd;
	if (n < 2) {
		log_error("mlm: validation_split_percentage needs at least 2 documents with tokens; "
			  "the dataset has %llu", (unsigned long long)n);
		return -ENODATA;
	}
	ds->shard_doc0 = malloc(sizeof(uint64_t) * (ds->n_shards + 1));
	if (!ds->shard_doc0)
		return -ENOMEM;
	ds->shard_doc0[0] = 0;
	for (uint32_t k = 0; k < ds->n_shards; k++)
		ds->shard_doc0[k + 1] = ds->shard_doc0[k] + ds->shards[k].n_docs;
	ds->in_split = calloc(ds->shard_doc0[ds->n_shards] / 8 + 1, 1);
	if (!ds->in_split)
		return -ENOMEM;
	const int want = ds->cfg.split == MLM_SPLIT_EVAL;
	uint64_t kept = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (mlm_doc_held_out(&ds->cfg, i, n) != want)
			continue;
		uint64_t g = ds->shard_doc0[docs[i].shard] + docs[i].doc;
		ds->in_split[g >> 3] |= (uint8_t)(1u << (g & 7));
		docs[kept++] = docs[i];
	}
	ds->stats.n_docs = kept;
	ds->stats.n_docs_other = n - kept;
	*nd = kept;
	return 0;
}

int mlm_dataset_create(mlm_dataset **out, const corpus_view *shards, uint32_t n_shards,
		       const mlm_config *cfg)
{
	int rc = config_check(cfg);
	mlm_dataset *ds = NULL;
	doc_ref *docs = NULL;
	if (rc)
		goto out;
	if (n_shards == 0 || !shards) {
		log_error("mlm: dataset has no shards");
		rc = -ENODATA;
		goto out;
	}
	uint64_t total_tokens = 0, n_docs = 0;
	for (uint32_t k = 0; k < n_shards; k++) {
		rc = view_check(&shards[k], k);
		if (rc)
			goto out;
		total_tokens += shards[k].n_tokens;
		n_docs += shards[k].n_docs;
	}
	for (uint32_t k = 1; k < n_shards; k++)
		if (shards[k].vocab_size != shards[0].vocab_size ||
		    memcmp(&shards[k].special, &shards[0].special, sizeof(corpus_special)) != 0) {
			log_error("mlm: shard %u has another vocab or special ids than shard 0", k);
			rc = -EBADMSG;
			goto out;
		}
	ds = calloc(1, sizeof(*ds));
	if (!ds) {
		rc = -ENOMEM;
		goto out;
	}
	ds->special_bits = calloc(shards[0].vocab_size / 8 + 1, 1);
	if (!ds->special_bits) {
		rc = -ENOMEM;
		goto out;
	}
	{
		const corpus_special *sp = &shards[0].special;
		const uint32_t ids[5] = {sp->pad, sp->unk, sp->cls, sp->sep, sp->mask};
		for (int i = 0; i < 5; i++)
			ds->special_bits[ids[i] >> 3] |= (uint8_t)(1u << (ids[i] & 7));
	}
	ds->cfg = *cfg;
	ds->shards = shards;
	ds->n_shards = n_shards;
	ds->shard_tok0 = malloc(sizeof(uint64_t) * (n_shards + 1));
	if (!ds->shard_tok0) {
		rc = -ENOMEM;
		goto out;
	}
	ds->shard_tok0[0] = 0;
	for (uint32_t k = 0; k < n_shards; k++)
		ds->shard_tok0[k + 1] = ds->shard_tok0[k] + shards[k].n_tokens;
	docs = malloc(sizeof(*docs) * (n_docs ? n_docs : 1));
	if (!docs) {
		rc = -ENOMEM;
		goto out;
	}
	uint64_t nd = 0;
	for (uint32_t k = 0; k < n_shards; k++)
		for (uint64_t d = 0; d < shards[k].n_docs; d++) {
			const corpus_view *c = &shards[k];
			if (range_tokens(c, c->doc_off[d], c->doc_off[d + 1]) == 0)
				ds->stats.n_empty_docs++;
			else
				docs[nd++] = (doc_ref){.shard = k, .doc = d};
		}
	ds->stats.n_docs = nd;
	if (nd == 0) {
		log_error("mlm: no document has a token (%llu empty documents)",
			  (unsigned long long)ds->stats.n_empty_docs);
		rc = -ENODATA;
		goto out;
	}
	if (cfg->holdout_pct) {
		rc = split_docs(ds, docs, &nd);
		if (rc)
			goto out;
	}
	if (total_tokens < cfg->max_seq_len - 2) {
		log_error("mlm: corpus has %llu tokens, not enough for one sequence of max_seq_length %u",
			  (unsigned long long)total_tokens, cfg->max_seq_len);
		rc = -ENODATA;
		goto out;
	}
	/* what an epoch should hold: the tokens of this split's documents */
	for (uint64_t i = 0; i < nd; i++) {
		const corpus_view *c = &shards[docs[i].shard];
		uint64_t d = docs[i].doc;
		ds->stats.n_tokens_corpus += doc_tok0(c, d + 1) - doc_tok0(c, d);
		for (uint64_t s = c->doc_off[d]; s < c->doc_off[d + 1]; s++)
			if (sent_len(c, s) > ds->stats.longest_sentence)
				ds->stats.longest_sentence = sent_len(c, s);
	}
	ds->stats.n_tokens_other = total_tokens - ds->stats.n_tokens_corpus;
	if (cfg->nsp)
		rc = cfg->drop_long_sentences ? index_pairs_truncating(ds, docs, nd) : index_pairs(ds, docs, nd);
	else
		rc = cfg->drop_long_sentences ? index_full_sentences(ds) : index_concat(ds);
	if (rc)
		goto out;
	free(ds->in_split); /* only the index needed it */
	free(ds->shard_doc0);
	ds->in_split = NULL;
	ds->shard_doc0 = NULL;
	ds->stats.n_samples = ds->n_samples;
	ds->stats.index_bytes = cfg->nsp ? ds->n_samples * sizeof(sample_ref) : (ds->n_samples + 1) * sizeof(uint64_t);
	if (ds->ends)
		ds->stats.index_bytes += ds->n_samples * sizeof(uint64_t);
	ds->stats.pad_fraction =
		1.0 - (double)ds->stats.n_tokens_packed / ((double)ds->n_samples * cfg->max_seq_len);
	ds->perm_half_bits = half_bits_for(ds->n_samples);
	*out = ds;
	ds = NULL;
out:
	free(docs);
	mlm_dataset_destroy(ds);
	return rc;
}

void mlm_dataset_destroy(mlm_dataset *ds)
{
	if (!ds)
		return;
	free(ds->refs);
	free(ds->starts);
	free(ds->ends);
	free(ds->in_split);
	free(ds->shard_doc0);
	free(ds->shard_tok0);
	free(ds->special_bits);
	free(ds);
}

const mlm_config *mlm_dataset_config(const mlm_dataset *ds)
{
	return &ds->cfg;
}

void mlm_dataset_stats(const mlm_dataset *ds, mlm_stats *out)
{
	*out = ds->stats;
}

/* lowbias32 (Chris Wellons' hash-prospector): a cheap full-avalanche mixer,
 * enough for a Feistel round function whose keys come from philox. */
static inline uint32_t mix32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352dU;
	x ^= x >> 15;
	x *= 0x846ca68bU;
	x ^= x >> 16;
	return x;
}

/* Position of i (< n, n >= 2) under the bijection of [0, n) keyed by
 * (seed, purpose, tweak); h = half_bits_for(n). */
static uint64_t keyed_perm(uint64_t seed, uint32_t purpose, uint64_t tweak, uint32_t h, uint64_t n,
			   uint64_t i)
{
	uint32_t keys[4];
	philox_block(seed, ((uint64_t)purpose << 56) | tweak, 0, keys);
	const uint64_t mask = (h == 32) ? 0xFFFFFFFFull : ((1ull << h) - 1);
	uint64_t x = i;
	/* Cycle-walking: the Feistel net permutes [0, 4^h) >= n; re-apply until
	 * the image lands inside [0, n). Terminates because the net is a
	 * bijection and i < n; expected under 4 passes since 4^h < 4n. */
	do {
		uint64_t L = x >> h, R = x & mask;
		for (int r = 0; r < 4; r++) {
			uint64_t nl = R;
			R = L ^ (mix32((uint32_t)R ^ keys[r]) & mask);
			L = nl;
		}
		x = (L << h) | R;
	} while (x >= n);
	return x;
}

uint64_t mlm_epoch_index(const mlm_dataset *ds, uint64_t epoch, uint64_t i)
{
	if (ds->n_samples <= 1)
		return 0;
	return keyed_perm(ds->cfg.seed, PURPOSE_PERM, epoch, ds->perm_half_bits, ds->n_samples, i);
}

/* Documents held out of n: ceil(pct% of n), at least 1, at most n - 1. */
static uint64_t held_count(uint32_t pct, uint64_t n)
{
	if (pct == 0 || n < 2)
		return 0;
	uint64_t h = (n / 100) * pct + ((n % 100) * pct + 99) / 100;
	if (h < 1)
		h = 1;
	return h > n - 1 ? n - 1 : h;
}

int mlm_doc_held_out(const mlm_config *cfg, uint64_t i, uint64_t n)
{
	uint64_t h = held_count(cfg->holdout_pct, n);
	if (h == 0 || i >= n)
		return 0;
	return keyed_perm(cfg->seed, PURPOSE_SPLIT, 0, half_bits_for(n), n, i) < h;
}

/* Copies corpus tokens [a, b) to ids + *pos as int32; nonzero when one is
 * outside the vocab. */
static int copy_tokens(const corpus_view *c, uint64_t a, uint64_t b, int32_t *ids, uint32_t *pos, uint32_t V)
{
	int32_t *out = ids + *pos;
	uint32_t mx = 0;
	if (c->token_bytes == 2) {
		const uint16_t *t = (const uint16_t *)c->tokens + a;
		for (uint64_t i = 0; i < b - a; i++) {
			out[i] = t[i];
			mx = t[i] > mx ? t[i] : mx;
		}
	} else {
		const uint32_t *t = (const uint32_t *)c->tokens + a;
		for (uint64_t i = 0; i < b - a; i++) {
			out[i] = (int32_t)t[i];
			mx = t[i] > mx ? t[i] : mx;
		}
	}
	*pos += (uint32_t)(b - a);
	if (b > a && mx >= V) {
		log_error("mlm: token id %u outside vocab of %u near token %llu", mx, V, (unsigned long long)a);
		return -EBADMSG;
	}
	return 0;
}

/* Copies local tokens [t0, t1) of c, at most `room` of them, to ids + *pos,
 * with one [SEP] between the parts that come from different documents (the
 * separator counts against room, as the index counts it). */
static int copy_span(const corpus_view *c, uint64_t t0, uint64_t t1, uint64_t room, int32_t *ids,
		     uint32_t *pos, uint32_t V)
{
	/* first document whose tokens end after t0 */
	uint64_t lo = 0, hi = c->n_docs;
	while (lo < hi) {
		uint64_t mid = (lo + hi) / 2;
		if (doc_tok0(c, mid + 1) <= t0)
			lo = mid + 1;
		else
			hi = mid;
	}
	int any = 0;
	for (uint64_t d = lo; t0 < t1 && room > 0; d++) {
		uint64_t e = d < c->n_docs ? doc_tok0(c, d + 1) : t1;
		if (e > t1)
			e = t1;
		if (e <= t0)
			continue;
		if (any) {
			ids[(*pos)++] = (int32_t)c->special.sep;
			if (--room == 0)
				break;
		}
		uint64_t take = e - t0 > room ? room : e - t0;
		int rc = copy_tokens(c, t0, t0 + take, ids, pos, V);
		if (rc)
			return rc;
		room -= take;
		t0 = e;
		any = 1;
	}
	return 0;
}

int mlm_sample_pack(const mlm_dataset *ds, uint64_t s, int32_t *ids, int32_t *token_type_ids,
		    int32_t *nsp_label)
{
	const uint32_t T = ds->cfg.max_seq_len;
	const corpus_special *sp = &ds->shards[0].special;
	const uint32_t V = ds->shards[0].vocab_size;
	uint32_t pos = 0;
	int rc;
	ids[pos++] = (int32_t)sp->cls;
	if (!ds->cfg.nsp) {
		uint64_t g0 = ds->starts[s], g1 = ds->ends ? ds->ends[s] : ds->starts[s + 1];
		/* the shard holding g0: shard_tok0[k] <= g0 < shard_tok0[k+1] */
		uint32_t lo = 0, hi = ds->n_shards - 1;
		while (lo < hi) {
			uint32_t mid = (lo + hi + 1) / 2;
			if (ds->shard_tok0[mid] <= g0)
				lo = mid;
			else
				hi = mid - 1;
		}
		while (ds->shard_tok0[lo + 1] <= g0) /* skip shards without tokens */
			lo++;
		uint64_t end = g1 < ds->shard_tok0[lo + 1] ? g1 : ds->shard_tok0[lo + 1];
		rc = copy_span(&ds->shards[lo], g0 - ds->shard_tok0[lo], end - ds->shard_tok0[lo], T - 2, ids,
			       &pos, V);
		if (rc)
			return rc;
		ids[pos++] = (int32_t)sp->sep;
		memset(token_type_ids, 0, sizeof(int32_t) * T);
		if (nsp_label)
			*nsp_label = 0;
	} else {
		const sample_ref *r = &ds->refs[s];
		const corpus_view *ca = &ds->shards[r->a_shard];
		const corpus_view *cb = &ds->shards[r->b_shard];
		uint64_t la = r->a_len, lb = r->b_len;
		uint64_t fa = 0, fb = 0; /* tokens cut from the front */
		draw_stream st;
		stream_init(&st, ds->cfg.seed, PURPOSE_TRUNC, s, 0);
		uint32_t bits = 0;
		int nbits = 0;
		/* BERT's truncate_seq_pair: trim the longer side, front or back at
		 * random, one token at a time. */
		while (la + lb > T - 3) {
			if (nbits == 0) {
				bits = stream_next(&st);
				nbits = 32;
			}
			int front = bits & 1;
			bits >>= 1;
			nbits--;
			if (la > lb) {
				la--;
				fa += front;
			} else {
				lb--;
				fb += front;
			}
		}
		rc = copy_tokens(ca, r->a_tok + fa, r->a_tok + fa + la, ids, &pos, V);
		if (rc)
			return rc;
		ids[pos++] = (int32_t)sp->sep;
		uint32_t b0 = pos;
		rc = copy_tokens(cb, r->b_tok + fb, r->b_tok + fb + lb, ids, &pos, V);
		if (rc)
			return rc;
		ids[pos++] = (int32_t)sp->sep;
		for (uint32_t i = 0; i < T; i++)
			token_type_ids[i] = (i >= b0 && i < pos) ? 1 : 0;
		if (nsp_label)
			*nsp_label = (int32_t)r->random_next;
	}
	for (uint32_t i = pos; i < T; i++)
		ids[i] = (int32_t)sp->pad;
	return (int)pos;
}

int mlm_sample_mask(const mlm_dataset *ds, uint64_t epoch, uint64_t s, int32_t *ids, int32_t len,
		    int32_t *positions, int32_t *labels)
{
	const mlm_config *cfg = &ds->cfg;
	const corpus_special *sp = &ds->shards[0].special;
	const uint32_t P = cfg->max_pred, V = ds->shards[0].vocab_size;
	const uint8_t *sb = ds->special_bits;
	if (len < 0 || (uint32_t)len > cfg->max_seq_len)
		len = 0;
	/* cand (n_cand,): maskable positions, in order */
	int32_t cand[len > 0 ? len : 1];
	int32_t n_cand = 0;
	for (int32_t i = 0; i < len; i++) {
		uint32_t t = (uint32_t)ids[i];
		cand[n_cand] = i;
		n_cand += t < V && !(sb[t >> 3] >> (t & 7) & 1);
	}
	int32_t n_pred = 0;
	/* chosen positions as a bitmap (T bits) so they come out ascending */
	uint64_t chosen[(cfg->max_seq_len + 63) / 64];
	memset(chosen, 0, sizeof(chosen));
	draw_stream st;
	stream_init(&st, cfg->seed, PURPOSE_MASK, s, (uint32_t)epoch);
	if (n_cand > 0) {
		long want = lroundf((float)n_cand * cfg->mlm_probability);
		if (want < 1)
			want = 1;
		if (want > (long)P)
			want = P;
		if (!cfg->whole_word_mask) {
			/* partial Fisher-Yates: the first `want` of a uniform shuffle */
			for (int32_t k = 0; k < want; k++) {
				int32_t j = k + (int32_t)philox_below(stream_next(&st), (uint32_t)(n_cand - k));
				int32_t t = cand[j];
				cand[j] = cand[k];
				cand[k] = t;
				chosen[t >> 6] |= 1ull << (t & 63);
			}
			n_pred = (int32_t)want;
		} else {
			/* words: a maskable token plus the maskable "##" tokens
			 * right after it; unit_start/unit_len (n_units,) */
			int32_t unit_start[n_cand], unit_len[n_cand], n_units = 0;
			for (int32_t c = 0; c < n_cand; c++) {
				int32_t i = cand[c];
				uint32_t t = (uint32_t)ids[i];
				if (n_units > 0 && (cfg->is_continuation[t >> 3] >> (t & 7) & 1) &&
				    unit_start[n_units - 1] + unit_len[n_units - 1] == i) {
					unit_len[n_units - 1]++;
					continue;
				}
				unit_start[n_units] = i;
				unit_len[n_units] = 1;
				n_units++;
			}
			/* words in random order, skipping one that would overshoot
			 * the count, like BERT's create_masked_lm_predictions */
			for (int32_t k = 0; k < n_units && n_pred < want; k++) {
				int32_t j = k + (int32_t)philox_below(stream_next(&st), (uint32_t)(n_units - k));
				int32_t ts = unit_start[j], tl = unit_len[j];
				unit_start[j] = unit_start[k];
				unit_len[j] = unit_len[k];
				unit_start[k] = ts;
				unit_len[k] = tl;
				if (n_pred + tl > want)
					continue;
				for (int32_t i = ts; i < ts + tl; i++)
					chosen[i >> 6] |= 1ull << (i & 63);
				n_pred += tl;
			}
		}
	}
	int32_t k = 0;
	for (uint32_t w = 0; w < (cfg->max_seq_len + 63) / 64; w++) {
		for (uint64_t m = chosen[w]; m; m &= m - 1) {
			int32_t i = (int32_t)(w * 64 + (uint32_t)__builtin_ctzll(m));
			positions[k] = i;
			labels[k] = ids[i];
			float u = philox_unit(stream_next(&st));
			if (u < cfg->mask_replace_prob)
				ids[i] = (int32_t)sp->mask;
			else if (u < cfg->mask_replace_prob + cfg->random_replace_prob)
				ids[i] = (int32_t)philox_below(stream_next(&st), V);
			k++;
		}
	}
	for (uint32_t j = (uint32_t)n_pred; j < P; j++) {
		positions[j] = 0;
		labels[j] = BATCH_LABEL_NONE;
	}
	return n_pred;
}

int mlm_batch_build(const mlm_dataset *ds, const batch_layout *l, uint32_t G, uint32_t M,
		    uint64_t global, void *slot)
{
	const mlm_config *cfg = &ds->cfg;
	if (l->T != cfg->max_seq_len || l->P != cfg->max_pred || G == 0 || M == 0)
		return -EINVAL;
	if (ds->n_samples < l->B) {
		log_error("mlm: dataset has %llu samples, fewer than one batch of %u",
			  (unsigned long long)ds->n_samples, l->B);
		return -ENODATA;
	}
	uint8_t *base = slot;
	batch_header *h = slot;
	batch_header_init(h, l, global, G, M, cfg->nsp);
	int32_t *ids = (int32_t *)(base + l->off_input_ids);       /* (B, T) */
	int32_t *tt = (int32_t *)(base + l->off_token_type_ids);   /* (B, T) */
	int32_t *lens = (int32_t *)(base + l->off_seq_lens);       /* (B,) */
	int32_t *pos = (int32_t *)(base + l->off_mlm_positions);   /* (B, P) */
	int32_t *lab = (int32_t *)(base + l->off_mlm_labels);      /* (B, P) */
	int32_t *nsp = (int32_t *)(base + l->off_nsp_labels);      /* (B,) */
	int32_t *npred = (int32_t *)(base + l->off_n_pred);        /* (B,) */
	uint64_t n_tokens = 0, n_pred_total = 0;
	for (uint32_t j = 0; j < l->B; j++) {
		uint64_t p = global * l->B + j;
		uint64_t epoch = p / ds->n_samples;
		uint64_t s = mlm_epoch_index(ds, epoch, p % ds->n_samples);
		if (j == 0)
			h->epoch = epoch;
		int len = mlm_sample_pack(ds, s, ids + (size_t)j * l->T, tt + (size_t)j * l->T, nsp + j);
		if (len < 0)
			return len;
		lens[j] = len;
		npred[j] = mlm_sample_mask(ds, epoch, s, ids + (size_t)j * l->T, len, pos + (size_t)j * l->P,
					   lab + (size_t)j * l->P);
		n_tokens += (uint64_t)len;
		n_pred_total += (uint64_t)npred[j];
	}
	h->n_tokens = (uint32_t)n_tokens;
	h->n_pred = (uint32_t)n_pred_total;
	batch_zero_gaps(slot, l);
	return 0;
}
