/* diagnosis (api) — runs daemon/diagnosis.c's rules over what the store
 * holds for one job. Shared by GET /v1/jobs/{id}/diagnosis, the job
 * representation's one-line summary and the dashboard. Read-only: must
 * never write the store. Internal to api/. */
#ifndef BERTD_API_DIAGNOSIS_H
#define BERTD_API_DIAGNOSIS_H

#include <jansson.h>

#include "daemon/diagnosis.h"
#include "daemon/store.h"

/* Loads the job's newest DIAG_WINDOW metrics rows (and its first, for
 * slow_start), reads its knobs from the spec and runs the rules at now_ms.
 * Returns 0 and *rep, or a negative errno from the store (-EINVAL if the
 * stored profiler.rules no longer parse). */
int api_diagnose(store *st, const store_job *j, int64_t now_ms, diag_report *rep);
/* The same over rows already read (store_job_extras_get with DIAG_WINDOW:
 * m the newest rows in step order, first the first row) and the job's
 * parsed spec, so a list page reads and parses each job once. */
int api_diagnose_rows(const store_job *j, const json_t *spec, const store_metric *m, size_t n,
		      const store_metric *first, size_t nf, int64_t now_ms, diag_report *rep);

#endif
