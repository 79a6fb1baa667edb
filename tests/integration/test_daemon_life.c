/* Daemon life: one bertd per state dir (a second one is refused and touches
 * nothing of the first's), and the daemon log (stamped lines when stderr is
 * not the journal, one line per job state change). */
#include <errno.h>
#include <regex.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

/* Runs a second bertd on d's state dir by hand (bertd_start would unlink
 * the first one's bertd.addr before starting it). Waits at most 10 s for it
 * to exit; one still running then is the bug: it is stopped and the test
 * fails. Returns its wait status; its stderr goes to log_path. */
static int run_second(const bertd *d, const char *log_path)
{
	const char *args[] = {"--state-dir", d->state_dir, "--port", "0", "--listen", "127.0.0.1",
			      "--config", "/dev/null", "--schedule", "false", NULL};
	return it_run_bertd_to_exit(args, log_path, 10);
}

static void test_second_daemon_refused(void **state)
{
	bertd *d = *state;
	char path[160], log_path[160], addr_before[256], token_before[256];
	snprintf(path, sizeof path, "%s/bertd.addr", d->state_dir);
	char *a = it_slurp(path, NULL);
	assert_non_null(a);
	snprintf(addr_before, sizeof addr_before, "%s", a);
	free(a);
	snprintf(path, sizeof path, "%s/token", d->state_dir);
	a = it_slurp(path, NULL);
	assert_non_null(a);
	snprintf(token_before, sizeof token_before, "%s", a);
	free(a);

	snprintf(log_path, sizeof log_path, "%s/second.log", d->root);
	int st = run_second(d, log_path);
	char *log = it_slurp(log_path, NULL);
	assert_non_null(log);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 0)
		fail_msg("second bertd: status 0x%x, want a non-zero exit:\n%s", st, log);
	char want[256];
	snprintf(want, sizeof want, "state_dir %s is in use by another bertd (pid %ld", d->state_dir,
		 (long)d->pid);
	if (!strstr(log, want))
		fail_msg("second bertd's log lacks '%s':\n%s", want, log);
	free(log);

	/* Nothing of the first's was touched, and it still answers. */
	snprintf(path, sizeof path, "%s/bertd.addr", d->state_dir);
	a = it_slurp(path, NULL);
	assert_non_null(a);
	assert_string_equal(a, addr_before);
	free(a);
	snprintf(path, sizeof path, "%s/token", d->state_dir);
	a = it_slurp(path, NULL);
	assert_non_null(a);
	assert_string_equal(a, token_before);
	free(a);
	http_resp r;
	assert_int_equal(http_do(d, "GET", "/v1/healthz", NULL, 0, NULL, H_NO_AUTH, &r), 0);
	assert_int_equal(r.status, 200);
	http_resp_free(&r);
	assert_int_equal(http_get(d, "/v1/jobs", &r), 0);
	assert_int_equal(r.status, 200);
	http_resp_free(&r);
}

static char *submit_job(bertd *d)
{
	/* a name and a dataset only: the daemon's defaults for the rest */
	char *spec = it_job_spec("life", "life", "model", "null", "training_args", "null", "resources", "null", NULL);
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
	long status = r.status;
	http_resp_free(&r);
	if (status == 422) {
		/* This bertd wants the dataset to exist: make a small one. */
		char data[160];
		snprintf(data, sizeof data, "%s/data", d->state_dir);
		mkdir(data, 0750);
		it_make_corpus(data, "life.txt", 300);
		assert_int_equal(it_add_dataset(d, "{\"name\":\"life\",\"source\":\"life.txt\","
						   "\"vocab\":{\"train\":{\"vocab_size\":200}}}"),
				 0);
		it_wait_dataset_ready(d, "life", 120);
	}
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

/* The line of log holding needle; fails the test when there is none. */
static void assert_stamped_line(const bertd *d, const char *log, const char *needle)
{
	const char *hit = strstr(log, needle);
	if (!hit) {
		bertd_print_log(d);
		fail_msg("daemon log lacks '%s'", needle);
	}
	const char *bol = hit;
	while (bol > log && bol[-1] != '\n')
		bol--;
	regex_t re;
	assert_int_equal(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z INFO  bertd: ",
				 REG_EXTENDED | REG_NOSUB),
			 0);
	int m = regexec(&re, bol, 0, NULL, 0);
	regfree(&re);
	if (m != 0)
		fail_msg("log line is not stamped: '%.*s'", (int)(strchr(hit, '\n') ? strchr(hit, '\n') - bol : 80), bol);
}

static void test_state_changes_logged(void **state)
{
	bertd *d = *state;
	char *id = submit_job(d);
	char path[160];
	snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
	http_resp r;
	assert_int_equal(http_post_json(d, path, "{}", &r), 0);
	assert_true(r.status >= 200 && r.status < 300);
	http_resp_free(&r);
	json_t *job = it_wait_job(d, id, "canceled", 10);
	json_decref(job);

	snprintf(path, sizeof path, "%s/bertd.log", d->root);
	char *log = it_slurp(path, NULL);
	assert_non_null(log);
	char want[256];
	snprintf(want, sizeof want, "job %s: (new) -> queued (submitted)", id);
	assert_stamped_line(d, log, want);
	snprintf(want, sizeof want, "job %s: queued -> canceled (", id);
	assert_stamped_line(d, log, want);
	free(log);
	free(id);
}

static int setup(void **state)
{
	it_daemon_opts o = {.plain = true};
	return it_setup(state, &o, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_second_daemon_refused, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_state_changes_logged, setup, it_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
