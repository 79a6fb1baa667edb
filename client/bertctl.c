/* bertctl — the command-line client of bertd's REST API (docs/cli.md): one
 * table of subcommands, each a function that parses its options, makes its
 * requests through clihttp and prints a table (or, with --json, the API's
 * JSON as is). Only main decides the exit code; every function returns one
 * of bertctl.h's codes. Must never accept the token as an argument, and
 * never speak to the daemon any other way than its documented API. */
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <curl/curl.h>

#include "client/cli.h"
#include "client/clihttp.h"
#include "client/follow.h"
#include "client/table.h"
#include "client/yaml2json.h"

#ifndef BERTD_VERSION
#define BERTD_VERSION "0"
#endif

/* ---------------------------------------------------------------- options */

#define MAX_OPTS 64
#define MAX_POS 8

typedef struct args {
	const char *pos[MAX_POS];
	int npos;
	const char *name[MAX_OPTS]; /* option names without "--", in command-line order */
	const char *val[MAX_OPTS];  /* their values; "" for flags */
	int n;
} args;

typedef struct command {
	const char *name;
	const char *opts;  /* accepted options: "name=" takes a value, "name" is a flag */
	int (*run)(cli *c, args *a);
	const char *usage;
} command;

/* Options every command takes (consumed by main). */
static const char global_opts[] = " json url= config= cacert= verbose help ";

static bool opt_known(const char *spec, const char *name, bool *has_arg)
{
	size_t n = strlen(name);
	for (const char *p = spec; (p = strstr(p, name)) != NULL; p += n) {
		if (p != spec && p[-1] != ' ')
			continue;
		if (p[n] == ' ' || p[n] == 0) {
			*has_arg = false;
			return true;
		}
		if (p[n] == '=') {
			*has_arg = true;
			return true;
		}
	}
	return false;
}

/* Splits argv into positionals and --options of spec (and the global
 * ones); "-" is a positional (stdin), "--" ends the options. */
static int args_parse(int argc, char **argv, const char *spec, args *a)
{
	bool opts_done = false;
	for (int i = 0; i < argc; i++) {
		char *s = argv[i];
		if (opts_done || s[0] != '-' || strcmp(s, "-") == 0) {
			if (a->npos == MAX_POS) {
				fprintf(stderr, "bertctl: too many arguments\n");
				return CLI_USAGE;
			}
			a->pos[a->npos++] = s;
			continue;
		}
		if (strcmp(s, "--") == 0) {
			opts_done = true;
			continue;
		}
		const char *name = s[1] == '-' ? s + 2 : s + 1;
		if (strcmp(s, "-o") == 0)
			name = "output";
		else if (strcmp(s, "-h") == 0)
			name = "help";
		else if (strcmp(s, "-v") == 0)
			name = "verbose";
		else if (s[1] != '-') {
			fprintf(stderr, "bertctl: unknown option %s\n", s);
			return CLI_USAGE;
		}
		char nm[64];
		const char *eq = strchr(name, '=');
		snprintf(nm, sizeof nm, "%.*s", eq ? (int)(eq - name) : (int)strlen(name), name);
		if (strcmp(nm, "token") == 0) {
			fprintf(stderr, "bertctl: the token is never taken on the command line (it would show in ps "
					"and the shell's history): set BERTD_TOKEN_FILE or BERTD_TOKEN, or token_file in "
					"~/.config/bertctl/config\n");
			return CLI_USAGE;
		}
		bool has_arg = false;
		if (!opt_known(global_opts, nm, &has_arg) && !opt_known(spec, nm, &has_arg)) {
			fprintf(stderr, "bertctl: unknown option --%s\n", nm);
			return CLI_USAGE;
		}
		const char *v = "";
		if (has_arg) {
			if (eq)
				v = eq + 1;
			else if (i + 1 < argc)
				v = argv[++i];
			else {
				fprintf(stderr, "bertctl: --%s needs a value\n", nm);
				return CLI_USAGE;
			}
		} else if (eq) {
			fprintf(stderr, "bertctl: --%s takes no value\n", nm);
			return CLI_USAGE;
		}
		if (a->n == MAX_OPTS) {
			fprintf(stderr, "bertctl: too many options\n");
			return CLI_USAGE;
		}
		char *copy = strdup(nm);
		if (!copy)
			return CLI_ERROR;
		a->name[a->n] = copy;
		a->val[a->n++] = v;
	}
	return CLI_OK;
}

static void args_free(args *a)
{
	for (int i = 0; i < a->n; i++)
		free((char *)a->name[i]);
}

/* The last value of option name, or NULL. */
static const char *opt(const args *a, const char *name)
{
	const char *v = NULL;
	for (int i = 0; i < a->n; i++)
		if (strcmp(a->name[i], name) == 0)
			v = a->val[i];
	return v;
}

static bool flag(const args *a, const char *name)
{
	return opt(a, name) != NULL;
}

/* An integer option in [lo, hi] into *out (untouched when absent). */
static int opt_long(const args *a, const char *name, long lo, long hi, long *out)
{
	const char *v = opt(a, name);
	if (!v)
		return CLI_OK;
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || end == v || *end || x < lo || x > hi) {
		fprintf(stderr, "bertctl: --%s: \"%s\" is not an integer in [%ld, %ld]\n", name, v, lo, hi);
		return CLI_USAGE;
	}
	*out = x;
	return CLI_OK;
}

static int want_pos(const args *a, int lo, int hi, const char *usage)
{
	if (a->npos < lo || a->npos > hi) {
		fprintf(stderr, "usage: bertctl %s\n", usage);
		return CLI_USAGE;
	}
	return CLI_OK;
}

/* ---------------------------------------------------------------- helpers */

/* Prints a 2xx answer's JSON as is (--json). */
static int print_body(const clihttp_resp *r)
{
	if (r->body)
		fputs(r->body, stdout);
	if (r->len && r->body[r->len - 1] != '\n')
		putchar('\n');
	return ferror(stdout) ? CLI_ERROR : CLI_OK;
}

static json_t *body_json(const char *method, const char *path, const clihttp_resp *r)
{
	json_error_t e;
	json_t *j = r->body ? json_loads(r->body, 0, &e) : NULL;
	if (!j)
		fprintf(stderr, "bertctl: %s %s: the answer is not JSON\n", method, path);
	return j;
}

static const char *jstr(const json_t *o, const char *key)
{
	return json_string_value(json_object_get(o, key));
}

/* A number of o as text ("-" when absent or null). */
static const char *jnum(const json_t *o, const char *key, const char *fmt, char *buf, size_t n)
{
	json_t *v = json_object_get(o, key);
	if (json_is_integer(v))
		snprintf(buf, n, "%lld", (long long)json_integer_value(v));
	else if (json_is_real(v))
		snprintf(buf, n, fmt, json_real_value(v));
	else
		snprintf(buf, n, "-");
	return buf;
}

/* "2026-12-01T12:56:08.604Z" as "2026-12-01 12:56:08". */
static const char *short_time(const char *t, char *buf, size_t n)
{
	if (!t)
		return "-";
	snprintf(buf, n, "%.19s", t);
	if (strlen(buf) > 10 && buf[10] == 'T')
		buf[10] = ' ';
	return buf;
}

/* The whole of f, NUL-terminated (caller frees), its length in *len. */
static char *slurp(FILE *f, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		n += fread(buf + n, 1, cap - n - 1, f);
		if (n < cap - 1)
			break;
		char *bigger = realloc(buf, cap *= 2);
		if (!bigger)
			free(buf);
		buf = bigger;
	}
	if (buf && ferror(f)) {
		free(buf);
		buf = NULL;
	}
	if (buf)
		buf[n] = 0;
	*len = n;
	return buf;
}

static int ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), t = strlen(tail);
	return n >= t && strcmp(s + n - t, tail) == 0;
}

/* Reads a spec from path ("-": stdin) as a JSON object (caller owns). A
 * .yaml or .yml file is YAML, a .json file JSON; anything else (stdin
 * too) is read as JSON, and as YAML when it is not JSON. Prints why and
 * returns NULL when it cannot. */
static json_t *read_spec_file(const char *path)
{
	const char *name = strcmp(path, "-") ? path : "stdin";
	int yaml = ends_with(path, ".yaml") || ends_with(path, ".yml");
	int json = ends_with(path, ".json");
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t len = 0;
	char *buf = f ? slurp(f, &len) : NULL;
	json_t *j = NULL;
	json_error_t e;
	char yerr[300];
	if (f && f != stdin)
		fclose(f);
	if (!buf) {
		fprintf(stderr, "bertctl: %s: %s\n", name, strerror(errno));
		return NULL;
	}
	if (!yaml)
		j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
	if (!j && !json) {
		j = yaml2json_load(buf, len, yerr, sizeof yerr);
		if (!j) {
			/* neither: the error of the format it looks like */
			const char *p = buf + strspn(buf, " \t\r\n");
			if (!yaml && (*p == '{' || *p == '['))
				fprintf(stderr, "bertctl: %s: %s (line %d, column %d)\n", name, e.text, e.line,
					e.column);
			else
				fprintf(stderr, "bertctl: %s: YAML: %s\n", name, yerr);
		}
	} else if (!j)
		fprintf(stderr, "bertctl: %s: %s (line %d, column %d)\n", name, e.text, e.line, e.column);
	free(buf);
	if (j && !json_is_object(j)) {
		fprintf(stderr, "bertctl: %s: the spec is not an object (a JSON object or a YAML mapping)\n", name);
		json_decref(j);
		j = NULL;
	}
	return j;
}

/* Sets the dotted path in o to v (stolen), making the objects on the way. */
static int set_path(json_t *o, const char *path, json_t *v)
{
	char key[128];
	const char *dot = strchr(path, '.');
	if (!v)
		return CLI_ERROR;
	if (!dot) {
		json_object_set_new(o, path, v);
		return CLI_OK;
	}
	snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
	json_t *sub = json_object_get(o, key);
	if (!json_is_object(sub)) {
		sub = json_object();
		json_object_set_new(o, key, sub);
	}
	return set_path(sub, dot + 1, v);
}

/* Bounds of a spec value bertctl passes on: the daemon checks the key's
 * own range and names the field when it refuses it. */
#define SPEC_MIN (-(1L << 53))
#define SPEC_MAX (1L << 53)

/* --flag VALUE as an integer at path. */
static int flag_int(const args *a, const char *name, const char *path, long lo, long hi, json_t *spec)
{
	const char *v = opt(a, name);
	long x = 0;
	int rc = opt_long(a, name, lo, hi, &x);
	if (rc == CLI_OK && v)
		rc = set_path(spec, path, json_integer(x));
	return rc;
}

static int flag_str(const args *a, const char *name, const char *path, json_t *spec)
{
	const char *v = opt(a, name);
	return v ? set_path(spec, path, json_string(v)) : CLI_OK;
}

/* Every --NAME VALUE of a repeatable option as a JSON array at path. */
static int flag_list(const args *a, const char *name, const char *path, json_t *spec)
{
	json_t *arr = json_array();
	for (int i = 0; i < a->n; i++)
		if (strcmp(a->name[i], name) == 0)
			json_array_append_new(arr, json_string(a->val[i]));
	if (json_array_size(arr) == 0) {
		json_decref(arr);
		return CLI_OK;
	}
	return set_path(spec, path, arr);
}

/* --set PATH=VALUE: VALUE as JSON when it reads as JSON, else a string. */
static int flag_sets(const args *a, json_t *spec)
{
	for (int i = 0; i < a->n; i++) {
		if (strcmp(a->name[i], "set") != 0)
			continue;
		const char *eq = strchr(a->val[i], '=');
		if (!eq || eq == a->val[i]) {
			fprintf(stderr, "bertctl: --set %s: want KEY.PATH=VALUE\n", a->val[i]);
			return CLI_USAGE;
		}
		char path[128];
		snprintf(path, sizeof path, "%.*s", (int)(eq - a->val[i]), a->val[i]);
		json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
		if (!v)
			v = json_string(eq + 1);
		set_path(spec, path, v);
	}
	return CLI_OK;
}

static char *dumps(const json_t *j)
{
	return json_dumps(j, JSON_COMPACT);
}

/* ---------------------------------------------------------------- jobs */

static int cmd_submit(cli *c, args *a)
{
	int rc = want_pos(a, 0, 1, "submit [FILE|-] [--dataset D] [--preset P] [--max-steps N] ...");
	if (rc)
		return rc;
	json_t *spec = a->npos ? read_spec_file(a->pos[0]) : json_object();
	if (!spec)
		return CLI_ERROR;
	char *body = NULL, hdr[300];
	clihttp_resp r = {0};
	if ((rc = flag_str(a, "dataset", "dataset", spec)) || (rc = flag_str(a, "preset", "model.preset", spec)) ||
	    (rc = flag_str(a, "name", "name", spec)) || (rc = flag_str(a, "notes", "notes", spec)) ||
	    (rc = flag_list(a, "tag", "tags", spec)) ||
	    (rc = flag_int(a, "priority", "priority", SPEC_MIN, SPEC_MAX, spec)) ||
	    (rc = flag_int(a, "max-steps", "training_args.max_steps", SPEC_MIN, SPEC_MAX, spec)) ||
	    (rc = flag_int(a, "batch-size", "training_args.per_device_train_batch_size", SPEC_MIN, SPEC_MAX, spec)) ||
	    (rc = flag_int(a, "max-seq-length", "training_args.max_seq_length", SPEC_MIN, SPEC_MAX, spec)) ||
	    (rc = flag_int(a, "gpus", "resources.gpus", SPEC_MIN, SPEC_MAX, spec)) || (rc = flag_sets(a, spec)))
		goto out;
	const char *lr = opt(a, "learning-rate");
	if (lr) {
		char *end;
		double x = strtod(lr, &end);
		if (end == lr || *end) {
			fprintf(stderr, "bertctl: --learning-rate: \"%s\" is not a number\n", lr);
			rc = CLI_USAGE;
			goto out;
		}
		set_path(spec, "training_args.learning_rate", json_real(x));
	}
	if (!json_object_get(spec, "dataset")) {
		fprintf(stderr, "bertctl: submit: the spec names no dataset (--dataset NAME, or \"dataset\" in the file)\n");
		rc = CLI_USAGE;
		goto out;
	}
	body = dumps(spec);
	const char *key = opt(a, "idempotency-key");
	if (key)
		snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", key);
	rc = clihttp_do(c, "POST", "/v1/jobs", body, key ? hdr : NULL, NULL, &r);
	if (rc)
		goto out;
	if (c->json) {
		rc = print_body(&r);
		goto out;
	}
	json_t *job = body_json("POST", "/v1/jobs", &r);
	if (!job) {
		rc = CLI_HTTP_5XX;
		goto out;
	}
	printf("%s %s (%s)\n", jstr(job, "id"), jstr(job, "state"), jstr(job, "name"));
	json_decref(job);
out:
	clihttp_resp_free(&r);
	free(body);
	json_decref(spec);
	return rc;
}

static void job_row(table *t, const json_t *j)
{
	char step[64], loss[32], pr[16], ct[32];
	const json_t *p = json_object_get(j, "progress");
	snprintf(step, sizeof step, "%lld/%lld", (long long)json_integer_value(json_object_get(p, "step")),
		 (long long)json_integer_value(json_object_get(p, "max_steps")));
	const char *cells[] = {jstr(j, "id"), jstr(j, "name"), jstr(j, "state"), jnum(j, "priority", "%g", pr, sizeof pr),
			       step, jnum(p, "loss", "%.4f", loss, sizeof loss), jstr(j, "owner"),
			       short_time(jstr(j, "created_at"), ct, sizeof ct)};
	table_row(t, cells);
}

static int cmd_list(cli *c, args *a)
{
	int rc = want_pos(a, 0, 0, "list [--state S[,S]] [--tag T] [--owner O] [--limit N | --all] [--order asc|desc]");
	long limit = 20;
	if (rc || (rc = opt_long(a, "limit", 1, 1000000000, &limit)))
		return rc;
	bool all = flag(a, "all");
	json_t *jobs = json_array();
	json_t *next = json_null();
	char cursor[256] = "";
	table t;
	table_init(&t, "ID", "NAME", "STATE", "PRI", "STEP", "LOSS", "OWNER", "CREATED", NULL);
	do {
		char path[1024], e[300];
		/* a page never holds more than is wanted, so the API's next_cursor
		 * printed with --json points just after the last job listed */
		long want = all ? 100 : limit - (long)json_array_size(jobs);
		int n = snprintf(path, sizeof path, "/v1/jobs?limit=%ld", want > 100 ? 100 : want);
		const char *keys[] = {"state", "tag", "owner", "order"};
		for (size_t k = 0; k < 4; k++) {
			const char *v = opt(a, keys[k]);
			if (v)
				n += snprintf(path + n, sizeof path - (size_t)n, "&%s=%s", keys[k],
					      clihttp_escape(v, e, sizeof e));
		}
		if (cursor[0])
			snprintf(path + n, sizeof path - (size_t)n, "&cursor=%s", clihttp_escape(cursor, e, sizeof e));
		clihttp_resp r;
		rc = clihttp_do(c, "GET", path, NULL, NULL, NULL, &r);
		json_t *page = rc ? NULL : body_json("GET", path, &r);
		clihttp_resp_free(&r);
		if (!page) {
			rc = rc ? rc : CLI_HTTP_5XX;
			break;
		}
		size_t i;
		json_t *j;
		json_array_foreach(json_object_get(page, "jobs"), i, j)
		{
			json_array_append(jobs, j);
			job_row(&t, j);
		}
		json_decref(next);
		next = json_incref(json_object_get(page, "next_cursor"));
		snprintf(cursor, sizeof cursor, "%s", json_is_string(next) ? json_string_value(next) : "");
		json_decref(page);
	} while (cursor[0] && (all || (long)json_array_size(jobs) < limit));
	if (rc == CLI_OK && c->json) {
		/* the API's page shape, holding every job listed */
		json_t *o = json_pack("{s:O, s:O}", "jobs", jobs, "next_cursor", next ? next : json_null());
		char *txt = dumps(o);
		printf("%s\n", txt);
		free(txt);
		json_decref(o);
	} else if (rc == CLI_OK) {
		table_print(&t, stdout);
	}
	table_free(&t);
	json_decref(jobs);
	json_decref(next);
	return rc;
}

static void kv(const char *k, const char *v)
{
	printf("%-16s %s\n", k, v ? v : "-");
}

static int cmd_show(cli *c, args *a)
{
	int rc = want_pos(a, 1, 1, "show ID");
	if (rc)
		return rc;
	char path[300], e[200], b[256], b2[64];
	snprintf(path, sizeof path, "/v1/jobs/%s", clihttp_escape(a->pos[0], e, sizeof e));
	clihttp_resp r;
	rc = clihttp_do(c, "GET", path, NULL, NULL, NULL, &r);
	if (rc || c->json) {
		if (!rc)
			rc = print_body(&r);
		clihttp_resp_free(&r);
		return rc;
	}
	json_t *j = body_json("GET", path, &r);
	clihttp_resp_free(&r);
	if (!j)
		return CLI_HTTP_5XX;
	const json_t *p = json_object_get(j, "progress");
	kv("id", jstr(j, "id"));
	kv("name", jstr(j, "name"));
	kv("state", jstr(j, "state"));
	kv("priority", jnum(j, "priority", "%g", b, sizeof b));
	char *tags = dumps(json_object_get(j, "tags"));
	kv("tags", tags);
	free(tags);
	kv("owner", jstr(j, "owner"));
	kv("notes", jstr(j, "notes"));
	kv("created", jstr(j, "created_at"));
	kv("started", jstr(j, "started_at"));
	kv("finished", jstr(j, "finished_at"));
	kv("restarts", jnum(j, "restart_count", "%g", b, sizeof b));
	if (jstr(j, "failure_reason"))
		kv("failure", jstr(j, "failure_reason"));
	snprintf(b, sizeof b, "%lld/%lld", (long long)json_integer_value(json_object_get(p, "step")),
		 (long long)json_integer_value(json_object_get(p, "max_steps")));
	kv("step", b);
	kv("loss", jnum(p, "loss", "%.4f", b, sizeof b));
	kv("learning_rate", jnum(p, "learning_rate", "%.3g", b, sizeof b));
	kv("tokens/s", jnum(p, "tokens_per_s", "%.0f", b, sizeof b));
	if (json_object_get(p, "eta_seconds"))
		kv("eta_seconds", jnum(p, "eta_seconds", "%.0f", b, sizeof b));
	const json_t *ck = json_object_get(j, "last_checkpoint");
	if (json_is_object(ck))
		snprintf(b, sizeof b, "step %s: %s", jnum(ck, "step", "%g", b2, sizeof b2), jstr(ck, "path"));
	kv("last_checkpoint", json_is_object(ck) ? b : NULL);
	kv("model_dir", jstr(j, "model_dir"));
	kv("diagnosis", jstr(j, "diagnosis"));
	json_decref(j);
	return ferror(stdout) ? CLI_ERROR : CLI_OK;
}

static int cmd_follow(cli *c, args *a)
{
	int rc = want_pos(a, 1, 1, "follow ID [--no-logs | --no-events] [--rank N | --loader N] [--tail N] [--retry-s S]");
	follow_opts o = {.events = !flag(a, "no-events"), .logs = !flag(a, "no-logs"), .loader = -1, .tail = -1,
			 .retry_s = 300};
	long rank = 0, loader = -1, retry = 300;
	if (rc || (rc = opt_long(a, "rank", 0, 1000000, &rank)) || (rc = opt_long(a, "loader", 0, 1000000, &loader)) ||
	    (rc = opt_long(a, "tail", 1, 10000, &o.tail)) || (rc = opt_long(a, "retry-s", 0, 86400 * 7, &retry)))
		return rc;
	if (!o.events && !o.logs) {
		fprintf(stderr, "bertctl: follow: --no-logs and --no-events leave nothing to follow\n");
		return CLI_USAGE;
	}
	o.rank = (int)rank;
	o.loader = (int)loader;
	o.retry_s = (int)retry;
	return follow_job(c, a->pos[0], &o);
}

/* POST/DELETE on a job that answers with the job (or nothing). */
static int job_action(cli *c, args *a, const char *method, const char *suffix, const char *query, const char *usage)
{
	int rc = want_pos(a, 1, 1, usage);
	if (rc)
		return rc;
	char path[400], e[200];
	snprintf(path, sizeof path, "/v1/jobs/%s%s%s", clihttp_escape(a->pos[0], e, sizeof e), suffix, query);
	clihttp_resp r;
	rc = clihttp_do(c, method, path, NULL, NULL, NULL, &r);
	if (rc == CLI_OK && r.len) {
		json_t *j = c->json ? NULL : body_json(method, path, &r);
		if (c->json)
			rc = print_body(&r);
		else if (j)
			printf("%s %s\n", jstr(j, "id"), jstr(j, "state"));
		json_decref(j);
	} else if (rc == CLI_OK && !c->json) {
		printf("%s deleted\n", a->pos[0]);
	}
	clihttp_resp_free(&r);
	return rc;
}

static int cmd_cancel(cli *c, args *a)
{
	return job_action(c, a, "POST", "/cancel", "", "cancel ID");
}

static int cmd_delete(cli *c, args *a)
{
	return job_action(c, a, "DELETE", "", flag(a, "keep-files") ? "?keep_files=true" : "", "delete ID [--keep-files]");
}

static int cmd_patch(cli *c, args *a)
{
	int rc = want_pos(a, 1, 1, "patch ID [--priority N] [--name S] [--tag T ... | --no-tags] [--notes S | --no-notes]");
	if (rc)
		return rc;
	json_t *body = json_object();
	char *txt = NULL, path[300], e[200];
	clihttp_resp r = {0};
	if ((rc = flag_int(a, "priority", "priority", SPEC_MIN, SPEC_MAX, body)) || (rc = flag_str(a, "name", "name", body)) ||
	    (rc = flag_str(a, "notes", "notes", body)) || (rc = flag_list(a, "tag", "tags", body)))
		goto out;
	if (flag(a, "no-tags"))
		json_object_set_new(body, "tags", json_array());
	if (flag(a, "no-notes"))
		json_object_set_new(body, "notes", json_null());
	if (json_object_size(body) == 0) {
		fprintf(stderr, "bertctl: patch: nothing to change (--priority, --name, --tag, --no-tags, --notes, --no-notes)\n");
		rc = CLI_USAGE;
		goto out;
	}
	txt = dumps(body);
	snprintf(path, sizeof path, "/v1/jobs/%s", clihttp_escape(a->pos[0], e, sizeof e));
	rc = clihttp_do(c, "PATCH", path, txt, NULL, NULL, &r);
	if (rc)
		goto out;
	if (c->json) {
		rc = print_body(&r);
		goto out;
	}
	json_t *j = body_json("PATCH", path, &r);
	if (j) {
		char pr[32];
		char *tags = dumps(json_object_get(j, "tags"));
		printf("%s %s priority %s name %s tags %s\n", jstr(j, "id"), jstr(j, "state"),
		       jnum(j, "priority", "%g", pr, sizeof pr), jstr(j, "name"), tags ? tags : "[]");
		free(tags);
	}
	json_decref(j);
out:
	clihttp_resp_free(&r);
	free(txt);
	json_decref(body);
	return rc;
}

/* GET path into a temporary file beside the target, renamed once complete,
 * so an interrupted download never leaves a partial file under the name. */
static int cmd_download(cli *c, args *a)
{
	int rc = want_pos(a, 1, 1, "download ID [--checkpoint STEP [--hf]] [-o FILE|DIR|-]");
	long step = -1;
	if (rc || (rc = opt_long(a, "checkpoint", 0, 2000000000, &step)))
		return rc;
	if (flag(a, "hf") && step < 0) {
		fprintf(stderr, "bertctl: download: --hf converts a checkpoint: give --checkpoint STEP\n");
		return CLI_USAGE;
	}
	char path[400], e[200];
	int n = snprintf(path, sizeof path, "/v1/jobs/%s", clihttp_escape(a->pos[0], e, sizeof e));
	if (step >= 0)
		snprintf(path + n, sizeof path - (size_t)n, "/checkpoints/%ld%s", step, flag(a, "hf") ? "/export" : "");
	else
		snprintf(path + n, sizeof path - (size_t)n, "/export");
	const char *out = opt(a, "output");
	clihttp_resp r = {0};
	if (out && strcmp(out, "-") == 0) {
		rc = clihttp_do(c, "GET", path, NULL, NULL, stdout, &r);
		clihttp_resp_free(&r);
		return rc;
	}
	char dir[1024], target[1400], tmp[1400];
	struct stat sb;
	bool into_dir = !out || (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)) || out[strlen(out) - 1] == '/';
	if (into_dir) {
		snprintf(dir, sizeof dir, "%s", out ? out : ".");
		for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--)
			dir[n - 1] = 0;
		if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
			fprintf(stderr, "bertctl: download: %s is not a directory\n", dir);
			return CLI_ERROR;
		}
	} else {
		char copy[1024];
		snprintf(copy, sizeof copy, "%s", out);
		snprintf(dir, sizeof dir, "%s", dirname(copy));
	}
	snprintf(tmp, sizeof tmp, "%s/.bertctl-download-XXXXXX", dir);
	int fd = mkstemp(tmp);
	if (fd < 0) {
		fprintf(stderr, "bertctl: download: cannot create a file in %s: %s\n", dir, strerror(errno));
		return CLI_ERROR;
	}
	FILE *f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(tmp);
		return CLI_ERROR;
	}
	rc = clihttp_do(c, "GET", path, NULL, NULL, f, &r);
	if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
		if (rc == CLI_OK)
			fprintf(stderr, "bertctl: download: writing %s: %s\n", tmp, strerror(errno));
		rc = rc ? rc : CLI_ERROR;
	}
	fclose(f);
	if (rc == CLI_OK) {
		if (into_dir)
			snprintf(target, sizeof target, "%s/%s", dir, r.disposition[0] ? r.disposition : "download.tar");
		else
			snprintf(target, sizeof target, "%s", out);
		/* mkstemp makes it 0600; a download is an ordinary file */
		mode_t um = umask(0);
		umask(um);
		chmod(tmp, 0666 & ~um);
		if (rename(tmp, target) != 0) {
			fprintf(stderr, "bertctl: download: cannot rename into %s: %s\n", target, strerror(errno));
			rc = CLI_ERROR;
		} else if (c->json) {
			json_t *o = json_pack("{s:s}", "file", target);
			char *txt = dumps(o);
			printf("%s\n", txt);
			free(txt);
			json_decref(o);
		} else {
			printf("%s\n", target);
		}
	}
	if (rc != CLI_OK)
		unlink(tmp);
	clihttp_resp_free(&r);
	return rc;
}

/* ---------------------------------------------------------------- datasets */

static void dataset_row(table *t, const json_t *d)
{
	char frac[32], tok[32];
	const json_t *p = json_object_get(d, "progress");
	json_t *fv = json_object_get(p, "fraction");
	if (json_is_number(fv))
		snprintf(frac, sizeof frac, "%.0f%%", 100 * json_number_value(fv));
	else
		snprintf(frac, sizeof frac, "-");
	const char *cells[] = {jstr(d, "name"), jstr(d, "state"), frac,
			       jnum(json_object_get(d, "stats"), "tokens", "%.0f", tok, sizeof tok), jstr(d, "id"),
			       jstr(d, "error") ? jstr(d, "error") : ""};
	table_row(t, cells);
}

static int ds_show_one(cli *c, const char *name, bool wait)
{
	char path[300], e[200];
	snprintf(path, sizeof path, "/v1/datasets/%s", clihttp_escape(name, e, sizeof e));
	for (;;) {
		clihttp_resp r;
		int rc = clihttp_do(c, "GET", path, NULL, NULL, NULL, &r);
		json_t *d = rc ? NULL : body_json("GET", path, &r);
		if (!d) {
			clihttp_resp_free(&r);
			return rc ? rc : CLI_HTTP_5XX;
		}
		const char *st = jstr(d, "state");
		bool live = st && (strcmp(st, "queued") == 0 || strcmp(st, "preparing") == 0);
		if (!wait || !live) {
			if (c->json) {
				rc = print_body(&r);
			} else {
				table t;
				table_init(&t, "NAME", "STATE", "DONE", "TOKENS", "ID", "ERROR", NULL);
				dataset_row(&t, d);
				table_print(&t, stdout);
				kv("path", jstr(d, "path"));
			}
			if (rc == CLI_OK && wait && st && strcmp(st, "failed") == 0)
				rc = CLI_JOB_FAILED;
			json_decref(d);
			clihttp_resp_free(&r);
			return rc;
		}
		json_decref(d);
		clihttp_resp_free(&r);
		struct timespec ts = {1, 0}; /* a preparation takes seconds to hours: poll once a second */
		nanosleep(&ts, NULL);
	}
}

static int ds_list(cli *c, args *a)
{
	int rc = want_pos(a, 1, 1, "datasets list");
	if (rc)
		return rc;
	clihttp_resp r;
	rc = clihttp_do(c, "GET", "/v1/datasets", NULL, NULL, NULL, &r);
	if (rc || c->json) {
		if (!rc)
			rc = print_body(&r);
		clihttp_resp_free(&r);
		return rc;
	}
	json_t *l = body_json("GET", "/v1/datasets", &r);
	clihttp_resp_free(&r);
	if (!l)
		return CLI_HTTP_5XX;
	table t;
	table_init(&t, "NAME", "STATE", "DONE", "TOKENS", "ID", "ERROR", NULL);
	size_t i;
	json_t *d;
	json_array_foreach(json_object_get(l, "datasets"), i, d)
		dataset_row(&t, d);
	table_print(&t, stdout);
	json_decref(l);
	return CLI_OK;
}

static int ds_create(cli *c, args *a)
{
	int rc = want_pos(a, 1, 2, "datasets create [FILE|-] --name N --source PATH ... (--vocab-file F | --vocab-size N) [--wait]");
	if (rc)
		return rc;
	json_t *spec = a->npos == 2 ? read_spec_file(a->pos[1]) : json_object();
	if (!spec)
		return CLI_ERROR;
	char *body = NULL;
	clihttp_resp r = {0};
	if ((rc = flag_str(a, "name", "name", spec)) || (rc = flag_str(a, "format", "format", spec)) ||
	    (rc = flag_str(a, "text-field", "text_field", spec)) || (rc = flag_str(a, "vocab-file", "vocab.file", spec)) ||
	    (rc = flag_str(a, "prepared", "prepared", spec)) ||
	    (rc = flag_int(a, "vocab-size", "vocab.train.vocab_size", SPEC_MIN, SPEC_MAX, spec)) ||
	    (rc = flag_int(a, "threads", "threads", SPEC_MIN, SPEC_MAX, spec)) || (rc = flag_list(a, "include", "include", spec)) ||
	    (rc = flag_list(a, "exclude", "exclude", spec)) || (rc = flag_sets(a, spec)))
		goto out;
	json_t *src = NULL;
	for (int i = 0; i < a->n; i++)
		if (strcmp(a->name[i], "source") == 0) {
			if (!src)
				src = json_array();
			json_array_append_new(src, json_string(a->val[i]));
		}
	if (src && json_array_size(src) == 1)
		json_object_set(spec, "source", json_array_get(src, 0));
	else if (src)
		json_object_set(spec, "source", src);
	json_decref(src);
	if (flag(a, "lowercase") || flag(a, "cased"))
		json_object_set_new(spec, "lowercase", json_boolean(flag(a, "lowercase")));
	const char *name = jstr(spec, "name");
	if (!name) {
		fprintf(stderr, "bertctl: datasets create: give --name (or \"name\" in the file)\n");
		rc = CLI_USAGE;
		goto out;
	}
	body = dumps(spec);
	rc = clihttp_do(c, "POST", "/v1/datasets", body, NULL, NULL, &r);
	if (rc)
		goto out;
	if (flag(a, "wait")) {
		rc = ds_show_one(c, name, true);
	} else if (c->json) {
		rc = print_body(&r);
	} else {
		json_t *d = body_json("POST", "/v1/datasets", &r);
		if (d)
			printf("%s %s (%s)\n", jstr(d, "name"), jstr(d, "state"), jstr(d, "id"));
		json_decref(d);
	}
out:
	clihttp_resp_free(&r);
	free(body);
	json_decref(spec);
	return rc;
}

static int ds_delete(cli *c, args *a)
{
	int rc = want_pos(a, 2, 2, "datasets delete NAME");
	if (rc)
		return rc;
	char path[300], e[200];
	snprintf(path, sizeof path, "/v1/datasets/%s", clihttp_escape(a->pos[1], e, sizeof e));
	clihttp_resp r;
	rc = clihttp_do(c, "DELETE", path, NULL, NULL, NULL, &r);
	if (rc == CLI_OK) {
		if (c->json && r.len)
			rc = print_body(&r);
		else if (!c->json)
			/* 202: it was preparing and is canceled; 204: removed */
			printf("%s %s\n", a->pos[1], r.status == 202 ? "canceled (delete again to remove it)" : "deleted");
	}
	clihttp_resp_free(&r);
	return rc;
}

static int cmd_datasets(cli *c, args *a)
{
	const char *sub = a->npos ? a->pos[0] : "list";
	if (a->npos == 0)
		a->pos[a->npos++] = "list";
	if (strcmp(sub, "list") == 0)
		return ds_list(c, a);
	if (strcmp(sub, "show") == 0) {
		int rc = want_pos(a, 2, 2, "datasets show NAME [--wait]");
		return rc ? rc : ds_show_one(c, a->pos[1], flag(a, "wait"));
	}
	if (strcmp(sub, "create") == 0)
		return ds_create(c, a);
	if (strcmp(sub, "delete") == 0)
		return ds_delete(c, a);
	fprintf(stderr, "bertctl: datasets: unknown subcommand \"%s\" (list, show, create, delete)\n", sub);
	return CLI_USAGE;
}

static int cmd_version(cli *c, args *a)
{
	int rc = want_pos(a, 0, 0, "version");
	if (rc)
		return rc;
	clihttp_resp r;
	rc = clihttp_do(c, "GET", "/v1/version", NULL, NULL, NULL, &r);
	if (rc == CLI_OK && c->json) {
		rc = print_body(&r);
	} else if (rc == CLI_OK) {
		json_t *v = body_json("GET", "/v1/version", &r);
		if (!v) {
			clihttp_resp_free(&r);
			return CLI_HTTP_5XX;
		}
		printf("bertctl %s\nbertd %s (api %s) at %s\n", BERTD_VERSION, jstr(v, "version"), jstr(v, "api"), c->url);
		json_decref(v);
	}
	clihttp_resp_free(&r);
	return rc;
}

/* ---------------------------------------------------------------- main */

static int cmd_help(cli *c, args *a);

static const command commands[] = {
	{"submit", " dataset= preset= max-steps= name= priority= tag= notes= learning-rate= batch-size= "
		   "max-seq-length= gpus= set= idempotency-key= ",
	 cmd_submit, "submit [FILE|-] [--dataset D] [--preset P] [--max-steps N] [--name S] [--priority N] [--tag T]... "
		     "[--notes S] [--learning-rate X] [--batch-size N] [--max-seq-length N] [--gpus N] "
		     "[--set KEY.PATH=JSON]... [--idempotency-key K]"},
	{"list", " state= tag= owner= limit= all order= ", cmd_list,
	 "list [--state S[,S]] [--tag T] [--owner O] [--limit N | --all] [--order asc|desc]"},
	{"show", " ", cmd_show, "show ID"},
	{"follow", " no-logs no-events rank= loader= tail= retry-s= ", cmd_follow,
	 "follow ID [--no-logs | --no-events] [--rank N | --loader N] [--tail N] [--retry-s S]"},
	{"cancel", " ", cmd_cancel, "cancel ID"},
	{"delete", " keep-files ", cmd_delete, "delete ID [--keep-files]"},
	{"patch", " priority= name= tag= no-tags notes= no-notes ", cmd_patch,
	 "patch ID [--priority N] [--name S] [--tag T ... | --no-tags] [--notes S | --no-notes]"},
	{"download", " checkpoint= hf output= ", cmd_download, "download ID [--checkpoint STEP [--hf]] [-o FILE|DIR|-]"},
	{"datasets", " name= source= vocab-file= vocab-size= format= text-field= lowercase cased threads= include= "
		     "exclude= prepared= set= wait ",
	 cmd_datasets,
	 "datasets list | show NAME [--wait] | delete NAME\n"
	 "       bertctl datasets create [FILE|-] --name N --source PATH... (--vocab-file F | --vocab-size N)\n"
	 "                [--format text|jsonl] [--text-field K] [--lowercase | --cased] [--threads N]\n"
	 "                [--include PAT]... [--exclude PAT]... [--set KEY.PATH=JSON]... [--wait]\n"
	 "       bertctl datasets create --name N --prepared DIR"},
	{"version", " ", cmd_version, "version"},
	{"help", " ", cmd_help, "help [COMMAND]"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
	fprintf(out, "usage: bertctl [--url URL] [--cacert FILE] [--config FILE] [--json] [-v] COMMAND [ARGS]\n\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(out, "  bertctl %s\n", commands[i].usage);
	fprintf(out, "\nThe daemon: --url, $BERTD_URL or the config file's url (default http://127.0.0.1:8420).\n"
		     "The token: $BERTD_TOKEN, $BERTD_TOKEN_FILE, or the config file's token / token_file\n"
		     "(~/.config/bertctl/config); never an argument.\n"
		     "Exit codes: 0 ok, 1 local error, 2 usage, 3 HTTP 4xx, 4 HTTP 5xx or no connection,\n"
		     "5 the job (or dataset) failed, 6 the job was canceled. See docs/cli.md.\n");
}

static int cmd_help(cli *c, args *a)
{
	(void)c;
	for (size_t i = 0; a->npos == 1 && i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, a->pos[0]) == 0) {
			printf("usage: bertctl %s\n", commands[i].usage);
			return CLI_OK;
		}
	usage(stdout);
	return CLI_OK;
}

int main(int argc, char **argv)
{
	cli c = {0};
	args a = {0};
	int rc, i = 1;
	const command *cmd = NULL;
	/* global options may come before the command too */
	args pre = {0};
	while (i < argc && argv[i][0] == '-' && strcmp(argv[i], "-") != 0) {
		bool has_arg = false;
		const char *nm = argv[i][1] == '-' ? argv[i] + 2 : argv[i] + 1;
		char name[64];
		snprintf(name, sizeof name, "%.*s", (int)strcspn(nm, "="), nm);
		if (strcmp(argv[i], "--version") == 0) {
			printf("bertctl %s\n", BERTD_VERSION);
			return CLI_OK;
		}
		if (!(opt_known(global_opts, name, &has_arg) || strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "-v") == 0) &&
		    strcmp(name, "token") != 0) {
			fprintf(stderr, "bertctl: unknown option %s (before the command)\n", argv[i]);
			return CLI_USAGE;
		}
		i += has_arg && !strchr(nm, '=') ? 2 : 1;
	}
	if ((rc = args_parse(i - 1, argv + 1, "", &pre)) != CLI_OK)
		goto out;
	if (i >= argc) {
		usage(flag(&pre, "help") ? stdout : stderr);
		rc = flag(&pre, "help") ? CLI_OK : CLI_USAGE;
		goto out;
	}
	for (size_t k = 0; k < NCOMMANDS; k++)
		if (strcmp(commands[k].name, argv[i]) == 0)
			cmd = &commands[k];
	if (!cmd) {
		fprintf(stderr, "bertctl: unknown command \"%s\"\n", argv[i]);
		usage(stderr);
		rc = CLI_USAGE;
		goto out;
	}
	if ((rc = args_parse(argc - i - 1, argv + i + 1, cmd->opts, &a)) != CLI_OK) {
		fprintf(stderr, "usage: bertctl %s\n", cmd->usage);
		goto out;
	}
	if (flag(&a, "help") || flag(&pre, "help")) {
		printf("usage: bertctl %s\n", cmd->usage);
		rc = CLI_OK;
		goto out;
	}
	c.json = flag(&pre, "json") || flag(&a, "json");
	c.verbose = flag(&pre, "verbose") || flag(&a, "verbose");
	const char *url = opt(&a, "url") ? opt(&a, "url") : opt(&pre, "url");
	const char *config = opt(&a, "config") ? opt(&a, "config") : opt(&pre, "config");
	const char *cacert = opt(&a, "cacert") ? opt(&a, "cacert") : opt(&pre, "cacert");
	if (cmd->run != cmd_help && (rc = clihttp_configure(&c, url, config, cacert)) != CLI_OK)
		goto out;
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		fprintf(stderr, "bertctl: libcurl could not start\n");
		rc = CLI_ERROR;
		goto out;
	}
	rc = cmd->run(&c, &a);
	curl_global_cleanup();
	if (fflush(stdout) != 0 && rc == CLI_OK) {
		fprintf(stderr, "bertctl: writing the output: %s\n", strerror(errno));
		rc = CLI_ERROR;
	}
out:
	args_free(&a);
	args_free(&pre);
	return rc;
}
