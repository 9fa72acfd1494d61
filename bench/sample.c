/*
 * sample.c — sampler benchmark: ns per kiln_sample for a 49152 (SmolLM2) and a 128256 (Llama 3) vocabulary
 * and the parameter mixes that clients send, the one-pass sampler against the reference (kiln's sampler
 * before the rewrite: copy the vocabulary, quickselect, qsort; tests/sample_ref.c), side by side.
 *
 * Logits: "llm" = N(0, 2^2) noise plus a peaked head (64 ids boosted by 14 - 2.5 ln(rank)), the shape of a
 * trained model's next-token distribution; "flat" = N(0, 0.5^2), the worst case for top-p (a large share of
 * the vocabulary is kept); "wide" = N(0, 1), where min-p's floor leaves most ids of the kept blocks below it.
 * The bench prints, per shape, the top-1 probability and how many ids hold 90% of
 * the mass. Each figure is the median over repetitions of the mean of a few calls, in the thread's CPU time
 * (the development machine is shared).
 *   usage: sample [--quick]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln.h"
#include "../tests/sample_ref.c"
#include "bench_time.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static uint64_t rng_state = 12345;
static double uniform(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float normal(void) { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

static const char *const shape_name[3] = {"llm", "flat", "wide"};
static void make_logits(float *x, int n, int shape) {
    const float sd[3] = {2.0f, 0.5f, 1.0f};
    for (int i = 0; i < n; i++) x[i] = normal() * sd[shape];
    if (shape == 0)
        for (int r = 1; r <= 64; r++) x[(size_t)(uniform() * n)] += 14.0f - 2.5f * logf((float)r);
}

static int cmp_float_desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}
/* top-1 probability and the number of ids that hold 90% of the temperature-1 mass */
static void shape_stats(const float *x, int n, double *p1, int *n90) {
    float *s = malloc((size_t)n * sizeof *s);
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_float_desc);
    double z = 0.0, cum = 0.0;
    for (int i = 0; i < n; i++) z += exp((double)s[i] - s[0]);
    *p1 = 1.0 / z;
    *n90 = n;
    for (int i = 0; i < n; i++)
        if ((cum += exp((double)s[i] - s[0]) / z) >= 0.9) { *n90 = i + 1; break; }
    free(s);
}

typedef struct mix { const char *name; kiln_sampler_params p; } mix;

static volatile int32_t sink;

/* median ns per call over reps repetitions of `calls` calls; old: the reference sampler */
static double measure(const kiln_sampler_params *p, const float *x, int n, int old, int reps, int calls) {
    kiln_sampler *s = NULL;
    ref_sampler *r = NULL;
    if (old) r = ref_sampler_open(p, n);
    else if (kiln_sampler_open(p, n, &s) != KILN_OK) { fprintf(stderr, "%s\n", kiln_last_error()); exit(1); }
    for (int i = 0; i < 64; i++) { /* a window of likely ids, as generation leaves it */
        const int32_t id = (int32_t)(uniform() * n);
        if (old) ref_sampler_accept(r, id);
        else kiln_sampler_accept(s, id);
    }
    double t[64];
    for (int k = 0; k < reps; k++) {
        const double t0 = now_ns();
        for (int c = 0; c < calls; c++) sink = old ? ref_sample(r, x) : kiln_sample(s, x);
        t[k] = (now_ns() - t0) / calls;
    }
    qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
    kiln_sampler_close(s);
    ref_sampler_close(r);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    static const int vocabs[] = {49152, 128256};
    mix m[6];
    m[0] = (mix){"greedy", kiln_sampler_defaults()};
    m[0].p.temperature = 0.0f;
    m[1] = (mix){"t0.8 k40 p0.95 min-p0.05", kiln_sampler_defaults()};
    m[2] = (mix){"t1 p0.9 k off", kiln_sampler_defaults()};
    m[2].p.temperature = 1.0f, m[2].p.top_k = 0, m[2].p.top_p = 0.9f, m[2].p.min_p = 0.0f;
    m[3] = (mix){"t0.7 only", kiln_sampler_defaults()};
    m[3].p.temperature = 0.7f, m[3].p.top_k = 0, m[3].p.top_p = 1.0f, m[3].p.min_p = 0.0f;
    m[4] = m[2];
    m[4].name = "t1 p0.9 k off + presence/frequency 0.5";
    m[4].p.presence_penalty = 0.5f, m[4].p.frequency_penalty = 0.5f;
    m[5] = (mix){"t0.8 p0.95 min-p0.05 k off", kiln_sampler_defaults()};
    m[5].p.top_k = 0;
    printf("| vocab | logits | p(top1) | ids for 90%% | mix | reference ns | one-pass ns | speed-up | %% of 6 ms CPU step | %% of 0.8 ms H200 step |\n");
    printf("| ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (int v = 0; v < 2; v++) {
        const int n = vocabs[v];
        float *x = malloc((size_t)n * sizeof *x);
        for (int shape = 0; shape < 3; shape++) {
            make_logits(x, n, shape);
            double p1;
            int n90;
            shape_stats(x, n, &p1, &n90);
            for (int i = 0; i < 6; i++) {
                const double old = measure(&m[i].p, x, n, 1, quick ? 3 : 11, quick ? 1 : 3);
                const double fast = measure(&m[i].p, x, n, 0, quick ? 5 : 41, quick ? 5 : 20);
                printf("| %d | %s | %.3f | %d | %s | %.0f | %.0f | %.0fx | %.2f | %.2f |\n", n, shape_name[shape], p1,
                       n90, m[i].name, old, fast, old / fast, fast / 6e6 * 100.0, fast / 0.8e6 * 100.0);
                fflush(stdout);
            }
        }
        free(x);
    }
    return 0;
}
