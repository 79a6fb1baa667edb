/* tbevents — see tbevents.h.
 *
 * Why the records are written by hand and not with protobuf-c. bertd only
 * writes, and only three messages with six fields between them:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * Their wire encoding (a key byte, a varint or a fixed 4/8-byte little-endian
 * value, length-prefixed submessages) is about forty lines below. protobuf-c
 * would add a build-time code generator (protoc-c, which pulls in the C++
 * protobuf compiler), two vendored .proto files from TensorFlow, and a
 * runtime library to the daemon, for the same bytes. TensorBoard keeps these
 * field numbers fixed (every event file ever written must stay readable), so
 * the hand encoding cannot drift; the integration test reads the files back
 * with TensorBoard's own reader, an independent decoder.
 *
 * TFRecord framing around each serialized Event:
 *   uint64 length, uint32 masked_crc32c(length), data, uint32 masked_crc32c(data)
 * all little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
 *
 * One file per job directory per daemon process: its name carries the
 * process's first write time and pid, so a restarted daemon starts a new
 * file and TensorBoard merges the files of a directory. A file is opened
 * with O_APPEND for each row and closed after it (rows come every
 * logging_steps, so this costs nothing), which needs no per-job state here;
 * a new (empty) file gets the "brain.Event:2" version record first.
 */
#include "daemon/tbevents.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"

#define MAX_SCALARS 64       /* per row: 4 train + 3 eval + phase shares */
#define TAG_MAX 64

uint32_t tbevents_crc32c(const void *data, size_t n)
{
	const uint8_t *p = data;
	uint32_t crc = 0xffffffffu;
	for (size_t i = 0; i < n; i++) {
		crc ^= p[i];
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
	}
	return ~crc;
}

uint32_t tbevents_masked_crc(uint32_t crc)
{
	return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* A bounded writer: counts every byte, stores those that fit. */
typedef struct wbuf {
	uint8_t *p;
	size_t cap, len;
} wbuf;

static void put(wbuf *b, const void *src, size_t n)
{
	if (b->len < b->cap)
		memcpy(b->p + b->len, src, b->len + n <= b->cap ? n : b->cap - b->len);
	b->len += n;
}

static void put_varint(wbuf *b, uint64_t v)
{
	uint8_t tmp[10];
	size_t n = 0;
	do {
		tmp[n] = (uint8_t)(v & 0x7f);
		v >>= 7;
		if (v)
			tmp[n] |= 0x80;
		n++;
	} while (v);
	put(b, tmp, n);
}

static size_t varint_len(uint64_t v)
{
	size_t n = 1;
	while (v >>= 7)
		n++;
	return n;
}

static void put_le(wbuf *b, uint64_t v, size_t bytes)
{
	uint8_t tmp[8];
	for (size_t i = 0; i < bytes; i++)
		tmp[i] = (uint8_t)(v >> (8 * i));
	put(b, tmp, bytes);
}

/* key byte: field number << 3 | wire type (0 varint, 1 fixed64, 2 bytes, 5 fixed32) */
static void put_key(wbuf *b, unsigned field, unsigned wire)
{
	put_varint(b, (uint64_t)(field << 3 | wire));
}

static size_t value_len(const tbevents_scalar *s)
{
	size_t t = strlen(s->tag);
	return 1 + varint_len(t) + t + 1 + 4;
}

size_t tbevents_encode_event(uint8_t *out, size_t cap, double wall_time, int64_t step,
			     const char *file_version, const tbevents_scalar *v, size_t n)
{
	wbuf b = {out, cap, 0};
	uint64_t bits;
	memcpy(&bits, &wall_time, 8);
	put_key(&b, 1, 1);
	put_le(&b, bits, 8);
	put_key(&b, 2, 0);
	put_varint(&b, (uint64_t)step); /* int64: negatives take ten bytes */
	if (file_version) {
		size_t fl = strlen(file_version);
		put_key(&b, 3, 2);
		put_varint(&b, fl);
		put(&b, file_version, fl);
	}
	if (n) {
		size_t sum = 0;
		for (size_t i = 0; i < n; i++)
			sum += 1 + varint_len(value_len(&v[i])) + value_len(&v[i]);
		put_key(&b, 5, 2);
		put_varint(&b, sum);
		for (size_t i = 0; i < n; i++) {
			size_t t = strlen(v[i].tag);
			uint32_t fbits;
			memcpy(&fbits, &v[i].value, 4);
			put_key(&b, 1, 2);
			put_varint(&b, value_len(&v[i]));
			put_key(&b, 1, 2);
			put_varint(&b, t);
			put(&b, v[i].tag, t);
			put_key(&b, 2, 5);
			put_le(&b, fbits, 4);
		}
	}
	return b.len;
}

size_t tbevents_frame(uint8_t *out, const uint8_t *data, size_t n)
{
	wbuf b = {out, n + 16, 0};
	uint8_t len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (uint8_t)((uint64_t)n >> (8 * i));
	put(&b, len, 8);
	put_le(&b, tbevents_masked_crc(tbevents_crc32c(len, 8)), 4);
	put(&b, data, n);
	put_le(&b, tbevents_masked_crc(tbevents_crc32c(data, n)), 4);
	return b.len;
}

/* Appends one framed event to buf (grown as needed). */
static int append_record(uint8_t **buf, size_t *len, double wall, int64_t step,
			 const char *file_version, const tbevents_scalar *v, size_t n)
{
	size_t ev = tbevents_encode_event(NULL, 0, wall, step, file_version, v, n);
	uint8_t *grown = realloc(*buf, *len + ev + 16);
	if (!grown)
		return -ENOMEM;
	*buf = grown;
	uint8_t *data = malloc(ev);
	if (!data)
		return -ENOMEM;
	tbevents_encode_event(data, ev, wall, step, file_version, v, n);
	*len += tbevents_frame(*buf + *len, data, ev);
	free(data);
	return 0;
}

static bool finite_number(json_t *j, double *out)
{
	if (!json_is_number(j) || !isfinite(json_number_value(j)))
		return false;
	*out = json_number_value(j);
	return true;
}

/* The row's scalars; tags point into names (n_max entries of TAG_MAX). */
static size_t row_scalars(json_t *row, tbevents_scalar *v, char (*names)[TAG_MAX], size_t n_max)
{
	static const struct { const char *field, *tag; } train[] = {
		{"loss", "train/loss"},
		{"learning_rate", "train/learning_rate"},
		{"grad_norm", "train/grad_norm"},
		{"tokens_per_s", "train/tokens_per_s"},
	};
	size_t n = 0;
	double x, step_ms;
	for (size_t i = 0; i < sizeof train / sizeof train[0]; i++)
		if (finite_number(json_object_get(row, train[i].field), &x))
			v[n++] = (tbevents_scalar){train[i].tag, (float)x};
	if (finite_number(json_object_get(row, "eval_loss"), &x)) {
		v[n++] = (tbevents_scalar){"eval/loss", (float)x};
		double ppl = exp(x);
		if (isfinite(ppl))
			v[n++] = (tbevents_scalar){"eval/perplexity", (float)ppl};
	}
	if (finite_number(json_object_get(row, "eval_accuracy"), &x))
		v[n++] = (tbevents_scalar){"eval/accuracy", (float)x};
	json_t *phases = json_object_get(row, "phases_ms");
	if (json_is_object(phases) && finite_number(json_object_get(row, "step_time_ms"), &step_ms) &&
	    step_ms > 0) {
		const char *phase;
		json_t *ms;
		json_object_foreach(phases, phase, ms) {
			if (n == n_max || !finite_number(ms, &x))
				continue;
			int w = snprintf(names[n], TAG_MAX, "time/%s_share", phase);
			if (w < 0 || w >= TAG_MAX)
				continue;
			v[n] = (tbevents_scalar){names[n], (float)(x / step_ms)};
			n++;
		}
	}
	return n;
}

/* This process's file name, the same for every job: fixed at first use. */
static const char *file_name(void)
{
	static char name[256];
	if (!name[0]) {
		char host[HOST_NAME_MAX + 1] = "localhost";
		if (gethostname(host, sizeof host) < 0)
			snprintf(host, sizeof host, "localhost");
		host[HOST_NAME_MAX] = '\0';
		for (char *p = host; *p; p++)
			if (*p == '/')
				*p = '_';
		snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%ld.0", (long long)time(NULL),
			 host, (long)getpid());
	}
	return name;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int tbevents_append_row(const char *job_dir, int64_t step, int64_t wall_ms, json_t *row)
{
	static char warned_dir[1024]; /* the last job directory a failure was logged for */
	tbevents_scalar v[MAX_SCALARS];
	char names[MAX_SCALARS][TAG_MAX];
	char dir[1024], path[1400] = "";
	uint8_t *buf = NULL;
	size_t len = 0;
	int fd = -1, rc;

	size_t n = row_scalars(row, v, names, MAX_SCALARS);
	if (n == 0)
		return 0;
	if ((size_t)snprintf(dir, sizeof dir, "%s/tensorboard", job_dir) >= sizeof dir) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	snprintf(path, sizeof path, "%s/%s", dir, file_name());
	if ((rc = fs_mkdir_p(dir, 0755)) < 0)
		goto out;
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	double wall = (double)wall_ms / 1000.0;
	if (st.st_size == 0 && (rc = append_record(&buf, &len, wall, 0, "brain.Event:2", NULL, 0)) < 0)
		goto out;
	if ((rc = append_record(&buf, &len, wall, step, NULL, v, n)) < 0)
		goto out;
	rc = write_all(fd, buf, len);
out:
	if (fd >= 0 && close(fd) < 0 && rc == 0)
		rc = -errno;
	free(buf);
	if (rc < 0 && strcmp(warned_dir, job_dir) != 0) {
		log_warn("tensorboard: cannot write %s: %s (training goes on; further errors for this job not logged)",
			 path[0] ? path : job_dir, strerror(-rc));
		snprintf(warned_dir, sizeof warned_dir, "%s", job_dir);
	}
	return rc;
}
