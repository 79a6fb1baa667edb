/* integration_cli — bertctl (client/) against a real daemon, every
 * subcommand, run as a user runs it (its own process, the URL and token
 * from the environment or its config file):
 *   - usage errors exit 2 (the token is refused as an argument), a refused
 *     request 3 with the problem's type and field on stderr, no daemon 4;
 *     the config file's url/token_file, and a token in a file others can
 *     read refused; an https server's certificate verified against
 *     --cacert (openssl s_server with a certificate made here);
 *   - datasets create --wait / list / show / delete, a bad source a 3
 *     naming the field, a preparation that fails a 5 with its error;
 *   - submit from a file, from stdin and from flags (the effective spec
 *     holds each flag); a recipe written as YAML here (a .yaml file and
 *     stdin) gives the effective spec its JSON gives, a YAML .inf and a
 *     repeated key refused naming line and column; an Idempotency-Key replayed, list with its filters
 *     and across API pages, show, patch, cancel, delete on a held queue;
 *     bash completion of commands, options and job ids;
 *   - follow of a job to its end: the events printed are the job's event
 *     list, each once, and the log lines are the worker's log, byte for
 *     byte (each line's offset the end of the one before); exit 0 for
 *     completed, 6 for a job canceled with bertctl cancel mid-follow, 5 for
 *     one that fails (its worker killed, no restarts left); download of
 *     the export, a checkpoint and a checkpoint's HF export, read by tar;
 *   - follow across a daemon restart: bertd stopped with SIGTERM mid-job,
 *     started again on the same state dir and port: the follow reconnects
 *     with Last-Event-ID (it says so on stderr) and ends with the job's
 *     events and log lines each exactly once. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

/* ------------------------------------------------------------ running bertctl */

typedef struct ctl_env {
	bool no_env;         /* neither BERTD_URL nor BERTD_TOKEN_FILE: the config file decides */
	const char *token;   /* BERTD_TOKEN, when not NULL */
	const char *url;     /* BERTD_URL instead of the daemon's */
	const char *in;      /* stdin text; NULL: /dev/null */
} ctl_env;

typedef struct ctl {
	int status;          /* exit code, -1 killed */
	char *out, *err;
} ctl;

static void ctl_free(ctl *r)
{
	free(r->out);
	free(r->err);
}

/* Starts bertctl with argv (NULL-ended, after the program name), stdout
 * and stderr to out_path and err_path; returns its pid. */
static pid_t ctl_spawn(const bertd *d, const ctl_env *e, const char *out_path, const char *err_path,
		       const char *const *argv)
{
	const char *bin = getenv("BERTCTL_BIN");
	assert_non_null(bin);
	char in_path[200];
	snprintf(in_path, sizeof in_path, "%s/ctl.in", d->root);
	it_write_file(in_path, e && e->in ? e->in : "");
	const char *a[40] = {bin};
	size_t n = 1;
	while (argv[n - 1] && n < 39) {
		a[n] = argv[n - 1];
		n++;
	}
	a[n] = NULL;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char tok[200];
		snprintf(tok, sizeof tok, "%s/token", d->state_dir);
		unsetenv("BERTD_TOKEN");
		unsetenv("XDG_CONFIG_HOME");
		unsetenv("BERTCTL_CONFIG");
		setenv("HOME", d->root, 1); /* no config file of the machine's user */
		if (e && e->no_env) {
			unsetenv("BERTD_URL");
			unsetenv("BERTD_TOKEN_FILE");
		} else {
			setenv("BERTD_URL", e && e->url ? e->url : d->base_url, 1);
			setenv("BERTD_TOKEN_FILE", tok, 1);
		}
		if (e && e->token)
			setenv("BERTD_TOKEN", e->token, 1);
		int in = open(in_path, O_RDONLY);
		int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (in < 0 || out < 0 || err < 0)
			_exit(127);
		dup2(in, 0);
		dup2(out, 1);
		dup2(err, 2);
		execv(bin, (char *const *)a);
		_exit(127);
	}
	return pid;
}

/* Waits (bounded) for bertctl pid: its exit code; killed and failing the
 * test past deadline_s. */
static int ctl_wait(pid_t pid, int deadline_s)
{
	int st = 0;
	for (int i = 0; i < deadline_s * 10; i++) {
		pid_t w = waitpid(pid, &st, WNOHANG);
		if (w == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		it_pause_ms(100);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	fail_msg("bertctl still running after %d s", deadline_s);
	return -1;
}

/* Runs bertctl to its end; r holds its exit code, stdout and stderr. */
static void ctl_run_argv(const bertd *d, const ctl_env *e, ctl *r, const char *const *argv)
{
	char out[200], err[200];
	snprintf(out, sizeof out, "%s/ctl.out", d->root);
	snprintf(err, sizeof err, "%s/ctl.err", d->root);
	r->status = ctl_wait(ctl_spawn(d, e, out, err, argv), DEADLINE_S);
	r->out = it_slurp(out, NULL);
	r->err = it_slurp(err, NULL);
	assert_non_null(r->out);
	assert_non_null(r->err);
	fprintf(stderr, "bertctl");
	for (size_t i = 0; argv[i]; i++)
		fprintf(stderr, " %s", argv[i]);
	fprintf(stderr, " -> %d\n%s%s", r->status, r->err, r->err[0] && r->err[strlen(r->err) - 1] != '\n' ? "\n" : "");
}

#define CTL(d, e, r, ...) ctl_run_argv((d), (e), (r), (const char *const[]){__VA_ARGS__, NULL})

/* Runs bertctl, asserts exit code want, returns its stdout parsed as JSON
 * (caller decrefs) when json, else NULL. */
static json_t *ctl_json_argv(const bertd *d, const ctl_env *e, int want, const char *const *argv)
{
	ctl r;
	ctl_run_argv(d, e, &r, argv);
	assert_int_equal(r.status, want);
	json_error_t je;
	json_t *j = json_loads(r.out, 0, &je);
	if (!j)
		fprintf(stderr, "not JSON: %s\n%s\n", je.text, r.out);
	assert_non_null(j);
	ctl_free(&r);
	return j;
}
#define CTL_JSON(d, e, want, ...) ctl_json_argv((d), (e), (want), (const char *const[]){__VA_ARGS__, NULL})

/* ------------------------------------------------------------ fixtures */

static int setup_hold(void **state)
{
	it_daemon_opts o = {.cpu_slots = "2", .schedule = "false", .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 2000, .vocab_size = 400, .wait_ready = true};
	return it_setup(state, &o, DEADLINE_S);
}

static int setup_run(void **state)
{
	it_daemon_opts o = {.cpu_slots = "2", .dataset = "shakes", .corpus = "shakes.txt", .corpus_lines = 2000,
			    .vocab_size = 400, .wait_ready = true};
	return it_setup(state, &o, DEADLINE_S);
}

/* A loopback port free now: the restart test needs the daemon back on the
 * same URL the follow uses. */
static int free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &len)) {
		if (s >= 0)
			close(s);
		return -1;
	}
	close(s);
	return ntohs(a.sin_port);
}

static char port_arg[16];

static int setup_fixed_port(void **state)
{
	/* another process may take the port between here and bertd's bind:
	 * then try another one */
	for (int attempt = 0; attempt < 3; attempt++) {
		int p = free_port();
		if (p <= 0)
			continue;
		snprintf(port_arg, sizeof port_arg, "%d", p);
		const char *extra[] = {"--port", port_arg, NULL};
		it_daemon_opts o = {.cpu_slots = "2", .extra = extra, .dataset = "shakes", .corpus = "shakes.txt",
				    .corpus_lines = 2000, .vocab_size = 400, .wait_ready = true};
		if (it_setup(state, &o, DEADLINE_S) == 0)
			return 0;
	}
	return -1;
}

/* The tiny job as a spec file in the fixture's root; returns its path. */
static const char *spec_file(it_fx *f, const char *name, const char *spec)
{
	static char path[200];
	snprintf(path, sizeof path, "%s/%s.json", f->d.root, name);
	it_write_file(path, spec);
	return path;
}

/* ------------------------------------------------------------ errors, config */

/* An https server for the CA check: openssl s_server -WWW serving
 * root/www/v1/version with a self-signed certificate for 127.0.0.1 (made
 * here); its URL into url. Returns its pid, or 0 without openssl. */
static pid_t tls_server(const bertd *d, char *url, size_t n, char *cert, size_t cn)
{
	if (it_system("command -v openssl >/dev/null") != 0)
		return 0;
	snprintf(cert, cn, "%s/cert.pem", d->root);
	assert_int_equal(it_system("cd %s && mkdir -p www/v1 && printf '{\"version\":\"tls\",\"api\":\"v1\"}' "
				   "> www/v1/version && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "
				   "/CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout key.pem -out cert.pem "
				   "2>/dev/null",
				   d->root),
			 0);
	int port = free_port();
	assert_true(port > 0);
	char p[16], www[200];
	snprintf(p, sizeof p, "%d", port);
	snprintf(www, sizeof www, "%s/www", d->root);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (chdir(www) != 0)
			_exit(127);
		int null = open("/dev/null", O_RDWR);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		execlp("openssl", "openssl", "s_server", "-accept", p, "-4", "-cert", "../cert.pem", "-key", "../key.pem",
		       "-WWW", "-quiet", (char *)NULL);
		_exit(127);
	}
	/* bounded wait until it listens */
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	bool up = false;
	for (int i = 0; i < 100 && !up; i++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		up = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
		close(s);
		if (!up)
			it_pause_ms(100);
	}
	assert_true(up);
	snprintf(url, n, "https://127.0.0.1:%d", port);
	return pid;
}

static void test_errors_and_config(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	ctl r;

	CTL(d, NULL, &r, "show");
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "usage: bertctl show ID"));
	ctl_free(&r);
	CTL(d, NULL, &r, "list", "--token", "abc");
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "never taken on the command line"));
	ctl_free(&r);
	CTL(d, NULL, &r, "frobnicate");
	assert_int_equal(r.status, 2);
	ctl_free(&r);
	CTL(d, NULL, &r, "list", "--limit", "0");
	assert_int_equal(r.status, 2);
	ctl_free(&r);

	ctl_env bad = {.token = "not-the-token"};
	CTL(d, &bad, &r, "list");
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "401 unauthorized"));
	assert_null(strstr(r.err, "not-the-token")); /* never printed */
	ctl_free(&r);
	CTL(d, NULL, &r, "show", "job-0000000000000000");
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "404 job-not-found"));
	ctl_free(&r);

	/* nothing listens: bound our own socket without listen() on it */
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *)&a, &len), 0);
	char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(a.sin_port));
	ctl_env down = {.url = url};
	CTL(d, &down, &r, "list");
	assert_int_equal(r.status, 4);
	assert_non_null(strstr(r.err, "no answer"));
	ctl_free(&r);
	/* a follow that never reached a daemon does not wait for one */
	CTL(d, &down, &r, "follow", "job-0000000000000000");
	close(s);
	assert_int_equal(r.status, 4);
	assert_non_null(strstr(r.err, "no answer"));
	ctl_free(&r);

	/* https: the daemon's certificate is verified, against --cacert's CAs */
	char tls_url[64], cert[200];
	pid_t tls = tls_server(d, tls_url, sizeof tls_url, cert, sizeof cert);
	if (tls) {
		ctl_env https = {.url = tls_url};
		CTL(d, &https, &r, "version");
		assert_int_equal(r.status, 4);
		assert_non_null(strstr(r.err, "certificate"));
		ctl_free(&r);
		CTL(d, &https, &r, "version", "--cacert", cert);
		assert_int_equal(r.status, 0);
		assert_non_null(strstr(r.out, "bertd tls (api v1)"));
		ctl_free(&r);
		kill(tls, SIGTERM);
		waitpid(tls, NULL, 0);
	} else {
		fprintf(stderr, "skipped: the https check (no openssl)\n");
	}

	/* the config file: url and token_file, no environment */
	char dir[200], cfg[260], text[600];
	snprintf(dir, sizeof dir, "%s/.config", d->root);
	mkdir(dir, 0700);
	snprintf(dir, sizeof dir, "%s/.config/bertctl", d->root);
	mkdir(dir, 0700);
	snprintf(cfg, sizeof cfg, "%s/config", dir);
	ctl_env none = {.no_env = true};
	snprintf(text, sizeof text, "# bertctl\nurl = %s\ntoken_file = %s/token\n", d->base_url, d->state_dir);
	it_write_file(cfg, text);
	json_t *l = CTL_JSON(d, &none, 0, "list", "--json");
	assert_true(json_is_array(json_object_get(l, "jobs")));
	json_decref(l);
	/* a token in the file itself: refused while others may read it */
	snprintf(text, sizeof text, "url = %s\ntoken = %s\n", d->base_url, d->token);
	it_write_file(cfg, text);
	assert_int_equal(chmod(cfg, 0644), 0);
	CTL(d, &none, &r, "list");
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "chmod 600"));
	ctl_free(&r);
	assert_int_equal(chmod(cfg, 0600), 0);
	CTL(d, &none, &r, "list");
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "ID"));
	ctl_free(&r);
	it_write_file(cfg, "colour = blue\n");
	CTL(d, &none, &r, "list");
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "unknown key \"colour\""));
	ctl_free(&r);
	unlink(cfg);
}

/* ------------------------------------------------------------ datasets */

static void test_datasets(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	ctl r;
	it_make_corpus(f->data, "more.txt", 300);
	json_t *ds = CTL_JSON(d, NULL, 0, "datasets", "create", "--name", "more", "--source", "more.txt",
			      "--vocab-size", "200", "--threads", "1", "--wait", "--json");
	assert_string_equal(it_jstr(ds, "state"), "ready");
	assert_string_equal(it_jstr(ds, "name"), "more");
	json_decref(ds);

	CTL(d, NULL, &r, "datasets", "list");
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "NAME"));
	assert_non_null(strstr(r.out, "shakes"));
	assert_non_null(strstr(r.out, "more "));
	ctl_free(&r);
	json_t *l = CTL_JSON(d, NULL, 0, "datasets", "--json");
	assert_int_equal(json_array_size(json_object_get(l, "datasets")), 2);
	json_decref(l);
	ds = CTL_JSON(d, NULL, 0, "datasets", "show", "more", "--json");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(ds, "stats"), "vocab_size_requested")), 200);
	json_decref(ds);

	/* from a file, the flags on top; a source that does not exist */
	const char *file = spec_file(f, "ds", "{\"name\": \"nope\", \"vocab\": {\"train\": {\"vocab_size\": 200}}}");
	CTL(d, NULL, &r, "datasets", "create", file, "--source", "missing.txt");
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "422 invalid-request"));
	assert_non_null(strstr(r.err, "(field source)"));
	ctl_free(&r);

	/* a preparation that fails: --wait exits 5 and shows why */
	char bad[200];
	snprintf(bad, sizeof bad, "%s/latin1.txt", f->data);
	it_write_file(bad, "caf\xe9 au lait\n");
	CTL(d, NULL, &r, "datasets", "create", "--name", "latin", "--source", "latin1.txt", "--vocab-size", "200",
	    "--wait");
	assert_int_equal(r.status, 5);
	assert_non_null(strstr(r.out, "failed"));
	assert_non_null(strstr(r.out, "not UTF-8"));
	ctl_free(&r);

	CTL(d, NULL, &r, "datasets", "delete", "more");
	assert_int_equal(r.status, 0);
	ctl_free(&r);
	CTL(d, NULL, &r, "datasets", "show", "more");
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "404 dataset-not-found"));
	ctl_free(&r);
}

/* ------------------------------------------------------------ jobs on a held queue */

/* j written as block-style YAML at depth (two spaces a level): keys and
 * simple words plain, other strings double-quoted (JSON's escapes are
 * YAML's), numbers as jansson prints them (1e-06: a float in YAML 1.2). */
static void yaml_emit(FILE *f, const json_t *j, int depth)
{
	const char *k;
	json_t *v;
	size_t i;
	if (json_is_object(j))
		json_object_foreach((json_t *)j, k, v) {
			fprintf(f, "\n%*s%s:", 2 * depth, "", k);
			yaml_emit(f, v, depth + 1);
		}
	else if (json_is_array(j))
		json_array_foreach(j, i, v) {
			fprintf(f, "\n%*s-", 2 * depth, "");
			yaml_emit(f, v, depth + 1);
		}
	else {
		const char *s = json_string_value(j);
		char *text = json_dumps(j, JSON_ENCODE_ANY);
		int plain = s && s[0] >= 'a' && s[0] <= 'z' && strspn(s, "abcdefghijklmnopqrstuvwxyz-_") == strlen(s) &&
			    strcmp(s, "true") && strcmp(s, "false") && strcmp(s, "null");
		fprintf(f, " %s  # %s", plain ? s : text, json_is_string(j) ? "a string" : "typed");
		free(text);
	}
}

/* The recipe docs/recipes/NAME.json submitted as JSON, as YAML written
 * from it here (a file and stdin), onto the held queue with the same
 * flags: the three effective specs are equal. */
static void check_yaml_submit(it_fx *f, const char *name)
{
	bertd *d = &f->d;
	char src[600], ypath[300];
	snprintf(src, sizeof src, "%s", getenv("BERTCTL_COMPLETION"));
	*strstr(src, "/client/bertctl.bash") = 0;
	snprintf(src + strlen(src), sizeof src - strlen(src), "/docs/recipes/%s.json", name);
	json_t *recipe = json_load_file(src, 0, NULL);
	assert_non_null(recipe);
	snprintf(ypath, sizeof ypath, "%s/%s.yaml", d->root, name);
	FILE *y = fopen(ypath, "w");
	assert_non_null(y);
	fprintf(y, "# %s, as YAML", name);
	yaml_emit(y, recipe, 0);
	fputc('\n', y);
	fclose(y);
	json_decref(recipe);
	/* the recipe's dataset and GPUs are not this daemon's: the same flags on all */
	json_t *js = CTL_JSON(d, NULL, 0, "submit", src, "--dataset", "shakes", "--set", "resources.gpus=1", "--json");
	json_t *ys = CTL_JSON(d, NULL, 0, "submit", ypath, "--dataset", "shakes", "--set", "resources.gpus=1", "--json");
	char *ytext = it_slurp(ypath, NULL);
	ctl_env in = {.in = ytext};
	json_t *ss = CTL_JSON(d, &in, 0, "submit", "-", "--dataset", "shakes", "--set", "resources.gpus=1", "--json");
	assert_string_equal(it_jstr(ys, "state"), "queued");
	if (!json_equal(json_object_get(js, "spec"), json_object_get(ys, "spec")) ||
	    !json_equal(json_object_get(js, "spec"), json_object_get(ss, "spec")))
		fail_msg("%s: the YAML's effective spec differs from the JSON's:\n%s\n%s\n%s", name,
			 json_dumps(json_object_get(js, "spec"), JSON_COMPACT),
			 json_dumps(json_object_get(ys, "spec"), JSON_COMPACT),
			 json_dumps(json_object_get(ss, "spec"), JSON_COMPACT));
	free(ytext);
	json_decref(js);
	json_decref(ys);
	json_decref(ss);
}

static void test_jobs_queue(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	ctl r;
	char *spec = it_job_spec("from-file", "shakes", NULL);
	const char *file = spec_file(f, "job", spec);

	/* a file, with a flag on top */
	json_t *a = CTL_JSON(d, NULL, 0, "submit", file, "--tag", "cli", "--json");
	assert_string_equal(it_jstr(a, "state"), "queued");
	assert_string_equal(it_jstr(a, "name"), "from-file");
	assert_string_equal(json_string_value(json_array_get(json_object_get(a, "tags"), 0)), "cli");
	/* stdin */
	ctl_env in = {.in = spec};
	json_t *b = CTL_JSON(d, &in, 0, "submit", "-", "--name", "from-stdin", "--priority", "4", "--json");
	assert_string_equal(it_jstr(b, "name"), "from-stdin");
	assert_int_equal(json_integer_value(json_object_get(b, "priority")), 4);
	/* flags only: each lands in the effective spec */
	const char *const flags[] = {"submit", "--dataset", "shakes", "--preset", "bert-tiny", "--max-steps", "30",
				     "--name", "from-flags", "--tag", "cli", "--tag", "x", "--notes", "n1",
				     "--learning-rate", "0.002", "--batch-size", "4", "--max-seq-length", "32",
				     "--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
				     "model.num_attention_heads=2", "--set", "model.intermediate_size=64", "--set",
				     "model.max_position_embeddings=64", "--idempotency-key", "cli-test-1", "--json",
				     NULL};
	json_t *c = ctl_json_argv(d, NULL, 0, flags);
	json_t *cs = json_object_get(c, "spec");
	json_t *ta = json_object_get(cs, "training_args");
	assert_int_equal(json_integer_value(json_object_get(ta, "max_steps")), 30);
	assert_int_equal(json_integer_value(json_object_get(ta, "per_device_train_batch_size")), 4);
	assert_int_equal(json_integer_value(json_object_get(ta, "max_seq_length")), 32);
	assert_true(json_real_value(json_object_get(ta, "learning_rate")) == 0.002);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(cs, "model"), "hidden_size")), 32);
	assert_string_equal(it_jstr(json_object_get(cs, "model"), "preset"), "bert-tiny");
	assert_string_equal(it_jstr(c, "notes"), "n1");
	/* the same key and body again: the same job */
	json_t *c2 = ctl_json_argv(d, NULL, 0, flags);
	assert_string_equal(it_jstr(c2, "id"), it_jstr(c, "id"));
	json_decref(c2);
	/* refused specs name the field; no dataset at all is a usage error */
	CTL(d, NULL, &r, "submit", "--dataset", "shakes", "--max-steps", "-5");
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "(field training_args.max_steps)"));
	ctl_free(&r);
	CTL(d, NULL, &r, "submit", "--max-steps", "5");
	assert_int_equal(r.status, 2);
	ctl_free(&r);
	it_write_file(file, "{\"dataset\": ");
	CTL(d, NULL, &r, "submit", file);
	assert_int_equal(r.status, 1);
	ctl_free(&r);

	/* list: filters, limit and paging */
	json_t *l = CTL_JSON(d, NULL, 0, "list", "--tag", "cli", "--state", "queued", "--owner", "default", "--json");
	assert_int_equal(json_array_size(json_object_get(l, "jobs")), 2);
	json_decref(l);
	l = CTL_JSON(d, NULL, 0, "list", "--limit", "2", "--order", "desc", "--json");
	assert_int_equal(json_array_size(json_object_get(l, "jobs")), 2);
	assert_string_equal(it_jstr(json_array_get(json_object_get(l, "jobs"), 0), "id"), it_jstr(c, "id"));
	assert_true(json_is_string(json_object_get(l, "next_cursor")));
	json_decref(l);
	l = CTL_JSON(d, NULL, 0, "list", "--all", "--json");
	assert_int_equal(json_array_size(json_object_get(l, "jobs")), 3);
	assert_true(json_is_null(json_object_get(l, "next_cursor")));
	json_decref(l);
	CTL(d, NULL, &r, "list", "--tag", "x");
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, it_jstr(c, "id")));
	assert_null(strstr(r.out, it_jstr(a, "id")));
	ctl_free(&r);

	/* show */
	CTL(d, NULL, &r, "show", it_jstr(b, "id"));
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "from-stdin"));
	assert_non_null(strstr(r.out, "queued"));
	ctl_free(&r);
	json_t *s = CTL_JSON(d, NULL, 0, "show", it_jstr(b, "id"), "--json");
	assert_string_equal(it_jstr(s, "id"), it_jstr(b, "id"));
	json_decref(s);

	/* patch */
	json_t *p = CTL_JSON(d, NULL, 0, "patch", it_jstr(a, "id"), "--priority", "9", "--name", "renamed", "--tag",
			     "t1", "--tag", "t2", "--json");
	assert_int_equal(json_integer_value(json_object_get(p, "priority")), 9);
	assert_string_equal(it_jstr(p, "name"), "renamed");
	assert_int_equal(json_array_size(json_object_get(p, "tags")), 2);
	json_decref(p);
	p = CTL_JSON(d, NULL, 0, "patch", it_jstr(a, "id"), "--no-tags", "--json");
	assert_int_equal(json_array_size(json_object_get(p, "tags")), 0);
	json_decref(p);
	CTL(d, NULL, &r, "patch", it_jstr(a, "id"), "--priority", "1000");
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "(field priority)"));
	ctl_free(&r);
	/* bash completion: the job ids come from the daemon, through bertctl */
	const char *completion = getenv("BERTCTL_COMPLETION");
	assert_non_null(completion);
	char cmd[2048], bin_dir[600];
	snprintf(bin_dir, sizeof bin_dir, "%s", getenv("BERTCTL_BIN"));
	*strrchr(bin_dir, '/') = 0;
	snprintf(cmd, sizeof cmd,
		 "PATH='%s':\"$PATH\" BERTD_URL='%s' BERTD_TOKEN_FILE='%s/token' HOME='%s' bash -c '"
		 ". \"$1\"; complete -p bertctl >/dev/null || exit 9; "
		 "COMP_WORDS=(bertctl sh); COMP_CWORD=1; _bertctl; [ \"${COMPREPLY[*]}\" = show ] || exit 2; "
		 "COMP_WORDS=(bertctl list --st); COMP_CWORD=2; _bertctl; [ \"${COMPREPLY[*]}\" = --state ] || exit 3; "
		 "COMP_WORDS=(bertctl list --state ru); COMP_CWORD=3; _bertctl; [ \"${COMPREPLY[*]}\" = running ] || exit 4; "
		 "COMP_WORDS=(bertctl patch job-); COMP_CWORD=2; _bertctl; printf \"%%s\\n\" \"${COMPREPLY[@]}\"' "
		 "_ '%s' > '%s/completion.out'",
		 bin_dir, d->base_url, d->state_dir, d->root, completion, d->root);
	assert_int_equal(it_system("%s", cmd), 0);
	char cpath[200];
	snprintf(cpath, sizeof cpath, "%s/completion.out", d->root);
	char *done = it_slurp(cpath, NULL);
	assert_non_null(done);
	assert_non_null(strstr(done, it_jstr(a, "id")));
	assert_non_null(strstr(done, it_jstr(b, "id")));
	free(done);

	json_t *ev = it_events_of(d, it_jstr(a, "id"));
	assert_non_null(it_event_with(ev, "priority 0 -> 9"));
	json_decref(ev);

	/* delete a live job: 409; cancel, then delete */
	CTL(d, NULL, &r, "delete", it_jstr(a, "id"));
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "409 job-state-conflict"));
	ctl_free(&r);
	CTL(d, NULL, &r, "cancel", it_jstr(a, "id"));
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "canceled"));
	ctl_free(&r);
	CTL(d, NULL, &r, "cancel", it_jstr(a, "id"));
	assert_int_equal(r.status, 3);
	ctl_free(&r);
	CTL(d, NULL, &r, "delete", it_jstr(a, "id"));
	assert_int_equal(r.status, 0);
	ctl_free(&r);
	CTL(d, NULL, &r, "show", it_jstr(a, "id"));
	assert_int_equal(r.status, 3);
	ctl_free(&r);

	/* more than one API page (100): list follows next_cursor */
	for (int i = 0; i < 100; i++)
		free(it_submit(d, spec));
	l = CTL_JSON(d, NULL, 0, "list", "--all", "--json");
	assert_int_equal(json_array_size(json_object_get(l, "jobs")), 102);
	assert_true(json_is_null(json_object_get(l, "next_cursor")));
	json_decref(l);
	l = CTL_JSON(d, NULL, 0, "list", "--limit", "101", "--state", "queued", "--json");
	assert_int_equal(json_array_size(json_object_get(l, "jobs")), 101);
	assert_string_equal(it_jstr(json_array_get(json_object_get(l, "jobs"), 0), "id"), it_jstr(b, "id"));
	assert_true(json_is_string(json_object_get(l, "next_cursor"))); /* one more is left */
	json_decref(l);

	/* YAML specs: the same effective spec as the JSON they were written
	 * from; what JSON cannot hold refused with its line and column */
	check_yaml_submit(f, "roberta-style");
	char badyaml[300];
	snprintf(badyaml, sizeof badyaml, "%s/bad.yml", d->root);
	it_write_file(badyaml, "dataset: shakes\ntraining_args:\n  learning_rate: .inf\n");
	CTL(d, NULL, &r, "submit", badyaml);
	assert_int_equal(r.status, 1);
	assert_non_null(strstr(r.err, "line 3, column 18: .inf: JSON has no infinity"));
	ctl_free(&r);
	ctl_env dup = {.in = "dataset: shakes\ndataset: more\n"};
	CTL(d, &dup, &r, "submit", "-");
	assert_int_equal(r.status, 1);
	assert_non_null(strstr(r.err, "line 2, column 1: the key \"dataset\" appears twice"));
	ctl_free(&r);

	json_decref(a);
	json_decref(b);
	json_decref(c);
	free(spec);
}

/* ------------------------------------------------------------ follow */

/* Checks a follow --json output against the job: its events, in order,
 * each once and equal to GET /events; its log lines, offsets contiguous,
 * joined equal to the worker's log; the last line the end with state. */
static void check_follow_output(const bertd *d, const char *id, const char *out, const char *state)
{
	json_t *events = it_events_of(d, id);
	size_t nev = 0;
	int64_t off = 0;
	char *logtext = calloc(1, strlen(out) + 1);
	assert_non_null(logtext);
	bool ended = false;
	const char *line = out;
	while (*line) {
		const char *nl = strchr(line, '\n');
		assert_non_null(nl);
		char *one = strndup(line, (size_t)(nl - line));
		json_t *o = json_loads(one, 0, NULL);
		if (!o)
			fail_msg("not JSON: %s", one);
		assert_false(ended); /* nothing after the end */
		json_t *lg = json_object_get(o, "log");
		json_t *end = json_object_get(o, "end");
		if (lg) {
			const char *text = it_jstr(lg, "line");
			int64_t at = json_integer_value(json_object_get(lg, "offset"));
			off += (int64_t)strlen(text) + 1;
			if (at != off)
				fail_msg("log line at offset %lld, want %lld (skipped or repeated): %s", (long long)at,
					 (long long)off, text);
			strcat(logtext, text);
			strcat(logtext, "\n");
		} else if (end) {
			assert_string_equal(it_jstr(end, "state"), state);
			ended = true;
		} else {
			json_t *want = json_array_get(events, nev);
			if (!want || !json_equal(o, want))
				fail_msg("event %zu printed %s, the job's is %s", nev + 1, one,
					 want ? json_dumps(want, JSON_COMPACT) : "(none)");
			nev++;
		}
		json_decref(o);
		free(one);
		line = nl + 1;
	}
	assert_true(ended);
	assert_int_equal(nev, json_array_size(events));
	char path[200];
	snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=0&tail=10000", id);
	http_resp r;
	assert_int_equal(http_get(d, path, &r), 0);
	assert_int_equal(r.status, 200);
	assert_true(strlen(logtext) > 0);
	assert_string_equal(logtext, r.body);
	http_resp_free(&r);
	free(logtext);
	json_decref(events);
}

static void test_follow_download(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	ctl r;
	char *spec = it_job_spec("dl", "shakes", NULL); /* 20 steps, checkpoints at 10 and 20 */
	json_t *job = CTL_JSON(d, &(ctl_env){.in = spec}, 0, "submit", "-", "--json");
	free(spec);
	const char *id = it_jstr(job, "id");
	CTL(d, NULL, &r, "follow", id, "--json");
	assert_int_equal(r.status, 0);
	check_follow_output(d, id, r.out, "completed");
	ctl_free(&r);
	/* a rank the job does not have: refused, named */
	CTL(d, NULL, &r, "follow", id, "--rank", "3");
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "(field rank)"));
	ctl_free(&r);
	/* the human form of a finished job: its events and lines, the end on stderr */
	CTL(d, NULL, &r, "follow", id);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "running -> completed: training finished"));
	assert_non_null(strstr(r.out, "step 20/20"));
	assert_non_null(strstr(r.err, "completed"));
	ctl_free(&r);

	/* downloads: into a directory under the server's name, to a file, to stdout */
	char dir[200], file[260];
	snprintf(dir, sizeof dir, "%s/dl", f->d.root);
	assert_int_equal(mkdir(dir, 0700), 0);
	CTL(d, NULL, &r, "download", id, "-o", dir);
	assert_int_equal(r.status, 0);
	snprintf(file, sizeof file, "%s/dl-export.tar", dir);
	assert_non_null(strstr(r.out, file));
	ctl_free(&r);
	assert_int_equal(it_system("tar -tf %s | grep -qx 'dl-export/config.json'", file), 0);
	assert_int_equal(it_system("tar -tf %s | grep -qx 'dl-export/model.safetensors'", file), 0);
	snprintf(file, sizeof file, "%s/ten.tar", dir);
	CTL(d, NULL, &r, "download", id, "--checkpoint", "10", "-o", file);
	assert_int_equal(r.status, 0);
	ctl_free(&r);
	assert_int_equal(it_system("tar -tf %s | grep -qx 'dl-ckpt-10/params.safetensors'", file), 0);
	CTL(d, NULL, &r, "download", id, "--checkpoint", "10", "--hf", "-o", dir);
	assert_int_equal(r.status, 0);
	ctl_free(&r);
	assert_int_equal(it_system("tar -tf %s/dl-ckpt-10-export.tar | grep -qx 'dl-ckpt-10-export/config.json'", dir), 0);
	CTL(d, NULL, &r, "download", id, "--checkpoint", "11", "-o", dir);
	assert_int_equal(r.status, 3);
	ctl_free(&r);
	/* nothing partial left behind by the refused one */
	assert_int_equal(it_system("ls -A %s | grep -q bertctl-download", dir), 1);
	json_decref(job);
}

/* A job slow enough to be caught mid-run: its worker builds every batch
 * itself, taking delay_ms longer each. */
static char *slow_job(const bertd *d, const char *name, const char *steps, const char *extra_key, const char *extra)
{
	char *spec = it_job_spec(name, "shakes", "training_args.max_steps", steps, "training_args.dataloader_num_workers",
				 "0", "profiler", "{\"simulate_data_delay_ms\":100}", extra_key, extra, NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static void test_follow_exit_codes(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	char out[200], err[200];
	snprintf(out, sizeof out, "%s/follow.out", d->root);
	snprintf(err, sizeof err, "%s/follow.err", d->root);

	/* canceled mid-follow by bertctl cancel: 6 */
	char *id = slow_job(d, "to-cancel", "400", NULL, NULL);
	pid_t pid = ctl_spawn(d, NULL, out, err, (const char *const[]){"follow", id, "--no-logs", NULL});
	it_wait_step(d, id, 5, DEADLINE_S);
	ctl r;
	CTL(d, NULL, &r, "cancel", id);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "stopping"));
	ctl_free(&r);
	assert_int_equal(ctl_wait(pid, DEADLINE_S), 6);
	char *text = it_slurp(out, NULL);
	assert_non_null(strstr(text, "stopping -> canceled"));
	free(text);
	free(id);

	/* failed (its worker killed, no restart allowed): 5 */
	id = slow_job(d, "to-fail", "400", "retry_policy", "{\"max_restarts\":0}");
	pid = ctl_spawn(d, NULL, out, err, (const char *const[]){"follow", id, "--json", NULL});
	it_wait_step(d, id, 5, DEADLINE_S);
	it_kill_rank(id, 0);
	assert_int_equal(ctl_wait(pid, DEADLINE_S), 5);
	text = it_slurp(out, NULL);
	check_follow_output(d, id, text, "failed");
	free(text);
	free(id);
}

static void test_follow_restart(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	char out[200], err[200];
	snprintf(out, sizeof out, "%s/follow.out", d->root);
	snprintf(err, sizeof err, "%s/follow.err", d->root);
	char *id = slow_job(d, "restarted", "60", NULL, NULL);
	pid_t pid = ctl_spawn(d, NULL, out, err, (const char *const[]){"follow", id, "--json", "--retry-s", "120", NULL});
	it_wait_step(d, id, 10, DEADLINE_S);
	char url[128];
	snprintf(url, sizeof url, "%s", d->base_url);
	assert_int_equal(bertd_stop(d), 0); /* SIGTERM: the streams close without their end */
	/* the follow is still waiting for the job's end, now on a dead URL */
	assert_int_equal(waitpid(pid, NULL, WNOHANG), 0);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	assert_string_equal(d->base_url, url);
	int rc = ctl_wait(pid, DEADLINE_S);
	char *text = it_slurp(out, NULL), *errs = it_slurp(err, NULL);
	fprintf(stderr, "follow's stderr:\n%s", errs);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(errs, "reconnecting"));
	check_follow_output(d, id, text, "completed");
	free(text);
	free(errs);
	free(id);
}

int main(void)
{
	if (!getenv("BERTCTL_BIN")) {
		fprintf(stderr, "no BERTCTL_BIN: skipped\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_errors_and_config),
		cmocka_unit_test(test_datasets),
		cmocka_unit_test(test_jobs_queue),
		cmocka_unit_test_setup_teardown(test_follow_download, setup_run, it_teardown),
		cmocka_unit_test_setup_teardown(test_follow_exit_codes, setup_run, it_teardown),
		cmocka_unit_test_setup_teardown(test_follow_restart, setup_fixed_port, it_teardown),
	};
	return IT_RUN(tests, setup_hold, it_teardown);
}
