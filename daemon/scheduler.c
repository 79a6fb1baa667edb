/* scheduler — see scheduler.h. */
#include "daemon/scheduler.h"

static bool before(const sched_job *a, const sched_job *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->seq < b->seq;
}

enum sched_verdict sched_pick(const sched_job *queued, size_t n, const bool *busy, size_t ndev,
			      size_t *job_idx, int *dev_out)
{
	if (n == 0)
		return SCHED_NONE;
	/* A job that can never fit is reported first, whatever its rank, so it
	 * fails at once instead of blocking the queue. */
	for (size_t i = 0; i < n; i++) {
		if (queued[i].want < 1 || (size_t)queued[i].want > ndev) {
			*job_idx = i;
			return SCHED_IMPOSSIBLE;
		}
	}
	size_t head = 0;
	for (size_t i = 1; i < n; i++)
		if (before(&queued[i], &queued[head]))
			head = i;
	int got = 0;
	for (size_t d = 0; d < ndev && got < queued[head].want; d++)
		if (!busy[d])
			dev_out[got++] = (int)d;
	if (got < queued[head].want)
		return SCHED_NONE;
	*job_idx = head;
	return SCHED_START;
}
