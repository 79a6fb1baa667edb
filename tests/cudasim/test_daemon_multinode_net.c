/* GPU ranks across "nodes" on the stand-in: the private Slurm cluster of
 * tests/integration/multinode_slurm.sh (n1, n2 on loopback), bertd with
 * --devices cuda, the bertd-worker of tests/cudasim/bin (CUDA runtime,
 * cuBLAS(Lt) and NCCL are the CPU stand-in) and multinode_comm=net:
 *   - 2 nodes x 1 GPU: gradients over (the stand-in's) NCCL, the loop's
 *     control traffic (metric sums, eval sums, the replica check at each
 *     save, the barrier) over the network comm backend — every rank says
 *     it joined over the network, the job completes, and its export is
 *     bit-identical (sha256) to 1 node x 2 GPUs', whose control traffic
 *     went over shared memory; its held-out eval_loss equals it exactly.
 * Skips (77) without Slurm/munge or without libgloo-dev.
 * Env (meson.build): as cudasim_daemon_job, plus BERTD_MULTINODE_SLURM and
 * BERTD_HAVE_GLOO. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
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

#include "harness.h"
#include "it_cluster.h"

#define DEADLINE_S 600

typedef it_cluster fx;

static const char *script(void)
{
	const char *s = getenv("BERTD_MULTINODE_SLURM");
	return s ? s : "tests/integration/multinode_slurm.sh";
}

static int setup(void **state)
{
	const char *bin = getenv("IT_CUDASIM_BIN_DIR");
	fx *f = calloc(1, sizeof *f);
	if (!bin || !f || it_cluster_init(f, script()))
		return -1;
	*state = f;
	if (it_cluster_start_slurm(f, 2))
		return -1;
	const char *extra[] = {"--devices", "cuda", "--bin-dir", bin, "--pass-env", "CUDASIM_*:LD_LIBRARY_PATH",
			       "--relay-host", "127.0.0.1", "--slurm-immediate-s", "30", "--multinode-comm", "net",
			       NULL};
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

/* cudasim_daemon_job's bert-tiny in fp32, 20 steps, eval and a save (the
 * replica check) at 10 and 20; res is the resources object. */
#define SPEC(name, res)                                                                                   \
	"{\"name\":\"" name "\",\"dataset\":\"shakes\","                                                  \
	"\"model\":{\"preset\":\"bert-tiny\",\"hidden_size\":32,\"num_hidden_layers\":1,"                 \
	"\"num_attention_heads\":2,\"intermediate_size\":64,\"max_position_embeddings\":64},"            \
	"\"training_args\":{\"per_device_train_batch_size\":8,\"max_seq_length\":32,\"max_steps\":20,"    \
	"\"logging_steps\":5,\"save_steps\":10,\"learning_rate\":0.01,\"warmup_steps\":2,"               \
	"\"dataloader_num_workers\":0,\"seed\":7,\"bf16\":false,\"fp16\":false,"                          \
	"\"eval_strategy\":\"steps\",\"eval_steps\":10,\"per_device_eval_batch_size\":12},"              \
	"\"mlm\":{\"validation_split_percentage\":10},\"resources\":" res "}"

/* The last metrics row's eval_loss (step 20). */
static double last_eval_loss(fx *f, const char *id)
{
	json_t *m = it_metrics_of(&f->d, id);
	double v = -1;
	size_t i;
	json_t *row;
	json_array_foreach(m, i, row) {
		json_t *e = json_object_get(row, "eval_loss");
		if (json_is_number(e))
			v = json_number_value(e);
	}
	json_decref(m);
	return v;
}

static void gpu_nodes_over_net_equal_one_node(void **state)
{
	fx *f = *state;
	char one[65], two[65], *id1, *id2;
	it_cluster_run_to_end(f, strdup(SPEC("gpu-1x2", "{\"gpus\":2}")), one, &id1, DEADLINE_S);
	it_cluster_run_to_end(f, strdup(SPEC("gpu-2x1", "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cuda\"}")), two,
			      &id2, DEADLINE_S);
	assert_int_equal(it_cluster_ranks_on_net(f, id1, "127.0.0.1"), 0);
	assert_int_equal(it_cluster_ranks_on_net(f, id2, "127.0.0.1"), 2);
	assert_string_equal(one, two);
	double e1 = last_eval_loss(f, id1), e2 = last_eval_loss(f, id2);
	assert_true(e1 > 0);
	assert_memory_equal(&e1, &e2, sizeof e1);
	free(id1);
	free(id2);
}

int main(void)
{
	if (it_cluster_skip(script(), true))
		return 77;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(gpu_nodes_over_net_equal_one_node),
	};
	return IT_RUN(tests, setup, teardown);
}
