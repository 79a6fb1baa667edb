/* store_queue — the queue as the scheduler reads it: the rows of queued and
 * restarting jobs that changed since a revision of the sched_clock
 * (schema.sql, migration 8), so a scheduling pass reads what changed and not
 * the whole queue with every job's spec.
 *
 * Must never: write (the triggers of migration 8 keep the revisions; this
 * file only reads them), or hand out a spec of a job that is not queued or
 * restarting.
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define QUEUE_COLS "seq, id, state, priority, runtime_ms, " \
		   "CASE WHEN state IN ('queued', 'restarting') THEN spec_json END"

static int queue_read(sqlite3_stmt *st, void *dst)
{
	store_queue_row *q = dst;
	int rc;
	memset(q, 0, sizeof *q);
	q->seq = sqlite3_column_int64(st, 0);
	const char *state = (const char *)sqlite3_column_text(st, 2);
	if (job_state_parse(state, &q->state) < 0)
		return -EIO;
	if ((rc = store_dup_col(st, 1, &q->id)) < 0 || (rc = store_dup_col(st, 5, &q->spec_json)) < 0) {
		free(q->id);
		memset(q, 0, sizeof *q);
		return rc;
	}
	q->priority = sqlite3_column_int(st, 3);
	q->runtime_ms = sqlite3_column_int64(st, 4);
	return 0;
}

void store_queue_rows_free(store_queue_row *r, size_t n)
{
	for (size_t i = 0; r && i < n; i++) {
		free(r[i].id);
		free(r[i].spec_json);
	}
	free(r);
}

static void queue_free_rows(void *arr, size_t n)
{
	store_queue_rows_free(arr, n);
}

typedef struct queue_read_ctx {
	int64_t since;
	bool full;
	int64_t rev;
	rows r;
} queue_read_ctx;

static int clock_row(sqlite3_stmt *st, void *ctx)
{
	int64_t *v = ctx;
	v[0] = sqlite3_column_int64(st, 0);
	v[1] = sqlite3_column_int64(st, 1);
	return 0;
}

/* One snapshot: the clock, then the rows it covers. */
static int queue_txn(store *s, void *ctx)
{
	queue_read_ctx *c = ctx;
	int64_t clk[2] = {0, 0};
	int rc = store_found(store_sql_exec(s, "SELECT rev, reload_rev FROM sched_clock WHERE id = 1",
					    NO_ARGS, clock_row, clk), -EIO);
	if (rc < 0)
		return rc;
	c->rev = clk[0];
	/* since 0, a clock behind since (another database), or a queued row
	 * deleted after since: the caller's view cannot be patched */
	c->full = c->since <= 0 || clk[0] < c->since || clk[1] > c->since;
	if (c->full)
		return store_sql_exec(s, "SELECT " QUEUE_COLS " FROM jobs WHERE state IN ('queued', 'restarting') "
					 "ORDER BY seq", NO_ARGS, store_rows_push, &c->r);
	if (clk[0] == c->since)
		return 0;
	/* INDEXED BY: without it the planner walks the table in seq order to
	 * spare the sort, reading every row for the few that changed */
	return store_sql_exec(s, "SELECT " QUEUE_COLS " FROM jobs INDEXED BY jobs_sched_rev WHERE sched_rev > ?1 "
				 "ORDER BY seq",
			      ARGS(ARG_I64(c->since)), store_rows_push, &c->r);
}

int store_queue_changes(store *s, int64_t since_rev, store_queue_row **out, size_t *n, bool *full,
			int64_t *rev)
{
	*out = NULL;
	*n = 0;
	*full = false;
	queue_read_ctx c = {.since = since_rev, .r = ROWS(store_queue_row, queue_read, queue_free_rows)};
	int rc = store_in_txn(s, TXN_READ, queue_txn, &c);
	*out = store_rows_take(&c.r, rc, n);
	if (rc < 0)
		return rc;
	*full = c.full;
	*rev = c.rev;
	return 0;
}
