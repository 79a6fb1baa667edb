/* api unit tests: the route matcher (real table and a synthetic one), the
 * problem+json builder, and the pure request helpers in http.c (JSON depth
 * guard, bearer check, media type, RFC 3339 times). No sockets here; the
 * daemon over HTTP is tests/integration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <cmocka.h>

#include "api/handlers.h"
#include "api/http.h"
#include "api/problem.h"
#include "api/routes.h"

static enum match_t { M_OK, M_404, M_405 } match(const char *method, const char *path,
						const api_route **r, api_path_args *a, char *allow)
{
	size_t n;
	const api_route *t = api_route_table(&n);
	switch (api_route_find(t, n, method, path, r, a, allow, 128)) {
	case API_MATCH_OK: return M_OK;
	case API_MATCH_NO_PATH: return M_404;
	default: return M_405;
	}
}

static void test_real_table_matches(void **state)
{
	(void)state;
	const api_route *r = NULL;
	api_path_args a;
	char allow[128];
	assert_int_equal(match("GET", "/v1/healthz", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, system_healthz);
	assert_true(r->flags & API_ROUTE_PUBLIC);
	assert_int_equal(match("GET", "/v1/version", &r, &a, allow), M_OK);
	assert_false(r->flags & API_ROUTE_PUBLIC);
	assert_int_equal(match("POST", "/v1/jobs", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_create);
	assert_int_equal(a.n, 0);
	assert_int_equal(match("GET", "/v1/jobs", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_list);
	assert_int_equal(match("GET", "/v1/jobs/job-0123456789abcdef", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_get);
	assert_int_equal(a.n, 1);
	assert_string_equal(a.v[0], "job-0123456789abcdef");
	assert_int_equal(match("DELETE", "/v1/jobs/x", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_delete);
	assert_string_equal(a.v[0], "x");
	assert_int_equal(match("POST", "/v1/jobs/j1/cancel", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_cancel);
	assert_string_equal(a.v[0], "j1");
	assert_int_equal(match("GET", "/v1/jobs/j2/events", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_events);
	assert_string_equal(a.v[0], "j2");
	/* the root (dashboard) and /metrics (Prometheus) */
	assert_int_equal(match("GET", "/", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, dashboard_get);
	assert_int_equal(a.n, 0);
	assert_int_equal(match("GET", "/metrics", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, prom_metrics);
	assert_int_equal(match("GET", "/v1/jobs/j3/diagnosis", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_diagnosis);
	assert_string_equal(a.v[0], "j3");
	/* HEAD is answered by the GET handler (MHD drops the body). */
	assert_int_equal(match("HEAD", "/v1/jobs/j2", &r, &a, allow), M_OK);
	assert_ptr_equal(r->handler, jobs_get);
}

static void test_real_table_refuses(void **state)
{
	(void)state;
	const api_route *r = NULL;
	api_path_args a;
	char allow[128];
	const char *nope[] = {"//", "", "/v1", "/v1/", "/v1/jobs/", "/v1//jobs", "//v1/jobs",
			      "/v1/jobsx", "/v1/job", "/v2/jobs", "/v1/jobs/a/b",
			      "/v1/jobs/a/cancel/", "/v1/jobs//cancel", "/v1/healthz/x",
			      "v1/jobs", "/V1/jobs"};
	for (size_t i = 0; i < sizeof nope / sizeof nope[0]; i++) {
		if (match("GET", nope[i], &r, &a, allow) != M_404)
			fail_msg("'%s' should not match any route", nope[i]);
	}
	char longp[400] = "/v1/jobs/";
	memset(longp + strlen(longp), 'a', API_PATH_ARG_MAX);
	assert_int_equal(match("GET", longp, &r, &a, allow), M_404);

	assert_int_equal(match("PUT", "/v1/jobs", &r, &a, allow), M_405);
	assert_string_equal(allow, "POST, GET, HEAD");
	assert_int_equal(match("POST", "/v1/jobs/j", &r, &a, allow), M_405);
	assert_string_equal(allow, "GET, HEAD, DELETE, PATCH");
	assert_int_equal(match("GET", "/v1/jobs/j/cancel", &r, &a, allow), M_405);
	assert_string_equal(allow, "POST");
	assert_int_equal(match("DELETE", "/v1/healthz", &r, &a, allow), M_405);
	assert_string_equal(allow, "GET, HEAD");
}

static enum MHD_Result h1(api_request *r) { (void)r; return MHD_YES; }
static enum MHD_Result h2(api_request *r) { (void)r; return MHD_YES; }

static void test_two_placeholders_and_order(void **state)
{
	(void)state;
	const api_route t[] = {
		{"GET", "/a/{x}/b/{y}", h1, 0, TOKENS_ROLE_READER, "read"},
		{"GET", "/a/lit/b/{y}", h2, 0, TOKENS_ROLE_READER, "read"}, /* shadowed: first match wins */
		{"PATCH", "/a/{x}/b/{y}", h2, 0, TOKENS_ROLE_READER, "read"},
	};
	const api_route *r = NULL;
	api_path_args a;
	char allow[8];
	assert_int_equal(api_route_find(t, 3, "GET", "/a/lit/b/7", &r, &a, allow, sizeof allow),
			 API_MATCH_OK);
	assert_ptr_equal(r->handler, h1);
	assert_int_equal(a.n, 2);
	assert_string_equal(a.v[0], "lit");
	assert_string_equal(a.v[1], "7");
	assert_int_equal(api_route_find(t, 3, "PATCH", "/a/1/b/2", &r, &a, allow, sizeof allow),
			 API_MATCH_OK);
	assert_ptr_equal(r->handler, h2);
	/* Allow text is truncated to the buffer, never overflows it. */
	assert_int_equal(api_route_find(t, 3, "PUT", "/a/1/b/2", &r, &a, allow, sizeof allow),
			 API_MATCH_NO_METHOD);
	assert_true(strlen(allow) < sizeof allow);
	assert_int_equal(strncmp(allow, "GET, HE", 7), 0);
}

static void test_problem_bodies(void **state)
{
	(void)state;
	json_t *p = api_problem_json(API_P_INVALID_SPEC, "hidden_size must divide",
				     "model.num_attention_heads", "/v1/jobs");
	assert_non_null(p);
	assert_string_equal(json_string_value(json_object_get(p, "type")),
			    "urn:bertd:problem:invalid-spec");
	assert_int_equal(json_integer_value(json_object_get(p, "status")), 422);
	assert_string_equal(json_string_value(json_object_get(p, "title")), "Invalid job spec");
	assert_string_equal(json_string_value(json_object_get(p, "detail")),
			    "hidden_size must divide");
	assert_string_equal(json_string_value(json_object_get(p, "field")),
			    "model.num_attention_heads");
	assert_string_equal(json_string_value(json_object_get(p, "instance")), "/v1/jobs");
	json_decref(p);

	p = api_problem_json(API_P_NOT_FOUND, NULL, "", NULL);
	assert_int_equal(json_object_size(p), 3); /* type, title, status only */
	assert_int_equal(json_integer_value(json_object_get(p, "status")), 404);
	json_decref(p);

	/* Client bytes that are not UTF-8 still give a valid JSON reply. */
	p = api_problem_json(API_P_INVALID_PARAMETER, "got '\xff\xfe'", "state", NULL);
	assert_non_null(p);
	assert_string_equal(json_string_value(json_object_get(p, "detail")),
			    "got '?" "?'" /* two bytes, two marks */);
	json_decref(p);

	/* Codes are unique, statuses are errors, and each has a title. */
	for (int i = 0; i < API_P_COUNT; i++) {
		assert_non_null(api_problem_code(i));
		assert_true(api_problem_status(i) >= 400 && api_problem_status(i) < 600);
		assert_true(strlen(api_problem_title(i)) > 0);
		for (int k = 0; k < i; k++)
			assert_string_not_equal(api_problem_code(i), api_problem_code(k));
	}
	assert_int_equal(api_problem_status(API_P_UNAUTHORIZED), 401);
	assert_int_equal(api_problem_status(API_P_METHOD_NOT_ALLOWED), 405);
	assert_int_equal(api_problem_status(API_P_BODY_TOO_LARGE), 413);
	assert_int_equal(api_problem_status(API_P_UNSUPPORTED_MEDIA), 415);
	assert_int_equal(api_problem_status(API_P_IDEMPOTENCY_REUSE), 422);
}

static char *nested(int depth, const char *open, const char *close_)
{
	size_t lo = strlen(open), lc = strlen(close_);
	char *s = malloc((size_t)depth * (lo + lc) + 1), *p = s;
	for (int i = 0; i < depth; i++, p += lo)
		memcpy(p, open, lo);
	for (int i = 0; i < depth; i++, p += lc)
		memcpy(p, close_, lc);
	*p = 0;
	return s;
}

static void test_json_depth_guard(void **state)
{
	(void)state;
	json_t *j = NULL;
	char detail[256];
	char *ok = nested(API_JSON_MAX_DEPTH, "[", "]");
	assert_int_equal(api_json_parse(ok, strlen(ok), API_JSON_MAX_DEPTH, &j, detail, 256), 0);
	json_decref(j);
	char *deep = nested(API_JSON_MAX_DEPTH + 1, "[", "]");
	assert_int_equal(api_json_parse(deep, strlen(deep), API_JSON_MAX_DEPTH, &j, detail, 256),
			 -E2BIG);
	char *objs = nested(API_JSON_MAX_DEPTH + 1, "{\"a\":", "}");
	/* Not valid JSON at the innermost level, but depth is refused first. */
	assert_int_equal(api_json_parse(objs, strlen(objs), API_JSON_MAX_DEPTH, &j, detail, 256),
			 -E2BIG);
	/* Huge depth is refused without recursion (jansson alone would try). */
	char *huge = nested(200000, "[", "]");
	assert_int_equal(api_json_parse(huge, strlen(huge), API_JSON_MAX_DEPTH, &j, detail, 256),
			 -E2BIG);
	free(ok), free(deep), free(objs), free(huge);

	/* Brackets inside strings, with escaped quotes, are not nesting. */
	const char *s = "{\"a\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"{{{{{{{{{{{{{{{{{{{{{{{{{{{{"
			"{{{{{{{\"}";
	assert_int_equal(api_json_parse(s, strlen(s), 2, &j, detail, 256), 0);
	const char *v = json_string_value(json_object_get(j, "a"));
	assert_non_null(v);
	assert_int_equal(v[0], '[');
	assert_non_null(strchr(v, '"'));
	assert_int_equal(v[strlen(v) - 1], '{');
	json_decref(j);

	assert_int_equal(api_json_parse("{\"a\":", 5, 32, &j, detail, 256), -EINVAL);
	assert_non_null(strstr(detail, "line 1"));
	const char *dup = "{\"a\":1,\"a\":2}";
	assert_int_equal(api_json_parse(dup, strlen(dup), 32, &j, detail, 256), -EINVAL);
	assert_int_equal(api_json_parse("{} x", 4, 32, &j, detail, 256), -EINVAL);
}

static void test_bearer_check(void **state)
{
	(void)state;
	const char *tok = "0123456789abcdef0123456789abcdef";
	assert_true(api_auth_ok("Bearer 0123456789abcdef0123456789abcdef", tok));
	assert_true(api_auth_ok("bearer 0123456789abcdef0123456789abcdef", tok));
	assert_false(api_auth_ok("Bearer 0123456789abcdef0123456789abcdeF", tok));
	assert_false(api_auth_ok("Bearer 0123456789abcdef0123456789abcde", tok));
	assert_false(api_auth_ok("Bearer 0123456789abcdef0123456789abcdef0", tok));
	assert_false(api_auth_ok("Bearer ", tok));
	assert_false(api_auth_ok("Basic 0123456789abcdef0123456789abcdef", tok));
	assert_false(api_auth_ok("0123456789abcdef0123456789abcdef", tok));
	assert_false(api_auth_ok(NULL, tok));
	assert_false(api_auth_ok("Bearer ", ""));
	assert_false(api_auth_ok("Bearer x", NULL));
}

static void test_media_and_time(void **state)
{
	(void)state;
	assert_true(api_media_is_json("application/json"));
	assert_true(api_media_is_json("Application/JSON; charset=utf-8"));
	assert_false(api_media_is_json("application/jsonx"));
	assert_false(api_media_is_json("application/x-www-form-urlencoded"));
	assert_false(api_media_is_json("text/plain"));
	assert_false(api_media_is_json(NULL));

	char buf[32];
	api_time_format(0, buf);
	assert_string_equal(buf, "1970-01-01T00:00:00.000Z");
	/* Reference: Python datetime.fromtimestamp(1796037587.123, utc). */
	api_time_format(1796037587123LL, buf);
	assert_string_equal(buf, "2026-11-30T11:19:47.123Z");
	api_time_format(1796037587009LL, buf);
	assert_string_equal(buf, "2026-11-30T11:19:47.009Z");
}

static void test_json_dumps_short_reals(void **state)
{
	(void)state;
	json_t *o = json_pack("{s:f, s:f, s:i}", "p", 0.15, "lr", 5e-5, "n", 3);
	char *t = api_json_dumps(o, true);
	assert_non_null(t);
	assert_string_equal(t, "{\"p\":0.15,\"lr\":5e-5,\"n\":3}\n");
	free(t);
	json_decref(o);

	/* 0.1 + 0.2 needs 17 digits; then the text must still read back exactly. */
	o = json_pack("{s:f, s:f}", "p", 0.15, "odd", 0.1 + 0.2);
	t = api_json_dumps(o, false);
	assert_non_null(strstr(t, "0.30000000000000004"));
	json_t *back = json_loads(t, 0, NULL);
	assert_true(json_equal(back, o));
	json_decref(back);
	free(t);
	json_decref(o);
}

static char *slurp(const char *name)
{
	const char *dir = getenv("BERTD_DOCS_DIR");
	char path[1024];
	if (!dir)
		fail_msg("BERTD_DOCS_DIR is not set");
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "rb");
	if (!f)
		fail_msg("cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = 0;
	fclose(f);
	return buf;
}

/* The docs list exactly what the code serves: every route and every
 * problem code appears in docs/api.md and docs/openapi.yaml. */
static void test_docs_cover_routes_and_codes(void **state)
{
	(void)state;
	char *md = slurp("api.md"), *oa = slurp("openapi.yaml");
	char needle[256];
	size_t n;
	const api_route *t = api_route_table(&n);
	for (size_t i = 0; i < n; i++) {
		snprintf(needle, sizeof needle, "### %s %s", t[i].method, t[i].path);
		if (!strstr(md, needle))
			fail_msg("docs/api.md has no heading '%s'", needle);
		snprintf(needle, sizeof needle, "\n  %s:\n", t[i].path);
		if (!strstr(oa, needle))
			fail_msg("docs/openapi.yaml has no path %s", t[i].path);
	}
	for (int p = 0; p < API_P_COUNT; p++) {
		snprintf(needle, sizeof needle, "| %d | `%s` |", api_problem_status(p),
			 api_problem_code(p));
		if (!strstr(md, needle))
			fail_msg("docs/api.md error table lacks '%s'", needle);
		snprintf(needle, sizeof needle, "- urn:bertd:problem:%s\n", api_problem_code(p));
		if (!strstr(oa, needle))
			fail_msg("docs/openapi.yaml Problem.type lacks %s", api_problem_code(p));
	}
	free(md);
	free(oa);
}

/* Store errors map to their own problems in one place (problem.c): locked
 * is 503 with Retry-After, full 507, damaged 500 database-damaged, the rest
 * internal. */
static void test_store_errors_map(void **state)
{
	(void)state;
	assert_int_equal(api_problem_status(api_problem_of_store(STORE_E_LOCKED)), 503);
	assert_string_equal(api_problem_code(api_problem_of_store(STORE_E_LOCKED)), "database-busy");
	assert_true(api_problem_retry_after(api_problem_of_store(STORE_E_LOCKED)) > 0);
	assert_int_equal(api_problem_status(api_problem_of_store(STORE_E_FULL)), 507);
	assert_string_equal(api_problem_code(api_problem_of_store(STORE_E_DAMAGED)),
			    "database-damaged");
	assert_int_equal(api_problem_status(api_problem_of_store(STORE_E_DAMAGED)), 500);
	assert_int_equal(api_problem_of_store(-EIO), API_P_INTERNAL);
	assert_int_equal(api_problem_of_store(-ENOMEM), API_P_INTERNAL);
	assert_int_equal(api_problem_retry_after(API_P_INTERNAL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_store_errors_map),
		cmocka_unit_test(test_real_table_matches),
		cmocka_unit_test(test_real_table_refuses),
		cmocka_unit_test(test_two_placeholders_and_order),
		cmocka_unit_test(test_problem_bodies),
		cmocka_unit_test(test_json_depth_guard),
		cmocka_unit_test(test_bearer_check),
		cmocka_unit_test(test_media_and_time),
		cmocka_unit_test(test_json_dumps_short_reals),
		cmocka_unit_test(test_docs_cover_routes_and_codes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
