/* cuda_emu — a small SIMT emulator that lets the CUDA kernels' own source
 * (the device code of the kernels/cuda .cuh files) compile with g++ and run on the CPU,
 * so every hand-written kernel executes before any GPU run. Test-only, C++17;
 * included by the tests/unit/kernels/test_*_emu.cpp files before the .cuh
 * under test. Never include it anywhere else: it redefines CUDA keywords.
 *
 * The model:
 * - every CUDA thread of a block is an OS thread (from a pool kept across
 *   blocks); blocks of a grid run ONE AT A TIME, in a shuffled order. So
 *   blocks never race each other here, but atomics within a block do race
 *   for real.
 * - __syncthreads is a barrier over the block, __syncwarp one over the warp.
 *   The threads do NOT run in lockstep, so code that relies on implicit warp
 *   synchrony fails here instead of passing by luck. A barrier that some
 *   threads skip by returning early aborts (instead of hanging). __syncthreads_or/_and/
 *   _count are barriers with a reduction.
 * - shuffles (__shfl_sync, __shfl_xor_sync, __shfl_down_sync, __shfl_up_sync)
 *   exchange through a per-warp slot array between two warp barriers; only
 *   the full mask is accepted (a partial mask aborts: the kernels here never
 *   need one, and emulating it right is more than this is for).
 * - dynamic shared memory (the .cuh's KERNEL_DYN_SMEM / FLASH_SMEM hooks) is
 *   a fresh heap block per thread block filled with 0xFF (NaN in every float
 *   type, so a read of shared memory nobody wrote poisons the result) with a
 *   canary tail that must survive (no write past the launch's size).
 * - static __shared__ arrays become function-level `static` storage (right
 *   only because blocks run one at a time) in a section of their own, which
 *   is filled with 0xFF before every block like the dynamic shared memory.
 * - atomicAdd (float, double, int, unsigned, unsigned long long), atomicOr,
 *   atomicMax (int) are real CPU atomics (CAS loops for the float types).
 * - the _rn intrinsics are the IEEE operations (g++ on x86-64 contracts no
 *   FMA unless told to), __ldg a plain load; bf16/fp16 conversions are
 *   cuda_bf16.h / cuda_fp16.h host code (round to nearest even).
 * - cp.async (the flash2 kernels' cp16/cp_commit/cp_wait): a copy lands at
 *   the wait that covers its group, not before; copies never waited for at
 *   a thread's exit abort.
 * - wmma (nvcuda::wmma, 16x16x16, the only shape used) at its documented
 *   interface: a fragment holds the whole tile in every lane, load/store
 *   check the alignment and ldm rules, mma accumulates in fp32, and only lane
 *   0 stores (visibility to other lanes needs the kernel's own __syncwarp).
 *
 * What it cannot show: the hardware's memory model and scheduling between
 * blocks, real wmma fragment layouts, bank conflicts, occupancy, register
 * limits, launch-bound violations, anything about performance.
 */
#ifndef BERTD_TESTS_CUDA_EMU_H
#define BERTD_TESTS_CUDA_EMU_H

#define CUDA_EMU 1
#define FLASH_EMU 1

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace emu {

[[noreturn]] inline void fail(const char *what);

/* A barrier over n threads. A thread that returns from the kernel while
 * others wait at the barrier, or before others reach it, is a barrier in
 * divergent code (a hang or undefined behaviour on a GPU): it fails here
 * deterministically instead of hanging. */
struct barrier {
    std::mutex m;
    std::condition_variable cv;
    int n = 0, count = 0, exited = 0;
    unsigned long gen = 0;
    void exit();
    void wait();
};

/* ---- fibers: the other way to run a block's threads ----
 * exec::fibers runs every CUDA thread of a block as a fiber on the launching
 * OS thread: a thread runs until it waits at a barrier (or a shuffle), then
 * the next one runs; a barrier lets its threads go once all have arrived.
 * The threads of a block start in a shuffled order. Far cheaper than OS
 * threads (a switch is a few register saves, no futex), which is what lets
 * the stand-in of tests/cudasim run whole models; the unit tests keep OS
 * threads, which also race within a block for real. x86-64 only. */
enum class exec { threads, fibers };
inline exec exec_mode = exec::threads;

struct fiber_sched;
inline thread_local fiber_sched *t_sched = nullptr; // set while fibers run on this thread
inline void fiber_yield();
inline void fiber_progress();

inline void barrier::exit()
{
    if (t_sched) {
        exited++;
        if (count > 0)
            fail("a thread returned while others wait at a barrier (divergent barrier)");
        return;
    }
    std::lock_guard<std::mutex> lk(m);
    exited++;
    if (count > 0)
        fail("a thread returned while others wait at a barrier (divergent barrier)");
}

/* A barrier over n threads. A thread that returns from the kernel while
 * others wait at the barrier, or before others reach it, is a barrier in
 * divergent code (a hang or undefined behaviour on a GPU): it fails here
 * deterministically instead of hanging. */
inline void barrier::wait()
{
    if (t_sched) {
        if (exited > 0)
            fail("a barrier after some threads returned (divergent barrier)");
        unsigned long g = gen;
        fiber_progress();
        if (++count == n) {
            count = 0;
            gen++;
            return;
        }
        while (gen == g)
            fiber_yield();
        fiber_progress();
        return;
    }
    std::unique_lock<std::mutex> lk(m);
    if (exited > 0)
        fail("a barrier after some threads returned (divergent barrier)");
    unsigned long g = gen;
    if (++count == n) {
        count = 0;
        gen++;
        cv.notify_all();
        return;
    }
    cv.wait(lk, [&] { return gen != g; });
}

struct warp_state {
    barrier bar;
    unsigned char xch[32][8];
};

/* One CUDA thread's cp.async copies (16 bytes each): issued, not yet
 * committed; and committed groups, oldest first. */
struct cp_state {
    typedef std::vector<std::pair<void *, const void *>> group;
    group open;
    std::vector<group> groups;
};

struct block_state {
    barrier bar;
    std::vector<warp_state> warps;
    std::vector<cp_state> cp; // per thread (t_lin)
    unsigned char *smem = nullptr;
    int red = 0; // __syncthreads_or/_and/_count accumulator
    std::mutex red_m;
};

inline thread_local uint3 t_thread, t_block;
inline thread_local dim3 t_bdim, t_gdim;
inline thread_local int t_lin; // linear thread index within the block
inline thread_local block_state *t_blk;

inline warp_state &warp() { return t_blk->warps[(size_t)t_lin / 32]; }
inline int lane() { return t_lin & 31; }

inline int failures = 0;
[[noreturn]] inline void fail(const char *what)
{
    fprintf(stderr, "emulator: %s\n", what);
    abort(); // a broken rule is a kernel bug: stop at it
}

template <typename V> inline V shfl(unsigned mask, V v, int src_lane, bool keep_if_out)
{
    static_assert(sizeof(V) <= 8, "shuffle of a type over 8 bytes");
    if (mask != 0xffffffffu)
        fail("shuffle with a partial mask");
    warp_state &w = warp();
    int l = lane();
    memcpy(w.xch[l], &v, sizeof(V));
    w.bar.wait();
    V r = v;
    if (src_lane >= 0 && src_lane < 32)
        memcpy(&r, w.xch[src_lane], sizeof(V));
    else if (!keep_if_out)
        fail("shuffle from a lane outside the warp");
    w.bar.wait();
    return r;
}

template <typename F> inline int block_reduce(int pred, F combine)
{
    block_state &b = *t_blk;
    b.bar.wait(); // the previous reduction's readers are done
    if (t_lin == 0)
        b.red = combine.init;
    b.bar.wait();
    {
        std::lock_guard<std::mutex> lk(b.red_m);
        b.red = combine(b.red, pred);
    }
    b.bar.wait();
    return b.red;
}

template <typename T, typename F> inline T atomic_rmw(T *addr, F f)
{
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomic of 4 or 8 bytes");
    typedef typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type U;
    U *u = reinterpret_cast<U *>(addr);
    U old = __atomic_load_n(u, __ATOMIC_RELAXED), nw;
    T o, n;
    do {
        memcpy(&o, &old, sizeof o);
        n = f(o);
        memcpy(&nw, &n, sizeof n);
    } while (!__atomic_compare_exchange_n(u, &old, nw, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return o;
}

/* cp.async (sm_80+), as PTX defines it: a copy may land any time between
 * its issue and the cp.async.wait_group that covers its group. Here it
 * lands at that wait (the latest moment), so a kernel that reads the
 * destination before waiting reads what was there before. */
inline void cp_async16(void *dst, const void *src) { t_blk->cp[(size_t)t_lin].open.push_back({dst, src}); }
inline void cp_async_commit()
{
    cp_state &c = t_blk->cp[(size_t)t_lin];
    c.groups.push_back(std::move(c.open));
    c.open.clear();
}
inline void cp_async_wait(int newest_pending)
{
    cp_state &c = t_blk->cp[(size_t)t_lin];
    while ((int)c.groups.size() > newest_pending) {
        for (auto &x : c.groups.front())
            memcpy(x.first, x.second, 16);
        c.groups.erase(c.groups.begin());
    }
}
/* at a thread's exit: a copy never waited for is a kernel bug */
inline void cp_async_exit()
{
    cp_state &c = t_blk->cp[(size_t)t_lin];
    bool left = !c.open.empty();
    for (auto &g : c.groups)
        left = left || !g.empty();
    if (left)
        fail("cp.async copies a thread never waited for");
}

} // namespace emu

#define threadIdx (emu::t_thread)
#define blockIdx (emu::t_block)
#define blockDim (emu::t_bdim)
#define gridDim (emu::t_gdim)

inline void __syncthreads() { emu::t_blk->bar.wait(); }
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    if (mask != 0xffffffffu)
        emu::fail("__syncwarp with a partial mask");
    emu::warp().bar.wait();
}
struct emu_or { int init = 0; int operator()(int a, int b) const { return a | (b != 0); } };
struct emu_and { int init = 1; int operator()(int a, int b) const { return a & (b != 0); } };
struct emu_cnt { int init = 0; int operator()(int a, int b) const { return a + (b != 0); } };
inline int __syncthreads_or(int p) { return emu::block_reduce(p, emu_or()); }
inline int __syncthreads_and(int p) { return emu::block_reduce(p, emu_and()); }
inline int __syncthreads_count(int p) { return emu::block_reduce(p, emu_cnt()); }

template <typename V> inline V __shfl_sync(unsigned mask, V v, int src, int width = 32)
{
    if (width != 32)
        emu::fail("shuffle width other than 32");
    return emu::shfl(mask, v, src & 31, false);
}
template <typename V> inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32)
{
    if (width != 32)
        emu::fail("shuffle width other than 32");
    return emu::shfl(mask, v, emu::lane() ^ lane_mask, false);
}
template <typename V> inline V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
    if (width != 32)
        emu::fail("shuffle width other than 32");
    return emu::shfl(mask, v, emu::lane() + (int)delta, true);
}
template <typename V> inline V __shfl_up_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
    if (width != 32)
        emu::fail("shuffle width other than 32");
    return emu::shfl(mask, v, emu::lane() - (int)delta, true);
}

inline float atomicAdd(float *a, float v) { return emu::atomic_rmw(a, [v](float o) { return o + v; }); }
inline double atomicAdd(double *a, double v)
{
    return emu::atomic_rmw(a, [v](double o) { return o + v; });
}
inline int atomicAdd(int *a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned *a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v)
{
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
inline int atomicOr(int *a, int v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicOr(unsigned *a, unsigned v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }
inline int atomicMax(int *a, int v)
{
    return emu::atomic_rmw(a, [v](int o) { return o > v ? o : v; });
}

inline unsigned __umulhi(unsigned a, unsigned b)
{
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
[[noreturn]] inline void __trap() { emu::fail("__trap"); }
template <typename T> inline T __ldg(const T *p) { return *p; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline float __int_as_float(int x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
inline int __float_as_int(float f)
{
    int x;
    memcpy(&x, &f, sizeof x);
    return x;
}

/* ---- wmma at its documented interface ---- */
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    /* (16,16) row-major, the same in every lane: a kernel that scales
     * elements by their row (learnt by loading a tile of row numbers) sees
     * the whole tile in each lane, which is consistent with any mapping */
    enum { num_elements = 256 };
    float x[256];
};

inline float elem_f(float v) { return v; }
inline float elem_f(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float elem_f(__half v) { return __half2float(v); }

inline void check_ptr(const void *p, unsigned ldm, size_t esize)
{
    if ((uintptr_t)p % 32)
        emu::fail("wmma pointer not 256-bit aligned");
    if ((ldm * esize) % 16)
        emu::fail("wmma ldm not a multiple of 16 bytes");
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm)
{
    check_ptr(p, ldm, sizeof(T));
    const bool col = std::is_same<Layout, col_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = elem_f(col ? p[c * ldm + r] : p[r * ldm + c]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t l)
{
    check_ptr(p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v)
{
    for (float &e : f.x)
        e = v;
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
              const fragment<matrix_a, 16, 16, 16, T, LA> &a,
              const fragment<matrix_b, 16, 16, 16, T, LB> &b,
              const fragment<accumulator, 16, 16, 16, float> &c)
{
    float out[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r * 16 + n];
            for (int k = 0; k < 16; k++)
                s += a.x[r * 16 + k] * b.x[k * 16 + n];
            out[r * 16 + n] = s;
        }
    memcpy(d.x, out, sizeof out);
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t l)
{
    check_ptr(p, ldm, 4);
    if (emu::lane() != 0)
        return; // lane 0 writes; the kernel's __syncwarp publishes it
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}
} // namespace wmma
} // namespace nvcuda

/* the .cuh hooks for dynamic shared memory, and the keywords g++ must not see
 * as CUDA's (cuda_runtime.h maps __shared__ to nothing on the host, which
 * would make every thread's __shared__ array private: wrong) */
#define FLASH_SMEM(name) unsigned char *name = emu::t_blk->smem
#define KERNEL_DYN_SMEM(T, name) T *name = reinterpret_cast<T *>(emu::t_blk->smem)
#undef __shared__
#define __shared__ static __attribute__((section("emu_shared"), used))
/* the static __shared__ arrays all land in one section, which the linker
 * brackets with these two symbols; launch() poisons it before every block
 * (the anchor makes the section exist when a kernel has no such array) */
extern "C" unsigned char __start_emu_shared[], __stop_emu_shared[];
namespace emu {
__attribute__((section("emu_shared"), used)) static unsigned char shared_anchor[16];
}
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu {

constexpr size_t CANARY = 256;

/* The OS threads that play a block's CUDA threads, kept across blocks and
 * launches (creating 256 threads per block would dominate the run time).
 * run(n, f) calls f(0..n-1) on n distinct threads and returns when all are
 * done. */
class pool {
  public:
    void run(int n, const std::function<void(int)> &f)
    {
        std::unique_lock<std::mutex> lk(m_);
        while ((int)ws_.size() < n) {
            int id = (int)ws_.size();
            ws_.emplace_back([this, id] { work(id); });
        }
        job_ = &f;
        active_ = n;
        remaining_ = n;
        gen_++;
        cv_.notify_all();
        done_.wait(lk, [&] { return remaining_ == 0; });
        job_ = nullptr;
    }
    ~pool()
    {
        {
            std::lock_guard<std::mutex> lk(m_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto &w : ws_)
            w.join();
    }

  private:
    void work(int id)
    {
        unsigned long seen = 0;
        std::unique_lock<std::mutex> lk(m_);
        for (;;) {
            cv_.wait(lk, [&] { return stop_ || gen_ != seen; });
            if (stop_)
                return;
            seen = gen_;
            if (id >= active_)
                continue;
            const std::function<void(int)> *f = job_;
            lk.unlock();
            (*f)(id);
            lk.lock();
            if (--remaining_ == 0)
                done_.notify_one();
        }
    }
    std::mutex m_;
    std::condition_variable cv_, done_;
    std::vector<std::thread> ws_;
    const std::function<void(int)> *job_ = nullptr;
    int active_ = 0, remaining_ = 0;
    unsigned long gen_ = 0;
    bool stop_ = false;
};

inline pool &workers()
{
    static pool p;
    return p;
}


/* ---- the fiber scheduler (exec::fibers) ---- */
} // namespace emu

#if !defined(__x86_64__)
#error "cuda_emu.h's fibers switch stacks with x86-64 code"
#endif
/* emu_ctx_switch(save, to): saves the callee-saved registers, the SSE and
 * x87 control words and the stack pointer into *save, and resumes the
 * context whose stack pointer is `to`. emu_fiber_entry starts a new one:
 * r12 holds its argument, r13 the function (which never returns). Weak, so
 * every file that includes this header may carry the same copy. */
asm(R"(
    .text
    .weak emu_ctx_switch
    .type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch,.-emu_ctx_switch
    .weak emu_fiber_entry
    .type emu_fiber_entry,@function
emu_fiber_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size emu_fiber_entry,.-emu_fiber_entry
)");
extern "C" void emu_ctx_switch(void **save, void *to);
extern "C" void emu_fiber_entry(void);

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif
#include <sys/mman.h>

namespace emu {

struct fiber_sched {
    static constexpr size_t STACK = 256 << 10; // wmma fragments are 1 KiB each
    struct fib {
        void *sp = nullptr;
        unsigned char *stack = nullptr; // STACK bytes, a guard page below
        bool done = false;
    };
    std::vector<fib> f;
    void *sched_sp = nullptr;
    const void *sched_bottom = nullptr; // the OS thread's stack, for ASan
    size_t sched_size = 0;
    int cur = -1;
    bool progress = false;
    const std::function<void(int)> *body = nullptr;
    dim3 block;

    void grow(int n)
    {
        while ((int)f.size() < n) {
            fib x;
            void *m = mmap(nullptr, STACK + 4096, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (m == MAP_FAILED)
                fail("no memory for fiber stacks");
            mprotect(m, 4096, PROT_NONE); // a stack overflow faults
            x.stack = (unsigned char *)m + 4096;
            f.push_back(x);
        }
    }
    /* switch from the running side to `to` (a fiber's or the scheduler's
     * stack), telling ASan which stack runs next */
    void swap(void **save, void *to, const void *to_bottom, size_t to_size, bool dying)
    {
#if defined(__SANITIZE_ADDRESS__)
        void *fake = nullptr;
        __sanitizer_start_switch_fiber(dying ? nullptr : &fake, to_bottom, to_size);
        emu_ctx_switch(save, to);
        __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
        (void)to_bottom;
        (void)to_size;
        (void)dying;
        emu_ctx_switch(save, to);
#endif
    }
    static void entry(void *arg)
    {
        fiber_sched *s = (fiber_sched *)arg;
#if defined(__SANITIZE_ADDRESS__)
        __sanitizer_finish_switch_fiber(nullptr, &s->sched_bottom, &s->sched_size);
#endif
        int t = s->cur;
        (*s->body)(t);
        s->f[(size_t)t].done = true;
        s->progress = true;
        void *dead;
        s->swap(&dead, s->sched_sp, s->sched_bottom, s->sched_size, true);
        fail("a finished fiber was resumed");
    }
    uint64_t csr = 0; // this thread's SSE and x87 control words, which fibers start with
    void start(int t)
    {
        /* a fresh stack that "returns" into emu_fiber_entry: the 8-byte
         * control words, r15..rbp, then the entry's address; the entry's
         * own call then leaves the callee 16-byte aligned as the ABI wants */
        uint64_t *top = (uint64_t *)(f[(size_t)t].stack + STACK);
        uint64_t *sp = top - 2 - 8;
        sp[0] = csr;
        sp[1] = 0;                                     // r15
        sp[2] = 0;                                     // r14
        sp[3] = (uint64_t)(uintptr_t)&entry;           // r13: the function
        sp[4] = (uint64_t)(uintptr_t)this;             // r12: its argument
        sp[5] = 0;                                     // rbx
        sp[6] = 0;                                     // rbp
        sp[7] = (uint64_t)(uintptr_t)&emu_fiber_entry; // return address
        f[(size_t)t].sp = sp;
        f[(size_t)t].done = false;
    }
    std::vector<uint3> coord; // threadIdx of each linear index, for `block`
    dim3 coord_dim = dim3(0, 0, 0);
    /* runs n threads of a block until all have finished */
    void run(int n, const std::function<void(int)> &fn, uint64_t seed)
    {
        grow(n);
        body = &fn;
        uint32_t cw[2];
        __asm__ volatile("stmxcsr %0" : "=m"(cw[0]));
        __asm__ volatile("fnstcw %0" : "=m"(cw[1]));
        memcpy(&csr, cw, 8);
        if (coord_dim.x != block.x || coord_dim.y != block.y || coord_dim.z != block.z) {
            coord.resize((size_t)n);
            for (int t = 0; t < n; t++)
                coord[(size_t)t] = make_uint3((unsigned)t % block.x, (unsigned)t / block.x % block.y,
                                              (unsigned)t / (block.x * block.y));
            coord_dim = block;
        }
        order.resize((size_t)n);
        for (int i = 0; i < n; i++) {
            order[(size_t)i] = i;
            start(i);
        }
        for (int i = n; i > 1; i--) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            std::swap(order[(size_t)i - 1], order[(size_t)((seed >> 32) * (uint64_t)i >> 32)]);
        }
        fiber_sched *outer = t_sched;
        t_sched = this;
        int left = n;
        while (left > 0) {
            progress = false;
            for (int t : order) {
                fib &x = f[(size_t)t];
                if (x.done)
                    continue;
                cur = t;
                t_lin = t;
                t_thread = coord[(size_t)t];
                swap(&sched_sp, x.sp, x.stack, STACK, false);
                if (x.done)
                    left--;
            }
            if (!progress && left > 0)
                fail("threads wait at different barriers (deadlock)");
        }
        t_sched = outer;
        cur = -1;
    }
    std::vector<int> order;
    void yield()
    {
        int t = cur;
        swap(&f[(size_t)t].sp, sched_sp, sched_bottom, sched_size, false);
    }
};

inline void fiber_yield() { t_sched->yield(); }
inline void fiber_progress() { t_sched->progress = true; }

inline fiber_sched &fibers()
{
    static thread_local fiber_sched s;
    return s;
}

/* Runs kern over grid with block threads and `smem` bytes of dynamic shared
 * memory, one block at a time in a shuffled order, each block's threads as OS
 * threads. */
template <typename K, typename... A>
void launch(dim3 grid, dim3 block, size_t smem, K kern, A... args)
{
    int threads = (int)(block.x * block.y * block.z);
    if (threads <= 0 || threads > 1024)
        fail("block of 0 or more than 1024 threads");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
        fail("bad grid");
    if (smem > 227 * 1024)
        fail("more dynamic shared memory than any GPU has");
    /* blocks in a shuffled order, another one on every launch (seeded by a
     * launch counter, so a run is reproducible): a kernel must not depend
     * on block 0 running first, and a result that depends on the order the
     * blocks finish in (float atomics) changes between two launches */
    static uint64_t launches;
    size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    std::vector<size_t> order(nblocks);
    for (size_t i = 0; i < nblocks; i++)
        order[i] = i;
    uint64_t st = 0x2545F4914F6CDD1Dull ^ nblocks ^ (++launches * 0x9E3779B97F4A7C15ull);
    for (size_t i = nblocks; i > 1; i--) {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        std::swap(order[i - 1], order[st % i]);
    }
    for (size_t ob : order) {
        unsigned bx = (unsigned)(ob % grid.x), by = (unsigned)(ob / grid.x % grid.y),
                 bz = (unsigned)(ob / ((size_t)grid.x * grid.y));
        block_state blk;
        blk.bar.n = threads;
        blk.warps = std::vector<warp_state>((size_t)(threads + 31) / 32);
        blk.cp.resize((size_t)threads);
        for (size_t w = 0; w < blk.warps.size(); w++)
            blk.warps[w].bar.n = std::min(32, threads - (int)w * 32);
        blk.smem = (unsigned char *)aligned_alloc(128, (smem + CANARY + 127) & ~(size_t)127);
        memset(blk.smem, 0xFF, smem);
        memset(blk.smem + smem, 0xA5, CANARY);
        memset(__start_emu_shared, 0xFF, (size_t)(__stop_emu_shared - __start_emu_shared));
        auto body = [&](int t) {
            t_lin = t;
            t_thread = make_uint3((unsigned)t % block.x, (unsigned)t / block.x % block.y,
                                  (unsigned)t / (block.x * block.y));
            t_block = make_uint3(bx, by, bz);
            t_bdim = block;
            t_gdim = grid;
            t_blk = &blk;
            kern(args...);
            cp_async_exit();
            blk.warps[(size_t)t / 32].bar.exit();
            blk.bar.exit();
        };
        if (exec_mode == exec::fibers) {
            fiber_sched &fs = fibers();
            fs.block = block;
            t_block = make_uint3(bx, by, bz);
            t_bdim = block;
            t_gdim = grid;
            t_blk = &blk;
            fs.run(threads, body, st ^ ob);
        } else {
            workers().run(threads, body);
        }
        for (size_t i = 0; i < CANARY; i++)
            if (blk.smem[smem + i] != 0xA5)
                fail("write past the end of dynamic shared memory");
        free(blk.smem);
    }
}

/* ---- test helpers: element types, random inputs, checks ---- */
template <typename T> T to_t(float x);
template <> inline float to_t<float>(float x) { return x; }
template <> inline __nv_bfloat16 to_t<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> inline __half to_t<__half>(float x) { return __float2half(x); }
inline float from_t(float v) { return v; }
inline double from_t(double v) { return v; }
inline float from_t(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float from_t(__half v) { return __half2float(v); }

template <typename T> const char *tname();
template <> inline const char *tname<float>() { return "fp32"; }
template <> inline const char *tname<double>() { return "f64"; }
template <> inline const char *tname<__nv_bfloat16>() { return "bf16"; }
template <> inline const char *tname<__half>() { return "fp16"; }

inline uint64_t rng_state = 0x9E3779B97F4A7C15ull;
inline uint64_t urand()
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
inline float frand() // uniform in (-1, 1)
{
    return (float)((double)(urand() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Guard elements after every output: they start NaN and must stay NaN. */
enum { GUARD = 16 };

/* A buffer of n elements followed by GUARD, all NaN. */
template <typename T> std::vector<T> poisoned(size_t n)
{
    return std::vector<T>(n + GUARD, to_t<T>(NAN));
}

/* Normwise relative error of got (n elements, then GUARD that must still be
 * NaN, unless guard is false: inputs updated in place) against ref; NaN and
 * inf never pass. */
template <typename T, typename R>
bool check(const char *what, const std::vector<T> &got, const std::vector<R> &ref, size_t n,
           double tol, bool guard = true)
{
    double maxref = 0, maxerr = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = from_t(got[i]), r = (double)ref[i];
        if (!std::isfinite(g) || !std::isfinite(r)) {
            bad++;
            continue;
        }
        maxref = std::max(maxref, std::fabs(r));
        maxerr = std::max(maxerr, std::fabs(g - r));
    }
    size_t guard_bad = 0;
    if (guard)
        for (size_t i = n; i < n + GUARD; i++)
            guard_bad += !std::isnan(from_t(got[i]));
    double rel = maxref > 0 ? maxerr / maxref : (maxerr == 0 ? 0.0 : INFINITY);
    bool ok = bad == 0 && guard_bad == 0 && rel <= tol && n > 0;
    printf("%-4s %-44s %-4s rel=%.3g (tol %.0e)%s%s\n", ok ? "ok" : "FAIL", what, tname<T>(), rel,
           tol, bad ? " NON-FINITE" : "", guard_bad ? " GUARD OVERWRITTEN" : "");
    failures += !ok;
    return ok;
}

} // namespace emu

#endif
