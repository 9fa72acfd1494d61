/*
 * test_gguf.c — the GGUF reader and writer: every shared GGUF parses, known facts from the PROVENANCE /
 * README files hold, typed getters, and the write → read round trip. Corruption tests live in
 * test_gguf_corrupt.c.
 */
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
