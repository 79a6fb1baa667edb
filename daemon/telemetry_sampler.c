/* telemetry_sampler — see telemetry_sampler.h. NVML is declared here by
 * hand like in devices.c (stable C ABI), loaded once per process on first
 * use; a failed load is remembered so a machine without a GPU pays for one
 * dlopen attempt, not one per sample. */
#include "daemon/telemetry_sampler.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

typedef void *nvml_device;
typedef struct { unsigned gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_memory;
#define NVML_CLOCK_SM 1

static struct {
	bool tried, ok;
	void *lib;
	int (*init)(void);
	int (*handle)(unsigned, nvml_device *);
	int (*util)(nvml_device, nvml_util *);
	int (*memory)(nvml_device, nvml_memory *);
	int (*power)(nvml_device, unsigned *);        /* milliwatts */
	int (*clock)(nvml_device, int, unsigned *);   /* MHz */
} nv;

static bool nvml_ready(void)
{
	if (nv.tried)
		return nv.ok;
	nv.tried = true;
	nv.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!nv.lib)
		return false;
	*(void **)&nv.init = dlsym(nv.lib, "nvmlInit_v2");
	*(void **)&nv.handle = dlsym(nv.lib, "nvmlDeviceGetHandleByIndex_v2");
	*(void **)&nv.util = dlsym(nv.lib, "nvmlDeviceGetUtilizationRates");
	*(void **)&nv.memory = dlsym(nv.lib, "nvmlDeviceGetMemoryInfo");
	*(void **)&nv.power = dlsym(nv.lib, "nvmlDeviceGetPowerUsage");
	*(void **)&nv.clock = dlsym(nv.lib, "nvmlDeviceGetClockInfo");
	if (!nv.init || !nv.handle || !nv.util || !nv.memory || nv.init() != 0) {
		log_warn("NVML found but unusable: GPU telemetry off");
		return false;
	}
	nv.ok = true;
	return true;
}

typedef struct dev_acc {
	unsigned index;
	int n, n_power, n_clock;
	double util_sum, mem_used_max, mem_total, power_sum, clock_sum;
} dev_acc;

struct tsampler {
	int ndev;
	dev_acc dev[TSAMPLER_MAX_DEVICES];
	/* host: first and last sample of the window */
	bool have_first;
	unsigned long long cpu_busy0, cpu_total0, cpu_busy1, cpu_total1;
	int64_t t0_ms, t1_ms;
	int nloaders;
	double loader_cpu0[TSAMPLER_MAX_LOADERS], loader_cpu1[TSAMPLER_MAX_LOADERS]; /* seconds */
	json_t *host_last;     /* the newest complete interval's "host", for rows in between */
};

int tsampler_create(tsampler **out, const unsigned *nvml_index, int ndev)
{
	if (ndev < 0 || ndev > TSAMPLER_MAX_DEVICES)
		return -EINVAL;
	tsampler *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->ndev = ndev;
	for (int i = 0; i < ndev; i++)
		s->dev[i].index = nvml_index[i];
	*out = s;
	return 0;
}

void tsampler_destroy(tsampler *s)
{
	if (s)
		json_decref(s->host_last);
	free(s);
}

/* Aggregate busy and total jiffies from /proc/stat's "cpu" line. */
static int host_cpu(unsigned long long *busy, unsigned long long *total)
{
	FILE *f = fopen("/proc/stat", "r");
	if (!f)
		return -errno;
	unsigned long long v[8] = {0};
	int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
		       &v[6], &v[7]);
	fclose(f);
	if (n < 4)
		return -EPROTO;
	*total = 0;
	for (int i = 0; i < 8; i++)
		*total += v[i];
	*busy = *total - v[3] - v[4]; /* minus idle and iowait */
	return 0;
}

/* utime + stime of pid in seconds, or -1 when it is gone. */
static double proc_cpu_s(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	/* the command name may hold spaces and parens: fields start after the last ')' */
	char *p = strrchr(buf, ')');
	if (!p)
		return -1;
	unsigned long long ut = 0, st = 0;
	/* after ')': state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
	if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	long hz = sysconf(_SC_CLK_TCK);
	return (double)(ut + st) / (double)(hz > 0 ? hz : 100);
}

void tsampler_sample(tsampler *s, const pid_t *loader_pids, int nloaders, int64_t now_ms)
{
	if (s->ndev > 0 && nvml_ready()) {
		for (int i = 0; i < s->ndev; i++) {
			dev_acc *d = &s->dev[i];
			nvml_device h;
			nvml_util u;
			nvml_memory m;
			if (nv.handle(d->index, &h) != 0 || nv.util(h, &u) != 0 || nv.memory(h, &m) != 0)
				continue;
			d->n++;
			d->util_sum += u.gpu;
			double used = (double)m.used / 1048576.0;
			if (used > d->mem_used_max)
				d->mem_used_max = used;
			d->mem_total = (double)m.total / 1048576.0;
			unsigned mw, mhz;
			if (nv.power && nv.power(h, &mw) == 0)
				d->power_sum += mw / 1000.0, d->n_power++;
			if (nv.clock && nv.clock(h, NVML_CLOCK_SM, &mhz) == 0)
				d->clock_sum += mhz, d->n_clock++;
		}
	}
	unsigned long long busy = 0, total = 0;
	if (host_cpu(&busy, &total) < 0)
		return;
	if (nloaders > TSAMPLER_MAX_LOADERS)
		nloaders = TSAMPLER_MAX_LOADERS;
	double cpu[TSAMPLER_MAX_LOADERS];
	for (int i = 0; i < nloaders; i++)
		cpu[i] = proc_cpu_s(loader_pids[i]);
	if (!s->have_first || nloaders != s->nloaders) {
		s->have_first = true;
		s->cpu_busy0 = s->cpu_busy1 = busy;
		s->cpu_total0 = s->cpu_total1 = total;
		s->t0_ms = s->t1_ms = now_ms;
		s->nloaders = nloaders;
		memcpy(s->loader_cpu0, cpu, sizeof cpu[0] * (size_t)nloaders);
		memcpy(s->loader_cpu1, cpu, sizeof cpu[0] * (size_t)nloaders);
		return;
	}
	s->cpu_busy1 = busy;
	s->cpu_total1 = total;
	s->t1_ms = now_ms;
	memcpy(s->loader_cpu1, cpu, sizeof cpu[0] * (size_t)nloaders);
}

void tsampler_flush(tsampler *s, json_t *row)
{
	json_t *devs = json_array();
	bool any = false;
	for (int i = 0; i < s->ndev; i++) {
		dev_acc *d = &s->dev[i];
		json_t *o = json_object();
		if (d->n > 0) {
			any = true;
			json_object_set_new(o, "util_pct", json_real(d->util_sum / d->n));
			json_object_set_new(o, "mem_used_mib", json_real(d->mem_used_max));
			json_object_set_new(o, "mem_total_mib", json_real(d->mem_total));
			if (d->n_power)
				json_object_set_new(o, "power_w", json_real(d->power_sum / d->n_power));
			if (d->n_clock)
				json_object_set_new(o, "sm_clock_mhz", json_real(d->clock_sum / d->n_clock));
		}
		json_array_append_new(devs, o);
		unsigned idx = d->index;
		memset(d, 0, sizeof *d);
		d->index = idx;
	}
	if (any)
		json_object_set_new(row, "devices", devs);
	else
		json_decref(devs);
	if (s->have_first && s->t1_ms > s->t0_ms) {
		double wall = (double)(s->t1_ms - s->t0_ms) / 1000.0;
		json_t *ld = json_array();
		for (int i = 0; i < s->nloaders; i++) {
			double d = s->loader_cpu1[i] - s->loader_cpu0[i];
			json_array_append_new(ld, s->loader_cpu0[i] < 0 || s->loader_cpu1[i] < 0 ? json_null()
												: json_real(100.0 * d / wall));
		}
		json_decref(s->host_last);
		/* The kernel's idle and iowait counters are not monotonic (NO_HZ
		 * idle accounting; iowait can step back), so "busy" may move a
		 * little against "total": difference signed, then clamp. */
		double busy = (double)s->cpu_busy1 - (double)s->cpu_busy0;
		double total = (double)s->cpu_total1 - (double)s->cpu_total0;
		double pct = total > 0 ? 100.0 * busy / total : 0;
		pct = pct < 0 ? 0 : pct > 100 ? 100 : pct;
		/* The total can fail to advance over a short interval for the same
		 * reason (seen under load): no host figure then, null, while the
		 * loader figures (per-process clocks) still stand. */
		s->host_last = json_pack("{s:o, s:o}", "cpu_util_pct", total > 0 ? json_real(pct) : json_null(),
					 "loader_cpu_pct", ld);
		/* the window's end is the next one's start */
		s->cpu_busy0 = s->cpu_busy1;
		s->cpu_total0 = s->cpu_total1;
		s->t0_ms = s->t1_ms;
		memcpy(s->loader_cpu0, s->loader_cpu1, sizeof s->loader_cpu0[0] * (size_t)s->nloaders);
	}
	/* Rows come faster than the samples on small models: each carries the
	 * newest complete interval rather than nothing. */
	if (s->host_last)
		json_object_set(row, "host", s->host_last);
}
