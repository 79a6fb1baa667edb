/* daemon_gpu — the "GPU" daemon of the cudasim daemon tests
 * (test_daemon_job, test_daemon_graph): a bertd with --devices cuda that
 * runs the bertd-worker of tests/cudasim/bin (IT_CUDASIM_BIN_DIR, the CUDA
 * stand-in), passes CUDASIM_* and LD_LIBRARY_PATH to its workers, and whose
 * NCCL probe finds IT_FAKE_NCCL_DIR's libnccl.so.2 whatever this machine
 * has (the workers use the stand-in's NCCL); the corpus and dataset
 * "shakes" (3000 lines, vocab 400) being prepared, as the tests' CPU
 * daemons have them. */
#ifndef BERTD_TESTS_CUDASIM_DAEMON_GPU_H
#define BERTD_TESTS_CUDASIM_DAEMON_GPU_H

#include "it_util.h"

/* NULL (a line on stderr) when IT_CUDASIM_BIN_DIR or IT_FAKE_NCCL_DIR is
 * not set or the daemon does not start. */
it_fx *cudasim_daemon_start(void);

#endif
