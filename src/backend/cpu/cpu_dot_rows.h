/*
 * cpu_dot_rows.h — one weight row against several activation rows at once: the weight row is loaded
 * once and each activation row gets its own accumulator, in the same order of operations as the type's
 * vec_dot_fast, so every result is bit-identical to that single dot (a sequence's logits in a batch equal
 * its logits alone). The reference is the single dot applied row by row (cpu_dot_rows_ref).
 */
#ifndef KILN_CPU_DOT_ROWS_H
#define KILN_CPU_DOT_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "formats/formats.h"

/* s[j * s_stride] = dot(x, y + j * y_stride) for j < ny (n values; x a weight row, y converted rows).
 * yd: for Q8_0 activations, the block scales of row j as floats at yd + j * (n / 32) (read by the fast
 * kernel; the reference ignores it). */
typedef void (*cpu_dot_rows_fn)(kiln_vec_dot_fn dot, int n, const void *x, const uint8_t *y, size_t y_stride, int ny,
                                const float *yd, float *s, size_t s_stride);

/* The reference: dot row by row. */
void cpu_dot_rows_ref(kiln_vec_dot_fn dot, int n, const void *x, const uint8_t *y, size_t y_stride, int ny,
                      const float *yd, float *s, size_t s_stride);
/* Q8_0 x Q8_0, four rows at a time, bit-identical to kiln_dot_q8_0_avx2. */
void cpu_dot_rows_q8_0_avx2(kiln_vec_dot_fn dot, int n, const void *x, const uint8_t *y, size_t y_stride, int ny,
                            const float *yd, float *s, size_t s_stride);

/* The multi-row kernel that reproduces `dot` (a type's vec_dot_fast) exactly, or the reference. */
cpu_dot_rows_fn cpu_dot_rows_select(kiln_vec_dot_fn dot);

#endif
