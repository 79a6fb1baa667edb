/* ring — shm batch rings with futex waits and dead-producer recovery (see
 * ring.h for the protocol). All shared words are C11 atomics used with
 * sequential consistency: the claim/recovery handshake relies on a single
 * total order of "claiming" flags, the claim counter and claim records. */
#include "loader/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/procstat.h"

#define RING_MAGIC 0x474E4952u /* "RING" */
#define RING_VERSION 2u
#define NONE UINT64_MAX
#define CACHELINE 64

typedef struct ring_producer {
	_Atomic int32_t pid;        /* 0 = free entry, -pid while pid registers */
	_Atomic uint32_t claiming;  /* 1 while between "take a number" and recording it */
	_Atomic uint64_t starttime; /* /proc/<pid>/stat field 22: guards against pid reuse */
	_Atomic uint64_t claim;     /* batch held, NONE if none */
	uint8_t pad[CACHELINE - 24];
} ring_producer;

typedef struct ring_rank {
	_Atomic uint64_t next_seq;  /* sequence the consumer reads next */
	_Atomic uint64_t wait_ns;
	_Atomic uint64_t consumed;
	uint8_t pad[CACHELINE - 24];
} ring_rank;

typedef struct ring_slot {
	_Atomic uint64_t ready;     /* q + 1 once sequence q is published here */
	_Atomic uint64_t free_for;  /* the sequence allowed to fill this slot next */
	_Atomic uint32_t futex;     /* bumped on every publish/release; waiters sleep on it */
	uint8_t pad[CACHELINE - 20];
} ring_slot;

typedef struct ring_ctl {
	_Atomic uint32_t magic;     /* written last by the creator */
	uint32_t version;
	uint64_t total_bytes;
	ring_params params;
	uint64_t off_ranks, off_slots, off_slot_mem;
	_Atomic uint64_t next_claim;
	_Atomic uint32_t shutdown;
	_Atomic int32_t error;
	_Atomic uint32_t ctl_futex; /* bumped on requeue/shutdown/error */
	_Atomic uint64_t producer_wait_ns, built, requeued;
	_Atomic uint64_t requeue[RING_MAX_PRODUCERS]; /* NONE = empty */
	ring_producer producers[RING_MAX_PRODUCERS];
} ring_ctl;

struct ring {
	uint8_t *base;
	size_t bytes;
	ring_ctl *ctl;
	ring_rank *ranks;   /* (G,) */
	ring_slot *slots;   /* (G, S) */
	uint8_t *slot_mem;  /* (G, S, slot_bytes) */
	int me;             /* producer entry, -1 if not a producer */
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Shared (not FUTEX_PRIVATE) wait: the word lives in a MAP_SHARED segment
 * that other processes wake. Returns 0 (woken or value changed), -ETIMEDOUT
 * or -EINTR. */
static int futex_wait(_Atomic uint32_t *w, uint32_t v, int timeout_ms)
{
	struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
	long rc = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, timeout_ms >= 0 ? &ts : NULL, NULL, 0);
	if (rc == 0 || errno == EAGAIN)
		return 0;
	return -errno;
}

static void futex_bump_wake(_Atomic uint32_t *w)
{
	atomic_fetch_add(w, 1);
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}


int ring_name_for_job(char *buf, size_t n, const char *job_id)
{
	size_t len = strlen(job_id);
	if (len == 0 || len > 100)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		char c = job_id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
		      c == '_'))
			return -EINVAL;
	}
	if ((size_t)snprintf(buf, n, "/bertd-%s", job_id) >= n)
		return -EINVAL;
	return 0;
}

static void handle_init(ring *r)
{
	ring_ctl *c = r->ctl;
	r->ranks = (ring_rank *)(r->base + c->off_ranks);
	r->slots = (ring_slot *)(r->base + c->off_slots);
	r->slot_mem = r->base + c->off_slot_mem;
	r->me = -1;
}

uint64_t ring_world_batch(const ring_params *p, uint64_t n)
{
	if (p->W == 0)
		return n;
	return (n / p->G) * p->W + p->R0 + n % p->G;
}

uint32_t ring_world(const ring_params *p)
{
	return p->W ? p->W : p->G;
}

static int params_valid(const ring_params *p)
{
	if (p->W != 0 && (uint64_t)p->R0 + p->G > p->W)
		return 0;
	return !(p->G == 0 || p->S == 0 || p->M == 0 || p->start_batch % p->G != 0 || p->layout.slot_bytes == 0 ||
	    p->layout.slot_bytes % BATCH_ALIGN != 0 || p->end_batch < p->start_batch);
}

int ring_create(ring **out, const char *name, const ring_params *p)
{
	if (!params_valid(p))
		return -EINVAL;
	uint64_t off_ranks = align_up(sizeof(ring_ctl), CACHELINE);
	uint64_t off_slots = align_up(off_ranks + sizeof(ring_rank) * p->G, CACHELINE);
	uint64_t off_mem = align_up(off_slots + sizeof(ring_slot) * (uint64_t)p->G * p->S, BATCH_ALIGN);
	uint64_t total = off_mem + (uint64_t)p->G * p->S * p->layout.slot_bytes;
	int rc = 0;
	ring *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if (ftruncate(fd, (off_t)total) != 0) {
		rc = -errno;
		shm_unlink(name);
		goto out;
	}
	void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = -errno;
		shm_unlink(name);
		goto out;
	}
	r->base = base;
	r->bytes = total;
	r->ctl = base;
	ring_ctl *c = r->ctl;
	c->version = RING_VERSION;
	c->total_bytes = total;
	c->params = *p;
	if (c->params.lease_ms == 0)
		c->params.lease_ms = 200;
	c->off_ranks = off_ranks;
	c->off_slots = off_slots;
	c->off_slot_mem = off_mem;
	atomic_store(&c->next_claim, p->start_batch);
	for (int i = 0; i < RING_MAX_PRODUCERS; i++) {
		atomic_store(&c->requeue[i], NONE);
		atomic_store(&c->producers[i].claim, NONE);
	}
	handle_init(r);
	uint64_t q0 = p->start_batch / p->G;
	for (uint32_t g = 0; g < p->G; g++) {
		atomic_store(&r->ranks[g].next_seq, q0);
		for (uint32_t k = 0; k < p->S; k++) {
			/* first sequence >= q0 that maps to slot k */
			uint64_t first = q0 + ((uint64_t)k + p->S - q0 % p->S) % p->S;
			atomic_store(&r->slots[(size_t)g * p->S + k].free_for, first);
		}
	}
	atomic_store(&c->magic, RING_MAGIC);
	*out = r;
	r = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(r);
	return rc;
}

static int params_equal(const ring_params *a, const ring_params *b)
{
	const batch_layout *x = &a->layout, *y = &b->layout;
	return a->G == b->G && a->S == b->S && a->M == b->M && a->W == b->W && a->R0 == b->R0 &&
	       (a->lease_ms ? a->lease_ms : 200) == (b->lease_ms ? b->lease_ms : 200) &&
	       a->start_batch == b->start_batch && a->end_batch == b->end_batch && a->job_tag == b->job_tag &&
	       x->B == y->B && x->T == y->T && x->P == y->P && x->slot_bytes == y->slot_bytes &&
	       x->off_input_ids == y->off_input_ids && x->off_token_type_ids == y->off_token_type_ids &&
	       x->off_seq_lens == y->off_seq_lens && x->off_mlm_positions == y->off_mlm_positions &&
	       x->off_mlm_labels == y->off_mlm_labels && x->off_nsp_labels == y->off_nsp_labels &&
	       x->off_n_pred == y->off_n_pred;
}

int ring_open(ring **out, const char *name, const ring_params *p)
{
	if (!params_valid(p))
		return -EINVAL;
	if (strlen(name) >= RING_NAME_MAX || name[0] != '/' || strchr(name + 1, '/'))
		return -EINVAL;
	for (int attempt = 0; attempt < 2; attempt++) {
		ring *r = NULL;
		int rc = ring_attach(&r, name);
		if (rc == 0) {
			if (!params_equal(&r->ctl->params, p)) {
				log_error("ring %s exists with another geometry or job tag", name);
				ring_detach(r);
				return -ESTALE;
			}
			*out = r;
			return 0;
		}
		if (rc != -ENOENT)
			return rc;
		/* Build it fully under a private name, then publish it with
		 * link(2), which fails if someone else published first: nobody
		 * ever maps a half-initialized segment, and nobody waits. */
		char tmp[RING_NAME_MAX + 32], from[RING_NAME_MAX + 48], to[RING_NAME_MAX + 16];
		snprintf(tmp, sizeof(tmp), "%s.init-%d", name, (int)getpid());
		snprintf(from, sizeof(from), "/dev/shm%s", tmp);
		snprintf(to, sizeof(to), "/dev/shm%s", name);
		shm_unlink(tmp); /* a leftover of a crashed earlier try by a process with our pid */
		rc = ring_create(&r, tmp, p);
		if (rc)
			return rc;
		rc = link(from, to) == 0 ? 0 : -errno;
		shm_unlink(tmp);
		if (rc == 0) {
			*out = r;
			return 0;
		}
		ring_detach(r);
		if (rc != -EEXIST)
			return rc;
		/* lost the race: attach to the winner's */
	}
	return -EAGAIN;
}

int ring_attach(ring **out, const char *name)
{
	int rc = 0;
	void *base = MAP_FAILED;
	size_t bytes = 0;
	ring *r = NULL;
	int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		rc = -errno;
		goto out;
	}
	if ((size_t)st.st_size < sizeof(ring_ctl)) {
		rc = -EPROTO;
		goto out;
	}
	bytes = (size_t)st.st_size;
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = -errno;
		goto out;
	}
	ring_ctl *c = base;
	if (atomic_load(&c->magic) != RING_MAGIC || c->version != RING_VERSION || c->total_bytes != bytes) {
		rc = -EPROTO;
		goto out;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		rc = -ENOMEM;
		goto out;
	}
	r->base = base;
	r->bytes = bytes;
	r->ctl = c;
	handle_init(r);
	*out = r;
	base = MAP_FAILED;
out:
	if (base != MAP_FAILED)
		munmap(base, bytes);
	close(fd);
	return rc;
}

static void producer_unregister(ring *r)
{
	if (r->me < 0)
		return;
	ring_producer *p = &r->ctl->producers[r->me];
	atomic_store(&p->claim, NONE);
	atomic_store(&p->pid, 0);
	r->me = -1;
}

void ring_detach(ring *r)
{
	if (!r)
		return;
	producer_unregister(r);
	munmap(r->base, r->bytes);
	free(r);
}

int ring_unlink(const char *name)
{
	return shm_unlink(name) == 0 ? 0 : -errno;
}

const ring_params *ring_get_params(const ring *r)
{
	return &r->ctl->params;
}

void *ring_slot_area(const ring *r, size_t *bytes)
{
	*bytes = r->bytes - r->ctl->off_slot_mem;
	return r->slot_mem;
}

static inline ring_slot *slot_ctl_of(ring *r, uint64_t global)
{
	const ring_params *p = &r->ctl->params;
	return &r->slots[(global % p->G) * p->S + (global / p->G) % p->S];
}

static inline void *slot_mem_of(ring *r, uint64_t global)
{
	const ring_params *p = &r->ctl->params;
	size_t idx = (global % p->G) * p->S + (global / p->G) % p->S;
	return r->slot_mem + idx * p->layout.slot_bytes;
}

static void wake_everyone(ring *r)
{
	const ring_params *p = &r->ctl->params;
	futex_bump_wake(&r->ctl->ctl_futex);
	for (size_t i = 0; i < (size_t)p->G * p->S; i++)
		futex_bump_wake(&r->slots[i].futex);
}

static int requeue_push(ring *r, uint64_t n)
{
	for (int i = 0; i < RING_MAX_PRODUCERS; i++) {
		uint64_t empty = NONE;
		if (atomic_compare_exchange_strong(&r->ctl->requeue[i], &empty, n))
			return 0;
	}
	return -ENOSPC;
}

/* Takes the smallest re-queued batch below `below`; NONE if there is none. */
static uint64_t requeue_take(ring *r, uint64_t below)
{
	for (;;) {
		int best = -1;
		uint64_t bv = below;
		for (int i = 0; i < RING_MAX_PRODUCERS; i++) {
			uint64_t v = atomic_load(&r->ctl->requeue[i]);
			if (v < bv) {
				bv = v;
				best = i;
			}
		}
		if (best < 0)
			return NONE;
		if (atomic_compare_exchange_strong(&r->ctl->requeue[best], &bv, NONE))
			return bv;
	}
}

/* The consumer's check after a lease without its batch: if n was handed out
 * and no live producer holds (or may be taking) it and it is not waiting in
 * the re-queue, its builder died: put it back. */
static void recover_batch(ring *r, uint64_t n)
{
	ring_ctl *c = r->ctl;
	if (n >= atomic_load(&c->next_claim))
		return; /* nobody has taken it yet: producers are just slow */
	for (int i = 0; i < RING_MAX_PRODUCERS; i++)
		if (atomic_load(&c->requeue[i]) == n)
			return;
	for (int i = 0; i < RING_MAX_PRODUCERS; i++) {
		ring_producer *p = &c->producers[i];
		pid_t pid = atomic_load(&p->pid);
		if (pid == 0 || !procstat_alive(pid, atomic_load(&p->starttime)))
			continue;
		if (atomic_load(&p->claiming) || atomic_load(&p->claim) == n)
			return;
	}
	const ring_params *pp = &c->params;
	if (atomic_load(&slot_ctl_of(r, n)->ready) == n / pp->G + 1)
		return; /* published while we looked */
	if (requeue_push(r, n) != 0)
		return; /* full: try again next lease */
	atomic_fetch_add(&c->requeued, 1);
	log_warn("ring: batch %llu was lost with a dead loader; re-queued for rebuild", (unsigned long long)n);
	wake_everyone(r);
}

int ring_next(ring *r, uint32_t rank, int timeout_ms, void **slot)
{
	ring_ctl *c = r->ctl;
	const ring_params *p = &c->params;
	if (rank >= p->G)
		return -EINVAL;
	uint64_t q = atomic_load(&r->ranks[rank].next_seq);
	uint64_t n = q * p->G + rank;
	if (n >= p->end_batch)
		return RING_END;
	ring_slot *s = slot_ctl_of(r, n);
	if (atomic_load(&s->ready) == q + 1) {
		*slot = slot_mem_of(r, n);
		return 0;
	}
	uint64_t t0 = now_ns(), last_check = t0;
	int rc = 0;
	for (;;) {
		uint32_t v = atomic_load(&s->futex);
		if (atomic_load(&s->ready) == q + 1)
			break;
		if (atomic_load(&c->shutdown)) {
			rc = -ESHUTDOWN;
			break;
		}
		if (atomic_load(&c->error)) {
			rc = atomic_load(&c->error);
			break;
		}
		uint64_t now = now_ns();
		int64_t left = timeout_ms < 0 ? INT64_MAX : (int64_t)timeout_ms - (int64_t)((now - t0) / 1000000);
		if (left <= 0) {
			rc = -ETIMEDOUT;
			break;
		}
		if (now - last_check >= (uint64_t)p->lease_ms * 1000000ull) {
			recover_batch(r, n);
			last_check = now;
		}
		int wait = (int)p->lease_ms;
		if (left < wait)
			wait = (int)left;
		futex_wait(&s->futex, v, wait);
	}
	atomic_fetch_add(&r->ranks[rank].wait_ns, now_ns() - t0);
	if (rc == 0)
		*slot = slot_mem_of(r, n);
	return rc;
}

void ring_release(ring *r, uint32_t rank)
{
	const ring_params *p = &r->ctl->params;
	if (rank >= p->G)
		return;
	uint64_t q = atomic_load(&r->ranks[rank].next_seq);
	ring_slot *s = slot_ctl_of(r, q * p->G + rank);
	atomic_store(&r->ranks[rank].next_seq, q + 1);
	atomic_fetch_add(&r->ranks[rank].consumed, 1);
	atomic_store(&s->free_for, q + p->S);
	futex_bump_wake(&s->futex);
}

int ring_producer_register(ring *r)
{
	if (r->me >= 0)
		return -EBUSY;
	char state;
	pid_t me = getpid();
	uint64_t st = procstat_starttime(me, &state);
	for (int i = 0; i < RING_MAX_PRODUCERS; i++) {
		ring_producer *p = &r->ctl->producers[i];
		int32_t pid = atomic_load(&p->pid);
		if (pid < 0) { /* -pid is registering here: taken while it lives */
			char st_state = 0;
			if (procstat_starttime(-pid, &st_state) != 0 && st_state != 'Z' && st_state != 'X' &&
			    st_state != 'x')
				continue;
		} else if (pid != 0 && procstat_alive(pid, atomic_load(&p->starttime))) {
			continue;
		}
		/* free, or left by a dead process: whatever it held is found
		 * missing by the consumer and re-queued, so reuse is safe. Taken
		 * as -me first: between the take and the start time's store a
		 * racer would otherwise read our pid with the dead owner's start
		 * time, call us dead and take the entry from under us. */
		if (!atomic_compare_exchange_strong(&p->pid, &pid, -(int32_t)me))
			continue;
		atomic_store(&p->claiming, 0);
		atomic_store(&p->claim, NONE);
		atomic_store(&p->starttime, st);
		atomic_store(&p->pid, (int32_t)me);
		r->me = i;
		return 0;
	}
	return -EAGAIN;
}

int ring_claim(ring *r, volatile sig_atomic_t *stop, uint64_t *global, void **slot)
{
	ring_ctl *c = r->ctl;
	const ring_params *p = &c->params;
	if (r->me < 0)
		return -EINVAL;
	ring_producer *me = &c->producers[r->me];
	uint64_t n = NONE, t_wait = 0;
	int rc = 0;
	for (;;) {
		if (n == NONE && stop && *stop)
			return -EINTR; /* checked before taking work, not only while waiting */
		if (n == NONE) {
			/* take a number: re-queued first, then the counter; the
			 * claiming flag tells a recovering consumer to wait */
			atomic_store(&me->claiming, 1);
			n = requeue_take(r, NONE);
			if (n == NONE && atomic_load(&c->next_claim) < p->end_batch) {
				n = atomic_fetch_add(&c->next_claim, 1);
				if (n >= p->end_batch)
					n = NONE;
			}
			atomic_store(&me->claim, n);
			atomic_store(&me->claiming, 0);
		}
		uint32_t v;
		_Atomic uint32_t *word;
		if (n == NONE) {
			/* Everything is handed out: stay until the job ends, in
			 * case a batch comes back from a producer that died. */
			word = &c->ctl_futex;
			v = atomic_load(word);
			int has = 0;
			for (int i = 0; i < RING_MAX_PRODUCERS && !has; i++)
				has = atomic_load(&c->requeue[i]) != NONE;
			if (has)
				continue;
		} else {
			ring_slot *s = slot_ctl_of(r, n);
			word = &s->futex;
			v = atomic_load(word);
			uint64_t f = atomic_load(&s->free_for), q = n / p->G;
			if (f == q)
				break;
			if (f > q) { /* consumed already: a duplicate; drop it */
				atomic_store(&me->claim, NONE);
				n = NONE;
				continue;
			}
			/* a re-queued batch below ours is more urgent: swap */
			atomic_store(&me->claiming, 1);
			uint64_t m = requeue_take(r, n);
			if (m != NONE) {
				atomic_store(&me->claim, m);
				requeue_push(r, n); /* the entry m left is free */
			}
			atomic_store(&me->claiming, 0);
			if (m != NONE) {
				futex_bump_wake(&c->ctl_futex);
				n = m;
				continue;
			}
		}
		if (atomic_load(&c->shutdown)) {
			rc = RING_END;
			break;
		}
		if (atomic_load(&c->error)) {
			rc = atomic_load(&c->error);
			break;
		}
		if (stop && *stop) {
			rc = -EINTR;
			if (n != NONE)
				ring_unclaim(r, n);
			break;
		}
		uint64_t t0 = now_ns();
		futex_wait(word, v, (int)p->lease_ms);
		if (n != NONE)
			t_wait += now_ns() - t0;
	}
	atomic_fetch_add(&c->producer_wait_ns, t_wait);
	if (rc != 0)
		return rc;
	*global = n;
	*slot = slot_mem_of(r, n);
	return 0;
}

void ring_publish(ring *r, uint64_t global)
{
	ring_ctl *c = r->ctl;
	ring_slot *s = slot_ctl_of(r, global);
	atomic_store(&s->ready, global / c->params.G + 1);
	atomic_fetch_add(&c->built, 1);
	if (r->me >= 0)
		atomic_store(&c->producers[r->me].claim, NONE);
	futex_bump_wake(&s->futex);
}

void ring_unclaim(ring *r, uint64_t global)
{
	ring_ctl *c = r->ctl;
	if (r->me >= 0)
		atomic_store(&c->producers[r->me].claiming, 1);
	while (requeue_push(r, global) != 0) {
		/* cannot happen with one claim per producer; never drop a batch */
		uint32_t v = atomic_load(&c->ctl_futex);
		futex_wait(&c->ctl_futex, v, 10);
	}
	if (r->me >= 0) {
		atomic_store(&c->producers[r->me].claim, NONE);
		atomic_store(&c->producers[r->me].claiming, 0);
	}
	wake_everyone(r);
}

int ring_produce(ring *r, ring_build_fn build, void *ctx, volatile sig_atomic_t *stop)
{
	int rc = r->me >= 0 ? 0 : ring_producer_register(r);
	if (rc)
		return rc;
	for (;;) {
		uint64_t n;
		void *slot;
		rc = ring_claim(r, stop, &n, &slot);
		if (rc == RING_END)
			return 0;
		if (rc)
			return rc;
		rc = build(ctx, ring_world_batch(&r->ctl->params, n), slot);
		if (rc) {
			log_error("ring: building batch %llu failed: %s", (unsigned long long)n, strerror(-rc));
			ring_fail(r, rc);
			return rc;
		}
		ring_publish(r, n);
	}
}

void ring_fail(ring *r, int error)
{
	int32_t zero = 0;
	atomic_compare_exchange_strong(&r->ctl->error, &zero, (int32_t)(error < 0 ? error : -EIO));
	wake_everyone(r);
}

void ring_shutdown(ring *r)
{
	atomic_store(&r->ctl->shutdown, 1);
	wake_everyone(r);
}

int ring_producers_alive(const ring *r)
{
	int n = 0;
	for (int i = 0; i < RING_MAX_PRODUCERS; i++) {
		const ring_producer *p = &r->ctl->producers[i];
		pid_t pid = atomic_load(&p->pid);
		n += pid != 0 && procstat_alive(pid, atomic_load(&p->starttime));
	}
	return n;
}

void ring_get_counters(const ring *r, uint32_t rank, ring_counters *out)
{
	const ring_ctl *c = r->ctl;
	memset(out, 0, sizeof(*out));
	out->producer_wait_ns = atomic_load(&c->producer_wait_ns);
	out->batches_built = atomic_load(&c->built);
	out->batches_requeued = atomic_load(&c->requeued);
	if (rank < c->params.G) {
		out->consumer_wait_ns = atomic_load(&r->ranks[rank].wait_ns);
		out->batches_consumed = atomic_load(&r->ranks[rank].consumed);
	}
}
