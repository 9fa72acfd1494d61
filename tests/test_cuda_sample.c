/*
 * test_cuda_sample.c — the device sampler (cuda_sample.cu): the same id as the reference chain given the same
 * spec (penalties, cuts, u) on random logits of every shape, the distribution of its draws against the
 * reference's exact distribution (chi-squared), and KILN_OUT_SAMPLE rows through a CUDA session: valid ids,
 * the host path's ids, nothing allocated, loaded or captured after open.
 */
#include "test.h"
#include "test_gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "sample/sample_spec.h"
#include "sample_cases.h"
#include "sample_ref.h"

#ifdef KILN_HAVE_CUDA

/* rows specs drawn in order from s (its window as it is), each row a copy of x; the device's ids into ids (and
 * into one_block, unless NULL, which rows the whole chain on one block drew). */
static bool device_draws(kiln_sampler *s, const float *x, int n, int rows, kiln_sample_spec *specs, float *lg,
                         int32_t *ids, int32_t *one_block) {
    for (int r = 0; r < rows; r++) {
        uint64_t before;
        if (!kiln_sampler_spec(s, &specs[r], &before)) return false;
        memcpy(lg + (size_t)r * n, x, sizeof(float) * (size_t)n);
        ids[r] = -1;
    }
    const kiln_status st = kiln_cuda_test_sample(specs, rows, lg, n, ids, one_block);
    CHECKF(st == KILN_OK, "device sampler: %s", kiln_last_error());
    return st == KILN_OK;
}

/* The mixes whose rows the multi-block passes resolve on their own on logits without crowds of equal values
 * (normal, spiked, masked): the defaults, top-k off with top-p (and min-p), temperature alone. */
static bool passes_resolve(const char *mix) {
    static const char *const m[] = {"defaults", "t1 top-p 0.9 k off", "t0.7 only", "t3 only", "min-p 0.1 t1.2",
                                    "top-p 0.9 min-p 0.05", "penalties top-p 0.9", "penalties defaults"};
    for (size_t i = 0; i < sizeof m / sizeof *m; i++)
        if (!strcmp(mix, m[i])) return true;
    return false;
}

/* Every mix on logits of every shape: the device's id equals the reference chain's given the same spec
 * (the same u), but for draws within rounding of a boundary (a few in ten thousand at most). On the large
 * vocabularies the passes (not the one-block chain) draw every row of the common mixes on logits without
 * crowds of ties, and the one-block chain draws some of the tied ones (both paths are exercised). */
TEST(cuda_sample_same_ids_as_reference_given_u) {
    if (!test_gpu_ready()) return;
    static const int sizes[] = {1, 7, 1000, 5000, 49152, 128256};
    const int max_rows = 64;
    float *x = malloc(sizeof(float) * 128256);
    float *lg = malloc(sizeof(float) * 128256 * 8); /* 8 rows of the largest, 64 of 5000 */
    kiln_sample_spec *specs = malloc(sizeof *specs * max_rows);
    int32_t ids[64], one_block[64];
    uint64_t rng = 2024;
    sample_mix m[16];
    long total = 0, diffs = 0, n_one = 0, n_one_common = 0, n_one_ties = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int n = sizes[si], big = n > 5000, rows = big ? 8 : 64, nm = sample_case_mixes(m, n);
        for (int shape = 0; shape < (big ? 4 : 5); shape++)
            for (int sc = 0; sc < (big ? 1 : 2); sc++) {
                sample_case_logits(x, n, shape, sc ? 4.0f : 1.0f, &rng);
                for (int mi = 0; mi < nm; mi++) {
                    m[mi].p.seed = test_rand_u64(&rng);
                    kiln_sampler *s;
                    REQUIRE_OK(kiln_sampler_open(&m[mi].p, n, &s));
                    ref_sampler *r = ref_sampler_open(&m[mi].p, n);
                    int best = 0;
                    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
                    for (int i = 0; i < 12; i++)
                        kiln_sampler_accept(s, i % 3 == 0 ? best : (int32_t)(test_rand_u64(&rng) % (uint64_t)n));
                    REQUIRE(device_draws(s, x, n, rows, specs, lg, ids, one_block));
                    int d = 0;
                    for (int k = 0; k < rows; k++) {
                        n_one += one_block[k];
                        if (big && shape != 1 && passes_resolve(m[mi].name)) n_one_common += one_block[k];
                        if (big && shape == 1) n_one_ties += one_block[k];
                        const int32_t want = ref_sample_given(r, x, specs[k].pen_id, specs[k].pen_count, specs[k].n_pen,
                                                              specs[k].u);
                        d += ids[k] != want;
                        if (ids[k] != want && diffs + d <= 5)
                            printf("    vocab %d shape %d mix '%s' u %.17g: device %d, reference %d\n", n, shape,
                                   m[mi].name, specs[k].u, ids[k], want);
                    }
                    total += rows, diffs += d;
                    kiln_sampler_close(s);
                    ref_sampler_close(r);
                }
            }
    }
    printf("    %ld device samples compared, %ld differ; %ld drawn by the one-block chain (%ld of the common mixes, "
           "%ld tied)\n", total, diffs, n_one, n_one_common, n_one_ties);
    CHECKF(diffs * 2000 <= total, "%ld of %ld device ids differ from the reference's", diffs, total);
    CHECKF(n_one_common == 0, "%ld rows of the common mixes fell back to the one-block chain", n_one_common);
    CHECKF(n_one_ties > 0, "no tied row reached the one-block chain: it went untested");
    free(x), free(lg), free(specs);
}

/* Chi-squared of `draws` device draws (rows of one spec each, in batches) against the reference's exact
 * distribution; an id outside its support fails at once. */
static void device_distribution(const char *name, const kiln_sampler_params *p, const float *x, int n, int draws,
                                const int32_t *window, int n_window) {
    const int batch = n > 50000 ? 128 : 1000;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(p, n, &s));
    ref_sampler *r = ref_sampler_open(p, n);
    for (int i = 0; i < n_window; i++) kiln_sampler_accept(s, window[i]), ref_sampler_accept(r, window[i]);
    double *prob = calloc((size_t)n, sizeof *prob);
    int *count = calloc((size_t)n, sizeof *count);
    float *lg = malloc(sizeof(float) * (size_t)n * batch);
    kiln_sample_spec *specs = malloc(sizeof *specs * batch);
    int32_t *ids = malloc(sizeof *ids * batch);
    ref_sample_distribution(r, x, prob);
    int outside = 0;
    for (int done = 0; done < draws; done += batch) {
        const int b = draws - done < batch ? draws - done : batch;
        REQUIRE(device_draws(s, x, n, b, specs, lg, ids, NULL));
        for (int k = 0; k < b; k++) {
            if (ids[k] < 0 || ids[k] >= n || prob[ids[k]] == 0.0) outside++;
            else count[ids[k]]++;
        }
    }
    int df, kept;
    double limit, support;
    const double chi2 = sample_case_chi2(prob, count, n, draws, &df, &limit, &kept, &support);
    printf("    %-30s %6d kept  chi2 %8.1f  df %5d  limit %8.1f\n", name, kept, chi2, df, limit);
    CHECKF(outside == 0, "%s: %d device draws outside the reference's support", name, outside);
    CHECKF(chi2 <= limit, "%s: chi2 %.1f > %.1f (df %d)", name, chi2, limit, df);
    free(prob), free(count), free(lg), free(specs), free(ids);
    ref_sampler_close(r);
    kiln_sampler_close(s);
}

TEST(cuda_sample_distribution_matches_reference) {
    if (!test_gpu_ready()) return;
    const int n = 5000;
    float *x = malloc(sizeof(float) * 128256);
    uint64_t rng = 77;
    sample_case_logits(x, n, 0, 2.0f, &rng);
    int32_t window[24];
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    for (int i = 0; i < 24; i++) window[i] = i < 8 ? best : (int32_t)(test_rand_u64(&rng) % 64);
    kiln_sampler_params p = sample_case_params(0.7f, 0, 1.0f, 0.0f);
    device_distribution("t0.7 only", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(1.0f, 40, 1.0f, 0.0f);
    device_distribution("top-k 40 t1", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(1.3f, 2000, 1.0f, 0.0f);
    device_distribution("top-k 2000 t1.3 (> shared)", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(1.0f, 0, 0.9f, 0.0f);
    device_distribution("top-p 0.9 k off", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(1.0f, 0, 1.0f, 0.05f);
    device_distribution("min-p 0.05 only", &p, x, n, 10000, NULL, 0);
    p = kiln_sampler_defaults();
    device_distribution("defaults", &p, x, n, 10000, NULL, 0);
    p = sample_case_params(1.0f, 0, 0.9f, 0.0f);
    p.repeat_penalty = 1.2f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.3f, p.repeat_last_n = 24;
    device_distribution("penalties top-p 0.9", &p, x, n, 10000, window, 24);
    sample_case_logits(x, 128256, 0, 1.0f, &rng);
    p = sample_case_params(0.8f, 0, 0.95f, 0.0f);
    device_distribution("128256 flat: t0.8 top-p 0.95", &p, x, 128256, 1024, NULL, 0);
    sample_case_logits(x, 128256, 1, 0.5f, &rng); /* ties of thousands: the K splits */
    p = sample_case_params(1.0f, 0, 0.5f, 0.0f);
    device_distribution("128256 ties: top-p 0.5", &p, x, 128256, 1024, NULL, 0);
    free(x);
}

/* KILN_OUT_SAMPLE rows through a CUDA session: one row (the decode graph) and two sequences (the eager path),
 * against a second CUDA session whose rows ask for logits and sample on the host with twin samplers: the
 * same ids (the same device logits; a boundary within rounding may differ once); after open no heap call, no
 * device allocation, no module load, no graph capture. */
TEST(cuda_session_samples_on_the_device) {
    if (!test_gpu_ready()) return;
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), &m));
    const int V = m->hp.n_vocab;
    const kiln_session_options o = {.n_ctx = 256, .n_seq = 2, .device = KILN_DEVICE_CUDA};
    kiln_session *sa, *sb;
    REQUIRE_OK(kiln_session_open(m, &o, &sa));
    REQUIRE_OK(kiln_session_open(m, &o, &sb));
    kiln_sampler_params p = sample_case_params(0.8f, 0, 0.95f, 0.05f);
    p.repeat_penalty = 1.1f, p.presence_penalty = 0.3f, p.repeat_last_n = 32;
    kiln_sampler *smp[2][2];
    for (int q = 0; q < 2; q++) {
        p.seed = 100 + (uint64_t)q;
        REQUIRE_OK(kiln_sampler_open(&p, V, &smp[0][q]));
        REQUIRE_OK(kiln_sampler_open(&p, V, &smp[1][q]));
    }
    const int32_t prompt[5] = {1, 147, 201, 282, 215};
    REQUIRE_OK(kiln_seq_prefill(sa, 0, prompt, 5, NULL));
    REQUIRE_OK(kiln_seq_prefill(sb, 0, prompt, 5, NULL));
    REQUIRE_OK(kiln_seq_prefill(sa, 1, prompt, 3, NULL));
    REQUIRE_OK(kiln_seq_prefill(sb, 1, prompt, 3, NULL));
    int32_t tok[2] = {215, 282};
    int diff = 0, n_cmp = 0;
    const uint64_t heap0 = test_heap_calls();
    for (int step = 0; step < 48; step++) {
        const int k = step < 24 ? 1 : 2; /* one row: the graph; two: the eager path */
        kiln_batch_row ra[2], rb[2];
        kiln_batch_output oa[2], ob[2];
        for (int q = 0; q < k; q++) {
            ra[q] = (kiln_batch_row){.seq = q, .id = tok[q], .out = KILN_OUT_SAMPLE, .sampler = smp[0][q]};
            rb[q] = (kiln_batch_row){.seq = q, .id = tok[q], .out = KILN_OUT_LOGITS};
        }
        REQUIRE_OK(kiln_batch(sa, ra, (size_t)k, oa, 2, NULL));
        REQUIRE_OK(kiln_batch(sb, rb, (size_t)k, ob, 2, NULL));
        for (int q = 0; q < k; q++) {
            REQUIRE(oa[q].id >= 0 && oa[q].id < V && oa[q].logits == NULL);
            const int32_t host = kiln_sample(smp[1][q], ob[q].logits);
            diff += host != oa[q].id, n_cmp++;
            kiln_sampler_accept(smp[0][q], oa[q].id);
            kiln_sampler_accept(smp[1][q], oa[q].id); /* both follow the device's id */
            tok[q] = oa[q].id;
        }
    }
    const uint64_t heap = test_heap_calls() - heap0;
    kiln_stats st;
    kiln_session_stats(sa, &st);
    printf("    %d of %d device-sampled ids differ from the host's\n", diff, n_cmp);
    CHECKF(diff <= 1, "%d of %d device-sampled ids differ from the host path's", diff, n_cmp);
    CHECK_NOTHING_AFTER_OPEN("after open", st, heap);
    for (int q = 0; q < 2; q++) kiln_sampler_close(smp[0][q]), kiln_sampler_close(smp[1][q]);
    kiln_session_close(sa);
    kiln_session_close(sb);
    kiln_model_close(m);
}

#else
TEST(cuda_sample_not_built_skips) { (void)test_gpu_ready(); }
#endif
