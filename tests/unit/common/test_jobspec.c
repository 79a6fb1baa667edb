/* jobspec: the first plan's example, defaults, presets, every class of refusal
 * (status and field), idempotence, the typed view, hostile input, and that
 * docs/jobspec.md documents exactly the keys the code produces. Expected
 * values come from the brief and HF (BertConfig, TrainingArguments,
 * DataCollatorForLanguageModeling, Turc et al. miniatures), written out
 * here rather than read from the code's tables. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <math.h>
#include <cmocka.h>

#include "common/jobspec.h"

static json_t *parse(const char *text)
{
	json_error_t e;
	json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
	if (!j)
		fail_msg("test JSON does not parse: %s: %s", e.text, text);
	return j;
}

static json_t *normalize_ok(const char *text)
{
	json_t *in = parse(text), *out = NULL;
	jobspec_error err = {0};
	int rc = jobspec_normalize(in, &out, &err);
	if (rc != 0)
		fail_msg("refused (%d %s: %s): %s", err.status, err.field, err.detail, text);
	json_decref(in);
	return out;
}

static json_t *get(json_t *o, const char *sec, const char *key)
{
	json_t *s = sec ? json_object_get(o, sec) : o;
	assert_non_null(s);
	json_t *v = json_object_get(s, key);
	if (!v)
		fail_msg("missing %s.%s", sec ? sec : "", key);
	return v;
}

static long long geti(json_t *o, const char *sec, const char *key)
{
	json_t *v = get(o, sec, key);
	assert_true(json_is_integer(v));
	return json_integer_value(v);
}

static double getd(json_t *o, const char *sec, const char *key)
{
	json_t *v = get(o, sec, key);
	assert_true(json_is_real(v)); /* numbers are always reals once effective */
	return json_real_value(v);
}

static const char *gets_(json_t *o, const char *sec, const char *key)
{
	json_t *v = get(o, sec, key);
	assert_true(json_is_string(v));
	return json_string_value(v);
}

/* The exact example job spec of the project's first plan, minus its "...": "BertConfig
 * names" placeholder (which test_design_example checks is refused). */
static const char *design_example =
	"{ \"name\": \"pubmed-base\",\n"
	"  \"dataset\": \"pubmed\",\n"
	"  \"model\": {\"preset\": \"bert-base\", \"num_hidden_layers\": 12},\n"
	"  \"init_from\": null,\n"
	"  \"training_args\": {\"per_device_train_batch_size\": 64, \"gradient_accumulation_steps\": 1,\n"
	"     \"learning_rate\": 1e-4, \"lr_scheduler_type\": \"linear\", \"warmup_steps\": 10000,\n"
	"     \"weight_decay\": 0.01, \"max_steps\": 100000, \"max_seq_length\": 128,\n"
	"     \"optim\": \"adamw\", \"bf16\": true, \"seed\": 42, \"logging_steps\": 50,\n"
	"     \"save_steps\": 1000, \"save_total_limit\": 3,\n"
	"     \"dataloader_num_workers\": 8, \"dataloader_pin_memory\": true},\n"
	"  \"mlm\": {\"mlm_probability\": 0.15, \"mask_replace_prob\": 0.8,\n"
	"          \"random_replace_prob\": 0.1, \"whole_word_mask\": false, \"nsp\": false},\n"
	"  \"resources\": {\"gpus\": 8},\n"
	"  \"stopping_condition\": {\"max_runtime_seconds\": null},\n"
	"  \"retry_policy\": {\"max_restarts\": 3} }";

static void expect_bad_json(json_t *in, int status, const char *field)
{
	json_t *sentinel = json_string("untouched"), *out = sentinel;
	jobspec_error err;
	memset(&err, 0x55, sizeof err); /* every byte must be written where it is read */
	int rc = jobspec_normalize(in, &out, &err);
	char *text = in ? json_dumps(in, JSON_ENCODE_ANY) : NULL;
	if (rc != -EINVAL || err.status != status || strcmp(err.field, field) != 0)
		fail_msg("spec %.200s: want %d '%s', got rc %d status %d '%s' (%s)",
			 text ? text : "NULL", status, field, rc, rc ? err.status : 0,
			 rc ? err.field : "", rc ? err.detail : "accepted");
	assert_ptr_equal(out, sentinel);
	assert_true(strlen(err.detail) > 0 && strlen(err.detail) < sizeof err.detail);
	/* Both strings go into a problem+json body: they must be valid UTF-8. */
	json_t *f = json_string(err.field), *d = json_string(err.detail);
	assert_non_null(f);
	assert_non_null(d);
	json_decref(f);
	json_decref(d);
	free(text);
	json_decref(sentinel);
}

static void expect_bad(const char *text, int status, const char *field)
{
	json_t *in = parse(text);
	expect_bad_json(in, status, field);
	json_decref(in);
}

static void test_design_example(void **state)
{
	(void)state;
	json_t *o = normalize_ok(design_example);
	assert_string_equal(gets_(o, NULL, "name"), "pubmed-base");
	assert_string_equal(gets_(o, NULL, "dataset"), "pubmed");
	assert_string_equal(gets_(o, "model", "preset"), "bert-base");
	assert_int_equal(geti(o, "model", "num_hidden_layers"), 12);
	assert_int_equal(geti(o, "model", "hidden_size"), 768);
	assert_true(json_is_null(get(o, NULL, "init_from")));
	assert_int_equal(geti(o, "training_args", "per_device_train_batch_size"), 64);
	assert_int_equal(geti(o, "training_args", "gradient_accumulation_steps"), 1);
	assert_true(getd(o, "training_args", "learning_rate") == 1e-4);
	assert_string_equal(gets_(o, "training_args", "lr_scheduler_type"), "linear");
	assert_int_equal(geti(o, "training_args", "warmup_steps"), 10000);
	assert_true(getd(o, "training_args", "weight_decay") == 0.01);
	assert_int_equal(geti(o, "training_args", "max_steps"), 100000);
	assert_int_equal(geti(o, "training_args", "max_seq_length"), 128);
	assert_string_equal(gets_(o, "training_args", "optim"), "adamw");
	assert_true(json_is_true(get(o, "training_args", "bf16")));
	assert_true(json_is_null(get(o, "training_args", "fp16")));
	assert_int_equal(geti(o, "training_args", "seed"), 42);
	assert_int_equal(geti(o, "training_args", "logging_steps"), 50);
	assert_int_equal(geti(o, "training_args", "save_steps"), 1000);
	assert_int_equal(geti(o, "training_args", "save_total_limit"), 3);
	assert_int_equal(geti(o, "training_args", "dataloader_num_workers"), 8);
	assert_true(json_is_true(get(o, "training_args", "dataloader_pin_memory")));
	assert_true(getd(o, "mlm", "mlm_probability") == 0.15);
	assert_true(getd(o, "mlm", "mask_replace_prob") == 0.8);
	assert_true(getd(o, "mlm", "random_replace_prob") == 0.1);
	assert_true(json_is_false(get(o, "mlm", "whole_word_mask")));
	assert_true(json_is_false(get(o, "mlm", "nsp")));
	assert_int_equal(geti(o, "mlm", "max_predictions_per_seq"), 20);
	assert_int_equal(geti(o, "resources", "gpus"), 8);
	assert_true(json_is_null(get(o, "stopping_condition", "max_runtime_seconds")));
	assert_int_equal(geti(o, "retry_policy", "max_restarts"), 3);
	json_decref(o);

	/* The first plan's placeholder key is not a BertConfig name. */
	json_t *in = parse(design_example);
	json_object_set_new(json_object_get(in, "model"), "...", json_string("BertConfig names"));
	expect_bad_json(in, 422, "model....");
	json_decref(in);
}

static void expect_keys(json_t *o, const char *const *keys, size_t n)
{
	assert_int_equal(json_object_size(o), n);
	size_t i = 0;
	const char *key;
	json_t *v;
	json_object_foreach(o, key, v) {
		(void)v;
		assert_string_equal(key, keys[i]);
		i++;
	}
}

static void test_minimal_gets_every_default(void **state)
{
	(void)state;
	json_t *o = normalize_ok("{\"dataset\": \"wiki.en-2\"}");
	static const char *const top[] = {"name", "dataset", "model", "init_from", "init_from_restore", "priority",
		"preemptible", "tags", "notes", "training_args", "mlm", "resources", "stopping_condition",
		"retry_policy", "profiler"};
	expect_keys(o, top, sizeof top / sizeof top[0]);
	static const char *const model[] = {"preset", "vocab_size", "hidden_size",
		"num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
		"hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
		"type_vocab_size", "initializer_range", "layer_norm_eps"};
	expect_keys(json_object_get(o, "model"), model, sizeof model / sizeof model[0]);
	static const char *const ta[] = {"per_device_train_batch_size",
		"gradient_accumulation_steps", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs",
		"warmup_steps",
		"warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
		"max_grad_norm", "num_train_epochs", "max_steps", "max_seq_length", "optim", "bf16", "fp16", "seed",
		"logging_steps", "save_steps", "save_total_limit", "dataloader_num_workers",
		"dataloader_pin_memory", "ddp_reduce_dtype", "eval_strategy", "eval_steps",
		"per_device_eval_batch_size", "max_eval_batches", "metric_for_best_model", "greater_is_better",
		"load_best_model_at_end"};
	expect_keys(json_object_get(o, "training_args"), ta, sizeof ta / sizeof ta[0]);
	static const char *const mlm[] = {"mlm_probability", "mask_replace_prob",
		"random_replace_prob", "whole_word_mask", "nsp", "max_predictions_per_seq",
		"short_seq_prob", "validation_split_percentage", "drop_long_sentences"};
	expect_keys(json_object_get(o, "mlm"), mlm, sizeof mlm / sizeof mlm[0]);
	assert_true(json_is_false(get(o, "mlm", "drop_long_sentences"))); /* nothing dropped */

	assert_string_equal(gets_(o, NULL, "name"), "wiki.en-2"); /* from the dataset */
	assert_true(json_is_null(get(o, NULL, "init_from")));
	assert_int_equal(geti(o, NULL, "priority"), 0);
	assert_true(json_is_false(get(o, NULL, "preemptible"))); /* opt-in */
	assert_int_equal(json_array_size(get(o, NULL, "tags")), 0);
	assert_true(json_is_array(get(o, NULL, "tags")));
	assert_true(json_is_null(get(o, NULL, "notes")));
	/* bert-base, BertConfig defaults */
	assert_string_equal(gets_(o, "model", "preset"), "bert-base");
	assert_true(json_is_null(get(o, "model", "vocab_size")));
	assert_int_equal(geti(o, "model", "hidden_size"), 768);
	assert_int_equal(geti(o, "model", "num_hidden_layers"), 12);
	assert_int_equal(geti(o, "model", "num_attention_heads"), 12);
	assert_int_equal(geti(o, "model", "intermediate_size"), 3072);
	assert_string_equal(gets_(o, "model", "hidden_act"), "gelu");
	assert_true(getd(o, "model", "hidden_dropout_prob") == 0.1);
	assert_true(getd(o, "model", "attention_probs_dropout_prob") == 0.1);
	assert_int_equal(geti(o, "model", "max_position_embeddings"), 512);
	assert_int_equal(geti(o, "model", "type_vocab_size"), 2);
	assert_true(getd(o, "model", "initializer_range") == 0.02);
	assert_true(getd(o, "model", "layer_norm_eps") == 1e-12);
	/* TrainingArguments defaults, and bertd's where HF has none */
	assert_int_equal(geti(o, "training_args", "per_device_train_batch_size"), 8);
	assert_int_equal(geti(o, "training_args", "gradient_accumulation_steps"), 1);
	assert_true(getd(o, "training_args", "learning_rate") == 5e-5);
	assert_string_equal(gets_(o, "training_args", "lr_scheduler_type"), "linear");
	assert_int_equal(geti(o, "training_args", "warmup_steps"), 0);
	assert_true(getd(o, "training_args", "warmup_ratio") == 0.0);
	assert_true(getd(o, "training_args", "weight_decay") == 0.0);
	assert_true(getd(o, "training_args", "adam_beta1") == 0.9);
	assert_true(getd(o, "training_args", "adam_beta2") == 0.999);
	assert_true(getd(o, "training_args", "adam_epsilon") == 1e-8);
	assert_true(getd(o, "training_args", "max_grad_norm") == 1.0);
	/* bertd's own: HF trains 3 epochs (max_steps -1, num_train_epochs 3.0) */
	assert_true(json_is_null(get(o, "training_args", "num_train_epochs")));
	assert_int_equal(geti(o, "training_args", "max_steps"), 1000);
	assert_int_equal(geti(o, "training_args", "max_seq_length"), 128);
	assert_string_equal(gets_(o, "training_args", "optim"), "adamw");
	assert_true(json_is_null(get(o, "training_args", "bf16")));
	assert_true(json_is_null(get(o, "training_args", "fp16")));
	assert_int_equal(geti(o, "training_args", "seed"), 42);
	assert_int_equal(geti(o, "training_args", "logging_steps"), 50);
	assert_int_equal(geti(o, "training_args", "save_steps"), 500);
	assert_int_equal(geti(o, "training_args", "save_total_limit"), 3);
	assert_int_equal(geti(o, "training_args", "dataloader_num_workers"), 2);
	assert_true(json_is_true(get(o, "training_args", "dataloader_pin_memory")));
	assert_string_equal(gets_(o, "training_args", "ddp_reduce_dtype"), "fp32");
	/* DataCollatorForLanguageModeling defaults, BERT's data recipe */
	assert_true(getd(o, "mlm", "mlm_probability") == 0.15);
	assert_true(getd(o, "mlm", "mask_replace_prob") == 0.8);
	assert_true(getd(o, "mlm", "random_replace_prob") == 0.1);
	assert_true(json_is_false(get(o, "mlm", "whole_word_mask")));
	assert_true(json_is_false(get(o, "mlm", "nsp")));
	assert_int_equal(geti(o, "mlm", "max_predictions_per_seq"), 20);
	assert_true(getd(o, "mlm", "short_seq_prob") == 0.1);
	assert_int_equal(geti(o, "resources", "gpus"), 1);
	assert_string_equal(gets_(o, "resources", "device"), "auto");
	assert_true(json_is_null(get(o, "stopping_condition", "max_runtime_seconds")));
	assert_int_equal(geti(o, "retry_policy", "max_restarts"), 3);
	json_t *prof = get(o, NULL, "profiler");
	assert_int_equal(json_object_size(prof), 2);
	assert_true(json_is_object(get(o, "profiler", "rules")));
	assert_int_equal(json_object_size(get(o, "profiler", "rules")), 0);
	assert_int_equal(json_integer_value(get(o, "profiler", "simulate_data_delay_ms")), 0);
	json_decref(o);

	/* null means "the default" for every key, sections included */
	o = normalize_ok("{\"dataset\": \"d\", \"name\": null, \"model\": null, \"priority\": null,"
			 " \"training_args\": {\"learning_rate\": null, \"bf16\": null},"
			 " \"mlm\": {\"max_predictions_per_seq\": null}, \"profiler\": null}");
	json_t *ref = normalize_ok("{\"dataset\": \"d\"}");
	assert_true(json_equal(o, ref));
	json_decref(o);
	json_decref(ref);
}

static void test_presets_and_overrides(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		int layers, hidden, heads, inter;
	} want[] = {
		{"bert-tiny", 2, 128, 2, 512},     {"bert-mini", 4, 256, 4, 1024},
		{"bert-small", 4, 512, 8, 2048},   {"bert-medium", 8, 512, 8, 2048},
		{"bert-base", 12, 768, 12, 3072},  {"bert-large", 24, 1024, 16, 4096},
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		char text[200];
		snprintf(text, sizeof text, "{\"dataset\":\"d\",\"model\":{\"preset\":\"%s\"}}",
			 want[i].name);
		json_t *o = normalize_ok(text);
		assert_string_equal(gets_(o, "model", "preset"), want[i].name);
		assert_int_equal(geti(o, "model", "num_hidden_layers"), want[i].layers);
		assert_int_equal(geti(o, "model", "hidden_size"), want[i].hidden);
		assert_int_equal(geti(o, "model", "num_attention_heads"), want[i].heads);
		assert_int_equal(geti(o, "model", "intermediate_size"), want[i].inter);
		json_decref(o);
	}
	/* Explicit BertConfig names win over the preset, the rest stays. */
	json_t *o = normalize_ok("{\"dataset\":\"d\",\"model\":{\"hidden_size\":256,"
				 "\"preset\":\"bert-tiny\",\"vocab_size\":30522,"
				 "\"max_position_embeddings\":1024,\"hidden_dropout_prob\":0}}");
	assert_int_equal(geti(o, "model", "hidden_size"), 256);
	assert_int_equal(geti(o, "model", "num_hidden_layers"), 2);
	assert_int_equal(geti(o, "model", "num_attention_heads"), 2);
	assert_int_equal(geti(o, "model", "intermediate_size"), 512);
	assert_int_equal(geti(o, "model", "vocab_size"), 30522);
	assert_int_equal(geti(o, "model", "max_position_embeddings"), 1024);
	assert_true(getd(o, "model", "hidden_dropout_prob") == 0.0);
	json_decref(o);
	/* vocab_size 0 is HF-ish for "not set": the dataset decides (null). */
	o = normalize_ok("{\"dataset\":\"d\",\"model\":{\"vocab_size\":0}}");
	assert_true(json_is_null(get(o, "model", "vocab_size")));
	json_decref(o);
}

static void test_normalized_spellings(void **state)
{
	(void)state;
	json_t *o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"optim\":\"adamw_torch\","
				 "\"learning_rate\":1,\"max_grad_norm\":0,\"seed\":9223372036854775807,"
				 "\"max_seq_length\":512,\"bf16\":false,\"fp16\":true},"
				 "\"init_from\":\"/data/ckpt/..x/ckpt-100\",\"name\":\"A-b_c.1\"}");
	assert_string_equal(gets_(o, "training_args", "optim"), "adamw");
	assert_true(getd(o, "training_args", "learning_rate") == 1.0);
	assert_true(getd(o, "training_args", "max_grad_norm") == 0.0);
	assert_true(geti(o, "training_args", "seed") == 9223372036854775807LL);
	assert_int_equal(geti(o, "mlm", "max_predictions_per_seq"), 80); /* BERT at 512 */
	assert_true(json_is_false(get(o, "training_args", "bf16")));
	assert_true(json_is_true(get(o, "training_args", "fp16")));
	assert_string_equal(gets_(o, NULL, "init_from"), "/data/ckpt/..x/ckpt-100");
	assert_string_equal(gets_(o, NULL, "name"), "A-b_c.1");
	json_decref(o);
	o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"optim\":\"adamw_torch_fused\"}}");
	assert_string_equal(gets_(o, "training_args", "optim"), "adamw");
	json_decref(o);
	o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"optim\":\"lamb\"},"
			 "\"mlm\":{\"max_predictions_per_seq\":128}}");
	assert_string_equal(gets_(o, "training_args", "optim"), "lamb");
	assert_int_equal(geti(o, "mlm", "max_predictions_per_seq"), 128);
	json_decref(o);
	/* the profiler's rules pass through unchanged */
	o = normalize_ok("{\"dataset\":\"d\",\"profiler\":{\"rules\":{\"low_gpu_util\":"
			 "{\"threshold\":0.7,\"x\":[1,{\"y\":null}]}}}}");
	json_t *want = parse("{\"low_gpu_util\":{\"threshold\":0.7,\"x\":[1,{\"y\":null}]}}");
	assert_true(json_equal(get(o, "profiler", "rules"), want));
	json_decref(want);
	json_decref(o);
}

static void test_max_predictions_rule(void **state)
{
	(void)state;
	/* Google BERT: 20 at 128 and 80 at 512 with masked_lm_prob 0.15. */
	assert_int_equal(jobspec_default_max_predictions(128, 0.15), 20);
	assert_int_equal(jobspec_default_max_predictions(512, 0.15), 80);
	/* 8 * 0.15 = 1.2 -> 4; never above the sequence */
	assert_int_equal(jobspec_default_max_predictions(8, 0.15), 4);
	assert_int_equal(jobspec_default_max_predictions(8, 0.99), 8);
	assert_int_equal(jobspec_default_max_predictions(9, 0.99), 9);
	/* 160 * 0.1 = 16 exactly: stays 16, not 20 */
	assert_int_equal(jobspec_default_max_predictions(160, 0.1), 16);
	assert_int_equal(jobspec_default_max_predictions(8, 1e-12), 1);
	/* it follows mlm_probability */
	json_t *o = normalize_ok("{\"dataset\":\"d\",\"mlm\":{\"mlm_probability\":0.3}}");
	assert_int_equal(geti(o, "mlm", "max_predictions_per_seq"), 40); /* 38.4 -> 40 */
	json_decref(o);
}

static void test_bad_specs(void **state)
{
	(void)state;
	static const struct {
		const char *spec;
		int status;
		const char *field;
	} cases[] = {
		/* not an object at all */
		{"[]", 400, ""},
		{"[{\"dataset\":\"x\"}]", 400, ""},
		{"\"x\"", 400, ""},
		{"42", 400, ""},
		{"null", 400, ""},
		/* required */
		{"{}", 422, "dataset"},
		{"{\"dataset\":null}", 422, "dataset"},
		/* unknown keys, at every level */
		{"{\"dataset\":\"x\",\"foo\":1}", 422, "foo"},
		{"{\"dataset\":\"x\",\"Name\":\"a\"}", 422, "Name"},
		{"{\"dataset\":\"x\",\"training_args\":{\"learning_rat\":1e-4}}", 422,
		 "training_args.learning_rat"},
		{"{\"dataset\":\"x\",\"model\":{\"num_layers\":2}}", 422, "model.num_layers"},
		{"{\"dataset\":\"x\",\"mlm\":{\"mlm\":true}}", 422, "mlm.mlm"},
		{"{\"dataset\":\"x\",\"resources\":{\"gpu\":1}}", 422, "resources.gpu"},
		{"{\"dataset\":\"x\",\"stopping_condition\":{\"max_steps\":1}}", 422,
		 "stopping_condition.max_steps"},
		{"{\"dataset\":\"x\",\"retry_policy\":{\"restarts\":1}}", 422, "retry_policy.restarts"},
		{"{\"dataset\":\"x\",\"profiler\":{\"rules\":{},\"x\":2}}", 422, "profiler.x"},
		/* wrong JSON types */
		{"{\"dataset\":{\"a\":1}}", 422, "dataset"},
		{"{\"dataset\":\"x\",\"name\":{}}", 422, "name"},
		{"{\"dataset\":\"x\",\"name\":5}", 422, "name"},
		{"{\"dataset\":\"x\",\"model\":\"bert-base\"}", 422, "model"},
		{"{\"dataset\":\"x\",\"training_args\":[]}", 422, "training_args"},
		{"{\"dataset\":\"x\",\"profiler\":{\"rules\":[]}}", 422, "profiler.rules"},
		{"{\"dataset\":\"x\",\"profiler\":true}", 422, "profiler"},
		{"{\"dataset\":\"x\",\"training_args\":{\"max_steps\":\"100\"}}", 422, "training_args.max_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"max_steps\":100.0}}", 422, "training_args.max_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"max_steps\":1e3}}", 422, "training_args.max_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":\"1e-4\"}}", 422,
		 "training_args.learning_rate"},
		{"{\"dataset\":\"x\",\"training_args\":{\"bf16\":\"true\"}}", 422, "training_args.bf16"},
		{"{\"dataset\":\"x\",\"training_args\":{\"bf16\":1}}", 422, "training_args.bf16"},
		{"{\"dataset\":\"x\",\"training_args\":{\"optim\":{}}}", 422, "training_args.optim"},
		{"{\"dataset\":\"x\",\"mlm\":{\"nsp\":0}}", 422, "mlm.nsp"},
		{"{\"dataset\":\"x\",\"model\":{\"hidden_size\":[768]}}", 422, "model.hidden_size"},
		{"{\"dataset\":\"x\",\"init_from\":5}", 422, "init_from"},
		{"{\"dataset\":\"x\",\"priority\":1.5}", 422, "priority"},
		/* out of range, and integers far outside int without UB */
		{"{\"dataset\":\"x\",\"training_args\":{\"per_device_train_batch_size\":0}}", 422,
		 "training_args.per_device_train_batch_size"},
		{"{\"dataset\":\"x\",\"training_args\":{\"per_device_train_batch_size\":65537}}", 422,
		 "training_args.per_device_train_batch_size"},
		{"{\"dataset\":\"x\",\"training_args\":{\"per_device_train_batch_size\":9223372036854775807}}",
		 422, "training_args.per_device_train_batch_size"},
		{"{\"dataset\":\"x\",\"training_args\":{\"per_device_train_batch_size\":65536,"
		 "\"max_seq_length\":512}}", 422, "training_args.per_device_train_batch_size"},
		{"{\"dataset\":\"x\",\"training_args\":{\"gradient_accumulation_steps\":0}}", 422,
		 "training_args.gradient_accumulation_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":0}}", 422, "training_args.learning_rate"},
		{"{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":-1e-4}}", 422, "training_args.learning_rate"},
		{"{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":2}}", 422, "training_args.learning_rate"},
		{"{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":1e308}}", 422, "training_args.learning_rate"},
		{"{\"dataset\":\"x\",\"training_args\":{\"warmup_ratio\":1.5}}", 422, "training_args.warmup_ratio"},
		{"{\"dataset\":\"x\",\"training_args\":{\"warmup_steps\":-1}}", 422, "training_args.warmup_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"adam_beta2\":1.0}}", 422, "training_args.adam_beta2"},
		{"{\"dataset\":\"x\",\"training_args\":{\"adam_epsilon\":0}}", 422, "training_args.adam_epsilon"},
		{"{\"dataset\":\"x\",\"training_args\":{\"max_grad_norm\":-1}}", 422, "training_args.max_grad_norm"},
		{"{\"dataset\":\"x\",\"training_args\":{\"max_steps\":0}}", 422, "training_args.max_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"max_seq_length\":7}}", 422, "training_args.max_seq_length"},
		{"{\"dataset\":\"x\",\"training_args\":{\"seed\":-1}}", 422, "training_args.seed"},
		{"{\"dataset\":\"x\",\"training_args\":{\"logging_steps\":0}}", 422, "training_args.logging_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"save_steps\":0}}", 422, "training_args.save_steps"},
		{"{\"dataset\":\"x\",\"training_args\":{\"save_total_limit\":0}}", 422, "training_args.save_total_limit"},
		{"{\"dataset\":\"x\",\"training_args\":{\"dataloader_num_workers\":65}}", 422,
		 "training_args.dataloader_num_workers"},
		{"{\"dataset\":\"x\",\"training_args\":{\"dataloader_num_workers\":-1}}", 422,
		 "training_args.dataloader_num_workers"},
		{"{\"dataset\":\"x\",\"training_args\":{\"lr_scheduler_type\":\"inverse_sqrt\"}}", 422,
		 "training_args.lr_scheduler_type"},
		{"{\"dataset\":\"x\",\"training_args\":{\"optim\":\"sgd\"}}", 422, "training_args.optim"},
		{"{\"dataset\":\"x\",\"training_args\":{\"optim\":\"adamw\\u0000\"}}", 422, "training_args.optim"},
		{"{\"dataset\":\"x\",\"training_args\":{\"optim\":\"ADAMW\"}}", 422, "training_args.optim"},
		{"{\"dataset\":\"x\",\"training_args\":{\"ddp_reduce_dtype\":\"fp8\"}}", 422,
		 "training_args.ddp_reduce_dtype"},
		{"{\"dataset\":\"x\",\"training_args\":{\"ddp_reduce_dtype\":16}}", 422,
		 "training_args.ddp_reduce_dtype"},
		/* loss-scaled fp16 gradients would overflow in an fp16 all-reduce */
		{"{\"dataset\":\"x\",\"training_args\":{\"fp16\":true,\"ddp_reduce_dtype\":\"float16\"}}", 422,
		 "training_args.ddp_reduce_dtype"},
		{"{\"dataset\":\"x\",\"model\":{\"preset\":\"bert-huge\"}}", 422, "model.preset"},
		{"{\"dataset\":\"x\",\"model\":{\"preset\":\"custom\"}}", 422, "model.preset"},
		{"{\"dataset\":\"x\",\"model\":{\"hidden_act\":\"relu\"}}", 422, "model.hidden_act"},
		{"{\"dataset\":\"x\",\"model\":{\"hidden_dropout_prob\":1}}", 422, "model.hidden_dropout_prob"},
		{"{\"dataset\":\"x\",\"model\":{\"attention_probs_dropout_prob\":-0.1}}", 422,
		 "model.attention_probs_dropout_prob"},
		{"{\"dataset\":\"x\",\"model\":{\"num_hidden_layers\":129}}", 422, "model.num_hidden_layers"},
		{"{\"dataset\":\"x\",\"model\":{\"num_hidden_layers\":0}}", 422, "model.num_hidden_layers"},
		{"{\"dataset\":\"x\",\"model\":{\"hidden_size\":16385,\"num_attention_heads\":1}}", 422,
		 "model.hidden_size"},
		{"{\"dataset\":\"x\",\"model\":{\"vocab_size\":-1}}", 422, "model.vocab_size"},
		{"{\"dataset\":\"x\",\"model\":{\"vocab_size\":4194305}}", 422, "model.vocab_size"},
		{"{\"dataset\":\"x\",\"model\":{\"initializer_range\":0}}", 422, "model.initializer_range"},
		{"{\"dataset\":\"x\",\"model\":{\"layer_norm_eps\":0}}", 422, "model.layer_norm_eps"},
		{"{\"dataset\":\"x\",\"model\":{\"type_vocab_size\":0}}", 422, "model.type_vocab_size"},
		{"{\"dataset\":\"x\",\"model\":{\"max_position_embeddings\":70000}}", 422,
		 "model.max_position_embeddings"},
		{"{\"dataset\":\"x\",\"mlm\":{\"mlm_probability\":0}}", 422, "mlm.mlm_probability"},
		{"{\"dataset\":\"x\",\"mlm\":{\"mlm_probability\":1}}", 422, "mlm.mlm_probability"},
		{"{\"dataset\":\"x\",\"mlm\":{\"short_seq_prob\":1.01}}", 422, "mlm.short_seq_prob"},
		{"{\"dataset\":\"x\",\"mlm\":{\"max_predictions_per_seq\":0}}", 422, "mlm.max_predictions_per_seq"},
		{"{\"dataset\":\"x\",\"priority\":101}", 422, "priority"},
		{"{\"dataset\":\"x\",\"priority\":-9223372036854775807}", 422, "priority"},
		{"{\"dataset\":\"x\",\"resources\":{\"gpus\":0}}", 422, "resources.gpus"},
		{"{\"dataset\":\"x\",\"resources\":{\"gpus\":65}}", 422, "resources.gpus"},
		{"{\"dataset\":\"x\",\"resources\":{\"device\":\"tpu\"}}", 422, "resources.device"},
		{"{\"dataset\":\"x\",\"stopping_condition\":{\"max_runtime_seconds\":0}}", 422,
		 "stopping_condition.max_runtime_seconds"},
		{"{\"dataset\":\"x\",\"retry_policy\":{\"max_restarts\":101}}", 422, "retry_policy.max_restarts"},
		{"{\"dataset\":\"x\",\"retry_policy\":{\"max_restarts\":-1}}", 422, "retry_policy.max_restarts"},
		/* names and paths */
		{"{\"dataset\":\"x\",\"name\":\"a b\"}", 422, "name"},
		{"{\"dataset\":\"x\",\"name\":\"\"}", 422, "name"},
		{"{\"dataset\":\"x\",\"name\":\"../x\"}", 422, "name"},
		{"{\"dataset\":\"x\",\"name\":\".hidden\"}", 422, "name"},
		{"{\"dataset\":\"x\",\"name\":\"caf\\u00e9\"}", 422, "name"},
		{"{\"dataset\":\"x\",\"name\":\"a\\u0000b\"}", 422, "name"},
		{"{\"dataset\":\"a/b\"}", 422, "dataset"},
		{"{\"dataset\":\"..\"}", 422, "dataset"},
		{"{\"dataset\":\"\"}", 422, "dataset"},
		{"{\"dataset\":\"x\",\"init_from\":\"relative/ckpt\"}", 422, "init_from"},
		{"{\"dataset\":\"x\",\"init_from\":\"\"}", 422, "init_from"},
		{"{\"dataset\":\"x\",\"init_from\":\"/data/../etc\"}", 422, "init_from"},
		{"{\"dataset\":\"x\",\"init_from\":\"/data/..\"}", 422, "init_from"},
		{"{\"dataset\":\"x\",\"init_from\":\"/..\"}", 422, "init_from"},
		{"{\"dataset\":\"x\",\"init_from\":\"/a\\nb\"}", 422, "init_from"},
		{"{\"dataset\":\"x\",\"init_from\":\"/a\\u0000b\"}", 422, "init_from"},
		/* inconsistent */
		{"{\"dataset\":\"x\",\"model\":{\"hidden_size\":100}}", 422, "model.num_attention_heads"},
		{"{\"dataset\":\"x\",\"model\":{\"preset\":\"bert-large\",\"num_attention_heads\":12}}", 422,
		 "model.num_attention_heads"},
		{"{\"dataset\":\"x\",\"training_args\":{\"max_seq_length\":1024}}", 422,
		 "training_args.max_seq_length"},
		{"{\"dataset\":\"x\",\"model\":{\"max_position_embeddings\":64}}", 422,
		 "training_args.max_seq_length"},
		{"{\"dataset\":\"x\",\"training_args\":{\"bf16\":true,\"fp16\":true}}", 422, "training_args.fp16"},
		{"{\"dataset\":\"x\",\"training_args\":{\"bf16\":true},\"resources\":{\"device\":\"cpu\"}}",
		 422, "training_args.bf16"},
		{"{\"dataset\":\"x\",\"training_args\":{\"fp16\":true},\"resources\":{\"device\":\"cpu\"}}",
		 422, "training_args.fp16"},
		{"{\"dataset\":\"x\",\"training_args\":{\"warmup_steps\":10,\"warmup_ratio\":0.1}}", 422,
		 "training_args.warmup_ratio"},
		{"{\"dataset\":\"x\",\"training_args\":{\"warmup_steps\":1001}}", 422, "training_args.warmup_steps"},
		{"{\"dataset\":\"x\",\"mlm\":{\"mask_replace_prob\":0.8,\"random_replace_prob\":0.3}}", 422,
		 "mlm.random_replace_prob"},
		{"{\"dataset\":\"x\",\"mlm\":{\"max_predictions_per_seq\":129}}", 422, "mlm.max_predictions_per_seq"},
		{"{\"dataset\":\"x\",\"mlm\":{\"nsp\":true},\"model\":{\"type_vocab_size\":1}}", 422,
		 "model.type_vocab_size"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		expect_bad(cases[i].spec, cases[i].status, cases[i].field);
	expect_bad_json(NULL, 400, "");
}

static void test_edges_accepted(void **state)
{
	(void)state;
	/* the closed ends of each range are accepted */
	const char *ok[] = {
		"{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":1,\"warmup_ratio\":1,"
		"\"warmup_steps\":0,\"max_grad_norm\":0,\"dataloader_num_workers\":0}}",
		"{\"dataset\":\"x\",\"training_args\":{\"warmup_steps\":1000,\"max_steps\":1000}}",
		"{\"dataset\":\"x\",\"training_args\":{\"per_device_train_batch_size\":65536,"
		"\"max_seq_length\":256},\"model\":{\"max_position_embeddings\":256}}",
		"{\"dataset\":\"x\",\"mlm\":{\"mask_replace_prob\":0.9,\"random_replace_prob\":0.1}}",
		"{\"dataset\":\"x\",\"mlm\":{\"mask_replace_prob\":1,\"random_replace_prob\":0}}",
		"{\"dataset\":\"x\",\"priority\":-100,\"resources\":{\"gpus\":64,\"device\":\"cpu\"},"
		"\"retry_policy\":{\"max_restarts\":0},\"training_args\":{\"bf16\":false}}",
		"{\"dataset\":\"x\",\"model\":{\"preset\":\"bert-tiny\",\"hidden_size\":8,"
		"\"num_attention_heads\":8,\"max_position_embeddings\":8},"
		"\"training_args\":{\"max_seq_length\":8}}",
		"{\"dataset\":\"x\",\"model\":{\"type_vocab_size\":1}}",
		"{\"dataset\":\"x\",\"stopping_condition\":{\"max_runtime_seconds\":1}}",
	};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
		json_decref(normalize_ok(ok[i]));
	char name[200];
	memset(name, 'n', 128);
	name[128] = '\0';
	char text[400];
	snprintf(text, sizeof text, "{\"dataset\":\"x\",\"name\":\"%s\"}", name);
	json_decref(normalize_ok(text));
	snprintf(text, sizeof text, "{\"dataset\":\"x\",\"name\":\"%sn\"}", name);
	expect_bad(text, 422, "name");
	name[64] = '\0';
	snprintf(text, sizeof text, "{\"dataset\":\"%s\"}", name);
	json_decref(normalize_ok(text));
	snprintf(text, sizeof text, "{\"dataset\":\"%sn\"}", name);
	expect_bad(text, 422, "dataset");
}

static void check_idempotent(const char *text)
{
	json_t *once = normalize_ok(text), *twice = NULL;
	jobspec_error err;
	assert_int_equal(jobspec_normalize(once, &twice, &err), 0);
	assert_true(json_equal(once, twice));
	/* same key order too: the text is stable, not only the value */
	char *a = json_dumps(once, 0), *b = json_dumps(twice, 0);
	assert_string_equal(a, b);
	free(a);
	free(b);
	json_decref(once);
	json_decref(twice);
}

static void test_idempotence(void **state)
{
	(void)state;
	check_idempotent(design_example);
	check_idempotent("{\"dataset\":\"x\"}");
	check_idempotent("{\"retry_policy\":{},\"dataset\":\"x\",\"model\":{\"vocab_size\":0,"
			 "\"preset\":\"bert-small\",\"num_hidden_layers\":6}}");
	check_idempotent("{\"dataset\":\"x\",\"training_args\":{\"optim\":\"adamw_torch\","
			 "\"learning_rate\":1,\"fp16\":true,\"max_seq_length\":512},"
			 "\"mlm\":{\"mlm_probability\":0.2},\"init_from\":\"/a/b\","
			 "\"profiler\":{\"rules\":{\"r\":[1,2,{\"z\":null}]}}}");
}

/* hidden_act: GELU's erf form and its tanh form under both HF names */
static void test_hidden_act_tanh(void **state)
{
	(void)state;
	static const char *const acts[] = {"gelu_new", "gelu_pytorch_tanh"};
	for (int i = 0; i < 2; i++) {
		char in[128];
		snprintf(in, sizeof in, "{\"dataset\":\"x\",\"model\":{\"hidden_act\":\"%s\"}}",
			 acts[i]);
		json_t *eff = normalize_ok(in);
		assert_string_equal(gets_(eff, "model", "hidden_act"), acts[i]);
		jobspec s;
		jobspec_error err;
		assert_int_equal(jobspec_from_json(eff, &s, &err), 0);
		assert_string_equal(s.model.hidden_act, acts[i]);
		json_decref(eff);
		check_idempotent(in);
	}
}

static void test_from_json(void **state)
{
	(void)state;
	json_t *eff = normalize_ok(design_example);
	jobspec s;
	jobspec_error err;
	assert_int_equal(jobspec_from_json(eff, &s, &err), 0);
	assert_string_equal(s.name, "pubmed-base");
	assert_string_equal(s.dataset, "pubmed");
	assert_string_equal(s.init_from, "");
	assert_int_equal(s.priority, 0);
	assert_string_equal(s.model.preset, "bert-base");
	assert_int_equal(s.model.vocab_size, 0);
	assert_int_equal(s.model.hidden_size, 768);
	assert_int_equal(s.model.num_hidden_layers, 12);
	assert_int_equal(s.model.num_attention_heads, 12);
	assert_int_equal(s.model.intermediate_size, 3072);
	assert_string_equal(s.model.hidden_act, "gelu");
	assert_true(s.model.hidden_dropout_prob == 0.1);
	assert_int_equal(s.model.max_position_embeddings, 512);
	assert_int_equal(s.model.type_vocab_size, 2);
	assert_true(s.model.layer_norm_eps == 1e-12);
	assert_int_equal(s.training.per_device_train_batch_size, 64);
	assert_true(s.training.learning_rate == 1e-4);
	assert_string_equal(s.training.lr_scheduler_type, "linear");
	assert_int_equal(s.training.warmup_steps, 10000);
	assert_true(s.training.weight_decay == 0.01);
	assert_true(s.training.adam_beta2 == 0.999);
	assert_int_equal(s.training.max_steps, 100000);
	assert_int_equal(s.training.max_seq_length, 128);
	assert_string_equal(s.training.optim, "adamw");
	assert_int_equal(s.training.bf16, 1);
	assert_int_equal(s.training.fp16, JOBSPEC_AUTO);
	assert_int_equal(s.training.seed, 42);
	assert_int_equal(s.training.save_steps, 1000);
	assert_int_equal(s.training.dataloader_num_workers, 8);
	assert_true(s.training.dataloader_pin_memory);
	assert_string_equal(s.training.ddp_reduce_dtype, "fp32");
	assert_true(s.mlm.mlm_probability == 0.15);
	assert_false(s.mlm.nsp);
	assert_int_equal(s.mlm.max_predictions_per_seq, 20);
	assert_int_equal(s.gpus, 8);
	assert_string_equal(s.device, "auto");
	assert_int_equal(s.max_runtime_seconds, 0);
	assert_int_equal(s.max_restarts, 3);
	json_decref(eff);

	/* fp16 training reduces in bf16 (fp32's range) or fp32 */
	eff = normalize_ok("{\"dataset\":\"d\",\"resources\":{\"device\":\"cuda\"},"
			   "\"training_args\":{\"fp16\":true,\"ddp_reduce_dtype\":\"bf16\"}}");
	json_decref(eff);

	eff = normalize_ok("{\"dataset\":\"d\",\"init_from\":\"/x/ckpt-5\",\"priority\":-7,"
			   "\"model\":{\"vocab_size\":30528,\"preset\":\"bert-tiny\"},"
			   "\"training_args\":{\"seed\":9223372036854775807,\"bf16\":false,"
			   "\"lr_scheduler_type\":\"constant_with_warmup\",\"dataloader_pin_memory\":false,"
			   "\"ddp_reduce_dtype\":\"bfloat16\"},"
			   "\"mlm\":{\"nsp\":true,\"whole_word_mask\":true},"
			   "\"resources\":{\"device\":\"cpu\",\"gpus\":3},"
			   "\"stopping_condition\":{\"max_runtime_seconds\":3600}}");
	assert_int_equal(jobspec_from_json(eff, &s, &err), 0);
	assert_string_equal(s.name, "d");
	assert_string_equal(s.init_from, "/x/ckpt-5");
	assert_int_equal(s.priority, -7);
	assert_int_equal(s.model.vocab_size, 30528);
	assert_int_equal(s.model.hidden_size, 128);
	assert_true(s.training.seed == 9223372036854775807ULL);
	assert_int_equal(s.training.bf16, 0);
	assert_int_equal(s.training.fp16, JOBSPEC_AUTO);
	assert_string_equal(s.training.lr_scheduler_type, "constant_with_warmup");
	assert_false(s.training.dataloader_pin_memory);
	assert_string_equal(s.training.ddp_reduce_dtype, "bf16"); /* the alias, spelled canonically */
	assert_true(s.mlm.nsp);
	assert_true(s.mlm.whole_word_mask);
	assert_string_equal(s.device, "cpu");
	assert_int_equal(s.gpus, 3);
	assert_int_equal(s.max_runtime_seconds, 3600);

	/* Round trip through text, as the worker receives it. */
	char *text = json_dumps(eff, 0);
	json_t *back = parse(text);
	jobspec s2;
	assert_int_equal(jobspec_from_json(back, &s2, &err), 0);
	assert_memory_equal(&s.model, &s2.model, sizeof s.model);
	assert_true(s2.training.learning_rate == s.training.learning_rate);
	json_decref(back);
	free(text);

	/* A submitted (non-effective) spec is refused, naming the first gap. */
	json_t *in = parse("{\"dataset\":\"d\"}");
	assert_int_equal(jobspec_from_json(in, &s, &err), -EINVAL);
	assert_int_equal(err.status, 422);
	assert_string_equal(err.field, "name");
	json_decref(in);
	static const struct {
		const char *sec, *key, *value, *field;
	} tweaks[] = {
		{"training_args", "optim", "\"adamw_torch\"", "training_args.optim"},
		{"training_args", "learning_rate", "1", "training_args.learning_rate"},
		{"model", "vocab_size", "0", "model.vocab_size"},
		{"mlm", "max_predictions_per_seq", "null", "mlm.max_predictions_per_seq"},
		{"training_args", "seed", "null", "training_args.seed"},
		{NULL, "name", "null", "name"},
		{NULL, "profiler", "null", "profiler"},
		{"model", "hidden_size", "101", "model.num_attention_heads"}, /* plain invalid */
	};
	for (size_t i = 0; i < sizeof tweaks / sizeof tweaks[0]; i++) {
		json_t *t = json_deep_copy(eff);
		json_t *sec = tweaks[i].sec ? json_object_get(t, tweaks[i].sec) : t;
		json_object_set_new(sec, tweaks[i].key, parse(tweaks[i].value));
		memset(&err, 0, sizeof err);
		if (jobspec_from_json(t, &s, &err) != -EINVAL)
			fail_msg("tweak %s accepted", tweaks[i].key);
		assert_int_equal(err.status, 422);
		assert_string_equal(err.field, tweaks[i].field);
		json_decref(t);
	}
	/* a missing key, nested */
	json_t *t = json_deep_copy(eff);
	json_object_del(json_object_get(t, "model"), "layer_norm_eps");
	assert_int_equal(jobspec_from_json(t, &s, &err), -EINVAL);
	assert_string_equal(err.field, "model.layer_norm_eps");
	json_decref(t);
	json_decref(eff);
}

static void test_hostile_input(void **state)
{
	(void)state;
	/* Nesting at jansson's parser limit: copied through under profiler.rules,
	 * a clean type error anywhere else. */
	enum { DEPTH = 2000 };
	size_t cap = 2 * DEPTH + 200;
	char *text = malloc(cap), *deep = malloc(2 * DEPTH + 1);
	assert_non_null(text);
	assert_non_null(deep);
	memset(deep, '[', DEPTH);
	memset(deep + DEPTH, ']', DEPTH);
	deep[2 * DEPTH] = '\0';
	snprintf(text, cap, "{\"dataset\":\"x\",\"profiler\":{\"rules\":{\"r\":%s}}}", deep);
	json_t *o = normalize_ok(text);
	json_decref(o);
	snprintf(text, cap, "{\"dataset\":\"x\",\"training_args\":{\"seed\":%s}}", deep);
	expect_bad(text, 422, "training_args.seed");
	snprintf(text, cap, "{\"dataset\":\"x\",\"model\":%s}", deep);
	expect_bad(text, 422, "model");
	expect_bad(deep, 400, "");
	free(deep);
	free(text);

	/* A 1 MiB name and a 1 MiB unknown key of multi-byte characters: refused,
	 * the field truncated on a character boundary. */
	enum { BIG = 1 << 20 };
	json_t *in = parse("{\"dataset\":\"x\"}");
	char *big = malloc(BIG + 1);
	assert_non_null(big);
	memset(big, 'a', BIG);
	big[BIG] = '\0';
	json_object_set_new(in, "name", json_string(big));
	expect_bad_json(in, 422, "name");
	json_object_del(in, "name");
	json_object_set_new(in, "dataset", json_string(big));
	expect_bad_json(in, 422, "dataset");
	json_object_set_new(in, "dataset", json_string("x"));
	json_object_set_new(in, "init_from", json_string(big));
	expect_bad_json(in, 422, "init_from");
	json_object_del(in, "init_from");
	for (size_t i = 0; i + 3 <= BIG; i += 3)
		memcpy(big + i, "\xe2\x82\xac", 3); /* U+20AC, 3 bytes */
	big[BIG - BIG % 3] = '\0';
	json_t *ta = json_object();
	json_object_set_new(ta, big, json_integer(1));
	json_object_set_new(in, "training_args", ta);
	json_t *out = NULL;
	jobspec_error err;
	assert_int_equal(jobspec_normalize(in, &out, &err), -EINVAL);
	assert_int_equal(err.status, 422);
	assert_string_equal(err.detail, "unknown key");
	assert_true(strncmp(err.field, "training_args.\xe2\x82\xac", 17) == 0);
	size_t n = strlen(err.field);
	assert_true(n < sizeof err.field);
	assert_int_equal((n - strlen("training_args.")) % 3, 0);
	json_t *f = json_string(err.field);
	assert_non_null(f); /* valid UTF-8 */
	json_decref(f);
	free(big);
	json_decref(in);

	/* A key with a NUL inside is not the key it starts with (jansson's
	 * parser refuses these, but an API could build one). */
	in = parse("{\"dataset\":\"x\",\"training_args\":{}}");
	json_object_setn_new(json_object_get(in, "training_args"), "seed\0x", 6, json_integer(1));
	expect_bad_json(in, 422, "training_args.seed");
	json_decref(in);

	/* in is never modified */
	in = parse(design_example);
	json_t *copy = json_deep_copy(in);
	assert_int_equal(jobspec_normalize(in, &out, &err), 0);
	assert_true(json_equal(in, copy));
	json_decref(out);
	json_decref(copy);
	json_decref(in);
}

/* Every dotted key of the effective spec, depth-first, into keys[]. */
static size_t collect_keys(json_t *o, const char *prefix, char keys[][96], size_t n, size_t cap)
{
	const char *key;
	json_t *v;
	json_object_foreach(o, key, v) {
		char path[96];
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
		/* profiler.rules is a pass-through object, lr_scheduler_kwargs one
		 * whose keys depend on the schedule: each documented as one key */
		if (json_is_object(v) && strcmp(path, "profiler.rules") != 0 &&
		    strcmp(path, "training_args.lr_scheduler_kwargs") != 0) {
			n = collect_keys(v, path, keys, n, cap);
		} else {
			assert_true(n < cap);
			snprintf(keys[n++], 96, "%s", path);
		}
	}
	return n;
}

static void test_docs_document_every_key(void **state)
{
	(void)state;
	const char *root = getenv("BERTD_SOURCE_ROOT");
	if (!root)
		skip();
	char path[4096];
	snprintf(path, sizeof path, "%s/docs/jobspec.md", root);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	static char doc[128][96], code[128][96];
	size_t nd = 0;
	char line[2048];
	/* Table rows look like: | `training_args.learning_rate` | number | ... */
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "| `", 3) != 0)
			continue;
		char *end = strchr(line + 3, '`');
		assert_non_null(end);
		*end = '\0';
		/* only key rows: other tables start with a quoted value or an object */
		if (strspn(line + 3, "abcdefghijklmnopqrstuvwxyz_.0123456789") != strlen(line + 3))
			continue;
		assert_true(nd < 128);
		snprintf(doc[nd++], 96, "%.95s", line + 3);
	}
	fclose(f);
	json_t *o = normalize_ok("{\"dataset\":\"x\"}");
	size_t nc = collect_keys(o, "", code, 0, 128);
	json_decref(o);
	for (size_t i = 0; i < nc; i++) {
		bool found = false;
		for (size_t j = 0; j < nd && !found; j++)
			found = strcmp(code[i], doc[j]) == 0;
		if (!found)
			fail_msg("docs/jobspec.md does not document %s", code[i]);
	}
	for (size_t j = 0; j < nd; j++) {
		bool found = false;
		for (size_t i = 0; i < nc && !found; i++)
			found = strcmp(code[i], doc[j]) == 0;
		if (!found)
			fail_msg("docs/jobspec.md documents %s, which the spec does not have", doc[j]);
	}
	assert_int_equal(nd, nc);
}

/* HF's run length: max_steps -1 trains num_train_epochs passes (3.0 when
 * not given); max_steps > 0 wins; only num_train_epochs given means epochs.
 * The expected step counts are worked by hand from the documented estimate
 * (docs/jobspec.md "Training by epochs"). */
static void test_train_by_epochs(void **state)
{
	(void)state;
	/* 1e6 tokens in 50000 sentences (20 each) of 2000 documents, T 128,
	 * short_seq_prob 0.1: room 126, mean target 0.9*126 + 0.1*(2+126)/2 =
	 * 119.8; concatenated and cut, with a [SEP] between documents:
	 * ceil(1002000/119.8) = 8364 sequences. With drop_long_sentences
	 * (whole sentences) half a sentence is left unused: 109.8 tokens a
	 * sample, ceil(1e6/109.8) = 9108. */
	jobspec_epoch_source src = {.tokens = 1000000, .sentences = 50000, .documents = 2000};
	assert_true(jobspec_estimate_sequences(&src, 128, false, 0.1, false) == 8364.0);
	assert_true(jobspec_estimate_sequences(&src, 128, false, 0.1, true) == 9108.0);
	jobspec_error err;

	json_t *o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"num_train_epochs\":2}}");
	assert_int_equal(geti(o, "training_args", "max_steps"), -1);
	assert_true(getd(o, "training_args", "num_train_epochs") == 2.0);
	jobspec s;
	assert_int_equal(jobspec_from_json(o, &s, &err), -EINVAL); /* a worker never sees -1 */
	assert_string_equal(err.field, "training_args.max_steps");
	assert_int_equal(jobspec_resolve_epochs(o, &src, &err), 0);
	assert_int_equal(geti(o, "training_args", "max_steps"), 2091); /* ceil(2*8364/8) */
	assert_int_equal(jobspec_from_json(o, &s, &err), 0); /* resolved = effective */
	assert_int_equal(s.training.max_steps, 2091);
	assert_true(s.training.num_train_epochs == 2.0);
	json_decref(o);

	/* max_steps -1 alone: HF's 3 epochs; 2 GPUs x 8 x 4 micro-steps = 64 a step */
	o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"max_steps\":-1,"
			 "\"gradient_accumulation_steps\":4},\"resources\":{\"gpus\":2}}");
	assert_true(getd(o, "training_args", "num_train_epochs") == 3.0);
	assert_int_equal(jobspec_resolve_epochs(o, &src, &err), 0);
	assert_int_equal(geti(o, "training_args", "max_steps"), 393); /* ceil(3*8364/64) */
	json_decref(o);

	/* max_steps > 0 overrides, as in HF; resolving changes nothing */
	o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"max_steps\":500,"
			 "\"num_train_epochs\":2}}");
	assert_int_equal(jobspec_resolve_epochs(o, NULL, &err), 0);
	assert_int_equal(geti(o, "training_args", "max_steps"), 500);
	assert_true(getd(o, "training_args", "num_train_epochs") == 2.0);
	json_decref(o);

	/* no token count yet (dataset preparing): refused, spec untouched */
	o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"max_steps\":-1}}");
	jobspec_epoch_source none = {0};
	assert_int_equal(jobspec_resolve_epochs(o, &none, &err), -EINVAL);
	assert_int_equal(err.status, 422);
	assert_string_equal(err.field, "training_args.num_train_epochs");
	assert_int_equal(geti(o, "training_args", "max_steps"), -1);
	json_decref(o);

	/* warmup longer than the resolved run */
	o = normalize_ok("{\"dataset\":\"d\",\"training_args\":{\"num_train_epochs\":1,"
			 "\"warmup_steps\":5000}}");
	assert_int_equal(jobspec_resolve_epochs(o, &src, &err), -EINVAL);
	assert_string_equal(err.field, "training_args.warmup_steps");
	assert_int_equal(geti(o, "training_args", "max_steps"), -1);
	json_decref(o);

	/* sentences longer than a sample: one sample each when the rest is
	 * dropped, else they continue: ceil(1000/126) = 8 */
	jobspec_epoch_source longs = {.tokens = 1000, .sentences = 5, .documents = 0};
	assert_true(jobspec_estimate_sequences(&longs, 128, false, 0.0, true) == 5.0);
	assert_true(jobspec_estimate_sequences(&longs, 128, false, 0.0, false) == 8.0);
	/* NSP keeps one more [SEP]: room 125, no short targets, 1 token sentences:
	 * ceil(1000 / (125 - 0.5)) = 9 */
	jobspec_epoch_source ones = {.tokens = 1000, .sentences = 1000};
	assert_true(jobspec_estimate_sequences(&ones, 128, true, 0.0, false) == 9.0);

	check_idempotent("{\"dataset\":\"x\",\"training_args\":{\"num_train_epochs\":0.5}}");
	check_idempotent("{\"dataset\":\"x\",\"training_args\":{\"max_steps\":-1}}");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"num_train_epochs\":0}}", 422,
		   "training_args.num_train_epochs");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"num_train_epochs\":\"3\"}}", 422,
		   "training_args.num_train_epochs");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"max_steps\":-2}}", 422,
		   "training_args.max_steps");
}

/* TrainingArguments.optim: the torch AdamW spellings are accepted; the rest
 * of HF's optimizers are refused with a sentence naming what is accepted
 * (and never the submitted value). */
static void test_optim_hf_names(void **state)
{
	(void)state;
	static const char *const refused[] = {"adamw_hf", "sgd", "adafactor", "adamw_bnb_8bit", "xyz"};
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		char text[160];
		snprintf(text, sizeof text, "{\"dataset\":\"x\",\"training_args\":{\"optim\":\"%s\"}}",
			 refused[i]);
		json_t *in = parse(text), *out = NULL;
		jobspec_error err;
		assert_int_equal(jobspec_normalize(in, &out, &err), -EINVAL);
		assert_int_equal(err.status, 422);
		assert_string_equal(err.field, "training_args.optim");
		assert_non_null(strstr(err.detail, "adamw_torch"));
		assert_non_null(strstr(err.detail, "lamb"));
		assert_null(strstr(err.detail, refused[i]));
		/* HF's names get told why; an unknown word just the choices */
		assert_true((strstr(err.detail, "does not implement") != NULL) == (i < 4));
		json_decref(in);
	}
}

/* init_from as a job reference: shape only (the API resolves it), and a
 * worker never reads an unresolved one. */
static void test_init_from_job(void **state)
{
	(void)state;
	json_t *o = normalize_ok("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-0123456789abcdef\"}}");
	json_t *want = parse("{\"job\":\"job-0123456789abcdef\"}"); /* its HF export */
	assert_true(json_equal(get(o, NULL, "init_from"), want));
	json_decref(want);
	jobspec s;
	jobspec_error err;
	assert_int_equal(jobspec_from_json(o, &s, &err), -EINVAL);
	assert_string_equal(err.field, "init_from");
	json_decref(o);
	o = normalize_ok("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"checkpoint\":2000}}");
	assert_int_equal(json_integer_value(json_object_get(get(o, NULL, "init_from"), "checkpoint")), 2000);
	json_decref(o);
	check_idempotent("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"checkpoint\":\"latest\"}}");
	check_idempotent("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"checkpoint\":0}}");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{}}", 422, "init_from.job");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"../x\"}}", 422, "init_from.job");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"pubmed-base\"}}", 422, "init_from.job");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-0123456789ABCDEF\"}}", 422,
		   "init_from.job");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":7}}", 422, "init_from.job");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"checkpoint\":-1}}", 422,
		   "init_from.checkpoint");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"checkpoint\":\"first\"}}", 422,
		   "init_from.checkpoint");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"checkpoint\":1.0}}", 422,
		   "init_from.checkpoint");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"path\":\"/x\"}}", 422,
		   "init_from.path");
	expect_bad("{\"dataset\":\"d\",\"init_from\":[\"/x\"]}", 422, "init_from");
}

/* init_from_restore: "weights" by default; "all" (continue a job's run)
 * needs a checkpoint to continue from: not none, not a job's HF export. The
 * rest (optimizer state, model, layout) the API checks with the files. */
static void test_init_from_restore(void **state)
{
	(void)state;
	json_t *o = normalize_ok("{\"dataset\":\"d\"}");
	assert_string_equal(gets_(o, NULL, "init_from_restore"), "weights");
	json_decref(o);
	o = normalize_ok("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\",\"checkpoint\":10},"
			 "\"init_from_restore\":\"all\"}");
	assert_string_equal(gets_(o, NULL, "init_from_restore"), "all");
	json_decref(o);
	/* as stored: init_from resolved to the checkpoint's path */
	check_idempotent("{\"dataset\":\"d\",\"init_from\":\"/s/jobs/job-00000000000000ff/checkpoints/ckpt-10\","
			 "\"init_from_restore\":\"all\"}");
	expect_bad("{\"dataset\":\"d\",\"init_from_restore\":\"all\"}", 422, "init_from_restore");
	expect_bad("{\"dataset\":\"d\",\"init_from\":{\"job\":\"job-00000000000000ff\"},\"init_from_restore\":\"all\"}",
		   422, "init_from_restore");
	expect_bad("{\"dataset\":\"d\",\"init_from_restore\":\"optimizer\"}", 422, "init_from_restore");
	expect_bad("{\"dataset\":\"d\",\"init_from_restore\":true}", 422, "init_from_restore");
}

/* Names the first path where a and b differ (for a message a person can act on). */
static bool schema_diff(json_t *a, json_t *b, char *path, size_t cap)
{
	if (json_is_object(a) && json_is_object(b)) {
		const char *k;
		json_t *v;
		size_t n = strlen(path);
		json_object_foreach(a, k, v) {
			snprintf(path + n, cap - n, "/%s", k);
			json_t *w = json_object_get(b, k);
			if (!w || schema_diff(v, w, path, cap))
				return true;
		}
		json_object_foreach(b, k, v) {
			snprintf(path + n, cap - n, "/%s", k);
			if (!json_object_get(a, k))
				return true;
		}
		path[n] = '\0';
		return false;
	}
	return !json_equal(a, b);
}

/* docs/openapi.yaml's JobSpecInput is the table's schema: a key added to
 * common/jobspec.c (or a bound, default or choice changed) and not to the
 * doc fails here. The doc writes it as JSON, which is YAML too; the block is
 * the indented lines under "    JobSpecInput:". */
static void test_openapi_matches_table(void **state)
{
	(void)state;
	const char *root = getenv("BERTD_SOURCE_ROOT");
	if (!root)
		skip();
	char path[4096];
	snprintf(path, sizeof path, "%s/docs/openapi.yaml", root);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	static char block[1 << 16];
	size_t used = 0;
	char line[4096];
	bool in = false, seen = false;
	while (fgets(line, sizeof line, f)) {
		if (!in) {
			in = seen = strcmp(line, "    JobSpecInput:\n") == 0;
			continue;
		}
		size_t ind = strspn(line, " ");
		if (line[ind] != '\n' && ind <= 4)
			break;
		size_t n = strlen(line);
		assert_true(used + n < sizeof block);
		memcpy(block + used, line, n);
		used += n;
	}
	fclose(f);
	if (!seen)
		fail_msg("docs/openapi.yaml has no \"    JobSpecInput:\" line");
	block[used] = '\0';
	json_error_t e;
	json_t *doc = json_loads(block, 0, &e);
	if (!doc)
		fail_msg("docs/openapi.yaml JobSpecInput is not the generated JSON (line %d: %s); "
			 "regenerate it with jobspec-schema", e.line, e.text);
	json_t *gen = jobspec_schema();
	assert_non_null(gen);
	char where[512] = "";
	if (schema_diff(gen, doc, where, sizeof where))
		fail_msg("docs/openapi.yaml JobSpecInput differs from common/jobspec.c's table at %s; "
			 "regenerate it: build/tests/unit/common/jobspec-schema", where[0] ? where : "/");
	json_decref(gen);
	json_decref(doc);
}

/* Held-out evaluation keys: HF names, evaluation_strategy as the older
 * spelling, eval_steps and the held-out share resolved from other keys. */
static void test_eval_keys(void **state)
{
	(void)state;
	json_t *o = normalize_ok("{\"dataset\":\"x\"}");
	assert_string_equal(gets_(o, "training_args", "eval_strategy"), "no");
	assert_int_equal(geti(o, "training_args", "eval_steps"), 50); /* = logging_steps */
	assert_int_equal(geti(o, "training_args", "per_device_eval_batch_size"), 8);
	assert_int_equal(geti(o, "training_args", "max_eval_batches"), 100);
	assert_int_equal(geti(o, "mlm", "validation_split_percentage"), 0);
	json_decref(o);

	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"evaluation_strategy\":\"steps\","
			 "\"logging_steps\":7}}");
	assert_string_equal(gets_(o, "training_args", "eval_strategy"), "steps");
	assert_null(json_object_get(json_object_get(o, "training_args"), "evaluation_strategy"));
	assert_int_equal(geti(o, "training_args", "eval_steps"), 7);
	assert_int_equal(geti(o, "mlm", "validation_split_percentage"), 5);
	jobspec s;
	jobspec_error err;
	assert_int_equal(jobspec_from_json(o, &s, &err), 0);
	assert_string_equal(s.training.eval_strategy, "steps");
	assert_int_equal(s.training.eval_steps, 7);
	assert_int_equal(s.mlm.validation_split_percentage, 5);
	json_decref(o);

	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"eval_strategy\":\"steps\","
			 "\"eval_steps\":3},\"mlm\":{\"validation_split_percentage\":20}}");
	assert_int_equal(geti(o, "training_args", "eval_steps"), 3);
	assert_int_equal(geti(o, "mlm", "validation_split_percentage"), 20);
	json_decref(o);

	/* an epoch by num_train_epochs is the training share: 20% held out, 80% of the steps */
	const jobspec_epoch_source src = {.tokens = 1000000, .sentences = 50000};
	json_t *all = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"num_train_epochs\":1}}");
	json_t *held = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"num_train_epochs\":1},"
				    "\"mlm\":{\"validation_split_percentage\":20}}");
	assert_int_equal(jobspec_resolve_epochs(all, &src, &err), 0);
	assert_int_equal(jobspec_resolve_epochs(held, &src, &err), 0);
	double s_all = (double)geti(all, "training_args", "max_steps");
	double s_held = (double)geti(held, "training_args", "max_steps");
	assert_true(s_all > 100 && fabs(s_held / s_all - 0.8) < 0.01);
	json_decref(all);
	json_decref(held);

	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"eval_strategy\":\"steps\","
		   "\"evaluation_strategy\":\"steps\"}}", 422, "training_args.evaluation_strategy");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"eval_strategy\":\"epoch\"}}", 422,
		   "training_args.eval_strategy");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"eval_strategy\":\"steps\"},"
		   "\"mlm\":{\"validation_split_percentage\":0}}", 422, "mlm.validation_split_percentage");
	expect_bad("{\"dataset\":\"x\",\"mlm\":{\"validation_split_percentage\":100}}", 422,
		   "mlm.validation_split_percentage");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"eval_steps\":0}}", 422,
		   "training_args.eval_steps");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"per_device_eval_batch_size\":65536,"
		   "\"max_seq_length\":512}}", 422, "training_args.per_device_eval_batch_size");
}

/* The presets' dimensions are docs/jobspec.md's table (Google's BERT
 * checkpoints); a model with them is named back (the API names the preset
 * of an init_from model with it). */
static void test_preset_dims(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		int dims[4]; /* H, L, A, I */
	} doc[] = {{"bert-tiny", {128, 2, 2, 512}},	{"bert-mini", {256, 4, 4, 1024}},
		   {"bert-small", {512, 4, 8, 2048}},	{"bert-medium", {512, 8, 8, 2048}},
		   {"bert-base", {768, 12, 12, 3072}},	{"bert-large", {1024, 24, 16, 4096}}};
	for (size_t i = 0; i < sizeof doc / sizeof doc[0]; i++) {
		int d[4] = {0};
		assert_int_equal(jobspec_preset_dims(doc[i].name, d), 0);
		assert_memory_equal(d, doc[i].dims, sizeof d);
		assert_string_equal(jobspec_preset_of(doc[i].dims), doc[i].name);
	}
	int d[4];
	assert_int_equal(jobspec_preset_dims("bert-huge", d), -ENOENT);
	assert_int_equal(jobspec_preset_dims(NULL, d), -ENOENT);
	static const int odd[4] = {16, 1, 2, 32};
	assert_null(jobspec_preset_of(odd));
}

/* lr_scheduler_kwargs: each schedule's own keyword arguments with HF's
 * defaults filled in, read back typed; the rest are 422s naming the kwarg. */
static void test_sched_kwargs(void **state)
{
	(void)state;
	jobspec s;
	jobspec_error err;
	json_t *o = normalize_ok("{\"dataset\":\"x\"}");
	json_t *kw = json_object_get(json_object_get(o, "training_args"), "lr_scheduler_kwargs");
	assert_true(json_is_object(kw) && json_object_size(kw) == 0);
	json_decref(o);

	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":0.006,"
			 "\"lr_scheduler_type\":\"polynomial\",\"lr_scheduler_kwargs\":{\"power\":0.5}}}");
	kw = json_object_get(json_object_get(o, "training_args"), "lr_scheduler_kwargs");
	assert_int_equal(json_object_size(kw), 2);
	assert_true(json_real_value(json_object_get(kw, "lr_end")) == 1e-7); /* HF's default */
	assert_true(json_real_value(json_object_get(kw, "power")) == 0.5);
	assert_int_equal(jobspec_from_json(o, &s, &err), 0);
	assert_true(s.training.power == 0.5 && s.training.lr_end == 1e-7);
	json_t *again = NULL;
	assert_int_equal(jobspec_normalize(o, &again, &err), 0);
	assert_true(json_equal(o, again)); /* the filled form is effective */
	json_decref(again);
	json_decref(o);

	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"learning_rate\":0.001,"
			 "\"lr_scheduler_type\":\"cosine_with_min_lr\",\"lr_scheduler_kwargs\":{\"min_lr\":1e-5}}}");
	assert_int_equal(jobspec_from_json(o, &s, &err), 0);
	assert_true(fabs(s.training.min_lr_rate - 0.01) < 1e-15 && s.training.num_cycles == 0.5);
	json_decref(o);

	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"lr_scheduler_type\":\"warmup_stable_decay\","
			 "\"lr_scheduler_kwargs\":{\"num_stable_steps\":600,\"num_decay_steps\":300,"
			 "\"min_lr_ratio\":0.1}}}");
	assert_int_equal(jobspec_from_json(o, &s, &err), 0);
	assert_int_equal(s.training.num_stable_steps, 600);
	assert_int_equal(s.training.num_decay_steps, 300);
	assert_true(s.training.min_lr_ratio == 0.1 && s.training.num_cycles == 0.5);
	json_decref(o);

	static const char *const P = "training_args.lr_scheduler_kwargs.";
	static const struct {
		const char *ta, *field;
	} bad[] = {
		{"\"lr_scheduler_kwargs\":{\"power\":2}", "power"}, /* linear takes none */
		{"\"lr_scheduler_type\":\"polynomial\",\"lr_scheduler_kwargs\":{\"min_lr\":0}", "min_lr"},
		{"\"lr_scheduler_type\":\"polynomial\",\"lr_scheduler_kwargs\":{\"power\":0}", "power"},
		{"\"lr_scheduler_type\":\"polynomial\",\"lr_scheduler_kwargs\":{\"power\":\"1\"}", "power"},
		{"\"lr_scheduler_type\":\"polynomial\",\"lr_scheduler_kwargs\":{\"lr_end\":5e-5}", "lr_end"},
		{"\"lr_scheduler_type\":\"polynomial\",\"lr_scheduler_kwargs\":{\"lr_end\":-1}", "lr_end"},
		{"\"lr_scheduler_type\":\"cosine_with_min_lr\"", "min_lr_rate"},
		{"\"lr_scheduler_type\":\"cosine_with_min_lr\",\"lr_scheduler_kwargs\":{\"min_lr\":1e-6,"
		 "\"min_lr_rate\":0.1}", "min_lr"},
		{"\"lr_scheduler_type\":\"cosine_with_min_lr\",\"lr_scheduler_kwargs\":{\"min_lr\":1}", "min_lr"},
		{"\"lr_scheduler_type\":\"cosine_with_min_lr\",\"lr_scheduler_kwargs\":{\"min_lr_rate\":1.5}",
		 "min_lr_rate"},
		{"\"lr_scheduler_type\":\"cosine\",\"lr_scheduler_kwargs\":{\"num_cycles\":0}", "num_cycles"},
		{"\"lr_scheduler_type\":\"warmup_stable_decay\",\"lr_scheduler_kwargs\":{\"num_decay_steps\":3}",
		 "num_stable_steps"},
		{"\"lr_scheduler_type\":\"warmup_stable_decay\",\"lr_scheduler_kwargs\":{\"num_stable_steps\":3}",
		 "num_decay_steps"},
		{"\"lr_scheduler_type\":\"warmup_stable_decay\",\"lr_scheduler_kwargs\":{\"num_stable_steps\":3,"
		 "\"num_decay_steps\":2.5}", "num_decay_steps"},
		{"\"lr_scheduler_type\":\"warmup_stable_decay\",\"lr_scheduler_kwargs\":{\"num_stable_steps\":-1,"
		 "\"num_decay_steps\":2}", "num_stable_steps"},
		{"\"lr_scheduler_type\":\"warmup_stable_decay\",\"lr_scheduler_kwargs\":{\"num_stable_steps\":1,"
		 "\"num_decay_steps\":2,\"min_lr_ratio\":2}", "min_lr_ratio"},
	};
	char text[512], field[128];
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		snprintf(text, sizeof text, "{\"dataset\":\"x\",\"training_args\":{%s}}", bad[i].ta);
		snprintf(field, sizeof field, "%s%s", P, bad[i].field);
		expect_bad(text, 422, field);
	}
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"lr_scheduler_kwargs\":[1]}}", 422,
		   "training_args.lr_scheduler_kwargs");
}

/* A mixture: "dataset" as [{"name", "proportion"}]; the 422s name the
 * entry and key; one entry is the plain name; the typed view lists them. */
static void test_mixture(void **state)
{
	(void)state;
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": 0.7}, {\"name\": \"b\", "
		   "\"proportion\": 0.2}]}", 422, "dataset");
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": 0.7}, {\"name\": \"b\", "
		   "\"proportion\": 0}]}", 422, "dataset[1].proportion");
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": 1.3}, {\"name\": \"b\", "
		   "\"proportion\": -0.3}]}", 422, "dataset[0].proportion");
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": 0.5}, {\"name\": \"a\", "
		   "\"proportion\": 0.5}]}", 422, "dataset[1].name");
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": 0.5}, {\"name\": \"../b\", "
		   "\"proportion\": 0.5}]}", 422, "dataset[1].name");
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": 0.5}, {\"name\": \"b\", "
		   "\"weight\": 0.5}]}", 422, "dataset[1].weight");
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": 0.5}, \"b\"]}", 422, "dataset[1]");
	expect_bad("{\"dataset\": [{\"name\": \"a\", \"proportion\": \"0.5\"}, {\"name\": \"b\", "
		   "\"proportion\": 0.5}]}", 422, "dataset[0].proportion");
	expect_bad("{\"dataset\": []}", 422, "dataset");
	expect_bad("{\"dataset\": 7}", 422, "dataset");

	json_t *in = parse("{\"dataset\": [{\"proportion\": 0.7, \"name\": \"wiki\"}, "
			   "{\"name\": \"books\", \"proportion\": 0.3}], \"training_args\": {\"max_steps\": 10}}");
	json_t *out = NULL;
	jobspec_error err;
	assert_int_equal(jobspec_normalize(in, &out, &err), 0);
	json_t *ds = json_object_get(out, "dataset");
	assert_int_equal(json_array_size(ds), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(ds, 1), "name")), "books");
	assert_string_equal(json_string_value(json_object_get(out, "name")), "wiki_books");
	jobspec js;
	assert_int_equal(jobspec_from_json(out, &js, &err), 0);
	assert_int_equal(js.n_datasets, 2);
	assert_string_equal(js.dataset, "");
	assert_string_equal(js.datasets[0].name, "wiki");
	assert_true(js.datasets[0].proportion == 0.7 && js.datasets[1].proportion == 0.3);
	/* normalizing an effective mixture spec gives it back */
	json_t *again = NULL;
	assert_int_equal(jobspec_normalize(out, &again, &err), 0);
	assert_true(json_equal(out, again));
	json_decref(again);
	json_decref(out);
	json_decref(in);

	/* one entry is the plain name; the typed view has one component */
	in = parse("{\"dataset\": [{\"name\": \"wiki\", \"proportion\": 1}], \"training_args\": {\"max_steps\": 10}}");
	assert_int_equal(jobspec_normalize(in, &out, &err), 0);
	assert_string_equal(json_string_value(json_object_get(out, "dataset")), "wiki");
	assert_int_equal(jobspec_from_json(out, &js, &err), 0);
	assert_int_equal(js.n_datasets, 1);
	assert_string_equal(js.dataset, "wiki");
	assert_string_equal(js.datasets[0].name, "wiki");
	json_decref(out);
	json_decref(in);
}

/* Best-model keys (HF names): metric_for_best_model eval_loss by default,
 * "loss"/"accuracy" spelled as HF's eval_ prefix makes them;
 * greater_is_better resolved from the metric (true only for accuracy);
 * load_best_model_at_end needs eval_strategy "steps" and save_steps a round
 * multiple of eval_steps (422 naming the key). */
/* tags and notes: the documented limits (docs/jobspec.md), and
 * jobspec_check_key, which PATCH /v1/jobs/{id} validates with. */
static void test_tags_notes(void **state)
{
	(void)state;
	json_t *o = normalize_ok("{\"dataset\":\"x\",\"tags\":[\"git:1a2b3c\",\"exp/lr-sweep\",\"a@b+c=d\"],"
				 "\"notes\":\"line one\\n\\tline two\"}");
	assert_int_equal(json_array_size(get(o, NULL, "tags")), 3);
	assert_string_equal(json_string_value(json_array_get(get(o, NULL, "tags"), 1)), "exp/lr-sweep");
	assert_string_equal(gets_(o, NULL, "notes"), "line one\n\tline two");
	json_decref(o);
	char many[2048] = "{\"dataset\":\"x\",\"tags\":[";
	for (int i = 0; i < 17; i++)
		snprintf(many + strlen(many), sizeof many - strlen(many), "%s\"t%d\"", i ? "," : "", i);
	strcat(many, "]}");
	char long_tag[200], long_notes[4200 + 64];
	snprintf(long_tag, sizeof long_tag, "{\"dataset\":\"x\",\"tags\":[\"%065d\"]}", 0);
	snprintf(long_notes, sizeof long_notes, "{\"dataset\":\"x\",\"notes\":\"%04097d\"}", 0);
	const struct {
		const char *spec;
		const char *field;
	} bad[] = {
		{"{\"dataset\":\"x\",\"tags\":\"a\"}", "tags"},
		{"{\"dataset\":\"x\",\"tags\":[\"a\",1]}", "tags[1]"},
		{"{\"dataset\":\"x\",\"tags\":[\"\"]}", "tags[0]"},
		{"{\"dataset\":\"x\",\"tags\":[\"-a\"]}", "tags[0]"},
		{"{\"dataset\":\"x\",\"tags\":[\"a b\"]}", "tags[0]"},
		{"{\"dataset\":\"x\",\"tags\":[\"a\",\"b\",\"a\"]}", "tags[2]"},
		{many, "tags"},
		{long_tag, "tags[0]"},
		{"{\"dataset\":\"x\",\"notes\":5}", "notes"},
		{"{\"dataset\":\"x\",\"notes\":\"bell\\u0007\"}", "notes"},
		{long_notes, "notes"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		json_t *in = parse(bad[i].spec);
		expect_bad_json(in, 422, bad[i].field);
		json_decref(in);
	}
	/* exactly at the limits */
	many[strlen(many) - 2 - strlen(",\"t16\"")] = 0;
	strcat(many, "]}");
	o = normalize_ok(many);
	assert_int_equal(json_array_size(get(o, NULL, "tags")), 16);
	json_decref(o);

	jobspec_error err = {0};
	json_t *v = parse("7"), *res = NULL;
	assert_int_equal(jobspec_check_key("priority", v, &res, &err), 0);
	assert_int_equal(json_integer_value(res), 7);
	json_decref(res);
	assert_int_equal(jobspec_check_key("model", v, &res, &err), -EINVAL);
	assert_string_equal(err.field, "model");
	assert_null(res);
	json_decref(v);
	v = parse("101");
	assert_int_equal(jobspec_check_key("priority", v, &res, &err), -EINVAL);
	assert_string_equal(err.field, "priority");
	json_decref(v);
	v = json_null();
	assert_int_equal(jobspec_check_key("name", v, &res, &err), -EINVAL);
	assert_int_equal(jobspec_check_key("notes", v, &res, &err), 0);
	assert_true(json_is_null(res));
	json_decref(res);
	assert_int_equal(jobspec_check_key("tags", v, &res, &err), 0);
	assert_true(json_is_array(res) && json_array_size(res) == 0);
	json_decref(res);
	v = parse("[\"a\",\"a\"]");
	assert_int_equal(jobspec_check_key("tags", v, &res, &err), -EINVAL);
	assert_string_equal(err.field, "tags[1]");
	json_decref(v);
	/* preemptible: a boolean, changeable; null and other types refused */
	v = json_true();
	assert_int_equal(jobspec_check_key("preemptible", v, &res, &err), 0);
	assert_true(json_is_true(res));
	json_decref(res);
	v = json_null();
	assert_int_equal(jobspec_check_key("preemptible", v, &res, &err), -EINVAL);
	assert_string_equal(err.field, "preemptible");
	assert_non_null(strstr(err.detail, "boolean"));
	v = parse("\"yes\"");
	assert_int_equal(jobspec_check_key("preemptible", v, &res, &err), -EINVAL);
	assert_string_equal(err.field, "preemptible");
	json_decref(v);
}

/* A multi-node job is never preempted: "preemptible": true is refused for
 * it, naming the key; false (or left out) is accepted. */
static void test_multinode_not_preemptible(void **state)
{
	(void)state;
	expect_bad("{\"dataset\":\"x\",\"preemptible\":true,"
		   "\"resources\":{\"nodes\":2,\"gpus_per_node\":1}}", 422, "preemptible");
	json_t *o = normalize_ok("{\"dataset\":\"x\",\"preemptible\":false,"
				 "\"resources\":{\"nodes\":2,\"gpus_per_node\":1}}");
	assert_true(json_is_false(get(o, NULL, "preemptible")));
	json_decref(o);
	o = normalize_ok("{\"dataset\":\"x\",\"preemptible\":true,\"resources\":{\"nodes\":1}}");
	assert_true(json_is_true(get(o, NULL, "preemptible")));
	json_decref(o);
}

static void test_best_model_keys(void **state)
{
	(void)state;
	json_t *o = normalize_ok("{\"dataset\":\"x\"}");
	assert_string_equal(gets_(o, "training_args", "metric_for_best_model"), "eval_loss");
	assert_true(json_is_false(json_object_get(json_object_get(o, "training_args"), "greater_is_better")));
	assert_true(json_is_false(json_object_get(json_object_get(o, "training_args"), "load_best_model_at_end")));
	jobspec s;
	jobspec_error err;
	assert_int_equal(jobspec_from_json(o, &s, &err), 0);
	assert_string_equal(s.training.metric_for_best_model, "eval_loss");
	assert_int_equal(s.training.greater_is_better, 0);
	assert_false(s.training.load_best_model_at_end);
	json_decref(o);

	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"metric_for_best_model\":\"accuracy\"}}");
	assert_string_equal(gets_(o, "training_args", "metric_for_best_model"), "eval_accuracy");
	assert_true(json_is_true(json_object_get(json_object_get(o, "training_args"), "greater_is_better")));
	json_decref(o);
	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"metric_for_best_model\":\"perplexity\","
			 "\"greater_is_better\":null}}");
	assert_true(json_is_false(json_object_get(json_object_get(o, "training_args"), "greater_is_better")));
	json_decref(o);
	/* given explicitly, it stays (HF lets a user rank a loss upside down) */
	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"metric_for_best_model\":\"loss\","
			 "\"greater_is_better\":true}}");
	assert_string_equal(gets_(o, "training_args", "metric_for_best_model"), "eval_loss");
	assert_true(json_is_true(json_object_get(json_object_get(o, "training_args"), "greater_is_better")));
	json_decref(o);

	o = normalize_ok("{\"dataset\":\"x\",\"training_args\":{\"load_best_model_at_end\":true,"
			 "\"eval_strategy\":\"steps\",\"eval_steps\":5,\"save_steps\":10}}");
	assert_int_equal(jobspec_from_json(o, &s, &err), 0);
	assert_true(s.training.load_best_model_at_end);
	json_decref(o);

	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"load_best_model_at_end\":true}}", 422,
		   "training_args.load_best_model_at_end");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"load_best_model_at_end\":true,"
		   "\"eval_strategy\":\"steps\",\"eval_steps\":3,\"save_steps\":10}}", 422,
		   "training_args.save_steps");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"metric_for_best_model\":\"bleu\"}}", 422,
		   "training_args.metric_for_best_model");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"greater_is_better\":1}}", 422,
		   "training_args.greater_is_better");
	expect_bad("{\"dataset\":\"x\",\"training_args\":{\"load_best_model_at_end\":\"yes\"}}", 422,
		   "training_args.load_best_model_at_end");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_design_example),
		cmocka_unit_test(test_minimal_gets_every_default),
		cmocka_unit_test(test_presets_and_overrides),
		cmocka_unit_test(test_normalized_spellings),
		cmocka_unit_test(test_max_predictions_rule),
		cmocka_unit_test(test_bad_specs),
		cmocka_unit_test(test_edges_accepted),
		cmocka_unit_test(test_idempotence),
		cmocka_unit_test(test_from_json),
		cmocka_unit_test(test_hidden_act_tanh),
		cmocka_unit_test(test_hostile_input),
		cmocka_unit_test(test_docs_document_every_key),
		cmocka_unit_test(test_train_by_epochs),
		cmocka_unit_test(test_optim_hf_names),
		cmocka_unit_test(test_init_from_job),
		cmocka_unit_test(test_init_from_restore),
		cmocka_unit_test(test_openapi_matches_table),
		cmocka_unit_test(test_eval_keys),
		cmocka_unit_test(test_preset_dims),
		cmocka_unit_test(test_sched_kwargs),
		cmocka_unit_test(test_mixture),
		cmocka_unit_test(test_multinode_not_preemptible),
		cmocka_unit_test(test_best_model_keys),
		cmocka_unit_test(test_tags_notes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
