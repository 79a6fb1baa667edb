/* A multi-node attempt outlives its daemon (docs/multinode.md, "A daemon
 * restart"), on the namespaced nodes of multinode_ns.sh (n1 and n2 in
 * their own network, UTS and mount namespaces, sharing the host's
 * /dev/shm; bertd and srun in the head namespace):
 *   - kill -9 of the daemon during a 2 nodes x 1 rank job: srun and both
 *     ranks live on, and the ranks keep stepping (rank 0 puts a newer
 *     checkpoint in place with no daemon); a new daemon on the same state
 *     directory adopts the attempt (an event naming it, no restart
 *     counted), the ranks redial its relay, the job completes, its
 *     export's sha256 is the one of an undisturbed run of 1 node x 2
 *     ranks (the multi-node tests' reference), and its metrics have every
 *     logged step once, with the reference's losses bit for bit;
 *   - the daemon gone while the job ends (srun ends with no daemon): the
 *     next daemon accounts for it from the ranks' exit records: completed,
 *     the same export, every step once, no restart;
 *   - SIGQUIT: bertd exits 5 leaving srun and the ranks running; the next
 *     daemon adopts the attempt; the same export, every step once;
 *   - a stop (SIGTERM, not a restart's) still stops the job with a
 *     checkpoint, leaving no srun or rank running; the next daemon resumes
 *     it from that checkpoint and it ends with the same export.
 * Root only; skips (77) elsewhere or without Slurm, nftables or
 * namespaces. Waiting is polling with deadlines; assertions are on
 * states, events, processes and bytes. */
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_cluster.h"

#define DEADLINE_S 300

static const char *script(void)
{
	const char *s = getenv("BERTD_MULTINODE_NS");
	return s ? s : "tests/integration/multinode_ns.sh";
}

/* bertd's arguments beyond it_cluster_start_daemon's own (the same at
 * the restart: its base arguments, then these) */
static const char *const extra[] = {"--devices", "cpu", "--cpu-slots", "2", "--relay-host", "10.213.77.1",
				    "--relay-timeout-s", "5", "--slurm-immediate-s", "60", NULL};

static int setup(void **state)
{
	it_cluster *c = calloc(1, sizeof *c);
	if (!c || it_cluster_init(c, script()))
		return -1;
	*state = c;
	char env[400];
	snprintf(env, sizeof env, "BERTD_NS_OWNER=%d BERTD_NS_SHARED=%s", (int)getpid(), c->d.root);
	if (it_cluster_do(c, env, "start", "2 shared-shm >/dev/null")) {
		fprintf(stderr, "the namespaced cluster did not start (%s start %s)\n", script(), c->slurm);
		return -1;
	}
	char head[200];
	snprintf(head, sizeof head, "%s/ns/head", c->slurm);
	int fd = open(head, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
		fprintf(stderr, "cannot enter the head namespace %s\n", head);
		return -1;
	}
	close(fd);
	return it_cluster_start_daemon(c, extra, DEADLINE_S);
}

static int teardown(void **state)
{
	it_cluster *c = *state;
	int rc = it_daemon_finish(&c->d);
	/* an srun this test left (it outlives a daemon) goes before its cluster */
	pid_t p[8];
	int n = it_find_pids("srun", c->d.root, p, 8);
	for (int i = 0; i < n; i++)
		kill(p[i], SIGKILL);
	char env[64];
	snprintf(env, sizeof env, "BERTD_NS_OWNER=%d", (int)getpid());
	if (it_cluster_do(c, env, "stop", NULL) != 0)
		rc = -1;
	free(c);
	return rc;
}

/* 40 steps, a checkpoint every 10, metrics every 5; 100 ms more per batch
 * (a slow source, no effect on the numbers) keeps it running for seconds
 * past the kill. */
#define SPEC(name, res)                                                                                         \
	it_job_spec(name, "shakes", "training_args.max_steps", "40", "training_args.save_steps", "10", "resources", \
		    res, "profiler", "{\"simulate_data_delay_ms\":100}", NULL)

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The undisturbed 1 node x 2 ranks run of SPEC (made once): its export's
 * sha256 and its id. */
static char ref[65], *ref_id;

static void reference(it_cluster *c)
{
	if (ref_id)
		return;
	double t0 = mono_s();
	it_cluster_run_to_end(c, SPEC("ref-1x2", "{\"gpus\":2}"), ref, &ref_id, DEADLINE_S);
	printf("adopt: reference run %.1f s\n", mono_s() - t0);
}

/* bertd again on the same state directory, with the same arguments. */
static void restart_daemon(it_cluster *c)
{
	const char *base[] = {"--data-roots", c->data, "--schedule", "true", "--stop-timeout-s", "60",
			      "--slurm-srun", "/usr/bin/srun", "--slurm-conf", c->conf};
	const char *args[32];
	size_t n = 0;
	for (size_t i = 0; i < sizeof base / sizeof *base; i++)
		args[n++] = base[i];
	for (size_t i = 0; extra[i]; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	assert_int_equal(bertd_start(&c->d, args), 0);
}

/* Every logged step of id once (5, 10, ... 40), with the reference's losses. */
static void assert_metrics_as_reference(it_cluster *c, const char *id)
{
	json_t *ma = it_metrics_of(&c->d, ref_id), *mb = it_metrics_of(&c->d, id);
	assert_int_equal(json_array_size(mb), 40 / 5);
	assert_int_equal(json_array_size(ma), json_array_size(mb));
	for (size_t k = 0; k < json_array_size(mb); k++) {
		json_t *a = json_array_get(ma, k), *b = json_array_get(mb, k);
		assert_int_equal(json_integer_value(json_object_get(b, "step")), (long)(k + 1) * 5);
		assert_true(json_number_value(json_object_get(a, "loss")) == json_number_value(json_object_get(b, "loss")));
	}
	json_decref(ma);
	json_decref(mb);
}

#define TWO_NODES "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cpu\"}"

static void kill9_daemon_adopts_two_node_job(void **state)
{
	it_cluster *c = *state;
	char got[65];
	reference(c);
	double t1 = mono_s();

	char *id = it_cluster_submit(c, SPEC("adopt-2x1", TWO_NODES));
	it_wait_step(&c->d, id, 15, DEADLINE_S); /* past the step-10 checkpoint */
	pid_t r0 = it_rank_on(id, "n1"), r1 = it_rank_on(id, "n2"), srun[4];
	assert_true(r0 > 0 && r1 > 0);
	int nsrun = it_find_pids("srun", id, srun, 4); /* srun, and the helper it forks */
	assert_true(nsrun >= 1);
	bertd_kill9(&c->d);
	long before = it_newest_checkpoint(c->d.state_dir, id);
	assert_true(before >= 10);
	/* with no daemon the ranks go on: rank 0 puts a newer checkpoint in place */
	for (int i = 0; i < DEADLINE_S * 10 && it_newest_checkpoint(c->d.state_dir, id) <= before && it_alive(r0); i++)
		it_pause_ms(100);
	long alone = it_newest_checkpoint(c->d.state_dir, id);
	printf("adopt: checkpoint %ld before the kill, %ld written with no daemon\n", before, alone);
	assert_true(alone > before);
	assert_true(it_alive(r0) && it_alive(r1)); /* all of the attempt lives on */
	for (int i = 0; i < nsrun; i++)
		assert_true(it_alive(srun[i]));

	restart_daemon(c);
	json_t *job = it_wait_job(&c->d, id, "completed|failed|canceled", DEADLINE_S);
	double t2 = mono_s();
	if (strcmp(it_jstr(job, "state"), "completed") != 0)
		bertd_print_log(&c->d);
	it_assert_completed(&c->d, job);
	assert_true(it_has_event(&c->d, id, "daemon restarted; adopted the multi-node attempt"));
	assert_false(it_has_event(&c->d, id, "resuming from checkpoint"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	it_sha_of_export(job, got);
	assert_string_equal(got, ref); /* bit-identical to the undisturbed run */

	assert_metrics_as_reference(c, id);
	assert_int_equal(it_find_pids("bertd-worker", id, srun, 4), 0); /* nothing of it left */
	assert_int_equal(it_find_pids("srun", id, srun, 4), 0);
	printf("adopt: 2-node job submitted to completed across the kill %.1f s\n", t2 - t1);
	json_decref(job);
	free(id);
}

/* The daemon gone while the 2-node job ends: srun ends with no daemon; the
 * next one finds it ended and accounts for the job from its ranks' exit
 * records (completed, its export, every step once). */
static void job_completes_without_daemon(void **state)
{
	it_cluster *c = *state;
	char got[65];
	reference(c);
	char *id = it_cluster_submit(c, SPEC("alone-2x1", TWO_NODES));
	it_wait_step(&c->d, id, 15, DEADLINE_S);
	bertd_kill9(&c->d);
	pid_t p[4];
	int i;
	for (i = 0; i < DEADLINE_S * 10 && it_find_pids("srun", id, p, 4) > 0; i++)
		it_pause_ms(100);
	assert_int_equal(it_find_pids("srun", id, p, 4), 0); /* it ended with no daemon */
	assert_int_equal(it_find_pids("bertd-worker", id, p, 4), 0);
	restart_daemon(c);
	json_t *job = it_wait_job(&c->d, id, "completed|failed|canceled", DEADLINE_S);
	if (strcmp(it_jstr(job, "state"), "completed") != 0)
		bertd_print_log(&c->d);
	it_assert_completed(&c->d, job);
	assert_true(it_has_event(&c->d, id, "(srun ended meanwhile;"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	it_sha_of_export(job, got);
	assert_string_equal(got, ref);
	assert_metrics_as_reference(c, id);
	json_decref(job);
	free(id);
}

/* SIGQUIT (the exit an upgrade by hand uses, as a restart under systemd):
 * bertd exits 5 and leaves srun and the ranks running, its relay closed;
 * the next daemon adopts the attempt and the job ends bit-identical. */
static void sigquit_leaves_two_node_job_running(void **state)
{
	it_cluster *c = *state;
	char got[65];
	reference(c);
	char *id = it_cluster_submit(c, SPEC("quit-2x1", TWO_NODES));
	it_wait_step(&c->d, id, 15, DEADLINE_S);
	assert_int_equal(kill(c->d.pid, SIGQUIT), 0);
	int st;
	assert_int_equal(waitpid(c->d.pid, &st, 0), c->d.pid);
	c->d.pid = 0;
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 5);
	pid_t p[4];
	assert_true(it_find_pids("srun", id, p, 4) >= 1); /* left running */
	assert_true(it_rank_on(id, "n1") > 0 && it_rank_on(id, "n2") > 0);
	restart_daemon(c);
	json_t *job = it_wait_job(&c->d, id, "completed|failed|canceled", DEADLINE_S);
	if (strcmp(it_jstr(job, "state"), "completed") != 0)
		bertd_print_log(&c->d);
	it_assert_completed(&c->d, job);
	assert_true(it_has_event(&c->d, id, "daemon restarted; adopted the multi-node attempt"));
	assert_int_equal(json_integer_value(json_object_get(job, "restart_count")), 0);
	assert_false(it_has_event(&c->d, id, "resuming from checkpoint"));
	it_sha_of_export(job, got);
	assert_string_equal(got, ref);
	assert_metrics_as_reference(c, id);
	json_decref(job);
	free(id);
}

/* A stop (SIGTERM, not a restart's) still stops the 2-node job with a
 * checkpoint: queued, nothing of it left running; the next daemon resumes
 * it from that checkpoint and it ends bit-identical. */
static void clean_stop_stops_two_node_job(void **state)
{
	it_cluster *c = *state;
	char got[65];
	reference(c);
	char *id = it_cluster_submit(c, SPEC("stop-2x1", TWO_NODES));
	it_wait_step(&c->d, id, 15, DEADLINE_S);
	assert_int_equal(bertd_stop(&c->d), 0);
	pid_t p[4];
	assert_int_equal(it_find_pids("srun", id, p, 4), 0); /* stopped, not left running */
	assert_int_equal(it_find_pids("bertd-worker", id, p, 4), 0);
	restart_daemon(c);
	json_t *job = it_wait_job(&c->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&c->d, job);
	assert_true(it_has_event(&c->d, id, "daemon shutting down; resumes on next start"));
	assert_true(it_has_event(&c->d, id, "resuming from checkpoint"));
	assert_false(it_has_event(&c->d, id, "adopted the multi-node attempt"));
	it_sha_of_export(job, got);
	assert_string_equal(got, ref);
	json_decref(job);
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
		cmocka_unit_test(kill9_daemon_adopts_two_node_job),
		cmocka_unit_test(job_completes_without_daemon),
		cmocka_unit_test(sigquit_leaves_two_node_job_running),
		cmocka_unit_test(clean_stop_stops_two_node_job),
	};
	return IT_RUN(tests, setup, teardown);
}
