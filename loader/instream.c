/* instream — see instream.h.
 *
 * Layers, each reading from the one below: the file (fd); its decompressor
 * when it is compressed (`outer`); a tar reader when what that gives is an
 * archive (members are byte ranges of it); a member's own decompressor
 * (`inner`). The first INSTREAM_HEAD bytes of each level are read ahead to
 * tell what it is, and served again to the layer above.
 */
#include "loader/instream.h"

#include <bzlib.h>
#include <errno.h>
#include <lzma.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define BLOCK (64u << 10)
#define TAR_NAME_MAX (64u << 10) /* a GNU long name or pax record set, at most */

typedef struct instream instream;
typedef ssize_t (*read_fn)(instream *s, void *buf, size_t n);

/* One decompressor: its input buffer is filled from `below`. */
typedef struct dec {
	instream_kind kind;
	read_fn below;
	z_stream z;
	ZSTD_DStream *zs;
	lzma_stream lz;
	bz_stream bz;
	bool live;         /* the library's state is initialized */
	bool ended;        /* the last (concatenated) stream ended */
	unsigned char in[BLOCK];
	size_t in_pos, in_n;
	bool in_eof;
	uint64_t out;      /* bytes produced */
} dec;

struct instream {
	int fd;
	uint64_t file_bytes;
	char err[400];
	dec *outer, *inner;
	unsigned char pb[INSTREAM_HEAD]; /* pushed back above the file / outer layer */
	size_t pb_n, pb_pos;
	bool tar, single, single_done;
	uint64_t tar_off;                /* bytes of the archive read */
	uint64_t left, pad;              /* the current member's bytes and padding to come */
	char *name;
	unsigned char mh[INSTREAM_HEAD]; /* pushed back above the member */
	size_t mh_n, mh_pos;
	unsigned char head[INSTREAM_HEAD]; /* the content's first bytes, for instream_read */
	size_t head_n, head_pos;
};

static const char PARQUET_HINT[] =
	"a Parquet file, which bertd does not read; convert it to JSON lines first, e.g. "
	"python3 -c \"import pandas; pandas.read_parquet('x.parquet').to_json('x.jsonl', "
	"orient='records', lines=True)\"";

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
	/* a text line may start "PAR1": Parquet's first page header is binary */
	size_t at;
	int nul;
	if (n >= 4 && memcmp(h, "PAR1", 4) == 0 && instream_text_check(h, n, &at, &nul) < 0 &&
	    (nul || at + 4 <= n))
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

static int fail(instream *s, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(instream *s, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, sizeof s->err, fmt, ap);
	va_end(ap);
	return rc;
}

/* ---- decompressors ---- */

static void dec_end(dec *d)
{
	if (!d->live)
		return;
	switch (d->kind) {
	case INSTREAM_GZIP: inflateEnd(&d->z); break;
	case INSTREAM_ZSTD: ZSTD_freeDStream(d->zs); d->zs = NULL; break;
	case INSTREAM_XZ: lzma_end(&d->lz); break;
	case INSTREAM_BZIP2: BZ2_bzDecompressEnd(&d->bz); break;
	default: break;
	}
	d->live = false;
}

static int dec_begin(dec *d)
{
	int ok = 0;
	switch (d->kind) {
	case INSTREAM_GZIP:
		memset(&d->z, 0, sizeof d->z);
		ok = inflateInit2(&d->z, 15 + 16) == Z_OK; /* gzip framing only */
		break;
	case INSTREAM_ZSTD:
		ok = (d->zs = ZSTD_createDStream()) != NULL && !ZSTD_isError(ZSTD_initDStream(d->zs));
		break;
	case INSTREAM_XZ:
		d->lz = (lzma_stream)LZMA_STREAM_INIT;
		/* 1 GiB: every preset (xz -9e needs 65 MiB) and then some */
		ok = lzma_stream_decoder(&d->lz, 1ull << 30, LZMA_CONCATENATED) == LZMA_OK;
		break;
	case INSTREAM_BZIP2:
		memset(&d->bz, 0, sizeof d->bz);
		ok = BZ2_bzDecompressInit(&d->bz, 0, 0) == BZ_OK;
		break;
	default:
		break;
	}
	d->live = ok;
	return ok ? 0 : -ENOMEM;
}

/* A decompressor of kind k over below, whose first n bytes (head) were
 * already read from it. */
static dec *dec_create(instream *s, instream_kind k, read_fn below, const void *head, size_t n)
{
	dec *d = calloc(1, sizeof *d);
	if (!d) {
		fail(s, -ENOMEM, "out of memory");
		return NULL;
	}
	d->kind = k;
	d->below = below;
	memcpy(d->in, head, n);
	d->in_n = n;
	if (dec_begin(d) < 0) {
		free(d);
		fail(s, -ENOMEM, "out of memory starting the %s decompressor", instream_kind_name(k));
		return NULL;
	}
	return d;
}

static void dec_destroy(dec *d)
{
	if (d) {
		dec_end(d);
		free(d);
	}
}

/* Up to n decompressed bytes: how many, 0 at the end, or a negative errno
 * (s->err says why). Concatenated streams (pigz, pbzip2, zstd frames) are
 * read one after another. */
static ssize_t dec_read(instream *s, dec *d, void *buf, size_t n)
{
	const char *kn = instream_kind_name(d->kind);
	for (;;) {
		if (d->in_pos == d->in_n && !d->in_eof) {
			ssize_t k = d->below(s, d->in, sizeof d->in);
			if (k < 0)
				return k;
			d->in_pos = 0;
			d->in_n = (size_t)k;
			d->in_eof = k == 0;
		}
		size_t avail = d->in_n - d->in_pos, got = 0;
		bool end = false;
		if (d->ended) { /* another stream after the last one's end */
			if (avail == 0)
				return 0;
			if (d->kind != INSTREAM_ZSTD) {
				dec_end(d);
				if (dec_begin(d) < 0)
					return fail(s, -ENOMEM, "out of memory");
			}
			d->ended = false;
		}
		const unsigned char *in = d->in + d->in_pos;
		switch (d->kind) {
		case INSTREAM_GZIP: {
			d->z.next_in = (unsigned char *)in;
			d->z.avail_in = (uInt)avail;
			d->z.next_out = buf;
			d->z.avail_out = (uInt)(n > (1u << 30) ? 1u << 30 : n);
			int r = inflate(&d->z, Z_NO_FLUSH);
			got = (size_t)((unsigned char *)d->z.next_out - (unsigned char *)buf);
			d->in_pos += avail - d->z.avail_in;
			if (r == Z_STREAM_END)
				end = true;
			else if (r != Z_OK && r != Z_BUF_ERROR)
				return fail(s, -EBADMSG, "corrupt gzip data: %s", d->z.msg ? d->z.msg : "inflate failed");
			break;
		}
		case INSTREAM_ZSTD: {
			ZSTD_inBuffer ib = {in, avail, 0};
			ZSTD_outBuffer ob = {buf, n, 0};
			size_t r = ZSTD_decompressStream(d->zs, &ob, &ib);
			if (ZSTD_isError(r))
				return fail(s, -EBADMSG, "corrupt zstd data: %s", ZSTD_getErrorName(r));
			got = ob.pos;
			d->in_pos += ib.pos;
			/* 0: a frame is complete; the next call starts the next one */
			d->ended = r == 0;
			break;
		}
		case INSTREAM_XZ: {
			d->lz.next_in = in;
			d->lz.avail_in = avail;
			d->lz.next_out = buf;
			d->lz.avail_out = n;
			lzma_ret r = lzma_code(&d->lz, d->in_eof ? LZMA_FINISH : LZMA_RUN);
			got = n - d->lz.avail_out;
			d->in_pos += avail - d->lz.avail_in;
			if (r == LZMA_STREAM_END) {
				d->ended = true;
				if (got == 0)
					return 0;
			} else if (r == LZMA_BUF_ERROR && d->in_eof && got == 0) {
				return fail(s, -EBADMSG, "truncated xz data");
			} else if (r != LZMA_OK && r != LZMA_BUF_ERROR) {
				return fail(s, r == LZMA_MEM_ERROR ? -ENOMEM : -EBADMSG, "corrupt xz data (error %d)",
					    (int)r);
			}
			break;
		}
		case INSTREAM_BZIP2: {
			d->bz.next_in = (char *)in;
			d->bz.avail_in = (unsigned)avail;
			d->bz.next_out = buf;
			d->bz.avail_out = (unsigned)(n > (1u << 30) ? 1u << 30 : n);
			int r = BZ2_bzDecompress(&d->bz);
			got = (size_t)(d->bz.next_out - (char *)buf);
			d->in_pos += avail - d->bz.avail_in;
			if (r == BZ_STREAM_END)
				end = true;
			else if (r != BZ_OK)
				return fail(s, r == BZ_MEM_ERROR ? -ENOMEM : -EBADMSG, "corrupt bzip2 data (error %d)", r);
			break;
		}
		default:
			return fail(s, -EINVAL, "not compressed");
		}
		if (end)
			d->ended = true;
		d->out += got;
		if (got > 0)
			return (ssize_t)got;
		if (d->in_eof && d->in_pos == d->in_n && !d->ended)
			return fail(s, -EBADMSG, "truncated %s data", kn);
	}
}

/* ---- the layers ---- */

static ssize_t file_read(instream *s, void *buf, size_t n)
{
	for (;;) {
		ssize_t k = read(s->fd, buf, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return fail(s, -errno, "read: %s", strerror(errno));
		s->file_bytes += (uint64_t)k;
		return k;
	}
}

/* the archive or single stream: the file, decompressed when it is */
static ssize_t body_read(instream *s, void *buf, size_t n)
{
	if (s->pb_pos < s->pb_n) {
		size_t k = s->pb_n - s->pb_pos < n ? s->pb_n - s->pb_pos : n;
		memcpy(buf, s->pb + s->pb_pos, k);
		s->pb_pos += k;
		return (ssize_t)k;
	}
	return s->outer ? dec_read(s, s->outer, buf, n) : file_read(s, buf, n);
}

/* Reads n bytes exactly (fewer only at the end). */
static ssize_t body_full(instream *s, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = body_read(s, (char *)buf + got, n - got);
		if (k < 0)
			return k;
		if (k == 0)
			break;
		got += (size_t)k;
	}
	s->tar_off += got;
	return (ssize_t)got;
}

/* the current tar member's bytes */
static ssize_t member_read(instream *s, void *buf, size_t n)
{
	if (s->mh_pos < s->mh_n) {
		size_t k = s->mh_n - s->mh_pos < n ? s->mh_n - s->mh_pos : n;
		memcpy(buf, s->mh + s->mh_pos, k);
		s->mh_pos += k;
		return (ssize_t)k;
	}
	if (s->left == 0)
		return 0;
	ssize_t k = body_read(s, buf, n < s->left ? n : (size_t)s->left);
	if (k == 0)
		return fail(s, -EBADMSG, "truncated tar archive");
	if (k > 0) {
		s->left -= (uint64_t)k;
		s->tar_off += (uint64_t)k;
	}
	return k;
}

/* The rest of the current member and its padding, unread. */
static int skip_member(instream *s)
{
	unsigned char junk[4096];
	uint64_t n = s->left + s->pad;
	s->left = s->pad = 0;
	while (n > 0) {
		ssize_t k = body_full(s, junk, n < sizeof junk ? (size_t)n : sizeof junk);
		if (k < 0)
			return (int)k;
		if (k == 0)
			return fail(s, -EBADMSG, "truncated tar archive");
		n -= (uint64_t)k;
	}
	return 0;
}

static uint64_t tar_number(const unsigned char *f, size_t n)
{
	uint64_t v = 0;
	if (f[0] & 0x80) { /* GNU base-256 */
		for (size_t i = 1; i < n; i++)
			v = (v << 8) | f[i];
		return v;
	}
	for (size_t i = 0; i < n && (f[i] == ' ' || (f[i] >= '0' && f[i] <= '7')); i++)
		if (f[i] != ' ')
			v = v * 8 + (uint64_t)(f[i] - '0');
	return v;
}

/* Reads a GNU long name or pax record set of size bytes into *out (caller
 * frees); its padding too. */
static int tar_blob(instream *s, uint64_t size, char **out)
{
	if (size > TAR_NAME_MAX)
		return fail(s, -EBADMSG, "tar archive: an extended header of %llu bytes",
			    (unsigned long long)size);
	char *b = malloc((size_t)size + 1);
	if (!b)
		return fail(s, -ENOMEM, "out of memory");
	ssize_t k = body_full(s, b, (size_t)size);
	if (k >= 0 && (uint64_t)k < size)
		k = fail(s, -EBADMSG, "truncated tar archive");
	if (k < 0) {
		free(b);
		return (int)k;
	}
	b[size] = 0;
	s->pad = (512 - size % 512) % 512;
	int rc = skip_member(s);
	if (rc < 0) {
		free(b);
		return rc;
	}
	free(*out);
	*out = b;
	return 0;
}

/* The path of a pax record set ("len key=value\n"...), or NULL. */
static char *pax_path(const char *p)
{
	while (*p) {
		char *end;
		unsigned long len = strtoul(p, &end, 10);
		if (len == 0 || *end != ' ' || strlen(p) < len)
			return NULL;
		const char *kv = end + 1, *stop = p + len;
		if (stop - kv > 5 && strncmp(kv, "path=", 5) == 0 && stop[-1] == '\n')
			return strndup(kv + 5, (size_t)(stop - kv - 6));
		p = stop;
	}
	return NULL;
}

/* Moves to the next regular member: 1, 0 at the archive's end, or < 0. */
static int tar_next(instream *s)
{
	char *longname = NULL, *pax = NULL;
	int rc = skip_member(s);
	while (rc == 0) {
		unsigned char h[512];
		uint64_t at = s->tar_off;
		ssize_t k = body_full(s, h, sizeof h);
		if (k < 0) {
			rc = (int)k;
			break;
		}
		if (k == 0)
			break; /* the end without its zero blocks: what GNU tar reads too */
		if (k < 512) {
			rc = fail(s, -EBADMSG, "truncated tar archive");
			break;
		}
		unsigned sum = 0, zero = 1;
		for (int i = 0; i < 512; i++) {
			sum += i >= 148 && i < 156 ? ' ' : h[i];
			zero &= h[i] == 0;
		}
		if (zero)
			break; /* the end */
		if (sum != tar_number(h + 148, 8)) {
			rc = fail(s, -EBADMSG, "tar archive: no valid header at byte %llu", (unsigned long long)at);
			break;
		}
		uint64_t size = tar_number(h + 124, 12);
		char type = (char)h[156];
		if (type == 'L' || type == 'x') {
			char *blob = NULL;
			if ((rc = tar_blob(s, size, &blob)) < 0)
				break;
			if (type == 'L') {
				free(longname);
				longname = blob;
			} else {
				char *pp = pax_path(blob);
				free(blob);
				if (pp) {
					free(pax);
					pax = pp;
				}
			}
			continue;
		}
		s->left = size;
		s->pad = (512 - size % 512) % 512;
		if (type != '0' && type != '\0' && type != '7') { /* links, directories, devices, globals */
			free(longname);
			free(pax);
			longname = pax = NULL;
			rc = skip_member(s);
			continue;
		}
		free(s->name);
		if (pax || longname) {
			s->name = pax ? pax : longname;
			if (pax)
				free(longname);
			pax = longname = NULL;
		} else {
			char name[101], prefix[156];
			memcpy(name, h, 100);
			name[100] = 0;
			memcpy(prefix, h + 345, 155);
			prefix[155] = 0;
			bool ustar = memcmp(h + 257, "ustar\0", 6) == 0; /* POSIX: has a prefix */
			if (ustar && prefix[0])
				rc = asprintf(&s->name, "%s/%s", prefix, name) < 0 ? -ENOMEM : 0;
			else
				s->name = strdup(name);
			if (rc < 0 || !s->name) {
				s->name = NULL;
				rc = fail(s, -ENOMEM, "out of memory");
				break;
			}
		}
		rc = 1;
		break;
	}
	free(longname);
	free(pax);
	return rc;
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
	unsigned char h[INSTREAM_HEAD];
	size_t n = 0;
	while (n < sizeof h) {
		ssize_t k = file_read(s, h + n, sizeof h - n);
		if (k < 0) {
			rc = (int)k;
			goto out;
		}
		if (k == 0)
			break;
		n += (size_t)k;
	}
	instream_kind k = instream_sniff(h, n);
	if (compressed(k)) {
		if (!(s->outer = dec_create(s, k, file_read, h, n))) {
			rc = -ENOMEM;
			goto out;
		}
		/* what it holds: an archive, or one stream */
		while (s->pb_n < sizeof s->pb) {
			ssize_t r = dec_read(s, s->outer, s->pb + s->pb_n, sizeof s->pb - s->pb_n);
			if (r < 0) {
				rc = (int)r;
				goto out;
			}
			if (r == 0)
				break;
			s->pb_n += (size_t)r;
		}
		k = instream_sniff(s->pb, s->pb_n);
		if (compressed(k)) {
			rc = fail(s, -ENOTSUP, "compressed twice (%s inside %s): decompress it once first",
				  instream_kind_name(k), instream_kind_name(s->outer->kind));
			goto out;
		}
		if (k == INSTREAM_PARQUET) {
			rc = fail(s, -ENOTSUP, "%s", PARQUET_HINT);
			goto out;
		}
	} else {
		memcpy(s->pb, h, n);
		s->pb_n = n;
	}
	if (k == INSTREAM_TAR)
		s->tar = true;
	else if (s->outer)
		s->single = true;
	else
		rc = fail(s, -EINVAL, "neither compressed nor a tar archive");
out:
	if (rc < 0) {
		snprintf(msg, msg_len, "%s", s->err[0] ? s->err : strerror(-rc));
		instream_close(s);
		return rc;
	}
	*out = s;
	return 0;
}

int instream_next(instream *s, const char **name, char *msg, size_t msg_len)
{
	*name = NULL;
	dec_destroy(s->inner);
	s->inner = NULL;
	s->head_n = s->head_pos = s->mh_n = s->mh_pos = 0;
	int rc = 0;
	if (s->single) {
		if (s->single_done)
			return 0;
		s->single_done = true;
		/* its head is in pb, served by body_read */
		return 1;
	}
	if ((rc = tar_next(s)) <= 0)
		goto out;
	rc = 0;
	/* a member: compressed itself? (mh is empty while it is read) */
	unsigned char mh[INSTREAM_HEAD];
	size_t mn = 0;
	while (mn < sizeof mh) {
		ssize_t k = member_read(s, mh + mn, sizeof mh - mn);
		if (k < 0) {
			rc = (int)k;
			goto out;
		}
		if (k == 0)
			break;
		mn += (size_t)k;
	}
	memcpy(s->mh, mh, mn);
	s->mh_n = mn;
	s->mh_pos = 0;
	instream_kind k = instream_sniff(s->mh, s->mh_n);
	if (compressed(k)) {
		if (!(s->inner = dec_create(s, k, member_read, s->mh, s->mh_n))) {
			rc = -ENOMEM;
			goto out;
		}
		s->mh_pos = s->mh_n;
		while (s->head_n < sizeof s->head) {
			ssize_t r = dec_read(s, s->inner, s->head + s->head_n, sizeof s->head - s->head_n);
			if (r < 0) {
				char why[sizeof s->err];
				memcpy(why, s->err, sizeof why);
				rc = fail(s, (int)r, "%s: %s", s->name, why);
				goto out;
			}
			if (r == 0)
				break;
			s->head_n += (size_t)r;
		}
		instream_kind c = instream_sniff(s->head, s->head_n);
		if (compressed(c))
			rc = fail(s, -ENOTSUP, "%s: compressed twice (%s inside %s): decompress it once first",
				  s->name, instream_kind_name(c), instream_kind_name(k));
		k = c;
	}
	if (rc == 0 && k == INSTREAM_PARQUET)
		rc = fail(s, -ENOTSUP, "%s: %s", s->name, PARQUET_HINT);
	if (rc == 0 && k == INSTREAM_TAR)
		rc = fail(s, -ENOTSUP, "%s: a tar archive inside an archive, which is not read: extract it first",
			  s->name);
	if (rc < 0)
		goto out;
	const char *p = s->name;
	while (p[0] == '/' || (p[0] == '.' && p[1] == '/'))
		p += p[0] == '/' ? 1 : 2;
	*name = p;
	rc = 1;
out:
	if (rc < 0)
		snprintf(msg, msg_len, "%s", s->err[0] ? s->err : strerror(-rc));
	return rc;
}

ssize_t instream_read(instream *s, void *buf, size_t n, char *msg, size_t msg_len)
{
	if (s->head_pos < s->head_n) {
		size_t k = s->head_n - s->head_pos < n ? s->head_n - s->head_pos : n;
		memcpy(buf, s->head + s->head_pos, k);
		s->head_pos += k;
		return (ssize_t)k;
	}
	ssize_t k = s->inner ? dec_read(s, s->inner, buf, n) : s->tar ? member_read(s, buf, n) : body_read(s, buf, n);
	if (k < 0) {
		if (s->tar && s->name)
			snprintf(msg, msg_len, "%s: %s", s->name, s->err);
		else
			snprintf(msg, msg_len, "%s", s->err[0] ? s->err : strerror((int)-k));
	}
	return k;
}

uint64_t instream_file_bytes(instream *s)
{
	return s->file_bytes;
}

void instream_close(instream *s)
{
	if (!s)
		return;
	dec_destroy(s->inner);
	dec_destroy(s->outer);
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
