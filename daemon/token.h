/* token — one API secret: 256 random bits (getrandom) as 64 hex digits,
 * and the single-token file (0600, in the state dir) that holds the
 * "default" admin token in plain, created on first start and reused after.
 * The named tokens beside it are daemon/tokens.h's. Never logs a secret. */
#ifndef BERTD_DAEMON_TOKEN_H
#define BERTD_DAEMON_TOKEN_H

#define TOKEN_HEX_LEN 64

/* Reads the token from path, or creates the file (O_EXCL, mode 0600) with a
 * fresh random token if it does not exist. out receives the token text.
 * Refuses (-EPERM) a file that group or others can read or write, and
 * (-EINVAL) one whose content is not 32..256 printable characters.
 * *created is set to 1 when the file was made now. */
int token_load_or_create(const char *path, char out[257], int *created);

/* Reads an existing token file as token_load_or_create does, creating
 * nothing: -ENOENT when it does not exist, -EPERM, -EINVAL as above. */
int token_read(const char *path, char out[257]);

/* A fresh secret: 256 bits from getrandom as 64 lowercase hex digits and a
 * NUL. 0 or a negative errno. */
int token_generate(char out[TOKEN_HEX_LEN + 1]);

#endif
