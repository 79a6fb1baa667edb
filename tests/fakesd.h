/* fakesd — a stand-in for systemd's D-Bus API, for the tests of
 * daemon/sdunit.c: a private dbus-daemon with its socket in a directory,
 * and on it org.freedesktop.systemd1 with one unit whose Job property
 * names job job_id (0: no job) of type job_type, served by a thread.
 * Test-only; the fields are read at each question, so a test may change
 * job_id and job_type between them (job_id only between 0 and the value it
 * had at fakesd_start, whose job object is the one registered). */
#ifndef BERTD_TESTS_FAKESD_H
#define BERTD_TESTS_FAKESD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct fakesd {
	char unit[80];          /* set before fakesd_start: "bertd.service" */
	volatile uint32_t job_id;
	char job_type[32];      /* "restart", "stop" */
	char address[220];      /* the bus: "unix:path=<dir>/bus" (fakesd_start) */
	pid_t bus_pid;
	pthread_t server;
	volatile bool stop;
	volatile int ready;     /* 1 serving, -1 failed */
} fakesd;

/* Whether dbus-daemon is installed (else the bus tests skip). */
bool fakesd_available(void);
/* Starts dbus-daemon with its socket in dir and the stand-in on it; waits
 * (bounded) until it serves. 0, or -1 with nothing left running. */
int fakesd_start(fakesd *f, const char *dir);
/* Stops the stand-in and the bus. No-op after a failed or no start. */
void fakesd_stop(fakesd *f);

#endif
