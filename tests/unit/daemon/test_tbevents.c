/* tbevents: the TensorBoard event records bertd writes. CRC-32C against
 * published check values, one Event's bytes against an encoding worked out
 * by hand from the protobuf wire format, and rows appended through
 * tbevents_append_row decoded back by a small TFRecord/protobuf reader
 * written here (TensorBoard's own reader: tests/integration/test_tensorboard.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "daemon/tbevents.h"

static char root[64];

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof root, "/tmp/bertd-tbevents-XXXXXX");
	return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	return fs_remove_tree(root) < 0 ? -1 : 0;
}

static void test_crc32c_check_values(void **state)
{
	(void)state;
	uint8_t zeros[32] = {0}, ones[32];
	memset(ones, 0xff, sizeof ones);
	/* the CRC catalogue's check value, and RFC 3720 B.4's vectors */
	assert_int_equal(tbevents_crc32c("123456789", 9), 0xe3069283u);
	assert_int_equal(tbevents_crc32c(zeros, 32), 0x8a9136aau);
	assert_int_equal(tbevents_crc32c(ones, 32), 0x62a8ab43u);
	assert_int_equal(tbevents_crc32c("", 0), 0u);
	/* TFRecord's mask: rotate right 15, add 0xa282ead8 */
	assert_int_equal(tbevents_masked_crc(0), 0xa282ead8u);
	assert_int_equal(tbevents_masked_crc(0x00008000u), 0xa282ead9u);
}

static void test_event_bytes(void **state)
{
	(void)state;
	/* Event{wall_time: 1.0, step: 3, summary{value{tag: "a", simple_value: 1.0}}} */
	static const uint8_t want[] = {
		0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, /* field 1 fixed64: 1.0 */
		0x10, 0x03,                         /* field 2 varint: 3 */
		0x2a, 0x0a,                         /* field 5, 10 bytes: Summary */
		0x0a, 0x08,                         /*   field 1, 8 bytes: Value */
		0x0a, 0x01, 'a',                    /*     tag */
		0x15, 0, 0, 0x80, 0x3f,             /*     simple_value fixed32: 1.0f */
	};
	tbevents_scalar v = {"a", 1.0f};
	uint8_t out[64];
	assert_int_equal(tbevents_encode_event(NULL, 0, 1.0, 3, NULL, &v, 1), sizeof want);
	assert_int_equal(tbevents_encode_event(out, sizeof out, 1.0, 3, NULL, &v, 1), sizeof want);
	assert_memory_equal(out, want, sizeof want);
	/* a short buffer: the length still comes back, nothing past cap written */
	memset(out, 0xee, sizeof out);
	assert_int_equal(tbevents_encode_event(out, 5, 1.0, 3, NULL, &v, 1), sizeof want);
	assert_memory_equal(out, want, 5);
	assert_int_equal(out[5], 0xee);
	/* file_version record, step 300 (two-byte varint) */
	static const uint8_t ver[] = {0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 0xac, 0x02,
				      0x1a, 0x0d, 'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':', '2'};
	assert_int_equal(tbevents_encode_event(out, sizeof out, 2.0, 300, "brain.Event:2", NULL, 0), sizeof ver);
	assert_memory_equal(out, ver, sizeof ver);
}

/* --- a minimal reader: TFRecords of Events of simple_value scalars --- */

typedef struct dscalar {
	char tag[64];
	float value;
} dscalar;

typedef struct devent {
	double wall;
	int64_t step;
	char version[32];
	dscalar v[32];
	int n;
} devent;

static uint64_t rd_varint(const uint8_t **p, const uint8_t *end)
{
	uint64_t v = 0;
	for (int shift = 0; *p < end; shift += 7) {
		uint8_t b = *(*p)++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return v;
	}
	fail_msg("truncated varint");
	return 0;
}

static uint64_t rd_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void decode_value(const uint8_t *p, const uint8_t *end, dscalar *s)
{
	while (p < end) {
		uint64_t key = rd_varint(&p, end);
		if (key == 0x0a) {
			uint64_t n = rd_varint(&p, end);
			assert_true(n < sizeof s->tag && p + n <= end);
			memcpy(s->tag, p, n);
			s->tag[n] = 0;
			p += n;
		} else if (key == 0x15) {
			uint32_t bits = (uint32_t)rd_le(p, 4);
			memcpy(&s->value, &bits, 4);
			p += 4;
		} else {
			fail_msg("unexpected Value key %llu", (unsigned long long)key);
		}
	}
}

static void decode_event(const uint8_t *p, const uint8_t *end, devent *e)
{
	memset(e, 0, sizeof *e);
	while (p < end) {
		uint64_t key = rd_varint(&p, end), n, bits;
		switch (key) {
		case 0x09:
			bits = rd_le(p, 8);
			memcpy(&e->wall, &bits, 8);
			p += 8;
			break;
		case 0x10:
			e->step = (int64_t)rd_varint(&p, end);
			break;
		case 0x1a:
			n = rd_varint(&p, end);
			assert_true(n < sizeof e->version);
			memcpy(e->version, p, n);
			p += n;
			break;
		case 0x2a: {
			n = rd_varint(&p, end);
			const uint8_t *send = p + n;
			assert_true(send <= end);
			while (p < send) {
				assert_int_equal(rd_varint(&p, send), 0x0a);
				uint64_t vn = rd_varint(&p, send);
				assert_true(e->n < 32);
				decode_value(p, p + vn, &e->v[e->n++]);
				p += vn;
			}
			break;
		}
		default:
			fail_msg("unexpected Event key %llu", (unsigned long long)key);
		}
	}
}

/* Reads every record of the one event file in dir. */
static int read_events(const char *dir, devent *ev, int cap)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *de;
	char path[512] = "";
	int files = 0;
	while ((de = readdir(d)))
		if (strncmp(de->d_name, "events.out.tfevents.", 20) == 0) {
			snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
			files++;
		}
	closedir(d);
	assert_int_equal(files, 1);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static uint8_t buf[1 << 16];
	size_t len = fread(buf, 1, sizeof buf, f);
	fclose(f);
	int n = 0;
	for (size_t at = 0; at < len;) {
		assert_true(at + 12 <= len);
		uint64_t rl = rd_le(buf + at, 8);
		assert_int_equal(rd_le(buf + at + 8, 4), tbevents_masked_crc(tbevents_crc32c(buf + at, 8)));
		assert_true(at + 16 + rl <= len);
		assert_int_equal(rd_le(buf + at + 12 + rl, 4),
				 tbevents_masked_crc(tbevents_crc32c(buf + at + 12, rl)));
		assert_true(n < cap);
		decode_event(buf + at + 12, buf + at + 12 + rl, &ev[n++]);
		at += 16 + rl;
	}
	return n;
}

static const dscalar *find(const devent *e, const char *tag)
{
	for (int i = 0; i < e->n; i++)
		if (strcmp(e->v[i].tag, tag) == 0)
			return &e->v[i];
	return NULL;
}

static void test_rows_read_back(void **state)
{
	(void)state;
	char job[128], tb[160];
	snprintf(job, sizeof job, "%s/job-1", root);
	snprintf(tb, sizeof tb, "%s/tensorboard", job);
	assert_int_equal(mkdir(job, 0755), 0);
	json_t *r1 = json_loads("{\"epoch\":0,\"loss\":6.5,\"learning_rate\":1e-4,\"grad_norm\":2.25,"
				"\"tokens_per_s\":1234.5,\"step_time_ms\":80.0,"
				"\"phases_ms\":{\"data_wait\":4.0,\"compute\":60.0,\"optimizer\":16.0}}", 0, NULL);
	/* eval fields; a null grad norm and a string are left out */
	json_t *r2 = json_loads("{\"loss\":5.0,\"learning_rate\":5e-5,\"grad_norm\":null,"
				"\"tokens_per_s\":\"fast\",\"eval_loss\":2.0}", 0, NULL);
	assert_int_equal(tbevents_append_row(job, 5, 1700000000123, r1), 0);
	assert_int_equal(tbevents_append_row(job, 10, 1700000001000, r2), 0);
	json_decref(r1);
	json_decref(r2);

	devent ev[8];
	assert_int_equal(read_events(tb, ev, 8), 3);
	assert_string_equal(ev[0].version, "brain.Event:2");
	assert_int_equal(ev[0].n, 0);
	assert_int_equal(ev[1].step, 5);
	assert_true(fabs(ev[1].wall - 1700000000.123) < 1e-6);
	assert_int_equal(ev[1].n, 7);
	assert_true(find(&ev[1], "train/loss")->value == 6.5f);
	assert_true(find(&ev[1], "train/learning_rate")->value == 1e-4f);
	assert_true(find(&ev[1], "train/grad_norm")->value == 2.25f);
	assert_true(find(&ev[1], "train/tokens_per_s")->value == 1234.5f);
	assert_true(find(&ev[1], "time/data_wait_share")->value == 0.05f);
	assert_true(find(&ev[1], "time/compute_share")->value == 0.75f);
	assert_true(find(&ev[1], "time/optimizer_share")->value == 0.2f);
	assert_null(find(&ev[1], "eval/loss"));
	assert_int_equal(ev[2].step, 10);
	assert_int_equal(ev[2].n, 4);
	assert_true(find(&ev[2], "train/loss")->value == 5.0f);
	assert_null(find(&ev[2], "train/grad_norm"));
	assert_null(find(&ev[2], "train/tokens_per_s"));
	assert_true(find(&ev[2], "eval/loss")->value == 2.0f);
	assert_true(find(&ev[2], "eval/perplexity")->value == (float)exp(2.0));
}

static void test_write_error_is_returned(void **state)
{
	(void)state;
	char job[128], blocker[160];
	snprintf(job, sizeof job, "%s/job-2", root);
	snprintf(blocker, sizeof blocker, "%s/tensorboard", job);
	assert_int_equal(mkdir(job, 0755), 0);
	FILE *f = fopen(blocker, "w"); /* a file where the directory goes */
	assert_non_null(f);
	fclose(f);
	json_t *r = json_loads("{\"loss\":1.0}", 0, NULL);
	assert_true(tbevents_append_row(job, 1, 0, r) < 0);
	assert_true(tbevents_append_row(job, 2, 0, r) < 0); /* again: logged once, still an error */
	json_decref(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crc32c_check_values),
		cmocka_unit_test(test_event_bytes),
		cmocka_unit_test(test_rows_read_back),
		cmocka_unit_test(test_write_error_is_returned),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
