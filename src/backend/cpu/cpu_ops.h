/*
 * cpu_ops.h — the element-wise and per-row kernels of the CPU forward pass (scalar C, and an exact AVX2
 * argmax in cpu_ops_avx2.c; they are a small fraction of the time next to the matrix products in cpu_matmul.c).
 */
#ifndef KILN_CPU_OPS_H
#define KILN_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

/* y (n,) = x * 1/sqrt(mean(x^2) + eps) * w   (sum of squares in double, like ggml) */
void cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* Rotates one head (head_dim values) in place for position pos, using the tables cos/sin of that
 * position (n_rot/2 entries). neox: pairs (i, i + n_rot/2); llama: adjacent pairs (2i, 2i+1). */
void cpu_rope_head(float *x, const float *cos_t, const float *sin_t, int n_rot, bool neox);

/* Fills cos/sin tables (n_ctx, n_rot/2) the way ggml's rope computes theta (no YaRN ramp, attention factor 1):
 * theta_p,i = freq_scale * ((p * base^(-2i/n_rot)) / freq_factors[i]), the power applied by repeated float
 * multiplication. freq_factors may be NULL (all 1); freq_scale is 1 / the linear scaling factor. */
void cpu_rope_tables(float *cos_t, float *sin_t, int n_ctx, int n_rot, float base, float freq_scale,
                     const float *freq_factors);

/* In-place softmax over n values. */
void cpu_softmax(float *x, int n);

/* g (n,) = silu(g) * u */
void cpu_swiglu(float *g, const float *u, int n);

/* y += x  (n,) */
void cpu_add(float *y, const float *x, int n);

/* Index of the largest value (lowest index on ties; NaNs never win, except a NaN at index 0). The reference. */
int32_t cpu_argmax(const float *x, int n);
/* The same answer for every input, two AVX2 passes (x86 with AVX2 only: cpu_ops_avx2.c). */
int32_t cpu_argmax_avx2(const float *x, int n);

typedef int32_t (*cpu_argmax_fn)(const float *x, int n);
/* The fastest exact argmax for this CPU (the reference with KILN_NO_SIMD=1). */
cpu_argmax_fn cpu_argmax_select(void);

#endif
