/* Rules on synthetic telemetry: each rule fires on the pattern it is for,
 * stays quiet on a healthy window, says no_data without its inputs, and
 * names the knob in its remedy. Also the profiler.rules override parser,
 * and (the executable that also runs against fake_nvml.c) the NVML
 * sampler and device discovery. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/childenv.h"
#include "daemon/devices.h"
#include "daemon/diagnosis.h"
#include "daemon/telemetry_sampler.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 10

/* cmocka 1.1 has only assert_float_equal (float); compare doubles here. */
#define assert_double_equal(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

static diag_job cpu_job(void)
{
	return (diag_job){.running = true, .started = true, .started_ms = 1000000, .now_ms = 1000000 + 60000,
			  .loader_workers = 2, .batch_size = 8, .grad_accum = 1, .save_steps = 500, .world = 1,
			  .gpu = false};
}

/* A healthy window: 100 ms steps, 2 ms data wait, 1 ms all-reduce. */
static void healthy(diag_sample *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		memset(&s[i], 0, sizeof s[i]);
		s[i].step = (int64_t)(i + 1) * 50;
		s[i].time_ms = 1000000 + 5000 + (int64_t)i * 5000;
		s[i].step_ms = 100;
		s[i].step_p95_ms = 110;
		s[i].data_wait_ms = 2;
		s[i].h2d_ms = 0;
		s[i].allreduce_ms = 1;
		s[i].optimizer_ms = 5;
		s[i].checkpoint_ms = 0;
		s[i].compute_ms = 92;
	}
}

static void add_gpus(diag_sample *s, size_t n, int ndev, double util, double used, double total)
{
	for (size_t i = 0; i < n; i++) {
		s[i].n_devices = ndev;
		for (int d = 0; d < ndev; d++)
			s[i].dev[d] = (diag_device){util, used, total};
	}
}

static diag_report run(const diag_job *job, const diag_sample *s, size_t n)
{
	diag_config cfg;
	diag_config_default(&cfg);
	diag_report rep;
	diag_run(&cfg, job, s, n, &rep);
	return rep;
}

/* Input-bound with loaders on a saturated host: more loaders would take the
 * workers' CPU, so the remedy says to free CPU instead; below the host
 * threshold, without loaders (moving the work off the critical path is
 * still the first step) or without host samples, the usual remedy. */
static void test_input_bound_saturated_host(void **state)
{
	(void)state;
	diag_sample s[N];
	healthy(s, N);
	for (int i = 0; i < N; i++) {
		s[i].data_wait_ms = 38;
		s[i].compute_ms = 56;
		s[i].host_cpu_pct = i % 2 ? 99 : 95; /* mean 97 */
	}
	diag_job job = cpu_job(); /* 2 loaders */
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_INPUT_BOUND].status, DIAG_ISSUE);
	assert_non_null(strstr(rep.r[DIAG_INPUT_BOUND].remedy, "host CPU 97% busy"));
	assert_null(strstr(rep.r[DIAG_INPUT_BOUND].remedy, "raise dataloader_num_workers"));

	job.loader_workers = 0;
	rep = run(&job, s, N);
	assert_non_null(strstr(rep.r[DIAG_INPUT_BOUND].remedy, "raise dataloader_num_workers from 0 to 1"));

	job.loader_workers = 2;
	diag_config cfg;
	diag_config_default(&cfg);
	char field[128], detail[160];
	json_t *o = json_loads("{\"input_bound\":{\"max_host_cpu_pct\":98}}", 0, NULL);
	assert_int_equal(diag_config_parse(o, &cfg, field, sizeof field, detail, sizeof detail), 0);
	json_decref(o);
	diag_run(&cfg, &job, s, N, &rep);
	assert_non_null(strstr(rep.r[DIAG_INPUT_BOUND].remedy, "raise dataloader_num_workers from 2 to 5"));

	for (int i = 0; i < N; i++)
		s[i].host_cpu_pct = NAN; /* not sampled: no claim about the host */
	rep = run(&job, s, N);
	assert_non_null(strstr(rep.r[DIAG_INPUT_BOUND].remedy, "raise dataloader_num_workers from 2 to 5"));
}

static void test_healthy_cpu_job_quiet(void **state)
{
	(void)state;
	diag_sample s[N];
	healthy(s, N);
	diag_job job = cpu_job();
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_INPUT_BOUND].status, DIAG_OK);
	assert_int_equal(rep.r[DIAG_CHECKPOINT_STALL].status, DIAG_OK);
	assert_int_equal(rep.r[DIAG_SLOW_START].status, DIAG_OK);
	/* CPU job: every GPU rule says no_data, not ok. */
	assert_int_equal(rep.r[DIAG_LOW_GPU_UTILIZATION].status, DIAG_NO_DATA);
	assert_int_equal(rep.r[DIAG_FLUCTUATING_GPU_UTILIZATION].status, DIAG_NO_DATA);
	assert_int_equal(rep.r[DIAG_BATCH_TOO_SMALL].status, DIAG_NO_DATA);
	/* one worker: nothing to compare or sync */
	assert_int_equal(rep.r[DIAG_COMMUNICATION_BOUND].status, DIAG_NO_DATA);
	assert_int_equal(rep.r[DIAG_STRAGGLER].status, DIAG_NO_DATA);
	assert_non_null(strstr(rep.summary, "no issues"));
	assert_double_equal(rep.r[DIAG_INPUT_BOUND].value, 0.02, 1e-12);
}

static void test_input_bound_fires_with_knob(void **state)
{
	(void)state;
	diag_sample s[N];
	healthy(s, N);
	for (int i = 0; i < N; i++) { /* 38 of 100 ms waiting for data */
		s[i].data_wait_ms = 38;
		s[i].compute_ms = 56;
	}
	diag_job job = cpu_job();
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_INPUT_BOUND].status, DIAG_ISSUE);
	assert_double_equal(rep.r[DIAG_INPUT_BOUND].value, 0.38, 1e-12);
	/* 2 loaders give 1 batch per 100 ms, so one takes 200 ms; the worker is
	 * busy 62 ms: ceil(1.5 x 200/62) = 5 loaders (4 would run at 0.81
	 * utilization, 5 at 0.65). */
	assert_string_equal(rep.r[DIAG_INPUT_BOUND].remedy,
			    "data wait is 38% of step time: raise dataloader_num_workers from 2 to 5");
	assert_non_null(strstr(rep.summary, "input_bound"));
	assert_non_null(strstr(rep.summary, "dataloader_num_workers"));

	/* the serial path: the wait is the build itself: 1.5 x 38 / 62 -> 1 loader */
	job.loader_workers = 0;
	rep = run(&job, s, N);
	assert_string_equal(rep.r[DIAG_INPUT_BOUND].remedy,
			    "data wait is 38% of step time: raise dataloader_num_workers from 0 to 1");

	/* all wait, no work: no division blow-up, a bounded suggestion */
	for (int i = 0; i < N; i++) {
		s[i].data_wait_ms = 100;
		s[i].compute_ms = s[i].allreduce_ms = s[i].optimizer_ms = 0;
	}
	job.loader_workers = 2;
	rep = run(&job, s, N);
	assert_string_equal(rep.r[DIAG_INPUT_BOUND].remedy,
			    "data wait is 100% of step time: raise dataloader_num_workers from 2 to 4");
	job.loader_workers = 64;
	rep = run(&job, s, N);
	assert_non_null(strstr(rep.r[DIAG_INPUT_BOUND].remedy, "dataloader_num_workers at its maximum (64)"));
	healthy(s, N);
	for (int i = 0; i < N; i++) {
		s[i].data_wait_ms = 38;
		s[i].compute_ms = 56;
	}
	job.loader_workers = 0;

	/* a threshold above the share silences it */
	diag_config cfg;
	char field[128], detail[128];
	json_t *rules = json_loads("{\"input_bound\":{\"max_data_wait_share\":0.5}}", 0, NULL);
	assert_int_equal(diag_config_parse(rules, &cfg, field, sizeof field, detail, sizeof detail), 0);
	json_decref(rules);
	diag_run(&cfg, &job, s, N, &rep);
	assert_int_equal(rep.r[DIAG_INPUT_BOUND].status, DIAG_OK);
}

static void test_gpu_rules(void **state)
{
	(void)state;
	diag_sample s[N];
	diag_job job = cpu_job();
	job.gpu = true;
	job.world = 2;
	/* busy GPUs with most memory used: quiet */
	healthy(s, N);
	add_gpus(s, N, 2, 95, 60000, 80000);
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_LOW_GPU_UTILIZATION].status, DIAG_OK);
	assert_int_equal(rep.r[DIAG_FLUCTUATING_GPU_UTILIZATION].status, DIAG_OK);
	assert_int_equal(rep.r[DIAG_BATCH_TOO_SMALL].status, DIAG_OK);

	/* idle GPUs with a tenth of memory used: low utilization and small batch */
	add_gpus(s, N, 2, 30, 8000, 80000);
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_LOW_GPU_UTILIZATION].status, DIAG_ISSUE);
	assert_double_equal(rep.r[DIAG_LOW_GPU_UTILIZATION].value, 30, 1e-12);
	assert_non_null(strstr(rep.r[DIAG_LOW_GPU_UTILIZATION].remedy, "per_device_train_batch_size from 8 to 16"));
	assert_int_equal(rep.r[DIAG_BATCH_TOO_SMALL].status, DIAG_ISSUE);
	/* 8 * 0.8 / 0.1 = 64 */
	assert_non_null(strstr(rep.r[DIAG_BATCH_TOO_SMALL].remedy, "per_device_train_batch_size from 8 to about 64"));
	assert_int_equal(rep.r[DIAG_FLUCTUATING_GPU_UTILIZATION].status, DIAG_OK);

	/* no memory used at all: the suggestion stops at the spec's maximum */
	add_gpus(s, N, 2, 30, 0, 80000);
	rep = run(&job, s, N);
	assert_non_null(strstr(rep.r[DIAG_BATCH_TOO_SMALL].remedy, "from 8 to about 65536"));
	add_gpus(s, N, 2, 30, 8000, 80000);

	/* low utilization while input-bound points at the loaders instead */
	for (int i = 0; i < N; i++)
		s[i].data_wait_ms = 50;
	rep = run(&job, s, N);
	assert_non_null(strstr(rep.r[DIAG_LOW_GPU_UTILIZATION].remedy, "dataloader_num_workers"));

	/* alternating 10% / 95%: fluctuating */
	healthy(s, N);
	add_gpus(s, N, 1, 95, 60000, 80000);
	for (int i = 0; i < N; i += 2)
		s[i].dev[0].util_pct = 10;
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_FLUCTUATING_GPU_UTILIZATION].status, DIAG_ISSUE);
	assert_double_equal(rep.r[DIAG_FLUCTUATING_GPU_UTILIZATION].value, 85, 1e-12);
	assert_non_null(strstr(rep.r[DIAG_FLUCTUATING_GPU_UTILIZATION].remedy, "dataloader_num_workers"));

	/* GPU job without NVML samples: no_data */
	healthy(s, N);
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_LOW_GPU_UTILIZATION].status, DIAG_NO_DATA);
	assert_int_equal(rep.r[DIAG_BATCH_TOO_SMALL].status, DIAG_NO_DATA);
}

static void test_communication_bound(void **state)
{
	(void)state;
	diag_sample s[N];
	healthy(s, N);
	diag_job job = cpu_job();
	job.world = 4;
	job.grad_accum = 2;
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_COMMUNICATION_BOUND].status, DIAG_OK);
	for (int i = 0; i < N; i++)
		s[i].allreduce_ms = 40;
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_COMMUNICATION_BOUND].status, DIAG_ISSUE);
	assert_double_equal(rep.r[DIAG_COMMUNICATION_BOUND].value, 0.40, 1e-12);
	assert_non_null(strstr(rep.r[DIAG_COMMUNICATION_BOUND].remedy, "gradient_accumulation_steps from 2 to 4"));
}

static void test_straggler(void **state)
{
	(void)state;
	diag_sample s[N];
	healthy(s, N);
	diag_job job = cpu_job();
	job.world = 4;
	for (int i = 0; i < N; i++) {
		s[i].n_ranks = 4;
		s[i].rank_step_ms[0] = 60;
		s[i].rank_step_ms[1] = 62;
		s[i].rank_step_ms[2] = 61;
		s[i].rank_step_ms[3] = 63;
	}
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_STRAGGLER].status, DIAG_OK);
	for (int i = 0; i < N; i++)
		s[i].rank_step_ms[2] = 122; /* 2x the median of 61..62 */
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_STRAGGLER].status, DIAG_ISSUE);
	assert_double_equal(rep.r[DIAG_STRAGGLER].value, 122.0 / 62.0, 1e-12);
	assert_non_null(strstr(rep.r[DIAG_STRAGGLER].remedy, "rank 2"));
}

static void test_checkpoint_stall(void **state)
{
	(void)state;
	diag_sample s[N];
	healthy(s, N);
	diag_job job = cpu_job();
	job.save_steps = 50;
	for (int i = 0; i < N; i++)
		s[i].checkpoint_ms = 30; /* 30% of a 100 ms step */
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_CHECKPOINT_STALL].status, DIAG_ISSUE);
	/* 0.30 / 0.10 = 3x fewer checkpoints */
	assert_non_null(strstr(rep.r[DIAG_CHECKPOINT_STALL].remedy, "save_steps from 50 to 150"));
	/* an older worker without the field: no_data, not ok */
	for (int i = 0; i < N; i++)
		s[i].checkpoint_ms = NAN;
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_CHECKPOINT_STALL].status, DIAG_NO_DATA);
}

/* The stall watch's suspect (store_job.stall_json): named once silent past
 * max_share_of_limit of the limit, first in the summary; a healthy job with
 * nobody suspected is ok; a job not running says no_data. */
static void test_stalled(void **state)
{
	(void)state;
	diag_job job = cpu_job();
	diag_sample s[N];
	healthy(s, N);
	diag_report rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_STALLED].status, DIAG_OK);

	char text[160];
	snprintf(text, sizeof text, "{\"rank\":1,\"since_ms\":%lld,\"limit_s\":300,\"stopped\":true}",
		 (long long)(job.now_ms - 200000));
	diag_job_stall_from_json(&job, text);
	assert_true(job.stall);
	assert_int_equal(job.stall_rank, 1);
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_STALLED].status, DIAG_ISSUE);
	assert_double_equal(rep.r[DIAG_STALLED].value, 200.0 / 300.0, 1e-9);
	assert_non_null(strstr(rep.r[DIAG_STALLED].detail, "rank 1 has reported nothing for 200 s"));
	assert_non_null(strstr(rep.r[DIAG_STALLED].detail, "stopped"));
	assert_non_null(strstr(rep.r[DIAG_STALLED].remedy, "stall_timeout_s"));
	assert_non_null(strstr(rep.summary, "stalled: rank 1"));
	/* the same rank, silent for less than half the limit: ok */
	job.now_ms = job.stall_since_ms + 100000;
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_STALLED].status, DIAG_OK);
	/* not running: nothing to judge */
	job.running = false;
	rep = run(&job, s, N);
	assert_int_equal(rep.r[DIAG_STALLED].status, DIAG_NO_DATA);
	/* NULL and malformed text: nobody suspected */
	diag_job_stall_from_json(&job, NULL);
	assert_false(job.stall);
	diag_job_stall_from_json(&job, "{\"rank\":\"one\",\"since_ms\":1,\"limit_s\":300}");
	assert_false(job.stall);
	diag_job_stall_from_json(&job, "{\"rank\":0,\"since_ms\":1,\"limit_s\":0}");
	assert_false(job.stall);
	diag_job_stall_from_json(&job, "not json");
	assert_false(job.stall);
}

static void test_slow_start(void **state)
{
	(void)state;
	diag_job job = cpu_job();
	/* running, no sample, 11 minutes in: issue */
	job.now_ms = job.started_ms + 11 * 60000;
	diag_report rep = run(&job, NULL, 0);
	assert_int_equal(rep.r[DIAG_SLOW_START].status, DIAG_ISSUE);
	assert_non_null(strstr(rep.summary, "slow_start"));
	/* 5 minutes in: still ok */
	job.now_ms = job.started_ms + 5 * 60000;
	rep = run(&job, NULL, 0);
	assert_int_equal(rep.r[DIAG_SLOW_START].status, DIAG_OK);
	/* first row at step 50 twelve minutes in, 100 ms steps: step 1 at ~11.9 min */
	diag_sample s[1];
	healthy(s, 1);
	s[0].time_ms = job.started_ms + 12 * 60000;
	rep = run(&job, s, 1);
	assert_int_equal(rep.r[DIAG_SLOW_START].status, DIAG_ISSUE);
	assert_double_equal(rep.r[DIAG_SLOW_START].value, (12 * 60000 - 4900) / 60000.0, 1e-9);
	/* not started: no_data, and nothing at all measured says so */
	job.started = job.running = false;
	rep = run(&job, NULL, 0);
	assert_int_equal(rep.r[DIAG_SLOW_START].status, DIAG_NO_DATA);
	assert_string_equal(rep.summary, "no telemetry yet");
}

static void test_window_uses_latest(void **state)
{
	(void)state;
	/* 30 samples: the first 10 input-bound, the last 20 healthy; the window
	 * of 20 sees only the healthy ones. */
	diag_sample s[30];
	healthy(s, 30);
	for (int i = 0; i < 10; i++)
		s[i].data_wait_ms = 90;
	diag_job job = cpu_job();
	diag_report rep = run(&job, s, 30);
	assert_int_equal(rep.samples, DIAG_WINDOW);
	assert_int_equal(rep.r[DIAG_INPUT_BOUND].status, DIAG_OK);
}

static void test_config_parse_errors(void **state)
{
	(void)state;
	static const struct {
		const char *json, *field;
	} cases[] = {
		{"{\"nope\":{}}", "profiler.rules.nope"},
		{"{\"input_bound\":{\"x\":1}}", "profiler.rules.input_bound.x"},
		{"{\"input_bound\":{\"max_data_wait_share\":2}}", "profiler.rules.input_bound.max_data_wait_share"},
		{"{\"input_bound\":{\"max_data_wait_share\":\"0.2\"}}", "profiler.rules.input_bound.max_data_wait_share"},
		{"{\"straggler\":3}", "profiler.rules.straggler"},
		{"[]", "profiler.rules"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *j = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
		assert_non_null(j);
		diag_config cfg;
		char field[128] = "", detail[128] = "";
		assert_int_equal(diag_config_parse(j, &cfg, field, sizeof field, detail, sizeof detail), -EINVAL);
		assert_string_equal(field, cases[i].field);
		assert_true(detail[0] != 0);
		json_decref(j);
	}
	json_t *j = json_loads("{\"batch_too_small\":{\"max_util_pct\":50},\"slow_start\":{\"max_minutes\":1}}", 0, NULL);
	diag_config cfg, def;
	char field[128], detail[128];
	assert_int_equal(diag_config_parse(j, &cfg, field, sizeof field, detail, sizeof detail), 0);
	diag_config_default(&def);
	assert_double_equal(cfg.v[DIAG_BATCH_TOO_SMALL][1], 50, 0);
	assert_double_equal(cfg.v[DIAG_BATCH_TOO_SMALL][0], def.v[DIAG_BATCH_TOO_SMALL][0], 0);
	assert_double_equal(cfg.v[DIAG_SLOW_START][0], 1, 0);
	json_decref(j);
}

static void test_sample_from_json_and_report(void **state)
{
	(void)state;
	json_t *v = json_loads("{\"step_time_ms\":100,\"phases_ms\":{\"data_wait\":40,\"compute\":60},"
			       "\"rank_step_ms\":[10,20],\"devices\":[{\"util_pct\":50,\"mem_used_mib\":1,"
			       "\"mem_total_mib\":2}]}",
			       0, NULL);
	diag_sample s;
	assert_int_equal(diag_sample_from_json(v, 50, 123, &s), 0);
	json_decref(v);
	assert_double_equal(s.step_ms, 100, 0);
	assert_double_equal(s.data_wait_ms, 40, 0);
	assert_true(isnan(s.allreduce_ms));
	assert_int_equal(s.n_ranks, 2);
	assert_int_equal(s.n_devices, 1);
	assert_double_equal(s.dev[0].mem_total_mib, 2, 0);
	assert_int_equal(diag_sample_from_json(NULL, 1, 1, &s), -EINVAL);

	diag_job job = cpu_job();
	diag_sample w[1];
	healthy(w, 1);
	w[0].data_wait_ms = 40;
	diag_report rep = run(&job, w, 1);
	json_t *o = diag_report_json(&rep);
	assert_non_null(o);
	json_t *rules = json_object_get(o, "rules");
	assert_int_equal(json_array_size(rules), DIAG_RULE_COUNT);
	json_t *ib = json_array_get(rules, 0);
	assert_string_equal(json_string_value(json_object_get(ib, "rule")), "input_bound");
	assert_string_equal(json_string_value(json_object_get(ib, "status")), "issue");
	assert_non_null(json_string_value(json_object_get(ib, "remedy")));
	/* no_data rules carry no remedy and a null value */
	json_t *lu = json_array_get(rules, DIAG_LOW_GPU_UTILIZATION);
	assert_null(json_object_get(lu, "remedy"));
	assert_true(json_is_null(json_object_get(lu, "value")));
	json_decref(o);
}

static long self_utime(void)
{
	FILE *f = fopen("/proc/self/stat", "r");
	char buf[1024];
	size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	long ut = -1;
	if (p)
		sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld", &ut);
	return ut;
}

/* The daemon's own sampler: host CPU and loader CPU time from procfs (this
 * test process plays a loader that burns CPU, a reaped child one that is
 * gone), device samples only where NVML exists. */
static void test_sampler_host_and_loaders(void **state)
{
	(void)state;
	pid_t gone = fork();
	assert_true(gone >= 0);
	if (gone == 0)
		_exit(0);
	assert_int_equal(waitpid(gone, NULL, 0), gone);
	pid_t pids[2] = {getpid(), gone};
	unsigned idx = 0;
	tsampler *ts;
	assert_int_equal(tsampler_create(&ts, &idx, 1), 0);
	json_t *row = json_object();
	tsampler_flush(ts, row); /* nothing sampled: the row is left alone */
	assert_int_equal(json_object_size(row), 0);
	tsampler_sample(ts, pids, 2, 1000);
	/* burn CPU until the kernel has charged this process another tick */
	long u0 = self_utime();
	volatile double x = 0;
	for (long i = 0; self_utime() == u0 && i < 1000000000L; i++)
		for (int k = 0; k < 100000; k++)
			x += k * 1e-9;
	assert_true(self_utime() > u0);
	tsampler_sample(ts, pids, 2, 2000);
	tsampler_flush(ts, row);
	json_t *host = json_object_get(row, "host");
	assert_non_null(host);
	/* Whole-host busy share: in range. It can read 0 even though this
	 * process burned a tick: per-process utime (scaled from the scheduler's
	 * runtime) and /proc/stat's per-CPU tick counters are kept apart. The
	 * loader figure below uses the per-process clock and must be > 0. */
	json_t *cj = json_object_get(host, "cpu_util_pct");
	/* null when /proc/stat's total did not advance (idle can step back) */
	assert_true(json_is_number(cj) || json_is_null(cj));
	double cpu = json_is_number(cj) ? json_number_value(cj) : 0;
	assert_true(cpu >= 0 && cpu <= 100);
	json_t *ld = json_object_get(host, "loader_cpu_pct");
	assert_int_equal(json_array_size(ld), 2);
	assert_true(json_number_value(json_array_get(ld, 0)) > 0);
	assert_true(json_is_null(json_array_get(ld, 1)));
	/* a row before the next sample carries the same interval */
	json_t *row2 = json_object();
	tsampler_flush(ts, row2);
	assert_true(json_equal(json_object_get(row2, "host"), host));
	void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (getenv("BERTD_TEST_FAKE_NVML")) {
		/* tests/unit/daemon/fake_nvml.c: utilization 20 then 60, memory
		 * 1000 then 3000 MiB of 80000, 300 W, SM clock 1500 MHz */
		assert_non_null(nvml);
		dlclose(nvml);
		json_t *d = json_array_get(json_object_get(row, "devices"), 0);
		assert_non_null(d);
		assert_double_equal(json_number_value(json_object_get(d, "util_pct")), 40, 1e-12);
		assert_double_equal(json_number_value(json_object_get(d, "mem_used_mib")), 3000, 1e-12);
		assert_double_equal(json_number_value(json_object_get(d, "mem_total_mib")), 80000, 1e-12);
		assert_double_equal(json_number_value(json_object_get(d, "power_w")), 300, 1e-12);
		assert_double_equal(json_number_value(json_object_get(d, "sm_clock_mhz")), 1500, 1e-12);
		/* the window restarted: the row before the next sample has no devices */
		assert_null(json_object_get(row2, "devices"));
		/* and what the sampler wrote is what the rules read */
		diag_sample ds;
		assert_int_equal(diag_sample_from_json(row, 5, 1, &ds), 0);
		assert_int_equal(ds.n_devices, 1);
		assert_double_equal(ds.dev[0].util_pct, 40, 1e-12);
		assert_double_equal(ds.dev[0].mem_used_mib, 3000, 1e-12);
	} else if (!nvml) {
		assert_null(json_object_get(row, "devices")); /* no NVML: no_data, not an error */
	} else {
		dlclose(nvml);
		json_t *d = json_object_get(row, "devices");
		if (d) {
			double u = json_number_value(json_object_get(json_array_get(d, 0), "util_pct"));
			assert_true(u >= 0 && u <= 100);
		}
	}
	json_decref(row);
	json_decref(row2);
	tsampler_destroy(ts);
	assert_int_equal(tsampler_create(&ts, &idx, TSAMPLER_MAX_DEVICES + 1), -EINVAL);
}

/* What a worker is told its GPU is: devices_discover keeps NVML's UUID and
 * childenv_worker hands it on in CUDA_VISIBLE_DEVICES, so the worker gets
 * the physical GPU the scheduler chose whatever order CUDA enumerates in;
 * without a UUID, the NVML index with CUDA_DEVICE_ORDER=PCI_BUS_ID. */
static void test_devices_uuid_to_worker(void **state)
{
	(void)state;
	device *d = NULL;
	size_t n = 0;
	if (!getenv("BERTD_TEST_FAKE_NVML")) {
		assert_int_equal(devices_discover("cpu", 3, &d, &n), 0);
		assert_int_equal(n, 3);
		assert_int_equal(d[2].kind, DEVICE_CPU);
		assert_string_equal(d[2].uuid, "");
		free(d);
		return;
	}
	assert_int_equal(devices_discover("cuda", 0, &d, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(d[0].kind, DEVICE_CUDA);
	assert_int_equal(d[1].index, 1);
	assert_string_equal(d[0].name, "NVIDIA Fake H200");
	assert_string_equal(d[0].uuid, "GPU-0f0e0d0c-0b0a-0908-0706-050403020100");
	assert_string_equal(d[1].uuid, ""); /* fake_nvml has none for the second */
	childenv_pass p;
	char why[200];
	assert_int_equal(childenv_pass_parse(&p, "", why, sizeof why), 0);
	char *src[] = {"CUDA_VISIBLE_DEVICES=5", NULL};
	const char *want[2] = {"CUDA_VISIBLE_DEVICES=GPU-0f0e0d0c-0b0a-0908-0706-050403020100",
			       "CUDA_VISIBLE_DEVICES=1"};
	for (int k = 0; k < 2; k++) {
		childenv *ce = NULL;
		assert_int_equal(childenv_worker(&ce, &p, &d[k], 1, src), 0);
		int cvd = 0, order = 0;
		for (char **e = ce->envp; *e; e++) {
			if (strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0) {
				assert_string_equal(*e, want[k]);
				cvd++;
			}
			order += strcmp(*e, "CUDA_DEVICE_ORDER=PCI_BUS_ID") == 0;
		}
		assert_int_equal(cvd, 1);
		assert_int_equal(order, 1);
		free(ce);
	}
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_healthy_cpu_job_quiet),
		cmocka_unit_test(test_input_bound_fires_with_knob),
		cmocka_unit_test(test_input_bound_saturated_host),
		cmocka_unit_test(test_gpu_rules),
		cmocka_unit_test(test_communication_bound),
		cmocka_unit_test(test_straggler),
		cmocka_unit_test(test_checkpoint_stall),
		cmocka_unit_test(test_slow_start),
		cmocka_unit_test(test_stalled),
		cmocka_unit_test(test_window_uses_latest),
		cmocka_unit_test(test_config_parse_errors),
		cmocka_unit_test(test_sample_from_json_and_report),
		cmocka_unit_test(test_sampler_host_and_loaders),
		cmocka_unit_test(test_devices_uuid_to_worker),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
