/* Continued pretraining from the HF checkpoints users have: small BERTs made
 * by transformers' save_pretrained (hf_init_dirs.py, random init, dropout 0,
 * the bert-base-uncased vocab of tests/data) are continued by real jobs.
 *   - MLM only (mlm.nsp false) from a BertForPreTraining and from a
 *     BertForMaskedLM carrying NSP weights, each as model.safetensors and as
 *     pytorch_model.bin, and from sharded safetensors and sharded
 *     pytorch_model.bin: every job completes;
 *     the loss of step 1 (logging_steps 1) equals transformers' loss of the
 *     init_from model on the batch of step 1 (`bertd-loader --write-batch 0`)
 *     within 1e-6, and the export loads with BertForMaskedLM.from_pretrained
 *     with no missing weights; the same check with the loss 1e-5 off fails,
 *     so it can;
 *   - mlm.nsp true from a BertForMaskedLM without NSP head: one step at a
 *     learning rate too small to change an fp32 weight; the export holds the
 *     checkpoint's tensors unchanged and a pooler / NSP head as transformers
 *     initialises them, and the step-1 loss (masked LM + NSP) equals
 *     BertForPreTraining's on that export;
 *   - refusals: a TensorFlow-only directory is 422 at submit naming the
 *     conversion; a shard of an index that is a symbolic link leading out of
 *     the data root is 403; a pytorch_model.bin whose pickle calls os.system fails the
 *     job without a restart, naming the file and never its bytes.
 * Skips (77) without /usr/bin/python3 with torch and transformers. */
#include <libgen.h>
#include <math.h>
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

#define DEADLINE_S 400

typedef it_fx fx;

static const char *g_src;

static int setup(void **state)
{
	const char *extra[] = {"--stop-timeout-s", "60", NULL};
	it_daemon_opts o = {.cpu_slots = "2", .extra = extra};
	fx *f = it_daemon_start(&o, DEADLINE_S);
	if (!f)
		return -1;
	it_make_corpus(f->data, "corpus.txt", 400);
	return it_setup_end(
		state, f,
		it_system("cp '%s/tests/data/bert-base-uncased-vocab.txt' '%s/vocab.txt'", g_src, f->data) == 0 &&
			it_system("/usr/bin/python3 '%s/tests/integration/hf_init_dirs.py' '%s/hf' '%s/vocab.txt' >/dev/null",
				  g_src, f->data, f->data) == 0 &&
			!it_add_dataset(&f->d, "{\"name\":\"hfds\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"}}"));
}

/* The job spec of these tests: dropout 0 (the checkpoints' own), B 4, T 32,
 * one rank, the worker building its batches. */
static char *submit(fx *f, const char *dir, bool nsp, int steps, const char *lr)
{
	char init[300], targs[400];
	snprintf(init, sizeof init, "\"hf/%s\"", dir);
	snprintf(targs, sizeof targs,
		 "{\"per_device_train_batch_size\":4,\"max_seq_length\":32,\"max_steps\":%d,\"logging_steps\":1,"
		 "\"save_steps\":100,\"learning_rate\":%s,\"dataloader_num_workers\":0,\"seed\":7}",
		 steps, lr);
	char *spec = it_job_spec(NULL, "hfds", "init_from", init,
				 "model", "{\"hidden_dropout_prob\":0,\"attention_probs_dropout_prob\":0}",
				 "training_args", targs, "mlm", nsp ? "{\"nsp\":true}" : "{\"nsp\":false}",
				 "resources", "null", NULL);
	char *id = it_submit(&f->d, spec);
	free(spec);
	return id;
}

static double step1_loss(fx *f, const char *id)
{
	json_t *rows = it_metrics_of(&f->d, id);
	size_t i;
	json_t *r;
	double loss = NAN;
	json_array_foreach(rows, i, r) {
		if (json_integer_value(json_object_get(r, "step")) == 1)
			loss = json_number_value(json_object_get(r, "loss"));
	}
	json_decref(rows);
	assert_true(isfinite(loss));
	return loss;
}

/* The batch of step 1 (global batch 0) of job id into out. */
static void write_batch(fx *f, const char *id, char *out, size_t cap)
{
	char bin[512];
	snprintf(bin, sizeof bin, "%s", getenv("BERTD_BIN"));
	snprintf(out, cap, "%s/batch-%s.bin", f->d.root, id);
	assert_int_equal(it_system("'%s/bertd-loader' --job '%s/jobs/%s/job.json' --write-batch 0 --out '%s'",
				   dirname(bin), f->d.state_dir, id, out), 0);
}

static void test_mlm_only_from_nsp_checkpoints(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "hfds", DEADLINE_S);
	static const char *const dirs[] = {"pt_st", "pt_bin", "mlmnsp_st", "mlmnsp_bin", "sharded",
					   "sharded_bin"};
	enum { N = sizeof dirs / sizeof dirs[0] };
	char *ids[N];
	for (int i = 0; i < N; i++)
		ids[i] = submit(f, dirs[i], false, 3, "0.001");
	for (int i = 0; i < N; i++) {
		json_t *job = it_wait_job(&f->d, ids[i], "completed|failed|canceled", DEADLINE_S);
		it_assert_completed(&f->d, job);
		double loss = step1_loss(f, ids[i]);
		char batch[600];
		write_batch(f, ids[i], batch, sizeof batch);
		print_message("%s: step-1 loss %.9f\n", dirs[i], loss);
		const char *export = it_jstr(job, "model_dir");
		assert_int_equal(it_system("/usr/bin/python3 '%s/tests/integration/check_step1.py' '%s/hf/%s' '%s' "
					   "%.17g '%s'", g_src, f->data, dirs[i], batch, loss, export), 0);
		if (i == 0) /* 1e-5 off is refused: the comparison can fail */
			assert_int_equal(it_system("/usr/bin/python3 '%s/tests/integration/check_step1.py' "
						   "'%s/hf/%s' '%s' %.17g '%s'", g_src, f->data, dirs[i], batch,
						   loss + 1e-5, export), 1);
		json_decref(job);
		free(ids[i]);
	}
}

static void test_nsp_from_mlm_checkpoint(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "hfds", DEADLINE_S);
	char *id = submit(f, "mlm_st", true, 1, "1e-12");
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	double loss = step1_loss(f, id);
	char batch[600];
	write_batch(f, id, batch, sizeof batch);
	const char *export = it_jstr(job, "model_dir");
	assert_int_equal(it_system("/usr/bin/python3 '%s/tests/integration/check_step1.py' '%s' '%s' %.17g '%s' "
				   "--nsp --same-encoder '%s/hf/mlm_st'", g_src, export, batch, loss, export, f->data),
			 0);
	json_decref(job);
	free(id);
}

/* A job of only hfds, init_from (JSON text) and no NSP; caller frees. */
static char *bare_spec(const char *init_from)
{
	return it_job_spec(NULL, "hfds", "init_from", init_from, "mlm", "{\"nsp\":false}", "model", "null",
			   "training_args", "null", "resources", "null", NULL);
}

static void test_refusals(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "hfds", DEADLINE_S);
	http_resp r;
	char *spec = bare_spec("\"hf/tf_only\"");
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	assert_int_equal(r.status, 422);
	assert_string_equal(it_jstr(r.json, "field"), "init_from");
	assert_non_null(strstr(it_jstr(r.json, "detail"), "from_tf=True"));
	http_resp_free(&r);

	/* a shard the index names that is a link leading out of the data root */
	assert_int_equal(it_system("mkdir -p '%s/hf/linkshard' && cp '%s/hf/sharded/config.json' "
				   "'%s/hf/sharded/model.safetensors.index.json' '%s/hf/linkshard/' && "
				   "ln -s /etc/hostname '%s/hf/linkshard/model-00002-of-00002.safetensors' && "
				   "cp '%s/hf/sharded/model-00001-of-00002.safetensors' '%s/hf/linkshard/'",
				   f->data, f->data, f->data, f->data, f->data, f->data, f->data),
			 0);
	spec = bare_spec("\"hf/linkshard\"");
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	assert_int_equal(r.status, 403);
	assert_string_equal(it_jstr(r.json, "field"), "init_from");
	print_message("linkshard: %s\n", it_jstr(r.json, "detail"));
	assert_non_null(strstr(it_jstr(r.json, "detail"), "shard"));
	http_resp_free(&r);

	char *id = submit(f, "evil_bin", false, 3, "0.001");
	json_t *job = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "failed");
	const char *why = it_jstr(job, "failure_reason");
	print_message("evil_bin: %s\n", why);
	assert_non_null(strstr(why, "pytorch_model.bin"));
	assert_non_null(strstr(why, "refused"));
	assert_null(strstr(why, "system"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	json_decref(job);
	free(id);
}

int main(void)
{
	g_src = getenv("BERTD_SOURCE_ROOT");
	if (!g_src || access("/usr/bin/python3", X_OK) != 0 ||
	    system("/usr/bin/python3 -c 'import torch, transformers' >/dev/null 2>&1") != 0) {
		fprintf(stderr, "skip: /usr/bin/python3 with torch and transformers needed\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mlm_only_from_nsp_checkpoints),
		cmocka_unit_test(test_nsp_from_mlm_checkpoint),
		cmocka_unit_test(test_refusals),
	};
	return IT_RUN(tests, setup, it_teardown);
}
