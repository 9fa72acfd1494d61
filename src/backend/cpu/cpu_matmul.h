/*
 * cpu_matmul.h — out (B, rows) = x (B, in) @ W^T for a weight of any supported type: the activation rows
 * are converted once to the weight's vec_dot type (by all threads), then the thread pool splits the weight
 * rows; one row is one vec_dot_fast call, 2..8 rows (batched decode) the small-batch product and more rows
 * the tiled block product (cpu_gemm.h), whose every (row, input) result equals that call's bit for bit. A weight
 * interleaved by the CPU backend (W->interleave, cpu_repack.h) runs its one kernel for every row count instead,
 * each result cpu_dot_q8_0_r16's bit for bit.
 */
#ifndef KILN_CPU_MATMUL_H
#define KILN_CPU_MATMUL_H

#include <stddef.h>

#include "base/pool.h"
#include "model/model.h"

/* Bytes of scratch needed to hold B activation rows of length n converted for weight type `type`. */
size_t cpu_matmul_scratch_bytes(uint32_t type, int n, int B);

/* out[b*rows + r] = dot(W row r, x[b]) for b < B, r < rows = W->ne[1]. scratch: cpu_matmul_scratch_bytes. */
void cpu_matmul(kiln_pool *pool, const kiln_weight *W, const float *x, int B, float *out, void *scratch);

/* The same for nw <= CPU_MATMUL_MAX_W weights of one input x (q, k and v; gate and up): out[i] of weight W[i],
 * each result equal to cpu_matmul's. Weights of one type and input width share the conversion of x and one pool
 * run over all their rows (one wait instead of nw); others run one by one. */
#define CPU_MATMUL_MAX_W 3
void cpu_matmul_n(kiln_pool *pool, int nw, const kiln_weight *const *W, const float *x, int B, float *const *out,
                  void *scratch);

#endif
