/* Slow clients: connections that trickle a request's header never
 * finish it, and libmicrohttpd's idle timeout, reset by every byte, never
 * closes them. bertd closes a connection whose request has not arrived
 * within request_timeout_s, does not apply per_ip_limit to loopback (every
 * local client is 127.0.0.1), and at conn_limit makes room by closing the
 * oldest connection still sending its request, so healthz and
 * authenticated clients are served while 80 slow connections are open. */
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define N_SLOW 80

/* No deadline to speak of (an hour): the limits alone must keep clients
 * served; conn_limit 32 is below the 80 slow connections. */
static int setup_limits(void **state)
{
	const char *extra[] = {"--request-timeout-s", "3600", "--conn-timeout-s", "3600",
			       "--conn-limit", "32", "--schedule", "false", NULL};
	it_daemon_opts o = {.plain = true, .extra = extra};
	return it_setup(state, &o, 0);
}

/* A 2 s request deadline; the idle timeout (an hour) cannot be what closes them. */
static int setup_deadline(void **state)
{
	const char *extra[] = {"--request-timeout-s", "2", "--conn-timeout-s", "3600",
			       "--schedule", "false", NULL};
	it_daemon_opts o = {.plain = true, .extra = extra};
	return it_setup(state, &o, 0);
}


/* A connection that sent the start of a request line and no more. */
static int open_slow(const bertd *d)
{
	int fd = it_connect(d, 0);
	const char *part = "GET /v1/hea";
	assert_int_equal(send(fd, part, strlen(part), MSG_NOSIGNAL), (ssize_t)strlen(part));
	return fd;
}

/* true once the daemon has closed fd (end of stream or reset). */
static bool closed_by_peer(int fd)
{
	char b[256];
	ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static void expect_served(const bertd *d)
{
	http_resp r;
	int rc = http_do(d, "GET", "/v1/healthz", NULL, 0, NULL, H_NO_AUTH, &r);
	if (rc != 0 || r.status != 200)
		fail_msg("healthz with %d slow connections open: curl %d, status %ld", N_SLOW, rc, r.status);
	http_resp_free(&r);
	rc = http_get(d, "/v1/jobs", &r);
	if (rc != 0 || r.status != 200)
		fail_msg("GET /v1/jobs with %d slow connections open: curl %d, status %ld", N_SLOW, rc, r.status);
	http_resp_free(&r);
}

static void test_served_beside_slow_clients(void **state)
{
	bertd *d = *state;
	int fd[N_SLOW];
	for (int i = 0; i < N_SLOW; i++)
		fd[i] = open_slow(d);
	/* more than per_ip_limit (64) from 127.0.0.1, more than conn_limit (32) */
	for (int round = 0; round < 5; round++)
		expect_served(d);
	for (int i = 0; i < N_SLOW; i++)
		close(fd[i]);
}

static void test_trickling_clients_closed(void **state)
{
	bertd *d = *state;
	int fd[N_SLOW];
	bool gone[N_SLOW] = {false};
	for (int i = 0; i < N_SLOW; i++)
		fd[i] = open_slow(d);
	expect_served(d);
	/* one byte each every 200 ms (no header line ever ends) until the
	 * daemon closes them; bounded at 60 s */
	int left = N_SLOW;
	for (int tick = 0; tick < 300 && left > 0; tick++) {
		for (int i = 0; i < N_SLOW; i++) {
			if (gone[i])
				continue;
			if (closed_by_peer(fd[i]) || send(fd[i], "x", 1, MSG_NOSIGNAL) < 0) {
				gone[i] = true;
				left--;
			}
		}
		it_pause_ms(200);
	}
	for (int i = 0; i < N_SLOW; i++)
		close(fd[i]);
	if (left > 0) {
		bertd_print_log(d);
		fail_msg("%d of %d trickling connections still open after 60 s (request_timeout_s 2)",
			 left, N_SLOW);
	}
	expect_served(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_served_beside_slow_clients, setup_limits, it_teardown),
		cmocka_unit_test_setup_teardown(test_trickling_clients_closed, setup_deadline, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
