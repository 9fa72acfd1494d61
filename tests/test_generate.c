/*
 * test_generate.c — the model, the session and the CPU forward pass against the reference outputs in
 * ../shared: llama2.c's published greedy text, llama.cpp's greedy ids for every quantized file, the
 * first-call contract (no allocation after open) and the context-overflow error.
 */
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "gguf/gguf.h"

typedef struct reference {
    json_t *root;
    int32_t prompt[64];
    size_t n_prompt;
    int32_t ids[512];
    size_t n_ids;
    const char *model;
} reference;

static bool load_reference(const char *rel, reference *r) {
    memset(r, 0, sizeof *r);
    json_error_t err;
    r->root = json_load_file(test_shared(rel), 0, &err);
    if (!r->root) { test_failf(__FILE__, __LINE__, "cannot parse %s: %s", rel, err.text); return false; }
    json_t *p = json_object_get(r->root, "prompt_token_ids"), *g = json_object_get(r->root, "generated_token_ids");
    for (size_t i = 0; i < json_array_size(p) && i < 64; i++) r->prompt[r->n_prompt++] = (int32_t)json_integer_value(json_array_get(p, i));
    for (size_t i = 0; i < json_array_size(g) && i < 512; i++) r->ids[r->n_ids++] = (int32_t)json_integer_value(json_array_get(g, i));
    r->model = json_string_value(json_object_get(r->root, "model"));
    return r->n_ids > 0 && r->model;
}

static double ref_gap(const reference *r, size_t step) {
    json_t *s = json_array_get(json_object_get(r->root, "steps"), step);
    return json_real_value(json_object_get(s, "gap_top1_top2"));
}

/* Greedy generation like the reference: prefill the prompt, then up to n tokens, stopping after EOG. */
static kiln_status greedy(kiln_model *m, kiln_session *s, const int32_t *prompt, size_t n_prompt, size_t n,
                          int32_t *out, size_t *n_out, bool *finite) {
    const float *logits;
    kiln_model_info mi;
    kiln_model_get_info(m, &mi);
    *n_out = 0;
    *finite = true;
    KILN_TRY(kiln_prefill(s, prompt, n_prompt, &logits));
    for (size_t i = 0; i < n; i++) {
        for (int v = 0; v < mi.n_vocab; v++) if (!isfinite(logits[v])) *finite = false;
        int32_t id = test_argmax(logits, mi.n_vocab);
        out[(*n_out)++] = id;
        if (kiln_token_is_eog(m, id) || i + 1 == n) break;
        KILN_TRY(kiln_decode(s, id, &logits));
    }
    return KILN_OK;
}

TEST(generate_stories260K_greedy_200_equals_llama2c_and_llamacpp) {
    reference r;
    REQUIRE(load_reference("models/stories260K/expected/llama.cpp/stories260K.greedy-BOS-200.json", &r));
    kiln_model *m;
    kiln_session *s;
    REQUIRE_OK(kiln_model_open(test_shared("models/stories260K/stories260K.gguf"), &m));
    kiln_session_options o = {.n_ctx = 256, .n_threads = 2};
    REQUIRE_OK(kiln_session_open(m, &o, &s));
    int32_t ids[200];
    size_t n;
    bool finite;
    REQUIRE_OK(greedy(m, s, r.prompt, r.n_prompt, 200, ids, &n, &finite));
    CHECK(finite);
    CHECK_EQ_INT(n, 200);
    size_t same = 0;
    while (same < n && ids[same] == r.ids[same]) same++;
    CHECKF(same == 200, "ids depart from llama.cpp at step %zu (got %d, want %d)", same, ids[same], r.ids[same]);
    /* the decoded text equals llama2.c's published output byte for byte */
    size_t len;
    char *want = test_read_file(test_shared("models/stories260K/expected/llama2c-test_all-greedy200.txt"), &len);
    REQUIRE(want);
    char text[4096];
    size_t tn = 0;
    kiln_detok d;
    kiln_detok_init(&d, m, true);
    for (size_t i = 0; i < n; i++) tn += kiln_detok_push(&d, ids[i], text + tn, sizeof text - tn);
    tn += kiln_detok_flush(&d, text + tn, sizeof text - tn);
    text[tn] = '\0';
    CHECKF(tn == len && !memcmp(text, want, len), "text differs:\n got: %s\nwant: %s", text, want);
    free(want);
    json_decref(r.root);
    kiln_session_close(s);
    kiln_model_close(m);
}

TEST(generate_stories260K_prompt_once_upon_a_time) {
    reference r;
    REQUIRE(load_reference("models/stories260K/expected/llama.cpp/stories260K.greedy-Once_upon_a_time-100.json", &r));
    kiln_model *m;
    kiln_session *s;
    REQUIRE_OK(kiln_model_open(test_shared("models/stories260K/stories260K.gguf"), &m));
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 128, .n_threads = 2, .device = KILN_DEVICE_CPU}, &s));
    int32_t prompt[64];
    size_t np;
    REQUIRE_OK(kiln_tokenize(m, "Once upon a time", 16, KILN_TOK_ADD_BOS, prompt, 64, &np));
    CHECK_EQ_INT(np, r.n_prompt);
    for (size_t i = 0; i < np && i < r.n_prompt; i++) CHECK_EQ_INT(prompt[i], r.prompt[i]);
    int32_t ids[100];
    size_t n;
    bool finite;
    REQUIRE_OK(greedy(m, s, prompt, np, 100, ids, &n, &finite));
    size_t same = 0;
    while (same < n && same < r.n_ids && ids[same] == r.ids[same]) same++;
    CHECKF(same == r.n_ids, "ids depart at step %zu of %zu", same, r.n_ids);
    json_decref(r.root);
    kiln_session_close(s);
    kiln_model_close(m);
}

/* Teacher forcing: feed the reference's own tokens and compare our logits of its top-1 and top-2 ids with
 * the reference's logits at every step. Returns the largest absolute difference. */
static double teacher_forced_max_diff(kiln_model *m, kiln_session *s, const reference *r, double *mean) {
    const float *logits;
    double maxd = 0, sum = 0;
    size_t n = 0;
    *mean = 0;
    kiln_session_reset(s);
    if (kiln_prefill(s, r->prompt, r->n_prompt, &logits) != KILN_OK) return 1e9;
    json_t *steps = json_object_get(r->root, "steps");
    for (size_t i = 0; i < json_array_size(steps); i++) {
        json_t *top5 = json_object_get(json_array_get(steps, i), "top5");
        for (size_t k = 0; k < 2; k++) {
            json_t *pair = json_array_get(top5, k);
            int id = (int)json_integer_value(json_array_get(pair, 0));
            double d = fabs(logits[id] - json_number_value(json_array_get(pair, 1)));
            maxd = fmax(maxd, d);
            sum += d;
            n++;
        }
        if (i + 1 < r->n_ids && kiln_decode(s, r->ids[i], &logits) != KILN_OK) return 1e9;
    }
    (void)m;
    *mean = n ? sum / n : 0;
    return maxd;
}

/* Every file with a llama.cpp reference: greedy ids from BOS against the reference's, and teacher-forced
 * logits against its logits. Float-weight files must follow every greedy id, logits within 0.02; quantized files quantize the
 * activations to 8 bits (kiln does it with the reference's AVX2 quantizer and dot order), which turns any
 * remaining last-bit difference into a small logit difference, so they must stay within 0.25 of every
 * reference logit (mean 0.05). Every file must follow the reference for at least 50 tokens, and may leave
 * it only where the reference's own top-1/top-2 gap is below 0.01. */
TEST(generate_every_quant_matches_llamacpp_greedy) {
    static const struct { const char *ref; bool exact; } refs[] = {
        {"models/tinystories-656K/expected/llama.cpp/TinyStories-656K-Q8_0.greedy-BOS-100.json", false},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-F32.greedy-BOS-100.json", true},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-F16.greedy-BOS-100.json", true},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-BF16.greedy-BOS-100.json", true},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-Q8_0.greedy-BOS-100.json", false},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-Q5_1.greedy-BOS-100.json", false},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-Q5_0.greedy-BOS-100.json", false},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-Q4_1.greedy-BOS-100.json", false},
        {"models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-Q4_0.greedy-BOS-100.json", false},
        {"models/stories260K/expected/llama.cpp/quants/stories260K-F16.greedy-BOS-100.json", true},
        {"models/stories260K/expected/llama.cpp/quants/stories260K-Q8_0-ffn_down-F16.greedy-BOS-100.json", false},
        {"models/stories260K/expected/llama.cpp/quants/stories260K-Q4_0-ffn_down-F16.greedy-BOS-100.json", false},
    };
    size_t total_same = 0, total = 0, files_50 = 0;
    for (size_t f = 0; f < sizeof refs / sizeof refs[0]; f++) {
        reference r;
        if (!load_reference(refs[f].ref, &r)) continue;
        kiln_model *m;
        kiln_session *s;
        kiln_status st = kiln_model_open(test_shared(r.model), &m);
        CHECKF(st == KILN_OK, "%s: %s", r.model, kiln_last_error());
        if (st != KILN_OK) { json_decref(r.root); continue; }
        REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 128, .n_threads = 2, .device = KILN_DEVICE_CPU}, &s));
        int32_t ids[128];
        size_t n;
        bool finite;
        REQUIRE_OK(greedy(m, s, r.prompt, r.n_prompt, r.n_ids, ids, &n, &finite));
        CHECKF(finite, "%s: non-finite logits", r.model);
        size_t same = 0;
        while (same < n && same < r.n_ids && ids[same] == r.ids[same]) same++;
        total_same += same;
        total += r.n_ids;
        files_50 += same >= 50 || same == r.n_ids;
        double mean, maxd = teacher_forced_max_diff(m, s, &r, &mean);
        printf("  %-58s greedy %3zu/%zu ids equal", r.model, same, r.n_ids);
        if (same < r.n_ids) printf(" (departs at step %zu, reference gap %.4f)", same, ref_gap(&r, same));
        printf("; teacher-forced logits: max |diff| %.5f, mean %.5f\n", maxd, mean);
        if (refs[f].exact) {
            CHECKF(same == r.n_ids, "%s: float weights must follow the reference all the way", r.model);
            CHECKF(maxd < 0.02, "%s: logits differ by %.5f", r.model, maxd);
        } else {
            CHECKF(maxd < 0.25 && mean < 0.05, "%s: logits differ by up to %.4f (mean %.4f)", r.model, maxd, mean);
        }
        CHECKF(same >= 50 || same == r.n_ids, "%s: only %zu ids equal (the issue asks for >= 50)", r.model, same);
        if (same < r.n_ids) CHECKF(ref_gap(&r, same) < 0.01, "%s: departs at step %zu where the reference's gap is %.4f",
                                   r.model, same, ref_gap(&r, same));
        json_decref(r.root);
        kiln_session_close(s);
        kiln_model_close(m);
    }
    printf("  total: %zu/%zu greedy ids equal to llama.cpp's; %zu of 12 files equal for >= 50 tokens\n", total_same,
           total, files_50);
    CHECK(total > 0);
}

TEST(generate_random_llama2_vocab_no_nan) {
    kiln_model *m;
    kiln_session *s;
    REQUIRE_OK(kiln_model_open(test_shared("models/random/llama-2-tiny-random.gguf"), &m));
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 2, .device = KILN_DEVICE_CPU}, &s));
    int32_t prompt[64];
    size_t np;
    const char *text = "The quick brown fox jumps over the lazy dog.";
    REQUIRE_OK(kiln_tokenize(m, text, strlen(text), KILN_TOK_ADD_BOS, prompt, 64, &np));
    CHECK(np > 5);
    int32_t ids[20];
    size_t n;
    bool finite;
    REQUIRE_OK(greedy(m, s, prompt, np, 20, ids, &n, &finite));
    CHECK(finite);
    CHECK(n >= 1);
    kiln_session_close(s);
    kiln_model_close(m);
}

/* The first-call contract on the CPU: after open, a prefill and 16 decode steps make no heap call at all. */
TEST(gate_cpu_no_allocation_after_open) {
    kiln_model *m;
    kiln_session *s;
    REQUIRE_OK(kiln_model_open(test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), &m));
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 128, .n_threads = 2, .device = KILN_DEVICE_CPU}, &s));
    int32_t prompt[] = {1, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200, 1300, 1400};
    const float *logits;
    uint64_t before = test_heap_calls();
    REQUIRE_OK(kiln_prefill(s, prompt, 13, &logits));
    int32_t id = test_argmax(logits, 2048);
    for (int i = 0; i < 16; i++) {
        REQUIRE_OK(kiln_decode(s, id, &logits));
        id = test_argmax(logits, 2048);
    }
    REQUIRE_OK(kiln_decode_greedy(s, id, &id));
    uint64_t calls = test_heap_calls() - before;
    kiln_stats st;
    kiln_session_stats(s, &st);
    CHECK_NOTHING_AFTER_OPEN("prefill + 17 decode steps", st, calls);
    CHECK_EQ_INT(st.tokens_prefilled, 13);
    CHECK_EQ_INT(st.tokens_decoded, 17);
    kiln_session_close(s);
    kiln_model_close(m);
}

TEST(session_context_overflow_is_an_error) {
    kiln_model *m;
    kiln_session *s;
    REQUIRE_OK(kiln_model_open(test_shared("models/stories260K/stories260K.gguf"), &m));
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 16, .n_threads = 1, .device = KILN_DEVICE_CPU}, &s));
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = 1 + i;
    const float *logits = (const float *)1;
    CHECK_EQ_INT(kiln_prefill(s, ids, 17, &logits), KILN_ERR_CONTEXT_FULL);
    CHECK(logits == NULL);
    CHECK(strstr(kiln_last_error(), "context") != NULL);
    CHECK_EQ_INT(kiln_session_n_past(s), 0); /* nothing changed */
    REQUIRE_OK(kiln_prefill(s, ids, 10, &logits));
    for (int i = 0; i < 6; i++) REQUIRE_OK(kiln_decode(s, 5, &logits));
    CHECK_EQ_INT(kiln_session_n_past(s), 16);
    CHECK_EQ_INT(kiln_decode(s, 5, &logits), KILN_ERR_CONTEXT_FULL);
    CHECK_EQ_INT(kiln_session_n_past(s), 16);
    /* bad ids are rejected, not read out of bounds */
    kiln_session_reset(s);
    int32_t bad[2] = {1, 512};
    CHECK_EQ_INT(kiln_prefill(s, bad, 2, &logits), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_decode(s, -1, &logits), KILN_ERR_INVALID_ARG);
    kiln_session_close(s);
    kiln_model_close(m);
}

TEST(session_reset_reproduces_logits) {
    kiln_model *m;
    kiln_session *s;
    REQUIRE_OK(kiln_model_open(test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), &m));
    REQUIRE_OK(kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 2, .max_batch = 4, .device = KILN_DEVICE_CPU}, &s));
    int32_t ids[] = {1, 42, 43, 44, 45, 46, 47, 48, 49, 50}; /* 10 tokens in chunks of 4 */
    const float *logits;
    static float a[2048], b[2048];
    REQUIRE_OK(kiln_prefill(s, ids, 10, &logits));
    memcpy(a, logits, sizeof a);
    kiln_session_reset(s);
    /* token by token gives the same logits as the chunked prefill (up to float reordering) */
    REQUIRE_OK(kiln_prefill(s, ids, 1, &logits));
    for (int i = 1; i < 10; i++) REQUIRE_OK(kiln_decode(s, ids[i], &logits));
    memcpy(b, logits, sizeof b);
    double maxd = 0;
    for (int i = 0; i < 2048; i++) maxd = fmax(maxd, fabs(a[i] - b[i]));
    CHECKF(maxd < 1e-3, "chunked prefill vs decode differ by %g", maxd);
    kiln_session_close(s);
    kiln_model_close(m);
}

/* Writes a copy of src with one change: tensor `target` dropped (data_from NULL) or given the data and shape
 * of tensor `data_from`; and/or general.architecture set to `arch`. */
static kiln_status write_variant(const char *src, const char *dst, const char *target, const char *data_from,
                                 const char *arch) {
    gguf_file *f;
    KILN_TRY(gguf_open(src, &f));
    gguf_writer *w;
    kiln_status st = gguf_writer_open(&w);
    for (size_t i = 0; st == KILN_OK && i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (arch && !strcmp(key, "general.architecture")) st = gguf_set_str(w, key, arch, strlen(arch));
        else st = gguf_set_value(w, key, &kv->value);
    }
    for (size_t i = 0; st == KILN_OK && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (target && !strcmp(name, target)) {
            if (!data_from) continue;
            t = gguf_find_tensor(f, data_from);
        }
        st = gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    if (st == KILN_OK) st = gguf_writer_write(w, dst, NULL, NULL);
    gguf_writer_close(w);
    gguf_close(f);
    return st;
}

TEST(model_errors_name_the_tensor_and_shape) {
    const char *src = test_shared("models/stories260K/stories260K.gguf");
    char path[512];
    kiln_model *m = (kiln_model *)1;
    snprintf(path, sizeof path, "%s/missing.gguf", test_tmpdir());
    REQUIRE_OK(write_variant(src, path, "blk.3.ffn_up.weight", NULL, NULL));
    CHECK_EQ_INT(kiln_model_open(path, &m), KILN_ERR_FORMAT);
    CHECK(m == NULL);
    CHECKF(strstr(kiln_last_error(), "blk.3.ffn_up.weight") && strstr(kiln_last_error(), "[64, 172]"), "%s", kiln_last_error());

    snprintf(path, sizeof path, "%s/arch.gguf", test_tmpdir());
    REQUIRE_OK(write_variant(src, path, NULL, NULL, "mamba"));
    CHECK_EQ_INT(kiln_model_open(path, &m), KILN_ERR_UNSUPPORTED);
    CHECKF(strstr(kiln_last_error(), "mamba") != NULL, "%s", kiln_last_error());

    /* a tensor of the wrong shape: blk.0.attn_q.weight given blk.0.ffn_gate's [64, 172] data */
    snprintf(path, sizeof path, "%s/shape.gguf", test_tmpdir());
    REQUIRE_OK(write_variant(src, path, "blk.0.attn_q.weight", "blk.0.ffn_gate.weight", NULL));
    CHECK_EQ_INT(kiln_model_open(path, &m), KILN_ERR_FORMAT);
    CHECKF(strstr(kiln_last_error(), "blk.0.attn_q.weight") && strstr(kiln_last_error(), "expected [64, 64]"), "%s",
           kiln_last_error());
    CHECK_EQ_INT(kiln_model_open("/nonexistent/model.gguf", &m), KILN_ERR_IO);
}

TEST(session_options_are_validated) {
    kiln_model *m;
    kiln_session *s = (kiln_session *)1;
    REQUIRE_OK(kiln_model_open(test_shared("models/stories260K/stories260K.gguf"), &m));
    CHECK_EQ_INT(kiln_session_open(m, &(kiln_session_options){.n_ctx = -5}, &s), KILN_ERR_INVALID_ARG);
    CHECK(s == NULL);
    CHECK_EQ_INT(kiln_session_open(m, &(kiln_session_options){.n_threads = 5000}, &s), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(kiln_session_open(m, &(kiln_session_options){.device = (kiln_device)9}, &s), KILN_ERR_INVALID_ARG);
    /* defaults: n_ctx = min(train ctx 2048, 4096) */
    REQUIRE_OK(kiln_session_open(m, NULL, &s));
    CHECK_EQ_INT(kiln_session_n_ctx(s), 2048);
    kiln_session_close(s);
    kiln_model_close(m);
}
