/* relaykv — see relaykv.h. A small linear map: a job has a few keys per
 * rank (at most a few hundred), set once each during the rendezvous. */
#include "daemon/relaykv.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

typedef struct kv_entry {
	char *key;
	json_t *value; /* a JSON string, ours */
} kv_entry;

typedef struct kv_waiter {
	char *key;
	int rank;
} kv_waiter;

struct relaykv {
	kv_entry *e;
	size_t n, cap;
	kv_waiter *w;
	size_t nw, capw;
};

int relaykv_is_message(const json_t *m)
{
	const char *t = json_string_value(json_object_get(m, "type"));
	return t && (strcmp(t, "kv_set") == 0 || strcmp(t, "kv_get") == 0);
}

static json_t *lookup(const relaykv *kv, const char *key)
{
	for (size_t i = 0; i < kv->n; i++)
		if (strcmp(kv->e[i].key, key) == 0)
			return kv->e[i].value;
	return NULL;
}

static int reply(relaykv_send_fn send, void *ctx, int rank, const char *key, json_t *value, const char *error)
{
	json_t *m = value ? json_pack("{s:s, s:s, s:O}", "type", "kv", "key", key, "value", value)
			  : json_pack("{s:s, s:s, s:s}", "type", "kv", "key", key, "error", error);
	if (!m)
		return -ENOMEM;
	int rc = send(ctx, rank, m);
	json_decref(m);
	return rc;
}

static int grow(void **p, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 16;
	void *q = realloc(*p, nc * size);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = nc;
	return 0;
}

static int set(relaykv *kv, const char *job_id, const char *key, json_t *value, relaykv_send_fn send, void *ctx)
{
	json_t *old = lookup(kv, key);
	if (old) { /* set again (a rank that restarted its rendezvous): the newest wins */
		for (size_t i = 0; i < kv->n; i++)
			if (kv->e[i].value == old) {
				json_decref(old);
				kv->e[i].value = json_incref(value);
			}
	} else {
		if (kv->n >= RELAYKV_MAX_KEYS)
			return -ENOSPC;
		if (grow((void **)&kv->e, &kv->cap, kv->n, sizeof *kv->e) < 0)
			return -ENOMEM;
		char *k = strdup(key);
		if (!k)
			return -ENOMEM;
		kv->e[kv->n++] = (kv_entry){.key = k, .value = json_incref(value)};
	}
	/* answer whoever waits for it */
	size_t keep = 0;
	for (size_t i = 0; i < kv->nw; i++) {
		if (strcmp(kv->w[i].key, key) == 0) {
			if (reply(send, ctx, kv->w[i].rank, key, value, NULL) < 0)
				log_warn("job %s: kv: cannot answer rank %d's get of %s", job_id, kv->w[i].rank, key);
			free(kv->w[i].key);
		} else {
			kv->w[keep++] = kv->w[i];
		}
	}
	kv->nw = keep;
	return 0;
}

static int get(relaykv *kv, int rank, const char *key, relaykv_send_fn send, void *ctx)
{
	json_t *v = lookup(kv, key);
	if (v)
		return reply(send, ctx, rank, key, v, NULL);
	if (kv->nw >= RELAYKV_MAX_KEYS)
		return -ENOSPC;
	if (grow((void **)&kv->w, &kv->capw, kv->nw, sizeof *kv->w) < 0)
		return -ENOMEM;
	char *k = strdup(key);
	if (!k)
		return -ENOMEM;
	kv->w[kv->nw++] = (kv_waiter){.key = k, .rank = rank};
	return 0;
}

int relaykv_handle(relaykv **kvp, const char *job_id, int rank, const json_t *m, relaykv_send_fn send,
		   void *ctx)
{
	const char *type = json_string_value(json_object_get(m, "type"));
	const char *key = json_string_value(json_object_get(m, "key"));
	json_t *value = json_object_get(m, "value");
	bool is_set = type && strcmp(type, "kv_set") == 0;
	const char *bad = NULL;
	if (!key || !key[0] || strlen(key) >= RELAYKV_MAX_KEY)
		bad = "key must be a string of 1..127 bytes";
	else if (is_set && (!json_is_string(value) || json_string_length(value) > RELAYKV_MAX_VALUE))
		bad = "value must be a string of at most 131072 bytes";
	if (!*kvp && !bad) {
		*kvp = calloc(1, sizeof **kvp);
		if (!*kvp)
			return -ENOMEM;
	}
	int rc = bad ? -EINVAL : is_set ? set(*kvp, job_id, key, value, send, ctx) : get(*kvp, rank, key, send, ctx);
	if (rc == -EINVAL || rc == -ENOSPC) {
		const char *why = bad ? bad : "the job's key/value map is full";
		log_warn("job %s: rank %d: %s refused: %s", job_id, rank, type ? type : "kv", why);
		return reply(send, ctx, rank, key && strlen(key) < RELAYKV_MAX_KEY ? key : "", NULL, why) == -ENOMEM
			       ? -ENOMEM : 0;
	}
	return rc == -ENOMEM ? rc : 0;
}

void relaykv_destroy(relaykv *kv)
{
	if (!kv)
		return;
	for (size_t i = 0; i < kv->n; i++) {
		free(kv->e[i].key);
		json_decref(kv->e[i].value);
	}
	for (size_t i = 0; i < kv->nw; i++)
		free(kv->w[i].key);
	free(kv->e);
	free(kv->w);
	free(kv);
}
