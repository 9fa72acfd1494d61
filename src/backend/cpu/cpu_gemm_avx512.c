/*
 * cpu_gemm_avx512.c — AVX-512 VNNI register tiles of the block product (cpu_gemm.h) for Q8_0, Q4_0 and Q4_K
 * weights (compiled with the AVX-512 flags; cpu_gemm_select picks them only for the VNNI dots of
 * formats/dot_avx512.c, which run only on a CPU with AVX-512 F/BW/VL/VNNI). Per pair the float operations
 * are those of the single dot (= the AVX2 dot) in the same order, so each result is bit-identical to it:
 *  - Q8_0 / Q4_0 tiles: a ymm accumulator per pair (one weight row, one activation row), the integer block
 *    sums from one vpdpbusd: the weight (Q4_0: its nibbles minus 8) is the signed operand, the activation plus
 *    128 (its sign bit flipped) the unsigned one, and -128 * (sum of the weight's groups of 4) seeds the
 *    accumulator, so the sum is exactly sum x*y. The scale products h2f(x.d) * y.d are formed 8 blocks at a
 *    time (lane by lane the single dot's products) and read broadcast by the FMAs.
 *  - Q4_K: the integer part of a 256-value block in zmm (k4_block_int16), the float steps of two pairs in a zmm.
 *  - Q8_0 and Q4_K rows interleaved by 16 (cpu_repack.h): a lane per weight row, one kernel for every row count,
 *    in cpu_dot_*_r16's order (not the single dot's: the CPU backend runs these matrices through it alone).
 */
#include "backend/cpu/cpu_gemm.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "backend/cpu/cpu_repack.h"
#include "base/error.h"
#include "formats/blocks.h"
#include "formats/simd_avx512.h"

#define INLINE __attribute__((always_inline)) inline
#define UNROLL _Pragma("GCC unroll 8")

/* ----------------------------------------------------------------------------------- Q8_0, Q4_0 */

/* Two 32-byte rows in the halves of a zmm. */
static INLINE __m512i load_2x256(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* The signed weights of a block: Q8_0 its bytes, Q4_0 its nibbles (unpack_nibbles16 order) minus 8. */
static INLINE __m256i legacy_weight_block(const uint8_t *qs, bool q4) {
    return q4 ? _mm256_sub_epi8(unpack_nibbles16(qs), _mm256_set1_epi8(8)) : _mm256_loadu_si256((const __m256i *)qs);
}

static INLINE float legacy_scale(const uint8_t *xb) {
    uint16_t d;
    memcpy(&d, xb, sizeof d);
    return h2f(d);
}

/* h2f of the scales of m <= 8 consecutive weight blocks (block k's f16 d at xb + k * xblock); lanes m..7 zero. */
static INLINE __m256 legacy_scales8(const uint8_t *xb, size_t xblock, int m) {
    uint16_t d[8];
    UNROLL for (int k = 0; k < 8; k++) {
        d[k] = 0;
        if (k < m) memcpy(&d[k], xb + (size_t)k * xblock, sizeof d[k]);
    }
    return _mm256_cvtph_ps(_mm_setr_epi16((short)d[0], (short)d[1], (short)d[2], (short)d[3], (short)d[4], (short)d[5],
                                          (short)d[6], (short)d[7]));
}

/* The tile: 15 ymm accumulators (4 x 5 spills, and ran 30% slower at most stack addresses; 4 x 4 ~3% slower). */
#define Q8_TM 3
#define Q8_TN CPU_VNNI_Q8_TN

/* Block k of a tile's chunk (ib its index in the row): pair (i, j) adds sc[i][j][k], its scale product, times
 * its integer block sums. */
static INLINE void legacy_tile_block(const uint8_t *const *x, const block_q8_0 *const *y, int ib,
                                     float (*sc)[Q8_TN][8], int k, __m256 (*acc)[Q8_TN], const int tm, const int tn,
                                     const bool q4) {
    const size_t xblock = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const __m256i flip = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    __m256i xs[Q8_TM], seed[Q8_TM];
    UNROLL for (int i = 0; i < tm; i++) {
        xs[i] = legacy_weight_block(x[i] + (size_t)ib * xblock + 2, q4);
        seed[i] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, flip, xs[i]));
    }
    UNROLL for (int j = 0; j < tn; j++) {
        const __m256i yu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)y[j][ib].qs), flip);
        UNROLL for (int i = 0; i < tm; i++) {
            const __m256i p = _mm256_dpbusd_epi32(seed[i], yu, xs[i]);
            acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[i][j][k]), _mm256_cvtepi32_ps(p), acc[i][j]);
        }
    }
}

/* The scale products h2f(x_i.d) * y_j.d of blocks ib0..ib0 + 7 (those below nb) into sc[i][j]. */
static INLINE void legacy_tile_scales(const uint8_t *const *x, const float *const *yd, int ib0, int nb,
                                      float (*sc)[Q8_TN][8], const int tm, const int tn, const bool q4) {
    const size_t xblock = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const int m = nb - ib0 < 8 ? nb - ib0 : 8;
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 dy[Q8_TN];
    UNROLL for (int j = 0; j < tn; j++) dy[j] = _mm256_maskload_ps(yd[j] + ib0, lanes);
    UNROLL for (int i = 0; i < tm; i++) {
        const __m256 dx = legacy_scales8(x[i] + (size_t)ib0 * xblock, xblock, m);
        UNROLL for (int j = 0; j < tn; j++) _mm256_store_ps(sc[i][j], _mm256_mul_ps(dx, dy[j]));
    }
}

/* Up to Q8_TM weight rows x Q8_TN activation rows, one ymm accumulator per pair. The scale products h2f(x.d) *
 * y.d of 8 blocks are formed 8 at a time (each lane the single dot's scalar product) into a buffer that the FMAs
 * read broadcast, where a multiply per pair and block held the FMA units (bench/cpu_gemm on a Zen 4, 1536-wide
 * Q8_0 rows: 61 -> 65-68 GMAC/s; bench/RESULTS.md). */
static INLINE void legacy_tile(const cpu_gemm_args *a, int r, int b, const int tm, const int tn, const bool q4) {
    const int nb = a->n / QK8_0;
    const uint8_t *x[Q8_TM];
    const block_q8_0 *y[Q8_TN];
    const float *yd[Q8_TN];
    __m256 acc[Q8_TM][Q8_TN];
    float sc[2][Q8_TM][Q8_TN][8] __attribute__((aligned(32))); /* pair (i, j)'s scale products of the chunk's blocks */
    UNROLL for (int i = 0; i < tm; i++) x[i] = a->w + (size_t)(r + i) * a->w_stride;
    UNROLL for (int j = 0; j < tn; j++) {
        y[j] = (const block_q8_0 *)(a->y + (size_t)(b + j) * a->y_stride);
        yd[j] = a->yd + (size_t)(b + j) * nb;
    }
    UNROLL for (int i = 0; i < tm; i++) UNROLL for (int j = 0; j < tn; j++) acc[i][j] = _mm256_setzero_ps();
    legacy_tile_scales(x, yd, 0, nb, sc[0], tm, tn, q4);
    for (int ib0 = 0, c = 0; ib0 < nb; ib0 += 8, c ^= 1) {
        /* the next chunk's products a chunk ahead of their loads, so that no load waits on (or is speculated
         * past) its store */
        if (ib0 + 8 < nb) legacy_tile_scales(x, yd, ib0 + 8, nb, sc[c ^ 1], tm, tn, q4);
        const int m = nb - ib0 < 8 ? nb - ib0 : 8;
        if (m == 8) {
            UNROLL for (int k = 0; k < 8; k++) legacy_tile_block(x, y, ib0 + k, sc[c], k, acc, tm, tn, q4);
        } else {
            for (int k = 0; k < m; k++) legacy_tile_block(x, y, ib0 + k, sc[c], k, acc, tm, tn, q4);
        }
    }
    UNROLL for (int j = 0; j < tn; j++)
        UNROLL for (int i = 0; i < tm; i++) a->out[(size_t)(b + j) * a->out_stride + (size_t)(r + i)] = hsum_ps(acc[i][j]);
}

#define Q8_TILE(tm, tn)                                                                                    \
    static void q8_0_##tm##x##tn(const cpu_gemm_args *a, int r, int b) { legacy_tile(a, r, b, tm, tn, false); } \
    static void q4_0_##tm##x##tn(const cpu_gemm_args *a, int r, int b) { legacy_tile(a, r, b, tm, tn, true); }
#define Q8_ROW(tm) Q8_TILE(tm, 1) Q8_TILE(tm, 2) Q8_TILE(tm, 3) Q8_TILE(tm, 4) Q8_TILE(tm, 5)
Q8_ROW(1) Q8_ROW(2) Q8_ROW(3)
#undef Q8_ROW
#undef Q8_TILE
#define TAB_ROW(t, tm) t##_##tm##x1, t##_##tm##x2, t##_##tm##x3, t##_##tm##x4, t##_##tm##x5

void cpu_gemm_q8_0_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    static const cpu_gemm_tile_fn tab[Q8_TM * Q8_TN] = {TAB_ROW(q8_0, 1), TAB_ROW(q8_0, 2), TAB_ROW(q8_0, 3)};
    cpu_gemm_walk(a, r0, r1, b0, b1, Q8_TM, Q8_TN, tab);
}

void cpu_gemm_q4_0_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    static const cpu_gemm_tile_fn tab[Q8_TM * Q8_TN] = {TAB_ROW(q4_0, 1), TAB_ROW(q4_0, 2), TAB_ROW(q4_0, 3)};
    cpu_gemm_walk(a, r0, r1, b0, b1, Q8_TM, Q8_TN, tab);
}
#undef TAB_ROW

/* The small-batch product (cpu_gemm_rows) on VNNI, with the integer block sum of a pair from one vpdpbusd: the
 * activation bytes plus 128 (a->yu, flipped once per call) as the unsigned operand, the signed weight (Q4_0:
 * nibbles minus 8) as the other, seeded per weight block with -128 * (the weight's sums of 4); the float steps
 * per pair are the single dot's, so every result is bit-identical to it. From 3 activation rows up, two weight
 * rows at a time in the halves of a zmm (one broadcast load of an activation block serves both; accumulator j
 * holds the 8 lanes of pair (r, j) low and (r + 1, j) high, and lanes never mix), an odd last row alone in a
 * ymm; below 3 (below 5 on Zen 4: PAIR_FROM_HALVES), one weight row at a time (from memory, two rows' streams
 * at once ran slower there: bench/RESULTS.md). Per pair and block: one vpdpbusd, a multiply, a conversion and an FMA in a ymm or half a
 * zmm (AVX2: two sign operations, a maddubs and a madd more). Prefetch distances measured on the stream
 * benchmark (bench/cpu_gemm_rows.c). */
#define ROW_PREFETCH 2048
/* Pairs of weight rows from this many activation rows up (below, one row at a time); on a CPU that runs 512-bit
 * operations in halves (Zen 4) the pair's extra shuffles cost more than its shared activation loads save, so
 * from 5 there (smollm2 k = 3 / 4 steps 8.1-8.9 ms with pairs, 5.1-7.2 without: bench/RESULTS.md). */
#define PAIR_FROM 3
#define PAIR_FROM_HALVES 5
/* Weight rows r and r + 1 against activation rows b..b + tn - 1. */
static INLINE void legacy_rows_pair(const cpu_gemm_args *a, int r, const uint8_t *const *yu, const float *const *yd, int b,
                                    const int tn, const bool q4) {
    const int nb = a->n / QK8_0;
    const size_t xblock = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    const __m512i pick01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const uint8_t *x0 = a->w + (size_t)r * a->w_stride, *x1 = x0 + a->w_stride;
    const size_t ahead = cpu_pair_prefetch(a->w_stride);
    __m512 acc[CPU_ROW_TN];
    UNROLL for (int j = 0; j < tn; j++) acc[j] = _mm512_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *xb0 = x0 + (size_t)ib * xblock, *xb1 = x1 + (size_t)ib * xblock; /* the f16 scale d, then qs */
        uint16_t d0, d1;
        memcpy(&d0, xb0, sizeof d0);
        memcpy(&d1, xb1, sizeof d1);
        const __m128 d01 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)d0 | (uint32_t)d1 << 16)));
        const __m512 dx = _mm512_permutexvar_ps(pick01, _mm512_castps128_ps512(d01)); /* [h2f(d0) x8 | h2f(d1) x8] */
        const __m512i xs = _mm512_inserti64x4(_mm512_castsi256_si512(legacy_weight_block(xb0 + 2, q4)), legacy_weight_block(xb1 + 2, q4), 1);
        const __m512i seed = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, flip, xs));
        _mm_prefetch((const char *)xb0 + ahead, _MM_HINT_T0);
        _mm_prefetch((const char *)xb1 + ahead, _MM_HINT_T0);
        UNROLL for (int j = 0; j < tn; j++) {
            const __m512i yb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(yu[j] + 32 * ib)));
            const __m512i p = _mm512_dpbusd_epi32(seed, yb, xs);
            const __m512 sc = _mm512_mul_ps(dx, _mm512_set1_ps(yd[j][ib]));
            acc[j] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[j]);
        }
    }
    UNROLL for (int j = 0; j < tn; j++) {
        float *o = a->out + (size_t)(b + j) * a->out_stride + (size_t)r;
        o[0] = hsum_ps(_mm512_castps512_ps256(acc[j]));
        o[1] = hsum_ps(high_ps(acc[j]));
    }
}

/* Weight row r alone. */
static INLINE void legacy_rows_one(const cpu_gemm_args *a, int r, const uint8_t *const *yu, const float *const *yd, int b,
                                   const int tn, const bool q4) {
    const int nb = a->n / QK8_0;
    const size_t xblock = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const __m256i flip = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    const uint8_t *x = a->w + (size_t)r * a->w_stride;
    __m256 acc[CPU_ROW_TN];
    UNROLL for (int j = 0; j < tn; j++) acc[j] = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *xb = x + (size_t)ib * xblock;
        const __m256 dx = _mm256_set1_ps(legacy_scale(xb));
        const __m256i xs = legacy_weight_block(xb + 2, q4);
        const __m256i seed = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, flip, xs));
        _mm_prefetch((const char *)xb + ROW_PREFETCH, _MM_HINT_T0);
        UNROLL for (int j = 0; j < tn; j++) {
            const __m256i p = _mm256_dpbusd_epi32(seed, _mm256_loadu_si256((const __m256i *)(yu[j] + 32 * ib)), xs);
            const __m256 sc = _mm256_mul_ps(dx, _mm256_broadcast_ss(&yd[j][ib]));
            acc[j] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[j]);
        }
    }
    UNROLL for (int j = 0; j < tn; j++) a->out[(size_t)(b + j) * a->out_stride + (size_t)r] = hsum_ps(acc[j]);
}

static INLINE void legacy_rows(const cpu_gemm_args *a, int r0, int r1, int b, const int tn, const bool q4) {
    const int nb = a->n / QK8_0;
    const uint8_t *yu[CPU_ROW_TN];
    const float *yd[CPU_ROW_TN];
    UNROLL for (int j = 0; j < tn; j++) {
        yu[j] = a->yu + (size_t)(b + j) * (size_t)a->n;
        yd[j] = a->yd + (size_t)(b + j) * nb;
    }
    int r = r0;
    if (tn >= (kiln_cpu_avx512_in_halves() ? PAIR_FROM_HALVES : PAIR_FROM))
        for (; r + 1 < r1; r += 2) legacy_rows_pair(a, r, yu, yd, b, tn, q4);
    for (; r < r1; r++) legacy_rows_one(a, r, yu, yd, b, tn, q4);
}

CPU_GEMM_LEGACY_ROWS(, vnni)

/* ------------------------------------------------------------------------------------------ Q4_K */

#define K4_TM 2
#define K4_TN CPU_VNNI_K4_TN
_Static_assert(K4_TN % 2 == 0 && K4_TN <= 8, "Q4_K tiles: whole pairs of activation rows within yd's 8 lanes");
/* kiln_dot_q4_K_vnni per pair and block (= kiln_dot_q4_K_avx2): acc = fmadd(y.d * h2f(x.d), int sums, acc),
 * accm = fmadd(y.d * h2f(x.dmin), mins x bsums, accm); the result hsum(acc - accm). A weight block's scales
 * are unpacked once for the tile's activation rows, its scale products with them formed 8 at a time. A zmm
 * holds the 8-lane accumulators of two pairs (one weight row, activation rows 2p low and 2p + 1 high), so the
 * conversions, FMAs and the mins' products run once for both; lanes never mix, so each pair keeps the single
 * dot's float steps. An odd last activation row is paired with itself and the copy's result dropped. */
static INLINE void q4_K_tile(const cpu_gemm_args *a, int r, int b, const int tm, const int tn) {
    const int nb = a->n / QK_K, np = (tn + 1) / 2;
    const block_q4_K *x[K4_TM];
    const block_q8_K *y[8]; /* the 8 lanes of yd: rows past tn repeat the last */
    __m512i pick[K4_TN / 2]; /* [lane 2p x8 | lane 2p + 1 x8] */
    __m512 acc[K4_TM][K4_TN / 2], accm[K4_TM][K4_TN / 2];
    UNROLL for (int p = 0; p < np; p++) {
        const int e = 2 * p, o = 2 * p + 1;
        pick[p] = _mm512_setr_epi32(e, e, e, e, e, e, e, e, o, o, o, o, o, o, o, o);
    }
    UNROLL for (int i = 0; i < tm; i++) x[i] = (const block_q4_K *)(a->w + (size_t)(r + i) * a->w_stride);
    UNROLL for (int j = 0; j < 8; j++) y[j] = (const block_q8_K *)(a->y + (size_t)(b + (j < tn ? j : tn - 1)) * a->y_stride);
    UNROLL for (int i = 0; i < tm; i++) UNROLL for (int p = 0; p < np; p++) acc[i][p] = accm[i][p] = _mm512_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const __m256 yd = _mm256_setr_ps(y[0][ib].d, y[1][ib].d, y[2][ib].d, y[3][ib].d, y[4][ib].d, y[5][ib].d,
                                         y[6][ib].d, y[7][ib].d);
        __m512i bsums[K4_TN / 2];
        UNROLL for (int p = 0; p < np; p++) bsums[p] = load_2x256(y[2 * p][ib].bsums, y[2 * p + 1][ib].bsums);
        UNROLL for (int i = 0; i < tm; i++) {
            const block_q4_K *xb = &x[i][ib];
            __m256i mins16;
            const __m256i sc = k4_scales_mins(xb->scales, &mins16);
            const __m512i mins2 = _mm512_broadcast_i64x4(mins16);
            k4_weights w;
            k4_unpack(xb->qs, sc, &w);
            /* y_j.d * h2f(d) and y_j.d * h2f(dmin) for the 8 lanes, each the single dot's product */
            const __m512 pd4 = _mm512_castps256_ps512(_mm256_mul_ps(yd, _mm256_set1_ps(h2f(xb->d))));
            const __m512 pm4 = _mm512_castps256_ps512(_mm256_mul_ps(yd, _mm256_set1_ps(h2f(xb->dmin))));
            UNROLL for (int p = 0; p < np; p++) {
                const __m512 mins = _mm512_cvtepi32_ps(_mm512_madd_epi16(bsums[p], mins2));
                accm[i][p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick[p], pm4), mins, accm[i][p]);
                const __m512i s0 = k4_block_int16(&w, y[2 * p][ib].qs), s1 = k4_block_int16(&w, y[2 * p + 1][ib].qs);
                /* [s0's halves added | s1's halves added]: each pair's 8 lanes of k4_block_int */
                const __m512i sum = _mm512_add_epi32(_mm512_shuffle_i64x2(s0, s1, 0x44), _mm512_shuffle_i64x2(s0, s1, 0xEE));
                acc[i][p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick[p], pd4), _mm512_cvtepi32_ps(sum), acc[i][p]);
            }
        }
    }
    UNROLL for (int p = 0; p < np; p++)
        UNROLL for (int i = 0; i < tm; i++) {
            const __m512 d = _mm512_sub_ps(acc[i][p], accm[i][p]);
            float *o = a->out + (size_t)(b + 2 * p) * a->out_stride + (size_t)(r + i);
            o[0] = hsum_ps(_mm512_castps512_ps256(d));
            if (2 * p + 1 < tn) o[a->out_stride] = hsum_ps(high_ps(d));
        }
}

#define K4_TILE(tm, tn) \
    static void q4_K_##tm##x##tn(const cpu_gemm_args *a, int r, int b) { q4_K_tile(a, r, b, tm, tn); }
K4_TILE(1, 1) K4_TILE(1, 2) K4_TILE(1, 3) K4_TILE(1, 4) K4_TILE(1, 5) K4_TILE(1, 6)
K4_TILE(2, 1) K4_TILE(2, 2) K4_TILE(2, 3) K4_TILE(2, 4) K4_TILE(2, 5) K4_TILE(2, 6)
#undef K4_TILE

void cpu_gemm_q4_K_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    static const cpu_gemm_tile_fn tab[K4_TM * K4_TN] = {q4_K_1x1, q4_K_1x2, q4_K_1x3, q4_K_1x4, q4_K_1x5, q4_K_1x6,
                                                        q4_K_2x1, q4_K_2x2, q4_K_2x3, q4_K_2x4, q4_K_2x5, q4_K_2x6};
    cpu_gemm_walk(a, r0, r1, b0, b1, K4_TM, K4_TN, tab);
}

/* One activation row (decode), the activations in k4 order (a->yu: cpu_gemm_k4_order_row). Per weight block the
 * integer sums of kiln_dot_q4_K_avx2's 8 lanes (lane i: sum over the 8 runs of 32 values of the run's scale times
 * its 4-value group i) from two full loads of the nibbles: the low nibbles of qs[64h..64h+63] are the values of runs
 * 4h and 4h + 2, the high ones of runs 4h + 1 and 4h + 3, which the k4 order lays side by side as 64 bytes. vpdpbusd
 * gives each run's group sums as int32 (|sum| <= 4 * 15 * 128 < 2^15; the high nibbles masked in place, so x16),
 * two runs' sums are packed as the two words of a dword (low run's low word, high run's sum shifted up) and one
 * vpmaddwd applies both runs' scales, exact. Two weight rows at a time, the first half of [r0, r1) and the second
 * (two linear streams, each prefetched into L2), their float steps in the halves of one zmm: per lane the single dot's
 * (acc = fmadd(y.d * h2f(d), int sums, acc), accm = fmadd(y.d * h2f(dmin), mins x bsums, accm), the result
 * hsum(acc - accm)), so each result is bit-identical to kiln_dot_q4_K_vnni; an odd last row through that dot. */
/* Each stream is prefetched this far ahead into L2 (_MM_HINT_T1; on a Zen 4 decode ran 4-10% faster so than with
 * the lines prefetched into L1, and slower at 2, 6 or 9 KiB: bench/RESULTS.md). */
#define K4_ROW1_PREFETCH 4096

/* The 12 scale bytes of two Q4_K blocks -> their 6-bit scales and mins as bytes (kiln_k4_scales_mins):
 * [s0..s7 m0..m7] of p0's block in the low 128 bits, of p1's in the high. Reads 16 bytes at each (the block's
 * scales and the first 4 bytes of its qs). */
static INLINE __m256i k4_scale_bytes2(const uint8_t *p0, const uint8_t *p1) {
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                              _mm_loadu_si128((const __m128i *)p1), 1);
    /* a: the bytes holding each value's low bits (s0-3, s4-7, m0-3, m4-7); h: those holding the top 2 bits of s4-7, m4-7 */
    const __m256i a = _mm256_shuffle_epi8(b, _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11,
                                                              0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m256i h = _mm256_shuffle_epi8(b, _mm256_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7,
                                                              -1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m256i low = _mm256_and_si256(a, _mm256_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0,
                                                              63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m256i m47 = _mm256_and_si256(_mm256_srli_epi16(a, 4), _mm256_setr_epi64x(0, 0x0F0F0F0F00000000ll, 0, 0x0F0F0F0F00000000ll));
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(h, 2), _mm256_set1_epi64x(0x3030303000000000ll));
    return _mm256_or_si256(_mm256_or_si256(low, m47), top);
}

/* The integer sums of one Q4_K block (qs: its nibbles; ak: its activations in k4 order; sb: k4_scale_bytes2's 16
 * bytes of the block in every 128-bit lane) -> 16 int32 lanes, lanes i and i + 8 together lane i of the dot's. */
static INLINE __m512i k4_row1_int16(const uint8_t *qs, const int8_t *ak, __m512i sb) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F), hi4 = _mm512_set1_epi8((char)0xF0), zero = _mm512_setzero_si512();
    /* the words (s(4h), s(4h + 1)) in dwords 0-7, (s(4h + 2), s(4h + 3)) in dwords 8-15, h = 0, 1 */
    const __m512i s0 = _mm512_shuffle_epi8(sb, _mm512_setr_epi32(0x80018000, 0x80018000, 0x80018000, 0x80018000, 0x80018000, 0x80018000,
                                                                 0x80018000, 0x80018000, 0x80038002, 0x80038002, 0x80038002, 0x80038002,
                                                                 0x80038002, 0x80038002, 0x80038002, 0x80038002));
    const __m512i s1 = _mm512_shuffle_epi8(sb, _mm512_setr_epi32(0x80058004, 0x80058004, 0x80058004, 0x80058004, 0x80058004, 0x80058004,
                                                                 0x80058004, 0x80058004, 0x80078006, 0x80078006, 0x80078006, 0x80078006,
                                                                 0x80078006, 0x80078006, 0x80078006, 0x80078006));
    __m512i pk[2];
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m512i q = _mm512_loadu_si512(qs + 64 * h);
        const __m512i lo = _mm512_dpbusd_epi32(zero, _mm512_and_si512(q, lo4), _mm512_loadu_si512(ak + 128 * h));
        const __m512i hi16 = _mm512_dpbusd_epi32(zero, _mm512_and_si512(q, hi4), _mm512_loadu_si512(ak + 128 * h + 64));
        /* low word: lo's sum (its low 16 bits, exact below 2^15), high word: hi's (hi16 << 12 = sum << 16) */
        pk[h] = _mm512_ternarylogic_epi32(lo, _mm512_slli_epi32(hi16, 12), _mm512_set1_epi32(0xFFFF), 0xEC);
    }
    return _mm512_dpwssd_epi32(_mm512_madd_epi16(pk[0], s0), pk[1], s1);
}

/* Block ib of weight rows x0 (low half of acc / accm) and x1 (high half). */
static INLINE void k4_row1_block(const block_q4_K *x0, const block_q4_K *x1, const block_q8_K *y, const int8_t *ak,
                                 __m512 *acc, __m512 *accm) {
    uint32_t e0, e1; /* d and dmin of each */
    memcpy(&e0, &x0->d, sizeof e0);
    memcpy(&e1, &x1->d, sizeof e1);
    /* [y.d * h2f(d0), y.d * h2f(dmin0), y.d * h2f(d1), y.d * h2f(dmin1)]: the single dot's products */
    const __m128 dm = _mm_mul_ps(_mm_set1_ps(y->d), _mm_cvtph_ps(_mm_cvtsi64_si128((long long)((uint64_t)e1 << 32 | e0))));
    const __m512 pd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), _mm512_castps128_ps512(dm));
    const __m512 pm = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), _mm512_castps128_ps512(dm));
    const __m256i sb = k4_scale_bytes2(x0->scales, x1->scales);
    /* the mins term: bsums x (m0 m0 m1 m1 ... m7 m7) as words, x0's in the low half, x1's in the high */
    const __m512i sb2 = _mm512_shuffle_i64x2(_mm512_castsi256_si512(sb), _mm512_castsi256_si512(sb), 0x50);
    const __m512i mins16 = _mm512_shuffle_epi8(sb2, _mm512_setr_epi32(0x80088008, 0x80098009, 0x800A800A, 0x800B800B, 0x800C800C, 0x800D800D,
                                                                      0x800E800E, 0x800F800F, 0x80088008, 0x80098009, 0x800A800A, 0x800B800B,
                                                                      0x800C800C, 0x800D800D, 0x800E800E, 0x800F800F));
    const __m512i bsums = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y->bsums));
    *accm = _mm512_fmadd_ps(pm, _mm512_cvtepi32_ps(_mm512_madd_epi16(bsums, mins16)), *accm);
    const __m512i t0 = k4_row1_int16(x0->qs, ak, _mm512_broadcast_i32x4(_mm256_castsi256_si128(sb)));
    const __m512i t1 = k4_row1_int16(x1->qs, ak, _mm512_broadcast_i32x4(_mm256_extracti128_si256(sb, 1)));
    /* [t0's halves added | t1's halves added] */
    const __m512i t = _mm512_add_epi32(_mm512_shuffle_i64x2(t0, t1, 0x44), _mm512_shuffle_i64x2(t0, t1, 0xEE));
    *acc = _mm512_fmadd_ps(pd, _mm512_cvtepi32_ps(t), *acc);
}

/* The first K4_ROW1_PREFETCH bytes of the two streams (rows r0 and r0 + half), which the loops' prefetches do not
 * cover (a thread's range of a llama-3.2-1b matrix is 70-300 KiB at two threads: decode 2-8% faster so). */
static INLINE void row1_prefetch_heads(const cpu_gemm_args *a, int r0, int half) {
    if (half <= 0) return;
    for (int o = 0; o < K4_ROW1_PREFETCH; o += 64) {
        _mm_prefetch((const char *)a->w + (size_t)r0 * a->w_stride + o, _MM_HINT_T1);
        _mm_prefetch((const char *)a->w + (size_t)(r0 + half) * a->w_stride + o, _MM_HINT_T1);
    }
}

/* The lines K4_ROW1_PREFETCH past a block of `bytes` in each stream, into L2. */
static INLINE void row1_prefetch_block(const void *x0, const void *x1, int bytes) {
    const char *p0 = (const char *)x0 + K4_ROW1_PREFETCH, *p1 = (const char *)x1 + K4_ROW1_PREFETCH;
    UNROLL for (int o = 0; o < bytes; o += 64) _mm_prefetch(p0 + o, _MM_HINT_T1), _mm_prefetch(p1 + o, _MM_HINT_T1);
}

void cpu_gemm_row1_q4_K_vnni(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    KILN_ASSERT(b1 == b0 + 1 && a->yu);
    const int nb = a->n / QK_K, half = (r1 - r0) / 2;
    const block_q8_K *y = (const block_q8_K *)(a->y + (size_t)b0 * a->y_stride);
    const int8_t *ak = (const int8_t *)a->yu + (size_t)b0 * (size_t)a->n;
    float *out = a->out + (size_t)b0 * a->out_stride;
    row1_prefetch_heads(a, r0, half);
    for (int r = r0; r < r0 + half; r++) {
        const block_q4_K *x0 = (const block_q4_K *)(a->w + (size_t)r * a->w_stride);
        const block_q4_K *x1 = (const block_q4_K *)(a->w + (size_t)(r + half) * a->w_stride);
        __m512 acc = _mm512_setzero_ps(), accm = acc;
        for (int ib = 0; ib < nb; ib++) {
            row1_prefetch_block(&x0[ib], &x1[ib], sizeof(block_q4_K));
            k4_row1_block(&x0[ib], &x1[ib], &y[ib], ak + (size_t)ib * QK_K, &acc, &accm);
        }
        const __m512 d = _mm512_sub_ps(acc, accm);
        out[r] = hsum_ps(_mm512_castps512_ps256(d));
        out[r + half] = hsum_ps(high_ps(d));
    }
    if ((r1 - r0) % 2) kiln_dot_q4_K_vnni(a->n, &out[r1 - 1], a->w + (size_t)(r1 - 1) * a->w_stride, y);
}

/* Q6_K against one activation row on AVX-512 VNNI machines (Q6_K has no VNNI dot: the dot there is
 * kiln_dot_q6_K_avx2): CPU_GEMM_ROW1_PAIRS's two streams of its block steps (q6_K_dot_block, each row's in its
 * order, the result hsum(acc): bit-identical to kiln_dot_q6_K_avx2), but prefetched as the VNNI Q4_K kernel is:
 * K4_ROW1_PREFETCH ahead into L2, the first K4_ROW1_PREFETCH bytes of each stream at entry (with the AVX2
 * kernel's L1 prefetches a Zen 4 decoded slower than with the plain dot). An odd last row through the dot. */
void cpu_gemm_row1_q6_K_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    KILN_ASSERT(b1 == b0 + 1);
    const int nb = a->n / QK_K, half = (r1 - r0) / 2;
    const block_q8_K *y = (const block_q8_K *)(a->y + (size_t)b0 * a->y_stride);
    float *out = a->out + (size_t)b0 * a->out_stride;
    row1_prefetch_heads(a, r0, half);
    for (int r = r0; r < r0 + half; r++) {
        const block_q6_K *x0 = (const block_q6_K *)(a->w + (size_t)r * a->w_stride);
        const block_q6_K *x1 = (const block_q6_K *)(a->w + (size_t)(r + half) * a->w_stride);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
        for (int ib = 0; ib < nb; ib++) {
            row1_prefetch_block(&x0[ib], &x1[ib], sizeof(block_q6_K));
            q6_K_dot_block(&x0[ib], &y[ib], &acc0);
            q6_K_dot_block(&x1[ib], &y[ib], &acc1);
        }
        out[r] = hsum_ps(acc0);
        out[r + half] = hsum_ps(acc1);
    }
    if ((r1 - r0) % 2) kiln_dot_q6_K_avx2(a->n, &out[r1 - 1], a->w + (size_t)(r1 - 1) * a->w_stride, y);
}

/* ---------------------------------------------------------------- Q8_0 rows interleaved by 16 (cpu_repack.h) */

/* Activation rows of a tile: 8 integer and 8 float accumulators, a weight vector and a scale vector in 18 zmm. */
#define R16_TN 8
/* Up to this many activation rows the weights are read as two streams (see r16_tile); every tile prefetches
 * R16_PREFETCH bytes ahead (2 KB: one-thread decode of llama-3.2-1b Q8_0 16% faster than with 4 KB on a Zen 4,
 * bench/RESULTS.md). */
#define R16_STREAM_TN 2
#ifndef R16_PREFETCH
#define R16_PREFETCH 2048
#endif

/* Weight rows r..r + 15 (one group; a lane each), and with tm = 2 the group at r2 too, x activation rows b..b +
 * tn - 1: per block, 8 vpdpbusd with the activation's 4-byte steps broadcast (the weights plus 128 unsigned, the
 * activations signed, each sum seeded with -128 times the activation block's sum: exactly the integer block sum),
 * then the scale product and an FMA per activation row: cpu_dot_q8_0_r16's steps in every lane. With few
 * activation rows (decode: the weights stream from memory) two groups far apart are read at once and each
 * integer sum runs as two chains (even and odd steps; integer sums in any order are the same), so that no step
 * waits on another's latency. Every tile prefetches its groups R16_PREFETCH bytes ahead: decode steps of 3-8
 * rows stream their weights too (bench/RESULTS.md: 8% shorter steps of 4 rows, 17% of 8). */
static INLINE void r16_tile(const cpu_gemm_args *a, int r, int r2, int b, const int tm, const int tn) {
    const int nb = a->n / QK8_0;
    const bool stream = tn <= R16_STREAM_TN;
    const uint8_t *grp[2] = {a->w + (size_t)r * a->w_stride, a->w + (size_t)r2 * a->w_stride};
    const uint8_t *y[R16_TN];
    const float *yd[R16_TN];
    const int32_t *ys[R16_TN];
    __m512 acc[2][R16_TN];
    UNROLL for (int j = 0; j < tn; j++) {
        y[j] = a->y + (size_t)(b + j) * a->y_stride + offsetof(block_q8_0, qs);
        yd[j] = a->yd + (size_t)(b + j) * nb;
        ys[j] = a->ys + (size_t)(b + j) * nb;
        UNROLL for (int g = 0; g < tm; g++) acc[g][j] = _mm512_setzero_ps();
    }
    for (int ib = 0; ib < nb; ib++) {
        __m512i s[2][R16_TN], s2[2][R16_TN];
        UNROLL for (int g = 0; g < tm; g++) UNROLL for (int j = 0; j < tn; j++) {
            s[g][j] = _mm512_set1_epi32(ys[j][ib]);
            if (stream) s2[g][j] = _mm512_setzero_si512();
        }
        UNROLL for (int k = 0; k < QK8_0 / 4; k++) {
            int32_t v[R16_TN];
            UNROLL for (int j = 0; j < tn; j++) memcpy(&v[j], y[j] + (size_t)ib * sizeof(block_q8_0) + 4 * k, sizeof v[j]);
            UNROLL for (int g = 0; g < tm; g++) {
                const uint8_t *qs = grp[g] + cpu_r16_qs(ib) + 4 * CPU_R16 * k;
                _mm_prefetch((const char *)qs + R16_PREFETCH, _MM_HINT_T0);
                const __m512i w = _mm512_loadu_si512(qs);
                UNROLL for (int j = 0; j < tn; j++) {
                    if (stream && k % 2) s2[g][j] = _mm512_dpbusd_epi32(s2[g][j], w, _mm512_set1_epi32(v[j]));
                    else s[g][j] = _mm512_dpbusd_epi32(s[g][j], w, _mm512_set1_epi32(v[j]));
                }
            }
        }
        UNROLL for (int g = 0; g < tm; g++) {
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(grp[g] + cpu_r16_d(ib))));
            UNROLL for (int j = 0; j < tn; j++) {
                if (stream) s[g][j] = _mm512_add_epi32(s[g][j], s2[g][j]);
                acc[g][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(yd[j][ib])), _mm512_cvtepi32_ps(s[g][j]), acc[g][j]);
            }
        }
    }
    UNROLL for (int j = 0; j < tn; j++) {
        _mm512_storeu_ps(a->out + (size_t)(b + j) * a->out_stride + (size_t)r, acc[0][j]);
        if (tm == 2) _mm512_storeu_ps(a->out + (size_t)(b + j) * a->out_stride + (size_t)r2, acc[1][j]);
    }
}

#define R16_TILE(tn) static void r16_##tn(const cpu_gemm_args *a, int r, int b) { r16_tile(a, r, r, b, 1, tn); }
R16_TILE(1) R16_TILE(2) R16_TILE(3) R16_TILE(4) R16_TILE(5) R16_TILE(6) R16_TILE(7) R16_TILE(8)
#undef R16_TILE
typedef void (*r16_two_fn)(const cpu_gemm_args *a, int r, int r2, int b);
#define R16_TWO(tn) static void r16_two_##tn(const cpu_gemm_args *a, int r, int r2, int b) { r16_tile(a, r, r2, b, 2, tn); }
R16_TWO(1) R16_TWO(2)
#undef R16_TWO

void cpu_gemm_q8_0_r16_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    static const cpu_gemm_tile_fn tab[R16_TN] = {r16_1, r16_2, r16_3, r16_4, r16_5, r16_6, r16_7, r16_8};
    KILN_ASSERT(r0 % CPU_R16 == 0 && r1 % CPU_R16 == 0);
    int r = r0;
    if (b1 - b0 <= R16_STREAM_TN) { /* the first half of the groups with the second, as two streams */
        const int half = (r1 - r0) / CPU_R16 / 2 * CPU_R16;
        static const r16_two_fn two[R16_STREAM_TN] = {r16_two_1, r16_two_2};
        for (; r < r0 + half; r += CPU_R16) two[b1 - b0 - 1](a, r, r + half, b0);
        r += half;
    }
    for (; r < r1; r += CPU_R16)
        for (int b = b0; b < b1; b += R16_TN) tab[(b1 - b < R16_TN ? b1 - b : R16_TN) - 1](a, r, b);
}

/* ---------------------------------------------------------------- Q4_K rows interleaved by 16 (cpu_repack.h) */

/* Activation rows of a tile: per row two run sums, the block's total, acc and accm. */
#define K4R_TN 4

/* Byte q (0..3) of each 32-bit lane, as an int32 lane. */
static INLINE __m512i k4r_byte(__m512i v, const int q) {
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * q), _mm512_set1_epi32(0xff));
}

/* Weight rows r..r + 15 (and with tm = 2 the group at r2) x activation rows b..b + tn - 1, a lane per weight row:
 * per block the 6-bit scales and mins unpacked from the three words of each row (kiln_k4_scales_mins lane-wise),
 * the mins against the runs' activation sums (a->ys: int16 pairs) by 4 vpdpwssd, then per 64-value run 8 steps of
 * a 64-byte load, its low and high nibbles (unsigned) each against the activation's 4 bytes broadcast (signed),
 * the two run sums times their scales; then cpu_dot_q4_K_r16's two FMAs. With tm = 2 (one activation row:
 * decode) the two groups are two streams. Each group is prefetched R16_PREFETCH ahead. */
static INLINE void k4r16_tile(const cpu_gemm_args *a, int r, int r2, int b, const int tm, const int tn) {
    const int nb = a->n / QK_K;
    const uint8_t *grp[2] = {a->w + (size_t)r * a->w_stride, a->w + (size_t)r2 * a->w_stride};
    const block_q8_K *y[K4R_TN];
    const int32_t *ys[K4R_TN];
    __m512 acc[2][K4R_TN], accm[2][K4R_TN];
    UNROLL for (int j = 0; j < tn; j++) {
        y[j] = (const block_q8_K *)(a->y + (size_t)(b + j) * a->y_stride);
        ys[j] = a->ys + (size_t)(b + j) * (size_t)(a->n / 32);
        UNROLL for (int g = 0; g < tm; g++) acc[g][j] = accm[g][j] = _mm512_setzero_ps();
    }
    const __m512i lo6 = _mm512_set1_epi32(0x3f3f3f3f), lo4 = _mm512_set1_epi32(0x0f0f0f0f),
                  lo2 = _mm512_set1_epi32(0x03030303), even16 = _mm512_set1_epi32(0x00ff00ff), nib = _mm512_set1_epi8(0x0f);
    for (int ib = 0; ib < nb; ib++) {
        UNROLL for (int g = 0; g < tm; g++) {
            const uint8_t *blk = grp[g] + (size_t)ib * CPU_R16_K4_BLOCK;
            const __m512i u0 = _mm512_loadu_si512(blk + CPU_R16_K4_U), u1 = _mm512_loadu_si512(blk + CPU_R16_K4_U + 64),
                          u2 = _mm512_loadu_si512(blk + CPU_R16_K4_U + 128);
            const __m512i sc[2] = {_mm512_and_si512(u0, lo6),
                                   _mm512_or_si512(_mm512_and_si512(u2, lo4),
                                                   _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), lo2), 4))};
            const __m512i mn[2] = {_mm512_and_si512(u1, lo6),
                                   _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), lo4),
                                                   _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), lo2), 4))};
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
            const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 2 * CPU_R16)));
            /* the mins: lanes of int16 pairs (runs 0 and 2, 1 and 3; 4 and 6, 5 and 7) against ys's pairs */
            UNROLL for (int j = 0; j < tn; j++) {
                __m512i msum = _mm512_setzero_si512();
                UNROLL for (int h = 0; h < 2; h++) {
                    msum = _mm512_dpwssd_epi32(msum, _mm512_and_si512(mn[h], even16), _mm512_set1_epi32(ys[j][4 * ib + 2 * h]));
                    msum = _mm512_dpwssd_epi32(msum, _mm512_and_si512(_mm512_srli_epi32(mn[h], 8), even16),
                                               _mm512_set1_epi32(ys[j][4 * ib + 2 * h + 1]));
                }
                accm[g][j] = _mm512_fmadd_ps(_mm512_mul_ps(dm, _mm512_set1_ps(y[j][ib].d)), _mm512_cvtepi32_ps(msum), accm[g][j]);
            }
            __m512i tot[K4R_TN];
            UNROLL for (int j = 0; j < tn; j++) tot[j] = _mm512_setzero_si512();
            UNROLL for (int jr = 0; jr < 4; jr++) {
                __m512i il[K4R_TN], ih[K4R_TN];
                UNROLL for (int j = 0; j < tn; j++) il[j] = ih[j] = _mm512_setzero_si512();
                UNROLL for (int k = 0; k < 8; k++) {
                    const uint8_t *q = blk + CPU_R16_K4_QS + (size_t)(jr * 8 + k) * 4 * CPU_R16;
                    _mm_prefetch((const char *)q + R16_PREFETCH, _MM_HINT_T0);
                    const __m512i w = _mm512_loadu_si512(q);
                    const __m512i wl = _mm512_and_si512(w, nib), wh = _mm512_and_si512(_mm512_srli_epi32(w, 4), nib);
                    UNROLL for (int j = 0; j < tn; j++) {
                        int32_t vl, vh;
                        memcpy(&vl, y[j][ib].qs + 64 * jr + 4 * k, sizeof vl);
                        memcpy(&vh, y[j][ib].qs + 64 * jr + 32 + 4 * k, sizeof vh);
                        il[j] = _mm512_dpbusd_epi32(il[j], wl, _mm512_set1_epi32(vl));
                        ih[j] = _mm512_dpbusd_epi32(ih[j], wh, _mm512_set1_epi32(vh));
                    }
                }
                /* runs 2 jr (low nibbles) and 2 jr + 1 (high): bytes 2 (jr % 2) and 2 (jr % 2) + 1 of sc[jr / 2] */
                const __m512i s_lo = k4r_byte(sc[jr / 2], 2 * (jr % 2)), s_hi = k4r_byte(sc[jr / 2], 2 * (jr % 2) + 1);
                UNROLL for (int j = 0; j < tn; j++)
                    tot[j] = _mm512_add_epi32(tot[j], _mm512_add_epi32(_mm512_mullo_epi32(il[j], s_lo), _mm512_mullo_epi32(ih[j], s_hi)));
            }
            UNROLL for (int j = 0; j < tn; j++)
                acc[g][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(y[j][ib].d)), _mm512_cvtepi32_ps(tot[j]), acc[g][j]);
        }
    }
    UNROLL for (int j = 0; j < tn; j++) UNROLL for (int g = 0; g < tm; g++)
        _mm512_storeu_ps(a->out + (size_t)(b + j) * a->out_stride + (size_t)(g ? r2 : r), _mm512_sub_ps(acc[g][j], accm[g][j]));
}

#define K4R_TILE(tn) static void k4r16_##tn(const cpu_gemm_args *a, int r, int b) { k4r16_tile(a, r, r, b, 1, tn); }
K4R_TILE(1) K4R_TILE(2) K4R_TILE(3) K4R_TILE(4)
#undef K4R_TILE

void cpu_gemm_q4_K_r16_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    static const cpu_gemm_tile_fn tab[K4R_TN] = {k4r16_1, k4r16_2, k4r16_3, k4r16_4};
    KILN_ASSERT(r0 % CPU_R16 == 0 && r1 % CPU_R16 == 0);
    int r = r0;
    if (b1 - b0 == 1) { /* one activation row: the first half of the groups with the second, as two streams */
        const int half = (r1 - r0) / CPU_R16 / 2 * CPU_R16;
        for (; r < r0 + half; r += CPU_R16) k4r16_tile(a, r, r + half, b0, 2, 1);
        r += half;
    }
    for (; r < r1; r += CPU_R16)
        for (int b = b0; b < b1; b += K4R_TN) tab[(b1 - b < K4R_TN ? b1 - b : K4R_TN) - 1](a, r, b);
}
