/* batchjob — job file -> MLM options, ring geometry, dataset (batchjob.h). */
#include "loader/batchjob.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

/* Slots per rank: enough for every loader to have one batch in flight on
 * this rank's ring, plus two ready ones, at least 4. */
static uint32_t slots_for(int loaders, uint32_t G)
{
	uint32_t per_rank = loaders > 0 ? ((uint32_t)loaders + G - 1) / G : 1;
	uint32_t s = 2 * per_rank + 2;
	return s < 4 ? 4 : s;
}

/* k from ".../ckpt-<k>" (a trailing slash allowed); -1 if it is not that. */
static int64_t ckpt_step(const char *path)
{
	size_t n = strlen(path);
	while (n > 0 && path[n - 1] == '/')
		n--;
	size_t b = n;
	while (b > 0 && path[b - 1] != '/')
		b--;
	if (n - b < 6 || strncmp(path + b, "ckpt-", 5) != 0)
		return -1;
	int64_t k = 0;
	for (size_t i = b + 5; i < n; i++) {
		if (path[i] < '0' || path[i] > '9' || k > (INT64_MAX - 9) / 10)
			return -1;
		k = k * 10 + (path[i] - '0');
	}
	return k;
}

static int copy_str(char *dst, size_t cap, const json_t *job, const char *key)
{
	const char *v = json_string_value(json_object_get(job, key));
	if (!v || strlen(v) >= cap) {
		log_error("job file: \"%s\" missing, not a string or too long", key);
		return -EINVAL;
	}
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* The components: spec.datasets' proportions, and their directories from
 * "dataset_dirs" (a mixture) or "dataset_dir" (one dataset). */
static int dataset_dirs_from_json(const json_t *job, batchjob *out)
{
	const jobspec *sp = &out->spec;
	double prop[MIX_MAX];
	json_t *dirs = json_object_get(job, "dataset_dirs");
	out->n_datasets = (uint32_t)sp->n_datasets;
	if (out->n_datasets < 1 || out->n_datasets > MIX_MAX) {
		log_error("job file: spec has %d datasets", sp->n_datasets);
		return -EINVAL;
	}
	if (out->n_datasets > 1 && json_array_size(dirs) != out->n_datasets) {
		log_error("job file: \"dataset_dirs\" must list the spec's %u datasets", out->n_datasets);
		return -EINVAL;
	}
	for (uint32_t k = 0; k < out->n_datasets; k++) {
		prop[k] = sp->datasets[k].proportion;
		const char *d = out->n_datasets > 1 ? json_string_value(json_array_get(dirs, k)) : out->dataset_dir;
		if (!d || strlen(d) >= sizeof(out->dataset_dirs[k])) {
			log_error("job file: dataset_dirs[%u] missing, not a string or too long", k);
			return -EINVAL;
		}
		memcpy(out->dataset_dirs[k], d, strlen(d) + 1);
	}
	if (mix_schedule_init(&out->mix, prop, out->n_datasets) < 0) {
		log_error("job file: the datasets' proportions are not all > 0");
		return -EINVAL;
	}
	return 0;
}

int batchjob_from_json(const json_t *job, batchjob *out)
{
	memset(out, 0, sizeof(*out));
	if (!json_is_object(job)) {
		log_error("job file: not a JSON object");
		return -EINVAL;
	}
	jobspec_error err;
	if (jobspec_from_json(json_object_get(job, "spec"), &out->spec, &err) != 0) {
		log_error("job file: spec.%s: %s", err.field, err.detail);
		return -EINVAL;
	}
	int rc;
	if ((rc = copy_str(out->job_id, sizeof(out->job_id), job, "job_id")) ||
	    (rc = copy_str(out->dataset_dir, sizeof(out->dataset_dir), job, "dataset_dir")) ||
	    (rc = copy_str(out->shm_name, sizeof(out->shm_name), job, "shm_name")))
		return rc;
	if ((rc = dataset_dirs_from_json(job, out)))
		return rc;
	json_t *ws = json_object_get(job, "world_size");
	if (!json_is_integer(ws) || json_integer_value(ws) < 1 || json_integer_value(ws) > 4096) {
		log_error("job file: \"world_size\" must be an integer in [1, 4096]");
		return -EINVAL;
	}
	out->world_size = (uint32_t)json_integer_value(ws);
	json_t *res = json_object_get(job, "resume_from");
	if (json_is_string(res)) {
		out->start_step = ckpt_step(json_string_value(res));
		if (out->start_step < 0) {
			log_error("job file: resume_from \"%s\" is not a .../ckpt-<step> directory",
				  json_string_value(res));
			return -EINVAL;
		}
	} else if (res && !json_is_null(res)) {
		log_error("job file: \"resume_from\" must be a string or null");
		return -EINVAL;
	}
	const jobspec_training *tr = &out->spec.training;
	const jobspec_mlm *m = &out->spec.mlm;
	mlm_config *c = &out->mlm;
	mlm_config_defaults(c, (uint32_t)tr->max_seq_length);
	c->seed = tr->seed;
	c->max_pred = (uint32_t)m->max_predictions_per_seq;
	c->mlm_probability = (float)m->mlm_probability;
	c->mask_replace_prob = (float)m->mask_replace_prob;
	c->random_replace_prob = (float)m->random_replace_prob;
	c->short_seq_prob = (float)m->short_seq_prob;
	c->nsp = m->nsp;
	c->whole_word_mask = m->whole_word_mask;
	c->drop_long_sentences = m->drop_long_sentences;
	/* training batches come from the documents not held out for evaluation */
	c->holdout_pct = (uint32_t)m->validation_split_percentage;
	c->split = MLM_SPLIT_TRAIN;
	ring_params *p = &out->ring;
	p->G = out->world_size;
	p->M = (uint32_t)tr->gradient_accumulation_steps;
	p->S = slots_for(tr->dataloader_num_workers, p->G);
	rc = batch_layout_init(&p->layout, (uint32_t)tr->per_device_train_batch_size, c->max_seq_len,
			       c->max_pred);
	if (rc) {
		log_error("job: batch %d x seq %u x predictions %u does not fit a batch slot",
			  tr->per_device_train_batch_size, c->max_seq_len, c->max_pred);
		return -EINVAL;
	}
	uint64_t per_step = (uint64_t)p->M * p->G;
	p->start_batch = (uint64_t)out->start_step * per_step;
	p->end_batch = (uint64_t)tr->max_steps * per_step;
	if (p->end_batch < p->start_batch)
		p->end_batch = p->start_batch; /* resumed at or past the end: nothing to build */
	p->job_tag = mlm_config_digest(c) ^ mix_digest(&out->mix);
	return 0;
}

int batchjob_ring_on_node(batchjob *bj, uint32_t first, uint32_t count, const char *tag)
{
	ring_params *p = &bj->ring;
	const jobspec_training *tr = &bj->spec.training;
	size_t have = strlen(bj->shm_name), add = strlen(tag);
	if (count == 0 || (uint64_t)first + count > bj->world_size) {
		log_error("job: ranks %u..%u are not in a world of %u", first, first + count - 1, bj->world_size);
		return -EINVAL;
	}
	if (!*tag || have + 1 + add >= sizeof bj->shm_name || strspn(tag, "abcdefghijklmnopqrstuvwxyz"
		    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != add) {
		log_error("job: \"%s\" cannot name a node's ring", tag);
		return -EINVAL;
	}
	snprintf(bj->shm_name + have, sizeof bj->shm_name - have, "-%s", tag);
	p->W = bj->world_size;
	p->R0 = first;
	p->G = count;
	p->S = slots_for(tr->dataloader_num_workers, count);
	uint64_t per_step = (uint64_t)p->M * count;
	p->start_batch = (uint64_t)bj->start_step * per_step;
	p->end_batch = (uint64_t)tr->max_steps * per_step;
	if (p->end_batch < p->start_batch)
		p->end_batch = p->start_batch;
	return 0;
}

int batchjob_ring_from_env(batchjob *bj)
{
	const char *v = getenv("BERTD_RING_NODE");
	unsigned first, count;
	int used = 0;
	if (!v || !*v)
		return 0;
	if (sscanf(v, "%u,%u,%n", &first, &count, &used) != 2 || used == 0) {
		log_error("BERTD_RING_NODE=\"%s\" is not <first>,<count>,<tag>", v);
		return -EINVAL;
	}
	return batchjob_ring_on_node(bj, first, count, v + used);
}

mlm_config batchjob_component_config(const batchjob *bj, uint32_t k, int split)
{
	mlm_config c = bj->mlm;
	c.seed = mix_component_seed(bj->mlm.seed, k, bj->n_datasets);
	c.split = split;
	return c;
}

int batchjob_load(const char *path, batchjob *out)
{
	json_error_t jerr;
	FILE *f = fopen(path, "re");
	if (!f) {
		int rc = -errno;
		log_error("cannot open job file %s: %s", path, strerror(errno));
		return rc;
	}
	json_t *job = json_loadf(f, 0, &jerr);
	fclose(f);
	if (!job) {
		log_error("job file %s: line %d: %s", path, jerr.line, jerr.text);
		return -EBADMSG;
	}
	int rc = batchjob_from_json(job, out);
	json_decref(job);
	return rc;
}

uint8_t *batchjob_continuation_bitmap(const char *vocab_path, uint32_t vocab_size)
{
	FILE *f = fopen(vocab_path, "re");
	if (!f) {
		log_error("cannot open vocab %s: %s", vocab_path, strerror(errno));
		return NULL;
	}
	uint8_t *bits = calloc(vocab_size / 8 + 1, 1);
	char line[1024];
	uint32_t id = 0;
	while (bits && id < vocab_size && fgets(line, sizeof(line), f)) {
		size_t n = strlen(line);
		if (line[0] == '#' && line[1] == '#')
			bits[id >> 3] |= (uint8_t)(1u << (id & 7));
		/* a line longer than the buffer is still one vocab entry */
		while (n > 0 && line[n - 1] != '\n' && fgets(line, sizeof(line), f))
			n = strlen(line);
		id++;
	}
	fclose(f);
	if (!bits)
		log_error("out of memory for the vocab bitmap");
	return bits;
}

int batchjob_data_open(batchjob *bj, batchjob_data *out)
{
	memset(out, 0, sizeof(*out));
	out->mix = &bj->mix;
	int rc = 0;
	for (uint32_t k = 0; k < bj->n_datasets; k++) {
		const char *dir = bj->dataset_dirs[k];
		shard_dataset *sd = NULL;
		if ((rc = shard_dataset_open(dir, &sd)))
			goto out;
		out->part_shards[out->n++] = sd;
		if (sd->n_shards == 0 || sd->n_shards > UINT32_MAX) {
			log_error("dataset %s has no shards", dir);
			rc = -ENODATA;
			goto out;
		}
		/* one vocab for all: a token id must mean the same word in every batch */
		if (k > 0 && (strcmp(sd->vocab.sha256, out->part_shards[0]->vocab.sha256) != 0 ||
			      sd->vocab.vocab_size != out->part_shards[0]->vocab.vocab_size)) {
			log_error("dataset %s has another vocab than %s: a mixture needs one vocab", dir,
				  bj->dataset_dirs[0]);
			rc = -EINVAL;
			goto out;
		}
	}
	out->shards = out->part_shards[0];
	if (bj->mlm.whole_word_mask) {
		out->continuation =
			batchjob_continuation_bitmap(out->shards->vocab_path, out->shards->views[0].vocab_size);
		if (!out->continuation) {
			rc = -EBADMSG;
			goto out;
		}
		bj->mlm.is_continuation = out->continuation;
	}
	for (uint32_t k = 0; k < out->n; k++) {
		mlm_config cfg = batchjob_component_config(bj, k, MLM_SPLIT_TRAIN);
		shard_dataset *sd = out->part_shards[k];
		if ((rc = mlm_dataset_create(&out->part_ds[k], sd->views, (uint32_t)sd->n_shards, &cfg)))
			goto out;
		mlm_stats st;
		mlm_dataset_stats(out->part_ds[k], &st);
		/* a mixture's component may be smaller than a batch: others fill it */
		if (st.n_samples < (out->n > 1 ? 1 : bj->ring.layout.B)) {
			log_error("dataset %s makes %llu sequences of %u tokens, fewer than one batch of %u",
				  bj->dataset_dirs[k], (unsigned long long)st.n_samples, bj->mlm.max_seq_len,
				  bj->ring.layout.B);
			rc = -ENODATA;
			goto out;
		}
		if (out->n > 1)
			log_info("mixture component %u (%s): proportion %.6f, %llu sequences per epoch", k,
				 bj->dataset_dirs[k], bj->spec.datasets[k].proportion,
				 (unsigned long long)st.n_samples);
	}
	out->ds = out->part_ds[0];
	return 0;
out:
	batchjob_data_close(out);
	return rc;
}

void batchjob_data_close(batchjob_data *d)
{
	for (uint32_t k = 0; k < d->n; k++) {
		mlm_dataset_destroy(d->part_ds[k]);
		if (d->part_shards[k])
			shard_dataset_close(d->part_shards[k]);
	}
	free(d->continuation);
	memset(d, 0, sizeof(*d));
}

int batchjob_batch_build(const batchjob_data *d, const batch_layout *l, uint32_t G, uint32_t M,
			 uint64_t global, void *slot)
{
	if (d->n <= 1)
		return mlm_batch_build(d->ds, l, G, M, global, slot);
	return mix_batch_build((const mlm_dataset *const *)d->part_ds, d->mix, l, G, M, global, slot);
}

void batchjob_simulated_delay(const batchjob *bj)
{
	int ms = bj->spec.simulate_data_delay_ms;
	if (ms <= 0)
		return;
	/* A signal ends the sleep early (a loader's SIGTERM must not wait
	 * out the delay); the batch is then just built sooner. */
	struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000L};
	clock_nanosleep(CLOCK_MONOTONIC, 0, &d, NULL);
}
