/* WordPiece tokenizer against independent references:
 * - Google's published cases (google-research/bert tokenization_test.py),
 * - HuggingFace tokenizers, through fixtures made by
 *   tests/fixtures/tokenizer/make_fixtures.py: every Unicode scalar value
 *   through normalizer + pre-tokenizer, hand-written nasty lines (ids), and
 *   every line of the corpora (sha256 of ids per 1000 lines): always
 *   tests/data's bert-sample_text.txt, the texts of /usr/share/common-licenses
 *   that are the fixture's (Debian 12's), and the larger corpora of
 *   ../shared/data when present (skipped, with a line saying so, without),
 *   for the uncased and the cased BERT vocab (tests/data).
 * BERTD_TOK_MAX_LINES caps the corpus lines checked (set under sanitizers).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <utf8proc.h>

#include "common/sha256.h"
#include "loader/wordpiece.h"
#include "tests/testdata.h"

static const char *fix_dir(void)
{
	const char *d = getenv("BERTD_TOK_FIXTURES");
	return d ? d : "tests/fixtures/tokenizer";
}

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "cannot open %s\n", path);
		return NULL;
	}
	size_t cap = 1 << 16, len = 0;
	char *b = malloc(cap + 1);
	size_t r;
	while ((r = fread(b + len, 1, cap - len, f)) > 0) {
		len += r;
		if (len == cap) {
			cap *= 2;
			b = realloc(b, cap + 1);
		}
	}
	fclose(f);
	b[len] = '\0';
	*n = len;
	return b;
}

static wordpiece *load_list(const char *const *toks, size_t n, bool lower)
{
	char buf[1024];
	size_t len = 0;
	for (size_t i = 0; i < n; i++)
		len += (size_t)snprintf(buf + len, sizeof buf - len, "%s\n", toks[i]);
	wordpiece *wp = NULL;
	assert_int_equal(wordpiece_create(buf, len, lower, &wp), 0);
	return wp;
}

/* words joined by '|' */
typedef struct joined {
	char s[4096];
	size_t n;
} joined;

static int join_word(void *ctx, const char *w, size_t len, size_t nchars)
{
	(void)nchars;
	joined *j = ctx;
	if (j->n + len + 2 >= sizeof j->s)
		return -ENOSPC;
	if (j->n)
		j->s[j->n++] = '|';
	memcpy(j->s + j->n, w, len);
	j->n += len;
	j->s[j->n] = '\0';
	return 0;
}

static void pretok_is(bool lower, const char *in, const char *want)
{
	joined j = {.n = 0};
	j.s[0] = '\0';
	assert_int_equal(wordpiece_pretokenize(lower, in, strlen(in), join_word, &j), 0);
	assert_string_equal(j.s, want);
}

static void tokens_is(const wordpiece *wp, const char *in, const char *want)
{
	wordpiece_ids ids = {0};
	assert_int_equal(wordpiece_encode(wp, in, strlen(in), &ids, NULL), 0);
	char got[1024] = "";
	size_t n = 0;
	for (size_t i = 0; i < ids.n; i++)
		n += (size_t)snprintf(got + n, sizeof got - n, "%s%s", i ? " " : "",
				      wordpiece_token(wp, ids.v[i]));
	assert_string_equal(got, want);
	wordpiece_ids_free(&ids);
}

/* ---- google-research/bert tokenization_test.py ---- */

static void test_google_vectors(void **state)
{
	(void)state;
	static const char *const full[] = {"[UNK]", "[CLS]", "[SEP]", "want", "##want",
					   "##ed", "wa", "un", "runn", "##ing", ","};
	wordpiece *wp = load_list(full, 11, true);
	tokens_is(wp, "UNwant\xC3\xA9" "d,running", "un ##want ##ed , runn ##ing");
	wordpiece_ids ids = {0};
	const char *unwanted = "UNwant\xC3\xA9" "d,running";
	assert_int_equal(wordpiece_encode(wp, unwanted, strlen(unwanted), &ids, NULL), 0);
	uint32_t want_ids[] = {7, 4, 5, 10, 8, 9};
	assert_int_equal(ids.n, 6);
	assert_memory_equal(ids.v, want_ids, sizeof want_ids);
	wordpiece_ids_free(&ids);
	/* test_wordpiece_tokenizer */
	tokens_is(wp, "", "");
	tokens_is(wp, "unwanted running", "un ##want ##ed runn ##ing");
	tokens_is(wp, "unwantedX running", "[UNK] runn ##ing");
	wordpiece_destroy(wp);

	/* test_chinese, test_basic_tokenizer_lower / _no_lower */
	pretok_is(true, "ah\xE5\x8D\x9A\xE6\x8E\xA8zz", "ah|\xE5\x8D\x9A|\xE6\x8E\xA8|zz");
	pretok_is(true, " \tHeLLo!how  \n Are yoU?  ", "hello|!|how|are|you|?");
	pretok_is(true, "H\xC3\xA9llo", "hello");
	pretok_is(false, " \tHeLLo!how  \n Are yoU?  ", "HeLLo|!|how|Are|yoU|?");
	/* _is_whitespace, _is_control, _is_punctuation */
	pretok_is(false, "a b\tc\rd\ne\xC2\xA0" "f", "a|b|c|d|e|f");
	pretok_is(false, "A\x05" "B \xF0\x9F\x92\xA9", "AB|\xF0\x9F\x92\xA9");
	pretok_is(false, "a-b$c`d.e", "a|-|b|$|c|`|d|.|e");
}

static void test_long_words_and_bad_bytes(void **state)
{
	(void)state;
	static const char *const v[] = {"[UNK]", "a", "##a", "b"};
	wordpiece *wp = load_list(v, 4, true);
	char w[128];
	memset(w, 'a', 100);
	w[100] = '\0';
	wordpiece_ids ids = {0};
	wordpiece_stats st = {0};
	assert_int_equal(wordpiece_encode(wp, w, 100, &ids, &st), 0);
	assert_int_equal(ids.n, 100);
	assert_int_equal(st.unk, 0);
	ids.n = 0;
	memset(w, 'a', 101);
	assert_int_equal(wordpiece_encode(wp, w, 101, &ids, &st), 0);
	assert_int_equal(ids.n, 1);
	assert_int_equal(ids.v[0], 0);
	assert_int_equal(st.unk, 1);
	/* invalid bytes vanish without splitting the word */
	tokens_is(wp, "a\xFF" "a\xC3" "a b\xED\xA0\x80", "a ##a ##a b");
	wordpiece_ids_free(&ids);
	wordpiece_destroy(wp);
}

/* Random bytes biased towards UTF-8 structure, in random-length pieces: no
 * crash, no sanitizer report, bounded output, and a piece split at a
 * character boundary gives the same ids as the sum of its halves when the
 * split falls on whitespace. */
static void test_random_bytes(void **state)
{
	(void)state;
	wordpiece *wp;
	char path[4096];
	testdata_path(path, sizeof path, "bert-base-uncased-vocab.txt");
	assert_int_equal(wordpiece_load(path, true, &wp), 0);
	static const uint8_t pool[] = {'a', 'B', ' ', '\n', '.', 0x00, 0x7f, 0xC3, 0xA9, 0xE4,
				       0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xED, 0xA0, 0xCC, 0x81,
				       0xFF, 0xC0, 0xF4, 0x90, 0xEF, 0xBB, 0xBF, 0xE2, 0x80, 0x8B};
	uint64_t x = 0x9E3779B97F4A7C15ull;
	char *buf = malloc(1 << 16);
	wordpiece_ids ids = {0}, a = {0};
	for (int round = 0; round < 200; round++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t n = 1 + (size_t)(x % (1 << 16));
		for (size_t i = 0; i < n; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			buf[i] = (x & 1) ? (char)(x >> 8) : (char)pool[(x >> 8) % sizeof pool];
		}
		ids.n = 0;
		assert_int_equal(wordpiece_encode(wp, buf, n, &ids, NULL), 0);
		assert_true(ids.n <= n);
		for (size_t i = 0; i < ids.n; i++)
			assert_true(ids.v[i] < wordpiece_vocab_size(wp));
		/* splitting at an ASCII space does not change the ids */
		size_t cut = n / 2;
		buf[cut] = ' ';
		ids.n = 0;
		assert_int_equal(wordpiece_encode(wp, buf, n, &ids, NULL), 0);
		a.n = 0;
		assert_int_equal(wordpiece_encode(wp, buf, cut, &a, NULL), 0);
		assert_int_equal(wordpiece_encode(wp, buf + cut, n - cut, &a, NULL), 0);
		assert_int_equal(a.n, ids.n);
		assert_memory_equal(a.v, ids.v, a.n * sizeof *a.v);
	}
	free(buf);
	wordpiece_ids_free(&ids);
	wordpiece_ids_free(&a);
	wordpiece_destroy(wp);
}

static void test_bad_vocabs(void **state)
{
	(void)state;
	wordpiece *wp = (wordpiece *)1;
	assert_int_equal(wordpiece_create("", 0, true, &wp), -EINVAL);
	assert_null(wp);
	assert_int_equal(wordpiece_create("a\nb\n", 4, true, &wp), -EINVAL); /* no [UNK] */
	assert_int_equal(wordpiece_create("[UNK]\n\xFF\n", 8, true, &wp), -EINVAL);
	assert_int_equal(wordpiece_load("/nonexistent/vocab.txt", true, &wp), -ENOENT);
	assert_int_equal(wordpiece_load("/", true, &wp), -EINVAL);
	/* trailing whitespace trimmed, CRLF vocab works, later duplicate wins,
	 * no [MASK] is reported */
	const char *crlf = "[UNK]\r\nx \nx\n";
	assert_int_equal(wordpiece_create(crlf, strlen(crlf), true, &wp), 0);
	assert_int_equal(wordpiece_vocab_size(wp), 3);
	assert_int_equal(wordpiece_lookup(wp, "x"), 2);
	assert_int_equal(wordpiece_lookup(wp, "[UNK]"), 0);
	corpus_special sp;
	assert_int_equal(wordpiece_special(wp, &sp), -ENOENT);
	wordpiece_destroy(wp);
}

/* ---- HF fixtures ---- */

static const struct {
	const char *mode, *vocab;
	bool lower;
} MODES[2] = {{"uncased", "bert-base-uncased-vocab.txt", true},
	      {"cased", "bert-base-cased-vocab.txt", false}};

static wordpiece *load_mode(int m)
{
	char path[4096];
	testdata_path(path, sizeof path, MODES[m].vocab);
	wordpiece *wp = NULL;
	assert_int_equal(wordpiece_load(path, MODES[m].lower, &wp), 0);
	return wp;
}

/* Test inputs are encoded by utf8proc, independently of wordpiece.c's own
 * encoder. */
static size_t utf8_put(uint32_t cp, char *o)
{
	return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)o);
}

/* What we make of "a" cp "b", in the fixture's notation: a class letter,
 * or the words as space-separated UTF-8 hex. */
static void describe(bool lower, uint32_t cp, char *out, size_t outsz)
{
	char in[8] = "a";
	size_t n = 1 + utf8_put(cp, in + 1);
	char c[5];
	size_t cn = utf8_put(cp, c);
	in[n++] = 'b';
	joined j = {.n = 0};
	j.s[0] = '\0';
	assert_int_equal(wordpiece_pretokenize(lower, in, n, join_word, &j), 0);
	char kept[8], iso[16];
	memcpy(kept, in, n);
	kept[n] = '\0';
	snprintf(iso, sizeof iso, "a|%.*s|b", (int)cn, c);
	if (strcmp(j.s, kept) == 0) {
		snprintf(out, outsz, "k");
	} else if (strcmp(j.s, "ab") == 0) {
		snprintf(out, outsz, "d");
	} else if (strcmp(j.s, "a|b") == 0) {
		snprintf(out, outsz, "w");
	} else if (strcmp(j.s, iso) == 0) {
		snprintf(out, outsz, "i");
	} else {
		size_t o = 0;
		for (size_t i = 0; i < j.n && o + 4 < outsz; i++) {
			if (j.s[i] == '|')
				out[o++] = ' ';
			else
				o += (size_t)snprintf(out + o, outsz - o, "%02x", (uint8_t)j.s[i]);
		}
		out[o] = '\0';
	}
}

static void check_codepoints(int m)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/codepoints_%s.txt", fix_dir(), MODES[m].mode);
	size_t len;
	char *txt = slurp(path, &len);
	assert_non_null(txt);
	uint32_t next = 0, bad = 0;
	char got[512];
	for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
		unsigned lo, hi;
		char k[4];
		int off = 0;
		if (line[0] == 'R' && sscanf(line, "R %x %x %3s", &lo, &hi, k) == 3) {
			for (uint32_t cp = lo; cp <= hi; cp++) {
				describe(MODES[m].lower, cp, got, sizeof got);
				if (strcmp(got, k) != 0 && bad++ < 10)
					fprintf(stderr, "%s U+%04X: want %s got %s\n", MODES[m].mode, cp, k, got);
			}
		} else if (line[0] == 'M' && sscanf(line, "M %x %n", &lo, &off) == 1) {
			hi = lo;
			describe(MODES[m].lower, lo, got, sizeof got);
			if (strcmp(got, line + off) != 0 && bad++ < 10)
				fprintf(stderr, "%s U+%04X: want %s got %s\n", MODES[m].mode, lo, line + off, got);
		} else {
			fail_msg("bad fixture line: %s", line);
		}
		if (next == 0xD800)
			next = 0xE000;
		assert_int_equal(lo, next); /* the fixture covers every scalar value */
		next = hi + 1;
	}
	assert_int_equal(next, 0x110000);
	assert_int_equal(bad, 0);
	free(txt);
}

static void test_codepoints_uncased(void **state)
{
	(void)state;
	check_codepoints(0);
}

static void test_codepoints_cased(void **state)
{
	(void)state;
	check_codepoints(1);
}

/* Splits buf at '\n' into lines (no final empty line); returns count. */
static size_t split_lines(char *buf, size_t len, char ***lines, size_t **lens)
{
	size_t cap = 1024, n = 0, pos = 0;
	*lines = malloc(cap * sizeof **lines);
	*lens = malloc(cap * sizeof **lens);
	while (pos < len) {
		char *e = memchr(buf + pos, '\n', len - pos);
		size_t l = e ? (size_t)(e - (buf + pos)) : len - pos;
		if (n == cap) {
			cap *= 2;
			*lines = realloc(*lines, cap * sizeof **lines);
			*lens = realloc(*lens, cap * sizeof **lens);
		}
		(*lines)[n] = buf + pos;
		(*lens)[n] = l;
		n++;
		pos += l + 1;
	}
	return n;
}

static void test_nasty(void **state)
{
	(void)state;
	char path[4096];
	size_t len, elen;
	snprintf(path, sizeof path, "%s/nasty.txt", fix_dir());
	char *in = slurp(path, &len);
	snprintf(path, sizeof path, "%s/nasty_ids.txt", fix_dir());
	char *exp = slurp(path, &elen);
	assert_non_null(in);
	assert_non_null(exp);
	char **lines;
	size_t *lens;
	size_t nl = split_lines(in, len, &lines, &lens);
	wordpiece *wp[2] = {load_mode(0), load_mode(1)};
	int checked = 0, bad = 0;
	char *save = NULL;
	for (char *row = strtok_r(exp, "\n", &save); row; row = strtok_r(NULL, "\n", &save)) {
		char mode[16];
		size_t ln;
		int off;
		assert_int_equal(sscanf(row, "%15s %zu%n", mode, &ln, &off), 2);
		int m = strcmp(mode, "uncased") == 0 ? 0 : 1;
		assert_true(ln < nl);
		wordpiece_ids ids = {0};
		assert_int_equal(wordpiece_encode(wp[m], lines[ln], lens[ln], &ids, NULL), 0);
		char *p = row + off;
		size_t k = 0;
		bool ok = true;
		for (;;) {
			char *end;
			unsigned long v = strtoul(p, &end, 10);
			if (end == p)
				break;
			p = end;
			if (k >= ids.n || ids.v[k] != v)
				ok = false;
			k++;
		}
		if (k != ids.n)
			ok = false;
		if (!ok) {
			bad++;
			fprintf(stderr, "%s line %zu: want%s\n got", mode, ln, row + off);
			for (size_t i = 0; i < ids.n; i++)
				fprintf(stderr, " %u", ids.v[i]);
			fprintf(stderr, "\n");
		}
		checked++;
		wordpiece_ids_free(&ids);
	}
	assert_int_equal((size_t)checked, 2 * nl);
	assert_int_equal(bad, 0);
	wordpiece_destroy(wp[0]);
	wordpiece_destroy(wp[1]);
	free(lines);
	free(lens);
	free(in);
	free(exp);
}

static void test_corpora(void **state)
{
	(void)state;
	const char *cap_env = getenv("BERTD_TOK_MAX_LINES");
	size_t cap = cap_env ? strtoull(cap_env, NULL, 10) : SIZE_MAX;
	char path[4096];
	size_t elen;
	snprintf(path, sizeof path, "%s/corpus_hashes.txt", fix_dir());
	char *exp = slurp(path, &elen);
	assert_non_null(exp);
	wordpiece *wp[2] = {load_mode(0), load_mode(1)};
	/* even chunks through a word cache (as bertd-prepare runs), odd ones
	 * without: both must match HF */
	wordpiece_cache *cache;
	assert_int_equal(wordpiece_cache_create(&cache), 0);
	char cur[256] = "";
	char *buf = NULL, **lines = NULL;
	size_t *lens = NULL, nl = 0, done = 0, chunks = 0, skipped = 0;
	bool have = false; /* cur is here (tests/data, common-licenses or shared) */
	int bad = 0;
	char *save = NULL;
	static const char lic[] = "common-licenses/";
	for (char *row = strtok_r(exp, "\n", &save); row; row = strtok_r(NULL, "\n", &save)) {
		char mode[16], file[200], hex[65], pin[65] = "";
		size_t chunk, first, count, ntok;
		int nf = sscanf(row, "%15s %199s %zu %zu %zu %zu %64s %64s", mode, file, &chunk, &first,
				&count, &ntok, hex, pin);
		assert_true(nf == 7 || nf == 8);
		if (first >= cap)
			continue;
		if (strcmp(file, cur) != 0) {
			free(buf);
			free(lines);
			free(lens);
			buf = NULL, lines = NULL, lens = NULL, nl = 0;
			snprintf(cur, sizeof cur, "%s", file);
			char what[300];
			snprintf(what, sizeof what, "HuggingFace ids of %s (%s)", file, mode);
			if (strncmp(file, lic, sizeof lic - 1) == 0) {
				/* Debian's texts: compared where they are the fixture's */
				snprintf(path, sizeof path, "%s/%s", TESTDATA_LICENSES_DIR, file + sizeof lic - 1);
				have = access(path, R_OK) == 0;
				if (!have)
					fprintf(stderr, "skipped: %s (no %s here)\n", what, path);
			} else {
				/* committed corpora first; the shared ones only add coverage */
				testdata_path(path, sizeof path, file);
				have = access(path, R_OK) == 0 || testdata_shared(path, sizeof path, file, what);
			}
			if (have) {
				size_t len;
				buf = slurp(path, &len);
				assert_non_null(buf);
				char fhex[65];
				sha256_hex(buf, len, fhex);
				if (*pin && strcmp(pin, fhex) != 0) {
					fprintf(stderr, "skipped: %s (%s is not the text the fixture was made "
							"from: another Debian release)\n", what, path);
					have = false;
				}
				nl = split_lines(buf, len, &lines, &lens);
			}
		}
		if (!have) {
			skipped += count;
			continue;
		}
		int m = strcmp(mode, "uncased") == 0 ? 0 : 1;
		assert_true(first + count <= nl);
		sha256_ctx c;
		sha256_init(&c);
		wordpiece_ids ids = {0};
		size_t tok = 0;
		for (size_t i = first; i < first + count; i++) {
			ids.n = 0;
			assert_int_equal(wordpiece_encode_cached(wp[m], chunks % 2 ? NULL : cache, lines[i],
								 lens[i], &ids, NULL), 0);
			uint8_t le[4];
			for (size_t k = 0; k < ids.n; k++) {
				for (int b = 0; b < 4; b++)
					le[b] = (uint8_t)(ids.v[k] >> (8 * b));
				sha256_update(&c, le, 4);
			}
			sha256_update(&c, "\xff\xff\xff\xff", 4);
			tok += ids.n;
		}
		wordpiece_ids_free(&ids);
		uint8_t d[32];
		char got[65];
		sha256_final(&c, d);
		sha256_to_hex(d, got);
		if (tok != ntok || strcmp(got, hex) != 0) {
			if (bad++ < 10)
				fprintf(stderr, "%s %s lines %zu..%zu: %zu tokens (want %zu), digest %s\n",
					mode, file, first, first + count, tok, ntok,
					strcmp(got, hex) ? "differs" : "equal");
		}
		done += count;
		chunks++;
	}
	fprintf(stderr, "checked %zu corpus lines in %zu chunks; %zu lines skipped (corpus not here)\n",
		done, chunks, skipped);
	assert_true(chunks > 0); /* bert-sample_text.txt is always here */
	assert_int_equal(bad, 0);
	free(buf);
	free(lines);
	free(lens);
	free(exp);
	wordpiece_destroy(wp[0]);
	wordpiece_destroy(wp[1]);
	wordpiece_cache_destroy(cache);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_google_vectors),
		cmocka_unit_test(test_long_words_and_bad_bytes),
		cmocka_unit_test(test_bad_vocabs),
		cmocka_unit_test(test_random_bytes),
		cmocka_unit_test(test_codepoints_uncased),
		cmocka_unit_test(test_codepoints_cased),
		cmocka_unit_test(test_nasty),
		cmocka_unit_test(test_corpora),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
