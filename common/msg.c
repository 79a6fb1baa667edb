/* msg — see msg.h. */
#include "common/msg.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd pfd = {.fd = fd, .events = POLLOUT};
				if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
					return -errno;
				continue;
			}
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int msg_send(int fd, const json_t *obj)
{
	char *text = json_dumps(obj, JSON_COMPACT);
	if (!text)
		return -ENOMEM;
	size_t n = strlen(text);
	int rc;
	if (n > MSG_MAX_BYTES) {
		rc = -EMSGSIZE;
		goto out;
	}
	unsigned char *frame = malloc(4 + n);
	if (!frame) {
		rc = -ENOMEM;
		goto out;
	}
	frame[0] = (unsigned char)n;
	frame[1] = (unsigned char)(n >> 8);
	frame[2] = (unsigned char)(n >> 16);
	frame[3] = (unsigned char)(n >> 24);
	memcpy(frame + 4, text, n);
	rc = write_all(fd, frame, 4 + n); /* one write keeps frames whole on the wire */
	free(frame);
out:
	free(text);
	return rc;
}

void msg_reader_init(msg_reader *r) { memset(r, 0, sizeof *r); }

void msg_reader_free(msg_reader *r)
{
	free(r->buf);
	memset(r, 0, sizeof *r);
}

long msg_reader_fill(msg_reader *r, int fd)
{
	if (r->cap - r->len < 65536) {
		size_t cap = r->cap ? r->cap * 2 : 65536;
		if (cap > 2 * (MSG_MAX_BYTES + 4) + 65536)
			cap = 2 * (MSG_MAX_BYTES + 4) + 65536;
		if (cap > r->cap) {
			unsigned char *b = realloc(r->buf, cap);
			if (!b)
				return -ENOMEM;
			r->buf = b;
			r->cap = cap;
		}
	}
	if (r->cap == r->len)
		return -ENOBUFS; /* caller must drain with msg_reader_next first */
	for (;;) {
		ssize_t n = read(fd, r->buf + r->len, r->cap - r->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EWOULDBLOCK ? -EAGAIN : -errno;
		r->len += (size_t)n;
		return (long)n;
	}
}

int msg_reader_next(msg_reader *r, json_t **out)
{
	if (r->len < 4)
		return 0;
	uint32_t n = (uint32_t)r->buf[0] | (uint32_t)r->buf[1] << 8 |
		     (uint32_t)r->buf[2] << 16 | (uint32_t)r->buf[3] << 24;
	if (n > MSG_MAX_BYTES)
		return -EPROTO;
	if (r->len < 4 + (size_t)n)
		return 0;
	json_error_t jerr;
	json_t *obj = json_loadb((const char *)r->buf + 4, n, JSON_REJECT_DUPLICATES, &jerr);
	memmove(r->buf, r->buf + 4 + n, r->len - 4 - n);
	r->len -= 4 + (size_t)n;
	if (!obj || !json_is_object(obj)) {
		json_decref(obj);
		return -EPROTO;
	}
	*out = obj;
	return 1;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int msg_recv(int fd, msg_reader *r, int timeout_ms, json_t **out)
{
	int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
	for (;;) {
		int rc = msg_reader_next(r, out);
		if (rc != 0)
			return rc;
		int64_t left = deadline == INT64_MAX ? -1 : deadline - now_ms();
		if (deadline != INT64_MAX && left <= 0)
			return -ETIMEDOUT;
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int p = poll(&pfd, 1, left > INT32_MAX ? INT32_MAX : (int)left);
		if (p < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (p == 0)
			continue;
		long n = msg_reader_fill(r, fd);
		if (n == 0)
			return 0;
		if (n < 0 && n != -EAGAIN)
			return (int)n;
	}
}
