/* sdunit: the question "is this stop a restart?" asked over D-Bus, against
 * a stand-in for systemd's manager objects served with sd-bus on a private
 * dbus-daemon (the unit's Job property, the job's JobType), and the
 * answers where there is no systemd: no bus, no unit, no job. Skips (77)
 * without dbus-daemon. */
#include <errno.h>
#include <pthread.h>
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
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <systemd/sd-bus.h>

#include "daemon/sdunit.h"

static char dir[] = "/tmp/bertd-sdunit-XXXXXX";
static char address[200];
static pid_t bus_pid;

/* What the stand-in systemd answers (set before each question). */
static uint32_t job_id;
static char job_type[32];

static pthread_t server;
static volatile bool server_stop;
static volatile int server_ready; /* 1 ready, -1 failed */

static int get_job(sd_bus *bus, const char *path, const char *iface, const char *prop,
		   sd_bus_message *reply, void *ud, sd_bus_error *err)
{
	(void)bus; (void)path; (void)iface; (void)prop; (void)ud; (void)err;
	char jp[64];
	snprintf(jp, sizeof jp, job_id ? "/org/freedesktop/systemd1/job/%u" : "/", job_id);
	return sd_bus_message_append(reply, "(uo)", job_id, jp);
}

static int get_job_type(sd_bus *bus, const char *path, const char *iface, const char *prop,
			sd_bus_message *reply, void *ud, sd_bus_error *err)
{
	(void)bus; (void)path; (void)iface; (void)prop; (void)ud; (void)err;
	return sd_bus_message_append(reply, "s", job_type);
}

static const sd_bus_vtable unit_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("Job", "(uo)", get_job, 0, 0),
	SD_BUS_VTABLE_END,
};
static const sd_bus_vtable job_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("JobType", "s", get_job_type, 0, 0),
	SD_BUS_VTABLE_END,
};

/* The stand-in: org.freedesktop.systemd1 with one unit, bertd.service, and
 * its job 42 (the sd-bus connection lives in this thread only). */
static void *serve(void *arg)
{
	(void)arg;
	sd_bus *bus = NULL;
	int rc;
	if ((rc = sd_bus_new(&bus)) < 0 || (rc = sd_bus_set_address(bus, address)) < 0 ||
	    (rc = sd_bus_set_bus_client(bus, 1)) < 0 || (rc = sd_bus_start(bus)) < 0 ||
	    (rc = sd_bus_add_object_vtable(bus, NULL, "/org/freedesktop/systemd1/unit/bertd_2eservice",
					   "org.freedesktop.systemd1.Unit", unit_vtable, NULL)) < 0 ||
	    (rc = sd_bus_add_object_vtable(bus, NULL, "/org/freedesktop/systemd1/job/42",
					   "org.freedesktop.systemd1.Job", job_vtable, NULL)) < 0 ||
	    (rc = sd_bus_request_name(bus, "org.freedesktop.systemd1", 0)) < 0) {
		fprintf(stderr, "stand-in systemd: %s\n", strerror(-rc));
		server_ready = -1;
		sd_bus_unref(bus);
		return NULL;
	}
	server_ready = 1;
	while (!server_stop) {
		rc = sd_bus_process(bus, NULL);
		if (rc < 0)
			break;
		if (rc == 0)
			sd_bus_wait(bus, 100 * 1000);
	}
	sd_bus_flush_close_unref(bus);
	return NULL;
}

static void pause_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static int setup(void **state)
{
	(void)state;
	if (system("command -v dbus-daemon >/dev/null") != 0)
		return 0; /* the bus tests skip */
	if (!mkdtemp(dir))
		return -1;
	char sock[160];
	snprintf(sock, sizeof sock, "%s/bus", dir);
	snprintf(address, sizeof address, "unix:path=%s", sock);
	bus_pid = fork();
	if (bus_pid == 0) {
		char listen[200];
		snprintf(listen, sizeof listen, "--address=%s", address);
		execlp("dbus-daemon", "dbus-daemon", "--session", "--nofork", "--nopidfile", listen,
		       (char *)NULL);
		_exit(127);
	}
	struct stat st;
	for (int i = 0; i < 200 && stat(sock, &st) < 0; i++)
		pause_ms(50); /* bounded: dbus-daemon makes its socket at start */
	if (stat(sock, &st) < 0)
		return -1;
	if (pthread_create(&server, NULL, serve, NULL) != 0)
		return -1;
	for (int i = 0; i < 200 && !server_ready; i++)
		pause_ms(50);
	return server_ready == 1 ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	if (!bus_pid)
		return 0;
	server_stop = true;
	if (server_ready)
		pthread_join(server, NULL);
	kill(bus_pid, SIGTERM);
	waitpid(bus_pid, NULL, 0);
	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void need_bus(void)
{
	if (!bus_pid) {
		fprintf(stderr, "no dbus-daemon: skip\n");
		skip();
	}
}

static void test_restart_job(void **state)
{
	(void)state;
	need_bus();
	char type[64];
	job_id = 42;
	snprintf(job_type, sizeof job_type, "restart");
	assert_int_equal(sdunit_job_type(address, "bertd.service", type, sizeof type), 1);
	assert_string_equal(type, "restart");
	assert_true(sdunit_type_is_restart(type));
}

static void test_stop_job(void **state)
{
	(void)state;
	need_bus();
	char type[64];
	job_id = 42;
	snprintf(job_type, sizeof job_type, "stop");
	assert_int_equal(sdunit_job_type(address, "bertd.service", type, sizeof type), 1);
	assert_string_equal(type, "stop");
	assert_false(sdunit_type_is_restart(type));
}

static void test_no_job(void **state)
{
	(void)state;
	need_bus();
	char type[64] = "x";
	job_id = 0;
	assert_int_equal(sdunit_job_type(address, "bertd.service", type, sizeof type), 0);
	assert_string_equal(type, "");
}

static void test_unknown_unit(void **state)
{
	(void)state;
	need_bus();
	char type[64] = "x";
	job_id = 42;
	assert_true(sdunit_job_type(address, "other.service", type, sizeof type) < 0);
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
