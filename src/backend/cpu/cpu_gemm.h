/*
 * cpu_gemm.h — a block of weight rows x a block of activation rows at once (the prefill product): the
 * fast kernels work on register tiles of several weight rows x several activation rows, so one activation
 * load serves several weight rows and one weight load (and unpacking) several activation rows. Each
 * (weight row, activation row) pair keeps its own accumulators and the order of operations of the type's
 * vec_dot_fast, so every result is bit-identical to that single dot (a sequence's logits in a batch equal
 * its logits alone). The reference is the single dot applied pair by pair (cpu_gemm_ref).
 */
#ifndef KILN_CPU_GEMM_H
#define KILN_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/formats.h"

/* The operands: weight rows of w_stride bytes, activation rows converted to the weight's vec_dot_type of
 * y_stride bytes, results out[b * out_stride + r] for weight row r and activation row b. */
typedef struct cpu_gemm_args {
    kiln_vec_dot_fn dot; /* the type's vec_dot_fast: what every result must equal bit for bit */
    int n;               /* values per row */
    const uint8_t *w;
    size_t w_stride;
    const uint8_t *y;
    size_t y_stride;
    const float *yd; /* Q8_0 activations: the block scales of row b as floats at yd + b * (n / 32), else NULL */
    const uint8_t *yu; /* Q8_0 activations for the VNNI rows kernels (cpu_gemm_rows_flips): row b's bytes plus 128
                        * at yu + b * n; Q8_K ones for the VNNI single-row Q4_K kernel (cpu_gemm_row1_reads_yu): row
                        * b's values in k4 order (cpu_gemm_k4_order_row) at yu + b * n; else NULL */
    const int32_t *ys; /* Q8_0 activations for the interleaved kernels (cpu_repack.h): -128 times the sum of each
                        * block's values, row b's at ys + b * (n / 32); else NULL */
    float *out;
    size_t out_stride;
} cpu_gemm_args;

/* The plain dot of one activation row against weight rows in turn (types without a rows kernel: the K-quants,
 * F16, ...) prefetches the row CPU_PREFETCH_ROWS ahead, every cache line of it: streamed from memory, Q4_K and
 * Q6_K dots ran 12-31% faster so than with the hardware prefetcher alone (bench/RESULTS.md). */
#define CPU_PREFETCH_ROWS 2
static inline void cpu_prefetch_row(const void *row, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)row + o);
}

/* The prefetch distance of kernels that stream two weight rows at once: 8 rows ahead within [6, 16] KiB (2
 * threads: smollm2-135m's 612-byte rows ran best at 6 KiB, llama-3.2-1b's 2,176-byte rows at 16 KiB, 4 sequences;
 * Q4_K's 1,152-byte rows at 9 KiB; bench/RESULTS.md). */
static inline size_t cpu_pair_prefetch(size_t w_stride) {
    const size_t d = 8 * w_stride;
    return d < 6144 ? 6144 : d > 16384 ? 16384 : d;
}

/* Defines NAME(a, r0, r1, b0, b1) for one activation row of Q8_K (decode) against K-quant weight rows XT: the
 * rows in two linear streams, the first half of [r0, r1) and the second, one row of each at a time with their
 * blocks interleaved (two independent chains of the single dot's block steps, each row's in its order:
 * bit-identical to DOT), each stream prefetched cpu_pair_prefetch bytes ahead; an odd last row through DOT
 * itself. (Adjacent rows as the pair ran 25-50% slower on a Zen 3 than two streams far apart: their
 * back-and-forth within a page defeats the hardware prefetcher; bench/RESULTS.md.) A row's state is NACC
 * accumulators, zero at first; STEP(x, y, acc) one block; FINAL(acc) the row's result. (ATTR: the including
 * file's ISA attribute; it provides KILN_ASSERT.) */
#define CPU_GEMM_ROW1_PAIRS(ATTR, NAME, XT, NACC, STEP, FINAL, DOT)                                                \
    ATTR void NAME(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {                                     \
        KILN_ASSERT(b1 == b0 + 1);                                                                               \
        const int nb = a->n / QK_K, half = (r1 - r0) / 2;                                                        \
        const block_q8_K *y = (const block_q8_K *)(a->y + (size_t)b0 * a->y_stride);                             \
        const size_t ahead = cpu_pair_prefetch(a->w_stride);                                                     \
        float *out = a->out + (size_t)b0 * a->out_stride;                                                        \
        for (int r = r0; r < r0 + half; r++) {                                                                   \
            const XT *x0 = (const XT *)(a->w + (size_t)r * a->w_stride);                                         \
            const XT *x1 = (const XT *)(a->w + (size_t)(r + half) * a->w_stride);                                \
            __m256 acc0[NACC], acc1[NACC];                                                                       \
            for (int k = 0; k < NACC; k++) acc0[k] = acc1[k] = _mm256_setzero_ps();                              \
            for (int ib = 0; ib < nb; ib++) {                                                                    \
                const char *p0 = (const char *)&x0[ib] + ahead, *p1 = (const char *)&x1[ib] + ahead;             \
                for (int o = 0; o < (int)sizeof(XT); o += 64)                                                    \
                    _mm_prefetch(p0 + o, _MM_HINT_T0), _mm_prefetch(p1 + o, _MM_HINT_T0);                        \
                STEP(&x0[ib], &y[ib], acc0);                                                                     \
                STEP(&x1[ib], &y[ib], acc1);                                                                     \
            }                                                                                                    \
            out[r] = FINAL(acc0);                                                                                \
            out[r + half] = FINAL(acc1);                                                                         \
        }                                                                                                        \
        if ((r1 - r0) % 2) DOT(a->n, &out[r1 - 1], a->w + (size_t)(r1 - 1) * a->w_stride, y);                    \
    }

/* Results for weight rows r0 <= r < r1 and activation rows b0 <= b < b1. */
typedef void (*cpu_gemm_fn)(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);

/* The activation rows of the VNNI tiles (cpu_gemm_avx512.c: Q8_0 / Q4_0, Q4_K). */
#define CPU_VNNI_Q8_TN 5
#define CPU_VNNI_K4_TN 6
/* The activation rows of gemm's widest tile (4 where it is not one of the above): cpu_matmul blocks the
 * activation rows in whole multiples of it, so no block ends in a narrow tile (measured: Q4_K prefill -5% on one
 * thread). */
int cpu_gemm_tile_rows(cpu_gemm_fn gemm);

/* One register tile of a fast kernel: its weight rows r.. x activation rows b.. (the sizes are the function's). */
typedef void (*cpu_gemm_tile_fn)(const cpu_gemm_args *a, int r, int b);
/* Walks [r0, r1) x [b0, b1) in tiles of TM x TN (smaller at the edges), weight tile outer so its rows stay in
 * L1 while the activation rows (the caller's cache block) stream from L2; tab[(tm - 1) * TN + tn - 1] is the
 * tile of tm x tn. */
void cpu_gemm_walk(const cpu_gemm_args *a, int r0, int r1, int b0, int b1, int TM, int TN, const cpu_gemm_tile_fn *tab);

/* The small-batch kernels' unit: weight rows [r0, r1) against activation rows b.. (as many as the function's
 * own count, up to CPU_ROW_TN); cpu_gemm_walk_rows runs [b0, b1) in chunks of CPU_ROW_TN through tab[count - 1]. */
#define CPU_ROW_TN 8
typedef void (*cpu_gemm_rows_tile_fn)(const cpu_gemm_args *a, int r0, int r1, int b);
void cpu_gemm_walk_rows(const cpu_gemm_args *a, int r0, int r1, int b0, int b1, const cpu_gemm_rows_tile_fn *tab);
/* Defines cpu_gemm_rows_q8_0_<sfx> and cpu_gemm_rows_q4_0_<sfx> over the including file's
 * legacy_rows(a, r0, r1, b, tn, q4) for tn = 1..CPU_ROW_TN (ATTR: the file's ISA attribute, or nothing). */
#define CPU_GEMM_ROWS_ONE(ATTR, tn)                                                                              \
    ATTR static void q8_0_rows##tn(const cpu_gemm_args *a, int r0, int r1, int b) { legacy_rows(a, r0, r1, b, tn, false); } \
    ATTR static void q4_0_rows##tn(const cpu_gemm_args *a, int r0, int r1, int b) { legacy_rows(a, r0, r1, b, tn, true); }
#define CPU_GEMM_LEGACY_ROWS(ATTR, sfx)                                                                           \
    CPU_GEMM_ROWS_ONE(ATTR, 1) CPU_GEMM_ROWS_ONE(ATTR, 2) CPU_GEMM_ROWS_ONE(ATTR, 3) CPU_GEMM_ROWS_ONE(ATTR, 4)     \
    CPU_GEMM_ROWS_ONE(ATTR, 5) CPU_GEMM_ROWS_ONE(ATTR, 6) CPU_GEMM_ROWS_ONE(ATTR, 7) CPU_GEMM_ROWS_ONE(ATTR, 8)     \
    void cpu_gemm_rows_q8_0_##sfx(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {                       \
        static const cpu_gemm_rows_tile_fn tab[CPU_ROW_TN] = {q8_0_rows1, q8_0_rows2, q8_0_rows3, q8_0_rows4,    \
                                                              q8_0_rows5, q8_0_rows6, q8_0_rows7, q8_0_rows8};   \
        cpu_gemm_walk_rows(a, r0, r1, b0, b1, tab);                                                              \
    }                                                                                                            \
    void cpu_gemm_rows_q4_0_##sfx(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {                       \
        static const cpu_gemm_rows_tile_fn tab[CPU_ROW_TN] = {q4_0_rows1, q4_0_rows2, q4_0_rows3, q4_0_rows4,    \
                                                              q4_0_rows5, q4_0_rows6, q4_0_rows7, q4_0_rows8};   \
        cpu_gemm_walk_rows(a, r0, r1, b0, b1, tab);                                                              \
    }

/* The reference: the single dot, pair by pair. */
void cpu_gemm_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q8_0 x Q8_0 tiles, bit-identical to kiln_dot_q8_0_avx2 (reads a->yd). */
void cpu_gemm_q8_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q4_0 x Q8_0 tiles, bit-identical to kiln_dot_q4_0_avx2 (reads a->yd). */
void cpu_gemm_q4_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q4_K x Q8_K tiles, bit-identical to kiln_dot_q4_K_avx2. */
void cpu_gemm_q4_K_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q6_K x Q8_K tiles, bit-identical to kiln_dot_q6_K_avx2 (on every x86 level: Q6_K has no VNNI dot). */
void cpu_gemm_q6_K_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);

/* AVX-512 VNNI tiles (cpu_gemm_avx512.c), bit-identical to kiln_dot_q8_0_vnni / q4_0 / q4_K (= the AVX2 dots). */
void cpu_gemm_q8_0_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_q4_0_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_q4_K_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);

/* The tiled kernel that reproduces `dot` (a type's vec_dot_fast) exactly, or the reference. */
cpu_gemm_fn cpu_gemm_select(kiln_vec_dot_fn dot);

/* The small-batch products (a decode step of a few sequences): the same results, one weight row at a time
 * against the activation rows b0..b1 (up to 8 in one pass over the row), so each weight row streams from memory
 * once and a thread's rows are never revisited. The reference: the single dot, weight row by weight row. */
void cpu_gemm_rows_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_rows_q8_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_rows_q4_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q4_K, Q6_K: the tiled kernel's 1 x 4 tiles, row by row. */
void cpu_gemm_rows_q4_K_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_rows_q6_K_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);

/* The same on AVX-512 VNNI (cpu_gemm_avx512.c), reading a->yu (cpu_gemm_flip_row of each activation row); from 3
 * activation rows up two weight rows at a time (the halves of a zmm), each still read once. */
void cpu_gemm_rows_q8_0_vnni(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_rows_q4_0_vnni(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);

/* The small-batch kernel that reproduces `dot` exactly, or the reference; whether it reads a->yu. */
cpu_gemm_fn cpu_gemm_rows_select(kiln_vec_dot_fn dot);
bool cpu_gemm_rows_flips(kiln_vec_dot_fn dot);
/* The bytes of a Q8_0 row of n values plus 128 (its block values as unsigned) into yu (n bytes). */
void cpu_gemm_flip_row(const void *y, int n, uint8_t *yu);

/* The kernel for a single activation row (decode of one sequence), where one is faster than the dot itself
 * (measured: Q8_0, Q4_0, Q4_K and Q6_K: the kernels below, the AVX2 Q8_0 / Q4_0 ones on VNNI too), else NULL
 * (call the dot per weight row). Q6_K on AVX-512 machines: not the AVX2 kernel (its L1 prefetches decoded
 * llama-3.2-1b Q4_K, whose output matrix is Q6_K, 4-6% slower than the plain dot on a Zen 4) but
 * cpu_gemm_row1_q6_K_avx512, prefetching into L2: on a 2-core Zen 4, llama-3.2-1b's 215 MB Q6_K output matrix
 * alone against one row ran 4-10% faster than the plain dot per row at 1 thread (6 of 6 runs of 100 alternated
 * reps) and the same at 2 threads (both at the memory's ~33 GB/s); whole decode, alternated with the plain dot
 * on a noisy shared box, was faster in 16 of 24 pairs at 1 thread and 18 of 24 at 2 (paired medians +3%, +8%)
 * but slower in 2 of 2 longer runs at 2 threads: within its noise there. Only the VNNI Q4_K one reads a->yu
 * (cpu_gemm_row1_reads_yu). Bit-identical to dot like every kernel here. */
cpu_gemm_fn cpu_gemm_row1_select(kiln_vec_dot_fn dot);
/* Whether cpu_gemm_row1_select(dot) reads a->yu: the activation row's values in k4 order. */
bool cpu_gemm_row1_reads_yu(kiln_vec_dot_fn dot);
/* The values of a Q8_K row of n values in k4 order into yu (n bytes): per block the runs of 32 values 0 2 1 3 4 6
 * 5 7, so that each 64 bytes meet the low or the high nibbles of 64 bytes of a Q4_K block's qs. */
void cpu_gemm_k4_order_row(const void *y, int n, uint8_t *yu);
/* Q4_K against one activation row on AVX-512 VNNI (cpu_gemm_avx512.c; reads a->yu): two streams of weight rows,
 * their float steps in the halves of a zmm, each stream prefetched. */
void cpu_gemm_row1_q4_K_vnni(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q8_0 and Q4_0 on AVX2 (and on VNNI: the same results as its dots). */
void cpu_gemm_row1_q8_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_row1_q4_0_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q4_K and Q6_K on AVX2 (CPU_GEMM_ROW1_PAIRS): two streams of weight rows interleaved, each prefetched. */
void cpu_gemm_row1_q4_K_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
void cpu_gemm_row1_q6_K_avx2(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);
/* Q6_K on AVX-512 machines (cpu_gemm_avx512.c): the same two streams, bit-identical to kiln_dot_q6_K_avx2 (the
 * dot at that level too: Q6_K has no VNNI one), prefetched into L2 as cpu_gemm_row1_q4_K_vnni. */
void cpu_gemm_row1_q6_K_avx512(const cpu_gemm_args *a, int r0, int r1, int b0, int b1);

#endif
