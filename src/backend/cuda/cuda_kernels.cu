/*
 * cuda_kernels.cu — every kernel of the CUDA backend and its host launcher; the device building blocks live in cuda_device.cuh:
 *   k_matvec<T, R> decode matrix x vector, one row (R = 1) or up to R = 2, 4, 8 rows (matvec_block: its prologue
 *                  builds the inputs, copy or fused RMSNorm; its epilogue per row stores / adds to the residual /
 *                  applies RoPE and appends K,V to the cache / applies SwiGLU / writes logits and the argmax)
 *   k_matvec_mma<T> the same for 2-8 rows of the float-input types, products on tensor cores (mma)
 *   k_gemm<T>      matrix x 17-64 rows on tensor cores (WMMA, F16 in, F32 accumulate; the body is gemm_tile of
 *                  cuda_gemm.cuh)
 *   k_gemm_pipe<T> matrix x more rows (prefill): gemm_pipe_tile of cuda_gemm.cuh, 128 x 128 tiles, mma.sync
 *                  from a two-stage shared-memory pipeline
 *   k_gemm_few<T>  matrix x up to 16 rows (steps of several sequences, short prefills): mma fragments
 *                  loaded straight from the weights, split-K summed by the column's last block
 *   k_embed<T>, k_rmsnorm_rows, k_argmax_rows, k_rope_store, k_qkv_post, k_swiglu_*, k_repack   the small pieces
 */
#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_gemm.cuh"

#include <cuda_bf16.h>
#include <math.h>
#include <string.h>

#include <utility>

/* ------------------------------------------------------------------ decode: matrix x vector */

/* Row group g of a (ck_mv_group_rows(a) rows each): the same call on those rows only. */
static __device__ __forceinline__ mv_args mv_row_group(const mv_args &a, int g) {
    mv_args v = a;
    const int rg = ck_mv_group_rows(a), r0 = g * rg;
    v.nr = min(rg, (a.nr < 1 ? 1 : a.nr) - r0);
    v.x += r0 * a.x_stride, v.y += r0 * a.y_stride;
    if (a.q_out) v.q_out += r0 * a.y_stride;
    if (a.pos) v.pos += r0;
    if (a.seq) v.seq += r0;
    return v;
}

/* One row: two blocks per SM (<= 128 registers); several rows: one (their accumulators need more). Row groups
 * (a.row_groups = G): block b computes weight block b / G for group b % G, so that the G blocks reading the same
 * weights run side by side (one path for every G: a second inlined copy for G = 1 measured 4% slower on
 * llama-3.2-1b). */
template <int T, int R>
__global__ void __launch_bounds__(MV_THREADS, R == 1 ? 2 : 1) k_matvec(const __grid_constant__ mv_args a) {
    extern __shared__ float xs[];
    const int G = a.row_groups < 1 ? 1 : a.row_groups;
    matvec_block<T, R>(mv_row_group(a, (int)blockIdx.x % G), (int)blockIdx.x / G, (int)gridDim.x / G, xs);
}

/* ------------------------------------------------------------------ prefill: matrix x matrix */

/* Where a dense GEMM block's results go: split-K (gridDim.z > 1) its partial tile to work[z] (n_tok x out),
 * else into C (row t at C + t ldc + col_off; stored, or added when add). */
struct gemm_dense_store {
    float *C, *work;
    int ldc, col_off, add, out, n_tok;
    __device__ void operator()(int t, int n, float v) const {
        if (gridDim.z > 1) {
            work[((long long)blockIdx.z * n_tok + t) * out + n] = v;
        } else {
            float *dst = C + (long long)t * ldc + col_off + n;
            *dst = add ? *dst + v : v;
        }
    }
};

/* This block's stretch [kt0, kt1) of n_kt k steps when the k range is split over gridDim.z blocks. */
static __device__ __forceinline__ void gemm_k_range(int n_kt, int &kt0, int &kt1) {
    kt0 = (int)((long long)n_kt * blockIdx.z / gridDim.z), kt1 = (int)((long long)n_kt * (blockIdx.z + 1) / gridDim.z);
}

/* The dense GEMM of 17-64 rows: rows in order; split-K (gridDim.z > 1): this block's stretch of k steps, its
 * partial tile to work[z]. The body is gemm_tile (cuda_gemm.cuh), shared with the grouped MoE GEMM. */
template <int T>
__global__ void __launch_bounds__(GB_THREADS) k_gemm(const dev_weight w, const __half *A, int lda, int n_tok, float *C,
                                                     int ldc, int col_off, int add, float *work) {
    pdl_wait_then_trigger();
    int kt0, kt1;
    gemm_k_range((w.in + GB_K - 1) / GB_K, kt0, kt1);
    gemm_tile<T, gemm_small>(w, 0, w.out, A, lda, blockIdx.y * GB_M, n_tok, blockIdx.x * GB_N, kt0, kt1,
                             [](int t) { return t; }, gemm_dense_store{C, work, ldc, col_off, add, w.out, n_tok});
}

/* The dense GEMM of more rows (prefill): the same mapping on gemm_pipe_tile's 128 x 128 tiles. */
template <int T>
__global__ void __launch_bounds__(gemm_pipe::THREADS, 2) k_gemm_pipe(const dev_weight w, const __half *A, int lda,
                                                                     int n_tok, float *C, int ldc, int col_off, int add,
                                                                     float *work) {
    pdl_wait_then_trigger();
    int kt0, kt1;
    gemm_k_range((w.in + gemm_pipe::BK - 1) / gemm_pipe::BK, kt0, kt1);
    gemm_pipe_tile<T>(w, w.out, A, lda, blockIdx.y * gemm_pipe::BM, n_tok, blockIdx.x * gemm_pipe::BN, kt0, kt1,
                      gemm_dense_store{C, work, ldc, col_off, add, w.out, n_tok});
}

/* The split-K partials of a GEMM added in order of z, stored into (or added to) C. */
__global__ void __launch_bounds__(256) k_gemm_reduce(const float *work, int ks, int n_tok, int out, float *C, int ldc,
                                                     int col_off, int add) {
    pdl_wait_then_trigger();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, n = (long long)n_tok * out;
    if (i >= n) return;
    float v = 0.0f;
    for (int z = 0; z < ks; z++) v += __ldcg(work + z * n + i);
    const int t = (int)(i / out), c = (int)(i - (long long)t * out);
    float *dst = C + (long long)t * ldc + col_off + c;
    *dst = add ? *dst + v : v;
}

/* ------------------------------------------------------------------ few rows: matrix x up to FEW_ROWS vectors */

#define FEW_WARPS 4                   /* warps of a block, each every FEW_WARPS-th k step of the same outputs */
#define FEW_THREADS (32 * FEW_WARPS)
#define FEW_NT 4                      /* tiles of 8 outputs */
#define FEW_OUT (8 * FEW_NT)          /* outputs per block */

#define FEW_DEPTH 1 /* k steps in flight per warp (2: 10% slower on llama-3.2-1b at 16 rows, bench/RESULTS.md) */

/* C (=|+=) A W^T for n_rows <= 16 rows (a decode step of several sequences, a short prefill): each weight
 * value read once, straight from memory into the B fragments (no shared memory, no barrier per k step), with
 * FEW_DEPTH k steps of weights and A rows in flight per warp. Block x computes outputs 32 x .. 32 x + 31
 * (FEW_NT tiles of 8) for every row over the k steps (64 values) of split z = blockIdx.y; its warps take every
 * FEW_WARPS-th step. Lane (g, q) holds the 16 values 16q.. of a k step (of weight row g of each tile, of A rows
 * g and g + 8): the mma's logical k (2q, 2q+1, 2q+8, 2q+9) of product j are values 16q + 4j .. + 3, the same in
 * A and B, so the four products sum the 64 values. The warps' sums are added in shared memory in warp order;
 * split (gridDim.y > 1): the blocks' sums to work[z], then the last block of the column (an atomic count in
 * tiles[x], reset by it) adds them in order of z. Deterministic, one launch. */
template <int T>
__global__ void __launch_bounds__(FEW_THREADS) k_gemm_few(const dev_weight w, const __half *A, int lda, int n_rows,
                                                          float *C, int ldc, int col_off, int add, float *work,
                                                          unsigned *tiles) {
    constexpr int NACC = FEW_NT * 4, PER = NACC / FEW_WARPS; /* accumulators a lane; sums a thread */
    constexpr int STRIDE = FEW_WARPS * FEW_DEPTH;            /* k steps between a warp's uses of one buffer */
    __shared__ float red[FEW_WARPS][NACC][32];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int n_base = blockIdx.x * FEW_OUT;
    const int K = w.in, n_kt = (K + 63) / 64, ks = (int)gridDim.y, z = (int)blockIdx.y;
    const int kt0 = (int)((long long)n_kt * z / ks), kt1 = (int)((long long)n_kt * (z + 1) / ks);
    raw16<T> r[FEW_DEPTH][FEW_NT];
    uint4 ar[FEW_DEPTH][4]; /* A rows g and g + 8, halves 16q.. of a step (zero past n_rows or K) */
    auto load_w = [&](raw16<T>(&rw)[FEW_NT], int kt) {
        const int k0 = kt * 64 + 16 * q;
#pragma unroll
        for (int nt = 0; nt < FEW_NT; nt++) {
            const int row = n_base + 8 * nt + g;
            if (row < w.out && k0 < K) load16<T>(w, row, k0, rw[nt]);
            else rw[nt] = raw16<T>{};
        }
    };
    auto load_a = [&](uint4(&a)[4], int kt) {
        const int k0 = kt * 64 + 16 * q;
        const __half *a0 = A + (long long)g * lda + k0, *a1 = a0 + 8LL * lda;
        const bool in = k0 < K;
        a[0] = in && g < n_rows ? *(const uint4 *)a0 : uint4{};
        a[1] = in && g < n_rows ? *(const uint4 *)(a0 + 8) : uint4{};
        a[2] = in && g + 8 < n_rows ? *(const uint4 *)a1 : uint4{};
        a[3] = in && g + 8 < n_rows ? *(const uint4 *)(a1 + 8) : uint4{};
    };
    const int first = kt0 + warp;
#pragma unroll
    for (int d = 0; d < FEW_DEPTH; d++)
        if (first + FEW_WARPS * d < kt1) load_w(r[d], first + FEW_WARPS * d); /* independent of the grid before */
    pdl_wait_then_trigger();
#pragma unroll
    for (int d = 0; d < FEW_DEPTH; d++)
        if (first + FEW_WARPS * d < kt1) load_a(ar[d], first + FEW_WARPS * d);

    float acc[FEW_NT][4];
#pragma unroll
    for (int nt = 0; nt < FEW_NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int kb = first; kb < kt1; kb += STRIDE) {
#pragma unroll
        for (int d = 0; d < FEW_DEPTH; d++) {
            const int kt = kb + FEW_WARPS * d;
            if (kt >= kt1) break;
            uint32_t hb[FEW_NT][8]; /* B: values (2i, 2i+1) of this lane's 16, as half2 */
#pragma unroll
            for (int nt = 0; nt < FEW_NT; nt++) half16<T>(r[d][nt], kt * 64 + 16 * q, hb[nt]);
            const uint4 a4[4] = {ar[d][0], ar[d][1], ar[d][2], ar[d][3]};
            if (kt + STRIDE < kt1) load_w(r[d], kt + STRIDE), load_a(ar[d], kt + STRIDE);
            const uint32_t al[8] = {a4[0].x, a4[0].y, a4[0].z, a4[0].w, a4[1].x, a4[1].y, a4[1].z, a4[1].w};
            const uint32_t ah[8] = {a4[2].x, a4[2].y, a4[2].z, a4[2].w, a4[3].x, a4[3].y, a4[3].z, a4[3].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint32_t a[4] = {al[2 * j], ah[2 * j], al[2 * j + 1], ah[2 * j + 1]};
#pragma unroll
                for (int nt = 0; nt < FEW_NT; nt++) mma_16816(acc[nt], a, hb[nt][2 * j], hb[nt][2 * j + 1]);
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < FEW_NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[warp][nt * 4 + e][lane] = acc[nt][e];
    __syncthreads();

    /* thread i sums accumulators c = i / 32 + FEW_WARPS j of lane i % 32 over the warps; accumulator c = 4 nt + e
     * is row g + 8 (e >> 1), output n_base + 8 nt + 2q + (e & 1) */
    float sum[PER];
    int tt[PER], nn[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int c = warp + FEW_WARPS * j, e = c & 3, nt = c >> 2;
        tt[j] = g + 8 * (e >> 1), nn[j] = n_base + 8 * nt + 2 * q + (e & 1);
        sum[j] = 0.0f;
#pragma unroll
        for (int wi = 0; wi < FEW_WARPS; wi++) sum[j] += red[wi][c][lane];
    }
    if (ks > 1) {
        const long long plane = (long long)n_rows * w.out;
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (tt[j] < n_rows && nn[j] < w.out) work[z * plane + (long long)tt[j] * w.out + nn[j]] = sum[j];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&tiles[blockIdx.x], 1u) == (unsigned)ks - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int j = 0; j < PER; j++) {
            sum[j] = 0.0f;
            if (tt[j] < n_rows && nn[j] < w.out)
                for (int zz = 0; zz < ks; zz++) sum[j] += __ldcg(work + zz * plane + (long long)tt[j] * w.out + nn[j]);
        }
        if (threadIdx.x == 0) tiles[blockIdx.x] = 0;
    }
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (tt[j] < n_rows && nn[j] < w.out) {
            float *dst = C + (long long)tt[j] * ldc + col_off + nn[j];
            *dst = add ? *dst + sum[j] : sum[j];
        }
}

/* ------------------------------------------------------------------ decode: matrix x 2-8 vectors on tensor cores */

/* Halves between consecutive input rows in shared memory: a multiple of 64 plus 8, so that the 8 lanes of a
 * 16-byte load phase (two rows, 4 lanes each) hit distinct banks. */
static __host__ __device__ __forceinline__ int mvm_row_halves(int in) { return ((in + 63) & ~63) + 8; }

/* Input rows whose 16-byte loads k_matvec_mma's prologue keeps in flight together (groups of them one after
 * another). H100, 4-row steps against all 8 rows together: smollm2 +3.3%, llama-3.2-1b +2.7%; 8-row steps
 * -0.4% / -2.8%; groups of 1 or a choice by the row length inside the kernel lose more (bench/RESULTS.md, "the
 * 4-row tensor-core matvec's input prologue"). */
#define MVM_ROWS_TOGETHER 4

/* k_matvec_mma's prologue: the a.nr input rows as halves (times the norm weight) at xh + r * RH, zero-padded to
 * whole units of 16; with NORM, nred[r][warp] the warp's sum of squares of row r. The 16-byte loads of
 * MVM_ROWS_TOGETHER rows are in flight together. Ends with a barrier. */
static __device__ __forceinline__ void mvm_input(const mv_args &a, __half *xh, int RH, float (*nred)[MV_WARPS]) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int in = a.w0.in, NU = (in + 15) >> 4, nr = a.nr;
    const bool norm = a.in_mode == MV_IN_NORM;
    const bool vec = (in & 3) == 0 && (a.x_stride & 3) == 0 && ((uintptr_t)a.x & 15) == 0 &&
                     (!norm || ((uintptr_t)a.norm_w & 15) == 0);
    constexpr int G = MVM_ROWS_TOGETHER;
    float ss[CK_MV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < CK_MV_MAX_ROWS; r++) ss[r] = 0.0f;
#pragma unroll
    for (int r0 = 0; r0 < CK_MV_MAX_ROWS; r0 += G) {
        if (r0 >= nr) break;
        for (int i4 = tid; vec && i4 < in >> 2; i4 += MV_THREADS) {
            const float4 w = norm ? __ldg((const float4 *)a.norm_w + i4) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            float4 v[G];
#pragma unroll
            for (int j = 0; j < G; j++)
                v[j] = r0 + j < nr ? __ldcg((const float4 *)(a.x + (long long)(r0 + j) * a.x_stride) + i4)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int j = 0; j < G; j++) {
                if (r0 + j >= nr) break;
                __half2 *xr = (__half2 *)(xh + (r0 + j) * RH);
                xr[2 * i4] = __floats2half2_rn(v[j].x * w.x, v[j].y * w.y);
                xr[2 * i4 + 1] = __floats2half2_rn(v[j].z * w.z, v[j].w * w.w);
                ss[r0 + j] += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < CK_MV_MAX_ROWS; r++) {
        if (r >= nr) break;
        const float *x = a.x + (long long)r * a.x_stride;
        __half *xr = xh + r * RH;
        for (int i = tid; !vec && i < in; i += MV_THREADS) {
            const float v = __ldcg(x + i);
            xr[i] = __float2half_rn(v * (norm ? __ldg(a.norm_w + i) : 1.0f));
            ss[r] += v * v;
        }
        for (int i = in + tid; i < 16 * NU; i += MV_THREADS) xr[i] = __float2half_rn(0.0f);
        if (norm) ss[r] = warp_sum(ss[r]);
        if (norm && lane == 0) nred[r][warp] = ss[r];
    }
    __syncthreads();
}

/* k_matvec_mma's LOGITS tail: lane (g, q)'s running argmax of input rows 2q, 2q + 1 (bv, bi) reduced over the
 * warp per row, then over the block and the blocks (matvec_argmax). */
static __device__ __forceinline__ void mvm_argmax(const mv_args &a, int block, int n_blocks, const float bv[2],
                                                  const int bi[2]) {
    const int q = threadIdx.x & 3;
    float best_v[CK_MV_MAX_ROWS];
    int best_i[CK_MV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < CK_MV_MAX_ROWS; r++) { /* lanes 4 g + r / 2 hold row r */
        best_v[r] = (r >> 1) == q ? bv[r & 1] : -INFINITY;
        best_i[r] = (r >> 1) == q ? bi[r & 1] : 0x7FFFFFFF;
        warp_argmax(best_v[r], best_i[r]);
    }
    matvec_argmax<CK_MV_MAX_ROWS>(a, block, n_blocks, best_v, best_i);
}

/* The decode matvec of 2..CK_MV_MAX_ROWS input rows with the products on the tensor cores (mma m16n8k16, F16
 * in, F32 accumulate); the prologue (copy or RMSNorm) and the epilogues are those of matvec_block, so every
 * fused step of the float matvec runs here too. The inputs go to shared memory as half rows (times the norm
 * weight; the RMSNorm factor is applied to the sums). A warp holds a tile of 8 pairs, pair p = 8 tile + g: m = g
 * is the pair's first row (r0), m = g + 8 its second (r1), n = the input row; ksplit warps share a tile, each
 * over its own stretch of k steps (64 values: lane (g, q) converts the 16 weight values 16q.. of both rows to
 * halves with half16, as k_gemm_few does, and reads the same 16 halves of input row g). The warps' sums are
 * added in warp order and the tile's first warp runs the epilogue: lane (g, q) holds pair p for input rows 2q
 * and 2q + 1. Every output depends only on its own input row, so a row's results are the same whatever the
 * other rows are (they differ from the float one-row matvec's by the inputs' rounding to half). */
template <int T>
__global__ void __launch_bounds__(MV_THREADS, 2) k_matvec_mma(const __grid_constant__ mv_args a) {
    extern __shared__ float smem_f[];
    __half *xh = (__half *)smem_f; /* input row r at xh + r * RH */
    __shared__ float red[MV_WARPS][4][32];
    __shared__ float nred[CK_MV_MAX_ROWS][MV_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int in = a.w0.in, NU = (in + 15) >> 4, RH = mvm_row_halves(in), nr = a.nr;
    const bool dual = a.pair == MV_PAIR_DUAL;
    const int out = a.w0.out, n_pairs = dual ? out : (out + 1) >> 1, n_tiles = (n_pairs + 7) >> 3;
    const int ks_n = a.ksplit, tpb = MV_WARPS / ks_n, slot = warp / ks_n, ks = warp - slot * ks_n;
    const int n_steps = (NU + 3) >> 2, s0 = n_steps * ks / ks_n, s1 = n_steps * (ks + 1) / ks_n;
    const int block = (int)blockIdx.x, n_blocks = (int)gridDim.x;
    dev_weight w1 = a.w0; /* the second rows' matrix, built from scalars so that it stays in registers */
    w1.q = dual ? a.w1.q : a.w0.q;
    w1.d = dual ? a.w1.d : a.w0.d;
    /* this lane's pair of tile group pg (clamped to a valid one) */
    auto pair_of = [&](int pg, int &r0, int &r1) {
        const int t = min(pg * tpb + slot, n_tiles - 1), p = min(8 * t + g, n_pairs - 1);
        r0 = dual ? p : 2 * p, r1 = dual ? p : min(2 * p + 1, out - 1);
        return p;
    };
    constexpr int D = mv_units<T>(); /* k steps whose loads a lane issues together (4; wider types fewer) */
    raw16<T> ra[D], rb[D];
    auto load = [&](int pg, int sb) {
        int r0, r1;
        pair_of(pg, r0, r1);
#pragma unroll
        for (int d = 0; d < D; d++) {
            if (sb + d >= s1) break; /* past the stretch: nothing to load */
            const int u = min(4 * (sb + d) + q, NU - 1);
            load16<T>(a.w0, r0, 16 * u, ra[d]);
            load16<T>(w1, r1, 16 * u, rb[d]);
        }
    };
    /* the weights do not depend on the previous kernel: the first steps load before waiting for it */
    pdl_trigger();
    if (s0 < s1) load(block, s0);
    pdl_wait();

    mvm_input(a, xh, RH, nred);

    float bv[2] = {-INFINITY, -INFINITY}; /* LOGITS: this lane's running argmax of input rows 2q, 2q + 1 */
    int bi[2] = {0x7FFFFFFF, 0x7FFFFFFF};
    bool loaded = s0 < s1;
    for (int pg = block; pg * tpb < n_tiles; pg += n_blocks) { /* the same trip count in every warp */
        const int t = pg * tpb + slot, p = 8 * t + g;
        const bool lead = ks == 0 && t < n_tiles && p < n_pairs; /* runs the epilogue of pair p */
        const int r0 = dual ? p : 2 * p, r1 = dual ? p : 2 * p + 1;
        const bool has1 = r1 < out;
        /* the epilogue's inputs of rows 2q, 2q + 1 (residuals, positions), fetched while the weights stream */
        float y0[2] = {0.0f, 0.0f}, y1[2] = {0.0f, 0.0f};
        int pos[2] = {0, 0}, seq[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int r = 2 * q + e;
            if (!lead || r >= nr) break;
            if (a.epi == MV_EPI_ADD) {
                y0[e] = __ldcg(a.y + (long long)r * a.y_stride + r0);
                if (has1) y1[e] = __ldcg(a.y + (long long)r * a.y_stride + r1);
            }
            if (a.epi == MV_EPI_QKV) pos[e] = a.pos[r], seq[e] = a.seq ? a.seq[r] : 0;
        }
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int sb = s0; sb < s1; sb += D) {
            if (!loaded) load(pg, sb);
            loaded = false;
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int u = 4 * (sb + d) + q;
                if (sb + d >= s1) break;
                uint32_t wa[8], wb[8];
                half16<T>(ra[d], 16 * min(u, NU - 1), wa);
                half16<T>(rb[d], 16 * min(u, NU - 1), wb);
                uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0; /* input row g, halves 16u..: zero past nr or NU */
                if (u < NU && g < nr) {
                    const uint4 *xp = (const uint4 *)(xh + g * RH + 16 * u);
                    x0 = xp[0], x1 = xp[1];
                }
                const uint32_t xb[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint32_t af[4] = {wa[2 * j], wb[2 * j], wa[2 * j + 1], wb[2 * j + 1]};
                    mma_16816(c, af, xb[2 * j], xb[2 * j + 1]);
                }
            }
        }
        if (ks_n > 1) { /* the tile's warps add their stretches, in warp order */
#pragma unroll
            for (int e = 0; e < 4; e++) red[warp][e][lane] = c[e];
            __syncthreads();
            if (ks == 0)
                for (int k = 1; k < ks_n; k++)
#pragma unroll
                    for (int e = 0; e < 4; e++) c[e] += red[warp + k][e][lane];
            __syncthreads();
        }
        if (!lead) continue;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int r = 2 * q + e;
            if (r >= nr) break;
            const float scale = matvec_scale(a, nred[r]);
            matvec_epilogue(a, r, r0, r1, p, has1, c[e] * scale, c[2 + e] * scale, y0[e], y1[e], pos[e], seq[e], bv[e],
                            bi[e]);
        }
    }
    if (a.epi == MV_EPI_LOGITS) mvm_argmax(a, block, n_blocks, bv, bi);
}

/* ------------------------------------------------------------------ small pieces */

template <int T>
__global__ void __launch_bounds__(128) k_embed(const dev_weight w, const int *ids, float *x) {
    pdl_wait_then_trigger();
    const int t = blockIdx.x, row = ids[t], n = w.in;
    for (int u = threadIdx.x; u < (n + 15) / 16; u += blockDim.x) {
        float v[16], s, b;
        dequant16<T>(w, row, 16 * u, v, s, b);
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (16 * u + i < n) x[(long long)t * n + 16 * u + i] = s * v[i] + b;
    }
}

__global__ void __launch_bounds__(256) k_rmsnorm_rows(const float *x, const int *idx, const float *w, float eps, int n,
                                                      __half *out, int out_stride) {
    __shared__ float red[8];
    pdl_wait_then_trigger();
    const float *xr = x + (long long)(idx ? idx[blockIdx.x] : blockIdx.x) * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    const float scale = 1.0f / sqrtf(block_sum(ss, red) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[(long long)blockIdx.x * out_stride + i] = __float2half((xr[i] * scale) * w[i]);
}

/* One block per row: the argmax of its n values (larger value, then lower index). */
__global__ void __launch_bounds__(1024) k_argmax_rows(const float *x, int n, int *out) {
    __shared__ float bv_sh[32];
    __shared__ int bi_sh[32];
    pdl_wait_then_trigger();
    const float *xr = x + (long long)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = 0x7FFFFFFF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = __ldcg(xr + i);
        if (arg_better(v, i, bv, bi)) bv = v, bi = i;
    }
    warp_argmax(bv, bi);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) bv_sh[warp] = bv, bi_sh[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (arg_better(bv_sh[w], bi_sh[w], bv, bi)) bv = bv_sh[w], bi = bi_sh[w];
        out[blockIdx.x] = bi == 0x7FFFFFFF ? 0 : bi;
    }
}

__global__ void k_rope_store(float *qkv, int stride, int pos0, const int *pos_dev, const int *seq_dev,
                             long long seq_stride, int nq, int nk, int head_dim, int n_rot, const float *rope_freq,
                             __half *k_cache, __half *v_cache, int kv_dim) {
    pdl_wait_then_trigger();
    const int t = blockIdx.x, pos = pos_dev ? pos_dev[t] : pos0 + t;
    if (pos < 0) return; /* a padding row */
    const long long so = seq_dev ? (long long)seq_dev[t] * seq_stride : 0;
    k_cache += so, v_cache += so;
    float *row = qkv + (long long)t * stride;
    for (int pr = threadIdx.x; pr < (nq + nk) / 2; pr += blockDim.x) {
        const int gr = 2 * pr;
        float x0 = row[gr], x1 = row[gr + 1];
        const int i = (gr < nq ? gr : gr - nq) % head_dim;
        if (i < n_rot) {
            float sn, cs;
            sincosf((float)pos * rope_freq[i >> 1], &sn, &cs);
            const float y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
            x0 = y0, x1 = y1;
        }
        if (gr < nq) {
            row[gr] = x0, row[gr + 1] = x1;
        } else {
            k_cache[(long long)pos * kv_dim + gr - nq] = __float2half(x0);
            k_cache[(long long)pos * kv_dim + gr - nq + 1] = __float2half(x1);
        }
    }
    for (int i = threadIdx.x; i < nk; i += blockDim.x)
        v_cache[(long long)pos * kv_dim + i] = __float2half(row[nq + nk + i]);
}

#define QP_WARPS 4 /* heads of one k_qkv_post block, a warp each */

/* Grid (ceil(heads / QP_WARPS), rows), heads = the q, k and v heads of a row in that order: warp h takes head h
 * of row blockIdx.y: + bias, RMSNorm of the head (q and k, where the block has the weight), RoPE per pair (q and
 * k), then the K or V append (ck_qkv_post). The head goes through the warp's shared row, so that a pair's two
 * values are both the normalized ones. What does not depend on the kernel before happens before waiting for it:
 * the position (a decode step's positions are copied from the host before its first kernel), the head's bias and
 * norm weights, the sines and cosines of its pairs; then the head's values, all loads in flight together. */
__global__ void __launch_bounds__(32 * QP_WARPS) k_qkv_post(qkv_post_args a) {
    constexpr int PER = 256 / 32; /* values of a head a lane holds at most (head_dim <= 256: cuda_open checks) */
    __shared__ float hs[QP_WARPS][256];
    const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = a.head_dim;
    const int h = blockIdx.x * QP_WARPS + warp, nqh = a.nq / hd, nkh = a.nk / hd;
    if (h >= nqh + 2 * nkh) return;
    const int pos = a.pos_dev ? a.pos_dev[t] : a.pos0 + t, half = a.n_rot / 2;
    const float *bias = a.bias ? a.bias + h * hd : NULL;
    const float *w = h < nqh ? a.q_norm : h < nqh + nkh ? a.k_norm : NULL;
    float bv[PER], wv[PER], sn[PER / 2], cs[PER / 2];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = lane + 32 * k;
        bv[k] = bias && i < hd ? bias[i] : 0.0f;
        wv[k] = w && i < hd ? w[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < PER / 2; k++) { /* pair j = lane + 32 k */
        const int j = lane + 32 * k;
        sn[k] = 0.0f, cs[k] = 1.0f;
        if (j < hd / 2 && j < half && h < nqh + nkh) sincosf((float)pos * a.rope_freq[j], &sn[k], &cs[k]);
    }
    pdl_wait_then_trigger();
    const long long so = a.seq_dev && pos >= 0 ? (long long)a.seq_dev[t] * a.seq_stride : 0;
    float *x = a.qkv + (long long)t * a.stride + h * hd, *xs = hs[warp];
    float xv[PER], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < PER; k++) xv[k] = lane + 32 * k < hd ? x[lane + 32 * k] : 0.0f;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = lane + 32 * k;
        if (i >= hd) break;
        const float v = bias ? xv[k] + bv[k] : xv[k];
        xs[i] = v, ss += v * v;
    }
    if (w) {
        const float sc = 1.0f / sqrtf(warp_sum(ss) / (float)hd + a.eps);
#pragma unroll
        for (int k = 0; k < PER; k++)
            if (lane + 32 * k < hd) xs[lane + 32 * k] = xs[lane + 32 * k] * sc * wv[k];
    }
    __syncwarp();
    if (h >= nqh + nkh) { /* a v head: the append (and the biased values back into the row) */
        for (int i = lane; i < hd; i += 32) {
            if (bias) x[i] = xs[i];
            if (pos >= 0) a.v_cache[so + (long long)pos * a.kv_dim + (h - nqh - nkh) * hd + i] = __float2half(xs[i]);
        }
        return;
    }
    __half *k = h >= nqh && pos >= 0 ? a.k_cache + so + (long long)pos * a.kv_dim + (h - nqh) * hd : NULL;
#pragma unroll
    for (int m = 0; m < PER / 2; m++) { /* pair j of the head */
        const int j = lane + 32 * m;
        if (j >= hd / 2) break;
        int i0 = 2 * j, i1 = 2 * j + 1;
        if (a.neox && j < half) i0 = j, i1 = j + half;
        float x0 = xs[i0], x1 = xs[i1];
        if (j < half) {
            const float y0 = x0 * cs[m] - x1 * sn[m], y1 = x0 * sn[m] + x1 * cs[m];
            x0 = y0, x1 = y1;
        }
        x[i0] = x0, x[i1] = x1;
        if (k) k[i0] = __float2half(x0), k[i1] = __float2half(x1);
    }
}

__global__ void k_swiglu_rows(const float *g, const float *u, int n, __half *out, int out_stride) {
    pdl_wait_then_trigger();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= n) return;
    const float gv = g[(long long)t * n + i];
    out[(long long)t * out_stride + i] = __float2half(gv / (1.0f + expf(-gv)) * u[(long long)t * n + i]);
}

__global__ void k_swiglu_vec(const float *g, const float *u, int n, float *out) {
    pdl_wait_then_trigger();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* Block b of the GGUF rows: its quant bytes to q, its metadata bytes to its slot of d (zero-padded). */
__global__ void k_repack(const uint8_t *src, long long n_blocks, const ck_layout L, uint8_t *dst_q, __half *dst_d) {
    pdl_wait_then_trigger();
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint8_t *s = src + b * L.bytes;
    uint8_t *q = dst_q + b * L.q_len, *m = (uint8_t *)dst_d + b * L.meta_slot;
    for (int i = 0; i < L.q_len; i++) q[i] = s[L.q_off + i];
    for (int i = 0; i < L.meta_slot; i++) m[i] = i < L.meta_len ? s[L.meta_off + i] : 0;
}

/* ------------------------------------------------------------------ kernel table and launchers */

static const struct {
    const void *fn;
    const char *name;
} kernel_table[] = {
#define MV_ENTRY(T) {(const void *)k_matvec<T, 1>, "matvec<" #T ">"}, \
                    {(const void *)k_matvec<T, 2>, "matvec2<" #T ">"},   \
                    {(const void *)k_matvec<T, 4>, "matvec4<" #T ">"},   \
                    {(const void *)k_matvec<T, CK_MV_MAX_ROWS>, "matvec8<" #T ">"}, \
                    {(const void *)k_matvec_mma<T>, "matvec_mma<" #T ">"},
#define GEMM_ENTRY(T) {(const void *)k_gemm<T>, "gemm<" #T ">"}, \
                      {(const void *)k_gemm_pipe<T>, "gemm_pipe<" #T ">"},
#define FEW_ENTRY(T) {(const void *)k_gemm_few<T>, "gemm_few<" #T ">"},
#define EMB_ENTRY(T) {(const void *)k_embed<T>, "embed<" #T ">"},
    CK_TYPES(MV_ENTRY) CK_TYPES(GEMM_ENTRY) CK_TYPES(FEW_ENTRY) CK_TYPES(EMB_ENTRY)
    {(const void *)k_gemm_reduce, "gemm_reduce"},
    {(const void *)k_rmsnorm_rows, "rmsnorm_rows"},
    {(const void *)k_argmax_rows, "argmax_rows"},
    {(const void *)k_rope_store, "rope_store"},
    {(const void *)k_qkv_post, "qkv_post"},
    {(const void *)k_swiglu_rows, "swiglu_rows"},
    {(const void *)k_swiglu_vec, "swiglu_vec"},
    {(const void *)k_repack, "repack"},
};

/* per thread, set from the session at the start of each of its calls (no process-wide state) */
static thread_local bool g_pdl = false;
void ck_set_pdl(bool on) { g_pdl = on; }
bool ck_pdl_on(void) { return g_pdl; }

#define N_TABLE ((int)(sizeof kernel_table / sizeof kernel_table[0]))
/* this file's kernels, then the attention kernels (cuda_attention.cu) */
int ck_kernel_count(void) { return N_TABLE + ck_attn_kernel_count(); }
const void *ck_kernel_at(int i) { return i < N_TABLE ? kernel_table[i].fn : ck_attn_kernel_at(i - N_TABLE); }
const char *ck_kernel_name(int i) { return i < N_TABLE ? kernel_table[i].name : ck_attn_kernel_name(i - N_TABLE); }

/* per row: the transposed input (16 * NUP <= padded n + 16 floats) and, for the 8-bit input types, each
 * 32-value block's amax and level sum (matvec_input) */
size_t ck_matvec_smem(int n) { return (size_t)(((n + 15) & ~15) + 16 + 2 * ((n + 31) / 32)) * sizeof(float); }

size_t ck_matvec_smem_rows(int n, int nr) { return (size_t)(nr > 1 ? nr : 1) * ck_matvec_smem(n); }

size_t ck_matvec_mma_smem(int n, int nr) { return (size_t)nr * mvm_row_halves(n) * 2; }

size_t ck_matvec_smem_for(int type, int n, int nr) {
    return nr > 1 && ck_mv_mma(type) ? ck_matvec_mma_smem(n, nr) : ck_matvec_smem_rows(n, nr);
}

int ck_matvec_max_rows(int n, size_t smem_limit) {
    int nr = CK_MV_MAX_ROWS;
    while (nr > 0 && ck_matvec_smem_rows(n, nr) > smem_limit) nr--;
    return nr;
}

cudaError_t ck_set_matvec_smem(size_t bytes) {
    cudaError_t e = cudaSuccess;
#define MV_ATTR1(T, R)                                                                                           \
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_matvec<T, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
#define MV_ATTR(T) MV_ATTR1(T, 1) MV_ATTR1(T, 2) MV_ATTR1(T, 4) MV_ATTR1(T, CK_MV_MAX_ROWS)                  \
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_matvec_mma<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    CK_TYPES(MV_ATTR)
#undef MV_ATTR
#undef MV_ATTR1
    return e;
}

/* The grid of one group of nr rows (sets a.ksplit): one wave, one prologue per slot. */
static int plan_rows(mv_args &a, int nr, int n_sm) {
    const int n_pairs = a.pair == MV_PAIR_DUAL ? a.w0.out : (a.w0.out + 1) / 2;
    const int n_units = (a.w0.in + 15) / 16;
    /* blocks an SM holds at once (k_matvec's launch bounds): two of one row, one of several */
    const int per_sm = nr > 1 ? 1 : 2;
    /* split each pair's units over 2..8 warps while there are too few pairs to give every warp slot of
     * one wave its own, and every lane keeps at least one unit */
    const int slots = per_sm * n_sm * MV_WARPS;
    int ks = 1;
    while (ks < MV_WARPS && n_pairs * ks * 2 <= slots && n_units / (ks * 2) >= 32) ks *= 2;
    a.ksplit = ks;
    const int ppb = MV_WARPS / ks;
    int blocks = (n_pairs + ppb - 1) / ppb;
    const int cap = n_sm * per_sm;
    return blocks < cap ? blocks : cap;
}

/* The grid of k_matvec_mma (sets a.ksplit, one row group): tiles of 8 pairs, ksplit warps a tile while the
 * tiles alone leave warp slots of one wave (two blocks an SM) idle, every warp keeping a k step at least. */
static int plan_mma(mv_args &a, int n_sm) {
    const int n_pairs = a.pair == MV_PAIR_DUAL ? a.w0.out : (a.w0.out + 1) / 2, n_tiles = (n_pairs + 7) / 8;
    const int n_steps = ((a.w0.in + 15) / 16 + 3) / 4, slots = 2 * n_sm * MV_WARPS;
    int ks = 1;
    while (ks < MV_WARPS && n_tiles * ks * 2 <= slots && n_steps >= ks * 2) ks *= 2;
    a.ksplit = ks;
    a.row_groups = 1;
    const int tpb = MV_WARPS / ks, blocks = (n_tiles + tpb - 1) / tpb;
    return blocks < 2 * n_sm ? blocks : 2 * n_sm;
}

static bool mv_on_mma(const mv_args &a) { return a.nr > 1 && ck_mv_mma(a.w0.type); }

int ck_matvec_plan(mv_args &a, int n_sm) {
    const int nr = a.nr < 1 ? 1 : a.nr;
    if (mv_on_mma(a)) return plan_mma(a, n_sm);
    /* the most row groups (every group non-empty) whose blocks together still fit one wave; LOGITS: one (its
     * argmax tail counts the blocks of one group) */
    for (int G = nr; G > 1 && a.epi != MV_EPI_LOGITS; G--) {
        const int rg = (nr + G - 1) / G;
        if ((G - 1) * rg >= nr) continue;
        mv_args t = a;
        const int blocks = plan_rows(t, rg, n_sm);
        if (G * blocks <= (rg > 1 ? 1 : 2) * n_sm) {
            a = t;
            a.row_groups = G;
            return G * blocks;
        }
    }
    a.row_groups = 1;
    return plan_rows(a, nr, n_sm);
}

/* L(T) for the CK_* value T of `type` (L: the caller's launch macro, defined around the use). */
#define DISPATCH(type) ck_with_type(type, [&](auto t_) { L(decltype(t_)::value); });

void ck_matvec(const mv_args &a, int n_blocks, cudaStream_t st) {
    if (mv_on_mma(a)) {
#define L(T) launch(k_matvec_mma<T>, dim3(n_blocks), dim3(MV_THREADS), ck_matvec_mma_smem(a.w0.in, a.nr), st, true, a)
        DISPATCH(a.w0.type)
#undef L
        return;
    }
    const int nr = ck_mv_group_rows(a); /* the rows of one block */
    const size_t smem = ck_matvec_smem_rows(a.w0.in, nr);
    /* several rows: the kernel for the next power of two (its rows past nr are computed and dropped) */
    if (nr > 4) {
#define L(T) launch(k_matvec<T, CK_MV_MAX_ROWS>, dim3(n_blocks), dim3(MV_THREADS), smem, st, true, a)
        DISPATCH(a.w0.type)
#undef L
    } else if (nr > 2) {
#define L(T) launch(k_matvec<T, 4>, dim3(n_blocks), dim3(MV_THREADS), smem, st, true, a)
        DISPATCH(a.w0.type)
#undef L
    } else if (nr == 2) {
#define L(T) launch(k_matvec<T, 2>, dim3(n_blocks), dim3(MV_THREADS), smem, st, true, a)
        DISPATCH(a.w0.type)
#undef L
    } else {
#define L(T) launch(k_matvec<T, 1>, dim3(n_blocks), dim3(MV_THREADS), smem, st, true, a)
        DISPATCH(a.w0.type)
#undef L
    }
}

void ck_embed(const dev_weight &w, const int *ids, float *x, int n_tok, cudaStream_t st) {
#define L(T) launch(k_embed<T>, dim3(n_tok), dim3(128), 0, st, false, w, ids, x)
    DISPATCH(w.type)
#undef L
}

void ck_rmsnorm_rows(const float *x, const int *idx, const float *w, float eps, int n, int n_tok, __half *out,
                     int out_stride, cudaStream_t st) {
    launch(k_rmsnorm_rows, dim3(n_tok), dim3(256), 0, st, true, x, idx, w, eps, n, out, out_stride);
}

void ck_argmax_rows(const float *x, int n, int n_rows, int *out, cudaStream_t st) {
    launch(k_argmax_rows, dim3(n_rows), dim3(1024), 0, st, true, x, n, out);
}

/* Calls of up to FEW_ROWS rows take the few-rows kernel, up to 64 the small tiles, more (prefill) the pipelined
 * 128 x 128 tiles. */
static bool gemm_is_few(int n_tok) { return n_tok <= FEW_ROWS; }
static bool gemm_is_pipe(int n_tok) { return n_tok > GB_M; }

static void gemm_launch(const dev_weight &w, const __half *A, int lda, int n_tok, float *C, int ldc, int col_off,
                        bool add, int ks, float *work, cudaStream_t st) {
    const unsigned z = ks > 1 ? (unsigned)ks : 1u;
    if (gemm_is_pipe(n_tok)) {
        const dim3 grid((w.out + gemm_pipe::BN - 1) / gemm_pipe::BN, (n_tok + gemm_pipe::BM - 1) / gemm_pipe::BM, z);
#define L(T) launch(k_gemm_pipe<T>, grid, dim3(gemm_pipe::THREADS), 0, st, true, w, A, lda, n_tok, C, ldc, col_off, \
                    add ? 1 : 0, work)
        DISPATCH(w.type)
#undef L
    } else {
        const dim3 grid((w.out + GB_N - 1) / GB_N, (n_tok + GB_M - 1) / GB_M, z);
#define L(T) launch(k_gemm<T>, grid, dim3(GB_THREADS), 0, st, true, w, A, lda, n_tok, C, ldc, col_off, add ? 1 : 0, work)
        DISPATCH(w.type)
#undef L
    }
}

static void gemm_few_launch(const dev_weight &w, const __half *A, int lda, int n_tok, float *C, int ldc, int col_off,
                            bool add, int ks, float *work, unsigned *tiles, cudaStream_t st) {
    const dim3 grid((unsigned)ck_gemm_tile_counters(w.out), ks > 1 ? ks : 1);
#define L(T) launch(k_gemm_few<T>, grid, dim3(FEW_THREADS), 0, st, true, w, A, lda, n_tok, C, ldc, col_off, \
                    add ? 1 : 0, work, tiles)
    DISPATCH(w.type)
#undef L
}

int ck_gemm_tile_counters(int out) { return (out + FEW_OUT - 1) / FEW_OUT; }

void ck_gemm_split(const dev_weight &w, const __half *A, int lda, int n_tok, float *C, int ldc, int col_off, bool add,
                   int ks, float *work, unsigned *tiles, cudaStream_t st) {
    if (gemm_is_few(n_tok)) {
        gemm_few_launch(w, A, lda, n_tok, C, ldc, col_off, add, ks, work, tiles, st);
        return;
    }
    gemm_launch(w, A, lda, n_tok, C, ldc, col_off, add, ks, work, st);
    if (ks > 1) {
        const long long n = (long long)n_tok * w.out;
        launch(k_gemm_reduce, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, st, true, (const float *)work, ks, n_tok,
               w.out, C, ldc, col_off, add ? 1 : 0);
    }
}

void ck_gemm(const dev_weight &w, const __half *A, int lda, int n_tok, float *C, int ldc, int col_off, bool add,
             cudaStream_t st) {
    ck_gemm_split(w, A, lda, n_tok, C, ldc, col_off, add, 1, NULL, NULL, st);
}

/* Few rows: enough splits for FEW_BLOCKS_PER_SM blocks per SM, each split a k step for every warp, at most 8.
 * Small tiles: enough splits for two blocks per SM, rounded up, at least 3 k steps (96 values) each. Pipelined
 * tiles (prefill): only as many as fit in those two blocks per SM, rounded down, so that a grid already filling
 * the GPU stays whole, and at least 192 values each (the stretch measured for the former 64-value steps: every
 * split writes and the reduce reads back a partial of n_tok x out floats). */
static int gemm_splits(const dev_weight &w, int n_tok, int n_sm) {
    const bool pipe = gemm_is_pipe(n_tok);
    const int BM = pipe ? gemm_pipe::BM : GB_M, BN = pipe ? gemm_pipe::BN : GB_N, BK = pipe ? gemm_pipe::BK : GB_K;
    const int blocks = ((w.out + BN - 1) / BN) * ((n_tok + BM - 1) / BM), n_kt = (w.in + BK - 1) / BK;
    const int min_steps = pipe ? 192 / gemm_pipe::BK : 3;
    int ks = pipe ? 2 * n_sm / blocks : (2 * n_sm + blocks - 1) / blocks;
    if (ks > n_kt / min_steps) ks = n_kt / min_steps;
    if (ks > 16) ks = 16;
    return ks < 1 ? 1 : ks;
}

#define FEW_BLOCKS_PER_SM 2
static int gemm_few_splits(const dev_weight &w, int n_sm) {
    const int blocks = ck_gemm_tile_counters(w.out), n_kt = (w.in + 63) / 64;
    int ks = (FEW_BLOCKS_PER_SM * n_sm + blocks - 1) / blocks;
    if (ks > n_kt / FEW_WARPS) ks = n_kt / FEW_WARPS; /* a k step for every warp */
    if (ks > 8) ks = 8;
    return ks < 1 ? 1 : ks;
}

int ck_gemm_splits(const dev_weight &w, int n_tok, int n_sm) {
    if (gemm_is_few(n_tok)) return gemm_few_splits(w, n_sm);
    return gemm_splits(w, n_tok, n_sm);
}

void ck_rope_store(float *qkv, int stride, int n_tok, int pos0, const int *pos_dev, const int *seq_dev,
                   long long seq_stride, int nq, int nk, int head_dim, int n_rot, const float *rope_freq,
                   __half *k_cache, __half *v_cache, int kv_dim, cudaStream_t st) {
    launch(k_rope_store, dim3(n_tok), dim3(256), 0, st, true, qkv, stride, pos0, pos_dev, seq_dev, seq_stride, nq, nk,
           head_dim, n_rot, rope_freq, k_cache, v_cache, kv_dim);
}

void ck_qkv_post(const qkv_post_args &a, int n_tok, cudaStream_t st) {
    const int heads = (a.nq + 2 * a.nk) / a.head_dim;
    launch(k_qkv_post, dim3((heads + QP_WARPS - 1) / QP_WARPS, n_tok), dim3(32 * QP_WARPS), 0, st, true, a);
}

void ck_swiglu_rows(const float *g, const float *u, int n, int n_tok, __half *out, int out_stride, cudaStream_t st) {
    launch(k_swiglu_rows, dim3((n + 255) / 256, n_tok), dim3(256), 0, st, true, g, u, n, out, out_stride);
}

void ck_swiglu_vec(const float *g, const float *u, int n, float *out, cudaStream_t st) {
    launch(k_swiglu_vec, dim3((n + 255) / 256), dim3(256), 0, st, true, g, u, n, out);
}

void ck_repack(const uint8_t *src, long long n_blocks, const ck_layout &L, uint8_t *dst_q, __half *dst_d, cudaStream_t st) {
    if (n_blocks <= 0) return;
    k_repack<<<(unsigned)((n_blocks + 255) / 256), 256, 0, st>>>(src, n_blocks, L, dst_q, dst_d);
}
