/* store — the job database (SQLite). The only module that contains SQL.
 *
 * One connection, serialized by an internal mutex, so API threads and the
 * daemon's event loop may call any function concurrently. Every write runs in
 * BEGIN IMMEDIATE ... COMMIT; a function that returns 0 after a write has
 * committed it (journal_mode=WAL, synchronous=FULL), so the data survives a
 * kill -9 or power loss right after. The schema is schema.sql, embedded at
 * build time and applied under PRAGMA user_version (migrations run forward).
 *
 * Times are Unix epoch milliseconds (int64); 0 means "not yet".
 * Errors are negative errno values: -ENOENT (no such row), -EEXIST
 * (idempotency key already used), -EBUSY (state does not allow it),
 * -ENOMEM, -EIO (SQLite failed; the message is logged).
 */
#ifndef BERTD_DAEMON_STORE_H
#define BERTD_DAEMON_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct store store;

enum job_state {
	JOB_QUEUED = 0,
	JOB_STARTING,
	JOB_RUNNING,
	JOB_RESTARTING,
	JOB_STOPPING,
	JOB_COMPLETED,
	JOB_FAILED,
	JOB_CANCELED,
	JOB_STATE_COUNT
};
#define JOB_MASK(s) (1u << (s))
#define JOB_MASK_TERMINAL (JOB_MASK(JOB_COMPLETED) | JOB_MASK(JOB_FAILED) | JOB_MASK(JOB_CANCELED))
#define JOB_MASK_ACTIVE (JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING) | \
			 JOB_MASK(JOB_RESTARTING) | JOB_MASK(JOB_STOPPING))

/* "queued", "starting", ... — static strings. */
const char *job_state_name(enum job_state s);
/* Returns 0 and sets *out, or -EINVAL for an unknown name. */
int job_state_parse(const char *name, enum job_state *out);
bool job_state_is_terminal(enum job_state s);

/* One row of the jobs table. Strings are heap-owned by the struct. */
typedef struct store_job {
	char *id;             /* "job-" + 16 hex chars, made by the caller */
	char *name;           /* user's name for it */
	char *spec_json;      /* full effective spec (compact JSON) */
	enum job_state state;
	int priority;         /* higher runs first */
	int restart_count;
	char *failure_reason; /* NULL unless failed */
	int64_t created_ms, updated_ms, started_ms, finished_ms;
	int64_t seq;          /* insertion order; basis of list cursors */
} store_job;

typedef struct store_event {
	int64_t time_ms;
	enum job_state from, to; /* from == to for a non-transition note */
	char *reason;
} store_event;

/* Opens (creating if needed) the database at path, applies pending
 * migrations. *out is caller-owned; free with store_close. */
int store_open(store **out, const char *path);
void store_close(store *s);
/* The schema version now in the file (PRAGMA user_version). */
int store_schema_version(store *s);

/* Inserts a queued job and its first event ("submitted") in one transaction.
 * job->id, name, spec_json, priority are used; times are set here.
 * If idem_key is non-NULL the key is recorded with idem_hash (hex digest of
 * the request) and response_json (the exact body answered with 201), so a
 * retry can be replayed. If the key exists already, nothing is written and
 * -EEXIST is returned with *prev_hash and *prev_response (caller frees) and
 * *prev_job_id (caller frees) filled, when those pointers are non-NULL. */
int store_job_insert(store *s, const store_job *job,
		     const char *idem_key, const char *idem_hash, const char *response_json,
		     char **prev_hash, char **prev_response, char **prev_job_id);

/* Loads one job. *out is filled (free with store_job_free); -ENOENT if none. */
int store_job_get(store *s, const char *id, store_job *out);
void store_job_free(store_job *j);
void store_jobs_free(store_job *jobs, size_t n);

/* Lists jobs in submission order, oldest first. state_mask = 0 means all
 * states, else a JOB_MASK() union. after_seq = 0 starts at the beginning;
 * otherwise only jobs with seq > after_seq. At most limit rows.
 * *out is a caller-owned array (store_jobs_free); *next_seq is the seq to
 * pass next time, or 0 when there are no more rows. */
int store_job_list(store *s, unsigned state_mask, int64_t after_seq, int limit,
		   store_job **out, size_t *n, int64_t *next_seq);

/* Compare-and-set state change: succeeds only if the job's current state is
 * in from_mask; writes the new state, updated/started/finished times,
 * failure_reason (when to == JOB_FAILED, may be NULL) and one job_events row,
 * all in one transaction. -ENOENT no job, -EBUSY state not in from_mask
 * (*cur, if non-NULL, gets the current state either way). */
int store_job_transition(store *s, const char *id, unsigned from_mask, enum job_state to,
			 const char *reason, enum job_state *cur);

/* Adds 1 to restart_count; returns the new count in *count. */
int store_job_bump_restarts(store *s, const char *id, int *count);

/* Deletes a job in a terminal state with its events. -EBUSY if not terminal. */
int store_job_delete(store *s, const char *id);

/* All events of a job, oldest first. *out caller-owned (store_events_free). */
int store_job_events(store *s, const char *id, store_event **out, size_t *n);
void store_events_free(store_event *ev, size_t n);

/* Counts jobs per state (counts[JOB_STATE_COUNT]). */
int store_job_counts(store *s, int64_t counts[JOB_STATE_COUNT]);

#endif
