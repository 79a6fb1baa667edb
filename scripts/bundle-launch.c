/* bundle-launch — the entry point of every program in a device bundle
 * (scripts/device-bundle). Linked statically, so it runs on any x86-64 Linux
 * whatever libc the machine has or lacks; it never loads a shared library
 * itself and never runs anything but the bundle's own dynamic loader.
 *
 * The bundle is  bin/<name>      this launcher (hard links, one per program)
 *                libexec/<name>  the real ELF executable
 *                lib/            the dynamic loader, libc and every Debian
 *                                library the programs load (no CUDA ones)
 *                etc/libpath     optional: ':'-separated directories with
 *                                the machine's CUDA/NCCL libraries
 *
 * Invoked as .../bin/<name> (the path execve was given, AT_EXECFN, so hard
 * links and symlinks both keep their name), it executes
 *   lib/ld-linux-x86-64.so.2 --library-path lib:<etc/libpath>:$LD_LIBRARY_PATH
 *                            --argv0 <argv[0]> libexec/<name> args...
 * The library path is an argument, not LD_LIBRARY_PATH, so the bundle's libc
 * never leaks into the machine's own programs that ours start (python, sh).
 *
 * bertd finds bertd-worker & co. next to /proc/self/exe, which here is the
 * loader: for bertd the launcher sets BERTD_BIN_DIR=<bundle>/bin unless it is
 * set already (bertd never passes BERTD_* on to its children). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

static void chomp_to_colons(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
        s[--n] = 0;
    for (char *p = s; *p; p++)
        if (*p == '\n')
            *p = ':';
}

int main(int argc, char **argv)
{
    const char *execfn = (const char *)getauxval(AT_EXECFN);
    if (!execfn || !*execfn)
        execfn = argv[0];
    char path[PATH_MAX], dir[PATH_MAX], root[PATH_MAX];
    snprintf(path, sizeof path, "%s", execfn);
    char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (slash)
        *slash = 0;
    if (!realpath(slash ? (path[0] ? path : "/") : ".", dir)) {
        fprintf(stderr, "bundle-launch: %s: %s\n", execfn, strerror(errno));
        return 127;
    }
    snprintf(root, sizeof root, "%s", dir);
    char *up = strrchr(root, '/');
    if (!up || strcmp(up, "/bin") != 0) {
        fprintf(stderr, "bundle-launch: %s is not in a bundle's bin/ directory\n", execfn);
        return 127;
    }
    *up = 0;

    char extra[8192] = "";
    char file[PATH_MAX + 32];
    snprintf(file, sizeof file, "%s/etc/libpath", root);
    FILE *f = fopen(file, "r");
    if (f) {
        size_t n = fread(extra, 1, sizeof extra - 1, f);
        extra[n] = 0;
        fclose(f);
        chomp_to_colons(extra);
    }
    const char *env = getenv("LD_LIBRARY_PATH");
    size_t cap = strlen(root) + strlen(extra) + (env ? strlen(env) : 0) + 16;
    char *libpath = malloc(cap);
    char ld[PATH_MAX + 64], target[PATH_MAX + 64];
    char **nargv = calloc((size_t)argc + 8, sizeof *nargv);
    if (!libpath || !nargv) {
        fprintf(stderr, "bundle-launch: out of memory\n");
        return 127;
    }
    snprintf(libpath, cap, "%s/lib%s%s%s%s", root, extra[0] ? ":" : "", extra,
             env && *env ? ":" : "", env && *env ? env : "");
    snprintf(ld, sizeof ld, "%s/lib/ld-linux-x86-64.so.2", root);
    snprintf(target, sizeof target, "%s/libexec/%s", root, name);
    if (access(target, X_OK) != 0) {
        fprintf(stderr, "bundle-launch: no program %s in the bundle: %s\n", target, strerror(errno));
        return 127;
    }
    if (!strcmp(name, "bertd") && !getenv("BERTD_BIN_DIR"))
        setenv("BERTD_BIN_DIR", dir, 1);

    int k = 0;
    nargv[k++] = ld;
    nargv[k++] = "--library-path";
    nargv[k++] = libpath;
    nargv[k++] = "--argv0";
    nargv[k++] = argv[0];
    nargv[k++] = target;
    for (int i = 1; i < argc; i++)
        nargv[k++] = argv[i];
    nargv[k] = NULL;
    execv(ld, nargv);
    fprintf(stderr, "bundle-launch: cannot run %s: %s\n", ld, strerror(errno));
    return 127;
}
