/* exitcodes — how bertd's child processes (bertd-worker, bertd-loader,
 * bertd-prepare) end, so the daemon can decide retry vs fail without
 * parsing text. A child also sends an {"type":"error"} message with the
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

#endif
