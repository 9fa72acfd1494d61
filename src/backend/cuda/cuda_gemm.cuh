/*
 * cuda_gemm.cuh — the one tensor-core GEMM body of the CUDA backend: a GB_M x GB_N tile of C = A W^T (WMMA,
 * F16 in, F32 accumulate; the weight dequantized through dequant16<T> into shared memory, 16 values a
 * thread), with the rows it reads and writes given by the caller. The dense prefill GEMM (k_gemm of
 * cuda_kernels.cu: rows in order, split-K) and the grouped MoE GEMM (k_moe_gemm of cuda_moe.cu: the rows of
 * one expert gathered through its list, that expert's weight rows) are this body with different mappings.
 * C++ (nvcc) only; include after cuda_device.cuh.
 */
#ifndef KILN_CUDA_GEMM_CUH
#define KILN_CUDA_GEMM_CUH

#include <mma.h>

#include "backend/cuda/cuda_device.cuh"

#define GB_M 64
#define GB_N 64
#define GB_K 32
#define GB_THREADS 128
#define G_LD (GB_K + 8)
#define C_LD (GB_N + 4)

/* One tile, by a block of GB_THREADS threads. Tile row i (i < GB_M) is logical row t = m0 + i, present when
 * t < n_rows: it reads A row a_row(t) (lda halves per row, lda a multiple of 8, the row zero-padded to whole
 * GB_K tiles). Tile column j is output n = n0 + j, present when n < n_out: weight row w_row0 + n. The k tiles
 * [kt0, kt1) of w.in are summed. Then store(t, n, value) for every present (t, n), by all threads. Every
 * thread of the block must call it (it synchronises the block). */
template <int T, class ARow, class Store>
static __device__ __forceinline__ void gemm_tile(const dev_weight &w, int w_row0, int n_out, const __half *A, int lda,
                                                 int m0, int n_rows, int n0, int kt0, int kt1, ARow a_row, Store store) {
    using namespace nvcuda;
    __shared__ __align__(128) unsigned char smem[GB_M * C_LD * 4];
    __half(*As)[G_LD] = (__half(*)[G_LD])smem;
    __half(*Bs)[G_LD] = (__half(*)[G_LD])(smem + GB_M * G_LD * 2);
    float(*Cs)[C_LD] = (float(*)[C_LD])smem;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int K = w.in;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    /* this thread's pieces of a tile: two 8-half chunks of A (rows ar0, ar1), one 16-value unit of W */
    const int ar0 = tid >> 2, ac = (tid & 3) * 8, ar1 = ar0 + 32;
    const int br = tid >> 1, bh = tid & 1;
    const __half *a0 = m0 + ar0 < n_rows ? A + (long long)a_row(m0 + ar0) * lda : nullptr;
    const __half *a1 = m0 + ar1 < n_rows ? A + (long long)a_row(m0 + ar1) * lda : nullptr;
    const bool b_ok = n0 + br < n_out;
    uint4 ra0, ra1;
    float rb[16], rs, rbias;

    auto load = [&](int kt) {
        const int k = kt * GB_K;
        const uint4 z = make_uint4(0, 0, 0, 0);
        ra0 = a0 ? *(const uint4 *)(a0 + k + ac) : z;
        ra1 = a1 ? *(const uint4 *)(a1 + k + ac) : z;
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
        *(uint4 *)&As[ar0][ac] = ra0;
        *(uint4 *)&As[ar1][ac] = ra1;
        __half2 hv[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            hv[i] = __floats2half2_rn(rs * rb[2 * i] + rbias, rs * rb[2 * i + 1] + rbias);
        *(uint4 *)&Bs[br][16 * bh] = *(const uint4 *)&hv[0];
        *(uint4 *)&Bs[br][16 * bh + 8] = *(const uint4 *)&hv[4];
        __syncthreads();
        if (kt + 1 < kt1) load(kt + 1);
#pragma unroll
        for (int kk = 0; kk < GB_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &As[wm + 16 * i][kk], G_LD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &Bs[wn + 16 * j][kk], G_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm + 16 * i][wn + 16 * j], acc[i][j], C_LD, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < GB_M * GB_N; e += GB_THREADS) {
        const int r = e / GB_N, c = e % GB_N, t = m0 + r, n = n0 + c;
        if (t < n_rows && n < n_out) store(t, n, Cs[r][c]);
    }
}

#endif
