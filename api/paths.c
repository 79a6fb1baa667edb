/* paths — see paths.h. realpath() follows every symlink, so a link inside a
 * root that points outside it resolves outside and is refused. */
#include "api/paths.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int has_dotdot(const char *p)
{
	for (const char *s = p; (s = strstr(s, "..")) != NULL; s += 2) {
		int start = s == p || s[-1] == '/';
		int end = s[2] == 0 || s[2] == '/';
		if (start && end)
			return 1;
	}
	return 0;
}

bool api_path_under(const char *canon, const char *root)
{
	char r[PATH_MAX];
	if (!realpath(root, r))
		return false;
	size_t n = strlen(r);
	if (n == 1) /* root "/" */
		return true;
	return strncmp(canon, r, n) == 0 && (canon[n] == '/' || canon[n] == 0);
}

int api_path_canonical(const char *path, size_t len, const char *base, char *out, size_t cap)
{
	if (!path || len == 0 || strlen(path) != len || len >= PATH_MAX || has_dotdot(path))
		return -EINVAL;
	char joined[PATH_MAX + 1];
	if (path[0] == '/')
		snprintf(joined, sizeof joined, "%s", path);
	else if (!base || snprintf(joined, sizeof joined, "%s/%s", base, path) >= (int)sizeof joined)
		return -EINVAL;
	char canon[PATH_MAX];
	if (!realpath(joined, canon))
		return errno == ENOENT || errno == ENOTDIR ? -ENOENT : -EACCES;
	if (strlen(canon) >= cap)
		return -EINVAL;
	memcpy(out, canon, strlen(canon) + 1);
	return 0;
}

int api_path_resolve(const char *path, size_t len, const char *const *roots, size_t n, char *out,
		     size_t cap)
{
	if (n == 0)
		return -EINVAL;
	char canon[PATH_MAX];
	int rc = api_path_canonical(path, len, roots[0], canon, sizeof canon);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (api_path_under(canon, roots[i])) {
			if (strlen(canon) >= cap)
				return -EINVAL;
			memcpy(out, canon, strlen(canon) + 1);
			return 0;
		}
	}
	return -EACCES;
}

/* roots as configured, ':'-joined like the data_roots key */
static void roots_text(const char *const *roots, size_t n, char *buf, size_t cap)
{
	size_t used = 0;
	buf[0] = 0;
	for (size_t i = 0; i < n && used < cap; i++) {
		int w = snprintf(buf + used, cap - used, "%s%s", i ? ":" : "", roots[i]);
		if (w < 0)
			break;
		used += (size_t)w;
	}
}

void api_path_problem(int rc, const char *path, size_t len, const char *const *roots, size_t n, char *buf,
		      size_t cap)
{
	char list[1024];
	roots_text(roots, n, list, sizeof list);
	if (n == 0) {
		snprintf(buf, cap, "no data_roots are configured");
		return;
	}
	if (rc == -EINVAL || !path || len == 0 || strlen(path) != len || len >= PATH_MAX) {
		snprintf(buf, cap,
			 "must be a path without \"..\" components or NUL bytes, at most %d bytes once joined "
			 "to the first data root (data_roots: %s)",
			 PATH_MAX - 1, list);
		return;
	}
	/* what api_path_resolve() looked at, again, to say what it found */
	char joined[PATH_MAX + 1];
	if (path[0] == '/')
		snprintf(joined, sizeof joined, "%s", path);
	else
		snprintf(joined, sizeof joined, "%s/%s", roots[0], path);
	const char *rel = path[0] == '/' ? "" : " (a relative path starts at the first data root)";
	char canon[PATH_MAX];
	if (!realpath(joined, canon)) {
		int e = errno;
		if (e == ENOENT || e == ENOTDIR)
			snprintf(buf, cap, "no such file or directory: %s%s; data_roots: %s", joined, rel, list);
		else
			snprintf(buf, cap, "cannot resolve %s: %s; data_roots: %s", joined, strerror(e), list);
	} else if (strcmp(canon, joined) != 0) {
		snprintf(buf, cap, "%s resolves to %s, outside the configured data_roots: %s", joined, canon, list);
	} else {
		snprintf(buf, cap, "%s is outside the configured data_roots: %s", joined, list);
	}
}
