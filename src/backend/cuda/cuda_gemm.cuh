/*
 * cuda_gemm.cuh — the tensor-core GEMM bodies of the CUDA backend, tiles of C = A W^T (F16 in, F32 accumulate,
 * the weight dequantized into shared memory, 16 values a thread):
 *   gemm_tile       WMMA, 64 x 64 tiles, the rows it reads and writes given by the caller: the dense GEMM of
 *                   17-64 rows (k_gemm of cuda_kernels.cu: rows in order, split-K) and the grouped MoE GEMM
 *                   (k_moe_gemm of cuda_moe.cu: the rows of one expert gathered through its list)
 *   gemm_pipe_tile  mma.sync fed by ldmatrix from two shared-memory stages, 128 x 128 tiles: the dense GEMM of
 *                   more rows (prefill; k_gemm_pipe of cuda_kernels.cu)
 *   mma_16816, ldsm_x4, cp_async16   one m16n8k16 tensor-core product, ldmatrix, cp.async (also the few-rows
 *                   kernels' and the prefill attention's)
 * C++ (nvcc) only; include after cuda_device.cuh.
 */
#ifndef KILN_CUDA_GEMM_CUH
#define KILN_CUDA_GEMM_CUH

#include <mma.h>

#include "backend/cuda/cuda_device.cuh"

/* The tile shape of gemm_tile: 64 rows x 64 outputs x 32 k a step, 128 threads (steps of 17-64 rows and the MoE
 * experts). A thread loads A_CHUNKS pieces of 8 halves of A and dequantizes one unit of 16 weight values per k
 * step, and each warp computes a 32 x 32 piece of the tile. */
struct gemm_small {
    static constexpr int BM = 64, BN = 64, BK = 32, THREADS = 128, WARPS = THREADS / 32;
    static constexpr int LD = BK + 8, CLD = BN + 4;                /* smem row strides (halves, floats) */
    static constexpr int A_PER_ROW = BK / 8, A_CHUNKS = BM * BK / 8 / THREADS;
    static constexpr int W_PER_ROW = BK / 16;                      /* units of 16 weight values per row and step */
    static constexpr int AB_BYTES = (BM + BN) * LD * 2, C_BYTES = BM * CLD * 4;
    static constexpr int SMEM = AB_BYTES > C_BYTES ? AB_BYTES : C_BYTES;
    static_assert(THREADS / W_PER_ROW == BN, "one weight unit a thread per k step");
};
#define GB_M gemm_small::BM
#define GB_N gemm_small::BN
#define GB_K gemm_small::BK
#define GB_THREADS gemm_small::THREADS

/* D += A B on the tensor cores (mma m16n8k16, F16 in, F32 accumulate): a = this lane's four words of the 16 x 16
 * A fragment, b its two words of the 16 x 8 B fragment, d its four accumulators (rows g and g + 8, columns 2q and
 * 2q + 1, with g = lane / 4 and q = lane % 4). */
static __device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* One tile of shape S, by a block of S::THREADS threads. Tile row i (i < S::BM) is logical row t = m0 + i,
 * present when t < n_rows: it reads A row a_row(t) (lda halves per row, lda a multiple of 8, the row zero-padded
 * to a multiple of 32 halves). Tile column j is output n = n0 + j, present when n < n_out: weight row
 * w_row0 + n. The k steps [kt0, kt1) (of S::BK values) of w.in are summed; a warp whose 32 rows are all absent
 * skips its products. Then store(t, n, value) for every present (t, n), by all threads. Every thread of the
 * block must call it (it synchronises the block). The sums run over k in increasing order. */
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

/* ------------------------------------------------------------------ the prefill tile */

/* gemm_pipe_tile's shape: 128 rows x 128 outputs x 32 values a k step, 256 threads, 8 warps of 64 rows x 32
 * outputs (2 x 4). Two stages of shared memory, each A (BM rows) then W (BN rows), LD halves a row: the 80-byte
 * rows put the 8 rows an ldmatrix phase reads in 8 distinct 16-byte bank groups. 40 KB, so two blocks an SM. */
struct gemm_pipe {
    static constexpr int BM = 128, BN = 128, BK = 32, THREADS = 256, LD = BK + 8;
};

/* 16 bytes global -> shared without registers, zero-filled when !valid (gmem must still be a valid address). */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

/* Four 8 x 8 matrices of halves from shared memory (lane i gives the address of row i % 8 of matrix i / 8); r[j]
 * is this lane's word of matrix j: row lane / 4, halves 2 (lane % 4), + 1. */
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* The same with each matrix transposed: r[j] is this lane's word of matrix j's transpose (row lane % 4 pairs: the
 * halves at rows 2 (lane % 4), + 1 of column lane / 4), the B fragment of a matrix stored k-major. */
static __device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* One 128 x 128 tile of C = A W^T by a block of 256 threads: tile row i is row m0 + i (present when < n_rows; A
 * row t at A + t lda, lda a multiple of 8, each row zero-padded to a multiple of 32 halves), tile column j is
 * output n0 + j (present when < n_out: weight row n0 + j). The k steps [kt0, kt1) (32 values each) are summed,
 * then store(t, n, value) for every present (t, n) by the thread holding it.
 * The pipeline: at step i the tensor cores read stage i % 2 while A's rows of step i + 1 arrive in the other
 * stage by cp.async and each thread dequantizes its unit of 16 weight values of step i + 1 (loaded into registers
 * during step i - 1) into it and loads its unit of step i + 2: one barrier a step. A warp whose 64 rows are all
 * absent skips its products. Sums over k in increasing order, as gemm_tile's. */
template <int T, class Store>
static __device__ __forceinline__ void gemm_pipe_tile(const dev_weight &w, int n_out, const __half *A, int lda, int m0,
                                                      int n_rows, int n0, int kt0, int kt1, Store store) {
    using P = gemm_pipe;
    __shared__ __align__(128) __half sm[2][P::BM + P::BN][P::LD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    const bool warp_rows = m0 + wm < n_rows;

    /* A: chunk c = tid + 256 j (j = 0, 1) of a step is row c / 4, halves 8 (c % 4) .. + 7 */
    const __half *ap[2];
    bool a_ok[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int c = tid + P::THREADS * j, t = m0 + (c >> 2);
        a_ok[j] = t < n_rows;
        ap[j] = A + (long long)(a_ok[j] ? t : 0) * lda + 8 * (c & 3);
    }
    auto load_a = [&](int stage, int kt) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int c = tid + P::THREADS * j;
            cp_async16(&sm[stage][c >> 2][8 * (c & 3)], ap[j] + kt * P::BK, a_ok[j]);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };

    /* W: this thread's unit is weight row n0 + br, values 16 bh .. + 15 of a step */
    const int br = tid >> 1, bh = tid & 1;
    const bool b_row = n0 + br < n_out;
    raw16<T> rb;
    bool b_ok = false;
    auto load_b = [&](int kt) {
        const int k0 = kt * P::BK + 16 * bh;
        b_ok = b_row && k0 < w.in;
        if (b_ok) load16<T>(w, n0 + br, k0, rb);
    };
    auto store_b = [&](int stage, int kt) {
        uint32_t h[8];
        if (b_ok) {
            half16<T>(rb, kt * P::BK + 16 * bh, h);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) h[i] = 0;
        }
        uint4 *dst = (uint4 *)&sm[stage][P::BM + br][16 * bh];
        dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
        dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
    };

    float acc[4][4][4];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

    /* the warp's 64 x 32 piece from one stage: per 16 values of k, 4 A fragments (16 rows each) and 4 B
     * fragments (8 outputs each, two per ldmatrix) */
    auto compute = [&](int stage) {
        const __half(*As)[P::LD] = sm[stage];
        const __half(*Bs)[P::LD] = sm[stage] + P::BM;
#pragma unroll
        for (int kk = 0; kk < P::BK; kk += 16) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) ldsm_x4(a[mt], &As[wm + 16 * mt + (lane & 15)][kk + 8 * (lane >> 4)]);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t r[4];
                ldsm_x4(r, &Bs[wn + 16 * np + (lane & 7) + 8 * (lane >> 4)][kk + 8 * ((lane >> 3) & 1)]);
                b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) mma_16816(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
    };

    const int n = kt1 - kt0;
    if (n > 0) {
        load_a(0, kt0);
        load_b(kt0);
        store_b(0, kt0);
        if (n > 1) load_b(kt0 + 1);
    }
    for (int i = 0; i < n; i++) {
        const int st = i & 1;
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads(); /* stage st complete; every warp is done with stage st ^ 1 */
        if (i + 1 < n) {
            load_a(st ^ 1, kt0 + i + 1);
            store_b(st ^ 1, kt0 + i + 1);
            if (i + 2 < n) load_b(kt0 + i + 2);
        }
        if (warp_rows) compute(st);
    }

    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int t = m0 + wm + 16 * mt + g + 8 * h;
            if (t >= n_rows) continue;
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int c = n0 + wn + 8 * nt + 2 * q;
                if (c < n_out) store(t, c, acc[mt][nt][2 * h]);
                if (c + 1 < n_out) store(t, c + 1, acc[mt][nt][2 * h + 1]);
            }
        }
}

#endif
