/*
 * tokenizer.c — loading a tokenizer from GGUF metadata (tokens, scores, types, merges, special ids, flags),
 * the lookup tables, the special-token split that runs before SPM/BPE, encode dispatch and token pieces.
 *
 * Compatibility target: llama.cpp's llama_vocab (load, tokenizer_st_partition, token_to_piece with
 * special=false). Differences on purpose: a BPE vocabulary without a BOS id reports -1 (not llama.cpp's
 * legacy default 11), and CONTROL/UNKNOWN tokens are never produced from plain text.
 */
#include "tokenizer/tok_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"

/* ---------------------------------------------------------------- hashing */

/* 64x64 -> 128-bit multiply, folded (the mixing step of wyhash-style hashes). */
static inline uint64_t fold_mul(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}
static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline uint64_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* wyhash-style: short inputs (most tokens) take two overlapping 4-byte reads or three single bytes, no byte
 * loop. The result always has bit 63 set. */
uint64_t tok_hash(const char *str, size_t n) {
    static const uint64_t k0 = 0xA0761D6478BD642Full, k1 = 0xE7037ED1A0B428DBull, k2 = 0x8EBC6AF09C88C6E3ull;
    const uint8_t *p = (const uint8_t *)str;
    uint64_t seed = k2 ^ n, a, b;
    if (n <= 16) {
        if (n >= 4) {
            size_t d = (n >> 3) << 2;
            a = (rd32(p) << 32) | rd32(p + d);
            b = (rd32(p + n - 4) << 32) | rd32(p + n - 4 - d);
        } else if (n > 0) {
            a = ((uint64_t)p[0] << 16) | ((uint64_t)p[n >> 1] << 8) | p[n - 1];
            b = 0;
        } else {
            a = b = 0;
        }
    } else {
        size_t i = n;
        for (; i > 16; i -= 16, p += 16) seed = fold_mul(rd64(p) ^ k0, rd64(p + 8) ^ seed);
        a = rd64(p + i - 16);
        b = rd64(p + i - 8);
    }
    return fold_mul(k0 ^ n, fold_mul(a ^ k1, b ^ seed)) | 1ull << 63;   /* never 0: 0 means "no entry" */
}

int32_t tok_lookup_h(const kiln_tokenizer *t, const char *p, size_t n, uint64_t h) {
    uint32_t tag = tok_slot_tag(h);
    for (uint32_t i = (uint32_t)h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        uint32_t s = t->vocab_slots[i];
        if (!s) return -1;
        if (s >> TOK_SLOT_ID_BITS == tag) {
            int32_t id = (int32_t)(s & TOK_SLOT_ID_MASK) - 1;
            gguf_str tx = tok_text(t, id);
            if (tx.len == n && !memcmp(tx.ptr, p, n)) return id;
        }
    }
}

int32_t tok_merge_rank_h(const kiln_tokenizer *t, const char *key, size_t n, uint64_t h) {
    if (!t->merge_slots) return -1;
    uint32_t tag = tok_slot_tag(h);
    for (uint32_t i = (uint32_t)h & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        uint32_t s = t->merge_slots[i];
        if (!s) return -1;
        if (s >> TOK_SLOT_ID_BITS == tag) {
            int32_t rank = (int32_t)(s & TOK_SLOT_ID_MASK) - 1;
            gguf_str m = gguf_arr_str(&t->merges, (uint64_t)rank);
            if (m.len == n && !memcmp(m.ptr, key, n)) return rank;
        }
    }
}

#define PREFETCH 16   /* table inserts run this many entries behind the hashing and prefetching */

static uint32_t table_size_for(size_t n) {
    size_t want = n + n / 2 + 16, sz = 64;
    while (sz < want) sz <<= 1;
    return (uint32_t)sz;
}

/* ---------------------------------------------------------------- loading */

static bool key_present(const gguf_file *f, const char *key) { return gguf_find(f, key) != NULL; }

/* Reads an optional token id key; ids outside the vocabulary keep the default (with a warning). */
static kiln_status read_token_id(const gguf_file *f, const char *key, int n_vocab, int32_t *id) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return KILN_OK;
    int64_t v;
    KILN_TRY(gguf_get_i64(f, key, &v));
    if (v < 0 || v >= n_vocab) {
        /* GGUF writers use 0xFFFFFFFF for "none" */
        if (v != 0xFFFFFFFFll && v != -1)
            KILN_WARN("tokenizer: %s = %lld is outside the vocabulary (%d tokens); ignored", key, (long long)v, n_vocab);
        return KILN_OK;
    }
    *id = (int32_t)v;
    return KILN_OK;
}

static kiln_status read_bool(const gguf_file *f, const char *key, bool *out) {
    if (!key_present(f, key)) return KILN_OK;
    return gguf_get_bool(f, key, out);
}

static void add_eog(kiln_tokenizer *t, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    if (t->n_eog < TOK_MAX_EOG) t->eog[t->n_eog++] = id;
}

/* Finds the first text of list present in the vocabulary; marks it CONTROL (llama.cpp overrides the type of
 * control-looking tokens). Returns the id or -1. */
static int32_t find_marked(kiln_tokenizer *t, const char *const *list, size_t n, bool all_to_eog) {
    int32_t first = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok_lookup(t, list[i], strlen(list[i]));
        if (id < 0) continue;
        t->attr[id] |= TOK_ATTR_CONTROL;
        if (first < 0) first = id;
        if (all_to_eog) add_eog(t, id);
        else break;
    }
    return first;
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const kiln_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint64_t lx = tok_text(t, x).len, ly = tok_text(t, y).len;
    if (lx != ly) return lx > ly ? -1 : 1;
    return (x > y) - (x < y);
}

/* Inserts entry idx (hash h) unless an equal key is there already (the first entry keeps it). Returns false
 * for a duplicate. eq(ctx, a, b) compares the keys of entries a and b. */
static bool table_insert(uint32_t *slots, uint32_t mask, uint64_t h, uint32_t idx,
                         bool (*eq)(const kiln_tokenizer *, uint32_t, uint32_t), const kiln_tokenizer *t) {
    uint32_t tag = tok_slot_tag(h);
    for (uint32_t j = (uint32_t)h & mask;; j = (j + 1) & mask) {
        uint32_t s = slots[j];
        if (!s) {
            slots[j] = (tag << TOK_SLOT_ID_BITS) | (idx + 1);
            return true;
        }
        if (s >> TOK_SLOT_ID_BITS == tag && eq(t, (s & TOK_SLOT_ID_MASK) - 1, idx)) return false;
    }
}

static bool token_eq(const kiln_tokenizer *t, uint32_t a, uint32_t b) {
    gguf_str x = tok_text(t, (int32_t)a), y = tok_text(t, (int32_t)b);
    return x.len == y.len && !memcmp(x.ptr, y.ptr, x.len);
}

static bool merge_eq(const kiln_tokenizer *t, uint32_t a, uint32_t b) {
    gguf_str x = gguf_arr_str(&t->merges, a), y = gguf_arr_str(&t->merges, b);
    return x.len == y.len && !memcmp(x.ptr, y.ptr, x.len);
}

static kiln_status build_vocab(kiln_tokenizer *t) {
    int n = t->n_vocab;
    t->attr = kiln_malloc((size_t)n);
    uint32_t slots = table_size_for((size_t)n);
    t->vocab_slots = kiln_calloc(slots, sizeof *t->vocab_slots);
    if (!t->attr || !t->vocab_slots) return kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory for %d tokens", n);
    t->vocab_mask = slots - 1;
    memset(t->attr, TOK_ATTR_NORMAL, (size_t)n);
    /* hashes run PREFETCH entries ahead of the inserts so the table's cache misses overlap */
    uint64_t ring[PREFETCH];
    size_t n_dup = 0;
    int32_t first_dup = -1;
    for (int i = 0; i < n + PREFETCH; i++) {
        int k = i - PREFETCH;   /* insert entry k (hashed PREFETCH steps ago) before its ring place is reused */
        if (k >= 0 && ring[k % PREFETCH] &&
            !table_insert(t->vocab_slots, t->vocab_mask, ring[k % PREFETCH], (uint32_t)k, token_eq, t) && !n_dup++)
            first_dup = k;
        if (i < n) {
            gguf_str s = tok_text(t, i);
            if (s.len > t->max_token_len) t->max_token_len = (size_t)s.len;
            uint64_t h = s.len ? tok_hash(s.ptr, (size_t)s.len) : 0;   /* 0: empty, never matched */
            ring[i % PREFETCH] = h;
            __builtin_prefetch(&t->vocab_slots[(uint32_t)h & t->vocab_mask], 1);
        }
    }
    if (n_dup)
        KILN_WARN("tokenizer: %zu duplicate token texts (first at id %d); the lowest id keeps each text", n_dup,
                  (int)first_dup);
    return KILN_OK;
}

static kiln_status build_merges(kiln_tokenizer *t) {
    uint32_t n = (uint32_t)t->merges.n;
    uint32_t slots = table_size_for(n);
    t->merge_slots = kiln_calloc(slots, sizeof *t->merge_slots);
    if (!t->merge_slots) return kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory for %u merges", n);
    t->merge_mask = slots - 1;
    /* the key is the whole "left right" string; a lookup rebuilds it from the two pieces. llama.cpp splits at
     * the first space after byte 0: entries without one never match, and byte-level pieces have no spaces. */
    uint64_t ring[PREFETCH];
    for (uint32_t i = 0; i < n + PREFETCH; i++) {
        if (i >= PREFETCH) {   /* insert entry k (hashed PREFETCH steps ago) before its ring place is reused */
            uint32_t k = i - PREFETCH;
            if (ring[k % PREFETCH])   /* duplicates: the first rank wins */
                table_insert(t->merge_slots, t->merge_mask, ring[k % PREFETCH], k, merge_eq, t);
        }
        if (i < n) {
            gguf_str s = gguf_arr_str(&t->merges, i);
            uint64_t h = 0;
            if (s.len > 2 && memchr(s.ptr + 1, ' ', (size_t)s.len - 2)) {
                h = tok_hash(s.ptr, (size_t)s.len);   /* never 0; 0 marks "skip" */
                __builtin_prefetch(&t->merge_slots[(uint32_t)h & t->merge_mask], 1);
            }
            ring[i % PREFETCH] = h;
        }
    }
    return KILN_OK;
}

static kiln_status load_arrays(kiln_tokenizer *t, const gguf_file *f) {
    KILN_TRY(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &t->tokens));
    if (t->tokens.n == 0 || t->tokens.n > TOK_MAX_ENTRIES)
        return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens is out of range (1..%u)",
                         (unsigned long long)t->tokens.n, (unsigned)TOK_MAX_ENTRIES);
    t->n_vocab = (int)t->tokens.n;

    const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.scores");
    if (kv) {
        if (kv->value.type != GGUF_VT_ARRAY ||
            (kv->value.v.arr.elem != GGUF_VT_F32 && kv->value.v.arr.elem != GGUF_VT_I32))
            return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.scores at offset %llu: expected an array of f32",
                             (unsigned long long)kv->offset);
        const gguf_arr *a = &kv->value.v.arr;
        if (a->n < t->tokens.n)
            return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.scores at offset %llu: %llu scores for %llu tokens",
                             (unsigned long long)kv->offset, (unsigned long long)a->n, (unsigned long long)t->tokens.n);
        t->scores = a->data;
        t->scores_i32 = a->elem == GGUF_VT_I32;
    }
    const gguf_arr *types = NULL;
    kv = gguf_find(f, "tokenizer.ggml.token_type");
    if (kv) {
        if (kv->value.type != GGUF_VT_ARRAY || kv->value.v.arr.elem != GGUF_VT_I32)
            return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.token_type at offset %llu: expected an array of i32",
                             (unsigned long long)kv->offset);
        types = &kv->value.v.arr;
        if (types->n < t->tokens.n)
            return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.token_type at offset %llu: %llu types for %llu tokens",
                             (unsigned long long)kv->offset, (unsigned long long)types->n,
                             (unsigned long long)t->tokens.n);
    }
    if (t->kind == TOK_KIND_BPE) {
        if (!key_present(f, "tokenizer.ggml.merges"))
            return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.merges: missing (required for a gpt2 tokenizer)");
        KILN_TRY(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &t->merges));
        if (t->merges.n > TOK_MAX_ENTRIES)
            return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.merges: %llu merges is too many (at most %u)",
                             (unsigned long long)t->merges.n, (unsigned)TOK_MAX_ENTRIES);
    }
    KILN_TRY(build_vocab(t));
    if (types) {
        static const uint8_t map[7] = {0, TOK_ATTR_NORMAL, TOK_ATTR_UNKNOWN, TOK_ATTR_CONTROL,
                                       TOK_ATTR_USER_DEFINED, TOK_ATTR_UNUSED, TOK_ATTR_BYTE};
        for (int i = 0; i < t->n_vocab; i++) {
            int32_t v;
            memcpy(&v, types->data + 4 * (size_t)i, 4);
            t->attr[i] = (v >= 0 && v < 7) ? map[v] : 0;   /* 0: undefined (decodes to nothing) */
        }
    }
    if (t->kind == TOK_KIND_BPE) KILN_TRY(build_merges(t));
    return KILN_OK;
}

static kiln_status load_specials(kiln_tokenizer *t, const gguf_file *f) {
    int n = t->n_vocab;
    if (t->kind == TOK_KIND_SPM) {
        t->bos = 1 < n ? 1 : -1;
        t->eos = 2 < n ? 2 : -1;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else {
        t->bos = t->eos = t->unk = -1;
        t->add_bos = false;
        t->add_space_prefix = false;
    }
    t->pad = t->eot = t->eom = -1;
    int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
    KILN_TRY(read_token_id(f, "tokenizer.ggml.bos_token_id", n, &t->bos));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.eos_token_id", n, &t->eos));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.eot_token_id", n, &t->eot));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.eom_token_id", n, &t->eom));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.unknown_token_id", n, &t->unk));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.padding_token_id", n, &t->pad));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.fim_pad_token_id", n, &fim_pad));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.fim_rep_token_id", n, &fim_rep));
    KILN_TRY(read_token_id(f, "tokenizer.ggml.fim_sep_token_id", n, &fim_sep));
    KILN_TRY(read_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos));
    if (t->kind == TOK_KIND_SPM) KILN_TRY(read_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix));
    if (t->add_bos && t->bos < 0) {
        KILN_WARN("tokenizer: add_bos_token is set but there is no BOS token; BOS will not be added");
        t->add_bos = false;
    }

    /* control-looking tokens found by their text (llama.cpp's list), which also define end-of-generation */
    static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                            "<|end_of_text|>", "<EOT>", "_<EOT>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
                                            "<end_of_utterance>"};
    static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"};
    static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
    static const char *const fim_sep_texts[] = {"<|file_sep|>"};
    static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                            "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
                                            "<end_of_utterance>", "<eos>",
                                            "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"};
    if (t->eot < 0) t->eot = find_marked(t, eot_texts, sizeof eot_texts / sizeof *eot_texts, false);
    if (t->eom < 0) t->eom = find_marked(t, (const char *const[]){"<|eom_id|>"}, 1, false);
    if (fim_pad < 0) fim_pad = find_marked(t, fim_pad_texts, sizeof fim_pad_texts / sizeof *fim_pad_texts, false);
    if (fim_rep < 0) fim_rep = find_marked(t, fim_rep_texts, sizeof fim_rep_texts / sizeof *fim_rep_texts, false);
    if (fim_sep < 0) fim_sep = find_marked(t, fim_sep_texts, 1, false);
    add_eog(t, fim_pad);
    add_eog(t, fim_rep);
    add_eog(t, fim_sep);
    find_marked(t, eog_texts, sizeof eog_texts / sizeof *eog_texts, true);
    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, t->eom);

    /* the special-token split list: longest text first */
    int n_special = 0;
    for (int i = 0; i < n; i++)
        if ((t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) && tok_text(t, i).len) n_special++;
    t->special = kiln_malloc(sizeof *t->special * (size_t)(n_special ? n_special : 1));
    if (!t->special) return kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    for (int i = 0; i < n; i++)
        if ((t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) && tok_text(t, i).len)
            t->special[t->n_special++] = i;
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);

    /* per-model strip attributes (llama.cpp keys them on general.name) */
    gguf_str name = {0};
    if (key_present(f, "general.name") && gguf_get_str(f, "general.name", &name) == KILN_OK) {
        char low[128];
        size_t m = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
        for (size_t i = 0; i < m; i++) low[i] = (char)tolower((unsigned char)name.ptr[i]);
        low[m] = 0;
        if (strstr(low, "phi-3") || strstr(low, "phi3")) {
            for (int i = 0; i < t->n_special; i++) t->attr[t->special[i]] |= TOK_ATTR_RSTRIP;
            int32_t id = tok_lookup(t, "</s>", 4);
            if (id >= 0) t->attr[id] |= TOK_ATTR_RSTRIP;
            static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (size_t i = 0; i < 3; i++) {
                id = tok_lookup(t, keep[i], strlen(keep[i]));
                if (id >= 0) t->attr[id] &= (uint8_t)~TOK_ATTR_RSTRIP;
            }
        }
    }

    /* SPM: can the text be segmented piece by piece between words? Only when no token has U+2581 right after
     * a character other than U+2581 (true for Llama 2; false for TinyStories-656K's "word\u2581" pieces). */
    if (t->kind == TOK_KIND_SPM) {
        t->spm_word_split = true;
        for (int i = 0; i < n && t->spm_word_split; i++) {
            gguf_str s = tok_text(t, i);
            for (size_t k = 1; k + 3 <= s.len; k++) {
                const uint8_t *p = (const uint8_t *)s.ptr + k;
                if (p[0] == 0xE2 && p[1] == 0x96 && p[2] == 0x81 &&
                    !(k >= 3 && p[-3] == 0xE2 && p[-2] == 0x96 && p[-1] == 0x81)) {
                    t->spm_word_split = false;
                    break;
                }
            }
        }
    }

    /* SPM byte fallback */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        int32_t id = tok_lookup(t, buf, 6);
        if (id < 0) {
            char c = (char)b;
            id = tok_lookup(t, &c, 1);
        }
        t->byte_token[b] = id;
    }
    return KILN_OK;
}

kiln_status kiln_tokenizer_open(const gguf_file *f, kiln_tokenizer **out) {
    KILN_ASSERT(f && out);
    *out = NULL;
    gguf_str model;
    if (!key_present(f, "tokenizer.ggml.model"))
        return kiln_fail(KILN_ERR_FORMAT, "tokenizer.ggml.model: missing (the file has no tokenizer)");
    KILN_TRY(gguf_get_str(f, "tokenizer.ggml.model", &model));
    tok_kind kind;
    if (gguf_str_eq(model, "llama")) kind = TOK_KIND_SPM;
    else if (gguf_str_eq(model, "gpt2")) kind = TOK_KIND_BPE;
    else
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "tokenizer.ggml.model = '%.*s' is not supported (supported: llama (SentencePiece), gpt2 "
                         "(byte-level BPE))",
                         (int)(model.len > 64 ? 64 : model.len), model.ptr);

    kiln_tokenizer *t = kiln_calloc(1, sizeof *t);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = kind;
    snprintf(t->model_name, sizeof t->model_name, "%s", kind == TOK_KIND_SPM ? "llama" : "gpt2");
    kiln_status st = load_arrays(t, f);
    if (st == KILN_OK) st = load_specials(t, f);
    if (st == KILN_OK && kind == TOK_KIND_BPE) {
        tok_bytes_init();
        char pre[64] = "";
        if (key_present(f, "tokenizer.ggml.pre")) {
            gguf_str p;
            st = gguf_get_str(f, "tokenizer.ggml.pre", &p);
            if (st == KILN_OK) snprintf(pre, sizeof pre, "%.*s", (int)(p.len > 63 ? 63 : p.len), p.ptr);
        } else {
            KILN_WARN("tokenizer: tokenizer.ggml.pre is missing; using the default pre-tokenizer");
        }
        const char *used = NULL;
        bool ignore_merges = false, add_bos_default = false;
        if (st == KILN_OK) st = tok_pretok_open(pre[0] ? pre : "default", &t->pretok, &ignore_merges, &used);
        if (st == KILN_OK) {
            t->ignore_merges = ignore_merges;
            snprintf(t->pre_name, sizeof t->pre_name, "%s", used);
            /* the llama3 family adds BOS unless the file says otherwise */
            add_bos_default = ignore_merges && t->bos >= 0;
            if (add_bos_default && !key_present(f, "tokenizer.ggml.add_bos_token")) t->add_bos = true;
        }
    } else if (st == KILN_OK) {
        snprintf(t->pre_name, sizeof t->pre_name, "default");
    }
    if (st == KILN_OK && key_present(f, "tokenizer.chat_template")) {
        gguf_str tpl;
        st = gguf_get_str(f, "tokenizer.chat_template", &tpl);
        if (st == KILN_OK) {
            t->chat_template = kiln_strndup(tpl.ptr, (size_t)tpl.len);
            if (!t->chat_template) st = kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
        }
    }
    if (st != KILN_OK) {
        kiln_tokenizer_close(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

void kiln_tokenizer_close(kiln_tokenizer *t) {
    if (!t) return;
    tok_pretok_close(t->pretok);
    kiln_free(t->attr);
    kiln_free(t->vocab_slots);
    kiln_free(t->merge_slots);
    kiln_free(t->special);
    kiln_free(t->chat_template);
    kiln_free(t);
}

/* ---------------------------------------------------------------- accessors */

int kiln_tokenizer_n_vocab(const kiln_tokenizer *t) { return t->n_vocab; }
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t) { return t->bos; }
int32_t kiln_tokenizer_eos(const kiln_tokenizer *t) { return t->eos; }
bool kiln_tokenizer_add_bos(const kiln_tokenizer *t) { return t->add_bos; }
const char *kiln_tokenizer_model_name(const kiln_tokenizer *t) { return t->model_name; }
const char *kiln_tokenizer_chat_template(const kiln_tokenizer *t) { return t->chat_template; }
const char *kiln_tokenizer_pre_name(const kiln_tokenizer *t) { return t->pre_name; }
size_t kiln_tokenizer_max_piece_len(const kiln_tokenizer *t) { return t->max_token_len > 8 ? t->max_token_len : 8; }
bool kiln_tokenizer_add_space_prefix(const kiln_tokenizer *t) { return t->add_space_prefix; }

bool kiln_tokenizer_is_eog(const kiln_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

bool kiln_tokenizer_is_control(const kiln_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_ATTR_CONTROL);
}

int32_t kiln_tokenizer_find(const kiln_tokenizer *t, const char *text, size_t len) {
    if (!len) return -1;
    return tok_lookup(t, text, len);
}

gguf_str kiln_tokenizer_token_text(const kiln_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return (gguf_str){"", 0};
    return tok_text(t, id);
}

/* ---------------------------------------------------------------- special-token split */

typedef struct tok_frag { size_t off, len; int32_t id; } tok_frag;   /* id < 0: raw text */

typedef struct frag_list { tok_frag *v; size_t n, cap; } frag_list;

static bool frag_push(frag_list *l, size_t off, size_t len, int32_t id) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        tok_frag *v = kiln_realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (tok_frag){off, len, id};
    return true;
}

static bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Splits the raw fragments of *cur on every occurrence of special token id (into *next), like llama.cpp's
 * tokenizer_st_partition for one token. With a mask, an occurrence of a control or unknown token that
 * covers a byte whose mask is nonzero (message content) is not split on: it stays raw text. Returns false
 * on allocation failure. */
static bool split_on(const kiln_tokenizer *t, const char *text, const uint8_t *mask, int32_t id, frag_list *cur,
                     frag_list *next, bool *changed) {
    gguf_str txt = tok_text(t, id);
    const char *tx = txt.ptr;
    size_t tn = (size_t)txt.len;
    uint8_t a = t->attr[id];
    const uint8_t *guard = (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) ? mask : NULL;
    next->n = 0;
    *changed = false;
    for (size_t k = 0; k < cur->n; k++) {
        tok_frag fr = cur->v[k];
        if (fr.id >= 0 || fr.len < tn) {
            if (!frag_push(next, fr.off, fr.len, fr.id)) return false;
            continue;
        }
        size_t off = fr.off, len = fr.len, from = off;   /* from: where the search goes on */
        for (;;) {
            size_t end = off + len;
            const char *hit = end - from >= tn ? memmem(text + from, end - from, tx, tn) : NULL;
            if (!hit) {
                if (len > 0 && !frag_push(next, off, len, -1)) return false;
                break;
            }
            size_t m = (size_t)(hit - text);
            if (guard && memchr(guard + m, 1, tn)) {
                from = m + 1;
                continue;
            }
            *changed = true;
            size_t left = m - off;
            if ((a & TOK_ATTR_LSTRIP))
                while (left > 0 && is_ascii_space(text[off + left - 1])) left--;
            if (left > 0 && !frag_push(next, off, left, -1)) return false;
            if (!frag_push(next, 0, 0, id)) return false;
            size_t roff = m + tn, rlen = end - roff;
            if ((a & TOK_ATTR_RSTRIP))
                while (rlen > 0 && is_ascii_space(text[roff])) roff++, rlen--;
            off = from = roff;
            len = rlen;
        }
    }
    return true;
}

/* ---------------------------------------------------------------- encode */

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids,
                                  size_t cap, size_t *n_out) {
    return kiln_tokenizer_encode_marked(t, text, NULL, len, flags, ids, cap, n_out);
}

kiln_status kiln_tokenizer_encode_marked(const kiln_tokenizer *t, const char *text, const uint8_t *mask, size_t len,
                                         int flags, int32_t *ids, size_t cap, size_t *n_out) {
    KILN_ASSERT(t && n_out && (text || !len) && (ids || !cap));
    *n_out = 0;
    if (flags & ~(KILN_TOK_ADD_BOS | KILN_TOK_PARSE_SPECIAL))
        return kiln_fail(KILN_ERR_INVALID_ARG, "tokenize: unknown flags 0x%x", (unsigned)flags);
    tok_out out = {ids, cap, 0};
    if ((flags & KILN_TOK_ADD_BOS) && t->add_bos) tok_out_push(&out, t->bos);

    kiln_status st = KILN_OK;
    frag_list a = {0}, b = {0};
    tok_bpe_scratch *bpe_scratch = NULL;
    if (len > 0) {
        if (!frag_push(&a, 0, len, -1)) {
            st = kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
            goto done;
        }
        bool parse_special = (flags & KILN_TOK_PARSE_SPECIAL) != 0;
        for (int i = 0; i < t->n_special; i++) {
            int32_t id = t->special[i];
            if (!parse_special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
            bool changed;
            if (!split_on(t, text, mask, id, &a, &b, &changed)) {
                st = kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
                goto done;
            }
            if (changed) {
                frag_list tmp = a;
                a = b;
                b = tmp;
            }
        }
    }
    bool prev_special = true;   /* SPM: the dummy prefix goes before the first text and after special tokens */
    for (size_t k = 0; k < a.n && st == KILN_OK; k++) {
        tok_frag fr = a.v[k];
        if (fr.id >= 0) {
            tok_out_push(&out, fr.id);
            prev_special = true;
            continue;
        }
        if (t->kind == TOK_KIND_SPM) {
            st = tok_spm_encode(t, text + fr.off, fr.len, t->add_space_prefix && prev_special, &out);
        } else {
            st = tok_bpe_encode(t, text + fr.off, fr.len, &out, &bpe_scratch);
        }
        prev_special = false;
    }
done:
    tok_bpe_scratch_free(bpe_scratch);
    kiln_free(a.v);
    kiln_free(b.v);
    if (st != KILN_OK) return st;
    *n_out = out.n;
    if (out.n > cap)
        return kiln_fail(KILN_ERR_INVALID_ARG, "tokenize: %zu tokens do not fit the %zu given", out.n, cap);
    return KILN_OK;
}

/* ---------------------------------------------------------------- pieces */

/* Appends bytes to buf at *pos, skipping the first `skip` bytes of the piece overall. */
typedef struct piece_sink { char *buf; size_t cap, skip, pos; } piece_sink;

static inline void sink_put(piece_sink *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s->skip) {
            s->skip--;
            continue;
        }
        if (s->pos < s->cap) s->buf[s->pos] = p[i];
        s->pos++;
    }
}

size_t kiln_tokenizer_piece_at(const kiln_tokenizer *t, int32_t id, size_t skip, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return 0;
    uint8_t a = t->attr[id];
    gguf_str txt = tok_text(t, id);
    const char *p = txt.ptr;
    size_t n = (size_t)txt.len;
    piece_sink s = {buf, cap, skip, 0};
    if (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) return 0;
    if (a & TOK_ATTR_USER_DEFINED) {
        sink_put(&s, p, n);
    } else if (a & TOK_ATTR_NORMAL) {
        if (t->kind == TOK_KIND_SPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && (uint8_t)p[i] == 0xE2 && (uint8_t)p[i + 1] == 0x96 && (uint8_t)p[i + 2] == 0x81) {
                    sink_put(&s, " ", 1);
                    i += 3;
                } else {
                    sink_put(&s, p + i, 1);
                    i++;
                }
            }
        } else {
            /* invert the byte mapping; code points outside it pass through as UTF-8 */
            for (size_t i = 0; i < n;) {
                size_t l = tok_utf8_len((uint8_t)p[i]);
                if (i + l > n) l = n - i;
                uint32_t cp = (uint8_t)p[i];
                if (l == 2) cp = ((cp & 0x1Fu) << 6) | ((uint8_t)p[i + 1] & 0x3Fu);
                int b = (l <= 2) ? tok_cp_to_byte(cp) : -1;
                if (b >= 0) {
                    char c = (char)b;
                    sink_put(&s, &c, 1);
                } else {
                    sink_put(&s, p + i, l);
                }
                i += l;
            }
        }
    } else if (a & TOK_ATTR_BYTE) {
        if (n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && isxdigit((unsigned char)p[3]) &&
            isxdigit((unsigned char)p[4])) {
            char hex[3] = {p[3], p[4], 0};
            char c = (char)strtol(hex, NULL, 16);
            sink_put(&s, &c, 1);
        } else {
            sink_put(&s, p, n);
        }
    }
    return s.pos;
}

size_t kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t id, char *buf, size_t cap) {
    return kiln_tokenizer_piece_at(t, id, 0, buf, cap);
}

/* ---------------------------------------------------------------- UTF-8 */

size_t tok_utf8_valid_prefix(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07, min = 0x10000;
        else return i;
        if (i + n > len) return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n;
    }
    return len;
}
