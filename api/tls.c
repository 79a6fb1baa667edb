/* tls — see tls.h. */
#include "api/tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#define TLS_MAX_CHAIN 16

struct api_tls_creds {
	gnutls_pcert_st pcerts[TLS_MAX_CHAIN]; /* (n) the chain, server certificate first */
	unsigned n;
	gnutls_privkey_t key;
	api_tls_creds *older; /* installed before this one (kept until uninstall) */
};

static pthread_mutex_t installed_mu = PTHREAD_MUTEX_INITIALIZER;
static api_tls_creds *installed; /* newest first, through ->older */

void api_tls_creds_free(api_tls_creds *c)
{
	if (!c)
		return;
	for (unsigned i = 0; i < c->n; i++)
		gnutls_pcert_deinit(&c->pcerts[i]);
	if (c->key)
		gnutls_privkey_deinit(c->key);
	free(c);
}

/* Checks that key and cert belong together: a throwaway credentials set
 * refuses a pair that does not (GNUTLS_E_CERTIFICATE_KEY_MISMATCH). */
static int check_pair(const gnutls_datum_t *cert, const gnutls_datum_t *key, const char *cert_path,
		      const char *key_path, char *why, size_t cap)
{
	gnutls_certificate_credentials_t cred;
	if (gnutls_certificate_allocate_credentials(&cred) < 0)
		return -ENOMEM;
	int rc = 0, g = gnutls_certificate_set_x509_key_mem(cred, cert, key, GNUTLS_X509_FMT_PEM);
	if (g < 0) {
		snprintf(why, cap, "tls_cert %s / tls_key %s: %s", cert_path, key_path,
			 g == GNUTLS_E_CERTIFICATE_KEY_MISMATCH ? "the key does not belong to the certificate"
								: gnutls_strerror(g));
		rc = -EINVAL;
	}
	gnutls_certificate_free_credentials(cred);
	return rc;
}

int api_tls_creds_load(api_tls_creds **out, const char *cert_path, const char *key_path, char *why,
		       size_t cap)
{
	int rc = 0, g;
	gnutls_datum_t cert = {0}, key = {0};
	api_tls_creds *c = calloc(1, sizeof *c);
	*out = NULL;
	if (!c)
		return -ENOMEM;
	if ((g = gnutls_load_file(cert_path, &cert)) < 0) {
		snprintf(why, cap, "tls_cert %s: cannot read it (%s)", cert_path, gnutls_strerror(g));
		rc = -ENOENT;
		goto out;
	}
	if ((g = gnutls_load_file(key_path, &key)) < 0) {
		snprintf(why, cap, "tls_key %s: cannot read it (%s)", key_path, gnutls_strerror(g));
		rc = -ENOENT;
		goto out;
	}
	c->n = TLS_MAX_CHAIN;
	if ((g = gnutls_pcert_list_import_x509_raw(c->pcerts, &c->n, &cert, GNUTLS_X509_FMT_PEM, 0)) < 0) {
		c->n = 0;
		snprintf(why, cap, "tls_cert %s: not a PEM certificate chain of at most %d certificates (%s)",
			 cert_path, TLS_MAX_CHAIN, gnutls_strerror(g));
		rc = -EINVAL;
		goto out;
	}
	if (gnutls_privkey_init(&c->key) < 0) {
		rc = -ENOMEM;
		goto out;
	}
	if ((g = gnutls_privkey_import_x509_raw(c->key, &key, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
		snprintf(why, cap, "tls_key %s: not an unencrypted PEM private key (%s)", key_path,
			 gnutls_strerror(g));
		rc = -EINVAL;
		goto out;
	}
	if ((rc = check_pair(&cert, &key, cert_path, key_path, why, cap)) < 0)
		goto out;
	*out = c;
	c = NULL;
out:
	api_tls_creds_free(c);
	if (key.data) {
		memset(key.data, 0, key.size); /* no key material left in freed memory */
		gnutls_free(key.data);
	}
	gnutls_free(cert.data);
	return rc;
}

void api_tls_install(api_tls_creds *c)
{
	pthread_mutex_lock(&installed_mu);
	c->older = installed;
	installed = c;
	pthread_mutex_unlock(&installed_mu);
}

void api_tls_uninstall(void)
{
	pthread_mutex_lock(&installed_mu);
	api_tls_creds *c = installed;
	installed = NULL;
	pthread_mutex_unlock(&installed_mu);
	while (c) {
		api_tls_creds *older = c->older;
		api_tls_creds_free(c);
		c = older;
	}
}

int api_tls_retrieve(gnutls_session_t session, const gnutls_datum_t *req_ca_rdn, int nreqs,
		     const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
		     gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *pkey)
{
	(void)session;
	(void)req_ca_rdn;
	(void)nreqs;
	(void)pk_algos;
	(void)pk_algos_length;
	pthread_mutex_lock(&installed_mu);
	api_tls_creds *c = installed;
	pthread_mutex_unlock(&installed_mu);
	if (!c)
		return -1;
	*pcert = c->pcerts;
	*pcert_length = c->n;
	*pkey = c->key;
	return 0;
}
