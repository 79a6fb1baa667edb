/* msg — length-prefixed JSON messages between the daemon and its children
 * (one socketpair per child). A frame is a 4-byte little-endian length, then
 * that many bytes of one JSON object. Frames over MSG_MAX_BYTES are a
 * protocol error: the reader refuses them instead of allocating.
 *
 * Every message is an object with a "type" string ("hello", "metrics",
 * "checkpoint", "error", "nccl_id", ...); the types are listed in
 * docs/formats.md.
 */
#ifndef BERTD_COMMON_MSG_H
#define BERTD_COMMON_MSG_H

#include <jansson.h>
#include <stddef.h>

#define MSG_MAX_BYTES (1u << 20)

/* Writes one frame, retrying on EINTR and short writes (fd may be blocking
 * or not; on EAGAIN it waits with poll). 0, -EMSGSIZE, or negative errno
 * (-EPIPE when the peer is gone). */
int msg_send(int fd, const json_t *obj);

typedef struct msg_reader {
	unsigned char *buf; /* (cap,) bytes received, not yet parsed */
	size_t len, cap;
} msg_reader;

void msg_reader_init(msg_reader *r);
void msg_reader_free(msg_reader *r);

/* Reads what fd has now (one read(2)). Returns the bytes read (> 0), 0 at
 * end of stream, -EAGAIN when nothing is there, or negative errno. */
long msg_reader_fill(msg_reader *r, int fd);

/* Takes the next complete message out of the buffer: 1 and *out (caller
 * owns, json_decref) when one was there, 0 when more bytes are needed,
 * -EPROTO for a frame too large or not a JSON object (the stream is then
 * unusable). */
int msg_reader_next(msg_reader *r, json_t **out);

/* Blocking helper for children: waits up to timeout_ms (-1 = forever) for
 * one message. 1 and *out, 0 at end of stream, -ETIMEDOUT, or an error. */
int msg_recv(int fd, msg_reader *r, int timeout_ms, json_t **out);

#endif
