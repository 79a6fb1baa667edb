/* libnccl.c — a libnccl.so.2 with nothing in it but ncclGetVersion, for the
 * daemon's NCCL probe in tests/cudasim/test_daemon_submit.c (the daemon
 * only asks which version a loadable NCCL is; the stand-in workers bring
 * their own NCCL, tests/cudasim/nccl.cpp). Test-only: never installed. */
int ncclGetVersion(int *version);

int ncclGetVersion(int *version)
{
	if (!version)
		return 4; /* ncclInvalidArgument */
	*version = 22107; /* NCCL_VERSION(2, 21, 7): a version no real install reports here */
	return 0;
}
