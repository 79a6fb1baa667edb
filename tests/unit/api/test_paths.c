/* Request paths stay under the data roots: "..", NUL bytes, symlink
 * escapes, missing files and relative paths. */
#include <errno.h>
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

#include "api/paths.h"

static char top[64], root[128], outside[128];

static void touch(const char *p)
{
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	snprintf(top, sizeof top, "/tmp/bertd-paths-XXXXXX");
	if (!mkdtemp(top))
		return -1;
	snprintf(root, sizeof root, "%s/root", top);
	snprintf(outside, sizeof outside, "%s/outside", top);
	char p[256];
	mkdir(root, 0700);
	mkdir(outside, 0700);
	snprintf(p, sizeof p, "%s/corpus.txt", root);
	touch(p);
	snprintf(p, sizeof p, "%s/secret.txt", outside);
	touch(p);
	char link[256];
	snprintf(link, sizeof link, "%s/escape", root);
	if (symlink(p, link) < 0)
		return -1;
	snprintf(link, sizeof link, "%s/inside-link", root);
	snprintf(p, sizeof p, "%s/corpus.txt", root);
	return symlink(p, link);
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
	return system(cmd) == 0 ? 0 : -1;
}

static int resolve(const char *path, char *out)
{
	const char *roots[] = {root};
	return api_path_resolve(path, strlen(path), roots, 1, out, PATH_MAX);
}

static void test_paths(void **state)
{
	(void)state;
	char out[PATH_MAX], p[256], want[PATH_MAX];
	snprintf(p, sizeof p, "%s/corpus.txt", root);
	assert_non_null(realpath(p, want));
	assert_int_equal(resolve(p, out), 0);
	assert_string_equal(out, want);
	assert_int_equal(resolve("corpus.txt", out), 0); /* relative to the first root */
	assert_string_equal(out, want);
	assert_int_equal(resolve("inside-link", out), 0);
	assert_string_equal(out, want);

	snprintf(p, sizeof p, "%s/secret.txt", outside);
	assert_int_equal(resolve(p, out), -EACCES);
	assert_int_equal(resolve("escape", out), -EACCES); /* symlink out of the root */
	assert_int_equal(resolve("/etc/passwd", out), -EACCES);
	snprintf(p, sizeof p, "%s/../outside/secret.txt", root);
	assert_int_equal(resolve(p, out), -EINVAL);
	assert_int_equal(resolve("..", out), -EINVAL);
	assert_int_equal(resolve("a/../corpus.txt", out), -EINVAL);
	assert_int_equal(resolve("", out), -EINVAL);
	assert_int_equal(resolve("missing.txt", out), -ENOENT);
	assert_int_equal(resolve("..hidden-but-fine-name", out), -ENOENT); /* not a ".." component */

	const char nul[] = "corpus.txt\0/etc/passwd";
	const char *roots[] = {root};
	assert_int_equal(api_path_resolve(nul, sizeof nul - 1, roots, 1, out, sizeof out), -EINVAL);

	/* a root prefix that is not a directory boundary does not count */
	char sib[256];
	snprintf(sib, sizeof sib, "%s2", root);
	mkdir(sib, 0700);
	snprintf(p, sizeof p, "%s/x", sib);
	touch(p);
	assert_int_equal(resolve(p, out), -EACCES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_paths)};
	return cmocka_run_group_tests(tests, setup, teardown);
}
