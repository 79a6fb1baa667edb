/* device.h — what a kernels/cuda .cu file needs to compile with g++ and run
 * under the stand-in: the SIMT emulator of tests/unit/kernels/cuda_emu.h for
 * the device code, and KLAUNCH (common.cuh's launch macro) as a launch that
 * is checked like the driver checks it and queued on its stream.
 * tests/cudasim/kernel.cpp.in includes this, then the .cu file itself.
 */
#ifndef BERTD_TESTS_CUDASIM_DEVICE_H
#define BERTD_TESTS_CUDASIM_DEVICE_H

#include "tests/unit/kernels/cuda_emu.h"
#include "tests/cudasim/cudasim.h"

#include <tuple>
#include <type_traits>
#include <utility>

namespace cudasim {

/* Blocks run as fibers (cuda_emu.h): OS threads per CUDA thread are far too
 * slow for whole models. CUDASIM_EMU=threads picks the OS threads back. */
inline const bool emu_mode_set = [] {
    const char *e = getenv("CUDASIM_EMU");
    emu::exec_mode = e && !strcmp(e, "threads") ? emu::exec::threads : emu::exec::fibers;
    return true;
}();

/* A pointer argument must be device-accessible (a host pointer passed to a
 * kernel is a crash on a GPU); pointers inside struct arguments are not
 * seen. */
template <typename A> void check_arg(const A &a, const char *kernel, int i)
{
    if constexpr (std::is_pointer<A>::value) {
        if (a && !device_accessible((const void *)a, 0))
            fault("kernel %s: argument %d (%p) is not device memory", kernel, i, (const void *)a);
    }
}

template <typename... P> struct launch {
    void (*kern)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const char *name;

    template <typename... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
        if (launch_check((const void *)kern, grid, block, smem, stream, name) != cudaSuccess)
            return;
        /* the arguments are copied at the launch, as CUDA copies them */
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        check_all(args, std::index_sequence_for<P...>());
        auto k = kern;
        dim3 g = grid, b = block;
        size_t sm = smem;
        enqueue(stream, name, [k, g, b, sm, args] {
            std::apply([&](const auto &...x) { emu::launch(g, b, sm, k, x...); }, args);
            return true;
        });
    }

  private:
    template <typename T, size_t... I> void check_all(const T &t, std::index_sequence<I...>) const
    {
        (check_arg(std::get<I>(t), name, (int)I), ...);
    }
};

template <typename... P>
launch<P...> make_launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                         const char *name)
{
    return launch<P...>{kern, grid, block, smem, s, name};
}

} // namespace cudasim

/* cuda_runtime.h declares this typed overload for nvcc only */
template <typename... P>
inline cudaError_t cudaFuncSetAttribute(void (*f)(P...), cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute((const void *)f, attr, value);
}

#define KLAUNCH(grid, block, smem, stream, ...)                                               \
    cudasim::make_launch(__VA_ARGS__, grid, block, smem, stream, #__VA_ARGS__)

#endif
