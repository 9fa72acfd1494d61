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
