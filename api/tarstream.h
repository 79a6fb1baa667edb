/* tarstream — one directory's regular files as a POSIX ustar archive,
 * produced piece by piece at any offset, so a 400 MB model is streamed
 * (GET /v1/jobs/{id}/export) and never held in memory.
 *
 * tarstream_open scans the directory once: every regular file directly in
 * it (no subdirectories, no symlinks followed: each is opened O_NOFOLLOW
 * relative to the directory), sorted by name, is opened and fstat'ed then,
 * so the archive's layout and size are fixed up front (Content-Length) and
 * a file renamed or replaced later does not change what is sent. The
 * archive is a directory entry "<top>/" (mtime: its newest file's), then
 * per file a 512-byte header,
 * the data and zero padding to 512, then two zero blocks: the same files
 * give the same bytes. Never writes anything to disk.
 */
#ifndef BERTD_API_TARSTREAM_H
#define BERTD_API_TARSTREAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct tarstream tarstream;

/* Scans dir and makes the archive with its files under top ("job-x-export";
 * no '/', at most 60 bytes). *out caller-owned (tarstream_destroy).
 * Returns 0; -ENOENT / -ENOTDIR when dir is not a directory; -ENAMETOOLONG
 * for a file name that does not fit a ustar name (top/name over 99 bytes);
 * -EFBIG for a file of 8 GiB or more; -EINVAL for a bad top; -ENOMEM or
 * another -errno of open/fstat. */
int tarstream_open(tarstream **out, const char *dir, const char *top);
void tarstream_destroy(tarstream *ts);

/* Bytes of the whole archive. */
uint64_t tarstream_size(const tarstream *ts);
/* How many files it holds (0 for an empty directory). */
size_t tarstream_files(const tarstream *ts);
/* A strong ETag, quoted ("\"<32 hex>\""): a hash of top and each file's
 * name, size, mtime (ns) and inode, so it changes when a file does. */
const char *tarstream_etag(const tarstream *ts);

/* Copies up to max bytes of the archive from offset pos into buf. Returns
 * how many (0 only at or past the end); -EIO when a file turned out
 * shorter than it was when scanned (the archive cannot be completed), or
 * pread's -errno. Safe to call from any thread, one call at a time. */
ssize_t tarstream_read(tarstream *ts, uint64_t pos, char *buf, size_t max);

#endif
