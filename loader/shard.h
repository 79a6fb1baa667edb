/* shard — token shards on disk (docs/formats.md, "Token shards"): writing
 * them once, and mapping them read-only as corpus_view for training; plus
 * the dataset manifest that ties a directory of shards to its vocab.
 *
 * A shard is <name>.bin (raw little-endian token ids, uint16 when the vocab
 * has at most 65536 entries, else uint32) and <name>.idx (a 128-byte header,
 * then sentence and document offsets). Readers mmap both and never read a
 * .bin whole; they validate every header field and offset on open so a
 * corrupt file is an error, never a crash (a file truncated by someone else
 * *after* open can still SIGBUS: shards are immutable once written).
 */
#ifndef BERTD_LOADER_SHARD_H
#define BERTD_LOADER_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loader/corpus.h"

#define SHARD_IDX_MAGIC "BERTDIDX"
#define SHARD_IDX_VERSION 1
#define SHARD_IDX_HEADER_BYTES 128
#define SHARD_FLAG_LOWERCASE 1u

#define SHARD_MANIFEST_NAME "manifest.json"
#define SHARD_MANIFEST_FORMAT "bertd-dataset"
#define SHARD_MANIFEST_VERSION 1

/* What a shard's header records about its vocab. */
typedef struct shard_vocab_info {
	uint32_t vocab_size;
	bool lowercase;
	corpus_special special;
	char sha256[65]; /* hex of the vocab file's bytes */
} shard_vocab_info;

typedef struct shard_counts {
	uint64_t tokens, sents, docs;
} shard_counts;

/* ---- writing ---- */

typedef struct shard_writer shard_writer;

/* Starts <dir>/<name>.bin; the .idx is written by shard_writer_finish.
 * Returns 0 and *out (caller owns: finish or abort it), -EINVAL for a bad
 * name or vocab, or -errno from open. */
int shard_writer_create(const char *dir, const char *name, const shard_vocab_info *vocab,
			shard_writer **out);
/* Appends one sentence of n > 0 ids (each < vocab_size) to the current
 * document. Returns 0, -EINVAL (n == 0 or an id out of range), -ENOMEM or
 * -errno from write. */
int shard_writer_add_sentence(shard_writer *w, const uint32_t *ids, size_t n);
/* Ends the current document; a no-op when it has no sentence yet. */
int shard_writer_end_document(shard_writer *w);
shard_counts shard_writer_counts(const shard_writer *w); /* whole documents + open one */
/* Ends the open document, writes the .idx, fsyncs both files and frees w.
 * Returns 0 (counts filled if not NULL) or -errno; w is freed either way. */
int shard_writer_finish(shard_writer *w, shard_counts *counts);
/* sha256 (hex) of a finished shard's two files, as the manifest records
 * them ("bin_sha256", "idx_sha256"). */
typedef struct shard_sums {
	char bin[65], idx[65];
} shard_sums;
/* shard_writer_finish, and the sha256 of both files as written (sums, if
 * not NULL; filled only on success), hashed on the way out, so a dataset's
 * digests cost no second read. */
int shard_writer_finish_sums(shard_writer *w, shard_counts *counts, shard_sums *sums);
/* Frees w and unlinks what it wrote. */
void shard_writer_abort(shard_writer *w);

/* ---- reading ---- */

typedef struct shard shard;

/* Maps <dir>/<name>.{idx,bin}. expect_sha256 (hex) may be NULL; when given,
 * a shard made with another vocab is refused. Returns 0 and *out (caller
 * owns, shard_close), or: -errno from open/mmap, -EBADMSG (bad magic,
 * truncated, inconsistent counts or offsets, .bin of the wrong size),
 * -ENOTSUP (unknown version), -ESTALE (vocab sha256 differs). Every error is
 * logged with the file name and the reason. */
int shard_open(const char *dir, const char *name, const char *expect_sha256, shard **out);
const corpus_view *shard_view(const shard *s);
const shard_vocab_info *shard_vocab(const shard *s);
void shard_close(shard *s);

/* ---- datasets ---- */

/* One prepared dataset: the manifest, its vocab and every shard mapped.
 * views[i] is shard i's corpus_view (the array the MLM builder samples). */
typedef struct shard_dataset {
	char dir[4096];
	char vocab_path[4200]; /* <dir>/vocab.txt */
	shard_vocab_info vocab;
	size_t n_shards;
	shard **shards;        /* (n_shards,) */
	corpus_view *views;    /* (n_shards,) copies of shard_view(shards[i]) */
	shard_counts totals;
} shard_dataset;

/* Opens <dir>/manifest.json, checks the vocab file's sha256 and every shard
 * against it. Returns 0 and *out (caller owns, shard_dataset_close), -errno,
 * or -EBADMSG for a malformed manifest or counts that disagree with the
 * shards (each logged). */
int shard_dataset_open(const char *dir, shard_dataset **out);
void shard_dataset_close(shard_dataset *d);

/* sha256 (hex) of a whole file's bytes. 0 or -errno (logged). */
int shard_file_sha256(const char *path, char hex[65]);

/* Checks a dataset directory made elsewhere before it is used as is: the
 * manifest, the vocab's and every shard's structure (shard_dataset_open),
 * then every shard file's sha256 against the manifest's "bin_sha256" /
 * "idx_sha256" (reading every byte once). Returns 0, or -errno / -EBADMSG
 * / -ESTALE / -ENOTSUP with the offending file's name below dir in file
 * (e.g. "shard-00002.bin", "manifest.json") and a one-line reason in why.
 * *had_sums (if not NULL) says whether the manifest carried the digests:
 * one written before they existed is checked structurally only. */
int shard_dataset_verify(const char *dir, char *file, size_t file_cap, char *why, size_t why_cap,
			 bool *had_sums);

#endif
