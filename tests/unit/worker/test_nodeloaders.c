/* A multi-node job's loaders on one node (worker/nodeloaders.c): the
 * node's ring from Slurm's view of it (ranks, name, batch range), bad
 * views refused, and a loader that cannot run seen as a failure by the
 * node's first rank instead of a wait for batches that never come. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "worker/nodeloaders.h"

/* A job of 4 ranks, 10 steps, accumulation 3, 2 loaders, resumed at 4. */
static void job(batchjob *bj)
{
	memset(bj, 0, sizeof *bj);
	snprintf(bj->shm_name, sizeof bj->shm_name, "/bertd-job-x");
	bj->world_size = 4;
	bj->start_step = 4;
	bj->spec.training.dataloader_num_workers = 2;
	bj->spec.training.max_steps = 10;
	bj->ring.M = 3;
	bj->ring.G = 4;
}

static void slurm(const char *local, const char *per_node, const char *node)
{
	setenv("SLURM_LOCALID", local, 1);
	setenv("SLURM_NTASKS_PER_NODE", per_node, 1);
	setenv("SLURM_NODEID", node, 1);
	setenv("BERTD_ATTEMPT", "bertd-job-x-9daa7830", 1);
}

static void plan_from_slurm(void **state)
{
	(void)state;
	batchjob bj;
	char why[300];
	int rr = -1;
	bool first = true;
	job(&bj);
	slurm("1", "2", "1"); /* world rank 3: the second rank of node 1 */
	assert_int_equal(nodeloaders_plan(&bj, 3, &rr, &first, why, sizeof why), 0);
	assert_int_equal(rr, 1);
	assert_false(first);
	assert_string_equal(bj.shm_name, "/bertd-job-x-9daa7830-n1");
	assert_string_equal(getenv("BERTD_RING_NODE"), "2,2,9daa7830-n1");
	assert_int_equal(bj.ring.W, 4);
	assert_int_equal(bj.ring.R0, 2);
	assert_int_equal(bj.ring.G, 2);
	assert_int_equal(bj.ring.start_batch, 4 * 3 * 2); /* the node's batches: step x M x its ranks */
	assert_int_equal(bj.ring.end_batch, 10 * 3 * 2);
	/* node 1's ring batch 5 is world batch (5/2)*4 + 2 + 1 */
	assert_int_equal(ring_world_batch(&bj.ring, 5), 11);

	job(&bj);
	slurm("0", "2", "0");
	assert_int_equal(nodeloaders_plan(&bj, 0, &rr, &first, why, sizeof why), 0);
	assert_int_equal(rr, 0);
	assert_true(first);
	assert_string_equal(bj.shm_name, "/bertd-job-x-9daa7830-n0");
}

static void bad_views_refused(void **state)
{
	(void)state;
	batchjob bj;
	char why[300];
	int rr;
	bool first;
	job(&bj);
	slurm("1", "4", "1"); /* 4 per node from rank 2: ranks 2..5 of 4 */
	assert_int_equal(nodeloaders_plan(&bj, 3, &rr, &first, why, sizeof why), -EINVAL);
	job(&bj);
	slurm("2", "2", "0"); /* local id beyond the node's ranks */
	assert_int_equal(nodeloaders_plan(&bj, 2, &rr, &first, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "SLURM_LOCALID"));
	job(&bj);
	unsetenv("SLURM_NTASKS_PER_NODE");
	assert_int_equal(nodeloaders_plan(&bj, 0, &rr, &first, why, sizeof why), -EINVAL);
}

static void loader_that_cannot_run_is_a_failure(void **state)
{
	(void)state;
	batchjob bj;
	char why[300] = "", dir[] = "/tmp/nodeloaders-XXXXXX", job_path[64], logs[64];
	int rr;
	bool first;
	assert_non_null(mkdtemp(dir));
	snprintf(job_path, sizeof job_path, "%s/job.json", dir);
	snprintf(logs, sizeof logs, "%s/logs", dir);
	assert_int_equal(mkdir(logs, 0700), 0);
	job(&bj);
	slurm("0", "2", "0");
	assert_int_equal(nodeloaders_plan(&bj, 0, &rr, &first, why, sizeof why), 0);
	nodeloaders nl = {0};
	assert_int_equal(nodeloaders_start(&nl, &bj, "/nonexistent/bertd-worker", job_path, why, sizeof why), 0);
	assert_int_equal(nl.n, 2);
	int rc = 0;
	for (int i = 0; i < 6000 && rc == 0; i++) { /* bounded: the child's exec fails at once */
		rc = nodeloaders_check(&nl, why, sizeof why);
		if (rc == 0)
			poll(NULL, 0, 10);
	}
	assert_int_equal(rc, -EPIPE);
	assert_non_null(strstr(why, "exited with 127"));
	int which = -1;
	assert_int_equal(sscanf(why, "loader %d", &which), 1);
	nodeloaders_stop(&nl); /* the other one may be stopped before it ran */
	assert_int_equal(nl.n, 0);
	/* what the loader that ended said is in its log */
	char log[128], buf[256] = "";
	snprintf(log, sizeof log, "%s/loader-9daa7830-n0-%d.log", logs, which);
	FILE *f = fopen(log, "r");
	assert_non_null(f);
	assert_non_null(fgets(buf, sizeof buf, f));
	fclose(f);
	assert_non_null(strstr(buf, "/nonexistent/bertd-loader"));
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
	/* a worker started without a path cannot find its loader */
	job(&bj);
	assert_int_equal(nodeloaders_plan(&bj, 0, &rr, &first, why, sizeof why), 0);
	assert_int_equal(nodeloaders_start(&nl, &bj, "bertd-worker", job_path, why, sizeof why), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(plan_from_slurm),
		cmocka_unit_test(bad_views_refused),
		cmocka_unit_test(loader_that_cannot_run_is_a_failure),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
