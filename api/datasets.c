/* datasets — the /v1/datasets resource: ask for a corpus to be prepared
 * into token shards, and watch it (state, progress, counts, errors); or
 * register a dataset bertd-prepare made elsewhere ({"prepared": dir}),
 * checked (manifest, structure, every file's digest) and ready at once,
 * never tokenized again.
 *
 * A POST validates the request, confines every path to the data roots and
 * stores the dataset as `preparing`; the supervisor (daemon loop) runs
 * bertd-prepare for it and moves it to ready or failed. Handlers never start
 * processes themselves. DELETE removes a dataset no live job needs; on a
 * preparing one it cancels instead: the row becomes failed ("canceled"), and
 * the supervisor, seeing its bertd-prepare's dataset no longer preparing,
 * kills it and removes the partial output. A second DELETE removes it.
 */
#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "api/handlers.h"
#include "api/http.h"
#include "api/paths.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "daemon/store.h"
#include "loader/prepare.h"
#include "loader/shard.h"

#include <sys/stat.h>
#include <unistd.h>

static json_t *time_json(int64_t ms)
{
	if (ms <= 0)
		return json_null();
	char buf[32];
	api_time_format(ms, buf);
	return json_string(buf);
}

static json_t *dataset_json(api_request *req, const store_dataset *d)
{
	json_t *request = d->spec_json ? json_loads(d->spec_json, 0, NULL) : NULL;
	json_t *stats = d->stats_json ? json_loads(d->stats_json, 0, NULL) : NULL;
	char path[PATH_MAX + 64];
	snprintf(path, sizeof path, "%s/datasets/%s", req->cfg->n_data_roots ? req->cfg->data_roots[0] : ".",
		 d->name);
	/* bytes are per phase, fraction over the whole preparation (it only grows) */
	const char *phase = d->phase ? d->phase : "starting";
	const char *state = dataset_state_name(d->state);
	/* phase "queued": the supervisor has not started its bertd-prepare
	 * yet (prepare_concurrency others are running) */
	if (d->state == DATASET_PREPARING && strcmp(phase, "queued") == 0)
		state = "queued";
	json_int_t done = d->bytes_done, total = d->bytes_total;
	double frac = d->fraction;
	if (d->state == DATASET_READY) {
		/* the summary's corpus size: also right for rows older than phases */
		json_t *bytes = json_object_get(stats, "bytes");
		if (json_is_integer(bytes))
			done = total = json_integer_value(bytes);
		phase = "done";
		frac = 1.0;
	}
	return json_pack("{s:s, s:s, s:s, s:{s:s, s:I, s:I, s:f}, s:o, s:s?, s:s, s:o, s:o, s:o}",
			 "id", d->id, "name", d->name, "state", state,
			 "progress", "phase", phase, "bytes_done", done, "bytes_total", total,
			 "fraction", frac,
			 "stats", stats ? stats : json_null(),
			 "error", d->error,
			 "path", path,
			 "created_at", time_json(d->created_ms), "updated_at", time_json(d->updated_ms),
			 "request", request ? request : json_null());
}

static bool name_ok(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
			return false;
	}
	return true;
}

/* Resolves a path field; on failure replies and returns false. */
static bool resolve_field(api_request *req, json_t *v, const char *field, char *out, size_t cap,
			  enum MHD_Result *ret)
{
	const char *s = json_string_value(v);
	if (!s) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, field, "must be a string path");
		return false;
	}
	int rc = api_path_resolve(s, json_string_length(v), req->cfg->data_roots, req->cfg->n_data_roots,
				  out, cap);
	if (rc == 0)
		return true;
	/* the detail names the path as resolved and the data roots, so a
	 * newcomer sees where bertd looked and where files may live */
	char why[512];
	api_path_problem(rc, s, json_string_length(v), req->cfg->data_roots, req->cfg->n_data_roots, why,
			 sizeof why);
	*ret = api_reply_problem(req, rc == -EACCES ? API_P_PATH_FORBIDDEN : API_P_INVALID_REQUEST, field, "%s",
				 why);
	return false;
}

#define SOURCES_MAX 64
#define PATTERNS_MAX 64
#define PATTERN_BYTES 256

/* One element of "source" (field names it): a path as resolve_field, or a
 * glob pattern whose directory part (before its first wildcard component)
 * must resolve under the data roots and which must match something now.
 * On success out holds the canonical path or pattern; on failure replies
 * and returns false. bertd-prepare confines each match to the roots again. */
static bool resolve_source(api_request *req, json_t *v, const char *field, char *out, size_t cap,
			   enum MHD_Result *ret)
{
	const char *s = json_string_value(v);
	if (!s || !strpbrk(s, "*?[") || strlen(s) != json_string_length(v) ||
	    api_path_resolve(s, strlen(s), req->cfg->data_roots, req->cfg->n_data_roots, out, cap) == 0)
		return resolve_field(req, v, field, out, cap, ret); /* a path, even one with "[" in a name */
	const char *wild = strpbrk(s, "*?[");
	const char *comp = wild; /* start of the first component with a wildcard */
	while (comp > s && comp[-1] != '/')
		comp--;
	for (const char *p = comp; *p;) { /* no ".." in the pattern part either */
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.') {
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, field,
						 "must be a path or glob pattern without \"..\" components");
			return false;
		}
		p += n + (p[n] == '/');
	}
	char dir[PATH_MAX];
	size_t dl = (size_t)(comp - s);
	while (dl > 1 && s[dl - 1] == '/')
		dl--;
	if (dl == 0)
		snprintf(dir, sizeof dir, ".");
	else
		snprintf(dir, sizeof dir, "%.*s", (int)dl, s);
	json_t *dv = json_string(dir);
	char canon[PATH_MAX];
	bool ok = dv && resolve_field(req, dv, field, canon, sizeof canon, ret);
	json_decref(dv);
	if (!ok)
		return false;
	if ((size_t)snprintf(out, cap, "%s/%s", strcmp(canon, "/") ? canon : "", comp) >= cap) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, field, "the pattern is too long");
		return false;
	}
	glob_t g;
	int gr = glob(out, 0, NULL, &g);
	if (gr == 0)
		globfree(&g);
	if (gr != 0) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, field, "no file matches %s", out);
		return false;
	}
	return true;
}

/* "source": one path or pattern, or a list of 1..64; the effective list of
 * canonical ones (caller owns), or NULL having replied. */
static json_t *dataset_sources(api_request *req, json_t *in, enum MHD_Result *ret)
{
	if (!in) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "source",
					 "required: a corpus file, directory or glob pattern under the data roots, "
					 "or a list of them");
		return NULL;
	}
	bool list = json_is_array(in);
	if (list && (json_array_size(in) == 0 || json_array_size(in) > SOURCES_MAX)) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "source",
					 "a list must hold 1..%d paths or patterns", SOURCES_MAX);
		return NULL;
	}
	json_t *out = json_array();
	for (size_t i = 0; i < (list ? json_array_size(in) : 1); i++) {
		char field[32], path[PATH_MAX];
		snprintf(field, sizeof field, list ? "source[%zu]" : "source", i);
		if (!resolve_source(req, list ? json_array_get(in, i) : in, field, path, sizeof path, ret)) {
			json_decref(out);
			return NULL;
		}
		json_array_append_new(out, json_string(path));
	}
	return out;
}

/* "include" / "exclude" (key): null or absent, or a list of at most 64 name
 * patterns of 1..256 bytes; the effective list (caller owns), or NULL
 * having replied. */
static json_t *dataset_patterns(api_request *req, json_t *in, const char *key, enum MHD_Result *ret)
{
	if (!in || json_is_null(in))
		return json_array();
	if (!json_is_array(in) || json_array_size(in) > PATTERNS_MAX) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, key,
					 "must be a list of at most %d file name patterns (fnmatch: * ? [...])",
					 PATTERNS_MAX);
		return NULL;
	}
	size_t i;
	json_t *v;
	json_array_foreach(in, i, v) {
		const char *p = json_string_value(v);
		if (!p || !p[0] || strlen(p) != json_string_length(v) || strlen(p) > PATTERN_BYTES) {
			char field[32];
			snprintf(field, sizeof field, "%s[%zu]", key, i);
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, field,
						 "must be a pattern of 1..%d bytes without NUL", PATTERN_BYTES);
			return NULL;
		}
	}
	return json_copy(in);
}

/* The walk's bounds (null or absent: every default), with every default
 * filled in (caller owns); on failure replies and returns NULL. */
static json_t *dataset_limits(api_request *req, json_t *in, enum MHD_Result *ret)
{
	static const struct {
		const char *key, *field;
		json_int_t min, max, def;
	} lim[] = {
		{"max_depth", "limits.max_depth", 1, 256, PREPARE_DEFAULT_MAX_DEPTH},
		{"max_files", "limits.max_files", 1, 100000000, PREPARE_DEFAULT_MAX_FILES},
		{"max_bytes", "limits.max_bytes", 0, INT64_MAX, 0},
	};
	if (in && !json_is_null(in) && !json_is_object(in)) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "limits",
					 "must be an object: {\"max_depth\", \"max_files\", \"max_bytes\"}");
		return NULL;
	}
	const char *key;
	json_t *v;
	json_object_foreach(in, key, v) {
		bool ok = false;
		for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
			ok |= strcmp(key, lim[i].key) == 0;
		if (!ok) {
			char f[160];
			snprintf(f, sizeof f, "limits.%s", key);
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, f, "unknown key");
			return NULL;
		}
	}
	json_t *out = json_object();
	for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
		json_int_t x = lim[i].def;
		if ((v = json_object_get(in, lim[i].key)) && !json_is_null(v)) {
			if (!json_is_integer(v) || json_integer_value(v) < lim[i].min ||
			    json_integer_value(v) > lim[i].max) {
				*ret = api_reply_problem(req, API_P_INVALID_REQUEST, lim[i].field,
							 "must be an integer in %lld..%lld", (long long)lim[i].min,
							 (long long)lim[i].max);
				json_decref(out);
				return NULL;
			}
			x = json_integer_value(v);
		}
		json_object_set_new(out, lim[i].key, json_integer(x));
	}
	return out;
}

/* The preparation options (absent or null: the default), each validated
 * and set in eff; on failure replies and returns false. threads defaults
 * to 1 so that prepare_concurrency preparations take a CPU each. */
static bool dataset_options(api_request *req, json_t *in, json_t *eff, enum MHD_Result *ret)
{
	static const struct {
		const char *key;
		json_int_t min, max, def;
	} opt[] = {
		{"threads", 1, 256, 1},
		{"max_sentence_tokens", 0, 1000000, 510},
		{"shard_tokens", 1000, (json_int_t)1 << 40, (json_int_t)64 << 20},
	};
	for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) {
		json_t *v = json_object_get(in, opt[i].key);
		json_int_t x = opt[i].def;
		if (v && !json_is_null(v)) {
			if (!json_is_integer(v) || json_integer_value(v) < opt[i].min ||
			    json_integer_value(v) > opt[i].max) {
				*ret = api_reply_problem(req, API_P_INVALID_REQUEST, opt[i].key,
							 "must be an integer in %lld..%lld", (long long)opt[i].min,
							 (long long)opt[i].max);
				return false;
			}
			x = json_integer_value(v);
		}
		json_object_set_new(eff, opt[i].key, json_integer(x));
	}
	return true;
}

/* Validates a dataset request; on success returns the effective request
 * (caller owns) with canonical paths and every default. */
static json_t *dataset_request(api_request *req, json_t *in, enum MHD_Result *ret)
{
	static const char *const known[] = {"name",  "source",    "format",
					    "text_field", "vocab", "lowercase", "limits",
					    "include", "exclude", "threads", "max_sentence_tokens", "shard_tokens"};
	const char *key;
	json_t *v;
	json_object_foreach(in, key, v) {
		bool ok = false;
		for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
			ok |= strcmp(key, known[i]) == 0;
		if (!ok) {
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, key, "unknown key");
			return NULL;
		}
	}
	const char *name = json_string_value(json_object_get(in, "name"));
	if (!name || !name_ok(name)) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "name",
					 "required: 1..64 characters of [A-Za-z0-9._-], starting with a letter or digit");
		return NULL;
	}
	/* the corpus: paths or patterns, and which found files to read; every
	 * failure below drops them (fail:) */
	json_t *sources = dataset_sources(req, json_object_get(in, "source"), ret);
	json_t *include = sources ? dataset_patterns(req, json_object_get(in, "include"), "include", ret) : NULL;
	json_t *exclude = include ? dataset_patterns(req, json_object_get(in, "exclude"), "exclude", ret) : NULL;
	if (!exclude)
		goto fail;
	const char *format = "text";
	if ((v = json_object_get(in, "format")) && !json_is_null(v)) {
		format = json_string_value(v);
		if (!format || (strcmp(format, "text") && strcmp(format, "jsonl"))) {
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "format", "must be \"text\" or \"jsonl\"");
			goto fail;
		}
	}
	const char *text_field = "text";
	if ((v = json_object_get(in, "text_field")) && !json_is_null(v)) {
		text_field = json_string_value(v);
		if (!text_field || !*text_field || strlen(text_field) > 128) {
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "text_field",
						 "must be a non-empty string (at most 128 bytes)");
			goto fail;
		}
	}
	json_t *lowercase = json_null(); /* null: inferred from the vocab (uncased when training) */
	if ((v = json_object_get(in, "lowercase")) && !json_is_null(v)) {
		if (!json_is_boolean(v)) {
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "lowercase", "must be true, false or null");
			goto fail;
		}
		lowercase = json_boolean(json_is_true(v));
	}
	json_t *vocab = json_object_get(in, "vocab");
	json_t *out_vocab = NULL;
	if (!json_is_object(vocab) || json_object_size(vocab) != 1) {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "vocab",
					 "required: {\"file\": path of a BERT vocab.txt} or "
					 "{\"train\": {\"vocab_size\": N}}");
		goto fail;
	}
	if (json_object_get(vocab, "file")) {
		char vpath[PATH_MAX];
		if (!resolve_field(req, json_object_get(vocab, "file"), "vocab.file", vpath, sizeof vpath, ret))
			goto fail;
		out_vocab = json_pack("{s:s}", "file", vpath);
	} else if ((v = json_object_get(vocab, "train"))) {
		json_t *size = json_object_get(v, "vocab_size");
		if (!json_is_object(v) || !json_is_integer(size) || json_integer_value(size) < 128 ||
		    json_integer_value(size) > 1000000) {
			*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "vocab.train.vocab_size",
						 "must be an integer in 128..1000000");
			goto fail;
		}
		json_object_foreach(v, key, size) {
			if (strcmp(key, "lowercase") == 0) {
				/* also accepted here, where a vocab being trained has its casing */
				if (!json_is_boolean(size) && !json_is_null(size)) {
					*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "vocab.train.lowercase",
								 "must be true, false or null");
					goto fail;
				}
				if (json_is_boolean(size) && json_is_null(lowercase))
					lowercase = json_boolean(json_is_true(size));
			} else if (strcmp(key, "vocab_size") != 0) {
				char f[160];
				snprintf(f, sizeof f, "vocab.train.%s", key);
				*ret = api_reply_problem(req, API_P_INVALID_REQUEST, f, "unknown key");
				goto fail;
			}
		}
		out_vocab = json_pack("{s:{s:I}}", "train", "vocab_size",
				      json_integer_value(json_object_get(v, "vocab_size")));
	} else {
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "vocab", "must hold \"file\" or \"train\"");
		goto fail;
	}
	json_t *limits = dataset_limits(req, json_object_get(in, "limits"), ret);
	if (!limits) {
		json_decref(out_vocab);
		goto fail;
	}
	json_t *opts = json_object();
	if (!dataset_options(req, in, opts, ret)) {
		json_decref(opts);
		json_decref(limits);
		json_decref(out_vocab);
		goto fail;
	}
	/* the roots bertd-prepare confines its reading to (--root): links in
	 * the source that lead out of them are skipped */
	json_t *roots = json_array();
	for (size_t i = 0; i < req->cfg->n_data_roots; i++)
		json_array_append_new(roots, json_string(req->cfg->data_roots[i]));
	/* source_path: the first, as requests stored before lists had it */
	json_t *eff = json_pack("{s:s, s:s, s:o, s:o, s:o, s:s, s:s, s:o, s:o, s:o, s:o}", "name", name,
				"source_path", json_string_value(json_array_get(sources, 0)), "source_paths", sources,
				"include", include, "exclude", exclude,
				"format", format, "text_field", text_field, "lowercase", lowercase, "vocab", out_vocab,
				"limits", limits, "roots", roots);
	json_object_update(eff, opts);
	json_decref(opts);
	return eff;
fail:
	json_decref(sources);
	json_decref(include);
	json_decref(exclude);
	return NULL;
}

/* The stats of a registered dataset, from its (verified) manifest: the
 * counts a preparation here reports (caller owns). */
static json_t *registered_stats(const char *dir, bool had_sums)
{
	char p[PATH_MAX + 32];
	snprintf(p, sizeof p, "%s/%s", dir, SHARD_MANIFEST_NAME);
	json_t *m = json_load_file(p, 0, NULL);
	json_t *t = json_object_get(m, "totals"), *v = json_object_get(m, "vocab");
	json_int_t tokens = json_integer_value(json_object_get(t, "tokens"));
	json_int_t unk = json_integer_value(json_object_get(t, "unk"));
	json_t *st = json_pack("{s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:b, s:b, s:s,"
			       " s:b, s:b}",
			       "ok", 1, "dataset", dir,
			       "files", json_integer_value(json_object_get(t, "files")),
			       "bytes", json_integer_value(json_object_get(t, "bytes")),
			       "documents", json_integer_value(json_object_get(t, "documents")),
			       "sentences", json_integer_value(json_object_get(t, "sentences")),
			       "tokens", tokens, "unk", unk,
			       "unk_rate", tokens ? (double)unk / (double)tokens : 0.0,
			       "shards", (json_int_t)json_array_size(json_object_get(m, "shards")),
			       "vocab_size", json_integer_value(json_object_get(v, "size")),
			       "lowercase", json_is_true(json_object_get(v, "lowercase")),
			       "vocab_trained", json_is_true(json_object_get(v, "trained")),
			       "vocab_sha256", json_string_value(json_object_get(v, "sha256")) ?
			       json_string_value(json_object_get(v, "sha256")) : "",
			       "registered", 1, "digests_checked", had_sums);
	json_decref(m);
	return st;
}

/* A new dataset id: "ds-" and 16 random hex digits. 0, or -1 without entropy. */
static int new_dataset_id(char id[20])
{
	unsigned char r[8];
	if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
		return -1;
	memcpy(id, "ds-", 3);
	for (int i = 0; i < 8; i++)
		snprintf(id + 3 + 2 * i, 3, "%02x", r[i]);
	return 0;
}

/* 201 with the stored dataset id, read back, and its Location. */
static enum MHD_Result reply_created(api_request *req, const char *id)
{
	char loc[64];
	snprintf(loc, sizeof loc, "/v1/datasets/%s", id);
	if (api_add_header(req, MHD_HTTP_HEADER_LOCATION, loc))
		return MHD_NO;
	store_dataset got;
	if (store_dataset_get(req->st, id, &got) < 0)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "reading the dataset back failed");
	enum MHD_Result ret = api_reply_json(req, MHD_HTTP_CREATED, dataset_json(req, &got));
	store_dataset_free(&got);
	return ret;
}

/* POST /v1/datasets {"name", "prepared"}: a dataset directory made by
 * bertd-prepare, under the data roots, checked and registered as ready.
 * Jobs find every dataset at <first root>/datasets/<name>: a prepared
 * directory elsewhere is linked there (DELETE removes the link and the row,
 * never the directory). Reads every shard byte once, on this thread. */
static enum MHD_Result datasets_register(api_request *req, json_t *in)
{
	enum MHD_Result ret = MHD_NO;
	const char *key;
	json_t *v;
	char *text = NULL, *stats = NULL;
	json_t *eff = NULL, *st = NULL;
	json_object_foreach(in, key, v) {
		if (strcmp(key, "name") && strcmp(key, "prepared"))
			return api_reply_problem(req, API_P_INVALID_REQUEST, key,
						 "not allowed with \"prepared\": that dataset is prepared already");
	}
	const char *name = json_string_value(json_object_get(in, "name"));
	if (!name || !name_ok(name))
		return api_reply_problem(req, API_P_INVALID_REQUEST, "name",
					 "required: 1..64 characters of [A-Za-z0-9._-], starting with a letter or digit");
	char dir[PATH_MAX];
	if (!resolve_field(req, json_object_get(in, "prepared"), "prepared", dir, sizeof dir, &ret))
		return ret;
	struct stat sb;
	if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
		return api_reply_problem(req, API_P_INVALID_REQUEST, "prepared",
					 "%s is not a directory (a dataset made by bertd-prepare)", dir);
	if (!req->cfg->n_data_roots)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "no data root to register it in");
	char home[PATH_MAX + 64], root[PATH_MAX];
	if (!realpath(req->cfg->data_roots[0], root))
		return api_reply_problem(req, API_P_INTERNAL, NULL, "data root %s: %s", req->cfg->data_roots[0],
					 strerror(errno));
	snprintf(home, sizeof home, "%s/datasets/%s", root, name);
	bool in_place = strcmp(home, dir) == 0;
	size_t rl = strlen(root);
	if (!in_place && strncmp(dir, root, rl) == 0 && strncmp(dir + rl, "/datasets/", 10) == 0)
		/* deleting that dataset would leave this one a dangling link */
		return api_reply_problem(req, API_P_INVALID_REQUEST, "prepared",
					 "%s is where bertd keeps another dataset; register a copy of it, "
					 "or a directory at %s", dir, home);
	store_dataset other;
	if (store_dataset_get_by_name(req->st, name, &other) == 0) {
		store_dataset_free(&other);
		return api_reply_problem(req, API_P_DATASET_EXISTS, "name",
					 "dataset \"%s\" exists; pick another name or delete it", name);
	}
	if (!in_place && lstat(home, &sb) == 0)
		return api_reply_problem(req, API_P_DATASET_EXISTS, "name",
					 "%s is in the way; pick another name or remove it", home);
	char file[320], why[512];
	bool sums = false;
	int rc = shard_dataset_verify(dir, file, sizeof file, why, sizeof why, &sums);
	if (rc < 0) {
		log_info("dataset %s: refused %s: %s: %s", name, dir, file, why);
		return api_reply_problem(req, API_P_INVALID_REQUEST, "prepared", "%s/%s: %s", dir, file, why);
	}
	eff = json_pack("{s:s, s:s}", "name", name, "prepared", dir);
	st = registered_stats(dir, sums);
	text = eff ? json_dumps(eff, JSON_COMPACT) : NULL;
	stats = st ? json_dumps(st, JSON_COMPACT) : NULL;
	char id[20];
	if (!text || !stats || new_dataset_id(id) < 0) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory or entropy");
		goto out;
	}
	store_dataset ds = {.id = id, .name = (char *)name, .spec_json = text,
			    .bytes_total = json_integer_value(json_object_get(st, "bytes"))};
	rc = store_dataset_insert_ready(req->st, &ds, stats);
	if (rc == -EEXIST) {
		ret = api_reply_problem(req, API_P_DATASET_EXISTS, "name",
					"dataset \"%s\" exists; pick another name or delete it", name);
		goto out;
	}
	if (rc < 0) {
		ret = api_reply_store_error(req, rc, "storing the dataset failed");
		goto out;
	}
	char parent[PATH_MAX + 16];
	snprintf(parent, sizeof parent, "%s/datasets", root);
	if (!in_place && ((rc = fs_mkdir_p(parent, 0750)) < 0 || (rc = symlink(dir, home) != 0 ? -errno : 0) < 0)) {
		store_dataset_delete(req->st, id);
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "linking %s to %s: %s", home, dir, strerror(-rc));
		goto out;
	}
	log_info("dataset %s (%s) registered from %s (%s)", id, name, dir,
		 sums ? "every file's digest checked" : "no digests in its manifest: structure checked");
	ret = reply_created(req, id);
out:
	free(text);
	free(stats);
	json_decref(eff);
	json_decref(st);
	return ret;
}

enum MHD_Result datasets_create(api_request *req)
{
	enum MHD_Result ret = MHD_NO;
	json_t *in = NULL, *eff = NULL;
	char *text = NULL;
	char detail[256];
	int rc = api_json_parse(req->body, req->body_len, API_JSON_MAX_DEPTH, &in, detail, sizeof detail);
	if (rc)
		return api_reply_problem(req, rc == -E2BIG ? API_P_JSON_TOO_DEEP : API_P_MALFORMED_JSON, NULL,
					 "%s", detail);
	if (!json_is_object(in)) {
		ret = api_reply_problem(req, API_P_BAD_REQUEST, NULL, "the body must be a JSON object");
		goto out;
	}
	if (json_object_get(in, "prepared")) {
		ret = datasets_register(req, in);
		goto out;
	}
	if (!(eff = dataset_request(req, in, &ret)))
		goto out;
	text = json_dumps(eff, JSON_COMPACT);
	char id[20];
	if (!text || new_dataset_id(id) < 0) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory or entropy");
		goto out;
	}
	const char *name = json_string_value(json_object_get(eff, "name"));
	store_dataset ds = {.id = id, .name = (char *)name, .spec_json = text};
	rc = store_dataset_insert(req->st, &ds);
	if (rc == -EEXIST) {
		ret = api_reply_problem(req, API_P_DATASET_EXISTS, "name",
					"dataset \"%s\" exists; pick another name or delete it", name);
		goto out;
	}
	if (rc < 0) {
		ret = api_reply_store_error(req, rc, "storing the dataset failed");
		goto out;
	}
	log_info("dataset %s (%s) submitted for preparation", id, name);
	ret = reply_created(req, id);
out:
	free(text);
	json_decref(eff);
	json_decref(in);
	return ret;
}

enum MHD_Result datasets_list(api_request *req)
{
	static const char *const known[] = {NULL};
	enum MHD_Result qret;
	if (!api_query_known(req, known, &qret))
		return qret;
	store_dataset *ds = NULL;
	size_t n = 0;
	int rc = store_dataset_list(req->st, &ds, &n);
	if (rc < 0)
		return api_reply_store_error(req, rc, "listing datasets failed");
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(arr, dataset_json(req, &ds[i]));
	store_datasets_free(ds, n);
	return api_reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "datasets", arr));
}

/* {id} is a dataset id ("ds-...") or its name. */
static int load(api_request *req, store_dataset *d)
{
	const char *key = req->args.v[0];
	if (strncmp(key, "ds-", 3) == 0 && store_dataset_get(req->st, key, d) == 0)
		return 0;
	return store_dataset_get_by_name(req->st, key, d);
}

enum MHD_Result datasets_get(api_request *req)
{
	static const char *const known[] = {NULL};
	enum MHD_Result qret;
	if (!api_query_known(req, known, &qret))
		return qret;
	store_dataset d;
	int rc = load(req, &d);
	if (rc == -ENOENT)
		return api_reply_problem(req, API_P_DATASET_NOT_FOUND, NULL, "no dataset %s", req->args.v[0]);
	if (rc < 0)
		return api_reply_store_error(req, rc, "loading dataset failed");
	json_t *o = dataset_json(req, &d);
	store_dataset_free(&d);
	return api_reply_json(req, MHD_HTTP_OK, o);
}

/* The first live job (queued .. stopping) whose spec names dataset `name`:
 * copies its id into `job` and returns 1; 0 when none; negative errno. */
static int dataset_in_use(store *st, const char *name, char *job, size_t cap)
{
	int64_t after = 0;
	int found = 0;
	do {
		store_job *jobs = NULL;
		size_t n = 0;
		int64_t next = 0;
		int rc = store_job_list(st, JOB_MASK(JOB_QUEUED) | JOB_MASK_ACTIVE, after, 100, &jobs, &n, &next);
		if (rc < 0)
			return rc;
		for (size_t i = 0; i < n && !found; i++) {
			json_t *spec = jobs[i].spec_json ? json_loads(jobs[i].spec_json, 0, NULL) : NULL;
			json_t *dv = json_object_get(spec, "dataset");
			const char *ds = json_string_value(dv);
			size_t k;
			json_t *e;
			if (ds && strcmp(ds, name) == 0)
				found = 1;
			json_array_foreach(dv, k, e) /* a mixture: any of its components */
				if (!found && json_string_value(json_object_get(e, "name")) &&
				    strcmp(json_string_value(json_object_get(e, "name")), name) == 0)
					found = 1;
			if (found)
				snprintf(job, cap, "%s", jobs[i].id);
			json_decref(spec);
		}
		store_jobs_free(jobs, n);
		after = next;
	} while (after && !found);
	return found;
}

/* Deletes a dataset that no live job needs: its row, then its shards under
 * the first data root (the only place bertd-prepare writes). A preparing
 * one no live job needs is canceled instead (202 with the dataset, now failed): only its
 * row changes here, since the supervisor owns the process and handlers never
 * touch processes; the supervisor's next tick kills bertd-prepare and
 * removes what it wrote. */
enum MHD_Result datasets_delete(api_request *req)
{
	static const char *const known[] = {NULL};
	enum MHD_Result qret;
	if (!api_query_known(req, known, &qret))
		return qret;
	store_dataset d;
	int rc = load(req, &d);
	if (rc == -ENOENT)
		return api_reply_problem(req, API_P_DATASET_NOT_FOUND, NULL, "no dataset %s", req->args.v[0]);
	if (rc < 0)
		return api_reply_store_error(req, rc, "loading dataset failed");
	enum MHD_Result ret;
	char job[64] = "";
	/* a job waiting for it keeps it, preparing or not */
	if ((rc = dataset_in_use(req->st, d.name, job, sizeof job)) != 0) {
		if (rc < 0)
			ret = api_reply_store_error(req, rc, "listing jobs failed");
		else
			ret = api_reply_problem(req, API_P_DATASET_STATE, NULL,
						"dataset \"%s\" is used by job %s (queued or running); cancel it first",
						d.name, job);
		goto out;
	}
	if (d.state == DATASET_PREPARING) {
		rc = store_dataset_finish(req->st, d.id, DATASET_FAILED,
					  "canceled by DELETE while preparing; DELETE again to remove it", NULL);
		if (rc == 0) {
			log_info("dataset %s (%s) canceled while preparing", d.id, d.name);
			store_dataset now;
			if (store_dataset_get(req->st, d.id, &now) < 0) {
				ret = api_reply_problem(req, API_P_INTERNAL, NULL, "reading the dataset back failed");
				goto out;
			}
			ret = api_reply_json(req, MHD_HTTP_ACCEPTED, dataset_json(req, &now));
			store_dataset_free(&now);
			goto out;
		}
		if (rc != -EBUSY) {
			ret = api_reply_store_error(req, rc, "canceling the dataset failed");
			goto out;
		}
		/* it finished meanwhile: delete it as it is now */
	}
	rc = store_dataset_delete(req->st, d.id);
	if (rc == -ENOENT) {
		ret = api_reply_problem(req, API_P_DATASET_NOT_FOUND, NULL, "no dataset %s", req->args.v[0]);
		goto out;
	}
	if (rc == -EBUSY) {
		ret = api_reply_problem(req, API_P_DATASET_STATE, NULL, "dataset \"%s\" is preparing again", d.name);
		goto out;
	}
	if (rc < 0) {
		ret = api_reply_store_error(req, rc, "deleting the dataset failed");
		goto out;
	}
	if (req->cfg->n_data_roots) {
		char dir[PATH_MAX + 64];
		snprintf(dir, sizeof dir, "%s/datasets/%s", req->cfg->data_roots[0], d.name);
		/* The row is gone, so the dataset is; leftover files are only logged. */
		if ((rc = fs_remove_tree(dir)) < 0)
			log_warn("dataset %s (%s) deleted, but removing %s failed: %s", d.id, d.name, dir,
				 strerror(-rc));
		/* the work of a preparation interrupted and never resumed */
		char work[PATH_MAX + 80];
		if (fs_partial_dir(dir, work, sizeof work) == 0 && (rc = fs_remove_tree(work)) < 0)
			log_warn("dataset %s (%s) deleted, but removing %s failed: %s", d.id, d.name, work,
				 strerror(-rc));
	}
	log_info("dataset %s (%s) deleted", d.id, d.name);
	ret = api_reply_empty(req, MHD_HTTP_NO_CONTENT);
out:
	store_dataset_free(&d);
	return ret;
}
