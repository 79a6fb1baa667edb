/* Dataset preparation through the daemon (docs/api.md#datasets):
 *   - options: threads (default 1: bertd-prepare runs with --jobs 1),
 *     max_sentence_tokens and shard_tokens reach the manifest; bad values
 *     are 422s naming the field;
 *   - kill -9 of the daemon while bertd-prepare is midway: bertd-prepare
 *     outlives it and the next daemon adopts it (its log says so, naming
 *     the pid; no second bertd-prepare is started, nothing is resumed), the
 *     dataset ends ready, and every file of it (the manifest's shard
 *     digests included) equals, byte for byte, an uninterrupted
 *     bertd-prepare run's (SOURCE_DATE_EPOCH passes through pass_env so
 *     "created" is the same);
 *   - kill -9 of bertd-prepare alone: the daemon starts it again, it
 *     continues from the shards finished (stats.resumed_shards), the same
 *     bytes;
 *   - SIGQUIT (the exit that leaves jobs running) while bertd-prepare is
 *     midway: it finishes with no daemon, writing its exit record; the next
 *     daemon marks the dataset ready from it, the same bytes;
 *   - a bertd-prepare that speaks an unknown protocol version (built with
 *     CHAN_PROTO 99) outlives a kill -9 of its daemon: the next daemon
 *     refuses to adopt it (its log names both versions), kills it and
 *     prepares the dataset again from its finished shards, the same bytes;
 *   - a stop (SIGTERM) still stops bertd-prepare: gone with the daemon,
 *     nothing left to adopt; the next daemon prepares the dataset again,
 *     resuming from its finished shards;
 *   - a dataset prepared elsewhere is registered ({"prepared": dir}), is
 *     ready at once and a job trains on it; a tampered copy is a 422 naming
 *     the file; other keys beside "prepared" are 422s; a copy at
 *     datasets/<name> registers in place, and is refused under another
 *     name; DELETE removes the registration, never the directory.
 * bertd-prepare is throttled (SIGSTOP / SIGCONT) while the test waits for
 * its shards, so where the kill lands does not depend on machine speed.
 * Waiting is polling with a deadline, never timing. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240
#define SHARD_TOKENS "40000"

typedef it_fx fx;

static const char *const extra[] = {"--pass-env", "SOURCE_DATE_EPOCH", "--prepare-concurrency", "1", NULL};

static int setup(void **state)
{
	setenv("SOURCE_DATE_EPOCH", "1700000000", 1);
	it_daemon_opts o = {.cpu_slots = "1", .extra = extra};
	return it_setup(state, &o, 0);
}

/* data/corpus.txt: real text (it_make_corpus) repeated to ~3 MB (several
 * 1 MiB chunks, some tens of shards of SHARD_TOKENS), and data/vocab.txt,
 * bert-base-uncased's ($BERTD_TEST_DATA). */
static void make_inputs(fx *f)
{
	it_make_corpus(f->data, "one.txt", 5000);
	assert_int_equal(it_system("cd '%s' && for i in $(seq 64); do cat one.txt; done | head -c 3145728 > corpus.txt"
				   " && rm one.txt", f->data), 0);
	const char *td = getenv("BERTD_TEST_DATA");
	assert_non_null(td);
	assert_int_equal(it_system("cp '%s/bert-base-uncased-vocab.txt' '%s/vocab.txt'", td, f->data), 0);
}

static void post_expect(fx *f, const char *body, long status, const char *field, const char *detail_has)
{
	http_resp r;
	assert_int_equal(http_post_json(&f->d, "/v1/datasets", body, &r), 0);
	if (r.status != status)
		fail_msg("%s -> %ld (expected %ld): %s", body, r.status, status, r.body);
	if (field) {
		assert_string_equal(it_jstr(r.json, "field"), field);
		const char *detail = it_jstr(r.json, "detail");
		fprintf(stderr, "%ld %s: %s\n", status, field, detail);
		if (detail_has && !strstr(detail, detail_has))
			fail_msg("detail lacks \"%s\": %s", detail_has, detail);
	}
	http_resp_free(&r);
}

/* The one bertd-prepare writing dataset name (waits for it). */
static pid_t prepare_pid(fx *f, const char *name)
{
	char dir[400];
	snprintf(dir, sizeof dir, "%s/datasets/%s", f->data, name);
	pid_t pid;
	for (int i = 0; i < DEADLINE_S * 100; i++) {
		if (it_find_pids("bertd-prepare", dir, &pid, 1) == 1)
			return pid;
		it_pause_ms(10);
	}
	fail_msg("no bertd-prepare for %s within %d s", name, DEADLINE_S);
	return 0;
}

static int journaled(fx *f, const char *name)
{
	char p[400];
	snprintf(p, sizeof p, "%s/datasets/.%s.partial/resume.json", f->data, name);
	json_t *j = json_load_file(p, 0, NULL);
	int n = j ? (int)json_array_size(json_object_get(j, "shards")) : -1;
	json_decref(j);
	return n;
}

/* Whether pid is stopped (state T or t); false once gone. */
static bool is_stopped(pid_t pid)
{
	char st = it_proc_state(pid);
	return st == 'T' || st == 't';
}

/* Lets bertd-prepare (not our child) run a few ms at a time until its
 * resume.json lists want shards; leaves it stopped. */
static int throttle(fx *f, pid_t pid, const char *name, int want)
{
	for (;;) {
		assert_int_equal(kill(pid, SIGSTOP), 0);
		for (int i = 0; i < 5000 && !is_stopped(pid); i++)
			usleep(1000);
		assert_true(is_stopped(pid));
		int n = journaled(f, name);
		if (n >= want)
			return n;
		assert_int_equal(kill(pid, SIGCONT), 0);
		usleep(5000);
	}
}

/* How often text occurs in the daemon's log (appended across restarts). */
static int log_count(fx *f, const char *text)
{
	char p[200];
	snprintf(p, sizeof p, "%s/bertd.log", f->d.root);
	size_t len;
	char *log = it_slurp(p, &len);
	int n = 0;
	for (char *at = log; at && (at = strstr(at, text)); at += strlen(text))
		n++;
	free(log);
	return n;
}

/* Polls the daemon's log for text (it is written at the daemon's start,
 * before it answers; polled all the same). */
static void wait_log(fx *f, const char *text)
{
	for (int i = 0; i < DEADLINE_S * 10 && log_count(f, text) == 0; i++)
		it_pause_ms(100);
	if (log_count(f, text) == 0) {
		bertd_print_log(&f->d);
		fail_msg("the daemon's log never said \"%s\"", text);
	}
}

/* The manifest's shards (name, bin and idx digests) of dataset dir a and
 * dir b are the same, and there are some. */
static void assert_same_shards(const char *a, const char *b)
{
	char pa[600], pb[600];
	snprintf(pa, sizeof pa, "%s/manifest.json", a);
	snprintf(pb, sizeof pb, "%s/manifest.json", b);
	json_t *ma = json_load_file(pa, 0, NULL), *mb = json_load_file(pb, 0, NULL);
	assert_non_null(ma);
	assert_non_null(mb);
	json_t *sa = json_object_get(ma, "shards"), *sb = json_object_get(mb, "shards");
	assert_true(json_array_size(sa) > 0);
	assert_int_equal(json_array_size(sa), json_array_size(sb));
	for (size_t i = 0; i < json_array_size(sa); i++) {
		static const char *const keys[] = {"name", "bin_sha256", "idx_sha256"};
		for (int k = 0; k < 3; k++) {
			const char *x = json_string_value(json_object_get(json_array_get(sa, i), keys[k]));
			const char *y = json_string_value(json_object_get(json_array_get(sb, i), keys[k]));
			assert_non_null(x);
			assert_non_null(y);
			assert_string_equal(x, y);
		}
	}
	json_decref(ma);
	json_decref(mb);
}

/* What bertd-prepare alone makes of the same request, into tmp dir ref. */
static void reference(fx *f, const char *ref)
{
	char exe[600], src[600], voc[600], cdata[500];
	snprintf(exe, sizeof exe, "%s", getenv("BERTD_BIN"));
	*strrchr(exe, '/') = 0;
	assert_non_null(realpath(f->data, cdata));
	snprintf(src, sizeof src, "%s/corpus.txt", cdata);
	snprintf(voc, sizeof voc, "%s/vocab.txt", cdata);
	assert_int_equal(it_system("'%s/bertd-prepare' -o '%s' --vocab '%s' --shard-tokens " SHARD_TOKENS
				   " -j 2 -- '%s' >/dev/null 2>&1", exe, ref, voc, src), 0);
}

static json_t *wait_ready(fx *f, const char *name)
{
	char path[200];
	snprintf(path, sizeof path, "/v1/datasets/%s", name);
	json_t *ds = it_wait_state(&f->d, path, "ready|failed", DEADLINE_S);
	if (strcmp(it_jstr(ds, "state"), "ready") != 0) {
		bertd_print_log(&f->d);
		fail_msg("dataset %s: %s", name, json_dumps(ds, JSON_COMPACT));
	}
	return ds;
}

static void test_options(void **state)
{
	fx *f = *state;
	make_inputs(f);
	post_expect(f, "{\"name\":\"o1\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},\"threads\":0}",
		    422, "threads", "1..256");
	post_expect(f, "{\"name\":\"o1\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},\"threads\":\"2\"}",
		    422, "threads", NULL);
	post_expect(f, "{\"name\":\"o1\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},"
		       "\"max_sentence_tokens\":-1}", 422, "max_sentence_tokens", NULL);
	post_expect(f, "{\"name\":\"o1\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},"
		       "\"shard_tokens\":10}", 422, "shard_tokens", "1000..");
	/* the default: one thread */
	post_expect(f, "{\"name\":\"o1\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"}}", 201, NULL,
		    NULL);
	pid_t pid = prepare_pid(f, "o1");
	char p[64];
	snprintf(p, sizeof p, "/proc/%d/cmdline", (int)pid);
	FILE *fp = fopen(p, "r");
	char cmd[4096] = "";
	size_t n = fp ? fread(cmd, 1, sizeof cmd - 1, fp) : 0;
	if (fp)
		fclose(fp);
	bool one = false;
	for (size_t i = 0; i + 9 < n; i++)
		one |= memcmp(cmd + i, "--jobs\0" "1\0", 9) == 0;
	assert_true(one);
	json_t *ds = wait_ready(f, "o1");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(ds, "request"), "threads")), 1);
	json_decref(ds);
	/* given: into the manifest */
	post_expect(f, "{\"name\":\"o2\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},\"threads\":2,"
		       "\"max_sentence_tokens\":16,\"shard_tokens\":100000}", 201, NULL, NULL);
	ds = wait_ready(f, "o2");
	assert_true(json_integer_value(json_object_get(json_object_get(ds, "stats"), "shards")) > 2);
	json_decref(ds);
	snprintf(cmd, sizeof cmd, "%s/datasets/o2/manifest.json", f->data);
	json_t *m = json_load_file(cmd, 0, NULL);
	assert_non_null(m);
	assert_int_equal(json_integer_value(json_object_get(m, "max_sentence_tokens")), 16);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "source"), "shard_tokens")), 100000);
	json_decref(m);
}

/* kill -9 of the daemon: its bertd-prepare outlives it and the next
 * daemon adopts it, ready: the same bytes as bertd-prepare alone; then
 * kill -9 of bertd-prepare alone: the daemon starts it again, the same
 * bytes. */
static void test_kill_resume(void **state)
{
	fx *f = *state;
	make_inputs(f);
	char ref[500];
	snprintf(ref, sizeof ref, "%s/../ref", f->data);
	reference(f, ref);
	static const char *const victims[2] = {"daemon", "prepare"};
	for (int v = 0; v < 2; v++) {
		char name[32], body[400], said[200];
		snprintf(name, sizeof name, "kill-%s", victims[v]);
		snprintf(body, sizeof body,
			 "{\"name\":\"%s\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},"
			 "\"shard_tokens\":" SHARD_TOKENS "}", name);
		post_expect(f, body, 201, NULL, NULL);
		pid_t pid = prepare_pid(f, name);
		int kept = throttle(f, pid, name, 4);
		fprintf(stderr, "kill -9 of the %s with %d shards done\n", victims[v], kept);
		if (v == 0) {
			bertd_kill9(&f->d);
			assert_true(is_stopped(pid)); /* outlived the daemon (held by the throttle) */
			assert_int_equal(it_daemon_run(f, NULL), 0);
			snprintf(said, sizeof said, "adopted its running bertd-prepare (pid %d)", (int)pid);
			wait_log(f, said);
			assert_int_equal(kill(pid, SIGCONT), 0); /* it goes on, under the new daemon */
		} else {
			assert_int_equal(kill(pid, SIGKILL), 0);
		}
		json_t *ds = wait_ready(f, name);
		json_t *st = json_object_get(ds, "stats");
		long long resumed = json_integer_value(json_object_get(st, "resumed_shards"));
		if (v == 0) {
			/* the adopted process finished it: never started again */
			assert_int_equal(resumed, 0);
			snprintf(said, sizeof said, "(%s): preparing into", name);
			assert_int_equal(log_count(f, said), 1);
		} else if (resumed < kept) {
			fail_msg("%s: resumed_shards %lld < %d", name, resumed, kept);
		}
		json_decref(ds);
		char out[500];
		snprintf(out, sizeof out, "%s/datasets/%s", f->data, name);
		assert_same_shards(ref, out);
		assert_int_equal(it_system("diff -r '%s' '%s'", ref, out), 0);
		char p[500];
		snprintf(p, sizeof p, "%s/datasets/.%s.partial", f->data, name);
		assert_int_equal(access(p, F_OK), -1);
	}
	it_system("rm -rf '%s'", ref);
}

/* SIGQUIT: the daemon exits 5 leaving bertd-prepare running; it finishes
 * with no daemon (its exit record written), and the next daemon marks the
 * dataset ready from that record: the same bytes as bertd-prepare alone. */
static void test_done_without_daemon(void **state)
{
	fx *f = *state;
	make_inputs(f);
	char ref[500];
	snprintf(ref, sizeof ref, "%s/../ref", f->data);
	reference(f, ref);
	post_expect(f, "{\"name\":\"alone\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},"
		       "\"shard_tokens\":" SHARD_TOKENS "}", 201, NULL, NULL);
	json_t *ds = it_get_json(&f->d, "/v1/datasets/alone");
	char id[64], rec[400], said[200];
	snprintf(id, sizeof id, "%s", it_jstr(ds, "id"));
	json_decref(ds);
	pid_t pid = prepare_pid(f, "alone");
	throttle(f, pid, "alone", 2);
	assert_int_equal(kill(f->d.pid, SIGQUIT), 0);
	int wst;
	assert_int_equal(waitpid(f->d.pid, &wst, 0), f->d.pid);
	f->d.pid = 0;
	assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 5);
	assert_true(is_stopped(pid)); /* left running */
	assert_int_equal(kill(pid, SIGCONT), 0);
	for (int i = 0; i < DEADLINE_S * 100 && it_proc_state(pid) && it_proc_state(pid) != 'Z'; i++)
		it_pause_ms(10);
	char ps = it_proc_state(pid);
	assert_true(ps == 0 || ps == 'Z');
	snprintf(rec, sizeof rec, "%s/datasets/ch/%s.exit", f->d.state_dir, id);
	json_t *er = json_load_file(rec, 0, NULL);
	assert_non_null(er);
	assert_int_equal(json_integer_value(json_object_get(er, "code")), 0);
	assert_int_equal(json_integer_value(json_object_get(er, "pid")), pid);
	json_decref(er);

	assert_int_equal(it_daemon_run(f, NULL), 0);
	ds = wait_ready(f, "alone");
	snprintf(said, sizeof said, "its bertd-prepare (pid %d) ended meanwhile", (int)pid);
	wait_log(f, said);
	assert_int_equal(log_count(f, "(alone): preparing into"), 1); /* never started again */
	json_t *st = json_object_get(ds, "stats");
	assert_int_equal(json_integer_value(json_object_get(st, "resumed_shards")), 0);
	assert_true(json_integer_value(json_object_get(st, "tokens")) > 0);
	json_decref(ds);
	char out[500];
	snprintf(out, sizeof out, "%s/datasets/alone", f->data);
	assert_same_shards(ref, out);
	assert_int_equal(it_system("diff -r '%s' '%s'", ref, out), 0);
	assert_int_equal(access(rec, F_OK), -1); /* its records go with its end */
	it_system("rm -rf '%s'", ref);
}

static void test_stop_stops_prepare(void **state)
{
	fx *f = *state;
	make_inputs(f);
	post_expect(f, "{\"name\":\"stopped\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},"
		       "\"shard_tokens\":" SHARD_TOKENS "}", 201, NULL, NULL);
	json_t *ds = it_get_json(&f->d, "/v1/datasets/stopped");
	char id[64], rec[400];
	snprintf(id, sizeof id, "%s", it_jstr(ds, "id"));
	json_decref(ds);
	pid_t pid = prepare_pid(f, "stopped");
	int kept = throttle(f, pid, "stopped", 2);
	assert_int_equal(bertd_stop(&f->d), 0);
	char ps = it_proc_state(pid); /* stopped with the daemon, not left for the next one */
	assert_true(ps == 0 || ps == 'Z');
	snprintf(rec, sizeof rec, "%s/datasets/ch/%s.attempt.json", f->d.state_dir, id);
	assert_int_equal(access(rec, F_OK), -1);
	assert_int_equal(it_daemon_run(f, NULL), 0);
	ds = wait_ready(f, "stopped");
	assert_int_equal(log_count(f, "(stopped): preparing into"), 2);
	assert_true(json_integer_value(json_object_get(json_object_get(ds, "stats"), "resumed_shards")) >= kept);
	json_decref(ds);
}

/* A bertd-prepare that speaks another protocol version (bertd-prepare-proto99,
 * built with CHAN_PROTO 99) outlives a kill -9 of its daemon: the next
 * daemon, whose bertd-prepare is this tree's, refuses to adopt it when it
 * attaches (its log names both versions), kills it and prepares the dataset
 * again, resuming from the finished shards: the same bytes as bertd-prepare
 * alone. */
static void test_unknown_protocol_refused(void **state)
{
	fx *f = *state;
	const char *p99 = getenv("IT_PROTO_PREPARE");
	if (!p99)
		fail_msg("IT_PROTO_PREPARE is not set (tests/integration/meson.build)");
	make_inputs(f);
	char ref[500], bin[300], link[400], said[200];
	snprintf(ref, sizeof ref, "%s/../ref", f->data);
	reference(f, ref);
	snprintf(bin, sizeof bin, "%s/bin99", f->d.root);
	assert_int_equal(mkdir(bin, 0700), 0);
	snprintf(link, sizeof link, "%s/bertd-prepare", bin);
	assert_int_equal(symlink(p99, link), 0);
	assert_int_equal(bertd_stop(&f->d), 0);
	const char *const args99[] = {"--pass-env", "SOURCE_DATE_EPOCH", "--prepare-concurrency", "1", "--bin-dir", bin,
				      NULL};
	it_daemon_opts o = {.cpu_slots = "1", .extra = args99};
	assert_int_equal(it_daemon_run(f, &o), 0);

	post_expect(f, "{\"name\":\"proto99\",\"source\":\"corpus.txt\",\"vocab\":{\"file\":\"vocab.txt\"},"
		       "\"shard_tokens\":" SHARD_TOKENS "}", 201, NULL, NULL);
	pid_t pid = prepare_pid(f, "proto99");
	int kept = throttle(f, pid, "proto99", 2);
	bertd_kill9(&f->d);
	assert_true(is_stopped(pid)); /* outlived the daemon (held by the throttle) */
	o.extra = extra; /* this tree's bertd-prepare, beside bertd */
	assert_int_equal(it_daemon_run(f, &o), 0);
	snprintf(said, sizeof said, "adopted its running bertd-prepare (pid %d)", (int)pid);
	wait_log(f, said);
	/* it attaches, naming its version: let it run a slice at a time, held
	 * while the daemon reads that, so it cannot finish first */
	static const char refused[] = "bertd-prepare speaks protocol version 99; this bertd adopts versions 1 to 1: "
				      "not adopted, preparing it again";
	for (int slice = 0; log_count(f, refused) == 0 && is_stopped(pid); slice++) {
		assert_true(slice < DEADLINE_S * 5);
		assert_int_equal(kill(pid, SIGCONT), 0);
		usleep(5000);
		kill(pid, SIGSTOP); /* ESRCH: the daemon killed it */
		for (int i = 0; i < 1000 && it_proc_state(pid) && !is_stopped(pid); i++)
			usleep(1000);
		for (int i = 0; i < 20 && log_count(f, refused) == 0; i++)
			it_pause_ms(10);
	}
	wait_log(f, refused);
	json_t *ds = wait_ready(f, "proto99");
	char ps = it_proc_state(pid);
	assert_true(ps == 0 || ps == 'Z'); /* killed */
	assert_int_equal(log_count(f, "(proto99): preparing into"), 2); /* prepared again */
	long long resumed = json_integer_value(json_object_get(json_object_get(ds, "stats"), "resumed_shards"));
	fprintf(stderr, "proto99: adopted with %d shards done, refused; the next bertd-prepare resumed %lld\n", kept,
		resumed);
	if (resumed < kept)
		fail_msg("resumed_shards %lld < %d", resumed, kept);
	json_decref(ds);
	char out[500];
	snprintf(out, sizeof out, "%s/datasets/proto99", f->data);
	assert_same_shards(ref, out);
	assert_int_equal(it_system("diff -r '%s' '%s'", ref, out), 0);
	it_system("rm -rf '%s'", ref);
}

static void test_register(void **state)
{
	fx *f = *state;
	make_inputs(f);
	char dir[500];
	snprintf(dir, sizeof dir, "%s/elsewhere", f->data);
	reference(f, dir);
	post_expect(f, "{\"name\":\"reg\",\"prepared\":\"elsewhere\",\"vocab\":{\"file\":\"vocab.txt\"}}", 422, "vocab",
		    "prepared");
	post_expect(f, "{\"name\":\"reg\",\"prepared\":\"/etc\"}", 403, "prepared", NULL);
	post_expect(f, "{\"name\":\"reg\",\"prepared\":\"corpus.txt\"}", 422, "prepared", "not a directory");
	/* tampered: one byte of one shard */
	assert_int_equal(it_system("cp -r '%s' '%s/tampered' && printf 'X' | dd of='%s/tampered/shard-00001.bin' "
				   "bs=1 seek=100 conv=notrunc 2>/dev/null", dir, f->data, f->data), 0);
	post_expect(f, "{\"name\":\"bad\",\"prepared\":\"tampered\"}", 422, "prepared", "shard-00001.bin");
	assert_int_equal(it_system("rm '%s/tampered/vocab.txt'", f->data), 0);
	post_expect(f, "{\"name\":\"bad\",\"prepared\":\"tampered\"}", 422, "prepared", "vocab.txt");

	post_expect(f, "{\"name\":\"reg\",\"prepared\":\"elsewhere\"}", 201, NULL, NULL);
	json_t *ds = it_get_json(&f->d, "/v1/datasets/reg");
	assert_string_equal(it_jstr(ds, "state"), "ready");
	char mp[600];
	snprintf(mp, sizeof mp, "%s/manifest.json", dir);
	json_t *m = json_load_file(mp, 0, NULL);
	json_t *st = json_object_get(ds, "stats");
	assert_int_equal(json_integer_value(json_object_get(st, "tokens")),
			 json_integer_value(json_object_get(json_object_get(m, "totals"), "tokens")));
	assert_true(json_is_true(json_object_get(st, "digests_checked")));
	json_decref(m);
	json_decref(ds);
	post_expect(f, "{\"name\":\"reg\",\"prepared\":\"elsewhere\"}", 409, "name", NULL);

	/* a copy where bertd keeps datasets: registered in place under its own
	 * name, refused under another (it would dangle once that one goes) */
	assert_int_equal(it_system("mkdir -p '%s/datasets' && cp -r '%s' '%s/datasets/inplace'", f->data, dir, f->data),
			 0);
	post_expect(f, "{\"name\":\"alias\",\"prepared\":\"datasets/inplace\"}", 422, "prepared",
		    "another dataset");
	post_expect(f, "{\"name\":\"inplace\",\"prepared\":\"datasets/inplace\"}", 201, NULL, NULL);
	http_resp r;
	assert_int_equal(http_do(&f->d, "DELETE", "/v1/datasets/inplace", NULL, 0, NULL, 1, &r), 0);
	assert_int_equal(r.status, 204);
	http_resp_free(&r);

	/* a job trains on it */
	char *spec = it_job_spec("on-reg", "reg", "training_args.per_device_train_batch_size", "4",
				 "training_args.max_steps", "6", "training_args.logging_steps", "3",
				 "training_args.save_steps", "6", "training_args.dataloader_num_workers", "1", NULL);
	char *id = it_submit(&f->d, spec);
	free(spec);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_decref(job);
	free(id);

	/* DELETE: the registration goes, the directory stays */
	assert_int_equal(http_do(&f->d, "DELETE", "/v1/datasets/reg", NULL, 0, NULL, 1, &r), 0);
	assert_int_equal(r.status, 204);
	http_resp_free(&r);
	assert_int_equal(access(mp, F_OK), 0);
	char link[500];
	snprintf(link, sizeof link, "%s/datasets/reg", f->data);
	struct stat sb;
	assert_int_equal(lstat(link, &sb), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_options, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_kill_resume, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_done_without_daemon, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_stop_stops_prepare, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_unknown_protocol_refused, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_register, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
