/* keepalive — a bound on how long a TCP connection may go unanswered
 * (docs/multinode.md, "When a link fails"): the relay between a daemon and
 * the ranks of a multi-node job sets it on both ends, so a peer cut off by
 * the network (no FIN, no RST ever comes) turns into a socket error
 * (ETIMEDOUT) within about timeout_ms, idle or not, while a link that is
 * down for less than that (a flap) costs nothing. Never closes the socket
 * or changes its blocking mode. */
#ifndef BERTD_COMMON_KEEPALIVE_H
#define BERTD_COMMON_KEEPALIVE_H

/* SO_KEEPALIVE with probes every max(1, timeout_ms / 3000) s after as long
 * idle, and TCP_USER_TIMEOUT timeout_ms (data or probes unacknowledged that
 * long end the connection). timeout_ms <= 0: nothing is set. 0 or a
 * negative errno (the first setsockopt that failed). */
int keepalive_set(int fd, int timeout_ms);

#endif
