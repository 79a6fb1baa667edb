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

double worker_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int worker_send(worker *w, json_t *m)
{
	const char *t = m ? json_string_value(json_object_get(m, "type")) : NULL;
	int rc = chan_send(&w->ch, m, t && strcmp(t, "progress") == 0);
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
	json_t *m;
	int rc;
	while ((rc = chan_next(&w->ch, &m)) == 1) {
		take_stop(w, m);
		json_decref(m);
	}
	if (rc == -EPIPE && w->ch.had_daemon && !w->stop_requested) {
		/* no daemon can adopt this rank: stop cleanly, keep the checkpoint
		 * (a relayed rank: its relay broke or the daemon reset it; the
		 * attempt fence keeps a stop checkpoint of an attempt that is over
		 * out of the job) */
		log_error("the daemon's line is gone and no other can attach; stopping");
		w->stop_requested = true;
	}
}

int worker_await(worker *w, const char *type, int timeout_ms, json_t **out)
{
	if (w->ch.fd < 0 && !w->ch.had_daemon)
		return -ENOTCONN;
	double deadline = worker_now_s() + timeout_ms / 1000.0;
	for (;;) {
		json_t *m;
		int rc = chan_next(&w->ch, &m);
		if (rc < 0)
			return rc; /* the daemon is gone */
		if (rc == 0) {
			int left_ms = (int)((deadline - worker_now_s()) * 1000.0);
			if (left_ms <= 0)
				return -ETIMEDOUT;
			if (!chan_reachable(&w->ch))
				return -EPIPE;
			chan_wait(&w->ch, left_ms);
			continue;
		}
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
