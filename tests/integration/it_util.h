/* it_util — the integration tests' fixture and cmocka helpers: a test
 * daemon's start, restart and stop (it_daemon_*, it_setup/it_teardown, on
 * top of harness.h's bertd_*), the tiny CPU job spec and its builder
 * (it_job_spec), JSON field access that fails the test, bounded polling of
 * a resource's or a job's state, a job's metrics and export, the processes
 * running it, and corpus files cut from real text (tests/testdata.h).
 * Test-only code: it never sleeps to wait for an outcome (it polls with a
 * deadline) and never leaves a daemon or a temp root behind a failed setup. */
#ifndef BERTD_TESTS_IT_UTIL_H
#define BERTD_TESTS_IT_UTIL_H

#include <jansson.h>
#include <stdbool.h>

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
/* Writes the first n lines of real text to dir/name: tinyshakespeare of
 * ../shared/data ($BERTD_SHARED_DATA) when present, else the texts of
 * /usr/share/common-licenses (about 4,600 lines; tests/testdata.h). */
void it_make_corpus(const char *dir, const char *name, int n);

/* POST /v1/jobs with spec; asserts 201 and returns the new id (caller frees). */
char *it_submit(const bertd *d, const char *spec);
/* POST /v1/datasets with spec, for setup functions (which do not fail the
 * test): 0 on 201, else prints the answer and returns -1. */
int it_add_dataset(const bertd *d, const char *spec);
/* Waits (it_wait_state) until dataset name is "ready"; fails the test with
 * its representation and the daemon's log when it failed instead. */
void it_wait_dataset_ready(const bertd *d, const char *name, int deadline_s);

/* Polls GET /v1/jobs/{id} (every 100 ms, at most deadline_s) until its
 * state is one of the '|'-separated states or, with step > 0, until it has
 * logged step (failing the test when the job ends first). watch, when not
 * NULL, is called with arg and id before every poll, to see the job's
 * processes while they live. Returns the job (caller decrefs); fails the
 * test with the daemon's log at the deadline. */
json_t *it_poll_job(const bertd *d, const char *id, const char *states, long step, int deadline_s,
		    void (*watch)(void *arg, const char *id), void *arg);
/* it_poll_job until one of states, unwatched; returns the job (caller decrefs). */
json_t *it_wait_job(const bertd *d, const char *id, const char *states, int deadline_s);
/* POST /v1/jobs/{id}/cancel (a 2xx answer expected), then waits until the
 * job is terminal and asserts it ended canceled. */
void it_cancel_job(const bertd *d, const char *id, int deadline_s);
/* it_poll_job until step is logged, unwatched. */
void it_wait_step(const bertd *d, const char *id, long step, int deadline_s);
/* Fails the test, with the daemon's log and the failure_reason, unless
 * job's state is "completed". */
void it_assert_completed(const bertd *d, const json_t *job);
/* Waits (it_wait_job) until job id ends and asserts it completed
 * (it_assert_completed); returns the job (caller decrefs). */
json_t *it_wait_completed(const bertd *d, const char *id, int deadline_s);
/* A TCP connection to d's port on loopback, recv timing out after
 * recv_timeout_s (a hung daemon fails the read instead of hanging the
 * test); fails the test when it cannot connect. */
int it_connect(const bertd *d, int recv_timeout_s);
/* The "events" array of GET /v1/jobs/{id}/events (caller decrefs). */
json_t *it_events_of(const bertd *d, const char *id);
/* The reason of the first event in ev whose reason holds text, or NULL
 * (borrowed from ev). */
const char *it_event_with(json_t *ev, const char *text);
/* The "metrics" rows of GET /v1/jobs/{id}/metrics (caller decrefs). */
json_t *it_metrics_of(const bertd *d, const char *id);
/* Whether an event of job id holds text in its reason. */
bool it_has_event(const bertd *d, const char *id, const char *text);
/* Fails the test unless job id's metrics rows are steps every, 2 x every,
 * ... steps, each once, in order. */
void it_assert_metrics_every(const bertd *d, const char *id, long steps, long every);
/* The highest ckpt-<step> with its DONE marker in job id's checkpoints
 * under state_dir; -1 when there is none. */
long it_newest_checkpoint(const char *state_dir, const char *id);
/* PRAGMA user_version (the schema version) of d's store, read with the
 * sqlite3 CLI (scripts/setup installs it); fails the test when it cannot. */
long it_store_user_version(const bertd *d);
/* sha256sum of the job's exported model_dir/model.safetensors: 64 hex
 * digits and a NUL in hex. */
void it_sha_of_export(const json_t *job, char hex[65]);
/* A job's exported model.safetensors: the JSON header and the bytes after it. */
typedef struct it_export {
	json_t *hdr;
	unsigned char *data; /* (len) bytes, tensors at their header data_offsets */
	size_t len;
} it_export;
/* Reads the job's model_dir/model.safetensors into e (it_export_free frees
 * it); fails the test unless it is a little-endian u64 length, a JSON
 * header of that length (under 1 MiB), then the data. */
void it_export_load(const json_t *job, it_export *e);
void it_export_free(it_export *e);
/* pids of live (not zombie) processes whose command line contains a and,
 * when b is not NULL, b: at most cap of them into out; returns how many. */
int it_find_pids(const char *a, const char *b, pid_t *out, int cap);
/* pid's state letter in /proc/pid/stat ('R', 'S', 'T', 'Z', ...), or 0
 * once it is gone. */
char it_proc_state(pid_t pid);
/* kill -9 of job id's worker of rank rank, which must be the one live
 * process naming the job and "--rank <rank>" (else the test fails). */
void it_kill_rank(const char *id, int rank);
/* Runs the shell command that printf(fmt, ...) makes: its exit status, or
 * -1 when it did not exit (a signal). */
int it_system(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes text to path (replacing it); fails the test when it cannot. */
void it_write_file(const char *path, const char *text);
/* The whole file at path, NUL-terminated (caller frees), its length in *n
 * when n is not NULL; NULL when it cannot be read. */
char *it_slurp(const char *path, size_t *n);
/* Runs $BERTD_BIN with args (NULL-ended, after the program name; no
 * NOTIFY_SOCKET) to its exit, its output to log_path, for a command or a
 * daemon that must not start; one still running after deadline_s is
 * stopped and fails the test with its log. Returns the wait status. */
int it_run_bertd_to_exit(const char *const *args, const char *log_path, int deadline_s);

/* ---- the fixture: one test daemon ----
 *
 * The integration tests start their daemons through it_daemon_start: a
 * fresh temp root (root/state the state dir, root/data the data root), the
 * bertd on it, optionally a corpus and a dataset; it_daemon_run restarts
 * it (after bertd_stop or bertd_kill9) with the same or other arguments;
 * it_daemon_stop ends it (SIGTERM must give exit 0) and removes the root.
 * it_setup / it_teardown do the same as cmocka setup and teardown. A test
 * that needs another daemon beside its own starts a second fixture. */

/* What the tests vary. Arguments, in this order: bertd_start's defaults
 * (--port 0, --listen 127.0.0.1, --config /dev/null, --log-level debug,
 * --schedule false), then unless plain --data-roots root/data, --devices
 * (devices, "cpu" when NULL), --cpu-slots when cpu_slots is given,
 * --schedule (schedule, "true" when NULL), then extra. */
typedef struct it_daemon_opts {
	bool plain;                /* only bertd_start's defaults and extra (API tests: no data root, queue held) */
	bool deferred;             /* make the root, start nothing: the test prepares it, then it_daemon_run */
	const char *devices;       /* --devices */
	const char *cpu_slots;     /* --cpu-slots */
	const char *schedule;      /* --schedule */
	const char *const *extra;  /* more arguments, NULL-ended; may be NULL */
	const char *dataset;       /* added from corpus with vocab_size; NULL: none */
	const char *corpus;        /* file name under data, corpus_lines lines (it_make_corpus) */
	int corpus_lines;
	int vocab_size;
	bool wait_ready;           /* wait until the dataset is ready */
} it_daemon_opts;

#define IT_MAX_ARGS 48
/* A test daemon. d comes first, so a test that needs only the daemon may
 * read its cmocka state as a bertd *. */
typedef struct it_fx {
	bertd d;
	char data[160];            /* root/data, made always (the data root unless plain) */
	char *args[IT_MAX_ARGS];   /* the arguments of the last start, NULL-ended (owned) */
} it_fx;

/* Makes the root and the data root, then (unless o->deferred) starts bertd
 * with o's arguments, writes the corpus and adds the dataset; with
 * wait_ready also waits (deadline_s) until it is ready, printing it and the
 * daemon's log when it failed. Returns the fixture (it_daemon_stop frees
 * it), or NULL after any failure, with nothing left running. For setup
 * functions: it does not fail the test. */
it_fx *it_daemon_start(const it_daemon_opts *o, int deadline_s);
/* (Re)starts bertd on f's state dir with o's arguments (its dataset
 * fields are not used), or with those of the last start when o is NULL:
 * bertd_start's answer (0, -ETIMEDOUT, -ECHILD, -errno). */
int it_daemon_run(it_fx *f, const it_daemon_opts *o);
/* SIGTERM (when running), which must give exit 0 (else its log is
 * printed), then removes the root and frees f: 0, or -1 for a bad exit.
 * NULL is a no-op returning 0. */
int it_daemon_stop(it_fx *f);
/* Ends a test's daemon: SIGTERM (when running) must give exit 0, else its
 * log is printed; then the temp root is removed. 0, or -1 for a bad exit. */
int it_daemon_finish(bertd *d);

/* Ends a cmocka setup that made f: with f and ok, f becomes *state and 0
 * is returned; else f (may be NULL) is stopped and freed and -1 returned. */
int it_setup_end(void **state, it_fx *f, bool ok);
/* cmocka setup body: it_daemon_start(o, deadline_s) into *state; 0 or -1. */
int it_setup(void **state, const it_daemon_opts *o, int deadline_s);
/* cmocka teardown: it_daemon_stop(*state). */
int it_teardown(void **state);

/* The small bert-tiny model of the CPU job tests: hidden 32, 2 heads,
 * intermediate 64, 64 positions, layers (a string literal) layers. */
#define IT_TINY_MODEL(layers)                                                              \
	"\"model\":{\"preset\":\"bert-tiny\",\"hidden_size\":32,\"num_hidden_layers\":" layers \
	",\"num_attention_heads\":2,\"intermediate_size\":64,\"max_position_embeddings\":64}"
/* The learning rate and warm-up most of the tiny jobs train with, as
 * training_args members after a comma. */
#define IT_LR_WARMUP ",\"learning_rate\":0.01,\"warmup_steps\":2"

/* The job-spec builder every integration test submits its jobs with: the
 * tiny CPU job (IT_TINY_MODEL("1"); batch 8, max_seq_length 32, max_steps
 * 20, logging_steps 5, save_steps 10, no loaders, seed 7, learning rate
 * 0.01, 2 warm-up steps; one rank), named name (no "name" when NULL) on
 * dataset, then the overrides: pairs of a dotted path
 * ("training_args.max_steps", "init_from") and its value as JSON text
 * ("40", "\"all\"", "{...}"; a whole object replaces the member), the list
 * ended by NULL; the value "null" removes the member. Returns compact JSON
 * text (caller frees); a value that is not JSON fails the test. */
char *it_job_spec(const char *name, const char *dataset, ...) __attribute__((sentinel));
/* r must be a 422 naming field whose detail (printed) holds each
 * '|'-separated part of parts; else fails the test. Frees r. */
void it_assert_refused(http_resp *r, const char *field, const char *parts);
/* POST /v1/jobs with spec, then it_assert_refused. */
void it_submit_refused(const bertd *d, const char *spec, const char *field, const char *parts);

/* Runs a test file's cmocka group with libcurl initialised around it.
 * IT_ONLY in the environment (a glob of test names) runs only the matching
 * tests, for running one by hand. */
struct CMUnitTest;
int it_run_group(const char *name, const struct CMUnitTest *tests, size_t n, int (*setup)(void **),
		 int (*teardown)(void **));
#define IT_RUN(tests, setup, teardown) \
	it_run_group(__FILE__, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)

#endif
