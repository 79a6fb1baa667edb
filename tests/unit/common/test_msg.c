/* msg framing over a real socketpair: whole and byte-by-byte delivery, large
 * frames, protocol errors, end of stream and timeouts. Also fsutil. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/fsutil.h"
#include "common/msg.h"

static void test_roundtrip(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	json_t *a = json_pack("{s:s, s:i}", "type", "metrics", "step", 7);
	assert_int_equal(msg_send(sv[0], a), 0);
	assert_int_equal(msg_send(sv[0], a), 0);
	json_decref(a);

	msg_reader r;
	msg_reader_init(&r);
	json_t *got = NULL;
	assert_int_equal(msg_recv(sv[1], &r, 1000, &got), 1);
	assert_int_equal(json_integer_value(json_object_get(got, "step")), 7);
	json_decref(got);
	assert_int_equal(msg_recv(sv[1], &r, 1000, &got), 1);
	json_decref(got);
	assert_int_equal(msg_recv(sv[1], &r, 50, &got), -ETIMEDOUT);
	close(sv[0]);
	assert_int_equal(msg_recv(sv[1], &r, 1000, &got), 0); /* end of stream */
	msg_reader_free(&r);
	close(sv[1]);
}

/* A child writes a large frame one byte at a time; the reader reassembles. */
static void test_byte_by_byte_and_large(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	size_t big = 300000;
	char *s = malloc(big + 1);
	for (size_t i = 0; i < big; i++)
		s[i] = (char)('a' + i % 26);
	s[big] = 0;
	json_t *obj = json_pack("{s:s, s:s}", "type", "log", "text", s);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[1]);
		char *text = json_dumps(obj, JSON_COMPACT);
		size_t n = strlen(text);
		unsigned char hdr[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
					(unsigned char)(n >> 24)};
		for (int i = 0; i < 4; i++)
			if (write(sv[0], &hdr[i], 1) != 1)
				_exit(1);
		for (size_t i = 0; i < n; i += (i < 100 ? 1 : 4096)) {
			size_t k = i < 100 ? 1 : (n - i < 4096 ? n - i : 4096);
			if (write(sv[0], text + i, k) != (ssize_t)k)
				_exit(1);
		}
		_exit(0);
	}
	close(sv[0]);
	msg_reader r;
	msg_reader_init(&r);
	json_t *got = NULL;
	assert_int_equal(msg_recv(sv[1], &r, 5000, &got), 1);
	assert_string_equal(json_string_value(json_object_get(got, "text")), s);
	json_decref(got);
	int st;
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	msg_reader_free(&r);
	close(sv[1]);
	json_decref(obj);
	free(s);
}

static void send_raw(int fd, uint32_t n, const char *body)
{
	unsigned char hdr[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
				(unsigned char)(n >> 24)};
	assert_int_equal(write(fd, hdr, 4), 4);
	if (body)
		assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
}

static void test_protocol_errors(void **state)
{
	(void)state;
	int sv[2];
	msg_reader r;
	json_t *got = NULL;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	send_raw(sv[0], MSG_MAX_BYTES + 1, NULL);
	msg_reader_init(&r);
	assert_int_equal(msg_recv(sv[1], &r, 1000, &got), -EPROTO);
	msg_reader_free(&r);
	close(sv[0]);
	close(sv[1]);

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	send_raw(sv[0], 7, "[1,2,3]"); /* JSON, but not an object */
	msg_reader_init(&r);
	assert_int_equal(msg_recv(sv[1], &r, 1000, &got), -EPROTO);
	msg_reader_free(&r);
	close(sv[0]);
	close(sv[1]);

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	send_raw(sv[0], 5, "{\"a\":"); /* truncated JSON */
	msg_reader_init(&r);
	assert_int_equal(msg_recv(sv[1], &r, 1000, &got), -EPROTO);
	msg_reader_free(&r);
	close(sv[0]);
	close(sv[1]);

	/* peer gone: send reports it instead of killing us with SIGPIPE */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	close(sv[1]);
	signal(SIGPIPE, SIG_IGN);
	json_t *o = json_object();
	assert_int_equal(msg_send(sv[0], o), -EPIPE);
	json_decref(o);
	close(sv[0]);
}

static void test_fsutil(void **state)
{
	(void)state;
	char dir[] = "/tmp/bertd-fs-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[256], file[300];
	snprintf(path, sizeof path, "%s/a/b/c", dir);
	assert_int_equal(fs_mkdir_p(path, 0700), 0);
	assert_int_equal(fs_mkdir_p(path, 0700), 0); /* idempotent */
	snprintf(file, sizeof file, "%s/f", path);
	assert_int_equal(fs_write_atomic(file, "one", 3, 0600), 0);
	assert_int_equal(fs_write_atomic(file, "second", 6, 0600), 0);
	char buf[16] = "";
	FILE *f = fopen(file, "r");
	assert_non_null(f);
	assert_int_equal(fread(buf, 1, sizeof buf, f), 6);
	fclose(f);
	assert_memory_equal(buf, "second", 6);
	struct stat st;
	assert_int_equal(stat(file, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(fs_mkdir_p(file, 0700), -ENOTDIR); /* a file is in the way */
	char bad[300];
	snprintf(bad, sizeof bad, "%s/nope/x", dir);
	assert_true(fs_write_atomic(bad, "x", 1, 0600) < 0);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_byte_by_byte_and_large),
		cmocka_unit_test(test_protocol_errors),
		cmocka_unit_test(test_fsutil),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
