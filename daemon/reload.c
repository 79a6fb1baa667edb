/* reload — see reload.h. */
#include "daemon/reload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

extern char **environ;

struct reload {
	config cur;         /* in force */
	int argc;
	char **argv, **envp;
	reload_hook *hooks; /* (n) */
	size_t n;
};

int reload_create(reload **out, const config *running, int argc, char **argv, char **envp)
{
	reload *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->cur = *running;
	r->argc = argc;
	r->argv = argv;
	r->envp = envp;
	*out = r;
	return 0;
}

void reload_destroy(reload *r)
{
	if (!r)
		return;
	free(r->hooks);
	free(r);
}

int reload_register(reload *r, const reload_hook *h)
{
	reload_hook *hs = realloc(r->hooks, (r->n + 1) * sizeof *hs);
	if (!hs)
		return -ENOMEM;
	hs[r->n++] = *h;
	r->hooks = hs;
	return 0;
}

const config *reload_config(const reload *r)
{
	return &r->cur;
}

typedef struct changes {
	char reloaded[512];  /* ", "-separated reloadable keys that changed */
	int n_reloaded;
} changes;

static void note_change(void *arg, const char *key, bool reloadable)
{
	changes *c = arg;
	if (!reloadable) {
		log_warn("reload: %s changed in the configuration but is read at start only: the "
			 "running value stays until the next restart (systemctl restart bertd)", key);
		return;
	}
	size_t used = strlen(c->reloaded);
	snprintf(c->reloaded + used, sizeof c->reloaded - used, "%s%s", c->n_reloaded ? ", " : "", key);
	c->n_reloaded++;
}

/* config_load's own message (to a FILE) as one line in why. */
static int load_next(reload *r, config *next, char *why, size_t cap)
{
	char *msg = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&msg, &len);
	if (!err)
		return -ENOMEM;
	FILE *out = fopen("/dev/null", "w");
	/* environ as it is now: a setenv since start may have moved it */
	int rc = config_load(next, r->argc, r->argv, r->envp ? r->envp : environ, out ? out : err, err);
	if (out)
		fclose(out);
	fclose(err);
	if (rc != 0) {
		/* "bertd: FILE:LINE: KEY must be ..." without the program name and newline */
		const char *m = msg && strncmp(msg, "bertd: ", 7) == 0 ? msg + 7 : msg ? msg : "";
		size_t ml = strcspn(m, "\n");
		snprintf(why, cap, "%.*s", (int)ml, rc == 1 ? "the arguments ask for --help or --version" : m);
		rc = -EINVAL;
	}
	free(msg);
	return rc;
}

int reload_run(reload *r, char *why, size_t cap)
{
	int rc;
	void **staged = NULL;
	size_t checked = 0;
	config *next = malloc(sizeof *next); /* about 30 KiB: not on the loop's stack */
	if (!next)
		return -ENOMEM;
	why[0] = 0;
	if ((rc = load_next(r, next, why, cap)) < 0)
		goto out;
	/* What reload does not apply keeps its running value, so hooks and
	 * reload_config see one consistent configuration. */
	config merged = r->cur;
	config_copy_reloadable(&merged, next);
	changes ch = {0};
	config_each_change(&r->cur, next, note_change, &ch);
	if (!(staged = calloc(r->n ? r->n : 1, sizeof *staged))) {
		rc = -ENOMEM;
		goto out;
	}
	for (; checked < r->n; checked++) {
		reload_hook *h = &r->hooks[checked];
		if (h->check && (rc = h->check(h->arg, &r->cur, &merged, &staged[checked], why, cap)) < 0) {
			if (!why[0])
				snprintf(why, cap, "%s: %s", h->name, strerror(-rc));
			rc = -EINVAL;
			goto out;
		}
	}
	/* Every check passed: from here nothing fails. */
	for (size_t i = 0; i < r->n; i++) {
		r->hooks[i].apply(r->hooks[i].arg, &merged, staged[i]);
		staged[i] = NULL;
	}
	r->cur = merged;
	if (ch.n_reloaded)
		log_info("reload: configuration reloaded (%s changed)", ch.reloaded);
	else
		log_info("reload: configuration reloaded (no reloadable key changed)");
	rc = 0;
out:
	for (size_t i = 0; staged && i < checked; i++) {
		if (!staged[i])
			continue;
		if (r->hooks[i].discard)
			r->hooks[i].discard(r->hooks[i].arg, staged[i]);
		else
			free(staged[i]);
	}
	free(staged);
	free(next);
	if (rc == -EINVAL)
		log_error("reload refused, nothing changed: %s", why);
	return rc;
}
