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
 * and never exits. Both the loop and the devices reach the daemon only
 * through worker.h, never through worker_main.c.
 */
#ifndef BERTD_WORKER_LOOP_H
#define BERTD_WORKER_LOOP_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/checkpoint.h"
#include "worker/train.h"
#include "worker/worker.h"

#define LOOP_COMM_TIMEOUT_MS 60000

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

#endif
