/* Scheduler policy: priority then submission order, head-of-line waits,
 * impossible requests reported, lowest free devices chosen. And CPU-slot
 * discovery. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/devices.h"
#include "daemon/scheduler.h"

static void test_priority_then_fifo(void **state)
{
	(void)state;
	sched_job q[] = {
		{"a", 0, 3, 1, 0}, {"b", 5, 9, 1, 0}, {"c", 5, 4, 1, 0}, {"d", -1, 1, 1, 0},
	};
	bool busy[4] = {false, false, false, false};
	size_t j;
	int dev[4];
	assert_int_equal(sched_pick(q, 4, busy, 4, &j, dev), SCHED_START);
	assert_string_equal(q[j].id, "c"); /* highest priority, earlier of b/c */
	assert_int_equal(dev[0], 0);
}

static void test_head_waits_no_backfill(void **state)
{
	(void)state;
	sched_job q[] = {{"big", 0, 1, 2, 0}, {"small", 0, 2, 1, 0}};
	bool busy[2] = {true, false};
	size_t j = 99;
	int dev[2];
	assert_int_equal(sched_pick(q, 2, busy, 2, &j, dev), SCHED_NONE);
	busy[0] = false;
	assert_int_equal(sched_pick(q, 2, busy, 2, &j, dev), SCHED_START);
	assert_string_equal(q[j].id, "big");
	assert_int_equal(dev[0], 0);
	assert_int_equal(dev[1], 1);
}

static void test_lowest_free_devices(void **state)
{
	(void)state;
	sched_job q[] = {{"x", 0, 1, 2, 0}};
	bool busy[4] = {true, false, true, false};
	size_t j;
	int dev[4];
	assert_int_equal(sched_pick(q, 1, busy, 4, &j, dev), SCHED_START);
	assert_int_equal(dev[0], 1);
	assert_int_equal(dev[1], 3);
}

static void test_impossible(void **state)
{
	(void)state;
	sched_job q[] = {{"ok", 9, 1, 1, 0}, {"huge", 0, 2, 8, 0}};
	bool busy[2] = {false, false};
	size_t j;
	int dev[2];
	assert_int_equal(sched_pick(q, 2, busy, 2, &j, dev), SCHED_IMPOSSIBLE);
	assert_string_equal(q[j].id, "huge");
	assert_int_equal(sched_pick(q, 1, busy, 2, &j, dev), SCHED_START);
	assert_int_equal(sched_pick(q, 0, busy, 2, &j, dev), SCHED_NONE);
}

static void test_cpu_slots(void **state)
{
	(void)state;
	device *d = NULL;
	size_t n = 0;
	assert_int_equal(devices_discover("cpu", 3, &d, &n), 0);
	assert_int_equal(n, 3);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(d[i].kind, DEVICE_CPU);
		assert_int_equal(d[i].index, (int)i);
	}
	free(d);
	assert_int_equal(devices_discover("cpu", 0, &d, &n), 0);
	assert_true(n >= 1);
	free(d);
	assert_int_equal(devices_discover("tpu", 0, &d, &n), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_priority_then_fifo),
		cmocka_unit_test(test_head_waits_no_backfill),
		cmocka_unit_test(test_lowest_free_devices),
		cmocka_unit_test(test_impossible),
		cmocka_unit_test(test_cpu_slots),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
