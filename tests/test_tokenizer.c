/*
 * test_tokenizer.c — the SPM and BPE tokenizers against the reference vectors in ../shared:
 * llama.cpp's .inp/.out vectors for every vocabulary GGUF (46/46 each), llama2.c's and Meta's published
 * prompt encodings, llama.cpp's detokenized reference texts of generated ids, special-token parsing,
 * the streaming detokenizer and the errors of loading.
 */
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------- helpers */

typedef struct vocab { gguf_file *f; kiln_tokenizer *t; } vocab;

static bool vocab_open(const char *rel, vocab *v) {
    v->f = NULL;
    v->t = NULL;
    const char *path = test_shared(rel);
    if (!path) return false;
    kiln_status st = gguf_open(path, &v->f);
    if (st != KILN_OK) {
        test_failf(__FILE__, __LINE__, "gguf_open(%s): %s", rel, kiln_last_error());
        return false;
    }
    st = kiln_tokenizer_open(v->f, &v->t);
    if (st != KILN_OK) {
        test_failf(__FILE__, __LINE__, "kiln_tokenizer_open(%s): %s", rel, kiln_last_error());
        gguf_close(v->f);
        return false;
    }
    return true;
}

static void vocab_close(vocab *v) {
    kiln_tokenizer_close(v->t);
    gguf_close(v->f);
}

/* Tokenizes into a malloc'd array (*n ids); NULL on failure (reported). */
static int32_t *encode(const kiln_tokenizer *t, const char *s, size_t len, int flags, size_t *n) {
    size_t cap = len * 2 + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    kiln_status st = kiln_tokenizer_encode(t, s, len, flags, ids, cap, n);
    if (st != KILN_OK) {
        test_failf(__FILE__, __LINE__, "encode: %s", kiln_last_error());
        free(ids);
        return NULL;
    }
    return ids;
}

/* Decodes ids with the piece function into a malloc'd NUL-terminated string. */
static char *decode(const kiln_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    size_t cap = 64, used = 0;
    char *s = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        size_t need = kiln_tokenizer_piece(t, ids[i], NULL, 0);
        while (used + need + 1 > cap) s = realloc(s, cap *= 2);
        kiln_tokenizer_piece(t, ids[i], s + used, need);
        used += need;
    }
    s[used] = 0;
    if (len) *len = used;
    return s;
}

/* Splits a .inp file into its test strings (llama.cpp's format). */
static int split_inp(char *inp, char **strs, int max) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    int n = 0;
    char *p = inp;
    for (;;) {
        char *q = strstr(p, sep);
        if (!q) break;
        *q = 0;
        if (n < max) strs[n++] = p;
        p = q + strlen(sep);
    }
    return n;   /* the empty element after the last separator is dropped */
}

/* Reads line idx of a vocabulary's .out file into ids; returns the count (-1 when absent). */
static int out_line(const char *name, int idx, int32_t *ids, int max) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/llama.cpp-vocab/ggml-vocab-%s.gguf.out", name);
    char *outf = test_read_file(test_shared(rel), NULL);
    if (!outf) return -1;
    char *line = outf;
    for (int i = 0; i < idx && line; i++) {
        line = strchr(line, '\n');
        if (line) line++;
    }
    int n = -1;
    if (line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        n = 0;
        for (char *tok = strtok(line, " "); tok && n < max; tok = strtok(NULL, " ")) ids[n++] = atoi(tok);
    }
    free(outf);
    return n;
}

/* The ids as a JSON array text, like `kiln tokenize --ids` prints. */
static void ids_json(const int32_t *ids, int n, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", ids[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Runs every .inp/.out pair of a vocabulary; returns the number of matching strings (out of *total). */
static int run_vectors(const char *name, int *total) {
    char rel[256];
    *total = 0;
    snprintf(rel, sizeof rel, "models/llama.cpp-vocab/ggml-vocab-%s.gguf", name);
    vocab v;
    if (!vocab_open(rel, &v)) return 0;
    snprintf(rel, sizeof rel, "models/llama.cpp-vocab/ggml-vocab-%s.gguf.inp", name);
    char *inp = test_read_file(test_shared(rel), NULL);
    snprintf(rel, sizeof rel, "models/llama.cpp-vocab/ggml-vocab-%s.gguf.out", name);
    char *outf = test_read_file(test_shared(rel), NULL);
    if (!inp || !outf) {
        free(inp);
        free(outf);
        vocab_close(&v);
        return 0;
    }
    char *strs[64];
    int n = split_inp(inp, strs, 64);
    int ok = 0;
    char *line = outf;
    for (int i = 0; i < n; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        int32_t want[512];
        int n_want = 0;
        for (char *tok = strtok(line, " "); tok && n_want < 512; tok = strtok(NULL, " ")) want[n_want++] = atoi(tok);
        size_t n_got;
        int32_t *got = encode(v.t, strs[i], strlen(strs[i]), 0, &n_got);
        bool same = got && n_got == (size_t)n_want && !memcmp(got, want, sizeof *got * n_got);
        if (same) ok++;
        else {
            fprintf(stderr, "  %s #%d mismatch for \"%s\"\n    want:", name, i, strs[i]);
            for (int k = 0; k < n_want; k++) fprintf(stderr, " %d", want[k]);
            fprintf(stderr, "\n    got: ");
            for (size_t k = 0; got && k < n_got; k++) fprintf(stderr, " %d", got[k]);
            fprintf(stderr, "\n");
        }
        free(got);
        line = nl ? nl + 1 : line + strlen(line);
    }
    *total = n;
    fprintf(stderr, "  %s: %d/%d vectors match (pre=%s)\n", name, ok, n, kiln_tokenizer_pre_name(v.t));
    free(inp);
    free(outf);
    vocab_close(&v);
    return ok;
}

#define VECTOR_TEST(fn, name)                                   \
    TEST(fn) {                                                  \
        int total;                                              \
        int ok = run_vectors(name, &total);                     \
        CHECK_EQ_INT(total, 46);                                \
        CHECK_EQ_INT(ok, total);                                \
    }

VECTOR_TEST(tok_vectors_llama_spm, "llama-spm")
VECTOR_TEST(tok_vectors_phi_3, "phi-3")
VECTOR_TEST(tok_vectors_gpt_2, "gpt-2")
VECTOR_TEST(tok_vectors_llama_bpe, "llama-bpe")
VECTOR_TEST(tok_vectors_qwen2, "qwen2")
VECTOR_TEST(tok_vectors_smollm, "smollm")
VECTOR_TEST(tok_vectors_deepseek_llm, "deepseek-llm")
VECTOR_TEST(tok_vectors_deepseek_coder, "deepseek-coder")
VECTOR_TEST(tok_vectors_falcon, "falcon")
VECTOR_TEST(tok_vectors_mpt, "mpt")
VECTOR_TEST(tok_vectors_starcoder, "starcoder")
VECTOR_TEST(tok_vectors_refact, "refact")

/* ---------------------------------------------------------------- round trips */

/* Byte-level BPE is lossless: decoding the ids of each test string gives the string back. SPM too, once the
 * dummy-prefix space is taken off. */
TEST(tok_round_trip_all_vocabularies) {
    static const char *names[] = {"llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "smollm", "deepseek-llm",
                                  "deepseek-coder", "falcon", "mpt", "starcoder", "refact"};
    char *inp = test_read_file(test_shared("models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf.inp"), NULL);
    REQUIRE(inp);
    char *strs[64];
    int n = split_inp(inp, strs, 64);
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char rel[128];
        snprintf(rel, sizeof rel, "models/llama.cpp-vocab/ggml-vocab-%s.gguf", names[k]);
        vocab v;
        if (!vocab_open(rel, &v)) continue;
        int ok = 0;
        for (int i = 0; i < n; i++) {
            size_t n_ids, len;
            int32_t *ids = encode(v.t, strs[i], strlen(strs[i]), 0, &n_ids);
            char *s = decode(v.t, ids, n_ids, &len);
            const char *cmp = s;
            if (kiln_tokenizer_add_space_prefix(v.t) && len && s[0] == ' ') cmp++;
            if (!strcmp(cmp, strs[i])) ok++;
            else fprintf(stderr, "  %s: round trip of \"%s\" gave \"%s\"\n", names[k], strs[i], s);
            free(ids);
            free(s);
        }
        CHECKF(ok == n, "%s: %d/%d strings round-trip", names[k], ok, n);
        vocab_close(&v);
    }
    free(inp);
}

/* ---------------------------------------------------------------- published encodings */

/* llama2.c's test.c prompts with BOS, on the real Llama-2 vocabulary inside the random-weight model. */
TEST(tok_llama2_prompts_in_random_model) {
    vocab v;
    REQUIRE(vocab_open("models/random/llama-2-tiny-random.gguf", &v));
    json_error_t jerr;
    json_t *root = json_load_file(test_shared("models/tokenizers/llama2/llama2c-test_c-vectors.json"), 0, &jerr);
    REQUIREF(root, "json: %s", jerr.text);
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) == 5);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        size_t n;
        int32_t *ids = encode(v.t, text, strlen(text), KILN_TOK_ADD_BOS, &n);
        bool same = ids && n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        CHECKF(same, "case %zu (\"%s\"): %zu ids, want %zu", i, text, n, json_array_size(want));
        free(ids);
    }
    json_decref(root);
    vocab_close(&v);
}

/* Meta's Llama 3 chat encodings: the text of the ids (special tokens as their text) parsed with
 * parse_special gives the ids back; without it, no control token comes out. */
TEST(tok_llama3_special_tokens_parse) {
    vocab v;
    REQUIRE(vocab_open("models/llama.cpp-vocab/ggml-vocab-llama-bpe.gguf", &v));
    json_error_t jerr;
    json_t *root = json_load_file(test_shared("models/tokenizers/llama3/llama-models-test_tokenizer-vectors.json"), 0,
                                  &jerr);
    REQUIREF(root, "json: %s", jerr.text);
    json_t *cases = json_object_get(root, "cases");
    int checked = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *want = json_object_get(json_array_get(cases, i), "ids");
        if (!want) continue;
        size_t nw = json_array_size(want);
        char text[4096];
        size_t len = 0;
        for (size_t k = 0; k < nw; k++) {
            int32_t id = (int32_t)json_integer_value(json_array_get(want, k));
            if (kiln_tokenizer_is_control(v.t, id)) {
                gguf_str s = kiln_tokenizer_token_text(v.t, id);
                memcpy(text + len, s.ptr, s.len);
                len += s.len;
            } else {
                len += kiln_tokenizer_piece(v.t, id, text + len, sizeof text - len);
            }
        }
        size_t n;
        int32_t *ids = encode(v.t, text, len, KILN_TOK_PARSE_SPECIAL, &n);
        bool same = ids && n == nw;
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        CHECKF(same, "case %zu: %zu ids, want %zu", i, n, nw);
        free(ids);
        ids = encode(v.t, text, len, 0, &n);
        for (size_t k = 0; ids && k < n; k++)
            CHECKF(!kiln_tokenizer_is_control(v.t, ids[k]), "case %zu: plain text gave control token %d", i, ids[k]);
        free(ids);
        checked++;
    }
    CHECK_EQ_INT(checked, 3);
    json_decref(root);
    vocab_close(&v);
}

/* ADD_BOS follows the vocabulary: Llama 3 adds BOS (llama.cpp's default for llama-bpe), Qwen2 does not. */
TEST(tok_add_bos_follows_vocabulary) {
    vocab v;
    REQUIRE(vocab_open("models/llama.cpp-vocab/ggml-vocab-llama-bpe.gguf", &v));
    size_t n;
    int32_t *ids = encode(v.t, "Hi", 2, KILN_TOK_ADD_BOS, &n);
    REQUIRE(ids && n >= 1);
    CHECK_EQ_INT(ids[0], 128000);
    free(ids);
    vocab_close(&v);
    REQUIRE(vocab_open("models/llama.cpp-vocab/ggml-vocab-qwen2.gguf", &v));
    CHECK(!kiln_tokenizer_add_bos(v.t));
    ids = encode(v.t, "Hi", 2, KILN_TOK_ADD_BOS, &n);
    REQUIRE(ids);
    CHECK_EQ_INT(n, 1);
    free(ids);
    /* llama.cpp's end-of-generation set for this file (PROVENANCE.md) */
    static const int32_t eog[] = {128247, 151643, 151645, 151662, 151663, 151664};
    for (size_t i = 0; i < 6; i++) CHECKF(kiln_tokenizer_is_eog(v.t, eog[i]), "%d should end generation", eog[i]);
    CHECK(!kiln_tokenizer_is_eog(v.t, 151644));   /* <|im_start|> */
    vocab_close(&v);
}

/* Qwen's chat tokens: control ones only with parse_special; the user-defined <think> always (llama.cpp
 * splits user-defined tokens before BPE even without parse_special). */
TEST(tok_qwen2_special_and_user_defined) {
    vocab v;
    REQUIRE(vocab_open("models/llama.cpp-vocab/ggml-vocab-qwen2.gguf", &v));
    const char *text = "<|im_start|>user\n<think>hi</think><|im_end|>";
    int32_t im_start = kiln_tokenizer_find(v.t, "<|im_start|>", 12);
    int32_t im_end = kiln_tokenizer_find(v.t, "<|im_end|>", 10);
    int32_t think = kiln_tokenizer_find(v.t, "<think>", 7);
    REQUIRE(im_start >= 0 && im_end >= 0 && think >= 0);
    size_t n;
    int32_t *ids = encode(v.t, text, strlen(text), KILN_TOK_PARSE_SPECIAL, &n);
    REQUIRE(ids && n >= 4);
    CHECK_EQ_INT(ids[0], im_start);
    CHECK_EQ_INT(ids[n - 1], im_end);
    bool has_think = false;
    for (size_t i = 0; i < n; i++) has_think |= ids[i] == think;
    CHECK(has_think);
    free(ids);
    ids = encode(v.t, text, strlen(text), 0, &n);
    REQUIRE(ids);
    has_think = false;
    for (size_t i = 0; i < n; i++) {
        CHECK(ids[i] != im_start && ids[i] != im_end);
        has_think |= ids[i] == think;
    }
    CHECK(has_think);
    size_t len;
    char *back = decode(v.t, ids, n, &len);
    CHECK_STR(back, text);   /* plain text decodes back to itself */
    free(back);
    free(ids);
    vocab_close(&v);
}

/* ---------------------------------------------------------------- decoding reference generations */

static void check_generation_text(const char *model_rel, const char *json_rel) {
    vocab v;
    if (!vocab_open(model_rel, &v)) return;
    json_error_t jerr;
    json_t *root = json_load_file(test_shared(json_rel), 0, &jerr);
    if (!root) {
        test_failf(__FILE__, __LINE__, "%s: %s", json_rel, jerr.text);
        vocab_close(&v);
        return;
    }
    json_t *ids = json_object_get(root, "generated_token_ids");
    const char *want = json_string_value(json_object_get(root, "text"));
    /* a model stands in for the detokenizer's tokenizer: only m->tok is used */
    struct kiln_model m;
    memset(&m, 0, sizeof m);
    m.tok = v.t;
    kiln_detok d;
    kiln_detok_init(&d, &m, true);
    size_t cap = 65536, len = 0;
    char *got = malloc(cap);
    for (size_t i = 0; i < json_array_size(ids); i++)
        len += kiln_detok_push(&d, (int32_t)json_integer_value(json_array_get(ids, i)), got + len, cap - len);
    len += kiln_detok_flush(&d, got + len, cap - len);
    got[len] = 0;
    CHECKF(want && !strcmp(got, want), "%s: detokenized text differs:\n got: %.120s\nwant: %.120s", json_rel, got,
           want ? want : "(null)");
    free(got);
    json_decref(root);
    vocab_close(&v);
}

TEST(tok_detok_stories260K_references) {
    check_generation_text("models/stories260K/stories260K.gguf",
                          "models/stories260K/expected/llama.cpp/stories260K.greedy-BOS-200.json");
    check_generation_text("models/stories260K/stories260K.gguf",
                          "models/stories260K/expected/llama.cpp/stories260K.greedy-Once_upon_a_time-100.json");
    check_generation_text("models/stories260K/stories260K.gguf",
                          "models/stories260K/expected/llama.cpp/quants/stories260K-Q4_0-ffn_down-F16.greedy-BOS-100.json");
}

TEST(tok_detok_tinystories_references) {
    check_generation_text("models/tinystories-656K/TinyStories-656K-Q8_0.gguf",
                          "models/tinystories-656K/expected/llama.cpp/TinyStories-656K-Q8_0.greedy-BOS-100.json");
    static const char *q[] = {"F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0"};
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/tinystories-656K/expected/llama.cpp/quants/TinyStories-656K-%s.greedy-BOS-100.json",
                 q[i]);
        check_generation_text("models/tinystories-656K/TinyStories-656K-Q8_0.gguf", rel);
    }
}

/* llama2.c's published greedy output equals the decode of the reference ids (first 200, leading space off). */
TEST(tok_detok_llama2c_published_text) {
    vocab v;
    REQUIRE(vocab_open("models/stories260K/stories260K.gguf", &v));
    json_error_t jerr;
    json_t *root = json_load_file(test_shared("models/stories260K/expected/stories260K-greedy256-from-BOS.ids.json"), 0,
                                  &jerr);
    REQUIREF(root, "json: %s", jerr.text);
    json_t *ids = json_object_get(root, "ids");
    if (!ids) ids = json_object_get(root, "generated_ids");
    if (!ids) ids = json_object_get(root, "token_ids");
    REQUIREF(ids && json_array_size(ids) >= 200, "no id array in the ids file");
    int32_t arr[256];
    size_t n = json_array_size(ids) < 256 ? json_array_size(ids) : 256;
    for (size_t i = 0; i < n; i++) arr[i] = (int32_t)json_integer_value(json_array_get(ids, i));
    size_t len;
    char *s = decode(v.t, arr, 200, &len);
    char *want = test_read_file(test_shared("models/stories260K/expected/llama2c-test_all-greedy200.txt"), NULL);
    REQUIRE(want);
    CHECK_STR(s[0] == ' ' ? s + 1 : s, want);
    free(s);
    free(want);
    json_decref(root);
    vocab_close(&v);
}

/* ---------------------------------------------------------------- streaming detokenizer */

TEST(tok_detok_streams_complete_utf8_only) {
    vocab v;
    REQUIRE(vocab_open("models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", &v));
    struct kiln_model m;
    memset(&m, 0, sizeof m);
    m.tok = v.t;
    const char *text = " this is \xF0\x9F\xA6\x99.cpp \xE2\x9C\x85";   /* 🦙 and ✅ come as byte tokens */
    size_t n;
    int32_t *ids = encode(v.t, text, strlen(text), 0, &n);
    REQUIRE(ids);
    kiln_detok d;
    kiln_detok_init(&d, &m, true);
    char out[256];
    size_t len = 0;
    int held = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = kiln_detok_push(&d, ids[i], out + len, sizeof out - len);
        /* what came out is complete UTF-8 on its own */
        size_t j = len;
        while (j < len + k) {
            unsigned char c = (unsigned char)out[j];
            size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            CHECKF(j + l <= len + k, "push %zu split a character", i);
            j += l;
        }
        if (!k) held++;
        len += k;
    }
    len += kiln_detok_flush(&d, out + len, sizeof out - len);
    out[len] = 0;
    CHECK_STR(out, text);   /* only the dummy-prefix space is taken off; the text's own space stays */
    CHECK(held >= 3);           /* bytes of 🦙 waited for the rest of the character */
    free(ids);

    /* an unfinished character is flushed as U+FFFD; a stray continuation byte too */
    int32_t f0 = kiln_tokenizer_find(v.t, "<0xF0>", 6), b9 = kiln_tokenizer_find(v.t, "<0x99>", 6);
    REQUIRE(f0 >= 0 && b9 >= 0);
    kiln_detok_init(&d, &m, false);
    CHECK_EQ_INT(kiln_detok_push(&d, f0, out, sizeof out), 0);
    len = kiln_detok_flush(&d, out, sizeof out);
    CHECK(len == 3 && !memcmp(out, "\xEF\xBF\xBD", 3));
    len = kiln_detok_push(&d, b9, out, sizeof out);
    CHECK(len == 3 && !memcmp(out, "\xEF\xBF\xBD", 3));
    vocab_close(&v);
}

/* ---------------------------------------------------------------- contracts and errors */

TEST(tok_encode_reports_needed_capacity) {
    vocab v;
    REQUIRE(vocab_open("models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf", &v));
    int32_t want[64];
    int n_want = out_line("gpt-2", 16, want, 64);   /* "Hello, world!" */
    REQUIRE(n_want > 2);
    int32_t ids[2];
    size_t n = 0;
    kiln_status st = kiln_tokenizer_encode(v.t, "Hello, world!", 13, 0, ids, 2, &n);
    CHECK_EQ_INT(st, KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(n, n_want);
    CHECK(ids[0] == want[0] && ids[1] == want[1]);
    CHECK(kiln_tokenizer_encode(v.t, "", 0, 0, NULL, 0, &n) == KILN_OK && n == 0);
    CHECK_EQ_INT(kiln_tokenizer_encode(v.t, "x", 1, 0x80, ids, 2, &n), KILN_ERR_INVALID_ARG);
    /* invalid UTF-8 is not an error: the bad byte becomes U+FFFD as in llama.cpp */
    size_t len;
    int32_t *bad = encode(v.t, "a\xFF" "b", 3, 0, &n);
    REQUIRE(bad);
    char *back = decode(v.t, bad, n, &len);
    CHECK_STR(back, "a\xEF\xBF\xBD" "b");
    free(back);
    free(bad);
    vocab_close(&v);
}

TEST(tok_bert_is_reported_unsupported) {
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared("models/llama.cpp-vocab/ggml-vocab-bert-bge.gguf"), &f));
    kiln_tokenizer *t = (kiln_tokenizer *)1;
    CHECK_EQ_INT(kiln_tokenizer_open(f, &t), KILN_ERR_UNSUPPORTED);
    CHECK(t == NULL);
    CHECK(strstr(kiln_last_error(), "bert") != NULL);
    gguf_close(f);
}

/* Writes a copy of src's metadata with one key changed (value NULL: removed) and opens its tokenizer. */
static kiln_status open_modified(const char *src_rel, const char *key, const char *str_value, bool remove,
                                 kiln_tokenizer **out, gguf_file **fout) {
    gguf_file *src;
    *out = NULL;
    *fout = NULL;
    kiln_status st = gguf_open(test_shared(src_rel), &src);
    if (st != KILN_OK) return st;
    gguf_writer *w;
    st = gguf_writer_open(&w);
    for (size_t i = 0; st == KILN_OK && i < gguf_n_kv(src); i++) {
        const gguf_kv *kv = gguf_kv_at(src, i);
        char k[256];
        snprintf(k, sizeof k, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (!strcmp(k, "general.alignment")) continue;
        if (!strcmp(k, key)) {
            if (remove) continue;
            st = gguf_set_str(w, k, str_value, strlen(str_value));
        } else {
            st = gguf_set_value(w, k, &kv->value);
        }
    }
    char path[512];
    snprintf(path, sizeof path, "%s/mod.gguf", test_tmpdir());
    if (st == KILN_OK) st = gguf_writer_write(w, path, NULL, NULL);
    gguf_writer_close(w);
    gguf_close(src);
    if (st != KILN_OK) return st;
    st = gguf_open(path, fout);
    if (st != KILN_OK) return st;
    st = kiln_tokenizer_open(*fout, out);
    return st;
}

TEST(tok_unknown_pre_warns_and_uses_default) {
    kiln_tokenizer *t;
    gguf_file *f;
    REQUIRE_OK(open_modified("models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf", "tokenizer.ggml.pre", "no-such-pre", false,
                             &t, &f));
    CHECK_STR(kiln_tokenizer_pre_name(t), "default");
    size_t n;
    int32_t *ids = encode(t, "Hello world 12345", 17, 0, &n);
    CHECK(ids && n > 0);
    size_t len;
    char *back = decode(t, ids, n, &len);
    CHECK_STR(back, "Hello world 12345");
    free(back);
    free(ids);
    kiln_tokenizer_close(t);
    gguf_close(f);
}

TEST(tok_missing_merges_is_an_error_naming_the_key) {
    kiln_tokenizer *t;
    gguf_file *f;
    kiln_status st = open_modified("models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf", "tokenizer.ggml.merges", NULL, true,
                                   &t, &f);
    CHECK_EQ_INT(st, KILN_ERR_FORMAT);
    CHECK(t == NULL);
    CHECK(strstr(kiln_last_error(), "tokenizer.ggml.merges") != NULL);
    gguf_close(f);
}

TEST(tok_missing_tokens_is_an_error_naming_the_key) {
    kiln_tokenizer *t;
    gguf_file *f;
    kiln_status st = open_modified("models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", "tokenizer.ggml.tokens", NULL,
                                   true, &t, &f);
    CHECK(st != KILN_OK);
    CHECK(t == NULL);
    CHECK(strstr(kiln_last_error(), "tokenizer.ggml.tokens") != NULL);
    gguf_close(f);
}

/* ---------------------------------------------------------------- the CLI */

TEST(tok_cli_tokenize_ids_match_vectors) {
    char cmd[1024], want[512], *out = NULL;
    int32_t ids[64];
    int n = out_line("qwen2", 11, ids, 64);   /* "Hello world" */
    REQUIRE(n > 0);
    ids_json(ids, n, want, sizeof want);
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s -p 'Hello world' --ids", test_kiln_bin(),
             test_shared("models/llama.cpp-vocab/ggml-vocab-qwen2.gguf"));
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECKF(out && !strncmp(out, want, strlen(want)), "got %s want %s", out ? out : "(null)", want);
    free(out);

    snprintf(cmd, sizeof cmd, "%s tokenize --help", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECK(out && strstr(out, "--parse-special"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s tokenize -m x.gguf --bogus 2>/dev/null", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "%s tokenize -p hi 2>/dev/null", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "%s tokenize -m /nonexistent.gguf -p hi 2>/dev/null", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 1);
    free(out);
}

TEST(tok_cli_tokenize_pieces_and_bos) {
    char cmd[1024], want[512], *out = NULL;
    int32_t ids[64];
    int n = out_line("llama-spm", 11, ids, 64);   /* "Hello world" (with the dummy prefix) */
    REQUIRE(n == 2);
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s -p 'Hello world'", test_kiln_bin(),
             test_shared("models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"));
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    /* BOS first (the vocabulary adds it), then the vector's ids */
    vocab v;
    REQUIRE(vocab_open("models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", &v));
    int32_t bos = kiln_tokenizer_bos(v.t);
    vocab_close(&v);
    char l0[32], l1[32], l2[32];
    snprintf(l0, sizeof l0, "%d\t", (int)bos);
    snprintf(l1, sizeof l1, "\n%d\t", ids[0]);
    snprintf(l2, sizeof l2, "\n%d\t", ids[1]);
    CHECKF(out && !strncmp(out, l0, strlen(l0)) && strstr(out, l1) && strstr(out, l2), "got %s", out ? out : "(null)");
    free(out);
    ids_json(ids, n, want, sizeof want);
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s -p 'Hello world' --no-bos --ids", test_kiln_bin(),
             test_shared("models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"));
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECKF(out && !strncmp(out, want, strlen(want)), "got %s want %s", out ? out : "(null)", want);
    free(out);
}

/* ---------------------------------------------------------------- the public API over a model */

/* kiln_tokenize on a model reproduces llama.cpp's prompt ids (add_special=true), and kiln_token_piece and the
 * detokenizer give llama.cpp's pieces and text of the generated ids. */
TEST(tok_public_api_matches_llama_cpp_run) {
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(test_shared("models/stories260K/stories260K.gguf"), &m));
    json_error_t jerr;
    json_t *root = json_load_file(
        test_shared("models/stories260K/expected/llama.cpp/stories260K.greedy-Once_upon_a_time-100.json"), 0, &jerr);
    REQUIREF(root, "json: %s", jerr.text);
    const char *prompt = json_string_value(json_object_get(root, "prompt"));
    json_t *want = json_object_get(root, "prompt_token_ids");
    REQUIRE(prompt && want);
    int32_t ids[64];
    size_t n = 0;
    CHECK_OK(kiln_tokenize(m, prompt, strlen(prompt), KILN_TOK_ADD_BOS, ids, 64, &n));
    bool same = n == json_array_size(want);
    for (size_t i = 0; same && i < n; i++) same = ids[i] == json_integer_value(json_array_get(want, i));
    CHECKF(same, "prompt \"%s\": %zu ids, want %zu", prompt, n, json_array_size(want));
    /* too small a buffer: the needed count comes back */
    CHECK_EQ_INT(kiln_tokenize(m, prompt, strlen(prompt), KILN_TOK_ADD_BOS, ids, 1, &n), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(n, json_array_size(want));

    json_t *gen = json_object_get(root, "generated_token_ids"), *pieces = json_object_get(root, "generated_pieces");
    for (size_t i = 0; i < json_array_size(gen); i++) {
        char buf[64];
        size_t len = 0;
        CHECK_OK(kiln_token_piece(m, (int32_t)json_integer_value(json_array_get(gen, i)), buf, sizeof buf, &len));
        const char *wp = json_string_value(json_array_get(pieces, i));
        CHECKF(wp && len == strlen(wp) && !memcmp(buf, wp, len), "piece %zu: \"%.*s\" want \"%s\"", i, (int)len, buf,
               wp ? wp : "");
        if (test_failures()) break;
    }
    size_t len;
    char small[1];
    CHECK_EQ_INT(kiln_token_piece(m, 100000, small, 1, &len), KILN_ERR_INVALID_ARG);
    CHECK(kiln_token_is_eog(m, kiln_tokenizer_eos(m->tok)));
    CHECK(!kiln_token_is_eog(m, (int32_t)json_integer_value(json_array_get(gen, 0))));
    json_decref(root);
    kiln_model_close(m);
}
