/* cpu_attn_avx2.c — AVX2 + F16C attention inner loops (8 dims per step; scores 8 keys at once, mix with the
 * output in registers). Compiled with -mavx2 -mfma -mf16c; called only when the CPU has them. */
#include "backend/cpu/cpu_attn.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

float cpu_attn_dot_avx2(const float *q, const uint16_t *k, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += q[i] * _cvtsh_ss(k[i]);
    return r;
}

void cpu_attn_axpy_avx2(float *o, float a, const uint16_t *v, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))),
                                                _mm256_loadu_ps(o + i)));
    for (; i < n; i++) o[i] += a * _cvtsh_ss(v[i]);
}

/* F16C both ways, round to nearest even like kiln_f32_to_f16 (which the half tests pin to F16C); a group of 8
 * holding a NaN takes the scalar pair so that NaNs get the same bits too; a non-NaN group never yields a NaN half,
 * and the widening of every other half is exact. */
void cpu_attn_round_f16_avx2(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            cpu_attn_round_f16_ref(x + i, 8);
            continue;
        }
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    }
    cpu_attn_round_f16_ref(x + i, n - i);
}

/* cpu_attn_dot_avx2's reduction of one key's accumulator, then its scalar tail, then the scale. */
static inline float finish_dot(__m256 acc, const float *q, const uint16_t *k, int i, int n, float scale) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += q[i] * _cvtsh_ss(k[i]);
    return r * scale;
}

/* The 8 accumulators of keys 0..7 reduced as finish_dot reduces each one (lo + hi, then lanes 0 + 2 and 1 + 3,
 * then those two), side by side: the same additions per key on the same operands, without a tail. */
static inline __m256 finish_dot8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                                 __m256 a7) {
#define HALVES(x, y) _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31))
    const __m256 h01 = HALVES(a0, a1), h23 = HALVES(a2, a3), h45 = HALVES(a4, a5), h67 = HALVES(a6, a7);
#undef HALVES
    /* per 128-bit lane: keys (0, 2) | (1, 3), each as (lane 0 + lane 2, lane 1 + lane 3) */
    const __m256 s0213 = _mm256_add_ps(_mm256_shuffle_ps(h01, h23, 0x44), _mm256_shuffle_ps(h01, h23, 0xee));
    const __m256 s4657 = _mm256_add_ps(_mm256_shuffle_ps(h45, h67, 0x44), _mm256_shuffle_ps(h45, h67, 0xee));
    /* keys 0, 2, 4, 6 | 1, 3, 5, 7, put back in order */
    return _mm256_permutevar8x32_ps(_mm256_hadd_ps(s0213, s4657), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* acc[r] += b * (the 8 halves at p + r * step, widened) for r < R: R independent FMA chains (R a constant where
 * inlined, so that acc stays in registers). */
static inline void fma_rows(__m256 *acc, __m256 b, const uint16_t *p, size_t step, const int R) {
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        acc[r] = _mm256_fmadd_ps(b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + (size_t)r * step))), acc[r]);
}

/* Keys j .. j + R - 1 (R = 8 or 4), each with cpu_attn_dot_avx2's one accumulator chain: R chains in flight (8:
 * two FMAs a cycle against their 4-cycle latency) and one load of q per step for all; with 8 keys and no tail
 * the eight reductions are done together. */
static inline void scores_keys(float *sc, const float *q, const uint16_t *k0, size_t stride, int n, float scale,
                               const int R) {
    const int n8 = n & ~7;
    __m256 a[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps();
    for (int i = 0; i < n8; i += 8) fma_rows(a, _mm256_loadu_ps(q + i), k0 + i, stride, R);
    if (R == 8 && n8 == n) {
        _mm256_storeu_ps(sc, _mm256_mul_ps(finish_dot8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]),
                                           _mm256_set1_ps(scale)));
        return;
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sc[r] = finish_dot(a[r], q, k0 + (size_t)r * stride, n8, n, scale);
}

/* Eight keys at a time (scores_keys), then four, then one. */
void cpu_attn_scores_avx2(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale) {
    int j = 0;
    for (; j + 8 <= n_keys; j += 8) scores_keys(sc + j, q, k + (size_t)j * stride, stride, n, scale, 8);
    for (; j + 4 <= n_keys; j += 4) scores_keys(sc + j, q, k + (size_t)j * stride, stride, n, scale, 4);
    for (; j < n_keys; j++) sc[j] = cpu_attn_dot_avx2(q, k + (size_t)j * stride, n) * scale;
}

/* o[0 .. 8R) over all the keys, in registers: R accumulator chains (R a constant where inlined), each element's
 * FMAs in key order, as the axpy loop does them through memory. */
static inline void mix_dims(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, const int R) {
    __m256 acc[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < n_keys; i++) fma_rows(acc, _mm256_set1_ps(w[i]), v + (size_t)i * stride, 8, R);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _mm256_storeu_ps(o + 8 * r, acc[r]);
}

/* 64 dims at a time (eight chains: two FMAs a cycle against their 4-cycle latency), then 32, then 8, then the
 * scalar tail, each over all keys. */
void cpu_attn_mix_avx2(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n) {
    int c = 0;
    for (; c + 64 <= n; c += 64) mix_dims(o + c, w, v + c, stride, n_keys, 8);
    for (; c + 32 <= n; c += 32) mix_dims(o + c, w, v + c, stride, n_keys, 4);
    for (; c + 8 <= n; c += 8) mix_dims(o + c, w, v + c, stride, n_keys, 1);
    for (; c < n; c++) {
        o[c] = 0.0f;
        for (int i = 0; i < n_keys; i++) o[c] += w[i] * _cvtsh_ss(v[(size_t)i * stride + c]);
    }
}
#else
/* Built without the ISA flags (e.g. a fuzz build): never selected, but kept linkable. */
float cpu_attn_dot_avx2(const float *q, const uint16_t *k, int n) { return cpu_attn_dot_ref(q, k, n); }
void cpu_attn_axpy_avx2(float *o, float a, const uint16_t *v, int n) { cpu_attn_axpy_ref(o, a, v, n); }
void cpu_attn_round_f16_avx2(float *x, int n) { cpu_attn_round_f16_ref(x, n); }
void cpu_attn_scores_avx2(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale) {
    cpu_attn_scores_ref(sc, q, k, stride, n_keys, n, scale);
}
void cpu_attn_mix_avx2(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n) {
    cpu_attn_mix_ref(o, w, v, stride, n_keys, n);
}
#endif
