/* it_util — see it_util.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <curl/curl.h>

#include "it_util.h"
#include "../testdata.h"

const char *it_jstr(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));
	if (!s)
		fail_msg("no string member '%s'", key);
	return s;
}

json_t *it_get_json(const bertd *d, const char *path)
{
	http_resp r;
	assert_int_equal(http_get(d, path, &r), 0);
	if (r.status != 200 || !r.json)
		fail_msg("GET %s: %ld %s", path, r.status, r.body);
	json_t *o = json_incref(r.json);
	http_resp_free(&r);
	return o;
}

void it_pause_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

json_t *it_wait_state(const bertd *d, const char *path, const char *states, int deadline_s)
{
	for (int i = 0; i < deadline_s * 10; i++) {
		json_t *o = it_get_json(d, path);
		char want[160], have[64];
		snprintf(want, sizeof want, "|%s|", states);
		snprintf(have, sizeof have, "|%s|", it_jstr(o, "state"));
		if (strstr(want, have))
			return o;
		json_decref(o);
		it_pause_ms(100);
	}
	bertd_print_log(d);
	fail_msg("%s not in %s after %d s", path, states, deadline_s);
	return NULL;
}

void it_make_corpus(const char *dir, const char *name, int n)
{
	char src[512], dst[512];
	size_t len = 0;
	char *txt = NULL;
	if (testdata_shared(src, sizeof src, "tinyshakespeare.txt",
			    "tinyshakespeare as the corpus (common-licenses instead)")) {
		FILE *in = fopen(src, "rb");
		assert_non_null(in);
		fseek(in, 0, SEEK_END);
		len = (size_t)ftell(in);
		fseek(in, 0, SEEK_SET);
		txt = malloc(len + 1);
		assert_int_equal(fread(txt, 1, len, in), len);
		fclose(in);
	} else {
		txt = testdata_licenses(&len);
		assert_non_null(txt);
	}
	size_t end = 0;
	int lines = 0;
	while (end < len && lines < n) {
		char *nl = memchr(txt + end, '\n', len - end);
		end = nl ? (size_t)(nl - txt) + 1 : len;
		lines++;
	}
	snprintf(dst, sizeof dst, "%s/%s", dir, name);
	FILE *out = fopen(dst, "w");
	assert_non_null(out);
	assert_int_equal(fwrite(txt, 1, end, out), end);
	fclose(out);
	free(txt);
}

char *it_submit(const bertd *d, const char *spec)
{
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
	if (r.status != 201)
		fail_msg("submit: status %ld: %s", r.status, r.body);
	char *id = strdup(it_jstr(r.json, "id"));
	http_resp_free(&r);
	return id;
}

int it_add_dataset(const bertd *d, const char *spec)
{
	http_resp r;
	if (http_post_json(d, "/v1/datasets", spec, &r) || r.status != 201) {
		fprintf(stderr, "dataset: %ld %s\n", r.status, r.body);
		http_resp_free(&r);
		return -1;
	}
	http_resp_free(&r);
	return 0;
}

void it_wait_dataset_ready(const bertd *d, const char *name, int deadline_s)
{
	char path[160];
	snprintf(path, sizeof path, "/v1/datasets/%s", name);
	json_t *ds = it_wait_state(d, path, "ready|failed", deadline_s);
	if (strcmp(it_jstr(ds, "state"), "ready") != 0) {
		char *txt = json_dumps(ds, JSON_COMPACT);
		bertd_print_log(d);
		fail_msg("dataset: %s", txt);
	}
	json_decref(ds);
}

json_t *it_poll_job(const bertd *d, const char *id, const char *states, long step, int deadline_s,
		    void (*watch)(void *arg, const char *id), void *arg)
{
	char path[128], want[160], have[64];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	snprintf(want, sizeof want, "|%s|", states ? states : "");
	for (int i = 0; i < deadline_s * 10; i++) {
		if (watch)
			watch(arg, id);
		json_t *j = it_get_json(d, path);
		const char *st = it_jstr(j, "state");
		json_int_t s = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
		snprintf(have, sizeof have, "|%s|", st);
		bool terminal = !strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "canceled");
		if (step > 0 ? s >= step : strstr(want, have) != NULL)
			return j;
		if (step > 0 && terminal)
			fail_msg("job %s ended (%s) before step %ld", id, st, step);
		json_decref(j);
		it_pause_ms(100);
	}
	bertd_print_log(d);
	fail_msg("job %s: not %s after %d s", id, step > 0 ? "at the step" : states, deadline_s);
	return NULL;
}

json_t *it_wait_job(const bertd *d, const char *id, const char *states, int deadline_s)
{
	return it_poll_job(d, id, states, 0, deadline_s, NULL, NULL);
}

void it_cancel_job(const bertd *d, const char *id, int deadline_s)
{
	char path[160];
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
	http_resp r;
	assert_int_equal(http_post_json(d, path, "{}", &r), 0);
	if (r.status < 200 || r.status >= 300)
		fail_msg("cancel %s: %ld %s", id, r.status, r.body);
	http_resp_free(&r);
	json_t *job = it_wait_job(d, id, "canceled|failed|completed", deadline_s);
	assert_string_equal(it_jstr(job, "state"), "canceled");
	json_decref(job);
}

void it_wait_step(const bertd *d, const char *id, long step, int deadline_s)
{
	json_decref(it_poll_job(d, id, NULL, step, deadline_s, NULL, NULL));
}

void it_assert_completed(const bertd *d, const json_t *job)
{
	if (strcmp(it_jstr((json_t *)job, "state"), "completed") != 0) {
		bertd_print_log(d);
		fail_msg("job ended %s: %s", it_jstr((json_t *)job, "state"),
			 json_string_value(json_object_get(job, "failure_reason")));
	}
}

json_t *it_wait_completed(const bertd *d, const char *id, int deadline_s)
{
	json_t *job = it_wait_job(d, id, "completed|failed|canceled", deadline_s);
	it_assert_completed(d, job);
	return job;
}

int it_connect(const bertd *d, int recv_timeout_s)
{
	const char *colon = strrchr(d->base_url, ':');
	assert_non_null(colon);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	struct timeval tv = {.tv_sec = recv_timeout_s};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
	return fd;
}

json_t *it_metrics_of(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/metrics", id);
	json_t *o = it_get_json(d, path);
	json_t *m = json_incref(json_object_get(o, "metrics"));
	json_decref(o);
	return m;
}

bool it_has_event(const bertd *d, const char *id, const char *text)
{
	json_t *ev = it_events_of(d, id);
	bool yes = it_event_with(ev, text) != NULL;
	json_decref(ev);
	return yes;
}

void it_assert_metrics_every(const bertd *d, const char *id, long steps, long every)
{
	json_t *m = it_metrics_of(d, id);
	assert_int_equal(json_array_size(m), (size_t)(steps / every));
	for (size_t i = 0; i < json_array_size(m); i++)
		assert_int_equal(json_integer_value(json_object_get(json_array_get(m, i), "step")), (long)(i + 1) * every);
	json_decref(m);
}

long it_newest_checkpoint(const char *state_dir, const char *id)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/jobs/%s/checkpoints", state_dir, id);
	DIR *d = opendir(dir);
	long best = -1;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long s;
		char done[1000];
		struct stat st;
		snprintf(done, sizeof done, "%s/%s/DONE", dir, e->d_name);
		if (sscanf(e->d_name, "ckpt-%ld", &s) == 1 && stat(done, &st) == 0 && s > best)
			best = s;
	}
	if (d)
		closedir(d);
	return best;
}

long it_store_user_version(const bertd *d)
{
	char cmd[400], out[64] = "";
	snprintf(cmd, sizeof cmd, "sqlite3 '%s/bertd.db' 'PRAGMA user_version'", d->state_dir);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	assert_non_null(fgets(out, sizeof out, p));
	assert_int_equal(pclose(p), 0);
	return strtol(out, NULL, 10);
}

void it_sha_of_export(const json_t *job, char hex[65])
{
	char cmd[1300];
	snprintf(cmd, sizeof cmd, "sha256sum '%s/model.safetensors'", it_jstr((json_t *)job, "model_dir"));
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	assert_non_null(fgets(hex, 65, p));
	pclose(p);
	hex[64] = 0;
}

void it_export_load(const json_t *job, it_export *e)
{
	char path[1200];
	snprintf(path, sizeof path, "%s/model.safetensors", it_jstr((json_t *)job, "model_dir"));
	FILE *fp = fopen(path, "rb");
	assert_non_null(fp);
	unsigned char len8[8];
	assert_int_equal(fread(len8, 1, 8, fp), 8);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | len8[i];
	assert_true(hl > 2 && hl < (1u << 20));
	char *h = calloc(1, hl + 1);
	assert_int_equal(fread(h, 1, hl, fp), hl);
	e->hdr = json_loads(h, 0, NULL);
	free(h);
	assert_non_null(e->hdr);
	long at = ftell(fp);
	fseek(fp, 0, SEEK_END);
	e->len = (size_t)(ftell(fp) - at);
	fseek(fp, at, SEEK_SET);
	e->data = malloc(e->len);
	assert_int_equal(fread(e->data, 1, e->len, fp), e->len);
	fclose(fp);
}

void it_export_free(it_export *e)
{
	json_decref(e->hdr);
	free(e->data);
	e->hdr = NULL;
	e->data = NULL;
}

int it_find_pids(const char *a, const char *b, pid_t *out, int cap)
{
	DIR *dir = opendir("/proc");
	struct dirent *e;
	int n = 0;
	while (dir && (e = readdir(dir)) && n < cap) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		char path[64], buf[4096];
		snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t len = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		for (size_t i = 0; i < len; i++)
			if (!buf[i])
				buf[i] = ' ';
		buf[len] = 0;
		/* a zombie keeps its command line until reaped: not live */
		snprintf(path, sizeof path, "/proc/%ld/stat", pid);
		f = fopen(path, "r");
		char st = 0;
		if (f) {
			char tmp[4096];
			if (fgets(tmp, sizeof tmp, f)) {
				char *rp = strrchr(tmp, ')');
				if (rp && rp[1] == ' ')
					st = rp[2];
			}
			fclose(f);
		}
		if (st != 'Z' && strstr(buf, a) && (!b || strstr(buf, b)))
			out[n++] = (pid_t)pid;
	}
	if (dir)
		closedir(dir);
	return n;
}

char it_proc_state(pid_t pid)
{
	char p[64], buf[512];
	snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
	FILE *fp = fopen(p, "r");
	if (!fp)
		return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, fp);
	fclose(fp);
	buf[n] = 0;
	char *rp = strrchr(buf, ')');
	return rp && rp[1] == ' ' ? rp[2] : 0;
}

void it_kill_rank(const char *id, int rank)
{
	char arg[32];
	pid_t pids[4];
	snprintf(arg, sizeof arg, "--rank %d", rank);
	assert_int_equal(it_find_pids(id, arg, pids, 4), 1);
	assert_int_equal(kill(pids[0], SIGKILL), 0);
}

int it_daemon_finish(bertd *d)
{
	int rc = d->pid ? bertd_stop(d) : 0;
	if (rc != 0) {
		fprintf(stderr, "bertd exited with %d after SIGTERM (want 0)\n", rc);
		bertd_print_log(d);
	}
	bertd_destroy(d);
	return rc == 0 ? 0 : -1;
}

int it_system(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void free_args(it_fx *f)
{
	for (size_t i = 0; i < IT_MAX_ARGS && f->args[i]; i++)
		free(f->args[i]);
	memset(f->args, 0, sizeof f->args);
}

/* f->args from o (owned copies: o's strings need not outlive the call). */
static int set_args(it_fx *f, const it_daemon_opts *o)
{
	const char *a[IT_MAX_ARGS];
	size_t n = 0;
	if (!o->plain) {
		a[n++] = "--data-roots";
		a[n++] = f->data;
		a[n++] = "--devices";
		a[n++] = o->devices ? o->devices : "cpu";
		if (o->cpu_slots) {
			a[n++] = "--cpu-slots";
			a[n++] = o->cpu_slots;
		}
		a[n++] = "--schedule";
		a[n++] = o->schedule ? o->schedule : "true";
	}
	for (size_t i = 0; o->extra && o->extra[i]; i++) {
		if (n + 1 >= IT_MAX_ARGS) {
			fprintf(stderr, "it_daemon_run: more than %d arguments\n", IT_MAX_ARGS - 1);
			return -1;
		}
		a[n++] = o->extra[i];
	}
	free_args(f);
	for (size_t i = 0; i < n; i++)
		if (!(f->args[i] = strdup(a[i])))
			return -1;
	return 0;
}

int it_daemon_run(it_fx *f, const it_daemon_opts *o)
{
	if (o && set_args(f, o))
		return -EINVAL;
	return bertd_start(&f->d, (const char *const *)f->args);
}

it_fx *it_daemon_start(const it_daemon_opts *o, int deadline_s)
{
	it_fx *f = calloc(1, sizeof *f);
	if (!f)
		return NULL;
	if (bertd_init(&f->d))
		goto fail;
	snprintf(f->data, sizeof f->data, "%s/data", f->d.root);
	if (mkdir(f->data, 0700) || set_args(f, o))
		goto fail;
	if (o->deferred)
		return f;
	if (it_daemon_run(f, NULL))
		goto fail;
	if (!o->dataset)
		return f;
	it_make_corpus(f->data, o->corpus, o->corpus_lines);
	char spec[512], path[160];
	snprintf(spec, sizeof spec,
		 "{\"name\":\"%s\",\"source\":\"%s\",\"vocab\":{\"train\":{\"vocab_size\":%d}}}",
		 o->dataset, o->corpus, o->vocab_size);
	if (it_add_dataset(&f->d, spec))
		goto fail;
	if (o->wait_ready) {
		snprintf(path, sizeof path, "/v1/datasets/%s", o->dataset);
		json_t *ds = it_wait_state(&f->d, path, "ready|failed", deadline_s);
		bool ok = strcmp(json_string_value(json_object_get(ds, "state")), "ready") == 0;
		if (!ok) {
			char *txt = json_dumps(ds, JSON_COMPACT);
			fprintf(stderr, "dataset: %s\n", txt);
			free(txt);
			bertd_print_log(&f->d);
		}
		json_decref(ds);
		if (!ok)
			goto fail;
	}
	return f;
fail:
	bertd_destroy(&f->d); /* kills a started daemon: no test runs on it */
	free_args(f);
	free(f);
	return NULL;
}

int it_daemon_stop(it_fx *f)
{
	if (!f)
		return 0;
	int rc = it_daemon_finish(&f->d);
	free_args(f);
	free(f);
	return rc;
}

int it_setup_end(void **state, it_fx *f, bool ok)
{
	if (f && ok) {
		*state = f;
		return 0;
	}
	if (f) {
		bertd_destroy(&f->d);
		free_args(f);
		free(f);
	}
	return -1;
}

int it_setup(void **state, const it_daemon_opts *o, int deadline_s)
{
	return it_setup_end(state, it_daemon_start(o, deadline_s), true);
}

int it_teardown(void **state)
{
	return it_daemon_stop(*state);
}

void it_write_file(const char *path, const char *text)
{
	FILE *fp = fopen(path, "w");
	if (!fp)
		fail_msg("cannot write %s", path);
	fputs(text, fp);
	assert_int_equal(fclose(fp), 0);
}

char *it_slurp(const char *path, size_t *n)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return NULL;
	size_t cap = 1 << 16, len = 0, got;
	char *buf = malloc(cap);
	while (buf && (got = fread(buf + len, 1, cap - len - 1, fp)) > 0) {
		len += got;
		if (len + 1 == cap) {
			char *more = realloc(buf, cap *= 2);
			if (!more)
				free(buf);
			buf = more;
		}
	}
	fclose(fp);
	if (!buf)
		return NULL;
	buf[len] = 0;
	if (n)
		*n = len;
	return buf;
}

int it_run_bertd_to_exit(const char *const *args, const char *log_path, int deadline_s)
{
	const char *bin = getenv("BERTD_BIN");
	assert_non_null(bin);
	const char *argv[40] = {bin};
	size_t a = 1;
	for (; args[a - 1] && a < 39; a++)
		argv[a] = args[a - 1];
	argv[a] = NULL;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int lfd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (lfd >= 0) {
			dup2(lfd, 1);
			dup2(lfd, 2);
		}
		unsetenv("NOTIFY_SOCKET");
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	assert_true(pidfd >= 0);
	struct pollfd p = {pidfd, POLLIN, 0};
	int ready = poll(&p, 1, deadline_s * 1000);
	close(pidfd);
	int st = 0;
	if (ready <= 0) {
		kill(pid, SIGTERM);
		waitpid(pid, &st, 0);
		char *log = it_slurp(log_path, NULL);
		fail_msg("bertd %s kept running after %d s:\n%s", args[0] ? args[0] : "", deadline_s,
			 log ? log : "(no log)");
	}
	waitpid(pid, &st, 0);
	return st;
}

/* Sets the member at the dotted path of o to v (stolen; NULL removes it),
 * making the objects on the way. */
static void spec_set(json_t *o, const char *path, json_t *v)
{
	char key[128];
	const char *dot = strchr(path, '.');
	if (!dot) {
		if (v)
			json_object_set_new(o, path, v);
		else
			json_object_del(o, path);
		return;
	}
	snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
	json_t *sub = json_object_get(o, key);
	if (!json_is_object(sub)) {
		sub = json_object();
		json_object_set_new(o, key, sub);
	}
	spec_set(sub, dot + 1, v);
}

char *it_job_spec(const char *name, const char *dataset, ...)
{
	json_error_t err;
	json_t *spec = json_loads("{\"name\":\"\",\"dataset\":\"\"," IT_TINY_MODEL("1") ",\"training_args\":{"
				  "\"per_device_train_batch_size\":8,\"max_seq_length\":32,\"max_steps\":20,"
				  "\"logging_steps\":5,\"save_steps\":10,\"dataloader_num_workers\":0,\"seed\":7" IT_LR_WARMUP
				  "},\"resources\":{\"gpus\":1}}",
				  0, &err);
	assert_non_null(spec);
	if (name)
		json_object_set_new(spec, "name", json_string(name));
	else
		json_object_del(spec, "name");
	json_object_set_new(spec, "dataset", json_string(dataset));
	va_list ap;
	va_start(ap, dataset);
	for (const char *path; (path = va_arg(ap, const char *));) {
		const char *text = va_arg(ap, const char *);
		json_t *v = text ? json_loads(text, JSON_DECODE_ANY, &err) : NULL;
		if (!v) {
			va_end(ap);
			fail_msg("it_job_spec: %s: not JSON: %s", path, text ? text : "(NULL)");
		}
		spec_set(spec, path, json_is_null(v) ? (json_decref(v), NULL) : v);
	}
	va_end(ap);
	char *txt = json_dumps(spec, JSON_COMPACT);
	json_decref(spec);
	assert_non_null(txt);
	return txt;
}

void it_assert_refused(http_resp *r, const char *field, const char *parts)
{
	if (r->status != 422)
		fail_msg("expected 422 on %s, got %ld: %s", field, r->status, r->body);
	assert_string_equal(it_jstr(r->json, "field"), field);
	const char *detail = it_jstr(r->json, "detail");
	fprintf(stderr, "422 %s: %s\n", field, detail);
	for (const char *p = parts; *p;) {
		size_t n = strcspn(p, "|");
		char part[600];
		snprintf(part, sizeof part, "%.*s", (int)n, p);
		if (!strstr(detail, part))
			fail_msg("the detail on %s lacks \"%s\": %s", field, part, detail);
		p += n + (p[n] == '|');
	}
	http_resp_free(r);
}

void it_submit_refused(const bertd *d, const char *spec, const char *field, const char *parts)
{
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
	it_assert_refused(&r, field, parts);
}

int it_run_group(const char *name, const struct CMUnitTest *tests, size_t n, int (*setup)(void **),
		 int (*teardown)(void **))
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	if (getenv("IT_ONLY"))
		cmocka_set_test_filter(getenv("IT_ONLY"));
	int rc = _cmocka_run_group_tests(name, tests, n, setup, teardown);
	curl_global_cleanup();
	return rc;
}

json_t *it_events_of(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
	json_t *r = it_get_json(d, path);
	json_t *ev = json_incref(json_object_get(r, "events"));
	json_decref(r);
	assert_true(json_is_array(ev));
	return ev;
}

const char *it_event_with(json_t *ev, const char *text)
{
	size_t i;
	json_t *e;
	json_array_foreach(ev, i, e) {
		const char *r = json_string_value(json_object_get(e, "reason"));
		if (r && strstr(r, text))
			return r;
	}
	return NULL;
}
