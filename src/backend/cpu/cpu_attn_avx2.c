/* cpu_attn_avx2.c — AVX2 + F16C attention inner loops (8 keys' dims per step). Compiled with -mavx2 -mfma
 * -mf16c; called only when the CPU has them. */
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
#else
/* Built without the ISA flags (e.g. a fuzz build): never selected, but kept linkable. */
float cpu_attn_dot_avx2(const float *q, const uint16_t *k, int n) { return cpu_attn_dot_ref(q, k, n); }
void cpu_attn_axpy_avx2(float *o, float a, const uint16_t *v, int n) { cpu_attn_axpy_ref(o, a, v, n); }
#endif
