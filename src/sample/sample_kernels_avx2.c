/* sample_kernels_avx2.c — AVX2 + FMA variants of the sampler's kernels (8 logits per step): the block
 * maxima; two sums of exponentials: the exact one, whose terms are bit for bit glibc's expf (its algorithm
 * in 4 double lanes) summed in SAMPLE_SUM_ORDER (so equal to the scalar reference's double), and a fast one
 * whose terms are within 3e-7 of expf (a float polynomial); the histogram's block (its terms, bins and exact
 * sum) and the search of one bin's members.
 * Compiled with -mavx2 -mfma; called only when the CPU has them. */
#include "sample/sample_internal.h"

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

/* glibc's expf (sample_internal.h's table and constants), the FMA variant, 4 lanes: the same float as libm's
 * expf for x <= 88 (0 below -103.97, as expf). */
static inline __m128 expf4(__m128 x) {
    const __m256d shift = _mm256_set1_pd(0x1.8p+52);
    const __m128 under = _mm_cmplt_ps(x, _mm_set1_ps(-0x1.9fe368p6f)); /* also -inf */
    x = _mm_max_ps(x, _mm_set1_ps(-110.0f));
    const __m256d z = _mm256_mul_pd(_mm256_cvtps_pd(x), _mm256_set1_pd(SAMPLE_EXPF_INV_LN2_N));
    __m256d kd = _mm256_add_pd(z, shift);
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    const __m256d r = _mm256_sub_pd(z, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)sample_exp2f_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    const __m256d c0 = _mm256_set1_pd(SAMPLE_EXPF_C0), c1 = _mm256_set1_pd(SAMPLE_EXPF_C1);
    const __m256d c2 = _mm256_set1_pd(SAMPLE_EXPF_C2);
    const __m256d zz = _mm256_fmadd_pd(c0, r, c1);
    __m256d y = _mm256_fmadd_pd(c2, r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(zz, _mm256_mul_pd(r, r), y);
    y = _mm256_mul_pd(y, _mm256_castsi256_pd(t));
    return _mm_andnot_ps(under, _mm256_cvtpd_ps(y));
}

/* The block sum of SAMPLE_SUM_ORDER from lanes 0-3 (a) and 4-7 (b): ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
 * (l3 + l7)). */
static inline double block_sum(__m256d a, __m256d b) {
    a = _mm256_add_pd(a, b);
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

static inline __m256 expf8(__m256 v) {
    return _mm256_set_m128(expf4(_mm256_extractf128_ps(v, 1)), expf4(_mm256_castps256_ps128(v)));
}

double sample_exp_sum_avx2(const float *x, int nblk, float m, float temp, double z) {
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(temp);
    const int div = temp != 1.0f; /* x / 1 is x: skip the division */
    for (int b = 0; b < nblk; b++, x += SAMPLE_BLOCK) {
        __m256d a = _mm256_setzero_pd(), c = _mm256_setzero_pd();
        for (int j = 0; j < SAMPLE_BLOCK; j += 8) {
            __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + j), vm);
            if (div) v = _mm256_div_ps(v, vt);
            const __m256 y = expf8(v);
            a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
            c = _mm256_add_pd(c, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
        }
        z += block_sum(a, c);
    }
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

double sample_exp_sum_fast_avx2(const float *x, int nblk, float m, float temp, double z) {
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(temp);
    const int div = temp != 1.0f;
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (int i = 0; i < nblk * SAMPLE_BLOCK; i += 8) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
        if (div) v = _mm256_div_ps(v, vt);
        const __m256 y = exp8_fast(v);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
    }
    return z + block_sum(a0, a1);
}

double sample_hist_block_avx2(const float *x, float m, float temp, float lo, float scale, float *e1, float *et,
                              uint16_t *bin, double z) {
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(temp), vlo = _mm256_set1_ps(lo);
    const __m256 vs = _mm256_set1_ps(scale), top = _mm256_set1_ps((float)(HIST_BINS - 1));
    const __m256i dump = _mm256_add_epi32(_mm256_set1_epi32(HIST_BINS), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const int div = temp != 1.0f;
    __m256d a = _mm256_setzero_pd(), c = _mm256_setzero_pd();
    for (int j = 0; j < SAMPLE_BLOCK; j += 8) {
        const __m256 xv = _mm256_loadu_ps(x + j), d = _mm256_sub_ps(xv, vm);
        const __m256 y = expf8(d);
        _mm256_storeu_ps(e1 + j, y);
        _mm256_storeu_ps(et + j, div ? expf8(_mm256_div_ps(d, vt)) : y);
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
        c = _mm256_add_pd(c, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
        /* (m - x) * scale, at most HIST_BINS - 1, truncated; HIST_BINS + j % 8 where !(x >= lo) */
        const __m256 t = _mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(vm, xv), vs), top);
        const __m256 keep = _mm256_cmp_ps(xv, vlo, _CMP_GE_OQ);
        const __m256i k = _mm256_blendv_epi8(dump, _mm256_cvttps_epi32(t), _mm256_castps_si256(keep));
        _mm_storeu_si128((__m128i *)(bin + j),
                         _mm_packus_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1)));
    }
    return z + block_sum(a, c);
}

int sample_hist_moments_avx2(const float *x, float m, float lo, float w, uint16_t *bin, double *mom) {
    const __m256 vm = _mm256_set1_ps(m), vlo = _mm256_set1_ps(lo), vs = _mm256_set1_ps(1.0f / w);
    const __m256 top = _mm256_set1_ps((float)(HIST_BINS - 1)), nw = _mm256_set1_ps(-w);
    const __m256 nhw = _mm256_set1_ps(-0.5f * w);
    const __m256d one = _mm256_set1_pd(1.0);
    const __m256i dump = _mm256_add_epi32(_mm256_set1_epi32(HIST_BINS), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _Alignas(32) double quad[4 * SAMPLE_BLOCK];
    __m256i hi = _mm256_set1_epi32(-1);
    for (int j = 0; j < SAMPLE_BLOCK; j += 8) {
        const __m256 xv = _mm256_loadu_ps(x + j), keep = _mm256_cmp_ps(xv, vlo, _CMP_GE_OQ);
        const __m256i k = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(vm, xv), vs), top));
        const __m256i kd = _mm256_blendv_epi8(dump, k, _mm256_castps_si256(keep));
        hi = _mm256_max_epi32(hi, _mm256_blendv_epi8(_mm256_set1_epi32(-1), k, _mm256_castps_si256(keep)));
        _mm_storeu_si128((__m128i *)(bin + j),
                         _mm_packus_epi32(_mm256_castsi256_si128(kd), _mm256_extracti128_si256(kd, 1)));
        /* the offset from the bin's centre -(k + 1/2) w (exact: w a power of two); zeros below lo */
        const __m256 c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k), nw, nhw);
        const __m256 ef = _mm256_and_ps(keep, _mm256_sub_ps(_mm256_sub_ps(xv, vm), c));
        for (int h = 0; h < 2; h++) { /* ids j + 4h .. j + 4h + 3: quads i = 0..3 in id order */
            const __m256d e = _mm256_cvtps_pd(h ? _mm256_extractf128_ps(ef, 1) : _mm256_castps256_ps128(ef));
            const __m256d e2 = _mm256_mul_pd(e, e), e3 = _mm256_mul_pd(e2, e);
            const __m256d cnt = _mm256_and_pd(_mm256_castsi256_pd(_mm256_cvtepi32_epi64(
                                                  _mm_castps_si128(h ? _mm256_extractf128_ps(keep, 1)
                                                                     : _mm256_castps256_ps128(keep)))),
                                              one);
            const __m256d a = _mm256_unpacklo_pd(cnt, e), b = _mm256_unpackhi_pd(cnt, e); /* ids 0, 2 | 1, 3 */
            const __m256d cc = _mm256_unpacklo_pd(e2, e3), dd = _mm256_unpackhi_pd(e2, e3);
            double *o = quad + 4 * (j + 4 * h);
            _mm256_store_pd(o, _mm256_permute2f128_pd(a, cc, 0x20));      /* id 0 */
            _mm256_store_pd(o + 4, _mm256_permute2f128_pd(b, dd, 0x20));  /* id 1 */
            _mm256_store_pd(o + 8, _mm256_permute2f128_pd(a, cc, 0x31));  /* id 2 */
            _mm256_store_pd(o + 12, _mm256_permute2f128_pd(b, dd, 0x31)); /* id 3 */
        }
    }
    /* in id order (the reference's sums); an id below lo adds zeros to its dump slot */
    for (int j = 0; j < SAMPLE_BLOCK; j++) {
        double *q = mom + 4 * bin[j];
        _mm256_storeu_pd(q, _mm256_add_pd(_mm256_loadu_pd(q), _mm256_load_pd(quad + 4 * j)));
    }
    int m8[8], top8 = -1;
    _mm256_storeu_si256((__m256i *)m8, hi);
    for (int i = 0; i < 8; i++) top8 = m8[i] > top8 ? m8[i] : top8;
    return top8;
}

void sample_prefix_block_avx2(const float *t, const uint16_t *bin, int kb, double norm, double *acc,
                              float *least) {
    const __m256d vn = _mm256_set1_pd(norm);
    const __m256i vkb = _mm256_set1_epi32(kb);
    __m256d a = _mm256_setzero_pd(), c = _mm256_setzero_pd(); /* lanes 0-3 and 4-7 */
    __m256 l = _mm256_set1_ps(*least);
    for (int j = 0; j < SAMPLE_BLOCK; j += 8) {
        const __m256 tj = _mm256_loadu_ps(t + j);
        const __m128 q0 = _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(tj)), vn));
        const __m128 q1 = _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(tj, 1)), vn));
        const __m256 q = _mm256_insertf128_ps(_mm256_castps128_ps256(q0), q1, 1);
        const __m256i bj = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(bin + j)));
        const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vkb, bj));
        const __m256 qi = _mm256_and_ps(in, q);
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(qi)));
        c = _mm256_add_pd(c, _mm256_cvtps_pd(_mm256_extractf128_ps(qi, 1)));
        l = _mm256_blendv_ps(l, q, _mm256_and_ps(in, _mm256_cmp_ps(q, l, _CMP_LT_OQ)));
    }
    *acc += block_sum(a, c);
    float m[8];
    _mm256_storeu_ps(m, l);
    for (int i = 0; i < 8; i++) *least = m[i] < *least ? m[i] : *least;
}

int sample_bin_find_avx2(const uint16_t *bin, int n, uint16_t kb, int32_t *ids) {
    const __m256i key = _mm256_set1_epi16((short)kb);
    int c = 0;
    for (int i = 0; i < n; i += 32) {
        const __m256i q0 = _mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i *)(bin + i)), key);
        const __m256i q1 = _mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i *)(bin + i + 16)), key);
        if (_mm256_testz_si256(_mm256_or_si256(q0, q1), _mm256_or_si256(q0, q1))) continue;
        /* two mask bits per element: keep the even ones */
        uint64_t mm = ((uint64_t)(uint32_t)_mm256_movemask_epi8(q1) << 32 | (uint32_t)_mm256_movemask_epi8(q0)) &
                      0x5555555555555555ull;
        for (; mm; mm &= mm - 1) ids[c++] = i + __builtin_ctzll(mm) / 2;
    }
    return c;
}
