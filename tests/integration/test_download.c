/* Downloads: a CPU job runs to completion, then
 *   - GET /v1/jobs/{id}/export is a tar (application/x-tar, attachment
 *     "<name>-export.tar") whose Content-Length is the bytes received;
 *     GNU tar unpacks it to exactly the files of model_dir, and transformers
 *     (Debian's /usr/bin/python3, skipped when absent) loads the unpacked
 *     directory with BertForMaskedLM and AutoTokenizer;
 *   - its ETag is stable; If-None-Match with it (also weak, also in a list)
 *     is 304 without a body, another tag is 200; HEAD has the headers only;
 *   - GET /v1/jobs/{id}/checkpoints/{step} is a tar of that checkpoint;
 *     a step without one is 404, a step that is no number 400;
 *   - a job that is not completed has no export: 404 naming its state;
 *     canceled, it has one exactly when the job says so (its "export":
 *     the stop checkpoint's, once a step was done; test_hf_export);
 *     an unknown job 404; without the token 401. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 240

typedef it_fx fx;

static int setup(void **state)
{
	const char *extra[] = {"--stop-timeout-s", "60", NULL};
	it_daemon_opts o = {.cpu_slots = "2", .extra = extra, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 2000, .vocab_size = 400};
	return it_setup(state, &o, DEADLINE_S);
}

/* Submits the tiny job name on shakes for steps steps; returns its id
 * (caller frees). */
static char *submit(const bertd *d, const char *name, const char *steps)
{
	char *spec = it_job_spec(name, "shakes", "training_args.max_steps", steps, NULL);
	char *id = it_submit(d, spec);
	free(spec);
	return id;
}

static void save(const char *path, const http_resp *r)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(r->body, 1, r->len, f), r->len);
	assert_int_equal(fclose(f), 0);
}

/* GET path, which must be a 200 tar named filename whose Content-Length is
 * the bytes received; saved at tar. Returns the response (caller frees). */
static void get_tar(const bertd *d, const char *path, const char *filename, const char *tar,
		    http_resp *r)
{
	char v[256], want[160];
	assert_int_equal(http_get(d, path, r), 0);
	if (r->status != 200)
		fail_msg("GET %s: %ld %s", path, r->status, r->body);
	assert_string_equal(http_header(r, "Content-Type", v, sizeof v), "application/x-tar");
	snprintf(want, sizeof want, "attachment; filename=\"%s\"", filename);
	assert_string_equal(http_header(r, "Content-Disposition", v, sizeof v), want);
	assert_non_null(http_header(r, "Content-Length", v, sizeof v));
	assert_int_equal(strtoull(v, NULL, 10), r->len);
	assert_true(r->len > 0 && r->len % 512 == 0);
	save(tar, r);
}

static void test_export_and_checkpoint(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "dl-job.v1", "20");
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	const char *model_dir = it_jstr(job, "model_dir");

	/* the export: Content-Length is what arrives, tar unpacks model_dir */
	char path[160], tar[256], out[256], v[256], etag[128];
	snprintf(path, sizeof path, "/v1/jobs/%s/export", id);
	snprintf(tar, sizeof tar, "%s/export.tar", f->d.root);
	snprintf(out, sizeof out, "%s/unpacked", f->d.root);
	http_resp r;
	get_tar(&f->d, path, "dl-job.v1-export.tar", tar, &r);
	size_t len = r.len;
	assert_non_null(http_header(&r, "ETag", etag, sizeof etag));
	assert_true(etag[0] == '"' && etag[strlen(etag) - 1] == '"');
	http_resp_free(&r);
	mkdir(out, 0700);
	assert_int_equal(it_system("tar -xf '%s' -C '%s'", tar, out), 0);
	/* the same names as model_dir, byte for byte */
	assert_int_equal(it_system("test \"$(ls -A '%s')\" = \"$(ls -A '%s/dl-job.v1-export')\"", model_dir, out), 0);
	assert_int_equal(it_system("for f in '%s'/*; do cmp -s \"$f\" '%s/dl-job.v1-export/'\"$(basename \"$f\")\" "
			     "|| exit 1; done", model_dir, out), 0);
	static const char *const files[] = {"config.json", "model.safetensors", "vocab.txt",
					    "tokenizer_config.json", "special_tokens_map.json"};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		assert_int_equal(it_system("test -s '%s/dl-job.v1-export/%s'", out, files[i]), 0);
	/* transformers loads what was downloaded (77: not installed, a skip of
	 * this part only) */
	const char *src = getenv("BERTD_SOURCE_ROOT");
	assert_non_null(src);
	if (access("/usr/bin/python3", X_OK) == 0) {
		int rc = it_system("/usr/bin/python3 '%s/tests/integration/check_download.py' '%s/dl-job.v1-export'",
			     src, out);
		if (rc == 77)
			fprintf(stderr, "transformers check skipped: not installed\n");
		else
			assert_int_equal(rc, 0);
	} else {
		fprintf(stderr, "transformers check skipped: no /usr/bin/python3\n");
	}

	/* the same files, the same ETag; If-None-Match with it is 304 */
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.len, len);
	assert_string_equal(http_header(&r, "ETag", v, sizeof v), etag);
	http_resp_free(&r);
	char inm[3][300];
	snprintf(inm[0], sizeof inm[0], "If-None-Match: %s", etag);
	snprintf(inm[1], sizeof inm[1], "If-None-Match: \"other\", W/%s", etag);
	snprintf(inm[2], sizeof inm[2], "If-None-Match: *");
	for (int i = 0; i < 3; i++) {
		const char *h[] = {inm[i], NULL};
		assert_int_equal(http_do(&f->d, "GET", path, NULL, 0, h, H_AUTH, &r), 0);
		assert_int_equal(r.status, 304);
		assert_int_equal(r.len, 0);
		assert_string_equal(http_header(&r, "ETag", v, sizeof v), etag);
		http_resp_free(&r);
	}
	const char *other[] = {"If-None-Match: \"0123\"", NULL};
	assert_int_equal(http_do(&f->d, "GET", path, NULL, 0, other, H_AUTH, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(r.len, len);
	http_resp_free(&r);
	/* HEAD: the headers, no body */
	assert_int_equal(http_do(&f->d, "HEAD", path, NULL, 0, NULL, H_AUTH, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(r.len, 0);
	assert_int_equal(strtoull(http_header(&r, "Content-Length", v, sizeof v), NULL, 10), len);
	http_resp_free(&r);
	/* without the token: 401, nothing of the model */
	assert_int_equal(http_do(&f->d, "GET", path, NULL, 0, NULL, H_NO_AUTH, &r), 0);
	assert_int_equal(r.status, 401);
	assert_null(strstr(r.body, "safetensors"));
	http_resp_free(&r);

	/* the newest checkpoint (step 20) as a tar; its files as on disk */
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/20", id);
	snprintf(tar, sizeof tar, "%s/ckpt.tar", f->d.root);
	get_tar(&f->d, path, "dl-job.v1-ckpt-20.tar", tar, &r);
	http_resp_free(&r);
	assert_int_equal(it_system("tar -xf '%s' -C '%s'", tar, out), 0);
	char ckdir[1400];
	snprintf(ckdir, sizeof ckdir, "%s/jobs/%s/checkpoints/ckpt-20", f->d.state_dir, id);
	assert_int_equal(it_system("test \"$(ls -A '%s')\" = \"$(ls -A '%s/dl-job.v1-ckpt-20')\"", ckdir, out), 0);
	assert_int_equal(it_system("for f in '%s'/*; do cmp -s \"$f\" '%s/dl-job.v1-ckpt-20/'\"$(basename \"$f\")\" "
			     "|| exit 1; done", ckdir, out), 0);
	assert_int_equal(it_system("test -f '%s/dl-job.v1-ckpt-20/DONE' && test -s '%s/dl-job.v1-ckpt-20/params.safetensors'",
			     out, out), 0);
	/* no checkpoint at step 7; "x7" is no step */
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/7", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 404);
	assert_non_null(strstr(r.body, "no complete checkpoint at step 7"));
	http_resp_free(&r);
	snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints/x7", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 400);
	assert_string_equal(it_jstr(r.json, "field"), "step");
	http_resp_free(&r);
	json_decref(job);
	free(id);
}

static void test_no_export(void **state)
{
	fx *f = *state;
	http_resp r;
	char path[160];
	/* unknown job */
	assert_int_equal(http_get(&f->d, "/v1/jobs/job-0123456789abcdef/export", &r), 0);
	assert_int_equal(r.status, 404);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:job-not-found");
	http_resp_free(&r);
	/* a job that runs long: no export while it lives; once canceled, the
	 * stop checkpoint's when it got that far */
	it_wait_dataset_ready(&f->d, "shakes", DEADLINE_S);
	char *id = submit(&f->d, "long", "100000");
	snprintf(path, sizeof path, "/v1/jobs/%s/export", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	assert_int_equal(r.status, 404);
	assert_non_null(strstr(it_jstr(r.json, "detail"), "it has no export"));
	assert_null(strstr(it_jstr(r.json, "detail"), "is completed"));
	http_resp_free(&r);
	it_cancel_job(&f->d, id, DEADLINE_S);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	json_t *job = it_get_json(&f->d, path);
	bool exported = json_is_object(json_object_get(job, "export"));
	json_decref(job);
	snprintf(path, sizeof path, "/v1/jobs/%s/export", id);
	assert_int_equal(http_get(&f->d, path, &r), 0);
	if (exported) {
		assert_int_equal(r.status, 200);
	} else {
		assert_int_equal(r.status, 404);
		assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:not-found");
		assert_non_null(strstr(it_jstr(r.json, "detail"), "is canceled: it has no export"));
	}
	http_resp_free(&r);
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_export_and_checkpoint, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_no_export, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
