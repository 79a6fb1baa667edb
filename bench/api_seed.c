/* api_seed — fills a bertd database with N jobs for bench/api.sh, through
 * daemon/store*.c as the daemon would write them, before the daemon starts.
 * Usage: api_seed [--queued] DB_PATH N [SCHEMA_SQL]
 *   SCHEMA_SQL: migrations to create the file with instead of the built-in
 *   schema.sql (an older tree's, so an older bertd can open the copy)
 *   --queued: every job stays queued, as a submitted sweep waits behind a
 *   held queue (the daemon must run with schedule=false)
 * Every job has the normalized example spec of the job-spec tests. Without
 * --queued, of each 4 jobs, 2
 * end completed (devices, METRICS logged steps, one checkpoint), 1 failed
 * after 2 steps, 1 is canceled while queued; so a list page mixes rows with and
 * without progress, as a long-lived daemon's would. The spec's dataset
 * ("pubmed") is stored as ready, so the spec can be submitted as is (the
 * daemon must hold its queue: nothing reads the absent shards). Each store call is
 * its own synchronous transaction, as in the daemon, so bench/api.sh puts
 * the database on a scratch (tmpfs) directory to seed 10,000 jobs fast. */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"
#include "daemon/store.h"

#define METRICS 25 /* more than DIAG_WINDOW: the diagnosis reads a full window */

static const char *example =
	"{\"name\": \"bench\", \"dataset\": \"pubmed\","
	" \"model\": {\"preset\": \"bert-base\", \"num_hidden_layers\": 12},"
	" \"training_args\": {\"per_device_train_batch_size\": 64, \"learning_rate\": 1e-4,"
	"   \"warmup_steps\": 10, \"max_steps\": 1000, \"max_seq_length\": 128, \"logging_steps\": 10,"
	"   \"save_steps\": 100, \"dataloader_num_workers\": 2},"
	" \"resources\": {\"gpus\": 1}}";

static int fail(const char *what, int rc)
{
	fprintf(stderr, "api_seed: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
	return 1;
}

/* The whole file as a NUL-terminated string; NULL (errno set) on failure. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap = 2 * cap + 4096 + 1);
			if (!nb) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = nb;
		}
		size_t got = fread(buf + len, 1, 4096, f);
		len += got;
		if (got < 4096)
			break;
	}
	bool bad = ferror(f);
	fclose(f);
	if (bad) {
		free(buf);
		errno = EIO;
		return NULL;
	}
	buf[len] = '\0';
	return buf;
}

static int add_metrics(store *st, const char *id, int steps, int64_t t0)
{
	for (int k = 1; k <= steps; k++) {
		char v[256];
		snprintf(v, sizeof v,
			 "{\"loss\": %.4f, \"learning_rate\": 0.0001, \"grad_norm\": 1.25, \"epoch\": %.3f,"
			 " \"tokens_per_s\": 51234.5, \"step_time_ms\": 120.5, \"loader_wait_ms\": 1.5}",
			 8.0 - 0.1 * k, 0.01 * k);
		int rc = store_metric_insert(st, id, 10 * k, t0 + 1000 * k, v);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int main(int argc, char **argv)
{
	bool queued = argc > 1 && strcmp(argv[1], "--queued") == 0;
	if (queued) {
		argv++;
		argc--;
	}
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: api_seed [--queued] DB_PATH N [SCHEMA_SQL]\n");
		return 2;
	}
	long n = strtol(argv[2], NULL, 10);
	json_t *in = json_loads(example, 0, NULL), *spec = NULL;
	jobspec_error err = {0};
	if (!in || jobspec_normalize(in, &spec, &err)) {
		fprintf(stderr, "api_seed: spec: %s %s\n", err.field, err.detail);
		return 1;
	}
	char *spec_text = json_dumps(spec, JSON_COMPACT);
	store *st = NULL;
	int rc;
	if (argc == 4) {
		char *schema = slurp(argv[3]);
		if (!schema)
			return fail(argv[3], errno ? errno : EIO);
		rc = store_open_schema(&st, argv[1], schema);
		free(schema);
	} else {
		rc = store_open(&st, argv[1]);
	}
	if (rc < 0)
		return fail("store_open", rc);
	store_dataset ds = {.id = "ds-00000000000be0da", .name = "pubmed", .spec_json = "{}"};
	if ((rc = store_dataset_insert(st, &ds)) < 0 ||
	    (rc = store_dataset_finish(st, ds.id, DATASET_READY, NULL, NULL)) < 0)
		return fail("storing the dataset", rc);
	int64_t t0 = 1767225600000; /* 2026-01-01 */
	for (long i = 0; i < n; i++) {
		char id[32], name[32];
		snprintf(id, sizeof id, "job-%016lx", 0xbe00000000000000ul + (unsigned long)i);
		snprintf(name, sizeof name, "bench-%ld", i);
		store_job job = {.id = id, .name = name, .spec_json = spec_text, .state = JOB_QUEUED,
				 .created_ms = t0 + i * 1000};
		if ((rc = store_job_insert(st, &job, NULL, NULL, NULL, NULL, NULL, NULL)) < 0)
			return fail("store_job_insert", rc);
		if (queued)
			continue;
		if (i % 4 == 3) {
			/* none stays queued: the daemon under test starts no worker */
			rc = store_job_transition(st, id, JOB_MASK(JOB_QUEUED), JOB_CANCELED, NULL, NULL);
			if (rc < 0)
				return fail("canceling a job", rc);
			continue;
		}
		if ((rc = store_job_transition(st, id, JOB_MASK(JOB_QUEUED), JOB_RUNNING, NULL, NULL)) < 0 ||
		    (rc = store_job_set_devices(st, id, "[{\"kind\": \"cpu\", \"index\": 0}]")) < 0)
			return fail("starting a job", rc);
		bool ok = i % 4 != 2;
		if ((rc = add_metrics(st, id, ok ? METRICS : 2, t0 + i * 1000)) < 0)
			return fail("store_metric_insert", rc);
		if (ok) {
			char path[96];
			snprintf(path, sizeof path, "/var/lib/bertd/jobs/%s/checkpoints/step-250", id);
			store_checkpoint c = {.step = 250, .path = path, .bytes = 1 << 20};
			if ((rc = store_checkpoint_insert(st, id, &c)) < 0)
				return fail("store_checkpoint_insert", rc);
		}
		rc = store_job_transition(st, id, JOB_MASK(JOB_RUNNING), ok ? JOB_COMPLETED : JOB_FAILED,
					  ok ? NULL : "worker exited with 1", NULL);
		if (rc < 0)
			return fail("finishing a job", rc);
	}
	store_close(st);
	free(spec_text);
	json_decref(spec);
	json_decref(in);
	printf("api_seed: %ld %sjobs in %s\n", n, queued ? "queued " : "", argv[1]);
	return 0;
}
