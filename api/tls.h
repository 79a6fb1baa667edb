/* tls — the HTTPS listener's certificate and private key (GnuTLS), and
 * their replacement while the server runs.
 *
 * libmicrohttpd reads MHD_OPTION_HTTPS_MEM_CERT/KEY once, at start, and has
 * no call to change them on a running daemon. The server is started with
 * MHD_OPTION_HTTPS_CERT_CALLBACK instead: GnuTLS asks api_tls_retrieve for
 * the certificate at every handshake, and the answer is whatever credentials
 * were last installed with api_tls_install. A reload therefore swaps the
 * certificate for new connections without closing the listener or any
 * connection; connections already open keep the session they negotiated.
 *
 * The callback has no user pointer, so the installed credentials are this
 * process's (one HTTPS server per process). Credentials replaced by a newer
 * install are kept until api_tls_uninstall, not freed: a handshake that
 * fetched them may still be using them, and each is a few kilobytes.
 * Must never log key material.
 */
#ifndef BERTD_API_TLS_H
#define BERTD_API_TLS_H

#include <stddef.h>
#include <gnutls/abstract.h>

typedef struct api_tls_creds api_tls_creds;

/* Reads a PEM certificate chain (server certificate first) and its PEM
 * private key, and checks that they belong together. *out caller-owned
 * (api_tls_creds_free, or handed to api_tls_install). Returns 0, or a
 * negative errno with why naming the file and the problem (unreadable,
 * not PEM, key does not match the certificate). */
int api_tls_creds_load(api_tls_creds **out, const char *cert_path, const char *key_path, char *why,
		       size_t cap);
void api_tls_creds_free(api_tls_creds *c);

/* Makes c the credentials every new handshake gets; takes ownership of c.
 * Any thread. */
void api_tls_install(api_tls_creds *c);
/* Frees every credential installed so far. Only after the HTTPS server has
 * stopped (no handshake can run). */
void api_tls_uninstall(void);

/* The MHD_OPTION_HTTPS_CERT_CALLBACK: hands GnuTLS the installed
 * credentials; fails the handshake when none are. */
int api_tls_retrieve(gnutls_session_t session, const gnutls_datum_t *req_ca_rdn, int nreqs,
		     const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
		     gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *pkey);

#endif
