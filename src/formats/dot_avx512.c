/*
 * dot_avx512.c — AVX-512 VNNI variants of the Q8_0, Q4_0 and Q4_K row dots (compiled with the AVX-512 flags:
 * call only when kiln_cpu_has_avx512vnni(); register.c chooses them at the avx512 level). The integer block
 * sums use vpdpbusd / vpdpwssd (exact, as the AVX2 multiply-adds are); the float steps are those of the AVX2
 * dots in dot_avx2.c in the same order (one 8-lane accumulator, blocks in order, the same scale products,
 * the same reduction), so every result is bit-identical to the AVX2 one — and a model's logits do not
 * depend on which of the two levels runs.
 */
#include "formats/blocks.h"
#include "formats/simd_avx512.h"

void kiln_dot_q8_0_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK8_0; ib++) {
        const __m256i p = vnni_i8_i8(_mm256_loadu_si256((const __m256i *)x[ib].qs), _mm256_loadu_si256((const __m256i *)y[ib].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d)), _mm256_cvtepi32_ps(p), acc);
    }
    *s = hsum_ps(acc);
}

void kiln_dot_q4_0_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK8_0; ib++) {
        const __m256i p = vnni_q4_0(unpack_nibbles16(x[ib].qs), _mm256_loadu_si256((const __m256i *)y[ib].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d)), _mm256_cvtepi32_ps(p), acc);
    }
    *s = hsum_ps(acc);
}

void kiln_dot_q4_K_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    for (int i = 0; i < n / QK_K; i++) k4_dot_block(&x[i], &y[i], &acc, &accm);
    *s = hsum_ps(_mm256_sub_ps(acc, accm));
}
