/* libFuzzer target for jobspec: any bytes that parse as JSON must be either
 * refused with a well-formed error or normalized into a fixed point that
 * jobspec_from_json accepts. Build and run: see README. Never linked into
 * bertd or the test suite. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_error_t jerr;
	json_t *in = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	if (!in)
		return 0;
	json_t *out = NULL, *again = NULL;
	jobspec_error err;
	jobspec spec;
	int rc = jobspec_normalize(in, &out, &err);
	if (rc != 0) {
		CHECK(rc == -EINVAL || rc == -ENOMEM);
		CHECK(err.status == (json_is_object(in) ? 422 : 400) || rc == -ENOMEM);
		CHECK(memchr(err.field, 0, sizeof err.field) && memchr(err.detail, 0, sizeof err.detail));
		CHECK(err.detail[0] != '\0');
		json_t *f = json_string(err.field); /* NULL if not valid UTF-8 */
		CHECK(f);
		json_decref(f);
		/* a refused spec is not an effective one either */
		CHECK(jobspec_from_json(in, &spec, &err) != 0);
		json_decref(in);
		return 0;
	}
	CHECK(jobspec_normalize(out, &again, &err) == 0);
	CHECK(json_equal(out, again));
	char *a = json_dumps(out, 0), *b = json_dumps(again, 0);
	CHECK(a && b && strcmp(a, b) == 0);
	free(a);
	free(b);
	/* what only the API resolves (training by epochs, a job reference as
	 * init_from) is normalized but never read by a worker */
	json_t *ms = json_object_get(json_object_get(out, "training_args"), "max_steps");
	bool unresolved = json_integer_value(ms) == -1 ||
			  json_is_object(json_object_get(out, "init_from"));
	CHECK((jobspec_from_json(out, &spec, &err) == 0) == !unresolved);
	CHECK((jobspec_from_json(in, &spec, &err) == 0) == (json_equal(in, out) && !unresolved));
	json_decref(again);
	json_decref(out);
	json_decref(in);
	return 0;
}
