/* scheduler — see scheduler.h. Device sets are bitmasks (bit d: device d),
 * so a machine has at most SCHED_MAX_DEV devices here. */
#include "daemon/scheduler.h"

#include <string.h>

/* Nodes the search for a linked set may visit before settling for the
 * lowest free devices: 8 GPUs need a few dozen; this bounds 64. */
#define CLIQUE_BUDGET 20000

static bool before(const sched_job *a, const sched_job *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->seq < b->seq;
}

/* The first of the n queued jobs in scheduling order, those held (held
 * NULL: none) skipped; n when every one is held. */
static size_t head_of(const sched_job *queued, size_t n, const bool *held)
{
	size_t head = n;
	for (size_t i = 0; i < n; i++)
		if (!(held && held[i]) && (head == n || before(&queued[i], &queued[head])))
			head = i;
	return head;
}

static uint64_t all_of(size_t ndev)
{
	return ndev >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << ndev) - 1);
}

static int count(uint64_t s) { return __builtin_popcountll(s); }

/* The lowest k members of s (s has at least k). */
static uint64_t lowest(uint64_t s, int k)
{
	uint64_t r = 0;
	for (int i = 0; i < k; i++) {
		uint64_t b = s & -s;
		r |= b;
		s &= ~b;
	}
	return r;
}

static bool linked_all(uint64_t s, const uint64_t *peers)
{
	for (uint64_t t = s; t; t &= t - 1) {
		int v = __builtin_ctzll(t);
		if ((s & ~((uint64_t)1 << v) & ~peers[v]) != 0)
			return false;
	}
	return true;
}

/* The first k-clique in index order that extends chosen with members of
 * cand (all linked to every chosen one), or 0. */
static uint64_t clique(uint64_t chosen, uint64_t cand, int k, const uint64_t *peers, int *budget)
{
	if (count(chosen) == k)
		return chosen;
	if (--*budget < 0)
		return 0;
	while (cand && count(chosen) + count(cand) >= k) {
		int v = __builtin_ctzll(cand);
		cand &= cand - 1; /* v is tried now; later branches only take higher ones */
		uint64_t r = clique(chosen | ((uint64_t)1 << v), cand & peers[v], k, peers, budget);
		if (r || *budget < 0)
			return r;
	}
	return 0;
}

uint64_t sched_place(int k, uint64_t allowed, const uint64_t *peers, size_t ndev, bool *connected)
{
	allowed &= all_of(ndev);
	*connected = false;
	if (k < 1 || count(allowed) < k)
		return 0;
	uint64_t low = lowest(allowed, k);
	if (k == 1 || !peers) {
		*connected = k == 1;
		return low;
	}
	int budget = CLIQUE_BUDGET;
	uint64_t c = clique(0, allowed, k, peers, &budget);
	if (c) {
		*connected = true;
		return c;
	}
	*connected = linked_all(low, peers);
	return low;
}

/* The head's reservation: running jobs end in order of their estimated
 * end; the first end after which want devices can be had is the head's
 * start. Its devices: linked ones if possible, and among those the ones
 * released by then rather than ones free now, so the free ones stay
 * usable for backfill. *start SCHED_NEVER (and 0 devices) when no
 * estimate reaches want. */
static uint64_t reserve(const sched_machine *m, uint64_t free, int want, int64_t *start)
{
	*start = SCHED_NEVER;
	size_t nr = m->nrunning < SCHED_MAX_DEV ? m->nrunning : SCHED_MAX_DEV;
	uint64_t done = 0; /* running entries counted so far (bit i: m->running[i]) */
	uint64_t avail = free;
	for (size_t step = 0; step < nr; step++) {
		size_t pick = nr;
		for (size_t i = 0; i < nr; i++)
			if (!(done & ((uint64_t)1 << i)) &&
			    (pick == nr || m->running[i].end_ms < m->running[pick].end_ms))
				pick = i;
		if (m->running[pick].end_ms == SCHED_NEVER)
			break;
		done |= (uint64_t)1 << pick;
		avail |= m->running[pick].devs & all_of(m->ndev);
		bool c_rel, c_all;
		uint64_t rel = sched_place(want, avail & ~free, m->peers, m->ndev, &c_rel);
		uint64_t any = sched_place(want, avail, m->peers, m->ndev, &c_all);
		if (!any)
			continue;
		*start = m->running[pick].end_ms;
		if (rel && (c_rel || !c_all))
			return rel;
		return any;
	}
	return 0;
}

void sched_decide(const sched_job *queued, const int64_t *limit_ms, size_t n, const sched_machine *m,
		  sched_decision *out)
{
	out->verdict = SCHED_NONE;
	out->job_idx = 0;
	out->ndev = 0;
	out->connected = false;
	out->backfill = false;
	out->head_start_ms = SCHED_NEVER;
	out->reserved = 0;
	if (n == 0)
		return;
	size_t ndev = m->ndev < SCHED_MAX_DEV ? m->ndev : SCHED_MAX_DEV;
	/* A job that can never fit is reported first, whatever its rank, so it
	 * fails at once instead of blocking the queue. */
	for (size_t i = 0; i < n; i++) {
		if (queued[i].want < 1 || (size_t)queued[i].want > ndev) {
			out->verdict = SCHED_IMPOSSIBLE;
			out->job_idx = i;
			return;
		}
	}
	size_t head = head_of(queued, n, m->held);
	if (head == n)
		return; /* every queued job is held */
	uint64_t free = 0;
	for (size_t d = 0; d < ndev; d++)
		if (!m->busy[d])
			free |= (uint64_t)1 << d;
	bool conn = false;
	uint64_t set = sched_place(queued[head].want, free, m->peers, ndev, &conn);
	size_t pick = head;
	if (set) {
		out->head_start_ms = m->now_ms;
	} else {
		int64_t shadow;
		uint64_t resv = reserve(m, free, queued[head].want, &shadow);
		out->head_start_ms = shadow;
		out->reserved = resv;
		if (shadow == SCHED_NEVER)
			return; /* no estimate: nothing may risk delaying the head */
		/* Backfill: the best-ranked job that fits now without touching the
		 * reservation. Its devices depend only on its size and on whether
		 * it surely ends before the head's start, so each (size, class) is
		 * placed once, whatever the queue's length. */
		uint64_t place_of[2][SCHED_MAX_DEV + 1];
		bool conn_of[2][SCHED_MAX_DEV + 1], placed[2][SCHED_MAX_DEV + 1];
		memset(placed, 0, sizeof placed);
		size_t best = n;
		for (size_t i = 0; i < n; i++) {
			if (i == head || (m->held && m->held[i]) ||
			    (best < n && !before(&queued[i], &queued[best])))
				continue;
			const sched_job *j = &queued[i];
			int64_t limit = limit_ms ? limit_ms[i] : 0;
			int cls = limit > 0 && limit <= shadow - m->now_ms ? 0 : 1;
			if (!placed[cls][j->want]) {
				uint64_t allowed = cls == 0 ? free : free & ~resv;
				place_of[cls][j->want] = sched_place(j->want, allowed, m->peers, ndev,
								     &conn_of[cls][j->want]);
				placed[cls][j->want] = true;
			}
			if (place_of[cls][j->want]) {
				best = i;
				set = place_of[cls][j->want];
				conn = conn_of[cls][j->want];
			}
		}
		if (best == n)
			return;
		pick = best;
		out->backfill = true;
	}
	out->verdict = SCHED_START;
	out->job_idx = pick;
	out->connected = conn;
	out->ndev = 0;
	for (uint64_t t = set; t; t &= t - 1)
		out->dev[out->ndev++] = __builtin_ctzll(t);
}

enum sched_verdict sched_pick(const sched_job *queued, size_t n, const bool *busy, size_t ndev,
			      size_t *job_idx, int *dev_out)
{
	if (n == 0)
		return SCHED_NONE;
	for (size_t i = 0; i < n; i++) {
		if (queued[i].want < 1 || (size_t)queued[i].want > ndev) {
			*job_idx = i;
			return SCHED_IMPOSSIBLE;
		}
	}
	size_t head = head_of(queued, n, NULL);
	int got = 0;
	for (size_t d = 0; d < ndev && got < queued[head].want; d++)
		if (!busy[d])
			dev_out[got++] = (int)d;
	if (got < queued[head].want)
		return SCHED_NONE;
	*job_idx = head;
	return SCHED_START;
}

/* Whether victim a is preempted before victim b: lower priority first,
 * then the later start, then the lower index (a stable answer). */
static bool victim_first(const sched_victim *v, size_t a, size_t b)
{
	if (v[a].priority != v[b].priority)
		return v[a].priority < v[b].priority;
	if (v[a].start_ms != v[b].start_ms)
		return v[a].start_ms > v[b].start_ms;
	return a < b;
}

void sched_preempt(const sched_job *queued, size_t n, const sched_machine *m, const sched_victim *victims,
		   size_t nv, sched_preemption *out)
{
	out->preempt = false;
	out->job_idx = 0;
	out->nvictims = 0;
	size_t ndev = m->ndev < SCHED_MAX_DEV ? m->ndev : SCHED_MAX_DEV;
	size_t head = head_of(queued, n, m->held);
	if (head == n || queued[head].want < 1 || (size_t)queued[head].want > ndev)
		return;
	const int want = queued[head].want;
	uint64_t avail = 0; /* free now, or soon: held by a job already leaving */
	for (size_t d = 0; d < ndev; d++)
		if (!m->busy[d])
			avail |= (uint64_t)1 << d;
	for (size_t i = 0; i < nv; i++)
		if (victims[i].leaving)
			avail |= victims[i].devs & all_of(ndev);
	bool conn;
	if (sched_place(want, avail, m->peers, ndev, &conn))
		return; /* it starts once those are gone: stopping more gains nothing */
	/* The eligible victims, in the order they are taken (insertion sort:
	 * at most one per device). */
	size_t order[SCHED_MAX_DEV], ne = 0;
	for (size_t i = 0; i < nv && ne < SCHED_MAX_DEV; i++) {
		const sched_victim *v = &victims[i];
		if (v->leaving || !v->preemptible || v->priority >= queued[head].priority ||
		    !(v->devs & all_of(ndev)))
			continue;
		size_t k = ne++;
		while (k > 0 && victim_first(victims, i, order[k - 1])) {
			order[k] = order[k - 1];
			k--;
		}
		order[k] = i;
	}
	size_t take = 0;
	uint64_t with = avail;
	while (take < ne && !sched_place(want, with, m->peers, ndev, &conn))
		with |= victims[order[take++]].devs & all_of(ndev);
	if (!sched_place(want, with, m->peers, ndev, &conn))
		return; /* even with every eligible victim gone it could not start */
	/* Leave running whoever is not needed now that later victims are in:
	 * the last taken are tried first, so lower priorities stay preferred. */
	bool keep[SCHED_MAX_DEV];
	for (size_t k = 0; k < take; k++)
		keep[k] = true;
	for (size_t k = take; k-- > 0;) {
		uint64_t without = with & ~(victims[order[k]].devs & all_of(ndev));
		if (sched_place(want, without, m->peers, ndev, &conn)) {
			keep[k] = false;
			with = without;
		}
	}
	for (size_t k = 0; k < take; k++)
		if (keep[k])
			out->victim[out->nvictims++] = order[k];
	out->preempt = true;
	out->job_idx = head;
}
