/* vocab_train — WordPiece vocab training by pair merges (see vocab_train.h
 * for the algorithm and its tie rules). Pair counts are kept incrementally:
 * a merge only revisits the words that contain the merged pair, and a
 * max-heap with lazy invalidation picks the next pair. Must stay
 * deterministic: nothing here may depend on hash iteration order.
 */
#include "loader/vocab_train.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "loader/wordpiece.h"

/* ---- string -> u64 map with an arena ---- */

typedef struct smap_slot {
	uint64_t val;
	uint32_t off, len; /* key in arena */
	uint32_t hash;     /* 0 = empty */
	uint32_t pad;
} smap_slot;

typedef struct smap {
	smap_slot *slots;
	size_t cap, n;
	char *arena;
	size_t alen, acap;
} smap;

static uint32_t shash(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	uint32_t r = (uint32_t)(h ^ (h >> 32));
	return r ? r : 1;
}

static int smap_grow(smap *m)
{
	size_t cap = m->cap ? m->cap * 2 : 1024;
	smap_slot *s = calloc(cap, sizeof *s);
	if (!s)
		return -ENOMEM;
	for (size_t i = 0; i < m->cap; i++) {
		if (!m->slots[i].hash)
			continue;
		size_t j = m->slots[i].hash & (cap - 1);
		while (s[j].hash)
			j = (j + 1) & (cap - 1);
		s[j] = m->slots[i];
	}
	free(m->slots);
	m->slots = s;
	m->cap = cap;
	return 0;
}

/* Returns the slot for key, inserting it with val 0 if absent (NULL on OOM). */
static smap_slot *smap_get(smap *m, const char *k, size_t n, bool *added)
{
	if ((m->n + 1) * 2 > m->cap && smap_grow(m) < 0)
		return NULL;
	uint32_t h = shash(k, n);
	size_t j = h & (m->cap - 1);
	for (;; j = (j + 1) & (m->cap - 1)) {
		smap_slot *s = &m->slots[j];
		if (!s->hash)
			break;
		if (s->hash == h && s->len == n && memcmp(m->arena + s->off, k, n) == 0) {
			if (added)
				*added = false;
			return s;
		}
	}
	if (m->alen + n + 1 > m->acap) {
		size_t cap = m->acap ? m->acap * 2 : 1 << 16;
		while (cap < m->alen + n + 1)
			cap *= 2;
		char *a = realloc(m->arena, cap);
		if (!a)
			return NULL;
		m->arena = a;
		m->acap = cap;
	}
	memcpy(m->arena + m->alen, k, n);
	m->arena[m->alen + n] = '\0';
	smap_slot *s = &m->slots[j];
	*s = (smap_slot){.val = 0, .off = (uint32_t)m->alen, .len = (uint32_t)n, .hash = h};
	m->alen += n + 1;
	m->n++;
	if (added)
		*added = true;
	return s;
}

static void smap_free(smap *m)
{
	free(m->slots);
	free(m->arena);
	memset(m, 0, sizeof *m);
}

/* ---- counter ---- */

struct vocab_counter {
	bool lower;
	smap words;
};

int vocab_counter_create(bool lowercase, vocab_counter **out)
{
	*out = calloc(1, sizeof **out);
	if (!*out)
		return -ENOMEM;
	(*out)->lower = lowercase;
	return 0;
}

void vocab_counter_destroy(vocab_counter *c)
{
	if (!c)
		return;
	smap_free(&c->words);
	free(c);
}

int vocab_counter_add_word(vocab_counter *c, const char *word, size_t len, uint64_t count)
{
	if (c->words.alen + len + 1 > UINT32_MAX)
		return -ENOMEM; /* arena offsets are 32-bit */
	smap_slot *s = smap_get(&c->words, word, len, NULL);
	if (!s)
		return -ENOMEM;
	s->val += count;
	return 0;
}

static int count_word(void *ctx, const char *w, size_t len, size_t nchars)
{
	if (nchars > WORDPIECE_MAX_WORD_CHARS)
		return 0;
	return vocab_counter_add_word(ctx, w, len, 1);
}

int vocab_counter_add_text(vocab_counter *c, const char *text, size_t len)
{
	return wordpiece_pretokenize(c->lower, text, len, count_word, c);
}

int vocab_counter_merge(vocab_counter *dst, const vocab_counter *src)
{
	for (size_t i = 0; i < src->words.cap; i++) {
		const smap_slot *s = &src->words.slots[i];
		if (!s->hash)
			continue;
		int rc = vocab_counter_add_word(dst, src->words.arena + s->off, s->len, s->val);
		if (rc < 0)
			return rc;
	}
	return 0;
}

uint64_t vocab_counter_unique(const vocab_counter *c) { return c->words.n; }

/* ---- trainer ---- */

typedef struct word {
	uint32_t *sym; /* (n,) symbol ids */
	uint32_t n;
	uint64_t count;
	const char *text;
	uint32_t len;
} word;

typedef struct pair {
	uint32_t a, b;
	int64_t count;
	uint32_t *words; /* word indexes that held the pair (may repeat or be stale) */
	uint32_t nw, cw;
} pair;

typedef struct heap_ent {
	int64_t count;
	uint32_t a, b;
} heap_ent;

typedef struct trainer {
	smap syms;        /* symbol string -> id */
	uint32_t *s_off, *s_len; /* (n_syms,) into syms.arena */
	uint32_t n_syms, c_syms;
	word *words;
	size_t n_words;
	pair *pairs;
	size_t n_pairs, c_pairs;
	uint64_t *pmap_key; /* open addressing (a<<32|b)+1, 0 = empty */
	uint32_t *pmap_val;
	size_t pmap_cap;
	heap_ent *heap;
	size_t n_heap, c_heap;
	uint32_t *stamp;  /* (n_words,) last merge that visited the word */
	uint32_t *touched;
	size_t n_touched, c_touched;
} trainer;

static const char *sym_str(const trainer *t, uint32_t id) { return t->syms.arena + t->s_off[id]; }

static int sym_intern(trainer *t, const char *s, size_t n, uint32_t *id)
{
	bool added;
	smap_slot *sl = smap_get(&t->syms, s, n, &added);
	if (!sl)
		return -ENOMEM;
	if (added || sl->val == UINT32_MAX) { /* new, or only seen as a non-alphabet mark */
		if (t->n_syms == t->c_syms) {
			uint32_t c = t->c_syms ? t->c_syms * 2 : 4096;
			uint32_t *o = realloc(t->s_off, c * sizeof *o);
			if (!o)
				return -ENOMEM;
			t->s_off = o;
			uint32_t *l = realloc(t->s_len, c * sizeof *l);
			if (!l)
				return -ENOMEM;
			t->s_len = l;
			t->c_syms = c;
		}
		sl->val = t->n_syms;
		t->s_off[t->n_syms] = sl->off;
		t->s_len[t->n_syms] = sl->len;
		t->n_syms++;
	}
	*id = (uint32_t)sl->val;
	return 0;
}

/* The string a merge of (a, b) makes: a then b without its "##". */
static int merged_cmp(const trainer *t, const heap_ent *x, const heap_ent *y)
{
	const char *xa = sym_str(t, x->a), *xb = sym_str(t, x->b) + 2;
	const char *ya = sym_str(t, y->a), *yb = sym_str(t, y->b) + 2;
	size_t xal = t->s_len[x->a], xbl = t->s_len[x->b] - 2;
	size_t yal = t->s_len[y->a], ybl = t->s_len[y->b] - 2;
	size_t xl = xal + xbl, yl = yal + ybl;
	for (size_t i = 0; i < xl && i < yl; i++) {
		uint8_t cx = (uint8_t)(i < xal ? xa[i] : xb[i - xal]);
		uint8_t cy = (uint8_t)(i < yal ? ya[i] : yb[i - yal]);
		if (cx != cy)
			return cx < cy ? -1 : 1;
	}
	if (xl != yl)
		return xl < yl ? -1 : 1;
	if (x->a != y->a)
		return x->a < y->a ? -1 : 1;
	return x->b < y->b ? -1 : (x->b > y->b);
}

/* true when x should be popped before y */
static bool heap_before(const trainer *t, const heap_ent *x, const heap_ent *y)
{
	if (x->count != y->count)
		return x->count > y->count;
	return merged_cmp(t, x, y) < 0;
}

static int heap_push(trainer *t, heap_ent e)
{
	if (t->n_heap == t->c_heap) {
		size_t c = t->c_heap ? t->c_heap * 2 : 4096;
		heap_ent *h = realloc(t->heap, c * sizeof *h);
		if (!h)
			return -ENOMEM;
		t->heap = h;
		t->c_heap = c;
	}
	size_t i = t->n_heap++;
	t->heap[i] = e;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!heap_before(t, &t->heap[i], &t->heap[p]))
			break;
		heap_ent tmp = t->heap[i];
		t->heap[i] = t->heap[p];
		t->heap[p] = tmp;
		i = p;
	}
	return 0;
}

static heap_ent heap_pop(trainer *t)
{
	heap_ent top = t->heap[0];
	t->heap[0] = t->heap[--t->n_heap];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < t->n_heap && heap_before(t, &t->heap[l], &t->heap[m]))
			m = l;
		if (r < t->n_heap && heap_before(t, &t->heap[r], &t->heap[m]))
			m = r;
		if (m == i)
			break;
		heap_ent tmp = t->heap[i];
		t->heap[i] = t->heap[m];
		t->heap[m] = tmp;
		i = m;
	}
	return top;
}

static int pmap_grow(trainer *t)
{
	size_t cap = t->pmap_cap ? t->pmap_cap * 2 : 1 << 16;
	uint64_t *k = calloc(cap, sizeof *k);
	uint32_t *v = malloc(cap * sizeof *v);
	if (!k || !v) {
		free(k);
		free(v);
		return -ENOMEM;
	}
	for (size_t i = 0; i < t->pmap_cap; i++) {
		if (!t->pmap_key[i])
			continue;
		size_t j = (t->pmap_key[i] * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
		while (k[j])
			j = (j + 1) & (cap - 1);
		k[j] = t->pmap_key[i];
		v[j] = t->pmap_val[i];
	}
	free(t->pmap_key);
	free(t->pmap_val);
	t->pmap_key = k;
	t->pmap_val = v;
	t->pmap_cap = cap;
	return 0;
}

/* Pair (a, b), created with count 0 if new; NULL on OOM. */
static pair *pair_get(trainer *t, uint32_t a, uint32_t b)
{
	if ((t->n_pairs + 1) * 2 > t->pmap_cap && pmap_grow(t) < 0)
		return NULL;
	uint64_t key = (((uint64_t)a << 32) | b) + 1;
	size_t j = (key * 0x9E3779B97F4A7C15ull >> 20) & (t->pmap_cap - 1);
	for (; t->pmap_key[j]; j = (j + 1) & (t->pmap_cap - 1))
		if (t->pmap_key[j] == key)
			return &t->pairs[t->pmap_val[j]];
	if (t->n_pairs == t->c_pairs) {
		size_t c = t->c_pairs ? t->c_pairs * 2 : 1 << 14;
		pair *p = realloc(t->pairs, c * sizeof *p);
		if (!p)
			return NULL;
		t->pairs = p;
		t->c_pairs = c;
	}
	t->pmap_key[j] = key;
	t->pmap_val[j] = (uint32_t)t->n_pairs;
	pair *p = &t->pairs[t->n_pairs++];
	*p = (pair){.a = a, .b = b};
	return p;
}

static int pair_add(trainer *t, uint32_t a, uint32_t b, int64_t d, uint32_t w)
{
	pair *p = pair_get(t, a, b);
	if (!p)
		return -ENOMEM;
	p->count += d;
	if (d > 0) {
		if (p->nw == p->cw) {
			uint32_t c = p->cw ? p->cw * 2 : 4;
			uint32_t *v = realloc(p->words, c * sizeof *v);
			if (!v)
				return -ENOMEM;
			p->words = v;
			p->cw = c;
		}
		p->words[p->nw++] = w;
		if (t->n_touched == t->c_touched) {
			size_t c = t->c_touched ? t->c_touched * 2 : 1024;
			uint32_t *v = realloc(t->touched, c * sizeof *v);
			if (!v)
				return -ENOMEM;
			t->touched = v;
			t->c_touched = c;
		}
		t->touched[t->n_touched++] = (uint32_t)(p - t->pairs);
	}
	return 0;
}

static void trainer_free(trainer *t)
{
	smap_free(&t->syms);
	free(t->s_off);
	free(t->s_len);
	for (size_t i = 0; i < t->n_words; i++)
		free(t->words[i].sym);
	free(t->words);
	for (size_t i = 0; i < t->n_pairs; i++)
		free(t->pairs[i].words);
	free(t->pairs);
	free(t->pmap_key);
	free(t->pmap_val);
	free(t->heap);
	free(t->stamp);
	free(t->touched);
}

typedef struct chr {
	uint32_t cp;
	uint64_t count;
} chr;

static size_t utf8_len(uint8_t b)
{
	return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

static uint32_t utf8_cp(const char *s, size_t n)
{
	const uint8_t *u = (const uint8_t *)s;
	if (n == 1)
		return u[0];
	uint32_t cp = u[0] & (0xFF >> (n + 1));
	for (size_t i = 1; i < n; i++)
		cp = (cp << 6) | (u[i] & 0x3F);
	return cp;
}

static int cmp_chr_freq(const void *x, const void *y)
{
	const chr *a = x, *b = y;
	if (a->count != b->count)
		return a->count > b->count ? -1 : 1;
	return a->cp < b->cp ? -1 : (a->cp > b->cp);
}

static int cmp_chr_cp(const void *x, const void *y)
{
	const chr *a = x, *b = y;
	return a->cp < b->cp ? -1 : (a->cp > b->cp);
}

static int cmp_word(const void *x, const void *y)
{
	const word *a = x, *b = y;
	if (a->count != b->count)
		return a->count > b->count ? -1 : 1;
	size_t n = a->len < b->len ? a->len : b->len;
	int c = memcmp(a->text, b->text, n);
	if (c)
		return c;
	return a->len < b->len ? -1 : (a->len > b->len);
}

typedef struct outbuf {
	char *b;
	size_t n, cap;
} outbuf;

static int out_line(outbuf *o, const char *s, size_t n)
{
	if (o->n + n + 1 > o->cap) {
		size_t c = o->cap ? o->cap * 2 : 1 << 16;
		while (c < o->n + n + 1)
			c *= 2;
		char *b = realloc(o->b, c);
		if (!b)
			return -ENOMEM;
		o->b = b;
		o->cap = c;
	}
	memcpy(o->b + o->n, s, n);
	o->b[o->n + n] = '\n';
	o->n += n + 1;
	return 0;
}

int vocab_train(const vocab_counter *c, const vocab_train_opts *o, char **vocab_txt,
		size_t *len, uint32_t *n_tokens)
{
	static const char *specials[5] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
	int rc = 0;
	trainer t;
	memset(&t, 0, sizeof t);
	outbuf out = {0};
	chr *chars = NULL;
	size_t n_chars = 0, c_chars = 0;
	uint32_t min_freq = o->min_frequency ? o->min_frequency : 1;
	uint32_t limit = o->limit_alphabet ? o->limit_alphabet : 1000;
	*vocab_txt = NULL;
	if (o->vocab_size < 7) {
		log_error("vocab size %u too small (5 specials + at least one character)", o->vocab_size);
		return -EINVAL;
	}
	if (limit > (o->vocab_size - 5) / 2)
		limit = (o->vocab_size - 5) / 2;

	/* 1. character frequencies, via a map keyed by the character's bytes */
	smap cm = {0};
	for (size_t i = 0; i < c->words.cap; i++) {
		const smap_slot *s = &c->words.slots[i];
		if (!s->hash)
			continue;
		const char *w = c->words.arena + s->off;
		for (size_t k = 0; k < s->len;) {
			size_t n = utf8_len((uint8_t)w[k]);
			smap_slot *cs = smap_get(&cm, w + k, n, NULL);
			if (!cs) {
				rc = -ENOMEM;
				goto out;
			}
			cs->val += s->val;
			k += n;
		}
	}
	if (cm.n == 0) {
		log_error("vocab training: the corpus has no words");
		rc = -EINVAL;
		goto out;
	}
	chars = malloc(cm.n * sizeof *chars);
	if (!chars) {
		rc = -ENOMEM;
		goto out;
	}
	c_chars = cm.n;
	for (size_t i = 0; i < cm.cap; i++)
		if (cm.slots[i].hash)
			chars[n_chars++] = (chr){utf8_cp(cm.arena + cm.slots[i].off, cm.slots[i].len),
						 cm.slots[i].val};
	(void)c_chars;
	qsort(chars, n_chars, sizeof *chars, cmp_chr_freq);
	if (n_chars > limit)
		n_chars = limit;
	qsort(chars, n_chars, sizeof *chars, cmp_chr_cp);

	/* 2. the fixed head of the vocab: specials, alphabet, ##alphabet */
	for (int i = 0; i < 5; i++) {
		uint32_t id;
		if ((rc = sym_intern(&t, specials[i], strlen(specials[i]), &id)) < 0)
			goto out;
	}
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < n_chars; i++) {
			char b[8] = "##";
			size_t n = 0;
			uint32_t cp = chars[i].cp;
			char *p = b + (pass ? 2 : 0);
			if (cp < 0x80) {
				p[n++] = (char)cp;
			} else if (cp < 0x800) {
				p[n++] = (char)(0xC0 | (cp >> 6));
				p[n++] = (char)(0x80 | (cp & 0x3F));
			} else if (cp < 0x10000) {
				p[n++] = (char)(0xE0 | (cp >> 12));
				p[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
				p[n++] = (char)(0x80 | (cp & 0x3F));
			} else {
				p[n++] = (char)(0xF0 | (cp >> 18));
				p[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
				p[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
				p[n++] = (char)(0x80 | (cp & 0x3F));
			}
			uint32_t id;
			if ((rc = sym_intern(&t, b, n + (pass ? 2 : 0), &id)) < 0)
				goto out;
		}
	}

	/* 3. words as symbol sequences, in a deterministic order */
	t.words = calloc(c->words.n, sizeof *t.words);
	if (!t.words) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < c->words.cap; i++) {
		const smap_slot *s = &c->words.slots[i];
		if (s->hash && s->len)
			t.words[t.n_words++] = (word){.count = s->val, .text = c->words.arena + s->off,
						      .len = s->len};
	}
	qsort(t.words, t.n_words, sizeof *t.words, cmp_word);
	size_t kept = 0;
	for (size_t i = 0; i < t.n_words; i++) {
		word w = t.words[i];
		w.sym = malloc(w.len * sizeof *w.sym);
		if (!w.sym) {
			rc = -ENOMEM;
			goto out;
		}
		w.n = 0;
		bool ok = true;
		for (size_t k = 0; k < w.len && ok;) {
			size_t n = utf8_len((uint8_t)w.text[k]);
			char b[8] = "##";
			memcpy(b + 2, w.text + k, n);
			const char *key = k ? b : b + 2;
			size_t kl = k ? n + 2 : n;
			bool added;
			smap_slot *sl = smap_get(&t.syms, key, kl, &added);
			if (!sl) {
				free(w.sym);
				rc = -ENOMEM;
				goto out;
			}
			if (added) /* outside the alphabet: marks the word unusable */
				sl->val = UINT32_MAX;
			if (sl->val == UINT32_MAX)
				ok = false;
			else
				w.sym[w.n++] = (uint32_t)sl->val;
			k += n;
		}
		if (!ok) {
			free(w.sym);
			continue;
		}
		t.words[kept++] = w;
	}
	t.n_words = kept;
	t.stamp = calloc(t.n_words ? t.n_words : 1, sizeof *t.stamp);
	if (!t.stamp) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < t.n_words; i++)
		for (uint32_t k = 0; k + 1 < t.words[i].n; k++)
			if ((rc = pair_add(&t, t.words[i].sym[k], t.words[i].sym[k + 1],
					   (int64_t)t.words[i].count, (uint32_t)i)) < 0)
				goto out;
	for (size_t i = 0; i < t.n_pairs; i++)
		if ((rc = heap_push(&t, (heap_ent){t.pairs[i].count, t.pairs[i].a, t.pairs[i].b})) < 0)
			goto out;

	/* 4. merges */
	uint32_t vocab_n = t.n_syms; /* every interned symbol so far is in the vocab */
	uint32_t *order = NULL;      /* merged symbols in vocab order */
	uint32_t n_order = 0;
	order = malloc(o->vocab_size * sizeof *order);
	if (!order) {
		rc = -ENOMEM;
		goto out;
	}
	uint32_t merge_no = 0;
	char *mbuf = NULL;
	size_t mcap = 0;
	while (vocab_n < o->vocab_size && t.n_heap) {
		heap_ent e = heap_pop(&t);
		pair *p = pair_get(&t, e.a, e.b);
		if (!p) {
			rc = -ENOMEM;
			break;
		}
		if (p->count != e.count) {
			if (p->count >= (int64_t)min_freq &&
			    (rc = heap_push(&t, (heap_ent){p->count, e.a, e.b})) < 0)
				break;
			continue;
		}
		if (e.count < (int64_t)min_freq)
			break;
		/* the merged symbol */
		size_t la = t.s_len[e.a], lb = t.s_len[e.b] - 2;
		if (la + lb > mcap) {
			mcap = (la + lb) * 2 + 64;
			char *m = realloc(mbuf, mcap);
			if (!m) {
				rc = -ENOMEM;
				break;
			}
			mbuf = m;
		}
		memcpy(mbuf, sym_str(&t, e.a), la);
		memcpy(mbuf + la, sym_str(&t, e.b) + 2, lb);
		uint32_t before = t.n_syms, nid;
		if ((rc = sym_intern(&t, mbuf, la + lb, &nid)) < 0)
			break;
		if (t.n_syms > before) {
			order[n_order++] = nid;
			vocab_n++;
		}
		/* rewrite every word holding the pair */
		merge_no++;
		t.n_touched = 0;
		uint32_t nw = p->nw;
		uint32_t *wl = p->words;
		p->words = NULL; /* pair_add below may not append to the list we walk */
		p->nw = p->cw = 0;
		for (uint32_t k = 0; k < nw && rc == 0; k++) {
			uint32_t wi = wl[k];
			if (t.stamp[wi] == merge_no)
				continue;
			t.stamp[wi] = merge_no;
			word *w = &t.words[wi];
			int64_t cnt = (int64_t)w->count;
			uint32_t i = 0, j = 0;
			while (i < w->n && rc == 0) {
				if (i + 1 < w->n && w->sym[i] == e.a && w->sym[i + 1] == e.b) {
					if (j > 0) {
						rc = pair_add(&t, w->sym[j - 1], e.a, -cnt, wi);
						if (rc == 0)
							rc = pair_add(&t, w->sym[j - 1], nid, cnt, wi);
					}
					if (rc == 0 && i + 2 < w->n) {
						rc = pair_add(&t, e.b, w->sym[i + 2], -cnt, wi);
						if (rc == 0)
							rc = pair_add(&t, nid, w->sym[i + 2], cnt, wi);
					}
					p = pair_get(&t, e.a, e.b);
					if (!p)
						rc = -ENOMEM;
					else
						p->count -= cnt;
					w->sym[j++] = nid;
					i += 2;
				} else {
					w->sym[j++] = w->sym[i++];
				}
			}
			w->n = j;
		}
		free(wl);
		if (rc < 0)
			break;
		/* pairs that gained count need a fresh heap entry; those that
		 * lost count are fixed lazily when their stale entry is popped */
		for (size_t k = 0; k < t.n_touched && rc == 0; k++) {
			pair *q = &t.pairs[t.touched[k]];
			if (q->count >= (int64_t)min_freq)
				rc = heap_push(&t, (heap_ent){q->count, q->a, q->b});
		}
		if (rc < 0)
			break;
	}
	free(mbuf);
	if (rc == 0) {
		for (uint32_t i = 0; i < 5 + 2 * (uint32_t)n_chars && rc == 0; i++)
			rc = out_line(&out, sym_str(&t, i), t.s_len[i]);
		for (uint32_t i = 0; i < n_order && rc == 0; i++)
			rc = out_line(&out, sym_str(&t, order[i]), t.s_len[order[i]]);
	}
	free(order);
	if (rc == 0) {
		*vocab_txt = out.b;
		*len = out.n;
		*n_tokens = 5 + 2 * (uint32_t)n_chars + n_order;
		out.b = NULL;
	}
out:
	smap_free(&cm);
	free(chars);
	free(out.b);
	trainer_free(&t);
	return rc;
}
