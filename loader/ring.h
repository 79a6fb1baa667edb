/* ring — the job's shared-memory batch rings: L loader processes produce,
 * each of G worker ranks consumes its own ring of S fixed-size slots.
 *
 * One POSIX shm segment per job (ring_name_for_job) holds a control block,
 * per-rank and per-slot control words, and G*S slots of batch.h's layout,
 * each slot 4 KiB aligned so a worker can cudaHostRegister the slot area
 * (ring_slot_area) and cudaMemcpyAsync straight out of it.
 *
 * Protocol. Global batch n goes to rank n % G as that rank's sequence number
 * q = n / G, in slot q % S. A ring may carry only some ranks of a larger
 * world (one node's ranks of a multi-node job: W world ranks, this ring's
 * G from world rank R0 on): its batch numbers n are then its own, and the
 * batch built for n is the world's ring_world_batch(n). A producer claims n (re-queued batches first,
 * then an atomic counter), waits until the consumer has released that slot
 * for q, fills it, and publishes q. The consumer of a rank waits for exactly
 * its next q. All waits are futexes on shared words (never FUTEX_PRIVATE).
 *
 * Failure. Producers register (pid, start time) and record each claim. A
 * consumer whose batch does not come within the lease checks the claimants:
 * if n was claimed and no live producer holds it, n is re-queued and rebuilt
 * by a survivor (batches are pure functions of n, so the bytes are the
 * same). A producer killed mid-write therefore costs one lease of latency,
 * never a wrong or missing batch.
 *
 * This module knows nothing about what a batch contains and must never
 * block without a bound it can re-check (shutdown, errors, dead peers).
 */
#ifndef BERTD_LOADER_RING_H
#define BERTD_LOADER_RING_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "loader/batch.h"

#define RING_MAX_PRODUCERS 256
#define RING_END 1                /* ring_next / ring_claim: stream finished */
#define RING_NAME_MAX 128

typedef struct ring_params {
	uint32_t G;               /* consumer ranks */
	uint32_t S;               /* slots per rank */
	uint32_t M;               /* micro-batches per optimizer step */
	uint32_t lease_ms;        /* dead-claimant check period; 0 = 200 */
	batch_layout layout;      /* slot geometry (slot_bytes from batch_layout_init) */
	uint64_t start_batch;     /* first global batch: resume step * M * G */
	uint64_t end_batch;       /* one past the last; UINT64_MAX = endless */
	uint64_t job_tag;         /* opaque (e.g. config digest) loaders check */
	uint32_t W;               /* world ranks the batches are numbered over; 0: G */
	uint32_t R0;              /* the world rank of this ring's rank 0 (R0 + G <= W) */
} ring_params;

typedef struct ring_counters {
	uint64_t producer_wait_ns;   /* summed over producers: blocked on a full ring */
	uint64_t batches_built;      /* published, re-builds included */
	uint64_t batches_requeued;   /* lost with a dead producer and rebuilt */
	uint64_t consumer_wait_ns;   /* this rank: blocked on an empty ring */
	uint64_t batches_consumed;   /* this rank */
} ring_counters;

typedef struct ring ring;

/* The world's global batch for this ring's batch n: n itself when the
 * ring carries the whole world, else (n / G) * W + R0 + n % G. */
uint64_t ring_world_batch(const ring_params *p, uint64_t n);
/* The world's rank count: W, or G when the ring carries the whole world. */
uint32_t ring_world(const ring_params *p);

/* Writes the segment name for a job id ("/bertd-<id>", as the daemon names it). The id may hold
 * only [A-Za-z0-9_-]. Returns 0, or -EINVAL. */
int ring_name_for_job(char *buf, size_t n, const char *job_id);

/* Creates and initializes the segment (fails with -EEXIST if it exists).
 * Called by the daemon (or the test) before any loader or worker attaches.
 * Returns 0 with *out owned by the caller (ring_detach), -EINVAL for bad
 * params (G, S, M zero, start_batch not a multiple of G, layout unset),
 * or a negative errno from shm_open/ftruncate/mmap. */
int ring_create(ring **out, const char *name, const ring_params *p);

/* Create-or-attach for processes that start in any order (loaders and
 * workers of one job): attaches if the segment exists and its parameters
 * equal *p, else creates it. Creation is atomic (built under a private name,
 * published with link(2) in /dev/shm), so racing openers all end up on one
 * fully initialized segment without waiting. Returns 0 and *out (caller
 * owns), -ESTALE when the existing segment has other parameters, -EINVAL,
 * or a negative errno. */
int ring_open(ring **out, const char *name, const ring_params *p);

/* Maps an existing segment. -ENOENT when absent, -EPROTO when it is not a
 * bertd ring of this version or not fully initialized. */
int ring_attach(ring **out, const char *name);

/* Unmaps (and unregisters a producer registered through this handle). */
void ring_detach(ring *r);

/* Removes the name; mapped handles stay valid. Called at job end. */
int ring_unlink(const char *name);

const ring_params *ring_get_params(const ring *r);

/* The G*S slots as one page-aligned span, for cudaHostRegister. */
void *ring_slot_area(const ring *r, size_t *bytes);

/* ---- consumer (one per rank) ---- */

/* Waits up to timeout_ms (-1: no limit) for the rank's next batch and
 * points *slot at it (a batch_header; valid until ring_release). Returns 0,
 * RING_END after the rank's last batch, -ETIMEDOUT, -ESHUTDOWN after
 * ring_shutdown, or the error a producer reported with ring_fail. */
int ring_next(ring *r, uint32_t rank, int timeout_ms, void **slot);

/* Hands the slot returned by ring_next back to the producers. */
void ring_release(ring *r, uint32_t rank);

/* ---- producers ---- */

/* Takes a producer entry for this process. -EBUSY when already registered
 * through r, -EAGAIN when all RING_MAX_PRODUCERS entries hold live pids. */
int ring_producer_register(ring *r);

/* Claims the next batch to build and waits (futex) until its slot is free.
 * Returns 0 with *global and *slot set, RING_END at job end (ring_shutdown),
 * -EINTR when *stop becomes non-zero (stop may be NULL), or a producer
 * error from ring_fail. Must be followed by ring_publish. */
int ring_claim(ring *r, volatile sig_atomic_t *stop, uint64_t *global, void **slot);

/* Makes the claimed batch visible to its consumer. */
void ring_publish(ring *r, uint64_t global);

/* Gives an unfinished claim back (re-queued for another producer). */
void ring_unclaim(ring *r, uint64_t global);

typedef int (*ring_build_fn)(void *ctx, uint64_t global, void *slot);

/* The loader loop: register, then claim/build/publish until RING_END (returns
 * 0) or *stop (returns -EINTR, claim given back); build gets the world's
 * batch number (ring_world_batch). A build error is reported
 * to every consumer through ring_fail and returned. */
int ring_produce(ring *r, ring_build_fn build, void *ctx, volatile sig_atomic_t *stop);

/* Records a fatal producer error (negative errno) that ring_next returns. */
void ring_fail(ring *r, int error);

/* Ends the job for everyone attached: waiters wake, producers return
 * RING_END, consumers -ESHUTDOWN. */
void ring_shutdown(ring *r);

void ring_get_counters(const ring *r, uint32_t rank, ring_counters *out);

/* Registered producers whose process is still alive (reads /proc). */
int ring_producers_alive(const ring *r);

#endif
