/* telemetry_sampler — what the daemon itself samples for a running job
 * between two of its metrics rows: per-device GPU utilization, memory,
 * power and SM clock through NVML (dlopen'ed; absent NVML or a CPU job
 * means no device samples, not an error), host CPU utilization from
 * /proc/stat and each loader's CPU use from /proc/<pid>/stat. The
 * supervisor samples every 500 ms (a timerfd on its loop) and, when a worker's metrics message
 * arrives, folds the window's aggregates into the row it stores
 * ("devices", "host"; docs/diagnosis.md).
 *
 * Runs on the event loop thread only; must never block (NVML queries and
 * procfs reads are both non-blocking in practice) or keep per-job state
 * beyond one window. */
#ifndef BERTD_DAEMON_TELEMETRY_SAMPLER_H
#define BERTD_DAEMON_TELEMETRY_SAMPLER_H

#include <jansson.h>
#include <sys/types.h>

#define TSAMPLER_MAX_DEVICES 64
#define TSAMPLER_MAX_LOADERS 64

typedef struct tsampler tsampler;

/* A sampler for one run. nvml_index: (ndev,) NVML indices of the run's GPUs
 * (ndev 0 for a CPU job). *out is caller-owned (tsampler_destroy).
 * -ENOMEM or -EINVAL (ndev out of range). */
int tsampler_create(tsampler **out, const unsigned *nvml_index, int ndev);
void tsampler_destroy(tsampler *s);

/* One sample at now_ms (monotonic): every device, host CPU, and the loaders
 * loader_pids[0..nloaders) (pids that are gone are skipped). */
void tsampler_sample(tsampler *s, const pid_t *loader_pids, int nloaders, int64_t now_ms);

/* Adds the window's aggregates to row (a metrics row's values object) and
 * starts a new window: "devices": [{util_pct (mean), mem_used_mib (max),
 * mem_total_mib, power_w (mean), sm_clock_mhz (mean)}] when any device was
 * sampled; "host": {cpu_util_pct, loader_cpu_pct: [...]} over the newest
 * interval between two samples that ended by now (the same interval again
 * when rows come faster than samples). Leaves row alone when nothing was
 * sampled yet. */
void tsampler_flush(tsampler *s, json_t *row);

#endif
