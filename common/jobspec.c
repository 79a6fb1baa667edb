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
	K_OBJECT,   /* any object, copied through unchanged */
	K_SECTION,  /* nested object described by sub */
};

enum target { T_NONE, T_INT, T_I64, T_U64, T_DBL, T_BOOL, T_TRI, T_STR };

#define NULLABLE  0x01u /* null is kept in the effective spec; it is the default */
#define LO_OPEN   0x02u /* K_NUM: the minimum itself is refused */
#define HI_OPEN   0x04u /* K_NUM: the maximum itself is refused */
#define DERIVED   0x08u /* absent/null: cross_check() resolves it from other keys */
#define REQUIRED  0x10u
#define ZERO_NULL 0x20u /* K_INT: 0 is accepted as a spelling of null */

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
/* The kernels implement the exact erf GELU only (HF's "gelu"). */
static const struct choice act_choices[] = {{"gelu", "gelu"}, {NULL, NULL}};

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
	{"constant_with_warmup", "constant_with_warmup"}, {NULL, NULL},
};
/* HF's AdamW spellings all mean decoupled-weight-decay Adam here. */
static const struct choice reduce_choices[] = {
	{"fp32", "fp32"}, {"float32", "fp32"}, {"bf16", "bf16"}, {"bfloat16", "bf16"},
	{"fp16", "fp16"}, {"float16", "fp16"}, {NULL, NULL},
};

static const struct choice optim_choices[] = {
	{"adamw", "adamw"}, {"adamw_torch", "adamw"}, {"adamw_hf", "adamw"},
	{"lamb", "lamb"}, {NULL, NULL},
};

static const struct field training_fields[] = {
	INT("per_device_train_batch_size", 1, 65536, 8, 0, T_INT, training.per_device_train_batch_size),
	INT("gradient_accumulation_steps", 1, 65536, 1, 0, T_INT, training.gradient_accumulation_steps),
	NUM("learning_rate", 0, 1, 5e-5, LO_OPEN, training.learning_rate),
	ENUM("lr_scheduler_type", sched_choices, "linear", training.lr_scheduler_type),
	INT("warmup_steps", 0, STEPS_MAX, 0, 0, T_I64, training.warmup_steps),
	NUM("warmup_ratio", 0, 1, 0.0, 0, training.warmup_ratio),
	NUM("weight_decay", 0, 1, 0.0, 0, training.weight_decay),
	NUM("adam_beta1", 0, 1, 0.9, HI_OPEN, training.adam_beta1),
	NUM("adam_beta2", 0, 1, 0.999, HI_OPEN, training.adam_beta2),
	NUM("adam_epsilon", 0, 1, 1e-8, LO_OPEN | HI_OPEN, training.adam_epsilon),
	NUM("max_grad_norm", 0, 1e6, 1.0, 0, training.max_grad_norm),
	INT("max_steps", 1, STEPS_MAX, 1000, 0, T_I64, training.max_steps),
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
};

/* ---- resources, stopping_condition, retry_policy, profiler ---- */

static const struct choice device_choices[] = {
	{"auto", "auto"}, {"cuda", "cuda"}, {"cpu", "cpu"}, {NULL, NULL},
};

static const struct field resources_fields[] = {
	INT("gpus", 1, 64, 1, 0, T_INT, gpus),
	ENUM("device", device_choices, "auto", device),
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
	{.key = "dataset", .kind = K_NAME, .flags = REQUIRED, .imin = 1, .imax = 64,
	 .preset_dim = -1, .t = T_STR, OFF(dataset)},
	SECTION("model", model_sec),
	{.key = "init_from", .kind = K_PATH, .flags = NULLABLE, .imin = 1, .imax = 1023,
	 .preset_dim = -1, .t = T_STR, OFF(init_from)},
	INT("priority", -100, 100, 0, 0, T_INT, priority),
	SECTION("training_args", training_sec),
	SECTION("mlm", mlm_sec),
	SECTION("resources", resources_sec),
	SECTION("stopping_condition", stopping_sec),
	SECTION("retry_policy", retry_sec),
	SECTION("profiler", profiler_sec),
};
static const struct section top_sec = SEC(top_fields);

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
		if (x < f->imin || x > f->imax)
			return fail(err, 422, path, f->key, "must be between %lld and %lld%s", f->imin,
				    f->imax, f->flags & ZERO_NULL ? " (or 0/null)" : "");
		*res = json_integer(x);
		break;
	}
	case K_NUM: {
		if (!v) {
			*res = json_real(f->ddef);
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
	case K_PATH: {
		if (!v) {
			*res = json_null();
			break;
		}
		if (!json_is_string(v))
			return fail(err, 422, path, f->key, "must be a string or null");
		const char *why = path_problem(json_string_value(v), json_string_length(v), f);
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
		if (!section_find(s, key, len))
			return fail(c->err, 422, path, key, "unknown key");
	}
	for (size_t i = 0; i < s->n; i++) {
		const struct field *f = &s->f[i];
		json_t *res;
		int rc = field_normalize(obj ? json_object_get(obj, f->key) : NULL, f, path, c, &res);
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

static int cross_check(json_t *o, jobspec_error *err)
{
	if (json_is_null(json_object_get(o, "name"))) {
		json_t *ds = json_object_get(o, "dataset");
		if (json_object_set(o, "name", ds) < 0)
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
	long long steps = ival(o, "training_args", "max_steps");
	if (warm > steps)
		return fail(err, 422, "training_args", "warmup_steps",
			    "must be at most max_steps (%lld)", steps);

	json_t *bf16 = at(o, "training_args", "bf16"), *fp16 = at(o, "training_args", "fp16");
	if (json_is_true(bf16) && json_is_true(fp16))
		return fail(err, 422, "training_args", "fp16",
			    "must not be true together with bf16");
	const char *device = json_string_value(at(o, "resources", "device"));
	if (strcmp(device, "cpu") == 0 && (json_is_true(bf16) || json_is_true(fp16)))
		return fail(err, 422, "training_args", json_is_true(bf16) ? "bf16" : "fp16",
			    "needs a GPU; the CPU backend trains in fp32 (use null or false)");

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
	memset(out, 0, sizeof *out);
	section_fill(norm, &top_sec, out);
out:
	json_decref(norm);
	return rc;
}
