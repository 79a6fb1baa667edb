/* exitcodes — how bertd's child processes (bertd-worker, bertd-loader,
 * bertd-prepare) end, so the daemon can decide retry vs fail without
 * parsing text; and, apart, how the daemon itself ends (bertd_daemon_exit). A child also sends an {"type":"error"} message with the
 * details before a non-zero exit where it can. Documented in docs/formats.md.
 */
#ifndef BERTD_COMMON_EXITCODES_H
#define BERTD_COMMON_EXITCODES_H

enum bertd_exit {
	BERTD_EXIT_OK = 0,          /* finished its work */
	BERTD_EXIT_FAILURE = 1,     /* unexpected internal error: retryable */
	BERTD_EXIT_BAD_CONFIG = 2,  /* spec/arguments unusable: never retried */
	BERTD_EXIT_OOM = 3,         /* out of (device) memory: never retried */
	BERTD_EXIT_PEER_LOST = 4,   /* another rank died or the collective broke: retryable */
	BERTD_EXIT_DATA = 5,        /* dataset missing, corrupt or too small: never retried */
	BERTD_EXIT_STOPPED = 6,     /* stopped on request after checkpointing */
	BERTD_EXIT_IO = 7,          /* could not write (disk full, permissions): never retried */
};

/* How bertd itself (the daemon, and `bertd backup`) ends; documented in
 * README.md and docs/operations.md. Scripts and systemd go by these. */
enum bertd_daemon_exit {
	BERTD_DAEMON_EXIT_OK = 0,         /* clean shutdown; backup written */
	BERTD_DAEMON_EXIT_CONFIG = 1,     /* bad configuration or arguments */
	BERTD_DAEMON_EXIT_STARTUP = 2,    /* state dir, database, token, bind failed; backup failed */
	BERTD_DAEMON_EXIT_LOCKED = 3,     /* the state dir is in use by another bertd */
	BERTD_DAEMON_EXIT_DB_DAMAGED = 4, /* the job database is damaged: restore it (not retried) */
	BERTD_DAEMON_EXIT_DETACHED = 5,   /* clean exit that left running jobs running (a restart):
					   * the next bertd adopts them; the unit keeps them alive */
};

#endif
