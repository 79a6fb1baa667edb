/* token_cmd — `bertd token add|list|revoke`: manages the named API tokens
 * (daemon/tokens.h) of the state dir that the usual options (--config,
 * --state-dir, --tokens-file ...) name, whether a daemon runs there or
 * not: a running daemon sees the change on its next request. Must never
 * print a secret except the new one, once, on stdout. */
#ifndef BERTD_DAEMON_TOKEN_CMD_H
#define BERTD_DAEMON_TOKEN_CMD_H

/* argv: "bertd" "token" SUBCOMMAND [NAME] [--role ROLE] [config options].
 * Returns the process's exit code: 0 done; 1 usage, configuration, an
 * invalid name or role; 2 refused or failed (the token exists, no such
 * token, a file error), with a line on stderr saying why. */
int token_cmd_main(int argc, char **argv, char **envp);

#endif
