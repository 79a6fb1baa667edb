/* resume — see resume.h. The checkpoint format's constants and the
 * safetensors reader are the worker's own (worker/checkpoint.h,
 * worker/safetensors.c), so the two sides cannot disagree on what loads. */
#include "daemon/resume.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "worker/checkpoint.h"
#include "worker/safetensors.h"

/* tensor name of path, F32 with numel elements; -EINVAL with why otherwise */
static int check_tensor(const st_file *f, const char *path, const char *name, int64_t numel, char *why,
			size_t cap)
{
	const st_tensor *t = st_find(f, name);
	if (!t || t->dtype != ST_F32 || (int64_t)st_numel(t) != numel) {
		snprintf(why, cap, "%s: tensor '%s' missing or not F32 of %lld elements", path, name,
			 (long long)numel);
		return -EINVAL;
	}
	return 0;
}

static int check_file(const char *dir, const char *file, const char *const *names, int64_t numel, char *why,
		      size_t cap)
{
	char path[4200], err[512];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	st_file *f = NULL;
	int rc = st_open(&f, path, err, sizeof err);
	if (rc < 0) {
		snprintf(why, cap, "%s", err);
		return -EINVAL;
	}
	for (int i = 0; names[i] && rc == 0; i++)
		rc = check_tensor(f, path, names[i], numel, why, cap);
	st_close(f);
	return rc;
}

int resume_check(const char *dir, int64_t step, char *why, size_t cap)
{
	char path[4200];
	struct stat sb;
	snprintf(path, sizeof path, "%s/DONE", dir);
	if (stat(path, &sb) < 0) {
		snprintf(why, cap, "%s: incomplete (no DONE marker)", dir);
		return -ENOENT;
	}
	snprintf(path, sizeof path, "%s/state.json", dir);
	json_error_t jerr;
	json_t *s = json_load_file(path, 0, &jerr);
	int rc = -EINVAL;
	if (!s) {
		snprintf(why, cap, "%s: unreadable or not valid JSON (line %d)", path, jerr.line);
		return -EINVAL;
	}
	const char *fmt = json_string_value(json_object_get(s, "format"));
	json_t *ver = json_object_get(s, "version"), *st = json_object_get(s, "step");
	json_t *np = json_object_get(s, "num_params");
	if (!fmt || strcmp(fmt, "bertd-checkpoint") != 0 || !json_is_integer(ver) ||
	    json_integer_value(ver) != CHECKPOINT_FORMAT_VERSION) {
		snprintf(why, cap, "%s: not a bertd checkpoint of format version %d", path, CHECKPOINT_FORMAT_VERSION);
		goto out;
	}
	if (!json_is_integer(st) || json_integer_value(st) != step) {
		snprintf(why, cap, "%s: step is not %lld", path, (long long)step);
		goto out;
	}
	if (!json_is_integer(np) || json_integer_value(np) <= 0) {
		snprintf(why, cap, "%s: num_params is not a positive integer", path);
		goto out;
	}
	int64_t numel = json_integer_value(np);
	static const char *const params[] = {"params", NULL};
	static const char *const moments[] = {"exp_avg", "exp_avg_sq", NULL};
	if ((rc = check_file(dir, "params.safetensors", params, numel, why, cap)) < 0)
		goto out;
	if (!json_is_null(json_object_get(s, "optimizer")) &&
	    (rc = check_file(dir, "optim.safetensors", moments, numel, why, cap)) < 0)
		goto out;
	rc = 0;
out:
	json_decref(s);
	return rc;
}

/* "ckpt-<digits>" exactly (as worker/checkpoint.c names them): the step, else -1 */
static int64_t parse_name(const char *name)
{
	if (strncmp(name, "ckpt-", 5) != 0 || name[5] < '0' || name[5] > '9')
		return -1;
	char *end;
	errno = 0;
	long long v = strtoll(name + 5, &end, 10);
	return *end || errno ? -1 : (int64_t)v;
}

static int cmp_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x < y) - (x > y);
}

int resume_scan(const char *root, int64_t **steps, size_t *n)
{
	*steps = NULL;
	*n = 0;
	DIR *d = opendir(root);
	if (!d)
		return 0;
	size_t cap = 0;
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d))) {
		int64_t s = parse_name(e->d_name);
		char done[4400];
		struct stat sb;
		snprintf(done, sizeof done, "%s/%s/DONE", root, e->d_name);
		if (s < 0 || stat(done, &sb) < 0)
			continue;
		if (*n == cap) {
			cap = cap ? 2 * cap : 16;
			int64_t *ns = realloc(*steps, cap * sizeof *ns);
			if (!ns) {
				rc = -ENOMEM;
				break;
			}
			*steps = ns;
		}
		(*steps)[(*n)++] = s;
	}
	closedir(d);
	if (rc < 0) {
		free(*steps);
		*steps = NULL;
		*n = 0;
		return rc;
	}
	if (*n)
		qsort(*steps, *n, sizeof **steps, cmp_desc);
	return 0;
}

