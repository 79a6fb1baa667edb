/* store_sql — how every statement of the store runs: errors mapped to
 * store.h's, statements with bound arguments and row callbacks, the
 * transaction frame of every public call, result arrays, and the per-job
 * version stamps (store_job.version).
 *
 * Writes: one connection, one mutex, taken for the whole call, so a
 * transaction is never interleaved with another caller's statements. Reads:
 * READERS more connections, each with its own mutex, so a read never waits
 * for a write's commit (WAL). Writes run in BEGIN IMMEDIATE (the write lock
 * is taken up front, so a read-then-write cannot fail halfway on a lock
 * upgrade) and are rolled back on any error; multi-statement reads run in
 * one deferred transaction so they see one snapshot.
 *
 * Must never: know a table (no SQL of jobs, datasets, ... here), format
 * user data into SQL (everything is bound), or return 0 before a write has
 * committed.
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

/* ---- versions (store_job.version) ---- */

atomic_uint_fast64_t store_version_clock;

static size_t version_slot(const char *id)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (const unsigned char *p = (const unsigned char *)id; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return (size_t)(h % VERSION_SLOTS);
}

/* In a write transaction (under the writer's mutex): stamps id's slot now
 * and once more after the commit (stamps_commit). */
void store_job_touch(store *s, const char *id)
{
	size_t k = version_slot(id);
	atomic_store(&s->versions[k], atomic_fetch_add(&store_version_clock, 1) + 1);
	if (s->stamps->n < STAMPS_MAX)
		s->stamps->slot[s->stamps->n++] = (uint16_t)k;
	else
		s->stamps->all = true;
}

static void stamp_all(store *s)
{
	uint64_t v = atomic_fetch_add(&store_version_clock, 1) + 1;
	for (size_t k = 0; k < VERSION_SLOTS; k++)
		atomic_store(&s->versions[k], v);
}

/* After a write transaction ended (committed or not), under its mutex. */
static void stamps_commit(store *s)
{
	stamps *t = s->stamps;
	if (!t->n && !t->all)
		return;
	uint64_t v = atomic_fetch_add(&store_version_clock, 1) + 1;
	if (t->all)
		stamp_all(s);
	else
		for (size_t i = 0; i < t->n; i++)
			atomic_store(&s->versions[t->slot[i]], v);
	t->n = 0;
	t->all = false;
}

/* The clock before a read's statement starts (see store_job.version). */
uint64_t store_version_now(void)
{
	return atomic_load(&store_version_clock);
}

uint64_t store_job_version(const store *s, const char *id, uint64_t g0)
{
	if (!id)
		return 0;
	uint64_t v = atomic_load(&s->versions[version_slot(id)]);
	return v <= g0 ? v : 0;
}
/* ---- helpers ---- */

int64_t store_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The store.h error of a failed SQLite call (not a constraint): what the
 * caller can do about it decides the class — wait (locked), free space
 * (full), restore (damaged) — so the API can answer 503, 507 or 500. */
int store_db_errno(sqlite3 *db, int rc)
{
	switch (rc & 0xff) {
	case SQLITE_NOMEM:
		return -ENOMEM;
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
		return STORE_E_LOCKED;
	case SQLITE_FULL:
		return STORE_E_FULL;
	case SQLITE_CORRUPT:
	case SQLITE_NOTADB:
		return STORE_E_DAMAGED;
	case SQLITE_IOERR:
		if (rc == SQLITE_IOERR_NOMEM)
			return -ENOMEM;
		/* a write the file system refused for space reads as an I/O error */
		return db && sqlite3_system_errno(db) == ENOSPC ? STORE_E_FULL : -EIO;
	default:
		return -EIO;
	}
}

/* Maps a SQLite result to our error convention; the one place that does.
 * Constraint failures are expected outcomes (duplicate key, missing parent
 * row) and are not logged; anything else is a real failure and is. A
 * damaged file marks the store damaged for good (store_damaged). */
int store_sqlerr(store *s, int rc, const char *what)
{
	switch (rc) {
	case SQLITE_OK:
	case SQLITE_ROW:
	case SQLITE_DONE:
		return 0;
	case SQLITE_CONSTRAINT_UNIQUE:
	case SQLITE_CONSTRAINT_PRIMARYKEY:
		return -EEXIST;
	case SQLITE_CONSTRAINT_FOREIGNKEY:
		return -ENOENT;
	default: {
		int e = store_db_errno(s->db, rc);
		const char *msg = sqlite3_errmsg(s->db), *gen = sqlite3_errstr(rc);
		enum log_level lvl = e == STORE_E_LOCKED ? LOG_LVL_WARN : LOG_LVL_ERROR;
		if (e == STORE_E_DAMAGED && !atomic_exchange(s->damaged, true))
			log_error("store: the database file is damaged; refusing every write from "
				  "now on (stop bertd, restore a backup or run sqlite3 .recover)");
		if (strcmp(msg, gen) == 0)
			log_msg(lvl, "store: %s: %s", what, msg);
		else
			log_msg(lvl, "store: %s: %s (%s)", what, msg, gen);
		return e;
	}
	}
}

/* SQL text with no parameters whose rows, if any, are not wanted (BEGIN,
 * COMMIT, PRAGMA settings); everything else goes through store_sql_exec. */
int store_exec_sql(store *s, const char *sql)
{
	return store_sqlerr(s, sqlite3_exec(s->db, sql, NULL, NULL, NULL), sql);
}

/* Statements stay prepared on their connection once run, found again by
 * their text: parsing and planning a statement was ~10 % of the CPU of a
 * GET /v1/jobs page. At most STMT_KEEP per connection (beyond, a statement
 * is finalized after its run); one still being stepped (a row callback
 * running the same text) is not taken. */
#define STMT_KEEP 128

/* A kept statement of db with this text that is not running, or NULL;
 * *n gets how many statements db holds. */
static sqlite3_stmt *stmt_kept(sqlite3 *db, const char *sql, int *n)
{
	*n = 0;
	for (sqlite3_stmt *p = sqlite3_next_stmt(db, NULL); p; p = sqlite3_next_stmt(db, p)) {
		++*n;
		const char *t = sqlite3_sql(p);
		if (!sqlite3_stmt_busy(p) && t && strcmp(t, sql) == 0)
			return p;
	}
	return NULL;
}

void store_stmts_finalize(sqlite3 *db)
{
	sqlite3_stmt *p;
	while (db && (p = sqlite3_next_stmt(db, NULL)))
		sqlite3_finalize(p);
}

/* Prepares sql (or takes its kept statement), binds args to ?1..?nargs, and
 * steps it to the end, handing each result row to row(st, ctx). Returns the
 * number of rows handed over when row is given, else (a write) the number of
 * rows the statement changed, or a negative error. The caller holds the
 * mutex. */
int store_sql_exec(store *s, const char *sql, const sqlarg *args, size_t nargs, row_fn *row,
		   void *ctx)
{
	int held = 0;
	sqlite3_stmt *st = stmt_kept(s->db, sql, &held);
	int rows = 0;
	int rc = st ? 0 : store_sqlerr(s, sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL),
				       sql);
	for (size_t i = 0; rc == 0 && i < nargs; i++) {
		const sqlarg *a = &args[i];
		int b = !a->is_text ? sqlite3_bind_int64(st, (int)i + 1, a->i64)
			: a->text   ? sqlite3_bind_text(st, (int)i + 1, a->text, -1, SQLITE_STATIC)
				    : sqlite3_bind_null(st, (int)i + 1);
		rc = store_sqlerr(s, b, sql);
	}
	if (rc < 0)
		goto out;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (row && (rc = row(st, ctx)) < 0)
			goto out;
		rows++;
	}
	if (rc != SQLITE_DONE) {
		rc = store_sqlerr(s, rc, sql);
		goto out;
	}
	rc = row ? rows : sqlite3_changes(s->db);
out:
	if (st && held < STMT_KEEP) {
		sqlite3_reset(st); /* its error, if any, was st's step's: reported above */
		sqlite3_clear_bindings(st);
	} else {
		sqlite3_finalize(st);
	}
	return rc;
}

/* Reads store_sql_exec's count for a statement that should touch one row (a
 * lookup by key, a keyed update): 0 when it read or changed a row, none when
 * it did not, else its error. */
int store_found(int rc, int none)
{
	return rc < 0 ? rc : rc == 0 ? none : 0;
}

/* ---- transactions ---- */

/* A write whose BEGIN IMMEDIATE finds another process holding the write
 * lock waits this long between attempts with the mutex let go, so the calls
 * of other threads (API reads, which WAL lets run beside the other process's
 * write) are not queued behind the whole wait, as they would be behind
 * SQLite's busy handler. */
#define WRITE_RETRY_MS 20
/* txn_begin's "the write lock is taken elsewhere; let go and try again" */
#define TXN_RETRY 1

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left until deadline (mono_ms), at least 1: SQLite reads a
 * busy timeout of 0 as "do not wait". */
static int ms_left(int64_t deadline)
{
	int64_t left = deadline - mono_ms();
	return left > 1 ? (int)left : 1;
}

/* Starts the transaction; the caller holds the mutex. A write that finds
 * the write lock taken returns TXN_RETRY at once while the deadline has not
 * passed (nothing was done; the caller lets the mutex go, waits and calls
 * again). Every statement after it may wait until the deadline. */
static int txn_begin(store *s, enum txn_kind kind, int64_t deadline)
{
	int rc = 0;
	if (kind == TXN_WRITE) {
		sqlite3_busy_timeout(s->db, 0); /* no busy handler: answer at once */
		int src = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
		if ((src & 0xff) == SQLITE_BUSY && mono_ms() < deadline)
			return TXN_RETRY;
		rc = store_sqlerr(s, src, "BEGIN IMMEDIATE");
	} else if (kind == TXN_READ) {
		sqlite3_busy_timeout(s->db, ms_left(deadline));
		return store_exec_sql(s, "BEGIN");
	}
	sqlite3_busy_timeout(s->db, ms_left(deadline));
	return rc;
}

/* Commits when rc >= 0 (success, possibly a count), else rolls back; returns
 * the final result. A no-op when no transaction is open (never begun, or
 * SQLite already rolled it back after an I/O or memory error). */
static int txn_end(store *s, int rc)
{
	if (sqlite3_get_autocommit(s->db))
		return rc;
	if (rc >= 0) {
		int crc = store_exec_sql(s, "COMMIT");
		if (crc == 0)
			return rc;
		rc = crc;
	}
	if (!sqlite3_get_autocommit(s->db) &&
	    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL) != SQLITE_OK)
		log_error("store: ROLLBACK failed: %s", sqlite3_errmsg(s->db));
	return rc;
}

/* Takes the mutex: the owner handle waits for it as long as it takes, a
 * view until deadline (mono_ms), else STORE_E_LOCKED (not held then). */
static int handle_lock(store *s, int64_t deadline)
{
	if (!s->owner) {
		pthread_mutex_lock(s->mu);
		return 0;
	}
	struct timespec abs;
	clock_gettime(CLOCK_REALTIME, &abs);
	int64_t left = deadline - mono_ms();
	if (left < 0)
		left = 0;
	abs.tv_sec += left / 1000;
	abs.tv_nsec += (long)(left % 1000) * 1000000;
	if (abs.tv_nsec >= 1000000000) {
		abs.tv_sec++;
		abs.tv_nsec -= 1000000000;
	}
	if (pthread_mutex_timedlock(s->mu, &abs) != 0) {
		log_warn("store: gave up after %d ms waiting behind other database calls",
			 s->wait_ms);
		return STORE_E_LOCKED;
	}
	return 0;
}

static void external_check(store *s);

/* store_in_txn for a read: on a free read connection (else waits for one, as
 * handle_lock waits), through a copy of the handle that names it. */
static int in_read(store *s, enum txn_kind kind, txn_fn *fn, void *ctx)
{
	int64_t deadline = mono_ms() + s->wait_ms;
	unsigned first = atomic_fetch_add(s->next_reader, 1);
	reader *r = NULL;
	for (size_t i = 0; i < s->n_readers && !r; i++) {
		reader *c = &s->readers[(first + i) % s->n_readers];
		if (pthread_mutex_trylock(&c->mu) == 0)
			r = c;
	}
	store rd = *s;
	if (!r) {
		r = &s->readers[first % s->n_readers];
		rd.mu = &r->mu;
		int rc = handle_lock(&rd, deadline);
		if (rc < 0)
			return rc;
	}
	rd.db = r->db;
	rd.mu = &r->mu;
	int rc = txn_begin(&rd, kind, deadline);
	if (rc == 0)
		rc = fn(&rd, ctx);
	rc = txn_end(&rd, rc);
	pthread_mutex_unlock(&r->mu);
	return rc;
}

/* The frame of every public call: takes the mutex for the whole call (so a
 * transaction never interleaves with another caller's statements), runs fn
 * in a transaction of the given kind, commits or rolls back by its result,
 * and returns that result. The whole call waits at most the handle's
 * wait_ms for locks (the owner's mutex wait aside). */
int store_in_txn(store *s, enum txn_kind kind, txn_fn *fn, void *ctx)
{
	/* Once a statement found the file damaged, no write is acknowledged:
	 * it might land next to pages that are gone. */
	if (kind == TXN_WRITE && store_damaged(s))
		return STORE_E_DAMAGED;
	if (kind != TXN_WRITE && s->n_readers)
		return in_read(s, kind, fn, ctx);
	int64_t deadline = mono_ms() + s->wait_ms;
	int rc;
	for (;;) {
		if ((rc = handle_lock(s, deadline)) < 0)
			return rc;
		if ((rc = txn_begin(s, kind, deadline)) != TXN_RETRY)
			break;
		pthread_mutex_unlock(s->mu);
		int64_t left = deadline - mono_ms();
		int64_t pause = left < WRITE_RETRY_MS ? (left > 0 ? left : 0) : WRITE_RETRY_MS;
		struct timespec ts = {0, (long)pause * 1000000};
		nanosleep(&ts, NULL);
	}
	if (rc == 0 && kind == TXN_WRITE)
		external_check(s);
	if (rc == 0)
		rc = fn(s, ctx);
	rc = txn_end(s, rc);
	if (kind == TXN_WRITE)
		stamps_commit(s);
	pthread_mutex_unlock(s->mu);
	return rc;
}

typedef struct one_stmt {
	const char *sql;
	const sqlarg *args;
	size_t nargs;
	row_fn *row;
	void *ctx;
	const char *job_id; /* a write of this job's data: stamp its version */
} one_stmt;

static int one_stmt_txn(store *s, void *ctx)
{
	one_stmt *o = ctx;
	int rc = store_sql_exec(s, o->sql, o->args, o->nargs, o->row, o->ctx);
	if (rc >= 0 && o->job_id)
		store_job_touch(s, o->job_id);
	return rc;
}

/* A public call that is one statement: store_sql_exec inside store_in_txn. A write
 * returns the rows changed, so callers that must not pass a count on map it. */
int store_locked_exec(store *s, enum txn_kind kind, const char *sql, const sqlarg *args,
		      size_t nargs, row_fn *row, void *ctx)
{
	one_stmt o = {.sql = sql, .args = args, .nargs = nargs, .row = row, .ctx = ctx};
	return store_in_txn(s, kind, one_stmt_txn, &o);
}

/* store_locked_exec for one write statement that changes job_id's data. */
int store_job_write(store *s, const char *job_id, const char *sql, const sqlarg *args,
		    size_t nargs)
{
	one_stmt o = {.sql = sql, .args = args, .nargs = nargs, .job_id = job_id};
	return store_in_txn(s, TXN_WRITE, one_stmt_txn, &o);
}

/* ---- reading rows ---- */

/* Copies a text column (NULL stays NULL). */
int store_dup_col(sqlite3_stmt *st, int col, char **out)
{
	*out = NULL;
	if (sqlite3_column_type(st, col) == SQLITE_NULL)
		return 0;
	const unsigned char *t = sqlite3_column_text(st, col);
	if (!t)
		return -ENOMEM;
	*out = strdup((const char *)t);
	return *out ? 0 : -ENOMEM;
}

/* Returns arr with room for element n (new slots zeroed), or NULL when out
 * of memory (arr is then untouched and still owned by the caller). */
static void *grow(void *arr, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return arr;
	size_t ncap = *cap ? *cap * 2 : 16;
	char *p = realloc(arr, ncap * elem);
	if (!p)
		return NULL;
	memset(p + *cap * elem, 0, (ncap - *cap) * elem);
	*cap = ncap;
	return p;
}

int store_rows_push(sqlite3_stmt *st, void *ctx)
{
	rows *r = ctx;
	void *p = grow(r->arr, &r->cap, r->n, r->elem);
	if (!p)
		return -ENOMEM;
	r->arr = p;
	int rc = r->read(st, (char *)r->arr + r->n * r->elem);
	if (rc == 0)
		r->n++;
	return rc;
}

/* Ends a collection by the call's result rc: on success hands the array over
 * (caller owns it, *n elements); on error frees it and returns NULL, *n 0. */
void *store_rows_take(rows *r, int rc, size_t *n)
{
	if (rc < 0) {
		r->free_all(r->arr, r->n);
		*n = 0;
		return NULL;
	}
	*n = r->n;
	return r->arr;
}

int store_int_row(sqlite3_stmt *st, void *out)
{
	*(int *)out = sqlite3_column_int(st, 0);
	return 0;
}

/* Writes by another process (an operator's sqlite3, a tool) do not stamp
 * versions: the writer connection's data_version moves exactly when another
 * connection commits (the read connections never do), so a move stamps
 * every slot. Under the writer's mutex: at each write, and before the
 * reads that hand out versions when the writer is idle (store_external_peek). */
static void external_check(store *s)
{
	int v = 0;
	if (store_sql_exec(s, "PRAGMA data_version", NULL, 0, store_int_row, &v) != 1)
		return;
	stamps *t = s->stamps;
	if (t->data_version_known && v != t->data_version)
		stamp_all(s);
	t->data_version = v;
	t->data_version_known = true;
}

/* external_check unless a write is under way (it checks at its start). */
void store_external_peek(store *s)
{
	if (pthread_mutex_trylock(s->mu) == 0) {
		external_check(s);
		pthread_mutex_unlock(s->mu);
	}
}

bool store_damaged(const store *s)
{
	return atomic_load(s->damaged);
}
