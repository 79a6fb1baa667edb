/* comm_ranks — what the comm tests (test_comm, test_comm_net, test_comm_ddp)
 * share about their forked rank processes: the inputs every rank makes
 * from (rank, iteration, index) alone, memory the parent and the ranks
 * share, and the exit codes a rank process reports. Test-only; never
 * linked into a product binary. */
#ifndef BERTD_TESTS_COMM_RANKS_H
#define BERTD_TESTS_COMM_RANKS_H

#include <stddef.h>
#include <stdint.h>

/* exit codes of the rank processes */
enum { RC_OK = 0, RC_CREATE = 10, RC_ALLREDUCE = 11, RC_F64 = 12, RC_BCAST = 13, RC_BARRIER = 14,
       RC_EPIPE = 20, RC_ETIMEDOUT = 21, RC_EPROTO = 22, RC_OTHER = 30 };

/* A 64-bit mixer (splitmix64's finalizer): the same x, the same result. */
uint64_t comm_ranks_mix(uint64_t x);

/* The input element i of rank at iteration iter: never zero, both signs,
 * magnitudes over 2^-8..2^8, so that the order of a sum changes its
 * rounding. */
float comm_ranks_value(int rank, int iter, size_t i);

/* bytes of zeroed memory that forked children share with the parent
 * (MAP_SHARED, never unmapped: the test process owns it until it exits);
 * a cmocka failure when the mapping fails. */
void *comm_ranks_shared_alloc(size_t bytes);

/* The exit code for a comm call's error rc: RC_EPIPE, RC_ETIMEDOUT,
 * RC_EPROTO, else RC_OTHER. */
int comm_ranks_code_of(int rc);

#endif
