/* follow — see follow.h. One stream per SSE route; a stream is either
 * connected (an easy handle in the multi), or waiting to reconnect at
 * retry_at. The parser keeps the last id across connections; it is sent as
 * Last-Event-ID, which the daemon prefers over the URL's tail/offset, so
 * the URL of the first connection is reused unchanged. */
#include "client/follow.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <curl/curl.h>

#include "client/clihttp.h"
#include "client/sse.h"

enum { S_EVENTS, S_LOGS, S_N };

#define IDLE_S 45 /* seconds without a byte (keep-alives included) before a stream counts as cut */

typedef struct stream {
	const cli *c;
	const follow_opts *o;
	int kind;
	char path[512];
	sse_parser p;
	CURL *h;
	struct curl_slist *hdrs;
	char err[CURL_ERROR_SIZE];
	char *errbody;          /* a non-200 answer's body */
	size_t errlen;
	bool on;                /* wanted at all */
	bool ended;             /* got "end" */
	char end_state[32];
	double retry_at;        /* when a waiting stream connects again */
	double down_since;      /* first failure since the last good answer; 0 when up */
	int attempts;
	double last_rx;         /* when the connection last delivered a byte */
	bool *any_up;           /* some stream of this follow got an answer once */
	int out_err;
} stream;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int print_event(stream *s, const char *data)
{
	if (s->c->json) {
		printf("%s\n", data);
		return 0;
	}
	json_t *e = json_loads(data, 0, NULL);
	const char *t = json_string_value(json_object_get(e, "time"));
	const char *from = json_string_value(json_object_get(e, "from"));
	const char *to = json_string_value(json_object_get(e, "to"));
	const char *why = json_string_value(json_object_get(e, "reason"));
	if (!t || !from || !to)
		printf("event: %s\n", data);
	else if (strcmp(from, to) == 0)
		printf("%s  %-10s  %s\n", t, to, why ? why : "");
	else
		printf("%s  %-10s  %s -> %s%s%s\n", t, to, from, to, why ? ": " : "", why ? why : "");
	json_decref(e);
	return 0;
}

static int print_line(stream *s, const char *id, const char *data)
{
	if (!s->c->json) {
		printf("%s\n", data);
		return 0;
	}
	json_t *o = json_pack("{s:s, s:i, s:I, s:s}", "stream", s->o->loader >= 0 ? "loader" : "rank", "index",
			      s->o->loader >= 0 ? s->o->loader : s->o->rank, "offset",
			      (json_int_t)strtoll(id, NULL, 10), "line", data);
	char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
	if (txt)
		printf("{\"log\":%s}\n", txt);
	free(txt);
	json_decref(o);
	return txt ? 0 : -1;
}

static int on_event(void *arg, const char *event, const char *id, const char *data, size_t len)
{
	stream *s = arg;
	(void)len;
	if (strcmp(event, "end") == 0) {
		json_t *e = json_loads(data, 0, NULL);
		const char *st = json_string_value(json_object_get(e, "state"));
		snprintf(s->end_state, sizeof s->end_state, "%s", st ? st : "?");
		json_decref(e);
		s->ended = true;
		return 0;
	}
	if (s->kind == S_EVENTS)
		print_event(s, data);
	else
		print_line(s, id, data);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		s->out_err = errno ? errno : EIO;
		return 1;
	}
	return 0;
}

static size_t on_body(char *b, size_t size, size_t nmemb, void *arg)
{
	stream *s = arg;
	size_t n = size * nmemb;
	long status = 0;
	curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
	if (status != 200) {
		char *nb = realloc(s->errbody, s->errlen + n + 1);
		if (!nb)
			return 0;
		memcpy(nb + s->errlen, b, n);
		s->errbody = nb;
		s->errlen += n;
		nb[s->errlen] = 0;
		return n;
	}
	s->down_since = 0;
	s->attempts = 0;
	s->last_rx = now_s();
	*s->any_up = true;
	return sse_feed(&s->p, b, n) == 0 ? n : 0;
}

static int connect_stream(stream *s, CURLM *m)
{
	char url[1200], hdr[128];
	s->h = curl_easy_init();
	if (!s->h)
		return -1;
	sse_reset(&s->p); /* a half event from the last connection is asked for again */
	free(s->errbody);
	s->errbody = NULL;
	s->errlen = 0;
	s->err[0] = 0;
	snprintf(url, sizeof url, "%s%s", s->c->url, s->path);
	char auth[600];
	if (s->c->token[0]) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", s->c->token);
		s->hdrs = curl_slist_append(s->hdrs, auth);
	}
	s->hdrs = curl_slist_append(s->hdrs, "Accept: text/event-stream");
	if (s->p.id[0]) {
		snprintf(hdr, sizeof hdr, "Last-Event-ID: %s", s->p.id);
		s->hdrs = curl_slist_append(s->hdrs, hdr);
	}
	curl_easy_setopt(s->h, CURLOPT_URL, url);
	curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, s->hdrs);
	curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(s->h, CURLOPT_ERRORBUFFER, s->err);
	clihttp_setup(s->c, s->h);
	curl_easy_setopt(s->h, CURLOPT_PRIVATE, s);
	s->last_rx = now_s();
	if (s->c->verbose)
		fprintf(stderr, "bertctl: GET %s%s%s\n", url, s->p.id[0] ? " Last-Event-ID: " : "", s->p.id);
	return curl_multi_add_handle(m, s->h) == CURLM_OK ? 0 : -1;
}

static void drop_handle(stream *s, CURLM *m)
{
	if (!s->h)
		return;
	curl_multi_remove_handle(m, s->h);
	curl_easy_cleanup(s->h);
	s->h = NULL;
	curl_slist_free_all(s->hdrs);
	s->hdrs = NULL;
}

/* A connection ended: done, refused for good, or to be made again. */
static int finished(stream *s, CURLM *m, CURLcode cr)
{
	long status = 0;
	curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
	char msg[300];
	snprintf(msg, sizeof msg, "%s", cr != CURLE_OK ? (s->err[0] ? s->err : curl_easy_strerror(cr)) : "");
	drop_handle(s, m);
	if (s->out_err) {
		fprintf(stderr, "bertctl: writing the output: %s\n", strerror(s->out_err));
		return CLI_ERROR;
	}
	if (s->ended)
		return CLI_OK;
	if (status >= 400 && status < 500 && status != 429) {
		clihttp_resp r = {.status = status, .body = s->errbody, .len = s->errlen};
		clihttp_report("GET", s->path, &r);
		return CLI_HTTP_4XX;
	}
	if (status == 200)
		*s->any_up = true;
	if (status == 0 && !*s->any_up) {
		/* never reached: a wrong URL or a daemon not started is said at
		 * once, not after retry_s; only a daemon seen is waited for */
		fprintf(stderr, "bertctl: GET %s: no answer: %s\n", s->path, msg);
		return CLI_HTTP_5XX;
	}
	double t = now_s();
	if (s->down_since == 0)
		s->down_since = t;
	if (t - s->down_since > s->o->retry_s) {
		fprintf(stderr, "bertctl: GET %s: no answer for %d s, giving up%s%s (HTTP %ld)\n", s->path,
			s->o->retry_s, msg[0] ? ": " : "", msg, status);
		return CLI_HTTP_5XX;
	}
	/* 0.25 s, 0.5 s, 1 s, then every 2 s: a restarting daemon is back soon */
	double wait = s->attempts >= 3 ? 2.0 : 0.25 * (1 << s->attempts);
	s->attempts++;
	s->retry_at = t + wait;
	if (s->c->verbose || status == 200)
		fprintf(stderr, "bertctl: %s stream closed before the job ended%s%s; reconnecting%s%s\n",
			s->kind == S_EVENTS ? "events" : "log", msg[0] ? " (" : "", msg, s->p.id[0] ? " after id " : "",
			s->p.id);
	return -1; /* again */
}

int follow_job(const cli *c, const char *id, const follow_opts *o)
{
	int rc = CLI_OK;
	char eid[200];
	bool any_up = false;
	stream ss[S_N];
	memset(ss, 0, sizeof ss);
	CURLM *m = curl_multi_init();
	if (!m)
		return CLI_ERROR;
	clihttp_escape(id, eid, sizeof eid);
	for (int k = 0; k < S_N; k++) {
		stream *s = &ss[k];
		s->c = c;
		s->o = o;
		s->kind = k;
		s->any_up = &any_up;
		sse_init(&s->p, on_event, s);
	}
	ss[S_EVENTS].on = o->events;
	snprintf(ss[S_EVENTS].path, sizeof ss[S_EVENTS].path, "/v1/jobs/%s/events?follow=1", eid);
	ss[S_LOGS].on = o->logs;
	char which[64], start[64];
	if (o->loader >= 0)
		snprintf(which, sizeof which, "loader=%d", o->loader);
	else
		snprintf(which, sizeof which, "rank=%d", o->rank);
	if (o->tail >= 0)
		snprintf(start, sizeof start, "tail=%ld", o->tail);
	else
		snprintf(start, sizeof start, "offset=0");
	snprintf(ss[S_LOGS].path, sizeof ss[S_LOGS].path, "/v1/jobs/%s/logs?follow=1&%s&%s", eid, which, start);

	for (;;) {
		bool live = false;
		double t = now_s();
		for (int k = 0; k < S_N; k++) {
			stream *s = &ss[k];
			if (!s->on || s->ended)
				continue;
			live = true;
			if (!s->h && t >= s->retry_at && connect_stream(s, m) < 0) {
				rc = CLI_ERROR;
				goto out;
			}
			/* a daemon that vanished without closing (a cut network) is
			 * noticed by its missing keep-alives: no byte for 3 x the
			 * default follow_keepalive_s of 15 s */
			if (s->h && t - s->last_rx > IDLE_S) {
				fprintf(stderr, "bertctl: %s stream silent for %d s; reconnecting\n",
					s->kind == S_EVENTS ? "events" : "log", IDLE_S);
				drop_handle(s, m);
				s->retry_at = t;
			}
		}
		if (!live)
			break;
		int running = 0;
		curl_multi_perform(m, &running);
		CURLMsg *msg;
		int left;
		while ((msg = curl_multi_info_read(m, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			stream *s = NULL;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
			int r = finished(s, m, msg->data.result);
			if (r > 0) {
				rc = r;
				goto out;
			}
		}
		curl_multi_poll(m, NULL, 0, 250, NULL);
	}
	const char *state = o->events ? ss[S_EVENTS].end_state : ss[S_LOGS].end_state;
	if (c->json)
		printf("{\"end\":{\"state\":\"%s\"}}\n", state);
	else
		fprintf(stderr, "bertctl: job %s %s\n", id, state);
	fflush(stdout);
	rc = strcmp(state, "completed") == 0  ? CLI_OK
	     : strcmp(state, "canceled") == 0 ? CLI_JOB_CANCELED
					      : CLI_JOB_FAILED;
out:
	for (int k = 0; k < S_N; k++) {
		drop_handle(&ss[k], m);
		sse_free(&ss[k].p);
		free(ss[k].errbody);
	}
	curl_multi_cleanup(m);
	return rc;
}
