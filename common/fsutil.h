/* fsutil — small, careful filesystem helpers shared by every process:
 * recursive mkdir, crash-safe whole-file replacement, and opening files
 * confined beneath a directory (links followed only while they stay in). */
#ifndef BERTD_COMMON_FSUTIL_H
#define BERTD_COMMON_FSUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* mkdir -p with mode for every directory it creates. 0 or negative errno. */
int fs_mkdir_p(const char *path, mode_t mode);

/* Replaces path with data atomically and durably: writes <path>.tmp.<pid>
 * with mode, fsyncs it, renames it over path, fsyncs the directory. After a
 * crash path holds either the old or the new content, never a mix.
 * 0 or negative errno (the temp file is removed on failure). */
int fs_write_atomic(const char *path, const void *data, size_t len, mode_t mode);

/* fsyncs the directory that contains path. */
int fs_fsync_parent(const char *path);

/* rm -rf path: removes a file or a directory tree without following
 * symlinks (a link is removed, not its target). 0 when gone (or absent),
 * or negative errno. */
int fs_remove_tree(const char *path);

/* The work directory a directory dir is built in before it is renamed to
 * dir: "<parent>/.<name>.partial" (a dot name: never a dataset's), into
 * buf. Trailing slashes of dir are ignored. 0, or -ENAMETOOLONG. */
int fs_partial_dir(const char *dir, char *buf, size_t cap);

/* Bytes of the plain files directly in dir (not below it; dot files left
 * out); 0 when it cannot be read. */
int64_t fs_dir_bytes(const char *dir);

/* Takes an exclusive OFD lock (fcntl F_OFD_SETLK) on path, creating it with
 * mode, and writes our pid into it so a refused process can name the holder.
 * On success *fd is the open file (caller owns it; the lock lasts until it
 * and every dup of it are closed, i.e. for the process's life if kept open;
 * O_CLOEXEC, so exec'd children do not hold it). The file is never removed:
 * unlinking a lock file lets two processes lock two different inodes.
 * -EWOULDBLOCK when another open file description holds it (*holder gets its
 * pid from the file, or 0 when unknown), or another negative errno. */
int fs_lock_pidfile(const char *path, mode_t mode, int *fd, pid_t *holder);

/* Opens relpath (relative; "" or "." is the directory itself) beneath the
 * directory rootfd with open(2) flags and mode, never leaving it: a ".."
 * that would climb above rootfd, an absolute path, or a symbolic link
 * whose target is absolute or climbs out is refused; a relative link that
 * stays beneath is followed. This is openat2(2) with RESOLVE_BENEATH (Linux
 * 5.6+), or, where the kernel lacks it, fs_open_beneath_walk. O_CLOEXEC is
 * always added. Returns the fd (caller owns) or a negative errno: -EXDEV
 * for a path or link leading outside, -ELOOP for more than 40 links (a
 * loop), or open's own (-ENOENT, -ENOTDIR, ...). The data roots use it so
 * that a link planted inside a root cannot expose a file outside it. */
int fs_open_beneath(int rootfd, const char *relpath, int flags, mode_t mode);

/* The same rules without openat2: one component at a time, each directory
 * opened O_PATH | O_NOFOLLOW from the one before, links read with
 * readlinkat and spliced in, ".." popped from the walk's own stack (never
 * the file system's), the last component opened O_NOFOLLOW (a link swapped
 * in meanwhile fails -ELOOP rather than being followed). Public for tests. */
int fs_open_beneath_walk(int rootfd, const char *relpath, int flags, mode_t mode);

#endif
