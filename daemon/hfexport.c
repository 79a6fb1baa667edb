/* hfexport — see hfexport.h. */
#include "daemon/hfexport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_int running;

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The last non-empty line of text into out. */
static void last_line(const char *text, char *out, size_t cap)
{
	size_t n = strlen(text);
	while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
		n--;
	size_t start = n;
	while (start > 0 && text[start - 1] != '\n')
		start--;
	snprintf(out, cap, "%.*s", (int)(n - start), text + start);
}

/* Reads the child's stderr (its tail kept in err) until it closes or the
 * deadline; then waits for the child on its pidfd for what is left. Returns
 * true when it exited in time (*status set), false when it must be killed. */
static bool wait_child(pid_t pid, int efd, int64_t deadline, char *err, size_t cap, int *status)
{
	size_t n = 0;
	for (;;) {
		int64_t left = deadline - mono_ms();
		if (left <= 0)
			return false;
		struct pollfd pf = {.fd = efd, .events = POLLIN};
		int pr = poll(&pf, 1, (int)left);
		if (pr < 0 && errno != EINTR)
			return false;
		if (pr <= 0)
			continue;
		char buf[1024];
		ssize_t r = read(efd, buf, sizeof buf);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break; /* closed: it exited, or closed stderr itself */
		for (ssize_t i = 0; i < r; i++) { /* keep the newest bytes */
			if (n == cap - 1) {
				memmove(err, err + cap / 2, n - cap / 2);
				n -= cap / 2;
			}
			err[n++] = buf[i];
		}
		err[n] = 0;
	}
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd >= 0) {
		struct pollfd pf = {.fd = pfd, .events = POLLIN};
		int pr;
		int64_t left;
		while ((left = deadline - mono_ms()) > 0 && (pr = poll(&pf, 1, (int)left)) < 0 && errno == EINTR)
			;
		close(pfd);
		if (left <= 0 || pr == 0)
			return false;
	}
	while (waitpid(pid, status, 0) < 0)
		if (errno != EINTR)
			return false;
	return true;
}

int hfexport_checkpoint(const char *bin_dir, const char *ckpt_dir, const char *out_dir, int timeout_ms, char *why,
			size_t cap)
{
	char bin[1100], err[2048] = "";
	int pe[2] = {-1, -1}, rc;
	pid_t pid = -1;
	if (atomic_fetch_add(&running, 1) >= HFEXPORT_MAX_RUNNING) {
		atomic_fetch_sub(&running, 1);
		snprintf(why, cap, "%d checkpoint conversions are running; retry", HFEXPORT_MAX_RUNNING);
		return -EBUSY;
	}
	snprintf(bin, sizeof bin, "%s/bertd-worker", bin_dir);
	if (pipe2(pe, O_CLOEXEC) < 0) {
		rc = -errno;
		snprintf(why, cap, "pipe: %s", strerror(errno));
		goto out;
	}
	char *argv[] = {bin, "--export", (char *)ckpt_dir, (char *)out_dir, NULL};
	char *envp[] = {"PATH=/usr/bin:/bin", "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", NULL};
	/* posix_spawn, not fork: this runs on an HTTP thread of a daemon that
	 * may be large; its own process group, so a timeout kills all of it */
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
	sigset_t none, dfl;
	sigemptyset(&none);
	sigemptyset(&dfl);
	sigaddset(&dfl, SIGPIPE);
	posix_spawnattr_init(&at);
	/* the daemon blocks signals (for its signalfd) and ignores SIGPIPE */
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	posix_spawnattr_setpgroup(&at, 0);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &dfl);
	int se = posix_spawn(&pid, bin, &fa, &at, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(pe[1]);
	pe[1] = -1;
	if (se) {
		rc = -se;
		snprintf(why, cap, "cannot run %s: %s", bin, strerror(se));
		goto out;
	}
	int st = 0;
	if (!wait_child(pid, pe[0], mono_ms() + timeout_ms, err, sizeof err, &st)) {
		kill(-pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		snprintf(why, cap, "the conversion did not finish within %d s (killed)", timeout_ms / 1000);
		rc = -ETIMEDOUT;
	} else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		char line[1024];
		last_line(err, line, sizeof line);
		if (WIFEXITED(st))
			snprintf(why, cap, "the conversion failed (exit %d)%s%s", WEXITSTATUS(st), line[0] ? ": " : "",
				 line);
		else
			snprintf(why, cap, "the conversion was killed by signal %d%s%s",
				 WIFSIGNALED(st) ? WTERMSIG(st) : 0, line[0] ? ": " : "", line);
		rc = -EIO;
	} else {
		rc = 0;
	}
out:
	if (pe[0] >= 0)
		close(pe[0]);
	if (pe[1] >= 0)
		close(pe[1]);
	atomic_fetch_sub(&running, 1);
	return rc;
}
