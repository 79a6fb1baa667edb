/* proc — see proc.h. */
#include "daemon/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int pidfd_open_(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* In the child between fork and exec: only async-signal-safe calls. */
static void child(int sock, int errpipe, int logfd, char *const argv[], char *const envp[], bool outlive)
{
	int e;
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL); /* the daemon blocks signals for signalfd */
	signal(SIGPIPE, SIG_DFL);
	if (outlive) {
		/* its own session: no terminal's or daemon's group signal reaches it */
		if (setsid() < 0)
			goto fail;
	} else {
		setpgid(0, 0);
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
			goto fail;
	}
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull < 0 || dup2(devnull, 0) < 0)
		goto fail;
	if (dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
		goto fail;
	if (sock == PROC_CHILD_FD) {
		int fl = fcntl(sock, F_GETFD);
		fcntl(sock, F_SETFD, fl & ~FD_CLOEXEC);
	} else if (dup2(sock, PROC_CHILD_FD) < 0) { /* dup2 clears FD_CLOEXEC */
		goto fail;
	}
	/* The parent may have died between fork and PR_SET_PDEATHSIG. */
	if (!outlive && getppid() == 1)
		_exit(127);
	execve(argv[0], argv, envp);
fail:
	e = errno;
	if (write(errpipe, &e, sizeof e) < 0) {
	}
	_exit(127);
}

int proc_spawn(proc *p, char *const argv[], char *const envp[], const char *log_path)
{
	return proc_spawn_outliving(p, argv, envp, log_path, false);
}

int proc_spawn_outliving(proc *p, char *const argv[], char *const envp[], const char *log_path, bool outlive)
{
	memset(p, 0, sizeof *p);
	p->pidfd = p->sock = -1;
	int sv[2] = {-1, -1}, ep[2] = {-1, -1}, logfd = -1, rc = 0;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	if (pipe2(ep, O_CLOEXEC) < 0) {
		rc = -errno;
		goto out;
	}
	logfd = log_path ? open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640)
			 : open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (logfd < 0) {
		rc = -errno;
		goto out;
	}
	pid_t pid = fork();
	if (pid < 0) {
		rc = -errno;
		goto out;
	}
	if (pid == 0) {
		close(sv[0]);
		close(ep[0]);
		child(sv[1], ep[1], logfd, argv, envp, outlive);
	}
	if (!outlive)
		setpgid(pid, pid); /* also in the parent: no race with proc_signal */
	close(ep[1]);
	ep[1] = -1;
	int child_errno = 0;
	ssize_t n;
	do
		n = read(ep[0], &child_errno, sizeof child_errno);
	while (n < 0 && errno == EINTR);
	p->pid = pid;
	if (n == (ssize_t)sizeof child_errno) { /* exec failed: reap and report */
		waitpid(pid, NULL, 0);
		p->pid = 0;
		rc = child_errno ? -child_errno : -ENOEXEC;
		goto out;
	}
	p->pidfd = pidfd_open_(pid);
	if (p->pidfd < 0) {
		rc = -errno;
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		p->pid = 0;
		goto out;
	}
	fcntl(p->pidfd, F_SETFD, FD_CLOEXEC);
	p->sock = sv[0];
	sv[0] = -1;
	fcntl(p->sock, F_SETFL, fcntl(p->sock, F_GETFL) | O_NONBLOCK);
out:
	if (sv[0] >= 0)
		close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
	if (ep[0] >= 0)
		close(ep[0]);
	if (ep[1] >= 0)
		close(ep[1]);
	if (logfd >= 0)
		close(logfd);
	return rc;
}

int proc_signal(const proc *p, int sig)
{
	if (p->pid <= 0 || p->reaped)
		return -ESRCH;
	/* through the pidfd first: the leader itself, never a recycled pid */
	if (p->pidfd >= 0 && syscall(SYS_pidfd_send_signal, p->pidfd, sig, NULL, 0) < 0 && errno == ESRCH)
		return -ESRCH;
	if (kill(-p->pid, sig) < 0 && kill(p->pid, sig) < 0)
		return -errno;
	return 0;
}

int proc_adopt(proc *p, pid_t pid)
{
	memset(p, 0, sizeof *p);
	p->sock = -1;
	p->pidfd = pidfd_open_(pid);
	if (p->pidfd < 0)
		return -errno;
	fcntl(p->pidfd, F_SETFD, FD_CLOEXEC);
	p->pid = pid;
	p->adopted = true;
	return 0;
}

int proc_reap(proc *p)
{
	if (p->reaped)
		return 1;
	if (p->pid <= 0)
		return -ESRCH;
	if (p->adopted) { /* not ours to wait for: its pidfd says it ended */
		struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
		if (poll(&pfd, 1, 0) <= 0)
			return 0;
		p->reaped = true;
		p->status = 0; /* unknown here: the caller reads its exit record */
		return 1;
	}
	siginfo_t si = {0};
	if (waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0)
		return -errno;
	if (si.si_pid == 0)
		return 0;
	/* The leader is a zombie, so its group id is still ours: take down any
	 * grandchildren with it before the pid can be reused. */
	kill(-p->pid, SIGKILL);
	int st;
	while (waitpid(p->pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	p->status = st;
	p->reaped = true;
	return 1;
}

int proc_stop(proc *p, int sig, int timeout_ms)
{
	if (p->pid <= 0)
		return -ESRCH;
	if (p->reaped)
		return 0;
	if (sig)
		proc_signal(p, sig);
	struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
	int r;
	do
		r = poll(&pfd, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r == 0)
		proc_signal(p, SIGKILL);
	if (p->adopted) {
		pfd.revents = 0;
		while (poll(&pfd, 1, -1) < 0 && errno == EINTR) {
		}
		return proc_reap(p) < 0 ? -ECHILD : 0;
	}
	siginfo_t si;
	while (waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOWAIT) < 0)
		if (errno != EINTR)
			return -errno;
	return proc_reap(p) < 0 ? -ECHILD : 0;
}

void proc_close(proc *p)
{
	if (p->pidfd >= 0)
		close(p->pidfd);
	if (p->sock >= 0)
		close(p->sock);
	p->pidfd = p->sock = -1;
}

void proc_describe(int status, char *buf, size_t cap)
{
	if (WIFEXITED(status))
		snprintf(buf, cap, "exit %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, cap, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(buf, cap, "status 0x%x", status);
}
