/*
 * tok_internal.h — the inside of kiln_tokenizer, shared by tokenizer.c (loading, special tokens, public
 * entry points), spm.c (SentencePiece-style score merges), bpe.c (byte-level BPE merges) and pretok.c
 * (pre-tokenizer regexes). Not part of any public interface.
 *
 * Lookup tables are built at open with a few big allocations: a token-text hash table (open addressing,
 * 4-byte slots holding id+1 and an 11-bit hash tag) and, for BPE, a merge hash table keyed by the whole
 * "left right" merge string. Token strings and merge strings are read from the GGUF map (gguf_arr_str).
 */
#ifndef KILN_TOK_INTERNAL_H
#define KILN_TOK_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* Token attributes (bit set; llama.cpp's token types mapped to flags). */
enum {
    TOK_ATTR_NORMAL = 1 << 0,
    TOK_ATTR_UNKNOWN = 1 << 1,
    TOK_ATTR_CONTROL = 1 << 2,
    TOK_ATTR_USER_DEFINED = 1 << 3,
    TOK_ATTR_UNUSED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
    TOK_ATTR_LSTRIP = 1 << 6,   /* special-token split eats whitespace on its left */
    TOK_ATTR_RSTRIP = 1 << 7,   /* ... and on its right */
};

typedef enum tok_kind { TOK_KIND_SPM = 0, TOK_KIND_BPE = 1 } tok_kind;

/* A hash-table slot: 0 = empty, else (tag << TOK_SLOT_ID_BITS) | (index + 1), the tag being 11 more bits
 * of the hash. 4-byte slots keep the tables small: at open, every fresh page costs a page fault. */
#define TOK_SLOT_ID_BITS 21
#define TOK_SLOT_ID_MASK ((1u << TOK_SLOT_ID_BITS) - 1)
#define TOK_MAX_ENTRIES (TOK_SLOT_ID_MASK - 1)   /* tokens or merges per table */
static inline uint32_t tok_slot_tag(uint64_t h) { return (uint32_t)(h >> 52) & 0x7FF; }   /* 11 bits below bit 63 */

#define TOK_MAX_REGEX 8
#define TOK_MAX_EOG 32

typedef struct tok_pretok tok_pretok;   /* pretok.c */

struct kiln_tokenizer {
    tok_kind kind;
    int n_vocab;
    gguf_arr tokens;         /* tokenizer.ggml.tokens: texts stay in the map (gguf_arr_str) */
    const uint8_t *scores;   /* tokenizer.ggml.scores data in the map (f32 or i32), NULL when absent */
    bool scores_i32;
    uint8_t *attr;           /* n_vocab TOK_ATTR_* */
    size_t max_token_len;

    uint32_t *vocab_slots;   /* token text -> id */
    uint32_t vocab_mask;

    gguf_arr merges;         /* BPE: tokenizer.ggml.merges ("left right", rank order) in the map */
    uint32_t *merge_slots;   /* (hash(left), hash(right)) -> rank */
    uint32_t merge_mask;

    int32_t bos, eos, unk, pad, eot, eom;
    bool add_bos, add_space_prefix, ignore_merges;
    bool spm_word_split;     /* SPM: no token has U+2581 right after another character (see spm.c) */
    int32_t byte_token[256]; /* SPM byte fallback: <0xXX> (or the 1-byte token), -1 when absent */

    int32_t *special;        /* CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    int n_special;
    int32_t eog[TOK_MAX_EOG];
    int n_eog;

    char *chat_template;     /* NUL-terminated copy or NULL */
    char model_name[16];     /* "llama" | "gpt2" */
    char pre_name[64];       /* tokenizer.ggml.pre as used ("default" when absent/unknown) */

    tok_pretok *pretok;      /* BPE pre-tokenizer (compiled regexes) */
};

/* The stored text of token id (a view into the map). */
static inline gguf_str tok_text(const kiln_tokenizer *t, int32_t id) { return gguf_arr_str(&t->tokens, (uint64_t)id); }

/* The score of token id (0 when the file has none). */
static inline float tok_score(const kiln_tokenizer *t, int32_t id) {
    if (!t->scores) return 0.0f;
    if (t->scores_i32) {
        int32_t v;
        memcpy(&v, t->scores + 4 * (size_t)id, 4);
        return (float)v;
    }
    float f;
    memcpy(&f, t->scores + 4 * (size_t)id, 4);
    return f;
}

/* ---------------------------------------------------------------- hashing and lookup (tokenizer.c) */

/* The 64-bit hash of n bytes used by every table of the tokenizer (never 0). */
uint64_t tok_hash(const char *p, size_t n);

/* The id of the token whose text is exactly p[0..n), -1 when none. h must be tok_hash(p, n). */
int32_t tok_lookup_h(const kiln_tokenizer *t, const char *p, size_t n, uint64_t h);
static inline int32_t tok_lookup(const kiln_tokenizer *t, const char *p, size_t n) {
    return tok_lookup_h(t, p, n, tok_hash(p, n));
}
/* As tok_lookup, but CONTROL and UNKNOWN tokens are invisible (plain text never yields them). */
static inline int32_t tok_lookup_plain_h(const kiln_tokenizer *t, const char *p, size_t n, uint64_t h) {
    int32_t id = tok_lookup_h(t, p, n, h);
    if (id >= 0 && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) return -1;
    return id;
}

/* BPE: the rank of the merge whose "left right" string is key[0..n) (h = tok_hash(key, n)), -1 when none. */
int32_t tok_merge_rank_h(const kiln_tokenizer *t, const char *key, size_t n, uint64_t h);

/* ---------------------------------------------------------------- output of an encode call */

typedef struct tok_out {
    int32_t *ids;
    size_t cap;
    size_t n;       /* total produced (may exceed cap) */
} tok_out;

static inline void tok_out_push(tok_out *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* ---------------------------------------------------------------- SPM (spm.c) */

/* Encodes one raw-text fragment the SentencePiece way (dummy prefix when add_prefix, spaces escaped to
 * U+2581, score-ordered bigram merges, byte fallback). */
kiln_status tok_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, bool add_prefix, tok_out *out);

/* ---------------------------------------------------------------- BPE (bpe.c, pretok.c) */

/* GPT-2's byte <-> unicode mapping. tok_byte_encoded(b) is the UTF-8 of byte b's code point (1-2 bytes). */
typedef struct tok_byte_utf8 { uint8_t n; char s[2]; } tok_byte_utf8;
extern const tok_byte_utf8 *tok_byte_to_utf8;   /* [256], built once */
void tok_bytes_init(void);
/* The byte a code point stands for, -1 when it is not one of the 256 mapped code points. */
int tok_cp_to_byte(uint32_t cp);

/* Scratch of one encode call (buffers and a word cache), created by the first tok_bpe_encode of the call. */
typedef struct tok_bpe_scratch tok_bpe_scratch;
/* Encodes one raw-text fragment: pre-tokenizer split, byte mapping, merges by rank. text must stay valid until
 * the scratch is freed (the word cache points into it). */
kiln_status tok_bpe_encode(const kiln_tokenizer *t, const char *text, size_t len, tok_out *out,
                           tok_bpe_scratch **scratch);
void tok_bpe_scratch_free(tok_bpe_scratch *s);

/* Compiles the regexes of a pre-tokenizer name; unknown names give a warning and the default split.
 * *ignore_merges is set for the llama3 family. */
kiln_status tok_pretok_open(const char *pre, tok_pretok **out, bool *ignore_merges, const char **used_name);
void tok_pretok_close(tok_pretok *p);

/* Called for each word (byte range of text) in order; returns non-OK to stop. */
typedef kiln_status (*tok_word_fn)(void *ctx, const char *word, size_t len);
/* Splits text (valid UTF-8) into words with the pre-tokenizer's regex chain. */
kiln_status tok_pretok_split(const tok_pretok *p, const char *text, size_t len, tok_word_fn fn, void *ctx);

/* ---------------------------------------------------------------- UTF-8 helpers */

/* Length of the UTF-8 sequence that starts with byte c, by its lead bits (llama.cpp's rule: 1 for
 * continuation bytes and ASCII). */
static inline size_t tok_utf8_len(uint8_t c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Validates strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF). Returns the byte
 * offset of the first invalid sequence, or len when all is valid. */
size_t tok_utf8_valid_prefix(const char *s, size_t len);

#endif
