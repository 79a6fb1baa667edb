/* shard — token shard files and dataset manifests (see shard.h and
 * docs/formats.md). The reader trusts nothing in a file: every count and
 * offset is checked before a corpus_view is handed out, because the MLM
 * builder indexes tokens with them unchecked. Never reads a .bin whole.
 */
#include "loader/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/log.h"
#include "common/sha256.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shards are little-endian and mapped as is; a big-endian port needs byte swaps"
#endif

/* The .idx header, exactly SHARD_IDX_HEADER_BYTES on disk. */
typedef struct idx_header {
	char magic[8];          /* "BERTDIDX" */
	uint32_t version;       /* SHARD_IDX_VERSION */
	uint32_t token_bytes;   /* 2 or 4 */
	uint64_t n_tokens;
	uint64_t n_sents;
	uint64_t n_docs;
	uint32_t vocab_size;
	uint32_t flags;         /* SHARD_FLAG_LOWERCASE */
	uint32_t special[5];    /* pad unk cls sep mask */
	uint32_t header_bytes;  /* SHARD_IDX_HEADER_BYTES */
	uint8_t vocab_sha256[32];
	uint8_t reserved[24];   /* zero */
} idx_header;

_Static_assert(sizeof(idx_header) == SHARD_IDX_HEADER_BYTES, "idx header layout");

uint32_t corpus_token(const corpus_view *c, uint64_t i)
{
	if (c->token_bytes == 2)
		return ((const uint16_t *)c->tokens)[i];
	return ((const uint32_t *)c->tokens)[i];
}

static int hex_to_bytes(const char *hex, uint8_t out[32])
{
	if (!hex || strlen(hex) != 64)
		return -EINVAL;
	for (int i = 0; i < 32; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return -EINVAL;
		out[i] = (uint8_t)v;
	}
	return 0;
}

static bool name_ok(const char *name)
{
	if (!name[0] || strlen(name) > 200)
		return false;
	for (const char *p = name; *p; p++)
		if (*p == '/' || (*p == '.' && p == name))
			return false;
	return true;
}

/* ---- writer ---- */

typedef struct u64vec {
	uint64_t *v;
	size_t n, cap;
} u64vec;

static int u64vec_push(u64vec *a, uint64_t x)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 1024;
		uint64_t *v = realloc(a->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		a->v = v;
		a->cap = cap;
	}
	a->v[a->n++] = x;
	return 0;
}

struct shard_writer {
	char bin_path[4352], idx_path[4352];
	FILE *bin;
	shard_vocab_info vocab;
	int token_bytes;
	uint64_t n_tokens;
	u64vec sent_off; /* (n_sents + 1,) */
	u64vec doc_off;  /* (n_docs + 1,) */
	sha256_ctx bin_sha; /* over every byte written to the .bin, in order */
	uint8_t buf[1 << 16];
};

int shard_writer_create(const char *dir, const char *name, const shard_vocab_info *vocab,
			shard_writer **out)
{
	int rc = 0;
	*out = NULL;
	if (!name_ok(name) || vocab->vocab_size == 0) {
		log_error("shard %s: bad name or empty vocab", name);
		return -EINVAL;
	}
	uint8_t sha[32];
	if (hex_to_bytes(vocab->sha256, sha) < 0) {
		log_error("shard %s: vocab sha256 is not 64 hex digits", name);
		return -EINVAL;
	}
	shard_writer *w = calloc(1, sizeof *w);
	if (!w)
		return -ENOMEM;
	w->vocab = *vocab;
	w->token_bytes = vocab->vocab_size <= 65536 ? 2 : 4;
	snprintf(w->bin_path, sizeof w->bin_path, "%s/%s.bin", dir, name);
	snprintf(w->idx_path, sizeof w->idx_path, "%s/%s.idx", dir, name);
	if ((rc = u64vec_push(&w->sent_off, 0)) < 0 || (rc = u64vec_push(&w->doc_off, 0)) < 0)
		goto out;
	sha256_init(&w->bin_sha);
	w->bin = fopen(w->bin_path, "wxe");
	if (!w->bin) {
		rc = -errno;
		log_error("shard %s: %s", w->bin_path, strerror(errno));
		goto out;
	}
out:
	if (rc < 0) {
		free(w->sent_off.v);
		free(w->doc_off.v);
		free(w);
		w = NULL;
	}
	*out = w;
	return rc;
}

int shard_writer_add_sentence(shard_writer *w, const uint32_t *ids, size_t n)
{
	if (n == 0)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (ids[i] >= w->vocab.vocab_size)
			return -EINVAL;
	size_t i = 0;
	while (i < n) {
		/* little-endian by construction, whatever the host */
		size_t k = 0, per = sizeof w->buf / (size_t)w->token_bytes;
		for (; k < per && i < n; k++, i++) {
			uint8_t *p = w->buf + k * (size_t)w->token_bytes;
			p[0] = (uint8_t)ids[i];
			p[1] = (uint8_t)(ids[i] >> 8);
			if (w->token_bytes == 4) {
				p[2] = (uint8_t)(ids[i] >> 16);
				p[3] = (uint8_t)(ids[i] >> 24);
			}
		}
		if (fwrite(w->buf, (size_t)w->token_bytes, k, w->bin) != k) {
			log_error("shard %s: write failed: %s", w->bin_path, strerror(errno));
			return errno ? -errno : -EIO;
		}
		sha256_update(&w->bin_sha, w->buf, k * (size_t)w->token_bytes);
	}
	w->n_tokens += n;
	return u64vec_push(&w->sent_off, w->n_tokens);
}

int shard_writer_end_document(shard_writer *w)
{
	uint64_t n_sents = w->sent_off.n - 1;
	if (n_sents == w->doc_off.v[w->doc_off.n - 1])
		return 0;
	return u64vec_push(&w->doc_off, n_sents);
}

shard_counts shard_writer_counts(const shard_writer *w)
{
	uint64_t n_sents = w->sent_off.n - 1;
	uint64_t docs = w->doc_off.n - 1 + (n_sents != w->doc_off.v[w->doc_off.n - 1]);
	return (shard_counts){w->n_tokens, n_sents, docs};
}

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t r = write(fd, b, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static void writer_free(shard_writer *w)
{
	if (w->bin)
		fclose(w->bin);
	free(w->sent_off.v);
	free(w->doc_off.v);
	free(w);
}

int shard_writer_finish(shard_writer *w, shard_counts *counts)
{
	return shard_writer_finish_sums(w, counts, NULL);
}

int shard_writer_finish_sums(shard_writer *w, shard_counts *counts, shard_sums *sums)
{
	int rc = shard_writer_end_document(w);
	int fd = -1;
	if (rc < 0)
		goto out;
	if (fflush(w->bin) != 0 || fsync(fileno(w->bin)) != 0) {
		rc = -errno;
		log_error("shard %s: %s", w->bin_path, strerror(errno));
		goto out;
	}
	idx_header h;
	memset(&h, 0, sizeof h);
	memcpy(h.magic, SHARD_IDX_MAGIC, 8);
	h.version = SHARD_IDX_VERSION;
	h.token_bytes = (uint32_t)w->token_bytes;
	h.n_tokens = w->n_tokens;
	h.n_sents = w->sent_off.n - 1;
	h.n_docs = w->doc_off.n - 1;
	h.vocab_size = w->vocab.vocab_size;
	h.flags = w->vocab.lowercase ? SHARD_FLAG_LOWERCASE : 0;
	const corpus_special *sp = &w->vocab.special;
	uint32_t special[5] = {sp->pad, sp->unk, sp->cls, sp->sep, sp->mask};
	memcpy(h.special, special, sizeof special);
	h.header_bytes = SHARD_IDX_HEADER_BYTES;
	hex_to_bytes(w->vocab.sha256, h.vocab_sha256);
	fd = open(w->idx_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		log_error("shard %s: %s", w->idx_path, strerror(errno));
		goto out;
	}
	if ((rc = write_all(fd, &h, sizeof h)) < 0 ||
	    (rc = write_all(fd, w->sent_off.v, w->sent_off.n * sizeof(uint64_t))) < 0 ||
	    (rc = write_all(fd, w->doc_off.v, w->doc_off.n * sizeof(uint64_t))) < 0)
		goto out;
	if (fsync(fd) != 0)
		rc = -errno;
	if (counts)
		*counts = (shard_counts){h.n_tokens, h.n_sents, h.n_docs};
	if (sums && rc == 0) {
		/* the .idx is exactly what was just written, from memory */
		uint8_t d[32];
		sha256_ctx c;
		sha256_final(&w->bin_sha, d);
		sha256_to_hex(d, sums->bin);
		sha256_init(&c);
		sha256_update(&c, &h, sizeof h);
		sha256_update(&c, w->sent_off.v, w->sent_off.n * sizeof(uint64_t));
		sha256_update(&c, w->doc_off.v, w->doc_off.n * sizeof(uint64_t));
		sha256_final(&c, d);
		sha256_to_hex(d, sums->idx);
	}
out:
	if (rc < 0)
		log_error("shard %s: not written: %s", w->idx_path, strerror(-rc));
	if (fd >= 0 && close(fd) != 0 && rc == 0)
		rc = -errno;
	writer_free(w);
	return rc;
}

void shard_writer_abort(shard_writer *w)
{
	if (!w)
		return;
	unlink(w->bin_path);
	unlink(w->idx_path);
	writer_free(w);
}

/* ---- reader ---- */

struct shard {
	void *idx_map, *bin_map;
	size_t idx_len, bin_len;
	corpus_view view;
	shard_vocab_info vocab;
};

static int map_file(const char *path, void **map, size_t *len)
{
	int rc = 0;
	*map = NULL;
	*len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		log_error("shard %s: %s", path, strerror(errno));
		return rc;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		rc = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		log_error("shard %s: not a regular file", path);
		rc = -EBADMSG;
		goto out;
	}
	*len = (size_t)st.st_size;
	if (*len == 0)
		goto out;
	void *m = mmap(NULL, *len, PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		rc = -errno;
		log_error("shard %s: mmap: %s", path, strerror(errno));
		goto out;
	}
	*map = m;
out:
	close(fd);
	return rc;
}

static int bad(const char *path, const char *why)
{
	log_error("shard %s: %s", path, why);
	return -EBADMSG;
}

int shard_open(const char *dir, const char *name, const char *expect_sha256, shard **out)
{
	int rc = 0;
	char idx_path[4352], bin_path[4352];
	*out = NULL;
	snprintf(idx_path, sizeof idx_path, "%s/%s.idx", dir, name);
	snprintf(bin_path, sizeof bin_path, "%s/%s.bin", dir, name);
	shard *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	if ((rc = map_file(idx_path, &s->idx_map, &s->idx_len)) < 0)
		goto out;
	if (s->idx_len < sizeof(idx_header)) {
		rc = bad(idx_path, "truncated header");
		goto out;
	}
	idx_header h;
	memcpy(&h, s->idx_map, sizeof h);
	if (memcmp(h.magic, SHARD_IDX_MAGIC, 8) != 0) {
		rc = bad(idx_path, "bad magic (not a bertd shard index)");
		goto out;
	}
	if (h.version != SHARD_IDX_VERSION) {
		log_error("shard %s: version %u, this build reads %u", idx_path, h.version,
			  SHARD_IDX_VERSION);
		rc = -ENOTSUP;
		goto out;
	}
	if (h.header_bytes != SHARD_IDX_HEADER_BYTES || (h.token_bytes != 2 && h.token_bytes != 4)) {
		rc = bad(idx_path, "bad header size or token width");
		goto out;
	}
	if (h.vocab_size == 0 || (h.token_bytes == 2 && h.vocab_size > 65536)) {
		rc = bad(idx_path, "vocab size does not fit the token width");
		goto out;
	}
	for (int i = 0; i < 5; i++) {
		if (h.special[i] >= h.vocab_size) {
			rc = bad(idx_path, "special token id out of vocab range");
			goto out;
		}
	}
	/* (n_sents + 1 + n_docs + 1) offsets after the header, overflow-safe */
	uint64_t room = (s->idx_len - sizeof h) / 8;
	if (h.n_sents >= room || h.n_docs >= room - h.n_sents - 1 ||
	    (s->idx_len - sizeof h) % 8 != 0 || h.n_sents + 1 + h.n_docs + 1 != room) {
		rc = bad(idx_path, "size does not match its counts (truncated?)");
		goto out;
	}
	const uint64_t *so = (const uint64_t *)((const char *)s->idx_map + sizeof h);
	const uint64_t *doff = so + h.n_sents + 1;
	if (so[0] != 0 || so[h.n_sents] != h.n_tokens || doff[0] != 0 || doff[h.n_docs] != h.n_sents) {
		rc = bad(idx_path, "offsets do not span the counts");
		goto out;
	}
	for (uint64_t i = 0; i < h.n_sents; i++) {
		if (so[i + 1] <= so[i]) {
			rc = bad(idx_path, "sentence offsets not increasing");
			goto out;
		}
	}
	for (uint64_t i = 0; i < h.n_docs; i++) {
		if (doff[i + 1] <= doff[i]) {
			rc = bad(idx_path, "document offsets not increasing");
			goto out;
		}
	}
	s->vocab.vocab_size = h.vocab_size;
	s->vocab.lowercase = h.flags & SHARD_FLAG_LOWERCASE;
	s->vocab.special = (corpus_special){h.special[0], h.special[1], h.special[2], h.special[3],
					    h.special[4]};
	sha256_to_hex(h.vocab_sha256, s->vocab.sha256);
	if (expect_sha256 && strcmp(expect_sha256, s->vocab.sha256) != 0) {
		log_error("shard %s: made with vocab %.12s..., expected %.12s...", idx_path,
			  s->vocab.sha256, expect_sha256);
		rc = -ESTALE;
		goto out;
	}
	if ((rc = map_file(bin_path, &s->bin_map, &s->bin_len)) < 0)
		goto out;
	if (h.n_tokens > SIZE_MAX / h.token_bytes || s->bin_len != h.n_tokens * h.token_bytes) {
		rc = bad(bin_path, "size does not match the index's token count");
		goto out;
	}
	s->view = (corpus_view){
		.tokens = s->bin_map,
		.token_bytes = (int)h.token_bytes,
		.n_tokens = h.n_tokens,
		.sent_off = so,
		.n_sents = h.n_sents,
		.doc_off = doff,
		.n_docs = h.n_docs,
		.vocab_size = h.vocab_size,
		.special = s->vocab.special,
	};
out:
	if (rc < 0) {
		shard_close(s);
		s = NULL;
	}
	*out = s;
	return rc;
}

const corpus_view *shard_view(const shard *s) { return &s->view; }
const shard_vocab_info *shard_vocab(const shard *s) { return &s->vocab; }

void shard_close(shard *s)
{
	if (!s)
		return;
	if (s->idx_map)
		munmap(s->idx_map, s->idx_len);
	if (s->bin_map)
		munmap(s->bin_map, s->bin_len);
	free(s);
}

/* ---- dataset manifest ---- */

int shard_file_sha256(const char *path, char hex[65])
{
	int rc = 0;
	FILE *f = fopen(path, "rbe");
	if (!f) {
		rc = -errno;
		log_error("dataset: %s: %s", path, strerror(errno));
		return rc;
	}
	sha256_ctx c;
	sha256_init(&c);
	uint8_t buf[1 << 16], d[32];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		sha256_update(&c, buf, n);
	if (ferror(f))
		rc = -EIO;
	fclose(f);
	sha256_final(&c, d);
	sha256_to_hex(d, hex);
	return rc;
}

static int mbad(const char *path, const char *why)
{
	log_error("dataset %s: %s", path, why);
	return -EBADMSG;
}

static bool get_u64(json_t *o, const char *k, uint64_t *v)
{
	json_t *x = json_object_get(o, k);
	if (!json_is_integer(x) || json_integer_value(x) < 0)
		return false;
	*v = (uint64_t)json_integer_value(x);
	return true;
}

int shard_dataset_open(const char *dir, shard_dataset **out)
{
	int rc = 0;
	json_t *m = NULL;
	char path[4352];
	*out = NULL;
	shard_dataset *d = calloc(1, sizeof *d);
	if (!d)
		return -ENOMEM;
	if (strlen(dir) >= sizeof d->dir) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	snprintf(d->dir, sizeof d->dir, "%s", dir);
	snprintf(path, sizeof path, "%s/%s", dir, SHARD_MANIFEST_NAME);
	json_error_t jerr;
	m = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!m) {
		if (access(path, F_OK) != 0) {
			rc = -errno;
			log_error("dataset %s: no manifest: %s", dir, strerror(errno));
		} else {
			rc = mbad(path, jerr.text);
		}
		goto out;
	}
	json_t *fmt = json_object_get(m, "format");
	uint64_t ver = 0;
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), SHARD_MANIFEST_FORMAT) != 0 ||
	    !get_u64(m, "version", &ver)) {
		rc = mbad(path, "not a bertd dataset manifest");
		goto out;
	}
	if (ver != SHARD_MANIFEST_VERSION) {
		log_error("dataset %s: manifest version %llu unsupported", dir, (unsigned long long)ver);
		rc = -ENOTSUP;
		goto out;
	}
	json_t *voc = json_object_get(m, "vocab");
	json_t *vfile = json_object_get(voc, "file"), *vsha = json_object_get(voc, "sha256");
	json_t *vlow = json_object_get(voc, "lowercase");
	uint64_t vsize = 0;
	if (!json_is_string(vfile) || !json_is_string(vsha) || !json_is_boolean(vlow) ||
	    !get_u64(voc, "size", &vsize) || strchr(json_string_value(vfile), '/')) {
		rc = mbad(path, "bad \"vocab\" object");
		goto out;
	}
	snprintf(d->vocab_path, sizeof d->vocab_path, "%s/%s", dir, json_string_value(vfile));
	char sha[65];
	if ((rc = shard_file_sha256(d->vocab_path, sha)) < 0)
		goto out;
	if (strcmp(sha, json_string_value(vsha)) != 0) {
		log_error("dataset %s: %s does not match the manifest's sha256", dir, d->vocab_path);
		rc = -ESTALE;
		goto out;
	}
	json_t *shards = json_object_get(m, "shards");
	if (!json_is_array(shards) || json_array_size(shards) == 0) {
		rc = mbad(path, "no \"shards\"");
		goto out;
	}
	d->n_shards = json_array_size(shards);
	d->shards = calloc(d->n_shards, sizeof *d->shards);
	d->views = calloc(d->n_shards, sizeof *d->views);
	if (!d->shards || !d->views) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < d->n_shards; i++) {
		json_t *e = json_array_get(shards, i), *nm = json_object_get(e, "name");
		shard_counts want;
		if (!json_is_string(nm) || !name_ok(json_string_value(nm)) ||
		    !get_u64(e, "tokens", &want.tokens) || !get_u64(e, "sentences", &want.sents) ||
		    !get_u64(e, "documents", &want.docs)) {
			rc = mbad(path, "bad shard entry");
			goto out;
		}
		if ((rc = shard_open(dir, json_string_value(nm), sha, &d->shards[i])) < 0)
			goto out;
		const corpus_view *v = shard_view(d->shards[i]);
		const shard_vocab_info *sv = shard_vocab(d->shards[i]);
		if (v->n_tokens != want.tokens || v->n_sents != want.sents || v->n_docs != want.docs ||
		    sv->vocab_size != vsize || sv->lowercase != json_is_true(vlow)) {
			rc = mbad(path, "a shard disagrees with the manifest");
			goto out;
		}
		d->views[i] = *v;
		d->totals.tokens += v->n_tokens;
		d->totals.sents += v->n_sents;
		d->totals.docs += v->n_docs;
		if (i == 0)
			d->vocab = *sv;
	}
out:
	json_decref(m);
	if (rc < 0) {
		shard_dataset_close(d);
		d = NULL;
	}
	*out = d;
	return rc;
}

void shard_dataset_close(shard_dataset *d)
{
	if (!d)
		return;
	for (size_t i = 0; d->shards && i < d->n_shards; i++)
		shard_close(d->shards[i]);
	free(d->shards);
	free(d->views);
	free(d);
}

/* ---- a dataset made elsewhere ---- */

static int vfail(char *file, size_t fcap, char *why, size_t wcap, int rc, const char *name,
		 const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static int vfail(char *file, size_t fcap, char *why, size_t wcap, int rc, const char *name,
		 const char *fmt, ...)
{
	snprintf(file, fcap, "%s", name);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, wcap, fmt, ap);
	va_end(ap);
	return rc;
}

/* A plain file of dir (never a link: what is checked is what is used). */
static int regular_in(const char *dir, const char *name)
{
	char p[4352];
	struct stat st;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	if (lstat(p, &st) != 0)
		return -errno;
	return S_ISREG(st.st_mode) ? 0 : -EBADMSG;
}

int shard_dataset_verify(const char *dir, char *file, size_t fcap, char *why, size_t wcap,
			 bool *had_sums)
{
	int rc = 0;
	json_t *m = NULL;
	shard_dataset *d = NULL;
	char path[4352], sha[65];
	bool sums = false;
	file[0] = why[0] = 0;
	if ((rc = regular_in(dir, SHARD_MANIFEST_NAME)) < 0) {
		rc = vfail(file, fcap, why, wcap, rc, SHARD_MANIFEST_NAME, "%s",
			   rc == -ENOENT ? "missing: not a dataset made by bertd-prepare" : rc == -EBADMSG
			   ? "not a regular file" : strerror(-rc));
		goto out;
	}
	snprintf(path, sizeof path, "%s/%s", dir, SHARD_MANIFEST_NAME);
	json_error_t jerr;
	if (!(m = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr))) {
		rc = vfail(file, fcap, why, wcap, -EBADMSG, SHARD_MANIFEST_NAME, "not JSON: %s", jerr.text);
		goto out;
	}
	json_t *fmt = json_object_get(m, "format"), *voc = json_object_get(m, "vocab");
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), SHARD_MANIFEST_FORMAT) != 0 ||
	    !json_is_integer(json_object_get(m, "version"))) {
		rc = vfail(file, fcap, why, wcap, -EBADMSG, SHARD_MANIFEST_NAME, "not a bertd dataset manifest");
		goto out;
	}
	if (json_integer_value(json_object_get(m, "version")) != SHARD_MANIFEST_VERSION) {
		rc = vfail(file, fcap, why, wcap, -ENOTSUP, SHARD_MANIFEST_NAME,
			   "manifest version %lld; this bertd reads %d",
			   (long long)json_integer_value(json_object_get(m, "version")), SHARD_MANIFEST_VERSION);
		goto out;
	}
	const char *vname = json_string_value(json_object_get(voc, "file"));
	const char *vsha = json_string_value(json_object_get(voc, "sha256"));
	if (!vname || !vsha || strchr(vname, '/') || vname[0] == '.') {
		rc = vfail(file, fcap, why, wcap, -EBADMSG, SHARD_MANIFEST_NAME, "bad \"vocab\" object");
		goto out;
	}
	snprintf(path, sizeof path, "%s/%s", dir, vname);
	if ((rc = regular_in(dir, vname)) < 0 || (rc = shard_file_sha256(path, sha)) < 0) {
		rc = vfail(file, fcap, why, wcap, rc, vname, "%s",
			   rc == -EBADMSG ? "not a regular file" : strerror(-rc));
		goto out;
	}
	if (strcmp(sha, vsha) != 0) {
		rc = vfail(file, fcap, why, wcap, -ESTALE, vname,
			   "sha256 %.12s... differs from the manifest's %.12s...", sha, vsha);
		goto out;
	}
	json_t *shards = json_object_get(m, "shards"), *e;
	size_t i;
	json_array_foreach(shards, i, e) {
		const char *nm = json_string_value(json_object_get(e, "name"));
		if (!nm || !name_ok(nm)) {
			rc = vfail(file, fcap, why, wcap, -EBADMSG, SHARD_MANIFEST_NAME, "shard %zu: bad name", i);
			goto out;
		}
		static const char *const ext[2] = {"idx", "bin"};
		for (int k = 0; k < 2; k++) {
			char fname[300];
			const char *want = json_string_value(json_object_get(e, k ? "bin_sha256" : "idx_sha256"));
			snprintf(fname, sizeof fname, "%s.%s", nm, ext[k]);
			snprintf(path, sizeof path, "%s/%s", dir, fname);
			if ((rc = regular_in(dir, fname)) < 0) {
				rc = vfail(file, fcap, why, wcap, rc, fname, "%s",
					   rc == -EBADMSG ? "not a regular file" : strerror(-rc));
				goto out;
			}
			if (!want)
				continue;
			sums = true;
			if ((rc = shard_file_sha256(path, sha)) < 0) {
				rc = vfail(file, fcap, why, wcap, rc, fname, "%s", strerror(-rc));
				goto out;
			}
			if (strcmp(sha, want) != 0) {
				rc = vfail(file, fcap, why, wcap, -EBADMSG, fname,
					   "sha256 %.12s... differs from the manifest's %.12s... (changed or damaged)",
					   sha, want);
				goto out;
			}
		}
	}
	/* the digests match (or there are none): the structure and counts */
	if ((rc = shard_dataset_open(dir, &d)) < 0) {
		const char *nm = NULL;
		json_array_foreach(shards, i, e) {
			shard *one = NULL;
			const char *x = json_string_value(json_object_get(e, "name"));
			if (shard_open(dir, x, NULL, &one) < 0) {
				nm = x;
				break;
			}
			shard_close(one);
		}
		char fname[300];
		snprintf(fname, sizeof fname, "%s.idx", nm ? nm : "");
		rc = vfail(file, fcap, why, wcap, rc, nm ? fname : SHARD_MANIFEST_NAME, "%s",
			   nm ? "not a valid shard index, or its .bin does not match it"
			      : "the manifest disagrees with the shards (counts, vocab)");
		goto out;
	}
	json_t *tot = json_object_get(m, "totals");
	uint64_t tt = 0;
	if (!get_u64(tot, "tokens", &tt) || tt != d->totals.tokens) {
		rc = vfail(file, fcap, why, wcap, -EBADMSG, SHARD_MANIFEST_NAME,
			   "totals.tokens disagrees with the shards' %llu tokens",
			   (unsigned long long)d->totals.tokens);
		goto out;
	}
out:
	shard_dataset_close(d);
	json_decref(m);
	if (had_sums)
		*had_sums = sums;
	return rc;
}
