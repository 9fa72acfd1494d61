/* test_sample.c — the sampler: greedy, top-k/top-p/min-p filtering, repetition penalty, seeded RNG. */
#include "test.h"

#include <math.h>
#include <string.h>

static float logits8[8] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f, 2.9f, -4.0f};

TEST(sample_greedy_takes_lowest_id_of_max) {
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 0;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    CHECK_EQ_INT(kiln_sample(s, logits8), 1);
    kiln_sampler_close(s);
}

TEST(sample_top_k_1_is_greedy_and_seed_reproduces) {
    kiln_sampler_params p = kiln_sampler_defaults();
    p.top_k = 1;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    for (int i = 0; i < 50; i++) CHECK_EQ_INT(kiln_sample(s, logits8), 1);
    kiln_sampler_close(s);
    p = kiln_sampler_defaults();
    p.temperature = 1.5f;
    p.min_p = 0;
    p.top_p = 1;
    p.top_k = 0;
    p.seed = 1234;
    kiln_sampler *a, *b;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &a));
    REQUIRE_OK(kiln_sampler_open(&p, 8, &b));
    int diff = 0, distinct[8] = {0};
    for (int i = 0; i < 200; i++) {
        int x = kiln_sample(a, logits8), y = kiln_sample(b, logits8);
        diff += x != y;
        distinct[x] = 1;
    }
    CHECK_EQ_INT(diff, 0);
    int nd = 0;
    for (int i = 0; i < 8; i++) nd += distinct[i];
    CHECKF(nd >= 4, "only %d distinct ids at temperature 1.5", nd);
    kiln_sampler_close(a);
    kiln_sampler_close(b);
}

TEST(sample_frequencies_follow_softmax) {
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    int counts[8] = {0};
    const int N = 40000;
    for (int i = 0; i < N; i++) counts[kiln_sample(s, logits8)]++;
    double z = 0;
    for (int i = 0; i < 8; i++) z += exp(logits8[i]);
    for (int i = 0; i < 8; i++) {
        double want = exp(logits8[i]) / z, got = (double)counts[i] / N;
        CHECKF(fabs(got - want) < 0.01, "id %d: frequency %.4f, softmax %.4f", i, got, want);
    }
    kiln_sampler_close(s);
}

TEST(sample_min_p_and_top_p_cut_the_tail) {
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.5f; /* keeps ids whose p >= 0.5 p_max: 1, 3, 6 (e^2.9/e^3 = 0.90) and 2 (e^-1 = 0.37: out) */
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    for (int i = 0; i < 2000; i++) {
        int id = kiln_sample(s, logits8);
        CHECKF(id == 1 || id == 3 || id == 6, "min-p let id %d through", id);
        if (test_failures()) break;
    }
    kiln_sampler_close(s);
    p.min_p = 0;
    p.top_p = 0.5f; /* sorted: 1 (0.30), 3 (0.30) reach 0.5 -> {1, 3} */
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    for (int i = 0; i < 2000; i++) {
        int id = kiln_sample(s, logits8);
        CHECKF(id == 1 || id == 3, "top-p let id %d through", id);
        if (test_failures()) break;
    }
    kiln_sampler_close(s);
}

TEST(sample_repetition_penalty_demotes_recent) {
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    kiln_sampler_accept(s, 1);
    kiln_sampler_accept(s, 1);
    kiln_sampler_accept(s, 3);
    CHECK_EQ_INT(kiln_sample(s, logits8), 6); /* 1 and 3 become 1.5; 6 keeps 2.9 */
    kiln_sampler_reset(s);
    CHECK_EQ_INT(kiln_sample(s, logits8), 1);
    kiln_sampler_close(s);
}

TEST(sample_params_are_validated) {
    kiln_sampler *s = (kiln_sampler *)1;
    kiln_sampler_params p = kiln_sampler_defaults();
    p.top_p = 1.5f;
    CHECK_EQ_INT(kiln_sampler_open(&p, 8, &s), KILN_ERR_INVALID_ARG);
    CHECK(s == NULL);
    p = kiln_sampler_defaults();
    p.temperature = NAN;
    CHECK_EQ_INT(kiln_sampler_open(&p, 8, &s), KILN_ERR_INVALID_ARG);
    p = kiln_sampler_defaults();
    CHECK_EQ_INT(kiln_sampler_open(&p, 0, &s), KILN_ERR_INVALID_ARG);
}

/* ------------------------------------------------------------------ one-pass sampler vs the reference */

#include <stdlib.h>

#include "base/timing.h"
#include "formats/formats.h"
#include "sample/sample_internal.h"
#include "sample_cases.h"
#include "sample_ref.h"

/* A window that mixes the largest logits (so that penalties change the outcome) and random ids. */
static void accept_window(kiln_sampler *a, ref_sampler *b, const float *x, int n, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    for (int i = 0; i < 12; i++) {
        const int32_t id = i % 3 == 0 ? best : (int32_t)(test_rand_u64(rng) % (uint64_t)n);
        kiln_sampler_accept(a, id);
        ref_sampler_accept(b, id);
    }
}

/* Draws `draws` ids from both samplers on the same logits (accepting each into both windows); returns the
 * number of calls whose ids differ. */
static int compare_runs(const kiln_sampler_params *p, const float *x, int n, int draws, uint64_t *rng) {
    kiln_sampler *a;
    if (kiln_sampler_open(p, n, &a) != KILN_OK) { CHECKF(0, "open: %s", kiln_last_error()); return 1; }
    ref_sampler *b = ref_sampler_open(p, n);
    accept_window(a, b, x, n, rng);
    int diff = 0;
    for (int d = 0; d < draws; d++) {
        const int32_t ia = kiln_sample(a, x), ib = ref_sample(b, x);
        diff += ia != ib;
        kiln_sampler_accept(a, ia);
        ref_sampler_accept(b, ib);
    }
    kiln_sampler_close(a);
    ref_sampler_close(b);
    return diff;
}

TEST(sample_same_seed_same_ids_as_reference) {
    static const int sizes[] = {1, 2, 3, 63, 64, 65, 127, 1000, 4099, 32000, 49152, 151936};
    static const float scales[] = {0.05f, 1.0f, 3.0f, 8.0f};
    float *x = malloc(151936 * sizeof *x);
    uint64_t rng = 42;
    sample_mix m[16];
    long calls = 0, diffs = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int n = sizes[si], big = n >= 32000;
        const int nm = sample_case_mixes(m, n);
        for (int shape = 0; shape < (big ? 4 : 5); shape++)
            for (size_t sc = 0; sc < (shape == 4 ? 1 : sizeof scales / sizeof *scales); sc += big ? 2 : 1) {
                sample_case_logits(x, n, shape, scales[sc], &rng);
                for (int mi = 0; mi < nm; mi++) {
                    m[mi].p.seed = test_rand_u64(&rng);
                    const int draws = big ? 1 : 12, d = compare_runs(&m[mi].p, x, n, draws, &rng);
                    CHECKF(d == 0, "vocab %d shape %d scale %g mix '%s': %d of %d ids differ", n, shape,
                           (double)scales[sc], m[mi].name, d, draws);
                    calls += draws;
                    diffs += d;
                }
            }
    }
    printf("    %ld calls compared, %ld differ\n", calls, diffs);
    free(x);
}

/* Flat logits (a random model's: N(0, 0.5^2)) over a large vocabulary, new ones for every call: the
 * histogram's top-p crossings and draws fall within their margins of a boundary in a few percent of the calls,
 * where sample_hist.c resolves them with the exact cumulative; every id must equal the reference's. */
TEST(sample_near_boundary_calls_equal_the_reference) {
    enum { N = 49152, DRAWS = 130, MIXES = 5 };
    float *x = malloc(N * sizeof *x);
    const kiln_sampler_params mixes[MIXES] = {
        sample_case_params(0.8f, 0, 0.95f, 0.0f), sample_case_params(1.0f, 0, 0.9f, 0.0f),
        sample_case_params(0.8f, 0, 1.0f, 0.0f), sample_case_params(0.8f, 0, 0.95f, 0.05f),
        sample_case_params(0.15f, 0, 0.9f, 0.0f)};
    uint64_t rng = 1234;
    for (int mi = 0; mi < MIXES; mi++) {
        kiln_sampler_params p = mixes[mi];
        p.seed = 77 + (uint64_t)mi;
        kiln_sampler *a;
        REQUIRE_OK(kiln_sampler_open(&p, N, &a));
        ref_sampler *b = ref_sampler_open(&p, N);
        int diff = 0;
        for (int d = 0; d < DRAWS; d++) {
            for (int i = 0; i < N; i++) x[i] = 0.5f * test_rand_normal(&rng);
            diff += kiln_sample(a, x) != ref_sample(b, x);
        }
        CHECKF(diff == 0, "mix %d: %d of %d ids differ from the reference", mi, diff, DRAWS);
        kiln_sampler_close(a);
        ref_sampler_close(b);
    }
    free(x);
}

/* Chi-squared of `draws` ids from kiln_sample against the reference's exact distribution (bins with
 * expectation < 5 pooled); an id outside the reference's support fails at once. */
static void check_distribution(const char *name, const kiln_sampler_params *p, const float *x, int n, int draws,
                               const int32_t *window, int n_window) {
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(p, n, &s));
    ref_sampler *r = ref_sampler_open(p, n);
    for (int i = 0; i < n_window; i++) {
        kiln_sampler_accept(s, window[i]);
        ref_sampler_accept(r, window[i]);
    }
    double *prob = calloc((size_t)n, sizeof *prob);
    int *count = calloc((size_t)n, sizeof *count);
    ref_sample_distribution(r, x, prob);
    int outside = 0;
    const uint64_t t0 = kiln_now_ns();
    for (int d = 0; d < draws; d++) {
        const int32_t id = kiln_sample(s, x);
        if (id < 0 || id >= n || prob[id] == 0.0) outside++;
        else count[id]++;
    }
    int df, kept;
    double limit, support;
    const double chi2 = sample_case_chi2(prob, count, n, draws, &df, &limit, &kept, &support);
    printf("    %-26s %5d kept  chi2 %8.1f  df %5d  limit %8.1f  (%.0f us per call)\n", name, kept, chi2, df, limit,
           (double)(kiln_now_ns() - t0) / 1e3 / draws);
    CHECKF(outside == 0, "%s: %d draws outside the reference's support", name, outside);
    CHECKF(fabs(support - 1.0) < 1e-5, "%s: reference mass %g", name, support);
    CHECKF(chi2 <= limit, "%s: chi2 %.1f > %.1f (df %d)", name, chi2, limit, df);
    free(prob);
    free(count);
    ref_sampler_close(r);
    kiln_sampler_close(s);
}

TEST(sample_distribution_matches_reference) {
    const int n = 5000;
    float *x = malloc(151936 * sizeof *x);
    uint64_t rng = 7;
    sample_case_logits(x, n, 0, 2.0f, &rng);
    int32_t window[24];
    for (int i = 0; i < 24; i++) window[i] = i < 8 ? 0 : (int32_t)(test_rand_u64(&rng) % 64);
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    for (int i = 0; i < 8; i++) window[i] = best;
    kiln_sampler_params p = sample_case_params(1.0f, 0, 0.9f, 0.0f);
    p.seed = 1;
    check_distribution("t1 top-p 0.9 k off", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(1.0f, 0, 1.0f, 0.05f);
    check_distribution("min-p 0.05 only", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(0.7f, 0, 1.0f, 0.0f);
    check_distribution("t0.7 only", &p, x, n, 10000, NULL, 0);
    p = kiln_sampler_defaults();
    check_distribution("defaults", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(1.0f, 0, 0.9f, 0.0f);
    p.repeat_penalty = 1.2f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.3f, p.repeat_last_n = 24;
    check_distribution("penalties top-p 0.9", &p, x, n, 10000, window, 24);
    p.presence_penalty = -1.0f, p.frequency_penalty = -0.5f, p.repeat_penalty = 0.9f;
    check_distribution("negative penalties", &p, x, n, 10000, window + 8, 16); /* not the best id */
    sample_case_logits(x, 151936, 0, 3.0f, &rng);
    p = sample_case_params(1.0f, 0, 0.9f, 0.0f);
    check_distribution("151936: t1 top-p 0.9", &p, x, 151936, 2000, NULL, 0);
    free(x);
}

#if KILN_X86
/* The SIMD variants of the sampler's kernels, each beside the scalar reference. */
static const struct kernel_variant {
    const char *name;
    kiln_isa_level level;
    sample_exp_sum_fn exp_sum, exp_sum_fast;
    sample_hist_block_fn hist_block;
    sample_hist_moments_fn hist_moments;
    sample_prefix_block_fn prefix_block;
    sample_bin_find_fn bin_find;
} kernel_variants[] = {
    {"avx2", KILN_CPU_AVX2, sample_exp_sum_avx2, sample_exp_sum_fast_avx2, sample_hist_block_avx2,
     sample_hist_moments_avx2, sample_prefix_block_avx2, sample_bin_find_avx2},
    {"avx512", KILN_CPU_AVX512, sample_exp_sum_avx512, sample_exp_sum_fast_avx2, sample_hist_block_avx512,
     sample_hist_moments_avx512, sample_prefix_block_avx512, sample_bin_find_avx512},
};

/* The histogram's moments over NB blocks of x (bins of width w below m, from lo up): bins, per-bin sums and the
 * highest bin bit for bit against the reference; returns the number of differences. */
static int moments_differ(const struct kernel_variant *kv, const float *x, int nb, float m, float lo, float w) {
    enum { NQ = 4 * (HIST_BINS + HIST_DUMP) };
    static double mr[NQ], ma[NQ];
    static uint16_t br[SAMPLE_BLOCK], ba[SAMPLE_BLOCK];
    memset(mr, 0, sizeof mr);
    memset(ma, 0, sizeof ma);
    int bad = 0;
    for (int b = 0; b < nb; b++) {
        const int tr = sample_hist_moments_ref(x + (size_t)b * SAMPLE_BLOCK, m, lo, w, br, mr);
        const int ta = kv->hist_moments(x + (size_t)b * SAMPLE_BLOCK, m, lo, w, ba, ma);
        int top = -1;
        for (int j = 0; j < SAMPLE_BLOCK; j++) top = br[j] < HIST_BINS && br[j] > top ? br[j] : top;
        bad += memcmp(br, ba, sizeof br) != 0 || tr != ta || tr != top;
    }
    return bad + (memcmp(mr, ma, sizeof mr) != 0);
}

/* One variant against the references on random blocks: the exact sum and the histogram's block bit for bit
 * (terms, bins, sum), the bins' search equal, the fast sum within its bound. */
static void check_kernel_variant(const struct kernel_variant *kv) {
    enum { NB = 37, N = NB * SAMPLE_BLOCK };
    static float x[N], e1r[N], etr[N], e1a[N], eta[N];
    static uint16_t binr[N], bina[N];
    static int32_t idr[N], ida[N + 16];
    uint64_t rng = 3;
    for (int round = 0; round < 20; round++) {
        const float spread = round < 10 ? 3.0f : 40.0f;
        for (int i = 0; i < N; i++) x[i] = test_rand_normal(&rng) * spread;
        if (round % 3 == 0) x[test_rand_u64(&rng) % N] = -INFINITY;
        float bm[NB], m = -INFINITY;
        sample_block_max_ref(x, NB, bm);
        for (int b = 0; b < NB; b++) m = bm[b] > m ? bm[b] : m;
        for (int t = 0; t < 3; t++) {
            const float temp = t == 0 ? 1.0f : t == 1 ? 0.7f : 20.0f;
            const int nb = NB - round % 5; /* runs of several lengths, from a z carried in */
            const double z0 = round * 0.25;
            const double zr = sample_exp_sum_ref(x, nb, m, temp, z0), za = kv->exp_sum(x, nb, m, temp, z0);
            CHECKF(memcmp(&zr, &za, sizeof zr) == 0, "%s round %d temp %g: exp sum %.17g vs %.17g", kv->name, round,
                   (double)temp, za, zr);
            const double zq = kv->exp_sum_fast(x, nb, m, temp, z0);
            CHECKF(fabs(zq - zr) <= SAMPLE_FAST_EXP_ERR * zr, "%s round %d temp %g: fast exp sum %.17g vs %.17g",
                   kv->name, round, (double)temp, zq, zr);
            /* the histogram's blocks: terms, bins and sums bit for bit */
            const float lo = m - (t == 2 ? 30.0f : 8.0f), scale = (float)HIST_BINS / (m - lo);
            int bad = 0;
            double hr = 0.0, ha = 0.0;
            for (int b = 0; b < NB; b++) {
                const size_t o = (size_t)b * SAMPLE_BLOCK;
                hr = sample_hist_block_ref(x + o, m, temp, lo, scale, e1r + o, etr + o, binr + o, hr);
                ha = kv->hist_block(x + o, m, temp, lo, scale, e1a + o, eta + o, bina + o, ha);
            }
            for (int i = 0; i < N; i++)
                bad += memcmp(&e1r[i], &e1a[i], 4) != 0 || memcmp(&etr[i], &eta[i], 4) != 0 || binr[i] != bina[i];
            CHECKF(bad == 0, "%s round %d temp %g: %d histogram terms or bins differ", kv->name, round,
                   (double)temp, bad);
            CHECKF(memcmp(&hr, &ha, sizeof hr) == 0, "%s round %d: histogram sums %.17g vs %.17g", kv->name, round,
                   ha, hr);
            /* the moments: 32 or 4 units of bins (ids below lo and -inf dumped) */
            const float w = t == 2 ? 0x1p-7f : 0x1p-10f;
            CHECKF(moments_differ(kv, x, NB, m, m - (float)HIST_BINS * w, w) == 0,
                   "%s round %d w %g: moments or bins differ", kv->name, round, (double)w);
            /* an exact cumulative's blocks: the terms of the bins below kb over a normalizer */
            const int pkb = (int)(test_rand_u64(&rng) % (HIST_BINS + 2));
            const double norm = t == 0 ? 1.0 : 0.5 + 1e4 * (test_rand_u64(&rng) % 1000) / 1000.0;
            double pr = 0.25, pa = 0.25;
            float lr = 1.0f, la = 1.0f;
            for (int b = 0; b < NB; b++) {
                const size_t o = (size_t)b * SAMPLE_BLOCK;
                sample_prefix_block_ref(etr + o, binr + o, pkb, norm, &pr, &lr);
                kv->prefix_block(etr + o, binr + o, pkb, norm, &pa, &la);
            }
            CHECKF(memcmp(&pr, &pa, sizeof pr) == 0 && memcmp(&lr, &la, sizeof lr) == 0,
                   "%s round %d bin %d: prefix %.17g / %g vs %.17g / %g", kv->name, round, pkb, pa, (double)la, pr,
                   (double)lr);
            const double zs = sample_exp_sum_ref(x, NB, m, 1.0f, 0.0);
            CHECKF(memcmp(&hr, &zs, sizeof hr) == 0, "round %d: histogram sum %.17g vs exp sum %.17g", round, hr, zs);
            for (int kb = 0; kb <= HIST_BINS; kb += 1 + (int)(test_rand_u64(&rng) % 97)) {
                const int nr = sample_bin_find_ref(binr, N, (uint16_t)kb, idr);
                const int na = kv->bin_find(binr, N, (uint16_t)kb, ida);
                CHECKF(nr == na && memcmp(idr, ida, (size_t)nr * sizeof *idr) == 0, "%s bin %d: %d vs %d members",
                       kv->name, kb, na, nr);
            }
        }
    }
    /* every term is libm's expf bit for bit, the fast one within its bound: 64 equal terms sum exactly to 64
     * times the term */
    int wrong = 0, fast_wrong = 0;
    float worst = 0.0f, fast_worst = 0.0f, v64[SAMPLE_BLOCK];
    for (int i = 0; i < 60000; i++) {
        const uint64_t u = test_rand_u64(&rng);
        float v = -(float)(u % 1000003) * (112.0f / 1000003.0f);
        if (i % 4 == 1) v = -ldexpf((float)(u % 4096), -(int)(u >> 60) - 10); /* near 0 */
        if (i == 0) v = -INFINITY;
        for (int j = 0; j < SAMPLE_BLOCK; j++) v64[j] = v;
        const double got = kv->exp_sum(v64, 1, 0.0f, 1.0f, 0.0) / SAMPLE_BLOCK, want = (double)expf(v);
        if (got != want) { wrong++; worst = v; }
        const double fast = kv->exp_sum_fast(v64, 1, 0.0f, 1.0f, 0.0) / SAMPLE_BLOCK;
        const double err = fabs(fast - want), bound = v >= -87.33f ? SAMPLE_FAST_EXP_ERR * want : 1.2e-38;
        if (err > bound) { fast_wrong++; fast_worst = v; }
    }
    CHECKF(wrong == 0, "%s: %d terms differ from expf (e.g. at %a)", kv->name, wrong, (double)worst);
    CHECKF(fast_wrong == 0, "%s: %d fast terms outside the bound (e.g. at %a)", kv->name, fast_wrong,
           (double)fast_worst);
}
#endif

TEST(sample_kernels_match_scalar_reference) {
#if KILN_X86
    if (!kiln_cpu_has_avx2()) { test_skip("no AVX2 on this CPU"); return; }
    enum { NB = 37, N = NB * SAMPLE_BLOCK };
    static float x[N];
    uint64_t rng = 5;
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < N; i++) x[i] = test_rand_normal(&rng) * (round < 5 ? 3.0f : 40.0f);
        if (round % 3 == 0) x[test_rand_u64(&rng) % N] = -INFINITY;
        float bm_ref[NB], bm_fast[NB];
        sample_block_max_ref(x, NB, bm_ref);
        sample_block_max_avx2(x, NB, bm_fast);
        CHECKF(memcmp(bm_ref, bm_fast, sizeof bm_ref) == 0, "round %d: block maxima differ", round);
    }
    for (size_t i = 0; i < sizeof kernel_variants / sizeof kernel_variants[0]; i++) {
        if (kiln_cpu_level_best() < kernel_variants[i].level) {
            printf("  (%s kernels not checked: this CPU lacks them)\n", kernel_variants[i].name);
            continue;
        }
        check_kernel_variant(&kernel_variants[i]);
    }
#else
    test_skip("the SIMD variants are x86 only");
#endif
}

TEST(sample_allocates_nothing_per_call) {
    const int n = 49152;
    float *x = malloc((size_t)n * sizeof *x);
    uint64_t rng = 11;
    sample_case_logits(x, n, 0, 0.3f, &rng); /* flat: the bands reach far */
    sample_mix m[16];
    const int nm = sample_case_mixes(m, n);
    for (int mi = 0; mi < nm; mi++) {
        kiln_sampler *s;
        REQUIRE_OK(kiln_sampler_open(&m[mi].p, n, &s));
        int32_t ids[20];
        float lp[20];
        const uint64_t h0 = test_heap_calls();
        for (int i = 0; i < 5; i++) {
            const int32_t id = kiln_sample(s, x);
            kiln_sampler_accept(s, id);
            CHECK_EQ_INT(kiln_sampler_top(s, 20, ids, lp), 20);
            CHECK(isfinite(kiln_sampler_logprob(s, id)));
        }
        CHECKF(test_heap_calls() == h0, "mix '%s': %llu heap calls in kiln_sample", m[mi].name,
               (unsigned long long)(test_heap_calls() - h0));
        kiln_sampler_close(s);
    }
    free(x);
}

/* log-softmax at temperature 1 of the penalized logits, in double, straight from the definition */
static void ref_logprobs(const float *pen, int n, double *lp) {
    double m = -INFINITY, z = 0.0;
    for (int i = 0; i < n; i++) m = pen[i] > m ? pen[i] : m;
    for (int i = 0; i < n; i++) z += exp((double)pen[i] - m);
    for (int i = 0; i < n; i++) lp[i] = (double)pen[i] - m - log(z);
}

TEST(sample_top_logprobs_follow_the_penalized_softmax) {
    const int n = 3000;
    float *x = malloc((size_t)n * sizeof *x), *pen = malloc((size_t)n * sizeof *pen);
    double *lp = malloc((size_t)n * sizeof *lp);
    uint64_t rng = 5;
    sample_case_logits(x, n, 1, 2.0f, &rng); /* ties: the order must put the lower id first */
    kiln_sampler_params p = sample_case_params(0.8f, 0, 0.9f, 0.0f);
    p.repeat_penalty = 1.25f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f, p.repeat_last_n = 8;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, n, &s));
    int32_t ids[16];
    float got[16];
    CHECK_EQ_INT(kiln_sampler_top(s, 16, ids, got), 0); /* before any kiln_sample */
    CHECK(isnan(kiln_sampler_logprob(s, 0)));
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    const int32_t window[8] = {best, best, best, 7, 7, 9, best, 2999};
    for (int i = 0; i < 8; i++) kiln_sampler_accept(s, window[i]);
    memcpy(pen, x, (size_t)n * sizeof *pen);
    const int counted[4][2] = {{best, 4}, {7, 2}, {9, 1}, {2999, 1}};
    for (int i = 0; i < 4; i++) {
        float l = pen[counted[i][0]];
        l = l <= 0 ? l * 1.25f : l / 1.25f;
        pen[counted[i][0]] = l - (float)counted[i][1] * 0.25f - 0.5f;
    }
    ref_logprobs(pen, n, lp);
    const int32_t chosen = kiln_sample(s, x);
    kiln_sampler_accept(s, chosen); /* allowed between the call and the logprobs */
    CHECK_EQ_INT(kiln_sampler_top(s, 16, ids, got), 16);
    for (int i = 0; i < 16; i++) {
        CHECKF(fabs(got[i] - lp[ids[i]]) < 1e-5, "rank %d id %d: logprob %g, reference %g", i, ids[i],
               (double)got[i], lp[ids[i]]);
        if (i) CHECKF(pen[ids[i]] < pen[ids[i - 1]] || (pen[ids[i]] == pen[ids[i - 1]] && ids[i] > ids[i - 1]),
                      "rank %d: id %d after id %d", i, ids[i], ids[i - 1]);
    }
    int above = 0; /* nothing outside the list beats its last entry */
    for (int i = 0; i < n; i++) above += pen[i] > pen[ids[15]];
    CHECKF(above <= 15, "%d ids above the 16th", above);
    CHECKF(fabs(kiln_sampler_logprob(s, chosen) - lp[chosen]) < 1e-5, "chosen %d: %g vs %g", chosen,
           (double)kiln_sampler_logprob(s, chosen), lp[chosen]);
    CHECKF(fabs(kiln_sampler_logprob(s, best) - lp[best]) < 1e-5, "penalized best: %g vs %g",
           (double)kiln_sampler_logprob(s, best), lp[best]);
    CHECK(isnan(kiln_sampler_logprob(s, n)));
    int32_t *all_ids = malloc((size_t)n * sizeof *all_ids);
    float *all_lp = malloc((size_t)n * sizeof *all_lp);
    CHECK_EQ_INT(kiln_sampler_top(s, n + 10, all_ids, all_lp), n); /* clamped to the vocabulary */
    double mass = 0.0;
    for (int i = 0; i < n; i++) mass += exp((double)all_lp[i]);
    CHECKF(fabs(mass - 1.0) < 1e-4, "the logprobs of the whole vocabulary sum to %g", mass);
    free(all_ids);
    free(all_lp);
    kiln_sampler_close(s);
    free(x);
    free(pen);
    free(lp);
}

TEST(sample_presence_and_frequency_penalties_as_llama_cpp) {
    /* logits8: 1 -> 3.0, 3 -> 3.0, 6 -> 2.9. Window: 1 twice, 3 once; repeat 1.5, frequency 0.5, presence 0.25:
     * id 1: 3/1.5 - 2*0.5 - 0.25 = 0.75; id 3: 3/1.5 - 0.5 - 0.25 = 1.25; 6 untouched: 2.9 wins greedily. */
    kiln_sampler_params p = sample_case_params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 1.5f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.25f, p.repeat_last_n = 4;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    kiln_sampler_accept(s, 1);
    kiln_sampler_accept(s, 1);
    kiln_sampler_accept(s, 3);
    CHECK_EQ_INT(kiln_sample(s, logits8), 6);
    const float l6 = kiln_sampler_logprob(s, 6);
    CHECKF(fabsf(l6 - kiln_sampler_logprob(s, 1) - (2.9f - 0.75f)) < 1e-5f, "id 1 not at 0.75");
    CHECKF(fabsf(l6 - kiln_sampler_logprob(s, 3) - (2.9f - 1.25f)) < 1e-5f, "id 3 not at 1.25");
    /* a negative logit is multiplied by the repeat penalty: id 4 (-1, twice) -> -1.5 - 2*0.5 - 0.25 = -2.75 */
    kiln_sampler_accept(s, 4);
    kiln_sampler_accept(s, 4); /* window now 1, 3, 4, 4 */
    kiln_sample(s, logits8);
    CHECKF(fabsf(kiln_sampler_logprob(s, 6) - kiln_sampler_logprob(s, 4) - (2.9f + 2.75f)) < 1e-5f,
           "id 4 not at -2.75 (count 2)");
    kiln_sampler_close(s);
    /* a negative presence penalty promotes: id 2 (2.0) + 1.5 = 3.5 beats 3.0 */
    p = sample_case_params(0.0f, 0, 1.0f, 0.0f);
    p.presence_penalty = -1.5f;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    kiln_sampler_accept(s, 2);
    CHECK_EQ_INT(kiln_sample(s, logits8), 2);
    kiln_sampler_close(s);
}

TEST(sample_penalty_params_are_validated) {
    kiln_sampler *s = (kiln_sampler *)1;
    const float bad[] = {2.5f, -2.01f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        kiln_sampler_params p = kiln_sampler_defaults();
        p.presence_penalty = bad[i];
        CHECK_EQ_INT(kiln_sampler_open(&p, 8, &s), KILN_ERR_INVALID_ARG);
        CHECKF(strstr(kiln_last_error(), "presence penalty") != NULL, "message: %s", kiln_last_error());
        CHECK(s == NULL);
        p = kiln_sampler_defaults();
        p.frequency_penalty = bad[i];
        CHECK_EQ_INT(kiln_sampler_open(&p, 8, &s), KILN_ERR_INVALID_ARG);
        CHECKF(strstr(kiln_last_error(), "frequency penalty") != NULL, "message: %s", kiln_last_error());
    }
    kiln_sampler_params p = kiln_sampler_defaults();
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    REQUIRE_OK(kiln_sampler_open(&p, 8, &s));
    kiln_sampler_close(s);
}

TEST(sample_survives_inf_and_nan_logits) {
    /* garbage in (an engine bug upstream): any id in range, no out-of-bounds access, for every mix */
    const int n = 300;
    float x[300];
    uint64_t rng = 9;
    sample_mix m[16];
    const int nm = sample_case_mixes(m, n);
    for (int round = 0; round < 6; round++) {
        for (int i = 0; i < n; i++) x[i] = test_rand_normal(&rng);
        if (round == 0) x[5] = x[77] = INFINITY;
        if (round == 1) x[0] = NAN;
        if (round == 2) for (int i = 0; i < n; i++) x[i] = NAN;
        if (round == 3) for (int i = 0; i < n; i++) x[i] = -INFINITY;
        if (round == 4) { x[3] = INFINITY; x[4] = NAN; x[200] = -INFINITY; }
        if (round == 5) for (int i = 0; i < n; i += 2) x[i] = INFINITY;
        for (int mi = 0; mi < nm; mi++) {
            kiln_sampler *s;
            REQUIRE_OK(kiln_sampler_open(&m[mi].p, n, &s));
            for (int d = 0; d < 4; d++) {
                const int32_t id = kiln_sample(s, x);
                CHECKF(id >= 0 && id < n, "round %d mix '%s': id %d", round, m[mi].name, id);
                kiln_sampler_accept(s, id);
            }
            kiln_sampler_close(s);
        }
    }
}

TEST(sample_boundary_decisions_use_the_exact_normalizer) {
    /* min-p without top-p decides on expf(logit - max) >= min_p, the definition on p >= p_max * min_p with
     * p = expf(...) / Z: the two can disagree by an ulp right at the threshold, which is where the exact
     * normalizer must take over. Ids whose expf(logit) straddles min_p ulp by ulp, plus filler for Z. */
    const int n = 4000;
    float *x = malloc((size_t)n * sizeof *x);
    uint64_t rng = 17;
    int diffs = 0, calls = 0;
    for (int round = 0; round < 40; round++) {
        const float min_p = 0.05f + 0.01f * (float)round;
        x[0] = 0.0f;
        float v = logf(min_p);
        while (expf(v) >= min_p) v = nextafterf(v, -INFINITY);
        for (int i = 1; i < 60; i++) { x[i] = v; v = nextafterf(v, INFINITY); } /* expf crosses min_p here */
        for (int i = 60; i < n; i++) x[i] = logf(min_p) - 0.5f - fabsf(test_rand_normal(&rng)) * 3.0f;
        kiln_sampler_params p = sample_case_params(1.0f, 0, 1.0f, min_p);
        p.seed = test_rand_u64(&rng);
        kiln_sampler *a;
        REQUIRE_OK(kiln_sampler_open(&p, n, &a));
        ref_sampler *b = ref_sampler_open(&p, n);
        for (int d = 0; d < 20; d++, calls++) diffs += kiln_sample(a, x) != ref_sample(b, x);
        kiln_sampler_close(a);
        ref_sampler_close(b);
    }
    CHECKF(diffs == 0, "%d of %d ids differ from the reference", diffs, calls);
    free(x);
}

/* A sampler reconfigured with other parameters draws exactly what one freshly opened with them draws, allocates
 * nothing, and refuses a window longer than the one it was opened with (staying as it was). */
TEST(sample_reconfigure_equals_a_fresh_sampler) {
    enum { NV = 4096, STEPS = 200 };
    float *lg = malloc(NV * sizeof(float));
    REQUIRE(lg);
    uint64_t rs = 42;
    kiln_sampler_params big = kiln_sampler_defaults();
    big.repeat_last_n = 256;
    kiln_sampler *re, *fresh;
    REQUIRE_OK(kiln_sampler_open(&big, NV, &re));
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = 1.0f, p.top_k = 0, p.top_p = 0.9f, p.min_p = 0.0f, p.seed = 7;
    p.repeat_penalty = 1.3f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f, p.repeat_last_n = 32;
    REQUIRE_OK(kiln_sampler_open(&p, NV, &fresh));
    for (int i = 0; i < 50; i++) kiln_sampler_accept(re, i); /* an earlier request's window */
    const uint64_t h0 = test_heap_calls();
    REQUIRE_OK(kiln_sampler_reconfigure(re, &p));
    CHECK_EQ_INT(test_heap_calls() - h0, 0);
    int differ = 0;
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < NV; i++) lg[i] = 3.0f * test_rand_normal(&rs);
        const int32_t a = kiln_sample(re, lg), b = kiln_sample(fresh, lg);
        differ += a != b;
        kiln_sampler_accept(re, a);
        kiln_sampler_accept(fresh, b);
    }
    CHECKF(differ == 0, "%d of %d draws differ from a fresh sampler", differ, STEPS);
    kiln_sampler_params too_long = p;
    too_long.repeat_last_n = 257;
    CHECK_EQ_INT(kiln_sampler_reconfigure(re, &too_long), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "257") != NULL);
    too_long.repeat_last_n = 8, too_long.top_p = 1.5f;
    CHECK_EQ_INT(kiln_sampler_reconfigure(re, &too_long), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_sampler_check(&too_long, NV), KILN_ERR_INVALID_ARG);
    CHECK_OK(kiln_sampler_check(&p, NV));
    kiln_sampler_close(re);
    kiln_sampler_close(fresh);
    free(lg);
}
