/* sha256 — FIPS 180-4 SHA-256, for content identity (vocab hashes in shard
 * indexes, idempotency request digests). Not for secrets comparison. */
#ifndef BERTD_COMMON_SHA256_H
#define BERTD_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct sha256_ctx {
	uint32_t h[8];
	uint64_t len;      /* bytes hashed so far */
	uint8_t buf[64];
	size_t nbuf;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t n);
void sha256_final(sha256_ctx *c, uint8_t digest[32]);
/* One-shot digest written as 64 lowercase hex chars plus NUL. */
void sha256_hex(const void *data, size_t n, char hex[65]);
/* Formats an existing digest as hex. */
void sha256_to_hex(const uint8_t digest[32], char hex[65]);

#endif
