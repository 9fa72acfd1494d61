/* cpu_attn_neon.c — NEON attention inner loops over the F16 KV cache (4 dims per step, F16 widened exactly, fused
 * multiply-adds). Compiled only for aarch64 targets; selected by cpu_attn_select there. */
#include "backend/cpu/cpu_attn.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#include <string.h>

#include "formats/formats.h"

static inline float32x4_t load_f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

float cpu_attn_dot_neon(const float *q, const uint16_t *k, int n) {
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vfmaq_f32(a0, vld1q_f32(q + i), load_f16x4(k + i));
        a1 = vfmaq_f32(a1, vld1q_f32(q + i + 4), load_f16x4(k + i + 4));
    }
    for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(q + i), load_f16x4(k + i));
    float r = vaddvq_f32(vaddq_f32(a0, a1));
    for (; i < n; i++) r += q[i] * kiln_f16_to_f32(k[i]);
    return r;
}

void cpu_attn_axpy_neon(float *o, float a, const uint16_t *v, int n) {
    const float32x4_t va = vdupq_n_f32(a);
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(o + i, vfmaq_f32(vld1q_f32(o + i), va, load_f16x4(v + i)));
    for (; i < n; i++) o[i] += a * kiln_f16_to_f32(v[i]);
}

/* The loops of the per-key kernels (cpu_attn.h). */
void cpu_attn_scores_neon(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale) {
    for (int i = 0; i < n_keys; i++) sc[i] = cpu_attn_dot_neon(q, k + (size_t)i * stride, n) * scale;
}

void cpu_attn_mix_neon(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n) {
    memset(o, 0, (size_t)n * sizeof *o);
    for (int i = 0; i < n_keys; i++) cpu_attn_axpy_neon(o, w[i], v + (size_t)i * stride, n);
}
#endif
