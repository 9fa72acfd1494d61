/*
 * cuda_gemm.cuh — the one tensor-core GEMM body of the CUDA backend: a tile of C = A W^T (WMMA,
 * F16 in, F32 accumulate; the weight dequantized through dequant16<T> into shared memory, 16 values a
 * thread), with the rows it reads and writes given by the caller. The dense prefill GEMM (k_gemm of
 * cuda_kernels.cu: rows in order, split-K) and the grouped MoE GEMM (k_moe_gemm of cuda_moe.cu: the rows of
 * one expert gathered through its list, that expert's weight rows) are this body with different mappings, in
 * one of two tile shapes (gemm_shape).
 * C++ (nvcc) only; include after cuda_device.cuh.
 */
#ifndef KILN_CUDA_GEMM_CUH
#define KILN_CUDA_GEMM_CUH

#include <mma.h>

#include "backend/cuda/cuda_device.cuh"

/* The two tile shapes of the one body: gemm_shape<64> (64 rows x 64 outputs x 32 k a step, 128 threads: steps
 * of few rows and the MoE experts) and gemm_shape<128> (128 x 64 x 64, 256 threads: prefill, where each
 * dequantized weight value then serves twice the rows and each step holds four times the tensor-core work per
 * barrier). In both, a thread loads A_CHUNKS pieces of 8 halves of A and dequantizes one unit of 16 weight values
 * per k step, and each warp computes a 32 x 32 piece of the tile. */
template <int BM_> struct gemm_shape {
    static constexpr int BM = BM_, BN = 64, BK = BM_ / 2, THREADS = 2 * BM_, WARPS = THREADS / 32;
    static constexpr int LD = BK + 8, CLD = BN + 4;                /* smem row strides (halves, floats) */
    static constexpr int A_PER_ROW = BK / 8, A_CHUNKS = BM * BK / 8 / THREADS;
    static constexpr int W_PER_ROW = BK / 16;                      /* units of 16 weight values per row and step */
    static constexpr int AB_BYTES = (BM + BN) * LD * 2, C_BYTES = BM * CLD * 4;
    static constexpr int SMEM = AB_BYTES > C_BYTES ? AB_BYTES : C_BYTES;
    static_assert(THREADS / W_PER_ROW == BN, "one weight unit a thread per k step");
};
typedef gemm_shape<64> gemm_small;
typedef gemm_shape<128> gemm_wide;
#define GB_M gemm_small::BM
#define GB_N gemm_small::BN
#define GB_K gemm_small::BK
#define GB_THREADS gemm_small::THREADS

/* One tile of shape S, by a block of S::THREADS threads. Tile row i (i < S::BM) is logical row t = m0 + i,
 * present when t < n_rows: it reads A row a_row(t) (lda halves per row, lda a multiple of 8, the row zero-padded
 * to a multiple of 32 halves). Tile column j is output n = n0 + j, present when n < n_out: weight row
 * w_row0 + n. The k steps [kt0, kt1) (of S::BK values) of w.in are summed; a warp whose 32 rows are all absent
 * skips its products. Then store(t, n, value) for every present (t, n), by all threads. Every thread of the
 * block must call it (it synchronises the block). The sums run over k in the same order in both shapes. */
template <int T, class S, class ARow, class Store>
static __device__ __forceinline__ void gemm_tile(const dev_weight &w, int w_row0, int n_out, const __half *A, int lda,
                                                 int m0, int n_rows, int n0, int kt0, int kt1, ARow a_row, Store store) {
    using namespace nvcuda;
    __shared__ __align__(128) unsigned char smem[S::SMEM];
    __half(*As)[S::LD] = (__half(*)[S::LD])smem;
    __half(*Bs)[S::LD] = (__half(*)[S::LD])(smem + S::BM * S::LD * 2);
    float(*Cs)[S::CLD] = (float(*)[S::CLD])smem;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const bool warp_rows = m0 + wm < n_rows;
    const int K = w.in;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    /* this thread's pieces of a k step: A_CHUNKS chunks of 8 halves of A (rows ar + 32c, column ac), one unit
     * of 16 weight values (row br, values 16 bh..) */
    constexpr int A_ROW_STEP = S::THREADS / S::A_PER_ROW;
    const int ar = tid / S::A_PER_ROW, ac = (tid % S::A_PER_ROW) * 8;
    const int br = tid / S::W_PER_ROW, bh = tid % S::W_PER_ROW;
    const __half *ap[S::A_CHUNKS];
#pragma unroll
    for (int c = 0; c < S::A_CHUNKS; c++) {
        const int t = m0 + ar + c * A_ROW_STEP;
        ap[c] = t < n_rows ? A + (long long)a_row(t) * lda : nullptr;
    }
    const bool b_ok = n0 + br < n_out;
    uint4 ra[S::A_CHUNKS];
    float rb[16], rs, rbias;

    auto load = [&](int kt) {
        const int k = kt * S::BK;
        const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int c = 0; c < S::A_CHUNKS; c++) ra[c] = ap[c] && k + ac < K ? *(const uint4 *)(ap[c] + k + ac) : z;
        const int k0 = k + 16 * bh;
        if (b_ok && k0 < K) {
            dequant16<T>(w, w_row0 + n0 + br, k0, rb, rs, rbias);
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++) rb[i] = 0.0f;
            rs = 0.0f, rbias = 0.0f;
        }
    };

    load(kt0);
    for (int kt = kt0; kt < kt1; kt++) {
#pragma unroll
        for (int c = 0; c < S::A_CHUNKS; c++) *(uint4 *)&As[ar + c * A_ROW_STEP][ac] = ra[c];
        __half2 hv[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            hv[i] = __floats2half2_rn(rs * rb[2 * i] + rbias, rs * rb[2 * i + 1] + rbias);
        *(uint4 *)&Bs[br][16 * bh] = *(const uint4 *)&hv[0];
        *(uint4 *)&Bs[br][16 * bh + 8] = *(const uint4 *)&hv[4];
        __syncthreads();
        if (kt + 1 < kt1) load(kt + 1);
        if (warp_rows) {
#pragma unroll
            for (int kk = 0; kk < S::BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
                for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &As[wm + 16 * i][kk], S::LD);
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &Bs[wn + 16 * j][kk], S::LD);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm + 16 * i][wn + 16 * j], acc[i][j], S::CLD, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < S::BM * S::BN; e += S::THREADS) {
        const int r = e / S::BN, c = e % S::BN, t = m0 + r, n = n0 + c;
        if (t < n_rows && n < n_out) store(t, n, Cs[r][c]);
    }
}

#endif
