/*
 * simd_avx2.h — the AVX2 helpers shared by the block dot products (formats/dot_avx2.c) and the CPU
 * backend's multi-row dots (backend/cpu/cpu_dot_rows_avx2.c), so both compute a block the same way.
 * Every function carries its own target attribute; callers check kiln_cpu_has_avx2() first.
 */
#ifndef KILN_FORMATS_SIMD_AVX2_H
#define KILN_FORMATS_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>

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

#endif
