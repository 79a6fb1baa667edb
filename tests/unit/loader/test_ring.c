/* ring: real forked loader processes feeding a consumer. Every batch must
 * arrive in order with the bytes the serial path builds, for 1, 2 and 4
 * producers, after a resume, and when producers are killed with SIGKILL
 * (mid-write and at random); failures end in an error, never a hang. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
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
#define NM 2
#define NB 4
#define NT 64
#define NBATCH 240
/* A safety net only: a healthy run never comes near it; a hang fails here
 * instead of blocking CI. */
#define NEXT_TIMEOUT_MS 60000

typedef struct fixture {
	synth_corpus sc;
	mlm_dataset *ds;
	batch_layout l;
	char ref[NBATCH + 64][65]; /* serial-path digest of each global batch */
	_Atomic int *die_flag;     /* shared page: first producer to claim die_at dies */
	uint64_t die_at;
} fixture;

static fixture fx;
static int name_counter;

static void ring_test_name(char *buf, size_t n)
{
	snprintf(buf, n, "/bertd-test-%d-%d", (int)getpid(), name_counter++);
}

static int build_cb(void *ctx, uint64_t global, void *slot)
{
	fixture *f = ctx;
	if (f->die_flag && global == f->die_at) {
		int zero = 0;
		if (atomic_compare_exchange_strong(f->die_flag, &zero, 1)) {
			/* die holding the claim with the slot half written */
			f->die_flag[1] = (int)getpid();
			memset(slot, 0xEE, f->l.slot_bytes / 2);
			raise(SIGKILL);
		}
	}
	return mlm_batch_build(f->ds, &f->l, NG, NM, global, slot);
}

/* Forked children die with the test, even when a failed assert skips the
 * test's own shutdown. */
static void child_init(void)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/* Child body: attach by name like bertd-loader does and produce. */
static void producer_child(const char *name)
{
	child_init();
	ring *r = NULL;
	if (ring_attach(&r, name) != 0)
		_exit(10);
	int rc = ring_produce(r, build_cb, &fx, NULL);
	ring_detach(r);
	_exit(rc == 0 ? 0 : 11);
}

static pid_t spawn(const char *name)
{
	pid_t pid = fork();
	if (pid == 0)
		producer_child(name);
	assert_true(pid > 0);
	return pid;
}

static int setup(void **state)
{
	(void)state;
	synth_spec sp = {.n_docs = 300, .min_sents = 1, .max_sents = 8, .min_len = 1, .max_len = 30,
			 .empty_doc_every = 11, .vocab_size = 30522, .token_bytes = 2, .seed = 77};
	if (synth_build(&fx.sc, &sp))
		return -1;
	mlm_config cfg;
	mlm_config_defaults(&cfg, NT);
	cfg.seed = 1234;
	if (mlm_dataset_create(&fx.ds, &fx.sc.view, 1, &cfg))
		return -1;
	if (batch_layout_init(&fx.l, NB, NT, cfg.max_pred))
		return -1;
	void *slot = aligned_alloc(BATCH_ALIGN, fx.l.slot_bytes);
	for (uint64_t n = 0; n < NBATCH + 64; n++) {
		if (mlm_batch_build(fx.ds, &fx.l, NG, NM, n, slot))
			return -1;
		sha256_hex(slot, fx.l.slot_bytes, fx.ref[n]);
	}
	free(slot);
	fx.die_flag = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	return fx.die_flag == MAP_FAILED ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	/* a failed assert skips a test's own unlink: leave nothing in /dev/shm */
	for (int k = 0; k < name_counter; k++) {
		char name[64];
		snprintf(name, sizeof(name), "/bertd-test-%d-%d", (int)getpid(), k);
		shm_unlink(name);
	}
	mlm_dataset_destroy(fx.ds);
	synth_free(&fx.sc);
	munmap((void *)fx.die_flag, 4096);
	return 0;
}

typedef struct run_opts {
	int producers;
	uint64_t start, end;
	uint32_t S;
	int die_mid_write;      /* one producer SIGKILLs itself mid-write */
	int kill_one_at;        /* consumed-batch count at which to SIGKILL producer 0; 0 = never */
} run_opts;

/* Consumes [start, end) from both ranks in global order and checks every
 * slot against the serial digest. Returns the ring's counters. */
static void run(const run_opts *o, ring_counters *cnt)
{
	char name[64];
	ring_test_name(name, sizeof(name));
	ring_params p = {.G = NG, .S = o->S, .M = NM, .lease_ms = 50, .layout = fx.l,
			 .start_batch = o->start, .end_batch = o->end, .job_tag = 1};
	ring *r = NULL;
	assert_int_equal(ring_create(&r, name, &p), 0);
	atomic_store(fx.die_flag, 0);
	fx.die_flag[1] = 0;
	fx.die_at = o->die_mid_write ? o->start + 37 : UINT64_MAX;
	pid_t pids[8];
	for (int i = 0; i < o->producers; i++)
		pids[i] = spawn(name);
	for (uint64_t n = o->start; n < o->end; n++) {
		if (o->kill_one_at && n - o->start == (uint64_t)o->kill_one_at) {
			/* batch start+37 came through, so the mid-write victim (if
			 * any) is already dead: kill a different one */
			int v = 0;
			while (pids[v] == (pid_t)fx.die_flag[1])
				v++;
			kill(pids[v], SIGKILL);
		}
		void *slot = NULL;
		uint32_t rank = (uint32_t)(n % NG);
		int rc = ring_next(r, rank, NEXT_TIMEOUT_MS, &slot);
		assert_int_equal(rc, 0);
		const batch_header *h = slot;
		assert_int_equal(batch_header_check(h, &fx.l), 0);
		assert_int_equal(h->global, n);
		assert_int_equal(h->rank, rank);
		char hex[65];
		sha256_hex(slot, fx.l.slot_bytes, hex);
		assert_string_equal(hex, fx.ref[n]);
		ring_release(r, rank);
	}
	void *slot;
	assert_int_equal(ring_next(r, 0, 0, &slot), RING_END);
	assert_int_equal(ring_next(r, 1, 0, &slot), RING_END);
	ring_get_counters(r, 0, cnt);
	ring_shutdown(r);
	int killed = 0;
	for (int i = 0; i < o->producers; i++) {
		int st;
		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		if (WIFSIGNALED(st)) {
			assert_int_equal(WTERMSIG(st), SIGKILL);
			killed++;
		} else {
			assert_true(WIFEXITED(st));
			assert_int_equal(WEXITSTATUS(st), 0);
		}
	}
	assert_int_equal(killed, (o->die_mid_write ? 1 : 0) + (o->kill_one_at ? 1 : 0));
	assert_true(cnt->batches_built >= o->end - o->start);
	assert_int_equal(cnt->batches_consumed, (o->end - o->start + 1) / NG);
	ring_detach(r);
	assert_int_equal(ring_unlink(name), 0);
}

static void test_deterministic_across_producer_counts(void **state)
{
	(void)state;
	const int counts[] = {1, 2, 4};
	for (int i = 0; i < 3; i++) {
		ring_counters c;
		run(&(run_opts){.producers = counts[i], .start = 0, .end = NBATCH, .S = 4}, &c);
		assert_int_equal(c.batches_requeued, 0);
		print_message("%d producers: built %llu, producer wait %.1f ms, consumer wait %.1f ms\n",
			      counts[i], (unsigned long long)c.batches_built, c.producer_wait_ns / 1e6,
			      c.consumer_wait_ns / 1e6);
	}
}

static void test_resume_at_step(void **state)
{
	(void)state;
	/* stop after step 7 and resume at step 7: start = 7 * NM * NG; the slots
	 * equal those of the uninterrupted run (same serial digests) */
	ring_counters c;
	run(&(run_opts){.producers = 2, .start = 7 * NM * NG, .end = 7 * NM * NG + 100, .S = 3}, &c);
	run(&(run_opts){.producers = 1, .start = 0, .end = 7 * NM * NG, .S = 3}, &c);
}

static void test_kill_mid_write(void **state)
{
	(void)state;
	ring_counters c;
	run(&(run_opts){.producers = 3, .start = 0, .end = NBATCH, .S = 4, .die_mid_write = 1}, &c);
	assert_true(c.batches_requeued >= 1);
	run(&(run_opts){.producers = 3, .start = 0, .end = NBATCH, .S = 2, .die_mid_write = 1,
			.kill_one_at = 100},
	    &c);
	assert_true(c.batches_requeued >= 1);
	print_message("kill -9: %llu batch(es) rebuilt\n", (unsigned long long)c.batches_requeued);
}

static void test_all_producers_dead_times_out(void **state)
{
	(void)state;
	char name[64];
	ring_test_name(name, sizeof(name));
	ring_params p = {.G = NG, .S = 2, .M = NM, .lease_ms = 20, .layout = fx.l, .start_batch = 0,
			 .end_batch = UINT64_MAX};
	ring *r;
	assert_int_equal(ring_create(&r, name, &p), 0);
	pid_t pid = spawn(name);
	void *slot;
	for (uint64_t n = 0; n < 6; n++) {
		assert_int_equal(ring_next(r, (uint32_t)(n % NG), NEXT_TIMEOUT_MS, &slot), 0);
		ring_release(r, (uint32_t)(n % NG));
	}
	kill(pid, SIGKILL);
	int st;
	waitpid(pid, &st, 0);
	/* drain what it had published, then the stream stops: an error, no hang */
	int rc = 0;
	for (uint64_t n = 6; n < 6 + 2 * NG + 1 && rc == 0; n++) {
		rc = ring_next(r, (uint32_t)(n % NG), 500, &slot);
		if (rc == 0)
			ring_release(r, (uint32_t)(n % NG));
	}
	assert_int_equal(rc, -ETIMEDOUT);
	ring_shutdown(r);
	assert_int_equal(ring_next(r, 0, -1, &slot), -ESHUTDOWN);
	ring_detach(r);
	ring_unlink(name);
}

static int bad_build(void *ctx, uint64_t global, void *slot)
{
	(void)ctx;
	(void)slot;
	return global == 5 ? -EBADMSG : mlm_batch_build(fx.ds, &fx.l, NG, NM, global, slot);
}

static void test_producer_error_reaches_consumer(void **state)
{
	(void)state;
	char name[64];
	ring_test_name(name, sizeof(name));
	ring_params p = {.G = NG, .S = 4, .M = NM, .layout = fx.l, .end_batch = 100};
	ring *r;
	assert_int_equal(ring_create(&r, name, &p), 0);
	pid_t pid = fork();
	if (pid == 0) {
		child_init();
		ring *cr;
		if (ring_attach(&cr, name))
			_exit(10);
		_exit(ring_produce(cr, bad_build, NULL, NULL) == -EBADMSG ? 0 : 12);
	}
	void *slot;
	int rc = 0;
	uint64_t n = 0;
	for (; n < 100 && rc == 0; n++) {
		rc = ring_next(r, (uint32_t)(n % NG), NEXT_TIMEOUT_MS, &slot);
		if (rc == 0)
			ring_release(r, (uint32_t)(n % NG));
	}
	assert_int_equal(rc, -EBADMSG);
	assert_true(n <= 6);
	int st;
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	ring_detach(r);
	ring_unlink(name);
}

/* A node's ring (one node of a multi-node job): it carries world rank 1 of
 * NG only; its batch q is the world's batch q*NG + 1, built by the
 * producers as such (ring_world_batch), the bytes the whole world's ring
 * would carry for rank 1. */
static void test_node_ring_carries_its_ranks(void **state)
{
	(void)state;
	char name[64];
	ring_test_name(name, sizeof(name));
	ring_params p = {.G = 1, .S = 4, .M = NM, .lease_ms = 50, .layout = fx.l, .start_batch = 0,
			 .end_batch = NBATCH / NG, .W = NG, .R0 = 1};
	ring *r = NULL;
	assert_int_equal(ring_create(&r, name, &p), 0);
	atomic_store(fx.die_flag, 0);
	fx.die_at = UINT64_MAX;
	pid_t pids[2] = {spawn(name), spawn(name)};
	for (uint64_t q = 0; q < NBATCH / NG; q++) {
		void *slot = NULL;
		assert_int_equal(ring_next(r, 0, NEXT_TIMEOUT_MS, &slot), 0);
		const batch_header *h = slot;
		assert_int_equal(h->global, q * NG + 1);
		assert_int_equal(h->rank, 1);
		char hex[65];
		sha256_hex(slot, fx.l.slot_bytes, hex);
		assert_string_equal(hex, fx.ref[q * NG + 1]);
		ring_release(r, 0);
	}
	void *slot;
	assert_int_equal(ring_next(r, 0, 0, &slot), RING_END);
	ring_shutdown(r);
	for (int i = 0; i < 2; i++) {
		int st;
		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	ring_detach(r);
	ring_unlink(name);
	/* ranks outside the world are refused */
	ring_params bad = p;
	bad.R0 = NG;
	assert_int_equal(ring_create(&r, name, &bad), -EINVAL);
}

static void test_segment_errors(void **state)
{
	(void)state;
	char name[64], buf[160];
	ring *r;
	ring_test_name(name, sizeof(name));
	assert_int_equal(ring_attach(&r, name), -ENOENT);
	ring_params p = {.G = NG, .S = 2, .M = NM, .layout = fx.l, .end_batch = 10};
	ring_params bad = p;
	bad.S = 0;
	assert_int_equal(ring_create(&r, name, &bad), -EINVAL);
	bad = p;
	bad.start_batch = 3; /* not a step boundary of NG ranks */
	assert_int_equal(ring_create(&r, name, &bad), -EINVAL);
	assert_int_equal(ring_create(&r, name, &p), 0);
	ring *r2;
	assert_int_equal(ring_create(&r2, name, &p), -EEXIST);
	assert_int_equal(ring_attach(&r2, name), 0);
	assert_int_equal(ring_get_params(r2)->S, 2);
	size_t bytes;
	void *area = ring_slot_area(r2, &bytes);
	assert_int_equal((uintptr_t)area % BATCH_ALIGN, 0);
	assert_int_equal(bytes, (size_t)NG * 2 * fx.l.slot_bytes);
	assert_int_equal(ring_producer_register(r2), 0);
	assert_int_equal(ring_producer_register(r2), -EBUSY);
	ring_detach(r2);
	ring_detach(r);
	ring_unlink(name);
	/* a segment that is not a ring */
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	close(fd);
	assert_int_equal(ring_attach(&r, name), -EPROTO);
	ring_unlink(name);
	assert_int_equal(ring_name_for_job(buf, sizeof(buf), "job-42_a"), 0);
	assert_string_equal(buf, "/bertd-job-42_a");
	assert_int_equal(ring_name_for_job(buf, sizeof(buf), "../etc"), -EINVAL);
	assert_int_equal(ring_name_for_job(buf, sizeof(buf), ""), -EINVAL);
}

static void test_open_race(void **state)
{
	(void)state;
	char name[64];
	ring_test_name(name, sizeof(name));
	ring_params p = {.G = NG, .S = 2, .M = NM, .layout = fx.l, .end_batch = 10, .job_tag = 5};
	enum { N = 6 };
	int gun[2], ready[2];
	assert_int_equal(pipe(gun), 0);
	assert_int_equal(pipe(ready), 0);
	pid_t pids[N];
	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			child_init();
			close(gun[1]);
			char c;
			if (read(gun[0], &c, 1) != 0) /* all start together at EOF */
				_exit(9);
			ring *r;
			if (ring_open(&r, name, &p) != 0 || ring_producer_register(r) != 0)
				_exit(10);
			c = 1;
			if (write(ready[1], &c, 1) != 1)
				_exit(11);
			pause(); /* stay registered until killed */
			_exit(0);
		}
	}
	close(gun[0]);
	close(gun[1]); /* start */
	for (int i = 0; i < N; i++) {
		char c;
		assert_int_equal(read(ready[0], &c, 1), 1);
	}
	/* one segment: every racer registered in the same one */
	ring *r;
	assert_int_equal(ring_open(&r, name, &p), 0);
	assert_int_equal(ring_producers_alive(r), N);
	ring_params other = p;
	other.S = 3;
	ring *r2;
	assert_int_equal(ring_open(&r2, name, &other), -ESTALE);
	other = p;
	other.job_tag = 6;
	assert_int_equal(ring_open(&r2, name, &other), -ESTALE);
	for (int i = 0; i < N; i++) {
		kill(pids[i], SIGKILL);
		waitpid(pids[i], NULL, 0);
	}
	assert_int_equal(ring_producers_alive(r), 0);
	ring_detach(r);
	ring_unlink(name);
	close(ready[0]);
	close(ready[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deterministic_across_producer_counts),
		cmocka_unit_test(test_resume_at_step),
		cmocka_unit_test(test_kill_mid_write),
		cmocka_unit_test(test_all_producers_dead_times_out),
		cmocka_unit_test(test_producer_error_reaches_consumer),
		cmocka_unit_test(test_node_ring_carries_its_ranks),
		cmocka_unit_test(test_segment_errors),
		cmocka_unit_test(test_open_race),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
