/* loop — the one training loop of bertd-worker, for every backend.
 *
 * Each step: poll the daemon, take M micro-batches (the job's ring or built
 * here), hand each to the device (upload, forward + backward), one update
 * (the device reduces its gradients over ranks, then steps the optimizer),
 * sum loss / tokens / stop flag / busy time over the ranks (shm comm), time
 * every phase, log a window, check the replicas and checkpoint at save
 * steps; at the end (or on an agreed stop), the checkpoint and the export.
 *
 * The device is a table of functions (loop_device), implemented by the CPU
 * model (device_cpu.c) and gpu_model (device_gpu.c): the loop never names a
 * backend. worker_main.c owns the process; the loop returns the exit code
 * and never exits.
 */
#ifndef BERTD_WORKER_LOOP_H
#define BERTD_WORKER_LOOP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"
#include "loader/batchjob.h"
#include "loader/ring.h"
#include "worker/best.h"
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/eval.h"
#include "worker/train.h"

#define LOOP_COMM_TIMEOUT_MS 60000
#define LOOP_WIN_STEPS_MAX 4096 /* steps kept per logging window for the p95s */
#define LOOP_WIN_MAX_RANKS 64   /* per-rank busy times reported up to this world size */

/* Phases of a step (the step itself first), as in the metrics message. */
enum { PH_STEP, PH_DATA, PH_H2D, PH_COMPUTE, PH_ALLREDUCE, PH_OPTIMIZER, PH_COUNT };

/* One rank's process state: set up by worker_main.c, run by loop_run. */
typedef struct worker {
	int rank, world;
	batchjob bj;
	json_t *job;               /* the job file */
	const char *checkpoint_dir, *export_dir, *resume_from;
	int daemon_fd;             /* -1 when run by hand without a daemon */
	msg_reader rd;
	bool stop_requested;
	bool stop_ends_job;        /* the stop was a cancel: export the stop checkpoint's model */
	/* batches */
	batchjob_data data;        /* serial path (no loaders) */
	ring *rg;                  /* loader path */
	void *local_slot;          /* (M, slot_bytes) serial path batches */
	int32_t *mlm_pos, *mlm_lab; /* (M*B*P,) flattened masked positions/labels */
	/* training */
	trainer *tr;               /* the host model: the CPU device itself, or the GPU's mirror */
	comm *cm;                  /* the job's ranks (world > 1): shm, or net across hosts */
	checkpoint_scaler ckpt_scaler; /* loss scaler of the checkpoint resumed from */
	bool have_ckpt_scaler;       /* false: none, or a checkpoint that predates it */
	uint64_t epoch;              /* of the last batch taken */
	struct {                     /* the current logging window's sums, zeroed at its end */
		double phase_s[PH_COUNT]; /* exact sums; h2d (uploads to a device) 0 on the CPU */
		double tokens;
		double loss;         /* of the step losses (rank-averaged) */
		int64_t steps;
		double ckpt_s;       /* rank 0's checkpoint writes (training stalls) */
		double eval_s;       /* held-out evaluations (the phase "eval") */
		double rank_busy_s[LOOP_WIN_MAX_RANKS]; /* (world,) per-rank data + fwd/bwd */
	} win;
	/* (LOOP_WIN_STEPS_MAX, PH_COUNT) per-step phase times of the window, ms,
	 * for the p95s; past LOOP_WIN_STEPS_MAX steps the oldest are overwritten */
	double (*win_ph)[PH_COUNT];
	ring_counters ring_prev;     /* loader counters at the window's start */
	eval_set *eval;              /* held-out eval set (eval_strategy "steps"), or NULL */
	double eval_tick_s;          /* last progress message sent during an evaluation */
	long last_eval_step;         /* step of last_eval; -1 before the first evaluation */
	eval_result last_eval;
	best_state best;             /* rank 0: the best checkpoint by metric_for_best_model */
} worker;

/* What a device reports of one update. */
typedef struct loop_update {
	double lr, grad_norm;     /* grad_norm: the last finite one when the update was skipped */
	double comm_s;            /* gradient reduction the compute waited for (the allreduce phase) */
	double comm_host_s;       /* part of the update call's host time spent in that reduction */
} loop_update;

/* A training device. Every int function returns 0 or a negative errno:
 * -EPIPE / -EPROTO a peer is lost, -ENOMEM out of memory, -EINVAL (upload)
 * an unusable batch, -ERANGE (update) a non-finite gradient norm. */
typedef struct loop_device {
	void *ctx;
	bool reads_in_place;       /* b's host memory is read until upload_wait (or, without
				      it, forward_backward) has returned */
	/* NULL (forward_backward reads b), or copies micro-batch b to the
	 * device for the next forward_backward: its time is the h2d phase. */
	int (*upload)(void *ctx, const bert_batch *b, char *err, size_t errlen);
	/* Micro-batch k of M: forward on b (or the uploaded batch), backward of
	 * loss/M into the gradients (+=); dropout as d. err may say more. k = 0
	 * starts a step: the gradients and the step's loss are zeroed first. */
	int (*forward_backward)(void *ctx, const bert_batch *b, const bert_dropout *d, int k, int M, char *err,
				size_t errlen);
	/* NULL, or waits until the last upload stopped reading host memory. */
	int (*upload_wait)(void *ctx);
	/* Mean loss of the step's M micro-batches (waits for it). */
	double (*loss)(void *ctx, int M);
	/* Averages the gradients over the ranks and applies the optimizer. */
	int (*update)(void *ctx, loop_update *out);
	/* NULL (the host trainer is the model, fp32: never scales the loss), or
	 * copies the device's parameters (and, with opt_state, the optimizer
	 * state) into the host trainer, and its loss scaler into *scaler. */
	int (*to_host)(void *ctx, bool opt_state, checkpoint_scaler *scaler);
	/* Forward of b without dropout or gradient, adding its masked-LM sums
	 * to *acc (worker/eval.c); a training step may follow at once. */
	int (*eval)(void *ctx, const bert_batch *b, bert_eval_sums *acc);
	/* Frees ctx; exit_code BERTD_EXIT_PEER_LOST aborts its communicator first. */
	void (*destroy)(void *ctx, int exit_code);
} loop_device;

/* Trains w->tr from w->tr->step to max_steps on dev. Returns the exit code
 * (common/exitcodes.h), failures already reported to the daemon. */
int loop_run(worker *w, const loop_device *dev);

/* The devices (device_cpu.c; device_gpu.c in CUDA builds). Each returns 0
 * or the exit code, already reported; once *dev is set (even if it then
 * fails), loop_device.destroy frees it. */
int device_cpu_create(worker *w, loop_device *dev);
#ifdef BERTD_CUDA
int device_gpu_create(worker *w, loop_device *dev);
#endif

/* ---- the daemon socket (worker_main.c) ---- */

/* Sends m to the daemon (dropped when run by hand) and releases it.
 * 0, or a negative errno (-ENOMEM for a NULL m). */
int worker_send(worker *w, json_t *m);
/* Logs and tells the daemon why (an error message, its code named after the
 * exit code), then returns code: the exit code to use, not BERTD_EXIT_OK. */
int worker_fail(worker *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Non-blocking look at the daemon's socket: sets w->stop_requested. */
void worker_poll(worker *w);
/* Waits up to timeout_ms for the daemon's next message of `type` (caller
 * owns *out); others are dropped. -ECANCELED on a stop, -ENOTCONN run by
 * hand, -EPIPE the daemon is gone, -ETIMEDOUT. */
int worker_await(worker *w, const char *type, int timeout_ms, json_t **out);
double worker_now_s(void);

#endif
