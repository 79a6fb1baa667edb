/* HTTP/1.1 conformance at the edge of the API, over raw sockets (libcurl
 * would repair the requests under test): a request whose length can be
 * read two ways (two different Content-Lengths, Content-Length with
 * Transfer-Encoding) is 400, HTTP/1.1 without Host is 400, a transfer
 * coding other than chunked is 501 at once instead of a wait for the
 * connection timeout — each as application/problem+json, the connection
 * closed after it; a caller without a token learns nothing about routes
 * (401 before 404 and 405, except on public paths). And a data root that
 * does not exist is named in the log at start and in GET /v1/system, and
 * allow_remote under systemd names the drop-in that lets remote clients in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

/* A hang guard only: every answer under test comes at once; without the
 * fixes the daemon closes an idle connection after --conn-timeout-s (5)
 * and the test fails on the missing answer, not on time. */
#define RECV_GUARD_S 60

typedef struct raw_resp {
	int status;
	char head[4096];  /* status line and headers, NUL-terminated */
	char body[4096];
	json_t *json;
	bool closed;      /* the server closed the connection after the reply */
} raw_resp;

static int setup(void **state)
{
	const char *extra[] = {"--conn-timeout-s", "5", NULL};
	it_daemon_opts o = {.plain = true, .extra = extra};
	return it_setup(state, &o, 0);
}

static const char *find_header(const raw_resp *r, const char *name, char *buf, size_t n)
{
	size_t nl = strlen(name);
	for (const char *p = strstr(r->head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
		const char *line = p + 2;
		if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
			const char *v = line + nl + 1;
			while (*v == ' ')
				v++;
			size_t len = strcspn(v, "\r");
			snprintf(buf, n, "%.*s", (int)len, v);
			return buf;
		}
	}
	return NULL;
}

/* Sends req as is, reads one reply (headers, then Content-Length bytes),
 * then whether the server closes the connection. */
static void exchange(const bertd *d, const char *req, raw_resp *r)
{
	memset(r, 0, sizeof *r);
	int fd = it_connect(d, RECV_GUARD_S);
	size_t len = strlen(req);
	assert_int_equal(send(fd, req, len, MSG_NOSIGNAL), (ssize_t)len);
	char buf[8192];
	size_t got = 0;
	buf[0] = 0;
	char *end = NULL;
	while (!(end = strstr(buf, "\r\n\r\n"))) {
		ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
		if (n <= 0)
			fail_msg("no answer to the request (recv %zd, errno %d); sent:\n%s", n, errno,
				 req);
		got += (size_t)n;
		buf[got] = 0;
	}
	size_t head_len = (size_t)(end - buf) + 2;
	assert_true(head_len < sizeof r->head);
	memcpy(r->head, buf, head_len);
	r->head[head_len] = 0;
	assert_int_equal(sscanf(r->head, "HTTP/1.%*d %d", &r->status), 1);
	char v[64];
	size_t body_len = find_header(r, "Content-Length", v, sizeof v) ? strtoul(v, NULL, 10) : 0;
	assert_true(body_len < sizeof r->body);
	size_t have = got - (head_len + 2);
	memcpy(r->body, end + 4, have);
	while (have < body_len) {
		ssize_t n = recv(fd, r->body + have, body_len - have, 0);
		assert_true(n > 0);
		have += (size_t)n;
	}
	r->body[body_len] = 0;
	r->json = json_loads(r->body, 0, NULL);
	char one;
	r->closed = recv(fd, &one, 1, 0) == 0;
	close(fd);
}

static void raw_free(raw_resp *r)
{
	json_decref(r->json);
	r->json = NULL;
}

static void check_problem(const raw_resp *r, int status, const char *code, const char *field)
{
	char ct[128], type[128];
	if (r->status != status)
		fail_msg("status %d, want %d; reply:\n%s%s", r->status, status, r->head, r->body);
	assert_non_null(find_header(r, "Content-Type", ct, sizeof ct));
	assert_string_equal(ct, "application/problem+json");
	assert_non_null(r->json);
	snprintf(type, sizeof type, "urn:bertd:problem:%s", code);
	assert_string_equal(it_jstr(r->json, "type"), type);
	assert_int_equal(json_integer_value(json_object_get(r->json, "status")), status);
	if (field)
		assert_string_equal(it_jstr(r->json, "field"), field);
}

/* ------------------------------------------------------------ framing */

static void test_two_content_lengths(void **state)
{
	bertd *d = *state;
	raw_resp r;
	char req[1024];
	snprintf(req, sizeof req,
		 "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
		 "Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 12\r\n"
		 "\r\n{}", d->token);
	exchange(d, req, &r);
	check_problem(&r, 400, "bad-request", "Content-Length");
	assert_true(r.closed);
	raw_free(&r);

	/* The same length twice is one length: the request goes on (and the
	 * empty spec is refused for what it is, not for its framing). */
	snprintf(req, sizeof req,
		 "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
		 "Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 2\r\n"
		 "\r\n{}", d->token);
	exchange(d, req, &r);
	check_problem(&r, 422, "invalid-spec", "dataset");
	raw_free(&r);

	snprintf(req, sizeof req,
		 "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
		 "Content-Type: application/json\r\nContent-Length: 7\r\n"
		 "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", d->token);
	exchange(d, req, &r);
	check_problem(&r, 400, "bad-request", "Content-Length");
	assert_true(r.closed);
	raw_free(&r);
}

static void test_host_required(void **state)
{
	bertd *d = *state;
	raw_resp r;
	exchange(d, "GET /v1/healthz HTTP/1.1\r\n\r\n", &r);
	check_problem(&r, 400, "bad-request", "Host");
	assert_true(r.closed);
	raw_free(&r);

	exchange(d, "GET /v1/healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &r);
	check_problem(&r, 400, "bad-request", "Host");
	raw_free(&r);

	/* HTTP/1.0 has no Host requirement. */
	exchange(d, "GET /v1/healthz HTTP/1.0\r\n\r\n", &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(it_jstr(r.json, "status"), "ok");
	raw_free(&r);
	exchange(d, "GET /v1/healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", &r);
	assert_int_equal(r.status, 200);
	raw_free(&r);
}

/* The body never comes: the answer must not wait for it. */
static void test_unknown_transfer_encoding_501(void **state)
{
	bertd *d = *state;
	raw_resp r;
	char req[1024];
	const char *codings[] = {"gzip", "gzip, chunked", "identity"};
	for (size_t i = 0; i < sizeof codings / sizeof codings[0]; i++) {
		snprintf(req, sizeof req,
			 "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
			 "Content-Type: application/json\r\nTransfer-Encoding: %s\r\n\r\n",
			 d->token, codings[i]);
		exchange(d, req, &r);
		check_problem(&r, 501, "transfer-encoding-not-implemented", "Transfer-Encoding");
		assert_non_null(strstr(it_jstr(r.json, "detail"), codings[i]));
		assert_true(r.closed);
		raw_free(&r);
	}
	/* Without a token too: framing is judged before anything else. */
	exchange(d, "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: br\r\n\r\n", &r);
	check_problem(&r, 501, "transfer-encoding-not-implemented", "Transfer-Encoding");
	raw_free(&r);
}

/* ------------------------------------------------------------ auth first */

static void test_no_token_learns_no_routes(void **state)
{
	bertd *d = *state;
	raw_resp r;
	char h[64];
	const char *probes[] = {
		"PUT /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n",                 /* 405 with a token */
		"GET /v1/jobs/job-0123456789abcdef/cancel HTTP/1.1\r\nHost: x\r\n\r\n", /* 405 */
		"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n",              /* 405 */
		"GET /v1/nope HTTP/1.1\r\nHost: x\r\n\r\n",                 /* 404 */
		"GET /v1/jobs/ HTTP/1.1\r\nHost: x\r\n\r\n",                /* 404 */
	};
	for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
		exchange(d, probes[i], &r);
		check_problem(&r, 401, "unauthorized", NULL);
		assert_non_null(find_header(&r, "WWW-Authenticate", h, sizeof h));
		assert_null(find_header(&r, "Allow", h, sizeof h));
		raw_free(&r);
	}
	/* Public paths are public in every answer. */
	exchange(d, "DELETE /v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n", &r);
	check_problem(&r, 405, "method-not-allowed", NULL);
	assert_non_null(find_header(&r, "Allow", h, sizeof h));
	assert_string_equal(h, "GET, HEAD");
	raw_free(&r);
	exchange(d, "POST / HTTP/1.1\r\nHost: x\r\n\r\n", &r);
	check_problem(&r, 405, "method-not-allowed", NULL);
	raw_free(&r);

	/* With the token the same probes answer what they are. */
	char req[512];
	snprintf(req, sizeof req, "PUT /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
		 d->token);
	exchange(d, req, &r);
	check_problem(&r, 405, "method-not-allowed", NULL);
	raw_free(&r);
	snprintf(req, sizeof req, "GET /v1/nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
		 d->token);
	exchange(d, req, &r);
	check_problem(&r, 404, "not-found", NULL);
	raw_free(&r);
}

/* ------------------------------------------------------------ data roots */

static bool log_has(const bertd *d, const char *needle)
{
	char path[128];
	snprintf(path, sizeof path, "%s/bertd.log", d->root);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	char line[2048];
	bool found = false;
	while (!found && fgets(line, sizeof line, f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

/* Roots need not exist at start (a mount may come later), but the log says
 * which is missing, and GET /v1/system says it as long as it is. */
static void test_missing_data_root_reported(void **state)
{
	(void)state;
	char missing[128], roots[300], needle[300];
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	assert_non_null(f);
	const char *data = f->data;
	snprintf(missing, sizeof missing, "%s/not-mounted-yet", f->d.root);
	snprintf(roots, sizeof roots, "%s:%s", data, missing);
	const char *extra[] = {"--data-roots", roots, NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}), 0);
	bertd *d = &f->d;

	snprintf(needle, sizeof needle, "data root %s does not exist", missing);
	if (!log_has(d, needle)) {
		bertd_print_log(d);
		fail_msg("the log does not say '%s'", needle);
	}
	snprintf(needle, sizeof needle, "data root %s ", data);
	assert_false(log_has(d, needle));

	json_t *s = it_get_json(d, "/v1/system");
	json_t *rs = json_object_get(s, "data_roots");
	assert_int_equal(json_array_size(rs), 2);
	assert_string_equal(it_jstr(json_array_get(rs, 0), "path"), data);
	assert_true(json_is_true(json_object_get(json_array_get(rs, 0), "ok")));
	assert_true(json_is_null(json_object_get(json_array_get(rs, 0), "problem")));
	assert_string_equal(it_jstr(json_array_get(rs, 1), "path"), missing);
	assert_true(json_is_false(json_object_get(json_array_get(rs, 1), "ok")));
	assert_non_null(strstr(it_jstr(json_array_get(rs, 1), "problem"), missing));
	json_t *w = json_object_get(s, "warnings");
	assert_int_equal(json_array_size(w), 1);
	assert_non_null(strstr(json_string_value(json_array_get(w, 0)), missing));
	json_decref(s);

	/* Checked per request: once the root is there, the warning is gone. */
	assert_int_equal(mkdir(missing, 0700), 0);
	s = it_get_json(d, "/v1/system");
	rs = json_object_get(s, "data_roots");
	assert_true(json_is_true(json_object_get(json_array_get(rs, 1), "ok")));
	assert_int_equal(json_array_size(json_object_get(s, "warnings")), 0);
	json_decref(s);
	assert_int_equal(it_daemon_stop(f), 0);
}

/* bertd cannot read the unit's IP filter, so under systemd (INVOCATION_ID
 * set) allow_remote gets a pointer to the drop-in that opens it. */
static void test_allow_remote_names_the_dropin(void **state)
{
	(void)state;
	const char *needle = "systemd/bertd.service.d/remote-listen.conf.example";
	assert_int_equal(setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1), 0);
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true}, 0);
	assert_non_null(f);
	bertd *d = &f->d;
	assert_false(log_has(d, needle));
	assert_int_equal(bertd_stop(d), 0);
	const char *remote[] = {"--allow-remote", "true", NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = remote}), 0);
	unsetenv("INVOCATION_ID");
	if (!log_has(d, needle)) {
		bertd_print_log(d);
		fail_msg("the log does not name %s", needle);
	}
	assert_int_equal(it_daemon_stop(f), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_two_content_lengths, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_host_required, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_unknown_transfer_encoding_501, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_no_token_learns_no_routes, setup, it_teardown),
		cmocka_unit_test(test_missing_data_root_reported),
		cmocka_unit_test(test_allow_remote_names_the_dropin),
	};
	return IT_RUN(tests, NULL, NULL);
}
