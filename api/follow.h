/* follow — GET /v1/jobs/{id}/events?follow=1 and /logs?follow=1: a job's
 * events or log lines sent as Server-Sent Events while they happen, the
 * stream ending (event "end") once the job is in a final state and all it
 * produced was sent. Internal to api/.
 *
 * A stream with nothing to send suspends its connection (api_conn_suspend)
 * and gives its pool thread back; one watcher thread per server looks at
 * the suspended streams every FOLLOW_POLL_MS (the job's events in the
 * store, the log file's size, a hang-up on the socket) and resumes those
 * with something to send: new data, the end, a keep-alive comment, or an
 * error. Streams are bounded per job and in all (429 too-many-followers).
 */
#ifndef BERTD_API_FOLLOW_H
#define BERTD_API_FOLLOW_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/http.h"
#include "daemon/store.h"

typedef struct follow_hub follow_hub;

/* Starts the watcher. per_job / total bound the open streams, keepalive_s
 * is how long a stream may stay silent before a ": keep-alive" comment.
 * *out caller-owned (follow_hub_destroy). 0, -ENOMEM, or -errno. */
int follow_hub_create(follow_hub **out, store *st, unsigned per_job, unsigned total,
		      unsigned keepalive_s);
/* Ends every stream (each closes after what it has buffered), resumes the
 * suspended ones and joins the watcher; waits a little for them to finish.
 * Call before the HTTP server stops. NULL is fine; idempotent. */
void follow_hub_stop(follow_hub *h);
/* Frees h once the HTTP server (and every stream's reply) is gone. */
void follow_hub_destroy(follow_hub *h);
/* Streams open now, and the limits. */
void follow_hub_counts(follow_hub *h, unsigned *open, unsigned *per_job, unsigned *total);

/* Reads ?follow=: absent, 0 or false is off, 1 or true on. Returns true,
 * or replies 400 (field follow) and sets *ret. */
bool follow_param(api_request *req, bool *on, enum MHD_Result *ret);
/* Reads the start position: when following, the Last-Event-ID header (an
 * SSE client's reconnect) if sent, else query parameter name (an integer
 * >= 0).
 * *given says whether either was there (*out = 0 if not). Returns true, or
 * replies 400 (field name) and sets *ret. */
bool follow_start(api_request *req, const char *name, bool following, int64_t *out, bool *given,
		  enum MHD_Result *ret);

/* One event as GET /v1/jobs/{id}/events lists it: id (its position in
 * the job's list, from 1), time, from, to, reason. New object or NULL. */
json_t *follow_event_json(const store_event *e, int64_t id);

/* Streams the events of the job req->args.v[0] after the since-th. */
enum MHD_Result follow_events(api_request *req, int64_t since);
/* Streams the log file at path (which may not exist yet) of job
 * req->args.v[0] from byte offset, a line per event. */
enum MHD_Result follow_logs(api_request *req, const char *path, int64_t offset);

#endif
