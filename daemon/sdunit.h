/* sdunit — what systemd is doing with bertd's own unit, asked over D-Bus
 * (libsystemd's sd-bus): whether the SIGTERM that bertd got is the stop half
 * of a restart (`systemctl restart bertd`: leave the jobs running for the
 * next bertd to adopt) or a stop for good (`systemctl stop bertd`: stop them
 * with a checkpoint).
 *
 * systemd sends the same SIGTERM for both; the difference is the unit's
 * pending job: the unit object's Job property names it, and the job
 * object's JobType is "restart" (or "try-restart") for a restart and "stop"
 * for a stop. Any doubt answers "not a restart", which stops the jobs as a
 * plain stop does: not under systemd, no system bus, the bus or the unit
 * unreadable, no job, or an unknown type. Never blocks longer than the
 * bus timeout (SDUNIT_BUS_TIMEOUT_US) per call; never changes any unit.
 */
#ifndef BERTD_DAEMON_SDUNIT_H
#define BERTD_DAEMON_SDUNIT_H

#include <stdbool.h>
#include <stddef.h>

#define SDUNIT_BUS_TIMEOUT_US (2 * 1000 * 1000)

/* True only when this process is the main process of a systemd service
 * whose current job is a restart. */
bool sdunit_stop_is_restart(void);

/* The type of unit's current job ("restart", "stop", "reload", ...) into
 * type, asked on the bus at bus_address ("unix:path=...", sd-bus's address
 * syntax), or on the system bus when bus_address is NULL. Returns 1 with
 * type filled, 0 when the unit has no job, or a negative errno (no bus, no
 * such unit, a malformed answer); on 0 or error type is "". */
int sdunit_job_type(const char *bus_address, const char *unit, char *type, size_t cap);

/* Whether a job type is a restart's (stop, then start again). */
bool sdunit_type_is_restart(const char *type);

#endif
