/*
 * cpu_gemm.c — micro-benchmark of the prefill block product per CPU kernel level, in one process (ratios):
 * single thread, a weight matrix of real shape x 128 activation rows through the AVX2 tiles and, where the CPU
 * has AVX-512 F/BW/VL/VNNI, the AVX-512 tiles (cpu_gemm_avx2.c / cpu_gemm_avx512.c; both bit-identical to the
 * single dots, checked here too), beside the single dot pair by pair (cpu_gemm_ref). Q6_K has AVX2 tiles only.
 * Prints a markdown table of GMAC/s (median of repeated runs, thread CPU time).
 *   usage: cpu_gemm [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_gemm.h"
#include "base/alloc.h"
#include "formats/blocks.h"
#include "formats/formats.h"
#include "bench_time.h"

#define B 128

/* Median GMAC/s of `reps` runs of gemm over the whole block. */
static double measure(cpu_gemm_fn gemm, const cpu_gemm_args *a, int rows, int reps) {
    double g[32];
    for (int r = 0; r < reps; r++) {
        const double t0 = bench_thread_s();
        gemm(a, 0, rows, 0, B);
        g[r] = (double)rows * a->n * B / (bench_thread_s() - t0) / 1e9;
    }
    qsort(g, (size_t)reps, sizeof g[0], bench_cmp_double);
    return g[reps / 2];
}

int main(int argc, char **argv) {
#if KILN_X86
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    const int reps = quick ? 3 : 9;
    const bool has512 = kiln_cpu_has_avx512vnni();
    static const struct { kiln_type type; int n, rows; cpu_gemm_fn avx2, avx512; kiln_vec_dot_fn dot; } cases[] = {
        {KILN_TYPE_Q8_0, 576, 1536, cpu_gemm_q8_0_avx2, cpu_gemm_q8_0_avx512, kiln_dot_q8_0_avx2},
        {KILN_TYPE_Q8_0, 1536, 576, cpu_gemm_q8_0_avx2, cpu_gemm_q8_0_avx512, kiln_dot_q8_0_avx2},
        {KILN_TYPE_Q4_0, 576, 1536, cpu_gemm_q4_0_avx2, cpu_gemm_q4_0_avx512, kiln_dot_q4_0_avx2},
        {KILN_TYPE_Q4_K, 2048, 1024, cpu_gemm_q4_K_avx2, cpu_gemm_q4_K_avx512, kiln_dot_q4_K_avx2},
        {KILN_TYPE_Q6_K, 2048, 1024, cpu_gemm_q6_K_avx2, NULL, kiln_dot_q6_K_avx2},
    };
    if (!kiln_cpu_has_avx2()) { printf("cpu_gemm: no AVX2 on this CPU\n"); return 0; }
    printf("| type | n x rows x %d | pair dots GMAC/s | AVX2 tiles GMAC/s | AVX-512 tiles GMAC/s | ratio |\n"
           "|---|---|---:|---:|---:|---:|\n", B);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const kiln_type_info *ti = kiln_type_get(cases[c].type);
        const int n = cases[c].n, rows = cases[c].rows;
        const size_t wb = kiln_row_bytes(cases[c].type, (uint64_t)n), yb = kiln_row_bytes(ti->vec_dot_type, (uint64_t)n);
        uint8_t *w = kiln_aligned_alloc(64, wb * (size_t)rows), *y = kiln_aligned_alloc(64, yb * B);
        float *yd = malloc(sizeof(float) * B * (size_t)(n / 32)), *x = malloc(sizeof(float) * (size_t)n);
        float *o2 = malloc(sizeof(float) * B * (size_t)rows), *o5 = malloc(sizeof(float) * B * (size_t)rows);
        uint64_t st = 12345 + c;
        for (int r = 0; r < rows + B; r++) {
            for (int i = 0; i < n; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (float)((int)(st >> 40) % 2001 - 1000) / 600.0f;
            }
            if (r < rows) ti->from_float(x, w + (size_t)r * wb, n);
            else kiln_quantize_row_for_dot(cases[c].type, x, y + (size_t)(r - rows) * yb, n);
        }
        if (ti->vec_dot_type == KILN_TYPE_Q8_0)
            for (int b = 0; b < B; b++)
                for (int ib = 0; ib < n / 32; ib++)
                    yd[b * (n / 32) + ib] = kiln_f16_to_f32(((const block_q8_0 *)(y + (size_t)b * yb))[ib].d);
        cpu_gemm_args a = {.dot = cases[c].dot, .n = n, .w = w, .w_stride = wb, .y = y, .y_stride = yb, .yd = yd,
                           .out = o2, .out_stride = (size_t)rows};
        const double gd = measure(cpu_gemm_ref, &a, rows, reps), g2 = measure(cases[c].avx2, &a, rows, reps);
        double g5 = 0;
        if (has512 && cases[c].avx512) {
            a.out = o5;
            g5 = measure(cases[c].avx512, &a, rows, reps);
            if (memcmp(o2, o5, sizeof(float) * B * (size_t)rows)) printf("cpu_gemm: %s AVX-512 tiles differ from AVX2!\n", ti->name);
        }
        if (g5 > 0) printf("| %s | %d x %d | %.1f | %.1f | %.1f | %.2fx |\n", ti->name, n, rows, gd, g2, g5, g5 / g2);
        else printf("| %s | %d x %d | %.1f | %.1f | (%s) | |\n", ti->name, n, rows, gd, g2,
                    has512 ? "no AVX-512 tiles" : "no AVX-512 VNNI");
        fflush(stdout);
        kiln_free(w);
        kiln_free(y);
        free(yd);
        free(x);
        free(o2);
        free(o5);
    }
#else
    (void)argc;
    (void)argv;
    printf("cpu_gemm: x86 only\n");
#endif
    return 0;
}
