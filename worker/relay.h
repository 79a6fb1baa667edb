/* relay — a multi-node rank's connection to its daemon (docs/multinode.md).
 *
 * srun starts bertd-worker on every node with BERTD_RELAY=<host>:<port>,
 * BERTD_RELAY_TOKEN and SLURM_PROCID in its environment; there is no fd 3.
 * The rank connects to the relay, says who it is and what dataset its node
 * has, and from then on the connection carries the worker protocol exactly
 * as fd 3 does (docs/formats.md). Never exits; never blocks without a bound.
 */
#ifndef BERTD_WORKER_RELAY_H
#define BERTD_WORKER_RELAY_H

#include <stddef.h>

/* Whether this process was started for a multi-node job (BERTD_RELAY set). */
int relay_wanted(void);

/* The rank srun gave this task (SLURM_PROCID), or -1. */
int relay_rank(void);

/* Connects to BERTD_RELAY and sends {"type":"relay","token","rank","node",
 * "dataset_sha256"}: node is SLURMD_NODENAME (else the hostname), the hash
 * the content digest of job_path's dataset_dir on this node (relay.c:
 * the manifest without its "source", and the shards' sizes; "" when this
 * node has none). Returns the connected fd (blocking mode; the caller
 * owns it), or a negative errno with err filled. */
int relay_connect(const char *job_path, int rank, char *err, size_t cap);

/* How long a rank redials its relay after the connection broke (a daemon
 * restart: docs/multinode.md, "A daemon restart"): 10 x the relay's
 * keepalive bound (BERTD_RELAY_TIMEOUT_MS, else 30 s: 300 s). */
int relay_redial_bound_ms(void);

/* relay_connect again for the same rank, with a short connect bound (the
 * rank trains meanwhile); the fd non-blocking. A chan_dial_fn: ctx is the
 * job.json path; the rank is relay_rank()'s. -ESTALE without dialing when
 * the attempt fence names another attempt (worker/fence.h): the daemon is
 * alive and moved on, so a rank cut off from it stops at once instead of
 * redialing for the whole bound. */
int relay_redial(void *ctx);

#endif
