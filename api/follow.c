/* follow — a job's events and log lines as Server-Sent Events while they
 * happen (follow.h has the contract, docs/api.md the wire format).
 *
 * A stream is one follower: its output buffer, where it is in the job's
 * events (how many were sent) or log file (the byte offset sent), and
 * whether its connection is suspended. The reader (an MHD pool thread)
 * refills the buffer when it is empty and suspends the connection when
 * there is still nothing to send. The watcher thread polls only suspended
 * followers, so a follower is touched by one thread at a time: the reader
 * while it runs, the watcher while it is suspended (only the watcher and
 * follow_hub_stop resume, both under hub->mu). Store reads never happen
 * under hub->mu.
 *
 * Must never let a reader return 0 without suspending (MHD 0.9.75 would call
 * it again at once, spinning a pool thread), never leave a connection
 * suspended when the server stops (MHD panics), never read a path the
 * client named.
 */
#include "api/follow.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

#define FOLLOW_POLL_MS 250        /* how often suspended streams are looked at */
#define FOLLOW_BLOCK (64u << 10)  /* log bytes read per refill; longer lines are cut */
#define FOLLOW_DRAIN_MS 2000      /* how long stop waits for streams to close */

enum follow_kind { FOLLOW_EVENTS, FOLLOW_LOGS };

struct follower {
	follow_hub *hub;
	struct MHD_Connection *conn;
	int sock;              /* the connection's socket (hang-up check), or -1 */
	enum follow_kind kind;
	char job[32];
	int64_t sent;          /* events: how many of the job's events were sent */
	char path[1400];       /* logs: the file */
	int fd;                /* logs: open file, or -1 before it exists */
	int64_t off;           /* logs: bytes of the file sent */
	bool job_ended;        /* logs: the job was seen in a final state */
	char *buf;             /* (cap) bytes; [pos, len) still to send */
	size_t len, pos, cap;
	int64_t last_ms;       /* when bytes were last handed to MHD */
	bool suspended;        /* under hub->mu */
	bool done;             /* the end event is in buf: END once it is sent */
	bool failed;           /* close with an error (hang-up, store failure) */
	struct follower *prev, *next;
};

struct follow_hub {
	pthread_mutex_t mu;        /* guards list, n, stopping, each suspended */
	pthread_cond_t gone;       /* a follower was freed */
	struct follower *list;
	unsigned n, per_job, total, keepalive_s;
	bool stopping, watching;
	int wake[2];               /* a byte here ends the watcher's wait */
	pthread_t watcher;
	store *st;
	struct follower **snap;    /* (total) the watcher's suspended followers */
	struct pollfd *pfd;        /* (total + 1) */
};

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- output */

static int out_reserve(struct follower *f, size_t more)
{
	if (f->pos == f->len)
		f->pos = f->len = 0;
	if (f->len + more <= f->cap)
		return 0;
	size_t cap = f->cap ? f->cap : 4096;
	while (cap < f->len + more)
		cap *= 2;
	char *b = realloc(f->buf, cap);
	if (!b)
		return -ENOMEM;
	f->buf = b;
	f->cap = cap;
	return 0;
}

static int out_add(struct follower *f, const char *s, size_t n)
{
	if (out_reserve(f, n) < 0)
		return -ENOMEM;
	memcpy(f->buf + f->len, s, n);
	f->len += n;
	return 0;
}

static int out_str(struct follower *f, const char *s)
{
	return out_add(f, s, strlen(s));
}

/* One SSE event: "id: <id>\n", "event: <name>\n" when name, one "data: "
 * line per line of data (SSE reads CR, LF and CRLF as line ends, so each
 * piece between them is its own data line: a client joins them with LF),
 * and the blank line that dispatches it. */
static int out_event(struct follower *f, int64_t id, const char *name, const char *data, size_t n)
{
	char head[64];
	int rc = 0;
	if (id >= 0) {
		snprintf(head, sizeof head, "id: %lld\n", (long long)id);
		rc |= out_str(f, head);
	}
	if (name) {
		rc |= out_str(f, "event: ");
		rc |= out_str(f, name);
		rc |= out_str(f, "\n");
	}
	size_t i = 0;
	do {
		size_t j = i;
		while (j < n && data[j] != '\n' && data[j] != '\r')
			j++;
		rc |= out_str(f, "data: ");
		rc |= out_add(f, data + i, j - i);
		rc |= out_str(f, "\n");
		if (j < n && data[j] == '\r' && j + 1 < n && data[j + 1] == '\n')
			j++;
		i = j + 1;
	} while (i < n);
	rc |= out_str(f, "\n");
	return rc ? -ENOMEM : 0;
}

/* The last event of a stream: the job's final state. */
static int out_end(struct follower *f, enum job_state state)
{
	char data[64];
	int n = snprintf(data, sizeof data, "{\"state\":\"%s\"}", job_state_name(state));
	f->done = true;
	return out_event(f, -1, "end", data, (size_t)n);
}

/* ---------------------------------------------------------------- refill */

json_t *follow_event_json(const store_event *e, int64_t id)
{
	char t[32];
	api_time_format(e->time_ms, t);
	return json_pack("{s:I, s:s, s:s, s:s, s:s?}", "id", (json_int_t)id, "time", t, "from",
			 job_state_name(e->from), "to", job_state_name(e->to), "reason", e->reason);
}

/* Events after the sent-th, then "end" once the newest is a final state
 * (every state change is an event, and a final state is never left). */
static void fill_events(struct follower *f)
{
	store_event *ev = NULL;
	size_t n = 0;
	int rc = store_job_events(f->hub->st, f->job, &ev, &n);
	if (rc == STORE_E_LOCKED)
		return; /* the next look */
	if (rc < 0) {
		log_warn("following %s's events: %s", f->job, api_problem_store_text(rc));
		f->failed = true;
		return;
	}
	for (size_t i = (size_t)f->sent; i < n && !f->failed; i++) {
		json_t *o = follow_event_json(&ev[i], (int64_t)i + 1);
		char *text = o ? api_json_dumps(o, false) : NULL;
		json_decref(o);
		if (!text || out_event(f, (int64_t)i + 1, NULL, text, strlen(text)) < 0)
			f->failed = true;
		else
			f->sent = (int64_t)i + 1;
		free(text);
	}
	if (!f->failed && n > 0 && (size_t)f->sent >= n && job_state_is_terminal(ev[n - 1].to) &&
	    out_end(f, ev[n - 1].to) < 0)
		f->failed = true;
	store_events_free(ev, n);
}

/* The job's state, or -1 when it cannot be read now. */
static int job_state_now(struct follower *f)
{
	store_job j;
	int rc = store_job_get(f->hub->st, f->job, &j);
	if (rc < 0) {
		if (rc != STORE_E_LOCKED) {
			log_warn("following %s's log: %s", f->job, api_problem_store_text(rc));
			f->failed = true;
		}
		return -1;
	}
	int st = (int)j.state;
	store_job_free(&j);
	return st;
}

/* Log lines from f->off: complete lines only (a line still being written
 * waits for its end), each an event whose id is the offset after it; a
 * line longer than FOLLOW_BLOCK goes out in pieces. Once the job is seen
 * final (looked at only when everything written so far was sent, and
 * before reading, so all its processes wrote was in the file), the rest
 * goes out, a last line without its newline too, then "end". */
static void fill_logs(struct follower *f)
{
	if (f->fd < 0) {
		f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (f->fd < 0 && errno != ENOENT) {
			log_warn("following %s: %s", f->path, strerror(errno));
			f->failed = true;
			return;
		}
	}
	struct stat sb;
	int64_t size = f->fd >= 0 && fstat(f->fd, &sb) == 0 ? (int64_t)sb.st_size : 0;
	int state = -1;
	if (size <= f->off && !f->job_ended) {
		state = job_state_now(f);
		if (state < 0)
			return;
		f->job_ended = job_state_is_terminal((enum job_state)state);
		if (f->job_ended && f->fd >= 0 && fstat(f->fd, &sb) == 0)
			size = (int64_t)sb.st_size;
		if (f->job_ended && f->fd < 0) {
			/* the process may have been started since the open above */
			f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
			size = f->fd >= 0 && fstat(f->fd, &sb) == 0 ? (int64_t)sb.st_size : 0;
		}
	}
	if (size > f->off) {
		size_t want = size - f->off > FOLLOW_BLOCK ? FOLLOW_BLOCK : (size_t)(size - f->off);
		char *blk = malloc(want);
		ssize_t got = blk ? pread(f->fd, blk, want, f->off) : -1;
		if (got < 0) {
			log_warn("following %s: %s", f->path, blk ? strerror(errno) : "out of memory");
			free(blk);
			f->failed = true;
			return;
		}
		size_t i = 0;
		int64_t base = f->off; /* blk[0] is this byte of the file */
		bool last_piece = f->job_ended && base + got >= size;
		while (i < (size_t)got) {
			const char *nl = memchr(blk + i, '\n', (size_t)got - i);
			size_t end;
			if (nl)
				end = (size_t)(nl - blk) + 1;
			else if (i == 0 && (size_t)got == FOLLOW_BLOCK)
				end = (size_t)got; /* a line longer than a block: this piece */
			else if (last_piece)
				end = (size_t)got; /* the job ended without a last newline */
			else
				break;
			size_t n = end - i - (nl && blk[end - 1] == '\n');
			if (out_event(f, base + (int64_t)end, NULL, blk + i, n) < 0) {
				f->failed = true;
				break;
			}
			f->off = base + (int64_t)end;
			i = end;
		}
		free(blk);
		if (f->failed)
			return;
	}
	if (f->job_ended && f->off >= size) {
		if (state < 0)
			state = job_state_now(f);
		if (state >= 0 && out_end(f, (enum job_state)state) < 0)
			f->failed = true;
	}
}

static void fill(struct follower *f)
{
	if (f->done || f->failed)
		return;
	if (f->kind == FOLLOW_EVENTS)
		fill_events(f);
	else
		fill_logs(f);
}

/* ---------------------------------------------------------------- reader */

static ssize_t follow_read(void *cls, uint64_t pos, char *out, size_t max)
{
	(void)pos;
	struct follower *f = cls;
	follow_hub *h = f->hub;
	/* the lock also orders what the watcher wrote before it resumed us */
	pthread_mutex_lock(&h->mu);
	bool stopping = h->stopping;
	pthread_mutex_unlock(&h->mu);
	if (f->pos == f->len && !stopping)
		fill(f);
	if (f->failed)
		return API_STREAM_ERROR;
	if (f->pos < f->len) {
		size_t n = f->len - f->pos < max ? f->len - f->pos : max;
		memcpy(out, f->buf + f->pos, n);
		f->pos += n;
		f->last_ms = mono_ms();
		return (ssize_t)n;
	}
	if (f->done || stopping)
		return API_STREAM_END;
	pthread_mutex_lock(&h->mu);
	stopping = h->stopping;
	if (!stopping) {
		f->suspended = true;
		api_conn_suspend(f->conn);
	}
	pthread_mutex_unlock(&h->mu);
	/* a stopping server ends the stream here, without an "end" event: the
	 * job goes on, a client may reconnect with Last-Event-ID */
	return stopping ? API_STREAM_END : 0;
}

static void follower_free(void *cls)
{
	struct follower *f = cls;
	follow_hub *h = f->hub;
	pthread_mutex_lock(&h->mu);
	if (f->prev)
		f->prev->next = f->next;
	else
		h->list = f->next;
	if (f->next)
		f->next->prev = f->prev;
	h->n--;
	pthread_cond_broadcast(&h->gone);
	pthread_mutex_unlock(&h->mu);
	if (f->fd >= 0)
		close(f->fd);
	free(f->buf);
	free(f);
}

/* ---------------------------------------------------------------- watcher */

static void *watch_main(void *arg)
{
	follow_hub *h = arg;
	for (;;) {
		size_t k = 0;
		pthread_mutex_lock(&h->mu);
		bool stop = h->stopping;
		for (struct follower *f = h->list; f && !stop; f = f->next)
			if (f->suspended && k < h->total)
				h->snap[k++] = f;
		pthread_mutex_unlock(&h->mu);
		if (stop)
			break;
		/* The snapshot stays valid: a suspended connection is neither
		 * served nor freed until it is resumed, and only this thread
		 * resumes while the hub runs. */
		h->pfd[0] = (struct pollfd){.fd = h->wake[0], .events = POLLIN};
		for (size_t i = 0; i < k; i++)
			h->pfd[i + 1] = (struct pollfd){.fd = h->snap[i]->sock, .events = POLLRDHUP};
		int pr = poll(h->pfd, k + 1, FOLLOW_POLL_MS);
		if (pr > 0 && (h->pfd[0].revents & POLLIN)) {
			char drain[16];
			while (read(h->wake[0], drain, sizeof drain) > 0)
				;
		}
		int64_t now = mono_ms();
		for (size_t i = 0; i < k; i++) {
			struct follower *f = h->snap[i];
			if (pr > 0 && (h->pfd[i + 1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
				f->failed = true; /* the client went away: free the slot */
				continue;
			}
			fill(f);
			if (f->pos == f->len && !f->done && !f->failed &&
			    now - f->last_ms >= (int64_t)h->keepalive_s * 1000 &&
			    out_str(f, ": keep-alive\n\n") < 0)
				f->failed = true;
		}
		pthread_mutex_lock(&h->mu);
		for (size_t i = 0; i < k; i++) {
			struct follower *f = h->snap[i];
			if (f->suspended && (f->failed || f->done || f->pos < f->len)) {
				f->suspended = false;
				api_conn_resume(f->conn);
			}
		}
		pthread_mutex_unlock(&h->mu);
	}
	return NULL;
}

/* ---------------------------------------------------------------- hub */

int follow_hub_create(follow_hub **out, store *st, unsigned per_job, unsigned total,
		      unsigned keepalive_s)
{
	follow_hub *h = calloc(1, sizeof *h);
	if (!h)
		return -ENOMEM;
	h->st = st;
	h->per_job = per_job;
	h->total = total;
	h->keepalive_s = keepalive_s;
	h->wake[0] = h->wake[1] = -1;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->gone, NULL);
	int rc;
	h->snap = calloc(total ? total : 1, sizeof *h->snap);
	h->pfd = calloc((size_t)total + 1, sizeof *h->pfd);
	if (!h->snap || !h->pfd) {
		rc = -ENOMEM;
		goto out;
	}
	if (pipe2(h->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		rc = -errno;
		goto out;
	}
	if ((rc = -pthread_create(&h->watcher, NULL, watch_main, h)) < 0)
		goto out;
	h->watching = true;
	*out = h;
	return 0;
out:
	follow_hub_destroy(h);
	return rc;
}

void follow_hub_stop(follow_hub *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->stopping = true;
	pthread_mutex_unlock(&h->mu);
	if (h->watching) {
		if (write(h->wake[1], "x", 1) < 0 && errno != EAGAIN)
			log_warn("follow: waking the watcher: %s", strerror(errno));
		pthread_join(h->watcher, NULL);
		h->watching = false;
	}
	/* Readers see stopping and end their streams; give them a moment to
	 * send the last chunk before the server closes the connections. */
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += FOLLOW_DRAIN_MS / 1000;
	pthread_mutex_lock(&h->mu);
	for (struct follower *f = h->list; f; f = f->next)
		if (f->suspended) {
			f->suspended = false;
			api_conn_resume(f->conn);
		}
	while (h->n > 0 && pthread_cond_timedwait(&h->gone, &h->mu, &until) == 0)
		;
	pthread_mutex_unlock(&h->mu);
}

void follow_hub_destroy(follow_hub *h)
{
	if (!h)
		return;
	follow_hub_stop(h);
	if (h->wake[0] >= 0)
		close(h->wake[0]);
	if (h->wake[1] >= 0)
		close(h->wake[1]);
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->gone);
	free(h->snap);
	free(h->pfd);
	free(h);
}

void follow_hub_counts(follow_hub *h, unsigned *open, unsigned *per_job, unsigned *total)
{
	pthread_mutex_lock(&h->mu);
	*open = h->n;
	*per_job = h->per_job;
	*total = h->total;
	pthread_mutex_unlock(&h->mu);
}

/* ---------------------------------------------------------------- requests */

bool follow_param(api_request *req, bool *on, enum MHD_Result *ret)
{
	const char *v = api_query(req, "follow");
	*on = false;
	if (!v || strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
		return true;
	if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0) {
		*on = true;
		return true;
	}
	*ret = api_reply_problem(req, API_P_INVALID_PARAMETER, "follow", "must be 1, true, 0 or false");
	return false;
}

bool follow_start(api_request *req, const char *name, bool following, int64_t *out, bool *given,
		  enum MHD_Result *ret)
{
	/* An EventSource reconnects to the same URL with Last-Event-ID: the
	 * header is the newer position, so it wins over the query. */
	const char *field = "Last-Event-ID";
	const char *v = following ? api_header(req, field) : NULL;
	if (!v) {
		v = api_query(req, name);
		field = name;
	}
	*out = 0;
	*given = v != NULL;
	if (!v)
		return true;
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (v[0] < '0' || v[0] > '9' || *end || errno) {
		*ret = api_reply_problem(req, API_P_INVALID_PARAMETER, field,
					 "must be an integer >= 0 (an id the stream sent)");
		return false;
	}
	*out = x;
	return true;
}

/* Counts the job's streams and all; refuses over a limit (429 with
 * Retry-After), else links a new follower. Returns it or NULL (*ret set). */
static struct follower *follower_add(api_request *req, enum follow_kind kind, enum MHD_Result *ret)
{
	follow_hub *h = req->follow;
	const char *job = req->args.v[0];
	struct follower *f = calloc(1, sizeof *f);
	if (!f) {
		*ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		return NULL;
	}
	pthread_mutex_lock(&h->mu);
	unsigned same = 0;
	for (struct follower *o = h->list; o; o = o->next)
		same += strcmp(o->job, job) == 0;
	bool stopping = h->stopping, full = h->n >= h->total, job_full = same >= h->per_job;
	if (!stopping && !full && !job_full) {
		f->hub = h;
		f->conn = req->conn;
		f->sock = api_conn_fd(req->conn);
		f->kind = kind;
		snprintf(f->job, sizeof f->job, "%s", job);
		f->fd = -1;
		f->last_ms = mono_ms();
		f->next = h->list;
		if (h->list)
			h->list->prev = f;
		h->list = f;
		h->n++;
	}
	unsigned n = h->n;
	pthread_mutex_unlock(&h->mu);
	if (stopping) {
		free(f);
		*ret = api_reply_problem(req, API_P_UNAVAILABLE, NULL, "the daemon is shutting down");
		return NULL;
	}
	if (full || job_full) {
		free(f);
		if (job_full)
			*ret = api_reply_problem(req, API_P_TOO_MANY_FOLLOWERS, NULL,
						 "job %s already has %u follow streams open "
						 "(follow_max_per_job); poll without follow=1 or retry later",
						 job, same);
		else
			*ret = api_reply_problem(req, API_P_TOO_MANY_FOLLOWERS, NULL,
						 "%u follow streams are open (follow_max_total); poll "
						 "without follow=1 or retry later", n);
		return NULL;
	}
	return f;
}

static enum MHD_Result reply_sse(api_request *req, struct follower *f)
{
	/* nginx and friends buffer a response unless told not to */
	if (api_add_header(req, "X-Accel-Buffering", "no") < 0) {
		follower_free(f);
		return api_reply_problem(req, API_P_INTERNAL, NULL, "no room for a header");
	}
	api_stream s = {
		.content_type = "text/event-stream; charset=utf-8",
		.cache_control = "no-store",
		.size = API_SIZE_UNKNOWN,
		.block = FOLLOW_BLOCK,
		.read = follow_read,
		.free = follower_free,
		.cls = f,
	};
	return api_reply_stream(req, MHD_HTTP_OK, &s);
}

enum MHD_Result follow_events(api_request *req, int64_t since)
{
	enum MHD_Result ret;
	struct follower *f = follower_add(req, FOLLOW_EVENTS, &ret);
	if (!f)
		return ret;
	f->sent = since;
	return reply_sse(req, f);
}

enum MHD_Result follow_logs(api_request *req, const char *path, int64_t offset)
{
	enum MHD_Result ret;
	struct follower *f = follower_add(req, FOLLOW_LOGS, &ret);
	if (!f)
		return ret;
	snprintf(f->path, sizeof f->path, "%s", path);
	f->off = offset;
	return reply_sse(req, f);
}
