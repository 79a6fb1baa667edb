/* sv_shutdown — draining at shutdown (supervisor_shutdown): every worker
 * told to stop, bertd-prepare sent SIGTERM, the workers' last reports read
 * while they write their stop checkpoints, then whatever is left stopped
 * and every run ended (jobs back to queued, to resume at the next start).
 *
 * supervisor_shutdown_detach is the other exit: the jobs' processes (a
 * multi-node job's srun and ranks too) and the preparations are let go,
 * running, for the next daemon to adopt.
 *
 * The only supervisor code that blocks the loop: it polls the workers'
 * pidfds and sockets itself, up to stop_timeout_ms. Never fails a job.
 */
#include "daemon/sv_internal.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>

#include "common/msg.h"
#include "daemon/proc.h"

/* Waits until every worker of r has exited or deadline_ms (monotonic) has
 * passed, handling their messages meanwhile. Workers that exit are reaped
 * (proc_stop then finds them so). */
static void shutdown_wait_workers(supervisor *sv, run *r, int64_t deadline_ms)
{
	if (r->is_dataset)
		return;
	for (;;) {
		struct pollfd pfd[2 * MAX_CHILDREN];
		child *who[2 * MAX_CHILDREN];
		nfds_t n = 0;
		for (int i = 0; i < r->nkids; i++) {
			child *c = r->kids[i];
			if (c->role != ROLE_WORKER || c->exited || c->p.reaped || (c->relayed && c->sock_eof))
				continue;
			if (!c->relayed) { /* a relayed rank ends with its connection */
				pfd[n] = (struct pollfd){.fd = c->p.pidfd, .events = POLLIN};
				who[n++] = c;
			}
			if (c->p.sock >= 0 && !c->sock_eof) {
				pfd[n] = (struct pollfd){.fd = c->p.sock, .events = POLLIN};
				who[n++] = c;
			}
		}
		int64_t left = deadline_ms - sv_now_ms();
		if (n == 0 || left <= 0)
			return;
		int rc = poll(pfd, n, (int)(left > 1000 ? 1000 : left));
		if (rc < 0 && errno != EINTR)
			return;
		for (nfds_t k = 0; rc > 0 && k < n; k++) {
			if (!pfd[k].revents)
				continue;
			child *c = who[k];
			sv_child_drain(sv, r, c);
			if (c->relayed && c->sock_eof) /* closed here too: the rank waits for that to exit */
				sv_relay_drop(sv, c);
			else if (pfd[k].fd == c->p.pidfd && proc_reap(&c->p) > 0)
				sv_child_drain(sv, r, c); /* what it wrote just before exiting */
		}
	}
}

void supervisor_shutdown(supervisor *sv)
{
	if (!sv)
		return;
	json_t *m = json_pack("{s:s, s:s}", "type", "stop", "reason", "shutdown");
	for (run *r = sv->runs; r; r = r->next) {
		r->shutdown = true;
		for (int i = 0; i < r->nkids; i++) {
			child *c = r->kids[i];
			if (c->exited)
				continue;
			if (c->role == ROLE_WORKER)
				msg_send(c->p.sock, m);
			else if (c->role == ROLE_PREPARE)
				proc_signal(&c->p, SIGTERM);
		}
	}
	json_decref(m);
	/* Workers checkpoint and exit within the grace period (their loaders
	 * keep feeding them until then); what they report meanwhile is read,
	 * the stop checkpoint's report included. Then the rest is stopped. */
	int64_t deadline = sv_now_ms() + sv->cfg.stop_timeout_ms;
	for (run *r = sv->runs; r; r = r->next)
		shutdown_wait_workers(sv, r, deadline);
	while (sv->runs) {
		run *r = sv->runs;
		for (int i = 0; i < r->nkids; i++) {
			child *c = r->kids[i];
			if (c->exited)
				continue;
			if (c->relayed) { /* srun (below) ends its process */
				sv_relay_drop(sv, c);
				continue;
			}
			bool gentle = c->role == ROLE_LOADER || c->role == ROLE_LAUNCHER;
			int sig = gentle ? SIGTERM : 0;
			/* workers: the grace period is spent, so this kills what is left */
			proc_stop(&c->p, sig, gentle ? 2000 : 0);
			if (!r->is_dataset)
				sv_child_drain(sv, r, c);
			if (c->watched) {
				loop_del(sv->lp, c->p.pidfd);
				loop_del(sv->lp, c->p.sock);
			}
			proc_close(&c->p);
			c->exited = true;
			r->alive--;
		}
		if (r->is_dataset) {
			/* left preparing: the next start prepares it again, from its
			 * finished shards (nothing to adopt: its record goes) */
			sv_prepare_forget(sv, r);
			sv_unlink_run(sv, r);
			sv_run_free(r);
			continue;
		}
		sv_run_maybe_finish(sv, r);
	}
}

void supervisor_shutdown_detach(supervisor *sv)
{
	if (!sv)
		return;
	for (run **pp = &sv->runs; *pp;) {
		run *r = *pp;
		/* its processes run on; their lines close, they keep what they say
		 * (a multi-node attempt's srun runs on; its ranks' relay connections
		 * close with the relay, and they redial the next daemon's) */
		for (int i = 0; i < r->nkids; i++) {
			child *c = r->kids[i];
			if (c->watched && !c->exited) {
				loop_del(sv->lp, c->p.pidfd);
				if (c->p.sock >= 0)
					loop_del(sv->lp, c->p.sock);
			}
			if (!c->exited)
				proc_close(&c->p);
		}
		sv_note_runtime(sv, r);
		*pp = r->next;
		sv_run_free(r); /* its devices: this daemon ends */
	}
	supervisor_shutdown(sv);
}
