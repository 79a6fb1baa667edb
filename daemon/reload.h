/* reload — applies a changed configuration to the running daemon (SIGHUP,
 * `systemctl reload bertd`) without restarting anything: no job, worker,
 * connection or listener is stopped.
 *
 * A reload reads the configuration again exactly as at start (the same
 * file, environment and command line, in the same precedence), validates
 * all of it, then asks every registered hook to check and stage its part
 * (a token file read, a certificate loaded). Only when every check passed
 * does any hook apply: a bad file, or a part that fails its check, changes
 * nothing and the daemon runs on as before, with an error that names the
 * key. Keys that are not reloadable (config.h: config_key_reloadable) keep
 * their running value; a change to one is reported as taking effect at the
 * next restart.
 *
 * Hooks are how other modules take part: each registers a check (may be
 * NULL) and an apply. Runs on the event loop's thread, between ticks; must
 * never block on a job or a child process.
 */
#ifndef BERTD_DAEMON_RELOAD_H
#define BERTD_DAEMON_RELOAD_H

#include <stddef.h>

#include "daemon/config.h"

typedef struct reload_hook {
	const char *name; /* what it applies, for the log ("token", "retention", ...) */
	/* Checks next (every key already validated by config_load) and stages
	 * what apply needs in *staged (NULL when nothing), without changing
	 * anything running. 0, or a negative errno with why naming the key.
	 * May be NULL (nothing to check). */
	int (*check)(void *arg, const config *running, const config *next, void **staged, char *why,
		     size_t cap);
	/* Makes next's values the running ones; takes staged. Cannot fail. */
	void (*apply)(void *arg, const config *next, void *staged);
	/* Frees staged when a later check failed (may be NULL: staged is
	 * free()d). */
	void (*discard)(void *arg, void *staged);
	void *arg;
} reload_hook;

typedef struct reload reload;

/* running: the configuration the daemon started with (copied, then kept as
 * the one in force); argc/argv/envp: what config_load read it from
 * (borrowed: main's, alive for the process; envp NULL = the process's
 * environment as it is at each reload). *out caller-owned
 * (reload_destroy). 0 or -ENOMEM. */
int reload_create(reload **out, const config *running, int argc, char **argv, char **envp);
void reload_destroy(reload *r);

/* Adds h (copied) to the hooks, checked and applied in registration order.
 * 0 or -ENOMEM. */
int reload_register(reload *r, const reload_hook *h);

/* Reloads: 0 when the new configuration is in force (also when nothing
 * changed); -EINVAL when the configuration or a hook's check refused it
 * (nothing changed; why holds the reason, naming the key); -ENOMEM.
 * Logs what changed, what was refused, and restart-only keys that differ. */
int reload_run(reload *r, char *why, size_t cap);

/* The configuration in force: the start's, with the reloadable keys as the
 * last successful reload set them. Borrowed, valid until the next
 * reload_run. */
const config *reload_config(const reload *r);

#endif
