/* sv_finish — the end of a job's attempt, once its last child is gone
 * (sv_run_maybe_finish through the run's on_end, which sv_launch sets):
 * its shared memory removed, its devices freed, a multi-node attempt's
 * relay closed and its Slurm step canceled, the stall suspect cleared, its
 * wall time recorded, and the job's next state: queued again (shutdown,
 * or preempted: sv_preempt.c), canceled, completed, restarting (a
 * retryable failure with restarts left) or failed. Frees the run.
 *
 * Calls sv_relay, sv_stall and sv_run only; never signals a process or
 * reads a child's messages (the attempt is over when it runs).
 */
#include "daemon/sv_internal.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include "common/jobspec.h"
#include "common/log.h"
#include "daemon/cluster.h"
#include "daemon/telemetry.h"

static void free_dev_ids(supervisor *sv, run *r)
{
	for (int i = 0; i < r->ndev; i++) {
		int d = r->dev[i];
		if (d >= 0 && (size_t)d < sv->ndev) {
			free((char *)sv->dev_job[d]);
			sv->dev_job[d] = NULL;
		}
	}
	r->ndev = 0;
}

const char *sv_canceled_by(supervisor *sv, const char *id, char *buf, size_t cap)
{
	char *by = NULL;
	store_job_stop_by(sv->st, id, &by);
	snprintf(buf, cap, "canceled by %s", by ? by : "user");
	free(by);
	return buf;
}

/* r was preempted and its workers stopped: back to queued (from live),
 * the event naming its preemptor, and the job's "preemption" record
 * (count, by, at_ms) in its outcome; count: preemptions before this one. */
static void requeue_preempted(supervisor *sv, run *r, unsigned live, json_int_t count)
{
	char why[200];
	snprintf(why, sizeof why, "preempted by %s; resumes from its checkpoint", r->preempted_by);
	if (store_job_transition(sv->st, r->id, live, JOB_QUEUED, why, NULL) < 0)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	json_t *patch = json_pack("{s:{s:I, s:s, s:I}}", "preemption", "count", count + 1, "by", r->preempted_by,
				  "at_ms", (json_int_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
	char *text = patch ? json_dumps(patch, JSON_COMPACT) : NULL;
	if (text)
		store_job_merge_outcome(sv->st, r->id, text);
	free(text);
	json_decref(patch);
	log_info("job %s: %s", r->id, why);
}

/* A job's run, unlinked, with no child left (sv_run_maybe_finish): the
 * job's next state. Frees r. */
void sv_finish_job(supervisor *sv, run *r)
{
	char shm[120];
	sv_shm_name_for(r->id, shm, sizeof shm);
	shm_unlink(shm); /* whoever created it, the job is over */
	snprintf(shm, sizeof shm, "/bertd-%s-comm", r->id);
	shm_unlink(shm);
	free_dev_ids(sv, r);
	if (r->multinode) {
		sv_relay_close_all(sv, r);
		cluster_fence_close(&r->ca); /* a rank still running somewhere writes nothing now */
		/* srun is gone; whatever its step left on a node goes too */
		cluster_scancel(&r->ca, sv->cfg.slurm_srun, sv->cfg.slurm_conf);
	}
	sv_stall_note(sv, r, NULL, 0, 0, false); /* the attempt is over: nothing is silent now */
	char rec[1100];
	snprintf(rec, sizeof rec, "%s/attempt.json", r->dir);
	unlink(rec); /* nothing of it to adopt */
	sv_note_runtime(sv, r);

	store_job cur;
	if (store_job_get(sv->st, r->id, &cur) < 0) {
		sv_run_free(r);
		return;
	}
	enum job_state state = cur.state;
	int restarts = cur.restart_count;
	json_t *outcome = cur.outcome_json ? json_loads(cur.outcome_json, 0, NULL) : NULL;
	json_int_t preemptions =
		json_integer_value(json_object_get(json_object_get(outcome, "preemption"), "count"));
	json_decref(outcome);
	store_job_free(&cur);
	unsigned live = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING) | JOB_MASK(JOB_STOPPING);
	jobspec spec;
	jobspec_error jerr;
	bool spec_ok = jobspec_from_json(r->spec, &spec, &jerr) == 0;
	int max_restarts = spec_ok ? spec.max_restarts : 0;
	/* its last step was logged: it finished before the preemption's stop reached it */
	bool all_steps = spec_ok && r->last_step >= spec.training.max_steps;

	if (r->shutdown) {
		store_job_transition(sv->st, r->id, live, JOB_QUEUED, "daemon shutting down; resumes on next start",
				     NULL);
	} else if (r->requeue && state != JOB_STOPPING) {
		/* an attempt this daemon would not adopt: resumed, no restart counted */
		store_job_transition(sv->st, r->id, live, JOB_RESTARTING, r->reason, NULL);
	} else if (state == JOB_STOPPING && (!r->failed || r->stop_sent)) {
		char who[200];
		const char *why = r->reason[0] && !r->stop_sent ? r->reason : r->stop_why;
		if (!why || strcmp(why, SV_STOP_USER) == 0)
			why = sv_canceled_by(sv, r->id, who, sizeof who);
		if (store_job_transition(sv->st, r->id, JOB_MASK(JOB_STOPPING), JOB_CANCELED, why, NULL) == 0)
			telemetry_job_finished(JOB_CANCELED);
	} else if (r->preempted_by[0] && !r->failed && !all_steps) {
		requeue_preempted(sv, r, live, preemptions);
	} else if (!r->failed) {
		if (store_job_transition(sv->st, r->id, live, JOB_COMPLETED, "training finished", NULL) == 0)
			telemetry_job_finished(JOB_COMPLETED);
	} else if (r->retryable && restarts < max_restarts) {
		int n = 0;
		store_job_bump_restarts(sv->st, r->id, &n);
		char why[640];
		snprintf(why, sizeof why, "%s; restart %d of %d from the last checkpoint", r->reason, n, max_restarts);
		store_job_transition(sv->st, r->id, live, JOB_RESTARTING, why, NULL);
		telemetry_job_restarted();
		log_info("job %s: %s", r->id, why);
	} else {
		char why[640];
		snprintf(why, sizeof why, "%s%s", r->reason,
			 r->retryable ? " (no restarts left)" : "");
		if (store_job_transition(sv->st, r->id, live, JOB_FAILED, why, NULL) == 0)
			telemetry_job_finished(JOB_FAILED);
		log_warn("job %s failed: %s", r->id, why);
	}
	sv_run_free(r);
}
