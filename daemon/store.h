/* store — the job database (SQLite). The only module that contains SQL.
 *
 * One connection for writes, serialized by an internal mutex, and a few
 * read connections (each with its own mutex; WAL lets them read the last
 * commit while a write is under way), so API threads and the daemon's event
 * loop may call any function concurrently and a read never waits for a
 * commit. Every write runs in BEGIN IMMEDIATE ... COMMIT; a function that
 * returns 0 after a write has committed it (journal_mode=WAL,
 * synchronous=FULL), so the data survives a kill -9 or power loss right
 * after. Job submissions commit in groups (store_job_insert). The schema is schema.sql, embedded at
 * build time and applied under PRAGMA user_version (migrations run forward).
 *
 * Times are Unix epoch milliseconds (int64); 0 means "not yet".
 * Errors are negative errno values: -ENOENT (no such row), -EEXIST
 * (idempotency key already used), -EBUSY (state does not allow it),
 * -ENOMEM, and for the database itself (the message is logged):
 *   STORE_E_LOCKED  (-EAGAIN)  another connection held the lock past this
 *                              handle's wait; nothing was written, retry
 *   STORE_E_FULL    (-ENOSPC)  the disk (or max_page_count) is full
 *   STORE_E_DAMAGED (-EUCLEAN) the file is damaged (SQLITE_CORRUPT/NOTADB);
 *                              from then on every write is refused with it
 *                              and store_damaged() is true
 *   -EIO                       any other SQLite failure.
 */
#ifndef BERTD_DAEMON_STORE_H
#define BERTD_DAEMON_STORE_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct store store;

#define STORE_E_LOCKED (-EAGAIN)
#define STORE_E_FULL (-ENOSPC)
#define STORE_E_DAMAGED (-EUCLEAN)
/* How long the handle from store_open waits for a lock another process holds. */
#define STORE_WAIT_MS_DEFAULT 5000

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
	char *devices_json;   /* devices of the current/last run, JSON array; NULL before */
	char *stall_json;     /* the rank the stall watch suspects, {"rank", "since_ms" (epoch ms of
			       * its last message), "limit_s", "stopped"}; NULL when none */
	char *outcome_json;   /* {"export": {"step", "source"}, "best_model": {"step", "metric",
			       * "value"}} as far as known; NULL before either */
	int64_t runtime_ms;   /* wall time of the job's attempts so far (max_runtime_seconds) */
	char *owner;          /* who submitted it: the name of the API token its request
			       * carried ("default": the one shared token); NULL unknown */
	uint64_t version;     /* set by store_job_get/list: two equal non-zero values mean
			       * nothing of this job (row, metrics, checkpoints) was written
			       * in between (a cache key; a write to another job may change
			       * it too); 0: a write was committing as it was read, no key */
} store_job;

typedef struct store_event {
	int64_t time_ms;
	enum job_state from, to; /* from == to for a non-transition note */
	char *reason;
} store_event;

/* Opens (creating if needed) the database at path, applies pending
 * migrations. *out is caller-owned; free with store_close. -EPROTO if the
 * file's schema is newer than this build knows (nothing is changed),
 * STORE_E_DAMAGED if it is not a database (or its first pages are damaged;
 * store_quick_check finds damage elsewhere), -EIO if it cannot be opened or
 * WAL mode is unavailable. */
int store_open(store **out, const char *path);
/* Closes the connection; NULL is a no-op. No call may be in flight. On a
 * handle from store_view, frees only the view (close views first). */
void store_close(store *s);
/* A second handle on s's connection (same mutex, same data) whose calls wait
 * at most wait_ms (>= 1) in all — for the other callers of this process and
 * for another process's lock — before failing with STORE_E_LOCKED. The API
 * uses one so a locked database fails fast while the daemon's own writes
 * keep the longer STORE_WAIT_MS_DEFAULT. *out is caller-owned (store_close,
 * before s). -EINVAL, -ENOMEM. */
int store_view(store **out, store *s, int wait_ms);
/* True once any statement found the file damaged (STORE_E_DAMAGED); never
 * cleared. Reads no database, takes no lock. */
bool store_damaged(const store *s);
/* PRAGMA quick_check: 0 when the file is sound; STORE_E_DAMAGED (and
 * store_damaged() becomes true) with SQLite's first complaint in why,
 * otherwise another negative error. O(size of the file). */
int store_quick_check(store *s, char *why, size_t cap);
/* Copies the database at src_path, WAL included, into a new file dst_path
 * with the SQLite online backup API: one read snapshot, so the copy is
 * consistent while a daemon writes to src_path. The copy is written beside
 * dst_path, checked with PRAGMA integrity_check and then linked into place;
 * an existing dst_path is never replaced (-EEXIST). why gets a one-line
 * reason on failure. -ENOENT no src_path, STORE_E_LOCKED, STORE_E_FULL,
 * STORE_E_DAMAGED (source or copy fails the check), -EIO. */
int store_backup(const char *src_path, const char *dst_path, char *why, size_t cap);
/* The schema version now in the file (PRAGMA user_version), or -EIO. */
int store_schema_version(store *s);
/* The latest schema version this build knows (the last migration). */
int store_schema_latest(void);

/* Inserts a queued job and its first event ("submitted") in one transaction.
 * job->id, name, spec_json, priority and owner are used (and spec_json's
 * "tags" fill the tag index); created_ms too when non-zero
 * (so the API's 201 body and later reads agree), else now; other times
 * are set here.
 * If idem_key is non-NULL the key is recorded with idem_hash (hex digest of
 * the request) and response_json (the exact body answered with 201), so a
 * retry can be replayed. If the key exists already, nothing is written and
 * -EEXIST is returned with *prev_hash and *prev_response (caller frees) and
 * *prev_job_id (caller frees) filled, when those pointers are non-NULL.
 * The prev pointers are set to NULL first, so -EEXIST with them still NULL
 * means the job id itself is taken. -EINVAL if id, name or spec_json is
 * NULL, or idem_key is given without idem_hash and response_json. */
int store_job_insert(store *s, const store_job *job,
		     const char *idem_key, const char *idem_hash, const char *response_json,
		     char **prev_hash, char **prev_response, char **prev_job_id);
/* store_job_insert commits in groups: inserts of concurrent callers are
 * written in one transaction (one fsync), and each call returns only after
 * the commit that holds its rows (0), or with the error that failed the
 * group's transaction (every member of a failed group gets it; none of its
 * rows is kept). -EEXIST (key or id taken) stays a member's own result. */

/* One insert of store_job_insert_group: the arguments of store_job_insert,
 * and its result (rc, and the prevs as store_job_insert fills them). */
typedef struct store_insert {
	const store_job *job;
	const char *idem_key, *idem_hash, *response_json;
	int rc;
	char *prev_hash, *prev_response, *prev_job_id; /* caller frees */
} store_insert;
/* The callback of store_job_insert_async: ins->rc and the prevs are set. */
typedef void store_insert_done(store_insert *ins, void *arg);
/* store_job_insert without waiting: queues *ins (which, with the strings it
 * points at, must stay valid until done) for the next group commit and
 * returns 0; done(ins, arg) is then called exactly once, on the store's
 * commit thread, after the commit that holds the job (ins->rc 0) or with
 * the error that failed it; it must not block for long (it holds up the
 * next group). Returns -EINVAL (bad arguments) or -ENOMEM without queueing
 * (done is never called). store_close waits for queued inserts. */
int store_job_insert_async(store *s, store_insert *ins, store_insert_done *done, void *arg);
/* The group commit itself, for n inserts given at once: one transaction.
 * Returns 0 when every valid member got 0 or -EEXIST, else the error that
 * failed the transaction (then every valid member's rc is it). A member
 * with bad arguments gets -EINVAL alone. */
int store_job_insert_group(store *s, store_insert *ins, size_t n);

/* Loads one job. *out is filled (free with store_job_free); -ENOENT if none
 * (*out is then zeroed). */
int store_job_get(store *s, const char *id, store_job *out);
/* Frees the strings of *j and zeroes it (the struct itself is the caller's);
 * NULL is a no-op. */
void store_job_free(store_job *j);
/* Frees an array from store_job_list: each element, then the array. */
void store_jobs_free(store_job *jobs, size_t n);

/* Lists jobs in submission order, oldest first. state_mask = 0 means all
 * states, else a JOB_MASK() union. after_seq = 0 starts at the beginning;
 * otherwise only jobs with seq > after_seq. At most limit rows (limit >= 1,
 * else -EINVAL).
 * *out is a caller-owned array (store_jobs_free); *next_seq is the seq to
 * pass next time, or 0 when there are no more rows. */
int store_job_list(store *s, unsigned state_mask, int64_t after_seq, int limit,
		   store_job **out, size_t *n, int64_t *next_seq);
/* store_job_list newest first: jobs with seq < before_seq (0: from the
 * newest), in descending seq; *next_seq is the before_seq of the next page,
 * or 0 when there are no more rows. */
int store_job_list_newest(store *s, unsigned state_mask, int64_t before_seq, int limit,
			  store_job **out, size_t *n, int64_t *next_seq);

/* What GET /v1/jobs?tag=&owner= keeps: a state_mask as store_job_list's,
 * and when non-NULL one tag the job carries (spec_json's "tags") and its
 * owner. */
typedef struct store_job_filter {
	unsigned state_mask;
	const char *tag;
	const char *owner;
} store_job_filter;
/* store_job_list (newest false: seq > seq_bound, oldest first) or
 * store_job_list_newest (newest true) of the jobs f keeps (f NULL: all).
 * A tag filter walks the tag's index in seq order, so a page costs its
 * rows, not the table. Errors as store_job_list. */
int store_job_list_filtered(store *s, const store_job_filter *f, int64_t seq_bound, bool newest,
			    int limit, store_job **out, size_t *n, int64_t *next_seq);

/* store_job_list_filtered reading only seq, id, state and version of each
 * job (the other members NULL or 0): the page's keys, for a caller that
 * keeps what it made of each job by version. */
int store_job_list_keys(store *s, const store_job_filter *f, int64_t seq_bound, bool newest, int limit,
			store_job **out, size_t *n, int64_t *next_seq);

/* The jobs' revision: a number that moves whenever any job's data (row,
 * metrics, checkpoints, events' state changes, inserts, deletes) is
 * written, by this process or (seen at this call: PRAGMA data_version)
 * another. Two equal revisions read from s mean that no job was written
 * in between, so anything made from reads that began at revision r is
 * still exact while store_jobs_revision() == r. Takes no lock it waits
 * for (a write under way checks for other processes itself). */
uint64_t store_jobs_revision(store *s);

/* A change of a job after submit (PATCH /v1/jobs/{id}): each member given
 * replaces the stored value, in the row (name, priority) and in spec_json
 * alike ("name", "priority", "tags", "notes"; "preemptible" in spec_json
 * only); the caller has validated them (jobspec_check_key). */
typedef struct store_job_change {
	const char *name;      /* NULL: unchanged */
	bool set_priority;
	int priority;
	const char *tags_json; /* compact JSON array of tag strings; NULL: unchanged */
	bool set_notes;
	const char *notes;     /* with set_notes: the new notes, NULL clears them */
	bool set_preemptible;
	bool preemptible;      /* with set_preemptible: spec_json's "preemptible" */
	const char *by;        /* who asks (a token's name), NULL unknown; for the event */
} store_job_change;
/* Applies c to a job that is not finished, in one transaction with one
 * event (from == to == its state) whose reason says what changed, old ->
 * new, and by whom: "changed by default: priority 0 -> 5; tags [] ->
 * [\"x\"]". *changed (caller frees) gets that reason, or NULL when every
 * value given equals the stored one (then nothing is written). -ENOENT no
 * job, -EBUSY the job is completed, failed or canceled (nothing written;
 * *cur, if non-NULL, gets its state either way), -EINVAL bad arguments. */
int store_job_change_apply(store *s, const char *id, const store_job_change *c, char **changed,
			   enum job_state *cur);

/* Compare-and-set state change: succeeds only if the job's current state is
 * in from_mask; writes the new state, updated/started/finished times,
 * failure_reason (when to == JOB_FAILED, may be NULL) and one job_events row,
 * all in one transaction. started_ms is set on the first move into running,
 * finished_ms on entering a terminal state; failure_reason is kept only in
 * failed. -ENOENT no job, -EBUSY state not in from_mask (nothing written;
 * *cur, if non-NULL, gets the state before the call either way). */
int store_job_transition(store *s, const char *id, unsigned from_mask, enum job_state to,
			 const char *reason, enum job_state *cur);

/* store_job_transition to JOB_STOPPING (from a state in from_mask) that
 * also records who asked (by: a token's name, NULL unknown) for
 * store_job_stop_by, in the same transaction. Errors as
 * store_job_transition's. */
int store_job_stop_request(store *s, const char *id, unsigned from_mask, const char *by, const char *reason,
			   enum job_state *cur);
/* Who asked for job id's stop (store_job_stop_request): 0 with *by (caller
 * frees; NULL when nobody was recorded), -ENOENT no job, a store error. */
int store_job_stop_by(store *s, const char *id, char **by);

/* A preemption hold (schema.sql, migration 9): job victim waits in the
 * queue until job by has started. Strings heap-owned. */
typedef struct store_preempt_hold {
	char *victim, *by;
} store_preempt_hold;
/* Records (or replaces) victim's hold. -ENOENT no job victim. */
int store_preempt_hold_put(store *s, const char *victim, const char *by);
/* Forgets victim's hold (none: a no-op, 0). */
int store_preempt_hold_drop(store *s, const char *victim);
/* Every hold, oldest first: *out caller-owned (store_preempt_holds_free). */
int store_preempt_holds(store *s, store_preempt_hold **out, size_t *n);
void store_preempt_holds_free(store_preempt_hold *h, size_t n);

/* Records the devices a job was started on (JSON array text; NULL clears).
 * -ENOENT no job. */
int store_job_set_devices(store *s, const char *id, const char *devices_json);

/* Records the rank a running job's stall watch suspects (JSON object text,
 * see store_job.stall_json; NULL clears). -ENOENT no job. */
int store_job_set_stall(store *s, const char *id, const char *stall_json);

/* Records what a job trains on (a JSON object's text: worker rank 0's
 * "data" message, docs/api.md), replacing an earlier record; *changed (if
 * non-NULL) is true when there was none or it said something else.
 * -ENOENT no job, -EINVAL NULL arguments. */
int store_job_data_set(store *s, const char *id, const char *data_json, bool *changed);
/* The record of store_job_data_set: 0 with *data_json (caller frees), or
 * with NULL when there is none yet (or no such job); a store error. */
int store_job_data_get(store *s, const char *id, char **data_json);
/* Merges the JSON object patch_json into the job's outcome_json (RFC 7396:
 * its members replace the stored ones, null removes one). -ENOENT no job,
 * -EINVAL not an object. */
int store_job_merge_outcome(store *s, const char *id, const char *patch_json);

/* Records the wall time the job's attempts have taken so far (ms, >= 0).
 * -ENOENT no job. */
int store_job_set_runtime(store *s, const char *id, int64_t runtime_ms);

/* Adds 1 to restart_count; returns the new count in *count (if non-NULL).
 * -ENOENT no job. */
int store_job_bump_restarts(store *s, const char *id, int *count);

/* Deletes a job in a terminal state with its events, metrics and checkpoint
 * rows (not the checkpoint directories). -ENOENT no job, -EBUSY if not
 * terminal. Its idempotency key, if any, stays until pruned. */
int store_job_delete(store *s, const char *id);

/* All events of a job, oldest first. *out caller-owned (store_events_free).
 * -ENOENT no job. */
int store_job_events(store *s, const char *id, store_event **out, size_t *n);
void store_events_free(store_event *ev, size_t n);

/* Counts jobs per state into counts[JOB_STATE_COUNT] (zero for absent ones). */
int store_job_counts(store *s, int64_t counts[JOB_STATE_COUNT]);

/* Adds a note to a job's events (from == to == the current state) without
 * changing the job, e.g. "restart 2 of 3: worker 1 exited with signal 9".
 * -ENOENT if no such job. */
int store_job_note(store *s, const char *id, const char *reason);

/* Deletes idempotency keys created before before_ms; *removed (if non-NULL)
 * gets how many. A retry that arrives after its key is pruned is a new
 * request. */
int store_idem_prune(store *s, int64_t before_ms, int64_t *removed);

/* ---- datasets: a corpus prepared into token shards ---- */

enum dataset_state { DATASET_PREPARING = 0, DATASET_READY, DATASET_FAILED, DATASET_STATE_COUNT };

/* "preparing" | "ready" | "failed" — static strings. */
const char *dataset_state_name(enum dataset_state s);
/* Returns 0 and sets *out, or -EINVAL for an unknown name. */
int dataset_state_parse(const char *name, enum dataset_state *out);

/* One row of the datasets table. Strings are heap-owned by the struct. */
typedef struct store_dataset {
	char *id;              /* "ds-" + 16 hex chars, made by the caller */
	char *name;            /* unique; what job specs refer to */
	char *spec_json;       /* the effective prepare request (compact JSON) */
	enum dataset_state state;
	int64_t bytes_done, bytes_total; /* raw corpus bytes read in this phase / corpus size */
	char *phase;           /* "starting", "vocab", "tokenize" or "done" */
	double fraction;       /* of the whole preparation, 0..1 (grows within one run) */
	char *stats_json;      /* counts (documents, sentences, tokens, shards); NULL until known */
	char *error;           /* NULL unless failed */
	int64_t created_ms, updated_ms;
} store_dataset;

/* Inserts a dataset in state preparing; ds->id, name, spec_json and
 * bytes_total are used, times are set here. -EEXIST if the id or the name is
 * taken (nothing written). */
int store_dataset_insert(store *s, const store_dataset *ds);
/* Inserts a dataset prepared elsewhere, ready at once, with its stats
 * (ds->bytes_total is the corpus size it records). -EEXIST as above. */
int store_dataset_insert_ready(store *s, const store_dataset *ds, const char *stats_json);
/* Loads one dataset by id / by name into *out (free with store_dataset_free);
 * -ENOENT if none. */
int store_dataset_get(store *s, const char *id, store_dataset *out);
int store_dataset_get_by_name(store *s, const char *name, store_dataset *out);
void store_dataset_free(store_dataset *d);
void store_datasets_free(store_dataset *ds, size_t n);
/* All datasets, oldest first. *out caller-owned (store_datasets_free). */
int store_dataset_list(store *s, store_dataset **out, size_t *n);
/* Records progress of a preparing dataset; stats_json NULL keeps the stored
 * one. -ENOENT no such dataset, -EBUSY if it is no longer preparing. */
int store_dataset_progress(store *s, const char *id, int64_t bytes_done, int64_t bytes_total,
			   const char *stats_json);
/* Records the phase of a preparing dataset and its fraction of the whole
 * preparation (0..1; bertd-prepare only lets it grow, but a preparation
 * restarted after a daemon restart starts again from 0). -EINVAL bad
 * arguments, -ENOENT no such dataset, -EBUSY if it is no longer preparing. */
int store_dataset_phase(store *s, const char *id, const char *phase, double fraction);
/* Ends preparation: to must be ready or failed (else -EINVAL); error is kept
 * only for failed (may be NULL); stats_json NULL keeps the stored one.
 * -ENOENT no such dataset, -EBUSY if it is not preparing (ready and failed
 * are final). */
int store_dataset_finish(store *s, const char *id, enum dataset_state to, const char *error,
			 const char *stats_json);
/* Deletes the row (not the shard files). -EBUSY while preparing. */
int store_dataset_delete(store *s, const char *id);

/* ---- per-job training metrics, one row per logged step ---- */

typedef struct store_metric {
	int64_t step;
	int64_t time_ms;     /* when the worker finished that step */
	char *values_json;   /* {"loss":..., "learning_rate":..., ...} */
} store_metric;

/* Records the metrics of one step. The same step logged again (a restart
 * from an earlier checkpoint replays it) replaces the row. -ENOENT no job. */
int store_metric_insert(store *s, const char *job_id, int64_t step, int64_t time_ms,
			const char *values_json);
/* Rows with step > since_step in step order, at most limit (>= 1, else
 * -EINVAL); pass the last step seen to continue. *out caller-owned
 * (store_metrics_free), possibly empty. -ENOENT no job. */
int store_metric_list(store *s, const char *job_id, int64_t since_step, int limit,
		      store_metric **out, size_t *n);
/* The newest limit rows (>= 1), oldest first; otherwise as store_metric_list. */
int store_metric_tail(store *s, const char *job_id, int limit, store_metric **out, size_t *n);
void store_metrics_free(store_metric *m, size_t n);
/* The newest metrics row of a job into *out (free out->values_json).
 * -ENOENT when the job has none (or does not exist). */
int store_metric_latest(store *s, const char *job_id, store_metric *out);
/* A job's held-out evaluations (rows holding eval_loss): the newest into
 * *last and the one with the smallest eval_loss (the earliest on a tie) into
 * *best; free both values_json. -ENOENT when no row has one. */
int store_metric_eval(store *s, const char *job_id, store_metric *last, store_metric *best);

/* ---- per-job checkpoints (directories written by the worker) ---- */

typedef struct store_checkpoint {
	int64_t step;
	char *path;          /* the ckpt-<step>/ directory */
	int64_t bytes;       /* total size on disk */
	int64_t created_ms;  /* set by store_checkpoint_insert */
} store_checkpoint;

/* Records a checkpoint (step, path, bytes used; created_ms set here).
 * -ENOENT no job, -EEXIST that step is recorded already. */
int store_checkpoint_insert(store *s, const char *job_id, const store_checkpoint *c);
/* A job's checkpoints, oldest step first. *out caller-owned
 * (store_checkpoints_free). -ENOENT no job. */
int store_checkpoint_list(store *s, const char *job_id, store_checkpoint **out, size_t *n);
/* Forgets one checkpoint row (the caller removes the directory).
 * -ENOENT if no such job or step. */
int store_checkpoint_delete(store *s, const char *job_id, int64_t step);
void store_checkpoints_free(store_checkpoint *c, size_t n);

/* What a job's representation shows beyond its row, for a list page read
 * in one go (one read transaction, each query prepared once for the page
 * instead of per job). Arrays caller-owned through store_job_extras_free. */
typedef struct store_job_extras {
	store_metric *tail;               /* newest `window` metrics rows, in step order */
	size_t n_tail;
	store_metric *first;              /* the job's first metrics row (n_first 0 or 1) */
	size_t n_first;
	store_checkpoint *last_checkpoint; /* its newest checkpoint (n_checkpoint 0 or 1) */
	size_t n_checkpoint;
} store_job_extras;

/* *out gets one store_job_extras per jobs[i] (a job that no longer exists
 * gets empty arrays). window >= 1, else -EINVAL; a store error is returned
 * with *out NULL. */
int store_job_extras_get(store *s, const store_job *jobs, size_t n, int window,
			 store_job_extras **out);
void store_job_extras_free(store_job_extras *x, size_t n);

/* ---- the queue as the scheduler reads it ---- */

/* A job row as the scheduler reads it: spec_json only while the job is
 * queued or restarting (NULL otherwise: it left the queue). Strings are
 * heap-owned by the row. */
typedef struct store_queue_row {
	char *id;
	int64_t seq;
	enum job_state state;
	int priority;
	int64_t runtime_ms;
	char *spec_json;
} store_queue_row;

/* The rows of the queue that changed after revision since_rev, in seq order,
 * read in one snapshot with the revision it is at (*rev: pass it next
 * time). A changed row may have left the queue (any state; then spec_json
 * is NULL). *full is true when *out is instead every queued and restarting
 * job (since_rev <= 0, or a change the revisions cannot name: a queued row
 * deleted by another process, another database): the caller's view is
 * replaced, not patched. Revisions count changes of state, priority, spec
 * and runtime of queued and restarting jobs, whoever writes them (schema.sql,
 * migration 8). *out is caller-owned (store_queue_rows_free). A store
 * error. */
int store_queue_changes(store *s, int64_t since_rev, store_queue_row **out, size_t *n, bool *full,
			int64_t *rev);
void store_queue_rows_free(store_queue_row *r, size_t n);

/* For tests and tools: store_open with the given migration text instead of
 * the embedded schema.sql (same "-- migration N" format). */
int store_open_schema(store **out, const char *path, const char *schema);

#endif
