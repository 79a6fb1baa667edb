/* sv_relay — the relay of a multi-node attempt (docs/multinode.md,
 * daemon/cluster.h): accepting the ranks' connections on the attempt's
 * listener, admitting each by its token (it becomes a relayed ROLE_WORKER
 * child: a connection, no process here), checking that every rank has the
 * same dataset before telling them "go", and closing connections when a
 * rank is lost or the attempt ends.
 *
 * Never starts, schedules or ends a job (srun is sv_slurm's; the job's
 * next state is sv_finish's), never touches the device table; a lost rank
 * or a dataset mismatch is a verdict and sv_run_kill_all. Calls sv_report,
 * sv_stall, sv_child and sv_run only: a rank's lost connection reaches
 * sv_relay_lost through its child_ops.
 */
#include "daemon/sv_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/jobspec.h"
#include "common/keepalive.h"
#include "common/log.h"
#include "common/msg.h"
#include "daemon/cluster.h"

/* Closes a relayed rank's connection; it counts as exited (it has no
 * process here to wait for). */
void sv_relay_drop(supervisor *sv, child *c)
{
	if (c->p.sock >= 0) {
		loop_del(sv->lp, c->p.sock);
		close(c->p.sock);
		c->p.sock = -1;
	}
	c->exited = true;
}

static void pending_free(supervisor *sv, run *r, relay_pending *p, bool close_fd)
{
	for (relay_pending **pp = &r->pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	if (close_fd) {
		loop_del(sv->lp, p->fd);
		close(p->fd);
		msg_reader_free(&p->rd);
	}
	free(p);
}

/* The attempt is over: listener, connections not yet identified, ranks. */
void sv_relay_close_all(supervisor *sv, run *r)
{
	if (!r->multinode)
		return;
	if (r->ca.listen_fd >= 0)
		loop_del(sv->lp, r->ca.listen_fd);
	cluster_attempt_close(&r->ca);
	while (r->pending)
		pending_free(sv, r, r->pending, true);
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->relayed)
			sv_relay_drop(sv, r->kids[i]);
}

/* A rank's connection closed. After its "bye" that is its exit; before,
 * the rank is lost (killed, its node gone): the attempt fails on every
 * node, retryable, and srun is told to end the step. */
void sv_relay_lost(supervisor *sv, run *r, child *c)
{
	bool bye = c->said_bye;
	sv_relay_drop(sv, c);
	if (bye || r->killing)
		return;
	sv_set_failure(r, true, "rank %d on node %s was lost (its connection closed before it exited)", c->index,
		    r->rank_node[c->index]);
	log_warn("job %s: %s", r->id, r->reason);
	sv_run_kill_all(r, SIGTERM);
}

/* A relayed rank: its messages (sv_report) and its connection's end; it
 * has no process here to exit. */
static const child_ops rank_ops = {.on_input = sv_report_input, .on_lost = sv_relay_lost};

/* A job's data as one string for messages: the dataset's name, or a
 * mixture's names joined by "+". Returns buf. */
static const char *data_label(json_t *spec, char *buf, size_t cap)
{
	json_t *ds = json_object_get(spec, "dataset");
	size_t n = 0, i;
	json_t *e;
	buf[0] = '\0';
	if (!json_is_array(ds)) {
		snprintf(buf, cap, "%s", json_string_value(ds) ? json_string_value(ds) : "");
		return buf;
	}
	json_array_foreach(ds, i, e) {
		if (n >= cap)
			break;
		int w = snprintf(buf + n, cap - n, "%s%s", i ? "+" : "",
				 json_string_value(json_object_get(e, "name")));
		if (w < 0)
			break;
		n += (size_t)w;
	}
	return buf;
}

/* Every rank has joined: the same dataset everywhere, or the job fails
 * (not retried: a restart would find the same copies). Then "go". */
static void relay_all_joined(supervisor *sv, run *r)
{
	char why[600], where[600];
	int len = snprintf(where, sizeof where, "%d ranks joined:", r->world);
	for (int i = 0; i < r->world && len > 0 && (size_t)len < sizeof where; i++)
		len += snprintf(where + len, sizeof where - (size_t)len, " %d@%s", i, r->rank_node[i]);
	store_job_note(sv->st, r->id, where);
	char label[JOBSPEC_MAX_DATASETS * 66];
	const char *dataset = data_label(r->spec, label, sizeof label);
	if (cluster_dataset_verdict((const char(*)[64])r->rank_node,
				    (const char(*)[CLUSTER_TOKEN_HEX + 1])r->rank_sha, r->world,
				    dataset ? dataset : "", why, sizeof why) < 0) {
		sv_set_failure(r, false, "%s", why);
		log_warn("job %s: %s", r->id, why);
		sv_run_kill_all(r, SIGTERM);
		return;
	}
	const char *comm = sv->cfg.multinode_comm && *sv->cfg.multinode_comm ? sv->cfg.multinode_comm : "auto";
	json_t *go = json_pack("{s:s, s:s}", "type", "go", "comm", comm);
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->relayed && !r->kids[i]->exited)
			msg_send(r->kids[i]->p.sock, go);
	json_decref(go);
	log_info("job %s: %s", r->id, where);
}

/* The first message of a relay connection: {"type":"relay","token","rank",
 * "node","dataset_sha256"}. The right token makes it rank's child; anything
 * else closes it (a wrong token is logged, the job goes on). */
static void on_relay_pending(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	relay_pending *p = arg;
	run *r = p->owner;
	supervisor *sv = r->sv;
	long n = msg_reader_fill(&p->rd, fd);
	json_t *m = NULL;
	int rc = msg_reader_next(&p->rd, &m);
	if (rc == 0 && (n > 0 || n == -EAGAIN))
		return; /* not whole yet */
	const char *type = json_string_value(json_object_get(m, "type"));
	json_t *jr = json_object_get(m, "rank");
	int rank = json_is_integer(jr) ? (int)json_integer_value(jr) : -1;
	const char *why = NULL;
	if (rc != 1 || !type || strcmp(type, "relay") != 0)
		why = "it did not introduce itself";
	else if (!cluster_token_ok(&r->ca, json_string_value(json_object_get(m, "token"))))
		why = "wrong relay token";
	else if (rank < 0 || rank >= r->world)
		why = "rank out of range";
	for (int i = 0; !why && i < r->nkids; i++)
		if (r->kids[i]->relayed && r->kids[i]->index == rank)
			why = "rank already joined";
	child *c = why || r->nkids == MAX_CHILDREN ? NULL : calloc(1, sizeof *c);
	if (!c) {
		log_warn("job %s: relay connection refused: %s", r->id, why ? why : "out of memory");
		json_decref(m);
		pending_free(sv, r, p, true);
		return;
	}
	*c = (child){.role = ROLE_WORKER, .index = rank, .relayed = true, .owner = r, .ops = &rank_ops,
		     .rd = p->rd, .last_msg_ms = sv_now_ms(), .p = {.pid = 0, .pidfd = -1, .sock = fd}};
	snprintf(r->rank_node[rank], sizeof r->rank_node[rank], "%s",
		 json_string_value(json_object_get(m, "node")) ? json_string_value(json_object_get(m, "node"))
							     : "?");
	snprintf(r->rank_sha[rank], sizeof r->rank_sha[rank], "%s",
		 json_string_value(json_object_get(m, "dataset_sha256")) ? json_string_value(json_object_get(
										m, "dataset_sha256"))
									  : "");
	json_decref(m);
	loop_del(l, fd);
	pending_free(sv, r, p, false);
	r->kids[r->nkids++] = c;
	if (loop_add(l, fd, EPOLLIN, sv_child_on_sock, c) < 0) {
		sv_relay_lost(sv, r, c);
		return;
	}
	c->watched = true;
	sv_stall_note_progress(r, c, "relay");
	if (++r->relays == r->world)
		relay_all_joined(sv, r);
	/* what came with it: after a daemon restart, its attach and what no
	 * daemon acknowledged (numbered: handled once) */
	if (!c->exited && c->rd.len)
		c->ops->on_input(sv, r, c);
}

void sv_relay_on_accept(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	run *r = arg;
	for (;;) {
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (cfd < 0)
			return;
		keepalive_set(cfd, r->ca.relay_timeout_ms); /* a cut-off rank is an error in bounded time */
		relay_pending *p = calloc(1, sizeof *p);
		if (!p || loop_add(l, cfd, EPOLLIN, on_relay_pending, p) < 0) {
			free(p);
			close(cfd);
			continue;
		}
		p->fd = cfd;
		p->owner = r;
		msg_reader_init(&p->rd);
		p->next = r->pending;
		r->pending = p;
	}
}
