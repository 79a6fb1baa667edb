/* device_cpu — the CPU backend of the training loop (loop.h): the host
 * trainer (train.h) is the model and reads each batch in place (no upload);
 * gradients are averaged over the ranks on the job's shm comm (w->cm), then
 * the optimizer steps. Never scales the loss (fp32 only), never copies the
 * model anywhere.
 */
#include <stdlib.h>

#include "common/exitcodes.h"
#include "worker/loop.h"
#include "worker/worker.h"

typedef struct cpu_device {
	worker *w;
	double loss; /* sum over the step's micro-batches so far */
} cpu_device;

/* trainer_micro draws the same dropout masks as d, from the trainer's seed and rank */
static int cpu_forward_backward(void *ctx, const bert_batch *b, const bert_dropout *d, int k, int M, char *err,
				size_t errlen)
{
	cpu_device *c = ctx;
	(void)d;
	if (k == 0) {
		bert_model_zero_grad(c->w->tr->model);
		c->loss = 0;
	}
	return trainer_micro(c->w->tr, b, k, M, &c->loss, err, errlen);
}

static double cpu_loss(void *ctx, int M)
{
	cpu_device *c = ctx;
	return c->loss / M;
}

static int cpu_update(void *ctx, loop_update *out)
{
	cpu_device *c = ctx;
	worker *w = c->w;
	bert_model *m = w->tr->model;
	if (w->cm) {
		double t0 = worker_now_s();
		int rc = comm_allreduce_mean(w->cm, m->grads_memory, m->num_params);
		if (rc < 0)
			return rc;
		out->comm_s = out->comm_host_s = worker_now_s() - t0;
	}
	return optim_step(w->tr->opt, m->params_memory, m->grads_memory, &out->lr, &out->grad_norm);
}

static int cpu_eval(void *ctx, const bert_batch *b, bert_eval_sums *acc)
{
	cpu_device *c = ctx;
	return bert_model_eval(c->w->tr->model, b, acc);
}

static void cpu_destroy(void *ctx, int exit_code)
{
	(void)exit_code; /* w->cm is worker_main.c's */
	free(ctx);
}

int device_cpu_create(worker *w, loop_device *dev)
{
	cpu_device *c = calloc(1, sizeof *c);
	if (!c)
		return worker_fail(w, BERTD_EXIT_OOM, "out of memory for the CPU device");
	c->w = w;
	*dev = (loop_device){
		.ctx = c, .reads_in_place = true, .forward_backward = cpu_forward_backward,
		.loss = cpu_loss, .update = cpu_update, .eval = cpu_eval, .destroy = cpu_destroy,
	};
	return 0;
}
