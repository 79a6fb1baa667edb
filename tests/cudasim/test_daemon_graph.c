/* A daemon job with the lever GRAPH (docs/cuda.md, "The step as a CUDA
 * graph") on ONE "GPU" of the stand-in: bertd with --devices cuda and
 * BERTD_LEVER_GRAPH=1 in its environment (daemon/childenv.c passes it to the
 * workers) runs the bertd-worker of tests/cudasim/bin, whose one GPU
 * launches every micro-batch as a captured and replayed CUDA graph
 * (worker/device_gpu.c; with more GPUs the launches stay eager, so
 * cudasim_daemon_job's 2-GPU jobs never take this path). Checked through the
 * REST API:
 *   - the job completes on one cuda device; the worker's log says the graph
 *     path was taken: "lever GRAPH: N capture(s), M graph launch(es)" with
 *     N > 0 and M > 0 and no failed capture (no fallback line);
 *   - kill -9 of the worker after the step-10 checkpoint: the job restarts
 *     once, completes, logs every step once with the uninterrupted run's
 *     losses bit for bit, the resumed worker takes the graph path too, and
 *     the export is bit-identical to the uninterrupted run's (sha256).
 * The model is cudasim_daemon_job's bert-tiny in fp32, 20 steps (~13 s on a
 * quiet 2-core machine). Shown to fail (each edit made, run, dropped):
 *   - the resumed worker's optimizer step count not restored
 *     (device_gpu.c passes t = 0 to gpu_model_set_opt_state: the bias
 *     corrections the graph reads from the device block start over): "step
 *     15, resumed: loss 5.622558689, reference 5.624852276";
 *   - every capture failing (CUDASIM_CAPTURE_FAIL=end): the job completes
 *     eagerly, and the test fails on the fallback line and "0 capture(s)".
 * Env (tests/cudasim/meson.build): as cudasim_daemon_job, with
 * CUDASIM_DEVICES=1 and BERTD_LEVER_GRAPH=1. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon_gpu.h"
#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300
#define STEPS 20
#define ROWS (STEPS / 5) /* logging_steps 5 */

#define SPEC(name)                                                                                        \
	"{\"name\":\"" name "\",\"dataset\":\"shakes\","                                                  \
	"\"model\":{\"preset\":\"bert-tiny\",\"hidden_size\":32,\"num_hidden_layers\":1,"                 \
	"\"num_attention_heads\":2,\"intermediate_size\":64,\"max_position_embeddings\":64},"            \
	"\"training_args\":{\"per_device_train_batch_size\":8,\"max_seq_length\":32,\"max_steps\":20,"    \
	"\"logging_steps\":5,\"save_steps\":10,\"learning_rate\":0.01,\"warmup_steps\":2,"               \
	"\"dataloader_num_workers\":1,\"seed\":7,\"bf16\":false,\"fp16\":false},"                        \
	"\"mlm\":{\"validation_split_percentage\":10},\"resources\":{\"gpus\":1}}"

typedef struct fx {
	it_fx *gpu;
	char *ref;       /* the uninterrupted job, once run */
	json_t *ref_job; /* its final representation */
} fx;

static int group_setup(void **state)
{
	const char *lever = getenv("BERTD_LEVER_GRAPH");
	if (!lever || strcmp(lever, "1") != 0) {
		fprintf(stderr, "BERTD_LEVER_GRAPH=1 is not set\n");
		return -1;
	}
	fx *f = calloc(1, sizeof *f);
	if (!f)
		return -1;
	if (!(f->gpu = cudasim_daemon_start())) {
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int group_teardown(void **state)
{
	fx *f = *state;
	int rc = it_daemon_stop(f->gpu);
	json_decref(f->ref_job);
	free(f->ref);
	free(f);
	return rc;
}

/* The worker's "lever GRAPH: N capture(s), M graph launch(es)" line in the
 * tail of job id's rank-0 log (its last one: the last attempt's); fails the
 * test when absent or when the capture failed (the model fell back). */
static void assert_graph_path(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=0&tail=200", id);
	http_resp r;
	assert_int_equal(http_get(d, path, &r), 0);
	assert_int_equal(r.status, 200);
	const char *line = NULL;
	for (const char *p = r.body; (p = strstr(p, "lever GRAPH: ")); p++)
		line = p;
	if (!line) {
		fprintf(stderr, "%s", r.body);
		fail_msg("job %s: the worker's log (above) has no \"lever GRAPH:\" line", id);
	}
	long captures = -1, launches = -1;
	if (sscanf(line, "lever GRAPH: %ld capture(s), %ld graph launch(es)", &captures, &launches) != 2)
		fail_msg("job %s: unexpected line: %.200s", id, line);
	fprintf(stderr, "job %s: %ld capture(s), %ld graph launch(es)\n", id, captures, launches);
	if (strstr(r.body, "capturing the training step failed") || strstr(r.body, "graphs off")) {
		fprintf(stderr, "%s", r.body);
		fail_msg("job %s: a capture failed, the steps ran eagerly (the log above)", id);
	}
	assert_true(captures > 0);
	assert_true(launches > 0);
	http_resp_free(&r);
}

static double loss_at(const json_t *rows, size_t i)
{
	return json_number_value(json_object_get(json_array_get(rows, i), "loss"));
}

static void run_reference(fx *f)
{
	const bertd *d = &f->gpu->d;
	it_wait_dataset_ready(d, "shakes", DEADLINE_S);
	f->ref = it_submit(d, SPEC("graph"));
	f->ref_job = it_wait_completed(d, f->ref, DEADLINE_S);
}

static void test_graph_job_completes(void **state)
{
	fx *f = *state;
	run_reference(f);
	const json_t *devs = json_object_get(f->ref_job, "devices");
	assert_int_equal(json_array_size(devs), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(devs, 0), "kind")), "cuda");
	assert_int_equal(json_integer_value(json_object_get(f->ref_job, "restart_count")), 0);
	it_assert_metrics_every(&f->gpu->d, f->ref, STEPS, 5);
	json_t *m = it_metrics_of(&f->gpu->d, f->ref);
	/* it learned something: chance is ln(400) = 5.99 */
	assert_true(loss_at(m, ROWS - 1) < loss_at(m, 0));
	json_decref(m);
	assert_graph_path(&f->gpu->d, f->ref);
}

static void test_graph_kill_worker_resumes(void **state)
{
	fx *f = *state;
	const bertd *d = &f->gpu->d;
	if (!f->ref) /* run alone (IT_ONLY) */
		run_reference(f);
	char *id = it_submit(d, SPEC("killed"));
	it_wait_step(d, id, 15, DEADLINE_S); /* past the step-10 checkpoint */
	pid_t pids[4];
	assert_int_equal(it_find_pids(id, "--rank 0", pids, 4), 1);
	assert_int_equal(kill(pids[0], SIGKILL), 0);
	json_t *job = it_wait_completed(d, id, DEADLINE_S);
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 1);

	/* every step once, each row the reference's bit for bit */
	it_assert_metrics_every(d, id, STEPS, 5);
	json_t *ma = it_metrics_of(d, f->ref), *mb = it_metrics_of(d, id);
	for (size_t k = 0; k < ROWS; k++)
		if (loss_at(ma, k) != loss_at(mb, k))
			fail_msg("step %zu%s: loss %.9f, reference %.9f", 5 * (k + 1),
				 5 * (k + 1) <= 10 ? ", before the kill" : ", resumed", loss_at(mb, k), loss_at(ma, k));
	json_decref(ma);
	json_decref(mb);
	assert_graph_path(d, id); /* the resumed worker's */

	char a[65], b[65];
	it_sha_of_export(f->ref_job, a);
	it_sha_of_export(job, b);
	if (strcmp(a, b) != 0)
		fail_msg("resumed export differs from the uninterrupted one: sha256 %s vs %s", b, a);
	fprintf(stderr, "resume with graphs: export bit-identical (sha256 %s)\n", a);
	json_decref(job);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_graph_job_completes),
		cmocka_unit_test(test_graph_kill_worker_resumes),
	};
	return IT_RUN(tests, group_setup, group_teardown);
}
