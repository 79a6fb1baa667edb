/* best — which checkpoint is the best so far, and which checkpoints a
 * save_total_limit keeps (HF Trainer's metric_for_best_model,
 * greater_is_better, and its rule that rotation never deletes the best).
 *
 * Pure functions over numbers: no files, no messages, no model. The loop
 * (worker/loop.c) feeds it the held-out metric of each checkpointed step;
 * checkpoint.c prunes what best_retention says. Never decides when to
 * evaluate or save.
 */
#ifndef BERTD_WORKER_BEST_H
#define BERTD_WORKER_BEST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct best_state {
    long step;      /* the best checkpoint's step; -1 while none */
    double value;   /* its metric */
} best_state;

/* No best yet. */
best_state best_none(void);
/* Offers checkpoint `step` with metric value: it becomes the best when
 * there is none yet or it is strictly better (greater or lower, as
 * greater_is_better says); a tie keeps the earlier checkpoint, as HF's
 * strict comparison does. A value that is not finite is never the best.
 * Returns whether it became the best. */
bool best_offer(best_state *b, long step, double value, bool greater_is_better);

/* Of the n complete checkpoints' steps (any order), marks keep[i] true for
 * those a limit of keep_last keeps: the keep_last newest, and the step
 * protect (the best; -1 for none) wherever it is. keep_last <= 0 keeps
 * all. Returns how many are kept. */
size_t best_retention(const long *steps, size_t n, int keep_last, long protect, bool *keep);

#endif
