/* nccl_lib — finds and opens NCCL's shared library (libnccl.so.2) at run
 * time, for the daemon (is NCCL there, which version: GET /v1/version and
 * the multi-GPU check at submit) and for bertd-worker (the NCCL backend
 * resolves its symbols from the handle). One search, so the daemon's answer
 * and the worker's library are the same file.
 *
 * Where it looks (the first library that opens wins):
 *   - $BERTD_NCCL_PATH when set: a libnccl.so.2 file or a directory holding
 *     one, and nowhere else (a deliberate choice must not fall back);
 *   - the dynamic loader's own search ("libnccl.so.2": LD_LIBRARY_PATH,
 *     the executable's rpath, ld.so.cache);
 *   - the nccl_dir the build was configured with (BERTD_NCCL_DIR/lib);
 *   - /usr/local/cuda/lib64, /usr/local/cuda/lib, /usr/local/cuda-* /lib*;
 *   - pip's wheels: nvidia/nccl/lib under /usr/local/lib/python3* /
 *     dist-packages, /usr/lib/python3/dist-packages, ~/.local/lib/python3* /
 *     site-packages and /opt/bertd/cuda-11.8/python (scripts/setup --sm70).
 *
 * Needs no CUDA context and no GPU: opening the library and ncclGetVersion
 * touch no device. It never dlcloses what it returned (the caller owns it)
 * and never exits.
 */
#ifndef BERTD_COMMON_NCCL_LIB_H
#define BERTD_COMMON_NCCL_LIB_H

#include <stddef.h>

#define NCCL_LIB_ENV "BERTD_NCCL_PATH"

/* Opens libnccl.so.2 from the places above (RTLD_NOW | RTLD_LOCAL).
 * Returns the dlopen handle (caller owns: dlclose) and writes the file it
 * opened into path (may be NULL); or NULL with why (may be NULL) naming
 * what was tried. */
void *nccl_lib_open(char *path, size_t pathlen, char *why, size_t whylen);

/* The library's version as "2.21.5" from its ncclGetVersion (codes
 * X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before). 0, or -ENOSYS when
 * the handle has no ncclGetVersion, -EIO when it fails. */
int nccl_lib_version(void *handle, char *out, size_t outlen);

/* nccl_lib_open + nccl_lib_version + dlclose: what the daemon asks once at
 * start. 0 with version (and path, may be NULL) set, or a negative errno
 * with why naming what is missing (-ENOSYS also for an NCCL older than
 * 2.14, which bertd cannot use). */
int nccl_lib_probe(char *version, size_t vlen, char *path, size_t pathlen, char *why, size_t whylen);

#endif
