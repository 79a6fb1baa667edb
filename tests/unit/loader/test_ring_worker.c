/* Whole pipeline on the CPU: bertd-prepare makes a dataset, two bertd-loader
 * processes feed bertd-worker through the job's ring, and the losses equal,
 * digit for digit, those of a worker that builds its batches serially
 * (dataloader_num_workers 0): the ring changes who builds a batch, never
 * what is in it. Corpus: ../shared/data's tinyshakespeare when present,
 * else /usr/share/common-licenses. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/jobspec.h"
#include "tests/testdata.h"

static char dir[256];

static const char *env_or(const char *k, const char *dflt)
{
	const char *v = getenv(k);
	return v ? v : dflt;
}

/* fork + exec argv with stdout/stderr to log (NULL: /dev/null). */
static pid_t spawn(const char *const *argv, const char *log)
{
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int fd = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(fd, 1);
		dup2(fd, 2);
		close_range(3, ~0u, 0);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

static int wait_code(pid_t pid)
{
	int st;
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

static int write_job(const char *file, int loaders, const char *tag)
{
	char text[1024], ds[512], ck[512], ex[512], shm[64];
	snprintf(text, sizeof(text),
		 "{\"name\": \"e2e\", \"dataset\": \"ds\", \"model\": {\"preset\": \"bert-tiny\"},"
		 " \"resources\": {\"gpus\": 1}, \"training_args\": {\"per_device_train_batch_size\": 8,"
		 " \"max_seq_length\": 64, \"max_steps\": 6, \"gradient_accumulation_steps\": 2,"
		 " \"dataloader_num_workers\": %d, \"logging_steps\": 1, \"save_steps\": 1000}}",
		 loaders);
	snprintf(ds, sizeof(ds), "%s/ds", dir);
	snprintf(ck, sizeof(ck), "%s/ck-%s", dir, tag);
	snprintf(ex, sizeof(ex), "%s/ex-%s", dir, tag);
	snprintf(shm, sizeof(shm), "/bertd-test-e2e-%d-%s", (int)getpid(), tag);
	json_error_t je;
	json_t *in = json_loads(text, 0, &je), *spec = NULL;
	jobspec_error err;
	if (!in || jobspec_normalize(in, &spec, &err))
		return -1;
	json_t *job = json_pack("{s:s, s:o, s:s, s:s, s:s, s:s, s:i, s:[{s:s, s:i}], s:n}", "job_id", "job-e2e",
				"spec", spec, "dataset_dir", ds, "checkpoint_dir", ck, "export_dir", ex, "shm_name",
				shm, "world_size", 1, "devices", "kind", "cpu", "index", 0, "resume_from");
	int rc = json_dump_file(job, file, JSON_INDENT(2));
	json_decref(job);
	json_decref(in);
	return rc;
}

/* The "step k/N loss X" part of each worker log line, concatenated. */
static char *losses(const char *log)
{
	FILE *f = fopen(log, "r");
	assert_non_null(f);
	char *out = calloc(1, 4096), line[1024];
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "step ");
		char *q = p ? strstr(p, " lr ") : NULL;
		if (p && q && strstr(p, " loss ") && strlen(out) + (size_t)(q - p) + 2 < 4096) {
			strncat(out, p, (size_t)(q - p));
			strcat(out, "\n");
		}
	}
	fclose(f);
	return out;
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/bertd-test-e2e-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	char ds[512], text[512], vocab[512];
	snprintf(ds, sizeof(ds), "%s/ds", dir);
	testdata_path(vocab, sizeof(vocab), "bert-base-uncased-vocab.txt");
	if (!testdata_shared(text, sizeof(text), "tinyshakespeare.txt",
			     "tinyshakespeare as the corpus (common-licenses instead)"))
		snprintf(text, sizeof(text), "%s", TESTDATA_LICENSES_DIR);
	fprintf(stderr, "corpus: %s\n", text);
	const char *argv[] = {env_or("BERTD_PREPARE_EXE", "loader/bertd-prepare"), "-o", ds, "--vocab", vocab,
			      text, NULL};
	return wait_code(spawn(argv, NULL)) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	const char *tags[] = {"ring", "serial"};
	for (int i = 0; i < 2; i++) {
		char shm[64];
		snprintf(shm, sizeof(shm), "/bertd-test-e2e-%d-%s", (int)getpid(), tags[i]);
		shm_unlink(shm);
	}
	return system(cmd) == 0 ? 0 : -1;
}

static void test_ring_equals_serial(void **state)
{
	(void)state;
	const char *worker = env_or("BERTD_WORKER_EXE", "worker/bertd-worker");
	const char *loader = env_or("BERTD_LOADER", "loader/bertd-loader");
	char job_r[512], job_s[512], log_r[512], log_s[512];
	snprintf(job_r, sizeof(job_r), "%s/job-ring.json", dir);
	snprintf(job_s, sizeof(job_s), "%s/job-serial.json", dir);
	snprintf(log_r, sizeof(log_r), "%s/worker-ring.log", dir);
	snprintf(log_s, sizeof(log_s), "%s/worker-serial.log", dir);
	assert_int_equal(write_job(job_r, 2, "ring"), 0);
	assert_int_equal(write_job(job_s, 0, "serial"), 0);

	const char *la[] = {loader, "--job", job_r, "--index", "0", "--count", "2", NULL};
	const char *lb[] = {loader, "--job", job_r, "--index", "1", "--count", "2", NULL};
	const char *wr[] = {worker, "--job", job_r, "--rank", "0", NULL};
	pid_t a = spawn(la, NULL), w = spawn(wr, log_r), b = spawn(lb, NULL);
	assert_int_equal(wait_code(w), 0);
	kill(a, SIGTERM); /* the daemon's way of ending loaders after the workers */
	kill(b, SIGTERM);
	assert_int_equal(wait_code(a), 0);
	assert_int_equal(wait_code(b), 0);

	const char *ws[] = {worker, "--job", job_s, "--rank", "0", NULL};
	assert_int_equal(wait_code(spawn(ws, log_s)), 0);

	char *lr = losses(log_r), *ls = losses(log_s);
	print_message("ring:\n%sserial:\n%s", lr, ls);
	assert_non_null(strstr(lr, "step 6/6 loss "));
	assert_string_equal(lr, ls);
	free(lr);
	free(ls);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ring_equals_serial),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
