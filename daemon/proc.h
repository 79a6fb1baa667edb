/* proc — spawning and watching the daemon's child processes (loaders,
 * workers, bertd-prepare). Each child gets:
 *   - a fresh environment (only what the caller passes),
 *   - fd 3: its end of a socketpair to the daemon (common/msg.h frames),
 *   - stdin /dev/null, stdout+stderr appended to a log file,
 *   - its own process group (so the whole subtree can be signalled),
 *   - PR_SET_PDEATHSIG SIGKILL, so it dies if the daemon dies; or, spawned
 *     to outlive the daemon (proc_spawn_outliving: a job's workers and
 *     loaders, bertd-prepare), its own session and no death signal,
 * and the daemon gets a pidfd to watch its exit on the event loop.
 * No SQLite connection or CUDA context ever crosses the fork: the child
 * execs at once.
 */
#ifndef BERTD_DAEMON_PROC_H
#define BERTD_DAEMON_PROC_H

#include <stdbool.h>
#include <sys/types.h>

#define PROC_CHILD_FD 3 /* where the child finds its socket */

typedef struct proc {
	pid_t pid;
	int pidfd;   /* readable when the child has exited */
	int sock;    /* daemon's end of the socketpair, non-blocking */
	bool reaped;
	bool adopted; /* not the daemon's child (proc_adopt): watched through its pidfd only */
	int status;  /* waitpid status once reaped */
} proc;

/* Starts argv[0] (a path) with argv and envp (NULL-terminated arrays).
 * log_path: file to append stdout/stderr to (created 0640), or NULL for
 * /dev/null. Returns 0 and fills *p, or negative errno; an exec failure is
 * reported as -ENOEXEC / the exec errno (the child tells the parent through
 * a close-on-exec pipe before the call returns). */
int proc_spawn(proc *p, char *const argv[], char *const envp[], const char *log_path);

/* proc_spawn, with outlive: the child gets its own session (it is its
 * group's leader) and no PR_SET_PDEATHSIG, so it outlives the daemon. */
int proc_spawn_outliving(proc *p, char *const argv[], char *const envp[], const char *log_path, bool outlive);

/* Watches pid, a process another daemon started (identity checked by the
 * caller): a pidfd, no socket, never waited for (its exit status is not
 * ours: proc_reap leaves status 0, the caller knows better). 0 or -errno. */
int proc_adopt(proc *p, pid_t pid);

/* Sends sig to the child (through its pidfd) and its whole process group. */
int proc_signal(const proc *p, int sig);

/* Reaps the child if it has exited (non-blocking). Returns 1 when reaped
 * (p->status valid), 0 still running, negative errno. */
int proc_reap(proc *p);

/* Waits up to timeout_ms for the child to exit, then SIGKILLs its group and
 * waits for it. Always reaps. Returns 0, or negative errno. */
int proc_stop(proc *p, int sig, int timeout_ms);

/* Closes the daemon's fds for a reaped child. */
void proc_close(proc *p);

/* Describes an exit status: "exit 0", "exit 3", "signal 9 (Killed)". */
void proc_describe(int status, char *buf, size_t cap);

#endif
