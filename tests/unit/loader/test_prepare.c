/* bertd-prepare (library and CLI): document and sentence rules with hand
 * computed ids, BOM/CRLF, JSONL, identical output for any thread count,
 * shard rotation at document ends, progress lines, vocab training, and bad
 * inputs (empty files, 10,000 tiny files, one huge line, binary junk refused,
 * missing or incomplete vocab, existing output) giving a clear error class
 * and leaving nothing behind. BERTD_TEST_BIG_MB sizes the huge line (50).
 * Real text: /usr/share/common-licenses (also rewritten with a BOM and
 * CRLF); War and Peace and tinyshakespeare of ../shared/data add to it when
 * present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>

#include "common/fsutil.h"
#include "loader/prepare.h"
#include "loader/shard.h"
#include "tests/testdata.h"

static char tmp[256];

static int setup(void **state)
{
	(void)state;
	const char *base = getenv("TMPDIR");
	snprintf(tmp, sizeof tmp, "%s/bertd-test-prepare-XXXXXX", base && base[0] ? base : "/tmp");
	return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	fs_remove_tree(tmp);
	return 0;
}

static void put(const char *name, const void *data, size_t n)
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s", tmp, name);
	FILE *f = fopen(p, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, n, f), n);
	fclose(f);
}

static const char *path(const char *name)
{
	static char p[64][512];
	static int k;
	k = (k + 1) % 64;
	snprintf(p[k], sizeof p[k], "%s/%s", tmp, name);
	return p[k];
}

static char *slurp_file(const char *p, size_t *n)
{
	FILE *f = fopen(p, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(*n + 1);
	assert_int_equal(fread(b, 1, *n, f), *n);
	b[*n] = '\0';
	fclose(f);
	return b;
}

static const char VOCAB[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nfoo\nbar\n.\n##s\n";

static int run_prep(prepare_opts *o, enum prepare_error *err, prepare_summary *s)
{
	char msg[512];
	int rc = prepare_run(o, s, err, msg, sizeof msg);
	if (rc < 0)
		fprintf(stderr, "(expected?) prepare: %s\n", msg);
	return rc;
}

static void expect_sent(const corpus_view *v, uint64_t s, const uint32_t *ids, size_t n)
{
	assert_int_equal(v->sent_off[s + 1] - v->sent_off[s], n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(corpus_token(v, v->sent_off[s] + i), ids[i]);
}

static void test_text_rules(void **state)
{
	(void)state;
	put("vocab.txt", VOCAB, strlen(VOCAB));
	/* BOM, CRLF, blank lines (one with spaces) between documents, a line
	 * of control characters only (dropped), two files */
	const char a[] = "\xEF\xBB\xBFhello world\r\nfoo bar.\r\n\r\n  \t\r\nhellos\n\x01\x02\n\n\n\nworld";
	put("a.txt", a, sizeof a - 1);
	put("b.txt", "foo\nbar\n", 8);
	const char *in[] = {path("a.txt"), path("b.txt")};
	prepare_opts o = {.inputs = in, .n_inputs = 2, .out_dir = path("ds"),
			  .vocab_path = path("vocab.txt"), .lowercase = -1, .threads = 2, .progress_fd = -1};
	prepare_summary s;
	enum prepare_error err;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	assert_true(s.lowercase); /* inferred: no capitals in the vocab */
	shard_dataset *d;
	assert_int_equal(shard_dataset_open(path("ds"), &d), 0);
	const corpus_view *v = &d->views[0];
	assert_int_equal(d->n_shards, 1);
	assert_int_equal(v->n_docs, 4);
	assert_int_equal(v->n_sents, 6);
	assert_int_equal(v->token_bytes, 2);
	static const uint32_t s0[] = {5, 6}, s1[] = {7, 8, 9}, s2[] = {5, 10}, s3[] = {6},
			      s4[] = {7}, s5[] = {8};
	expect_sent(v, 0, s0, 2);
	expect_sent(v, 1, s1, 3);
	expect_sent(v, 2, s2, 2);
	expect_sent(v, 3, s3, 1);
	expect_sent(v, 4, s4, 1);
	expect_sent(v, 5, s5, 1);
	static const uint64_t docs[] = {0, 2, 3, 4, 6};
	assert_memory_equal(v->doc_off, docs, sizeof docs);
	assert_int_equal(v->special.mask, 4);
	assert_int_equal(s.documents, 4);
	assert_int_equal(s.tokens, 10);
	shard_dataset_close(d);
	/* no work dir left next to it */
	DIR *dd = opendir(tmp);
	struct dirent *e;
	while ((e = readdir(dd)))
		assert_null(strstr(e->d_name, ".partial"));
	closedir(dd);
	/* the output exists now */
	assert_int_equal(run_prep(&o, &err, &s), -EEXIST);
	assert_int_equal(err, PREPARE_ERR_OUTPUT);
}

/* A vocab over 65,536 entries makes uint32 shards, and the manifest says so. */
static void test_big_vocab(void **state)
{
	(void)state;
	size_t cap = 80000 * 12, n = 0;
	char *v = malloc(cap);
	n += (size_t)snprintf(v + n, cap - n, "%s", VOCAB);
	for (int i = 0; i < 70000; i++)
		n += (size_t)snprintf(v + n, cap - n, "w%d\n", i);
	n += (size_t)snprintf(v + n, cap - n, "zzz\n");
	put("big-vocab.txt", v, n);
	free(v);
	put("bv.txt", "zzz hello w69999\n", 17);
	const char *in[] = {path("bv.txt")};
	prepare_opts o = {.inputs = in, .n_inputs = 1, .out_dir = path("dbv"),
			  .vocab_path = path("big-vocab.txt"), .lowercase = 1, .threads = 1,
			  .progress_fd = -1};
	prepare_summary s;
	enum prepare_error err;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	shard_dataset *d;
	assert_int_equal(shard_dataset_open(path("dbv"), &d), 0);
	const corpus_view *cv = &d->views[0];
	assert_int_equal(cv->token_bytes, 4);
	assert_int_equal(cv->vocab_size, 11 + 70000 + 1);
	assert_int_equal(cv->n_tokens, 3);
	assert_int_equal(corpus_token(cv, 0), 11 + 70000); /* zzz, beyond uint16 */
	assert_int_equal(corpus_token(cv, 1), 5);
	assert_int_equal(corpus_token(cv, 2), 11 + 69999);
	shard_dataset_close(d);
	size_t mn;
	char *m = slurp_file(path("dbv/manifest.json"), &mn);
	assert_non_null(strstr(m, "\"token_dtype\": \"uint32\""));
	free(m);
}

static void test_jsonl(void **state)
{
	(void)state;
	put("vocab.txt", VOCAB, strlen(VOCAB));
	const char j[] = "{\"body\":\"hello world\\nfoo bar.\\n\\nhellos\",\"id\":1}\n\n"
			 "{\"body\":\"world\"}\r\n";
	put("c.jsonl", j, sizeof j - 1);
	const char *in[] = {path("c.jsonl")};
	prepare_opts o = {.inputs = in, .n_inputs = 1, .out_dir = path("dj"), .format = PREPARE_JSONL,
			  .text_field = "body", .vocab_path = path("vocab.txt"), .lowercase = 1,
			  .threads = 1, .progress_fd = -1};
	prepare_summary s;
	enum prepare_error err;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	assert_int_equal(s.documents, 2);
	assert_int_equal(s.sentences, 4);
	assert_int_equal(s.tokens, 8);
	/* a bad third line: error names the line, nothing is left behind */
	const char bad[] = "{\"body\":\"hello\"}\n{\"body\":\"world\"}\n{\"body\":3}\n";
	put("bad.jsonl", bad, sizeof bad - 1);
	in[0] = path("bad.jsonl");
	o.out_dir = path("dbad");
	char msg[512];
	assert_int_equal(prepare_run(&o, &s, &err, msg, sizeof msg), -EBADMSG);
	assert_int_equal(err, PREPARE_ERR_INPUT);
	assert_non_null(strstr(msg, "bad.jsonl:3:"));
	assert_int_equal(access(path("dbad"), F_OK), -1);
	put("bad2.jsonl", "[1,2]\n", 6);
	in[0] = path("bad2.jsonl");
	assert_int_equal(prepare_run(&o, &s, &err, msg, sizeof msg), -EBADMSG);
	assert_non_null(strstr(msg, "not a JSON object"));
}

static char *slurp(const char *p, size_t *n)
{
	FILE *f = fopen(p, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(*n + 1);
	assert_int_equal(fread(b, 1, *n, f), *n);
	fclose(f);
	return b;
}

static void same_file(const char *a, const char *b)
{
	size_t na, nb;
	char *x = slurp(a, &na), *y = slurp(b, &nb);
	assert_non_null(x);
	assert_non_null(y);
	assert_int_equal(na, nb);
	assert_memory_equal(x, y, na);
	free(x);
	free(y);
}

/* Real text with a BOM and CRLF line ends, as Windows editors and Project
 * Gutenberg write it: common-licenses, rewritten; returns its size. */
static long long put_licenses_crlf(const char *name)
{
	size_t len;
	char *txt = testdata_licenses(&len);
	assert_non_null(txt);
	char *o = malloc(3 + 2 * len);
	size_t n = 0;
	memcpy(o, "\xEF\xBB\xBF", 3);
	n = 3;
	for (size_t i = 0; i < len; i++) {
		if (txt[i] == '\n')
			o[n++] = '\r';
		o[n++] = txt[i];
	}
	put(name, o, n);
	free(o);
	free(txt);
	return (long long)n;
}

/* corpus through the cased vocab with 1 and 3 threads into out1/out3:
 * identical shards, rotated past shard_tokens at document ends only,
 * progress lines ending complete at bytes. */
static void threads_and_shards(const char *corpus, long long bytes, uint64_t shard_tokens,
			       const char *out1, const char *out3)
{
	char vocab[1024];
	testdata_path(vocab, sizeof vocab, "bert-base-cased-vocab.txt");
	const char *in[] = {corpus};
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	fcntl(pfd[0], F_SETFL, O_NONBLOCK);
	fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20);
	prepare_opts o = {.inputs = in, .n_inputs = 1, .vocab_path = vocab, .lowercase = 0,
			  .shard_tokens = shard_tokens, .threads = 1, .progress_fd = pfd[1]};
	prepare_summary s1, s3;
	enum prepare_error err;
	o.out_dir = path(out1);
	assert_int_equal(run_prep(&o, &err, &s1), 0);
	o.out_dir = path(out3);
	o.threads = 3;
	o.progress_fd = -1;
	assert_int_equal(run_prep(&o, &err, &s3), 0);
	fprintf(stderr, "%s: %llu tokens, %llu shards of >= %llu tokens\n", corpus,
		(unsigned long long)s1.tokens, (unsigned long long)s1.shards, (unsigned long long)shard_tokens);
	assert_true(s1.shards >= 4); /* a new shard past shard_tokens: callers pick >= 4 */
	assert_int_equal(s1.shards, s3.shards);
	assert_int_equal(s1.tokens, s3.tokens);
	for (uint64_t k = 0; k < s1.shards; k++) {
		char a[64], b[64];
		snprintf(a, sizeof a, "%s/shard-%05llu.bin", out1, (unsigned long long)k);
		snprintf(b, sizeof b, "%s/shard-%05llu.bin", out3, (unsigned long long)k);
		same_file(path(a), path(b));
		snprintf(a, sizeof a, "%s/shard-%05llu.idx", out1, (unsigned long long)k);
		snprintf(b, sizeof b, "%s/shard-%05llu.idx", out3, (unsigned long long)k);
		same_file(path(a), path(b));
	}
	shard_dataset *d;
	assert_int_equal(shard_dataset_open(path(out1), &d), 0);
	assert_int_equal(d->n_shards, s1.shards);
	assert_false(d->vocab.lowercase);
	for (size_t k = 0; k + 1 < d->n_shards; k++)
		assert_true(d->views[k].n_tokens >= shard_tokens); /* only closed at a document end past it */
	assert_int_equal(d->totals.tokens, s1.tokens);
	shard_dataset_close(d);
	/* progress: JSON lines, the last one complete */
	char buf[1 << 16];
	ssize_t n = read(pfd[0], buf, sizeof buf - 1);
	assert_true(n > 0);
	buf[n] = '\0';
	char *last = NULL;
	for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n"))
		last = l;
	json_error_t je;
	json_t *j = json_loads(last, 0, &je);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "phase")), "tokenize");
	assert_int_equal(json_integer_value(json_object_get(j, "bytes_done")),
			 json_integer_value(json_object_get(j, "bytes_total")));
	assert_int_equal(json_integer_value(json_object_get(j, "bytes_total")), bytes);
	json_decref(j);
	close(pfd[0]);
	close(pfd[1]);
}

static void test_threads_and_shards(void **state)
{
	(void)state;
	long long n = put_licenses_crlf("licenses-crlf.txt");
	threads_and_shards(path("licenses-crlf.txt"), n, 15000, "t1", "t3");
	char corpus[1024]; /* BOM, CRLF, ~740k tokens: a new shard past 200k */
	if (testdata_shared(corpus, sizeof corpus, "pg2600-war-and-peace.txt", "prepare threads/shards on War and Peace"))
		threads_and_shards(corpus, 3290314, 200000, "wp1", "wp3");
}

/* Trains a 3000 vocab on corpus (bytes long) with 2 threads into out1 and
 * 1 thread into out2: progress over both passes, a low [UNK] rate, the same
 * vocab and shards. */
static void train_vocab(const char *corpus, long long bytes, const char *out1, const char *out2)
{
	const char *in[] = {corpus};
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	prepare_opts o = {.inputs = in, .n_inputs = 1, .train_vocab_size = 3000, .lowercase = 1,
			  .threads = 2, .progress_fd = pfd[1]};
	prepare_summary s;
	enum prepare_error err;
	o.out_dir = path(out1);
	assert_int_equal(run_prep(&o, &err, &s), 0);
	close(pfd[1]);
	/* progress: bytes_total is the corpus once; bytes_done runs
	 * 0..bytes_total in each phase, vocab then tokenize; fraction only grows
	 * over the whole run, the vocab pass its first half, and ends at 1 */
	char buf[1 << 16];
	ssize_t n = read(pfd[0], buf, sizeof buf - 1);
	close(pfd[0]);
	assert_true(n > 0);
	buf[n] = '\0';
	long long done = 0, total = 0, prev_done = -1;
	double frac = 0, prev_frac = -1;
	const char *prev_phase = "vocab";
	int lines[2] = {0, 0}; /* vocab, tokenize */
	for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n")) {
		json_error_t je;
		json_t *j = json_loads(l, 0, &je);
		assert_non_null(j);
		const char *phase = json_string_value(json_object_get(j, "phase"));
		assert_non_null(phase);
		bool tok = strcmp(phase, "tokenize") == 0;
		if (!tok)
			assert_string_equal(phase, "vocab");
		if (tok && strcmp(prev_phase, "vocab") == 0)
			prev_done = -1; /* a new pass reads the corpus again */
		assert_false(!tok && strcmp(prev_phase, "tokenize") == 0); /* vocab only first */
		prev_phase = tok ? "tokenize" : "vocab";
		lines[tok]++;
		done = json_integer_value(json_object_get(j, "bytes_done"));
		total = json_integer_value(json_object_get(j, "bytes_total"));
		frac = json_real_value(json_object_get(j, "fraction"));
		assert_int_equal(total, bytes);
		assert_true(done >= prev_done && done <= total);
		assert_true(frac >= prev_frac);
		assert_true(tok ? frac >= 0.5 && frac <= 1.0 : frac <= 0.5);
		if (!tok && done == total)
			assert_true(frac == 0.5); /* the vocab pass ends at half */
		prev_done = done;
		prev_frac = frac;
		json_decref(j);
	}
	assert_true(lines[0] >= 1 && lines[1] >= 1);
	assert_string_equal(prev_phase, "tokenize");
	assert_int_equal(done, bytes);
	assert_true(frac == 1.0);
	assert_true(s.vocab_trained);
	assert_int_equal(s.vocab_size, 3000);
	assert_int_equal(s.vocab_size_requested, 3000);
	fprintf(stderr, "trained 3000 on %s: %llu tokens, unk rate %.5f%%\n", corpus,
		(unsigned long long)s.tokens, 100.0 * (double)s.unk / (double)s.tokens);
	assert_true((double)s.unk / (double)s.tokens < 0.001);
	o.out_dir = path(out2);
	o.threads = 1;
	o.progress_fd = -1;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	char a[128], b[128];
	snprintf(a, sizeof a, "%s/vocab.txt", out1);
	snprintf(b, sizeof b, "%s/vocab.txt", out2);
	same_file(path(a), path(b));
	snprintf(a, sizeof a, "%s/shard-00000.bin", out1);
	snprintf(b, sizeof b, "%s/shard-00000.bin", out2);
	same_file(path(a), path(b));
	shard_dataset *d;
	assert_int_equal(shard_dataset_open(path(out1), &d), 0);
	assert_int_equal(d->vocab.vocab_size, 3000);
	shard_dataset_close(d);
}

static void test_train_vocab(void **state)
{
	(void)state;
	size_t len;
	char *txt = testdata_licenses(&len);
	assert_non_null(txt);
	put("licenses.txt", txt, len);
	free(txt);
	train_vocab(path("licenses.txt"), (long long)len, "v1", "v2");
	char corpus[1024];
	if (testdata_shared(corpus, sizeof corpus, "tinyshakespeare.txt", "prepare vocab training on tinyshakespeare"))
		train_vocab(corpus, 1115394, "vs1", "vs2");
}

/* A corpus too small for the vocab asked for: not an error; the
 * vocab has every word as one entry, and the summary (what the dataset
 * resource shows as stats) says the size reached and the size asked. */
static void test_train_vocab_small_corpus(void **state)
{
	(void)state;
	/* words: hello x2, world x2, help x1; alphabet d e h l o p r w (8) */
	put("small.txt", "hello world\nhello world help\n", 29);
	const char *in[] = {path("small.txt")};
	prepare_opts o = {.inputs = in, .n_inputs = 1, .out_dir = path("small"),
			  .train_vocab_size = 1000, .lowercase = 1, .threads = 1, .progress_fd = -1};
	prepare_summary s;
	enum prepare_error err;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	assert_true(s.vocab_trained);
	assert_int_equal(s.vocab_size_requested, 1000);
	/* 5 specials + 8 + 8 "##" characters, then merges until each word is one
	 * piece (by hand: h ##e and ##e ##l occur 3 times, ties to the smaller
	 * string): ##el, hel, ##ld, ##lo, ##or, ##orld, hello, world, then help
	 * (count 1) = 30 */
	assert_int_equal(s.vocab_size, 30);
	size_t n;
	char *v = slurp_file(path("small/vocab.txt"), &n);
	size_t lines = 0;
	for (size_t i = 0; i < n; i++)
		lines += v[i] == '\n';
	assert_int_equal(lines, 30);
	assert_non_null(strstr(v, "\nhello\n"));
	assert_non_null(strstr(v, "\nworld\n"));
	assert_non_null(strstr(v, "\nhelp\n"));
	free(v);
	json_t *j = prepare_summary_json(&s, path("small"));
	assert_int_equal(json_integer_value(json_object_get(j, "vocab_size")), 30);
	assert_int_equal(json_integer_value(json_object_get(j, "vocab_size_requested")), 1000);
	json_decref(j);
	assert_int_equal(s.unk, 0);
	assert_int_equal(s.tokens, 5); /* hello world hello world help */
	/* a given vocab has no requested size */
	put("vocab.txt", VOCAB, strlen(VOCAB));
	o = (prepare_opts){.inputs = in, .n_inputs = 1, .out_dir = path("small2"),
			   .vocab_path = path("vocab.txt"), .lowercase = 1, .threads = 1,
			   .progress_fd = -1};
	assert_int_equal(run_prep(&o, &err, &s), 0);
	j = prepare_summary_json(&s, path("small2"));
	assert_true(json_is_null(json_object_get(j, "vocab_size_requested")));
	json_decref(j);
}

static void test_bad_inputs(void **state)
{
	(void)state;
	put("vocab.txt", VOCAB, strlen(VOCAB));
	prepare_summary s;
	enum prepare_error err;
	const char *in[1];
	prepare_opts o = {.inputs = in, .n_inputs = 1, .vocab_path = path("vocab.txt"),
			  .lowercase = 1, .threads = 2, .progress_fd = -1};
	/* empty files only */
	put("e1.txt", "", 0);
	put("e2.txt", "\n\n \n", 4);
	in[0] = path("e?.txt"); /* a glob */
	o.out_dir = path("de");
	assert_int_equal(run_prep(&o, &err, &s), -ENODATA);
	assert_int_equal(err, PREPARE_ERR_INPUT);
	assert_int_equal(access(path("de"), F_OK), -1);
	/* nothing there */
	in[0] = path("nothing-*.txt");
	assert_int_equal(run_prep(&o, &err, &s), -ENOENT);
	assert_int_equal(err, PREPARE_ERR_INPUT);
	in[0] = path("absent.txt");
	assert_int_equal(run_prep(&o, &err, &s), -ENOENT);
	/* vocab problems */
	put("x.txt", "hello\n", 6);
	in[0] = path("x.txt");
	o.vocab_path = path("no-vocab.txt");
	assert_int_equal(run_prep(&o, &err, &s), -ENOENT);
	assert_int_equal(err, PREPARE_ERR_VOCAB);
	put("nomask.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", 29);
	o.vocab_path = path("nomask.txt");
	assert_int_equal(run_prep(&o, &err, &s), -EINVAL);
	assert_int_equal(err, PREPARE_ERR_VOCAB);
	o.vocab_path = path("vocab.txt");
	/* binary junk: refused as not text, naming the file (tests/unit/loader/test_formats.c
	 * checks the offsets) */
	unsigned char junk[1 << 16];
	uint32_t x = 12345;
	for (size_t i = 0; i < sizeof junk; i++) {
		x = x * 1103515245 + 12345;
		junk[i] = (unsigned char)(x >> 16);
	}
	put("junk.bin", junk, sizeof junk);
	in[0] = path("junk.bin");
	o.out_dir = path("dk");
	char jmsg[512];
	assert_int_equal(prepare_run(&o, &s, &err, jmsg, sizeof jmsg), -EILSEQ);
	assert_int_equal(err, PREPARE_ERR_INPUT);
	assert_non_null(strstr(jmsg, "junk.bin: "));
	assert_int_equal(access(path("dk"), F_OK), -1);
	/* 10,000 tiny files in a directory tree: one document each */
	char dir[512];
	snprintf(dir, sizeof dir, "%s/many", tmp);
	assert_int_equal(mkdir(dir, 0755), 0);
	for (int i = 0; i < 10000; i++) {
		char p[600];
		if (i % 1000 == 0) {
			snprintf(p, sizeof p, "%s/d%d", dir, i / 1000);
			assert_int_equal(mkdir(p, 0755), 0);
		}
		snprintf(p, sizeof p, "%s/d%d/f%05d.txt", dir, i / 1000, i);
		FILE *f = fopen(p, "w");
		assert_non_null(f);
		fputs(i % 2 ? "hello world\n" : "foo\r\nbar", f);
		fclose(f);
	}
	put("many/.hidden", "hello", 5);
	in[0] = dir;
	o.out_dir = path("dm");
	assert_int_equal(run_prep(&o, &err, &s), 0);
	assert_int_equal(s.files, 10000);
	assert_int_equal(s.documents, 10000);
	assert_int_equal(s.sentences, 15000);
	assert_int_equal(s.tokens, 20000);
	/* one huge line */
	const char *mb_env = getenv("BERTD_TEST_BIG_MB");
	size_t mb = mb_env ? strtoul(mb_env, NULL, 10) : 50;
	size_t big = mb << 20;
	char *line = malloc(big);
	for (size_t i = 0; i < big; i += 12)
		memcpy(line + i, "hello world ", big - i < 12 ? big - i : 12);
	put("big.txt", line, big);
	free(line);
	in[0] = path("big.txt");
	o.out_dir = path("db");
	o.max_sentence_tokens = 510;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	/* a cut-off tail "hello wo" still makes "hello" and one [UNK] */
	uint64_t words = big / 12 * 2 + (big % 12 >= 5) + (big % 12 >= 7);
	assert_int_equal(s.tokens, words);
	assert_int_equal(s.documents, 1);
	assert_int_equal(s.sentences, (words + 509) / 510);
	/* usage errors */
	o.threads = 0;
	o.out_dir = path("du");
	assert_int_equal(run_prep(&o, &err, &s), -EINVAL);
	assert_int_equal(err, PREPARE_ERR_USAGE);
}

/* The CLI: exit codes and the JSON line on stdout. */
static void mkdirs(const char *name)
{
	char p[600], *q;
	snprintf(p, sizeof p, "%s/%s", tmp, name);
	for (q = p + strlen(tmp) + 1; (q = strchr(q, '/')); q++) {
		*q = 0;
		mkdir(p, 0755);
		*q = '/';
	}
	mkdir(p, 0755);
}

static void ln(const char *target, const char *name)
{
	assert_int_equal(symlink(target, path(name)), 0);
}

static bool file_has(const char *p, const char *needle)
{
	size_t n;
	char *b = slurp_file(p, &n);
	bool has = memmem(b, n, needle, strlen(needle)) != NULL;
	free(b);
	return has;
}

/* A link planted in a source directory must not bring a file
 * from outside the data roots into the dataset; links inside are followed. */
static void test_links_confined(void **state)
{
	(void)state;
	mkdirs("lk/root/corp/sub");
	mkdirs("lk/outdir");
	put("lk/outside.txt", "zqxsecretword hello\n", 20);
	put("lk/outdir/o.txt", "zqxsecretword world\n", 20);
	put("lk/vocab.txt", VOCAB, strlen(VOCAB));
	put("lk/root/vocab.txt", VOCAB, strlen(VOCAB));
	put("lk/root/corp/a.txt", "hello world\n", 12);
	put("lk/root/corp/sub/b.txt", "foo bar\n", 8);
	ln("a.txt", "lk/root/corp/in.txt");             /* inside: followed */
	ln("../corp/sub", "lk/root/corp/dirlink");        /* inside, a directory */
	ln("../../outside.txt", "lk/root/corp/leak.txt"); /* climbs out */
	ln(path("lk/outside.txt"), "lk/root/corp/abs.txt"); /* absolute, outside */
	ln("../../outdir", "lk/root/corp/outdir");         /* a directory outside */
	ln("../../vocab.txt", "lk/root/vocab_link");
	const char *root = path("lk/root"), *roots[] = {root};
	const char *in[] = {path("lk/root/corp")};
	prepare_opts o = {.inputs = in, .n_inputs = 1, .out_dir = path("lk/ds1"),
			  .vocab_path = path("lk/root/vocab.txt"), .lowercase = 1, .threads = 2,
			  .progress_fd = -1, .roots = roots, .n_roots = 1};
	enum prepare_error err;
	prepare_summary s;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	/* a.txt, in.txt (= a.txt), dirlink/b.txt, sub/b.txt; nothing from outside */
	assert_int_equal(s.files, 4);
	assert_int_equal(s.tokens, 8);
	assert_int_equal(s.unk, 0);

	/* a trained vocab never sees the outside word either */
	o.out_dir = path("lk/ds2");
	o.vocab_path = NULL;
	o.train_vocab_size = 128;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	assert_false(file_has(path("lk/ds2/vocab.txt"), "zqx"));
	assert_true(file_has(path("lk/ds2/vocab.txt"), "hello"));

	/* an input, or a vocab, that leads out of the roots is refused */
	char msg[512];
	const char *leak[] = {path("lk/root/corp/leak.txt")};
	o = (prepare_opts){.inputs = leak, .n_inputs = 1, .out_dir = path("lk/ds3"),
			   .vocab_path = path("lk/root/vocab.txt"), .lowercase = 1, .threads = 1,
			   .progress_fd = -1, .roots = roots, .n_roots = 1};
	assert_int_equal(prepare_run(&o, &s, &err, msg, sizeof msg), -EACCES);
	assert_int_equal(err, PREPARE_ERR_INPUT);
	assert_non_null(strstr(msg, "outside the data roots"));
	assert_null(strstr(msg, "zqx"));
	o.inputs = in;
	o.vocab_path = path("lk/root/vocab_link");
	assert_int_equal(prepare_run(&o, &s, &err, msg, sizeof msg), -EACCES);
	assert_int_equal(err, PREPARE_ERR_VOCAB);
	assert_non_null(strstr(msg, "outside the data roots"));
	struct stat st;
	assert_int_equal(stat(path("lk/ds3"), &st), -1);

	/* without roots (a hand run) links are followed wherever they lead */
	o = (prepare_opts){.inputs = in, .n_inputs = 1, .out_dir = path("lk/ds4"),
			   .vocab_path = path("lk/vocab.txt"), .lowercase = 1, .threads = 1,
			   .progress_fd = -1};
	assert_int_equal(run_prep(&o, &err, &s), 0);
	assert_int_equal(s.files, 7);
	assert_int_equal(s.unk, 3);
}

/* "ln -s . l1; ln -s . l2" made the walk list 2^64 paths; loops
 * are skipped, and depth, file count and bytes are bounded. */
static void test_link_loops_and_bounds(void **state)
{
	(void)state;
	mkdirs("lp/src/sub/d1/d2");
	put("lp/vocab.txt", VOCAB, strlen(VOCAB));
	put("lp/src/a.txt", "hello world\n", 12);
	put("lp/src/sub/b.txt", "foo\n", 4);
	put("lp/src/sub/d1/d2/c.txt", "bar\n", 4);
	ln(".", "lp/src/l1");
	ln(".", "lp/src/l2");
	ln("..", "lp/src/sub/up");
	ln("../..", "lp/src/sub/d1/top");
	const char *roots[] = {path("lp")}, *in[] = {path("lp/src")};
	prepare_opts o = {.inputs = in, .n_inputs = 1, .out_dir = path("lp/ds1"),
			  .vocab_path = path("lp/vocab.txt"), .lowercase = 1, .threads = 1,
			  .progress_fd = -1, .roots = roots, .n_roots = 1};
	enum prepare_error err;
	prepare_summary s;
	char msg[512];
	for (int confined = 1; confined >= 0; confined--) {
		o.n_roots = (size_t)confined;
		o.out_dir = path(confined ? "lp/ds1" : "lp/ds2");
		assert_int_equal(run_prep(&o, &err, &s), 0);
		assert_int_equal(s.files, 3);
		assert_int_equal(s.tokens, 4);
	}
	/* sub/d1/d2 is 3 levels below src */
	o.out_dir = path("lp/ds3");
	o.max_depth = 2;
	assert_int_equal(prepare_run(&o, &s, &err, msg, sizeof msg), -ELOOP);
	assert_int_equal(err, PREPARE_ERR_INPUT);
	assert_non_null(strstr(msg, "max_depth"));
	o.max_depth = 3;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	o.out_dir = path("lp/ds4");
	o.max_depth = 0;
	o.max_files = 2;
	assert_int_equal(prepare_run(&o, &s, &err, msg, sizeof msg), -EFBIG);
	assert_non_null(strstr(msg, "max_files"));
	o.max_files = 3;
	o.max_bytes = 19;
	assert_int_equal(prepare_run(&o, &s, &err, msg, sizeof msg), -EFBIG);
	assert_non_null(strstr(msg, "max_bytes"));
	o.max_bytes = 20;
	assert_int_equal(run_prep(&o, &err, &s), 0);
	assert_int_equal(s.bytes, 20);
}

static int run_cli(const char *args, json_t **last)
{
	const char *exe = getenv("BERTD_PREPARE_EXE");
	char cmd[4096], out[600];
	snprintf(out, sizeof out, "%s/cli-out.txt", tmp);
	snprintf(cmd, sizeof cmd, "%s %s >%s 2>/dev/null", exe, args, out);
	int st = system(cmd);
	size_t n;
	char *o = slurp(out, &n);
	*last = NULL;
	if (o && n) {
		o[n] = '\0';
		char *l = o + n - 1;
		*l = '\0';
		while (l > o && l[-1] != '\n')
			l--;
		json_error_t je;
		*last = json_loads(l, 0, &je);
	}
	free(o);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		skip();
	put("vocab.txt", VOCAB, strlen(VOCAB));
	put("in.txt", "hello world\n\nfoo\n", 17);
	char a[2048];
	json_t *j;
	snprintf(a, sizeof a, "-o %s/cli1/ --vocab %s/vocab.txt -j 2 %s/in.txt", tmp, tmp, tmp);
	assert_int_equal(run_cli(a, &j), 0);
	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "ok")));
	assert_int_equal(json_integer_value(json_object_get(j, "tokens")), 3);
	assert_int_equal(json_integer_value(json_object_get(j, "documents")), 2);
	json_decref(j);
	assert_int_equal(run_cli(a, &j), 2); /* exists now: common/exitcodes.h BAD_CONFIG */
	assert_true(json_is_false(json_object_get(j, "ok")));
	assert_int_equal(json_integer_value(json_object_get(j, "exit_code")), 2);
	json_decref(j);
	snprintf(a, sizeof a, "-o %s/cli2 --vocab %s/none.txt %s/in.txt", tmp, tmp, tmp);
	assert_int_equal(run_cli(a, &j), 5); /* DATA */
	json_decref(j);
	snprintf(a, sizeof a, "-o %s/cli2 --vocab %s/vocab.txt %s/none.txt", tmp, tmp, tmp);
	assert_int_equal(run_cli(a, &j), 5);
	json_decref(j);
	snprintf(a, sizeof a, "-o %s/cli2 %s/in.txt", tmp, tmp);
	assert_int_equal(run_cli(a, &j), 2);
	json_decref(j);
	snprintf(a, sizeof a, "-o %s/cli2 --vocab %s/vocab.txt --progress-fd 999 %s/in.txt", tmp, tmp, tmp);
	assert_int_equal(run_cli(a, &j), 2);
	json_decref(j);
	/* the progress channel (here stdout itself) ends with {"stats": ...} */
	snprintf(a, sizeof a, "-o %s/cli3 --vocab %s/vocab.txt --progress-fd 1 %s/in.txt", tmp, tmp, tmp);
	assert_int_equal(run_cli(a, &j), 0);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "phase")), "done");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "stats"), "tokens")), 3);
	json_decref(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text_rules),
		cmocka_unit_test(test_big_vocab),
		cmocka_unit_test(test_jsonl),
		cmocka_unit_test(test_threads_and_shards),
		cmocka_unit_test(test_train_vocab),
		cmocka_unit_test(test_train_vocab_small_corpus),
		cmocka_unit_test(test_bad_inputs),
		cmocka_unit_test(test_cli),
		cmocka_unit_test(test_links_confined),
		cmocka_unit_test(test_link_loops_and_bounds),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
