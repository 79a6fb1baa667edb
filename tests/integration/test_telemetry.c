/* Telemetry and diagnosis end to end on the CPU backend: real daemon, real
 * dataset, real worker and loader processes.
 *   - a job on the serial path (dataloader_num_workers 0) reports the full
 *     step-time breakdown, and its diagnosis is the input_bound rule's
 *     computation over its own recorded phases, with the remedy naming
 *     dataloader_num_workers;
 *   - the same job with 2 loaders reports the loader ring counters, and its
 *     verdict again follows from its own phases;
 *   - GET /metrics passes a strict text-format 0.0.4 parser written here,
 *     carries the running job's gauges under the label job_id (never job),
 *     its learning rate and gradient norm equal to those of the metrics row
 *     of the scraped step, and drops them once it finished.
 *
 *   - a slow data source (profiler.simulate_data_delay_ms: every batch
 *     sleeps 100 ms before it is built, as if read from slow storage) makes
 *     the serial job input-bound with the default threshold, with a remedy
 *     naming dataloader_num_workers, and the same job with enough loaders
 *     is not.
 *
 * Without the simulated delay no CPU job here is input-bound: building a
 * batch from the pre-tokenized shards takes 0.02-0.2 ms against 3-60 ms of
 * forward/backward even for a 1-layer, hidden-8 model (data wait 0-2% of a
 * step). The serial-job test therefore sets max_data_wait_share to 0 to get
 * a verdict (showing the override reaches the rule) and checks the rule's
 * number against the phases it recorded. */
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

typedef it_fx fx;

static int setup(void **state)
{
	const char *extra[] = {"--stop-timeout-s", "60", NULL};
	it_daemon_opts o = {.cpu_slots = "2", .extra = extra, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 2000, .vocab_size = 400, .wait_ready = true};
	return it_setup(state, &o, DEADLINE_S);
}

/* The tiny job name on shakes for steps steps (saving every 20, the
 * default learning rate without warm-up) with loaders data loaders and
 * profiler (JSON text; "null": none) as its "profiler" (caller frees). */
static char *spec(const char *name, const char *steps, const char *loaders, const char *profiler)
{
	return it_job_spec(name, "shakes", "training_args.max_steps", steps, "training_args.save_steps", "20",
			   "training_args.dataloader_num_workers", loaders, "training_args.learning_rate", "null",
			   "training_args.warmup_steps", "null", "profiler", profiler, NULL);
}

static json_t *rule(json_t *diag, const char *name)
{
	size_t i;
	json_t *r;
	json_array_foreach(json_object_get(diag, "rules"), i, r) if (strcmp(it_jstr(r, "rule"), name) == 0) return r;
	fail_msg("no rule %s", name);
	return NULL;
}

static double num(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_number(v))
		fail_msg("no number '%s'", k);
	return json_number_value(v);
}

/* Checks the job's own rows: complete breakdown, phases adding up to the
 * step, p95 at least the mean (windows of 5 steps: p95 is the maximum), and
 * returns the data-wait share over the newest 20 rows, computed here. */
static double recorded_share(const bertd *d, const char *id, bool loaders)
{
	json_t *rows = it_metrics_of(d, id);
	size_t n = json_array_size(rows);
	assert_true(n >= 2);
	double wait = 0, step = 0, ckpt = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *r = json_array_get(rows, i), *ph = json_object_get(r, "phases_ms");
		double st = num(r, "step_time_ms"), sum = 0;
		static const char *const names[] = {"data_wait", "h2d", "compute", "allreduce", "optimizer"};
		for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
			double v = num(ph, names[k]);
			assert_true(v >= 0);
			sum += v;
		}
		assert_true(fabs(sum - st) <= 1e-6 * st + 1e-9);
		assert_true(num(ph, "checkpoint") >= 0);
		ckpt += num(ph, "checkpoint");
		assert_true(num(r, "step_time_p95_ms") >= st * (1 - 1e-12));
		assert_non_null(json_object_get(r, "phases_p95_ms"));
		json_t *ld = json_object_get(r, "loader");
		if (loaders) {
			assert_true(json_is_object(ld));
			assert_true(num(ld, "consumer_wait_ms") >= 0);
			assert_true(num(ld, "producer_wait_ms") >= 0);
		} else {
			assert_null(ld);
		}
		if (i + 20 >= n) {
			wait += num(ph, "data_wait");
			step += st;
		}
	}
	assert_true(ckpt > 0); /* save_steps 20 < max_steps: one checkpoint stalled a window */
	if (loaders) { /* over the run the loaders built every batch the worker used */
		double built = 0;
		for (size_t i = 0; i < n; i++)
			built += num(json_object_get(json_array_get(rows, i), "loader"), "batches_built");
		assert_true(built >= 5);
	}
	json_decref(rows);
	return wait / step;
}

/* Runs spec to completion and returns its diagnosis (caller decrefs), with
 * *share the data-wait share recomputed from its rows and *ib its
 * input_bound rule, whose value must be that share. */
static json_t *run_diagnosed(const bertd *d, const char *spec, bool loaders, double *share, json_t **ib)
{
	char *id = it_submit(d, spec);
	char path[128];
	json_t *j = it_wait_job(d, id, "completed|failed", DEADLINE_S);
	assert_string_equal(it_jstr(j, "state"), "completed");
	json_decref(j);
	*share = recorded_share(d, id, loaders);
	snprintf(path, sizeof path, "/v1/jobs/%s/diagnosis", id);
	json_t *dg = it_get_json(d, path);
	*ib = rule(dg, "input_bound");
	assert_true(fabs(num(*ib, "value") - *share) <= 1e-9 * *share + 1e-15);
	free(id);
	return dg;
}

static void test_serial_job_diagnosed_from_its_phases(void **state)
{
	fx *f = *state;
	char *s = spec("serial", "40", "0", "{\"rules\":{\"input_bound\":{\"max_data_wait_share\":0}}}");
	char *id = it_submit(&f->d, s);
	free(s);
	char path[128];
	json_t *j = it_wait_job(&f->d, id, "completed|failed", DEADLINE_S);
	assert_string_equal(it_jstr(j, "state"), "completed");
	double share = recorded_share(&f->d, id, false);
	assert_true(share > 0);

	snprintf(path, sizeof path, "/v1/jobs/%s/diagnosis", id);
	json_t *dg = it_get_json(&f->d, path);
	json_t *ib = rule(dg, "input_bound");
	assert_string_equal(it_jstr(ib, "status"), "issue");
	assert_true(fabs(num(ib, "value") - share) <= 1e-9 * share);
	assert_true(num(ib, "threshold") == 0);
	assert_non_null(strstr(it_jstr(ib, "remedy"), "raise dataloader_num_workers from 0 to "));
	/* CPU job: GPU rules have no data; one worker: no all-reduce */
	assert_string_equal(it_jstr(rule(dg, "low_gpu_utilization"), "status"), "no_data");
	assert_string_equal(it_jstr(rule(dg, "batch_too_small"), "status"), "no_data");
	assert_string_equal(it_jstr(rule(dg, "communication_bound"), "status"), "no_data");
	assert_string_equal(it_jstr(rule(dg, "slow_start"), "status"), "ok");
	assert_string_equal(it_jstr(rule(dg, "straggler"), "status"), "no_data");
	/* the job's one-line summary is the diagnosis summary */
	json_decref(j);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	j = it_get_json(&f->d, path);
	assert_string_equal(it_jstr(j, "diagnosis"), it_jstr(dg, "summary"));
	assert_non_null(strstr(it_jstr(j, "diagnosis"), "input_bound: data wait is"));
	assert_non_null(strstr(it_jstr(j, "diagnosis"), "dataloader_num_workers"));
	json_decref(dg);
	json_decref(j);
	free(id);
}

static void test_loader_job_verdict_follows_phases(void **state)
{
	fx *f = *state;
	double share;
	char *s = spec("loaders", "40", "2", "null");
	json_t *ib, *dg = run_diagnosed(&f->d, s, true, &share, &ib);
	free(s);
	assert_true(num(ib, "threshold") == 0.15);
	assert_string_equal(it_jstr(ib, "status"), share > 0.15 ? "issue" : "ok");
	fprintf(stderr, "2 loaders: data wait share %.4f -> %s\n", share, it_jstr(ib, "status"));
	json_decref(dg);
}

/* The end-to-end check of the diagnosis, with the data source made slow on purpose
 * (a sleep of 100 ms per batch, so loaders hide it the way they hide
 * storage latency): 0 loaders is input-bound at the default threshold, with
 * a remedy that names dataloader_num_workers and a count that follows from
 * the job's own phases; the same job with enough loaders is not.
 *
 * "Enough" is fixed here rather than taken from the remedy: the remedy
 * divides by the serial job's compute time, and on a shared 2-core machine
 * the next job's compute can be several times faster or slower than the one
 * measured. 24 loaders give a batch every 100 / 24 = 4.2 ms, five times what
 * this model consumes at its fastest here (about 20 ms of compute per step
 * on an idle core; several times that under load or ASan, which only helps);
 * the remedy computed from any compute time above 1.5 x 100 / 24 = 6.25 ms
 * is at most 24, which the test checks, so the run with 24 covers it. The
 * serial job waits 100 ms per step against at most ~200 ms of compute under
 * ASan on a loaded machine: a data-wait share of 1/3 or more, well over 0.15.
 * Batch 32 x 64 keeps the step long against the few milliseconds of
 * scheduling noise a loaded machine adds to a window. 96 steps logged every
 * 4: the rules' 20-row window leaves out the first rows. */
static char *slow_spec(const char *name, const char *loaders)
{
	return it_job_spec(name, "shakes", "training_args.per_device_train_batch_size", "32",
			   "training_args.max_seq_length", "64", "training_args.max_steps", "96",
			   "training_args.logging_steps", "4", "training_args.save_steps", "40",
			   "training_args.dataloader_num_workers", loaders, "training_args.learning_rate", "null",
			   "training_args.warmup_steps", "null", "resources", "null",
			   "profiler", "{\"simulate_data_delay_ms\":100}", NULL);
}

static void test_slow_source_input_bound_until_enough_loaders(void **state)
{
	fx *f = *state;
	double share;
	char *s = slow_spec("slow-serial", "0");
	json_t *ib, *dg = run_diagnosed(&f->d, s, false, &share, &ib);
	free(s);
	assert_true(num(ib, "threshold") == 0.15);
	assert_string_equal(it_jstr(ib, "status"), "issue");
	int want = 0;
	const char *rem = strstr(it_jstr(ib, "remedy"), "raise dataloader_num_workers from 0 to ");
	assert_non_null(rem);
	assert_int_equal(sscanf(rem, "raise dataloader_num_workers from 0 to %d", &want), 1);
	/* serial path: a batch takes the data wait itself; aim at 2/3 load */
	assert_int_equal(want, (int)ceil(1.5 * share / (1 - share)));
	assert_true(want >= 1 && want <= 24);
	fprintf(stderr, "slow source, 0 loaders: data wait share %.3f -> remedy %d loaders\n", share, want);
	json_decref(dg);

	s = slow_spec("slow-loaders", "24");
	dg = run_diagnosed(&f->d, s, true, &share, &ib);
	free(s);
	fprintf(stderr, "slow source, 24 loaders: data wait share %.3f -> %s\n", share, it_jstr(ib, "status"));
	assert_string_equal(it_jstr(ib, "status"), "ok");
	json_decref(dg);
}

/* Two workers: each rank's busy time rides the all-reduce to rank 0, the
 * all-reduce is timed, and the straggler / communication rules have data;
 * their verdicts follow from the rows. */
static void test_two_ranks_report_per_rank_times(void **state)
{
	fx *f = *state;
	char *s = it_job_spec("ranks", "shakes", "training_args.save_steps", "100", "training_args.learning_rate", "null",
			      "training_args.warmup_steps", "null", "resources.gpus", "2", NULL);
	char *id = it_submit(&f->d, s);
	free(s);
	char path[128];
	json_t *j = it_wait_job(&f->d, id, "completed|failed", DEADLINE_S);
	assert_string_equal(it_jstr(j, "state"), "completed");
	json_decref(j);
	json_t *rows = it_metrics_of(&f->d, id);
	assert_true(json_array_size(rows) >= 2);
	double busy[2] = {0, 0}, ar = 0, step = 0;
	size_t i;
	json_t *r;
	json_array_foreach(rows, i, r) {
		json_t *rk = json_object_get(r, "rank_step_ms");
		assert_int_equal(json_array_size(rk), 2);
		for (int k = 0; k < 2; k++) {
			double b = json_number_value(json_array_get(rk, k));
			/* No upper bound from rank 0's step time: each rank starts its
			 * step clock when its own previous step ended, so a rank that
			 * finished its optimizer step earlier can be busy a little
			 * longer than rank 0's step measured (seen flaking at 1 in 6). */
			assert_true(b > 0);
			busy[k] += b;
		}
		ar += num(json_object_get(r, "phases_ms"), "allreduce");
		step += num(r, "step_time_ms");
	}
	assert_true(ar > 0);
	json_decref(rows);
	snprintf(path, sizeof path, "/v1/jobs/%s/diagnosis", id);
	json_t *dg = it_get_json(&f->d, path);
	json_t *cb = rule(dg, "communication_bound"), *st = rule(dg, "straggler");
	assert_true(fabs(num(cb, "value") - ar / step) <= 1e-9 * (ar / step));
	assert_string_equal(it_jstr(cb, "status"), ar / step > 0.25 ? "issue" : "ok");
	double hi = busy[0] > busy[1] ? busy[0] : busy[1], lo = busy[0] > busy[1] ? busy[1] : busy[0];
	assert_true(fabs(num(st, "value") - hi / lo) <= 1e-9 * (hi / lo));
	assert_string_equal(it_jstr(st, "status"), hi / lo > 1.25 ? "issue" : "ok");
	json_decref(dg);
	free(id);
}

static void test_profiler_rules_validated(void **state)
{
	fx *f = *state;
	static const struct {
		const char *profiler, *field;
	} bad[] = {
		{"{\"rules\":{\"nope\":{}}}", "profiler.rules.nope"},
		{"{\"rules\":{\"input_bound\":{\"max\":1}}}", "profiler.rules.input_bound.max"},
		{"{\"rules\":{\"straggler\":{\"max_ratio_to_median\":0.5}}}",
		 "profiler.rules.straggler.max_ratio_to_median"},
		{"{\"simulate_data_delay_ms\":-1}", "profiler.simulate_data_delay_ms"},
		{"{\"simulate_data_delay_ms\":10001}", "profiler.simulate_data_delay_ms"},
		{"{\"simulate_data_delay_ms\":1.5}", "profiler.simulate_data_delay_ms"},
		{"{\"simulate_data_delay_ms\":\"5\"}", "profiler.simulate_data_delay_ms"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *s = spec("bad", "10", "0", bad[i].profiler);
		http_resp r;
		assert_int_equal(http_post_json(&f->d, "/v1/jobs", s, &r), 0);
		free(s);
		assert_int_equal(r.status, 422);
		assert_string_equal(it_jstr(r.json, "field"), bad[i].field);
		http_resp_free(&r);
	}
}

/* ---- a strict parser of the Prometheus text format 0.0.4 ---- */

typedef struct prom {
	char fam[64][96];   /* families in order of their TYPE line */
	char type[64][16];
	int nfam;
	char series[512][256]; /* name{labels} seen, for duplicates */
	double value[512];
	int nseries;
} prom;

static int family_of(prom *p, const char *name)
{
	for (int i = 0; i < p->nfam; i++)
		if (strcmp(p->fam[i], name) == 0)
			return i;
	return -1;
}

/* Fails the test on the first violation: unknown line shape, bad metric or
 * label name, bad escape, unparsable value, sample before its TYPE, TYPE
 * twice, a family's samples not together, duplicate series. */
static void prom_parse(const char *text, prom *p)
{
	regex_t help, type, sample, label;
	assert_int_equal(regcomp(&help, "^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*$", REG_EXTENDED), 0);
	assert_int_equal(regcomp(&type, "^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$",
				 REG_EXTENDED), 0);
	assert_int_equal(regcomp(&sample, "^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{[^}]*\\})? ([^ ]+)( -?[0-9]+)?$",
				 REG_EXTENDED), 0);
	assert_int_equal(regcomp(&label, "^([a-zA-Z_][a-zA-Z0-9_]*)=\"((\\\\[\\\\\"n]|[^\\\\\"\n])*)\"(,|$)",
				 REG_EXTENDED), 0);
	memset(p, 0, sizeof *p);
	int last_fam = -1;
	assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
	const char *s = text;
	while (*s) {
		const char *nl = strchr(s, '\n');
		char line[1024];
		size_t len = (size_t)(nl - s);
		assert_true(len < sizeof line);
		memcpy(line, s, len);
		line[len] = 0;
		s = nl + 1;
		regmatch_t m[6];
		if (regexec(&help, line, 6, m, 0) == 0)
			continue;
		if (regexec(&type, line, 6, m, 0) == 0) {
			char name[96];
			snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
			if (family_of(p, name) >= 0)
				fail_msg("TYPE twice for %s", name);
			assert_true(p->nfam < 64);
			snprintf(p->fam[p->nfam], sizeof p->fam[0], "%s", name);
			snprintf(p->type[p->nfam], sizeof p->type[0], "%.*s", (int)(m[2].rm_eo - m[2].rm_so),
				 line + m[2].rm_so);
			last_fam = p->nfam++;
			continue;
		}
		if (line[0] == '#')
			fail_msg("unknown comment line: %s", line);
		if (regexec(&sample, line, 6, m, 0) != 0)
			fail_msg("not a sample line: '%s'", line);
		char name[96], value[64];
		snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
		snprintf(value, sizeof value, "%.*s", (int)(m[3].rm_eo - m[3].rm_so), line + m[3].rm_so);
		int fi = family_of(p, name);
		if (fi < 0)
			fail_msg("sample of %s before its TYPE", name);
		if (fi != last_fam)
			fail_msg("samples of %s are not together", name);
		if (strcmp(p->type[fi], "counter") == 0 && !strstr(name, "_total"))
			fail_msg("counter %s without _total", name);
		char *end;
		double v = strtod(value, &end);
		if (*end && strcmp(value, "+Inf") && strcmp(value, "-Inf") && strcmp(value, "NaN"))
			fail_msg("bad value '%s' in '%s'", value, line);
		if (strcmp(p->type[fi], "counter") == 0 && !(v >= 0))
			fail_msg("negative counter: %s", line);
		if (m[2].rm_so >= 0) { /* labels: name="value" pairs, no duplicates */
			const char *lp = line + m[2].rm_so + 1;
			const char *lend = line + m[2].rm_eo - 1;
			char seen[8][64];
			int nseen = 0;
			while (lp < lend) {
				char buf[512];
				snprintf(buf, sizeof buf, "%.*s", (int)(lend - lp), lp);
				regmatch_t lm[5];
				if (regexec(&label, buf, 5, lm, 0) != 0)
					fail_msg("bad label pair at '%s'", buf);
				char ln[64];
				snprintf(ln, sizeof ln, "%.*s", (int)(lm[1].rm_eo - lm[1].rm_so), buf + lm[1].rm_so);
				for (int k = 0; k < nseen; k++)
					if (strcmp(seen[k], ln) == 0)
						fail_msg("label %s twice", ln);
				assert_true(nseen < 8);
				snprintf(seen[nseen++], sizeof seen[0], "%s", ln);
				lp += lm[0].rm_eo;
			}
		}
		char key[256];
		snprintf(key, sizeof key, "%.*s", (int)(m[3].rm_so - 1), line);
		for (int k = 0; k < p->nseries; k++)
			if (strcmp(p->series[k], key) == 0)
				fail_msg("duplicate series %s", key);
		assert_true(p->nseries < 512);
		p->value[p->nseries] = v;
		snprintf(p->series[p->nseries++], sizeof p->series[0], "%s", key);
	}
	regfree(&help);
	regfree(&type);
	regfree(&sample);
	regfree(&label);
}

static bool has_series(const prom *p, const char *key)
{
	for (int k = 0; k < p->nseries; k++)
		if (strcmp(p->series[k], key) == 0)
			return true;
	return false;
}

static double series_value(const prom *p, const char *key)
{
	for (int k = 0; k < p->nseries; k++)
		if (strcmp(p->series[k], key) == 0)
			return p->value[k];
	fail_msg("no series %s", key);
	return NAN;
}

static void test_parser_accepts_and_refuses(void **state)
{
	(void)state;
	/* the parser itself must be able to fail: a sample before its TYPE
	 * would be refused; check the accepting path on a known-good text and
	 * the regexes on a few bad lines by hand */
	prom p;
	prom_parse("# HELP a_total x\n# TYPE a_total counter\na_total{code=\"200\",x=\"a\\\"b\"} 3\n", &p);
	assert_int_equal(p.nseries, 1);
	regex_t sample;
	assert_int_equal(regcomp(&sample, "^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{[^}]*\\})? ([^ ]+)( -?[0-9]+)?$",
				 REG_EXTENDED), 0);
	assert_int_not_equal(regexec(&sample, "9bad 1", 0, NULL, 0), 0);
	assert_int_not_equal(regexec(&sample, "a b c d", 0, NULL, 0), 0);
	regfree(&sample);
}

static void test_prometheus_metrics(void **state)
{
	fx *f = *state;
	/* long enough to scrape while it runs; canceled afterwards */
	char *s = spec("prom", "100000", "1", "null");
	char *id = it_submit(&f->d, s);
	free(s);
	char path[128], key[256];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	prom *p = calloc(1, sizeof *p);
	assert_non_null(p);
	/* wait for a logged step, then scrape */
	for (int i = 0;; i++) {
		json_t *j = it_get_json(&f->d, path);
		json_int_t step = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
		bool running = strcmp(it_jstr(j, "state"), "running") == 0;
		json_decref(j);
		if (running && step >= 5)
			break;
		if (i > DEADLINE_S * 10)
			fail_msg("job never logged a step");
		it_pause_ms(100);
	}
	/* the daemon's own samples (host CPU, loader CPU) join a row once a
	 * window spans two of its ticks */
	snprintf(path, sizeof path, "/v1/jobs/%s/metrics?limit=10000", id);
	json_t *host = NULL;
	for (int i = 0; !host; i++) {
		json_t *m = it_get_json(&f->d, path);
		json_t *rows = json_object_get(m, "metrics");
		json_t *last = json_array_get(rows, json_array_size(rows) - 1);
		if (json_object_get(last, "host"))
			host = json_incref(json_object_get(last, "host"));
		json_decref(m);
		if (i > DEADLINE_S * 10)
			fail_msg("no host sample in the job's rows");
		if (!host)
			it_pause_ms(100);
	}
	double cpu = num(host, "cpu_util_pct");
	assert_true(cpu >= 0 && cpu <= 100);
	json_t *lcpu = json_object_get(host, "loader_cpu_pct");
	assert_int_equal(json_array_size(lcpu), 1); /* one loader */
	assert_true(json_number_value(json_array_get(lcpu, 0)) >= 0);
	json_decref(host);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);

	http_resp r;
	assert_int_equal(http_get(&f->d, "/metrics", &r), 0);
	assert_int_equal(r.status, 200);
	char ct[128];
	assert_non_null(http_header(&r, "Content-Type", ct, sizeof ct));
	assert_non_null(strstr(ct, "text/plain; version=0.0.4"));
	prom_parse(r.body, p);
	http_resp_free(&r);
	snprintf(key, sizeof key, "bertd_job_loss{job_id=\"%s\"}", id);
	assert_true(has_series(p, key));
	snprintf(key, sizeof key, "bertd_job_step_phase_seconds{job_id=\"%s\",phase=\"data_wait\"}", id);
	assert_true(has_series(p, key));
	snprintf(key, sizeof key, "bertd_job_loader_wait_seconds{job_id=\"%s\",side=\"consumer\"}", id);
	assert_true(has_series(p, key));
	assert_true(has_series(p, "bertd_http_requests_total{code=\"200\"}"));
	snprintf(key, sizeof key, "bertd_job_loader_cpu_ratio{job_id=\"%s\",loader=\"0\"}", id);
	assert_true(has_series(p, key));
	assert_true(has_series(p, "bertd_jobs_submitted_total"));
	assert_true(has_series(p, "bertd_jobs{state=\"running\"}"));
	/* no series carries a label named job: Prometheus sets that one on
	 * every scraped series itself and would rename ours exported_job */
	for (int k = 0; k < p->nseries; k++)
		if (strstr(p->series[k], "{job=") || strstr(p->series[k], ",job="))
			fail_msg("series labelled job: %s", p->series[k]);
	/* learning rate and gradient norm: those of the metrics row the scrape
	 * read, found by its step (the job keeps logging meanwhile) */
	snprintf(key, sizeof key, "bertd_job_step{job_id=\"%s\"}", id);
	double scraped_step = series_value(p, key);
	snprintf(key, sizeof key, "bertd_job_learning_rate{job_id=\"%s\"}", id);
	double scraped_lr = series_value(p, key);
	snprintf(key, sizeof key, "bertd_job_grad_norm{job_id=\"%s\"}", id);
	double scraped_gn = series_value(p, key);
	snprintf(path, sizeof path, "/v1/jobs/%s/metrics?since_step=%.0f&limit=1", id, scraped_step - 1);
	json_t *m = it_get_json(&f->d, path);
	json_t *row = json_array_get(json_object_get(m, "metrics"), 0);
	assert_non_null(row);
	assert_true(num(row, "step") == scraped_step);
	double lr = num(row, "learning_rate"), gn = num(row, "grad_norm");
	assert_true(lr > 0 && gn > 0); /* a real step: 5e-5 decaying linearly, a nonzero gradient */
	if (fabs(scraped_lr - lr) > 1e-12 * lr || fabs(scraped_gn - gn) > 1e-12 * gn)
		fail_msg("step %.0f: /metrics lr %.17g grad_norm %.17g, the job's row %.17g %.17g", scraped_step,
			 scraped_lr, scraped_gn, lr, gn);
	json_decref(m);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);

	/* without the token: 401, like every route but healthz */
	assert_int_equal(http_do(&f->d, "GET", "/metrics", NULL, 0, NULL, H_NO_AUTH, &r), 0);
	assert_int_equal(r.status, 401);
	http_resp_free(&r);

	/* cancel; once it is final its series are gone, the counters stay */
	it_cancel_job(&f->d, id, DEADLINE_S);
	assert_int_equal(http_get(&f->d, "/metrics", &r), 0);
	prom_parse(r.body, p);
	http_resp_free(&r);
	snprintf(key, sizeof key, "bertd_job_loss{job_id=\"%s\"}", id);
	assert_false(has_series(p, key));
	/* this daemon's cancels so far: only this job's (the others completed) */
	assert_true(series_value(p, "bertd_jobs_finished_total{result=\"canceled\"}") == 1);
	assert_true(series_value(p, "bertd_jobs_finished_total{result=\"completed\"}") >= 3);
	assert_true(series_value(p, "bertd_http_requests_total{code=\"401\"}") >= 1);
	assert_true(series_value(p, "bertd_http_requests_total{code=\"422\"}") >= 3);
	free(p);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parser_accepts_and_refuses),
		cmocka_unit_test(test_profiler_rules_validated),
		cmocka_unit_test(test_serial_job_diagnosed_from_its_phases),
		cmocka_unit_test(test_loader_job_verdict_follows_phases),
		cmocka_unit_test(test_slow_source_input_bound_until_enough_loaders),
		cmocka_unit_test(test_two_ranks_report_per_rank_times),
		cmocka_unit_test(test_prometheus_metrics),
	};
	return IT_RUN(tests, setup, it_teardown);
}
