/* loop — see loop.h. Reads top to bottom: batches, the ranks' per-step
 * sums, checkpoints, the logging window, the end of a run, the step loop.
 * Times are host seconds from worker_now_s; the window's figures are ms. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/exitcodes.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "loader/batch.h"
#include "worker/hf.h"
#include "worker/loop.h"

#define RING_WAIT_MS 1000 /* one bounded wait; the loop re-checks stop and peers */

/* ---- batches ---- */

/* Points b at the batch in slot, flattening the per-sequence masked
 * positions (B, P) into the model's (n_pred,) b*T+t form. */
static int slot_to_batch(worker *w, const void *slot, int micro, bert_batch *b)
{
	const batch_header *h = slot;
	const batch_layout *l = &w->bj.ring.layout;
	int rc = batch_header_check(h, l);
	if (rc < 0)
		return rc;
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
	w->win_tokens += h->n_tokens;
	w->epoch = h->epoch;
	return 0;
}

/* Micro-batch k of this step into *b: from the ring (*from_ring: the caller
 * releases the slot once the device has stopped reading it) or built here
 * into local_slot[k]. Returns 0, 1 when a stop came while starved, or -1
 * with *code set (already reported). */
static int next_batch(worker *w, int k, bert_batch *b, bool *from_ring, int *code)
{
	const batch_layout *l = &w->bj.ring.layout;
	const int M = w->bj.spec.training.gradient_accumulation_steps;
	void *slot = NULL;
	*from_ring = false;
	if (w->rg) {
		int rc;
		while ((rc = ring_next(w->rg, (uint32_t)w->rank, RING_WAIT_MS, &slot)) == -ETIMEDOUT) {
			worker_poll(w);
			if (w->world == 1 && w->stop_requested)
				break;
		}
		if (rc == -ETIMEDOUT)
			return 1;
		if (rc == RING_END) {
			*code = worker_fail(w, BERTD_EXIT_DATA, "the batch stream ended at step %ld",
					    w->tr->step);
			return -1;
		}
		if (rc < 0) {
			*code = worker_fail(w, BERTD_EXIT_DATA, "no batch from the loaders: %s", strerror(-rc));
			return -1;
		}
		*from_ring = true;
	} else {
		uint64_t global = ((uint64_t)w->tr->step * (uint64_t)M + (uint64_t)k) * (uint64_t)w->world +
				  (uint64_t)w->rank;
		slot = (char *)w->local_slot + (size_t)k * l->slot_bytes;
		batchjob_simulated_delay(&w->bj);
		int rc = mlm_batch_build(w->data.ds, l, (uint32_t)w->world, (uint32_t)M, global, slot);
		if (rc < 0) {
			*code = worker_fail(w, BERTD_EXIT_DATA, "building batch %llu: %s",
					    (unsigned long long)global, strerror(-rc));
			return -1;
		}
	}
	if (slot_to_batch(w, slot, k, b) < 0) {
		if (*from_ring)
			ring_release(w->rg, (uint32_t)w->rank);
		*code = worker_fail(w, BERTD_EXIT_DATA, "batch slot failed its header check");
		return -1;
	}
	return 0;
}

/* ---- the ranks' per-step sums ---- */

/* Sums the step's loss, the window's tokens, the stop flag and per-rank busy
 * time over the ranks (host doubles, w->cm); *loss comes back averaged,
 * *tokens summed. */
static int sum_over_ranks(worker *w, double *loss, double *tokens, double busy_s)
{
	/* Each rank's busy time (data + forward/backward) travels in its
	 * own slot, so rank 0 can name a straggler. */
	int nr = w->world <= LOOP_WIN_MAX_RANKS ? w->world : 0;
	double s[3 + LOOP_WIN_MAX_RANKS] = {*loss, w->win_tokens, w->stop_requested ? 1.0 : 0.0};
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
		w->win_rank_busy_s[k] += s[3 + k];
	return 0;
}

/* Replicas are identical by construction (same init, same all-reduced
 * gradients, same update): every rank compares its host parameter span at
 * a save step, before rank 0 checkpoints, so a diverged state is never
 * saved. Returns 0, or the exit code (already reported). */
static int check_replicas(worker *w, int64_t step)
{
	int rc = comm_replicas_agree(w->cm, w->tr->model->params_memory, w->tr->model->num_params * sizeof(float));
	if (rc == 0)
		return worker_fail(w, BERTD_EXIT_FAILURE,
				   "the ranks' parameters differ at step %ld: a replica diverged (restarting from the "
				   "last checkpoint)",
				   (long)step);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "checking replicas: %s", strerror(-rc));
	return 0;
}

/* ---- checkpoints ---- */

/* Rank 0: copies the device's state into the host trainer, saves
 * ckpt-<step> (pruning to save_total_limit) and tells the daemon which
 * checkpoints now exist. Returns 0 or the exit code (already reported). */
static int save_checkpoint(worker *w, const loop_device *dev, const char *what)
{
	char err[512];
	trainer *t = w->tr;
	checkpoint_scaler ls = checkpoint_scaler_disabled();
	int rc = dev->to_host ? dev->to_host(dev->ctx, true, &ls) : 0;
	if (rc == -EPIPE)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "a peer was lost before copying the model back");
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "copying the model from the device: %s",
				   strerror(-rc));
	json_t *extra = json_pack("{s:I, s:i}", "epoch", (json_int_t)w->epoch, "world_size", w->world);
	rc = checkpoint_save_scaled(w->checkpoint_dir, t->step, t->model, t->opt, &ls, extra,
				    w->bj.spec.training.save_total_limit, err, sizeof err);
	json_decref(extra);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_IO, "writing %s: %s", what, err);
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
	worker_send(w, json_pack("{s:s, s:I, s:s, s:I, s:o}", "type", "checkpoint", "step", (json_int_t)t->step,
				 "path", path, "bytes", (json_int_t)fs_dir_bytes(path), "present_steps", present));
	log_info("checkpoint %s", path);
	return 0;
}

/* ---- the logging window ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank 95th percentile of phase p over the window's kept steps. */
static double window_p95(const worker *w, int p, double *scratch)
{
	size_t n = w->win_steps < LOOP_WIN_STEPS_MAX ? (size_t)w->win_steps : LOOP_WIN_STEPS_MAX;
	if (n == 0)
		return 0;
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
	static double scratch[LOOP_WIN_STEPS_MAX];
	const double n = (double)w->win_steps;
	size_t kept = w->win_steps < LOOP_WIN_STEPS_MAX ? (size_t)w->win_steps : LOOP_WIN_STEPS_MAX;
	double mean[PH_COUNT] = {0};
	for (size_t i = 0; i < kept; i++)
		for (int p = 0; p < PH_COUNT; p++)
			mean[p] += w->win_ph[i][p] / (double)kept;
	/* data and all-reduce are exact window sums; the split of the rest
	 * into forward/backward and optimizer comes from the kept steps */
	double data = 1000.0 * w->win_data_s / n, ar = 1000.0 * w->win_comm_s / n;
	double h2d = 1000.0 * w->win_h2d_s / n;
	double rest = 1000.0 * (w->win_step_s - w->win_data_s - w->win_comm_s - w->win_h2d_s) / n;
	double split = mean[PH_COMPUTE] + mean[PH_OPTIMIZER];
	double opt = split > 0 ? rest * mean[PH_OPTIMIZER] / split : 0;
	json_object_set_new(m, "phases_ms",
			    json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "data_wait", data, "h2d", h2d, /* CPU: 0 */
				      "compute", rest - opt, "allreduce", ar, "optimizer", opt, "checkpoint",
				      1000.0 * w->win_ckpt_s / n));
	json_object_set_new(m, "step_time_p95_ms", json_real(window_p95(w, PH_STEP, scratch)));
	json_object_set_new(m, "phases_p95_ms",
			    json_pack("{s:f, s:f, s:f, s:f}", "data_wait", window_p95(w, PH_DATA, scratch),
				      "compute", window_p95(w, PH_COMPUTE, scratch), "allreduce",
				      window_p95(w, PH_ALLREDUCE, scratch), "optimizer",
				      window_p95(w, PH_OPTIMIZER, scratch)));
	if (w->world > 1 && w->world <= LOOP_WIN_MAX_RANKS) {
		json_t *ranks = json_array();
		for (int k = 0; k < w->world; k++)
			json_array_append_new(ranks, json_real(1000.0 * w->win_rank_busy_s[k] / n));
		json_object_set_new(m, "rank_step_ms", ranks);
	}
	if (w->rg) {
		ring_counters c;
		ring_get_counters(w->rg, (uint32_t)w->rank, &c);
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
	if (w->rank == 0) {
		json_t *m = json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:f, s:f}",
				      "type", "metrics", "step", (json_int_t)step,
				      "epoch", (json_int_t)w->epoch, "loss", w->win_loss / (double)w->win_steps,
				      "learning_rate", up->lr, "grad_norm", up->grad_norm,
				      "tokens_per_s", wall > 0 ? tokens / wall : 0.0,
				      "step_time_ms", 1000.0 * w->win_step_s / (double)w->win_steps);
		add_window_timing(w, m);
		worker_send(w, m);
		log_info("step %ld/%lld loss %.4f lr %.3g grad_norm %.3f tokens/s %.0f", step,
			 (long long)max_steps, w->win_loss / (double)w->win_steps, up->lr, up->grad_norm,
			 wall > 0 ? tokens / wall : 0.0);
	}
	w->win_data_s = w->win_step_s = w->win_comm_s = w->win_tokens = w->win_loss = 0;
	w->win_h2d_s = 0;
	w->win_ckpt_s = 0;
	memset(w->win_rank_busy_s, 0, sizeof w->win_rank_busy_s);
	w->win_steps = 0;
	*t_log = worker_now_s();
}

/* ---- the end of a run ---- */

/* Training done: rank 0 writes the final checkpoint and the HuggingFace
 * export from the host model; all ranks meet once more. */
static int finish_run(worker *w, const loop_device *dev)
{
	char err[512];
	if (w->rank == 0) {
		int code = save_checkpoint(w, dev, "the final checkpoint");
		if (code != 0)
			return code;
		const shard_dataset *sh = w->data.shards;
		if (hf_export(w->tr->model, w->export_dir, sh ? sh->vocab_path : NULL, sh ? sh->vocab.lowercase : true,
			      err, sizeof err) < 0)
			return worker_fail(w, BERTD_EXIT_IO, "exporting the model: %s", err);
		worker_send(w, json_pack("{s:s, s:s}", "type", "exported", "path", w->export_dir));
		log_info("exported the model to %s", w->export_dir);
	}
	if (w->cm && comm_barrier(w->cm) < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "a peer was lost at the end of training");
	return BERTD_EXIT_OK;
}

/* Stopped on request: rank 0 checkpoints what it has. */
static int stop_run(worker *w, const loop_device *dev)
{
	if (w->rank == 0 && w->tr->step > 0) {
		int code = save_checkpoint(w, dev, "the stop checkpoint");
		if (code != 0)
			return code;
	}
	log_info("stopped at step %ld", w->tr->step);
	return BERTD_EXIT_STOPPED;
}

/* ---- the step loop ---- */

/* The exit code for a failed device call (err: its message, or ""). */
static int device_failed(worker *w, int rc, const char *what, double loss, const char *err)
{
	long step = w->tr->step;
	const char *why = err[0] ? err : strerror(-rc);
	if (rc == -EPIPE || rc == -EPROTO)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "step %ld: %s: a peer was lost (%s)", step, what,
				   why);
	if (rc == -ENOMEM)
		return worker_fail(w, BERTD_EXIT_OOM, "step %ld: %s: %s", step, what, why);
	if (rc == -ERANGE)
		return worker_fail(w, BERTD_EXIT_FAILURE, "step %ld: gradient norm is not finite (loss %g)",
				   step, loss);
	return worker_fail(w, BERTD_EXIT_FAILURE, "step %ld: %s failed: %s", step, what, why);
}

/* Per micro-batch: fetch (data phase), upload (h2d phase on a device),
 * forward + backward, then hand the batch memory back once the device has
 * stopped reading it. Then the update (gradient all-reduce + optimizer), the
 * loss / tokens / stop sums over ranks, and the step's phase times. */
int loop_run(worker *w, const loop_device *dev)
{
	char err[512];
	const jobspec_training *ta = &w->bj.spec.training;
	const int M = ta->gradient_accumulation_steps;
	const int64_t max_steps = ta->max_steps;
	double tokens = 0; /* the window's, summed over the ranks when the last step did */
	int code = BERTD_EXIT_OK;
	if (w->rg)
		ring_get_counters(w->rg, (uint32_t)w->rank, &w->ring_prev);
	double t_log = worker_now_s(), t_progress = 0;
	while (w->tr->step < max_steps) {
		worker_poll(w);
		if (w->world == 1 && w->stop_requested)
			goto stop; /* alone: no step to agree on */
		double t0 = worker_now_s(), data_s = 0, h2d_s = 0;
		dev->zero_grad(dev->ctx);
		for (int k = 0; k < M; k++) {
			bert_batch b;
			bool from_ring;
			double ta0 = worker_now_s();
			int rc = next_batch(w, k, &b, &from_ring, &code);
			if (rc == 1)
				goto stop; /* stop requested while starved */
			if (rc < 0)
				return code;
			double tb = worker_now_s();
			data_s += tb - ta0;
			/* On error the slot stays held: the device may be reading it,
			 * and the process is about to exit anyway. */
			if ((rc = dev->upload(dev->ctx, &b, err, sizeof err)) == -EINVAL)
				return worker_fail(w, BERTD_EXIT_DATA, "step %ld: unusable batch: %s",
						   w->tr->step, err);
			if (rc < 0)
				return device_failed(w, rc, "uploading a batch", 0, err);
			if (from_ring && !dev->reads_in_place)
				ring_release(w->rg, (uint32_t)w->rank); /* the upload copied it out */
			if (dev->h2d)
				h2d_s += worker_now_s() - tb;
			bert_dropout d = {.train = 1, .seed = w->tr->cfg.seed, .rank = w->tr->cfg.rank,
					  .step = (uint32_t)w->tr->step, .micro = (uint32_t)k};
			err[0] = 0;
			if ((rc = dev->forward_backward(dev->ctx, &d, k, M, err, sizeof err)) < 0)
				return device_failed(w, rc, "forward/backward", 0, err);
			if (dev->reads_in_place) {
				/* Read in place: hand the slot back (or, serial, rebuild that
				 * buffer) only once the device is done with it. A device's copy
				 * waited for the backward two micro-batches back, which had
				 * finished by the time the previous loss was read, so this
				 * rarely blocks for more than the copy itself. */
				double tw = worker_now_s();
				if (dev->upload_wait && (rc = dev->upload_wait(dev->ctx)) < 0)
					return device_failed(w, rc, "batch copy", 0, "");
				if (dev->h2d)
					h2d_s += worker_now_s() - tw;
				if (from_ring)
					ring_release(w->rg, (uint32_t)w->rank);
			}
		}
		double loss = dev->loss(dev->ctx, M);
		double t1 = worker_now_s();
		loop_update up = {0};
		int rc = dev->update(dev->ctx, &up);
		if (rc < 0)
			return device_failed(w, rc, "the update", loss, "");
		double t2 = worker_now_s(), ar_s = up.comm_s;
		tokens = w->win_tokens;
		if (w->cm) {
			if ((rc = sum_over_ranks(w, &loss, &tokens, t1 - t0)) < 0)
				return worker_fail(w, BERTD_EXIT_PEER_LOST, "step %ld: a peer was lost: %s",
						   w->tr->step, strerror(-rc));
			ar_s += worker_now_s() - t2;
		}
		const long step = ++w->tr->step;
		double t_end = worker_now_s();
		w->win_data_s += data_s;
		w->win_h2d_s += h2d_s;
		w->win_comm_s += ar_s;
		w->win_step_s += t_end - t0;
		double *ph = w->win_ph[w->win_steps % LOOP_WIN_STEPS_MAX];
		/* A device's compute still running when the host waits in the
		 * reduction counts as compute, as does whatever the measured phases
		 * leave of the step, so the phases add up to the step. */
		double opt_s = t2 - t1 - up.comm_host_s;
		double comp_s = (t_end - t0) - data_s - h2d_s - ar_s - opt_s;
		ph[PH_STEP] = 1000.0 * (t_end - t0);
		ph[PH_DATA] = 1000.0 * data_s;
		ph[PH_COMPUTE] = 1000.0 * (comp_s > 0 ? comp_s : 0);
		ph[PH_ALLREDUCE] = 1000.0 * ar_s;
		ph[PH_OPTIMIZER] = 1000.0 * opt_s;
		w->win_steps++;
		w->win_loss += loss;

		log_window(w, &up, tokens, &t_log);
		if (t_end - t_progress >= 1.0) { /* the daemon's stall watch (daemon/supervisor.c) */
			worker_send(w, json_pack("{s:s, s:I}", "type", "progress", "step", (json_int_t)step));
			t_progress = t_end;
		}
		bool save_now = ta->save_steps > 0 && step % ta->save_steps == 0 && step != max_steps;
		if (save_now && w->cm) {
			/* every rank's parameters, compared on the host */
			if (dev->to_host && (rc = dev->to_host(dev->ctx, false, NULL)) < 0)
				return worker_fail(w, BERTD_EXIT_FAILURE,
						   "copying parameters from the device: %s", strerror(-rc));
			if ((code = check_replicas(w, step)) != 0)
				return code;
		}
		if (save_now && w->rank == 0) {
			double tc = worker_now_s();
			if ((code = save_checkpoint(w, dev, "checkpoint")) != 0)
				return code;
			w->win_ckpt_s += worker_now_s() - tc; /* reported with the next window */
		}
		if (w->stop_requested)
			goto stop;
	}
	return finish_run(w, dev);
stop:
	return stop_run(w, dev);
}
