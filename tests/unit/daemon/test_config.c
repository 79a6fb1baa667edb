/* config precedence (default < file < env < flags), validation messages,
 * and the token file's creation, reuse and permission checks. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/config.h"
#include "daemon/token.h"

static char tmpdir[256];

static int setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof tmpdir, "/tmp/bertd-cfg-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* Runs config_load with stderr captured into errbuf. */
static int load(config *c, int argc, char **argv, char **envp, char *errbuf, size_t cap)
{
	FILE *err = fmemopen(errbuf, cap, "w");
	FILE *out = fopen("/dev/null", "w");
	int rc = config_load(c, argc, argv, envp, out, err);
	fclose(err);
	fclose(out);
	return rc;
}

static void test_defaults(void **state)
{
	(void)state;
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", "/dev/null", NULL};
	char *envp[] = {NULL};
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.listen, "127.0.0.1");
	assert_int_equal(c.port, 8420);
	assert_false(c.allow_remote);
	assert_string_equal(c.state_dir, "./var");
	assert_string_equal(c.token_file, "./var/token");
	assert_int_equal(c.n_roots, 1);
	assert_string_equal(c.roots[0], "./var/data");
	assert_int_equal(c.max_body_bytes, 1048576);
}

static void test_precedence(void **state)
{
	(void)state;
	char path[300];
	snprintf(path, sizeof path, "%s/bertd.conf", tmpdir);
	write_file(path, "# comment\n\nport = 9000\nlog_level = debug\nstate_dir = \"/srv/x\"\n"
			 "data_roots = /a:/b::/c\nmax_body_bytes=2048\n");
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", path, "--max-body-bytes=4096", "--allow-remote", NULL};
	char *envp[] = {"BERTD_PORT=9001", "BERTD_LOG_LEVEL=warn", "BERTD_UNRELATED=1", NULL};
	assert_int_equal(load(&c, 5, argv, envp, errbuf, sizeof errbuf), 0);
	assert_int_equal(c.port, 9001);             /* env beats file */
	assert_string_equal(c.log_level, "warn");
	assert_string_equal(c.state_dir, "/srv/x"); /* file beats default, quotes stripped */
	assert_int_equal(c.max_body_bytes, 4096);   /* flag beats file */
	assert_true(c.allow_remote);                /* bare boolean flag */
	assert_int_equal(c.n_roots, 3);
	assert_string_equal(c.roots[2], "/c");

	char *argv2[] = {"bertd", "--config", path, "--port", "9002", NULL};
	assert_int_equal(load(&c, 5, argv2, envp, errbuf, sizeof errbuf), 0);
	assert_int_equal(c.port, 9002);             /* flag beats env */
}

static void test_errors_name_source(void **state)
{
	(void)state;
	char path[300];
	snprintf(path, sizeof path, "%s/bad.conf", tmpdir);
	config c;
	char errbuf[512];

	write_file(path, "port = 80\nno_such_key = 1\n");
	char *argv[] = {"bertd", "--config", path, NULL};
	char *envp[] = {NULL};
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, ":2"));
	assert_non_null(strstr(errbuf, "no_such_key"));

	write_file(path, "port = 70000\n");
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, "port"));

	write_file(path, "allow_remote = maybe\n");
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);

	write_file(path, "just words\n");
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);

	char *argv2[] = {"bertd", "--config", "/dev/null", "--port", "12x", NULL};
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 5, argv2, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, "option --port"));

	char *argv3[] = {"bertd", "--config", "/dev/null", "--bogus", "1", NULL};
	assert_int_equal(load(&c, 5, argv3, envp, errbuf, sizeof errbuf), -EINVAL);
	char *argv4[] = {"bertd", "--config", "/dev/null", "--port", NULL};
	assert_int_equal(load(&c, 4, argv4, envp, errbuf, sizeof errbuf), -EINVAL);
	char *envp2[] = {"BERTD_LOG_LEVEL=loud", NULL};
	assert_int_equal(load(&c, 3, argv2, envp2, errbuf, sizeof errbuf), -EINVAL);

	/* An explicitly named file must exist; the default one may be absent. */
	char missing[300];
	snprintf(missing, sizeof missing, "%s/missing.conf", tmpdir);
	char *argv5[] = {"bertd", "--config", missing, NULL};
	assert_int_equal(load(&c, 3, argv5, envp, errbuf, sizeof errbuf), -EINVAL);
}

static void test_help_lists_every_key(void **state)
{
	(void)state;
	char buf[8192] = "";
	FILE *out = fmemopen(buf, sizeof buf, "w");
	config_print_help(out, "bertd");
	fclose(out);
	const char *keys[] = {"listen", "port", "allow_remote", "state_dir", "data_roots", "token_file",
			      "log_level", "max_body_bytes", "api_threads", "conn_timeout_s", "conn_limit",
			      "per_ip_limit", "conn_memory"};
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		assert_non_null(strstr(buf, keys[i]));
	config c;
	char errbuf[64];
	char *argv[] = {"bertd", "--help", NULL};
	char *envp[] = {NULL};
	assert_int_equal(load(&c, 2, argv, envp, errbuf, sizeof errbuf), 1);
}

static void test_token(void **state)
{
	(void)state;
	char path[300], t1[257], t2[257];
	int created = -1;
	snprintf(path, sizeof path, "%s/token", tmpdir);
	assert_int_equal(token_load_or_create(path, t1, &created), 0);
	assert_int_equal(created, 1);
	assert_int_equal(strlen(t1), TOKEN_HEX_LEN);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(token_load_or_create(path, t2, &created), 0);
	assert_int_equal(created, 0);
	assert_string_equal(t1, t2);

	char other[300];
	snprintf(other, sizeof other, "%s/token2", tmpdir);
	assert_int_equal(token_load_or_create(other, t2, &created), 0);
	assert_string_not_equal(t1, t2); /* fresh randomness per file */

	chmod(path, 0644);
	assert_int_equal(token_load_or_create(path, t2, &created), -EPERM);
	write_file(other, "short\n");
	chmod(other, 0600);
	assert_int_equal(token_load_or_create(other, t2, &created), -EINVAL);
}

/* The shipped example config must parse and must mention every key. */
static void test_example_conf(void **state)
{
	(void)state;
	const char *root = getenv("BERTD_SOURCE_ROOT");
	assert_non_null(root);
	char path[1024];
	snprintf(path, sizeof path, "%s/systemd/bertd.conf", root);
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", path, NULL};
	char *envp[] = {NULL};
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.state_dir, "/var/lib/bertd");

	char help[8192] = "", text[16384] = "";
	FILE *out = fmemopen(help, sizeof help, "w");
	config_print_help(out, "bertd");
	fclose(out);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[n] = 0;
	/* every "--key" in --help has a "key =" line in the example */
	for (char *p = strstr(help, "  --"); p; p = strstr(p + 1, "  --")) {
		char key[64], want[80];
		if (sscanf(p + 4, "%63s", key) != 1)
			continue;
		snprintf(want, sizeof want, "%s =", key);
		assert_non_null(strstr(text, want));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_precedence),
		cmocka_unit_test(test_errors_name_source),
		cmocka_unit_test(test_help_lists_every_key),
		cmocka_unit_test(test_token),
		cmocka_unit_test(test_example_conf),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
