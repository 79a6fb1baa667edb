/* nodeloaders — see nodeloaders.h. */
#include "worker/nodeloaders.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loader/ring.h"

#define STOP_WAIT_MS 10000

/* Slurm's integer variable name into *v: 0, or -1 when unset or not one. */
static int env_int(const char *name, long *v)
{
	const char *s = getenv(name);
	char *end;
	if (!s || !*s)
		return -1;
	errno = 0;
	*v = strtol(s, &end, 10);
	return errno || *end || *v < 0 ? -1 : 0;
}

int nodeloaders_plan(batchjob *bj, int rank, int *ring_rank, bool *first, char *why, size_t cap)
{
	long local, per_node, node;
	const char *attempt = getenv("BERTD_ATTEMPT");
	if (env_int("SLURM_LOCALID", &local) || env_int("SLURM_NTASKS_PER_NODE", &per_node) ||
	    env_int("SLURM_NODEID", &node) || per_node < 1 || local >= per_node || local > rank) {
		snprintf(why, cap, "loaders on a node need srun's SLURM_LOCALID, SLURM_NTASKS_PER_NODE and "
				   "SLURM_NODEID (--ntasks-per-node)");
		return -EINVAL;
	}
	char tag[96], val[160];
	const char *dash = attempt ? strrchr(attempt, '-') : NULL; /* bertd-<job>-<attempt>: its last field */
	snprintf(tag, sizeof tag, "%s-n%ld", dash && dash[1] ? dash + 1 : attempt && *attempt ? attempt : "a", node);
	for (char *c = tag; *c; c++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", *c))
			*c = '_';
	snprintf(val, sizeof val, "%ld,%ld,%s", (long)rank - local, per_node, tag);
	if (setenv("BERTD_RING_NODE", val, 1) < 0 || batchjob_ring_from_env(bj) < 0) {
		snprintf(why, cap, "ranks %ld..%ld of node %ld do not make a ring of this job", (long)rank - local,
			 (long)rank - local + per_node - 1, node);
		return -EINVAL;
	}
	*ring_rank = (int)local;
	*first = local == 0;
	return 0;
}

/* The child's side of a start: its log on stdout/stderr, /dev/null on
 * stdin and fd 3 (no daemon socket there), then exec. Never returns. */
static void child(const char *log, char *const argv[])
{
	int lf = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (lf < 0 || nul < 0 || dup2(nul, 0) < 0 || dup2(lf, 1) < 0 || dup2(lf, 2) < 0 || dup2(nul, 3) < 0)
		_exit(127);
	execv(argv[0], argv);
	dprintf(2, "bertd-worker: cannot run %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

int nodeloaders_start(nodeloaders *nl, const batchjob *bj, const char *exe, const char *job_path, char *why,
		      size_t cap)
{
	int rc = 0;
	int count = bj->spec.training.dataloader_num_workers;
	char bin[PATH_MAX + 16], logs[PATH_MAX], cnt[16];
	const char *tag = strrchr(getenv("BERTD_RING_NODE"), ',') + 1;
	nl->n = 0;
	snprintf(nl->shm, sizeof nl->shm, "%s", bj->shm_name);
	if (count > NODELOADERS_MAX) {
		snprintf(why, cap, "more than %d loaders on a node", NODELOADERS_MAX);
		return -EINVAL;
	}
	const char *slash0 = strrchr(exe, '/');
	if (!slash0) {
		snprintf(why, cap, "bertd-worker was started as \"%s\", not by its path: its bertd-loader "
				   "cannot be found", exe);
		return -ENOENT;
	}
	snprintf(bin, sizeof bin, "%.*s/bertd-loader", (int)(slash0 - exe), exe);
	snprintf(logs, sizeof logs, "%s", job_path);
	char *slash = strrchr(logs, '/');
	snprintf(slash ? slash + 1 : logs, sizeof logs - (size_t)(slash ? slash + 1 - logs : 0), "logs");
	snprintf(cnt, sizeof cnt, "%d", count);
	for (int i = 0; i < count; i++) {
		char idx[16], log[PATH_MAX + 200];
		snprintf(idx, sizeof idx, "%d", i);
		snprintf(log, sizeof log, "%s/loader-%s-%d.log", logs, tag, i);
		char *argv[] = {bin, "--job", (char *)job_path, "--index", idx, "--count", cnt, NULL};
		pid_t pid = fork();
		if (pid == 0)
			child(log, argv);
		if (pid < 0) {
			rc = -errno;
			snprintf(why, cap, "cannot start %s: %s", bin, strerror(-rc));
			nodeloaders_stop(nl);
			return rc;
		}
		nl->pid[nl->n++] = pid;
	}
	return 0;
}

int nodeloaders_check(nodeloaders *nl, char *why, size_t cap)
{
	for (int i = 0; i < nl->n; i++) {
		int st;
		if (waitpid(nl->pid[i], &st, WNOHANG) != nl->pid[i])
			continue;
		const char *tag = strrchr(getenv("BERTD_RING_NODE"), ',') + 1;
		if (WIFEXITED(st))
			snprintf(why, cap, "loader %d on this node (%s) exited with %d: see logs/loader-%s-%d.log", i,
				 tag, WEXITSTATUS(st), tag, i);
		else
			snprintf(why, cap, "loader %d on this node (%s) was killed by signal %d", i, tag,
				 WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		nl->pid[i] = nl->pid[--nl->n]; /* reaped: not stopped again */
		return -EPIPE;
	}
	return 0;
}

void nodeloaders_stop(nodeloaders *nl)
{
	if (nl->n == 0)
		return;
	for (int i = 0; i < nl->n; i++)
		kill(nl->pid[i], SIGTERM);
	for (int i = 0; i < nl->n; i++) {
		int waited = 0;
		while (waitpid(nl->pid[i], NULL, WNOHANG) == 0) {
			if (waited >= STOP_WAIT_MS) {
				kill(nl->pid[i], SIGKILL);
				waitpid(nl->pid[i], NULL, 0);
				break;
			}
			poll(NULL, 0, 20);
			waited += 20;
		}
	}
	nl->n = 0;
	ring_unlink(nl->shm);
}
