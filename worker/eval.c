/* eval — eval set and eval pass (see eval.h). */
#include "worker/eval.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader/mlm.h"
#include "loader/shard.h"

/* One eval batch: b points into the arrays after it in the same block. */
typedef struct eval_batch {
	bert_batch b;
	int32_t *ids, *tt, *lens, *pos, *lab, *nsp; /* (n,T) (n,T) (n,) (M,) (M,) (n,) */
} eval_batch;

struct eval_set {
	int T, P, nsp;
	int n_batches, rank, world;
	eval_batch *batches;   /* (n_batches,) every rank's, for eval_set_write */
	int32_t *mem;          /* one block holding every batch's arrays */
	int mine;              /* batches of this rank */
};

static int set_err(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int set_err(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

/* Fills batch k (sequences [s0, s0 + n) of ds) into eb; arrays from *cur. */
static int build_batch(const mlm_dataset *ds, uint64_t s0, int n, int T, int P, int nsp, eval_batch *eb,
		       int32_t **cur)
{
	int32_t *p = *cur;
	eb->ids = p, p += (size_t)n * T;
	eb->tt = p, p += (size_t)n * T;
	eb->lens = p, p += n;
	eb->pos = p, p += (size_t)n * P;
	eb->lab = p, p += (size_t)n * P;
	eb->nsp = p, p += n;
	*cur = p;
	int32_t spos[P > 0 ? P : 1], slab[P > 0 ? P : 1];
	int m = 0;
	for (int j = 0; j < n; j++) {
		int32_t *ids = eb->ids + (size_t)j * T;
		int len = mlm_sample_pack(ds, s0 + (uint64_t)j, ids, eb->tt + (size_t)j * T, eb->nsp + j);
		if (len < 0)
			return len;
		eb->lens[j] = len;
		/* epoch 0 always: the masking never changes over the job */
		int np = mlm_sample_mask(ds, 0, s0 + (uint64_t)j, ids, len, spos, slab);
		for (int i = 0; i < np; i++, m++) {
			eb->pos[m] = j * T + spos[i];
			eb->lab[m] = slab[i];
		}
	}
	eb->b = (bert_batch){
		.B = n, .T = T, .M = m,
		.input_ids = eb->ids, .token_type_ids = eb->tt, .seq_lens = eb->lens,
		.mlm_positions = eb->pos, .mlm_labels = eb->lab,
		.nsp_labels = nsp ? eb->nsp : NULL,
	};
	return 0;
}

int eval_set_create(eval_set **out, const batchjob *bj, int rank, int world, char *err, size_t errlen)
{
	*out = NULL;
	const jobspec_training *tr = &bj->spec.training;
	if (bj->mlm.holdout_pct == 0)
		return set_err(err, errlen, -EINVAL, "mlm.validation_split_percentage is 0: nothing is held out");
	if (world < 1 || rank < 0 || rank >= world)
		return set_err(err, errlen, -EINVAL, "rank %d of %d", rank, world);
	/* (K,) per component of a mixture; K = 1 for one dataset */
	const uint32_t K = bj->n_datasets;
	shard_dataset *sd[MIX_MAX] = {0};
	mlm_dataset *ds[MIX_MAX] = {0};
	uint64_t nb_k[MIX_MAX] = {0}, nseq_k[MIX_MAX] = {0};
	uint8_t *cont = NULL;
	eval_set *es = NULL;
	int rc = 0;
	const int B = tr->per_device_eval_batch_size, T = (int)bj->mlm.max_seq_len, P = (int)bj->mlm.max_pred;
	uint64_t nb = 0, n_seq = 0;
	for (uint32_t k = 0; k < K; k++) {
		const char *dir = bj->dataset_dirs[k];
		mlm_config cfg = batchjob_component_config(bj, k, MLM_SPLIT_EVAL);
		rc = shard_dataset_open(dir, &sd[k]);
		if (rc) {
			set_err(err, errlen, rc, "cannot open dataset %s: %s", dir, strerror(-rc));
			goto out;
		}
		if (sd[k]->n_shards == 0) {
			rc = set_err(err, errlen, -ENODATA, "dataset %s has no shards", dir);
			goto out;
		}
		if (cfg.whole_word_mask) {
			if (!cont)
				cont = batchjob_continuation_bitmap(sd[k]->vocab_path, sd[k]->views[0].vocab_size);
			if (!cont) {
				rc = set_err(err, errlen, -EBADMSG, "cannot read the vocab of %s", dir);
				goto out;
			}
			cfg.is_continuation = cont;
		}
		rc = mlm_dataset_create(&ds[k], sd[k]->views, (uint32_t)sd[k]->n_shards, &cfg);
		if (rc) {
			set_err(err, errlen, rc, "indexing the held-out documents of %s: %s", dir, strerror(-rc));
			goto out;
		}
		mlm_stats st;
		mlm_dataset_stats(ds[k], &st);
		/* each component's share of max_eval_batches follows its proportion
		 * (at least one batch), so the pooled metrics weigh them as training does */
		uint64_t cap = (uint64_t)tr->max_eval_batches;
		if (K > 1) {
			cap = (uint64_t)floor((double)tr->max_eval_batches * bj->spec.datasets[k].proportion);
			if (cap < 1)
				cap = 1;
		}
		nb_k[k] = (st.n_samples + (uint64_t)B - 1) / (uint64_t)B;
		if (nb_k[k] > cap)
			nb_k[k] = cap;
		nseq_k[k] = nb_k[k] * (uint64_t)B < st.n_samples ? nb_k[k] * (uint64_t)B : st.n_samples;
		nb += nb_k[k];
		n_seq += nseq_k[k];
	}
	if (nb == 0) {
		rc = set_err(err, errlen, -ENODATA, "the held-out documents make no sequence");
		goto out;
	}
	es = calloc(1, sizeof(*es));
	size_t per_seq = 2 * (size_t)T + 2 * (size_t)P + 2;
	if (es) {
		es->batches = calloc(nb, sizeof(*es->batches));
		es->mem = malloc(per_seq * n_seq * sizeof(int32_t));
	}
	if (!es || !es->batches || !es->mem) {
		rc = set_err(err, errlen, -ENOMEM, "out of memory for %llu eval sequences",
			     (unsigned long long)n_seq);
		goto out;
	}
	es->T = T;
	es->P = P;
	es->nsp = bj->mlm.nsp;
	es->n_batches = (int)nb;
	es->rank = rank;
	es->world = world;
	es->mine = (int)((nb - (uint64_t)rank + (uint64_t)world - 1) / (uint64_t)world);
	if ((uint64_t)rank >= nb)
		es->mine = 0;
	int32_t *cur = es->mem;
	uint64_t b = 0;
	for (uint32_t k = 0; k < K; k++) {
		for (uint64_t i = 0; i < nb_k[k]; i++, b++) {
			uint64_t s0 = i * (uint64_t)B;
			int n = (int)(nseq_k[k] - s0 < (uint64_t)B ? nseq_k[k] - s0 : (uint64_t)B);
			rc = build_batch(ds[k], s0, n, T, P, bj->mlm.nsp, &es->batches[b], &cur);
			if (rc) {
				set_err(err, errlen, rc, "building eval batch %llu: %s", (unsigned long long)b,
					strerror(-rc));
				goto out;
			}
		}
	}
	*out = es;
	es = NULL;
out:
	eval_set_destroy(es);
	for (uint32_t k = 0; k < K; k++) {
		mlm_dataset_destroy(ds[k]);
		if (sd[k])
			shard_dataset_close(sd[k]);
	}
	free(cont);
	return rc;
}

void eval_set_destroy(eval_set *es)
{
	if (!es)
		return;
	free(es->batches);
	free(es->mem);
	free(es);
}

int eval_set_batches(const eval_set *es)
{
	return es->n_batches;
}

int eval_set_rank_batches(const eval_set *es)
{
	return es->mine;
}

const bert_batch *eval_set_rank_batch(const eval_set *es, int i)
{
	return &es->batches[(size_t)es->rank + (size_t)i * es->world].b;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = write(fd, c, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

int eval_set_write(const eval_set *es, const char *path)
{
	char tmp[4200];
	if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid()) >= (int)sizeof tmp)
		return -ENAMETOOLONG;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	const int T = es->T;
	uint32_t hdr[6] = {EVAL_FILE_VERSION, (uint32_t)es->n_batches, (uint32_t)T, (uint32_t)es->nsp, 0, 0};
	int rc = write_all(fd, EVAL_FILE_MAGIC, 8);
	if (!rc)
		rc = write_all(fd, hdr, sizeof hdr);
	int32_t *row = malloc(sizeof(int32_t) * (size_t)T);
	if (!row && !rc)
		rc = -ENOMEM;
	for (int k = 0; k < es->n_batches && !rc; k++) {
		const eval_batch *eb = &es->batches[k];
		const int n = eb->b.B;
		uint32_t nn = (uint32_t)n;
		rc = write_all(fd, &nn, sizeof nn);
		if (!rc)
			rc = write_all(fd, eb->ids, sizeof(int32_t) * (size_t)n * T);
		if (!rc)
			rc = write_all(fd, eb->tt, sizeof(int32_t) * (size_t)n * T);
		for (int j = 0; j < n && !rc; j++) { /* attention mask (n, T) */
			for (int t = 0; t < T; t++)
				row[t] = t < eb->lens[j];
			rc = write_all(fd, row, sizeof(int32_t) * (size_t)T);
		}
		/* labels (n, T): the original id at masked positions, -100 elsewhere */
		for (int j = 0; j < n && !rc; j++) {
			for (int t = 0; t < T; t++)
				row[t] = EVAL_LABEL_IGNORE;
			for (int m = 0; m < eb->b.M; m++)
				if (eb->pos[m] / T == j)
					row[eb->pos[m] % T] = eb->lab[m];
			rc = write_all(fd, row, sizeof(int32_t) * (size_t)T);
		}
		if (!rc && es->nsp)
			rc = write_all(fd, eb->nsp, sizeof(int32_t) * (size_t)n);
	}
	free(row);
	if (!rc && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path) < 0)
		rc = -errno;
	if (rc)
		unlink(tmp);
	return rc;
}

void eval_result_from_sums(const bert_eval_sums *s, int batches, eval_result *out)
{
	out->masked = s->count;
	out->batches = batches;
	out->loss = s->count > 0 ? s->loss_sum / s->count : 0.0;
	out->perplexity = exp(out->loss);
	out->accuracy = s->count > 0 ? s->correct / s->count : 0.0;
}

int eval_set_run(const eval_set *es, eval_batch_fn fn, void *ctx, comm *cm, void (*tick)(void *),
		 void *tick_arg, eval_result *out)
{
	bert_eval_sums acc = {0};
	int rc = 0;
	for (int i = 0; i < es->mine && rc == 0; i++) {
		rc = fn(ctx, eval_set_rank_batch(es, i), &acc);
		if (tick)
			tick(tick_arg);
	}
	/* a failed rank still joins the sum, with its failure in it, so no
	 * rank waits on it; every rank then sees the failure */
	double v[4] = {acc.loss_sum, acc.count, acc.correct, rc < 0 ? 1.0 : 0.0};
	if (cm && es->world > 1) {
		int crc = comm_allreduce_sum_f64(cm, v, 4);
		if (crc < 0)
			return crc;
	}
	if (rc < 0)
		return rc;
	if (v[3] > 0)
		return -EPROTO;
	bert_eval_sums sum = {v[0], v[1], v[2]};
	eval_result_from_sums(&sum, es->n_batches, out);
	return 0;
}
