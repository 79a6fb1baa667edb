/* loop — see loop.h. Reads top to bottom: batches, the ranks' per-step
 * sums, checkpoints, the logging window, the end of a run, the step loop.
 * Times are host seconds from worker_now_s; the window's figures are ms. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/exitcodes.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "loader/batch.h"
#include "worker/fence.h"
#include "worker/hf.h"
#include "worker/loop.h"
#include "worker/worker.h"

#define RING_WAIT_MS 1000 /* one bounded wait; the loop re-checks stop and peers */

/* ---- batches ---- */

/* Points b at the batch in slot, flattening the per-sequence masked
 * positions (B, P) into the model's (n_pred,) b*T+t form. */
static int slot_to_batch(worker *w, const void *slot, int micro, bert_batch *b)
{
	const batch_header *h = slot;
	const batch_layout *l = &w->bj.ring.layout;
	const uint64_t M = (uint64_t)w->bj.spec.training.gradient_accumulation_steps;
	uint64_t want = ((uint64_t)w->tr->step * M + (uint64_t)micro) * (uint64_t)w->world + (uint64_t)w->rank;
	if (batch_header_check(h, l) < 0 || h->global != want || h->rank != (uint32_t)w->rank)
		return -EPROTO;
	const char *base = slot;
	const int32_t *pos = (const int32_t *)(base + h->off_mlm_positions);
	const int32_t *lab = (const int32_t *)(base + h->off_mlm_labels);
	const int32_t *npred = (const int32_t *)(base + h->off_n_pred);
	int32_t *fp = w->mlm_pos + (size_t)micro * l->B * l->P;
	int32_t *fl = w->mlm_lab + (size_t)micro * l->B * l->P;
	int m = 0;
	for (uint32_t s = 0; s < l->B; s++) {
		for (int i = 0; i < npred[s] && (uint32_t)i < l->P; i++) {
			fp[m] = (int32_t)(s * l->T) + pos[s * l->P + i];
			fl[m] = lab[s * l->P + i];
			m++;
		}
	}
	*b = (bert_batch){
		.B = (int)l->B, .T = (int)l->T, .M = m,
		.input_ids = (const int32_t *)(base + h->off_input_ids),
		.token_type_ids = (const int32_t *)(base + h->off_token_type_ids),
		.seq_lens = (const int32_t *)(base + h->off_seq_lens),
		.mlm_positions = fp, .mlm_labels = fl,
		.nsp_labels = (h->flags & BATCH_FLAG_NSP) ? (const int32_t *)(base + h->off_nsp_labels) : NULL,
	};
	w->win.tokens += h->n_tokens;
	w->epoch = h->epoch;
	return 0;
}

/* Micro-batch k of this step into *b: from the ring (*from_ring: the caller
 * releases the slot once the device has stopped reading it) or built here
 * into local_slot[k]. Returns 0, BERTD_EXIT_STOPPED when a stop came while
 * starved, or the exit code (already reported). */
static int next_batch(worker *w, int k, bert_batch *b, bool *from_ring)
{
	const batch_layout *l = &w->bj.ring.layout;
	const int M = w->bj.spec.training.gradient_accumulation_steps;
	void *slot = NULL;
	int rc;
	*from_ring = false;
	if (w->rg) {
		while ((rc = ring_next(w->rg, (uint32_t)w->ring_rank, RING_WAIT_MS, &slot)) == -ETIMEDOUT) {
			char why[300];
			if (nodeloaders_check(&w->nl, why, sizeof why) < 0)
				return worker_fail(w, BERTD_EXIT_DATA, "no batch from the loaders: %s", why);
			worker_poll(w);
			if (w->world == 1 && w->stop_requested)
				return BERTD_EXIT_STOPPED;
		}
		if (rc == RING_END)
			return worker_fail(w, BERTD_EXIT_DATA, "the batch stream ended at step %ld", w->tr->step);
		if (rc < 0)
			return worker_fail(w, BERTD_EXIT_DATA, "no batch from the loaders: %s", strerror(-rc));
		*from_ring = true;
	} else {
		uint64_t global = ((uint64_t)w->tr->step * (uint64_t)M + (uint64_t)k) * (uint64_t)w->world +
				  (uint64_t)w->rank;
		slot = (char *)w->local_slot + (size_t)k * l->slot_bytes;
		batchjob_simulated_delay(&w->bj);
		if ((rc = batchjob_batch_build(&w->data, l, (uint32_t)w->world, (uint32_t)M, global, slot)) < 0)
			return worker_fail(w, BERTD_EXIT_DATA, "building batch %llu: %s", (unsigned long long)global,
					   strerror(-rc));
	}
	if (slot_to_batch(w, slot, k, b) < 0) {
		if (*from_ring)
			ring_release(w->rg, (uint32_t)w->ring_rank);
		return worker_fail(w, BERTD_EXIT_DATA, "batch slot failed its header check");
	}
	return 0;
}

/* ---- the ranks' per-step sums ---- */

/* Sums the step's loss, the window's tokens, the stop flag and each rank's
 * busy time (data + forward/backward: in its own slot, so rank 0 can name a
 * straggler) over the ranks; *loss comes back averaged, *tokens summed. */
static int sum_over_ranks(worker *w, double *loss, double *tokens, double busy_s)
{
	int nr = w->world <= LOOP_WIN_MAX_RANKS ? w->world : 0;
	double s[3 + LOOP_WIN_MAX_RANKS] = {*loss, w->win.tokens, w->stop_requested ? 1.0 : 0.0};
	if (nr)
		s[3 + w->rank] = busy_s;
	int rc = comm_allreduce_sum_f64(w->cm, s, 3 + nr);
	if (rc < 0)
		return rc;
	*loss = s[0] / w->world;
	*tokens = s[1];
	if (s[2] > 0)
		w->stop_requested = true; /* any rank's stop stops all, same step */
	for (int k = 0; k < nr; k++)
		w->win.rank_busy_s[k] += s[3 + k];
	return 0;
}

/* Replicas are identical by construction (same init, same all-reduced
 * gradients, same update): every rank compares its parameters, on the host,
 * at a save step, before rank 0 checkpoints, so a diverged state is never
 * saved. Returns 0, or the exit code (already reported). */
static int check_replicas(worker *w, const loop_device *dev, long step)
{
	int rc = dev->to_host ? dev->to_host(dev->ctx, false, NULL) : 0;
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "copying parameters from the device: %s", strerror(-rc));
	rc = comm_replicas_agree(w->cm, w->tr->model->params_memory, w->tr->model->num_params * sizeof(float));
	if (rc == 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "the ranks' parameters differ at step %ld: a replica "
				   "diverged (restarting from the last checkpoint)", step);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "checking replicas: %s", strerror(-rc));
	return 0;
}

/* ---- checkpoints ---- */

/* The metric_for_best_model of an evaluation. */
static double best_metric_of(const worker *w, const eval_result *r)
{
	const char *m = w->bj.spec.training.metric_for_best_model;
	return strcmp(m, "perplexity") == 0 ? r->perplexity : strcmp(m, "eval_accuracy") == 0 ? r->accuracy : r->loss;
}

/* The best checkpoint so far as JSON ({"step", "metric", "value"}), or
 * NULL when none was evaluated yet. */
static json_t *best_json(const worker *w)
{
	if (w->best.step < 0)
		return NULL;
	return json_pack("{s:I, s:s, s:f}", "step", (json_int_t)w->best.step, "metric",
			 w->bj.spec.training.metric_for_best_model, "value", w->best.value);
}

/* Rank 0: copies the device's state into the host trainer, saves
 * ckpt-<step>, offers it as the best when this step was evaluated, prunes
 * to save_total_limit (never the best) and tells the daemon which
 * checkpoints now exist. Returns 0 or the exit code (already reported). */
static int save_checkpoint(worker *w, const loop_device *dev, const char *what)
{
	char err[512];
	trainer *t = w->tr;
	const jobspec_training *ta = &w->bj.spec.training;
	if (w->eval && w->last_eval_step == t->step)
		best_offer(&w->best, t->step, best_metric_of(w, &w->last_eval), ta->greater_is_better == 1);
	checkpoint_scaler ls = checkpoint_scaler_disabled();
	int rc = dev->to_host ? dev->to_host(dev->ctx, true, &ls) : 0;
	if (rc == -EPIPE)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "a peer was lost before copying the model back");
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "copying the model from the device: %s",
				   strerror(-rc));
	json_t *extra = json_pack("{s:I, s:i}", "epoch", (json_int_t)w->epoch, "world_size", w->world);
	json_t *best = best_json(w);
	if (best)
		json_object_set(extra, "best_model", best);
	rc = checkpoint_save_scaled(w->checkpoint_dir, t->step, t->model, t->opt, &ls, extra, 0, err, sizeof err);
	json_decref(extra);
	if (rc < 0) {
		json_decref(best);
		return worker_fail(w, rc == -ESTALE ? BERTD_EXIT_PEER_LOST : BERTD_EXIT_IO, "writing %s: %s", what,
				   err);
	}
	checkpoint_prune(w->checkpoint_dir, ta->save_total_limit, w->best.step);
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/ckpt-%ld", w->checkpoint_dir, t->step);
	json_t *present = json_array();
	DIR *d = opendir(w->checkpoint_dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long s;
		char tail;
		if (sscanf(e->d_name, "ckpt-%ld%c", &s, &tail) == 1)
			json_array_append_new(present, json_integer(s));
	}
	if (d)
		closedir(d);
	json_t *m = json_pack("{s:s, s:I, s:s, s:I, s:o}", "type", "checkpoint", "step", (json_int_t)t->step,
			      "path", path, "bytes", (json_int_t)fs_dir_bytes(path), "present_steps", present);
	if (m && best)
		json_object_set(m, "best_model", best);
	json_decref(best);
	worker_send(w, m);
	log_info("checkpoint %s", path);
	return 0;
}

/* ---- the logging window ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank 95th percentile of phase p over the window's n kept steps. */
static double window_p95(const worker *w, size_t n, int p)
{
	static double scratch[LOOP_WIN_STEPS_MAX];
	for (size_t i = 0; i < n; i++)
		scratch[i] = w->win_ph[i][p];
	qsort(scratch, n, sizeof *scratch, cmp_double);
	size_t rank = (n * 95 + 99) / 100;
	return scratch[rank ? rank - 1 : 0];
}

/* Rank 0: adds the window's step-time breakdown to metrics message m:
 * per-step means (phases_ms), p95s (phases_p95_ms, step_time_p95_ms), the
 * loader ring's counters and each rank's busy time (docs/diagnosis.md). */
static void add_window_timing(worker *w, json_t *m)
{
	const double n = (double)w->win.steps, *s = w->win.phase_s;
	size_t kept = w->win.steps < LOOP_WIN_STEPS_MAX ? (size_t)w->win.steps : LOOP_WIN_STEPS_MAX;
	/* the rest of the step after data, h2d and all-reduce is split between
	 * forward/backward and optimizer as their sums are (compute >= 0 each step) */
	double data = 1000.0 * s[PH_DATA] / n, ar = 1000.0 * s[PH_ALLREDUCE] / n, h2d = 1000.0 * s[PH_H2D] / n;
	double rest = 1000.0 * (s[PH_STEP] - s[PH_DATA] - s[PH_ALLREDUCE] - s[PH_H2D]) / n;
	double split = s[PH_COMPUTE] + s[PH_OPTIMIZER];
	double opt = split > 0 ? rest * s[PH_OPTIMIZER] / split : 0;
	json_object_set_new(m, "phases_ms",
			    json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "data_wait", data, "h2d", h2d, /* CPU: 0 */
				      "compute", rest - opt, "allreduce", ar, "optimizer", opt, "checkpoint",
				      1000.0 * w->win.ckpt_s / n));
	if (w->eval) /* like checkpoint: outside the step, per step of the window */
		json_object_set_new(json_object_get(m, "phases_ms"), "eval", json_real(1000.0 * w->win.eval_s / n));
	json_object_set_new(m, "step_time_p95_ms", json_real(window_p95(w, kept, PH_STEP)));
	json_object_set_new(m, "phases_p95_ms",
			    json_pack("{s:f, s:f, s:f, s:f}", "data_wait", window_p95(w, kept, PH_DATA), "compute",
				      window_p95(w, kept, PH_COMPUTE), "allreduce", window_p95(w, kept, PH_ALLREDUCE),
				      "optimizer", window_p95(w, kept, PH_OPTIMIZER)));
	if (w->world > 1 && w->world <= LOOP_WIN_MAX_RANKS) {
		json_t *ranks = json_array();
		for (int k = 0; k < w->world; k++)
			json_array_append_new(ranks, json_real(1000.0 * w->win.rank_busy_s[k] / n));
		json_object_set_new(m, "rank_step_ms", ranks);
	}
	if (w->rg) {
		ring_counters c;
		ring_get_counters(w->rg, (uint32_t)w->ring_rank, &c);
		json_object_set_new(
			m, "loader",
			json_pack("{s:f, s:f, s:I}", "consumer_wait_ms",
				  (double)(c.consumer_wait_ns - w->ring_prev.consumer_wait_ns) / 1e6 / n,
				  "producer_wait_ms",
				  (double)(c.producer_wait_ns - w->ring_prev.producer_wait_ns) / 1e6 / n,
				  "batches_built", (json_int_t)(c.batches_built - w->ring_prev.batches_built)));
		w->ring_prev = c;
	}
}

/* After the step that made up: at the end of a logging window (and at the
 * last step) rank 0 sends the metrics message; every rank starts a new
 * window. tokens: the window's, summed over the ranks. */
static void log_window(worker *w, const loop_update *up, double tokens, double *t_log)
{
	const jobspec_training *ta = &w->bj.spec.training;
	const int64_t max_steps = ta->max_steps;
	const long step = w->tr->step;
	bool log_now = ta->logging_steps > 0 && step % ta->logging_steps == 0;
	if (!log_now && step != max_steps)
		return;
	double wall = worker_now_s() - *t_log;
	double loss = w->win.loss / (double)w->win.steps, tps = wall > 0 ? tokens / wall : 0.0;
	if (w->rank == 0) {
		json_t *m = json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:f, s:f}", "type", "metrics", "step",
				      (json_int_t)step, "epoch", (json_int_t)w->epoch, "loss", loss, "learning_rate",
				      up->lr, "grad_norm", up->grad_norm, "tokens_per_s", tps, "step_time_ms",
				      1000.0 * w->win.phase_s[PH_STEP] / (double)w->win.steps);
		add_window_timing(w, m);
		worker_send(w, m);
		log_info("step %ld/%lld loss %.4f lr %.3g grad_norm %.3f tokens/s %.0f", step, (long long)max_steps,
			 loss, up->lr, up->grad_norm, tps);
	}
	memset(&w->win, 0, sizeof w->win);
	*t_log = worker_now_s();
}

/* ---- held-out evaluation (worker/eval.c) ---- */

static int device_failed(worker *w, int rc, const char *what, double loss, const char *err);

/* With eval_strategy "steps": every rank builds the eval set, rank 0 writes
 * it to the job directory (the parent of checkpoint_dir) as
 * eval_batches.bin. Returns 0 or the exit code (already reported). */
static int eval_setup(worker *w)
{
	char err[512], path[PATH_MAX];
	if (strcmp(w->bj.spec.training.eval_strategy, "steps") != 0)
		return 0;
	int rc = eval_set_create(&w->eval, &w->bj, w->rank, w->world, err, sizeof err);
	if (rc < 0)
		return worker_fail(w, rc == -ENOMEM ? BERTD_EXIT_OOM : BERTD_EXIT_DATA, "held-out evaluation: %s",
				   err);
	if (w->rank == 0) {
		const char *slash = strrchr(w->checkpoint_dir, '/');
		int dir = slash ? (int)(slash - w->checkpoint_dir) : 1;
		snprintf(path, sizeof path, "%.*s/eval_batches.bin", dir, slash ? w->checkpoint_dir : ".");
		if ((rc = eval_set_write(w->eval, path)) < 0)
			return worker_fail(w, BERTD_EXIT_IO, "writing %s: %s", path, strerror(-rc));
		log_info("held-out evaluation: %d eval batches, written to %s", eval_set_batches(w->eval), path);
	}
	return 0;
}

static json_t *finite_or_null(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

/* The stall watch's heartbeat during an evaluation, at most once a second. */
static void eval_tick(void *arg)
{
	worker *w = arg;
	double now = worker_now_s();
	if (now - w->eval_tick_s >= 1.0) {
		worker_send(w, json_pack("{s:s, s:I}", "type", "progress", "step", (json_int_t)w->tr->step));
		w->eval_tick_s = now;
	}
}

/* After step (before its window is logged, so the time falls in it): every
 * eval_steps and at the last step, every rank evaluates its share; rank 0
 * reports the sums over the ranks. Returns 0 or the exit code. */
static int maybe_eval(worker *w, const loop_device *dev, long step)
{
	const jobspec_training *ta = &w->bj.spec.training;
	if (!w->eval || (step % ta->eval_steps != 0 && step != ta->max_steps))
		return 0;
	double t0 = worker_now_s();
	eval_result r;
	w->eval_tick_s = t0;
	int rc = eval_set_run(w->eval, dev->eval, dev->ctx, w->world > 1 ? w->cm : NULL, eval_tick, w, &r);
	if (rc < 0)
		return device_failed(w, rc, "held-out evaluation", 0, "");
	double s = worker_now_s() - t0;
	w->win.eval_s += s;
	w->last_eval_step = step;
	w->last_eval = r;
	if (w->rank == 0) {
		worker_send(w, json_pack("{s:s, s:I, s:o, s:o, s:f, s:I, s:i, s:f}", "type", "eval", "step",
					 (json_int_t)step, "eval_loss", finite_or_null(r.loss), "perplexity",
					 finite_or_null(r.perplexity), "eval_accuracy", r.accuracy,
					 "eval_masked_tokens", (json_int_t)r.masked, "eval_batches", r.batches,
					 "eval_ms", 1000.0 * s));
		log_info("step %ld eval_loss %.4f perplexity %.3f accuracy %.4f (%d batches, %.0f masked tokens, "
			 "%.0f ms)", step, r.loss, r.perplexity, r.accuracy, r.batches, r.masked, 1000.0 * s);
	}
	return 0;
}

/* ---- the end of a run ---- */

/* Rank 0: writes the HuggingFace export of the host model into export_dir
 * (built as export_dir.tmp, then renamed, so a reader never sees half an
 * export) and tells the daemon which checkpoint's model it holds (step) and
 * why (source: "final", "best" or "stopped"). Returns 0 or the exit code. */
static int write_export(worker *w, long step, const char *source)
{
	char err[512], tmp[PATH_MAX];
	const shard_dataset *sh = w->data.shards;
	snprintf(tmp, sizeof tmp, "%s.tmp", w->export_dir);
	fs_remove_tree(tmp);
	if (hf_export(w->tr->model, tmp, sh ? sh->vocab_path : NULL, sh ? sh->vocab.lowercase : true, err,
		      sizeof err) < 0)
		return worker_fail(w, BERTD_EXIT_IO, "exporting the model: %s", err);
	if (fence_check(err, sizeof err) < 0) { /* this attempt is over: the job dir is another's */
		fs_remove_tree(tmp);
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "not exporting: %s", err);
	}
	int rc = fs_remove_tree(w->export_dir);
	if ((rc < 0 && rc != -ENOENT) || rename(tmp, w->export_dir) < 0)
		return worker_fail(w, BERTD_EXIT_IO, "putting the export in place at %s: %s", w->export_dir,
				   strerror(rc < 0 && rc != -ENOENT ? -rc : errno));
	worker_send(w, json_pack("{s:s, s:s, s:I, s:s}", "type", "exported", "path", w->export_dir, "step",
				 (json_int_t)step, "source", source));
	log_info("exported the model of step %ld (%s) to %s", step, source, w->export_dir);
	return 0;
}

/* load_best_model_at_end: the best checkpoint's parameters into the host
 * model (the last step's are saved already). Returns 0 or the exit code. */
static int load_best(worker *w)
{
	char err[512], dir[PATH_MAX];
	snprintf(dir, sizeof dir, "%s/ckpt-%ld", w->checkpoint_dir, w->best.step);
	if (checkpoint_load(dir, w->tr->model, NULL, NULL, err, sizeof err) < 0)
		return worker_fail(w, BERTD_EXIT_IO, "load_best_model_at_end: loading the best checkpoint: %s", err);
	log_info("load_best_model_at_end: step %ld has the best %s (%g)", w->best.step,
		 w->bj.spec.training.metric_for_best_model, w->best.value);
	return 0;
}

/* The end of a run (max_steps reached, or stopped on request): rank 0
 * checkpoints what it has and writes the HuggingFace export from the host
 * model: when done, the last step's or (load_best_model_at_end) the best
 * checkpoint's; when stopped by a cancel, the stop checkpoint's, so a
 * canceled job or one out of max_runtime_seconds has a model too (a
 * shutdown's stop exports nothing: the job resumes). When done, all ranks
 * meet once more. */
static int end_run(worker *w, const loop_device *dev, bool stopped)
{
	int code;
	const long step = w->tr->step;
	if (w->rank == 0 && (!stopped || step > 0) &&
	    (code = save_checkpoint(w, dev, stopped ? "the stop checkpoint" : "the final checkpoint")) != 0)
		return code;
	if (stopped) {
		log_info("stopped at step %ld", step);
		if (w->rank == 0)
			worker_poll(w); /* another rank's stop may have come first: was it a cancel? */
		if (w->rank == 0 && step > 0 && w->stop_ends_job && (code = write_export(w, step, "stopped")) != 0)
			return code;
		return BERTD_EXIT_STOPPED;
	}
	if (w->rank == 0) {
		bool best = w->bj.spec.training.load_best_model_at_end && w->best.step >= 0;
		if (best && w->best.step != step && (code = load_best(w)) != 0)
			return code;
		if ((code = write_export(w, best ? w->best.step : step, best ? "best" : "final")) != 0)
			return code;
	}
	if (w->cm && comm_barrier(w->cm) < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "a peer was lost at the end of training");
	return BERTD_EXIT_OK;
}

/* ---- the step loop ---- */

/* The exit code for a failed device call (err: its message, or ""). */
static int device_failed(worker *w, int rc, const char *what, double loss, const char *err)
{
	long step = w->tr->step;
	const char *why = err[0] ? err : strerror(-rc);
	if (rc == -EPIPE || rc == -EPROTO)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "step %ld: %s: a peer was lost (%s)", step, what, why);
	if (rc == -ENOMEM)
		return worker_fail(w, BERTD_EXIT_OOM, "step %ld: %s: %s", step, what, why);
	if (rc == -ERANGE)
		return worker_fail(w, BERTD_EXIT_FAILURE, "step %ld: gradient norm is not finite (loss %g)",
				   step, loss);
	return worker_fail(w, BERTD_EXIT_FAILURE, "step %ld: %s failed: %s", step, what, why);
}

int loop_run(worker *w, const loop_device *dev)
{
	char err[512];
	const jobspec_training *ta = &w->bj.spec.training;
	const int M = ta->gradient_accumulation_steps;
	const int64_t max_steps = ta->max_steps;
	int rc, code;
	if (w->rg)
		ring_get_counters(w->rg, (uint32_t)w->ring_rank, &w->ring_prev);
	if ((code = eval_setup(w)) != 0)
		return code;
	double t_log = worker_now_s(), t_progress = 0;
	while (w->tr->step < max_steps) {
		worker_poll(w);
		if (w->world == 1 && w->stop_requested)
			goto stop; /* alone: no step to agree on */
		double t0 = worker_now_s(), data_s = 0, h2d_s = 0;
		for (int k = 0; k < M; k++) {
			bert_batch b;
			bool from_ring;
			double ta0 = worker_now_s();
			if ((code = next_batch(w, k, &b, &from_ring)) == BERTD_EXIT_STOPPED)
				goto stop; /* stop requested while starved */
			if (code != 0)
				return code;
			double tb = worker_now_s();
			data_s += tb - ta0;
			/* On error the slot stays held: the device may be reading it,
			 * and the process is about to exit anyway. */
			if (dev->upload) {
				if ((rc = dev->upload(dev->ctx, &b, err, sizeof err)) == -EINVAL)
					return worker_fail(w, BERTD_EXIT_DATA, "step %ld: unusable batch: %s",
							   w->tr->step, err);
				if (rc < 0)
					return device_failed(w, rc, "uploading a batch", 0, err);
				if (from_ring && !dev->reads_in_place)
					ring_release(w->rg, (uint32_t)w->ring_rank); /* the upload copied it out */
				h2d_s += worker_now_s() - tb;
			}
			bert_dropout d = {.train = 1, .seed = w->tr->cfg.seed, .rank = w->tr->cfg.rank,
					  .step = (uint32_t)w->tr->step, .micro = (uint32_t)k};
			err[0] = 0;
			if ((rc = dev->forward_backward(dev->ctx, &b, &d, k, M, err, sizeof err)) < 0)
				return device_failed(w, rc, "forward/backward", 0, err);
			/* Read in place: the slot goes back (or, serial, that buffer is
			 * rebuilt) only once the device is done with it. A GPU's copy
			 * waited for the backward two micro-batches back, finished when
			 * the previous loss was read: this rarely blocks for long. */
			if (dev->upload_wait) {
				double tw = worker_now_s();
				if ((rc = dev->upload_wait(dev->ctx)) < 0)
					return device_failed(w, rc, "batch copy", 0, "");
				h2d_s += worker_now_s() - tw;
			}
			if (from_ring && dev->reads_in_place)
				ring_release(w->rg, (uint32_t)w->ring_rank);
		}
		double loss = dev->loss(dev->ctx, M);
		double t1 = worker_now_s();
		loop_update up = {0};
		if ((rc = dev->update(dev->ctx, &up)) < 0)
			return device_failed(w, rc, "the update", loss, "");
		double t2 = worker_now_s(), ar_s = up.comm_s;
		double tokens = w->win.tokens; /* the window's, summed over the ranks below */
		if (w->cm) {
			if ((rc = sum_over_ranks(w, &loss, &tokens, t1 - t0)) < 0)
				return worker_fail(w, BERTD_EXIT_PEER_LOST, "step %ld: a peer was lost: %s",
						   w->tr->step, strerror(-rc));
			ar_s += worker_now_s() - t2;
		}
		const long step = ++w->tr->step;
		double t_end = worker_now_s();
		/* A device's compute still running when the host waits in the
		 * reduction counts as compute, as does whatever the measured phases
		 * leave of the step, so the phases add up to the step. */
		double opt_s = t2 - t1 - up.comm_host_s;
		double comp_s = (t_end - t0) - data_s - h2d_s - ar_s - opt_s;
		double ph_s[PH_COUNT] = {[PH_STEP] = t_end - t0, [PH_DATA] = data_s, [PH_H2D] = h2d_s,
					 [PH_COMPUTE] = comp_s > 0 ? comp_s : 0, [PH_ALLREDUCE] = ar_s,
					 [PH_OPTIMIZER] = opt_s};
		double *ph = w->win_ph[w->win.steps % LOOP_WIN_STEPS_MAX];
		for (int p = 0; p < PH_COUNT; p++) {
			w->win.phase_s[p] += ph_s[p];
			ph[p] = 1000.0 * ph_s[p];
		}
		w->win.steps++;
		w->win.loss += loss;

		if ((code = maybe_eval(w, dev, step)) != 0)
			return code;
		log_window(w, &up, tokens, &t_log);
		if (t_end - t_progress >= 1.0) { /* the daemon's stall watch (daemon/sv_stall.c) */
			worker_send(w, json_pack("{s:s, s:I}", "type", "progress", "step", (json_int_t)step));
			t_progress = t_end;
		}
		bool save_now = ta->save_steps > 0 && step % ta->save_steps == 0 && step != max_steps;
		if (save_now && w->cm && (code = check_replicas(w, dev, step)) != 0)
			return code;
		if (save_now && w->rank == 0) {
			double tc = worker_now_s();
			if ((code = save_checkpoint(w, dev, "checkpoint")) != 0)
				return code;
			w->win.ckpt_s += worker_now_s() - tc; /* reported with the next window */
		}
		if (w->stop_requested)
			goto stop;
	}
	return end_run(w, dev, false);
stop:
	return end_run(w, dev, true);
}
