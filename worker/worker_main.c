/* bertd-worker — one training process of a job: rank r of G, one device.
 *
 * Reads the job file the daemon wrote (docs/formats.md), opens its batches
 * (the job's ring when loaders run, else the dataset, to build them here:
 * dataloader_num_workers = 0, the serial baseline), builds or loads the
 * model, picks the device (device_cpu.c, or device_gpu.c for kind "cuda" in
 * CUDA builds), joins the job's ranks and runs the training loop (loop.c).
 *
 * This file is the process: arguments, the daemon socket (fd 3: hello,
 * metrics, checkpoints, errors), signals, the exit code (common/exitcodes.h).
 * Stopping: a {"type":"stop"} from the daemon (cancel, shutdown), or the
 * daemon gone, sets stop_requested; the loop agrees on it across ranks,
 * rank 0 checkpoints and every rank exits 6. `bertd-worker --export` is
 * the other mode: a checkpoint into an HF model directory (convert.h).
 * Never touches SQLite; never exits from anywhere but main.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#include "worker/convert.h"
#include "worker/loop.h"
#include "worker/relay.h"
#include "worker/train.h"

#define DAEMON_FD 3

/* ---- the daemon socket ---- */

double worker_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int worker_send(worker *w, json_t *m)
{
	int rc = !m ? -ENOMEM : w->daemon_fd >= 0 ? msg_send(w->daemon_fd, m) : 0;
	json_decref(m);
	return rc < 0 ? rc : 0;
}

int worker_fail(worker *w, int code, const char *fmt, ...)
{
	/* the error message's code for each exit code (docs/formats.md) */
	static const char *const kinds[] = {
		[BERTD_EXIT_FAILURE] = "internal", [BERTD_EXIT_BAD_CONFIG] = "bad_config", [BERTD_EXIT_OOM] = "oom",
		[BERTD_EXIT_PEER_LOST] = "peer_lost", [BERTD_EXIT_DATA] = "data", [BERTD_EXIT_IO] = "io",
	};
	assert(code > 0 && code < (int)(sizeof kinds / sizeof *kinds) && kinds[code]);
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	log_error("%s", msg);
	worker_send(w, json_pack("{s:s, s:s, s:s, s:i}", "type", "error", "code", kinds[code], "message", msg,
				 "rank", w->rank));
	return code;
}

/* A stop message (logged): sets stop_requested. */
static bool take_stop(worker *w, json_t *m)
{
	const char *type = json_string_value(json_object_get(m, "type"));
	if (!type || strcmp(type, "stop") != 0)
		return false;
	const char *why = json_string_value(json_object_get(m, "reason"));
	log_info("stop requested (%s)", why);
	w->stop_requested = true;
	/* a cancel ends the job (a user's, or max_runtime_seconds): its model is
	 * exported; a shutdown's job resumes later and exports then */
	if (why && strcmp(why, "cancel") == 0)
		w->stop_ends_job = true;
	return true;
}

void worker_poll(worker *w)
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
		if (n < 0 && n != -EAGAIN && relay_wanted()) {
			/* the relay broke (its keepalive bound passed: this node is cut
			 * off, or the daemon reset it): stop; the attempt fence keeps
			 * a stop checkpoint of an attempt that is over out of the job */
			log_error("the relay connection failed: %s; stopping", strerror((int)-n));
			w->stop_requested = true;
			close(w->daemon_fd);
			w->daemon_fd = -1;
			return;
		}
		if (n < 0)
			break;
	}
	json_t *m;
	while (msg_reader_next(&w->rd, &m) == 1) {
		take_stop(w, m);
		json_decref(m);
	}
}

int worker_await(worker *w, const char *type, int timeout_ms, json_t **out)
{
	if (w->daemon_fd < 0)
		return -ENOTCONN;
	double deadline = worker_now_s() + timeout_ms / 1000.0;
	for (;;) {
		json_t *m;
		int left_ms = (int)((deadline - worker_now_s()) * 1000.0);
		int rc = msg_recv(w->daemon_fd, &w->rd, left_ms > 0 ? left_ms : 0, &m);
		if (rc <= 0)
			return rc == 0 ? -EPIPE : rc; /* 0: the daemon is gone */
		const char *t = json_string_value(json_object_get(m, "type"));
		if (take_stop(w, m)) {
			json_decref(m);
			return -ECANCELED;
		}
		if (t && strcmp(t, type) == 0) {
			*out = m;
			return 0;
		}
		json_decref(m);
	}
}

static const char *jstr(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

/* ---- setup: each step returns 0 or the exit code, already reported ---- */

/* Reads the job file: this rank's directories and device kind (*on_gpu for
 * "cuda" in CUDA builds; any other kind is refused). */
static int open_job(worker *w, const char *job_path, const char **kind, bool *on_gpu)
{
	json_error_t jerr;
	w->job = json_load_file(job_path, JSON_REJECT_DUPLICATES, &jerr);
	if (!w->job)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "cannot read job file %s: %s", job_path,
				   jerr.text);
	if (batchjob_from_json(w->job, &w->bj) < 0)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "job file %s is not usable (see log)", job_path);
	w->world = (int)w->bj.world_size;
	w->checkpoint_dir = jstr(w->job, "checkpoint_dir");
	w->export_dir = jstr(w->job, "export_dir");
	w->resume_from = jstr(w->job, "resume_from");
	*kind = jstr(json_array_get(json_object_get(w->job, "devices"), (size_t)w->rank), "kind");
	if (w->rank >= w->world || !w->checkpoint_dir || !w->export_dir || !*kind)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
				   "job file lacks rank %d's device or its directories", w->rank);
	worker_send(w, json_pack("{s:s, s:i, s:i, s:s}", "type", "hello", "rank", w->rank, "pid", (int)getpid(),
				 "device", *kind));
#ifdef BERTD_CUDA
	*on_gpu = strcmp(*kind, "cuda") == 0;
	const char *built_for = "trains on \"cpu\" or \"cuda\"";
#else
	*on_gpu = false;
	const char *built_for = "was built without CUDA (CPU backend only)";
#endif
	if (strcmp(*kind, "cpu") != 0 && !*on_gpu) /* refuse rather than silently train on the CPU */
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "device kind %s: this bertd-worker %s", *kind,
				   built_for);
	if (!*on_gpu && (w->bj.spec.training.bf16 == 1 || w->bj.spec.training.fp16 == 1))
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
				   "bf16/fp16 asked for, but this job runs on the CPU backend (fp32 only)");
	return 0;
}

/* The dataset is opened by every rank (its vocab sizes the model); batches
 * come from the ring when loaders run, else are built here. */
static int open_batches(worker *w)
{
	const batch_layout *l = &w->bj.ring.layout;
	const int M = w->bj.spec.training.gradient_accumulation_steps;
	int rc = batchjob_data_open(&w->bj, &w->data);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_DATA, "dataset %s: %s", w->bj.dataset_dir, strerror(-rc));
	if (M > 64)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "gradient_accumulation_steps above 64");
	w->mlm_pos = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w->mlm_lab = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w->win_ph = calloc(LOOP_WIN_STEPS_MAX, sizeof *w->win_ph);
	if (!w->mlm_pos || !w->mlm_lab || !w->win_ph)
		return worker_fail(w, BERTD_EXIT_OOM, "out of memory for batch buffers");
	if (w->bj.spec.training.dataloader_num_workers == 0 &&
	    posix_memalign(&w->local_slot, BATCH_ALIGN, (size_t)M * l->slot_bytes) != 0)
		return worker_fail(w, BERTD_EXIT_OOM, "out of memory for batch slots");
	if (w->bj.spec.training.dataloader_num_workers > 0 &&
	    (rc = ring_open(&w->rg, w->bj.shm_name, &w->bj.ring)) < 0)
		return worker_fail(w, BERTD_EXIT_DATA, "cannot open the batch ring %s: %s", w->bj.shm_name,
				   strerror(-rc));
	return 0;
}

/* Rank 0 tells the daemon what the job trains on ({"type":"data"},
 * docs/formats.md): the index every rank just built, counted once. */
static void report_data(worker *w)
{
	if (w->rank != 0)
		return;
	mlm_stats st;
	mlm_dataset_stats(w->data.ds, &st);
	worker_send(w, json_pack("{s:s, s:I, s:I, s:I, s:I, s:{s:I}, s:I, s:I, s:I, s:f, s:I}", "type", "data",
				 "sequences_per_epoch", (json_int_t)st.n_samples,
				 "corpus_tokens", (json_int_t)st.n_tokens_corpus,
				 "tokens_per_epoch", (json_int_t)(st.n_tokens_corpus - st.n_tokens_truncated),
				 "tokens_dropped", (json_int_t)st.n_tokens_truncated,
				 "dropped", "long_sentences", (json_int_t)st.n_tokens_truncated,
				 "documents", (json_int_t)st.n_docs,
				 "held_out_documents", (json_int_t)st.n_docs_other,
				 "held_out_tokens", (json_int_t)st.n_tokens_other,
				 "pad_fraction", st.pad_fraction,
				 "longest_sentence", (json_int_t)st.longest_sentence));
}

/* The best checkpoint as the checkpoint resumed from knew it, when that is
 * one of this job's own (init_from_restore "all" resumes from another
 * job's, whose steps name checkpoints that are not here). */
static void resume_best(worker *w)
{
	size_t n = strlen(w->checkpoint_dir);
	if (strncmp(w->resume_from, w->checkpoint_dir, n) != 0 || w->resume_from[n] != '/')
		return;
	json_t *ta = checkpoint_read_training_args(w->resume_from);
	json_t *b = json_object_get(ta, "best_model"), *st = json_object_get(b, "step"), *v = json_object_get(b, "value");
	const char *metric = json_string_value(json_object_get(b, "metric"));
	/* a best by another metric (the spec cannot change, but be sure) is no best */
	if (json_is_integer(st) && json_is_number(v) && metric &&
	    strcmp(metric, w->bj.spec.training.metric_for_best_model) == 0)
		w->best = (best_state){.step = (long)json_integer_value(st), .value = json_number_value(v)};
	json_decref(ta);
}

/* The host trainer: made from the spec (train.c) with what only this process
 * knows (the dataset's vocab, the threads), or resumed from a checkpoint,
 * whose step must be the job's. */
static int make_trainer(worker *w, bool on_gpu, train_config *tc)
{
	char err[512];
	jobspec_model *jm = &w->bj.spec.model;
	const shard_vocab_info *vi = &w->data.shards->vocab;
	if (jm->vocab_size <= 0)
		jm->vocab_size = (int)vi->vocab_size;
	if ((uint32_t)jm->vocab_size < vi->vocab_size)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
				   "model.vocab_size %d is smaller than the dataset's vocab (%u)", jm->vocab_size,
				   vi->vocab_size);
	const char *omp = getenv("OMP_NUM_THREADS");
	int threads = omp && atoi(omp) > 0 ? atoi(omp) : 1;
	if (train_config_from_jobspec(tc, &w->bj.spec, threads, (uint32_t)w->rank, err, sizeof err) < 0)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "%s", err);
	tc->model.pad_token_id = (int)vi->special.pad;
	if (tc->init_from && w->resume_from) /* the model is the checkpoint's; init_from may be gone */
		tc->init_from = w->resume_from;
	int rc = trainer_create(&w->tr, tc, err, sizeof err);
	if (rc < 0)
		return worker_fail(w, rc == -ENOMEM ? BERTD_EXIT_OOM : BERTD_EXIT_BAD_CONFIG, "%s", err);
	if (w->resume_from) {
		if ((rc = trainer_resume(w->tr, w->resume_from, err, sizeof err)) >= 0)
			rc = checkpoint_read_scaler(w->resume_from, &w->ckpt_scaler, err, sizeof err);
		if (rc < 0)
			return worker_fail(w, BERTD_EXIT_DATA, "resuming from %s: %s", w->resume_from, err);
		w->have_ckpt_scaler = rc == 0;
		resume_best(w);
		if (!on_gpu && w->have_ckpt_scaler && w->ckpt_scaler.enabled)
			log_info("the checkpoint's fp16 loss scale (%g) is not used: the CPU backend trains in fp32",
				 (double)w->ckpt_scaler.scale);
	}
	if (w->tr->step != w->bj.start_step)
		return worker_fail(w, BERTD_EXIT_DATA,
				   "checkpoint step %ld disagrees with the job's resume step %lld", w->tr->step,
				   (long long)w->bj.start_step);
	return 0;
}

/* The shm group of the job's ranks (world > 1): the loop's per-step sums,
 * the replica check, and the CPU device's gradients. */
static int join_ranks(worker *w)
{
	char cname[160];
	comm_name_for_job(cname, sizeof cname, w->bj.job_id);
	int rc = comm_create_shm(&w->cm, cname, w->rank, w->world, COMM_DEFAULT_MAX_FLOATS, LOOP_COMM_TIMEOUT_MS);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "joining the %d-rank group failed: %s", w->world,
				   strerror(-rc));
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
	if (*rank < 0 && relay_wanted()) /* a multi-node rank: srun numbered it */
		*rank = relay_rank();
	return *job_path && *rank >= 0 && optind == argc ? 0 : -EINVAL;
}

#define RELAY_GO_TIMEOUT_MS 120000

/* A multi-node rank (docs/multinode.md): the daemon's relay stands in for
 * fd 3; the daemon answers "go" once every rank on every node has joined
 * with the same dataset. */
static int join_relay(worker *w, const char *job_path)
{
	char err[512];
	int fd = relay_connect(job_path, w->rank, err, sizeof err);
	if (fd < 0) {
		log_error("%s", err);
		return BERTD_EXIT_PEER_LOST;
	}
	w->daemon_fd = fd;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	json_t *go = NULL;
	int rc = worker_await(w, "go", RELAY_GO_TIMEOUT_MS, &go);
	json_decref(go);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "the job's ranks did not all join: %s", strerror(-rc));
	return 0;
}

int main(int argc, char **argv)
{
	char name[32] = "bertd-worker";
	log_init(name, LOG_LVL_INFO);
	worker w = {.daemon_fd = -1, .last_eval_step = -1, .best = best_none()};
	loop_device dev = {0};
	const char *job_path;
	if (argc > 1 && strcmp(argv[1], "--export") == 0) /* a checkpoint into an HF model (convert.h) */
		return convert_main(argc, argv);
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

	const char *kind = NULL;
	bool on_gpu = false;
	train_config tc;
	int code = w.daemon_fd < 0 && relay_wanted() ? join_relay(&w, job_path) : 0;
	if (code == 0)
		code = open_job(&w, job_path, &kind, &on_gpu);
	if (code == 0)
		code = open_batches(&w);
	if (code == 0)
		report_data(&w);
	if (code == 0)
		code = make_trainer(&w, on_gpu, &tc);
	/* the host trainer made (or loaded) the weights; a GPU takes them */
#ifdef BERTD_CUDA
	if (code == 0 && on_gpu)
		code = device_gpu_create(&w, &dev);
#endif
	if (code == 0 && !on_gpu)
		code = device_cpu_create(&w, &dev);
	if (code == 0 && w.world > 1)
		code = join_ranks(&w);
	if (code == 0) {
		log_info("rank %d/%d on %s: %d layers, hidden %d, vocab %d, batch %u x %u, accumulation %d, from step %ld",
			 w.rank, w.world, kind, tc.model.num_hidden_layers, tc.model.hidden_size, tc.model.vocab_size,
			 w.bj.ring.layout.B, w.bj.ring.layout.T, w.bj.spec.training.gradient_accumulation_steps,
			 w.tr->step);
		code = loop_run(&w, &dev);
		if (code == BERTD_EXIT_PEER_LOST && w.cm)
			comm_abort(w.cm, -EPIPE);
	}
	if (dev.destroy)
		dev.destroy(dev.ctx, code);
	comm_destroy(w.cm);
	trainer_destroy(w.tr);
	eval_set_destroy(w.eval);
	if (w.rg)
		ring_detach(w.rg);
	free(w.local_slot);
	free(w.mlm_pos);
	free(w.mlm_lab);
	free(w.win_ph);
	batchjob_data_close(&w.data);
	if (relay_wanted()) /* the relay's EOF after this is an exit, not a lost rank */
		worker_send(&w, json_pack("{s:s, s:i}", "type", "bye", "code", code));
	msg_reader_free(&w.rd);
	json_decref(w.job);
	return code;
}
