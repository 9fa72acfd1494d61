/* rt.cpp — the CPU emulation's scheduler (tests/cuda/emu): a block's threads as fibers on one OS thread, run
 * round-robin, each until it finishes or waits at a barrier (see inc/backend/cuda/cuda_device.cuh). */
#include "cuda_runtime.h"
#include "backend/cuda/cuda_device.cuh"
dim3 threadIdx, blockIdx, gridDim, blockDim;
emu_fiber *g_fib;
int g_nfib, g_cur;
ucontext_t g_sched;
emu_bar g_block_bar, g_warp_bar[32];
uint64_t g_warp_buf[32][32];
static std::function<void()> *g_body;
static char *g_stacks;
static const size_t STK = 128 * 1024;
static void fiber_main(int i) {
    threadIdx = g_fib[i].tid;
    (*g_body)();
    g_fib[i].done = true;
    swapcontext(&g_fib[i].ctx, &g_sched);
}
void emu_run_block(unsigned n, std::function<void()> body) {
    if (!g_fib) g_fib = new emu_fiber[1024], g_stacks = (char *)malloc(1024 * STK);
    g_body = &body;
    g_nfib = (int)n;
    g_block_bar.n = (int)n, g_block_bar.count = 0;
    for (int w = 0; w < 32; w++) g_warp_bar[w].n = 32, g_warp_bar[w].count = 0;
    for (int i = 0; i < (int)n; i++) {
        getcontext(&g_fib[i].ctx);
        g_fib[i].ctx.uc_stack.ss_sp = g_stacks + (size_t)i * STK;
        g_fib[i].ctx.uc_stack.ss_size = STK;
        g_fib[i].ctx.uc_link = nullptr;
        g_fib[i].tid = dim3(i);
        g_fib[i].done = false;
        makecontext(&g_fib[i].ctx, (void (*)())fiber_main, 1, i);
    }
    for (int alive = (int)n; alive;) {
        alive = 0;
        for (int i = 0; i < (int)n; i++) {
            if (g_fib[i].done) continue;
            g_cur = i;
            swapcontext(&g_sched, &g_fib[i].ctx);
            alive += !g_fib[i].done;
        }
    }
}
