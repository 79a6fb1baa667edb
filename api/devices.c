/* devices — GET /v1/devices: what jobs can run on and which job holds each
 * device now. The device list comes from discovery at daemon start; the
 * holders come from the store (each active job's recorded devices), so this
 * handler never asks the event loop anything. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/handlers.h"
#include "api/http.h"
#include "daemon/store.h"

enum MHD_Result devices_list(api_request *req)
{
	static const char *const known[] = {NULL};
	enum MHD_Result qret;
	if (!api_query_known(req, known, &qret))
		return qret;
	size_t n = req->cfg->n_devices;
	const char **holder = calloc(n ? n : 1, sizeof *holder);
	store_job *jobs = NULL;
	size_t nj = 0;
	int64_t next = 0;
	int rc = holder ? store_job_list(req->st, JOB_MASK_ACTIVE, 0, 1000, &jobs, &nj, &next) : -ENOMEM;
	if (rc < 0) {
		free(holder);
		return api_reply_store_error(req, rc, "listing jobs failed");
	}
	for (size_t i = 0; i < nj; i++) {
		json_t *devs = jobs[i].devices_json ? json_loads(jobs[i].devices_json, 0, NULL) : NULL;
		size_t k;
		json_t *d;
		json_array_foreach(devs, k, d) {
			json_int_t id = json_integer_value(json_object_get(d, "id"));
			if (id >= 0 && (size_t)id < n)
				holder[id] = jobs[i].id;
		}
		json_decref(devs);
	}
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++) {
		const device *d = &req->cfg->devices[i];
		json_t *o = json_pack("{s:I, s:s, s:i, s:s, s:s?}", "id", (json_int_t)i, "kind",
				      device_kind_name(d->kind), "index", d->index, "name", d->name,
				      "job", holder[i]);
		if (d->kind == DEVICE_CUDA) {
			json_object_set_new(o, "memory_total_bytes", json_integer((json_int_t)d->mem_total));
			char cc[16];
			snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
			json_object_set_new(o, "compute_capability", json_string(cc));
		}
		json_array_append_new(arr, o);
	}
	json_t *body = json_pack("{s:o}", "devices", arr);
	store_jobs_free(jobs, nj);
	free(holder);
	return api_reply_json(req, MHD_HTTP_OK, body);
}
