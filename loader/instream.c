/* instream — see instream.h.
 *
 * Two libarchive readers at most: the file's (`outer`: the four filters,
 * tar, raw for a compressed file that is no archive, empty), and for a
 * member that is itself compressed an `inner` one fed from the outer
 * member's data (filters, raw, empty). The first INSTREAM_HEAD bytes of
 * each member are read ahead to tell what it is, and served first.
 */
#include "loader/instream.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK (64u << 10)

struct instream {
	struct archive *outer, *inner;
	int fd;
	bool raw;                          /* outer is one compressed stream, no archive */
	char *name;                        /* the current member's path */
	unsigned char ohead[INSTREAM_HEAD]; /* outer member's first bytes, for inner */
	size_t ohead_n, ohead_pos;
	unsigned char head[INSTREAM_HEAD]; /* the content's first bytes, for instream_read */
	size_t head_n, head_pos;
	unsigned char block[BLOCK];         /* inner's input */
};

instream_kind instream_sniff(const void *head, size_t n)
{
	const unsigned char *h = head;
	static const unsigned char xz[6] = {0xFD, '7', 'z', 'X', 'Z', 0x00};
	static const unsigned char bz_block[6] = {0x31, 0x41, 0x59, 0x26, 0x53, 0x59}; /* pi */
	static const unsigned char bz_end[6] = {0x17, 0x72, 0x45, 0x38, 0x50, 0x90};   /* sqrt(pi) */
	if (n >= 3 && h[0] == 0x1F && h[1] == 0x8B && h[2] == 8)
		return INSTREAM_GZIP;
	if (n >= 4 && h[0] == 0x28 && h[1] == 0xB5 && h[2] == 0x2F && h[3] == 0xFD)
		return INSTREAM_ZSTD;
	if (n >= 6 && memcmp(h, xz, 6) == 0)
		return INSTREAM_XZ;
	/* "BZh1".."BZh9" could start a text line: the block magic after it cannot */
	if (n >= 10 && h[0] == 'B' && h[1] == 'Z' && h[2] == 'h' && h[3] >= '1' && h[3] <= '9' &&
	    (memcmp(h + 4, bz_block, 6) == 0 || memcmp(h + 4, bz_end, 6) == 0))
		return INSTREAM_BZIP2;
	if (n >= 4 && memcmp(h, "PAR1", 4) == 0)
		return INSTREAM_PARQUET;
	if (n >= 263 && memcmp(h + 257, "ustar", 5) == 0)
		return INSTREAM_TAR;
	return INSTREAM_PLAIN;
}

const char *instream_kind_name(instream_kind k)
{
	switch (k) {
	case INSTREAM_GZIP: return "gzip";
	case INSTREAM_ZSTD: return "zstd";
	case INSTREAM_XZ: return "xz";
	case INSTREAM_BZIP2: return "bzip2";
	case INSTREAM_TAR: return "tar";
	case INSTREAM_PARQUET: return "parquet";
	default: return "text";
	}
}

int instream_kind_streamed(instream_kind k)
{
	return k == INSTREAM_GZIP || k == INSTREAM_ZSTD || k == INSTREAM_XZ || k == INSTREAM_BZIP2 ||
	       k == INSTREAM_TAR;
}

static bool compressed(instream_kind k)
{
	return instream_kind_streamed(k) && k != INSTREAM_TAR;
}

static int la_fail(struct archive *a, const char *what, char *msg, size_t msg_len)
{
	const char *e = a ? archive_error_string(a) : NULL;
	snprintf(msg, msg_len, "%s: %s", what, e ? e : "unreadable");
	int no = a ? archive_errno(a) : 0;
	return no == ENOMEM ? -ENOMEM : -EBADMSG;
}

/* The four decompressors, built in: ARCHIVE_WARN means libarchive would run
 * an external program instead, which a preparation must not do. */
static int add_filters(struct archive *a, char *msg, size_t msg_len)
{
	int (*const add[])(struct archive *) = {archive_read_support_filter_gzip,
						archive_read_support_filter_bzip2,
						archive_read_support_filter_xz,
						archive_read_support_filter_zstd};
	static const char *const name[] = {"gzip", "bzip2", "xz", "zstd"};
	for (size_t i = 0; i < sizeof add / sizeof add[0]; i++)
		if (add[i](a) != ARCHIVE_OK) {
			snprintf(msg, msg_len, "this libarchive has no built-in %s decompressor", name[i]);
			return -ENOTSUP;
		}
	return 0;
}

int instream_open(int fd, instream **out, char *msg, size_t msg_len)
{
	int rc = 0;
	instream *s = calloc(1, sizeof *s);
	*out = NULL;
	if (!s) {
		close(fd);
		snprintf(msg, msg_len, "out of memory");
		return -ENOMEM;
	}
	s->fd = fd;
	if (!(s->outer = archive_read_new())) {
		rc = -ENOMEM;
		snprintf(msg, msg_len, "out of memory");
		goto out;
	}
	if ((rc = add_filters(s->outer, msg, msg_len)) < 0)
		goto out;
	if (archive_read_support_format_tar(s->outer) != ARCHIVE_OK ||
	    archive_read_support_format_raw(s->outer) != ARCHIVE_OK ||
	    archive_read_support_format_empty(s->outer) != ARCHIVE_OK ||
	    archive_read_open_fd(s->outer, fd, BLOCK) != ARCHIVE_OK) {
		rc = la_fail(s->outer, "cannot read", msg, msg_len);
		goto out;
	}
out:
	if (rc < 0) {
		instream_close(s);
		return rc;
	}
	*out = s;
	return 0;
}

/* Fills buf (cap bytes) from a's current entry as far as it goes. */
static ssize_t read_full(struct archive *a, unsigned char *buf, size_t cap)
{
	size_t n = 0;
	while (n < cap) {
		la_ssize_t k = archive_read_data(a, buf + n, cap - n);
		if (k < 0)
			return -1;
		if (k == 0)
			break;
		n += (size_t)k;
	}
	return (ssize_t)n;
}

/* inner's input: the outer member's head, then the rest of its data */
static la_ssize_t inner_read(struct archive *a, void *ud, const void **buf)
{
	instream *s = ud;
	if (s->ohead_pos < s->ohead_n) {
		*buf = s->ohead + s->ohead_pos;
		la_ssize_t n = (la_ssize_t)(s->ohead_n - s->ohead_pos);
		s->ohead_pos = s->ohead_n;
		return n;
	}
	la_ssize_t k = archive_read_data(s->outer, s->block, sizeof s->block);
	if (k < 0) {
		const char *e = archive_error_string(s->outer);
		archive_set_error(a, EIO, "%s", e ? e : "read error");
		return -1;
	}
	*buf = s->block;
	return k;
}

static void close_inner(instream *s)
{
	if (s->inner)
		archive_read_free(s->inner);
	s->inner = NULL;
}

/* Opens inner on the current outer member (whose head is in ohead) and
 * reads the decompressed content's head. */
static int open_inner(instream *s, const char *what, char *msg, size_t msg_len)
{
	int rc = 0;
	if (!(s->inner = archive_read_new())) {
		snprintf(msg, msg_len, "out of memory");
		return -ENOMEM;
	}
	if ((rc = add_filters(s->inner, msg, msg_len)) < 0)
		return rc;
	struct archive_entry *e;
	if (archive_read_support_format_raw(s->inner) != ARCHIVE_OK ||
	    archive_read_support_format_empty(s->inner) != ARCHIVE_OK ||
	    archive_read_open(s->inner, s, NULL, inner_read, NULL) != ARCHIVE_OK)
		return la_fail(s->inner, what, msg, msg_len);
	int r = archive_read_next_header(s->inner, &e);
	if (r == ARCHIVE_EOF) {
		s->head_n = 0;
		return 0;
	}
	if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
		return la_fail(s->inner, what, msg, msg_len);
	ssize_t n = read_full(s->inner, s->head, sizeof s->head);
	if (n < 0)
		return la_fail(s->inner, what, msg, msg_len);
	s->head_n = (size_t)n;
	return 0;
}

int instream_next(instream *s, const char **name, char *msg, size_t msg_len)
{
	*name = NULL;
	close_inner(s);
	free(s->name);
	s->name = NULL;
	s->head_n = s->head_pos = 0;
	struct archive_entry *e;
	for (;;) {
		int r = archive_read_next_header(s->outer, &e);
		if (r == ARCHIVE_EOF)
			return 0;
		if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
			return la_fail(s->outer, "corrupt or truncated", msg, msg_len);
		s->raw = archive_format(s->outer) == ARCHIVE_FORMAT_RAW;
		/* a link to a member already read would read it twice */
		if (!s->raw && (archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e)))
			continue;
		break;
	}
	if (!s->raw) {
		const char *p = archive_entry_pathname(e);
		while (p && (p[0] == '/' || (p[0] == '.' && p[1] == '/')))
			p += p[0] == '/' ? 1 : 2;
		if (!(s->name = strdup(p ? p : "")))
			return -ENOMEM;
	}
	const char *what = s->name ? s->name : "decompressing";
	ssize_t n = read_full(s->outer, s->ohead, sizeof s->ohead);
	if (n < 0)
		return la_fail(s->outer, s->name ? s->name : "corrupt or truncated", msg, msg_len);
	s->ohead_n = (size_t)n;
	s->ohead_pos = 0;
	instream_kind k = instream_sniff(s->ohead, s->ohead_n);
	int rc = 0;
	if (compressed(k)) {
		if ((rc = open_inner(s, what, msg, msg_len)) < 0)
			return rc;
		k = instream_sniff(s->head, s->head_n);
		if (compressed(k)) {
			snprintf(msg, msg_len, "%s: compressed twice (%s inside %s): decompress it once first",
				 what, instream_kind_name(k), instream_kind_name(instream_sniff(s->ohead, s->ohead_n)));
			return -ENOTSUP;
		}
	} else {
		memcpy(s->head, s->ohead, s->ohead_n);
		s->head_n = s->ohead_n;
		s->ohead_pos = s->ohead_n;
	}
	if (k == INSTREAM_PARQUET) {
		snprintf(msg, msg_len, "%s: a Parquet file, which bertd does not read; convert it to JSON lines "
			 "first, e.g. python3 -c \"import pandas; pandas.read_parquet('x.parquet')"
			 ".to_json('x.jsonl', orient='records', lines=True)\"", what);
		return -ENOTSUP;
	}
	if (k == INSTREAM_TAR) {
		snprintf(msg, msg_len, "%s: a tar archive inside an archive, which is not read: extract it first",
			 what);
		return -ENOTSUP;
	}
	*name = s->name;
	return 1;
}

ssize_t instream_read(instream *s, void *buf, size_t n, char *msg, size_t msg_len)
{
	if (s->head_pos < s->head_n) {
		size_t k = s->head_n - s->head_pos < n ? s->head_n - s->head_pos : n;
		memcpy(buf, s->head + s->head_pos, k);
		s->head_pos += k;
		return (ssize_t)k;
	}
	struct archive *a = s->inner ? s->inner : s->outer;
	la_ssize_t k = archive_read_data(a, buf, n);
	if (k < 0)
		return la_fail(a, s->name ? s->name : "corrupt or truncated", msg, msg_len);
	return (ssize_t)k;
}

uint64_t instream_file_bytes(instream *s)
{
	la_int64_t b = archive_filter_bytes(s->outer, -1);
	return b > 0 ? (uint64_t)b : 0;
}

void instream_close(instream *s)
{
	if (!s)
		return;
	close_inner(s);
	if (s->outer)
		archive_read_free(s->outer);
	if (s->fd >= 0)
		close(s->fd);
	free(s->name);
	free(s);
}

/* ---- text check ---- */

int instream_text_check(const void *buf, size_t n, size_t *at, int *nul)
{
	const unsigned char *s = buf;
	size_t i = 0;
	*nul = 0;
	while (i < n) {
		/* ASCII without NUL, eight bytes at a time */
		while (i + 8 <= n) {
			uint64_t w;
			memcpy(&w, s + i, 8);
			bool high = w & 0x8080808080808080ull;
			bool zero = (w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull;
			if (high || zero)
				break;
			i += 8;
		}
		if (i >= n)
			break;
		unsigned c = s[i];
		if (c == 0) {
			*at = i;
			*nul = 1;
			return -EILSEQ;
		}
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t len;
		unsigned lo = 0x80, hi = 0xBF;
		if (c >= 0xC2 && c <= 0xDF)
			len = 2;
		else if (c >= 0xE0 && c <= 0xEF) {
			len = 3;
			if (c == 0xE0)
				lo = 0xA0; /* overlong */
			else if (c == 0xED)
				hi = 0x9F; /* surrogates */
		} else if (c >= 0xF0 && c <= 0xF4) {
			len = 4;
			if (c == 0xF0)
				lo = 0x90;
			else if (c == 0xF4)
				hi = 0x8F; /* past U+10FFFF */
		} else {
			*at = i;
			return -EILSEQ;
		}
		for (size_t k = 1; k < len; k++) {
			unsigned d = i + k < n ? s[i + k] : 0x100;
			if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) {
				*at = i;
				return -EILSEQ;
			}
		}
		i += len;
	}
	return 0;
}
