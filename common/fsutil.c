/* fsutil — see fsutil.h. */
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __has_include
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else
#undef SYS_openat2 /* headers too old to say how: the walk does it */
#endif
#endif

int fs_mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);
	if (n == 0 || n >= sizeof buf)
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; ; p++) {
		if (*p == '/' || *p == 0) {
			char c = *p;
			*p = 0;
			if (mkdir(buf, mode) < 0 && errno != EEXIST)
				return -errno;
			*p = c;
			if (!c)
				break;
		}
	}
	struct stat st;
	if (stat(path, &st) < 0)
		return -errno;
	return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

int fs_fsync_parent(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(dir, sizeof dir, ".");
	else if (slash == path)
		snprintf(dir, sizeof dir, "/");
	else
		snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

int fs_write_atomic(const char *path, const void *data, size_t len, mode_t mode)
{
	char tmp[PATH_MAX];
	int n = snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
	if (n < 0 || (size_t)n >= sizeof tmp)
		return -ENAMETOOLONG;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	int rc = 0;
	const char *p = data;
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		p += w;
		len -= (size_t)w;
	}
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0) {
		unlink(tmp);
		return rc;
	}
	return fs_fsync_parent(path);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

int fs_remove_tree(const char *path)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) < 0)
		return errno ? -errno : -EIO;
	return 0;
}

int fs_lock_pidfile(const char *path, mode_t mode, int *fd, pid_t *holder)
{
	*fd = -1;
	if (holder)
		*holder = 0;
	int lfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
	if (lfd < 0)
		return -errno;
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
	if (fcntl(lfd, F_OFD_SETLK, &fl) < 0) {
		int rc = (errno == EAGAIN || errno == EACCES) ? -EWOULDBLOCK : -errno;
		/* OFD locks have no owning pid (F_OFD_GETLK says -1): the holder
		 * wrote its own into the file. Empty while it is just starting. */
		char buf[32];
		ssize_t n = rc == -EWOULDBLOCK ? pread(lfd, buf, sizeof buf - 1, 0) : -1;
		if (n > 0 && holder) {
			buf[n] = 0;
			long pid = strtol(buf, NULL, 10);
			*holder = pid > 0 ? (pid_t)pid : 0;
		}
		close(lfd);
		return rc;
	}
	char line[32];
	int len = snprintf(line, sizeof line, "%ld\n", (long)getpid());
	if (ftruncate(lfd, 0) < 0 || pwrite(lfd, line, (size_t)len, 0) != len) {
		int rc = -errno;
		close(lfd);
		return rc ? rc : -EIO;
	}
	*fd = lfd;
	return 0;
}

/* ---- confined opens ---- */

#define BENEATH_MAX_LINKS 40 /* as the kernel's own path walk */
#define BENEATH_MAX_DEPTH 256

int fs_open_beneath_walk(int rootfd, const char *relpath, int flags, mode_t mode)
{
	/* todo holds what is left to resolve; a link's target is spliced in
	 * front of the rest, so it is resolved from the directory holding it */
	char *todo = malloc(2 * PATH_MAX);
	char *next = malloc(2 * PATH_MAX);
	int stack[BENEATH_MAX_DEPTH]; /* directories below rootfd, each owned */
	int depth = 0, links = 0, rc = 0;
	if (!todo || !next) {
		rc = -ENOMEM;
		goto out;
	}
	if (relpath[0] == '/') {
		rc = -EXDEV;
		goto out;
	}
	if (strlen(relpath) >= PATH_MAX) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	snprintf(todo, 2 * PATH_MAX, "%s", relpath);
	char *p = todo;
	for (;;) {
		while (*p == '/')
			p++;
		int cur = depth ? stack[depth - 1] : rootfd;
		char *end = strchr(p, '/');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		char *rest = end ? end : p + n;
		while (*rest == '/')
			rest++;
		bool last = *rest == 0;
		char name[NAME_MAX + 1];
		if (n > NAME_MAX) {
			rc = -ENAMETOOLONG;
			goto out;
		}
		memcpy(name, p, n);
		name[n] = 0;
		if (n == 0 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
			if (n == 2) { /* ".." */
				if (depth == 0) {
					rc = -EXDEV;
					goto out;
				}
				close(stack[--depth]);
				cur = depth ? stack[depth - 1] : rootfd;
			}
			if (last) {
				int fd = openat(cur, ".", flags | O_CLOEXEC, mode);
				rc = fd < 0 ? -errno : fd;
				goto out;
			}
			p = rest;
			continue;
		}
		struct stat st;
		if (fstatat(cur, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT && last && (flags & O_CREAT)) {
				int fd = openat(cur, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
				rc = fd < 0 ? -errno : fd;
			} else {
				rc = -errno;
			}
			goto out;
		}
		if (S_ISLNK(st.st_mode)) {
			if (++links > BENEATH_MAX_LINKS) {
				rc = -ELOOP;
				goto out;
			}
			ssize_t k = readlinkat(cur, name, next, PATH_MAX);
			if (k < 0) {
				rc = -errno;
				goto out;
			}
			if (k >= PATH_MAX) {
				rc = -ENAMETOOLONG;
				goto out;
			}
			next[k] = 0;
			if (next[0] == '/') {
				rc = -EXDEV;
				goto out;
			}
			if ((size_t)k + 1 + strlen(rest) >= 2 * PATH_MAX) {
				rc = -ENAMETOOLONG;
				goto out;
			}
			if (!last) {
				strcat(next, "/");
				strcat(next, rest);
			}
			char *t = todo;
			todo = next;
			next = t;
			p = todo;
			continue;
		}
		if (last) {
			int fd = openat(cur, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
			rc = fd < 0 ? -errno : fd;
			goto out;
		}
		if (depth == BENEATH_MAX_DEPTH) {
			rc = -ENAMETOOLONG;
			goto out;
		}
		int fd = openat(cur, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			rc = -errno;
			goto out;
		}
		stack[depth++] = fd;
		p = rest;
	}
out:
	while (depth > 0)
		close(stack[--depth]);
	free(todo);
	free(next);
	return rc;
}

int fs_open_beneath(int rootfd, const char *relpath, int flags, mode_t mode)
{
#ifdef SYS_openat2
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	const char *p = relpath[0] ? relpath : ".";
	for (int tries = 0; tries < 8; tries++) {
		long fd = syscall(SYS_openat2, rootfd, p, &how, sizeof how);
		if (fd >= 0)
			return (int)fd;
		/* EAGAIN: a rename raced the lookup; ENOSYS/EPERM (seccomp): no openat2 */
		if (errno == EAGAIN)
			continue;
		if (errno != ENOSYS && errno != EPERM)
			return -errno;
		break;
	}
#endif
	return fs_open_beneath_walk(rootfd, relpath, flags, mode);
}

int64_t fs_dir_bytes(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int64_t total = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char p[PATH_MAX];
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
			total += st.st_size;
	}
	closedir(d);
	return total;
}

int fs_partial_dir(const char *dir, char *buf, size_t cap)
{
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	const char *slash = memrchr(dir, '/', n);
	int k;
	if (!slash)
		k = snprintf(buf, cap, ".%.*s.partial", (int)n, dir);
	else
		k = snprintf(buf, cap, "%.*s/.%.*s.partial", (int)(slash - dir), dir,
			     (int)(n - (size_t)(slash + 1 - dir)), slash + 1);
	return k < 0 || (size_t)k >= cap ? -ENAMETOOLONG : 0;
}
