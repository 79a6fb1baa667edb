/* prom — GET /metrics, the Prometheus text exposition format 0.0.4.
 *
 * Daemon counters come from daemon/telemetry.c; per-job gauges from the
 * newest metrics row of each job that is running now, so a finished job's
 * series disappear with it and labels stay bounded (job_id, rank, device,
 * and small fixed sets: phase, side, state, result, code). The job's label is
 * job_id, not job: Prometheus sets `job` on every scraped series itself and
 * would rename ours to exported_job. Read-only; must
 * never label a series with anything a client chose (names, paths). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/handlers.h"
#include "api/http.h"
#include "daemon/store.h"
#include "daemon/telemetry.h"

#define PROM_MAX_JOBS 1000 /* running jobs exported; more is not a real deployment */

typedef struct running {
	char id[32];
	json_t *v; /* the newest metrics row's values, or NULL */
	int64_t step;
	json_t *ev; /* the newest row with a held-out evaluation (eval_loss), or NULL */
	double best_eval_loss; /* NAN without one */
} running;

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample; non-finite values are left out rather than exported as NaN,
 * so a missing phase is an absent series, not a fake number. */
static void sample(FILE *f, const char *name, const char *labels, double v)
{
	if (!isfinite(v))
		return;
	fprintf(f, "%s%s%s%s %.17g\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "", v);
}

static double num(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

/* One gauge per running job: key k of its newest metrics row (times scale),
 * or of its newest evaluation row when eval. */
static void gauge_of(FILE *f, running *jobs, size_t n, const char *name, const char *help, const char *k,
		     double scale, bool eval)
{
	family(f, name, "gauge", help);
	char lab[64];
	for (size_t i = 0; i < n; i++) {
		snprintf(lab, sizeof lab, "job_id=\"%s\"", jobs[i].id);
		sample(f, name, lab, num(eval ? jobs[i].ev : jobs[i].v, k) * scale);
	}
}

static void job_gauge(FILE *f, running *jobs, size_t n, const char *name, const char *help, const char *k,
		      double scale)
{
	gauge_of(f, jobs, n, name, help, k, scale, false);
}

static int load_running(store *st, running **out, size_t *n)
{
	store_job *jobs = NULL;
	size_t nj = 0;
	int64_t next = 0;
	int rc = store_job_list(st, JOB_MASK(JOB_RUNNING), 0, PROM_MAX_JOBS, &jobs, &nj, &next);
	if (rc < 0)
		return rc;
	running *r = calloc(nj ? nj : 1, sizeof *r);
	if (!r) {
		store_jobs_free(jobs, nj);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nj; i++) {
		snprintf(r[i].id, sizeof r[i].id, "%s", jobs[i].id);
		store_metric m;
		if (store_metric_latest(st, jobs[i].id, &m) == 0) {
			r[i].v = json_loads(m.values_json, 0, NULL);
			r[i].step = m.step;
			free(m.values_json);
		}
		store_metric last, best;
		r[i].best_eval_loss = NAN;
		if (store_metric_eval(st, jobs[i].id, &last, &best) == 0) {
			r[i].ev = json_loads(last.values_json, 0, NULL);
			json_t *b = json_loads(best.values_json, 0, NULL);
			r[i].best_eval_loss = num(b, "eval_loss");
			json_decref(b);
			free(last.values_json);
			free(best.values_json);
		}
	}
	store_jobs_free(jobs, nj);
	*out = r;
	*n = nj;
	return 0;
}

static void write_daemon(FILE *f, store *st)
{
	telemetry_counters c;
	telemetry_read(&c);
	char lab[64];
	family(f, "bertd_jobs_submitted_total", "counter", "Jobs accepted by POST /v1/jobs since the daemon started.");
	sample(f, "bertd_jobs_submitted_total", "", (double)c.jobs_submitted);
	family(f, "bertd_jobs_finished_total", "counter", "Jobs that reached a final state since the daemon started, by result.");
	static const enum job_state fin[] = {JOB_COMPLETED, JOB_FAILED, JOB_CANCELED};
	for (size_t i = 0; i < 3; i++) {
		snprintf(lab, sizeof lab, "result=\"%s\"", job_state_name(fin[i]));
		sample(f, "bertd_jobs_finished_total", lab, (double)c.jobs_finished[fin[i]]);
	}
	family(f, "bertd_job_restarts_total", "counter", "Worker restarts from a checkpoint since the daemon started.");
	sample(f, "bertd_job_restarts_total", "", (double)c.restarts);
	family(f, "bertd_http_requests_total", "counter", "API replies since the daemon started, by status code.");
	for (int i = 0; i <= TELEMETRY_STATUS_MAX - TELEMETRY_STATUS_MIN; i++)
		if (c.http[i]) {
			snprintf(lab, sizeof lab, "code=\"%d\"", i + TELEMETRY_STATUS_MIN);
			sample(f, "bertd_http_requests_total", lab, (double)c.http[i]);
		}
	int64_t counts[JOB_STATE_COUNT];
	if (store_job_counts(st, counts) == 0) {
		family(f, "bertd_jobs", "gauge", "Jobs in the store, by state.");
		for (int s = 0; s < JOB_STATE_COUNT; s++) {
			snprintf(lab, sizeof lab, "state=\"%s\"", job_state_name((enum job_state)s));
			sample(f, "bertd_jobs", lab, (double)counts[s]);
		}
	}
}

static void write_jobs(FILE *f, running *jobs, size_t n)
{
	char lab[96];
	family(f, "bertd_job_step", "gauge", "Newest logged optimizer step of a running job.");
	for (size_t i = 0; i < n; i++) {
		snprintf(lab, sizeof lab, "job_id=\"%s\"", jobs[i].id);
		if (jobs[i].v)
			sample(f, "bertd_job_step", lab, (double)jobs[i].step);
	}
	job_gauge(f, jobs, n, "bertd_job_loss", "Mean training loss over the newest logging window.", "loss", 1);
	job_gauge(f, jobs, n, "bertd_job_tokens_per_second", "Training throughput over the newest logging window.",
		  "tokens_per_s", 1);
	job_gauge(f, jobs, n, "bertd_job_step_seconds", "Mean step time over the newest logging window.",
		  "step_time_ms", 1e-3);
	job_gauge(f, jobs, n, "bertd_job_step_p95_seconds", "95th percentile step time over the newest logging window.",
		  "step_time_p95_ms", 1e-3);
	job_gauge(f, jobs, n, "bertd_job_learning_rate", "Learning rate of the newest logged optimizer step.",
		  "learning_rate", 1);
	job_gauge(f, jobs, n, "bertd_job_grad_norm",
		  "Global gradient L2 norm (before clipping) of the newest logged optimizer step.", "grad_norm", 1);

	/* held-out evaluation: the newest one, and the lowest loss so far */
	gauge_of(f, jobs, n, "bertd_job_eval_loss",
		 "Held-out masked-LM loss (eval_loss) of the newest evaluation of a running job.", "eval_loss", 1, true);
	gauge_of(f, jobs, n, "bertd_job_eval_perplexity", "exp(eval_loss) of the newest evaluation.", "perplexity",
		 1, true);
	gauge_of(f, jobs, n, "bertd_job_eval_accuracy", "Masked-token accuracy of the newest evaluation.",
		 "eval_accuracy", 1, true);
	family(f, "bertd_job_best_eval_loss", "gauge", "Lowest eval_loss of the job's evaluations so far.");
	for (size_t i = 0; i < n; i++) {
		snprintf(lab, sizeof lab, "job_id=\"%s\"", jobs[i].id);
		sample(f, "bertd_job_best_eval_loss", lab, jobs[i].best_eval_loss);
	}

	static const char *const phases[] = {"data_wait", "h2d", "compute", "allreduce", "optimizer", "checkpoint",
					     "eval"};
	family(f, "bertd_job_step_phase_seconds", "gauge", "Mean time per step in each phase over the newest logging window.");
	for (size_t i = 0; i < n; i++)
		for (size_t p = 0; p < sizeof phases / sizeof phases[0]; p++) {
			snprintf(lab, sizeof lab, "job_id=\"%s\",phase=\"%s\"", jobs[i].id, phases[p]);
			sample(f, "bertd_job_step_phase_seconds", lab,
			       num(json_object_get(jobs[i].v, "phases_ms"), phases[p]) * 1e-3);
		}

	family(f, "bertd_job_loader_wait_seconds", "gauge",
	       "Loader ring waits per step: consumer = the worker on an empty ring, producer = loaders on a full one.");
	for (size_t i = 0; i < n; i++) {
		const json_t *ld = json_object_get(jobs[i].v, "loader");
		snprintf(lab, sizeof lab, "job_id=\"%s\",side=\"consumer\"", jobs[i].id);
		sample(f, "bertd_job_loader_wait_seconds", lab, num(ld, "consumer_wait_ms") * 1e-3);
		snprintf(lab, sizeof lab, "job_id=\"%s\",side=\"producer\"", jobs[i].id);
		sample(f, "bertd_job_loader_wait_seconds", lab, num(ld, "producer_wait_ms") * 1e-3);
	}

	family(f, "bertd_job_rank_busy_seconds", "gauge", "Mean busy time (data + compute) per step of each rank.");
	for (size_t i = 0; i < n; i++) {
		const json_t *rs = json_object_get(jobs[i].v, "rank_step_ms");
		size_t k;
		const json_t *x;
		json_array_foreach(rs, k, x) {
			snprintf(lab, sizeof lab, "job_id=\"%s\",rank=\"%zu\"", jobs[i].id, k);
			sample(f, "bertd_job_rank_busy_seconds", lab, json_is_number(x) ? json_number_value(x) * 1e-3 : NAN);
		}
	}

	family(f, "bertd_job_host_cpu_utilization_ratio", "gauge",
	       "Host CPU utilization (/proc/stat) over the newest logging window, 0..1 of all cores.");
	for (size_t i = 0; i < n; i++) {
		snprintf(lab, sizeof lab, "job_id=\"%s\"", jobs[i].id);
		sample(f, "bertd_job_host_cpu_utilization_ratio", lab,
		       num(json_object_get(jobs[i].v, "host"), "cpu_util_pct") / 100.0);
	}
	family(f, "bertd_job_loader_cpu_ratio", "gauge",
	       "CPU time of each loader process per wall second over the newest logging window.");
	for (size_t i = 0; i < n; i++) {
		const json_t *ls = json_object_get(json_object_get(jobs[i].v, "host"), "loader_cpu_pct");
		size_t k;
		const json_t *x;
		json_array_foreach(ls, k, x) {
			snprintf(lab, sizeof lab, "job_id=\"%s\",loader=\"%zu\"", jobs[i].id, k);
			sample(f, "bertd_job_loader_cpu_ratio", lab, json_is_number(x) ? json_number_value(x) / 100.0 : NAN);
		}
	}

	family(f, "bertd_job_gpu_utilization_ratio", "gauge", "GPU utilization (NVML) over the newest logging window, 0..1.");
	for (size_t i = 0; i < n; i++) {
		const json_t *ds = json_object_get(jobs[i].v, "devices");
		size_t k;
		const json_t *d;
		json_array_foreach(ds, k, d) {
			snprintf(lab, sizeof lab, "job_id=\"%s\",device=\"%zu\"", jobs[i].id, k);
			sample(f, "bertd_job_gpu_utilization_ratio", lab, num(d, "util_pct") / 100.0);
		}
	}
	family(f, "bertd_job_gpu_memory_used_bytes", "gauge", "GPU memory in use (NVML).");
	for (size_t i = 0; i < n; i++) {
		const json_t *ds = json_object_get(jobs[i].v, "devices");
		size_t k;
		const json_t *d;
		json_array_foreach(ds, k, d) {
			snprintf(lab, sizeof lab, "job_id=\"%s\",device=\"%zu\"", jobs[i].id, k);
			sample(f, "bertd_job_gpu_memory_used_bytes", lab, num(d, "mem_used_mib") * 1048576.0);
		}
	}
}

enum MHD_Result prom_metrics(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	if (!api_query_known(req, known, &ret))
		return ret;
	running *jobs = NULL;
	size_t n = 0;
	int rc = load_running(req->st, &jobs, &n);
	if (rc < 0)
		return api_reply_store_error(req, rc, "reading jobs failed");
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		goto out;
	}
	write_daemon(f, req->st);
	write_jobs(f, jobs, n);
	if (fclose(f) != 0) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		goto out;
	}
	ret = api_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8", buf, len);
out:
	free(buf);
	for (size_t i = 0; i < n; i++) {
		json_decref(jobs[i].v);
		json_decref(jobs[i].ev);
	}
	free(jobs);
	return ret;
}
