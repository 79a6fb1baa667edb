/* token — see token.h. */
#include "daemon/token.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"

int token_read(const char *path, char out[257])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	int rc = 0;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (st.st_mode & 077)) {
		log_error("token file %s must be a regular file with mode 0600 (is %o)", path,
			  (unsigned)(st.st_mode & 07777));
		rc = -EPERM;
		goto out;
	}
	char buf[300];
	ssize_t n = read(fd, buf, sizeof buf - 1);
	if (n < 0) {
		rc = -errno;
		goto out;
	}
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
		n--;
	buf[n] = 0;
	if (n < 32 || n > 256) {
		log_error("token file %s must hold 32 to 256 characters", path);
		rc = -EINVAL;
		goto out;
	}
	for (ssize_t i = 0; i < n; i++) {
		if (buf[i] <= ' ' || buf[i] > '~') {
			log_error("token file %s holds a non-printable character", path);
			rc = -EINVAL;
			goto out;
		}
	}
	memcpy(out, buf, (size_t)n + 1);
out:
	close(fd);
	return rc;
}

int token_generate(char out[TOKEN_HEX_LEN + 1])
{
	unsigned char rnd[TOKEN_HEX_LEN / 2];
	for (size_t got = 0; got < sizeof rnd;) {
		ssize_t n = getrandom(rnd + got, sizeof rnd - got, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		got += (size_t)n;
	}
	for (size_t i = 0; i < sizeof rnd; i++)
		sprintf(out + 2 * i, "%02x", rnd[i]);
	return 0;
}

int token_load_or_create(const char *path, char out[257], int *created)
{
	*created = 0;
	int rc = token_read(path, out);
	if (rc != -ENOENT)
		return rc;
	if ((rc = token_generate(out)) < 0)
		return rc;
	char line[TOKEN_HEX_LEN + 2];
	snprintf(line, sizeof line, "%s\n", out);

	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		if (errno == EEXIST) /* another start raced us: use theirs */
			return token_read(path, out);
		return -errno;
	}
	rc = 0;
	if (write(fd, line, strlen(line)) != (ssize_t)strlen(line) || fsync(fd) < 0)
		rc = errno ? -errno : -EIO;
	close(fd);
	if (rc < 0) {
		unlink(path);
		return rc;
	}
	*created = 1;
	return fs_fsync_parent(path);
}
