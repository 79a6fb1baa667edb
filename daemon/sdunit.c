/* sdunit — see sdunit.h. */
#include "daemon/sdunit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-bus.h>

#include "common/log.h"

#define SD_DEST "org.freedesktop.systemd1"

bool sdunit_type_is_restart(const char *type)
{
	return strcmp(type, "restart") == 0 || strcmp(type, "try-restart") == 0;
}

static int open_bus(const char *address, sd_bus **out)
{
	int rc;
	if (!address)
		return sd_bus_open_system(out);
	sd_bus *bus = NULL;
	if ((rc = sd_bus_new(&bus)) < 0)
		return rc;
	if ((rc = sd_bus_set_address(bus, address)) < 0 || (rc = sd_bus_set_bus_client(bus, 1)) < 0 ||
	    (rc = sd_bus_start(bus)) < 0) {
		sd_bus_unref(bus);
		return rc;
	}
	*out = bus;
	return 0;
}

int sdunit_job_type(const char *bus_address, const char *unit, char *type, size_t cap)
{
	int rc;
	sd_bus *bus = NULL;
	sd_bus_error err = SD_BUS_ERROR_NULL;
	sd_bus_message *reply = NULL;
	char *unit_path = NULL, *job_type = NULL;
	if (cap)
		type[0] = 0;
	if ((rc = open_bus(bus_address, &bus)) < 0)
		goto out;
	sd_bus_set_method_call_timeout(bus, SDUNIT_BUS_TIMEOUT_US);
	if ((rc = sd_bus_path_encode("/org/freedesktop/systemd1/unit", unit, &unit_path)) < 0)
		goto out;
	/* Job: (uo), the job's id (0 = none) and its object */
	if ((rc = sd_bus_get_property(bus, SD_DEST, unit_path, "org.freedesktop.systemd1.Unit", "Job",
				      &err, &reply, "(uo)")) < 0)
		goto out;
	uint32_t id = 0;
	const char *job_path = NULL;
	if ((rc = sd_bus_message_read(reply, "(uo)", &id, &job_path)) < 0)
		goto out;
	if (id == 0) {
		rc = 0;
		goto out;
	}
	char path[512];
	snprintf(path, sizeof path, "%s", job_path);
	if ((rc = sd_bus_get_property_string(bus, SD_DEST, path, "org.freedesktop.systemd1.Job",
					     "JobType", &err, &job_type)) < 0)
		goto out;
	snprintf(type, cap, "%s", job_type);
	rc = 1;
out:
	if (rc < 0 && sd_bus_error_is_set(&err))
		log_debug("sdunit: %s: %s", err.name, err.message ? err.message : "");
	free(job_type);
	free(unit_path);
	sd_bus_message_unref(reply);
	sd_bus_error_free(&err);
	sd_bus_flush_close_unref(bus);
	return rc;
}

/* The service unit this process runs in, from its own cgroup path in
 * systemd's hierarchy: the unified one ("0::/system.slice/bertd.service"),
 * else name=systemd's (a legacy set-up). Not sd_pid_get_unit(): it also
 * reads /proc/1/cgroup (to cut PID 1's own cgroup off the path), and the
 * unit's ProtectProc=invisible hides PID 1 from bertd: under bertd.service
 * it fails, and every restart would be taken for a stop.
 * Returns 0 with unit filled, -ENOENT when no line names a .service. */
static int own_unit(char *unit, size_t cap)
{
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return -errno;
	char line[1024], v1[256] = "";
	int rc = -ENOENT;
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		bool unified = strncmp(line, "0::", 3) == 0;
		if (!unified && !strstr(line, ":name=systemd:"))
			continue;
		const char *base = strrchr(line, '/');
		size_t n = base ? strlen(++base) : 0;
		if (n < sizeof ".service" || strcmp(base + n - strlen(".service"), ".service") != 0)
			continue;
		if (unified) {
			snprintf(unit, cap, "%s", base);
			rc = 0;
			break;
		}
		snprintf(v1, sizeof v1, "%s", base);
	}
	fclose(f);
	if (rc < 0 && v1[0]) {
		snprintf(unit, cap, "%s", v1);
		rc = 0;
	}
	return rc;
}

bool sdunit_stop_is_restart(void)
{
	/* systemd sets INVOCATION_ID for every service process it starts */
	if (!getenv("INVOCATION_ID"))
		return false;
	char unit[256];
	if (own_unit(unit, sizeof unit) < 0) {
		log_warn("cannot tell which systemd unit bertd runs in (/proc/self/cgroup names no "
			 ".service): treating the SIGTERM as a stop");
		return false;
	}
	char type[64];
	int rc = sdunit_job_type(NULL, unit, type, sizeof type);
	bool restart = rc == 1 && sdunit_type_is_restart(type);
	if (rc < 0)
		log_warn("cannot ask systemd what %s's stop is (%s): treating it as a stop", unit,
			 strerror(-rc));
	else
		log_info("systemd job of %s: %s", unit, rc == 1 ? type : "none");
	return restart;
}
