/* harness — starts the real bertd on an ephemeral loopback port with a temp
 * state dir and talks to it over HTTP (libcurl).
 *
 * Start-up uses the systemd readiness protocol, not sleeps: the harness
 * binds a unix datagram socket, passes it as NOTIFY_SOCKET, and waits
 * (bounded) for READY=1 or the child's exit, whichever comes first. Then it
 * reads <state>/bertd.addr and <state>/token, as a user's script would.
 *
 * Tests start their daemons through it_util.h's fixture (it_daemon_start,
 * it_setup), which adds the data root, the devices and a dataset.
 */
#ifndef BERTD_TESTS_HARNESS_H
#define BERTD_TESTS_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <curl/curl.h>

#define HARNESS_READY_TIMEOUT_MS 10000

typedef struct bertd {
	char root[64];        /* mkdtemp'd; holds state/, notify, bertd.log */
	char state_dir[96];
	char base_url[128];   /* "http://127.0.0.1:PORT" from bertd.addr */
	char token[256];
	pid_t pid;            /* 0 when not running */
} bertd;

/* Makes a fresh root and state dir (nothing started). 0 or -errno. */
int bertd_init(bertd *d);
/* Starts bertd on d->state_dir with the test defaults (--port 0, --listen
 * 127.0.0.1, --config /dev/null, --log-level debug) plus extra (NULL-ended,
 * may be NULL). Returns 0 once READY=1 arrived and addr/token are read;
 * -ETIMEDOUT, -ECHILD (exited first; its log is printed), or -errno. */
int bertd_start(bertd *d, const char *const *extra);
/* SIGTERM and wait; returns the exit status (0 expected) or -1 if it died
 * by a signal. */
int bertd_stop(bertd *d);
/* SIGKILL and reap: no shutdown code runs. */
void bertd_kill9(bertd *d);
/* Stops if running (SIGKILL) and removes the whole root. */
void bertd_destroy(bertd *d);
/* Prints the daemon's log to stderr (for failing tests). */
void bertd_print_log(const bertd *d);

typedef struct http_resp {
	long status;
	char *body;           /* NUL-terminated */
	size_t len;
	json_t *json;         /* parsed body, or NULL */
	char *headers;        /* raw header block of the final response */
	int curl_rc;
} http_resp;

enum { H_AUTH = 1, H_NO_AUTH = 0 };

/* One request. body NULL = none. headers NULL-ended, may be NULL; a
 * Content-Type: application/json is added when a body is sent unless the
 * caller passes its own Content-Type line (or "Content-Type:" to send
 * none). auth adds the bearer token. Returns 0, or the curl error. */
int http_do(const bertd *d, const char *method, const char *path, const char *body,
	    size_t body_len, const char *const *headers, int auth, http_resp *out);
/* POST with Transfer-Encoding: chunked, body sent in pieces of at most
 * piece bytes. */
int http_post_chunked(const bertd *d, const char *path, const char *body, size_t body_len,
		      size_t piece, http_resp *out);
/* Shorthands with the token. */
int http_get(const bertd *d, const char *path, http_resp *out);
int http_post_json(const bertd *d, const char *path, const char *json, http_resp *out);

/* Value of a response header (case-insensitive name), copied into buf
 * without surrounding space; NULL if absent. */
const char *http_header(const http_resp *r, const char *name, char *buf, size_t n);
void http_resp_free(http_resp *r);

#endif
