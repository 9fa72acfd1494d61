/*
 * cpu_gemm_avx2.c — register-tiled block products (cpu_gemm.h) for Q8_0, Q4_0 and Q4_K weights. A tile is up to
 * TM weight rows x TN activation rows; per pair the float operations are those of the single dot in
 * formats/dot_avx2.c in the same order (one accumulator per pair, blocks in order, the same scale
 * products, the same final reduction), so each result is bit-identical to it. Integer partial sums are
 * exact, so how they are grouped does not matter. The gain: a weight block is loaded and unpacked once per
 * TN activation rows, an activation block loaded once per TM weight rows. The small-batch products of decode
 * (cpu_gemm_rows_*) walk one weight row at a time against up to 8 activation rows, with the same per-pair
 * operations.
 */
#include "backend/cpu/cpu_gemm.h"

#include <stdbool.h>
#include <string.h>

#include "base/error.h"
#include "formats/blocks.h"
#include "formats/simd_avx2.h"

#define INLINE __attribute__((always_inline)) inline
/* the tile loops have constant bounds once inlined: unrolled, their arrays live in registers */
#define UNROLL _Pragma("GCC unroll 4")

/* ----------------------------------------------------------------------------------- Q8_0, Q4_0 */

/* The single dots per pair: acc = fmadd(h2f(x.d) * h2f(y.d), int block sum, acc); yd holds h2f(y.d) (exact),
 * and the product of two broadcasts is the scalar product in every lane. The int block sum: Q8_0
 * dot_i8_i8(x, y); Q4_0 (nibbles q) maddubs(q, y) - maddubs(8, y), pairwise summed (q4_0_block in
 * dot_avx2.c), whose second term depends on y alone and is taken once per activation block. */
AVX2 static INLINE void legacy_tile(const cpu_gemm_args *a, int r, int b, const int tm, const int tn, const bool q4) {
    const int nb = a->n / QK8_0;
    const size_t xblock = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8);
    const uint8_t *x[4];
    const block_q8_0 *y[4];
    const float *yd[4];
    __m256 acc[4][4];
    UNROLL for (int i = 0; i < tm; i++) x[i] = a->w + (size_t)(r + i) * a->w_stride;
    UNROLL for (int j = 0; j < tn; j++) {
        y[j] = (const block_q8_0 *)(a->y + (size_t)(b + j) * a->y_stride);
        yd[j] = a->yd + (size_t)(b + j) * nb;
        UNROLL for (int i = 0; i < tm; i++) acc[i][j] = _mm256_setzero_ps();
    }
    for (int ib = 0; ib < nb; ib++) {
        __m256i yq[4], y8[4];
        __m256 dy[4];
        UNROLL for (int j = 0; j < tn; j++) {
            yq[j] = _mm256_loadu_si256((const __m256i *)y[j][ib].qs);
            if (q4) y8[j] = _mm256_maddubs_epi16(eight, yq[j]);
            dy[j] = _mm256_broadcast_ss(&yd[j][ib]);
        }
        UNROLL for (int i = 0; i < tm; i++) {
            const uint8_t *xb = x[i] + (size_t)ib * xblock; /* both blocks: the f16 scale d, then qs */
            uint16_t d;
            memcpy(&d, xb, sizeof d);
            const __m256 dx = _mm256_set1_ps(h2f(d));
            const __m256i xq = q4 ? unpack_nibbles16(xb + 2) : _mm256_loadu_si256((const __m256i *)(xb + 2));
            const __m256i ax = _mm256_sign_epi8(xq, xq);
            UNROLL for (int j = 0; j < tn; j++) {
                const __m256i p = q4 ? _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(xq, yq[j]), y8[j]), ones)
                                     : _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(yq[j], xq)), ones);
                acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy[j]), _mm256_cvtepi32_ps(p), acc[i][j]);
            }
        }
    }
    UNROLL for (int j = 0; j < tn; j++)
        UNROLL for (int i = 0; i < tm; i++) a->out[(size_t)(b + j) * a->out_stride + (size_t)(r + i)] = hsum_ps(acc[i][j]);
}

/* Q8_0: 4 x 3 measured best on Zen 3 (12 accumulators; 2 x 4 and 4 x 4 within noise, 1 x 4 slower) */
#define Q8_TM 4
#define Q8_TN 3
#define Q8_TILE(tm, tn)                                                                                    \
    AVX2 static void q8_0_##tm##x##tn(const cpu_gemm_args *a, int r, int b) { legacy_tile(a, r, b, tm, tn, false); } \
    AVX2 static void q4_0_##tm##x##tn(const cpu_gemm_args *a, int r, int b) { legacy_tile(a, r, b, tm, tn, true); }
Q8_TILE(1, 1) Q8_TILE(1, 2) Q8_TILE(1, 3)
Q8_TILE(2, 1) Q8_TILE(2, 2) Q8_TILE(2, 3)
Q8_TILE(3, 1) Q8_TILE(3, 2) Q8_TILE(3, 3)
Q8_TILE(4, 1) Q8_TILE(4, 2) Q8_TILE(4, 3)
#undef Q8_TILE

void cpu_gemm_q8_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    static const cpu_gemm_tile_fn tab[Q8_TM * Q8_TN] = {q8_0_1x1, q8_0_1x2, q8_0_1x3, q8_0_2x1, q8_0_2x2, q8_0_2x3,
                                               q8_0_3x1, q8_0_3x2, q8_0_3x3, q8_0_4x1, q8_0_4x2, q8_0_4x3};
    cpu_gemm_walk(a, r0, r1, b0, b1, Q8_TM, Q8_TN, tab);
}

void cpu_gemm_q4_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    static const cpu_gemm_tile_fn tab[Q8_TM * Q8_TN] = {q4_0_1x1, q4_0_1x2, q4_0_1x3, q4_0_2x1, q4_0_2x2, q4_0_2x3,
                                               q4_0_3x1, q4_0_3x2, q4_0_3x3, q4_0_4x1, q4_0_4x2, q4_0_4x3};
    cpu_gemm_walk(a, r0, r1, b0, b1, Q8_TM, Q8_TN, tab);
}

/* The small-batch product (cpu_gemm_rows): one weight row at a time against tn <= CPU_ROW_TN activation rows, the
 * same per-pair operations as legacy_tile (so again bit-identical to the single dot), but all tn pairs in one
 * pass over the weight row: a decode step of k <= 8 sequences streams each weight row from memory once (with a
 * software prefetch ahead), unpacks each of its blocks once, and keeps tn independent accumulators in flight (the
 * single dot's one accumulator waits on the FMA latency). The row loop sits inside, so the per-row overhead is a
 * few address updates. */
/* bytes ahead of the weight block in use that are prefetched (a few rows: the hardware prefetcher alone left the
 * 4-row product 13-15% slower from memory, bench/cpu_gemm_rows.c) */
#ifndef ROW_PREFETCH
#define ROW_PREFETCH 2048
#endif
#define UNROLL8 _Pragma("GCC unroll 8")
/* A weight block of legacy_rows: its scale *dx, its values *xq (Q4_0: the nibbles) and *ax = |xq| (Q8_0). */
AVX2 static INLINE void legacy_weight(const uint8_t *xb, bool q4, __m256 *dx, __m256i *xq, __m256i *ax) {
    uint16_t d; /* the f16 scale d, then qs */
    memcpy(&d, xb, sizeof d);
    *dx = _mm256_set1_ps(h2f(d));
    *xq = q4 ? unpack_nibbles16(xb + 2) : _mm256_loadu_si256((const __m256i *)(xb + 2));
    *ax = _mm256_sign_epi8(*xq, *xq);
}
/* One pair's step for a block: acc + (dx * yd) * the int block sum against activation block yq. */
AVX2 static INLINE __m256 legacy_step(__m256 dx, __m256i xq, __m256i ax, const int8_t *yq8, const float *yd, __m256 acc,
                                      bool q4) {
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8);
    const __m256i yq = _mm256_loadu_si256((const __m256i *)yq8);
    const __m256i p = q4 ? _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(xq, yq), _mm256_maddubs_epi16(eight, yq)), ones)
                         : _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(yq, xq)), ones);
    return _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_broadcast_ss(yd)), _mm256_cvtepi32_ps(p), acc);
}
AVX2 static INLINE void legacy_rows(const cpu_gemm_args *a, int r0, int r1, int b, const int tn, const bool q4) {
    const int nb = a->n / QK8_0;
    const size_t xblock = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const block_q8_0 *y[CPU_ROW_TN];
    const float *yd[CPU_ROW_TN];
    UNROLL8 for (int j = 0; j < tn; j++) {
        y[j] = (const block_q8_0 *)(a->y + (size_t)(b + j) * a->y_stride);
        yd[j] = a->yd + (size_t)(b + j) * nb;
    }
    for (int r = r0; r < r1; r++) {
        const uint8_t *x = a->w + (size_t)r * a->w_stride;
        __m256 acc[CPU_ROW_TN];
        UNROLL8 for (int j = 0; j < tn; j++) acc[j] = _mm256_setzero_ps();
        for (int ib = 0; ib < nb; ib++) {
            const uint8_t *xb = x + (size_t)ib * xblock;
            __m256 dx;
            __m256i xq, ax;
            legacy_weight(xb, q4, &dx, &xq, &ax);
            _mm_prefetch((const char *)xb + ROW_PREFETCH, _MM_HINT_T0);
            UNROLL8 for (int j = 0; j < tn; j++) acc[j] = legacy_step(dx, xq, ax, y[j][ib].qs, &yd[j][ib], acc[j], q4);
        }
        UNROLL8 for (int j = 0; j < tn; j++) a->out[(size_t)(b + j) * a->out_stride + (size_t)r] = hsum_ps(acc[j]);
    }
}

CPU_GEMM_LEGACY_ROWS(AVX2, avx2)

/* One activation row (decode): the weight rows in two linear streams, the first half of [r0, r1) and the second
 * (as CPU_GEMM_ROW1_PAIRS: +15% from memory on a Zen 3 over one stream), one row of each at a time, each stream
 * prefetched ROW_PREFETCH ahead; per pair legacy_rows' steps; an odd last row through legacy_rows. */
AVX2 static INLINE void legacy_row1(const cpu_gemm_args *a, int r0, int r1, int b0, int b1, const bool q4) {
    KILN_ASSERT(b1 == b0 + 1);
    const int nb = a->n / QK8_0, half = (r1 - r0) / 2;
    const size_t xblock = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const block_q8_0 *y = (const block_q8_0 *)(a->y + (size_t)b0 * a->y_stride);
    const float *yd = a->yd + (size_t)b0 * nb;
    float *out = a->out + (size_t)b0 * a->out_stride;
    for (int r = r0; r < r0 + half; r++) {
        const uint8_t *x0 = a->w + (size_t)r * a->w_stride, *x1 = a->w + (size_t)(r + half) * a->w_stride;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
        for (int ib = 0; ib < nb; ib++) {
            const uint8_t *xb0 = x0 + (size_t)ib * xblock, *xb1 = x1 + (size_t)ib * xblock;
            _mm_prefetch((const char *)xb0 + ROW_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)xb1 + ROW_PREFETCH, _MM_HINT_T0);
            __m256 dx0, dx1;
            __m256i xq0, ax0, xq1, ax1;
            legacy_weight(xb0, q4, &dx0, &xq0, &ax0);
            legacy_weight(xb1, q4, &dx1, &xq1, &ax1);
            acc0 = legacy_step(dx0, xq0, ax0, y[ib].qs, &yd[ib], acc0, q4);
            acc1 = legacy_step(dx1, xq1, ax1, y[ib].qs, &yd[ib], acc1, q4);
        }
        out[r] = hsum_ps(acc0);
        out[r + half] = hsum_ps(acc1);
    }
    if ((r1 - r0) % 2) legacy_rows(a, r1 - 1, r1, b0, 1, q4);
}
AVX2 void cpu_gemm_row1_q8_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) { legacy_row1(a, r0, r1, b0, b1, false); }
AVX2 void cpu_gemm_row1_q4_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) { legacy_row1(a, r0, r1, b0, b1, true); }

/* ------------------------------------------------------------------------------------------ Q4_K */

/* kiln_dot_q4_K_avx2 per pair and block: acc = fmadd(y.d * h2f(x.d), int sums, acc), accm = fmadd(y.d *
 * h2f(x.dmin), mins x bsums, accm); the result hsum(acc - accm). The nibbles and scales of a weight block
 * are unpacked once for the tile's activation rows. */
AVX2 static INLINE void q4_K_tile(const cpu_gemm_args *a, int r, int b, const int tm, const int tn) {
    const int nb = a->n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const block_q4_K *x[2];
    const block_q8_K *y[4];
    __m256 acc[2][4], accm[2][4];
    UNROLL for (int i = 0; i < tm; i++) x[i] = (const block_q4_K *)(a->w + (size_t)(r + i) * a->w_stride);
    UNROLL for (int j = 0; j < tn; j++) {
        y[j] = (const block_q8_K *)(a->y + (size_t)(b + j) * a->y_stride);
        UNROLL for (int i = 0; i < tm; i++) acc[i][j] = accm[i][j] = _mm256_setzero_ps();
    }
    for (int ib = 0; ib < nb; ib++) {
        UNROLL for (int i = 0; i < tm; i++) {
            const block_q4_K *xb = &x[i][ib];
            __m256i mins16;
            const __m256i sc = k4_scales_mins(xb->scales, &mins16);
            __m256i sum[4];
            UNROLL for (int j = 0; j < tn; j++) sum[j] = _mm256_setzero_si256();
            UNROLL for (int k = 0; k < 4; k++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * k));
                const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                const __m256i slo = scale_one(sc, 2 * k), shi = scale_one(sc, 2 * k + 1);
                UNROLL for (int j = 0; j < tn; j++) {
                    const int8_t *q8 = y[j][ib].qs + 64 * k;
                    const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
                    const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                    sum[j] = _mm256_add_epi32(sum[j], _mm256_add_epi32(_mm256_madd_epi16(p0, slo), _mm256_madd_epi16(p1, shi)));
                }
            }
            const float dx = h2f(xb->d), dmx = h2f(xb->dmin);
            UNROLL for (int j = 0; j < tn; j++) {
                const block_q8_K *yb = &y[j][ib];
                const __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(load_bsums(yb), mins16));
                accm[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(yb->d * dmx), mins, accm[i][j]);
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(yb->d * dx), _mm256_cvtepi32_ps(sum[j]), acc[i][j]);
            }
        }
    }
    UNROLL for (int j = 0; j < tn; j++)
        UNROLL for (int i = 0; i < tm; i++)
            a->out[(size_t)(b + j) * a->out_stride + (size_t)(r + i)] = hsum_ps(_mm256_sub_ps(acc[i][j], accm[i][j]));
}

/* A K-quant's tiles NAME_TMxTN over NAME_tile, its block product cpu_gemm_NAME_avx2 and its small-batch product
 * cpu_gemm_rows_NAME_avx2 (the 1 x 4 tiles, row by row). 2 x 4 measured best on Zen 3 for Q4_K (1 x 4 and 2 x 2
 * slower). */
#define K_TM 2
#define K_TN 4
#define K_TILE(name, tm, tn) \
    AVX2 static void name##_##tm##x##tn(const cpu_gemm_args *a, int r, int b) { name##_tile(a, r, b, tm, tn); }
#define K_TILES(name)                                                                                         \
    K_TILE(name, 1, 1) K_TILE(name, 1, 2) K_TILE(name, 1, 3) K_TILE(name, 1, 4)                              \
    K_TILE(name, 2, 1) K_TILE(name, 2, 2) K_TILE(name, 2, 3) K_TILE(name, 2, 4)                              \
    void cpu_gemm_##name##_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {                    \
        static const cpu_gemm_tile_fn tab[K_TM * K_TN] = {name##_1x1, name##_1x2, name##_1x3, name##_1x4,   \
                                                          name##_2x1, name##_2x2, name##_2x3, name##_2x4};  \
        cpu_gemm_walk(a, r0, r1, b0, b1, K_TM, K_TN, tab);                                                   \
    }                                                                                                        \
    void cpu_gemm_rows_##name##_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {               \
        for (int r = r0; r < r1; r++) cpu_gemm_##name##_avx2(a, r, r + 1, b0, b1);                          \
    }
K_TILES(q4_K)

/* ------------------------------------------------------------------------------------------ Q6_K */

/* kiln_dot_q6_K_avx2 per pair and block (q6_K_dot_block's steps): the 6-bit values of a weight block are unpacked
 * once per half for the tile's activation rows. (Q6_K: the Q4_K_M files' attn_v and ffn_down in half the layers
 * and the output matrix.) */
AVX2 static INLINE void q6_K_tile(const cpu_gemm_args *a, int r, int b, const int tm, const int tn) {
    const int nb = a->n / QK_K;
    const block_q6_K *x[2];
    const block_q8_K *y[4];
    __m256 acc[2][4];
    UNROLL for (int i = 0; i < tm; i++) x[i] = (const block_q6_K *)(a->w + (size_t)(r + i) * a->w_stride);
    UNROLL for (int j = 0; j < tn; j++) {
        y[j] = (const block_q8_K *)(a->y + (size_t)(b + j) * a->y_stride);
        UNROLL for (int i = 0; i < tm; i++) acc[i][j] = _mm256_setzero_ps();
    }
    for (int ib = 0; ib < nb; ib++) {
        UNROLL for (int i = 0; i < tm; i++) {
            const block_q6_K *xb = &x[i][ib];
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)xb->scales);
            const __m256i eo = scales_even_odd(sc8);
            __m256i sum[4], v[4];
            UNROLL for (int j = 0; j < tn; j++) sum[j] = _mm256_setzero_si256();
            UNROLL for (int h = 0; h < 2; h++) {
                q6_K_unpack_half(xb, h, v);
                UNROLL for (int j = 0; j < tn; j++) q6_K_half_sums(v, eo, h, y[j][ib].qs + 128 * h, &sum[j]);
            }
            UNROLL for (int j = 0; j < tn; j++) acc[i][j] = q6_K_block_fma(xb, &y[j][ib], sc8, sum[j], acc[i][j]);
        }
    }
    UNROLL for (int j = 0; j < tn; j++)
        UNROLL for (int i = 0; i < tm; i++) a->out[(size_t)(b + j) * a->out_stride + (size_t)(r + i)] = hsum_ps(acc[i][j]);
}

K_TILES(q6_K)

/* One activation row (decode): Q4_K (the Q4_K_M files' most matrices) and Q6_K (their tied output matrix) weight
 * rows two at a time (CPU_GEMM_ROW1_PAIRS over the block steps of kiln_dot_q4_K_avx2 / kiln_dot_q6_K_avx2). */
#define Q4K_STEP(x, y, acc) q4_K_dot_block(x, y, &(acc)[0], &(acc)[1])
#define Q4K_FINAL(acc) hsum_ps(_mm256_sub_ps((acc)[0], (acc)[1]))
#define Q6K_STEP(x, y, acc) q6_K_dot_block(x, y, &(acc)[0])
#define Q6K_FINAL(acc) hsum_ps((acc)[0])
CPU_GEMM_ROW1_PAIRS(AVX2, cpu_gemm_row1_q4_K_avx2, block_q4_K, 2, Q4K_STEP, Q4K_FINAL, kiln_dot_q4_K_avx2)
CPU_GEMM_ROW1_PAIRS(AVX2, cpu_gemm_row1_q6_K_avx2, block_q6_K, 1, Q6K_STEP, Q6K_FINAL, kiln_dot_q6_K_avx2)

