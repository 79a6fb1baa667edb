/* token — the API's bearer token, kept in a 0600 file in the state dir.
 * Created with 256 random bits (getrandom) on first start; reused after. */
#ifndef BERTD_DAEMON_TOKEN_H
#define BERTD_DAEMON_TOKEN_H

#define TOKEN_HEX_LEN 64

/* Reads the token from path, or creates the file (O_EXCL, mode 0600) with a
 * fresh random token if it does not exist. out receives the token text.
 * Refuses (-EPERM) a file that group or others can read or write, and
 * (-EINVAL) one whose content is not 32..256 printable characters.
 * *created is set to 1 when the file was made now. */
int token_load_or_create(const char *path, char out[257], int *created);

#endif
