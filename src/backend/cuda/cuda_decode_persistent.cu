/*
 * cuda_decode_persistent.cu — the persistent decode kernel: the whole decode step (embedding, every layer,
 * final norm + logits + argmax) in one cooperative launch, so that a token pays one launch instead of
 * ~5 kernel boundaries per layer.
 *
 * The step is a list of phases built at open (pd_phase, in device memory): embed, then per layer
 *   (RMSNorm + QKV matvec + RoPE + KV append) | attention | (O matvec + residual) |
 *   (RMSNorm + gate/up matvec + SwiGLU) | (down matvec + residual)
 * and last (RMSNorm + logits + argmax). Each phase is the same device code as the per-kernel path
 * (matvec_block, attention_item of cuda_device.cuh) split over the resident blocks, with the same split of
 * every dot product, so the results match the per-kernel path.
 *
 * Between phases, a dataflow barrier: every block is resident (cooperative launch, grid <= SMs x blocks per
 * SM); a phase has a known number of working blocks (its n_blocks; for attention, the active items), each of
 * which adds 1 to the phase's counter when done (after a fence), and a block that works in phase i first
 * waits until phase i-1's counter is full. By induction every earlier phase is then complete too (each of
 * phase i-1's blocks waited for phase i-2), so reads and writes of all earlier phases are ordered; blocks
 * idle in a phase skip it and wait only where they work. Fewer blocks than the grid take part in most
 * phases (smollm2: 36-60 of 264), so a phase boundary costs their arrivals, not the grid's. While it waits a
 * block pulls the weight rows of its share of the next matrix phase into L2. The last block to leave
 * resets the counters for the next launch.
 *
 * Status: correct (bit-identical to the per-kernel path in the tests) but measured no faster on the H200
 * (bench/RESULTS.md, CUDA): the step is bound by the latency inside each phase, not by kernel boundaries.
 * Off by default; the session option cuda_persistent = 1 or 2 turns it on.
 */
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_device.cuh"

/* This block's work in a phase is done: after a barrier of the block, thread 0 makes the block's writes
 * visible at GPU scope (fence) and adds 1 to the phase's counter (a reduction: it does not wait for it). */
static __device__ __forceinline__ void signal_phase(unsigned *count) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    }
}

/* Waits until n blocks have signalled a phase; their writes are then visible to every thread of the block
 * (thread 0 polls with relaxed loads, then one acquire fence, then a barrier of the block; an acquire load
 * at every poll may invalidate the SM's L1 each time). */
static __device__ __forceinline__ void wait_phase(const unsigned *count, int n) {
    if (threadIdx.x == 0) {
        unsigned now;
        do {
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(count) : "memory");
        } while (now < (unsigned)n);
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    __syncthreads();
}

/* Each counter on its own 128-byte line: the polls of one phase do not queue behind another's additions. */
#define PD_SYNC_STRIDE 32

template <int T>
static __device__ __forceinline__ void embed_part(const dev_weight &w, int id, float *x, int block, int n_blocks) {
    const int n = w.in;
    for (int u = block * MV_THREADS + threadIdx.x; 16 * u < n; u += n_blocks * MV_THREADS) {
        float v[16], s, b;
        dequant16<T>(w, id, 16 * u, v, s, b);
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (16 * u + i < n) x[16 * u + i] = s * v[i] + b;
    }
}

/* The attention items (active split, KV head) of block `block` of n_blocks (n_active splits hold keys), by
 * threads 0..ATT_THREADS-1. */
template <int MG, int CH>
static __device__ __forceinline__ void attention_part(const attn_args &a, int n_active, int block, int n_blocks,
                                                      float *sm) {
    for (int it = block; it < n_active * a.n_head_kv; it += n_blocks)
        attention_item<MG, CH>(a, it % n_active, it / n_active, 0, sm);
}

#define PD_DISPATCH(type, CALL)            \
    switch (type) {                        \
    case CK_F32: CALL(CK_F32); break;      \
    case CK_F16: CALL(CK_F16); break;      \
    case CK_BF16: CALL(CK_BF16); break;    \
    case CK_Q8_0: CALL(CK_Q8_0); break;    \
    case CK_Q4_0: CALL(CK_Q4_0); break;    \
    case CK_Q4_K: CALL(CK_Q4_K); break;    \
    case CK_Q6_K: CALL(CK_Q6_K); break;    \
    default: break;                        \
    }

/* How many of a block's pair groups the wait-time prefetch covers. */
#define PD_PREFETCH_ITERS 4

/* Copies phase i's arguments into shared memory: issued by the last two warps (not thread 0, which polls). */
static __device__ __forceinline__ void load_phase(const pd_phase *__restrict__ phases, int i, pd_phase *dst) {
    const int t = threadIdx.x - (MV_THREADS - 64);
    if (t < 0) return;
    const unsigned long long *src = (const unsigned long long *)(phases + i);
    for (int w = t; w < (int)(sizeof(pd_phase) / 8); w += 64) ((unsigned long long *)dst)[w] = __ldg(src + w);
}

/* BPS: blocks per SM the kernel is built for. With 2 (the matvecs' own bound) attention spills some
 * registers under the 128-register cap; with 1 nothing spills but each SM runs half the warps.
 * sync: n_phases completion counters, then the exit counter, PD_SYNC_STRIDE words apart (all zero between
 * launches). */
template <int BPS>
__global__ void __launch_bounds__(MV_THREADS, BPS)
    k_decode_persistent(const pd_phase *__restrict__ phases, int n_phases, unsigned *sync) {
    extern __shared__ __align__(16) float xs[]; /* a matvec's input, or an attention item's arrays */
    __shared__ __align__(16) pd_phase ph2[2];   /* this phase's arguments and the next one's */
    const int block = blockIdx.x;
    int prefetched = -1, prev_nb = 0;
    load_phase(phases, 0, &ph2[0]);
    for (int i = 0; i < n_phases; i++) {
        __syncthreads(); /* phase i's arguments are in; everyone is done with phase i-1's */
        const pd_phase &ph = ph2[i & 1];
        if (i + 1 < n_phases) load_phase(phases, i + 1, &ph2[(i + 1) & 1]); /* in flight during this phase */
        int nb = ph.n_blocks;
        int n_active = 0;
        if (ph.kind == PD_ATTN) { /* one item per (active split, KV head): only that many blocks take part */
            n_active = (__ldcg(ph.at.pos_dev) + ph.at.chunk) / ph.at.chunk;
            nb = min(nb, n_active * ph.at.n_head_kv);
        }
        if (block < nb) {
            if (i > 0) wait_phase(sync + (i - 1) * PD_SYNC_STRIDE, prev_nb);
            if (ph.kind == PD_MATVEC) {
#define CALL(T) matvec_block<T>(ph.mv, block, nb, xs)
                PD_DISPATCH(ph.mv.w0.type, CALL)
#undef CALL
            } else if (ph.kind == PD_ATTN) {
                if (threadIdx.x < ATT_THREADS) {
                    /* groups of at most 4 query heads per KV head in fewer registers; larger ones only in
                     * the one-block-per-SM build (the host picks it for them) */
                    if (BPS == 2 || ph.at.n_head <= 4 * ph.at.n_head_kv)
                        attention_part<4, BPS == 2 ? 4 : 8>(ph.at, n_active, block, nb, xs);
                    else
                        attention_part<ATT_MAX_G, 8>(ph.at, n_active, block, nb, xs);
                }
            } else {
                const int id = __ldcg(ph.emb_id);
#define CALL(T) embed_part<T>(ph.emb, id, ph.emb_x, block, nb)
                PD_DISPATCH(ph.emb.type, CALL)
#undef CALL
            }
            signal_phase(sync + i * PD_SYNC_STRIDE);
        }
        prev_nb = nb;
        if (i + 1 == n_phases) break;
        /* the weights of the next matrix phase into L2 while its inputs are being made (once per phase):
         * phase i+1's arguments are in shared memory after this barrier; past an attention phase, i+2's are
         * read from global memory */
        __syncthreads();
        const pd_phase &next = ph2[(i + 1) & 1];
        if (next.kind == PD_MATVEC) {
            if (prefetched != i + 1 && block < next.n_blocks) matvec_prefetch(next.mv, block, next.n_blocks, PD_PREFETCH_ITERS);
            prefetched = i + 1;
        } else if (i + 2 < n_phases && prefetched != i + 2) {
            const pd_phase &after = phases[i + 2];
            if (after.kind == PD_MATVEC && block < after.n_blocks)
                matvec_prefetch(after.mv, block, after.n_blocks, PD_PREFETCH_ITERS);
            prefetched = i + 2;
        }
    }
    /* the last block out resets the counters for the next launch (nobody reads them any more) */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(sync + n_phases * PD_SYNC_STRIDE, 1u) == gridDim.x - 1) {
            for (int i = 0; i <= n_phases; i++) sync[i * PD_SYNC_STRIDE] = 0;
            __threadfence();
        }
    }
}

size_t ck_persistent_sync_bytes(int n_phases) { return (size_t)(n_phases + 1) * PD_SYNC_STRIDE * sizeof(unsigned); }

const void *ck_persistent_kernel(int bps) {
    return bps == 1 ? (const void *)k_decode_persistent<1> : (const void *)k_decode_persistent<2>;
}

cudaError_t ck_persistent_setup(int bps, size_t smem, int *blocks_per_sm) {
    *blocks_per_sm = 0;
    const void *k = ck_persistent_kernel(bps);
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, k, MV_THREADS, smem);
    return e;
}

cudaError_t ck_persistent_launch(int bps, const pd_phase *phases, int n_phases, unsigned *sync, int grid,
                                 size_t smem, cudaStream_t st) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(MV_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (bps == 1) return cudaLaunchKernelEx(&cfg, k_decode_persistent<1>, phases, n_phases, sync);
    return cudaLaunchKernelEx(&cfg, k_decode_persistent<2>, phases, n_phases, sync);
}
