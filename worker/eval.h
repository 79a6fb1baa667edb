/* eval — the held-out evaluation of a job (docs/jobspec.md "Held-out
 * evaluation"): the eval set, built once per process from the documents the
 * job's validation_split_percentage holds out of training, and one pass of
 * it on a device, summed over the ranks.
 *
 * The eval set is fixed for the whole job: the held-out documents packed by
 * the training rules in one pass (no epoch permutation), masked once with
 * the job's seed at epoch 0, cut into batches of per_device_eval_batch_size
 * (the last may be shorter), at most max_eval_batches. Rank r of G evaluates
 * batches r, r+G, ...; the loss sum, masked-token count and correct count
 * are added over the ranks, so every rank returns the same result.
 * A mixture holds out documents of every component (each with its own
 * seed): the eval set is component 0's batches, then component 1's, ...,
 * each capped at its proportion of max_eval_batches (at least one), and the
 * metrics are pooled over all of them.
 *
 * Never talks to the daemon and never decides to exit; the only file it
 * writes is the eval-batches file asked for (docs/formats.md).
 */
#ifndef BERTD_WORKER_EVAL_H
#define BERTD_WORKER_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loader/batchjob.h"
#include "worker/comm.h"
#include "worker/model.h"

#define EVAL_FILE_MAGIC "BERTDEVB"
#define EVAL_FILE_VERSION 1u
#define EVAL_LABEL_IGNORE (-100) /* labels of unmasked positions, as HF's collator */

typedef struct eval_set eval_set;

/* What one evaluation gives (every rank the same). */
typedef struct eval_result {
	double loss;          /* eval_loss: summed masked-LM cross-entropy / masked tokens */
	double perplexity;    /* exp(loss) */
	double accuracy;      /* correct / masked tokens */
	double masked;        /* masked tokens over the whole eval set */
	int batches;          /* eval batches over all ranks */
} eval_result;

/* Builds the eval set of bj for rank of world: opens bj->dataset_dirs on
 * its own (loaders or not), indexes the held-out documents, builds every
 * batch into memory it owns and closes the dataset. Returns 0 and *out
 * (caller owns, eval_set_destroy); -EINVAL when bj holds nothing out,
 * -ENODATA when the held-out documents make no sequence, or the dataset's
 * error; err says why. */
int eval_set_create(eval_set **out, const batchjob *bj, int rank, int world, char *err, size_t errlen);
void eval_set_destroy(eval_set *es);

/* Eval batches over all ranks, and this rank's count of them. */
int eval_set_batches(const eval_set *es);
int eval_set_rank_batches(const eval_set *es);
/* This rank's batch i (< eval_set_rank_batches): pointers into es. */
const bert_batch *eval_set_rank_batch(const eval_set *es, int i);

/* Writes every batch to path (docs/formats.md "Eval batches": input ids,
 * token type ids, attention mask, labels with -100 where not masked),
 * through a temporary file renamed into place. 0 or -errno. */
int eval_set_write(const eval_set *es, const char *path);

/* One forward pass without dropout on b, adding to *acc. */
typedef int (*eval_batch_fn)(void *ctx, const bert_batch *b, bert_eval_sums *acc);

/* Runs this rank's batches through fn, calling tick(tick_arg) after each
 * (NULL: none; a heartbeat for the daemon's stall watch), sums over the
 * ranks (cm, when world > 1) and fills *out. 0, fn's error, or comm's
 * (-EPIPE, -EPROTO; -EPROTO also when another rank's pass failed). */
int eval_set_run(const eval_set *es, eval_batch_fn fn, void *ctx, comm *cm, void (*tick)(void *),
		 void *tick_arg, eval_result *out);

/* eval_loss, perplexity and accuracy from summed counts. */
void eval_result_from_sums(const bert_eval_sums *s, int batches, eval_result *out);

#endif
