/* sv_jobfile — <job dir>/job.json, what a job's workers and loaders read
 * (docs/formats.md): the effective spec, the dataset directories, the
 * checkpoint and export directories, the shared memory name, a device per
 * rank (for a multi-node job, per world rank on its node), the checkpoint
 * to resume from.
 *
 * Writes that one file (atomically) and nothing else: no process, no store
 * row, no change to the run.
 */
#include "daemon/sv_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"

/* resources.device of a multi-node job: "auto" is what this machine has
 * (a cluster's nodes are taken to be alike). */
const char *sv_jobfile_multinode_kind(supervisor *sv, const run *r)
{
	const char *d = json_string_value(json_object_get(json_object_get(r->spec, "resources"), "device"));
	if (d && strcmp(d, "auto") != 0)
		return d;
	return sv->ndev && sv->devs[0].kind == DEVICE_CUDA ? "cuda" : "cpu";
}

int sv_jobfile_write(supervisor *sv, run *r, const char *dataset_dir, const char *resume)
{
	char path[1200];
	json_t *devs = json_array();
	for (int i = 0; i < r->ndev; i++) {
		const device *d = &sv->devs[r->dev[i]];
		json_array_append_new(devs, json_pack("{s:s, s:i}", "kind", device_kind_name(d->kind),
						      "index", d->index));
	}
	for (int i = 0; r->multinode && i < r->world; i++) /* rank i: local device i % per_node there */
		json_array_append_new(devs, json_pack("{s:s, s:i}", "kind", sv_jobfile_multinode_kind(sv, r), "index",
						      i % r->per_node));
	char ck[1100], ex[1100], shm[80];
	snprintf(ck, sizeof ck, "%s/checkpoints", r->dir);
	snprintf(ex, sizeof ex, "%s/export", r->dir);
	sv_shm_name_for(r->id, shm, sizeof shm);
	json_t *job = json_pack("{s:s, s:O, s:s, s:s, s:s, s:s, s:o, s:i}", "job_id", r->id, "spec", r->spec,
				"dataset_dir", dataset_dir, "checkpoint_dir", ck, "export_dir", ex, "shm_name", shm,
				"devices", devs, "world_size", r->world);
	json_object_set_new(job, "resume_from", resume && *resume ? json_string(resume) : json_null());
	json_t *mix = json_object_get(r->spec, "dataset");
	if (json_is_array(mix)) { /* a mixture: one directory per component, in the spec's order */
		json_t *dirs = json_array();
		size_t i;
		json_t *e;
		json_array_foreach(mix, i, e) {
			char d[1200];
			snprintf(d, sizeof d, "%s/datasets/%s", sv->dataset_root,
				 json_string_value(json_object_get(e, "name")));
			json_array_append_new(dirs, json_string(d));
		}
		json_object_set_new(job, "dataset_dirs", dirs);
	}
	char *text = json_dumps(job, JSON_INDENT(2) | JSON_SORT_KEYS);
	json_decref(job);
	if (!text)
		return -ENOMEM;
	snprintf(path, sizeof path, "%s/job.json", r->dir);
	int rc = fs_write_atomic(path, text, strlen(text), 0640);
	free(text);
	return rc;
}
