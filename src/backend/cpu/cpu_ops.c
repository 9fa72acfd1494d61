/* cpu_ops.c — RMSNorm, RoPE, softmax, SwiGLU, residual add and argmax for the CPU backend (the scalar references,
 * and the run-time choice of the AVX2 variants of cpu_ops_avx2.c). */
#include "backend/cpu/cpu_ops.h"

#include <math.h>

#include "base/env.h"
#include "formats/formats.h"

void cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    /* four partial sums: one chain of n dependent double adds was 1.5% of a 4-sequence decode step; the double
     * sum of float squares rounds to the same float mean in either order but where it lies within ~1e-16 of a
     * float boundary */
    double part[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) part[k] += (double)(x[i + k] * x[i + k]);
    double sum = (part[0] + part[1]) + (part[2] + part[3]);
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

void cpu_rope_tables(float *cos_t, float *sin_t, int n_ctx, int n_rot, float base, float freq_scale,
                     const float *freq_factors) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    for (int p = 0; p < n_ctx; p++) {
        float theta = (float)p;
        for (int i = 0; i < half; i++) {
            const float ff = freq_factors ? freq_factors[i] : 1.0f;
            const float t = freq_scale * (theta / ff);
            cos_t[(int64_t)p * half + i] = cosf(t);
            sin_t[(int64_t)p * half + i] = sinf(t);
            theta *= theta_scale;
        }
    }
}

void cpu_rope_head(float *x, const float *cos_t, const float *sin_t, int n_rot, bool neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cos_t[i] - x1 * sin_t[i];
        x[b] = x0 * sin_t[i] + x1 * cos_t[i];
    }
}

void cpu_softmax_ref(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void cpu_swiglu_ref(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* kiln_cpu_level() is decided once per process (KILN_NO_SIMD, KILN_CPU_LEVEL), so every call takes one variant. */
void cpu_softmax(float *x, int n) {
#if KILN_X86 /* cpu_ops_avx2.c exists only there */
    if (kiln_cpu_level() >= KILN_CPU_AVX2) {
        cpu_softmax_avx2(x, n);
        return;
    }
#endif
    cpu_softmax_ref(x, n);
}

void cpu_swiglu(float *g, const float *u, int n) {
#if KILN_X86
    if (kiln_cpu_level() >= KILN_CPU_AVX2) {
        cpu_swiglu_avx2(g, u, n);
        return;
    }
#endif
    cpu_swiglu_ref(g, u, n);
}

void cpu_add(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

int32_t cpu_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

cpu_argmax_fn cpu_argmax_select(void) {
#if KILN_X86 /* cpu_ops_avx2.c exists only there */
    if (!kiln_env_no_simd() && kiln_cpu_has_avx2()) return cpu_argmax_avx2;
#endif
    return cpu_argmax;
}
