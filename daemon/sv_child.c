/* sv_child — a run's child processes on the event loop: spawning one (its
 * pidfd and socket registered with the loop), reading what it sends and
 * handing it to its kind's on_input (a job's messages: sv_report;
 * bertd-prepare's progress lines: sv_prepare), a relayed rank's lost
 * connection to on_lost, and its exit: its kind's on_exit (srun's:
 * sv_slurm), then a bad one sets the run's verdict and takes the run's
 * other children down; workers done, the loaders are told to go.
 *
 * Calls only sv_run: what depends on a child's kind comes through its
 * child_ops, set by whoever spawned it. Never interprets a message itself
 * and never decides a job's or a dataset's next state:
 * sv_run_maybe_finish hands that to the run's on_end once the last child
 * is gone.
 */
#include "daemon/sv_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/wait.h>

#include "common/exitcodes.h"
#include "common/log.h"
#include "common/msg.h"
#include "daemon/proc.h"

/* Reads and handles everything c has sent that is there now (until EAGAIN
 * or end of stream), e.g. what it said just before it exited. */
void sv_child_drain(supervisor *sv, run *r, child *c)
{
	long n;
	while (c->p.sock >= 0 && !c->sock_eof && (n = msg_reader_fill(&c->rd, c->p.sock)) != -EAGAIN) {
		if (n <= 0) {
			c->sock_eof = true;
			break;
		}
		c->ops->on_input(sv, r, c);
	}
}

void sv_child_on_sock(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	child *c = arg;
	run *r = c->owner;
	supervisor *sv = r->sv;
	long n = msg_reader_fill(&c->rd, fd);
	if (n == 0 || (n < 0 && n != -EAGAIN)) {
		loop_del(l, fd); /* EOF: exit is handled through the pidfd */
		if (c->ops->on_lost)
			c->ops->on_lost(sv, r, c);
		return;
	}
	int rc = c->ops->on_input(sv, r, c);
	if (c->role == ROLE_PREPARE) {
		if (c->rd.len == c->rd.cap) /* a line longer than the buffer: drop it */
			c->rd.len = 0;
		return;
	}
	if (rc < 0) {
		log_warn("job %s: %s %d broke the message protocol; stopping the job", r->id,
			 c->role == ROLE_LOADER ? "loader" : "rank", c->index);
		sv_set_failure(r, false, "protocol error from a child process");
		loop_del(l, fd);
		sv_run_kill_all(r, SIGKILL);
	}
}

static void on_child_exit(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	child *c = arg;
	run *r = c->owner;
	supervisor *sv = r->sv;
	if (proc_reap(&c->p) <= 0)
		return;
	loop_del(l, fd);
	loop_del(l, c->p.sock); /* may already be gone */
	/* Drain whatever it said last (its error message comes before exit). */
	sv_child_drain(sv, r, c);
	proc_close(&c->p);
	c->exited = true;
	r->alive--;

	int st = c->p.status;
	char desc[96];
	proc_describe(st, desc, sizeof desc);
	if (c->ops->on_exit)
		c->ops->on_exit(sv, r, st, desc);
	const char *who = c->role == ROLE_WORKER ? "rank" : c->role == ROLE_LOADER ? "loader"
			  : c->role == ROLE_LAUNCHER ? "srun" : "prepare";
	bool ok = WIFEXITED(st) && WEXITSTATUS(st) == BERTD_EXIT_OK;
	bool stopped = WIFEXITED(st) && WEXITSTATUS(st) == BERTD_EXIT_STOPPED;
	if (c->role == ROLE_LOADER && r->killing)
		ok = true; /* loaders are told to go when the workers are done */
	if (!ok && !stopped && !r->killing) {
		int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		bool retry = !WIFEXITED(st) || code == BERTD_EXIT_FAILURE || code == BERTD_EXIT_PEER_LOST;
		if (c->role == ROLE_PREPARE && !WIFEXITED(st))
			r->prep_signaled = true;
		sv_set_failure(r, retry, "%s %d ended with %s", who, c->index, desc);
		log_warn("%s %s: %s %d ended with %s", r->is_dataset ? "dataset" : "job", r->id, who, c->index, desc);
		sv_run_kill_all(r, SIGTERM);
	} else {
		log_debug("%s %s: %s %d ended with %s", r->is_dataset ? "dataset" : "job", r->id, who, c->index, desc);
	}
	/* Workers done: loaders have nothing left to do. */
	if (!r->is_dataset && !r->killing) {
		bool workers_left = false;
		for (int i = 0; i < r->nkids; i++)
			if ((r->kids[i]->role == ROLE_WORKER || r->kids[i]->role == ROLE_LAUNCHER) &&
			    !r->kids[i]->exited)
				workers_left = true;
		if (!workers_left)
			sv_run_kill_all(r, SIGTERM);
	}
	sv_run_maybe_finish(sv, r);
}

int sv_child_spawn(supervisor *sv, run *r, enum child_role role, int index, const child_ops *ops,
		   char *const argv[], char *const envp[], const char *log_path)
{
	if (r->nkids == MAX_CHILDREN)
		return -E2BIG;
	child *c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	c->role = role;
	c->index = index;
	c->owner = r;
	c->ops = ops;
	c->last_msg_ms = sv_now_ms();
	msg_reader_init(&c->rd);
	int rc = proc_spawn(&c->p, argv, envp, log_path);
	if (rc < 0) {
		free(c);
		return rc;
	}
	r->kids[r->nkids++] = c;
	r->alive++;
	if ((rc = loop_add(sv->lp, c->p.pidfd, EPOLLIN, on_child_exit, c)) < 0 ||
	    (rc = loop_add(sv->lp, c->p.sock, EPOLLIN, sv_child_on_sock, c)) < 0) {
		proc_signal(&c->p, SIGKILL);
		return rc;
	}
	c->watched = true;
	return 0;
}
