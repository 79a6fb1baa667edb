/* comm — gradient synchronization between the worker ranks of one job
 * (distributed data parallel: one bertd-worker process per device).
 *
 * One interface, three backends:
 *  - shm (CPU workers): a POSIX shm segment per job holds a control block and
 *    one slab per rank; collectives are a reduce-scatter + all-gather over the
 *    slabs, synchronized with futexes on shared words. Sums run in rank order
 *    0..G-1, so every rank gets bit-identical, run-to-run deterministic
 *    results. Layout and protocol: docs/formats.md.
 *  - net (ranks on different hosts; built when libgloo-dev is there:
 *    worker/comm_net.cc): Gloo's TCP transport, full mesh, rendezvous through
 *    a key/value store the caller provides (the daemon relay's kv_set /
 *    kv_get). Gloo's own allreduce sums in another order, so the collectives
 *    are built on its point-to-point send/recv: the same reduce-scatter (the
 *    owner of each segment receives every rank's piece and sums in rank
 *    order 0..G-1, exactly as shm) and all-gather. Results are bit-identical
 *    to the shm backend's on the same inputs (docs/multinode.md).
 *  - NCCL (CUDA workers, built when cuda_enabled): ncclCommInitRank with a
 *    unique id that rank 0 makes and the caller relays (the daemon socket);
 *    bucketed allreduce on a dedicated stream ordered with events.
 *
 * Failure model: every wait is bounded. A peer that dies (or stops answering
 * for timeout_ms) makes the collective return -EPIPE on the rank that notices
 * it, which sets an abort flag so every other rank returns -EPIPE promptly as
 * well. After -EPIPE the comm is dead: every later call returns -EPIPE; the
 * caller destroys it and exits (the daemon restarts the job).
 *
 * This module never decides to exit, never spins beyond a short bounded spin,
 * and never blocks without a deadline.
 */
#ifndef BERTD_WORKER_COMM_H
#define BERTD_WORKER_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COMM_MAX_WORLD 64
#define COMM_NAME_MAX 128
#define COMM_DEFAULT_TIMEOUT_MS 30000
/* max_floats for the shm backend: 1 MiB chunks. Much smaller chunks are
 * bound by the two sync points per chunk; larger ones leave the cache between
 * copy-in, reduce and copy-out (bench/comm_cpu.c, docs/perf.md). */
#define COMM_DEFAULT_MAX_FLOATS ((size_t)1 << 18)

typedef struct comm comm;

/* Writes the shm segment name for a job id ("/bertd-<job>-comm"). The id may
 * hold only [A-Za-z0-9_-], 1..100 chars. Returns 0, or -EINVAL. */
int comm_name_for_job(char *buf, size_t n, const char *job_id);

/* Joins the shm group `name` as rank of world (1 <= world <= COMM_MAX_WORLD).
 * Rank 0 creates the segment (replacing a stale one left by a dead job);
 * other ranks attach, retrying until rank 0 has created it. Returns once all
 * world ranks have joined. max_floats (>= 1) is the largest piece one
 * collective moves at a time (bigger buffers are chunked); the segment holds
 * about 2 * world * max_floats floats. timeout_ms (> 0; <= 0 means
 * COMM_DEFAULT_TIMEOUT_MS) bounds the join and every later wait for a peer.
 * Returns 0 with *out owned by the caller (comm_destroy); -ETIMEDOUT when a
 * rank did not join in time (logged with its number), -EPIPE when a joined
 * peer died during the join, -EBUSY when a live process already holds this
 * rank, -EINVAL for bad arguments, -EPROTO for a segment of another
 * geometry or version, or a negative errno from shm_open/ftruncate/mmap. */
int comm_create_shm(comm **out, const char *name, int rank, int world, size_t max_floats,
                    int timeout_ms);

/* Leaves the group and frees c (NULL is fine). Peers still waiting on this
 * rank see it as lost. The shm name is unlinked by rank 0, by the last rank
 * to leave, or by anyone after an abort. */
void comm_destroy(comm *c);

int comm_rank(const comm *c);
int comm_world(const comm *c);

/* In place: buf[i] = (buf_0[i] + buf_1[i] + ... + buf_{G-1}[i]) / G, the sum
 * taken in rank order in float. shm: buf is host memory; NCCL: device memory,
 * and the call returns when buf holds the result. Every rank must pass the
 * same n (a mismatch is detected and gives -EPROTO on all ranks).
 * Returns 0, -EPIPE (peer lost or group aborted), -EPROTO. */
int comm_allreduce_mean(comm *c, float *buf, size_t n);

/* In place sum of n host doubles over ranks (metrics: loss sums, token
 * counts), in rank order. Returns 0, -EPIPE, -EPROTO, -EINVAL (n < 0). */
int comm_allreduce_sum_f64(comm *c, double *vals, int n);

/* Returns when every rank has called it. 0 or -EPIPE. */
int comm_barrier(comm *c);

/* Copies root's bytes of host memory buf into every other rank's buf.
 * 0, -EPIPE, -EPROTO, -EINVAL (bad root). */
int comm_broadcast(comm *c, void *buf, size_t bytes, int root);

/* Whether every rank holds the same bytes (replicas that should be identical
 * by construction: the parameters after an all-reduced step). Each rank
 * hashes its buffer (64-bit FNV-1a over 8-byte words); the group sums the
 * hash's four 16-bit pieces and their squares in f64 — exact, as pieces are
 * below 2^16 and G <= 64 — and the pieces agree iff G*sum(x^2) == sum(x)^2.
 * A collective: every rank calls it (bytes may differ; it is hashed).
 * Returns 1 (all equal), 0 (some rank differs), -EPIPE, -EPROTO. */
int comm_replicas_agree(comm *c, const void *buf, size_t bytes);

/* Declares the group dead (err, a negative errno, is logged): every rank's
 * current and next collective returns -EPIPE. For a rank that hit a local
 * fatal error, so its peers need not wait out their timeout. */
void comm_abort(comm *c, int err);

/* ---- net backend (worker/comm_net.cc; without libgloo-dev comm_create_net
 * logs why and returns -ENOTSUP) ---- */

/* The rendezvous store of the net backend. set publishes len bytes under key
 * (keys are short ASCII; a value is at most COMM_KV_MAX bytes); get waits
 * up to timeout_ms for key to exist and copies its value into val (cap
 * bytes), its length in *len. Both return 0 or a negative errno; get
 * -ETIMEDOUT when the key did not appear in time, -EMSGSIZE when cap is too
 * small. Called only from the thread that calls comm_create_net. */
#define COMM_KV_MAX 65536
typedef struct comm_kv {
    void *ctx;
    int (*set)(void *ctx, const char *key, const void *val, size_t len);
    int (*get)(void *ctx, const char *key, void *val, size_t cap, size_t *len, int timeout_ms);
} comm_kv;

typedef struct comm_net_opts {
    const char *bind_addr; /* local address peers reach this rank at (numeric or name) */
    const char *iface;     /* or an interface name (bind_addr wins when both are set) */
    size_t max_floats;     /* largest piece one collective moves at a time; 0: default */
    int timeout_ms;        /* bounds the rendezvous and every wait; <= 0: default */
} comm_net_opts;

/* Joins the group of world ranks over TCP: every rank listens on
 * opts->bind_addr (or opts->iface), publishes its addresses in kv under its
 * rank, reads every other rank's and connects the full mesh. Returns 0 with
 * *out owned by the caller (comm_destroy); -ETIMEDOUT when some rank did not
 * publish within timeout_ms, -EPIPE when a connection failed, -EINVAL for
 * bad arguments (no address, world out of range), -ENOTSUP when bertd was
 * built without libgloo-dev. A lost peer later gives -EPIPE on every
 * collective, as in the shm backend; comm_abort closes every connection so
 * the peers see it at once. */
int comm_create_net(comm **out, int rank, int world, const comm_kv *kv, const comm_net_opts *opts);

/* Whether this build has the net backend (1) or not (0). */
int comm_net_available(void);

/* ---- NCCL backend (defined only in CUDA builds: worker/comm_nccl.cu) ---- */

typedef enum comm_dtype { COMM_FP32 = 0, COMM_BF16 = 1, COMM_FP16 = 2 } comm_dtype;

/* Rank 0 hands the unique id bytes to send (e.g. as {"type":"nccl_id",
 * "id":hex} over its daemon socket); other ranks get them from recv, which
 * must fill exactly `len` bytes or fail (negative errno). Both may block but
 * must be bounded by the caller's own timeout. */
typedef int (*comm_id_send_fn)(void *ctx, const void *id, size_t len);
typedef int (*comm_id_recv_fn)(void *ctx, void *id, size_t len);

/* Opens NCCL (libnccl.so.2, found as common/nccl_lib.h says) and resolves
 * the entry points bertd uses, once per process. 0 with msg "NCCL 2.21.5
 * from <path>"; -ENOENT (not found) or -ENOSYS (too old, a symbol missing)
 * with msg naming what is missing. msg may be NULL. */
int comm_nccl_load(char *msg, size_t n);

/* Selects device, bootstraps the NCCL communicator (rank 0: ncclGetUniqueId
 * then send; others: recv) and creates the communication stream and events.
 * reduce_dtype says in which precision fp32 gradients travel (fp32, or
 * converted to bf16/fp16 on the comm stream and back). timeout_ms bounds
 * ncclCommInitRank and every wait (<= 0: COMM_DEFAULT_TIMEOUT_MS).
 * Returns 0 with *out owned by the caller; -ENODEV without the device,
 * -ETIMEDOUT, -EPIPE (NCCL error, comm aborted), -ENOMEM, -ENOENT / -ENOSYS
 * (NCCL cannot be loaded: comm_nccl_load), or the callback's error. Must be called in the process that uses it (never across fork). */
int comm_create_nccl(comm **out, int rank, int world, int device, comm_dtype reduce_dtype,
                     comm_id_send_fn send, comm_id_recv_fn recv, void *ctx, int timeout_ms);

/* Enqueues the mean-allreduce of n fp32 device floats at dev_buf (one
 * bucket) so that it starts after everything already queued on
 * compute_stream (a cudaStream_t; NULL = legacy default stream) and runs on
 * the comm stream, overlapping later compute. Returns 0 or -EPIPE. */
int comm_nccl_bucket_start(comm *c, float *dev_buf, size_t n, void *compute_stream);

/* The same for one bucket made of k ranges: one ncclGroupStart/End around
 * their all-reduces, so NCCL launches the bucket as one operation. */
int comm_nccl_bucket_start_ranges(comm *c, float *const *dev_bufs, const size_t *n, int k,
                                  void *compute_stream);

/* The mean-allreduce of n fp32 device floats in place, ordered after the
 * work already queued on stream (a cudaStream_t: the one that wrote
 * dev_buf), and stream waits for the result; returns (bounded) when it is
 * done. comm_allreduce_mean on an NCCL comm is this with the legacy
 * default stream, which a non-blocking stream does not order against.
 * 0, -EPIPE, -EINVAL (another backend). */
int comm_nccl_allreduce_mean(comm *c, float *dev_buf, size_t n, void *stream);

/* Makes compute_stream wait (on the device, no host sync) for every bucket
 * started so far, then checks NCCL for asynchronous errors. 0 or -EPIPE. */
int comm_nccl_buckets_wait(comm *c, void *compute_stream);

/* Host wait, bounded by timeout_ms, until every bucket started so far has
 * been reduced. A lost peer hangs the NCCL kernel and with it everything
 * queued behind it on compute_stream, so the training loop calls this before
 * any host-blocking sync of the compute stream (loss read-back, checkpoint)
 * instead of blocking there forever. 0, or -EPIPE (comm aborted). */
int comm_nccl_drain(comm *c);

/* Host wait, bounded by timeout_ms like comm_nccl_drain, for a CUDA event
 * (a cudaEvent_t) recorded after a graph launch whose capture holds the
 * buckets (lever GRAPH: their comm stream work runs inside the graph, so
 * the comm stream itself has nothing to drain). NCCL's asynchronous errors
 * are checked while it waits. Inside a capture, comm_nccl_drain returns 0
 * at once and this is the wait that replaces it. 0, or -EPIPE (comm
 * aborted). */
int comm_nccl_wait_event(comm *c, void *event);

/* The comm_nccl_* calls return -EINVAL on a comm of another backend. */

#ifdef __cplusplus
}
#endif

#endif
