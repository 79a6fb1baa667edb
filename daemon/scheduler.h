/* scheduler — decides which queued job starts next and on which devices.
 * Pure: no I/O, no clock, no globals; the supervisor feeds it the queue and
 * the free devices and acts on its answer.
 *
 * Policy: strict priority, then submission order. The head of the queue
 * waits for enough free devices; jobs behind it do not jump ahead (no
 * backfill), so a big job is never starved by a stream of small ones. A job
 * that asks for more devices than the machine has can never run: it is
 * reported so the caller fails it with a reason instead of queueing forever.
 */
#ifndef BERTD_DAEMON_SCHEDULER_H
#define BERTD_DAEMON_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sched_job {
	const char *id;
	int priority;       /* higher first */
	int64_t seq;        /* submission order (store seq), lower first */
	int want;           /* devices asked for (resources.gpus) */
} sched_job;

enum sched_verdict {
	SCHED_NONE = 0,     /* nothing can start now */
	SCHED_START,        /* start *job_idx on the devices in dev_out */
	SCHED_IMPOSSIBLE,   /* *job_idx wants more devices than exist */
};

/* queued: n jobs in any order. busy: ndev flags, true = device taken.
 * On SCHED_START, dev_out[0..want) receives device indices (lowest free
 * first, so ranks map to devices stably). dev_out must hold ndev entries. */
enum sched_verdict sched_pick(const sched_job *queued, size_t n, const bool *busy, size_t ndev,
			      size_t *job_idx, int *dev_out);

#endif
