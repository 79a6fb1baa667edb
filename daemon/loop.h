/* loop — the daemon's single epoll event loop. Every asynchronous thing the
 * daemon reacts to (signals via signalfd, timers via timerfd, child pidfds
 * and sockets later) is a file descriptor registered here with a callback.
 * Callbacks run on the loop thread, one at a time; they must not block.
 * Not thread-safe: only the loop thread calls loop_* (other threads wake it
 * through an fd it watches, e.g. an eventfd).
 */
#ifndef BERTD_DAEMON_LOOP_H
#define BERTD_DAEMON_LOOP_H

#include <stdint.h>

typedef struct loop loop;
typedef void (*loop_fn)(loop *l, int fd, uint32_t events, void *arg);

/* *out caller-owned (loop_destroy). */
int loop_create(loop **out);
/* Frees the loop; does not close registered fds (their owners do). */
void loop_destroy(loop *l);
/* Watches fd for events (EPOLLIN...) and calls fn(l, fd, revents, arg). */
int loop_add(loop *l, int fd, uint32_t events, loop_fn fn, void *arg);
/* Stops watching fd; safe to call from inside fd's own callback. */
int loop_del(loop *l, int fd);
/* Dispatches until loop_stop is called. Returns 0, or a negative errno if
 * epoll_wait itself fails. */
int loop_run(loop *l);
void loop_stop(loop *l);

#endif
