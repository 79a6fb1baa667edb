/* Stop or restart: the daemon, run as if it were a systemd service (in a
 * cgroup named like a service unit, INVOCATION_ID set, the system bus a
 * private dbus-daemon where a stand-in for systemd's manager answers the
 * unit's Job and the job's JobType), asks on SIGTERM which one it is: a
 * restart takes the "leave jobs running" exit (in a build without it: the
 * log says so and the jobs stop as on a stop), a stop stops.
 *
 * Needs root, dbus-daemon and a writable cgroup hierarchy of systemd's
 * (the name=systemd one, or cgroup2 mounted at /sys/fs/cgroup); skips
 * otherwise. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
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
#include "../fakesd.h"

static char root[] = "/tmp/bertd-sdstop-XXXXXX";
static char cgroup_dir[600], wrapper[200], real_bin[512];
static fakesd sd = {.job_id = 7}; /* its unit: this test's own name; job_type: what it answers */

/* A new cgroup named unit in each of systemd's hierarchies that we can
 * write (libsystemd reads the unified one where it is mounted, else the
 * name=systemd one): their directories, space-separated, into cgroup_dir;
 * "" where there is none. */
static void make_cgroup(void)
{
	const char *bases[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup"};
	cgroup_dir[0] = 0;
	for (size_t i = 0; i < 3; i++) {
		char probe[160], dir[160];
		snprintf(probe, sizeof probe, "%s/cgroup.procs", bases[i]);
		if (access(probe, W_OK) != 0)
			continue;
		snprintf(dir, sizeof dir, "%s/%s", bases[i], sd.unit);
		if (mkdir(dir, 0755) == 0) {
			size_t used = strlen(cgroup_dir);
			snprintf(cgroup_dir + used, sizeof cgroup_dir - used, "%s%s", used ? " " : "", dir);
		}
	}
}

static int setup(void **state)
{
	(void)state;
	if (geteuid() != 0 || !fakesd_available())
		return 0;
	snprintf(sd.unit, sizeof sd.unit, "bertd-sdtest-%ld.service", (long)getpid());
	make_cgroup();
	if (!cgroup_dir[0] || !mkdtemp(root))
		return 0;
	if (fakesd_start(&sd, root) < 0)
		return -1;
	/* bertd, started through a wrapper that puts it into the unit's cgroup */
	snprintf(real_bin, sizeof real_bin, "%s", getenv("BERTD_BIN"));
	snprintf(wrapper, sizeof wrapper, "%s/bertd-in-unit", root);
	char text[1600];
	snprintf(text, sizeof text,
		 "#!/bin/sh\nfor d in %s; do echo $$ > \"$d/cgroup.procs\" || exit 99; done\nexec '%s' \"$@\"\n",
		 cgroup_dir, real_bin);
	FILE *f = fopen(wrapper, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0 || chmod(wrapper, 0755) != 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (sd.bus_pid) {
		fakesd_stop(&sd);
		it_system("rm -rf '%s'", root);
	}
	if (cgroup_dir[0])
		it_system("for d in %s; do rmdir \"$d\"; done", cgroup_dir); /* empty once our daemons are gone */
	return 0;
}

/* Starts bertd as the unit's main process, SIGTERMs it with the stand-in
 * answering type; returns its log (caller frees). Its exit status must be
 * want_exit (5: jobs left running; 0: stopped). */
static char *run_and_term(const char *type, int want_exit)
{
	snprintf(sd.job_type, sizeof sd.job_type, "%s", type);
	setenv("BERTD_BIN", wrapper, 1);
	setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1);
	setenv("DBUS_SYSTEM_BUS_ADDRESS", sd.address, 1);
	it_daemon_opts o = {.plain = true};
	it_fx *f = it_daemon_start(&o, 30);
	setenv("BERTD_BIN", real_bin, 1);
	unsetenv("INVOCATION_ID");
	unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
	assert_non_null(f);
	char path[200];
	snprintf(path, sizeof path, "%.*s/cgroup.procs", (int)strcspn(cgroup_dir, " "), cgroup_dir);
	char *procs = it_slurp(path, NULL), pid[32];
	snprintf(pid, sizeof pid, "%ld\n", (long)f->d.pid);
	assert_non_null(procs);
	assert_non_null(strstr(procs, pid)); /* it runs in the unit's cgroup */
	free(procs);
	assert_int_equal(bertd_stop(&f->d), want_exit);
	snprintf(path, sizeof path, "%s/bertd.log", f->d.root);
	char *log = it_slurp(path, NULL);
	assert_int_equal(it_daemon_stop(f), 0);
	return log;
}

/* fail_msg prints a bounded message: the log goes to stderr first. */
static void fail_with_log(const char *what, const char *want, const char *log)
{
	fprintf(stderr, "daemon log:\n%s\n", log);
	fail_msg("%s (%s)", what, want);
}

static void need_env(void)
{
	if (!sd.bus_pid) {
		fprintf(stderr, "needs root, dbus-daemon and a writable systemd cgroup hierarchy: skip\n");
		skip();
	}
}

static void test_restart_takes_detach_path(void **state)
{
	(void)state;
	need_env();
	char *log = run_and_term("restart", 5);
	char want[160];
	snprintf(want, sizeof want, "systemd job of %s: restart", sd.unit);
	if (!strstr(log, want) || !strstr(log, "restart: "))
		fail_with_log("the log lacks the restart's job type and exit", want, log);
	free(log);
}

static void test_stop_stops(void **state)
{
	(void)state;
	need_env();
	char *log = run_and_term("stop", 0);
	char want[160];
	snprintf(want, sizeof want, "systemd job of %s: stop", sd.unit);
	if (!strstr(log, want) || strstr(log, "restart: "))
		fail_with_log("want the stop's job type and no restart exit", want, log);
	free(log);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restart_takes_detach_path),
		cmocka_unit_test(test_stop_stops),
	};
	return IT_RUN(tests, setup, teardown);
}
