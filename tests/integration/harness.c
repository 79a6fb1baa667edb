/* harness — see harness.h. Test-only code: it may exit on setup failure
 * but never sleeps to wait for the daemon. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

int bertd_init(bertd *d)
{
	memset(d, 0, sizeof *d);
	const char *tmp = getenv("TMPDIR");
	snprintf(d->root, sizeof d->root, "%s/bertd-it-XXXXXX", tmp && strlen(tmp) < 30 ? tmp : "/tmp");
	if (!mkdtemp(d->root))
		return -errno;
	snprintf(d->state_dir, sizeof d->state_dir, "%s/state", d->root);
	if (mkdir(d->state_dir, 0700) < 0)
		return -errno;
	return 0;
}

static int read_line_file(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	int rc = fgets(buf, (int)n, f) ? 0 : -EIO;
	fclose(f);
	buf[strcspn(buf, "\r\n")] = 0;
	return rc;
}

void bertd_print_log(const bertd *d)
{
	char path[160], line[1024];
	snprintf(path, sizeof path, "%s/bertd.log", d->root);
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	fprintf(stderr, "----- bertd log (%s) -----\n", path);
	while (fgets(line, sizeof line, f))
		fputs(line, stderr);
	fprintf(stderr, "----- end of bertd log -----\n");
	fclose(f);
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The child gets our environment minus BERTD_* (config keys the test did
 * not mean to set, e.g. BERTD_BIN) and minus any outer NOTIFY_SOCKET. The
 * GPU speed levers (BERTD_LEVER_*, no config keys) stay: the daemon hands
 * them to its workers (daemon/childenv.c), so a test entry's env sets them
 * for its jobs (tests/cudasim/test_daemon_graph.c). */
static char **child_env(char *notify_assignment)
{
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + 2, sizeof *env);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		bool lever = strncmp(environ[i], "BERTD_LEVER_", 12) == 0;
		if ((strncmp(environ[i], "BERTD_", 6) == 0 && !lever) ||
		    strncmp(environ[i], "NOTIFY_SOCKET=", 14) == 0)
			continue;
		env[k++] = environ[i];
	}
	env[k++] = notify_assignment;
	env[k] = NULL;
	return env;
}

int bertd_start(bertd *d, const char *const *extra)
{
	const char *bin = getenv("BERTD_BIN");
	if (!bin) {
		fprintf(stderr, "harness: BERTD_BIN is not set\n");
		return -EINVAL;
	}
	char notify[128], logp[128], path[160];
	snprintf(notify, sizeof notify, "%s/notify", d->root);
	snprintf(logp, sizeof logp, "%s/bertd.log", d->root);
	unlink(notify);
	int rc = 0, pidfd = -1;
	int sfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (sfd < 0)
		return -errno;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(notify) >= sizeof sa.sun_path) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	memcpy(sa.sun_path, notify, strlen(notify) + 1);
	if (bind(sfd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		rc = -errno;
		goto out;
	}

	const char *argv[64];
	size_t a = 0;
	argv[a++] = bin;
	argv[a++] = "--state-dir";
	argv[a++] = d->state_dir;
	argv[a++] = "--port";
	argv[a++] = "0";
	argv[a++] = "--listen";
	argv[a++] = "127.0.0.1";
	argv[a++] = "--config";
	argv[a++] = "/dev/null";
	argv[a++] = "--log-level";
	argv[a++] = "debug";
	/* API tests drive job states by hand: hold the queue so the scheduler
	 * does not start (or fail) the jobs they submit. */
	argv[a++] = "--schedule";
	argv[a++] = "false";
	for (size_t i = 0; extra && extra[i] && a < 63; i++)
		argv[a++] = extra[i];
	argv[a] = NULL;
	char notify_env[160];
	snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", notify);
	char **env = child_env(notify_env);

	/* The previous run's address must not be mistaken for this one's. */
	snprintf(path, sizeof path, "%s/bertd.addr", d->state_dir);
	unlink(path);

	pid_t pid = fork();
	if (pid < 0) {
		rc = -errno;
		free(env);
		goto out;
	}
	if (pid == 0) {
		/* a test that dies (or whose setup fails after this) takes its
		 * daemon with it instead of leaving it running on its port */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		int lfd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (lfd >= 0) {
			dup2(lfd, 1);
			dup2(lfd, 2);
		}
		execve(bin, (char *const *)argv, env);
		fprintf(stderr, "harness: exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	d->pid = pid;
	free(env);

	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0) {
		rc = -errno;
		goto out;
	}
	int64_t deadline = mono_ms() + HARNESS_READY_TIMEOUT_MS;
	bool ready = false;
	while (!ready) {
		int64_t left = deadline - mono_ms();
		if (left <= 0) {
			fprintf(stderr, "harness: no READY=1 within %d ms\n", HARNESS_READY_TIMEOUT_MS);
			bertd_print_log(d);
			rc = -ETIMEDOUT;
			goto out;
		}
		struct pollfd p[2] = {{sfd, POLLIN, 0}, {pidfd, POLLIN, 0}};
		if (poll(p, 2, (int)left) < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			goto out;
		}
		if (p[0].revents & POLLIN) {
			char msg[4096];
			ssize_t n = recv(sfd, msg, sizeof msg - 1, 0);
			if (n > 0) {
				msg[n] = 0;
				/* A datagram holds newline-separated assignments. */
				for (char *l = strtok(msg, "\n"); l; l = strtok(NULL, "\n"))
					if (strcmp(l, "READY=1") == 0)
						ready = true;
			}
		} else if (p[1].revents & POLLIN) {
			int st;
			waitpid(pid, &st, 0);
			d->pid = 0;
			fprintf(stderr, "harness: bertd exited before READY=1 (status 0x%x)\n", st);
			bertd_print_log(d);
			rc = -ECHILD;
			goto out;
		}
	}
	snprintf(path, sizeof path, "%s/bertd.addr", d->state_dir);
	if ((rc = read_line_file(path, d->base_url, sizeof d->base_url)) != 0) {
		fprintf(stderr, "harness: READY=1 but no %s\n", path);
		goto out;
	}
	snprintf(path, sizeof path, "%s/token", d->state_dir);
	if ((rc = read_line_file(path, d->token, sizeof d->token)) != 0) {
		fprintf(stderr, "harness: READY=1 but no %s\n", path);
		goto out;
	}
out:
	if (pidfd >= 0)
		close(pidfd);
	close(sfd);
	unlink(notify);
	return rc;
}

int bertd_stop(bertd *d)
{
	if (!d->pid)
		return -1;
	int st = 0;
	kill(d->pid, SIGTERM);
	waitpid(d->pid, &st, 0);
	d->pid = 0;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return -1;
}

void bertd_kill9(bertd *d)
{
	if (!d->pid)
		return;
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	d->pid = 0;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(p);
}

void bertd_destroy(bertd *d)
{
	bertd_kill9(d);
	if (d->root[0])
		nftw(d->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	d->root[0] = 0;
}

/* ------------------------------------------------------------ HTTP */

struct buf {
	char *p;
	size_t n;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *cls)
{
	struct buf *b = cls;
	size_t n = size * nmemb;
	char *q = realloc(b->p, b->n + n + 1);
	if (!q)
		return 0;
	memcpy(q + b->n, ptr, n);
	b->p = q;
	b->n += n;
	b->p[b->n] = 0;
	return n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *cls)
{
	struct buf *b = cls;
	size_t n = size * nmemb;
	/* Keep only the last response's block (100 Continue comes first). */
	if (n >= 5 && strncmp(ptr, "HTTP/", 5) == 0)
		b->n = 0;
	return on_data(ptr, size, nmemb, cls);
}

struct upload {
	const char *p;
	size_t n, off, piece;
};

static size_t on_read(char *dst, size_t size, size_t nmemb, void *cls)
{
	struct upload *u = cls;
	size_t room = size * nmemb, left = u->n - u->off;
	size_t k = left < room ? left : room;
	if (k > u->piece)
		k = u->piece;
	memcpy(dst, u->p + u->off, k);
	u->off += k;
	return k;
}

static int perform(CURL *c, struct curl_slist *hl, http_resp *out)
{
	struct buf body = {0}, hdr = {0};
	memset(out, 0, sizeof *out);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &hdr);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	/* A bound so a hung daemon fails the test instead of hanging it. */
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
	out->curl_rc = (int)curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
	out->body = body.p ? body.p : strdup("");
	out->len = body.n;
	out->headers = hdr.p ? hdr.p : strdup("");
	out->json = out->len ? json_loadb(out->body, out->len, 0, NULL) : NULL;
	curl_slist_free_all(hl);
	curl_easy_cleanup(c);
	if (out->curl_rc)
		fprintf(stderr, "http: %s\n", curl_easy_strerror((CURLcode)out->curl_rc));
	return out->curl_rc;
}

static struct curl_slist *auth_header(const bertd *d, struct curl_slist *hl)
{
	char h[300];
	snprintf(h, sizeof h, "Authorization: Bearer %s", d->token);
	return curl_slist_append(hl, h);
}

int http_do(const bertd *d, const char *method, const char *path, const char *body,
	    size_t body_len, const char *const *headers, int auth, http_resp *out)
{
	CURL *c = curl_easy_init();
	char url[512];
	struct curl_slist *hl = NULL;
	bool has_ct = false;
	snprintf(url, sizeof url, "%s%s", d->base_url, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else if (strcmp(method, "GET") != 0)
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
	}
	for (size_t i = 0; headers && headers[i]; i++) {
		if (strncasecmp(headers[i], "Content-Type:", 13) == 0)
			has_ct = true;
		hl = curl_slist_append(hl, headers[i]);
	}
	if (body && !has_ct)
		hl = curl_slist_append(hl, "Content-Type: application/json");
	if (auth)
		hl = auth_header(d, hl);
	return perform(c, hl, out);
}

int http_post_chunked(const bertd *d, const char *path, const char *body, size_t body_len,
		      size_t piece, http_resp *out)
{
	CURL *c = curl_easy_init();
	char url[512];
	struct upload u = {body, body_len, 0, piece};
	snprintf(url, sizeof url, "%s%s", d->base_url, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_POST, 1L);
	curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
	curl_easy_setopt(c, CURLOPT_READDATA, &u);
	struct curl_slist *hl = curl_slist_append(NULL, "Transfer-Encoding: chunked");
	hl = curl_slist_append(hl, "Content-Type: application/json");
	hl = auth_header(d, hl);
	return perform(c, hl, out);
}

int http_get(const bertd *d, const char *path, http_resp *out)
{
	return http_do(d, "GET", path, NULL, 0, NULL, H_AUTH, out);
}

int http_post_json(const bertd *d, const char *path, const char *json, http_resp *out)
{
	return http_do(d, "POST", path, json, strlen(json), NULL, H_AUTH, out);
}

const char *http_header(const http_resp *r, const char *name, char *buf, size_t n)
{
	size_t nl = strlen(name);
	for (const char *l = r->headers; l && *l;) {
		const char *e = strchr(l, '\n');
		size_t ll = e ? (size_t)(e - l) : strlen(l);
		if (ll > nl && strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
			const char *v = l + nl + 1;
			while (*v == ' ' || *v == '\t')
				v++;
			size_t vl = (size_t)(l + ll - v);
			while (vl && (v[vl - 1] == '\r' || v[vl - 1] == ' '))
				vl--;
			if (vl >= n)
				vl = n - 1;
			memcpy(buf, v, vl);
			buf[vl] = 0;
			return buf;
		}
		l = e ? e + 1 : l + ll;
	}
	return NULL;
}

void http_resp_free(http_resp *r)
{
	free(r->body);
	free(r->headers);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}
