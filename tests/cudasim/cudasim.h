/* cudasim.h — the internal interface of the CPU stand-in for the CUDA runtime,
 * cuBLAS/cuBLASLt and NCCL (tests/cudasim). Test-only C++17: runtime.cpp,
 * blas.cpp and nccl.cpp implement the libraries' C entry points (declared by
 * the toolkit's own headers) on the host, and share what is here. Nothing
 * outside tests/cudasim includes it.
 *
 * Device memory is host memory (guard zones around it, poisoned on free) and
 * "the device" is whoever runs the queued work:
 * - CUDASIM_STREAMS=sync (default): every piece of work runs on the calling
 *   thread before the call returns, like CUDA_LAUNCH_BLOCKING=1.
 * - CUDASIM_STREAMS=deferred: work is queued per stream and run by one
 *   device thread of the process, which lets work pile up and then runs
 *   ready stream heads in a seeded random order (biased towards the newest),
 *   honouring stream order, event waits and the legacy default stream. A
 *   missing event wait then shows as a wrong result.
 *
 * Stream capture (runtime.cpp, "stream capture and graphs"): while a stream
 * captures, what is queued on it becomes a node of a graph instead of
 * running; each cudaGraphLaunch makes the nodes' work afresh (work_maker)
 * and queues it on the launch stream like any other work.
 */
#ifndef BERTD_TESTS_CUDASIM_H
#define BERTD_TESTS_CUDASIM_H

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace cudasim {

/* Queues work on stream s (NULL = the legacy default stream). fn runs on the
 * simulated device; it returns true when finished, false while it waits on
 * something outside the process (an NCCL peer): it is called again later,
 * and the stream stays blocked behind it meanwhile (other streams go on).
 * what names the work in diagnostics. Returns cudaSuccess or an error for a
 * bad stream handle or a use that stream capture forbids (set as the last
 * error too). On a capturing stream fn is not run but kept in the graph, and
 * every launch of the graph runs a copy of it: fn must not keep state from
 * one run to the next (arguments by value, memory read when it runs). */
cudaError_t enqueue(cudaStream_t s, const char *what, std::function<bool()> fn);

/* Work that keeps state while it is polled (an NCCL collective, a host
 * function's thread) is queued as a maker: called once for an eager call,
 * at the call; on a capturing stream kept in the graph and called at every
 * cudaGraphLaunch (in launch order, on the launching thread, under the
 * runtime's lock), so that each launch runs a new instance. */
typedef std::function<std::function<bool()>()> work_maker;
cudaError_t enqueue_made(cudaStream_t s, const char *what, work_maker make);

/* Whether the device may touch [p, p + bytes): inside one live cudaMalloc /
 * cudaMallocAsync allocation or page-locked host memory (cudaMallocHost,
 * cudaHostRegister). bytes 0 checks p alone. */
bool device_accessible(const void *p, size_t bytes);
/* Whether [p, p + bytes) is inside one live device allocation (not host). */
bool is_device_memory(const void *p, size_t bytes);

/* A fault of the simulated device (bad address, kernel error, API misuse
 * that real hardware would turn into a sticky error or a crash): prints
 * "cudasim: ..." and aborts. */
[[noreturn]] void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The selected device (CUDASIM_DEVICE=h200 | v100 | v100-32 | t4; default
 * h200), its count per process (CUDASIM_DEVICES, default 1, cut by
 * CUDA_VISIBLE_DEVICES as CUDA does). */
struct profile {
    const char *key, *name;
    int major, minor;
    size_t total_mem;
    int sms;
    int smem_per_block;       /* default dynamic+static limit, bytes */
    int smem_per_block_optin; /* cudaFuncAttributeMaxDynamicSharedMemorySize ceiling */
    int smem_per_sm;
    int max_threads_per_block;
    int regs_per_block;
};
const profile &device_profile();
bool streams_deferred();

/* Checks a launch's configuration against the device profile, the stream
 * handle and cudaFuncSetAttribute, as the driver does: an error is returned
 * and left for cudaGetLastError (with a line on stderr naming the kernel). */
cudaError_t launch_check(const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                         const char *name);

/* Host nanoseconds (CLOCK_MONOTONIC). */
uint64_t now_ns();

} // namespace cudasim

#endif
