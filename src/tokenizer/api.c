/*
 * api.c — the tokenizer part of the public API (include/kiln.h): kiln_tokenize, kiln_token_piece, the
 * streaming detokenizer kiln_detok_* and kiln_token_is_eog, over the tokenizer a model loaded (m->tok).
 *
 * The detokenizer hands out only complete UTF-8 characters: the bytes of an unfinished character wait in
 * the kiln_detok struct (no allocation); bytes that can never form a character become U+FFFD.
 */
#include "kiln.h"

#include "base/error.h"
#include "base/log.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

static kiln_status need_tokenizer(const kiln_model *m, const char *what) {
    if (!m) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: no model given", what);
    if (!m->tok) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the model has no tokenizer", what);
    return KILN_OK;
}

kiln_status kiln_tokenize(const kiln_model *m, const char *text, size_t len, int flags, int32_t *ids, size_t cap,
                          size_t *n_out) {
    if (n_out) *n_out = 0;
    KILN_TRY(need_tokenizer(m, "tokenize"));
    if (!n_out) return kiln_fail(KILN_ERR_INVALID_ARG, "tokenize: n_out is NULL");
    if (!text && len) return kiln_fail(KILN_ERR_INVALID_ARG, "tokenize: text is NULL but len is %zu", len);
    if (!ids && cap) return kiln_fail(KILN_ERR_INVALID_ARG, "tokenize: ids is NULL but cap is %zu", cap);
    return kiln_tokenizer_encode(m->tok, text ? text : "", len, flags, ids, cap, n_out);
}

kiln_status kiln_token_piece(const kiln_model *m, int32_t id, char *buf, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    KILN_TRY(need_tokenizer(m, "token piece"));
    if (!n_out) return kiln_fail(KILN_ERR_INVALID_ARG, "token piece: n_out is NULL");
    if (!buf && cap) return kiln_fail(KILN_ERR_INVALID_ARG, "token piece: buf is NULL but cap is %zu", cap);
    int n_vocab = kiln_tokenizer_n_vocab(m->tok);
    if (id < 0 || id >= n_vocab)
        return kiln_fail(KILN_ERR_INVALID_ARG, "token piece: id %d is outside the vocabulary (%d tokens)", (int)id,
                         n_vocab);
    size_t n = kiln_tokenizer_piece(m->tok, id, buf, cap);
    *n_out = n;
    if (n > cap) return kiln_fail(KILN_ERR_INVALID_ARG, "token piece: %zu bytes do not fit the %zu given", n, cap);
    return KILN_OK;
}

bool kiln_token_is_eog(const kiln_model *m, int32_t id) {
    return m && m->tok && kiln_tokenizer_is_eog(m->tok, id);
}

void kiln_detok_init(kiln_detok *d, const kiln_model *m, bool strip_leading_space) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->model = m;
    d->at_start = strip_leading_space && m && m->tok && kiln_tokenizer_add_space_prefix(m->tok);
}

/* The length of the complete UTF-8 sequence starting at s[0] (n bytes available): >0 complete, 0 when it is a
 * valid but unfinished prefix, -1 when s[0] cannot start a valid sequence here. */
static int utf8_seq(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int need;
    uint32_t min;
    if (c >= 0xC2 && c <= 0xDF) need = 2, min = 0x80;
    else if ((c & 0xF0) == 0xE0) need = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 4, min = 0x10000;
    else return -1;
    uint32_t cp = c & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n) {
            /* check what we have is still a possible prefix */
            if (k == 1) return 0;
            uint32_t lo = cp << (6 * (need - k));
            uint32_t hi = lo | ((1u << (6 * (need - k))) - 1);
            if (hi < min || lo > 0x10FFFF || (lo >= 0xD800 && hi <= 0xDFFF)) return -1;
            return 0;
        }
        if ((s[k] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    return need;
}

typedef struct detok_out { char *buf; size_t cap, n; bool dropped; } detok_out;

static void put(detok_out *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        o->dropped = true;
        return;
    }
    memcpy(o->buf + o->n, p, n);
    o->n += n;
}

/* Feeds bytes through the pending buffer, writing every complete character. */
static void feed(kiln_detok *d, detok_out *o, const char *p, size_t n) {
    static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    for (size_t i = 0; i < n; i++) {
        d->pending[d->n_pending++] = (uint8_t)p[i];
        for (;;) {
            if (!d->n_pending) break;
            int l = utf8_seq(d->pending, (size_t)d->n_pending);
            if (l == 0) break;   /* wait for more bytes */
            if (l < 0) {
                put(o, replacement, 3);
                l = 1;
            } else {
                put(o, d->pending, (size_t)l);
            }
            memmove(d->pending, d->pending + l, (size_t)(d->n_pending - l));
            d->n_pending -= l;
        }
    }
}

size_t kiln_detok_push(kiln_detok *d, int32_t id, char *buf, size_t cap) {
    if (!d || (!buf && cap) || !d->model || !d->model->tok) return 0;
    const kiln_tokenizer *t = d->model->tok;
    detok_out o = {buf, cap, 0, false};
    char chunk[256];
    size_t skip = 0, total = kiln_tokenizer_piece_at(t, id, 0, chunk, sizeof chunk);
    bool first = d->at_start;
    d->at_start = false;
    for (;;) {
        size_t n = total - skip < sizeof chunk ? total - skip : sizeof chunk;
        const char *p = chunk;
        if (first && n > 0 && p[0] == ' ') {   /* the dummy-prefix space of the first piece */
            p++;
            n--;
        }
        first = false;
        feed(d, &o, p, n);
        skip += sizeof chunk;
        if (skip >= total) break;
        kiln_tokenizer_piece_at(t, id, skip, chunk, sizeof chunk);
    }
    if (o.dropped) KILN_WARN("detokenize: the output buffer (%zu bytes) was too small; text was dropped", cap);
    return o.n;
}

size_t kiln_detok_flush(kiln_detok *d, char *buf, size_t cap) {
    if (!d || (!buf && cap)) return 0;
    static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    detok_out o = {buf, cap, 0, false};
    if (d->n_pending) put(&o, replacement, 3);   /* an unfinished character */
    d->n_pending = 0;
    if (o.dropped) KILN_WARN("detokenize: the output buffer (%zu bytes) was too small; text was dropped", cap);
    return o.n;
}
