/* sv_report — what a job's workers and loaders report over their sockets
 * (the worker protocol, docs/formats.md): hello, progress, metrics and eval
 * rows, checkpoints, exports, errors, a relayed rank's bye, rank 0's
 * account of the data, the NCCL id. They become store rows (metrics,
 * checkpoints, outcome, job events), TensorBoard rows, the starting ->
 * running transition, and the attempt's verdict (a diverged loss fails the
 * job, not retried).
 *
 * Never spawns or reaps a process and never moves a job to its end state:
 * a failure is a verdict (sv_set_failure) and, where the attempt cannot go
 * on, sv_run_kill_all; sv_finish decides the rest. Calls sv_stall and
 * sv_run only.
 */
#include "daemon/sv_internal.h"

#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/chan.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/msg.h"
#include "daemon/tbevents.h"
#include "daemon/telemetry_sampler.h"

/* A worker's error that says the training diverged: a loss or gradient norm
 * that is not finite. The worker reports it as {"code": "internal",
 * "message": "step N: gradient norm is not finite (loss L)"} (train.c, the
 * device loops); a "non_finite" code with a "step" is taken as well. *step
 * gets the step (steps done before the one that diverged; -1 if not said),
 * *what the message without its "step N: ". */
static bool diverged_report(json_t *m, const char *code, const char *msg, long long *step, const char **what)
{
	*step = -1;
	*what = msg ? msg : "the loss or gradient norm is not finite";
	if (!(code && strcmp(code, "non_finite") == 0) && !(msg && strstr(msg, "not finite")))
		return false;
	json_t *js = json_object_get(m, "step");
	int used = 0;
	if (json_is_integer(js))
		*step = json_integer_value(js);
	else if (msg && sscanf(msg, "step %lld: %n", step, &used) == 1 && used > 0)
		*what = msg + used;
	else if (msg && sscanf(msg, "step %lld", step) != 1)
		*step = -1;
	return true;
}

static void fail_diverged(run *r, child *c, long long step, const char *what)
{
	char at[40] = "";
	if (step >= 0)
		snprintf(at, sizeof at, " after step %lld", step);
	sv_set_failure(r, false,
		    "training diverged%s: rank %d: %s; not retried (a restart from the last checkpoint would repeat it)",
		    at, c->index, what);
}

/* Stores vals as metrics row `step` over the keys that row already has: a
 * step's training figures ("metrics") and its held-out evaluation ("eval")
 * come in two messages, in either order (docs/api.md, job_metrics). */
static void metric_row_merge(supervisor *sv, run *r, int64_t step, int64_t time_ms, json_t *vals)
{
	store_metric *old = NULL;
	size_t n = 0;
	json_t *row = NULL;
	if (store_metric_list(sv->st, r->id, step - 1, 1, &old, &n) == 0 && n == 1 && old[0].step == step)
		row = json_loads(old[0].values_json, 0, NULL);
	store_metrics_free(old, n);
	if (json_is_object(row)) {
		json_object_update(row, vals);
	} else {
		json_decref(row);
		row = json_incref(vals);
	}
	char *text = json_dumps(row, JSON_COMPACT);
	if (text)
		store_metric_insert(sv->st, r->id, step, time_ms, text);
	free(text);
	json_decref(row);
}

/* Worker rank 0's account of what the job trains on ({"type":"data"},
 * docs/formats.md), sent once it indexed the dataset: kept for the job's
 * representation. When more than 1% of the training documents' tokens are
 * never trained on, a warning event names the causes (once per account,
 * not again at each restart that reports the same). */
static void job_data_report(supervisor *sv, run *r, json_t *m)
{
	json_t *vals = json_deep_copy(m);
	char *text = NULL;
	bool changed = false;
	if (!vals)
		return;
	json_object_del(vals, "type");
	text = json_dumps(vals, JSON_COMPACT | JSON_SORT_KEYS);
	if (!text || store_job_data_set(sv->st, r->id, text, &changed) < 0 || !changed)
		goto out;
	json_int_t corpus = json_integer_value(json_object_get(vals, "corpus_tokens"));
	json_int_t dropped = json_integer_value(json_object_get(vals, "tokens_dropped"));
	if (corpus <= 0 || dropped * 100 <= corpus)
		goto out;
	char why[256] = "";
	size_t n = 0;
	const char *key;
	json_t *v;
	json_object_foreach(json_object_get(vals, "dropped"), key, v) {
		if (json_integer_value(v) > 0 && n < sizeof why)
			n += (size_t)snprintf(why + n, sizeof why - n, "%s%s %lld", n ? ", " : "", key,
					      (long long)json_integer_value(v));
	}
	char note[512];
	snprintf(note, sizeof note,
		 "warning: %lld of the %lld tokens the job trains on (%.1f%%) are dropped in every epoch (%s); "
		 "mlm.drop_long_sentences false keeps them",
		 (long long)dropped, (long long)corpus, 100.0 * (double)dropped / (double)corpus,
		 why[0] ? why : "see data.dropped");
	log_warn("job %s: %s", r->id, note + strlen("warning: "));
	store_job_note(sv->st, r->id, note);
out:
	free(text);
	json_decref(vals);
}

/* Records v (an object; anything else is ignored) as the job's outcome
 * member key (store_job.outcome_json). */
static void note_outcome(supervisor *sv, run *r, const char *key, json_t *v)
{
	if (!json_is_object(v))
		return;
	json_t *patch = json_pack("{s:O}", key, v);
	char *text = patch ? json_dumps(patch, JSON_COMPACT) : NULL;
	if (text && store_job_merge_outcome(sv->st, r->id, text) < 0)
		log_warn("job %s: cannot record its %s", r->id, key);
	free(text);
	json_decref(patch);
}

/* relaykv's way out: m to the worker of rank rank, if it is still there. */
static int send_to_rank(void *ctx, int rank, json_t *m)
{
	run *r = ctx;
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->role == ROLE_WORKER && r->kids[i]->index == rank && !r->kids[i]->exited)
			return msg_send(r->kids[i]->p.sock, m);
	return -ENOENT;
}

void sv_report_handle_job_message(supervisor *sv, run *r, child *c, json_t *m)
{
	const char *type = json_string_value(json_object_get(m, "type"));
	if (!type)
		return;
	sv_stall_note_progress(r, c, type);
	if (strcmp(type, "progress") == 0) {
		/* the worker's heartbeat from its step loop: {"type":"progress","step":N} */
		c->heartbeat = true;
		json_int_t step = json_integer_value(json_object_get(m, "step"));
		if (c->index == 0 && step > r->last_step)
			r->last_step = step;
	} else if (strcmp(type, "hello") == 0) {
		if (c->role == ROLE_WORKER && ++r->hellos == r->world && !r->saw_running) {
			r->saw_running = true;
			store_job_transition(sv->st, r->id, JOB_MASK(JOB_STARTING), JOB_RUNNING,
					     "all workers started", NULL);
		}
	} else if (strcmp(type, "metrics") == 0) {
		json_int_t step = json_integer_value(json_object_get(m, "step"));
		r->last_step = step;
		/* JSON has no NaN: a worker that cannot say the loss sends null */
		json_t *loss = json_object_get(m, "loss");
		if (loss && !(json_is_number(loss) && isfinite(json_number_value(loss)))) {
			fail_diverged(r, c, step, "the loss is not finite");
			sv_run_kill_all(r, SIGTERM);
		}
		json_t *vals = json_deep_copy(m);
		json_object_del(vals, "type");
		json_object_del(vals, "step");
		if (r->ts)
			tsampler_flush(r->ts, vals);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		metric_row_merge(sv, r, step, ms, vals);
		tbevents_append_row(r->dir, step, ms, vals);
		json_decref(vals);
		if (!r->saw_running) {
			r->saw_running = true;
			store_job_transition(sv->st, r->id, JOB_MASK(JOB_STARTING), JOB_RUNNING,
					     "training", NULL);
		}
	} else if (strcmp(type, "eval") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		/* {"type":"eval","step":N,"eval_loss":..,"perplexity":..,"eval_accuracy":..}
		 * (every rank has the same sums; rank 0 reports): keys of row N */
		json_int_t step = json_integer_value(json_object_get(m, "step"));
		json_t *vals = json_deep_copy(m);
		json_object_del(vals, "type");
		json_object_del(vals, "step");
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		if (step >= 0 && json_is_object(vals)) {
			metric_row_merge(sv, r, step, ms, vals);
			tbevents_append_row(r->dir, step, ms, vals);
		}
		json_decref(vals);
	} else if (strcmp(type, "checkpoint") == 0) {
		store_checkpoint ck = {
			.step = json_integer_value(json_object_get(m, "step")),
			.path = (char *)json_string_value(json_object_get(m, "path")),
			.bytes = json_integer_value(json_object_get(m, "bytes")),
		};
		if (ck.path)
			store_checkpoint_insert(sv->st, r->id, &ck);
		note_outcome(sv, r, "best_model", json_object_get(m, "best_model"));
		sv_note_runtime(sv, r);
		/* keep-last-N pruning happened in the worker: forget the rest */
		json_t *present = json_object_get(m, "present_steps");
		store_checkpoint *cks = NULL;
		size_t n = 0;
		if (json_is_array(present) && store_checkpoint_list(sv->st, r->id, &cks, &n) == 0) {
			for (size_t i = 0; i < n; i++) {
				bool keep = false;
				size_t k;
				json_t *v;
				json_array_foreach(present, k, v)
					keep |= json_integer_value(v) == cks[i].step;
				if (!keep)
					store_checkpoint_delete(sv->st, r->id, cks[i].step);
			}
		}
		store_checkpoints_free(cks, n);
	} else if (strcmp(type, "exported") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		/* {"type":"exported","path":..,"step":N,"source":"final"|"best"|"stopped"} */
		json_t *ex = json_pack("{s:O?, s:O?}", "step", json_object_get(m, "step"), "source",
				       json_object_get(m, "source"));
		note_outcome(sv, r, "export", ex);
		json_decref(ex);
	} else if (strcmp(type, "error") == 0) {
		const char *code = json_string_value(json_object_get(m, "code"));
		const char *msg = json_string_value(json_object_get(m, "message"));
		long long at;
		const char *what;
		if (diverged_report(m, code, msg, &at, &what)) {
			fail_diverged(r, c, at, what);
			return;
		}
		bool retry = code && (strcmp(code, "peer_lost") == 0 || strcmp(code, "internal") == 0);
		sv_set_failure(r, retry, "%s %d: %s%s%s", c->role == ROLE_LOADER ? "loader" : "rank", c->index,
			    code ? code : "error", msg ? ": " : "", msg ? msg : "");
	} else if (strcmp(type, "bye") == 0 && c->relayed) {
		c->said_bye = true; /* its connection closing next is no loss */
		/* a rank's bad exit ends the attempt on every node, as a local
		 * worker's does (srun alone would wait for the others) */
		int code = (int)json_integer_value(json_object_get(m, "code"));
		c->bye_code = code;
		if (code != BERTD_EXIT_OK && code != BERTD_EXIT_STOPPED && !r->killing) {
			sv_set_failure(r, code == BERTD_EXIT_FAILURE || code == BERTD_EXIT_PEER_LOST,
				    "rank %d on node %s ended with exit %d", c->index, r->rank_node[c->index], code);
			sv_run_kill_all(r, SIGTERM);
		}
	} else if (strcmp(type, "data") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		job_data_report(sv, r, m);
	} else if (c->role == ROLE_WORKER && relaykv_is_message(m)) {
		/* the net comm backend's rendezvous (daemon/relaykv.h) */
		if (relaykv_handle(&r->kv, r->id, c->index, m, send_to_rank, r) < 0)
			log_warn("job %s: rank %d: out of memory for its key/value message", r->id, c->index);
	} else if (strcmp(type, "nccl_id") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		/* rank 0 made the communicator id; every other rank needs it */
		for (int i = 0; i < r->nkids; i++) {
			child *k = r->kids[i];
			if (k->role == ROLE_WORKER && k->index != 0 && !k->exited)
				msg_send(k->p.sock, m);
		}
	}
}

/* {"type":"attach"}: a child this daemon adopts names its protocol and
 * who it is (common/chan.h). A version this daemon does not know, or an
 * identity that is not the recorded one, ends the attempt: the job goes
 * back to restarting, from its last checkpoint. */
static void attach_check(supervisor *sv, run *r, child *c, json_t *m)
{
	json_int_t proto = json_integer_value(json_object_get(m, "proto"));
	json_int_t pid = json_integer_value(json_object_get(m, "pid"));
	uint64_t st = (uint64_t)json_integer_value(json_object_get(m, "start_time"));
	char note[400] = "";
	if (proto < CHAN_PROTO_MIN || proto > CHAN_PROTO)
		snprintf(note, sizeof note,
			 "%s %d speaks worker protocol version %lld; this bertd adopts versions %d to %d: not adopted, "
			 "restarting from the last checkpoint",
			 c->role == ROLE_LOADER ? "loader" : "rank", c->index, (long long)proto, CHAN_PROTO_MIN, CHAN_PROTO);
	else if (!c->relayed && (pid != c->p.pid || st != c->start_time)) /* a relayed rank: its token */
		snprintf(note, sizeof note, "rank %d's socket answered as pid %lld, not the recorded pid %d: not "
			 "adopted, restarting from the last checkpoint", c->index, (long long)pid, (int)c->p.pid);
	if (!note[0]) {
		log_info("job %s: rank %d attached (protocol %lld, %lld bytes it kept meanwhile)", r->id, c->index,
			 (long long)proto, (long long)json_integer_value(json_object_get(m, "queued")));
		return;
	}
	log_warn("job %s: %s", r->id, note);
	store_job_note(sv->st, r->id, note);
	r->requeue = true;
	sv_set_failure(r, true, "%s", note);
	sv_run_kill_all(r, SIGKILL);
}

int sv_report_input(supervisor *sv, run *r, child *c)
{
	json_t *m;
	uint64_t seq;
	bool attach;
	int rc;
	while ((rc = sv_child_next_message(c, &m, &seq, &attach)) == 1) {
		if (attach) {
			attach_check(sv, r, c, m);
		} else {
			json_object_del(m, "seq");
			sv_report_handle_job_message(sv, r, c, m);
			if (seq)
				c->seq_done = seq;
		}
		json_decref(m);
	}
	sv_child_ack(c); /* handled and stored: the child may forget them */
	return rc < 0 ? rc : 0;
}
