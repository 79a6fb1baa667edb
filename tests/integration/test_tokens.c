/* Named API tokens and roles against a real daemon: every route of
 * api/routes.c (read from the source, so a new route without a row here
 * fails) answered for every role (admin, user, reader), without a token
 * and with a revoked one; a user's reach limited to its own jobs; the
 * owner and the actor in jobs and events; a token revoked by the `bertd
 * token` command or the API refused by the very next request; the
 * command's add, list and revoke; the token file's "default" token. The
 * group's queue is held (cancel and change act on queued jobs); one job
 * runs, on a daemon of its own, to be canceled by its owner. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "it_util.h"
#include "openapi_check.h"

#define DEADLINE_S 300

enum { ADMIN, USER, READER, NROLES };
static const char *const role_name[NROLES] = {"admin", "user", "reader"};
static const char *const token_name[NROLES] = {"ad", "us", "rd"};

static json_t *doc; /* docs/openapi.yaml as JSON */

/* A JSON answer of a route must be one docs/openapi.yaml describes (the
 * document's response for its status and content type, $refs followed). */
static void expect_documented(const char *tmpl, const char *method, const http_resp *r)
{
	char lower[8], status[8], ctype[64], err[1024];
	if (!r->json || !http_header(r, "Content-Type", ctype, sizeof ctype))
		return;
	ctype[strcspn(ctype, ";")] = 0;
	for (size_t i = 0; i < sizeof lower; i++)
		lower[i] = (char)(method[i] >= 'A' && method[i] <= 'Z' ? method[i] + 32 : method[i]);
	snprintf(status, sizeof status, "%ld", r->status);
	json_t *sc = openapi_response_schema(doc, tmpl, lower, status, ctype);
	if (!sc)
		fail_msg("docs/openapi.yaml has no %s answer for %s %s %s", ctype, method, tmpl, status);
	if (openapi_check(doc, sc, r->json, err, sizeof err) != 0)
		fail_msg("%s %s %s disagrees with docs/openapi.yaml at %s: %.1000s", method, tmpl,
			 status, err, r->body);
}

static int setup(void **state)
{
	char path[4096], err[512];
	snprintf(path, sizeof path, "%s/docs/openapi.yaml", getenv("BERTD_SOURCE_ROOT"));
	if (!(doc = openapi_load(path, err, sizeof err))) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	it_daemon_opts o = {.cpu_slots = "1", .schedule = "false", .dataset = "shakes",
			    .corpus = "shakes.txt", .corpus_lines = 400, .vocab_size = 200,
			    .wait_ready = true};
	return it_setup(state, &o, DEADLINE_S);
}

/* One request with the bearer secret (NULL: no Authorization header). */
static http_resp call(const bertd *d, const char *secret, const char *method, const char *path,
		      const char *body)
{
	char auth[320];
	const char *hdrs[2] = {auth, NULL};
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", secret ? secret : "");
	http_resp r;
	assert_int_equal(http_do(d, method, path, body, body ? strlen(body) : 0, secret ? hdrs : NULL,
				 H_NO_AUTH, &r),
			 0);
	return r;
}

static long status_of(const bertd *d, const char *secret, const char *method, const char *path,
		      const char *body)
{
	http_resp r = call(d, secret, method, path, body);
	long s = r.status;
	http_resp_free(&r);
	return s;
}

/* POST /v1/tokens with the default token; the new secret (caller frees). */
static char *add_token(const bertd *d, const char *name, const char *role)
{
	char body[160];
	snprintf(body, sizeof body, "{\"name\":\"%s\",\"role\":\"%s\"}", name, role);
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/tokens", body, &r), 0);
	if (r.status != 201)
		fail_msg("POST /v1/tokens %s: %ld %s", body, r.status, r.body);
	assert_string_equal(it_jstr(r.json, "name"), name);
	assert_string_equal(it_jstr(r.json, "role"), role);
	char *secret = strdup(it_jstr(r.json, "secret"));
	assert_int_equal(strlen(secret), 64);
	http_resp_free(&r);
	return secret;
}

/* Submits the tiny job as secret's token; its id (caller frees). */
static char *submit_as(const bertd *d, const char *secret)
{
	char *spec = it_job_spec(NULL, "shakes", NULL);
	http_resp r = call(d, secret, "POST", "/v1/jobs", spec);
	if (r.status != 201)
		fail_msg("submit: %ld %s", r.status, r.body);
	char *id = strdup(it_jstr(r.json, "id"));
	http_resp_free(&r);
	free(spec);
	return id;
}

static void cancel_as(const bertd *d, const char *secret, const char *id)
{
	char path[96];
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
	assert_int_equal(status_of(d, secret, "POST", path, NULL), 200);
}

/* ---- the route table, as api/routes.c writes it ---- */

typedef struct route {
	char method[8], path[128], action[48];
	bool public_;
} route;

/* Rows of routes[] in $BERTD_SOURCE_ROOT/api/routes.c: {"M", "/path", handler, flags, R, "action"}. */
static size_t read_routes(route *out, size_t cap)
{
	char file[4096];
	snprintf(file, sizeof file, "%s/api/routes.c", getenv("BERTD_SOURCE_ROOT"));
	char *src = it_slurp(file, NULL);
	assert_non_null(src);
	size_t n = 0;
	for (char *line = strtok(src, "\n"); line; line = strtok(NULL, "\n")) {
		route r = {0};
		if (sscanf(line, " {\"%7[A-Z]\", \"%127[^\"]\",", r.method, r.path) != 2)
			continue;
		char *end = strrchr(line, '"');
		assert_non_null(end);
		*end = 0;
		char *start = strrchr(line, '"');
		snprintf(r.action, sizeof r.action, "%s", start + 1);
		r.public_ = strstr(line, "API_ROUTE_PUBLIC") != NULL;
		assert_true(n < cap);
		out[n++] = r;
	}
	free(src);
	assert_true(n >= 25);
	return n;
}

/* What each role gets: a status, or SAME: what the admin got, which must
 * be neither 401 nor 403 (reads whose answer depends on the job, not the
 * role). */
#define SAME 0
typedef struct expect {
	const char *method, *path;
	long status[NROLES]; /* admin, user, reader */
	const char *body;
} expect;

static const expect expects[] = {
	{"GET", "/", {200, 200, 200}, NULL},
	{"GET", "/metrics", {200, 200, 200}, NULL},
	{"GET", "/v1/healthz", {200, 200, 200}, NULL},
	{"GET", "/v1/version", {200, 200, 200}, NULL},
	{"GET", "/v1/system", {200, 200, 200}, NULL},
	{"POST", "/v1/jobs", {201, 201, 403}, "spec"},
	{"GET", "/v1/jobs", {200, 200, 200}, NULL},
	{"GET", "/v1/jobs/{id}", {200, 200, 200}, NULL},
	{"DELETE", "/v1/jobs/{id}", {204, 204, 403}, NULL},
	{"PATCH", "/v1/jobs/{id}", {200, 200, 403}, "{\"priority\":3}"},
	{"POST", "/v1/jobs/{id}/cancel", {200, 200, 403}, NULL},
	{"GET", "/v1/jobs/{id}/events", {200, 200, 200}, NULL},
	{"GET", "/v1/jobs/{id}/metrics", {200, 200, 200}, NULL},
	{"GET", "/v1/jobs/{id}/checkpoints", {200, 200, 200}, NULL},
	{"GET", "/v1/jobs/{id}/checkpoints/{step}", {SAME, SAME, SAME}, NULL},
	{"GET", "/v1/jobs/{id}/checkpoints/{step}/export", {SAME, SAME, SAME}, NULL},
	{"GET", "/v1/jobs/{id}/export", {SAME, SAME, SAME}, NULL},
	{"GET", "/v1/jobs/{id}/logs", {SAME, SAME, SAME}, NULL},
	{"GET", "/v1/jobs/{id}/diagnosis", {SAME, SAME, SAME}, NULL},
	{"GET", "/v1/devices", {200, 200, 200}, NULL},
	{"POST", "/v1/datasets", {201, 201, 403}, "dataset"},
	{"GET", "/v1/datasets", {200, 200, 200}, NULL},
	{"GET", "/v1/datasets/{id}", {200, 200, 200}, NULL},
	{"DELETE", "/v1/datasets/{id}", {204, 403, 403}, NULL},
	{"POST", "/v1/tokens", {201, 403, 403}, "token"},
	{"GET", "/v1/tokens", {200, 403, 403}, NULL},
	{"DELETE", "/v1/tokens/{name}", {204, 403, 403}, NULL},
};

static const expect *expect_of(const route *r)
{
	for (size_t i = 0; i < sizeof expects / sizeof expects[0]; i++)
		if (!strcmp(expects[i].method, r->method) && !strcmp(expects[i].path, r->path))
			return &expects[i];
	fail_msg("route %s %s has no row in test_tokens.c's expects[]", r->method, r->path);
	return NULL;
}

/* What a role's request acts on. */
typedef struct target {
	char *queued;   /* a queued job: PATCH, cancel, reads */
	char *ended;    /* a canceled job: DELETE */
	const char *dataset_del; /* DELETE /v1/datasets/{id} */
	const char *token_del;   /* DELETE /v1/tokens/{name} */
	char new_dataset[32], new_token[32];
} target;

/* path with {id}, {step}, {name} filled for the route and role. */
static void fill(const route *r, const target *t, char *out, size_t cap)
{
	const char *id = t->queued;
	if (strcmp(r->method, "DELETE") == 0)
		id = strncmp(r->path, "/v1/jobs", 8) == 0 ? t->ended
		   : strncmp(r->path, "/v1/datasets", 12) == 0 ? t->dataset_del : t->token_del;
	else if (strncmp(r->path, "/v1/datasets", 12) == 0)
		id = "shakes";
	size_t k = 0;
	for (const char *p = r->path; *p && k + 1 < cap;) {
		if (*p == '{') {
			const char *v = strncmp(p, "{step}", 6) == 0 ? "10" : id;
			k += (size_t)snprintf(out + k, cap - k, "%s", v);
			p = strchr(p, '}') + 1;
		} else {
			out[k++] = *p++;
		}
	}
	out[k] = 0;
}

static const char *body_for(const expect *e, const target *t, char *buf, size_t cap)
{
	if (!e->body)
		return NULL;
	if (strcmp(e->body, "spec") == 0) {
		char *spec = it_job_spec(NULL, "shakes", NULL);
		snprintf(buf, cap, "%s", spec);
		free(spec);
	} else if (strcmp(e->body, "dataset") == 0) {
		snprintf(buf, cap, "{\"name\":\"%s\",\"source\":\"shakes.txt\",\"vocab\":{\"train\":"
				   "{\"vocab_size\":200}}}", t->new_dataset);
	} else if (strcmp(e->body, "token") == 0) {
		snprintf(buf, cap, "{\"name\":\"%s\",\"role\":\"reader\"}", t->new_token);
	} else {
		snprintf(buf, cap, "%s", e->body);
	}
	return buf;
}

/* A 403 must be problem+json naming the token's role and the action. */
static void assert_forbidden(const http_resp *r, const char *role, const char *action)
{
	assert_int_equal(r->status, 403);
	assert_non_null(r->json);
	assert_string_equal(it_jstr(r->json, "type"), "urn:bertd:problem:forbidden");
	assert_string_equal(it_jstr(r->json, "role"), role);
	assert_string_equal(it_jstr(r->json, "action"), action);
}

/* Every route for every role, with the status the role must get; then,
 * for every route but the public ones, 401 with no token, a wrong one and
 * a revoked one. */
static void test_every_route_every_role(void **state)
{
	const bertd *d = *state;
	route routes[64];
	size_t nr = read_routes(routes, 64);
	char *secret[NROLES];
	for (int k = 0; k < NROLES; k++)
		secret[k] = add_token(d, token_name[k], role_name[k]);
	/* Targets: the user acts on its own jobs; the admin and the reader on
	 * jobs of the token file's "default" token (not theirs). */
	target t[NROLES] = {0};
	for (int k = 0; k < NROLES; k++) {
		const char *owner = k == USER ? secret[USER] : d->token;
		t[k].queued = submit_as(d, owner);
		t[k].ended = submit_as(d, owner);
		cancel_as(d, owner, t[k].ended);
		t[k].dataset_del = "shakes"; /* used by queued jobs: only reachable by an admin */
		t[k].token_del = "nosuch";
		snprintf(t[k].new_dataset, sizeof t[k].new_dataset, "new-%s", token_name[k]);
		snprintf(t[k].new_token, sizeof t[k].new_token, "new-%s", token_name[k]);
	}
	/* the admin's deletions act on things it may delete: a ready dataset
	 * no job uses, a token that exists */
	assert_int_equal(it_add_dataset(d, "{\"name\":\"spare\",\"source\":\"shakes.txt\","
					   "\"vocab\":{\"train\":{\"vocab_size\":200}}}"), 0);
	it_wait_dataset_ready(d, "spare", DEADLINE_S);
	t[ADMIN].dataset_del = "spare";
	free(add_token(d, "doomed", "reader"));
	t[ADMIN].token_del = "doomed";

	int checked = 0;
	for (size_t i = 0; i < nr; i++) {
		const expect *e = expect_of(&routes[i]);
		long admin_got = 0;
		for (int k = 0; k < NROLES; k++) {
			char path[256], buf[2048];
			fill(&routes[i], &t[k], path, sizeof path);
			const char *body = body_for(e, &t[k], buf, sizeof buf);
			http_resp r = call(d, secret[k], routes[i].method, path, body);
			if (k == ADMIN)
				admin_got = r.status;
			long want = e->status[k] == SAME ? admin_got : e->status[k];
			if (e->status[k] == SAME && (r.status == 401 || r.status == 403))
				fail_msg("%s %s as %s: %ld", routes[i].method, path, role_name[k], r.status);
			if (r.status != want) {
				bertd_print_log(d);
				fail_msg("%s %s as %s: %ld, want %ld: %s", routes[i].method, path,
					 role_name[k], r.status, want, r.body);
			}
			if (want == 403)
				assert_forbidden(&r, role_name[k], routes[i].action);
			if (strcmp(routes[i].path, "/") && strcmp(routes[i].path, "/metrics"))
				expect_documented(routes[i].path, routes[i].method, &r);
			http_resp_free(&r);
			checked++;
		}
	}
	assert_int_equal(checked, (int)nr * NROLES);

	/* No token, a wrong one, a revoked one: 401 everywhere but the
	 * public routes (a 401 comes before the route's own checks, so the
	 * admin's targets serve for all). */
	assert_int_equal(status_of(d, d->token, "DELETE", "/v1/tokens/rd", NULL), 204);
	const char *wrong = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
	for (size_t i = 0; i < nr; i++) {
		const expect *e = expect_of(&routes[i]);
		char path[256], buf[2048];
		fill(&routes[i], &t[USER], path, sizeof path);
		const char *body = body_for(e, &t[USER], buf, sizeof buf);
		const char *who[3] = {NULL, wrong, secret[READER]};
		for (int w = 0; w < 3; w++) {
			long s = status_of(d, who[w], routes[i].method, path, body);
			if (routes[i].public_)
				assert_int_equal(s, 200);
			else if (s != 401)
				fail_msg("%s %s with %s: %ld, want 401", routes[i].method, path,
					 w == 0 ? "no token" : w == 1 ? "a wrong token" : "a revoked token", s);
		}
	}
	for (int k = 0; k < NROLES; k++) {
		free(secret[k]);
		free(t[k].queued);
		free(t[k].ended);
	}
}

/* A user reaches only its own jobs (403 naming role and action on
 * another's); the owner is the token's name, the list's owner filter
 * finds it, and events name who canceled and who changed a job; the
 * daemon's log names who deleted one. */
static void test_owner_and_actor(void **state)
{
	const bertd *d = *state;
	char *alice = add_token(d, "alice", "user"), *bob = add_token(d, "bob", "user");
	char *a1 = submit_as(d, alice), *b1 = submit_as(d, bob);
	char path[128];

	json_t *j = it_get_json(d, (snprintf(path, sizeof path, "/v1/jobs/%s", a1), path));
	assert_string_equal(it_jstr(j, "owner"), "alice");
	json_decref(j);

	/* bob may not cancel, change or delete alice's job */
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", a1);
	http_resp r = call(d, bob, "POST", path, NULL);
	assert_forbidden(&r, "user", "cancel jobs");
	assert_non_null(strstr(it_jstr(r.json, "detail"), "alice"));
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s", a1);
	r = call(d, bob, "PATCH", path, "{\"priority\":9}");
	assert_forbidden(&r, "user", "change jobs");
	http_resp_free(&r);
	r = call(d, bob, "DELETE", path, NULL);
	assert_forbidden(&r, "user", "delete jobs");
	http_resp_free(&r);

	/* the list's owner filter: alice's jobs are hers alone */
	json_t *l = it_get_json(d, "/v1/jobs?owner=alice");
	json_t *jobs = json_object_get(l, "jobs");
	assert_int_equal(json_array_size(jobs), 1);
	assert_string_equal(it_jstr(json_array_get(jobs, 0), "id"), a1);
	json_decref(l);

	/* alice changes and cancels her job; the admin token "default"
	 * changes bob's: each event names its actor */
	assert_int_equal(status_of(d, alice, "PATCH", path, "{\"priority\":4}"), 200);
	cancel_as(d, alice, a1);
	json_t *ev = it_events_of(d, a1);
	assert_non_null(it_event_with(ev, "changed by alice:"));
	assert_non_null(it_event_with(ev, "canceled by alice"));
	json_decref(ev);
	snprintf(path, sizeof path, "/v1/jobs/%s", b1);
	assert_int_equal(status_of(d, d->token, "PATCH", path, "{\"priority\":2}"), 200);
	ev = it_events_of(d, b1);
	assert_non_null(it_event_with(ev, "changed by default:"));
	json_decref(ev);

	/* alice deletes her canceled job: the log keeps who did it */
	snprintf(path, sizeof path, "/v1/jobs/%s", a1);
	assert_int_equal(status_of(d, alice, "DELETE", path, NULL), 204);
	char logp[160], want[96];
	snprintf(logp, sizeof logp, "%s/bertd.log", d->root);
	snprintf(want, sizeof want, "job %s deleted by alice", a1);
	char *log = it_slurp(logp, NULL);
	assert_non_null(log);
	if (!strstr(log, want))
		fail_msg("the daemon's log lacks \"%s\"", want);
	free(log);
	free(alice);
	free(bob);
	free(a1);
	free(b1);
}

/* Runs `bertd token ARGS` on d's state dir; stdout into out (caller
 * frees, may be NULL); the exit status. */
static int token_cmd(const bertd *d, char **out, const char *args)
{
	char outp[160];
	snprintf(outp, sizeof outp, "%s/token-cmd.out", d->root);
	int rc = it_system("\"$BERTD_BIN\" token %s --config /dev/null --state-dir %s >%s 2>>%s/token-cmd.err",
			   args, d->state_dir, outp, d->root);
	if (out)
		*out = it_slurp(outp, NULL);
	return rc;
}

/* `bertd token add|list|revoke` beside the running daemon: the new
 * secret is printed once and works at once, with its role; the tokens
 * file is 0600 and holds no secret; a revoked token is refused by the
 * very next request; bad names, roles and repeats exit non-zero. */
static void test_token_command(void **state)
{
	const bertd *d = *state;
	char *secret = NULL, *list = NULL;
	assert_int_equal(token_cmd(d, &secret, "add carol --role reader"), 0);
	assert_non_null(secret);
	secret[strcspn(secret, "\n")] = 0;
	assert_int_equal(strlen(secret), 64);
	assert_int_equal(status_of(d, secret, "GET", "/v1/jobs", NULL), 200);
	char *spec = it_job_spec(NULL, "shakes", NULL);
	http_resp r = call(d, secret, "POST", "/v1/jobs", spec);
	assert_forbidden(&r, "reader", "submit jobs");
	http_resp_free(&r);
	free(spec);

	char tf[160];
	snprintf(tf, sizeof tf, "%s/tokens", d->state_dir);
	struct stat st;
	assert_int_equal(stat(tf, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	char *text = it_slurp(tf, NULL);
	assert_non_null(strstr(text, "carol reader "));
	assert_null(strstr(text, secret)); /* hashed, never the secret */
	free(text);

	assert_int_equal(token_cmd(d, &list, "list"), 0);
	assert_non_null(strstr(list, "carol"));
	assert_non_null(strstr(list, "reader"));
	assert_non_null(strstr(list, "default"));
	free(list);

	assert_int_equal(token_cmd(d, NULL, "add carol --role user"), 2);  /* exists */
	assert_int_equal(token_cmd(d, NULL, "add default --role user"), 2); /* reserved */
	assert_int_equal(token_cmd(d, NULL, "add 'bad/name' --role user"), 1);
	assert_int_equal(token_cmd(d, NULL, "add dave --role boss"), 1);
	assert_int_equal(token_cmd(d, NULL, "add dave"), 1);

	assert_int_equal(token_cmd(d, NULL, "revoke carol"), 0);
	assert_int_equal(status_of(d, secret, "GET", "/v1/jobs", NULL), 401);
	assert_int_equal(token_cmd(d, NULL, "revoke carol"), 2);
	assert_int_equal(token_cmd(d, &list, "list"), 0);
	assert_null(strstr(list, "carol"));
	free(list);
	free(secret);

	/* the API's view of the same file */
	json_t *l = it_get_json(d, "/v1/tokens");
	size_t i;
	json_t *e;
	bool saw_default = false;
	json_array_foreach(json_object_get(l, "tokens"), i, e) {
		assert_null(json_object_get(e, "secret"));
		assert_string_not_equal(it_jstr(e, "name"), "carol");
		if (!strcmp(it_jstr(e, "name"), "default")) {
			saw_default = true;
			assert_string_equal(it_jstr(e, "role"), "admin");
		}
	}
	assert_true(saw_default);
	json_decref(l);
}

/* Bad requests to POST /v1/tokens name their field; a name twice is 409;
 * an unknown name to revoke is 404; a token revoked through the API is
 * refused at once. */
static void test_token_api(void **state)
{
	const bertd *d = *state;
	static const struct {
		const char *body, *field;
		long status;
	} bad[] = {
		{"{\"name\":\"x y\",\"role\":\"user\"}", "name", 422},
		{"{\"name\":\"erin\",\"role\":\"root\"}", "role", 422},
		{"{\"name\":\"erin\"}", "role", 422},
		{"{\"name\":\"erin\",\"role\":\"user\",\"secret\":\"x\"}", "secret", 422},
		{"{\"name\":\"default\",\"role\":\"user\"}", "name", 409},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		http_resp r;
		assert_int_equal(http_post_json(d, "/v1/tokens", bad[i].body, &r), 0);
		if (r.status != bad[i].status)
			fail_msg("%s: %ld %s", bad[i].body, r.status, r.body);
		assert_string_equal(it_jstr(r.json, "field"), bad[i].field);
		http_resp_free(&r);
	}
	char *s = add_token(d, "erin", "admin");
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/tokens", "{\"name\":\"erin\",\"role\":\"user\"}", &r), 0);
	assert_int_equal(r.status, 409);
	http_resp_free(&r);
	assert_int_equal(status_of(d, s, "GET", "/v1/tokens", NULL), 200);
	assert_int_equal(status_of(d, s, "DELETE", "/v1/tokens/erin", NULL), 204); /* itself */
	assert_int_equal(status_of(d, s, "GET", "/v1/tokens", NULL), 401);
	assert_int_equal(status_of(d, d->token, "DELETE", "/v1/tokens/erin", NULL), 404);
	free(s);
}

/* The one job that runs: a user's running job is its own to stop (202,
 * "cancel requested by alice", and it ends "canceled by alice"), not another user's (403), on a daemon of
 * its own whose queue runs. */
static void test_cancel_running_job(void **state)
{
	(void)state;
	it_daemon_opts o = {.cpu_slots = "1", .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 400, .vocab_size = 200, .wait_ready = true};
	it_fx *f = it_daemon_start(&o, DEADLINE_S);
	assert_non_null(f);
	const bertd *d = &f->d;
	char *alice = add_token(d, "alice", "user"), *bob = add_token(d, "bob", "user");
	char *spec = it_job_spec(NULL, "shakes", "training_args.max_steps", "100000",
				 "training_args.save_steps", "100000", NULL);
	http_resp r = call(d, alice, "POST", "/v1/jobs", spec);
	assert_int_equal(r.status, 201);
	char *id = strdup(it_jstr(r.json, "id"));
	http_resp_free(&r);
	free(spec);
	json_decref(it_wait_job(d, id, "running", DEADLINE_S));

	char path[96];
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
	r = call(d, bob, "POST", path, NULL);
	assert_forbidden(&r, "user", "cancel jobs");
	http_resp_free(&r);
	r = call(d, alice, "POST", path, NULL);
	assert_int_equal(r.status, 202);
	http_resp_free(&r);
	json_t *ev = it_events_of(d, id);
	assert_non_null(it_event_with(ev, "cancel requested by alice"));
	json_decref(ev);
	json_t *j = it_wait_job(d, id, "canceled|completed|failed", DEADLINE_S);
	assert_string_equal(it_jstr(j, "state"), "canceled");
	assert_string_equal(it_jstr(j, "owner"), "alice");
	json_decref(j);
	/* the event that ends it, written by the daemon, names her too */
	ev = it_events_of(d, id);
	json_t *last = json_array_get(ev, json_array_size(ev) - 1);
	assert_string_equal(it_jstr(last, "to"), "canceled");
	assert_string_equal(it_jstr(last, "reason"), "canceled by alice");
	json_decref(ev);
	free(id);
	free(alice);
	free(bob);
	assert_int_equal(it_daemon_stop(f), 0);
}

/* Last (it revokes the fixture's own token): the token file's token is
 * the admin "default" until revoked; then it is refused at once, the file
 * is gone, and named admin tokens go on working. */
static void test_revoke_default(void **state)
{
	const bertd *d = *state;
	char *s = add_token(d, "frank", "admin");
	assert_int_equal(status_of(d, d->token, "GET", "/v1/jobs", NULL), 200);
	assert_int_equal(token_cmd(d, NULL, "revoke default"), 0);
	assert_int_equal(status_of(d, d->token, "GET", "/v1/jobs", NULL), 401);
	char tf[160];
	struct stat st;
	snprintf(tf, sizeof tf, "%s/token", d->state_dir);
	assert_int_not_equal(stat(tf, &st), 0);
	assert_int_equal(status_of(d, s, "GET", "/v1/tokens", NULL), 200);
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_route_every_role),
		cmocka_unit_test(test_owner_and_actor),
		cmocka_unit_test(test_token_command),
		cmocka_unit_test(test_token_api),
		cmocka_unit_test(test_cancel_running_job),
		cmocka_unit_test(test_revoke_default),
	};
	int rc = IT_RUN(tests, setup, it_teardown);
	json_decref(doc);
	return rc;
}
