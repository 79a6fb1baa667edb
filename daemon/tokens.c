/* tokens — see tokens.h. The in-memory set is rebuilt whole from the two
 * files, never patched, so what a check sees is always what the files say
 * (or nothing, when one cannot be read). */
#include "daemon/tokens.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "daemon/token.h"

#define TOKENS_FILE_MAX (1 << 20) /* bytes: about 6,000 tokens */

static const char *const role_names[TOKENS_ROLE_COUNT] = {"reader", "user", "admin"};

/* What a stat says of a file: a change of any of these re-reads it. */
typedef struct file_id {
	bool exists;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtim, ctim;
} file_id;

typedef struct entry {
	tokens_entry e;
	uint8_t digest[32]; /* SHA-256 of the secret */
} entry;

struct tokens {
	pthread_mutex_t mu; /* guards everything below */
	char *token_file, *tokens_file;
	file_id id_token, id_tokens; /* as of the last read */
	struct timespec read_at;     /* CLOCK_REALTIME of the last read */
	entry *v;                    /* (n): the token file's first */
	size_t n;
};

const char *tokens_role_name(enum tokens_role role)
{
	return (unsigned)role < TOKENS_ROLE_COUNT ? role_names[role] : "?";
}

int tokens_role_parse(const char *s, enum tokens_role *role)
{
	for (int i = 0; s && i < TOKENS_ROLE_COUNT; i++)
		if (strcmp(s, role_names[i]) == 0) {
			*role = (enum tokens_role)i;
			return 0;
		}
	return -EINVAL;
}

bool tokens_name_valid(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > TOKENS_NAME_MAX || !isalnum((unsigned char)name[0]))
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)name[i];
		if (!(isalnum(c) || c == '.' || c == '_' || c == '-') || c > 0x7e)
			return false;
	}
	return true;
}

static file_id id_of(const char *path)
{
	file_id id = {0};
	struct stat st;
	if (stat(path, &st) == 0) {
		id.exists = true;
		id.dev = st.st_dev;
		id.ino = st.st_ino;
		id.size = st.st_size;
		id.mtim = st.st_mtim;
		id.ctim = st.st_ctim;
	}
	return id;
}

static bool id_same(const file_id *a, const file_id *b)
{
	if (a->exists != b->exists)
		return false;
	return !a->exists ||
	       (a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
		a->mtim.tv_sec == b->mtim.tv_sec && a->mtim.tv_nsec == b->mtim.tv_nsec &&
		a->ctim.tv_sec == b->ctim.tv_sec && a->ctim.tv_nsec == b->ctim.tv_nsec);
}

static void digest_of(const char *secret, uint8_t out[32])
{
	sha256_ctx c;
	sha256_init(&c);
	sha256_update(&c, secret, strlen(secret));
	sha256_final(&c, out);
}

static int nibble(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
	     : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int hex_digest(const char *hex, uint8_t out[32])
{
	if (strlen(hex) != 64)
		return -EINVAL;
	for (int i = 0; i < 32; i++) {
		int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -EINVAL;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

/* The tokens file's whole text (caller frees), or NULL with rc -ENOENT
 * (absent), -EPERM (not a regular 0600-or-stricter file), -EFBIG, errno. */
static int slurp_private(const char *path, char **out)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	int rc = 0;
	char *buf = NULL;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (st.st_mode & 077)) {
		log_error("tokens file %s must be a regular file with mode 0600 (is %o)", path,
			  (unsigned)(st.st_mode & 07777));
		rc = -EPERM;
		goto out;
	}
	if (st.st_size > TOKENS_FILE_MAX) {
		log_error("tokens file %s is over %d bytes", path, TOKENS_FILE_MAX);
		rc = -EFBIG;
		goto out;
	}
	if (!(buf = malloc((size_t)st.st_size + 1))) {
		rc = -ENOMEM;
		goto out;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t k = read(fd, buf + got, (size_t)st.st_size - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	buf[got] = 0;
	*out = buf;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

static int push(entry **v, size_t *n, const entry *e)
{
	entry *nv = realloc(*v, (*n + 1) * sizeof *nv);
	if (!nv)
		return -ENOMEM;
	nv[(*n)++] = *e;
	*v = nv;
	return 0;
}

/* Appends the tokens file's entries to (*v, *n). A missing file is no
 * entry; a line that is not "<name> <role> <64 hex> <ms>" (or a name twice,
 * or the reserved name) is -EINVAL, logged with its line number. */
static int read_tokens_file(const char *path, entry **v, size_t *n)
{
	char *text = NULL;
	int rc = slurp_private(path, &text);
	if (rc == -ENOENT)
		return 0;
	if (rc < 0)
		return rc;
	size_t first = *n;
	int lineno = 0;
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		lineno++;
		if (line[0] == '#' || line[strspn(line, " \t\r")] == 0)
			continue;
		char name[TOKENS_NAME_MAX + 2], role[16], hex[70], extra[2];
		long long ms;
		entry e = {0};
		if (sscanf(line, "%65s %15s %69s %lld %1s", name, role, hex, &ms, extra) != 4 ||
		    !tokens_name_valid(name) || strcmp(name, TOKENS_DEFAULT_NAME) == 0 ||
		    tokens_role_parse(role, &e.e.role) < 0 || hex_digest(hex, e.digest) < 0 || ms < 0) {
			log_error("tokens file %s, line %d: not \"<name> <role> <sha256 hex> <created "
				  "ms>\" with a valid name and a role reader, user or admin",
				  path, lineno);
			rc = -EINVAL;
			goto out;
		}
		for (size_t i = first; i < *n; i++)
			if (strcmp((*v)[i].e.name, name) == 0) {
				log_error("tokens file %s, line %d: token %s is listed twice", path, lineno,
					  name);
				rc = -EINVAL;
				goto out;
			}
		snprintf(e.e.name, sizeof e.e.name, "%s", name);
		e.e.created_ms = ms;
		if ((rc = push(v, n, &e)) < 0)
			goto out;
	}
out:
	free(text);
	return rc;
}

/* The token file's token, if the file exists, as (*v)[*n]. */
static int read_token_file(const char *path, entry **v, size_t *n)
{
	char secret[257];
	int rc = token_read(path, secret);
	if (rc == -ENOENT)
		return 0;
	if (rc < 0)
		return rc;
	entry e = {.e = {.name = TOKENS_DEFAULT_NAME, .role = TOKENS_ROLE_ADMIN}};
	struct stat st;
	if (stat(path, &st) == 0)
		e.e.created_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
	digest_of(secret, e.digest);
	explicit_bzero(secret, sizeof secret);
	return push(v, n, &e);
}

/* Rebuilds t's set from the files (t->mu held). A file that fails holds no
 * token; the first failure is returned. */
static int reload_locked(tokens *t)
{
	entry *v = NULL;
	size_t n = 0;
	/* The ids are taken before the reads: a change in between is seen
	 * again by the next check, never missed. */
	t->id_token = id_of(t->token_file);
	t->id_tokens = id_of(t->tokens_file);
	clock_gettime(CLOCK_REALTIME, &t->read_at);
	int rc = read_token_file(t->token_file, &v, &n);
	if (rc < 0)
		log_error("token file %s: %s; its token is refused until it is fixed", t->token_file,
			  strerror(-rc));
	size_t before = n;
	int rc2 = read_tokens_file(t->tokens_file, &v, &n);
	if (rc2 < 0) {
		n = before; /* none of its lines count */
		log_error("tokens file %s: %s; its tokens are refused until it is fixed",
			  t->tokens_file, strerror(-rc2));
		if (rc == 0)
			rc = rc2;
	}
	free(t->v);
	t->v = v;
	t->n = n;
	return rc;
}

/* Whether a file stamped mtim may have changed again after a read at
 * read_at without its stamp moving: file times are coarse (a kernel tick),
 * so one written within a second of the read is read again (as git does
 * for racily clean index entries). */
static bool racy(const file_id *id, const struct timespec *read_at)
{
	return id->exists && id->mtim.tv_sec + 1 >= read_at->tv_sec;
}

static void refresh_locked(tokens *t)
{
	file_id a = id_of(t->token_file), b = id_of(t->tokens_file);
	if (!id_same(&a, &t->id_token) || !id_same(&b, &t->id_tokens)) {
		reload_locked(t);
		log_info("tokens: files changed; %zu token(s) now", t->n);
	} else if (racy(&a, &t->read_at) || racy(&b, &t->read_at)) {
		reload_locked(t); /* quietly: a second's worth of requests do this */
	}
}

int tokens_open(tokens **out, const char *token_file, const char *tokens_file, bool create_default,
		bool *created)
{
	int rc;
	if (created)
		*created = false;
	tokens *t = calloc(1, sizeof *t);
	if (!t)
		return -ENOMEM;
	pthread_mutex_init(&t->mu, NULL);
	t->token_file = strdup(token_file);
	t->tokens_file = strdup(tokens_file);
	if (!t->token_file || !t->tokens_file) {
		rc = -ENOMEM;
		goto out;
	}
	if (create_default && access(tokens_file, F_OK) < 0 && errno == ENOENT) {
		char secret[257];
		int made = 0;
		rc = token_load_or_create(token_file, secret, &made);
		explicit_bzero(secret, sizeof secret);
		if (rc < 0)
			goto out;
		if (created)
			*created = made != 0;
	}
	pthread_mutex_lock(&t->mu);
	rc = reload_locked(t);
	pthread_mutex_unlock(&t->mu);
	if (rc < 0)
		goto out;
	*out = t;
	return 0;
out:
	tokens_close(t);
	return rc;
}

void tokens_close(tokens *t)
{
	if (!t)
		return;
	pthread_mutex_destroy(&t->mu);
	free(t->token_file);
	free(t->tokens_file);
	free(t->v);
	free(t);
}

int tokens_reload(tokens *t)
{
	pthread_mutex_lock(&t->mu);
	int rc = reload_locked(t);
	size_t n = t->n;
	pthread_mutex_unlock(&t->mu);
	log_info("tokens: reloaded; %zu token(s)", n);
	return rc;
}

int tokens_check(tokens *t, const char *secret, tokens_entry *who)
{
	if (!secret || !secret[0])
		return -ENOENT;
	uint8_t d[32];
	digest_of(secret, d);
	int rc = -ENOENT;
	pthread_mutex_lock(&t->mu);
	refresh_locked(t);
	/* Every entry, every byte: the time tells nothing of which matched. */
	for (size_t i = 0; i < t->n; i++) {
		uint8_t diff = 0;
		for (int k = 0; k < 32; k++)
			diff |= (uint8_t)(d[k] ^ t->v[i].digest[k]);
		if (diff == 0) {
			*who = t->v[i].e;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&t->mu);
	return rc;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const tokens_entry *)a)->name, ((const tokens_entry *)b)->name);
}

int tokens_list(tokens *t, tokens_entry **out, size_t *n)
{
	pthread_mutex_lock(&t->mu);
	refresh_locked(t);
	size_t k = t->n;
	tokens_entry *v = malloc((k ? k : 1) * sizeof *v);
	for (size_t i = 0; v && i < k; i++)
		v[i] = t->v[i].e;
	pthread_mutex_unlock(&t->mu);
	if (!v)
		return -ENOMEM;
	size_t skip = k && strcmp(v[0].name, TOKENS_DEFAULT_NAME) == 0;
	qsort(v + skip, k - skip, sizeof *v, cmp_name);
	*out = v;
	*n = k;
	return 0;
}

/* ---- changes: under <tokens_file>.lock, written whole and atomically ---- */

/* Run as root (`sudo bertd token add`), a file made now would be root's
 * and unreadable to the daemon, which would then refuse every named
 * token: it goes to the owner of the directory it is in (the state dir's,
 * bertd's) instead. Best effort: the daemon logs a file it cannot read. */
static void give_to_dir_owner(const char *path)
{
	char dir[1100];
	struct stat st;
	if (geteuid() != 0 || snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
		return;
	char *slash = strrchr(dir, '/');
	if (!slash)
		return;
	*(slash == dir ? slash + 1 : slash) = 0;
	if (stat(dir, &st) == 0 && st.st_uid != 0 && chown(path, st.st_uid, st.st_gid) < 0)
		log_warn("cannot give %s to uid %ld: %s", path, (long)st.st_uid, strerror(errno));
}

static int lock_file(const tokens *t, int *fd)
{
	char path[1100];
	if (snprintf(path, sizeof path, "%s.lock", t->tokens_file) >= (int)sizeof path)
		return -ENAMETOOLONG;
	int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (f < 0)
		return -errno;
	give_to_dir_owner(path);
	while (flock(f, LOCK_EX) < 0) {
		if (errno != EINTR) {
			int rc = -errno;
			close(f);
			return rc;
		}
	}
	*fd = f;
	return 0;
}

static int write_tokens_file(const char *path, const entry *v, size_t n)
{
	size_t cap = 128 + n * (TOKENS_NAME_MAX + 100), len = 0;
	char *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	len += (size_t)snprintf(buf, cap,
				"# bertd API tokens: name role sha256(secret) created_ms "
				"(bertd token add|list|revoke)\n");
	for (size_t i = 0; i < n; i++) {
		char hex[65];
		sha256_to_hex(v[i].digest, hex);
		len += (size_t)snprintf(buf + len, cap - len, "%s %s %s %lld\n", v[i].e.name,
					tokens_role_name(v[i].e.role), hex,
					(long long)v[i].e.created_ms);
	}
	int rc = fs_write_atomic(path, buf, len, 0600);
	free(buf);
	if (rc == 0)
		give_to_dir_owner(path);
	return rc;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tokens_add(tokens *t, const char *name, enum tokens_role role, char secret[65],
	       tokens_entry *made)
{
	if (!tokens_name_valid(name) || (unsigned)role >= TOKENS_ROLE_COUNT)
		return -EINVAL;
	if (strcmp(name, TOKENS_DEFAULT_NAME) == 0)
		return -EEXIST;
	int lfd = -1, rc;
	entry *v = NULL;
	size_t n = 0;
	if ((rc = lock_file(t, &lfd)) < 0)
		goto out;
	if ((rc = read_tokens_file(t->tokens_file, &v, &n)) < 0)
		goto out; /* never overwrite a file we cannot read */
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].e.name, name) == 0) {
			rc = -EEXIST;
			goto out;
		}
	if ((rc = token_generate(secret)) < 0)
		goto out;
	entry e = {.e = {.role = role, .created_ms = now_ms()}};
	snprintf(e.e.name, sizeof e.e.name, "%s", name);
	digest_of(secret, e.digest);
	if ((rc = push(&v, &n, &e)) < 0 || (rc = write_tokens_file(t->tokens_file, v, n)) < 0)
		goto out;
	if (made)
		*made = e.e;
	log_info("tokens: added %s (role %s)", name, tokens_role_name(role));
out:
	if (rc < 0)
		explicit_bzero(secret, 65);
	free(v);
	if (lfd >= 0)
		close(lfd);
	pthread_mutex_lock(&t->mu);
	refresh_locked(t);
	pthread_mutex_unlock(&t->mu);
	return rc;
}

int tokens_revoke(tokens *t, const char *name)
{
	int lfd = -1, rc;
	entry *v = NULL;
	size_t n = 0;
	if (!name)
		return -EINVAL;
	if ((rc = lock_file(t, &lfd)) < 0)
		goto out;
	if ((rc = read_tokens_file(t->tokens_file, &v, &n)) < 0)
		goto out;
	if (strcmp(name, TOKENS_DEFAULT_NAME) == 0) {
		/* An empty tokens file first: with neither file, a start would
		 * make a new default token. */
		if (access(t->tokens_file, F_OK) < 0 && (rc = write_tokens_file(t->tokens_file, v, n)) < 0)
			goto out;
		if (unlink(t->token_file) < 0) {
			rc = errno == ENOENT ? -ENOENT : -errno;
			goto out;
		}
		rc = fs_fsync_parent(t->token_file);
	} else {
		size_t k = 0;
		for (size_t i = 0; i < n; i++)
			if (strcmp(v[i].e.name, name) != 0)
				v[k++] = v[i];
		if (k == n) {
			rc = -ENOENT;
			goto out;
		}
		rc = write_tokens_file(t->tokens_file, v, k);
	}
	if (rc == 0)
		log_info("tokens: revoked %s", name);
out:
	free(v);
	if (lfd >= 0)
		close(lfd);
	pthread_mutex_lock(&t->mu);
	refresh_locked(t);
	pthread_mutex_unlock(&t->mu);
	return rc;
}
