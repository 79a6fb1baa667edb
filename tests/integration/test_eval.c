/* Held-out evaluation: a two-rank CPU job (one loader) with
 * validation_split_percentage and eval_steps runs to completion, and
 *   - the metrics rows of the eval steps (every eval_steps and the last
 *     step) hold eval_loss, perplexity = exp(eval_loss) and eval_accuracy;
 *     an eval step that is not a logging step has a row of its own, the
 *     logging rows between have none; the windows an eval ran in show the
 *     phase "eval";
 *   - GET /v1/jobs/{id} has eval.last (the last step) and eval.best (the
 *     lowest eval_loss of the rows);
 *   - transformers (Debian's /usr/bin/python3; skipped without it) loads the
 *     export with BertForMaskedLM in eval mode, computes the loss on the
 *     eval batches the worker wrote (eval_batches.bin) and gets the final
 *     eval_loss within 1e-5 and the same accuracy; the same check against
 *     a value 1e-4 off fails, so it can;
 *   - TensorBoard's reader (tb_read.py; skipped without tensorboard) finds
 *     eval/loss, eval/perplexity and eval/accuracy at the eval steps;
 *   - a job without eval_strategy has no eval keys and no eval file;
 *   - while an evaluating job runs, GET /metrics (Prometheus) shows its
 *     newest eval_loss, perplexity and accuracy and its lowest eval_loss,
 *     equal to the metrics rows'. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300

typedef it_fx fx;

static int setup(void **state)
{
	const char *extra[] = {"--stop-timeout-s", "60", NULL};
	it_daemon_opts o = {.cpu_slots = "2", .extra = extra, .dataset = "evalds", .corpus = "corpus.txt",
			    .corpus_lines = 2000, .vocab_size = 400};
	return it_setup(state, &o, DEADLINE_S);
}

/* Submits the tiny job name on evalds with two layers and training_args
 * (JSON text: the whole object), then the overrides (dotted path, JSON
 * text) up to the NULL; returns its id (caller frees). */
#define SUBMIT(f, name, targs, ...)                                                                   \
	submit_spec(&(f)->d, it_job_spec(name, "evalds", "model.num_hidden_layers", "2", "training_args", \
					 targs, __VA_ARGS__))

static char *submit_spec(const bertd *d, char *spec)
{
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static json_t *row_at(json_t *rows, long step)
{
	size_t i;
	json_t *r;
	json_array_foreach(rows, i, r) {
		if (json_integer_value(json_object_get(r, "step")) == step)
			return r;
	}
	return NULL;
}

static double num(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_number(v))
		fail_msg("no number \"%s\" in %s", k, json_dumps(o, JSON_COMPACT));
	return json_number_value(v);
}

static void test_eval_matches_transformers(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "evalds", DEADLINE_S);
	/* logging at 4, 8, 12; eval at 5, 10 and after the last step, 12 */
	char *id = SUBMIT(f, "eval-job",
			  "{\"per_device_train_batch_size\":4,\"max_seq_length\":32,\"max_steps\":12,"
			  "\"logging_steps\":4,\"save_steps\":100,\"learning_rate\":0.01,\"dataloader_num_workers\":1,"
			  "\"seed\":11,\"evaluation_strategy\":\"steps\",\"eval_steps\":5,"
			  "\"per_device_eval_batch_size\":5,\"max_eval_batches\":7}",
			  "mlm", "{\"validation_split_percentage\":10}", "resources.gpus", "2", NULL);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_t *spec = json_object_get(job, "spec");
	assert_string_equal(json_string_value(json_object_get(json_object_get(spec, "training_args"),
								"eval_strategy")), "steps");

	json_t *rows = it_metrics_of(&f->d, id);
	static const long eval_steps[] = {5, 10, 12}, plain[] = {4, 8};
	double best = INFINITY, last = NAN, last_acc = NAN;
	for (size_t i = 0; i < 3; i++) {
		json_t *r = row_at(rows, eval_steps[i]);
		if (!r)
			fail_msg("no metrics row at eval step %ld", eval_steps[i]);
		double l = num(r, "eval_loss"), p = num(r, "perplexity"), a = num(r, "eval_accuracy");
		assert_true(isfinite(l) && l > 0);
		assert_true(fabs(p - exp(l)) <= 1e-12 * p);
		assert_true(a >= 0 && a <= 1);
		double nb = num(r, "eval_batches"), nm = num(r, "eval_masked_tokens");
		assert_true(nb >= 1 && nb <= 7);
		assert_true(nm >= nb);
		print_message("step %ld: eval_loss %.6f perplexity %.3f accuracy %.4f (%g batches, %g masked)\n",
			      eval_steps[i], l, p, a, nb, nm);
		if (l < best)
			best = l;
		last = l;
		last_acc = a;
	}
	/* step 5 only evaluated: no training keys; 12 did both */
	assert_null(json_object_get(row_at(rows, 5), "loss"));
	assert_non_null(json_object_get(row_at(rows, 12), "loss"));
	for (size_t i = 0; i < 2; i++) {
		json_t *r = row_at(rows, plain[i]);
		assert_non_null(r);
		assert_null(json_object_get(r, "eval_loss"));
	}
	/* the eval at 5 ran in the window (4, 8], the last one in (8, 12] */
	assert_true(num(json_object_get(row_at(rows, 8), "phases_ms"), "eval") > 0);
	assert_true(num(json_object_get(row_at(rows, 12), "phases_ms"), "eval") > 0);
	assert_true(num(json_object_get(row_at(rows, 4), "phases_ms"), "eval") == 0);

	/* the job's summary: last and best */
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *j2 = it_get_json(&f->d, path);
	json_t *ev = json_object_get(j2, "eval");
	assert_true(json_is_object(ev));
	assert_int_equal(json_integer_value(json_object_get(json_object_get(ev, "last"), "step")), 12);
	assert_true(num(json_object_get(ev, "last"), "eval_loss") == last);
	assert_true(num(json_object_get(ev, "best"), "eval_loss") == best);
	json_decref(j2);

	/* transformers on the same batches (77: not installed, a skip of this part) */
	char batches[512];
	snprintf(batches, sizeof batches, "%s/jobs/%s/eval_batches.bin", f->d.state_dir, id);
	assert_int_equal(access(batches, R_OK), 0);
	const char *src = getenv("BERTD_SOURCE_ROOT");
	assert_non_null(src);
	const char *model_dir = it_jstr(job, "model_dir");
	if (access("/usr/bin/python3", X_OK) == 0) {
		int rc = it_system("/usr/bin/python3 '%s/tests/integration/check_eval.py' '%s' '%s' %.17g %.17g", src,
			     model_dir, batches, last, last_acc);
		if (rc == 77) {
			fprintf(stderr, "transformers check skipped: not installed\n");
		} else {
			assert_int_equal(rc, 0);
			/* the comparison can fail: 1e-4 off is refused */
			assert_int_equal(it_system("/usr/bin/python3 '%s/tests/integration/check_eval.py' '%s' '%s' %.17g "
					     "%.17g", src, model_dir, batches, last + 1e-4, last_acc), 1);
		}
	} else {
		fprintf(stderr, "transformers check skipped: no /usr/bin/python3\n");
	}
	/* TensorBoard's own reader sees the eval scalars of those rows (tb_read.py) */
	if (system("/usr/bin/python3 -c 'import tensorboard' >/dev/null 2>&1") == 0) {
		char rows_path[128];
		snprintf(rows_path, sizeof rows_path, "%s/rows.json", f->d.root);
		json_t *by_job = json_pack("{s:O}", id, rows);
		assert_int_equal(json_dump_file(by_job, rows_path, 0), 0);
		json_decref(by_job);
		assert_int_equal(it_system("/usr/bin/python3 '%s/tests/integration/tb_read.py' '%s/jobs' '%s'", src,
				     f->d.state_dir, rows_path), 0);
	} else {
		fprintf(stderr, "tensorboard check skipped: not installed\n");
	}
	json_decref(rows);
	json_decref(job);
	free(id);
}

static void test_no_eval_by_default(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "evalds", DEADLINE_S);
	char *id = SUBMIT(f, "plain-job",
			  "{\"per_device_train_batch_size\":4,\"max_seq_length\":32,\"max_steps\":4,"
			  "\"logging_steps\":2,\"dataloader_num_workers\":0}",
			  "resources", "null", NULL);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(job, "spec"), "mlm"),
							      "validation_split_percentage")), 0);
	json_t *rows = it_metrics_of(&f->d, id);
	size_t i;
	json_t *r;
	assert_true(json_array_size(rows) >= 2);
	json_array_foreach(rows, i, r) {
		assert_null(json_object_get(r, "eval_loss"));
	}
	char path[512];
	snprintf(path, sizeof path, "%s/jobs/%s/eval_batches.bin", f->d.state_dir, id);
	assert_int_equal(access(path, F_OK), -1);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *j2 = it_get_json(&f->d, path);
	assert_true(json_is_null(json_object_get(j2, "eval")));
	json_decref(j2);
	json_decref(rows);
	json_decref(job);
	free(id);
}

/* The value of the sample "name{job_id="id"}" in a Prometheus text page;
 * NAN when absent. */
static double prom_sample(const char *page, const char *name, const char *id)
{
	char key[256];
	snprintf(key, sizeof key, "\n%s{job_id=\"%s\"} ", name, id);
	const char *p = strstr(page, key);
	return p ? strtod(p + strlen(key), NULL) : NAN;
}

static void assert_close(double got, double want, const char *what)
{
	if (!(fabs(got - want) <= 1e-12 * fabs(want)))
		fail_msg("%s: /metrics has %.17g, the metrics rows %.17g", what, got, want);
}

static void test_eval_gauges_while_running(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "evalds", DEADLINE_S);
	/* slowed down (a 150 ms data source) so it is still running after some
	 * evaluations; eval_steps is not logging_steps, so the newest row is
	 * mostly a training row without eval keys */
	char *id = SUBMIT(f, "eval-gauges",
			  "{\"per_device_train_batch_size\":4,\"max_seq_length\":32,\"max_steps\":400,"
			  "\"logging_steps\":2,\"save_steps\":1000,\"dataloader_num_workers\":0,"
			  "\"eval_strategy\":\"steps\",\"eval_steps\":5,\"max_eval_batches\":2}",
			  "mlm", "{\"validation_split_percentage\":10}", "resources", "null",
			  "profiler", "{\"simulate_data_delay_ms\":150}", NULL);
	it_wait_step(&f->d, id, 6, DEADLINE_S);
	http_resp r = {0};
	assert_int_equal(http_get(&f->d, "/metrics", &r), 0);
	assert_int_equal(r.status, 200);
	double loss = prom_sample(r.body, "bertd_job_eval_loss", id);
	double ppl = prom_sample(r.body, "bertd_job_eval_perplexity", id);
	double acc = prom_sample(r.body, "bertd_job_eval_accuracy", id);
	double best = prom_sample(r.body, "bertd_job_best_eval_loss", id);
	if (!isfinite(loss) || !isfinite(ppl) || !isfinite(acc) || !isfinite(best))
		fail_msg("no eval gauges for %s in /metrics:\n%s", id, r.body);
	http_resp_free(&r);
	/* rows only grow while it runs: the gauges' evaluation is among them,
	 * and the best is the lowest eval_loss up to it */
	json_t *rows = it_metrics_of(&f->d, id), *row, *hit = NULL;
	size_t i;
	json_array_foreach(rows, i, row) {
		json_t *v = json_object_get(row, "eval_loss");
		if (json_is_number(v) && fabs(json_number_value(v) - loss) <= 1e-12 * fabs(loss)) {
			hit = row;
			break;
		}
	}
	if (!hit)
		fail_msg("/metrics eval_loss %.17g is in no metrics row", loss);
	assert_close(ppl, num(hit, "perplexity"), "perplexity");
	assert_close(acc, num(hit, "eval_accuracy"), "eval_accuracy");
	double low = INFINITY;
	json_array_foreach(rows, i, row) {
		json_t *v = json_object_get(row, "eval_loss");
		if (json_is_number(v) && num(row, "step") <= num(hit, "step") && json_number_value(v) < low)
			low = json_number_value(v);
	}
	assert_close(best, low, "best eval_loss");
	json_decref(rows);
	it_cancel_job(&f->d, id, DEADLINE_S);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_eval_matches_transformers),
		cmocka_unit_test(test_no_eval_by_default),
		cmocka_unit_test(test_eval_gauges_while_running),
	};
	return IT_RUN(tests, setup, it_teardown);
}
