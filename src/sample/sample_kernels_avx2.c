/* sample_kernels_avx2.c — AVX2 + FMA variants of the sampler's kernels (8 logits per step): the block
 * maxima (exact) and the sum of exponentials (a Cephes-style expf within 2 ulp of libm's, 64 terms summed
 * in float, those partial sums in double). Compiled with -mavx2 -mfma; called only when the CPU has them. */
#include "sample/sample_internal.h"

#include <math.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void sample_block_max_avx2(const float *x, int nblk, float *bm) {
    for (int b = 0; b < nblk; b++) {
        const float *p = x + (size_t)b * SAMPLE_BLOCK;
        __m256 m0 = _mm256_loadu_ps(p), m1 = _mm256_loadu_ps(p + 8);
        for (int j = 16; j < SAMPLE_BLOCK; j += 16) {
            m0 = _mm256_max_ps(m0, _mm256_loadu_ps(p + j));
            m1 = _mm256_max_ps(m1, _mm256_loadu_ps(p + j + 8));
        }
        bm[b] = hmax8(_mm256_max_ps(m0, m1));
    }
}

/* e^x for x <= 88 (Cephes' polynomial; rounding by the 1.5 * 2^23 shift); x below -87.33 (the normal range's
 * end) gives e^-87.33 ~ 1.2e-38 */
static inline __m256 exp8(__m256 x) {
    const __m256 shift = _mm256_set1_ps(12582912.0f);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365448f)), _mm256_set1_ps(88.0f));
    const __m256 nf = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
    const __m256 n = _mm256_sub_ps(nf, shift);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    /* the low mantissa bits of nf hold n: (n + 127) << 23 is 2^n */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(nf), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline __m256d add_ps_to_pd(__m256d acc, __m256 v) {
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

/* 64 terms per float partial sum (8 per lane), each partial added to a double */
double sample_exp_sum_avx2(const float *x, int n, float m, float scale) {
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale);
    __m256d acc = _mm256_setzero_pd();
    int i = 0;
    while (i + 8 <= n) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        const int end = i + 64 <= n ? i + 64 : n - (n - i) % 8;
        for (; i + 16 <= end; i += 16) {
            a0 = _mm256_add_ps(a0, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vs)));
            a1 = _mm256_add_ps(a1, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm), vs)));
        }
        if (i < end) {
            a0 = _mm256_add_ps(a0, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vs)));
            i += 8;
        }
        acc = add_ps_to_pd(add_ps_to_pd(acc, a0), a1);
    }
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
    double z = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
    for (; i < n; i++) z += (double)expf((x[i] - m) * scale);
    return z;
}
#else
/* Built without the ISA flags: never selected, but kept linkable. */
void sample_block_max_avx2(const float *x, int nblk, float *bm) { sample_block_max_ref(x, nblk, bm); }
double sample_exp_sum_avx2(const float *x, int n, float m, float scale) { return sample_exp_sum_ref(x, n, m, scale); }
#endif
