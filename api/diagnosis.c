/* diagnosis (api) — see diagnosis.h. GET /v1/jobs/{id}/diagnosis answers
 * every rule with its status, numbers and remedy plus a one-line summary. */
#include "api/diagnosis.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/handlers.h"
#include "api/http.h"
#include "common/log.h"

static int spec_int(const json_t *spec, const char *sec, const char *key, int def)
{
	const json_t *v = json_object_get(json_object_get(spec, sec), key);
	return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

/* World size and backend from the devices of the current/last run, else
 * from the spec. */
static void job_devices(const store_job *j, const json_t *spec, diag_job *dj)
{
	json_t *devs = j->devices_json ? json_loads(j->devices_json, 0, NULL) : NULL;
	if (json_is_array(devs) && json_array_size(devs) > 0) {
		dj->world = (int)json_array_size(devs);
		const char *kind = json_string_value(json_object_get(json_array_get(devs, 0), "kind"));
		dj->gpu = kind && strcmp(kind, "cuda") == 0;
	} else {
		dj->world = spec_int(spec, "resources", "gpus", 1);
		const char *d = json_string_value(json_object_get(json_object_get(spec, "resources"), "device"));
		dj->gpu = d && strcmp(d, "cuda") == 0;
	}
	json_decref(devs);
}

int api_diagnose_rows(const store_job *j, const json_t *spec, const store_metric *m, size_t n,
		      const store_metric *first, size_t nf, int64_t now_ms, diag_report *rep)
{
	diag_config cfg;
	char field[160], detail[160];
	int rc = diag_config_parse(json_object_get(json_object_get(spec, "profiler"), "rules"), &cfg,
				   field, sizeof field, detail, sizeof detail);
	if (rc < 0)
		return rc;
	diag_job dj = {
		.running = j->state == JOB_RUNNING,
		.started = j->started_ms > 0,
		.started_ms = j->started_ms,
		.now_ms = now_ms,
		.loader_workers = spec_int(spec, "training_args", "dataloader_num_workers", 0),
		.batch_size = spec_int(spec, "training_args", "per_device_train_batch_size", 1),
		.grad_accum = spec_int(spec, "training_args", "gradient_accumulation_steps", 1),
		.save_steps = spec_int(spec, "training_args", "save_steps", 1),
	};
	job_devices(j, spec, &dj);
	diag_job_stall_from_json(&dj, j->stall_json);
	/* slow_start needs the first row, which the window may have left out */
	size_t lead = nf == 1 && (n == 0 || first[0].step != m[0].step) ? 1 : 0;
	diag_sample *s = calloc(n + lead, sizeof *s);
	if (!s && n + lead > 0)
		return -ENOMEM;
	size_t k = 0;
	if (lead) {
		json_t *v = json_loads(first[0].values_json, 0, NULL);
		diag_sample_from_json(v, first[0].step, first[0].time_ms, &s[k++]);
		json_decref(v);
	}
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_loads(m[i].values_json, 0, NULL);
		diag_sample_from_json(v, m[i].step, m[i].time_ms, &s[k++]);
		json_decref(v);
	}
	diag_run(&cfg, &dj, s, k, rep);
	free(s);
	return 0;
}

int api_diagnose(store *st, const store_job *j, int64_t now_ms, diag_report *rep)
{
	store_job_extras *x = NULL;
	int rc = store_job_extras_get(st, j, 1, DIAG_WINDOW, &x);
	if (rc < 0)
		return rc;
	json_t *spec = j->spec_json ? json_loads(j->spec_json, 0, NULL) : NULL;
	rc = api_diagnose_rows(j, spec, x->tail, x->n_tail, x->first, x->n_first, now_ms, rep);
	json_decref(spec);
	store_job_extras_free(x, 1);
	return rc;
}

static int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

enum MHD_Result jobs_diagnosis(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	if (!api_query_known(req, known, &ret))
		return ret;
	store_job j;
	int rc = store_job_get(req->st, req->args.v[0], &j);
	if (rc == -ENOENT)
		return api_reply_problem(req, API_P_JOB_NOT_FOUND, NULL, "no job %s", req->args.v[0]);
	if (rc < 0)
		return api_reply_store_error(req, rc, "loading job failed");
	diag_report rep;
	rc = api_diagnose(req->st, &j, wall_ms(), &rep);
	if (rc < 0) {
		log_error("job %s: diagnosis failed: %s", j.id, strerror(-rc));
		store_job_free(&j);
		return api_reply_problem(req, API_P_INTERNAL, NULL, "diagnosis failed: %s", strerror(-rc));
	}
	json_t *o = diag_report_json(&rep);
	if (o)
		json_object_set_new(o, "job_id", json_string(j.id));
	store_job_free(&j);
	return api_reply_json(req, 200, o);
}
