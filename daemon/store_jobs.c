/* store_jobs — the jobs table and what hangs off a job's row: its state
 * changes and events, devices, stall watch, training data record, outcome,
 * runtime, restarts, deletion, idempotency keys' pruning, per-state counts,
 * the tag index (job_tags) and changes after submit (name, priority, tags,
 * notes).
 *
 * Inserting jobs is store_commit.c's (group commit); metrics and
 * checkpoints are store_metrics.c's.
 * Must never: change a job's state but through store_job_transition's
 * compare-and-set (one event row per change), or write a job's data
 * without stamping its version (store_job_touch).
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ---- states ---- */

static const char *const job_state_names[JOB_STATE_COUNT] = {
	[JOB_QUEUED] = "queued",       [JOB_STARTING] = "starting",
	[JOB_RUNNING] = "running",     [JOB_RESTARTING] = "restarting",
	[JOB_STOPPING] = "stopping",   [JOB_COMPLETED] = "completed",
	[JOB_FAILED] = "failed",       [JOB_CANCELED] = "canceled",
};

const char *job_state_name(enum job_state s)
{
	return (unsigned)s < JOB_STATE_COUNT ? job_state_names[s] : "unknown";
}

int job_state_parse(const char *name, enum job_state *out)
{
	for (int i = 0; name && i < JOB_STATE_COUNT; i++)
		if (strcmp(name, job_state_names[i]) == 0) {
			*out = (enum job_state)i;
			return 0;
		}
	return -EINVAL;
}

bool job_state_is_terminal(enum job_state s)
{
	return (unsigned)s < JOB_STATE_COUNT && (JOB_MASK(s) & JOB_MASK_TERMINAL);
}

/* ---- reading jobs ---- */

static int col_job_state(sqlite3_stmt *st, int col, enum job_state *out)
{
	const char *t = (const char *)sqlite3_column_text(st, col);
	if (job_state_parse(t, out) < 0) {
		log_error("store: unknown job state '%s' in the database", t ? t : "(null)");
		return -EIO;
	}
	return 0;
}

static int job_state_row(sqlite3_stmt *st, void *out)
{
	return col_job_state(st, 0, out);
}

/* Current state of a job inside an open transaction; -ENOENT if none. */
static int job_state_of(store *s, const char *id, enum job_state *out)
{
	return store_found(store_sql_exec(s, "SELECT state FROM jobs WHERE id = ?1", ARGS(ARG_TEXT(id)),
					  job_state_row, out), -ENOENT);
}

static int job_exists(store *s, const char *id)
{
	enum job_state unused;
	return job_state_of(s, id, &unused);
}

int store_event_insert(store *s, const char *id, int64_t t, enum job_state from,
		       enum job_state to, const char *reason)
{
	int rc = store_sql_exec(s, "INSERT INTO job_events (job_id, time_ms, from_state, to_state, "
				   "reason) VALUES (?1, ?2, ?3, ?4, ?5)",
				ARGS(ARG_TEXT(id), ARG_I64(t), ARG_TEXT(job_state_name(from)),
				     ARG_TEXT(job_state_name(to)), ARG_TEXT(reason)), NULL, NULL);
	return rc < 0 ? rc : 0;
}

/* The txn_fn of a job_rows read (store_internal.h). */
int store_job_rows_txn(store *s, void *ctx)
{
	job_rows *q = ctx;
	int rc = job_exists(s, q->job_id);
	if (rc < 0)
		return rc;
	return store_sql_exec(s, q->sql, q->args, q->nargs, store_rows_push, &q->r);
}

/* ---- jobs ---- */

#define JOB_COLS "seq, id, name, spec_json, state, priority, restart_count, failure_reason, " \
		 "created_ms, updated_ms, started_ms, finished_ms, devices_json, stall_json, outcome_json, " \
		 "runtime_ms, owner"

/* One JOB_COLS row into a store_job (a row_fn). */
static int job_read(sqlite3_stmt *st, void *dst)
{
	store_job *j = dst;
	int rc;
	memset(j, 0, sizeof *j);
	j->seq = sqlite3_column_int64(st, 0);
	if ((rc = store_dup_col(st, 1, &j->id)) < 0 || (rc = store_dup_col(st, 2, &j->name)) < 0 ||
	    (rc = store_dup_col(st, 3, &j->spec_json)) < 0 || (rc = col_job_state(st, 4, &j->state)) < 0 ||
	    (rc = store_dup_col(st, 7, &j->failure_reason)) < 0 ||
	    (rc = store_dup_col(st, 12, &j->devices_json)) < 0 ||
	    (rc = store_dup_col(st, 13, &j->stall_json)) < 0 ||
	    (rc = store_dup_col(st, 14, &j->outcome_json)) < 0 ||
	    (rc = store_dup_col(st, 16, &j->owner)) < 0)
		goto out;
	j->runtime_ms = sqlite3_column_int64(st, 15);
	j->priority = sqlite3_column_int(st, 5);
	j->restart_count = sqlite3_column_int(st, 6);
	j->created_ms = sqlite3_column_int64(st, 8);
	j->updated_ms = sqlite3_column_int64(st, 9);
	j->started_ms = sqlite3_column_int64(st, 10);
	j->finished_ms = sqlite3_column_int64(st, 11);
out:
	if (rc < 0)
		store_job_free(j);
	return rc;
}

void store_job_free(store_job *j)
{
	if (!j)
		return;
	free(j->id);
	free(j->name);
	free(j->spec_json);
	free(j->failure_reason);
	free(j->devices_json);
	free(j->stall_json);
	free(j->outcome_json);
	free(j->owner);
	memset(j, 0, sizeof *j);
}

void store_jobs_free(store_job *jobs, size_t n)
{
	for (size_t i = 0; jobs && i < n; i++)
		store_job_free(&jobs[i]);
	free(jobs);
}

static void jobs_free_rows(void *arr, size_t n)
{
	store_jobs_free(arr, n);
}

typedef struct job_get {
	const store *s;
	store_job *out;
	uint64_t g0;
} job_get;

static int job_get_row(sqlite3_stmt *st, void *ctx)
{
	job_get *g = ctx;
	int rc = job_read(st, g->out);
	if (rc == 0)
		g->out->version = store_job_version(g->s, g->out->id, g->g0);
	return rc;
}

int store_job_get(store *s, const char *id, store_job *out)
{
	memset(out, 0, sizeof *out);
	if (!id)
		return -EINVAL;
	store_external_peek(s);
	job_get g = {.s = s, .out = out, .g0 = store_version_now()};
	return store_found(store_locked_exec(s, TXN_NONE, "SELECT " JOB_COLS " FROM jobs WHERE id = ?1",
					     ARGS(ARG_TEXT(id)), job_get_row, &g), -ENOENT);
}

/* A page of store_job_list: one row more than the page is asked for, and
 * its arrival says there is a next page. */
typedef struct job_page {
	rows r;
	size_t limit;
	int64_t next_seq;
	const store *s;
	uint64_t g0; /* store_version_now() before the statement */
} job_page;

static int job_page_row(sqlite3_stmt *st, void *ctx)
{
	job_page *pg = ctx;
	if (pg->r.n == pg->limit) {
		pg->next_seq = ((store_job *)pg->r.arr)[pg->r.n - 1].seq;
		return 0;
	}
	int rc = store_rows_push(st, &pg->r);
	if (rc == 0) {
		store_job *j = &((store_job *)pg->r.arr)[pg->r.n - 1];
		j->version = store_job_version(pg->s, j->id, pg->g0);
	}
	return rc;
}

/* The SQL of a list page: with a tag, the walk is the tag's (tag, job_seq)
 * index, each row joined to its job, so a page reads its rows however few
 * jobs carry it; an owner alone walks jobs_owner_seq ("owner = ?13" outside
 * an OR). Indexed [tag][owner][desc]; COLS the columns read. */
#define JOB_LIST_STATES "(?2 = 0 OR state IN (?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)) " \
			"AND (?13 IS NULL OR owner = ?13) "
#define JOB_LIST_TAGGED(COLS) "SELECT " COLS " FROM job_tags CROSS JOIN jobs ON seq = job_seq " \
			      "WHERE tag = ?12 AND "
#define JOB_LIST_SQL(COLS) { \
	{{"SELECT " COLS " FROM jobs WHERE ?12 IS NULL AND seq > ?1 AND " JOB_LIST_STATES \
	  "ORDER BY seq LIMIT ?11", \
	  "SELECT " COLS " FROM jobs WHERE ?12 IS NULL AND (?1 = 0 OR seq < ?1) AND " JOB_LIST_STATES \
	  "ORDER BY seq DESC LIMIT ?11"}, \
	 {"SELECT " COLS " FROM jobs WHERE ?12 IS NULL AND owner = ?13 AND seq > ?1 AND " JOB_LIST_STATES \
	  "ORDER BY seq LIMIT ?11", \
	  "SELECT " COLS " FROM jobs WHERE ?12 IS NULL AND owner = ?13 AND (?1 = 0 OR seq < ?1) AND " \
	  JOB_LIST_STATES "ORDER BY seq DESC LIMIT ?11"}}, \
	{{JOB_LIST_TAGGED(COLS) "job_seq > ?1 AND " JOB_LIST_STATES "ORDER BY job_seq LIMIT ?11", \
	  JOB_LIST_TAGGED(COLS) "(?1 = 0 OR job_seq < ?1) AND " JOB_LIST_STATES "ORDER BY job_seq DESC LIMIT ?11"}, \
	 {JOB_LIST_TAGGED(COLS) "job_seq > ?1 AND " JOB_LIST_STATES "ORDER BY job_seq LIMIT ?11", \
	  JOB_LIST_TAGGED(COLS) "(?1 = 0 OR job_seq < ?1) AND " JOB_LIST_STATES "ORDER BY job_seq DESC LIMIT ?11"}}}
static const char *const job_list_sql[2][2][2] = JOB_LIST_SQL(JOB_COLS);
/* store_job_list_keys': only what names a job and its version */
#define JOB_KEY_COLS "seq, id, state"
static const char *const job_keys_sql[2][2][2] = JOB_LIST_SQL(JOB_KEY_COLS);
#undef JOB_LIST_SQL
#undef JOB_LIST_TAGGED
#undef JOB_LIST_STATES

/* One JOB_KEY_COLS row into a store_job (a row_fn): seq, id, state. */
static int job_key_read(sqlite3_stmt *st, void *dst)
{
	store_job *j = dst;
	memset(j, 0, sizeof *j);
	j->seq = sqlite3_column_int64(st, 0);
	int rc = store_dup_col(st, 1, &j->id);
	if (rc == 0 && (rc = col_job_state(st, 2, &j->state)) < 0)
		store_job_free(j);
	return rc;
}

/* One page of store_job_list (desc false: seq > seq_bound, oldest first) or
 * store_job_list_newest (desc true: seq < seq_bound or from the newest when
 * 0, newest first), of the jobs carrying tag and owned by owner where those
 * are non-NULL; keys: only seq, id, state (and version) of each. */
static int job_list(store *s, unsigned state_mask, const char *tag, const char *owner,
		    int64_t seq_bound, bool desc, int limit, store_job **out, size_t *n,
		    int64_t *next_seq, bool keys)
{
	*out = NULL;
	*n = 0;
	*next_seq = 0;
	if (limit < 1 || (state_mask & ~((1u << JOB_STATE_COUNT) - 1)))
		return -EINVAL;
	/* The mask becomes eight bound parameters, NULL for states not wanted:
	 * "state IN (NULL, ...)" never matches a NULL, so those drop out. */
	_Static_assert(JOB_STATE_COUNT == 8, "the IN list below has one parameter per state");
	sqlarg args[13] = {ARG_I64(seq_bound), ARG_I64(state_mask)};
	for (int i = 0; i < JOB_STATE_COUNT; i++)
		args[2 + i] = ARG_TEXT((state_mask & JOB_MASK(i)) ? job_state_names[i] : NULL);
	args[10] = ARG_I64((int64_t)limit + 1);
	args[11] = ARG_TEXT(tag);
	args[12] = ARG_TEXT(owner);
	store_external_peek(s);
	job_page pg = {.r = ROWS(store_job, keys ? job_key_read : job_read, jobs_free_rows),
		       .limit = (size_t)limit, .s = s, .g0 = store_version_now()};
	const char *sql = (keys ? job_keys_sql : job_list_sql)[tag != NULL][owner != NULL][desc];
	int rc = store_locked_exec(s, TXN_NONE, sql, args, sizeof args / sizeof args[0], job_page_row,
				   &pg);
	*out = store_rows_take(&pg.r, rc, n);
	if (rc < 0)
		return rc;
	*next_seq = pg.next_seq;
	return 0;
}

int store_job_list(store *s, unsigned state_mask, int64_t after_seq, int limit,
		   store_job **out, size_t *n, int64_t *next_seq)
{
	return job_list(s, state_mask, NULL, NULL, after_seq, false, limit, out, n, next_seq, false);
}

int store_job_list_newest(store *s, unsigned state_mask, int64_t before_seq, int limit,
			  store_job **out, size_t *n, int64_t *next_seq)
{
	return job_list(s, state_mask, NULL, NULL, before_seq, true, limit, out, n, next_seq, false);
}

int store_job_list_filtered(store *s, const store_job_filter *f, int64_t seq_bound, bool newest,
			    int limit, store_job **out, size_t *n, int64_t *next_seq)
{
	store_job_filter all = {0};
	if (!f)
		f = &all;
	return job_list(s, f->state_mask, f->tag, f->owner, seq_bound, newest, limit, out, n, next_seq,
			false);
}

int store_job_list_keys(store *s, const store_job_filter *f, int64_t seq_bound, bool newest, int limit,
			store_job **out, size_t *n, int64_t *next_seq)
{
	store_job_filter all = {0};
	if (!f)
		f = &all;
	return job_list(s, f->state_mask, f->tag, f->owner, seq_bound, newest, limit, out, n, next_seq,
			true);
}

uint64_t store_jobs_revision(store *s)
{
	store_external_peek(s);
	return store_version_now();
}

typedef struct job_change {
	const char *id;
	unsigned from_mask;
	enum job_state to;
	const char *reason;
	enum job_state *cur;
	int64_t t;
} job_change;

static int job_transition_txn(store *s, void *ctx)
{
	job_change *c = ctx;
	enum job_state was;
	int rc = job_state_of(s, c->id, &was);
	if (rc < 0)
		return rc;
	if (c->cur)
		*c->cur = was;
	if (!(c->from_mask & JOB_MASK(was)))
		return -EBUSY;
	rc = store_sql_exec(s, "UPDATE jobs SET state = ?2, updated_ms = ?3, "
			       "started_ms = CASE WHEN ?4 AND started_ms = 0 THEN ?3 ELSE started_ms END, "
			       "finished_ms = CASE WHEN ?5 THEN ?3 ELSE 0 END, "
			       "failure_reason = ?6 WHERE id = ?1",
			    ARGS(ARG_TEXT(c->id), ARG_TEXT(job_state_name(c->to)), ARG_I64(c->t),
				 ARG_I64(c->to == JOB_RUNNING), ARG_I64(job_state_is_terminal(c->to)),
				 ARG_TEXT(c->to == JOB_FAILED ? c->reason : NULL)), NULL, NULL);
	if (rc < 0)
		return rc;
	store_job_touch(s, c->id);
	return store_event_insert(s, c->id, c->t, was, c->to, c->reason);
}

int store_job_transition(store *s, const char *id, unsigned from_mask, enum job_state to,
			 const char *reason, enum job_state *cur)
{
	if (!id || (unsigned)to >= JOB_STATE_COUNT)
		return -EINVAL;
	enum job_state was = JOB_STATE_COUNT;
	job_change c = {.id = id, .from_mask = from_mask, .to = to, .reason = reason, .cur = &was,
			.t = store_now_ms()};
	int rc = store_in_txn(s, TXN_WRITE, job_transition_txn, &c);
	if (cur && was != JOB_STATE_COUNT)
		*cur = was;
	/* Every job state change passes here (scheduler, supervisor, API), so
	 * this is the daemon log's one line per change. */
	if (rc == 0)
		log_info("job %s: %s -> %s (%s)", id, job_state_name(was), job_state_name(to),
			 reason && reason[0] ? reason : "no reason given");
	return rc;
}

static int job_note_txn(store *s, void *ctx)
{
	job_change *c = ctx;
	enum job_state was;
	int rc = job_state_of(s, c->id, &was);
	if (rc < 0)
		return rc;
	return store_event_insert(s, c->id, c->t, was, was, c->reason);
}

int store_job_note(store *s, const char *id, const char *reason)
{
	if (!id)
		return -EINVAL;
	job_change c = {.id = id, .reason = reason, .t = store_now_ms()};
	return store_in_txn(s, TXN_WRITE, job_note_txn, &c);
}

/* A cancel of a running job: the transition to stopping and who asked
 * (jobs.stop_by) in one transaction, so the daemon that ends the job names
 * whoever's request moved it. */
typedef struct stop_request {
	job_change c;
	const char *by;
} stop_request;

static int stop_request_txn(store *s, void *ctx)
{
	stop_request *q = ctx;
	int rc = job_transition_txn(s, &q->c);
	if (rc < 0)
		return rc;
	rc = store_sql_exec(s, "UPDATE jobs SET stop_by = ?2 WHERE id = ?1", ARGS(ARG_TEXT(q->c.id), ARG_TEXT(q->by)),
			    NULL, NULL);
	return rc < 0 ? rc : 0;
}

int store_job_stop_request(store *s, const char *id, unsigned from_mask, const char *by, const char *reason,
			   enum job_state *cur)
{
	if (!id)
		return -EINVAL;
	enum job_state was = JOB_STATE_COUNT;
	stop_request q = {.c = {.id = id, .from_mask = from_mask, .to = JOB_STOPPING, .reason = reason, .cur = &was,
				.t = store_now_ms()},
			  .by = by};
	int rc = store_in_txn(s, TXN_WRITE, stop_request_txn, &q);
	if (cur && was != JOB_STATE_COUNT)
		*cur = was;
	if (rc == 0)
		log_info("job %s: %s -> stopping (%s)", id, job_state_name(was), reason ? reason : "no reason given");
	return rc;
}

int store_job_set_devices(store *s, const char *id, const char *devices_json)
{
	if (!id)
		return -EINVAL;
	/* No row changed: no such job. */
	return store_found(store_job_write(s, id, "UPDATE jobs SET devices_json = ?2, updated_ms = ?3 "
						  "WHERE id = ?1",
					   ARGS(ARG_TEXT(id), ARG_TEXT(devices_json), ARG_I64(store_now_ms()))),
			   -ENOENT);
}

int store_job_set_stall(store *s, const char *id, const char *stall_json)
{
	if (!id)
		return -EINVAL;
	/* not updated_ms: this is the daemon's observation, not a change of the job */
	return store_found(store_job_write(s, id, "UPDATE jobs SET stall_json = ?2 WHERE id = ?1",
					   ARGS(ARG_TEXT(id), ARG_TEXT(stall_json))), -ENOENT);
}

/* ---- what a job trains on (job_data) ---- */

static int data_row(sqlite3_stmt *st, void *out)
{
	return store_dup_col(st, 0, out);
}

typedef struct data_put {
	const char *id, *json;
	bool changed;
} data_put;

static int job_data_set_txn(store *s, void *ctx)
{
	data_put *d = ctx;
	char *old = NULL;
	int rc = store_sql_exec(s, "SELECT data_json FROM job_data WHERE job_id = ?1",
				ARGS(ARG_TEXT(d->id)), data_row, &old);
	if (rc < 0)
		goto out;
	d->changed = !old || strcmp(old, d->json) != 0;
	/* from jobs: no row for a job that is not there (-ENOENT) */
	rc = store_found(store_sql_exec(s, "INSERT INTO job_data (job_id, data_json, time_ms) "
					   "SELECT id, ?2, ?3 FROM jobs WHERE id = ?1 "
					   "ON CONFLICT (job_id) DO UPDATE SET data_json = excluded.data_json, "
					   "time_ms = excluded.time_ms",
					ARGS(ARG_TEXT(d->id), ARG_TEXT(d->json), ARG_I64(store_now_ms())), NULL, NULL),
			 -ENOENT);
	if (rc == 0)
		store_job_touch(s, d->id);
out:
	free(old);
	return rc;
}

int store_job_data_set(store *s, const char *id, const char *data_json, bool *changed)
{
	if (!id || !data_json)
		return -EINVAL;
	data_put d = {.id = id, .json = data_json};
	int rc = store_in_txn(s, TXN_WRITE, job_data_set_txn, &d);
	if (changed)
		*changed = rc == 0 && d.changed;
	return rc;
}

int store_job_data_get(store *s, const char *id, char **data_json)
{
	*data_json = NULL;
	int rc = store_locked_exec(s, TXN_NONE, "SELECT data_json FROM job_data WHERE job_id = ?1",
				   ARGS(ARG_TEXT(id)), data_row, data_json);
	return rc < 0 ? rc : 0;
}

int store_job_merge_outcome(store *s, const char *id, const char *patch_json)
{
	if (!id || !patch_json)
		return -EINVAL;
	/* RFC 7396 merge in SQL: one statement, so two patches never lose each other */
	return store_found(store_job_write(s, id, "UPDATE jobs SET outcome_json = "
						  "json_patch(COALESCE(outcome_json, '{}'), ?2) WHERE id = ?1",
					   ARGS(ARG_TEXT(id), ARG_TEXT(patch_json))), -ENOENT);
}

int store_job_set_runtime(store *s, const char *id, int64_t runtime_ms)
{
	if (!id || runtime_ms < 0)
		return -EINVAL;
	return store_found(store_job_write(s, id, "UPDATE jobs SET runtime_ms = ?2 WHERE id = ?1",
					   ARGS(ARG_TEXT(id), ARG_I64(runtime_ms))), -ENOENT);
}

typedef struct job_restarts {
	const char *id;
	int64_t t;
	int count;
} job_restarts;

static int job_bump_restarts_txn(store *s, void *ctx)
{
	job_restarts *c = ctx;
	int rc = store_found(store_sql_exec(s, "UPDATE jobs SET restart_count = restart_count + 1, "
					       "updated_ms = ?2 WHERE id = ?1",
					    ARGS(ARG_TEXT(c->id), ARG_I64(c->t)), NULL, NULL), -ENOENT);
	if (rc < 0)
		return rc;
	store_job_touch(s, c->id);
	return store_found(store_sql_exec(s, "SELECT restart_count FROM jobs WHERE id = ?1",
					  ARGS(ARG_TEXT(c->id)), store_int_row, &c->count), -EIO);
}

int store_job_bump_restarts(store *s, const char *id, int *count)
{
	if (!id)
		return -EINVAL;
	job_restarts c = {.id = id, .t = store_now_ms()};
	int rc = store_in_txn(s, TXN_WRITE, job_bump_restarts_txn, &c);
	if (rc == 0 && count)
		*count = c.count;
	return rc;
}

static int job_delete_txn(store *s, void *ctx)
{
	const char *id = *(const char **)ctx;
	enum job_state was;
	int rc = job_state_of(s, id, &was);
	if (rc < 0)
		return rc;
	if (!job_state_is_terminal(was))
		return -EBUSY;
	/* Events, metrics and checkpoint rows go with it (ON DELETE CASCADE). */
	rc = store_sql_exec(s, "DELETE FROM jobs WHERE id = ?1", ARGS(ARG_TEXT(id)), NULL, NULL);
	if (rc < 0)
		return rc;
	store_job_touch(s, id);
	return 0;
}

int store_job_delete(store *s, const char *id)
{
	if (!id)
		return -EINVAL;
	return store_in_txn(s, TXN_WRITE, job_delete_txn, &id);
}

void store_events_free(store_event *ev, size_t n)
{
	for (size_t i = 0; ev && i < n; i++)
		free(ev[i].reason);
	free(ev);
}

static void events_free_rows(void *arr, size_t n)
{
	store_events_free(arr, n);
}

static int event_read(sqlite3_stmt *st, void *dst)
{
	store_event *e = dst;
	int rc;
	e->time_ms = sqlite3_column_int64(st, 0);
	if ((rc = col_job_state(st, 1, &e->from)) < 0 || (rc = col_job_state(st, 2, &e->to)) < 0)
		return rc;
	return store_dup_col(st, 3, &e->reason); /* the only allocation, so last */
}

int store_job_events(store *s, const char *id, store_event **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (!id)
		return -EINVAL;
	job_rows q = {.job_id = id, .r = ROWS(store_event, event_read, events_free_rows),
		      .sql = "SELECT time_ms, from_state, to_state, reason FROM job_events "
			     "WHERE job_id = ?1 ORDER BY id",
		      .args = {ARG_TEXT(id)}, .nargs = 1};
	int rc = store_in_txn(s, TXN_READ, store_job_rows_txn, &q);
	*out = store_rows_take(&q.r, rc, n);
	return rc < 0 ? rc : 0;
}

static int count_row(sqlite3_stmt *st, void *ctx)
{
	int64_t *counts = ctx;
	enum job_state js;
	int rc = col_job_state(st, 0, &js);
	if (rc == 0)
		counts[js] = sqlite3_column_int64(st, 1);
	return rc;
}

int store_job_counts(store *s, int64_t counts[JOB_STATE_COUNT])
{
	for (int i = 0; i < JOB_STATE_COUNT; i++)
		counts[i] = 0;
	int rc = store_locked_exec(s, TXN_NONE, "SELECT state, COUNT(*) FROM jobs GROUP BY state", NO_ARGS,
				   count_row, counts);
	return rc < 0 ? rc : 0;
}

int store_idem_prune(store *s, int64_t before_ms, int64_t *removed)
{
	int rc = store_locked_exec(s, TXN_WRITE, "DELETE FROM idempotency_keys WHERE created_ms < ?1",
				   ARGS(ARG_I64(before_ms)), NULL, NULL);
	if (rc < 0)
		return rc;
	if (removed)
		*removed = rc;
	return 0;
}

/* ---- tags, and changes after submit ---- */

int store_job_tags_sync(store *s, const char *id)
{
	int rc = store_sql_exec(s, "DELETE FROM job_tags WHERE job_seq = (SELECT seq FROM jobs WHERE id = ?1)",
				ARGS(ARG_TEXT(id)), NULL, NULL);
	if (rc < 0)
		return rc;
	/* json_each of a missing "tags" is no rows; DISTINCT and OR IGNORE
	 * keep a repeated tag (refused by the API anyway) from failing */
	rc = store_sql_exec(s, "INSERT OR IGNORE INTO job_tags (tag, job_seq) "
			       "SELECT DISTINCT t.value, jobs.seq FROM jobs, json_each(jobs.spec_json, '$.tags') t "
			       "WHERE jobs.id = ?1 AND t.type = 'text'",
			    ARGS(ARG_TEXT(id)), NULL, NULL);
	return rc < 0 ? rc : 0;
}

/* The values a change compares against, read in its transaction. */
typedef struct job_values {
	enum job_state state;
	char *name, *tags, *notes;
	int priority;
	bool preemptible;
} job_values;

static int job_values_row(sqlite3_stmt *st, void *ctx)
{
	job_values *v = ctx;
	int rc = col_job_state(st, 0, &v->state);
	if (rc == 0)
		rc = store_dup_col(st, 1, &v->name);
	if (rc == 0)
		rc = store_dup_col(st, 3, &v->tags);
	if (rc == 0)
		rc = store_dup_col(st, 4, &v->notes);
	v->priority = sqlite3_column_int(st, 2);
	v->preemptible = sqlite3_column_int(st, 5) != 0;
	return rc;
}

/* A growing event text; on OOM it stays NULL and the caller fails. */
typedef struct textbuf {
	char *p;
	size_t len, cap;
	bool oom;
} textbuf;

__attribute__((format(printf, 2, 3)))
static void tb_add(textbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (b->oom || n < 0)
		return;
	if (b->len + (size_t)n + 1 > b->cap) {
		size_t cap = (b->len + (size_t)n + 1) * 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

/* Notes as an event shows them: quoted as in JSON (so the event, and the
 * log line, stay one line), at most EVENT_NOTES_MAX bytes of them (cut on a
 * UTF-8 boundary, then "..."), or null. */
#define EVENT_NOTES_MAX 80
static void tb_notes(textbuf *b, const char *notes)
{
	if (!notes) {
		tb_add(b, "null");
		return;
	}
	size_t n = strlen(notes);
	bool cut = n > EVENT_NOTES_MAX;
	if (cut) {
		n = EVENT_NOTES_MAX;
		while (n > 0 && ((unsigned char)notes[n] & 0xC0) == 0x80)
			n--;
	}
	tb_add(b, "\"");
	for (size_t i = 0; i < n; i++) {
		char c = notes[i];
		if (c == '\n')
			tb_add(b, "\\n");
		else if (c == '\t')
			tb_add(b, "\\t");
		else if (c == '"' || c == '\\')
			tb_add(b, "\\%c", c);
		else
			tb_add(b, "%c", c);
	}
	tb_add(b, "%s\"", cut ? "..." : "");
}

static bool str_eq(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

typedef struct job_change_ctx {
	const char *id;
	const store_job_change *c;
	enum job_state cur;
	bool seen;
	char *changed;
	int64_t t;
} job_change_ctx;

static int job_change_txn(store *s, void *ctx)
{
	job_change_ctx *x = ctx;
	const store_job_change *c = x->c;
	job_values v = {0};
	textbuf b = {0};
	int rc = store_found(store_sql_exec(s, "SELECT state, name, priority, "
					       "COALESCE(json_extract(spec_json, '$.tags'), '[]'), "
					       "json_extract(spec_json, '$.notes'), "
					       "COALESCE(json_extract(spec_json, '$.preemptible'), 0) FROM jobs WHERE id = ?1",
					    ARGS(ARG_TEXT(x->id)), job_values_row, &v), -ENOENT);
	if (rc < 0)
		goto out;
	x->cur = v.state;
	x->seen = true;
	if (job_state_is_terminal(v.state)) {
		rc = -EBUSY;
		goto out;
	}
	tb_add(&b, "changed by %s:", c->by ? c->by : "(unknown)");
	size_t head = b.len;
	if (c->set_priority && c->priority != v.priority)
		tb_add(&b, "%s priority %d -> %d", b.len > head ? ";" : "", v.priority, c->priority);
	if (c->name && !str_eq(c->name, v.name))
		tb_add(&b, "%s name \"%s\" -> \"%s\"", b.len > head ? ";" : "", v.name ? v.name : "",
		       c->name);
	if (c->tags_json && !str_eq(c->tags_json, v.tags))
		tb_add(&b, "%s tags %s -> %s", b.len > head ? ";" : "", v.tags, c->tags_json);
	if (c->set_notes && !str_eq(c->notes, v.notes)) {
		tb_add(&b, "%s notes ", b.len > head ? ";" : "");
		tb_notes(&b, v.notes);
		tb_add(&b, " -> ");
		tb_notes(&b, c->notes);
	}
	bool preemptible = c->set_preemptible && c->preemptible != v.preemptible;
	if (preemptible)
		tb_add(&b, "%s preemptible %s -> %s", b.len > head ? ";" : "", v.preemptible ? "true" : "false",
		       c->preemptible ? "true" : "false");
	if (b.oom) {
		rc = -ENOMEM;
		goto out;
	}
	if (b.len == head) /* every value as stored: nothing to write */
		goto out;
	const char *name = c->name ? c->name : v.name;
	int priority = c->set_priority ? c->priority : v.priority;
	const char *tags = c->tags_json ? c->tags_json : v.tags;
	const char *notes = c->set_notes ? c->notes : v.notes;
	/* json_set of a NULL is JSON null: cleared notes read as null */
	rc = store_found(store_sql_exec(s, "UPDATE jobs SET name = ?2, priority = ?3, updated_ms = ?6, "
					   "spec_json = json_set(spec_json, '$.name', ?2, '$.priority', ?3, "
					   "'$.tags', json(?4), '$.notes', ?5) WHERE id = ?1",
					ARGS(ARG_TEXT(x->id), ARG_TEXT(name), ARG_I64(priority), ARG_TEXT(tags),
					     ARG_TEXT(notes), ARG_I64(x->t)), NULL, NULL), -ENOENT);
	if (rc < 0)
		goto out;
	if (preemptible &&
	    (rc = store_found(store_sql_exec(s, "UPDATE jobs SET spec_json = json_set(spec_json, '$.preemptible', "
						"json(?2)) WHERE id = ?1",
					     ARGS(ARG_TEXT(x->id), ARG_TEXT(c->preemptible ? "true" : "false")), NULL,
					     NULL), -ENOENT)) < 0)
		goto out;
	store_job_touch(s, x->id);
	if ((rc = store_job_tags_sync(s, x->id)) < 0 ||
	    (rc = store_event_insert(s, x->id, x->t, v.state, v.state, b.p)) < 0)
		goto out;
	x->changed = b.p;
	b.p = NULL;
out:
	free(b.p);
	free(v.name);
	free(v.tags);
	free(v.notes);
	return rc;
}

int store_job_change_apply(store *s, const char *id, const store_job_change *c, char **changed,
			   enum job_state *cur)
{
	*changed = NULL;
	if (!id || !c)
		return -EINVAL;
	job_change_ctx x = {.id = id, .c = c, .t = store_now_ms()};
	int rc = store_in_txn(s, TXN_WRITE, job_change_txn, &x);
	if (cur && x.seen)
		*cur = x.cur;
	if (rc < 0) {
		free(x.changed);
		return rc;
	}
	*changed = x.changed;
	if (x.changed)
		log_info("job %s: %s", id, x.changed);
	return 0;
}
