/* tokens — the API's named tokens and their roles: who a bearer secret
 * belongs to, and the file that lists them.
 *
 * Two files hold the tokens. The token file (config token_file, 0600) is
 * the one plain secret of earlier versions: it is the admin token named
 * "default" for as long as it exists. The tokens file (config tokens_file,
 * 0600) has one line per named token:
 *     <name> <role> <sha256 of the secret, hex> <created, epoch ms>
 * (docs/formats.md); the secret itself is shown once, when the token is
 * added, and kept nowhere. A token is revoked by removing its line (or,
 * for "default", the token file). Changes are made under an exclusive lock
 * (<tokens_file>.lock) and written atomically (fs_write_atomic), so the
 * `bertd token` command and the daemon's API may change the file together.
 *
 * A tokens object is what the daemon checks requests against. Every check
 * first stats both files (inode, size, mtime, ctime) and re-reads them
 * when either changed, so a token revoked by any means is refused by the
 * next request. A file that cannot be read when re-read counts as holding
 * no token (refusing, never keeping an old secret alive). Secrets are
 * compared by their SHA-256, every entry in constant time. Must never log
 * or store a secret.
 */
#ifndef BERTD_DAEMON_TOKENS_H
#define BERTD_DAEMON_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOKENS_NAME_MAX 64           /* bytes of a name, without the NUL */
#define TOKENS_DEFAULT_NAME "default" /* the token file's token */

/* Ordered: a role may do what every lower role may. */
enum tokens_role {
	TOKENS_ROLE_READER = 0, /* reads everything */
	TOKENS_ROLE_USER,       /* and submits; cancels, changes, deletes its own jobs; adds datasets */
	TOKENS_ROLE_ADMIN,      /* everything: any job, datasets, tokens */
	TOKENS_ROLE_COUNT
};

typedef struct tokens_entry {
	char name[TOKENS_NAME_MAX + 1];
	enum tokens_role role;
	int64_t created_ms; /* the token file's: its mtime */
} tokens_entry;

typedef struct tokens tokens;

/* "reader", "user", "admin" (static), or "?" out of range. */
const char *tokens_role_name(enum tokens_role role);
/* Parses a role name. 0, or -EINVAL for anything else. */
int tokens_role_parse(const char *s, enum tokens_role *role);
/* A token name: 1..TOKENS_NAME_MAX of [A-Za-z0-9._-], starting with a
 * letter or digit. */
bool tokens_name_valid(const char *name);

/* Opens the token set of token_file and tokens_file (both absolute paths,
 * copied). With create_default, when neither file exists the token file is
 * made with a fresh secret (token_load_or_create; *created set to true), as
 * on a first start. Reads both: a file that exists but is unsafe (mode
 * readable by others) or malformed fails the open (-EPERM, -EINVAL, with a
 * logged line naming the file and line); a missing one holds no token.
 * *out caller-owned (tokens_close). */
int tokens_open(tokens **out, const char *token_file, const char *tokens_file, bool create_default,
		bool *created);
void tokens_close(tokens *t);

/* Re-reads both files now (SIGHUP; a check does the same when they
 * changed). 0, or the first file's error, in which case that file counts
 * as holding no token until it is fixed. Thread-safe. */
int tokens_reload(tokens *t);

/* Whose is secret: 0 with *who (the entry's name and role) filled, or
 * -ENOENT when no current token has it (unknown or revoked). Re-reads the
 * files first when they changed. Thread-safe. */
int tokens_check(tokens *t, const char *secret, tokens_entry *who);

/* Adds a named token with a fresh secret: 0 with secret (64 hex digits)
 * and *made filled; -EINVAL invalid name, -EEXIST a token of that name
 * exists (TOKENS_DEFAULT_NAME always does: it is reserved), or a file
 * error. The tokens file is created (0600) when absent. */
int tokens_add(tokens *t, const char *name, enum tokens_role role, char secret[65],
	       tokens_entry *made);

/* Revokes the token name: its line leaves the tokens file; for
 * TOKENS_DEFAULT_NAME the token file is removed, and an empty tokens file
 * is made if there is none, so that no later start creates it anew.
 * 0, -ENOENT no such token, or a file error. */
int tokens_revoke(tokens *t, const char *name);

/* The current tokens, the token file's first, then by name: *out
 * (caller frees) holds *n entries. Re-reads the files first when they
 * changed. 0 or -ENOMEM. */
int tokens_list(tokens *t, tokens_entry **out, size_t *n);

#endif
