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

/* Eight keys at a time, each with cpu_attn_dot_avx2's one accumulator chain: eight chains in flight (two FMAs a
 * cycle against their 4-cycle latency), one load of q per step for all eight, and the eight reductions done
 * together where the head has no tail; then four keys, then one. */
void cpu_attn_scores_avx2(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale) {
    const int n8 = n & ~7;
    int j = 0;
#define KEY(r) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k0 + (r) * stride + i)))
    for (; j + 8 <= n_keys; j += 8) {
        const uint16_t *k0 = k + (size_t)j * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int i = 0; i < n8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, KEY(0), a0);
            a1 = _mm256_fmadd_ps(qv, KEY(1), a1);
            a2 = _mm256_fmadd_ps(qv, KEY(2), a2);
            a3 = _mm256_fmadd_ps(qv, KEY(3), a3);
            a4 = _mm256_fmadd_ps(qv, KEY(4), a4);
            a5 = _mm256_fmadd_ps(qv, KEY(5), a5);
            a6 = _mm256_fmadd_ps(qv, KEY(6), a6);
            a7 = _mm256_fmadd_ps(qv, KEY(7), a7);
        }
        if (n8 == n) {
            _mm256_storeu_ps(sc + j, _mm256_mul_ps(finish_dot8(a0, a1, a2, a3, a4, a5, a6, a7), _mm256_set1_ps(scale)));
            continue;
        }
#define FINISH(r, a) sc[j + (r)] = finish_dot(a, q, k0 + (size_t)(r) * stride, n8, n, scale)
        FINISH(0, a0), FINISH(1, a1), FINISH(2, a2), FINISH(3, a3), FINISH(4, a4), FINISH(5, a5), FINISH(6, a6);
        FINISH(7, a7);
    }
    for (; j + 4 <= n_keys; j += 4) {
        const uint16_t *k0 = k + (size_t)j * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < n8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, KEY(0), a0);
            a1 = _mm256_fmadd_ps(qv, KEY(1), a1);
            a2 = _mm256_fmadd_ps(qv, KEY(2), a2);
            a3 = _mm256_fmadd_ps(qv, KEY(3), a3);
        }
        FINISH(0, a0), FINISH(1, a1), FINISH(2, a2), FINISH(3, a3);
    }
#undef FINISH
#undef KEY
    for (; j < n_keys; j++) sc[j] = cpu_attn_dot_avx2(q, k + (size_t)j * stride, n) * scale;
}

/* o in registers, 64 dims at a time over all the keys (eight accumulator chains: two FMAs a cycle against their
 * 4-cycle latency; each element's FMAs in key order, as the axpy loop does them through memory); then 32, then
 * 8, then the scalar tail, each over all keys. */
void cpu_attn_mix_avx2(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n) {
    int c = 0;
#define VAL(r) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vi + 8 * (r))))
    for (; c + 64 <= n; c += 64) {
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0, o7 = o0;
        for (int i = 0; i < n_keys; i++) {
            const __m256 va = _mm256_set1_ps(w[i]);
            const uint16_t *vi = v + (size_t)i * stride + c;
            o0 = _mm256_fmadd_ps(va, VAL(0), o0);
            o1 = _mm256_fmadd_ps(va, VAL(1), o1);
            o2 = _mm256_fmadd_ps(va, VAL(2), o2);
            o3 = _mm256_fmadd_ps(va, VAL(3), o3);
            o4 = _mm256_fmadd_ps(va, VAL(4), o4);
            o5 = _mm256_fmadd_ps(va, VAL(5), o5);
            o6 = _mm256_fmadd_ps(va, VAL(6), o6);
            o7 = _mm256_fmadd_ps(va, VAL(7), o7);
        }
        _mm256_storeu_ps(o + c, o0);
        _mm256_storeu_ps(o + c + 8, o1);
        _mm256_storeu_ps(o + c + 16, o2);
        _mm256_storeu_ps(o + c + 24, o3);
        _mm256_storeu_ps(o + c + 32, o4);
        _mm256_storeu_ps(o + c + 40, o5);
        _mm256_storeu_ps(o + c + 48, o6);
        _mm256_storeu_ps(o + c + 56, o7);
    }
#undef VAL
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
