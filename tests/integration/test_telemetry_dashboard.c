/* The dashboard in headless Chromium against a real daemon with a real,
 * finished job: the page loads with the token from its #token= fragment,
 * draws its SVG charts (checked in the DOM Chromium dumps after running the
 * page's script), shows the diagnosis, and logs no console error. A
 * screenshot is left in the test's build directory (dashboard.png) as an
 * artifact. Exits 77 (skipped) when no Chromium is installed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 120

static char chromium[256];

static bool find_chromium(void)
{
	static const char *const names[] = {"chromium", "chromium-browser", "google-chrome", NULL};
	const char *env = getenv("BERTD_CHROMIUM");
	if (env && access(env, X_OK) == 0) {
		snprintf(chromium, sizeof chromium, "%s", env);
		return true;
	}
	const char *path = getenv("PATH");
	if (!path)
		return false;
	for (int i = 0; names[i]; i++) {
		char buf[1024];
		snprintf(buf, sizeof buf, "%s", path);
		for (char *save, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
			snprintf(chromium, sizeof chromium, "%s/%s", dir, names[i]);
			if (access(chromium, X_OK) == 0)
				return true;
		}
	}
	return false;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	if (b)
		b[n] = 0;
	fclose(f);
	return b;
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

static void test_dashboard_renders(void **state)
{
	(void)state;
	bertd d;
	assert_int_equal(bertd_init(&d), 0);
	char data[160];
	snprintf(data, sizeof data, "%s/data", d.root);
	mkdir(data, 0700);
	const char *extra[] = {"--data-roots", data, "--devices", "cpu", "--cpu-slots", "1", "--schedule", "true", NULL};
	assert_int_equal(bertd_start(&d, extra), 0);

	/* a small corpus and a short job with a few logged windows */
	it_make_corpus(data, "shakes.txt", 1000);
	http_resp r;
	assert_int_equal(http_post_json(&d, "/v1/datasets",
					"{\"name\":\"shakes\",\"source\":\"shakes.txt\",\"vocab\":{\"train\":{\"vocab_size\":300}}}",
					&r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
	json_decref(it_wait_state(&d, "/v1/datasets/shakes", "ready", DEADLINE_S));
	assert_int_equal(http_post_json(&d, "/v1/jobs",
					"{\"name\":\"dash\",\"dataset\":\"shakes\",\"model\":{\"preset\":\"bert-tiny\","
					"\"hidden_size\":32,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
					"\"intermediate_size\":64,\"max_position_embeddings\":64},\"training_args\":"
					"{\"per_device_train_batch_size\":8,\"max_seq_length\":32,\"max_steps\":30,"
					"\"logging_steps\":5,\"dataloader_num_workers\":0}}",
					&r), 0);
	assert_int_equal(r.status, 201);
	char path[96];
	snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(json_object_get(r.json, "id")));
	http_resp_free(&r);
	json_t *j = it_wait_state(&d, path, "completed|failed", DEADLINE_S);
	assert_string_equal(json_string_value(json_object_get(j, "state")), "completed");
	json_decref(j);

	/* headless Chromium: dump the DOM after the page's script ran, and a screenshot */
	const char *art = getenv("BERTD_ARTIFACT_DIR");
	char shot[512], dom[256], log[256], cmd[4096];
	snprintf(shot, sizeof shot, "%s/dashboard.png", art ? art : d.root);
	snprintf(dom, sizeof dom, "%s/dom.html", d.root);
	snprintf(log, sizeof log, "%s/chromium.log", d.root);
	const char *flags = "--headless --no-sandbox --disable-gpu --no-first-run --disable-extensions "
			    "--enable-logging=stderr --v=0 --virtual-time-budget=10000 --window-size=1300,1400";
	snprintf(cmd, sizeof cmd, "timeout 120 '%s' %s --user-data-dir='%s/chrome1' --dump-dom '%s/#token=%s' >'%s' 2>'%s'",
		 chromium, flags, d.root, d.base_url, d.token, dom, log);
	assert_int_equal(system(cmd), 0);
	char log2[300];
	snprintf(log2, sizeof log2, "%s.shot", log);
	snprintf(cmd, sizeof cmd, "timeout 120 '%s' %s --user-data-dir='%s/chrome2' --screenshot='%s' '%s/#token=%s' 2>'%s'",
		 chromium, flags, d.root, shot, d.base_url, d.token, log2);
	assert_int_equal(system(cmd), 0);
	struct stat st;
	assert_int_equal(stat(shot, &st), 0);
	assert_true(st.st_size > 1000);

	char *html = slurp(dom), *errs = slurp(log), *errs2 = slurp(log2);
	assert_non_null(html);
	assert_non_null(errs);
	assert_non_null(errs2);
	if (strstr(errs, "Uncaught") || strstr(errs, "ERROR:CONSOLE") || strstr(errs2, "Uncaught") ||
	    strstr(errs2, "ERROR:CONSOLE") || strstr(errs, "Refused to"))
		fail_msg("console errors:\n%s", errs);
	/* the job is listed, every chart drew a series, the diagnosis shows */
	assert_non_null(strstr(html, "<td>dash</td>"));
	assert_non_null(strstr(html, "<tr class=\"job sel\">")); /* the shown job is highlighted */
	assert_non_null(strstr(html, "data-name=\"loss\""));
	assert_non_null(strstr(html, "data-name=\"tokens/s\""));
	assert_non_null(strstr(html, "data-name=\"data_wait\""));
	assert_non_null(strstr(html, "data-name=\"compute\""));
	assert_true(count(html, "<path class=\"series\"") >= 2 + 6);
	/* a line chart path has one point per logged window: 6 windows, 5 "L"s */
	const char *lp = strstr(html, "data-name=\"loss\" d=\"M");
	assert_non_null(lp);
	const char *end = strchr(lp + 20, '"');
	size_t ls = 0;
	for (const char *p = lp + 20; p < end; p++)
		ls += *p == 'L';
	assert_int_equal(ls, 5);
	/* no GPU on this job: the utilization chart says so instead of drawing */
	assert_non_null(strstr(html, "no data"));
	assert_non_null(strstr(html, "input_bound"));
	assert_non_null(strstr(html, "class=\"no_data\""));
	assert_null(strstr(html, "HTTP 401"));
	free(html);
	free(errs);
	free(errs2);
	assert_int_equal(bertd_stop(&d), 0);
	bertd_destroy(&d);
}

int main(void)
{
	if (!find_chromium()) {
		fprintf(stderr, "no chromium: skipped\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dashboard_renders),
	};
	return IT_RUN(tests, NULL, NULL);
}
