/* store_datasets — the datasets table: a corpus prepared into token shards,
 * its state (preparing, ready, failed), progress and phase, and its stats.
 *
 * Must never: touch the shard files (the supervisor and bertd-prepare do),
 * or change a dataset that is no longer preparing (ready and failed are
 * final).
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ---- states ---- */

static const char *const dataset_state_names[DATASET_STATE_COUNT] = {
	[DATASET_PREPARING] = "preparing", [DATASET_READY] = "ready", [DATASET_FAILED] = "failed",
};

const char *dataset_state_name(enum dataset_state s)
{
	return (unsigned)s < DATASET_STATE_COUNT ? dataset_state_names[s] : "unknown";
}

int dataset_state_parse(const char *name, enum dataset_state *out)
{
	for (int i = 0; name && i < DATASET_STATE_COUNT; i++)
		if (strcmp(name, dataset_state_names[i]) == 0) {
			*out = (enum dataset_state)i;
			return 0;
		}
	return -EINVAL;
}

static int col_dataset_state(sqlite3_stmt *st, int col, enum dataset_state *out)
{
	const char *t = (const char *)sqlite3_column_text(st, col);
	if (dataset_state_parse(t, out) < 0) {
		log_error("store: unknown dataset state '%s' in the database", t ? t : "(null)");
		return -EIO;
	}
	return 0;
}

/* ---- datasets ---- */

#define DATASET_COLS "id, name, spec_json, state, bytes_done, bytes_total, stats_json, error, " \
		     "created_ms, updated_ms, phase, fraction"

void store_dataset_free(store_dataset *d)
{
	if (!d)
		return;
	free(d->id);
	free(d->name);
	free(d->spec_json);
	free(d->stats_json);
	free(d->error);
	free(d->phase);
	memset(d, 0, sizeof *d);
}

void store_datasets_free(store_dataset *ds, size_t n)
{
	for (size_t i = 0; ds && i < n; i++)
		store_dataset_free(&ds[i]);
	free(ds);
}

static void datasets_free_rows(void *arr, size_t n)
{
	store_datasets_free(arr, n);
}

/* One DATASET_COLS row into a store_dataset (a row_fn). */
static int dataset_read(sqlite3_stmt *st, void *dst)
{
	store_dataset *d = dst;
	int rc;
	memset(d, 0, sizeof *d);
	if ((rc = store_dup_col(st, 0, &d->id)) < 0 || (rc = store_dup_col(st, 1, &d->name)) < 0 ||
	    (rc = store_dup_col(st, 2, &d->spec_json)) < 0 ||
	    (rc = col_dataset_state(st, 3, &d->state)) < 0 ||
	    (rc = store_dup_col(st, 6, &d->stats_json)) < 0 ||
	    (rc = store_dup_col(st, 7, &d->error)) < 0 || (rc = store_dup_col(st, 10, &d->phase)) < 0)
		goto out;
	d->fraction = sqlite3_column_double(st, 11);
	d->bytes_done = sqlite3_column_int64(st, 4);
	d->bytes_total = sqlite3_column_int64(st, 5);
	d->created_ms = sqlite3_column_int64(st, 8);
	d->updated_ms = sqlite3_column_int64(st, 9);
out:
	if (rc < 0)
		store_dataset_free(d);
	return rc;
}

int store_dataset_insert(store *s, const store_dataset *ds)
{
	if (!ds || !ds->id || !ds->name || !ds->spec_json || ds->bytes_total < 0)
		return -EINVAL;
	/* phase "queued" until the supervisor starts its bertd-prepare */
	int rc = store_locked_exec(s, TXN_WRITE, "INSERT INTO datasets (id, name, spec_json, state, "
						 "bytes_total, created_ms, updated_ms, phase) "
						 "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, 'queued')",
				   ARGS(ARG_TEXT(ds->id), ARG_TEXT(ds->name), ARG_TEXT(ds->spec_json),
					ARG_TEXT(dataset_state_name(DATASET_PREPARING)),
					ARG_I64(ds->bytes_total), ARG_I64(store_now_ms())), NULL, NULL);
	return rc < 0 ? rc : 0;
}

int store_dataset_insert_ready(store *s, const store_dataset *ds, const char *stats_json)
{
	if (!ds || !ds->id || !ds->name || !ds->spec_json || !stats_json || ds->bytes_total < 0)
		return -EINVAL;
	/* ready from the start: the supervisor never sees it preparing */
	int rc = store_locked_exec(s, TXN_WRITE, "INSERT INTO datasets (id, name, spec_json, state, "
						 "bytes_done, bytes_total, stats_json, created_ms, updated_ms, "
						 "phase, fraction) "
						 "VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?7, 'done', 1.0)",
				   ARGS(ARG_TEXT(ds->id), ARG_TEXT(ds->name), ARG_TEXT(ds->spec_json),
					ARG_TEXT(dataset_state_name(DATASET_READY)), ARG_I64(ds->bytes_total),
					ARG_TEXT(stats_json), ARG_I64(store_now_ms())), NULL, NULL);
	return rc < 0 ? rc : 0;
}

static int dataset_get_where(store *s, const char *sql, const char *key, store_dataset *out)
{
	memset(out, 0, sizeof *out);
	if (!key)
		return -EINVAL;
	return store_found(store_locked_exec(s, TXN_NONE, sql, ARGS(ARG_TEXT(key)), dataset_read, out),
			   -ENOENT);
}

int store_dataset_get(store *s, const char *id, store_dataset *out)
{
	return dataset_get_where(s, "SELECT " DATASET_COLS " FROM datasets WHERE id = ?1", id, out);
}

int store_dataset_get_by_name(store *s, const char *name, store_dataset *out)
{
	return dataset_get_where(s, "SELECT " DATASET_COLS " FROM datasets WHERE name = ?1", name, out);
}

int store_dataset_list(store *s, store_dataset **out, size_t *n)
{
	rows r = ROWS(store_dataset, dataset_read, datasets_free_rows);
	int rc = store_locked_exec(s, TXN_NONE, "SELECT " DATASET_COLS " FROM datasets "
						"ORDER BY created_ms, rowid", NO_ARGS, store_rows_push, &r);
	*out = store_rows_take(&r, rc, n);
	return rc < 0 ? rc : 0;
}

static int dataset_state_row(sqlite3_stmt *st, void *out)
{
	return col_dataset_state(st, 0, out);
}

/* Inside a write transaction: -ENOENT, or -EBUSY unless preparing. */
static int dataset_check_preparing(store *s, const char *id)
{
	enum dataset_state ds;
	int rc = store_found(store_sql_exec(s, "SELECT state FROM datasets WHERE id = ?1",
					    ARGS(ARG_TEXT(id)), dataset_state_row, &ds), -ENOENT);
	if (rc < 0)
		return rc;
	return ds == DATASET_PREPARING ? 0 : -EBUSY;
}

/* An update of a dataset that is still preparing: ?1 is its id. */
typedef struct dataset_update {
	const char *sql;
	sqlarg args[5];
} dataset_update;

static int dataset_update_txn(store *s, void *ctx)
{
	dataset_update *u = ctx;
	int rc = dataset_check_preparing(s, u->args[0].text);
	if (rc < 0)
		return rc;
	rc = store_sql_exec(s, u->sql, u->args, sizeof u->args / sizeof u->args[0], NULL, NULL);
	return rc < 0 ? rc : 0;
}

int store_dataset_progress(store *s, const char *id, int64_t bytes_done, int64_t bytes_total,
			   const char *stats_json)
{
	if (!id || bytes_done < 0 || bytes_total < 0)
		return -EINVAL;
	dataset_update u = {
		.sql = "UPDATE datasets SET bytes_done = ?2, bytes_total = ?3, "
		       "stats_json = COALESCE(?4, stats_json), updated_ms = ?5 WHERE id = ?1",
		.args = {ARG_TEXT(id), ARG_I64(bytes_done), ARG_I64(bytes_total),
			 ARG_TEXT(stats_json), ARG_I64(store_now_ms())}};
	return store_in_txn(s, TXN_WRITE, dataset_update_txn, &u);
}

int store_dataset_phase(store *s, const char *id, const char *phase, double fraction)
{
	if (!id || !phase || !(fraction >= 0.0 && fraction <= 1.0))
		return -EINVAL;
	dataset_update u = {
		/* in millionths (sqlarg has no REAL), ?5 the whole */
		.sql = "UPDATE datasets SET phase = ?2, fraction = MIN(?3, ?5) / 1e6, "
		       "updated_ms = ?4 WHERE id = ?1",
		.args = {ARG_TEXT(id), ARG_TEXT(phase), ARG_I64((int64_t)(fraction * 1e6 + 0.5)),
			 ARG_I64(store_now_ms()), ARG_I64(1000000)}};
	return store_in_txn(s, TXN_WRITE, dataset_update_txn, &u);
}

int store_dataset_finish(store *s, const char *id, enum dataset_state to, const char *error,
			 const char *stats_json)
{
	if (!id || (to != DATASET_READY && to != DATASET_FAILED))
		return -EINVAL;
	dataset_update u = {
		.sql = "UPDATE datasets SET state = ?2, error = ?3, "
		       "stats_json = COALESCE(?4, stats_json), updated_ms = ?5 WHERE id = ?1",
		.args = {ARG_TEXT(id), ARG_TEXT(dataset_state_name(to)),
			 ARG_TEXT(to == DATASET_FAILED ? error : NULL), ARG_TEXT(stats_json),
			 ARG_I64(store_now_ms())}};
	return store_in_txn(s, TXN_WRITE, dataset_update_txn, &u);
}

static int dataset_delete_txn(store *s, void *ctx)
{
	const char *id = *(const char **)ctx;
	int rc = dataset_check_preparing(s, id);
	if (rc == 0)
		return -EBUSY; /* the prepare process is still writing its shards */
	if (rc != -EBUSY)
		return rc;
	rc = store_sql_exec(s, "DELETE FROM datasets WHERE id = ?1", ARGS(ARG_TEXT(id)), NULL, NULL);
	return rc < 0 ? rc : 0;
}

int store_dataset_delete(store *s, const char *id)
{
	if (!id)
		return -EINVAL;
	return store_in_txn(s, TXN_WRITE, dataset_delete_txn, &id);
}
