/* http — libmicrohttpd glue: listening socket, limits, auth, body
 * accumulation, dispatch through the route table, and the reply helpers.
 *
 * Request life: MHD calls on_request once with headers only. We refuse
 * early: the message framing (Host, Content-Length, Transfer-Encoding: 400,
 * 501), then the token on every path but the public ones (401 before 404
 * and 405, so no route can be probed without a token), then the route and
 * whether the token's role may call it (403), 415, and 413 when
 * Content-Length already says too much. Then MHD calls once
 * per body piece (counted against max_body_bytes as it arrives, chunked
 * uploads included), then once more with no data (we call the handler). libmicrohttpd 0.9.7x cannot queue a
 * reply while a body is still arriving, so a chunked body that crosses the
 * limit is dropped piece by piece (never buffered) and answered with 413 at
 * its end; a client that keeps streaming past a hard cap is disconnected.
 * Errors MHD finds before it calls us (a malformed request line or header,
 * an unparsable Content-Length, 414, 431, 505) are answered by MHD itself
 * with its fixed HTML bodies: 0.9.75 has no hook to replace them.
 *
 * Must never hold the store lock across network I/O, never log the token or
 * request bodies, and never let a handler run before auth passed.
 */
#include "api/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/tls.h"
#include "common/log.h"
#include "daemon/telemetry.h"

#define DEFAULT_MAX_BODY (1u << 20)
#define DEFAULT_THREADS 4
#define DEFAULT_TIMEOUT_S 30
#define DEFAULT_CONN_LIMIT 128
#define DEFAULT_PER_IP 64
#define DEFAULT_CONN_MEMORY (64u << 10)
#define DEFAULT_REQUEST_TIMEOUT_S 10

/* One open connection, from MHD's NOTIFY_CONNECTION started to closed.
 * libmicrohttpd's connection timeout is an idle timeout that every byte
 * resets, so a client trickling a header never meets it: the sweeper
 * closes (shutdown(2): MHD then sees the end and cleans up) a connection
 * whose request has not fully arrived within request_timeout_s. */
struct track {
	int fd;
	int64_t since_ms;   /* connection start, or the previous request's end */
	bool received;      /* the request's headers and body are in: no deadline */
	bool shut;          /* shut down by us; MHD closes it next */
	struct sockaddr_storage addr;
	struct track *prev, *next;
};

struct api_http {
	struct MHD_Daemon *mhd;
	pthread_mutex_t mu;       /* guards conns, nconns, stopping */
	pthread_cond_t wake;
	struct track *conns;      /* oldest first */
	unsigned nconns;
	bool stopping, sweeping;
	unsigned deferred;        /* api_defer replies not sent yet (under mu; wake) */
	pthread_t sweeper;
	api_config cfg;   /* strings point at the copies below; cfg.token is the token at start */
	char *token, *listen_addr, *state_dir;
	/* What a reload changes (api_http_set_*): the token every request is
	 * checked against and the body limit, under live_mu; per_ip_limit and
	 * request_timeout_s in cfg, under mu like their readers. */
	pthread_rwlock_t live_mu;
	char live_token[257];
	size_t live_max_body;
	bool tls;         /* serving HTTPS: credentials installed (tls.h) */
	char **roots;     /* n_data_roots copies */
	store *st;
	struct follow_hub *follow; /* handed to every request; its owner (server.c) stops it first */
	int port;
};

/* Per-request state, from the first on_request call to on_completed. */
struct conn_ctx {
	api_request req;
	const api_route *route;
	char *body;       /* (cap) bytes, len used, NUL-terminated when handed over */
	size_t len, cap;
	bool too_large;   /* body crossed the limit: drop the rest, answer 413 */
	uint64_t dropped; /* bytes dropped after crossing the limit */
};

/* ---------------------------------------------------------------- helpers */

int api_add_header(api_request *req, const char *name, const char *value)
{
	if (req->n_hdrs >= API_MAX_EXTRA_HEADERS)
		return -E2BIG;
	char *v = strdup(value);
	if (!v)
		return -ENOMEM;
	req->hdr_name[req->n_hdrs] = name;
	req->hdr_value[req->n_hdrs] = v;
	req->n_hdrs++;
	return 0;
}

const char *api_header(api_request *req, const char *name)
{
	return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *api_query(api_request *req, const char *name)
{
	return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

struct query_iter {
	int (*fn)(void *cls, const char *key, const char *value);
	void *cls;
	int rc;
};

static enum MHD_Result query_iter_cb(void *cls, enum MHD_ValueKind kind, const char *key,
				     const char *value)
{
	(void)kind;
	struct query_iter *it = cls;
	it->rc = it->fn(it->cls, key, value);
	return it->rc ? MHD_NO : MHD_YES;
}

int api_query_each(api_request *req, int (*fn)(void *cls, const char *key, const char *value),
		   void *cls)
{
	struct query_iter it = {fn, cls, 0};
	MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, query_iter_cb, &it);
	return it.rc;
}

const char *api_bearer(const char *authorization)
{
	if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
		return NULL;
	const char *given = authorization + 7;
	while (*given == ' ')
		given++;
	return given;
}

bool api_auth_ok(const char *authorization, const char *token)
{
	const char *given = api_bearer(authorization);
	if (!given || !token || !token[0])
		return false;
	size_t gl = strlen(given), tl = strlen(token);
	/* Time depends only on the length of what the client sent, never on
	 * where the first differing byte is or on the token's length. */
	unsigned char diff = gl != tl;
	for (size_t i = 0; i < gl; i++)
		diff |= (unsigned char)given[i] ^ (unsigned char)token[i % tl];
	return diff == 0;
}

bool api_media_is_json(const char *ct)
{
	if (!ct)
		return false;
	while (*ct == ' ' || *ct == '\t')
		ct++;
	static const char want[] = "application/json";
	if (strncasecmp(ct, want, sizeof want - 1) != 0)
		return false;
	char next = ct[sizeof want - 1];
	return next == 0 || next == ';' || next == ' ' || next == '\t';
}

void api_time_format(int64_t ms, char out[32])
{
	time_t s = (time_t)(ms / 1000);
	struct tm tm;
	gmtime_r(&s, &tm);
	size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, 32 - n, ".%03dZ", (int)(ms % 1000));
}

/* Scans for nesting depth without parsing, so a body of 100k '[' costs one
 * pass and never reaches jansson's recursive descent. */
static bool depth_within(const char *buf, size_t len, int max_depth)
{
	int depth = 0;
	bool in_str = false, esc = false;
	for (size_t i = 0; i < len; i++) {
		char ch = buf[i];
		if (in_str) {
			if (esc)
				esc = false;
			else if (ch == '\\')
				esc = true;
			else if (ch == '"')
				in_str = false;
			continue;
		}
		if (ch == '"') {
			in_str = true;
		} else if (ch == '[' || ch == '{') {
			if (++depth > max_depth)
				return false;
		} else if (ch == ']' || ch == '}') {
			depth--;
		}
	}
	return true;
}

int api_json_parse(const char *buf, size_t len, int max_depth, json_t **out, char *detail,
		   size_t detail_len)
{
	if (!depth_within(buf, len, max_depth)) {
		snprintf(detail, detail_len, "JSON nests deeper than %d levels", max_depth);
		return -E2BIG;
	}
	json_error_t err;
	json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &err);
	if (!j) {
		snprintf(detail, detail_len, "line %d, column %d: %s", err.line, err.column, err.text);
		return -EINVAL;
	}
	*out = j;
	return 0;
}

/* Whether every real in o reads back equal from "%.15g", which is how
 * jansson writes it at JSON_REAL_PRECISION(15), so a dump at 15 digits
 * loses nothing. Checked value by value rather than by loading the dump
 * back: the round trip cost as much as the dump itself on a 100-job page. */
static bool reals_keep_15(const json_t *o)
{
	const char *key;
	json_t *v;
	size_t i;
	switch (json_typeof(o)) {
	case JSON_REAL: {
		char buf[40];
		double d = json_real_value(o);
		snprintf(buf, sizeof buf, "%.15g", d);
		return strtod(buf, NULL) == d;
	}
	case JSON_OBJECT:
		json_object_foreach((json_t *)o, key, v)
			if (!reals_keep_15(v))
				return false;
		return true;
	case JSON_ARRAY:
		json_array_foreach(o, i, v)
			if (!reals_keep_15(v))
				return false;
		return true;
	default:
		return true;
	}
}

char *api_json_dumps(const json_t *o, bool newline)
{
	int digits = reals_keep_15(o) ? 15 : 17;
	char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(digits));
	if (!text)
		return NULL;
	if (newline) {
		size_t n = strlen(text);
		char *t = realloc(text, n + 2);
		if (!t) {
			free(text);
			return NULL;
		}
		t[n] = '\n';
		t[n + 1] = 0;
		text = t;
	}
	return text;
}

/* ---------------------------------------------------------------- replies */

/* Adds the content type, Cache-Control and the request's extra headers to r,
 * queues it, and destroys our reference (MHD keeps its own while queued). */
static enum MHD_Result queue_reply(api_request *req, unsigned status, struct MHD_Response *r,
				   const char *content_type, const char *cache_control)
{
	enum MHD_Result ok = MHD_YES;
	if (content_type)
		ok &= MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
	ok &= MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, cache_control);
	for (size_t i = 0; i < req->n_hdrs; i++)
		ok &= MHD_add_response_header(r, req->hdr_name[i], req->hdr_value[i]);
	if (ok == MHD_YES)
		ok = MHD_queue_response(req->conn, status, r);
	if (ok == MHD_YES)
		telemetry_http_reply(status);
	MHD_destroy_response(r);
	req->replied = true;
	return ok;
}

static enum MHD_Result reply(api_request *req, unsigned status, const char *content_type,
			     const char *body, size_t len)
{
	struct MHD_Response *r =
		MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	return queue_reply(req, status, r, content_type, "no-store");
}

enum MHD_Result api_reply_stream(api_request *req, unsigned status, const api_stream *s)
{
	struct MHD_Response *r = MHD_create_response_from_callback(s->size, s->block, s->read,
								    s->cls, s->free);
	if (!r) {
		if (s->free)
			s->free(s->cls);
		req->replied = true;
		return MHD_NO;
	}
	/* from here the response owns cls: MHD_destroy_response frees it */
	return queue_reply(req, status, r, s->content_type, s->cache_control ? s->cache_control : "no-store");
}

struct api_prepared {
	atomic_int refs;
	struct MHD_Response *r; /* our reference to it; MHD keeps its own while it sends */
	const char *content_type;
	char *body;             /* (len) bytes, owned by r once r exists */
	size_t len;
};

static void prepared_body_free(void *body)
{
	free(body);
}

api_prepared *api_prepared_create(const char *content_type, char *body, size_t len)
{
	api_prepared *p = calloc(1, sizeof *p);
	struct MHD_Response *r = p ? MHD_create_response_from_buffer_with_free_callback_cls(
					     len, body, prepared_body_free, body)
				   : NULL;
	if (!r) {
		free(p);
		free(body);
		return NULL;
	}
	/* Headers are set once here: a response being sent is never changed. */
	if ((content_type && MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type) != MHD_YES) ||
	    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store") != MHD_YES) {
		MHD_destroy_response(r); /* frees body */
		free(p);
		return NULL;
	}
	atomic_init(&p->refs, 1);
	p->r = r;
	p->content_type = content_type;
	p->body = body;
	p->len = len;
	return p;
}

api_prepared *api_prepared_ref(api_prepared *p)
{
	atomic_fetch_add(&p->refs, 1);
	return p;
}

void api_prepared_put(api_prepared *p)
{
	if (p && atomic_fetch_sub(&p->refs, 1) == 1) {
		MHD_destroy_response(p->r); /* the body goes with MHD's last reference */
		free(p);
	}
}

const char *api_prepared_body(const api_prepared *p, size_t *len)
{
	*len = p->len;
	return p->body;
}

enum MHD_Result api_reply_prepared(api_request *req, unsigned status, api_prepared *p)
{
	if (req->n_hdrs) /* headers of this request alone: not on the shared response */
		return reply(req, status, p->content_type, p->body, p->len);
	/* MHD_queue_response takes its own reference; the response may be
	 * queued on many connections of many threads at once. */
	enum MHD_Result ok = MHD_queue_response(req->conn, status, p->r);
	if (ok == MHD_YES)
		telemetry_http_reply(status);
	req->replied = true;
	return ok;
}

void api_conn_suspend(struct MHD_Connection *conn)
{
	MHD_suspend_connection(conn);
}

void api_conn_resume(struct MHD_Connection *conn)
{
	MHD_resume_connection(conn);
}

void api_defer(api_request *req, enum MHD_Result (*fn)(api_request *req, void *arg), void *arg,
	       void (*free_arg)(void *arg))
{
	req->resume = fn;
	req->resume_arg = arg;
	req->resume_free = free_arg;
	MHD_suspend_connection(req->conn);
}

/* Counts api_defer replies (+1 made, -1 sent or dropped); stop waits for 0. */
static void deferred_add(api_http *srv, int d)
{
	pthread_mutex_lock(&srv->mu);
	srv->deferred = (unsigned)((int)srv->deferred + d);
	if (!srv->deferred)
		pthread_cond_broadcast(&srv->wake);
	pthread_mutex_unlock(&srv->mu);
}

/* Runs (or, req NULL-replied, drops) a deferred reply; returns its result. */
static enum MHD_Result deferred_end(api_http *srv, struct conn_ctx *c, bool run)
{
	enum MHD_Result (*fn)(api_request *, void *) = c->req.resume;
	void *arg = c->req.resume_arg;
	c->req.resume = NULL;
	c->req.resume_arg = NULL;
	enum MHD_Result ret = run ? fn(&c->req, arg) : MHD_NO;
	if (c->req.resume_free)
		c->req.resume_free(arg);
	deferred_add(srv, -1);
	return ret;
}

int api_conn_fd(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *i =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	return i ? i->connect_fd : -1;
}

enum MHD_Result api_reply_raw(api_request *req, unsigned status, const char *content_type,
			      const char *body, size_t len)
{
	return reply(req, status, content_type, body, len);
}

enum MHD_Result api_reply_empty(api_request *req, unsigned status)
{
	return reply(req, status, NULL, "", 0);
}

static enum MHD_Result reply_dumped(api_request *req, unsigned status, const char *content_type,
				    json_t *body)
{
	char *text = body ? api_json_dumps(body, true) : NULL;
	json_decref(body);
	if (!text) {
		static const char oom[] = "{\"type\":\"urn:bertd:problem:internal\",\"title\":"
					  "\"Internal error\",\"status\":500}\n";
		return reply(req, 500, "application/problem+json", oom, sizeof oom - 1);
	}
	enum MHD_Result rc = reply(req, status, content_type, text, strlen(text));
	free(text);
	return rc;
}

enum MHD_Result api_reply_json(api_request *req, unsigned status, json_t *body)
{
	return reply_dumped(req, status, "application/json", body);
}

enum MHD_Result api_reply_problem(api_request *req, enum api_problem p, const char *field,
				  const char *fmt, ...)
{
	char detail[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	int status = api_problem_status(p);
	int retry = api_problem_retry_after(p);
	char retry_s[16];
	snprintf(retry_s, sizeof retry_s, "%d", retry);
	if (retry > 0 && api_add_header(req, MHD_HTTP_HEADER_RETRY_AFTER, retry_s) < 0)
		log_warn("%s %s: no room for Retry-After", req->method, req->path);
	if (status >= 500)
		log_error("%s %s: %d %s: %s", req->method, req->path, status, api_problem_code(p),
			  detail);
	else
		log_debug("%s %s: %d %s: %s", req->method, req->path, status, api_problem_code(p),
			  detail);
	return reply_dumped(req, (unsigned)status, "application/problem+json",
			    api_problem_json(p, detail, field, req->path));
}

enum MHD_Result api_reply_forbidden(api_request *req, const char *action, const char *fmt, ...)
{
	char detail[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	const char *role = tokens_role_name(req->who.role);
	log_info("%s %s: 403 for token %s (role %s): %s", req->method, req->path, req->who.name,
		 role, detail);
	json_t *p = api_problem_json(API_P_FORBIDDEN, detail, NULL, req->path);
	if (p && (json_object_set_new(p, "role", json_string(role)) ||
		  json_object_set_new(p, "action", json_string(action)))) {
		json_decref(p);
		p = NULL;
	}
	return reply_dumped(req, MHD_HTTP_FORBIDDEN, "application/problem+json", p);
}

bool api_may_act_on(api_request *req, const char *owner, const char *what, enum MHD_Result *ret)
{
	if (req->who.role >= TOKENS_ROLE_ADMIN || (owner && strcmp(owner, req->who.name) == 0))
		return true;
	const char *action = req->route && req->route->action ? req->route->action : "act";
	if (owner)
		*ret = api_reply_forbidden(req, action,
					   "role %s may %s only where its token submitted them; %s "
					   "was submitted by %s", tokens_role_name(req->who.role), action,
					   what, owner);
	else
		*ret = api_reply_forbidden(req, action,
					   "role %s may %s only where its token submitted them; %s has "
					   "no recorded owner (an admin may)", tokens_role_name(req->who.role),
					   action, what);
	return false;
}

enum MHD_Result api_reply_store_error(api_request *req, int rc, const char *fmt, ...)
{
	char what[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	return api_reply_problem(req, api_problem_of_store(rc), NULL, "%s: %s", what,
				 api_problem_store_text(rc));
}

/* ------------------------------------------------------------ MHD glue */

static uint64_t content_length(api_request *req, bool *present)
{
	const char *cl = api_header(req, MHD_HTTP_HEADER_CONTENT_LENGTH);
	*present = cl != NULL;
	return cl ? strtoull(cl, NULL, 10) : 0;
}

/* The framing headers of a request, counted over every header line (MHD's
 * lookup only ever returns the first). */
struct framing {
	unsigned n_host, n_len, n_te;
	const char *len, *te; /* first values */
	bool len_differs;     /* a later Content-Length differs from the first */
};

static enum MHD_Result framing_cb(void *cls, enum MHD_ValueKind kind, const char *key,
				  const char *value)
{
	(void)kind;
	struct framing *f = cls;
	if (!value)
		value = "";
	if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
		f->n_host++;
	} else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
		if (f->n_len++ == 0)
			f->len = value;
		else if (strcmp(f->len, value) != 0)
			f->len_differs = true;
	} else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
		if (f->n_te++ == 0)
			f->te = value;
	}
	return MHD_YES;
}

/* A framing error means the body's extent is unknown: the reply closes the
 * connection so no byte after it can be read as another request. */
static enum MHD_Result framing_problem(api_request *req, enum api_problem p, const char *field,
				       const char *detail)
{
	if (api_add_header(req, MHD_HTTP_HEADER_CONNECTION, "close"))
		return MHD_NO;
	return api_reply_problem(req, p, field, "%s", detail);
}

/* RFC 9112: a request whose length can be read two ways is how one request
 * is smuggled inside another, so it is refused, not guessed at (MHD 0.9.75
 * takes the first Content-Length and, on a transfer coding it does not
 * know, waits for a body it cannot delimit until the connection times out).
 * HTTP/1.1 needs exactly one Host (MHD checks that only in its strict mode,
 * answering in HTML). Returns MHD_YES with nothing sent when all is well. */
static enum MHD_Result check_framing(api_request *req, const char *version)
{
	struct framing f = {0};
	MHD_get_connection_values(req->conn, MHD_HEADER_KIND, framing_cb, &f);
	bool http10 = version && strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
	if (f.n_host > 1)
		return framing_problem(req, API_P_BAD_REQUEST, "Host",
				       "more than one Host header");
	if (f.n_host == 0 && !http10)
		return framing_problem(req, API_P_BAD_REQUEST, "Host",
				       "an HTTP/1.1 request needs a Host header");
	if (f.n_len && f.n_te)
		return framing_problem(req, API_P_BAD_REQUEST, "Content-Length",
				       "both Content-Length and Transfer-Encoding: send one");
	if (f.len_differs)
		return framing_problem(req, API_P_BAD_REQUEST, "Content-Length",
				       "Content-Length headers with different values");
	if (f.n_te) {
		const char *te = f.te;
		while (*te == ' ' || *te == '\t')
			te++;
		size_t n = strlen(te);
		while (n && (te[n - 1] == ' ' || te[n - 1] == '\t'))
			n--;
		if (f.n_te > 1 || n != 7 || strncasecmp(te, "chunked", 7) != 0) {
			char detail[160];
			snprintf(detail, sizeof detail,
				 "Transfer-Encoding %.*s is not implemented; send chunked or a "
				 "Content-Length", (int)(n < 64 ? n : 64), te);
			return framing_problem(req, API_P_TRANSFER_CODING, "Transfer-Encoding",
					       detail);
		}
	}
	return MHD_YES;
}

/* The body limit in force (a reload may change it). */
static size_t live_max_body(api_http *srv)
{
	pthread_rwlock_rdlock(&srv->live_mu);
	size_t max = srv->live_max_body;
	pthread_rwlock_unlock(&srv->live_mu);
	return max;
}

/* The token check: true when the request may go on, with req->who set to
 * the token's name and role; otherwise 401 is queued (or queueing failed)
 * and *ret says which. A revoked token is unknown at once: tokens_check
 * re-reads the token files whenever they changed. Without named tokens
 * (cfg.tokens NULL) the single token in force is the admin "default". */
static bool authorized(api_request *req, enum MHD_Result *ret)
{
	const char *auth = api_header(req, MHD_HTTP_HEADER_AUTHORIZATION);
	const char *secret = api_bearer(auth);
	if (req->cfg->tokens) {
		if (secret && tokens_check(req->cfg->tokens, secret, &req->who) == 0)
			return true;
	} else {
		api_http *srv = req->srv;
		pthread_rwlock_rdlock(&srv->live_mu);
		bool ok = api_auth_ok(auth, srv->live_token);
		pthread_rwlock_unlock(&srv->live_mu);
		if (ok) {
			req->who = (tokens_entry){.name = TOKENS_DEFAULT_NAME, .role = TOKENS_ROLE_ADMIN};
			return true;
		}
	}
	bool missing = auth == NULL;
	if (api_add_header(req, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
			   missing ? "Bearer realm=\"bertd\""
				   : "Bearer realm=\"bertd\", error=\"invalid_token\"")) {
		*ret = MHD_NO;
		return false;
	}
	*ret = api_reply_problem(req, API_P_UNAUTHORIZED, NULL, "%s",
				 missing ? "send Authorization: Bearer <token> "
					   "(the token is in the state directory)"
					 : "the bearer token is not valid (unknown or revoked)");
	return false;
}

/* First call: headers only. Refuses what can be refused before any body
 * byte is read; otherwise waits for the body. */
static enum MHD_Result begin(struct conn_ctx *c, const char *version)
{
	api_request *req = &c->req;
	size_t n;
	const api_route *table = api_route_table(&n);
	char allow[128];
	enum MHD_Result ret = check_framing(req, version);
	if (ret != MHD_YES || req->replied)
		return ret;

	enum api_match m = api_route_find(table, n, req->method, req->path, &c->route, &req->args,
					  allow, sizeof allow);
	/* Only a public path answers 404/405 before the token: elsewhere they
	 * would tell a caller without a token which routes exist. */
	bool is_public = m == API_MATCH_OK ? (c->route->flags & API_ROUTE_PUBLIC) != 0
					   : api_route_path_public(table, n, req->path);
	if (!is_public && !authorized(req, &ret))
		return ret;
	switch (m) {
	case API_MATCH_OK:
		req->route = c->route;
		if (!is_public && req->who.role < c->route->role)
			return api_reply_forbidden(req, c->route->action,
						   "role %s may not %s (%s %s needs role %s or above)",
						   tokens_role_name(req->who.role), c->route->action,
						   req->method, c->route->path,
						   tokens_role_name(c->route->role));
		break;
	case API_MATCH_NO_PATH:
		return api_reply_problem(req, API_P_NOT_FOUND, NULL, "no route for %s", req->path);
	case API_MATCH_NO_METHOD:
		if (api_add_header(req, MHD_HTTP_HEADER_ALLOW, allow))
			return MHD_NO;
		return api_reply_problem(req, API_P_METHOD_NOT_ALLOWED, NULL,
					 "%s is not allowed on %s; allowed: %s", req->method,
					 req->path, allow);
	}

	bool has_len;
	uint64_t len = content_length(req, &has_len);
	bool chunked = api_header(req, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL; /* checked above */
	if ((has_len && len > 0) || chunked) {
		const char *ct = api_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
		if (!api_media_is_json(ct))
			return api_reply_problem(req, API_P_UNSUPPORTED_MEDIA, NULL,
						 "Content-Type is %s; send application/json",
						 ct ? ct : "missing");
	}
	size_t max_body = live_max_body(req->srv);
	if (has_len && len > max_body)
		return api_reply_problem(req, API_P_BODY_TOO_LARGE, NULL,
					 "body of %llu bytes is over the limit of %zu bytes",
					 (unsigned long long)len, max_body);
	return MHD_YES;
}

/* A body piece: keep it, or once over the limit, count and drop it. */
static enum MHD_Result take_piece(struct conn_ctx *c, const char *data, size_t n)
{
	size_t max = live_max_body(c->req.srv);
	if (!c->too_large && n > max - c->len) {
		c->too_large = true;
		c->dropped = c->len;
		free(c->body);
		c->body = NULL;
		c->len = c->cap = 0;
	}
	if (c->too_large) {
		c->dropped += n;
		/* Draining keeps the connection in step so the client gets its
		 * 413; past this much it is not a mistake but a flood. */
		if (c->dropped > 4 * (uint64_t)max + (1u << 20)) {
			log_warn("%s %s: body still arriving past %llu bytes, closing",
				 c->req.method, c->req.path, (unsigned long long)c->dropped);
			return MHD_NO;
		}
		return MHD_YES;
	}
	if (c->len + n + 1 > c->cap) {
		size_t cap = c->cap ? c->cap : 4096;
		while (cap < c->len + n + 1)
			cap *= 2;
		if (cap > max + 1)
			cap = max + 1;
		char *b = realloc(c->body, cap);
		if (!b)
			return MHD_NO;
		c->body = b;
		c->cap = cap;
	}
	memcpy(c->body + c->len, data, n);
	c->len += n;
	c->body[c->len] = 0;
	return MHD_YES;
}

static void track_request(api_http *srv, struct MHD_Connection *conn, bool received);

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	api_http *srv = cls;
	struct conn_ctx *c = *con_cls;
	if (!c) {
		c = calloc(1, sizeof *c);
		if (!c)
			return MHD_NO;
		*con_cls = c;
		c->req.conn = conn;
		c->req.method = method;
		c->req.path = url;
		c->req.body = "";
		c->req.st = srv->st;
		c->req.cfg = &srv->cfg;
		c->req.srv = srv;
		c->req.follow = srv->follow;
		enum MHD_Result ret = begin(c, version);
		if (c->req.replied)
			track_request(srv, conn, true);
		return ret;
	}
	if (c->req.resume) /* resumed after api_defer */
		return deferred_end(srv, c, true);
	if (c->req.replied) {
		*upload_size = 0;
		return MHD_YES;
	}
	if (*upload_size) {
		size_t n = *upload_size;
		*upload_size = 0;
		return take_piece(c, upload, n);
	}
	track_request(srv, conn, true); /* headers and body are in */
	if (c->too_large)
		return api_reply_problem(&c->req, API_P_BODY_TOO_LARGE, NULL,
					 "body is over the limit of %zu bytes",
					 live_max_body(c->req.srv));
	if (c->body) {
		c->req.body = c->body;
		c->req.body_len = c->len;
	}
	pthread_mutex_lock(&srv->mu);
	bool stopping = srv->stopping;
	pthread_mutex_unlock(&srv->mu);
	if (stopping) /* no new deferred reply once api_http_stop waits for them */
		return api_reply_problem(&c->req, API_P_UNAVAILABLE, NULL, "bertd is stopping");
	enum MHD_Result ret = c->route->handler(&c->req);
	if (c->req.resume)
		deferred_add(srv, 1);
	return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)toe;
	track_request(cls, conn, false); /* the next request's deadline starts */
	struct conn_ctx *c = *con_cls;
	if (!c)
		return;
	if (c->req.resume) /* the client left before its deferred reply */
		deferred_end(cls, c, false);
	for (size_t i = 0; i < c->req.n_hdrs; i++)
		free(c->req.hdr_value[i]);
	free(c->body);
	free(c);
	*con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = 0;
	log_warn("http: %s", msg);
}

/* ------------------------------------------------------------ lifecycle */

static bool is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
	}
	const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
	if (IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr))
		return true;
	return IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr) && a6->sin6_addr.s6_addr[12] == 127;
}

/* --------------------------------------------------- connection limits */

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr *b)
{
	if (a->ss_family != b->sa_family)
		return false;
	if (b->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (b->sa_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
	return false;
}

/* Shuts down the oldest connection whose request has not arrived; under mu. */
static bool evict_oldest_pending(api_http *srv)
{
	for (struct track *t = srv->conns; t; t = t->next)
		if (!t->received && !t->shut) {
			t->shut = true;
			shutdown(t->fd, SHUT_RDWR);
			return true;
		}
	return false;
}

/* Accept policy: per_ip_limit for remote addresses (loopback clients all
 * share 127.0.0.1, so for them only conn_limit counts); at conn_limit the
 * oldest connection still sending its request makes room, so clients that
 * send a request at once are served however many slow ones are open. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
	api_http *srv = cls;
	if (!addr || len < sizeof(sa_family_t))
		return MHD_NO;
	struct sockaddr_storage ss = {0};
	memcpy(&ss, addr, len < sizeof ss ? len : sizeof ss);
	bool local = is_loopback(&ss);
	enum MHD_Result ok = MHD_YES;
	pthread_mutex_lock(&srv->mu);
	if (!local) {
		unsigned same = 0;
		for (struct track *t = srv->conns; t; t = t->next)
			same += !t->shut && same_addr(&t->addr, addr);
		if (same >= srv->cfg.per_ip_limit)
			ok = MHD_NO;
	}
	unsigned open = 0;
	for (struct track *t = srv->conns; t; t = t->next)
		open += !t->shut;
	if (ok == MHD_YES && open >= srv->cfg.conn_limit && !evict_oldest_pending(srv))
		ok = MHD_NO;
	pthread_mutex_unlock(&srv->mu);
	return ok;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
			  enum MHD_ConnectionNotificationCode code)
{
	api_http *srv = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		const union MHD_ConnectionInfo *ad = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		struct track *t = calloc(1, sizeof *t);
		if (!t || !fd) {
			free(t);
			return; /* untracked: only MHD's own limits apply to it */
		}
		t->fd = fd->connect_fd;
		t->since_ms = mono_ms();
		if (ad && ad->client_addr) {
			socklen_t l = ad->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
									  : sizeof(struct sockaddr_in);
			memcpy(&t->addr, ad->client_addr, l);
		}
		pthread_mutex_lock(&srv->mu);
		t->prev = NULL;
		struct track **tail = &srv->conns;
		while (*tail) {
			t->prev = *tail;
			tail = &(*tail)->next;
		}
		*tail = t;
		srv->nconns++;
		pthread_mutex_unlock(&srv->mu);
		*socket_ctx = t;
		return;
	}
	struct track *t = *socket_ctx;
	if (!t)
		return;
	/* MHD closes the socket after this call: t->fd stays valid while listed */
	pthread_mutex_lock(&srv->mu);
	if (t->prev)
		t->prev->next = t->next;
	else
		srv->conns = t->next;
	if (t->next)
		t->next->prev = t->prev;
	srv->nconns--;
	pthread_mutex_unlock(&srv->mu);
	free(t);
	*socket_ctx = NULL;
}

/* received: the request is in (its deadline stops); else the previous
 * request ended and the next one's deadline starts now. */
static void track_request(api_http *srv, struct MHD_Connection *conn, bool received)
{
	const union MHD_ConnectionInfo *i = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct track *t = i ? i->socket_context : NULL;
	if (!t)
		return;
	pthread_mutex_lock(&srv->mu);
	t->received = received;
	if (!received)
		t->since_ms = mono_ms();
	pthread_mutex_unlock(&srv->mu);
}

static void *sweep_main(void *arg)
{
	api_http *srv = arg;
	pthread_mutex_lock(&srv->mu);
	while (!srv->stopping) {
		int64_t limit_ms = (int64_t)srv->cfg.request_timeout_s * 1000; /* under mu: reloadable */
		int64_t now = mono_ms();
		for (struct track *t = srv->conns; t; t = t->next)
			if (!t->received && !t->shut && now - t->since_ms >= limit_ms) {
				t->shut = true;
				shutdown(t->fd, SHUT_RDWR);
			}
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 250 * 1000000L; /* a quarter of a second's lateness at most */
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&srv->wake, &srv->mu, &until);
	}
	pthread_mutex_unlock(&srv->mu);
	return NULL;
}

/* Binds the listening socket ourselves so a failure reports its real errno
 * and port 0 can be read back with getsockname. */
static int listen_on(const char *addr, int port, bool allow_remote, int *fd_out, int *port_out)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	memset(&ss, 0, sizeof ss);
	struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
	if (port < 0 || port > 65535)
		return -EINVAL;
	if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons((uint16_t)port);
		sl = sizeof *a4;
	} else if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons((uint16_t)port);
		sl = sizeof *a6;
	} else {
		log_error("listen address '%s' is not a numeric IPv4 or IPv6 address", addr);
		return -EINVAL;
	}
	if (!is_loopback(&ss) && !allow_remote) {
		log_error("refusing to listen on non-loopback address %s without allow_remote "
			  "(the API would be reachable from the network)", addr);
		return -EPERM;
	}
	int rc, one = 1;
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (ss.ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 128) < 0) {
		rc = -errno;
		log_error("cannot listen on %s port %d: %s", addr, port, strerror(-rc));
		goto out;
	}
	sl = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		rc = -errno;
		goto out;
	}
	*port_out = ntohs(ss.ss_family == AF_INET ? a4->sin_port : a6->sin6_port);
	*fd_out = fd;
	return 0;
out:
	close(fd);
	return rc;
}

/* Ends the sweeper thread (if it runs) and no new deferred reply starts. */
static void sweeper_stop(api_http *srv)
{
	pthread_mutex_lock(&srv->mu);
	srv->stopping = true;
	pthread_cond_signal(&srv->wake);
	pthread_mutex_unlock(&srv->mu);
	if (srv->sweeping)
		pthread_join(srv->sweeper, NULL);
	srv->sweeping = false;
}

static void server_free(api_http *srv)
{
	if (!srv)
		return;
	sweeper_stop(srv);
	free(srv->token);
	free(srv->listen_addr);
	free(srv->state_dir);
	for (size_t i = 0; srv->roots && i < srv->cfg.n_data_roots; i++)
		free(srv->roots[i]);
	free(srv->roots);
	pthread_mutex_destroy(&srv->mu);
	pthread_cond_destroy(&srv->wake);
	pthread_rwlock_destroy(&srv->live_mu);
	if (srv->tls)
		api_tls_uninstall(); /* MHD is stopped (or never ran): no handshake left */
	free(srv);
}

int api_http_start(api_http **out, const api_config *cfg, store *st, struct follow_hub *follow)
{
	int rc, fd = -1;
	api_http *srv = calloc(1, sizeof *srv);
	if (!srv)
		return -ENOMEM;
	pthread_mutex_init(&srv->mu, NULL);
	pthread_cond_init(&srv->wake, NULL);
	pthread_rwlock_init(&srv->live_mu, NULL);
	srv->cfg = *cfg;
	srv->st = st;
	srv->follow = follow;
	srv->token = strdup(cfg->token ? cfg->token : "");
	srv->listen_addr = strdup(cfg->listen_addr ? cfg->listen_addr : "127.0.0.1");
	srv->state_dir = cfg->state_dir ? strdup(cfg->state_dir) : NULL;
	if (!srv->token || !srv->listen_addr || (cfg->state_dir && !srv->state_dir)) {
		rc = -ENOMEM;
		goto out;
	}
	srv->cfg.n_data_roots = 0; /* counts copies made, for server_free */
	if (cfg->n_data_roots) {
		if (!(srv->roots = calloc(cfg->n_data_roots, sizeof *srv->roots))) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < cfg->n_data_roots; i++, srv->cfg.n_data_roots++) {
			if (!(srv->roots[i] = strdup(cfg->data_roots[i]))) {
				rc = -ENOMEM;
				goto out;
			}
		}
	}
	srv->cfg.data_roots = (const char *const *)srv->roots;
	srv->cfg.token = srv->token;
	srv->cfg.listen_addr = srv->listen_addr;
	srv->cfg.state_dir = srv->state_dir;
	if ((!srv->cfg.tokens && !srv->token[0]) || strlen(srv->token) >= sizeof srv->live_token) {
		log_error("api: refusing to start without a bearer token of 1 to %zu characters or named tokens",
			  sizeof srv->live_token - 1);
		rc = -EINVAL;
		goto out;
	}
	snprintf(srv->live_token, sizeof srv->live_token, "%s", srv->token);
	if (!srv->cfg.max_body_bytes)
		srv->cfg.max_body_bytes = DEFAULT_MAX_BODY;
	srv->live_max_body = srv->cfg.max_body_bytes;
	if (cfg->tls_cert && cfg->tls_cert[0]) {
		api_tls_creds *creds;
		char why[1200];
		if ((rc = api_tls_creds_load(&creds, cfg->tls_cert, cfg->tls_key, why, sizeof why)) < 0) {
			log_error("api: %s", why);
			goto out;
		}
		api_tls_install(creds);
		srv->tls = true;
	}
	if (!srv->cfg.threads)
		srv->cfg.threads = DEFAULT_THREADS;
	if (!srv->cfg.conn_timeout_s)
		srv->cfg.conn_timeout_s = DEFAULT_TIMEOUT_S;
	if (!srv->cfg.conn_limit)
		srv->cfg.conn_limit = DEFAULT_CONN_LIMIT;
	if (!srv->cfg.per_ip_limit)
		srv->cfg.per_ip_limit = DEFAULT_PER_IP;
	if (!srv->cfg.conn_memory)
		srv->cfg.conn_memory = DEFAULT_CONN_MEMORY;
	if (!srv->cfg.request_timeout_s)
		srv->cfg.request_timeout_s = DEFAULT_REQUEST_TIMEOUT_S;

	if (srv->cfg.conn_limit < srv->cfg.threads) {
		/* MHD splits the connection limit across its pool threads; a thread
		 * with a share of zero could never serve anyone. */
		log_warn("api: %u threads but only %u connections allowed; using %u threads",
			 srv->cfg.threads, srv->cfg.conn_limit, srv->cfg.conn_limit);
		srv->cfg.threads = srv->cfg.conn_limit;
	}
	rc = listen_on(srv->listen_addr, cfg->port, cfg->allow_remote, &fd, &srv->port);
	if (rc)
		goto out;
	/* The sweeper first: once MHD runs, nothing may fail (a connection
	 * could already be suspended, and MHD cannot be stopped then). */
	if (pthread_create(&srv->sweeper, NULL, sweep_main, srv) != 0) {
		close(fd);
		rc = -ENOMEM;
		goto out;
	}
	srv->sweeping = true;
	/* Suspend/resume: a follow stream with nothing to send gives its pool
	 * thread back instead of spinning (follow.c). */
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
			 MHD_ALLOW_SUSPEND_RESUME;
	/* The certificate comes from tls.c at every handshake (not MEM_CERT,
	 * which MHD reads once): a reload replaces it with api_http_set_tls. */
	if (srv->tls)
		flags |= MHD_USE_TLS;
	if (strchr(srv->listen_addr, ':'))
		flags |= MHD_USE_IPv6;
	/* conn_limit and per_ip_limit are on_accept's; MHD's own limit is
	 * twice conn_limit, as MHD splits it across the pool threads and an
	 * evicted connection holds its slot until MHD has closed it. */
	unsigned mhd_limit = srv->cfg.conn_limit * 2;
	srv->mhd = MHD_start_daemon(
		flags, 0, on_accept, srv, on_request, srv,
		/* First, so MHD reports even option errors through our log. */
		MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
		MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
		MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)srv->cfg.threads,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)srv->cfg.conn_timeout_s,
		MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)srv->cfg.conn_memory,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
		MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
		srv->tls ? MHD_OPTION_HTTPS_CERT_CALLBACK : MHD_OPTION_END, api_tls_retrieve,
		MHD_OPTION_END);
	if (!srv->mhd) {
		/* MHD may already have closed fd on some failure paths; leaking
		 * it on this fatal path is safer than a double close. */
		log_error("api: libmicrohttpd failed to start");
		rc = -ENOMEM;
		goto out;
	}
	log_info("api listening on %s port %d (%s, %u threads, max body %zu bytes)",
		 srv->listen_addr, srv->port, srv->tls ? "HTTPS" : "plain HTTP", srv->cfg.threads,
		 srv->cfg.max_body_bytes);
	*out = srv;
	return 0;
out:
	server_free(srv);
	return rc;
}

int api_http_port(const api_http *srv)
{
	return srv->port;
}

bool api_http_tls(const api_http *srv)
{
	return srv->tls;
}

int api_http_set_token(api_http *srv, const char *token)
{
	if (!token || !token[0] || strlen(token) >= sizeof srv->live_token)
		return -EINVAL;
	pthread_rwlock_wrlock(&srv->live_mu);
	snprintf(srv->live_token, sizeof srv->live_token, "%s", token);
	pthread_rwlock_unlock(&srv->live_mu);
	return 0;
}

void api_http_set_limits(api_http *srv, size_t max_body_bytes, unsigned per_ip_limit,
			 unsigned request_timeout_s)
{
	pthread_rwlock_wrlock(&srv->live_mu);
	srv->live_max_body = max_body_bytes ? max_body_bytes : DEFAULT_MAX_BODY;
	pthread_rwlock_unlock(&srv->live_mu);
	pthread_mutex_lock(&srv->mu);
	srv->cfg.per_ip_limit = per_ip_limit ? per_ip_limit : DEFAULT_PER_IP;
	srv->cfg.request_timeout_s = request_timeout_s ? request_timeout_s : DEFAULT_REQUEST_TIMEOUT_S;
	pthread_cond_broadcast(&srv->wake); /* the sweeper picks the new deadline up */
	pthread_mutex_unlock(&srv->mu);
}

int api_http_set_tls(api_http *srv, api_tls_creds *creds)
{
	if (!srv->tls)
		return -EINVAL;
	api_tls_install(creds);
	return 0;
}

void api_http_stop(api_http *srv)
{
	if (!srv)
		return;
	sweeper_stop(srv);
	/* MHD 0.9.75 panics when stopped with a suspended connection: the
	 * follow streams' owner has ended and resumed them before this call
	 * (api/server.c); let every deferred reply (a submission's commit) be
	 * sent */
	pthread_mutex_lock(&srv->mu);
	while (srv->deferred)
		pthread_cond_wait(&srv->wake, &srv->mu);
	pthread_mutex_unlock(&srv->mu);
	if (srv->mhd)
		MHD_stop_daemon(srv->mhd); /* joins the pool; closes the listening socket */
	server_free(srv);
}

typedef struct allowed {
	const char *const *names;
	char bad[64];
} allowed;

static int check_known(void *cls, const char *key, const char *value)
{
	(void)value;
	allowed *a = cls;
	for (const char *const *n = a->names; *n; n++)
		if (strcmp(*n, key) == 0)
			return 0;
	snprintf(a->bad, sizeof a->bad, "%s", key);
	return 1;
}

bool api_query_known(api_request *req, const char *const *names, enum MHD_Result *ret)
{
	allowed a = {.names = names};
	if (api_query_each(req, check_known, &a) == 0)
		return true;
	*ret = api_reply_problem(req, API_P_INVALID_PARAMETER, a.bad, "unknown query parameter");
	return false;
}

