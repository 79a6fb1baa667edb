/* Jobs end to end on the CPU backend: the real daemon prepares a dataset,
 * schedules jobs onto CPU slots, runs loader and worker processes, records
 * metrics and checkpoints, exports the model, and survives failures:
 *   - a full run with 2 workers + 1 loader completes, loss falls, metrics
 *     are complete, the export is a loadable safetensors model;
 *   - kill -9 of one worker mid-run restarts the job from its checkpoint and
 *     ends with bit-identical weights to an uninterrupted run;
 *   - kill -9 of the daemon mid-run: the job's processes outlive it, the
 *     next daemon adopts them (no restart), and no process of the job is
 *     left once it completed (test_adopt holds the rest of adoption);
 *   - cancel while running ends canceled with a checkpoint;
 *   - two jobs run at once on disjoint slots, a third waits its turn;
 *   - a job naming a missing dataset fails with a reason;
 *   - worker and loader inherit what pass_env names of the daemon's
 *     environment, and nothing else.
 * Waiting is polling the API with a deadline: job states change
 * asynchronously, and the test asserts on the states, never on timing. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

typedef it_fx fx;

static const char *const daemon_args[] = {"--stop-timeout-s", "60", NULL};
static const it_daemon_opts daemon_opts = {.cpu_slots = "2", .extra = daemon_args, .dataset = "shakes",
					   .corpus = "shakes.txt", .corpus_lines = 3000, .vocab_size = 400};

static int setup(void **state) { return it_setup(state, &daemon_opts, DEADLINE_S); }

/* Submits it_job_spec's tiny job (a model small enough to train in
 * seconds on two cores) name on shakes for steps steps on gpus ranks with
 * loaders data loaders; returns its id (caller frees). */
static char *submit(const bertd *d, const char *name, const char *steps, const char *gpus, const char *loaders)
{
	char *spec = it_job_spec(name, "shakes", "training_args.max_steps", steps, "resources.gpus", gpus,
				 "training_args.dataloader_num_workers", loaders, NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static void test_full_run(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "full", "60", "2", "1");
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_int_equal(json_array_size(json_object_get(job, "devices")), 2);
	/* two CPU slots: placed on both, which share memory */
	json_t *pl = json_object_get(job, "placement");
	assert_int_equal(json_array_size(json_object_get(pl, "devices")), 2);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(pl, "devices"), 0)), 0);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(pl, "devices"), 1)), 1);
	assert_true(json_is_true(json_object_get(pl, "connected")));
	json_t *m = it_metrics_of(&f->d, id);
	assert_int_equal(json_array_size(m), 12); /* steps 5, 10, ..., 60 */
	double first = json_number_value(json_object_get(json_array_get(m, 0), "loss"));
	double last = json_number_value(json_object_get(json_array_get(m, 11), "loss"));
	assert_int_equal(json_integer_value(json_object_get(json_array_get(m, 11), "step")), 60);
	/* Chance level is ln(400) = 5.99. In 60 steps this 1-layer model learns
	 * the token distribution (about -0.5 nats; it measured 5.94 -> 5.45);
	 * context takes longer (the learning test in tests/unit/worker). */
	fprintf(stderr, "full run: loss %.4f at step 5 -> %.4f at step 60\n", first, last);
	if (!(last < first - 0.25))
		fail_msg("loss did not fall: %f -> %f", first, last);
	assert_true(json_number_value(json_object_get(json_array_get(m, 11), "tokens_per_s")) > 0);
	json_decref(m);
	/* checkpoints kept: save_total_limit (3) of 10, 20, ..., 60 */
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
	http_resp r;
	assert_int_equal(http_get(&f->d, path, &r), 0);
	json_t *ck = json_object_get(r.json, "checkpoints");
	assert_int_equal(json_array_size(ck), 3);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(ck, 2), "step")), 60);
	http_resp_free(&r);
	/* the export exists and parses as safetensors + config */
	char file[1200];
	snprintf(file, sizeof file, "%s/config.json", it_jstr(job, "model_dir"));
	json_t *cfg = json_load_file(file, 0, NULL);
	assert_non_null(cfg);
	assert_int_equal(json_integer_value(json_object_get(cfg, "hidden_size")), 32);
	json_decref(cfg);
	snprintf(file, sizeof file, "%s/vocab.txt", it_jstr(job, "model_dir"));
	assert_int_equal(access(file, R_OK), 0);
	/* model.safetensors: u64 header length, a JSON header, then the data;
	 * HF names with the shapes of this config (transformers loads the same
	 * files in tests/unit/worker's export check) */
	it_export ex;
	it_export_load(job, &ex);
	json_t *we = json_object_get(ex.hdr, "bert.embeddings.word_embeddings.weight");
	assert_non_null(we);
	assert_string_equal(json_string_value(json_object_get(we, "dtype")), "F32");
	assert_int_equal(json_integer_value(json_array_get(json_object_get(we, "shape"), 0)), 400);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(we, "shape"), 1)), 32);
	assert_non_null(json_object_get(ex.hdr, "cls.predictions.transform.dense.weight"));
	it_export_free(&ex);
	/* worker logs are served */
	snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=1&tail=5", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "bertd-worker[1]"));
	http_resp_free(&r);
	/* nothing of the job is left running */
	pid_t pids[8];
	assert_int_equal(it_find_pids(id, NULL, pids, 8), 0);
	json_decref(job);
	free(id);
}

static void test_kill_worker_resumes_exactly(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *ref = submit(&f->d, "ref", "150", "2", "1");
	json_t *jref = it_wait_job(&f->d, ref, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(jref, "state"), "completed");

	char *id = submit(&f->d, "killed", "150", "2", "1");
	it_wait_step(&f->d, id, 15, DEADLINE_S); /* past the step-10 checkpoint */
	it_kill_rank(id, 1);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 1);

	char a[65], b[65];
	it_sha_of_export(jref, a);
	it_sha_of_export(job, b);
	assert_string_equal(a, b); /* bit-identical to the uninterrupted run */
	json_t *ma = it_metrics_of(&f->d, ref), *mb = it_metrics_of(&f->d, id);
	assert_int_equal(json_array_size(ma), json_array_size(mb));
	for (size_t i = 0; i < json_array_size(ma); i++)
		assert_true(json_number_value(json_object_get(json_array_get(ma, i), "loss")) ==
			    json_number_value(json_object_get(json_array_get(mb, i), "loss")));
	json_decref(ma);
	json_decref(mb);

	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
	http_resp r;
	assert_int_equal(http_get(&f->d, path, &r), 0);
	bool saw_restart = false;
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(r.json, "events"), i, e)
		saw_restart |= !strcmp(it_jstr(e, "to"), "restarting") && strstr(it_jstr(e, "reason"), "rank 1");
	assert_true(saw_restart);
	http_resp_free(&r);
	json_decref(job);
	json_decref(jref);
	free(ref);
	free(id);
}

static void test_kill_daemon_resumes(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "survivor", "150", "2", "1");
	it_wait_step(&f->d, id, 15, DEADLINE_S);
	bertd_kill9(&f->d);
	/* the job's processes outlive the daemon (docs/architecture.md) */
	pid_t pids[8];
	assert_true(it_find_pids(id, NULL, pids, 8) > 0);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	for (int i = 0; i < 100 && it_find_pids(id, NULL, pids, 8) > 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids(id, NULL, pids, 8), 0);
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
	http_resp r;
	assert_int_equal(http_get(&f->d, path, &r), 0);
	bool resumed = false;
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(r.json, "events"), i, e)
		resumed |= strstr(it_jstr(e, "reason"), "adopted the running attempt") != NULL;
	assert_true(resumed);
	http_resp_free(&r);
	json_decref(job);
	free(id);
}

static void test_cancel_running(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "cancel-me", "100000", "1", "0");
	it_wait_step(&f->d, id, 5, DEADLINE_S);
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
	http_resp r;
	assert_int_equal(http_do(&f->d, "POST", path, NULL, 0, NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 202);
	http_resp_free(&r);
	json_t *job = it_wait_job(&f->d, id, "canceled|failed|completed", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "canceled");
	assert_true(json_is_object(json_object_get(job, "last_checkpoint"))); /* checkpointed on the way out */
	json_decref(job);
	free(id);
}

static void test_max_runtime(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *spec = it_job_spec("timeboxed", "shakes", "training_args.max_steps", "1000000", "training_args.save_steps",
				 "1000", "training_args.seed", "null", "training_args.learning_rate", "null",
				 "training_args.warmup_steps", "null", "resources", "null", "stopping_condition",
				 "{\"max_runtime_seconds\":2}", NULL);
	char *id = it_submit(&f->d, spec);
	free(spec);
	json_t *job = it_wait_job(&f->d, id, "canceled|failed|completed", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "canceled");
	assert_true(json_is_object(json_object_get(job, "last_checkpoint"))); /* work kept */
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
	http_resp r;
	assert_int_equal(http_get(&f->d, path, &r), 0);
	bool limit = false, ended = false;
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(r.json, "events"), i, e) {
		limit |= !strcmp(it_jstr(e, "to"), "stopping") && strstr(it_jstr(e, "reason"), "max_runtime_seconds");
		ended |= !strcmp(it_jstr(e, "to"), "canceled") && strstr(it_jstr(e, "reason"), "max_runtime_seconds");
	}
	assert_true(limit);
	assert_true(ended);
	http_resp_free(&r);
	json_decref(job);
	free(id);
}

static void test_two_at_once_third_waits(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *a = submit(&f->d, "a", "100000", "1", "0");
	char *b = submit(&f->d, "b", "100000", "1", "0");
	char *c = submit(&f->d, "c", "10", "1", "0");
	json_t *ja = it_wait_job(&f->d, a, "running", DEADLINE_S);
	json_t *jb = it_wait_job(&f->d, b, "running", DEADLINE_S);
	/* disjoint slots */
	json_int_t da = json_integer_value(json_object_get(json_array_get(json_object_get(ja, "devices"), 0), "id"));
	json_int_t db = json_integer_value(json_object_get(json_array_get(json_object_get(jb, "devices"), 0), "id"));
	assert_true(da != db);
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", c);
	http_resp r;
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_string_equal(it_jstr(r.json, "state"), "queued"); /* both slots are taken */
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", a);
	assert_int_equal(http_do(&f->d, "POST", path, NULL, 0, NULL, H_AUTH, &r), 0);
	http_resp_free(&r);
	json_t *jc = it_wait_job(&f->d, c, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(jc, "state"), "completed");
	it_cancel_job(&f->d, b, DEADLINE_S);
	json_decref(ja);
	json_decref(jb);
	json_decref(jc);
	free(a);
	free(b);
	free(c);
}

/* What a job needs is checked at submit: an unknown dataset or
 * more devices than the machine has is a 422 naming the field and what
 * exists, never a 201 that fails a moment later. */
static void test_missing_dataset_refused(void **state)
{
	fx *f = *state;
	http_resp r;
	char *spec = it_job_spec(NULL, "nope", "model", "{\"preset\":\"bert-tiny\"}", "training_args", "null",
				 "resources", "null", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status != 422)
		fail_msg("unknown dataset -> %ld: %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:invalid-spec");
	assert_string_equal(it_jstr(r.json, "field"), "dataset");
	assert_non_null(strstr(it_jstr(r.json, "detail"), "no dataset \"nope\""));
	assert_non_null(strstr(it_jstr(r.json, "detail"), "\"shakes\"")); /* names what exists */
	http_resp_free(&r);
	/* more devices than exist (2 CPU slots here) */
	spec = it_job_spec(NULL, "shakes", "model", "null", "training_args", "null", "resources.gpus", "8", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status != 422)
		fail_msg("gpus 8 -> %ld: %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "field"), "resources.gpus");
	assert_non_null(strstr(it_jstr(r.json, "detail"), "asks for 8 devices; this machine has 2"));
	http_resp_free(&r);
	/* nothing was stored */
	assert_int_equal(http_get(&f->d, "/v1/jobs", &r), 0);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), 0);
	http_resp_free(&r);
}

/* The "loss" logged at step of job id. */
static double loss_at(const bertd *d, const char *id, long step)
{
	json_t *m = it_metrics_of(d, id);
	double loss = -1;
	size_t i;
	json_t *row;
	json_array_foreach(m, i, row)
		if (json_integer_value(json_object_get(row, "step")) == step)
			loss = json_number_value(json_object_get(row, "loss"));
	json_decref(m);
	if (loss < 0)
		fail_msg("job %s logged no loss at step %ld", id, step);
	return loss;
}

/* Submits the tiny job name (20 steps, one loader) on dataset "cased" with
 * init_from (JSON text, "" for none) and returns the id; *resolved gets
 * the path the API resolved it to. */
static char *submit_cased(const bertd *d, const char *name, const char *init_from, char *resolved,
			  size_t cap)
{
	char *spec = it_job_spec(name, "cased", "training_args.max_steps", "20", "training_args.dataloader_num_workers",
				 "1", "init_from", init_from[0] ? init_from : "null", NULL);
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status != 201)
		fail_msg("submit %s: status %ld: %s", name, r.status, r.body);
	json_t *v = json_object_get(json_object_get(r.json, "spec"), "init_from");
	snprintf(resolved, cap, "%s", json_is_string(v) ? json_string_value(v) : "");
	char *id = strdup(it_jstr(r.json, "id"));
	http_resp_free(&r);
	return id;
}

/* A job starts from another finished job's weights: its HF export
 * ({"job": id}), a given checkpoint and the latest one, and trains. The
 * export carries the tokenizer files that make AutoTokenizer tokenize as the
 * dataset was (cased here: do_lower_case false). */
static void test_init_from_finished_job(void **state)
{
	fx *f = *state;
	char path[1200], ref[256], got[1200];
	if (it_add_dataset(&f->d, "{\"name\":\"cased\",\"source\":\"shakes.txt\",\"lowercase\":false,"
				  "\"vocab\":{\"train\":{\"vocab_size\":400}}}"))
		fail_msg("adding dataset \"cased\"");
	it_wait_dataset_ready(&f->d, "cased", DEADLINE_S);
	char *a = submit_cased(&f->d, "base", "", got, sizeof got);
	json_t *ja = it_wait_completed(&f->d, a, DEADLINE_S);
	const char *export = it_jstr(ja, "model_dir");

	/* the export's tokenizer files, as BertTokenizer.save_pretrained writes them */
	snprintf(path, sizeof path, "%s/tokenizer_config.json", export);
	json_t *tc = json_load_file(path, 0, NULL);
	if (!tc)
		fail_msg("%s is missing or not JSON", path);
	assert_true(json_is_false(json_object_get(tc, "do_lower_case")));
	assert_int_equal(json_integer_value(json_object_get(tc, "model_max_length")), 64);
	assert_string_equal(it_jstr(tc, "tokenizer_class"), "BertTokenizer");
	assert_string_equal(it_jstr(tc, "mask_token"), "[MASK]");
	json_decref(tc);
	snprintf(path, sizeof path, "%s/special_tokens_map.json", export);
	json_t *sm = json_load_file(path, 0, NULL);
	if (!sm)
		fail_msg("%s is missing or not JSON", path);
	assert_string_equal(it_jstr(sm, "cls_token"), "[CLS]");
	json_decref(sm);

	/* init_from each form; the API answers with the resolved path */
	snprintf(ref, sizeof ref, "{\"job\":\"%s\"}", a);
	char *b = submit_cased(&f->d, "from-export", ref, got, sizeof got);
	char *real = realpath(export, NULL);
	assert_non_null(real);
	assert_string_equal(got, real);
	free(real);
	snprintf(ref, sizeof ref, "{\"job\":\"%s\",\"checkpoint\":10}", a);
	char *c = submit_cased(&f->d, "from-ckpt-10", ref, got, sizeof got);
	assert_non_null(strstr(got, "/checkpoints/ckpt-10"));
	assert_non_null(strstr(got, a));
	snprintf(ref, sizeof ref, "{\"job\":\"%s\",\"checkpoint\":\"latest\"}", a);
	char *l = submit_cased(&f->d, "from-latest", ref, got, sizeof got);
	assert_non_null(strstr(got, "/checkpoints/ckpt-20"));

	/* Each trains from those weights: at step 5 it is below where the base
	 * job was at step 5 from random weights (the same seed and data order,
	 * so only the starting weights differ). */
	double base5 = loss_at(&f->d, a, 5), base20 = loss_at(&f->d, a, 20), l5[3];
	char *ids[] = {b, c, l};
	for (int i = 0; i < 3; i++) {
		json_t *j = it_wait_job(&f->d, ids[i], "completed|failed|canceled", DEADLINE_S);
		it_assert_completed(&f->d, j);
		json_decref(j);
		l5[i] = loss_at(&f->d, ids[i], 5);
		fprintf(stderr, "init_from %s: loss at step 5 %.4f (base job: %.4f at 5, %.4f at 20)\n",
			i == 0 ? "export" : i == 1 ? "checkpoint 10" : "latest", l5[i], base5, base20);
		if (!(l5[i] < base5))
			fail_msg("job %s did not start from the base job's weights: loss %f at step 5, "
				 "the base job had %f from random weights", ids[i], l5[i], base5);
		free(ids[i]);
	}
	/* the export and the last checkpoint hold the same weights: the same
	 * run from either is the same run */
	assert_true(l5[0] == l5[2]);
	json_decref(ja);
	free(a);
}

/* A job queued by an older bertd, whose stored effective spec lacks keys
 * added since (here profiler.simulate_data_delay_ms), still runs: the
 * supervisor normalizes stored specs again, which only fills defaults. */
static void test_spec_from_older_bertd_runs(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	assert_int_equal(bertd_stop(&f->d), 0);
	const char *held[] = {"--data-roots", f->data, "--devices", "cpu", "--cpu-slots", "2",
			      "--schedule", "false", NULL};
	assert_int_equal(bertd_start(&f->d, held), 0);
	char *id = submit(&f->d, "older", "10", "1", "0");
	assert_int_equal(bertd_stop(&f->d), 0);
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
		 "sqlite3 '%s/bertd.db' \"UPDATE jobs SET spec_json = "
		 "json_remove(spec_json, '$.profiler.simulate_data_delay_ms') WHERE id = '%s'; "
		 "SELECT json_extract(spec_json, '$.profiler') FROM jobs WHERE id = '%s'\"",
		 f->d.state_dir, id, id);
	FILE *p = popen(cmd, "r"); /* the sqlite3 CLI comes with scripts/setup */
	assert_non_null(p);
	char out[256] = "";
	assert_non_null(fgets(out, sizeof out, p));
	assert_int_equal(pclose(p), 0);
	assert_null(strstr(out, "simulate_data_delay_ms")); /* really the old shape now */
	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *job = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "completed");
	json_decref(job);
	free(id);
}

/* SIGTERM drains: a running job checkpoints, goes back to queued, and the
 * next daemon resumes it from that checkpoint. */
static void test_sigterm_requeues(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "drained", "150", "2", "1");
	it_wait_step(&f->d, id, 15, DEADLINE_S);
	assert_int_equal(bertd_stop(&f->d), 0); /* exit 0 after draining */
	pid_t pids[8];
	assert_int_equal(it_find_pids(id, NULL, pids, 8), 0);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	json_t *job = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "completed");
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
	http_resp r;
	assert_int_equal(http_get(&f->d, path, &r), 0);
	bool requeued = false, resumed = false;
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(r.json, "events"), i, e) {
		requeued |= !strcmp(it_jstr(e, "to"), "queued") && strstr(it_jstr(e, "reason"), "shutting down");
		resumed |= strstr(it_jstr(e, "reason"), "resuming from checkpoint") != NULL;
	}
	assert_true(requeued);
	assert_true(resumed);
	http_resp_free(&r);
	json_decref(job);
	free(id);
}

/* The volume holding job files fills up: the job fails with the reason,
 * the daemon keeps serving, the store is intact. A small tmpfs stands in
 * for the full disk (skipped where the test may not mount). */
static void test_disk_full(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char jobs[160];
	snprintf(jobs, sizeof jobs, "%s/jobs", f->d.state_dir);
	mkdir(jobs, 0700);
	if (mount("tmpfs", jobs, "tmpfs", 0, "size=256k") < 0) {
		fprintf(stderr, "cannot mount a tmpfs (%s): skipping\n", strerror(errno));
		skip();
	}
	char *id = submit(&f->d, "full-disk", "40", "1", "0");
	json_t *job = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "failed");
	const char *why = it_jstr(job, "failure_reason");
	if (!strstr(why, "No space left on device"))
		fail_msg("failure reason: %s", why);
	json_decref(job);
	/* still serving, store intact */
	http_resp r;
	assert_int_equal(http_get(&f->d, "/v1/jobs", &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), 1);
	http_resp_free(&r);
	assert_int_equal(bertd_stop(&f->d), 0);
	assert_int_equal(umount2(jobs, MNT_DETACH), 0);
	char cmd[400];
	snprintf(cmd, sizeof cmd, "sqlite3 '%s/bertd.db' 'PRAGMA integrity_check' 2>/dev/null", f->d.state_dir);
	FILE *p = popen(cmd, "r"); /* the sqlite3 CLI comes with scripts/setup */
	assert_non_null(p);
	char out[64] = "";
	assert_non_null(fgets(out, sizeof out, p));
	pclose(p);
	assert_string_equal(out, "ok\n");
	assert_int_equal(it_daemon_run(f, NULL), 0);
	free(id);
}

/* Reads /proc/<pid>/environ into buf (NUL-separated); returns its length. */
static size_t environ_of(pid_t pid, char *buf, size_t cap)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = 0;
	return n;
}

/* The value of name in an environ block, or NULL; fails the test if name
 * is there twice (which one a library reads is then anyone's guess). */
static const char *env_in(const char *buf, size_t len, const char *name)
{
	size_t n = strlen(name);
	const char *found = NULL;
	for (const char *e = buf; e < buf + len; e += strlen(e) + 1) {
		if (strncmp(e, name, n) == 0 && e[n] == '=') {
			if (found)
				fail_msg("%s is in the environment twice", name);
			found = e + n + 1;
		}
	}
	return found;
}

/* The daemon's environment reaches a job's processes only through
 * pass_env: a passed NCCL_ variable and a listed name arrive in worker and
 * loader, an unlisted one does not, and the daemon's own
 * CUDA_VISIBLE_DEVICES never overrides the one the supervisor sets, even
 * with CUDA_* passed (nor is CUDA_DEVICE_ORDER left to CUDA's fastest-first
 * default). Read from the
 * live processes' /proc/<pid>/environ. */
static void test_child_environment(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	assert_int_equal(bertd_stop(&f->d), 0);
	static const char *const vars[][2] = {{"NCCL_SOCKET_IFNAME", "lo"}, {"IT_LISTED", "yes"},
					      {"IT_UNLISTED", "no"}, {"CUDA_VISIBLE_DEVICES", "7"}};
	for (size_t i = 0; i < 4; i++)
		setenv(vars[i][0], vars[i][1], 1); /* the harness hands bertd our environment */
	const char *extra[] = {"--data-roots", f->data, "--devices", "cpu", "--cpu-slots", "2",
			       "--schedule", "true", "--pass-env", "NCCL_*:CUDA_*:IT_LISTED", NULL};
	int rc = bertd_start(&f->d, extra);
	for (size_t i = 0; i < 4; i++)
		unsetenv(vars[i][0]);
	assert_int_equal(rc, 0);
	static char buf[65536];
	size_t len = environ_of(f->d.pid, buf, sizeof buf);
	assert_non_null(env_in(buf, len, "IT_UNLISTED")); /* the daemon has it: its absence below means something */

	char *id = submit(&f->d, "env", "100000", "1", "1");
	json_decref(it_wait_job(&f->d, id, "running", DEADLINE_S));
	pid_t worker, loader;
	assert_int_equal(it_find_pids("bertd-worker", id, &worker, 1), 1);
	assert_int_equal(it_find_pids("bertd-loader", id, &loader, 1), 1);

	/* name=value, or unset for a NULL value */
	static const struct { const char *who, *name, *value; } want[] = {
		{"worker", "NCCL_SOCKET_IFNAME", "lo"},
		{"worker", "IT_LISTED", "yes"},
		{"worker", "IT_UNLISTED", NULL},
		{"worker", "CUDA_VISIBLE_DEVICES", "-1"}, /* a CPU slot */
		{"worker", "CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
		{"loader", "NCCL_SOCKET_IFNAME", "lo"},
		{"loader", "IT_LISTED", "yes"},
		{"loader", "IT_UNLISTED", NULL},
		{"loader", "CUDA_VISIBLE_DEVICES", NULL},
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		len = environ_of(strcmp(want[i].who, "worker") == 0 ? worker : loader, buf, sizeof buf);
		const char *v = env_in(buf, len, want[i].name);
		if (want[i].value ? !v || strcmp(v, want[i].value) != 0 : v != NULL)
			fail_msg("%s: %s is %s, expected %s", want[i].who, want[i].name, v ? v : "unset",
				 want[i].value ? want[i].value : "unset");
	}

	it_cancel_job(&f->d, id, DEADLINE_S);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_full_run, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_kill_worker_resumes_exactly, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_kill_daemon_resumes, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_cancel_running, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_max_runtime, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_two_at_once_third_waits, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_missing_dataset_refused, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_init_from_finished_job, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_sigterm_requeues, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_spec_from_older_bertd_runs, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_disk_full, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_child_environment, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
