/* bertd-loader as a real executable: its exit codes (common/exitcodes.h), batches byte-identical to
 * the serial path while one of two loaders is killed with SIGKILL, a graceful
 * SIGTERM, and exit on parent death (PR_SET_PDEATHSIG). */
#include <errno.h>
#include <fcntl.h>
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

#include "common/sha256.h"
#include "loader/mlm.h"
#include "loader/ring.h"
#include "test_mlm_fixture.h"

#define NG 2
#define NM 1
#define NB 4
#define NT 64
#define NBATCH 200
#define SEED "99"
#define NEXT_TIMEOUT_MS 60000 /* hang guard only */

static synth_corpus sc;
static mlm_dataset *ds;
static batch_layout lay;
static char dir[256];
static char ref[NBATCH][65];
static uint64_t tag;
static int counter;

static int write_file(const char *name, const void *p, size_t n)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = fwrite(p, 1, n, f);
	fclose(f);
	return w == n ? 0 : -1;
}

static int setup(void **state)
{
	(void)state;
	synth_spec sp = {.n_docs = 200, .min_sents = 1, .max_sents = 8, .min_len = 1, .max_len = 30,
			 .empty_doc_every = 13, .vocab_size = 30522, .token_bytes = 2, .seed = 4};
	if (synth_build(&sc, &sp))
		return -1;
	snprintf(dir, sizeof(dir), "/tmp/bertd-test-raw-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	const corpus_view *v = &sc.view;
	char meta[256];
	int n = snprintf(meta, sizeof(meta),
			 "format bertd-rawtok-1\ntoken_bytes 2\nvocab_size 30522\npad 0\nunk 1\ncls 2\nsep 3\nmask 4\n");
	if (write_file("meta.txt", meta, (size_t)n) || write_file("tokens.bin", v->tokens, v->n_tokens * 2) ||
	    write_file("sent_off.bin", v->sent_off, (v->n_sents + 1) * 8) ||
	    write_file("doc_off.bin", v->doc_off, (v->n_docs + 1) * 8))
		return -1;
	mlm_config cfg;
	mlm_config_defaults(&cfg, NT);
	cfg.seed = strtoull(SEED, NULL, 10);
	tag = mlm_config_digest(&cfg);
	if (mlm_dataset_create(&ds, v, 1, &cfg) || batch_layout_init(&lay, NB, NT, cfg.max_pred))
		return -1;
	void *slot = aligned_alloc(BATCH_ALIGN, lay.slot_bytes);
	for (uint64_t b = 0; b < NBATCH; b++) {
		if (mlm_batch_build(ds, &lay, NG, NM, b, slot))
			return -1;
		sha256_hex(slot, lay.slot_bytes, ref[b]);
	}
	free(slot);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int k = 0; k < counter; k++) { /* left by a failed assert */
		char name[64];
		snprintf(name, sizeof(name), "/bertd-test-ld-%d-%d", (int)getpid(), k);
		shm_unlink(name);
	}
	const char *names[] = {"meta.txt", "tokens.bin", "sent_off.bin", "doc_off.bin"};
	for (int i = 0; i < 4; i++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		unlink(path);
	}
	rmdir(dir);
	mlm_dataset_destroy(ds);
	synth_free(&sc);
	return 0;
}

static const char *loader_path(void)
{
	const char *p = getenv("BERTD_LOADER");
	return p ? p : "loader/bertd-loader";
}

/* Starts bertd-loader with argv (NULL-terminated, program name excluded). */
static pid_t spawn_loader(const char *const *args)
{
	pid_t pid = fork();
	if (pid == 0) {
		const char *argv[32];
		int n = 0;
		argv[n++] = loader_path();
		for (; args[n - 1] && n < 31; n++)
			argv[n] = args[n - 1];
		argv[n] = NULL;
		int devnull = open("/dev/null", O_WRONLY);
		if (getenv("BERTD_TEST_VERBOSE") == NULL && devnull >= 0)
			dup2(devnull, 2);
		close_range(3, ~0u, 0); /* no test pipes leak into the loader */
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

static int exit_code(pid_t pid)
{
	int st;
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return WEXITSTATUS(st);
}

static ring *make_ring(char *name, size_t n, uint64_t end, uint64_t job_tag)
{
	snprintf(name, n, "/bertd-test-ld-%d-%d", (int)getpid(), counter++);
	ring_params p = {.G = NG, .S = 3, .M = NM, .lease_ms = 50, .layout = lay, .start_batch = 0,
			 .end_batch = end, .job_tag = job_tag};
	ring *r = NULL;
	assert_int_equal(ring_create(&r, name, &p), 0);
	return r;
}

static void consume_check(ring *r, uint64_t from, uint64_t to, pid_t kill_at_pid, uint64_t kill_at)
{
	for (uint64_t b = from; b < to; b++) {
		if (kill_at_pid > 0 && b == kill_at)
			kill(kill_at_pid, SIGKILL);
		void *slot;
		assert_int_equal(ring_next(r, (uint32_t)(b % NG), NEXT_TIMEOUT_MS, &slot), 0);
		char hex[65];
		sha256_hex(slot, lay.slot_bytes, hex);
		if (b < NBATCH) {
			assert_string_equal(hex, ref[b]);
		} else { /* past the precomputed table: build the reference now */
			void *want = aligned_alloc(BATCH_ALIGN, lay.slot_bytes);
			char wh[65];
			assert_int_equal(mlm_batch_build(ds, &lay, NG, NM, b, want), 0);
			sha256_hex(want, lay.slot_bytes, wh);
			free(want);
			assert_string_equal(hex, wh);
		}
		ring_release(r, (uint32_t)(b % NG));
	}
}

static void test_exit_codes(void **state)
{
	(void)state;
	char name[64];
	assert_int_equal(exit_code(spawn_loader((const char *[]){NULL})), 2);
	assert_int_equal(exit_code(spawn_loader((const char *[]){"--ring", "/x", "--raw", dir, "--seed", "z", NULL})),
			 2);
	/* no such ring */
	assert_int_equal(
		exit_code(spawn_loader((const char *[]){"--ring", "/bertd-test-none", "--raw", dir, NULL})), 2);
	ring *r = make_ring(name, sizeof(name), NBATCH, tag);
	/* no such dataset */
	assert_int_equal(exit_code(spawn_loader((const char *[]){"--ring", name, "--raw", "/nonexistent", NULL})),
			 5);
	/* options that would make different batches than the job's */
	assert_int_equal(exit_code(spawn_loader((const char *[]){"--ring", name, "--raw", dir, "--seed", "7", NULL})),
			 2);
	ring_detach(r);
	ring_unlink(name);
	/* a dataset smaller than one batch of the ring's geometry */
	batch_layout big;
	assert_int_equal(batch_layout_init(&big, 4096, NT, lay.P), 0);
	snprintf(name, sizeof(name), "/bertd-test-ld-%d-%d", (int)getpid(), counter++);
	ring_params p = {.G = 1, .S = 1, .M = 1, .layout = big, .end_batch = 1};
	assert_int_equal(ring_create(&r, name, &p), 0);
	assert_int_equal(exit_code(spawn_loader((const char *[]){"--ring", name, "--raw", dir, NULL})), 5);
	ring_detach(r);
	ring_unlink(name);
}

static void test_two_loaders_one_killed(void **state)
{
	(void)state;
	char name[64];
	ring *r = make_ring(name, sizeof(name), NBATCH, tag);
	const char *args[] = {"--ring", name, "--raw", dir, "--seed", SEED, NULL};
	pid_t a = spawn_loader(args), b = spawn_loader(args);
	consume_check(r, 0, NBATCH, a, NBATCH / 3);
	ring_shutdown(r);
	assert_int_equal(exit_code(a), 128 + SIGKILL);
	assert_int_equal(exit_code(b), 0);
	ring_detach(r);
	ring_unlink(name);
}

static void test_sigterm_gives_claim_back(void **state)
{
	(void)state;
	char name[64];
	ring *r = make_ring(name, sizeof(name), UINT64_MAX, tag);
	const char *args[] = {"--ring", name, "--raw", dir, "--seed", SEED, NULL};
	pid_t a = spawn_loader(args), b = spawn_loader(args);
	/* consume until both loaders registered (so both have their SIGTERM
	 * handler); on a busy box one may take a while to start */
	uint64_t n = 0;
	while (ring_producers_alive(r) < 2) {
		assert_true(n < 1000000); /* a loader that never starts fails, not hangs */
		consume_check(r, n, n + 1, 0, 0);
		n++;
	}
	kill(a, SIGTERM);
	assert_int_equal(exit_code(a), 0);
	consume_check(r, n, n + 100, 0, 0);
	ring_shutdown(r);
	assert_int_equal(exit_code(b), 0);
	ring_detach(r);
	ring_unlink(name);
}

static void test_exits_with_parent(void **state)
{
	(void)state;
	char name[64];
	ring *r = make_ring(name, sizeof(name), UINT64_MAX, tag);
	/* become the reaper of orphans so the loader can be waited for here */
	assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	int pidp[2], gate[2];
	assert_int_equal(pipe(pidp), 0);
	assert_int_equal(pipe(gate), 0);
	pid_t mid = fork();
	if (mid == 0) {
		close(gate[1]);
		close(pidp[0]);
		const char *args[] = {"--ring", name, "--raw", dir, "--seed", SEED, NULL};
		pid_t l = spawn_loader(args);
		if (write(pidp[1], &l, sizeof(l)) != sizeof(l))
			_exit(1);
		char c;
		(void)read(gate[0], &c, 1); /* until the test has seen a batch */
		_exit(0);
	}
	close(gate[0]);
	pid_t loader;
	assert_int_equal(read(pidp[0], &loader, sizeof(loader)), sizeof(loader));
	consume_check(r, 0, 4, 0, 0); /* the loader is past its prctl */
	close(gate[1]);
	assert_int_equal(exit_code(mid), 0);
	/* the orphaned loader got SIGTERM from PR_SET_PDEATHSIG and exits 0 */
	assert_int_equal(exit_code(loader), 0);
	prctl(PR_SET_CHILD_SUBREAPER, 0);
	close(pidp[0]);
	close(pidp[1]);
	ring_detach(r);
	ring_unlink(name);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exit_codes),
		cmocka_unit_test(test_two_loaders_one_killed),
		cmocka_unit_test(test_sigterm_gives_claim_back),
		cmocka_unit_test(test_exits_with_parent),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
