/* wordpiece — BERT WordPiece tokenization identical to HF tokenizers'
 * BertNormalizer + BertPreTokenizer + WordPiece (see wordpiece.h).
 *
 * Unicode properties come from utf8proc (Unicode 15). HF's own tables are a
 * mix of versions: the unicode_categories crate it uses for control,
 * punctuation and nonspacing-mark tests predates Unicode 10, while case
 * mapping and NFD come from Rust std / unicode-normalization (Unicode 16).
 * The small tables below are the code points where utf8proc's answer differs
 * from HF's. They were derived by comparing HF with utf8proc on every code
 * point (tests/fixtures/tokenizer/make_fixtures.py --compat-tables) and are
 * verified, code point by code point, by tests/unit/loader/test_wordpiece.c.
 * Note what HF does NOT do: it keeps unassigned code points (Cn) as letters.
 *
 * Must never: read past the text it is given, allocate per word, or fail on
 * any input bytes. Invalid UTF-8 is dropped byte by byte (a lossy decode
 * would give U+FFFD, which BertNormalizer drops too).
 */
#include "loader/wordpiece.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utf8proc.h>

#include "common/log.h"
#include "common/sha256.h"

typedef struct cp_range {
	uint32_t lo, hi;
} cp_range;

typedef struct cp_lower {
	uint32_t cp;
	uint32_t to[2]; /* to[1] == 0: a single code point */
} cp_lower;

/* Code points where "Cc, Cf, Co or Cs" (clean_text drops them) differs. */
static const cp_range other_flip[] = {
	{0x890, 0x891}, {0x8E2, 0x8E2}, {0x110CD, 0x110CD}, {0x13430, 0x1343F},
};
/* Code points where "ASCII punctuation or P*" (split off as a word) differs. */
static const cp_range punct_flip[] = {
	{0x61D, 0x61D}, {0x9FD, 0x9FD}, {0xA76, 0xA76}, {0xC77, 0xC77}, {0xC84, 0xC84},
	{0x166D, 0x166D}, {0x1B7D, 0x1B7E}, {0x2E43, 0x2E4F}, {0x2E52, 0x2E5D},
	{0x10EAD, 0x10EAD}, {0x10F55, 0x10F59}, {0x10F86, 0x10F89}, {0x111C9, 0x111C9},
	{0x1144B, 0x1144F}, {0x1145A, 0x1145B}, {0x1145D, 0x1145D}, {0x11660, 0x1166C},
	{0x116B9, 0x116B9}, {0x1183B, 0x1183B}, {0x11944, 0x11946}, {0x119E2, 0x119E2},
	{0x11A3F, 0x11A46}, {0x11A9A, 0x11A9C}, {0x11A9E, 0x11AA2}, {0x11B00, 0x11B09},
	{0x11C41, 0x11C45}, {0x11C70, 0x11C71}, {0x11EF7, 0x11EF8}, {0x11F43, 0x11F4F},
	{0x11FFF, 0x11FFF}, {0x12FF1, 0x12FF2}, {0x16E97, 0x16E9A}, {0x16FE2, 0x16FE2},
	{0x1E95E, 0x1E95F},
};
/* Code points where "Mn" (removed by strip_accents) differs. */
static const cp_range mn_flip[] = {
	{0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8E1}, {0x9FE, 0x9FE}, {0xAFA, 0xAFF},
	{0xB55, 0xB55}, {0xC04, 0xC04}, {0xC3C, 0xC3C}, {0xD00, 0xD00}, {0xD3B, 0xD3C},
	{0xD81, 0xD81}, {0xEBA, 0xEBA}, {0xECE, 0xECE}, {0x1734, 0x1734}, {0x180F, 0x180F},
	{0x1885, 0x1886}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFB}, {0xA82C, 0xA82C},
	{0xA8C5, 0xA8C5}, {0xA8FF, 0xA8FF}, {0xA9BD, 0xA9BD}, {0x10D24, 0x10D27},
	{0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
	{0x11070, 0x11070}, {0x11073, 0x11074}, {0x110C2, 0x110C2}, {0x111C9, 0x111C9},
	{0x111CF, 0x111CF}, {0x1123E, 0x1123E}, {0x11241, 0x11241}, {0x1133B, 0x1133B},
	{0x11438, 0x1143F}, {0x11442, 0x11444}, {0x11446, 0x11446}, {0x1145E, 0x1145E},
	{0x1182F, 0x11837}, {0x11839, 0x1183A}, {0x1193B, 0x1193C}, {0x1193E, 0x1193E},
	{0x11943, 0x11943}, {0x119D4, 0x119D7}, {0x119DA, 0x119DB}, {0x119E0, 0x119E0},
	{0x11A01, 0x11A0A}, {0x11A33, 0x11A38}, {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47},
	{0x11A51, 0x11A56}, {0x11A59, 0x11A5B}, {0x11A8A, 0x11A96}, {0x11A98, 0x11A99},
	{0x11C30, 0x11C36}, {0x11C38, 0x11C3D}, {0x11C3F, 0x11C3F}, {0x11C92, 0x11CA7},
	{0x11CAA, 0x11CB0}, {0x11CB2, 0x11CB3}, {0x11CB5, 0x11CB6}, {0x11D31, 0x11D36},
	{0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D}, {0x11D3F, 0x11D45}, {0x11D47, 0x11D47},
	{0x11D90, 0x11D91}, {0x11D95, 0x11D95}, {0x11D97, 0x11D97}, {0x11EF3, 0x11EF4},
	{0x11F00, 0x11F01}, {0x11F36, 0x11F3A}, {0x11F40, 0x11F40}, {0x11F42, 0x11F42},
	{0x13440, 0x13440}, {0x13447, 0x13455}, {0x16F4F, 0x16F4F}, {0x16FE4, 0x16FE4},
	{0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46}, {0x1E000, 0x1E006}, {0x1E008, 0x1E018},
	{0x1E01B, 0x1E021}, {0x1E023, 0x1E024}, {0x1E026, 0x1E02A}, {0x1E08F, 0x1E08F},
	{0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
	{0x1E944, 0x1E94A},
};
/* Rust char::to_lowercase where it differs from utf8proc_tolower. */
static const cp_lower lower_fix[] = {
	{0x130, {0x69, 0x307}},
	{0x1C89, {0x1C8A, 0x0}},
	{0xA7CB, {0x264, 0x0}},
	{0xA7CC, {0xA7CD, 0x0}},
	{0xA7CE, {0xA7CF, 0x0}},
	{0xA7D2, {0xA7D3, 0x0}},
	{0xA7D4, {0xA7D5, 0x0}},
	{0xA7DA, {0xA7DB, 0x0}},
	{0xA7DC, {0x19B, 0x0}},
	{0x10D50, {0x10D70, 0x0}},
	{0x10D51, {0x10D71, 0x0}},
	{0x10D52, {0x10D72, 0x0}},
	{0x10D53, {0x10D73, 0x0}},
	{0x10D54, {0x10D74, 0x0}},
	{0x10D55, {0x10D75, 0x0}},
	{0x10D56, {0x10D76, 0x0}},
	{0x10D57, {0x10D77, 0x0}},
	{0x10D58, {0x10D78, 0x0}},
	{0x10D59, {0x10D79, 0x0}},
	{0x10D5A, {0x10D7A, 0x0}},
	{0x10D5B, {0x10D7B, 0x0}},
	{0x10D5C, {0x10D7C, 0x0}},
	{0x10D5D, {0x10D7D, 0x0}},
	{0x10D5E, {0x10D7E, 0x0}},
	{0x10D5F, {0x10D7F, 0x0}},
	{0x10D60, {0x10D80, 0x0}},
	{0x10D61, {0x10D81, 0x0}},
	{0x10D62, {0x10D82, 0x0}},
	{0x10D63, {0x10D83, 0x0}},
	{0x10D64, {0x10D84, 0x0}},
	{0x10D65, {0x10D85, 0x0}},
	{0x16EA0, {0x16EBB, 0x0}},
	{0x16EA1, {0x16EBC, 0x0}},
	{0x16EA2, {0x16EBD, 0x0}},
	{0x16EA3, {0x16EBE, 0x0}},
	{0x16EA4, {0x16EBF, 0x0}},
	{0x16EA5, {0x16EC0, 0x0}},
	{0x16EA6, {0x16EC1, 0x0}},
	{0x16EA7, {0x16EC2, 0x0}},
	{0x16EA8, {0x16EC3, 0x0}},
	{0x16EA9, {0x16EC4, 0x0}},
	{0x16EAA, {0x16EC5, 0x0}},
	{0x16EAB, {0x16EC6, 0x0}},
	{0x16EAC, {0x16EC7, 0x0}},
	{0x16EAD, {0x16EC8, 0x0}},
	{0x16EAE, {0x16EC9, 0x0}},
	{0x16EAF, {0x16ECA, 0x0}},
	{0x16EB0, {0x16ECB, 0x0}},
	{0x16EB1, {0x16ECC, 0x0}},
	{0x16EB2, {0x16ECD, 0x0}},
	{0x16EB3, {0x16ECE, 0x0}},
	{0x16EB4, {0x16ECF, 0x0}},
	{0x16EB5, {0x16ED0, 0x0}},
	{0x16EB6, {0x16ED1, 0x0}},
	{0x16EB7, {0x16ED2, 0x0}},
	{0x16EB8, {0x16ED3, 0x0}},
};

/* HF's decomposition table lacks this one (DIVES AKURU VOWEL SIGN O). */
#define NFD_KEEP_CP 0x11938

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static bool in_ranges(const cp_range *r, size_t n, uint32_t cp)
{
	if (n == 0 || cp < r[0].lo || cp > r[n - 1].hi)
		return false;
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (cp < r[mid].lo)
			hi = mid;
		else if (cp > r[mid].hi)
			lo = mid + 1;
		else
			return true;
	}
	return false;
}

/* ---- character classes (HF semantics) ---- */

enum { AC_KEEP = 0, AC_WS, AC_PUNCT, AC_DROP };

/* ASCII: what BertNormalizer + BertPreTokenizer do with each byte < 0x80. */
static uint8_t ascii_class(uint8_t b)
{
	if (b == '\t' || b == '\n' || b == '\r' || b == ' ')
		return AC_WS;
	if (b < 0x20 || b == 0x7f)
		return AC_DROP; /* Cc, including NUL, VT and FF */
	if ((b >= 33 && b <= 47) || (b >= 58 && b <= 64) || (b >= 91 && b <= 96) ||
	    (b >= 123 && b <= 126))
		return AC_PUNCT;
	return AC_KEEP;
}

static bool is_other(uint32_t cp, utf8proc_category_t cat)
{
	bool o = cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
		 cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS;
	return o != in_ranges(other_flip, ARRAY_LEN(other_flip), cp);
}

static bool is_space_cat(utf8proc_category_t cat)
{
	return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
	       cat == UTF8PROC_CATEGORY_ZP;
}

static bool is_punct(uint32_t cp, utf8proc_category_t cat)
{
	if (cp < 0x80)
		return ascii_class((uint8_t)cp) == AC_PUNCT;
	bool p = cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
	return p != in_ranges(punct_flip, ARRAY_LEN(punct_flip), cp);
}

static bool is_mn(uint32_t cp, utf8proc_category_t cat)
{
	return (cat == UTF8PROC_CATEGORY_MN) != in_ranges(mn_flip, ARRAY_LEN(mn_flip), cp);
}

/* HF's _is_chinese_char ranges; note 0x2B920, not 0x2B820, as HF has it. */
static bool is_cjk(uint32_t cp)
{
	return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
	       (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
	       (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
	       (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* Strict UTF-8 (Unicode Table 3-7). Returns the sequence length, or 0 when
 * s[0] does not start a well-formed sequence. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
	uint8_t b = s[0];
	if (b >= 0xC2 && b <= 0xDF) {
		if (n < 2 || (s[1] & 0xC0) != 0x80)
			return 0;
		*cp = ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
		return 2;
	}
	if (b >= 0xE0 && b <= 0xEF) {
		uint8_t lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
		if (n < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80)
			return 0;
		*cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
		return 3;
	}
	if (b >= 0xF0 && b <= 0xF4) {
		uint8_t lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
		if (n < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 ||
		    (s[3] & 0xC0) != 0x80)
			return 0;
		*cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
		      ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
		return 4;
	}
	return 0;
}

static size_t utf8_encode(uint32_t cp, char *o)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xC0 | (cp >> 6));
		o[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xE0 | (cp >> 12));
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (char)(0xF0 | (cp >> 18));
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	o[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* ---- normalizer + pre-tokenizer ---- */

#define WORD_BUF (4 * WORDPIECE_MAX_WORD_CHARS + 8)
#define PEND_MAX 64

typedef struct pretok {
	bool lower;
	wordpiece_word_fn fn;
	void *ctx;
	int rc;
	size_t len, nchars;
	char word[WORD_BUF]; /* normalized bytes of the current word */
	/* Surviving (non-Mn) marks of the current run of nonzero combining
	 * class, held back so NFD's canonical reordering can be applied. */
	uint32_t pend[PEND_MAX];
	uint8_t pend_ccc[PEND_MAX];
	int npend;
} pretok;

static inline void word_end(pretok *p)
{
	if (p->nchars && p->rc == 0)
		p->rc = p->fn(p->ctx, p->word, p->len, p->nchars);
	p->len = 0;
	p->nchars = 0;
}

static inline void word_push(pretok *p, uint32_t cp)
{
	if (p->nchars < WORDPIECE_MAX_WORD_CHARS)
		p->len += utf8_encode(cp, p->word + p->len);
	p->nchars++;
}

/* A normalized code point enters the pre-tokenizer. */
static void emit_cp(pretok *p, uint32_t cp)
{
	utf8proc_category_t cat = cp < 0x80 ? UTF8PROC_CATEGORY_LL : utf8proc_category((utf8proc_int32_t)cp);
	if (cp < 0x80) {
		uint8_t c = ascii_class((uint8_t)cp);
		if (c == AC_WS) {
			word_end(p);
			return;
		}
		if (c == AC_PUNCT) {
			word_end(p);
			word_push(p, cp);
			word_end(p);
			return;
		}
		word_push(p, cp);
		return;
	}
	if (is_space_cat(cat)) {
		word_end(p);
	} else if (is_punct(cp, cat)) {
		word_end(p);
		word_push(p, cp);
		word_end(p);
	} else {
		word_push(p, cp);
	}
}

static void emit_lower(pretok *p, uint32_t cp)
{
	if (!p->lower) {
		emit_cp(p, cp);
		return;
	}
	size_t lo = 0, hi = ARRAY_LEN(lower_fix);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (cp < lower_fix[mid].cp) {
			hi = mid;
		} else if (cp > lower_fix[mid].cp) {
			lo = mid + 1;
		} else {
			emit_cp(p, lower_fix[mid].to[0]);
			if (lower_fix[mid].to[1])
				emit_cp(p, lower_fix[mid].to[1]);
			return;
		}
	}
	emit_cp(p, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
}

static void flush_pending(pretok *p)
{
	/* stable insertion sort by combining class = canonical ordering */
	for (int i = 1; i < p->npend; i++) {
		uint32_t c = p->pend[i];
		uint8_t k = p->pend_ccc[i];
		int j = i - 1;
		while (j >= 0 && p->pend_ccc[j] > k) {
			p->pend[j + 1] = p->pend[j];
			p->pend_ccc[j + 1] = p->pend_ccc[j];
			j--;
		}
		p->pend[j + 1] = c;
		p->pend_ccc[j + 1] = k;
	}
	int n = p->npend;
	p->npend = 0;
	for (int i = 0; i < n; i++)
		emit_lower(p, p->pend[i]);
}

/* strip_accents: NFD, then drop nonspacing marks; then lowercase. */
static void normalize_cp(pretok *p, uint32_t cp)
{
	if (!p->lower) {
		emit_cp(p, cp);
		return;
	}
	utf8proc_int32_t d[16];
	utf8proc_ssize_t nd = 1;
	d[0] = (utf8proc_int32_t)cp;
	if (cp != NFD_KEEP_CP) {
		nd = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 16, UTF8PROC_DECOMPOSE, NULL);
		if (nd < 1 || nd > 16) {
			d[0] = (utf8proc_int32_t)cp;
			nd = 1;
		}
	}
	for (utf8proc_ssize_t i = 0; i < nd; i++) {
		uint32_t x = (uint32_t)d[i];
		const utf8proc_property_t *pr = utf8proc_get_property(d[i]);
		bool mn = is_mn(x, (utf8proc_category_t)pr->category);
		if (pr->combining_class == 0) {
			if (p->npend)
				flush_pending(p);
			if (!mn)
				emit_lower(p, x);
		} else if (!mn) {
			if (p->npend == PEND_MAX)
				flush_pending(p); /* pathological mark pile-up */
			p->pend[p->npend] = x;
			p->pend_ccc[p->npend] = (uint8_t)pr->combining_class;
			p->npend++;
		}
	}
}

/* [l][0..127] class of each ASCII byte, [l][128..255] its lowercase (l=1) */
static uint8_t ascii_tabs[2][256];
static pthread_once_t ascii_once = PTHREAD_ONCE_INIT;

static void ascii_init(void)
{
	for (int l = 0; l < 2; l++) {
		for (int b = 0; b < 128; b++) {
			ascii_tabs[l][b] = ascii_class((uint8_t)b);
			ascii_tabs[l][128 + b] = (uint8_t)((l && b >= 'A' && b <= 'Z') ? b + 32 : b);
		}
	}
}

static int pretok_run(pretok *p, const char *text, size_t len)
{
	const uint8_t *s = (const uint8_t *)text;
	pthread_once(&ascii_once, ascii_init);
	const uint8_t *tab = ascii_tabs[p->lower];
	size_t i = 0;
	while (i < len && p->rc == 0) {
		uint8_t b = s[i];
		if (b < 0x80) {
			if (p->npend)
				flush_pending(p);
			switch (tab[b]) {
			case AC_KEEP:
				if (p->nchars < WORDPIECE_MAX_WORD_CHARS)
					p->word[p->len++] = (char)tab[128 + b];
				p->nchars++;
				break;
			case AC_WS:
				word_end(p);
				break;
			case AC_PUNCT:
				word_end(p);
				p->word[0] = (char)b;
				p->len = 1;
				p->nchars = 1;
				word_end(p);
				break;
			default:
				break;
			}
			i++;
			continue;
		}
		uint32_t cp;
		size_t n = utf8_decode(s + i, len - i, &cp);
		if (n == 0) {
			i++; /* invalid byte: dropped, like the U+FFFD it decodes to */
			continue;
		}
		i += n;
		utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
		if (cp == 0xFFFD || is_other(cp, cat))
			continue; /* clean_text */
		if (is_space_cat(cat)) {
			if (p->npend)
				flush_pending(p);
			word_end(p);
		} else if (is_cjk(cp)) {
			if (p->npend)
				flush_pending(p);
			word_end(p);
			normalize_cp(p, cp);
			if (p->npend)
				flush_pending(p);
			word_end(p);
		} else {
			normalize_cp(p, cp);
		}
	}
	if (p->npend)
		flush_pending(p);
	word_end(p);
	return p->rc;
}

int wordpiece_pretokenize(bool lowercase, const char *text, size_t len,
			  wordpiece_word_fn fn, void *ctx)
{
	pretok pt, *p = &pt;
	p->lower = lowercase;
	p->fn = fn;
	p->ctx = ctx;
	p->rc = 0;
	p->len = p->nchars = 0;
	p->npend = 0;
	return pretok_run(p, text, len);
}

/* ---- vocab ---- */

typedef struct vslot {
	uint32_t hash; /* 0 = empty */
	uint32_t len;
	uint32_t off;  /* into strs */
	int32_t id;
} vslot;

typedef struct vtab {
	vslot *slots;
	uint32_t mask;
	uint32_t maxlen; /* longest key, bytes */
} vtab;

struct wordpiece {
	bool lower;
	uint32_t n_ids;      /* vocab lines */
	char *strs;          /* every line, NUL-terminated */
	uint32_t *id_off;    /* (n_ids,) offset of line id in strs */
	vtab init, cont;     /* word-initial pieces; "##" pieces keyed without "##" */
	uint32_t unk;
	uint64_t serial;     /* unique per loaded vocab, so caches never mix two */
	char sha[65];
};

static uint64_t next_serial;

static inline uint32_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, s, 8);
		h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
		h ^= h >> 29;
		s += 8;
		n -= 8;
	}
	uint64_t w = 0;
	memcpy(&w, s, n);
	h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 32;
	uint32_t r = (uint32_t)h;
	return r ? r : 1;
}

static inline int32_t vtab_find(const vtab *t, const char *strs, const char *k, size_t n)
{
	uint32_t h = hash_bytes(k, n);
	for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
		const vslot *s = &t->slots[i];
		if (s->hash == 0)
			return -1;
		if (s->hash == h && s->len == n && memcmp(strs + s->off, k, n) == 0)
			return s->id;
	}
}

static void vtab_put(vtab *t, const char *strs, uint32_t off, uint32_t n, int32_t id)
{
	const char *k = strs + off;
	uint32_t h = hash_bytes(k, n);
	for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
		vslot *s = &t->slots[i];
		if (s->hash == 0) {
			*s = (vslot){h, n, off, id};
			if (n > t->maxlen)
				t->maxlen = n;
			return;
		}
		if (s->hash == h && s->len == n && memcmp(strs + s->off, k, n) == 0) {
			s->id = id; /* a later duplicate wins, as in HF's HashMap */
			return;
		}
	}
}

static bool utf8_valid(const char *s, size_t n)
{
	const uint8_t *u = (const uint8_t *)s;
	uint32_t cp;
	for (size_t i = 0; i < n;) {
		if (u[i] < 0x80) {
			i++;
			continue;
		}
		size_t k = utf8_decode(u + i, n - i, &cp);
		if (!k)
			return false;
		i += k;
	}
	return true;
}

/* Rust's str::trim_end: drops trailing White_Space characters. */
static size_t trim_end(const char *s, size_t n)
{
	while (n > 0) {
		uint8_t b = (uint8_t)s[n - 1];
		if (b < 0x80) {
			if (b == ' ' || (b >= 9 && b <= 13)) {
				n--;
				continue;
			}
			return n;
		}
		size_t k = n - 1;
		while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80)
			k--;
		uint32_t cp;
		if (utf8_decode((const uint8_t *)s + k, n - k, &cp) != n - k)
			return n;
		if (cp == 0x85 || is_space_cat(utf8proc_category((utf8proc_int32_t)cp)))
			n = k;
		else
			return n;
	}
	return n;
}

static int vtab_alloc(vtab *t, uint32_t n)
{
	uint32_t cap = 16;
	while (cap < 2 * n)
		cap <<= 1;
	t->slots = calloc(cap, sizeof *t->slots);
	t->mask = cap - 1;
	t->maxlen = 0;
	return t->slots ? 0 : -ENOMEM;
}

int wordpiece_create(const char *data, size_t len, bool lowercase, wordpiece **out)
{
	int rc = 0;
	wordpiece *wp = calloc(1, sizeof *wp);
	if (!wp)
		return -ENOMEM;
	wp->lower = lowercase;
	wp->serial = __atomic_add_fetch(&next_serial, 1, __ATOMIC_RELAXED);
	sha256_hex(data, len, wp->sha);
	if (!utf8_valid(data, len)) {
		log_error("vocab is not valid UTF-8");
		rc = -EINVAL;
		goto out;
	}
	size_t lines = 0;
	for (size_t i = 0; i < len; i++)
		lines += data[i] == '\n';
	if (len && data[len - 1] != '\n')
		lines++;
	if (lines == 0 || lines > INT32_MAX) {
		log_error("vocab has %zu lines", lines);
		rc = -EINVAL;
		goto out;
	}
	wp->n_ids = (uint32_t)lines;
	wp->strs = malloc(len + 1);
	wp->id_off = malloc(lines * sizeof *wp->id_off);
	if (!wp->strs || !wp->id_off || vtab_alloc(&wp->init, wp->n_ids) ||
	    vtab_alloc(&wp->cont, wp->n_ids)) {
		rc = -ENOMEM;
		goto out;
	}
	/* the arena is the file with each line end replaced by NUL */
	size_t pos = 0;
	for (uint32_t id = 0; id < wp->n_ids; id++) {
		size_t e = pos;
		while (e < len && data[e] != '\n')
			e++;
		size_t n = trim_end(data + pos, e - pos);
		memcpy(wp->strs + pos, data + pos, n);
		wp->strs[pos + n] = '\0';
		wp->id_off[id] = (uint32_t)pos;
		if (n >= 2 && data[pos] == '#' && data[pos + 1] == '#')
			vtab_put(&wp->cont, wp->strs, (uint32_t)pos + 2, (uint32_t)n - 2, (int32_t)id);
		/* "##x" is also a word-initial key: a word may start with "##" */
		vtab_put(&wp->init, wp->strs, (uint32_t)pos, (uint32_t)n, (int32_t)id);
		pos = e + 1;
	}
	int32_t unk = vtab_find(&wp->init, wp->strs, "[UNK]", 5);
	if (unk < 0) {
		log_error("vocab has no [UNK] token");
		rc = -EINVAL;
		goto out;
	}
	wp->unk = (uint32_t)unk;
out:
	if (rc < 0) {
		wordpiece_destroy(wp);
		wp = NULL;
	}
	*out = wp;
	return rc;
}

int wordpiece_load(const char *vocab_path, bool lowercase, wordpiece **out)
{
	int rc = 0;
	char *buf = NULL;
	*out = NULL;
	int fd = open(vocab_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		log_error("vocab %s: %s", vocab_path, strerror(errno));
		goto out;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > (1 << 30)) {
		log_error("vocab %s: not a regular file under 1 GiB", vocab_path);
		rc = -EINVAL;
		goto out;
	}
	size_t n = (size_t)st.st_size, got = 0;
	buf = malloc(n + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			log_error("vocab %s: short read", vocab_path);
			goto out;
		}
		got += (size_t)r;
	}
	rc = wordpiece_create(buf, n, lowercase, out);
	if (rc < 0)
		log_error("vocab %s: cannot be used", vocab_path);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

void wordpiece_destroy(wordpiece *wp)
{
	if (!wp)
		return;
	free(wp->init.slots);
	free(wp->cont.slots);
	free(wp->strs);
	free(wp->id_off);
	free(wp);
}

uint32_t wordpiece_vocab_size(const wordpiece *wp) { return wp->n_ids; }
bool wordpiece_lowercase(const wordpiece *wp) { return wp->lower; }
const char *wordpiece_vocab_sha256(const wordpiece *wp) { return wp->sha; }

const char *wordpiece_token(const wordpiece *wp, uint32_t id)
{
	return id < wp->n_ids ? wp->strs + wp->id_off[id] : NULL;
}

int64_t wordpiece_lookup(const wordpiece *wp, const char *token)
{
	int32_t id = vtab_find(&wp->init, wp->strs, token, strlen(token));
	return id < 0 ? -ENOENT : id;
}

int wordpiece_special(const wordpiece *wp, corpus_special *out)
{
	static const char *names[5] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
	uint32_t *dst[5] = {&out->pad, &out->unk, &out->cls, &out->sep, &out->mask};
	for (int i = 0; i < 5; i++) {
		int64_t id = wordpiece_lookup(wp, names[i]);
		if (id < 0) {
			log_error("vocab has no %s token", names[i]);
			return -ENOENT;
		}
		*dst[i] = (uint32_t)id;
	}
	return 0;
}

/* ---- WordPiece ---- */

#define CACHE_SLOTS (1u << 15)
#define CACHE_KEY 24
#define CACHE_IDS 6

/* direct-mapped: a colliding word simply replaces the old one */
typedef struct cslot {
	uint32_t hash; /* 0 = empty */
	uint8_t len, n, unk;
	char key[CACHE_KEY];
	uint32_t ids[CACHE_IDS];
} cslot;

struct wordpiece_cache {
	uint64_t serial; /* of the wordpiece the entries belong to; 0 = none */
	cslot slots[CACHE_SLOTS];
};

int wordpiece_cache_create(wordpiece_cache **out)
{
	*out = calloc(1, sizeof **out);
	return *out ? 0 : -ENOMEM;
}

void wordpiece_cache_destroy(wordpiece_cache *c) { free(c); }

typedef struct enc_ctx {
	const wordpiece *wp;
	wordpiece_cache *cache;
	wordpiece_ids *ids;
	wordpiece_stats st;
} enc_ctx;

static int ids_reserve(wordpiece_ids *ids, size_t more)
{
	if (ids->n + more <= ids->cap)
		return 0;
	size_t cap = ids->cap ? ids->cap : 256;
	while (cap < ids->n + more)
		cap *= 2;
	uint32_t *v = realloc(ids->v, cap * sizeof *v);
	if (!v)
		return -ENOMEM;
	ids->v = v;
	ids->cap = cap;
	return 0;
}

/* Greedy longest-match-first; a word with any unmatched rest is one [UNK]. */
static int encode_word(void *vctx, const char *w, size_t len, size_t nchars)
{
	enc_ctx *c = vctx;
	const wordpiece *wp = c->wp;
	wordpiece_ids *ids = c->ids;
	/* at most one id per byte, or one [UNK] */
	if (ids_reserve(ids, len + 1))
		return -ENOMEM;
	c->st.words++;
	cslot *slot = NULL;
	uint32_t h = 0;
	if (c->cache && len <= CACHE_KEY) {
		h = hash_bytes(w, len);
		slot = &c->cache->slots[h & (CACHE_SLOTS - 1)];
		if (slot->hash == h && slot->len == len && memcmp(slot->key, w, len) == 0) {
			memcpy(ids->v + ids->n, slot->ids, slot->n * sizeof *slot->ids);
			ids->n += slot->n;
			c->st.tokens += slot->n;
			c->st.unk += slot->unk;
			return 0;
		}
	}
	size_t n0 = ids->n;
	if (nchars > WORDPIECE_MAX_WORD_CHARS)
		goto unk;
	size_t start = 0;
	while (start < len) {
		const vtab *t = start ? &wp->cont : &wp->init;
		size_t end = len;
		if (end - start > t->maxlen) {
			end = start + t->maxlen;
			while (end > start && ((uint8_t)w[end] & 0xC0) == 0x80)
				end--;
		}
		int32_t id = -1;
		while (end > start) {
			id = vtab_find(t, wp->strs, w + start, end - start);
			if (id >= 0)
				break;
			end--;
			while (end > start && ((uint8_t)w[end] & 0xC0) == 0x80)
				end--;
		}
		if (id < 0)
			goto unk;
		ids->v[ids->n++] = (uint32_t)id;
		start = end;
	}
	c->st.tokens += ids->n - n0;
	if (slot && ids->n - n0 <= CACHE_IDS) {
		slot->hash = h;
		slot->len = (uint8_t)len;
		slot->n = (uint8_t)(ids->n - n0);
		slot->unk = 0;
		memcpy(slot->key, w, len);
		memcpy(slot->ids, ids->v + n0, slot->n * sizeof *slot->ids);
	}
	return 0;
unk:
	ids->n = n0;
	ids->v[ids->n++] = wp->unk;
	c->st.tokens++;
	c->st.unk++;
	if (slot) {
		slot->hash = h;
		slot->len = (uint8_t)len;
		slot->n = 1;
		slot->unk = 1;
		memcpy(slot->key, w, len);
		slot->ids[0] = wp->unk;
	}
	return 0;
}

int wordpiece_encode_cached(const wordpiece *wp, wordpiece_cache *cache, const char *text,
			    size_t len, wordpiece_ids *ids, wordpiece_stats *stats)
{
	if (cache && cache->serial != wp->serial) {
		memset(cache->slots, 0, sizeof cache->slots);
		cache->serial = wp->serial;
	}
	enc_ctx c = {.wp = wp, .cache = cache, .ids = ids};
	size_t n0 = ids->n;
	int rc = wordpiece_pretokenize(wp->lower, text, len, encode_word, &c);
	if (rc < 0) {
		ids->n = n0;
		return rc;
	}
	if (stats) {
		stats->words += c.st.words;
		stats->tokens += c.st.tokens;
		stats->unk += c.st.unk;
	}
	return 0;
}

int wordpiece_encode(const wordpiece *wp, const char *text, size_t len,
		     wordpiece_ids *ids, wordpiece_stats *stats)
{
	return wordpiece_encode_cached(wp, NULL, text, len, ids, stats);
}

void wordpiece_ids_free(wordpiece_ids *ids)
{
	free(ids->v);
	ids->v = NULL;
	ids->n = ids->cap = 0;
}
