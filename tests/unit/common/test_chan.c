/* chan: a child's line that outlives the daemon. Messages sent with no
 * daemon are kept; a daemon that connects gets "attach" and then every
 * one of them again, in order, with their seqs; an ack forgets them; a
 * daemon gone is not an error for an adoptable child; the exit record
 * holds the code and what is still unacknowledged; a heartbeat is never
 * kept; a queue at its bound blocks the sender until a daemon acknowledges
 * (a thread plays the daemon); a multi-node rank's line redials its
 * relay when it breaks, keeps what it says meanwhile, sends its hello,
 * attach and the kept messages to the relay that comes back, gives up
 * past its bound, and names its attempt in its exit record. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/chan.h"
#include "common/msg.h"

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/chan-test-XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static int connect_to(const char *base)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s.sock", base);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	return fd;
}

static json_t *msg(const char *type, int step)
{
	return json_pack("{s:s, s:i}", "type", type, "step", step);
}

static void test_kept_replayed_acked(void **state)
{
	(void)state;
	char base[128];
	snprintf(base, sizeof base, "%s/rank-0", dir);
	chan c;
	assert_int_equal(chan_open(&c, -1, base, true, "worker", 0), 0);
	for (int s = 1; s <= 3; s++)
		assert_int_equal(chan_send(&c, msg("metrics", s * 5), false), 0);
	assert_int_equal(chan_send(&c, msg("progress", 15), true), 0); /* no daemon: not kept */
	json_t *in;
	assert_int_equal(chan_next(&c, &in), 0); /* nobody there: nothing, no error */

	int d = connect_to(base);
	assert_int_equal(chan_next(&c, &in), 0); /* takes the connection, sends attach + the kept ones */
	msg_reader r;
	msg_reader_init(&r);
	json_t *m;
	assert_int_equal(msg_recv(d, &r, 2000, &m), 1);
	assert_string_equal(json_string_value(json_object_get(m, "type")), "attach");
	assert_int_equal(json_integer_value(json_object_get(m, "proto")), CHAN_PROTO);
	assert_int_equal(json_integer_value(json_object_get(m, "pid")), getpid());
	assert_int_equal(json_integer_value(json_object_get(m, "acked")), 0);
	json_decref(m);
	for (int s = 1; s <= 3; s++) {
		assert_int_equal(msg_recv(d, &r, 2000, &m), 1);
		assert_int_equal(json_integer_value(json_object_get(m, "seq")), s);
		assert_int_equal(json_integer_value(json_object_get(m, "step")), s * 5);
		json_decref(m);
	}
	/* the daemon stored two of them */
	json_t *ack = json_pack("{s:s, s:i}", "type", "ack", "seq", 2);
	assert_int_equal(msg_send(d, ack), 0);
	json_decref(ack);
	json_t *stop = json_pack("{s:s}", "type", "stop");
	assert_int_equal(msg_send(d, stop), 0);
	json_decref(stop);
	int got = 0;
	for (int i = 0; i < 200 && got == 0; i++) {
		got = chan_next(&c, &in);
		if (!got)
			chan_wait(&c, 10);
	}
	assert_int_equal(got, 1); /* the stop; the ack was taken inside */
	assert_string_equal(json_string_value(json_object_get(in, "type")), "stop");
	json_decref(in);
	assert_int_equal(c.acked, 2);

	/* the daemon goes: the line is gone, the child is not told to stop */
	close(d);
	for (int i = 0; i < 100 && c.fd >= 0; i++) {
		assert_true(chan_next(&c, &in) >= 0);
		chan_wait(&c, 10);
	}
	assert_int_equal(c.fd, -1);
	assert_int_equal(chan_send(&c, msg("checkpoint", 20), false), 0);
	chan_close(&c, 0);

	char path[160];
	snprintf(path, sizeof path, "%s.exit", base);
	json_t *rec = json_load_file(path, 0, NULL);
	assert_non_null(rec);
	assert_int_equal(json_integer_value(json_object_get(rec, "code")), 0);
	assert_int_equal(json_integer_value(json_object_get(rec, "acked")), 2);
	json_t *frames = json_object_get(rec, "frames");
	assert_int_equal(json_array_size(frames), 2); /* seq 3 and the checkpoint, seq 4 */
	assert_int_equal(json_integer_value(json_object_get(json_array_get(frames, 0), "seq")), 3);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(frames, 1), "seq")), 4);
	json_decref(rec);
	struct stat st;
	snprintf(path, sizeof path, "%s.sock", base);
	assert_int_equal(stat(path, &st), -1); /* the listener is gone */
	msg_reader_free(&r);
}

typedef struct {
	const char *base;
	int seen; /* messages it read before acknowledging them all */
} daemon_arg;

/* Plays a daemon that connects once the sender is blocked: reads attach
 * and everything kept, then acknowledges the last seq it read. */
static void *late_daemon(void *p)
{
	daemon_arg *a = p;
	int d = connect_to(a->base);
	msg_reader r;
	msg_reader_init(&r);
	json_t *m;
	json_int_t last = 0;
	while (msg_recv(d, &r, 500, &m) == 1) {
		last = json_integer_value(json_object_get(m, "seq"));
		a->seen++;
		json_decref(m);
	}
	json_t *ack = json_pack("{s:s, s:I}", "type", "ack", "seq", last);
	msg_send(d, ack);
	json_decref(ack);
	msg_reader_free(&r);
	close(d);
	return NULL;
}

static void test_full_queue_blocks_until_acked(void **state)
{
	(void)state;
	char base[128];
	snprintf(base, sizeof base, "%s/rank-1", dir);
	chan c;
	assert_int_equal(chan_open(&c, -1, base, true, "worker", 1), 0);
	char *big = malloc(64 * 1024);
	memset(big, 'x', 64 * 1024 - 1);
	big[64 * 1024 - 1] = 0;
	int n = 0;
	while (c.qbytes + 64 * 1024 + 64 < CHAN_QUEUE_MAX)
		assert_int_equal(chan_send(&c, json_pack("{s:s, s:i, s:s}", "type", "metrics", "step", ++n, "pad", big),
					   false), 0);
	daemon_arg a = {.base = base};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, late_daemon, &a), 0);
	/* over the bound: returns only once the daemon took and acknowledged */
	assert_int_equal(chan_send(&c, json_pack("{s:s, s:i, s:s}", "type", "metrics", "step", ++n, "pad", big), false),
			 0);
	assert_int_equal(a.seen, n); /* attach + n - 1 kept ones: nothing dropped */
	pthread_join(t, NULL);
	chan_close(&c, 0);
	free(big);
}

static int listen_at(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	unlink(path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(fd, 4), 0);
	return fd;
}

/* The rank's dialer: connects to the "relay" at ctx and says hello. */
static int dial_relay(void *ctx)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", (const char *)ctx);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	json_t *m = json_pack("{s:s, s:i}", "type", "relay", "rank", 2);
	int rc = msg_send(fd, m);
	json_decref(m);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

static const char *type_of(json_t *m)
{
	return json_string_value(json_object_get(m, "type"));
}

static void test_redial_keeps_and_replays(void **state)
{
	(void)state;
	char base[128], relay[128];
	snprintf(base, sizeof base, "%s/rank-2", dir);
	snprintf(relay, sizeof relay, "%s/relay.sock", dir);
	int l = listen_at(relay);
	chan c;
	assert_int_equal(chan_open(&c, -1, base, false, "worker", 2), 0);
	c.fd = dial_relay(relay);
	assert_true(c.fd >= 0);
	fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) | O_NONBLOCK); /* as the rank's first line is */
	c.had_daemon = true;
	chan_set_redial(&c, dial_relay, relay, 60000, "att-1");
	int d = accept(l, NULL, NULL);
	msg_reader r;
	msg_reader_init(&r);
	json_t *m, *in;
	assert_int_equal(msg_recv(d, &r, 2000, &m), 1);
	assert_string_equal(type_of(m), "relay");
	json_decref(m);
	for (int s = 1; s <= 2; s++)
		assert_int_equal(chan_send(&c, msg("metrics", s * 5), false), 0);
	for (int s = 1; s <= 2; s++) { /* numbered, as on a line with a listener */
		assert_int_equal(msg_recv(d, &r, 2000, &m), 1);
		assert_int_equal(json_integer_value(json_object_get(m, "seq")), s);
		json_decref(m);
	}
	json_t *ack = json_pack("{s:s, s:i}", "type", "ack", "seq", 1);
	assert_int_equal(msg_send(d, ack), 0);
	json_decref(ack);
	for (int i = 0; i < 200 && c.acked < 1; i++) {
		assert_int_equal(chan_next(&c, &in), 0);
		chan_wait(&c, 10);
	}
	assert_int_equal(c.acked, 1);

	/* the daemon goes, relay and all: no error, the rank goes on */
	close(d);
	close(l);
	unlink(relay);
	msg_reader_free(&r);
	for (int i = 0; i < 200 && c.fd >= 0; i++) {
		assert_int_equal(chan_next(&c, &in), 0);
		chan_wait(&c, 10);
	}
	assert_int_equal(c.fd, -1);
	assert_int_equal(chan_send(&c, msg("checkpoint", 10), false), 0); /* kept */
	assert_int_equal(chan_next(&c, &in), 0); /* dials nobody: still no error */

	/* the next daemon's relay, same address: the rank redials it */
	l = listen_at(relay);
	for (int i = 0; i < 500 && c.fd < 0; i++) {
		assert_int_equal(chan_next(&c, &in), 0);
		chan_wait(&c, 10);
	}
	assert_true(c.fd >= 0);
	d = accept(l, NULL, NULL);
	msg_reader_init(&r);
	assert_int_equal(msg_recv(d, &r, 2000, &m), 1);
	assert_string_equal(type_of(m), "relay");
	json_decref(m);
	assert_int_equal(msg_recv(d, &r, 2000, &m), 1);
	assert_string_equal(type_of(m), "attach");
	assert_int_equal(json_integer_value(json_object_get(m, "acked")), 1);
	json_decref(m);
	assert_int_equal(msg_recv(d, &r, 2000, &m), 1); /* what no daemon acknowledged, in order */
	assert_int_equal(json_integer_value(json_object_get(m, "seq")), 2);
	json_decref(m);
	assert_int_equal(msg_recv(d, &r, 2000, &m), 1);
	assert_int_equal(json_integer_value(json_object_get(m, "seq")), 3);
	assert_string_equal(type_of(m), "checkpoint");
	json_decref(m);

	/* gone again, and no relay within the bound: no daemon can come */
	close(d);
	close(l);
	unlink(relay);
	msg_reader_free(&r);
	c.dial_bound_ms = 200;
	int rc = 0;
	for (int i = 0; i < 500 && rc == 0; i++) {
		rc = chan_next(&c, &in);
		if (rc == 0)
			chan_wait(&c, 10);
	}
	assert_int_equal(rc, -EPIPE);
	assert_false(chan_reachable(&c));
	chan_close(&c, 6);
	char path[160];
	snprintf(path, sizeof path, "%s.exit", base);
	json_t *rec = json_load_file(path, 0, NULL);
	assert_non_null(rec);
	assert_string_equal(json_string_value(json_object_get(rec, "attempt")), "att-1");
	assert_int_equal(json_integer_value(json_object_get(rec, "code")), 6);
	assert_int_equal(json_array_size(json_object_get(rec, "frames")), 2); /* seq 2 and 3 */
	json_decref(rec);
}

/* A dialer whose attempt is over (the fence names another): -ESTALE. */
static int dial_stale(void *ctx)
{
	int *calls = ctx;
	(*calls)++;
	return -ESTALE;
}

/* A broken line whose dialer says the attempt is over: the chan gives up
 * at the first dial, long before its bound (60 s here). */
static void test_redial_stale_gives_up_at_once(void **state)
{
	(void)state;
	char base[128], relay[128];
	snprintf(base, sizeof base, "%s/rank-3", dir);
	snprintf(relay, sizeof relay, "%s/relay3.sock", dir);
	int l = listen_at(relay);
	chan c;
	assert_int_equal(chan_open(&c, -1, base, false, "worker", 3), 0);
	c.fd = dial_relay(relay);
	assert_true(c.fd >= 0);
	fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) | O_NONBLOCK);
	c.had_daemon = true;
	int calls = 0;
	chan_set_redial(&c, dial_stale, &calls, 60000, "att-3");
	int d = accept(l, NULL, NULL);
	close(d);
	close(l);
	unlink(relay);
	json_t *in;
	int rc = 0, i;
	for (i = 0; i < 500 && rc == 0; i++) {
		rc = chan_next(&c, &in);
		if (rc == 0)
			chan_wait(&c, 10);
	}
	assert_int_equal(rc, -EPIPE);
	assert_int_equal(calls, 1); /* no second dial: given up */
	assert_false(chan_reachable(&c));
	chan_close(&c, 6);
}

int main(void)
{
	/* as in every process that uses a channel: a daemon gone mid-write is
	 * EPIPE, not death */
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_kept_replayed_acked, setup, teardown),
		cmocka_unit_test_setup_teardown(test_full_queue_blocks_until_acked, setup, teardown),
		cmocka_unit_test_setup_teardown(test_redial_keeps_and_replays, setup, teardown),
		cmocka_unit_test_setup_teardown(test_redial_stale_gives_up_at_once, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
