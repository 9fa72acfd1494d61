/*
 * spm.c — SentencePiece-style encoding of one text fragment, compatible with llama.cpp's llm_tokenizer_spm:
 * optional dummy-prefix space, spaces escaped to U+2581, the text split into UTF-8 characters, then the
 * adjacent pair whose concatenation is the highest-scoring vocabulary token is merged first (ties: the
 * leftmost pair), until no pair forms a token. Symbols that are not tokens fall back to <0xXX> byte tokens.
 */
#include "tokenizer/tok_internal.h"

#include "base/alloc.h"
#include "base/error.h"

typedef struct spm_sym { int32_t prev, next; uint32_t start, n; } spm_sym;
typedef struct spm_bigram { float score; int32_t left, right; uint32_t size; } spm_bigram;

typedef struct spm_heap { spm_bigram *v; size_t n, cap; } spm_heap;

/* a goes before b: higher score first, then the leftmost pair */
static inline bool spm_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static bool heap_push(spm_heap *h, spm_bigram x) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        spm_bigram *v = kiln_realloc(h->v, cap * sizeof *v);
        if (!v) return false;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!spm_before(&x, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = x;
    return true;
}

static spm_bigram heap_pop(spm_heap *h) {
    spm_bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && spm_before(&h->v[c + 1], &h->v[c])) c++;
        if (!spm_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

typedef struct spm_ctx {
    const kiln_tokenizer *t;
    const char *buf;
    spm_sym *sym;
    spm_heap heap;
} spm_ctx;

static bool try_add_bigram(spm_ctx *c, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const spm_sym *l = &c->sym[left], *r = &c->sym[right];
    uint32_t size = l->n + r->n;
    int32_t id = tok_lookup_plain_h(c->t, c->buf + l->start, size, tok_hash(c->buf + l->start, size));
    if (id < 0) return true;
    return heap_push(&c->heap, (spm_bigram){tok_score(c->t, id), left, right, size});
}

/* Segments buf[start, end) (symbol arrays sized for it) and pushes the ids. */
static bool spm_segment(spm_ctx *c, size_t start, size_t end, tok_out *out) {
    const kiln_tokenizer *t = c->t;
    const char *buf = c->buf;
    spm_sym *sym = c->sym;
    int32_t n_sym = 0;
    for (size_t off = start; off < end;) {
        size_t l = tok_utf8_len((uint8_t)buf[off]);
        if (l > end - off) l = end - off;
        sym[n_sym] = (spm_sym){n_sym - 1, off + l == end ? -1 : n_sym + 1, (uint32_t)off, (uint32_t)l};
        n_sym++;
        off += l;
    }
    c->heap.n = 0;
    for (int32_t i = 1; i < n_sym; i++)
        if (!try_add_bigram(c, i - 1, i)) return false;
    while (c->heap.n) {
        spm_bigram b = heap_pop(&c->heap);
        spm_sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;   /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        if (!try_add_bigram(c, l->prev, b.left) || !try_add_bigram(c, b.left, l->next)) return false;
    }
    for (int32_t i = n_sym ? 0 : -1; i != -1; i = sym[i].next) {
        const spm_sym *s = &sym[i];
        int32_t id = tok_lookup_plain_h(t, buf + s->start, s->n, tok_hash(buf + s->start, s->n));
        if (id >= 0) {
            tok_out_push(out, id);
            continue;
        }
        bool all_bytes = true;
        for (uint32_t k = 0; k < s->n; k++) all_bytes &= t->byte_token[(uint8_t)buf[s->start + k]] >= 0;
        if (all_bytes) {
            for (uint32_t k = 0; k < s->n; k++) tok_out_push(out, t->byte_token[(uint8_t)buf[s->start + k]]);
        } else if (t->unk >= 0) {
            tok_out_push(out, t->unk);   /* no byte fallback in this vocabulary: one UNK per symbol */
        }
    }
    return true;
}

static inline bool is_escaped_space(const char *p) {
    return (uint8_t)p[0] == 0xE2 && (uint8_t)p[1] == 0x96 && (uint8_t)p[2] == 0x81;
}

kiln_status tok_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, bool add_prefix, tok_out *out) {
    /* escape: optional dummy prefix, ' ' -> U+2581 (3 bytes) */
    size_t n_spaces = 0;
    for (size_t i = 0; i < len; i++) n_spaces += text[i] == ' ';
    size_t blen = len + 2 * n_spaces + (add_prefix ? 3 : 0);
    if (blen > UINT32_MAX / 2) return kiln_fail(KILN_ERR_INVALID_ARG, "tokenize: text of %zu bytes is too long", len);
    char *buf = kiln_malloc(blen ? blen : 1);
    spm_sym *sym = kiln_malloc(sizeof *sym * (blen ? blen : 1));
    spm_ctx c = {t, buf, sym, {0}};
    kiln_status st = KILN_OK;
    if (!buf || !sym) {
        st = kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory for %zu bytes", len);
        goto done;
    }
    size_t o = 0;
    if (add_prefix) buf[o++] = (char)0xE2, buf[o++] = (char)0x96, buf[o++] = (char)0x81;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') buf[o++] = (char)0xE2, buf[o++] = (char)0x96, buf[o++] = (char)0x81;
        else buf[o++] = text[i];
    }
    if (!t->spm_word_split) {
        if (!spm_segment(&c, 0, blen, out)) goto nomem;
        goto done;
    }
    /* No token has U+2581 after another character, so no merge crosses a point where U+2581 follows a
     * non-U+2581 character: the pieces between such points are segmented alone (same result, small heaps). */
    size_t start = 0;
    bool prev_space = false;
    for (size_t off = 0; off < blen;) {   /* walk the same characters spm_segment will make symbols of */
        size_t l = tok_utf8_len((uint8_t)buf[off]);
        if (l > blen - off) l = blen - off;
        bool space = l == 3 && is_escaped_space(buf + off);
        if (space && off > start && !prev_space) {
            if (!spm_segment(&c, start, off, out)) goto nomem;
            start = off;
        }
        prev_space = space;
        off += l;
    }
    if (start < blen && !spm_segment(&c, start, blen, out)) goto nomem;
    goto done;
nomem:
    st = kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
done:
    kiln_free(c.heap.v);
    kiln_free(sym);
    kiln_free(buf);
    return st;
}
