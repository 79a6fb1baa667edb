/* devices — what jobs can run on: the GPUs NVML reports (libnvidia-ml is
 * dlopen'ed, so the daemon starts and runs on a machine with no GPU and no
 * CUDA), or else CPU slots, each slot one CPU worker process.
 * The daemon never creates a CUDA context; workers do.
 */
#ifndef BERTD_DAEMON_DEVICES_H
#define BERTD_DAEMON_DEVICES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum device_kind { DEVICE_CPU = 0, DEVICE_CUDA = 1 };

typedef struct device {
	enum device_kind kind;
	int index;              /* NVML index (PCI bus order), or CPU slot number */
	char name[96];          /* "NVIDIA H200", "cpu" */
	char uuid[96];          /* NVML's "GPU-<uuid>"; "" for CPU slots or when NVML has none */
	uint64_t mem_total;     /* bytes; 0 when unknown (CPU slots) */
	int cc_major, cc_minor; /* compute capability; 0 for CPU */
	uint64_t peers;         /* bit j: a direct link to the device table's entry j
				 * (NVLink, from NVML's P2P status; CPU slots: all of
				 * them, they share host memory); tables of <= 64 */
	bool peers_known;       /* false: NVML could not say (peers is 0) */
} device;

/* Discovers devices. mode "auto": GPUs when NVML finds any, else CPU slots;
 * "cpu": CPU slots only; "cuda": GPUs only (-ENODEV when none).
 * cpu_slots 0 means one slot per online CPU. *out caller-owned (free()). */
int devices_discover(const char *mode, int cpu_slots, device **out, size_t *n);

/* "cpu" or "cuda" */
const char *device_kind_name(enum device_kind k);

#endif
