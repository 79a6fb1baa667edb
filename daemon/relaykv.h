/* relaykv — the key/value store a job's ranks rendezvous through (the net
 * comm backend's addresses, worker/comm_net.cc): one map per attempt, kept
 * by the daemon, reached over each rank's own connection (the relay of a
 * multi-node rank, fd 3 of a local one) with two messages (docs/formats.md):
 *
 *   {"type":"kv_set","key":K,"value":V}  stores V (a string) under K
 *   {"type":"kv_get","key":K}            answered {"type":"kv","key":K,
 *                                        "value":V} once K is set (at once
 *                                        when it already is), or
 *                                        {"type":"kv","key":K,"error":E}
 *
 * A get of a key not set yet waits here, not in the rank: the answer goes
 * out when the key is set. The rank bounds its own wait. A map belongs to
 * one attempt (a restart starts empty), so a dead attempt's addresses are
 * never handed to the next one.
 *
 * Never blocks, never touches the store (SQLite) or the processes: the
 * caller's send function is its only way out.
 */
#ifndef BERTD_DAEMON_RELAYKV_H
#define BERTD_DAEMON_RELAYKV_H

#include <jansson.h>

#define RELAYKV_MAX_KEYS 1024     /* per attempt: a few per rank */
#define RELAYKV_MAX_KEY 128       /* bytes of a key */
#define RELAYKV_MAX_VALUE 131072  /* bytes of a value (comm.h's COMM_KV_MAX, hex) */

typedef struct relaykv relaykv;

/* Sends m to the rank numbered rank; returns 0 or a negative errno. */
typedef int (*relaykv_send_fn)(void *ctx, int rank, json_t *m);

/* Whether m is a relaykv message ("kv_set" or "kv_get"). */
int relaykv_is_message(const json_t *m);

/* Handles a kv_set or kv_get from rank (0 <= rank < 4096). *kv is created
 * on first use (NULL before); answers go out through send. A malformed
 * message or a full map answers the rank with an error (and logs it) rather
 * than leaving it waiting. Returns 0, or -ENOMEM (the rank got no answer and
 * will time out). */
int relaykv_handle(relaykv **kv, const char *job_id, int rank, const json_t *m, relaykv_send_fn send,
		   void *ctx);

/* Frees the map (NULL is fine). Waiters get no answer: their attempt is
 * over. */
void relaykv_destroy(relaykv *kv);

#endif
