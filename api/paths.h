/* paths — confines file paths named in requests to the data roots.
 * Internal to api/. */
#ifndef BERTD_API_PATHS_H
#define BERTD_API_PATHS_H

#include <stdbool.h>
#include <stddef.h>

/* Resolves path (absolute, or relative to the first root) and checks that
 * the result lies under one of roots[0..n). Refuses before touching the
 * file system: embedded NUL (len != strlen), empty, longer than PATH_MAX,
 * or any ".." component (-EINVAL). Then realpath(): -ENOENT if it does not
 * exist; -EACCES if it (after following every symlink) is outside all
 * roots. On 0, out holds the canonical path. */
int api_path_resolve(const char *path, size_t len, const char *const *roots, size_t n, char *out,
		     size_t cap);
/* The first half of api_path_resolve: the same refusals (-EINVAL), then the
 * canonical path of path (absolute, or relative to base) in out, or -ENOENT,
 * or -EACCES when realpath() fails otherwise. Checks no root: the caller
 * decides, with api_path_under, where the result may lie. */
int api_path_canonical(const char *path, size_t len, const char *base, char *out, size_t cap);
/* Whether the canonical path canon is root (itself resolved) or below it. */
bool api_path_under(const char *canon, const char *root);

/* Writes to buf (cap bytes, always terminated) why api_path_resolve() of the
 * same path and roots returned rc (< 0), for a problem's detail: the path as
 * resolved (joined to roots[0] when relative; where symlinks lead when it
 * exists) and the configured roots, ':'-joined as the data_roots key reads:
 *   no such file or directory: /var/lib/bertd/data/pubmed (a relative path
 *   starts at the first data root); data_roots: /var/lib/bertd/data:/srv/text
 * Looks at the file system again, so it says what it finds now. */
void api_path_problem(int rc, const char *path, size_t len, const char *const *roots, size_t n, char *buf,
		      size_t cap);

#endif
