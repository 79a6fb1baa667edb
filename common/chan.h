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
 * A multi-node rank has no listener (its daemon is on another host): it
 * dials its daemon's relay again instead (chan_set_redial). When the
 * relay connection breaks, the rank keeps its messages queued as above
 * and redials with backoff (CHAN_REDIAL_MIN_MS doubling to
 * CHAN_REDIAL_MAX_MS) for at most the bound it was given; the dialer
 * introduces the rank (the relay's own hello), then the daemon gets the
 * same attach and queued messages as a daemon connecting on a listener.
 * Past the bound, or once the dialer says the attempt is over (-ESTALE),
 * no daemon can come (chan_next: -EPIPE).
 *
 * Never exits, never blocks but in chan_send with a full queue (and in
 * msg_send's wait for a daemon that is slow to read, a redial's connect,
 * bounded, and a redialer's chan_close, bounded).
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
#define CHAN_REDIAL_MIN_MS 100
#define CHAN_REDIAL_MAX_MS 2000

/* A redialer: connects again to the daemon and introduces the caller;
 * returns the connected fd (the caller of chan_set_redial's ctx), or a
 * negative errno: -ESTALE when no daemon will ever take the caller again
 * (its attempt is over), and the chan gives up at once instead of at the
 * bound. */
typedef int (*chan_dial_fn)(void *ctx);

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
	/* redial (chan_set_redial): NULL for none */
	chan_dial_fn dial;
	void *dial_ctx;
	int dial_bound_ms;        /* how long to redial after the line broke */
	int dial_backoff_ms;
	int64_t lost_ms;          /* monotonic: when the line broke; 0 while connected */
	int64_t next_dial_ms;
	char attempt[96];         /* written into the exit record when not "" */
} chan;

/* Sets c up: fd the inherited daemon socket (or -1), base the path prefix
 * of its socket and exit record (NULL or "" for none), listen whether to
 * listen on <base>.sock. 0, or a negative errno when the listener cannot be
 * made (c then works without it: not adoptable). */
int chan_open(chan *c, int fd, const char *base, bool listen, const char *role, int index);

/* Makes c redial its daemon with dial(ctx) when the line breaks, for at
 * most bound_ms after it broke (a multi-node rank: common/chan.h's
 * header). attempt, when not NULL, names the attempt in the exit record
 * (the daemon checks it is its attempt's). Messages are numbered and
 * queued from now on, as on a line with a listener. */
void chan_set_redial(chan *c, chan_dial_fn dial, void *ctx, int bound_ms, const char *attempt);

/* Whether a daemon can still come to c: a connected line, a listener, or
 * a redialer within its bound. */
bool chan_reachable(const chan *c);

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
 * closes and removes the listener. Frees the queue. A redialer's line is
 * closed first, cleanly (its half, then what the daemon still sends read
 * until it closes too, at most 2 s), so its last messages are not lost
 * to a reset. */
void chan_close(chan *c, int code);

/* The identity of this process: its start time (/proc/self/stat field 22)
 * and the boot id, for attach messages and records. */
uint64_t chan_self_start_time(void);
void chan_boot_id(char *buf, size_t cap);

#endif
