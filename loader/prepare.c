/* prepare — corpus files to a dataset of token shards (see prepare.h).
 *
 * Pipeline: inputs are expanded to a sorted file list and cut into chunks
 * at line ends (~1 MiB; a longer line is one chunk). N worker threads take
 * chunks in order and turn each into a result (token ids + a stream of
 * sentence / document-break events, or word counts when training a vocab);
 * the calling thread consumes results strictly in chunk order, so output is
 * byte-identical for any thread count. At most `window` chunks are in
 * flight, which bounds memory. Only the calling thread writes files or
 * progress.
 *
 * Resume: a shard closes at a document end, i.e. at (chunk c, event k) of
 * the event stream; resume.json records that point with the shards done,
 * and a resumed run tokenizes from chunk c again, dropping its first k
 * events (the unk count is kept per whole chunk, so it is recorded as of
 * chunk c's start).
 */
#include "loader/prepare.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sys/file.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "loader/instream.h"
#include "loader/shard.h"
#include "loader/vocab_train.h"
#include "loader/wordpiece.h"

#define CHUNK_BYTES (1u << 20)
#define DEFAULT_SHARD_TOKENS (64ull << 20)
#define EV_DOC (-1) /* event: document break; a positive event is a sentence length */
#define RESUME_NAME "resume.json"
#define RESUME_FORMAT "bertd-prepare-resume"
#define RESUME_VERSION 1

typedef struct strvec {
	char **v;
	size_t n, cap;
} strvec;

static int strvec_push(strvec *s, const char *x)
{
	if (s->n == s->cap) {
		size_t c = s->cap ? s->cap * 2 : 64;
		char **v = realloc(s->v, c * sizeof *v);
		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = c;
	}
	if (!(s->v[s->n] = strdup(x)))
		return -ENOMEM;
	s->n++;
	return 0;
}

static void strvec_free(strvec *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	memset(s, 0, sizeof *s);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct dirid {
	dev_t dev;
	ino_t ino;
} dirid;

typedef struct run {
	const prepare_opts *o;
	enum prepare_error *err;
	char *msg;
	size_t msg_len;
	strvec files;       /* display paths: canonical under a root, else as found */
	int *froot;         /* (files.n,) index into rootfd, or -1: opened by path */
	size_t *frel;       /* (files.n,) offset of the path below its root */
	uint64_t *fsize;    /* (files.n,) bytes, as the walk saw them */
	size_t fcap;
	int *rootfd;        /* (o->n_roots,) O_PATH directories */
	char **root_real;   /* (o->n_roots,) their canonical paths */
	dirid *stack;       /* directories on the walk's path, for loop detection */
	uint32_t max_depth;
	uint64_t max_files, bytes;
	size_t links_skipped;
	size_t src_len;     /* the directory input being walked: its path's length */
} run;

static int fail(run *r, enum prepare_error e, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(run *r, enum prepare_error e, int rc, const char *fmt, ...)
{
	if (*r->err == PREPARE_ERR_NONE) {
		*r->err = e;
		char buf[1024];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(buf, sizeof buf, fmt, ap);
		va_end(ap);
		if (r->msg && r->msg_len)
			snprintf(r->msg, r->msg_len, "%s", buf);
		log_error("%s", buf);
	}
	return rc;
}

/* ---- inputs ---- */

static int open_roots(run *r)
{
	const prepare_opts *o = r->o;
	if (o->n_roots == 0)
		return 0;
	r->rootfd = calloc(o->n_roots, sizeof *r->rootfd);
	r->root_real = calloc(o->n_roots, sizeof *r->root_real);
	if (!r->rootfd || !r->root_real)
		return fail(r, PREPARE_ERR_INTERNAL, -ENOMEM, "out of memory");
	for (size_t i = 0; i < o->n_roots; i++)
		r->rootfd[i] = -1;
	for (size_t i = 0; i < o->n_roots; i++) {
		if (!(r->root_real[i] = realpath(o->roots[i], NULL)))
			return fail(r, PREPARE_ERR_USAGE, -errno, "root %s: %s", o->roots[i], strerror(errno));
		if ((r->rootfd[i] = open(r->root_real[i], O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
			return fail(r, PREPARE_ERR_USAGE, -errno, "root %s: %s", o->roots[i], strerror(errno));
	}
	return 0;
}

static void close_roots(run *r)
{
	for (size_t i = 0; r->rootfd && i < r->o->n_roots; i++)
		if (r->rootfd[i] >= 0)
			close(r->rootfd[i]);
	for (size_t i = 0; r->root_real && i < r->o->n_roots; i++)
		free(r->root_real[i]);
	free(r->rootfd);
	free(r->root_real);
}

/* The root holding canonical path canon (-1: none), and where below it
 * canon's relative part starts. */
static int root_of(const run *r, const char *canon, size_t *rel)
{
	for (size_t i = 0; i < r->o->n_roots; i++) {
		const char *root = r->root_real[i];
		size_t n = strlen(root);
		if (n == 1 && root[0] == '/') {
			*rel = 1;
			return (int)i;
		}
		if (strncmp(canon, root, n) == 0 && (canon[n] == 0 || canon[n] == '/')) {
			*rel = canon[n] ? n + 1 : n;
			return (int)i;
		}
	}
	return -1;
}

/* Opens path: beneath its root when confined (ri >= 0: path + rel is the
 * part below root ri), else as it is. fd or negative errno. */
static int open_at_root(const run *r, int ri, const char *path, size_t rel, int flags)
{
	if (ri < 0) {
		int fd = open(path, flags | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	return fs_open_beneath(r->rootfd[ri], path + rel, flags, 0);
}

static int open_input(const run *r, size_t f, int flags)
{
	return open_at_root(r, r->froot[f], r->files.v[f], r->frel[f], flags);
}

static int add_file(run *r, const char *path, int ri, size_t rel, uint64_t size)
{
	if (r->files.n >= r->max_files)
		return fail(r, PREPARE_ERR_INPUT, -EFBIG,
			    "%s: more than %llu input files (the max_files limit)", path,
			    (unsigned long long)r->max_files);
	r->bytes += size;
	if (r->o->max_bytes && r->bytes > r->o->max_bytes)
		return fail(r, PREPARE_ERR_INPUT, -EFBIG,
			    "%s: the inputs pass %llu bytes (the max_bytes limit)", path,
			    (unsigned long long)r->o->max_bytes);
	if (r->files.n == r->fcap) {
		size_t c = r->fcap ? 2 * r->fcap : 64;
		int *a = realloc(r->froot, c * sizeof *a);
		if (a)
			r->froot = a;
		size_t *b = realloc(r->frel, c * sizeof *b);
		if (b)
			r->frel = b;
		uint64_t *d = realloc(r->fsize, c * sizeof *d);
		if (d)
			r->fsize = d;
		if (!a || !b || !d)
			return fail(r, PREPARE_ERR_INTERNAL, -ENOMEM, "out of memory");
		r->fcap = c;
	}
	r->froot[r->files.n] = ri;
	r->frel[r->files.n] = rel;
	r->fsize[r->files.n] = size;
	return strvec_push(&r->files, path);
}

/* Why an entry is left out, naming it and never what it points at. */
static void skip_link(run *r, const char *path, int rc)
{
	r->links_skipped++;
	if (rc == -EXDEV)
		log_warn("skipping %s: a symbolic link leading outside the data root", path);
	else if (rc == -ELOOP)
		log_warn("skipping %s: a symbolic link loop (or more than 40 links)", path);
	else
		log_warn("skipping %s: %s", path, strerror(-rc));
}

/* Whether the include / exclude patterns let in the file (or archive
 * member) at path rel (below its input directory, or inside the archive). */
static bool selected(const run *r, const char *rel)
{
	const prepare_opts *o = r->o;
	while (rel[0] == '/')
		rel++;
	const char *base = strrchr(rel, '/');
	base = base ? base + 1 : rel;
	bool in = o->n_include == 0;
	for (size_t i = 0; i < o->n_include && !in; i++)
		in = strchr(o->include[i], '/') ? fnmatch(o->include[i], rel, FNM_PATHNAME) == 0
						: fnmatch(o->include[i], base, 0) == 0;
	for (size_t i = 0; i < o->n_exclude && in; i++)
		in = !(strchr(o->exclude[i], '/') ? fnmatch(o->exclude[i], rel, FNM_PATHNAME) == 0
						  : fnmatch(o->exclude[i], base, 0) == 0);
	if (!in)
		log_debug("not read: %s (include / exclude)", rel);
	return in;
}

/* Walks the open directory dfd (caller keeps it), whose display path is
 * dir: regular files below it in name order. ri/rel as open_at_root. */
static int walk_dir(run *r, int ri, int dfd, const char *dir, size_t rel, uint32_t depth)
{
	struct stat st;
	if (fstat(dfd, &st) < 0)
		return fail(r, PREPARE_ERR_INPUT, -errno, "%s: %s", dir, strerror(errno));
	for (uint32_t i = 0; i < depth; i++)
		if (r->stack[i].dev == st.st_dev && r->stack[i].ino == st.st_ino) {
			/* reached again through a link: its files are already listed */
			r->links_skipped++;
			log_warn("skipping %s: a symbolic link loop (a directory inside itself)", dir);
			return 0;
		}
	if (depth > r->max_depth)
		return fail(r, PREPARE_ERR_INPUT, -ELOOP,
			    "%s: directories nested deeper than %u levels (the max_depth limit)", dir,
			    r->max_depth);
	r->stack[depth] = (dirid){st.st_dev, st.st_ino};
	int dup_fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	if (!d) {
		int e = errno;
		if (dup_fd >= 0)
			close(dup_fd);
		return fail(r, PREPARE_ERR_INPUT, -e, "%s: %s", dir, strerror(e));
	}
	strvec names = {0};
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if ((rc = strvec_push(&names, e->d_name)) < 0)
			break;
	}
	closedir(d);
	if (names.n)
		qsort(names.v, names.n, sizeof *names.v, cmp_str);
	for (size_t i = 0; i < names.n && rc == 0; i++) {
		char *p;
		if (asprintf(&p, "%s/%s", dir, names.v[i]) < 0) {
			rc = -ENOMEM;
			break;
		}
		/* p + crel: the entry's path below its root */
		size_t crel = rel < strlen(dir) ? rel : strlen(dir) + 1;
		if (fstatat(dfd, names.v[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			free(p);
			continue; /* gone meanwhile */
		}
		int cfd = -1;
		if (S_ISLNK(st.st_mode)) {
			/* followed only while it stays beneath the root */
			cfd = ri >= 0 ? fs_open_beneath(r->rootfd[ri], p + crel, O_PATH, 0)
				      : openat(dfd, names.v[i], O_PATH | O_CLOEXEC);
			if (cfd < 0)
				cfd = ri >= 0 ? cfd : -errno;
			if (cfd == -ENOENT) {
				log_debug("skipping %s: a dangling symbolic link", p);
			} else if (cfd < 0) {
				skip_link(r, p, cfd);
			} else if (fstat(cfd, &st) < 0) {
				close(cfd);
				cfd = -1;
			}
			if (cfd < 0) {
				free(p);
				continue;
			}
		}
		if (S_ISDIR(st.st_mode)) {
			int sub = cfd >= 0 ? openat(cfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
					   : openat(dfd, names.v[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0)
				rc = fail(r, PREPARE_ERR_INPUT, -errno, "%s: %s", p, strerror(errno));
			else
				rc = walk_dir(r, ri, sub, p, crel, depth + 1);
			if (sub >= 0)
				close(sub);
		} else if (S_ISREG(st.st_mode) && selected(r, p + r->src_len)) {
			rc = add_file(r, p, ri, crel, (uint64_t)st.st_size);
		}
		if (cfd >= 0)
			close(cfd);
		free(p);
	}
	strvec_free(&names);
	return rc;
}

/* One input path (a file or a directory; not a pattern): named as it is,
 * or found by a glob (then the include / exclude patterns choose). */
static int add_input(run *r, const char *in, bool named)
{
	char *canon = NULL;
	const char *path = in;
	int ri = -1, rc = 0;
	size_t rel = 0;
	if (r->o->n_roots) {
		/* the input itself is resolved (the daemon passes canonical paths);
		 * below it, links are confined to the root that holds it */
		if (!(canon = realpath(in, NULL)))
			return fail(r, PREPARE_ERR_INPUT, -errno, "%s: %s", in, strerror(errno));
		if ((ri = root_of(r, canon, &rel)) < 0) {
			rc = fail(r, PREPARE_ERR_INPUT, -EACCES, "%s is outside the data roots", in);
			goto out;
		}
		path = canon;
	}
	int fd = open_at_root(r, ri, path, rel, O_PATH);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		int e = fd < 0 ? fd : -errno;
		rc = fail(r, PREPARE_ERR_INPUT, e, "%s: %s", in,
			  e == -EXDEV ? "leads outside the data root" : strerror(-e));
	} else if (S_ISDIR(st.st_mode)) {
		int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0) {
			rc = fail(r, PREPARE_ERR_INPUT, -errno, "%s: %s", in, strerror(errno));
		} else {
			r->src_len = strlen(path);
			rc = walk_dir(r, ri, dfd, path, rel, 0);
			close(dfd);
		}
	} else if (S_ISREG(st.st_mode)) {
		const char *base = strrchr(path, '/');
		if (named || selected(r, base ? base + 1 : path))
			rc = add_file(r, path, ri, rel, (uint64_t)st.st_size);
	} else {
		rc = fail(r, PREPARE_ERR_INPUT, -EINVAL, "%s: not a file or directory", in);
	}
	if (fd >= 0)
		close(fd);
out:
	free(canon);
	return rc;
}

static int expand_inputs(run *r)
{
	const prepare_opts *o = r->o;
	r->max_depth = o->max_depth ? o->max_depth : PREPARE_DEFAULT_MAX_DEPTH;
	r->max_files = o->max_files ? o->max_files : PREPARE_DEFAULT_MAX_FILES;
	if (!(r->stack = calloc((size_t)r->max_depth + 1, sizeof *r->stack)))
		return fail(r, PREPARE_ERR_INTERNAL, -ENOMEM, "out of memory");
	int rc = 0;
	for (size_t i = 0; i < o->n_inputs && rc == 0; i++) {
		const char *in = o->inputs[i];
		struct stat st;
		if (stat(in, &st) == 0 || !strpbrk(in, "*?[")) {
			rc = add_input(r, in, true);
			continue;
		}
		glob_t g;
		int gr = glob(in, 0, NULL, &g);
		if (gr == GLOB_NOMATCH) {
			rc = fail(r, PREPARE_ERR_INPUT, -ENOENT, "%s: no file matches", in);
		} else if (gr != 0) {
			rc = fail(r, PREPARE_ERR_INPUT, -EIO, "%s: glob failed", in);
		} else {
			for (size_t k = 0; k < g.gl_pathc && rc == 0; k++) {
				if (stat(g.gl_pathv[k], &st) != 0)
					continue;
				if (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))
					rc = add_input(r, g.gl_pathv[k], false);
			}
		}
		if (gr != GLOB_NOMATCH)
			globfree(&g);
	}
	if (rc == 0 && r->files.n == 0)
		rc = fail(r, PREPARE_ERR_INPUT, -ENOENT, "no input files%s%s",
			  r->links_skipped ? " (symbolic links were skipped: see the log)" : "",
			  o->n_include || o->n_exclude ? " (after include / exclude)" : "");
	return rc;
}

/* ---- chunks ---- */

/* A unit of work: a byte range of a plain file, or (stream) a whole
 * compressed file or tar archive, decompressed by the one thread that
 * takes it into pieces the calling thread consumes in order. */
typedef struct chunk {
	uint32_t file;
	uint64_t off, len;
	bool stream;
} chunk;

typedef struct chunkvec {
	chunk *v;
	size_t n, cap;
} chunkvec;

static int chunk_push(chunkvec *c, chunk x)
{
	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 1024;
		chunk *v = realloc(c->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		c->v = v;
		c->cap = cap;
	}
	c->v[c->n++] = x;
	return 0;
}

/* What file f is, by its first bytes: a Parquet file fails the run here,
 * before any reading. */
static int sniff_file(run *r, size_t f, int fd, instream_kind *kind)
{
	unsigned char head[INSTREAM_HEAD];
	ssize_t n;
	do
		n = pread(fd, head, sizeof head, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return fail(r, PREPARE_ERR_INPUT, -errno, "%s: %s", r->files.v[f], strerror(errno));
	*kind = instream_sniff(head, (size_t)n);
	if (*kind == INSTREAM_PARQUET)
		return fail(r, PREPARE_ERR_INPUT, -ENOTSUP,
			    "%s: a Parquet file, which bertd does not read; convert it to JSON lines first, e.g. "
			    "python3 -c \"import pandas; pandas.read_parquet('x.parquet').to_json('x.jsonl', "
			    "orient='records', lines=True)\"", r->files.v[f]);
	return 0;
}

static int plan_chunks(run *r, chunkvec *out, uint64_t *total)
{
	int rc = 0;
	*total = 0;
	for (size_t f = 0; f < r->files.n && rc == 0; f++) {
		const char *p = r->files.v[f];
		/* the walk's size */
		uint64_t size = r->fsize[f];
		*total += size;
		if (size == 0)
			continue;
		int fd = open_input(r, f, O_RDONLY);
		if (fd < 0) {
			rc = fail(r, PREPARE_ERR_INPUT, fd, "%s: %s", p, strerror(-fd));
			break;
		}
		instream_kind kind;
		if ((rc = sniff_file(r, f, fd, &kind)) < 0) {
			close(fd);
			break;
		}
		if (instream_kind_streamed(kind) || size <= CHUNK_BYTES) {
			close(fd);
			rc = chunk_push(out, (chunk){(uint32_t)f, 0, size, instream_kind_streamed(kind)});
			continue;
		}
		/* the line end after each 1 MiB step, read with pread: mapping
		 * the file whole kept hundreds of MB of it resident (peak RSS) */
		char buf[1 << 16];
		uint64_t off = 0;
		while (off < size && rc == 0) {
			uint64_t end = off + CHUNK_BYTES;
			while (end < size) {
				ssize_t k = pread(fd, buf, sizeof buf, (off_t)end);
				if (k < 0 && errno == EINTR)
					continue;
				if (k <= 0) {
					end = size; /* shrank meanwhile: read_chunk says so */
					break;
				}
				const char *nl = memchr(buf, '\n', (size_t)k);
				if (nl) {
					end += (uint64_t)(nl - buf) + 1;
					break;
				}
				end += (uint64_t)k;
			}
			if (end > size)
				end = size;
			rc = chunk_push(out, (chunk){(uint32_t)f, off, end - off, false});
			off = end;
		}
		close(fd);
	}
	return rc;
}

/* ---- per-chunk work ---- */

typedef struct i64vec {
	int64_t *v;
	size_t n, cap;
} i64vec;

static int ev_push(i64vec *e, int64_t x)
{
	if (e->n == e->cap) {
		size_t c = e->cap ? e->cap * 2 : 256;
		int64_t *v = realloc(e->v, c * sizeof *v);
		if (!v)
			return -ENOMEM;
		e->v = v;
		e->cap = c;
	}
	e->v[e->n++] = x;
	return 0;
}

/* Sentence lengths users should know of (a line longer than a 128- or
 * 512-token sequence holds): counted on the input sentences, uncut. */
typedef struct sentence_lengths {
	uint64_t longest, over_126, over_510;
} sentence_lengths;

static void lengths_add(sentence_lengths *l, uint64_t n)
{
	if (n > l->longest)
		l->longest = n;
	l->over_126 += n > 126;
	l->over_510 += n > 510;
}

typedef struct result {
	bool ready;
	size_t chunk;          /* its index */
	int rc;
	char msg[512];
	wordpiece_ids ids;
	i64vec ev;
	wordpiece_stats st;
	sentence_lengths lens; /* of the input sentences, before the max_sentence_tokens cut */
	vocab_counter *counter;
	uint64_t bytes;         /* corpus bytes (as stored) it accounts for: progress */
	/* a stream unit: its pieces, queued by its thread for the calling one
	 * (rc / msg then say why the stream itself failed, after them) */
	struct result *q;       /* (STREAM_QUEUE,) ring, or NULL */
	size_t q_head, q_n;
} result;

/* Pieces of a stream waiting to be consumed, at most: with the window this
 * bounds memory (each piece is ~CHUNK_BYTES of text and its tokens). */
#define STREAM_QUEUE 4
/* A line of a compressed file longer than this fails the run (a plain
 * file's line is read whole, as long as the file). */
#define STREAM_MAX_LINE (1ull << 30)
#define STREAM_READ (64u << 10)

/* Where a text being tokenized comes from, for its error messages. */
typedef struct textsrc {
	const char *name;  /* the file, or "archive:member" */
	size_t file;
	uint64_t off;      /* offset of the text in the file (or decompressed member) */
	uint64_t line;     /* its line number; 0: count it in the file (plain files) */
	bool start;        /* it starts the file (member): a document, maybe a BOM */
	bool decompressed;
} textsrc;

typedef struct work {
	run *r;
	const chunk *chunks;
	size_t n_chunks;
	result *res;
	const wordpiece *wp;   /* encode pass */
	bool counting;         /* vocab counting pass */
	bool lower;
	pthread_mutex_t mu;
	pthread_cond_t cv_work, cv_done, cv_space; /* cv_space: a stream queue has room */
	size_t next, consumed, window;
	size_t first;          /* the chunk a resumed pass starts at */
	bool stop;
} work;

static bool blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\v' && s[i] != '\f')
			return false;
	return true;
}

/* One sentence: tokens appended and cut into events, or words counted. */
static int sentence(work *w, wordpiece_cache *cache, result *res, const char *s, size_t n)
{
	if (w->counting)
		return vocab_counter_add_text(res->counter, s, n);
	size_t before = res->ids.n;
	int rc = wordpiece_encode_cached(w->wp, cache, s, n, &res->ids, &res->st);
	if (rc < 0)
		return rc;
	uint64_t got = res->ids.n - before;
	lengths_add(&res->lens, got);
	uint64_t max = w->r->o->max_sentence_tokens ? w->r->o->max_sentence_tokens : UINT64_MAX;
	while (got > 0 && rc == 0) {
		uint64_t take = got < max ? got : max;
		rc = ev_push(&res->ev, (int64_t)take);
		got -= take;
	}
	return rc;
}

static int doc_break(work *w, result *res)
{
	if (w->counting)
		return 0;
	return ev_push(&res->ev, EV_DOC);
}

static uint64_t line_number(const run *r, size_t file, uint64_t off)
{
	int fd = open_input(r, file, O_RDONLY);
	FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
	uint64_t line = 1;
	if (!f) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	char buf[1 << 16];
	while (off > 0) {
		size_t want = off < sizeof buf ? (size_t)off : sizeof buf;
		size_t got = fread(buf, 1, want, f);
		if (got == 0)
			break;
		for (size_t i = 0; i < got; i++)
			line += buf[i] == '\n';
		off -= got;
	}
	fclose(f);
	return line;
}

static uint64_t count_lines(const char *s, size_t n)
{
	uint64_t k = 0;
	for (const char *e = s + n; (s = memchr(s, '\n', (size_t)(e - s))); s++)
		k++;
	return k;
}

static int jsonl_line(work *w, wordpiece_cache *cache, result *res, const textsrc *src,
		      const char *buf, const char *line, size_t n)
{
	if (blank(line, n))
		return 0;
	const char *field = w->r->o->text_field ? w->r->o->text_field : "text";
	json_error_t jerr;
	json_t *j = json_loadb(line, n, JSON_ALLOW_NUL, &jerr);
	json_t *t = json_is_object(j) ? json_object_get(j, field) : NULL;
	if (!json_is_string(t)) {
		uint64_t line_off = (uint64_t)(line - buf);
		uint64_t no = src->line ? src->line + count_lines(buf, (size_t)line_off)
					: line_number(w->r, src->file, src->off + line_off);
		snprintf(res->msg, sizeof res->msg, "%s:%llu: %s", src->name, (unsigned long long)no,
			 !j ? jerr.text : !json_is_object(j) ? "not a JSON object" :
			 "no string field with the text");
		json_decref(j);
		return -EBADMSG;
	}
	const char *s = json_string_value(t);
	size_t len = json_string_length(t);
	int rc = doc_break(w, res);
	for (size_t p = 0; p < len && rc == 0;) {
		const char *nl = memchr(s + p, '\n', len - p);
		size_t e = nl ? (size_t)(nl - s) : len;
		if (!blank(s + p, e - p))
			rc = sentence(w, cache, res, s + p, e - p);
		p = e + 1;
	}
	if (rc == 0)
		rc = doc_break(w, res);
	json_decref(j);
	return rc;
}

static int read_chunk(const run *r, const chunk *c, char **buf)
{
	int rc = 0;
	*buf = malloc(c->len ? c->len : 1);
	if (!*buf)
		return -ENOMEM;
	int fd = open_input(r, c->file, O_RDONLY);
	if (fd < 0)
		return fd;
	uint64_t got = 0;
	while (got < c->len) {
		ssize_t k = pread(fd, *buf + got, c->len - got, (off_t)(c->off + got));
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			rc = k < 0 ? -errno : -EIO; /* shrank while we read it */
			break;
		}
		got += (uint64_t)k;
	}
	close(fd);
	return rc;
}

/* Tokenizes (or counts) buf[0..len), whole lines of src, into res. Text
 * that is not UTF-8, or holds a NUL byte, fails naming src and the offset. */
static int process_text(work *w, wordpiece_cache *cache, result *res, const textsrc *src,
			const char *buf, size_t len)
{
	int rc = 0;
	size_t pos = 0;
	if (src->start) {
		if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
			pos = 3; /* UTF-8 BOM */
		rc = doc_break(w, res); /* a file starts a document */
	}
	size_t at;
	int nul;
	if (rc == 0 && instream_text_check(buf + pos, len - pos, &at, &nul) < 0) {
		at += pos;
		const char *where = src->decompressed ? " of the decompressed content" : "";
		if (nul)
			snprintf(res->msg, sizeof res->msg,
				 "%s: binary data, not text: a NUL byte at byte offset %llu%s", src->name,
				 (unsigned long long)(src->off + at), where);
		else
			snprintf(res->msg, sizeof res->msg,
				 "%s: not UTF-8 text: byte 0x%02X at byte offset %llu%s (convert it to UTF-8, "
				 "e.g. iconv -f latin1 -t utf-8)", src->name, (unsigned)(unsigned char)buf[at],
				 (unsigned long long)(src->off + at), where);
		return -EILSEQ;
	}
	while (pos < len && rc == 0) {
		const char *nl = memchr(buf + pos, '\n', len - pos);
		size_t e = nl ? (size_t)(nl - buf) : len;
		const char *line = buf + pos;
		size_t n = e - pos;
		if (w->r->o->format == PREPARE_JSONL)
			rc = jsonl_line(w, cache, res, src, buf, line, n);
		else if (blank(line, n))
			rc = doc_break(w, res);
		else
			rc = sentence(w, cache, res, line, n);
		pos = e + 1;
	}
	return rc;
}

static void process_chunk(work *w, wordpiece_cache *cache, size_t i)
{
	const chunk *c = &w->chunks[i];
	result *res = &w->res[i];
	const char *path = w->r->files.v[c->file];
	char *buf = NULL;
	int rc = 0;
	res->bytes = c->len;
	res->chunk = i;
	if (w->counting && (rc = vocab_counter_create(w->lower, &res->counter)) < 0)
		goto out;
	if ((rc = read_chunk(w->r, c, &buf)) < 0) {
		snprintf(res->msg, sizeof res->msg, "%s: read: %s", path, strerror(-rc));
		goto out;
	}
	textsrc src = {.name = path, .file = c->file, .off = c->off, .start = c->off == 0};
	rc = process_text(w, cache, res, &src, buf, (size_t)c->len);
out:
	if (rc < 0 && !res->msg[0])
		snprintf(res->msg, sizeof res->msg, "%s: %s", path, strerror(-rc));
	res->rc = rc;
	free(buf);
}

static void result_free(result *r);

/* Queues piece (moved) on stream unit u, waiting for room; -ECANCELED
 * when the run stops meanwhile (piece freed). */
static int push_piece(work *w, result *u, result *piece)
{
	pthread_mutex_lock(&w->mu);
	while (u->q_n == STREAM_QUEUE && !w->stop)
		pthread_cond_wait(&w->cv_space, &w->mu);
	bool stop = w->stop;
	if (!stop) {
		u->q[(u->q_head + u->q_n) % STREAM_QUEUE] = *piece;
		u->q_n++;
		pthread_cond_broadcast(&w->cv_done);
	}
	pthread_mutex_unlock(&w->mu);
	if (stop) {
		result_free(piece);
		return -ECANCELED;
	}
	return 0;
}

/* One piece of a stream: whole lines text[0..len) of src, accounting for
 * bytes of the stored file. Its failure is queued with it. */
static int stream_piece(work *w, wordpiece_cache *cache, result *u, const textsrc *src,
			const char *text, size_t len, uint64_t bytes)
{
	result piece = {.bytes = bytes, .chunk = (size_t)(u - w->res)};
	int rc = 0;
	if (w->counting && (rc = vocab_counter_create(w->lower, &piece.counter)) < 0)
		snprintf(piece.msg, sizeof piece.msg, "%s: %s", src->name, strerror(-rc));
	else
		rc = process_text(w, cache, &piece, src, text, len);
	if (rc < 0 && !piece.msg[0])
		snprintf(piece.msg, sizeof piece.msg, "%s: %s", src->name, strerror(-rc));
	piece.rc = rc;
	int prc = push_piece(w, u, &piece);
	return rc < 0 ? rc : prc;
}

/* A compressed file or tar archive: decompressed here, in order, and cut at
 * line ends into pieces of about CHUNK_BYTES, so the pieces (and so the
 * output) are the same for any thread count, and the same as the plain
 * file's. A failure of the stream itself ends up in u->rc / u->msg. */
static void process_stream(work *w, wordpiece_cache *cache, size_t i)
{
	const chunk *c = &w->chunks[i];
	result *u = &w->res[i];
	const run *r = w->r;
	const char *path = r->files.v[c->file];
	bool jsonl = r->o->format == PREPARE_JSONL;
	instream *in = NULL;
	char *buf = NULL, *name = NULL, why[400] = "";
	size_t cap = 0;
	uint64_t counted = 0; /* bytes of the stored file the pieces account for */
	int rc = 0;
	if (!(u->q = calloc(STREAM_QUEUE, sizeof *u->q))) {
		rc = -ENOMEM;
		goto out;
	}
	int fd = open_input(r, c->file, O_RDONLY);
	if (fd < 0) {
		rc = fd;
		snprintf(why, sizeof why, "%s", strerror(-fd));
		goto out;
	}
	if ((rc = instream_open(fd, &in, why, sizeof why)) < 0)
		goto out;
	const char *member;
	while (rc == 0 && (rc = instream_next(in, &member, why, sizeof why)) > 0) {
		rc = 0;
		if (member) {
			/* hidden members (macOS "._x" companions, say) as a walk skips them */
			const char *base = strrchr(member, '/');
			base = base ? base + 1 : member;
			if (!base[0] || base[0] == '.' || !selected(r, member))
				continue;
		}
		free(name);
		if ((member ? asprintf(&name, "%s:%s", path, member) : asprintf(&name, "%s", path)) < 0) {
			name = NULL;
			rc = -ENOMEM;
			break;
		}
		textsrc src = {.name = name, .file = c->file, .line = 1, .start = true, .decompressed = true};
		size_t have = 0;
		for (;;) {
			if (cap - have < STREAM_READ) {
				size_t nc = cap ? 2 * cap : CHUNK_BYTES + STREAM_READ;
				char *nb = have <= STREAM_MAX_LINE ? realloc(buf, nc) : NULL;
				if (!nb) {
					rc = have > STREAM_MAX_LINE ? -E2BIG : -ENOMEM;
					snprintf(why, sizeof why, "%s: %s at byte offset %llu of the decompressed content",
						 member ? member : "decompressing",
						 rc == -E2BIG ? "a line longer than 1 GiB" : "out of memory",
						 (unsigned long long)src.off);
					goto out;
				}
				buf = nb;
				cap = nc;
			}
			ssize_t k = instream_read(in, buf + have, STREAM_READ, why, sizeof why);
			if (k < 0) {
				rc = (int)k;
				goto out;
			}
			have += (size_t)k;
			size_t cut = 0;
			if (k == 0) {
				cut = have;
			} else if (have >= CHUNK_BYTES) {
				const char *nl = memrchr(buf, '\n', have);
				cut = nl ? (size_t)(nl - buf) + 1 : 0;
			}
			if (cut > 0) {
				uint64_t fb = instream_file_bytes(in);
				fb = fb > c->len ? c->len : fb < counted ? counted : fb;
				if ((rc = stream_piece(w, cache, u, &src, buf, cut, fb - counted)) < 0)
					goto out_queued;
				counted = fb;
				if (jsonl)
					src.line += count_lines(buf, cut);
				src.off += cut;
				src.start = false;
				memmove(buf, buf + cut, have - cut);
				have -= cut;
			}
			if (k == 0)
				break;
		}
	}
out:
	if (rc < 0) {
		u->rc = rc;
		if (why[0])
			snprintf(u->msg, sizeof u->msg, "%s: %s", path, why);
		else
			snprintf(u->msg, sizeof u->msg, "%s: %s", path, strerror(-rc));
	}
out_queued:
	instream_close(in);
	free(buf);
	free(name);
}

static void *worker(void *arg)
{
	work *w = arg;
	/* without a cache (out of memory) the output is the same, only slower */
	wordpiece_cache *cache = NULL;
	if (!w->counting && wordpiece_cache_create(&cache) < 0)
		cache = NULL;
	for (;;) {
		pthread_mutex_lock(&w->mu);
		while (!w->stop && w->next < w->n_chunks && w->next >= w->consumed + w->window)
			pthread_cond_wait(&w->cv_work, &w->mu);
		if (w->stop || w->next >= w->n_chunks) {
			pthread_mutex_unlock(&w->mu);
			wordpiece_cache_destroy(cache);
			return NULL;
		}
		size_t i = w->next++;
		pthread_mutex_unlock(&w->mu);
		if (w->chunks[i].stream)
			process_stream(w, cache, i);
		else
			process_chunk(w, cache, i);
		pthread_mutex_lock(&w->mu);
		w->res[i].ready = true;
		pthread_cond_broadcast(&w->cv_done);
		pthread_mutex_unlock(&w->mu);
	}
}

static void result_free(result *r)
{
	for (size_t k = 0; r->q && k < r->q_n; k++)
		result_free(&r->q[(r->q_head + k) % STREAM_QUEUE]);
	free(r->q);
	r->q = NULL;
	r->q_n = 0;
	wordpiece_ids_free(&r->ids);
	free(r->ev.v);
	r->ev.v = NULL;
	vocab_counter_destroy(r->counter);
	r->counter = NULL;
}

/* ---- progress ---- */

/* Each pass reads the corpus once: bytes_done runs 0..bytes_total (the
 * corpus size) within a phase. fraction covers the whole run and only grows:
 * a pass maps its bytes onto [f0, f0 + fw] — with vocab training the vocab
 * pass is the first half, tokenizing the second. */
typedef struct progress {
	const prepare_opts *o;
	double t0, last;
	uint64_t total;  /* corpus bytes: what one pass reads */
	double f0, fw;   /* this pass's share of fraction */
	bool drew;
} progress;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress_emit(progress *p, const char *phase, uint64_t pass_done, uint64_t tokens,
			  bool final)
{
	double t = now();
	if (!final && t - p->last < 0.25)
		return;
	p->last = t;
	if (p->o->progress_fd >= 0) {
		/* the pass end says 1 exactly, not a rounding below it */
		double f = p->f0 + p->fw * (p->total ? (double)pass_done / (double)p->total : 1.0);
		if (final && p->f0 + p->fw >= 1.0)
			f = 1.0;
		char line[256];
		int n = snprintf(line, sizeof line,
				 "{\"phase\":\"%s\",\"bytes_done\":%llu,\"bytes_total\":%llu,"
				 "\"fraction\":%.6f,\"tokens\":%llu}\n",
				 phase, (unsigned long long)pass_done, (unsigned long long)p->total, f,
				 (unsigned long long)tokens);
		/* a reader that went away must not stop the preparation */
		int wr = prepare_write_line(p->o->progress_fd, line, (size_t)n);
		if (wr < 0)
			log_debug("progress fd: %s", strerror(-wr));
	}
	if (p->o->progress_tty) {
		double el = t - p->t0;
		/* a person reads each pass on its own */
		fprintf(stderr, "\r%-8s %5.1f%%  %7.1f / %.1f MB  %6.1f MB/s%s", phase,
			p->total ? 100.0 * (double)pass_done / (double)p->total : 100.0,
			(double)pass_done / 1e6, (double)p->total / 1e6,
			el > 0 ? (double)pass_done / 1e6 / el : 0.0, final ? "\n" : "");
		fflush(stderr);
		p->drew = !final;
	}
}

int prepare_write_line(int fd, const char *line, size_t n)
{
	while (n) {
		ssize_t k = write(fd, line, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		line += k;
		n -= (size_t)k;
	}
	return 0;
}

/* ---- the run ---- */

static int run_pass(run *r, work *w, progress *pg, const char *phase,
		    int (*consume)(void *ctx, result *res), void *ctx)
{
	int rc = 0;
	int nt = r->o->threads > 0 ? r->o->threads : 1;
	pthread_t *th = calloc((size_t)nt, sizeof *th);
	w->res = calloc(w->n_chunks ? w->n_chunks : 1, sizeof *w->res);
	if (!th || !w->res) {
		free(th);
		return fail(r, PREPARE_ERR_INTERNAL, -ENOMEM, "out of memory");
	}
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv_work, NULL);
	pthread_cond_init(&w->cv_done, NULL);
	pthread_cond_init(&w->cv_space, NULL);
	w->next = w->consumed = w->first;
	w->window = 4 * (size_t)nt;
	w->stop = false;
	int started = 0;
	for (; started < nt; started++) {
		if (pthread_create(&th[started], NULL, worker, w) != 0) {
			rc = fail(r, PREPARE_ERR_INTERNAL, -EAGAIN, "cannot start threads");
			break;
		}
	}
	uint64_t done = 0, tokens = 0;
	for (size_t i = 0; i < w->first && i < w->n_chunks; i++)
		done += w->chunks[i].len;
	pg->t0 = pg->last = now();
	for (size_t i = w->first; i < w->n_chunks && rc == 0; i++) {
		result *res = &w->res[i];
		uint64_t unit_done = 0; /* a stream's pieces account for its bytes as they come */
		while (w->chunks[i].stream && rc == 0) {
			result piece;
			pthread_mutex_lock(&w->mu);
			while (res->q_n == 0 && !res->ready)
				pthread_cond_wait(&w->cv_done, &w->mu);
			bool got = res->q_n > 0;
			if (got) {
				piece = res->q[res->q_head];
				res->q_head = (res->q_head + 1) % STREAM_QUEUE;
				res->q_n--;
				pthread_cond_broadcast(&w->cv_space);
			}
			pthread_mutex_unlock(&w->mu);
			if (!got)
				break;
			rc = piece.rc < 0 ? fail(r, piece.rc == -ENOMEM ? PREPARE_ERR_INTERNAL : PREPARE_ERR_INPUT,
						 piece.rc, "%s", piece.msg)
					  : consume(ctx, &piece);
			unit_done += piece.bytes;
			done += piece.bytes;
			tokens += piece.ids.n;
			result_free(&piece);
			progress_emit(pg, phase, done, tokens, false);
		}
		if (rc < 0)
			break; /* its thread may be streaming on: the stop below ends it */
		pthread_mutex_lock(&w->mu);
		while (!res->ready)
			pthread_cond_wait(&w->cv_done, &w->mu);
		pthread_mutex_unlock(&w->mu);
		if (res->rc < 0) {
			enum prepare_error e = res->rc == -ENOMEM ? PREPARE_ERR_INTERNAL : PREPARE_ERR_INPUT;
			rc = fail(r, e, res->rc, "%s", res->msg);
		} else if (!w->chunks[i].stream) {
			rc = consume(ctx, res);
		}
		done += w->chunks[i].len - unit_done;
		tokens += res->ids.n;
		result_free(res);
		pthread_mutex_lock(&w->mu);
		w->consumed++;
		pthread_cond_broadcast(&w->cv_work);
		pthread_mutex_unlock(&w->mu);
		progress_emit(pg, phase, done, tokens, false);
	}
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_broadcast(&w->cv_work);
	pthread_cond_broadcast(&w->cv_space);
	pthread_mutex_unlock(&w->mu);
	for (int k = 0; k < started; k++)
		pthread_join(th[k], NULL);
	for (size_t i = 0; i < w->n_chunks; i++)
		result_free(&w->res[i]);
	free(w->res);
	w->res = NULL;
	free(th);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv_work);
	pthread_cond_destroy(&w->cv_done);
	pthread_cond_destroy(&w->cv_space);
	if (rc == 0)
		progress_emit(pg, phase, done, tokens, true);
	else if (pg->drew)
		fprintf(stderr, "\n");
	return rc;
}

static int consume_counts(void *ctx, result *res)
{
	return vocab_counter_merge(ctx, res->counter);
}

typedef struct writer {
	run *r;
	const char *dir;
	shard_vocab_info vocab;
	uint64_t shard_tokens;
	shard_writer *cur;
	json_t *shards;   /* manifest entries */
	prepare_summary *s;
	/* resume */
	const char *fingerprint;
	int64_t created;
	uint64_t unk_before; /* unk of the chunks before the one being consumed */
	/* and their sentence lengths (longest, over 126, over 510): a resumed
	 * run tokenizes none of those chunks again */
	uint64_t lens_before[3];
	size_t ev_chunk;     /* the chunk being consumed (SIZE_MAX: none yet) */
	size_t ev_base;      /* its events consumed before this result (streams: earlier pieces) */
	size_t skip_chunk;   /* a resumed run drops the first skip_events events */
	size_t skip_events;  /* of chunk skip_chunk: the shards done hold them */
} writer;

static int write_file_sync(const char *path, const void *data, size_t n);

static void fsync_dir(const char *dir)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
}

/* Records in resume.json (tmp + fsync + rename) what a restarted run may
 * keep: the vocab, the shards finished so far and where the next one
 * starts. Written after the files it names are durable. */
static int journal_write(writer *wr, size_t next_chunk, size_t next_event)
{
	json_t *j = json_pack("{s:s, s:i, s:s, s:I, s:{s:s, s:b, s:I}, s:O, s:{s:I, s:I}, s:I, s:[I, I, I]}",
			      "format", RESUME_FORMAT, "version", RESUME_VERSION,
			      "fingerprint", wr->fingerprint, "created", (json_int_t)wr->created,
			      "vocab", "sha256", wr->vocab.sha256, "trained", wr->s->vocab_trained,
			      "size", (json_int_t)wr->vocab.vocab_size,
			      "shards", wr->shards, "next", "chunk", (json_int_t)next_chunk, "event",
			      (json_int_t)next_event, "unk", (json_int_t)wr->unk_before, "lens",
			      (json_int_t)wr->lens_before[0], (json_int_t)wr->lens_before[1],
			      (json_int_t)wr->lens_before[2]);
	char *js = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!js)
		return fail(wr->r, PREPARE_ERR_INTERNAL, -ENOMEM, "cannot build %s", RESUME_NAME);
	char tmp[4352], path[4352];
	snprintf(tmp, sizeof tmp, "%s/%s.tmp", wr->dir, RESUME_NAME);
	snprintf(path, sizeof path, "%s/%s", wr->dir, RESUME_NAME);
	unlink(tmp);
	int rc = write_file_sync(tmp, js, strlen(js));
	free(js);
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -errno;
	if (rc < 0)
		return fail(wr->r, PREPARE_ERR_OUTPUT, rc, "%s: %s", path, strerror(-rc));
	fsync_dir(wr->dir);
	return 0;
}

/* Closes the open shard; unless final, records the resume point (the
 * event of chunk next_chunk the next shard starts at). */
static int writer_close_shard(writer *wr, bool final, size_t next_chunk, size_t next_event)
{
	if (!wr->cur)
		return 0;
	char name[32];
	snprintf(name, sizeof name, "shard-%05zu", json_array_size(wr->shards));
	shard_counts c;
	shard_sums sums;
	int rc = shard_writer_finish_sums(wr->cur, &c, &sums);
	wr->cur = NULL;
	if (rc < 0)
		return fail(wr->r, PREPARE_ERR_OUTPUT, rc, "%s/%s: %s", wr->dir, name, strerror(-rc));
	if (c.tokens == 0) { /* nothing was written to it: drop it */
		char p[4200];
		snprintf(p, sizeof p, "%s/%s.bin", wr->dir, name);
		unlink(p);
		snprintf(p, sizeof p, "%s/%s.idx", wr->dir, name);
		unlink(p);
		return 0;
	}
	json_array_append_new(wr->shards, json_pack("{s:s, s:I, s:I, s:I, s:s, s:s}", "name", name,
						     "tokens", (json_int_t)c.tokens, "sentences",
						     (json_int_t)c.sents, "documents", (json_int_t)c.docs,
						     "bin_sha256", sums.bin, "idx_sha256", sums.idx));
	wr->s->tokens += c.tokens;
	wr->s->sentences += c.sents;
	wr->s->documents += c.docs;
	wr->s->shards++;
	return final ? 0 : journal_write(wr, next_chunk, next_event);
}

static int writer_open_shard(writer *wr)
{
	char name[32];
	snprintf(name, sizeof name, "shard-%05zu", json_array_size(wr->shards));
	int rc = shard_writer_create(wr->dir, name, &wr->vocab, &wr->cur);
	if (rc < 0)
		return fail(wr->r, PREPARE_ERR_OUTPUT, rc, "%s/%s: %s", wr->dir, name, strerror(-rc));
	return 0;
}

static int consume_tokens(void *ctx, result *res)
{
	writer *wr = ctx;
	int rc = 0;
	size_t pos = 0, start = 0;
	/* A unit's events are counted from its start: a compressed file's
	 * pieces come one after another with the same chunk, and a resume
	 * point (chunk, event) counts through all of them. */
	if (res->chunk != wr->ev_chunk) {
		wr->ev_chunk = res->chunk;
		wr->ev_base = 0;
		wr->unk_before = wr->s->unk;
		wr->lens_before[0] = wr->s->longest_sentence;
		wr->lens_before[1] = wr->s->sentences_over_126;
		wr->lens_before[2] = wr->s->sentences_over_510;
	}
	size_t base = wr->ev_base;
	wr->ev_base += res->ev.n;
	if (res->chunk == wr->skip_chunk && wr->skip_events) {
		/* resumed: these events are in the shards kept (for a stream,
		 * perhaps this whole piece and more of the next) */
		start = wr->skip_events < res->ev.n ? wr->skip_events : res->ev.n;
		for (size_t i = 0; i < start; i++)
			pos += res->ev.v[i] > 0 ? (size_t)res->ev.v[i] : 0;
		wr->skip_events -= start;
	}
	wr->s->unk += res->st.unk;
	if (res->lens.longest > wr->s->longest_sentence)
		wr->s->longest_sentence = res->lens.longest;
	wr->s->sentences_over_126 += res->lens.over_126;
	wr->s->sentences_over_510 += res->lens.over_510;
	for (size_t i = start; i < res->ev.n && rc == 0; i++) {
		int64_t e = res->ev.v[i];
		if (!wr->cur && (rc = writer_open_shard(wr)) < 0)
			break;
		if (e == EV_DOC) {
			rc = shard_writer_end_document(wr->cur);
			if (rc == 0 && shard_writer_counts(wr->cur).tokens >= wr->shard_tokens)
				rc = writer_close_shard(wr, false, res->chunk, base + i + 1);
			continue;
		}
		rc = shard_writer_add_sentence(wr->cur, res->ids.v + pos, (size_t)e);
		pos += (size_t)e;
		if (rc < 0)
			rc = fail(wr->r, PREPARE_ERR_OUTPUT, rc, "%s: writing shard: %s", wr->dir,
				  strerror(-rc));
	}
	return rc;
}

static int rm_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char p[4352];
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		unlink(p); /* the temp dir holds only files we made */
	}
	closedir(d);
	return rmdir(dir) == 0 ? 0 : -errno;
}

static int write_file_sync(const char *path, const void *data, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	const char *p = data;
	int rc = 0;
	while (n && rc == 0) {
		ssize_t k = write(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			rc = -errno;
		else {
			p += k;
			n -= (size_t)k;
		}
	}
	if (rc == 0 && fsync(fd) != 0)
		rc = -errno;
	if (close(fd) != 0 && rc == 0)
		rc = -errno;
	return rc;
}

/* Reads a file whole; under the data roots when there are some (-EACCES:
 * outside them, -EXDEV: a link on its path leads out). */
static int read_whole(const run *r, const char *path, char **buf, size_t *n)
{
	*buf = NULL;
	int fd;
	if (r->o->n_roots) {
		char *canon = realpath(path, NULL);
		size_t rel = 0;
		int ri = canon ? root_of(r, canon, &rel) : -1;
		fd = !canon ? -errno : ri < 0 ? -EACCES : open_at_root(r, ri, canon, rel, O_RDONLY);
		free(canon);
	} else {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		fd = fd < 0 ? -errno : fd;
	}
	if (fd < 0)
		return fd;
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 30)) {
		rc = -EINVAL;
		goto out;
	}
	*n = (size_t)st.st_size;
	*buf = malloc(*n + 1);
	if (!*buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t got = 0; got < *n;) {
		ssize_t k = read(fd, *buf + got, *n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			rc = -EIO;
			goto out;
		}
		got += (size_t)k;
	}
out:
	if (rc < 0) {
		free(*buf);
		*buf = NULL;
	}
	close(fd);
	return rc;
}

/* Uncased unless some non-special entry has an ASCII capital. */
static bool infer_lowercase(const char *v, size_t n)
{
	size_t i = 0;
	while (i < n) {
		const char *e = memchr(v + i, '\n', n - i);
		size_t end = e ? (size_t)(e - v) : n;
		if (v[i] != '[')
			for (size_t k = i; k < end; k++)
				if (v[k] >= 'A' && v[k] <= 'Z')
					return false;
		i = end + 1;
	}
	return true;
}

/* What a resumed run must share with the interrupted one for its output to
 * be the same: this build, every option that changes the shards, the
 * inputs as given, each file's size and mtime, and the chunk plan. */
static void fingerprint(const run *r, const chunkvec *c, const char *vocab_sha, uint64_t shard_tokens,
			char hex[65])
{
	const prepare_opts *o = r->o;
	sha256_ctx h;
	sha256_init(&h);
	char line[256];
	int n = snprintf(line, sizeof line, "bertd-prepare %s\nformat %d\nlower %d\nvocab %s\ntrain %u\n"
			 "shard_tokens %llu\nmax_sentence_tokens %u\nfield ", BERTD_VERSION, (int)o->format,
			 o->lowercase, vocab_sha ? vocab_sha : "-", o->train_vocab_size,
			 (unsigned long long)shard_tokens, o->max_sentence_tokens);
	sha256_update(&h, line, (size_t)n);
	const char *tf = o->text_field ? o->text_field : "text";
	sha256_update(&h, tf, strlen(tf) + 1);
	for (size_t i = 0; i < o->n_inputs; i++)
		sha256_update(&h, o->inputs[i], strlen(o->inputs[i]) + 1);
	for (size_t f = 0; f < r->files.n; f++) {
		struct stat st;
		if (stat(r->files.v[f], &st) != 0)
			memset(&st, 0, sizeof st);
		sha256_update(&h, r->files.v[f], strlen(r->files.v[f]) + 1);
		n = snprintf(line, sizeof line, "%lld %lld.%09ld\n", (long long)st.st_size,
			     (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
		sha256_update(&h, line, (size_t)n);
	}
	for (size_t i = 0; i < c->n; i++) {
		n = snprintf(line, sizeof line, "%u %llu %llu\n", c->v[i].file,
			     (unsigned long long)c->v[i].off, (unsigned long long)c->v[i].len);
		sha256_update(&h, line, (size_t)n);
	}
	uint8_t d[32];
	sha256_final(&h, d);
	sha256_to_hex(d, hex);
}

/* Whether file name of dir has sha256 want. */
static bool file_matches(const char *dir, const char *name, const char *want)
{
	char p[4352], hex[65];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return want && shard_file_sha256(p, hex) == 0 && strcmp(hex, want) == 0;
}

/* Why the journal j of work cannot be resumed from (NULL: it can). */
static const char *journal_unusable(const run *r, const char *work, json_t *j, const char *fp,
				    char *buf, size_t cap)
{
	json_t *fmt = json_object_get(j, "format"), *sh = json_object_get(j, "shards"), *e;
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), RESUME_FORMAT) != 0 ||
	    json_integer_value(json_object_get(j, "version")) != RESUME_VERSION || !json_is_array(sh) ||
	    !json_is_integer(json_object_get(json_object_get(j, "next"), "chunk")) ||
	    !json_is_integer(json_object_get(json_object_get(j, "next"), "event")))
		return "its resume.json is not one this bertd-prepare writes";
	if (r->o->fresh)
		return "asked to start fresh";
	if (!json_is_string(json_object_get(j, "fingerprint")) ||
	    strcmp(json_string_value(json_object_get(j, "fingerprint")), fp) != 0)
		return "the options or the inputs changed since";
	if (!file_matches(work, "vocab.txt",
			  json_string_value(json_object_get(json_object_get(j, "vocab"), "sha256"))))
		return "its vocab.txt does not match resume.json";
	size_t i;
	json_array_foreach(sh, i, e) {
		const char *nm = json_string_value(json_object_get(e, "name"));
		char f[64];
		for (int k = 0; k < 2; k++) {
			snprintf(f, sizeof f, "%s.%s", nm ? nm : "?", k ? "bin" : "idx");
			if (!nm || strlen(nm) > 40 ||
			    !file_matches(work, f, json_string_value(json_object_get(e, k ? "bin_sha256"
											    : "idx_sha256")))) {
				snprintf(buf, cap, "%s does not match resume.json", f);
				return buf;
			}
		}
	}
	return NULL;
}

/* Whether name is one of the files a kept journal j names. */
static bool kept(json_t *j, const char *name)
{
	if (!j)
		return false;
	if (!strcmp(name, RESUME_NAME) || !strcmp(name, "vocab.txt"))
		return true;
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(j, "shards"), i, e) {
		const char *nm = json_string_value(json_object_get(e, "name"));
		size_t n = nm ? strlen(nm) : 0;
		if (n && !strncmp(name, nm, n) && (!strcmp(name + n, ".bin") || !strcmp(name + n, ".idx")))
			return true;
	}
	return false;
}

/* Creates or opens the work directory and locks it (*lockfd, caller
 * closes). *journal: the interrupted run's resume.json when it can be
 * resumed from (caller owns), else NULL; everything in work it does not
 * name is removed. */
static int work_open(run *r, const char *work, const char *fp, json_t **journal, int *lockfd)
{
	*journal = NULL;
	*lockfd = -1;
	if (mkdir(work, 0755) != 0 && errno != EEXIST)
		return fail(r, PREPARE_ERR_OUTPUT, -errno, "%s: %s", work, strerror(errno));
	int fd = open(work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return fail(r, PREPARE_ERR_OUTPUT, -errno, "%s: %s", work, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		close(fd);
		return fail(r, PREPARE_ERR_OUTPUT, e == EWOULDBLOCK ? -EBUSY : -e, "%s: %s", work,
			    e == EWOULDBLOCK ? "another bertd-prepare is writing this dataset" : strerror(e));
	}
	*lockfd = fd;
	char p[4352], why[128];
	snprintf(p, sizeof p, "%s/%s", work, RESUME_NAME);
	json_t *j = json_load_file(p, 0, NULL);
	const char *no = j ? journal_unusable(r, work, j, fp, why, sizeof why) : NULL;
	if (no) {
		log_info("%s: not resuming (%s): starting over", work, no);
		json_decref(j);
		j = NULL;
	}
	DIR *d = fdopendir(dup(fd));
	if (!d) {
		json_decref(j);
		return fail(r, PREPARE_ERR_OUTPUT, -errno, "%s: %s", work, strerror(errno));
	}
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !kept(j, e->d_name))
			unlinkat(fd, e->d_name, 0); /* a shard being written when killed, a temp */
	closedir(d);
	*journal = j;
	return 0;
}

/* Reads work's vocab.txt (a resumed run's trained vocab). */
static int read_work_vocab(const char *work, char **buf, size_t *n)
{
	char p[4352];
	snprintf(p, sizeof p, "%s/vocab.txt", work);
	run plain = {.o = &(prepare_opts){0}};
	return read_whole(&plain, p, buf, n);
}

int prepare_run(const prepare_opts *o, prepare_summary *s, enum prepare_error *err,
		char *msg, size_t msg_len)
{
	int rc = 0;
	run r = {.o = o, .err = err, .msg = msg, .msg_len = msg_len};
	chunkvec chunks = {0};
	char *vtxt = NULL, *out_dir = NULL;
	char tmp[4352];
	size_t vlen = 0;
	wordpiece *wp = NULL;
	vocab_counter *counter = NULL;
	writer wr = {0};
	json_t *journal = NULL;
	int lockfd = -1;
	bool own_work = false;
	double t0 = now();
	*err = PREPARE_ERR_NONE;
	if (msg && msg_len)
		msg[0] = '\0';
	memset(s, 0, sizeof *s);

	if (!o->out_dir || !o->out_dir[0] || o->n_inputs == 0 || o->threads < 1 ||
	    (!o->vocab_path && o->train_vocab_size == 0) || (o->vocab_path && o->train_vocab_size)) {
		rc = fail(&r, PREPARE_ERR_USAGE, -EINVAL,
			  "need an output, inputs, threads >= 1 and exactly one of a vocab or a vocab size to train");
		goto out;
	}
	size_t ol = strlen(o->out_dir);
	while (ol > 1 && o->out_dir[ol - 1] == '/')
		ol--; /* "ds/" names ds, and its work sibling must not go inside it */
	if (!(out_dir = strndup(o->out_dir, ol))) {
		rc = -ENOMEM;
		goto out;
	}
	if (fs_partial_dir(out_dir, tmp, sizeof tmp) < 0) {
		rc = fail(&r, PREPARE_ERR_USAGE, -ENAMETOOLONG, "%s: name too long", out_dir);
		goto out;
	}
	struct stat st;
	if (stat(out_dir, &st) == 0) {
		rc = fail(&r, PREPARE_ERR_OUTPUT, -EEXIST, "%s: already exists", out_dir);
		goto out;
	}
	if (errno != ENOENT) {
		rc = fail(&r, PREPARE_ERR_OUTPUT, -errno, "%s: %s", out_dir, strerror(errno));
		goto out;
	}
	if ((rc = open_roots(&r)) < 0 || (rc = expand_inputs(&r)) < 0)
		goto out;
	uint64_t total;
	if ((rc = plan_chunks(&r, &chunks, &total)) < 0)
		goto out;
	s->files = r.files.n;
	s->bytes = total;

	/* a given vocab first: the fingerprint names it */
	bool lower = o->lowercase != 0;
	progress pg = {.o = o, .total = total, .f0 = 0.0, .fw = o->vocab_path ? 1.0 : 0.5};
	work w = {.r = &r, .chunks = chunks.v, .n_chunks = chunks.n};
	char vsha[65] = "";
	if (o->vocab_path) {
		if ((rc = read_whole(&r, o->vocab_path, &vtxt, &vlen)) < 0) {
			rc = fail(&r, PREPARE_ERR_VOCAB, rc, "vocab %s: %s", o->vocab_path,
				  rc == -EACCES ? "outside the data roots" : rc == -EXDEV
				  ? "a link on its path leads outside the data root" : strerror(-rc));
			goto out;
		}
		sha256_hex(vtxt, vlen, vsha);
		if (o->lowercase < 0) {
			lower = infer_lowercase(vtxt, vlen);
			log_info("vocab %s looks %s (use --lowercase or --cased to say so)",
				 o->vocab_path, lower ? "uncased" : "cased");
		}
	}

	/* the work directory: what an interrupted run left, or a new one */
	uint64_t shard_tokens = o->shard_tokens ? o->shard_tokens : DEFAULT_SHARD_TOKENS;
	char fp[65];
	fingerprint(&r, &chunks, o->vocab_path ? vsha : NULL, shard_tokens, fp);
	if ((rc = work_open(&r, tmp, fp, &journal, &lockfd)) < 0)
		goto out;
	own_work = true;

	if (!o->vocab_path && journal) {
		/* the interrupted run's trained vocab, checked by work_open */
		if ((rc = read_work_vocab(tmp, &vtxt, &vlen)) < 0) {
			rc = fail(&r, PREPARE_ERR_OUTPUT, rc, "%s/vocab.txt: %s", tmp, strerror(-rc));
			goto out;
		}
		s->vocab_trained = true;
		s->resumed_vocab = true;
		s->vocab_size_requested = o->train_vocab_size;
		log_info("resuming: reusing the vocab trained before (%s/vocab.txt)", tmp);
	} else if (!o->vocab_path) {
		if ((rc = vocab_counter_create(lower, &counter)) < 0)
			goto out;
		w.counting = true;
		w.lower = lower;
		if ((rc = run_pass(&r, &w, &pg, "vocab", consume_counts, counter)) < 0)
			goto out;
		vocab_train_opts to = {.vocab_size = o->train_vocab_size};
		uint32_t nt;
		if ((rc = vocab_train(counter, &to, &vtxt, &vlen, &nt)) < 0) {
			rc = fail(&r, rc == -ENOMEM ? PREPARE_ERR_INTERNAL : PREPARE_ERR_INPUT, rc,
				  "vocab training failed (corpus without words, or size %u too small)",
				  o->train_vocab_size);
			goto out;
		}
		s->vocab_trained = true;
		s->vocab_size_requested = o->train_vocab_size;
		if (nt < o->train_vocab_size)
			log_info("trained a vocab of %u entries (%u requested: the corpus has no pair left to "
				 "merge, every word of it is one entry) from %llu distinct words",
				 nt, o->train_vocab_size, (unsigned long long)vocab_counter_unique(counter));
		else
			log_info("trained a vocab of %u entries (as requested) from %llu distinct words", nt,
				 (unsigned long long)vocab_counter_unique(counter));
	}
	if ((rc = wordpiece_create(vtxt, vlen, lower, &wp)) < 0) {
		rc = fail(&r, PREPARE_ERR_VOCAB, rc, "vocab %s: unusable (see above)",
			  o->vocab_path ? o->vocab_path : "(trained)");
		goto out;
	}
	corpus_special sp;
	if ((rc = wordpiece_special(wp, &sp)) < 0) {
		rc = fail(&r, PREPARE_ERR_VOCAB, -EINVAL,
			  "vocab %s lacks one of [PAD] [UNK] [CLS] [SEP] [MASK]",
			  o->vocab_path ? o->vocab_path : "(trained)");
		goto out;
	}
	s->vocab_size = wordpiece_vocab_size(wp);
	s->lowercase = lower;
	snprintf(s->vocab_sha256, sizeof s->vocab_sha256, "%s", wordpiece_vocab_sha256(wp));

	char path[4352];
	wr = (writer){.r = &r, .dir = tmp, .shard_tokens = shard_tokens, .s = s, .fingerprint = fp,
		      .created = o->created ? o->created : (int64_t)time(NULL), .ev_chunk = SIZE_MAX};
	wr.vocab = (shard_vocab_info){.vocab_size = s->vocab_size, .lowercase = lower, .special = sp};
	memcpy(wr.vocab.sha256, s->vocab_sha256, 65);
	if (journal) {
		/* keep the shards done; the next starts where resume.json says */
		json_t *next = json_object_get(journal, "next"), *e;
		size_t i;
		wr.shards = json_deep_copy(json_object_get(journal, "shards"));
		json_array_foreach(wr.shards, i, e) {
			s->tokens += (uint64_t)json_integer_value(json_object_get(e, "tokens"));
			s->sentences += (uint64_t)json_integer_value(json_object_get(e, "sentences"));
			s->documents += (uint64_t)json_integer_value(json_object_get(e, "documents"));
			s->shards++;
		}
		s->resumed_shards = s->shards;
		s->unk = wr.unk_before = (uint64_t)json_integer_value(json_object_get(journal, "unk"));
		json_t *lens = json_object_get(journal, "lens");
		s->longest_sentence = (uint64_t)json_integer_value(json_array_get(lens, 0));
		s->sentences_over_126 = (uint64_t)json_integer_value(json_array_get(lens, 1));
		s->sentences_over_510 = (uint64_t)json_integer_value(json_array_get(lens, 2));
		w.first = (size_t)json_integer_value(json_object_get(next, "chunk"));
		wr.skip_chunk = w.first;
		wr.skip_events = (size_t)json_integer_value(json_object_get(next, "event"));
		if (!o->created && json_is_integer(json_object_get(journal, "created")))
			wr.created = json_integer_value(json_object_get(journal, "created"));
		if (w.first > chunks.n)
			w.first = chunks.n;
		log_info("resuming %s: %llu shard(s) kept, continuing at chunk %zu of %zu", tmp,
			 (unsigned long long)s->shards, w.first, chunks.n);
	} else {
		snprintf(path, sizeof path, "%s/vocab.txt", tmp);
		if ((rc = write_file_sync(path, vtxt, vlen)) < 0) {
			rc = fail(&r, PREPARE_ERR_OUTPUT, rc, "%s: %s", path, strerror(-rc));
			goto out;
		}
		wr.shards = json_array();
		/* from here a kill keeps the vocab */
		if ((rc = journal_write(&wr, 0, 0)) < 0)
			goto out;
	}
	w.counting = false;
	pg.f0 = o->vocab_path ? 0.0 : 0.5;
	w.wp = wp;
	w.lower = lower;
	double tt = now();
	if ((rc = run_pass(&r, &w, &pg, "tokenize", consume_tokens, &wr)) < 0)
		goto out;
	if ((rc = writer_close_shard(&wr, true, 0, 0)) < 0)
		goto out;
	s->tokenize_seconds = now() - tt;
	if (s->tokens == 0) {
		rc = fail(&r, PREPARE_ERR_INPUT, -ENODATA, "the corpus has no tokens");
		goto out;
	}

	/* manifest last: its presence means the shards are complete */
	json_t *inputs = json_array();
	for (size_t i = 0; i < o->n_inputs; i++)
		json_array_append_new(inputs, json_string(o->inputs[i]));
	time_t tc = (time_t)wr.created;
	struct tm tm;
	char when[32];
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&tc, &tm));
	json_t *m = json_pack(
		"{s:s, s:i, s:{s:s, s:s, s:I, s:b, s:b}, s:{s:I, s:I, s:I, s:I, s:I},"
		" s:s, s:I, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
		" s:{s:o, s:s, s:s, s:I, s:s, s:s}}",
		"format", SHARD_MANIFEST_FORMAT, "version", SHARD_MANIFEST_VERSION,
		"vocab", "file", "vocab.txt", "sha256", s->vocab_sha256, "size", (json_int_t)s->vocab_size,
		"lowercase", lower, "trained", s->vocab_trained,
		"special", "pad", (json_int_t)sp.pad, "unk", (json_int_t)sp.unk, "cls", (json_int_t)sp.cls,
		"sep", (json_int_t)sp.sep, "mask", (json_int_t)sp.mask,
		"token_dtype", s->vocab_size <= 65536 ? "uint16" : "uint32",
		"max_sentence_tokens", (json_int_t)o->max_sentence_tokens,
		"shards", json_incref(wr.shards),
		"totals", "files", (json_int_t)s->files, "bytes", (json_int_t)s->bytes,
		"documents", (json_int_t)s->documents, "sentences", (json_int_t)s->sentences,
		"tokens", (json_int_t)s->tokens, "unk", (json_int_t)s->unk,
		"longest_sentence", (json_int_t)s->longest_sentence,
		"sentences_over_126", (json_int_t)s->sentences_over_126,
		"sentences_over_510", (json_int_t)s->sentences_over_510,
		"source", "inputs", inputs, "format", o->format == PREPARE_JSONL ? "jsonl" : "text",
		"text_field", o->text_field ? o->text_field : "text",
		"shard_tokens", (json_int_t)wr.shard_tokens, "created", when,
		"tool", "bertd-prepare " BERTD_VERSION);
	char *js = m ? json_dumps(m, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
	json_decref(m);
	if (!js) {
		rc = fail(&r, PREPARE_ERR_INTERNAL, -ENOMEM, "cannot build the manifest");
		goto out;
	}
	snprintf(path, sizeof path, "%s/%s", tmp, SHARD_MANIFEST_NAME);
	size_t jl = strlen(js);
	js[jl] = '\n';
	unlink(path); /* a manifest written just before an earlier kill */
	rc = write_file_sync(path, js, jl + 1);
	free(js);
	if (rc < 0) {
		rc = fail(&r, PREPARE_ERR_OUTPUT, rc, "%s: %s", path, strerror(-rc));
		goto out;
	}
	/* the dataset holds no trace of how it was made */
	snprintf(path, sizeof path, "%s/%s", tmp, RESUME_NAME);
	unlink(path);
	fsync_dir(tmp);
	if (rename(tmp, out_dir) != 0) {
		rc = fail(&r, PREPARE_ERR_OUTPUT, -errno, "rename %s -> %s: %s", tmp, out_dir,
			  strerror(errno));
		goto out;
	}
	own_work = false;
	/* make the rename itself durable */
	char *slash = strrchr(out_dir, '/');
	char parent[4096];
	snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - out_dir) : 1,
		 slash ? (slash == out_dir ? "/" : out_dir) : ".");
	fsync_dir(parent);
out:
	if (wr.cur)
		shard_writer_abort(wr.cur);
	json_decref(wr.shards);
	json_decref(journal);
	if (own_work)
		rm_tree(tmp); /* a clean failure: nothing here can be resumed into success */
	if (lockfd >= 0)
		close(lockfd);
	if (rc < 0 && *err == PREPARE_ERR_NONE)
		fail(&r, rc == -ENOMEM ? PREPARE_ERR_INTERNAL : PREPARE_ERR_INPUT, rc, "%s", strerror(-rc));
	s->seconds = now() - t0;
	free(out_dir);
	free(vtxt);
	wordpiece_destroy(wp);
	vocab_counter_destroy(counter);
	strvec_free(&r.files);
	free(r.froot);
	free(r.frel);
	free(r.fsize);
	free(r.stack);
	close_roots(&r);
	free(chunks.v);
	return rc;
}

json_t *prepare_summary_json(const prepare_summary *s, const char *out_dir)
{
	double mbps = s->tokenize_seconds > 0 ? (double)s->bytes / 1e6 / s->tokenize_seconds : 0.0;
	json_t *requested = s->vocab_trained ? json_integer(s->vocab_size_requested) : json_null();
	json_t *j = json_pack("{s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:i, s:o, s:b, s:b, s:s,"
			 " s:f, s:f, s:f, s:I, s:b}",
			 "ok", 1, "dataset", out_dir, "files", (json_int_t)s->files,
			 "bytes", (json_int_t)s->bytes, "documents", (json_int_t)s->documents,
			 "sentences", (json_int_t)s->sentences, "tokens", (json_int_t)s->tokens,
			 "unk", (json_int_t)s->unk,
			 "unk_rate", s->tokens ? (double)s->unk / (double)s->tokens : 0.0,
			 "shards", (json_int_t)s->shards, "vocab_size", (int)s->vocab_size,
			 "vocab_size_requested", requested, "lowercase", s->lowercase,
			 "vocab_trained", s->vocab_trained,
			 "vocab_sha256", s->vocab_sha256, "seconds", s->seconds,
			 "tokenize_seconds", s->tokenize_seconds, "mb_per_s", mbps,
			 "resumed_shards", (json_int_t)s->resumed_shards, "resumed_vocab", s->resumed_vocab);
	/* the input sentences' lengths (uncut): what a 128- or 512-token
	 * sequence cannot hold whole (docs/formats.md) */
	json_t *lens = json_pack("{s:I, s:I, s:I}", "longest_sentence", (json_int_t)s->longest_sentence,
				 "sentences_over_126", (json_int_t)s->sentences_over_126,
				 "sentences_over_510", (json_int_t)s->sentences_over_510);
	if (j && (!lens || json_object_update(j, lens) < 0)) {
		json_decref(j);
		j = NULL;
	}
	json_decref(lens);
	return j;
}
