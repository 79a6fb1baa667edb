/* it_util — small cmocka helpers shared by the integration tests: JSON
 * field access that fails the test, bounded polling of a resource's state,
 * and corpus files cut from the shared data. */
#ifndef BERTD_TESTS_IT_UTIL_H
#define BERTD_TESTS_IT_UTIL_H

#include <jansson.h>

#include "harness.h"

/* The string member key of o; fails the test when absent. */
const char *it_jstr(json_t *o, const char *key);
/* GET path, which must answer 200 with JSON; returns it (caller decrefs). */
json_t *it_get_json(const bertd *d, const char *path);
/* Polls GET path (every 100 ms, at most deadline_s) until its "state" is
 * one of the '|'-separated states; returns the object (caller decrefs) or
 * fails the test with the daemon's log. States change asynchronously, so
 * the tests poll with a deadline and assert on states, never on timing. */
json_t *it_wait_state(const bertd *d, const char *path, const char *states, int deadline_s);
void it_pause_ms(int ms);
/* Writes the first n lines of $BERTD_SHARED_DATA/tinyshakespeare.txt to
 * dir/name. */
void it_make_corpus(const char *dir, const char *name, int n);

/* POST /v1/jobs with spec; asserts 201 and returns the new id (caller frees). */
char *it_submit(const bertd *d, const char *spec);
/* Ends a test's daemon: SIGTERM (when running) must give exit 0, else its
 * log is printed; then the temp root is removed. 0, or -1 for a bad exit. */
int it_daemon_finish(bertd *d);

/* Runs a test file's cmocka group with libcurl initialised around it.
 * IT_ONLY in the environment (a glob of test names) runs only the matching
 * tests, for running one by hand. */
struct CMUnitTest;
int it_run_group(const char *name, const struct CMUnitTest *tests, size_t n, int (*setup)(void **),
		 int (*teardown)(void **));
#define IT_RUN(tests, setup, teardown) \
	it_run_group(__FILE__, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)

#endif
