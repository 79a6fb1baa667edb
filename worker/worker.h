/* worker — one rank's process state (the worker struct) and its line to
 * the daemon: the socket on fd 3, or a multi-node rank's relay connection
 * (docs/formats.md, "Messages"). worker_main.c sets the state up;
 * the training loop (loop.c) and the devices (device_cpu.c, device_gpu.c)
 * report through worker_send / worker_fail and read stops with worker_poll.
 *
 * Calls nothing of the loop, the devices or worker_main.c, so they all
 * depend on it and it on none of them; never exits, never touches SQLite.
 */
#ifndef BERTD_WORKER_WORKER_H
#define BERTD_WORKER_WORKER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/chan.h"
#include "common/msg.h"
#include "loader/batchjob.h"
#include "loader/ring.h"
#include "worker/best.h"
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/eval.h"
#include "worker/nodeloaders.h"
#include "worker/train.h"

/* The training loop's logging window (loop.c), held in the worker. */
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
	chan ch;                   /* the line to the daemon (common/chan.h); ch.fd -1 without one */
	bool stop_requested;
	bool stop_ends_job;        /* the stop was a cancel: export the stop checkpoint's model */
	/* batches */
	batchjob_data data;        /* serial path (no loaders) */
	ring *rg;                  /* loader path */
	int ring_rank;             /* this rank's index in rg: rank, or its index on its node */
	nodeloaders nl;            /* a multi-node job's loaders, on its node's first rank */
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

/* Sends m to the daemon and releases it: queued until a daemon acknowledges
 * it (chan.h), so a daemon that comes back later gets it; a "progress"
 * heartbeat goes only to a connected daemon; dropped when run by hand.
 * 0, or a negative errno (-ENOMEM for a NULL m). */
int worker_send(worker *w, json_t *m);
/* Logs and tells the daemon why (an error message, its code named after the
 * exit code), then returns code: the exit code to use, not BERTD_EXIT_OK. */
int worker_fail(worker *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Non-blocking look at the daemon's line: sets w->stop_requested (and
 * w->stop_ends_job for a cancel); a new daemon's connection is taken. The
 * daemon gone is a stop only for a rank no daemon can adopt (one without
 * its socket, a relayed rank past its redial bound): the others train on. */
void worker_poll(worker *w);
/* Waits up to timeout_ms for the daemon's next message of `type` (caller
 * owns *out); others are dropped. -ECANCELED on a stop, -ENOTCONN run by
 * hand, -EPIPE the daemon is gone, -ETIMEDOUT. */
int worker_await(worker *w, const char *type, int timeout_ms, json_t **out);
/* Monotonic clock, seconds: every phase time of the worker. */
double worker_now_s(void);

#endif
