/* hf_vocab.c — Hugging Face tokenizer.json (+ tokenizer_config.json, config.json) -> GGUF tokenizer.* keys,
 * in the layout of llama.cpp's converter (see hf_vocab.h). */
#include "tools/hf_vocab.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"

#define HF_MAX_VOCAB (1u << 24)   /* a sanity cap on token ids */

/* Owned strings live in a chain of blocks freed together. */
typedef struct str_block { struct str_block *next; size_t used, cap; char data[]; } str_block;

typedef struct hf_priv {
    json_t *tok, *tok_config, *config, *template_file;
    str_block *blocks;
} hf_priv;

static char *pool_alloc(hf_priv *p, size_t n) {
    if (!p->blocks || p->blocks->cap - p->blocks->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        str_block *b = kiln_malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = p->blocks;
        b->used = 0;
        b->cap = cap;
        p->blocks = b;
    }
    char *s = p->blocks->data + p->blocks->used;
    p->blocks->used += n;
    return s;
}

static const char *const special_names[KILN_HF_SPECIAL_COUNT] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
static const char *const special_keys[KILN_HF_SPECIAL_COUNT] = {
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.cls_token_id",
    "tokenizer.ggml.mask_token_id"};

/* ------------------------------------------------------------------ pre-tokenizer detection */

static const char llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char qwen2_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static bool json_type_is(const json_t *o, const char *type) {
    const char *t = json_string_value(json_object_get(o, "type"));
    return t && !strcmp(t, type);
}

/* ByteLevel's use_regex defaults to true. */
static bool byte_level_uses_regex(const json_t *o) {
    json_t *u = json_object_get(o, "use_regex");
    return !u || json_is_true(u);
}

const char *kiln_hf_detect_pre(const void *pre_tokenizer) {
    const json_t *pre = pre_tokenizer;
    if (!json_is_object(pre)) return NULL;
    if (json_type_is(pre, "ByteLevel")) return byte_level_uses_regex(pre) ? "gpt-2" : NULL;
    if (!json_type_is(pre, "Sequence")) return NULL;
    json_t *seq = json_object_get(pre, "pretokenizers");
    size_t n = json_array_size(seq);
    if (n == 2) {
        json_t *a = json_array_get(seq, 0), *b = json_array_get(seq, 1);
        if (json_type_is(a, "Digits") && json_is_true(json_object_get(a, "individual_digits")) &&
            json_type_is(b, "ByteLevel") && byte_level_uses_regex(b))
            return "smollm";
    }
    bool has_byte_level = false;
    const char *regex = NULL;
    int n_split = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(seq, i);
        if (json_type_is(e, "ByteLevel")) has_byte_level = true;
        else if (json_type_is(e, "Split")) {
            n_split++;
            regex = json_string_value(json_object_get(json_object_get(e, "pattern"), "Regex"));
        } else return NULL;
    }
    if (!has_byte_level || n_split != 1 || !regex) return NULL;
    if (!strcmp(regex, llama3_regex)) return "llama-bpe";
    if (!strcmp(regex, qwen2_regex)) return "qwen2";
    return NULL;
}

/* ------------------------------------------------------------------ helpers */

/* Config files may hold integers beyond 64 bits (model_max_length = 1e30): those are parsed with
 * JSON_DECODE_INT_AS_REAL and integers read back through json_int_of. */
static kiln_status load_json(const char *path, const char *label, bool optional, size_t flags, json_t **out) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (optional) return KILN_OK;
        return kiln_fail(KILN_ERR_IO, "%s: cannot open %s", path, label);
    }
    json_error_t err;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL | flags, &err);
    if (!j) {
        if (json_error_code(&err) == json_error_cannot_open_file)
            return kiln_fail(KILN_ERR_IO, "%s: cannot open %s", path, label);
        return kiln_fail(KILN_ERR_FORMAT, "%s: malformed JSON at line %d column %d (byte offset %d): %s", path,
                         err.line, err.column, err.position, err.text);
    }
    if (!json_is_object(j)) {
        json_decref(j);
        return kiln_fail(KILN_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    }
    *out = j;
    return KILN_OK;
}

/* An integer, or a real holding an exact integer (config files are parsed with ints as reals). */
static bool json_int_of(const json_t *j, int64_t *out) {
    if (json_is_integer(j)) { *out = json_integer_value(j); return true; }
    if (!json_is_real(j)) return false;
    double d = json_real_value(j);
    if (!(d >= -9007199254740992.0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

static gguf_str jstr(const json_t *s) { return (gguf_str){json_string_value(s), json_string_length(s)}; }

static bool starts_with(gguf_str s, const char *p) { size_t n = strlen(p); return s.len >= n && !memcmp(s.ptr, p, n); }
static bool ends_with(gguf_str s, const char *p) {
    size_t n = strlen(p);
    return s.len >= n && !memcmp(s.ptr + s.len - n, p, n);
}

/* The converter's does_token_look_special(). */
static bool looks_special(gguf_str s) {
    static const char *const exact[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (s.len == strlen(exact[i]) && !memcmp(s.ptr, exact[i], s.len)) return true;
    if (starts_with(s, "<|") && ends_with(s, "|>")) return true;
    if (starts_with(s, "<\xEF\xBD\x9C") && ends_with(s, "\xEF\xBD\x9C>")) return true; /* <｜ ... ｜> */
    if (starts_with(s, "<unused") && ends_with(s, ">")) return true;
    return false;
}

/* A copy of s with every U+2581 (▁) replaced by a space, or s itself when there is none. */
static kiln_status replace_sp_marks(hf_priv *p, gguf_str s, gguf_str *out) {
    if (!memmem(s.ptr, s.len, "\xE2\x96\x81", 3)) { *out = s; return KILN_OK; }
    char *d = pool_alloc(p, s.len);
    if (!d) return kiln_fail(KILN_ERR_NOMEM, "out of memory copying a token");
    size_t n = 0;
    for (size_t i = 0; i < s.len;) {
        if (i + 3 <= s.len && !memcmp(s.ptr + i, "\xE2\x96\x81", 3)) { d[n++] = ' '; i += 3; }
        else d[n++] = s.ptr[i++];
    }
    *out = (gguf_str){d, n};
    return KILN_OK;
}

/* Joins a pair merge as "a b", encoding spaces inside a part as U+0120 (gguf-py's rule). */
static kiln_status join_merge(hf_priv *p, gguf_str a, gguf_str b, gguf_str *out) {
    size_t n = 1;
    for (size_t i = 0; i < a.len; i++) n += a.ptr[i] == ' ' ? 2 : 1;
    for (size_t i = 0; i < b.len; i++) n += b.ptr[i] == ' ' ? 2 : 1;
    char *d = pool_alloc(p, n);
    if (!d) return kiln_fail(KILN_ERR_NOMEM, "out of memory joining merges");
    size_t k = 0;
    for (int part = 0; part < 2; part++) {
        gguf_str s = part ? b : a;
        if (part) d[k++] = ' ';
        for (size_t i = 0; i < s.len; i++) {
            if (s.ptr[i] == ' ') { d[k++] = (char)0xC4; d[k++] = (char)0xA0; }
            else d[k++] = s.ptr[i];
        }
    }
    *out = (gguf_str){d, k};
    return KILN_OK;
}

void kiln_hf_vocab_free(kiln_hf_vocab *v) {
    if (!v) return;
    hf_priv *p = v->priv;
    if (p) {
        json_decref(p->tok);
        json_decref(p->tok_config);
        json_decref(p->config);
        json_decref(p->template_file);
        for (str_block *b = p->blocks; b;) { str_block *nx = b->next; kiln_free(b); b = nx; }
        kiln_free(p);
    }
    kiln_free(v->tokens);
    kiln_free(v->token_types);
    kiln_free(v->merges);
    kiln_free(v->named_templates);
    kiln_free(v);
}

/* ------------------------------------------------------------------ load */

static kiln_status read_vocab(kiln_hf_vocab *v, const char *tj, json_t *model, json_t *added, json_t *config) {
    hf_priv *p = v->priv;
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return kiln_fail(KILN_ERR_FORMAT, "%s: model.vocab is missing or not an object", tj);
    int64_t max_id = -1;
    for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
        json_t *id = json_object_iter_value(it);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= HF_MAX_VOCAB)
            return kiln_fail(KILN_ERR_FORMAT, "%s: model.vocab['%s']: id is not an integer in 0..%u", tj,
                             json_object_iter_key(it), HF_MAX_VOCAB - 1);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (added && !json_is_array(added)) return kiln_fail(KILN_ERR_FORMAT, "%s: added_tokens is not an array", tj);
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i), *id = json_object_get(a, "id");
        if (!json_is_object(a) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= HF_MAX_VOCAB || !json_is_string(json_object_get(a, "content")))
            return kiln_fail(KILN_ERR_FORMAT, "%s: added_tokens[%zu]: needs an integer 'id' in 0..%u and a string 'content'",
                             tj, i, HF_MAX_VOCAB - 1);
        json_t *sp = json_object_get(a, "special");
        if (sp && !json_is_boolean(sp))
            return kiln_fail(KILN_ERR_FORMAT, "%s: added_tokens[%zu].special is not a boolean", tj, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return kiln_fail(KILN_ERR_FORMAT, "%s: the vocabulary is empty", tj);
    uint64_t n = (uint64_t)max_id + 1;
    int64_t vs;
    if (json_int_of(json_object_get(config, "vocab_size"), &vs)) {
        if (vs < max_id + 1 || vs > HF_MAX_VOCAB)
            return kiln_fail(KILN_ERR_FORMAT, "config.json: vocab_size %lld does not hold token id %lld of %s",
                             (long long)vs, (long long)max_id, tj);
        n = (uint64_t)vs;
    }
    v->n_tokens = (uint32_t)n;
    v->tokens = kiln_calloc(n, sizeof *v->tokens);
    v->token_types = kiln_calloc(n, sizeof *v->token_types);
    if (!v->tokens || !v->token_types) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %llu tokens", (unsigned long long)n);
    for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
        int64_t id = json_integer_value(json_object_iter_value(it));
        v->tokens[id] = (gguf_str){json_object_iter_key(it), json_object_iter_key_len(it)};
        v->token_types[id] = KILN_TOKTYPE_NORMAL;
    }
    /* Added tokens override the model vocabulary (as in Hugging Face's get_vocab()). */
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        int64_t id = json_integer_value(json_object_get(a, "id"));
        gguf_str s = jstr(json_object_get(a, "content"));
        if (json_is_true(json_object_get(a, "special")) || looks_special(s)) {
            v->tokens[id] = s;
            v->token_types[id] = KILN_TOKTYPE_CONTROL;
        } else {
            KILN_TRY(replace_sp_marks(p, s, &v->tokens[id]));
            v->token_types[id] = KILN_TOKTYPE_USER_DEFINED;
        }
    }
    for (uint64_t id = 0; id < n; id++) {
        if (v->token_types[id]) continue;
        char buf[32];
        int len = snprintf(buf, sizeof buf, "[PAD%llu]", (unsigned long long)id);
        char *d = pool_alloc(p, (size_t)len);
        if (!d) return kiln_fail(KILN_ERR_NOMEM, "out of memory for padding tokens");
        memcpy(d, buf, (size_t)len);
        v->tokens[id] = (gguf_str){d, (uint64_t)len};
        v->token_types[id] = KILN_TOKTYPE_UNUSED;
    }
    return KILN_OK;
}

static kiln_status read_merges(kiln_hf_vocab *v, const char *tj, json_t *model) {
    json_t *merges = json_object_get(model, "merges");
    if (!merges) return KILN_OK;
    if (!json_is_array(merges)) return kiln_fail(KILN_ERR_FORMAT, "%s: model.merges is not an array", tj);
    size_t n = json_array_size(merges);
    if (!n) return KILN_OK;
    v->merges = kiln_calloc(n, sizeof *v->merges);
    if (!v->merges) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %zu merges", n);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            v->merges[i] = jstr(m);
            if (!memchr(v->merges[i].ptr, ' ', v->merges[i].len))
                return kiln_fail(KILN_ERR_FORMAT, "%s: model.merges[%zu] '%s' has no space between its parts", tj, i,
                                 json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            KILN_TRY(join_merge(v->priv, jstr(json_array_get(m, 0)), jstr(json_array_get(m, 1)), &v->merges[i]));
        } else {
            return kiln_fail(KILN_ERR_FORMAT, "%s: model.merges[%zu] is neither a string nor a pair of strings", tj, i);
        }
    }
    v->n_merges = n;
    return KILN_OK;
}

static void set_special(kiln_hf_vocab *v, int slot, int64_t id) {
    if (v->special[slot] >= 0 || id < 0 || (uint64_t)id >= v->n_tokens) return;
    v->special[slot] = id;
}

static kiln_status read_config(kiln_hf_vocab *v, const char *dir, json_t *added) {
    hf_priv *p = v->priv;
    json_t *tc = p->tok_config;
    if (tc) {
        for (int t = 0; t < KILN_HF_SPECIAL_COUNT; t++) {
            char key[32];
            snprintf(key, sizeof key, "add_%s_token", special_names[t]);
            json_t *add = json_object_get(tc, key);
            if (json_is_boolean(add)) {
                if (t == KILN_HF_SPECIAL_BOS) v->add_bos = json_is_true(add);
                if (t == KILN_HF_SPECIAL_EOS) v->add_eos = json_is_true(add);
            }
            snprintf(key, sizeof key, "%s_token", special_names[t]);
            json_t *e = json_object_get(tc, key);
            if (json_is_object(e)) e = json_object_get(e, "content");
            if (!json_is_string(e)) continue;
            for (size_t i = 0; i < json_array_size(added); i++) {
                json_t *a = json_array_get(added, i);
                if (json_equal(json_object_get(a, "content"), e)) {
                    set_special(v, t, json_integer_value(json_object_get(a, "id")));
                    break;
                }
            }
        }
        json_t *tpl = json_object_get(tc, "chat_template");
        if (!tpl && p->template_file) tpl = json_object_get(p->template_file, "chat_template");
        if (json_is_string(tpl)) {
            v->chat_template = jstr(tpl);
        } else if (json_is_array(tpl)) {
            size_t n = json_array_size(tpl);
            v->named_templates = kiln_calloc(n ? n : 1, sizeof *v->named_templates);
            if (!v->named_templates) return kiln_fail(KILN_ERR_NOMEM, "out of memory for chat templates");
            for (size_t i = 0; i < n; i++) {
                json_t *e = json_array_get(tpl, i);
                json_t *name = json_object_get(e, "name"), *text = json_object_get(e, "template");
                if (!json_is_string(name) || !json_is_string(text))
                    return kiln_fail(KILN_ERR_FORMAT, "%s/tokenizer_config.json: chat_template[%zu] needs string 'name' and 'template'",
                                     dir, i);
                if (!strcmp(json_string_value(name), "default")) v->chat_template = jstr(text);
                else v->named_templates[v->n_named_templates++] = (kiln_hf_template){jstr(name), jstr(text)};
            }
        } else if (tpl && !json_is_null(tpl)) {
            return kiln_fail(KILN_ERR_FORMAT, "%s/tokenizer_config.json: chat_template is neither a string nor a list", dir);
        }
    }
    if (p->config) {
        for (int t = 0; t < KILN_HF_SPECIAL_COUNT; t++) {
            char key[32];
            snprintf(key, sizeof key, "%s_token_id", special_names[t]);
            int64_t id;
            if (json_int_of(json_object_get(p->config, key), &id)) set_special(v, t, id);
        }
    }
    return KILN_OK;
}

static kiln_status load(kiln_hf_vocab *v, const char *path) {
    hf_priv *p = v->priv;
    struct stat st;
    if (stat(path, &st) != 0) return kiln_fail(KILN_ERR_IO, "%s: no such file or directory", path);
    if (strlen(path) > 4000) return kiln_fail(KILN_ERR_INVALID_ARG, "vocabulary path is too long");
    char dir[4096], tj[4200], file[4200];
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
    } else {
        const char *slash = strrchr(path, '/');
        if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
        else snprintf(dir, sizeof dir, ".");
        snprintf(tj, sizeof tj, "%s", path);
    }
    KILN_TRY(load_json(tj, "tokenizer.json", false, 0, &p->tok));
    snprintf(file, sizeof file, "%s/tokenizer_config.json", dir);
    KILN_TRY(load_json(file, "tokenizer_config.json", true, JSON_DECODE_INT_AS_REAL, &p->tok_config));
    snprintf(file, sizeof file, "%s/config.json", dir);
    KILN_TRY(load_json(file, "config.json", true, JSON_DECODE_INT_AS_REAL, &p->config));
    snprintf(file, sizeof file, "%s/chat_template.json", dir);
    KILN_TRY(load_json(file, "chat_template.json", true, JSON_DECODE_INT_AS_REAL, &p->template_file));

    json_t *model = json_object_get(p->tok, "model");
    if (!json_is_object(model)) return kiln_fail(KILN_ERR_FORMAT, "%s: 'model' is missing or not an object", tj);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (json_object_get(model, "type") && (!type || strcmp(type, "BPE")))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: model.type '%s' is not supported (only byte-level BPE)", tj,
                         type ? type : "(not a string)");
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: a byte-fallback BPE (SentencePiece-style) is not supported; "
                         "use --vocab with a GGUF instead", tj);
    json_t *pre = json_object_get(p->tok, "pre_tokenizer");
    v->pre = kiln_hf_detect_pre(pre);
    if (!v->pre) {
        const char *pt = json_string_value(json_object_get(pre, "type"));
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: pre_tokenizer of type '%s' is not one kiln recognises "
                         "(smollm, llama-bpe, qwen2, gpt-2)", tj, pt ? pt : "(none)");
    }
    json_t *added = json_object_get(p->tok, "added_tokens");
    KILN_TRY(read_vocab(v, tj, model, added, p->config));
    KILN_TRY(read_merges(v, tj, model));
    KILN_TRY(read_config(v, dir, added));
    /* convert_hf_to_gguf's LlamaModel sets add_bos_token = false for 49152-token (SmolLM) vocabularies. */
    if (v->add_bos < 0 && !strcmp(v->pre, "smollm")) v->add_bos = 0;
    return KILN_OK;
}

kiln_status kiln_hf_vocab_load(const char *path, kiln_hf_vocab **out) {
    *out = NULL;
    kiln_hf_vocab *v = kiln_calloc(1, sizeof *v);
    hf_priv *p = kiln_calloc(1, sizeof *p);
    if (!v || !p) {
        kiln_free(v);
        kiln_free(p);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    v->priv = p;
    v->add_bos = v->add_eos = -1;
    for (int i = 0; i < KILN_HF_SPECIAL_COUNT; i++) v->special[i] = -1;
    kiln_status st = load(v, path);
    if (st != KILN_OK) {
        kiln_hf_vocab_free(v);
        return st;
    }
    *out = v;
    return KILN_OK;
}

/* ------------------------------------------------------------------ write */

kiln_status kiln_hf_vocab_write(const kiln_hf_vocab *v, gguf_writer *w) {
    KILN_TRY(gguf_set_str(w, "tokenizer.ggml.model", "gpt2", 4));
    KILN_TRY(gguf_set_str(w, "tokenizer.ggml.pre", v->pre, strlen(v->pre)));
    KILN_TRY(gguf_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, v->n_tokens));
    KILN_TRY(gguf_set_arr_data(w, "tokenizer.ggml.token_type", GGUF_VT_I32, v->token_types, v->n_tokens));
    if (v->n_merges) KILN_TRY(gguf_set_arr_str(w, "tokenizer.ggml.merges", v->merges, v->n_merges));
    for (int t = 0; t < KILN_HF_SPECIAL_COUNT; t++)
        if (v->special[t] >= 0) KILN_TRY(gguf_set_u32(w, special_keys[t], (uint32_t)v->special[t]));
    if (v->add_bos >= 0) KILN_TRY(gguf_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos));
    if (v->add_eos >= 0) KILN_TRY(gguf_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos));
    if (v->chat_template.ptr)
        KILN_TRY(gguf_set_str(w, "tokenizer.chat_template", v->chat_template.ptr, v->chat_template.len));
    for (uint32_t i = 0; i < v->n_named_templates; i++) {
        char key[512];
        const kiln_hf_template *t = &v->named_templates[i];
        if (t->name.len > 400) return kiln_fail(KILN_ERR_FORMAT, "chat template name is too long (%llu bytes)",
                                                (unsigned long long)t->name.len);
        snprintf(key, sizeof key, "tokenizer.chat_template.%.*s", (int)t->name.len, t->name.ptr);
        KILN_TRY(gguf_set_str(w, key, t->text.ptr, t->text.len));
    }
    return KILN_OK;
}
