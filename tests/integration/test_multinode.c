/* Multi-node jobs through Slurm (docs/multinode.md), for real on
 * one host: a private munged, slurmctld and two slurmd's (n1, n2) started
 * by multinode_slurm.sh, the real bertd with slurm_srun set, CPU ranks.
 * On one host the ranks' shm all-reduce stands in for NCCL's network
 * transport; placement, start, rendezvous (the relay), failure and restart
 * go through Slurm as on a cluster.
 *   - 2 nodes x 1 rank trains bit for bit what 1 node x 2 ranks trains
 *     (the exported model.safetensors), with rank 0 on n1 and rank 1 on n2;
 *   - a relay connection with a wrong token is refused and the job goes on;
 *   - kill -9 of node n2's processes (the rank and its slurmstepd) mid-job
 *     fails the attempt on both nodes (rank 0's process goes too), the job
 *     restarts from its last checkpoint and ends bit-identical to an
 *     uninterrupted run;
 *   - cancel: both nodes stop, rank 0's stop checkpoint is written, the job
 *     ends canceled with nothing left running;
 *   - bad resources are refused at submit (422), more nodes than the
 *     cluster has too (sinfo's count);
 *   - a node down at submit (scontrol ... state=down): the 2-node job is
 *     refused (409) naming n2; resumed, the same submit is accepted and runs;
 *   - n2 sees a different dataset at the same path (root: its slurmd in a
 *     mount namespace): the job fails, not retried, naming n1 and n2; no
 *     dataset there: it fails naming n2;
 *   - a mixture of two datasets trains on 2 nodes what it trains on one;
 *     another copy of its second dataset on n2 fails the job the same way.
 * Skips (77) without Slurm/munge (root is not needed). Waiting is polling with
 * deadlines; the assertions are on states, events and bytes. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
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

#include "common/msg.h"
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
	if (it_cluster_start_slurm(f, 2))
		return -1;
	const char *extra[] = {"--devices", "cpu", "--cpu-slots", "2", "--relay-host", "127.0.0.1",
			       "--slurm-immediate-s", "30", NULL};
	return it_cluster_start_daemon(f, extra, DEADLINE_S);
}

static int teardown(void **state)
{
	fx *f = *state;
	it_cluster_do(f, NULL, "stop", NULL); /* first: its files are under the daemon's root */
	int rc = it_daemon_finish(&f->d);
	free(f);
	return rc;
}

/* it_job_spec's tiny job on shakes (a model small enough to train in
 * seconds on two cores): steps, save_steps and logging_steps given, res the
 * resources object, then more overrides (dotted path, JSON text) up to the
 * NULL; caller frees. */
#define JOB(name, steps, save, log, res, ...)                                                               \
	it_job_spec(name, "shakes", "training_args.max_steps", steps, "training_args.save_steps", save,       \
		    "training_args.logging_steps", log, "resources", res, __VA_ARGS__)
#define ONE_NODE "{\"gpus\":2}"
#define TWO_NODES "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cpu\"}"

/* 2 nodes x 1 rank, fed by 2 loaders on each node, == 1 node x 2 ranks
 * building their own batches, bit for bit; the ranks really ran on n1 and
 * n2 (the relay's note). */
static void two_nodes_equal_one_node(void **state)
{
	fx *f = *state;
	char one[65], two[65], *id;
	it_cluster_run_to_end(f, JOB("eq-1x2", "8", "4", "2", ONE_NODE, NULL), one, NULL, DEADLINE_S);
	it_cluster_run_to_end(f, JOB("eq-2x1", "8", "4", "2", TWO_NODES, "training_args.dataloader_num_workers", "2", NULL),
			      two, &id, DEADLINE_S);
	json_t *ev = it_events_of(&f->d, id);
	if (!it_event_with(ev, "2 ranks joined: 0@n1 1@n2") || !it_event_with(ev, "starting on 2 nodes x 1 cpu (Slurm)")) {
		fprintf(stderr, "%s\n", json_dumps(ev, JSON_INDENT(1)));
		fail_msg("the 2-node job's events do not show its ranks on n1 and n2");
	}
	json_decref(ev);
	assert_string_equal(one, two);
	/* the 2-node job's batches came from 2 loaders on each node, and
	 * their rings (one per node, in the /dev/shm the nodes share here)
	 * went with the job */
	char logs[400], shm[128];
	snprintf(logs, sizeof logs, "%s/jobs/%s/logs", f->d.state_dir, id);
	assert_int_equal(it_count_files(logs, "loader-"), 4);
	snprintf(shm, sizeof shm, "bertd-%s-", id);
	assert_int_equal(it_count_files("/dev/shm", shm), 0);
	free(id);
}

/* Connects to the relay at host:port and introduces itself with a wrong
 * token; returns whether the daemon closed the connection (bounded wait). */
static bool wrong_token_refused(const char *addr)
{
	char host[64];
	const char *colon = strrchr(addr, ':');
	assert_non_null(colon);
	snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
	assert_int_equal(inet_pton(AF_INET, host, &a.sin_addr), 1);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
	json_t *m = json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", "relay", "token",
			      "0000000000000000000000000000000000000000000000000000000000000000", "rank", 1, "node",
			      "intruder", "dataset_sha256", "");
	assert_int_equal(msg_send(fd, m), 0);
	json_decref(m);
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char b;
	bool closed = poll(&p, 1, 30000) == 1 && read(fd, &b, 1) == 0;
	close(fd);
	return closed;
}

static long job_int(const json_t *j, const char *key)
{
	return (long)json_integer_value(json_object_get(j, key));
}

/* kill -9 of n2's rank and its slurmstepd: the attempt fails on both nodes,
 * nothing of it is left, the job resumes and ends as an uninterrupted run. */
static void node_lost_fails_attempt_and_resumes(void **state)
{
	fx *f = *state;
/* The tiny model trains 60 steps in well under a second; 100 ms more per
 * batch (a slow source, no effect on the numbers) leaves the job running
 * for seconds after step 15, where the kill comes. */
#define LOST_SPEC(name, res)                                                                          \
	JOB(name, "60", "10", "5", res, "retry_policy", "{\"max_restarts\":3}", "profiler",                 \
	    "{\"simulate_data_delay_ms\":100}", NULL)
	char ref[65];
	it_cluster_run_to_end(f, LOST_SPEC("lost-ref", ONE_NODE), ref, NULL, DEADLINE_S);

	char *id = it_cluster_submit(f, LOST_SPEC("lost-2x1", TWO_NODES));
	it_wait_step(&f->d, id, 15, DEADLINE_S); /* past the checkpoint at step 10 */
	pid_t r0 = it_rank_on(id, "n1"), r1 = it_rank_on(id, "n2");
	if (r0 <= 0 || r1 <= 0) {
		char p[128];
		snprintf(p, sizeof p, "/v1/jobs/%s", id);
		json_t *jj = it_get_json(&f->d, p), *ev = it_events_of(&f->d, id);
		fprintf(stderr, "rank pids %d %d\njob: %s\nevents: %s\n", (int)r0, (int)r1,
			json_dumps(jj, JSON_INDENT(1)), json_dumps(ev, JSON_INDENT(1)));
		bertd_print_log(&f->d);
		fail_msg("the job's ranks on n1 and n2 were not found");
	}

	/* the relay's credential: a wrong token is refused, the job goes on */
	char relay[128];
	assert_int_equal(it_env_of(r1, "BERTD_RELAY", relay, sizeof relay), 0);
	assert_true(wrong_token_refused(relay));
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *j = it_get_json(&f->d, path);
	assert_string_equal(it_jstr(j, "state"), "running");
	assert_int_equal(job_int(j, "restart_count"), 0);
	json_decref(j);

	pid_t stepd = it_ppid_of(r1);
	assert_true(stepd > 1);
	assert_int_equal(kill(r1, SIGKILL), 0);
	assert_int_equal(kill(stepd, SIGKILL), 0);

	/* the attempt fails (on n1 too: rank 0's process ends) and restarts */
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		j = it_get_json(&f->d, path);
		long restarts = job_int(j, "restart_count");
		json_decref(j);
		if (restarts >= 1 && !it_alive(r0))
			break;
		it_pause_ms(100);
	}
	j = it_get_json(&f->d, path);
	if (job_int(j, "restart_count") < 1) {
		json_t *ev = it_events_of(&f->d, id);
		fprintf(stderr, "job: %s\nevents: %s\n", json_dumps(j, JSON_INDENT(1)), json_dumps(ev, JSON_INDENT(1)));
		bertd_print_log(&f->d);
		fail_msg("the attempt did not fail and restart after node n2's processes were killed");
	}
	json_decref(j);
	assert_false(it_alive(r0));
	assert_false(it_alive(r1));

	j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->d, j);
	char sha[65];
	it_sha_of_export(j, sha);
	json_decref(j);
	json_t *ev = it_events_of(&f->d, id);
	const char *resumed = it_event_with(ev, "resuming from checkpoint at step ");
	const char *failed = it_event_with(ev, "restart 1 of 3");
	printf("attempt 1 ended: %s\nthen: %s\n", failed ? failed : "?", resumed ? resumed : "?");
	if (!resumed || !failed) {
		fprintf(stderr, "%s\n", json_dumps(ev, JSON_INDENT(1)));
		fail_msg("no restart from a checkpoint in the events");
	}
	assert_true(strtol(resumed + strlen("resuming from checkpoint at step "), NULL, 10) >= 10);
	json_decref(ev);
	assert_string_equal(ref, sha);
	/* nothing of the job is left on either node */
	pid_t left[4];
	assert_int_equal(it_find_pids("bertd-worker", id, left, 4), 0);
	free(id);
}

/* The highest step among the job's complete checkpoints on disk; -1 none. */
static long newest_on_disk(fx *f, const char *id)
{
	char root[300];
	snprintf(root, sizeof root, "%s/jobs/%s/checkpoints", f->d.state_dir, id);
	DIR *d = opendir(root);
	if (!d)
		return -1;
	long best = -1;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end, p[600];
		if (strncmp(e->d_name, "ckpt-", 5) != 0)
			continue;
		long s = strtol(e->d_name + 5, &end, 10);
		snprintf(p, sizeof p, "%s/%s/DONE", root, e->d_name);
		if (!*end && end != e->d_name + 5 && access(p, F_OK) == 0 && s > best)
			best = s;
	}
	closedir(d);
	return best;
}

/* Cancel: the stop reaches the ranks on both nodes over the relay, rank 0
 * writes the stop checkpoint, the job ends canceled and nothing of it is
 * left. */
static void cancel_keeps_stop_checkpoint(void **state)
{
	fx *f = *state;
	char *id = it_cluster_submit(f, JOB("cancel-2x1", "100000", "100000", "5", TWO_NODES, NULL));
	it_wait_step(&f->d, id, 5, DEADLINE_S);
	assert_int_equal(newest_on_disk(f, id), -1); /* no periodic one: save_steps 100000 */
	it_cancel_job(&f->d, id, DEADLINE_S);
	assert_true(newest_on_disk(f, id) >= 5);
	pid_t left[4];
	assert_int_equal(it_find_pids("bertd-worker", id, left, 4), 0);
	free(id);
}

/* resources checked at submit; more nodes than Slurm has: 422 too. */
static void bad_resources_refused(void **state)
{
	fx *f = *state;
	http_resp r = {0};
	char *spec = JOB("bad-a", "4", "4", "2", "{\"nodes\":2}", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	assert_int_equal(r.status, 422);
	assert_non_null(strstr(r.body, "gpus_per_node"));
	http_resp_free(&r);
	spec = JOB("bad-b", "4", "4", "2", "{\"nodes\":40,\"gpus_per_node\":2}", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	assert_int_equal(r.status, 422);
	http_resp_free(&r);

	/* more nodes than the cluster has: refused at submit (sinfo's count) */
	spec = JOB("three", "4", "4", "2", "{\"nodes\":3,\"gpus_per_node\":1,\"device\":\"cpu\"}", NULL);
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	free(spec);
	if (r.status != 422 || !strstr(r.body, "asks for 3 nodes; the Slurm cluster has 2 (2 up)"))
		fail_msg("a 3-node job on a 2-node cluster: %ld %s", (long)r.status, r.body);
	http_resp_free(&r);
}

/* A node down at submit: the 2-node job is refused (409) naming n2 and
 * how many nodes are up; once n2 is resumed the same submit is accepted
 * and the job runs on both nodes. */
static void node_down_refused_at_submit(void **state)
{
	fx *f = *state;
	char *spec = JOB("down-2x1", "4", "4", "2", TWO_NODES, NULL);
	it_cluster_node_state(f, "n2", "down");
	it_cluster_wait_node(f, "n2", "down", DEADLINE_S);
	http_resp r = {0};
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, &r), 0);
	if (r.status != 409 || !strstr(r.body, "urn:bertd:problem:nodes-unavailable") ||
	    !strstr(r.body, "asks for 2 nodes; 1 of the cluster's 2 is up; not usable: n2 (down)") ||
	    !strstr(r.body, "\"field\":\"resources.nodes\""))
		fail_msg("a 2-node job with n2 down: %ld %s", (long)r.status, r.body);
	http_resp_free(&r);
	json_t *list = it_get_json(&f->d, "/v1/jobs?limit=100");
	assert_true(json_is_array(json_object_get(list, "jobs")));
	size_t i;
	json_t *j;
	json_array_foreach(json_object_get(list, "jobs"), i, j)
		assert_string_not_equal(it_jstr(j, "name"), "down-2x1"); /* nothing was stored */
	json_decref(list);

	it_cluster_node_state(f, "n2", "resume");
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
	char *id = it_cluster_submit(f, spec);
	j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->d, j);
	json_decref(j);
	json_t *ev = it_events_of(&f->d, id);
	assert_non_null(it_event_with(ev, "1@n2"));
	json_decref(ev);
	free(id);
}

/* n2 sees another dataset at the same path (its slurmd restarted in a
 * mount namespace of its own, a changed copy bound over the dataset's
 * directory): the job fails, not retried, naming both nodes and their
 * digests; an empty directory there instead: it fails naming n2. Root
 * only (mount namespaces); n2 is restored after. */
static void dataset_differs_on_a_node(void **state)
{
	fx *f = *state;
	if (getuid() != 0)
		skip();
	char ds[300], alt[300], cmd[1200];
	snprintf(ds, sizeof ds, "%s/datasets/shakes", f->data);
	snprintf(alt, sizeof alt, "%s/alt-shakes", f->d.root);
	char manifest[400];
	snprintf(manifest, sizeof manifest, "%s/manifest.json", ds);
	assert_int_equal(access(manifest, R_OK), 0);
	/* the copy differs in one shard's size, as a differently prepared corpus would */
	snprintf(cmd, sizeof cmd, "cp -a '%s' '%s' && b=$(ls '%s'/*.bin | head -n 1) && printf x >>\"$b\"", ds, alt,
		 alt);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start-bind %s n2 '%s' '%s'", script(), f->slurm,
		 script(), f->slurm, alt, ds);
	int st = system(cmd);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
		snprintf(cmd, sizeof cmd, "%s node-start %s n2", script(), f->slurm);
		assert_int_equal(system(cmd), 0);
		it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
		skip();
	}
	assert_int_equal(st, 0);
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);

	char *id = it_cluster_submit(f, JOB("differs-2x1", "4", "4", "2", TWO_NODES, NULL));
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	const char *why = json_string_value(json_object_get(j, "failure_reason"));
	if (!why || !strstr(why, "dataset \"shakes\" differs between nodes: n1 has content digest") ||
	    !strstr(why, ", n2 has "))
		fail_msg("a dataset that differs on n2: %s %s", it_jstr(j, "state"), why ? why : "(no reason)");
	assert_string_equal(it_jstr(j, "state"), "failed");
	assert_int_equal(json_integer_value(json_object_get(j, "restart_count")), 0);
	json_decref(j);
	free(id);

	/* no dataset at all on n2: an empty directory at the path */
	snprintf(alt, sizeof alt, "%s/empty-shakes", f->d.root);
	assert_int_equal(mkdir(alt, 0700), 0);
	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start-bind %s n2 '%s' '%s'", script(), f->slurm,
		 script(), f->slurm, alt, ds);
	assert_int_equal(system(cmd), 0);
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
	id = it_cluster_submit(f, JOB("missing-2x1", "4", "4", "2", TWO_NODES, NULL));
	j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	why = json_string_value(json_object_get(j, "failure_reason"));
	if (!why || !strstr(why, "dataset \"shakes\" is missing on node n2"))
		fail_msg("no dataset on n2: %s %s", it_jstr(j, "state"), why ? why : "(no reason)");
	assert_string_equal(it_jstr(j, "state"), "failed");
	json_decref(j);
	free(id);

	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start %s n2", script(), f->slurm, script(),
		 f->slurm);
	assert_int_equal(system(cmd), 0);
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
}

/* The mixture form of JOB: shakes 0.6 and shakes2 0.4 (one vocab). */
#define MIXSPEC(name, res)                                                                                  \
	JOB(name, "8", "4", "2", res, "dataset",                                                                    \
	    "[{\"name\":\"shakes\",\"proportion\":0.6},{\"name\":\"shakes2\",\"proportion\":0.4}]", NULL)

/* A mixture on 2 nodes x 1 rank trains what it trains on 1 node x 2 ranks;
 * n2 with another copy of the second dataset (root: a mount namespace):
 * the job fails, not retried, naming the mixture and both nodes. */
static void mixture_on_two_nodes(void **state)
{
	fx *f = *state;
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "tail -n 1500 '%s/shakes.txt' > '%s/shakes2.txt'", f->data, f->data);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof cmd,
		 "{\"name\":\"shakes2\",\"source\":\"shakes2.txt\",\"vocab\":{\"file\":\"%s/datasets/shakes/vocab.txt\"}}",
		 f->data);
	assert_int_equal(it_add_dataset(&f->d, cmd), 0);
	it_wait_dataset_ready(&f->d, "shakes2", DEADLINE_S);
	char one[65], two[65], plain[65];
	it_cluster_run_to_end(f, MIXSPEC("mix-1x2", ONE_NODE), one, NULL, DEADLINE_S);
	it_cluster_run_to_end(f, MIXSPEC("mix-2x1", TWO_NODES), two, NULL, DEADLINE_S);
	assert_string_equal(one, two);
	it_cluster_run_to_end(f, JOB("plain-1x2", "8", "4", "2", ONE_NODE, NULL), plain, NULL, DEADLINE_S);
	assert_string_not_equal(one, plain); /* the mixture is trained on, not shakes alone */
	if (getuid() != 0)
		return;
	char ds[300], alt[300];
	snprintf(ds, sizeof ds, "%s/datasets/shakes2", f->data);
	snprintf(alt, sizeof alt, "%s/alt-shakes2", f->d.root);
	snprintf(cmd, sizeof cmd, "cp -a '%s' '%s' && b=$(ls '%s'/*.bin | head -n 1) && printf x >>\"$b\"", ds, alt,
		 alt);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start-bind %s n2 '%s' '%s'", script(), f->slurm,
		 script(), f->slurm, alt, ds);
	int st = system(cmd);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
		snprintf(cmd, sizeof cmd, "%s node-start %s n2", script(), f->slurm);
		assert_int_equal(system(cmd), 0);
		it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
		return;
	}
	assert_int_equal(st, 0);
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
	char *id = it_cluster_submit(f, MIXSPEC("mix-differs-2x1", TWO_NODES));
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	const char *why = json_string_value(json_object_get(j, "failure_reason"));
	if (!why || !strstr(why, "dataset \"shakes+shakes2\" differs between nodes: n1 has content digest"))
		fail_msg("a mixture component that differs on n2: %s %s", it_jstr(j, "state"), why ? why : "(no reason)");
	assert_string_equal(it_jstr(j, "state"), "failed");
	assert_int_equal(json_integer_value(json_object_get(j, "restart_count")), 0);
	json_decref(j);
	free(id);
	snprintf(cmd, sizeof cmd, "%s node-stop %s n2 && %s node-start %s n2", script(), f->slurm, script(),
		 f->slurm);
	assert_int_equal(system(cmd), 0);
	it_cluster_wait_node(f, "n2", "idle", DEADLINE_S);
}

int main(void)
{
	if (it_cluster_skip(script(), false))
		return 77;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bad_resources_refused),
		cmocka_unit_test(node_down_refused_at_submit),
		cmocka_unit_test(two_nodes_equal_one_node),
		cmocka_unit_test(node_lost_fails_attempt_and_resumes),
		cmocka_unit_test(cancel_keeps_stop_checkpoint),
		cmocka_unit_test(dataset_differs_on_a_node),
		cmocka_unit_test(mixture_on_two_nodes),
	};
	return IT_RUN(tests, setup, teardown);
}
