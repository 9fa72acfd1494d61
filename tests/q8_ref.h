/* q8_ref.h — the scalar reference of the CUDA decode kernels' 8-bit inputs: a weight row of a block-quantized
 * type dotted with an input quantized to 8-bit blocks of 32 (d rounded to half, levels round(x / d)), in
 * double, with the minimum term of Q4_1 / Q5_1 taken from the activation block's stored d * (sum of levels),
 * as kiln's CPU dot products and the kernels take it. */
#ifndef KILN_TESTS_Q8_REF_H
#define KILN_TESTS_Q8_REF_H

#include <stdbool.h>
#include <stdint.h>

/* The types whose CUDA decode matvec and per-row MoE gate/up take 8-bit inputs (ck_q8_input in
 * backend/cuda/cuda_kernels.cuh). */
bool test_q8_input(uint32_t type);

/* The expert types whose CUDA per-row MoE down kernel takes h as 8-bit levels (moe_q8_hidden in
 * backend/cuda/cuda_moe.cu): the block-quantized ones. */
bool test_q8_hidden(uint32_t type);

/* Row w_row (n values of `type`, n a multiple of 32; deq_row: its exact values) times x quantized to 8-bit
 * blocks. */
double test_q8_ref_dot(uint32_t type, const void *w_row, const float *deq_row, const float *x, int n);

#endif
