/*
 * simd_avx2.h — the AVX2 helpers shared by the block dot products (formats/dot_avx2.c) and the CPU
 * backend's tiled block products (backend/cpu/cpu_gemm_avx2.c), so both compute a block the same way.
 * Every function carries its own target attribute; callers check kiln_cpu_has_avx2() first.
 */
#ifndef KILN_FORMATS_SIMD_AVX2_H
#define KILN_FORMATS_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "formats/blocks.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* Sum of the 8 lanes (pairs of halves, then pairs, then the last two). */
AVX2 static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Sum of u[i]*s[i] over pairs of 4 bytes -> 8 int32 lanes (u unsigned, s signed). */
AVX2 static inline __m256i dot_u8_i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Same for two signed vectors (sign moved onto s so maddubs sees |a|). */
AVX2 static inline __m256i dot_i8_i8(__m256i a, __m256i s) {
    return dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(s, a));
}

/* 32 nibbles of 16 bytes: lanes 0..15 the low nibbles, lanes 16..31 the high nibbles. */
AVX2 static inline __m256i unpack_nibbles16(const uint8_t *p) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

AVX2 static inline __m256i load_bsums(const block_q8_K *y) { return _mm256_loadu_si256((const __m256i *)y->bsums); }

/* 8 per-32-value scales (int16 in both lanes) -> scale j in every lane. */
#define scale_one(v, j) _mm256_shuffle_epi8((v), _mm256_set1_epi16((short)(((2 * (j) + 1) << 8) | (2 * (j)))))

/* The 12 packed bytes of a Q4_K / Q5_K block (the unpacking of kiln_k4_scales_mins, kept in registers: a
 * store + reload of the bytes stalls): returns the 8 scales as int16 in both 128-bit lanes; *mins16
 * receives the 8 mins as int16, each twice (m0 m0 m1 m1 ...), the multiplier of the 16 bsums. */
AVX2 static inline __m256i k4_scales_mins(const uint8_t *packed, __m256i *mins16) {
    uint32_t u[3];
    memcpy(u, packed, 12);
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    const __m128i sc8 = _mm_setr_epi32((int)(u[0] & lo6), (int)((u[2] & lo4) | (((u[0] >> 6) & lo2) << 4)), 0, 0);
    const __m128i m8 = _mm_setr_epi32((int)(u[1] & lo6), (int)(((u[2] >> 4) & lo4) | (((u[1] >> 6) & lo2) << 4)), 0, 0);
    *mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
}

/* The integer sums of values 64j..64j+63 of a Q4_K / Q5_K block (lo, hi: its 32 + 32 unsigned levels; sc: the 8
 * scales, k4_scales_mins) against the activation values q8 of the block, added to *sum0 / *sum1. */
AVX2 static inline __attribute__((always_inline)) void k4_pair_sums(__m256i lo, __m256i hi, const int8_t *q8, __m256i sc, int j,
                                                                  __m256i *sum0, __m256i *sum1) {
    const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q8 + 64 * j)));
    const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 64 * j + 32)));
    *sum0 = _mm256_add_epi32(*sum0, _mm256_madd_epi16(p0, scale_one(sc, 2 * j)));
    *sum1 = _mm256_add_epi32(*sum1, _mm256_madd_epi16(p1, scale_one(sc, 2 * j + 1)));
}

/* One block of kiln_dot_q4_K_avx2 (its steps, in its order): accm += (y.d * h2f(x.dmin)) * the mins term, acc +=
 * (y.d * h2f(x.d)) * the integer sums; the dot is hsum(acc - accm) over the blocks. */
AVX2 static inline __attribute__((always_inline)) void q4_K_dot_block(const block_q4_K *x, const block_q8_K *y, __m256 *acc, __m256 *accm) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const float d = y->d * h2f(x->d), dmin = y->d * h2f(x->dmin);
    __m256i mins16;
    const __m256i sc = k4_scales_mins(x->scales, &mins16);
    const __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(load_bsums(y), mins16));
    *accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin), mins, *accm);
    __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
        k4_pair_sums(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4), y->qs, sc, j, &sum0, &sum1);
    }
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), *acc);
}

/* 16 per-16-value int8 scales -> int16 vector, low 128-bit lane the even-numbered scales, high lane
 * the odd-numbered ones; scale_pair(v, g) then yields [s(2g) x8 | s(2g+1) x8], the multiplier of the
 * maddubs result of values 32g..32g+31. */
AVX2 static inline __m256i scales_even_odd(__m128i sc8) {
    const __m128i perm = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, perm));
}
#define scale_pair(v, g) _mm256_shuffle_epi8((v), _mm256_set1_epi16((short)(((2 * (g) + 1) << 8) | (2 * (g)))))

/* Half h (values 128h..128h+127) of a Q6_K block as four vectors of unsigned levels 0..63 (value + 32; the -32 is
 * applied through the activation's bsums): v[k] holds the 32 values 128h + 32k.. */
AVX2 static inline __attribute__((always_inline)) void q6_K_unpack_half(const block_q6_K *x, int h, __m256i v[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m03 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0C), m30 = _mm256_set1_epi8(0x30),
                  mc0 = _mm256_set1_epi8((char)0xC0);
    const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
    v[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m03), 4));
    v[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m0c), 2));
    v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
    v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_srli_epi16(_mm256_and_si256(qh, mc0), 2));
}

/* The integer sum of half h of a Q6_K block (unpacked: v, scales eo = scales_even_odd) against the activation
 * values y8 = y->qs + 128h, added to *sum (integer sums are exact: their grouping does not change the result). */
AVX2 static inline __attribute__((always_inline)) void q6_K_half_sums(const __m256i v[4], __m256i eo, int h, const int8_t *y8, __m256i *sum) {
    const __m256i p0 = _mm256_maddubs_epi16(v[0], _mm256_loadu_si256((const __m256i *)(y8 + 0)));
    const __m256i p1 = _mm256_maddubs_epi16(v[1], _mm256_loadu_si256((const __m256i *)(y8 + 32)));
    const __m256i p2 = _mm256_maddubs_epi16(v[2], _mm256_loadu_si256((const __m256i *)(y8 + 64)));
    const __m256i p3 = _mm256_maddubs_epi16(v[3], _mm256_loadu_si256((const __m256i *)(y8 + 96)));
    const __m256i s01 = _mm256_add_epi32(_mm256_madd_epi16(p0, scale_pair(eo, 4 * h + 0)), _mm256_madd_epi16(p1, scale_pair(eo, 4 * h + 1)));
    const __m256i s23 = _mm256_add_epi32(_mm256_madd_epi16(p2, scale_pair(eo, 4 * h + 2)), _mm256_madd_epi16(p3, scale_pair(eo, 4 * h + 3)));
    *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(s01, s23));
}

/* The block's step after its integer sums: acc += (y.d * h2f(x.d)) * (sums - 32 * sum_g scale_g * bsums_g). */
AVX2 static inline __attribute__((always_inline)) __m256 q6_K_block_fma(const block_q6_K *x, const block_q8_K *y, __m128i sc8, __m256i sum, __m256 acc) {
    const float d = y->d * h2f(x->d);
    const __m256i corr = _mm256_madd_epi16(load_bsums(y), _mm256_cvtepi8_epi16(sc8));
    const __m256i sumi = _mm256_sub_epi32(sum, _mm256_slli_epi32(corr, 5));
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
}

/* One block of kiln_dot_q6_K_avx2 (its steps, in its order): acc += (y.d * h2f(x.d)) * the integer sums; the dot
 * is hsum(acc) over the blocks. */
AVX2 static inline __attribute__((always_inline)) void q6_K_dot_block(const block_q6_K *x, const block_q8_K *y, __m256 *accp) {
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    const __m256i eo = scales_even_odd(sc8);
    __m256i sum = _mm256_setzero_si256(), v[4];
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        q6_K_unpack_half(x, h, v);
        q6_K_half_sums(v, eo, h, y->qs + 128 * h, &sum);
    }
    *accp = q6_K_block_fma(x, y, sc8, sum, *accp);
}

#endif
