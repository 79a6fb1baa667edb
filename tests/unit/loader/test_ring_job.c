/* The daemon's way of running loaders: `bertd-loader --job job.json` over a
 * real shard dataset (shard_writer + manifest.json), with the consumer
 * opening the same ring from the same job file (batchjob.h) in whatever
 * order the processes come up. Checks every slot against the serial path,
 * a resume from checkpoints/ckpt-<k>, and the error report on fd 3. */
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/msg.h"
#include "common/sha256.h"
#include "loader/batchjob.h"
#include "loader/shard.h"
#include "test_mlm_fixture.h"

#define VOCAB 3000
#define NEXT_TIMEOUT_MS 60000 /* hang guard only */

static char dir[256], dsdir[300];
static char ds2dir[300], ds3dir[300]; /* ds's vocab, other text; another vocab */
static int counter;

static void path_in(char *buf, size_t n, const char *a, const char *b)
{
	snprintf(buf, n, "%s/%s", a, b);
}

/* vocab.txt: the five specials, then words, every third one a "##" piece. */
static int write_vocab(char sha[65], const char *word)
{
	char p[512];
	path_in(p, sizeof(p), dsdir, "vocab.txt");
	FILE *f = fopen(p, "w");
	if (!f)
		return -1;
	fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", f);
	for (int v = 5; v < VOCAB; v++)
		if (v % 3 == 0)
			fprintf(f, "##p%d\n", v);
		else
			fprintf(f, "%s%d\n", word, v);
	fclose(f);
	f = fopen(p, "rb");
	sha256_ctx c;
	sha256_init(&c);
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		sha256_update(&c, buf, n);
	fclose(f);
	uint8_t d[32];
	sha256_final(&c, d);
	sha256_to_hex(d, sha);
	return 0;
}

static int write_shard(const char *name, const shard_vocab_info *vi, unsigned seed, json_t *shards)
{
	synth_corpus sc;
	synth_spec sp = {.n_docs = 120, .min_sents = 1, .max_sents = 7, .min_len = 1, .max_len = 25,
			 .vocab_size = VOCAB, .token_bytes = 4, .seed = seed};
	if (synth_build(&sc, &sp))
		return -1;
	shard_writer *w;
	if (shard_writer_create(dsdir, name, vi, &w))
		return -1;
	const corpus_view *v = &sc.view;
	for (uint64_t d = 0; d < v->n_docs; d++) {
		for (uint64_t s = v->doc_off[d]; s < v->doc_off[d + 1]; s++) {
			const uint32_t *t = (const uint32_t *)v->tokens + v->sent_off[s];
			if (shard_writer_add_sentence(w, t, v->sent_off[s + 1] - v->sent_off[s]))
				return -1;
		}
		shard_writer_end_document(w);
	}
	shard_counts cnt;
	if (shard_writer_finish(w, &cnt))
		return -1;
	json_array_append_new(shards, json_pack("{s:s, s:I, s:I, s:I}", "name", name, "tokens",
						(json_int_t)cnt.tokens, "sentences", (json_int_t)cnt.sents,
						"documents", (json_int_t)cnt.docs));
	synth_free(&sc);
	return 0;
}

static int write_job(const char *file, const char *dataset, const char *resume, int wwm)
{
	char text[1024];
	snprintf(text, sizeof(text),
		 "{\"name\": \"t\", \"dataset\": \"d\", \"resources\": {\"gpus\": 2},"
		 " \"training_args\": {\"per_device_train_batch_size\": 4, \"max_seq_length\": 64,"
		 " \"max_steps\": 30, \"gradient_accumulation_steps\": 2, \"dataloader_num_workers\": 2,"
		 " \"seed\": 5}, \"mlm\": {\"whole_word_mask\": %s}}",
		 wwm ? "true" : "false");
	json_error_t je;
	json_t *in = json_loads(text, 0, &je), *spec = NULL;
	jobspec_error err;
	if (!in || jobspec_normalize(in, &spec, &err)) {
		fprintf(stderr, "spec refused: %s %s\n", err.field, err.detail);
		return -1;
	}
	char shm[64];
	snprintf(shm, sizeof(shm), "/bertd-test-job-%d-%d", (int)getpid(), counter++);
	json_t *job = json_pack("{s:s, s:o, s:s, s:s, s:i}", "job_id", "job-test", "spec", spec, "dataset_dir",
				dataset, "shm_name", shm, "world_size", 2);
	json_object_set_new(job, "resume_from", resume ? json_string(resume) : json_null());
	int rc = json_dump_file(job, file, JSON_INDENT(2));
	json_decref(job);
	json_decref(in);
	return rc;
}

/* A dataset dir/sub of two synthetic shards (seeds seed, seed + 1) with
 * the vocab of write_vocab(word); dsdir is left pointing at it. */
static int make_dataset(const char *sub, unsigned seed, const char *word)
{
	path_in(dsdir, sizeof(dsdir), dir, sub);
	if (mkdir(dsdir, 0700))
		return -1;
	shard_vocab_info vi = {.vocab_size = VOCAB, .lowercase = true,
			       .special = {.pad = 0, .unk = 1, .cls = 2, .sep = 3, .mask = 4}};
	if (write_vocab(vi.sha256, word))
		return -1;
	json_t *shards = json_array();
	if (write_shard("s0", &vi, seed, shards) || write_shard("s1", &vi, seed + 1, shards))
		return -1;
	json_t *man = json_pack("{s:s, s:i, s:{s:s, s:s, s:b, s:i}, s:o}", "format", SHARD_MANIFEST_FORMAT,
				"version", SHARD_MANIFEST_VERSION, "vocab", "file", "vocab.txt", "sha256", vi.sha256,
				"lowercase", 1, "size", VOCAB, "shards", shards);
	char p[512];
	path_in(p, sizeof(p), dsdir, "manifest.json");
	int rc = json_dump_file(man, p, 0);
	json_decref(man);
	return rc;
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/bertd-test-job-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	if (make_dataset("ds2", 7, "w"))
		return -1;
	memcpy(ds2dir, dsdir, sizeof(ds2dir));
	if (make_dataset("ds3", 9, "x"))
		return -1;
	memcpy(ds3dir, dsdir, sizeof(ds3dir));
	return make_dataset("ds", 1, "w");
}

static int teardown(void **state)
{
	(void)state;
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		return -1;
	for (int k = 0; k < counter; k++) {
		char shm[64];
		snprintf(shm, sizeof(shm), "/bertd-test-job-%d-%d", (int)getpid(), k);
		shm_unlink(shm);
	}
	return 0;
}

/* bertd-loader --job file, with fd 3 = sock when sock >= 0. */
static pid_t spawn_job_loader(const char *file, int sock)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (sock >= 0)
			dup2(sock, 3);
		close_range(sock >= 0 ? 4 : 3, ~0u, 0);
		if (getenv("BERTD_TEST_VERBOSE") == NULL) {
			int dn = open("/dev/null", O_WRONLY);
			dup2(dn, 2);
			close(dn);
		}
		const char *p = getenv("BERTD_LOADER");
		execl(p ? p : "loader/bertd-loader", "bertd-loader", "--job", file, "--index", "0", "--count", "2",
		      (char *)NULL);
		_exit(127);
	}
	return pid;
}

static int exit_code(pid_t pid)
{
	int st;
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* Starts two loaders on the job, consumes every batch from the ring opened
 * through the same job file, and compares it with the serial build. */
static void run_job(const char *resume, int wwm, uint64_t want_start)
{
	char file[512];
	path_in(file, sizeof(file), dir, "job.json");
	assert_int_equal(write_job(file, dsdir, resume, wwm), 0);
	pid_t a = spawn_job_loader(file, -1);
	batchjob bj;
	assert_int_equal(batchjob_load(file, &bj), 0);
	assert_int_equal(bj.ring.G, 2);
	assert_int_equal(bj.ring.M, 2);
	assert_int_equal(bj.ring.start_batch, want_start);
	assert_int_equal(bj.ring.end_batch, 30 * 2 * 2);
	assert_int_equal(bj.mlm.max_pred, 12); /* jobspec: 15% of 64 rounded up to a multiple of 4 */
	batchjob_data data;
	assert_int_equal(batchjob_data_open(&bj, &data), 0);
	assert_int_equal(data.continuation != NULL, wwm);
	ring *r;
	assert_int_equal(ring_open(&r, bj.shm_name, &bj.ring), 0);
	pid_t b = spawn_job_loader(file, -1); /* one before, one after the ring exists */
	void *ref = aligned_alloc(BATCH_ALIGN, bj.ring.layout.slot_bytes);
	for (uint64_t n = bj.ring.start_batch; n < bj.ring.end_batch; n++) {
		uint32_t rank = (uint32_t)(n % 2);
		void *slot;
		assert_int_equal(ring_next(r, rank, NEXT_TIMEOUT_MS, &slot), 0);
		assert_int_equal(mlm_batch_build(data.ds, &bj.ring.layout, 2, 2, n, ref), 0);
		assert_memory_equal(slot, ref, bj.ring.layout.slot_bytes);
		const batch_header *h = slot;
		assert_int_equal(h->step, n / 4);
		ring_release(r, rank);
	}
	void *slot;
	assert_int_equal(ring_next(r, 0, 0, &slot), RING_END);
	ring_shutdown(r);
	assert_int_equal(exit_code(a), 0);
	assert_int_equal(exit_code(b), 0);
	free(ref);
	ring_detach(r);
	ring_unlink(bj.shm_name);
	batchjob_data_close(&data);
}

static void test_job_two_loaders(void **state)
{
	(void)state;
	run_job(NULL, 0, 0);
	run_job(NULL, 1, 0);
}

static void test_job_resume(void **state)
{
	(void)state;
	char ck[512];
	path_in(ck, sizeof(ck), dir, "checkpoints/ckpt-20");
	run_job(ck, 0, 20 * 2 * 2);
}

static void test_job_errors_reported(void **state)
{
	(void)state;
	char file[512];
	path_in(file, sizeof(file), dir, "bad.json");
	assert_int_equal(write_job(file, "/nonexistent-dataset", NULL, 0), 0);
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid_t pid = spawn_job_loader(file, sv[1]);
	close(sv[1]);
	msg_reader rd;
	msg_reader_init(&rd);
	json_t *m = NULL;
	assert_int_equal(msg_recv(sv[0], &rd, NEXT_TIMEOUT_MS, &m), 1);
	assert_string_equal(json_string_value(json_object_get(m, "type")), "error");
	assert_string_equal(json_string_value(json_object_get(m, "code")), "data");
	json_decref(m);
	msg_reader_free(&rd);
	close(sv[0]);
	assert_int_equal(exit_code(pid), 5); /* BERTD_EXIT_DATA */
	/* not a job file at all */
	FILE *f = fopen(file, "w");
	fputs("{\"job_id\": 1}", f);
	fclose(f);
	assert_int_equal(exit_code(spawn_job_loader(file, -1)), 2);
	batchjob bj;
	assert_int_equal(batchjob_load(file, &bj), -EINVAL);
	assert_int_equal(batchjob_load("/nonexistent.json", &bj), -ENOENT);
	/* resume_from that is not a checkpoint directory */
	assert_int_equal(write_job(file, dsdir, "/x/not-a-ckpt", 0), 0);
	assert_int_equal(batchjob_load(file, &bj), -EINVAL);
}

/* A mixture job file: "dataset" wiki 0.7 / books 0.3, dirs a and b. */
static int write_mix_job(const char *file, const char *a, const char *b)
{
	const char *text =
		"{\"name\": \"t\", \"dataset\": [{\"name\": \"wiki\", \"proportion\": 0.7},"
		" {\"name\": \"books\", \"proportion\": 0.3}], \"resources\": {\"gpus\": 2},"
		" \"training_args\": {\"per_device_train_batch_size\": 4, \"max_seq_length\": 64,"
		" \"max_steps\": 30, \"gradient_accumulation_steps\": 2, \"dataloader_num_workers\": 2,"
		" \"seed\": 5}, \"mlm\": {\"whole_word_mask\": true}}";
	json_t *in = json_loads(text, 0, NULL), *spec = NULL;
	jobspec_error err;
	if (!in || jobspec_normalize(in, &spec, &err)) {
		fprintf(stderr, "spec refused: %s %s\n", err.field, err.detail);
		return -1;
	}
	char shm[64];
	snprintf(shm, sizeof(shm), "/bertd-test-job-%d-%d", (int)getpid(), counter++);
	json_t *job = json_pack("{s:s, s:o, s:s, s:[s, s], s:s, s:i, s:n}", "job_id", "job-test", "spec", spec,
				"dataset_dir", a, "dataset_dirs", a, b, "shm_name", shm, "world_size", 2,
				"resume_from");
	int rc = json_dump_file(job, file, JSON_INDENT(2));
	json_decref(job);
	json_decref(in);
	return rc;
}

/* Two loaders on a mixture job: every slot equals the worker's serial
 * build (batchjob_batch_build) and mix_batch_build over components made
 * here on their own; the batches are not the first dataset's alone. A
 * component with another vocab is refused by the loader and the worker. */
static void test_job_mixture(void **state)
{
	(void)state;
	char file[512];
	path_in(file, sizeof(file), dir, "mix.json");
	assert_int_equal(write_mix_job(file, dsdir, ds2dir), 0);
	pid_t a = spawn_job_loader(file, -1);
	batchjob bj;
	assert_int_equal(batchjob_load(file, &bj), 0);
	assert_int_equal(bj.n_datasets, 2);
	assert_string_equal(bj.dataset_dirs[1], ds2dir);
	batchjob_data data;
	assert_int_equal(batchjob_data_open(&bj, &data), 0);
	assert_int_equal(data.n, 2);
	/* the components on their own: shards, bitmap, config by hand */
	shard_dataset *sd[2];
	mlm_dataset *md[2];
	const char *dirs[2] = {dsdir, ds2dir};
	for (int k = 0; k < 2; k++) {
		assert_int_equal(shard_dataset_open(dirs[k], &sd[k]), 0);
		mlm_config c = bj.mlm;
		c.is_continuation = data.continuation;
		c.seed = mix_component_seed(5, (uint32_t)k, 2);
		assert_int_equal(mlm_dataset_create(&md[k], sd[k]->views, (uint32_t)sd[k]->n_shards, &c), 0);
	}
	mix_schedule m;
	const double prop[2] = {0.7, 0.3};
	assert_int_equal(mix_schedule_init(&m, prop, 2), 0);
	ring *r;
	assert_int_equal(ring_open(&r, bj.shm_name, &bj.ring), 0);
	pid_t b = spawn_job_loader(file, -1);
	size_t sz = bj.ring.layout.slot_bytes;
	uint8_t *ref = aligned_alloc(BATCH_ALIGN, sz), *ref2 = aligned_alloc(BATCH_ALIGN, sz);
	int differs_from_single = 0;
	for (uint64_t n = 0; n < bj.ring.end_batch; n++) {
		uint32_t rank = (uint32_t)(n % 2);
		void *slot;
		assert_int_equal(ring_next(r, rank, NEXT_TIMEOUT_MS, &slot), 0);
		assert_int_equal(batchjob_batch_build(&data, &bj.ring.layout, 2, 2, n, ref), 0);
		assert_memory_equal(slot, ref, sz);
		assert_int_equal(mix_batch_build((const mlm_dataset *const *)md, &m, &bj.ring.layout, 2, 2, n, ref2), 0);
		assert_memory_equal(slot, ref2, sz);
		assert_int_equal(mlm_batch_build(data.ds, &bj.ring.layout, 2, 2, n, ref2), 0);
		differs_from_single |= memcmp(slot, ref2, sz) != 0;
		ring_release(r, rank);
	}
	assert_true(differs_from_single);
	void *slot;
	assert_int_equal(ring_next(r, 0, 0, &slot), RING_END);
	ring_shutdown(r);
	assert_int_equal(exit_code(a), 0);
	assert_int_equal(exit_code(b), 0);
	ring_detach(r);
	ring_unlink(bj.shm_name);
	for (int k = 0; k < 2; k++) {
		mlm_dataset_destroy(md[k]);
		shard_dataset_close(sd[k]);
	}
	batchjob_data_close(&data);
	free(ref);
	free(ref2);

	/* another vocab: refused (-EINVAL, the loader exits with bad_config) */
	assert_int_equal(write_mix_job(file, dsdir, ds3dir), 0);
	assert_int_equal(batchjob_load(file, &bj), 0);
	assert_int_equal(batchjob_data_open(&bj, &data), -EINVAL);
	assert_int_equal(exit_code(spawn_job_loader(file, -1)), 2); /* BERTD_EXIT_BAD_CONFIG */
	/* a mixture job file without its dirs */
	FILE *f = fopen(file, "r+");
	json_t *j = json_loadf(f, 0, NULL);
	fclose(f);
	json_object_del(j, "dataset_dirs");
	assert_int_equal(batchjob_from_json(j, &bj), -EINVAL);
	json_decref(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_job_two_loaders),
		cmocka_unit_test(test_job_resume),
		cmocka_unit_test(test_job_errors_reported),
		cmocka_unit_test(test_job_mixture),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
