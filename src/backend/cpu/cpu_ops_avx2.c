/* cpu_ops_avx2.c — AVX2 variants of the per-row ops of cpu_ops.h that are exact (the same result as the scalar
 * reference for every input). Compiled with -mavx2 -mfma -mf16c on x86 only; chosen by cpu_ops_select. */
#include <immintrin.h>

#include "backend/cpu/cpu_ops.h"

/* The reference's answer is the first index holding the largest non-NaN value (a NaN never wins a strict
 * comparison), or 0 when x[0] is NaN. Pass 1: the largest value (vmaxps returns its second operand, the running
 * maximum, when the loaded value is NaN); pass 2: the first index equal to it (+0 and -0 compare equal, as the
 * reference keeps the first of them). */
int32_t cpu_argmax_avx2(const float *x, int n) {
    if (n < 16 || x[0] != x[0]) return cpu_argmax(x, n);
    __m256 m = _mm256_set1_ps(x[0]);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float lanes[8], best = x[0];
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) best = lanes[l] > best ? lanes[l] : best;
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    const __m256 vb = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vb, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0; /* not reached: best is one of the values */
}
