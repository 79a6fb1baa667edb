/* log: the line prefix with and without the journal (JOURNAL_STREAM naming
 * stderr, as systemd.exec(5) documents), through log_msg into a real file. */
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/log.h"

/* Points stderr at a fresh temp file; returns the saved stderr. */
static int capture_stderr(char *path, size_t n)
{
	snprintf(path, n, "/tmp/bertd-test-log-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	int saved = dup(STDERR_FILENO);
	assert_true(saved >= 0);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	close(fd);
	return saved;
}

static void restore_stderr(int saved, const char *path, char *out, size_t n)
{
	dup2(saved, STDERR_FILENO);
	close(saved);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t len = fread(out, 1, n - 1, f);
	out[len] = 0;
	fclose(f);
	unlink(path);
}

static void set_journal_stream_to_fd(int fd)
{
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	char v[64];
	snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
	assert_int_equal(setenv("JOURNAL_STREAM", v, 1), 0);
}

static void assert_matches(const char *s, const char *re)
{
	regex_t r;
	assert_int_equal(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0);
	int m = regexec(&r, s, 0, NULL, 0);
	regfree(&r);
	if (m != 0)
		fail_msg("'%s' does not match /%s/", s, re);
}

#define STAMPED "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "

static void test_prefix_format(void **state)
{
	(void)state;
	char buf[128];
	struct timespec t = {.tv_sec = 1709618828, .tv_nsec = 9 * 1000000 + 999}; /* 2024-03-05 06:07:08.009 UTC */
	int n = log_format_prefix(buf, sizeof buf, LOG_LVL_INFO, "bertd", false, &t);
	assert_string_equal(buf, "2024-03-05T06:07:08.009Z INFO  bertd: ");
	assert_int_equal(n, (int)strlen(buf));
	log_format_prefix(buf, sizeof buf, LOG_LVL_ERROR, "bertd", false, &t);
	assert_string_equal(buf, "2024-03-05T06:07:08.009Z ERROR bertd: ");
	/* The journal stamps lines itself and wants the level as <PRIO>. */
	log_format_prefix(buf, sizeof buf, LOG_LVL_INFO, "bertd", true, &t);
	assert_string_equal(buf, "<6>bertd: ");
	log_format_prefix(buf, sizeof buf, LOG_LVL_WARN, "bertd", true, &t);
	assert_string_equal(buf, "<4>bertd: ");
}

static void test_fd_is_journal(void **state)
{
	(void)state;
	FILE *a = tmpfile(), *b = tmpfile();
	assert_non_null(a);
	assert_non_null(b);
	struct stat st;
	assert_int_equal(fstat(fileno(a), &st), 0);
	char v[64];
	snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
	assert_true(log_fd_is_journal(v, fileno(a)));
	assert_false(log_fd_is_journal(v, fileno(b))); /* stderr redirected away */
	assert_false(log_fd_is_journal(NULL, fileno(a)));
	assert_false(log_fd_is_journal("", fileno(a)));
	assert_false(log_fd_is_journal("garbage", fileno(a)));
	char trailing[80];
	snprintf(trailing, sizeof trailing, "%sx", v);
	assert_false(log_fd_is_journal(trailing, fileno(a)));
	fclose(a);
	fclose(b);
}

/* Through log_msg: no JOURNAL_STREAM, a stale one (stderr is a file, not the
 * stream it names), and one naming stderr. */
static void test_log_msg_lines(void **state)
{
	(void)state;
	char path[64], out[1024];

	unsetenv("JOURNAL_STREAM");
	int saved = capture_stderr(path, sizeof path);
	log_init("tlog", LOG_LVL_INFO);
	log_info("plain %d", 1);
	restore_stderr(saved, path, out, sizeof out);
	assert_matches(out, STAMPED "INFO  tlog: plain 1\n$");

	assert_int_equal(setenv("JOURNAL_STREAM", "8:12345", 1), 0);
	saved = capture_stderr(path, sizeof path);
	log_init("tlog", LOG_LVL_INFO);
	log_warn("stale %d", 2);
	restore_stderr(saved, path, out, sizeof out);
	assert_matches(out, STAMPED "WARN  tlog: stale 2\n$");

	saved = capture_stderr(path, sizeof path);
	set_journal_stream_to_fd(STDERR_FILENO);
	log_init("tlog", LOG_LVL_INFO);
	log_info("journal %d", 3);
	restore_stderr(saved, path, out, sizeof out);
	assert_string_equal(out, "<6>tlog: journal 3\n");
	unsetenv("JOURNAL_STREAM");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prefix_format),
		cmocka_unit_test(test_fd_is_journal),
		cmocka_unit_test(test_log_msg_lines),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
