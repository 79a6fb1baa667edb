/* init_from_restore "all" on the CPU backend (docs/jobspec.md#init_from):
 *   - job A trains to step 20 with a checkpoint at 10; job B, the same spec
 *     with init_from {"job": A, "checkpoint": 10} and init_from_restore
 *     "all", trains steps 11..20 and ends with A's exported weights, byte
 *     for byte, and A's logged losses: optimizer moments, scheduler
 *     position and data position were restored, not only the weights;
 *   - B restarted after A's checkpoint is gone resumes from its own;
 *   - submits that cannot continue A's run are 422s naming the key: no
 *     init_from, an HF export, a path, max_steps not past the checkpoint, a
 *     different model or adam_beta1, a checkpoint without optimizer state
 *     (another batch or sequence length is a new phase: test_recipes).
 * Waiting is polling the API with a deadline, never timing. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

typedef it_fx fx;

static int setup(void **state)
{
	it_daemon_opts o = {.cpu_slots = "1", .dataset = "shakes", .corpus = "shakes.txt", .corpus_lines = 3000,
			    .vocab_size = 400};
	return it_setup(state, &o, DEADLINE_S);
}

/* A tiny model on one CPU slot, a loader, checkpoints every 10 steps
 * (it_job_spec), max_steps steps, then more overrides (NULL-ended); the
 * JSON text is the caller's to free. */
#define SPEC(name, steps, ...)                                                                               \
	it_job_spec(name, "shakes", "training_args.dataloader_num_workers", "1", "training_args.max_steps", steps, \
		    __VA_ARGS__)
/* The init_from of job's checkpoint at step (into buf) and "init_from_restore": "all". */
#define RESTORE_ALL(buf, job, step) "init_from", restore_of(buf, sizeof buf, job, step), "init_from_restore", "\"all\""

static const char *restore_of(char *buf, size_t cap, const char *job, int step)
{
	snprintf(buf, cap, "{\"job\":\"%s\",\"checkpoint\":%d}", job, step);
	return buf;
}

/* The directory of job's checkpoint at step: beside its export (model_dir). */
static void ckpt_dir(const json_t *job, int step, char *out, size_t cap)
{
	const char *ex = it_jstr((json_t *)job, "model_dir");
	size_t n = strlen(ex);
	assert_true(n > 7 && strcmp(ex + n - 7, "/export") == 0);
	snprintf(out, cap, "%.*s/checkpoints/ckpt-%d", (int)(n - 7), ex, step);
}

/* it_submit of spec, which it frees; the new id (caller frees). */
static char *submit(fx *f, char *spec)
{
	char *id = it_submit(&f->d, spec);
	free(spec);
	return id;
}

/* it_submit_refused of spec, which it frees. */
static void refused(fx *f, char *spec, const char *field, const char *parts)
{
	it_submit_refused(&f->d, spec, field, parts);
	free(spec);
}

static void test_continue_restores_everything(void **state)
{
	fx *f = *state;
	char init[200], q[1400];
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *a = submit(f, SPEC("a", "20", NULL));
	json_t *ja = it_wait_completed(&f->d, a, DEADLINE_S);

	char *b = submit(f, SPEC("b", "20", RESTORE_ALL(init, a, 10), NULL));
	json_t *jb = it_wait_completed(&f->d, b, DEADLINE_S);
	assert_string_equal(it_jstr(json_object_get(jb, "spec"), "init_from_restore"), "all");

	/* B ran steps 11..20 only: its metrics rows are 15 and 20, with A's losses */
	json_t *ma = it_metrics_of(&f->d, a), *mb = it_metrics_of(&f->d, b);
	assert_int_equal(json_array_size(ma), 4);
	assert_int_equal(json_array_size(mb), 2);
	for (size_t i = 0; i < 2; i++) {
		json_t *ra = json_array_get(ma, i + 2), *rb = json_array_get(mb, i);
		assert_int_equal(json_integer_value(json_object_get(rb, "step")), 15 + 5 * (int)i);
		fprintf(stderr, "step %lld: loss A %.6f, B %.6f\n", json_integer_value(json_object_get(rb, "step")),
			json_number_value(json_object_get(ra, "loss")), json_number_value(json_object_get(rb, "loss")));
		assert_true(json_number_value(json_object_get(ra, "loss")) ==
			    json_number_value(json_object_get(rb, "loss")));
	}
	json_decref(ma);
	json_decref(mb);
	char ha[65], hb[65];
	it_sha_of_export(ja, ha);
	it_sha_of_export(jb, hb);
	assert_string_equal(ha, hb); /* byte-identical weights: A's run, continued */

	/* the 422s: each names the key and what would be accepted */
	refused(f, SPEC("x", "20", "init_from_restore", "\"all\"", NULL), "init_from_restore",
		"needs init_from naming a job's checkpoint");
	snprintf(q, sizeof q, "{\"job\":\"%s\"}", a);
	refused(f, SPEC("x", "20", "init_from", q, "init_from_restore", "\"all\"", NULL), "init_from_restore",
		"needs init_from naming a job's checkpoint");
	char path[1200];
	ckpt_dir(ja, 10, path, sizeof path);
	snprintf(q, sizeof q, "\"%s\"", path);
	refused(f, SPEC("x", "20", "init_from", q, "init_from_restore", "\"all\"", NULL), "init_from_restore",
		"not a path");
	refused(f, SPEC("x", "10", RESTORE_ALL(init, a, 10), NULL), "training_args.max_steps",
		"must exceed the checkpoint's step (10)");
	refused(f, SPEC("x", "20", RESTORE_ALL(init, a, 10), "model.hidden_size", "64", NULL), "model.hidden_size",
		"differs from the model of the checkpoint");
	/* another batch or accumulation is a new phase (test_recipes), another
	 * beta would change what the moments mean */
	refused(f, SPEC("x", "20", RESTORE_ALL(init, a, 10), "training_args.adam_beta1", "0.8", NULL),
		"training_args.adam_beta1", "betas");
	/* a checkpoint whose optimizer state is gone */
	ckpt_dir(ja, 20, path, sizeof path);
	strcat(path, "/optim.safetensors");
	assert_int_equal(unlink(path), 0);
	refused(f, SPEC("x", "30", RESTORE_ALL(init, a, 20), NULL), "init_from_restore", "optimizer state");
	json_decref(ja);
	json_decref(jb);
	free(a);
	free(b);
}

/* Removes dir and the plain files in it (a checkpoint). */
static void remove_ckpt(const char *dir)
{
	static const char *const files[] = {"DONE", "state.json", "params.safetensors", "optim.safetensors"};
	char path[1300];
	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i]);
		unlink(path);
	}
	assert_int_equal(rmdir(dir), 0);
}

/* B continues A's run; after B has a checkpoint of its own, A's checkpoint
 * it started from is deleted (say, pruned) and B's worker is killed: B
 * resumes from its own checkpoint, not needing A's any more, and still ends
 * with A's weights. */
static void test_restart_after_source_is_gone(void **state)
{
	fx *f = *state;
	char init[200], path[1200];
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *a = submit(f, SPEC("a", "300", "training_args.save_total_limit", "1000", NULL));
	json_t *ja = it_wait_completed(&f->d, a, DEADLINE_S);
	char *b = submit(f, SPEC("b", "300", "training_args.save_total_limit", "1000", RESTORE_ALL(init, a, 10), NULL));
	it_wait_step(&f->d, b, 25, DEADLINE_S); /* past its own checkpoint at 20 */
	ckpt_dir(ja, 10, path, sizeof path);
	remove_ckpt(path);
	it_kill_rank(b, 0);
	json_t *jb = it_wait_completed(&f->d, b, DEADLINE_S);
	assert_int_equal(json_integer_value(json_object_get(jb, "restart_count")), 1);
	char ha[65], hb[65];
	it_sha_of_export(ja, ha);
	it_sha_of_export(jb, hb);
	assert_string_equal(ha, hb);
	json_decref(ja);
	json_decref(jb);
	free(a);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_continue_restores_everything, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_restart_after_source_is_gone, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
