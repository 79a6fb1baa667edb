/* resume: which checkpoint directories the daemon hands a worker. A
 * checkpoint is laid out as docs/formats.md says (written here with the
 * worker's own safetensors writer); each kind of damage is refused with a
 * reason, and the scan lists only complete ckpt-<step> directories, newest
 * first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "daemon/resume.h"
#include "worker/safetensors.h"

#define NP 10 /* parameters of the fake model */

static char root[64];

static void put(const char *dir, const char *name, const char *text)
{
	char p[300];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

/* root/ckpt-<step> as the worker writes it; done false leaves out DONE. */
static void make_ckpt(long step, bool done, char *dir_out, size_t cap)
{
	char dir[200];
	snprintf(dir, sizeof dir, "%s/ckpt-%ld", root, step);
	assert_int_equal(mkdir(dir, 0700), 0);
	static float p[NP], m[NP], v[NP];
	for (int i = 0; i < NP; i++)
		p[i] = (float)i, m[i] = 0.5f, v[i] = 0.25f;
	char path[300];
	snprintf(path, sizeof path, "%s/params.safetensors", dir);
	st_entry pe = {.name = "params", .ndim = 1, .shape = {NP}, .data = p};
	assert_int_equal(st_write(path, &pe, 1, NULL), 0);
	snprintf(path, sizeof path, "%s/optim.safetensors", dir);
	st_entry oe[2] = {{.name = "exp_avg", .ndim = 1, .shape = {NP}, .data = m},
			  {.name = "exp_avg_sq", .ndim = 1, .shape = {NP}, .data = v}};
	assert_int_equal(st_write(path, oe, 2, NULL), 0);
	char state[300];
	snprintf(state, sizeof state,
		 "{\"format\": \"bertd-checkpoint\", \"version\": 1, \"step\": %ld, \"num_params\": %d, "
		 "\"optimizer\": {\"optim\": \"adamw\", \"updates\": %ld}}",
		 step, NP, step);
	put(dir, "state.json", state);
	if (done)
		put(dir, "DONE", "step\n");
	if (dir_out)
		snprintf(dir_out, cap, "%s", dir);
}

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof root, "/tmp/bertd-resume-XXXXXX");
	return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", root);
	return system(cmd) == 0 ? 0 : -1;
}

static void test_complete_checkpoint_passes(void **state)
{
	(void)state;
	char dir[200], why[512] = "";
	make_ckpt(20, true, dir, sizeof dir);
	assert_int_equal(resume_check(dir, 20, why, sizeof why), 0);
	assert_true(fs_dir_bytes(dir) > 0);
}

static void test_damage_is_refused(void **state)
{
	(void)state;
	char dir[200], why[512], p[300];
	/* no DONE: incomplete */
	make_ckpt(5, false, dir, sizeof dir);
	assert_int_equal(resume_check(dir, 5, why, sizeof why), -ENOENT);
	assert_non_null(strstr(why, "DONE"));
	/* another step than its name says */
	make_ckpt(6, true, dir, sizeof dir);
	assert_int_equal(resume_check(dir, 7, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "step"));
	/* params.safetensors truncated */
	make_ckpt(7, true, dir, sizeof dir);
	snprintf(p, sizeof p, "%s/params.safetensors", dir);
	struct stat sb;
	assert_int_equal(stat(p, &sb), 0);
	assert_int_equal(truncate(p, sb.st_size - 4), 0);
	assert_int_equal(resume_check(dir, 7, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "params.safetensors"));
	/* optim.safetensors missing while state.json names an optimizer */
	make_ckpt(8, true, dir, sizeof dir);
	snprintf(p, sizeof p, "%s/optim.safetensors", dir);
	assert_int_equal(unlink(p), 0);
	assert_int_equal(resume_check(dir, 8, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "optim.safetensors"));
	/* a model of another size than state.json says */
	make_ckpt(9, true, dir, sizeof dir);
	put(dir, "state.json", "{\"format\": \"bertd-checkpoint\", \"version\": 1, \"step\": 9, \"num_params\": 11, "
			       "\"optimizer\": null}");
	assert_int_equal(resume_check(dir, 9, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "'params'"));
	/* state.json cut short */
	make_ckpt(10, true, dir, sizeof dir);
	put(dir, "state.json", "{\"format\": \"bertd-check");
	assert_int_equal(resume_check(dir, 10, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "state.json"));
	/* another format version */
	make_ckpt(11, true, dir, sizeof dir);
	put(dir, "state.json", "{\"format\": \"bertd-checkpoint\", \"version\": 2, \"step\": 11, \"num_params\": 10}");
	assert_int_equal(resume_check(dir, 11, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "format version 1"));
}

static void test_scan_newest_first(void **state)
{
	(void)state;
	int64_t *steps;
	size_t n;
	char missing[100];
	snprintf(missing, sizeof missing, "%s/none", root);
	assert_int_equal(resume_scan(missing, &steps, &n), 0);
	assert_int_equal(n, 0);
	assert_null(steps);

	make_ckpt(10, true, NULL, 0);
	make_ckpt(300, true, NULL, 0);
	make_ckpt(25, true, NULL, 0);
	make_ckpt(400, false, NULL, 0); /* incomplete: not listed */
	char p[200];
	snprintf(p, sizeof p, "%s/ckpt-500.tmp", root); /* a save that crashed */
	assert_int_equal(mkdir(p, 0700), 0);
	put(p, "DONE", "x");
	snprintf(p, sizeof p, "%s/ckpt-x1", root);
	assert_int_equal(mkdir(p, 0700), 0);
	put(p, "DONE", "x");
	assert_int_equal(resume_scan(root, &steps, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(steps[0], 300);
	assert_int_equal(steps[1], 25);
	assert_int_equal(steps[2], 10);
	free(steps);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_complete_checkpoint_passes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_damage_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scan_newest_first, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
