/* initmodel — see initmodel.h. */
#include "api/initmodel.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/jobspec.h"
#include "daemon/store.h"
#include "worker/safetensors.h"

/* The model.* keys that are the model's, and what a config.json without
 * one means (transformers' BertConfig defaults; worker/model.c
 * bert_config_preset reads a missing key the same way). */
#define N_DIMS 7
static const char *const dim_keys[N_DIMS] = {"vocab_size", "hidden_size", "num_hidden_layers",
					     "num_attention_heads", "intermediate_size",
					     "max_position_embeddings", "type_vocab_size"};
static const long long dim_defaults[N_DIMS] = {30522, 768, 12, 12, 3072, 512, 2};
#define EPS_DEFAULT 1e-12
#define VOCAB_MAX_LINES ((1L << 22) + 1) /* past model.vocab_size's bound: not a vocab */
#define VOCAB_LINE_MAX 1024              /* bytes; a longer line is not a token */
#define TOKEN_SHOWN_MAX 24               /* longer tokens are not quoted in errors */

typedef struct model_info {
	char cfg[PATH_MAX + 32];   /* config.json (HF) or state.json (bertd checkpoint) */
	long long dim[N_DIMS];     /* as dim_keys */
	double eps;                /* layer_norm_eps */
	char act[24];              /* hidden_act ("gelu" when missing, BertConfig's default) */
	long long rows;            /* word-embedding rows in model.safetensors; -1 not known */
	char vocab[PATH_MAX + 32]; /* the model's vocab file; "" when none is known */
} model_info;

static bool is_file(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The model keys of file (its "model" object when section is not NULL)
 * into mi. 0, or -EINVAL with why (naming the file, never its bytes). */
static int read_dims(const char *file, const char *section, model_info *mi, char *why, size_t cap)
{
	json_error_t jerr;
	json_t *root = json_load_file(file, 0, &jerr);
	if (!root) {
		if (!is_file(file))
			snprintf(why, cap, "%s cannot be read", file);
		else /* jansson's text may quote the bytes it choked on */
			snprintf(why, cap, "%s is not valid JSON (line %d, column %d)", file, jerr.line,
				 jerr.column);
		return -EINVAL;
	}
	int rc = 0;
	json_t *o = section ? json_object_get(root, section) : root;
	if (!json_is_object(o)) {
		snprintf(why, cap, "%s has no model config (%s is not a JSON object)", file,
			 section ? section : "the file");
		rc = -EINVAL;
		goto out;
	}
	snprintf(mi->cfg, sizeof mi->cfg, "%s", file);
	for (size_t i = 0; i < N_DIMS && rc == 0; i++) {
		json_t *v = json_object_get(o, dim_keys[i]);
		if (!v || json_is_null(v)) {
			mi->dim[i] = dim_defaults[i];
		} else if (json_is_integer(v) && json_integer_value(v) > 0) {
			mi->dim[i] = json_integer_value(v);
		} else {
			snprintf(why, cap, "%s: %s is not a positive integer", file, dim_keys[i]);
			rc = -EINVAL;
		}
	}
	json_t *eps = json_object_get(o, "layer_norm_eps");
	mi->eps = json_is_number(eps) ? json_number_value(eps) : EPS_DEFAULT;
	/* one the job spec does not know (or too long to be one) is refused
	 * on model.hidden_act when the spec is made again with it (with_model) */
	json_t *act = json_object_get(o, "hidden_act");
	snprintf(mi->act, sizeof mi->act, "%s", "gelu");
	if (rc == 0 && act && !json_is_null(act)) {
		if (!json_is_string(act)) {
			snprintf(why, cap, "%s: hidden_act is not a string", file);
			rc = -EINVAL;
		} else {
			snprintf(mi->act, sizeof mi->act, "%s", json_string_value(act));
		}
	}
out:
	json_decref(root);
	return rc;
}

/* The word-embedding rows of dir/model.safetensors into mi->rows (-1 when
 * the file or the tensor is not there, or the file does not parse: the
 * worker's load says why). */
static void embedding_rows(const char *dir, model_info *mi)
{
	static const char *const names[] = {"bert.embeddings.word_embeddings.weight",
					    "embeddings.word_embeddings.weight"};
	char path[PATH_MAX + 32], err[256];
	st_file *f = NULL;
	mi->rows = -1;
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	if (!is_file(path) || st_open(&f, path, err, sizeof err) < 0)
		return;
	for (size_t i = 0; i < sizeof names / sizeof names[0] && mi->rows < 0; i++) {
		const st_tensor *t = st_find(f, names[i]);
		if (t && t->ndim == 2)
			mi->rows = t->shape[0];
	}
	st_close(f);
}

/* Where dataset name's vocab file is, into out: 1 found; 0 not known (its
 * files are gone); 2 it trains its own vocab and is not ready yet;
 * -ENOENT no such dataset; another < 0: a store error. */
static int dataset_vocab(api_request *req, const char *name, char *out, size_t cap)
{
	store_dataset ds;
	int rc = store_dataset_get_by_name(req->st, name, &ds);
	if (rc < 0)
		return rc;
	/* the prepared dataset keeps the exact bytes it was made with
	 * (docs/formats.md), where api/datasets.c and the supervisor put it */
	snprintf(out, cap, "%s/datasets/%s/vocab.txt",
		 req->cfg->n_data_roots ? req->cfg->data_roots[0] : ".", ds.name);
	rc = 0;
	if (ds.state == DATASET_READY && is_file(out)) {
		rc = 1;
	} else {
		json_t *spec = ds.spec_json ? json_loads(ds.spec_json, 0, NULL) : NULL;
		json_t *vocab = json_object_get(spec, "vocab");
		const char *file = json_string_value(json_object_get(vocab, "file"));
		if (file && is_file(file)) {
			snprintf(out, cap, "%s", file);
			rc = 1;
		} else if (json_object_get(vocab, "train") && ds.state == DATASET_PREPARING) {
			rc = 2;
		}
		json_decref(spec);
	}
	store_dataset_free(&ds);
	return rc;
}

/* The dataset a spec trains on, for its vocab: the name, or a mixture's
 * first component's (a mixture's datasets share one vocab: api/jobs.c
 * refuses another at submit, the loaders when one was still preparing). */
static const char *spec_dataset_name(const json_t *spec)
{
	const json_t *d = json_object_get(spec, "dataset");
	if (json_is_array(d))
		d = json_object_get(json_array_get(d, 0), "name");
	return json_string_value(d);
}

/* A bertd checkpoint keeps no vocab of its own: a vocab.txt beside it
 * (put there by hand) first; for a job's checkpoint
 * (<state_dir>/jobs/<id>/checkpoints/...), that job's export's vocab.txt
 * (a byte copy of its dataset's), else its dataset's vocab. mi->vocab stays
 * "" when none is found. */
static void checkpoint_vocab(api_request *req, const char *dir, model_info *mi)
{
	char path[PATH_MAX + 64], jobs[PATH_MAX], real[PATH_MAX];
	snprintf(path, sizeof path, "%s/vocab.txt", dir);
	if (is_file(path)) {
		snprintf(mi->vocab, sizeof mi->vocab, "%s", path);
		return;
	}
	snprintf(jobs, sizeof jobs, "%s/jobs", req->cfg->state_dir);
	if (!realpath(jobs, real))
		return;
	size_t n = strlen(real);
	const char *rest = dir + n;
	if (strncmp(dir, real, n) != 0 || rest[0] != '/' || strlen(rest) < 22 || rest[21] != '/' ||
	    strncmp(rest + 22, "checkpoints/", 12) != 0)
		return;
	char id[21];
	memcpy(id, rest + 1, 20);
	id[20] = 0;
	snprintf(path, sizeof path, "%s/%s/export/vocab.txt", real, id);
	if (is_file(path)) {
		snprintf(mi->vocab, sizeof mi->vocab, "%s", path);
		return;
	}
	store_job j = {0};
	if (store_job_get(req->st, id, &j) < 0)
		return;
	json_t *spec = j.spec_json ? json_loads(j.spec_json, 0, NULL) : NULL;
	const char *ds = spec_dataset_name(spec);
	if (ds && dataset_vocab(req, ds, path, sizeof path) == 1)
		snprintf(mi->vocab, sizeof mi->vocab, "%s", path);
	json_decref(spec);
	store_job_free(&j);
}

/* What dir holds (an HF directory or a bertd checkpoint, as api/jobs.c
 * model_dir_missing accepted it). Returns true, or replies 422 on
 * init_from and sets *ret. */
static bool read_model(api_request *req, const char *dir, model_info *mi, enum MHD_Result *ret)
{
	char path[PATH_MAX + 32], why[PATH_MAX + 128];
	memset(mi, 0, sizeof *mi);
	mi->rows = -1;
	snprintf(path, sizeof path, "%s/config.json", dir);
	int rc;
	if (is_file(path)) { /* every HF layout has it, whatever holds the weights */
		rc = read_dims(path, NULL, mi, why, sizeof why);
		embedding_rows(dir, mi);
		snprintf(path, sizeof path, "%s/vocab.txt", dir);
		if (is_file(path))
			snprintf(mi->vocab, sizeof mi->vocab, "%s", path);
	} else {
		snprintf(path, sizeof path, "%s/state.json", dir);
		rc = read_dims(path, "model", mi, why, sizeof why);
		if (rc == 0)
			checkpoint_vocab(req, dir, mi);
	}
	if (rc < 0) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from", "%s", why);
		return false;
	}
	if (mi->rows >= 0 && mi->rows != mi->dim[0]) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
					 "%s/model.safetensors has %lld word-embedding rows but %s says "
					 "vocab_size %lld: the model directory contradicts itself",
					 dir, mi->rows, mi->cfg, mi->dim[0]);
		return false;
	}
	return true;
}

/* The model.* keys in as submitted that contradict mi: a preset whose
 * dimensions (those not given beside it) are not the model's, a dimension,
 * vocab_size (0 and null mean "the model's"), layer_norm_eps (as the float
 * the worker uses), hidden_act. Returns true when none does, or replies 422 on the
 * key, naming both values, and sets *ret. */
static bool contradiction(api_request *req, const json_t *in, const model_info *mi,
			  enum MHD_Result *ret)
{
	json_t *m = json_object_get(in, "model");
	char field[64];
	for (size_t i = 0; i < N_DIMS; i++) {
		json_t *v = json_object_get(m, dim_keys[i]);
		if (!json_is_integer(v) || (i == 0 && json_integer_value(v) == 0) ||
		    json_integer_value(v) == mi->dim[i])
			continue;
		snprintf(field, sizeof field, "model.%s", dim_keys[i]);
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, field,
					 "%lld differs from the model of the checkpoint init_from names "
					 "(%s: %s %lld); a job started from a model trains that model: leave "
					 "model.%s out, or give %lld",
					 (long long)json_integer_value(v), mi->cfg, dim_keys[i], mi->dim[i],
					 dim_keys[i], mi->dim[i]);
		return false;
	}
	json_t *eps = json_object_get(m, "layer_norm_eps");
	if (json_is_number(eps) && (float)json_number_value(eps) != (float)mi->eps) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "model.layer_norm_eps",
					 "%g differs from the model of the checkpoint init_from names "
					 "(%s: layer_norm_eps %g); leave it out, or give that",
					 json_number_value(eps), mi->cfg, mi->eps);
		return false;
	}
	const char *act = json_string_value(json_object_get(m, "hidden_act"));
	if (act && strcmp(act, mi->act) != 0) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "model.hidden_act",
					 "\"%s\" differs from the model of the checkpoint init_from names "
					 "(%s: hidden_act \"%s\"); leave it out, or give that",
					 act, mi->cfg, mi->act);
		return false;
	}
	int pd[4];
	const char *preset = json_string_value(json_object_get(m, "preset"));
	if (preset && jobspec_preset_dims(preset, pd) == 0) {
		for (size_t k = 0; k < 4; k++) { /* dim_keys[1..4]: hidden, layers, heads, inter */
			if (json_is_integer(json_object_get(m, dim_keys[k + 1])) || pd[k] == mi->dim[k + 1])
				continue;
			*ret = api_reply_problem(req, API_P_INVALID_SPEC, "model.preset",
						 "\"%s\" has %s %d, which differs from the model of the "
						 "checkpoint init_from names (%s: %lld); leave model.preset out "
						 "(the model's dimensions are taken)",
						 preset, dim_keys[k + 1], pd[k], mi->cfg, mi->dim[k + 1]);
			return false;
		}
	}
	return true;
}

/* *spec again from in with mi's model in its model section. Returns true,
 * or replies 422 (a rule the model breaks with the rest of the spec, e.g.
 * max_seq_length over its max_position_embeddings) and sets *ret. */
static bool with_model(api_request *req, const json_t *in, const model_info *mi, json_t **spec,
		       enum MHD_Result *ret)
{
	json_t *in2 = json_deep_copy(in), *out = NULL;
	json_t *m = json_object_get(in2, "model");
	bool ok = false;
	if (!in2)
		goto oom;
	if (!json_is_object(m)) {
		m = json_object();
		if (!m || json_object_set_new(in2, "model", m) < 0)
			goto oom;
	}
	for (size_t i = 0; i < N_DIMS; i++)
		if (json_object_set_new(m, dim_keys[i], json_integer(mi->dim[i])) < 0)
			goto oom;
	if (json_object_set_new(m, "layer_norm_eps", json_real(mi->eps)) < 0 ||
	    json_object_set_new(m, "hidden_act", json_string(mi->act)) < 0)
		goto oom;
	json_t *preset = json_object_get(m, "preset");
	int dims[4] = {(int)mi->dim[1], (int)mi->dim[2], (int)mi->dim[3], (int)mi->dim[4]};
	const char *named = jobspec_preset_of(dims);
	if ((!preset || json_is_null(preset)) && named &&
	    json_object_set_new(m, "preset", json_string(named)) < 0)
		goto oom;
	if (json_object_set(in2, "init_from", json_object_get(*spec, "init_from")) < 0)
		goto oom;
	jobspec_error err = {0};
	if (jobspec_normalize(in2, &out, &err) < 0) {
		*ret = api_reply_problem(req, err.status == 500 ? API_P_INTERNAL : API_P_INVALID_SPEC,
					 err.field, "%s (the model is init_from's: %s)", err.detail, mi->cfg);
		goto out;
	}
	json_decref(*spec);
	*spec = out;
	ok = true;
	goto out;
oom:
	*ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
out:
	json_decref(in2);
	return ok;
}

/* One line of f into buf, trailing whitespace trimmed as the tokenizer
 * reads it (loader/wordpiece.c): 1, 0 at the end, -E2BIG for a line over
 * VOCAB_LINE_MAX, -EIO. */
static int vocab_line(FILE *f, char *buf, size_t cap)
{
	if (!fgets(buf, (int)cap, f))
		return ferror(f) ? -EIO : 0;
	size_t n = strlen(buf);
	if (n == cap - 1 && buf[n - 1] != '\n' && !feof(f))
		return -E2BIG;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		buf[--n] = 0;
	return 1;
}

/* A token fit to quote in an error: short, printable ASCII, nothing JSON
 * would escape. */
static bool showable(const char *t)
{
	if (strlen(t) > TOKEN_SHOWN_MAX)
		return false;
	for (const unsigned char *p = (const unsigned char *)t; *p; p++)
		if (*p < 0x21 || *p > 0x7e || *p == '"' || *p == '\\')
			return false;
	return true;
}

typedef struct vocab_cmp {
	long lines[2];       /* of each file */
	long first;          /* first line that differs (1-based), 0 when none */
	char shown[2][TOKEN_SHOWN_MAX + 8]; /* its two tokens, "" when not shown */
	int bad;             /* the file that could not be read (0 or 1), with rc */
} vocab_cmp;

/* Compares vocab files a and b line by line into c. 0, or -errno / -E2BIG
 * (not a vocab) for file c->bad. */
static int vocab_compare(const char *a, const char *b, vocab_cmp *c)
{
	char line[2][VOCAB_LINE_MAX];
	FILE *f[2] = {fopen(a, "r"), fopen(b, "r")};
	int rc = 0;
	memset(c, 0, sizeof *c);
	for (int k = 0; k < 2 && rc == 0; k++)
		if (!f[k]) {
			rc = -errno;
			c->bad = k;
		}
	while (rc == 0) {
		int r[2];
		for (int k = 0; k < 2 && rc == 0; k++) {
			r[k] = vocab_line(f[k], line[k], sizeof line[k]);
			if (r[k] < 0 || (r[k] && ++c->lines[k] > VOCAB_MAX_LINES)) {
				rc = r[k] < 0 ? r[k] : -E2BIG;
				c->bad = k;
			}
		}
		if (rc < 0 || (!r[0] && !r[1]))
			break;
		if (c->first || (r[0] && r[1] && strcmp(line[0], line[1]) == 0))
			continue;
		c->first = r[0] ? c->lines[0] : c->lines[1];
		bool show = true;
		for (int k = 0; k < 2; k++) {
			if (!r[k])
				snprintf(c->shown[k], sizeof c->shown[k], "end of file");
			else if (showable(line[k]))
				snprintf(c->shown[k], sizeof c->shown[k], "\"%s\"", line[k]);
			else
				show = false;
		}
		if (!show)
			c->shown[0][0] = c->shown[1][0] = 0;
	}
	for (int k = 0; k < 2; k++)
		if (f[k])
			fclose(f[k]);
	return rc;
}

/* The dataset's vocab against the model's (mi). Returns true (with *note
 * when the comparison was by size only, or not possible), or replies 422
 * and sets *ret. */
static bool vocab_check(api_request *req, const json_t *spec, const model_info *mi, char **note,
			enum MHD_Result *ret)
{
	const char *name = spec_dataset_name(spec);
	const char *dir = json_string_value(json_object_get(spec, "init_from"));
	char dv[PATH_MAX + 64], text[PATH_MAX * 2 + 256];
	int rc = name ? dataset_vocab(req, name, dv, sizeof dv) : -ENOENT;
	if (rc == -ENOENT)
		return true; /* needs_exist answers that */
	if (rc < 0) {
		*ret = api_reply_store_error(req, rc, "looking up the dataset failed");
		return false;
	}
	if (rc == 2) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "dataset",
					 "dataset \"%s\" trains its own vocab and is not ready: its vocab cannot "
					 "be compared with the model's of init_from yet (submit once it is ready)",
					 name);
		return false;
	}
	if (rc == 0) {
		snprintf(text, sizeof text,
			 "warning: the vocab of dataset \"%s\" was not found, so it was not compared with "
			 "the vocab of the model init_from names (%s)", name, dir);
		*note = strdup(text);
		return true;
	}
	vocab_cmp c;
	const char *mv = mi->vocab[0] ? mi->vocab : dv; /* none: dv against itself, for its size */
	if ((rc = vocab_compare(dv, mv, &c)) < 0) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, c.bad ? "init_from" : "dataset",
					 "%s %s", c.bad ? mv : dv,
					 rc == -E2BIG ? "is not a vocab file (a line over 1024 bytes, or over "
							"4194305 lines)"
						      : strerror(-rc));
		return false;
	}
	long n = c.lines[0];
	if (mi->vocab[0] && c.first) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
					 "dataset \"%s\" has vocab %s (%ld lines), the model vocab %s (%ld "
					 "lines); they differ at line %ld%s%s%s%s%s: the model's token ids would "
					 "mean other tokens (prepare the dataset with the model's vocab.txt)",
					 name, dv, c.lines[0], mv, c.lines[1], c.first,
					 c.shown[0][0] ? " (" : "", c.shown[0], c.shown[0][0] ? " vs " : "",
					 c.shown[1], c.shown[0][0] ? ")" : "");
		return false;
	}
	if (mi->vocab[0] ? mi->dim[0] < n : mi->dim[0] != n) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
					 "dataset \"%s\" has vocab %s (%ld tokens), the model %lld word-embedding "
					 "rows (%s vocab_size)%s: the dataset's token ids do not fit the model",
					 name, dv, n, mi->dim[0], mi->cfg,
					 mi->vocab[0] ? "" : " and no vocab.txt to compare");
		return false;
	}
	if (!mi->vocab[0]) {
		snprintf(text, sizeof text,
			 "warning: the vocab could not be compared: the model init_from names (%s) has no "
			 "vocab.txt; only its size was checked (%lld word-embedding rows, the %ld tokens of "
			 "dataset \"%s\"'s vocab %s)", dir, mi->dim[0], n, name, dv);
		*note = strdup(text);
	}
	return true;
}

bool api_initmodel_apply(api_request *req, const json_t *in, json_t **spec, char **note,
			 enum MHD_Result *ret)
{
	const char *dir = json_string_value(json_object_get(*spec, "init_from"));
	*note = NULL;
	if (!dir)
		return true;
	model_info *mi = malloc(sizeof *mi);
	if (!mi) {
		*ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		return false;
	}
	bool ok = read_model(req, dir, mi, ret) && contradiction(req, in, mi, ret) &&
		  with_model(req, in, mi, spec, ret) && vocab_check(req, *spec, mi, note, ret);
	free(mi);
	return ok;
}
