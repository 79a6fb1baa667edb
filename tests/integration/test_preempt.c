/* Preemption end to end on two CPU slots, with the real daemon, workers
 * and checkpoints:
 *   - a 1-slot job L with "preemptible": true is preempted twice by 2-slot
 *     jobs of higher priority: each time its workers write a stop
 *     checkpoint, it is "queued" again under the same id with the event
 *     "preempted by <job>" and its "preemption" record, restarts only after
 *     its preemptor, and resumes from that checkpoint (step > 0). It
 *     completes with model.safetensors byte for byte the same as the same
 *     spec run uninterrupted, and its metrics hold every step 1..max_steps
 *     exactly once; so does a 2-rank job preempted by a 1-slot job;
 *   - a job without "preemptible" (false by default) is never preempted:
 *     the higher-priority job waits for its end;
 *   - a preemptible job of equal priority is never preempted either.
 * The jobs' batches are slowed (profiler.simulate_data_delay_ms: timing
 * only, the numbers do not change) so they are still running when the
 * higher-priority job arrives. States are polled from the API with a
 * deadline; nothing asserts on timing. A preempted job's representation
 * is checked against docs/openapi.yaml's schema of GET /v1/jobs/{id}, and
 * its TensorBoard series read back with TensorBoard's reader (tb_read.py,
 * when installed): each step once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"
#include "openapi_check.h"

#define DEADLINE_S 400
#define L_STEPS 100 /* the low job's max_steps (L_STEPS_S in its spec) */
#define L_STEPS_S "100"

static const it_daemon_opts daemon_opts = {.cpu_slots = "2", .dataset = "shakes", .corpus = "shakes.txt",
					   .corpus_lines = 2000, .vocab_size = 300};

static int setup(void **state) { return it_setup(state, &daemon_opts, DEADLINE_S); }

static json_t *job_of(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	return it_get_json(d, path);
}

/* The low-priority job's spec on gpus ranks: logged every step, slowed
 * batches. */
static char *low_spec(const char *preemptible, const char *priority, const char *gpus)
{
	return it_job_spec("low", "shakes", "training_args.max_steps", L_STEPS_S, "training_args.logging_steps", "1",
			   "training_args.save_steps", "1000", "profiler", "{\"simulate_data_delay_ms\":60}",
			   "preemptible", preemptible, "priority", priority, "resources.gpus", gpus, NULL);
}

/* A short job of priority prio on gpus slots. */
static char *high_spec(const char *name, const char *prio, const char *gpus)
{
	return it_job_spec(name, "shakes", "training_args.max_steps", "4", "resources.gpus", gpus, "priority", prio,
			   NULL);
}

/* Polls job id (every 100 ms, at most DEADLINE_S) until its preemption
 * count is at least n and it is queued again; returns it (caller decrefs). */
static json_t *wait_preempted(const bertd *d, const char *id, json_int_t n)
{
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		json_t *j = job_of(d, id);
		json_t *p = json_object_get(j, "preemption");
		const char *st = it_jstr(j, "state");
		if (json_integer_value(json_object_get(p, "count")) >= n && strcmp(st, "running") != 0 &&
		    strcmp(st, "starting") != 0)
			return j;
		if (!strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "canceled")) {
			bertd_print_log(d);
			fail_msg("job %s ended %s before its preemption %lld", id, st, (long long)n);
		}
		json_decref(j);
		it_pause_ms(100);
	}
	bertd_print_log(d);
	fail_msg("job %s: not preempted %lld time(s) after %d s", id, (long long)n, DEADLINE_S);
	return NULL;
}

/* job (GET /v1/jobs/{id}'s answer) against docs/openapi.yaml. */
static void expect_job_schema(const json_t *job)
{
	const char *root = getenv("BERTD_SOURCE_ROOT");
	char path[4096], err[1024];
	snprintf(path, sizeof path, "%s/docs/openapi.yaml", root ? root : ".");
	json_t *doc = openapi_load(path, err, sizeof err);
	if (!doc)
		fail_msg("%s", err);
	json_t *s = openapi_response_schema(doc, "/v1/jobs/{id}", "get", "200", "application/json");
	assert_non_null(s);
	if (openapi_check(doc, s, (json_t *)job, err, sizeof err) != 0)
		fail_msg("a preempted job disagrees with docs/openapi.yaml at %s", err);
	json_decref(doc);
}

/* TensorBoard's own reader (tb_read.py) finds one run per job of this
 * daemon (the n in ids), each scalar once per metrics row, at its step: a
 * step written twice into the event files fails it. Skipped (a message)
 * when /usr/bin/python3 has no tensorboard. */
static void expect_tensorboard_series(it_fx *f, char *const *ids, int n)
{
	json_t *rows = json_object();
	for (int i = 0; i < n; i++)
		json_object_set_new(rows, ids[i], it_metrics_of(&f->d, ids[i]));
	char rows_path[160], cmd[1400];
	snprintf(rows_path, sizeof rows_path, "%s/rows.json", f->d.root);
	assert_int_equal(json_dump_file(rows, rows_path, 0), 0);
	json_decref(rows);
	const char *src = getenv("BERTD_SOURCE_ROOT");
	assert_non_null(src);
	snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/integration/tb_read.py' '%s/jobs' '%s'", src,
		 f->d.state_dir, rows_path);
	int st = it_system("%s", cmd);
	if (st == 77) {
		printf("TensorBoard check skipped: /usr/bin/python3 has no tensorboard\n");
		return;
	}
	assert_int_equal(st, 0);
}

/* The steps of the "resuming from checkpoint at step N" events, in order,
 * into steps (at most cap); returns how many. times gets their times. */
static int resumes(json_t *ev, long *steps, const char **times, int cap)
{
	int n = 0;
	size_t i;
	json_t *e;
	const char *key = "resuming from checkpoint at step ";
	json_array_foreach(ev, i, e) {
		const char *r = json_string_value(json_object_get(e, "reason"));
		const char *p = r ? strstr(r, key) : NULL;
		if (p && n < cap) {
			times[n] = json_string_value(json_object_get(e, "time"));
			steps[n++] = strtol(p + strlen(key), NULL, 10);
		}
	}
	return n;
}

/* The low-priority job on low_gpus slots, preempted times (at most 2)
 * by jobs on high_gpus slots; whichever of the two is on one slot, the
 * other needs both, so the low job resumes only after each preemptor has
 * finished. */
static void preempted_resumes_exactly(it_fx *f, const char *low_gpus, const char *high_gpus, int times)
{
	bertd *d = &f->d;
	it_wait_dataset_ready(d, "shakes", DEADLINE_S);
	char *spec = low_spec("true", "0", low_gpus);

	/* the same spec, uninterrupted */
	char ref_sha[65], sha[65];
	char *ref = it_submit(d, spec);
	json_t *jr = it_wait_completed(d, ref, DEADLINE_S);
	it_sha_of_export(jr, ref_sha);
	assert_true(json_is_null(json_object_get(jr, "preemption")));
	json_decref(jr);

	char *low = it_submit(d, spec);
	char *hs[2] = {NULL, NULL};
	long at = 5;
	for (int k = 0; k < times; k++) {
		it_wait_step(d, low, at, DEADLINE_S); /* a step of this attempt: later than any before */
		char *sh = high_spec(k == 0 ? "high1" : "high2", "5", high_gpus);
		hs[k] = it_submit(d, sh);
		free(sh);
		json_t *jl = wait_preempted(d, low, k + 1);
		json_t *p = json_object_get(jl, "preemption");
		assert_string_equal(it_jstr(p, "by"), hs[k]);
		assert_int_equal(json_integer_value(json_object_get(jl, "restart_count")), 0);
		expect_job_schema(jl);
		json_t *ev = it_events_of(d, low);
		char want[80];
		snprintf(want, sizeof want, "preempted by %s", hs[k]);
		assert_non_null(it_event_with(ev, want));
		json_decref(ev);
		json_decref(jl);
		json_t *jh = it_wait_completed(d, hs[k], DEADLINE_S);
		ev = it_events_of(d, hs[k]);
		assert_non_null(it_event_with(ev, low)); /* "preempting 1 running job(s) to start: <low>" */
		json_decref(ev);
		json_decref(jh);
		/* the resumed attempt's first steps come after the stop checkpoint */
		json_t *now = job_of(d, low);
		at = (long)json_integer_value(json_object_get(json_object_get(now, "progress"), "step")) + 3;
		json_decref(now);
		assert_true(at < L_STEPS);
	}

	json_t *jl = it_wait_completed(d, low, DEADLINE_S);
	json_t *p = json_object_get(jl, "preemption");
	assert_int_equal(json_integer_value(json_object_get(p, "count")), times);
	assert_string_equal(it_jstr(p, "by"), hs[times - 1]);
	assert_int_equal(json_integer_value(json_object_get(jl, "restart_count")), 0);

	/* resumed twice, from stop checkpoints (step > 0), each after its
	 * preemptor had finished: the preemptor needed both slots */
	json_t *ev = it_events_of(d, low);
	long steps[4];
	const char *at_[4];
	assert_int_equal(resumes(ev, steps, at_, 4), times);
	for (int k = 0; k < times; k++) {
		assert_true(steps[k] > 0);
		assert_true(k == 0 || steps[k] > steps[k - 1]);
		json_t *jh = job_of(d, hs[k]);
		assert_true(strcmp(at_[k], it_jstr(jh, "finished_at")) >= 0);
		json_decref(jh);
	}

	/* one series: every step once */
	json_t *rows = it_metrics_of(d, low);
	assert_int_equal(json_array_size(rows), L_STEPS);
	for (size_t i = 0; i < json_array_size(rows); i++) {
		json_t *row = json_array_get(rows, i);
		assert_int_equal(json_integer_value(json_object_get(row, "step")), (json_int_t)i + 1);
	}
	json_decref(rows);

	it_sha_of_export(jl, sha);
	assert_string_equal(ref_sha, sha); /* bit-identical to the uninterrupted run */
	char *all[4] = {ref, low, hs[0], hs[1]};
	expect_tensorboard_series(f, all, 2 + times);
	json_decref(ev);
	json_decref(jl);
	free(spec);
	free(ref);
	free(low);
	free(hs[0]);
	free(hs[1]);
}

/* One rank, preempted twice by 2-slot jobs. */
static void test_preempted_twice_resumes_exactly(void **state)
{
	preempted_resumes_exactly(*state, "1", "2", 2);
}

/* Two ranks (the stop they agree on), preempted once by a 1-slot job. */
static void test_two_ranks_preempted_resume_exactly(void **state)
{
	preempted_resumes_exactly(*state, "2", "1", 1);
}

/* low (priority low_prio, preemptible as given) runs; a 2-slot job of
 * priority 5 arrives and must wait for low's end instead of preempting it. */
static void never_preempted(it_fx *f, const char *preemptible, const char *low_prio)
{
	bertd *d = &f->d;
	it_wait_dataset_ready(d, "shakes", DEADLINE_S);
	char *sl = low_spec(preemptible, low_prio, "1");
	char *low = it_submit(d, sl);
	it_wait_step(d, low, 3, DEADLINE_S);
	char *sh = high_spec("high", "5", "2");
	char *high = it_submit(d, sh);
	json_t *jl = it_wait_completed(d, low, DEADLINE_S);
	json_t *jh = it_wait_completed(d, high, DEADLINE_S);
	assert_true(json_is_null(json_object_get(jl, "preemption")));
	json_t *ev = it_events_of(d, low);
	assert_null(it_event_with(ev, "preempt"));
	json_t *rows = it_metrics_of(d, low);
	assert_int_equal(json_array_size(rows), L_STEPS);
	json_decref(rows);
	json_decref(ev);
	ev = it_events_of(d, high);
	assert_null(it_event_with(ev, "preempting"));
	json_decref(ev);
	/* high needed low's slot: it started once low was done */
	assert_true(strcmp(it_jstr(jh, "started_at"), it_jstr(jl, "finished_at")) >= 0);
	json_decref(jl);
	json_decref(jh);
	free(sl);
	free(sh);
	free(low);
	free(high);
}

/* "preemptible" left out: false. */
static void test_not_preemptible_never_preempted(void **state)
{
	never_preempted(*state, "null", "0");
}

/* preemptible, but of the same priority as the waiting job. */
static void test_equal_priority_never_preempts(void **state)
{
	never_preempted(*state, "true", "5");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_preempted_twice_resumes_exactly, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_two_ranks_preempted_resume_exactly, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_not_preemptible_never_preempted, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_equal_priority_never_preempts, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
