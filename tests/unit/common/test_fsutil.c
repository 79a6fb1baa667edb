/* test_fsutil — fs_open_beneath (and its walk without openat2) keeps every
 * open under the root directory: links that stay inside are followed, links
 * (relative or absolute) and ".." that lead out are refused with -EXDEV,
 * loops end with -ELOOP. */
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

static char base[PATH_MAX];

static void put(const char *rel, const char *text)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof p, "%s/%s", base, rel);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void link_at(const char *target, const char *rel)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof p, "%s/%s", base, rel);
	assert_int_equal(symlink(target, p), 0);
}

/* <base>/outside.txt beside <base>/root/... */
static int setup(void **state)
{
	(void)state;
	snprintf(base, sizeof base, "/tmp/bertd-fsutil-XXXXXX");
	assert_non_null(mkdtemp(base));
	char p[PATH_MAX + 64];
	snprintf(p, sizeof p, "%s/root/sub", base);
	assert_int_equal(fs_mkdir_p(p, 0755), 0);
	put("outside.txt", "zqxsecretword\n");
	put("root/a.txt", "alpha\n");
	put("root/sub/b.txt", "beta\n");
	link_at("sub/b.txt", "root/in_link");
	link_at("sub", "root/dir_link");
	link_at("..", "root/sub/up");
	link_at("../outside.txt", "root/out_link");
	link_at("../../outside.txt", "root/sub/out_link2");
	snprintf(p, sizeof p, "%s/outside.txt", base);
	link_at(p, "root/abs_link");
	link_at("loop", "root/loop");
	link_at("..", "root/parent");
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fs_remove_tree(base);
	return 0;
}

typedef int (*open_fn)(int, const char *, int, mode_t);

/* Opens rel under <base>/root with fn: the fd's first line, or the errno. */
static int try_open(open_fn fn, const char *rel, char *got, size_t cap)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof p, "%s/root", base);
	int rfd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
	assert_true(rfd >= 0);
	int fd = fn(rfd, rel, O_RDONLY, 0);
	close(rfd);
	got[0] = 0;
	if (fd < 0)
		return fd;
	ssize_t n = read(fd, got, cap - 1);
	close(fd);
	got[n > 0 ? n : 0] = 0;
	return 0;
}

static void check_rules(open_fn fn)
{
	char got[64];
	static const struct {
		const char *rel;
		int rc;
		const char *text;
	} cases[] = {
		{"a.txt", 0, "alpha\n"},
		{"sub/b.txt", 0, "beta\n"},
		{"in_link", 0, "beta\n"},              /* a link that stays inside */
		{"dir_link/b.txt", 0, "beta\n"},       /* through a directory link */
		{"sub/up/a.txt", 0, "alpha\n"},        /* up, but not above the root */
		{"sub/../a.txt", 0, "alpha\n"},
		{"out_link", -EXDEV, ""},              /* relative link climbing out */
		{"sub/out_link2", -EXDEV, ""},
		{"abs_link", -EXDEV, ""},              /* absolute target */
		{"parent/outside.txt", -EXDEV, ""},
		{"../outside.txt", -EXDEV, ""},
		{"sub/../../outside.txt", -EXDEV, ""},
		{"/etc/passwd", -EXDEV, ""},
		{"loop", -ELOOP, ""},
		{"missing", -ENOENT, ""},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int rc = try_open(fn, cases[i].rel, got, sizeof got);
		if (rc != cases[i].rc || strcmp(got, cases[i].text) != 0)
			fail_msg("%s: rc %d (%s) want %d, read '%s'", cases[i].rel, rc, strerror(-rc),
				 cases[i].rc, got);
		assert_null(strstr(got, "zqxsecretword"));
	}
	/* "" and "." are the root itself */
	char p[PATH_MAX + 64];
	snprintf(p, sizeof p, "%s/root", base);
	int rfd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
	struct stat a, b;
	assert_int_equal(fstat(rfd, &a), 0);
	for (int k = 0; k < 2; k++) {
		int fd = fn(rfd, k ? "." : "", O_RDONLY | O_DIRECTORY, 0);
		assert_true(fd >= 0);
		assert_int_equal(fstat(fd, &b), 0);
		assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
		close(fd);
	}
	/* O_CREAT makes a file beneath, never through a link that leads out */
	int fd = fn(rfd, "sub/new.txt", O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	close(fd);
	snprintf(p, sizeof p, "%s/root/sub/new.txt", base);
	assert_int_equal(unlink(p), 0);
	assert_int_equal(fn(rfd, "parent/made.txt", O_WRONLY | O_CREAT, 0600), -EXDEV);
	snprintf(p, sizeof p, "%s/made.txt", base);
	assert_int_equal(access(p, F_OK), -1);
	close(rfd);
}

static void test_open_beneath(void **state)
{
	(void)state;
	check_rules(fs_open_beneath);
}

/* the fallback for kernels without openat2 keeps the same rules */
static void test_open_beneath_walk(void **state)
{
	(void)state;
	check_rules(fs_open_beneath_walk);
}

/* the work directory a dataset is built in: a dot name beside it */
static void test_partial_dir(void **state)
{
	(void)state;
	char b[64];
	assert_int_equal(fs_partial_dir("ds", b, sizeof b), 0);
	assert_string_equal(b, ".ds.partial");
	assert_int_equal(fs_partial_dir("/data/datasets/pubmed//", b, sizeof b), 0);
	assert_string_equal(b, "/data/datasets/.pubmed.partial");
	assert_int_equal(fs_partial_dir("/ds", b, sizeof b), 0);
	assert_string_equal(b, "/.ds.partial");
	assert_int_equal(fs_partial_dir("a/b.c", b, sizeof b), 0);
	assert_string_equal(b, "a/.b.c.partial");
	assert_int_equal(fs_partial_dir("/data/datasets/a-name-long-enough-to-overflow-the-buffer", b, sizeof b),
			 -ENAMETOOLONG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_partial_dir),
		cmocka_unit_test_setup_teardown(test_open_beneath, setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_beneath_walk, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
