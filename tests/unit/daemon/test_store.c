/* store: migrations, job rows and their state machine, events, idempotency
 * keys, datasets, metrics and checkpoints, against a real SQLite file in a
 * fresh temp directory per test. A second, raw sqlite3 connection inspects
 * or tampers with the file where the store's own API cannot show the effect. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/store.h"

typedef struct fixture {
	char dir[256];
	char path[300];
	store *s;
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof *f);
	if (!f)
		return -1;
	const char *tmp = getenv("TMPDIR");
	snprintf(f->dir, sizeof f->dir, "%s/bertd-store-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	snprintf(f->path, sizeof f->path, "%s/bertd.db", f->dir);
	if (store_open(&f->s, f->path) != 0) {
		rmdir(f->dir);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;
	char p[320];
	store_close(f->s);
	static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
	for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
		snprintf(p, sizeof p, "%s%s", f->path, suffix[i]);
		unlink(p);
	}
	rmdir(f->dir);
	free(f);
	return 0;
}

/* ---- raw access to the file, for what the API does not expose ---- */

static int64_t raw_int(const char *path, const char *sql, const char *arg)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	if (arg)
		sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	assert_true(rc == SQLITE_ROW || rc == SQLITE_DONE);
	int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

static void raw_exec(const char *path, const char *sql)
{
	sqlite3 *db = NULL;
	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	char *err = NULL;
	int rc = sqlite3_exec(db, sql, NULL, NULL, &err);
	if (rc != SQLITE_OK)
		fail_msg("raw_exec(%s): %s", sql, err ? err : "?");
	sqlite3_close(db);
}

/* ---- helpers ---- */

static int add_job(store *s, const char *id, int priority)
{
	store_job j = {.id = (char *)id, .name = (char *)"demo",
		       .spec_json = (char *)"{\"name\":\"demo\"}", .priority = priority};
	return store_job_insert(s, &j, NULL, NULL, NULL, NULL, NULL, NULL);
}

static void job_id(char out[32], int i)
{
	snprintf(out, 32, "job-%016x", (unsigned)i);
}

static size_t count_events(store *s, const char *id)
{
	store_event *ev;
	size_t n;
	assert_int_equal(store_job_events(s, id, &ev, &n), 0);
	store_events_free(ev, n);
	return n;
}

/* ---- state names ---- */

static void test_state_names(void **state)
{
	(void)state;
	for (int i = 0; i < JOB_STATE_COUNT; i++) {
		enum job_state js;
		assert_int_equal(job_state_parse(job_state_name((enum job_state)i), &js), 0);
		assert_int_equal(js, i);
	}
	enum job_state js;
	assert_int_equal(job_state_parse("Running", &js), -EINVAL);
	assert_int_equal(job_state_parse(NULL, &js), -EINVAL);
	assert_true(job_state_is_terminal(JOB_COMPLETED));
	assert_true(job_state_is_terminal(JOB_FAILED));
	assert_true(job_state_is_terminal(JOB_CANCELED));
	assert_false(job_state_is_terminal(JOB_STOPPING));
	assert_false(job_state_is_terminal(JOB_STATE_COUNT));
	for (int i = 0; i < DATASET_STATE_COUNT; i++) {
		enum dataset_state ds;
		assert_int_equal(dataset_state_parse(dataset_state_name((enum dataset_state)i), &ds), 0);
		assert_int_equal(ds, i);
	}
	enum dataset_state ds;
	assert_int_equal(dataset_state_parse("done", &ds), -EINVAL);
}

/* ---- schema ---- */

static void test_migrate_empty(void **state)
{
	fixture *f = *state;
	int latest = store_schema_latest();
	assert_true(latest >= 1);
	assert_int_equal(store_schema_version(f->s), latest);
	assert_int_equal(raw_int(f->path, "PRAGMA user_version", NULL), latest);
	static const char *const tables[] = {"jobs", "job_events", "idempotency_keys",
					     "datasets", "job_metrics", "job_checkpoints"};
	for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
		assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM sqlite_master "
					 "WHERE type = 'table' AND name = ?1", tables[i]), 1);
	/* WAL is a property of the file, so a second connection sees it. */
	sqlite3 *db;
	sqlite3_stmt *st;
	assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(st), SQLITE_ROW);
	assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
	sqlite3_finalize(st);
	sqlite3_close(db);
}

static void test_reopen_keeps_data(void **state)
{
	fixture *f = *state;
	assert_int_equal(add_job(f->s, "job-00000000000000aa", 7), 0);
	assert_int_equal(store_job_transition(f->s, "job-00000000000000aa", JOB_MASK(JOB_QUEUED),
					      JOB_STARTING, "scheduled", NULL), 0);
	store_close(f->s);
	f->s = NULL;
	assert_int_equal(store_open(&f->s, f->path), 0);
	assert_int_equal(store_schema_version(f->s), store_schema_latest());
	store_job j;
	assert_int_equal(store_job_get(f->s, "job-00000000000000aa", &j), 0);
	assert_int_equal(j.state, JOB_STARTING);
	assert_int_equal(j.priority, 7);
	assert_string_equal(j.spec_json, "{\"name\":\"demo\"}");
	store_job_free(&j);
	assert_int_equal(count_events(f->s, "job-00000000000000aa"), 2);
}

static void test_too_new_refused(void **state)
{
	fixture *f = *state;
	char sql[64];
	int latest = store_schema_latest();
	store_close(f->s);
	f->s = NULL;
	snprintf(sql, sizeof sql, "PRAGMA user_version = %d", latest + 1);
	raw_exec(f->path, sql);
	store *s = (store *)0x1;
	assert_int_equal(store_open(&s, f->path), -EPROTO);
	assert_null(s);
	assert_int_equal(raw_int(f->path, "PRAGMA user_version", NULL), latest + 1);
}

static void test_not_a_database(void **state)
{
	fixture *f = *state;
	char p[320];
	snprintf(p, sizeof p, "%s/garbage.db", f->dir);
	FILE *fp = fopen(p, "w");
	assert_non_null(fp);
	for (int i = 0; i < 256; i++)
		fputs("this is not an SQLite file\n", fp);
	fclose(fp);
	store *s = NULL;
	/* SQLITE_NOTADB: the damaged-file error, so bertd says how to recover */
	assert_int_equal(store_open(&s, p), STORE_E_DAMAGED);
	assert_null(s);
	unlink(p);
	snprintf(p, sizeof p, "%s/no/such/dir/x.db", f->dir);
	assert_int_equal(store_open(&s, p), -EIO);
}

/* Migrations through the same code path as schema.sql, with a test schema
 * that grows: each step in its own transaction, a failing step rolled back
 * and the file left at the previous version. */
static void test_migrate_forward(void **state)
{
	fixture *f = *state;
	char p[320], q0[340];
	snprintf(p, sizeof p, "%s/mig.db", f->dir);
	const char *v1 = "-- header comment\n\n-- migration 1\nCREATE TABLE t (a INTEGER);\n";
	const char *v3 = "-- header comment\n\n-- migration 1\nCREATE TABLE t (a INTEGER);\n"
			 "-- migration 2: add b\nALTER TABLE t ADD COLUMN b TEXT DEFAULT 'x';\n"
			 "-- migration 3\nCREATE TABLE u (c);";
	const char *v4 = "-- header comment\n\n-- migration 1\nCREATE TABLE t (a INTEGER);\n"
			 "-- migration 2: add b\nALTER TABLE t ADD COLUMN b TEXT DEFAULT 'x';\n"
			 "-- migration 3\nCREATE TABLE u (c);\n"
			 "-- migration 4\nCREATE TABLE v (d);\nINSERT INTO nope VALUES (1);\n";
	store *s = NULL;
	assert_int_equal(store_open_schema(&s, p, v1), 0);
	assert_int_equal(store_schema_version(s), 1);
	store_close(s);
	raw_exec(p, "INSERT INTO t (a) VALUES (42)");

	assert_int_equal(store_open_schema(&s, p, v3), 0);
	assert_int_equal(store_schema_version(s), 3);
	store_close(s);
	assert_int_equal(raw_int(p, "SELECT COUNT(*) FROM t WHERE a = 42 AND b = 'x'", NULL), 1);
	assert_int_equal(raw_int(p, "SELECT COUNT(*) FROM sqlite_master WHERE name = 'u'", NULL), 1);

	s = NULL;
	assert_int_equal(store_open_schema(&s, p, v4), -EIO);
	assert_null(s);
	assert_int_equal(raw_int(p, "PRAGMA user_version", NULL), 3);
	assert_int_equal(raw_int(p, "SELECT COUNT(*) FROM sqlite_master WHERE name = 'v'", NULL), 0);

	/* v3 again: nothing to do, still 3. */
	assert_int_equal(store_open_schema(&s, p, v3), 0);
	assert_int_equal(store_schema_version(s), 3);
	store_close(s);
	/* v1 against a version-3 file: too new. */
	assert_int_equal(store_open_schema(&s, p, v1), -EPROTO);

	/* Malformed schemas are refused before touching the file. */
	assert_int_equal(store_open_schema(&s, p, "-- migration 1\nSELECT 1;\n-- migration 3\n"),
			 -EINVAL);
	assert_int_equal(store_open_schema(&s, p, "CREATE TABLE w (a);\n-- migration 1\n"), -EINVAL);
	assert_int_equal(store_open_schema(&s, p, "-- just a comment\n"), -EINVAL);
	assert_int_equal(store_open_schema(&s, p, "-- migration x\nSELECT 1;\n"), -EINVAL);
	assert_int_equal(raw_int(p, "PRAGMA user_version", NULL), 3);
	/* A marker with a number out of sequence is refused even where it could
	 * pass for a comment inside the migration before it, and on a new file. */
	char p0[330];
	snprintf(p0, sizeof p0, "%s/mig0.db", f->dir);
	assert_int_equal(store_open_schema(&s, p0, "-- migration 1\nCREATE TABLE w (a);\n"
						   "-- migration 0\nCREATE TABLE x (b);\n"), -EINVAL);
	assert_int_equal(store_open_schema(&s, p0, "-- migration 1\nCREATE TABLE w (a);\n"
						   "-- migration 2x\nCREATE TABLE x (b);\n"), -EINVAL);
	assert_null(s);
	/* "-- migration N" may carry a title after a colon or a space. */
	assert_int_equal(store_open_schema(&s, p0, "-- migration 1\nCREATE TABLE w (a);\n"
						   "-- migration 2 x\nCREATE TABLE x (b);\n"
						   "-- migration 3:y\nCREATE TABLE y (c);\r\n"
						   "-- migration 4\r\nCREATE TABLE z (d);\n"), 0);
	assert_int_equal(store_schema_version(s), 4);
	store_close(s);
	static const char *const sfx[] = {"", "-wal", "-shm"};
	for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
		snprintf(q0, sizeof q0, "%s%s", p0, sfx[i]);
		unlink(q0);
	}
	char q[330];
	snprintf(q, sizeof q, "%s-wal", p);
	unlink(q);
	snprintf(q, sizeof q, "%s-shm", p);
	unlink(q);
	unlink(p);
}

/* A write that returned 0 is in the file even if the process dies by
 * SIGKILL right after, with no store_close: the next open recovers it from
 * the WAL. (Power loss is synchronous=FULL's job and is not simulated.) */
static void test_survives_kill(void **state)
{
	fixture *f = *state;
	char p[320];
	snprintf(p, sizeof p, "%s/killed.db", f->dir);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) { /* the child opens its own connection, never the parent's */
		store *cs = NULL;
		if (store_open(&cs, p) != 0 || add_job(cs, "job-00000000000000k1", 3) != 0 ||
		    store_job_transition(cs, "job-00000000000000k1", JOB_MASK(JOB_QUEUED),
					 JOB_RUNNING, "go", NULL) != 0)
			_exit(1);
		raise(SIGKILL);
		_exit(2);
	}
	int wst;
	assert_int_equal(waitpid(pid, &wst, 0), pid);
	assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
	store *s = NULL;
	assert_int_equal(store_open(&s, p), 0);
	store_job j;
	assert_int_equal(store_job_get(s, "job-00000000000000k1", &j), 0);
	assert_int_equal(j.state, JOB_RUNNING);
	assert_int_equal(j.priority, 3);
	store_job_free(&j);
	assert_int_equal(count_events(s, "job-00000000000000k1"), 2);
	store_close(s);
	static const char *const suffix[] = {"", "-wal", "-shm"};
	for (size_t i = 0; i < 3; i++) {
		char q[330];
		snprintf(q, sizeof q, "%s%s", p, suffix[i]);
		unlink(q);
	}
}

/* ---- jobs ---- */

static void test_insert_get(void **state)
{
	fixture *f = *state;
	store_job j;
	assert_int_equal(add_job(f->s, "job-0000000000000001", 5), 0);
	assert_int_equal(store_job_get(f->s, "job-0000000000000001", &j), 0);
	assert_string_equal(j.id, "job-0000000000000001");
	assert_string_equal(j.name, "demo");
	assert_string_equal(j.spec_json, "{\"name\":\"demo\"}");
	assert_int_equal(j.state, JOB_QUEUED);
	assert_int_equal(j.priority, 5);
	assert_int_equal(j.restart_count, 0);
	assert_null(j.failure_reason);
	assert_true(j.created_ms > 1600000000000LL);
	assert_int_equal(j.updated_ms, j.created_ms);
	assert_int_equal(j.started_ms, 0);
	assert_int_equal(j.finished_ms, 0);
	assert_true(j.seq > 0);
	int64_t seq1 = j.seq;
	store_job_free(&j);

	assert_int_equal(add_job(f->s, "job-0000000000000002", -1), 0);
	assert_int_equal(store_job_get(f->s, "job-0000000000000002", &j), 0);
	assert_true(j.seq > seq1);
	assert_int_equal(j.priority, -1);
	store_job_free(&j);

	/* A taken id: -EEXIST with no idempotency data, nothing written. */
	char *ph = (char *)"x", *pr = (char *)"x", *pj = (char *)"x";
	store_job dup = {.id = (char *)"job-0000000000000001", .name = (char *)"other",
			 .spec_json = (char *)"{}"};
	assert_int_equal(store_job_insert(f->s, &dup, NULL, NULL, NULL, &ph, &pr, &pj), -EEXIST);
	assert_null(ph);
	assert_null(pr);
	assert_null(pj);
	assert_int_equal(store_job_get(f->s, "job-0000000000000001", &j), 0);
	assert_string_equal(j.name, "demo");
	store_job_free(&j);
	assert_int_equal(count_events(f->s, "job-0000000000000001"), 1);

	store_job bad = {.id = (char *)"job-3", .name = NULL, .spec_json = (char *)"{}"};
	assert_int_equal(store_job_insert(f->s, &bad, NULL, NULL, NULL, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(store_job_get(f->s, "job-nope", &j), -ENOENT);
	assert_null(j.id);

	/* devices of the current run (migration 2) */
	assert_int_equal(store_job_get(f->s, "job-0000000000000001", &j), 0);
	assert_null(j.devices_json);
	store_job_free(&j);
	assert_int_equal(store_job_set_devices(f->s, "job-0000000000000001", "[{\"kind\":\"cpu\"}]"), 0);
	assert_int_equal(store_job_get(f->s, "job-0000000000000001", &j), 0);
	assert_string_equal(j.devices_json, "[{\"kind\":\"cpu\"}]");
	store_job_free(&j);
	assert_int_equal(store_job_set_devices(f->s, "job-nope", "[]"), -ENOENT);

	/* the stall watch's suspect (migration 4): set, read back, cleared */
	assert_int_equal(store_job_get(f->s, "job-0000000000000001", &j), 0);
	assert_null(j.stall_json);
	int64_t updated = j.updated_ms;
	store_job_free(&j);
	assert_int_equal(store_job_set_stall(f->s, "job-0000000000000001", "{\"rank\":1}"), 0);
	assert_int_equal(store_job_get(f->s, "job-0000000000000001", &j), 0);
	assert_string_equal(j.stall_json, "{\"rank\":1}");
	assert_true(j.updated_ms == updated); /* an observation, not a change of the job */
	store_job_free(&j);
	assert_int_equal(store_job_set_stall(f->s, "job-0000000000000001", NULL), 0);
	assert_int_equal(store_job_get(f->s, "job-0000000000000001", &j), 0);
	assert_null(j.stall_json);
	store_job_free(&j);
	assert_int_equal(store_job_set_stall(f->s, "job-nope", NULL), -ENOENT);
	assert_int_equal(store_job_set_stall(f->s, NULL, NULL), -EINVAL);
}

static void test_list_paging(void **state)
{
	fixture *f = *state;
	char id[32];
	for (int i = 0; i < 25; i++) {
		job_id(id, i);
		assert_int_equal(add_job(f->s, id, 0), 0);
	}
	/* Every third job moves to running. */
	for (int i = 0; i < 25; i += 3) {
		job_id(id, i);
		assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_RUNNING,
						      "go", NULL), 0);
	}

	store_job *jobs;
	size_t n;
	int64_t cursor = 0, next, last_seq = 0;
	size_t pages[3] = {10, 10, 5};
	int seen = 0;
	for (int page = 0; page < 3; page++) {
		assert_int_equal(store_job_list(f->s, 0, cursor, 10, &jobs, &n, &next), 0);
		assert_int_equal(n, pages[page]);
		for (size_t k = 0; k < n; k++, seen++) {
			job_id(id, seen);
			assert_string_equal(jobs[k].id, id);
			assert_true(jobs[k].seq > last_seq);
			last_seq = jobs[k].seq;
			assert_int_equal(jobs[k].state, seen % 3 == 0 ? JOB_RUNNING : JOB_QUEUED);
		}
		if (page < 2)
			assert_int_equal(next, jobs[n - 1].seq);
		else
			assert_int_equal(next, 0);
		store_jobs_free(jobs, n);
		cursor = next;
	}
	assert_int_equal(seen, 25);

	/* Exactly as many rows as the limit: no next page. */
	assert_int_equal(store_job_list(f->s, 0, 0, 25, &jobs, &n, &next), 0);
	assert_int_equal(n, 25);
	assert_int_equal(next, 0);
	store_jobs_free(jobs, n);

	/* Mask: the 9 running jobs (0, 3, ..., 24), paged by 4. */
	cursor = 0;
	seen = 0;
	size_t rpages[3] = {4, 4, 1};
	for (int page = 0; page < 3; page++) {
		assert_int_equal(store_job_list(f->s, JOB_MASK(JOB_RUNNING), cursor, 4, &jobs, &n,
						&next), 0);
		assert_int_equal(n, rpages[page]);
		for (size_t k = 0; k < n; k++, seen++) {
			job_id(id, seen * 3);
			assert_string_equal(jobs[k].id, id);
			assert_int_equal(jobs[k].state, JOB_RUNNING);
		}
		assert_true(page < 2 ? next != 0 : next == 0);
		store_jobs_free(jobs, n);
		cursor = next;
	}
	assert_int_equal(seen, 9);

	assert_int_equal(store_job_list(f->s, JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_RUNNING), 0, 100,
					&jobs, &n, &next), 0);
	assert_int_equal(n, 25);
	store_jobs_free(jobs, n);
	assert_int_equal(store_job_list(f->s, JOB_MASK_TERMINAL, 0, 100, &jobs, &n, &next), 0);
	assert_int_equal(n, 0);
	assert_int_equal(next, 0);
	store_jobs_free(jobs, n);

	int64_t counts[JOB_STATE_COUNT];
	assert_int_equal(store_job_counts(f->s, counts), 0);
	assert_int_equal(counts[JOB_RUNNING], 9);
	assert_int_equal(counts[JOB_QUEUED], 16);
	assert_int_equal(counts[JOB_COMPLETED], 0);

	assert_int_equal(store_job_list(f->s, 0, 0, 0, &jobs, &n, &next), -EINVAL);
	assert_int_equal(store_job_list(f->s, 1u << JOB_STATE_COUNT, 0, 5, &jobs, &n, &next), -EINVAL);
}

static void test_transition_cas(void **state)
{
	fixture *f = *state;
	const char *id = "job-00000000000000c1";
	enum job_state cur = JOB_STATE_COUNT;
	store_job j;
	assert_int_equal(add_job(f->s, id, 0), 0);

	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_STARTING,
					      "scheduled", &cur), 0);
	assert_int_equal(cur, JOB_QUEUED);
	/* The same CAS again loses: the job is no longer queued. */
	cur = JOB_STATE_COUNT;
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_CANCELED,
					      "cancel", &cur), -EBUSY);
	assert_int_equal(cur, JOB_STARTING);
	assert_int_equal(store_job_get(f->s, id, &j), 0);
	assert_int_equal(j.state, JOB_STARTING);
	assert_int_equal(j.started_ms, 0);
	store_job_free(&j);
	assert_int_equal(count_events(f->s, id), 2);

	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_STARTING), JOB_RUNNING,
					      "workers up", NULL), 0);
	assert_int_equal(store_job_get(f->s, id, &j), 0);
	assert_true(j.started_ms > 0);
	assert_int_equal(j.finished_ms, 0);
	store_job_free(&j);
	/* started_ms marks the first run: force a recognisable value, then
	 * restart and run again; it must survive. */
	raw_exec(f->path, "UPDATE jobs SET started_ms = 1 WHERE id = 'job-00000000000000c1'");
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_RUNNING), JOB_RESTARTING,
					      "worker 0 died", NULL), 0);
	int count = 0;
	assert_int_equal(store_job_bump_restarts(f->s, id, &count), 0);
	assert_int_equal(count, 1);
	assert_int_equal(store_job_bump_restarts(f->s, id, &count), 0);
	assert_int_equal(count, 2);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_RESTARTING), JOB_RUNNING,
					      "resumed", NULL), 0);
	assert_int_equal(store_job_get(f->s, id, &j), 0);
	assert_int_equal(j.started_ms, 1);
	assert_int_equal(j.restart_count, 2);
	assert_null(j.failure_reason);
	store_job_free(&j);

	assert_int_equal(store_job_transition(f->s, id, JOB_MASK_ACTIVE, JOB_FAILED,
					      "CUDA out of memory", &cur), 0);
	assert_int_equal(cur, JOB_RUNNING);
	assert_int_equal(store_job_get(f->s, id, &j), 0);
	assert_int_equal(j.state, JOB_FAILED);
	assert_string_equal(j.failure_reason, "CUDA out of memory");
	assert_true(j.finished_ms > 0);
	assert_true(j.updated_ms >= j.created_ms);
	store_job_free(&j);

	/* A reason given for a non-failed outcome is an event reason only. */
	const char *id2 = "job-00000000000000c2";
	assert_int_equal(add_job(f->s, id2, 0), 0);
	assert_int_equal(store_job_transition(f->s, id2, JOB_MASK(JOB_QUEUED), JOB_CANCELED,
					      "user asked", NULL), 0);
	assert_int_equal(store_job_get(f->s, id2, &j), 0);
	assert_int_equal(j.state, JOB_CANCELED);
	assert_null(j.failure_reason);
	assert_true(j.finished_ms > 0);
	assert_int_equal(j.started_ms, 0);
	store_job_free(&j);

	/* Terminal states accept nothing from a mask that excludes them. */
	assert_int_equal(store_job_transition(f->s, id2, JOB_MASK_ACTIVE | JOB_MASK(JOB_QUEUED),
					      JOB_RUNNING, "x", &cur), -EBUSY);
	assert_int_equal(cur, JOB_CANCELED);

	cur = JOB_STATE_COUNT;
	assert_int_equal(store_job_transition(f->s, "job-nope", ~0u, JOB_RUNNING, "x", &cur), -ENOENT);
	assert_int_equal(cur, JOB_STATE_COUNT);
	assert_int_equal(store_job_transition(f->s, id, ~0u, JOB_STATE_COUNT, "x", NULL), -EINVAL);
}

static void test_events_in_order(void **state)
{
	fixture *f = *state;
	const char *id = "job-00000000000000e1";
	assert_int_equal(add_job(f->s, id, 0), 0);
	struct { enum job_state to; const char *reason; } steps[] = {
		{JOB_STARTING, "scheduled on 2 devices"},
		{JOB_RUNNING, "workers up"},
		{JOB_STOPPING, "cancel requested"},
		{JOB_CANCELED, "checkpoint written"},
	};
	enum job_state prev = JOB_QUEUED;
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(store_job_transition(f->s, id, JOB_MASK(prev), steps[i].to,
						      steps[i].reason, NULL), 0);
		if (i == 1)
			assert_int_equal(store_job_note(f->s, id, "restart budget 3"), 0);
		prev = steps[i].to;
	}
	store_event *ev;
	size_t n;
	assert_int_equal(store_job_events(f->s, id, &ev, &n), 0);
	assert_int_equal(n, 6);
	assert_int_equal(ev[0].from, JOB_QUEUED);
	assert_int_equal(ev[0].to, JOB_QUEUED);
	assert_string_equal(ev[0].reason, "submitted");
	assert_int_equal(ev[1].from, JOB_QUEUED);
	assert_int_equal(ev[1].to, JOB_STARTING);
	assert_string_equal(ev[1].reason, "scheduled on 2 devices");
	assert_int_equal(ev[2].from, JOB_STARTING);
	assert_int_equal(ev[2].to, JOB_RUNNING);
	assert_string_equal(ev[2].reason, "workers up");
	assert_int_equal(ev[3].from, JOB_RUNNING); /* the note: no transition */
	assert_int_equal(ev[3].to, JOB_RUNNING);
	assert_string_equal(ev[3].reason, "restart budget 3");
	assert_int_equal(ev[4].from, JOB_RUNNING);
	assert_int_equal(ev[4].to, JOB_STOPPING);
	assert_string_equal(ev[4].reason, "cancel requested");
	assert_int_equal(ev[5].from, JOB_STOPPING);
	assert_int_equal(ev[5].to, JOB_CANCELED);
	assert_string_equal(ev[5].reason, "checkpoint written");
	for (size_t i = 1; i < n; i++)
		assert_true(ev[i].time_ms >= ev[i - 1].time_ms);
	store_events_free(ev, n);

	/* A NULL reason is stored as NULL. */
	assert_int_equal(store_job_note(f->s, id, NULL), 0);
	assert_int_equal(store_job_events(f->s, id, &ev, &n), 0);
	assert_int_equal(n, 7);
	assert_null(ev[6].reason);
	assert_int_equal(ev[6].to, JOB_CANCELED);
	store_events_free(ev, n);
}

/* Preemption holds (put replaces, drop, read back by another handle, gone
 * with their job) and who asked for a stop (store_job_stop_request). */
static void test_preempt_holds_stop_by(void **state)
{
	fixture *f = *state;
	const char *v = "job-00000000000000e1", *w = "job-00000000000000e2";
	assert_int_equal(add_job(f->s, v, 0), 0);
	assert_int_equal(add_job(f->s, w, 0), 0);
	assert_int_equal(store_preempt_hold_put(f->s, "job-00000000000000ff", "job-00000000000000aa"), -ENOENT);
	assert_int_equal(store_preempt_hold_put(f->s, v, "job-00000000000000aa"), 0);
	assert_int_equal(store_preempt_hold_put(f->s, v, "job-00000000000000bb"), 0); /* replaces */
	assert_int_equal(store_preempt_hold_put(f->s, w, "job-00000000000000bb"), 0);
	store_close(f->s);
	assert_int_equal(store_open(&f->s, f->path), 0);
	store_preempt_hold *h = NULL;
	size_t n = 0;
	assert_int_equal(store_preempt_holds(f->s, &h, &n), 0);
	assert_int_equal(n, 2);
	for (size_t i = 0; i < n; i++)
		assert_string_equal(h[i].by, "job-00000000000000bb");
	assert_true((!strcmp(h[0].victim, v) && !strcmp(h[1].victim, w)) ||
		    (!strcmp(h[0].victim, w) && !strcmp(h[1].victim, v)));
	store_preempt_holds_free(h, n);
	assert_int_equal(store_preempt_hold_drop(f->s, v), 0);
	assert_int_equal(store_preempt_hold_drop(f->s, v), 0); /* none: a no-op */
	assert_int_equal(store_job_transition(f->s, w, JOB_MASK(JOB_QUEUED), JOB_CANCELED, "x", NULL), 0);
	assert_int_equal(store_job_delete(f->s, w), 0); /* its hold goes with it */
	assert_int_equal(store_preempt_holds(f->s, &h, &n), 0);
	assert_int_equal(n, 0);
	store_preempt_holds_free(h, n);

	char *by = (char *)"unset";
	assert_int_equal(store_job_stop_by(f->s, v, &by), 0);
	assert_null(by);
	enum job_state cur;
	assert_int_equal(store_job_stop_request(f->s, v, JOB_MASK(JOB_RUNNING), "alice", "cancel requested by alice",
						&cur), -EBUSY);
	assert_int_equal(cur, JOB_QUEUED);
	assert_int_equal(store_job_stop_by(f->s, v, &by), 0);
	assert_null(by); /* refused: nothing written */
	assert_int_equal(store_job_transition(f->s, v, JOB_MASK(JOB_QUEUED), JOB_RUNNING, "go", NULL), 0);
	assert_int_equal(store_job_stop_request(f->s, v, JOB_MASK(JOB_RUNNING), "alice", "cancel requested by alice",
						&cur), 0);
	assert_int_equal(cur, JOB_RUNNING);
	assert_int_equal(store_job_stop_by(f->s, v, &by), 0);
	assert_string_equal(by, "alice");
	free(by);
	store_job j;
	assert_int_equal(store_job_get(f->s, v, &j), 0);
	assert_int_equal(j.state, JOB_STOPPING);
	store_job_free(&j);
	assert_int_equal(store_job_stop_by(f->s, "job-00000000000000ff", &by), -ENOENT);
}

static void test_delete_terminal_only(void **state)
{
	fixture *f = *state;
	const char *id = "job-00000000000000d1";
	store_job j;
	assert_int_equal(add_job(f->s, id, 0), 0);
	assert_int_equal(store_job_delete(f->s, id), -EBUSY);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_RUNNING, "go",
					      NULL), 0);
	assert_int_equal(store_job_delete(f->s, id), -EBUSY);
	assert_int_equal(store_job_get(f->s, id, &j), 0);
	store_job_free(&j);
	assert_int_equal(store_metric_insert(f->s, id, 1, 1000, "{\"loss\":9.5}"), 0);
	store_checkpoint c = {.step = 1, .path = (char *)"/var/lib/bertd/ckpt-1", .bytes = 10};
	assert_int_equal(store_checkpoint_insert(f->s, id, &c), 0);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_RUNNING), JOB_COMPLETED,
					      "max_steps reached", NULL), 0);
	/* A neighbour whose rows must survive. */
	assert_int_equal(add_job(f->s, "job-00000000000000d2", 0), 0);

	assert_int_equal(store_job_delete(f->s, id), 0);
	assert_int_equal(store_job_get(f->s, id, &j), -ENOENT);
	store_event *ev;
	size_t n;
	assert_int_equal(store_job_events(f->s, id, &ev, &n), -ENOENT);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_events WHERE job_id = ?1", id), 0);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_metrics WHERE job_id = ?1", id), 0);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_checkpoints WHERE job_id = ?1", id),
			 0);
	assert_int_equal(count_events(f->s, "job-00000000000000d2"), 1);
	assert_int_equal(store_job_delete(f->s, id), -ENOENT);
}

static void test_idempotency(void **state)
{
	fixture *f = *state;
	store_job a = {.id = (char *)"job-00000000000000a1", .name = (char *)"a",
		       .spec_json = (char *)"{\"a\":1}"};
	store_job b = {.id = (char *)"job-00000000000000b1", .name = (char *)"b",
		       .spec_json = (char *)"{\"b\":1}"};
	char *ph = NULL, *pr = NULL, *pj = NULL;
	assert_int_equal(store_job_insert(f->s, &a, "key-1", "hash-a", "{\"id\":\"a1\"}",
					  &ph, &pr, &pj), 0);
	assert_null(ph);
	/* Same key, different request: refused with the first answer. */
	assert_int_equal(store_job_insert(f->s, &b, "key-1", "hash-b", "{\"id\":\"b1\"}",
					  &ph, &pr, &pj), -EEXIST);
	assert_string_equal(ph, "hash-a");
	assert_string_equal(pr, "{\"id\":\"a1\"}");
	assert_string_equal(pj, "job-00000000000000a1");
	free(ph);
	free(pr);
	free(pj);
	/* And nothing of b was written. */
	store_job j;
	assert_int_equal(store_job_get(f->s, "job-00000000000000b1", &j), -ENOENT);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM jobs", NULL), 1);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_events", NULL), 1);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM idempotency_keys", NULL), 1);
	/* Without out-pointers it still refuses. */
	assert_int_equal(store_job_insert(f->s, &b, "key-1", "hash-b", "{}", NULL, NULL, NULL),
			 -EEXIST);
	/* Another key is another request. */
	assert_int_equal(store_job_insert(f->s, &b, "key-2", "hash-b", "{}", NULL, NULL, NULL), 0);
	/* A key needs its hash and response. */
	store_job c = {.id = (char *)"job-00000000000000c1", .name = (char *)"c",
		       .spec_json = (char *)"{}"};
	assert_int_equal(store_job_insert(f->s, &c, "key-3", NULL, "{}", NULL, NULL, NULL), -EINVAL);

	/* The key replays even after its job is gone. */
	assert_int_equal(store_job_transition(f->s, "job-00000000000000a1", JOB_MASK(JOB_QUEUED),
					      JOB_CANCELED, NULL, NULL), 0);
	assert_int_equal(store_job_delete(f->s, "job-00000000000000a1"), 0);
	assert_int_equal(store_job_insert(f->s, &c, "key-1", "hash-a", "{}", NULL, NULL, &pj),
			 -EEXIST);
	assert_string_equal(pj, "job-00000000000000a1");
	free(pj);

	int64_t removed = -1;
	assert_int_equal(store_idem_prune(f->s, 0, &removed), 0);
	assert_int_equal(removed, 0);
	assert_int_equal(store_idem_prune(f->s, INT64_MAX, &removed), 0);
	assert_int_equal(removed, 2);
	assert_int_equal(store_job_insert(f->s, &c, "key-1", "hash-c", "{}", NULL, NULL, NULL), 0);
}

static void test_enoent(void **state)
{
	fixture *f = *state;
	const char *no = "job-ffffffffffffffff";
	int count;
	store_event *ev;
	store_metric *m;
	store_checkpoint *cl;
	store_checkpoint c = {.step = 1, .path = (char *)"/x"};
	store_dataset d;
	size_t n;
	assert_int_equal(store_job_bump_restarts(f->s, no, &count), -ENOENT);
	assert_int_equal(store_job_delete(f->s, no), -ENOENT);
	assert_int_equal(store_job_events(f->s, no, &ev, &n), -ENOENT);
	assert_int_equal(store_job_note(f->s, no, "x"), -ENOENT);
	assert_int_equal(store_metric_insert(f->s, no, 1, 1, "{}"), -ENOENT);
	assert_int_equal(store_metric_list(f->s, no, 0, 10, &m, &n), -ENOENT);
	assert_int_equal(store_checkpoint_insert(f->s, no, &c), -ENOENT);
	assert_int_equal(store_checkpoint_list(f->s, no, &cl, &n), -ENOENT);
	assert_int_equal(store_checkpoint_delete(f->s, no, 1), -ENOENT);
	assert_int_equal(store_dataset_get(f->s, "ds-none", &d), -ENOENT);
	assert_int_equal(store_dataset_get_by_name(f->s, "none", &d), -ENOENT);
	assert_int_equal(store_dataset_progress(f->s, "ds-none", 1, 2, NULL), -ENOENT);
	assert_int_equal(store_dataset_finish(f->s, "ds-none", DATASET_READY, NULL, NULL), -ENOENT);
	assert_int_equal(store_dataset_delete(f->s, "ds-none"), -ENOENT);
	/* None of the failed writes left anything behind. */
	assert_int_equal(raw_int(f->path, "SELECT (SELECT COUNT(*) FROM jobs) + "
				 "(SELECT COUNT(*) FROM job_events) + (SELECT COUNT(*) FROM job_metrics) + "
				 "(SELECT COUNT(*) FROM job_checkpoints) + (SELECT COUNT(*) FROM datasets)",
				 NULL), 0);
}

/* ---- concurrency ---- */

#define THREADS 4
#define PER_THREAD 25

typedef struct worker_arg {
	store *s;
	int t;
	int failures;
} worker_arg;

static void *insert_worker(void *p)
{
	worker_arg *a = p;
	char id[32];
	for (int i = 0; i < PER_THREAD; i++) {
		job_id(id, a->t * 1000 + i);
		store_job j;
		if (add_job(a->s, id, a->t) != 0 || store_job_get(a->s, id, &j) != 0) {
			a->failures++;
			continue;
		}
		if (j.priority != a->t)
			a->failures++;
		store_job_free(&j);
	}
	return NULL;
}

static void test_concurrent_inserts(void **state)
{
	fixture *f = *state;
	pthread_t th[THREADS];
	worker_arg args[THREADS];
	for (int t = 0; t < THREADS; t++) {
		args[t] = (worker_arg){.s = f->s, .t = t};
		assert_int_equal(pthread_create(&th[t], NULL, insert_worker, &args[t]), 0);
	}
	for (int t = 0; t < THREADS; t++) {
		pthread_join(th[t], NULL);
		assert_int_equal(args[t].failures, 0);
	}
	store_job *jobs;
	size_t n;
	int64_t next;
	assert_int_equal(store_job_list(f->s, 0, 0, 1000, &jobs, &n, &next), 0);
	assert_int_equal(n, THREADS * PER_THREAD);
	int seen[THREADS][PER_THREAD] = {{0}};
	for (size_t k = 0; k < n; k++) {
		if (k > 0)
			assert_true(jobs[k].seq > jobs[k - 1].seq);
		unsigned v;
		assert_int_equal(sscanf(jobs[k].id, "job-%x", &v), 1);
		int t = (int)v / 1000, i = (int)v % 1000;
		assert_true(t < THREADS && i < PER_THREAD);
		assert_int_equal(jobs[k].priority, t);
		seen[t][i]++;
	}
	store_jobs_free(jobs, n);
	for (int t = 0; t < THREADS; t++)
		for (int i = 0; i < PER_THREAD; i++)
			assert_int_equal(seen[t][i], 1);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_events", NULL), THREADS * PER_THREAD);
}

/* ---- group commit ---- */

static int present(store *s, const char *id)
{
	store_job j;
	int rc = store_job_get(s, id, &j);
	store_job_free(&j);
	return rc == 0;
}

/* One group is one transaction: a member whose insert fails (a trigger
 * aborts it, as a full disk or an I/O error would) fails every member, and
 * none of their rows is kept; a key used twice in one group is the first
 * member's job for the second (a replay), both committed together. */
static void test_group_commit(void **state)
{
	fixture *f = *state;
	store_job j[3] = {
		{.id = "job-00000000000000g1", .name = "a", .spec_json = "{}"},
		{.id = "job-00000000000000g2", .name = "poison", .spec_json = "{}"},
		{.id = "job-00000000000000g3", .name = "c", .spec_json = "{}"},
	};
	store_insert ins[3];
	for (int i = 0; i < 3; i++)
		ins[i] = (store_insert){.job = &j[i]};
	raw_exec(f->path, "CREATE TRIGGER poison BEFORE INSERT ON jobs WHEN NEW.name = 'poison' "
			  "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
	assert_int_equal(store_job_insert_group(f->s, ins, 3), -EIO);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(ins[i].rc, -EIO);
		assert_null(ins[i].prev_hash);
		assert_false(present(f->s, j[i].id));
	}
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_events", NULL), 0);

	/* without the poisoned member the same group commits */
	ins[0] = (store_insert){.job = &j[0]};
	ins[1] = (store_insert){.job = &j[2]};
	assert_int_equal(store_job_insert_group(f->s, ins, 2), 0);
	assert_int_equal(ins[0].rc, 0);
	assert_int_equal(ins[1].rc, 0);
	assert_true(present(f->s, j[0].id) && present(f->s, j[2].id));

	/* one key twice in a group: the second member replays the first */
	store_job k[2] = {
		{.id = "job-00000000000000k1", .name = "k", .spec_json = "{}"},
		{.id = "job-00000000000000k2", .name = "k", .spec_json = "{}"},
	};
	for (int i = 0; i < 2; i++)
		ins[i] = (store_insert){.job = &k[i], .idem_key = "key-g", .idem_hash = "h",
					.response_json = i ? "{\"second\":1}" : "{\"first\":1}"};
	assert_int_equal(store_job_insert_group(f->s, ins, 2), 0);
	assert_int_equal(ins[0].rc, 0);
	assert_int_equal(ins[1].rc, -EEXIST);
	assert_string_equal(ins[1].prev_job_id, k[0].id);
	assert_string_equal(ins[1].prev_response, "{\"first\":1}");
	assert_true(present(f->s, k[0].id));
	assert_false(present(f->s, k[1].id));
	free(ins[1].prev_hash);
	free(ins[1].prev_response);
	free(ins[1].prev_job_id);
}

typedef struct async_result {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
} async_result;

static void async_done(store_insert *ins, void *arg)
{
	(void)ins;
	async_result *a = arg;
	pthread_mutex_lock(&a->mu);
	a->done++;
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
}

/* store_job_insert_async: each insert's callback comes once, after the
 * commit, with its own result: all stored when nothing fails; with
 * poisoned members, each is acknowledged (0) exactly when it is stored, and
 * no poisoned one is (the others in its group fail with it). */
static void test_insert_async(void **state)
{
	fixture *f = *state;
	enum { N = 40 };
	store_job j[N];
	store_insert ins[N];
	char ids[N][32];
	async_result a = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	raw_exec(f->path, "CREATE TRIGGER poison BEFORE INSERT ON jobs WHEN NEW.name = 'poison' "
			  "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
	int ok = 0;
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < N; i++) {
			job_id(ids[i], 0x500 + round * N + i);
			bool poison = round == 1 && i % 7 == 3;
			j[i] = (store_job){.id = ids[i], .name = poison ? "poison" : "ok", .spec_json = "{}"};
			ins[i] = (store_insert){.job = &j[i], .rc = 1};
			assert_int_equal(store_job_insert_async(f->s, &ins[i], async_done, &a), 0);
		}
		pthread_mutex_lock(&a.mu);
		while (a.done < N * (round + 1))
			pthread_cond_wait(&a.cv, &a.mu);
		pthread_mutex_unlock(&a.mu);
		for (int i = 0; i < N; i++) {
			assert_true(ins[i].rc == 0 || (round == 1 && ins[i].rc == -EIO));
			assert_int_equal(ins[i].rc == 0, present(f->s, ids[i]));
			if (round == 1 && i % 7 == 3)
				assert_int_equal(ins[i].rc, -EIO);
			ok += ins[i].rc == 0;
		}
	}
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM jobs", NULL), ok);
	store_insert bad = {.job = NULL};
	assert_int_equal(store_job_insert_async(f->s, &bad, async_done, &a), -EINVAL);
}

/* store_job.version: unchanged while nothing of the job is written, changed
 * by every write of its row, metrics or checkpoints, and by any commit of
 * another connection (it cannot tell which job that wrote); a new store
 * never repeats an old store's values. */
static uint64_t version_of(store *s, const char *id)
{
	store_job j;
	assert_int_equal(store_job_get(s, id, &j), 0);
	uint64_t v = j.version;
	store_job_free(&j);
	assert_true(v != 0);
	return v;
}

static void test_job_version(void **state)
{
	fixture *f = *state;
	const char *id = "job-00000000000000v1";
	uint64_t v[8];
	int k = 0;
	assert_int_equal(add_job(f->s, id, 0), 0);
#define VERSION_NOW(out) ((out) = version_of(f->s, id))
	VERSION_NOW(v[k]);
	uint64_t again;
	VERSION_NOW(again);
	assert_true(again == v[k]);
	/* a list reads the same version */
	store_job *jobs;
	size_t n;
	int64_t next;
	assert_int_equal(store_job_list(f->s, 0, 0, 10, &jobs, &n, &next), 0);
	assert_int_equal(n, 1);
	assert_true(jobs[0].version == v[k]);
	store_jobs_free(jobs, n);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_RUNNING, "go", NULL), 0);
	VERSION_NOW(v[++k]);
	assert_int_equal(store_metric_insert(f->s, id, 1, 1000, "{\"loss\":1}"), 0);
	VERSION_NOW(v[++k]);
	store_checkpoint c = {.step = 1, .path = "/x/ckpt-1", .bytes = 1};
	assert_int_equal(store_checkpoint_insert(f->s, id, &c), 0);
	VERSION_NOW(v[++k]);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_RUNNING), JOB_COMPLETED, "done", NULL), 0);
	VERSION_NOW(v[++k]);
	assert_int_equal(store_checkpoint_delete(f->s, id, 1), 0);
	VERSION_NOW(v[++k]);
	for (int a = 0; a < k; a++)
		for (int b = a + 1; b <= k; b++)
			assert_true(v[a] != v[b]);
	/* a read never changes it */
	VERSION_NOW(again);
	assert_true(again == v[k]);
	/* a commit by another connection (another process) changes it too */
	raw_exec(f->path, "UPDATE jobs SET name = 'renamed' WHERE id = 'job-00000000000000v1'");
	VERSION_NOW(again);
	assert_true(again != v[k]);
	v[k] = again;
	/* the same file reopened: another store, other values */
	store_close(f->s);
	assert_int_equal(store_open(&f->s, f->path), 0);
	VERSION_NOW(again);
	for (int a = 0; a <= k; a++)
		assert_true(again != v[a]);
#undef VERSION_NOW
}

/* ---- changes after submit, tags, owners ---- */

/* The ids of a filtered list, all pages of limit, joined by ','. */
static void filtered_ids(store *s, const store_job_filter *f, bool newest, int limit, char *out,
			 size_t cap)
{
	int64_t bound = 0, next = 0;
	out[0] = 0;
	do {
		store_job *jobs;
		size_t n;
		assert_int_equal(store_job_list_filtered(s, f, bound, newest, limit, &jobs, &n, &next), 0);
		assert_true(n <= (size_t)limit);
		for (size_t i = 0; i < n; i++)
			snprintf(out + strlen(out), cap - strlen(out), "%s%s", out[0] ? "," : "", jobs[i].id + 16);
		store_jobs_free(jobs, n);
		bound = next;
	} while (next);
}

static void test_job_change_tags_owner(void **state)
{
	fixture *f = *state;
	char id[6][32];
	for (int i = 0; i < 6; i++) {
		job_id(id[i], i);
		/* 0, 2, 4 tagged "a"; 1..5 tagged "b"; 0..2 owned by "default" */
		char spec[128];
		snprintf(spec, sizeof spec, "{\"name\":\"demo\",\"priority\":0,\"tags\":[%s%s%s],\"notes\":null}",
			 i % 2 == 0 ? "\"a\"" : "", i % 2 == 0 && i > 0 ? "," : "", i > 0 ? "\"b\"" : "");
		store_job j = {.id = id[i], .name = (char *)"demo", .spec_json = spec,
			       .owner = i < 3 ? (char *)"default" : NULL};
		assert_int_equal(store_job_insert(f->s, &j, NULL, NULL, NULL, NULL, NULL, NULL), 0);
	}
	char got[256];
	store_job_filter fa = {.tag = "a"}, fb = {.tag = "b", .owner = "default"}, fo = {.owner = "default"};
	filtered_ids(f->s, &fa, false, 1, got, sizeof got);
	assert_string_equal(got, "0000,0002,0004");
	filtered_ids(f->s, &fa, true, 2, got, sizeof got);
	assert_string_equal(got, "0004,0002,0000");
	filtered_ids(f->s, &fb, false, 5, got, sizeof got);
	assert_string_equal(got, "0001,0002");
	filtered_ids(f->s, &fo, true, 1, got, sizeof got);
	assert_string_equal(got, "0002,0001,0000");
	store_job j;
	assert_int_equal(store_job_get(f->s, id[0], &j), 0);
	assert_string_equal(j.owner, "default");
	store_job_free(&j);
	assert_int_equal(store_job_get(f->s, id[5], &j), 0);
	assert_null(j.owner);
	store_job_free(&j);

	/* a change: row, spec, tag index, one event, a new version */
	uint64_t v0 = version_of(f->s, id[1]);
	size_t ev0 = count_events(f->s, id[1]);
	char *changed = NULL;
	store_job_change c = {.name = "renamed", .set_priority = true, .priority = 9,
			      .tags_json = "[\"a\"]", .set_notes = true, .notes = "x\ny", .by = "default"};
	assert_int_equal(store_job_change_apply(f->s, id[1], &c, &changed, NULL), 0);
	assert_string_equal(changed, "changed by default: priority 0 -> 9; name \"demo\" -> \"renamed\"; "
				     "tags [\"b\"] -> [\"a\"]; notes null -> \"x\\ny\"");
	free(changed);
	assert_true(version_of(f->s, id[1]) != v0);
	assert_int_equal(count_events(f->s, id[1]), ev0 + 1);
	assert_int_equal(store_job_get(f->s, id[1], &j), 0);
	assert_string_equal(j.name, "renamed");
	assert_int_equal(j.priority, 9);
	assert_non_null(strstr(j.spec_json, "\"priority\":9"));
	assert_non_null(strstr(j.spec_json, "\"tags\":[\"a\"]"));
	assert_non_null(strstr(j.spec_json, "\"notes\":\"x\\ny\""));
	assert_non_null(strstr(j.spec_json, "\"name\":\"renamed\""));
	store_job_free(&j);
	filtered_ids(f->s, &fa, false, 10, got, sizeof got);
	assert_string_equal(got, "0000,0001,0002,0004");
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_tags WHERE tag = 'b'", NULL), 4);

	/* the same values again: nothing written */
	v0 = version_of(f->s, id[1]);
	assert_int_equal(store_job_change_apply(f->s, id[1], &c, &changed, NULL), 0);
	assert_null(changed);
	assert_true(version_of(f->s, id[1]) == v0);
	assert_int_equal(count_events(f->s, id[1]), ev0 + 1);
	/* notes cleared: JSON null in the spec */
	store_job_change clear = {.set_notes = true, .notes = NULL};
	assert_int_equal(store_job_change_apply(f->s, id[1], &clear, &changed, NULL), 0);
	assert_string_equal(changed, "changed by (unknown): notes \"x\\ny\" -> null");
	free(changed);
	assert_int_equal(raw_int(f->path, "SELECT json_type(spec_json, '$.notes') = 'null' FROM jobs WHERE id = ?1",
				 id[1]), 1);

	/* finished: -EBUSY with its state, nothing written; none: -ENOENT */
	assert_int_equal(store_job_transition(f->s, id[3], JOB_MASK(JOB_QUEUED), JOB_CANCELED, "x", NULL), 0);
	enum job_state cur = JOB_QUEUED;
	assert_int_equal(store_job_change_apply(f->s, id[3], &c, &changed, &cur), -EBUSY);
	assert_null(changed);
	assert_int_equal(cur, JOB_CANCELED);
	assert_int_equal(store_job_get(f->s, id[3], &j), 0);
	assert_int_equal(j.priority, 0);
	store_job_free(&j);
	assert_int_equal(store_job_change_apply(f->s, "job-ffffffffffffffff", &c, &changed, NULL), -ENOENT);
	/* a deleted job takes its tags along */
	assert_int_equal(store_job_delete(f->s, id[3]), 0);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_tags WHERE tag = 'b'", NULL), 3);
}

/* ---- datasets, metrics, checkpoints ---- */

static void test_datasets(void **state)
{
	fixture *f = *state;
	store_dataset d = {.id = (char *)"ds-0000000000000001", .name = (char *)"pubmed",
			   .spec_json = (char *)"{\"path\":\"/data/pubmed\"}", .bytes_total = 1000};
	assert_int_equal(store_dataset_insert(f->s, &d), 0);
	store_dataset dup = d;
	dup.id = (char *)"ds-0000000000000009"; /* same name */
	assert_int_equal(store_dataset_insert(f->s, &dup), -EEXIST);
	dup = d;
	dup.name = (char *)"other"; /* same id */
	assert_int_equal(store_dataset_insert(f->s, &dup), -EEXIST);
	dup.spec_json = NULL;
	assert_int_equal(store_dataset_insert(f->s, &dup), -EINVAL);

	/* registered (prepared elsewhere): ready at once, with its stats */
	store_dataset reg = {.id = (char *)"ds-00000000000000r1", .name = (char *)"registered",
			     .spec_json = (char *)"{\"prepared\":\"/data/x\"}", .bytes_total = 77};
	assert_int_equal(store_dataset_insert_ready(f->s, &reg, "{\"tokens\":5}"), 0);
	assert_int_equal(store_dataset_insert_ready(f->s, &reg, "{\"tokens\":5}"), -EEXIST);
	assert_int_equal(store_dataset_insert_ready(f->s, &reg, NULL), -EINVAL);
	store_dataset rg;
	assert_int_equal(store_dataset_get_by_name(f->s, "registered", &rg), 0);
	assert_int_equal(rg.state, DATASET_READY);
	assert_string_equal(rg.stats_json, "{\"tokens\":5}");
	assert_string_equal(rg.phase, "done");
	assert_true(rg.fraction == 1.0);
	assert_int_equal(rg.bytes_done, 77);
	assert_int_equal(rg.bytes_total, 77);
	store_dataset_free(&rg);
	/* never preparing: a progress report for it is refused */
	assert_int_equal(store_dataset_phase(f->s, "ds-00000000000000r1", "tokenize", 0.5), -EBUSY);
	assert_int_equal(store_dataset_delete(f->s, "ds-00000000000000r1"), 0);

	store_dataset g;
	assert_int_equal(store_dataset_get(f->s, "ds-0000000000000001", &g), 0);
	assert_string_equal(g.name, "pubmed");
	assert_string_equal(g.spec_json, "{\"path\":\"/data/pubmed\"}");
	assert_int_equal(g.state, DATASET_PREPARING);
	assert_int_equal(g.bytes_done, 0);
	assert_int_equal(g.bytes_total, 1000);
	assert_null(g.stats_json);
	assert_null(g.error);
	assert_true(g.created_ms > 0);
	assert_string_equal(g.phase, "queued"); /* not started yet */
	assert_true(g.fraction == 0.0);
	store_dataset_free(&g);
	/* phase and fraction of the whole preparation */
	assert_int_equal(store_dataset_phase(f->s, "ds-0000000000000001", "vocab", 0.25), 0);
	assert_int_equal(store_dataset_phase(f->s, "ds-0000000000000001", "vocab", 1.5), -EINVAL);
	assert_int_equal(store_dataset_phase(f->s, "ds-0000000000000001", NULL, 0.5), -EINVAL);
	assert_int_equal(store_dataset_phase(f->s, "ds-none", "vocab", 0.5), -ENOENT);
	assert_int_equal(store_dataset_get(f->s, "ds-0000000000000001", &g), 0);
	assert_string_equal(g.phase, "vocab");
	assert_true(g.fraction == 0.25);
	store_dataset_free(&g);

	assert_int_equal(store_dataset_progress(f->s, "ds-0000000000000001", 500, 1000, NULL), 0);
	assert_int_equal(store_dataset_progress(f->s, "ds-0000000000000001", 900, 1200,
						"{\"documents\":3}"), 0);
	/* NULL stats keeps the stored ones. */
	assert_int_equal(store_dataset_progress(f->s, "ds-0000000000000001", 900, 1200, NULL), 0);
	assert_int_equal(store_dataset_progress(f->s, "ds-0000000000000001", -1, 1200, NULL), -EINVAL);
	assert_int_equal(store_dataset_get_by_name(f->s, "pubmed", &g), 0);
	assert_string_equal(g.id, "ds-0000000000000001");
	assert_int_equal(g.bytes_done, 900);
	assert_int_equal(g.bytes_total, 1200);
	assert_string_equal(g.stats_json, "{\"documents\":3}");
	store_dataset_free(&g);

	assert_int_equal(store_dataset_finish(f->s, "ds-0000000000000001", DATASET_PREPARING, NULL,
					      NULL), -EINVAL);
	/* An error text means nothing for a ready dataset; stats kept. */
	assert_int_equal(store_dataset_finish(f->s, "ds-0000000000000001", DATASET_READY,
					      "ignored", NULL), 0);
	assert_int_equal(store_dataset_get(f->s, "ds-0000000000000001", &g), 0);
	assert_int_equal(g.state, DATASET_READY);
	assert_null(g.error);
	assert_string_equal(g.stats_json, "{\"documents\":3}");
	store_dataset_free(&g);
	assert_int_equal(store_dataset_progress(f->s, "ds-0000000000000001", 1, 1, NULL), -EBUSY);
	assert_int_equal(store_dataset_phase(f->s, "ds-0000000000000001", "tokenize", 1.0), -EBUSY);
	assert_int_equal(store_dataset_finish(f->s, "ds-0000000000000001", DATASET_FAILED, "x", NULL),
			 -EBUSY);

	store_dataset d2 = {.id = (char *)"ds-0000000000000002", .name = (char *)"wiki",
			    .spec_json = (char *)"{}"};
	assert_int_equal(store_dataset_insert(f->s, &d2), 0);
	assert_int_equal(store_dataset_delete(f->s, "ds-0000000000000002"), -EBUSY);
	assert_int_equal(store_dataset_finish(f->s, "ds-0000000000000002", DATASET_FAILED,
					      "corpus not found", "{\"documents\":0}"), 0);
	store_dataset *list;
	size_t n;
	assert_int_equal(store_dataset_list(f->s, &list, &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(list[0].name, "pubmed");
	assert_string_equal(list[1].name, "wiki");
	assert_int_equal(list[1].state, DATASET_FAILED);
	assert_string_equal(list[1].error, "corpus not found");
	assert_string_equal(list[1].stats_json, "{\"documents\":0}");
	store_datasets_free(list, n);

	assert_int_equal(store_dataset_delete(f->s, "ds-0000000000000001"), 0);
	assert_int_equal(store_dataset_get(f->s, "ds-0000000000000001", &g), -ENOENT);
	assert_int_equal(store_dataset_get_by_name(f->s, "pubmed", &g), -ENOENT);
	/* The name is free again. */
	assert_int_equal(store_dataset_insert(f->s, &d), 0);
	assert_int_equal(store_dataset_list(f->s, &list, &n), 0);
	assert_int_equal(n, 2);
	store_datasets_free(list, n);
}

static void test_metrics(void **state)
{
	fixture *f = *state;
	const char *id = "job-0000000000000f01";
	assert_int_equal(add_job(f->s, id, 0), 0);
	assert_int_equal(add_job(f->s, "job-0000000000000f02", 0), 0);
	/* Inserted out of order; listed by step. */
	assert_int_equal(store_metric_insert(f->s, id, 30, 3000, "{\"loss\":7.0}"), 0);
	assert_int_equal(store_metric_insert(f->s, id, 10, 1000, "{\"loss\":9.0}"), 0);
	assert_int_equal(store_metric_insert(f->s, id, 20, 2000, "{\"loss\":8.0}"), 0);
	assert_int_equal(store_metric_insert(f->s, "job-0000000000000f02", 15, 1, "{\"loss\":1}"), 0);
	assert_int_equal(store_metric_insert(f->s, id, -1, 1, "{}"), -EINVAL);
	assert_int_equal(store_metric_insert(f->s, id, 1, 1, NULL), -EINVAL);

	store_metric *m;
	size_t n;
	assert_int_equal(store_metric_list(f->s, id, -1, 100, &m, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(m[0].step, 10);
	assert_int_equal(m[0].time_ms, 1000);
	assert_string_equal(m[0].values_json, "{\"loss\":9.0}");
	assert_int_equal(m[1].step, 20);
	assert_int_equal(m[2].step, 30);
	store_metrics_free(m, n);

	assert_int_equal(store_metric_list(f->s, id, 10, 100, &m, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(m[0].step, 20);
	store_metrics_free(m, n);
	assert_int_equal(store_metric_list(f->s, id, 0, 1, &m, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(m[0].step, 10);
	store_metrics_free(m, n);
	assert_int_equal(store_metric_list(f->s, id, 30, 100, &m, &n), 0);
	assert_int_equal(n, 0);
	store_metrics_free(m, n);
	assert_int_equal(store_metric_list(f->s, id, 0, 0, &m, &n), -EINVAL);

	/* Step 20 logged again after a restart: replaced, not duplicated. */
	assert_int_equal(store_metric_insert(f->s, id, 20, 2500, "{\"loss\":8.1}"), 0);
	assert_int_equal(store_metric_list(f->s, id, 0, 100, &m, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(m[1].time_ms, 2500);
	assert_string_equal(m[1].values_json, "{\"loss\":8.1}");
	store_metrics_free(m, n);
}

static void test_checkpoints(void **state)
{
	fixture *f = *state;
	const char *id = "job-0000000000000c01";
	assert_int_equal(add_job(f->s, id, 0), 0);
	store_checkpoint c2 = {.step = 2000, .path = (char *)"/ck/ckpt-2000", .bytes = 440000000};
	store_checkpoint c1 = {.step = 1000, .path = (char *)"/ck/ckpt-1000", .bytes = 439000000};
	assert_int_equal(store_checkpoint_insert(f->s, id, &c2), 0);
	assert_int_equal(store_checkpoint_insert(f->s, id, &c1), 0);
	assert_int_equal(store_checkpoint_insert(f->s, id, &c1), -EEXIST);
	store_checkpoint bad = {.step = 3000, .path = NULL};
	assert_int_equal(store_checkpoint_insert(f->s, id, &bad), -EINVAL);

	store_checkpoint *l;
	size_t n;
	assert_int_equal(store_checkpoint_list(f->s, id, &l, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(l[0].step, 1000);
	assert_string_equal(l[0].path, "/ck/ckpt-1000");
	assert_int_equal(l[0].bytes, 439000000);
	assert_true(l[0].created_ms > 0);
	assert_int_equal(l[1].step, 2000);
	assert_string_equal(l[1].path, "/ck/ckpt-2000");
	store_checkpoints_free(l, n);

	assert_int_equal(store_checkpoint_delete(f->s, id, 1000), 0);
	assert_int_equal(store_checkpoint_delete(f->s, id, 1000), -ENOENT);
	assert_int_equal(store_checkpoint_list(f->s, id, &l, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(l[0].step, 2000);
	store_checkpoints_free(l, n);
}

/* store_job_extras_get: per job of a page, the newest `window` metrics in
 * step order, the first row, the newest checkpoint; empty for a job with
 * none and for one that does not exist. */
static void test_job_extras(void **state)
{
	fixture *f = *state;
	store_job jobs[3] = {{.id = (char *)"job-0000000000000e01"},
			     {.id = (char *)"job-0000000000000e02"},
			     {.id = (char *)"job-0000000000000eff"}}; /* never inserted */
	assert_int_equal(add_job(f->s, jobs[0].id, 0), 0);
	assert_int_equal(add_job(f->s, jobs[1].id, 0), 0);
	for (int k = 5; k >= 1; k--) { /* logged out of order */
		char v[32];
		snprintf(v, sizeof v, "{\"loss\": %d}", k);
		assert_int_equal(store_metric_insert(f->s, jobs[0].id, 10 * k, 1000 + k, v), 0);
	}
	store_checkpoint c1 = {.step = 10, .path = (char *)"/ck/ckpt-10"};
	store_checkpoint c3 = {.step = 30, .path = (char *)"/ck/ckpt-30"};
	assert_int_equal(store_checkpoint_insert(f->s, jobs[0].id, &c3), 0);
	assert_int_equal(store_checkpoint_insert(f->s, jobs[0].id, &c1), 0);

	store_job_extras *x = NULL;
	assert_int_equal(store_job_extras_get(f->s, jobs, 3, 0, &x), -EINVAL);
	assert_null(x);
	assert_int_equal(store_job_extras_get(f->s, jobs, 3, 3, &x), 0);
	assert_int_equal(x[0].n_tail, 3);
	assert_int_equal(x[0].tail[0].step, 30);
	assert_int_equal(x[0].tail[2].step, 50);
	assert_string_equal(x[0].tail[2].values_json, "{\"loss\": 5}");
	assert_int_equal(x[0].tail[2].time_ms, 1005);
	assert_int_equal(x[0].n_first, 1);
	assert_int_equal(x[0].first[0].step, 10);
	assert_int_equal(x[0].n_checkpoint, 1);
	assert_int_equal(x[0].last_checkpoint[0].step, 30);
	assert_string_equal(x[0].last_checkpoint[0].path, "/ck/ckpt-30");
	for (int i = 1; i < 3; i++) {
		assert_int_equal(x[i].n_tail, 0);
		assert_int_equal(x[i].n_first, 0);
		assert_int_equal(x[i].n_checkpoint, 0);
	}
	store_job_extras_free(x, 3);
	assert_int_equal(store_job_extras_get(f->s, jobs, 0, 3, &x), 0);
	store_job_extras_free(x, 0);
}

static void test_metric_tail_latest(void **state)
{
	fixture *f = *state;
	const char *id = "job-0000000000000f11", *quiet = "job-0000000000000f12";
	const char *no = "job-ffffffffffffffff";
	assert_int_equal(add_job(f->s, id, 0), 0);
	assert_int_equal(add_job(f->s, quiet, 0), 0);
	int64_t steps[] = {30, 10, 50, 20, 40};
	char v[32];
	for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
		snprintf(v, sizeof v, "{\"loss\":%d}", (int)steps[i]);
		assert_int_equal(store_metric_insert(f->s, id, steps[i], steps[i] * 100, v), 0);
	}

	store_metric last;
	assert_int_equal(store_metric_latest(f->s, id, &last), 0);
	assert_int_equal(last.step, 50);
	assert_int_equal(last.time_ms, 5000);
	assert_string_equal(last.values_json, "{\"loss\":50}");
	free(last.values_json);
	/* None yet, or no such job: -ENOENT with *out zeroed. */
	assert_int_equal(store_metric_latest(f->s, quiet, &last), -ENOENT);
	assert_null(last.values_json);
	assert_int_equal(store_metric_latest(f->s, no, &last), -ENOENT);
	assert_int_equal(store_metric_latest(f->s, NULL, &last), -EINVAL);

	/* The newest rows, oldest first. */
	store_metric *m;
	size_t n;
	assert_int_equal(store_metric_tail(f->s, id, 2, &m, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(m[0].step, 40);
	assert_int_equal(m[1].step, 50);
	assert_string_equal(m[1].values_json, "{\"loss\":50}");
	store_metrics_free(m, n);
	assert_int_equal(store_metric_tail(f->s, id, 100, &m, &n), 0);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(m[i].step, 10 * (int64_t)(i + 1));
	store_metrics_free(m, n);
	assert_int_equal(store_metric_tail(f->s, quiet, 3, &m, &n), 0);
	assert_int_equal(n, 0);
	store_metrics_free(m, n);
	assert_int_equal(store_metric_tail(f->s, no, 3, &m, &n), -ENOENT);
	assert_null(m);
	assert_int_equal(store_metric_tail(f->s, id, 0, &m, &n), -EINVAL);
}

/* ---- failures inside a transaction, damaged rows ---- */

/* A trigger makes one table refuse inserts, as a full disk or an I/O error
 * would: a call that had already written other rows must leave none of them,
 * and the store must not be left inside the failed transaction. */
static void test_failed_write_rolls_back(void **state)
{
	fixture *f = *state;
	const char *id = "job-0000000000000a01";
	store_job j;
	assert_int_equal(add_job(f->s, id, 0), 0);

	raw_exec(f->path, "CREATE TRIGGER no_events BEFORE INSERT ON job_events "
			  "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
	/* The state UPDATE ran before the event insert failed. */
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_RUNNING, "go",
					      NULL), -EIO);
	assert_int_equal(store_job_get(f->s, id, &j), 0);
	assert_int_equal(j.state, JOB_QUEUED);
	assert_int_equal(j.started_ms, 0);
	assert_int_equal(j.updated_ms, j.created_ms);
	store_job_free(&j);
	assert_int_equal(store_job_note(f->s, id, "x"), -EIO);
	/* The job row was inserted before its "submitted" event failed. */
	assert_int_equal(add_job(f->s, "job-0000000000000a02", 0), -EIO);
	assert_int_equal(store_job_get(f->s, "job-0000000000000a02", &j), -ENOENT);
	raw_exec(f->path, "DROP TRIGGER no_events");

	raw_exec(f->path, "CREATE TRIGGER no_keys BEFORE INSERT ON idempotency_keys "
			  "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
	store_job b = {.id = (char *)"job-0000000000000a03", .name = (char *)"b",
		       .spec_json = (char *)"{}"};
	assert_int_equal(store_job_insert(f->s, &b, "key-a03", "hash", "{}", NULL, NULL, NULL), -EIO);
	assert_int_equal(store_job_get(f->s, "job-0000000000000a03", &j), -ENOENT);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_events WHERE job_id = ?1",
				 "job-0000000000000a03"), 0);
	raw_exec(f->path, "DROP TRIGGER no_keys");

	/* Both writes work again on the same connection. */
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_RUNNING, "go",
					      NULL), 0);
	assert_int_equal(count_events(f->s, id), 2);
	assert_int_equal(store_job_insert(f->s, &b, "key-a03", "hash", "{}", NULL, NULL, NULL), 0);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM idempotency_keys", NULL), 1);
}

/* A state this build does not know (a newer bertd wrote it, or someone edited
 * the file) is -EIO for every call that reads that row; a listing fails as a
 * whole rather than returning part of a page (ASan checks nothing read before
 * the bad row leaks), and a write that would start from it writes nothing. */
static void test_unknown_state_in_file(void **state)
{
	fixture *f = *state;
	char id[32];
	for (int i = 0; i < 3; i++) {
		job_id(id, 0x900 + i);
		assert_int_equal(add_job(f->s, id, 0), 0);
	}
	raw_exec(f->path, "PRAGMA ignore_check_constraints = ON; "
			  "UPDATE jobs SET state = 'paused' WHERE id = 'job-0000000000000901'; "
			  "UPDATE job_events SET to_state = 'paused' WHERE job_id = 'job-0000000000000902'");

	store_job j, *jobs;
	size_t n;
	int64_t next;
	assert_int_equal(store_job_get(f->s, "job-0000000000000901", &j), -EIO);
	assert_null(j.id);
	assert_int_equal(store_job_list(f->s, 0, 0, 10, &jobs, &n, &next), -EIO);
	assert_null(jobs);
	assert_int_equal(n, 0);
	/* A mask that does not select the bad row still lists the others. */
	assert_int_equal(store_job_list(f->s, JOB_MASK(JOB_QUEUED), 0, 10, &jobs, &n, &next), 0);
	assert_int_equal(n, 2);
	store_jobs_free(jobs, n);
	int64_t counts[JOB_STATE_COUNT];
	assert_int_equal(store_job_counts(f->s, counts), -EIO);
	assert_int_equal(store_job_transition(f->s, "job-0000000000000901", ~0u, JOB_CANCELED, "x",
					      NULL), -EIO);
	assert_int_equal(store_job_delete(f->s, "job-0000000000000901"), -EIO);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_events WHERE job_id = ?1",
				 "job-0000000000000901"), 1);
	store_event *ev;
	assert_int_equal(store_job_events(f->s, "job-0000000000000902", &ev, &n), -EIO);
	assert_null(ev);
	assert_int_equal(n, 0);

	store_dataset d = {.id = (char *)"ds-0000000000000901", .name = (char *)"a",
			   .spec_json = (char *)"{}"}, g, *list;
	assert_int_equal(store_dataset_insert(f->s, &d), 0);
	d.id = (char *)"ds-0000000000000902";
	d.name = (char *)"b";
	assert_int_equal(store_dataset_insert(f->s, &d), 0);
	raw_exec(f->path, "PRAGMA ignore_check_constraints = ON; "
			  "UPDATE datasets SET state = 'archived' WHERE id = 'ds-0000000000000902'");
	assert_int_equal(store_dataset_get(f->s, "ds-0000000000000902", &g), -EIO);
	assert_null(g.id);
	assert_int_equal(store_dataset_list(f->s, &list, &n), -EIO);
	assert_null(list);
	assert_int_equal(store_dataset_progress(f->s, "ds-0000000000000902", 1, 1, NULL), -EIO);
	assert_int_equal(store_dataset_delete(f->s, "ds-0000000000000902"), -EIO);
	assert_int_equal(store_dataset_get(f->s, "ds-0000000000000901", &g), 0);
	store_dataset_free(&g);
}


/* ---- faults of the database file: damaged, locked, full ---- */

/* Fills the store with jobs whose specs make the jobs table most of the
 * file, so pages overwritten in the middle are job rows. */
static void fill_jobs(store *s, int n)
{
	char spec[2100], id[32];
	memset(spec, 'x', sizeof spec);
	memcpy(spec, "{\"pad\":\"", 8);
	memcpy(spec + sizeof spec - 3, "\"}", 3);
	for (int i = 0; i < n; i++) {
		job_id(id, i);
		store_job j = {.id = id, .name = (char *)"demo", .spec_json = spec};
		assert_int_equal(store_job_insert(s, &j, NULL, NULL, NULL, NULL, NULL, NULL), 0);
	}
}

/* Overwrites n pages in the middle of the (checkpointed) file with noise. */
static void damage_pages(const char *path, int n)
{
	assert_int_equal(raw_int(path, "PRAGMA wal_checkpoint(TRUNCATE)", NULL), 0);
	int64_t page = raw_int(path, "PRAGMA page_size", NULL);
	int64_t pages = raw_int(path, "PRAGMA page_count", NULL);
	assert_true(pages > 4 * n);
	FILE *fp = fopen(path, "r+b");
	assert_non_null(fp);
	assert_int_equal(fseek(fp, (long)(pages / 2 * page), SEEK_SET), 0);
	unsigned x = 12345;
	for (int64_t i = 0; i < n * page; i++) {
		x = x * 1103515245u + 12345u;
		fputc((int)(x >> 16) & 0xff, fp);
	}
	assert_int_equal(fclose(fp), 0);
}

/* A damaged database: 6 pages overwritten mid-file. quick_check finds
 * it; a store that did not check finds it at the first statement that reads
 * those pages, and from then on no write is acknowledged. */
static void test_damaged_file(void **state)
{
	fixture *f = *state;
	char why[256];
	fill_jobs(f->s, 400);
	assert_int_equal(store_quick_check(f->s, why, sizeof why), 0);
	assert_string_equal(why, "ok");
	assert_false(store_damaged(f->s));
	store_close(f->s);
	f->s = NULL;
	damage_pages(f->path, 6);

	store *s = NULL;
	assert_int_equal(store_open(&s, f->path), 0); /* page 1 is intact */
	assert_int_equal(store_quick_check(s, why, sizeof why), STORE_E_DAMAGED);
	assert_true(why[0] && strcmp(why, "ok") != 0);
	assert_true(store_damaged(s));
	assert_int_equal(add_job(s, "job-00000000000fffff", 0), STORE_E_DAMAGED);
	store_close(s);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM jobs WHERE id = ?1",
				 "job-00000000000fffff"), 0);

	/* Without the check: listing reads the damaged pages. */
	assert_int_equal(store_open(&s, f->path), 0);
	assert_false(store_damaged(s));
	store_job *jobs = NULL;
	size_t n = 0;
	int64_t next = 0;
	assert_int_equal(store_job_list(s, 0, 0, 1000, &jobs, &n, &next), STORE_E_DAMAGED);
	assert_null(jobs);
	assert_true(store_damaged(s));
	/* A write that would not touch a damaged page is still refused. */
	assert_int_equal(store_metric_insert(s, "job-0000000000000000", 1, 1, "{}"),
			 STORE_E_DAMAGED);
	assert_int_equal(add_job(s, "job-00000000000ffffe", 0), STORE_E_DAMAGED);
	store_close(s);
	assert_int_equal(raw_int(f->path, "SELECT COUNT(*) FROM job_metrics", NULL), 0);
}

/* Another process holds the write lock (a sqlite3 shell in BEGIN
 * EXCLUSIVE): a view's write fails with STORE_E_LOCKED, not -EIO, and
 * nothing is written; reads go on (WAL); the write works once it lets go. */
static void test_locked_is_busy(void **state)
{
	fixture *f = *state;
	store *v = NULL;
	store_job j;
	assert_int_equal(store_view(&v, f->s, 0), -EINVAL);
	assert_int_equal(store_view(&v, f->s, 50), 0);
	assert_int_equal(add_job(v, "job-0000000000000b01", 0), 0);

	sqlite3 *db = NULL;
	assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "BEGIN EXCLUSIVE; UPDATE jobs SET priority = 7", NULL,
				      NULL, NULL), SQLITE_OK);
	assert_int_equal(add_job(v, "job-0000000000000b02", 0), STORE_E_LOCKED);
	assert_int_equal(store_job_transition(v, "job-0000000000000b01", JOB_MASK(JOB_QUEUED),
					      JOB_CANCELED, "x", NULL), STORE_E_LOCKED);
	assert_int_equal(store_job_get(v, "job-0000000000000b01", &j), 0);
	assert_int_equal(j.state, JOB_QUEUED);
	store_job_free(&j);
	assert_false(store_damaged(v));
	assert_int_equal(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);

	assert_int_equal(store_job_get(v, "job-0000000000000b02", &j), -ENOENT);
	assert_int_equal(add_job(v, "job-0000000000000b02", 0), 0);
	/* the view and its owner are one connection */
	assert_int_equal(store_job_get(f->s, "job-0000000000000b02", &j), 0);
	store_job_free(&j);
	store_close(v);
}

/* A full disk, as SQLite sees it: the file may not grow (max_page_count,
 * set by an extra migration on the store's own connection). The write
 * fails with STORE_E_FULL and leaves nothing behind. */
static void test_full_is_enospc(void **state)
{
	fixture *f = *state;
	extern const unsigned char schema_sql[];
	char p[320];
	snprintf(p, sizeof p, "%s/full.db", f->dir);
	int latest = store_schema_latest();
	size_t len = strlen((const char *)schema_sql);
	char *schema = malloc(len + 128);
	assert_non_null(schema);
	snprintf(schema, len + 128, "%s\n-- migration %d\nPRAGMA max_page_count = 1;\n",
		 (const char *)schema_sql, latest + 1);
	store *s = NULL;
	assert_int_equal(store_open_schema(&s, p, schema), 0);
	free(schema);
	char spec[4000], id[32];
	memset(spec, 'y', sizeof spec);
	memcpy(spec, "{\"pad\":\"", 8);
	memcpy(spec + sizeof spec - 3, "\"}", 3);
	int rc = 0, i;
	for (i = 0; i < 64 && rc == 0; i++) {
		job_id(id, i);
		store_job j = {.id = id, .name = (char *)"demo", .spec_json = spec};
		rc = store_job_insert(s, &j, NULL, NULL, NULL, NULL, NULL, NULL);
	}
	assert_int_equal(rc, STORE_E_FULL);
	assert_false(store_damaged(s));
	store_job j;
	assert_int_equal(store_job_get(s, id, &j), -ENOENT);
	store_close(s);
	char q[340];
	static const char *const suffix[] = {"", "-wal", "-shm"};
	for (size_t k = 0; k < 3; k++) {
		snprintf(q, sizeof q, "%s%s", p, suffix[k]);
		unlink(q);
	}
}

/* store_backup copies a store that is open and written to (WAL not yet
 * checkpointed) into a file that passes integrity_check and has the rows;
 * it never replaces a file, and a damaged source is reported as such. */
static void test_backup(void **state)
{
	fixture *f = *state;
	char dst[320], why[512];
	fill_jobs(f->s, 20);
	/* the rows are still in the WAL (auto-checkpoint comes at 1000 pages) */
	assert_true(raw_int(f->path, "SELECT COUNT(*) FROM jobs", NULL) == 20);
	snprintf(dst, sizeof dst, "%s/copy.db", f->dir);
	assert_int_equal(store_backup(f->path, dst, why, sizeof why), 0);
	assert_int_equal(raw_int(dst, "SELECT COUNT(*) FROM jobs", NULL), 20);
	assert_int_equal(raw_int(dst, "SELECT COUNT(*) FROM job_events", NULL), 20);
	assert_int_equal(raw_int(dst, "SELECT COUNT(*) FROM pragma_integrity_check "
				      "WHERE integrity_check = 'ok'", NULL), 1);
	assert_int_equal(store_backup(f->path, dst, why, sizeof why), -EEXIST);
	assert_non_null(strstr(why, "exists"));
	unlink(dst);
	char nope[320];
	snprintf(nope, sizeof nope, "%s/nope.db", f->dir);
	assert_int_equal(store_backup(nope, dst, why, sizeof why), -ENOENT);
	assert_int_equal(access(dst, F_OK), -1);

	store_close(f->s);
	f->s = NULL;
	damage_pages(f->path, 6);
	assert_int_equal(store_backup(f->path, dst, why, sizeof why), STORE_E_DAMAGED);
	assert_non_null(strstr(why, "integrity_check"));
	assert_int_equal(access(dst, F_OK), -1); /* no file that looks like a backup */
}

/* store_job_list_keys: the same page as store_job_list_filtered (rows,
 * order, next cursor, versions), with nothing but seq, id and state read. */
static void test_list_keys(void **state)
{
	fixture *f = *state;
	char id[32];
	for (int i = 0; i < 7; i++) {
		job_id(id, i);
		assert_int_equal(add_job(f->s, id, 0), 0);
	}
	job_id(id, 2);
	assert_int_equal(store_job_transition(f->s, id, JOB_MASK(JOB_QUEUED), JOB_CANCELED, "x", NULL), 0);
	for (int newest = 0; newest < 2; newest++) {
		store_job_filter flt = {.state_mask = JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_CANCELED)};
		store_job *a = NULL, *b = NULL;
		size_t na = 0, nb = 0;
		int64_t nexta = 0, nextb = 0;
		assert_int_equal(store_job_list_filtered(f->s, &flt, 0, newest, 4, &a, &na, &nexta), 0);
		assert_int_equal(store_job_list_keys(f->s, &flt, 0, newest, 4, &b, &nb, &nextb), 0);
		assert_int_equal(na, 4);
		assert_int_equal(nb, na);
		assert_int_equal(nextb, nexta);
		assert_true(nexta != 0);
		for (size_t i = 0; i < na; i++) {
			assert_int_equal(b[i].seq, a[i].seq);
			assert_string_equal(b[i].id, a[i].id);
			assert_int_equal(b[i].state, a[i].state);
			assert_true(a[i].version != 0);
			assert_int_equal(b[i].version, a[i].version);
			assert_null(b[i].spec_json);
			assert_null(b[i].name);
		}
		store_jobs_free(a, na);
		store_jobs_free(b, nb);
	}
}

int main(void)
{
	/* The refusals under test log their errors; those lines are expected. */
	log_init("test_store", LOG_LVL_WARN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_state_names),
		cmocka_unit_test_setup_teardown(test_migrate_empty, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reopen_keeps_data, setup, teardown),
		cmocka_unit_test_setup_teardown(test_too_new_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_not_a_database, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migrate_forward, setup, teardown),
		cmocka_unit_test_setup_teardown(test_survives_kill, setup, teardown),
		cmocka_unit_test_setup_teardown(test_insert_get, setup, teardown),
		cmocka_unit_test_setup_teardown(test_list_paging, setup, teardown),
		cmocka_unit_test_setup_teardown(test_job_extras, setup, teardown),
		cmocka_unit_test_setup_teardown(test_transition_cas, setup, teardown),
		cmocka_unit_test_setup_teardown(test_events_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delete_terminal_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_preempt_holds_stop_by, setup, teardown),
		cmocka_unit_test_setup_teardown(test_idempotency, setup, teardown),
		cmocka_unit_test_setup_teardown(test_enoent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_concurrent_inserts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_group_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_insert_async, setup, teardown),
		cmocka_unit_test_setup_teardown(test_job_version, setup, teardown),
		cmocka_unit_test_setup_teardown(test_job_change_tags_owner, setup, teardown),
		cmocka_unit_test_setup_teardown(test_datasets, setup, teardown),
		cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
		cmocka_unit_test_setup_teardown(test_checkpoints, setup, teardown),
		cmocka_unit_test_setup_teardown(test_metric_tail_latest, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_write_rolls_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unknown_state_in_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_damaged_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_locked_is_busy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_full_is_enospc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backup, setup, teardown),
		cmocka_unit_test_setup_teardown(test_list_keys, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
