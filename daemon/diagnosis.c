/* diagnosis — see diagnosis.h. Every rule is a pure function of the window
 * and the job's knobs; the remedy names the spec key to change and a value
 * worked out from the measured numbers, never a generic hint. Must never
 * do I/O or read a clock (the caller passes now_ms). */
#include "daemon/diagnosis.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the threshold table: name, default, bounds, per rule ---- */

struct threshold {
	const char *name;
	double def, lo, hi;
};

static const struct rule_def {
	const char *name;
	struct threshold t[DIAG_MAX_THRESHOLDS];
} rules[DIAG_RULE_COUNT] = {
	[DIAG_INPUT_BOUND] = {"input_bound",
			      {{"max_data_wait_share", 0.15, 0.0, 1.0}, {"max_host_cpu_pct", 90.0, 0.0, 100.0}}},
	[DIAG_LOW_GPU_UTILIZATION] = {"low_gpu_utilization", {{"min_p95_util_pct", 70.0, 0.0, 100.0}}},
	[DIAG_FLUCTUATING_GPU_UTILIZATION] = {"fluctuating_gpu_utilization",
					      {{"max_util_range_pct", 40.0, 0.0, 100.0}}},
	[DIAG_COMMUNICATION_BOUND] = {"communication_bound", {{"max_allreduce_share", 0.25, 0.0, 1.0}}},
	[DIAG_BATCH_TOO_SMALL] = {"batch_too_small",
				  {{"max_memory_share", 0.5, 0.0, 1.0}, {"max_util_pct", 70.0, 0.0, 100.0}}},
	[DIAG_STRAGGLER] = {"straggler", {{"max_ratio_to_median", 1.25, 1.0, 100.0}}},
	[DIAG_CHECKPOINT_STALL] = {"checkpoint_stall", {{"max_checkpoint_share", 0.10, 0.0, 1.0}}},
	[DIAG_SLOW_START] = {"slow_start", {{"max_minutes", 10.0, 0.0, 10080.0}}},
	[DIAG_STALLED] = {"stalled", {{"max_share_of_limit", 0.5, 0.0, 1.0}}},
};

const char *diag_rule_name(enum diag_rule r)
{
	return (unsigned)r < DIAG_RULE_COUNT ? rules[r].name : "?";
}

const char *diag_status_name(enum diag_status s)
{
	switch (s) {
	case DIAG_NO_DATA: return "no_data";
	case DIAG_OK: return "ok";
	case DIAG_ISSUE: return "issue";
	}
	return "?";
}

void diag_config_default(diag_config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	for (int r = 0; r < DIAG_RULE_COUNT; r++)
		for (int k = 0; k < DIAG_MAX_THRESHOLDS && rules[r].t[k].name; k++)
			cfg->v[r][k] = rules[r].t[k].def;
}

int diag_config_parse(const json_t *rules_obj, diag_config *cfg, char *field, size_t field_len,
		      char *detail, size_t detail_len)
{
	diag_config_default(cfg);
	if (!rules_obj)
		return 0;
	if (!json_is_object(rules_obj)) {
		snprintf(field, field_len, "profiler.rules");
		snprintf(detail, detail_len, "must be an object");
		return -EINVAL;
	}
	const char *rname;
	const json_t *rv;
	json_object_foreach((json_t *)rules_obj, rname, rv) {
		int r = 0;
		while (r < DIAG_RULE_COUNT && strcmp(rules[r].name, rname) != 0)
			r++;
		snprintf(field, field_len, "profiler.rules.%s", rname);
		if (r == DIAG_RULE_COUNT) {
			snprintf(detail, detail_len, "unknown rule (see docs/diagnosis.md)");
			return -EINVAL;
		}
		if (!json_is_object(rv)) {
			snprintf(detail, detail_len, "must be an object of thresholds");
			return -EINVAL;
		}
		const char *tname;
		const json_t *tv;
		json_object_foreach((json_t *)rv, tname, tv) {
			int k = 0;
			while (k < DIAG_MAX_THRESHOLDS && rules[r].t[k].name && strcmp(rules[r].t[k].name, tname) != 0)
				k++;
			snprintf(field, field_len, "profiler.rules.%s.%s", rname, tname);
			if (k == DIAG_MAX_THRESHOLDS || !rules[r].t[k].name) {
				snprintf(detail, detail_len, "unknown threshold of rule %s", rname);
				return -EINVAL;
			}
			const struct threshold *t = &rules[r].t[k];
			if (!json_is_number(tv) || !(json_number_value(tv) >= t->lo && json_number_value(tv) <= t->hi)) {
				snprintf(detail, detail_len, "must be a number in [%g, %g]", t->lo, t->hi);
				return -EINVAL;
			}
			cfg->v[r][k] = json_number_value(tv);
		}
	}
	field[0] = 0;
	return 0;
}

/* ---- samples ---- */

static double num_or_nan(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

int diag_sample_from_json(const json_t *values, int64_t step, int64_t time_ms, diag_sample *s)
{
	memset(s, 0, sizeof *s);
	s->step = step;
	s->time_ms = time_ms;
	if (!json_is_object(values))
		return -EINVAL;
	const json_t *ph = json_object_get(values, "phases_ms");
	s->step_ms = num_or_nan(values, "step_time_ms");
	s->step_p95_ms = num_or_nan(values, "step_time_p95_ms");
	s->data_wait_ms = num_or_nan(ph, "data_wait");
	s->h2d_ms = num_or_nan(ph, "h2d");
	s->compute_ms = num_or_nan(ph, "compute");
	s->allreduce_ms = num_or_nan(ph, "allreduce");
	s->optimizer_ms = num_or_nan(ph, "optimizer");
	s->checkpoint_ms = num_or_nan(ph, "checkpoint");
	const json_t *ranks = json_object_get(values, "rank_step_ms");
	if (json_is_array(ranks) && json_array_size(ranks) <= DIAG_MAX_RANKS) {
		size_t i;
		const json_t *v;
		json_array_foreach(ranks, i, v) s->rank_step_ms[i] = json_is_number(v) ? json_number_value(v) : NAN;
		s->n_ranks = (int)json_array_size(ranks);
	}
	s->host_cpu_pct = num_or_nan(json_object_get(values, "host"), "cpu_util_pct");
	const json_t *devs = json_object_get(values, "devices");
	if (json_is_array(devs) && json_array_size(devs) <= DIAG_MAX_DEVICES) {
		size_t i;
		const json_t *v;
		json_array_foreach(devs, i, v) {
			s->dev[i].util_pct = num_or_nan(v, "util_pct");
			s->dev[i].mem_used_mib = num_or_nan(v, "mem_used_mib");
			s->dev[i].mem_total_mib = num_or_nan(v, "mem_total_mib");
		}
		s->n_devices = (int)json_array_size(devs);
	}
	return 0;
}

/* ---- helpers ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank percentile of v[0..n) (sorts v); NAN when n == 0. */
static double percentile(double *v, size_t n, double p)
{
	if (n == 0)
		return NAN;
	qsort(v, n, sizeof *v, cmp_double);
	size_t rank = (size_t)ceil(p / 100.0 * (double)n);
	return v[rank ? rank - 1 : 0];
}

/* Sum of a phase and of step time over the samples where both are known. */
static size_t phase_share(const diag_sample *s, size_t n, size_t off, double *phase, double *step)
{
	size_t used = 0;
	*phase = *step = 0;
	for (size_t i = 0; i < n; i++) {
		double p = *(const double *)((const char *)&s[i] + off);
		if (isnan(p) || isnan(s[i].step_ms) || s[i].step_ms <= 0)
			continue;
		*phase += p;
		*step += s[i].step_ms;
		used++;
	}
	return used;
}

static void set(diag_result *r, enum diag_status st, double value, double threshold)
{
	r->status = st;
	r->value = value;
	r->threshold = threshold;
}

/* ---- the rules ---- */

static void rule_input_bound(const diag_config *cfg, const diag_job *job, const diag_sample *s, size_t n,
			     diag_result *r)
{
	double thr = cfg->v[DIAG_INPUT_BOUND][0], wait, step;
	if (!phase_share(s, n, offsetof(diag_sample, data_wait_ms), &wait, &step)) {
		snprintf(r->detail, sizeof r->detail, "no step-time breakdown reported yet");
		return;
	}
	double share = wait / step;
	set(r, share > thr ? DIAG_ISSUE : DIAG_OK, share, thr);
	snprintf(r->detail, sizeof r->detail, "data wait is %.0f%% of step time (%.2f of %.2f ms per step; limit %.0f%%)",
		 100 * share, wait / (double)n, step / (double)n, 100 * thr);
	if (r->status != DIAG_ISSUE)
		return;
	/* With L loaders each building a batch in B ms the worker gets L/B
	 * batches per ms; input-bound means step = B/L, so B = L*step (B = wait
	 * on the serial path, L = 0). Enough loaders: L'/B >= 1/busy. Supply
	 * exactly equal to demand still queues whenever a batch is slow (a
	 * queue at utilization 1 never drains), so aim the loaders at 2/3
	 * utilization: L' = ceil(1.5 B / busy). */
	double busy = step - wait;
	int L = job->loader_workers;
	/* Loaders already running on a saturated host compete with the workers
	 * for the same cores: more of them would not help (it was seen on this
	 * project's 2-core machine: woken loaders preempting the worker). */
	double host = 0;
	size_t nh = 0;
	for (size_t i = 0; i < n; i++)
		if (!isnan(s[i].host_cpu_pct))
			host += s[i].host_cpu_pct, nh++;
	if (L > 0 && nh > 0 && host / (double)nh >= cfg->v[DIAG_INPUT_BOUND][1]) {
		snprintf(r->remedy, sizeof r->remedy,
			 "data wait is %.0f%% of step time with the host CPU %.0f%% busy: more loaders would take "
			 "CPU from the workers; free CPU on the host (other load, fewer CPU worker slots) or "
			 "make batches cheaper (mlm.whole_word_mask false, a shorter max_seq_length)",
			 100 * share, host / (double)nh);
		return;
	}
	double build = L > 0 ? (double)L * step : wait;
	/* clamp in double: a near-zero busy time must not overflow the int */
	double want_d = busy > 0 ? ceil(1.5 * build / busy) : L + 2;
	if (!(want_d <= 64))
		want_d = 64;
	int want = (int)want_d;
	if (want <= L)
		want = L + 1 < 64 ? L + 1 : 64;
	if (L >= 64)
		snprintf(r->remedy, sizeof r->remedy,
			 "data wait is %.0f%% of step time with dataloader_num_workers at its maximum (64): make "
			 "batches cheaper (mlm.whole_word_mask false, a shorter max_seq_length)",
			 100 * share);
	else
		snprintf(r->remedy, sizeof r->remedy,
			 "data wait is %.0f%% of step time: raise dataloader_num_workers from %d to %d", 100 * share,
			 L, want);
}

/* Utilization values over the window, all devices; returns how many. */
static size_t util_values(const diag_sample *s, size_t n, double *out, size_t cap)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		for (int d = 0; d < s[i].n_devices && k < cap; d++)
			if (!isnan(s[i].dev[d].util_pct))
				out[k++] = s[i].dev[d].util_pct;
	return k;
}

static bool gpu_no_data(const diag_job *job, size_t nu, diag_result *r)
{
	if (!job->gpu) {
		snprintf(r->detail, sizeof r->detail, "CPU job: no GPU utilization to measure");
		return true;
	}
	if (nu == 0) {
		snprintf(r->detail, sizeof r->detail, "no GPU samples (NVML not available or no window yet)");
		return true;
	}
	return false;
}

static void rule_low_util(const diag_config *cfg, const diag_job *job, const diag_sample *s, size_t n,
			  const diag_report *rep, diag_result *r)
{
	double thr = cfg->v[DIAG_LOW_GPU_UTILIZATION][0];
	double vals[DIAG_WINDOW * DIAG_MAX_DEVICES];
	size_t nu = util_values(s, n, vals, sizeof vals / sizeof vals[0]);
	if (gpu_no_data(job, nu, r))
		return;
	double p95 = percentile(vals, nu, 95);
	set(r, p95 < thr ? DIAG_ISSUE : DIAG_OK, p95, thr);
	snprintf(r->detail, sizeof r->detail, "GPU utilization p95 is %.0f%% (minimum %.0f%%)", p95, thr);
	if (r->status != DIAG_ISSUE)
		return;
	if (rep->r[DIAG_INPUT_BOUND].status == DIAG_ISSUE)
		snprintf(r->remedy, sizeof r->remedy, "the GPU waits for input: %s", rep->r[DIAG_INPUT_BOUND].remedy);
	else
		snprintf(r->remedy, sizeof r->remedy,
			 "GPU utilization p95 is %.0f%%: raise per_device_train_batch_size from %d to %d", p95,
			 job->batch_size, job->batch_size * 2);
}

static void rule_fluctuating(const diag_config *cfg, const diag_job *job, const diag_sample *s, size_t n,
			     diag_result *r)
{
	double thr = cfg->v[DIAG_FLUCTUATING_GPU_UTILIZATION][0];
	double vals[DIAG_WINDOW * DIAG_MAX_DEVICES];
	size_t nu = util_values(s, n, vals, sizeof vals / sizeof vals[0]);
	if (gpu_no_data(job, nu, r))
		return;
	double p5 = percentile(vals, nu, 5), p95 = percentile(vals, nu, 95);
	set(r, p95 - p5 > thr ? DIAG_ISSUE : DIAG_OK, p95 - p5, thr);
	snprintf(r->detail, sizeof r->detail, "GPU utilization swings between %.0f%% (p5) and %.0f%% (p95); limit %.0f points",
		 p5, p95, thr);
	if (r->status == DIAG_ISSUE)
		snprintf(r->remedy, sizeof r->remedy,
			 "utilization drops from %.0f%% to %.0f%% between windows: raise dataloader_num_workers from %d to %d "
			 "so bursts of slow batches are absorbed",
			 p95, p5, job->loader_workers, job->loader_workers + 2);
}

static void rule_comm(const diag_config *cfg, const diag_job *job, const diag_sample *s, size_t n,
		      diag_result *r)
{
	double thr = cfg->v[DIAG_COMMUNICATION_BOUND][0], ar, step;
	if (job->world <= 1) {
		snprintf(r->detail, sizeof r->detail, "one worker: no all-reduce");
		return;
	}
	if (!phase_share(s, n, offsetof(diag_sample, allreduce_ms), &ar, &step)) {
		snprintf(r->detail, sizeof r->detail, "no all-reduce timing reported yet");
		return;
	}
	double share = ar / step;
	set(r, share > thr ? DIAG_ISSUE : DIAG_OK, share, thr);
	snprintf(r->detail, sizeof r->detail, "exposed all-reduce is %.0f%% of step time (%.2f ms per step; limit %.0f%%)",
		 100 * share, ar / (double)n, 100 * thr);
	if (r->status == DIAG_ISSUE)
		snprintf(r->remedy, sizeof r->remedy,
			 "exposed all-reduce is %.0f%% of step time: raise gradient_accumulation_steps from %d to %d "
			 "(one gradient exchange per more samples)",
			 100 * share, job->grad_accum, job->grad_accum * 2);
}

static void rule_batch_small(const diag_config *cfg, const diag_job *job, const diag_sample *s, size_t n,
			     diag_result *r)
{
	double max_mem = cfg->v[DIAG_BATCH_TOO_SMALL][0], max_util = cfg->v[DIAG_BATCH_TOO_SMALL][1];
	double vals[DIAG_WINDOW * DIAG_MAX_DEVICES];
	size_t nu = util_values(s, n, vals, sizeof vals / sizeof vals[0]);
	if (gpu_no_data(job, nu, r))
		return;
	/* The fullest device decides: the batch size is the same on all. */
	double share = NAN, used = 0, total = 0;
	for (size_t i = 0; i < n; i++)
		for (int d = 0; d < s[i].n_devices; d++) {
			double u = s[i].dev[d].mem_used_mib, t = s[i].dev[d].mem_total_mib;
			if (isnan(u) || isnan(t) || t <= 0)
				continue;
			if (isnan(share) || u / t > share)
				share = u / t, used = u, total = t;
		}
	if (isnan(share)) {
		snprintf(r->detail, sizeof r->detail, "no GPU memory samples");
		return;
	}
	double p95 = percentile(vals, nu, 95);
	bool small = share < max_mem && p95 < max_util;
	/* Keep 20% headroom; activations grow about linearly with the batch. */
	double want_d = share > 0 ? floor((double)job->batch_size * 0.8 / share) : 65536;
	int want = want_d < 65536 ? (int)want_d : 65536; /* the spec's maximum */
	if (want <= job->batch_size)
		small = false;
	set(r, small ? DIAG_ISSUE : DIAG_OK, share, max_mem);
	snprintf(r->detail, sizeof r->detail,
		 "peak memory %.0f of %.0f MiB (%.0f%%, limit %.0f%%), utilization p95 %.0f%% (limit %.0f%%)", used,
		 total, 100 * share, 100 * max_mem, p95, max_util);
	if (small)
		snprintf(r->remedy, sizeof r->remedy,
			 "memory is %.0f%% used at utilization %.0f%%: raise per_device_train_batch_size from %d to about %d",
			 100 * share, p95, job->batch_size, want);
}

static void rule_straggler(const diag_config *cfg, const diag_sample *s, size_t n, diag_result *r)
{
	double thr = cfg->v[DIAG_STRAGGLER][0];
	double sum[DIAG_MAX_RANKS] = {0};
	int cnt[DIAG_MAX_RANKS] = {0}, ranks = 0;
	for (size_t i = 0; i < n; i++)
		for (int k = 0; k < s[i].n_ranks; k++)
			if (!isnan(s[i].rank_step_ms[k])) {
				sum[k] += s[i].rank_step_ms[k];
				cnt[k]++;
				if (k + 1 > ranks)
					ranks = k + 1;
			}
	if (ranks < 2) {
		snprintf(r->detail, sizeof r->detail, ranks ? "one rank: nothing to compare" : "no per-rank step times");
		return;
	}
	double mean[DIAG_MAX_RANKS], sorted[DIAG_MAX_RANKS];
	int worst = 0;
	for (int k = 0; k < ranks; k++) {
		mean[k] = cnt[k] ? sum[k] / cnt[k] : 0;
		sorted[k] = mean[k];
		if (mean[k] > mean[worst])
			worst = k;
	}
	/* Lower median, so with two ranks the slow one is compared with the fast one. */
	qsort(sorted, (size_t)ranks, sizeof sorted[0], cmp_double);
	double median = sorted[(ranks - 1) / 2];
	double ratio = median > 0 ? mean[worst] / median : 1.0;
	set(r, ratio > thr ? DIAG_ISSUE : DIAG_OK, ratio, thr);
	snprintf(r->detail, sizeof r->detail,
		 "slowest rank %d is busy %.2f ms per step, median %.2f ms (%.2fx, limit %.2fx)", worst, mean[worst],
		 median, ratio, thr);
	if (r->status == DIAG_ISSUE)
		snprintf(r->remedy, sizeof r->remedy,
			 "rank %d is %.2fx slower than the median and every all-reduce waits for it: check its device "
			 "(clocks, other processes) or lower resources.gpus to leave it out",
			 worst, ratio);
}

static void rule_ckpt(const diag_config *cfg, const diag_job *job, const diag_sample *s, size_t n,
		      diag_result *r)
{
	double thr = cfg->v[DIAG_CHECKPOINT_STALL][0], ck, step;
	if (!phase_share(s, n, offsetof(diag_sample, checkpoint_ms), &ck, &step)) {
		snprintf(r->detail, sizeof r->detail, "no checkpoint timing reported yet");
		return;
	}
	double share = ck / step;
	set(r, share > thr ? DIAG_ISSUE : DIAG_OK, share, thr);
	snprintf(r->detail, sizeof r->detail,
		 "checkpoint writes stall training for %.0f%% of step time (%.2f ms per step; limit %.0f%%)",
		 100 * share, ck / (double)n, 100 * thr);
	if (r->status == DIAG_ISSUE) {
		double f = thr > 0 ? ceil(share / thr) : 10;
		if (!(f <= 1e6))
			f = 1e6;
		snprintf(r->remedy, sizeof r->remedy,
			 "checkpoints take %.0f%% of step time: raise save_steps from %lld to %lld", 100 * share,
			 (long long)job->save_steps, (long long)((double)job->save_steps * (f < 2 ? 2 : f)));
	}
}

static void rule_slow_start(const diag_config *cfg, const diag_job *job, const diag_sample *s, size_t n,
			    diag_result *r)
{
	double thr = cfg->v[DIAG_SLOW_START][0];
	if (!job->started) {
		snprintf(r->detail, sizeof r->detail, "the job has not started");
		return;
	}
	double minutes;
	if (n > 0) {
		/* The first row comes logging_steps in; back out when step 1 ended. */
		double first = (double)s[0].time_ms;
		if (!isnan(s[0].step_ms) && s[0].step > 1)
			first -= s[0].step_ms * (double)(s[0].step - 1);
		minutes = (first - (double)job->started_ms) / 60000.0;
		if (minutes < 0)
			minutes = 0;
		snprintf(r->detail, sizeof r->detail, "first step after %.1f min (limit %.1f min)", minutes, thr);
	} else if (job->running) {
		minutes = (double)(job->now_ms - job->started_ms) / 60000.0;
		snprintf(r->detail, sizeof r->detail, "no step reported %.1f min after start (limit %.1f min)", minutes, thr);
	} else {
		snprintf(r->detail, sizeof r->detail, "the job ended without reporting a step");
		return;
	}
	set(r, minutes > thr ? DIAG_ISSUE : DIAG_OK, minutes, thr);
	if (r->status == DIAG_ISSUE)
		snprintf(r->remedy, sizeof r->remedy,
			 "%.1f min to the first step: read GET /v1/jobs/{id}/logs for where it waits; if the loaders, set "
			 "dataloader_num_workers from %d to 0 to rule them out",
			 minutes, job->loader_workers);
}

void diag_job_stall_from_json(diag_job *job, const char *stall_json)
{
	job->stall = false;
	json_t *o = stall_json ? json_loads(stall_json, 0, NULL) : NULL;
	json_t *rank = json_object_get(o, "rank"), *since = json_object_get(o, "since_ms");
	json_t *limit = json_object_get(o, "limit_s");
	if (json_is_integer(rank) && json_integer_value(rank) >= 0 && json_integer_value(rank) < DIAG_MAX_RANKS &&
	    json_is_integer(since) && json_is_number(limit) && json_number_value(limit) > 0) {
		job->stall = true;
		job->stall_rank = (int)json_integer_value(rank);
		job->stall_since_ms = json_integer_value(since);
		job->stall_limit_s = json_number_value(limit);
		job->stall_stopped = json_is_true(json_object_get(o, "stopped"));
	}
	json_decref(o);
}

/* A rank that has reported nothing for a good share of the stall limit
 * (the supervisor kills the attempt at the limit itself). */
static void rule_stalled(const diag_config *cfg, const diag_job *job, diag_result *r)
{
	double share = cfg->v[DIAG_STALLED][0];
	if (!job->running) {
		snprintf(r->detail, sizeof r->detail, "the job is not running");
		return;
	}
	if (!job->stall) {
		snprintf(r->detail, sizeof r->detail, "every rank reports within its stall limit");
		set(r, DIAG_OK, 0, share);
		return;
	}
	double silent = (double)(job->now_ms - job->stall_since_ms) / 1000.0;
	if (silent < 0)
		silent = 0;
	double s = silent / job->stall_limit_s;
	snprintf(r->detail, sizeof r->detail, "rank %d has reported nothing for %.0f s%s; the attempt fails at %.0f s",
		 job->stall_rank, silent, job->stall_stopped ? " (its process is stopped)" : "", job->stall_limit_s);
	set(r, s > share ? DIAG_ISSUE : DIAG_OK, s, share);
	if (r->status == DIAG_ISSUE)
		snprintf(r->remedy, sizeof r->remedy,
			 "rank %d is stuck%s: read GET /v1/jobs/{id}/logs?rank=%d; if it is slow rather than stuck, "
			 "raise the daemon's stall_timeout_s from %.0f",
			 job->stall_rank, job->stall_stopped ? " (stopped: SIGCONT it, or let the attempt restart)" : "",
			 job->stall_rank, job->stall_limit_s);
}

void diag_run(const diag_config *cfg, const diag_job *job, const diag_sample *samples, size_t n, diag_report *out)
{
	memset(out, 0, sizeof *out);
	for (int i = 0; i < DIAG_RULE_COUNT; i++) {
		out->r[i].value = NAN;
		out->r[i].threshold = cfg->v[i][0];
	}
	const diag_sample *first_sample = samples;
	size_t all = n;
	if (n > DIAG_WINDOW) {
		samples += n - DIAG_WINDOW;
		n = DIAG_WINDOW;
	}
	out->samples = n;
	rule_input_bound(cfg, job, samples, n, &out->r[DIAG_INPUT_BOUND]);
	rule_low_util(cfg, job, samples, n, out, &out->r[DIAG_LOW_GPU_UTILIZATION]);
	rule_fluctuating(cfg, job, samples, n, &out->r[DIAG_FLUCTUATING_GPU_UTILIZATION]);
	rule_comm(cfg, job, samples, n, &out->r[DIAG_COMMUNICATION_BOUND]);
	rule_batch_small(cfg, job, samples, n, &out->r[DIAG_BATCH_TOO_SMALL]);
	rule_straggler(cfg, samples, n, &out->r[DIAG_STRAGGLER]);
	rule_ckpt(cfg, job, samples, n, &out->r[DIAG_CHECKPOINT_STALL]);
	/* Slow start looks at the very first sample, not the window. */
	rule_slow_start(cfg, job, first_sample, all, &out->r[DIAG_SLOW_START]);
	rule_stalled(cfg, job, &out->r[DIAG_STALLED]);

	int issues = 0, ok = 0, first = -1;
	for (int i = 0; i < DIAG_RULE_COUNT; i++) {
		if (out->r[i].status == DIAG_ISSUE && issues++ == 0)
			first = i;
		ok += out->r[i].status == DIAG_OK;
	}
	if (out->r[DIAG_STALLED].status == DIAG_ISSUE)
		first = DIAG_STALLED; /* nothing else matters while a rank is stuck */
	if (first >= 0)
		snprintf(out->summary, sizeof out->summary, "%s: %s%s", rules[first].name, out->r[first].remedy,
			 issues > 1 ? " (and more issues)" : "");
	else if (ok == 0)
		snprintf(out->summary, sizeof out->summary, "no telemetry yet");
	else
		snprintf(out->summary, sizeof out->summary, "no issues (%d rules ok, %d without data)", ok,
			 DIAG_RULE_COUNT - ok);
}

static json_t *num_or_null(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

json_t *diag_report_json(const diag_report *rep)
{
	json_t *arr = json_array();
	for (int i = 0; arr && i < DIAG_RULE_COUNT; i++) {
		const diag_result *r = &rep->r[i];
		json_t *o = json_pack("{s:s, s:s, s:s, s:s*, s:o, s:o}", "rule", rules[i].name, "status",
				      diag_status_name(r->status), "detail", r->detail, "remedy",
				      r->status == DIAG_ISSUE ? r->remedy : NULL, "value", num_or_null(r->value),
				      "threshold", num_or_null(r->threshold));
		if (!o || json_array_append_new(arr, o) < 0) {
			json_decref(arr);
			return NULL;
		}
	}
	if (!arr)
		return NULL;
	return json_pack("{s:s, s:I, s:o}", "summary", rep->summary, "samples", (json_int_t)rep->samples, "rules",
			 arr);
}
