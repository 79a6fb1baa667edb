/* sse — a Server-Sent Events parser (the WHATWG event-stream format): bytes
 * in, whatever pieces the network cut them into; whole events out through a
 * callback. Pure: no I/O, no allocation but its own buffers, so it is tested
 * byte by byte. Must never dispatch an event before its blank line arrived
 * (a stream cut mid-event drops that event: its id was not seen, so a
 * reconnect with Last-Event-ID asks for it again). */
#ifndef BERTD_CLIENT_SSE_H
#define BERTD_CLIENT_SSE_H

#include <stddef.h>

/* One dispatched event. data: the data lines joined with '\n' (data_len
 * bytes, NUL-terminated); event: its "event:" name, "" for the default
 * "message"; id: the last event id seen so far ("" when none). All are
 * borrowed for the callback's duration. The callback returns 0 to go on,
 * nonzero to stop (sse_feed then returns that value). */
typedef int (*sse_event_fn)(void *arg, const char *event, const char *id, const char *data,
			    size_t data_len);

typedef struct sse_parser {
	char *line;          /* the line being read (line_len bytes of line_cap) */
	size_t line_len, line_cap;
	char *data;          /* the event's data so far */
	size_t data_len, data_cap;
	char event[64];
	char id[64];         /* the last event id buffer: survives dispatches */
	int have_data;       /* a data line was seen in this event */
	int after_cr;        /* the last byte was CR: a following LF is the same line end */
	sse_event_fn fn;
	void *arg;
} sse_parser;

void sse_init(sse_parser *p, sse_event_fn fn, void *arg);
/* Feeds n bytes; returns 0, a callback's nonzero value, or -1 (out of memory). */
int sse_feed(sse_parser *p, const char *buf, size_t n);
/* Forgets a half-read line and event (a new connection starts clean);
 * keeps the last event id. */
void sse_reset(sse_parser *p);
void sse_free(sse_parser *p);

#endif
