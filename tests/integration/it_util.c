/* it_util — see it_util.h. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

json_t *it_metrics_of(const bertd *d, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/metrics", id);
	json_t *o = it_get_json(d, path);
	json_t *m = json_incref(json_object_get(o, "metrics"));
	json_decref(o);
	return m;
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

int it_daemon_init(bertd *d, char *data, size_t cap)
{
	if (bertd_init(d))
		return -1;
	snprintf(data, cap, "%s/data", d->root);
	return mkdir(data, 0700) ? -1 : 0;
}

int it_daemon_run(bertd *d, const char *data, const it_daemon_opts *o)
{
	const char *args[32] = {"--data-roots", data, "--devices", "cpu", "--cpu-slots", o->cpu_slots,
				"--schedule", o->schedule ? o->schedule : "true"};
	size_t n = 8;
	for (size_t i = 0; o->extra && o->extra[i]; i++) {
		if (n + 1 >= sizeof args / sizeof args[0]) {
			fprintf(stderr, "it_daemon_run: too many arguments\n");
			return -1;
		}
		args[n++] = o->extra[i];
	}
	args[n] = NULL;
	return bertd_start(d, args);
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

it_fx *it_daemon_start(const it_daemon_opts *o, int deadline_s)
{
	it_fx *f = calloc(1, sizeof *f);
	if (!f)
		return NULL;
	if (it_daemon_init(&f->d, f->data, sizeof f->data))
		goto fail;
	if (it_daemon_run(&f->d, f->data, o))
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
	free(f);
	return NULL;
}

int it_daemon_stop(it_fx *f)
{
	int rc = it_daemon_finish(&f->d);
	free(f);
	return rc;
}

int it_bertd_setup(void **state, const char *const *extra)
{
	bertd *d = calloc(1, sizeof *d);
	if (!d)
		return -1;
	if (bertd_init(d) || bertd_start(d, extra)) {
		bertd_destroy(d);
		free(d);
		return -1;
	}
	*state = d;
	return 0;
}

int it_bertd_teardown(void **state)
{
	bertd *d = *state;
	int rc = it_daemon_finish(d);
	free(d);
	return rc;
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
