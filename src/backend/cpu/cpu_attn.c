/* cpu_attn.c — scalar reference of the attention inner loops and the run-time choice of variant. */
#include "backend/cpu/cpu_attn.h"

#include "formats/formats.h"

float cpu_attn_dot_ref(const float *q, const uint16_t *k, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += q[i] * kiln_f16_to_f32(k[i]);
    return s;
}

void cpu_attn_axpy_ref(float *o, float a, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) o[i] += a * kiln_f16_to_f32(v[i]);
}

cpu_attn_kernels cpu_attn_select(void) {
    cpu_attn_kernels k = {cpu_attn_dot_ref, cpu_attn_axpy_ref};
#if KILN_X86 /* cpu_attn_avx2.c exists only there */
    if (kiln_cpu_level() >= KILN_CPU_AVX2) {
        k.dot = cpu_attn_dot_avx2;
        k.axpy = cpu_attn_axpy_avx2;
    }
#elif KILN_NEON /* cpu_attn_neon.c: aarch64 only */
    if (kiln_cpu_level() == KILN_CPU_NEON) {
        k.dot = cpu_attn_dot_neon;
        k.axpy = cpu_attn_axpy_neon;
    }
#endif
    return k;
}
