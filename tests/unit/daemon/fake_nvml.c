/* fake_nvml — a stand-in libnvidia-ml.so.1 for the telemetry sampler's
 * unit test on machines without a GPU: the six NVML entry points the
 * sampler dlsym's, with known readings, so the test can check the
 * aggregation (mean utilization, peak memory, mean power and clock)
 * exactly; and what devices_discover reads (count, name, UUID, compute
 * capability): two GPUs, the second without a UUID, of the compute
 * capability FAKE_NVML_CC names ("7.0": a V100), or none reported when it
 * is unset. With FAKE_NVML_TOPO naming a file of `nvidia-smi topo -m`
 * output (tests/fixtures/topo/), as many GPUs as its matrix has rows, and
 * nvmlDeviceGetP2PStatus's NVLink answer from it: a pair marked NV# is
 * linked. Never linked into the daemon; only found through the test's
 * LD_LIBRARY_PATH. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_memory;

int nvmlInit_v2(void);
int nvmlShutdown(void);
int nvmlDeviceGetCount_v2(unsigned *n);
int nvmlDeviceGetName(void *h, char *name, unsigned len);
int nvmlDeviceGetUUID(void *h, char *uuid, unsigned len);
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h);
int nvmlDeviceGetUtilizationRates(void *h, nvml_util *u);
int nvmlDeviceGetMemoryInfo(void *h, nvml_memory *m);
int nvmlDeviceGetPowerUsage(void *h, unsigned *mw);
int nvmlDeviceGetClockInfo(void *h, int type, unsigned *mhz);
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor);
int nvmlDeviceGetP2PStatus(void *h1, void *h2, int caps_index, int *status);

static int calls; /* utilization reads so far: readings alternate */
static int handles[8];

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }

/* FAKE_NVML_TOPO's matrix, read once: ngpu rows; nv[i][j] NVLink between i and j */
static int topo_read = 0, topo_n = 0;
static unsigned char nv[8][8];

static void topo_load(void)
{
	if (topo_read)
		return;
	topo_read = 1;
	const char *path = getenv("FAKE_NVML_TOPO");
	FILE *f = path ? fopen(path, "r") : NULL;
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		int row;
		if (sscanf(line, "GPU%d", &row) != 1 || row < 0 || row >= 8)
			continue; /* the header (starts with a tab) and the legend */
		if (row + 1 > topo_n)
			topo_n = row + 1;
		char *save = NULL;
		strtok_r(line, "\t\n", &save); /* "GPUi" */
		for (int col = 0; col < 8; col++) {
			char *cell = strtok_r(NULL, "\t\n", &save);
			if (!cell)
				break;
			nv[row][col] = strncmp(cell, "NV", 2) == 0;
		}
	}
	fclose(f);
}

int nvmlDeviceGetCount_v2(unsigned *n)
{
	topo_load();
	*n = topo_n > 0 ? (unsigned)topo_n : 2;
	return 0;
}

int nvmlDeviceGetP2PStatus(void *h1, void *h2, int caps_index, int *status)
{
	topo_load();
	int i = (int)((int *)h1 - handles), j = (int)((int *)h2 - handles);
	if (caps_index != 2 /* NVML_P2P_CAPS_INDEX_NVLINK */ || i < 0 || i >= 8 || j < 0 || j >= 8)
		return 2; /* NVML_ERROR_INVALID_ARGUMENT */
	*status = topo_n > 0 && nv[i][j] ? 0 /* NVML_P2P_STATUS_OK */ : 4 /* NVML_P2P_STATUS_NOT_SUPPORTED */;
	return 0;
}

static int copy(char *dst, unsigned len, const char *src)
{
	unsigned i = 0;
	for (; src[i]; i++) {
		if (i + 1 >= len)
			return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
		dst[i] = src[i];
	}
	dst[i] = 0;
	return 0;
}

int nvmlDeviceGetName(void *h, char *name, unsigned len)
{
	(void)h;
	return copy(name, len, "NVIDIA Fake H200");
}

int nvmlDeviceGetUUID(void *h, char *uuid, unsigned len)
{
	if (h != &handles[0])
		return 3; /* NVML_ERROR_NOT_SUPPORTED */
	return copy(uuid, len, "GPU-0f0e0d0c-0b0a-0908-0706-050403020100");
}

int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h)
{
	if (i >= 8)
		return 2; /* NVML_ERROR_INVALID_ARGUMENT */
	*h = &handles[i];
	return 0;
}

int nvmlDeviceGetUtilizationRates(void *h, nvml_util *u)
{
	(void)h;
	u->gpu = calls++ % 2 ? 60 : 20; /* 20, 60, 20, ... */
	u->memory = 0;
	return 0;
}

int nvmlDeviceGetMemoryInfo(void *h, nvml_memory *m)
{
	(void)h;
	m->total = 80000ull << 20;
	m->used = (calls % 2 ? 1000ull : 3000ull) << 20; /* read after utilization: 1000, 3000, ... */
	m->free = m->total - m->used;
	return 0;
}

int nvmlDeviceGetPowerUsage(void *h, unsigned *mw)
{
	(void)h;
	*mw = 300000;
	return 0;
}

int nvmlDeviceGetClockInfo(void *h, int type, unsigned *mhz)
{
	(void)h;
	*mhz = type == 1 ? 1500 : 0;
	return 0;
}

int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor)
{
	(void)h;
	const char *cc = getenv("FAKE_NVML_CC");
	if (!cc || sscanf(cc, "%d.%d", major, minor) != 2)
		return 3; /* NVML_ERROR_NOT_SUPPORTED */
	return 0;
}
