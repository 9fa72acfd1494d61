/*
 * cpu_attn.h — the inner loops of attention over an F16 KV cache, with a scalar reference and an
 * AVX2/F16C (x86) or NEON (aarch64) variant chosen at session open:
 *   dot:    s = q (n,) . k (n,) F16
 *   axpy:   o (n,) += a * v (n,) F16
 *   scores: sc[i] = dot(q, k_i) * scale for the keys k_i = k + i * stride, i < n_keys
 *   mix:    o (n,) = 0, then axpy(o, w[i], v_i) for the values v_i = v + i * stride in key order
 *   round_f16: x (n,) rounded to F16 and back in place, exactly kiln_f16_to_f32(kiln_f32_to_f16(x)) (NaNs too)
 * scores and mix give exactly what their loops of dot and axpy give (the same operations per key and per
 * element, in the same order); the AVX2 ones run several keys' chains at once and keep o in registers.
 */
#ifndef KILN_CPU_ATTN_H
#define KILN_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

typedef struct cpu_attn_kernels {
    float (*dot)(const float *q, const uint16_t *k, int n);
    void (*axpy)(float *o, float a, const uint16_t *v, int n);
    void (*scores)(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale);
    void (*mix)(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n);
    void (*round_f16)(float *x, int n);
} cpu_attn_kernels;

float cpu_attn_dot_ref(const float *q, const uint16_t *k, int n);
void cpu_attn_axpy_ref(float *o, float a, const uint16_t *v, int n);
float cpu_attn_dot_avx2(const float *q, const uint16_t *k, int n);
void cpu_attn_axpy_avx2(float *o, float a, const uint16_t *v, int n);
float cpu_attn_dot_neon(const float *q, const uint16_t *k, int n);
void cpu_attn_axpy_neon(float *o, float a, const uint16_t *v, int n);
void cpu_attn_scores_ref(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale);
void cpu_attn_mix_ref(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n);
void cpu_attn_round_f16_ref(float *x, int n);
void cpu_attn_round_f16_avx2(float *x, int n);
void cpu_attn_scores_avx2(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale);
void cpu_attn_mix_avx2(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n);
void cpu_attn_scores_neon(float *sc, const float *q, const uint16_t *k, size_t stride, int n_keys, int n, float scale);
void cpu_attn_mix_neon(float *o, const float *w, const uint16_t *v, size_t stride, int n_keys, int n);

/* The best kernels for this CPU (the reference with KILN_NO_SIMD=1). */
cpu_attn_kernels cpu_attn_select(void);

#endif
