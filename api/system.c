/* system — liveness, build facts, and what the daemon runs with. healthz
 * answers without auth and without touching the database (store_damaged
 * reads a flag), so a supervisor's probe never queues behind a busy
 * database; it must never reveal anything but "ok" or why it is unhealthy.
 * /v1/system (token needed) shows configuration problems a user would
 * otherwise only find in the start-up log, checked at request time. */
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "api/follow.h"
#include "api/handlers.h"
#include "api/http.h"
#include "daemon/config.h"
#include "daemon/retention.h"

#ifndef BERTD_VERSION
#define BERTD_VERSION "unknown"
#endif

#ifdef BERTD_CUDA
static const bool built_with_cuda = true;
#else
static const bool built_with_cuda = false;
#endif

/* The healthy answer, made once: a probe costs the server thread a flag
 * read and the queueing of this one shared reply (no JSON work, no
 * allocation), so it is answered between other connections' requests at
 * once whatever they are. */
static api_prepared *healthy;
static pthread_once_t healthy_once = PTHREAD_ONCE_INIT;

static void healthy_make(void)
{
	static const char ok[] = "{\"status\":\"ok\"}\n"; /* api_reply_json's spelling */
	char *body = malloc(sizeof ok - 1);
	if (body) {
		memcpy(body, ok, sizeof ok - 1);
		healthy = api_prepared_create("application/json", body, sizeof ok - 1);
	}
}

enum MHD_Result system_healthz(api_request *req)
{
	/* A damaged database cannot be served from; say so to the probe so an
	 * operator is called rather than jobs silently lost. */
	if (req->st && store_damaged(req->st))
		return api_reply_json(req, MHD_HTTP_SERVICE_UNAVAILABLE,
				      json_pack("{s:s, s:s}", "status", "unhealthy", "reason",
						"database-damaged"));
	pthread_once(&healthy_once, healthy_make);
	if (healthy)
		return api_reply_prepared(req, MHD_HTTP_OK, healthy);
	return api_reply_json(req, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
}

enum MHD_Result system_version(api_request *req)
{
	/* nccl: what the daemon found at start (null: none it can load) */
	return api_reply_json(req, MHD_HTTP_OK,
			      json_pack("{s:s, s:s, s:b, s:s?}", "version", BERTD_VERSION, "api", "v1",
					"cuda", built_with_cuda, "nccl", req->cfg->nccl_version));
}

/* Job files' disk use as the retention thread last measured it (a cache:
 * a request never walks the job directories), and the policy in force. */
static json_t *disk_json(retention *r)
{
	retention_usage u;
	retention_config policy;
	retention_config_get(r, &policy); /* a reload may change it meanwhile */
	const retention_config *rc = &policy;
	if (retention_usage_get(r, &u) < 0)
		return NULL;
	char at[32];
	api_time_format(u.measured_ms, at);
	json_t *jobs = json_array();
	for (size_t i = 0; jobs && i < u.n_jobs; i++)
		if (json_array_append_new(jobs, json_pack("{s:s, s:I, s:b}", "id", u.jobs[i].id, "bytes",
							  (json_int_t)u.jobs[i].bytes, "deleting",
							  u.jobs[i].deleting))) {
			json_decref(jobs);
			jobs = NULL;
		}
	free(u.jobs);
	if (!jobs)
		return NULL;
	json_t *ceil_b = rc->ceiling_bytes ? json_integer((json_int_t)rc->ceiling_bytes) : json_null();
	json_t *ceil_p = rc->ceiling_percent ? json_integer(rc->ceiling_percent) : json_null();
	json_t *days = rc->checkpoint_days >= 0 ? json_integer(rc->checkpoint_days) : json_null();
	return json_pack("{s:I, s:I, s:I, s:s, s:I, s:I, s:o, s:o, s:{s:o, s:b, s:i}, s:o}",
			 "jobs_bytes", (json_int_t)u.total_bytes, "deleting_bytes",
			 (json_int_t)u.deleting_bytes, "deleting", (json_int_t)u.n_deleting,
			 "measured_at", at, "passes", (json_int_t)u.passes, "checkpoints_removed",
			 (json_int_t)u.checkpoints_dropped, "ceiling_bytes", ceil_b, "ceiling_percent",
			 ceil_p, "retention", "checkpoint_days", days, "keep_exports", rc->keep_exports,
			 "interval_s", rc->interval_s, "jobs", jobs);
}

/* Each data root as it is now (the same check the daemon logs at start):
 * a root that does not exist, or a first root bertd cannot write, makes
 * every request naming a path under it fail, so it is spelled out here. */
enum MHD_Result system_info(api_request *req)
{
	static const char *const none[] = {NULL};
	enum MHD_Result ret;
	if (!api_query_known(req, none, &ret))
		return ret;
	const api_config *cfg = req->cfg;
	json_t *roots = json_array(), *warnings = json_array();
	json_t *o = json_pack("{s:s, s:s, s:b, s:s, s:b, s:o, s:o}", "version", BERTD_VERSION,
			      "api", "v1", "cuda", built_with_cuda, "listen",
			      cfg->listen_addr ? cfg->listen_addr : "", "allow_remote",
			      cfg->allow_remote, "data_roots", roots, "warnings", warnings);
	if (!o)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	if (req->follow) {
		unsigned open, per_job, total;
		follow_hub_counts(req->follow, &open, &per_job, &total);
		if (json_object_set_new(o, "followers",
					json_pack("{s:i, s:i, s:i}", "open", (int)open, "max_per_job",
						  (int)per_job, "max_total", (int)total))) {
			json_decref(o);
			return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		}
	}
	if (cfg->retention && json_object_set_new(o, "disk", disk_json(cfg->retention))) {
		json_decref(o);
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	}
	for (size_t i = 0; i < cfg->n_data_roots; i++) {
		char why[1400];
		bool ok = config_root_check(cfg->data_roots[i], i == 0, why, sizeof why) == 0;
		json_t *r = json_pack("{s:s, s:b, s:b, s:s?}", "path", cfg->data_roots[i], "ok", ok,
				      "writes_datasets", i == 0, "problem", ok ? NULL : why);
		if (!r || json_array_append_new(roots, r) ||
		    (!ok && json_array_append_new(warnings, json_string(why)))) {
			json_decref(o);
			return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		}
	}
	return api_reply_json(req, MHD_HTTP_OK, o);
}
