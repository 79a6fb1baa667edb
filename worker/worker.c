/* worker — see worker.h: a rank's line to the daemon (fd 3, or the relay
 * connection of a multi-node rank): messages out, stops in. */
#include "worker/worker.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/exitcodes.h"
#include "common/log.h"
#include "common/msg.h"
#include "worker/relay.h"

double worker_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int worker_send(worker *w, json_t *m)
{
	int rc = !m ? -ENOMEM : w->daemon_fd >= 0 ? msg_send(w->daemon_fd, m) : 0;
	json_decref(m);
	return rc < 0 ? rc : 0;
}

int worker_fail(worker *w, int code, const char *fmt, ...)
{
	/* the error message's code for each exit code (docs/formats.md) */
	static const char *const kinds[] = {
		[BERTD_EXIT_FAILURE] = "internal", [BERTD_EXIT_BAD_CONFIG] = "bad_config", [BERTD_EXIT_OOM] = "oom",
		[BERTD_EXIT_PEER_LOST] = "peer_lost", [BERTD_EXIT_DATA] = "data", [BERTD_EXIT_IO] = "io",
	};
	assert(code > 0 && code < (int)(sizeof kinds / sizeof *kinds) && kinds[code]);
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	log_error("%s", msg);
	worker_send(w, json_pack("{s:s, s:s, s:s, s:i}", "type", "error", "code", kinds[code], "message", msg,
				 "rank", w->rank));
	return code;
}

/* A stop message (logged): sets stop_requested. */
static bool take_stop(worker *w, json_t *m)
{
	const char *type = json_string_value(json_object_get(m, "type"));
	if (!type || strcmp(type, "stop") != 0)
		return false;
	const char *why = json_string_value(json_object_get(m, "reason"));
	log_info("stop requested (%s)", why);
	w->stop_requested = true;
	/* a cancel ends the job (a user's, or max_runtime_seconds): its model is
	 * exported; a shutdown's job resumes later and exports then */
	if (why && strcmp(why, "cancel") == 0)
		w->stop_ends_job = true;
	return true;
}

void worker_poll(worker *w)
{
	if (w->daemon_fd < 0)
		return;
	for (;;) {
		long n = msg_reader_fill(&w->rd, w->daemon_fd);
		if (n == 0) { /* the daemon is gone: stop cleanly, keep the checkpoint */
			w->stop_requested = true;
			w->daemon_fd = -1;
			return;
		}
		if (n < 0 && n != -EAGAIN && relay_wanted()) {
			/* the relay broke (its keepalive bound passed: this node is cut
			 * off, or the daemon reset it): stop; the attempt fence keeps
			 * a stop checkpoint of an attempt that is over out of the job */
			log_error("the relay connection failed: %s; stopping", strerror((int)-n));
			w->stop_requested = true;
			close(w->daemon_fd);
			w->daemon_fd = -1;
			return;
		}
		if (n < 0)
			break;
	}
	json_t *m;
	while (msg_reader_next(&w->rd, &m) == 1) {
		take_stop(w, m);
		json_decref(m);
	}
}

int worker_await(worker *w, const char *type, int timeout_ms, json_t **out)
{
	if (w->daemon_fd < 0)
		return -ENOTCONN;
	double deadline = worker_now_s() + timeout_ms / 1000.0;
	for (;;) {
		json_t *m;
		int left_ms = (int)((deadline - worker_now_s()) * 1000.0);
		int rc = msg_recv(w->daemon_fd, &w->rd, left_ms > 0 ? left_ms : 0, &m);
		if (rc <= 0)
			return rc == 0 ? -EPIPE : rc; /* 0: the daemon is gone */
		const char *t = json_string_value(json_object_get(m, "type"));
		if (take_stop(w, m)) {
			json_decref(m);
			return -ECANCELED;
		}
		if (t && strcmp(t, type) == 0) {
			*out = m;
			return 0;
		}
		json_decref(m);
	}
}
