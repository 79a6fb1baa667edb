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
#include "it_cluster.h"

#define DEADLINE_S 300

typedef it_cluster fx;

static const char *script(void)
{
	const char *s = getenv("BERTD_MULTINODE_SLURM");
	return s ? s : "tests/integration/multinode_slurm.sh";
}

static int setup(void **state)
{
	fx *f = calloc(1, sizeof *f);
	if (!f || it_cluster_init(f, script()))
		return -1;
	*state = f;
	if (it_cluster_start_slurm(f, 3))
		return -1;
	const char *extra[] = {"--devices", "cpu", "--cpu-slots", "3", "--relay-host", "127.0.0.1",
			       "--slurm-immediate-s", "30", "--multinode-comm", "net", NULL};
	return it_cluster_start_daemon(f, extra, DEADLINE_S);
}

static int teardown(void **state)
{
	fx *f = *state;
	if (it_cluster_do(f, NULL, "stop", NULL) != 0)
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

static void check_nodes_equal_one_node(fx *f, int n)
{
	char one[65], net[65], *id1, *idn, name[32], res[128];
	snprintf(name, sizeof name, "net-1x%d", n);
	snprintf(res, sizeof res, "{\"gpus\":%d}", n);
	char *spec1 = JOB(name, "20", res, NULL);
	snprintf(name, sizeof name, "net-%dx1", n);
	snprintf(res, sizeof res, "{\"nodes\":%d,\"gpus_per_node\":1,\"device\":\"cpu\"}", n);
	char *specn = JOB(name, "20", res, NULL);
	it_cluster_run_to_end(f, spec1, one, &id1, DEADLINE_S);
	it_cluster_run_to_end(f, specn, net, &idn, DEADLINE_S);
	assert_int_equal(it_cluster_ranks_on_net(f, idn, "127.0.0.1"), n);
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
	it_cluster_run_to_end(f, LOST("net-lost-ref", "{\"gpus\":2}"), ref, &rid, DEADLINE_S);
	free(rid);
	char *spec = LOST("net-lost-2x1", "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cpu\"}");
	char *id = it_submit(&f->d, spec);
	free(spec);
	it_wait_step(&f->d, id, 15, DEADLINE_S); /* past the checkpoint at step 10 */
	pid_t r0 = it_rank_on(id, "n1"), r1 = it_rank_on(id, "n2");
	if (r0 <= 0 || r1 <= 0) {
		bertd_print_log(&f->d);
		fail_msg("the job's ranks on n1 and n2 were not found (%d, %d)", (int)r0, (int)r1);
	}
	assert_int_equal(restarts_of(f, id), 0);
	assert_int_equal(kill(r1, SIGKILL), 0);
	for (int i = 0; i < DEADLINE_S * 10 && (restarts_of(f, id) < 1 || it_alive(r0)); i++)
		it_pause_ms(100);
	assert_true(restarts_of(f, id) >= 1);
	assert_false(it_alive(r0));
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
	assert_true(it_cluster_ranks_on_net(f, id, "127.0.0.1") >= 2);
	assert_string_equal(ref, sha);
	free(id);
}

static void auto_picks_by_shared_memory(void **state)
{
	fx *f = *state;
	if (getuid() != 0)
		skip(); /* a mount namespace per slurmd needs root */
	char ref[65], sha[65], *id, cmd[1200], shm[300];
	it_cluster_run_to_end(f, JOB("auto-1x2", "20", "{\"gpus\":2}", NULL), ref, &id, DEADLINE_S);
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
	it_cluster_run_to_end(f, JOB("auto-2x1-shm", "20", TWO, NULL), sha, &id, DEADLINE_S);
	assert_int_equal(it_cluster_ranks_on_net(f, id, "127.0.0.1"), 0);
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
		it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
		skip();
	}
	assert_int_equal(st, 0);
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
	it_cluster_run_to_end(f, JOB("auto-2x1-net", "20", TWO, NULL), sha, &id, DEADLINE_S);
	assert_int_equal(it_cluster_ranks_on_net(f, id, "127.0.0.1"), 2);
	assert_string_equal(ref, sha);
	free(id);
	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start %s n2", script(), f->slurm, script(), f->slurm);
	assert_int_equal(system(cmd), 0);
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
}

int main(void)
{
	if (it_cluster_skip(script(), true))
		return 77;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(two_nodes_over_net_equal_one_node),
		cmocka_unit_test(three_nodes_over_net_equal_one_node),
		cmocka_unit_test(rank_lost_resumes_over_net),
		cmocka_unit_test(auto_picks_by_shared_memory), /* last: restarts bertd with auto */
	};
	return IT_RUN(tests, setup, teardown);
}
