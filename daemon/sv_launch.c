/* sv_launch — starting an attempt of a job: its stored spec read again,
 * its datasets checked, the checkpoint it resumes from picked and checked
 * (or init_from's), job.json written, the job moved to starting, then its
 * loaders and local ranks spawned on the devices the scheduler picked, each
 * with its environment (daemon/childenv.h). A multi-node job is handed to
 * sv_slurm after the common part.
 *
 * Never picks devices (the tick and sched_pick do) and never decides how an
 * attempt ends (the run's on_end, set here, is sv_finish's); a job that
 * cannot start fails here, before any process.
 */
#include "daemon/sv_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "daemon/childenv.h"
#include "daemon/resume.h"
#include "daemon/telemetry_sampler.h"

extern char **environ; /* what children may inherit from (pass_env) */

/* A local rank or a loader: its messages (sv_report); its exit is the
 * common one. */
static const child_ops local_ops = {.on_input = sv_report_input};

static void job_dir(supervisor *sv, const char *id, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s/jobs/%s", sv->state_dir, id);
	(void)n;
}

static int cmp_step_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x < y) - (x > y);
}

/* The checkpoint job id resumes from: the newest one that resume_check
 * passes, among the store's rows and the complete directories under ckdir
 * (a stop checkpoint written while the daemon drained may have no row).
 * One found only on disk gets its row; an unusable one (truncated, damaged)
 * loses its row and is noted as a job event, and the next older is tried.
 * path "" and *step 0 when there is none. */
static void pick_resume(supervisor *sv, const char *id, const char *ckdir, char *path, size_t cap,
			int64_t *step)
{
	store_checkpoint *cks = NULL;
	size_t nrow = 0, ndisk = 0;
	int64_t *disk = NULL;
	path[0] = 0;
	*step = 0;
	if (store_checkpoint_list(sv->st, id, &cks, &nrow) < 0)
		nrow = 0;
	if (resume_scan(ckdir, &disk, &ndisk) < 0)
		ndisk = 0;
	int64_t *steps = calloc(nrow + ndisk + 1, sizeof *steps);
	size_t n = 0;
	for (size_t i = 0; steps && i < nrow; i++)
		steps[n++] = cks[i].step;
	for (size_t i = 0; steps && i < ndisk; i++)
		steps[n++] = disk[i];
	if (n)
		qsort(steps, n, sizeof *steps, cmp_step_desc);
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && steps[i] == steps[i - 1])
			continue;
		const store_checkpoint *row = NULL;
		for (size_t k = 0; k < nrow; k++)
			if (cks[k].step == steps[i])
				row = &cks[k];
		char dir[1200], why[600], note[1400];
		if (row)
			snprintf(dir, sizeof dir, "%s", row->path);
		else
			snprintf(dir, sizeof dir, "%s/ckpt-%lld", ckdir, (long long)steps[i]);
		int rc = resume_check(dir, steps[i], why, sizeof why);
		if (rc == 0) {
			if (!row) {
				store_checkpoint ck = {.step = steps[i], .path = dir, .bytes = fs_dir_bytes(dir)};
				store_checkpoint_insert(sv->st, id, &ck);
				snprintf(note, sizeof note,
					 "checkpoint at step %lld found in the job directory without a record (its "
					 "report was lost); recorded it",
					 (long long)steps[i]);
				store_job_note(sv->st, id, note);
				log_info("job %s: %s", id, note);
			}
			snprintf(path, cap, "%s", dir);
			*step = steps[i];
			break;
		}
		if (!row && rc == -ENOENT)
			continue; /* its DONE went away since the scan: not a checkpoint */
		snprintf(note, sizeof note, "checkpoint at step %lld is unusable (%s); trying an older one",
			 (long long)steps[i], why);
		store_job_note(sv->st, id, note);
		log_warn("job %s: %s", id, note);
		if (row)
			store_checkpoint_delete(sv->st, id, steps[i]);
	}
	free(steps);
	free(disk);
	store_checkpoints_free(cks, nrow);
}

/* A stored spec, normalized again: a job queued by an older bertd lacks
 * keys added since, and normalizing an effective spec only fills those
 * defaults (docs/jobspec.md). NULL when it is not JSON or not a valid spec. */
static json_t *stored_spec_load(const char *spec_json)
{
	json_t *in = json_loads(spec_json, 0, NULL), *out = NULL;
	jobspec_error jerr;
	if (in && jobspec_normalize(in, &out, &jerr) < 0)
		out = NULL;
	json_decref(in);
	return out;
}

/* init_from_restore "all": dir, a .../ckpt-<step> of another job, as the
 * checkpoint to resume from, checked as one of the job's own would be.
 * 0 with path and *step set, or -EINVAL with reason. */
static int restore_from_init(const char *dir, char *path, size_t cap, int64_t *step, char *reason, size_t rcap)
{
	const char *base = strrchr(dir, '/');
	long long s;
	char tail, why[1100];
	if (!base || sscanf(base, "/ckpt-%lld%c", &s, &tail) != 1 || s < 0)
		snprintf(why, sizeof why, "%s is not a .../ckpt-<step> directory", dir);
	else if (resume_check(dir, s, why, sizeof why) == 0) {
		snprintf(path, cap, "%s", dir);
		*step = s;
		return 0;
	}
	snprintf(reason, rcap, "init_from_restore \"all\": the checkpoint to continue from is unusable (%s)", why);
	return -EINVAL;
}

int sv_launch_start_job(supervisor *sv, const store_job *j, const int *dev, int ndev, bool resumed)
{
	char reason[1400];
	run *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->sv = sv;
	r->on_end = sv_finish_job;
	snprintf(r->id, sizeof r->id, "%s", j->id);
	job_dir(sv, j->id, r->dir, sizeof r->dir);
	r->spec = stored_spec_load(j->spec_json);
	jobspec spec;
	jobspec_error jerr;
	unsigned from = JOB_MASK(resumed ? JOB_RESTARTING : JOB_QUEUED);
	if (!r->spec || jobspec_from_json(r->spec, &spec, &jerr) < 0) {
		sv_fail_job_now(sv, j->id, from, "stored job spec is unreadable");
		sv_run_free(r);
		return 0;
	}
	/* every dataset of the job (a mixture's components) exists and is ready */
	for (int k = 0; k < spec.n_datasets; k++) {
		store_dataset ds;
		const char *dn = spec.datasets[k].name;
		if (store_dataset_get_by_name(sv->st, dn, &ds) < 0) {
			snprintf(reason, sizeof reason, "dataset \"%s\" does not exist (POST /v1/datasets first)", dn);
			sv_fail_job_now(sv, j->id, from, reason);
			sv_run_free(r);
			return 0;
		}
		bool ready = ds.state == DATASET_READY;
		store_dataset_free(&ds);
		if (!ready) {
			snprintf(reason, sizeof reason, "dataset \"%s\" is not ready", dn);
			sv_fail_job_now(sv, j->id, from, reason);
			sv_run_free(r);
			return 0;
		}
	}
	/* the first component's; sv_jobfile_write adds a mixture's "dataset_dirs" */
	char dataset_dir[1200];
	snprintf(dataset_dir, sizeof dataset_dir, "%s/datasets/%s", sv->dataset_root, spec.datasets[0].name);

	char logs[1100], ckdir[1100];
	snprintf(logs, sizeof logs, "%s/logs", r->dir);
	snprintf(ckdir, sizeof ckdir, "%s/checkpoints", r->dir);
	int rc;
	if ((rc = fs_mkdir_p(logs, 0750)) < 0 || (rc = fs_mkdir_p(ckdir, 0750)) < 0) {
		snprintf(reason, sizeof reason, "cannot create %s: %s", r->dir, strerror(-rc));
		sv_fail_job_now(sv, j->id, from, reason);
		sv_run_free(r);
		return 0;
	}
	char resume[1200];
	int64_t resume_step;
	pick_resume(sv, j->id, ckdir, resume, sizeof resume, &resume_step);
	/* init_from_restore "all": until it has checkpoints of its own, the job
	 * resumes from init_from's (docs/jobspec.md#init_from) */
	if (!resume[0] && strcmp(spec.init_from_restore, "all") == 0 &&
	    restore_from_init(spec.init_from, resume, sizeof resume, &resume_step, reason, sizeof reason) < 0) {
		sv_fail_job_now(sv, j->id, from, reason);
		sv_run_free(r);
		return 0;
	}
	if (spec.nodes > 1)
		return sv_slurm_start_multinode(sv, r, j, &spec, dataset_dir, resume, resume_step, from);
	r->world = ndev;
	r->ndev = ndev;
	memcpy(r->dev, dev, sizeof(int) * (size_t)ndev);
	if ((rc = sv_jobfile_write(sv, r, dataset_dir, resume)) < 0) {
		snprintf(reason, sizeof reason, "cannot write job.json: %s", strerror(-rc));
		sv_fail_job_now(sv, j->id, from, reason);
		sv_run_free(r);
		return 0;
	}
	if (resume[0])
		snprintf(reason, sizeof reason, "resuming from checkpoint at step %lld on %d device(s)",
			 (long long)resume_step, ndev);
	else
		snprintf(reason, sizeof reason, "starting on %d %s device(s)", ndev,
			 device_kind_name(sv->devs[dev[0]].kind));
	if (spec.max_runtime_seconds > 0 && j->runtime_ms > 0) {
		size_t used = strlen(reason);
		snprintf(reason + used, sizeof reason - used, "; %.1f s of stopping_condition.max_runtime_seconds left "
			 "(%.1f s used)", (double)sv_runtime_left_ms(&spec, j->runtime_ms) / 1000.0,
			 (double)j->runtime_ms / 1000.0);
	}
	if (store_job_transition(sv->st, j->id, from, JOB_STARTING, reason, NULL) < 0) {
		sv_run_free(r); /* someone canceled it meanwhile */
		return 0;
	}
	for (int i = 0; i < ndev; i++)
		sv->dev_job[dev[i]] = strdup(r->id);
	store_job_set_stall(sv->st, r->id, NULL); /* a suspect of an attempt before (a daemon that died) */
	json_t *dj = json_array();
	for (int i = 0; i < ndev; i++)
		json_array_append_new(dj, json_pack("{s:i, s:s, s:i, s:s}", "id", dev[i], "kind",
						    device_kind_name(sv->devs[dev[i]].kind), "index",
						    sv->devs[dev[i]].index, "name", sv->devs[dev[i]].name));
	char *djs = json_dumps(dj, JSON_COMPACT);
	store_job_set_devices(sv->st, r->id, djs);
	free(djs);
	json_decref(dj);
	unsigned nvidx[64];
	int ngpu = 0;
	for (int i = 0; i < ndev; i++)
		if (sv->devs[dev[i]].kind == DEVICE_CUDA)
			nvidx[ngpu++] = (unsigned)sv->devs[dev[i]].index;
	if (tsampler_create(&r->ts, nvidx, ngpu) < 0)
		r->ts = NULL; /* telemetry is optional; training is not */
	r->start_ms = r->last_msg_ms = sv_now_ms();
	r->stall_noted = -1;
	r->runtime_base_ms = j->runtime_ms;
	r->max_runtime_ms = sv_runtime_left_ms(&spec, j->runtime_ms);
	r->next = sv->runs;
	sv->runs = r;

	char job_json[1200], worker_bin[1100], loader_bin[1100];
	snprintf(job_json, sizeof job_json, "%s/attempt.json", r->dir);
	unlink(job_json); /* an earlier attempt's: these processes are not it */
	snprintf(job_json, sizeof job_json, "%s/job.json", r->dir);
	snprintf(worker_bin, sizeof worker_bin, "%s/bertd-worker", sv->bin_dir);
	snprintf(loader_bin, sizeof loader_bin, "%s/bertd-loader", sv->bin_dir);
	int threads = 1;
	{
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		if (sv->devs[dev[0]].kind == DEVICE_CPU && ncpu > 0)
			threads = (int)(ncpu / (long)sv->ndev) > 0 ? (int)(ncpu / (long)sv->ndev) : 1;
	}
	for (int l = 0; l < spec.training.dataloader_num_workers && rc == 0; l++) {
		char idx[16], cnt[16], logp[1200];
		snprintf(idx, sizeof idx, "%d", l);
		snprintf(cnt, sizeof cnt, "%d", spec.training.dataloader_num_workers);
		snprintf(logp, sizeof logp, "%s/loader-%d.log", logs, l);
		char *argv[] = {loader_bin, "--job", job_json, "--index", idx, "--count", cnt, NULL};
		childenv *env;
		if ((rc = childenv_helper(&env, &sv->pass_env, environ)) < 0)
			break;
		rc = sv_child_spawn(sv, r, ROLE_LOADER, l, &local_ops, argv, env->envp, logp);
		free(env);
	}
	for (int k = 0; k < ndev && rc == 0; k++) {
		const device *d = &sv->devs[dev[k]];
		char rank[16], logp[1200];
		snprintf(rank, sizeof rank, "%d", k);
		snprintf(logp, sizeof logp, "%s/worker-%d.log", logs, k);
		char *argv[] = {worker_bin, "--job", job_json, "--rank", rank, NULL};
		childenv *env;
		if ((rc = childenv_worker(&env, &sv->pass_env, d, threads, environ)) < 0)
			break;
		rc = sv_child_spawn(sv, r, ROLE_WORKER, k, &local_ops, argv, env->envp, logp);
		free(env);
	}
	if (rc < 0) {
		sv_set_failure(r, false, "cannot start the job's processes: %s", strerror(-rc));
		sv_run_kill_all(r, SIGKILL);
		sv_run_maybe_finish(sv, r);
		return 0;
	}
	/* who runs the attempt, for a daemon that starts while they run */
	if ((rc = sv_child_record_write(sv, r)) < 0)
		log_warn("job %s: cannot write its attempt.json (%s): a daemon restart will not adopt it", j->id,
			 strerror(-rc));
	log_info("job %s: %s", j->id, reason);
	return 0;
}
