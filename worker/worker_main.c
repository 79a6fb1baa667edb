/* bertd-worker — one training process of a job: rank r of G, one device.
 *
 * Reads the job file the daemon wrote (docs/formats.md), builds or
 * loads the model, takes its batches from the job's ring (loader processes)
 * or builds them itself (dataloader_num_workers = 0, the serial baseline),
 * trains with gradients averaged over ranks every step (worker/comm.c), and
 * reports to the daemon over fd 3: hello, metrics every logging_steps
 * (rank 0, reduced over ranks), checkpoints, errors. Rank 0 writes the
 * checkpoints and, at the end, the HuggingFace export.
 *
 * Device kind "cuda" (CUDA builds): the model trains on the GPU
 * (worker/gpu_model.h, gradients averaged with NCCL when world > 1); the
 * CPU trainer then only makes or loads the weights and holds the copy that
 * checkpoints and the export are written from (docs/cuda.md). That path has
 * been compiled, never yet run on a GPU.
 *
 * Stopping: a {"type":"stop"} from the daemon (cancel, shutdown) is agreed
 * on by all ranks in the same step (the flag rides the loss all-reduce), so
 * they stop together; rank 0 checkpoints and every rank exits 6.
 *
 * Exit codes: common/exitcodes.h. Never touches SQLite; never exits from
 * anywhere but main.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/exitcodes.h"
#include "common/log.h"
#include "common/msg.h"
#include "loader/batch.h"
#include "loader/batchjob.h"
#include "loader/ring.h"
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/hf.h"
#include "worker/train.h"
#ifdef BERTD_CUDA
#include <poll.h>
#include "worker/gpu_model.h"
#endif

#define DAEMON_FD 3
#define RING_WAIT_MS 1000      /* one bounded wait; the loop re-checks stop and peers */
#define COMM_TIMEOUT_MS 60000
#define WIN_STEPS_MAX 4096     /* steps kept per logging window for the p95s */
#define WIN_MAX_RANKS 64       /* per-rank busy times reported up to this world size */

/* Phases of a step, in the order of the metrics message's phases_ms. */
enum { PH_STEP, PH_DATA, PH_COMPUTE, PH_ALLREDUCE, PH_OPTIMIZER, PH_COUNT };

typedef struct worker {
	int rank, world;
	batchjob bj;
	json_t *job;               /* the job file */
	const char *checkpoint_dir, *export_dir, *resume_from;
	int daemon_fd;             /* -1 when run by hand without a daemon */
	msg_reader rd;
	bool stop_requested;
	/* batches */
	batchjob_data data;        /* serial path (no loaders) */
	ring *rg;                  /* loader path */
	void *local_slot;          /* (M, slot_bytes) serial path batches; loader path copies of micro-batches 0..M-2 */
	int32_t *mlm_pos, *mlm_lab; /* (M*B*P,) flattened masked positions/labels */
	/* training */
	trainer *tr;
	comm *cm;
	checkpoint_scaler ckpt_scaler; /* loss scaler of the checkpoint resumed from */
	bool have_ckpt_scaler;       /* false: none, or a checkpoint that predates it */
	/* telemetry for the current logging window */
	double win_data_s, win_step_s, win_comm_s;
	double win_h2d_s;            /* batch uploads to the device; 0 on the CPU */
	double win_tokens;
	double win_loss;             /* sum of step losses (rank-averaged) */
	int64_t win_steps;
	uint64_t epoch;
	double win_ckpt_s;           /* rank 0's checkpoint writes (training stalls) */
	double t_step0, t_sync0, t_sync1; /* this step: start, grad sync start/end (s) */
	double win_rank_busy_s[WIN_MAX_RANKS]; /* (world,) per-rank data + fwd/bwd, summed */
	/* (WIN_STEPS_MAX, PH_COUNT) per-step phase times of the window, ms, for
	 * the p95s; past WIN_STEPS_MAX steps the oldest are overwritten */
	double (*win_ph)[PH_COUNT];
	ring_counters ring_prev;     /* loader counters at the window's start */
#ifdef BERTD_CUDA
	gpu_model *gm;               /* device kind "cuda": the model lives here, tr is its host mirror */
	comm *nccl;                  /* gradient all-reduce between GPU ranks (world > 1) */
	void *pinned_area;           /* ring slot area (loaders) or local_slot (serial) registered with
					cudaHostRegister, or NULL */
	bool h2d_inplace;            /* uploads DMA from the slot itself (pinned, or pageable when
					pin_memory is false); false: staged through gpu_model's buffer */
	double gnorm_last;           /* last finite grad norm (fp16 skipped steps report it) */
#endif
} worker;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void send_msg(worker *w, json_t *m)
{
	if (w->daemon_fd >= 0 && m)
		msg_send(w->daemon_fd, m);
	json_decref(m);
}

/* Tells the daemon why, then returns the exit code to use. */
static int fail(worker *w, int code, const char *kind, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(worker *w, int code, const char *kind, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	log_error("%s", msg);
	send_msg(w, json_pack("{s:s, s:s, s:s, s:i}", "type", "error", "code", kind, "message", msg,
			      "rank", w->rank));
	return code;
}

/* Non-blocking look at the daemon's socket: notices stop requests. */
static void poll_daemon(worker *w)
{
	if (w->daemon_fd < 0)
		return;
	for (;;) {
		long n = msg_reader_fill(&w->rd, w->daemon_fd);
		if (n == 0) { /* the daemon is gone: stop cleanly, keep the checkpoint */
			w->stop_requested = true;
			w->daemon_fd = -1;
			return;
		}
		if (n < 0)
			break;
	}
	json_t *m;
	while (msg_reader_next(&w->rd, &m) == 1) {
		const char *type = json_string_value(json_object_get(m, "type"));
		if (type && strcmp(type, "stop") == 0) {
			log_info("stop requested (%s)", json_string_value(json_object_get(m, "reason")));
			w->stop_requested = true;
		}
		json_decref(m);
	}
}

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

/* ---- gradient sync hook (train.h) ---- */

typedef struct sync_ctx {
	worker *w;
	double flags[3 + WIN_MAX_RANKS]; /* [loss, tokens, stop, busy per rank] summed over ranks */
} sync_ctx;

/* Sums the step's loss, tokens, stop flag and per-rank busy time over the
 * ranks (host doubles, w->cm); *loss comes back averaged. */
static int sync_flags(sync_ctx *s, double *loss, double busy_s)
{
	worker *w = s->w;
	/* Each rank's busy time (data + forward/backward) travels in its
	 * own slot, so rank 0 can name a straggler. */
	int nr = w->world <= WIN_MAX_RANKS ? w->world : 0;
	memset(s->flags, 0, sizeof s->flags);
	s->flags[0] = *loss;
	s->flags[1] = w->win_tokens;
	s->flags[2] = w->stop_requested ? 1.0 : 0.0;
	if (nr)
		s->flags[3 + w->rank] = busy_s;
	int rc = comm_allreduce_sum_f64(w->cm, s->flags, 3 + nr);
	if (rc < 0)
		return rc;
	*loss = s->flags[0] / w->world;
	if (s->flags[2] > 0)
		w->stop_requested = true; /* any rank's stop stops all, same step */
	for (int k = 0; k < nr; k++)
		w->win_rank_busy_s[k] += s->flags[3 + k];
	return 0;
}

static int grad_sync(void *ctx, float *grads, size_t n, double *loss)
{
	sync_ctx *s = ctx;
	worker *w = s->w;
	double t0 = now_s();
	w->t_sync0 = t0;
	if (!w->cm) { /* one worker: the hook only marks where backward ended */
		w->t_sync1 = t0;
		return 0;
	}
	int rc = comm_allreduce_mean(w->cm, grads, n);
	if (rc == 0)
		rc = sync_flags(s, loss, t0 - w->t_step0);
	w->t_sync1 = now_s();
	w->win_comm_s += w->t_sync1 - t0;
	return rc;
}

/* ---- checkpoints ---- */

static int64_t dir_bytes(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int64_t total = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char p[PATH_MAX];
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
			total += st.st_size;
	}
	closedir(d);
	return total;
}

/* Rank 0: saves ckpt-<step> (pruning to save_total_limit) and tells the
 * daemon which checkpoints now exist. */
static int save_checkpoint(worker *w, char *err, size_t errlen)
{
	trainer *t = w->tr;
	checkpoint_scaler ls = checkpoint_scaler_disabled(); /* the CPU trainer never scales */
#ifdef BERTD_CUDA
	if (w->gm) {
		gpu_loss_scaler gs;
		gpu_model_get_scaler(w->gm, &gs);
		ls = (checkpoint_scaler){.scale = gs.scale, .enabled = gs.enabled,
					 .growth_interval = gs.growth_interval, .good_steps = gs.good_steps,
					 .skipped = gs.skipped};
	}
#endif
	json_t *extra = json_pack("{s:I, s:i}", "epoch", (json_int_t)w->epoch, "world_size", w->world);
	int rc = checkpoint_save_scaled(w->checkpoint_dir, t->step, t->model, t->opt, &ls, extra,
					w->bj.spec.training.save_total_limit, err, errlen);
	json_decref(extra);
	if (rc < 0)
		return rc;
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
	send_msg(w, json_pack("{s:s, s:I, s:s, s:I, s:o}", "type", "checkpoint", "step", (json_int_t)t->step,
			      "path", path, "bytes", (json_int_t)dir_bytes(path), "present_steps", present));
	log_info("checkpoint %s", path);
	return 0;
}

/* ---- setup ---- */

/* The spec's model and training settings (train.c), with what only this
 * process knows: the dataset's vocab, threads, and that this file (not
 * train.c) logs and checkpoints, so the daemon hears of each. */
static int build_train_config(worker *w, train_config *tc, char *err, size_t errlen)
{
	jobspec spec = w->bj.spec;
	const shard_vocab_info *vi = &w->data.shards->vocab;
	if (spec.model.vocab_size <= 0)
		spec.model.vocab_size = (int)vi->vocab_size;
	if ((uint32_t)spec.model.vocab_size < vi->vocab_size) {
		snprintf(err, errlen, "model.vocab_size %d is smaller than the dataset's vocab (%u)",
			 spec.model.vocab_size, vi->vocab_size);
		return -EINVAL;
	}
	const char *omp = getenv("OMP_NUM_THREADS");
	int threads = omp && atoi(omp) > 0 ? atoi(omp) : 1;
	int rc = train_config_from_jobspec(tc, &spec, NULL, threads, (uint32_t)w->rank, err, errlen);
	if (rc < 0)
		return rc;
	tc->model.pad_token_id = (int)vi->special.pad;
	tc->logging_steps = 0;
	tc->save_steps = 0;
	/* init_from points into the spec copy above: use the job's own */
	tc->init_from = w->bj.spec.init_from[0] ? w->bj.spec.init_from : NULL;
	return 0;
}

static int parse_args(int argc, char **argv, const char **job_path, int *rank)
{
	static const struct option opts[] = {
		{"job", required_argument, 0, 'j'}, {"rank", required_argument, 0, 'r'},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
	};
	int c;
	*job_path = NULL;
	*rank = -1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end;
		switch (c) {
		case 'j': *job_path = optarg; break;
		case 'r':
			*rank = (int)strtol(optarg, &end, 10);
			if (*end || *rank < 0)
				return -EINVAL;
			break;
		case 'h':
			printf("usage: bertd-worker --job <job.json> --rank <r>\n"
			       "Runs rank r of a bertd training job; started by the daemon with its\n"
			       "socket on fd 3 (docs/formats.md).\n");
			return 1;
		default: return -EINVAL;
		}
	}
	return *job_path && *rank >= 0 && optind == argc ? 0 : -EINVAL;
}

static const char *jstr(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

/* ---- the loop ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank 95th percentile of phase p over the window's kept steps. */
static double window_p95(const worker *w, int p, double *scratch)
{
	size_t n = w->win_steps < WIN_STEPS_MAX ? (size_t)w->win_steps : WIN_STEPS_MAX;
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
	static double scratch[WIN_STEPS_MAX];
	const double n = (double)w->win_steps;
	size_t kept = w->win_steps < WIN_STEPS_MAX ? (size_t)w->win_steps : WIN_STEPS_MAX;
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
	if (w->world > 1 && w->world <= WIN_MAX_RANKS) {
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

/* After the step that made res: at the end of a logging window (and at
 * the last step) rank 0 sends the metrics message; every rank starts a new
 * window. */
static void log_window(worker *w, const train_result *res, const sync_ctx *sc, double *t_log)
{
	const jobspec_training *ta = &w->bj.spec.training;
	const int64_t max_steps = ta->max_steps;
	bool log_now = ta->logging_steps > 0 && res->step % ta->logging_steps == 0;
	if (!log_now && res->step != max_steps)
		return;
	double tokens = w->world > 1 ? sc->flags[1] : w->win_tokens;
	double wall = now_s() - *t_log;
	if (w->rank == 0) {
		json_t *m = json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:f, s:f}",
				      "type", "metrics", "step", (json_int_t)res->step,
				      "epoch", (json_int_t)w->epoch, "loss", w->win_loss / (double)w->win_steps,
				      "learning_rate", res->lr, "grad_norm", res->grad_norm,
				      "tokens_per_s", wall > 0 ? tokens / wall : 0.0,
				      "step_time_ms", 1000.0 * w->win_step_s / (double)w->win_steps);
		add_window_timing(w, m);
		send_msg(w, m);
		log_info("step %ld/%lld loss %.4f lr %.3g grad_norm %.3f tokens/s %.0f", res->step,
			 (long long)max_steps, w->win_loss / (double)w->win_steps, res->lr, res->grad_norm,
			 wall > 0 ? tokens / wall : 0.0);
	}
	w->win_data_s = w->win_step_s = w->win_comm_s = w->win_tokens = w->win_loss = 0;
	w->win_h2d_s = 0;
	w->win_ckpt_s = 0;
	memset(w->win_rank_busy_s, 0, sizeof w->win_rank_busy_s);
	w->win_steps = 0;
	*t_log = now_s();
}

/* Training done: rank 0 writes the final checkpoint and the HuggingFace
 * export from the host model; all ranks meet once more. */
static int finish_run(worker *w)
{
	char err[512];
	if (w->rank == 0) {
		int rc;
		if ((rc = save_checkpoint(w, err, sizeof err)) < 0)
			return fail(w, BERTD_EXIT_IO, "io", "writing the final checkpoint: %s", err);
		if ((rc = hf_export(w->tr->model, w->export_dir, w->data.shards ? w->data.shards->vocab_path : NULL,
				    err, sizeof err)) < 0)
			return fail(w, BERTD_EXIT_IO, "io", "exporting the model: %s", err);
		send_msg(w, json_pack("{s:s, s:s}", "type", "exported", "path", w->export_dir));
		log_info("exported the model to %s", w->export_dir);
	}
	if (w->cm && comm_barrier(w->cm) < 0)
		return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost", "a peer was lost at the end of training");
	return BERTD_EXIT_OK;
}

/* Stopped on request: rank 0 checkpoints what it has. */
static int stop_run(worker *w)
{
	char err[512];
	if (w->rank == 0 && w->tr->step > 0) {
		int rc = save_checkpoint(w, err, sizeof err);
		if (rc < 0)
			return fail(w, BERTD_EXIT_IO, "io", "writing the stop checkpoint: %s", err);
	}
	log_info("stopped at step %ld", w->tr->step);
	return BERTD_EXIT_STOPPED;
}

/* Replicas are identical by construction (same init, same all-reduced
 * gradients, same update): every rank compares its host parameter span at
 * a save step, before rank 0 checkpoints, so a diverged state is never
 * saved. Returns 0, or the exit code (already reported). */
static int check_replicas(worker *w, int64_t step)
{
	int rc = comm_replicas_agree(w->cm, w->tr->model->params_memory, w->tr->model->num_params * sizeof(float));
	if (rc == 0)
		return fail(w, BERTD_EXIT_FAILURE, "internal",
			    "the ranks' parameters differ at step %ld: a replica diverged (restarting from the last "
			    "checkpoint)",
			    (long)step);
	if (rc < 0)
		return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost", "checking replicas: %s", strerror(-rc));
	return 0;
}

static int train(worker *w)
{
	char err[512];
	const jobspec_training *ta = &w->bj.spec.training;
	const int M = ta->gradient_accumulation_steps;
	const int64_t max_steps = ta->max_steps;
	const batch_layout *l = &w->bj.ring.layout;
	bert_batch micro[64];
	sync_ctx sc = {.w = w};
	/* Also with one worker: the hook marks where backward ends, which
	 * splits forward+backward from the optimizer in the step timing. */
	w->tr->cfg.grad_sync = grad_sync;
	w->tr->cfg.grad_sync_ctx = &sc;
	if (w->rg)
		ring_get_counters(w->rg, (uint32_t)w->rank, &w->ring_prev);
	double t_log = now_s();
	while (w->tr->step < max_steps) {
		poll_daemon(w);
		if (w->world == 1 && w->stop_requested)
			break;
		double t0 = now_s();
		w->t_step0 = t0;
		bool held = false; /* the last micro-batch's ring slot, read in place */
		for (int k = 0; k < M; k++) {
			void *slot = NULL;
			if (w->rg) {
				int rc;
				while ((rc = ring_next(w->rg, (uint32_t)w->rank, RING_WAIT_MS, &slot)) == -ETIMEDOUT) {
					poll_daemon(w);
					if (w->world == 1 && w->stop_requested)
						break;
				}
				if (rc == -ETIMEDOUT)
					goto stop; /* stop requested while starved */
				if (rc == RING_END)
					return fail(w, BERTD_EXIT_DATA, "data", "the batch stream ended at step %ld",
						    w->tr->step);
				if (rc < 0)
					return fail(w, BERTD_EXIT_DATA, "data", "no batch from the loaders: %s",
						    strerror(-rc));
				/* A rank's ring hands out one slot at a time (ring_next
				 * gives the next only after ring_release), and a step needs
				 * all M micro-batches at once: micro-batches 0..M-2 are
				 * copied out and their slots given back at once; the last
				 * is read in place and released after the step. Holding one
				 * slot leaves S-1 >= 3 for the loaders to fill meanwhile,
				 * and the consumer never asks for its next sequence while
				 * holding one, so this cannot deadlock; the bytes are those
				 * of the copy, so results do not change. */
				if (k < M - 1) {
					void *dst = (char *)w->local_slot + (size_t)k * l->slot_bytes;
					memcpy(dst, slot, l->slot_bytes);
					ring_release(w->rg, (uint32_t)w->rank);
					slot = dst;
				} else {
					held = true;
				}
			} else {
				uint64_t global = ((uint64_t)w->tr->step * (uint64_t)M + (uint64_t)k) *
						  (uint64_t)w->world + (uint64_t)w->rank;
				batchjob_simulated_delay(&w->bj);
				int rc = mlm_batch_build(w->data.ds, l, (uint32_t)w->world, (uint32_t)M, global,
							 (char *)w->local_slot + (size_t)k * l->slot_bytes);
				if (rc < 0)
					return fail(w, BERTD_EXIT_DATA, "data", "building batch %llu: %s",
						    (unsigned long long)global, strerror(-rc));
				slot = (char *)w->local_slot + (size_t)k * l->slot_bytes;
			}
			if (slot_to_batch(w, slot, k, &micro[k]) < 0)
				return fail(w, BERTD_EXIT_DATA, "data", "batch slot failed its header check");
		}
		double t1 = now_s();
		w->win_data_s += t1 - t0;
		train_result res;
		int rc = trainer_step(w->tr, micro, M, &res, err, sizeof err);
		if (held && rc == 0)
			ring_release(w->rg, (uint32_t)w->rank); /* the step has read it */
		if (rc == -EPIPE || rc == -EPROTO)
			return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost", "%s", err);
		if (rc == -ENOMEM)
			return fail(w, BERTD_EXIT_OOM, "oom", "%s", err);
		if (rc < 0)
			return fail(w, BERTD_EXIT_FAILURE, "internal", "%s", err);
		double t_end = now_s();
		w->win_step_s += t_end - t0;
		double *ph = w->win_ph[w->win_steps % WIN_STEPS_MAX];
		ph[PH_STEP] = 1000.0 * (t_end - t0);
		ph[PH_DATA] = 1000.0 * (t1 - t0);
		ph[PH_COMPUTE] = 1000.0 * (w->t_sync0 - t1);
		ph[PH_ALLREDUCE] = 1000.0 * (w->t_sync1 - w->t_sync0);
		ph[PH_OPTIMIZER] = 1000.0 * (t_end - w->t_sync1);
		w->win_steps++;
		w->win_loss += res.loss;

		log_window(w, &res, &sc, &t_log);
		if (ta->save_steps > 0 && res.step % ta->save_steps == 0 && res.step != max_steps && w->cm &&
		    (rc = check_replicas(w, res.step)) != 0)
			return rc;
		if (w->rank == 0 && ta->save_steps > 0 && res.step % ta->save_steps == 0 && res.step != max_steps) {
			double tc = now_s();
			if ((rc = save_checkpoint(w, err, sizeof err)) < 0)
				return fail(w, BERTD_EXIT_IO, "io", "writing checkpoint: %s", err);
			w->win_ckpt_s += now_s() - tc; /* reported with the next window */
		}
		if (w->stop_requested)
			goto stop;
	}
	return finish_run(w);
stop:
	return stop_run(w);
}

#ifdef BERTD_CUDA
/* ---- the CUDA path (device kind "cuda", worker/gpu_model.h) ----
 *
 * The host trainer (w->tr) is kept as the model's mirror: it initialises the
 * weights (seeded init, init_from, or a checkpoint), and before every
 * checkpoint and the export the device state is copied back into it, so
 * checkpoint.c and hf.c write the same formats as on the CPU. The daemon
 * sets CUDA_VISIBLE_DEVICES to the job's device, so this process uses
 * device 0. Compiled in CUDA builds; not yet run on a GPU (docs/cuda.md). */

#define GPU_DEVICE 0

/* The spec's bf16/fp16 tri-state as gpu_precision_pick's wish. */
static const char *precision_want(int bf16, int fp16)
{
	if (bf16 == 1)
		return "bf16";
	if (fp16 == 1)
		return "fp16";
	if (bf16 == 0 && fp16 == 0)
		return "fp32";
	return "auto";
}

#ifdef BERTD_NCCL
static int nccl_id_send(void *ctx, const void *id, size_t len)
{
	worker *w = ctx;
	char hex[2 * 512 + 1];
	if (w->daemon_fd < 0 || len > 512)
		return -ENOTCONN; /* run by hand: nobody relays the id */
	for (size_t i = 0; i < len; i++)
		snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)id)[i]);
	json_t *m = json_pack("{s:s, s:s}", "type", "nccl_id", "id", hex);
	int rc = m ? msg_send(w->daemon_fd, m) : -ENOMEM;
	json_decref(m);
	return rc < 0 ? rc : 0;
}

static int hex_decode(const char *hex, unsigned char *out, size_t len)
{
	if (strlen(hex) != 2 * len)
		return -EPROTO;
	for (size_t i = 0; i < len; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return -EPROTO;
		out[i] = (unsigned char)v;
	}
	return 0;
}

/* Ranks > 0: waits (bounded) for rank 0's id, relayed by the daemon. Other
 * messages are dropped, except a stop, which ends the wait. */
static int nccl_id_recv(void *ctx, void *id, size_t len)
{
	worker *w = ctx;
	if (w->daemon_fd < 0)
		return -ENOTCONN;
	double deadline = now_s() + COMM_TIMEOUT_MS / 1000.0;
	for (;;) {
		json_t *m;
		int rc;
		while ((rc = msg_reader_next(&w->rd, &m)) == 1) {
			const char *type = jstr(m, "type");
			if (type && strcmp(type, "stop") == 0) {
				w->stop_requested = true;
				json_decref(m);
				return -ECANCELED;
			}
			if (type && strcmp(type, "nccl_id") == 0) {
				const char *hex = jstr(m, "id");
				rc = hex ? hex_decode(hex, id, len) : -EPROTO;
				json_decref(m);
				return rc;
			}
			json_decref(m);
		}
		if (rc < 0)
			return rc;
		double left = deadline - now_s();
		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = {.fd = w->daemon_fd, .events = POLLIN};
		int pr = poll(&p, 1, (int)(left * 1000.0) + 1);
		if (pr < 0 && errno != EINTR)
			return -errno;
		if (pr > 0) {
			long n = msg_reader_fill(&w->rd, w->daemon_fd);
			if (n == 0)
				return -EPIPE; /* the daemon is gone */
			if (n < 0 && n != -EAGAIN)
				return (int)n;
		}
	}
}

/* gpu_model's all-reduce hook (docs/formats.md, NCCL backend). */
static int nccl_hook(void *ctx, float *grads, size_t n, cudaStream_t s)
{
	worker *w = ctx;
	w->t_sync0 = now_s();
	int rc = comm_nccl_bucket_start(w->nccl, grads, n, s);
	if (rc == 0)
		rc = comm_nccl_buckets_wait(w->nccl, s);
	/* gpu_model_step syncs the host once (the norm): drain first, so a lost
	 * peer is a bounded -EPIPE here instead of a hang in that sync */
	if (rc == 0)
		rc = comm_nccl_drain(w->nccl);
	w->t_sync1 = now_s();
	return rc;
}

/* The overlapped path: gpu_model enqueues each gradient bucket as backward
 * finishes it, then, in gpu_model_step, finish makes the compute stream wait
 * for them all. */
static int nccl_bucket(void *ctx, float *grads, size_t n, cudaStream_t s)
{
	worker *w = ctx;
	return comm_nccl_bucket_start(w->nccl, grads, n, s);
}

static int nccl_bucket_finish(void *ctx, cudaStream_t s)
{
	worker *w = ctx;
	w->t_sync0 = now_s();
	int rc = comm_nccl_buckets_wait(w->nccl, s);
	if (rc == 0) /* bounded: a lost peer is -EPIPE here, not a hang in the step's sync */
		rc = comm_nccl_drain(w->nccl);
	w->t_sync1 = now_s();
	return rc;
}
#endif

/* Picks the precision, creates the device model from the host trainer's
 * weights and optimizer state, pins the ring when asked and joins the NCCL
 * group. Returns 0 or the exit code (already reported). */
static int gpu_setup(worker *w)
{
	char err[512];
	const jobspec_training *ta = &w->bj.spec.training;
	const batch_layout *l = &w->bj.ring.layout;
	kdtype dt;
	int rc = gpu_precision_pick(precision_want(ta->bf16, ta->fp16), GPU_DEVICE, &dt, err, sizeof err);
	if (rc == -ENOTSUP || rc == -EINVAL)
		return fail(w, BERTD_EXIT_BAD_CONFIG, "bad_config", "%s", err);
	if (rc < 0)
		return fail(w, BERTD_EXIT_FAILURE, "internal", "no usable CUDA device: %s", err);
	/* auto picked what the spec turned off (e.g. bf16: false): full precision */
	if ((dt == KDT_BF16 && ta->bf16 == 0) || (dt == KDT_F16 && ta->fp16 == 0))
		dt = KDT_F32;
	/* the communicator comes after the model and allocates on the device
	 * too: keep room for it, or "the largest batch that fits" fails at the
	 * first collective */
	size_t reserve = gpu_model_comm_reserve_bytes(&w->tr->model->cfg, w->world,
						      strcmp(w->bj.spec.training.ddp_reduce_dtype, "fp32") != 0);
	rc = gpu_model_create_reserving(&w->gm, &w->tr->model->cfg, dt, GPU_DEVICE, (int)l->B, (int)l->T,
					(int)(l->B * l->P), &w->tr->opt->cfg, reserve, err, sizeof err);
	if (rc == -ENOMEM)
		return fail(w, BERTD_EXIT_OOM, "oom", "%s", err); /* names the largest batch that fits */
	if (rc == -EINVAL)
		return fail(w, BERTD_EXIT_BAD_CONFIG, "bad_config", "%s", err);
	if (rc < 0)
		return fail(w, BERTD_EXIT_FAILURE, "internal", "creating the GPU model: %s", err);
	if ((rc = gpu_model_set_params(w->gm, w->tr->model->params_memory)) < 0 ||
	    (rc = gpu_model_set_opt_state(w->gm, w->tr->opt->state_memory, w->tr->opt->t)) < 0)
		return fail(w, BERTD_EXIT_FAILURE, "internal", "copying the model to the GPU: %s", strerror(-rc));
	if (w->have_ckpt_scaler) {
		const checkpoint_scaler *cs = &w->ckpt_scaler;
		gpu_loss_scaler gs = {.scale = cs->scale, .enabled = cs->enabled,
				      .growth_interval = cs->growth_interval, .good_steps = cs->good_steps,
				      .skipped = cs->skipped};
		if (gpu_model_set_scaler(w->gm, &gs) < 0) /* checkpoint.c validated the same bounds */
			return fail(w, BERTD_EXIT_DATA, "data", "the checkpoint's loss scaler is not usable");
		if (w->gm->scaler.enabled && cs->enabled)
			log_info("fp16 loss scale restored from the checkpoint: %g (%d good steps, %ld skipped)",
				 (double)cs->scale, cs->good_steps, cs->skipped);
		else if (cs->enabled)
			log_info("the checkpoint's fp16 loss scale (%g) is not used: training in %s", (double)cs->scale,
				 kdtype_name(dt));
	}
	/* Where uploads read a batch from (docs/cuda.md, "Data path"). pin_memory:
	 * the memory batches are built in (the ring's slot area, or the serial
	 * path's buffer) is page-locked once, and each batch is DMA'd from it in
	 * place; if the kernel refuses to lock it, batches are staged through
	 * gpu_model's own pinned buffer (a host copy, then the DMA). Without
	 * pin_memory, the copy reads the pageable slot itself: the driver stages it,
	 * synchronously, which is what the loader experiment measures. */
	w->h2d_inplace = true;
	if (ta->dataloader_pin_memory) {
		size_t bytes = (size_t)ta->gradient_accumulation_steps * l->slot_bytes;
		void *area = w->rg ? ring_slot_area(w->rg, &bytes) : w->local_slot;
		cudaError_t ce = cudaHostRegister(area, bytes, cudaHostRegisterDefault);
		if (ce == cudaSuccess) {
			w->pinned_area = area;
			log_info("H2D: batches DMA'd in place from the pinned %s (%zu bytes registered)",
				 w->rg ? "ring slots" : "batch buffer", bytes);
		} else {
			(void)cudaGetLastError(); /* not sticky: later launch checks must not see it */
			w->h2d_inplace = false;
			log_warn("cannot pin the %s (%zu bytes): %s; staging each batch through a pinned buffer",
				 w->rg ? "batch ring" : "batch buffer", bytes, cudaGetErrorString(ce));
		}
	} else {
		log_info("H2D: dataloader_pin_memory is false: batches copied from pageable memory");
	}
	if (w->world > 1) {
#ifdef BERTD_NCCL
		const char *rd = w->bj.spec.training.ddp_reduce_dtype; /* normalized: fp32 | bf16 | fp16 */
		comm_dtype reduce = !strcmp(rd, "bf16") ? COMM_BF16 : !strcmp(rd, "fp16") ? COMM_FP16 : COMM_FP32;
		rc = comm_create_nccl(&w->nccl, w->rank, w->world, GPU_DEVICE, reduce, nccl_id_send, nccl_id_recv,
				      w, COMM_TIMEOUT_MS);
		if (rc == -ECANCELED) {
			log_info("stopped while waiting for the NCCL id");
			return BERTD_EXIT_STOPPED;
		}
		if (rc == -ENOMEM)
			return fail(w, BERTD_EXIT_OOM, "oom", "no device memory left for the NCCL communicator on this rank");
		if (rc < 0)
			return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost", "joining the %d-GPU NCCL group failed: %s",
				    w->world, strerror(-rc));
		if ((rc = gpu_model_set_allreduce(w->gm, nccl_hook, w, NULL)) < 0)
			return fail(w, BERTD_EXIT_FAILURE, "internal", "setting the all-reduce hook: %s", strerror(-rc));
		/* BERTD_DDP_OVERLAP=0: one all-reduce after backward (the hook
		 * above), e.g. to rule the overlap out when debugging a GPU run */
		const char *ov = getenv("BERTD_DDP_OVERLAP");
		if (!(ov && strcmp(ov, "0") == 0))
			gpu_model_set_buckets(w->gm, nccl_bucket, nccl_bucket_finish, w);
#else
		return fail(w, BERTD_EXIT_BAD_CONFIG, "bad_config",
			    "a %d-GPU job, but this bertd-worker was built without NCCL", w->world);
#endif
	}
	log_info("GPU model: %s, batch %u x %u, %zu parameters", dt == KDT_BF16 ? "bf16" : dt == KDT_F16 ? "fp16" : "fp32",
		 l->B, l->T, w->gm->num_params);
	return 0;
}

/* Rank 0: copies the device's parameters and optimizer state into the host
 * trainer, where checkpoints and the export read them. Other ranks write
 * nothing and skip the copy. Returns 0 or the exit code (already reported). */
static int gpu_to_host(worker *w)
{
	int rc = 0;
	if (w->rank != 0)
		return 0;
	if (w->nccl)
		rc = comm_nccl_drain(w->nccl);
	if (rc == 0 && (rc = gpu_model_get_params(w->gm, w->tr->model->params_memory)) == 0)
		rc = gpu_model_get_opt_state(w->gm, w->tr->opt->state_memory);
	if (rc == -EPIPE)
		return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost", "a peer was lost before copying the model back");
	if (rc < 0)
		return fail(w, BERTD_EXIT_FAILURE, "internal", "copying the model from the GPU: %s", strerror(-rc));
	w->tr->opt->t = w->gm->t;
	return 0;
}

/* Micro-batch k of this step into *b: from the ring (*from_ring: the caller
 * releases the slot once the upload's copy has finished reading it) or built
 * here. Returns 0, 1 when a stop came while starved, or -1 with *code set
 * (already reported). */
static int gpu_next_batch(worker *w, int k, bert_batch *b, bool *from_ring, int *code)
{
	const batch_layout *l = &w->bj.ring.layout;
	const int M = w->bj.spec.training.gradient_accumulation_steps;
	void *slot = NULL;
	*from_ring = false;
	if (w->rg) {
		int rc;
		while ((rc = ring_next(w->rg, (uint32_t)w->rank, RING_WAIT_MS, &slot)) == -ETIMEDOUT) {
			poll_daemon(w);
			if (w->world == 1 && w->stop_requested)
				break;
		}
		if (rc == -ETIMEDOUT)
			return 1;
		if (rc == RING_END) {
			*code = fail(w, BERTD_EXIT_DATA, "data", "the batch stream ended at step %ld", w->tr->step);
			return -1;
		}
		if (rc < 0) {
			*code = fail(w, BERTD_EXIT_DATA, "data", "no batch from the loaders: %s", strerror(-rc));
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
			*code = fail(w, BERTD_EXIT_DATA, "data", "building batch %llu: %s", (unsigned long long)global,
				     strerror(-rc));
			return -1;
		}
	}
	if (slot_to_batch(w, slot, k, b) < 0) {
		if (*from_ring)
			ring_release(w->rg, (uint32_t)w->rank);
		*code = fail(w, BERTD_EXIT_DATA, "data", "batch slot failed its header check");
		return -1;
	}
	return 0;
}

/* The loop of train() on the device. Per micro-batch: fetch, upload, read
 * the previous micro-batch's loss (the host fetched while the device
 * computed), forward, backward; then the optimizer step with the NCCL
 * all-reduce inside it, and the loss/tokens/stop sums over ranks (w->cm). */
static int train_gpu(worker *w)
{
	char err[512];
	const jobspec_training *ta = &w->bj.spec.training;
	const int M = ta->gradient_accumulation_steps;
	const int64_t max_steps = ta->max_steps;
	gpu_model *g = w->gm;
	sync_ctx sc = {.w = w};
	int code = BERTD_EXIT_OK;
	if (w->rg)
		ring_get_counters(w->rg, (uint32_t)w->rank, &w->ring_prev);
	double t_log = now_s();
	while (w->tr->step < max_steps) {
		poll_daemon(w);
		if (w->world == 1 && w->stop_requested)
			break;
		double t0 = now_s(), data_s = 0, h2d_s = 0, loss = 0;
		w->t_step0 = t0;
		gpu_model_zero_grad(g);
		for (int k = 0; k < M; k++) {
			bert_batch b;
			bool from_ring;
			double ta0 = now_s();
			int rc = gpu_next_batch(w, k, &b, &from_ring, &code);
			if (rc == 1)
				goto stop;
			if (rc < 0)
				return code;
			double tb = now_s();
			data_s += tb - ta0;
			/* On error the slot stays held: a DMA may be reading it, and the
			 * process is about to exit anyway. */
			rc = w->h2d_inplace ? gpu_model_upload_inplace(g, &b, err, sizeof err)
					    : gpu_model_upload(g, &b, err, sizeof err);
			if (rc == -EINVAL)
				return fail(w, BERTD_EXIT_DATA, "data", "step %ld: unusable batch: %s", w->tr->step, err);
			if (rc < 0)
				return fail(w, BERTD_EXIT_FAILURE, "internal", "step %ld: uploading a batch: %s",
					    w->tr->step, strerror(-rc));
			if (from_ring && !w->h2d_inplace)
				ring_release(w->rg, (uint32_t)w->rank); /* staged: the upload copied it out */
			h2d_s += now_s() - tb;
			if (k > 0)
				loss += gpu_model_loss(g);
			bert_dropout d = {.train = 1, .seed = w->tr->cfg.seed, .rank = w->tr->cfg.rank,
					  .step = (uint32_t)w->tr->step, .micro = (uint32_t)k};
			if (k == M - 1) /* only the last micro-batch's gradients are final */
				gpu_model_reduce_in_next_backward(g);
			if ((rc = gpu_model_forward(g, &d, gpu_model_loss_scale(g) / (float)M)) < 0 ||
			    (rc = gpu_model_backward(g)) < 0) {
				if (rc == -EPIPE) /* a gradient bucket's all-reduce: a peer is gone */
					return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost",
						    "step %ld: the NCCL all-reduce failed during backward", w->tr->step);
				return fail(w, BERTD_EXIT_FAILURE, "internal", "step %ld: forward/backward failed: %s",
					    w->tr->step, strerror(-rc));
			}
			if (w->h2d_inplace) {
				/* In place, the DMA reads the slot itself: hand it back (or,
				 * serial, rebuild that buffer) only once the copy's event has
				 * completed. The copy waited on the device for the backward
				 * two micro-batches back, which had finished by the time the
				 * previous loss was read (or the last step synchronised), so
				 * this rarely blocks for more than the DMA itself. */
				double tw = now_s();
				if ((rc = gpu_model_upload_wait(g)) < 0)
					return fail(w, BERTD_EXIT_FAILURE, "internal", "step %ld: batch copy failed: %s",
						    w->tr->step, strerror(-rc));
				h2d_s += now_s() - tw;
				if (from_ring)
					ring_release(w->rg, (uint32_t)w->rank);
			}
		}
		loss += gpu_model_loss(g); /* waits for the last backward's forward */
		loss /= M;
		double t1 = now_s();
		w->t_sync0 = w->t_sync1 = t1; /* the NCCL hook moves them */
		double lr = 0, gnorm = 0;
		int skipped = 0;
		int rc = gpu_model_step(g, &lr, &gnorm, &skipped);
		if (rc == -EPIPE)
			return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost", "step %ld: the NCCL all-reduce failed",
				    w->tr->step);
		if (rc == -ERANGE)
			return fail(w, BERTD_EXIT_FAILURE, "internal", "step %ld: gradient norm is not finite (loss %g)",
				    w->tr->step, loss);
		if (rc < 0)
			return fail(w, BERTD_EXIT_FAILURE, "internal", "step %ld: optimizer step failed: %s", w->tr->step,
				    strerror(-rc));
		if (skipped) {
			log_warn("step %ld: fp16 gradient overflow, update skipped (loss scale now %g)", w->tr->step,
				 (double)gpu_model_loss_scale(g));
			gnorm = w->gnorm_last; /* JSON has no infinity */
		}
		w->gnorm_last = gnorm;
		/* exposed all-reduce: the compute stream's wait, from CUDA events
		 * (host clocks would also count the backward still running) */
		double t2 = now_s(), ar_s = gpu_model_exposed_comm_ms(g) / 1000.0;
		if (w->cm) {
			if ((rc = sync_flags(&sc, &loss, t1 - t0)) < 0)
				return fail(w, BERTD_EXIT_PEER_LOST, "peer_lost", "step %ld: a peer was lost: %s",
					    w->tr->step, strerror(-rc));
			ar_s += now_s() - t2;
		}
		w->tr->step++;
		train_result res = {.step = w->tr->step, .loss = loss, .lr = lr, .grad_norm = gnorm};
		double t_end = now_s();
		w->win_data_s += data_s;
		w->win_h2d_s += h2d_s;
		w->win_comm_s += ar_s;
		w->win_step_s += t_end - t0;
		double *ph = w->win_ph[w->win_steps % WIN_STEPS_MAX];
		/* Host clocks see the backward still running on the device as time
		 * in the hook's drain: that part is compute, the rest of the step
		 * after the measured phases too, so the phases add up to the step. */
		double opt_s = t2 - t1 - (w->t_sync1 - w->t_sync0);
		double comp_s = (t_end - t0) - data_s - h2d_s - ar_s - opt_s;
		ph[PH_STEP] = 1000.0 * (t_end - t0);
		ph[PH_DATA] = 1000.0 * data_s;
		ph[PH_COMPUTE] = 1000.0 * (comp_s > 0 ? comp_s : 0);
		ph[PH_ALLREDUCE] = 1000.0 * ar_s;
		ph[PH_OPTIMIZER] = 1000.0 * opt_s;
		w->win_steps++;
		w->win_loss += res.loss;

		log_window(w, &res, &sc, &t_log);
		if (ta->save_steps > 0 && res.step % ta->save_steps == 0 && res.step != max_steps && w->cm) {
			/* every rank's device parameters, to compare on the host */
			if ((rc = gpu_model_get_params(g, w->tr->model->params_memory)) < 0)
				return fail(w, BERTD_EXIT_FAILURE, "internal", "copying parameters from the GPU: %s",
					    strerror(-rc));
			if ((code = check_replicas(w, res.step)) != 0)
				return code;
		}
		if (w->rank == 0 && ta->save_steps > 0 && res.step % ta->save_steps == 0 && res.step != max_steps) {
			double tc = now_s();
			if ((code = gpu_to_host(w)) != 0)
				return code;
			if ((rc = save_checkpoint(w, err, sizeof err)) < 0)
				return fail(w, BERTD_EXIT_IO, "io", "writing checkpoint: %s", err);
			w->win_ckpt_s += now_s() - tc; /* reported with the next window */
		}
		if (w->stop_requested)
			goto stop;
	}
	return (code = gpu_to_host(w)) != 0 ? code : finish_run(w);
stop:
	return (code = gpu_to_host(w)) != 0 ? code : stop_run(w);
}
#endif /* BERTD_CUDA */

int main(int argc, char **argv)
{
	char name[32] = "bertd-worker";
	log_init(name, LOG_LVL_INFO);
	worker w = {.daemon_fd = -1};
	const char *job_path;
	int rc = parse_args(argc, argv, &job_path, &w.rank);
	if (rc == 1)
		return 0;
	if (rc < 0) {
		fprintf(stderr, "usage: bertd-worker --job <job.json> --rank <r>\n");
		return BERTD_EXIT_BAD_CONFIG;
	}
	snprintf(name, sizeof name, "bertd-worker[%d]", w.rank);
	log_init(name, LOG_LVL_INFO);
	signal(SIGPIPE, SIG_IGN);
	if (fcntl(DAEMON_FD, F_GETFD) >= 0) {
		w.daemon_fd = DAEMON_FD;
		fcntl(DAEMON_FD, F_SETFL, fcntl(DAEMON_FD, F_GETFL) | O_NONBLOCK);
	}
	msg_reader_init(&w.rd);
	int code = BERTD_EXIT_OK;
	char err[512];

	json_error_t jerr;
	w.job = json_load_file(job_path, JSON_REJECT_DUPLICATES, &jerr);
	if (!w.job) {
		code = fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "cannot read job file %s: %s", job_path, jerr.text);
		goto out;
	}
	if (batchjob_from_json(w.job, &w.bj) < 0) {
		code = fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "job file %s is not usable (see log)", job_path);
		goto out;
	}
	w.world = (int)w.bj.world_size;
	w.checkpoint_dir = jstr(w.job, "checkpoint_dir");
	w.export_dir = jstr(w.job, "export_dir");
	w.resume_from = jstr(w.job, "resume_from");
	json_t *dev = json_array_get(json_object_get(w.job, "devices"), (size_t)w.rank);
	const char *kind = jstr(dev, "kind");
	if (w.rank >= w.world || !w.checkpoint_dir || !w.export_dir || !kind) {
		code = fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "job file lacks rank %d's device or its directories",
			    w.rank);
		goto out;
	}
	send_msg(&w, json_pack("{s:s, s:i, s:i, s:s}", "type", "hello", "rank", w.rank, "pid", (int)getpid(),
			       "device", kind));
	bool on_gpu = false;
#ifdef BERTD_CUDA
	on_gpu = strcmp(kind, "cuda") == 0;
#endif
	if (strcmp(kind, "cpu") != 0 && !on_gpu) {
		/* refuse rather than silently train on the CPU */
		code = fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config",
#ifdef BERTD_CUDA
			    "device kind %s: this bertd-worker trains on \"cpu\" or \"cuda\"", kind);
#else
			    "device kind %s: this bertd-worker was built without CUDA (CPU backend only)", kind);
#endif
		goto out;
	}
	if (!on_gpu && (w.bj.spec.training.bf16 == 1 || w.bj.spec.training.fp16 == 1)) {
		code = fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config",
			    "bf16/fp16 asked for, but this job runs on the CPU backend (fp32 only)");
		goto out;
	}

	/* Data: the dataset is opened by every rank (its vocab sizes the model);
	 * batches come from the ring when loaders run, else are built here. */
	if ((rc = batchjob_data_open(&w.bj, &w.data)) < 0) {
		code = fail(&w, BERTD_EXIT_DATA, "data", "dataset %s: %s", w.bj.dataset_dir, strerror(-rc));
		goto out;
	}
	const batch_layout *l = &w.bj.ring.layout;
	int M = w.bj.spec.training.gradient_accumulation_steps;
	if (M > 64) {
		code = fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "gradient_accumulation_steps above 64");
		goto out;
	}
	w.mlm_pos = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w.mlm_lab = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w.win_ph = calloc(WIN_STEPS_MAX, sizeof *w.win_ph);
	if (!w.mlm_pos || !w.mlm_lab || !w.win_ph) {
		code = fail(&w, BERTD_EXIT_OOM, "oom", "out of memory for batch buffers");
		goto out;
	}
	if (posix_memalign(&w.local_slot, BATCH_ALIGN, (size_t)M * l->slot_bytes) != 0) {
		code = fail(&w, BERTD_EXIT_OOM, "oom", "out of memory for batch slots");
		goto out;
	}
	if (w.bj.spec.training.dataloader_num_workers > 0 &&
	    (rc = ring_open(&w.rg, w.bj.shm_name, &w.bj.ring)) < 0) {
		code = fail(&w, BERTD_EXIT_DATA, "data", "cannot open the batch ring %s: %s", w.bj.shm_name,
			    strerror(-rc));
		goto out;
	}

	train_config tc;
	if (build_train_config(&w, &tc, err, sizeof err) < 0) {
		code = fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "%s", err);
		goto out;
	}
	if ((rc = trainer_create(&w.tr, &tc, err, sizeof err)) < 0) {
		code = fail(&w, rc == -ENOMEM ? BERTD_EXIT_OOM : BERTD_EXIT_BAD_CONFIG,
			    rc == -ENOMEM ? "oom" : "bad_config", "%s", err);
		goto out;
	}
	if (w.resume_from && (rc = trainer_resume(w.tr, w.resume_from, err, sizeof err)) < 0) {
		code = fail(&w, BERTD_EXIT_DATA, "data", "resuming from %s: %s", w.resume_from, err);
		goto out;
	}
	if (w.resume_from) {
		rc = checkpoint_read_scaler(w.resume_from, &w.ckpt_scaler, err, sizeof err);
		if (rc < 0) {
			code = fail(&w, BERTD_EXIT_DATA, "data", "resuming from %s: %s", w.resume_from, err);
			goto out;
		}
		w.have_ckpt_scaler = rc == 0;
		if (!on_gpu && w.have_ckpt_scaler && w.ckpt_scaler.enabled)
			log_info("the checkpoint's fp16 loss scale (%g) is not used: the CPU backend trains in fp32",
				 (double)w.ckpt_scaler.scale);
	}
	if (w.tr->step != w.bj.start_step) {
		code = fail(&w, BERTD_EXIT_DATA, "data", "checkpoint step %ld disagrees with the job's resume step %lld",
			    w.tr->step, (long long)w.bj.start_step);
		goto out;
	}
#ifdef BERTD_CUDA
	/* the host trainer above made (or loaded) the weights; the device takes them */
	if (on_gpu && (code = gpu_setup(&w)) != 0)
		goto out;
#endif
	if (w.world > 1) {
		char cname[160];
		comm_name_for_job(cname, sizeof cname, w.bj.job_id);
		if ((rc = comm_create_shm(&w.cm, cname, w.rank, w.world, COMM_DEFAULT_MAX_FLOATS, COMM_TIMEOUT_MS)) < 0) {
			code = fail(&w, BERTD_EXIT_PEER_LOST, "peer_lost", "joining the %d-rank group failed: %s",
				    w.world, strerror(-rc));
			goto out;
		}
	}
	log_info("rank %d/%d on %s: %d layers, hidden %d, vocab %d, batch %u x %u, accumulation %d, from step %ld",
		 w.rank, w.world, kind, tc.model.num_hidden_layers, tc.model.hidden_size, tc.model.vocab_size, l->B,
		 l->T, M, w.tr->step);
#ifdef BERTD_CUDA
	code = on_gpu ? train_gpu(&w) : train(&w);
#else
	code = train(&w);
#endif
	if (code == BERTD_EXIT_PEER_LOST && w.cm)
		comm_abort(w.cm, -EPIPE);
out:
#ifdef BERTD_CUDA
	if (code == BERTD_EXIT_PEER_LOST && w.nccl)
		comm_abort(w.nccl, -EPIPE);
	comm_destroy(w.nccl);
	gpu_model_destroy(w.gm);
	if (w.pinned_area)
		cudaHostUnregister(w.pinned_area);
	cuda_kernels_shutdown(); /* nothing to free unless the CUDA path ran */
#endif
	comm_destroy(w.cm);
	trainer_destroy(w.tr);
	if (w.rg)
		ring_detach(w.rg);
	free(w.local_slot);
	free(w.mlm_pos);
	free(w.mlm_lab);
	free(w.win_ph);
	if (w.data.ds || w.data.shards)
		batchjob_data_close(&w.data);
	msg_reader_free(&w.rd);
	json_decref(w.job);
	return code;
}
