/* What a GPU's compute capability decides at submit: bertd with --devices
 * cuda over the stand-in NVML (tests/unit/daemon/fake_nvml.c: two GPUs of
 * the compute capability FAKE_NVML_CC names), the queue held (--schedule
 * false: nothing runs, only the answers to POST /v1/jobs are checked):
 *   - on V100s (7.0), "bf16": true is 422 naming training_args.bf16, the
 *     GPU and what to use instead, and fp16 is accepted (201);
 *   - on H200s (9.0), the same bf16 job is accepted.
 * And what NCCL decides: with nccl_path at a directory without a
 * loadable libnccl.so.2 (the bin dir) or at no file at all, GET /v1/version
 * says "nccl": null and a 2-GPU job is 422 naming resources.gpus and what
 * to install, a 1-GPU job 201; at tests/cudasim/fakenccl (a libnccl.so.2
 * whose ncclGetVersion says 2.21.7) "nccl" is "2.21.7" and the 2-GPU job is
 * 201; the same file saying 2.12.5 (older than bertd needs) is no NCCL.
 * Env (meson.build): BERTD_BIN, IT_CUDASIM_BIN_DIR (the daemon's --bin-dir,
 * with bertd-prepare), LD_LIBRARY_PATH (the stand-in NVML), IT_FAKE_NCCL_DIR
 * (the fake libnccl.so.2's directory, given as --nccl-path). */
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
static it_fx *start_nccl(const char *cc, const char *nccl_path)
{
	setenv("FAKE_NVML_CC", cc, 1); /* read by the daemon's NVML at start */
	const char *bin = getenv("IT_CUDASIM_BIN_DIR");
	const char *extra[] = {"--bin-dir", bin ? bin : "/nonexistent", "--nccl-path", nccl_path, NULL};
	it_daemon_opts o = {.devices = "cuda", .cpu_slots = "1", .schedule = "false", .extra = extra, .dataset = "shakes",
			    .corpus = "shakes.txt", .corpus_lines = 300, .vocab_size = 300};
	it_fx *f = it_daemon_start(&o, 120);
	assert_non_null(f);
	return f;
}

/* ... with the fake libnccl.so.2 (IT_FAKE_NCCL_DIR): NCCL present */
static it_fx *start(const char *cc)
{
	const char *fake = getenv("IT_FAKE_NCCL_DIR");
	assert_non_null(fake);
	return start_nccl(cc, fake);
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

/* GET /v1/version's "nccl": its string, or NULL for JSON null (fails on
 * anything else). */
static char *nccl_of(const it_fx *f)
{
	http_resp r;
	assert_int_equal(http_get(&f->d, "/v1/version", &r), 0);
	assert_int_equal(r.status, 200);
	json_t *v = json_loads(r.body, 0, NULL);
	json_t *n = json_object_get(v, "nccl");
	if (!n || !(json_is_null(n) || json_is_string(n)))
		fail_msg("/v1/version has no \"nccl\" string or null: %s", r.body);
	char *out = json_is_string(n) ? strdup(json_string_value(n)) : NULL;
	json_decref(v);
	http_resp_free(&r);
	return out;
}

static void test_multi_gpu_needs_nccl(void **state)
{
	(void)state;
	const char *fake = getenv("IT_FAKE_NCCL_DIR");
	assert_non_null(fake);
	const char *bin = getenv("IT_CUDASIM_BIN_DIR");
	const char *without[] = {bin ? bin : "/nonexistent", "/nonexistent/libnccl.so.2"};
	http_resp r;
	for (int i = 0; i < 2; i++) {
		it_fx *f = start_nccl("9.0", without[i]);
		char *v = nccl_of(f);
		if (v)
			fail_msg("nccl_path %s: \"nccl\" is \"%s\", expected null", without[i], v);
		submit(f, JOB("\"bf16\":true"), 422, &r);
		json_t *p = json_loads(r.body, 0, NULL);
		assert_non_null(p);
		assert_string_equal(it_jstr(p, "field"), "resources.gpus");
		const char *detail = it_jstr(p, "detail");
		if (!strstr(detail, "NCCL") || !strstr(detail, "libnccl.so.2") || !strstr(detail, "1 GPU"))
			fail_msg("the answer does not say what to install: %s", detail);
		json_decref(p);
		http_resp_free(&r);
		submit(f, "{\"dataset\":\"shakes\"," IT_TINY_MODEL("1") ",\"resources\":{\"gpus\":1,"
			  "\"device\":\"cuda\"},\"training_args\":{\"max_steps\":2,\"max_seq_length\":32}}",
		       201, &r);
		http_resp_free(&r);
		assert_int_equal(it_daemon_stop(f), 0);
	}
	/* an NCCL older than 2.14 is no NCCL to bertd */
	setenv("FAKE_NCCL_VERSION", "21205", 1);
	it_fx *f = start_nccl("9.0", fake);
	char *v = nccl_of(f);
	if (v)
		fail_msg("NCCL 2.12.5: \"nccl\" is \"%s\", expected null", v);
	submit(f, JOB("\"bf16\":true"), 422, &r);
	if (!strstr(r.body, "2.12.5") || !strstr(r.body, "2.14"))
		fail_msg("the answer does not name the old version and the one needed: %s", r.body);
	http_resp_free(&r);
	assert_int_equal(it_daemon_stop(f), 0);
	unsetenv("FAKE_NCCL_VERSION");

	f = start_nccl("9.0", fake);
	v = nccl_of(f);
	if (!v || strcmp(v, "2.21.7") != 0)
		fail_msg("nccl_path %s: \"nccl\" is %s, expected \"2.21.7\"", fake, v ? v : "null");
	free(v);
	submit(f, JOB("\"bf16\":true"), 201, &r);
	http_resp_free(&r);
	assert_int_equal(it_daemon_stop(f), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_bf16_needs_sm80),
					   cmocka_unit_test(test_multi_gpu_needs_nccl)};
	return IT_RUN(tests, NULL, NULL);
}
