/*
 * simd_avx512.h — the AVX-512 (F, BW, VL, VNNI) helpers shared by the VNNI block dots (formats/dot_avx512.c)
 * and the CPU backend's AVX-512 tiles (backend/cpu/cpu_gemm_avx512.c), so both compute a block the same way.
 * Only *_avx512.c files include it (the Makefile compiles them with the AVX-512 flags); their callers check
 * kiln_cpu_has_avx512vnni() first. Every integer result here is exact, so it equals the AVX2 one whatever
 * the grouping; the float steps stay with the callers, in the AVX2 kernels' order.
 */
#ifndef KILN_FORMATS_SIMD_AVX512_H
#define KILN_FORMATS_SIMD_AVX512_H

#include <immintrin.h>

#include "formats/simd_avx2.h"

/* Sum of x*y over groups of 4 signed bytes -> 8 int32 lanes (|y| <= 127: the sign moves onto y, as in
 * dot_i8_i8, so vpdpbusd sees |x| unsigned). */
static inline __m256i vnni_i8_i8(__m256i x, __m256i y) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* Q4_0: sum (q - 8) * y over groups of 4 (q the unsigned nibbles) -> 8 int32 lanes. */
static inline __m256i vnni_q4_0(__m256i q, __m256i y) {
    const __m256i z = _mm256_setzero_si256();
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(z, q, y), _mm256_dpbusd_epi32(z, _mm256_set1_epi8(8), y));
}

/* The 32 bytes of Q4_K nibbles at q, in both halves: low half the low nibbles, high half the high nibbles
 * (the weights of the 64 activation bytes that follow each other in a Q8_K block). */
static inline __m512i k4_nibbles64(const uint8_t *q) {
    const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q));
    return _mm512_and_si512(_mm512_srlv_epi64(b, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0x0F));
}

/* sc: the 8 int16 scales of a Q4_K block in both 128-bit lanes of a ymm (k4_scales_mins). Returns
 * [scale 2k x16 | scale 2k+1 x16], the multiplier of k4_nibbles64 of the k-th 32 bytes. */
static inline __m512i k4_scale_pair(__m256i sc, int k) {
    const __m512i s = _mm512_broadcast_i64x4(sc);
    const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(((4 * k + 1) << 8) | (4 * k)))),
                                           _mm256_set1_epi16((short)(((4 * k + 3) << 8) | (4 * k + 2))), 1);
    return _mm512_shuffle_epi8(s, idx);
}

/* The two 256-bit halves of a zmm added: 8 int32 lanes. */
static inline __m256i add_halves_epi32(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* The high 8 float lanes of a zmm (AVX512F only: no DQ needed). */
static inline __m256 high_ps(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

/* The unpacked weights of a Q4_K block for k4_block_int: per 32 bytes k its nibbles (k4_nibbles64) and their
 * scales (k4_scale_pair); sc from k4_scales_mins. */
typedef struct { __m512i q[4], s[4]; } k4_weights;
static inline void k4_unpack(const uint8_t *qs, __m256i sc, k4_weights *w) {
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        w->q[k] = k4_nibbles64(qs + 32 * k);
        w->s[k] = k4_scale_pair(sc, k);
    }
}

/* The integer part of a Q4_K block in kiln_dot_q4_K_avx2 (sum0 + sum1 there) before its halves are added: per k
 * the nibbles times the 64 activation bytes 64k.., each run of 32 times its scale, summed -> 16 int32 lanes,
 * exact; lanes i and i + 8 together are lane i of k4_block_int. */
static inline __m512i k4_block_int16(const k4_weights *w, const int8_t *q8) {
    __m512i sum = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
        sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(w->q[k], _mm512_loadu_si512(q8 + 64 * k)), w->s[k]);
    return sum;
}

/* The same -> 8 int32 lanes. */
static inline __m256i k4_block_int(const k4_weights *w, const int8_t *q8) { return add_halves_epi32(k4_block_int16(w, q8)); }

/* One block of kiln_dot_q4_K_vnni (its float steps, in its order): acc += (y.d * h2f(x.d)) * the integer sums,
 * accm += (y.d * h2f(x.dmin)) * mins x bsums; the dot is hsum(acc - accm) over the blocks. Needs blocks.h. */
static inline void k4_dot_block(const block_q4_K *x, const block_q8_K *y, __m256 *acc, __m256 *accm) {
    const float d = y->d * h2f(x->d), dmin = y->d * h2f(x->dmin);
    __m256i mins16;
    const __m256i sc = k4_scales_mins(x->scales, &mins16);
    const __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(load_bsums(y), mins16));
    *accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin), mins, *accm);
    k4_weights w;
    k4_unpack(x->qs, sc, &w);
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(k4_block_int(&w, y->qs)), *acc);
}

#endif
