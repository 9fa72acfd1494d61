/*
 * cpu_gemm_rows.c — micro-benchmark of the small-batch product of batched decode (cpu_gemm.h): B = 1..8
 * activation rows against every row of a Q8_0 weight matrix (n = 576, the smollm2-135m width), single thread,
 * three ways side by side in one process, alternated round by round: the single dot once per (row, input)
 * ("dots"), the tiled kernel's 1 x N tiles walked one weight row at a time ("tiles", what cpu_matmul did
 * before cpu_gemm_rows), and the small-batch kernel ("rows"). Two sizes: "hot" (180 KiB of weights,
 * cache-resident: kernel speed) and "stream" (96 MiB: from memory, as a decode step reads them). Prints a
 * markdown table of ns per weight row (median of rounds, thread CPU time) and each ratio to the one-row dot.
 *   usage: cpu_gemm_rows [--quick]
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

#define N 576
#define MAXB 8

static void pass_dots(const cpu_gemm_args *a, int rows, int B) {
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < B; b++)
            a->dot(a->n, &a->out[(size_t)b * a->out_stride + r], a->w + (size_t)r * a->w_stride, a->y + (size_t)b * a->y_stride);
}

static void pass_tiles(const cpu_gemm_args *a, int rows, int B) {
    const cpu_gemm_fn gemm = cpu_gemm_select(a->dot);
    for (int r = 0; r < rows; r++) gemm(a, r, r + 1, 0, B);
}

static void pass_rows(const cpu_gemm_args *a, int rows, int B) { cpu_gemm_rows_select(a->dot)(a, 0, rows, 0, B); }

typedef void (*pass_fn)(const cpu_gemm_args *a, int rows, int B);

/* ns per weight row of one pass of each variant, medians over `rounds` alternated rounds. */
static void measure(const cpu_gemm_args *a, int rows, int B, int rounds, double min_s, double out[3]) {
    static const pass_fn fns[3] = {pass_dots, pass_tiles, pass_rows};
    double t[3][32];
    for (int k = 0; k < rounds; k++)
        for (int v = 0; v < 3; v++) {
            int passes = 0;
            const double t0 = bench_thread_s();
            double dt;
            do {
                fns[v](a, rows, B);
                passes++;
                dt = bench_thread_s() - t0;
            } while (dt < min_s);
            t[v][k] = dt / passes / rows * 1e9;
        }
    for (int v = 0; v < 3; v++) {
        qsort(t[v], (size_t)rounds, sizeof(double), bench_cmp_double);
        out[v] = t[v][rounds / 2];
    }
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    kiln_formats_init();
    const kiln_type_info *ti = kiln_type_get(KILN_TYPE_Q8_0);
    if (cpu_gemm_rows_select(ti->vec_dot_fast) == cpu_gemm_rows_ref) printf("(no fast small-batch kernel on this CPU)\n");
    const size_t wrow = kiln_row_bytes(KILN_TYPE_Q8_0, N), nb = N / 32;
    const int sizes[2] = {300, (int)((96u << 20) / wrow)};
    uint8_t *w = kiln_aligned_alloc(64, (size_t)sizes[1] * wrow);
    uint8_t *y = kiln_aligned_alloc(64, MAXB * wrow);
    uint8_t *yu = kiln_aligned_alloc(64, (size_t)MAXB * N);
    float *yd = kiln_aligned_alloc(64, MAXB * nb * sizeof(float)), *out = kiln_aligned_alloc(64, (size_t)MAXB * sizes[1] * 4);
    float *row = kiln_aligned_alloc(64, (size_t)N * sizeof(float));
    if (!w || !y || !yu || !yd || !out || !row) return 1;
    uint64_t s = 1;
    for (int r = 0; r < sizes[1]; r++) {
        for (int i = 0; i < N; i++) row[i] = (float)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 40) / (1 << 24) - 0.5f;
        ti->from_float(row, w + (size_t)r * wrow, N);
    }
    for (int b = 0; b < MAXB; b++) {
        for (int i = 0; i < N; i++) row[i] = (float)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 40) / (1 << 24) - 0.5f;
        kiln_quantize_row_for_dot(KILN_TYPE_Q8_0, row, y + (size_t)b * wrow, N);
        for (size_t ib = 0; ib < nb; ib++) yd[b * nb + ib] = kiln_f16_to_f32(((const block_q8_0 *)(y + (size_t)b * wrow))[ib].d);
        cpu_gemm_flip_row(y + (size_t)b * wrow, N, yu + (size_t)b * N);
    }
    const int rounds = quick ? 3 : 7;
    const double min_s = quick ? 0.02 : 0.1;
    printf("| size | B | dots ns/row | tiles ns/row | rows ns/row | rows / B=1 dot | tiles / rows |\n|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < 2; si++) {
        double base = 0;
        for (int B = 1; B <= MAXB; B++) {
            const cpu_gemm_args a = {.dot = ti->vec_dot_fast, .n = N, .w = w, .w_stride = wrow, .y = y, .y_stride = wrow,
                                     .yd = yd, .yu = yu, .out = out, .out_stride = (size_t)sizes[si]};
            double t[3];
            measure(&a, sizes[si], B, rounds, min_s, t);
            if (B == 1) base = t[0];
            printf("| %s | %d | %.1f | %.1f | %.1f | %.2fx | %.2f |\n", si ? "stream" : "hot", B, t[0], t[1], t[2],
                   t[2] / base, t[1] / t[2]);
        }
    }
    kiln_free(w), kiln_free(y), kiln_free(yu), kiln_free(yd), kiln_free(out), kiln_free(row);
    return 0;
}
