/* telemetry — see telemetry.h. Relaxed atomics: the counters order nothing. */
#include "daemon/telemetry.h"

#include <stdatomic.h>
#include <string.h>

static _Atomic uint64_t submitted, restarts;
static _Atomic uint64_t finished[JOB_STATE_COUNT];
static _Atomic uint64_t http[TELEMETRY_STATUS_MAX - TELEMETRY_STATUS_MIN + 1];

void telemetry_job_submitted(void)
{
	atomic_fetch_add_explicit(&submitted, 1, memory_order_relaxed);
}

void telemetry_job_finished(enum job_state result)
{
	if ((unsigned)result < JOB_STATE_COUNT && job_state_is_terminal(result))
		atomic_fetch_add_explicit(&finished[result], 1, memory_order_relaxed);
}

void telemetry_job_restarted(void)
{
	atomic_fetch_add_explicit(&restarts, 1, memory_order_relaxed);
}

void telemetry_http_reply(unsigned status)
{
	if (status >= TELEMETRY_STATUS_MIN && status <= TELEMETRY_STATUS_MAX)
		atomic_fetch_add_explicit(&http[status - TELEMETRY_STATUS_MIN], 1, memory_order_relaxed);
}

void telemetry_read(telemetry_counters *out)
{
	memset(out, 0, sizeof *out);
	out->jobs_submitted = atomic_load_explicit(&submitted, memory_order_relaxed);
	out->restarts = atomic_load_explicit(&restarts, memory_order_relaxed);
	for (int i = 0; i < JOB_STATE_COUNT; i++)
		out->jobs_finished[i] = atomic_load_explicit(&finished[i], memory_order_relaxed);
	for (int i = 0; i <= TELEMETRY_STATUS_MAX - TELEMETRY_STATUS_MIN; i++)
		out->http[i] = atomic_load_explicit(&http[i], memory_order_relaxed);
}
