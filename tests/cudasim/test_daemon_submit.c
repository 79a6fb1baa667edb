/* What a GPU's compute capability decides at submit: bertd with --devices
 * cuda over the stand-in NVML (tests/unit/daemon/fake_nvml.c: two GPUs of
 * the compute capability FAKE_NVML_CC names), the queue held (--schedule
 * false: nothing runs, only the answers to POST /v1/jobs are checked):
 *   - on V100s (7.0), "bf16": true is 422 naming training_args.bf16, the
 *     GPU and what to use instead, and fp16 is accepted (201);
 *   - on H200s (9.0), the same bf16 job is accepted.
 * Env (meson.build): BERTD_BIN, IT_CUDASIM_BIN_DIR (the daemon's --bin-dir,
 * with bertd-prepare), LD_LIBRARY_PATH (the stand-in NVML). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define JOB(precision)                                                                    \
	"{\"dataset\":\"shakes\"," IT_TINY_MODEL("1") ",\"resources\":{\"gpus\":2,\"device\":\"cuda\"}," \
	"\"training_args\":{\"max_steps\":2,\"max_seq_length\":32," precision "}}"

/* A daemon on "GPUs" of compute capability cc with a dataset (preparing is
 * enough: a job may wait for it). */
static it_fx *start(const char *cc)
{
	setenv("FAKE_NVML_CC", cc, 1); /* read by the daemon's NVML at start */
	const char *bin = getenv("IT_CUDASIM_BIN_DIR");
	const char *extra[] = {"--bin-dir", bin ? bin : "/nonexistent", NULL};
	it_daemon_opts o = {.devices = "cuda", .cpu_slots = "1", .schedule = "false", .extra = extra, .dataset = "shakes",
			    .corpus = "shakes.txt", .corpus_lines = 300, .vocab_size = 300};
	it_fx *f = it_daemon_start(&o, 120);
	assert_non_null(f);
	return f;
}

static void submit(const it_fx *f, const char *spec, long want, http_resp *r)
{
	assert_int_equal(http_post_json(&f->d, "/v1/jobs", spec, r), 0);
	if (r->status != want)
		fail_msg("POST /v1/jobs %s: %ld %s (expected %ld)", spec, r->status, r->body, want);
}

static void test_bf16_needs_sm80(void **state)
{
	(void)state;
	it_fx *f = start("7.0");
	http_resp r;
	submit(f, JOB("\"bf16\":true"), 422, &r);
	json_t *p = json_loads(r.body, 0, NULL);
	assert_non_null(p);
	assert_string_equal(it_jstr(p, "field"), "training_args.bf16");
	const char *detail = it_jstr(p, "detail");
	if (!strstr(detail, "7.0") || !strstr(detail, "fp16") || !strstr(detail, "NVIDIA Fake H200"))
		fail_msg("the answer does not name the GPU, its compute capability and fp16: %s", detail);
	json_decref(p);
	http_resp_free(&r);
	submit(f, JOB("\"fp16\":true"), 201, &r);
	http_resp_free(&r);
	assert_int_equal(it_daemon_stop(f), 0);

	f = start("9.0");
	submit(f, JOB("\"bf16\":true"), 201, &r);
	http_resp_free(&r);
	assert_int_equal(it_daemon_stop(f), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_bf16_needs_sm80)};
	return IT_RUN(tests, NULL, NULL);
}
