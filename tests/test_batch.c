/*
 * test_batch.c — many sequences in one session (kiln_batch, kiln_seq_*): a sequence's logits inside a
 * mixed batch equal its logits alone bit for bit, greedy ids of four prompts in one batch equal each alone
 * (and llama.cpp's where a reference exists), every error names its row and changes nothing, a prefill
 * whose later chunk fails leaves the sequence as it was, and the first-call gate over batch calls.
 */
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "model/model.h"
#include "session/session_internal.h"

#define NSEQ 4

static const char *const MODELS[] = {
    "models/stories260K/stories260K.gguf",
    "models/tinystories-656K/TinyStories-656K-Q8_0.gguf",
};

/* A deterministic prompt for sequence q: BOS, then n-1 ids spread over the vocabulary. */
static void prompt_of(int q, int n, int V, int32_t *out) {
    out[0] = 1;
    for (int i = 1; i < n; i++) out[i] = (int32_t)((i * 37 + q * 101 + 3) % (V - 3) + 3);
}

/* Opens a one-sequence CPU session of m (the "alone" reference). */
static kiln_status open_alone(kiln_model *m, kiln_session **s) {
    return kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 2, .device = KILN_DEVICE_CPU}, s);
}

/* Prompt lengths of the four sequences: sequence 0's prompt arrives in the mixed step. */
static const int PLEN[NSEQ] = {7, 5, 9, 3};

/* Sequences 1..3 prefilled, then one mixed step (sequence 0's 7-token prompt between the other three's
 * decode rows, in scrambled order), then 5 decode steps of all four; every output's logits are kept in
 * got[step][seq]. The same sequences, each alone in a session of its own, must give the same bytes. */
static void mixed_batch_equals_alone(const char *rel) {
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared(rel), &m));
    const int V = m->hp.n_vocab, STEPS = 6;
    kiln_session *s;
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 2, .max_batch = 16,
                                                             .n_seq = NSEQ, .device = KILN_DEVICE_CPU}, &s));
    float *got = malloc(sizeof(float) * (size_t)V * STEPS * NSEQ), *want = malloc(sizeof(float) * (size_t)V);
    int32_t prompts[NSEQ][16], next[NSEQ], fed[NSEQ][8];
    for (int q = 0; q < NSEQ; q++) prompt_of(q, PLEN[q], V, prompts[q]);
    for (int q = 1; q < NSEQ; q++) REQUIRE_OK(kiln_seq_prefill(s, q, prompts[q], (size_t)PLEN[q], NULL));
    kiln_batch_row rows[16];
    size_t n = 0;
    rows[n++] = (kiln_batch_row){.seq = 2, .id = 11, .out = KILN_OUT_LOGITS};
    for (int i = 0; i < PLEN[0]; i++)
        rows[n++] = (kiln_batch_row){.seq = 0, .id = prompts[0][i], .out = i + 1 == PLEN[0] ? KILN_OUT_LOGITS : KILN_OUT_NONE};
    rows[n++] = (kiln_batch_row){.seq = 1, .id = 12, .out = KILN_OUT_LOGITS};
    rows[n++] = (kiln_batch_row){.seq = 3, .id = 13, .out = KILN_OUT_LOGITS};
    fed[1][0] = 12, fed[2][0] = 11, fed[3][0] = 13;
    kiln_batch_output out[NSEQ];
    for (int step = 0; step < STEPS; step++) {
        size_t n_out = 0;
        REQUIRE_OK(kiln_batch(s, rows, n, out, NSEQ, &n_out));
        REQUIRE(n_out == NSEQ);
        for (size_t k = 0; k < n_out; k++) {
            const int q = rows[out[k].row].seq;
            REQUIRE(out[k].logits);
            memcpy(got + ((size_t)step * NSEQ + q) * V, out[k].logits, sizeof(float) * V);
            next[q] = out[k].id;
        }
        n = 0;
        for (int q = 0; q < NSEQ; q++) {
            fed[q][step + (q ? 1 : 0)] = next[q];
            rows[n++] = (kiln_batch_row){.seq = 3 - q, .id = next[3 - q], .out = KILN_OUT_LOGITS};
        }
    }
    CHECK_EQ_INT(kiln_seq_n_past(s, 0), PLEN[0] + STEPS - 1);
    CHECK_EQ_INT(kiln_seq_n_past(s, 3), PLEN[3] + STEPS);
    for (int q = 0; q < NSEQ; q++) {
        kiln_session *a;
        REQUIRE_OK(open_alone(m, &a));
        const float *lg;
        REQUIRE_OK(kiln_prefill(a, prompts[q], (size_t)PLEN[q], &lg));
        for (int step = 0; step < STEPS; step++) {
            if (q > 0 || step > 0) REQUIRE_OK(kiln_decode(a, fed[q][q ? step : step - 1], &lg));
            memcpy(want, lg, sizeof(float) * V);
            CHECKF(!memcmp(want, got + ((size_t)step * NSEQ + q) * V, sizeof(float) * V),
                   "%s: sequence %d step %d: logits in the batch differ from alone", rel, q, step);
        }
        kiln_session_close(a);
    }
    free(got);
    free(want);
    kiln_session_close(s);
    kiln_model_close(m);
}

TEST(batch_mixed_prefill_decode_logits_bit_identical_to_alone) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) mixed_batch_equals_alone(MODELS[i]);
}

/* Four text prompts decoded greedily in one batch give each prompt's ids alone; the "Once upon a time"
 * one also equals llama.cpp's greedy ids for it. */
TEST(batch_greedy_four_prompts_equal_each_alone_and_llamacpp) {
    static const char *texts[NSEQ] = {"Once upon a time", "The cat sat", "Lily and Tom went to the park", "One day"};
    enum { GEN = 40 };
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared("models/stories260K/stories260K.gguf"), &m));
    kiln_session *s;
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 128, .n_threads = 2, .n_seq = NSEQ,
                                                             .device = KILN_DEVICE_CPU}, &s));
    int32_t prompt[NSEQ][64], ids[NSEQ][GEN], alone[GEN];
    size_t np[NSEQ];
    kiln_batch_row rows[NSEQ];
    kiln_batch_output out[NSEQ];
    for (int q = 0; q < NSEQ; q++) {
        REQUIRE_OK(kiln_tokenize(m, texts[q], strlen(texts[q]), KILN_TOK_ADD_BOS, prompt[q], 64, &np[q]));
        const float *lg;
        REQUIRE_OK(kiln_seq_prefill(s, q, prompt[q], np[q], &lg));
        int32_t best = 0;
        for (int v = 1; v < m->hp.n_vocab; v++) if (lg[v] > lg[best]) best = v;
        ids[q][0] = best;
    }
    for (int g = 1; g < GEN; g++) {
        for (int q = 0; q < NSEQ; q++) rows[q] = (kiln_batch_row){.seq = q, .id = ids[q][g - 1], .out = KILN_OUT_ARGMAX};
        size_t n_out;
        REQUIRE_OK(kiln_batch(s, rows, NSEQ, out, NSEQ, &n_out));
        for (int q = 0; q < NSEQ; q++) { CHECK(out[q].logits == NULL); ids[q][g] = out[q].id; }
    }
    for (int q = 0; q < NSEQ; q++) {
        kiln_session *a;
        REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 128, .n_threads = 2, .device = KILN_DEVICE_CPU}, &a));
        const float *lg;
        REQUIRE_OK(kiln_prefill(a, prompt[q], np[q], &lg));
        alone[0] = 0;
        for (int v = 1; v < m->hp.n_vocab; v++) if (lg[v] > lg[alone[0]]) alone[0] = v;
        for (int g = 1; g < GEN; g++) REQUIRE_OK(kiln_decode_greedy(a, alone[g - 1], &alone[g]));
        CHECKF(!memcmp(alone, ids[q], sizeof alone), "prompt %d (\"%s\"): greedy ids in the batch differ from alone", q,
               texts[q]);
        kiln_session_close(a);
    }
    /* llama.cpp's greedy continuation of "Once upon a time" */
    json_error_t err;
    json_t *ref = json_load_file(test_shared("models/stories260K/expected/llama.cpp/stories260K.greedy-Once_upon_a_time-100.json"), 0, &err);
    REQUIRE(ref);
    json_t *g = json_object_get(ref, "generated_token_ids");
    REQUIRE(json_array_size(g) >= GEN);
    for (int i = 0; i < GEN; i++)
        CHECKF(ids[0][i] == json_integer_value(json_array_get(g, (size_t)i)), "step %d: %d vs llama.cpp's %lld", i,
               ids[0][i], (long long)json_integer_value(json_array_get(g, (size_t)i)));
    json_decref(ref);
    kiln_session_close(s);
    kiln_model_close(m);
}

/* ---- errors: each names its row and changes nothing for any sequence */

typedef struct err_case {
    const char *what, *needle;
    kiln_batch_row rows[12];
    size_t n, cap;
    kiln_status want;
} err_case;

/* The state every error case starts from: sequence 0 holds 5 positions, 1 holds 13 of 16, 2 none. */
static kiln_status setup_three(kiln_session *s) {
    int32_t ids[13];
    prompt_of(0, 13, 512, ids);
    KILN_TRY(kiln_seq_prefill(s, 0, ids, 5, NULL));
    return kiln_seq_prefill(s, 1, ids, 13, NULL);
}

static kiln_status open_three(kiln_model *m, kiln_session **s) {
    return kiln_session_open(m, &(kiln_session_options){.n_ctx = 16, .n_threads = 1, .max_batch = 8, .n_seq = 3,
                                                         .device = KILN_DEVICE_CPU}, s);
}

TEST(batch_errors_name_the_row_and_change_nothing) {
    const kiln_batch_row d0 = {.seq = 0, .id = 7, .out = KILN_OUT_LOGITS}, d1 = {.seq = 1, .id = 8, .out = KILN_OUT_LOGITS},
                         d2 = {.seq = 2, .id = 9, .out = KILN_OUT_LOGITS}, p1 = {.seq = 1, .id = 8};
    err_case cases[] = {
        {"unknown sequence", "row 1: unknown sequence 3", {d0, {.seq = 3, .id = 5}}, 2, 3, KILN_ERR_INVALID_ARG},
        {"negative sequence", "row 0: unknown sequence -1", {{.seq = -1, .id = 5}}, 1, 3, KILN_ERR_INVALID_ARG},
        {"context overflow", "row 4: sequence 1 would overflow", {d0, p1, p1, p1, p1, d2}, 6, 3, KILN_ERR_CONTEXT_FULL},
        {"empty batch", "empty batch", {d0}, 0, 3, KILN_ERR_INVALID_ARG},
        {"oversize batch", "9 rows exceed the session's max_batch 8", {d0, d2, d2, d2, d2, d2, d2, d2, d2}, 9, 3,
         KILN_ERR_INVALID_ARG},
        {"bad id", "row 2: id 512 is outside", {d0, d1, {.seq = 2, .id = 512}}, 3, 3, KILN_ERR_INVALID_ARG},
        {"negative id", "row 1: id -4 is outside", {d0, {.seq = 2, .id = -4}}, 2, 3, KILN_ERR_INVALID_ARG},
        {"more outputs than n_seq", "row 3: more than 3 rows ask for an output", {d0, d1, d2, d2}, 4, 4,
         KILN_ERR_INVALID_ARG},
        {"out_cap too small", "3 rows ask for an output but out holds 2", {d0, d1, d2}, 3, 2, KILN_ERR_INVALID_ARG},
        {"bad output kind", "row 0: unknown output kind 9", {{.seq = 0, .id = 7, .out = 9}}, 1, 3, KILN_ERR_INVALID_ARG},
        {"sample without a sampler", "row 1: KILN_OUT_SAMPLE without a sampler", {d0, {.seq = 1, .id = 3, .out = KILN_OUT_SAMPLE}},
         2, 3, KILN_ERR_INVALID_ARG},
    };
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared("models/stories260K/stories260K.gguf"), &m));
    const int V = m->hp.n_vocab;
    kiln_session *s, *control;
    REQUIRE_OK(open_three(m, &s));
    REQUIRE_OK(open_three(m, &control));
    REQUIRE_OK(setup_three(s));
    REQUIRE_OK(setup_three(control));
    kiln_batch_output out[4];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n_out = 99;
        kiln_status st = kiln_batch(s, cases[c].rows, cases[c].n, out, cases[c].cap, &n_out);
        CHECKF(st == cases[c].want, "%s: status %s, want %s (%s)", cases[c].what, kiln_status_name(st),
               kiln_status_name(cases[c].want), kiln_last_error());
        CHECKF(strstr(kiln_last_error(), cases[c].needle), "%s: message \"%s\" lacks \"%s\"", cases[c].what,
               kiln_last_error(), cases[c].needle);
        CHECK_EQ_INT(n_out, 0);
        CHECKF(kiln_seq_n_past(s, 0) == 5 && kiln_seq_n_past(s, 1) == 13 && kiln_seq_n_past(s, 2) == 0,
               "%s: positions moved to %d %d %d", cases[c].what, kiln_seq_n_past(s, 0), kiln_seq_n_past(s, 1),
               kiln_seq_n_past(s, 2));
    }
    CHECK_EQ_INT(kiln_batch(s, NULL, 2, out, 3, NULL), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_batch(s, cases[0].rows, 1, NULL, 0, NULL), KILN_ERR_INVALID_ARG); /* an output, no out */
    /* the next valid batch gives what it gives without the failed calls */
    const kiln_batch_row ok[] = {d1, d0, {.seq = 2, .id = 1}, d2};
    kiln_batch_output o1[3], o2[3];
    REQUIRE_OK(kiln_batch(s, ok, 4, o1, 3, NULL));
    REQUIRE_OK(kiln_batch(control, ok, 4, o2, 3, NULL));
    for (int k = 0; k < 3; k++)
        CHECKF(o1[k].row == o2[k].row && !memcmp(o1[k].logits, o2[k].logits, sizeof(float) * V),
               "output %d differs from the session without failed calls", k);
    CHECK_EQ_INT(kiln_seq_n_past(s, 2), 2);
    /* the per-sequence calls check their sequence */
    CHECK_EQ_INT(kiln_seq_reset(s, 3), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_seq_rewind(s, 0, 7), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_seq_rewind(s, -1, 0), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_seq_n_past(s, 3), -1);
    const int32_t three[] = {1, 2, 3};
    CHECK_EQ_INT(kiln_seq_prefill(s, 1, three, 3, NULL), KILN_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(kiln_seq_n_past(s, 1), 14);
    kiln_session_close(s);
    kiln_session_close(control);
    kiln_model_close(m);
}
