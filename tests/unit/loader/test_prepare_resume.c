/* bertd-prepare killed with SIGKILL midway and run again: it continues from
 * the shards it finished (and the vocab it trained) and its output is
 * byte-identical, file by file, to a run never interrupted; a work
 * directory whose inputs changed, or whose kept shard was damaged, is
 * started over (same output); a second run on the same output while one
 * runs is refused without touching its work. Also shard_dataset_verify on a
 * dataset made here and then damaged file by file: each error names the
 * file.
 *
 * The victim is throttled (SIGSTOP, SIGCONT for a few ms, SIGSTOP, ...) and
 * killed once its resume.json lists enough shards, so where the kill lands
 * does not depend on the machine's speed. Real text: the texts of
 * /usr/share/common-licenses, repeated to ~3 MB (three 1 MiB chunks).
 * Needs the bertd-prepare executable ($BERTD_PREPARE_EXE); skips without. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>

#include "common/fsutil.h"
#include "loader/shard.h"
#include "tests/testdata.h"

#define SHARD_TOKENS "40000"

static char tmp[256], corpus[320], vocab[320];
static const char *input = corpus; /* what bertd-prepare reads: the corpus, or its .gz */

static int setup(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		return 0;
	const char *base = getenv("TMPDIR");
	snprintf(tmp, sizeof tmp, "%s/bertd-test-resume-XXXXXX", base && base[0] ? base : "/tmp");
	if (!mkdtemp(tmp))
		return -1;
	size_t n;
	char *text = testdata_licenses(&n);
	if (!text)
		return -1;
	snprintf(corpus, sizeof corpus, "%s/corpus.txt", tmp);
	FILE *f = fopen(corpus, "wb");
	for (size_t w = 0; f && w < (size_t)3 << 20; w += n)
		fwrite(text, 1, n, f);
	free(text);
	if (!f || fclose(f) != 0)
		return -1;
	testdata_path(vocab, sizeof vocab, "bert-base-uncased-vocab.txt");
	/* the manifest's "created": the same in every run compared */
	setenv("SOURCE_DATE_EPOCH", "1700000000", 1);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (tmp[0])
		fs_remove_tree(tmp);
	return 0;
}

/* argv for bertd-prepare -o tmp/out with extra options (a NULL-ended list
 * of at most 8) and the corpus. */
static void make_argv(const char **argv, const char *out, const char *const *extra)
{
	static char o[400];
	snprintf(o, sizeof o, "%s/%s", tmp, out);
	int a = 0;
	argv[a++] = getenv("BERTD_PREPARE_EXE");
	argv[a++] = "-o";
	argv[a++] = o;
	argv[a++] = "--shard-tokens";
	argv[a++] = SHARD_TOKENS;
	for (int i = 0; extra[i]; i++)
		argv[a++] = extra[i];
	argv[a++] = input;
	argv[a] = NULL;
}

/* Starts bertd-prepare (stdout to tmp/<out>.json, stderr to /dev/null). */
static pid_t spawn(const char *out, const char *const *extra)
{
	const char *argv[24];
	make_argv(argv, out, extra);
	char log[400];
	snprintf(log, sizeof log, "%s/%s.json", tmp, out);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int nul = open("/dev/null", O_WRONLY);
		dup2(fd, 1);
		dup2(nul, 2);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* Runs bertd-prepare to its end: the exit status, and the JSON summary
 * line in *summary (caller decrefs; may be NULL). */
static int run(const char *out, const char *const *extra, json_t **summary)
{
	pid_t pid = spawn(out, extra);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	char log[400];
	snprintf(log, sizeof log, "%s/%s.json", tmp, out);
	*summary = json_load_file(log, JSON_DISABLE_EOF_CHECK, NULL);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Shards resume.json of out's work directory lists (-1: none readable). */
static int journaled(const char *out)
{
	char p[400];
	snprintf(p, sizeof p, "%s/.%s.partial/resume.json", tmp, out);
	json_t *j = json_load_file(p, 0, NULL);
	int n = j ? (int)json_array_size(json_object_get(j, "shards")) : -1;
	json_decref(j);
	return n;
}

/* Lets pid run a few ms at a time until resume.json lists at least want
 * shards (want 0: any moment after its first slice), then leaves it
 * stopped (stop) or kills it with SIGKILL. Fails the test if it ends
 * first. Returns the shards listed then. */
static int throttle(pid_t pid, const char *out, int want, bool stop)
{
	int st;
	assert_int_equal(kill(pid, SIGSTOP), 0);
	assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
	for (int slice = 0;; slice++) {
		if (!WIFSTOPPED(st))
			fail_msg("bertd-prepare ended (status %d) before %d shards were written", st, want);
		int n = journaled(out);
		if ((want == 0 && slice > 0) || (want > 0 && n >= want)) {
			if (!stop) {
				assert_int_equal(kill(pid, SIGKILL), 0);
				assert_int_equal(waitpid(pid, &st, 0), pid);
				assert_true(WIFSIGNALED(st));
			}
			return n;
		}
		assert_int_equal(kill(pid, SIGCONT), 0);
		usleep(3000);
		assert_int_equal(kill(pid, SIGSTOP), 0);
		assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
	}
}

static unsigned char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *b = malloc((size_t)len + 1);
	*n = fread(b, 1, (size_t)len, f);
	fclose(f);
	return b;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in dir, sorted (caller frees each and the array). */
static size_t names_of(const char *dir, char ***out)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	size_t n = 0, cap = 64;
	char **v = malloc(cap * sizeof *v);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (n == cap)
			v = realloc(v, (cap *= 2) * sizeof *v);
		v[n++] = strdup(e->d_name);
	}
	closedir(d);
	qsort(v, n, sizeof *v, cmp_name);
	*out = v;
	return n;
}

/* Every file of tmp/a and tmp/b: the same names, the same bytes. */
static void assert_same_tree(const char *a, const char *b)
{
	char da[400], db[400];
	snprintf(da, sizeof da, "%s/%s", tmp, a);
	snprintf(db, sizeof db, "%s/%s", tmp, b);
	char **na, **nb;
	size_t ca = names_of(da, &na), cb = names_of(db, &nb);
	if (ca != cb)
		fail_msg("%s has %zu files, %s %zu", a, ca, b, cb);
	assert_true(ca > 4);
	for (size_t i = 0; i < ca; i++) {
		assert_string_equal(na[i], nb[i]);
		char pa[800], pb[800];
		snprintf(pa, sizeof pa, "%s/%s", da, na[i]);
		snprintf(pb, sizeof pb, "%s/%s", db, nb[i]);
		size_t la, lb;
		unsigned char *ba = slurp(pa, &la), *bb = slurp(pb, &lb);
		assert_non_null(ba);
		assert_non_null(bb);
		if (la != lb || memcmp(ba, bb, la) != 0)
			fail_msg("%s differs between %s and %s", na[i], a, b);
		free(ba);
		free(bb);
		free(na[i]);
		free(nb[i]);
	}
	free(na);
	free(nb);
}

static json_int_t jint(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_integer(v))
		fail_msg("summary without integer %s", k);
	return json_integer_value(v);
}

/* An uninterrupted run's shard count. */
static int reference(const char *out, const char *const *extra)
{
	json_t *s;
	assert_int_equal(run(out, extra, &s), 0);
	int n = (int)jint(s, "shards");
	assert_int_equal(jint(s, "resumed_shards"), 0);
	json_decref(s);
	assert_true(n >= 8); /* several shards, so a kill lands between two */
	return n;
}

/* A trained vocab: killed before any shard (the vocab pass or just after:
 * started over or vocab kept), and killed a quarter in (vocab and shards
 * kept); each run again, with another thread count, gives the reference's
 * bytes. */
static void test_kill_trained(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		skip();
	const char *const ref_opts[] = {"--train-vocab", "1000", "-j", "2", NULL};
	const char *const again[] = {"--train-vocab", "1000", "-j", "1", NULL};
	int total = reference("ref-t", ref_opts);

	throttle(spawn("early", ref_opts), "early", 0, false);
	json_t *s;
	assert_int_equal(run("early", again, &s), 0);
	json_decref(s);
	assert_same_tree("ref-t", "early");

	int kept = throttle(spawn("out-t", ref_opts), "out-t", total / 4, false);
	assert_true(kept >= total / 4 && kept < total);
	assert_int_equal(run("out-t", again, &s), 0);
	assert_true(jint(s, "resumed_shards") >= kept);
	assert_true(json_is_true(json_object_get(s, "resumed_vocab")));
	json_decref(s);
	assert_same_tree("ref-t", "out-t");
	/* the work directory went with the rename */
	char p[400];
	snprintf(p, sizeof p, "%s/.out-t.partial", tmp);
	assert_int_equal(access(p, F_OK), -1);
}

/* A given vocab (unknown tokens counted across the resume point), killed
 * twice: at a third and at two thirds. */
static void test_kill_twice(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		skip();
	const char *const opts[] = {"--vocab", vocab, "-j", "2", NULL};
	int total = reference("ref-v", opts);
	int k1 = throttle(spawn("out-v", opts), "out-v", total / 3, false);
	int k2 = throttle(spawn("out-v", opts), "out-v", 2 * total / 3, false);
	assert_true(k2 > k1);
	json_t *s;
	assert_int_equal(run("out-v", opts, &s), 0);
	assert_true(jint(s, "resumed_shards") >= k2);
	json_decref(s);
	assert_same_tree("ref-v", "out-v");
}

/* A gzip'd corpus is decompressed as one stream cut into pieces of about
 * 1 MiB, all of one unit of work: a resume point inside the second or
 * third piece counts its events from the stream's start. Killed at a third
 * and at two thirds, the output is the uninterrupted run's. */
static void test_kill_compressed(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		skip();
	char gz[400], cmd[1000];
	snprintf(gz, sizeof gz, "%s.gz", corpus);
	snprintf(cmd, sizeof cmd, "gzip -c -n '%s' > '%s'", corpus, gz);
	if (system(cmd) != 0) {
		print_message("skipped: no gzip command to make the compressed corpus\n");
		skip();
	}
	input = gz;
	const char *const opts[] = {"--vocab", vocab, "-j", "2", NULL};
	int total = reference("ref-z", opts);
	int k1 = throttle(spawn("out-z", opts), "out-z", total / 3, false);
	int k2 = throttle(spawn("out-z", opts), "out-z", 2 * total / 3, false);
	assert_true(k2 > k1);
	json_t *s;
	assert_int_equal(run("out-z", opts, &s), 0);
	assert_true(jint(s, "resumed_shards") >= k2);
	json_decref(s);
	input = corpus;
	assert_same_tree("ref-z", "out-z");
}

/* What may not be resumed is started over: the corpus touched (another
 * mtime), a kept shard damaged, --fresh. The output is still the
 * reference's. */
static void test_not_resumed(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		skip();
	const char *const opts[] = {"--vocab", vocab, NULL};
	const char *const fresh[] = {"--vocab", vocab, "--fresh", NULL};
	int total = reference("ref-n", opts);
	json_t *s;
	char p[400];
	for (int k = 0; k < 3; k++) {
		throttle(spawn("out-n", opts), "out-n", total / 3, false);
		if (k == 0) {
			/* the same bytes, a newer mtime: the inputs may have changed */
			struct timeval tv[2];
			gettimeofday(&tv[0], NULL);
			tv[1] = tv[0];
			tv[1].tv_sec += 10;
			assert_int_equal(utimes(corpus, tv), 0);
		} else if (k == 1) {
			snprintf(p, sizeof p, "%s/.out-n.partial/shard-00001.bin", tmp);
			int fd = open(p, O_RDWR);
			assert_true(fd >= 0);
			unsigned char b;
			assert_int_equal(pread(fd, &b, 1, 10), 1);
			b ^= 0x01;
			assert_int_equal(pwrite(fd, &b, 1, 10), 1);
			close(fd);
		}
		assert_int_equal(run("out-n", k == 2 ? fresh : opts, &s), 0);
		assert_int_equal(jint(s, "resumed_shards"), 0);
		json_decref(s);
		assert_same_tree("ref-n", "out-n");
		snprintf(p, sizeof p, "%s/out-n", tmp);
		fs_remove_tree(p);
	}
}

/* A second run on an output another run is writing is refused (exit 7)
 * and leaves that run's work alone: it then finishes with the reference's
 * bytes. */
static void test_second_run_refused(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		skip();
	const char *const opts[] = {"--vocab", vocab, NULL};
	int total = reference("ref-l", opts);
	pid_t pid = spawn("out-l", opts);
	int kept = throttle(pid, "out-l", total / 4, true);
	json_t *s;
	assert_int_equal(run("out-l", opts, &s), 7);
	assert_non_null(strstr(json_string_value(json_object_get(s, "error")), "another bertd-prepare"));
	json_decref(s);
	assert_true(journaled("out-l") >= kept);
	assert_int_equal(kill(pid, SIGCONT), 0);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_same_tree("ref-l", "out-l");
}

/* Copies tmp/from to tmp/to (flat). */
static void copy_tree(const char *from, const char *to)
{
	char a[400], b[400];
	snprintf(a, sizeof a, "%s/%s", tmp, from);
	snprintf(b, sizeof b, "%s/%s", tmp, to);
	fs_remove_tree(b);
	assert_int_equal(mkdir(b, 0755), 0);
	char **n;
	size_t c = names_of(a, &n);
	for (size_t i = 0; i < c; i++) {
		char pa[800], pb[800];
		snprintf(pa, sizeof pa, "%s/%s", a, n[i]);
		snprintf(pb, sizeof pb, "%s/%s", b, n[i]);
		size_t len;
		unsigned char *d = slurp(pa, &len);
		FILE *f = fopen(pb, "wb");
		assert_int_equal(fwrite(d, 1, len, f), len);
		fclose(f);
		free(d);
		free(n[i]);
	}
	free(n);
}

/* One damage to a copy of a good dataset; verify must name file. */
static void expect_refused(const char *file, const char *cmd)
{
	copy_tree("ref-x", "bad");
	char dir[400], p[800];
	snprintf(dir, sizeof dir, "%s/bad", tmp);
	snprintf(p, sizeof p, "%s/%s", dir, file);
	if (!strcmp(cmd, "flip")) {
		int fd = open(p, O_RDWR);
		unsigned char b;
		assert_int_equal(pread(fd, &b, 1, 200), 1);
		b ^= 0x80;
		assert_int_equal(pwrite(fd, &b, 1, 200), 1);
		close(fd);
	} else if (!strcmp(cmd, "truncate")) {
		assert_int_equal(truncate(p, 100), 0);
	} else if (!strcmp(cmd, "remove")) {
		assert_int_equal(unlink(p), 0);
	} else if (!strcmp(cmd, "link")) {
		char q[900];
		snprintf(q, sizeof q, "%s/../ref-x/%s", dir, file);
		assert_int_equal(unlink(p), 0);
		assert_int_equal(symlink(q, p), 0);
	} else if (!strcmp(cmd, "garbage")) {
		FILE *f = fopen(p, "w");
		fputs("{\"format\": \"bertd-dataset\", ", f);
		fclose(f);
	}
	char got[320], why[512];
	bool sums;
	assert_true(shard_dataset_verify(dir, got, sizeof got, why, sizeof why, &sums) < 0);
	if (strcmp(got, file) != 0)
		fail_msg("%s %s: verify named \"%s\" (%s)", cmd, file, got, why);
	assert_true(why[0] != 0);
}

static void test_verify(void **state)
{
	(void)state;
	if (!getenv("BERTD_PREPARE_EXE"))
		skip();
	const char *const opts[] = {"--vocab", vocab, NULL};
	reference("ref-x", opts);
	char dir[400], got[320], why[512];
	bool sums = false;
	snprintf(dir, sizeof dir, "%s/ref-x", tmp);
	assert_int_equal(shard_dataset_verify(dir, got, sizeof got, why, sizeof why, &sums), 0);
	assert_true(sums);
	expect_refused("shard-00002.bin", "flip");
	expect_refused("shard-00003.idx", "flip");
	expect_refused("shard-00001.idx", "truncate");
	expect_refused("shard-00004.bin", "remove");
	expect_refused("shard-00000.bin", "link");
	expect_refused("vocab.txt", "flip");
	expect_refused("manifest.json", "garbage");
	expect_refused("manifest.json", "remove");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill_trained),
		cmocka_unit_test(test_kill_twice),
		cmocka_unit_test(test_kill_compressed),
		cmocka_unit_test(test_not_resumed),
		cmocka_unit_test(test_second_run_refused),
		cmocka_unit_test(test_verify),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
