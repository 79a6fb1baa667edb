/* paths — confines file paths named in requests to the data roots.
 * Internal to api/. */
#ifndef BERTD_API_PATHS_H
#define BERTD_API_PATHS_H

#include <stddef.h>

/* Resolves path (absolute, or relative to the first root) and checks that
 * the result lies under one of roots[0..n). Refuses before touching the
 * file system: embedded NUL (len != strlen), empty, longer than PATH_MAX,
 * or any ".." component (-EINVAL). Then realpath(): -ENOENT if it does not
 * exist; -EACCES if it (after following every symlink) is outside all
 * roots. On 0, out holds the canonical path. */
int api_path_resolve(const char *path, size_t len, const char *const *roots, size_t n, char *out,
		     size_t cap);

#endif
