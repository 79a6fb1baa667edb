/* Changing a job after submit: PATCH /v1/jobs/{id}, tags, notes, owner.
 *   - a held queue: PATCH of priority, name, tags, notes and preemptible,
 *     each seen in the job (and its spec) and in one "changed" event naming the field,
 *     old -> new, and who; a PATCH that changes nothing writes no event;
 *     the 422s (unknown key, bad types, out of range, bad tags, null name,
 *     preemptible for a multi-node job) change nothing; 400 for a body
 *     that is not an object, 404 for no such job, 409 for a finished one;
 *   - GET /v1/jobs?tag=&owner= with pagination, both orders, following
 *     PATCHes that add and remove a tag; 400 naming a bad tag;
 *   - PATCHes racing a cancel: each is 200 (and has its event, before the
 *     cancel's) or 409 (after it), never both orders at once, and the job
 *     ends canceled with the priority of the last 200;
 *   - one CPU slot held by a running job (which can be changed too): of
 *     two queued jobs, the later one, raised by PATCH, starts first when
 *     the slot frees. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 180

static int start(void **state, bool hold)
{
	it_daemon_opts o = {.cpu_slots = "1", .schedule = hold ? "false" : "true", .dataset = "shakes",
			    .corpus = "shakes.txt", .corpus_lines = 1000, .vocab_size = 300,
			    .wait_ready = true};
	return it_setup(state, &o, DEADLINE_S);
}

static int setup_hold(void **state) { return start(state, true); }
static int setup_run(void **state) { return start(state, false); }

/* PATCH /v1/jobs/{id} with body; the answer (http_resp_free it). */
static http_resp patch(const bertd *d, const char *id, const char *body)
{
	char path[96];
	http_resp r;
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	assert_int_equal(http_do(d, "PATCH", path, body, strlen(body), NULL, H_AUTH, &r), 0);
	return r;
}

/* PATCH that must answer 200; returns the job (caller decrefs). */
static json_t *patch_ok(const bertd *d, const char *id, const char *body)
{
	http_resp r = patch(d, id, body);
	if (r.status != 200)
		fail_msg("PATCH %s %s: %ld %s", id, body, r.status, r.body);
	json_t *j = json_incref(r.json);
	http_resp_free(&r);
	return j;
}

static json_t *job_of(const bertd *d, const char *id)
{
	char path[96];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	return it_get_json(d, path);
}

/* The job's tags as one comma-joined string. */
static void tags_of(json_t *job, char *out, size_t cap)
{
	json_t *t = json_object_get(job, "tags");
	assert_true(json_is_array(t));
	out[0] = 0;
	for (size_t i = 0; i < json_array_size(t); i++)
		snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? "," : "",
			 json_string_value(json_array_get(t, i)));
}

static size_t count_events_with(const bertd *d, const char *id, const char *text)
{
	json_t *ev = it_events_of(d, id);
	size_t n = 0;
	for (size_t i = 0; i < json_array_size(ev); i++) {
		const char *r = json_string_value(json_object_get(json_array_get(ev, i), "reason"));
		n += r && strstr(r, text);
	}
	json_decref(ev);
	return n;
}

static void test_patch_fields(void **state)
{
	const bertd *d = *state;
	char *spec = it_job_spec("first", "shakes", "tags", "[\"exp:1\",\"git:0a1b2c3\"]", "notes",
				 "\"lr sweep, run 1\"", NULL);
	char *id = it_submit(d, spec);
	free(spec);
	json_t *j = job_of(d, id);
	char tags[256];
	tags_of(j, tags, sizeof tags);
	assert_string_equal(tags, "exp:1,git:0a1b2c3");
	assert_string_equal(it_jstr(j, "notes"), "lr sweep, run 1");
	assert_string_equal(it_jstr(j, "owner"), "default");
	assert_int_equal(json_integer_value(json_object_get(j, "priority")), 0);
	json_decref(j);

	j = patch_ok(d, id, "{\"priority\": 7}");
	assert_int_equal(json_integer_value(json_object_get(j, "priority")), 7);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "spec"), "priority")), 7);
	assert_string_equal(it_jstr(j, "state"), "queued");
	json_decref(j);
	j = patch_ok(d, id, "{\"name\": \"renamed-1\", \"tags\": [\"exp:2\"], \"notes\": null}");
	assert_string_equal(it_jstr(j, "name"), "renamed-1");
	assert_string_equal(it_jstr(json_object_get(j, "spec"), "name"), "renamed-1");
	tags_of(j, tags, sizeof tags);
	assert_string_equal(tags, "exp:2");
	assert_true(json_is_null(json_object_get(j, "notes")));
	json_decref(j);
	j = patch_ok(d, id, "{\"notes\": \"second\\nline\"}");
	assert_string_equal(it_jstr(j, "notes"), "second\nline");
	json_decref(j);
	/* the same values again: nothing changes, no event */
	j = patch_ok(d, id, "{\"priority\": 7, \"name\": \"renamed-1\"}");
	json_decref(j);
	j = job_of(d, id); /* a fresh read sees what the PATCH answers said */
	assert_int_equal(json_integer_value(json_object_get(j, "priority")), 7);
	assert_string_equal(it_jstr(j, "name"), "renamed-1");
	json_decref(j);

	assert_int_equal(count_events_with(d, id, "changed by default: priority 0 -> 7"), 1);
	assert_int_equal(count_events_with(d, id, "name \"first\" -> \"renamed-1\"; tags [\"exp:1\",\"git:0a1b2c3\"] "
						  "-> [\"exp:2\"]; notes \"lr sweep, run 1\" -> null"), 1);
	/* quoted as JSON: the event stays one line */
	assert_int_equal(count_events_with(d, id, "notes null -> \"second\\nline\""), 1);
	assert_int_equal(count_events_with(d, id, "changed by"), 3);
	/* preemptible: into the spec, with its event; the same value again writes none */
	j = patch_ok(d, id, "{\"preemptible\": true}");
	assert_true(json_is_true(json_object_get(json_object_get(j, "spec"), "preemptible")));
	json_decref(j);
	json_decref(patch_ok(d, id, "{\"preemptible\": true}"));
	assert_int_equal(count_events_with(d, id, "changed by default: preemptible false -> true"), 1);
	assert_int_equal(count_events_with(d, id, "changed by"), 4);

	/* refused: named, and nothing written */
	const struct {
		const char *body, *field, *parts;
	} bad[] = {
		{"{\"model\": {\"hidden_size\": 64}}", "model", "unknown key|priority, name, tags, notes and preemptible"},
		{"{\"preemptible\": \"yes\"}", "preemptible", "boolean"},
		{"{\"preemptible\": null}", "preemptible", "boolean"},
		{"{\"priority\": 1, \"dataset\": \"other\"}", "dataset", "unknown key"},
		{"{\"priority\": \"high\"}", "priority", "integer"},
		{"{\"priority\": 101}", "priority", "between -100 and 100"},
		{"{\"priority\": 1.5}", "priority", "integer"},
		{"{\"name\": null}", "name", "string"},
		{"{\"name\": \"bad name\"}", "name", "A-Z a-z 0-9"},
		{"{\"tags\": \"exp:3\"}", "tags", "array"},
		{"{\"tags\": [\"ok\", \"not ok\"]}", "tags[1]", "A-Z a-z 0-9"},
		{"{\"tags\": [\"a\", \"a\"]}", "tags[1]", "repeats tags[0]"},
		{"{\"notes\": 3}", "notes", "string"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		http_resp r = patch(d, id, bad[i].body);
		it_assert_refused(&r, bad[i].field, bad[i].parts);
	}
	j = job_of(d, id);
	assert_int_equal(json_integer_value(json_object_get(j, "priority")), 7);
	tags_of(j, tags, sizeof tags);
	assert_string_equal(tags, "exp:2");
	assert_true(json_is_true(json_object_get(json_object_get(j, "spec"), "preemptible")));
	json_decref(j);
	assert_int_equal(count_events_with(d, id, "changed by"), 4);

	const char *not_objects[] = {"[]", "{\"priority\": ", "7"};
	for (size_t i = 0; i < 3; i++) {
		http_resp r = patch(d, id, not_objects[i]);
		assert_int_equal(r.status, 400);
		http_resp_free(&r);
	}
	http_resp r = patch(d, "job-0000000000000000", "{\"priority\": 1}");
	assert_int_equal(r.status, 404);
	http_resp_free(&r);
	r = patch(d, "nonsense", "{\"priority\": 1}");
	assert_int_equal(r.status, 404);
	http_resp_free(&r);

	/* a multi-node job is never preempted: refused at submit and by PATCH */
	spec = it_job_spec("multi", "shakes", "resources", "{\"nodes\":2,\"gpus_per_node\":1}", "preemptible",
			   "true", NULL);
	it_submit_refused(d, spec, "preemptible", "multi-node|never preempted");
	free(spec);
	spec = it_job_spec("multi", "shakes", "resources", "{\"nodes\":2,\"gpus_per_node\":1}", NULL);
	char *multi = it_submit(d, spec);
	free(spec);
	r = patch(d, multi, "{\"preemptible\": true}");
	it_assert_refused(&r, "preemptible", "multi-node|never preempted");
	json_decref(patch_ok(d, multi, "{\"preemptible\": false}"));
	assert_int_equal(count_events_with(d, multi, "changed by"), 0);
	it_cancel_job(d, multi, DEADLINE_S);
	free(multi);

	it_cancel_job(d, id, DEADLINE_S);
	r = patch(d, id, "{\"priority\": 1}");
	assert_int_equal(r.status, 409);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:job-state-conflict");
	http_resp_free(&r);
	j = job_of(d, id);
	assert_int_equal(json_integer_value(json_object_get(j, "priority")), 7);
	json_decref(j);
	free(id);
}

#define RACE_PATCHES 20

typedef struct racer {
	const bertd *d;
	const char *id;
	long status[RACE_PATCHES];
	atomic_int answered;
} racer;

static void *race_patches(void *arg)
{
	racer *rc = arg;
	for (int k = 0; k < RACE_PATCHES; k++) {
		char body[64], path[96];
		http_resp r;
		snprintf(body, sizeof body, "{\"priority\": %d}", k + 1);
		snprintf(path, sizeof path, "/v1/jobs/%s", rc->id);
		rc->status[k] = http_do(rc->d, "PATCH", path, body, strlen(body), NULL, H_AUTH, &r) == 0
				? r.status : -1;
		http_resp_free(&r);
		atomic_fetch_add(&rc->answered, 1);
	}
	return NULL;
}

static void test_patch_races_cancel(void **state)
{
	const bertd *d = *state;
	for (int round = 0; round < 3; round++) {
		char *spec = it_job_spec(NULL, "shakes", NULL);
		char *id = it_submit(d, spec);
		free(spec);
		racer rc = {.d = d, .id = id};
		atomic_init(&rc.answered, 0);
		pthread_t t;
		assert_int_equal(pthread_create(&t, NULL, race_patches, &rc), 0);
		/* the cancel goes out once 0, 5, 10 PATCHes were answered, and races
		 * the ones in flight */
		while (atomic_load(&rc.answered) < 5 * round)
			sched_yield();
		char path[96];
		http_resp r;
		snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
		assert_int_equal(http_do(d, "POST", path, NULL, 0, NULL, H_AUTH, &r), 0);
		assert_int_equal(r.status, 200);
		http_resp_free(&r);
		pthread_join(t, NULL);
		int ok = 0;
		for (int k = 0; k < RACE_PATCHES; k++) {
			if (rc.status[k] == 200) {
				assert_int_equal(ok, k); /* no 200 after a 409 */
				ok++;
			} else if (rc.status[k] != 409) {
				fail_msg("PATCH %d of %s: %ld", k, id, rc.status[k]);
			}
		}
		json_t *j = job_of(d, id);
		assert_string_equal(it_jstr(j, "state"), "canceled");
		assert_int_equal(json_integer_value(json_object_get(j, "priority")), ok);
		json_decref(j);
		/* every 200 wrote its event, all of them before the cancel's */
		json_t *ev = it_events_of(d, id);
		size_t n = json_array_size(ev), changed = 0;
		const char *last = json_string_value(json_object_get(json_array_get(ev, n - 1), "reason"));
		assert_string_equal(last, "canceled by default");
		for (size_t i = 0; i < n; i++) {
			const char *why = json_string_value(json_object_get(json_array_get(ev, i), "reason"));
			changed += why && strstr(why, "changed by default: priority");
		}
		assert_int_equal(changed, ok);
		json_decref(ev);
		fprintf(stderr, "round %d: %d PATCHes before the cancel, %d after\n", round, ok,
			RACE_PATCHES - ok);
		free(id);
	}
}

/* GET path: the ids of its "jobs" joined by ',' into out; the next_cursor
 * (caller frees) or NULL. */
static char *page_ids(const bertd *d, const char *path, char *out, size_t cap)
{
	json_t *p = it_get_json(d, path);
	json_t *jobs = json_object_get(p, "jobs");
	for (size_t i = 0; i < json_array_size(jobs); i++)
		snprintf(out + strlen(out), cap - strlen(out), "%s%s", out[0] ? "," : "",
			 it_jstr(json_array_get(jobs, i), "id"));
	json_t *c = json_object_get(p, "next_cursor");
	char *next = json_is_string(c) ? strdup(json_string_value(c)) : NULL;
	json_decref(p);
	return next;
}

/* Every page of GET /v1/jobs?query&limit=limit, ids joined; *pages counts them. */
static void all_pages(const bertd *d, const char *query, int limit, char *out, size_t cap, int *pages)
{
	char path[512];
	char *cursor = NULL;
	out[0] = 0;
	*pages = 0;
	do {
		snprintf(path, sizeof path, "/v1/jobs?%s&limit=%d%s%s", query, limit, cursor ? "&cursor=" : "",
			 cursor ? cursor : "");
		free(cursor);
		cursor = page_ids(d, path, out, cap);
		(*pages)++;
		assert_true(*pages < 50);
	} while (cursor);
}

static void test_list_filters(void **state)
{
	const bertd *d = *state;
	char *ids[7];
	char want[512] = "", want_desc[512] = "";
	/* jobs 0, 2, 3, 5, 6 carry "sweep:a"; 1 and 4 do not */
	for (int i = 0; i < 7; i++) {
		bool tagged = i != 1 && i != 4;
		char *spec = it_job_spec(NULL, "shakes", "tags", tagged ? "[\"x\",\"sweep:a\"]" : "[\"x\"]", NULL);
		ids[i] = it_submit(d, spec);
		free(spec);
	}
	char got[1024];
	int pages;
	snprintf(want, sizeof want, "%s,%s,%s,%s,%s", ids[0], ids[2], ids[3], ids[5], ids[6]);
	all_pages(d, "tag=sweep:a", 2, got, sizeof got, &pages);
	assert_string_equal(got, want);
	assert_int_equal(pages, 3);
	snprintf(want_desc, sizeof want_desc, "%s,%s,%s,%s,%s", ids[6], ids[5], ids[3], ids[2], ids[0]);
	all_pages(d, "tag=sweep:a&order=desc", 2, got, sizeof got, &pages);
	assert_string_equal(got, want_desc);
	all_pages(d, "tag=sweep:a&owner=default&state=queued", 4, got, sizeof got, &pages);
	assert_string_equal(got, want);
	assert_int_equal(pages, 2);
	all_pages(d, "tag=sweep:a&owner=someone-else", 2, got, sizeof got, &pages);
	assert_string_equal(got, "");
	all_pages(d, "tag=sweep:b", 2, got, sizeof got, &pages);
	assert_string_equal(got, "");
	all_pages(d, "owner=default&tag=x", 3, got, sizeof got, &pages);
	assert_int_equal(pages, 3); /* all seven */

	/* PATCH moves jobs in and out of a tag */
	json_decref(patch_ok(d, ids[1], "{\"tags\": [\"sweep:a\"]}"));
	json_decref(patch_ok(d, ids[3], "{\"tags\": null}"));
	snprintf(want, sizeof want, "%s,%s,%s,%s,%s", ids[0], ids[1], ids[2], ids[5], ids[6]);
	all_pages(d, "tag=sweep:a", 2, got, sizeof got, &pages);
	assert_string_equal(got, want);

	const char *bad[] = {"/v1/jobs?tag=", "/v1/jobs?tag=a%20b", "/v1/jobs?owner="};
	const char *field[] = {"tag", "tag", "owner"};
	for (int i = 0; i < 3; i++) {
		http_resp r;
		assert_int_equal(http_get(d, bad[i], &r), 0);
		assert_int_equal(r.status, 400);
		assert_string_equal(it_jstr(r.json, "field"), field[i]);
		http_resp_free(&r);
	}
	for (int i = 0; i < 7; i++)
		free(ids[i]);
}

/* One CPU slot, held by a long job; two jobs queue behind it at the same
 * priority, the later one raised. Without the raise the earlier one goes
 * first (submission order breaks ties). */
static void test_priority_raise_overtakes(void **state)
{
	const bertd *d = *state;
	char *spec = it_job_spec("blocker", "shakes", "training_args.max_steps", "100000",
				 "training_args.save_steps", "100000", NULL);
	char *a = it_submit(d, spec);
	free(spec);
	json_decref(it_wait_job(d, a, "running", DEADLINE_S));
	/* long too, so the one that starts holds the slot while the other is looked at */
	spec = it_job_spec("early", "shakes", "training_args.max_steps", "100000",
			   "training_args.save_steps", "100000", NULL);
	char *early = it_submit(d, spec);
	free(spec);
	spec = it_job_spec("late", "shakes", "training_args.max_steps", "100000",
			   "training_args.save_steps", "100000", NULL);
	char *late = it_submit(d, spec);
	free(spec);

	/* a running job can be changed too */
	json_t *j = patch_ok(d, a, "{\"tags\": [\"blocker\"], \"priority\": -5}");
	assert_string_equal(it_jstr(j, "state"), "running");
	assert_int_equal(json_integer_value(json_object_get(j, "priority")), -5);
	json_decref(j);
	json_decref(patch_ok(d, late, "{\"priority\": 10}"));
	it_cancel_job(d, a, DEADLINE_S);
	j = it_wait_job(d, late, "starting|running", DEADLINE_S);
	json_decref(j);
	j = job_of(d, early);
	assert_string_equal(it_jstr(j, "state"), "queued");
	assert_true(json_is_null(json_object_get(j, "started_at")));
	json_decref(j);
	it_cancel_job(d, late, DEADLINE_S);
	it_cancel_job(d, early, DEADLINE_S);
	free(a);
	free(early);
	free(late);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_patch_fields, setup_hold, it_teardown),
		cmocka_unit_test_setup_teardown(test_list_filters, setup_hold, it_teardown),
		cmocka_unit_test_setup_teardown(test_patch_races_cancel, setup_hold, it_teardown),
		cmocka_unit_test_setup_teardown(test_priority_raise_overtakes, setup_run, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
