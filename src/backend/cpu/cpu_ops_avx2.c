/* cpu_ops_avx2.c — AVX2 variants of the per-row ops of cpu_ops.h: the argmax, exact (the same result as the scalar
 * reference for every input); a vector exp within 2 ulp of expf, and the softmax and SwiGLU over it. Compiled with
 * -mavx2 -mfma -mf16c on x86 only; chosen by cpu_argmax_select, cpu_softmax and cpu_swiglu. */
#include <immintrin.h>

#include "backend/cpu/cpu_ops.h"

/* The largest of x[0..n) as the reference finds it (a NaN never replaces the running maximum, which starts at
 * x[0]; vmaxps returns its second operand, the running maximum, for a NaN load); +0/-0 may differ, which the
 * subtraction that follows does not see. */
static float row_max(const float *x, int n) {
    __m256 m = _mm256_set1_ps(x[0]);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float lanes[8], best = x[0];
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) best = lanes[l] > best ? lanes[l] : best;
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    return best;
}

/* The reference's answer is the first index holding the largest non-NaN value (a NaN never wins a strict
 * comparison), or 0 when x[0] is NaN. Pass 1: the largest value (row_max); pass 2: the first index equal to it
 * (+0 and -0 compare equal, as the reference keeps the first of them). */
int32_t cpu_argmax_avx2(const float *x, int n) {
    if (n < 16 || x[0] != x[0]) return cpu_argmax(x, n);
    const float best = row_max(x, n);
    const __m256 vb = _mm256_set1_ps(best);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vb, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0; /* not reached: best is one of the values */
}

/* e^x for 8 floats. x is clamped to [-104, 89] (a NaN passes: vminps/vmaxps return their second operand, x, for
 * it); n = round(x / ln 2); r = x - n ln 2 in two FMA steps (Cody-Waite); e^r by SLEEF's expf_u10 polynomial on
 * |r| <= ln 2 / 2; then times 2^n as 2^(n/2) * 2^(n - n/2), both normal for n in [-150, 128], so a subnormal
 * result is rounded once and e^88.7 does not overflow on the way. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.442695040888963f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(0.000198527617612853646278381f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.00139304355252534151077271f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.00833336077630519866943359f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.0416664853692054748535156f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166666671633720397949219f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r));
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* The lanes below `left` set (all lanes for left >= 8): the mask of a row's last, partial group of 8. */
static inline __m256i lanes_below(int left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The 8 floats at p, or the `left` < 8 of a row's end (the other lanes 0). */
static inline __m256 load8(const float *p, int left) {
    return left >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(left));
}

/* v to the 8 floats at p, or to just the `left` < 8 of a row's end (masked stores are slow on AMD: only there). */
static inline void store8(float *p, __m256 v, int left) {
    if (left >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, lanes_below(left), v);
}

void cpu_exp_avx2(float *y, const float *x, int n) {
    for (int i = 0; i < n; i += 8) store8(y + i, exp8(load8(x + i, n - i)), n - i);
}

/* x_i = e^(x_i - max) with the sum in double (8 lanes, then added up), then x_i *= 1/sum; a partial last group's
 * unused lanes kept out of the sum. */
void cpu_softmax_avx2(float *x, int n) {
    const __m256 vmax = _mm256_set1_ps(row_max(x, n));
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    for (int i = 0; i < n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(load8(x + i, n - i), vmax));
        if (n - i < 8) e = _mm256_and_ps(e, _mm256_castsi256_ps(lanes_below(n - i)));
        store8(x + i, e, n - i);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double part[4];
    _mm256_storeu_pd(part, _mm256_add_pd(lo, hi));
    const __m256 inv = _mm256_set1_ps((float)(1.0 / ((part[0] + part[1]) + (part[2] + part[3]))));
    for (int i = 0; i < n; i += 8) store8(x + i, _mm256_mul_ps(load8(x + i, n - i), inv), n - i);
}

/* The reference's operations per element (1 + e^-g, a division, a product), every group of 8 alike. */
void cpu_swiglu_avx2(float *g, const float *u, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 8) {
        const __m256 gv = load8(g + i, n - i);
        const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_xor_ps(gv, sign))));
        store8(g + i, _mm256_mul_ps(silu, load8(u + i, n - i)), n - i);
    }
}
