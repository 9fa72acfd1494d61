/*
 * cpu_repack.h — Q8_0 and Q4_K weight rows interleaved at open for the AVX-512 VNNI kernels ("r16"): one 512-bit
 * vpdpbusd then serves 16 weight rows against 4 bytes of one activation row (broadcast), so every lane is one
 * weight row and no horizontal sum is left, where the row-major kernels need a vpdpbusd, a conversion and an
 * FMA per weight row, activation row and block (bench/RESULTS.md: "Q8_0 rows interleaved by 16", "Q4_K rows
 * interleaved by 16").
 *
 * A repacked matrix (rows a multiple of 16) is a run of groups of 16 rows, group g at g * 16 * row_bytes (the
 * file's row size, so the copy is as large as the original), each one linear stream:
 *   Q8_0 (n a multiple of 64): 1,088-byte pairs of blocks (17 cache lines); pair p holds blocks 2p and 2p + 1 as
 *     d   (2, 16) f16: each block's scale of each row
 *     qs  (2, 8, 16, 4) bytes: block, 4-byte step k, row i: the row's values 4k..4k+3 of the block plus 128
 *   Q4_K: 2,304-byte blocks (36 cache lines), each
 *     d, dmin  (2, 16) f16
 *     u        (3, 16) u32: the row's 12 packed bytes of 6-bit scales and mins as three words
 *     qs       (4, 8, 16, 4) bytes: 64-value run j, 4-byte step k, row i: the row's qs[32j + 4k..32j + 4k + 3]
 *              (low nibbles: values 64j + 4k.., high: 64j + 32 + 4k..)
 * The float order of every (weight row, activation row) result (the scalar references cpu_dot_*_r16 and every
 * r16 kernel alike, so a row's result is the same in a batch of any size):
 *   Q8_0: acc = 0; for each block: acc = fmaf(h2f(w.d) * h2f(y.d), (float)(exact integer block sum), acc)
 *   Q4_K: acc = accm = 0; for each block: acc = fmaf(h2f(w.d) * y.d, (float)(sum over the 8 runs of 32 of
 *         scale * integer sum), acc), accm = fmaf(h2f(w.dmin) * y.d, (float)(sum of min * the run's
 *         activation sum), accm); the result acc - accm
 */
#ifndef KILN_CPU_REPACK_H
#define KILN_CPU_REPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_gemm.h"
#include "base/pool.h"
#include "model/block.h"

#define CPU_R16 16
/* bytes of a pair of blocks of a group, and where block ib's scales and values start within the group */
#define CPU_R16_PAIR (2 * CPU_R16 * 34)
static inline size_t cpu_r16_d(int ib) { return (size_t)(ib / 2) * CPU_R16_PAIR + (size_t)(ib % 2) * CPU_R16 * 2; }
static inline size_t cpu_r16_qs(int ib) { return (size_t)(ib / 2) * CPU_R16_PAIR + 4 * CPU_R16 + (size_t)(ib % 2) * CPU_R16 * 32; }

/* Q4_K: where block ib's parts start within a group */
#define CPU_R16_K4_BLOCK (CPU_R16 * 144)
#define CPU_R16_K4_U (4 * CPU_R16)
#define CPU_R16_K4_QS (16 * CPU_R16)

/* Whether w can be repacked: Q8_0 (rows of a multiple of 64 values) or Q4_K, one matrix, rows a multiple of 16. */
bool cpu_repack_fits(const kiln_weight *w);

/* Groups [g0, g1) of w (row-major, the file's layout) into dst, the repacked matrix's base. */
void cpu_repack_r16(const kiln_weight *w, uint8_t *dst, int g0, int g1);

/* One (row-major weight row, activation row of the type's vec_dot_type) result in the r16 float order: the
 * references. */
float cpu_dot_q8_0_r16(int n, const void *w_row, const void *y_row);
float cpu_dot_q4_K_r16(int n, const void *w_row, const void *y_row);

/* The activation sums the r16 kernels read (a->ys), for one converted row y of n values into ys: Q8_0 -128 times
 * each block's sum (n / 32 words); Q4_K per block the 8 runs' sums of 32 values as int16 pairs (runs 0 and 2, 1
 * and 3, 4 and 6, 5 and 7: 4 words, n / 64 in all). */
void cpu_r16_act_sums(uint32_t type, const void *y, int n, int32_t *ys);

/* cpu_gemm_fn over a repacked matrix (a->w its base, a->w_stride the file's row bytes; r0, r1 multiples of 16):
 * the scalar references, and the AVX-512 VNNI kernels (cpu_gemm_avx512.c; they read a->ys, and Q8_0 a->yd). */
void cpu_gemm_q8_0_r16_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_q4_K_r16_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_q8_0_r16_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_q4_K_r16_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* The kernel for an interleaved matrix of `type` on this CPU (the AVX-512 one at the avx512 level). */
cpu_gemm_fn cpu_gemm_r16_select(uint32_t type);

/* The repacked copies of a backend's weights: one buffer, one kiln_weight per matrix. */
typedef struct cpu_repacked {
    uint8_t *buf;
    kiln_weight *w;
    int n;
} cpu_repacked;

/* Repacks every matrix of desc that fits (the blocks' dense weights and the output matrix; not the token
 * embedding, which stays the file's rows for its lookups even where the output matrix shares it) on the pool and
 * points desc at the copies, when the CPU runs the r16 kernels (the avx512 level); else changes nothing. Fails
 * (KILN_ERR_NOMEM) with desc unchanged. */
kiln_status cpu_repack_open(kiln_pool *pool, kiln_blocks *desc, cpu_repacked *out);
void cpu_repack_close(cpu_repacked *r);

#endif
