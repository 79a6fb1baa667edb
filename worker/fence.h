/* fence — whether this rank's attempt may still put files into the job
 * directory (docs/multinode.md, "The attempt fence"). A multi-node rank
 * whose node was cut off keeps running after its attempt is over (Slurm
 * cannot reach it to kill it); the daemon then names another attempt, or
 * none ("over"), in the fence file, and the rank's checkpoints and exports
 * are refused before they are renamed into place. Ranks of single-node
 * jobs (BERTD_FENCE or BERTD_ATTEMPT unset) are never fenced. Reads only;
 * never writes or removes anything. */
#ifndef BERTD_WORKER_FENCE_H
#define BERTD_WORKER_FENCE_H

#include <stddef.h>

/* 0 when this process may write (no fence, or the file at BERTD_FENCE
 * names BERTD_ATTEMPT on its first line); -ESTALE with why saying which
 * attempt the job is on; -EIO with why when the file cannot be read (the
 * shared directory is gone: not writing is the safe side). */
int fence_check(char *why, size_t cap);

#endif
