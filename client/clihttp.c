/* clihttp — see clihttp.h. The token is read from the environment or a
 * file and only ever sent in the Authorization header: it never appears in
 * an argument, a message or a verbose trace. */
#include "client/clihttp.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <curl/curl.h>

#define DEFAULT_URL "http://127.0.0.1:8420"

static void trim(char *s)
{
	size_t n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = 0;
	size_t i = 0;
	while (s[i] && isspace((unsigned char)s[i]))
		i++;
	memmove(s, s + i, n - i + 1);
}

/* The first line of path (a token file) into out. */
static int read_token_file(const char *path, char *out, size_t n)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "bertctl: cannot read the token file %s: %s\n", path, strerror(errno));
		return CLI_USAGE;
	}
	int rc = CLI_OK;
	if (!fgets(out, (int)n, f)) {
		fprintf(stderr, "bertctl: the token file %s is empty\n", path);
		rc = CLI_USAGE;
	}
	fclose(f);
	if (rc == CLI_OK) {
		trim(out);
		if (!out[0]) {
			fprintf(stderr, "bertctl: the token file %s is empty\n", path);
			rc = CLI_USAGE;
		}
	}
	return rc;
}

/* The config file's keys. */
typedef struct conf {
	char url[512], token[512], token_file[512], cacert[512];
} conf;

/* Reads "key = value" lines (# comments, blank lines) from path into k.
 * A missing file is fine unless required. */
static int read_conf(const char *path, bool required, conf *k)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		if (errno == ENOENT && !required)
			return CLI_OK;
		fprintf(stderr, "bertctl: cannot read the config file %s: %s\n", path, strerror(errno));
		return CLI_USAGE;
	}
	int rc = CLI_OK, lineno = 0;
	char line[1024];
	struct stat sb;
	bool private = fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077) == 0;
	while (rc == CLI_OK && fgets(line, sizeof line, f)) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		trim(line);
		if (!line[0])
			continue;
		char *eq = strchr(line, '=');
		if (!eq) {
			fprintf(stderr, "bertctl: %s:%d: not a \"key = value\" line\n", path, lineno);
			rc = CLI_USAGE;
			break;
		}
		*eq = 0;
		char *key = line, *val = eq + 1;
		trim(key);
		trim(val);
		char *dst = strcmp(key, "url") == 0 ? k->url
			  : strcmp(key, "token") == 0 ? k->token
			  : strcmp(key, "token_file") == 0 ? k->token_file
			  : strcmp(key, "cacert") == 0 ? k->cacert : NULL;
		if (!dst) {
			fprintf(stderr, "bertctl: %s:%d: unknown key \"%s\" (url, token, token_file, cacert)\n", path,
				lineno, key);
			rc = CLI_USAGE;
		} else if (strlen(val) >= sizeof k->url) {
			fprintf(stderr, "bertctl: %s:%d: value too long\n", path, lineno);
			rc = CLI_USAGE;
		} else if (dst == k->token && !private) {
			/* as ssh does with a readable key: refuse rather than use a leaked secret */
			fprintf(stderr, "bertctl: %s holds a token but others may read it: chmod 600 %s\n", path,
				path);
			rc = CLI_USAGE;
		} else {
			strcpy(dst, val);
		}
	}
	fclose(f);
	return rc;
}

int clihttp_configure(cli *c, const char *url_opt, const char *config_opt, const char *cacert_opt)
{
	conf k = {0};
	char path[1024];
	const char *cfg = config_opt ? config_opt : getenv("BERTCTL_CONFIG");
	bool required = cfg != NULL;
	if (!cfg) {
		const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
		if (xdg && *xdg)
			snprintf(path, sizeof path, "%s/bertctl/config", xdg);
		else
			snprintf(path, sizeof path, "%s/.config/bertctl/config", home ? home : "");
		cfg = path;
	}
	int rc = read_conf(cfg, required, &k);
	if (rc != CLI_OK)
		return rc;

	const char *url = url_opt ? url_opt : getenv("BERTD_URL");
	if (!url || !*url)
		url = k.url[0] ? k.url : DEFAULT_URL;
	if (strlen(url) >= sizeof c->url) {
		fprintf(stderr, "bertctl: the URL is too long\n");
		return CLI_USAGE;
	}
	snprintf(c->url, sizeof c->url, "%s", url);
	size_t n = strlen(c->url);
	while (n && c->url[n - 1] == '/')
		c->url[--n] = 0;

	const char *ca = cacert_opt ? cacert_opt : getenv("BERTD_CACERT");
	if (!ca || !*ca)
		ca = k.cacert;
	if (strlen(ca) >= sizeof c->cacert) {
		fprintf(stderr, "bertctl: the CA file name is too long\n");
		return CLI_USAGE;
	}
	snprintf(c->cacert, sizeof c->cacert, "%s", ca);
	if (c->cacert[0] && access(c->cacert, R_OK) != 0) {
		fprintf(stderr, "bertctl: cannot read the CA file %s: %s\n", c->cacert, strerror(errno));
		return CLI_USAGE;
	}

	const char *env_tok = getenv("BERTD_TOKEN"), *env_file = getenv("BERTD_TOKEN_FILE");
	c->token[0] = 0;
	if (env_tok && *env_tok) {
		snprintf(c->token, sizeof c->token, "%s", env_tok);
		trim(c->token);
		snprintf(c->token_from, sizeof c->token_from, "$BERTD_TOKEN");
	} else if (env_file && *env_file) {
		rc = read_token_file(env_file, c->token, sizeof c->token);
		snprintf(c->token_from, sizeof c->token_from, "$BERTD_TOKEN_FILE (%s)", env_file);
	} else if (k.token[0]) {
		snprintf(c->token, sizeof c->token, "%s", k.token);
		snprintf(c->token_from, sizeof c->token_from, "%s (token)", cfg);
	} else if (k.token_file[0]) {
		rc = read_token_file(k.token_file, c->token, sizeof c->token);
		snprintf(c->token_from, sizeof c->token_from, "%s (token_file %s)", cfg, k.token_file);
	} else {
		snprintf(c->token_from, sizeof c->token_from, "nowhere");
	}
	return rc;
}

/* ---------------------------------------------------------------- requests */

void clihttp_setup(const cli *c, void *h)
{
	if (c->cacert[0])
		curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
}

typedef struct sinkbuf {
	clihttp_resp *r;
	FILE *sink;          /* 2xx bodies go here when set */
	CURL *h;
	int write_err;
} sinkbuf;

static size_t on_body(char *p, size_t size, size_t nmemb, void *arg)
{
	sinkbuf *s = arg;
	size_t n = size * nmemb;
	long status = 0;
	curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
	if (s->sink && status >= 200 && status < 300) {
		if (fwrite(p, 1, n, s->sink) != n) {
			s->write_err = errno ? errno : EIO;
			return 0;
		}
		return n;
	}
	char *b = realloc(s->r->body, s->r->len + n + 1);
	if (!b)
		return 0;
	memcpy(b + s->r->len, p, n);
	s->r->body = b;
	s->r->len += n;
	b[s->r->len] = 0;
	return n;
}

/* filename="x" of a Content-Disposition header, kept when it is a plain
 * file name (no path, not hidden): the server names it, the client checks. */
static size_t on_header(char *p, size_t size, size_t nmemb, void *arg)
{
	sinkbuf *s = arg;
	size_t n = size * nmemb;
	const char *name = "content-disposition:";
	if (n > strlen(name) && strncasecmp(p, name, strlen(name)) == 0) {
		char line[512];
		snprintf(line, sizeof line, "%.*s", (int)n, p);
		char *fn = strstr(line, "filename=\"");
		if (fn) {
			fn += 10;
			char *end = strchr(fn, '"');
			if (end) {
				*end = 0;
				if (fn[0] && fn[0] != '.' && !strchr(fn, '/'))
					snprintf(s->r->disposition, sizeof s->r->disposition, "%s", fn);
			}
		}
	}
	return n;
}

int clihttp_exit_of(long status)
{
	if (status >= 200 && status < 300)
		return CLI_OK;
	if (status >= 400 && status < 500)
		return CLI_HTTP_4XX;
	return CLI_HTTP_5XX;
}

void clihttp_report(const char *method, const char *path, const clihttp_resp *r)
{
	if (r->status == 0) {
		fprintf(stderr, "bertctl: %s %s: no answer: %s\n", method, path, r->curl_err);
		return;
	}
	json_t *p = r->body ? json_loads(r->body, 0, NULL) : NULL;
	const char *type = json_string_value(json_object_get(p, "type"));
	const char *detail = json_string_value(json_object_get(p, "detail"));
	const char *field = json_string_value(json_object_get(p, "field"));
	if (type && strncmp(type, "urn:bertd:problem:", 18) == 0)
		type += 18;
	if (type)
		fprintf(stderr, "bertctl: %s %s: %ld %s: %s%s%s%s\n", method, path, r->status, type,
			detail ? detail : "", field ? " (field " : "", field ? field : "", field ? ")" : "");
	else
		fprintf(stderr, "bertctl: %s %s: HTTP %ld%s%.200s\n", method, path, r->status,
			r->len ? ": " : "", r->body ? r->body : "");
	json_decref(p);
}

int clihttp_do(const cli *c, const char *method, const char *path, const char *body,
	       const char *extra_header, FILE *sink, clihttp_resp *r)
{
	memset(r, 0, sizeof *r);
	int rc = CLI_HTTP_5XX;
	char url[2048], auth[600];
	struct curl_slist *hdrs = NULL;
	CURL *h = curl_easy_init();
	if (!h) {
		snprintf(r->curl_err, sizeof r->curl_err, "libcurl could not start");
		goto out;
	}
	snprintf(url, sizeof url, "%s%s", c->url, path);
	if (c->token[0]) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
		hdrs = curl_slist_append(hdrs, auth);
	}
	if (body)
		hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
	if (extra_header)
		hdrs = curl_slist_append(hdrs, extra_header);
	sinkbuf s = {.r = r, .sink = sink, .h = h};
	char err[CURL_ERROR_SIZE] = "";
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	if (body) {
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, &s);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
	clihttp_setup(c, h);
	if (c->verbose)
		fprintf(stderr, "bertctl: %s %s\n", method, url);
	CURLcode cr = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
	if (s.write_err) {
		fprintf(stderr, "bertctl: writing the download: %s\n", strerror(s.write_err));
		rc = CLI_ERROR;
		goto out;
	}
	if (cr != CURLE_OK) {
		snprintf(r->curl_err, sizeof r->curl_err, "%s (%s)", err[0] ? err : curl_easy_strerror(cr), url);
		r->status = 0;
	}
	rc = clihttp_exit_of(r->status);
	if (rc != CLI_OK)
		clihttp_report(method, path, r);
out:
	curl_slist_free_all(hdrs);
	if (h)
		curl_easy_cleanup(h);
	return rc;
}

void clihttp_resp_free(clihttp_resp *r)
{
	free(r->body);
	r->body = NULL;
	r->len = 0;
}

char *clihttp_escape(const char *s, char *out, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t j = 0;
	for (; *s && j + 4 < n; s++) {
		unsigned char ch = (unsigned char)*s;
		if (isalnum(ch) || strchr("-._~:", ch)) {
			out[j++] = (char)ch;
		} else {
			out[j++] = '%';
			out[j++] = hex[ch >> 4];
			out[j++] = hex[ch & 15];
		}
	}
	out[j] = 0;
	return out;
}
