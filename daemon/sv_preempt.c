/* sv_preempt — the tick's preemption (docs/jobspec.md#preemption): when
 * the queue's head cannot start, the scheduler's sched_preempt picks the
 * running jobs of lower priority (preemptible ones) to stop for it; this
 * file tells their workers to stop with reason "preempt" (the stop of a
 * daemon shutdown: a checkpoint at the next step boundary, exit, nothing
 * exported) and remembers who was preempted for whom, so a victim is held
 * in the queue until its preemptor has started. sv_finish queues the
 * victim again once its last process is gone (run.preempted_by).
 *
 * Called by supervisor.c's tick only; calls sv_run and the store. Never
 * decides whom to preempt (the scheduler does) and never moves a job's
 * state itself: the stop is a message, the requeue sv_finish's.
 */
#include "daemon/sv_internal.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/msg.h"
#include "daemon/scheduler.h"

/* Whether the hold of victim for its preemptor still stands: the preemptor
 * has not started (no run, still queued or restarting). q: the tick's
 * queue, most preemptors are in it. */
static bool hold_stands(supervisor *sv, const char *by, const sched_job *q, size_t nq)
{
	if (sv_find_run(sv, by))
		return false; /* it started */
	for (size_t i = 0; i < nq; i++)
		if (strcmp(q[i].id, by) == 0)
			return true;
	store_job j;
	if (store_job_get(sv->st, by, &j) < 0)
		return false; /* deleted (or the store cannot say: do not hold on a guess) */
	bool waiting = j.state == JOB_QUEUED || j.state == JOB_RESTARTING;
	store_job_free(&j);
	return waiting;
}

void sv_preempt_hold(supervisor *sv, const sched_job *q, size_t nq, bool *held)
{
	int kept = 0;
	for (int k = 0; k < sv->npreempt_holds; k++) {
		struct preempt_hold *h = &sv->preempt_holds[k];
		if (!hold_stands(sv, h->by, q, nq))
			continue;
		sv->preempt_holds[kept++] = *h;
	}
	sv->npreempt_holds = kept;
	for (size_t i = 0; i < nq; i++) {
		held[i] = false;
		for (int k = 0; k < kept; k++)
			if (strcmp(q[i].id, sv->preempt_holds[k].victim) == 0)
				held[i] = true;
	}
}

/* Tells r's workers to checkpoint and stop for job by. */
static void preempt_run(supervisor *sv, run *r, const char *by, int by_priority, int priority)
{
	json_t *m = json_pack("{s:s, s:s}", "type", "stop", "reason", "preempt");
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->role == ROLE_WORKER && !r->kids[i]->exited)
			msg_send(r->kids[i]->p.sock, m);
	json_decref(m);
	r->stop_sent = true;
	r->stop_deadline_ms = sv_now_ms() + sv->cfg.stop_timeout_ms;
	snprintf(r->preempted_by, sizeof r->preempted_by, "%s", by);
	if (sv->npreempt_holds < (int)(sizeof sv->preempt_holds / sizeof sv->preempt_holds[0])) {
		struct preempt_hold *h = &sv->preempt_holds[sv->npreempt_holds++];
		snprintf(h->victim, sizeof h->victim, "%s", r->id);
		snprintf(h->by, sizeof h->by, "%s", by);
	}
	char note[200];
	snprintf(note, sizeof note, "preempting for %s (priority %d over %d): checkpointing at the next step",
		 by, by_priority, priority);
	store_job_note(sv->st, r->id, note);
	log_info("job %s: %s", r->id, note);
}

void sv_preempt_canceled(supervisor *sv, run *r)
{
	json_t *m = json_pack("{s:s, s:s}", "type", "stop", "reason", "cancel");
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->role == ROLE_WORKER && !r->kids[i]->exited)
			msg_send(r->kids[i]->p.sock, m);
	json_decref(m);
	char note[200];
	snprintf(note, sizeof note, "stopped (a cancel or max_runtime_seconds) while stopping for %s: it ends "
		 "canceled, not queued", r->preempted_by);
	store_job_note(sv->st, r->id, note);
	log_info("job %s: %s", r->id, note);
	r->preempted_by[0] = 0;
}

void sv_preempt_consider(supervisor *sv, const sched_job *q, size_t nq, const sched_machine *m)
{
	sched_victim v[SCHED_MAX_DEV];
	run *who[SCHED_MAX_DEV];
	size_t nv = 0;
	if (nq == 0)
		return;
	for (run *r = sv->runs; r && nv < SCHED_MAX_DEV; r = r->next) {
		if (r->is_dataset || r->multinode || r->ndev <= 0)
			continue;
		uint64_t devs = 0;
		for (int i = 0; i < r->ndev; i++)
			if (r->dev[i] >= 0 && r->dev[i] < SCHED_MAX_DEV)
				devs |= (uint64_t)1 << r->dev[i];
		/* a stopping (canceled) job had its stop sent by this tick's
		 * tick_running, before scheduling */
		bool leaving = r->killing || r->stop_sent || r->preempted_by[0];
		bool preemptible = json_is_true(json_object_get(r->spec, "preemptible"));
		int priority = 0;
		if (preemptible && !leaving) { /* its priority now: PATCH may have changed it */
			store_job j;
			if (store_job_get(sv->st, r->id, &j) < 0)
				continue; /* not known: not a victim */
			priority = j.priority;
			store_job_free(&j);
		}
		v[nv] = (sched_victim){devs, priority, r->start_ms, preemptible, leaving};
		who[nv++] = r;
	}
	sched_preemption p;
	sched_preempt(q, nq, m, v, nv, &p);
	if (!p.preempt)
		return;
	const sched_job *head = &q[p.job_idx];
	char note[80 + SCHED_MAX_DEV * 24]; /* every victim's id */
	int n = snprintf(note, sizeof note, "preempting %zu running job(s) to start:", p.nvictims);
	for (size_t k = 0; k < p.nvictims; k++) {
		run *r = who[p.victim[k]];
		preempt_run(sv, r, head->id, head->priority, v[p.victim[k]].priority);
		if (n > 0 && (size_t)n < sizeof note)
			n += snprintf(note + n, sizeof note - (size_t)n, " %s", r->id);
	}
	store_job_note(sv->st, head->id, note);
}
