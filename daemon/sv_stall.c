/* sv_stall — the stall watch of a job's attempt: which worker has been
 * silent how long, the rank it suspects (recorded for the diagnosis,
 * store_job.stall_json), and failing the attempt past the limit.
 *
 * Stall limit. Every message a worker sends counts as progress (hello,
 * metrics, checkpoint, and {"type":"progress","step":N}, which a worker
 * sends at most once a second from its step loop). Before the job's first
 * step report the limit is at least SUPERVISOR_STARTUP_ALLOWANCE_MS:
 * building the model and loading a checkpoint are not a stall. After it, a rank that sends progress messages is held to
 * stall_timeout_ms from its own last message. A worker that does not
 * (only rank 0 reports, every logging_steps) is judged by the job's last
 * message against max(stall_timeout_ms, twice the longest gap seen between
 * step reports), so slow logging windows are not taken for a stall.
 *
 * Never changes a job's state and never signals a process except through
 * sv_run_kill_all, once a rank is past its limit.
 */
#include "daemon/sv_internal.h"

#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/procstat.h"

/* Stall watch bookkeeping: every worker message is progress; metrics,
 * progress and checkpoint messages are step reports. */
void sv_stall_note_progress(run *r, child *c, const char *type)
{
	if (c->role != ROLE_WORKER)
		return;
	int64_t now = sv_now_ms();
	c->last_msg_ms = r->last_msg_ms = now;
	if (strcmp(type, "metrics") && strcmp(type, "progress") && strcmp(type, "checkpoint") &&
	    strcmp(type, "eval"))
		return;
	/* the first gap counts from the start (startup included: a
	 * generous estimate of the window, never a short one) */
	int64_t gap = now - (r->stepping ? r->last_step_ms : r->start_ms);
	if (gap > r->max_gap_ms)
		r->max_gap_ms = gap;
	r->stepping = true;
	r->last_step_ms = now;
}

static int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Records (or, c NULL, clears) the rank the stall watch suspects, in the
 * store where the diagnosis reads it (store_job.stall_json). */
void sv_stall_note(supervisor *sv, run *r, const child *c, int64_t silent_ms, int64_t limit_ms, bool stopped)
{
	if (!c) {
		if (r->stall_noted >= 0)
			store_job_set_stall(sv->st, r->id, NULL);
		r->stall_noted = -1;
		return;
	}
	if (r->stall_noted == c->index)
		return;
	json_t *o = json_pack("{s:i, s:I, s:I, s:b}", "rank", c->index, "since_ms",
			      (json_int_t)(wall_ms() - silent_ms), "limit_s", (json_int_t)(limit_ms / 1000),
			      "stopped", stopped);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	if (text && store_job_set_stall(sv->st, r->id, text) == 0)
		r->stall_noted = c->index;
	free(text);
	json_decref(o);
}

/* The stall watch (see the top of this file). Picks the worker furthest
 * into its limit (a stopped process first); past a quarter of it, the rank
 * is noted for the diagnosis; past the limit, the job's processes are
 * killed and the attempt fails as retryable. */
void sv_stall_check(supervisor *sv, run *r, int64_t now)
{
	int64_t timeout = sv->cfg.stall_timeout_ms;
	int64_t job_limit = timeout;
	if (!r->stepping)
		job_limit = timeout > SUPERVISOR_STARTUP_ALLOWANCE_MS ? timeout : SUPERVISOR_STARTUP_ALLOWANCE_MS;
	else if (2 * r->max_gap_ms > job_limit)
		job_limit = 2 * r->max_gap_ms;
	child *who = NULL;
	int64_t who_silent = 0, who_limit = 1;
	bool who_stopped = false;
	for (int i = 0; i < r->nkids; i++) {
		child *c = r->kids[i];
		if (c->role != ROLE_WORKER || c->exited)
			continue;
		bool own = c->heartbeat && r->stepping;
		int64_t silent = now - (own ? c->last_msg_ms : r->last_msg_ms);
		int64_t limit = own ? timeout : job_limit;
		if (4 * silent <= limit)
			continue; /* not even suspect */
		char state = 0;
		if (!c->relayed) /* a rank on another node: no process to look at here */
			procstat_starttime(c->p.pid, &state);
		bool stopped = state == 'T' || state == 't';
		/* furthest into its limit; ties (ranks judged by the job's
		 * silence) go to the one whose own last message is oldest */
		bool better = !who || (stopped && !who_stopped);
		if (who && stopped == who_stopped) {
			double x = (double)silent / (double)limit, y = (double)who_silent / (double)who_limit;
			better = x > y || (x == y && c->last_msg_ms < who->last_msg_ms);
		}
		if (better) {
			who = c;
			who_silent = silent;
			who_limit = limit;
			who_stopped = stopped;
		}
	}
	if (!who) {
		sv_stall_note(sv, r, NULL, 0, 0, false);
		return;
	}
	sv_stall_note(sv, r, who, who_silent, who_limit, who_stopped);
	if (who_silent <= who_limit)
		return;
	sv_set_failure(r, true, "rank %d made no progress for %lld s (%s; last reported step %lld)", who->index,
		    (long long)(who_limit / 1000),
		    !r->stepping ? "before its first step" : who->heartbeat && r->stepping ? "stall_timeout_s"
		    : "stall_timeout_s, or twice the longest gap between its reports",
		    (long long)r->last_step);
	log_warn("job %s: rank %d silent for %lld ms%s; killing the attempt", r->id, who->index,
		 (long long)who_silent, who_stopped ? " (its process is stopped)" : "");
	sv_run_kill_all(r, SIGKILL);
}
