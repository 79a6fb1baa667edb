/* handlers — every route handler, one file per resource (system.c, jobs.c).
 * Declared together so the route table in routes.c is the only place that
 * binds them to paths. Each handler replies exactly once (api_reply_*). */
#ifndef BERTD_API_HANDLERS_H
#define BERTD_API_HANDLERS_H

#include <jansson.h>
#include <stdbool.h>

#include "api/routes.h"

/* system.c */
enum MHD_Result system_healthz(api_request *req);
enum MHD_Result system_version(api_request *req);
enum MHD_Result system_info(api_request *req);

/* jobs.c */
enum MHD_Result jobs_create(api_request *req);
enum MHD_Result jobs_list(api_request *req);
enum MHD_Result jobs_get(api_request *req);
enum MHD_Result jobs_delete(api_request *req);
enum MHD_Result jobs_patch(api_request *req);
enum MHD_Result jobs_cancel(api_request *req);
enum MHD_Result jobs_events(api_request *req);

/* jobdata.c */
enum MHD_Result jobs_metrics(api_request *req);
/* For jobs_create: training by epochs (max_steps -1) becomes max_steps from
 * the dataset's prepare totals (jobspec_resolve_epochs), in spec. Returns
 * true, or replies (422 naming the field, 500) and sets *ret. */
bool jobs_resolve_epochs(api_request *req, json_t *spec, enum MHD_Result *ret);
enum MHD_Result jobs_checkpoints(api_request *req);
enum MHD_Result jobs_logs(api_request *req);

/* download.c: a job's export / one complete checkpoint as a tar stream */
enum MHD_Result jobs_export(api_request *req);
enum MHD_Result jobs_checkpoint_download(api_request *req);
enum MHD_Result jobs_checkpoint_export(api_request *req);

/* diagnosis.c */
enum MHD_Result jobs_diagnosis(api_request *req);

/* prom.c */
enum MHD_Result prom_metrics(api_request *req);

/* dashboard.c */
enum MHD_Result dashboard_get(api_request *req);

/* devices.c */
enum MHD_Result devices_list(api_request *req);

/* datasets.c */
enum MHD_Result datasets_create(api_request *req);
enum MHD_Result datasets_list(api_request *req);
enum MHD_Result datasets_get(api_request *req);
enum MHD_Result datasets_delete(api_request *req);

/* tokens.c: named API tokens (admin only) */
enum MHD_Result tokens_create(api_request *req);
enum MHD_Result tokens_list_all(api_request *req);
enum MHD_Result tokens_delete(api_request *req);

#endif
