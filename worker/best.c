/* best — see best.h. */
#include "worker/best.h"

#include <math.h>

best_state best_none(void)
{
    return (best_state){.step = -1, .value = 0.0};
}

bool best_offer(best_state *b, long step, double value, bool greater_is_better)
{
    if (!isfinite(value))
        return false;
    bool better = b->step < 0 || (greater_is_better ? value > b->value : value < b->value);
    if (better)
        *b = (best_state){.step = step, .value = value};
    return better;
}

size_t best_retention(const long *steps, size_t n, int keep_last, long protect, bool *keep)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        /* rank: how many checkpoints are newer than this one */
        size_t newer = 0;
        for (size_t k = 0; k < n; k++)
            newer += steps[k] > steps[i];
        keep[i] = keep_last <= 0 || newer < (size_t)keep_last || steps[i] == protect;
        kept += keep[i];
    }
    return kept;
}
