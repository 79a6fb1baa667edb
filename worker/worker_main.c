/* bertd-worker — one training process of a job: rank r of G, one device.
 *
 * Reads the job file the daemon wrote (docs/formats.md), builds or loads the
 * model, opens its batches (the job's ring when loaders run, else the
 * dataset, to build them here: dataloader_num_workers = 0, the serial
 * baseline), picks the device (worker/device_cpu.c, or device_gpu.c for kind
 * "cuda" in CUDA builds), joins the job's ranks and runs the training loop
 * (worker/loop.c), which reports to the daemon over fd 3: hello, metrics
 * every logging_steps (rank 0, reduced over ranks), checkpoints, errors.
 * Rank 0 writes the checkpoints and, at the end, the HuggingFace export.
 *
 * This file is the process: arguments, the daemon socket, signals, the exit
 * code (common/exitcodes.h). Stopping: a {"type":"stop"} from the daemon
 * (cancel, shutdown), or the daemon gone, sets stop_requested; the loop
 * agrees on it across ranks, rank 0 checkpoints and every rank exits 6.
 * Never touches SQLite; never exits from anywhere but main.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <poll.h>
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
#include "worker/loop.h"
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

int worker_fail(worker *w, int code, const char *kind, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	log_error("%s", msg);
	worker_send(w, json_pack("{s:s, s:s, s:s, s:i}", "type", "error", "code", kind, "message", msg,
				 "rank", w->rank));
	return code;
}

static bool is_stop(json_t *m)
{
	const char *type = json_string_value(json_object_get(m, "type"));
	if (!type || strcmp(type, "stop") != 0)
		return false;
	log_info("stop requested (%s)", json_string_value(json_object_get(m, "reason")));
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
		if (n < 0)
			break;
	}
	json_t *m;
	while (msg_reader_next(&w->rd, &m) == 1) {
		if (is_stop(m))
			w->stop_requested = true;
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
		int rc;
		while ((rc = msg_reader_next(&w->rd, &m)) == 1) {
			const char *t = json_string_value(json_object_get(m, "type"));
			if (is_stop(m)) {
				w->stop_requested = true;
				json_decref(m);
				return -ECANCELED;
			}
			if (t && strcmp(t, type) == 0) {
				*out = m;
				return 0;
			}
			json_decref(m);
		}
		if (rc < 0)
			return rc;
		double left = deadline - worker_now_s();
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

int main(int argc, char **argv)
{
	char name[32] = "bertd-worker";
	log_init(name, LOG_LVL_INFO);
	worker w = {.daemon_fd = -1};
	loop_device dev = {0};
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
		code = worker_fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "cannot read job file %s: %s",
				   job_path, jerr.text);
		goto out;
	}
	if (batchjob_from_json(w.job, &w.bj) < 0) {
		code = worker_fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "job file %s is not usable (see log)",
				   job_path);
		goto out;
	}
	w.world = (int)w.bj.world_size;
	w.checkpoint_dir = jstr(w.job, "checkpoint_dir");
	w.export_dir = jstr(w.job, "export_dir");
	w.resume_from = jstr(w.job, "resume_from");
	const char *kind = jstr(json_array_get(json_object_get(w.job, "devices"), (size_t)w.rank), "kind");
	if (w.rank >= w.world || !w.checkpoint_dir || !w.export_dir || !kind) {
		code = worker_fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config",
				   "job file lacks rank %d's device or its directories",
			    w.rank);
		goto out;
	}
	worker_send(&w, json_pack("{s:s, s:i, s:i, s:s}", "type", "hello", "rank", w.rank, "pid", (int)getpid(),
			       "device", kind));
	bool on_gpu = false;
#ifdef BERTD_CUDA
	on_gpu = strcmp(kind, "cuda") == 0;
#endif
	if (strcmp(kind, "cpu") != 0 && !on_gpu) {
		/* refuse rather than silently train on the CPU */
		code = worker_fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config",
#ifdef BERTD_CUDA
			    "device kind %s: this bertd-worker trains on \"cpu\" or \"cuda\"", kind);
#else
			    "device kind %s: this bertd-worker was built without CUDA (CPU backend only)", kind);
#endif
		goto out;
	}
	if (!on_gpu && (w.bj.spec.training.bf16 == 1 || w.bj.spec.training.fp16 == 1)) {
		code = worker_fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config",
			    "bf16/fp16 asked for, but this job runs on the CPU backend (fp32 only)");
		goto out;
	}

	/* Data: the dataset is opened by every rank (its vocab sizes the model);
	 * batches come from the ring when loaders run, else are built here. */
	if ((rc = batchjob_data_open(&w.bj, &w.data)) < 0) {
		code = worker_fail(&w, BERTD_EXIT_DATA, "data", "dataset %s: %s", w.bj.dataset_dir, strerror(-rc));
		goto out;
	}
	const batch_layout *l = &w.bj.ring.layout;
	int M = w.bj.spec.training.gradient_accumulation_steps;
	if (M > 64) {
		code = worker_fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "gradient_accumulation_steps above 64");
		goto out;
	}
	w.mlm_pos = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w.mlm_lab = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w.win_ph = calloc(LOOP_WIN_STEPS_MAX, sizeof *w.win_ph);
	if (!w.mlm_pos || !w.mlm_lab || !w.win_ph) {
		code = worker_fail(&w, BERTD_EXIT_OOM, "oom", "out of memory for batch buffers");
		goto out;
	}
	if (w.bj.spec.training.dataloader_num_workers == 0 &&
	    posix_memalign(&w.local_slot, BATCH_ALIGN, (size_t)M * l->slot_bytes) != 0) {
		code = worker_fail(&w, BERTD_EXIT_OOM, "oom", "out of memory for batch slots");
		goto out;
	}
	if (w.bj.spec.training.dataloader_num_workers > 0 &&
	    (rc = ring_open(&w.rg, w.bj.shm_name, &w.bj.ring)) < 0) {
		code = worker_fail(&w, BERTD_EXIT_DATA, "data", "cannot open the batch ring %s: %s", w.bj.shm_name,
			    strerror(-rc));
		goto out;
	}

	train_config tc;
	if (build_train_config(&w, &tc, err, sizeof err) < 0) {
		code = worker_fail(&w, BERTD_EXIT_BAD_CONFIG, "bad_config", "%s", err);
		goto out;
	}
	if ((rc = trainer_create(&w.tr, &tc, err, sizeof err)) < 0) {
		code = worker_fail(&w, rc == -ENOMEM ? BERTD_EXIT_OOM : BERTD_EXIT_BAD_CONFIG,
			    rc == -ENOMEM ? "oom" : "bad_config", "%s", err);
		goto out;
	}
	if (w.resume_from && (rc = trainer_resume(w.tr, w.resume_from, err, sizeof err)) < 0) {
		code = worker_fail(&w, BERTD_EXIT_DATA, "data", "resuming from %s: %s", w.resume_from, err);
		goto out;
	}
	if (w.resume_from) {
		rc = checkpoint_read_scaler(w.resume_from, &w.ckpt_scaler, err, sizeof err);
		if (rc < 0) {
			code = worker_fail(&w, BERTD_EXIT_DATA, "data", "resuming from %s: %s", w.resume_from, err);
			goto out;
		}
		w.have_ckpt_scaler = rc == 0;
		if (!on_gpu && w.have_ckpt_scaler && w.ckpt_scaler.enabled)
			log_info("the checkpoint's fp16 loss scale (%g) is not used: the CPU backend trains in fp32",
				 (double)w.ckpt_scaler.scale);
	}
	if (w.tr->step != w.bj.start_step) {
		code = worker_fail(&w, BERTD_EXIT_DATA, "data",
				   "checkpoint step %ld disagrees with the job's resume step %lld",
			    w.tr->step, (long long)w.bj.start_step);
		goto out;
	}
	/* the host trainer above made (or loaded) the weights; a GPU takes them */
#ifdef BERTD_CUDA
	code = on_gpu ? device_gpu_create(&w, &dev) : device_cpu_create(&w, &dev);
#else
	code = device_cpu_create(&w, &dev);
#endif
	if (code != 0)
		goto out;
	if (w.world > 1) {
		char cname[160];
		comm_name_for_job(cname, sizeof cname, w.bj.job_id);
		if ((rc = comm_create_shm(&w.cm, cname, w.rank, w.world, COMM_DEFAULT_MAX_FLOATS,
					  LOOP_COMM_TIMEOUT_MS)) < 0) {
			code = worker_fail(&w, BERTD_EXIT_PEER_LOST, "peer_lost",
					   "joining the %d-rank group failed: %s",
				    w.world, strerror(-rc));
			goto out;
		}
	}
	log_info("rank %d/%d on %s: %d layers, hidden %d, vocab %d, batch %u x %u, accumulation %d, from step %ld",
		 w.rank, w.world, kind, tc.model.num_hidden_layers, tc.model.hidden_size, tc.model.vocab_size, l->B,
		 l->T, M, w.tr->step);
	code = loop_run(&w, &dev);
	if (code == BERTD_EXIT_PEER_LOST && w.cm)
		comm_abort(w.cm, -EPIPE);
out:
	if (dev.destroy)
		dev.destroy(dev.ctx, code);
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
