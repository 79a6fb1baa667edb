/* store_preempt — what preemption and cancels leave in the database for
 * the next daemon: the preemption holds (schema.sql, migration 9: a
 * preempted job waits in the queue until the job it was preempted for has
 * started; sv_preempt.c keeps them in memory and here, and a daemon that
 * starts reads them back), and who asked a running job to stop
 * (jobs.stop_by), for the event that ends it.
 *
 * Must never: decide whether a hold still stands (sv_preempt.c does), or
 * change a job's state but through store_job_transition's compare-and-set.
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int store_preempt_hold_put(store *s, const char *victim, const char *by)
{
	if (!victim || !by)
		return -EINVAL;
	/* A missing victim fails the foreign key: -ENOENT. */
	int rc = store_locked_exec(s, TXN_WRITE, "INSERT INTO preempt_holds (victim, by_job, created_ms) "
						  "VALUES (?1, ?2, ?3) ON CONFLICT (victim) DO UPDATE SET "
						  "by_job = excluded.by_job, created_ms = excluded.created_ms",
				   ARGS(ARG_TEXT(victim), ARG_TEXT(by), ARG_I64(store_now_ms())), NULL, NULL);
	return rc < 0 ? rc : 0;
}

int store_preempt_hold_drop(store *s, const char *victim)
{
	if (!victim)
		return -EINVAL;
	int rc = store_locked_exec(s, TXN_WRITE, "DELETE FROM preempt_holds WHERE victim = ?1",
				   ARGS(ARG_TEXT(victim)), NULL, NULL);
	return rc < 0 ? rc : 0;
}

static int hold_read(sqlite3_stmt *st, void *dst)
{
	store_preempt_hold *h = dst;
	memset(h, 0, sizeof *h);
	int rc = store_dup_col(st, 0, &h->victim);
	if (rc == 0 && (rc = store_dup_col(st, 1, &h->by)) < 0) {
		free(h->victim);
		h->victim = NULL;
	}
	return rc;
}

void store_preempt_holds_free(store_preempt_hold *h, size_t n)
{
	for (size_t i = 0; h && i < n; i++) {
		free(h[i].victim);
		free(h[i].by);
	}
	free(h);
}

static void holds_free_rows(void *arr, size_t n)
{
	store_preempt_holds_free(arr, n);
}

int store_preempt_holds(store *s, store_preempt_hold **out, size_t *n)
{
	rows r = ROWS(store_preempt_hold, hold_read, holds_free_rows);
	int rc = store_locked_exec(s, TXN_READ, "SELECT victim, by_job FROM preempt_holds ORDER BY created_ms, victim",
				   NO_ARGS, store_rows_push, &r);
	*out = store_rows_take(&r, rc, n);
	return rc < 0 ? rc : 0;
}

static int text_row(sqlite3_stmt *st, void *out)
{
	return store_dup_col(st, 0, out);
}

int store_job_stop_by(store *s, const char *id, char **by)
{
	*by = NULL;
	if (!id)
		return -EINVAL;
	int rc = store_found(store_locked_exec(s, TXN_READ, "SELECT stop_by FROM jobs WHERE id = ?1",
					       ARGS(ARG_TEXT(id)), text_row, by), -ENOENT);
	if (rc < 0) {
		free(*by);
		*by = NULL;
	}
	return rc;
}
