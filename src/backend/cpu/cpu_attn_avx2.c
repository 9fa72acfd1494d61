/* cpu_attn_avx2.c — AVX2 + F16C attention inner loops (8 dims per step; scores 4 keys at once, mix with the
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

/* Four keys at a time, each with cpu_attn_dot_avx2's one accumulator chain: four chains in flight instead of one
 * waiting on the FMA latency, and one load of q per step for all four. */
void cpu_attn_scores_avx2(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale) {
    const int n8 = n & ~7;
    int j = 0;
    for (; j + 4 <= n_keys; j += 4) {
        const uint16_t *k0 = k + (size_t)j * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < n8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k0 + i))), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k1 + i))), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k2 + i))), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k3 + i))), a3);
        }
        sc[j] = finish_dot(a0, q, k0, n8, n, scale);
        sc[j + 1] = finish_dot(a1, q, k1, n8, n, scale);
        sc[j + 2] = finish_dot(a2, q, k2, n8, n, scale);
        sc[j + 3] = finish_dot(a3, q, k3, n8, n, scale);
    }
    for (; j < n_keys; j++) sc[j] = cpu_attn_dot_avx2(q, k + (size_t)j * stride, n) * scale;
}

/* o in registers, 32 dims at a time over all the keys (each element's FMAs in key order, as the axpy loop does
 * them through memory); the last dims below a multiple of 32 by 8, then the scalar tail, each over all keys. */
void cpu_attn_mix_avx2(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n) {
    int c = 0;
    for (; c + 32 <= n; c += 32) {
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        for (int i = 0; i < n_keys; i++) {
            const __m256 va = _mm256_set1_ps(w[i]);
            const uint16_t *vi = v + (size_t)i * stride + c;
            o0 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)vi)), o0);
            o1 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vi + 8))), o1);
            o2 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vi + 16))), o2);
            o3 = _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vi + 24))), o3);
        }
        _mm256_storeu_ps(o + c, o0);
        _mm256_storeu_ps(o + c + 8, o1);
        _mm256_storeu_ps(o + c + 16, o2);
        _mm256_storeu_ps(o + c + 24, o3);
    }
    for (; c + 8 <= n; c += 8) {
        __m256 o0 = _mm256_setzero_ps();
        for (int i = 0; i < n_keys; i++)
            o0 = _mm256_fmadd_ps(_mm256_set1_ps(w[i]), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + (size_t)i * stride + c))), o0);
        _mm256_storeu_ps(o + c, o0);
    }
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
