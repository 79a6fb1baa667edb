-- bertd database schema: the only DDL in the project.
--
-- Embedded into bertd at build time (common/embed) and applied by
-- daemon/store.c under PRAGMA user_version. The file is a list of numbered
-- migrations; a line "-- migration N" starts migration N and they must run
-- 1, 2, 3, ... with no gap. A database at version V gets migrations V+1..last,
-- each in its own BEGIN IMMEDIATE transaction together with its
-- "PRAGMA user_version = N", so a failed step leaves the file at N-1.
--
-- Rules for new migrations: append, never edit a released one; no
-- BEGIN/COMMIT inside (the store owns the transaction); they run with
-- foreign_keys=ON, so a table rebuild needs PRAGMA defer_foreign_keys.
-- Only comments may precede the first marker.
--
-- Times are Unix epoch milliseconds; 0 means "not yet".

-- migration 1: jobs, their events, idempotency keys, datasets, metrics, checkpoints
CREATE TABLE jobs (
	-- AUTOINCREMENT: a seq is never reused after a delete, so list cursors
	-- stay valid.
	seq            INTEGER PRIMARY KEY AUTOINCREMENT,
	id             TEXT    NOT NULL UNIQUE,
	name           TEXT    NOT NULL,
	spec_json      TEXT    NOT NULL,
	state          TEXT    NOT NULL CHECK (state IN ('queued', 'starting', 'running',
	                   'restarting', 'stopping', 'completed', 'failed', 'canceled')),
	priority       INTEGER NOT NULL DEFAULT 0,
	restart_count  INTEGER NOT NULL DEFAULT 0 CHECK (restart_count >= 0),
	failure_reason TEXT,
	created_ms     INTEGER NOT NULL,
	updated_ms     INTEGER NOT NULL,
	started_ms     INTEGER NOT NULL DEFAULT 0,
	finished_ms    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX jobs_state_seq ON jobs (state, seq);

CREATE TABLE job_events (
	-- Row id gives the order of events written within the same millisecond.
	id         INTEGER PRIMARY KEY,
	job_id     TEXT    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
	time_ms    INTEGER NOT NULL,
	from_state TEXT    NOT NULL,
	to_state   TEXT    NOT NULL,
	reason     TEXT
);
CREATE INDEX job_events_job ON job_events (job_id, id);

-- No foreign key to jobs: a retried POST must replay the original answer
-- even after that job was deleted. Old keys are pruned by age.
CREATE TABLE idempotency_keys (
	key           TEXT    PRIMARY KEY,
	request_hash  TEXT    NOT NULL,
	job_id        TEXT    NOT NULL,
	response_json TEXT    NOT NULL,
	created_ms    INTEGER NOT NULL
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_ms);

CREATE TABLE datasets (
	id          TEXT    PRIMARY KEY,
	name        TEXT    NOT NULL UNIQUE,
	spec_json   TEXT    NOT NULL,
	state       TEXT    NOT NULL CHECK (state IN ('preparing', 'ready', 'failed')),
	bytes_done  INTEGER NOT NULL DEFAULT 0,
	bytes_total INTEGER NOT NULL DEFAULT 0,
	stats_json  TEXT,
	error       TEXT,
	created_ms  INTEGER NOT NULL,
	updated_ms  INTEGER NOT NULL
);

-- One row per logged step; a step logged again after a restart from an
-- earlier checkpoint replaces the old row.
CREATE TABLE job_metrics (
	job_id      TEXT    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
	step        INTEGER NOT NULL,
	time_ms     INTEGER NOT NULL,
	values_json TEXT    NOT NULL,
	PRIMARY KEY (job_id, step)
) WITHOUT ROWID;

CREATE TABLE job_checkpoints (
	job_id     TEXT    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
	step       INTEGER NOT NULL,
	path       TEXT    NOT NULL,
	bytes      INTEGER NOT NULL DEFAULT 0,
	created_ms INTEGER NOT NULL,
	PRIMARY KEY (job_id, step)
) WITHOUT ROWID;

-- migration 2: the devices a job runs on (JSON array, set at each start)
ALTER TABLE jobs ADD COLUMN devices_json TEXT;

-- migration 3: a preparing dataset's phase ('starting', 'vocab', 'tokenize',
-- 'done') and its fraction of the whole preparation (0..1, growing within a
-- run), as bertd-prepare reports them
ALTER TABLE datasets ADD COLUMN phase TEXT NOT NULL DEFAULT 'starting';
ALTER TABLE datasets ADD COLUMN fraction REAL NOT NULL DEFAULT 0;

-- migration 4: the rank a running job's stall watch suspects (JSON object
-- {"rank", "since_ms", "limit_s", "stopped"}, NULL when none), for the
-- diagnosis
ALTER TABLE jobs ADD COLUMN stall_json TEXT;

-- migration 5: what a job trains on, as its worker rank 0 counted it when it
-- indexed the dataset (JSON object: sequences and tokens per epoch, tokens
-- dropped and why; docs/api.md, the job's "data"), replaced at each start
CREATE TABLE job_data (
	job_id    TEXT    PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
	data_json TEXT    NOT NULL,
	time_ms   INTEGER NOT NULL
) WITHOUT ROWID;

-- migration 6: what a job's end left behind and how long it has run: the
-- model its export holds and its best checkpoint (JSON object {"export":
-- {"step", "source"}, "best_model": {"step", "metric", "value"}}, NULL
-- before either), and the wall time of its attempts so far (ms), which
-- stopping_condition.max_runtime_seconds counts
ALTER TABLE jobs ADD COLUMN outcome_json TEXT;
ALTER TABLE jobs ADD COLUMN runtime_ms INTEGER NOT NULL DEFAULT 0 CHECK (runtime_ms >= 0);

-- migration 7: who submitted a job (the name of the API token its request
-- carried: "default" for the one shared token; NULL when unknown), free
-- notes, and the job's tags as an index (the list filters by tag and pages
-- by seq: the primary key (tag, job_seq) is that walk). The tags and notes
-- themselves live in spec_json ("tags", "notes"); job_tags mirrors
-- spec_json's "tags" and is written in the same transaction as it.
ALTER TABLE jobs ADD COLUMN owner TEXT;
CREATE INDEX jobs_owner_seq ON jobs (owner, seq);
CREATE TABLE job_tags (
	tag     TEXT    NOT NULL,
	job_seq INTEGER NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE,
	PRIMARY KEY (tag, job_seq)
) WITHOUT ROWID;
CREATE INDEX job_tags_job ON job_tags (job_seq);

-- migration 8: the scheduler reads the queue by its changes. sched_clock
-- (one row) counts every change of a queued or restarting job's row that
-- the scheduler reads (its state, priority, spec, runtime: a submission, a
-- PATCH, a cancel, a start, a requeue), and jobs.sched_rev holds the count
-- of the row's last such change; the supervisor's tick keeps what it
-- parsed of each queued job and reads only rows with sched_rev above the
-- count it last saw. Triggers keep both, so a change written by another
-- process (an operator's sqlite3) counts too; deleting a queued or
-- restarting row (only another process does) sets reload_rev, after which
-- the tick reads the whole queue again.
ALTER TABLE jobs ADD COLUMN sched_rev INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_sched_rev ON jobs (sched_rev);
CREATE TABLE sched_clock (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	rev        INTEGER NOT NULL,
	reload_rev INTEGER NOT NULL
);
INSERT INTO sched_clock (id, rev, reload_rev) VALUES (1, 0, 0);
CREATE TRIGGER jobs_sched_insert AFTER INSERT ON jobs
BEGIN
	UPDATE sched_clock SET rev = rev + 1;
	UPDATE jobs SET sched_rev = (SELECT rev FROM sched_clock) WHERE seq = NEW.seq;
END;
CREATE TRIGGER jobs_sched_update AFTER UPDATE OF state, priority, spec_json, runtime_ms ON jobs
	WHEN OLD.state IN ('queued', 'restarting') OR NEW.state IN ('queued', 'restarting')
BEGIN
	UPDATE sched_clock SET rev = rev + 1;
	UPDATE jobs SET sched_rev = (SELECT rev FROM sched_clock) WHERE seq = NEW.seq;
END;
CREATE TRIGGER jobs_sched_delete AFTER DELETE ON jobs
	WHEN OLD.state IN ('queued', 'restarting')
BEGIN
	UPDATE sched_clock SET rev = rev + 1, reload_rev = rev + 1;
END;

-- migration 9: preemption holds and who asked a job to stop. A preempted
-- job waits in the queue until the job it was preempted for (by_job) has
-- started; preempt_holds keeps that wait across a daemon restart (one row
-- per victim, dropped when its preemptor starts or is gone). jobs.stop_by
-- names who asked for a running job's cancel (a token's name), so the
-- event that ends it says who, whichever daemon writes it.
CREATE TABLE preempt_holds (
	victim     TEXT    PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
	by_job     TEXT    NOT NULL,
	created_ms INTEGER NOT NULL
) WITHOUT ROWID;
ALTER TABLE jobs ADD COLUMN stop_by TEXT;
