/* Multi-node pieces that need no cluster (docs/multinode.md): the job
 * spec's resources.nodes x gpus_per_node, the dataset verdict naming the
 * nodes that differ, the relay token and listener, srun's command line,
 * and the submit-time node check (sinfo's output read, sinfo run with a
 * deadline: a fake sinfo beside a fake srun). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>

#include "common/jobspec.h"
#include "daemon/childenv.h"
#include "daemon/cluster.h"

static json_t *normalize(const char *text, jobspec_error *err)
{
	json_t *in = json_loads(text, 0, NULL), *out = NULL;
	assert_non_null(in);
	int rc = jobspec_normalize(in, &out, err);
	json_decref(in);
	return rc == 0 ? out : NULL;
}

static long long res_int(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(json_object_get(o, "resources"), k));
}

static void spec_nodes(void **state)
{
	(void)state;
	jobspec_error err;
	/* the default: one node, gpus_per_node null, as before */
	json_t *o = normalize("{\"dataset\":\"x\",\"resources\":{\"gpus\":3}}", &err);
	assert_non_null(o);
	assert_int_equal(res_int(o, "nodes"), 1);
	assert_true(json_is_null(json_object_get(json_object_get(o, "resources"), "gpus_per_node")));
	assert_int_equal(res_int(o, "gpus"), 3);
	json_decref(o);
	/* nodes x gpus_per_node ranks, written into gpus; normalizing again keeps it */
	o = normalize("{\"dataset\":\"x\",\"resources\":{\"nodes\":4,\"gpus_per_node\":8},"
		      "\"training_args\":{\"dataloader_num_workers\":0}}", &err);
	assert_non_null(o);
	assert_int_equal(res_int(o, "gpus"), 32);
	json_t *again = NULL;
	assert_int_equal(jobspec_normalize(o, &again, &err), 0);
	assert_true(json_equal(o, again));
	jobspec js;
	assert_int_equal(jobspec_from_json(again, &js, &err), 0);
	assert_int_equal(js.nodes, 4);
	assert_int_equal(js.gpus_per_node, 8);
	assert_int_equal(js.gpus, 32);
	json_decref(again);
	json_decref(o);

	static const struct { const char *spec, *field; } bad[] = {
		{"{\"dataset\":\"x\",\"resources\":{\"nodes\":2}}", "resources.gpus_per_node"},
		{"{\"dataset\":\"x\",\"resources\":{\"nodes\":2,\"gpus_per_node\":1,\"gpus\":3},"
		 "\"training_args\":{\"dataloader_num_workers\":0}}", "resources.gpus"},
		{"{\"dataset\":\"x\",\"resources\":{\"nodes\":9,\"gpus_per_node\":8},"
		 "\"training_args\":{\"dataloader_num_workers\":0}}", "resources.gpus_per_node"},
		{"{\"dataset\":\"x\",\"resources\":{\"nodes\":0}}", "resources.nodes"},
		{"{\"dataset\":\"x\",\"resources\":{\"nodes\":65}}", "resources.nodes"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		memset(&err, 0, sizeof err);
		assert_null(normalize(bad[i].spec, &err));
		assert_int_equal(err.status, 422);
		assert_string_equal(err.field, bad[i].field);
	}
}

static void dataset_verdict(void **state)
{
	(void)state;
	char node[3][64] = {"n1", "n2", "n3"};
	char sha[3][CLUSTER_TOKEN_HEX + 1] = {"aaaa1111", "aaaa1111", "aaaa1111"};
	char why[600] = "";
	assert_int_equal(cluster_dataset_verdict((const char(*)[64])node,
						 (const char(*)[CLUSTER_TOKEN_HEX + 1])sha, 3, "wiki", why,
						 sizeof why), 0);
	strcpy(sha[2], "bbbb2222");
	assert_int_equal(cluster_dataset_verdict((const char(*)[64])node,
						 (const char(*)[CLUSTER_TOKEN_HEX + 1])sha, 3, "wiki", why,
						 sizeof why), -EINVAL);
	assert_non_null(strstr(why, "\"wiki\""));
	assert_non_null(strstr(why, "n1 has content digest aaaa1111"));
	assert_non_null(strstr(why, "n3 has bbbb2222"));
	sha[1][0] = 0; /* n2 has no dataset at all */
	assert_int_equal(cluster_dataset_verdict((const char(*)[64])node,
						 (const char(*)[CLUSTER_TOKEN_HEX + 1])sha, 3, "wiki", why,
						 sizeof why), -ENOENT);
	assert_non_null(strstr(why, "missing on node n2"));
	/* missing everywhere is no agreement either */
	sha[0][0] = sha[2][0] = 0;
	assert_int_equal(cluster_dataset_verdict((const char(*)[64])node,
						 (const char(*)[CLUSTER_TOKEN_HEX + 1])sha, 3, "wiki", why,
						 sizeof why), -ENOENT);
	assert_non_null(strstr(why, "missing on node n1"));
}

/* A later daemon's relay: the same address and port again, with a
 * connection of the earlier one's still in TIME_WAIT; refused when
 * relay_host names another address, or the record is damaged. */
static void relay_reopen(void **state)
{
	(void)state;
	cluster_attempt a;
	assert_int_equal(cluster_attempt_open(&a, "127.0.0.1", "job-0456"), 0);
	char addr[300];
	snprintf(addr, sizeof addr, "%s", a.addr);
	/* a rank's connection, closed by the daemon's end first (TIME_WAIT there) */
	int port = atoi(strrchr(a.addr, ':') + 1);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	int cfd = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(cfd, (struct sockaddr *)&sa, sizeof sa), 0);
	struct pollfd p = {.fd = a.listen_fd, .events = POLLIN};
	assert_int_equal(poll(&p, 1, 5000), 1);
	int sfd = accept(a.listen_fd, NULL, NULL);
	assert_true(sfd >= 0);
	close(sfd);
	close(cfd);
	cluster_attempt_close(&a);

	cluster_attempt b = a; /* as the attempt record has it */
	b.listen_fd = -1;
	assert_int_equal(cluster_attempt_reopen(&b, "127.0.0.1"), 0);
	assert_true(b.listen_fd >= 0);
	assert_string_equal(b.addr, addr);
	cfd = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(cfd, (struct sockaddr *)&sa, sizeof sa), 0); /* the ranks' address answers */
	close(cfd);
	cluster_attempt_close(&b);

	cluster_attempt c = a;
	assert_int_equal(cluster_attempt_reopen(&c, "127.0.0.2"), -EADDRNOTAVAIL);
	assert_int_equal(c.listen_fd, -1);
	assert_string_equal(c.addr, addr); /* kept: the ranks still dial it */
	snprintf(c.addr, sizeof c.addr, "127.0.0.1:none");
	assert_int_equal(cluster_attempt_reopen(&c, "127.0.0.1"), -EINVAL);
	c = a;
	c.token[3] = 0;
	assert_int_equal(cluster_attempt_reopen(&c, "127.0.0.1"), -EINVAL);
}

static void relay_and_srun(void **state)
{
	(void)state;
	cluster_attempt a;
	assert_int_equal(cluster_attempt_open(&a, "127.0.0.1", "job-0123"), 0);
	assert_true(a.listen_fd >= 0);
	assert_int_equal((int)strlen(a.token), CLUSTER_TOKEN_HEX);
	assert_true(cluster_token_ok(&a, a.token));
	char other[CLUSTER_TOKEN_HEX + 1];
	strcpy(other, a.token);
	other[5] = other[5] == '0' ? '1' : '0';
	assert_false(cluster_token_ok(&a, other));
	assert_false(cluster_token_ok(&a, ""));
	assert_false(cluster_token_ok(&a, NULL));
	assert_int_equal(strncmp(a.addr, "127.0.0.1:", 10), 0);
	assert_int_equal(strncmp(a.slurm_name, "bertd-job-0123-", 15), 0);

	/* the listener takes a connection at the advertised address */
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(a.addr + 10))};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);

	cluster_argv av;
	cluster_srun_argv(&av, "/usr/bin/srun", 2, 8, 0, 60, &a, "/opt/bertd/bertd-worker", "/s/jobs/j/job.json");
	const char *want[] = {"/usr/bin/srun", "--nodes=2", "--ntasks-per-node=8", "--immediate=60", NULL,
			      "/opt/bertd/bertd-worker", "--job", "/s/jobs/j/job.json"};
	for (int i = 0; i < 8; i++)
		if (want[i])
			assert_string_equal(av.argv[i], want[i]);
	assert_int_equal(strncmp(av.argv[4], "--job-name=bertd-job-0123-", 26), 0);
	assert_null(av.argv[8]);

	/* as the supervisor makes it: the helper environment of the daemon's */
	char *daemon_env[] = {"HOME=/root", "NCCL_DEBUG=INFO", NULL};
	childenv_pass pass;
	char why[200];
	assert_int_equal(childenv_pass_parse(&pass, CHILDENV_DEFAULT_PASS, why, sizeof why), 0);
	childenv *henv = NULL;
	assert_int_equal(childenv_helper(&henv, &pass, daemon_env), 0);
	cluster_env *e = NULL;
	assert_int_equal(cluster_srun_env(&e, henv->envp, 4, &a, "/etc/slurm/x.conf"), 0);
	bool relay = false, conf = false, nccl = false, omp = false;
	for (char **p = e->envp; *p; p++) {
		relay |= strncmp(*p, "BERTD_RELAY=127.0.0.1:", 22) == 0;
		conf |= strcmp(*p, "SLURM_CONF=/etc/slurm/x.conf") == 0;
		nccl |= strcmp(*p, "NCCL_DEBUG=INFO") == 0; /* pass_env's NCCL_* reach every rank */
		omp |= strcmp(*p, "OMP_NUM_THREADS=4") == 0;
		/* NCCL chooses the interface across nodes: never loopback */
		if (strncmp(*p, "NCCL_SOCKET_IFNAME=", 19) == 0)
			fail_msg("a multi-node rank got %s", *p);
	}
	assert_true(relay && conf && nccl && omp);
	free(e);
	free(henv); /* e's entries point into it (its PATH) */
	cluster_attempt_close(&a);
	assert_int_equal(a.listen_fd, -1);
}

/* A GPU job's srun asks for the GPUs (--gpus-per-node); the fence file
 * names the attempt while it runs and "over" after; the ranks are told
 * the attempt, the fence and the relay's keepalive bound. */
static void gpus_fence_and_timeout(void **state)
{
	(void)state;
	cluster_attempt a;
	assert_int_equal(cluster_attempt_open(&a, "127.0.0.1", "job-77"), 0);
	assert_int_equal(a.relay_timeout_ms, CLUSTER_RELAY_TIMEOUT_MS);
	cluster_argv av;
	cluster_srun_argv(&av, "/usr/bin/srun", 2, 4, 4, 60, &a, "/w", "/j.json");
	assert_string_equal(av.argv[5], "--gpus-per-node=4");
	assert_string_equal(av.argv[6], "/w");
	assert_null(av.argv[9]);

	char dir[] = "/tmp/bertd-fence-XXXXXX", path[64], line[128] = "";
	assert_non_null(mkdtemp(dir));
	assert_int_equal(cluster_fence_open(&a, dir), 0);
	snprintf(path, sizeof path, "%s/attempt", dir);
	assert_string_equal(a.fence, path);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	assert_non_null(fgets(line, sizeof line, f));
	fclose(f);
	char want[128];
	snprintf(want, sizeof want, "%s\n", a.slurm_name);
	assert_string_equal(line, want);

	a.relay_timeout_ms = 5000;
	char *base[] = {NULL};
	cluster_env *e = NULL;
	assert_int_equal(cluster_srun_env(&e, base, 1, &a, ""), 0);
	bool attempt = false, fence = false, timeout = false;
	for (char **p = e->envp; *p; p++) {
		attempt |= strncmp(*p, "BERTD_ATTEMPT=bertd-job-77-", 27) == 0;
		fence |= strncmp(*p, "BERTD_FENCE=", 12) == 0 && strcmp(*p + 12, path) == 0;
		timeout |= strcmp(*p, "BERTD_RELAY_TIMEOUT_MS=5000") == 0;
	}
	assert_true(attempt && fence && timeout);
	free(e);

	assert_int_equal(cluster_fence_close(&a), 0);
	f = fopen(path, "r");
	assert_non_null(f);
	assert_non_null(fgets(line, sizeof line, f));
	fclose(f);
	assert_string_equal(line, "over\n");
	unlink(path);
	rmdir(dir);
	cluster_attempt_close(&a);
}

/* sinfo -h -N -o "%N %t": a node listed once per partition counts once;
 * down, drained, draining, failed, not responding ("*") are not up; busy
 * (alloc, mix) and cloud nodes powered off ("idle~") are. */
static void sinfo_parse(void **state)
{
	(void)state;
	cluster_nodes cn;
	char why[300] = "";
	assert_int_equal(cluster_sinfo_parse("n1 idle\nn2 idle\n", &cn, why, sizeof why), 0);
	assert_int_equal(cn.total, 2);
	assert_int_equal(cn.up, 2);
	assert_int_equal(cn.ndown, 0);
	assert_string_equal(cn.down, "");

	const char *mixed = "n1 alloc\nn2 down\nn3 drain\nn4 idle*\nn5 mix\nn6 idle~\nn7 drng\n"
			    "n2 down\nn8 comp\nn9 fail\n\n";
	assert_int_equal(cluster_sinfo_parse(mixed, &cn, why, sizeof why), 0);
	assert_int_equal(cn.total, 9);
	assert_int_equal(cn.up, 4); /* n1 n5 n6 n8 */
	assert_int_equal(cn.ndown, 5);
	assert_string_equal(cn.down, "n2 (down), n3 (drain), n4 (idle*), n7 (drng), n9 (fail)");

	assert_int_equal(cluster_sinfo_parse("", &cn, why, sizeof why), 0);
	assert_int_equal(cn.total, 0);

	/* not "<node> <state>": refused, naming the line */
	assert_int_equal(cluster_sinfo_parse("n1 idle\nsinfo: error: oops\n", &cn, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "sinfo: error: oops"));
	assert_int_equal(cluster_sinfo_parse("n1\n", &cn, why, sizeof why), -EINVAL);

	/* many down nodes: whole entries, then ", ..."; the count stays exact */
	char big[20000] = "";
	for (int i = 0; i < 500; i++)
		snprintf(big + strlen(big), sizeof big - strlen(big), "node%03d down*\n", i);
	assert_int_equal(cluster_sinfo_parse(big, &cn, why, sizeof why), 0);
	assert_int_equal(cn.total, 500);
	assert_int_equal(cn.up, 0);
	assert_int_equal(cn.ndown, 500);
	assert_true(cn.cut);
	size_t n = strlen(cn.down);
	assert_true(n < sizeof cn.down);
	assert_string_equal(cn.down + n - 5, ", ...");
	assert_non_null(strstr(cn.down, "node000 (down*), node001 (down*)"));
}

/* A fake srun directory whose sinfo is body (a sh script). */
static void fake_sinfo(const char *dir, const char *body, char *srun, size_t cap)
{
	char p[300];
	snprintf(p, sizeof p, "%s/sinfo", dir);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fprintf(f, "#!/bin/sh\n%s\n", body);
	fclose(f);
	assert_int_equal(chmod(p, 0700), 0);
	snprintf(srun, cap, "%s/srun", dir);
}

/* cluster_sinfo runs the sinfo beside srun with SLURM_CONF and its
 * arguments; a failing sinfo is named with its exit and stderr; one that
 * does not answer is killed at the deadline (its sleep would last 10 min). */
static void sinfo_run(void **state)
{
	(void)state;
	char dir[] = "/tmp/bertd-sinfo-XXXXXX", srun[300], why[600] = "";
	assert_non_null(mkdtemp(dir));
	cluster_nodes cn;
	fake_sinfo(dir,
		   "[ \"$SLURM_CONF\" = /x/slurm.conf ] && [ \"$*\" = '-h -N -o %N %t' ] || exit 3\n"
		   "printf 'n1 idle\\nn2 down\\n'",
		   srun, sizeof srun);
	assert_int_equal(cluster_sinfo(srun, "/x/slurm.conf", 10000, &cn, why, sizeof why), 0);
	assert_int_equal(cn.total, 2);
	assert_int_equal(cn.up, 1);
	assert_string_equal(cn.down, "n2 (down)");

	fake_sinfo(dir, "echo 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
		   srun, sizeof srun);
	assert_int_equal(cluster_sinfo(srun, "", 10000, &cn, why, sizeof why), -EIO);
	assert_non_null(strstr(why, "exited with 1: sinfo: error: Unable to contact slurm controller"));

	fake_sinfo(dir, "exec sleep 600", srun, sizeof srun);
	assert_int_equal(cluster_sinfo(srun, "", 300, &cn, why, sizeof why), -ETIMEDOUT);
	assert_non_null(strstr(why, "did not answer within 300 ms"));
	/* output closed, still running: the deadline holds too */
	fake_sinfo(dir, "exec >&- 2>&-; exec sleep 600", srun, sizeof srun);
	assert_int_equal(cluster_sinfo(srun, "", 300, &cn, why, sizeof why), -ETIMEDOUT);

	char p[300];
	snprintf(p, sizeof p, "%s/sinfo", dir);
	unlink(p);
	assert_int_equal(cluster_sinfo(srun, "", 10000, &cn, why, sizeof why), -ENOENT);
	assert_non_null(strstr(why, "cannot run "));
	assert_non_null(strstr(why, "/sinfo: No such file or directory"));
	rmdir(dir);
}

static void fake_tool(const char *dir, const char *tool, const char *body)
{
	char p[300];
	snprintf(p, sizeof p, "%s/%s", dir, tool);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fprintf(f, "#!/bin/sh\n%s\n", body);
	fclose(f);
	assert_int_equal(chmod(p, 0700), 0);
}

/* Slurm's job state of an attempt: sacct's where accounting is kept; else
 * squeue's record, asked again while the job is completing; only Slurm's
 * own decisions count as its own (not the FAILED bertd's kill leaves). */
static void slurm_state(void **state)
{
	(void)state;
	char dir[] = "/tmp/bertd-sacct-XXXXXX", srun[300], out[200], p[300];
	assert_non_null(mkdtemp(dir));
	snprintf(srun, sizeof srun, "%s/srun", dir);
	cluster_attempt a = {.listen_fd = -1};
	snprintf(a.slurm_name, sizeof a.slurm_name, "bertd-job-9-abcd");
	fake_tool(dir, "sacct",
		  "[ \"$*\" = '-n -X -P --name=bertd-job-9-abcd -o State,Reason' ] || exit 3\n"
		  "echo 'NODE_FAIL|None'");
	assert_int_equal(cluster_slurm_state(&a, srun, "", 5000, out, sizeof out), 0);
	assert_string_equal(out, "NODE_FAIL");
	assert_true(cluster_state_own(out));

	/* no accounting: squeue, until the job is no longer completing */
	fake_tool(dir, "sacct", "echo 'Slurm accounting storage is disabled' >&2; exit 1");
	char body[600];
	snprintf(body, sizeof body,
		 "[ \"$*\" = '-h -t all --name=bertd-job-9-abcd -o %%T|%%r' ] || exit 3\n"
		 "if [ -e %s/seen ]; then echo 'CANCELLED|None'; else touch %s/seen; echo 'COMPLETING|None'; fi",
		 dir, dir);
	fake_tool(dir, "squeue", body);
	assert_int_equal(cluster_slurm_state(&a, srun, "", 5000, out, sizeof out), 0);
	assert_string_equal(out, "CANCELLED");
	assert_true(cluster_state_own(out));
	fake_tool(dir, "squeue", "echo 'TIMEOUT|TimeLimit'");
	assert_int_equal(cluster_slurm_state(&a, srun, "", 5000, out, sizeof out), 0);
	assert_string_equal(out, "TIMEOUT (TimeLimit)");
	assert_true(cluster_state_own(out));
	fake_tool(dir, "squeue", "echo 'FAILED|JobLaunchFailure'");
	assert_int_equal(cluster_slurm_state(&a, srun, "", 5000, out, sizeof out), 0);
	assert_false(cluster_state_own(out)); /* what srun ended by bertd leaves */
	assert_false(cluster_state_own("CANCELLEDX"));
	fake_tool(dir, "squeue", "true"); /* no record */
	assert_int_equal(cluster_slurm_state(&a, srun, "", 5000, out, sizeof out), -ENOENT);
	fake_tool(dir, "squeue", "echo 'COMPLETING|None'"); /* still completing at the deadline */
	assert_int_equal(cluster_slurm_state(&a, srun, "", 300, out, sizeof out), 0);
	assert_string_equal(out, "COMPLETING");
	const char *names[] = {"sacct", "squeue", "seen"};
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(spec_nodes),
		cmocka_unit_test(dataset_verdict),
		cmocka_unit_test(relay_and_srun),
		cmocka_unit_test(relay_reopen),
		cmocka_unit_test(gpus_fence_and_timeout),
		cmocka_unit_test(sinfo_parse),
		cmocka_unit_test(sinfo_run),
		cmocka_unit_test(slurm_state),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
