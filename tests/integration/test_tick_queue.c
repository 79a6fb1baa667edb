/* tick_queue — the scheduler's tick decides over the whole queue, however
 * long: with 1,000 jobs queued before it, a 1,001st of higher priority
 * starts first (the tick used to read the first 1,000 rows only and would
 * have started the oldest). The job's processes are stand-ins that only
 * sleep (a bin dir of two shell scripts), so the one CPU slot stays taken
 * and what started first is what is "starting" while the rest wait. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "daemon/store.h"
#include "harness.h"
#include "it_store.h"
#include "it_util.h"

#define NQ 1000

static void fake_bin(const char *dir, const char *name)
{
	char path[200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *fp = fopen(path, "w");
	assert_non_null(fp);
	fputs("#!/bin/sh\nexec sleep 300\n", fp);
	assert_int_equal(fclose(fp), 0);
	assert_int_equal(chmod(path, 0755), 0);
}

static void job_id(char *buf, size_t cap, int i)
{
	snprintf(buf, cap, "job-%016x", i);
}

static void test_job_past_1000_starts_first(void **state)
{
	(void)state;
	it_fx *f = it_daemon_start(&(it_daemon_opts){.deferred = true}, 0);
	assert_non_null(f);
	store *st = NULL;
	assert_int_equal(it_store_seed_dataset(&f->d, &st), 0);
	static store_job jobs[NQ + 1];
	static store_insert ins[NQ + 1];
	static char ids[NQ + 1][32];
	for (int i = 0; i <= NQ; i++) {
		job_id(ids[i], sizeof ids[i], i + 1);
		jobs[i] = (store_job){.id = ids[i], .name = (char *)"sweep",
				      .spec_json = (char *)"{\"dataset\":\"" IT_SEEDED_DATASET "\"}",
				      .priority = i == NQ ? 5 : 0, .owner = (char *)"default"};
		ins[i].job = &jobs[i];
	}
	assert_int_equal(store_job_insert_group(st, ins, NQ + 1), 0);
	store_close(st);
	char bin[160];
	snprintf(bin, sizeof bin, "%s/fakebin", f->d.root);
	assert_int_equal(mkdir(bin, 0700), 0);
	fake_bin(bin, "bertd-worker");
	fake_bin(bin, "bertd-loader");
	const char *extra[] = {"--bin-dir", bin, "--stop-timeout-s", "1", NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.devices = "cpu", .cpu_slots = "1", .extra = extra}), 0);

	json_t *j = it_wait_job(&f->d, ids[NQ], "starting|running|failed|canceled", 120);
	if (strcmp(it_jstr(j, "state"), "starting") != 0) {
		char *txt = json_dumps(j, JSON_COMPACT);
		bertd_print_log(&f->d);
		fail_msg("the 1,001st job did not start: %s", txt);
	}
	json_decref(j);
	/* the slot is taken: the oldest job still waits */
	char path[96];
	snprintf(path, sizeof path, "/v1/jobs/%s", ids[0]);
	j = it_get_json(&f->d, path);
	assert_string_equal(it_jstr(j, "state"), "queued");
	json_decref(j);
	assert_int_equal(it_daemon_stop(f), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_job_past_1000_starts_first),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
