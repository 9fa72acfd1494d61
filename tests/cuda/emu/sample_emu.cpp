/* sample_emu.cpp — src/backend/cuda/cuda_sample.cu compiled for the CPU (the emulation of tests/cuda/emu) against
 * the reference chain, as tests/test_cuda_sample.c checks it on a GPU: every mix on logits of each shape, every
 * fifth row of mode NONE (left alone), the id of each row against ref_sample_given, which rows the one-block
 * chain drew, the row counters left at zero. Usage: sample_emu VOCAB ROWS [SHAPES [REPS]] (EXTRA=1: top-k above
 * the shared-memory set, top-p 0.5, the bench's mixes). Exit status 1 when an id differs. Slow (a fiber per
 * thread): a few minutes for a 49152 vocabulary. */
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "cuda_runtime.h"
#include "backend/cuda/cuda_sample.cuh"
extern "C" {
#include "kiln.h"
#include "sample_cases.h"
#include "sample_ref.h"
}
extern "C" uint64_t test_rand_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
extern "C" float test_rand_normal(uint64_t *s) {
    double u1 = ((test_rand_u64(s) >> 11) + 1) * (1.0 / 9007199254740994.0);
    double u2 = (test_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
int main(int argc, char **argv) {
    const int n = atoi(argv[1]), rows = atoi(argv[2]), shapes = argc > 3 ? atoi(argv[3]) : 5, reps = argc > 4 ? atoi(argv[4]) : 1;
    std::vector<float> x(n), lg((size_t)n * rows);
    std::vector<kiln_sample_spec> specs(rows);
    std::vector<int32_t> ids(rows);
    const size_t rb = ck_sample_scratch_bytes(n);
    unsigned char *scr = (unsigned char *)calloc(rows, rb);
    uint64_t rng = 2024 + n;
    sample_mix m[16];
    int nm = sample_case_mixes(m, n);
    if (getenv("EXTRA")) {
        nm = 0;
        m[nm++] = (sample_mix){"top-k 2000 t1.3", sample_case_params(1.3f, 2000, 1.0f, 0.0f)};
        m[nm++] = (sample_mix){"top-k 2000 top-p 0.9 min-p .05", sample_case_params(1.0f, 2000, 0.9f, 0.05f)};
        m[nm++] = (sample_mix){"top-p 0.5", sample_case_params(1.0f, 0, 0.5f, 0.0f)};
        m[nm++] = (sample_mix){"t0.8 top-p 0.95", sample_case_params(0.8f, 0, 0.95f, 0.0f)};
        m[nm++] = (sample_mix){"k40 t0.8", sample_case_params(0.8f, 40, 1.0f, 0.0f)};
    }
    long total = 0, diffs = 0, one = 0;
    for (int shape = 0; shape < shapes; shape++)
        for (int rep = 0; rep < reps; rep++) {
            sample_case_logits(x.data(), n, shape, rep ? 4.0f : 1.0f, &rng);
            for (int mi = 0; mi < nm; mi++) {
                m[mi].p.seed = test_rand_u64(&rng);
                kiln_sampler *s;
                if (kiln_sampler_open(&m[mi].p, n, &s) != KILN_OK) { printf("open failed\n"); return 1; }
                ref_sampler *r = ref_sampler_open(&m[mi].p, n);
                int best = 0;
                for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
                for (int i = 0; i < 12; i++) kiln_sampler_accept(s, i % 3 == 0 ? best : (int32_t)(test_rand_u64(&rng) % (uint64_t)n));
                for (int k = 0; k < rows; k++) {
                    uint64_t before;
                    if (!kiln_sampler_spec(s, &specs[k], &before)) { printf("spec failed\n"); return 1; }
                    if (k % 5 == 4) specs[k].mode = KILN_SPEC_NONE;
                    memcpy(&lg[(size_t)k * n], x.data(), sizeof(float) * n);
                    ids[k] = -7;
                }
                ck_sample(specs.data(), lg.data(), n, (size_t)n, rows, ids.data(), scr, nullptr);
                int d = 0, o = 0;
                for (int k = 0; k < rows; k++) {
                    int32_t ob;
                    memcpy(&ob, scr + (size_t)k * rb + ck_sample_path_offset(), 4);
                    if (specs[k].mode == KILN_SPEC_NONE) { if (ids[k] != -7) { printf("NONE row %d written\n", k); d++; } continue; }
                    const int32_t want = ref_sample_given(r, x.data(), specs[k].pen_id, specs[k].pen_count, specs[k].n_pen, specs[k].u);
                    o += ob;
                    if (ids[k] != want) {
                        d++;
                        if (diffs + d <= 10) printf("  vocab %d shape %d mix '%s' u %.17g: emu %d ref %d (one_block %d)\n", n, shape, m[mi].name, specs[k].u, ids[k], want, ob);
                    }
                    total++;
                }
                printf("vocab %d shape %d rep %d mix %-26s rows %d differ %d one_block %d\n", n, shape, rep, m[mi].name, rows, d, o);
                fflush(stdout);
                diffs += d, one += o;
                for (int k = 0; k < rows; k++) {
                    unsigned c; memcpy(&c, scr + (size_t)k * rb, 4);
                    if (c) { printf("counter of row %d left at %u\n", k, c); diffs++; }
                }
                kiln_sampler_close(s);
                ref_sampler_close(r);
            }
        }
    printf("TOTAL vocab %d: %ld compared, %ld differ, %ld one-block\n", n, total, diffs, one);
    return diffs ? 1 : 0;
}
