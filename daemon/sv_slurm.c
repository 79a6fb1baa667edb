/* sv_slurm — launching a multi-node attempt through Slurm
 * (docs/multinode.md): the relay listener opened, job.json with a device
 * per world rank, the move to starting, srun spawned as the run's
 * ROLE_LAUNCHER child (outliving the daemon) and recorded in attempt.json
 * with the relay; a later daemon's adoption of such an attempt (the relay
 * opened again on its address, srun watched by pidfd); and srun's end
 * (what the ranks said last is read, their connections closed; an adopted
 * srun's status is its ranks' byes and exit records; a bad exit of srun
 * itself is the verdict).
 *
 * Never takes a device of this machine (Slurm places the ranks) and never
 * handles the ranks' connections (sv_relay; the run's on_free closes them).
 * Called by sv_launch (a start) and adopt.c (an adoption) only; srun's end
 * reaches it through its child_ops.
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/chan.h"
#include "common/exitcodes.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/procstat.h"
#include "daemon/childenv.h"
#include "daemon/cluster.h"
#include "daemon/proc.h"

extern char **environ; /* what children may inherit from (pass_env) */

/* The last non-empty line of a log file (srun's own error), or "". */
static void log_last_line(const char *path, char *out, size_t cap)
{
	out[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		if (line[0])
			snprintf(out, cap, "%s", line);
	}
	fclose(f);
}

/* <r->dir>/ch/rank-<rank>: a rank's exit record's base (common/chan.h;
 * the job directory is shared by every node). */
static void rank_base(const run *r, int rank, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/ch/rank-%d", r->dir, rank);
}

/* r's relayed rank of that rank, or NULL. */
static child *rank_child(run *r, int rank)
{
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->relayed && r->kids[i]->index == rank)
			return r->kids[i];
	return NULL;
}

static const child_ops rank_record_ops = {.on_input = sv_report_input};

/* srun is gone: what the connected ranks said last is read and their
 * connections closed; for an adopted attempt, the ranks that did not
 * say goodbye to this daemon are read from their exit records (this
 * attempt's only: the record names it), as if they had sent them. */
static void ranks_final(supervisor *sv, run *r)
{
	for (int i = 0; i < r->nkids; i++) {
		child *c = r->kids[i];
		if (c->relayed && !c->exited) {
			sv_child_drain(sv, r, c);
			sv_relay_drop(sv, c);
		}
	}
	for (int rank = 0; r->adopted && rank < r->world; rank++) {
		child *c = rank_child(r, rank);
		if (c && c->said_bye)
			continue;
		char base[1200], path[1220];
		rank_base(r, rank, base, sizeof base);
		snprintf(path, sizeof path, "%s.exit", base);
		json_t *rec = json_load_file(path, 0, NULL);
		const char *att = json_string_value(json_object_get(rec, "attempt"));
		if (!rec || !att || strcmp(att, r->ca.slurm_name) != 0) {
			json_decref(rec);
			continue;
		}
		if (!c && r->nkids < MAX_CHILDREN && (c = calloc(1, sizeof *c))) {
			*c = (child){.role = ROLE_WORKER, .index = rank, .relayed = true, .exited = true, .owner = r,
				     .ops = &rank_record_ops, .p = {.pid = 0, .pidfd = -1, .sock = -1}};
			msg_reader_init(&c->rd);
			r->kids[r->nkids++] = c;
		}
		if (c) {
			/* what an earlier daemon acknowledged is not in it; the rest is handled once */
			uint64_t acked = (uint64_t)json_integer_value(json_object_get(rec, "acked"));
			if (acked > c->seq_done)
				c->seq_done = c->seq_acked = acked;
			sv_child_exit_frames(sv, r, c, rec);
			if (!c->said_bye) { /* a record without its bye (it could not send it): its code */
				c->said_bye = true;
				c->bye_code = (int)json_integer_value(json_object_get(rec, "code"));
			}
		}
		json_decref(rec);
	}
}

/* An adopted srun's end: not this daemon's child, so its exit status is
 * not to be had. The ranks' last words are: every rank's bye (or exit
 * record) says how it ended, and srun's status is theirs (0 when all
 * ended 0; 6 when all stopped or ended 0, as asked; stopped with nobody
 * asking, past their redial bound: resumed from the checkpoint, no
 * restart counted). A rank that left neither was
 * killed or lost while no daemon watched: the attempt failed (retryable),
 * with Slurm's state of the job in the reason. */
static int adopted_srun_status(supervisor *sv, run *r, child *launcher)
{
	(void)launcher;
	ranks_final(sv, r);
	int code = BERTD_EXIT_OK, unknown = -1;
	for (int rank = 0; rank < r->world; rank++) {
		child *c = rank_child(r, rank);
		if (!c || !c->said_bye) {
			if (unknown < 0)
				unknown = rank;
			continue;
		}
		if (c->bye_code == BERTD_EXIT_STOPPED && code == BERTD_EXIT_OK)
			code = BERTD_EXIT_STOPPED;
		else if (c->bye_code != BERTD_EXIT_OK && c->bye_code != BERTD_EXIT_STOPPED)
			code = c->bye_code;
	}
	if (unknown < 0 && code == BERTD_EXIT_STOPPED && !r->stop_sent && !r->stop_why && !r->shutdown) {
		/* stopped with nobody asking: no relay answered within their bound */
		r->requeue = true;
		sv_set_failure(r, true, "the ranks stopped when no daemon answered at the relay in time; resuming from "
			       "their checkpoint");
		return W_EXITCODE(BERTD_EXIT_FAILURE, 0);
	}
	if (unknown < 0)
		return W_EXITCODE(code & 0xff, 0);
	char slurm[200] = "";
	cluster_slurm_state(&r->ca, sv->cfg.slurm_srun, sv->cfg.slurm_conf, CLUSTER_STATE_TIMEOUT_MS, slurm,
			    sizeof slurm);
	sv_set_failure(r, true, "rank %d's end is unknown (no word from it and no exit record: killed, or lost while "
		       "no daemon watched)%s%s", unknown, slurm[0] ? "; Slurm job state " : "", slurm);
	return W_EXITCODE(BERTD_EXIT_FAILURE, 0);
}

/* srun ended: what the ranks said last is read first (their error is the
 * cause), then their connections are closed; a bad exit of srun itself
 * (no nodes, a rank killed) fails the attempt with srun's own words. */
void sv_slurm_launcher_exited(supervisor *sv, run *r, int status, const char *desc)
{
	ranks_final(sv, r);
	int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	bool bad = code != BERTD_EXIT_OK && code != BERTD_EXIT_STOPPED;
	if ((!bad || r->killing) && !r->failed)
		return; /* ended well, or as bertd asked (a cancel, a stop) */
	/* what Slurm made of it: NODE_FAIL, CANCELLED, TIMEOUT, ... (blocks up to 2 s) */
	char last[400], slurm[200] = "";
	cluster_slurm_state(&r->ca, sv->cfg.slurm_srun, sv->cfg.slurm_conf, CLUSTER_STATE_TIMEOUT_MS, slurm,
			    sizeof slurm);
	if (r->failed) { /* a lost rank may be Slurm's doing: say so */
		size_t n = strlen(r->reason);
		if (cluster_state_own(slurm) && n < sizeof r->reason)
			snprintf(r->reason + n, sizeof r->reason - n, "; Slurm job state %s", slurm);
		return;
	}
	log_last_line(r->launch_log, last, sizeof last);
	sv_set_failure(r, true, "srun ended with %s%s%s%s%s", desc, last[0] ? ": " : "", last,
		       slurm[0] ? "; Slurm job state " : "", slurm);
}

/* srun: whatever it sends (nothing, as a rule) is read as a rank's would
 * be; its end is launcher_exited's first; an adopted one's status is its
 * ranks'. */
static const child_ops launcher_ops = {.on_input = sv_report_input, .on_exit = sv_slurm_launcher_exited,
				       .adopted_status = adopted_srun_status};

/* <r->dir>/attempt.json of a multi-node attempt (docs/formats.md): srun
 * by pid, start time and boot id, and the relay a later daemon opens
 * again (address, token, Slurm job name, fence). */
static int record_write(supervisor *sv, run *r)
{
	(void)sv;
	child *l = NULL;
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->role == ROLE_LAUNCHER)
			l = r->kids[i];
	if (!l)
		return -ESRCH;
	char boot[64], path[1100];
	chan_boot_id(boot, sizeof boot);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now_unix = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	json_t *rec = json_pack("{s:i, s:i, s:s, s:s, s:I, s:I, s:I, s:i, s:[], s:[{s:s, s:i, s:i, s:I}], "
				"s:{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:s}}",
				"format", 1, "proto", CHAN_PROTO, "boot_id", boot, "job", r->id, "started_unix_ms",
				(json_int_t)(now_unix - (sv_now_ms() - r->start_ms)), "runtime_base_ms",
				(json_int_t)r->runtime_base_ms, "max_runtime_ms", (json_int_t)r->max_runtime_ms,
				"world", r->world, "devices", "children", "role", "launcher", "index", 0, "pid",
				(int)l->p.pid, "start_time", (json_int_t)l->start_time, "multinode", "relay", r->ca.addr,
				"token", r->ca.token, "slurm_name", r->ca.slurm_name, "fence", r->ca.fence,
				"relay_timeout_ms", r->ca.relay_timeout_ms, "nodes", r->nodes, "per_node", r->per_node,
				"launch_log", r->launch_log);
	snprintf(path, sizeof path, "%s/attempt.json", r->dir);
	return sv_child_record_save(path, rec);
}

/* <r->dir>/ch for the ranks' exit records, an earlier attempt's gone. */
static int ranks_dir(run *r)
{
	char path[1200];
	snprintf(path, sizeof path, "%s/ch", r->dir);
	if (mkdir(path, 0750) < 0 && errno != EEXIST)
		return -errno;
	for (int rank = 0; rank < r->world; rank++) {
		rank_base(r, rank, path, sizeof path - 8);
		strcat(path, ".exit");
		unlink(path);
	}
	return 0;
}

/* A multi-node job (resources.nodes > 1): srun starts its world ranks on
 * Slurm's nodes; they join through the relay. No device of this machine is
 * taken (Slurm places the ranks). r is sv_launch_start_job's, spec checked. */
int sv_slurm_start_multinode(supervisor *sv, run *r, const store_job *j, const jobspec *spec,
			   const char *dataset_dir, const char *resume, int64_t resume_step, unsigned from)
{
	char reason[1400];
	int rc;
	r->multinode = true;
	r->on_free = sv_relay_close_all;
	r->ca.listen_fd = -1;
	r->nodes = spec->nodes;
	r->per_node = spec->gpus_per_node;
	r->world = spec->gpus;
	if (!sv->cfg.slurm_srun || !*sv->cfg.slurm_srun) {
		snprintf(reason, sizeof reason,
			 "resources.nodes is %d: multi-node jobs are started with Slurm, and this bertd has no "
			 "slurm_srun set (docs/multinode.md)", spec->nodes);
		sv_fail_job_now(sv, j->id, from, reason);
		sv_run_free(r);
		return 0;
	}
	r->rank_node = calloc((size_t)r->world, sizeof *r->rank_node);
	r->rank_sha = calloc((size_t)r->world, sizeof *r->rank_sha);
	rc = r->rank_node && r->rank_sha ? cluster_attempt_open(&r->ca, sv->cfg.relay_host, r->id) : -ENOMEM;
	if (rc == 0 && (rc = loop_add(sv->lp, r->ca.listen_fd, EPOLLIN, sv_relay_on_accept, r)) < 0)
		cluster_attempt_close(&r->ca);
	if (rc == 0 && sv->cfg.relay_timeout_ms > 0)
		r->ca.relay_timeout_ms = sv->cfg.relay_timeout_ms;
	if (rc == 0 && (rc = sv_jobfile_write(sv, r, dataset_dir, resume)) == 0 && (rc = ranks_dir(r)) == 0)
		rc = cluster_fence_open(&r->ca, r->dir); /* this attempt's ranks may write */
	if (rc < 0)
		sv_relay_close_all(sv, r);
	if (rc < 0) {
		snprintf(reason, sizeof reason, "cannot set up the multi-node attempt: %s", strerror(-rc));
		sv_fail_job_now(sv, j->id, from, reason);
		sv_run_free(r);
		return 0;
	}
	if (resume[0])
		snprintf(reason, sizeof reason, "resuming from checkpoint at step %lld on %d nodes x %d %s (Slurm)",
			 (long long)resume_step, r->nodes, r->per_node, sv_jobfile_multinode_kind(sv, r));
	else
		snprintf(reason, sizeof reason, "starting on %d nodes x %d %s (Slurm)", r->nodes, r->per_node,
			 sv_jobfile_multinode_kind(sv, r));
	if (store_job_transition(sv->st, j->id, from, JOB_STARTING, reason, NULL) < 0) {
		sv_run_free(r); /* someone canceled it meanwhile */
		return 0;
	}
	store_job_set_stall(sv->st, r->id, NULL);
	r->start_ms = r->last_msg_ms = sv_now_ms();
	r->stall_noted = -1;
	r->runtime_base_ms = j->runtime_ms;
	r->max_runtime_ms = sv_runtime_left_ms(spec, j->runtime_ms);
	r->next = sv->runs;
	sv->runs = r;

	char job_json[1200], worker_bin[1100];
	snprintf(job_json, sizeof job_json, "%s/job.json", r->dir);
	snprintf(worker_bin, sizeof worker_bin, "%s/bertd-worker", sv->bin_dir);
	snprintf(r->launch_log, sizeof r->launch_log, "%s/logs/srun.log", r->dir);
	cluster_argv av;
	bool gres = sv->cfg.slurm_gpus_per_node && strcmp(sv_jobfile_multinode_kind(sv, r), "cuda") == 0;
	cluster_srun_argv(&av, sv->cfg.slurm_srun, r->nodes, r->per_node, gres ? r->per_node : 0,
			  sv->cfg.slurm_immediate_s, &r->ca, worker_bin, job_json);
	childenv *henv = NULL;
	cluster_env *env = NULL;
	/* a rank there gets the threads a rank here would (nodes are alike) */
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int threads = strcmp(sv_jobfile_multinode_kind(sv, r), "cpu") == 0 && ncpu > 0 && sv->ndev
			      ? (int)(ncpu / (long)sv->ndev) : 1;
	if ((rc = childenv_helper(&henv, &sv->pass_env, environ)) == 0 &&
	    (rc = cluster_srun_env(&env, henv->envp, threads > 0 ? threads : 1, &r->ca, sv->cfg.slurm_conf)) == 0)
		rc = sv_child_spawn(sv, r, ROLE_LAUNCHER, 0, &launcher_ops, av.argv, env->envp, r->launch_log);
	free(env);
	free(henv);
	if (rc < 0) {
		sv_set_failure(r, false, "cannot start srun (%s): %s", sv->cfg.slurm_srun, strerror(-rc));
		sv_run_kill_all(r, SIGKILL);
		sv_run_maybe_finish(sv, r);
		return 0;
	}
	/* srun outlives the daemon (setsid, no death signal): a later
	 * daemon adopts the attempt from this record */
	if ((rc = record_write(sv, r)) < 0)
		log_warn("job %s: cannot write its attempt.json (%s): a daemon restart will not adopt it", j->id,
			 strerror(-rc));
	log_info("job %s: %s", j->id, reason);
	return 0;
}

/* o's string member key, "" when it has none. */
static const char *jstr(json_t *o, const char *key)
{
	const char *v = json_string_value(json_object_get(o, key));
	return v ? v : "";
}

/* What is left of a multi-node attempt no daemon adopts: srun, when it is
 * still the recorded process, is killed (its signal reaches every rank),
 * its Slurm job canceled by name, the fence closed. */
static void end_unadopted(supervisor *sv, const cluster_attempt *ca, pid_t pid, uint64_t st)
{
	proc p;
	if (pid > 0 && proc_adopt(&p, pid) == 0) {
		if (procstat_alive(pid, st)) /* checked after the pidfd: it names this process */
			proc_stop(&p, SIGKILL, 0);
		proc_close(&p);
	}
	if (ca->slurm_name[0] && sv->cfg.slurm_srun && *sv->cfg.slurm_srun)
		cluster_scancel(ca, sv->cfg.slurm_srun, sv->cfg.slurm_conf);
	if (ca->fence[0])
		cluster_fence_close(ca);
}

int sv_slurm_adopt(supervisor *sv, const store_job *j, json_t *rec, json_t *spec)
{
	json_t *mn = json_object_get(rec, "multinode");
	json_t *l = json_array_get(json_object_get(rec, "children"), 0);
	pid_t pid = (pid_t)json_integer_value(json_object_get(l, "pid"));
	uint64_t st = (uint64_t)json_integer_value(json_object_get(l, "start_time"));
	const char *rb = json_string_value(json_object_get(rec, "boot_id"));
	char boot[64], why[300] = "";
	chan_boot_id(boot, sizeof boot);
	run *r = calloc(1, sizeof *r);
	int rc = 0;
	if (!r) {
		json_decref(spec);
		snprintf(why, sizeof why, "out of memory");
		goto refuse;
	}
	r->sv = sv;
	r->spec = spec;
	r->on_end = sv_finish_job;
	r->on_free = sv_relay_close_all;
	r->adopted = r->multinode = true;
	r->ca.listen_fd = -1;
	snprintf(r->id, sizeof r->id, "%s", j->id);
	snprintf(r->dir, sizeof r->dir, "%s/jobs/%s", sv->state_dir, j->id);
	snprintf(r->ca.addr, sizeof r->ca.addr, "%s", jstr(mn, "relay"));
	snprintf(r->ca.token, sizeof r->ca.token, "%s", jstr(mn, "token"));
	snprintf(r->ca.slurm_name, sizeof r->ca.slurm_name, "%s",
		 jstr(mn, "slurm_name"));
	snprintf(r->ca.fence, sizeof r->ca.fence, "%s", jstr(mn, "fence"));
	snprintf(r->launch_log, sizeof r->launch_log, "%s",
		 jstr(mn, "launch_log"));
	r->ca.relay_timeout_ms = (int)json_integer_value(json_object_get(mn, "relay_timeout_ms"));
	if (r->ca.relay_timeout_ms <= 0)
		r->ca.relay_timeout_ms = CLUSTER_RELAY_TIMEOUT_MS;
	r->nodes = (int)json_integer_value(json_object_get(mn, "nodes"));
	r->per_node = (int)json_integer_value(json_object_get(mn, "per_node"));
	r->world = (int)json_integer_value(json_object_get(rec, "world"));
	if (!rb || strcmp(rb, boot) != 0) {
		snprintf(why, sizeof why, "its srun was of another boot");
		goto refuse;
	}
	if (!r->spec || r->world <= 0 || r->world > 4096 || pid <= 0 || !r->ca.slurm_name[0]) {
		snprintf(why, sizeof why, "its attempt record or stored spec is damaged");
		goto refuse;
	}
	if (!sv->cfg.slurm_srun || !*sv->cfg.slurm_srun) {
		snprintf(why, sizeof why, "this bertd has no slurm_srun set");
		goto refuse;
	}
	r->rank_node = calloc((size_t)r->world, sizeof *r->rank_node);
	r->rank_sha = calloc((size_t)r->world, sizeof *r->rank_sha);
	if (!r->rank_node || !r->rank_sha) {
		snprintf(why, sizeof why, "out of memory");
		goto refuse;
	}
	/* the ranks redial the relay's recorded address, admitted by the same token */
	if ((rc = cluster_attempt_reopen(&r->ca, sv->cfg.relay_host)) < 0 ||
	    (rc = loop_add(sv->lp, r->ca.listen_fd, EPOLLIN, sv_relay_on_accept, r)) < 0) {
		cluster_attempt_close(&r->ca);
		snprintf(why, sizeof why, "its relay cannot listen on %s again: %s", r->ca.addr, strerror(-rc));
		goto refuse;
	}
	sv_adopt_clock(r, j, rec);
	r->next = sv->runs;
	sv->runs = r;
	child *c = sv_child_new(r, ROLE_LAUNCHER, 0, &launcher_ops);
	if (!c) { /* out of memory: the attempt ends, resumed from its checkpoint */
		r->requeue = true;
		sv_set_failure(r, true, "out of memory adopting the multi-node attempt");
		end_unadopted(sv, &r->ca, pid, st);
		sv_unlink_run(sv, r);
		sv_finish_job(sv, r);
		return 1;
	}
	c->start_time = st;
	bool running = proc_adopt(&c->p, pid) == 0 && procstat_alive(pid, st); /* the pidfd first */
	char note[400];
	snprintf(note, sizeof note, "daemon restarted; adopted the multi-node attempt %s (srun %s; ranks redial the "
		 "relay at %s)", r->ca.slurm_name, running ? "running" : "ended meanwhile", r->ca.addr);
	store_job_note(sv->st, r->id, note);
	log_info("job %s: %s", r->id, note);
	if (running && sv_child_watch(sv, c) == 0)
		return 1;
	if (running) { /* not watched, it would run unjudged: ended, its attempt with it */
		log_warn("job %s: cannot watch its srun (pid %d); ending it", r->id, (int)pid);
		proc_stop(&c->p, SIGKILL, 0);
	}
	proc_close(&c->p);
	c->p = (proc){.pid = pid, .pidfd = -1, .sock = -1, .reaped = true, .adopted = true};
	sv_child_ended(sv, r, c); /* its ranks' exit records say how it ended (r may be freed) */
	return 1;
refuse:
	log_info("job %s: its multi-node attempt is not adopted: %s", j->id, why);
	if (r)
		end_unadopted(sv, &r->ca, pid, st);
	if (r) {
		cluster_attempt_close(&r->ca);
		r->on_free = NULL;
		sv_run_free(r);
	}
	return 0;
}
