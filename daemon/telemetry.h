/* telemetry — the daemon's process-lifetime counters for GET /metrics:
 * jobs submitted, jobs finished by result, worker restarts, API replies by
 * status code. Lock-free atomics, so the event loop and the API threads
 * count without sharing anything else. Must never hold per-job state (that
 * lives in the store) or reset while the process runs (Prometheus counters
 * only go up; a daemon restart is a counter reset, which Prometheus
 * handles). */
#ifndef BERTD_DAEMON_TELEMETRY_H
#define BERTD_DAEMON_TELEMETRY_H

#include <stdint.h>

#include "daemon/store.h"

#define TELEMETRY_STATUS_MIN 100
#define TELEMETRY_STATUS_MAX 599

typedef struct telemetry_counters {
	uint64_t jobs_submitted;
	uint64_t jobs_finished[JOB_STATE_COUNT]; /* only final states count */
	uint64_t restarts;
	uint64_t http[TELEMETRY_STATUS_MAX - TELEMETRY_STATUS_MIN + 1]; /* by status - 100 */
} telemetry_counters;

void telemetry_job_submitted(void);
/* A job reached a final state (completed, failed, canceled); others ignored. */
void telemetry_job_finished(enum job_state result);
void telemetry_job_restarted(void);
/* One API reply with this status (out-of-range codes are ignored). */
void telemetry_http_reply(unsigned status);
/* A consistent-enough copy of every counter (each read atomically). */
void telemetry_read(telemetry_counters *out);

#endif
