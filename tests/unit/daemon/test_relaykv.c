/* relaykv (daemon/relaykv.c): the ranks' rendezvous map. A get of a key
 * not set yet is answered when it is set, to every rank waiting; a get of a
 * set key at once; a key set again answers with the newest value; bad
 * messages and a full map answer the rank with an error instead of leaving
 * it waiting. The sends are recorded, not performed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/relaykv.h"

typedef struct sent {
	int n;
	int rank[64];
	json_t *m[64];
} sent;

static int record(void *ctx, int rank, json_t *m)
{
	sent *s = ctx;
	assert_true(s->n < 64);
	s->rank[s->n] = rank;
	s->m[s->n++] = json_incref(m);
	return 0;
}

static void sent_clear(sent *s)
{
	for (int i = 0; i < s->n; i++)
		json_decref(s->m[i]);
	s->n = 0;
}

static void msg(relaykv **kv, sent *s, int rank, const char *json)
{
	json_t *m = json_loads(json, 0, NULL);
	assert_non_null(m);
	assert_true(relaykv_is_message(m));
	assert_int_equal(relaykv_handle(kv, "job-1", rank, m, record, s), 0);
	json_decref(m);
}

static void assert_answer(const sent *s, int i, int rank, const char *key, const char *value)
{
	assert_int_equal(s->rank[i], rank);
	assert_string_equal(json_string_value(json_object_get(s->m[i], "type")), "kv");
	assert_string_equal(json_string_value(json_object_get(s->m[i], "key")), key);
	if (value)
		assert_string_equal(json_string_value(json_object_get(s->m[i], "value")), value);
	else
		assert_non_null(json_string_value(json_object_get(s->m[i], "error")));
}

static void get_waits_for_set(void **state)
{
	(void)state;
	relaykv *kv = NULL;
	sent s = {0};
	msg(&kv, &s, 1, "{\"type\":\"kv_get\",\"key\":\"0\"}");
	msg(&kv, &s, 2, "{\"type\":\"kv_get\",\"key\":\"0\"}");
	msg(&kv, &s, 2, "{\"type\":\"kv_get\",\"key\":\"1\"}");
	assert_int_equal(s.n, 0); /* nobody has set anything: all wait */
	msg(&kv, &s, 0, "{\"type\":\"kv_set\",\"key\":\"0\",\"value\":\"ab01\"}");
	assert_int_equal(s.n, 2);
	assert_answer(&s, 0, 1, "0", "ab01");
	assert_answer(&s, 1, 2, "0", "ab01");
	sent_clear(&s);
	msg(&kv, &s, 3, "{\"type\":\"kv_get\",\"key\":\"0\"}"); /* already set: at once */
	assert_int_equal(s.n, 1);
	assert_answer(&s, 0, 3, "0", "ab01");
	sent_clear(&s);
	msg(&kv, &s, 1, "{\"type\":\"kv_set\",\"key\":\"1\",\"value\":\"\"}");
	assert_int_equal(s.n, 1); /* rank 2's wait for "1" */
	assert_answer(&s, 0, 2, "1", "");
	sent_clear(&s);
	msg(&kv, &s, 0, "{\"type\":\"kv_set\",\"key\":\"0\",\"value\":\"cd\"}");
	msg(&kv, &s, 4, "{\"type\":\"kv_get\",\"key\":\"0\"}");
	assert_int_equal(s.n, 1);
	assert_answer(&s, 0, 4, "0", "cd");
	sent_clear(&s);
	relaykv_destroy(kv);
}

static void bad_messages_answered(void **state)
{
	(void)state;
	relaykv *kv = NULL;
	sent s = {0};
	msg(&kv, &s, 0, "{\"type\":\"kv_set\",\"key\":\"a\",\"value\":7}");
	msg(&kv, &s, 0, "{\"type\":\"kv_set\",\"key\":\"\",\"value\":\"x\"}");
	msg(&kv, &s, 0, "{\"type\":\"kv_get\"}");
	assert_int_equal(s.n, 3);
	for (int i = 0; i < 3; i++)
		assert_non_null(json_string_value(json_object_get(s.m[i], "error")));
	sent_clear(&s);
	/* the refused set stored nothing */
	msg(&kv, &s, 1, "{\"type\":\"kv_get\",\"key\":\"a\"}");
	assert_int_equal(s.n, 0);
	relaykv_destroy(kv);
	json_t *other = json_pack("{s:s}", "type", "metrics");
	assert_false(relaykv_is_message(other));
	json_decref(other);
}

static void full_map_refuses(void **state)
{
	(void)state;
	relaykv *kv = NULL;
	sent s = {0};
	char m[128];
	for (int i = 0; i < RELAYKV_MAX_KEYS; i++) {
		snprintf(m, sizeof m, "{\"type\":\"kv_set\",\"key\":\"k%d\",\"value\":\"v\"}", i);
		msg(&kv, &s, 0, m);
	}
	assert_int_equal(s.n, 0);
	msg(&kv, &s, 0, "{\"type\":\"kv_set\",\"key\":\"one-more\",\"value\":\"v\"}");
	assert_int_equal(s.n, 1);
	assert_answer(&s, 0, 0, "one-more", NULL);
	sent_clear(&s);
	relaykv_destroy(kv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(get_waits_for_set),
		cmocka_unit_test(bad_messages_answered),
		cmocka_unit_test(full_map_refuses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
