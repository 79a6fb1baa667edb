/* comm_backend — what a comm backend (comm.c: shm, comm_net.cc: net,
 * comm_nccl.cu: NCCL) provides to the generic comm_* entry points. Private
 * to worker/comm*; nothing else includes it.
 */
#ifndef BERTD_WORKER_COMM_BACKEND_H
#define BERTD_WORKER_COMM_BACKEND_H

#include <stddef.h>

#include "worker/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct comm_ops {
    const char *name;
    int (*allreduce_mean)(comm *c, float *buf, size_t n);
    int (*allreduce_sum_f64)(comm *c, double *vals, int n);
    int (*barrier)(comm *c);
    int (*broadcast)(comm *c, void *buf, size_t bytes, int root);
    void (*abort)(comm *c, int err);
    void (*destroy)(comm *c); /* frees c */
} comm_ops;

/* Every backend's handle starts with this (first member), so comm_* can
 * dispatch on ops and read rank/world without knowing the backend. */
struct comm {
    const comm_ops *ops;
    int rank, world;
};

#ifdef __cplusplus
}
#endif

#endif
