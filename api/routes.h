/* routes — the API's one route table and the dispatcher's matcher.
 *
 * A route is (method, path template, handler, flags); templates are literal
 * segments and "{name}" placeholders, each matching one non-empty segment.
 * The matcher runs once per request and hands the handler its path
 * arguments in template order. It never looks at headers or bodies.
 * Each route also says which role may call it (tokens.h: reader < user <
 * admin); a handler may narrow that further (a user's own jobs).
 */
#ifndef BERTD_API_ROUTES_H
#define BERTD_API_ROUTES_H

#include <stdbool.h>
#include <stddef.h>
#include <microhttpd.h>

#include "daemon/tokens.h"

#define API_MAX_PATH_ARGS 4
#define API_PATH_ARG_MAX 128 /* bytes incl. NUL; longer segments do not match */

typedef struct api_request api_request;
typedef enum MHD_Result (*api_handler)(api_request *req);

enum {
	API_ROUTE_PUBLIC = 1u << 0, /* no bearer token needed (healthz) */
};

typedef struct api_route {
	const char *method;  /* "GET", "POST", "DELETE"; GET also answers HEAD */
	const char *path;    /* "/v1/jobs/{id}/events" */
	api_handler handler;
	unsigned flags;
	enum tokens_role role; /* the least role whose token may call it (not public routes) */
	const char *action;  /* what it does, for a 403: "cancel jobs" */
} api_route;

typedef struct api_path_args {
	size_t n;
	char v[API_MAX_PATH_ARGS][API_PATH_ARG_MAX];
} api_path_args;

enum api_match {
	API_MATCH_OK = 0,
	API_MATCH_NO_PATH,    /* 404 */
	API_MATCH_NO_METHOD,  /* 405; allow lists the path's methods */
};

/* Matches method + path (no query string) against table[0..n).
 * On API_MATCH_OK *found and *args are set. On API_MATCH_NO_METHOD, allow
 * gets "GET, HEAD, POST"-style text (truncated to allow_len). */
enum api_match api_route_find(const api_route *table, size_t n, const char *method,
			      const char *path, const api_route **found, api_path_args *args,
			      char *allow, size_t allow_len);

/* True when a public route (API_ROUTE_PUBLIC) has this path, whatever its
 * method: only such paths may answer 404/405 to a caller without a token. */
bool api_route_path_public(const api_route *table, size_t n, const char *path);

/* The daemon's route table (static storage). */
const api_route *api_route_table(size_t *n);

#endif
