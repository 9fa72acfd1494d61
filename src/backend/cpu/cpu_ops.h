/*
 * cpu_ops.h — the element-wise and per-row kernels of the CPU forward pass (scalar C; in cpu_ops_avx2.c an exact
 * AVX2 argmax, and AVX2 softmax and SwiGLU over a vector exp within 2 ulp of expf; they are a small fraction of the
 * time next to the matrix products in cpu_matmul.c).
 */
#ifndef KILN_CPU_OPS_H
#define KILN_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

/* y (n,) = x * 1/sqrt(mean(x^2) + eps) * w   (sum of squares in double, like ggml, in four partial sums) */
void cpu_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* Rotates one head (head_dim values) in place for position pos, using the tables cos/sin of that
 * position (n_rot/2 entries). neox: pairs (i, i + n_rot/2); llama: adjacent pairs (2i, 2i+1). */
void cpu_rope_head(float *x, const float *cos_t, const float *sin_t, int n_rot, bool neox);

/* Fills cos/sin tables (n_ctx, n_rot/2) the way ggml's rope computes theta (no YaRN ramp, attention factor 1):
 * theta_p,i = freq_scale * ((p * base^(-2i/n_rot)) / freq_factors[i]), the power applied by repeated float
 * multiplication. freq_factors may be NULL (all 1); freq_scale is 1 / the linear scaling factor. */
void cpu_rope_tables(float *cos_t, float *sin_t, int n_ctx, int n_rot, float base, float freq_scale,
                     const float *freq_factors);

/* In-place softmax over n values: x_i = e^(x_i - max) / sum (the sum in double). Any NaN or +inf in x, or every
 * x_i = -inf, makes every value NaN. The fastest variant for this CPU (cpu_softmax_ref with KILN_NO_SIMD=1 or
 * KILN_CPU_LEVEL=scalar), the same one for every call of the process, so a row's result never depends on the
 * batch it is in. */
void cpu_softmax(float *x, int n);
/* The reference: expf, the sum in order. */
void cpu_softmax_ref(float *x, int n);
/* The same formula with cpu_exp_avx2's exp (x86 with AVX2/FMA only). */
void cpu_softmax_avx2(float *x, int n);

/* g (n,) = silu(g) * u = g / (1 + e^-g) * u: the fastest variant for this CPU, chosen as cpu_softmax's. Each
 * element's value depends only on g_i and u_i (not on n or its position), so any split of a row gives the same. */
void cpu_swiglu(float *g, const float *u, int n);
/* The reference: expf. */
void cpu_swiglu_ref(float *g, const float *u, int n);
/* The same formula with cpu_exp_avx2's exp (x86 with AVX2/FMA only). */
void cpu_swiglu_avx2(float *g, const float *u, int n);

/* y (n,) = e^x elementwise, within 2 ulp of expf for every float (x86 with AVX2/FMA only): 0 below -104 (and
 * for -inf), +inf above 88.73 (and for +inf), NaN for NaN, subnormal results rounded once. The exp of
 * cpu_softmax_avx2 and cpu_swiglu_avx2; y may be x. */
void cpu_exp_avx2(float *y, const float *x, int n);

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
