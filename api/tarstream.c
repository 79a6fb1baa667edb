/* tarstream — see tarstream.h. Hand-written ustar (POSIX.1-1988 as
 * extended by POSIX.1-2001's "ustar" magic): names fit the 100-byte name
 * field, sizes the 11 octal digits of the size field. */
#include "api/tarstream.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sha256.h"

#define BLOCK 512
#define NAME_MAX_USTAR 99               /* name field, NUL-terminated here */
#define SIZE_MAX_USTAR 077777777777ULL  /* 11 octal digits: 8 GiB - 1 */

typedef struct entry {
	char name[NAME_MAX_USTAR + 1]; /* "<top>/<file>", or "<top>/" */
	int fd;                        /* -1 for the directory entry */
	uint64_t size;                 /* bytes of data */
	int64_t mtime;                 /* seconds */
	unsigned mode;
	uint64_t off;                  /* of its header in the archive */
} entry;

struct tarstream {
	entry *e;
	size_t n;                 /* entries, the directory's included */
	uint64_t size;            /* whole archive */
	char etag[40];
};

static uint64_t padded(uint64_t n)
{
	return (n + BLOCK - 1) / BLOCK * BLOCK;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* Writes v as a NUL-terminated octal number filling len bytes (len-1
 * digits, zero-padded), as ustar numeric fields read. */
static void octal(char *field, size_t len, uint64_t v)
{
	field[len - 1] = 0;
	for (size_t i = len - 1; i-- > 0; v >>= 3)
		field[i] = (char)('0' + (v & 7));
}

static void header(const entry *e, unsigned char out[BLOCK])
{
	char *h = (char *)out;
	memset(out, 0, BLOCK);
	memcpy(h, e->name, strlen(e->name));      /* name[100] */
	octal(h + 100, 8, e->mode);                /* mode */
	octal(h + 108, 8, 0);                      /* uid */
	octal(h + 116, 8, 0);                      /* gid */
	octal(h + 124, 12, e->size);               /* size */
	octal(h + 136, 12, e->mtime > 0 ? (uint64_t)e->mtime : 0); /* mtime */
	h[156] = e->fd < 0 ? '5' : '0';            /* typeflag: directory / file */
	memcpy(h + 257, "ustar", 6);               /* magic, NUL-terminated */
	memcpy(h + 263, "00", 2);                  /* version */
	memcpy(h + 265, "root", 4);                /* uname[32] */
	memcpy(h + 297, "root", 4);                /* gname[32] */
	octal(h + 329, 8, 0);                      /* devmajor */
	octal(h + 337, 8, 0);                      /* devminor */
	/* the checksum is summed with its own field as eight spaces */
	memset(h + 148, ' ', 8);
	unsigned sum = 0;
	for (size_t i = 0; i < BLOCK; i++)
		sum += out[i];
	octal(h + 148, 7, sum); /* six digits, NUL, then the space kept */
}

void tarstream_destroy(tarstream *ts)
{
	if (!ts)
		return;
	for (size_t i = 0; i < ts->n; i++)
		if (ts->e[i].fd >= 0)
			close(ts->e[i].fd);
	free(ts->e);
	free(ts);
}

static int add_entry(tarstream *ts, size_t *cap, const entry *e)
{
	if (ts->n == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		entry *ne = realloc(ts->e, nc * sizeof *ne);
		if (!ne)
			return -ENOMEM;
		ts->e = ne;
		*cap = nc;
	}
	ts->e[ts->n++] = *e;
	return 0;
}

int tarstream_open(tarstream **out, const char *dir, const char *top)
{
	*out = NULL;
	size_t tl = strlen(top);
	if (tl == 0 || tl > 60 || strchr(top, '/') || !strcmp(top, ".") || !strcmp(top, ".."))
		return -EINVAL;
	tarstream *ts = calloc(1, sizeof *ts);
	if (!ts)
		return -ENOMEM;
	size_t cap = 0;
	int rc = 0;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = -errno;
		goto out;
	}
	entry d = {.fd = -1, .size = 0, .mtime = 0, .mode = 0755}; /* mtime: set below */
	snprintf(d.name, sizeof d.name, "%s/", top);
	if ((rc = add_entry(ts, &cap, &d)) < 0)
		goto out;
	int dup_fd = dup(dfd);
	DIR *dh = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	if (!dh) {
		rc = -errno;
		if (dup_fd >= 0)
			close(dup_fd);
		goto out;
	}
	struct dirent *de;
	while ((de = readdir(dh)) != NULL) {
		if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
			continue;
		/* O_NOFOLLOW: a symlink fails with ELOOP and is left out, so
		 * nothing outside dir is ever read; O_NONBLOCK: a FIFO does not
		 * block the open (and is left out below) */
		int fd = openat(dfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0) {
			if (errno == ELOOP || errno == ENOENT || errno == ENXIO)
				continue;
			rc = -errno;
			break;
		}
		struct stat st;
		if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			close(fd);
			continue;
		}
		entry e = {.fd = fd, .size = (uint64_t)st.st_size, .mtime = st.st_mtim.tv_sec, .mode = 0644};
		if (tl + 1 + strlen(de->d_name) > NAME_MAX_USTAR)
			rc = -ENAMETOOLONG;
		else if (e.size > SIZE_MAX_USTAR)
			rc = -EFBIG;
		else
			snprintf(e.name, sizeof e.name, "%s/%s", top, de->d_name);
		if (rc == 0)
			rc = add_entry(ts, &cap, &e);
		if (rc < 0) {
			close(fd);
			break;
		}
	}
	closedir(dh);
	if (rc < 0)
		goto out;
	qsort(ts->e + 1, ts->n - 1, sizeof *ts->e, by_name);
	/* The directory's own mtime moves with any file made and removed in
	 * it; the newest file's keeps the bytes a function of the files (and
	 * the ETag, which hashes only them, honest). */
	for (size_t i = 1; i < ts->n; i++)
		if (ts->e[i].mtime > ts->e[0].mtime)
			ts->e[0].mtime = ts->e[i].mtime;
	sha256_ctx h;
	sha256_init(&h);
	uint64_t off = 0;
	for (size_t i = 0; i < ts->n; i++) {
		entry *e = &ts->e[i];
		e->off = off;
		off += BLOCK + padded(e->size);
		struct stat st = {0};
		if (e->fd >= 0)
			fstat(e->fd, &st);
		char line[256];
		int len = snprintf(line, sizeof line, "%s\n%llu %lld.%09ld %llu\n", e->name,
				   (unsigned long long)e->size, (long long)st.st_mtim.tv_sec,
				   (long)st.st_mtim.tv_nsec, (unsigned long long)st.st_ino);
		sha256_update(&h, line, (size_t)len);
	}
	ts->size = off + 2 * BLOCK;
	uint8_t dig[32];
	char hex[65];
	sha256_final(&h, dig);
	sha256_to_hex(dig, hex);
	snprintf(ts->etag, sizeof ts->etag, "\"%.32s\"", hex);
out:
	if (dfd >= 0)
		close(dfd);
	if (rc < 0)
		tarstream_destroy(ts);
	else
		*out = ts;
	return rc;
}

uint64_t tarstream_size(const tarstream *ts)
{
	return ts->size;
}

size_t tarstream_files(const tarstream *ts)
{
	return ts->n - 1;
}

const char *tarstream_etag(const tarstream *ts)
{
	return ts->etag;
}

/* The entry whose header, data or padding holds pos, or NULL when pos is in
 * the closing zero blocks. Entries are few (a model directory's handful). */
static const entry *entry_at(const tarstream *ts, uint64_t pos)
{
	for (size_t i = 0; i < ts->n; i++)
		if (pos < ts->e[i].off + BLOCK + padded(ts->e[i].size))
			return &ts->e[i];
	return NULL;
}

ssize_t tarstream_read(tarstream *ts, uint64_t pos, char *buf, size_t max)
{
	size_t done = 0;
	while (done < max && pos < ts->size) {
		const entry *e = entry_at(ts, pos);
		uint64_t in, avail;
		size_t want;
		if (!e) { /* the two closing zero blocks */
			want = (size_t)(ts->size - pos < max - done ? ts->size - pos : max - done);
			memset(buf + done, 0, want);
		} else if ((in = pos - e->off) < BLOCK) {
			unsigned char h[BLOCK];
			header(e, h);
			want = BLOCK - (size_t)in < max - done ? BLOCK - (size_t)in : max - done;
			memcpy(buf + done, h + in, want);
		} else if ((in -= BLOCK) < e->size) {
			avail = e->size - in;
			want = avail < max - done ? (size_t)avail : max - done;
			ssize_t got = pread(e->fd, buf + done, want, (off_t)in);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0)
				return -errno;
			if (got == 0)
				return -EIO; /* shrank since the scan */
			want = (size_t)got;
		} else { /* zero padding after the data */
			avail = padded(e->size) - in;
			want = avail < max - done ? (size_t)avail : max - done;
			memset(buf + done, 0, want);
		}
		done += want;
		pos += want;
	}
	return (ssize_t)done;
}
