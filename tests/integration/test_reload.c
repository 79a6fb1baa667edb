/* Reload (SIGHUP) and HTTPS: a changed configuration file takes effect in
 * the running daemon (body limit, token files); a bad one changes nothing
 * and the error names the key; a restart-only key is reported, not applied;
 * retention and the disk ceiling change GET /v1/system's "disk"; the
 * daemon serves HTTPS with a certificate made here (openssl), refuses
 * plain HTTP on that port cleanly, and serves a replaced certificate after
 * SIGHUP (a key that does not match is refused, the old pair kept).
 *
 * A reload while a job trains leaves its worker process alone.
 *
 * The reload's outcome is read from the daemon's log ("reload:
 * configuration reloaded" / "reload refused"), polled with a deadline. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define RELOADED "reload: configuration reloaded"
#define REFUSED "reload refused, nothing changed"

static int count_in_log(const bertd *d, const char *what)
{
	char path[160];
	snprintf(path, sizeof path, "%s/bertd.log", d->root);
	char *log = it_slurp(path, NULL);
	int n = 0;
	for (const char *p = log; p && (p = strstr(p, what)); p += strlen(what))
		n++;
	free(log);
	return n;
}

/* SIGHUP, then waits (at most 30 s) until the log has one more reloaded or
 * refused line than before; returns true when it was reloaded. */
static bool hup(const bertd *d)
{
	int ok0 = count_in_log(d, RELOADED), bad0 = count_in_log(d, REFUSED);
	assert_int_equal(kill(d->pid, SIGHUP), 0);
	for (int i = 0; i < 600; i++) {
		if (count_in_log(d, RELOADED) > ok0)
			return true;
		if (count_in_log(d, REFUSED) > bad0)
			return false;
		it_pause_ms(50);
	}
	bertd_print_log(d);
	fail_msg("no reload outcome in the log 30 s after SIGHUP");
	return false;
}

static void assert_log_has(const bertd *d, const char *what)
{
	if (count_in_log(d, what) == 0) {
		bertd_print_log(d);
		fail_msg("the daemon's log lacks \"%s\"", what);
	}
}

static it_fx *start_with_conf(const char *conf_text, char *conf, size_t cap)
{
	it_daemon_opts o = {.plain = true, .deferred = true};
	it_fx *f = it_daemon_start(&o, 30);
	assert_non_null(f);
	snprintf(conf, cap, "%s/bertd.conf", f->d.root);
	it_write_file(conf, conf_text);
	const char *extra[] = {"--config", conf, NULL};
	o.extra = extra;
	o.deferred = false;
	if (it_daemon_run(f, &o) != 0) {
		bertd_print_log(&f->d);
		fail_msg("bertd did not start with %s", conf_text);
	}
	return f;
}

/* POST /v1/jobs with a JSON body of n bytes (a spec padded with spaces). */
static long post_bytes(const bertd *d, size_t n)
{
	char *body = malloc(n + 1);
	assert_non_null(body);
	memset(body, ' ', n);
	memcpy(body, "{}", 2);
	body[n] = 0;
	http_resp r;
	assert_int_equal(http_do(d, "POST", "/v1/jobs", body, n, NULL, H_AUTH, &r), 0);
	long status = r.status;
	http_resp_free(&r);
	free(body);
	return status;
}

static long get_jobs(const bertd *d)
{
	http_resp r;
	assert_int_equal(http_get(d, "/v1/jobs", &r), 0);
	long status = r.status;
	http_resp_free(&r);
	return status;
}

static void test_reload_applies_and_refuses(void **state)
{
	(void)state;
	char conf[200], path[200];
	it_fx *f = start_with_conf("max_body_bytes = 2048\n", conf, sizeof conf);
	bertd *d = &f->d;
	assert_int_equal(post_bytes(d, 3000), 413);
	json_t *sys0 = it_get_json(d, "/v1/system"); /* no ceiling yet */
	assert_true(json_is_null(json_object_get(json_object_get(sys0, "disk"), "ceiling_bytes")));
	json_decref(sys0);

	/* a reloadable key: the limit is the new one at once */
	it_write_file(conf, "max_body_bytes = 1048576\n");
	assert_true(hup(d));
	assert_int_not_equal(post_bytes(d, 3000), 413);
	assert_log_has(d, "max_body_bytes changed");

	/* a bad file: nothing changes, the error names the key */
	it_write_file(conf, "max_body_bytes = 2048\nretention_interval_s = 0\n");
	assert_false(hup(d));
	assert_log_has(d, "retention_interval_s must be an integer in [1, 86400]");
	assert_int_equal(get_jobs(d), 200);
	assert_int_not_equal(post_bytes(d, 3000), 413); /* the old limit */

	/* fixed, with a restart-only key changed too: the token and the limit
	 * are applied, the port is reported and kept */
	json_t *sys;
	it_write_file(conf, "max_body_bytes = 4096\napi_threads = 2\nretention_checkpoint_days = 3\n"
			    "disk_ceiling_bytes = 123456789\n");
	assert_true(hup(d));
	assert_log_has(d, "reload: api_threads changed in the configuration but is read at start only");
	assert_int_equal(get_jobs(d), 200);
	assert_int_not_equal(post_bytes(d, 3000), 413);
	assert_int_equal(post_bytes(d, 5000), 413);
	/* the retention policy and the ceiling in force, as GET /v1/system shows them */
	sys = it_get_json(d, "/v1/system");
	json_t *disk = json_object_get(sys, "disk");
	assert_int_equal(json_integer_value(json_object_get(disk, "ceiling_bytes")), 123456789);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(disk, "retention"), "checkpoint_days")), 3);
	json_decref(sys);

	/* the token files are read again: a new token counts, the old one
	 * gets 401 */
	char old_token[256], new_token[] = "0123456789abcdef0123456789abcdef-reloaded-token";
	snprintf(old_token, sizeof old_token, "%s", d->token);
	snprintf(path, sizeof path, "%s/token", d->state_dir);
	it_write_file(path, new_token);
	assert_int_equal(chmod(path, 0600), 0);
	assert_true(hup(d));
	snprintf(d->token, sizeof d->token, "%s", new_token);
	assert_int_equal(get_jobs(d), 200);
	snprintf(d->token, sizeof d->token, "%s", old_token);
	assert_int_equal(get_jobs(d), 401);
	snprintf(d->token, sizeof d->token, "%s", new_token);
	assert_int_equal(it_daemon_stop(f), 0);
}

/* A CA and a server certificate for 127.0.0.1 signed by it, as
 * dir/NAME-ca.pem, dir/NAME.pem, dir/NAME.key. */
static void make_cert(const char *dir, const char *name)
{
	int rc = it_system(
		"cd '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
		"-keyout %s-ca.key -out %s-ca.pem -days 2 -subj '/CN=bertd test CA %s' 2>/dev/null && "
		"openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout %s.key "
		"-out %s.csr -subj /CN=localhost 2>/dev/null && "
		"printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' >%s.ext && "
		"openssl x509 -req -in %s.csr -CA %s-ca.pem -CAkey %s-ca.key -CAcreateserial -out %s.pem "
		"-days 2 -extfile %s.ext 2>/dev/null",
		dir, name, name, name, name, name, name, name, name, name, name, name);
	assert_int_equal(rc, 0);
}

/* curl's exit status for url with the CA file ca (NULL: none), the token
 * sent; 0 only for a 2xx answer. */
static int curl(const bertd *d, const char *ca, const char *url)
{
	char cacert[300] = "";
	if (ca)
		snprintf(cacert, sizeof cacert, "--cacert '%s'", ca);
	return it_system("curl -sS -f -o /dev/null -m 20 %s -H 'Authorization: Bearer %s' '%s' 2>>'%s/curl.err'",
			 cacert, d->token, url, d->root);
}

static void test_https_and_cert_reload(void **state)
{
	(void)state;
	if (it_system("command -v openssl >/dev/null && command -v curl >/dev/null") != 0) {
		fprintf(stderr, "openssl or curl missing: skip\n");
		skip();
	}
	char dir[] = "/tmp/bertd-tls-XXXXXX", conf_text[600], conf[200], url[200], cert[200], key[200];
	char ca_a[200], ca_b[200];
	assert_non_null(mkdtemp(dir));
	make_cert(dir, "a");
	make_cert(dir, "b");
	snprintf(cert, sizeof cert, "%s/server.pem", dir);
	snprintf(key, sizeof key, "%s/server.key", dir);
	snprintf(ca_a, sizeof ca_a, "%s/a-ca.pem", dir);
	snprintf(ca_b, sizeof ca_b, "%s/b-ca.pem", dir);
	assert_int_equal(it_system("cp '%s/a.pem' '%s' && cp '%s/a.key' '%s'", dir, cert, dir, key), 0);
	snprintf(conf_text, sizeof conf_text, "tls_cert = %s\ntls_key = %s\n", cert, key);
	it_fx *f = start_with_conf(conf_text, conf, sizeof conf);
	bertd *d = &f->d;
	assert_int_equal(strncmp(d->base_url, "https://", 8), 0);
	snprintf(url, sizeof url, "%s/v1/jobs", d->base_url);

	assert_int_equal(curl(d, ca_a, url), 0);
	assert_int_not_equal(curl(d, ca_b, url), 0); /* another CA's client refuses it */
	/* plain HTTP on the TLS port: the connection fails, the daemon serves on */
	char plain[200];
	snprintf(plain, sizeof plain, "http://%s/v1/jobs", d->base_url + 8);
	assert_int_not_equal(curl(d, NULL, plain), 0);
	assert_int_equal(curl(d, ca_a, url), 0);

	/* renewed files under the same names, then SIGHUP */
	assert_int_equal(it_system("cp '%s/b.pem' '%s' && cp '%s/b.key' '%s'", dir, cert, dir, key), 0);
	assert_true(hup(d));
	assert_int_equal(curl(d, ca_b, url), 0);
	assert_int_not_equal(curl(d, ca_a, url), 0);

	/* a key that is not the certificate's: refused, b still served */
	assert_int_equal(it_system("cp '%s/a.key' '%s'", dir, key), 0);
	assert_false(hup(d));
	assert_log_has(d, "the key does not belong to the certificate");
	assert_int_equal(curl(d, ca_b, url), 0);

	/* turning HTTPS off needs a restart */
	it_write_file(conf, "");
	assert_false(hup(d));
	assert_log_has(d, "tls_cert: turning HTTPS off needs a restart");
	assert_int_equal(curl(d, ca_b, url), 0);

	assert_int_equal(it_daemon_stop(f), 0);
	it_system("rm -rf '%s'", dir);
}

/* A reload while a job trains: the same worker process goes on stepping
 * and the job completes; the new token counts at once. */
static void test_reload_keeps_jobs_running(void **state)
{
	(void)state;
	char conf[] = "/tmp/bertd-reload-conf-XXXXXX", path[200];
	int fd = mkstemp(conf);
	assert_true(fd >= 0);
	close(fd);
	it_write_file(conf, "retention_interval_s = 600\n");
	const char *extra[] = {"--config", conf, NULL};
	it_daemon_opts o = {.cpu_slots = "1", .extra = extra, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 1000, .vocab_size = 300, .wait_ready = true};
	it_fx *f = it_daemon_start(&o, 180);
	assert_non_null(f);
	bertd *d = &f->d;
	char *spec = it_job_spec(NULL, "shakes", "training_args.max_steps", "150", NULL);
	char *id = it_submit(d, spec);
	free(spec);
	it_wait_step(d, id, 10, 180);
	pid_t before[4], after[4];
	int n = it_find_pids("bertd-worker", id, before, 4);
	assert_int_equal(n, 1);

	char new_token[] = "fedcba9876543210fedcba9876543210-while-training";
	snprintf(path, sizeof path, "%s/token", d->state_dir);
	it_write_file(path, new_token);
	assert_int_equal(chmod(path, 0600), 0);
	it_write_file(conf, "retention_interval_s = 300\nstall_timeout_s = 600\n");
	assert_true(hup(d));
	snprintf(d->token, sizeof d->token, "%s", new_token);
	json_t *job = it_get_json(d, "/v1/jobs");
	json_decref(job);
	assert_int_equal(it_find_pids("bertd-worker", id, after, 4), 1);
	assert_int_equal(after[0], before[0]); /* the same worker: nothing restarted */

	job = it_wait_job(d, id, "completed|failed|canceled", 300);
	it_assert_completed(d, job);
	json_decref(job);
	assert_int_equal(count_in_log(d, "daemon restarted"), 0);
	free(id);
	unlink(conf);
	assert_int_equal(it_daemon_stop(f), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reload_applies_and_refuses),
		cmocka_unit_test(test_https_and_cert_reload),
		cmocka_unit_test(test_reload_keeps_jobs_running),
	};
	return IT_RUN(tests, NULL, NULL);
}
