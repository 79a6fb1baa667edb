/* Multi-node jobs on namespaced nodes (docs/multinode.md, "Namespaced
 * nodes"): multinode_ns.sh makes nodes n1 and n2 out of network, UTS and
 * mount namespaces (a veth each to a bridge, hostname n1/n2, a private
 * /dev/shm and /tmp), slurmctld and munged in a head namespace; this test
 * process enters the head namespace, so bertd and srun run there too, and
 * the network faults happen on the bridge (link down, nftables) while
 * every process lives on:
 *   - 1% loss on n2's link: 2 nodes x 1 rank trains bit for bit what
 *     1 node x 2 ranks trains, rank 0 on n1, rank 1 on n2;
 *   - n2's link cut mid-training: the attempt fails through the relay's
 *     keepalive bound (relay_timeout_s, "rank 1 on node n2 was lost"), not
 *     the stall watch; n2's rank, out of Slurm's reach, ends by itself; the
 *     link back, the job resumes from its checkpoint and ends bit-identical
 *     to the undisturbed run; the attempt fence then names no attempt;
 *   - link flaps shorter than relay_timeout_s: the job goes on (no
 *     restart); then a partition between n1 and n2 only, lifted after a
 *     while: the job ends completed, bit-identical;
 *   - Slurm cancels the job (scancel): the failure names Slurm's job state;
 *   - the attempt fence, staged (shared /dev/shm only): n1 cut off while
 *     both ranks go on training; the stale rank 0 there puts no checkpoint
 *     or export in place after the daemon failed its attempt.
 * BERTD_NS_SHM=shared runs the nodes on the host's /dev/shm (the ranks'
 * shm all-reduce then spans them, as in integration_multinode); the
 * default, private, needs a network data plane between the ranks. Root
 * only; skips (77) elsewhere or without Slurm, nftables or namespaces.
 * Waiting is polling with deadlines; assertions are on states, events,
 * processes and bytes. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300
#define RELAY_TIMEOUT_S "5"

typedef struct fx {
	bertd d;
	char data[160];
	char slurm[160]; /* the cluster's directory (namespaces under ns/) */
	char conf[200];
	char ref[65];    /* the undisturbed 1 x 2 run of LONG_SPEC, once made */
	char no_plane[600]; /* why the first 2-node job failed, when it did: the rest would only wait */
} fx;

static const char *script(void)
{
	const char *s = getenv("BERTD_MULTINODE_NS");
	return s ? s : "tests/integration/multinode_ns.sh";
}

static bool shared_shm(void)
{
	const char *m = getenv("BERTD_NS_SHM");
	return m && strcmp(m, "shared") == 0;
}

/* multinode_ns.sh <what> <cluster dir> <args>; its exit status. */
static int ns(fx *f, const char *what, const char *args)
{
	char cmd[800];
	snprintf(cmd, sizeof cmd, "%s %s %s %s", script(), what, f->slurm, args);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int setup(void **state)
{
	fx *f = calloc(1, sizeof *f);
	if (!f || bertd_init(&f->d))
		return -1;
	*state = f;
	snprintf(f->data, sizeof f->data, "%s/data", f->d.root);
	snprintf(f->slurm, sizeof f->slurm, "%s/slurm", f->d.root);
	snprintf(f->conf, sizeof f->conf, "%s/slurm.conf", f->slurm);
	mkdir(f->data, 0700);
	mkdir(f->slurm, 0700);
	char cmd[800];
	/* the cluster goes when this process goes, however it ends */
	/* the network backend's waits: 10 s (Slurm's TaskProlog sets it in
	 * every task), so a rank cut off from its peer gives up in seconds; a
	 * 1 s flap still passes */
	snprintf(cmd, sizeof cmd,
		 "BERTD_NS_OWNER=%d BERTD_NS_SHARED=%s BERTD_NS_TASK_ENV=BERTD_COMM_TIMEOUT_MS=10000 %s start %s 2 %s "
		 ">/dev/null", (int)getpid(), f->d.root, script(), f->slurm, shared_shm() ? "shared-shm" : "private-shm");
	if (system(cmd) != 0) {
		fprintf(stderr, "the namespaced cluster did not start (%s)\n", cmd);
		return -1;
	}
	/* from here on this process, bertd and srun are on the head node */
	snprintf(cmd, sizeof cmd, "%s/ns/head", f->slurm);
	int fd = open(cmd, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
		fprintf(stderr, "cannot enter the head namespace %s: %s\n", cmd, strerror(errno));
		return -1;
	}
	close(fd);
	const char *extra[] = {"--data-roots", f->data, "--devices", "cpu", "--cpu-slots", "2",
			       "--schedule", "true", "--stop-timeout-s", "60", "--slurm-srun", "/usr/bin/srun",
			       "--slurm-conf", f->conf, "--relay-host", "10.213.77.1",
			       "--relay-timeout-s", RELAY_TIMEOUT_S, "--slurm-immediate-s", "60", NULL};

	if (bertd_start(&f->d, extra))
		return -1;
	it_make_corpus(f->data, "shakes.txt", 3000);
	if (it_add_dataset(&f->d,
			   "{\"name\":\"shakes\",\"source\":\"shakes.txt\",\"vocab\":{\"train\":{\"vocab_size\":400}}}"))
		return -1;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	return 0;
}

static int teardown(void **state)
{
	fx *f = *state;
	int rc = it_daemon_finish(&f->d); /* first: its srun and ranks */
	char cmd[800];
	snprintf(cmd, sizeof cmd, "BERTD_NS_OWNER=%d %s stop %s", (int)getpid(), script(), f->slurm);
	if (system(cmd) != 0)
		rc = -1;
	free(f);
	return rc;
}

/* it_job_spec's tiny job on shakes for steps steps saving every save; res
 * is the resources object, then more overrides (dotted path, JSON text) up
 * to the NULL; caller frees. */
#define JOB(name, steps, save, res, ...)                                                                \
	it_job_spec(name, "shakes", "training_args.max_steps", steps, "training_args.save_steps", save, \
		    "resources", res, __VA_ARGS__)
#define ONE_NODE "{\"gpus\":2}"
#define TWO_NODES "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cpu\"}"
/* 60 steps, a checkpoint every 10; 100 ms more per batch (a slow source, no
 * effect on the numbers) keeps the job running for seconds after step 15,
 * where the faults come. */
#define LONG_SPEC(name, res) \
	JOB(name, "60", "10", res, "retry_policy", "{\"max_restarts\":3}", "profiler", "{\"simulate_data_delay_ms\":100}", NULL)

/* Submits spec and frees it; returns the job's id (caller frees). */
static char *submit(fx *f, char *spec)
{
	char *id = it_submit(&f->d, spec);
	free(spec);
	return id;
}

/* Runs spec (freed) to completed: the export's sha256 into sha. */
static void run_to_end(fx *f, char *spec, char sha[65], char **id_out)
{
	char *id = submit(f, spec);
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->d, j);
	it_sha_of_export(j, sha);
	json_decref(j);
	if (id_out)
		*id_out = id;
	else
		free(id);
}

/* The undisturbed run the fault tests end equal to (made once). */
static const char *reference(fx *f)
{
	if (!f->ref[0])
		run_to_end(f, LONG_SPEC("ref-1x2", ONE_NODE), f->ref, NULL);
	return f->ref;
}

static int env_of(pid_t pid, const char *name, char *out, size_t cap)
{
	char path[64], buf[65536];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	FILE *fp = fopen(path, "r");
	if (!fp)
		return -1;
	size_t n = fread(buf, 1, sizeof buf - 1, fp);
	fclose(fp);
	buf[n] = 0;
	size_t nl = strlen(name);
	for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
		if (strncmp(buf + i, name, nl) == 0 && buf[i + nl] == '=') {
			snprintf(out, cap, "%s", buf + i + nl + 1);
			return 0;
		}
	return -1;
}

static bool alive(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *fp = fopen(path, "r");
	if (!fp)
		return false;
	size_t n = fread(buf, 1, sizeof buf - 1, fp);
	fclose(fp);
	buf[n] = 0;
	char *rp = strrchr(buf, ')');
	return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

static pid_t rank_on(const char *id, const char *node)
{
	pid_t p[16];
	int n = it_find_pids("bertd-worker", id, p, 16);
	for (int i = 0; i < n; i++) {
		char v[64];
		if (env_of(p[i], "SLURMD_NODENAME", v, sizeof v) == 0 && strcmp(v, node) == 0)
			return p[i];
	}
	return -1;
}

/* Whether pid's namespace of kind ("net", "uts", "mnt") is not this process's. */
static bool other_ns(pid_t pid, const char *kind)
{
	char a[64], b[64];
	struct stat sa, sb;
	snprintf(a, sizeof a, "/proc/%d/ns/%s", (int)pid, kind);
	snprintf(b, sizeof b, "/proc/self/ns/%s", kind);
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_ino != sb.st_ino;
}

static long job_int(const json_t *j, const char *key)
{
	return (long)json_integer_value(json_object_get(j, key));
}

static long restarts(fx *f, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *j = it_get_json(&f->d, path);
	long n = job_int(j, "restart_count");
	json_decref(j);
	return n;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Seconds of the day (UTC) of the first line of bertd's log containing
 * text ("2026-12-02T00:03:17.270Z ..."), or -1. */
static double log_time_of(fx *f, const char *text)
{
	char path[300], line[1024];
	snprintf(path, sizeof path, "%s/bertd.log", f->d.root);
	FILE *fp = fopen(path, "r");
	double t = -1;
	while (fp && t < 0 && fgets(line, sizeof line, fp)) {
		int h, m;
		double sec;
		if (strstr(line, text) && sscanf(line, "%*d-%*d-%*dT%d:%d:%lfZ", &h, &m, &sec) == 3)
			t = h * 3600.0 + m * 60.0 + sec;
	}
	if (fp)
		fclose(fp);
	return t;
}

static double day_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)(ts.tv_sec % 86400) + ts.tv_nsec * 1e-9;
}

static void dump(fx *f, const char *id)
{
	json_t *ev = it_events_of(&f->d, id);
	char *s = json_dumps(ev, JSON_INDENT(1));
	fprintf(stderr, "events: %s\n", s);
	free(s);
	json_decref(ev);
	bertd_print_log(&f->d);
}

/* 1% loss on n2's link: 2 x 1 == 1 x 2 bit for bit, the ranks on n1 and n2. */
static void loss_two_nodes_equal_one_node(void **state)
{
	fx *f = *state;
	char one[65], two[65], *id;
	run_to_end(f, JOB("eq-1x2", "8", "4", ONE_NODE, NULL), one, NULL);
	assert_int_equal(ns(f, "loss", "n2 1"), 0);
	id = submit(f, JOB("eq-2x1", "8", "4", TWO_NODES, "retry_policy", "{\"max_restarts\":0}", NULL));
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	assert_int_equal(ns(f, "clear", ""), 0);
	if (strcmp(it_jstr(j, "state"), "completed") != 0) {
		const char *why = json_string_value(json_object_get(j, "failure_reason"));
		snprintf(f->no_plane, sizeof f->no_plane, "%s", why ? why : it_jstr(j, "state"));
		fail_msg("2 namespaced nodes did not train (%s /dev/shm): %s", shared_shm() ? "shared" : "private",
			 f->no_plane);
	}
	it_sha_of_export(j, two);
	json_decref(j);
	json_t *ev = it_events_of(&f->d, id);
	if (!it_event_with(ev, "2 ranks joined: 0@n1 1@n2")) {
		dump(f, id);
		fail_msg("the 2-node job's events do not show its ranks on n1 and n2");
	}
	json_decref(ev);
	assert_string_equal(one, two);
	free(id);
}

/* n2's link cut at step 15: the relay's keepalive bound fails the attempt
 * (not the stall watch: stall_timeout_s is 300 s), n2's rank ends by
 * itself, and once the link is back the job resumes from its checkpoint
 * and ends as the undisturbed run. */
static void link_cut_fails_then_resumes(void **state)
{
	fx *f = *state;
	if (f->no_plane[0]) /* fails at once: each attempt would wait for the join */
		fail_msg("not run: the first 2-node job failed: %s", f->no_plane);
	const char *ref = reference(f);
	char *id = submit(f, LONG_SPEC("cut-2x1", TWO_NODES));
	it_wait_step(&f->d, id, 15, DEADLINE_S);
	pid_t r1 = rank_on(id, "n2");
	if (r1 <= 0) {
		dump(f, id);
		fail_msg("the job's rank on n2 was not found");
	}
	/* the ranks reach the relay at relay_host, the head's address */
	char relay[128];
	assert_int_equal(env_of(r1, "BERTD_RELAY", relay, sizeof relay), 0);
	assert_int_equal(strncmp(relay, "10.213.77.1:", 12), 0);
	/* a node of its own: network, hostname and mount (its /dev/shm, /tmp) */
	assert_true(other_ns(r1, "net"));
	assert_true(other_ns(r1, "uts"));
	assert_true(other_ns(r1, "mnt"));

	double t0 = mono_s(), cut_at = day_s();
	assert_int_equal(ns(f, "cut", "n2"), 0);
	json_t *ev = NULL;
	const char *why = NULL;
	while (!why && restarts(f, id) < 1 && mono_s() - t0 < DEADLINE_S) {
		json_decref(ev);
		ev = it_events_of(&f->d, id);
		why = it_event_with(ev, "was lost");
		if (!why)
			it_pause_ms(100);
	}
	json_decref(ev);
	while (restarts(f, id) < 1 && mono_s() - t0 < DEADLINE_S)
		it_pause_ms(100);
	double restarted_after = mono_s() - t0;
	ev = it_events_of(&f->d, id);
	why = it_event_with(ev, "was lost");
	if (!why) { /* the relay's bound, not the stall watch or srun, ended it */
		json_decref(ev);
		dump(f, id);
		fail_msg("the attempt did not fail through the relay after n2's link was cut");
	}
	double lost_at = log_time_of(f, "rank 1 on node n2 was lost");
	printf("link cut: rank 1 counted lost %.1f s after the cut (relay_timeout_s %s); the attempt ended, "
	       "restarted %.1f s after the cut: %s\n",
	       lost_at >= 0 ? lost_at - cut_at : -1.0, RELAY_TIMEOUT_S, restarted_after, why);
	json_decref(ev);
	/* out of Slurm's reach, n2's rank ends by itself */
	while (alive(r1) && mono_s() - t0 < DEADLINE_S)
		it_pause_ms(100);
	assert_false(alive(r1));
	printf("link cut: n2's rank ended by itself %.1f s after the cut\n", mono_s() - t0);

	assert_int_equal(ns(f, "heal", "n2"), 0);
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	if (strcmp(it_jstr(j, "state"), "completed") != 0)
		dump(f, id);
	it_assert_completed(&f->d, j);
	char sha[65];
	it_sha_of_export(j, sha);
	json_decref(j);
	ev = it_events_of(&f->d, id);
	const char *resumed = it_event_with(ev, "resuming from checkpoint at step ");
	if (!resumed) {
		json_decref(ev);
		dump(f, id);
		fail_msg("no resume from a checkpoint in the events");
	}
	printf("then: %s\n", resumed);
	json_decref(ev);
	assert_string_equal(ref, sha);
	/* the attempt fence names no attempt once the job is over */
	char path[400], line[64] = "";
	snprintf(path, sizeof path, "%s/jobs/%s/attempt", f->d.state_dir, id);
	FILE *fp = fopen(path, "r");
	assert_non_null(fp);
	assert_non_null(fgets(line, sizeof line, fp));
	fclose(fp);
	assert_string_equal(line, "over\n");
	pid_t left[4];
	assert_int_equal(it_find_pids("bertd-worker", id, left, 4), 0);
	free(id);
}

/* Flaps shorter than relay_timeout_s: the job goes on. Then n1 and n2 are
 * partitioned from each other only (both still reach the head) for a while:
 * the job ends completed, bit-identical to the undisturbed run. */
static void flaps_then_partition(void **state)
{
	fx *f = *state;
	if (f->no_plane[0])
		fail_msg("not run: the first 2-node job failed: %s", f->no_plane);
	const char *ref = reference(f);
	char *id = submit(f, LONG_SPEC("flap-2x1", TWO_NODES));
	it_wait_step(&f->d, id, 10, DEADLINE_S);
	assert_int_equal(ns(f, "flap", "n2 1000 3"), 0); /* 3 x (1 s down, 1 s up) */
	long after_flaps = restarts(f, id);
	json_t *ev = it_events_of(&f->d, id);
	if (after_flaps != 0) {
		json_decref(ev);
		dump(f, id);
		fail_msg("link flaps of 1 s (relay_timeout_s %s) failed an attempt", RELAY_TIMEOUT_S);
	}
	json_decref(ev);
	assert_int_equal(ns(f, "partition", "n1 n2"), 0);
	it_pause_ms(8000); /* the partition lasts (the fault, not a wait for a result) */
	assert_int_equal(ns(f, "clear", ""), 0);
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	if (strcmp(it_jstr(j, "state"), "completed") != 0)
		dump(f, id);
	it_assert_completed(&f->d, j);
	char sha[65];
	it_sha_of_export(j, sha);
	printf("partition n1|n2 for 8 s: %ld restart(s)\n", job_int(j, "restart_count"));
	json_decref(j);
	assert_string_equal(ref, sha);
	free(id);
}

static pid_t ppid_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *fp = fopen(path, "r");
	if (!fp)
		return -1;
	size_t n = fread(buf, 1, sizeof buf - 1, fp);
	fclose(fp);
	buf[n] = 0;
	char *rp = strrchr(buf, ')');
	int pp = -1;
	char st;
	if (!rp || sscanf(rp + 1, " %c %d", &st, &pp) != 2)
		return -1;
	return pp;
}

/* How many entries of dir start with prefix (-1: no dir). */
static int count_entries(const char *dir, const char *prefix)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "ls -1 '%s' 2>/dev/null | grep -c '^%s'", dir, prefix);
	FILE *p = popen(cmd, "r");
	int n = -1;
	if (p && fscanf(p, "%d", &n) != 1)
		n = -1;
	if (p)
		pclose(p);
	return n;
}

/* The attempt fence, staged: rank 0's node n1 is cut off while rank 1 on
 * n2 is kept alive (its slurmstepd stopped, so srun's and scancel's
 * signals do not reach it) and the ranks go on training over the shared
 * /dev/shm. The daemon fails the attempt (rank 0 lost) and closes the
 * fence; rank 0, out of everyone's reach, then sees its relay fail, stops
 * and tries its stop checkpoint (or, at the end, its export): refused. No
 * checkpoint is periodic here (save_steps 1000), so any checkpoint or
 * export in the job directory would be that stale rank's. Shared /dev/shm
 * only (with private /dev/shm the cut also stops the ranks' collectives,
 * and nothing is left to write). */
static void stranded_rank_writes_nothing(void **state)
{
	fx *f = *state;
	if (!shared_shm())
		skip();
	if (f->no_plane[0])
		fail_msg("not run: the first 2-node job failed: %s", f->no_plane);
	char *id = submit(f, JOB("fence-2x1", "200", "1000", TWO_NODES, "retry_policy", "{\"max_restarts\":3}", "profiler",
				 "{\"simulate_data_delay_ms\":100}", NULL));
	it_wait_step(&f->d, id, 15, DEADLINE_S);
	pid_t r0 = rank_on(id, "n1"), r1 = rank_on(id, "n2");
	if (r0 <= 0 || r1 <= 0) {
		dump(f, id);
		fail_msg("the job's ranks on n1 and n2 were not found");
	}
	pid_t stepd1 = ppid_of(r1);
	assert_true(stepd1 > 1);
	assert_int_equal(kill(stepd1, SIGSTOP), 0);
	assert_int_equal(ns(f, "cut", "n1"), 0);
	double t0 = mono_s();
	while (alive(r0) && mono_s() - t0 < DEADLINE_S)
		it_pause_ms(100);
	kill(stepd1, SIGCONT);
	assert_false(alive(r0));
	char dir[400], fence[400], line[64] = "";
	snprintf(dir, sizeof dir, "%s/jobs/%s", f->d.state_dir, id);
	snprintf(fence, sizeof fence, "%s/attempt", dir);
	FILE *fp = fopen(fence, "r");
	assert_non_null(fp);
	assert_non_null(fgets(line, sizeof line, fp));
	fclose(fp);
	printf("fence: rank 0 on the cut-off n1 ended %.1f s after the cut; the fence says %s", mono_s() - t0,
	       line);
	assert_string_equal(line, "over\n");
	char ck[500];
	snprintf(ck, sizeof ck, "%s/checkpoints", dir);
	int n = count_entries(ck, "ckpt-");
	if (n > 0) {
		dump(f, id);
		fail_msg("the stale rank put %d checkpoint(s) in place after its attempt was over", n);
	}
	assert_int_equal(count_entries(dir, "export$"), 0);
	assert_int_equal(ns(f, "heal", "n1"), 0); /* and the job recovers */
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->d, j);
	json_decref(j);
	free(id);
}

/* Slurm cancels the job under bertd (scancel, as an operator would): the
 * attempt's failure names Slurm's own job state, read back from Slurm. */
static void slurm_cancel_is_reported(void **state)
{
	fx *f = *state;
	if (f->no_plane[0])
		fail_msg("not run: the first 2-node job failed: %s", f->no_plane);
	char *id = submit(f, JOB("scancel-2x1", "60", "10", TWO_NODES, "retry_policy", "{\"max_restarts\":0}", "profiler",
				 "{\"simulate_data_delay_ms\":100}", NULL));
	it_wait_step(&f->d, id, 5, DEADLINE_S);
	char name[128], cmd[600];
	pid_t r0 = rank_on(id, "n1");
	assert_true(r0 > 0);
	assert_int_equal(env_of(r0, "SLURM_JOB_NAME", name, sizeof name), 0);
	snprintf(cmd, sizeof cmd, "SLURM_CONF=%s scancel --name=%s", f->conf, name);
	assert_int_equal(system(cmd), 0);
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	const char *why = json_string_value(json_object_get(j, "failure_reason"));
	printf("scancel: %s: %s\n", it_jstr(j, "state"), why ? why : "(no reason)");
	if (!why || !strstr(why, "Slurm job state CANCELLED")) {
		dump(f, id);
		fail_msg("Slurm's cancel was not reported with its job state: %s", why ? why : "(no reason)");
	}
	assert_string_equal(it_jstr(j, "state"), "failed");
	json_decref(j);
	free(id);
}

int main(void)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "%s check", script());
	int st = system(cmd);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 77)
		return 77;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(loss_two_nodes_equal_one_node),
		cmocka_unit_test(link_cut_fails_then_resumes),
		cmocka_unit_test(flaps_then_partition),
		cmocka_unit_test(slurm_cancel_is_reported),
		cmocka_unit_test(stranded_rank_writes_nothing),
	};
	return IT_RUN(tests, setup, teardown);
}
