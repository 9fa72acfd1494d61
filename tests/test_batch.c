/*
 * test_batch.c — many sequences in one session (kiln_batch, kiln_seq_*): a sequence's logits inside a
 * mixed batch equal its logits alone bit for bit, greedy ids of four prompts in one batch equal each alone
 * (and llama.cpp's where a reference exists), every error names its row and changes nothing, a prefill
 * whose later chunk fails leaves the sequence as it was, and the first-call gate over batch calls; on CUDA
 * (skipped without a GPU) decode steps of many sequences against each alone and the gate over every bucket.
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

/* Sampled rows drawn on the host (the CPU backend's pool, when their samplers are distinct) give the ids that
 * kiln_sample gives drawing the same rows' logits one after the other in row order: 12 steps of four
 * sequences in two sessions, KILN_OUT_SAMPLE rows in one, logits rows sampled by the test in the other; the
 * rows mix in an argmax row (so a draw must find its own output's logits), and in the second half sequences 0
 * and 1 share one sampler (drawn in turn from its one RNG). The drawing session's kiln_stats time its draws. */
TEST(batch_host_sampled_rows_equal_draws_in_turn) {
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), &m));
    const kiln_session_options o = {.n_ctx = 64, .n_threads = 2, .n_seq = NSEQ, .device = KILN_DEVICE_CPU};
    kiln_session *s[2];
    kiln_sampler *smp[2][NSEQ];
    kiln_sampler_params p = kiln_sampler_defaults();
    p.top_k = 0, p.temperature = 1.1f, p.top_p = 0.97f, p.min_p = 0.0f;
    for (int side = 0; side < 2; side++) {
        REQUIRE_OK(kiln_session_open(m, &o, &s[side]));
        for (int q = 0; q < NSEQ; q++) {
            p.seed = 100 + (uint64_t)q;
            REQUIRE_OK(kiln_sampler_open(&p, m->hp.n_vocab, &smp[side][q]));
        }
    }
    int32_t tok[2][NSEQ] = {{1, 1, 1, 1}, {1, 1, 1, 1}};
    int differ = 0;
    for (int step = 0; step < 12; step++) {
        for (int side = 0; side < 2; side++) {
            kiln_batch_row rows[NSEQ];
            kiln_sampler *use[NSEQ];
            for (int q = 0; q < NSEQ; q++) {
                use[q] = smp[side][step >= 6 && q == 1 ? 0 : q];
                const int kind = q == 1 && step < 6 ? KILN_OUT_ARGMAX : side == 0 ? KILN_OUT_SAMPLE : KILN_OUT_LOGITS;
                rows[q] = (kiln_batch_row){.seq = q, .id = tok[side][q], .out = kind, .sampler = use[q]};
            }
            kiln_batch_output out[NSEQ];
            size_t n_out = 0;
            REQUIRE_OK(kiln_batch(s[side], rows, NSEQ, out, NSEQ, &n_out));
            REQUIRE(n_out == NSEQ);
            for (int k = 0; k < NSEQ; k++) {
                const int q = rows[out[k].row].seq;
                if (side == 1 && rows[out[k].row].out == KILN_OUT_LOGITS) out[k].id = kiln_sample(use[q], out[k].logits);
                tok[side][q] = out[k].id;
            }
        }
        for (int q = 0; q < NSEQ; q++) differ += tok[0][q] != tok[1][q];
    }
    CHECKF(differ == 0, "%d of %d host-sampled ids differ from draws in turn", differ, 12 * NSEQ);
    /* the session that drew on the host timed its draws; the one that only gave logits drew nothing */
    kiln_stats st[2];
    kiln_session_stats(s[0], &st[0]);
    kiln_session_stats(s[1], &st[1]);
    CHECKF(st[0].host_sample_ns > 0 && st[1].host_sample_ns == 0, "host_sample_ns %llu (sampled) / %llu (logits)",
           (unsigned long long)st[0].host_sample_ns, (unsigned long long)st[1].host_sample_ns);
    for (int side = 0; side < 2; side++) {
        for (int q = 0; q < NSEQ; q++) kiln_sampler_close(smp[side][q]);
        kiln_session_close(s[side]);
    }
    kiln_model_close(m);
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

/* ---- on CUDA: decode steps of several sequences replay one graph per bucket of rows */

#include "test_gpu.h"

#define CSEQ 10
#define CSTEPS 24

/* The rows of step g: all ten sequences (bucket 10), nine of them (bucket 10 with a padding row), three
 * (bucket 4 with a padding row), one (the one-row matvec graph). */
static int active_of(int g, int *seqs) {
    static const int sets[4][CSEQ] = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {9, 0, 2, 4, 6, 8, 1, 3, 5}, {4, 0, 2}, {7}};
    static const int sizes[4] = {10, 9, 3, 1};
    for (int i = 0; i < sizes[g % 4]; i++) seqs[i] = sets[g % 4][i];
    return sizes[g % 4];
}

/* Ten sequences on CUDA (buckets 1, 2, 4, 8, 10), prefilled, then CSTEPS steps of changing subsets (with
 * padding rows); each sequence alone in a one-sequence CUDA session, fed the same ids, gives logits with cosine >=
 * 0.9999 at every step and the same greedy ids (a difference is accepted only at a near-tie of the alone run:
 * top-2 gap < 1e-3 of the logits' range). */
static void cuda_rows_equal_alone(const char *rel) {
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared(rel), &m));
    const int V = m->hp.n_vocab;
    kiln_session *s;
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 96, .max_batch = 16, .n_seq = CSEQ,
                                                             .device = KILN_DEVICE_CUDA}, &s));
    static const int plen[CSEQ] = {7, 5, 9, 3, 12, 1, 8, 2, 11, 6};
    int32_t prompts[CSEQ][16], fed[CSEQ][CSTEPS + 1];
    int n_fed[CSEQ] = {0};
    float *got = malloc(sizeof(float) * (size_t)V * CSEQ * (CSTEPS + 1)), *want = malloc(sizeof(float) * V);
    for (int q = 0; q < CSEQ; q++) {
        prompt_of(q, plen[q], V, prompts[q]);
        const float *lg;
        REQUIRE_OK(kiln_seq_prefill(s, q, prompts[q], (size_t)plen[q], &lg));
        memcpy(got + (size_t)q * (CSTEPS + 1) * V, lg, sizeof(float) * V);
        fed[q][n_fed[q]++] = test_argmax(lg, V);
    }
    for (int g = 0; g < CSTEPS; g++) {
        int seqs[CSEQ];
        const int k = active_of(g, seqs);
        kiln_batch_row rows[CSEQ];
        kiln_batch_output out[CSEQ];
        for (int i = 0; i < k; i++) rows[i] = (kiln_batch_row){.seq = seqs[i], .id = fed[seqs[i]][n_fed[seqs[i]] - 1],
                                                                .out = KILN_OUT_LOGITS};
        size_t n_out;
        REQUIRE_OK(kiln_batch(s, rows, (size_t)k, out, CSEQ, &n_out));
        REQUIRE(n_out == (size_t)k);
        for (int i = 0; i < k; i++) {
            const int q = seqs[i];
            CHECKF(out[i].id == test_argmax(out[i].logits, V), "%s step %d seq %d: device argmax %d, logits' %d", rel, g,
                   q, out[i].id, test_argmax(out[i].logits, V));
            memcpy(got + ((size_t)q * (CSTEPS + 1) + n_fed[q]) * V, out[i].logits, sizeof(float) * V);
            fed[q][n_fed[q]++] = out[i].id;
        }
    }
    double worst = 1.0;
    for (int q = 0; q < CSEQ; q++) {
        kiln_session *a;
        REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 96, .device = KILN_DEVICE_CUDA}, &a));
        const float *lg;
        REQUIRE_OK(kiln_prefill(a, prompts[q], (size_t)plen[q], &lg));
        for (int j = 0; j < n_fed[q]; j++) {
            if (j > 0) REQUIRE_OK(kiln_decode(a, fed[q][j - 1], &lg));
            memcpy(want, lg, sizeof(float) * V);
            const float *gl = got + ((size_t)q * (CSTEPS + 1) + j) * V;
            const double cs = test_cosine(want, gl, V);
            worst = cs < worst ? cs : worst;
            CHECKF(cs >= 0.9999, "%s seq %d step %d: cosine %.6f in the batch against alone", rel, q, j, cs);
            const int aw = test_argmax(want, V), ag = test_argmax(gl, V);
            CHECKF(aw == ag || test_near_tie(want, V, aw, ag, 1e-3), "%s seq %d step %d: greedy id %d in the batch, %d alone",
                   rel, q, j, ag, aw);
        }
        kiln_session_close(a);
    }
    printf("  %s: worst cosine batch vs alone %.7f over %d sequences\n", rel, worst, CSEQ);
    free(got);
    free(want);
    kiln_session_close(s);
    kiln_model_close(m);
}

TEST(batch_cuda_rows_of_many_sequences_equal_each_alone) {
    if (!test_gpu_ready()) return;
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) cuda_rows_equal_alone(MODELS[i]);
}

/* The first-call contract on CUDA over every bucket: after open, decode steps of 1..n_seq rows (each bucket,
 * with and without padding rows), logits and argmax, a mixed prefill + decode call: no heap call, no device
 * allocation, module load or graph capture. */
TEST(batch_cuda_gates_every_bucket_nothing_allocated_loaded_or_captured) {
    if (!test_gpu_ready()) return;
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared(MODELS[1]), &m));
    enum { NS = 12 }; /* buckets 1, 2, 4, 8, 12: 3, 5..7, 9..11 rows padded */
    kiln_session *s;
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 128, .max_batch = 32, .n_seq = NS,
                                                             .device = KILN_DEVICE_CUDA}, &s));
    int32_t prompt[13];
    prompt_of(0, 13, m->hp.n_vocab, prompt);
    kiln_batch_row rows[32];
    kiln_batch_output out[NS];
    const uint64_t before = test_heap_calls();
    for (int q = 0; q < NS; q++) REQUIRE_OK(kiln_seq_prefill(s, q, prompt, 5, NULL));
    for (int round = 0; round < 2; round++)
        for (int k = 1; k <= NS; k++) {
            for (int q = 0; q < k; q++)
                rows[q] = (kiln_batch_row){.seq = (q + round) % NS, .id = 5 + q,
                                           .out = (q + round) % 2 ? KILN_OUT_LOGITS : KILN_OUT_ARGMAX};
            REQUIRE_OK(kiln_batch(s, rows, (size_t)k, out, NS, NULL));
        }
    size_t n = 0;
    for (int q = 0; q < 3; q++) rows[n++] = (kiln_batch_row){.seq = q, .id = 9, .out = KILN_OUT_ARGMAX};
    for (int i = 0; i < 9; i++) rows[n++] = (kiln_batch_row){.seq = 7, .id = prompt[i], .out = i == 8 ? KILN_OUT_LOGITS : 0};
    REQUIRE_OK(kiln_batch(s, rows, n, out, NS, NULL));
    const uint64_t calls = test_heap_calls() - before;
    kiln_stats st;
    kiln_session_stats(s, &st);
    CHECK_NOTHING_AFTER_OPEN("after open", st, calls);
    kiln_session_close(s);
    kiln_model_close(m);
}
