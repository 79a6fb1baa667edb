/* api — the REST control plane (libmicrohttpd + jansson).
 *
 * MHD runs its own thread pool; handlers read and write through store_* and
 * never touch child processes or daemon state directly. Every error is one
 * application/problem+json reply (problem.h). Never links worker/ or kernels/.
 */
#ifndef BERTD_API_API_H
#define BERTD_API_API_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/devices.h"
#include "daemon/store.h"

typedef struct api_config {
	const char *listen_addr;       /* numeric IPv4/IPv6 address, e.g. "127.0.0.1" */
	int port;                      /* 0 = any free port (see api_server_port) */
	bool allow_remote;             /* must be true to bind a non-loopback address */
	size_t max_body_bytes;         /* larger bodies get 413, counted while uploading */
	const char *token;             /* with tokens NULL: the one bearer token (an admin named
					* "default") every route but the public ones requires */
	struct tokens *tokens;         /* the named tokens and roles (daemon/tokens.h; owned by the
					* caller, outlives the server); NULL: token alone */
	unsigned threads;              /* MHD thread pool size */
	unsigned conn_timeout_s;       /* idle connection timeout */
	unsigned conn_limit;           /* total concurrent connections */
	unsigned per_ip_limit;         /* concurrent connections per client address (not loopback) */
	unsigned request_timeout_s;    /* deadline for a request's headers and body, from the
					* connection's start or the previous response; 0 = 10 */
	size_t conn_memory;            /* MHD memory per connection, bytes */
	unsigned follow_max_per_job;   /* open ?follow=1 streams per job; 0 = 8 */
	unsigned follow_max_total;     /* open ?follow=1 streams in all; 0 = 32 */
	unsigned follow_keepalive_s;   /* a quiet follow stream gets a comment this often; 0 = 15 */
	const char *const *data_roots; /* allowed corpus/dataset directories */
	size_t n_data_roots;
	const char *state_dir;
	struct retention *retention;  /* job directories: removal, disk use, ceiling (daemon/retention.h) */
	const device *devices;        /* what jobs run on (GET /v1/devices) */
	size_t n_devices;
	const char *slurm_srun;       /* "" or NULL: no submit-time node check (docs/multinode.md) */
	const char *slurm_conf;       /* SLURM_CONF for that check's sinfo; "" = Slurm's default */
	const char *bin_dir;          /* where bertd-worker is (checkpoint exports: daemon/hfexport.h) */
	const char *nccl_version;     /* "2.21.5", or NULL: NCCL cannot be loaded (common/nccl_lib.h) */
	const char *nccl_problem;     /* why not, when nccl_version is NULL */
	const char *tls_cert;         /* PEM certificate chain file: serve HTTPS; NULL or "" = plain */
	const char *tls_key;          /* its PEM private key file (with tls_cert) */
} api_config;

typedef struct api_server api_server;

/* Binds and starts serving. *out is caller-owned (api_server_stop).
 * Returns 0, -EPERM (non-loopback address without allow_remote),
 * -EADDRINUSE / -EADDRNOTAVAIL / -EINVAL (bind failed), -ENOMEM. */
int api_server_start(api_server **out, const api_config *cfg, store *st);
/* The TCP port actually bound (useful with port 0). */
int api_server_port(const api_server *srv);
/* Whether srv serves HTTPS. */
bool api_server_tls(const api_server *srv);

/* What a configuration reload (daemon/reload.h) changes in a running
 * server, from any thread, without closing the listener or a connection:
 * the bearer token (1..256 characters; -EINVAL otherwise), the limits
 * (api_config's meaning; 0 = default), and the TLS credentials (loaded and
 * checked beforehand with api/tls.h's api_tls_creds_load; taken over on 0;
 * -EINVAL, not taken, when srv is plain HTTP: turning TLS on or off needs a
 * restart). Each takes effect for requests and handshakes that start after
 * it. */
struct api_tls_creds;
int api_server_set_token(api_server *srv, const char *token);
void api_server_set_limits(api_server *srv, size_t max_body_bytes, unsigned per_ip_limit,
			   unsigned request_timeout_s);
int api_server_set_tls(api_server *srv, struct api_tls_creds *creds);

/* Stops accepting, waits for in-flight requests, frees srv. NULL is fine. */
void api_server_stop(api_server *srv);

#endif
