/* it_util — see it_util.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>
#include <curl/curl.h>

#include "it_util.h"

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
	const char *shared = getenv("BERTD_SHARED_DATA");
	assert_non_null(shared);
	char src[512], dst[512], line[4096];
	snprintf(src, sizeof src, "%s/tinyshakespeare.txt", shared);
	snprintf(dst, sizeof dst, "%s/%s", dir, name);
	FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
	assert_non_null(in);
	assert_non_null(out);
	for (int i = 0; i < n && fgets(line, sizeof line, in); i++)
		fputs(line, out);
	fclose(in);
	fclose(out);
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
