/* clihttp — bertctl's connection: where the daemon is and its token
 * (environment, then the config file), and one request/answer helper over
 * libcurl that turns an error answer into one line on stderr and an exit
 * code. Must never take the token from the command line or print it. */
#ifndef BERTD_CLIENT_CLIHTTP_H
#define BERTD_CLIENT_CLIHTTP_H

#include <stddef.h>
#include <stdio.h>

#include "client/cli.h"

/* Fills c's url and token: url_opt (--url) when not NULL, else
 * $BERTD_URL, else the config file's "url", else http://127.0.0.1:8420;
 * the CA file of an https URL from cacert_opt (--cacert), $BERTD_CACERT or
 * the config file's "cacert" (none: the system's CAs);
 * the token from $BERTD_TOKEN, else the file $BERTD_TOKEN_FILE, else the
 * config file's "token" or "token_file". The config file is config_opt
 * (--config), else $BERTCTL_CONFIG, else $XDG_CONFIG_HOME/bertctl/config
 * or ~/.config/bertctl/config (a missing default file is no error).
 * Returns CLI_OK or CLI_USAGE after printing why (unknown key, unreadable
 * token file, a config file holding a token that others can read). */
int clihttp_configure(cli *c, const char *url_opt, const char *config_opt, const char *cacert_opt);
/* The options every request of c gets on handle h (a void * so this header
 * needs no libcurl): the CA file of an https daemon. */
void clihttp_setup(const cli *c, void *h);

typedef struct clihttp_resp {
	long status;         /* HTTP status, 0 when no answer came */
	char *body;          /* NUL-terminated (len bytes), owned */
	size_t len;
	char disposition[256]; /* the Content-Disposition filename, "" when none */
	char curl_err[256];  /* libcurl's message when status is 0 */
} clihttp_resp;

/* One request to c->url + path with the token. body (JSON text) NULL for
 * none; extra_header ("Name: value") may be NULL. With sink the answer's
 * body of a 2xx goes to it instead of into r->body (an error's body is
 * always kept). Returns CLI_OK for a 2xx, else prints the problem (its
 * type, detail and field) and returns CLI_HTTP_4XX or CLI_HTTP_5XX (no
 * answer: connection refused, timeout). Caller frees r with
 * clihttp_resp_free. */
int clihttp_do(const cli *c, const char *method, const char *path, const char *body,
	       const char *extra_header, FILE *sink, clihttp_resp *r);
void clihttp_resp_free(clihttp_resp *r);

/* The exit code of an HTTP status (0 = no answer): CLI_OK for 2xx,
 * CLI_HTTP_4XX, CLI_HTTP_5XX. */
int clihttp_exit_of(long status);
/* Prints a failed answer as one line on stderr: "bertctl: METHOD PATH: 404
 * job-not-found: detail (field x)". */
void clihttp_report(const char *method, const char *path, const clihttp_resp *r);
/* Percent-encodes s for a URL's path segment or query value into out (n
 * bytes); returns out. */
char *clihttp_escape(const char *s, char *out, size_t n);

#endif
