/* sv_preempt — the tick's preemption (docs/jobspec.md#preemption): when
 * the queue's head cannot start, the scheduler's sched_preempt picks the
 * running jobs of lower priority (preemptible ones) to stop for it; this
 * file tells their workers to stop with reason "preempt" (the stop of a
 * daemon shutdown: a checkpoint at the next step boundary, exit, nothing
 * exported) and remembers who was preempted for whom, so a victim is held
 * in the queue until its preemptor has started. sv_finish queues the
 * victim again once its last process is gone (run.preempted_by). The holds
 * are kept in the store too (store_preempt_hold_*): a daemon started after
 * a crash or a restart reads them back (sv_preempt_load), and an adopted
 * attempt that was stopping for its preemptor is asked again
 * (sv_preempt_adopted), so a victim never takes the devices back from a
 * preemptor that has not started. Multi-node jobs are never victims: Slurm
 * places them, so stopping one frees none of this machine's devices (the
 * job spec refuses "preemptible" for them).
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

/* Adds victim's hold for by, in memory and in the store (replacing an
 * earlier one of victim's). */
static void hold_add(supervisor *sv, const char *victim, const char *by)
{
	int k = 0;
	while (k < sv->npreempt_holds && strcmp(sv->preempt_holds[k].victim, victim) != 0)
		k++;
	if (k == sv->npreempt_holds) {
		if (k >= (int)(sizeof sv->preempt_holds / sizeof sv->preempt_holds[0]))
			return;
		sv->npreempt_holds++;
	}
	struct preempt_hold *h = &sv->preempt_holds[k];
	snprintf(h->victim, sizeof h->victim, "%s", victim);
	snprintf(h->by, sizeof h->by, "%s", by);
	h->noted = true; /* "preempting for ..." says it */
	int rc = store_preempt_hold_put(sv->st, victim, by);
	if (rc < 0)
		log_warn("job %s: its hold until %s starts is not stored (%s); a daemon restart forgets it", victim,
			 by, strerror(-rc));
}

/* victim's hold in memory, or NULL. */
static const struct preempt_hold *hold_of(const supervisor *sv, const char *victim)
{
	for (int k = 0; k < sv->npreempt_holds; k++)
		if (strcmp(sv->preempt_holds[k].victim, victim) == 0)
			return &sv->preempt_holds[k];
	return NULL;
}

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
		if (!hold_stands(sv, h->by, q, nq)) {
			/* a failed drop leaves a row the next start reads back and drops at its first pass */
			store_preempt_hold_drop(sv->st, h->victim);
			continue;
		}
		sv->preempt_holds[kept++] = *h;
	}
	sv->npreempt_holds = kept;
	for (size_t i = 0; i < nq; i++) {
		held[i] = false;
		for (int k = 0; k < kept; k++) {
			struct preempt_hold *h = &sv->preempt_holds[k];
			if (strcmp(q[i].id, h->victim) != 0)
				continue;
			held[i] = true;
			if (!h->noted) { /* read back at start: say why it does not start */
				char note[160];
				snprintf(note, sizeof note, "held in the queue until %s starts (preempted for it "
					 "before the daemon restarted)", h->by);
				store_job_note(sv->st, h->victim, note);
				h->noted = true;
			}
		}
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
	hold_add(sv, r->id, by);
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
		bool preemptible = false;
		int priority = 0;
		if (!leaving) { /* as it is now: PATCH may have changed its priority and preemptible */
			store_job j;
			if (store_job_get(sv->st, r->id, &j) < 0)
				continue; /* not known: not a victim */
			json_t *spec = j.spec_json ? json_loads(j.spec_json, 0, NULL) : NULL;
			preemptible = json_is_true(json_object_get(spec, "preemptible"));
			json_decref(spec);
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

void sv_preempt_load(supervisor *sv)
{
	store_preempt_hold *h = NULL;
	size_t n = 0;
	int rc = store_preempt_holds(sv->st, &h, &n);
	if (rc < 0) {
		log_warn("preemption holds not read (%s): a job preempted before this start may start ahead of "
			 "its preemptor", strerror(-rc));
		return;
	}
	sv->npreempt_holds = 0;
	for (size_t i = 0; i < n; i++) {
		int cap = (int)(sizeof sv->preempt_holds / sizeof sv->preempt_holds[0]);
		if (sv->npreempt_holds >= cap || strlen(h[i].victim) >= sizeof sv->preempt_holds[0].victim ||
		    strlen(h[i].by) >= sizeof sv->preempt_holds[0].by)
			continue;
		struct preempt_hold *p = &sv->preempt_holds[sv->npreempt_holds++];
		snprintf(p->victim, sizeof p->victim, "%s", h[i].victim);
		snprintf(p->by, sizeof p->by, "%s", h[i].by);
		p->noted = false;
		log_info("job %s: held in the queue until %s starts (preempted for it before this start)", p->victim,
			 p->by);
	}
	store_preempt_holds_free(h, n);
}

void sv_preempt_adopted(supervisor *sv, run *r)
{
	const struct preempt_hold *h = hold_of(sv, r->id);
	if (!h || r->is_dataset || r->multinode)
		return;
	store_job by;
	bool waiting = false;
	if (store_job_get(sv->st, h->by, &by) == 0) {
		waiting = by.state == JOB_QUEUED || by.state == JOB_RESTARTING;
		store_job_free(&by);
	}
	if (!waiting)
		return; /* its preemptor started or is gone: the attempt runs on */
	json_t *m = json_pack("{s:s, s:s}", "type", "stop", "reason", "preempt");
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->role == ROLE_WORKER && !r->kids[i]->exited && r->kids[i]->p.sock >= 0)
			msg_send(r->kids[i]->p.sock, m);
	json_decref(m);
	r->stop_sent = true;
	r->stop_deadline_ms = sv_now_ms() + sv->cfg.stop_timeout_ms;
	snprintf(r->preempted_by, sizeof r->preempted_by, "%s", h->by);
	char note[200];
	snprintf(note, sizeof note, "daemon restarted while it stopped for %s: asked again to checkpoint and stop",
		 h->by);
	store_job_note(sv->st, r->id, note);
	log_info("job %s: %s", r->id, note);
}
