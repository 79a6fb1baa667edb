/* http — what a handler sees of a request, and the only ways to answer it.
 *
 * http.c owns the MHD glue: it matches the route, checks auth, media type
 * and body size, accumulates the body, and then calls the handler with an
 * api_request. Handlers answer through api_reply_* (one call per request;
 * a body made while it is sent goes through api_reply_stream) and never
 * call MHD directly. Internal to api/: api/server.c starts and stops the
 * server (api_http_*) for api.h. Knows no handler and no resource: the
 * follow streams' hub is handed in by its owner and only passed on.
 */
#ifndef BERTD_API_HTTP_H
#define BERTD_API_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <microhttpd.h>

#include "api/api.h"
#include "api/problem.h"
#include "api/routes.h"

/* Deeper request bodies are refused with 400 before jansson sees them. */
#define API_JSON_MAX_DEPTH 32
#define API_MAX_EXTRA_HEADERS 4

struct follow_hub; /* follow.h: opaque here */

struct api_request {
	struct MHD_Connection *conn;
	const char *method;
	const char *path;          /* without the query string */
	const char *body;          /* NUL-terminated, body_len bytes; "" if none */
	size_t body_len;
	api_path_args args;        /* the route's {placeholders}, in order */
	tokens_entry who;          /* whose token it carried (name, role) once auth passed;
				    * name "" on a public route */
	const api_route *route;    /* the matched route (its role and action) */
	store *st;
	const api_config *cfg;     /* as at start: reloadable limits are read through http.c */
	struct api_http *srv;      /* the server (http.c's own) */
	struct follow_hub *follow; /* the server's follow streams (follow.h) */
	/* Headers every reply of this request carries (Location, Allow, ...). */
	size_t n_hdrs;
	const char *hdr_name[API_MAX_EXTRA_HEADERS];
	char *hdr_value[API_MAX_EXTRA_HEADERS];
	bool replied;
	/* api_defer's reply to come: fn(req, arg), then free_arg(arg) */
	enum MHD_Result (*resume)(struct api_request *req, void *arg);
	void *resume_arg;
	void (*resume_free)(void *arg);
};

/* The HTTP server: MHD, its listening socket and connection limits. */
typedef struct api_http api_http;

/* Binds and starts serving cfg's routes (api_server_start's contract);
 * follow (may be NULL) is handed to every request as req->follow, owned by
 * the caller, who must end its streams (follow_hub_stop) before
 * api_http_stop. *out caller-owned (api_http_stop). 0 or a negative errno. */
int api_http_start(api_http **out, const api_config *cfg, store *st, struct follow_hub *follow);
/* The TCP port actually bound. */
int api_http_port(const api_http *srv);
/* Whether it serves HTTPS (cfg->tls_cert was set at start). */
bool api_http_tls(const api_http *srv);
/* Reload: the bearer token every later request is checked against
 * (copied; 1..256 characters, else -EINVAL). Any thread. */
int api_http_set_token(api_http *srv, const char *token);
/* Reload: body limit, per-address connection limit and request deadline
 * for requests and connections from now on (0 = the default). Any thread. */
void api_http_set_limits(api_http *srv, size_t max_body_bytes, unsigned per_ip_limit,
			 unsigned request_timeout_s);
/* Reload: creds (api_tls_creds_load) for every later handshake; takes
 * ownership. -EINVAL (creds not taken) when the server is plain HTTP:
 * switching needs a restart. */
struct api_tls_creds;
int api_http_set_tls(api_http *srv, struct api_tls_creds *creds);
/* Refuses new requests, waits for deferred replies, stops MHD (joining its
 * threads) and frees srv. No connection may be suspended. NULL is fine. */
void api_http_stop(api_http *srv);

/* Adds a header to the reply (value copied). Returns 0 or -ENOMEM/-E2BIG. */
int api_add_header(api_request *req, const char *name, const char *value);

/* Value of a request header / query argument, or NULL. */
const char *api_header(api_request *req, const char *name);
const char *api_query(api_request *req, const char *name);
/* Calls fn for every query argument; stops at the first non-zero return and
 * returns it. */
int api_query_each(api_request *req, int (*fn)(void *cls, const char *key, const char *value),
		   void *cls);

/* Replies with body serialized compactly plus "\n"; steals body (may be NULL
 * after a failed allocation: then 500). */
enum MHD_Result api_reply_json(api_request *req, unsigned status, json_t *body);
/* Replies with an already serialized JSON text (idempotent replays). */
enum MHD_Result api_reply_raw(api_request *req, unsigned status, const char *content_type,
			      const char *body, size_t len);
/* Replies with no body (204). */
enum MHD_Result api_reply_empty(api_request *req, unsigned status);

/* A body made while it is sent (tar downloads, follow streams). read is
 * called with the byte position so far and a buffer of max bytes; it
 * returns the bytes written, API_STREAM_END (done; with a known size only
 * once all of it was written), API_STREAM_ERROR (the connection is closed:
 * the client sees a short body), or 0 only after api_conn_suspend (0
 * otherwise makes the server's thread spin: in MHD 0.9.75's internal
 * polling a reader answering 0 is called again at once). */
typedef ssize_t (*api_stream_reader)(void *cls, uint64_t pos, char *buf, size_t max);
#define API_STREAM_END MHD_CONTENT_READER_END_OF_STREAM
#define API_STREAM_ERROR MHD_CONTENT_READER_END_WITH_ERROR
#define API_SIZE_UNKNOWN MHD_SIZE_UNKNOWN

typedef struct api_stream {
	const char *content_type;
	const char *cache_control; /* NULL = "no-store" */
	uint64_t size;             /* bytes (sent as Content-Length), or API_SIZE_UNKNOWN:
				    * chunked (HTTP/1.0: ended by closing) */
	size_t block;              /* the most bytes read is asked for at a time */
	api_stream_reader read;
	void (*free)(void *cls);   /* frees cls once the reply is over; may be NULL */
	void *cls;
} api_stream;

/* Replies status with s's body, plus the request's extra headers
 * (api_add_header: Content-Disposition, ETag, ...). The reply owns s->cls
 * from this call on: s->free runs when it is done, or at once when it
 * cannot be queued. */
enum MHD_Result api_reply_stream(api_request *req, unsigned status, const api_stream *s);

/* A reply body made once and sent to many requests (a kept list page, the
 * health answer): the server sends it from this one buffer, never copied,
 * to as many connections at once as ask for it. Reference-counted; any
 * thread. */
typedef struct api_prepared api_prepared;
/* Takes ownership of body (malloc'd, len bytes; freed once the last
 * reference and the last reply that sends it are gone). content_type: a
 * string that outlives p (a literal); Cache-Control is no-store. NULL when
 * out of memory (body is freed then). Caller owns the reference
 * (api_prepared_put). */
api_prepared *api_prepared_create(const char *content_type, char *body, size_t len);
/* Another reference to p (returns p). */
api_prepared *api_prepared_ref(api_prepared *p);
/* Drops a reference; NULL is a no-op. */
void api_prepared_put(api_prepared *p);
/* p's body and its length (borrowed: valid while a reference is held). */
const char *api_prepared_body(const api_prepared *p, size_t *len);
/* Replies status with p's body (p stays the caller's). A request with
 * extra headers (api_add_header) gets a copy that carries them. */
enum MHD_Result api_reply_prepared(api_request *req, unsigned status, api_prepared *p);

/* For a stream's reader with nothing to send yet: takes the connection out
 * of the server's polling (no timeouts, no reads, no thread held) until
 * api_conn_resume; the reader then returns 0, and is called again once
 * resumed. Only from within the reader. The server must not be stopped
 * while a connection is suspended (follow_hub_stop resumes them all). */
void api_conn_suspend(struct MHD_Connection *conn);
/* Puts a suspended connection back; from any thread, once per suspend. */
void api_conn_resume(struct MHD_Connection *conn);

/* A reply that waits for work done elsewhere (a submission's group commit)
 * without holding a server thread meanwhile: the handler calls api_defer
 * (which suspends the connection), then starts the work, and returns
 * MHD_YES without replying; the work's end calls api_conn_resume(req->conn)
 * once, from any thread (it may be before the handler returned). fn(req,
 * arg) then runs on a server thread and replies; free_arg(arg) (may be
 * NULL) runs after it, or when the connection ends without it. The server
 * waits for deferred replies before it stops. */
void api_defer(api_request *req, enum MHD_Result (*fn)(api_request *req, void *arg), void *arg,
	       void (*free_arg)(void *arg));
/* The socket of a request's connection (to watch for a hang-up while it is
 * suspended), or -1. */
int api_conn_fd(struct MHD_Connection *conn);
/* The one error reply: application/problem+json for code p. field may be
 * NULL; fmt is the human detail. */
enum MHD_Result api_reply_problem(api_request *req, enum api_problem p, const char *field,
				  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* The reply for a failed store_* call: the problem api_problem_of_store
 * maps rc to, detail "<fmt>: <what the error means>". */
enum MHD_Result api_reply_store_error(api_request *req, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Serializes compactly, reals with the fewest digits (15 or 17) that read
 * back as the same double, so 0.1 prints as 0.1, not 0.10000000000000001.
 * newline appends "\n". Returns a malloc'd string (caller frees) or NULL. */
char *api_json_dumps(const json_t *o, bool newline);

/* Checks that every query parameter is one of names (NULL-ended); if not,
 * replies 400 invalid-parameter naming it, sets *ret and returns false.
 * Unknown parameters are refused everywhere so a typo never silently
 * changes a result. */
bool api_query_known(api_request *req, const char *const *names, enum MHD_Result *ret);

/* Parses a JSON text, refusing nesting deeper than max_depth before parsing.
 * Returns 0 and *out (caller owns), -E2BIG too deep, -EINVAL malformed
 * (detail gets line/column and jansson's message). Duplicate object keys
 * are malformed. */
int api_json_parse(const char *buf, size_t len, int max_depth, json_t **out, char *detail,
		   size_t detail_len);

/* 403 forbidden for the request's token: the problem names the token's
 * role ("role") and what was refused ("action", e.g. "cancel jobs");
 * detail is the human sentence. */
enum MHD_Result api_reply_forbidden(api_request *req, const char *action, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Whether the request's token may act on something owner made (a job):
 * an admin on anything, anyone else only on their own (owner NULL: made
 * before owners were recorded, an admin's). If not, replies 403 naming
 * the route's action and sets *ret. */
bool api_may_act_on(api_request *req, const char *owner, const char *what, enum MHD_Result *ret);

/* The secret of an Authorization header value "Bearer <secret>" (scheme
 * case-insensitive, spaces after it skipped), or NULL for anything else. */
const char *api_bearer(const char *authorization);

/* Constant-time bearer check of an Authorization header value against
 * token: true only for "Bearer <token>" (scheme case-insensitive). */
bool api_auth_ok(const char *authorization, const char *token);

/* True for "application/json" with optional parameters (charset...). */
bool api_media_is_json(const char *content_type);

/* Epoch milliseconds as RFC 3339 UTC ("2026-11-30T11:09:47.123Z"). */
void api_time_format(int64_t ms, char out[32]);

#endif
