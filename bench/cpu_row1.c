/*
 * cpu_row1.c — micro-benchmark of decode's single-activation-row product from memory (cpu_gemm_row1_select):
 * one thread streams a ~100 MB weight matrix of llama-3.2-1b's width (n = 2048) against one activation row,
 * three ways alternated round by round: a plain 256-bit read of the same bytes (the bound), the plain dot per
 * weight row with the whole row prefetched CPU_PREFETCH_ROWS ahead (cpu_matmul's path for types without a
 * single-row kernel), and the single-row kernel in use (two linear streams of weight rows, each prefetched).
 * Prints a markdown table of GB/s of weights (best of rounds, wall time: streaming is what is measured).
 *   usage: cpu_row1 [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_gemm.h"
#include "base/alloc.h"
#include "formats/blocks.h"
#include "formats/formats.h"
#include "bench_time.h"

#define N 2048
#define MATRIX_BYTES (100u << 20)

/* Sums the bytes as 64-bit words, four independent sums (what a plain read costs). */
static uint64_t plain_read(const uint8_t *p, size_t n) {
    uint64_t s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * k, sizeof v);
            s[k] += v;
        }
    return s[0] + s[1] + s[2] + s[3];
}

static void dot_rows(const cpu_gemm_args *a, int rows) {
    for (int r = 0; r < rows; r++) {
        if (r + CPU_PREFETCH_ROWS < rows) cpu_prefetch_row(a->w + (size_t)(r + CPU_PREFETCH_ROWS) * a->w_stride, a->w_stride);
        a->dot(a->n, &a->out[r], a->w + (size_t)r * a->w_stride, a->y);
    }
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 && !strcmp(argv[1], "--quick") ? 3 : 7;
    static const kiln_type types[] = {KILN_TYPE_Q8_0, KILN_TYPE_Q4_0, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    printf("| type | MB | plain read GB/s | dot + row prefetch GB/s | single-row kernel GB/s | kernel / dot |\n"
           "|---|---:|---:|---:|---:|---:|\n");
    uint64_t sink = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const kiln_type_info *ti = kiln_type_get(types[t]);
        const kiln_vec_dot_fn dot = ti->vec_dot_fast ? ti->vec_dot_fast : ti->vec_dot;
        const cpu_gemm_fn row1 = cpu_gemm_row1_select(dot);
        const size_t wb = kiln_row_bytes(types[t], N), yb = kiln_row_bytes(ti->vec_dot_type, N);
        const int rows = (int)(MATRIX_BYTES / wb);
        uint8_t *w = kiln_aligned_alloc(64, wb * (size_t)rows), *y = kiln_aligned_alloc(64, yb), *yu = kiln_aligned_alloc(64, N);
        float *x = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * (size_t)rows),
              *yd = malloc(sizeof(float) * (N / 32));
        uint64_t st = 99 + t;
        for (int i = 0; i < N; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((int)(st >> 40) % 2001 - 1000) / 600.0f;
        }
        for (int r = 0; r < rows; r++) { /* a few distinct rows repeated: quantizing 100 MB would dominate */
            if (r < 16) ti->from_float(x, w + (size_t)r * wb, N), x[r] += 0.5f;
            else memcpy(w + (size_t)r * wb, w + (size_t)(r % 16) * wb, wb);
        }
        kiln_quantize_row_for_dot(types[t], x, y, N);
        if (ti->vec_dot_type == KILN_TYPE_Q8_0)
            for (int ib = 0; ib < N / 32; ib++) yd[ib] = kiln_f16_to_f32(((const block_q8_0 *)y)[ib].d);
        if (cpu_gemm_row1_reads_yu(dot)) cpu_gemm_k4_order_row(y, N, yu);
        const cpu_gemm_args a = {.dot = dot, .n = N, .w = w, .w_stride = wb, .y = y, .y_stride = yb, .yd = yd, .yu = yu,
                                 .out = out, .out_stride = (size_t)rows};
        double best[3] = {1e9, 1e9, 1e9};
        for (int k = 0; k < rounds; k++) {
            double t0 = bench_wall_s();
            sink += plain_read(w, wb * (size_t)rows);
            double t1 = bench_wall_s();
            dot_rows(&a, rows);
            double t2 = bench_wall_s(), t3 = t2;
            if (row1) row1(&a, 0, rows, 0, 1), t3 = bench_wall_s();
            const double d[3] = {t1 - t0, t2 - t1, t3 - t2};
            for (int v = 0; v < 3; v++)
                if (d[v] < best[v]) best[v] = d[v];
        }
        const double gb = (double)wb * rows / 1e9;
        if (row1)
            printf("| %s | %.0f | %.1f | %.1f | %.1f | %.2fx |\n", ti->name, gb * 1e3, gb / best[0], gb / best[1],
                   gb / best[2], best[1] / best[2]);
        else printf("| %s | %.0f | %.1f | %.1f | (none on this CPU) | |\n", ti->name, gb * 1e3, gb / best[0], gb / best[1]);
        fflush(stdout);
        kiln_free(w);
        kiln_free(y);
        kiln_free(yu);
        free(x);
        free(out);
        free(yd);
    }
    return sink == 42; /* keeps the plain read */
}
