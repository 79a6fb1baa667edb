/* store_check — is the database file sound, and a consistent copy of it:
 * PRAGMA quick_check on the open handle, and the online backup
 * (bertd backup) of a file another bertd may be writing.
 *
 * Must never: write to the source database, or leave a copy at dst_path
 * that failed integrity_check (it is checked beside it, then linked).
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

typedef struct check_rows {
	char *why;
	size_t cap;
	int n;
} check_rows;

/* Keeps the first row of an integrity or quick check ("ok" when sound). */
static int check_row(sqlite3_stmt *st, void *ctx)
{
	check_rows *c = ctx;
	const char *t = (const char *)sqlite3_column_text(st, 0);
	if (c->n++ == 0)
		snprintf(c->why, c->cap, "%s", t ? t : "");
	return 0;
}

int store_quick_check(store *s, char *why, size_t cap)
{
	check_rows c = {.why = why, .cap = cap};
	why[0] = 0;
	int rc = store_locked_exec(s, TXN_NONE, "PRAGMA quick_check", NO_ARGS, check_row, &c);
	if (rc == STORE_E_DAMAGED && !why[0])
		snprintf(why, cap, "%s", sqlite3_errstr(SQLITE_CORRUPT));
	if (rc < 0)
		return rc;
	if (c.n == 1 && strcmp(why, "ok") == 0)
		return 0;
	if (c.n > 1) {
		size_t len = strlen(why);
		snprintf(why + len, cap - len, " (and %d more problem%s)", c.n - 1, c.n > 2 ? "s" : "");
	}
	if (!atomic_exchange(s->damaged, true))
		log_error("store: quick_check found the database file damaged: %s", why);
	return STORE_E_DAMAGED;
}

/* First row of a check, for sqlite3_exec. */
static int backup_check_row(void *ctx, int ncol, char **val, char **name)
{
	(void)name;
	check_rows *c = ctx;
	if (c->n++ == 0)
		snprintf(c->why, c->cap, "%s", ncol > 0 && val[0] ? val[0] : "");
	return 0;
}

int store_backup(const char *src_path, const char *dst_path, char *why, size_t cap)
{
	sqlite3 *src = NULL, *dst = NULL;
	char tmp[PATH_MAX + 32];
	int rc = 0, src_rc;
	why[0] = 0;
	if (!src_path || !dst_path)
		return -EINVAL;
	if (access(dst_path, F_OK) == 0) {
		snprintf(why, cap, "%s exists; a backup never replaces a file", dst_path);
		return -EEXIST;
	}
	if (access(src_path, F_OK) != 0) {
		snprintf(why, cap, "no database at %s: %s", src_path, strerror(errno));
		return -ENOENT;
	}
	snprintf(tmp, sizeof tmp, "%s.tmp-%ld", dst_path, (long)getpid());
	/* Read-write without create: a read-only connection to a WAL database
	 * cannot always open the -shm the daemon owns. Nothing is written. */
	src_rc = sqlite3_open_v2(src_path, &src, SQLITE_OPEN_READWRITE, NULL);
	if (src_rc == SQLITE_OK) {
		sqlite3_extended_result_codes(src, 1);
		sqlite3_busy_timeout(src, STORE_WAIT_MS_DEFAULT);
		src_rc = sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
		if (src_rc != SQLITE_OK) {
			snprintf(why, cap, "cannot create %s: %s", tmp,
				 dst ? sqlite3_errmsg(dst) : sqlite3_errstr(src_rc));
			rc = store_db_errno(dst, src_rc);
			goto out;
		}
	} else {
		snprintf(why, cap, "cannot open %s: %s", src_path,
			 src ? sqlite3_errmsg(src) : sqlite3_errstr(src_rc));
		rc = store_db_errno(src, src_rc);
		goto out;
	}
	/* All pages in one step: one read transaction, so one snapshot of the
	 * database and its WAL, however the daemon writes meanwhile. */
	sqlite3_backup *bk = sqlite3_backup_init(dst, "main", src, "main");
	if (!bk) {
		snprintf(why, cap, "backup of %s: %s", src_path, sqlite3_errmsg(dst));
		rc = store_db_errno(dst, sqlite3_extended_errcode(dst));
		goto out;
	}
	int step = sqlite3_backup_step(bk, -1);
	int fin = sqlite3_backup_finish(bk);
	if (step != SQLITE_DONE || fin != SQLITE_OK) {
		int e = step != SQLITE_DONE ? step : fin;
		snprintf(why, cap, "backup of %s: %s", src_path, sqlite3_errstr(e));
		rc = store_db_errno(src, e);
		goto out;
	}
	check_rows c = {.why = why, .cap = cap};
	int crc = sqlite3_exec(dst, "PRAGMA integrity_check", backup_check_row, &c, NULL);
	if (crc != SQLITE_OK || c.n != 1 || strcmp(why, "ok") != 0) {
		char first[512];
		snprintf(first, sizeof first, "%s", crc != SQLITE_OK ? sqlite3_errmsg(dst) : why);
		snprintf(why, cap, "the copy of %s fails integrity_check (%s): the source is "
			 "damaged; restore an older backup or run sqlite3 .recover", src_path, first);
		rc = crc != SQLITE_OK ? store_db_errno(dst, crc) : STORE_E_DAMAGED;
		goto out;
	}
	why[0] = 0;
out:
	sqlite3_close(src);
	/* the last close folds the copy's WAL into it: one self-contained file */
	if (dst && sqlite3_close(dst) != SQLITE_OK && rc == 0) {
		snprintf(why, cap, "closing %s: %s", tmp, sqlite3_errmsg(dst));
		rc = -EIO;
	}
	if (rc == 0 && link(tmp, dst_path) != 0) {
		rc = -errno;
		snprintf(why, cap, "cannot create %s: %s", dst_path, strerror(errno));
	}
	if (dst || access(tmp, F_OK) == 0)
		unlink(tmp);
	return rc;
}
