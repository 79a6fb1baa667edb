/* token_cmd — see token_cmd.h. Output: `add` prints the new secret alone
 * on stdout (so `TOKEN=$(bertd token add ...)` works) and what it made on
 * stderr; `list` prints a table on stdout, NAME ROLE CREATED. */
#include "daemon/token_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/exitcodes.h"
#include "common/log.h"
#include "daemon/config.h"
#include "daemon/tokens.h"

static int usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s token add NAME --role reader|user|admin [options]\n"
		"       %s token list [options]\n"
		"       %s token revoke NAME [options]\n"
		"manages the API tokens of the state dir the options (--config FILE, --state-dir DIR,\n"
		"--tokens-file FILE, --token-file FILE) name; a running bertd sees changes at once.\n"
		"add prints the new token's secret on stdout: it is shown only this once.\n",
		prog, prog, prog);
	return BERTD_DAEMON_EXIT_CONFIG;
}

static void time_text(int64_t ms, char out[32])
{
	time_t s = (time_t)(ms / 1000);
	struct tm tm;
	gmtime_r(&s, &tm);
	strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

int token_cmd_main(int argc, char **argv, char **envp)
{
	const char *prog = argv[0];
	if (argc < 3)
		return usage(prog);
	const char *sub = argv[2], *name = NULL, *role_s = NULL;
	bool is_add = strcmp(sub, "add") == 0, is_list = strcmp(sub, "list") == 0,
	     is_revoke = strcmp(sub, "revoke") == 0;
	if (!is_add && !is_list && !is_revoke)
		return usage(prog);
	int i = 3;
	if (!is_list) {
		if (argc <= i || argv[i][0] == '-')
			return usage(prog);
		name = argv[i++];
	}
	/* What is left goes to config_load as "PROG [options]", less --role. */
	char **cargv = calloc((size_t)argc + 1, sizeof *cargv);
	if (!cargv)
		return BERTD_DAEMON_EXIT_STARTUP;
	int cargc = 0, code = BERTD_DAEMON_EXIT_CONFIG;
	tokens *t = NULL;
	cargv[cargc++] = argv[0];
	for (; i < argc; i++) {
		if (is_add && strcmp(argv[i], "--role") == 0 && i + 1 < argc)
			role_s = argv[++i];
		else if (is_add && strncmp(argv[i], "--role=", 7) == 0)
			role_s = argv[i] + 7;
		else
			cargv[cargc++] = argv[i];
	}
	enum tokens_role role = TOKENS_ROLE_READER;
	if (is_add && (!role_s || tokens_role_parse(role_s, &role) < 0)) {
		fprintf(stderr, "bertd token add: --role must be reader, user or admin%s%s\n",
			role_s ? ", not " : "", role_s ? role_s : "");
		goto out;
	}
	if (name && !tokens_name_valid(name)) {
		fprintf(stderr, "bertd token: the name must be 1 to %d of A-Z a-z 0-9 . _ - "
				"starting with a letter or digit, not \"%s\"\n", TOKENS_NAME_MAX, name);
		goto out;
	}
	config cfg;
	int rc = config_load(&cfg, cargc, cargv, envp, stdout, stderr);
	if (rc == 1) {
		code = BERTD_DAEMON_EXIT_OK;
		goto out;
	}
	if (rc < 0)
		goto out;
	log_set_level(LOG_LVL_WARN); /* the command's own lines say what it did */
	code = BERTD_DAEMON_EXIT_STARTUP;
	if ((rc = tokens_open(&t, cfg.token_file, cfg.tokens_file, false, NULL)) < 0) {
		fprintf(stderr, "bertd token: cannot read %s or %s: %s\n", cfg.token_file,
			cfg.tokens_file, strerror(-rc));
		goto out;
	}
	if (is_add) {
		char secret[65];
		tokens_entry made;
		rc = tokens_add(t, name, role, secret, &made);
		if (rc == -EEXIST) {
			fprintf(stderr, "bertd token add: a token named %s exists%s\n", name,
				strcmp(name, TOKENS_DEFAULT_NAME) == 0 ? " (the name is reserved for "
									 "the token file's)" : "");
			goto out;
		}
		if (rc < 0) {
			fprintf(stderr, "bertd token add: cannot write %s: %s\n", cfg.tokens_file,
				strerror(-rc));
			goto out;
		}
		printf("%s\n", secret);
		fflush(stdout);
		explicit_bzero(secret, sizeof secret);
		fprintf(stderr, "added token %s (role %s) to %s; its secret (above) is shown only now\n",
			name, tokens_role_name(role), cfg.tokens_file);
	} else if (is_revoke) {
		rc = tokens_revoke(t, name);
		if (rc == -ENOENT) {
			fprintf(stderr, "bertd token revoke: no token named %s\n", name);
			goto out;
		}
		if (rc < 0) {
			fprintf(stderr, "bertd token revoke: cannot change %s: %s\n", cfg.tokens_file,
				strerror(-rc));
			goto out;
		}
		fprintf(stderr, "revoked token %s\n", name);
	} else {
		tokens_entry *v = NULL;
		size_t n = 0;
		if ((rc = tokens_list(t, &v, &n)) < 0) {
			fprintf(stderr, "bertd token list: %s\n", strerror(-rc));
			goto out;
		}
		printf("%-24s %-7s %s\n", "NAME", "ROLE", "CREATED");
		for (size_t k = 0; k < n; k++) {
			char when[32];
			time_text(v[k].created_ms, when);
			printf("%-24s %-7s %s\n", v[k].name, tokens_role_name(v[k].role), when);
		}
		free(v);
	}
	code = BERTD_DAEMON_EXIT_OK;
out:
	tokens_close(t);
	free(cargv);
	return code;
}
