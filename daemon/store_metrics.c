/* store_metrics — per-job training metrics (one row per logged step),
 * checkpoint records, and what a list page shows of each job beyond its row
 * (store_job_extras, read in one snapshot).
 *
 * Must never: write a job's metrics or checkpoints without stamping its
 * version, or touch checkpoint directories (only their rows).
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- metrics ---- */

int store_metric_insert(store *s, const char *job_id, int64_t step, int64_t time_ms,
			const char *values_json)
{
	if (!job_id || !values_json || step < 0)
		return -EINVAL;
	/* A missing job fails the foreign key, which store_sqlerr maps to -ENOENT. */
	int rc = store_job_write(s, job_id, "INSERT INTO job_metrics (job_id, step, time_ms, "
					    "values_json) VALUES (?1, ?2, ?3, ?4) "
					    "ON CONFLICT (job_id, step) DO UPDATE SET "
					    "time_ms = excluded.time_ms, values_json = excluded.values_json",
				 ARGS(ARG_TEXT(job_id), ARG_I64(step), ARG_I64(time_ms),
				      ARG_TEXT(values_json)));
	return rc < 0 ? rc : 0;
}

void store_metrics_free(store_metric *m, size_t n)
{
	for (size_t i = 0; m && i < n; i++)
		free(m[i].values_json);
	free(m);
}

static void metrics_free_rows(void *arr, size_t n)
{
	store_metrics_free(arr, n);
}

/* step, time_ms, values_json into a store_metric (a row_fn). */
static int metric_read(sqlite3_stmt *st, void *dst)
{
	store_metric *m = dst;
	m->step = sqlite3_column_int64(st, 0);
	m->time_ms = sqlite3_column_int64(st, 1);
	return store_dup_col(st, 2, &m->values_json);
}

int store_metric_latest(store *s, const char *job_id, store_metric *out)
{
	memset(out, 0, sizeof *out);
	if (!job_id)
		return -EINVAL;
	return store_found(store_locked_exec(s, TXN_READ,
					     "SELECT step, time_ms, values_json FROM job_metrics "
					     "WHERE job_id = ?1 ORDER BY step DESC LIMIT 1",
					     ARGS(ARG_TEXT(job_id)), metric_read, out), -ENOENT);
}

int store_metric_eval(store *s, const char *job_id, store_metric *last, store_metric *best)
{
	memset(last, 0, sizeof *last);
	memset(best, 0, sizeof *best);
	if (!job_id)
		return -EINVAL;
	/* rows where the worker reported a held-out evaluation (worker/eval.c) */
	int rc = store_found(store_locked_exec(s, TXN_READ,
					       "SELECT step, time_ms, values_json FROM job_metrics "
					       "WHERE job_id = ?1 AND json_extract(values_json, '$.eval_loss') "
					       "IS NOT NULL ORDER BY step DESC LIMIT 1",
					       ARGS(ARG_TEXT(job_id)), metric_read, last), -ENOENT);
	if (rc == 0)
		rc = store_found(store_locked_exec(s, TXN_READ,
						    "SELECT step, time_ms, values_json FROM job_metrics "
						    "WHERE job_id = ?1 AND json_extract(values_json, '$.eval_loss') "
						    "IS NOT NULL ORDER BY json_extract(values_json, '$.eval_loss'), "
						    "step LIMIT 1",
						    ARGS(ARG_TEXT(job_id)), metric_read, best), -ENOENT);
	if (rc < 0) {
		free(last->values_json);
		free(best->values_json);
		memset(last, 0, sizeof *last);
		memset(best, 0, sizeof *best);
	}
	return rc;
}

/* The query of store_metric_list / store_metric_tail: ?1 job, ?2 since, ?3 limit. */
static int metric_query(store *s, const char *sql, const char *job_id, int64_t since_step, int limit,
			store_metric **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (!job_id || limit < 1)
		return -EINVAL;
	job_rows q = {.job_id = job_id, .sql = sql, .r = ROWS(store_metric, metric_read, metrics_free_rows),
		      .args = {ARG_TEXT(job_id), ARG_I64(since_step), ARG_I64(limit)}, .nargs = 3};
	int rc = store_in_txn(s, TXN_READ, store_job_rows_txn, &q);
	*out = store_rows_take(&q.r, rc, n);
	return rc < 0 ? rc : 0;
}

int store_metric_list(store *s, const char *job_id, int64_t since_step, int limit,
		      store_metric **out, size_t *n)
{
	return metric_query(s, "SELECT step, time_ms, values_json FROM job_metrics "
			       "WHERE job_id = ?1 AND step > ?2 ORDER BY step LIMIT ?3",
			    job_id, since_step, limit, out, n);
}

int store_metric_tail(store *s, const char *job_id, int limit, store_metric **out, size_t *n)
{
	return metric_query(s, "SELECT step, time_ms, values_json FROM (SELECT * FROM job_metrics "
			       "WHERE job_id = ?1 AND step > ?2 ORDER BY step DESC LIMIT ?3) ORDER BY step",
			    job_id, -1, limit, out, n);
}

/* ---- checkpoints ---- */

int store_checkpoint_insert(store *s, const char *job_id, const store_checkpoint *c)
{
	if (!job_id || !c || !c->path || c->step < 0 || c->bytes < 0)
		return -EINVAL;
	/* A missing job fails the foreign key (-ENOENT), a recorded step the
	 * primary key (-EEXIST). */
	int rc = store_job_write(s, job_id, "INSERT INTO job_checkpoints (job_id, step, path, bytes, "
					    "created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
				 ARGS(ARG_TEXT(job_id), ARG_I64(c->step), ARG_TEXT(c->path),
				      ARG_I64(c->bytes), ARG_I64(store_now_ms())));
	return rc < 0 ? rc : 0;
}

void store_checkpoints_free(store_checkpoint *c, size_t n)
{
	for (size_t i = 0; c && i < n; i++)
		free(c[i].path);
	free(c);
}

static void checkpoints_free_rows(void *arr, size_t n)
{
	store_checkpoints_free(arr, n);
}

static int checkpoint_read(sqlite3_stmt *st, void *dst)
{
	store_checkpoint *c = dst;
	c->step = sqlite3_column_int64(st, 0);
	c->bytes = sqlite3_column_int64(st, 2);
	c->created_ms = sqlite3_column_int64(st, 3);
	return store_dup_col(st, 1, &c->path);
}

int store_checkpoint_list(store *s, const char *job_id, store_checkpoint **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (!job_id)
		return -EINVAL;
	job_rows q = {.job_id = job_id, .r = ROWS(store_checkpoint, checkpoint_read, checkpoints_free_rows),
		      .sql = "SELECT step, path, bytes, created_ms FROM job_checkpoints "
			     "WHERE job_id = ?1 ORDER BY step",
		      .args = {ARG_TEXT(job_id)}, .nargs = 1};
	int rc = store_in_txn(s, TXN_READ, store_job_rows_txn, &q);
	*out = store_rows_take(&q.r, rc, n);
	return rc < 0 ? rc : 0;
}

int store_checkpoint_delete(store *s, const char *job_id, int64_t step)
{
	if (!job_id)
		return -EINVAL;
	/* No row changed: no such job or step. */
	return store_found(store_job_write(s, job_id, "DELETE FROM job_checkpoints "
						      "WHERE job_id = ?1 AND step = ?2",
					   ARGS(ARG_TEXT(job_id), ARG_I64(step))), -ENOENT);
}

/* ---- what a job's representation shows beyond its row ---- */

/* One statement of store_job_extras, prepared once and run once per job. */
static int extras_stmt(store *s, sqlite3_stmt *st, const char *sql, const char *job_id,
		       int64_t limit, row_fn *row, void *ctx)
{
	sqlite3_reset(st);
	int rc = store_sqlerr(s, sqlite3_bind_text(st, 1, job_id, -1, SQLITE_STATIC), sql);
	if (rc == 0 && limit > 0)
		rc = store_sqlerr(s, sqlite3_bind_int64(st, 2, limit), sql);
	while (rc == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW)
		rc = row(st, ctx);
	if (rc == SQLITE_DONE)
		return 0;
	return rc < 0 ? rc : store_sqlerr(s, rc, sql);
}

typedef struct extras_query {
	const store_job *jobs;
	size_t n;
	int window;
	store_job_extras *out;
} extras_query;

static int extras_txn(store *s, void *ctx)
{
	static const char *const sql[] = {
		"SELECT step, time_ms, values_json FROM (SELECT step, time_ms, values_json "
		"FROM job_metrics WHERE job_id = ?1 ORDER BY step DESC LIMIT ?2) ORDER BY step",
		"SELECT step, time_ms, values_json FROM job_metrics WHERE job_id = ?1 "
		"ORDER BY step LIMIT 1",
		"SELECT step, path, bytes, created_ms FROM job_checkpoints WHERE job_id = ?1 "
		"ORDER BY step DESC LIMIT 1",
	};
	enum { TAIL, FIRST, CKPT, NSQL };
	extras_query *q = ctx;
	sqlite3_stmt *st[NSQL] = {0};
	int rc = 0;
	for (int k = 0; rc == 0 && k < NSQL; k++)
		rc = store_sqlerr(s, sqlite3_prepare_v2(s->db, sql[k], -1, &st[k], NULL), sql[k]);
	for (size_t i = 0; rc == 0 && i < q->n; i++) {
		store_job_extras *x = &q->out[i];
		const char *id = q->jobs[i].id;
		rows t = ROWS(store_metric, metric_read, metrics_free_rows);
		rows f = ROWS(store_metric, metric_read, metrics_free_rows);
		rows c = ROWS(store_checkpoint, checkpoint_read, checkpoints_free_rows);
		rc = extras_stmt(s, st[TAIL], sql[TAIL], id, q->window, store_rows_push, &t);
		if (rc == 0)
			rc = extras_stmt(s, st[FIRST], sql[FIRST], id, 0, store_rows_push, &f);
		if (rc == 0)
			rc = extras_stmt(s, st[CKPT], sql[CKPT], id, 0, store_rows_push, &c);
		x->tail = store_rows_take(&t, rc, &x->n_tail);
		x->first = store_rows_take(&f, rc, &x->n_first);
		x->last_checkpoint = store_rows_take(&c, rc, &x->n_checkpoint);
	}
	for (int k = 0; k < NSQL; k++)
		sqlite3_finalize(st[k]);
	return rc;
}

int store_job_extras_get(store *s, const store_job *jobs, size_t n, int window,
			 store_job_extras **out)
{
	*out = NULL;
	if (window < 1 || (n > 0 && !jobs))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!jobs[i].id)
			return -EINVAL;
	store_job_extras *x = calloc(n ? n : 1, sizeof *x);
	if (!x)
		return -ENOMEM;
	extras_query q = {.jobs = jobs, .n = n, .window = window, .out = x};
	int rc = n ? store_in_txn(s, TXN_READ, extras_txn, &q) : 0;
	if (rc < 0) {
		store_job_extras_free(x, n);
		return rc;
	}
	*out = x;
	return 0;
}

void store_job_extras_free(store_job_extras *x, size_t n)
{
	for (size_t i = 0; x && i < n; i++) {
		store_metrics_free(x[i].tail, x[i].n_tail);
		store_metrics_free(x[i].first, x[i].n_first);
		store_checkpoints_free(x[i].last_checkpoint, x[i].n_checkpoint);
	}
	free(x);
}
