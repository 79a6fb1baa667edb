/* Faults of the job database: bertd refuses to start on a damaged
 * file, saying how to recover, with its own exit status; a file damaged
 * under a running bertd fails requests with database-damaged and turns
 * /v1/healthz unhealthy, and no write is acknowledged; a database another
 * process holds locked answers 503 with Retry-After; `bertd backup` of a
 * running daemon's database is a sound copy with the jobs. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/exitcodes.h"
#include "common/log.h"
#include "daemon/store.h"
#include "harness.h"
#include "it_store.h"
#include "it_util.h"

#define SPEC_OK "{\"name\":\"it-job\",\"dataset\":\"wikitext2\"}"

static void db_path(const bertd *d, char *out, size_t cap)
{
	snprintf(out, cap, "%s/bertd.db", d->state_dir);
}

/* Jobs must name a dataset that exists: stores "wikitext2" as ready, and
 * with fill, that many jobs whose specs make the jobs table most of the
 * file (so pages overwritten mid-file are job rows). */
static int seed(const bertd *d, int fill)
{
	char id[32], spec[2100];
	store *st = NULL;
	int rc = it_store_seed_dataset(d, &st);
	memset(spec, 'x', sizeof spec);
	memcpy(spec, "{\"pad\":\"", 8);
	memcpy(spec + sizeof spec - 3, "\"}", 3);
	for (int i = 0; rc == 0 && i < fill; i++) {
		snprintf(id, sizeof id, "job-%016x", (unsigned)i);
		store_job j = {.id = id, .name = "seeded", .spec_json = spec};
		rc = store_job_insert(st, &j, NULL, NULL, NULL, NULL, NULL, NULL);
	}
	store_close(st);
	return rc;
}

static int64_t raw_int(const char *path, const char *sql)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	int rc = sqlite3_step(st);
	assert_true(rc == SQLITE_ROW || rc == SQLITE_DONE);
	int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/* The damage to recover from: n pages in the middle of the file overwritten
 * with noise, after the WAL is folded in (so the file holds every page). */
static void damage_pages(const char *path, int n)
{
	assert_int_equal(raw_int(path, "PRAGMA wal_checkpoint(TRUNCATE)"), 0);
	int64_t page = raw_int(path, "PRAGMA page_size");
	int64_t pages = raw_int(path, "PRAGMA page_count");
	assert_true(pages > 4 * n);
	FILE *fp = fopen(path, "r+b");
	assert_non_null(fp);
	assert_int_equal(fseek(fp, (long)(pages / 2 * page), SEEK_SET), 0);
	unsigned x = 777;
	for (int64_t i = 0; i < n * page; i++) {
		x = x * 1103515245u + 12345u;
		fputc((int)(x >> 16) & 0xff, fp);
	}
	assert_int_equal(fclose(fp), 0);
}

static void assert_problem(const http_resp *r, long status, const char *code)
{
	char want[128];
	snprintf(want, sizeof want, "urn:bertd:problem:%s", code);
	const char *type = r->json ? json_string_value(json_object_get(r->json, "type")) : NULL;
	if (r->status != status || !type || strcmp(type, want) != 0)
		fail_msg("want %ld %s, got %ld: %s", status, code, r->status, r->body ? r->body : "");
}

static void test_damaged_db_refused_at_start(void **state)
{
	bertd *d = *state;
	char db[200], log_path[200];
	assert_int_equal(seed(d, 400), 0);
	db_path(d, db, sizeof db);
	damage_pages(db, 6);
	snprintf(log_path, sizeof log_path, "%s/damaged.log", d->root);
	const char *args[] = {"--state-dir", d->state_dir, "--port", "0", "--listen", "127.0.0.1",
			      "--config", "/dev/null", "--schedule", "false", NULL};
	int st = it_run_bertd_to_exit(args, log_path, 30);
	char *log = it_slurp(log_path, NULL);
	assert_non_null(log);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != BERTD_DAEMON_EXIT_DB_DAMAGED)
		fail_msg("bertd on a damaged db: status 0x%x, want exit %d:\n%s", st,
			 BERTD_DAEMON_EXIT_DB_DAMAGED, log);
	char want[300];
	snprintf(want, sizeof want, "the job database %s is damaged", db);
	if (!strstr(log, want) || !strstr(log, "restore a backup") || !strstr(log, ".recover"))
		fail_msg("the log does not say what is damaged and how to recover:\n%s", log);
	free(log);
	/* it never served */
	char addr[200];
	snprintf(addr, sizeof addr, "%s/bertd.addr", d->state_dir);
	assert_int_equal(access(addr, F_OK), -1);
}

/* Damage under a running daemon: the statement that meets it fails the
 * request with database-damaged, healthz turns unhealthy, and a write is
 * refused from then on (no 201). */
static void test_damaged_while_running(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	char db[200];
	http_resp r;
	assert_int_equal(seed(d, 400), 0);
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true}), 0);
	assert_int_equal(http_do(d, "GET", "/v1/healthz", NULL, 0, NULL, H_NO_AUTH, &r), 0);
	assert_int_equal(r.status, 200);
	http_resp_free(&r);
	db_path(d, db, sizeof db);
	/* the checkpoint resets the WAL, so the daemon drops its page cache */
	damage_pages(db, 6);

	/* Reading each seeded job meets the damaged pages at some row. */
	char path[64];
	int i = 0;
	for (; i < 400; i++) {
		snprintf(path, sizeof path, "/v1/jobs/job-%016x", (unsigned)i);
		assert_int_equal(http_get(d, path, &r), 0);
		if (r.status != 200)
			break;
		http_resp_free(&r);
	}
	if (i == 400)
		fail_msg("no seeded job met the damage");
	assert_problem(&r, 500, "database-damaged");
	http_resp_free(&r);
	assert_int_equal(http_do(d, "GET", "/v1/healthz", NULL, 0, NULL, H_NO_AUTH, &r), 0);
	assert_int_equal(r.status, 503);
	assert_string_equal(json_string_value(json_object_get(r.json, "reason")), "database-damaged");
	http_resp_free(&r);
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	assert_problem(&r, 500, "database-damaged");
	http_resp_free(&r);
	assert_int_equal(bertd_stop(d), 0);
	/* nothing was committed either (the file itself cannot be scanned now) */
	char logp[200];
	snprintf(logp, sizeof logp, "%s/bertd.log", d->root);
	char *log = it_slurp(logp, NULL);
	assert_non_null(log);
	if (strstr(log, "(new) -> queued"))
		fail_msg("a job was stored into the damaged database:\n%s", log);
	free(log);
}

/* Another process holds the write lock (what `sqlite3 bertd.db 'BEGIN
 * EXCLUSIVE; ...'` does): a write answers 503 database-busy with
 * Retry-After, reads go on, and the write works once the lock is gone. */
static void test_locked_db_is_503(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	char db[200], ra[32];
	http_resp r;
	assert_int_equal(seed(d, 0), 0);
	const char *extra[] = {"--api-db-wait-ms", "200", NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}), 0);
	db_path(d, db, sizeof db);
	sqlite3 *h = NULL;
	assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
	sqlite3_busy_timeout(h, 5000);
	assert_int_equal(sqlite3_exec(h, "BEGIN EXCLUSIVE; UPDATE datasets SET updated_ms = 1",
				      NULL, NULL, NULL), SQLITE_OK);

	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	assert_problem(&r, 503, "database-busy");
	assert_non_null(http_header(&r, "Retry-After", ra, sizeof ra));
	assert_true(atoi(ra) >= 1);
	http_resp_free(&r);
	assert_int_equal(http_get(d, "/v1/jobs", &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "jobs")), 0);
	http_resp_free(&r);

	assert_int_equal(sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(h);
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
}

/* Submissions commit in groups; a group whose transaction fails fails each
 * of its submitters, never acknowledges one. Clients submit at once while
 * (1) another process holds the write lock: every one gets 503
 * database-busy with Retry-After and none is stored; (2) a trigger aborts
 * the insert of jobs named poison-*: no poisoned job is acknowledged, every
 * answer is a 201 or a 500 problem, and exactly the acknowledged jobs are
 * stored (members of a poisoned group fail with it). */
enum { SUBMITTERS = 8, EACH = 6 };

struct submitter {
	const bertd *d;
	int t;
	bool poison;
	http_resp r[EACH];
};

static void *submit_some(void *arg)
{
	struct submitter *x = arg;
	for (int i = 0; i < EACH; i++) {
		char spec[128];
		bool bad = x->poison && i % 2 == 0;
		snprintf(spec, sizeof spec, "{\"name\":\"%s-%d-%d\",\"dataset\":\"wikitext2\"}",
			 bad ? "poison" : "ok", x->t, i);
		http_post_json(x->d, "/v1/jobs", spec, &x->r[i]);
	}
	return NULL;
}

static void submit_all(const bertd *d, struct submitter *x, bool poison)
{
	pthread_t t[SUBMITTERS];
	for (int i = 0; i < SUBMITTERS; i++) {
		x[i] = (struct submitter){.d = d, .t = i, .poison = poison && i % 2 == 0};
		assert_int_equal(pthread_create(&t[i], NULL, submit_some, &x[i]), 0);
	}
	for (int i = 0; i < SUBMITTERS; i++)
		pthread_join(t[i], NULL);
}

static void test_group_commit_failure(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	char db[200], ra[32];
	struct submitter x[SUBMITTERS];
	assert_int_equal(seed(d, 0), 0);
	const char *extra[] = {"--api-db-wait-ms", "200", "--schedule", "false", NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}), 0);
	db_path(d, db, sizeof db);

	sqlite3 *h = NULL;
	assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
	sqlite3_busy_timeout(h, 5000);
	assert_int_equal(sqlite3_exec(h, "BEGIN EXCLUSIVE; UPDATE datasets SET updated_ms = 1",
				      NULL, NULL, NULL), SQLITE_OK);
	submit_all(d, x, false);
	assert_int_equal(sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	for (int i = 0; i < SUBMITTERS; i++) {
		for (int k = 0; k < EACH; k++) {
			assert_problem(&x[i].r[k], 503, "database-busy");
			assert_non_null(http_header(&x[i].r[k], "Retry-After", ra, sizeof ra));
			http_resp_free(&x[i].r[k]);
		}
	}
	assert_int_equal(raw_int(db, "SELECT COUNT(*) FROM jobs"), 0);

	assert_int_equal(sqlite3_exec(h, "CREATE TRIGGER poison BEFORE INSERT ON jobs "
					 "WHEN NEW.name LIKE 'poison-%' "
					 "BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
				      NULL, NULL, NULL), SQLITE_OK);
	submit_all(d, x, true);
	int acked = 0;
	for (int i = 0; i < SUBMITTERS; i++) {
		for (int k = 0; k < EACH; k++) {
			http_resp *r = &x[i].r[k];
			bool bad = x[i].poison && k % 2 == 0;
			if (r->status == 201) {
				if (bad)
					fail_msg("poisoned job %d-%d was acknowledged", i, k);
				char path[64];
				http_resp g;
				snprintf(path, sizeof path, "/v1/jobs/%s", it_jstr(r->json, "id"));
				assert_int_equal(http_get(d, path, &g), 0);
				if (g.status != 200)
					fail_msg("acknowledged job %s is not stored", path);
				http_resp_free(&g);
				acked++;
			} else {
				assert_problem(r, 500, "internal");
			}
			http_resp_free(r);
		}
	}
	assert_int_equal(raw_int(db, "SELECT COUNT(*) FROM jobs"), acked);
	assert_int_equal(raw_int(db, "SELECT COUNT(*) FROM jobs WHERE name LIKE 'poison-%'"), 0);
	assert_int_equal(sqlite3_exec(h, "DROP TRIGGER poison", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(h);
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
}

/* `bertd backup FILE` while the daemon runs and holds jobs it has not
 * checkpointed out of its WAL: the copy passes integrity_check and has them;
 * a second backup to the same FILE is refused. */
static void test_backup_of_running_daemon(void **state)
{
	it_fx *f = *state;
	bertd *d = &f->d;
	char out[200], log_path[200];
	assert_int_equal(seed(d, 0), 0);
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true}), 0);
	for (int i = 0; i < 3; i++)
		free(it_submit(d, SPEC_OK));
	snprintf(out, sizeof out, "%s/backup.db", d->root);
	snprintf(log_path, sizeof log_path, "%s/backup.log", d->root);
	const char *args[] = {"backup", out, "--state-dir", d->state_dir, "--config", "/dev/null",
			      NULL};
	int st = it_run_bertd_to_exit(args, log_path, 30);
	char *log = it_slurp(log_path, NULL);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail_msg("bertd backup: status 0x%x:\n%s", st, log ? log : "");
	free(log);
	assert_int_equal(raw_int(out, "SELECT COUNT(*) FROM pragma_integrity_check "
				      "WHERE integrity_check = 'ok'"), 1);
	assert_int_equal(raw_int(out, "SELECT COUNT(*) FROM jobs WHERE name = 'it-job'"), 3);
	assert_int_equal(raw_int(out, "SELECT COUNT(*) FROM datasets"), 1);

	st = it_run_bertd_to_exit(args, log_path, 30);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	log = it_slurp(log_path, NULL);
	assert_non_null(log);
	assert_non_null(strstr(log, "never replaces"));
	free(log);
	/* the daemon never noticed */
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
}

/* A state dir, no daemon: each test seeds it, then starts one. */
static int setup(void **state)
{
	it_daemon_opts o = {.plain = true, .deferred = true};
	return it_setup(state, &o, 0);
}

int main(void)
{
	log_init("test_db_faults", LOG_LVL_ERROR);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_damaged_db_refused_at_start, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_damaged_while_running, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_locked_db_is_503, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_group_commit_failure, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_backup_of_running_daemon, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
