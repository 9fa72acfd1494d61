/* sample_kernels_avx2.c — AVX2 + FMA variants of the sampler's kernels (8 logits per step): the block
 * maxima and two sums of exponentials: the exact one, whose terms are bit for bit glibc's expf (its
 * algorithm in 4 double lanes; the sum differs from the scalar reference only in the order of the double
 * additions), and a fast one whose terms are within 3e-7 of expf (a float polynomial); and the histogram's
 * terms (glibc's expf bit for bit too).
 * Compiled with -mavx2 -mfma; called only when the CPU has them. */
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

/* glibc's expf (Arm optimized-routines: 2^(k/32) from a table times a cubic in double, rounded to float),
 * the FMA variant, 4 lanes: the same float as libm's expf for x <= 88 (0 below -103.97, as expf). */
static const uint64_t exp2f_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

static inline __m128 expf4(__m128 x) {
    const __m256d shift = _mm256_set1_pd(0x1.8p+52);
    const __m128 under = _mm_cmplt_ps(x, _mm_set1_ps(-0x1.9fe368p6f)); /* also -inf */
    x = _mm_max_ps(x, _mm_set1_ps(-110.0f));
    const __m256d z = _mm256_mul_pd(_mm256_cvtps_pd(x), _mm256_set1_pd(0x1.71547652b82fep+0 * 32));
    __m256d kd = _mm256_add_pd(z, shift);
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    const __m256d r = _mm256_sub_pd(z, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)exp2f_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    const __m256d c0 = _mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32);
    const __m256d c1 = _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32);
    const __m256d c2 = _mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32);
    const __m256d zz = _mm256_fmadd_pd(c0, r, c1);
    __m256d y = _mm256_fmadd_pd(c2, r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(zz, _mm256_mul_pd(r, r), y);
    y = _mm256_mul_pd(y, _mm256_castsi256_pd(t));
    return _mm_andnot_ps(under, _mm256_cvtpd_ps(y));
}

/* Sum of expf((x - m) / temp) over 8 logits per step, two double accumulators. */
double sample_exp_sum_avx2(const float *x, int n, float m, float temp) {
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(temp);
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int i = 0;
    const int div = temp != 1.0f; /* x / 1 is x: skip the division */
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
        if (div) v = _mm256_div_ps(v, vt);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(expf4(_mm256_castps256_ps128(v))));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(expf4(_mm256_extractf128_ps(v, 1))));
    }
    a0 = _mm256_add_pd(a0, a1);
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a0), _mm256_extractf128_pd(a0, 1));
    double z = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
    for (; i < n; i++) z += (double)expf((x[i] - m) / temp);
    return z;
}

/* A Cephes-style e^x for x <= 88 (rounding by the 1.5 * 2^23 shift), within 3e-7 of expf relatively; below
 * -87.33 it gives e^-87.33 ~ 1.2e-38. */
static inline __m256 exp8_fast(__m256 x) {
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

double sample_exp_sum_fast_avx2(const float *x, int n, float m, float temp) {
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(temp);
    const int div = temp != 1.0f;
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
        if (div) v = _mm256_div_ps(v, vt);
        const __m256 y = exp8_fast(v);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
    }
    a0 = _mm256_add_pd(a0, a1);
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a0), _mm256_extractf128_pd(a0, 1));
    double z = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
    for (; i < n; i++) z += (double)expf((x[i] - m) / temp);
    return z;
}
void sample_hist_terms_avx2(const float *x, int n, float m, float temp, float *e1, float *et) {
    const __m128 vm = _mm_set1_ps(m), vt = _mm_set1_ps(temp);
    const int div = temp != 1.0f;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128 d = _mm_sub_ps(_mm_loadu_ps(x + i), vm);
        const __m128 y1 = expf4(d);
        _mm_storeu_ps(e1 + i, y1);
        _mm_storeu_ps(et + i, div ? expf4(_mm_div_ps(d, vt)) : y1);
    }
    sample_hist_terms_ref(x + i, n - i, m, temp, e1 + i, et + i);
}
#else
/* Built without the ISA flags: never selected, but kept linkable. */
void sample_hist_terms_avx2(const float *x, int n, float m, float temp, float *e1, float *et) {
    sample_hist_terms_ref(x, n, m, temp, e1, et);
}
void sample_block_max_avx2(const float *x, int nblk, float *bm) { sample_block_max_ref(x, nblk, bm); }
double sample_exp_sum_avx2(const float *x, int n, float m, float temp) { return sample_exp_sum_ref(x, n, m, temp); }
double sample_exp_sum_fast_avx2(const float *x, int n, float m, float temp) { return sample_exp_sum_ref(x, n, m, temp); }
#endif
