/* chan — a child's line to the daemon that outlives the daemon (workers,
 * bertd-prepare; loaders only for their exit record). Frames are common/msg.h's. The
 * first daemon's line is the inherited socketpair (fd 3); besides it the
 * child listens on a unix socket, <base>.sock, in its job's directory, and a
 * daemon started later connects there to adopt it (docs/architecture.md,
 * "Jobs outlive the daemon").
 *
 * Every message but a heartbeat carries a sequence number ("seq") and stays
 * queued until the daemon acknowledges it ({"type":"ack","seq":N}: handled
 * and stored). With no daemon the queue holds what the child says; at
 * CHAN_QUEUE_MAX bytes chan_send blocks until a daemon connects and
 * acknowledges, so nothing is dropped. A daemon that connects first gets
 * {"type":"attach",...} (protocol version, identity, the last acknowledged
 * seq), then every queued message again, in order; it skips seqs it has.
 * At exit the child writes <base>.exit: its exit code and whatever is
 * still unacknowledged, for a daemon that was not there to read it.
 *
 * Never exits, never blocks but in chan_send with a full queue (and in
 * msg_send's wait for a daemon that is slow to read).
 */
#ifndef BERTD_COMMON_CHAN_H
#define BERTD_COMMON_CHAN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"

/* The worker protocol's version: in "hello" and "attach". A daemon adopts
 * the versions it knows (CHAN_PROTO_MIN..CHAN_PROTO) and refuses others. */
#ifndef CHAN_PROTO /* a test builds a worker of another version (tests/integration/meson.build) */
#define CHAN_PROTO 1
#endif
#define CHAN_PROTO_MIN 1
#define CHAN_QUEUE_MAX (4u << 20) /* bytes of unacknowledged messages */
#define CHAN_ENV "BERTD_CHANNEL"  /* the child's <base>, set by the daemon */

typedef struct chan_frame {
	uint64_t seq;
	json_t *m;      /* the message as sent, "seq" included */
	size_t bytes;   /* its encoded length */
	struct chan_frame *next;
} chan_frame;

typedef struct chan {
	int fd;                   /* the connected daemon; -1 none */
	int listen_fd;            /* <base>.sock; -1 when not adoptable */
	char base[256];           /* "" without a base (run by hand, a relayed rank) */
	const char *role;         /* "worker", "loader", "prepare" */
	int index;
	msg_reader rd;
	chan_frame *head, *tail;  /* unacknowledged, oldest first */
	size_t qbytes;
	uint64_t next_seq, acked;
	bool had_daemon;          /* some daemon was connected once */
} chan;

/* Sets c up: fd the inherited daemon socket (or -1), base the path prefix
 * of its socket and exit record (NULL or "" for none), listen whether to
 * listen on <base>.sock. 0, or a negative errno when the listener cannot be
 * made (c then works without it: not adoptable). */
int chan_open(chan *c, int fd, const char *base, bool listen, const char *role, int index);

/* Sends m (taken: released here). A heartbeat (vol) is sent only to a
 * connected daemon and never queued. 0, -ENOMEM, -EMSGSIZE; -EPIPE when
 * there is no daemon and none can come (no listener). */
int chan_send(chan *c, json_t *m, bool vol);

/* Takes what the daemon sent that is there now (a new daemon's connection
 * is accepted first; acknowledgements are consumed here): 1 and *out
 * (caller owns), 0 when nothing, -EPIPE when the daemon is gone and no other
 * can come. Never blocks. */
int chan_next(chan *c, json_t **out);

/* Waits up to timeout_ms for something from a daemon (a connection or a
 * message). 0, or a negative errno. */
int chan_wait(chan *c, int timeout_ms);

/* Writes <base>.exit (code and the unacknowledged messages; tmp + rename),
 * closes and removes the listener. Frees the queue. */
void chan_close(chan *c, int code);

/* The identity of this process: its start time (/proc/self/stat field 22)
 * and the boot id, for attach messages and records. */
uint64_t chan_self_start_time(void);
void chan_boot_id(char *buf, size_t cap);

#endif
