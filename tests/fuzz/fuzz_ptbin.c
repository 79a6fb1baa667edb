/* libFuzzer target for worker/ptbin.c, the pytorch_model.bin reader: any
 * bytes are either refused with a message (non-empty, NUL-terminated, never
 * the forbidden global's name) or give tensors that lie inside the input
 * and read back (every float tensor through st_read_f32). Build and run: see
 * README. Never linked into bertd or the test suite. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ptbin.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	st_file *f = NULL;
	char err[512];
	memset(err, 'x', sizeof err);
	int rc = ptbin_parse(&f, data, size, err, sizeof err);
	if (rc != 0) {
		CHECK(rc == -EINVAL || rc == -ENOMEM);
		CHECK(f == NULL);
		CHECK(memchr(err, 0, sizeof err) && err[0] != 0);
		return 0;
	}
	for (int i = 0; i < f->n; i++) {
		const st_tensor *t = &f->tensors[i];
		CHECK(t->name && t->begin <= t->end && t->end <= size);
		CHECK(st_find(f, t->name) != NULL);
		size_t n = st_numel(t);
		if ((t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16) && n <= (1u << 20)) {
			float *dst = malloc((n ? n : 1) * sizeof *dst);
			CHECK(dst && st_read_f32(f, t, dst, n) == 0);
			free(dst);
		}
	}
	st_close(f);
	return 0;
}
