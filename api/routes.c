/* routes — see routes.h. The table here is the whole v1 surface; a handler
 * reaches the network only through this table. Must never branch on paths
 * anywhere else (no if/else routing chains in handlers). */
#include "api/routes.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "api/handlers.h"

#define R TOKENS_ROLE_READER
#define U TOKENS_ROLE_USER
#define A TOKENS_ROLE_ADMIN

/* Readers read everything; users also submit, add datasets and cancel,
 * change and delete their own jobs (jobs.c checks the owner); admins do
 * anything, and alone delete datasets and manage tokens. */
static const api_route routes[] = {
	{"GET",    "/",                     dashboard_get,  API_ROUTE_PUBLIC, R, "read"},
	{"GET",    "/metrics",              prom_metrics,   0, R, "read metrics"},
	{"GET",    "/v1/healthz",           system_healthz, API_ROUTE_PUBLIC, R, "read"},
	{"GET",    "/v1/version",           system_version, 0, R, "read"},
	{"GET",    "/v1/system",            system_info,    0, R, "read"},
	{"POST",   "/v1/jobs",              jobs_create,    0, U, "submit jobs"},
	{"GET",    "/v1/jobs",              jobs_list,      0, R, "read"},
	{"GET",    "/v1/jobs/{id}",         jobs_get,       0, R, "read"},
	{"DELETE", "/v1/jobs/{id}",         jobs_delete,    0, U, "delete jobs"},
	{"PATCH",  "/v1/jobs/{id}",         jobs_patch,     0, U, "change jobs"},
	{"POST",   "/v1/jobs/{id}/cancel",  jobs_cancel,    0, U, "cancel jobs"},
	{"GET",    "/v1/jobs/{id}/events",  jobs_events,    0, R, "read"},
	{"GET",    "/v1/jobs/{id}/metrics", jobs_metrics,   0, R, "read"},
	{"GET",    "/v1/jobs/{id}/checkpoints", jobs_checkpoints, 0, R, "read"},
	{"GET",    "/v1/jobs/{id}/checkpoints/{step}", jobs_checkpoint_download, 0, R, "read"},
	{"GET",    "/v1/jobs/{id}/checkpoints/{step}/export", jobs_checkpoint_export, 0, R, "read"},
	{"GET",    "/v1/jobs/{id}/export",  jobs_export,    0, R, "read"},
	{"GET",    "/v1/jobs/{id}/logs",    jobs_logs,      0, R, "read"},
	{"GET",    "/v1/jobs/{id}/diagnosis", jobs_diagnosis, 0, R, "read"},
	{"GET",    "/v1/devices",           devices_list,   0, R, "read"},
	{"POST",   "/v1/datasets",          datasets_create, 0, U, "add datasets"},
	{"GET",    "/v1/datasets",          datasets_list,   0, R, "read"},
	{"GET",    "/v1/datasets/{id}",     datasets_get,    0, R, "read"},
	{"DELETE", "/v1/datasets/{id}",     datasets_delete, 0, A, "delete datasets"},
	{"POST",   "/v1/tokens",            tokens_create,   0, A, "add tokens"},
	{"GET",    "/v1/tokens",            tokens_list_all, 0, A, "list tokens"},
	{"DELETE", "/v1/tokens/{name}",     tokens_delete,   0, A, "revoke tokens"},
};

#undef R
#undef U
#undef A

const api_route *api_route_table(size_t *n)
{
	*n = sizeof routes / sizeof routes[0];
	return routes;
}

/* Walks template and path segment by segment; fills args when non-NULL. */
static bool path_matches(const char *tmpl, const char *path, api_path_args *args)
{
	size_t nargs = 0;
	if (*tmpl != '/' || *path != '/')
		return false;
	if (tmpl[1] == 0 || path[1] == 0) { /* the root has no segment to walk */
		if (tmpl[1] != 0 || path[1] != 0)
			return false;
		if (args)
			args->n = 0;
		return true;
	}
	while (*tmpl && *path) {
		if (*tmpl != '/' || *path != '/')
			return false;
		tmpl++, path++;
		size_t tl = strcspn(tmpl, "/"), pl = strcspn(path, "/");
		if (pl == 0)
			return false; /* empty segment: "//" or a trailing "/" */
		if (tl >= 2 && tmpl[0] == '{' && tmpl[tl - 1] == '}') {
			if (pl >= API_PATH_ARG_MAX || nargs >= API_MAX_PATH_ARGS)
				return false;
			if (args) {
				memcpy(args->v[nargs], path, pl);
				args->v[nargs][pl] = 0;
			}
			nargs++;
		} else if (tl != pl || memcmp(tmpl, path, tl) != 0) {
			return false;
		}
		tmpl += tl, path += pl;
	}
	if (*tmpl || *path)
		return false;
	if (args)
		args->n = nargs;
	return true;
}

static bool method_matches(const char *route_method, const char *method)
{
	return strcmp(route_method, method) == 0 ||
	       (strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0);
}

static void allow_add(char *allow, size_t allow_len, const char *m)
{
	size_t used = strlen(allow);
	/* Whole-token check so "GET" is not mistaken for part of another name. */
	for (const char *p = allow; (p = strstr(p, m)) != NULL; p += strlen(m)) {
		bool start = p == allow || p[-1] == ' ';
		bool end = p[strlen(m)] == ',' || p[strlen(m)] == 0;
		if (start && end)
			return;
	}
	snprintf(allow + used, allow_len - used, "%s%s", used ? ", " : "", m);
}

enum api_match api_route_find(const api_route *table, size_t n, const char *method,
			      const char *path, const api_route **found, api_path_args *args,
			      char *allow, size_t allow_len)
{
	bool path_seen = false;
	if (allow && allow_len)
		allow[0] = 0;
	for (size_t i = 0; i < n; i++) {
		if (!path_matches(table[i].path, path, NULL))
			continue;
		path_seen = true;
		if (method_matches(table[i].method, method)) {
			path_matches(table[i].path, path, args);
			*found = &table[i];
			return API_MATCH_OK;
		}
	}
	if (!path_seen)
		return API_MATCH_NO_PATH;
	if (allow && allow_len) {
		for (size_t i = 0; i < n; i++) {
			if (!path_matches(table[i].path, path, NULL))
				continue;
			allow_add(allow, allow_len, table[i].method);
			if (strcmp(table[i].method, "GET") == 0)
				allow_add(allow, allow_len, "HEAD");
		}
	}
	return API_MATCH_NO_METHOD;
}

bool api_route_path_public(const api_route *table, size_t n, const char *path)
{
	for (size_t i = 0; i < n; i++)
		if ((table[i].flags & API_ROUTE_PUBLIC) && path_matches(table[i].path, path, NULL))
			return true;
	return false;
}
