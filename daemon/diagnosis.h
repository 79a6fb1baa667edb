/* diagnosis — bottleneck rules over a job's telemetry (docs/diagnosis.md).
 *
 * Pure functions: a window of samples (one per logging window, as the worker
 * reports them and the store keeps them) plus the job's knobs go in; a
 * verdict per rule comes out, `no_data | ok | issue`, with the measured
 * numbers and a remedy that names the knob to turn. No I/O, no clock, no
 * globals, so the unit test can feed synthetic telemetry; must never read
 * the store or the network itself (api/diagnosis.c does that).
 *
 * Thresholds have defaults in one table; a job overrides them under
 * profiler.rules.<rule>.<threshold> (diag_config_parse validates that).
 */
#ifndef BERTD_DAEMON_DIAGNOSIS_H
#define BERTD_DAEMON_DIAGNOSIS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DIAG_MAX_RANKS 64
#define DIAG_MAX_DEVICES 64
#define DIAG_WINDOW 20 /* most recent samples the rules look at */

enum diag_rule {
	DIAG_INPUT_BOUND = 0,
	DIAG_LOW_GPU_UTILIZATION,
	DIAG_FLUCTUATING_GPU_UTILIZATION,
	DIAG_COMMUNICATION_BOUND,
	DIAG_BATCH_TOO_SMALL,
	DIAG_STRAGGLER,
	DIAG_CHECKPOINT_STALL,
	DIAG_SLOW_START,
	DIAG_STALLED,
	DIAG_RULE_COUNT
};

enum diag_status { DIAG_NO_DATA = 0, DIAG_OK, DIAG_ISSUE };

#define DIAG_MAX_THRESHOLDS 3

/* Values of every rule's thresholds, indexed like the rule table. */
typedef struct diag_config {
	double v[DIAG_RULE_COUNT][DIAG_MAX_THRESHOLDS];
} diag_config;

/* One device reading (NVML); fields NAN when the sampler could not read them. */
typedef struct diag_device {
	double util_pct;       /* mean GPU utilization over the window, 0..100 */
	double mem_used_mib, mem_total_mib;
} diag_device;

/* One logging window as the worker reported it. Times are per-step means in
 * milliseconds; NAN where the worker did not report the field (older
 * workers, or a phase it cannot measure). */
typedef struct diag_sample {
	int64_t step;
	int64_t time_ms;          /* epoch ms when the row was stored */
	double step_ms, step_p95_ms;
	double data_wait_ms, h2d_ms, compute_ms, allreduce_ms, optimizer_ms, checkpoint_ms;
	int n_ranks;              /* 0 when no per-rank times were reported */
	double rank_step_ms[DIAG_MAX_RANKS]; /* busy time (data + compute) per rank */
	double host_cpu_pct;      /* host CPU busy, 0..100 (/proc/stat); NAN if not sampled */
	int n_devices;            /* 0 on a CPU job or without NVML */
	diag_device dev[DIAG_MAX_DEVICES];
} diag_sample;

/* What the rules need to know about the job besides its telemetry. */
typedef struct diag_job {
	bool running;             /* state is running */
	bool started;             /* has a started_ms */
	int64_t started_ms, now_ms;
	int loader_workers;       /* training_args.dataloader_num_workers */
	int batch_size;           /* training_args.per_device_train_batch_size */
	int grad_accum;           /* training_args.gradient_accumulation_steps */
	int64_t save_steps;       /* training_args.save_steps */
	int world;                /* worker processes (devices) */
	bool gpu;                 /* the job runs on CUDA devices */
	/* The rank the supervisor's stall watch suspects (store_job.stall_json,
	 * read with diag_job_stall_from_json); stall false when none. */
	bool stall;
	int stall_rank;
	int64_t stall_since_ms;   /* epoch ms of that rank's last message */
	double stall_limit_s;     /* when the attempt fails as stalled */
	bool stall_stopped;       /* its process is stopped (SIGSTOP, a debugger) */
} diag_job;

typedef struct diag_result {
	enum diag_status status;
	char detail[256];         /* the measured numbers, in words */
	char remedy[256];         /* "" unless status is DIAG_ISSUE */
	double value;             /* the rule's headline number (NAN if none) */
	double threshold;         /* the threshold it was compared with */
} diag_result;

typedef struct diag_report {
	diag_result r[DIAG_RULE_COUNT];
	size_t samples;           /* samples the rules looked at */
	char summary[320];        /* one line */
} diag_report;

/* Rule name as used in the API and the job spec ("input_bound"). */
const char *diag_rule_name(enum diag_rule r);
const char *diag_status_name(enum diag_status s);

/* Fills cfg with every threshold's default. */
void diag_config_default(diag_config *cfg);

/* Applies profiler.rules (an object; NULL = defaults) over the defaults.
 * Returns 0, or -EINVAL with field set to the offending path
 * ("profiler.rules.input_bound.max_data_wait_share") and detail to why:
 * unknown rule, unknown threshold, not a number, out of range. */
int diag_config_parse(const json_t *rules, diag_config *cfg, char *field, size_t field_len,
		      char *detail, size_t detail_len);

/* Fills job's stall fields from store_job.stall_json (NULL: none; text that
 * is not the supervisor's object counts as none). */
void diag_job_stall_from_json(diag_job *job, const char *stall_json);

/* Reads one stored metrics row (the worker's message) into *s; missing
 * fields become NAN / 0 counts. Returns 0, or -EINVAL if it is not an
 * object. */
int diag_sample_from_json(const json_t *values, int64_t step, int64_t time_ms, diag_sample *s);

/* Runs every rule over samples[0..n) (oldest first; only the last
 * DIAG_WINDOW are used) and fills *out, summary included. */
void diag_run(const diag_config *cfg, const diag_job *job, const diag_sample *samples, size_t n,
	      diag_report *out);

/* The report as JSON: {"summary", "samples", "rules": [{"rule", "status",
 * "detail", "remedy", "value", "threshold"}...]}. Caller owns; NULL on
 * allocation failure. */
json_t *diag_report_json(const diag_report *rep);

#endif
