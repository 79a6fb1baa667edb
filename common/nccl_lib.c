/* nccl_lib — see nccl_lib.h. */
#include "common/nccl_lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SONAME "libnccl.so.2"

/* Directories after the loader's own search, in order; glob patterns. */
static const char *const fallback_dirs[] = {
#ifdef BERTD_NCCL_DIR
	BERTD_NCCL_DIR "/lib",
#endif
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/lib",
	"/usr/local/cuda-*/lib64",
	"/usr/local/cuda-*/lib",
	"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib",
	"/usr/lib/python3/dist-packages/nvidia/nccl/lib",
	"~/.local/lib/python3*/site-packages/nvidia/nccl/lib",
	"/opt/bertd/cuda-11.8/python/nvidia/nccl/lib",
};

static void put(char *dst, size_t n, const char *src)
{
	if (dst && n)
		snprintf(dst, n, "%s", src);
}

static void *try_file(const char *file, char *path, size_t pathlen, char *last, size_t lastlen)
{
	void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
	if (h) {
		put(path, pathlen, file);
		return h;
	}
	const char *e = dlerror();
	put(last, lastlen, e ? e : file);
	return NULL;
}

/* $BERTD_NCCL_PATH: the file, or <dir>/libnccl.so.2; nothing else. */
static void *open_forced(const char *p, char *path, size_t pathlen, char *why, size_t whylen)
{
	char file[4096], last[512] = "";
	struct stat st;
	if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
		snprintf(file, sizeof file, "%s/" SONAME, p);
	else
		snprintf(file, sizeof file, "%s", p);
	void *h = try_file(file, path, pathlen, last, sizeof last);
	if (!h && why && whylen)
		snprintf(why, whylen, "%s=%s: cannot load %s (%s)", NCCL_LIB_ENV, p, file, last);
	return h;
}

void *nccl_lib_open(char *path, size_t pathlen, char *why, size_t whylen)
{
	char last[512] = "";
	const char *forced = getenv(NCCL_LIB_ENV);
	if (forced && *forced)
		return open_forced(forced, path, pathlen, why, whylen);
	void *h = try_file(SONAME, path, pathlen, last, sizeof last);
	if (h) {
		/* the loader found it by name: say which file */
		Dl_info info;
		void *sym = dlsym(h, "ncclGetVersion");
		if (path && sym && dladdr(sym, &info) && info.dli_fname)
			put(path, pathlen, info.dli_fname);
		return h;
	}
	for (size_t i = 0; i < sizeof fallback_dirs / sizeof fallback_dirs[0]; i++) {
		glob_t g;
		if (glob(fallback_dirs[i], GLOB_TILDE | GLOB_NOSORT, NULL, &g) != 0)
			continue;
		for (size_t j = 0; j < g.gl_pathc && !h; j++) {
			char file[4096];
			snprintf(file, sizeof file, "%s/" SONAME, g.gl_pathv[j]);
			if (access(file, F_OK) == 0)
				h = try_file(file, path, pathlen, last, sizeof last);
		}
		globfree(&g);
		if (h)
			return h;
	}
	if (why && whylen)
		snprintf(why, whylen,
			 SONAME " not found (the loader's path, /usr/local/cuda*/lib*, pip's nvidia/nccl/lib%s%s)",
			 last[0] ? "; last error: " : "", last);
	return NULL;
}

int nccl_lib_version(void *handle, char *out, size_t outlen)
{
	int (*get)(int *) = NULL;
	*(void **)&get = dlsym(handle, "ncclGetVersion");
	if (!get)
		return -ENOSYS;
	int v = 0;
	if (get(&v) != 0 || v <= 0)
		return -EIO;
	if (v >= 10000) /* NCCL_VERSION since 2.9 */
		snprintf(out, outlen, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
	else
		snprintf(out, outlen, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
	return 0;
}

int nccl_lib_probe(char *version, size_t vlen, char *path, size_t pathlen, char *why, size_t whylen)
{
	char file[4096] = "";
	void *h = nccl_lib_open(file, sizeof file, why, whylen);
	if (!h)
		return -ENOENT;
	int rc = nccl_lib_version(h, version, vlen);
	if (rc < 0 && why && whylen)
		snprintf(why, whylen, "%s: %s", file,
			 rc == -ENOSYS ? "has no ncclGetVersion (not NCCL?)" : "ncclGetVersion failed");
	int major = 0, minor = 0;
	if (rc == 0 && sscanf(version, "%d.%d", &major, &minor) == 2 && major * 100 + minor < 214) {
		/* the worker refuses it too (comm_nccl_load): non-blocking communicators */
		if (why && whylen)
			snprintf(why, whylen, "%s is NCCL %s; bertd needs 2.14 or newer", file, version);
		rc = -ENOSYS;
	}
	if (rc == 0)
		put(path, pathlen, file);
	dlclose(h);
	return rc;
}
