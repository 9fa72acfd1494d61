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
