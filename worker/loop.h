/* loop — the one training loop of bertd-worker, for every backend.
 *
 * Each step: poll the daemon, take M micro-batches (the job's ring or built
 * here), hand each to the device (upload, forward + backward), one update
 * (the device reduces its gradients over ranks, then steps the optimizer),
 * sum loss / tokens / stop flag / busy time over the ranks (shm comm), time
 * every phase, log a window, check the replicas and checkpoint at save
 * steps. At the end (or on an agreed stop) rank 0 writes the checkpoint and
 * the HuggingFace export from the host trainer.
 *
 * The device is a table of functions (loop_device): the CPU model
 * (worker/device_cpu.c, the host trainer itself) and gpu_model
 * (worker/device_gpu.c, CUDA builds) implement it; the loop never names a
 * backend. Gradient communication stays behind comm.h (shm or NCCL), owned
 * by the device that uses it.
 *
 * worker_main.c owns the process: arguments, the daemon socket, signals,
 * exit codes. The loop returns the exit code and never exits.
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
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/train.h"

#define LOOP_COMM_TIMEOUT_MS 60000
#define LOOP_WIN_STEPS_MAX 4096 /* steps kept per logging window for the p95s */
#define LOOP_WIN_MAX_RANKS 64   /* per-rank busy times reported up to this world size */

/* Phases of a step, in the order of the metrics message's phases_ms. */
enum { PH_STEP, PH_DATA, PH_COMPUTE, PH_ALLREDUCE, PH_OPTIMIZER, PH_COUNT };

/* One rank's process state: set up by worker_main.c, run by loop_run. */
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
	void *local_slot;          /* (M, slot_bytes) serial path batches */
	int32_t *mlm_pos, *mlm_lab; /* (M*B*P,) flattened masked positions/labels */
	/* training */
	trainer *tr;               /* the host model: the CPU device itself, or the GPU's mirror */
	comm *cm;                  /* shm group of the job's ranks (world > 1) */
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
	double win_rank_busy_s[LOOP_WIN_MAX_RANKS]; /* (world,) per-rank data + fwd/bwd, summed */
	/* (LOOP_WIN_STEPS_MAX, PH_COUNT) per-step phase times of the window, ms,
	 * for the p95s; past LOOP_WIN_STEPS_MAX steps the oldest are overwritten */
	double (*win_ph)[PH_COUNT];
	ring_counters ring_prev;     /* loader counters at the window's start */
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
	bool h2d;                  /* upload copies to a device: its time is the h2d phase */
	bool reads_in_place;       /* upload keeps reading b's host memory until upload_wait
				      (or forward_backward, without upload_wait) has returned */
	/* Starts a step: zero the gradients and the step's loss. */
	void (*zero_grad)(void *ctx);
	/* Takes micro-batch b for the next forward_backward. */
	int (*upload)(void *ctx, const bert_batch *b, char *err, size_t errlen);
	/* Micro-batch k of M: forward on the uploaded batch, backward of loss/M
	 * into the gradients (+=); dropout as d. err may say more. */
	int (*forward_backward)(void *ctx, const bert_dropout *d, int k, int M, char *err, size_t errlen);
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
	/* Frees ctx; exit_code BERTD_EXIT_PEER_LOST aborts its communicator first. */
	void (*destroy)(void *ctx, int exit_code);
} loop_device;

/* Trains w->tr from w->tr->step to max_steps on dev. Returns the exit code
 * (common/exitcodes.h), failures already reported to the daemon. */
int loop_run(worker *w, const loop_device *dev);

/* The devices. Each returns 0 or the exit code, already reported; once *dev
 * is set (even if it then fails), loop_device.destroy frees it. */
int device_cpu_create(worker *w, loop_device *dev);
#ifdef BERTD_CUDA
/* Picks the precision, creates gpu_model from the host trainer's weights and
 * optimizer state, pins the batch memory when asked and joins the NCCL
 * group (world > 1). */
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
