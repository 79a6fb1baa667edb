/* wordpiece — BERT WordPiece tokenization, id-for-id identical to the
 * HuggingFace `tokenizers` pipeline BertTokenizerFast uses:
 * BertNormalizer(clean_text, handle_chinese_chars, strip_accents = lowercase,
 * lowercase) + BertPreTokenizer + WordPiece(unk "[UNK]", "##", 100 chars).
 *
 * Deliberate differences from BertTokenizerFast, documented in
 * docs/formats.md: literal "[CLS]", "[MASK]"... in the text are ordinary text
 * (no added-token matching, so a corpus cannot inject control tokens), and no
 * [CLS]/[SEP] are added (the MLM builder does that). Invalid UTF-8 bytes are
 * dropped, exactly what HF does to the U+FFFD a lossy decode makes of them.
 *
 * A loaded wordpiece is immutable and may be shared by any number of threads.
 * This module never does I/O besides reading the vocab file, and never
 * allocates per token (only when an output buffer grows).
 */
#ifndef BERTD_LOADER_WORDPIECE_H
#define BERTD_LOADER_WORDPIECE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loader/corpus.h"

/* Words longer than this many characters (after normalization) become one
 * [UNK], as in HF WordPiece's max_input_chars_per_word. */
#define WORDPIECE_MAX_WORD_CHARS 100

typedef struct wordpiece wordpiece;

/* Growable id buffer; zero-initialize, free with wordpiece_ids_free. */
typedef struct wordpiece_ids {
	uint32_t *v; /* (n,) token ids */
	size_t n, cap;
} wordpiece_ids;

typedef struct wordpiece_stats {
	uint64_t words;  /* pre-tokenized words */
	uint64_t tokens; /* ids produced */
	uint64_t unk;    /* [UNK] ids produced */
} wordpiece_stats;

/* Loads a BERT vocab.txt (one token per line, line N = id N, trailing
 * whitespace trimmed, a later duplicate wins as in HF). lowercase selects the
 * uncased pipeline. Returns 0 and *out (caller owns, wordpiece_destroy), or
 * -errno from open/read, -EINVAL (empty vocab, not UTF-8, no [UNK], more
 * than 2^31 lines) with the reason logged. */
int wordpiece_load(const char *vocab_path, bool lowercase, wordpiece **out);
/* Same from a buffer holding the vocab file's bytes (copied). */
int wordpiece_create(const char *data, size_t len, bool lowercase, wordpiece **out);
void wordpiece_destroy(wordpiece *wp);

uint32_t wordpiece_vocab_size(const wordpiece *wp); /* lines in the vocab */
bool wordpiece_lowercase(const wordpiece *wp);
/* sha256 of the vocab file bytes, 64 hex chars. */
const char *wordpiece_vocab_sha256(const wordpiece *wp);
/* Token string of id (NUL-terminated, owned by wp), NULL when out of range. */
const char *wordpiece_token(const wordpiece *wp, uint32_t id);
/* Id of an exact vocab entry, or -ENOENT. */
int64_t wordpiece_lookup(const wordpiece *wp, const char *token);
/* Fills the special ids. Returns 0, or -ENOENT naming (logged) the first of
 * [PAD] [UNK] [CLS] [SEP] [MASK] the vocab lacks. */
int wordpiece_special(const wordpiece *wp, corpus_special *out);

/* Appends the ids of text[0, len) to ids. Any bytes are accepted. Returns 0
 * or -ENOMEM (ids keeps what it had). stats, if not NULL, is added to. */
int wordpiece_encode(const wordpiece *wp, const char *text, size_t len,
		     wordpiece_ids *ids, wordpiece_stats *stats);
void wordpiece_ids_free(wordpiece_ids *ids);

/* A memo of recently seen short words and their ids, for one thread. Output
 * is identical with or without it; it only skips repeated lookups (most
 * words of a corpus repeat). About 2 MiB. */
typedef struct wordpiece_cache wordpiece_cache;
int wordpiece_cache_create(wordpiece_cache **out); /* 0 or -ENOMEM; caller owns */
void wordpiece_cache_destroy(wordpiece_cache *c);
/* wordpiece_encode through cache (NULL = no cache). A cache may be used with
 * one wordpiece at a time; switching vocab empties it. */
int wordpiece_encode_cached(const wordpiece *wp, wordpiece_cache *cache, const char *text,
			    size_t len, wordpiece_ids *ids, wordpiece_stats *stats);

/* The normalizer + pre-tokenizer alone, for the vocab trainer and tests.
 * Calls fn once per word, in order, with its normalized UTF-8 bytes. When
 * nchars > WORDPIECE_MAX_WORD_CHARS the bytes are only the first
 * WORDPIECE_MAX_WORD_CHARS characters. A non-zero return from fn stops the
 * walk and is returned. */
typedef int (*wordpiece_word_fn)(void *ctx, const char *word, size_t len, size_t nchars);
int wordpiece_pretokenize(bool lowercase, const char *text, size_t len,
			  wordpiece_word_fn fn, void *ctx);

#endif
