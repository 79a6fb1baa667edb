/* testdata — see testdata.h. Test support only: plain libc, no cmocka, so
 * unit tests, the integration harness and benchmarks can all link it. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testdata.h"

const char *testdata_path(char *buf, size_t n, const char *name)
{
	const char *d = getenv("BERTD_TEST_DATA");
	snprintf(buf, n, "%s/%s", d && *d ? d : "tests/data", name);
	return buf;
}

const char *testdata_shared(char *buf, size_t n, const char *name, const char *what)
{
	const char *d = getenv("BERTD_SHARED_DATA");
	if (!d || !*d) {
		fprintf(stderr, "skipped: %s (needs %s of ../shared/data; this build has none: "
				"meson option shared_data)\n", what, name);
		return NULL;
	}
	snprintf(buf, n, "%s/%s", d, name);
	if (access(buf, R_OK) != 0) {
		fprintf(stderr, "skipped: %s (no %s: %s)\n", what, buf, strerror(errno));
		return NULL;
	}
	return buf;
}

/* Room for need more bytes (and a terminating NUL) at *n. */
static void reserve(char **out, size_t *cap, size_t n, size_t need)
{
	if (n + need + 1 > *cap) {
		*cap = 2 * (n + need + 1);
		*out = realloc(*out, *cap);
	}
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

char *testdata_licenses(size_t *len)
{
	*len = 0;
	DIR *dir = opendir(TESTDATA_LICENSES_DIR);
	if (!dir) {
		fprintf(stderr, "testdata: %s: %s (Debian's base-files has it)\n", TESTDATA_LICENSES_DIR,
			strerror(errno));
		return NULL;
	}
	char **names = NULL;
	size_t nn = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(dir))) {
		char p[512];
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", TESTDATA_LICENSES_DIR, e->d_name);
		if (e->d_name[0] == '.' || lstat(p, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (nn == cap) {
			cap = cap ? 2 * cap : 32;
			names = realloc(names, cap * sizeof *names);
		}
		names[nn++] = strdup(e->d_name);
	}
	closedir(dir);
	if (nn)
		qsort(names, nn, sizeof *names, by_name);
	char *out = NULL;
	size_t n = 0, ocap = 0;
	for (size_t i = 0; i < nn; i++) {
		char p[512];
		snprintf(p, sizeof p, "%s/%s", TESTDATA_LICENSES_DIR, names[i]);
		free(names[i]);
		FILE *f = fopen(p, "rb");
		if (!f)
			continue;
		char chunk[1 << 16];
		size_t r;
		reserve(&out, &ocap, n, 2);
		if (n) { /* a blank line between files: a document boundary */
			if (out[n - 1] != '\n')
				out[n++] = '\n';
			out[n++] = '\n';
		}
		while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) {
			reserve(&out, &ocap, n, r);
			memcpy(out + n, chunk, r);
			n += r;
		}
		fclose(f);
	}
	free(names);
	reserve(&out, &ocap, n, 1);
	if (n && out[n - 1] != '\n')
		out[n++] = '\n';
	if (!n) {
		fprintf(stderr, "testdata: no text in %s\n", TESTDATA_LICENSES_DIR);
		free(out);
		return NULL;
	}
	out[n] = '\0';
	*len = n;
	return out;
}
