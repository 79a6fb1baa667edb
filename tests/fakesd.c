/* fakesd — see fakesd.h. */
#include "fakesd.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <systemd/sd-bus.h>

static void pause_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static int get_job(sd_bus *bus, const char *path, const char *iface, const char *prop, sd_bus_message *reply,
		   void *ud, sd_bus_error *err)
{
	(void)bus; (void)path; (void)iface; (void)prop; (void)err;
	const fakesd *f = ud;
	uint32_t id = f->job_id;
	char jp[64];
	snprintf(jp, sizeof jp, id ? "/org/freedesktop/systemd1/job/%u" : "/", id);
	return sd_bus_message_append(reply, "(uo)", id, jp);
}

static int get_job_type(sd_bus *bus, const char *path, const char *iface, const char *prop,
			sd_bus_message *reply, void *ud, sd_bus_error *err)
{
	(void)bus; (void)path; (void)iface; (void)prop; (void)err;
	const fakesd *f = ud;
	return sd_bus_message_append(reply, "s", f->job_type);
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

/* The stand-in's thread (its sd-bus connection lives here only). */
static void *serve(void *arg)
{
	fakesd *f = arg;
	sd_bus *bus = NULL;
	char *unit_path = NULL, job_path[64];
	int rc;
	snprintf(job_path, sizeof job_path, "/org/freedesktop/systemd1/job/%u", f->job_id);
	if ((rc = sd_bus_new(&bus)) < 0 || (rc = sd_bus_set_address(bus, f->address)) < 0 ||
	    (rc = sd_bus_set_bus_client(bus, 1)) < 0 || (rc = sd_bus_start(bus)) < 0 ||
	    (rc = sd_bus_path_encode("/org/freedesktop/systemd1/unit", f->unit, &unit_path)) < 0 ||
	    (rc = sd_bus_add_object_vtable(bus, NULL, unit_path, "org.freedesktop.systemd1.Unit", unit_vtable, f)) <
		    0 ||
	    (rc = sd_bus_add_object_vtable(bus, NULL, job_path, "org.freedesktop.systemd1.Job", job_vtable, f)) < 0 ||
	    (rc = sd_bus_request_name(bus, "org.freedesktop.systemd1", 0)) < 0) {
		fprintf(stderr, "stand-in systemd: %s\n", strerror(-rc));
		f->ready = -1;
		free(unit_path);
		sd_bus_unref(bus);
		return NULL;
	}
	free(unit_path);
	f->ready = 1;
	while (!f->stop) {
		rc = sd_bus_process(bus, NULL);
		if (rc < 0)
			break;
		if (rc == 0)
			sd_bus_wait(bus, 100 * 1000);
	}
	sd_bus_flush_close_unref(bus);
	return NULL;
}

bool fakesd_available(void)
{
	return system("command -v dbus-daemon >/dev/null") == 0;
}

int fakesd_start(fakesd *f, const char *dir)
{
	char sock[200];
	snprintf(sock, sizeof sock, "%s/bus", dir);
	snprintf(f->address, sizeof f->address, "unix:path=%s", sock);
	f->stop = false;
	f->ready = 0;
	f->bus_pid = fork();
	if (f->bus_pid == 0) {
		char listen[240];
		snprintf(listen, sizeof listen, "--address=%s", f->address);
		execlp("dbus-daemon", "dbus-daemon", "--session", "--nofork", "--nopidfile", listen, (char *)NULL);
		_exit(127);
	}
	if (f->bus_pid < 0) {
		f->bus_pid = 0;
		return -1;
	}
	struct stat st;
	for (int i = 0; i < 200 && stat(sock, &st) < 0; i++)
		pause_ms(50); /* bounded: dbus-daemon makes its socket at start */
	if (stat(sock, &st) < 0 || pthread_create(&f->server, NULL, serve, f) != 0) {
		fakesd_stop(f);
		return -1;
	}
	for (int i = 0; i < 200 && !f->ready; i++)
		pause_ms(50);
	if (f->ready != 1) {
		fakesd_stop(f);
		return -1;
	}
	return 0;
}

void fakesd_stop(fakesd *f)
{
	if (!f->bus_pid)
		return;
	f->stop = true;
	if (f->ready)
		pthread_join(f->server, NULL);
	f->ready = 0;
	kill(f->bus_pid, SIGTERM);
	waitpid(f->bus_pid, NULL, 0);
	f->bus_pid = 0;
}
