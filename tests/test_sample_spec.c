/*
 * test_sample_spec.c — the host side of sampling on a device: kiln_sampler_spec takes the uniform draw exactly
 * when kiln_sample would and carries the window's penalties, so that the reference chain given the spec picks
 * kiln_sample's id with the same seed; a window too wide for a spec and a failed forward leave the sampler as
 * it was; and the session routes KILN_OUT_SAMPLE rows to a backend that samples (here the CPU backend wrapped
 * by a test table that samples with the reference), with the same ids as the host path.
 */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/model.h"
#include "sample/sample_spec.h"
#include "sample_cases.h"
#include "sample_ref.h"
#include "session/session_internal.h"

/* Runs `draws` samples of mix p on logits x twice: kiln_sample on one sampler, and kiln_sampler_spec + the
 * reference given the spec on a twin; each id is accepted into its own sampler's window. Returns the number of
 * differing ids. */
static int spec_vs_sample(const kiln_sampler_params *p, const float *x, int n, int draws, uint64_t *rng) {
    kiln_sampler *a, *b;
    if (kiln_sampler_open(p, n, &a) != KILN_OK || kiln_sampler_open(p, n, &b) != KILN_OK) {
        CHECKF(0, "open: %s", kiln_last_error());
        return 1;
    }
    ref_sampler *r = ref_sampler_open(p, n);
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    for (int i = 0; i < 12; i++) {
        const int32_t id = i % 3 == 0 ? best : (int32_t)(test_rand_u64(rng) % (uint64_t)n);
        kiln_sampler_accept(a, id);
        kiln_sampler_accept(b, id);
    }
    static kiln_sample_spec spec;
    int diff = 0;
    for (int d = 0; d < draws; d++) {
        uint64_t before;
        const int32_t ia = kiln_sample(a, x);
        CHECK(kiln_sampler_spec(b, &spec, &before));
        if (p->temperature <= 0.0f) CHECKF(spec.u == 0.0, "greedy drew %g", spec.u);
        const int32_t ib = ref_sample_given(r, x, spec.pen_id, spec.pen_count, spec.n_pen, spec.u);
        diff += ia != ib;
        kiln_sampler_accept(a, ia);
        kiln_sampler_accept(b, ia); /* the same windows, whatever was drawn */
    }
    ref_sampler_close(r);
    kiln_sampler_close(a);
    kiln_sampler_close(b);
    return diff;
}

TEST(sample_spec_same_ids_as_kiln_sample) {
    static const int sizes[] = {1, 7, 64, 1000, 32000};
    float *x = malloc(32000 * sizeof *x);
    uint64_t rng = 99;
    sample_mix m[16];
    long calls = 0, diffs = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int n = sizes[si], nm = sample_case_mixes(m, n);
        for (int shape = 0; shape < 4; shape++) {
            sample_case_logits(x, n, shape, 2.0f, &rng);
            for (int mi = 0; mi < nm; mi++) {
                m[mi].p.seed = test_rand_u64(&rng);
                const int draws = n >= 32000 ? 3 : 12, d = spec_vs_sample(&m[mi].p, x, n, draws, &rng);
                CHECKF(d == 0, "vocab %d shape %d mix '%s': %d of %d ids differ", n, shape, m[mi].name, d, draws);
                calls += draws, diffs += d;
            }
        }
    }
    printf("    %ld samples compared, %ld differ\n", calls, diffs);
    free(x);
}

/* The spec's fields: parameters, the distinct window ids with counts (out-of-vocabulary ids left out), no
 * penalties when all are off, top-k >= the vocabulary as off; the logprob view is forgotten. */
TEST(sample_spec_carries_params_and_window) {
    kiln_sampler_params p = sample_case_params(0.7f, 50, 0.9f, 0.02f);
    p.repeat_penalty = 1.2f, p.presence_penalty = 0.3f, p.frequency_penalty = 0.1f, p.repeat_last_n = 8;
    kiln_sampler *s;
    REQUIRE_OK(kiln_sampler_open(&p, 40, &s));
    const int32_t win[10] = {3, 5, 3, 99, 7, 3, 5, -1, 9, 9}; /* the last 8: 3 3 5 7 3 5 -1 9 9 -> ring */
    for (int i = 0; i < 10; i++) kiln_sampler_accept(s, win[i]);
    static kiln_sample_spec sp;
    uint64_t before;
    float x[40];
    for (int i = 0; i < 40; i++) x[i] = (float)(i % 7);
    (void)kiln_sample(s, x);
    int32_t ids[4];
    float lp[4];
    CHECK_EQ_INT(kiln_sampler_top(s, 4, ids, lp), 4);
    REQUIRE(kiln_sampler_spec(s, &sp, &before));
    CHECK_EQ_INT(kiln_sampler_top(s, 4, ids, lp), 0);
    CHECK(isnan(kiln_sampler_logprob(s, 3)));
    CHECK_EQ_INT(sp.mode, KILN_SPEC_SAMPLE);
    CHECK_EQ_INT(sp.top_k, 50 < 40 ? 50 : 0);
    CHECK(sp.temperature == 0.7f && sp.top_p == 0.9f && sp.min_p == 0.02f);
    CHECK(sp.repeat == 1.2f && sp.presence == 0.3f && sp.frequency == 0.1f);
    CHECK(sp.u >= 0.0 && sp.u < 1.0);
    /* window (last 8 accepted): 3 99 7 3 5 -1 9 9 -> 3 x2, 7, 5, 9 x2 (99 and -1 outside) */
    int count[40] = {0};
    CHECK_EQ_INT(sp.n_pen, 4);
    for (int i = 0; i < sp.n_pen; i++) {
        REQUIRE(sp.pen_id[i] >= 0 && sp.pen_id[i] < 40);
        CHECKF(count[sp.pen_id[i]] == 0, "id %d twice", sp.pen_id[i]);
        count[sp.pen_id[i]] = sp.pen_count[i];
    }
    CHECK(count[3] == 2 && count[7] == 1 && count[5] == 1 && count[9] == 2);
    p.repeat_penalty = 1.0f, p.presence_penalty = 0.0f, p.frequency_penalty = 0.0f, p.top_k = 0;
    REQUIRE_OK(kiln_sampler_reconfigure(s, &p));
    kiln_sampler_accept(s, 3);
    REQUIRE(kiln_sampler_spec(s, &sp, &before));
    CHECK_EQ_INT(sp.n_pen, 0);
    CHECK_EQ_INT(sp.top_k, 0);
    kiln_sampler_close(s);
}

/* A window of more distinct ids than a spec holds: false, and the RNG untouched (the next kiln_sample equals a
 * twin's); kiln_sampler_spec_undo puts a draw back. */
TEST(sample_spec_wide_window_and_undo_leave_the_rng) {
    kiln_sampler_params p = sample_case_params(1.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 1.1f, p.repeat_last_n = 2 * KILN_SAMPLE_SPEC_MAX_PEN, p.seed = 5;
    const int n = 4096;
    float *x = malloc(n * sizeof *x);
    uint64_t rng = 3;
    sample_case_logits(x, n, 0, 1.0f, &rng);
    kiln_sampler *a, *b;
    REQUIRE_OK(kiln_sampler_open(&p, n, &a));
    REQUIRE_OK(kiln_sampler_open(&p, n, &b));
    for (int i = 0; i < KILN_SAMPLE_SPEC_MAX_PEN + 1; i++) kiln_sampler_accept(a, i), kiln_sampler_accept(b, i);
    static kiln_sample_spec sp;
    uint64_t before;
    CHECK(!kiln_sampler_spec(a, &sp, &before));
    CHECK_EQ_INT(kiln_sample(a, x), kiln_sample(b, x));
    kiln_sampler_reset(a), kiln_sampler_reset(b);
    kiln_sampler_accept(a, 1), kiln_sampler_accept(b, 1);
    for (int i = 0; i < 5; i++) {
        REQUIRE(kiln_sampler_spec(a, &sp, &before));
        kiln_sampler_spec_undo(a, before);
    }
    for (int i = 0; i < 20; i++) CHECK_EQ_INT(kiln_sample(a, x), kiln_sample(b, x));
    kiln_sampler_close(a);
    kiln_sampler_close(b);
    free(x);
}

/* ---- the session with a backend that samples: the CPU backend behind a table that says `samples` and
 * answers KILN_BK_OUT_SAMPLE rows with the reference chain given the spec */

static ref_sampler *spec_ref;     /* the parameters of the test's samplers */
static int spec_vocab, spec_rows, spec_calls, spec_fail_at;

static kiln_status spec_forward(void *state, const kiln_backend_batch *b) {
    if (spec_fail_at && ++spec_calls == spec_fail_at) return kiln_fail(KILN_ERR_DEVICE, "test backend: forward fails");
    kiln_backend_row rows[64];
    KILN_ASSERT(b->n <= 64);
    for (int i = 0; i < b->n; i++) {
        rows[i] = b->rows[i];
        if (rows[i].out == KILN_BK_OUT_SAMPLE) rows[i].out = KILN_BK_OUT_LOGITS;
    }
    kiln_backend_batch c = *b;
    c.rows = rows;
    KILN_TRY(kiln_backend_cpu.forward(state, &c));
    for (int i = 0, k = 0; i < b->n; i++) {
        if (b->rows[i].out == KILN_BK_OUT_NONE) continue;
        const kiln_sample_spec *sp = b->rows[i].spec;
        if (b->rows[i].out == KILN_BK_OUT_SAMPLE) {
            b->argmax[k] = ref_sample_given(spec_ref, b->logits + (size_t)k * (size_t)spec_vocab, sp->pen_id,
                                            sp->pen_count, sp->n_pen, sp->u);
            spec_rows++;
        }
        k++;
    }
    return KILN_OK;
}

static const kiln_backend_ops *spec_ops(void) {
    static kiln_backend_ops ops;
    ops = kiln_backend_cpu;
    ops.name = "cpu-samples";
    ops.samples = true;
    ops.forward = spec_forward;
    return &ops;
}

/* Two sequences decode 24 steps with KILN_OUT_SAMPLE rows in one session over the sampling table and in one
 * over the plain CPU backend (the host path), samplers of the same seeds: the same ids, every row sampled by
 * the backend; a forward that fails midway gives the draws back (the ids that follow still agree); a window
 * too wide for a spec goes to the host path. */
TEST(session_samples_on_a_backend_that_can) {
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), &m));
    spec_vocab = m->hp.n_vocab;
    const kiln_session_options o = {.n_ctx = 64, .n_threads = 2, .max_batch = 8, .n_seq = 2, .device = KILN_DEVICE_CPU};
    for (int variant = 0; variant < 2; variant++) { /* 0: specs; 1: a window wider than a spec holds */
        kiln_sampler_params p = sample_case_params(1.0f, 0, 0.95f, 0.02f);
        p.repeat_penalty = 1.2f, p.presence_penalty = 0.4f, p.repeat_last_n = variant ? 2 * KILN_SAMPLE_SPEC_MAX_PEN : 16;
        spec_ref = ref_sampler_open(&p, spec_vocab);
        kiln_session *sa, *sb;
        REQUIRE_OK(kiln_session_open_ops(m, &o, spec_ops(), &sa));
        REQUIRE_OK(kiln_session_open(m, &o, &sb));
        kiln_sampler *smp[2][2];
        for (int q = 0; q < 2; q++) {
            p.seed = 11 + (uint64_t)q;
            REQUIRE_OK(kiln_sampler_open(&p, spec_vocab, &smp[0][q]));
            REQUIRE_OK(kiln_sampler_open(&p, spec_vocab, &smp[1][q]));
            for (int i = 0; variant && i <= KILN_SAMPLE_SPEC_MAX_PEN; i++)
                kiln_sampler_accept(smp[0][q], i), kiln_sampler_accept(smp[1][q], i);
        }
        int32_t tok[2][2] = {{1, 1}, {2, 2}}; /* [seq][session] */
        int diff = 0;
        spec_rows = spec_calls = 0;
        for (int step = 0; step < 24; step++) {
            if (step == 9) spec_fail_at = 1, spec_calls = 0;
            for (int side = 0; side < 2; side++) {
                kiln_batch_row rows[2];
                kiln_batch_output out[2];
                for (int q = 0; q < 2; q++)
                    rows[q] = (kiln_batch_row){.seq = q, .id = tok[q][side], .out = KILN_OUT_SAMPLE, .sampler = smp[side][q]};
                kiln_status st = kiln_batch(side ? sb : sa, rows, 2, out, 2, NULL);
                if (side == 0 && spec_fail_at) { /* fails once, then runs again */
                    CHECK_EQ_INT(st, KILN_ERR_DEVICE);
                    spec_fail_at = 0;
                    st = kiln_batch(sa, rows, 2, out, 2, NULL);
                }
                REQUIRE_OK(st);
                for (int q = 0; q < 2; q++) {
                    REQUIRE(out[q].id >= 0 && out[q].id < spec_vocab && out[q].logits == NULL);
                    tok[q][side] = out[q].id;
                    kiln_sampler_accept(smp[side][q], out[q].id);
                }
            }
            diff += (tok[0][0] != tok[0][1]) + (tok[1][0] != tok[1][1]);
        }
        CHECKF(diff == 0, "variant %d: %d of 48 sampled ids differ between the backend's spec and the host path", variant, diff);
        CHECK_EQ_INT(spec_rows, variant ? 0 : 48);
        for (int q = 0; q < 2; q++) kiln_sampler_close(smp[0][q]), kiln_sampler_close(smp[1][q]);
        kiln_session_close(sa);
        kiln_session_close(sb);
        ref_sampler_close(spec_ref);
    }
    kiln_model_close(m);
}
