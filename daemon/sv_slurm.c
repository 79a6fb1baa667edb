/* sv_slurm — launching a multi-node attempt through Slurm
 * (docs/multinode.md): the relay listener opened, job.json with a device
 * per world rank, the move to starting, srun spawned as the run's
 * ROLE_LAUNCHER child; and srun's end (what the ranks said last is read,
 * their connections closed, a bad exit of srun itself is the verdict).
 *
 * Never takes a device of this machine (Slurm places the ranks) and never
 * handles the ranks' connections (sv_relay; the run's on_free closes them).
 * Called by sv_launch only; srun's end reaches it through its child_ops.
 */
#include "daemon/sv_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/exitcodes.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "daemon/childenv.h"
#include "daemon/cluster.h"

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

/* srun ended: what the ranks said last is read first (their error is the
 * cause), then their connections are closed; a bad exit of srun itself
 * (no nodes, a rank killed) fails the attempt with srun's own words. */
void sv_slurm_launcher_exited(supervisor *sv, run *r, int status, const char *desc)
{
	for (int i = 0; i < r->nkids; i++) {
		child *c = r->kids[i];
		if (c->relayed && !c->exited) {
			sv_child_drain(sv, r, c);
			sv_relay_drop(sv, c);
		}
	}
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
 * be; its end is launcher_exited's first. */
static const child_ops launcher_ops = {.on_input = sv_report_input, .on_exit = sv_slurm_launcher_exited};

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
	if (rc == 0 && (rc = sv_jobfile_write(sv, r, dataset_dir, resume)) == 0)
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
	log_info("job %s: %s", j->id, reason);
	return 0;
}
