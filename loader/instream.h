/* instream — what a corpus file is, told by its first bytes (never its
 * name), and its text as a stream: gzip, zstd, xz and bzip2 files are
 * decompressed (concatenated streams too: pigz, pbzip2, zstd frames), and
 * tar archives (plain or compressed; ustar, GNU long names, pax paths) give
 * their regular members one after another, each one decompressed too when
 * it is itself compressed. zlib, libzstd, liblzma and libbz2 do the
 * decompressing, each as a stream, so memory stays bounded (one 64 KiB
 * input block a layer and the decompressors' windows: xz is capped at
 * 1 GiB, zstd at its default 128 MiB window) whatever the sizes.
 *
 * Also the check that decompressed bytes are text (instream_text_check).
 *
 * Must never: pick a format by a file's name, seek (a stream is read once,
 * front to back), or read a member that is not a regular file.
 */
#ifndef BERTD_LOADER_INSTREAM_H
#define BERTD_LOADER_INSTREAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Bytes instream_sniff wants to see (a tar header's magic sits at 257). */
#define INSTREAM_HEAD 512

typedef enum instream_kind {
	INSTREAM_PLAIN = 0, /* none of the below: read as it is */
	INSTREAM_GZIP,
	INSTREAM_ZSTD,
	INSTREAM_XZ,
	INSTREAM_BZIP2,
	INSTREAM_TAR,       /* POSIX ustar / GNU / pax header */
	INSTREAM_PARQUET,   /* "PAR1": refused by the caller */
} instream_kind;

/* The kind of data whose first n bytes are head (n < INSTREAM_HEAD when the
 * data is shorter). */
instream_kind instream_sniff(const void *head, size_t n);
/* "gzip", "zstd", "xz", "bzip2", "tar", "parquet" or "text". */
const char *instream_kind_name(instream_kind k);
/* Whether data of kind k is read through an instream (compressed or tar). */
int instream_kind_streamed(instream_kind k);

typedef struct instream instream;

/* Opens the compressed file or tar archive on fd (taken: instream_close
 * closes it, on failure too). Returns 0, or a negative errno with msg set. */
int instream_open(int fd, instream **out, char *msg, size_t msg_len);

/* Moves to the next member: 1 with *name its path inside the archive
 * ("./" removed; the string lives until the next call), or *name = NULL
 * for a compressed file that is not an archive (its one member is its
 * content); 0 at the end; a negative errno with msg set (corrupt data, a
 * member that is Parquet, or compressed twice). Members that are not
 * regular files are passed over. */
int instream_next(instream *s, const char **name, char *msg, size_t msg_len);

/* Reads up to n bytes of the current member's (decompressed) content:
 * how many, 0 at its end, or a negative errno with msg set. */
ssize_t instream_read(instream *s, void *buf, size_t n, char *msg, size_t msg_len);

/* Bytes of the file itself (compressed) consumed so far. */
uint64_t instream_file_bytes(instream *s);

void instream_close(instream *s);

/* Whether buf[0..n) is text: 0 when it is UTF-8 (RFC 3629: no overlong
 * forms, surrogates or code points past U+10FFFF) without a NUL byte;
 * else -EILSEQ with *at the offset of the first bad byte and *nul set when
 * that byte is a NUL (binary data). A sequence cut by the end of buf is
 * invalid: callers pass whole lines. */
int instream_text_check(const void *buf, size_t n, size_t *at, int *nul);

#endif
