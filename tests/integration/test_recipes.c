/* Recipes and schedules end to end, on the CPU backend, with tiny models:
 *   - a job on the polynomial schedule (power 0.5, NVIDIA's LAMB recipe)
 *     logs, every step, the learning rate transformers' get_scheduler gives
 *     for the same training_args (check_logged_lr.py); a kwarg the schedule
 *     does not take is a 422 naming it;
 *   - two-phase training: phase 2 continues phase 1's checkpoint with
 *     init_from_restore "all" at another max_seq_length, batch and
 *     accumulation; its first update, saved as a checkpoint, is the AdamW
 *     (and, from the same checkpoint, the LAMB) update an independent numpy
 *     reference computes from phase 1's moments and update count
 *     (check_two_phase.py), and another beta is a 422;
 *   - every job JSON of docs/recipes/ (docs/recipes.md), scaled down by
 *     overriding keys (the rest of the file as it is), runs to completed on
 *     a real daemon: BERT-base two-phase (Devlin et al. and NVIDIA LAMB),
 *     RoBERTa-style, and continued pretraining from a Hub-style
 *     BertForMaskedLM directory that transformers writes (make_hub_model.py;
 *     that recipe is skipped without transformers).
 * The Python references exit 77 when their packages are missing: that part
 * is then reported skipped, never passed. Waiting is polling the API with a
 * deadline, never timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300

typedef it_fx fx;

static int setup(void **state)
{
	it_daemon_opts o = {.cpu_slots = "1", .dataset = "shakes", .corpus = "shakes.txt", .corpus_lines = 3000,
			    .vocab_size = 400};
	return it_setup(state, &o, DEADLINE_S);
}

static const char *src_root(void)
{
	const char *s = getenv("BERTD_SOURCE_ROOT");
	if (!s)
		fail_msg("BERTD_SOURCE_ROOT is not set");
	return s;
}

/* Runs a Python reference: 0 = it passed, 77 = its packages are missing
 * (reported as a skip of what), anything else fails the test. */
static bool python_check(int rc, const char *what)
{
	if (rc == 77) {
		fprintf(stderr, "%s skipped: Python packages not installed\n", what);
		return false;
	}
	if (rc != 0)
		fail_msg("%s failed (exit %d)", what, rc);
	return true;
}

/* Submits spec (JSON text), waits for the end and asserts completed. */
static char *run_job(const bertd *d, const char *spec)
{
	char *id = it_submit(d, spec);
	json_t *j = it_wait_completed(d, id, DEADLINE_S);
	json_decref(j);
	return id;
}

static char *run_json(const bertd *d, json_t *spec)
{
	char *text = json_dumps(spec, JSON_COMPACT);
	assert_non_null(text);
	fprintf(stderr, "submit %s\n", text);
	char *id = run_job(d, text);
	free(text);
	return id;
}

/* The directory of job's checkpoint at step: beside its export (model_dir). */
static void ckpt_dir(const bertd *d, const char *id, int step, char *out, size_t cap)
{
	char path[96];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *job = it_get_json(d, path);
	const char *ex = it_jstr(job, "model_dir");
	size_t n = strlen(ex);
	assert_true(n > 7 && strcmp(ex + n - 7, "/export") == 0);
	snprintf(out, cap, "%.*s/checkpoints/ckpt-%d", (int)(n - 7), ex, step);
	json_decref(job);
}

static void test_logged_lr_matches_transformers(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *spec = it_job_spec("poly", "shakes", "training_args.max_steps", "12", "training_args.logging_steps", "1",
				 "training_args.save_steps", "12", "training_args.dataloader_num_workers", "1",
				 "training_args.warmup_steps", "3", "training_args.lr_scheduler_type", "\"polynomial\"",
				 "training_args.lr_scheduler_kwargs", "{\"power\":0.5,\"lr_end\":0.0001}", NULL);
	char *id = run_job(&f->d, spec);
	free(spec);
	char path[96], file[] = "/tmp/bertd-lr-XXXXXX";
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *job = it_get_json(&f->d, path);
	json_t *doc = json_pack("{s:O, s:o}", "spec", json_object_get(job, "spec"), "metrics",
				it_metrics_of(&f->d, id));
	assert_int_equal(json_array_size(json_object_get(doc, "metrics")), 12);
	int fd = mkstemp(file);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(json_dump_file(doc, file, 0), 0);
	python_check(it_system("/usr/bin/python3 '%s/tests/integration/check_logged_lr.py' '%s'", src_root(), file),
		     "transformers' get_scheduler check of the logged learning_rate");
	unlink(file);
	json_decref(doc);
	json_decref(job);
	free(id);

	/* a kwarg the schedule does not take is a 422 naming it */
	http_resp r;
	spec = it_job_spec(NULL, "shakes", "model", "null", "resources", "null", "training_args",
			   "{\"lr_scheduler_type\":\"polynomial\",\"lr_scheduler_kwargs\":{\"powr\":0.5}}", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status != 422)
		fail_msg("unknown kwarg: expected 422, got %ld: %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "field"), "training_args.lr_scheduler_kwargs.powr");
	fprintf(stderr, "422 %s: %s\n", it_jstr(r.json, "field"), it_jstr(r.json, "detail"));
	http_resp_free(&r);
}

/* Phase 1 at max_seq_length 32, batch 8; phase 2 from its step-10
 * checkpoint at 64, batch 4 x accumulation 2, another learning rate, a
 * checkpoint after its first update. */
static void test_two_phase_keeps_moments(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *spec = it_job_spec("phase1", "shakes", "training_args.max_steps", "10",
				 "training_args.dataloader_num_workers", "1", "training_args.weight_decay", "0.01", NULL);
	char *a = run_job(&f->d, spec);
	free(spec);
	char name[32], targs[600], init[200], c1[1200], c2[1200];
	snprintf(init, sizeof init, "{\"job\":\"%s\",\"checkpoint\":10}", a);
	ckpt_dir(&f->d, a, 10, c1, sizeof c1);
	/* AdamW on, then LAMB from the same moments (they mean the same) */
	static const char *const optims[] = {"adamw", "lamb"};
	for (int k = 0; k < 2; k++) {
		snprintf(name, sizeof name, "phase2-%s", optims[k]);
		snprintf(targs, sizeof targs,
			 "{\"max_seq_length\":64,\"per_device_train_batch_size\":4,\"gradient_accumulation_steps\":2,"
			 "\"max_steps\":12,\"logging_steps\":1,\"save_steps\":1,\"dataloader_num_workers\":1,\"seed\":7,"
			 "\"learning_rate\":0.005,\"lr_scheduler_type\":\"constant\",\"weight_decay\":0.0,"
			 "\"optim\":\"%s\",\"adam_epsilon\":1e-6}",
			 optims[k]);
		spec = it_job_spec(name, "shakes", "training_args", targs, "init_from", init, "init_from_restore",
				   "\"all\"", NULL);
		char *b = run_job(&f->d, spec);
		free(spec);
		json_t *mb = it_metrics_of(&f->d, b);
		assert_int_equal(json_array_size(mb), 2); /* steps 11 and 12: it went on from 10 */
		assert_int_equal(json_integer_value(json_object_get(json_array_get(mb, 0), "step")), 11);
		json_decref(mb);
		ckpt_dir(&f->d, b, 11, c2, sizeof c2);
		python_check(it_system("/usr/bin/python3 '%s/tests/integration/check_two_phase.py' '%s' '%s' 0.005 0.9 "
				       "0.999 1e-6 %s",
				       src_root(), c1, c2, optims[k]),
			     "the numpy reference of phase 2's first update");
		free(b);
	}

	/* the moments' averaging constants must stay: another beta2 is a 422 */
	spec = it_job_spec(NULL, "shakes", "training_args", "{\"max_seq_length\":64,\"max_steps\":12,\"adam_beta2\":0.98}",
			   "init_from", init, "init_from_restore", "\"all\"", NULL);
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status != 422)
		fail_msg("another adam_beta2: expected 422, got %ld: %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "field"), "training_args.adam_beta2");
	http_resp_free(&r);
	free(a);
}

/* docs/recipes/<name>, with over merged into it (json_object_update_recursive). */
static json_t *recipe(const char *name, const char *over)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/docs/recipes/%s", src_root(), name);
	json_error_t jerr;
	json_t *r = json_load_file(path, 0, &jerr);
	if (!r)
		fail_msg("%s: %s (line %d)", path, jerr.text, jerr.line);
	json_t *o = json_loads(over, 0, &jerr);
	if (!o)
		fail_msg("override of %s: %s", name, jerr.text);
	assert_int_equal(json_object_update_recursive(r, o), 0);
	json_decref(o);
	return r;
}

/* What scales a recipe down: the test corpus, a tiny model, few steps, one
 * CPU slot. SCALE(seq, steps, warmup-key) */
#define TINY_MODEL_OVER \
	"\"model\":{\"preset\":\"bert-tiny\",\"hidden_size\":32,\"num_hidden_layers\":1,\"num_attention_heads\":2," \
	"\"intermediate_size\":64,\"max_position_embeddings\":64}"
#define SCALE(seq, batch, accum, steps, log) \
	"\"max_seq_length\":" seq ",\"per_device_train_batch_size\":" batch ",\"gradient_accumulation_steps\":" \
	accum ",\"max_steps\":" steps ",\"logging_steps\":" log ",\"save_steps\":" log \
	",\"dataloader_num_workers\":1"

static void run_two_phase(const bertd *d, const char *p1, const char *p2, const char *warm1, const char *warm2)
{
	char over[2048];
	snprintf(over, sizeof over,
		 "{\"dataset\":\"shakes\"," TINY_MODEL_OVER ",\"training_args\":{" SCALE("32", "4", "2", "6", "3")
		 "%s},\"resources\":{\"gpus\":1}}", warm1);
	json_t *r1 = recipe(p1, over);
	char *a = run_json(d, r1);
	snprintf(over, sizeof over,
		 "{\"dataset\":\"shakes\"," TINY_MODEL_OVER ",\"init_from\":{\"job\":\"%s\"},"
		 "\"training_args\":{" SCALE("64", "2", "2", "9", "3") "%s},\"resources\":{\"gpus\":1}}",
		 a, warm2);
	json_t *r2 = recipe(p2, over);
	char *b = run_json(d, r2);
	json_t *mb = it_metrics_of(d, b);
	/* phase 2 went on from phase 1's last step */
	assert_int_equal(json_integer_value(json_object_get(json_array_get(mb, 0), "step")), 9);
	assert_int_equal(json_array_size(mb), 1);
	json_decref(mb);
	json_decref(r1);
	json_decref(r2);
	free(a);
	free(b);
}

static void test_recipe_bert_base_two_phase(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	run_two_phase(&f->d, "bert-base-phase1.json", "bert-base-phase2.json", ",\"warmup_steps\":2",
		      ",\"warmup_steps\":2");
}

static void test_recipe_nvidia_lamb_two_phase(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	/* phase 1 keeps its warmup_ratio; phase 2's warmup is phase 1's steps */
	run_two_phase(&f->d, "nvidia-lamb-phase1.json", "nvidia-lamb-phase2.json", "", ",\"warmup_steps\":6");
}

static void test_recipe_roberta_style(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	json_t *r = recipe("roberta-style.json", "{\"dataset\":\"shakes\"," TINY_MODEL_OVER ",\"training_args\":{"
			   SCALE("64", "4", "4", "6", "3") ",\"warmup_steps\":2},\"resources\":{\"gpus\":1}}");
	char *id = run_json(&f->d, r);
	json_decref(r);
	free(id);
}

static void test_recipe_domain_from_hub(void **state)
{
	fx *f = *state;
	char dir[400], vocab[1024];
	snprintf(dir, sizeof dir, "%s/hub-tiny", f->data);
	snprintf(vocab, sizeof vocab, "%s/tests/data/bert-base-uncased-vocab.txt", src_root());
	if (!python_check(it_system("/usr/bin/python3 '%s/tests/integration/make_hub_model.py' '%s' '%s'", src_root(),
				    dir, vocab),
			  "the Hub recipe (a BertForMaskedLM directory made by transformers)"))
		skip();
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	/* the domain corpus with the checkpoint's own vocab */
	assert_int_equal(it_add_dataset(&f->d, "{\"name\":\"hubds\",\"source\":\"shakes.txt\","
					       "\"vocab\":{\"file\":\"hub-tiny/vocab.txt\"}}"),
			 0);
	it_wait_dataset_ready(&f->d, "hubds", DEADLINE_S);
	json_t *r = recipe("domain-from-hub.json",
			   "{\"dataset\":\"hubds\",\"init_from\":\"hub-tiny\",\"training_args\":{"
			   SCALE("32", "4", "2", "6", "3") ",\"eval_steps\":3,\"per_device_eval_batch_size\":4,"
			   "\"max_eval_batches\":2},\"resources\":{\"gpus\":1}}");
	char *id = run_json(&f->d, r);
	char path[1200];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *job = it_get_json(&f->d, path);
	/* the model trained is the checkpoint's (hidden 32, its vocab), not the
	 * recipe's default bert-base */
	snprintf(path, sizeof path, "%s/config.json", it_jstr(job, "model_dir"));
	json_t *cfg = json_load_file(path, 0, NULL);
	assert_non_null(cfg);
	assert_int_equal(json_integer_value(json_object_get(cfg, "hidden_size")), 32);
	assert_int_equal(json_integer_value(json_object_get(cfg, "vocab_size")), 30522);
	json_decref(cfg);
	json_decref(job);
	json_decref(r);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_logged_lr_matches_transformers),
		cmocka_unit_test(test_two_phase_keeps_moments),
		cmocka_unit_test(test_recipe_bert_base_two_phase),
		cmocka_unit_test(test_recipe_nvidia_lamb_two_phase),
		cmocka_unit_test(test_recipe_roberta_style),
		cmocka_unit_test(test_recipe_domain_from_hub),
	};
	return IT_RUN(tests, setup, it_teardown);
}
