/* test_keepalive — common/keepalive.c: the bound a relay connection gets.
 *  - a TCP socket gets SO_KEEPALIVE, probes every timeout/3 s (at least 1)
 *    after as long idle, 3 of them, and TCP_USER_TIMEOUT = the timeout,
 *    read back with getsockopt;
 *  - timeout <= 0 sets nothing;
 *  - a socket that is not TCP is an error, not a crash.
 */
#include "common/keepalive.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

static int opt(int fd, int level, int name)
{
	int v = -1;
	socklen_t len = sizeof v;
	assert_int_equal(getsockopt(fd, level, name, &v, &len), 0);
	return v;
}

static void sets_the_bound(void **state)
{
	(void)state;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	assert_int_equal(keepalive_set(fd, 30000), 0);
	assert_int_equal(opt(fd, SOL_SOCKET, SO_KEEPALIVE), 1);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_KEEPIDLE), 10);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_KEEPINTVL), 10);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_KEEPCNT), 3);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), 30000);
	assert_int_equal(keepalive_set(fd, 1500), 0); /* probes at least every second */
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_KEEPIDLE), 1);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), 1500);
	close(fd);
}

static void zero_sets_nothing(void **state)
{
	(void)state;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	assert_int_equal(keepalive_set(fd, 0), 0);
	assert_int_equal(opt(fd, SOL_SOCKET, SO_KEEPALIVE), 0);
	assert_int_equal(opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), 0);
	close(fd);
}

static void not_tcp_is_an_error(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_true(keepalive_set(sv[0], 5000) < 0);
	close(sv[0]);
	close(sv[1]);
	assert_int_equal(keepalive_set(-1, 5000), -EBADF);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(sets_the_bound),
		cmocka_unit_test(zero_sets_nothing),
		cmocka_unit_test(not_tcp_is_an_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
