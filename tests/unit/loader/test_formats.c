/* Corpus files as they come (loader/instream.c through prepare_run): a
 * 2.5 MB text, and the same as JSON lines, compressed here by gzip(1),
 * zstd(1), xz(1) and bzip2(1) give shards byte-identical to the plain
 * file's (1 thread for the plain file, 3 for the compressed one, several
 * pieces each); a tar of compressed members, and a .tar.xz, the same as
 * their members; kinds told by magic, not names; include / exclude on a
 * directory and inside a tar; binary data and invalid UTF-8 fail naming
 * the file (the member) and the byte offset; Parquet refused with the
 * conversion; a truncated stream and a bad JSON line named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/fsutil.h"
#include "loader/instream.h"
#include "loader/prepare.h"
#include "tests/testdata.h"

static char tmp[256];
static char vocab[1024];

static const char *path(const char *name)
{
	static char p[64][512];
	static int k;
	k = (k + 1) % 64;
	snprintf(p[k], sizeof p[k], "%s/%s", tmp, name);
	return p[k];
}

static void put(const char *name, const void *data, size_t n)
{
	FILE *f = fopen(path(name), "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, n, f), n);
	fclose(f);
}

/* Runs a shell command in tmp; fails the test when it fails. */
static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
	char cmd[2048];
	int n = snprintf(cmd, sizeof cmd, "cd '%s' && ", tmp);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd + n, sizeof cmd - (size_t)n, fmt, ap);
	va_end(ap);
	int rc = system(cmd);
	if (rc != 0)
		fail_msg("%s: exit %d (scripts/setup installs gzip, zstd, xz-utils, bzip2, tar)", cmd, rc);
}

static int setup(void **state)
{
	(void)state;
	const char *base = getenv("TMPDIR");
	snprintf(tmp, sizeof tmp, "%s/bertd-test-formats-XXXXXX", base && base[0] ? base : "/tmp");
	if (!mkdtemp(tmp) || !testdata_path(vocab, sizeof vocab, "bert-base-uncased-vocab.txt"))
		return -1;
	/* the plain corpus: common-licenses over and over, past 2.5 MB, so a
	 * stream is cut into several pieces */
	size_t len;
	char *txt = testdata_licenses(&len);
	if (!txt)
		return -1;
	FILE *f = fopen(path("corpus.txt"), "wb");
	FILE *j = fopen(path("corpus.jsonl"), "wb");
	size_t total = 0;
	while (total < (5u << 19)) {
		fwrite(txt, 1, len, f);
		total += len;
		/* each paragraph one JSON object */
		for (size_t p = 0; p < len;) {
			const char *e = strstr(txt + p, "\n\n");
			size_t end = e ? (size_t)(e - txt) : len;
			json_t *o = json_stringn(txt + p, end - p);
			char *s = o ? json_dumps(o, JSON_ENCODE_ANY) : NULL;
			if (s)
				fprintf(j, "{\"text\": %s}\n", s);
			free(s);
			json_decref(o);
			p = end + 2;
		}
	}
	fclose(f);
	fclose(j);
	free(txt);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fs_remove_tree(tmp);
	return 0;
}

typedef struct run_opts {
	const char *in[4];
	size_t n_in;
	prepare_format format;
	const char *include[2], *exclude[2];
	size_t n_include, n_exclude;
	int threads;
} run_opts;

static int prep(const run_opts *ro, const char *out, prepare_summary *s, char *msg, size_t cap)
{
	prepare_opts o = {.inputs = ro->in, .n_inputs = ro->n_in, .vocab_path = vocab, .lowercase = 1,
			  .format = ro->format, .shard_tokens = 200000, .threads = ro->threads ? ro->threads : 3,
			  .progress_fd = -1, .include = ro->include, .n_include = ro->n_include,
			  .exclude = ro->exclude, .n_exclude = ro->n_exclude, .out_dir = path(out)};
	enum prepare_error err;
	msg[0] = 0;
	int rc = prepare_run(&o, s, &err, msg, cap);
	if (rc < 0)
		fprintf(stderr, "(expected?) %s: %s\n", out, msg);
	return rc;
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

/* Every shard file of datasets a and b: the same bytes, and as many. */
static void same_shards(const char *a, const char *b)
{
	int k = 0;
	for (;; k++) {
		char na[128], nb[128];
		for (int idx = 0; idx < 2; idx++) {
			snprintf(na, sizeof na, "%s/shard-%05d.%s", a, k, idx ? "idx" : "bin");
			snprintf(nb, sizeof nb, "%s/shard-%05d.%s", b, k, idx ? "idx" : "bin");
			size_t la = 0, lb = 0;
			char *x = slurp(path(na), &la), *y = slurp(path(nb), &lb);
			if (!x != !y)
				fail_msg("%s and %s: one is missing", na, nb);
			if (!x)
				goto done;
			if (la != lb || memcmp(x, y, la) != 0)
				fail_msg("%s and %s differ", na, nb);
			free(x);
			free(y);
		}
	}
done:
	assert_true(k >= 2); /* several shards: rotation went the same way */
}

static void test_each_compression(void **state)
{
	(void)state;
	static const char *const cmd[] = {"gzip -c", "zstd -q -c", "xz -c", "bzip2 -c"};
	static const char *const ext[] = {"gz", "zst", "xz", "bz2"};
	prepare_summary sp, sc;
	char msg[1024];
	for (int fmt = 0; fmt < 2; fmt++) {
		const char *plain = fmt ? "corpus.jsonl" : "corpus.txt";
		run_opts ro = {.in = {path(plain)}, .n_in = 1, .format = fmt ? PREPARE_JSONL : PREPARE_TEXT,
			       .threads = 1};
		char ref[32];
		snprintf(ref, sizeof ref, "ref-%d", fmt);
		assert_int_equal(prep(&ro, ref, &sp, msg, sizeof msg), 0);
		for (int c = 0; c < 4; c++) {
			char name[64], out[32];
			/* named without its extension: told by its first bytes */
			snprintf(name, sizeof name, "%s-%s", plain, ext[c]);
			sh("%s %s > %s", cmd[c], plain, name);
			snprintf(out, sizeof out, "%s-%d", ext[c], fmt);
			run_opts rc = {.in = {path(name)}, .n_in = 1, .format = ro.format, .threads = 3};
			assert_int_equal(prep(&rc, out, &sc, msg, sizeof msg), 0);
			same_shards(ref, out);
			assert_int_equal(sc.tokens, sp.tokens);
			assert_int_equal(sc.documents, sp.documents);
			struct stat st;
			assert_int_equal(stat(path(name), &st), 0);
			assert_int_equal(sc.bytes, st.st_size); /* the file as stored */
			assert_true(sc.bytes < sp.bytes);
		}
	}
}

static void test_tar(void **state)
{
	(void)state;
	prepare_summary sp, st;
	char msg[1024];
	sh("mkdir -p parts && head -c 700000 corpus.txt > parts/a.txt && tail -c 900000 corpus.txt > parts/b.txt && "
	   "printf 'last one\\n' > parts/c.txt && printf '# about\\n' > parts/README.md");
	run_opts ro = {.in = {path("parts/a.txt"), path("parts/b.txt"), path("parts/c.txt")}, .n_in = 3,
		       .threads = 1};
	assert_int_equal(prep(&ro, "ref-parts", &sp, msg, sizeof msg), 0);
	/* members compressed each their own way, a README and a macOS companion */
	sh("mkdir -p m && gzip -c parts/a.txt > m/a.txt.gz && zstd -q -c parts/b.txt > m/b.txt.zst && "
	   "bzip2 -c parts/c.txt > m/c.txt.bz2 && cp parts/README.md m/ && printf 'x\\000' > m/._a.txt.gz && "
	   "tar -cf members.tar -C m a.txt.gz b.txt.zst c.txt.bz2 ._a.txt.gz README.md");
	run_opts rt = {.in = {path("members.tar")}, .n_in = 1, .exclude = {"README*"}, .n_exclude = 1};
	assert_int_equal(prep(&rt, "tar-members", &st, msg, sizeof msg), 0);
	same_shards("ref-parts", "tar-members");
	assert_int_equal(st.documents, sp.documents);
	/* without the exclude the README is a document more */
	rt.n_exclude = 0;
	assert_int_equal(prep(&rt, "tar-readme", &st, msg, sizeof msg), 0);
	assert_int_equal(st.documents, sp.documents + 1);
	/* include by base name, and by path inside the archive */
	rt.include[0] = "*.txt*";
	rt.n_include = 1;
	assert_int_equal(prep(&rt, "tar-include", &st, msg, sizeof msg), 0);
	same_shards("ref-parts", "tar-include");
	/* a compressed tar of plain members, in a directory with a README */
	sh("mkdir -p tx && tar -cJf tx/parts.tar.xz -C parts a.txt b.txt c.txt && cp parts/README.md tx/");
	run_opts rx = {.in = {path("tx")}, .n_in = 1, .exclude = {"README*"}, .n_exclude = 1};
	assert_int_equal(prep(&rx, "tar-xz", &st, msg, sizeof msg), 0);
	same_shards("ref-parts", "tar-xz");
	assert_int_equal(st.files, 1);
	/* a plain file named .gz is read as the text it is */
	sh("cp parts/c.txt plain.gz");
	run_opts rg = {.in = {path("plain.gz")}, .n_in = 1};
	assert_int_equal(prep(&rg, "plain-gz", &st, msg, sizeof msg), 0);
	assert_int_equal(st.tokens, 2);
}

/* prep of in (one file) fails with -EILSEQ, -ENOTSUP... (want_rc) and a
 * message holding each of want[]. */
static void expect_fail(const char *in, prepare_format fmt, int want_rc, const char *const *want)
{
	run_opts ro = {.in = {path(in)}, .n_in = 1, .format = fmt};
	prepare_summary s;
	char msg[1024];
	assert_int_equal(prep(&ro, "fail-out", &s, msg, sizeof msg), want_rc);
	for (; *want; want++)
		if (!strstr(msg, *want))
			fail_msg("%s: \"%s\" lacks \"%s\"", in, msg, *want);
	assert_int_equal(access(path("fail-out"), F_OK), -1);
}

static void test_not_text(void **state)
{
	(void)state;
	/* invalid UTF-8 (Latin-1 é) at byte 2,000,006 of a plain file: its own chunk, past the first */
	sh("head -c 2000000 corpus.txt > latin1.txt && printf 'caf\\351 au lait\\n' >> latin1.txt");
	expect_fail("latin1.txt", PREPARE_TEXT, -EILSEQ,
		    (const char *[]){"latin1.txt: not UTF-8 text", "0xE9", "byte offset 2000003", NULL});
	/* the same, gzip'd: the offset is the decompressed one */
	sh("gzip -c latin1.txt > latin1.gz");
	expect_fail("latin1.gz", PREPARE_TEXT, -EILSEQ,
		    (const char *[]){"latin1.gz: not UTF-8 text", "byte offset 2000003 of the decompressed", NULL});
	/* binary: a NUL byte, in a member of a tar.gz */
	sh("mkdir -p bin && printf 'hello\\nwor\\000ld\\n' > bin/x.txt && cp parts/a.txt bin/a.txt && "
	   "tar -czf bin.tgz -C bin a.txt x.txt");
	expect_fail("bin.tgz", PREPARE_TEXT, -EILSEQ,
		    (const char *[]){"bin.tgz:x.txt: binary data", "NUL byte at byte offset 9", NULL});
	/* a zstd jsonl with a bad 3rd line */
	sh("printf '{\"text\":\"a\"}\\n{\"text\":\"b\"}\\n{\"txt\":\"c\"}\\n' | zstd -q -c > bad.jsonl.zst");
	expect_fail("bad.jsonl.zst", PREPARE_JSONL, -EBADMSG, (const char *[]){"bad.jsonl.zst:3:", NULL});
	/* truncated */
	sh("head -c 5000 latin1.gz > cut.gz");
	expect_fail("cut.gz", PREPARE_TEXT, -EBADMSG, (const char *[]){"cut.gz", "truncated", NULL});
	/* damaged archives: a header whose checksum fails, a member cut short */
	sh("cp members.tar badsum.tar && printf 'Z' | dd of=badsum.tar bs=1 seek=100 conv=notrunc 2>/dev/null && "
	   "head -c 1500 members.tar > cut.tar");
	expect_fail("badsum.tar", PREPARE_TEXT, -EBADMSG, (const char *[]){"badsum.tar: tar archive: no valid header at byte 0", NULL});
	expect_fail("cut.tar", PREPARE_TEXT, -EBADMSG, (const char *[]){"cut.tar: a.txt.gz: truncated", NULL});
	/* Parquet, told by its magic: refused with the conversion */
	static const char pq[] = "PAR1\x15\x04\x15\x10\x15\x14L\x15\x02\x15\x00\x12\x00\x00PAR1";
	put("data.bin", pq, sizeof pq - 1);
	expect_fail("data.bin", PREPARE_JSONL, -ENOTSUP,
		    (const char *[]){"data.bin: a Parquet file", "pandas.read_parquet", NULL});
	sh("mkdir -p pq && cp data.bin pq/train.parquet && tar -cf pq.tar -C pq train.parquet");
	expect_fail("pq.tar", PREPARE_JSONL, -ENOTSUP, (const char *[]){"pq.tar: train.parquet: a Parquet", NULL});
}

static void test_text_check(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		size_t n;
		int rc;
		size_t at;
	} cases[] = {
		{"plain ascii text, long enough for words", 39, 0, 0},
		{"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14, 0, 0},
		{"ab\xC0\x80", 4, -EILSEQ, 2},           /* overlong NUL */
		{"abc\xE0\x80\xAF", 6, -EILSEQ, 3},      /* overlong '/' */
		{"x\xED\xA0\x80", 4, -EILSEQ, 1},        /* a surrogate */
		{"\xF4\x90\x80\x80", 4, -EILSEQ, 0},     /* past U+10FFFF */
		{"12345678\xC3", 9, -EILSEQ, 8},         /* cut short */
		{"12345678\x80", 9, -EILSEQ, 8},         /* a lone continuation */
		{"0123456789abcdef\x00", 17, -EILSEQ, 16}, /* NUL after the fast path */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		size_t at = 99;
		int nul = -1;
		assert_int_equal(instream_text_check(cases[i].s, cases[i].n, &at, &nul), cases[i].rc);
		if (cases[i].rc)
			assert_int_equal(at, cases[i].at);
		assert_int_equal(nul, cases[i].at == 16);
	}
	/* sniffing: a text line starting "BZh9" is text */
	assert_int_equal(instream_sniff("BZh91AY&SY", 10), INSTREAM_BZIP2);
	assert_int_equal(instream_sniff("BZh9 is a line", 14), INSTREAM_PLAIN);
	assert_int_equal(instream_sniff("\x1F\x8B\x08", 3), INSTREAM_GZIP);
	assert_int_equal(instream_sniff("PAR1\x15\x04\x15\x00", 8), INSTREAM_PARQUET);
	assert_int_equal(instream_sniff("PAR1 is a line of text\n", 23), INSTREAM_PLAIN);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text_check),
		cmocka_unit_test(test_each_compression),
		cmocka_unit_test(test_tar),
		cmocka_unit_test(test_not_text),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
