/* The dashboard (api/ui/dashboard.html) in headless Chromium against a real
 * daemon holding 150 jobs: a CPU job training (with held-out evaluation
 * asked for), a failed one, and 148 queued-then-canceled fillers.
 *
 * Chromium runs the page's script (--dump-dom after a virtual-time budget
 * of two refreshes) and the test reads what the page shows from the DOM:
 * the numbers sit, unrounded, in data-value attributes next to the text,
 * and are compared with GET /v1/jobs/{id}/metrics; the jobs table must be
 * the newest page (newest first), the loss axis fitted to the data (not
 * from 0) and ticked, the eval_loss points those of the rows that have the
 * key, the second refresh must ask only for new rows (since_step), a
 * failed job's reason shown. What a dump cannot show is driven over the
 * DevTools protocol (--remote-debugging-pipe, no Node): paging with the
 * older/newer buttons, values on hover, and the cancel button, which ends
 * the live job. Mid-job and at the end a screenshot goes to
 * $BERTD_ARTIFACT_DIR (meson's log dir). The page writes nothing to the
 * console, so any console line in Chromium's log or event on the protocol
 * (an uncaught error, a CSP refusal, a failed load) fails the test.
 * Exits 77 (skipped) when no Chromium is installed. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 180
#define FILLERS 148
#define PAGE_SIZE 25 /* the page's PAGE_SIZE */

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

static size_t count(const char *from, const char *to, const char *needle)
{
	size_t n = 0;
	for (const char *p = from; (p = strstr(p, needle)) && (!to || p < to); p += strlen(needle))
		n++;
	return n;
}

/* Fails the test when Chromium's log has a console line: the page logs
 * nothing itself, so each is an error (uncaught exception, CSP refusal,
 * failed fetch). */
static void assert_quiet(const char *log_path)
{
	char *log = it_slurp(log_path, NULL);
	assert_non_null(log);
	for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
		if (strstr(line, ":CONSOLE") || strstr(line, "Uncaught") || strstr(line, "Refused to"))
			fail_msg("console output from the page: %s", line);
	free(log);
}

/* Loads the dashboard at #token=..&job=job twice in headless Chromium: once
 * to dump the DOM after its script ran (returned, caller frees), once for a
 * screenshot at artifact dir/shot. */
static char *load_page(const bertd *d, const char *job, const char *shot, int n)
{
	const char *art = getenv("BERTD_ARTIFACT_DIR");
	char dom[160], log[160], shotpath[512], cmd[4096];
	snprintf(dom, sizeof dom, "%s/dom%d.html", d->root, n);
	snprintf(log, sizeof log, "%s/chromium%d.log", d->root, n);
	snprintf(shotpath, sizeof shotpath, "%s/%s", art ? art : d->root, shot);
	/* 12 s of virtual time: the first pass and two refreshes (every 5 s) */
	const char *flags = "--headless --no-sandbox --disable-gpu --no-first-run --disable-extensions "
			    "--enable-logging=stderr --v=0 --virtual-time-budget=12000 --window-size=1500,1500";
	snprintf(cmd, sizeof cmd,
		 "timeout 120 '%s' %s --user-data-dir='%s/chrome%d' --dump-dom '%s/#token=%s&job=%s' >'%s' 2>'%s'",
		 chromium, flags, d->root, n, d->base_url, d->token, job, dom, log);
	assert_int_equal(system(cmd), 0);
	assert_quiet(log);
	snprintf(cmd, sizeof cmd,
		 "timeout 120 '%s' %s --user-data-dir='%s/chrome%ds' --screenshot='%s' '%s/#token=%s&job=%s' 2>'%s.shot'",
		 chromium, flags, d->root, n, shotpath, d->base_url, d->token, job, log);
	assert_int_equal(system(cmd), 0);
	char log2[200];
	snprintf(log2, sizeof log2, "%s.shot", log);
	assert_quiet(log2);
	struct stat st;
	assert_int_equal(stat(shotpath, &st), 0);
	assert_true(st.st_size > 1000);
	fprintf(stderr, "screenshot: %s\n", shotpath);
	char *html = it_slurp(dom, NULL);
	assert_non_null(html);
	return html;
}

/* The metrics row with step step, or NULL. */
static json_t *row_at(json_t *rows, long step)
{
	size_t i;
	json_t *r;
	json_array_foreach(rows, i, r) if (json_integer_value(json_object_get(r, "step")) == step) return r;
	return NULL;
}

/* ---- Chromium driven over the DevTools protocol (--remote-debugging-pipe:
 * NUL-terminated JSON messages, commands on fd 3, answers and events on
 * fd 4), for what a DOM dump cannot do: point at a chart, click cancel and
 * accept its confirmation. */
typedef struct cdp {
	pid_t pid;
	int to, from;
	int id;
	char *buf; /* bytes read, not yet split into messages */
	size_t len, cap;
	char session[128];
	char console[1024]; /* the first console message or exception, "" if none */
} cdp;

static void cdp_start(cdp *c, const bertd *d)
{
	memset(c, 0, sizeof *c);
	int in[2], out[2];
	assert_int_equal(pipe(in), 0);
	assert_int_equal(pipe(out), 0);
	char udir[160], log[160];
	snprintf(udir, sizeof udir, "--user-data-dir=%s/chrome-cdp", d->root);
	snprintf(log, sizeof log, "%s/chromium-cdp.log", d->root);
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0 || dup2(in[0], 3) < 0 || dup2(out[1], 4) < 0)
			_exit(127);
		execl(chromium, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		      "--disable-extensions", "--remote-debugging-pipe", "--window-size=1500,1500", udir,
		      "about:blank", (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	c->to = in[1];
	c->from = out[0];
}

static void cdp_send(cdp *c, int id, const char *method, json_t *params, bool in_session)
{
	json_t *m = json_pack("{s:i, s:s, s:o}", "id", id, "method", method, "params", params ? params : json_object());
	if (in_session)
		json_object_set_new(m, "sessionId", json_string(c->session));
	char *text = json_dumps(m, JSON_COMPACT);
	json_decref(m);
	size_t n = strlen(text) + 1; /* with its NUL */
	for (size_t off = 0; off < n;) {
		ssize_t w = write(c->to, text + off, n - off);
		assert_true(w > 0);
		off += (size_t)w;
	}
	free(text);
}

/* The next message (caller decrefs); fails the test after 60 s without one. */
static json_t *cdp_next(cdp *c)
{
	for (;;) {
		char *nul = c->len ? memchr(c->buf, 0, c->len) : NULL;
		if (nul) {
			json_t *m = json_loads(c->buf, 0, NULL);
			size_t used = (size_t)(nul - c->buf) + 1;
			memmove(c->buf, nul + 1, c->len - used);
			c->len -= used;
			assert_non_null(m);
			return m;
		}
		struct pollfd p = {.fd = c->from, .events = POLLIN};
		if (poll(&p, 1, 60000) != 1)
			fail_msg("chromium said nothing for 60 s");
		if (c->cap - c->len < 65536) {
			c->cap = c->cap * 2 + 65536;
			c->buf = realloc(c->buf, c->cap);
			assert_non_null(c->buf);
		}
		ssize_t r = read(c->from, c->buf + c->len, c->cap - c->len);
		if (r <= 0)
			fail_msg("chromium closed its pipe");
		c->len += (size_t)r;
	}
}

/* Sends method and waits for its answer, handling events meanwhile: console
 * messages, log entries (failed loads, CSP refusals) and exceptions are
 * remembered, a dialog (the page's confirm())
 * is accepted. Returns the result (caller decrefs); fails on an error. */
static json_t *cdp_call(cdp *c, const char *method, json_t *params, bool in_session)
{
	int id = ++c->id;
	cdp_send(c, id, method, params, in_session);
	for (;;) {
		json_t *m = cdp_next(c);
		const char *ev = json_string_value(json_object_get(m, "method"));
		if (ev && (!strcmp(ev, "Runtime.consoleAPICalled") || !strcmp(ev, "Runtime.exceptionThrown") ||
			   !strcmp(ev, "Log.entryAdded")) &&
		    !c->console[0]) {
			char *t = json_dumps(json_object_get(m, "params"), JSON_COMPACT);
			snprintf(c->console, sizeof c->console, "%s: %s", ev, t);
			free(t);
		} else if (ev && !strcmp(ev, "Page.javascriptDialogOpening")) {
			cdp_send(c, ++c->id, "Page.handleJavaScriptDialog", json_pack("{s:b}", "accept", 1), true);
		} else if (json_integer_value(json_object_get(m, "id")) == id) {
			if (json_object_get(m, "error")) {
				char *t = json_dumps(m, JSON_COMPACT);
				fail_msg("%s: %s", method, t);
			}
			json_t *r = json_incref(json_object_get(m, "result"));
			json_decref(m);
			return r;
		}
		json_decref(m);
	}
}

/* The value of expression expr in the page, returned by value (caller decrefs). */
static json_t *cdp_eval(cdp *c, const char *expr)
{
	json_t *r = cdp_call(c, "Runtime.evaluate",
			     json_pack("{s:s, s:b, s:b}", "expression", expr, "returnByValue", 1, "awaitPromise", 1), true);
	json_t *v = json_incref(json_object_get(json_object_get(r, "result"), "value"));
	if (json_object_get(r, "exceptionDetails"))
		fail_msg("evaluating %s threw", expr);
	json_decref(r);
	return v ? v : json_null();
}

/* Polls expr (every 100 ms, at most deadline_s) until it is true. */
static void cdp_wait(cdp *c, const char *expr, int deadline_s)
{
	for (int i = 0; i < deadline_s * 10; i++) {
		json_t *v = cdp_eval(c, expr);
		bool ok = json_is_true(v);
		json_decref(v);
		if (ok)
			return;
		it_pause_ms(100);
	}
	fail_msg("the page never made true: %s", expr);
}

static void cdp_stop(cdp *c)
{
	close(c->to);
	close(c->from);
	kill(c->pid, SIGTERM);
	waitpid(c->pid, NULL, 0);
	free(c->buf);
}

/* The ids in the page's jobs table, in order, equal ids[from], ids[from - 1], ... */
static void check_table_rows(cdp *c, char **ids, size_t from)
{
	json_t *got = cdp_eval(c, "[...document.querySelectorAll('#jobs tbody tr')].map(tr => tr.dataset.id)");
	assert_int_equal(json_array_size(got), PAGE_SIZE);
	for (size_t k = 0; k < PAGE_SIZE; k++)
		if (strcmp(json_string_value(json_array_get(got, k)), ids[from - k]) != 0)
			fail_msg("row %zu of the page is %s, want %s", k, json_string_value(json_array_get(got, k)),
				 ids[from - k]);
	json_decref(got);
}

/* In a real browser session on the live job: the older/newer buttons page
 * through the list, hovering over the loss chart shows the values at a
 * logged step, and the page's cancel button (its confirmation accepted)
 * cancels the job. */
static void check_in_browser(const bertd *d, const char *live, char **ids, size_t n)
{
	cdp c;
	cdp_start(&c, d);
	json_t *r = cdp_call(&c, "Target.createTarget", json_pack("{s:s}", "url", "about:blank"), false);
	json_t *a = cdp_call(&c, "Target.attachToTarget",
			     json_pack("{s:O, s:b}", "targetId", json_object_get(r, "targetId"), "flatten", 1), false);
	snprintf(c.session, sizeof c.session, "%s", it_jstr(a, "sessionId"));
	json_decref(r);
	json_decref(a);
	json_decref(cdp_call(&c, "Runtime.enable", NULL, true));
	json_decref(cdp_call(&c, "Page.enable", NULL, true));
	json_decref(cdp_call(&c, "Log.enable", NULL, true)); /* failed loads, CSP refusals */
	char url[512];
	snprintf(url, sizeof url, "%s/#token=%s&job=%s", d->base_url, d->token, live);
	json_decref(cdp_call(&c, "Page.navigate", json_pack("{s:s}", "url", url), true));
	cdp_wait(&c, "!!document.querySelector('#c-loss path.series') && "
		     "document.getElementById('s-loss').getAttribute('data-step') !== ''", 60);

	/* paging: the second page holds the 25 next older jobs, then back */
	check_table_rows(&c, ids, n - 1);
	json_decref(cdp_eval(&c, "document.getElementById('older').click(), true"));
	cdp_wait(&c, "document.getElementById('page').dataset.page === '2' && "
		     "document.querySelector('#jobs tbody tr').dataset.id !== '' && !document.getElementById('newer').disabled",
		 60);
	check_table_rows(&c, ids, n - 1 - PAGE_SIZE);
	json_decref(cdp_eval(&c, "document.getElementById('newer').click(), true"));
	cdp_wait(&c, "document.getElementById('page').dataset.page === '1' && document.getElementById('newer').disabled", 60);
	check_table_rows(&c, ids, n - 1);

	/* hover over the middle of the loss chart's plot */
	json_t *box = cdp_eval(&c, "(() => { const r = document.getElementById('c-loss').getBoundingClientRect();"
				   " return [r.left + r.width / 2, r.top + r.height / 2]; })()");
	json_decref(cdp_call(&c, "Input.dispatchMouseEvent",
			     json_pack("{s:s, s:f, s:f}", "type", "mouseMoved", "x",
				       json_number_value(json_array_get(box, 0)), "y",
				       json_number_value(json_array_get(box, 1))),
			     true));
	json_decref(box);
	json_t *tip = cdp_eval(&c, "(() => { const t = document.querySelector('#c-loss').parentNode.querySelector('.tip');"
				   " return t && !t.hidden ? t.textContent : ''; })()");
	long step = -1;
	const char *tt = json_string_value(tip);
	if (!tt || sscanf(tt, "step %ld", &step) != 1 || !strstr(tt, "\nloss: "))
		fail_msg("no values on hover: '%s'", tt ? tt : "(null)");
	json_t *rows = it_metrics_of(d, live);
	if (!row_at(rows, step))
		fail_msg("hover shows step %ld, which the API does not have", step);
	fprintf(stderr, "hover: %s\n", tt);
	json_decref(rows);
	json_decref(tip);

	/* cancel from the page */
	json_decref(cdp_eval(&c, "document.getElementById('cancel').click(), true"));
	cdp_wait(&c, "['stopping', 'canceled'].includes(document.getElementById('s-state').textContent)", 30);
	json_t *job = it_wait_job(d, live, "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(job, "state"), "canceled");
	json_decref(job);
	json_t *err = cdp_eval(&c, "document.getElementById('err').textContent");
	assert_string_equal(json_string_value(err), "");
	json_decref(err);
	if (c.console[0])
		fail_msg("console output from the page: %s", c.console);
	cdp_stop(&c);
}

/* The value of attribute attr of the element whose start tag contains
 * marker (e.g. id="s-loss"), into buf; NULL when there is no such element
 * or attribute. */
static const char *attr_of(const char *html, const char *marker, const char *attr, char *buf, size_t n)
{
	const char *m = strstr(html, marker);
	if (!m)
		return NULL;
	const char *start = m;
	while (start > html && *start != '<')
		start--;
	const char *end = strchr(m, '>');
	char key[64];
	snprintf(key, sizeof key, " %s=\"", attr);
	const char *a = strstr(start, key);
	if (!a || !end || a > end)
		return NULL;
	a += strlen(key);
	const char *q = strchr(a, '"');
	snprintf(buf, n, "%.*s", (int)(q - a), a);
	return buf;
}

static double num_attr(const char *html, const char *marker, const char *attr)
{
	char buf[128];
	if (!attr_of(html, marker, attr, buf, sizeof buf) || !buf[0])
		fail_msg("no %s on the element with %s", attr, marker);
	char *end;
	double v = strtod(buf, &end);
	if (*end)
		fail_msg("%s of %s is not a number: '%s'", attr, marker, buf);
	return v;
}

/* What the page says of the job equals the API's metrics: the stats are
 * the row at the step they name (the newest the page had read), the loss
 * chart has every row up to it, its y axis is fitted (above 0, around the
 * data) with ticks, eval points are the rows with eval_loss. */
static void check_numbers(const bertd *d, const char *id, const char *html, bool final)
{
	json_t *rows = it_metrics_of(d, id);
	long step = (long)num_attr(html, "id=\"s-loss\"", "data-step");
	json_t *row = row_at(rows, step);
	if (!row)
		fail_msg("the page shows step %ld, which the API does not have", step);
	if (final)
		assert_int_equal(step, json_integer_value(json_object_get(json_array_get(rows, json_array_size(rows) - 1), "step")));
	static const struct {
		const char *marker, *key;
	} stats[] = {{"id=\"s-loss\"", "loss"}, {"id=\"s-lr\"", "learning_rate"}, {"id=\"s-tps\"", "tokens_per_s"}};
	for (size_t i = 0; i < sizeof stats / sizeof stats[0]; i++) {
		double shown = num_attr(html, stats[i].marker, "data-value");
		double api = json_number_value(json_object_get(row, stats[i].key));
		if (shown != api)
			fail_msg("%s: page %.17g, API %.17g (step %ld)", stats[i].key, shown, api, step);
		assert_int_equal((long)num_attr(html, stats[i].marker, "data-step"), step);
	}
	/* the curves: every row up to the newest step shown (an evaluation may
	 * have a row of its own, without loss, after the newest loss) */
	long horizon = step;
	char got[96];
	if (attr_of(html, "id=\"s-eval-loss\"", "data-step", got, sizeof got) && got[0] && atol(got) > horizon)
		horizon = atol(got);
	size_t upto = 0, evals = 0;
	double lo = INFINITY, hi = -INFINITY;
	long last_eval = -1;
	double last_eval_loss = 0;
	size_t i;
	json_t *r;
	json_array_foreach(rows, i, r) {
		long s = (long)json_integer_value(json_object_get(r, "step"));
		if (s > horizon)
			continue;
		if (json_object_get(r, "loss")) {
			upto++;
			double l = json_number_value(json_object_get(r, "loss"));
			lo = fmin(lo, l);
			hi = fmax(hi, l);
		}
		if (json_object_get(r, "eval_loss")) {
			evals++;
			last_eval = s;
			last_eval_loss = json_number_value(json_object_get(r, "eval_loss"));
			lo = fmin(lo, last_eval_loss);
			hi = fmax(hi, last_eval_loss);
		}
	}
	assert_true(upto >= 3);
	assert_int_equal((size_t)num_attr(html, "data-name=\"loss\"", "data-points"), upto);
	char want[96];
	snprintf(want, sizeof want, "%ld,", step);
	assert_non_null(attr_of(html, "data-name=\"loss\"", "data-last", got, sizeof got));
	assert_true(strncmp(got, want, strlen(want)) == 0);
	double y0 = num_attr(html, "id=\"c-loss\"", "data-y0"), y1 = num_attr(html, "id=\"c-loss\"", "data-y1");
	if (!(y0 > 0 && y0 <= lo && y1 >= hi && y1 - y0 < hi))
		fail_msg("loss axis [%g, %g] is not fitted to losses in [%g, %g]", y0, y1, lo, hi);
	const char *svg = strstr(html, "id=\"c-loss\""), *svg_end = strstr(svg, "</svg>");
	assert_true(count(svg, svg_end, "class=\"ytick\"") >= 3);
	assert_true(count(svg, svg_end, "class=\"xtick\"") >= 2);
	/* eval: drawn exactly when rows have eval_loss */
	if (evals) {
		assert_int_equal((size_t)num_attr(html, "data-name=\"eval_loss\"", "data-points"), evals);
		assert_true(num_attr(html, "id=\"s-eval-loss\"", "data-value") == last_eval_loss);
		assert_int_equal((long)num_attr(html, "id=\"s-eval-loss\"", "data-step"), last_eval);
	} else {
		assert_null(strstr(html, "data-name=\"eval_loss\""));
		assert_non_null(attr_of(html, "id=\"s-eval-loss\"", "data-value", got, sizeof got));
		assert_string_equal(got, "");
	}
	fprintf(stderr, "page at step %ld: %zu loss points, %zu eval points, loss axis [%g, %g]\n", step, upto,
		evals, y0, y1);
	json_decref(rows);
}

/* The jobs table holds the newest PAGE_SIZE jobs, newest first. */
static void check_jobs_table(const char *html, char **ids, size_t n)
{
	const char *tb = strstr(html, "<table id=\"jobs\">");
	assert_non_null(tb);
	const char *end = strstr(tb, "</table>");
	size_t k = 0;
	for (const char *p = tb; (p = strstr(p, "<tr class=\"job")) && p < end; p++, k++) {
		char id[64];
		assert_non_null(attr_of(p, "<tr class=\"job", "data-id", id, sizeof id));
		if (k >= PAGE_SIZE || strcmp(id, ids[n - 1 - k]) != 0)
			fail_msg("jobs table row %zu is %s, want %s (the newest first)", k, id,
				 k < PAGE_SIZE ? ids[n - 1 - k] : "no row");
	}
	assert_int_equal(k, PAGE_SIZE);
	char buf[32];
	assert_false(strstr(html, "id=\"older\" disabled")); /* more pages */
	assert_non_null(attr_of(html, "id=\"page\"", "data-page", buf, sizeof buf));
	assert_string_equal(buf, "1");
}

/* GET /v1/jobs?order=desc pages through every job, newest first. */
static void check_list_desc(const bertd *d, char **ids, size_t n)
{
	char path[160] = "/v1/jobs?order=desc&limit=40";
	size_t k = 0;
	for (;;) {
		json_t *page = it_get_json(d, path);
		size_t i;
		json_t *j;
		json_array_foreach(json_object_get(page, "jobs"), i, j) {
			assert_true(k < n);
			assert_string_equal(it_jstr(j, "id"), ids[n - 1 - k]);
			k++;
		}
		json_t *c = json_object_get(page, "next_cursor");
		if (json_is_null(c)) {
			json_decref(page);
			break;
		}
		snprintf(path, sizeof path, "/v1/jobs?order=desc&limit=40&cursor=%s", json_string_value(c));
		json_decref(page);
	}
	assert_int_equal(k, n);
	http_resp r;
	assert_int_equal(http_get(d, "/v1/jobs?order=newest", &r), 0);
	assert_int_equal(r.status, 400);
	http_resp_free(&r);
}

/* The tiny job name on shakes that runs until stopped (logging every 10
 * steps, no checkpoint, the default learning rate without warm-up, no seed,
 * no resources), with eval_strategy, eval_steps and retry_policy (JSON
 * text; "null": none); caller frees. */
static char *endless_spec(const char *name, const char *eval_strategy, const char *eval_steps, const char *retry)
{
	return it_job_spec(name, "shakes", "training_args.max_steps", "1000000", "training_args.logging_steps", "10",
			   "training_args.save_steps", "1000000", "training_args.seed", "null",
			   "training_args.learning_rate", "null", "training_args.warmup_steps", "null",
			   "training_args.eval_strategy", eval_strategy, "training_args.eval_steps", eval_steps,
			   "resources", "null", "retry_policy", retry, NULL);
}

static void test_dashboard_150_jobs(void **state)
{
	(void)state;
	it_daemon_opts o = {.cpu_slots = "1", .dataset = "shakes", .corpus = "shakes.txt", .corpus_lines = 1000,
			    .vocab_size = 300, .wait_ready = true};
	it_fx *f = it_daemon_start(&o, DEADLINE_S);
	assert_non_null(f);
	bertd *d = &f->d;

	char *ids[FILLERS + 2];
	size_t n = 0;
	/* a job that fails: its worker is killed and it may not restart */
	char *spec = endless_spec("killed", "null", "null", "{\"max_restarts\":0}");
	ids[n++] = it_submit(d, spec);
	free(spec);
	it_wait_step(d, ids[0], 20, DEADLINE_S);
	pid_t worker;
	assert_int_equal(it_find_pids("bertd-worker", ids[0], &worker, 1), 1);
	assert_int_equal(kill(worker, SIGKILL), 0);
	json_t *failed = it_wait_job(d, ids[0], "completed|failed|canceled", DEADLINE_S);
	assert_string_equal(it_jstr(failed, "state"), "failed");
	char *reason = strdup(it_jstr(failed, "failure_reason"));
	json_decref(failed);
	/* the training job, evaluating every 20 steps (where this build has
	 * held-out evaluation); it runs until canceled */
	http_resp r;
	spec = endless_spec("live", "\"steps\"", "20", "null");
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status == 422 && strcmp(it_jstr(r.json, "field"), "training_args.eval_strategy") == 0) {
		fprintf(stderr, "this build has no eval_strategy: the live job does not evaluate\n");
		http_resp_free(&r);
		spec = endless_spec("live", "null", "null", "null");
		assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
		free(spec);
	}
	if (r.status != 201)
		fail_msg("submit: %ld %s", r.status, r.body);
	ids[n++] = strdup(it_jstr(r.json, "id"));
	http_resp_free(&r);
	const char *live = ids[1];
	it_wait_step(d, live, 60, DEADLINE_S);
	/* fillers: queued behind the live job on the one CPU slot, then canceled */
	for (int i = 0; i < FILLERS; i++) {
		char name[32], path[96];
		snprintf(name, sizeof name, "filler-%03d", i);
		spec = it_job_spec(name, "shakes", "model", "null", "training_args", "{\"max_steps\":5}", "resources",
				   "null", NULL);
		ids[n] = it_submit(d, spec);
		free(spec);
		snprintf(path, sizeof path, "/v1/jobs/%s/cancel", ids[n]);
		assert_int_equal(http_post_json(d, path, "", &r), 0);
		if (r.status != 200)
			fail_msg("cancel %s: %ld %s", ids[n], r.status, r.body);
		http_resp_free(&r);
		n++;
	}
	check_list_desc(d, ids, n);

	/* mid-job */
	char *html = load_page(d, live, "dashboard-mid.png", 1);
	check_jobs_table(html, ids, n);
	char buf[256];
	assert_non_null(attr_of(html, "id=\"s-state\"", "class", buf, sizeof buf));
	assert_string_equal(buf, "v st-running");
	assert_null(strstr(html, "id=\"cancel\" hidden"));     /* a live job can be canceled */
	assert_true(strstr(html, "id=\"failure\" class=\"failure\" hidden") != NULL);
	assert_true(num_attr(html, "id=\"s-eta\"", "data-value") >= 0);
	/* the refreshes asked only for steps after those already read */
	assert_true(num_attr(html, "id=\"detail\"", "data-metrics-since") >= 0);
	check_numbers(d, live, html, false);
	assert_non_null(strstr(html, "data-name=\"data_wait\""));
	assert_non_null(strstr(html, "data-name=\"compute\""));
	assert_non_null(strstr(html, "data-name=\"learning_rate\""));
	assert_non_null(strstr(html, "data-name=\"tokens/s\""));
	/* no GPU on this job: the utilization chart says so instead of drawing */
	const char *util = strstr(html, "id=\"c-util\"");
	assert_non_null(util);
	assert_true(strstr(util, "no data") < strstr(util, "</svg>"));
	assert_null(strstr(html, "HTTP 4"));
	free(html);

	/* the end: canceled from the page, every row shown */
	check_in_browser(d, live, ids, n);
	html = load_page(d, live, "dashboard-end.png", 2);
	check_jobs_table(html, ids, n);
	assert_non_null(attr_of(html, "id=\"s-state\"", "class", buf, sizeof buf));
	assert_string_equal(buf, "v st-canceled");
	assert_non_null(strstr(html, "id=\"cancel\" hidden"));
	assert_non_null(attr_of(html, "id=\"s-eta\"", "data-value", buf, sizeof buf));
	assert_string_equal(buf, "");
	check_numbers(d, live, html, true);
	free(html);

	/* the failed job: its reason, not "no telemetry yet" */
	html = load_page(d, ids[0], "dashboard-failed.png", 3);
	assert_non_null(attr_of(html, "id=\"s-state\"", "class", buf, sizeof buf));
	assert_string_equal(buf, "v st-failed");
	assert_null(strstr(html, "id=\"failure\" class=\"failure\" hidden"));
	const char *box = strstr(html, "id=\"failure\" class=\"failure\">failed: ");
	assert_non_null(box);
	size_t plain = strcspn(reason, "&<>\"");
	assert_true(plain >= 20);
	assert_true(strncmp(strchr(box, '>') + strlen(">failed: "), reason, plain) == 0);
	free(html);

	free(reason);
	for (size_t i = 0; i < n; i++)
		free(ids[i]);
	assert_int_equal(it_daemon_stop(f), 0);
}

int main(void)
{
	if (!find_chromium()) {
		fprintf(stderr, "no chromium: skipped\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dashboard_150_jobs),
	};
	return IT_RUN(tests, NULL, NULL);
}
