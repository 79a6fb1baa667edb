/* Preemption beyond one daemon's life, and preemptible changed after
 * submit, on two CPU slots with the real daemon and workers:
 *   - an adopted victim is asked again: job O (1 slot) has its worker frozen
 *     (SIGSTOP) and job V (1 slot) runs; a 2-slot job H of higher priority
 *     preempts both. V checkpoints and is queued again, held until H has
 *     started; O cannot stop, so H cannot start. The daemon is killed
 *     (kill -9) and a new one started: it adopts O, asks it again to stop
 *     for H (an event says so), and once O is let go (SIGCONT) O ends
 *     "preempted by H" and queued (not "restarting"), H starts, and V
 *     starts again only after H has started;
 *   - the hold itself survives kill -9: the new daemon's scheduler would
 *     backfill the victim on a free slot; the hold read back keeps it queued
 *     (test_held_victim_not_backfilled_after_kill9), and the cancel asked of
 *     the old daemon ends "canceled by default" in the new one;
 *   - "preemptible" PATCHed to true on a running job that was submitted
 *     without it makes it a victim: a higher-priority 2-slot job preempts
 *     it (the "changed by default: preemptible false -> true" event first);
 *     the 2-slot job, canceled while running, ends with the event
 *     "canceled by default".
 * States are polled from the API with a deadline; nothing asserts on
 * timing. */
#include <setjmp.h>
#include <signal.h>
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
					   .corpus_lines = 1000, .vocab_size = 300, .wait_ready = true};

static int setup(void **state) { return it_setup(state, &daemon_opts, DEADLINE_S); }

static json_t *job_of(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	return it_get_json(d, path);
}

/* Polls job id until its preemption count is at least 1 and it is queued;
 * returns it (caller decrefs). */
static json_t *wait_preempted(const bertd *d, const char *id)
{
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		json_t *j = job_of(d, id);
		const char *st = it_jstr(j, "state");
		if (json_integer_value(json_object_get(json_object_get(j, "preemption"), "count")) >= 1 &&
		    strcmp(st, "queued") == 0)
			return j;
		if (!strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "canceled")) {
			bertd_print_log(d);
			fail_msg("job %s ended %s before it was preempted", id, st);
		}
		json_decref(j);
		it_pause_ms(100);
	}
	bertd_print_log(d);
	fail_msg("job %s: not preempted after %d s", id, DEADLINE_S);
	return NULL;
}

/* Polls job id's events until one holds text. */
static void wait_event(const bertd *d, const char *id, const char *text)
{
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		json_t *ev = it_events_of(d, id);
		bool found = it_event_with(ev, text) != NULL;
		json_decref(ev);
		if (found)
			return;
		it_pause_ms(100);
	}
	bertd_print_log(d);
	fail_msg("job %s: no event with \"%s\" after %d s", id, text, DEADLINE_S);
}

/* The time of the n-th (from 1; -1: the last) event of job id into state to;
 * NULL when there is none. Caller frees. */
static char *time_into(const bertd *d, const char *id, const char *to, int n)
{
	json_t *ev = it_events_of(d, id);
	const char *t = NULL;
	int k = 0;
	for (size_t i = 0; i < json_array_size(ev); i++) {
		json_t *e = json_array_get(ev, i);
		if (strcmp(it_jstr(e, "to"), to) != 0 || !strcmp(it_jstr(e, "from"), to))
			continue;
		if (++k == n || n < 0)
			t = it_jstr(e, "time");
		if (k == n)
			break;
	}
	char *out = t ? strdup(t) : NULL;
	json_decref(ev);
	return out;
}

/* Sends sig to every live worker of job id (there is at least one). */
static void signal_workers(const char *id, int sig)
{
	pid_t pids[8];
	int n = it_find_pids(id, "bertd-worker", pids, 8);
	assert_true(n >= 1);
	for (int i = 0; i < n; i++)
		assert_int_equal(kill(pids[i], sig), 0);
}

static void test_hold_survives_kill9(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	/* O: long, its end known from max_runtime_seconds (so the scheduler
	 * estimates when its slot frees); V: short, bounded well before that */
	char *so = it_job_spec("o", "shakes", "training_args.max_steps", "100000", "training_args.save_steps", "100000",
			       "training_args.logging_steps", "1", "preemptible", "true",
			       "stopping_condition", "{\"max_runtime_seconds\":100000}", NULL);
	char *sv = it_job_spec("v", "shakes", "training_args.max_steps", "100", "training_args.save_steps", "1000",
			       "training_args.logging_steps", "1", "profiler", "{\"simulate_data_delay_ms\":60}",
			       "preemptible", "true", "stopping_condition", "{\"max_runtime_seconds\":3000}", NULL);
	char *sh = it_job_spec("h", "shakes", "training_args.max_steps", "4", "resources.gpus", "2", "priority", "5",
			       NULL);
	char *o = it_submit(d, so);
	it_wait_step(d, o, 1, DEADLINE_S);
	char *v = it_submit(d, sv);
	it_wait_step(d, v, 3, DEADLINE_S);
	signal_workers(o, SIGSTOP); /* O cannot stop for H now */
	char *h = it_submit(d, sh);

	json_t *jv = wait_preempted(d, v);
	assert_string_equal(it_jstr(json_object_get(jv, "preemption"), "by"), h);
	json_decref(jv);
	char want[96];
	snprintf(want, sizeof want, "preempting for %s", h);
	wait_event(d, o, want);
	json_t *jh = job_of(d, h);
	assert_string_equal(it_jstr(jh, "state"), "queued"); /* O's slot is not free */
	json_decref(jh);

	bertd_kill9(d);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	/* the new daemon adopted O and asked it again */
	snprintf(want, sizeof want, "daemon restarted while it stopped for %s", h);
	wait_event(d, o, want);
	signal_workers(o, SIGCONT);

	json_decref(it_wait_completed(d, h, DEADLINE_S));
	json_t *jo = wait_preempted(d, o);
	assert_string_equal(it_jstr(json_object_get(jo, "preemption"), "by"), h);
	json_decref(jo);
	jv = it_wait_completed(d, v, DEADLINE_S);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(jv, "preemption"), "count")), 1);
	json_decref(jv);
	/* V started twice, the second time after H had started */
	char *h_start = time_into(d, h, "starting", 1), *v_again = time_into(d, v, "starting", 2);
	assert_non_null(h_start);
	assert_non_null(v_again);
	if (strcmp(v_again, h_start) < 0)
		fail_msg("job %s started again at %s, before its preemptor %s started at %s", v, v_again, h, h_start);
	free(h_start);
	free(v_again);
	it_cancel_job(d, o, DEADLINE_S);
	free(so);
	free(sv);
	free(sh);
	free(o);
	free(v);
	free(h);
}

/* The hold itself in the new daemon: job N (1 slot, long, its end
 * estimated far off) is canceled with its worker frozen, so it cannot
 * stop; V (1 slot, bounded by max_runtime_seconds well before N's
 * estimated end) is preempted for the 2-slot H. After kill -9 the new
 * daemon's scheduler could backfill V on the free slot (it ends before H
 * could start); the hold read back keeps it queued, with an event saying
 * so. Once N is let go it ends "canceled by default" (who asked, read back
 * too), H starts, and V only after it. */
static void test_held_victim_not_backfilled_after_kill9(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	char *sn = it_job_spec("n", "shakes", "training_args.max_steps", "1000000", "training_args.save_steps",
			       "1000000", "training_args.logging_steps", "1", NULL);
	char *sv = it_job_spec("v", "shakes", "training_args.max_steps", "100", "training_args.save_steps", "1000",
			       "training_args.logging_steps", "1", "profiler", "{\"simulate_data_delay_ms\":60}",
			       "preemptible", "true", "stopping_condition", "{\"max_runtime_seconds\":300}", NULL);
	char *sh = it_job_spec("h", "shakes", "training_args.max_steps", "4", "resources.gpus", "2", "priority", "5",
			       NULL);
	char *n = it_submit(d, sn);
	it_wait_step(d, n, 2, DEADLINE_S);
	char *v = it_submit(d, sv);
	it_wait_step(d, v, 3, DEADLINE_S);
	signal_workers(n, SIGSTOP);
	char path[96];
	http_resp r;
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", n);
	assert_int_equal(http_do(d, "POST", path, NULL, 0, NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 202);
	http_resp_free(&r);
	char *h = it_submit(d, sh);

	json_t *jv = wait_preempted(d, v);
	assert_string_equal(it_jstr(json_object_get(jv, "preemption"), "by"), h);
	json_decref(jv);
	json_t *jh = job_of(d, h);
	assert_string_equal(it_jstr(jh, "state"), "queued"); /* N's slot is not free */
	json_decref(jh);

	bertd_kill9(d);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	char want[128];
	snprintf(want, sizeof want, "held in the queue until %s starts", h);
	wait_event(d, v, want); /* a scheduling pass of the new daemon held it */
	jv = job_of(d, v);
	assert_string_equal(it_jstr(jv, "state"), "queued");
	json_decref(jv);
	signal_workers(n, SIGCONT);

	json_t *jn = it_wait_job(d, n, "canceled|completed|failed", DEADLINE_S);
	assert_string_equal(it_jstr(jn, "state"), "canceled");
	json_decref(jn);
	json_t *ev = it_events_of(d, n);
	json_t *last = json_array_get(ev, json_array_size(ev) - 1);
	assert_string_equal(it_jstr(last, "reason"), "canceled by default");
	json_decref(ev);
	json_decref(it_wait_completed(d, h, DEADLINE_S));
	json_decref(it_wait_completed(d, v, DEADLINE_S));
	char *h_start = time_into(d, h, "starting", 1), *v_again = time_into(d, v, "starting", 2);
	assert_non_null(h_start);
	assert_non_null(v_again);
	if (strcmp(v_again, h_start) < 0)
		fail_msg("job %s started again at %s, before its preemptor %s started at %s", v, v_again, h, h_start);
	free(h_start);
	free(v_again);
	free(sn);
	free(sv);
	free(sh);
	free(n);
	free(v);
	free(h);
}

/* PATCH /v1/jobs/{id} with body: must answer 200; returns the job. */
static json_t *patch_ok(const bertd *d, const char *id, const char *body)
{
	char path[96];
	http_resp r;
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	assert_int_equal(http_do(d, "PATCH", path, body, strlen(body), NULL, H_AUTH, &r), 0);
	if (r.status != 200)
		fail_msg("PATCH %s %s: %ld %s", id, body, r.status, r.body);
	json_t *j = json_incref(r.json);
	http_resp_free(&r);
	return j;
}

static void test_patched_preemptible_is_preempted(void **state)
{
	bertd *d = *state;
	char *sl = it_job_spec("low", "shakes", "training_args.max_steps", "100000", "training_args.save_steps",
			       "100000", "training_args.logging_steps", "1", NULL);
	char *sh = it_job_spec("high", "shakes", "training_args.max_steps", "100000", "training_args.save_steps",
			       "100000", "resources.gpus", "2", "priority", "5", NULL);
	char *low = it_submit(d, sl);
	it_wait_step(d, low, 2, DEADLINE_S);
	json_t *j = patch_ok(d, low, "{\"preemptible\": true}");
	assert_string_equal(it_jstr(j, "state"), "running");
	assert_true(json_is_true(json_object_get(json_object_get(j, "spec"), "preemptible")));
	json_decref(j);
	json_t *ev = it_events_of(d, low);
	assert_non_null(it_event_with(ev, "changed by default: preemptible false -> true"));
	json_decref(ev);

	char *high = it_submit(d, sh);
	j = wait_preempted(d, low);
	assert_string_equal(it_jstr(json_object_get(j, "preemption"), "by"), high);
	json_decref(j);
	it_cancel_job(d, low, DEADLINE_S);
	json_decref(it_wait_job(d, high, "running", DEADLINE_S));
	it_cancel_job(d, high, DEADLINE_S);
	/* the event that ended it names who canceled it */
	ev = it_events_of(d, high);
	json_t *last = json_array_get(ev, json_array_size(ev) - 1);
	assert_string_equal(it_jstr(last, "to"), "canceled");
	assert_string_equal(it_jstr(last, "reason"), "canceled by default");
	json_decref(ev);
	free(sl);
	free(sh);
	free(low);
	free(high);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hold_survives_kill9, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_held_victim_not_backfilled_after_kill9, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_patched_preemptible_is_preempted, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
