/*
 * avx512_kernels.h — the AVX-512 VNNI kernels as a table, so one test checks either the real ones (on a CPU
 * with AVX-512 F/BW/VL/VNNI) or the same source compiled over an AVX2 emulation of the AVX-512 intrinsics
 * (avx512_emu_avx2.c: the kernels' logic checked on any AVX2 machine).
 */
#ifndef KILN_TESTS_AVX512_KERNELS_H
#define KILN_TESTS_AVX512_KERNELS_H

#include "backend/cpu/cpu_gemm.h"
#include "formats/formats.h"

typedef struct avx512_kernels {
    kiln_vec_dot_fn dot_q8_0, dot_q4_0, dot_q4_K;
    cpu_gemm_fn gemm_q8_0, gemm_q4_0, gemm_q4_K;
    cpu_gemm_fn rows_q8_0, rows_q4_0; /* the small-batch kernels (a->yu) */
    cpu_gemm_fn row1_q4_K;            /* Q4_K against one activation row */
    cpu_gemm_fn row1_q6_K;            /* Q6_K against one activation row (its dot: kiln_dot_q6_K_avx2) */
    cpu_gemm_fn r16_q8_0, r16_q4_K;   /* Q8_0 / Q4_K rows interleaved by 16 (cpu_repack.h), any number of activation rows */
} avx512_kernels;

#if KILN_X86
/* dot_avx512.c and cpu_gemm_avx512.c compiled over the emulation (call only when kiln_cpu_has_avx2()). */
extern const avx512_kernels avx512_emulated;
#endif

#endif
