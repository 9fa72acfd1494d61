/*
 * formats_dot.c — micro-benchmark of the row dot products per weight type: GB/s of weight bytes for the
 * scalar reference (vec_dot) and the table's fast variant (vec_dot_fast, AVX2 on x86), single thread,
 * one activation row dotted with every row of a weight matrix (the matrix-vector product of decode).
 * Two sizes: "hot" (1 MiB of weights, cache-resident: kernel speed) and "stream" (64 MiB: memory bound).
 * Prints a markdown table; each figure is the median of repeated runs, timed in thread CPU time.
 *   usage: formats_dot [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "formats/formats.h"
#include "bench_time.h"

#define COLS 4096

static volatile float sink;

/* Median GB/s of `reps` passes of fn over rows x row_bytes. */
static double measure(kiln_vec_dot_fn fn, const uint8_t *w, size_t row_bytes, int rows, const void *act, int reps,
                      double min_s) {
    double gbs[64];
    for (int r = 0; r < reps; r++) {
        int passes = 0;
        const double t0 = bench_thread_s();
        double t;
        float acc = 0;
        do {
            for (int i = 0; i < rows; i++) {
                float s;
                fn(COLS, &s, w + (size_t)i * row_bytes, act);
                acc += s;
            }
            passes++;
            t = bench_thread_s() - t0;
        } while (t < min_s);
        sink = acc;
        gbs[r] = (double)passes * rows * row_bytes / t / 1e9;
    }
    qsort(gbs, (size_t)reps, sizeof gbs[0], bench_cmp_double);
    return gbs[reps / 2];
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    static const kiln_type types[] = {KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_BF16, KILN_TYPE_Q8_0, KILN_TYPE_Q4_0,
                                      KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K,
                                      KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K};
    const int reps = quick ? 3 : 11;
    const double min_s = quick ? 0.02 : 0.05;
    float *x = malloc(sizeof(float) * COLS), *wrow = malloc(sizeof(float) * COLS);
    void *act = malloc(sizeof(float) * COLS);
    uint64_t st = 12345;
    for (int i = 0; i < COLS; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int)(st >> 40) % 2001 - 1000) / 500.0f;
    }
    printf("| type | bytes/row | hot scalar GB/s | hot fast GB/s | hot speedup | stream scalar GB/s | stream fast GB/s |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const kiln_type_info *ti = kiln_type_get(types[k]);
        const size_t rb = kiln_row_bytes(types[k], COLS);
        const int rows_hot = (int)((1u << 20) / rb), rows_stream = (int)((64u << 20) / rb);
        uint8_t *w = kiln_aligned_alloc(64, rb * (size_t)rows_stream);
        for (int r = 0; r < rows_stream; r++) {
            if (r < 64) {
                for (int i = 0; i < COLS; i++) {
                    st = st * 6364136223846793005ull + 1442695040888963407ull;
                    wrow[i] = (float)((int)(st >> 40) % 2001 - 1000) / 700.0f;
                }
                ti->from_float(wrow, w + (size_t)r * rb, COLS);
            } else {
                memcpy(w + (size_t)r * rb, w + (size_t)(r % 64) * rb, rb);
            }
        }
        kiln_quantize_row_for_dot(types[k], x, act, COLS);
        const double hs = measure(ti->vec_dot, w, rb, rows_hot, act, reps, min_s);
        const double hf = measure(ti->vec_dot_fast, w, rb, rows_hot, act, reps, min_s);
        const double ss = measure(ti->vec_dot, w, rb, rows_stream, act, quick ? 1 : 5, 0.0);
        const double sf = measure(ti->vec_dot_fast, w, rb, rows_stream, act, quick ? 1 : 5, 0.0);
        printf("| %s | %zu | %.2f | %.2f | %.1fx | %.2f | %.2f |\n", ti->name, rb, hs, hf, hf / hs, ss, sf);
        fflush(stdout);
        kiln_free(w);
    }
    free(x);
    free(wrow);
    free(act);
    return 0;
}
