/* gpu_check — helpers shared by the GPU tests: skip without a device (exit
 * 77; a driver that is there but unusable fails), device buffers filled from
 * host floats through a dtype (so CPU references see exactly the rounded
 * inputs the GPU sees), NaN-poisoned outputs, and the comparison rule.
 * Plain C on purpose: these tests must build on a GPU box that has the CUDA
 * toolkit and libc but no cmocka.
 *
 * Comparison: error = max_i |got_i - ref_i| / max_i |ref_i| (normwise
 * relative, so a value near zero is judged against the tensor's scale, not
 * against itself), and every got_i must be finite: a NaN never passes, and
 * outputs start as NaN so an element the kernel forgot to write fails.
 */
#ifndef BERTD_TESTS_GPU_CHECK_H
#define BERTD_TESTS_GPU_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

#include "kernels/cuda/kernels_cuda.h"
#include "worker/model.h"

#define TCHECK(call)                                                                      \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(e_));                                              \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

extern int gpu_failures;

/* Exits 77 (meson: SKIP) only when there is no CUDA device to test on:
 * cudaGetDeviceCount says cudaErrorNoDevice or 0, or no NVIDIA driver is
 * installed at all (cudaErrorInsufficientDriver with cudaDriverGetVersion 0:
 * a build box with the toolkit and no GPU). Any other error (a driver too
 * old for this runtime, a mismatched kernel module, devices unavailable) is
 * a real failure: prints a FAIL line with the error and the driver and
 * runtime versions, exits 1. Else prints device 0. */
void gpu_require_device(void);
/* Whether device 0 can run bf16 kernels (sm_80+); else prints one skip line
 * (a V100 runs the fp32 and fp16 parts only). */
int gpu_has_bf16(void);
/* Uniform in (-1, 1) from a fixed xorshift stream (reproducible runs). */
float frand(void);
/* n floats offset + scale * frand(); caller frees. */
float *host_rand(size_t n, float scale, float offset);
float *host_copy(const float *src, size_t n);
void *dev_alloc(size_t bytes);
/* Device buffer of n elements of dt holding h (converted on the device). */
void *dev_from(const float *h, size_t n, kdtype dt);
void dev_to(float *h, const void *d, size_t n, kdtype dt);
/* n elements of dt, all NaN. */
void *dev_nan(size_t n, kdtype dt);
int32_t *dev_ints(const int32_t *h, size_t n);
/* Rounds h in place to what dt can hold, so the CPU sees the GPU's inputs. */
void round_to(float *h, size_t n, kdtype dt);
/* 1e-5 for fp32, 1e-2 for bf16/fp16. */
double tol_for(kdtype dt);
/* The comparison rule above; prints one line; counts failures. Returns 1 if ok. */
int check_close(const char *what, kdtype dt, const float *got, const float *ref, size_t n,
                double tol);
/* The small BERT the model tests share: vocab 997, hidden 64, 2 layers of
 * heads heads (head dim 64 / heads), FFN 160, 40 positions, dropout 0.1,
 * with or without the NSP head. */
bert_config gpu_test_config(int heads, int nsp);

/* ---- forked ranks (one process per device), as the NCCL tests run them ---- */
#define GPU_RANKS_MAX 8
/* The NCCL unique id travels from rank 0 through one pipe per rank; a rank
 * sets .rank before use. A rank other than 0 closes every write end, so
 * that a rank 0 that dies makes the others read EOF, not wait. */
typedef struct gpu_ranks {
    int fds[GPU_RANKS_MAX][2];
    int world, rank;
} gpu_ranks;
/* comm_id_send_fn / comm_id_recv_fn over a gpu_ranks (ctx). 0 or -EIO. */
int gpu_ranks_id_send(void *ctx, const void *id, size_t len);
int gpu_ranks_id_recv(void *ctx, void *id, size_t len);
/* CUDA devices, counted in a short-lived child (a CUDA context must not
 * cross fork). 0 when there is nothing to run on (no device, or no NVIDIA
 * driver installed at all); -1 when CUDA is there but unusable (the child
 * prints the error with the driver and runtime versions) or the count
 * could not be had: a failure, never a skip. */
int gpu_device_count_forked(void);

#endif
