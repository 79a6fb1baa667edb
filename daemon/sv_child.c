/* sv_child — a run's child processes on the event loop: spawning one (its
 * pidfd and socket registered with the loop), reading what it sends and
 * handing it to its kind's on_input (a job's messages: sv_report;
 * bertd-prepare's progress lines: sv_prepare), a relayed rank's lost
 * connection to on_lost, and its exit: its kind's on_exit (srun's:
 * sv_slurm), then a bad one sets the run's verdict and takes the run's
 * other children down; workers done, the loaders are told to go. A job's
 * workers and loaders, and bertd-prepare, are spawned to outlive the
 * daemon (common/chan.h), recorded in the job's attempt.json (a
 * preparation's record: sv_prepare), and their exit records read when
 * they end (an adopted child's only word on how it ended).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>

#include "common/chan.h"
#include "common/exitcodes.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/procstat.h"
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
	if (rc < 0) {
		log_warn("%s %s: %s %d broke the message protocol; stopping it", r->is_dataset ? "dataset" : "job",
			 r->id, c->role == ROLE_PREPARE ? "bertd-prepare" : c->role == ROLE_LOADER ? "loader" : "rank",
			 c->index);
		sv_set_failure(r, false, "protocol error from a child process");
		loop_del(l, fd);
		sv_run_kill_all(r, SIGKILL);
	}
}

/* Appends m as one frame to c's reader, as if it had just been read. */
static void feed(child *c, json_t *m)
{
	char *text = json_dumps(m, JSON_COMPACT);
	size_t n = text ? strlen(text) : 0;
	if (!n || n > MSG_MAX_BYTES) {
		free(text);
		return;
	}
	if (c->rd.len + 4 + n > c->rd.cap) {
		size_t cap = c->rd.len + 4 + n;
		unsigned char *b = realloc(c->rd.buf, cap);
		if (!b) {
			free(text);
			return;
		}
		c->rd.buf = b;
		c->rd.cap = cap;
	}
	unsigned char *p = c->rd.buf + c->rd.len;
	p[0] = (unsigned char)n;
	p[1] = (unsigned char)(n >> 8);
	p[2] = (unsigned char)(n >> 16);
	p[3] = (unsigned char)(n >> 24);
	memcpy(p + 4, text, n);
	c->rd.len += 4 + n;
	free(text);
}

/* <chan_base>.exit of c (common/chan.h): its messages that no daemon
 * acknowledged are handled (those already handled are skipped by seq),
 * and *code is its exit code; false when it left no record. */
static bool read_exit_record(supervisor *sv, run *r, child *c, int *code)
{
	char path[320];
	if (!c->chan_base[0])
		return false;
	snprintf(path, sizeof path, "%s.exit", c->chan_base);
	json_t *rec = json_load_file(path, 0, NULL);
	json_t *pid = json_object_get(rec, "pid"), *st = json_object_get(rec, "start_time");
	/* a record of this process, not of one before it on the same path */
	if (!rec || json_integer_value(pid) != c->p.pid || (uint64_t)json_integer_value(st) != c->start_time) {
		json_decref(rec);
		return false;
	}
	*code = (int)json_integer_value(json_object_get(rec, "code"));
	if (c->role == ROLE_WORKER || c->role == ROLE_PREPARE) /* a loader's has none */
		sv_child_exit_frames(sv, r, c, rec);
	json_decref(rec);
	return true;
}

void sv_child_exit_frames(supervisor *sv, run *r, child *c, json_t *rec)
{
	size_t i;
	json_t *m;
	json_array_foreach(json_object_get(rec, "frames"), i, m)
		feed(c, m);
	if (c->rd.len)
		c->ops->on_input(sv, r, c);
}

void sv_child_ended(supervisor *sv, run *r, child *c)
{
	if (c->watched) {
		loop_del(sv->lp, c->p.pidfd);
		if (c->p.sock >= 0)
			loop_del(sv->lp, c->p.sock); /* may already be gone */
	}
	/* Drain whatever it said last (its error message comes before exit). */
	sv_child_drain(sv, r, c);
	int code = 0;
	bool recorded = read_exit_record(sv, r, c, &code);
	bool judged = c->p.adopted && !recorded && c->ops->adopted_status;
	if (c->p.adopted) /* not our child: its own record (or its kind) says how it ended */
		c->p.status = recorded ? W_EXITCODE(code & 0xff, 0)
			      : judged ? c->ops->adopted_status(sv, r, c) : W_EXITCODE(0, SIGKILL);
	proc_close(&c->p);
	c->exited = true;
	r->alive--;

	int st = c->p.status;
	char desc[96];
	proc_describe(st, desc, sizeof desc);
	if (c->p.adopted && !recorded && !judged)
		snprintf(desc, sizeof desc, "no exit record (killed, or gone while no daemon watched)");
	if (c->ops->on_exit)
		c->ops->on_exit(sv, r, st, desc);
	const char *who = c->role == ROLE_WORKER ? "rank" : c->role == ROLE_LOADER ? "loader"
			  : c->role == ROLE_LAUNCHER ? "srun" : "prepare";
	bool ok = WIFEXITED(st) && WEXITSTATUS(st) == BERTD_EXIT_OK;
	bool stopped = WIFEXITED(st) && WEXITSTATUS(st) == BERTD_EXIT_STOPPED;
	if (c->role == ROLE_LOADER && r->killing)
		ok = true; /* loaders are told to go when the workers are done */
	if (stopped && c->role == ROLE_WORKER && !r->stop_sent && !r->stop_why && !r->shutdown && !r->killing) {
		/* stopped with nobody asking: a rank no daemon could adopt stops when
		 * its daemon goes (common/chan.h); its checkpoint is the way on */
		r->requeue = true;
		sv_set_failure(r, true, "rank %d stopped when its daemon went (it could not be adopted); resuming "
			       "from its checkpoint", c->index);
		stopped = false;
	}
	if (!ok && !stopped && !r->killing) {
		int xc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		bool retry = !WIFEXITED(st) || xc == BERTD_EXIT_FAILURE || xc == BERTD_EXIT_PEER_LOST;
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

static void on_child_exit(loop *l, int fd, uint32_t events, void *arg)
{
	(void)l;
	(void)fd;
	(void)events;
	child *c = arg;
	if (proc_reap(&c->p) <= 0)
		return;
	sv_child_ended(c->owner->sv, c->owner, c);
}

child *sv_child_new(run *r, enum child_role role, int index, const child_ops *ops)
{
	if (r->nkids == MAX_CHILDREN)
		return NULL;
	child *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->role = role;
	c->index = index;
	c->owner = r;
	c->ops = ops;
	c->p.pidfd = c->p.sock = -1;
	c->last_msg_ms = sv_now_ms();
	msg_reader_init(&c->rd);
	r->kids[r->nkids++] = c;
	r->alive++;
	return c;
}

int sv_child_watch(supervisor *sv, child *c)
{
	int rc = loop_add(sv->lp, c->p.pidfd, EPOLLIN, on_child_exit, c);
	if (rc == 0 && c->p.sock >= 0 && (rc = loop_add(sv->lp, c->p.sock, EPOLLIN, sv_child_on_sock, c)) < 0)
		loop_del(sv->lp, c->p.pidfd);
	c->watched = rc == 0;
	return rc;
}

int sv_child_spawn(supervisor *sv, run *r, enum child_role role, int index, const child_ops *ops,
		   char *const argv[], char *const envp[], const char *log_path)
{
	if (r->nkids == MAX_CHILDREN)
		return -E2BIG;
	/* a local job's workers and loaders, and bertd-prepare, outlive the
	 * daemon: a later daemon adopts them on their socket (daemon/adopt.c);
	 * srun too, with no socket (its ranks redial the relay: sv_slurm) */
	bool outlive = r->is_dataset ? role == ROLE_PREPARE : role == ROLE_WORKER || role == ROLE_LOADER;
	bool detach = outlive || role == ROLE_LAUNCHER;
	char base[300] = "", var[340];
	size_t n = 0;
	while (envp[n])
		n++;
	char **env = calloc(n + 2, sizeof *env);
	if (!env)
		return -ENOMEM;
	memcpy(env, envp, n * sizeof *env);
	if (outlive) {
		char chdir_[1100];
		if (r->is_dataset) /* its output directory is not there until it is done */
			snprintf(chdir_, sizeof chdir_, "%s/datasets/ch", sv->state_dir);
		else
			snprintf(chdir_, sizeof chdir_, "%s/ch", r->dir);
		mkdir(chdir_, 0750);
		if (r->is_dataset)
			snprintf(base, sizeof base, "%s/%s", chdir_, r->id);
		else
			snprintf(base, sizeof base, "%s/%s-%d", chdir_, role == ROLE_WORKER ? "rank" : "loader", index);
		char old[320];
		snprintf(old, sizeof old, "%s.exit", base); /* an earlier attempt's */
		unlink(old);
		snprintf(var, sizeof var, "%s=%s", CHAN_ENV, base);
		env[n++] = var;
	}
	proc p;
	int rc = proc_spawn_outliving(&p, argv, env, log_path, detach);
	free(env);
	if (rc < 0)
		return rc;
	child *c = sv_child_new(r, role, index, ops);
	if (!c) {
		proc_signal(&p, SIGKILL);
		proc_stop(&p, 0, 0);
		proc_close(&p);
		return -ENOMEM;
	}
	c->p = p;
	snprintf(c->chan_base, sizeof c->chan_base, "%s", base);
	char state;
	c->start_time = procstat_starttime(p.pid, &state);
	if ((rc = sv_child_watch(sv, c)) < 0) {
		proc_signal(&c->p, SIGKILL);
		return rc;
	}
	return 0;
}

int sv_child_record_write(supervisor *sv, run *r)
{
	(void)sv;
	char boot[64], path[1100];
	chan_boot_id(boot, sizeof boot);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now_unix = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	json_t *kids = json_array(), *devs = json_array();
	for (int i = 0; i < r->nkids; i++) {
		child *c = r->kids[i];
		if (!c->chan_base[0])
			continue;
		json_array_append_new(kids, json_pack("{s:s, s:i, s:i, s:I, s:s}", "role",
						       c->role == ROLE_WORKER ? "worker" : "loader", "index", c->index,
						       "pid", (int)c->p.pid, "start_time", (json_int_t)c->start_time,
						       "chan", c->chan_base));
	}
	for (int i = 0; i < r->ndev; i++)
		json_array_append_new(devs, json_integer(r->dev[i]));
	json_t *rec = json_pack("{s:i, s:i, s:s, s:s, s:I, s:I, s:I, s:i, s:o, s:o}", "format", 1, "proto",
				CHAN_PROTO, "boot_id", boot, "job", r->id, "started_unix_ms",
				(json_int_t)(now_unix - (sv_now_ms() - r->start_ms)), "runtime_base_ms",
				(json_int_t)r->runtime_base_ms, "max_runtime_ms", (json_int_t)r->max_runtime_ms,
				"world", r->world, "devices", devs, "children", kids);
	snprintf(path, sizeof path, "%s/attempt.json", r->dir);
	return sv_child_record_save(path, rec);
}

int sv_child_record_save(const char *path, json_t *rec)
{
	char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
	int rc = text ? fs_write_atomic(path, text, strlen(text), 0600) : -ENOMEM;
	free(text);
	json_decref(rec);
	return rc;
}

int sv_child_next_message(child *c, json_t **m, uint64_t *seq, bool *attach)
{
	int rc;
	while ((rc = msg_reader_next(&c->rd, m)) == 1) {
		json_t *js = json_object_get(*m, "seq");
		const char *type = json_string_value(json_object_get(*m, "type"));
		*seq = json_is_integer(js) ? (uint64_t)json_integer_value(js) : 0;
		*attach = type && strcmp(type, "attach") == 0;
		if (*attach) {
			json_int_t acked = json_integer_value(json_object_get(*m, "acked"));
			if ((uint64_t)acked > c->seq_done)
				c->seq_done = c->seq_acked = (uint64_t)acked;
			return 1;
		}
		if (*seq == 0 || *seq > c->seq_done)
			return 1;
		json_decref(*m);
	}
	return rc;
}

void sv_child_ack(child *c)
{
	if (c->seq_done <= c->seq_acked || c->p.sock < 0 || c->sock_eof || c->exited)
		return;
	json_t *ack = json_pack("{s:s, s:I}", "type", "ack", "seq", (json_int_t)c->seq_done);
	if (ack && msg_send(c->p.sock, ack) == 0)
		c->seq_acked = c->seq_done;
	json_decref(ack);
}
