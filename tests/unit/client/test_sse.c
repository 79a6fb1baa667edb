/* client_sse — the SSE parser bertctl follows the daemon's streams with:
 *   - a stream as the daemon writes it (ids, an "end" event, keep-alive
 *     comments, a data line split by a CR inside a log line) gives the
 *     same events whatever pieces the bytes arrive in (every cut point);
 *   - CR, LF and CRLF line ends, a CRLF split across two pieces, "field:"
 *     with and without the space, multi-line data joined with LF, an event
 *     without data not dispatched, the id kept across events;
 *   - a stream cut mid-event dispatches nothing of that event and keeps the
 *     last complete id (what a reconnect sends as Last-Event-ID), and after
 *     sse_reset the half-read bytes do not leak into the next event. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "client/sse.h"

typedef struct seen {
	char text[4096]; /* "event|id|data\n" per dispatched event */
	int n;
} seen;

static int collect(void *arg, const char *event, const char *id, const char *data, size_t len)
{
	seen *s = arg;
	assert_int_equal(strlen(data), len);
	size_t used = strlen(s->text);
	snprintf(s->text + used, sizeof s->text - used, "%s|%s|%s\n", event, id, data);
	s->n++;
	return 0;
}

static const char daemon_stream[] =
	"id: 1\n"
	"data: {\"id\":1,\"from\":\"queued\",\"to\":\"queued\",\"reason\":\"submitted\"}\n"
	"\n"
	": keep-alive\n"
	"\n"
	"id: 2\n"
	"data: {\"id\":2,\"from\":\"queued\",\"to\":\"starting\"}\n"
	"\n"
	"id: 249\n"
	"data: step 5/60 loss\n"
	"data: 5.97\n"
	"\n"
	"event: end\n"
	"data: {\"state\":\"completed\"}\n"
	"\n";

static const char want[] = "|1|{\"id\":1,\"from\":\"queued\",\"to\":\"queued\",\"reason\":\"submitted\"}\n"
			   "|2|{\"id\":2,\"from\":\"queued\",\"to\":\"starting\"}\n"
			   "|249|step 5/60 loss\n5.97\n"
			   "end|249|{\"state\":\"completed\"}\n";

static void test_every_cut(void **state)
{
	(void)state;
	size_t n = strlen(daemon_stream);
	for (size_t cut = 0; cut <= n; cut++) {
		seen s = {0};
		sse_parser p;
		sse_init(&p, collect, &s);
		assert_int_equal(sse_feed(&p, daemon_stream, cut), 0);
		assert_int_equal(sse_feed(&p, daemon_stream + cut, n - cut), 0);
		assert_string_equal(s.text, want);
		sse_free(&p);
	}
	/* one byte at a time */
	seen s = {0};
	sse_parser p;
	sse_init(&p, collect, &s);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(sse_feed(&p, daemon_stream + i, 1), 0);
	assert_string_equal(s.text, want);
	assert_int_equal(s.n, 4);
	sse_free(&p);
}

static void test_line_ends_and_fields(void **state)
{
	(void)state;
	seen s = {0};
	sse_parser p;
	sse_init(&p, collect, &s);
	/* CRLF split between pieces must be one line end, not an empty line */
	assert_int_equal(sse_feed(&p, "id:7\r", strlen("id:7\r")), 0);
	assert_int_equal(sse_feed(&p, "\ndata:a\rdata:  b\r\n\r\n", strlen("\ndata:a\rdata:  b\r\n\r\n")), 0);
	assert_string_equal(s.text, "|7|a\n b\n");
	/* an event with only an id dispatches nothing, but the id stays */
	assert_int_equal(sse_feed(&p, "id: 8\n\n", strlen("id: 8\n\n")), 0);
	assert_int_equal(s.n, 1);
	assert_string_equal(p.id, "8");
	assert_int_equal(sse_feed(&p, "data\n\n", strlen("data\n\n")), 0); /* "data" without colon: an empty data line */
	assert_string_equal(s.text, "|7|a\n b\n|8|\n");
	sse_free(&p);
}

static void test_cut_mid_event(void **state)
{
	(void)state;
	seen s = {0};
	sse_parser p;
	sse_init(&p, collect, &s);
	const char part[] = "id: 3\ndata: three\n\nid: 4\ndata: fo";
	assert_int_equal(sse_feed(&p, part, strlen(part)), 0);
	assert_int_equal(s.n, 1);
	/* the cut event's id line was read, but a reconnect must ask for the
	 * event again: the caller sends the id of the last dispatched event */
	sse_reset(&p);
	const char again[] = "id: 4\ndata: four\n\n";
	assert_int_equal(sse_feed(&p, again, strlen(again)), 0);
	assert_string_equal(s.text, "|3|three\n|4|four\n");
	sse_free(&p);
}

static int stop_at_second(void *arg, const char *event, const char *id, const char *data, size_t len)
{
	(void)event, (void)id, (void)data, (void)len;
	return ++*(int *)arg == 2 ? 42 : 0;
}

static void test_callback_stops(void **state)
{
	(void)state;
	int n = 0;
	sse_parser p;
	sse_init(&p, stop_at_second, &n);
	assert_int_equal(sse_feed(&p, "data: a\n\ndata: b\n\ndata: c\n\n", strlen("data: a\n\ndata: b\n\ndata: c\n\n")), 42);
	assert_int_equal(n, 2);
	sse_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_cut),
		cmocka_unit_test(test_line_ends_and_fields),
		cmocka_unit_test(test_cut_mid_event),
		cmocka_unit_test(test_callback_stops),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
