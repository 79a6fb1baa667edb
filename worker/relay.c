/* relay — see relay.h. */
#include "worker/relay.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/keepalive.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/sha256.h"
#include "worker/fence.h"

#define CONNECT_TIMEOUT_S 30
#define REDIAL_CONNECT_TIMEOUT_S 2
#define RELAY_TIMEOUT_MS 30000 /* without BERTD_RELAY_TIMEOUT_MS: the daemon's default */

int relay_wanted(void)
{
	const char *r = getenv("BERTD_RELAY");
	return r && *r;
}

int relay_rank(void)
{
	const char *p = getenv("SLURM_PROCID");
	char *end;
	long v = p ? strtol(p, &end, 10) : -1;
	return p && *p && !*end && v >= 0 && v < 4096 ? (int)v : -1;
}

/* The dataset's content digest, hex; "" when it has no readable manifest.
 * sha256 over the manifest without "source" (which holds when and from
 * which paths it was prepared: the same content prepared on two nodes
 * differs there), keys sorted, then each shard's .bin and .idx size. The
 * manifest names the vocab by its sha256 and every shard by its documents,
 * sentences and tokens; reading every shard byte on every rank at every
 * start would cost minutes on a real corpus. */
static void dataset_digest(const char *dir, char hex[65])
{
	char path[1200];
	hex[0] = 0;
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	json_t *m = json_load_file(path, 0, NULL);
	if (!json_is_object(m)) {
		json_decref(m);
		return;
	}
	json_object_del(m, "source");
	char *text = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
	sha256_ctx c;
	sha256_init(&c);
	if (text)
		sha256_update(&c, text, strlen(text));
	size_t i;
	json_t *sh;
	json_array_foreach(json_object_get(m, "shards"), i, sh) {
		const char *name = json_string_value(json_object_get(sh, "name"));
		static const char *const ext[] = {"bin", "idx"};
		for (int k = 0; name && k < 2; k++) {
			struct stat st;
			snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext[k]);
			long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
			char line[64];
			int n = snprintf(line, sizeof line, "\n%s %lld", ext[k], size);
			sha256_update(&c, line, (size_t)n);
		}
	}
	free(text);
	json_decref(m);
	uint8_t d[32];
	sha256_final(&c, d);
	sha256_to_hex(d, hex);
}

/* A mixture's digest: the sha256 of its components' digests, one a line
 * in the job's order; "" when any component has none (a missing copy). */
static void mixture_digest(json_t *dirs, char hex[65])
{
	sha256_ctx c;
	sha256_init(&c);
	hex[0] = 0;
	size_t i;
	json_t *d;
	json_array_foreach(dirs, i, d) {
		char one[65];
		dataset_digest(json_string_value(d) ? json_string_value(d) : "", one);
		if (!one[0])
			return;
		sha256_update(&c, one, strlen(one));
		sha256_update(&c, "\n", 1);
	}
	uint8_t out[32];
	sha256_final(&c, out);
	sha256_to_hex(out, hex);
}

/* "host:port" or "[v6]:port" into host and port. */
static int split_addr(const char *addr, char *host, size_t cap, char *port, size_t pcap)
{
	const char *colon = strrchr(addr, ':');
	if (!colon || !colon[1])
		return -EINVAL;
	const char *h = addr;
	size_t hl = (size_t)(colon - addr);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl == 0 || hl >= cap || strlen(colon + 1) >= pcap)
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = 0;
	snprintf(port, pcap, "%s", colon + 1);
	return 0;
}

static int relay_timeout_ms(void)
{
	const char *t = getenv("BERTD_RELAY_TIMEOUT_MS");
	return t && atoi(t) > 0 ? atoi(t) : RELAY_TIMEOUT_MS;
}

int relay_redial_bound_ms(void)
{
	return 10 * relay_timeout_ms();
}

static int connect_relay(const char *job_path, int rank, int connect_s, char *err, size_t cap);

int relay_connect(const char *job_path, int rank, char *err, size_t cap)
{
	return connect_relay(job_path, rank, CONNECT_TIMEOUT_S, err, cap);
}

int relay_redial(void *ctx)
{
	char err[512];
	if (fence_check(err, sizeof err) == -ESTALE) {
		log_error("%s", err);
		return -ESTALE;
	}
	int fd = connect_relay(ctx, relay_rank(), REDIAL_CONNECT_TIMEOUT_S, err, sizeof err);
	if (fd >= 0)
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

static int connect_relay(const char *job_path, int rank, int connect_s, char *err, size_t cap)
{
	const char *addr = getenv("BERTD_RELAY"), *token = getenv("BERTD_RELAY_TOKEN");
	char host[256], port[16], node[256] = "", sha[65] = "";
	if (!addr || !token || split_addr(addr, host, sizeof host, port, sizeof port) < 0) {
		snprintf(err, cap, "BERTD_RELAY (%s) or BERTD_RELAY_TOKEN is missing or malformed",
			 addr ? addr : "unset");
		return -EINVAL;
	}
	const char *nn = getenv("SLURMD_NODENAME");
	if (nn && *nn)
		snprintf(node, sizeof node, "%s", nn);
	else if (gethostname(node, sizeof node - 1) < 0)
		snprintf(node, sizeof node, "?");
	json_t *job = json_load_file(job_path, 0, NULL);
	const char *ds = json_string_value(json_object_get(job, "dataset_dir"));
	json_t *dirs = json_object_get(job, "dataset_dirs");
	if (json_array_size(dirs) > 1)
		mixture_digest(dirs, sha);
	else if (ds)
		dataset_digest(ds, sha);
	json_decref(job);

	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	int rc = getaddrinfo(host, port, &hints, &ai);
	if (rc != 0) {
		snprintf(err, cap, "relay %s: %s", addr, gai_strerror(rc));
		return -EHOSTUNREACH;
	}
	int fd = -1;
	rc = -ECONNREFUSED;
	for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
		fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
		if (fd < 0)
			continue;
		struct timeval tv = {.tv_sec = connect_s};
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect() too */
		if (connect(fd, p->ai_addr, p->ai_addrlen) < 0) {
			rc = -errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (fd >= 0) { /* the daemon cut off from this node: an error, not silence forever */
		keepalive_set(fd, relay_timeout_ms());
	}
	if (fd < 0) {
		snprintf(err, cap, "cannot reach the daemon's relay %s: %s", addr, strerror(-rc));
		return rc;
	}
	json_t *m = json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", "relay", "token", token, "rank", rank, "node",
			      node, "dataset_sha256", sha);
	rc = m ? msg_send(fd, m) : -ENOMEM;
	json_decref(m);
	if (rc < 0) {
		snprintf(err, cap, "relay %s: %s", addr, strerror(-rc));
		close(fd);
		return rc;
	}
	return fd;
}
