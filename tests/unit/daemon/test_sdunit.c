/* sdunit: the question "is this stop a restart?" asked over D-Bus, against
 * a stand-in for systemd's manager objects served with sd-bus on a private
 * dbus-daemon (the unit's Job property, the job's JobType), and the
 * answers where there is no systemd: no bus, no unit, no job. Skips (77)
 * without dbus-daemon. */
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
#include <unistd.h>
#include <cmocka.h>

#include "daemon/sdunit.h"
#include "tests/fakesd.h"

static char dir[] = "/tmp/bertd-sdunit-XXXXXX";
static fakesd sd = {.unit = "bertd.service", .job_id = 42};

static int setup(void **state)
{
	(void)state;
	if (!fakesd_available())
		return 0; /* the bus tests skip */
	if (!mkdtemp(dir))
		return -1;
	return fakesd_start(&sd, dir);
}

static int teardown(void **state)
{
	(void)state;
	if (!sd.bus_pid)
		return 0;
	fakesd_stop(&sd);
	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void need_bus(void)
{
	if (!sd.bus_pid) {
		fprintf(stderr, "no dbus-daemon: skip\n");
		skip();
	}
}

/* The unit has a job of type job_type: sdunit_job_type reads it back, and
 * sdunit_type_is_restart says whether that is a restart. */
static void check_job(const char *job_type, bool restart)
{
	need_bus();
	char type[64];
	sd.job_id = 42;
	snprintf(sd.job_type, sizeof sd.job_type, "%s", job_type);
	assert_int_equal(sdunit_job_type(sd.address, "bertd.service", type, sizeof type), 1);
	assert_string_equal(type, job_type);
	assert_true(sdunit_type_is_restart(type) == restart);
}

static void test_restart_job(void **state)
{
	(void)state;
	check_job("restart", true);
}

static void test_stop_job(void **state)
{
	(void)state;
	check_job("stop", false);
}

static void test_no_job(void **state)
{
	(void)state;
	need_bus();
	char type[64] = "x";
	sd.job_id = 0;
	assert_int_equal(sdunit_job_type(sd.address, "bertd.service", type, sizeof type), 0);
	assert_string_equal(type, "");
}

static void test_unknown_unit(void **state)
{
	(void)state;
	need_bus();
	char type[64] = "x";
	sd.job_id = 42;
	assert_true(sdunit_job_type(sd.address, "other.service", type, sizeof type) < 0);
	assert_string_equal(type, "");
}

static void test_no_bus(void **state)
{
	(void)state;
	char type[64] = "x";
	assert_true(sdunit_job_type("unix:path=/nonexistent/bertd-no-bus", "bertd.service", type,
				    sizeof type) < 0);
	assert_string_equal(type, "");
}

/* Not a systemd service (no INVOCATION_ID): a stop, whatever else holds. */
static void test_not_under_systemd(void **state)
{
	(void)state;
	unsetenv("INVOCATION_ID");
	assert_false(sdunit_stop_is_restart());
	/* with the variable but no unit of ours on a system bus: still a stop */
	setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1);
	setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bertd-no-bus", 1);
	assert_false(sdunit_stop_is_restart());
	unsetenv("INVOCATION_ID");
}

static void test_restart_types(void **state)
{
	(void)state;
	assert_true(sdunit_type_is_restart("restart"));
	assert_true(sdunit_type_is_restart("try-restart"));
	assert_false(sdunit_type_is_restart("stop"));
	assert_false(sdunit_type_is_restart("reload"));
	assert_false(sdunit_type_is_restart(""));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restart_job),
		cmocka_unit_test(test_stop_job),
		cmocka_unit_test(test_no_job),
		cmocka_unit_test(test_unknown_unit),
		cmocka_unit_test(test_no_bus),
		cmocka_unit_test(test_not_under_systemd),
		cmocka_unit_test(test_restart_types),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
