/* Child process management: socket on fd 3, fresh environment, log capture,
 * exec failures, stop with escalation, whole-group teardown, and death of
 * children when their parent dies. The test process is a child subreaper so
 * orphaned grandchildren come back to it and can be waited for exactly. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/msg.h"
#include "daemon/proc.h"

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/bertd-proc-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	return prctl(PR_SET_CHILD_SUBREAPER, 1);
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void read_file(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(buf, 1, cap - 1, f);
	buf[n] = 0;
	fclose(f);
}

static void test_message_log_env_exit(void **state)
{
	(void)state;
	char log[128];
	snprintf(log, sizeof log, "%s/child.log", dir);
	char *argv[] = {"/bin/sh", "-c",
			"printf '\\007\\000\\000\\000{\"a\":1}' >&3; echo \"log line FOO=$FOO HOME=$HOME\"; "
			"echo to-stderr >&2; exit 3",
			NULL};
	char *envp[] = {"FOO=bar", "PATH=/usr/bin:/bin", NULL};
	proc p;
	assert_int_equal(proc_spawn(&p, argv, envp, log), 0);
	assert_true(p.pid > 0);
	msg_reader r;
	msg_reader_init(&r);
	json_t *m = NULL;
	assert_int_equal(msg_recv(p.sock, &r, 5000, &m), 1);
	assert_int_equal(json_integer_value(json_object_get(m, "a")), 1);
	json_decref(m);
	msg_reader_free(&r);

	struct pollfd pfd = {.fd = p.pidfd, .events = POLLIN};
	assert_int_equal(poll(&pfd, 1, 5000), 1); /* pidfd says it exited */
	assert_int_equal(proc_reap(&p), 1);
	assert_true(WIFEXITED(p.status));
	assert_int_equal(WEXITSTATUS(p.status), 3);
	char desc[64];
	proc_describe(p.status, desc, sizeof desc);
	assert_string_equal(desc, "exit 3");
	proc_close(&p);

	char buf[256];
	read_file(log, buf, sizeof buf);
	assert_non_null(strstr(buf, "log line FOO=bar HOME=\n")); /* nothing inherited */
	assert_non_null(strstr(buf, "to-stderr"));
}

static void test_exec_failure(void **state)
{
	(void)state;
	char *argv[] = {"/nonexistent/bertd-worker", NULL};
	char *envp[] = {NULL};
	proc p;
	assert_int_equal(proc_spawn(&p, argv, envp, NULL), -ENOENT);
	char log[128];
	snprintf(log, sizeof log, "%s/no/such/dir/x.log", dir);
	char *argv2[] = {"/bin/true", NULL};
	assert_int_equal(proc_spawn(&p, argv2, envp, log), -ENOENT);
}

/* The child ignores SIGTERM; stop escalates to SIGKILL after the timeout,
 * and a grandchild in its group dies too. */
static void test_stop_escalates_and_kills_group(void **state)
{
	(void)state;
	char log[128];
	snprintf(log, sizeof log, "%s/stop.log", dir);
	char *argv[] = {"/bin/sh", "-c",
			"trap '' TERM; sleep 1000 & echo $! >&3; wait; wait", NULL};
	char *envp[] = {"PATH=/usr/bin:/bin", NULL};
	proc p;
	assert_int_equal(proc_spawn(&p, argv, envp, log), 0);
	char buf[32] = "";
	struct pollfd pfd = {.fd = p.sock, .events = POLLIN};
	assert_int_equal(poll(&pfd, 1, 5000), 1);
	assert_true(read(p.sock, buf, sizeof buf - 1) > 0);
	pid_t grandchild = (pid_t)atoi(buf);
	assert_true(grandchild > 0);

	assert_int_equal(proc_stop(&p, SIGTERM, 200), 0);
	assert_true(WIFSIGNALED(p.status));
	assert_int_equal(WTERMSIG(p.status), SIGKILL);
	int st;
	assert_int_equal(waitpid(grandchild, &st, 0), grandchild); /* came to us, dead */
	assert_true(WIFSIGNALED(st));
	proc_close(&p);
}

/* A child whose parent dies is killed (PR_SET_PDEATHSIG). */
static void test_parent_death_kills_child(void **state)
{
	(void)state;
	int pp[2];
	assert_int_equal(pipe(pp), 0);
	pid_t mid = fork();
	assert_true(mid >= 0);
	if (mid == 0) {
		close(pp[0]);
		char *argv[] = {"/bin/sleep", "1000", NULL};
		char *envp[] = {NULL};
		proc p;
		if (proc_spawn(&p, argv, envp, NULL) < 0)
			_exit(1);
		if (write(pp[1], &p.pid, sizeof p.pid) != sizeof p.pid)
			_exit(1);
		_exit(0); /* the "daemon" dies */
	}
	close(pp[1]);
	pid_t child = 0;
	assert_int_equal(read(pp[0], &child, sizeof child), sizeof child);
	close(pp[0]);
	int st;
	assert_int_equal(waitpid(mid, &st, 0), mid);
	assert_int_equal(waitpid(child, &st, 0), child); /* orphan reparented to us */
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGKILL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_message_log_env_exit),
		cmocka_unit_test(test_exec_failure),
		cmocka_unit_test(test_stop_escalates_and_kills_group),
		cmocka_unit_test(test_parent_death_kills_child),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
