/* EASY backfill end to end on two CPU slots: job A runs on one slot (its
 * estimated end far away: many steps at its measured step time); the head
 * H, a 2-slot job of higher priority, waits for it. Behind H, a 1-slot job
 * without a time limit (U) must not start on the idle slot (it could delay
 * H), and a 1-slot job whose stopping_condition.max_runtime_seconds ends it
 * well before A's estimated end (S) must: it runs to completion beside A
 * while H and U wait. Then A is canceled, H starts on both slots (placed
 * on [0, 1], connected), and U only after H. States are polled from the
 * API; nothing asserts on timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300

static const it_daemon_opts daemon_opts = {.cpu_slots = "2", .dataset = "shakes", .corpus = "shakes.txt",
					   .corpus_lines = 2000, .vocab_size = 300};

static int setup(void **state) { return it_setup(state, &daemon_opts, DEADLINE_S); }

static json_t *job_of(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	return it_get_json(d, path);
}

static json_int_t placed_on(const json_t *job, size_t i)
{
	return json_integer_value(json_array_get(json_object_get(json_object_get(job, "placement"), "devices"), i));
}

static void test_backfill_beside_waiting_head(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	it_wait_dataset_ready(d, "shakes", DEADLINE_S);
	/* A: far from done; once it has logged a step its end is estimated */
	char *sa = it_job_spec("a", "shakes", "training_args.max_steps", "1000000", "training_args.save_steps",
			       "1000000", NULL);
	char *a = it_submit(d, sa);
	it_wait_step(d, a, 10, DEADLINE_S);
	char *sh = it_job_spec("h", "shakes", "resources.gpus", "2", "priority", "10", NULL);
	char *h = it_submit(d, sh);
	char *su = it_job_spec("u", "shakes", NULL);
	char *u = it_submit(d, su);
	char *ss = it_job_spec("s", "shakes", "stopping_condition.max_runtime_seconds", "120", NULL);
	char *s = it_submit(d, ss);

	json_t *js = it_wait_completed(d, s, DEADLINE_S);
	assert_int_equal(json_array_size(json_object_get(js, "devices")), 1);
	json_t *jh = job_of(d, h), *ju = job_of(d, u), *ja = job_of(d, a);
	assert_true(placed_on(js, 0) != placed_on(ja, 0)); /* on the idle slot */
	assert_string_equal(it_jstr(ja, "state"), "running");
	assert_string_equal(it_jstr(jh, "state"), "queued"); /* still waiting for A */
	assert_string_equal(it_jstr(ju, "state"), "queued"); /* no bound: it may not jump */
	json_decref(jh);
	json_decref(ju);
	json_decref(ja);
	json_decref(js);

	it_cancel_job(d, a, DEADLINE_S);
	jh = it_wait_completed(d, h, DEADLINE_S);
	assert_int_equal(placed_on(jh, 0), 0);
	assert_int_equal(placed_on(jh, 1), 1);
	assert_true(json_is_true(json_object_get(json_object_get(jh, "placement"), "connected")));
	ju = it_wait_completed(d, u, DEADLINE_S);
	/* U had to wait for H to finish: there was never a slot H did not need */
	assert_true(strcmp(it_jstr(ju, "started_at"), it_jstr(jh, "finished_at")) >= 0);
	json_decref(jh);
	json_decref(ju);
	free(sa);
	free(sh);
	free(su);
	free(ss);
	free(a);
	free(h);
	free(u);
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_backfill_beside_waiting_head, setup, it_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
