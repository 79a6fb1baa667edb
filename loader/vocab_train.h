/* vocab_train — trains a WordPiece vocab.txt on a domain corpus, in the
 * spirit of HF tokenizers' BertWordPieceTokenizer.train (BPE-style merges of
 * "##"-continued pieces, then used with greedy longest-match WordPiece).
 *
 * Algorithm (also in docs/formats.md, "Trained vocab"):
 *  1. Words are what wordpiece_pretokenize makes of the corpus (same
 *     normalization as tokenization will use), counted. Words over 100
 *     characters are ignored (they tokenize to [UNK] anyway).
 *  2. Alphabet: the limit_alphabet most frequent characters (weighted by
 *     word count; ties by code point). Words with other characters are left
 *     out of training; those characters become [UNK] when tokenizing.
 *  3. vocab.txt = [PAD] [UNK] [CLS] [SEP] [MASK], then every alphabet
 *     character "c" in code point order, then every "##c", then merged
 *     pieces in the order they were merged.
 *  4. Each word starts as c1 ##c2 ##c3 ...; repeatedly the adjacent pair
 *     with the highest total count is merged ("ab" + "##c" -> "abc",
 *     "##ab" + "##c" -> "##abc"); ties go to the bytewise-smallest merged
 *     string, then the smaller symbol ids. A merged string already in the
 *     vocab is reused, not added again. Stops at vocab_size entries, or when
 *     no pair occurs min_frequency times (default 1: merging goes on while
 *     any pair is left, as HF's WordPieceTrainer does with its default
 *     min_frequency 0; the heap takes frequent pairs first, so a higher
 *     floor only stops earlier). A corpus that runs out of pairs first gets
 *     a smaller vocab than asked, in which every word is one entry.
 * Deterministic: same corpus and options, byte-identical vocab, whatever the
 * thread count that produced the counts. Never touches files.
 */
#ifndef BERTD_LOADER_VOCAB_TRAIN_H
#define BERTD_LOADER_VOCAB_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Word counts (normalized word -> occurrences). Not thread-safe: one per
 * thread, then merge. */
typedef struct vocab_counter vocab_counter;

int vocab_counter_create(bool lowercase, vocab_counter **out);
void vocab_counter_destroy(vocab_counter *c);
/* Pre-tokenizes text[0, len) and counts its words. 0 or -ENOMEM. */
int vocab_counter_add_text(vocab_counter *c, const char *text, size_t len);
/* Adds count occurrences of one normalized word. 0 or -ENOMEM. */
int vocab_counter_add_word(vocab_counter *c, const char *word, size_t len, uint64_t count);
/* dst += src. 0 or -ENOMEM. */
int vocab_counter_merge(vocab_counter *dst, const vocab_counter *src);
uint64_t vocab_counter_unique(const vocab_counter *c);

typedef struct vocab_train_opts {
	uint32_t vocab_size;     /* entries wanted, specials included (>= 5 + 2) */
	uint32_t min_frequency;  /* 0 -> 1 (merge while any pair is left) */
	uint32_t limit_alphabet; /* 0 -> 1000; shrunk to fit vocab_size */
} vocab_train_opts;

/* Trains. On success *vocab_txt (caller owns, free) holds the vocab file
 * bytes, one token per line, *len bytes, and *n_tokens its lines: at most
 * vocab_size, fewer when the corpus has no pair left to merge (not an
 * error; the caller reports the size reached). Returns
 * 0, -EINVAL (vocab_size too small, or no words counted) or -ENOMEM. */
int vocab_train(const vocab_counter *c, const vocab_train_opts *o, char **vocab_txt,
		size_t *len, uint32_t *n_tokens);

#endif
