/* Follow mode: GET /v1/jobs/{id}/events?follow=1 and /logs?follow=1
 * as Server-Sent Events.
 *   - a CPU job followed from its submission: the events stream carries
 *     every event the plain list has, in order, each once, with ids 1..n,
 *     then "end" with the final state, and closes; the logs stream carries
 *     the worker's log file line by line (ids the byte offsets after each
 *     line) and ends too. request_timeout_s is 1 s, so the request
 *     deadline must not cut a stream that lives longer. Paging: since=,
 *     Last-Event-ID and offset= start after what they name;
 *   - bad parameters are 400 naming the field;
 *   - limits: follow_max_per_job and follow_max_total answer 429
 *     too-many-followers with Retry-After; a quiet stream gets keep-alive
 *     comments; clients that hang up mid-stream free their slots (the
 *     count in GET /v1/system drops back) while the daemon keeps serving;
 *     cancelling a followed job ends its stream with "end" canceled;
 *   - SIGTERM with a follow stream open: the stream ends and bertd exits 0
 *     (libmicrohttpd aborts when stopped with a suspended connection). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

typedef it_fx fx;

static int start(void **state, bool hold)
{
	const char *extra[] = {"--request-timeout-s", "1", "--follow-keepalive-s", "1", "--follow-max-per-job", "2",
			       "--follow-max-total", "3", NULL};
	it_daemon_opts o = {.cpu_slots = "2", .schedule = hold ? "false" : "true", .extra = extra,
			    .dataset = "shakes", .corpus = "shakes.txt", .corpus_lines = 2000, .vocab_size = 400};
	return it_setup(state, &o, DEADLINE_S);
}

static int setup_run(void **state) { return start(state, false); }
static int setup_hold(void **state) { return start(state, true); }

/* Submits the tiny job name on shakes for steps steps (saving every 50);
 * returns its id (caller frees). */
static char *submit(const bertd *d, const char *name, const char *steps)
{
	char *spec = it_job_spec(name, "shakes", "training_args.max_steps", steps, "training_args.save_steps", "50", NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

/* ------------------------------------------------------------ a stream */

/* One follow request read by its own thread with libcurl; the bytes so
 * far are visible to the test while it runs. */
typedef struct stream {
	const bertd *d;
	char path[256];
	char last_event_id[32]; /* sent as Last-Event-ID when not "" */
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char *buf;
	size_t len;
	char ctype[128];
	bool done;
	long status;
	int curl_rc;
} stream;

static size_t on_body(char *p, size_t sz, size_t n, void *cls)
{
	stream *s = cls;
	pthread_mutex_lock(&s->mu);
	char *b = realloc(s->buf, s->len + sz * n + 1);
	if (b) {
		memcpy(b + s->len, p, sz * n);
		s->buf = b;
		s->len += sz * n;
		b[s->len] = 0;
	}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return b ? sz * n : 0;
}

static size_t on_header(char *p, size_t sz, size_t n, void *cls)
{
	stream *s = cls;
	size_t len = sz * n;
	if (len > 13 && strncasecmp(p, "Content-Type:", 13) == 0) {
		size_t i = 13;
		while (i < len && p[i] == ' ')
			i++;
		size_t k = len - i;
		while (k && (p[i + k - 1] == '\r' || p[i + k - 1] == '\n'))
			k--;
		snprintf(s->ctype, sizeof s->ctype, "%.*s", (int)k, p + i);
	}
	return len;
}

static void *stream_main(void *arg)
{
	stream *s = arg;
	CURL *c = curl_easy_init();
	char url[512], auth[300], lei[64];
	snprintf(url, sizeof url, "%s%s", s->d->base_url, s->path);
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", s->d->token);
	struct curl_slist *h = curl_slist_append(NULL, auth);
	if (s->last_event_id[0]) {
		snprintf(lei, sizeof lei, "Last-Event-ID: %s", s->last_event_id);
		h = curl_slist_append(h, lei);
	}
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, s);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)DEADLINE_S);
	int rc = curl_easy_perform(c);
	long status = 0;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	pthread_mutex_lock(&s->mu);
	s->curl_rc = rc;
	s->status = status;
	s->done = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static stream *stream_open(const bertd *d, const char *last_event_id, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static stream *stream_open(const bertd *d, const char *last_event_id, const char *fmt, ...)
{
	stream *s = calloc(1, sizeof *s);
	assert_non_null(s);
	s->d = d;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->path, sizeof s->path, fmt, ap);
	va_end(ap);
	snprintf(s->last_event_id, sizeof s->last_event_id, "%s", last_event_id ? last_event_id : "");
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	assert_int_equal(pthread_create(&s->th, NULL, stream_main, s), 0);
	return s;
}

/* Waits until the bytes so far contain needle (true) or the stream ended
 * without it (false); fails the test at the deadline. */
static bool stream_wait_for(stream *s, const char *needle)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += DEADLINE_S;
	pthread_mutex_lock(&s->mu);
	bool found;
	while (!(found = s->buf && strstr(s->buf, needle)) && !s->done)
		if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT) {
			pthread_mutex_unlock(&s->mu);
			fail_msg("%s: no '%s' within %d s", s->path, needle, DEADLINE_S);
		}
	pthread_mutex_unlock(&s->mu);
	return found;
}

/* Joins the stream's thread (it ends when the server ends the stream). */
static void stream_join(stream *s)
{
	pthread_join(s->th, NULL);
}

static void stream_free(stream *s)
{
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s->buf);
	free(s);
}

/* ------------------------------------------------------------ SSE */

typedef struct sse {
	long long id;  /* -1 when the event had no id */
	char name[32]; /* "" for the default event */
	char *data;    /* data lines joined with '\n' */
} sse;

typedef struct sse_list {
	sse *ev;
	size_t n;
	int comments;
	bool tail;     /* bytes after the last blank line (an unfinished event) */
} sse_list;

/* Parses an event stream as the SSE spec reads it (LF line ends here). */
static void sse_parse(const char *buf, size_t len, sse_list *out)
{
	memset(out, 0, sizeof *out);
	sse cur = {.id = -1};
	bool any = false;
	size_t i = 0;
	while (i < len) {
		const char *nl = memchr(buf + i, '\n', len - i);
		if (!nl) {
			out->tail = true;
			break;
		}
		size_t n = (size_t)(nl - (buf + i));
		const char *line = buf + i;
		i += n + 1;
		if (n == 0) {
			if (any) {
				out->ev = realloc(out->ev, (out->n + 1) * sizeof *out->ev);
				assert_non_null(out->ev);
				if (!cur.data)
					cur.data = strdup("");
				out->ev[out->n++] = cur;
			}
			cur = (sse){.id = -1};
			any = false;
			continue;
		}
		if (line[0] == ':') {
			out->comments++;
			continue;
		}
		any = true;
		if (n >= 4 && strncmp(line, "id: ", 4) == 0) {
			cur.id = strtoll(line + 4, NULL, 10);
		} else if (n >= 7 && strncmp(line, "event: ", 7) == 0) {
			snprintf(cur.name, sizeof cur.name, "%.*s", (int)(n - 7), line + 7);
		} else if (n >= 6 && strncmp(line, "data: ", 6) == 0) {
			size_t old = cur.data ? strlen(cur.data) : 0;
			char *d = realloc(cur.data, old + (old ? 1 : 0) + (n - 6) + 1);
			assert_non_null(d);
			if (cur.data)
				d[old++] = '\n';
			memcpy(d + old, line + 6, n - 6);
			d[old + n - 6] = 0;
			cur.data = d;
		} else {
			fail_msg("not an SSE line: '%.*s'", (int)n, line);
		}
	}
	free(cur.data);
}

static void sse_free(sse_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->ev[i].data);
	free(l->ev);
}

/* A finished stream: 200, text/event-stream, closed cleanly, nothing after
 * its last event; returns the parsed events. */
static void stream_events(stream *s, sse_list *l)
{
	if (s->status != 200 || s->curl_rc != 0)
		fail_msg("%s: status %ld, curl %d: %s", s->path, s->status, s->curl_rc,
			 s->buf ? s->buf : "");
	assert_string_equal(s->ctype, "text/event-stream; charset=utf-8");
	sse_parse(s->buf ? s->buf : "", s->len, l);
	assert_false(l->tail);
}

/* The last event is "end" with the job's final state. */
static void assert_ends(const sse_list *l, const char *state)
{
	assert_true(l->n > 0);
	const sse *e = &l->ev[l->n - 1];
	assert_string_equal(e->name, "end");
	json_t *j = json_loads(e->data, 0, NULL);
	assert_non_null(j);
	assert_string_equal(it_jstr(j, "state"), state);
	json_decref(j);
	for (size_t i = 0; i + 1 < l->n; i++)
		assert_string_equal(l->ev[i].name, "");
}

/* The data events of l are exactly the entries of the plain list, in
 * order, ids first_id.. */
static void assert_events_match(const sse_list *l, json_t *list, long long first_id)
{
	size_t n = json_array_size(list);
	if (l->n != n + 1)
		fail_msg("stream has %zu data events, the list %zu", l->n - 1, n);
	for (size_t i = 0; i < n; i++) {
		const sse *e = &l->ev[i];
		assert_int_equal(e->id, first_id + (long long)i);
		json_t *got = json_loads(e->data, 0, NULL);
		json_t *want = json_array_get(list, i);
		assert_non_null(got);
		assert_int_equal(json_integer_value(json_object_get(want, "id")), e->id);
		if (!json_equal(got, want)) {
			char *w = json_dumps(want, JSON_COMPACT);
			fail_msg("event %lld: stream '%s', list '%s'", e->id, e->data, w);
		}
		json_decref(got);
	}
}

static char *read_file(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	assert_non_null(fp);
	fseek(fp, 0, SEEK_END);
	long n = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	assert_int_equal(fread(b, 1, (size_t)n, fp), (size_t)n);
	b[n] = 0;
	fclose(fp);
	*len = (size_t)n;
	return b;
}

/* The log events of l, from byte `from` of the file: each data is one
 * line without its newline, its id the offset after the line. */
static void assert_log_matches(const sse_list *l, const char *file, size_t flen, size_t from)
{
	size_t off = from;
	for (size_t i = 0; i + 1 < l->n; i++) {
		const sse *e = &l->ev[i];
		size_t dl = strlen(e->data);
		if (off + dl > flen || memcmp(file + off, e->data, dl) != 0)
			fail_msg("log line %zu (at byte %zu) is not the file's: '%s'", i, off, e->data);
		off += dl;
		if (off < flen && file[off] == '\n')
			off++;
		assert_int_equal(e->id, (long long)off);
	}
	assert_int_equal(off, flen);
}

/* ------------------------------------------------------------ tests */

static void test_follow_job_to_its_end(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "follow-me", "200");
	stream *ev = stream_open(&f->d, NULL, "/v1/jobs/%s/events?follow=1", id);
	stream *lg = stream_open(&f->d, NULL, "/v1/jobs/%s/logs?follow=1&offset=0", id);

	/* the stream is open before the job ends: what follows is followed */
	assert_true(stream_wait_for(ev, "id: 1\n"));
	char path[200];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *job = it_get_json(&f->d, path);
	const char *st = it_jstr(job, "state");
	if (strcmp(st, "completed") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "canceled") == 0)
		fail_msg("job %s was already %s when its first event arrived", id, st);
	json_decref(job);

	stream_join(ev);
	stream_join(lg);
	/* the streams end once the job has ended */
	job = it_get_json(&f->d, path);
	it_assert_completed(&f->d, job);
	json_decref(job);

	snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
	json_t *all = it_get_json(&f->d, path);
	json_t *list = json_object_get(all, "events");
	size_t n = json_array_size(list);
	assert_true(n >= 4); /* submitted, starting, running, completed */
	sse_list l;
	stream_events(ev, &l);
	assert_events_match(&l, list, 1);
	assert_ends(&l, "completed");
	sse_free(&l);

	char logpath[300];
	snprintf(logpath, sizeof logpath, "%s/jobs/%s/logs/worker-0.log", f->d.state_dir, id);
	size_t flen;
	char *file = read_file(logpath, &flen);
	assert_true(flen > 0);
	stream_events(lg, &l);
	assert_ends(&l, "completed");
	assert_true(l.n > 2);
	assert_log_matches(&l, file, flen, 0);
	long long second = l.ev[1].id; /* offset after the log's second line */
	sse_free(&l);
	stream_free(ev);
	stream_free(lg);

	/* paging: since=2, Last-Event-ID and offset= start after what they name;
	 * the job has ended, so each stream sends the rest and its end at once */
	stream *s = stream_open(&f->d, NULL, "/v1/jobs/%s/events?follow=1&since=2", id);
	stream_join(s);
	stream_events(s, &l);
	json_t *rest = json_array();
	for (size_t i = 2; i < n; i++)
		json_array_append(rest, json_array_get(list, i));
	assert_events_match(&l, rest, 3);
	assert_ends(&l, "completed");
	sse_free(&l);
	stream_free(s);
	json_decref(rest);

	char lei[32];
	snprintf(lei, sizeof lei, "%zu", n - 1);
	/* the header wins over the URL's since (an EventSource repeats its URL) */
	s = stream_open(&f->d, lei, "/v1/jobs/%s/events?follow=1&since=1", id);
	stream_join(s);
	stream_events(s, &l);
	assert_int_equal(l.n, 2);
	assert_int_equal(l.ev[0].id, (long long)n);
	assert_ends(&l, "completed");
	sse_free(&l);
	stream_free(s);

	s = stream_open(&f->d, NULL, "/v1/jobs/%s/logs?follow=1&offset=%lld", id, second);
	stream_join(s);
	stream_events(s, &l);
	assert_log_matches(&l, file, flen, (size_t)second);
	assert_ends(&l, "completed");
	sse_free(&l);
	stream_free(s);
	snprintf(lei, sizeof lei, "%lld", second);
	s = stream_open(&f->d, lei, "/v1/jobs/%s/logs?follow=1&tail=1", id);
	stream_join(s);
	stream_events(s, &l);
	assert_log_matches(&l, file, flen, (size_t)second);
	assert_ends(&l, "completed");
	sse_free(&l);
	stream_free(s);

	/* the plain list pages the same way */
	snprintf(path, sizeof path, "/v1/jobs/%s/events?since=2", id);
	json_t *page = it_get_json(&f->d, path);
	json_t *pl = json_object_get(page, "events");
	assert_int_equal(json_array_size(pl), n - 2);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(pl, 0), "id")), 3);
	assert_true(json_equal(json_array_get(pl, 0), json_array_get(list, 2)));
	json_decref(page);

	free(file);
	json_decref(all);
	free(id);
}

static void check_problem(const http_resp *r, long status, const char *code, const char *field)
{
	char type[128];
	if (r->status != status)
		fail_msg("want %ld %s, got %ld: %s", status, code, r->status, r->body);
	assert_non_null(r->json);
	snprintf(type, sizeof type, "urn:bertd:problem:%s", code);
	assert_string_equal(it_jstr(r->json, "type"), type);
	if (field)
		assert_string_equal(it_jstr(r->json, "field"), field);
}

static void test_bad_parameters(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "held", "20");
	static const struct {
		const char *query, *field;
	} bad[] = {
		{"events?follow=yes", "follow"},
		{"events?follow=1&since=-1", "since"},
		{"events?since=x", "since"},
		{"events?cursor=3", "cursor"},
		{"logs?follow=2", "follow"},
		{"logs?offset=0", "offset"},
		{"logs?follow=1&offset=5&tail=3", "offset"},
		{"logs?follow=1&offset=1", "offset"}, /* the held job's log is empty */
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char path[200];
		http_resp r;
		snprintf(path, sizeof path, "/v1/jobs/%s/%s", id, bad[i].query);
		assert_int_equal(http_get(&f->d, path, &r), 0);
		check_problem(&r, 400, "invalid-parameter", bad[i].field);
		http_resp_free(&r);
	}
	const char *hdr[] = {"Last-Event-ID: x", NULL};
	char path[200];
	http_resp r;
	snprintf(path, sizeof path, "/v1/jobs/%s/events?follow=1", id);
	assert_int_equal(http_do(&f->d, "GET", path, NULL, 0, hdr, H_AUTH, &r), 0);
	check_problem(&r, 400, "invalid-parameter", "Last-Event-ID");
	http_resp_free(&r);
	assert_int_equal(http_get(&f->d, "/v1/jobs/job-00000000000000ff/events?follow=1", &r), 0);
	check_problem(&r, 404, "job-not-found", NULL);
	http_resp_free(&r);
	free(id);
}

/* A raw connection that sends a follow request and reads its headers:
 * returns the socket with the stream still open (200). */
static int raw_follow(const bertd *d, const char *path)
{
	int fd = it_connect(d, DEADLINE_S);
	char req[600];
	int n = snprintf(req, sizeof req,
			 "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", path,
			 d->token);
	assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
	char buf[4096];
	size_t len = 0;
	while (len < sizeof buf - 1) {
		ssize_t got = recv(fd, buf + len, sizeof buf - 1 - len, 0);
		assert_true(got > 0);
		len += (size_t)got;
		buf[len] = 0;
		if (strstr(buf, "\r\n\r\n"))
			break;
	}
	if (strncmp(buf, "HTTP/1.1 200", 12) != 0)
		fail_msg("GET %s: %s", path, buf);
	return fd;
}

static long followers_open(const bertd *d)
{
	json_t *sys = it_get_json(d, "/v1/system");
	json_t *fo = json_object_get(sys, "followers");
	assert_true(json_is_object(fo));
	long n = (long)json_integer_value(json_object_get(fo, "open"));
	json_decref(sys);
	return n;
}

/* Polls GET /v1/system until followers.open is want (states change
 * asynchronously: bounded by a deadline, never by a timing assertion). */
static void wait_followers(const bertd *d, long want)
{
	long n = -1;
	for (int i = 0; i < DEADLINE_S * 10 && (n = followers_open(d)) != want; i++)
		it_pause_ms(100);
	if (n != want)
		fail_msg("followers.open stayed %ld, want %ld", n, want);
}

static void test_limits_hangups_and_cancel(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *a = submit(&f->d, "held-a", "20");
	char *b = submit(&f->d, "held-b", "20");
	char pa[160], pb[160];
	snprintf(pa, sizeof pa, "/v1/jobs/%s/events?follow=1", a);
	snprintf(pb, sizeof pb, "/v1/jobs/%s/logs?follow=1", b);

	/* per job: 2 */
	int a1 = raw_follow(&f->d, pa);
	stream *a2 = stream_open(&f->d, NULL, "%s", pa);
	assert_true(stream_wait_for(a2, "id: 1\n"));
	http_resp r;
	assert_int_equal(http_get(&f->d, pa, &r), 0);
	check_problem(&r, 429, "too-many-followers", NULL);
	char v[64];
	assert_non_null(http_header(&r, "Retry-After", v, sizeof v));
	assert_true(atoi(v) > 0);
	assert_non_null(strstr(it_jstr(r.json, "detail"), "follow_max_per_job"));
	http_resp_free(&r);
	/* in all: 3 */
	int b1 = raw_follow(&f->d, pb);
	assert_int_equal(followers_open(&f->d), 3);
	assert_int_equal(http_get(&f->d, pb, &r), 0);
	check_problem(&r, 429, "too-many-followers", NULL);
	assert_non_null(strstr(it_jstr(r.json, "detail"), "follow_max_total"));
	http_resp_free(&r);

	/* a quiet stream gets keep-alive comments (follow_keepalive_s 1) */
	assert_true(stream_wait_for(a2, "\n: keep-alive\n\n"));

	/* two clients hang up mid-stream: their slots come back, and the
	 * daemon serves everyone meanwhile */
	close(a1);
	close(b1);
	wait_followers(&f->d, 1);
	assert_int_equal(http_get(&f->d, "/v1/healthz", &r), 0);
	assert_int_equal(r.status, 200);
	http_resp_free(&r);
	int a3 = raw_follow(&f->d, pa);
	int b2 = raw_follow(&f->d, pb);
	assert_int_equal(followers_open(&f->d), 3);

	/* cancelling the job ends its streams with its final state */
	it_cancel_job(&f->d, a, DEADLINE_S);
	stream_join(a2);
	sse_list l;
	stream_events(a2, &l);
	assert_ends(&l, "canceled");
	snprintf(pa, sizeof pa, "/v1/jobs/%s/events", a);
	json_t *all = it_get_json(&f->d, pa);
	assert_events_match(&l, json_object_get(all, "events"), 1);
	json_decref(all);
	sse_free(&l);
	stream_free(a2);
	close(a3);
	close(b2);
	wait_followers(&f->d, 0);
	free(a);
	free(b);
}

static void test_shutdown_ends_streams(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "held-c", "20");
	stream *ev = stream_open(&f->d, NULL, "/v1/jobs/%s/events?follow=1", id);
	stream *lg = stream_open(&f->d, NULL, "/v1/jobs/%s/logs?follow=1", id);
	assert_true(stream_wait_for(ev, "id: 1\n"));
	assert_true(stream_wait_for(lg, ": keep-alive\n"));
	/* both suspended now; SIGTERM must end them and exit 0 */
	int rc = bertd_stop(&f->d);
	if (rc != 0) {
		bertd_print_log(&f->d);
		fail_msg("bertd exited %d after SIGTERM with follow streams open", rc);
	}
	stream_join(ev);
	stream_join(lg);
	/* closed without an "end" event: the job did not end */
	assert_int_equal(ev->status, 200);
	sse_list l;
	sse_parse(ev->buf, ev->len, &l);
	assert_true(l.n >= 1);
	for (size_t i = 0; i < l.n; i++)
		assert_string_not_equal(l.ev[i].name, "end");
	sse_free(&l);
	stream_free(ev);
	stream_free(lg);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_follow_job_to_its_end, setup_run, it_teardown),
		cmocka_unit_test_setup_teardown(test_bad_parameters, setup_hold, it_teardown),
		cmocka_unit_test_setup_teardown(test_limits_hangups_and_cancel, setup_hold, it_teardown),
		cmocka_unit_test_setup_teardown(test_shutdown_ends_streams, setup_hold, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
