/* loop — see loop.h. A handful of fds at most, so watchers live in a plain
 * list; removal marks a watcher dead and the next dispatch round frees it, so
 * a callback may remove itself or others safely. */
#include "daemon/loop.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

typedef struct watcher {
	int fd;
	loop_fn fn;
	void *arg;
	bool dead;
	struct watcher *next;
} watcher;

struct loop {
	int epfd;
	bool stop;
	watcher *list;
};

int loop_create(loop **out)
{
	loop *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		int e = errno;
		free(l);
		return -e;
	}
	*out = l;
	return 0;
}

static void reap(loop *l)
{
	for (watcher **pp = &l->list; *pp;) {
		watcher *w = *pp;
		if (w->dead) {
			*pp = w->next;
			free(w);
		} else {
			pp = &w->next;
		}
	}
}

void loop_destroy(loop *l)
{
	if (!l)
		return;
	for (watcher *w = l->list; w; w = w->next)
		w->dead = true;
	reap(l);
	close(l->epfd);
	free(l);
}

int loop_add(loop *l, int fd, uint32_t events, loop_fn fn, void *arg)
{
	watcher *w = calloc(1, sizeof *w);
	if (!w)
		return -ENOMEM;
	*w = (watcher){.fd = fd, .fn = fn, .arg = arg, .next = l->list};
	struct epoll_event ev = {.events = events, .data.ptr = w};
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int e = errno;
		free(w);
		return -e;
	}
	l->list = w;
	return 0;
}

int loop_del(loop *l, int fd)
{
	for (watcher *w = l->list; w; w = w->next) {
		if (w->fd == fd && !w->dead) {
			w->dead = true;
			epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
			return 0;
		}
	}
	return -ENOENT;
}

int loop_run(loop *l)
{
	struct epoll_event evs[32];
	l->stop = false;
	while (!l->stop) {
		int n = epoll_wait(l->epfd, evs, 32, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (int i = 0; i < n && !l->stop; i++) {
			watcher *w = evs[i].data.ptr;
			if (!w->dead)
				w->fn(l, w->fd, evs[i].events, w->arg);
		}
		reap(l);
	}
	return 0;
}

void loop_stop(loop *l) { l->stop = true; }
