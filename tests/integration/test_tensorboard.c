/* TensorBoard event files end to end on the CPU backend: two real jobs run
 * side by side, then TensorBoard's own reader (EventMultiplexer over
 * <state_dir>/jobs, as `tensorboard --logdir` loads it, and EventAccumulator
 * per job; tb_read.py) must find one run per job holding every scalar of
 * every metrics row the API returns, steps and values to float precision.
 * Skipped (77) when /usr/bin/python3 has no tensorboard
 * (scripts/setup --references installs it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

typedef it_fx fx;

static int setup(void **state)
{
	it_daemon_opts o = {.cpu_slots = "2", .dataset = "shakes", .corpus = "shakes.txt", .corpus_lines = 1000,
			    .vocab_size = 300, .wait_ready = true};
	return it_setup(state, &o, DEADLINE_S);
}

/* Submits the tiny job name on shakes (batch 4, 12 steps logged every 3,
 * no checkpoint, the default learning rate without warm-up) with loaders
 * data loaders; returns its id (caller frees). */
static char *submit(const bertd *d, const char *name, const char *loaders)
{
	char *spec = it_job_spec(name, "shakes", "training_args.per_device_train_batch_size", "4",
				 "training_args.max_steps", "12", "training_args.logging_steps", "3",
				 "training_args.save_steps", "100", "training_args.dataloader_num_workers", loaders,
				 "training_args.learning_rate", "null", "training_args.warmup_steps", "null", NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static void test_tensorboard_reads_every_scalar(void **state)
{
	fx *f = *state;
	char *ids[2] = {submit(&f->d, "tb-serial", "0"), submit(&f->d, "tb-loaders", "1")};
	json_t *rows = json_object();
	for (int i = 0; i < 2; i++) {
		json_t *j = it_wait_job(&f->d, ids[i], "completed|failed", DEADLINE_S);
		it_assert_completed(&f->d, j);
		json_decref(j);
		json_t *m = it_metrics_of(&f->d, ids[i]);
		assert_int_equal(json_array_size(m), 4); /* steps 3, 6, 9, 12 */
		json_object_set_new(rows, ids[i], m);
	}
	char rows_path[128], cmd[1024];
	snprintf(rows_path, sizeof rows_path, "%s/rows.json", f->d.root);
	assert_int_equal(json_dump_file(rows, rows_path, 0), 0);
	json_decref(rows);
	const char *src = getenv("BERTD_SOURCE_ROOT");
	assert_non_null(src);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/integration/tb_read.py' '%s/jobs' '%s'", src,
		 f->d.state_dir, rows_path);
	int st = system(cmd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	free(ids[0]);
	free(ids[1]);
}

int main(void)
{
	if (system("/usr/bin/python3 -c 'import tensorboard' >/dev/null 2>&1") != 0) {
		printf("skipped: /usr/bin/python3 has no tensorboard (scripts/setup --references)\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensorboard_reads_every_scalar),
	};
	return IT_RUN(tests, setup, it_teardown);
}
