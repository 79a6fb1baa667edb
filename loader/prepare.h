/* prepare — raw corpus to a dataset directory of token shards (the library
 * behind bertd-prepare; docs/formats.md describes the output).
 *
 * Input rules:
 *  - text: one sentence per line; a blank line (only spaces, tabs, CR)
 *    ends a document, and so does the end of each file. A corpus of one
 *    paragraph per line is thus one document per file, each line a
 *    "sentence". CRLF and a leading UTF-8 BOM are accepted. Lines that
 *    tokenize to nothing (only control characters, say) are skipped.
 *  - jsonl: one JSON object per line; its text field (a string) is one
 *    document, each non-blank line of it a sentence. Blank input lines are
 *    skipped; any other line that is not an object with that string field
 *    is an error naming file and line.
 *  - sentences longer than max_sentence_tokens are cut into pieces of at
 *    most that many tokens (0 = never cut).
 * Inputs may be files, directories (all regular files below, recursively,
 * skipping names starting with '.'), or glob patterns; they are read in
 * sorted order so the output does not depend on the thread count. See
 * prepare_opts for the data roots and the walk's bounds.
 *  - a file is told by its first bytes (loader/instream.h): gzip, zstd, xz
 *    and bzip2 files are decompressed as a stream, a tar archive (plain or
 *    compressed) gives each regular member as one file of the corpus, and
 *    Parquet is refused with a conversion to JSON lines. The output is the
 *    same as for the decompressed / extracted files.
 *  - every file (member) must be UTF-8 text without NUL bytes: else the
 *    preparation fails naming it and the byte offset (in the decompressed
 *    content) of the first bad byte.
 *  - include / exclude select by name among the files found below a
 *    directory or by a glob, and among the members of a tar archive; a
 *    file named as it is is always read.
 *
 * The dataset is built in the work directory "<parent>/.<name>.partial"
 * beside out (fs_partial_dir; a name no dataset can have) and renamed to out only when
 * complete, so a crash never leaves a directory that looks ready. Each
 * finished shard is fsync'ed and recorded in the work directory's
 * resume.json (with the trained vocab, the resume point and a fingerprint
 * of the options and the inputs' sizes and mtimes): a run killed by a
 * signal, started again with the same options on unchanged inputs, checks
 * and keeps the shards and the vocab it finds there and continues from the
 * next one, and its output is byte-identical to a run never interrupted.
 * A work directory whose fingerprint differs is started over. A run that
 * fails cleanly removes it. One run at a time holds it (flock).
 * Must never: tokenize anything twice for the same output, retrain a
 * vocab it has, or leave out behind on failure.
 */
#ifndef BERTD_LOADER_PREPARE_H
#define BERTD_LOADER_PREPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef enum prepare_format { PREPARE_TEXT = 0, PREPARE_JSONL = 1 } prepare_format;

typedef struct prepare_opts {
	const char *const *inputs;  /* (n_inputs,) paths, directories or globs */
	size_t n_inputs;
	const char *out_dir;        /* must not exist yet */
	prepare_format format;
	const char *text_field;     /* jsonl; NULL = "text" */
	const char *vocab_path;     /* NULL: train one (train_vocab_size) */
	uint32_t train_vocab_size;
	int lowercase;              /* 1, 0, or -1: infer from the vocab (uncased if
				     * no entry has an ASCII capital; training: 1) */
	uint64_t shard_tokens;      /* close a shard at the first document end past this; 0 = 64Mi */
	uint32_t max_sentence_tokens; /* 0 = never cut */
	int threads;                /* tokenizing threads, >= 1 */
	int progress_fd;            /* JSON lines {"phase","bytes_done","bytes_total","fraction",...}:
				     * bytes of the corpus read in this phase, and fraction
				     * monotonic over the run (docs/formats.md); -1 = none.
				     * Write errors are ignored; a caller whose reader may
				     * close a pipe should ignore SIGPIPE (bertd-prepare does). */
	bool progress_tty;          /* redraw a progress line on stderr */
	/* Confinement (the daemon passes its data_roots): when n_roots > 0
	 * every input and the vocab must lie under one of roots, and every
	 * file is opened beneath the root holding it (fs_open_beneath): a
	 * symbolic link whose target leaves that root is skipped with a
	 * warning naming the link. n_roots = 0: links are followed anywhere. */
	const char *const *roots;   /* (n_roots,) directories */
	size_t n_roots;
	/* Walk bounds, so that no directory tree keeps a run going forever. A
	 * directory met again below itself (a link loop) is skipped with a
	 * warning; going deeper than max_depth, or past max_files or max_bytes,
	 * fails the run. 0 = the default: 32 levels, 1,000,000 files, bytes
	 * unlimited. */
	uint32_t max_depth;
	uint64_t max_files;
	uint64_t max_bytes;
	/* Name patterns (fnmatch): a found file or member is read when it
	 * matches one of include (none given: every one) and none of exclude.
	 * A pattern without '/' matches the base name; one with '/' the path
	 * below the input directory (or inside the archive). */
	const char *const *include; /* (n_include,) */
	size_t n_include;
	const char *const *exclude; /* (n_exclude,) */
	size_t n_exclude;
	bool fresh;                 /* discard an interrupted run's work instead of resuming */
	int64_t created;            /* the manifest's "created", Unix seconds; 0 = when the
				     * preparation first started (kept across a resume) */
} prepare_opts;

#define PREPARE_DEFAULT_MAX_DEPTH 32u
#define PREPARE_DEFAULT_MAX_FILES 1000000ull

typedef struct prepare_summary {
	uint64_t files, bytes, documents, sentences, tokens, unk, shards;
	/* input sentences (lines) before the max_sentence_tokens cut: the
	 * longest one's tokens, and how many are longer than 126 and 510
	 * tokens (what a sequence of 128 / 512 holds with [CLS] and [SEP]) */
	uint64_t longest_sentence, sentences_over_126, sentences_over_510;
	uint32_t vocab_size;           /* entries of the vocab used */
	uint32_t vocab_size_requested; /* trained: the size asked for (vocab_size may be
					* less: the corpus ran out of pairs); else 0 */
	bool lowercase, vocab_trained;
	char vocab_sha256[65];
	double seconds;             /* wall time of the whole run */
	double tokenize_seconds;    /* the tokenizing pass alone */
	uint64_t resumed_shards;    /* shards kept from an interrupted run */
	bool resumed_vocab;         /* its trained vocab, reused */
} prepare_summary;

/* Error classes, so a CLI can map them to exit codes. */
enum prepare_error {
	PREPARE_ERR_NONE = 0,
	PREPARE_ERR_USAGE,   /* bad options */
	PREPARE_ERR_INPUT,   /* no inputs, unreadable or malformed input, empty corpus */
	PREPARE_ERR_VOCAB,   /* vocab missing, unusable, or lacking a special token */
	PREPARE_ERR_OUTPUT,  /* out exists, or cannot be written */
	PREPARE_ERR_INTERNAL /* out of memory, thread creation... */
};

/* Runs the whole preparation. Returns 0 with *s filled, or a negative errno
 * with *err set to its class and msg (if not NULL) to a one-line reason. */
int prepare_run(const prepare_opts *o, prepare_summary *s, enum prepare_error *err,
		char *msg, size_t msg_len);

/* Writes one line (n bytes, ending in '\n') whole to a progress fd, riding
 * out partial writes and EINTR. Returns 0 or -errno (EPIPE: reader gone). */
int prepare_write_line(int fd, const char *line, size_t n);

/* The summary as a JSON object (caller owns, json_decref). */
json_t *prepare_summary_json(const prepare_summary *s, const char *out_dir);

#endif
