/* server — api.h's server: the follow streams' hub (follow.c) and the HTTP
 * server (http.c), started and stopped in the order each needs.
 *
 * The hub is created first and handed to the HTTP server, which passes it
 * to every request; at stop the hub ends (and resumes) its streams before
 * the HTTP server stops, as MHD cannot stop with a suspended connection,
 * and is freed after it, once no reply can touch it. http.c and follow.c
 * know nothing of each other's lifetime: only this file orders them.
 * Must never hold a request or touch MHD itself.
 */
#include "api/api.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/follow.h"
#include "api/http.h"
#include "api/tls.h"

#define DEFAULT_FOLLOW_PER_JOB 8
#define DEFAULT_FOLLOW_TOTAL 32
#define DEFAULT_FOLLOW_KEEPALIVE_S 15

struct api_server {
	follow_hub *follow; /* started before the HTTP server, stopped before it, freed after */
	api_http *http;
};

int api_server_start(api_server **out, const api_config *cfg, store *st)
{
	int rc;
	api_server *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	unsigned per_job = cfg->follow_max_per_job ? cfg->follow_max_per_job : DEFAULT_FOLLOW_PER_JOB;
	unsigned total = cfg->follow_max_total ? cfg->follow_max_total : DEFAULT_FOLLOW_TOTAL;
	unsigned keepalive_s = cfg->follow_keepalive_s ? cfg->follow_keepalive_s : DEFAULT_FOLLOW_KEEPALIVE_S;
	if ((rc = follow_hub_create(&s->follow, st, per_job, total, keepalive_s)) < 0)
		goto out;
	if ((rc = api_http_start(&s->http, cfg, st, s->follow)) < 0)
		goto out;
	*out = s;
	return 0;
out:
	follow_hub_destroy(s->follow);
	free(s);
	return rc;
}

int api_server_port(const api_server *s)
{
	return api_http_port(s->http);
}

bool api_server_tls(const api_server *s)
{
	return api_http_tls(s->http);
}

int api_server_set_token(api_server *s, const char *token)
{
	return api_http_set_token(s->http, token);
}

void api_server_set_limits(api_server *s, size_t max_body_bytes, unsigned per_ip_limit,
			   unsigned request_timeout_s)
{
	api_http_set_limits(s->http, max_body_bytes, per_ip_limit, request_timeout_s);
}

int api_server_set_tls(api_server *s, struct api_tls_creds *creds)
{
	return api_http_set_tls(s->http, creds);
}

void api_server_stop(api_server *s)
{
	if (!s)
		return;
	follow_hub_stop(s->follow); /* every stream ended and resumed: MHD may stop */
	api_http_stop(s->http);
	follow_hub_destroy(s->follow);
	free(s);
}
