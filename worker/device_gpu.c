/* device_gpu — the CUDA device of the training loop (loop.h, kind "cuda";
 * CUDA builds only; docs/cuda.md): the model trains in gpu_model, gradients
 * are averaged with NCCL (world > 1). The host trainer (w->tr) made the
 * weights the device takes here and is their mirror: to_host copies the
 * device state back before checkpoints, replica checks and the export, so
 * checkpoint.c and hf.c write the CPU's formats. The daemon sets
 * CUDA_VISIBLE_DEVICES to the job's GPU: this process uses device 0.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/exitcodes.h"
#include "common/log.h"
#include "worker/gpu_model.h"
#include "worker/loop.h"
#include "worker/worker.h"

#define GPU_DEVICE 0

typedef struct gpu_device {
	worker *w;
	gpu_model *gm;
	comm *nccl;                  /* gradient all-reduce between GPU ranks (world > 1) */
	void *pinned_area;           /* ring slot area or local_slot, cudaHostRegister'ed, or NULL */
	bool inplace;                /* uploads DMA from the batch's memory (loop_device.reads_in_place) */
	bool graph;                  /* lever GRAPH on one GPU: micro-batches as replayed CUDA graphs */
	double loss;                 /* sum of the step's micro-batch losses read so far */
	double gnorm_last;           /* last finite grad norm (fp16 skipped steps report it) */
	double t_sync0, t_sync1;     /* host time in the NCCL hooks' waits, this step */
} gpu_device;

/* ---- the device interface ---- */

/* In place (pinned, or pageable without pin_memory) the copy reads the
 * batch's memory until gpu_upload_wait; staged, it is copied out first. */
static int gpu_upload(void *ctx, const bert_batch *b, char *err, size_t errlen)
{
	gpu_device *g = ctx;
	return g->inplace ? gpu_model_upload_inplace(g->gm, b, err, errlen) : gpu_model_upload(g->gm, b, err, errlen);
}

static int gpu_upload_wait(void *ctx)
{
	gpu_device *g = ctx;
	return gpu_model_upload_wait(g->gm);
}

/* Zeroes the gradients (k = 0) or reads the previous micro-batch's loss
 * (the host fetched and uploaded this one while the device computed that
 * one), then enqueues forward and backward; only the last micro-batch's
 * gradients are final, so only its backward reduces buckets. */
static int gpu_forward_backward(void *ctx, const bert_batch *b, const bert_dropout *d, int k, int M, char *err,
				size_t errlen)
{
	(void)b; /* uploaded */
	(void)err;
	(void)errlen;
	gpu_device *g = ctx;
	int rc;
	if (k == 0) {
		gpu_model_zero_grad(g->gm);
		g->loss = 0;
	} else {
		g->loss += gpu_model_loss(g->gm);
	}
	/* lever GRAPH: forward, backward and (last) the buckets and the step
	 * in one launch; gpu_update waits for the step */
	if (g->graph)
		return gpu_model_train_micro(g->gm, d, gpu_model_loss_scale(g->gm) / (float)M, k == M - 1);
	if (k == M - 1)
		gpu_model_reduce_in_next_backward(g->gm);
	if ((rc = gpu_model_forward(g->gm, d, gpu_model_loss_scale(g->gm) / (float)M)) < 0)
		return rc;
	return gpu_model_backward(g->gm); /* -EPIPE: a gradient bucket's all-reduce lost a peer */
}

/* Staged upload (the eval set is the worker's own memory), forward without
 * dropout, sums read back: synchronous, between two steps. */
static int gpu_eval(void *ctx, const bert_batch *b, bert_eval_sums *acc)
{
	gpu_device *g = ctx;
	char err[256] = "";
	int rc = gpu_model_eval(g->gm, b, acc, err, sizeof err);
	if (rc < 0 && err[0])
		log_error("held-out evaluation: %s", err);
	return rc;
}

static double gpu_loss(void *ctx, int M)
{
	gpu_device *g = ctx;
	return (g->loss + gpu_model_loss(g->gm)) / M; /* waits for the last backward's forward */
}

/* The optimizer step, the NCCL all-reduce inside it. The exposed all-reduce
 * is the compute stream's wait, from CUDA events (host clocks would also
 * count the backward still running). */
static int gpu_update(void *ctx, loop_update *out)
{
	gpu_device *g = ctx;
	int skipped = 0;
	g->t_sync0 = g->t_sync1 = 0; /* the NCCL hooks set them */
	int rc = g->graph ? gpu_model_step_wait(g->gm, &out->lr, &out->grad_norm, &skipped)
			  : gpu_model_step(g->gm, &out->lr, &out->grad_norm, &skipped);
	if (rc < 0)
		return rc;
	if (skipped) {
		log_warn("step %ld: fp16 gradient overflow, update skipped (loss scale now %g)", g->w->tr->step,
			 (double)gpu_model_loss_scale(g->gm));
		out->grad_norm = g->gnorm_last; /* JSON has no infinity */
	}
	g->gnorm_last = out->grad_norm;
	out->comm_s = gpu_model_exposed_comm_ms(g->gm) / 1000.0;
	out->comm_host_s = g->t_sync1 - g->t_sync0;
	return 0;
}

/* The device's parameters (and optimizer state, loss scaler) into the host. */
static int gpu_to_host(void *ctx, bool opt_state, checkpoint_scaler *scaler)
{
	gpu_device *g = ctx;
	trainer *t = g->w->tr;
	int rc = g->nccl ? comm_nccl_drain(g->nccl) : 0;
	if (rc == 0)
		rc = gpu_model_get_params(g->gm, t->model->params_memory);
	if (rc == 0 && opt_state) {
		rc = gpu_model_get_opt_state(g->gm, t->opt->state_memory);
		t->opt->t = g->gm->t;
	}
	if (scaler) {
		gpu_loss_scaler gs;
		gpu_model_get_scaler(g->gm, &gs);
		*scaler = (checkpoint_scaler){.scale = gs.scale, .enabled = gs.enabled, .good_steps = gs.good_steps,
					      .growth_interval = gs.growth_interval, .skipped = gs.skipped};
	}
	return rc;
}

static void gpu_destroy(void *ctx, int exit_code)
{
	gpu_device *g = ctx;
	if (g->graph) /* what the lever did, for the job's log (tests/cudasim/test_daemon_job.c) */
		log_info("lever GRAPH: %ld capture(s), %ld graph launch(es)%s", g->gm->graph_captures,
			 g->gm->graph_launches, g->gm->graph_off ? ", graphs off after a failed capture" : "");
	if (exit_code == BERTD_EXIT_PEER_LOST && g->nccl)
		comm_abort(g->nccl, -EPIPE);
	comm_destroy(g->nccl);
	gpu_model_destroy(g->gm);
	if (g->pinned_area)
		cudaHostUnregister(g->pinned_area);
	cuda_kernels_shutdown();
	free(g);
}

/* ---- NCCL: the unique id over the daemon socket, the all-reduce hooks ---- */

#ifdef BERTD_NCCL
static int nccl_id_send(void *ctx, const void *id, size_t len)
{
	gpu_device *g = ctx;
	char hex[2 * 512 + 1];
	if (g->w->ch.fd < 0 || len > 512)
		return -ENOTCONN; /* run by hand: nobody relays the id */
	for (size_t i = 0; i < len; i++)
		snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)id)[i]);
	return worker_send(g->w, json_pack("{s:s, s:s}", "type", "nccl_id", "id", hex));
}

/* Ranks > 0: rank 0's id, relayed by the daemon (bounded wait). */
static int nccl_id_recv(void *ctx, void *id, size_t len)
{
	gpu_device *g = ctx;
	json_t *m;
	int rc = worker_await(g->w, "nccl_id", LOOP_COMM_TIMEOUT_MS, &m);
	if (rc < 0)
		return rc;
	const char *hex = json_string_value(json_object_get(m, "id"));
	rc = hex && strlen(hex) == 2 * len ? 0 : -EPROTO;
	for (size_t i = 0; rc == 0 && i < len; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			rc = -EPROTO;
		((unsigned char *)id)[i] = (unsigned char)v;
	}
	json_decref(m);
	return rc;
}

/* The overlapped path: gpu_model enqueues each gradient bucket (its ranges
 * in one NCCL group) as backward finishes it, ordered after the compute
 * stream s; then, in gpu_model_step, finish makes the compute stream wait
 * for them all. gpu_model_step then syncs the host once (the norm): finish
 * drains first, so a lost peer is a bounded -EPIPE here, not a hang there. */
static int nccl_bucket(void *ctx, float *const *grads, const size_t *n, int k, cudaStream_t s)
{
	gpu_device *g = ctx;
	return comm_nccl_bucket_start_ranges(g->nccl, grads, n, k, s);
}

static int nccl_bucket_finish(void *ctx, cudaStream_t s)
{
	gpu_device *g = ctx;
	g->t_sync0 = worker_now_s();
	int rc = comm_nccl_buckets_wait(g->nccl, s);
	if (rc == 0)
		rc = comm_nccl_drain(g->nccl);
	g->t_sync1 = worker_now_s();
	return rc;
}

/* Lever GRAPH: the buckets ran inside the launched step's graph (finish
 * above only joined them there: comm_nccl_drain has nothing to drain in a
 * capture); the bounded wait for a lost peer comes here, after the launch,
 * on the event recorded behind it. */
static int nccl_bucket_settle(void *ctx, cudaEvent_t done)
{
	gpu_device *g = ctx;
	g->t_sync0 = worker_now_s();
	int rc = comm_nccl_wait_event(g->nccl, done);
	g->t_sync1 = worker_now_s();
	return rc;
}

/* gpu_model's all-reduce hook (docs/formats.md, NCCL backend): the whole
 * gradient after backward (BERTD_DDP_OVERLAP=0), ordered after the stream
 * gpu_model hands it (its compute stream, see join_nccl). */
static int nccl_hook(void *ctx, float *grads, size_t n, cudaStream_t s)
{
	gpu_device *g = ctx;
	g->t_sync0 = worker_now_s();
	int rc = comm_nccl_allreduce_mean(g->nccl, grads, n, s);
	g->t_sync1 = worker_now_s();
	return rc;
}
#endif

/* ---- setup ---- */

/* Restores the loss scaler of the checkpoint resumed from. */
static int restore_scaler(gpu_device *g, kdtype dt)
{
	worker *w = g->w;
	const checkpoint_scaler *cs = &w->ckpt_scaler;
	gpu_loss_scaler gs = {.scale = cs->scale, .enabled = cs->enabled, .growth_interval = cs->growth_interval,
			      .good_steps = cs->good_steps, .skipped = cs->skipped};
	if (gpu_model_set_scaler(g->gm, &gs) < 0) /* checkpoint.c validated the same bounds */
		return worker_fail(w, BERTD_EXIT_DATA, "the checkpoint's loss scaler is not usable");
	if (g->gm->scaler.enabled && cs->enabled)
		log_info("fp16 loss scale restored from the checkpoint: %g (%d good steps, %ld skipped)",
			 (double)cs->scale, cs->good_steps, cs->skipped);
	else if (cs->enabled)
		log_info("the checkpoint's fp16 loss scale (%g) is not used: training in %s", (double)cs->scale,
			 kdtype_name(dt));
	return 0;
}

/* The likely causes of a refused cudaHostRegister, by error. The driver
 * pins pages itself: RLIMIT_MEMLOCK (LimitMEMLOCK) does not apply, so it is
 * never the cause named here. */
static const char *pin_hint(cudaError_t ce)
{
	switch (ce) {
	case cudaErrorMemoryAllocation:
		return ": the driver could not lock that much host memory (memory pressure, or "
		       "too many other pinned buffers on this machine)";
	case cudaErrorHostMemoryAlreadyRegistered:
		return ": part of the area is already registered by another CUDA context of this "
		       "process";
	case cudaErrorNotSupported:
		return ": this system does not support registering this memory (some virtualized "
		       "GPUs, or a mapping the driver cannot pin)";
	case cudaErrorInvalidValue:
		return ": the area is not page-aligned or its size is wrong (a bertd bug: report it)";
	default:
		return "";
	}
}

/* Where uploads read a batch from (docs/cuda.md, "Data path"). pin_memory:
 * in place from the batch memory (ring slot area or serial buffer), locked
 * once, or, if the kernel refuses to lock it, staged through gpu_model's
 * pinned buffer. Without: from the pageable slot, which the driver stages
 * synchronously. Returns whether uploads read in place. */
static bool pick_h2d(gpu_device *g)
{
	worker *w = g->w;
	const jobspec_training *ta = &w->bj.spec.training;
	if (!ta->dataloader_pin_memory) {
		log_info("H2D: dataloader_pin_memory is false: batches copied from pageable memory");
		return true;
	}
	size_t bytes = (size_t)ta->gradient_accumulation_steps * w->bj.ring.layout.slot_bytes;
	void *area = w->rg ? ring_slot_area(w->rg, &bytes) : w->local_slot;
	cudaError_t ce = cudaHostRegister(area, bytes, cudaHostRegisterDefault);
	if (ce != cudaSuccess) {
		(void)cudaGetLastError(); /* not sticky: later launch checks must not see it */
		log_warn("cannot pin the %s (%zu bytes): cudaHostRegister: %s (%s)%s; staging each batch "
			 "through a pinned buffer", w->rg ? "batch ring" : "batch buffer", bytes,
			 cudaGetErrorName(ce), cudaGetErrorString(ce), pin_hint(ce));
		return false;
	}
	g->pinned_area = area;
	log_info("H2D: batches DMA'd in place from the pinned %s (%zu bytes registered)",
		 w->rg ? "ring slots" : "batch buffer", bytes);
	return true;
}

/* Joins the NCCL group and hooks it into gpu_model. */
static int join_nccl(gpu_device *g)
{
	worker *w = g->w;
#ifdef BERTD_NCCL
	const char *rd = w->bj.spec.training.ddp_reduce_dtype; /* normalized: fp32 | bf16 | fp16 */
	comm_dtype reduce = !strcmp(rd, "bf16") ? COMM_BF16 : !strcmp(rd, "fp16") ? COMM_FP16 : COMM_FP32;
	int rc = comm_create_nccl(&g->nccl, w->rank, w->world, GPU_DEVICE, reduce, nccl_id_send, nccl_id_recv, g,
				  LOOP_COMM_TIMEOUT_MS);
	if (rc == -ENOENT || rc == -ENOSYS) { /* the daemon refuses such jobs at submit; a backstop */
		char why[640];
		comm_nccl_load(why, sizeof why);
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
				   "a %d-GPU job needs NCCL: %s (install NCCL 2.14 or newer, e.g. pip install "
				   "nvidia-nccl-cu12, or set bertd's nccl_path)", w->world, why);
	}
	if (rc == -ECANCELED) {
		log_info("stopped while waiting for the NCCL id");
		return BERTD_EXIT_STOPPED;
	}
	if (rc == -ENOMEM)
		return worker_fail(w, BERTD_EXIT_OOM,
				   "no device memory left for the NCCL communicator on this rank");
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "joining the %d-GPU NCCL group failed: %s",
				   w->world, strerror(-rc));
	/* the hook runs on the compute stream itself: comm_nccl orders its own
	 * comm stream after it with an event */
	if ((rc = gpu_model_set_allreduce(g->gm, nccl_hook, g, g->gm->compute)) < 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "setting the all-reduce hook: %s", strerror(-rc));
	/* BERTD_DDP_OVERLAP=0: one all-reduce after backward (the hook above),
	 * e.g. to rule the overlap out when debugging a GPU run */
	const char *ov = getenv("BERTD_DDP_OVERLAP");
	if (!(ov && strcmp(ov, "0") == 0)) {
		gpu_model_set_buckets(g->gm, nccl_bucket, nccl_bucket_finish, g);
		gpu_model_set_bucket_settle(g->gm, nccl_bucket_settle);
	}
	return 0;
#else
	return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
			   "a %d-GPU job, but this bertd-worker was built without NCCL", w->world);
#endif
}

/* Picks the precision, makes gpu_model from the host trainer's weights and
 * optimizer state, pins the batch memory, joins the NCCL group (world > 1).
 * *dev is set first: whatever fails below, loop_device.destroy frees g. */
int device_gpu_create(worker *w, loop_device *dev)
{
	char err[512];
	const jobspec_training *ta = &w->bj.spec.training;
	const batch_layout *l = &w->bj.ring.layout;
	gpu_device *g = calloc(1, sizeof *g);
	if (!g)
		return worker_fail(w, BERTD_EXIT_OOM, "out of memory for the GPU device");
	g->w = w;
	*dev = (loop_device){
		.ctx = g, .upload = gpu_upload, .forward_backward = gpu_forward_backward,
		.loss = gpu_loss, .update = gpu_update, .to_host = gpu_to_host, .eval = gpu_eval,
		.destroy = gpu_destroy,
	};
	/* the spec's bf16/fp16 (1, 0, JOBSPEC_AUTO) as gpu_precision_pick's wish */
	const char *want = ta->bf16 == 1 ? "bf16" : ta->fp16 == 1 ? "fp16"
				 : ta->bf16 == 0 && ta->fp16 == 0 ? "fp32" : "auto";
	kdtype dt;
	int rc = gpu_precision_pick(want, GPU_DEVICE, &dt, err, sizeof err);
	if (rc == -ENOTSUP || rc == -EINVAL)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "%s", err);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "no usable CUDA device: %s", err);
	/* auto picked what the spec turned off (e.g. bf16: false): full precision */
	if ((dt == KDT_BF16 && ta->bf16 == 0) || (dt == KDT_F16 && ta->fp16 == 0))
		dt = KDT_F32;
	/* the communicator comes after the model and allocates on the device
	 * too: keep room for it, or "the largest batch that fits" fails at the
	 * first collective */
	size_t reserve = gpu_model_comm_reserve_bytes(&w->tr->model->cfg, w->world,
						      strcmp(ta->ddp_reduce_dtype, "fp32") != 0);
	rc = gpu_model_create_reserving(&g->gm, &w->tr->model->cfg, dt, GPU_DEVICE, (int)l->B, (int)l->T,
					(int)(l->B * l->P), &w->tr->opt->cfg, reserve, err, sizeof err);
	if (rc == -ENOMEM)
		return worker_fail(w, BERTD_EXIT_OOM, "%s", err); /* names the largest batch that fits */
	if (rc == -EINVAL)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "%s", err);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "creating the GPU model: %s", err);
	if ((rc = gpu_model_set_params(g->gm, w->tr->model->params_memory)) < 0 ||
	    (rc = gpu_model_set_opt_state(g->gm, w->tr->opt->state_memory, w->tr->opt->t)) < 0)
		return worker_fail(w, BERTD_EXIT_FAILURE, "copying the model to the GPU: %s", strerror(-rc));
	int code;
	if (w->have_ckpt_scaler && (code = restore_scaler(g, dt)) != 0)
		return code;
	if ((dev->reads_in_place = g->inplace = pick_h2d(g)))
		dev->upload_wait = gpu_upload_wait;
	if (w->world > 1 && (code = join_nccl(g)) != 0)
		return code;
	/* lever GRAPH: one GPU, or NCCL buckets (captured with the step); the
	 * single all-reduce after backward (BERTD_DDP_OVERLAP=0) waits on the
	 * host, so those steps keep the eager launches, with the step's values
	 * on the device */
	g->graph = (g->gm->levers & CUDA_LEVER_GRAPH) && (w->world == 1 || g->gm->bucket);
	if (g->graph)
		log_info("lever GRAPH: %s, the micro-batches run as captured and replayed CUDA graphs",
			 w->world == 1 ? "one GPU" : "NCCL gradient buckets");
	if ((g->gm->levers & CUDA_LEVER_GRAPH) && !g->graph)
		log_info("lever GRAPH: %d GPUs without gradient buckets (BERTD_DDP_OVERLAP=0), so the "
			 "steps run without CUDA graphs (the single all-reduce is not captured)", w->world);
	log_info("GPU model: %s, batch %u x %u, %zu parameters", kdtype_name(dt), l->B, l->T, g->gm->num_params);
	return 0;
}
