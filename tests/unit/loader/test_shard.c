/* Token shards: write -> mmap -> read back through corpus_view with every
 * boundary intact (uint16 and uint32 ids), and every kind of damaged index,
 * bin or manifest refused with its specific error instead of a crash. */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/sha256.h"
#include "loader/shard.h"

static char tmpdir[256];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static int setup(void **state)
{
	(void)state;
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/bertd-test-shard-XXXXXX", base && base[0] ? base : "/tmp");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	return nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static shard_vocab_info vocab_info(uint32_t size)
{
	shard_vocab_info v = {.vocab_size = size, .lowercase = true,
			      .special = {0, 100, 101, 102, 103}};
	sha256_hex("vocab", 5, v.sha256);
	return v;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

/* Writes docs of random sentences; records what it wrote. */
typedef struct written {
	uint32_t *tok;
	uint64_t n_tok, sents[4096], n_sents, docs[512], n_docs;
} written;

static void write_shard(const char *name, uint32_t vsize, written *w)
{
	shard_vocab_info v = vocab_info(vsize);
	shard_writer *sw = NULL;
	assert_int_equal(shard_writer_create(tmpdir, name, &v, &sw), 0);
	w->tok = malloc(4096 * 64 * sizeof *w->tok);
	w->n_tok = w->n_sents = w->n_docs = 0;
	w->sents[0] = w->docs[0] = 0;
	uint32_t ids[64];
	assert_int_equal(shard_writer_add_sentence(sw, ids, 0), -EINVAL);
	for (int d = 0; d < 200; d++) {
		int ns = 1 + (int)(next_rand() % 12);
		for (int s = 0; s < ns; s++) {
			size_t n = 1 + next_rand() % 64;
			for (size_t i = 0; i < n; i++)
				ids[i] = next_rand() % vsize;
			assert_int_equal(shard_writer_add_sentence(sw, ids, n), 0);
			memcpy(w->tok + w->n_tok, ids, n * sizeof *ids);
			w->n_tok += n;
			w->sents[++w->n_sents] = w->n_tok;
		}
		assert_int_equal(shard_writer_end_document(sw), 0);
		assert_int_equal(shard_writer_end_document(sw), 0); /* empty doc: ignored */
		w->docs[++w->n_docs] = w->n_sents;
	}
	ids[0] = vsize;
	assert_int_equal(shard_writer_add_sentence(sw, ids, 1), -EINVAL);
	shard_counts c;
	assert_int_equal(shard_writer_finish(sw, &c), 0);
	assert_int_equal(c.tokens, w->n_tok);
	assert_int_equal(c.sents, w->n_sents);
	assert_int_equal(c.docs, w->n_docs);
}

static void check_roundtrip(uint32_t vsize, int want_bytes)
{
	written w;
	char name[32];
	snprintf(name, sizeof name, "rt-%u", vsize);
	write_shard(name, vsize, &w);
	shard_vocab_info v = vocab_info(vsize);
	shard *s = NULL;
	assert_int_equal(shard_open(tmpdir, name, v.sha256, &s), 0);
	const corpus_view *cv = shard_view(s);
	assert_int_equal(cv->token_bytes, want_bytes);
	assert_int_equal(cv->n_tokens, w.n_tok);
	assert_int_equal(cv->n_sents, w.n_sents);
	assert_int_equal(cv->n_docs, w.n_docs);
	assert_int_equal(cv->vocab_size, vsize);
	assert_int_equal(cv->special.mask, 103);
	assert_true(shard_vocab(s)->lowercase);
	for (uint64_t i = 0; i < w.n_tok; i++)
		assert_int_equal(corpus_token(cv, i), w.tok[i]);
	assert_memory_equal(cv->sent_off, w.sents, (w.n_sents + 1) * sizeof(uint64_t));
	assert_memory_equal(cv->doc_off, w.docs, (w.n_docs + 1) * sizeof(uint64_t));
	/* file size is exactly the ids at the chosen width */
	char p[512];
	snprintf(p, sizeof p, "%s/%s.bin", tmpdir, name);
	struct stat st;
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal((uint64_t)st.st_size, w.n_tok * (uint64_t)want_bytes);
	shard_close(s);
	free(w.tok);
}

static void test_roundtrip_u16(void **state)
{
	(void)state;
	check_roundtrip(30522, 2);
	check_roundtrip(65536, 2);
}

static void test_roundtrip_u32(void **state)
{
	(void)state;
	check_roundtrip(65537, 4);
	check_roundtrip(250000, 4);
}

static void test_writer_refuses(void **state)
{
	(void)state;
	shard_vocab_info v = vocab_info(100);
	shard_writer *w = NULL;
	assert_int_equal(shard_writer_create(tmpdir, "a/b", &v, &w), -EINVAL);
	assert_int_equal(shard_writer_create(tmpdir, "", &v, &w), -EINVAL);
	assert_int_equal(shard_writer_create("/nonexistent-dir", "x", &v, &w), -ENOENT);
	strcpy(v.sha256, "nothex");
	assert_int_equal(shard_writer_create(tmpdir, "x", &v, &w), -EINVAL);
	/* abort leaves nothing behind */
	v = vocab_info(100);
	uint32_t ids[2] = {1, 2};
	assert_int_equal(shard_writer_create(tmpdir, "aborted", &v, &w), 0);
	assert_int_equal(shard_writer_add_sentence(w, ids, 2), 0);
	shard_writer_abort(w);
	char p[512];
	snprintf(p, sizeof p, "%s/aborted.bin", tmpdir);
	assert_int_equal(access(p, F_OK), -1);
}

static char *read_file(const char *p, size_t *n)
{
	FILE *f = fopen(p, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(*n + 1);
	assert_int_equal(fread(b, 1, *n, f), *n);
	fclose(f);
	return b;
}

static void put_file(const char *p, const void *b, size_t n)
{
	FILE *f = fopen(p, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(b, 1, n, f), n);
	fclose(f);
}

/* Copies shard "good" to "bad" with idx (and optionally bin) replaced. */
static int open_damaged(const char *idx, size_t ni, const char *bin, size_t nb, const char *sha)
{
	char p[512];
	snprintf(p, sizeof p, "%s/bad.idx", tmpdir);
	put_file(p, idx, ni);
	snprintf(p, sizeof p, "%s/bad.bin", tmpdir);
	put_file(p, bin, nb);
	shard *s = NULL;
	int rc = shard_open(tmpdir, "bad", sha, &s);
	if (rc == 0) {
		/* an accepted file must be fully consistent */
		const corpus_view *v = shard_view(s);
		for (uint64_t i = 0; i < v->n_sents; i++)
			assert_true(v->sent_off[i] < v->sent_off[i + 1]);
		assert_true(v->sent_off[v->n_sents] == v->n_tokens);
		shard_close(s);
	} else {
		assert_null(s);
	}
	return rc;
}

static void test_corrupt(void **state)
{
	(void)state;
	written w;
	write_shard("good", 30522, &w);
	free(w.tok);
	char p[512];
	size_t ni, nb;
	snprintf(p, sizeof p, "%s/good.idx", tmpdir);
	char *idx = read_file(p, &ni);
	snprintf(p, sizeof p, "%s/good.bin", tmpdir);
	char *bin = read_file(p, &nb);
	shard_vocab_info v = vocab_info(30522);
	char *m = malloc(ni);

	assert_int_equal(open_damaged(idx, ni, bin, nb, v.sha256), 0);
	/* truncated anywhere */
	size_t cuts[] = {0, 7, 64, 127, 128, 136, ni / 2, ni - 8, ni - 1};
	for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++)
		assert_int_equal(open_damaged(idx, cuts[i], bin, nb, NULL), -EBADMSG);
	/* bad magic */
	memcpy(m, idx, ni);
	m[0] = 'X';
	assert_int_equal(open_damaged(m, ni, bin, nb, NULL), -EBADMSG);
	/* future version */
	memcpy(m, idx, ni);
	m[8] = 2;
	assert_int_equal(open_damaged(m, ni, bin, nb, NULL), -ENOTSUP);
	/* other vocab */
	char other[65];
	sha256_hex("other", 5, other);
	assert_int_equal(open_damaged(idx, ni, bin, nb, other), -ESTALE);
	/* bin of the wrong size */
	assert_int_equal(open_damaged(idx, ni, bin, nb - 2, NULL), -EBADMSG);
	assert_int_equal(open_damaged(idx, ni, bin, 0, NULL), -EBADMSG);
	/* a sentence offset going backwards */
	memcpy(m, idx, ni);
	uint64_t big = 1ull << 40;
	memcpy(m + 128 + 8 * 3, &big, 8);
	assert_int_equal(open_damaged(m, ni, bin, nb, NULL), -EBADMSG);
	/* counts that overflow the file size computation */
	memcpy(m, idx, ni);
	uint64_t huge = UINT64_MAX - 1;
	memcpy(m + 24, &huge, 8);
	assert_int_equal(open_damaged(m, ni, bin, nb, NULL), -EBADMSG);
	/* special id outside the vocab */
	memcpy(m, idx, ni);
	uint32_t sp = 40000;
	memcpy(m + 48 + 16, &sp, 4);
	assert_int_equal(open_damaged(m, ni, bin, nb, NULL), -EBADMSG);
	/* every single-byte flip of the header and first offsets: error or a
	 * consistent shard, never a crash */
	for (size_t off = 0; off < 200 && off < ni; off++) {
		memcpy(m, idx, ni);
		m[off] ^= 0x5a;
		int rc = open_damaged(m, ni, bin, nb, NULL);
		assert_true(rc == 0 || rc == -EBADMSG || rc == -ENOTSUP);
	}
	/* missing files */
	shard *s = NULL;
	assert_int_equal(shard_open(tmpdir, "absent", NULL, &s), -ENOENT);
	free(m);
	free(idx);
	free(bin);
}

static void test_dataset_manifest(void **state)
{
	(void)state;
	char dir[300], p[512];
	snprintf(dir, sizeof dir, "%s/ds", tmpdir);
	assert_int_equal(mkdir(dir, 0755), 0);
	const char *vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n";
	snprintf(p, sizeof p, "%s/vocab.txt", dir);
	put_file(p, vocab, strlen(vocab));
	shard_vocab_info v = {.vocab_size = 6, .lowercase = false, .special = {0, 1, 2, 3, 4}};
	sha256_hex(vocab, strlen(vocab), v.sha256);
	for (int k = 0; k < 2; k++) {
		char name[16];
		snprintf(name, sizeof name, "shard-%05d", k);
		shard_writer *w = NULL;
		assert_int_equal(shard_writer_create(dir, name, &v, &w), 0);
		uint32_t ids[3] = {5, 5, 5};
		assert_int_equal(shard_writer_add_sentence(w, ids, 3), 0);
		assert_int_equal(shard_writer_add_sentence(w, ids, 1 + k), 0);
		assert_int_equal(shard_writer_finish(w, NULL), 0);
	}
	char man[2048];
	snprintf(man, sizeof man,
		 "{\"format\":\"bertd-dataset\",\"version\":1,"
		 "\"vocab\":{\"file\":\"vocab.txt\",\"sha256\":\"%s\",\"size\":6,\"lowercase\":false},"
		 "\"shards\":[{\"name\":\"shard-00000\",\"tokens\":4,\"sentences\":2,\"documents\":1},"
		 "{\"name\":\"shard-00001\",\"tokens\":5,\"sentences\":2,\"documents\":%d}]}",
		 v.sha256, 1);
	snprintf(p, sizeof p, "%s/manifest.json", dir);
	put_file(p, man, strlen(man));
	shard_dataset *d = NULL;
	assert_int_equal(shard_dataset_open(dir, &d), 0);
	assert_int_equal(d->n_shards, 2);
	assert_int_equal(d->totals.tokens, 9);
	assert_int_equal(d->totals.docs, 2);
	assert_int_equal(d->views[1].n_tokens, 5);
	assert_int_equal(corpus_token(&d->views[1], 4), 5);
	shard_dataset_close(d);
	/* counts that disagree with the shard */
	char *two = strstr(man, "\"documents\":1}]");
	two[12] = '7';
	put_file(p, man, strlen(man));
	assert_int_equal(shard_dataset_open(dir, &d), -EBADMSG);
	assert_null(d);
	put_file(p, "{\"format\":", 10);
	assert_int_equal(shard_dataset_open(dir, &d), -EBADMSG);
	/* the vocab changed after preparation */
	two[12] = '1';
	put_file(p, man, strlen(man));
	snprintf(p, sizeof p, "%s/vocab.txt", dir);
	put_file(p, "[PAD]\n", 6);
	assert_int_equal(shard_dataset_open(dir, &d), -ESTALE);
	assert_int_equal(shard_dataset_open("/nonexistent", &d), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_u16),
		cmocka_unit_test(test_roundtrip_u32),
		cmocka_unit_test(test_writer_refuses),
		cmocka_unit_test(test_corrupt),
		cmocka_unit_test(test_dataset_manifest),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
