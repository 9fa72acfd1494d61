/* cpu_attn.c — scalar reference of the attention inner loops and the run-time choice of variant. */
#include "backend/cpu/cpu_attn.h"

#include <string.h>

#include "formats/formats.h"

float cpu_attn_dot_ref(const float *q, const uint16_t *k, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += q[i] * kiln_f16_to_f32(k[i]);
    return s;
}

void cpu_attn_axpy_ref(float *o, float a, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) o[i] += a * kiln_f16_to_f32(v[i]);
}

void cpu_attn_scores_ref(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale) {
    for (int i = 0; i < n_keys; i++) sc[i] = cpu_attn_dot_ref(q, k + (size_t)i * stride, n) * scale;
}

void cpu_attn_mix_ref(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n) {
    memset(o, 0, (size_t)n * sizeof *o);
    for (int i = 0; i < n_keys; i++) cpu_attn_axpy_ref(o, w[i], v + (size_t)i * stride, n);
}

void cpu_attn_round_f16_ref(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = kiln_f16_to_f32(kiln_f32_to_f16(x[i]));
}

cpu_attn_kernels cpu_attn_select(void) {
    cpu_attn_kernels k = {cpu_attn_dot_ref, cpu_attn_axpy_ref, cpu_attn_scores_ref, cpu_attn_mix_ref, cpu_attn_round_f16_ref};
#if KILN_X86 /* cpu_attn_avx2.c exists only there */
    if (kiln_cpu_level() >= KILN_CPU_AVX2) {
        k.dot = cpu_attn_dot_avx2;
        k.axpy = cpu_attn_axpy_avx2;
        k.scores = cpu_attn_scores_avx2;
        k.mix = cpu_attn_mix_avx2;
        k.round_f16 = cpu_attn_round_f16_avx2;
    }
#elif KILN_NEON /* cpu_attn_neon.c: aarch64 only */
    if (kiln_cpu_level() == KILN_CPU_NEON) {
        k.dot = cpu_attn_dot_neon;
        k.axpy = cpu_attn_axpy_neon;
        k.scores = cpu_attn_scores_neon;
        k.mix = cpu_attn_mix_neon;
    }
#endif
    return k;
}
