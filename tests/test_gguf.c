/*
 * test_gguf.c — the GGUF reader and writer: every shared GGUF parses, known facts from the PROVENANCE /
 * README files hold, typed getters, and the write → read round trip. Corruption tests live in
 * test_gguf_corrupt.c.
 */
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "formats/formats.h"
#include "gguf/gguf.h"
#include "test.h"

/* ---- every .gguf under shared/models and shared/quant ---- */

static int n_parsed, n_failed;
static int visit_gguf(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)ftw;
    size_t n = strlen(path);
    if (flag != FTW_F || n < 5 || strcmp(path + n - 5, ".gguf")) return 0;
    gguf_file *f = NULL;
    kiln_status st = gguf_open(path, &f);
    if (st != KILN_OK) {
        test_failf(__FILE__, __LINE__, "%s: %s: %s", path, kiln_status_name(st), kiln_last_error());
        n_failed++;
        return 0;
    }
    n_parsed++;
    /* every tensor's bytes are inside the file and the tables agree with the lookups */
    for (size_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK((const uint8_t *)t->data + t->nbytes <= gguf_base(f) + gguf_file_size(f));
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        CHECK(gguf_find_tensor(f, name) == t);
    }
    for (size_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        CHECKF(gguf_find(f, key) == kv, "%s: key %s not found by index", path, key);
    }
    gguf_close(f);
    return 0;
}

TEST(gguf_every_shared_file_parses) {
    n_parsed = n_failed = 0;
    const char *models = test_shared("models"), *quant = test_shared("quant");
    REQUIRE(nftw(models, visit_gguf, 16, FTW_PHYS) == 0);
    REQUIRE(nftw(quant, visit_gguf, 16, FTW_PHYS) == 0);
    printf("parsed %d GGUF files\n", n_parsed);
    CHECK(n_parsed >= 25);
    CHECK_EQ_INT(n_failed, 0);
}

TEST(gguf_missing_file_is_io_error) {
    gguf_file *f = (gguf_file *)1;
    kiln_status st = gguf_open("/nonexistent/dir/x.gguf", &f);
    CHECK_EQ_INT(st, KILN_ERR_IO);
    CHECK(f == NULL);
    CHECK(strstr(kiln_last_error(), "/nonexistent/dir/x.gguf") != NULL);
}

/* ---- known facts (from shared/models/PROVENANCE.md and shared/quant/README.md) ---- */

TEST(gguf_facts_stories260K) {
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared("models/stories260K/stories260K.gguf"), &f));
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_n_kv(f), 19);
    CHECK_EQ_INT(gguf_n_tensors(f), 48);
    gguf_str arch;
    CHECK_OK(gguf_get_str(f, "general.architecture", &arch));
    CHECK(gguf_str_eq(arch, "llama"));
    uint32_t v = 0;
    CHECK_OK(gguf_get_u32(f, "llama.block_count", &v));
    CHECK_EQ_INT(v, 5);
    CHECK_OK(gguf_get_u32(f, "llama.context_length", &v));
    CHECK_EQ_INT(v, 2048);
    CHECK_OK(gguf_get_u32(f, "llama.embedding_length", &v));
    CHECK_EQ_INT(v, 64);
    CHECK_OK(gguf_get_u32(f, "llama.feed_forward_length", &v));
    CHECK_EQ_INT(v, 172);
    CHECK_OK(gguf_get_u32(f, "llama.attention.head_count_kv", &v));
    CHECK_EQ_INT(v, 4);
    float eps = 0;
    CHECK_OK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps));
    CHECK(fabsf(eps - 1e-5f) < 1e-9f);
    CHECK(gguf_find(f, "llama.rope.freq_base") == NULL);
    for (size_t i = 0; i < gguf_n_tensors(f); i++) CHECK_EQ_INT(gguf_tensor_at(f, i)->type, KILN_TYPE_F32);
    gguf_arr toks;
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks));
    CHECK_EQ_INT(toks.n, 512);
    /* output.weight is bit-identical to token_embd.weight */
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight"), *out = gguf_find_tensor(f, "output.weight");
    REQUIRE(emb && out);
    CHECK_EQ_INT(emb->nbytes, out->nbytes);
    CHECK(memcmp(emb->data, out->data, emb->nbytes) == 0);
    CHECK_EQ_INT(emb->ne[0], 64);
    CHECK_EQ_INT(emb->ne[1], 512);
    gguf_close(f);
}

TEST(gguf_facts_gpt2_vocab) {
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared("models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf"), &f));
    gguf_arr toks, merges;
    REQUIRE_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks));
    REQUIRE_OK(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &merges));
    CHECK_EQ_INT(toks.n, 50257);
    CHECK_EQ_INT(merges.n, 50000);
    /* GPT-2's byte-level vocabulary starts with "!" and ends with <|endoftext|> */
    gguf_str first = gguf_arr_str(&toks, 0), last = gguf_arr_str(&toks, toks.n - 1);
    CHECK(gguf_str_eq(first, "!"));
    CHECK(gguf_str_eq(last, "<|endoftext|>"));
    CHECK_EQ_INT(gguf_n_tensors(f), 0);
    gguf_close(f);
}

/* ---- write → read round trip ---- */

/* Deep comparison of two values read from files (nested arrays included). */
static bool arr_equal(const gguf_arr *a, const gguf_arr *b);
static bool value_equal(const gguf_value *a, const gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case GGUF_VT_STRING: return a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
    case GGUF_VT_ARRAY: return arr_equal(&a->v.arr, &b->v.arr);
    case GGUF_VT_F32: case GGUF_VT_F64: return !memcmp(&a->v.f, &b->v.f, sizeof(double));
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64: return a->v.i == b->v.i;
    default: return a->v.u == b->v.u;
    }
}
static bool arr_equal(const gguf_arr *a, const gguf_arr *b) {
    if (a->elem != b->elem || a->n != b->n) return false;
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->elem == GGUF_VT_STRING) {
            gguf_str x = gguf_arr_str(a, i), y = gguf_arr_str(b, i);
            if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len)) return false;
        } else if (a->elem == GGUF_VT_ARRAY) {
            gguf_arr x = gguf_arr_sub(a, i), y = gguf_arr_sub(b, i);
            if (!arr_equal(&x, &y)) return false;
        } else if (a->elem == GGUF_VT_F32 || a->elem == GGUF_VT_F64) {
            double x = gguf_arr_f64(a, i), y = gguf_arr_f64(b, i);
            if (memcmp(&x, &y, sizeof x)) return false;
        } else if (gguf_arr_i64(a, i) != gguf_arr_i64(b, i)) {
            return false;
        }
    }
    return true;
}

/* Copies src (every key and tensor) through the writer into path. */
static kiln_status copy_gguf(const gguf_file *src, const char *path) {
    gguf_writer *w;
    KILN_TRY(gguf_writer_open(&w));
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < gguf_n_kv(src) && !st; i++) {
        const gguf_kv *kv = gguf_kv_at(src, i);
        char key[1024];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        st = gguf_set_value(w, key, &kv->value);
    }
    for (size_t i = 0; i < gguf_n_tensors(src) && !st; i++) {
        const gguf_tensor *t = gguf_tensor_at(src, i);
        char name[1024];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        st = gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    if (!st) st = gguf_writer_write(w, path, NULL, NULL);
    gguf_writer_close(w);
    return st;
}

static void check_same_content(const gguf_file *a, const gguf_file *b) {
    REQUIRE(gguf_n_kv(a) == gguf_n_kv(b));
    REQUIRE(gguf_n_tensors(a) == gguf_n_tensors(b));
    CHECK_EQ_INT(gguf_alignment(a), gguf_alignment(b));
    for (size_t i = 0; i < gguf_n_kv(a); i++) {
        const gguf_kv *x = gguf_kv_at(a, i), *y = gguf_kv_at(b, i);
        CHECK(x->key.len == y->key.len && !memcmp(x->key.ptr, y->key.ptr, x->key.len));
        CHECKF(value_equal(&x->value, &y->value), "value of key %.*s differs", (int)x->key.len, x->key.ptr);
    }
    for (size_t i = 0; i < gguf_n_tensors(a); i++) {
        const gguf_tensor *x = gguf_tensor_at(a, i), *y = gguf_tensor_at(b, i);
        CHECK(x->name.len == y->name.len && !memcmp(x->name.ptr, y->name.ptr, x->name.len));
        CHECK_EQ_INT(x->type, y->type);
        CHECK_EQ_INT(x->n_dims, y->n_dims);
        for (int d = 0; d < GGUF_MAX_DIMS; d++) CHECK_EQ_INT(x->ne[d], y->ne[d]);
        CHECK_EQ_INT(x->nbytes, y->nbytes);
        CHECK(!memcmp(x->data, y->data, x->nbytes));
        CHECK_EQ_INT((uintptr_t)y->data % gguf_alignment(b) == 0 || gguf_alignment(b) > 4096, 1);
    }
}

/* Every shared GGUF was written by ggml or gguf-py, whose layout (key order, tensor order, per-tensor
 * padding to the alignment, no trailing padding without tensors) kiln's writer follows: the copy of each
 * file must come out byte-identical, and read back with the same keys, values and tensor bytes. */
static int n_copied;
static int roundtrip_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)ftw;
    size_t n = strlen(path);
    if (flag != FTW_F || n < 5 || strcmp(path + n - 5, ".gguf")) return 0;
    gguf_file *src = NULL, *back = NULL;
    CHECK_OK(gguf_open(path, &src));
    if (!src) return 0;
    char out[512];
    snprintf(out, sizeof out, "%s/copy%d.gguf", test_tmpdir(), n_copied++);
    CHECK_OK(copy_gguf(src, out));
    CHECK_OK(gguf_open(out, &back));
    if (back) check_same_content(src, back);
    size_t na = 0, nb = 0;
    char *a = test_read_file(path, &na), *b = test_read_file(out, &nb);
    CHECKF(a && b && na == nb && !memcmp(a, b, na), "%s: copy differs (%zu vs %zu bytes)", path, na, nb);
    free(a);
    free(b);
    unlink(out);
    gguf_close(back);
    gguf_close(src);
    return 0;
}

TEST(gguf_roundtrip_shared_files_byte_identical) {
    n_copied = 0;
    REQUIRE(nftw(test_shared("models"), roundtrip_one, 16, FTW_PHYS) == 0);
    REQUIRE(nftw(test_shared("quant"), roundtrip_one, 16, FTW_PHYS) == 0);
    printf("copied %d files\n", n_copied);
    CHECK(n_copied >= 25);
}

/* Counts tensors of each type. */
static void type_counts(const gguf_file *f, int counts[KILN_TYPE_COUNT]) {
    memset(counts, 0, sizeof(int) * KILN_TYPE_COUNT);
    for (size_t i = 0; i < gguf_n_tensors(f); i++) counts[gguf_tensor_at(f, i)->type]++;
}

TEST(gguf_facts_tinystories_656K) {
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), &f));
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_n_kv(f), 34);
    CHECK_EQ_INT(gguf_n_tensors(f), 20);
    int counts[KILN_TYPE_COUNT];
    type_counts(f, counts);
    CHECK_EQ_INT(counts[KILN_TYPE_Q8_0], 15);
    CHECK_EQ_INT(counts[KILN_TYPE_F32], 5);
    uint32_t v = 0;
    CHECK_OK(gguf_get_u32(f, "llama.context_length", &v)); CHECK_EQ_INT(v, 512);
    CHECK_OK(gguf_get_u32(f, "llama.embedding_length", &v)); CHECK_EQ_INT(v, 128);
    CHECK_OK(gguf_get_u32(f, "llama.block_count", &v)); CHECK_EQ_INT(v, 2);
    CHECK_OK(gguf_get_u32(f, "llama.feed_forward_length", &v)); CHECK_EQ_INT(v, 384);
    CHECK_OK(gguf_get_u32(f, "llama.attention.head_count", &v)); CHECK_EQ_INT(v, 8);
    CHECK_OK(gguf_get_u32(f, "llama.rope.dimension_count", &v)); CHECK_EQ_INT(v, 16);
    CHECK_OK(gguf_get_u32(f, "general.file_type", &v)); CHECK_EQ_INT(v, 7);
    float x = 0;
    CHECK_OK(gguf_get_f32(f, "llama.rope.freq_base", &x)); CHECK(x == 10000.0f);
    CHECK_OK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &x)); CHECK(fabsf(x - 1e-6f) < 1e-12f);
    CHECK(gguf_find_tensor(f, "output.weight") == NULL);
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    REQUIRE(emb);
    CHECK_EQ_INT(emb->type, KILN_TYPE_Q8_0);
    CHECK_EQ_INT(emb->ne[0], 128);
    CHECK_EQ_INT(emb->ne[1], 2048);
    CHECK_EQ_INT(emb->nbytes, 2048 * 128 / 32 * 34);
    gguf_arr toks, scores;
    REQUIRE_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks));
    CHECK_EQ_INT(toks.n, 2048);
    CHECK(gguf_str_eq(gguf_arr_str(&toks, 1), "<|start_story|>"));
    CHECK(gguf_str_eq(gguf_arr_str(&toks, 2), "<|end_story|>"));
    REQUIRE_OK(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_F32, &scores));
    CHECK_EQ_INT(scores.n, 2048);
    for (uint64_t i = 0; i < scores.n; i++) CHECK(gguf_arr_f64(&scores, i) == -1000.0);
    bool add_bos = false;
    CHECK_OK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos));
    CHECK(add_bos);
    gguf_close(f);
}

/* The quantized copies hold the type mixes their READMEs state. */
TEST(gguf_facts_quantized_copies) {
    static const struct { const char *file; int n_tensors; int type_a, count_a, type_b, count_b, type_c, count_c; } cases[] = {
        {"models/stories260K/quants/stories260K-F16.gguf", 48, KILN_TYPE_F16, 37, KILN_TYPE_F32, 11, KILN_TYPE_Q8_0, 0},
        {"models/stories260K/quants/stories260K-Q8_0-ffn_down-F16.gguf", 48, KILN_TYPE_Q8_0, 32, KILN_TYPE_F16, 5, KILN_TYPE_F32, 11},
        {"models/stories260K/quants/stories260K-Q4_0-ffn_down-F16.gguf", 48, KILN_TYPE_Q4_0, 31, KILN_TYPE_Q8_0, 1, KILN_TYPE_F16, 5},
        {"models/random/llama-2-tiny-random.gguf", 12, KILN_TYPE_F16, 9, KILN_TYPE_F32, 3, KILN_TYPE_Q8_0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        gguf_file *f;
        REQUIRE_OK(gguf_open(test_shared(cases[k].file), &f));
        int counts[KILN_TYPE_COUNT];
        type_counts(f, counts);
        CHECK_EQ_INT(gguf_n_tensors(f), cases[k].n_tensors);
        CHECKF(counts[cases[k].type_a] == cases[k].count_a, "%s: type %d x%d", cases[k].file, cases[k].type_a, counts[cases[k].type_a]);
        CHECKF(counts[cases[k].type_b] == cases[k].count_b, "%s: type %d x%d", cases[k].file, cases[k].type_b, counts[cases[k].type_b]);
        CHECKF(counts[cases[k].type_c] == cases[k].count_c, "%s: type %d x%d", cases[k].file, cases[k].type_c, counts[cases[k].type_c]);
        gguf_close(f);
    }
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared("models/random/llama-2-tiny-random.gguf"), &f));
    CHECK_EQ_INT(gguf_n_kv(f), 18);
    gguf_arr toks;
    REQUIRE_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks));
    CHECK_EQ_INT(toks.n, 32000);
    uint32_t v = 0;
    CHECK_OK(gguf_get_u32(f, "llama.context_length", &v)); CHECK_EQ_INT(v, 4096);
    CHECK_OK(gguf_get_u32(f, "general.file_type", &v)); CHECK_EQ_INT(v, 1);
    gguf_close(f);
}

/* Vocabulary-only GGUFs: architecture, tokenizer model / pre, vocabulary size and merges (PROVENANCE.md). */
TEST(gguf_facts_vocab_files) {
    static const struct { const char *name, *arch, *model, *pre; int n_vocab, n_merges; } v[] = {
        {"bert-bge", "bert", "bert", "bert-bge", 30522, 0},
        {"deepseek-coder", "llama", "gpt2", "deepseek-coder", 32256, 31757},
        {"deepseek-llm", "llama", "gpt2", "deepseek-llm", 102400, 99757},
        {"falcon", "falcon", "gpt2", "falcon", 65024, 64784},
        {"gpt-2", "gpt2", "gpt2", "gpt-2", 50257, 50000},
        {"llama-spm", "llama", "llama", "default", 32000, 0},
        {"mpt", "mpt", "gpt2", "mpt", 50432, 50009},
        {"phi-3", "phi3", "llama", "default", 32064, 0},
        {"refact", "refact", "gpt2", "refact", 49216, 48891},
        {"starcoder", "starcoder2", "gpt2", "starcoder", 49152, 48872},
        {"smollm", "llama", "gpt2", "smollm", 49152, 48900},
        {"qwen2", "qwen3", "gpt2", "qwen2", 151669, 151387},
        {"llama-bpe", "llama", "gpt2", "llama-bpe", 128256, 280147},
    };
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/llama.cpp-vocab/ggml-vocab-%s.gguf", v[k].name);
        gguf_file *f;
        REQUIRE_OK(gguf_open(test_shared(rel), &f));
        gguf_str s;
        gguf_arr a;
        CHECK_EQ_INT(gguf_version(f), 3);
        CHECK_EQ_INT(gguf_n_tensors(f), 0);
        CHECK_OK(gguf_get_str(f, "general.architecture", &s));
        CHECKF(gguf_str_eq(s, v[k].arch), "%s: arch %.*s", v[k].name, (int)s.len, s.ptr);
        CHECK_OK(gguf_get_str(f, "tokenizer.ggml.model", &s));
        CHECKF(gguf_str_eq(s, v[k].model), "%s: model %.*s", v[k].name, (int)s.len, s.ptr);
        if (strcmp(v[k].pre, "default") || gguf_find(f, "tokenizer.ggml.pre")) {
            CHECK_OK(gguf_get_str(f, "tokenizer.ggml.pre", &s));
            CHECKF(gguf_str_eq(s, v[k].pre), "%s: pre %.*s", v[k].name, (int)s.len, s.ptr);
        }
        CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &a));
        CHECKF(a.n == (uint64_t)v[k].n_vocab, "%s: %llu tokens", v[k].name, (unsigned long long)a.n);
        if (v[k].n_merges) {
            CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &a));
            CHECKF(a.n == (uint64_t)v[k].n_merges, "%s: %llu merges", v[k].name, (unsigned long long)a.n);
        } else {
            CHECK(gguf_find(f, "tokenizer.ggml.merges") == NULL);
        }
        gguf_close(f);
    }
}

/* quant-vectors.gguf (shared/quant/README.md): layout, keys, and per type T the tensors T.q / T.deq / T.dot
 * with the README's shapes; its quantvec.T.block_size / type_size agree with kiln's format table. */
TEST(gguf_facts_quant_vectors) {
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared("quant/quant-vectors.gguf"), &f));
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_alignment(f), 32);
    CHECK_EQ_INT(gguf_n_kv(f), 104);
    CHECK_EQ_INT(gguf_n_tensors(f), 119);
    int64_t seed = 0;
    CHECK_OK(gguf_get_i64(f, "quantvec.seed", &seed));
    CHECK_EQ_INT(seed, 1592598566);
    uint32_t rows = 0, cols = 0;
    CHECK_OK(gguf_get_u32(f, "quantvec.rows", &rows));
    CHECK_OK(gguf_get_u32(f, "quantvec.cols", &cols));
    CHECK_EQ_INT(rows, 8);
    CHECK_EQ_INT(cols, 1024);
    gguf_arr types;
    REQUIRE_OK(gguf_get_arr(f, "quantvec.types", GGUF_VT_STRING, &types));
    CHECK_EQ_INT(types.n, 23);
    for (uint64_t i = 0; i < types.n; i++) {
        gguf_str t = gguf_arr_str(&types, i);
        char key[128], name[64];
        snprintf(name, sizeof name, "%.*s", (int)t.len, t.ptr);
        uint32_t id = 0, bs = 0, ts = 0;
        snprintf(key, sizeof key, "quantvec.%s.ggml_type", name);
        CHECK_OK(gguf_get_u32(f, key, &id));
        snprintf(key, sizeof key, "quantvec.%s.block_size", name);
        CHECK_OK(gguf_get_u32(f, key, &bs));
        snprintf(key, sizeof key, "quantvec.%s.type_size", name);
        CHECK_OK(gguf_get_u32(f, key, &ts));
        const kiln_type_info *ti = kiln_type_get(id);
        REQUIRE(ti);
        CHECKF(!strcmp(ti->name, name), "type %u: kiln calls it %s, the file %s", id, ti->name, name);
        CHECKF(ti->block_size == bs && ti->type_size == ts, "%s: kiln %u/%u, file %u/%u", name, ti->block_size,
               ti->type_size, bs, ts);
        snprintf(key, sizeof key, "%s.q", name);
        const gguf_tensor *q = gguf_find_tensor(f, key);
        REQUIRE(q);
        CHECK_EQ_INT(q->type, id);
        CHECK_EQ_INT(q->ne[0], 1024);
        CHECK_EQ_INT(q->ne[1], 8);
        CHECK_EQ_INT(q->nbytes, 8 * kiln_row_bytes(id, 1024));
        snprintf(key, sizeof key, "%s.deq", name);
        const gguf_tensor *deq = gguf_find_tensor(f, key);
        REQUIRE(deq);
        CHECK(deq->type == KILN_TYPE_F32 && deq->nbytes == 8 * 1024 * 4);
        snprintf(key, sizeof key, "%s.dot", name);
        const gguf_tensor *dot = gguf_find_tensor(f, key);
        REQUIRE(dot);
        CHECK(dot->type == KILN_TYPE_F32 && dot->n_dims == 1 && dot->ne[0] == 8);
    }
    static const struct { const char *name; uint32_t type; } xs[] = {
        {"x", KILN_TYPE_F32}, {"x.f16", KILN_TYPE_F16}, {"x.bf16", KILN_TYPE_BF16},
        {"x.q8_0", KILN_TYPE_Q8_0}, {"x.q8_1", KILN_TYPE_Q8_1}, {"x.q8_K", KILN_TYPE_Q8_K},
    };
    for (size_t k = 0; k < sizeof xs / sizeof *xs; k++) {
        const gguf_tensor *t = gguf_find_tensor(f, xs[k].name);
        REQUIRE(t);
        CHECK_EQ_INT(t->type, xs[k].type);
        CHECK_EQ_INT(t->ne[0], 1024);
    }
    const gguf_tensor *x8k = gguf_find_tensor(f, "x.q8_K");
    CHECK_EQ_INT(x8k->nbytes, 4 * 292);
    gguf_close(f);
}

/* ---- libFuzzer smoke run (~30 s) on a seed corpus from shared/models ---- */

/* Writes a shrunk copy of src: the same metadata, every tensor one block row of its type (zero bytes), so
 * the fuzzer sees small valid files with real metadata and tensor tables. */
static kiln_status write_shrunk(const gguf_file *src, const char *path) {
    gguf_writer *w;
    KILN_TRY(gguf_writer_open(&w));
    static const uint8_t zeros[512];
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < gguf_n_kv(src) && !st; i++) {
        const gguf_kv *kv = gguf_kv_at(src, i);
        char key[1024];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        st = gguf_set_value(w, key, &kv->value);
    }
    for (size_t i = 0; i < gguf_n_tensors(src) && !st; i++) {
        const gguf_tensor *t = gguf_tensor_at(src, i);
        char name[1024];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        uint64_t ne[1] = {kiln_type_get(t->type)->block_size};
        st = gguf_add_tensor(w, name, t->type, 1, ne, zeros);
    }
    if (!st) st = gguf_writer_write(w, path, NULL, NULL);
    gguf_writer_close(w);
    return st;
}

static const char *corpus_dir;
static int n_seeds;
static int seed_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)ftw;
    size_t n = strlen(path);
    if (flag != FTW_F || n < 5 || strcmp(path + n - 5, ".gguf")) return 0;
    const char *base = strrchr(path, '/') + 1;
    char out[1024], cmd[2200];
    if (sb->st_size <= 1300000) { /* small files as they are */
        snprintf(cmd, sizeof cmd, "cp '%s' '%s/%s'", path, corpus_dir, base);
        CHECK(system(cmd) == 0);
        n_seeds++;
    }
    gguf_file *f;
    if (gguf_open(path, &f) != KILN_OK) return 0;
    if (gguf_n_tensors(f) && gguf_data_offset(f) < 200000) {
        snprintf(out, sizeof out, "%s/shrunk-%s", corpus_dir, base);
        CHECK_OK(write_shrunk(f, out));
        n_seeds++;
    }
    gguf_close(f);
    return 0;
}

TEST(gguf_fuzz_smoke_30s) {
    const char *fuzzer = "build/fuzz/gguf_fuzz";
    struct stat sb;
    if (stat(fuzzer, &sb) != 0) {
        test_skip("%s not built (needs clang with the libFuzzer runtime: make fuzz)", fuzzer);
        return;
    }
    /* everything the fuzzer writes (the corpus it grows, crash artifacts) stays under build/, never in
     * the checkout; the listing of fuzz/ before and after proves it */
    char *before = NULL, *after = NULL;
    REQUIRE(test_run_cmd("ls -a fuzz", &before) == 0);
    corpus_dir = "build/fuzz/corpus";
    REQUIRE(system("mkdir -p build/fuzz/corpus build/fuzz/artifacts") == 0);
    n_seeds = 0;
    REQUIRE(nftw(test_shared("models"), seed_one, 16, FTW_PHYS) == 0);
    REQUIRE(nftw(test_shared("quant"), seed_one, 16, FTW_PHYS) == 0);
    CHECK(n_seeds >= 20);
    char cmd[1024], log[600];
    snprintf(log, sizeof log, "%s/fuzz.log", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s -max_total_time=30 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "
             "-artifact_prefix=build/fuzz/artifacts/ %s > %s 2>&1", fuzzer, corpus_dir, log);
    int rc = system(cmd);
    REQUIRE(test_run_cmd("ls -a fuzz", &after) == 0);
    CHECKF(before && after && !strcmp(before, after), "the fuzz run changed fuzz/:\nbefore:\n%s\nafter:\n%s", before, after);
    free(before);
    free(after);
    char *text = test_read_file(log, NULL);
    REQUIRE(text);
    const char *done = strstr(text, "stat::number_of_executed_units:");
    printf("seeds %d; %s", n_seeds, done ? done : "(no final stats)\n");
    CHECKF(rc == 0 && done && !strstr(text, "ERROR:") && !strstr(text, "deadly signal"),
           "fuzzer failed (rc %d):\n%.4000s", rc, text);
    free(text);
}

/* ---- the writer's own contract ---- */

static kiln_status fill_pattern(void *ctx, size_t i, void *dst, uint64_t nbytes) {
    int *fail_at = ctx;
    if (fail_at && (int)i == *fail_at) return kiln_fail(KILN_ERR_IO, "source read failed");
    for (uint64_t k = 0; k < nbytes; k++) ((uint8_t *)dst)[k] = (uint8_t)(i * 31 + k * 7);
    return KILN_OK;
}

TEST(gguf_writer_every_type_and_callback) {
    gguf_writer *w;
    REQUIRE_OK(gguf_writer_open(&w));
    CHECK_OK(gguf_set_u8(w, "u8", 200));
    CHECK_OK(gguf_set_i8(w, "i8", -100));
    CHECK_OK(gguf_set_u16(w, "u16", 60000));
    CHECK_OK(gguf_set_i16(w, "i16", -30000));
    CHECK_OK(gguf_set_u32(w, "u32", 4000000000u));
    CHECK_OK(gguf_set_i32(w, "i32", -2000000000));
    CHECK_OK(gguf_set_u64(w, "u64", 1ull << 63));
    CHECK_OK(gguf_set_i64(w, "i64", INT64_MIN));
    CHECK_OK(gguf_set_f32(w, "f32", 0.1f));
    CHECK_OK(gguf_set_f64(w, "f64", 0.1));
    CHECK_OK(gguf_set_bool(w, "bool", true));
    CHECK_OK(gguf_set_str(w, "str", "h\0i", 3));
    const int32_t ints[3] = {1, -2, 3};
    CHECK_OK(gguf_set_arr_data(w, "ints", GGUF_VT_I32, ints, 3));
    const gguf_str strs[2] = {{"alpha", 5}, {"", 0}};
    CHECK_OK(gguf_set_arr_str(w, "strs", strs, 2));
    CHECK_OK(gguf_set_u32(w, "u8", 7));              /* replaced in place, type changes */
    CHECK_OK(gguf_set_u32(w, "general.alignment", 64));
    CHECK_OK(gguf_set_u32(w, "gone", 1));
    CHECK_OK(gguf_remove_key(w, "gone"));
    CHECK_EQ_INT(gguf_remove_key(w, "gone"), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_set_arr_data(w, "bad", GGUF_VT_STRING, ints, 1), KILN_ERR_INVALID_ARG);
    const uint64_t ne_a[2] = {32, 3}, ne_b[1] = {256}, ne_bad[1] = {33};
    CHECK_OK(gguf_add_tensor(w, "a", KILN_TYPE_Q8_0, 2, ne_a, NULL));
    CHECK_OK(gguf_add_tensor(w, "b", KILN_TYPE_Q4_K, 1, ne_b, NULL));
    CHECK_EQ_INT(gguf_add_tensor(w, "a", KILN_TYPE_F32, 1, ne_b, NULL), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "'a' added twice"));
    CHECK_EQ_INT(gguf_add_tensor(w, "c", 4, 1, ne_b, NULL), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_add_tensor(w, "c", KILN_TYPE_Q4_0, 1, ne_bad, NULL), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "not a multiple of the q4_0 block size 32"));
    char path[512];
    snprintf(path, sizeof path, "%s/all.gguf", test_tmpdir());
    CHECK_EQ_INT(gguf_writer_write(w, path, NULL, NULL), KILN_ERR_INVALID_ARG); /* no data, no callback */
    REQUIRE_OK(gguf_writer_write(w, path, fill_pattern, NULL));
    gguf_writer_close(w);

    gguf_file *f;
    REQUIRE_OK(gguf_open(path, &f));
    CHECK_EQ_INT(gguf_n_kv(f), 15);
    CHECK(gguf_str_eq(gguf_kv_at(f, 0)->key, "u8"));
    CHECK_EQ_INT(gguf_kv_at(f, 0)->value.type, GGUF_VT_U32);
    CHECK_EQ_INT(gguf_kv_at(f, 0)->value.v.u, 7);
    CHECK_EQ_INT(gguf_find(f, "i8")->value.v.i, -100);
    CHECK_EQ_INT(gguf_find(f, "u16")->value.v.u, 60000);
    CHECK_EQ_INT(gguf_find(f, "i16")->value.v.i, -30000);
    CHECK_EQ_INT(gguf_find(f, "u32")->value.v.u, 4000000000u);
    CHECK_EQ_INT(gguf_find(f, "i32")->value.v.i, -2000000000);
    CHECK(gguf_find(f, "u64")->value.v.u == 1ull << 63);
    CHECK(gguf_find(f, "i64")->value.v.i == INT64_MIN);
    CHECK(gguf_find(f, "f32")->value.v.f == (double)0.1f);
    CHECK(gguf_find(f, "f64")->value.v.f == 0.1);
    CHECK(gguf_find(f, "bool")->value.v.u == 1);
    gguf_str s = gguf_find(f, "str")->value.v.str;
    CHECK(s.len == 3 && !memcmp(s.ptr, "h\0i", 3));
    gguf_arr a;
    REQUIRE_OK(gguf_get_arr(f, "ints", GGUF_VT_I32, &a));
    CHECK(a.n == 3 && gguf_arr_i64(&a, 1) == -2);
    REQUIRE_OK(gguf_get_arr(f, "strs", GGUF_VT_STRING, &a));
    CHECK(a.n == 2 && gguf_str_eq(gguf_arr_str(&a, 0), "alpha") && gguf_arr_str(&a, 1).len == 0);
    CHECK(gguf_find(f, "gone") == NULL);
    CHECK_EQ_INT(gguf_alignment(f), 64);
    CHECK_EQ_INT(gguf_data_offset(f) % 64, 0);
    REQUIRE(gguf_n_tensors(f) == 2);
    const gguf_tensor *ta = gguf_find_tensor(f, "a"), *tb = gguf_find_tensor(f, "b");
    REQUIRE(ta && tb);
    CHECK_EQ_INT(ta->nbytes, 3 * 34);
    CHECK_EQ_INT(tb->nbytes, 144);
    CHECK_EQ_INT(tb->offset, 128); /* 102 bytes padded to 64 */
    uint8_t expect[144];
    fill_pattern(NULL, 1, expect, 144);
    CHECK(!memcmp(tb->data, expect, 144));
    CHECK_EQ_INT(gguf_file_size(f), gguf_data_offset(f) + 128 + 192); /* the last tensor is padded too */
    gguf_close(f);
}

TEST(gguf_writer_failure_leaves_no_file) {
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/out.gguf", test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const uint64_t ne[1] = {64};
    /* a first good file at path */
    gguf_writer *w;
    REQUIRE_OK(gguf_writer_open(&w));
    CHECK_OK(gguf_set_str(w, "general.name", "first", 5));
    CHECK_OK(gguf_add_tensor(w, "x", KILN_TYPE_F32, 1, ne, NULL));
    CHECK_OK(gguf_add_tensor(w, "y", KILN_TYPE_F32, 1, ne, NULL));
    REQUIRE_OK(gguf_writer_write(w, path, fill_pattern, NULL));
    /* a second write whose data callback fails on tensor 1: the first file stays, no tmp is left */
    CHECK_OK(gguf_set_str(w, "general.name", "second", 6));
    int fail_at = 1;
    CHECK_EQ_INT(gguf_writer_write(w, path, fill_pattern, &fail_at), KILN_ERR_IO);
    CHECK(strstr(kiln_last_error(), "tensor 'y'") && strstr(kiln_last_error(), "source read failed"));
    CHECK(access(tmp, F_OK) != 0);
    gguf_file *f;
    REQUIRE_OK(gguf_open(path, &f));
    gguf_str name;
    CHECK_OK(gguf_get_str(f, "general.name", &name));
    CHECK(gguf_str_eq(name, "first"));
    gguf_close(f);
    /* a directory that does not exist: an I/O error naming the tmp path */
    CHECK_EQ_INT(gguf_writer_write(w, "/nonexistent-dir/x.gguf", fill_pattern, NULL), KILN_ERR_IO);
    CHECK(strstr(kiln_last_error(), "/nonexistent-dir/x.gguf.tmp"));
    /* a bad general.alignment is refused before anything is written */
    CHECK_OK(gguf_set_u32(w, "general.alignment", 48));
    CHECK_EQ_INT(gguf_writer_write(w, path, fill_pattern, NULL), KILN_ERR_INVALID_ARG);
    gguf_writer_close(w);
}
