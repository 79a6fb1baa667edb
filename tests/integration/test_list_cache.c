/* list_cache — GET /v1/jobs shows every change of a queued job in the next
 * page. The API keeps the rendered text of each job that is not running,
 * keyed by the store's per-job version, so every write to a job must reach
 * the next list: a cancel through the API, and the start, devices and
 * metrics that the supervisor writes (here the test plays the supervisor
 * through a second store connection on the daemon's database, as
 * test_api_http does, with the daemon's queue held). Whole pages are kept
 * too (per store revision): every write, the daemon's or another
 * connection's, leaves a polled page byte-identical to one read afresh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/store.h"
#include "harness.h"
#include "it_store.h"
#include "it_util.h"

/* Submits a job of only a name and the seeded dataset (the queue is held:
 * it stays queued); returns its id (caller frees). */
static char *submit(const bertd *d, const char *name)
{
	char *spec = it_job_spec(name, IT_SEEDED_DATASET, "model", "null", "training_args", "null", "resources", "null",
				 NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static int setup(void **state)
{
	const char *extra[] = {"--schedule", "false", NULL};
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	return it_setup_end(state, f,
			    f && !it_store_seed_dataset(&f->d, NULL) &&
				    !it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}));
}

/* GET /v1/jobs?limit=100 (200 asserted); caller decrefs. */
static json_t *list_page(const bertd *d)
{
	return it_get_json(d, "/v1/jobs?limit=100");
}

/* The element of page whose id is id (borrowed); fails the test if absent. */
static json_t *in_page(json_t *page, const char *id)
{
	json_t *jobs = json_object_get(page, "jobs"), *j;
	size_t i;
	json_array_foreach(jobs, i, j) {
		if (strcmp(it_jstr(j, "id"), id) == 0)
			return j;
	}
	fail_msg("job %s is not in the list", id);
	return NULL;
}

/* id's state in a fresh list page must be state. */
static void assert_listed_state(const bertd *d, const char *id, const char *state)
{
	json_t *page = list_page(d);
	const char *got = it_jstr(in_page(page, id), "state");
	if (strcmp(got, state) != 0)
		fail_msg("job %s is listed %s, expected %s", id, got, state);
	json_decref(page);
}

static void test_queued_changes_reach_the_list(void **state)
{
	bertd *d = *state;
	char *a = submit(d, "lc-a"), *b = submit(d, "lc-b");
	char *c = submit(d, "lc-c"), *q = submit(d, "lc-d");
	json_t *first = list_page(d);
	assert_int_equal(json_array_size(json_object_get(first, "jobs")), 4);
	const char *ids[] = {a, b, c, q};
	for (int i = 0; i < 4; i++)
		assert_string_equal(it_jstr(in_page(first, ids[i]), "state"), "queued");
	/* A page served again from the kept texts answers the same. */
	json_t *again = list_page(d);
	assert_true(json_equal(first, again));
	json_decref(again);

	/* A cancel through the API (the daemon's own write). */
	char path[96];
	http_resp r;
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", c);
	assert_int_equal(http_do(d, "POST", path, NULL, 0, NULL, H_AUTH, &r), 0);
	if (r.status < 200 || r.status > 299)
		fail_msg("cancel of a queued job: %ld %s", r.status, r.body);
	http_resp_free(&r);
	json_t *page = list_page(d);
	json_t *jc = in_page(page, c);
	assert_string_equal(it_jstr(jc, "state"), "canceled");
	assert_true(json_is_string(json_object_get(jc, "finished_at")));
	json_decref(page);

	/* Writes of another connection, as the supervisor's start would be. */
	store *st = NULL;
	char db[200];
	snprintf(db, sizeof db, "%s/bertd.db", d->state_dir);
	assert_int_equal(store_open(&st, db), 0);
	assert_int_equal(store_job_transition(st, a, JOB_MASK(JOB_QUEUED), JOB_STARTING,
					      "test: scheduled", NULL), 0);
	assert_listed_state(d, a, "starting");
	/* A row change without a state change: the devices it was given. */
	assert_int_equal(store_job_set_devices(st, a, "[{\"kind\": \"cpu\", \"index\": 0}]"), 0);
	page = list_page(d);
	json_t *devs = json_object_get(in_page(page, a), "devices");
	assert_int_equal(json_array_size(devs), 1);
	assert_string_equal(it_jstr(json_array_get(devs, 0), "kind"), "cpu");
	json_decref(page);
	assert_int_equal(store_job_transition(st, a, JOB_MASK(JOB_STARTING), JOB_RUNNING,
					      "test: workers up", NULL), 0);
	page = list_page(d);
	assert_string_equal(it_jstr(in_page(page, a), "state"), "running");
	assert_true(json_is_string(json_object_get(in_page(page, a), "started_at")));
	json_decref(page);

	/* A write of the job's metrics alone (no row change) while it is not
	 * running: its progress must still move. */
	assert_int_equal(store_job_transition(st, b, JOB_MASK(JOB_QUEUED), JOB_STARTING,
					      "test: scheduled", NULL), 0);
	assert_listed_state(d, b, "starting");
	assert_int_equal(store_metric_insert(st, b, 10, 1767225600000,
					     "{\"loss\": 7.5, \"step_time_ms\": 100.0}"), 0);
	page = list_page(d);
	json_t *prog = json_object_get(in_page(page, b), "progress");
	assert_int_equal(json_integer_value(json_object_get(prog, "step")), 10);
	assert_true(json_number_value(json_object_get(prog, "loss")) == 7.5);
	/* The job nobody touched answers as it did at first. */
	assert_true(json_equal(in_page(page, q), in_page(first, q)));
	json_decref(page);
	store_close(st);

	/* Back from the supervisor's connection to the daemon's: canceling the
	 * starting job moves it to stopping, in the next page too. */
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", b);
	assert_int_equal(http_do(d, "POST", path, NULL, 0, NULL, H_AUTH, &r), 0);
	http_resp_free(&r);
	assert_listed_state(d, b, "stopping");
	json_decref(first);
	free(a);
	free(b);
	free(c);
	free(q);
}

/* The raw body of GET path (200 asserted); caller frees. */
static char *page_text(const bertd *d, const char *path)
{
	http_resp r;
	assert_int_equal(http_do(d, "GET", path, NULL, 0, NULL, H_AUTH, &r), 0);
	if (r.status != 200)
		fail_msg("GET %s: %ld %s", path, r.status, r.body);
	char *t = strdup(r.body);
	http_resp_free(&r);
	assert_non_null(t);
	return t;
}

/* The pages every client polls are kept whole once read (the same bytes
 * until some job is written). Each must equal, byte for byte, the same
 * page under a query never asked before, which is read from the store at
 * this moment: its limit differs (99 - round) but both exceed the jobs
 * there are, so the bodies are the same bytes when nothing is stale. */
static void assert_pages_fresh(const bertd *d, int round)
{
	static const char *const hot[] = {"/v1/jobs?limit=100", "/v1/jobs?state=queued&limit=100",
					  "/v1/jobs?order=desc&limit=100"};
	static const char *const fresh_fmt[] = {"/v1/jobs?limit=%d", "/v1/jobs?state=queued&limit=%d",
						"/v1/jobs?order=desc&limit=%d"};
	for (size_t i = 0; i < sizeof hot / sizeof hot[0]; i++) {
		char *kept = page_text(d, hot[i]), *kept_again = page_text(d, hot[i]);
		char path[96];
		snprintf(path, sizeof path, fresh_fmt[i], 99 - round);
		char *fresh = page_text(d, path);
		if (strcmp(kept, fresh) != 0)
			fail_msg("round %d: %s is stale:\n%s\nwhile %s reads:\n%s", round, hot[i], kept,
				 path, fresh);
		assert_string_equal(kept_again, fresh);
		free(kept);
		free(kept_again);
		free(fresh);
	}
}

static void test_kept_pages_follow_every_write(void **state)
{
	bertd *d = *state;
	char *a = submit(d, "kp-a"), *b = submit(d, "kp-b"), *c = submit(d, "kp-c");
	int round = 0;
	assert_pages_fresh(d, round++); /* now kept */
	assert_pages_fresh(d, round++);

	/* The daemon's own writes: a submission, a change, a cancel, a delete. */
	char *e = submit(d, "kp-e");
	assert_pages_fresh(d, round++);
	char path[96];
	http_resp r;
	snprintf(path, sizeof path, "/v1/jobs/%s", a);
	static const char prio[] = "{\"priority\": 7}";
	assert_int_equal(http_do(d, "PATCH", path, prio, strlen(prio), NULL, H_AUTH, &r), 0);
	if (r.status < 200 || r.status > 299)
		fail_msg("PATCH %s: %ld %s", path, r.status, r.body);
	http_resp_free(&r);
	assert_pages_fresh(d, round++);
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", b);
	assert_int_equal(http_do(d, "POST", path, NULL, 0, NULL, H_AUTH, &r), 0);
	if (r.status < 200 || r.status > 299)
		fail_msg("cancel %s: %ld %s", b, r.status, r.body);
	http_resp_free(&r);
	assert_pages_fresh(d, round++);
	snprintf(path, sizeof path, "/v1/jobs/%s", b);
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, H_AUTH, &r), 0);
	if (r.status < 200 || r.status > 299)
		fail_msg("delete %s: %ld %s", b, r.status, r.body);
	http_resp_free(&r);
	assert_pages_fresh(d, round++);

	/* Another connection's writes, as the supervisor's would be: a start
	 * and a metrics row of a job that is not running. */
	store *st = NULL;
	char db[200];
	snprintf(db, sizeof db, "%s/bertd.db", d->state_dir);
	assert_int_equal(store_open(&st, db), 0);
	assert_int_equal(store_job_transition(st, c, JOB_MASK(JOB_QUEUED), JOB_STARTING,
					      "test: scheduled", NULL), 0);
	assert_pages_fresh(d, round++);
	assert_int_equal(store_metric_insert(st, c, 10, 1767225600000,
					     "{\"loss\": 7.5, \"step_time_ms\": 100.0}"), 0);
	assert_pages_fresh(d, round++);
	store_close(st);
	json_t *page = list_page(d);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(in_page(page, c), "progress"),
							    "step")), 10);
	assert_int_equal(json_integer_value(json_object_get(in_page(page, a), "priority")), 7);
	assert_int_equal(json_array_size(json_object_get(page, "jobs")), 3); /* b deleted */
	json_decref(page);
	free(a);
	free(b);
	free(c);
	free(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_queued_changes_reach_the_list, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_kept_pages_follow_every_write, setup, it_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
