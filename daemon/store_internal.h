/* store_internal — what the pieces of the store (daemon/store*.c) share: the
 * handle's struct, how a statement runs (bound arguments, row callbacks,
 * result arrays), the transaction frame every public call goes through, and
 * the per-job version stamps.
 *
 * Included only by daemon/store*.c; the rest of bertd sees daemon/store.h.
 * Must never: be included outside daemon/store*.c, define a function or a
 * variable, or declare SQL of one table (that lives with its table's file).
 */
#ifndef BERTD_DAEMON_STORE_INTERNAL_H
#define BERTD_DAEMON_STORE_INTERNAL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/store.h"

/* A handle: the connection and its mutex belong to the handle store_open
 * made (owner NULL); a view (store_view) points at its owner's and only
 * brings its own wait. wait_ms bounds how long one call waits for locks
 * another process holds: the owner's is STORE_WAIT_MS_DEFAULT (long enough
 * to ride out a checkpoint of the WAL or a sqlite3 shell an operator left
 * open); a view's bounds its wait for the mutex too. */
struct store {
	sqlite3 *db;
	pthread_mutex_t *mu;
	atomic_bool *damaged;
	int wait_ms;
	store *owner;
	pthread_mutex_t own_mu;
	atomic_bool own_damaged;
	atomic_uint_fast64_t *versions; /* VERSION_SLOTS; the owner's */
	struct stamps *stamps;      /* the owner's: slots a write touched, and the
				     * writer's data_version, under mu */
	struct reader *readers;     /* the owner's read connections (n_readers) */
	size_t n_readers;
	atomic_uint *next_reader;
	atomic_uint own_next_reader;
	struct insert_queue *queue; /* the owner's group commit of job inserts */
};

/* Reads run on their own connections (READERS of them, each with its own
 * mutex): in WAL mode a reader sees the last commit and never waits for
 * the writer, so API reads are not held up by a commit's fsync. */
#define READERS 4
typedef struct reader {
	sqlite3 *db;
	pthread_mutex_t mu;
} reader;

/* store_job.version: a job's writes (any statement that changes its row,
 * metrics or checkpoints) stamp its slot with a fresh value of one
 * process-wide clock, again once the transaction has committed. A read
 * takes the clock (g0) before its statement starts and keeps a row's slot
 * value only when it is <= g0: that stamp, and the commit before it, came
 * before the read's snapshot, so the rows it read are at least that new; a
 * later commit stamps a value > g0. A slot > g0 reads as version 0: "may
 * be mid-change, do not cache". Jobs share a slot by hash (a write to one
 * re-stamps its neighbours: harmless), and a new store starts every slot
 * at a fresh value, so equal versions mean the same store and no write
 * since. */
#define VERSION_SLOTS 4096
#define STAMPS_MAX 512

typedef struct stamps {
	size_t n;
	bool all; /* more than STAMPS_MAX: stamp every slot */
	uint16_t slot[STAMPS_MAX];
	int data_version; /* of the writer connection: moves only when another
			   * process commits (external_check) */
	bool data_version_known;
} stamps;

/* Group commit of job inserts: submitters queue their inserts; one thread
 * per store (the committer, started by the first insert) takes everything
 * queued, writes it in one transaction (one fsync) and hands each its own
 * result: store_job_insert waits for it, store_job_insert_async gets a
 * callback. While a group commits, the next one gathers. */
struct insert_item;
typedef struct insert_queue {
	pthread_mutex_t mu;
	pthread_cond_t work;  /* something was queued, or stopping */
	pthread_cond_t done;  /* a group ended */
	struct insert_item *head, *tail;
	bool started, stopping;
	pthread_t thread;
} insert_queue;

/* One value for a "?N" parameter: text (NULL binds SQL NULL; the string must
 * outlive the statement, it is bound without a copy) or an integer. */
typedef struct sqlarg {
	bool is_text;
	const char *text;
	int64_t i64;
} sqlarg;

#define ARG_TEXT(v) ((sqlarg){.is_text = true, .text = (v)})
#define ARG_I64(v) ((sqlarg){.i64 = (int64_t)(v)})
/* Expands to the two arguments "array, count" that store_sql_exec and
 * store_locked_exec take: ARGS(ARG_TEXT(id), ARG_I64(t)) binds ?1 and ?2. */
#define ARGS(...) (const sqlarg[]){__VA_ARGS__}, \
	sizeof((const sqlarg[]){__VA_ARGS__}) / sizeof(sqlarg)
#define NO_ARGS NULL, 0

/* Called for each result row; returns 0, or a negative error that stops the
 * statement and becomes store_sql_exec's result. */
typedef int row_fn(sqlite3_stmt *st, void *ctx);

/* TXN_NONE: a single statement, atomic on its own. TXN_READ: a deferred
 * transaction, so several reads see one snapshot. TXN_WRITE: BEGIN IMMEDIATE,
 * so the write lock is taken before the first read and a read-then-write
 * cannot fail halfway on a lock upgrade. */
enum txn_kind { TXN_NONE, TXN_READ, TXN_WRITE };

/* The body of a transaction: returns >= 0 to commit, a negative error to
 * roll back. */
typedef int txn_fn(store *s, void *ctx);

/* Result rows gathered into a growing array: read fills one element and,
 * when it fails, leaves nothing allocated in it, so free_all of the first n
 * elements is always right. */
typedef struct rows {
	void *arr;
	size_t n, cap, elem;
	row_fn *read;
	void (*free_all)(void *arr, size_t n);
} rows;

#define ROWS(type, read_fn, free_fn) \
	((rows){.elem = sizeof(type), .read = (read_fn), .free_all = (free_fn)})

/* Rows of one job's child table (events, metrics, checkpoints), read in one
 * snapshot with the check that the job exists, so "no such job" (-ENOENT)
 * and "no rows yet" (0 rows) are told apart. */
typedef struct job_rows {
	const char *job_id;
	const char *sql;
	sqlarg args[3];
	size_t nargs;
	rows r;
} job_rows;

/* ---- store_sql.c: statements, transactions, rows, versions ---- */

/* The process-wide clock of version stamps (see store_job.version). */
extern atomic_uint_fast64_t store_version_clock;
/* In a write transaction: stamps id's version slot now and after the commit. */
void store_job_touch(store *s, const char *id);
/* The clock before a read's statement starts. */
uint64_t store_version_now(void);
/* id's version as a read that took store_version_now() == g0 may hand out. */
uint64_t store_job_version(const store *s, const char *id, uint64_t g0);
/* Stamps every slot if another process committed since (not while a write
 * holds the writer's mutex). */
void store_external_peek(store *s);

/* Wall-clock time, Unix epoch milliseconds. */
int64_t store_now_ms(void);
/* The store.h error of a failed SQLite result rc (not a constraint). */
int store_db_errno(sqlite3 *db, int rc);
/* rc as a store.h error (0 for OK/ROW/DONE, -EEXIST, -ENOENT for constraints);
 * logs real failures naming what, and marks the store damaged on damage. */
int store_sqlerr(store *s, int rc, const char *what);
/* Finalizes every statement store_sql_exec keeps prepared on db (before
 * sqlite3_close). */
void store_stmts_finalize(sqlite3 *db);
/* Runs parameterless SQL whose rows are not wanted (BEGIN, PRAGMA settings). */
int store_exec_sql(store *s, const char *sql);
/* Prepares sql, binds args, steps it to the end handing each row to row(st,
 * ctx): rows handed over (row given) or rows changed, or a negative error.
 * The caller holds the connection's mutex (inside store_in_txn). */
int store_sql_exec(store *s, const char *sql, const sqlarg *args, size_t nargs, row_fn *row,
		   void *ctx);
/* store_sql_exec's count for a one-row statement: 0 for a row, none for no
 * row, else its error. */
int store_found(int rc, int none);
/* The frame of every public call: fn in a transaction of the given kind
 * under the mutex (a read on a read connection), committed when it returns
 * >= 0, rolled back otherwise; returns fn's result or the store's error. */
int store_in_txn(store *s, enum txn_kind kind, txn_fn *fn, void *ctx);
/* A public call that is one statement: store_sql_exec inside store_in_txn. */
int store_locked_exec(store *s, enum txn_kind kind, const char *sql, const sqlarg *args,
		      size_t nargs, row_fn *row, void *ctx);
/* store_locked_exec of one write statement that changes job_id's data
 * (stamps its version); returns the rows changed. */
int store_job_write(store *s, const char *job_id, const char *sql, const sqlarg *args,
		    size_t nargs);
/* Copies text column col into *out (caller frees; NULL stays NULL). */
int store_dup_col(sqlite3_stmt *st, int col, char **out);
/* A row_fn: appends the row to the rows struct ctx. */
int store_rows_push(sqlite3_stmt *st, void *ctx);
/* Hands r's array over (caller owns, *n elements) when rc >= 0, else frees
 * it and returns NULL with *n 0. */
void *store_rows_take(rows *r, int rc, size_t *n);
/* A row_fn: column 0 into the int at out. */
int store_int_row(sqlite3_stmt *st, void *out);

/* ---- store_jobs.c ---- */

/* In a write transaction: one job_events row. */
int store_event_insert(store *s, const char *id, int64_t t, enum job_state from,
		       enum job_state to, const char *reason);
/* In a write transaction: makes job_tags hold exactly the "tags" of job
 * id's spec_json (none when it has none). */
int store_job_tags_sync(store *s, const char *id);
/* A txn_fn over a job_rows: -ENOENT for no such job, else its rows. */
int store_job_rows_txn(store *s, void *ctx);

/* ---- store_commit.c ---- */

/* Stops the commit thread after it wrote everything queued (store_close). */
void store_insert_queue_stop(insert_queue *q);

#endif
