/* retention — what happens to job directories (<state_dir>/jobs/<id>/)
 * after their job ends: removal when a job is deleted, the retention policy
 * (drop checkpoints of jobs finished long enough ago, optionally exports
 * too), the disk-usage cache that GET /v1/system and the submit-time
 * ceiling read, and the shared group's mode bits.
 *
 * One background thread does every slow file-system walk, so neither an API
 * thread nor the event loop ever waits on a large tree. Removal is made
 * crash-safe by the file system itself: a directory to remove is first
 * renamed to jobs/.deleting-<name> (atomic, instant); the thread removes
 * whatever .deleting-* entries it finds, so one left by a crash is finished
 * at the next start. Walks never follow a symbolic link: a link inside a
 * job directory is unlinked, its target left alone.
 *
 * Must never remove the directory of a job that is not in a final state,
 * and never touch anything outside <state_dir>/jobs.
 */
#ifndef BERTD_DAEMON_RETENTION_H
#define BERTD_DAEMON_RETENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/store.h"

typedef struct retention_config {
	const char *state_dir;      /* job directories are under <state_dir>/jobs */
	int checkpoint_days;        /* drop checkpoints of jobs finished this long ago; -1 = never */
	bool keep_exports;          /* false: with the checkpoints, drop export/ too */
	int interval_s;             /* seconds between passes (>= 1) */
	uint64_t ceiling_bytes;     /* job files at or above this refuse new jobs; 0 = none */
	int ceiling_percent;        /* the state_dir file system this full refuses new jobs; 0 = none */
	gid_t shared_gid;           /* (gid_t)-1 = none: see retention_share_dirs */
} retention_config;

typedef struct retention retention;

/* One job directory's use, as the last pass measured it. */
typedef struct retention_job_use {
	char id[64];
	uint64_t bytes;             /* allocated bytes (st_blocks * 512) of every file, links not followed */
	bool deleting;              /* the job was deleted; its directory is being removed */
} retention_job_use;

typedef struct retention_usage {
	retention_job_use *jobs;    /* (n_jobs), sorted by id; caller frees */
	size_t n_jobs;
	uint64_t total_bytes;       /* all of <state_dir>/jobs, being-deleted entries included */
	uint64_t deleting_bytes;    /* of which in .deleting-* entries */
	size_t n_deleting;          /* .deleting-* entries not yet removed */
	int64_t measured_ms;        /* epoch ms of the pass these numbers are from */
	uint64_t passes;            /* passes completed since start */
	uint64_t checkpoints_dropped; /* checkpoint directories the policy removed since start */
} retention_usage;

/* Measures <state_dir>/jobs once (synchronously, so the first answers are
 * real numbers), then starts the thread, which at once finishes removals a
 * previous run left, and then passes every interval_s. *out caller-owned
 * (retention_destroy). st is used from the thread (store views are
 * thread-safe). Returns 0, or a negative errno. */
int retention_create(retention **out, const retention_config *cfg, store *st);
/* Stops the thread (a removal under way stops between entries and is
 * finished at the next start) and frees r. NULL is fine. */
void retention_destroy(retention *r);

/* Takes job id's directory out of the way (renames it to .deleting-<id>)
 * before its row is deleted. 1 when it was renamed: then the caller deletes
 * the row and must call retention_detach_end (the removal cannot start
 * before). 0 when the job has no directory, negative errno otherwise
 * (nothing to end). */
int retention_detach(retention *r, const char *id);
/* After a 1 from retention_detach: row_deleted true starts the removal;
 * false moves the directory back (the job stays as it was). */
void retention_detach_end(retention *r, const char *id, bool row_deleted);
/* Wakes the thread for a pass now. */
void retention_kick(retention *r);

/* A copy of the configuration r runs with now (its state_dir borrowed, as
 * long as r lives). */
void retention_config_get(retention *r, retention_config *out);
/* Replaces the policy (checkpoint_days, keep_exports, interval_s and both
 * ceilings of cfg; its state_dir and shared_gid are not used) and starts a
 * pass under it: what a configuration reload changes. Any thread. */
void retention_set_policy(retention *r, const retention_config *cfg);
/* A copy of the latest measurements (caller frees out->jobs). */
int retention_usage_get(retention *r, retention_usage *out);
/* A ceiling that is reached. */
typedef struct retention_ceiling {
	const char *key;            /* "disk_ceiling_bytes" or "disk_ceiling_percent" */
	const char *unit;           /* "bytes of job files" or "percent of the file system" */
	uint64_t ceiling, used;     /* in that unit */
} retention_ceiling;
/* Whether a new job must be refused: 1 (and *c says which ceiling) when a
 * ceiling is reached, 0 when not. Bytes are the last pass's; the percent is
 * asked of the file system now (statvfs, cheap). */
int retention_over_ceiling(retention *r, retention_ceiling *c);

/* With a shared group: <state_dir> 0710 and <state_dir>/jobs 02750, both
 * of that group, so its members can reach job directories (created under
 * jobs, which inherit the group and the setgid bit) but not list the state
 * dir or read the database and token. Called once at start. */
int retention_share_dirs(const char *state_dir, gid_t gid);

#endif
