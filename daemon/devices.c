/* devices — see devices.h. NVML's few entry points are declared here by
 * hand (stable C ABI since NVML 1) so the daemon needs neither nvml.h nor
 * the CUDA toolkit to build or run. */
#include "daemon/devices.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

typedef void *nvml_device;
typedef struct { unsigned long long total, free, used; } nvml_memory;

typedef struct nvml_api {
	void *lib;
	int (*init)(void);
	int (*shutdown)(void);
	int (*count)(unsigned *);
	int (*handle)(unsigned, nvml_device *);
	int (*name)(nvml_device, char *, unsigned);
	int (*memory)(nvml_device, nvml_memory *);
	int (*cc)(nvml_device, int *, int *);
	int (*uuid)(nvml_device, char *, unsigned);
	int (*p2p)(nvml_device, nvml_device, int, int *);
} nvml_api;

#define NVML_P2P_CAPS_INDEX_NVLINK 2
#define NVML_P2P_STATUS_OK 0

static int nvml_load(nvml_api *a)
{
	memset(a, 0, sizeof *a);
	a->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!a->lib)
		return -ENOENT;
	*(void **)&a->init = dlsym(a->lib, "nvmlInit_v2");
	*(void **)&a->shutdown = dlsym(a->lib, "nvmlShutdown");
	*(void **)&a->count = dlsym(a->lib, "nvmlDeviceGetCount_v2");
	*(void **)&a->handle = dlsym(a->lib, "nvmlDeviceGetHandleByIndex_v2");
	*(void **)&a->name = dlsym(a->lib, "nvmlDeviceGetName");
	*(void **)&a->memory = dlsym(a->lib, "nvmlDeviceGetMemoryInfo");
	*(void **)&a->cc = dlsym(a->lib, "nvmlDeviceGetCudaComputeCapability");
	*(void **)&a->uuid = dlsym(a->lib, "nvmlDeviceGetUUID");
	*(void **)&a->p2p = dlsym(a->lib, "nvmlDeviceGetP2PStatus");
	if (!a->init || !a->shutdown || !a->count || !a->handle || !a->name || !a->memory) {
		dlclose(a->lib);
		a->lib = NULL;
		return -ENOSYS;
	}
	return 0;
}

/* Which pairs of GPUs NVLink joins directly (NVML's P2P status for the
 * NVLink capability), into each device's peers. Unknown when this NVML
 * lacks the call, a query fails, or there are more than 64 GPUs. */
static void topology(const nvml_api *a, nvml_device *hs, device *d, size_t n)
{
	if (!a->p2p || n > 64)
		return;
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++) {
			int st = -1;
			if (a->p2p(hs[i], hs[j], NVML_P2P_CAPS_INDEX_NVLINK, &st) != 0) {
				for (size_t k = 0; k < n; k++)
					d[k].peers = 0; /* no topology rather than half of one */
				return;
			}
			if (st == NVML_P2P_STATUS_OK) {
				d[i].peers |= (uint64_t)1 << j;
				d[j].peers |= (uint64_t)1 << i;
			}
		}
	for (size_t i = 0; i < n; i++)
		d[i].peers_known = true;
}

static int discover_gpus(device **out, size_t *n)
{
	nvml_api a;
	*out = NULL;
	*n = 0;
	if (nvml_load(&a) < 0)
		return 0;
	int rc = 0;
	unsigned count = 0;
	if (a.init() != 0) {
		log_warn("NVML is installed but failed to initialize; no GPUs used");
		goto out_close;
	}
	if (a.count(&count) != 0 || count == 0)
		goto out_shutdown;
	*out = calloc(count, sizeof **out);
	nvml_device *hs = calloc(count, sizeof *hs); /* (count,) handle of each table entry */
	if (!*out || !hs) {
		free(*out);
		*out = NULL;
		rc = -ENOMEM;
		goto out_shutdown;
	}
	for (unsigned i = 0; i < count; i++) {
		device *d = &(*out)[*n];
		nvml_device h;
		if (a.handle(i, &h) != 0)
			continue;
		hs[*n] = h;
		d->kind = DEVICE_CUDA;
		d->index = (int)i;
		if (a.name(h, d->name, sizeof d->name) != 0)
			snprintf(d->name, sizeof d->name, "GPU %u", i);
		nvml_memory m;
		if (a.memory(h, &m) == 0)
			d->mem_total = m.total;
		if (a.cc)
			a.cc(h, &d->cc_major, &d->cc_minor);
		/* workers are handed the UUID: it names this GPU whatever order
		 * CUDA enumerates in (childenv_worker) */
		if (!a.uuid || a.uuid(h, d->uuid, sizeof d->uuid) != 0)
			d->uuid[0] = 0;
		(*n)++;
	}
	topology(&a, hs, *out, *n);
	free(hs);
out_shutdown:
	a.shutdown();
out_close:
	dlclose(a.lib);
	return rc;
}

int devices_discover(const char *mode, int cpu_slots, device **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (strcmp(mode, "auto") != 0 && strcmp(mode, "cpu") != 0 && strcmp(mode, "cuda") != 0)
		return -EINVAL;
	if (strcmp(mode, "cpu") != 0) {
		int rc = discover_gpus(out, n);
		if (rc < 0)
			return rc;
		if (*n > 0)
			return 0;
		if (strcmp(mode, "cuda") == 0)
			return -ENODEV;
	}
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int slots = cpu_slots > 0 ? cpu_slots : (int)(ncpu > 0 ? ncpu : 1);
	*out = calloc((size_t)slots, sizeof **out);
	if (!*out)
		return -ENOMEM;
	uint64_t every = slots >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << slots) - 1);
	for (int i = 0; i < slots; i++) {
		(*out)[i] = (device){.kind = DEVICE_CPU, .index = i, .peers_known = slots <= 64,
				     .peers = slots <= 64 ? every & ~((uint64_t)1 << i) : 0};
		snprintf((*out)[i].name, sizeof (*out)[i].name, "cpu");
	}
	*n = (size_t)slots;
	return 0;
}

const char *device_kind_name(enum device_kind k) { return k == DEVICE_CUDA ? "cuda" : "cpu"; }
