/* tarstream: the archive of a directory, read at odd offsets and in odd
 * pieces, is checked by independent readers: GNU tar (`tar -tvf`, `tar -xf`
 * then cmp against the sources) and, when Debian's /usr/bin/python3 is
 * there, Python's tarfile module. Also: symlinks, subdirectories and FIFOs
 * are left out; the size is exact; the bytes and ETag are deterministic and
 * the ETag changes with a file; a file that shrank mid-stream is an error. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "api/tarstream.h"

typedef struct fx {
	char root[64];
	char src[96];
} fx;

static void write_file(const char *dir, const char *name, size_t n, unsigned seed)
{
	char path[256];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	for (size_t i = 0; i < n; i++)
		fputc((int)((i * 31 + seed * 7 + i / 251) & 0xff), f);
	assert_int_equal(fclose(f), 0);
}

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int setup(void **state)
{
	fx *f = calloc(1, sizeof *f);
	snprintf(f->root, sizeof f->root, "/tmp/bertd-tar-XXXXXX");
	if (!mkdtemp(f->root))
		return -1;
	snprintf(f->src, sizeof f->src, "%s/src", f->root);
	mkdir(f->src, 0700);
	/* sizes at and around the 512-byte block edges, one empty file */
	write_file(f->src, "config.json", 700, 1);
	write_file(f->src, "model.safetensors", 300001, 2);
	write_file(f->src, "vocab.txt", 512, 3);
	write_file(f->src, "empty", 0, 4);
	write_file(f->src, "one", 1, 5);
	write_file(f->src, "block_minus_one", 511, 6);
	/* never in the archive: a link out of the directory, a subdirectory,
	 * a FIFO */
	char p[256];
	snprintf(p, sizeof p, "%s/escape", f->src);
	if (symlink("/etc/passwd", p) < 0)
		return -1;
	snprintf(p, sizeof p, "%s/sub", f->src);
	mkdir(p, 0700);
	write_file(p, "inner", 10, 7);
	snprintf(p, sizeof p, "%s/fifo", f->src);
	if (mkfifo(p, 0600) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fx *f = *state;
	run("rm -rf '%s'", f->root);
	free(f);
	return 0;
}

/* Reads the whole archive in pieces of piece bytes (cycling through a few
 * sizes when piece is 0) into a malloc'd buffer; *len its size. */
static char *read_all(tarstream *ts, size_t piece, size_t *len)
{
	static const size_t cycle[] = {1, 7, 511, 512, 513, 4096, 65536, 100003};
	uint64_t size = tarstream_size(ts);
	char *buf = malloc(size + 1);
	assert_non_null(buf);
	uint64_t pos = 0;
	for (size_t i = 0; pos < size; i++) {
		size_t want = piece ? piece : cycle[i % (sizeof cycle / sizeof cycle[0])];
		if (want > size - pos + 1)
			want = size - pos + 1; /* ask past the end once: must stop there */
		ssize_t n = tarstream_read(ts, pos, buf + pos, want);
		assert_true(n > 0);
		pos += (uint64_t)n;
	}
	assert_int_equal(pos, size);
	assert_int_equal(tarstream_read(ts, pos, buf, 16), 0);
	*len = size;
	return buf;
}

static void save(const char *path, const char *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(buf, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

static void test_tar_reads_it(void **state)
{
	fx *f = *state;
	tarstream *ts;
	assert_int_equal(tarstream_open(&ts, f->src, "job-x-export"), 0);
	assert_int_equal(tarstream_files(ts), 6);
	/* six headers + data padded to 512 + the directory entry + two zero blocks */
	uint64_t want = 512 + 6 * 512 + 1024 + 300032 + 512 + 0 + 512 + 512 + 1024;
	assert_int_equal(tarstream_size(ts), want);
	size_t len;
	char *a = read_all(ts, 0, &len);
	char *b = read_all(ts, 65536, &len);
	assert_memory_equal(a, b, len); /* the same bytes whatever the pieces */
	char tar[160], out[160], list[160];
	snprintf(tar, sizeof tar, "%s/a.tar", f->root);
	snprintf(out, sizeof out, "%s/out", f->root);
	snprintf(list, sizeof list, "%s/list", f->root);
	save(tar, a, len);
	free(a);
	free(b);
	/* GNU tar: lists exactly the directory and the six files, no warnings */
	assert_int_equal(run("tar -tvf '%s' > '%s' 2>&1", tar, list), 0);
	assert_int_equal(run("test \"$(wc -l < '%s')\" -eq 7", list), 0);
	assert_int_equal(run("grep -q '^drwxr-xr-x root/root .* job-x-export/$' '%s'", list), 0);
	assert_int_equal(run("grep -q '^-rw-r--r-- root/root *300001 .* job-x-export/model.safetensors$' '%s'",
			     list), 0);
	assert_int_not_equal(run("grep -qE 'escape|fifo|sub|warning' '%s'", list), 0);
	mkdir(out, 0700);
	assert_int_equal(run("tar -xf '%s' -C '%s'", tar, out), 0);
	static const char *const names[] = {"config.json", "model.safetensors", "vocab.txt", "empty",
					    "one", "block_minus_one"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		assert_int_equal(run("cmp -s '%s/%s' '%s/job-x-export/%s'", f->src, names[i], out, names[i]), 0);
	assert_int_equal(run("test \"$(ls -A '%s/job-x-export' | wc -l)\" -eq 6", out), 0);
	/* Python's tarfile, when Debian's python3 is there: every member a
	 * regular file or the directory, the file's bytes as in the source */
	if (access("/usr/bin/python3", X_OK) == 0)
		assert_int_equal(run("/usr/bin/python3 -c '"
				     "import tarfile,sys\n"
				     "t=tarfile.open(sys.argv[1])\n"
				     "m=t.getmembers()\n"
				     "assert [x.name for x in m]==[\"job-x-export\"]+sorted(\"job-x-export/\"+n for n in "
				     "[\"config.json\",\"model.safetensors\",\"vocab.txt\",\"empty\",\"one\",\"block_minus_one\"]),m\n"
				     "assert m[0].isdir() and all(x.isreg() for x in m[1:])\n"
				     "d=t.extractfile(\"job-x-export/model.safetensors\").read()\n"
				     "assert d==open(sys.argv[2]+\"/model.safetensors\",\"rb\").read()\n"
				     "' '%s' '%s'", tar, f->src), 0);
	tarstream_destroy(ts);
}

static void test_deterministic_and_etag(void **state)
{
	fx *f = *state;
	tarstream *a, *b;
	assert_int_equal(tarstream_open(&a, f->src, "t"), 0);
	assert_int_equal(tarstream_open(&b, f->src, "t"), 0);
	size_t la, lb;
	char *x = read_all(a, 4096, &la), *y = read_all(b, 4096, &lb);
	assert_int_equal(la, lb);
	assert_memory_equal(x, y, la);
	assert_string_equal(tarstream_etag(a), tarstream_etag(b));
	free(y);
	tarstream_destroy(b);
	/* the directory's mtime (moved by any file made and removed in it)
	 * changes neither the bytes nor the ETag */
	const struct timespec old[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
	assert_int_equal(utimensat(AT_FDCWD, f->src, old, 0), 0);
	assert_int_equal(tarstream_open(&b, f->src, "t"), 0);
	y = read_all(b, 4096, &lb);
	assert_int_equal(la, lb);
	assert_memory_equal(x, y, la);
	assert_string_equal(tarstream_etag(a), tarstream_etag(b));
	const char *e = tarstream_etag(a);
	assert_int_equal(strlen(e), 34);
	assert_true(e[0] == '"' && e[33] == '"');
	free(x);
	free(y);
	tarstream_destroy(b);
	/* a file replaced (new inode, other size) changes the ETag */
	char p[256], q[256];
	snprintf(p, sizeof p, "%s/one.new", f->root);
	snprintf(q, sizeof q, "%s/one", f->src);
	write_file(f->root, "one.new", 2, 9);
	assert_int_equal(rename(p, q), 0);
	assert_int_equal(tarstream_open(&b, f->src, "t"), 0);
	assert_string_not_equal(tarstream_etag(a), tarstream_etag(b));
	assert_int_equal(tarstream_size(a), tarstream_size(b)); /* 1 and 2 bytes pad alike */
	tarstream_destroy(a);
	tarstream_destroy(b);
	write_file(f->src, "one", 1, 5);
}

static void test_shrunk_file_is_an_error(void **state)
{
	fx *f = *state;
	char dir[160];
	snprintf(dir, sizeof dir, "%s/shrink", f->root);
	mkdir(dir, 0700);
	write_file(dir, "big", 5000, 1);
	tarstream *ts;
	assert_int_equal(tarstream_open(&ts, dir, "s"), 0);
	char path[200];
	snprintf(path, sizeof path, "%s/big", dir);
	assert_int_equal(truncate(path, 100), 0);
	char buf[8192];
	ssize_t n = tarstream_read(ts, 0, buf, sizeof buf);
	assert_int_equal(n, -EIO);
	tarstream_destroy(ts);
}

static void test_refusals(void **state)
{
	fx *f = *state;
	tarstream *ts = (tarstream *)1;
	char missing[160], longdir[160], name[120];
	snprintf(missing, sizeof missing, "%s/nope", f->root);
	assert_int_equal(tarstream_open(&ts, missing, "t"), -ENOENT);
	assert_null(ts);
	assert_int_equal(tarstream_open(&ts, f->src, "a/b"), -EINVAL);
	assert_int_equal(tarstream_open(&ts, f->src, ""), -EINVAL);
	assert_int_equal(tarstream_open(&ts, f->src, ".."), -EINVAL);
	snprintf(longdir, sizeof longdir, "%s/long", f->root);
	mkdir(longdir, 0700);
	memset(name, 'n', 97);
	name[97] = 0; /* "t/" + 97 = 99 bytes: fits */
	write_file(longdir, name, 3, 1);
	assert_int_equal(tarstream_open(&ts, longdir, "t"), 0);
	tarstream_destroy(ts);
	assert_int_equal(tarstream_open(&ts, longdir, "tt"), -ENAMETOOLONG); /* 100 bytes */
	/* an empty directory is an archive of just the directory entry */
	char empty[160];
	snprintf(empty, sizeof empty, "%s/emptydir", f->root);
	mkdir(empty, 0700);
	assert_int_equal(tarstream_open(&ts, empty, "e"), 0);
	assert_int_equal(tarstream_files(ts), 0);
	assert_int_equal(tarstream_size(ts), 512 + 1024);
	tarstream_destroy(ts);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tar_reads_it),
		cmocka_unit_test(test_deterministic_and_etag),
		cmocka_unit_test(test_shrunk_file_is_an_error),
		cmocka_unit_test(test_refusals),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
