/* follow — bertctl follow: a job's events and log lines as the daemon's SSE
 * streams deliver them, both at once on one libcurl multi handle, each
 * reconnected with Last-Event-ID whenever its connection ends without the
 * "end" event (a dropped connection, a daemon restart), so nothing is
 * printed twice and nothing is skipped. Must never print an event whose
 * blank line did not arrive, and never give up on a daemon that is only
 * restarting within retry_s. */
#ifndef BERTD_CLIENT_FOLLOW_H
#define BERTD_CLIENT_FOLLOW_H

#include <stdbool.h>

#include "client/cli.h"

typedef struct follow_opts {
	bool events;     /* the events stream */
	bool logs;       /* a log stream */
	int rank;        /* worker rank of the log (when loader < 0) */
	int loader;      /* loader index of the log, -1 for a rank */
	long tail;       /* start the log at its last tail lines; -1: from its first byte */
	int retry_s;     /* how long a stream may stay unreachable before giving up */
} follow_opts;

/* Follows job id until its streams end with the job's final state.
 * Returns CLI_OK (completed), CLI_JOB_FAILED, CLI_JOB_CANCELED,
 * CLI_HTTP_4XX (refused: unknown job, bad rank), CLI_HTTP_5XX (unreachable
 * for retry_s), CLI_ERROR (stdout cannot be written). */
int follow_job(const cli *c, const char *id, const follow_opts *o);

#endif
