/* mlm: packing reproduces the source, masking follows its statistics, batches
 * are pure functions of their number, bad corpora are refused cleanly. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/sha256.h"
#include "loader/mlm.h"
#include "test_mlm_fixture.h"

#define CLS 2
#define SEP 3
#define MASK 4

static uint32_t ctok(const corpus_view *c, uint64_t i)
{
	return c->token_bytes == 2 ? ((const uint16_t *)c->tokens)[i] : ((const uint32_t *)c->tokens)[i];
}

/* doc_of[t]: the document of corpus token t, computed from the offsets. */
static uint64_t *token_docs(const corpus_view *c)
{
	uint64_t *doc_of = malloc(sizeof(uint64_t) * (c->n_tokens + 1));
	for (uint64_t d = 0; d < c->n_docs; d++)
		for (uint64_t t = c->sent_off[c->doc_off[d]]; t < c->sent_off[c->doc_off[d + 1]]; t++)
			doc_of[t] = d;
	return doc_of;
}

static uint8_t *sentence_starts(const corpus_view *c, int ends)
{
	uint8_t *m = calloc(c->n_tokens + 1, 1);
	for (uint64_t s = 0; s <= c->n_sents; s++)
		m[c->sent_off[s]] = 1;
	(void)ends;
	return m;
}

/* drop = 0: every token once, in order, samples full but where a shard,
 * a short target or a document's [SEP] ends them; drop = 1
 * (drop_long_sentences): whole sentences, as before that option existed. */
static void check_full_sentences(float short_prob, int token_bytes, int drop)
{
	synth_corpus sc;
	synth_spec sp = {.n_docs = 300, .min_sents = 1, .max_sents = 8, .min_len = 1, .max_len = 40,
			 .empty_doc_every = 7, .vocab_size = token_bytes == 2 ? 65000 : 70000,
			 .token_bytes = token_bytes, .seed = 11};
	assert_int_equal(synth_build(&sc, &sp), 0);
	const corpus_view *c = &sc.view;
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	cfg.short_seq_prob = short_prob;
	cfg.drop_long_sentences = drop;
	mlm_dataset *ds = NULL;
	assert_int_equal(mlm_dataset_create(&ds, c, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	assert_int_equal(st.n_empty_docs, 300 / 7);
	assert_int_equal(st.n_tokens_truncated, 0);
	uint64_t *doc_of = token_docs(c);
	uint8_t *bound = sentence_starts(c, 0);
	int32_t ids[128], tt[128], nsp;
	uint64_t pos = 0, packed = 0, short_samples = 0;
	for (uint64_t s = 0; s < st.n_samples; s++) {
		int len = mlm_sample_pack(ds, s, ids, tt, &nsp);
		assert_true(len >= 3 && len <= 128);
		assert_int_equal(ids[0], CLS);
		assert_int_equal(ids[len - 1], SEP);
		assert_int_equal(nsp, 0);
		for (int i = len; i < 128; i++)
			assert_int_equal(ids[i], 0);
		for (int i = 0; i < 128; i++)
			assert_int_equal(tt[i], 0);
		/* whole sentences: a sample starts and ends on sentence boundaries */
		assert_true(!drop || bound[pos]);
		int pending_sep = 0;
		for (int i = 1; i < len - 1; i++) {
			if (ids[i] == SEP) {
				assert_false(pending_sep);
				pending_sep = 1;
				continue;
			}
			assert_true(pos < c->n_tokens);
			assert_int_equal((uint32_t)ids[i], ctok(c, pos));
			/* a [SEP] inside a sample marks exactly a document change */
			if (i > 1)
				assert_int_equal(pending_sep, doc_of[pos] != doc_of[pos - 1]);
			else
				assert_false(pending_sep);
			pending_sep = 0;
			pos++;
		}
		assert_false(pending_sep);
		assert_true(!drop || bound[pos]);
		packed += (uint64_t)len;
		/* a sample ending this early left room for the next sentence (whole
		 * sentences) or for a [SEP] and a token (nothing dropped), which only
		 * a short target explains */
		if (pos < c->n_tokens && len + (drop ? 40 : 1) + 1 < 128)
			short_samples++;
	}
	assert_int_equal(pos, c->n_tokens); /* every token, in order, exactly once */
	assert_int_equal(packed, st.n_tokens_packed);
	if (short_prob == 0.0f)
		assert_int_equal(short_samples, 0);
	else
		assert_true(short_samples > 0);
	print_message("full-sentences T=128 short=%.1f drop=%d: %llu samples, pad fraction %.3f, short %llu\n",
		      (double)short_prob, drop, (unsigned long long)st.n_samples, st.pad_fraction,
		      (unsigned long long)short_samples);
	free(doc_of);
	free(bound);
	mlm_dataset_destroy(ds);
	synth_free(&sc);
}

static void test_pack_full_sentences(void **state)
{
	(void)state;
	check_full_sentences(0.0f, 4, 0);
	check_full_sentences(0.1f, 4, 0);
	check_full_sentences(0.1f, 2, 0);
	check_full_sentences(0.0f, 4, 1);
	check_full_sentences(0.1f, 4, 1);
	check_full_sentences(0.1f, 2, 1);
}

/* Samples walk shard 0, then shard 1, ...; none mixes shards; a shard
 * without sentences is skipped. */
static void test_pack_multi_shard(void **state)
{
	(void)state;
	synth_corpus a, b;
	synth_spec sp = {.n_docs = 40, .min_sents = 1, .max_sents = 6, .min_len = 1, .max_len = 30,
			 .empty_doc_every = 5, .vocab_size = 30522, .token_bytes = 2, .seed = 31};
	assert_int_equal(synth_build(&a, &sp), 0);
	sp.seed = 32;
	sp.n_docs = 55;
	assert_int_equal(synth_build(&b, &sp), 0);
	static const uint64_t zero[1] = {0};
	corpus_view empty = a.view;
	empty.n_tokens = 0;
	empty.n_sents = 0;
	empty.n_docs = 0;
	empty.sent_off = zero;
	empty.doc_off = zero;
	corpus_view views[4] = {empty, a.view, empty, b.view};
	mlm_config cfg;
	mlm_config_defaults(&cfg, 64);
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, views, 4, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	assert_int_equal(st.index_bytes, (st.n_samples + 1) * 8);
	int32_t ids[64], tt[64];
	uint32_t k = 1;
	uint64_t pos = 0;
	for (uint64_t s = 0; s < st.n_samples; s++) {
		if (pos == views[k].n_tokens) { /* shard done: the next sample starts the next one */
			k += 2;
			pos = 0;
		}
		assert_true(k < 4);
		int len = mlm_sample_pack(ds, s, ids, tt, NULL);
		for (int i = 1; i < len - 1; i++) {
			if (ids[i] == SEP)
				continue;
			assert_true(pos < views[k].n_tokens); /* never runs into the next shard */
			assert_int_equal((uint32_t)ids[i], ctok(&views[k], pos));
			pos++;
		}
	}
	assert_int_equal(k, 3);
	assert_int_equal(pos, b.view.n_tokens);
	mlm_dataset_destroy(ds);
	synth_free(&a);
	synth_free(&b);
}

/* drop_long_sentences: a sentence longer than a sample is cut, the rest
 * dropped and counted. */
static void test_pack_truncates_long_sentence(void **state)
{
	(void)state;
	synth_corpus sc;
	synth_spec sp = {.n_docs = 3, .min_sents = 1, .max_sents = 1, .min_len = 300, .max_len = 300,
			 .vocab_size = 30522, .token_bytes = 2, .seed = 1};
	assert_int_equal(synth_build(&sc, &sp), 0);
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	cfg.short_seq_prob = 0;
	cfg.drop_long_sentences = 1;
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	assert_int_equal(st.n_samples, 3);
	assert_int_equal(st.n_tokens_truncated, 3 * (300 - 126));
	assert_int_equal(st.n_tokens_corpus, 900);
	assert_int_equal(st.longest_sentence, 300);
	int32_t ids[128], tt[128];
	for (uint64_t s = 0; s < 3; s++) {
		assert_int_equal(mlm_sample_pack(ds, s, ids, tt, NULL), 128);
		for (int i = 1; i < 127; i++)
			assert_int_equal((uint32_t)ids[i], ctok(&sc.view, s * 300 + (uint64_t)i - 1));
	}
	mlm_dataset_destroy(ds);
	synth_free(&sc);
}

/* By default a long sentence continues in the next samples: three
 * documents of one 300-token sentence at T=128 are 900 tokens and two
 * [SEP]s, every sample full (126) but the last: 902 = 7*126 + 20. */
static void test_pack_long_sentence_continues(void **state)
{
	(void)state;
	synth_corpus sc;
	synth_spec sp = {.n_docs = 3, .min_sents = 1, .max_sents = 1, .min_len = 300, .max_len = 300,
			 .vocab_size = 30522, .token_bytes = 2, .seed = 1};
	assert_int_equal(synth_build(&sc, &sp), 0);
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	cfg.short_seq_prob = 0;
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	assert_int_equal(st.n_samples, 8);
	assert_int_equal(st.n_tokens_truncated, 0);
	assert_int_equal(st.n_tokens_packed, 902 + 8 * 2);
	int32_t ids[128], tt[128];
	uint64_t pos = 0, seps = 0;
	for (uint64_t s = 0; s < 8; s++) {
		int len = mlm_sample_pack(ds, s, ids, tt, NULL);
		assert_int_equal(len, s < 7 ? 128 : 2 + 20);
		for (int i = 1; i < len - 1; i++) {
			if (ids[i] == SEP) {
				assert_int_equal(pos % 300, 0); /* between documents only */
				seps++;
				continue;
			}
			assert_int_equal((uint32_t)ids[i], ctok(&sc.view, pos));
			pos++;
		}
	}
	assert_int_equal(pos, 900);
	assert_int_equal(seps, 2);
	mlm_dataset_destroy(ds);
	/* NSP: pieces of the long sentences become segments; every token is in
	 * some sample's A or continuing B, and no pair is truncated */
	cfg.nsp = 1;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	mlm_dataset_stats(ds, &st);
	assert_int_equal(st.n_tokens_truncated, 0);
	uint8_t seen[900] = {0};
	int32_t nsp;
	for (uint64_t s = 0; s < st.n_samples; s++) {
		int len = mlm_sample_pack(ds, s, ids, tt, &nsp);
		assert_true(len <= 128);
		for (int i = 1; i < len - 1; i++) {
			if (ids[i] == SEP || (nsp && tt[i]))
				continue;
			uint64_t p = (uint64_t)ids[i] - 5;
			assert_true(p < 900);
			seen[p] = 1;
		}
	}
	for (int p = 0; p < 900; p++)
		assert_int_equal(seen[p], 1);
	mlm_dataset_destroy(ds);
	synth_free(&sc);
}

/* drop = 1 (drop_long_sentences): BERT's pairs, truncated when too long;
 * drop = 0: never truncated, so B always continues A exactly. */
static void check_nsp(int drop)
{
	synth_corpus sc;
	synth_spec sp = {.n_docs = 150, .min_sents = 1, .max_sents = 10, .min_len = 1, .max_len = 30,
			 .empty_doc_every = 9, .vocab_size = 60000, .token_bytes = 4, .seed = 5};
	assert_int_equal(synth_build(&sc, &sp), 0);
	const corpus_view *c = &sc.view;
	assert_true(c->n_tokens < 59995); /* ids decode to positions */
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	cfg.nsp = 1;
	cfg.drop_long_sentences = drop;
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, c, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	uint64_t *doc_of = token_docs(c);
	uint8_t *bound = sentence_starts(c, 0);
	int32_t ids[128], tt[128], nsp;
	uint64_t n_random = 0, n_next = 0;
	for (uint64_t s = 0; s < st.n_samples; s++) {
		int len = mlm_sample_pack(ds, s, ids, tt, &nsp);
		assert_true(len >= 5 && len <= 128);
		assert_int_equal(ids[0], CLS);
		assert_int_equal(ids[len - 1], SEP);
		int sep1 = -1;
		for (int i = 1; i < len - 1; i++)
			if (ids[i] == SEP) {
				assert_int_equal(sep1, -1); /* exactly one inner [SEP] */
				sep1 = i;
			}
		assert_true(sep1 > 1 && sep1 < len - 2); /* both segments non-empty */
		for (int i = 0; i < 128; i++)
			assert_int_equal(tt[i], (i > sep1 && i < len) ? 1 : 0);
		/* each segment is a contiguous run of one document */
		for (int i = 2; i < len - 1; i++) {
			if (i == sep1 || i == sep1 + 1)
				continue;
			uint64_t p = (uint64_t)ids[i] - 5, q = (uint64_t)ids[i - 1] - 5;
			assert_int_equal(p, q + 1);
			assert_int_equal(doc_of[p], doc_of[q]);
		}
		uint64_t a0 = (uint64_t)ids[1] - 5, a1 = (uint64_t)ids[sep1 - 1] - 5 + 1;
		uint64_t b0 = (uint64_t)ids[sep1 + 1] - 5, b1 = (uint64_t)ids[len - 2] - 5 + 1;
		if (drop && len < 128) { /* untruncated: whole sentences */
			assert_true(bound[a0] && bound[a1] && bound[b0]);
		}
		if (nsp == 0) {
			n_next++;
			assert_int_equal(doc_of[b0], doc_of[a0]);
			if (len < 128 || !drop)
				assert_int_equal(b0, a1); /* B continues A */
		} else {
			assert_int_equal(nsp, 1);
			n_random++;
		}
		(void)b1;
	}
	/* BERT: random next half the time when the chunk has two or more
	 * sentences, always when it has one; so at least about half. */
	double frac = (double)n_random / (double)(n_random + n_next);
	if (!drop)
		assert_int_equal(st.n_tokens_truncated, 0);
	print_message("nsp drop=%d: %llu samples, random-next %.3f, pad fraction %.3f\n",
		      drop, (unsigned long long)st.n_samples, frac, st.pad_fraction);
	assert_true(n_next > 0);
	assert_true(frac > 0.45 && frac < 0.9);
	free(doc_of);
	free(bound);
	mlm_dataset_destroy(ds);
	synth_free(&sc);
}

static void test_pack_nsp(void **state)
{
	(void)state;
	check_nsp(0);
	check_nsp(1);
}

static int special(int32_t t)
{
	return t <= 4;
}

typedef struct mask_counts {
	uint64_t seqs, cand, pred, masked, kept, random, first_half, random_sum;
} mask_counts;

/* Checks every masking invariant of one sample and accumulates counts. */
static void check_mask(const mlm_dataset *ds, uint64_t epoch, uint64_t s, mask_counts *mc,
		       const uint8_t *is_cont)
{
	const mlm_config *cfg = mlm_dataset_config(ds);
	const uint32_t T = cfg->max_seq_len, P = cfg->max_pred;
	int32_t ids[512], orig[512], tt[512], pos[512], lab[512];
	int len = mlm_sample_pack(ds, s, ids, tt, NULL);
	assert_true(len > 0);
	memcpy(orig, ids, sizeof(int32_t) * T);
	int n = mlm_sample_mask(ds, epoch, s, ids, len, pos, lab);
	long cand = 0;
	for (int i = 0; i < len; i++)
		cand += !special(orig[i]);
	long want = lroundf((float)cand * cfg->mlm_probability);
	if (want < 1)
		want = 1;
	if (want > (long)P)
		want = P;
	if (cand == 0)
		want = 0;
	/* the shortest word: when every word is longer than the count, none
	 * is masked (BERT skips a word that would overshoot) */
	long shortest = 0, run = 0;
	for (int i = 0; i < len && is_cont; i++) {
		int cont = !special(orig[i]) && i > 0 && !special(orig[i - 1]) &&
			   (is_cont[orig[i] >> 3] >> (orig[i] & 7) & 1);
		if (!special(orig[i]) && !cont)
			run = 0;
		if (!special(orig[i]))
			run++;
		int ends = i + 1 >= len || special(orig[i + 1]) ||
			   !(is_cont[orig[i + 1] >> 3] >> (orig[i + 1] & 7) & 1);
		if (!special(orig[i]) && ends && (shortest == 0 || run < shortest))
			shortest = run;
	}
	if (is_cont)
		assert_true(n <= want && (n > 0 || shortest > want));
	else
		assert_int_equal(n, want);
	uint8_t masked[512] = {0};
	for (int k = 0; k < n; k++) {
		assert_true(pos[k] > 0 && pos[k] < len);
		if (k > 0)
			assert_true(pos[k] > pos[k - 1]);
		assert_false(special(orig[pos[k]])); /* never [CLS]/[SEP]/[PAD] */
		assert_int_equal(lab[k], orig[pos[k]]);
		masked[pos[k]] = 1;
		int32_t now = ids[pos[k]];
		if (now == MASK)
			mc->masked++;
		else if (now == orig[pos[k]])
			mc->kept++;
		else {
			mc->random++;
			mc->random_sum += (uint64_t)now;
			assert_true(now >= 0 && (uint32_t)now < 70000);
		}
		if (pos[k] <= (len - 1) / 2)
			mc->first_half++;
	}
	for (uint32_t k = (uint32_t)n; k < P; k++) {
		assert_int_equal(pos[k], 0);
		assert_int_equal(lab[k], BATCH_LABEL_NONE);
	}
	for (int i = 0; i < (int)T; i++)
		if (!masked[i])
			assert_int_equal(ids[i], orig[i]);
	if (is_cont) /* a word is masked whole or not at all */
		for (int i = 1; i + 1 < len; i++) {
			if (special(orig[i]) || special(orig[i + 1]))
				continue;
			if (is_cont[orig[i + 1] >> 3] >> (orig[i + 1] & 7) & 1)
				assert_int_equal(masked[i], masked[i + 1]);
		}
	mc->seqs++;
	mc->cand += (uint64_t)cand;
	mc->pred += (uint64_t)n;
}

static void assert_binomial(uint64_t k, uint64_t n, double p, const char *what)
{
	double mean = (double)n * p, sd = sqrt((double)n * p * (1 - p));
	print_message("%s: %llu of %llu = %.4f (p %.3f, z %.2f)\n", what, (unsigned long long)k,
		      (unsigned long long)n, (double)k / (double)n, p, ((double)k - mean) / sd);
	assert_true(fabs((double)k - mean) <= 5 * sd);
}

static void test_mask_statistics(void **state)
{
	(void)state;
	synth_corpus sc;
	synth_spec sp = {.n_docs = 400, .min_sents = 1, .max_sents = 12, .min_len = 1, .max_len = 40,
			 .empty_doc_every = 0, .vocab_size = 30522, .token_bytes = 2, .seed = 3};
	assert_int_equal(synth_build(&sc, &sp), 0);
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	assert_int_equal(cfg.max_pred, 20);
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	mask_counts mc = {0};
	for (uint64_t e = 0; e < 6; e++)
		for (uint64_t s = 0; s < st.n_samples; s++)
			check_mask(ds, e, s, &mc, NULL);
	assert_binomial(mc.pred, mc.cand, 0.15, "masked fraction of maskable tokens");
	assert_binomial(mc.masked, mc.pred, 0.8, "[MASK] share");
	assert_binomial(mc.random, mc.pred, 0.1 * (1 - 1.0 / 30522), "random share");
	assert_binomial(mc.first_half, mc.pred, 0.5, "masked in first half");
	/* random replacements are uniform over the vocab: mean V/2 */
	double mean = (double)mc.random_sum / (double)mc.random;
	double sd = 30522 / sqrt(12.0) / sqrt((double)mc.random);
	assert_true(fabs(mean - 30521 / 2.0) < 5 * sd);
	/* a different epoch masks the same sample differently */
	int32_t a[128], b[128], tt[128], pa[20], pb[20], la[20], lb[20];
	int len = mlm_sample_pack(ds, 0, a, tt, NULL);
	memcpy(b, a, sizeof(a));
	mlm_sample_mask(ds, 0, 0, a, len, pa, la);
	mlm_sample_mask(ds, 1, 0, b, len, pb, lb);
	assert_true(memcmp(pa, pb, sizeof(pa)) != 0);
	mlm_dataset_destroy(ds);
	synth_free(&sc);
}

static void test_mask_cap_and_512(void **state)
{
	(void)state;
	synth_corpus sc;
	synth_spec sp = {.n_docs = 200, .min_sents = 2, .max_sents = 20, .min_len = 5, .max_len = 60,
			 .vocab_size = 30522, .token_bytes = 2, .seed = 9};
	assert_int_equal(synth_build(&sc, &sp), 0);
	mlm_config cfg;
	mlm_config_defaults(&cfg, 512);
	assert_int_equal(cfg.max_pred, 80);
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	mask_counts mc = {0};
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	for (uint64_t s = 0; s < st.n_samples; s++)
		check_mask(ds, 0, s, &mc, NULL);
	mlm_dataset_destroy(ds);
	cfg.max_pred = 5; /* far under 15%: the cap binds on every long sample */
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	uint64_t at_cap = 0;
	for (uint64_t s = 0; s < st.n_samples; s++) {
		mask_counts one = {0};
		check_mask(ds, 0, s, &one, NULL);
		at_cap += one.pred == 5;
	}
	assert_true(at_cap > st.n_samples / 2);
	mlm_dataset_destroy(ds);
	synth_free(&sc);
}

static void test_whole_word_mask(void **state)
{
	(void)state;
	synth_corpus sc;
	synth_spec sp = {.n_docs = 100, .min_sents = 1, .max_sents = 8, .min_len = 1, .max_len = 40,
			 .vocab_size = 30522, .token_bytes = 2, .seed = 21};
	assert_int_equal(synth_build(&sc, &sp), 0);
	uint8_t *cont = calloc(30522 / 8 + 1, 1);
	for (uint32_t v = 5; v < 30522; v++)
		if (v % 3 != 0) /* two of three ids are "##" pieces: long words */
			cont[v >> 3] |= (uint8_t)(1u << (v & 7));
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	cfg.whole_word_mask = 1;
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), -EINVAL); /* no bitmap */
	cfg.is_continuation = cont;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	mask_counts mc = {0};
	for (uint64_t s = 0; s < st.n_samples; s++)
		check_mask(ds, 0, s, &mc, cont);
	assert_true(mc.pred > 0);
	mlm_dataset_destroy(ds);
	free(cont);
	synth_free(&sc);
}

/* A corpus of n one-sentence documents of T-2 tokens: exactly n samples. */
static mlm_dataset *dataset_of(uint32_t n, synth_corpus *sc, uint64_t seed)
{
	synth_spec sp = {.n_docs = n, .min_sents = 1, .max_sents = 1, .min_len = 6, .max_len = 6,
			 .vocab_size = 30522, .token_bytes = 2, .seed = 1};
	assert_int_equal(synth_build(sc, &sp), 0);
	mlm_config cfg;
	mlm_config_defaults(&cfg, 8);
	cfg.seed = seed;
	cfg.short_seq_prob = 0;
	mlm_dataset *ds;
	assert_int_equal(mlm_dataset_create(&ds, &sc->view, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	assert_int_equal(st.n_samples, n);
	return ds;
}

static void test_epoch_permutation(void **state)
{
	(void)state;
	const uint32_t sizes[] = {1, 2, 3, 5, 16, 17, 1000, 4099};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		uint32_t n = sizes[k];
		synth_corpus sc;
		mlm_dataset *ds = dataset_of(n, &sc, 42);
		uint8_t *seen = calloc(n, 1);
		uint64_t moved = 0, differ = 0;
		for (uint64_t e = 0; e < 3; e++) {
			memset(seen, 0, n);
			for (uint64_t i = 0; i < n; i++) {
				uint64_t s = mlm_epoch_index(ds, e, i);
				assert_true(s < n);
				assert_false(seen[s]);
				seen[s] = 1;
				moved += s != i;
				differ += e == 1 && s != mlm_epoch_index(ds, 0, i);
			}
		}
		if (n >= 16) {
			assert_true(moved > n);   /* not the identity */
			assert_true(differ > n / 2); /* epochs reshuffle */
		}
		free(seen);
		mlm_dataset_destroy(ds);
		synth_free(&sc);
	}
}

static void slot_hash(const void *slot, size_t n, char hex[65])
{
	sha256_hex(slot, n, hex);
}

static void test_batch_pure_function(void **state)
{
	(void)state;
	synth_corpus sc;
	mlm_dataset *ds = dataset_of(50, &sc, 7);
	batch_layout l;
	assert_int_equal(batch_layout_init(&l, 8, 8, 4), 0); /* P: the default at T=8 */
	assert_int_equal(l.slot_bytes % BATCH_ALIGN, 0);
	void *a = aligned_alloc(BATCH_ALIGN, l.slot_bytes), *b = aligned_alloc(BATCH_ALIGN, l.slot_bytes);
	char ha[20][65], hb[65];
	memset(a, 0xAB, l.slot_bytes); /* stale bytes must not leak into a slot */
	for (uint64_t n = 0; n < 20; n++) {
		assert_int_equal(mlm_batch_build(ds, &l, 2, 3, n, a), 0);
		slot_hash(a, l.slot_bytes, ha[n]);
	}
	memset(b, 0x5A, l.slot_bytes);
	for (uint64_t n = 20; n-- > 0;) {
		assert_int_equal(mlm_batch_build(ds, &l, 2, 3, n, b), 0);
		slot_hash(b, l.slot_bytes, hb);
		assert_string_equal(ha[n], hb);
	}
	/* header: global 13 with G=2, M=3 is step 2, micro 0, rank 1, seq 6 */
	assert_int_equal(mlm_batch_build(ds, &l, 2, 3, 13, b), 0);
	const batch_header *h = b;
	assert_int_equal(batch_header_check(h, &l), 0);
	assert_int_equal(h->step, 2);
	assert_int_equal(h->micro, 0);
	assert_int_equal(h->rank, 1);
	assert_int_equal(h->seq, 6);
	/* sequence j is position 13*8 + j of the epoch stream; 104.. crosses
	 * from epoch 2 into epoch 2 (50 per epoch): check each against a
	 * direct pack + mask */
	assert_int_equal(h->epoch, 104 / 50);
	const uint8_t *base = b;
	for (uint32_t j = 0; j < 8; j++) {
		uint64_t p = 13 * 8 + j;
		int32_t ids[8], tt[8], pos[4], lab[4];
		uint64_t s = mlm_epoch_index(ds, p / 50, p % 50);
		int len = mlm_sample_pack(ds, s, ids, tt, NULL);
		mlm_sample_mask(ds, p / 50, s, ids, len, pos, lab);
		assert_memory_equal(base + l.off_input_ids + j * 8 * 4, ids, sizeof(ids));
		assert_memory_equal(base + l.off_mlm_labels + j * 4 * 4, lab, sizeof(lab));
		assert_memory_equal(base + l.off_mlm_positions + j * 4 * 4, pos, sizeof(pos));
		assert_int_equal(((const int32_t *)(base + l.off_seq_lens))[j], len);
	}
	/* another seed, another batch */
	synth_corpus sc2;
	mlm_dataset *ds2 = dataset_of(50, &sc2, 8);
	assert_int_equal(mlm_batch_build(ds2, &l, 2, 3, 0, b), 0);
	slot_hash(b, l.slot_bytes, hb);
	assert_string_not_equal(ha[0], hb);
	/* batch bigger than the dataset */
	batch_layout big;
	assert_int_equal(batch_layout_init(&big, 64, 8, 4), 0);
	void *c = aligned_alloc(BATCH_ALIGN, big.slot_bytes);
	assert_int_equal(mlm_batch_build(ds, &big, 1, 1, 0, c), -ENODATA);
	assert_int_equal(mlm_batch_build(ds, &l, 0, 1, 0, b), -EINVAL);
	free(c);
	free(a);
	free(b);
	mlm_dataset_destroy(ds);
	mlm_dataset_destroy(ds2);
	synth_free(&sc);
	synth_free(&sc2);
}

static void test_bad_input(void **state)
{
	(void)state;
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	mlm_dataset *ds = NULL;
	synth_corpus sc;
	/* all documents empty */
	synth_spec sp = {.n_docs = 10, .min_sents = 1, .max_sents = 3, .min_len = 1, .max_len = 5,
			 .empty_doc_every = 1, .vocab_size = 100, .token_bytes = 2, .seed = 1};
	assert_int_equal(synth_build(&sc, &sp), 0);
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), -ENODATA);
	synth_free(&sc);
	assert_int_equal(mlm_dataset_create(&ds, NULL, 0, &cfg), -ENODATA);
	/* fewer tokens than one sequence */
	sp.empty_doc_every = 0;
	assert_int_equal(synth_build(&sc, &sp), 0);
	assert_true(sc.view.n_tokens < 126);
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), -ENODATA);
	synth_free(&sc);
	/* malformed views */
	sp = (synth_spec){.n_docs = 50, .min_sents = 1, .max_sents = 5, .min_len = 1, .max_len = 40,
			  .empty_doc_every = 3, .vocab_size = 30522, .token_bytes = 2, .seed = 2};
	assert_int_equal(synth_build(&sc, &sp), 0);
	corpus_view v = sc.view;
	v.token_bytes = 3;
	assert_int_equal(mlm_dataset_create(&ds, &v, 1, &cfg), -EBADMSG);
	v = sc.view;
	v.special.mask = 30522;
	assert_int_equal(mlm_dataset_create(&ds, &v, 1, &cfg), -EBADMSG);
	v = sc.view;
	v.n_tokens += 1; /* offsets no longer span the tokens */
	assert_int_equal(mlm_dataset_create(&ds, &v, 1, &cfg), -EBADMSG);
	uint64_t saved = sc.sent_off[3];
	sc.sent_off[3] = sc.sent_off[4] + 1;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), -EBADMSG);
	sc.sent_off[3] = saved;
	/* bad probabilities */
	mlm_config bad = cfg;
	bad.mask_replace_prob = 0.95f; /* + 0.1 > 1 */
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &bad), -EINVAL);
	bad = cfg;
	bad.max_pred = 129;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &bad), -EINVAL);
	bad = cfg;
	bad.max_seq_len = 4;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &bad), -EINVAL);
	/* zero-token documents among good ones are skipped, never an empty sample */
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	assert_int_equal(st.n_empty_docs, 50 / 3);
	int32_t ids[128], tt[128];
	for (uint64_t s = 0; s < st.n_samples; s++)
		assert_true(mlm_sample_pack(ds, s, ids, tt, NULL) > 2);
	mlm_dataset_destroy(ds);
	/* a token id outside the vocab is refused when the batch is built */
	((uint16_t *)sc.tokens)[5] = 40000;
	assert_int_equal(mlm_dataset_create(&ds, &sc.view, 1, &cfg), 0);
	batch_layout l;
	assert_int_equal(batch_layout_init(&l, 1, 128, 20), 0);
	void *slot = aligned_alloc(BATCH_ALIGN, l.slot_bytes);
	int rc = 0;
	for (uint64_t n = 0; n < st.n_samples && rc == 0; n++)
		rc = mlm_batch_build(ds, &l, 1, 1, n, slot);
	assert_int_equal(rc, -EBADMSG);
	free(slot);
	mlm_dataset_destroy(ds);
	synth_free(&sc);
	/* layout limits */
	assert_int_equal(batch_layout_init(&l, 0, 128, 20), -EINVAL);
	assert_int_equal(batch_layout_init(&l, 4, 128, 129), -EINVAL);
	assert_int_equal(batch_layout_init(&l, 1u << 20, 8192, 80), -EOVERFLOW);
}

/* Which documents (by corpus position: ids follow it) sample s holds: sets
 * seen[d] and returns 0, or -1 for a token that is not a corpus token. */
static int sample_docs(const mlm_dataset *ds, const corpus_view *c, const uint64_t *doc_of, uint64_t s,
		       uint8_t *seen_tok, uint8_t *seen_doc)
{
	int32_t ids[128], tt[128], nsp;
	int len = mlm_sample_pack(ds, s, ids, tt, &nsp);
	for (int i = 0; i < len; i++) {
		if (ids[i] == CLS || ids[i] == SEP)
			continue;
		uint64_t pos = (uint64_t)(ids[i] - 5);
		if (ids[i] < 5 || pos >= c->n_tokens)
			return -1;
		seen_tok[pos] = 1;
		seen_doc[doc_of[pos]] = 1;
	}
	return 0;
}

/* validation_split_percentage: the held-out documents are ceil(pct%) of the
 * non-empty ones, chosen by the seed alone; the training and eval datasets
 * never share a document, between them hold every token (full-sentences),
 * and the same seed gives the same split while another seed gives another. */
static void check_holdout(int nsp)
{
	synth_corpus sc;
	synth_spec sp = {.n_docs = 200, .min_sents = 1, .max_sents = 6, .min_len = 1, .max_len = 40,
			 .empty_doc_every = 9, .vocab_size = 70000, .token_bytes = 4, .seed = 5};
	assert_int_equal(synth_build(&sc, &sp), 0);
	const corpus_view *c = &sc.view;
	assert_true(c->n_tokens + 5 < 70000); /* ids name corpus positions */
	uint64_t *doc_of = token_docs(c);
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	cfg.nsp = nsp;
	cfg.seed = 1234;
	cfg.holdout_pct = 10;
	mlm_config ecfg = cfg;
	ecfg.split = MLM_SPLIT_EVAL;
	assert_int_not_equal(mlm_config_digest(&cfg), mlm_config_digest(&ecfg));
	mlm_dataset *tr, *ev;
	assert_int_equal(mlm_dataset_create(&tr, c, 1, &cfg), 0);
	assert_int_equal(mlm_dataset_create(&ev, c, 1, &ecfg), 0);
	mlm_stats ts, es;
	mlm_dataset_stats(tr, &ts);
	mlm_dataset_stats(ev, &es);
	uint64_t nonempty = 200 - 200 / 9;
	assert_int_equal(ts.n_docs + es.n_docs, nonempty);
	assert_int_equal(es.n_docs, (nonempty * 10 + 99) / 100);
	assert_int_equal(ts.n_docs_other, es.n_docs);
	uint8_t *tok_t = calloc(c->n_tokens, 1), *tok_e = calloc(c->n_tokens, 1);
	uint8_t *doc_t = calloc(c->n_docs, 1), *doc_e = calloc(c->n_docs, 1);
	for (uint64_t s = 0; s < ts.n_samples; s++)
		assert_int_equal(sample_docs(tr, c, doc_of, s, tok_t, doc_t), 0);
	for (uint64_t s = 0; s < es.n_samples; s++)
		assert_int_equal(sample_docs(ev, c, doc_of, s, tok_e, doc_e), 0);
	uint64_t n_doc_e = 0;
	for (uint64_t d = 0; d < c->n_docs; d++) {
		assert_false(doc_t[d] && doc_e[d]); /* never both sides */
		n_doc_e += doc_e[d];
	}
	if (!nsp) {
		/* every document's tokens are in exactly one split */
		assert_int_equal(n_doc_e, es.n_docs);
		for (uint64_t t = 0; t < c->n_tokens; t++)
			assert_int_equal(tok_t[t] + tok_e[t], 1);
	}
	/* fixed by the seed: a second dataset holds out the same documents */
	mlm_dataset *ev2;
	assert_int_equal(mlm_dataset_create(&ev2, c, 1, &ecfg), 0);
	uint8_t *tok_e2 = calloc(c->n_tokens, 1), *doc_e2 = calloc(c->n_docs, 1);
	mlm_stats es2;
	mlm_dataset_stats(ev2, &es2);
	for (uint64_t s = 0; s < es2.n_samples; s++)
		assert_int_equal(sample_docs(ev2, c, doc_of, s, tok_e2, doc_e2), 0);
	assert_memory_equal(doc_e, doc_e2, c->n_docs);
	mlm_dataset_destroy(ev2);
	/* another seed, another split */
	ecfg.seed = 99;
	assert_int_equal(mlm_dataset_create(&ev2, c, 1, &ecfg), 0);
	memset(doc_e2, 0, c->n_docs);
	mlm_dataset_stats(ev2, &es2);
	for (uint64_t s = 0; s < es2.n_samples; s++)
		assert_int_equal(sample_docs(ev2, c, doc_of, s, tok_e2, doc_e2), 0);
	assert_memory_not_equal(doc_e, doc_e2, c->n_docs);
	mlm_dataset_destroy(ev2);
	print_message("holdout nsp=%d: %llu train docs (%llu samples), %llu held out (%llu samples)\n", nsp,
		      (unsigned long long)ts.n_docs, (unsigned long long)ts.n_samples,
		      (unsigned long long)es.n_docs, (unsigned long long)es.n_samples);
	free(tok_t);
	free(tok_e);
	free(tok_e2);
	free(doc_t);
	free(doc_e);
	free(doc_e2);
	free(doc_of);
	mlm_dataset_destroy(tr);
	mlm_dataset_destroy(ev);
	synth_free(&sc);
}

static void test_holdout_split(void **state)
{
	(void)state;
	check_holdout(0);
	check_holdout(1);
	/* nothing held out without a share; an eval split needs one */
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	for (uint64_t i = 0; i < 100; i++)
		assert_int_equal(mlm_doc_held_out(&cfg, i, 100), 0);
	cfg.holdout_pct = 1;
	uint64_t held = 0;
	for (uint64_t i = 0; i < 1000; i++)
		held += (uint64_t)mlm_doc_held_out(&cfg, i, 1000);
	assert_int_equal(held, 10);
	held = 0;
	for (uint64_t i = 0; i < 3; i++)
		held += (uint64_t)mlm_doc_held_out(&cfg, i, 3);
	assert_int_equal(held, 1); /* at least one */
	cfg.holdout_pct = 99;
	held = 0;
	for (uint64_t i = 0; i < 3; i++)
		held += (uint64_t)mlm_doc_held_out(&cfg, i, 3);
	assert_int_equal(held, 2); /* never all */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pack_full_sentences),
		cmocka_unit_test(test_pack_multi_shard),
		cmocka_unit_test(test_pack_truncates_long_sentence),
		cmocka_unit_test(test_pack_long_sentence_continues),
		cmocka_unit_test(test_pack_nsp),
		cmocka_unit_test(test_mask_statistics),
		cmocka_unit_test(test_mask_cap_and_512),
		cmocka_unit_test(test_whole_word_mask),
		cmocka_unit_test(test_epoch_permutation),
		cmocka_unit_test(test_batch_pure_function),
		cmocka_unit_test(test_bad_input),
		cmocka_unit_test(test_holdout_split),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
