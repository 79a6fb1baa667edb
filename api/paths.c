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

static int under(const char *canon, const char *root)
{
	char r[PATH_MAX];
	if (!realpath(root, r))
		return 0;
	size_t n = strlen(r);
	if (n == 1) /* root "/" */
		return 1;
	return strncmp(canon, r, n) == 0 && (canon[n] == '/' || canon[n] == 0);
}

int api_path_resolve(const char *path, size_t len, const char *const *roots, size_t n, char *out,
		     size_t cap)
{
	if (!path || len == 0 || strlen(path) != len || len >= PATH_MAX || has_dotdot(path) || n == 0)
		return -EINVAL;
	char joined[PATH_MAX + 1];
	if (path[0] == '/')
		snprintf(joined, sizeof joined, "%s", path);
	else if (snprintf(joined, sizeof joined, "%s/%s", roots[0], path) >= (int)sizeof joined)
		return -EINVAL;
	char canon[PATH_MAX];
	if (!realpath(joined, canon))
		return errno == ENOENT || errno == ENOTDIR ? -ENOENT : -EACCES;
	for (size_t i = 0; i < n; i++) {
		if (under(canon, roots[i])) {
			if (strlen(canon) >= cap)
				return -EINVAL;
			memcpy(out, canon, strlen(canon) + 1);
			return 0;
		}
	}
	return -EACCES;
}
