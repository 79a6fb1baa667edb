/* sv_run — a run's small helpers, shared by every supervisor file: the
 * clock, its verdict (the first cause wins), signalling its processes,
 * its run-time share, the run list (find, unlink), failing a job that has
 * no attempt, freeing a run, noticing its last child gone, and an adopted
 * attempt's clocks (adopt.c and sv_slurm.c alike).
 *
 * The bottom of the supervisor's files: calls none of them. What depends
 * on the kind of run is reached through the run's own hooks, set by whoever
 * made it: on_end (sv_launch: the job's next state, sv_finish; sv_prepare:
 * the dataset's) and on_free (sv_slurm: the relay). Never reads a child's
 * messages and never decides a job's next state itself.
 */
#include "daemon/sv_internal.h"

#include <assert.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/jobspec.h"
#include "common/log.h"
#include "common/msg.h"
#include "daemon/proc.h"
#include "daemon/telemetry.h"
#include "daemon/telemetry_sampler.h"

int64_t sv_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sv_run_free(run *r)
{
	if (r->on_free) /* what its kind holds beyond its children: a multi-node attempt's relay */
		r->on_free(r->sv, r);
	for (int i = 0; i < r->nkids; i++) {
		if (r->kids[i]->relayed && r->kids[i]->p.sock >= 0)
			close(r->kids[i]->p.sock);
		msg_reader_free(&r->kids[i]->rd);
		free(r->kids[i]);
	}
	free(r->rank_node);
	free(r->rank_sha);
	relaykv_destroy(r->kv);
	json_decref(r->spec);
	tsampler_destroy(r->ts);
	free(r);
}

void sv_shm_name_for(const char *job_id, char *buf, size_t cap)
{
	snprintf(buf, cap, "/bertd-%s", job_id);
}

void sv_set_failure(run *r, bool retryable, const char *fmt, ...)
{
	if (r->failed)
		return; /* the first cause wins; the rest are consequences */
	r->failed = true;
	r->retryable = retryable;
	if (r->multinode) /* a failed attempt's ranks put nothing in place any more */
		cluster_fence_close(&r->ca);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->reason, sizeof r->reason, fmt, ap);
	va_end(ap);
}

/* Records the job's wall time so far: its earlier attempts and this one
 * up to now (stopping_condition.max_runtime_seconds counts it). */
void sv_note_runtime(supervisor *sv, run *r)
{
	if (!r->is_dataset && r->start_ms > 0)
		store_job_set_runtime(sv->st, r->id, r->runtime_base_ms + (sv_now_ms() - r->start_ms));
}

/* This attempt's share of max_runtime_seconds: what the earlier attempts
 * (runtime_ms) left, at least 1 ms, so a job out of time stops at once
 * (with its checkpoint and export); 0 without a limit. */
int64_t sv_runtime_left_ms(const jobspec *spec, int64_t used_ms)
{
	if (spec->max_runtime_seconds <= 0)
		return 0;
	int64_t left = spec->max_runtime_seconds * 1000 - used_ms;
	return left > 0 ? left : 1;
}

void sv_run_kill_all(run *r, int sig)
{
	if (!r->killing) {
		r->killing = true;
		r->stop_deadline_ms = sv_now_ms() + 10000;
	}
	for (int i = 0; i < r->nkids; i++)
		if (!r->kids[i]->exited && !r->kids[i]->relayed)
			proc_signal(&r->kids[i]->p, sig);
}

void sv_fail_job_now(supervisor *sv, const char *id, unsigned from, const char *reason)
{
	log_warn("job %s failed: %s", id, reason);
	if (store_job_transition(sv->st, id, from, JOB_FAILED, reason, NULL) == 0)
		telemetry_job_finished(JOB_FAILED);
}

void sv_unlink_run(supervisor *sv, run *r)
{
	for (run **pp = &sv->runs; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			return;
		}
	}
}

/* All children gone: the run's kind decides the job's (or dataset's) next
 * state (on_end, which frees r). */
void sv_run_maybe_finish(supervisor *sv, run *r)
{
	if (r->alive > 0)
		return;
	sv_unlink_run(sv, r);
	assert(r->on_end);
	r->on_end(sv, r);
}

run *sv_find_run(supervisor *sv, const char *id)
{
	for (run *r = sv->runs; r; r = r->next)
		if (strcmp(r->id, id) == 0)
			return r;
	return NULL;
}

void sv_adopt_clock(run *r, const store_job *j, const json_t *rec)
{
	/* the attempt's wall-clock start, on this daemon's monotonic clock */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now_unix = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	int64_t now = sv_now_ms();
	r->start_ms = now - (now_unix - (int64_t)json_integer_value(json_object_get(rec, "started_unix_ms")));
	r->runtime_base_ms = json_integer_value(json_object_get(rec, "runtime_base_ms"));
	r->max_runtime_ms = json_integer_value(json_object_get(rec, "max_runtime_ms"));
	r->last_msg_ms = r->last_step_ms = now;
	r->stepping = true; /* the stall watch counts from now */
	r->stall_noted = -1;
	r->saw_running = j->state != JOB_STARTING;
	if (j->state == JOB_STOPPING) /* a cancel the earlier daemon had asked for: the tick asks again */
		r->stop_why = SV_STOP_USER;
}
