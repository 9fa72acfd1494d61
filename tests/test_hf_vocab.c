/* test_hf_vocab.c — the Hugging Face tokenizer importer against the vocabulary GGUFs that llama.cpp's
 * converter layout produced from the same files (../shared/models/llama.cpp-vocab/, PROVENANCE.md), and
 * its handling of hand-made tokenizer files (converter rules) and of malformed input. */
#include "test.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "tools/hf_vocab.h"

static bool str_eq(gguf_str a, gguf_str b) { return a.len == b.len && !memcmp(a.ptr, b.ptr, (size_t)a.len); }

static size_t elem_size(gguf_vtype t) {
    switch (t) {
    case GGUF_VT_U8: case GGUF_VT_I8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_U16: case GGUF_VT_I16: return 2;
    case GGUF_VT_U32: case GGUF_VT_I32: case GGUF_VT_F32: return 4;
    case GGUF_VT_U64: case GGUF_VT_I64: case GGUF_VT_F64: return 8;
    default: return 0;
    }
}

/* Compares two values; for arrays, *n_equal / *n_total count equal elements. */
static bool value_eq(const gguf_value *a, const gguf_value *b, uint64_t *n_equal, uint64_t *n_total) {
    *n_equal = *n_total = 1;
    if (a->type != b->type) { *n_equal = 0; return false; }
    bool eq;
    switch (a->type) {
    case GGUF_VT_STRING: eq = str_eq(a->v.str, b->v.str); break;
    case GGUF_VT_F32: case GGUF_VT_F64: eq = a->v.f == b->v.f; break;
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64: eq = a->v.i == b->v.i; break;
    case GGUF_VT_ARRAY: {
        const gguf_arr *x = &a->v.arr, *y = &b->v.arr;
        *n_total = x->n > y->n ? x->n : y->n;
        *n_equal = 0;
        if (x->elem != y->elem) return false;
        uint64_t n = x->n < y->n ? x->n : y->n;
        for (uint64_t i = 0; i < n; i++) {
            if (x->elem == GGUF_VT_STRING) *n_equal += str_eq(gguf_arr_str(x, i), gguf_arr_str(y, i));
            else if (elem_size(x->elem)) *n_equal += !memcmp(x->data + i * elem_size(x->elem), y->data + i * elem_size(x->elem), elem_size(x->elem));
        }
        return *n_equal == *n_total;
    }
    default: eq = a->v.u == b->v.u; break;
    }
    *n_equal = eq;
    return eq;
}

/* Imports dir, writes a vocabulary-only GGUF, and compares every tokenizer.* key with ref (both ways). */
static void compare_with_reference(const char *dir, const char *ref_path, const char *want_pre) {
    kiln_hf_vocab *v;
    REQUIRE_OK(kiln_hf_vocab_load(test_shared(dir), &v));
    CHECK_STR(v->pre, want_pre);
    gguf_writer *w;
    REQUIRE_OK(gguf_writer_open(&w));
    kiln_status st = kiln_hf_vocab_write(v, w);
    char out[512];
    snprintf(out, sizeof out, "%s/vocab.gguf", test_tmpdir());
    if (st == KILN_OK) st = gguf_writer_write(w, out, NULL, NULL);
    gguf_writer_close(w);
    kiln_hf_vocab_free(v);
    REQUIRE_OK(st);

    gguf_file *mine, *ref;
    REQUIRE_OK(gguf_open(out, &mine));
    kiln_status rs = gguf_open(test_shared(ref_path), &ref);
    if (rs != KILN_OK) { gguf_close(mine); REQUIRE_OK(rs); }
    int n_keys = 0;
    for (size_t i = 0; i < gguf_n_kv(ref); i++) {
        const gguf_kv *kv = gguf_kv_at(ref, i);
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
        n_keys++;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        const gguf_kv *m = gguf_find(mine, key);
        CHECKF(m != NULL, "%s: key %s missing from the import", dir, key);
        if (!m) continue;
        uint64_t eq, tot;
        bool same = value_eq(&kv->value, &m->value, &eq, &tot);
        CHECKF(same, "%s: %s differs (%llu/%llu elements equal)", dir, key, (unsigned long long)eq, (unsigned long long)tot);
        if (kv->value.type == GGUF_VT_ARRAY)
            printf("  %-28s %llu/%llu equal\n", key, (unsigned long long)eq, (unsigned long long)tot);
        else
            printf("  %-28s %s\n", key, same ? "equal" : "DIFFERENT");
    }
    /* and nothing extra */
    for (size_t i = 0; i < gguf_n_kv(mine); i++) {
        const gguf_kv *kv = gguf_kv_at(mine, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        CHECKF(gguf_find(ref, key) != NULL, "%s: the import has %s, the reference does not", dir, key);
    }
    CHECKF(n_keys >= 6, "reference %s has only %d tokenizer keys", ref_path, n_keys);
    gguf_close(mine);
    gguf_close(ref);
}

TEST(hf_vocab_smollm2_equals_converter_gguf) {
    compare_with_reference("models/tokenizers/smollm2-135m-instruct", "models/llama.cpp-vocab/ggml-vocab-smollm.gguf", "smollm");
}

TEST(hf_vocab_qwen3_equals_converter_gguf) {
    compare_with_reference("models/tokenizers/qwen3/tokenizer.json", "models/llama.cpp-vocab/ggml-vocab-qwen2.gguf", "qwen2");
}

TEST(hf_vocab_llama3_equals_converter_gguf) {
    compare_with_reference("models/tokenizers/llama3", "models/llama.cpp-vocab/ggml-vocab-llama-bpe.gguf", "llama-bpe");
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { test_failf(__FILE__, __LINE__, "cannot write %s", path); return; }
    fputs(text, f);
    fclose(f);
}

static const char *tiny_tokenizer =
    "{\"added_tokens\": ["
    "  {\"id\": 6, \"content\": \"<s>\", \"special\": true},"
    "  {\"id\": 7, \"content\": \"<|user|>\", \"special\": false},"
    "  {\"id\": 9, \"content\": \"\xE2\x96\x81hi\", \"special\": false}],"
    " \"normalizer\": null,"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "   {\"type\": \"Digits\", \"individual_digits\": true},"
    "   {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}]},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"a b\": 3, \"c\": 5},"
    "   \"merges\": [[\"a\", \"b\"], [\"a \", \"b\"]]}}";

/* The converter's rules on a hand-made tokenizer: id gaps padded as [PADi] UNUSED up to config.json's
 * vocab_size, added tokens CONTROL when special or "<|...|>", USER_DEFINED otherwise with ▁ as a space,
 * pair merges joined with a space and inner spaces as U+0120, special ids from tokenizer_config.json
 * (string or {content}) before config.json, add_bos_token, and a list of named chat templates. */
TEST(hf_vocab_converter_rules_on_a_small_tokenizer) {
    const char *dir = test_tmpdir();
    write_text(dir, "tokenizer.json", tiny_tokenizer);
    write_text(dir, "config.json", "{\"vocab_size\": 12, \"bos_token_id\": 0, \"eos_token_id\": 5, \"pad_token_id\": 99}");
    write_text(dir, "tokenizer_config.json",
               "{\"bos_token\": {\"content\": \"<s>\"}, \"unk_token\": \"<|user|>\", \"add_bos_token\": true,"
               " \"model_max_length\": 1000000000000000019884624838656,"
               " \"chat_template\": [{\"name\": \"default\", \"template\": \"D\"}, {\"name\": \"tool_use\", \"template\": \"T\"}]}");
    kiln_hf_vocab *v;
    REQUIRE_OK(kiln_hf_vocab_load(dir, &v));
    CHECK_STR(v->pre, "smollm");
    CHECK_EQ_INT(v->n_tokens, 12);
    static const char *const want_tok[12] = {"a", "b", "ab", "a b", "[PAD4]", "c", "<s>", "<|user|>", "[PAD8]", " hi",
                                             "[PAD10]", "[PAD11]"};
    static const int want_type[12] = {1, 1, 1, 1, 5, 1, 3, 3, 5, 4, 5, 5};
    for (int i = 0; i < 12 && (uint32_t)i < v->n_tokens; i++) {
        CHECKF(v->tokens[i].len == strlen(want_tok[i]) && !memcmp(v->tokens[i].ptr, want_tok[i], v->tokens[i].len),
               "token %d is '%.*s', want '%s'", i, (int)v->tokens[i].len, v->tokens[i].ptr, want_tok[i]);
        CHECKF(v->token_types[i] == want_type[i], "token %d type %d, want %d", i, v->token_types[i], want_type[i]);
    }
    REQUIRE(v->n_merges == 2);
    CHECK(v->merges[0].len == 3 && !memcmp(v->merges[0].ptr, "a b", 3));
    CHECK(v->merges[1].len == 5 && !memcmp(v->merges[1].ptr, "a\xC4\xA0 b", 5));
    CHECK_EQ_INT(v->special[KILN_HF_SPECIAL_BOS], 6);   /* tokenizer_config wins over config.json's 0 */
    CHECK_EQ_INT(v->special[KILN_HF_SPECIAL_EOS], 5);   /* from config.json */
    CHECK_EQ_INT(v->special[KILN_HF_SPECIAL_UNK], 7);
    CHECK_EQ_INT(v->special[KILN_HF_SPECIAL_PAD], -1);  /* 99 is out of range: ignored */
    CHECK_EQ_INT(v->add_bos, 1);
    CHECK_EQ_INT(v->add_eos, -1);
    CHECK(v->chat_template.len == 1 && v->chat_template.ptr[0] == 'D');
    REQUIRE(v->n_named_templates == 1);
    CHECK(v->named_templates[0].name.len == 8 && !memcmp(v->named_templates[0].name.ptr, "tool_use", 8));
    kiln_hf_vocab_free(v);
}

static kiln_status load_text(const char *text, kiln_hf_vocab **v) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/bad", test_tmpdir());
    mkdir(dir, 0755);
    write_text(dir, "tokenizer.json", text);
    return kiln_hf_vocab_load(dir, v);
}

TEST(hf_vocab_rejects_malformed_and_unsupported_input) {
    kiln_hf_vocab *v = (kiln_hf_vocab *)1;
    char path[512];
    snprintf(path, sizeof path, "%s/none", test_tmpdir());
    CHECK_EQ_INT(kiln_hf_vocab_load(path, &v), KILN_ERR_IO);
    CHECK(v == NULL);

    /* truncated JSON: the message gives the byte offset */
    size_t n = strlen(tiny_tokenizer);
    char *cut = malloc(n);
    REQUIRE(cut);
    memcpy(cut, tiny_tokenizer, n / 2);
    cut[n / 2] = '\0';
    CHECK_EQ_INT(load_text(cut, &v), KILN_ERR_FORMAT);
    CHECKF(strstr(kiln_last_error(), "byte offset") != NULL, "message: %s", kiln_last_error());
    free(cut);

    /* a wrong-kind field is named */
    char *bad = malloc(n + 16);
    REQUIRE(bad);
    strcpy(bad, tiny_tokenizer);
    char *c = strstr(bad, "\"c\": 5");
    REQUIRE(c);
    memcpy(c, "\"c\": \"5\"", 8);
    strcpy(c + 8, strstr(tiny_tokenizer, "\"c\": 5") + 6);
    CHECK_EQ_INT(load_text(bad, &v), KILN_ERR_FORMAT);
    CHECKF(strstr(kiln_last_error(), "model.vocab['c']") != NULL, "message: %s", kiln_last_error());

    /* an unknown pre-tokenizer regex and a non-BPE model are unsupported */
    strcpy(bad, tiny_tokenizer);
    c = strstr(bad, "\"Digits\"");
    REQUIRE(c);
    memcpy(c, "\"Digitz\"", 8);
    CHECK_EQ_INT(load_text(bad, &v), KILN_ERR_UNSUPPORTED);
    strcpy(bad, tiny_tokenizer);
    c = strstr(bad, "\"BPE\"");
    REQUIRE(c);
    memcpy(c, "\"WPM\"", 5);
    CHECK_EQ_INT(load_text(bad, &v), KILN_ERR_UNSUPPORTED);
    CHECK(v == NULL);
    free(bad);

    /* the regexes of the real files are told apart: Qwen2's with Llama 3's digit rule is Llama 3's */
    json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}}, {s:s, s:b}]}", "type", "Sequence", "pretokenizers", "type", "Split",
                            "pattern", "Regex", "\\p{N}{1,3}", "type", "ByteLevel", "use_regex", 0);
    REQUIRE(pre);
    CHECK(kiln_hf_detect_pre(pre) == NULL);
    json_decref(pre);
}
