/* cli — what bertctl's modules share: the exit codes (docs/cli.md
 * lists them; scripts depend on them, so a number never changes meaning),
 * the resolved connection (URL, token) and the output mode.
 * Must never hold the daemon's code: the client speaks only HTTP. */
#ifndef BERTD_CLIENT_CLI_H
#define BERTD_CLIENT_CLI_H

#include <stdbool.h>

enum cli_exit {
	CLI_OK = 0,
	CLI_ERROR = 1,      /* a local failure: a file cannot be read or written, bad JSON in a file */
	CLI_USAGE = 2,      /* bad command line or configuration */
	CLI_HTTP_4XX = 3,   /* the daemon refused the request (4xx: not found, conflict, invalid) */
	CLI_HTTP_5XX = 4,   /* the daemon failed (5xx) or could not be reached */
	CLI_JOB_FAILED = 5, /* follow / --wait: the job (or dataset) ended failed */
	CLI_JOB_CANCELED = 6, /* follow / --wait: the job ended canceled */
};

typedef struct cli {
	char url[512];      /* base URL without a trailing slash */
	char token[512];    /* bearer token, "" when none was configured */
	char token_from[600]; /* where the token came from, for error messages */
	char cacert[512];   /* CA certificates (PEM) an https daemon is verified with; "": the system's */
	bool json;          /* --json: the API's JSON as is */
	bool verbose;       /* -v: each request on stderr */
} cli;

#endif
