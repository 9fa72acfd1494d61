/* cpu_gemm.c — the reference block products and the choice of a tiled or small-batch one (cpu_gemm.h). */
#include "backend/cpu/cpu_gemm.h"

#include <string.h>

#include "formats/blocks.h"

void cpu_gemm_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    for (int b = b0; b < b1; b++)
        for (int r = r0; r < r1; r++)
            a->dot(a->n, &a->out[(size_t)b * a->out_stride + (size_t)r], a->w + (size_t)r * a->w_stride,
                   a->y + (size_t)b * a->y_stride);
}

void cpu_gemm_walk(const cpu_gemm_args *a, int r0, int r1, int b0, int b1, int TM, int TN, const cpu_gemm_tile_fn *tab) {
    for (int r = r0; r < r1; r += TM) {
        const int tm = r1 - r < TM ? r1 - r : TM;
        for (int b = b0; b < b1; b += TN) {
            const int tn = b1 - b < TN ? b1 - b : TN;
            tab[(tm - 1) * TN + tn - 1](a, r, b);
        }
    }
}

void cpu_gemm_walk_rows(const cpu_gemm_args *a, int r0, int r1, int b0, int b1, const cpu_gemm_rows_tile_fn *tab) {
    for (int b = b0; b < b1; b += CPU_ROW_TN) tab[(b1 - b < CPU_ROW_TN ? b1 - b : CPU_ROW_TN) - 1](a, r0, r1, b);
}

void cpu_gemm_rows_ref(const cpu_gemm_args *a, int r0, int r1, int b0, int b1) {
    for (int r = r0; r < r1; r++) cpu_gemm_ref(a, r, r + 1, b0, b1);
}

int cpu_gemm_tile_rows(cpu_gemm_fn gemm) {
#if defined(__x86_64__) || defined(__i386__)
    if (gemm == cpu_gemm_q8_0_avx512 || gemm == cpu_gemm_q4_0_avx512) return CPU_VNNI_Q8_TN;
    if (gemm == cpu_gemm_q4_K_avx512) return CPU_VNNI_K4_TN;
#endif
    (void)gemm;
    return 4;
}

cpu_gemm_fn cpu_gemm_select(kiln_vec_dot_fn dot) {
#if defined(__x86_64__) || defined(__i386__)
    /* only where it is the dot in use: the tiles reproduce that function, not the type */
    if (dot == kiln_dot_q8_0_avx2) return cpu_gemm_q8_0_avx2;
    if (dot == kiln_dot_q4_0_avx2) return cpu_gemm_q4_0_avx2;
    if (dot == kiln_dot_q4_K_avx2) return cpu_gemm_q4_K_avx2;
    if (dot == kiln_dot_q6_K_avx2) return cpu_gemm_q6_K_avx2;
    if (dot == kiln_dot_q8_0_vnni) return cpu_gemm_q8_0_avx512;
    if (dot == kiln_dot_q4_0_vnni) return cpu_gemm_q4_0_avx512;
    if (dot == kiln_dot_q4_K_vnni) return cpu_gemm_q4_K_avx512;
#endif
    return cpu_gemm_ref;
}

cpu_gemm_fn cpu_gemm_rows_select(kiln_vec_dot_fn dot) {
#if defined(__x86_64__) || defined(__i386__)
    /* the VNNI dots give the AVX2 dots' bits, so either level's rows kernel reproduces both */
    if (dot == kiln_dot_q8_0_vnni) return cpu_gemm_rows_q8_0_vnni;
    if (dot == kiln_dot_q4_0_vnni) return cpu_gemm_rows_q4_0_vnni;
    if (dot == kiln_dot_q8_0_avx2) return cpu_gemm_rows_q8_0_avx2;
    if (dot == kiln_dot_q4_0_avx2) return cpu_gemm_rows_q4_0_avx2;
    if (dot == kiln_dot_q4_K_avx2 || dot == kiln_dot_q4_K_vnni) return cpu_gemm_rows_q4_K_avx2;
    if (dot == kiln_dot_q6_K_avx2) return cpu_gemm_rows_q6_K_avx2;
#endif
    return cpu_gemm_rows_ref;
}

void cpu_gemm_flip_row(const void *y, int n, uint8_t *yu) {
    const block_q8_0 *blk = y;
    for (int ib = 0; ib < n / QK8_0; ib++)
        for (int k = 0; k < QK8_0; k += 8) { /* 8 bytes at a time */
            uint64_t v;
            memcpy(&v, blk[ib].qs + k, sizeof v);
            v ^= 0x8080808080808080ull;
            memcpy(yu + ib * QK8_0 + k, &v, sizeof v);
        }
}

bool cpu_gemm_rows_flips(kiln_vec_dot_fn dot) {
    const cpu_gemm_fn rows = cpu_gemm_rows_select(dot);
#if defined(__x86_64__) || defined(__i386__)
    return rows == cpu_gemm_rows_q8_0_vnni || rows == cpu_gemm_rows_q4_0_vnni;
#else
    (void)rows;
    return false;
#endif
}

void cpu_gemm_k4_order_row(const void *y, int n, uint8_t *yu) {
    static const int run[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    const block_q8_K *blk = y;
    for (int ib = 0; ib < n / QK_K; ib++)
        for (int k = 0; k < 8; k++) memcpy(yu + (size_t)ib * QK_K + 32 * k, blk[ib].qs + 32 * run[k], 32);
}

bool cpu_gemm_row1_reads_yu(kiln_vec_dot_fn dot) {
#if defined(__x86_64__) || defined(__i386__)
    return cpu_gemm_row1_select(dot) == cpu_gemm_row1_q4_K_vnni;
#else
    (void)dot;
    return false;
#endif
}

cpu_gemm_fn cpu_gemm_row1_select(kiln_vec_dot_fn dot) {
#if defined(__x86_64__) || defined(__i386__)
    /* on VNNI too: the AVX2 kernels' two streams decoded Q8_0 12-20% faster than the rows kernel on a Zen 4 */
    if (dot == kiln_dot_q8_0_avx2 || dot == kiln_dot_q8_0_vnni) return cpu_gemm_row1_q8_0_avx2;
    if (dot == kiln_dot_q4_0_avx2 || dot == kiln_dot_q4_0_vnni) return cpu_gemm_row1_q4_0_avx2;
    if (dot == kiln_dot_q4_K_vnni) return cpu_gemm_row1_q4_K_vnni;
    if (dot == kiln_dot_q4_K_avx2) return cpu_gemm_row1_q4_K_avx2;
    /* Q6_K's dot is kiln_dot_q6_K_avx2 at both levels; on AVX-512 the L2-prefetching kernel (measured: cpu_gemm.h) */
    if (dot == kiln_dot_q6_K_avx2) return kiln_cpu_level() >= KILN_CPU_AVX512 ? cpu_gemm_row1_q6_K_avx512 : cpu_gemm_row1_q6_K_avx2;
#endif
    (void)dot;
    return NULL;
}
