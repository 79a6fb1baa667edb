/* jobspec — validate a submitted job spec, fill its defaults, read it back.
 *
 * Every key lives in one table (name, kind, bounds, default, target field in
 * struct jobspec), in the order the effective spec prints it, so validation,
 * defaulting and the typed view cannot drift apart; docs/jobspec.md mirrors
 * the table and a unit test holds the two together. What a table row cannot
 * say (dims from a preset, cross-field rules, defaults derived from other
 * keys) is in cross_check(), run after every key has passed on its own.
 *
 * Must never: do I/O, log, keep state between calls, or echo a submitted
 * value into an error (errors end up in problem+json bodies and logs).
 */
#include "common/jobspec.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

enum kind {
	K_INT,      /* JSON integer within [imin, imax] */
	K_NUM,      /* JSON integer or real, finite, within dmin..dmax */
	K_BOOL,
	K_ENUM,     /* string from choices (aliases map to a canonical spelling) */
	K_NAME,     /* [A-Za-z0-9._-], first a letter or digit, imin..imax bytes */
	K_PATH,     /* absolute path, no ".." component, imin..imax bytes */
	K_INIT,     /* init_from: a K_PATH, or {"job": job id[, "checkpoint": step | "latest"]} */
	K_OBJECT,   /* any object, copied through unchanged */
	K_SECTION,  /* nested object described by sub */
	K_DATASET,  /* dataset: a K_NAME, or a mixture [{"name", "proportion"}, ...] */
	K_TAGS,     /* array of at most JOBSPEC_MAX_TAGS distinct tags (tag_ok), default [] */
	K_TEXT,     /* string of at most imax bytes, no control characters but \n and \t;
		     * default null */
};

enum target { T_NONE, T_INT, T_I64, T_U64, T_DBL, T_BOOL, T_TRI, T_STR };

#define NULLABLE  0x01u /* null is kept in the effective spec; it is the default */
#define LO_OPEN   0x02u /* K_NUM: the minimum itself is refused */
#define HI_OPEN   0x04u /* K_NUM: the maximum itself is refused */
#define DERIVED   0x08u /* absent/null: cross_check() resolves it from other keys */
#define REQUIRED  0x10u
#define ZERO_NULL 0x20u /* K_INT: 0 is accepted as a spelling of null */
#define MINUS_ONE 0x40u /* K_INT: -1 is accepted besides [imin, imax] */

struct choice {
	const char *in, *canon;
};

struct section;

struct field {
	const char *key;
	enum kind kind;
	unsigned flags;
	long long imin, imax, idef;    /* K_INT bounds/default; K_BOOL default; K_NAME/K_PATH length */
	double dmin, dmax, ddef;       /* K_NUM */
	const struct choice *choices;  /* K_ENUM, terminated by {NULL, NULL} */
	const char *sdef;              /* K_ENUM default */
	const struct section *sub;     /* K_SECTION */
	int preset_dim;                /* >= 0: default is presets[].dim[preset_dim] */
	enum target t;
	size_t off, size;              /* where jobspec_from_json writes it */
};

struct section {
	const struct field *f;
	size_t n;
};

#define OFF(m) offsetof(jobspec, m), sizeof(((jobspec *)0)->m)
#define INT(k, lo, hi, def, fl, tt, m) \
	{ .key = k, .kind = K_INT, .flags = fl, .imin = lo, .imax = hi, .idef = def, \
	  .preset_dim = -1, .t = tt, OFF(m) }
#define DIM(k, lo, hi, d, tt, m) \
	{ .key = k, .kind = K_INT, .imin = lo, .imax = hi, .preset_dim = d, .t = tt, OFF(m) }
#define NUM(k, lo, hi, def, fl, m) \
	{ .key = k, .kind = K_NUM, .flags = fl, .dmin = lo, .dmax = hi, .ddef = def, \
	  .preset_dim = -1, .t = T_DBL, OFF(m) }
#define BOOL(k, def, fl, tt, m) \
	{ .key = k, .kind = K_BOOL, .flags = fl, .idef = def, .preset_dim = -1, .t = tt, OFF(m) }
#define ENUM(k, ch, def, m) \
	{ .key = k, .kind = K_ENUM, .choices = ch, .sdef = def, .preset_dim = -1, .t = T_STR, OFF(m) }
#define SECTION(k, s) { .key = k, .kind = K_SECTION, .sub = &s, .preset_dim = -1, .t = T_NONE }

#define STEPS_MAX (1LL << 40) /* ~1.1e12: far past any run, far from overflow */

/* ---- model (BertConfig) ---- */

enum { D_HIDDEN, D_LAYERS, D_HEADS, D_INTER, N_DIMS };

static const struct {
	const char *name;
	int dim[N_DIMS];
} presets[] = {
	/* Google's BERT miniatures (Turc et al. 2019) and the two paper sizes. */
	{"bert-tiny", {128, 2, 2, 512}},
	{"bert-mini", {256, 4, 4, 1024}},
	{"bert-small", {512, 4, 8, 2048}},
	{"bert-medium", {512, 8, 8, 2048}},
	{"bert-base", {768, 12, 12, 3072}},
	{"bert-large", {1024, 24, 16, 4096}},
};

static const struct choice preset_choices[] = {
	{"bert-tiny", "bert-tiny"}, {"bert-mini", "bert-mini"}, {"bert-small", "bert-small"},
	{"bert-medium", "bert-medium"}, {"bert-base", "bert-base"}, {"bert-large", "bert-large"},
	{NULL, NULL},
};
/* GELU: the exact erf form (HF "gelu") or the tanh form (HF "gelu_new" and
 * "gelu_pytorch_tanh", kept apart so an export writes back the same name). */
static const struct choice act_choices[] = {
	{"gelu", "gelu"}, {"gelu_new", "gelu_new"}, {"gelu_pytorch_tanh", "gelu_pytorch_tanh"},
	{NULL, NULL},
};

static const struct field model_fields[] = {
	ENUM("preset", preset_choices, "bert-base", model.preset),
	INT("vocab_size", 1, 1 << 22, 0, NULLABLE | ZERO_NULL, T_INT, model.vocab_size),
	DIM("hidden_size", 1, 16384, D_HIDDEN, T_INT, model.hidden_size),
	DIM("num_hidden_layers", 1, 128, D_LAYERS, T_INT, model.num_hidden_layers),
	DIM("num_attention_heads", 1, 256, D_HEADS, T_INT, model.num_attention_heads),
	DIM("intermediate_size", 1, 65536, D_INTER, T_INT, model.intermediate_size),
	ENUM("hidden_act", act_choices, "gelu", model.hidden_act),
	NUM("hidden_dropout_prob", 0, 1, 0.1, HI_OPEN, model.hidden_dropout_prob),
	NUM("attention_probs_dropout_prob", 0, 1, 0.1, HI_OPEN, model.attention_probs_dropout_prob),
	INT("max_position_embeddings", 8, 65536, 512, 0, T_INT, model.max_position_embeddings),
	INT("type_vocab_size", 1, 1024, 2, 0, T_INT, model.type_vocab_size),
	NUM("initializer_range", 0, 1, 0.02, LO_OPEN, model.initializer_range),
	NUM("layer_norm_eps", 0, 1, 1e-12, LO_OPEN | HI_OPEN, model.layer_norm_eps),
};

/* ---- training_args (TrainingArguments) ---- */

static const struct choice sched_choices[] = {
	{"linear", "linear"}, {"cosine", "cosine"}, {"constant", "constant"},
	{"constant_with_warmup", "constant_with_warmup"}, {"polynomial", "polynomial"},
	{"cosine_with_min_lr", "cosine_with_min_lr"}, {"warmup_stable_decay", "warmup_stable_decay"},
	{NULL, NULL},
};
static const struct choice reduce_choices[] = {
	{"fp32", "fp32"}, {"float32", "fp32"}, {"bf16", "bf16"}, {"bfloat16", "bf16"},
	{"fp16", "fp16"}, {"float16", "fp16"}, {NULL, NULL},
};

/* The held-out metrics a checkpoint can be ranked by (worker/eval.c); HF
 * prefixes "eval_" to a name without it, so "loss" and "accuracy" are the
 * same keys. */
static const struct choice best_metric_choices[] = {
	{"eval_loss", "eval_loss"}, {"loss", "eval_loss"}, {"perplexity", "perplexity"},
	{"eval_perplexity", "perplexity"}, {"eval_accuracy", "eval_accuracy"},
	{"accuracy", "eval_accuracy"}, {NULL, NULL},
};

/* HF's IntervalStrategy; "epoch" is not implemented (bertd steps only). */
static const struct choice eval_choices[] = {{"no", "no"}, {"steps", "steps"}, {NULL, NULL}};

/* The update is torch.optim.AdamW's; adamw_torch_fused is torch's fused
 * kernel of the same update. transformers' own AdamW ("adamw_hf") is not:
 * its epsilon is added before the bias correction and its weight decay
 * after the step, so it is refused with the rest of hf_only_optims. */
static const struct choice optim_choices[] = {
	{"adamw", "adamw"}, {"adamw_torch", "adamw"}, {"adamw_torch_fused", "adamw"},
	{"lamb", "lamb"}, {NULL, NULL},
};

/* TrainingArguments.optim values (transformers 4.44 OptimizerNames) that
 * bertd does not implement: named so the refusal can say so. */
static const char *const hf_only_optims[] = {
	"adamw_hf", "adamw_torch_xla", "adamw_torch_npu_fused", "adamw_apex_fused", "adafactor",
	"adamw_anyprecision", "sgd", "adagrad", "adamw_bnb_8bit", "adamw_8bit", "lion_8bit",
	"lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit", "paged_lion_32bit",
	"paged_lion_8bit", "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
	"galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
	"galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "lomo", "adalomo", NULL,
};

static const struct field training_fields[] = {
	INT("per_device_train_batch_size", 1, 65536, 8, 0, T_INT, training.per_device_train_batch_size),
	INT("gradient_accumulation_steps", 1, 65536, 1, 0, T_INT, training.gradient_accumulation_steps),
	NUM("learning_rate", 0, 1, 5e-5, LO_OPEN, training.learning_rate),
	ENUM("lr_scheduler_type", sched_choices, "linear", training.lr_scheduler_type),
	/* checked and filled per schedule by check_sched_kwargs() */
	{.key = "lr_scheduler_kwargs", .kind = K_OBJECT, .preset_dim = -1, .t = T_NONE},
	INT("warmup_steps", 0, STEPS_MAX, 0, 0, T_I64, training.warmup_steps),
	NUM("warmup_ratio", 0, 1, 0.0, 0, training.warmup_ratio),
	NUM("weight_decay", 0, 1, 0.0, 0, training.weight_decay),
	NUM("adam_beta1", 0, 1, 0.9, HI_OPEN, training.adam_beta1),
	NUM("adam_beta2", 0, 1, 0.999, HI_OPEN, training.adam_beta2),
	NUM("adam_epsilon", 0, 1, 1e-8, LO_OPEN | HI_OPEN, training.adam_epsilon),
	NUM("max_grad_norm", 0, 1e6, 1.0, 0, training.max_grad_norm),
	NUM("num_train_epochs", 0, 1e6, 0, NULLABLE | LO_OPEN, training.num_train_epochs),
	INT("max_steps", 1, STEPS_MAX, 0, MINUS_ONE | DERIVED, T_I64, training.max_steps),
	INT("max_seq_length", 8, 65536, 128, 0, T_INT, training.max_seq_length),
	ENUM("optim", optim_choices, "adamw", training.optim),
	BOOL("bf16", 0, NULLABLE, T_TRI, training.bf16),
	BOOL("fp16", 0, NULLABLE, T_TRI, training.fp16),
	INT("seed", 0, INT64_MAX, 42, 0, T_U64, training.seed),
	INT("logging_steps", 1, STEPS_MAX, 50, 0, T_I64, training.logging_steps),
	INT("save_steps", 1, STEPS_MAX, 500, 0, T_I64, training.save_steps),
	INT("save_total_limit", 1, 1000, 3, 0, T_INT, training.save_total_limit),
	INT("dataloader_num_workers", 0, 64, 2, 0, T_INT, training.dataloader_num_workers),
	BOOL("dataloader_pin_memory", 1, 0, T_BOOL, training.dataloader_pin_memory),
	ENUM("ddp_reduce_dtype", reduce_choices, "fp32", training.ddp_reduce_dtype),
	ENUM("eval_strategy", eval_choices, "no", training.eval_strategy),
	INT("eval_steps", 1, STEPS_MAX, 0, DERIVED, T_I64, training.eval_steps),
	INT("per_device_eval_batch_size", 1, 65536, 8, 0, T_INT, training.per_device_eval_batch_size),
	INT("max_eval_batches", 1, 1000000, 100, 0, T_INT, training.max_eval_batches),
	ENUM("metric_for_best_model", best_metric_choices, "eval_loss", training.metric_for_best_model),
	BOOL("greater_is_better", 0, NULLABLE | DERIVED, T_TRI, training.greater_is_better),
	BOOL("load_best_model_at_end", 0, 0, T_BOOL, training.load_best_model_at_end),
};

/* ---- mlm (DataCollatorForLanguageModeling + BERT's data recipe) ---- */

static const struct field mlm_fields[] = {
	NUM("mlm_probability", 0, 1, 0.15, LO_OPEN | HI_OPEN, mlm.mlm_probability),
	NUM("mask_replace_prob", 0, 1, 0.8, 0, mlm.mask_replace_prob),
	NUM("random_replace_prob", 0, 1, 0.1, 0, mlm.random_replace_prob),
	BOOL("whole_word_mask", 0, 0, T_BOOL, mlm.whole_word_mask),
	BOOL("nsp", 0, 0, T_BOOL, mlm.nsp),
	INT("max_predictions_per_seq", 1, 65536, 0, DERIVED, T_INT, mlm.max_predictions_per_seq),
	NUM("short_seq_prob", 0, 1, 0.1, 0, mlm.short_seq_prob),
	INT("validation_split_percentage", 0, 99, 0, DERIVED, T_INT, mlm.validation_split_percentage),
	/* bertd's own: the packing that cuts long sentences and drops the rest */
	BOOL("drop_long_sentences", 0, 0, T_BOOL, mlm.drop_long_sentences),
};

/* ---- resources, stopping_condition, retry_policy, profiler ---- */

/* init_from_restore: the weights only (a new run), or everything a resume
 * restores (HF's resume_from_checkpoint: continue that run) */
static const struct choice restore_choices[] = {{"weights", "weights"}, {"all", "all"}, {NULL, NULL}};
static const struct choice device_choices[] = {
	{"auto", "auto"}, {"cuda", "cuda"}, {"cpu", "cpu"}, {NULL, NULL},
};

static const struct field resources_fields[] = {
	INT("gpus", 1, 64, 1, 0, T_INT, gpus),
	ENUM("device", device_choices, "auto", device),
	INT("nodes", 1, 64, 1, 0, T_INT, nodes),
	INT("gpus_per_node", 1, 64, 0, NULLABLE, T_INT, gpus_per_node),
};

static const struct field stopping_fields[] = {
	INT("max_runtime_seconds", 1, STEPS_MAX, 0, NULLABLE, T_I64, max_runtime_seconds),
};

static const struct field retry_fields[] = {
	INT("max_restarts", 0, 100, 3, 0, T_INT, max_restarts),
};

/* rules: validated by the telemetry rules (daemon/diagnosis.c).
 * simulate_data_delay_ms: every batch takes this much longer to produce, in
 * a loader or on the serial path (loader/batchjob.h) — a slow data source on
 * demand, to see the diagnosis and size dataloader_num_workers for it. */
static const struct field profiler_fields[] = {
	{.key = "rules", .kind = K_OBJECT, .preset_dim = -1, .t = T_NONE},
	INT("simulate_data_delay_ms", 0, 10000, 0, 0, T_INT, simulate_data_delay_ms),
};

#define SEC(a) { a, sizeof a / sizeof a[0] }
static const struct section model_sec = SEC(model_fields);
static const struct section training_sec = SEC(training_fields);
static const struct section mlm_sec = SEC(mlm_fields);
static const struct section resources_sec = SEC(resources_fields);
static const struct section stopping_sec = SEC(stopping_fields);
static const struct section retry_sec = SEC(retry_fields);
static const struct section profiler_sec = SEC(profiler_fields);

static const struct field top_fields[] = {
	{.key = "name", .kind = K_NAME, .flags = DERIVED, .imin = 1, .imax = 128,
	 .preset_dim = -1, .t = T_STR, OFF(name)},
	{.key = "dataset", .kind = K_DATASET, .flags = REQUIRED, .imin = 1, .imax = 64,
	 .preset_dim = -1, .t = T_STR, OFF(dataset)},
	SECTION("model", model_sec),
	{.key = "init_from", .kind = K_INIT, .flags = NULLABLE, .imin = 1, .imax = 1023,
	 .preset_dim = -1, .t = T_STR, OFF(init_from)},
	ENUM("init_from_restore", restore_choices, "weights", init_from_restore),
	INT("priority", -100, 100, 0, 0, T_INT, priority),
	/* a running job of lower priority than a waiting one may be stopped at
	 * a checkpoint and queued again (daemon/scheduler.h); opt-in */
	BOOL("preemptible", 0, 0, T_BOOL, preemptible),
	/* labels and a free text for people and list filters; never read by
	 * the worker, and changeable after submit (PATCH /v1/jobs/{id}) */
	{.key = "tags", .kind = K_TAGS, .imin = 1, .imax = JOBSPEC_TAG_MAX, .preset_dim = -1,
	 .t = T_NONE},
	{.key = "notes", .kind = K_TEXT, .imax = JOBSPEC_NOTES_MAX, .preset_dim = -1, .t = T_NONE},
	SECTION("training_args", training_sec),
	SECTION("mlm", mlm_sec),
	SECTION("resources", resources_sec),
	SECTION("stopping_condition", stopping_sec),
	SECTION("retry_policy", retry_sec),
	SECTION("profiler", profiler_sec),
};
static const struct section top_sec = SEC(top_fields);

/* Older spellings of keys that HF renamed: accepted on input, written with
 * the new name in the effective spec; giving both is refused. */
static const struct key_alias {
	const struct section *sec;
	const char *old, *canon;
} key_aliases[] = {
	{&training_sec, "evaluation_strategy", "eval_strategy"},
};
#define N_KEY_ALIASES (sizeof key_aliases / sizeof key_aliases[0])

static const struct key_alias *alias_find(const struct section *s, const char *key, size_t n)
{
	for (size_t i = 0; i < N_KEY_ALIASES; i++)
		if (key_aliases[i].sec == s && strlen(key_aliases[i].old) == n &&
		    memcmp(key_aliases[i].old, key, n) == 0)
			return &key_aliases[i];
	return NULL;
}

/* The value of f in obj, under its name or an older spelling of it. */
static json_t *field_value(json_t *obj, const struct section *s, const struct field *f)
{
	json_t *v = obj ? json_object_get(obj, f->key) : NULL;
	for (size_t i = 0; !v && obj && i < N_KEY_ALIASES; i++)
		if (key_aliases[i].sec == s && strcmp(key_aliases[i].canon, f->key) == 0)
			v = json_object_get(obj, key_aliases[i].old);
	return v;
}

/* ---- errors ---- */

/* Copies at most cap-1 bytes of s, backing off so a multi-byte UTF-8
 * sequence is never cut (the field goes into a JSON string). */
static size_t utf8_copy(char *dst, size_t cap, const char *s, size_t n)
{
	if (n > cap - 1) {
		n = cap - 1;
		while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
			n--;
	}
	memcpy(dst, s, n);
	dst[n] = '\0';
	return n;
}

__attribute__((format(printf, 5, 6)))
static int fail(jobspec_error *err, int status, const char *prefix, const char *key,
		const char *fmt, ...)
{
	err->status = status;
	err->field[0] = '\0';
	size_t n = 0;
	if (prefix && *prefix) {
		n = utf8_copy(err->field, sizeof err->field, prefix, strlen(prefix));
		if (key && n + 1 < sizeof err->field)
			err->field[n++] = '.';
	}
	if (key)
		utf8_copy(err->field + n, sizeof err->field - n, key, strlen(key));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->detail, sizeof err->detail, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int fail_oom(jobspec_error *err)
{
	err->status = 500;
	err->field[0] = '\0';
	snprintf(err->detail, sizeof err->detail, "out of memory");
	return -ENOMEM;
}

/* ---- one value ---- */

struct ctx {
	jobspec_error *err;
	int preset;  /* index into presets[], set when model.preset is read */
};

static const char *bound_text(char *buf, size_t cap, const struct field *f)
{
	snprintf(buf, cap, "must be %s %.10g and %s %.10g", f->flags & LO_OPEN ? ">" : ">=",
		 f->dmin, f->flags & HI_OPEN ? "<" : "<=", f->dmax);
	return buf;
}

static bool name_ok(const char *s, size_t n, const struct field *f)
{
	if ((long long)n < f->imin || (long long)n > f->imax)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
			return false;
	}
	return true;
}

/* A tag: imin..imax bytes of A-Z a-z 0-9 and . _ - : / @ + =, starting
 * with a letter or digit (a git sha, "exp:lr-sweep", "user@team"). */
static bool tag_ok(const char *s, size_t n, const struct field *f)
{
	if ((long long)n < f->imin || (long long)n > f->imax)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || !strchr("._-:/@+=", c) || c == 0))
			return false;
	}
	return true;
}

static int tags_normalize(const json_t *v, const struct field *f, const char *path,
			  jobspec_error *err, json_t **res)
{
	if (!json_is_array(v))
		return fail(err, 422, path, f->key, "must be an array of strings");
	if (json_array_size(v) > JOBSPEC_MAX_TAGS)
		return fail(err, 422, path, f->key, "must have at most %d tags", JOBSPEC_MAX_TAGS);
	char sub[64];
	for (size_t i = 0; i < json_array_size(v); i++) {
		json_t *t = json_array_get(v, i);
		snprintf(sub, sizeof sub, "%s[%zu]", f->key, i);
		if (!json_is_string(t) || !tag_ok(json_string_value(t), json_string_length(t), f))
			return fail(err, 422, path, sub,
				    "must be a string of %lld to %lld characters of A-Z a-z 0-9 "
				    ". _ - : / @ + =, starting with a letter or digit", f->imin, f->imax);
		for (size_t j = 0; j < i; j++)
			if (json_equal(t, json_array_get(v, j)))
				return fail(err, 422, path, sub, "repeats %s[%zu]", f->key, j);
	}
	*res = json_deep_copy(v);
	return *res ? 0 : fail_oom(err);
}

static const char *text_problem(const char *s, size_t n, const struct field *f)
{
	if ((long long)n > f->imax)
		return "must be at most 4096 bytes";
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
			return "must not contain NUL or control characters other than newline and tab";
	}
	return NULL;
}

static const char *path_problem(const char *s, size_t n, const struct field *f)
{
	if ((long long)n < f->imin || (long long)n > f->imax || s[0] != '/')
		return "must be an absolute path of at most 1023 bytes";
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return "must not contain NUL or control characters";
	/* A ".." component could climb out of the data roots the API checks. */
	for (size_t i = 0; i < n; i++)
		if (s[i] == '/' && n - i >= 3 && s[i + 1] == '.' && s[i + 2] == '.' &&
		    (n - i == 3 || s[i + 3] == '/'))
			return "must not contain a \"..\" component";
	return NULL;
}

static void choices_text(char *buf, size_t cap, const struct choice *ch)
{
	size_t n = (size_t)snprintf(buf, cap, "must be one of:");
	for (const struct choice *c = ch; c->in && n < cap; c++)
		n += (size_t)snprintf(buf + n, cap - n, "%s %s", c == ch ? "" : ",", c->in);
}

static int section_normalize(const json_t *in, const struct section *s, const char *path,
			     json_t *out, struct ctx *c);

static bool is_hf_only_optim(const json_t *v)
{
	for (const char *const *o = hf_only_optims; *o; o++)
		if (strlen(*o) == json_string_length(v) && strcmp(*o, json_string_value(v)) == 0)
			return true;
	return false;
}

/* A job id: "job-" and 16 lowercase hex digits. */
static bool job_id_ok(const json_t *v)
{
	if (!json_is_string(v) || json_string_length(v) != 20)
		return false;
	const char *s = json_string_value(v);
	if (strncmp(s, "job-", 4) != 0)
		return false;
	for (int i = 4; i < 20; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* init_from as {"job": <job id>} (that job's HF export) or {"job": <job id>,
 * "checkpoint": <step> | "latest"}: only the shape is checked here; the API
 * resolves it to a directory before the spec is stored. */
static int init_job_normalize(const json_t *v, const char *path, jobspec_error *err, json_t **res)
{
	json_t *obj = (json_t *)v;
	const char *key;
	size_t len;
	json_t *x;
	char sub[64];
	snprintf(sub, sizeof sub, "%s%sinit_from", path ? path : "", path ? "." : "");
	json_object_keylen_foreach(obj, key, len, x) {
		if (!((len == 3 && memcmp(key, "job", 3) == 0) ||
		      (len == 10 && memcmp(key, "checkpoint", 10) == 0)))
			return fail(err, 422, sub, key, "unknown key (init_from takes job and checkpoint)");
	}
	json_t *job = json_object_get(obj, "job"), *ck = json_object_get(obj, "checkpoint");
	if (!job_id_ok(job))
		return fail(err, 422, sub, "job", "must be a job id (\"job-\" and 16 hex digits)");
	json_t *ckv;
	if (!ck || json_is_null(ck)) {
		*res = json_pack("{s:s}", "job", json_string_value(job));
		return *res ? 0 : fail_oom(err);
	}
	if (json_is_string(ck) && strcmp(json_string_value(ck), "latest") == 0 &&
	    json_string_length(ck) == 6)
		ckv = json_string("latest");
	else if (json_is_integer(ck) && json_integer_value(ck) >= 0 &&
		 json_integer_value(ck) <= STEPS_MAX)
		ckv = json_integer(json_integer_value(ck));
	else
		return fail(err, 422, sub, "checkpoint",
			    "must be a step (an integer between 0 and %lld) or \"latest\"", STEPS_MAX);
	*res = json_pack("{s:s, s:o}", "job", json_string_value(job), "checkpoint", ckv);
	return *res ? 0 : fail_oom(err);
}

/* dataset as a mixture: 1..JOBSPEC_MAX_DATASETS objects {"name": a dataset
 * name, "proportion": > 0}, names distinct, proportions summing to 1 within
 * JOBSPEC_PROPORTION_TOLERANCE. One entry is the plain name (the same job as
 * "dataset": name); more are kept as [{"name", "proportion"}, ...] in the
 * submitted order, proportions as reals. */
static int dataset_mix_normalize(const json_t *v, const struct field *f, jobspec_error *err,
				 json_t **res)
{
	size_t n = json_array_size(v);
	char sub[32];
	if (n < 1 || n > JOBSPEC_MAX_DATASETS)
		return fail(err, 422, NULL, "dataset",
			    "as a mixture must list 1 to %d datasets", JOBSPEC_MAX_DATASETS);
	double sum = 0;
	json_t *out = json_array();
	if (!out)
		return fail_oom(err);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(v, i), *x;
		const char *key;
		size_t len;
		snprintf(sub, sizeof sub, "dataset[%zu]", i);
		if (!json_is_object(e)) {
			json_decref(out);
			return fail(err, 422, NULL, sub, "must be an object {\"name\", \"proportion\"}");
		}
		json_object_keylen_foreach(e, key, len, x) {
			if (!((len == 4 && memcmp(key, "name", 4) == 0) ||
			      (len == 10 && memcmp(key, "proportion", 10) == 0))) {
				json_decref(out);
				return fail(err, 422, sub, key, "unknown key (a mixture entry takes name and proportion)");
			}
		}
		json_t *name = json_object_get(e, "name"), *prop = json_object_get(e, "proportion");
		if (!json_is_string(name) || !name_ok(json_string_value(name), json_string_length(name), f)) {
			json_decref(out);
			return fail(err, 422, sub, "name",
				    "must be a dataset name: %lld to %lld characters of A-Z a-z 0-9 . _ -, "
				    "starting with a letter or digit", f->imin, f->imax);
		}
		for (size_t j = 0; j < i; j++)
			if (strcmp(json_string_value(json_object_get(json_array_get(out, j), "name")),
				   json_string_value(name)) == 0) {
				json_decref(out);
				return fail(err, 422, sub, "name", "lists the same dataset as dataset[%zu]", j);
			}
		double p = json_is_number(prop) ? json_number_value(prop) : NAN;
		if (!isfinite(p) || p <= 0 || p > 1) {
			json_decref(out);
			return fail(err, 422, sub, "proportion", "must be a number > 0 and <= 1");
		}
		sum += p;
		if (json_array_append_new(out, json_pack("{s:s, s:f}", "name", json_string_value(name),
							 "proportion", p)) < 0) {
			json_decref(out);
			return fail_oom(err);
		}
	}
	if (fabs(sum - 1.0) > JOBSPEC_PROPORTION_TOLERANCE) {
		json_decref(out);
		return fail(err, 422, NULL, "dataset",
			    "proportions must sum to 1 (within %g)", JOBSPEC_PROPORTION_TOLERANCE);
	}
	if (n == 1) {
		*res = json_incref(json_object_get(json_array_get(out, 0), "name"));
		json_decref(out);
		return 0;
	}
	*res = out;
	return 0;
}

/* Validates v (NULL when absent) against f and returns the effective value in
 * *res (new reference); *res = NULL means "leave for cross_check()". */
static int field_normalize(const json_t *v, const struct field *f, const char *path,
			   struct ctx *c, json_t **res)
{
	jobspec_error *err = c->err;
	char buf[200];
	*res = NULL;
	if (v && json_is_null(v))
		v = NULL; /* null always means "the default", which may be null itself */
	if (!v && (f->flags & REQUIRED))
		return fail(err, 422, path, f->key, "required");

	switch (f->kind) {
	case K_INT: {
		if (!v) {
			if (f->flags & DERIVED)
				return 0;
			if (f->flags & NULLABLE)
				*res = json_null();
			else if (f->preset_dim >= 0)
				*res = json_integer(presets[c->preset].dim[f->preset_dim]);
			else
				*res = json_integer(f->idef);
			break;
		}
		if (!json_is_integer(v))
			return fail(err, 422, path, f->key, "must be an integer%s",
				    f->flags & NULLABLE ? " or null" : "");
		json_int_t x = json_integer_value(v);
		if ((f->flags & ZERO_NULL) && x == 0) {
			*res = json_null();
			break;
		}
		if ((x < f->imin || x > f->imax) && !((f->flags & MINUS_ONE) && x == -1))
			return fail(err, 422, path, f->key, "must be between %lld and %lld%s", f->imin,
				    f->imax, f->flags & ZERO_NULL ? " (or 0/null)"
				    : f->flags & MINUS_ONE ? " (or -1)" : "");
		*res = json_integer(x);
		break;
	}
	case K_NUM: {
		if (!v) {
			*res = f->flags & NULLABLE ? json_null() : json_real(f->ddef);
			break;
		}
		if (!json_is_number(v))
			return fail(err, 422, path, f->key, "must be a number");
		double x = json_number_value(v);
		bool lo = f->flags & LO_OPEN ? x > f->dmin : x >= f->dmin;
		bool hi = f->flags & HI_OPEN ? x < f->dmax : x <= f->dmax;
		if (!isfinite(x) || !lo || !hi)
			return fail(err, 422, path, f->key, "%s", bound_text(buf, sizeof buf, f));
		*res = json_real(x);
		break;
	}
	case K_BOOL:
		if (!v) {
			*res = f->flags & NULLABLE ? json_null() : json_boolean(f->idef);
			break;
		}
		if (!json_is_boolean(v))
			return fail(err, 422, path, f->key, "must be a boolean%s",
				    f->flags & NULLABLE ? " or null" : "");
		*res = json_boolean(json_is_true(v));
		break;
	case K_ENUM: {
		const char *s = f->sdef;
		if (v) {
			if (!json_is_string(v))
				return fail(err, 422, path, f->key, "must be a string");
			const struct choice *ch = f->choices;
			while (ch->in && strcmp(ch->in, json_string_value(v)) != 0)
				ch++;
			/* strcmp stops at an embedded NUL; the length check does not. */
			if (!ch->in || strlen(ch->in) != json_string_length(v)) {
				choices_text(buf, sizeof buf, f->choices);
				if (f->choices == optim_choices && is_hf_only_optim(v))
					return fail(err, 422, path, f->key,
						    "is a TrainingArguments optimizer bertd does not implement; "
						    "%s (the first three are torch.optim.AdamW)", buf);
				return fail(err, 422, path, f->key, "%s", buf);
			}
			s = ch->canon;
		}
		if (f->choices == preset_choices)
			for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
				if (strcmp(presets[i].name, s) == 0)
					c->preset = (int)i;
		*res = json_string(s);
		break;
	}
	case K_DATASET:
		if (v && json_is_array(v))
			return dataset_mix_normalize(v, f, err, res);
		if (v && !json_is_string(v))
			return fail(err, 422, path, f->key,
				    "must be a dataset name or a mixture [{\"name\", \"proportion\"}, ...]");
		/* one dataset by name: */
		/* fall through */
	case K_NAME:
		if (!v) {
			if (f->flags & DERIVED)
				return 0;
			*res = json_null();
			break;
		}
		if (!json_is_string(v))
			return fail(err, 422, path, f->key, "must be a string");
		if (!name_ok(json_string_value(v), json_string_length(v), f))
			return fail(err, 422, path, f->key,
				    "must be %lld to %lld characters of A-Z a-z 0-9 . _ -, "
				    "starting with a letter or digit", f->imin, f->imax);
		*res = json_stringn(json_string_value(v), json_string_length(v));
		break;
	case K_INIT:
		if (v && json_is_object(v))
			return init_job_normalize(v, path, err, res);
		/* fall through */
	case K_PATH: {
		if (!v) {
			*res = json_null();
			break;
		}
		if (!json_is_string(v))
			return fail(err, 422, path, f->key, "must be a string%s or null",
				    f->kind == K_INIT ? ", an object {\"job\", \"checkpoint\"}" : "");
		const char *why = path_problem(json_string_value(v), json_string_length(v), f);
		if (why)
			return fail(err, 422, path, f->key, "%s", why);
		*res = json_stringn(json_string_value(v), json_string_length(v));
		break;
	}
	case K_TAGS:
		if (!v) {
			*res = json_array();
			break;
		}
		return tags_normalize(v, f, path, err, res);
	case K_TEXT: {
		if (!v) {
			*res = json_null();
			break;
		}
		if (!json_is_string(v))
			return fail(err, 422, path, f->key, "must be a string or null");
		const char *why = text_problem(json_string_value(v), json_string_length(v), f);
		if (why)
			return fail(err, 422, path, f->key, "%s", why);
		*res = json_stringn(json_string_value(v), json_string_length(v));
		break;
	}
	case K_OBJECT:
		if (!v) {
			*res = json_object();
			break;
		}
		if (!json_is_object(v))
			return fail(err, 422, path, f->key, "must be an object");
		*res = json_deep_copy(v);
		break;
	case K_SECTION: {
		if (v && !json_is_object(v))
			return fail(err, 422, path, f->key, "must be an object");
		json_t *o = json_object();
		if (!o)
			return fail_oom(err);
		int rc = section_normalize(v, f->sub, f->key, o, c);
		if (rc < 0) {
			json_decref(o);
			return rc;
		}
		*res = o;
		break;
	}
	}
	return *res ? 0 : fail_oom(err);
}

static const struct field *section_find(const struct section *s, const char *key, size_t n)
{
	for (size_t i = 0; i < s->n; i++)
		if (strlen(s->f[i].key) == n && memcmp(s->f[i].key, key, n) == 0)
			return &s->f[i];
	return NULL;
}

/* Fills out with s's keys in table order. in may be NULL (section absent). */
static int section_normalize(const json_t *in, const struct section *s, const char *path,
			     json_t *out, struct ctx *c)
{
	json_t *obj = (json_t *)in; /* jansson's getters are not const-correct */
	const char *key;
	size_t len;
	json_t *v;
	/* Unknown keys first: a typo must not silently leave a default in place.
	 * The length matters: jansson keys may hold a NUL ("seed\0x" is not "seed"). */
	json_object_keylen_foreach(obj, key, len, v) {
		if (section_find(s, key, len))
			continue;
		const struct key_alias *a = alias_find(s, key, len);
		if (!a)
			return fail(c->err, 422, path, key, "unknown key");
		if (json_object_get(obj, a->canon))
			return fail(c->err, 422, path, key, "is the older spelling of %s: give one of them",
				    a->canon);
	}
	for (size_t i = 0; i < s->n; i++) {
		const struct field *f = &s->f[i];
		json_t *res;
		int rc = field_normalize(field_value(obj, s, f), f, path, c, &res);
		if (rc < 0)
			return rc;
		if (!res)
			res = json_null(); /* DERIVED: cross_check() replaces it */
		if (json_object_set_new(out, f->key, res) < 0)
			return fail_oom(c->err);
	}
	return 0;
}

/* ---- cross-field rules ---- */

int jobspec_default_max_predictions(int max_seq_length, double mlm_probability)
{
	/* The epsilon keeps an exact multiple of 4 (up to rounding) from
	 * jumping to the next one. */
	double q = ceil((double)max_seq_length * mlm_probability / 4.0 - 1e-9);
	long long n = (long long)q * 4;
	if (n < 1)
		n = 1;
	if (n > max_seq_length)
		n = max_seq_length;
	return (int)n;
}

static json_t *at(json_t *spec, const char *sec, const char *key)
{
	return json_object_get(json_object_get(spec, sec), key);
}

static long long ival(json_t *spec, const char *sec, const char *key)
{
	return json_integer_value(at(spec, sec, key));
}

/* resources.nodes x gpus_per_node (docs/multinode.md): the ranks are
 * nodes * gpus_per_node, written into gpus so that every count of ranks
 * downstream (epochs, the worker's world) stays one number. gpus_per_node
 * null: gpus on one node. A multi-node job's loaders run on every node
 * (the worker's nodeloaders.h). */
static int check_nodes(json_t *o, jobspec_error *err)
{
	json_t *res = json_object_get(o, "resources");
	long long nodes = ival(o, "resources", "nodes"), gpus = ival(o, "resources", "gpus");
	json_t *gpn = json_object_get(res, "gpus_per_node");
	if (json_is_null(gpn)) {
		if (nodes > 1)
			return fail(err, 422, "resources", "gpus_per_node",
				    "is required when resources.nodes is above 1");
		return 0;
	}
	long long per = json_integer_value(gpn), world = nodes * per;
	if (world > 64)
		return fail(err, 422, "resources", "gpus_per_node",
			    "times resources.nodes must be at most 64 ranks");
	if (gpus != 1 && gpus != world)
		return fail(err, 422, "resources", "gpus",
			    "must be resources.nodes * gpus_per_node (%lld) or left out", world);
	if (json_object_set_new(res, "gpus", json_integer(world)) < 0)
		return fail_oom(err);
	return 0;
}

/* lr_scheduler_kwargs: the keyword arguments transformers' get_scheduler
 * (4.44) passes to the schedule lr_scheduler_type names, with their defaults
 * and the bounds beyond which HF raises or the schedule makes no sense. A
 * schedule takes only its own; the effective spec holds them all, in this
 * order. */
#define KW_STEPS     0x100u /* an integer step count in [lo, hi], else a number */
#define KW_REQUIRED  0x200u
#define KW_NO_DEF    0x400u /* absent stays absent (min_lr / min_lr_rate: one of them) */
#define KW_BELOW_LR  0x800u /* also below training_args.learning_rate */
#define KW_UPTO_LR  0x1000u /* also at most training_args.learning_rate */

static const struct sched_kwarg {
	const char *sched, *key;
	unsigned flags;    /* KW_* and LO_OPEN / HI_OPEN */
	double lo, hi, def;
} sched_kwargs[] = {
	{"cosine", "num_cycles", LO_OPEN, 0, 1000, 0.5},
	{"polynomial", "lr_end", KW_BELOW_LR, 0, 1, 1e-7},
	{"polynomial", "power", LO_OPEN, 0, 100, 1.0},
	{"cosine_with_min_lr", "num_cycles", LO_OPEN, 0, 1000, 0.5},
	{"cosine_with_min_lr", "min_lr", KW_NO_DEF | KW_UPTO_LR, 0, 1, 0},
	{"cosine_with_min_lr", "min_lr_rate", KW_NO_DEF, 0, 1, 0},
	{"warmup_stable_decay", "num_stable_steps", KW_STEPS | KW_REQUIRED, 0, (double)STEPS_MAX, 0},
	{"warmup_stable_decay", "num_decay_steps", KW_STEPS | KW_REQUIRED, 0, (double)STEPS_MAX, 0},
	{"warmup_stable_decay", "min_lr_ratio", 0, 0, 1, 0.0},
	{"warmup_stable_decay", "num_cycles", LO_OPEN, 0, 1000, 0.5},
};
#define N_SCHED_KWARGS (sizeof sched_kwargs / sizeof sched_kwargs[0])

static const struct sched_kwarg *kwarg_find(const char *sched, const char *key, size_t n)
{
	for (size_t i = 0; i < N_SCHED_KWARGS; i++)
		if (strcmp(sched_kwargs[i].sched, sched) == 0 && strlen(sched_kwargs[i].key) == n &&
		    memcmp(sched_kwargs[i].key, key, n) == 0)
			return &sched_kwargs[i];
	return NULL;
}

/* One kwarg's effective value into out (absent: its default, or nothing). */
static int kwarg_normalize(const struct sched_kwarg *k, json_t *v, double lr, const char *sched,
			   json_t *out, jobspec_error *err)
{
	static const char *const P = "training_args.lr_scheduler_kwargs";
	if (v && json_is_null(v))
		v = NULL;
	if (!v) {
		if (k->flags & KW_REQUIRED)
			return fail(err, 422, P, k->key, "is required by lr_scheduler_type \"%s\"", sched);
		if (k->flags & KW_NO_DEF)
			return 0;
		return json_object_set_new(out, k->key, json_real(k->def)) < 0 ? fail_oom(err) : 0;
	}
	if (k->flags & KW_STEPS) {
		if (!json_is_integer(v) || json_integer_value(v) < (json_int_t)k->lo ||
		    json_integer_value(v) > (json_int_t)k->hi)
			return fail(err, 422, P, k->key, "must be an integer between %.0f and %.0f", k->lo, k->hi);
		return json_object_set_new(out, k->key, json_integer(json_integer_value(v))) < 0 ? fail_oom(err) : 0;
	}
	double x = json_is_number(v) ? json_number_value(v) : NAN;
	bool lo = k->flags & LO_OPEN ? x > k->lo : x >= k->lo;
	bool hi = k->flags & HI_OPEN ? x < k->hi : x <= k->hi;
	if (!isfinite(x) || !lo || !hi)
		return fail(err, 422, P, k->key, "must be a number %s %.10g and %s %.10g",
			    k->flags & LO_OPEN ? ">" : ">=", k->lo, k->flags & HI_OPEN ? "<" : "<=", k->hi);
	if ((k->flags & KW_BELOW_LR) && !(x < lr))
		return fail(err, 422, P, k->key, "must be below training_args.learning_rate (%.10g)", lr);
	if ((k->flags & KW_UPTO_LR) && !(x <= lr))
		return fail(err, 422, P, k->key, "must be at most training_args.learning_rate (%.10g)", lr);
	return json_object_set_new(out, k->key, json_real(x)) < 0 ? fail_oom(err) : 0;
}

static int check_sched_kwargs(json_t *o, jobspec_error *err)
{
	static const char *const P = "training_args.lr_scheduler_kwargs";
	json_t *ta = json_object_get(o, "training_args");
	const char *sched = json_string_value(json_object_get(ta, "lr_scheduler_type"));
	json_t *kw = json_object_get(ta, "lr_scheduler_kwargs");
	double lr = json_real_value(json_object_get(ta, "learning_rate"));
	char takes[160];
	size_t n = 0;
	takes[0] = '\0';
	for (size_t i = 0; i < N_SCHED_KWARGS && n < sizeof takes; i++)
		if (strcmp(sched_kwargs[i].sched, sched) == 0)
			n += (size_t)snprintf(takes + n, sizeof takes - n, "%s%s", n ? ", " : "", sched_kwargs[i].key);
	const char *key;
	size_t len;
	json_t *v;
	json_object_keylen_foreach(kw, key, len, v) {
		if (!kwarg_find(sched, key, len))
			return fail(err, 422, P, key, "is not a keyword argument of lr_scheduler_type \"%s\" (%s%s)",
				    sched, n ? "it takes: " : "it takes none", takes);
	}
	json_t *out = json_object();
	if (!out)
		return fail_oom(err);
	int rc = 0;
	for (size_t i = 0; i < N_SCHED_KWARGS && rc == 0; i++)
		if (strcmp(sched_kwargs[i].sched, sched) == 0)
			rc = kwarg_normalize(&sched_kwargs[i], json_object_get(kw, sched_kwargs[i].key), lr, sched,
					     out, err);
	/* get_cosine_with_min_lr_schedule_with_warmup: exactly one floor */
	if (rc == 0 && strcmp(sched, "cosine_with_min_lr") == 0) {
		bool a = json_object_get(out, "min_lr") != NULL, b = json_object_get(out, "min_lr_rate") != NULL;
		if (a && b)
			rc = fail(err, 422, P, "min_lr", "give min_lr or min_lr_rate, not both");
		else if (!a && !b)
			rc = fail(err, 422, P, "min_lr_rate",
				  "is required by lr_scheduler_type \"cosine_with_min_lr\" (or min_lr)");
	}
	if (rc == 0 && json_object_set_new(ta, "lr_scheduler_kwargs", out) < 0)
		return fail_oom(err);
	if (rc < 0)
		json_decref(out);
	return rc;
}

/* The default name of a mixture job: its dataset names joined by "_", cut
 * at 128 bytes (names are ASCII). Returns buf. */
static const char *mix_name(json_t *mix, char buf[129])
{
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < json_array_size(mix) && n < 128; i++)
		n += (size_t)snprintf(buf + n, 129 - n, "%s%s", i ? "_" : "",
				      json_string_value(json_object_get(json_array_get(mix, i), "name")));
	if (n > 128)
		n = 128;
	while (n > 1 && (buf[n - 1] == '_')) /* not end on a separator */
		n--;
	buf[n] = '\0';
	return buf;
}

/* Best-model keys (HF TrainingArguments): greater_is_better null becomes
 * true for eval_accuracy, false for the losses (HF: "not ending in loss";
 * perplexity, like a loss, is better lower). load_best_model_at_end needs
 * an evaluation at every checkpoint: eval_strategy "steps" and save_steps a
 * round multiple of eval_steps (HF's rule for matching strategies). */
static int check_best_model(json_t *ta, bool eval_on, jobspec_error *err)
{
	const char *metric = json_string_value(json_object_get(ta, "metric_for_best_model"));
	json_t *gib = json_object_get(ta, "greater_is_better");
	if (json_is_null(gib) &&
	    json_object_set_new(ta, "greater_is_better", json_boolean(strcmp(metric, "eval_accuracy") == 0)) < 0)
		return fail_oom(err);
	if (!json_is_true(json_object_get(ta, "load_best_model_at_end")))
		return 0;
	if (!eval_on)
		return fail(err, 422, "training_args", "load_best_model_at_end",
			    "needs training_args.eval_strategy \"steps\": the best checkpoint is chosen by "
			    "its held-out %s", metric);
	long long save = json_integer_value(json_object_get(ta, "save_steps"));
	long long every = json_integer_value(json_object_get(ta, "eval_steps"));
	if (save % every != 0)
		return fail(err, 422, "training_args", "save_steps",
			    "must be a round multiple of eval_steps (%lld) with load_best_model_at_end, so "
			    "every checkpoint is evaluated", every);
	return 0;
}

static int cross_check(json_t *o, jobspec_error *err)
{
	if (json_is_null(json_object_get(o, "name"))) {
		json_t *ds = json_object_get(o, "dataset");
		char buf[129];
		if (json_is_array(ds)) /* a mixture: its names joined by "_", at most 128 bytes */
			ds = json_string(mix_name(ds, buf));
		else
			json_incref(ds);
		if (json_object_set_new(o, "name", ds) < 0)
			return fail_oom(err);
	}

	long long hidden = ival(o, "model", "hidden_size");
	long long heads = ival(o, "model", "num_attention_heads");
	if (hidden % heads != 0)
		return fail(err, 422, "model", "num_attention_heads",
			    "must divide model.hidden_size (%lld)", hidden);

	long long seq = ival(o, "training_args", "max_seq_length");
	long long maxpos = ival(o, "model", "max_position_embeddings");
	if (seq > maxpos)
		return fail(err, 422, "training_args", "max_seq_length",
			    "must be at most model.max_position_embeddings (%lld)", maxpos);

	long long batch = ival(o, "training_args", "per_device_train_batch_size");
	/* Bounds every per-micro-batch buffer (B*T*C stays far from 2^63). */
	if (batch * seq > (1LL << 24))
		return fail(err, 422, "training_args", "per_device_train_batch_size",
			    "times max_seq_length must be at most 16777216 tokens");

	long long warm = ival(o, "training_args", "warmup_steps");
	double ratio = json_real_value(at(o, "training_args", "warmup_ratio"));
	if (warm != 0 && ratio != 0.0)
		return fail(err, 422, "training_args", "warmup_ratio",
			    "must be 0 when warmup_steps is set (use one or the other)");
	/* HF: max_steps > 0 wins over num_train_epochs; -1 trains by epochs
	 * (3.0 when num_train_epochs is not given). Absent: epochs when given,
	 * else bertd's 1000 steps. -1 stays until jobspec_resolve_epochs(). */
	json_t *ta = json_object_get(o, "training_args");
	json_t *ms = json_object_get(ta, "max_steps"), *ep = json_object_get(ta, "num_train_epochs");
	if (json_is_null(ms)) {
		if (json_object_set_new(ta, "max_steps", json_integer(json_is_null(ep) ? 1000 : -1)) < 0)
			return fail_oom(err);
	} else if (json_integer_value(ms) == -1 && json_is_null(ep)) {
		if (json_object_set_new(ta, "num_train_epochs", json_real(3.0)) < 0)
			return fail_oom(err);
	}
	int krc = check_sched_kwargs(o, err);
	if (krc < 0)
		return krc;
	long long steps = ival(o, "training_args", "max_steps");
	if (steps > 0 && warm > steps)
		return fail(err, 422, "training_args", "warmup_steps",
			    "must be at most max_steps (%lld)", steps);

	json_t *bf16 = at(o, "training_args", "bf16"), *fp16 = at(o, "training_args", "fp16");
	if (json_is_true(bf16) && json_is_true(fp16))
		return fail(err, 422, "training_args", "fp16",
			    "must not be true together with bf16");
	/* fp16 training's gradients carry the loss scale (up to 2^16 and more):
	 * cast to fp16 for the all-reduce they overflow, and every such step is
	 * skipped. bf16 has fp32's range at the same size on the wire. */
	const char *rd = json_string_value(at(o, "training_args", "ddp_reduce_dtype"));
	if (json_is_true(fp16) && rd && strcmp(rd, "fp16") == 0)
		return fail(err, 422, "training_args", "ddp_reduce_dtype",
			    "\"fp16\" with fp16 training would cast the loss-scaled gradients to fp16, "
			    "where they overflow and the steps are skipped; use \"bf16\" (the same "
			    "bytes on the wire, fp32's range) or \"fp32\"");
	const char *device = json_string_value(at(o, "resources", "device"));
	if (strcmp(device, "cpu") == 0 && (json_is_true(bf16) || json_is_true(fp16)))
		return fail(err, 422, "training_args", json_is_true(bf16) ? "bf16" : "fp16",
			    "needs a GPU; the CPU backend trains in fp32 (use null or false)");

	int rc = check_nodes(o, err);
	if (rc < 0)
		return rc;
	if (json_is_true(json_object_get(o, "preemptible")) && ival(o, "resources", "nodes") > 1)
		return fail(err, 422, NULL, "preemptible", "%s", JOBSPEC_MULTINODE_NOT_PREEMPTIBLE);

	double mask = json_real_value(at(o, "mlm", "mask_replace_prob"));
	double rnd = json_real_value(at(o, "mlm", "random_replace_prob"));
	if (mask + rnd > 1.0)
		return fail(err, 422, "mlm", "random_replace_prob",
			    "plus mask_replace_prob must be at most 1");

	json_t *mlm = json_object_get(o, "mlm");
	json_t *mp = json_object_get(mlm, "max_predictions_per_seq");
	if (json_is_null(mp)) {
		double p = json_real_value(json_object_get(mlm, "mlm_probability"));
		if (json_object_set_new(mlm, "max_predictions_per_seq",
					json_integer(jobspec_default_max_predictions((int)seq, p))) < 0)
			return fail_oom(err);
	} else if (json_integer_value(mp) > seq) {
		return fail(err, 422, "mlm", "max_predictions_per_seq",
			    "must be at most training_args.max_seq_length (%lld)", seq);
	}

	/* Held-out evaluation: eval_steps defaults to logging_steps (as HF);
	 * evaluating needs a held-out share, 5% when not given (run_mlm.py's
	 * default); without evaluation nothing is held out unless asked. */
	bool eval_on = strcmp(json_string_value(json_object_get(ta, "eval_strategy")), "steps") == 0;
	if (json_is_null(json_object_get(ta, "eval_steps")) &&
	    json_object_set(ta, "eval_steps", json_object_get(ta, "logging_steps")) < 0)
		return fail_oom(err);
	json_t *vsp = json_object_get(mlm, "validation_split_percentage");
	if (json_is_null(vsp)) {
		if (json_object_set_new(mlm, "validation_split_percentage", json_integer(eval_on ? 5 : 0)) < 0)
			return fail_oom(err);
	} else if (eval_on && json_integer_value(vsp) == 0) {
		return fail(err, 422, "mlm", "validation_split_percentage",
			    "must be at least 1 when training_args.eval_strategy is \"steps\" "
			    "(the eval set is held out of the dataset)");
	}
	rc = check_best_model(ta, eval_on, err);
	if (rc < 0)
		return rc;
	long long ebatch = ival(o, "training_args", "per_device_eval_batch_size");
	if (ebatch * seq > (1LL << 24))
		return fail(err, 422, "training_args", "per_device_eval_batch_size",
			    "times max_seq_length must be at most 16777216 tokens");

	/* the API checks the rest of "all" at submit (a checkpoint with optimizer
	 * state, the same model and data layout: api/restore.c) */
	json_t *init = json_object_get(o, "init_from");
	if (strcmp(json_string_value(json_object_get(o, "init_from_restore")), "all") == 0 &&
	    (json_is_null(init) || (json_is_object(init) && !json_object_get(init, "checkpoint"))))
		return fail(err, 422, NULL, "init_from_restore",
			    "\"all\" needs init_from naming a job's checkpoint ({\"job\": id, \"checkpoint\": "
			    "step or \"latest\"})");

	if (json_is_true(json_object_get(mlm, "nsp")) && ival(o, "model", "type_vocab_size") < 2)
		return fail(err, 422, "model", "type_vocab_size",
			    "must be at least 2 when mlm.nsp is true (sentence A/B segments)");
	return 0;
}

int jobspec_normalize(const json_t *in, json_t **out, jobspec_error *err)
{
	if (!in || !json_is_object(in))
		return fail(err, 400, NULL, NULL, "the job spec must be a JSON object");
	/* .preset is set when model.preset (first in its table) is read. */
	struct ctx c = {.err = err, .preset = -1};
	json_t *o = json_object();
	if (!o)
		return fail_oom(err);
	int rc = section_normalize(in, &top_sec, NULL, o, &c);
	if (rc == 0)
		rc = cross_check(o, err);
	if (rc < 0) {
		json_decref(o);
		return rc;
	}
	*out = o;
	return 0;
}

int jobspec_check_key(const char *key, const json_t *v, json_t **out, jobspec_error *err)
{
	const struct field *f = key ? section_find(&top_sec, key, strlen(key)) : NULL;
	struct ctx c = {.err = err, .preset = -1};
	*out = NULL;
	if (!f || (strcmp(key, "name") && strcmp(key, "priority") && strcmp(key, "tags") &&
		   strcmp(key, "notes") && strcmp(key, "preemptible")))
		return fail(err, 422, NULL, key, "cannot be changed after submit");
	if (!v || (json_is_null(v) && (f->kind == K_NAME || f->kind == K_INT || f->kind == K_BOOL)))
		return fail(err, 422, NULL, key, "must be %s",
			    f->kind == K_INT ? "an integer" : f->kind == K_BOOL ? "a boolean" : "a string");
	json_t *res = NULL;
	int rc = field_normalize(v, f, NULL, &c, &res);
	if (rc < 0)
		return rc;
	*out = res;
	return 0;
}

/* ---- the table as a JSON Schema (docs/openapi.yaml JobSpecInput) ---- */

/* Every key but a required one also takes null ("the default"). */
static json_t *type_of(const char *t, const struct field *f)
{
	if (f->flags & REQUIRED)
		return json_string(t);
	return json_pack("[s, s]", t, "null");
}

static json_t *section_schema(const struct section *s);

static const char *const name_pattern = "^[A-Za-z0-9][A-Za-z0-9._-]*$";

static json_t *field_schema(const struct field *f)
{
	json_t *o = NULL;
	switch (f->kind) {
	case K_INT:
		o = json_pack("{s:o, s:I, s:I}", "type", type_of("integer", f), "minimum",
			      (json_int_t)((f->flags & ZERO_NULL) ? 0 : (f->flags & MINUS_ONE) ? -1 : f->imin),
			      "maximum", (json_int_t)f->imax);
		if (f->flags & MINUS_ONE)
			json_object_set_new(o, "not", json_pack("{s:i}", "const", 0));
		if (f->preset_dim >= 0)
			json_object_set_new(o, "description", json_string("default: from model.preset"));
		else if (f->flags & DERIVED)
			json_object_set_new(o, "description", json_string("default: derived, see docs/jobspec.md"));
		else
			json_object_set_new(o, "default", f->flags & NULLABLE ? json_null()
							: json_integer(f->idef));
		break;
	case K_NUM:
		o = json_pack("{s:o, s:f, s:f, s:o}", "type", type_of("number", f),
			      f->flags & LO_OPEN ? "exclusiveMinimum" : "minimum", f->dmin,
			      f->flags & HI_OPEN ? "exclusiveMaximum" : "maximum", f->dmax, "default",
			      f->flags & NULLABLE ? json_null() : json_real(f->ddef));
		break;
	case K_BOOL:
		o = json_pack("{s:o, s:o}", "type", type_of("boolean", f), "default",
			      f->flags & NULLABLE ? json_null() : json_boolean(f->idef));
		break;
	case K_ENUM: {
		json_t *e = json_array();
		for (const struct choice *c = f->choices; c->in; c++)
			json_array_append_new(e, json_string(c->in));
		json_array_append_new(e, json_null()); /* "enum" restricts null too */
		o = json_pack("{s:o, s:o, s:s}", "type", type_of("string", f), "enum", e, "default", f->sdef);
		break;
	}
	case K_NAME:
		o = json_pack("{s:o, s:I, s:I, s:s}", "type", type_of("string", f), "minLength",
			      (json_int_t)f->imin, "maxLength", (json_int_t)f->imax, "pattern", name_pattern);
		break;
	case K_DATASET: {
		json_t *one = json_pack("{s:s, s:I, s:I, s:s}", "type", "string", "minLength",
					(json_int_t)f->imin, "maxLength", (json_int_t)f->imax, "pattern", name_pattern);
		json_t *mix = json_pack(
			"{s:s, s:i, s:i, s:{s:s, s:[s, s], s:b, s:{s:O, s:{s:s, s:i, s:i}}}, s:s}", "type",
			"array", "minItems", 1, "maxItems", JOBSPEC_MAX_DATASETS, "items", "type", "object",
			"required", "name", "proportion", "additionalProperties", 0, "properties", "name", one,
			"proportion", "type", "number", "exclusiveMinimum", 0, "maximum", 1, "description",
			"a mixture: names distinct, proportions summing to 1 (docs/jobspec.md#mixtures)");
		o = json_pack("{s:[o, o]}", "oneOf", one, mix);
		break;
	}
	case K_PATH:
	case K_INIT: {
		json_t *path = json_pack("{s:s, s:I, s:I, s:s}", "type", "string", "minLength",
					 (json_int_t)f->imin, "maxLength", (json_int_t)f->imax, "pattern", "^/");
		if (f->kind == K_INIT) /* the API also takes a path relative to the first data root */
			json_object_del(path, "pattern");
		if (f->kind == K_PATH) {
			o = json_pack("{s:o, s:o}", "oneOf", json_pack("[o, {s:s}]", path, "type", "null"),
				      "default", json_null());
			break;
		}
		json_t *job = json_pack(
			"{s:s, s:[s], s:b, s:{s:{s:s, s:s}, s:{s:[{s:s, s:i, s:I}, {s:s}]}}, s:s}",
			"type", "object", "required", "job", "additionalProperties", 0, "properties",
			"job", "type", "string", "pattern", "^job-[0-9a-f]{16}$",
			"checkpoint", "oneOf", "type", "integer", "minimum", 0, "maximum", (json_int_t)STEPS_MAX,
			"const", "latest", "description",
			"without checkpoint: the job's HF export (a completed job)");
		o = json_pack("{s:o, s:o}", "oneOf", json_pack("[o, o, {s:s}]", path, job, "type", "null"),
			      "default", json_null());
		break;
	}
	case K_TAGS:
		o = json_pack("{s:o, s:i, s:b, s:{s:s, s:I, s:I, s:s}, s:[]}", "type", type_of("array", f),
			      "maxItems", JOBSPEC_MAX_TAGS, "uniqueItems", 1, "items", "type", "string",
			      "minLength", (json_int_t)f->imin, "maxLength", (json_int_t)f->imax, "pattern",
			      "^[A-Za-z0-9][A-Za-z0-9._:/@+=-]*$", "default");
		break;
	case K_TEXT:
		o = json_pack("{s:o, s:I, s:n}", "type", type_of("string", f), "maxLength",
			      (json_int_t)f->imax, "default");
		break;
	case K_OBJECT:
		o = json_pack("{s:o, s:{}}", "type", type_of("object", f), "default");
		break;
	case K_SECTION:
		o = section_schema(f->sub);
		if (o)
			json_object_set_new(o, "type", type_of("object", f));
		break;
	}
	return o;
}

static json_t *section_schema(const struct section *s)
{
	json_t *props = json_object(), *req = json_array(), *o = json_object();
	int rc = props && req && o ? 0 : -1;
	for (size_t i = 0; i < s->n && rc == 0; i++) {
		rc = json_object_set_new(props, s->f[i].key, field_schema(&s->f[i]));
		if (rc == 0 && (s->f[i].flags & REQUIRED))
			rc = json_array_append_new(req, json_string(s->f[i].key));
	}
	for (size_t i = 0; i < N_KEY_ALIASES && rc == 0; i++) {
		if (key_aliases[i].sec != s)
			continue;
		const struct field *f = section_find(s, key_aliases[i].canon, strlen(key_aliases[i].canon));
		json_t *a = f ? field_schema(f) : NULL;
		char d[96];
		snprintf(d, sizeof d, "older spelling of %s", key_aliases[i].canon);
		rc = a ? json_object_set_new(a, "description", json_string(d)) : -1;
		if (rc == 0)
			rc = json_object_set_new(a, "deprecated", json_true());
		if (rc == 0)
			rc = json_object_set_new(props, key_aliases[i].old, a);
		else
			json_decref(a);
	}
	if (rc == 0)
		rc = json_object_set_new(o, "type", json_string("object"));
	if (rc == 0 && json_array_size(req))
		rc = json_object_set(o, "required", req);
	if (rc == 0)
		rc = json_object_set_new(o, "additionalProperties", json_false());
	if (rc == 0)
		rc = json_object_set(o, "properties", props);
	json_decref(props);
	json_decref(req);
	if (rc < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *jobspec_schema(void)
{
	json_t *o = section_schema(&top_sec);
	if (o && json_object_set_new(o, "description",
				     json_string("A job spec; only dataset is required; null means the "
						 "default. Generated from common/jobspec.c; docs/jobspec.md "
						 "explains every key.")) < 0) {
		json_decref(o);
		o = NULL;
	}
	return o;
}

/* ---- num_train_epochs ---- */

double jobspec_estimate_sequences(const jobspec_epoch_source *src, int max_seq_length, bool nsp,
				  double short_seq_prob, bool drop_long_sentences)
{
	if (src->tokens == 0)
		return 0;
	/* Content room of a sample: T minus [CLS] and one [SEP] per segment;
	 * a short_seq_prob fraction of samples aim at a uniform length in
	 * [2, cap] instead (loader/mlm.c draw_target). */
	double cap = (double)max_seq_length - (nsp ? 3 : 2);
	double target = (1.0 - short_seq_prob) * cap + short_seq_prob * (2.0 + cap) / 2.0;
	/* Concatenated, then cut: every sample holds its target, counting one
	 * [SEP] between two documents. */
	if (!nsp && !drop_long_sentences)
		return ceil(((double)src->tokens + (double)src->documents) / target);
	double sent = src->sentences ? (double)src->tokens / (double)src->sentences : 0.0;
	/* Whole sentences are packed: a sentence that does not fit starts the
	 * next sample, leaving on average half a sentence unused; but a sample
	 * holds at least one sentence (cut at the target), and with
	 * drop_long_sentences every sample starts at a sentence, so there are
	 * never more samples than sentences (without it, a long sentence's
	 * pieces make samples of their own). */
	double fill = fmax(target - sent / 2.0, fmin(sent, target));
	double n = ceil((double)src->tokens / fill);
	return drop_long_sentences ? fmin((double)src->sentences, n) : n;
}

int jobspec_resolve_epochs(json_t *spec, const jobspec_epoch_source *src, jobspec_error *err)
{
	json_t *ta = json_object_get(spec, "training_args");
	if (json_integer_value(json_object_get(ta, "max_steps")) != -1)
		return 0;
	if (!src || src->tokens == 0)
		return fail(err, 422, "training_args", "num_train_epochs",
			    "needs the dataset's token count, known once it is ready; "
			    "give max_steps, or submit when the dataset is ready");
	json_t *mlm = json_object_get(spec, "mlm");
	double n = jobspec_estimate_sequences(
		src, (int)ival(spec, "training_args", "max_seq_length"),
		json_is_true(json_object_get(mlm, "nsp")),
		json_real_value(json_object_get(mlm, "short_seq_prob")),
		json_is_true(json_object_get(mlm, "drop_long_sentences")));
	/* the documents held out for evaluation are not trained on: an epoch is
	 * the rest (their share of the tokens taken as their share of documents) */
	n *= (100.0 - (double)ival(spec, "mlm", "validation_split_percentage")) / 100.0;
	double per_step = (double)ival(spec, "training_args", "per_device_train_batch_size") *
			  (double)ival(spec, "training_args", "gradient_accumulation_steps") *
			  (double)ival(spec, "resources", "gpus");
	double epochs = json_real_value(json_object_get(ta, "num_train_epochs"));
	double steps = ceil(epochs * n / per_step - 1e-9);
	if (steps < 1)
		steps = 1;
	if (steps > (double)STEPS_MAX)
		return fail(err, 422, "training_args", "num_train_epochs",
			    "comes to more than %lld optimizer steps on this dataset", STEPS_MAX);
	long long warm = ival(spec, "training_args", "warmup_steps");
	if (warm > (long long)steps)
		return fail(err, 422, "training_args", "warmup_steps",
			    "must be at most max_steps (%lld from num_train_epochs)", (long long)steps);
	if (json_object_set_new(ta, "max_steps", json_integer((json_int_t)steps)) < 0)
		return fail_oom(err);
	return 0;
}

/* ---- typed view ---- */

/* Names the first key where spec differs from its normalized form. */
static int first_difference(json_t *spec, json_t *norm, const char *prefix, jobspec_error *err)
{
	const char *key;
	json_t *nv;
	json_object_foreach(norm, key, nv) {
		json_t *sv = json_object_get(spec, key);
		if (!sv)
			return fail(err, 422, prefix, key, "missing (not an effective spec)");
		if (json_equal(sv, nv))
			continue;
		if (!prefix && json_is_object(sv) && json_is_object(nv))
			return first_difference(sv, nv, key, err);
		return fail(err, 422, prefix, key,
			    "not in effective form (normalize the spec first)");
	}
	return fail(err, 422, prefix, NULL, "not an effective spec");
}

static void section_fill(json_t *spec, const struct section *s, jobspec *out)
{
	for (size_t i = 0; i < s->n; i++) {
		const struct field *f = &s->f[i];
		json_t *v = json_object_get(spec, f->key);
		char *dst = (char *)out + f->off;
		switch (f->t) {
		case T_NONE:
			if (f->kind == K_SECTION)
				section_fill(v, f->sub, out);
			break;
		case T_INT: {
			int x = (int)json_integer_value(v); /* null -> 0; bounds checked */
			memcpy(dst, &x, sizeof x);
			break;
		}
		case T_I64: {
			int64_t x = json_integer_value(v);
			memcpy(dst, &x, sizeof x);
			break;
		}
		case T_U64: {
			uint64_t x = (uint64_t)json_integer_value(v); /* >= 0 checked */
			memcpy(dst, &x, sizeof x);
			break;
		}
		case T_DBL: {
			double x = json_real_value(v);
			memcpy(dst, &x, sizeof x);
			break;
		}
		case T_BOOL: {
			bool x = json_is_true(v);
			memcpy(dst, &x, sizeof x);
			break;
		}
		case T_TRI: {
			int x = json_is_null(v) ? JOBSPEC_AUTO : json_is_true(v);
			memcpy(dst, &x, sizeof x);
			break;
		}
		case T_STR: {
			/* Lengths were bounded by normalize; nulls become "". */
			const char *s = json_is_string(v) ? json_string_value(v) : "";
			snprintf(dst, f->size, "%s", s);
			break;
		}
		}
	}
}

/* The typed lr_scheduler_kwargs: HF's defaults, then the schedule's own. */
static void sched_kwargs_fill(json_t *kw, jobspec_training *t)
{
	json_t *v;
	t->lr_end = 1e-7;
	t->power = 1.0;
	t->num_cycles = 0.5;
	t->min_lr_rate = 0.0;
	t->min_lr_ratio = 0.0;
	t->num_stable_steps = t->num_decay_steps = 0;
	if ((v = json_object_get(kw, "lr_end")))
		t->lr_end = json_number_value(v);
	if ((v = json_object_get(kw, "power")))
		t->power = json_number_value(v);
	if ((v = json_object_get(kw, "num_cycles")))
		t->num_cycles = json_number_value(v);
	if ((v = json_object_get(kw, "min_lr_rate")))
		t->min_lr_rate = json_number_value(v);
	if ((v = json_object_get(kw, "min_lr")))
		t->min_lr_rate = json_number_value(v) / t->learning_rate;
	if ((v = json_object_get(kw, "min_lr_ratio")))
		t->min_lr_ratio = json_number_value(v);
	if ((v = json_object_get(kw, "num_stable_steps")))
		t->num_stable_steps = json_integer_value(v);
	if ((v = json_object_get(kw, "num_decay_steps")))
		t->num_decay_steps = json_integer_value(v);
}

/* The components of a job's data: one (dataset = its name, proportion 1)
 * or a mixture (dataset = "", the entries in order). */
static void dataset_fill(json_t *ds, jobspec *out)
{
	if (json_is_string(ds)) {
		out->n_datasets = 1;
		snprintf(out->datasets[0].name, sizeof out->datasets[0].name, "%s", json_string_value(ds));
		out->datasets[0].proportion = 1.0;
		return;
	}
	out->dataset[0] = '\0';
	out->n_datasets = (int)json_array_size(ds);
	for (int i = 0; i < out->n_datasets; i++) {
		json_t *e = json_array_get(ds, (size_t)i);
		snprintf(out->datasets[i].name, sizeof out->datasets[i].name, "%s",
			 json_string_value(json_object_get(e, "name")));
		out->datasets[i].proportion = json_real_value(json_object_get(e, "proportion"));
	}
}

int jobspec_from_json(const json_t *spec, jobspec *out, jobspec_error *err)
{
	json_t *norm = NULL;
	int rc = jobspec_normalize(spec, &norm, err);
	if (rc < 0)
		return rc;
	if (!json_equal((json_t *)spec, norm)) {
		rc = first_difference((json_t *)spec, norm, NULL, err);
		goto out;
	}
	/* What only the API can resolve must be resolved before a worker reads
	 * the spec: a worker must never guess a run length or a start. */
	if (json_integer_value(at(norm, "training_args", "max_steps")) == -1) {
		rc = fail(err, 422, "training_args", "max_steps",
			  "is -1: num_train_epochs was not resolved at submit");
		goto out;
	}
	if (json_is_object(json_object_get(norm, "init_from"))) {
		rc = fail(err, 422, NULL, "init_from",
			  "names a job: it is resolved to a checkpoint path at submit");
		goto out;
	}
	memset(out, 0, sizeof *out);
	section_fill(norm, &top_sec, out);
	sched_kwargs_fill(at(norm, "training_args", "lr_scheduler_kwargs"), &out->training);
	dataset_fill(json_object_get(norm, "dataset"), out);
out:
	json_decref(norm);
	return rc;
}

/* ---- presets ---- */

int jobspec_preset_dims(const char *name, int dims[4])
{
	for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++) {
		if (strcmp(presets[i].name, name) != 0)
			continue;
		dims[0] = presets[i].dim[D_HIDDEN];
		dims[1] = presets[i].dim[D_LAYERS];
		dims[2] = presets[i].dim[D_HEADS];
		dims[3] = presets[i].dim[D_INTER];
		return 0;
	}
	return -ENOENT;
}

const char *jobspec_preset_of(const int dims[4])
{
	for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
		if (presets[i].dim[D_HIDDEN] == dims[0] && presets[i].dim[D_LAYERS] == dims[1] &&
		    presets[i].dim[D_HEADS] == dims[2] && presets[i].dim[D_INTER] == dims[3])
			return presets[i].name;
	return NULL;
}
