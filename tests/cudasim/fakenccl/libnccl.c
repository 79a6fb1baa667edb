/* libnccl.c — a libnccl.so.2 with nothing in it but ncclGetVersion, for the
 * daemon's NCCL probe in tests/cudasim/test_daemon_submit.c (the daemon
 * only asks which version a loadable NCCL is; the stand-in workers bring
 * their own NCCL, tests/cudasim/nccl.cpp). Test-only: never installed. */
#include <stdlib.h>

int ncclGetVersion(int *version);

/* NCCL_VERSION(2, 21, 7), a version no real install reports here, or
 * $FAKE_NCCL_VERSION's code (an NCCL too old for bertd). */
int ncclGetVersion(int *version)
{
	if (!version)
		return 4; /* ncclInvalidArgument */
	const char *v = getenv("FAKE_NCCL_VERSION");
	*version = v && *v ? atoi(v) : 22107;
	return 0;
}
