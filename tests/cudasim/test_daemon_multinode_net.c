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
#include "it_util.h"

#define DEADLINE_S 600

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
	const char *bin = getenv("IT_CUDASIM_BIN_DIR");
	fx *f = calloc(1, sizeof *f);
	if (!bin || !f || bertd_init(&f->d))
		return -1;
	*state = f;
	snprintf(f->data, sizeof f->data, "%s/data", f->d.root);
	snprintf(f->slurm, sizeof f->slurm, "%s/slurm", f->d.root);
	snprintf(f->conf, sizeof f->conf, "%s/slurm.conf", f->slurm);
	mkdir(f->data, 0700);
	mkdir(f->slurm, 0700);
	char cmd[700];
	snprintf(cmd, sizeof cmd, "%s start %s %d %d %d >/dev/null", script(), f->slurm, free_port(), free_port(),
		 free_port());
	if (system(cmd) != 0) {
		fprintf(stderr, "the private Slurm cluster did not start (%s)\n", cmd);
		return -1;
	}
	const char *extra[] = {"--data-roots", f->data, "--devices", "cuda", "--bin-dir", bin,
			       "--pass-env", "CUDASIM_*:LD_LIBRARY_PATH", "--schedule", "true",
			       "--stop-timeout-s", "60", "--slurm-srun", "/usr/bin/srun", "--slurm-conf", f->conf,
			       "--relay-host", "127.0.0.1", "--slurm-immediate-s", "30", "--multinode-comm", "net",
			       NULL};
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

static char *run_to_end(fx *f, const char *spec, char sha[65])
{
	char *id = it_submit(&f->d, spec);
	json_t *j = it_wait_job(&f->d, id, "completed|failed|canceled", DEADLINE_S);
	it_assert_completed(&f->d, j);
	it_sha_of_export(j, sha);
	json_decref(j);
	return id;
}

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
	char one[65], two[65];
	char *id1 = run_to_end(f, SPEC("gpu-1x2", "{\"gpus\":2}"), one);
	char *id2 = run_to_end(f, SPEC("gpu-2x1", "{\"nodes\":2,\"gpus_per_node\":1,\"device\":\"cuda\"}"), two);
	assert_int_equal(ranks_on_net(f, id1), 0);
	assert_int_equal(ranks_on_net(f, id2), 2);
	assert_string_equal(one, two);
	double e1 = last_eval_loss(f, id1), e2 = last_eval_loss(f, id2);
	assert_true(e1 > 0);
	assert_memory_equal(&e1, &e2, sizeof e1);
	free(id1);
	free(id2);
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
		cmocka_unit_test(gpu_nodes_over_net_equal_one_node),
	};
	return IT_RUN(tests, setup, teardown);
}
