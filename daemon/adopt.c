/* adopt — at start, before the scheduler's first tick: the attempts a
 * daemon before this one started, whose workers and loaders outlive it
 * (common/chan.h). For a job the store has starting, running or stopping,
 * the job directory's attempt.json names its processes by pid, start time
 * (/proc/PID/stat field 22) and boot id; a process that matches all three
 * is the one recorded, never a recycled pid. Then:
 *   - every process alive or ended with an exit record: the attempt is
 *     adopted, a run as sv_launch would have made it, its processes watched
 *     through pidfds (they are not this daemon's children), its workers'
 *     sockets connected: they attach (protocol version, identity) and send
 *     again what no daemon acknowledged; the ones that ended meanwhile are
 *     accounted for from their exit records (a completed job completes,
 *     with its export);
 *   - otherwise (a process gone without a record, another boot, no
 *     attempt.json, devices this daemon does not have): what is left of it
 *     is killed and the caller recovers the job as before (restarting from
 *     its last checkpoint).
 *
 * A multi-node attempt's record names its srun and its relay instead:
 * sv_slurm_adopt judges and adopts it (docs/multinode.md).
 *
 * The same for a dataset the store has preparing: its bertd-prepare, named
 * by <state_dir>/datasets/ch/<id>.attempt.json, is adopted (a run of
 * sv_prepare's) or killed, and the dataset then queued again.
 *
 * Calls sv_slurm (a multi-node attempt), sv_prepare (a dataset's run and
 * ops), sv_child, sv_finish (as the run's on_end) and sv_run; never starts a process and never decides a
 * job's or a dataset's next state itself.
 */
#include "daemon/sv_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/chan.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/procstat.h"
#include "daemon/proc.h"
#include "daemon/telemetry_sampler.h"

/* An adopted worker's or loader's messages: the same as a launched one's. */
static const child_ops adopted_ops = {.on_input = sv_report_input};

/* Whether <base>.exit is the record of the process pid started at st. */
static bool has_exit_record(const char *base, pid_t pid, uint64_t st)
{
	char path[320];
	snprintf(path, sizeof path, "%s.exit", base);
	json_t *rec = json_load_file(path, 0, NULL);
	bool ok = rec && json_integer_value(json_object_get(rec, "pid")) == pid &&
		  (uint64_t)json_integer_value(json_object_get(rec, "start_time")) == st;
	json_decref(rec);
	return ok;
}

/* Kills the processes of rec that are still the recorded ones, and waits
 * for them (their pidfds) so nothing of the attempt runs when the job is
 * started again. */
static void kill_recorded(json_t *rec)
{
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(rec, "children"), i, e) {
		pid_t pid = (pid_t)json_integer_value(json_object_get(e, "pid"));
		uint64_t st = (uint64_t)json_integer_value(json_object_get(e, "start_time"));
		proc p;
		if (pid <= 0 || proc_adopt(&p, pid) < 0)
			continue;
		if (procstat_alive(pid, st)) /* checked after the pidfd: it names this process */
			proc_stop(&p, SIGKILL, 0);
		proc_close(&p);
	}
}

/* Kills every process one of whose arguments is want (dir/job.json: a
 * worker or loader of that job; a dataset's output directory: its
 * bertd-prepare; spawned, say, just before the daemon died and before its
 * attempt record named it), through a pidfd, and waits for it. */
static void kill_strays(const char *want)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 1 || pid == (long)getpid())
			continue;
		char path[64], cmd[4096];
		snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, cmd, sizeof cmd - 1);
		close(fd);
		bool match = false;
		for (ssize_t k = 0; k < n; k += (ssize_t)strlen(cmd + k) + 1) {
			cmd[n] = 0;
			if (strcmp(cmd + k, want) == 0)
				match = true;
		}
		proc p;
		if (!match || proc_adopt(&p, (pid_t)pid) < 0)
			continue;
		log_warn("killing pid %ld, left of %s's attempt", pid, want);
		proc_stop(&p, SIGKILL, 0);
		proc_close(&p);
	}
	if (d)
		closedir(d);
}

static int connect_chan(const char *base)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int n = snprintf(sa.sun_path, sizeof sa.sun_path, "%s.sock", base);
	if (n < 0 || (size_t)n >= sizeof sa.sun_path)
		return -ENAMETOOLONG;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

/* The stored spec, normalized again (as sv_launch reads it). */
static json_t *spec_load(const char *text)
{
	json_t *in = json_loads(text, 0, NULL), *out = NULL;
	jobspec_error jerr;
	if (in && jobspec_normalize(in, &out, &jerr) < 0)
		out = NULL;
	json_decref(in);
	return out;
}

/* Whether rec's attempt can be adopted: same boot, its devices free here,
 * every process alive with its identity or ended with an exit record. */
static bool adoptable(supervisor *sv, json_t *rec, char *why, size_t cap)
{
	char boot[64];
	chan_boot_id(boot, sizeof boot);
	const char *rb = json_string_value(json_object_get(rec, "boot_id"));
	if (!rb || strcmp(rb, boot) != 0) {
		snprintf(why, cap, "its processes were of another boot");
		return false;
	}
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(rec, "devices"), i, e) {
		json_int_t d = json_integer_value(e);
		if (!json_is_integer(e) || d < 0 || (size_t)d >= sv->ndev || sv->dev_job[d]) {
			snprintf(why, cap, "its device %lld is not one this daemon has free", (long long)d);
			return false;
		}
	}
	json_t *kids = json_object_get(rec, "children");
	if (!json_is_array(kids) || json_array_size(kids) == 0 || json_array_size(kids) > MAX_CHILDREN) {
		snprintf(why, cap, "its attempt record names no processes");
		return false;
	}
	json_array_foreach(kids, i, e) {
		pid_t pid = (pid_t)json_integer_value(json_object_get(e, "pid"));
		uint64_t st = (uint64_t)json_integer_value(json_object_get(e, "start_time"));
		const char *base = json_string_value(json_object_get(e, "chan"));
		if (!base || pid <= 0) {
			snprintf(why, cap, "its attempt record is damaged");
			return false;
		}
		if (!procstat_alive(pid, st) && !has_exit_record(base, pid, st)) {
			snprintf(why, cap, "its %s %lld ended with no exit record while no daemon watched",
				 json_string_value(json_object_get(e, "role")),
				 (long long)json_integer_value(json_object_get(e, "index")));
			return false;
		}
	}
	return true;
}

/* The run of j's attempt as rec describes it, linked into sv->runs, its
 * live processes watched; those that ended meanwhile handled last. */
static void adopt_run(supervisor *sv, const store_job *j, json_t *rec)
{
	run *r = calloc(1, sizeof *r);
	child *ended[MAX_CHILDREN];
	int nended = 0;
	if (!r)
		return;
	r->sv = sv;
	r->on_end = sv_finish_job;
	r->adopted = true;
	snprintf(r->id, sizeof r->id, "%s", j->id);
	snprintf(r->dir, sizeof r->dir, "%s/jobs/%s", sv->state_dir, j->id);
	r->spec = spec_load(j->spec_json);
	r->world = (int)json_integer_value(json_object_get(rec, "world"));
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(rec, "devices"), i, e) {
		if (r->ndev < 64)
			r->dev[r->ndev++] = (int)json_integer_value(e);
	}
	for (int k = 0; k < r->ndev; k++)
		sv->dev_job[r->dev[k]] = strdup(r->id);
	sv_adopt_clock(r, j, rec);
	unsigned nvidx[64];
	int ngpu = 0;
	for (int k = 0; k < r->ndev; k++)
		if (sv->devs[r->dev[k]].kind == DEVICE_CUDA)
			nvidx[ngpu++] = (unsigned)sv->devs[r->dev[k]].index;
	if (tsampler_create(&r->ts, nvidx, ngpu) < 0)
		r->ts = NULL;
	r->next = sv->runs;
	sv->runs = r;

	int live = 0;
	json_array_foreach(json_object_get(rec, "children"), i, e) {
		const char *role = json_string_value(json_object_get(e, "role"));
		bool worker = role && strcmp(role, "worker") == 0;
		child *c = sv_child_new(r, worker ? ROLE_WORKER : ROLE_LOADER,
					(int)json_integer_value(json_object_get(e, "index")), &adopted_ops);
		if (!c)
			break;
		pid_t pid = (pid_t)json_integer_value(json_object_get(e, "pid"));
		c->start_time = (uint64_t)json_integer_value(json_object_get(e, "start_time"));
		snprintf(c->chan_base, sizeof c->chan_base, "%s", json_string_value(json_object_get(e, "chan")));
		/* the pidfd first, the identity after: then the pidfd is that process */
		if (proc_adopt(&c->p, pid) < 0 || !procstat_alive(pid, c->start_time)) {
			proc_close(&c->p);
			c->p = (proc){.pid = pid, .pidfd = -1, .sock = -1, .reaped = true, .adopted = true};
			ended[nended++] = c;
			continue;
		}
		if (worker) {
			int fd = connect_chan(c->chan_base);
			if (fd < 0)
				log_warn("job %s: rank %d's socket %s.sock: %s; watching its process only", r->id,
					 c->index, c->chan_base, strerror(-fd));
			c->p.sock = fd;
		}
		if (sv_child_watch(sv, c) < 0)
			log_warn("job %s: cannot watch its %s %d", r->id, role, c->index);
		live++;
	}
	char note[200];
	snprintf(note, sizeof note, "daemon restarted; adopted the running attempt (%d process(es) running, %d ended "
		 "meanwhile)", live, nended);
	store_job_note(sv->st, r->id, note);
	log_info("job %s: %s", r->id, note);
	sv_preempt_adopted(sv, r); /* it was stopping for a preemption: asked again */
	/* the last of them may end the run (and free r) */
	for (int k = 0; k < nended; k++)
		sv_child_ended(sv, r, ended[k]);
}

int sv_adopt_job(supervisor *sv, const store_job *j)
{
	char dir[1100], path[1200], why[300];
	snprintf(dir, sizeof dir, "%s/jobs/%s", sv->state_dir, j->id);
	snprintf(path, sizeof path, "%s/attempt.json", dir);
	json_t *rec = json_load_file(path, 0, NULL);
	int rc = 0;
	snprintf(path, sizeof path, "%s/job.json", dir);
	if (!rec) {
		kill_strays(path);
		return 0;
	}
	if (json_object_get(rec, "multinode")) { /* srun and a relay: sv_slurm's */
		rc = sv_slurm_adopt(sv, j, rec, spec_load(j->spec_json));
		if (rc == 0)
			kill_strays(path);
		goto out;
	}
	if (!adoptable(sv, rec, why, sizeof why)) {
		log_info("job %s: its attempt is not adopted: %s", j->id, why);
		kill_recorded(rec);
		kill_strays(path);
		goto out;
	}
	adopt_run(sv, j, rec);
	rc = 1;
out:
	json_decref(rec);
	return rc;
}

/* ds's bertd-prepare, as its attempt record names it: adopted (a run of
 * sv_prepare's, its process watched, its socket connected; or, ended
 * meanwhile, accounted for from its exit record), or killed if anything
 * of it is left (the dataset is then queued again by sv_prepare_recover). */
static void adopt_dataset(supervisor *sv, const store_dataset *ds)
{
	char path[1200], outdir[1200], why[300] = "out of memory";
	sv_prepare_record_path(sv, ds->id, ".attempt.json", path, sizeof path);
	snprintf(outdir, sizeof outdir, "%s/datasets/%s", sv->dataset_root, ds->name);
	json_t *rec = json_load_file(path, 0, NULL);
	run *r = NULL;
	if (!rec) {
		/* "queued": no daemon started it; else it may have died before the record */
		if (!ds->phase || strcmp(ds->phase, "queued") != 0)
			kill_strays(outdir);
		return;
	}
	if (!adoptable(sv, rec, why, sizeof why) || !(r = sv_prepare_run_new(sv, ds)) || !r->spec) {
		log_info("dataset %s: its bertd-prepare is not adopted: %s; preparing it again", ds->id,
			 r ? "its stored request is unreadable" : why);
		if (r)
			sv_run_free(r);
		kill_recorded(rec);
		kill_strays(outdir);
		unlink(path);
		goto out;
	}
	r->adopted = true;
	r->next = sv->runs;
	sv->runs = r;
	json_t *e = json_array_get(json_object_get(rec, "children"), 0);
	child *c = sv_child_new(r, ROLE_PREPARE, 0, &sv_prepare_ops);
	if (!c) { /* out of memory: it ends as killed, and is prepared again */
		kill_recorded(rec);
		sv_set_failure(r, true, "out of memory adopting its bertd-prepare");
		r->prep_signaled = true;
		sv_run_maybe_finish(sv, r);
		goto out;
	}
	pid_t pid = (pid_t)json_integer_value(json_object_get(e, "pid"));
	c->start_time = (uint64_t)json_integer_value(json_object_get(e, "start_time"));
	snprintf(c->chan_base, sizeof c->chan_base, "%s", json_string_value(json_object_get(e, "chan")));
	/* the pidfd first, the identity after: then the pidfd is that process */
	if (proc_adopt(&c->p, pid) < 0 || !procstat_alive(pid, c->start_time)) {
		proc_close(&c->p);
		c->p = (proc){.pid = pid, .pidfd = -1, .sock = -1, .reaped = true, .adopted = true};
		log_info("dataset %s: daemon restarted; its bertd-prepare (pid %d) ended meanwhile", r->id, (int)pid);
		sv_child_ended(sv, r, c); /* its exit record: ready, or failed (r is freed) */
		goto out;
	}
	int fd = connect_chan(c->chan_base);
	if (fd < 0)
		log_warn("dataset %s: bertd-prepare's socket %s.sock: %s; watching its process only", r->id,
			 c->chan_base, strerror(-fd));
	c->p.sock = fd;
	if (sv_child_watch(sv, c) < 0)
		log_warn("dataset %s: cannot watch its bertd-prepare", r->id);
	log_info("dataset %s: daemon restarted; adopted its running bertd-prepare (pid %d)", r->id, (int)pid);
out:
	json_decref(rec);
}

void sv_adopt_datasets(supervisor *sv)
{
	store_dataset *ds = NULL;
	size_t n = 0;
	if (store_dataset_list(sv->st, &ds, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++)
		if (ds[i].state == DATASET_PREPARING)
			adopt_dataset(sv, &ds[i]);
	store_datasets_free(ds, n);
}
