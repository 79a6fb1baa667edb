/* Multi-node jobs on namespaced nodes (docs/multinode.md, "Namespaced
 * nodes"): multinode_ns.sh makes nodes n1 and n2 out of network, UTS and
 * mount namespaces (a veth each to a bridge, hostname n1/n2, a private
 * /dev/shm and /tmp), slurmctld and munged in a head namespace; this test
 * process enters the head namespace, so bertd and srun run there too, and
 * the network faults happen on the bridge (link down, nftables) while
 * every process lives on:
 *   - 1% loss and 20 ms delay on n2's link (each packet into and out of
 *     n2 held 20 ms: multinode_ns.sh delay, NFQUEUE and nfq-delay; a TCP
 *     round trip from the head to n2 measured before and with it, to show
 *     the delay is in effect): 2 nodes x 1 rank trains bit for bit what
 *     1 node x 2 ranks trains, rank 0 on n1, rank 1 on n2 (without what
 *     the delay needs, loss alone, saying so);
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
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_cluster.h"

#define DEADLINE_S 300
#define RELAY_TIMEOUT_S "5"
#define N2_ADDR "10.213.77.12"
#define DELAY_MS 20
#define RTT_PROBES 5

typedef struct fx {
	it_cluster c;
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

static int setup(void **state)
{
	fx *f = calloc(1, sizeof *f);
	if (!f || it_cluster_init(&f->c, script()))
		return -1;
	*state = f;
	/* the cluster goes when this process goes, however it ends; the
	 * network backend's waits: 10 s (Slurm's TaskProlog sets it in every
	 * task), so a rank cut off from its peer gives up in seconds; a 1 s
	 * flap still passes */
	char env[400];
	snprintf(env, sizeof env, "BERTD_NS_OWNER=%d BERTD_NS_SHARED=%s BERTD_NS_TASK_ENV=BERTD_COMM_TIMEOUT_MS=10000",
		 (int)getpid(), f->c.d.root);
	if (it_cluster_do(&f->c, env, "start", shared_shm() ? "2 shared-shm >/dev/null" : "2 private-shm >/dev/null")) {
		fprintf(stderr, "the namespaced cluster did not start (%s start %s)\n", script(), f->c.slurm);
		return -1;
	}
	/* from here on this process, bertd and srun are on the head node */
	char head[200];
	snprintf(head, sizeof head, "%s/ns/head", f->c.slurm);
	int fd = open(head, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
		fprintf(stderr, "cannot enter the head namespace %s: %s\n", head, strerror(errno));
		return -1;
	}
	close(fd);
	const char *extra[] = {"--devices", "cpu", "--cpu-slots", "2", "--relay-host", "10.213.77.1",
			       "--relay-timeout-s", RELAY_TIMEOUT_S, "--slurm-immediate-s", "60", NULL};
	return it_cluster_start_daemon(&f->c, extra, DEADLINE_S);
}

static int teardown(void **state)
{
	fx *f = *state;
	int rc = it_daemon_finish(&f->c.d); /* first: its srun and ranks */
	char env[64];
	snprintf(env, sizeof env, "BERTD_NS_OWNER=%d", (int)getpid());
	if (it_cluster_do(&f->c, env, "stop", NULL) != 0)
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

/* The undisturbed run the fault tests end equal to (made once). */
static const char *reference(fx *f)
{
	if (!f->ref[0])
		it_cluster_run_to_end(&f->c, LONG_SPEC("ref-1x2", ONE_NODE), f->ref, NULL, DEADLINE_S);
	return f->ref;
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
	json_t *j = it_get_json(&f->c.d, path);
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
	snprintf(path, sizeof path, "%s/bertd.log", f->c.d.root);
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
	json_t *ev = it_events_of(&f->c.d, id);
	char *s = json_dumps(ev, JSON_INDENT(1));
	fprintf(stderr, "events: %s\n", s);
	free(s);
	json_decref(ev);
	bertd_print_log(&f->c.d);
}

/* Whether the cluster script can stage the delay fault here (`check
 * delay`); when not, its reason into why. */
static bool delay_possible(char *why, size_t cap)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "%s check delay 2>&1", script());
	FILE *p = popen(cmd, "r");
	why[0] = '\0';
	if (p && !fgets(why, (int)cap, p))
		why[0] = '\0';
	int st = p ? pclose(p) : -1;
	why[strcspn(why, "\n")] = '\0';
	return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The shortest of RTT_PROBES TCP round trips from here (the head) to n2:
 * a connect to a port nothing listens on there (the SYN in, n2's RST
 * out), each bounded to 3 s (a lost SYN waits for its 1 s retransmit, or
 * is left out). Milliseconds, or -1 when none came back. */
static double rtt_to_n2_ms(void)
{
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9)};
	inet_pton(AF_INET, N2_ADDR, &to.sin_addr);
	double best = -1;
	for (int i = 0; i < RTT_PROBES; i++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		assert_true(fd >= 0);
		double t0 = mono_s();
		int rc = connect(fd, (struct sockaddr *)&to, sizeof to);
		if (rc < 0 && errno == EINPROGRESS) {
			struct pollfd pfd = {.fd = fd, .events = POLLOUT};
			rc = poll(&pfd, 1, 3000) == 1 ? 0 : -1;
		}
		double ms = (mono_s() - t0) * 1000;
		int err = 0;
		socklen_t len = sizeof err;
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
		close(fd);
		if (rc == 0 && err == ECONNREFUSED && (best < 0 || ms < best))
			best = ms;
	}
	return best;
}

/* How many packets nfq-delay held on node n (its exit line in
 * DIR/delay-n.log), or -1. */
static long delayed_packets(fx *f, const char *n)
{
	char path[300], line[400];
	snprintf(path, sizeof path, "%s/delay-%s.log", f->c.slurm, n);
	FILE *fp = fopen(path, "r");
	long held = -1;
	while (fp && fgets(line, sizeof line, fp))
		sscanf(line, "nfq-delay: queue %*u: %ld packets held", &held);
	if (fp)
		fclose(fp);
	return held;
}

/* 1% loss and DELAY_MS each way on n2's link: 2 x 1 == 1 x 2 bit for bit,
 * the ranks on n1 and n2; the delay shown in effect by a round trip to n2
 * (no timing asserted on the training). Loss alone when the delay fault
 * cannot be staged here (said in the output). */
static void loss_delay_two_nodes_equal_one_node(void **state)
{
	fx *f = *state;
	char one[65], two[65], *id, why[400];
	it_cluster_run_to_end(&f->c, JOB("eq-1x2", "8", "4", ONE_NODE, NULL), one, NULL, DEADLINE_S);
	bool delay = delay_possible(why, sizeof why);
	double before = delay ? rtt_to_n2_ms() : -1;
	assert_int_equal(it_cluster_do(&f->c, NULL, "loss", "n2 1"), 0);
	if (delay) {
		char args[32];
		snprintf(args, sizeof args, "n2 %d", DELAY_MS);
		assert_int_equal(it_cluster_do(&f->c, NULL, "delay", args), 0);
		double with = rtt_to_n2_ms();
		printf("delay: a TCP round trip head -> n2: %.2f ms before, %.2f ms with %d ms each way on n2's link\n",
		       before, with, DELAY_MS);
		/* the SYN is held into n2, its RST out of n2: 2 x DELAY_MS at least */
		if (before < 0 || with < 2 * DELAY_MS) {
			it_cluster_do(&f->c, NULL, "clear", ""); /* the next tests run without it */
			fail_msg("the delay is not in effect: round trip %.2f ms with %d ms each way (%.2f ms before)",
				 with, DELAY_MS, before);
		}
	} else {
		printf("loss only, no delay fault here: %s\n", why);
	}
	id = it_cluster_submit(&f->c, JOB("eq-2x1", "8", "4", TWO_NODES, "retry_policy", "{\"max_restarts\":0}",
						     "training_args.dataloader_num_workers", "2", NULL));
	json_t *j = it_wait_job(&f->c.d, id, "completed|failed|canceled", DEADLINE_S);
	assert_int_equal(it_cluster_do(&f->c, NULL, "clear", ""), 0);
	if (strcmp(it_jstr(j, "state"), "completed") != 0) {
		const char *fr = json_string_value(json_object_get(j, "failure_reason"));
		snprintf(f->no_plane, sizeof f->no_plane, "%s", fr ? fr : it_jstr(j, "state"));
		fail_msg("2 namespaced nodes did not train (%s /dev/shm): %s", shared_shm() ? "shared" : "private",
			 f->no_plane);
	}
	it_sha_of_export(j, two);
	json_decref(j);
	json_t *ev = it_events_of(&f->c.d, id);
	if (!it_event_with(ev, "2 ranks joined: 0@n1 1@n2")) {
		dump(f, id);
		fail_msg("the 2-node job's events do not show its ranks on n1 and n2");
	}
	json_decref(ev);
	if (delay) { /* the job's own traffic went through the delay, not only the probes' */
		long held = delayed_packets(f, "n2");
		printf("delay: %ld packets held on n2's link\n", held);
		assert_true(held > 2 * RTT_PROBES);
	}
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
	char *id = it_cluster_submit(&f->c, LONG_SPEC("cut-2x1", TWO_NODES));
	it_wait_step(&f->c.d, id, 15, DEADLINE_S);
	pid_t r1 = it_rank_on(id, "n2");
	if (r1 <= 0) {
		dump(f, id);
		fail_msg("the job's rank on n2 was not found");
	}
	/* the ranks reach the relay at relay_host, the head's address */
	char relay[128];
	assert_int_equal(it_env_of(r1, "BERTD_RELAY", relay, sizeof relay), 0);
	assert_int_equal(strncmp(relay, "10.213.77.1:", 12), 0);
	/* a node of its own: network, hostname and mount (its /dev/shm, /tmp) */
	assert_true(other_ns(r1, "net"));
	assert_true(other_ns(r1, "uts"));
	assert_true(other_ns(r1, "mnt"));

	double t0 = mono_s(), cut_at = day_s();
	assert_int_equal(it_cluster_do(&f->c, NULL, "cut", "n2"), 0);
	json_t *ev = NULL;
	const char *why = NULL;
	while (!why && restarts(f, id) < 1 && mono_s() - t0 < DEADLINE_S) {
		json_decref(ev);
		ev = it_events_of(&f->c.d, id);
		why = it_event_with(ev, "was lost");
		if (!why)
			it_pause_ms(100);
	}
	json_decref(ev);
	while (restarts(f, id) < 1 && mono_s() - t0 < DEADLINE_S)
		it_pause_ms(100);
	double restarted_after = mono_s() - t0;
	ev = it_events_of(&f->c.d, id);
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
	while (it_alive(r1) && mono_s() - t0 < DEADLINE_S)
		it_pause_ms(100);
	assert_false(it_alive(r1));
	printf("link cut: n2's rank ended by itself %.1f s after the cut\n", mono_s() - t0);

	assert_int_equal(it_cluster_do(&f->c, NULL, "heal", "n2"), 0);
	json_t *j = it_wait_job(&f->c.d, id, "completed|failed|canceled", DEADLINE_S);
	if (strcmp(it_jstr(j, "state"), "completed") != 0)
		dump(f, id);
	it_assert_completed(&f->c.d, j);
	char sha[65];
	it_sha_of_export(j, sha);
	json_decref(j);
	ev = it_events_of(&f->c.d, id);
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
	snprintf(path, sizeof path, "%s/jobs/%s/attempt", f->c.d.state_dir, id);
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
	char *id = it_cluster_submit(&f->c, LONG_SPEC("flap-2x1", TWO_NODES));
	it_wait_step(&f->c.d, id, 10, DEADLINE_S);
	assert_int_equal(it_cluster_do(&f->c, NULL, "flap", "n2 1000 3"), 0); /* 3 x (1 s down, 1 s up) */
	long after_flaps = restarts(f, id);
	json_t *ev = it_events_of(&f->c.d, id);
	if (after_flaps != 0) {
		json_decref(ev);
		dump(f, id);
		fail_msg("link flaps of 1 s (relay_timeout_s %s) failed an attempt", RELAY_TIMEOUT_S);
	}
	json_decref(ev);
	assert_int_equal(it_cluster_do(&f->c, NULL, "partition", "n1 n2"), 0);
	it_pause_ms(8000); /* the partition lasts (the fault, not a wait for a result) */
	assert_int_equal(it_cluster_do(&f->c, NULL, "clear", ""), 0);
	json_t *j = it_wait_job(&f->c.d, id, "completed|failed|canceled", DEADLINE_S);
	if (strcmp(it_jstr(j, "state"), "completed") != 0)
		dump(f, id);
	it_assert_completed(&f->c.d, j);
	char sha[65];
	it_sha_of_export(j, sha);
	printf("partition n1|n2 for 8 s: %ld restart(s)\n", job_int(j, "restart_count"));
	json_decref(j);
	assert_string_equal(ref, sha);
	free(id);
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
 * fence; rank 0, out of everyone's reach, then sees its relay fail,
 * redials it in vain (10 x relay_timeout_s) and trains on meanwhile, then
 * stops and tries its stop checkpoint (or, at the end, its export):
 * refused; the fence then says "over" or names the job's next attempt,
 * never rank 0's. No
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
	char *id = it_cluster_submit(&f->c, JOB("fence-2x1", "200", "1000", TWO_NODES, "retry_policy", "{\"max_restarts\":3}", "profiler",
				 "{\"simulate_data_delay_ms\":100}", NULL));
	it_wait_step(&f->c.d, id, 15, DEADLINE_S);
	pid_t r0 = it_rank_on(id, "n1"), r1 = it_rank_on(id, "n2");
	if (r0 <= 0 || r1 <= 0) {
		dump(f, id);
		fail_msg("the job's ranks on n1 and n2 were not found");
	}
	char attempt[128];
	assert_int_equal(it_env_of(r0, "BERTD_ATTEMPT", attempt, sizeof attempt), 0);
	pid_t stepd1 = it_ppid_of(r1);
	assert_true(stepd1 > 1);
	assert_int_equal(kill(stepd1, SIGSTOP), 0);
	assert_int_equal(it_cluster_do(&f->c, NULL, "cut", "n1"), 0);
	double t0 = mono_s();
	while (it_alive(r0) && mono_s() - t0 < DEADLINE_S)
		it_pause_ms(100);
	kill(stepd1, SIGCONT);
	assert_false(it_alive(r0));
	char dir[400], fence[400], line[64] = "";
	snprintf(dir, sizeof dir, "%s/jobs/%s", f->c.d.state_dir, id);
	snprintf(fence, sizeof fence, "%s/attempt", dir);
	FILE *fp = fopen(fence, "r");
	assert_non_null(fp);
	assert_non_null(fgets(line, sizeof line, fp));
	fclose(fp);
	printf("fence: rank 0 on the cut-off n1 ended %.1f s after the cut; the fence says %s", mono_s() - t0,
	       line);
	/* "over", or the next attempt's name by then (rank 0, cut off, redials
	 * its relay until the fence names another attempt): never rank 0's */
	line[strcspn(line, "\n")] = 0;
	assert_true(line[0]);
	assert_string_not_equal(line, attempt);
	char ck[500];
	snprintf(ck, sizeof ck, "%s/checkpoints", dir);
	int n = count_entries(ck, "ckpt-");
	if (n > 0) {
		dump(f, id);
		fail_msg("the stale rank put %d checkpoint(s) in place after its attempt was over", n);
	}
	assert_int_equal(count_entries(dir, "export$"), 0);
	assert_int_equal(it_cluster_do(&f->c, NULL, "heal", "n1"), 0); /* and the job recovers */
	json_t *j = it_wait_job(&f->c.d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->c.d, j);
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
	char *id = it_cluster_submit(&f->c, JOB("scancel-2x1", "60", "10", TWO_NODES, "retry_policy", "{\"max_restarts\":0}", "profiler",
				 "{\"simulate_data_delay_ms\":100}", NULL));
	it_wait_step(&f->c.d, id, 5, DEADLINE_S);
	char name[128], cmd[600];
	pid_t r0 = it_rank_on(id, "n1");
	assert_true(r0 > 0);
	assert_int_equal(it_env_of(r0, "SLURM_JOB_NAME", name, sizeof name), 0);
	snprintf(cmd, sizeof cmd, "SLURM_CONF=%s scancel --name=%s", f->c.conf, name);
	assert_int_equal(system(cmd), 0);
	json_t *j = it_wait_job(&f->c.d, id, "completed|failed|canceled", DEADLINE_S);
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
		cmocka_unit_test(loss_delay_two_nodes_equal_one_node),
		cmocka_unit_test(link_cut_fails_then_resumes),
		cmocka_unit_test(flaps_then_partition),
		cmocka_unit_test(slurm_cancel_is_reported),
		cmocka_unit_test(stranded_rank_writes_nothing),
	};
	return IT_RUN(tests, setup, teardown);
}
