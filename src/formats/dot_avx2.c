/*
 * dot_avx2.c — AVX2 + FMA + F16C variants of the row dot products and of the Q8_0 / Q8_K activation
 * quantizers. Integer block dots use the unsigned x signed byte multiply-add (vpmaddubsw) and the
 * pairwise int16 multiply-add (vpmaddwd), so each block's integer sum is exact; only the float
 * accumulation order differs from the scalar references in quant_legacy.c / quant_k.c / half.c.
 * Every function carries its own target attribute so the file builds with or without -mavx2; callers
 * must check kiln_cpu_has_avx2() first (register.c does).
 */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>

#include "formats/blocks.h"
#include "formats/simd_avx2.h"

int kiln_cpu_has_avx2(void) {
    __builtin_cpu_init();
    /* F16C is CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c") */
    unsigned eax, ebx, ecx, edx;
    const int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* ------------------------------------------------------------------------------------- helpers */

/* 32 bits -> 32 bytes, 0xFF where the bit is set (byte i <- bit i). */
AVX2 static inline __m256i bits_to_bytes(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, sizeof bits);
    const __m256i spread = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL, 0x0202020202020202LL,
                                              0x0303030303030303LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

/* int16 vector scaled by two per-128-bit-half scales and pairwise summed into 8 int32 lanes. */
AVX2 static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* ---------------------------------------------------------------------------------- float rows */

AVX2 void kiln_dot_f32_avx2(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

AVX2 static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* The 16-bit float dots: four 8-lane accumulators over 32 values, an 8-lane tail, then scalar.
 * LOAD8 widens 8 values to floats, TO_F32 one value. */
#define DOT_16BIT(NAME, LOAD8, TO_F32)                                                                 \
    AVX2 void NAME(int n, float *s, const void *vx, const void *vy) {                                  \
        const uint16_t *x = vx, *y = vy;                                                               \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                    \
        int i = 0;                                                                                     \
        for (; i + 32 <= n; i += 32) {                                                                 \
            a0 = _mm256_fmadd_ps(LOAD8(x + i), LOAD8(y + i), a0);                                      \
            a1 = _mm256_fmadd_ps(LOAD8(x + i + 8), LOAD8(y + i + 8), a1);                              \
            a2 = _mm256_fmadd_ps(LOAD8(x + i + 16), LOAD8(y + i + 16), a2);                            \
            a3 = _mm256_fmadd_ps(LOAD8(x + i + 24), LOAD8(y + i + 24), a3);                            \
        }                                                                                              \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD8(x + i), LOAD8(y + i), a0);               \
        float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));              \
        for (; i < n; i++) sum += TO_F32(x[i]) * TO_F32(y[i]);                                         \
        *s = sum;                                                                                      \
    }

AVX2 static inline __m256 load_bf16x8(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

DOT_16BIT(kiln_dot_f16_avx2, load_f16x8, h2f)
DOT_16BIT(kiln_dot_bf16_avx2, load_bf16x8, kiln_bf16_to_f32)
#undef DOT_16BIT

/* ------------------------------------------------------------------------------- 32-value blocks */

/* The loop shared by the 32-value block dots: BLOCK_INT(ib) gives the 8 int32 partial sums of block ib (lane l
 * = elements 4l..4l+3, exact), BLOCK_SCALE(ib) its float scale, EXTRA(ib) a per-block scalar term (the min of
 * Q4_1 / Q5_1). One accumulator, blocks in order, then the 8 lanes reduced: the reference engine's AVX2 order,
 * so the result is bit-identical to its kernels (T.dot in the quant vectors) and greedy runs stay on its
 * tokens. */
#define BLOCK_LOOP(nb, BLOCK_INT, BLOCK_SCALE, EXTRA)                                                           \
    __m256 acc = _mm256_setzero_ps();                                                                           \
    for (int ib = 0; ib < (nb); ib++) {                                                                         \
        acc = _mm256_fmadd_ps(_mm256_set1_ps(BLOCK_SCALE(ib)), _mm256_cvtepi32_ps(BLOCK_INT(ib)), acc);         \
        EXTRA(ib);                                                                                              \
    }                                                                                                           \
    const float block_sum = hsum_ps(acc)

#define NO_EXTRA(ib) (void)0

AVX2 static inline __m256i q4_0_block(__m256i q, __m256i y, __m256i eight) {
    const __m256i d16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(eight, y));
    return _mm256_madd_epi16(d16, _mm256_set1_epi16(1));
}
#define SCALE_DD(ib) (h2f(x[ib].d) * h2f(y[ib].d))
#define Y_QS(ib) _mm256_loadu_si256((const __m256i *)y[ib].qs)

AVX2 void kiln_dot_q8_0_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
#define Q8_0_INT(ib) dot_i8_i8(_mm256_loadu_si256((const __m256i *)x[ib].qs), Y_QS(ib))
    BLOCK_LOOP(n / QK8_0, Q8_0_INT, SCALE_DD, NO_EXTRA);
#undef Q8_0_INT
    *s = block_sum;
}

AVX2 void kiln_dot_q4_0_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    const __m256i eight = _mm256_set1_epi8(8);
    /* sum (q - 8) * y = sum q * y - sum 8 * y, both through the unsigned x signed multiply-add */
#define Q4_0_INT(ib) q4_0_block(unpack_nibbles16(x[ib].qs), Y_QS(ib), eight)
    BLOCK_LOOP(n / QK8_0, Q4_0_INT, SCALE_DD, NO_EXTRA);
#undef Q4_0_INT
    *s = block_sum;
}

AVX2 void kiln_dot_q4_1_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float summs = 0;
#define Q4_1_INT(ib) dot_u8_i8(unpack_nibbles16(x[ib].qs), Y_QS(ib))
#define MIN_TERM(ib) (summs = fmaf(h2f(x[ib].m), h2f(y[ib].s), summs))
    BLOCK_LOOP(n / QK8_1, Q4_1_INT, SCALE_DD, MIN_TERM);
#undef Q4_1_INT
    *s = block_sum + summs;
}

AVX2 void kiln_dot_q5_0_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    const __m256i high = _mm256_set1_epi8((char)0xF0);
    /* value - 16 = nibble | 0xF0 (as int8) where the fifth bit is clear, the nibble where it is set */
#define Q5_0_INT(ib) \
    dot_i8_i8(_mm256_or_si256(unpack_nibbles16(x[ib].qs), _mm256_andnot_si256(bits_to_bytes(x[ib].qh), high)), Y_QS(ib))
    BLOCK_LOOP(n / QK8_0, Q5_0_INT, SCALE_DD, NO_EXTRA);
#undef Q5_0_INT
    *s = block_sum;
}

AVX2 void kiln_dot_q5_1_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    float summs = 0;
#define Q5_1_INT(ib) \
    dot_u8_i8(_mm256_or_si256(unpack_nibbles16(x[ib].qs), _mm256_and_si256(bits_to_bytes(x[ib].qh), bit4)), Y_QS(ib))
    BLOCK_LOOP(n / QK8_1, Q5_1_INT, SCALE_DD, MIN_TERM);
#undef Q5_1_INT
#undef MIN_TERM
    *s = block_sum + summs;
}

/* ---------------------------------------------------------------------------- 256-value blocks */


AVX2 void kiln_dot_q2_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    for (int i = 0; i < n / QK_K; i++) {
        const float dall = y[i].d * h2f(x[i].d), dmin = y[i].d * h2f(x[i].dmin);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(load_bsums(&y[i]), mins16)), accm);
        const __m256i eo = scales_even_odd(_mm_and_si128(sc8, m4));
        const int8_t *q8 = y[i].qs;
        __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
#define Q2K_GROUP(h, k)                                                                                         \
    {                                                                                                           \
        const __m256i v = _mm256_and_si256(_mm256_srli_epi16(q##h, 2 * (k)), m3);                               \
        const __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)(q8 + 32 * (4 * (h) + (k))))); \
        if ((k) & 1) sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(p, scale_pair(eo, 4 * (h) + (k))));        \
        else sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(p, scale_pair(eo, 4 * (h) + (k))));                \
    }
        const __m256i q0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i q1 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32));
        Q2K_GROUP(0, 0) Q2K_GROUP(0, 1) Q2K_GROUP(0, 2) Q2K_GROUP(0, 3)
        Q2K_GROUP(1, 0) Q2K_GROUP(1, 1) Q2K_GROUP(1, 2) Q2K_GROUP(1, 3)
#undef Q2K_GROUP
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), acc);
    }
    *s = hsum_ps(_mm256_sub_ps(acc, accm));
}

/* The 16 signed scales of a Q3_K block (kiln_q3k_scales), computed in registers. */
AVX2 static inline __m128i q3k_scales_vec(const uint8_t *packed) {
    uint32_t a[3];
    memcpy(a, packed, 12);
    const uint32_t lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u, tmp = a[2];
    const __m128i w = _mm_setr_epi32((int)((a[0] & lo4) | (((tmp >> 0) & lo2) << 4)), (int)((a[1] & lo4) | (((tmp >> 2) & lo2) << 4)),
                                     (int)(((a[0] >> 4) & lo4) | (((tmp >> 4) & lo2) << 4)),
                                     (int)(((a[1] >> 4) & lo4) | (((tmp >> 6) & lo2) << 4)));
    return _mm_sub_epi8(w, _mm_set1_epi8(32));
}

AVX2 void kiln_dot_q3_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * h2f(x[i].d);
        const __m128i sc8 = q3k_scales_vec(x[i].scales);
        const __m256i eo = scales_even_odd(sc8);
        const int8_t *q8 = y[i].qs;
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
        /* level + 4 = low two bits | high bit << 2, in 0..7; the -4 is applied through bsums */
#define Q3K_GROUP(h, k)                                                                                         \
    {                                                                                                           \
        const int g = 4 * (h) + (k);                                                                            \
        const __m256i hb = g < 2 ? _mm256_slli_epi16(hbits, 2 - g) : _mm256_srli_epi16(hbits, g - 2);           \
        const __m256i v = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q##h, 2 * (k)), m3), _mm256_and_si256(hb, m4)); \
        const __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)(q8 + 32 * g)));         \
        if ((k) & 1) sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(p, scale_pair(eo, g)));                    \
        else sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(p, scale_pair(eo, g)));                            \
    }
        const __m256i q0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i q1 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32));
        Q3K_GROUP(0, 0) Q3K_GROUP(0, 1) Q3K_GROUP(0, 2) Q3K_GROUP(0, 3)
        Q3K_GROUP(1, 0) Q3K_GROUP(1, 1) Q3K_GROUP(1, 2) Q3K_GROUP(1, 3)
#undef Q3K_GROUP
        const __m256i corr = _mm256_madd_epi16(load_bsums(&y[i]), _mm256_cvtepi8_epi16(sc8));
        const __m256i sumi = _mm256_sub_epi32(_mm256_add_epi32(sum0, sum1), _mm256_slli_epi32(corr, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_ps(acc);
}

/* Q4_K / Q5_K: 8 scales (int16, both lanes) and the mins term sum_j min_j * (bsums[2j] + bsums[2j+1]). */
AVX2 static inline __m256i k4_prepare(const uint8_t *packed, const block_q8_K *y, __m256 *mins_term) {
    __m256i mins16;
    const __m256i sc = k4_scales_mins(packed, &mins16);
    *mins_term = _mm256_cvtepi32_ps(_mm256_madd_epi16(load_bsums(y), mins16));
    return sc;
}

AVX2 void kiln_dot_q4_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    for (int i = 0; i < n / QK_K; i++) q4_K_dot_block(&x[i], &y[i], &acc, &accm);
    *s = hsum_ps(_mm256_sub_ps(acc, accm));
}

AVX2 void kiln_dot_q5_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m16 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    for (int i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * h2f(x[i].d), dmin = y[i].d * h2f(x[i].dmin);
        __m256 mins;
        const __m256i sc = k4_prepare(x[i].scales, &y[i], &mins);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin), mins, accm);
        const int8_t *q8 = y[i].qs;
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
        /* the fifth bit of value 64j+l is bit 2j of qh[l], of value 64j+32+l bit 2j+1: move it to bit 4 */
#define SHIFT_TO_BIT4(v, b) ((b) < 4 ? _mm256_slli_epi16((v), 4 - (b)) : (b) > 4 ? _mm256_srli_epi16((v), (b) - 4) : (v))
#define Q5K_PAIR(j)                                                                                             \
    {                                                                                                           \
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * (j)));                            \
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(SHIFT_TO_BIT4(hbits, 2 * (j)), m16)); \
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),                      \
                                           _mm256_and_si256(SHIFT_TO_BIT4(hbits, 2 * (j) + 1), m16));           \
        k4_pair_sums(lo, hi, q8, sc, j, &sum0, &sum1);                                                          \
    }
        Q5K_PAIR(0) Q5K_PAIR(1) Q5K_PAIR(2) Q5K_PAIR(3)
#undef Q5K_PAIR
#undef SHIFT_TO_BIT4
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), acc);
    }
    *s = hsum_ps(_mm256_sub_ps(acc, accm));
}

AVX2 void kiln_dot_q6_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) q6_K_dot_block(&x[i], &y[i], &acc);
    *s = hsum_ps(acc);
}

/* ------------------------------------------------------------------------ activation quantizers */

AVX2 static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

AVX2 static inline float max_abs32(const float *x, int n) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + j)));
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* roundf semantics (halves away from zero), exactly: truncate, then step away when |frac| >= 0.5. */
AVX2 static inline __m256i round_away_epi32(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = abs_ps(_mm256_sub_ps(v, t));
    const __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                      _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, _mm256_set1_ps(-0.0f))));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

/* Packs 4 x 8 int32 (each within int8 range) into 32 int8 in order. */
AVX2 static inline __m256i pack_i32x32_to_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    const __m256i r = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One 32-value block to int8 levels, with the reference quantizer's rule (id = 1 / (amax / 127), halves away
 * from zero) or, when act, the rule of the reference engine's AVX2 activation quantizer (id = 127 / amax,
 * halves to even: what its CPU matmul applies to activations; the two differ in rare last-bit cases, enough
 * to move a greedy run off the reference's tokens). Returns d; *sum receives the sum of the levels. */
AVX2 static inline __m256i round_even_epi32(__m256 v) {
    return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

AVX2 static inline float q8_block_avx2(const float *x, int8_t *qs, bool act, int *sum) {
    const float amax = max_abs32(x, 32);
    const float d = amax / ((1 << 7) - 1);
    const float id = act ? (amax != 0.0f ? 127.f / amax : 0.0f) : (d ? 1.0f / d : 0.0f);
    const __m256 vid = _mm256_set1_ps(id);
    __m256i l[4];
    for (int k = 0; k < 4; k++) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid);
        l[k] = act ? round_even_epi32(v) : round_away_epi32(v);
    }
    _mm256_storeu_si256((__m256i *)qs, pack_i32x32_to_i8(l[0], l[1], l[2], l[3]));
    *sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(l[0], l[1]), _mm256_add_epi32(l[2], l[3])));
    return d;
}

AVX2 static inline void q8_0_rows_avx2(const float *x, block_q8_0 *y, int64_t n, bool act) {
    int sum;
    for (int64_t i = 0; i < n / QK8_0; i++) y[i].d = kiln_f32_to_f16(q8_block_avx2(x + i * QK8_0, y[i].qs, act, &sum));
}

/* q8_1 also stores s = d * (sum of the 32 levels); the integer sum is exact */
AVX2 static inline void q8_1_rows_avx2(const float *x, block_q8_1 *y, int64_t n, bool act) {
    int sum;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const float d = q8_block_avx2(x + i * QK8_1, y[i].qs, act, &sum);
        y[i].d = kiln_f32_to_f16(d);
        y[i].s = kiln_f32_to_f16((float)sum * d);
    }
}

AVX2 void kiln_q8_0_from_float_avx2(const float *x, void *y, int64_t n) { q8_0_rows_avx2(x, y, n, false); }
AVX2 void kiln_q8_1_from_float_avx2(const float *x, void *y, int64_t n) { q8_1_rows_avx2(x, y, n, false); }
AVX2 void kiln_q8_0_act_avx2(const float *x, void *y, int64_t n) { q8_0_rows_avx2(x, y, n, true); }
AVX2 void kiln_q8_1_act_avx2(const float *x, void *y, int64_t n) { q8_1_rows_avx2(x, y, n, true); }

/* F32 -> F16 with F16C (round to nearest even, like kiln_f32_to_f16); groups holding a NaN take the scalar
 * path so that NaNs get the same bits too. */
AVX2 void kiln_f16_from_float_avx2(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            for (int k = 0; k < 8; k++) y[i + k] = kiln_f32_to_f16(x[i + k]);
            continue;
        }
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; i++) y[i] = kiln_f32_to_f16(x[i]);
}

AVX2 void kiln_q8_K_from_float_avx2(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float amax = max_abs32(x, QK_K);
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            memset(y[i].bsums, 0, sizeof y[i].bsums);
            continue;
        }
        float max = 0;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        const float iscale = -127.f / max;
        const __m256 vis = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vis);
                q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)), lim);
            }
            const __m256i q8 = pack_i32x32_to_i8(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), q8);
            /* sums of 16: sign-extend to int16 and add pairs down */
            const __m256i w = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q8)), _mm256_set1_epi16(1));
            const __m256i w2 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q8, 1)), _mm256_set1_epi16(1));
            y[i].bsums[j / 16] = (int16_t)hsum_epi32(w);
            y[i].bsums[j / 16 + 1] = (int16_t)hsum_epi32(w2);
        }
        y[i].d = 1 / iscale;
    }
}
