/*
 * bpe.c — byte-level BPE encoding of one text fragment, compatible with llama.cpp's llm_tokenizer_bpe:
 * the pre-tokenizer splits the text into words; each word's bytes are mapped to GPT-2's printable code
 * points; the word starts as one symbol per code point and the adjacent pair with the lowest merge rank is
 * merged first (ties: the leftmost), until no pair has a merge. Each final symbol is its token; a symbol that
 * is not a token falls back to its single bytes (as llama.cpp does). Invalid UTF-8 in the text becomes
 * U+FFFD first (llama.cpp's lenient decoder).
 */
#include "tokenizer/tok_internal.h"

#include <pthread.h>

#include "base/alloc.h"
#include "base/error.h"

/* ---------------------------------------------------------------- GPT-2 byte <-> code point */

/* Bytes that are printable keep their value; the 68 others (0-32, 127-160, 173) map to 256+k in order. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    if (b <= 32) return 256u + (uint32_t)b;
    if (b <= 160) return 256u + 33u + (uint32_t)(b - 127);
    return 256u + 67u;   /* 173 */
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) {
        int b = (int)cp;
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
        return -1;
    }
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(127 + (k - 33));
    return 173;
}

static tok_byte_utf8 byte_utf8_table[256];
const tok_byte_utf8 *tok_byte_to_utf8 = byte_utf8_table;
static pthread_once_t byte_once = PTHREAD_ONCE_INIT;

static void bytes_init_once(void) {
    for (int b = 0; b < 256; b++) {
        uint32_t cp = byte_to_cp(b);
        tok_byte_utf8 *e = &byte_utf8_table[b];
        if (cp < 0x80) {
            e->n = 1;
            e->s[0] = (char)cp;
        } else {
            e->n = 2;
            e->s[0] = (char)(0xC0 | (cp >> 6));
            e->s[1] = (char)(0x80 | (cp & 0x3F));
        }
    }
}

void tok_bytes_init(void) { pthread_once(&byte_once, bytes_init_once); }

/* ---------------------------------------------------------------- merges of one word */

typedef struct bpe_sym { int32_t prev, next; uint32_t start, n; } bpe_sym;
typedef struct bpe_bigram { int32_t rank, left, right; uint32_t size; } bpe_bigram;

/* per-encode-call scratch, grown as needed and reused for every word of every fragment */
struct tok_bpe_scratch {
    const kiln_tokenizer *t;
    tok_out *out;
    char *w;            /* the byte-mapped word */
    size_t w_cap;
    bpe_sym *sym;
    size_t sym_cap;
    bpe_bigram *heap;
    size_t heap_n, heap_cap;
    char *key;          /* "left right" of a candidate merge */
    size_t key_cap;
    /* word cache: a word met again in the same encode call reuses its ids (words are views into the caller's
     * text, valid for the whole call) */
    bool cache_ok;      /* false while encoding a repaired copy (freed before the call ends) */
    struct wc_entry *wc;
    uint32_t wc_mask, wc_n;
    int32_t *pool;      /* the cached ids */
    size_t pool_n, pool_cap;
};
typedef struct tok_bpe_scratch bpe_ctx;

typedef struct wc_entry { uint64_t h; const char *word; uint32_t ids_off; uint16_t len, n_ids; } wc_entry;
#define WC_MAX_WORD 64   /* longer words are not cached */

static inline bool bg_before(const bpe_bigram *a, const bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool heap_push(bpe_ctx *c, bpe_bigram x) {
    if (c->heap_n == c->heap_cap) {
        size_t cap = c->heap_cap ? c->heap_cap * 2 : 64;
        bpe_bigram *v = kiln_realloc(c->heap, cap * sizeof *v);
        if (!v) return false;
        c->heap = v;
        c->heap_cap = cap;
    }
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_before(&x, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = x;
    return true;
}

static bpe_bigram heap_pop(bpe_ctx *c) {
    bpe_bigram top = c->heap[0], last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && bg_before(&c->heap[k + 1], &c->heap[k])) k++;
        if (!bg_before(&c->heap[k], &last)) break;
        c->heap[i] = c->heap[k];
        i = k;
    }
    if (n) c->heap[i] = last;
    return top;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem);

static bool add_bigram(bpe_ctx *c, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const bpe_sym *l = &c->sym[left], *r = &c->sym[right];
    size_t n = (size_t)l->n + 1 + r->n;
    if (!grow((void **)&c->key, &c->key_cap, n, 1)) return false;
    memcpy(c->key, c->w + l->start, l->n);
    c->key[l->n] = ' ';
    memcpy(c->key + l->n + 1, c->w + r->start, r->n);
    int32_t rank = tok_merge_rank_h(c->t, c->key, n, tok_hash(c->key, n));
    if (rank < 0) return true;
    return heap_push(c, (bpe_bigram){rank, left, right, l->n + r->n});
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *q = kiln_realloc(*p, cap2 * elem);
    if (!q) return false;
    *p = q;
    *cap = cap2;
    return true;
}

static void emit_symbol(const kiln_tokenizer *t, const char *s, size_t n, tok_out *out) {
    int32_t id = tok_lookup_plain_h(t, s, n, tok_hash(s, n));
    if (id >= 0) {
        tok_out_push(out, id);
        return;
    }
    for (size_t i = 0; i < n; i++) {   /* llama.cpp: each raw byte of the mapped text, when it is a token */
        int32_t b = tok_lookup_plain_h(t, s + i, 1, tok_hash(s + i, 1));
        if (b >= 0) tok_out_push(out, b);
    }
}

/* Merges one word (raw bytes) and pushes its ids to out. */
static kiln_status bpe_merge_word(bpe_ctx *c, const char *word, size_t len, tok_out *out) {
    const kiln_tokenizer *t = c->t;
    if (!grow((void **)&c->w, &c->w_cap, 2 * len, 1)) return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
    size_t wn = 0;
    for (size_t i = 0; i < len; i++) {
        const tok_byte_utf8 *e = &tok_byte_to_utf8[(uint8_t)word[i]];
        c->w[wn++] = e->s[0];
        if (e->n == 2) c->w[wn++] = e->s[1];
    }
    const char *w = c->w;
    if (t->ignore_merges) {
        uint64_t h = tok_hash(w, wn);
        int32_t id = tok_lookup_plain_h(t, w, wn, h);
        if (id >= 0) {
            tok_out_push(out, id);
            return KILN_OK;
        }
    }
    if (!grow((void **)&c->sym, &c->sym_cap, wn, sizeof *c->sym))
        return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
    int32_t n_sym = 0;
    for (size_t off = 0; off < wn;) {
        size_t l = tok_utf8_len((uint8_t)w[off]);
        if (l > wn - off) l = wn - off;
        c->sym[n_sym] = (bpe_sym){n_sym - 1, off + l == wn ? -1 : n_sym + 1, (uint32_t)off, (uint32_t)l};
        n_sym++;
        off += l;
    }
    c->heap_n = 0;
    for (int32_t i = 1; i < n_sym; i++)
        if (!add_bigram(c, i - 1, i)) return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
    while (c->heap_n) {
        bpe_bigram b = heap_pop(c);
        bpe_sym *l = &c->sym[b.left], *r = &c->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;   /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = b.left;
        if (!add_bigram(c, l->prev, b.left) || !add_bigram(c, b.left, l->next))
            return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
    }
    for (int32_t i = n_sym ? 0 : -1; i != -1; i = c->sym[i].next) {
        const bpe_sym *s = &c->sym[i];
        emit_symbol(t, w + s->start, s->n, out);
    }
    return KILN_OK;
}

static bool wc_grow(bpe_ctx *c) {
    uint32_t cap = c->wc ? (c->wc_mask + 1) * 2 : 1024;
    wc_entry *v = kiln_calloc(cap, sizeof *v);
    if (!v) return false;
    for (uint32_t i = 0; c->wc && i <= c->wc_mask; i++) {
        if (!c->wc[i].h) continue;
        uint32_t j = (uint32_t)c->wc[i].h & (cap - 1);
        while (v[j].h) j = (j + 1) & (cap - 1);
        v[j] = c->wc[i];
    }
    kiln_free(c->wc);
    c->wc = v;
    c->wc_mask = cap - 1;
    return true;
}

static kiln_status bpe_word(void *ctx, const char *word, size_t len) {
    bpe_ctx *c = ctx;
    if (len > WC_MAX_WORD || !c->cache_ok) return bpe_merge_word(c, word, len, c->out);
    uint64_t h = tok_hash(word, len);
    uint32_t i = 0;
    if (c->wc) {
        for (i = (uint32_t)h & c->wc_mask; c->wc[i].h; i = (i + 1) & c->wc_mask) {
            const wc_entry *e = &c->wc[i];
            if (e->h == h && e->len == len && !memcmp(e->word, word, len)) {
                for (uint32_t k = 0; k < e->n_ids; k++) tok_out_push(c->out, c->pool[e->ids_off + k]);
                return KILN_OK;
            }
        }
    }
    int32_t ids[4 * WC_MAX_WORD];   /* at most one id per byte of the mapped word (2 per input byte) */
    tok_out tmp = {ids, sizeof ids / sizeof *ids, 0};
    KILN_TRY(bpe_merge_word(c, word, len, &tmp));
    KILN_ASSERT(tmp.n <= tmp.cap);
    for (size_t k = 0; k < tmp.n; k++) tok_out_push(c->out, ids[k]);
    /* remember the word */
    if (!c->wc || (c->wc_n + 1) * 2 > c->wc_mask + 1) {
        if (!wc_grow(c)) return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
        for (i = (uint32_t)h & c->wc_mask; c->wc[i].h; i = (i + 1) & c->wc_mask) {}
    }
    if (c->pool_n + tmp.n > UINT32_MAX || !grow((void **)&c->pool, &c->pool_cap, c->pool_n + tmp.n, sizeof *c->pool))
        return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
    memcpy(c->pool + c->pool_n, ids, tmp.n * sizeof *ids);
    c->wc[i] = (wc_entry){h, word, (uint32_t)c->pool_n, (uint16_t)len, (uint16_t)tmp.n};
    c->pool_n += tmp.n;
    c->wc_n++;
    return KILN_OK;
}

/* ---------------------------------------------------------------- UTF-8 repair */

/* llama.cpp's lenient decoder: a bad sequence gives U+FFFD and skips one byte; code points are re-encoded.
 * Surrogates and values above U+10FFFF (which PCRE2 cannot take) also become U+FFFD. */
static char *repair_utf8(const char *s, size_t len, size_t *out_len) {
    char *o = kiln_malloc(len * 3 + 1);
    if (!o) return NULL;
    size_t n = 0;
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < len;) {
        uint8_t c = u[i];
        uint32_t cp = 0xFFFD;
        size_t adv = 1;
        if (c < 0x80) {
            cp = c;
        } else if (!(c & 0x40)) {
            /* stray continuation byte */
        } else {
            size_t need = !(c & 0x20) ? 2 : !(c & 0x10) ? 3 : !(c & 0x08) ? 4 : 0;
            bool ok = need && i + need - 1 < len;
            for (size_t k = 1; ok && k < need; k++) ok = (u[i + k] & 0xC0) == 0x80;
            if (ok) {
                cp = need == 2 ? (c & 0x1Fu) : need == 3 ? (c & 0x0Fu) : (c & 0x07u);
                for (size_t k = 1; k < need; k++) cp = (cp << 6) | (u[i + k] & 0x3Fu);
                adv = need;
                if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
            }
        }
        i += adv;
        if (cp < 0x80) {
            o[n++] = (char)cp;
        } else if (cp < 0x800) {
            o[n++] = (char)(0xC0 | (cp >> 6));
            o[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            o[n++] = (char)(0xE0 | (cp >> 12));
            o[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            o[n++] = (char)(0xF0 | (cp >> 18));
            o[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            o[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    *out_len = n;
    return o;
}

kiln_status tok_bpe_encode(const kiln_tokenizer *t, const char *text, size_t len, tok_out *out,
                           tok_bpe_scratch **scratch) {
    if (len > UINT32_MAX) return kiln_fail(KILN_ERR_INVALID_ARG, "tokenize: a text of %zu bytes is too long", len);
    if (!*scratch) {
        *scratch = kiln_calloc(1, sizeof **scratch);
        if (!*scratch) return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
    }
    bpe_ctx *c = *scratch;
    char *fixed = NULL;
    c->cache_ok = true;
    if (tok_utf8_valid_prefix(text, len) != len) {
        fixed = repair_utf8(text, len, &len);
        if (!fixed) return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
        text = fixed;
        c->cache_ok = false;
    }
    c->t = t;
    c->out = out;
    kiln_status st = tok_pretok_split(t->pretok, text, len, bpe_word, c);
    kiln_free(fixed);
    return st;
}

void tok_bpe_scratch_free(tok_bpe_scratch *c) {
    if (!c) return;
    kiln_free(c->w);
    kiln_free(c->sym);
    kiln_free(c->heap);
    kiln_free(c->key);
    kiln_free(c->wc);
    kiln_free(c->pool);
    kiln_free(c);
}
