/* chan — see chan.h. */
#include "common/chan.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/procstat.h"

uint64_t chan_self_start_time(void)
{
	char state;
	return procstat_starttime(getpid(), &state);
}

void chan_boot_id(char *buf, size_t cap)
{
	snprintf(buf, cap, "?");
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (!f)
		return;
	if (!fgets(buf, (int)cap, f))
		snprintf(buf, cap, "?");
	buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

int chan_open(chan *c, int fd, const char *base, bool listen_too, const char *role, int index)
{
	memset(c, 0, sizeof *c);
	c->fd = fd;
	c->listen_fd = -1;
	c->role = role;
	c->index = index;
	c->had_daemon = fd >= 0;
	msg_reader_init(&c->rd);
	if (!base || !*base)
		return 0;
	snprintf(c->base, sizeof c->base, "%s", base);
	if (!listen_too)
		return 0;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int n = snprintf(sa.sun_path, sizeof sa.sun_path, "%s.sock", base);
	if (n < 0 || (size_t)n >= sizeof sa.sun_path)
		return -ENAMETOOLONG;
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	unlink(sa.sun_path);
	if (bind(s, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(s, 4) < 0) {
		int e = errno;
		close(s);
		return -e;
	}
	c->listen_fd = s;
	return 0;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void disconnect(chan *c)
{
	if (c->fd >= 0) {
		close(c->fd);
		if (c->dial && !c->lost_ms) { /* redial from now on, within the bound */
			c->lost_ms = now_ms();
			c->next_dial_ms = c->lost_ms;
			c->dial_backoff_ms = CHAN_REDIAL_MIN_MS;
		}
	}
	c->fd = -1;
	c->rd.len = 0; /* a part frame of the daemon that went */
}

void chan_set_redial(chan *c, chan_dial_fn dial, void *ctx, int bound_ms, const char *attempt)
{
	c->dial = dial;
	c->dial_ctx = ctx;
	c->dial_bound_ms = bound_ms;
	c->dial_backoff_ms = CHAN_REDIAL_MIN_MS;
	c->lost_ms = c->fd < 0 ? now_ms() : 0;
	c->next_dial_ms = c->lost_ms;
	snprintf(c->attempt, sizeof c->attempt, "%s", attempt ? attempt : "");
}

bool chan_reachable(const chan *c)
{
	return c->fd >= 0 || c->listen_fd >= 0 || c->dial;
}

static int send_now(chan *c, json_t *m)
{
	if (c->fd < 0)
		return -ENOTCONN;
	int rc = msg_send(c->fd, m);
	if (rc == -EPIPE || rc == -ECONNRESET) {
		log_info("the daemon's connection closed; going on without it");
		disconnect(c);
	}
	return rc;
}

/* A daemon connected on the listener: it replaces any earlier connection,
 * hears who we are, then everything it has not acknowledged, in order. */
static void greet(chan *c, int s)
{
	c->fd = s;
	c->had_daemon = true;
	c->lost_ms = 0;
	fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
	char boot[64];
	chan_boot_id(boot, sizeof boot);
	json_t *a = json_pack("{s:s, s:i, s:s, s:i, s:i, s:I, s:s, s:I, s:I}", "type", "attach", "proto", CHAN_PROTO,
			      "role", c->role ? c->role : "", "index", c->index, "pid", (int)getpid(), "start_time",
			      (json_int_t)chan_self_start_time(), "boot_id", boot, "acked", (json_int_t)c->acked,
			      "queued", (json_int_t)c->qbytes);
	int rc = a ? send_now(c, a) : -ENOMEM;
	json_decref(a);
	for (chan_frame *f = c->head; rc == 0 && f; f = f->next)
		rc = send_now(c, f->m);
	log_info("a daemon attached; %s unacknowledged bytes sent again", rc == 0 ? "its" : "not all");
}

static void take_connection(chan *c)
{
	int s = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (s < 0)
		return;
	disconnect(c);
	greet(c, s);
}

/* The line is down and c redials: once its backoff is up, dials; past
 * the bound it gives up (no daemon can come any more). */
static void redial(chan *c)
{
	int64_t now = now_ms();
	if (c->fd >= 0 || !c->dial || now < c->next_dial_ms)
		return;
	if (now - c->lost_ms > c->dial_bound_ms) {
		log_error("no daemon answered at the relay for %d ms; giving up", c->dial_bound_ms);
		c->dial = NULL;
		return;
	}
	int s = c->dial(c->dial_ctx);
	if (s == -ESTALE) {
		log_error("the relay's attempt is over (another attempt holds the job); giving up");
		c->dial = NULL;
		return;
	}
	if (s >= 0) {
		log_info("reconnected to the relay after %lld ms", (long long)(now_ms() - c->lost_ms));
		greet(c, s);
		return;
	}
	c->next_dial_ms = now_ms() + c->dial_backoff_ms;
	c->dial_backoff_ms = c->dial_backoff_ms * 2 > CHAN_REDIAL_MAX_MS ? CHAN_REDIAL_MAX_MS : c->dial_backoff_ms * 2;
}

static void take_ack(chan *c, uint64_t seq)
{
	if (seq > c->acked)
		c->acked = seq;
	while (c->head && c->head->seq <= c->acked) {
		chan_frame *f = c->head;
		c->head = f->next;
		c->qbytes -= f->bytes;
		json_decref(f->m);
		free(f);
	}
	if (!c->head)
		c->tail = NULL;
}

int chan_next(chan *c, json_t **out)
{
	if (c->listen_fd >= 0) {
		struct pollfd p = {.fd = c->listen_fd, .events = POLLIN};
		if (poll(&p, 1, 0) > 0)
			take_connection(c);
	}
	redial(c);
	for (;;) {
		json_t *m;
		while (msg_reader_next(&c->rd, &m) == 1) {
			const char *t = json_string_value(json_object_get(m, "type"));
			if (t && strcmp(t, "ack") == 0) {
				take_ack(c, (uint64_t)json_integer_value(json_object_get(m, "seq")));
				json_decref(m);
				continue;
			}
			*out = m;
			return 1;
		}
		if (c->fd < 0)
			return chan_reachable(c) ? 0 : -EPIPE;
		long n = msg_reader_fill(&c->rd, c->fd);
		if (n == -EAGAIN)
			return 0;
		if (n <= 0) {
			disconnect(c);
			if (!chan_reachable(c))
				return -EPIPE;
			log_info("the daemon is gone; training goes on and its messages are kept for the next one");
			return 0;
		}
	}
}

int chan_wait(chan *c, int timeout_ms)
{
	struct pollfd p[2];
	nfds_t n = 0;
	if (c->fd >= 0)
		p[n++] = (struct pollfd){.fd = c->fd, .events = POLLIN};
	if (c->listen_fd >= 0)
		p[n++] = (struct pollfd){.fd = c->listen_fd, .events = POLLIN};
	if (c->fd < 0 && c->dial) { /* nothing to poll: wait for the next dial */
		int64_t until = c->next_dial_ms - now_ms();
		if (until < timeout_ms)
			timeout_ms = until > 0 ? (int)until : 0;
	}
	if (n == 0 && !c->dial)
		return -EPIPE;
	if (poll(p, n, timeout_ms) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

int chan_send(chan *c, json_t *m, bool vol)
{
	int rc = 0;
	if (!m)
		return -ENOMEM;
	if (vol) {
		if (c->fd >= 0)
			send_now(c, m);
		goto out;
	}
	if (!c->base[0] || (c->listen_fd < 0 && !c->dial)) { /* not adoptable: a plain line */
		rc = c->fd >= 0 ? send_now(c, m) : c->had_daemon ? -EPIPE : 0;
		goto out;
	}
	char *text = json_dumps(m, JSON_COMPACT);
	size_t bytes = text ? strlen(text) + 32 : 0;
	free(text);
	if (!bytes) {
		rc = -ENOMEM;
		goto out;
	}
	/* full: wait for a daemon to take and acknowledge it, never drop */
	while (c->head && c->qbytes + bytes > CHAN_QUEUE_MAX) {
		json_t *in;
		if (!chan_reachable(c)) { /* a redialer past its bound: no daemon will take it */
			rc = -EPIPE;
			goto out;
		}
		chan_wait(c, 1000);
		while (chan_next(c, &in) == 1) /* only acks expected; a stop waits for the caller's poll */
			json_decref(in);
	}
	chan_frame *f = calloc(1, sizeof *f);
	if (!f) {
		rc = -ENOMEM;
		goto out;
	}
	f->seq = ++c->next_seq;
	json_object_set_new(m, "seq", json_integer((json_int_t)f->seq));
	f->m = json_incref(m);
	f->bytes = bytes;
	if (c->tail)
		c->tail->next = f;
	else
		c->head = f;
	c->tail = f;
	c->qbytes += bytes;
	if (c->fd >= 0)
		send_now(c, m);
out:
	json_decref(m);
	return rc;
}

/* A relay connection's end: what the daemon sent that was never read
 * (acknowledgements of the last messages) would make the close a reset,
 * and a reset can take the last messages (the rank's bye) with it before
 * the daemon read them. So: our half closed, the rest read until the
 * daemon closes its half (it does at our end of stream), for at most
 * CHAN_CLOSE_WAIT_MS. */
#define CHAN_CLOSE_WAIT_MS 2000
static void close_relay(chan *c)
{
	if (c->fd < 0)
		return;
	shutdown(c->fd, SHUT_WR);
	int64_t until = now_ms() + CHAN_CLOSE_WAIT_MS;
	char scratch[4096];
	for (;;) {
		int64_t left = until - now_ms();
		struct pollfd p = {.fd = c->fd, .events = POLLIN};
		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			break;
		ssize_t n = read(c->fd, scratch, sizeof scratch);
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			break;
	}
	close(c->fd);
	c->fd = -1;
}

void chan_close(chan *c, int code)
{
	if (c->dial)
		close_relay(c);
	if (c->base[0]) {
		char path[300], tmp[310];
		snprintf(path, sizeof path, "%s.exit", c->base);
		snprintf(tmp, sizeof tmp, "%s.tmp", path);
		json_t *frames = json_array();
		for (chan_frame *f = c->head; f; f = f->next)
			json_array_append(frames, f->m);
		json_t *rec = json_pack("{s:i, s:i, s:I, s:I, s:o}", "code", code, "pid", (int)getpid(), "start_time",
					(json_int_t)chan_self_start_time(), "acked", (json_int_t)c->acked, "frames",
					frames);
		if (rec && c->attempt[0])
			json_object_set_new(rec, "attempt", json_string(c->attempt));
		if (!rec || json_dump_file(rec, tmp, JSON_COMPACT) < 0 || rename(tmp, path) < 0)
			log_error("cannot write the exit record %s", path);
		json_decref(rec);
	}
	if (c->listen_fd >= 0) {
		char sp[300];
		snprintf(sp, sizeof sp, "%s.sock", c->base);
		unlink(sp);
		close(c->listen_fd);
		c->listen_fd = -1;
	}
	while (c->head)
		take_ack(c, c->head->seq);
	msg_reader_free(&c->rd);
}
