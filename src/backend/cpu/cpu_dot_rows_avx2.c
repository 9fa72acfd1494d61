/*
 * cpu_dot_rows_avx2.c — Q8_0 weight row x four (or two) Q8_0 activation rows per pass. Per activation row
 * the operations are those of kiln_dot_q8_0_avx2 in the same order (one accumulator, blocks in order,
 * fmadd(x.d * y.d, int block sum), then the lanes reduced), so each result is bit-identical to it; the
 * gain is one load and sign split of each weight block for four rows, and four independent chains.
 */
#include "backend/cpu/cpu_dot_rows.h"

#include "formats/blocks.h"
#include "formats/simd_avx2.h"

/* yd holds h2f(y[ib].d) (an exact conversion), so dx * yd equals the single dot's h2f(x.d) * h2f(y.d). */
#define ACC(a, yb, ydr)                                                                                    \
    a = _mm256_fmadd_ps(_mm256_set1_ps(dx * (ydr)[ib]),                                                    \
                        _mm256_cvtepi32_ps(dot_i8_i8(xq, _mm256_loadu_si256((const __m256i *)(yb)[ib].qs))), a)

AVX2 static void rows4(int nb, const block_q8_0 *x, const uint8_t *y, size_t y_stride, const float *yd, float *s,
                       size_t s_stride) {
    const block_q8_0 *y0 = (const block_q8_0 *)y, *y1 = (const block_q8_0 *)(y + y_stride),
                     *y2 = (const block_q8_0 *)(y + 2 * y_stride), *y3 = (const block_q8_0 *)(y + 3 * y_stride);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int ib = 0; ib < nb; ib++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[ib].qs);
        const float dx = h2f(x[ib].d);
        ACC(a0, y0, yd);
        ACC(a1, y1, yd + nb);
        ACC(a2, y2, yd + 2 * nb);
        ACC(a3, y3, yd + 3 * nb);
    }
    s[0] = hsum_ps(a0);
    s[s_stride] = hsum_ps(a1);
    s[2 * s_stride] = hsum_ps(a2);
    s[3 * s_stride] = hsum_ps(a3);
}

AVX2 static void rows2(int nb, const block_q8_0 *x, const uint8_t *y, size_t y_stride, const float *yd, float *s,
                       size_t s_stride) {
    const block_q8_0 *y0 = (const block_q8_0 *)y, *y1 = (const block_q8_0 *)(y + y_stride);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int ib = 0; ib < nb; ib++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[ib].qs);
        const float dx = h2f(x[ib].d);
        ACC(a0, y0, yd);
        ACC(a1, y1, yd + nb);
    }
    s[0] = hsum_ps(a0);
    s[s_stride] = hsum_ps(a1);
}
#undef ACC

void cpu_dot_rows_q8_0_avx2(kiln_vec_dot_fn dot, int n, const void *x, const uint8_t *y, size_t y_stride, int ny,
                            const float *yd, float *s, size_t s_stride) {
    const int nb = n / QK8_0;
    int j = 0;
    for (; j + 4 <= ny; j += 4)
        rows4(nb, x, y + (size_t)j * y_stride, y_stride, yd + (size_t)j * nb, s + (size_t)j * s_stride, s_stride);
    for (; j + 2 <= ny; j += 2)
        rows2(nb, x, y + (size_t)j * y_stride, y_stride, yd + (size_t)j * nb, s + (size_t)j * s_stride, s_stride);
    cpu_dot_rows_ref(dot, n, x, y + (size_t)j * y_stride, y_stride, ny - j, NULL, s + (size_t)j * s_stride, s_stride);
}
