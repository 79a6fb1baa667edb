/* Multi-node CPU jobs on the network comm backend (worker/comm_net.cc,
 * docs/multinode.md "The data plane between hosts"), for real through
 * Slurm on one host: the private cluster of multinode_slurm.sh with three
 * slurmd's (n1..n3), bertd with multinode_comm=net, so the ranks rendezvous
 * through the relay's kv_set / kv_get (daemon/relaykv.c) and all-reduce
 * over TCP on loopback instead of sharing memory.
 *   - 2 nodes x 1 rank over the network ends with the export (sha256 of
 *     model.safetensors) of 1 node x 2 ranks on shm, and the ranks say
 *     they joined over the network;
 *   - the same for 3 nodes x 1 rank against 1 node x 3 ranks (where a
 *     different summation order would show);
 *   - kill -9 of n2's rank mid-job: rank 0 on n1 ends too (its collective
 *     fails, or the daemon stops it), the job restarts from its checkpoint
 *     with a fresh rendezvous and ends with the uninterrupted run's export;
 *   - multinode_comm=auto (the default; bertd restarted with it): n1 and n2
 *     sharing /dev/shm train over shared memory; n2 with a /dev/shm of its
 *     own (its slurmd in a mount namespace, root only) makes the ranks pick
 *     the network backend by themselves — the export is the same either way.
 * Skips (77) without Slurm/munge, or when bertd-worker was built without
 * libgloo-dev. The assertions are on states, log lines and bytes. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300

typedef struct fx {
	bertd d;
	char data[160];
	char slurm[160];
	char conf[200];
} fx;

static const char *script(void)
{
	const char *s = getenv("BERTD_MULTINODE_SLURM");
	return s ? s : "tests/integration/multinode_slurm.sh";
}

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	int port = -1;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, len) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
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
	char cmd[700];
	snprintf(cmd, sizeof cmd, "%s start %s %d %d %d %d >/dev/null", script(), f->slurm, free_port(), free_port(),
		 free_port(), free_port());
	if (system(cmd) != 0) {
		fprintf(stderr, "the private Slurm cluster did not start (%s)\n", cmd);
		return -1;
	}
	const char *extra[] = {"--data-roots", f->data, "--devices", "cpu", "--cpu-slots", "3",
			       "--schedule", "true", "--stop-timeout-s", "60", "--slurm-srun", "/usr/bin/srun",
			       "--slurm-conf", f->conf, "--relay-host", "127.0.0.1",
			       "--slurm-immediate-s", "30", "--multinode-comm", "net", NULL};
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
	char cmd[600];
	snprintf(cmd, sizeof cmd, "%s stop %s", script(), f->slurm);
	if (system(cmd) != 0)
		fprintf(stderr, "stopping the private Slurm cluster failed\n");
	int rc = it_daemon_finish(&f->d);
	free(f);
	return rc;
}

/* it_job_spec's bert-tiny-sized job on shakes for steps steps; res is the
 * resources object, then more overrides (dotted path, JSON text) up to the
 * NULL; caller frees. */
#define JOB(name, steps, res, ...) \
	it_job_spec(name, "shakes", "training_args.max_steps", steps, "resources", res, __VA_ARGS__)

/* Runs spec (freed) to completed: the export's sha256 into sha. */
static void run_to_end(fx *f, char *spec, char sha[65], char **id_out)
{
	char *id = it_submit(&f->d, spec);
	free(spec);
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->d, j);
	it_sha_of_export(j, sha);
	json_decref(j);
	*id_out = id;
}

/* How many of the job's ranks logged that they joined over the network
 * (srun's output: every rank's stderr). */
static int ranks_on_net(fx *f, const char *id)
{
	char path[400], line[1024];
	snprintf(path, sizeof path, "%s/jobs/%s/logs/srun.log", f->d.state_dir, id);
	FILE *fp = fopen(path, "r");
	int n = 0;
	while (fp && fgets(line, sizeof line, fp))
		n += strstr(line, "comm over the network from 127.0.0.1") != NULL;
	if (fp)
		fclose(fp);
	return n;
}

static void check_nodes_equal_one_node(fx *f, int n)
{
	char one[65], net[65], *id1, *idn, name[32], res[128];
	snprintf(name, sizeof name, "net-1x%d", n);
	snprintf(res, sizeof res, "{\"gpus\":%d}", n);
	char *spec1 = JOB(name, "20", res, NULL);
	snprintf(name, sizeof name, "net-%dx1", n);
	snprintf(res, sizeof res, "{\"nodes\":%d,\"gpus_per_node\":1,\"device\":\"cpu\"}", n);
	char *specn = JOB(name, "20", res, NULL);
	run_to_end(f, spec1, one, &id1);
	run_to_end(f, specn, net, &idn);
	assert_int_equal(ranks_on_net(f, idn), n);
	assert_string_equal(one, net);
	free(id1);
	free(idn);
}

static void two_nodes_over_net_equal_one_node(void **state)
{
	check_nodes_equal_one_node(*state, 2);
}

static void three_nodes_over_net_equal_one_node(void **state)
{
	check_nodes_equal_one_node(*state, 3);
}

/* The value of NAME in /proc/pid/environ into out; 0 or -1. */
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
	for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
		if (strncmp(buf + i, name, nl) == 0 && buf[i + nl] == '=') {
			snprintf(out, cap, "%s", buf + i + nl + 1);
			return 0;
		}
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

/* The job's rank on node (SLURMD_NODENAME), or -1. */
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

static long restarts_of(fx *f, const char *id)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *j = it_get_json(&f->d, path);
	long n = (long)json_integer_value(json_object_get(j, "restart_count"));
	json_decref(j);
	return n;
}

/* kill -9 of n2's rank (its slurmstepd left alone): the attempt ends on
 * both nodes, the job resumes from its checkpoint over a fresh rendezvous
 * and ends as the uninterrupted run. 100 ms more per batch (a slow source,
 * no effect on the numbers) keeps the job running past step 15. */
static void rank_lost_resumes_over_net(void **state)
{
	fx *f = *state;
#define LOST(name, res) \
	JOB(name, "60", res, "retry_policy", "{\"max_restarts\":3}", "profiler", "{\"simulate_data_delay_ms\":100}", NULL)
	char ref[65], sha[65], *rid;
	run_to_end(f, LOST("net-lost-ref", "{\"gpus\":2}"), ref, &rid);
	free(rid);
	char *spec = LOST("net-lost-2x1", "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cpu\"}");
	char *id = it_submit(&f->d, spec);
	free(spec);
	it_wait_step(&f->d, id, 15, DEADLINE_S); /* past the checkpoint at step 10 */
	pid_t r0 = rank_on(id, "n1"), r1 = rank_on(id, "n2");
	if (r0 <= 0 || r1 <= 0) {
		bertd_print_log(&f->d);
		fail_msg("the job's ranks on n1 and n2 were not found (%d, %d)", (int)r0, (int)r1);
	}
	assert_int_equal(restarts_of(f, id), 0);
	assert_int_equal(kill(r1, SIGKILL), 0);
	for (int i = 0; i < DEADLINE_S * 10 && (restarts_of(f, id) < 1 || alive(r0)); i++)
		it_pause_ms(100);
	assert_true(restarts_of(f, id) >= 1);
	assert_false(alive(r0));
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->d, j);
	it_sha_of_export(j, sha);
	json_decref(j);
	json_t *ev = it_events_of(&f->d, id);
	const char *resumed = it_event_with(ev, "resuming from checkpoint at step ");
	if (!resumed) {
		fprintf(stderr, "%s\n", json_dumps(ev, JSON_INDENT(1)));
		fail_msg("no restart from a checkpoint in the events");
	}
	json_decref(ev);
	/* one restart: the second attempt's rendezvous started from an empty
	 * map (stale addresses of the first would fail it again) */
	assert_int_equal(restarts_of(f, id), 1);
	assert_true(ranks_on_net(f, id) >= 2);
	assert_string_equal(ref, sha);
	free(id);
}

/* sinfo's state of node (compact, "%t"), polled until it is want. */
static void wait_node(fx *f, const char *node, const char *want)
{
	char cmd[600], got[64] = "";
	snprintf(cmd, sizeof cmd, "SLURM_CONF=%s sinfo -h -n %s -o %%t", f->conf, node);
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		FILE *p = popen(cmd, "r");
		assert_non_null(p);
		if (!fgets(got, sizeof got, p))
			got[0] = '\0';
		pclose(p);
		got[strcspn(got, "\n")] = '\0';
		if (strcmp(got, want) == 0)
			return;
		poll(NULL, 0, 100);
	}
	fail_msg("node %s stayed \"%s\", not \"%s\"", node, got, want);
}

static void auto_picks_by_shared_memory(void **state)
{
	fx *f = *state;
	if (getuid() != 0)
		skip(); /* a mount namespace per slurmd needs root */
	char ref[65], sha[65], *id, cmd[1200], shm[300];
	run_to_end(f, JOB("auto-1x2", "20", "{\"gpus\":2}", NULL), ref, &id);
	free(id);
	/* the same daemon state, now with the default multinode_comm=auto */
	assert_int_equal(bertd_stop(&f->d), 0);
	const char *extra[] = {"--data-roots", f->data, "--devices", "cpu", "--cpu-slots", "3",
			       "--schedule", "true", "--stop-timeout-s", "60", "--slurm-srun", "/usr/bin/srun",
			       "--slurm-conf", f->conf, "--relay-host", "127.0.0.1",
			       "--slurm-immediate-s", "30", NULL};
	assert_int_equal(bertd_start(&f->d, extra), 0);
#define TWO "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cpu\"}"
	/* one /dev/shm for both nodes: shared memory */
	run_to_end(f, JOB("auto-2x1-shm", "20", TWO, NULL), sha, &id);
	assert_int_equal(ranks_on_net(f, id), 0);
	assert_string_equal(ref, sha);
	free(id);
	/* n2 gets a /dev/shm of its own: shared memory cannot reach it */
	snprintf(shm, sizeof shm, "%s/n2-shm", f->d.root);
	assert_int_equal(mkdir(shm, 01777), 0);
	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start-bind %s n2 '%s' /dev/shm", script(), f->slurm,
		 script(), f->slurm, shm);
	int st = system(cmd);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
		snprintf(cmd, sizeof cmd, "%s node-start %s n2", script(), f->slurm);
		assert_int_equal(system(cmd), 0);
		wait_node(f, "n2", "idle");
		skip();
	}
	assert_int_equal(st, 0);
	wait_node(f, "n2", "idle");
	run_to_end(f, JOB("auto-2x1-net", "20", TWO, NULL), sha, &id);
	assert_int_equal(ranks_on_net(f, id), 2);
	assert_string_equal(ref, sha);
	free(id);
	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start %s n2", script(), f->slurm, script(), f->slurm);
	assert_int_equal(system(cmd), 0);
	wait_node(f, "n2", "idle");
}

int main(void)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "%s check /nonexistent", script());
	int st = system(cmd);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 77)
		return 77;
	if (getenv("BERTD_HAVE_GLOO") && strcmp(getenv("BERTD_HAVE_GLOO"), "1") != 0) {
		fprintf(stderr, "skip: bertd-worker was built without libgloo-dev (no network comm backend)\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(two_nodes_over_net_equal_one_node),
		cmocka_unit_test(three_nodes_over_net_equal_one_node),
		cmocka_unit_test(rank_lost_resumes_over_net),
		cmocka_unit_test(auto_picks_by_shared_memory), /* last: restarts bertd with auto */
	};
	return IT_RUN(tests, setup, teardown);
}
