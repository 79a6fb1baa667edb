/* convert — see convert.h. */
#include "worker/convert.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/exitcodes.h"
#include "common/fsutil.h"
#include "worker/hf.h"

/* The vocab file and its casing, from <dataset_dir>/manifest.json's
 * "vocab" ({"file", "lowercase", ...}; loader/shard.c writes it). */
static int dataset_vocab(const char *dataset_dir, char *vocab, size_t cap, bool *lowercase, char *err,
			 size_t errlen)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/manifest.json", dataset_dir);
	json_error_t jerr;
	json_t *m = json_load_file(path, 0, &jerr);
	json_t *v = json_object_get(m, "vocab");
	json_t *file = json_object_get(v, "file"), *low = json_object_get(v, "lowercase");
	int rc = 0;
	if (!m) {
		snprintf(err, errlen, "the job's dataset is unreadable: %s (line %d)", path, jerr.line);
		rc = -EINVAL;
	} else if (!json_is_string(file) || strchr(json_string_value(file), '/') || !json_is_boolean(low)) {
		snprintf(err, errlen, "%s: no usable \"vocab\" object (file, lowercase)", path);
		rc = -EINVAL;
	} else {
		snprintf(vocab, cap, "%s/%s", dataset_dir, json_string_value(file));
		*lowercase = json_is_true(low);
	}
	json_decref(m);
	return rc;
}

/* dataset_dir of the job file <ckpt_dir>/../../job.json. */
static int job_dataset(const char *ckpt_dir, char *out, size_t cap, char *err, size_t errlen)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/../../job.json", ckpt_dir);
	json_t *job = json_load_file(path, 0, NULL);
	const char *ds = json_string_value(json_object_get(job, "dataset_dir"));
	int rc = 0;
	if (!ds) {
		snprintf(err, errlen, "%s: no job file naming the dataset (the vocab of the export); "
			 "give --dataset DIR", path);
		rc = -EINVAL;
	} else {
		snprintf(out, cap, "%s", ds);
	}
	json_decref(job);
	return rc;
}

int convert_checkpoint(const char *ckpt_dir, const char *out_dir, const char *dataset_dir, char *err,
		       size_t errlen)
{
	char ds[PATH_MAX], vocab[PATH_MAX], tmp[PATH_MAX], path[PATH_MAX];
	bool lowercase = true;
	bert_model *m = NULL;
	struct stat sb;
	int rc;
	snprintf(path, sizeof path, "%s/state.json", ckpt_dir);
	if (stat(path, &sb) < 0) {
		snprintf(err, errlen, "%s: not a bertd checkpoint (no state.json)", ckpt_dir);
		return -EINVAL;
	}
	if (stat(out_dir, &sb) == 0) {
		snprintf(err, errlen, "%s exists already", out_dir);
		return -EEXIST;
	}
	if (!dataset_dir) {
		if ((rc = job_dataset(ckpt_dir, ds, sizeof ds, err, errlen)) < 0)
			return rc;
		dataset_dir = ds;
	}
	if ((rc = dataset_vocab(dataset_dir, vocab, sizeof vocab, &lowercase, err, errlen)) < 0)
		return rc;
	/* a checkpoint directory: its config and parameters (hf.h) */
	if ((rc = hf_init_from(&m, ckpt_dir, -1 /* its own heads */, 0, err, errlen)) < 0)
		return rc;
	snprintf(tmp, sizeof tmp, "%s.tmp", out_dir);
	fs_remove_tree(tmp);
	if ((rc = hf_export(m, tmp, vocab, lowercase, err, errlen)) < 0)
		goto out;
	if (rename(tmp, out_dir) < 0) {
		rc = -errno;
		snprintf(err, errlen, "rename %s -> %s: %s", tmp, out_dir, strerror(errno));
	}
out:
	if (rc < 0)
		fs_remove_tree(tmp);
	bert_model_destroy(m);
	return rc;
}

int convert_main(int argc, char **argv)
{
	const char *dataset = NULL;
	char err[1024];
	if (argc == 6 && strcmp(argv[4], "--dataset") == 0)
		dataset = argv[5];
	else if (argc != 4) {
		fprintf(stderr, "usage: bertd-worker --export CHECKPOINT_DIR OUT_DIR [--dataset DATASET_DIR]\n");
		return BERTD_EXIT_BAD_CONFIG;
	}
	int rc = convert_checkpoint(argv[2], argv[3], dataset, err, sizeof err);
	if (rc < 0) {
		fprintf(stderr, "bertd-worker --export: %s\n", err);
		return rc == -EINVAL || rc == -EEXIST ? BERTD_EXIT_BAD_CONFIG : BERTD_EXIT_IO;
	}
	return 0;
}
