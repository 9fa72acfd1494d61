/* cuda_device.cuh of the CPU emulation (tests/cuda/emu): the CUDA device builtins cuda_sample.cu uses, on one OS thread: blocks run one after another,
 * each by blockDim.x fibers (ucontext); __syncthreads a barrier of the block's fibers, warp ops a barrier of
 * the warp's; a fiber at a barrier yields to the next fiber */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <ucontext.h>
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
struct emu_fiber { ucontext_t ctx; dim3 tid; bool done; };
extern dim3 threadIdx, blockIdx, gridDim, blockDim;
extern emu_fiber *g_fib;
extern int g_nfib, g_cur;
extern ucontext_t g_sched;
struct emu_bar { int n = 0, count = 0; unsigned gen = 0; };
extern emu_bar g_block_bar, g_warp_bar[32];
extern uint64_t g_warp_buf[32][32];
inline void emu_yield() { swapcontext(&g_fib[g_cur].ctx, &g_sched); threadIdx = g_fib[g_cur].tid; }
inline void emu_arrive(emu_bar &b) {
    if (++b.count == b.n) { b.count = 0; b.gen++; return; }
    const unsigned g = b.gen;
    long spins = 0;
    while (b.gen == g) {
        emu_yield();
        if (++spins > 100000000L) { fprintf(stderr, "emu: deadlock at a barrier\n"); abort(); }
    }
}
inline void __syncthreads() { emu_arrive(g_block_bar); }
template <class T> inline T emu_xchg(T v, int src) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    std::memcpy(&g_warp_buf[w][l], &v, sizeof v);
    emu_arrive(g_warp_bar[w]);
    T r;
    std::memcpy(&r, &g_warp_buf[w][src & 31], sizeof r);
    emu_arrive(g_warp_bar[w]);
    return r;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) { return emu_xchg(v, (int)(threadIdx.x & 31) ^ o); }
template <class T> inline T __shfl_sync(unsigned, T v, int s) { return emu_xchg(v, s); }
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    const int l = threadIdx.x & 31;
    return emu_xchg(v, l >= (int)d ? l - (int)d : l);
}
inline unsigned __ballot_sync(unsigned, bool q) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    g_warp_buf[w][l] = q;
    emu_arrive(g_warp_bar[w]);
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= (unsigned)(g_warp_buf[w][i] != 0) << i;
    emu_arrive(g_warp_bar[w]);
    return m;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
/* atomics: a fiber is never preempted between barriers, so plain read-modify-writes */
template <class T> inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> inline T atomicMin(T *p, T v) { T o = *p; *p = v < o ? v : o; return o; }
inline void __threadfence() {}
template <class T> inline T __ldcg(const T *p) { return *p; }
/* the vector types the sampler loads */
struct uint2 { unsigned x, y; };
struct ulonglong2 { unsigned long long x, y; };
inline ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y) { return ulonglong2{x, y}; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline unsigned long long __float2ull_rn(float f) { return (unsigned long long)llrintf(f); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
template <class T> inline T min(T a, T b) { return a < b ? a : b; }
inline void pdl_wait_then_trigger() {}
inline bool ck_pdl_on() { return false; }
void emu_run_block(unsigned nthreads, std::function<void()> body);
template <typename... KArgs, typename... Args>
static void launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t, cudaStream_t, bool, Args &&...args) {
    gridDim = grid, blockDim = block;
    for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) {
            blockIdx = dim3(x, y);
            emu_run_block(block.x, [&]() { k(args...); });
        }
}
