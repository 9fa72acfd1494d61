/*
 * cpu_attn.h — the two inner loops of attention over an F16 KV cache, with a scalar reference and an
 * AVX2/F16C (x86) or NEON (aarch64) variant chosen at session open:
 *   dot:  s = q (n,) . k (n,) F16
 *   axpy: o (n,) += a * v (n,) F16
 */
#ifndef KILN_CPU_ATTN_H
#define KILN_CPU_ATTN_H

#include <stdint.h>

typedef struct cpu_attn_kernels {
    float (*dot)(const float *q, const uint16_t *k, int n);
    void (*axpy)(float *o, float a, const uint16_t *v, int n);
} cpu_attn_kernels;

float cpu_attn_dot_ref(const float *q, const uint16_t *k, int n);
void cpu_attn_axpy_ref(float *o, float a, const uint16_t *v, int n);
float cpu_attn_dot_avx2(const float *q, const uint16_t *k, int n);
void cpu_attn_axpy_avx2(float *o, float a, const uint16_t *v, int n);
float cpu_attn_dot_neon(const float *q, const uint16_t *k, int n);
void cpu_attn_axpy_neon(float *o, float a, const uint16_t *v, int n);

/* The best kernels for this CPU (the reference with KILN_NO_SIMD=1). */
cpu_attn_kernels cpu_attn_select(void);

#endif
