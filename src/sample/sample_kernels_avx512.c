/* sample_kernels_avx512.c — AVX-512 variants of the sampler's exact kernels: the sum of exponentials and the
 * histogram's block, whose terms are glibc's expf bit for bit (its algorithm in 8 double lanes, the table of
 * 2^(k/32) looked up by two permutes instead of a gather) and whose sums follow SAMPLE_SUM_ORDER, so that they
 * return the scalar reference's values bit for bit; and the search of one bin's members (compressing the
 * matches' indices). The fast sum stays AVX2's.
 * Compiled with the AVX-512 flags (Makefile AVX512_FLAGS); called only at that CPU level. */
#include "sample/sample_internal.h"

#include <immintrin.h>

/* glibc's expf of 8 floats in 8 double lanes: the same float as libm's for x <= 88 (0 below -103.97). */
static inline __m256 expf8(__m256 x) {
    const __m512d shift = _mm512_set1_pd(0x1.8p+52);
    const __mmask8 under = _mm256_cmp_ps_mask(x, _mm256_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ); /* also -inf */
    x = _mm256_max_ps(x, _mm256_set1_ps(-110.0f));
    const __m512d z = _mm512_mul_pd(_mm512_cvtps_pd(x), _mm512_set1_pd(SAMPLE_EXPF_INV_LN2_N));
    __m512d kd = _mm512_add_pd(z, shift);
    const __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    const __m512d r = _mm512_sub_pd(z, kd);
    /* T[ki % 32]: entries 0..15 and 16..31 by index bits 0..3, then bit 4 picks */
    const __m512i *tab = (const __m512i *)sample_exp2f_tab;
    const __m512i lo = _mm512_permutex2var_epi64(_mm512_load_si512(tab), ki, _mm512_load_si512(tab + 1));
    const __m512i hi = _mm512_permutex2var_epi64(_mm512_load_si512(tab + 2), ki, _mm512_load_si512(tab + 3));
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    const __m512d c0 = _mm512_set1_pd(SAMPLE_EXPF_C0), c1 = _mm512_set1_pd(SAMPLE_EXPF_C1);
    const __m512d c2 = _mm512_set1_pd(SAMPLE_EXPF_C2);
    const __m512d zz = _mm512_fmadd_pd(c0, r, c1);
    __m512d y = _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(zz, _mm512_mul_pd(r, r), y);
    y = _mm512_mul_pd(y, _mm512_castsi512_pd(t));
    return _mm256_maskz_mov_ps((__mmask8)~under, _mm512_cvtpd_ps(y));
}

/* The block sum of SAMPLE_SUM_ORDER from the 8 lanes: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */
static inline double block_sum(__m512d a) {
    const __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(a), _mm512_extractf64x4_pd(a, 1));
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

double sample_exp_sum_avx512(const float *x, int nblk, float m, float temp, double z) {
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(temp);
    const int div = temp != 1.0f; /* x / 1 is x: skip the division */
    for (int b = 0; b < nblk; b++, x += SAMPLE_BLOCK) {
        __m512d a = _mm512_setzero_pd();
        for (int j = 0; j < SAMPLE_BLOCK; j += 8) {
            __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + j), vm);
            if (div) v = _mm256_div_ps(v, vt);
            a = _mm512_add_pd(a, _mm512_cvtps_pd(expf8(v)));
        }
        z += block_sum(a);
    }
    return z;
}

double sample_hist_block_avx512(const float *x, float m, float temp, float lo, float scale, float *e1, float *et,
                                uint16_t *bin, double z) {
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(temp), vlo = _mm256_set1_ps(lo);
    const __m256 vs = _mm256_set1_ps(scale), top = _mm256_set1_ps((float)(HIST_BINS - 1));
    const __m256i dump = _mm256_add_epi32(_mm256_set1_epi32(HIST_BINS), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const int div = temp != 1.0f;
    __m512d a = _mm512_setzero_pd();
    for (int j = 0; j < SAMPLE_BLOCK; j += 8) {
        const __m256 xv = _mm256_loadu_ps(x + j), d = _mm256_sub_ps(xv, vm);
        const __m256 y = expf8(d);
        _mm256_storeu_ps(e1 + j, y);
        _mm256_storeu_ps(et + j, div ? expf8(_mm256_div_ps(d, vt)) : y);
        a = _mm512_add_pd(a, _mm512_cvtps_pd(y));
        /* (m - x) * scale, at most HIST_BINS - 1, truncated; HIST_BINS + j % 8 where !(x >= lo) */
        const __m256 t = _mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(vm, xv), vs), top);
        const __mmask8 keep = _mm256_cmp_ps_mask(xv, vlo, _CMP_GE_OQ);
        const __m256i k = _mm256_mask_blend_epi32(keep, dump, _mm256_cvttps_epi32(t));
        _mm_storeu_si128((__m128i *)(bin + j), _mm256_cvtepi32_epi16(k));
    }
    return z + block_sum(a);
}
/* 8 ids' (1, e, e^2, e^3) in double from e (8 floats; zeros where keep is off) into 8 quads of 4 doubles, quad
 * i at o + 4 i holding id (0, 2, 4, 6, 1, 3, 5, 7)[i]. */
static inline void quads8(__m256 ef, __mmask8 keep, double *o) {
    const __m512d e = _mm512_maskz_cvtps_pd(keep, ef), e2 = _mm512_mul_pd(e, e), e3 = _mm512_mul_pd(e2, e);
    const __m512d one = _mm512_maskz_mov_pd(keep, _mm512_set1_pd(1.0));
    const __m512d ae = _mm512_unpacklo_pd(one, e), ao = _mm512_unpackhi_pd(one, e);  /* (1, e): ids 2L | 2L + 1 */
    const __m512d ce = _mm512_unpacklo_pd(e2, e3), co = _mm512_unpackhi_pd(e2, e3);
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    _mm512_store_pd(o, _mm512_permutex2var_pd(ae, lo, ce));      /* ids 0, 2 */
    _mm512_store_pd(o + 8, _mm512_permutex2var_pd(ae, hi, ce));  /* ids 4, 6 */
    _mm512_store_pd(o + 16, _mm512_permutex2var_pd(ao, lo, co)); /* ids 1, 3 */
    _mm512_store_pd(o + 24, _mm512_permutex2var_pd(ao, hi, co)); /* ids 5, 7 */
}

static inline void add_quad(double *q, const double *o) {
    _mm256_storeu_pd(q, _mm256_add_pd(_mm256_loadu_pd(q), _mm256_load_pd(o)));
}

int sample_hist_moments_avx512(const float *x, float m, float lo, float w, uint16_t *bin, double *mom) {
    const __m512 vm = _mm512_set1_ps(m), vlo = _mm512_set1_ps(lo), vs = _mm512_set1_ps(1.0f / w);
    const __m512 top = _mm512_set1_ps((float)(HIST_BINS - 1)), nw = _mm512_set1_ps(-w);
    const __m512 nhw = _mm512_set1_ps(-0.5f * w);
    const __m512i dump = _mm512_add_epi32(_mm512_set1_epi32(HIST_BINS),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7));
    _Alignas(64) double quad[4 * SAMPLE_BLOCK];
    __m512i hi = _mm512_set1_epi32(-1);
    for (int j = 0; j < SAMPLE_BLOCK; j += 16) {
        const __m512 xv = _mm512_loadu_ps(x + j);
        const __mmask16 keep = _mm512_cmp_ps_mask(xv, vlo, _CMP_GE_OQ);
        const __m512i k = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_mul_ps(_mm512_sub_ps(vm, xv), vs), top));
        hi = _mm512_mask_max_epi32(hi, keep, hi, k);
        _mm256_storeu_si256((__m256i *)(bin + j), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(keep, dump, k)));
        /* the offset from the bin's centre -(k + 1/2) w (exact: w a power of two) */
        const __m512 c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(k), nw, nhw);
        const __m512 e = _mm512_sub_ps(_mm512_sub_ps(xv, vm), c);
        quads8(_mm512_castps512_ps256(e), (__mmask8)keep, quad + 4 * j);
        quads8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)), (__mmask8)(keep >> 8),
               quad + 4 * j + 32);
    }
    /* in id order (the reference's sums); an id below lo adds zeros to its dump slot. Id g + i's quad at
     * o + 4 (0, 4, 1, 5, 2, 6, 3, 7)[i] */
    for (int g = 0; g < SAMPLE_BLOCK; g += 8) {
        const double *o = quad + 4 * g;
        const uint16_t *b = bin + g;
        add_quad(mom + 4 * b[0], o), add_quad(mom + 4 * b[1], o + 16);
        add_quad(mom + 4 * b[2], o + 4), add_quad(mom + 4 * b[3], o + 20);
        add_quad(mom + 4 * b[4], o + 8), add_quad(mom + 4 * b[5], o + 24);
        add_quad(mom + 4 * b[6], o + 12), add_quad(mom + 4 * b[7], o + 28);
    }
    return _mm512_reduce_max_epi32(hi);
}

void sample_prefix_block_avx512(const float *t, const uint16_t *bin, int kb, double norm, double *acc,
                                float *least) {
    const __m512d vn = _mm512_set1_pd(norm);
    const __m256i vkb = _mm256_set1_epi32(kb);
    __m512d a = _mm512_setzero_pd();
    __m256 l = _mm256_set1_ps(*least);
    for (int j = 0; j < SAMPLE_BLOCK; j += 8) {
        const __m256 q = _mm512_cvtpd_ps(_mm512_div_pd(_mm512_cvtps_pd(_mm256_loadu_ps(t + j)), vn));
        const __m256i bj = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(bin + j)));
        const __mmask8 in = _mm256_cmpgt_epi32_mask(vkb, bj);
        a = _mm512_add_pd(a, _mm512_maskz_cvtps_pd(in, q));
        l = _mm256_mask_min_ps(l, in & _mm256_cmp_ps_mask(q, l, _CMP_LT_OQ), q, l);
    }
    *acc += block_sum(a);
    float m[8];
    _mm256_storeu_ps(m, l);
    for (int i = 0; i < 8; i++) *least = m[i] < *least ? m[i] : *least;
}

int sample_bin_find_avx512(const uint16_t *bin, int n, uint16_t kb, int32_t *ids) {
    const __m512i key = _mm512_set1_epi16((short)kb), step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int c = 0;
    for (int i = 0; i < n; i += 32) {
        const __mmask32 q = _mm512_cmpeq_epu16_mask(_mm512_loadu_si512(bin + i), key);
        /* the matches' indices compressed in a register, then stored whole (ids has room for 16 past n) */
        if (q) {
            const __mmask16 q0 = (__mmask16)q, q1 = (__mmask16)(q >> 16);
            _mm512_storeu_si512(ids + c, _mm512_maskz_compress_epi32(q0, idx));
            c += __builtin_popcount(q0);
            _mm512_storeu_si512(ids + c, _mm512_maskz_compress_epi32(q1, _mm512_add_epi32(idx, step)));
            c += __builtin_popcount(q1);
        }
        idx = _mm512_add_epi32(idx, _mm512_add_epi32(step, step));
    }
    return c;
}
