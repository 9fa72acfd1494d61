/*
 * jinja_builtins.c — what templates call (see jinja.h): filters, tests, string/dict/list methods, the
 * globals (range, namespace, dict, raise_exception, strftime_now), attribute and subscript access with
 * the sandbox's rules, Python's str()/repr() of values and HF's tojson (json.dumps, ensure_ascii=False).
 *
 * Strings are UTF-8; lengths, indices and slices count code points as Python does. Case mapping
 * (upper/lower/title/capitalize) covers ASCII only; other characters pass through unchanged.
 */
#include "chat/jinja.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"

#define JINJA_MAX_RANGE 1000000

/* ---------------------------------------------------------------- UTF-8 and byte strings */

size_t jinja_utf8_count(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

/* Decodes the code point at s[*i] (advancing *i); malformed bytes decode as themselves. */
static uint32_t utf8_next(const char *s, size_t len, size_t *i) {
    unsigned char c0 = (unsigned char)s[*i];
    int extra = c0 >= 0xF0 ? 3 : c0 >= 0xE0 ? 2 : c0 >= 0xC0 ? 1 : 0;
    if (*i + (size_t)extra >= len + (extra ? 0 : 1) && extra) extra = 0;
    uint32_t cp = extra == 0 ? c0 : extra == 1 ? (c0 & 0x1Fu) : extra == 2 ? (c0 & 0x0Fu) : (c0 & 0x07u);
    for (int k = 1; k <= extra; k++) {
        unsigned char cc = (unsigned char)s[*i + (size_t)k];
        if ((cc & 0xC0) != 0x80) { (*i)++; return c0; }
        cp = (cp << 6) | (cc & 0x3Fu);
    }
    *i += (size_t)extra + 1;
    return cp;
}

static bool is_uspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

void jbuf_init(jbuf *b, jctx *c, const jnode *at) { b->c = c; b->at = at; b->p = NULL; b->n = b->cap = 0; }

void jbuf_add(jbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (n > b->c->out_max || b->n > b->c->out_max - n)
        jctx_fail(b->c, b->at, KILN_ERR_INVALID_ARG, "string value exceeds %zu bytes", b->c->out_max);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = jctx_alloc(b->c, b->at, cap);
        if (b->n) {
            memcpy(np, b->p, b->n);
            jtrack_copy(b->c, np, b->p, b->n);
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    jtrack_copy(b->c, b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_addc(jbuf *b, char ch) { jbuf_add(b, &ch, 1); }

void jbuf_addf(jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) jbuf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

jv jbuf_value(jbuf *b) { return jv_str(b->p ? b->p : "", b->n); }

/* ---------------------------------------------------------------- str() and repr() */

static void fmt_float(jbuf *b, double f, bool json) {
    if (isnan(f)) { jbuf_add(b, json ? "NaN" : "nan", json ? 3 : 3); return; }
    if (isinf(f)) {
        if (json) jbuf_add(b, f < 0 ? "-Infinity" : "Infinity", f < 0 ? 9 : 8);
        else jbuf_add(b, f < 0 ? "-inf" : "inf", f < 0 ? 4 : 3);
        return;
    }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[32];
    int nd = 0;
    const char *q = tmp;
    bool neg = false;
    if (*q == '-') { neg = true; q++; }
    for (; *q && *q != 'e'; q++) if (*q >= '0' && *q <= '9' && nd < 31) digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) jbuf_addc(b, '-');
    if (exp >= -5 + 1 && exp < 16) {
        if (exp >= 0) {
            for (int k = 0; k <= exp; k++) jbuf_addc(b, k < nd ? digits[k] : '0');
            jbuf_addc(b, '.');
            if (nd > exp + 1) jbuf_add(b, digits + exp + 1, (size_t)(nd - exp - 1));
            else jbuf_addc(b, '0');
        } else {
            jbuf_add(b, "0.", 2);
            for (int k = 0; k < -exp - 1; k++) jbuf_addc(b, '0');
            jbuf_add(b, digits, (size_t)nd);
        }
    } else {
        jbuf_addc(b, digits[0]);
        if (nd > 1) { jbuf_addc(b, '.'); jbuf_add(b, digits + 1, (size_t)(nd - 1)); }
        jbuf_addf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static void repr_string(jbuf *b, const char *s, size_t len) {
    bool has_sq = memchr(s, '\'', len) != NULL, has_dq = memchr(s, '"', len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_addc(b, q);
    size_t i = 0;
    while (i < len) {
        size_t st = i;
        uint32_t cp = utf8_next(s, len, &i);
        if (cp == (uint32_t)q || cp == '\\') { jbuf_addc(b, '\\'); jbuf_addc(b, (char)cp); }
        else if (cp == '\n') jbuf_add(b, "\\n", 2);
        else if (cp == '\r') jbuf_add(b, "\\r", 2);
        else if (cp == '\t') jbuf_add(b, "\\t", 2);
        else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0xA0) || cp == 0xAD) jbuf_addf(b, "\\x%02x", cp);
        else if ((cp >= 0x2000 && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202A && cp <= 0x202F) ||
                 (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || cp == 0x1680)
            jbuf_addf(b, "\\u%04x", cp);
        else jbuf_add(b, s + st, i - st);
    }
    jbuf_addc(b, q);
}

void jv_repr(jbuf *b, jv v) {
    switch (v.type) {
    case JV_UNDEFINED: jbuf_add(b, "Undefined", 9); return;
    case JV_STRING: repr_string(b, v.u.s, v.len); return;
    case JV_LIST: {
        if (v.flags & JVF_GENERATOR) { jbuf_add(b, "<generator object>", 18); return; }
        bool tup = v.flags & JVF_TUPLE;
        jbuf_addc(b, tup ? '(' : '[');
        for (size_t i = 0; i < v.u.list->n; i++) {
            if (i) jbuf_add(b, ", ", 2);
            jv_repr(b, v.u.list->items[i]);
        }
        if (tup && v.u.list->n == 1) jbuf_addc(b, ',');
        jbuf_addc(b, tup ? ')' : ']');
        return;
    }
    case JV_DICT: case JV_NAMESPACE: {
        if (v.type == JV_NAMESPACE) jbuf_add(b, "<Namespace ", 11);
        jbuf_addc(b, '{');
        for (size_t i = 0; i < v.u.dict->n; i++) {
            if (i) jbuf_add(b, ", ", 2);
            jv_repr(b, v.u.dict->keys[i]);
            jbuf_add(b, ": ", 2);
            jv_repr(b, v.u.dict->vals[i]);
        }
        jbuf_addc(b, '}');
        if (v.type == JV_NAMESPACE) jbuf_addc(b, '>');
        return;
    }
    default: jv_to_str(b, v);
    }
}

void jv_to_str(jbuf *b, jv v) {
    switch (v.type) {
    case JV_UNDEFINED: return;
    case JV_NONE: jbuf_add(b, "None", 4); return;
    case JV_BOOL: if (v.u.b) jbuf_add(b, "True", 4); else jbuf_add(b, "False", 5); return;
    case JV_INT: jbuf_addf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: fmt_float(b, v.u.f, false); return;
    case JV_STRING: jbuf_add(b, v.u.s, v.len); return;
    case JV_LIST: case JV_DICT: case JV_NAMESPACE: jv_repr(b, v); return;
    case JV_CALLABLE: jbuf_add(b, "<function>", 10); return;
    case JV_LOOP: jbuf_addf(b, "<LoopContext %lld/%lld>", (long long)v.u.loop->index0 + 1, (long long)v.u.loop->length); return;
    }
}

jv jv_stringify(jctx *c, const jnode *at, jv v) {
    if (v.type == JV_STRING) return v;  /* keeps JVF_SAFE, as soft_str keeps Markup */
    jbuf b;
    jbuf_init(&b, c, at);
    jv_to_str(&b, v);
    return jbuf_value(&b);
}

/* ---------------------------------------------------------------- JSON */

static void json_quote(jbuf *b, const char *s, size_t len, bool ensure_ascii) {
    jbuf_addc(b, '"');
    size_t i = 0;
    while (i < len) {
        size_t st = i;
        uint32_t cp = utf8_next(s, len, &i);
        switch (cp) {
        case '"': jbuf_add(b, "\\\"", 2); break;
        case '\\': jbuf_add(b, "\\\\", 2); break;
        case '\n': jbuf_add(b, "\\n", 2); break;
        case '\r': jbuf_add(b, "\\r", 2); break;
        case '\t': jbuf_add(b, "\\t", 2); break;
        case '\b': jbuf_add(b, "\\b", 2); break;
        case '\f': jbuf_add(b, "\\f", 2); break;
        default:
            if (cp < 0x20) jbuf_addf(b, "\\u%04x", cp);
            else if (ensure_ascii && cp > 0x7E) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    jbuf_addf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    jbuf_addf(b, "\\u%04x", cp);
                }
            } else jbuf_add(b, s + st, i - st);
        }
    }
    jbuf_addc(b, '"');
}

typedef struct json_opts {
    const char *indent; size_t indent_len; bool has_indent;
    const char *item_sep, *key_sep;
    bool sort_keys, ensure_ascii;
} json_opts;

static void json_newline(jbuf *b, const json_opts *o, int level) {
    jbuf_addc(b, '\n');
    for (int k = 0; k < level; k++) jbuf_add(b, o->indent, o->indent_len);
}

static void json_key(jbuf *b, jv k, const json_opts *o) {
    switch (k.type) {
    case JV_STRING: json_quote(b, k.u.s, k.len, o->ensure_ascii); return;
    case JV_NONE: jbuf_add(b, "\"null\"", 6); return;
    case JV_BOOL: jbuf_add(b, k.u.b ? "\"true\"" : "\"false\"", k.u.b ? 6 : 7); return;
    case JV_INT: jbuf_addf(b, "\"%lld\"", (long long)k.u.i); return;
    case JV_FLOAT: jbuf_addc(b, '"'); fmt_float(b, k.u.f, true); jbuf_addc(b, '"'); return;
    default: jctx_fail(b->c, b->at, KILN_ERR_INVALID_ARG, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int key_order(const jv *a, const jv *b) {
    if (a->type == JV_STRING && b->type == JV_STRING) {
        size_t n = a->len < b->len ? a->len : b->len;
        int r = n ? memcmp(a->u.s, b->u.s, n) : 0;
        return r ? r : (a->len < b->len ? -1 : a->len > b->len);
    }
    return 0;
}

static void json_dump(jbuf *b, jv v, const json_opts *o, int level) {
    if (level > 200) jctx_fail(b->c, b->at, KILN_ERR_INVALID_ARG, "tojson: value nested too deeply");
    switch (v.type) {
    case JV_NONE: jbuf_add(b, "null", 4); return;
    case JV_BOOL: if (v.u.b) jbuf_add(b, "true", 4); else jbuf_add(b, "false", 5); return;
    case JV_INT: jbuf_addf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: fmt_float(b, v.u.f, true); return;
    case JV_STRING: json_quote(b, v.u.s, v.len, o->ensure_ascii); return;
    case JV_LIST: {
        if (v.flags & JVF_GENERATOR) break;
        if (!v.u.list->n) { jbuf_add(b, "[]", 2); return; }
        jbuf_addc(b, '[');
        for (size_t i = 0; i < v.u.list->n; i++) {
            if (i) jbuf_add(b, o->item_sep, strlen(o->item_sep));
            if (o->has_indent) json_newline(b, o, level + 1);
            json_dump(b, v.u.list->items[i], o, level + 1);
        }
        if (o->has_indent) json_newline(b, o, level);
        jbuf_addc(b, ']');
        return;
    }
    case JV_DICT: {
        size_t n = v.u.dict->n;
        if (!n) { jbuf_add(b, "{}", 2); return; }
        size_t *order = jctx_alloc(b->c, b->at, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys) {
            for (size_t i = 1; i < n; i++) {
                size_t x = order[i], j = i;
                if (v.u.dict->keys[x].type != JV_STRING)
                    jctx_fail(b->c, b->at, KILN_ERR_UNSUPPORTED, "tojson(sort_keys=true) with non-string keys is not supported");
                while (j > 0 && key_order(&v.u.dict->keys[order[j - 1]], &v.u.dict->keys[x]) > 0) { order[j] = order[j - 1]; j--; }
                order[j] = x;
            }
        }
        jbuf_addc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) jbuf_add(b, o->item_sep, strlen(o->item_sep));
            if (o->has_indent) json_newline(b, o, level + 1);
            json_key(b, v.u.dict->keys[order[i]], o);
            jbuf_add(b, o->key_sep, strlen(o->key_sep));
            json_dump(b, v.u.dict->vals[order[i]], o, level + 1);
        }
        if (o->has_indent) json_newline(b, o, level);
        jbuf_addc(b, '}');
        return;
    }
    default: break;
    }
    jctx_fail(b->c, b->at, KILN_ERR_INVALID_ARG, "tojson: object of type %s is not JSON serializable", jv_type_name(v));
}

void jv_to_json(jbuf *b, jv v, const char *indent, size_t indent_len, const char *item_sep, const char *key_sep,
                bool sort_keys, int depth) {
    json_opts o = {indent, indent_len, indent != NULL, item_sep, key_sep, sort_keys, false};
    json_dump(b, v, &o, depth);
}

/* ---------------------------------------------------------------- argument binding */

/* Binds args to the named parameters (positional first, then by keyword). Unknown or repeated
 * keywords, too many positionals and missing required parameters fail, naming fname. */
static void bind_args(jctx *c, const jnode *at, const char *fname, const jargs *a, const char *const *params,
                      size_t n_params, size_t n_required, jv *out, bool *have) {
    for (size_t i = 0; i < n_params; i++) { have[i] = false; out[i] = jv_undefined(NULL, 0); }
    if (a->n_pos > n_params)
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s takes at most %zu arguments (%zu given)", fname, n_params, a->n_pos);
    for (size_t i = 0; i < a->n_pos; i++) { out[i] = a->pos[i]; have[i] = true; }
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t i;
        for (i = 0; i < n_params; i++)
            if (strlen(params[i]) == a->kw_lens[k] && !memcmp(params[i], a->kw_names[k], a->kw_lens[k])) break;
        if (i == n_params)
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s got an unexpected keyword argument '%.*s'", fname, (int)a->kw_lens[k], a->kw_names[k]);
        if (have[i]) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s got multiple values for '%s'", fname, params[i]);
        out[i] = a->kw_vals[k];
        have[i] = true;
    }
    for (size_t i = 0; i < n_required; i++)
        if (!have[i]) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s is missing its argument '%s'", fname, params[i]);
}

#define BIND(fname, required, ...)                                                              \
    static const char *const params_[] = {__VA_ARGS__};                                          \
    enum { NP_ = sizeof params_ / sizeof params_[0] };                                            \
    jv p[NP_];                                                                                   \
    bool have[NP_];                                                                              \
    bind_args(c, at, fname, args, params_, NP_, required, p, have)

static void no_args(jctx *c, const jnode *at, const char *fname, const jargs *args) {
    if (args->n_pos || args->n_kw) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s takes no arguments", fname);
}

static jv need_str(jctx *c, const jnode *at, const char *what, jv v) {
    if (v.type != JV_STRING) {
        if (v.type == JV_UNDEFINED && v.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%.*s' is undefined", (int)v.len, v.u.s);
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s: expected a string, got %s", what, jv_type_name(v));
    }
    return v;
}

static int64_t need_int(jctx *c, const jnode *at, const char *what, jv v) {
    if (v.type == JV_INT) return v.u.i;
    if (v.type == JV_BOOL) return v.u.b;
    jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s: expected an integer, got %s", what, jv_type_name(v));
}

static bool is_number_value(jv v) { return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL; }

static bool opt_bool(jctx *c, const jnode *at, jv v, bool def) {
    if (v.type == JV_UNDEFINED) return def;
    return jv_truthy(c, at, v);
}

static void fail_undefined(jctx *c, const jnode *at, jv v) {
    if (v.u.s && v.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%.*s' is undefined", (int)v.len, v.u.s);
    jctx_fail(c, at, KILN_ERR_INVALID_ARG, "use of an undefined value");
}

/* ---------------------------------------------------------------- iteration */

jv jinja_iter_list(jctx *c, const jnode *at, jv v) {
    switch (v.type) {
    case JV_LIST: return v;
    case JV_UNDEFINED: return jv_new_list(c, at, 0);
    case JV_DICT: {
        jv l = jv_new_list(c, at, v.u.dict->n);
        for (size_t i = 0; i < v.u.dict->n; i++) jv_list_push(c, at, l, v.u.dict->keys[i]);
        return l;
    }
    case JV_STRING: {
        jv l = jv_new_list(c, at, v.len);
        size_t i = 0;
        while (i < v.len) {
            size_t st = i;
            utf8_next(v.u.s, v.len, &i);
            jv_list_push(c, at, l, jv_str(v.u.s + st, i - st));
        }
        return l;
    }
    default:
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%s' object is not iterable", jv_type_name(v));
    }
}

static jv as_list(jctx *c, const jnode *at, jv v) {
    jv l = jinja_iter_list(c, at, v);
    jv r = jv_new_list(c, at, l.u.list->n);
    for (size_t i = 0; i < l.u.list->n; i++) jv_list_push(c, at, r, l.u.list->items[i]);
    return r;
}

/* ---------------------------------------------------------------- string helpers */

/* Simple Unicode case mapping for the scripts chat text mostly uses: ASCII, Latin-1, Latin Extended-A,
 * Greek, Cyrillic and fullwidth Latin. Other code points have no case here. */
static uint32_t cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x131) return 'I';
        if (c == 0x17F) return 'S';
        if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1u) ? c : c - 1;
        return c;
    }
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x130) return 'i';
        if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1u;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1u) ? c + 1 : c;
        return c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
    return c;
}

static bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xDF || c == 0x138 || c == 0x149; }

static void put_cp(jbuf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) { t[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) { t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[2] = (char)(0x80 | (cp & 0x3F)); n = 3; }
    else { t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F)); t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F)); n = 4; }
    jbuf_add(b, t, n);
}

static jv str_case(jctx *c, const jnode *at, jv s, int mode) {
    /* mode 0 lower, 1 upper, 2 capitalize (first upper, rest lower), 3 str.title, 4 jinja title filter */
    jbuf b;
    jbuf_init(&b, c, at);
    bool prev_cased = false, word_start = true, first = true;
    size_t i = 0;
    while (i < s.len) {
        size_t st = i;
        uint32_t cp = utf8_next(s.u.s, s.len, &i);
        bool up;
        switch (mode) {
        case 0: up = false; break;
        case 1: up = true; break;
        case 2: up = first; break;
        case 3: up = !prev_cased; break;
        default: up = word_start; break;
        }
        uint32_t m = up ? cp_upper(cp) : cp_lower(cp);
        if (up && cp == 0xDF) jbuf_add(&b, mode == 1 ? "SS" : "Ss", 2);
        else if (m == cp) jbuf_add(&b, s.u.s + st, i - st);
        else put_cp(&b, m);
        first = false;
        prev_cased = cp_cased(cp);
        word_start = is_uspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    }
    return jbuf_value(&b);
}

/* strip (mode bit 1: left, bit 2: right) whitespace or the code points of chars. */
static jv str_strip(jctx *c, const jnode *at, jv s, jv chars, int mode) {
    bool ws = chars.type == JV_NONE || chars.type == JV_UNDEFINED;
    if (!ws) need_str(c, at, "strip", chars);
    size_t lo = 0, hi = s.len;
    if (mode & 1) {
        while (lo < hi) {
            size_t k = lo;
            uint32_t cp = utf8_next(s.u.s, hi, &k);
            bool hit;
            if (ws) hit = is_uspace(cp);
            else {
                hit = false;
                size_t q = 0;
                while (q < chars.len) if (utf8_next(chars.u.s, chars.len, &q) == cp) { hit = true; break; }
            }
            if (!hit) break;
            lo = k;
        }
    }
    if (mode & 2) {
        while (hi > lo) {
            size_t k = hi - 1;
            while (k > lo && ((unsigned char)s.u.s[k] & 0xC0) == 0x80) k--;
            size_t q0 = k;
            uint32_t cp = utf8_next(s.u.s, hi, &q0);
            bool hit;
            if (ws) hit = is_uspace(cp);
            else {
                hit = false;
                size_t q = 0;
                while (q < chars.len) if (utf8_next(chars.u.s, chars.len, &q) == cp) { hit = true; break; }
            }
            if (!hit) break;
            hi = k;
        }
    }
    return jv_str(s.u.s + lo, hi - lo);
}

static jv str_split(jctx *c, const jnode *at, jv s, jv sep, jv maxsplit_v, bool from_right) {
    int64_t maxsplit = maxsplit_v.type == JV_UNDEFINED ? -1 : need_int(c, at, "split", maxsplit_v);
    jv out = jv_new_list(c, at, 4);
    if (sep.type == JV_NONE || sep.type == JV_UNDEFINED) {
        /* runs of whitespace; leading/trailing whitespace ignored */
        if (!from_right) {
            size_t i = 0;
            int64_t splits = 0;
            while (i < s.len) {
                size_t k = i;
                while (k < s.len) { size_t q = k; if (!is_uspace(utf8_next(s.u.s, s.len, &q))) break; k = q; }
                i = k;
                if (i >= s.len) break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t e = s.len;
                    /* rest of the string, trailing whitespace kept as Python does */
                    jv_list_push(c, at, out, jv_str(s.u.s + i, e - i));
                    i = s.len;
                    break;
                }
                size_t st = i;
                while (i < s.len) { size_t q = i; if (is_uspace(utf8_next(s.u.s, s.len, &q))) break; i = q; }
                jv_list_push(c, at, out, jv_str(s.u.s + st, i - st));
                splits++;
            }
            return out;
        }
        /* rsplit(None): collect words then keep the last maxsplit separate */
        jv words = str_split(c, at, s, sep, jv_undefined(NULL, 0), false);
        size_t n = words.u.list->n;
        if (maxsplit < 0 || (size_t)maxsplit >= n) return words;
        /* join the head back: find the start of word n-maxsplit-1 ... keep original text */
        size_t keep = (size_t)maxsplit;
        jv first_tail = words.u.list->items[n - keep - 1];
        size_t head_start = (size_t)(words.u.list->items[0].u.s - s.u.s);
        size_t head_end = (size_t)(first_tail.u.s - s.u.s) + first_tail.len;
        jv_list_push(c, at, out, jv_str(s.u.s + head_start, head_end - head_start));
        for (size_t i = n - keep; i < n; i++) jv_list_push(c, at, out, words.u.list->items[i]);
        return out;
    }
    need_str(c, at, "split", sep);
    if (!sep.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "split: empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || splits < maxsplit) && i <= s.len
                                  ? memmem(s.u.s + i, s.len - i, sep.u.s, sep.len) : NULL;
            if (!hit) { jv_list_push(c, at, out, jv_str(s.u.s + i, s.len - i)); break; }
            size_t pos = (size_t)(hit - s.u.s);
            jv_list_push(c, at, out, jv_str(s.u.s + i, pos - i));
            i = pos + sep.len;
            splits++;
        }
        return out;
    }
    /* rsplit with a separator: split from the right, then reverse */
    jv rev = jv_new_list(c, at, 4);
    size_t end = s.len;
    int64_t splits = 0;
    for (;;) {
        size_t pos = SIZE_MAX;
        if ((maxsplit < 0 || splits < maxsplit) && end >= sep.len) {
            for (size_t k = end - sep.len + 1; k-- > 0;) {
                if (!memcmp(s.u.s + k, sep.u.s, sep.len)) { pos = k; break; }
            }
        }
        if (pos == SIZE_MAX) { jv_list_push(c, at, rev, jv_str(s.u.s, end)); break; }
        jv_list_push(c, at, rev, jv_str(s.u.s + pos + sep.len, end - pos - sep.len));
        end = pos;
        splits++;
    }
    for (size_t k = rev.u.list->n; k-- > 0;) jv_list_push(c, at, out, rev.u.list->items[k]);
    return out;
}

static jv str_replace(jctx *c, const jnode *at, jv s, jv old, jv new_, jv count_v) {
    need_str(c, at, "replace", old);
    new_ = need_str(c, at, "replace", new_);
    int64_t count = (count_v.type == JV_UNDEFINED || count_v.type == JV_NONE) ? -1 : need_int(c, at, "replace", count_v);
    jbuf b;
    jbuf_init(&b, c, at);
    int64_t done = 0;
    if (!old.len) {
        size_t i = 0;
        while (true) {
            if (count < 0 || done < count) { jbuf_add(&b, new_.u.s, new_.len); done++; }
            if (i >= s.len) break;
            size_t st = i;
            utf8_next(s.u.s, s.len, &i);
            jbuf_add(&b, s.u.s + st, i - st);
        }
        return jbuf_value(&b);
    }
    size_t i = 0;
    while (i <= s.len) {
        const char *hit = (count < 0 || done < count) ? memmem(s.u.s + i, s.len - i, old.u.s, old.len) : NULL;
        if (!hit) { jbuf_add(&b, s.u.s + i, s.len - i); break; }
        size_t pos = (size_t)(hit - s.u.s);
        jbuf_add(&b, s.u.s + i, pos - i);
        jbuf_add(&b, new_.u.s, new_.len);
        i = pos + old.len;
        done++;
    }
    return jbuf_value(&b);
}

static bool str_affix(jctx *c, const jnode *at, jv s, jv affix, bool suffix) {
    if (affix.type == JV_LIST && (affix.flags & JVF_TUPLE)) {
        for (size_t i = 0; i < affix.u.list->n; i++)
            if (str_affix(c, at, s, affix.u.list->items[i], suffix)) return true;
        return false;
    }
    need_str(c, at, suffix ? "endswith" : "startswith", affix);
    if (affix.len > s.len) return false;
    return !memcmp(s.u.s + (suffix ? s.len - affix.len : 0), affix.u.s, affix.len);
}

jv jinja_html_escape(jctx *c, const jnode *at, jv s) {
    jbuf b;
    jbuf_init(&b, c, at);
    for (size_t i = 0; i < s.len; i++) {
        char ch = s.u.s[i];
        switch (ch) {
        case '&': jbuf_add(&b, "&amp;", 5); break;
        case '<': jbuf_add(&b, "&lt;", 4); break;
        case '>': jbuf_add(&b, "&gt;", 4); break;
        case '"': jbuf_add(&b, "&#34;", 5); break;
        case '\'': jbuf_add(&b, "&#39;", 5); break;
        default: jbuf_addc(&b, ch);
        }
    }
    jv r = jbuf_value(&b);
    r.flags = JVF_SAFE;
    return r;
}

/* Python's str.splitlines() boundaries (\n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029). */
static jv str_splitlines(jctx *c, const jnode *at, jv s, bool keepends) {
    jv out = jv_new_list(c, at, 4);
    size_t i = 0, st = 0;
    while (i < s.len) {
        size_t k = i;
        uint32_t cp = utf8_next(s.u.s, s.len, &k);
        bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
                   cp == 0x2028 || cp == 0x2029;
        if (brk) {
            size_t e = k;
            if (cp == '\r' && e < s.len && s.u.s[e] == '\n') e++;
            jv_list_push(c, at, out, jv_str(s.u.s + st, (keepends ? e : i) - st));
            st = i = e;
        } else {
            i = k;
        }
    }
    if (st < s.len) jv_list_push(c, at, out, jv_str(s.u.s + st, s.len - st));
    return out;
}

/* ---------------------------------------------------------------- methods */

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_REPLACE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM,
    M_ISSPACE, M_ISUPPER, M_ISLOWER, M_FORMAT,
    M_ITEMS, M_KEYS, M_VALUES, M_GET, M_COPY,
    M_INDEX, M_LCOUNT,
    M_CYCLE, M_CHANGED,
};

typedef struct method_def { uint8_t type; const char *name; int id; } method_def;
static const method_def METHODS[] = {
    {JV_STRING, "strip", M_STRIP}, {JV_STRING, "lstrip", M_LSTRIP}, {JV_STRING, "rstrip", M_RSTRIP},
    {JV_STRING, "split", M_SPLIT}, {JV_STRING, "rsplit", M_RSPLIT}, {JV_STRING, "splitlines", M_SPLITLINES},
    {JV_STRING, "startswith", M_STARTSWITH}, {JV_STRING, "endswith", M_ENDSWITH}, {JV_STRING, "upper", M_UPPER},
    {JV_STRING, "lower", M_LOWER}, {JV_STRING, "title", M_TITLE}, {JV_STRING, "capitalize", M_CAPITALIZE},
    {JV_STRING, "replace", M_REPLACE}, {JV_STRING, "find", M_FIND}, {JV_STRING, "rfind", M_RFIND},
    {JV_STRING, "count", M_COUNT}, {JV_STRING, "join", M_JOIN}, {JV_STRING, "isdigit", M_ISDIGIT},
    {JV_STRING, "isalpha", M_ISALPHA}, {JV_STRING, "isalnum", M_ISALNUM}, {JV_STRING, "isspace", M_ISSPACE},
    {JV_STRING, "isupper", M_ISUPPER}, {JV_STRING, "islower", M_ISLOWER}, {JV_STRING, "format", M_FORMAT},
    {JV_DICT, "items", M_ITEMS}, {JV_DICT, "keys", M_KEYS}, {JV_DICT, "values", M_VALUES}, {JV_DICT, "get", M_GET},
    {JV_DICT, "copy", M_COPY},
    {JV_LIST, "index", M_INDEX}, {JV_LIST, "count", M_LCOUNT},
};
/* Methods that exist but the immutable sandbox refuses (they would modify a value). */
static const method_def UNSAFE[] = {
    {JV_DICT, "pop", 0}, {JV_DICT, "popitem", 0}, {JV_DICT, "update", 0}, {JV_DICT, "setdefault", 0},
    {JV_DICT, "clear", 0}, {JV_LIST, "append", 0}, {JV_LIST, "extend", 0}, {JV_LIST, "insert", 0},
    {JV_LIST, "pop", 0}, {JV_LIST, "remove", 0}, {JV_LIST, "reverse", 0}, {JV_LIST, "sort", 0}, {JV_LIST, "clear", 0},
    {JV_STRING, "format_map", 0},
};

static bool lookup_method(jctx *c, const jnode *at, jv obj, const char *name, size_t len, jv *out) {
    uint8_t t = obj.type;
    if (t == JV_LIST && (obj.flags & JVF_GENERATOR)) return false;
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++) {
        if (METHODS[i].type == t && strlen(METHODS[i].name) == len && !memcmp(METHODS[i].name, name, len)) {
            jv_callable *fn = jctx_alloc(c, at, sizeof *fn);
            fn->kind = JFN_METHOD;
            fn->id = METHODS[i].id;
            fn->self = obj;
            jv v = {.type = JV_CALLABLE};
            v.u.fn = fn;
            *out = v;
            return true;
        }
    }
    for (size_t i = 0; i < sizeof UNSAFE / sizeof UNSAFE[0]; i++) {
        if (UNSAFE[i].type == t && strlen(UNSAFE[i].name) == len && !memcmp(UNSAFE[i].name, name, len)) {
            jbuf b;
            jbuf_init(&b, c, at);
            jbuf_addf(&b, "%s.%.*s", jv_type_name(obj), (int)len, name);
            jv s = jbuf_value(&b);
            *out = jv_undefined(s.u.s, s.len);
            out->flags = JVF_UNSAFE_METHOD;
            return true;
        }
    }
    return false;
}

/* format(value, spec) for the common specs: [[fill]align][sign][0][width][.precision][type], with types
 * s d x X o b f F e E % and none. */
static void format_value(jctx *c, const jnode *at, jbuf *b, jv v, const char *spec, size_t n) {
    if (!n) { jv_to_str(b, v); return; }
    size_t i = 0;
    char align = 0, sign = '-', type = 0;
    const char *fill_s = " ";   /* an ASCII fill character (explicit, or '0' with the 0 flag) */
    bool explicit_fill = false;
    if (n >= 2 && strchr("<>^=", spec[1]) && (unsigned char)spec[0] < 0x80) { fill_s = spec; align = spec[1]; i = 2; explicit_fill = true; }
    else if (strchr("<>^=", spec[0])) { align = spec[0]; i = 1; }
    if (i < n && strchr("+- ", spec[i])) sign = spec[i++];
    bool zero = false;
    if (i < n && spec[i] == '0') { zero = true; i++; }
    int64_t width = 0, prec = -1;
    while (i < n && spec[i] >= '0' && spec[i] <= '9' && width < 100000) width = width * 10 + (spec[i++] - '0');
    if (i < n && spec[i] == '.') {
        i++;
        prec = 0;
        while (i < n && spec[i] >= '0' && spec[i] <= '9' && prec < 1000) prec = prec * 10 + (spec[i++] - '0');
    }
    if (i < n) type = spec[i++];
    if (i != n || (type && !strchr("sdxXobfFeE%", type)) || width > 10000)
        jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "str.format: unsupported format spec '%.*s'", (int)n, spec);
    jbuf body;
    jbuf_init(&body, c, at);
    bool numeric = v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
    if (v.type == JV_STRING || (!numeric && (!type || type == 's'))) {
        if (type && type != 's') jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: code '%c' for a string", type);
        jv s = jv_stringify(c, at, v);
        size_t len = s.len;
        if (prec >= 0) {
            size_t k = 0, cps = 0;
            while (k < s.len && cps < (size_t)prec) { utf8_next(s.u.s, s.len, &k); cps++; }
            len = k;
        }
        jbuf_add(&body, s.u.s, len);
        if (!align) align = '<';
    } else if (numeric) {
        char tmp[400];
        double f = v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : v.u.b;
        long long iv = v.type == JV_INT ? v.u.i : v.type == JV_BOOL ? v.u.b : 0;
        const char *plus = sign == '+' ? "+" : sign == ' ' ? " " : "";
        if (!type && v.type == JV_FLOAT && prec < 0) {
            jbuf t2;
            jbuf_init(&t2, c, at);
            jv_to_str(&t2, v);
            if (f >= 0 && *plus) jbuf_add(&body, plus, 1);
            jbuf_add(&body, t2.p, t2.n);
        } else if (!type || type == 'd' || strchr("xXob", type)) {
            if (v.type == JV_FLOAT) {
                if (type) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: code '%c' for a float", type);
                snprintf(tmp, sizeof tmp, "%s%.*g", f >= 0 ? plus : "", (int)(prec ? prec : 1), f);
            } else if (type == 'x' || type == 'X' || type == 'o') {
                snprintf(tmp, sizeof tmp, type == 'x' ? "%s%s%llx" : type == 'X' ? "%s%s%llX" : "%s%s%llo", iv < 0 ? "-" : plus, "",
                         (unsigned long long)(iv < 0 ? -(unsigned long long)iv : (unsigned long long)iv));
            } else if (type == 'b') {
                unsigned long long u = iv < 0 ? -(unsigned long long)iv : (unsigned long long)iv;
                char bits[70];
                int nb = 0;
                do { bits[nb++] = (char)('0' + (u & 1)); u >>= 1; } while (u);
                size_t w = 0;
                const char *sg = iv < 0 ? "-" : plus;
                w += (size_t)snprintf(tmp, sizeof tmp, "%s", sg);
                while (nb) tmp[w++] = bits[--nb];
                tmp[w] = 0;
            } else {
                snprintf(tmp, sizeof tmp, "%s%lld", iv >= 0 ? plus : "", iv);
            }
            jbuf_add(&body, tmp, strlen(tmp));
        } else {
            char cfmt[16];
            double x = type == '%' ? f * 100 : f;
            snprintf(cfmt, sizeof cfmt, "%%s%%.%d%c", (int)(prec < 0 ? 6 : prec), type == '%' ? 'f' : type);
            snprintf(tmp, sizeof tmp, cfmt, x >= 0 ? plus : "", x);
            jbuf_add(&body, tmp, strlen(tmp));
            if (type == '%') jbuf_addc(&body, '%');
        }
        if (!align) align = zero ? '=' : '>';
        if (zero && !explicit_fill) fill_s = "0";
    } else {
        jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "str.format: cannot format a %s with a spec", jv_type_name(v));
    }
    size_t cps = jinja_utf8_count(body.p ? body.p : "", body.n);
    size_t pad = (size_t)width > cps ? (size_t)width - cps : 0;
    const size_t fl = 1;
    size_t left = align == '<' ? 0 : align == '^' ? pad / 2 : pad, right = pad - left;
    if (align == '=' && body.n && (body.p[0] == '-' || body.p[0] == '+' || body.p[0] == ' ')) {
        jbuf_addc(b, body.p[0]);
        for (size_t k = 0; k < left; k++) jbuf_add(b, fill_s, fl);
        jbuf_add(b, body.p + 1, body.n - 1);
        return;
    }
    for (size_t k = 0; k < left; k++) jbuf_add(b, fill_s, fl);
    jbuf_add(b, body.p ? body.p : "", body.n);
    for (size_t k = 0; k < right; k++) jbuf_add(b, fill_s, fl);
}

/* Python's printf-style formatting: %[(name)][flags][width][.precision]conv with conv in
 * s r a d i u f F e E g G x X o c %. */
jv jinja_percent_format(jctx *c, const jnode *at, jv fmt, jv args) {
    bool is_tuple = args.type == JV_LIST && (args.flags & JVF_TUPLE);
    size_t n_args = is_tuple ? args.u.list->n : 1, used = 0;
    jbuf b;
    jbuf_init(&b, c, at);
    size_t i = 0;
    while (i < fmt.len) {
        char ch = fmt.u.s[i++];
        if (ch != '%') { jbuf_addc(&b, ch); continue; }
        if (i >= fmt.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: incomplete format");
        jv v;
        bool have_v = false;
        if (fmt.u.s[i] == '(') {
            size_t e = i + 1;
            while (e < fmt.len && fmt.u.s[e] != ')') e++;
            if (e >= fmt.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: incomplete format key");
            if (args.type != JV_DICT) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: format requires a mapping");
            if (!jv_dict_get(args, jv_str(fmt.u.s + i + 1, e - i - 1), &v))
                jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: missing key '%.*s'", (int)(e - i - 1), fmt.u.s + i + 1);
            have_v = true;
            i = e + 1;
        }
        char flags[8];
        size_t nf = 0;
        while (i < fmt.len && strchr("-+ #0", fmt.u.s[i]) && nf < sizeof flags - 1) flags[nf++] = fmt.u.s[i++];
        flags[nf] = 0;
        int width = 0, prec = -1;
        while (i < fmt.len && fmt.u.s[i] >= '0' && fmt.u.s[i] <= '9' && width < 10000) width = width * 10 + (fmt.u.s[i++] - '0');
        if (i < fmt.len && fmt.u.s[i] == '.') {
            i++;
            prec = 0;
            while (i < fmt.len && fmt.u.s[i] >= '0' && fmt.u.s[i] <= '9' && prec < 1000) prec = prec * 10 + (fmt.u.s[i++] - '0');
        }
        if (i >= fmt.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: incomplete format");
        char conv = fmt.u.s[i++];
        if (conv == '%') { jbuf_addc(&b, '%'); continue; }
        if (!strchr("sradiufFeEgGxXoc", conv)) jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "%% format: unsupported conversion '%c'", conv);
        if (!have_v) {
            if (used >= n_args)
                jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: not enough arguments for format string");
            v = is_tuple ? args.u.list->items[used] : args;
            used++;
        }
        char spec[48], tmp[512];
        if (conv == 's' || conv == 'r' || conv == 'a' || conv == 'c') {
            jbuf sb;
            jbuf_init(&sb, c, at);
            if (conv == 'c') {
                if (v.type == JV_STRING && jinja_utf8_count(v.u.s, v.len) == 1) jbuf_add(&sb, v.u.s, v.len);
                else jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "%% format: %%c needs a one-character string");
            } else if (conv == 's') jv_to_str(&sb, v);
            else jv_repr(&sb, v);
            size_t len = sb.n;
            if (prec >= 0) {
                size_t k = 0, cps = 0;
                while (k < sb.n && cps < (size_t)prec) { utf8_next(sb.p, sb.n, &k); cps++; }
                len = k;
            }
            size_t cps = jinja_utf8_count(sb.p ? sb.p : "", len);
            size_t pad = (size_t)width > cps ? (size_t)width - cps : 0;
            bool left = strchr(flags, '-') != NULL;
            if (!left) for (size_t k = 0; k < pad; k++) jbuf_addc(&b, ' ');
            jbuf_add(&b, sb.p ? sb.p : "", len);
            if (left) for (size_t k = 0; k < pad; k++) jbuf_addc(&b, ' ');
            continue;
        }
        if (!is_number_value(v)) {
            if (v.type == JV_UNDEFINED) fail_undefined(c, at, v);
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: a number is required, not %s", jv_type_name(v));
        }
        double f = v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : v.u.b;
        if (strchr("diuxXo", conv)) {
            long long iv;
            if (v.type == JV_FLOAT) {
                if (conv != 'd' && conv != 'i' && conv != 'u') jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: %%%c needs an integer", conv);
                if (!isfinite(f) || fabs(f) >= 9.2e18) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: value out of range");
                iv = (long long)f;
            } else {
                iv = v.type == JV_INT ? v.u.i : v.u.b;
            }
            char cc = conv == 'i' || conv == 'u' ? 'd' : conv;
            if (prec >= 0) snprintf(spec, sizeof spec, "%%%s%d.%dll%c", flags, width, prec, cc);
            else snprintf(spec, sizeof spec, "%%%s%dll%c", flags, width, cc);
            if (cc == 'd') snprintf(tmp, sizeof tmp, spec, iv);
            else {
                /* Python prints negative hex/octal with a sign */
                unsigned long long u = iv < 0 ? -(unsigned long long)iv : (unsigned long long)iv;
                snprintf(tmp, sizeof tmp, spec, u);
                if (iv < 0) {
                    jbuf_addc(&b, '-');
                }
            }
        } else {
            if (prec >= 0) snprintf(spec, sizeof spec, "%%%s%d.%d%c", flags, width, prec, conv);
            else snprintf(spec, sizeof spec, "%%%s%d%c", flags, width, conv);
            snprintf(tmp, sizeof tmp, spec, f);
        }
        jbuf_add(&b, tmp, strlen(tmp));
    }
    if (is_tuple && used < n_args) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%% format: not all arguments converted during string formatting");
    return jbuf_value(&b);
}

/* Python's str.format: {} {0} {name}, !r/!s conversions, format specs; {{ and }} escape braces. */
static jv str_format(jctx *c, const jnode *at, jv fmt, const jargs *a) {
    jbuf b;
    jbuf_init(&b, c, at);
    size_t auto_idx = 0;
    bool used_auto = false, used_manual = false;
    size_t i = 0;
    while (i < fmt.len) {
        char ch = fmt.u.s[i];
        if (ch == '}') {
            if (i + 1 < fmt.len && fmt.u.s[i + 1] == '}') { jbuf_addc(&b, '}'); i += 2; continue; }
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: single '}' encountered");
        }
        if (ch != '{') { jbuf_addc(&b, ch); i++; continue; }
        if (i + 1 < fmt.len && fmt.u.s[i + 1] == '{') { jbuf_addc(&b, '{'); i += 2; continue; }
        size_t st = ++i;
        while (i < fmt.len && fmt.u.s[i] != '}' && fmt.u.s[i] != '{') i++;
        if (i >= fmt.len || fmt.u.s[i] == '{') jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "str.format: unterminated or nested replacement field");
        const char *f = fmt.u.s + st;
        size_t fl = i - st;
        i++;
        size_t name_end = 0;
        while (name_end < fl && f[name_end] != '!' && f[name_end] != ':') name_end++;
        char conv = 0;
        size_t spec_at = name_end;
        if (spec_at < fl && f[spec_at] == '!') {
            if (spec_at + 1 >= fl) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: missing conversion");
            conv = f[spec_at + 1];
            spec_at += 2;
            if (conv != 'r' && conv != 's' && conv != 'a') jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: unknown conversion '%c'", conv);
        }
        const char *spec = "";
        size_t spec_len = 0;
        if (spec_at < fl) {
            if (f[spec_at] != ':') jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: malformed field");
            spec = f + spec_at + 1;
            spec_len = fl - spec_at - 1;
        }
        jv v;
        bool digits = name_end > 0;
        size_t idx = 0;
        for (size_t k = 0; k < name_end; k++) {
            if (f[k] < '0' || f[k] > '9' || idx > 100000) { digits = false; break; }
            idx = idx * 10 + (size_t)(f[k] - '0');
        }
        for (size_t k = 0; k < name_end; k++)
            if (f[k] == '.' || f[k] == '[') jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "str.format: attribute/index fields are not supported");
        if (name_end == 0 || digits) {
            if (name_end == 0) { idx = auto_idx++; used_auto = true; } else used_manual = true;
            if (used_auto && used_manual) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: cannot mix automatic and manual field numbering");
            if (idx >= a->n_pos) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: replacement index %zu out of range", idx);
            v = a->pos[idx];
        } else {
            size_t k;
            for (k = 0; k < a->n_kw; k++)
                if (a->kw_lens[k] == name_end && !memcmp(a->kw_names[k], f, name_end)) break;
            if (k == a->n_kw) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "str.format: missing keyword '%.*s'", (int)name_end, f);
            v = a->kw_vals[k];
        }
        if (conv == 'r' || conv == 'a') {
            jbuf rb;
            jbuf_init(&rb, c, at);
            jv_repr(&rb, v);
            v = jbuf_value(&rb);
        } else if (conv == 's') {
            v = jv_stringify(c, at, v);
        }
        format_value(c, at, &b, v, spec, spec_len);
    }
    return jbuf_value(&b);
}

static int64_t cp_index(jv s, size_t byte_off) { return (int64_t)jinja_utf8_count(s.u.s, byte_off); }

static jv call_method(jctx *c, const jnode *at, const jv_callable *fn, const jargs *args) {
    jv self = fn->self;
    switch (fn->id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        BIND("strip", 0, "chars");
        return str_strip(c, at, self, p[0], fn->id == M_STRIP ? 3 : fn->id == M_LSTRIP ? 1 : 2);
    }
    case M_SPLIT: case M_RSPLIT: {
        BIND("split", 0, "sep", "maxsplit");
        return str_split(c, at, self, p[0], p[1], fn->id == M_RSPLIT);
    }
    case M_SPLITLINES: {
        BIND("splitlines", 0, "keepends");
        return str_splitlines(c, at, self, opt_bool(c, at, p[0], false));
    }
    case M_STARTSWITH: case M_ENDSWITH: {
        BIND("startswith", 1, "prefix");
        return jv_bool(str_affix(c, at, self, p[0], fn->id == M_ENDSWITH));
    }
    case M_UPPER: no_args(c, at, "upper", args); return str_case(c, at, self, 1);
    case M_LOWER: no_args(c, at, "lower", args); return str_case(c, at, self, 0);
    case M_TITLE: no_args(c, at, "title", args); return str_case(c, at, self, 3);
    case M_CAPITALIZE: no_args(c, at, "capitalize", args); return str_case(c, at, self, 2);
    case M_REPLACE: {
        BIND("replace", 2, "old", "new", "count");
        return str_replace(c, at, self, p[0], p[1], p[2]);
    }
    case M_FIND: case M_RFIND: case M_COUNT: {
        BIND("find", 1, "sub");
        jv sub = need_str(c, at, "find", p[0]);
        if (fn->id == M_COUNT) {
            if (!sub.len) return jv_int((int64_t)jinja_utf8_count(self.u.s, self.len) + 1);
            int64_t n = 0;
            size_t i = 0;
            const char *h;
            while (i <= self.len && (h = memmem(self.u.s + i, self.len - i, sub.u.s, sub.len))) { n++; i = (size_t)(h - self.u.s) + sub.len; }
            return jv_int(n);
        }
        if (fn->id == M_FIND) {
            const char *h = sub.len ? memmem(self.u.s, self.len, sub.u.s, sub.len) : self.u.s;
            return jv_int(h ? cp_index(self, (size_t)(h - self.u.s)) : -1);
        }
        if (sub.len > self.len) return jv_int(-1);
        for (size_t k = self.len - sub.len + 1; k-- > 0;)
            if (!memcmp(self.u.s + k, sub.u.s, sub.len)) return jv_int(cp_index(self, k));
        return jv_int(-1);
    }
    case M_JOIN: {
        BIND("join", 1, "iterable");
        jv l = jinja_iter_list(c, at, p[0]);
        jbuf b;
        jbuf_init(&b, c, at);
        for (size_t i = 0; i < l.u.list->n; i++) {
            if (i) jbuf_add(&b, self.u.s, self.len);
            jv it = need_str(c, at, "join", l.u.list->items[i]);
            jbuf_add(&b, it.u.s, it.len);
        }
        return jbuf_value(&b);
    }
    case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISUPPER: case M_ISLOWER: {
        no_args(c, at, "is*", args);
        if (!self.len) return jv_bool(false);
        bool any_cased = false;
        for (size_t i = 0; i < self.len; i++) {
            unsigned char ch = (unsigned char)self.u.s[i];
            bool dig = ch >= '0' && ch <= '9', lo = ch >= 'a' && ch <= 'z', up = ch >= 'A' && ch <= 'Z';
            bool sp = ch == ' ' || (ch >= 9 && ch <= 13);
            switch (fn->id) {
            case M_ISDIGIT: if (!dig) return jv_bool(false); break;
            case M_ISALPHA: if (!lo && !up) return jv_bool(false); break;
            case M_ISALNUM: if (!lo && !up && !dig) return jv_bool(false); break;
            case M_ISSPACE: if (!sp) return jv_bool(false); break;
            case M_ISUPPER: if (lo) return jv_bool(false); any_cased |= up; break;
            default: if (up) return jv_bool(false); any_cased |= lo; break;
            }
        }
        return jv_bool(fn->id == M_ISUPPER || fn->id == M_ISLOWER ? any_cased : true);
    }
    case M_FORMAT: return str_format(c, at, self, args);
    case M_ITEMS: case M_KEYS: case M_VALUES: {
        no_args(c, at, "items/keys/values", args);
        jv l = jv_new_list(c, at, self.u.dict->n);
        for (size_t i = 0; i < self.u.dict->n; i++) {
            if (fn->id == M_KEYS) jv_list_push(c, at, l, self.u.dict->keys[i]);
            else if (fn->id == M_VALUES) jv_list_push(c, at, l, self.u.dict->vals[i]);
            else {
                jv t = jv_new_list(c, at, 2);
                jv_list_push(c, at, t, self.u.dict->keys[i]);
                jv_list_push(c, at, t, self.u.dict->vals[i]);
                t.flags = JVF_TUPLE;
                jv_list_push(c, at, l, t);
            }
        }
        return l;
    }
    case M_GET: {
        BIND("get", 1, "key", "default");
        jv v;
        if (jv_dict_get(self, p[0], &v)) return v;
        return have[1] ? p[1] : jv_none();
    }
    case M_COPY: {
        no_args(c, at, "copy", args);
        jv d = jv_new_dict(c, at, self.u.dict->n);
        for (size_t i = 0; i < self.u.dict->n; i++) jv_dict_set(c, at, d, self.u.dict->keys[i], self.u.dict->vals[i]);
        return d;
    }
    case M_INDEX: case M_LCOUNT: {
        BIND("index", 1, "value");
        int64_t n = 0;
        for (size_t i = 0; i < self.u.list->n; i++) {
            if (jv_equal(self.u.list->items[i], p[0])) {
                if (fn->id == M_INDEX) return jv_int((int64_t)i);
                n++;
            }
        }
        if (fn->id == M_INDEX) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "list.index: value is not in list");
        return jv_int(n);
    }
    case M_CHANGED: {
        if (args->n_kw) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "loop.changed takes positional arguments");
        jv t = jv_new_list(c, at, args->n_pos);
        for (size_t i = 0; i < args->n_pos; i++) jv_list_push(c, at, t, args->pos[i]);
        t.flags = JVF_TUPLE;
        jv_loop *lp = self.u.loop;
        bool changed = !lp->has_changed || !jv_equal(lp->changed_last, t);
        lp->has_changed = true;
        lp->changed_last = t;
        return jv_bool(changed);
    }
    case M_CYCLE: {
        if (!args->n_pos) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "loop.cycle needs at least one argument");
        return args->pos[self.u.loop->index0 % (int64_t)args->n_pos];
    }
    }
    jctx_fail(c, at, KILN_ERR_INTERNAL, "unknown method id %d", fn->id);
}

/* ---------------------------------------------------------------- attribute and item access */

static jv loop_attr(jctx *c, const jnode *at, jv obj, const char *name, size_t len) {
    const jv_loop *l = obj.u.loop;
    #define IS(s) (len == sizeof(s) - 1 && !memcmp(name, s, len))
    if (IS("index0")) return jv_int(l->index0);
    if (IS("index")) return jv_int(l->index0 + 1);
    if (IS("revindex")) return jv_int(l->length - l->index0);
    if (IS("revindex0")) return jv_int(l->length - l->index0 - 1);
    if (IS("first")) return jv_bool(l->index0 == 0);
    if (IS("last")) return jv_bool(l->index0 == l->length - 1);
    if (IS("length")) return jv_int(l->length);
    if (IS("depth")) return jv_int(l->depth);
    if (IS("depth0")) return jv_int(l->depth - 1);
    if (IS("previtem")) return l->index0 > 0 ? l->items.u.list->items[l->index0 - 1] : jv_undefined("loop.previtem", 13);
    if (IS("nextitem")) return l->index0 + 1 < l->length ? l->items.u.list->items[l->index0 + 1] : jv_undefined("loop.nextitem", 13);
    if (IS("cycle")) {
        jv_callable *fn = jctx_alloc(c, at, sizeof *fn);
        fn->kind = JFN_METHOD;
        fn->id = M_CYCLE;
        fn->self = obj;
        jv v = {.type = JV_CALLABLE};
        v.u.fn = fn;
        return v;
    }
    if (IS("changed")) {
        jv_callable *fn = jctx_alloc(c, at, sizeof *fn);
        fn->kind = JFN_METHOD;
        fn->id = M_CHANGED;
        fn->self = obj;
        jv v = {.type = JV_CALLABLE};
        v.u.fn = fn;
        return v;
    }
    #undef IS
    return jv_undefined(name, len);
}

jv jinja_getattr(jctx *c, const jnode *at, jv obj, const char *name, size_t len) {
    jv m;
    switch (obj.type) {
    case JV_UNDEFINED:
        if (obj.u.s && obj.len)
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%.*s' is undefined (reading its attribute '%.*s')", (int)obj.len, obj.u.s, (int)len, name);
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "attribute '%.*s' of an undefined value", (int)len, name);
    case JV_DICT:
        if (lookup_method(c, at, obj, name, len, &m)) return m;
        if (jv_dict_get(obj, jv_str(name, len), &m)) return m;
        return jv_undefined(name, len);
    case JV_NAMESPACE: {
        jv d = {.type = JV_DICT};
        d.u.dict = obj.u.dict;
        if (jv_dict_get(d, jv_str(name, len), &m)) return m;
        return jv_undefined(name, len);
    }
    case JV_STRING: case JV_LIST:
        if (obj.type == JV_LIST && (obj.flags & JVF_GROUP) && obj.u.list->n == 2) {
            if (len == 7 && !memcmp(name, "grouper", 7)) return obj.u.list->items[0];
            if (len == 4 && !memcmp(name, "list", 4)) return obj.u.list->items[1];
        }
        if (lookup_method(c, at, obj, name, len, &m)) return m;
        return jv_undefined(name, len);
    case JV_LOOP: return loop_attr(c, at, obj, name, len);
    default: return jv_undefined(name, len);
    }
}

jv jinja_getitem(jctx *c, const jnode *at, jv obj, jv key) {
    if (obj.type == JV_UNDEFINED) {
        if (obj.u.s && obj.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%.*s' is undefined (subscripted)", (int)obj.len, obj.u.s);
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "subscript of an undefined value");
    }
    jv r;
    if (obj.type == JV_DICT) {
        if (jv_dict_get(obj, key, &r)) return r;
    } else if ((obj.type == JV_LIST && !(obj.flags & JVF_GENERATOR)) || obj.type == JV_STRING) {
        if (key.type == JV_INT || key.type == JV_BOOL) {
            int64_t i = key.type == JV_INT ? key.u.i : key.u.b;
            if (obj.type == JV_LIST) {
                int64_t n = (int64_t)obj.u.list->n;
                if (i < 0) i += n;
                if (i >= 0 && i < n) return obj.u.list->items[i];
            } else {
                int64_t n = (int64_t)jinja_utf8_count(obj.u.s, obj.len);
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    size_t k = 0, pos = 0;
                    while (k < (size_t)i) { utf8_next(obj.u.s, obj.len, &pos); k++; }
                    size_t st = pos;
                    utf8_next(obj.u.s, obj.len, &pos);
                    return jv_str(obj.u.s + st, pos - st);
                }
            }
            return jv_undefined(NULL, 0);
        }
    }
    if (key.type == JV_STRING) {
        if (obj.type == JV_DICT) {
            if (lookup_method(c, at, obj, key.u.s, key.len, &r)) return r;
            return jv_undefined(key.u.s, key.len);
        }
        return jinja_getattr(c, at, obj, key.u.s, key.len);
    }
    return jv_undefined(NULL, 0);
}

/* ---------------------------------------------------------------- globals */

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };
static jv_callable GLOBALS[] = {
    {JFN_GLOBAL, G_RANGE, {0}, NULL, NULL}, {JFN_GLOBAL, G_NAMESPACE, {0}, NULL, NULL}, {JFN_GLOBAL, G_DICT, {0}, NULL, NULL},
    {JFN_GLOBAL, G_RAISE, {0}, NULL, NULL}, {JFN_GLOBAL, G_STRFTIME, {0}, NULL, NULL},
};
static const char *const GLOBAL_NAMES[] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

bool jinja_builtin_global(const char *name, size_t len, jv *out) {
    for (size_t i = 0; i < sizeof GLOBAL_NAMES / sizeof GLOBAL_NAMES[0]; i++) {
        if (strlen(GLOBAL_NAMES[i]) == len && !memcmp(GLOBAL_NAMES[i], name, len)) {
            jv v = {.type = JV_CALLABLE};
            v.u.fn = &GLOBALS[i];
            *out = v;
            return true;
        }
    }
    return false;
}

static jv call_global(jctx *c, const jnode *at, int id, const jargs *args) {
    switch (id) {
    case G_RANGE: {
        if (args->n_kw || !args->n_pos || args->n_pos > 3) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "range() takes 1 to 3 positional arguments");
        int64_t a[3] = {0, 0, 0};
        for (size_t i = 0; i < args->n_pos; i++) a[i] = need_int(c, at, "range", args->pos[i]);
        int64_t start = args->n_pos == 1 ? 0 : a[0], stop = args->n_pos == 1 ? a[0] : a[1], st = args->n_pos == 3 ? a[2] : 1;
        if (!st) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "range() step must not be zero");
        double count = st > 0 ? ceil(((double)stop - (double)start) / (double)st) : ceil(((double)start - (double)stop) / (double)-st);
        if (count < 0) count = 0;
        if (count > JINJA_MAX_RANGE) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "range() of %.0f elements exceeds the limit of %d", count, JINJA_MAX_RANGE);
        jv l = jv_new_list(c, at, (size_t)count);
        for (int64_t i = 0; i < (int64_t)count; i++) jv_list_push(c, at, l, jv_int(start + i * st));
        return l;
    }
    case G_NAMESPACE: case G_DICT: {
        jv d = jv_new_dict(c, at, args->n_kw + 4);
        if (args->n_pos > 1) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s() takes at most one positional argument", id == G_DICT ? "dict" : "namespace");
        if (args->n_pos) {
            jv src = args->pos[0];
            if (src.type == JV_DICT || src.type == JV_NAMESPACE) {
                for (size_t i = 0; i < src.u.dict->n; i++) jv_dict_set(c, at, d, src.u.dict->keys[i], src.u.dict->vals[i]);
            } else {
                jv l = jinja_iter_list(c, at, src);
                for (size_t i = 0; i < l.u.list->n; i++) {
                    jv pair = l.u.list->items[i];
                    if (pair.type != JV_LIST || pair.u.list->n != 2) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "dict(): sequence elements must be pairs");
                    jv_dict_set(c, at, d, pair.u.list->items[0], pair.u.list->items[1]);
                }
            }
        }
        for (size_t k = 0; k < args->n_kw; k++) jv_dict_set(c, at, d, jv_str(args->kw_names[k], args->kw_lens[k]), args->kw_vals[k]);
        if (id == G_NAMESPACE) d.type = JV_NAMESPACE;
        return d;
    }
    case G_RAISE: {
        jv msg = args->n_pos ? jv_stringify(c, at, args->pos[0]) : jv_str("", 0);
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "raise_exception: %.*s", (int)(msg.len > 800 ? 800 : msg.len), msg.u.s);
    }
    case G_STRFTIME: {
        if (args->n_pos != 1 || args->n_kw) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "strftime_now() takes one argument");
        jv fmt = need_str(c, at, "strftime_now", args->pos[0]);
        char f[256];
        if (fmt.len >= sizeof f) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "strftime_now(): format too long");
        memcpy(f, fmt.u.s, fmt.len);
        f[fmt.len] = 0;
        struct tm tmv;
        time_t t;
        if (c->now) { t = (time_t)c->now; gmtime_r(&t, &tmv); }
        else { t = time(NULL); localtime_r(&t, &tmv); }
        char out[1024];
        size_t n = fmt.len ? strftime(out, sizeof out, f, &tmv) : 0;
        return jv_str_copy(c, at, out, n);
    }
    }
    jctx_fail(c, at, KILN_ERR_INTERNAL, "unknown global %d", id);
}

jv jinja_call(jctx *c, const jnode *at, jv fn, const jargs *args) {
    if (fn.type == JV_UNDEFINED) {
        if (fn.flags & JVF_UNSAFE_METHOD)
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "calling %.*s() is unsafe: the template sandbox forbids modifying values (as jinja2's ImmutableSandboxedEnvironment does)",
                      (int)fn.len, fn.u.s);
        if (fn.u.s && fn.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%.*s' is undefined (called)", (int)fn.len, fn.u.s);
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "call of an undefined value");
    }
    if (fn.type != JV_CALLABLE) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%s' object is not callable", jv_type_name(fn));
    switch (fn.u.fn->kind) {
    case JFN_GLOBAL: return call_global(c, at, fn.u.fn->id, args);
    case JFN_METHOD: return call_method(c, at, fn.u.fn, args);
    case JFN_MACRO: return jinja_call_macro(c, at, fn.u.fn, args);
    default: jctx_fail(c, at, KILN_ERR_INTERNAL, "bad callable");
    }
}

/* ---------------------------------------------------------------- tests */

enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE, T_INTEGER, T_FLOAT, T_NUMBER, T_STRING,
    T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_SAMEAS, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_IN,
    T_ODD, T_EVEN, T_DIVISIBLEBY, T_LOWER, T_UPPER, T_ESCAPED, T_FILTER, T_TEST,
};
static const struct { const char *name; int id; } TESTS[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE}, {"boolean", T_BOOLEAN},
    {"false", T_FALSE}, {"true", T_TRUE}, {"integer", T_INTEGER}, {"float", T_FLOAT}, {"number", T_NUMBER},
    {"string", T_STRING}, {"mapping", T_MAPPING}, {"iterable", T_ITERABLE}, {"sequence", T_SEQUENCE},
    {"callable", T_CALLABLE}, {"sameas", T_SAMEAS}, {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ},
    {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"le", T_LE}, {"<=", T_LE},
    {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE}, {">=", T_GE}, {"in", T_IN},
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"lower", T_LOWER}, {"upper", T_UPPER},
    {"escaped", T_ESCAPED}, {"filter", T_FILTER}, {"test", T_TEST},
};

int jinja_test_id(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (strlen(TESTS[i].name) == len && !memcmp(TESTS[i].name, name, len)) return TESTS[i].id;
    return -1;
}

static jv test_arg(jctx *c, const jnode *at, const jargs *a, const char *name) {
    if (a->n_pos + a->n_kw != 1) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "test '%s' takes one argument", name);
    return a->n_pos ? a->pos[0] : a->kw_vals[0];
}

bool jinja_apply_test(jctx *c, const jnode *at, int id, jv v, const jargs *a) {
    switch (id) {
    case T_DEFINED: return v.type != JV_UNDEFINED;
    case T_UNDEFINED: return v.type == JV_UNDEFINED;
    case T_NONE: return v.type == JV_NONE;
    case T_BOOLEAN: return v.type == JV_BOOL;
    case T_FALSE: return v.type == JV_BOOL && !v.u.b;
    case T_TRUE: return v.type == JV_BOOL && v.u.b;
    case T_INTEGER: return v.type == JV_INT;
    case T_FLOAT: return v.type == JV_FLOAT;
    case T_NUMBER: return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
    case T_STRING: return v.type == JV_STRING;
    case T_MAPPING: return v.type == JV_DICT;
    case T_ITERABLE: return v.type == JV_STRING || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEFINED;
    case T_SEQUENCE:
        return v.type == JV_STRING || (v.type == JV_LIST && !(v.flags & JVF_GENERATOR)) || v.type == JV_DICT || v.type == JV_UNDEFINED;
    case T_CALLABLE: return v.type == JV_CALLABLE;
    case T_SAMEAS: {
        jv o = test_arg(c, at, a, "sameas");
        if (v.type != o.type) return false;
        switch (v.type) {
        case JV_NONE: case JV_UNDEFINED: return v.type == JV_NONE;
        case JV_BOOL: return v.u.b == o.u.b;
        case JV_INT: return v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256;
        case JV_LIST: return v.u.list == o.u.list;
        case JV_DICT: case JV_NAMESPACE: return v.u.dict == o.u.dict;
        default: return false;
        }
    }
    case T_EQ: return jv_equal(v, test_arg(c, at, a, "eq"));
    case T_NE: return !jv_equal(v, test_arg(c, at, a, "ne"));
    case T_LT: return jv_compare(c, at, v, test_arg(c, at, a, "lt")) < 0;
    case T_LE: return jv_compare(c, at, v, test_arg(c, at, a, "le")) <= 0;
    case T_GT: return jv_compare(c, at, v, test_arg(c, at, a, "gt")) > 0;
    case T_GE: return jv_compare(c, at, v, test_arg(c, at, a, "ge")) >= 0;
    case T_IN: {
        jv seq = test_arg(c, at, a, "in");
        if (seq.type == JV_STRING) {
            jv needle = need_str(c, at, "in", v);
            return !needle.len || (seq.len >= needle.len && memmem(seq.u.s, seq.len, needle.u.s, needle.len));
        }
        if (seq.type == JV_DICT) { jv o; return jv_dict_get(seq, v, &o); }
        jv l = jinja_iter_list(c, at, seq);
        for (size_t i = 0; i < l.u.list->n; i++) if (jv_equal(l.u.list->items[i], v)) return true;
        return false;
    }
    case T_ODD: case T_EVEN: {
        int64_t i = need_int(c, at, "odd/even", v);
        return (i % 2 != 0) == (id == T_ODD);
    }
    case T_DIVISIBLEBY: {
        int64_t d = need_int(c, at, "divisibleby", test_arg(c, at, a, "divisibleby"));
        if (!d) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "divisibleby(0)");
        return need_int(c, at, "divisibleby", v) % d == 0;
    }
    case T_LOWER: case T_UPPER: {
        jv str = jv_stringify(c, at, v);
        bool any = false;
        size_t i = 0;
        while (i < str.len) {
            uint32_t cp = utf8_next(str.u.s, str.len, &i);
            if (id == T_LOWER ? cp_lower(cp) != cp : cp_upper(cp) != cp) return false;
            any |= cp_cased(cp);
        }
        return any;
    }
    case T_ESCAPED: return false;
    case T_FILTER: return v.type == JV_STRING && jinja_filter_id(v.u.s, v.len) >= 0;
    case T_TEST: return v.type == JV_STRING && jinja_test_id(v.u.s, v.len) >= 0;
    }
    jctx_fail(c, at, KILN_ERR_INTERNAL, "unknown test id %d", id);
}

/* ---------------------------------------------------------------- filters */

enum {
    F_ABS, F_ATTR, F_CAPITALIZE, F_COUNT, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT, F_INDENT, F_INT,
    F_ITEMS, F_JOIN, F_LAST, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE,
    F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE,
    F_UPPER, F_WORDCOUNT, F_FORCEESCAPE, F_FORMAT, F_CENTER, F_BATCH, F_SLICE, F_TRUNCATE, F_GROUPBY,
};
static const struct { const char *name; int id; } FILTERS[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"capitalize", F_CAPITALIZE}, {"count", F_COUNT}, {"length", F_COUNT},
    {"default", F_DEFAULT}, {"d", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"escape", F_ESCAPE}, {"e", F_ESCAPE},
    {"forceescape", F_FORCEESCAPE}, {"first", F_FIRST}, {"float", F_FLOAT}, {"indent", F_INDENT}, {"int", F_INT},
    {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST}, {"list", F_LIST}, {"lower", F_LOWER}, {"map", F_MAP},
    {"max", F_MAX}, {"min", F_MIN}, {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE},
    {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", F_SAFE}, {"select", F_SELECT},
    {"selectattr", F_SELECTATTR}, {"sort", F_SORT}, {"string", F_STRING}, {"sum", F_SUM}, {"title", F_TITLE},
    {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"unique", F_UNIQUE}, {"upper", F_UPPER},
    {"wordcount", F_WORDCOUNT}, {"format", F_FORMAT}, {"center", F_CENTER}, {"batch", F_BATCH}, {"slice", F_SLICE},
    {"truncate", F_TRUNCATE}, {"groupby", F_GROUPBY},
};

int jinja_filter_id(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (strlen(FILTERS[i].name) == len && !memcmp(FILTERS[i].name, name, len)) return FILTERS[i].id;
    return -1;
}

/* jinja's make_attrgetter: "a.b.0" -> successive subscripts. */
static jv get_path(jctx *c, const jnode *at, jv obj, jv path) {
    if (path.type == JV_INT) return jinja_getitem(c, at, obj, path);
    need_str(c, at, "attribute", path);
    size_t i = 0;
    while (i <= path.len) {
        size_t e = i;
        while (e < path.len && path.u.s[e] != '.') e++;
        jv key = jv_str(path.u.s + i, e - i);
        bool digits = e > i;
        int64_t num = 0;
        for (size_t k = i; k < e; k++) {
            if (path.u.s[k] < '0' || path.u.s[k] > '9' || num > INT64_MAX / 10 - 10) { digits = false; break; }
            num = num * 10 + (path.u.s[k] - '0');
        }
        obj = jinja_getitem(c, at, obj, digits ? jv_int(num) : key);
        i = e + 1;
    }
    return obj;
}

/* Lowercases strings for case-insensitive comparisons (jinja's ignore_case). */
static jv fold(jctx *c, const jnode *at, jv v, bool case_sensitive) {
    return (!case_sensitive && v.type == JV_STRING) ? str_case(c, at, v, 0) : v;
}

/* Stable merge sort of n values by keys (compared with jv_compare). */
static void sort_by_keys(jctx *c, const jnode *at, jv *vals, jv *keys, size_t n, bool reverse) {
    if (n < 2) return;
    jv *tv = jctx_alloc(c, at, n * sizeof(jv)), *tk = jctx_alloc(c, at, n * sizeof(jv));
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int cmp = jv_compare(c, at, keys[j], keys[i]);
                bool take_right = reverse ? cmp > 0 : cmp < 0;
                if (take_right) { tv[k] = vals[j]; tk[k++] = keys[j++]; }
                else { tv[k] = vals[i]; tk[k++] = keys[i++]; }
            }
            while (i < mid) { tv[k] = vals[i]; tk[k++] = keys[i++]; }
            while (j < hi) { tv[k] = vals[j]; tk[k++] = keys[j++]; }
        }
        memcpy(vals, tv, n * sizeof(jv));
        memcpy(keys, tk, n * sizeof(jv));
    }
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute's) test result is `want`. */
static jv filter_select(jctx *c, const jnode *at, jv seq, const jargs *a, bool by_attr, bool want) {
    if (!jv_truthy(c, at, seq)) seq = jv_undefined(NULL, 0); /* jinja2: `if value:` before iterating */
    jv l = jinja_iter_list(c, at, seq);
    size_t first_arg = 0;
    jv attr = jv_undefined(NULL, 0);
    if (a->n_kw) jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "keyword arguments to select/reject filters are not supported");
    if (by_attr) {
        if (!a->n_pos) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "selectattr/rejectattr need an attribute name");
        attr = a->pos[0];
        first_arg = 1;
    }
    int test = -1;
    if (a->n_pos > first_arg) {
        jv tn = need_str(c, at, "test name", a->pos[first_arg]);
        test = jinja_test_id(tn.u.s, tn.len);
        if (test < 0) jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "unsupported test '%.*s'", (int)tn.len, tn.u.s);
    }
    jargs targs = {0};
    if (a->n_pos > first_arg + 1) {
        targs.pos = a->pos + first_arg + 1;
        targs.n_pos = a->n_pos - first_arg - 1;
    }
    jv out = jv_new_list(c, at, l.u.list->n);
    for (size_t i = 0; i < l.u.list->n; i++) {
        jv item = l.u.list->items[i];
        jv subject = by_attr ? get_path(c, at, item, attr) : item;
        bool r = test < 0 ? jv_truthy(c, at, subject) : jinja_apply_test(c, at, test, subject, &targs);
        if (r == want) jv_list_push(c, at, out, item);
    }
    out.flags = JVF_GENERATOR;
    return out;
}

static jv filter_tojson(jctx *c, const jnode *at, jv v, const jargs *args) {
    BIND("tojson", 0, "ensure_ascii", "indent", "separators", "sort_keys");
    json_opts o = {NULL, 0, false, ", ", ": ", opt_bool(c, at, p[3], false), opt_bool(c, at, p[0], false)};
    char spaces[64];
    if (p[1].type != JV_UNDEFINED && p[1].type != JV_NONE) {
        o.has_indent = true;
        o.item_sep = ",";
        if (p[1].type == JV_STRING) { o.indent = p[1].u.s; o.indent_len = p[1].len; }
        else {
            int64_t n = need_int(c, at, "tojson indent", p[1]);
            if (n > 63) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "tojson: indent %lld too large", (long long)n);
            if (n < 0) n = 0;
            memset(spaces, ' ', (size_t)n);
            o.indent = spaces;
            o.indent_len = (size_t)n;
        }
    }
    char *seps[2];
    if (p[2].type != JV_UNDEFINED && p[2].type != JV_NONE) {
        if (p[2].type != JV_LIST || p[2].u.list->n != 2) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "tojson: separators must be a pair of strings");
        for (int k = 0; k < 2; k++) {
            jv s = need_str(c, at, "tojson separators", p[2].u.list->items[k]);
            seps[k] = jctx_alloc(c, at, (size_t)s.len + 1);
            memcpy(seps[k], s.u.s, s.len);
            jtrack_copy(c, seps[k], s.u.s, s.len);
            if (memchr(s.u.s, 0, s.len)) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "tojson: NUL in separators");
        }
        o.item_sep = seps[0];
        o.key_sep = seps[1];
    }
    jbuf b;
    jbuf_init(&b, c, at);
    json_dump(&b, v, &o, 0);
    return jbuf_value(&b);
}

static jv py_int_from_string(jctx *c, const jnode *at, jv s, int64_t base, bool *ok) {
    /* int(str, base): optional whitespace, sign, digits with single underscores */
    char buf[128];
    size_t n = 0;
    size_t i = 0, e = s.len;
    while (i < e && is_uspace((unsigned char)s.u.s[i])) i++;
    while (e > i && is_uspace((unsigned char)s.u.s[e - 1])) e--;
    *ok = false;
    if (e - i == 0 || e - i >= sizeof buf) return jv_int(0);
    bool prev_us = true;
    for (size_t k = i; k < e; k++) {
        char ch = s.u.s[k];
        if (ch == '_') { if (prev_us) return jv_int(0); prev_us = true; continue; }
        prev_us = false;
        buf[n++] = ch;
    }
    if (prev_us && n) return jv_int(0);
    buf[n] = 0;
    size_t start = (buf[0] == '+' || buf[0] == '-') ? 1 : 0;
    if (!buf[start]) return jv_int(0);
    for (size_t k = start; k < n; k++) {
        int d = buf[k] >= '0' && buf[k] <= '9' ? buf[k] - '0' : (buf[k] | 32) >= 'a' && (buf[k] | 32) <= 'z' ? (buf[k] | 32) - 'a' + 10 : 99;
        if (d >= base) return jv_int(0);
    }
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, (int)base);
    if (errno) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "int: value out of the 64-bit range");
    *ok = true;
    return jv_int(v);
}

static bool py_float_from_string(jv s, double *out) {
    char buf[128];
    size_t i = 0, e = s.len;
    while (i < e && is_uspace((unsigned char)s.u.s[i])) i++;
    while (e > i && is_uspace((unsigned char)s.u.s[e - 1])) e--;
    if (e - i == 0 || e - i >= sizeof buf) return false;
    size_t n = 0;
    for (size_t k = i; k < e; k++) if (s.u.s[k] != '_') buf[n++] = s.u.s[k];
    buf[n] = 0;
    for (size_t k = 0; k < n; k++) {
        char ch = buf[k];
        if (!((ch >= '0' && ch <= '9') || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-' ||
              strchr("infatyINFATY", ch))) return false;
        if (ch == 'x' || ch == 'X') return false;
    }
    char *end;
    double v = strtod(buf, &end);
    if (*end || end == buf) return false;
    *out = v;
    return true;
}

jv jinja_apply_filter(jctx *c, const jnode *at, int id, jv v, const jargs *args) {
    switch (id) {
    case F_ABS: {
        no_args(c, at, "abs", args);
        if (v.type == JV_INT) { if (v.u.i == INT64_MIN) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "integer overflow"); return jv_int(v.u.i < 0 ? -v.u.i : v.u.i); }
        if (v.type == JV_BOOL) return jv_int(v.u.b);
        if (v.type == JV_FLOAT) return jv_float(fabs(v.u.f));
        if (v.type == JV_UNDEFINED) fail_undefined(c, at, v);
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "abs: bad operand type %s", jv_type_name(v));
    }
    case F_ATTR: {
        BIND("attr", 1, "name");
        jv nm = need_str(c, at, "attr", p[0]);
        return jinja_getattr(c, at, v, nm.u.s, nm.len);
    }
    case F_CAPITALIZE: no_args(c, at, "capitalize", args); return str_case(c, at, jv_stringify(c, at, v), 2);
    case F_TITLE: no_args(c, at, "title", args); return str_case(c, at, jv_stringify(c, at, v), 4);
    case F_LOWER: no_args(c, at, "lower", args); return str_case(c, at, jv_stringify(c, at, v), 0);
    case F_UPPER: no_args(c, at, "upper", args); return str_case(c, at, jv_stringify(c, at, v), 1);
    case F_COUNT: {
        no_args(c, at, "length", args);
        switch (v.type) {
        case JV_UNDEFINED: return jv_int(0);
        case JV_STRING: return jv_int((int64_t)jinja_utf8_count(v.u.s, v.len));
        case JV_LIST: if (v.flags & JVF_GENERATOR) break; return jv_int((int64_t)v.u.list->n);
        case JV_DICT: return jv_int((int64_t)v.u.dict->n);
        default: break;
        }
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "object of type '%s' has no len()", jv_type_name(v));
    }
    case F_DEFAULT: {
        BIND("default", 0, "default_value", "boolean");
        jv def = have[0] ? p[0] : jv_str("", 0);
        if (v.type == JV_UNDEFINED || (opt_bool(c, at, p[1], false) && !jv_truthy(c, at, v))) return def;
        return v;
    }
    case F_DICTSORT: {
        BIND("dictsort", 0, "case_sensitive", "by", "reverse");
        if (v.type != JV_DICT) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "dictsort: expected a mapping, got %s", jv_type_name(v));
        bool cs = opt_bool(c, at, p[0], false), rev = opt_bool(c, at, p[2], false);
        bool by_value = false;
        if (have[1]) {
            jv by = need_str(c, at, "dictsort", p[1]);
            if (by.len == 5 && !memcmp(by.u.s, "value", 5)) by_value = true;
            else if (!(by.len == 3 && !memcmp(by.u.s, "key", 3))) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "dictsort: 'by' must be 'key' or 'value'");
        }
        size_t n = v.u.dict->n;
        jv *vals = jctx_alloc(c, at, (n ? n : 1) * sizeof(jv)), *keys = jctx_alloc(c, at, (n ? n : 1) * sizeof(jv));
        for (size_t i = 0; i < n; i++) {
            jv t = jv_new_list(c, at, 2);
            jv_list_push(c, at, t, v.u.dict->keys[i]);
            jv_list_push(c, at, t, v.u.dict->vals[i]);
            t.flags = JVF_TUPLE;
            vals[i] = t;
            keys[i] = fold(c, at, by_value ? v.u.dict->vals[i] : v.u.dict->keys[i], cs);
        }
        sort_by_keys(c, at, vals, keys, n, rev);
        jv out = jv_new_list(c, at, n);
        for (size_t i = 0; i < n; i++) jv_list_push(c, at, out, vals[i]);
        return out;
    }
    case F_ESCAPE:
        no_args(c, at, "escape", args);
        if (v.type == JV_STRING && (v.flags & JVF_SAFE)) return v;
        return jinja_html_escape(c, at, jv_stringify(c, at, v));
    case F_FORCEESCAPE: no_args(c, at, "forceescape", args); return jinja_html_escape(c, at, jv_stringify(c, at, v));
    case F_FIRST: case F_LAST: {
        no_args(c, at, "first/last", args);
        if (id == F_LAST && v.type == JV_LIST && (v.flags & JVF_GENERATOR))
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "last: a generator cannot be reversed");
        jv l = jinja_iter_list(c, at, v);
        if (!l.u.list->n) return jv_undefined(NULL, 0);
        return l.u.list->items[id == F_FIRST ? 0 : l.u.list->n - 1];
    }
    case F_FLOAT: {
        BIND("float", 0, "default");
        jv def = have[0] ? p[0] : jv_float(0.0);
        if (v.type == JV_FLOAT) return v;
        if (v.type == JV_INT || v.type == JV_BOOL) return jv_float((double)(v.type == JV_INT ? v.u.i : v.u.b));
        if (v.type == JV_UNDEFINED) fail_undefined(c, at, v);
        double f;
        if (v.type == JV_STRING && py_float_from_string(v, &f)) return jv_float(f);
        return def;
    }
    case F_INT: {
        BIND("int", 0, "default", "base");
        jv def = have[0] ? p[0] : jv_int(0);
        int64_t base = have[1] ? need_int(c, at, "int", p[1]) : 10;
        if (base < 2 || base > 36) jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "int: base %lld is not supported", (long long)base);
        if (v.type == JV_INT) return v;
        if (v.type == JV_BOOL) return jv_int(v.u.b);
        if (v.type == JV_FLOAT) {
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return def;
            return jv_int((int64_t)v.u.f);
        }
        if (v.type == JV_UNDEFINED) fail_undefined(c, at, v);
        if (v.type == JV_STRING) {
            bool ok;
            jv r = py_int_from_string(c, at, v, base, &ok);
            if (ok) return r;
            double f;
            if (py_float_from_string(v, &f) && isfinite(f) && fabs(f) < 9.2e18) return jv_int((int64_t)f);
        }
        return def;
    }
    case F_INDENT: {
        BIND("indent", 0, "width", "first", "blank");
        jv s = jv_stringify(c, at, v);
        jv ind;
        if (p[0].type == JV_STRING) ind = p[0];
        else {
            int64_t w = have[0] ? need_int(c, at, "indent", p[0]) : 4;
            if (w < 0) w = 0;
            if (w > 1024) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "indent: width too large");
            char *sp = jctx_alloc(c, at, (size_t)w + 1);
            memset(sp, ' ', (size_t)w);
            ind = jv_str(sp, (size_t)w);
        }
        bool first = opt_bool(c, at, p[1], false), blank = opt_bool(c, at, p[2], false);
        jbuf tmp;
        jbuf_init(&tmp, c, at);
        jbuf_add(&tmp, s.u.s, s.len);
        jbuf_addc(&tmp, '\n');
        jv lines = str_splitlines(c, at, jbuf_value(&tmp), false);
        jbuf b;
        jbuf_init(&b, c, at);
        if (first) jbuf_add(&b, ind.u.s, ind.len);
        for (size_t i = 0; i < lines.u.list->n; i++) {
            jv ln = lines.u.list->items[i];
            if (i) {
                jbuf_addc(&b, '\n');
                if (blank || ln.len) jbuf_add(&b, ind.u.s, ind.len);
            }
            jbuf_add(&b, ln.u.s, ln.len);
        }
        return jbuf_value(&b);
    }
    case F_ITEMS: {
        no_args(c, at, "items", args);
        if (v.type == JV_UNDEFINED) return jv_new_list(c, at, 0);
        if (v.type != JV_DICT) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "items: expected a mapping, got %s", jv_type_name(v));
        jv_callable fn = {JFN_METHOD, M_ITEMS, v, NULL, NULL};
        jargs none = {0};
        jv r = call_method(c, at, &fn, &none);
        r.flags = JVF_GENERATOR;
        return r;
    }
    case F_JOIN: {
        BIND("join", 0, "d", "attribute");
        jv sep = have[0] ? jv_stringify(c, at, p[0]) : jv_str("", 0);
        jv l = jinja_iter_list(c, at, v);
        jbuf b;
        jbuf_init(&b, c, at);
        for (size_t i = 0; i < l.u.list->n; i++) {
            if (i) jbuf_add(&b, sep.u.s, sep.len);
            jv it = l.u.list->items[i];
            if (have[1] && p[1].type != JV_NONE) it = get_path(c, at, it, p[1]);
            jv_to_str(&b, it);
        }
        return jbuf_value(&b);
    }
    case F_LIST: no_args(c, at, "list", args); return as_list(c, at, v);
    case F_MAP: {
        jv l = jinja_iter_list(c, at, jv_truthy(c, at, v) ? v : jv_undefined(NULL, 0));
        jv out = jv_new_list(c, at, l.u.list->n);
        out.flags = JVF_GENERATOR;
        if (args->n_pos == 0) {
            jv attr = jv_undefined(NULL, 0), def = jv_undefined(NULL, 0);
            bool have_def = false;
            for (size_t k = 0; k < args->n_kw; k++) {
                if (args->kw_lens[k] == 9 && !memcmp(args->kw_names[k], "attribute", 9)) attr = args->kw_vals[k];
                else if (args->kw_lens[k] == 7 && !memcmp(args->kw_names[k], "default", 7)) { def = args->kw_vals[k]; have_def = true; }
                else jctx_fail(c, at, KILN_ERR_INVALID_ARG, "map: unexpected keyword argument '%.*s'", (int)args->kw_lens[k], args->kw_names[k]);
            }
            if (attr.type == JV_UNDEFINED) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "map: needs a filter name or attribute=");
            for (size_t i = 0; i < l.u.list->n; i++) {
                jv r = get_path(c, at, l.u.list->items[i], attr);
                if (r.type == JV_UNDEFINED && have_def) r = def;
                jv_list_push(c, at, out, r);
            }
            return out;
        }
        jv fname = need_str(c, at, "map", args->pos[0]);
        int fid = jinja_filter_id(fname.u.s, fname.len);
        if (fid < 0) jctx_fail(c, at, KILN_ERR_UNSUPPORTED, "map: unsupported filter '%.*s'", (int)fname.len, fname.u.s);
        jargs rest = *args;
        rest.pos++;
        rest.n_pos--;
        for (size_t i = 0; i < l.u.list->n; i++) jv_list_push(c, at, out, jinja_apply_filter(c, at, fid, l.u.list->items[i], &rest));
        return out;
    }
    case F_MAX: case F_MIN: {
        BIND("max/min", 0, "case_sensitive", "attribute");
        jv l = jinja_iter_list(c, at, v);
        if (!l.u.list->n) return jv_undefined(NULL, 0);
        bool cs = opt_bool(c, at, p[0], false);
        size_t best = 0;
        jv best_key = jv_none();
        for (size_t i = 0; i < l.u.list->n; i++) {
            jv it = l.u.list->items[i];
            jv key = fold(c, at, have[1] && p[1].type != JV_NONE ? get_path(c, at, it, p[1]) : it, cs);
            if (i == 0) { best_key = key; continue; }
            int cmp = jv_compare(c, at, key, best_key);
            if (id == F_MAX ? cmp > 0 : cmp < 0) { best = i; best_key = key; }
        }
        return l.u.list->items[best];
    }
    case F_REJECT: return filter_select(c, at, v, args, false, false);
    case F_SELECT: return filter_select(c, at, v, args, false, true);
    case F_REJECTATTR: return filter_select(c, at, v, args, true, false);
    case F_SELECTATTR: return filter_select(c, at, v, args, true, true);
    case F_REPLACE: {
        BIND("replace", 2, "old", "new", "count");
        return str_replace(c, at, jv_stringify(c, at, v), p[0], p[1], p[2]);
    }
    case F_REVERSE: {
        no_args(c, at, "reverse", args);
        if (v.type == JV_STRING) {
            jbuf b;
            jbuf_init(&b, c, at);
            size_t i = v.len;
            while (i > 0) {
                size_t e = i;
                i--;
                while (i > 0 && ((unsigned char)v.u.s[i] & 0xC0) == 0x80) i--;
                jbuf_add(&b, v.u.s + i, e - i);
            }
            return jbuf_value(&b);
        }
        if (v.type == JV_LIST && (v.flags & JVF_GENERATOR)) {
            jv l = as_list(c, at, v);
            v = l;
        }
        jv l = jinja_iter_list(c, at, v);
        jv out = jv_new_list(c, at, l.u.list->n);
        for (size_t i = l.u.list->n; i-- > 0;) jv_list_push(c, at, out, l.u.list->items[i]);
        out.flags = JVF_GENERATOR;
        return out;
    }
    case F_ROUND: {
        BIND("round", 0, "precision", "method");
        int64_t prec = have[0] ? need_int(c, at, "round", p[0]) : 0;
        if (prec < -20 || prec > 20) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "round: precision out of range");
        if (!is_number_value(v)) {
            if (v.type == JV_UNDEFINED) fail_undefined(c, at, v);
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "round: expected a number, got %s", jv_type_name(v));
        }
        double x = v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : v.u.b;
        double scale = pow(10.0, (double)prec);
        jv method = have[1] ? need_str(c, at, "round", p[1]) : jv_str("common", 6);
        double r;
        if (method.len == 4 && !memcmp(method.u.s, "ceil", 4)) r = ceil(x * scale) / scale;
        else if (method.len == 5 && !memcmp(method.u.s, "floor", 5)) r = floor(x * scale) / scale;
        else if (method.len == 6 && !memcmp(method.u.s, "common", 6)) {
            if (v.type != JV_FLOAT && prec >= 0) return jv_int(v.type == JV_INT ? v.u.i : v.u.b);
            r = nearbyint(x * scale) / scale;
        } else jctx_fail(c, at, KILN_ERR_INVALID_ARG, "round: method must be common, ceil or floor");
        return jv_float(r);
    }
    case F_SAFE: {
        no_args(c, at, "safe", args);
        jv r = jv_stringify(c, at, v);
        r.flags = JVF_SAFE;
        return r;
    }
    case F_SORT: {
        BIND("sort", 0, "reverse", "case_sensitive", "attribute");
        jv l = as_list(c, at, v);
        size_t n = l.u.list->n;
        jv *keys = jctx_alloc(c, at, (n ? n : 1) * sizeof(jv));
        bool cs = opt_bool(c, at, p[1], false);
        for (size_t i = 0; i < n; i++)
            keys[i] = fold(c, at, have[2] && p[2].type != JV_NONE ? get_path(c, at, l.u.list->items[i], p[2]) : l.u.list->items[i], cs);
        sort_by_keys(c, at, l.u.list->items, keys, n, opt_bool(c, at, p[0], false));
        return l;
    }
    case F_STRING: no_args(c, at, "string", args); return jv_stringify(c, at, v);
    case F_SUM: {
        BIND("sum", 0, "attribute", "start");
        jv l = jinja_iter_list(c, at, v);
        jv acc = have[1] ? p[1] : jv_int(0);
        for (size_t i = 0; i < l.u.list->n; i++) {
            jv it = have[0] && p[0].type != JV_NONE ? get_path(c, at, l.u.list->items[i], p[0]) : l.u.list->items[i];
            if (!is_number_value(acc) || !is_number_value(it)) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "sum: only numbers can be summed");
            if (acc.type == JV_FLOAT || it.type == JV_FLOAT) acc = jv_float((acc.type == JV_FLOAT ? acc.u.f : (double)(acc.type == JV_INT ? acc.u.i : acc.u.b)) +
                                                                           (it.type == JV_FLOAT ? it.u.f : (double)(it.type == JV_INT ? it.u.i : it.u.b)));
            else {
                int64_t r;
                if (__builtin_add_overflow(acc.type == JV_INT ? acc.u.i : acc.u.b, it.type == JV_INT ? it.u.i : it.u.b, &r))
                    jctx_fail(c, at, KILN_ERR_INVALID_ARG, "integer overflow");
                acc = jv_int(r);
            }
        }
        return acc;
    }
    case F_TOJSON: return filter_tojson(c, at, v, args);
    case F_FORMAT: {
        if (args->n_pos && args->n_kw) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "format: positional and keyword arguments cannot be mixed");
        jv fmt = jv_stringify(c, at, v);
        if (args->n_kw) {
            jv d = jv_new_dict(c, at, args->n_kw);
            for (size_t k = 0; k < args->n_kw; k++) jv_dict_set(c, at, d, jv_str(args->kw_names[k], args->kw_lens[k]), args->kw_vals[k]);
            return jinja_percent_format(c, at, fmt, d);
        }
        jv t = jv_new_list(c, at, args->n_pos);
        for (size_t k = 0; k < args->n_pos; k++) jv_list_push(c, at, t, args->pos[k]);
        t.flags = JVF_TUPLE;
        return jinja_percent_format(c, at, fmt, t);
    }
    case F_BATCH: case F_SLICE: {
        BIND(id == F_BATCH ? "batch" : "slice", 1, "count", "fill_with");
        int64_t k = need_int(c, at, "batch/slice", p[0]);
        if (k <= 0) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "%s: count must be positive", id == F_BATCH ? "batch" : "slice");
        bool fill = have[1] && p[1].type != JV_NONE;
        jv l = jinja_iter_list(c, at, v);
        size_t n = l.u.list->n;
        jv out = jv_new_list(c, at, 4);
        out.flags = JVF_GENERATOR;
        if (id == F_BATCH) {
            for (size_t i = 0; i < n; i += (size_t)k) {
                jv row = jv_new_list(c, at, (size_t)k);
                for (size_t j = i; j < n && j < i + (size_t)k; j++) jv_list_push(c, at, row, l.u.list->items[j]);
                if (fill) while (row.u.list->n < (size_t)k) jv_list_push(c, at, row, p[1]);
                jv_list_push(c, at, out, row);
            }
            return out;
        }
        if (k > 100000) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "slice: too many slices");
        size_t per = n / (size_t)k, extra = n % (size_t)k, offset = 0;
        for (size_t sn = 0; sn < (size_t)k; sn++) {
            size_t start = offset + sn * per;
            if (sn < extra) offset++;
            size_t end = offset + (sn + 1) * per;
            jv row = jv_new_list(c, at, end - start + 1);
            for (size_t j = start; j < end; j++) jv_list_push(c, at, row, l.u.list->items[j]);
            if (fill && sn >= extra) jv_list_push(c, at, row, p[1]);
            jv_list_push(c, at, out, row);
        }
        return out;
    }
    case F_GROUPBY: {
        BIND("groupby", 1, "attribute", "default", "case_sensitive");
        bool cs = opt_bool(c, at, p[2], false);
        jv l = as_list(c, at, v);
        size_t n = l.u.list->n;
        jv *keys = jctx_alloc(c, at, (n ? n : 1) * sizeof(jv));
        for (size_t i = 0; i < n; i++) {
            jv k = get_path(c, at, l.u.list->items[i], p[0]);
            if (k.type == JV_UNDEFINED && have[1]) k = p[1];
            keys[i] = fold(c, at, k, cs);
        }
        sort_by_keys(c, at, l.u.list->items, keys, n, false);
        jv out = jv_new_list(c, at, 4);
        for (size_t i = 0; i < n;) {
            size_t e = i + 1;
            while (e < n && jv_equal(keys[e], keys[i])) e++;
            jv members = jv_new_list(c, at, e - i);
            for (size_t k = i; k < e; k++) jv_list_push(c, at, members, l.u.list->items[k]);
            jv grouper = keys[i];
            if (!cs) {
                grouper = get_path(c, at, l.u.list->items[i], p[0]);
                if (grouper.type == JV_UNDEFINED && have[1]) grouper = p[1];
            }
            jv t = jv_new_list(c, at, 2);
            jv_list_push(c, at, t, grouper);
            jv_list_push(c, at, t, members);
            t.flags = JVF_TUPLE | JVF_GROUP;
            jv_list_push(c, at, out, t);
            i = e;
        }
        return out;
    }
    case F_TRUNCATE: {
        BIND("truncate", 0, "length", "killwords", "end", "leeway");
        jv str = jv_stringify(c, at, v);
        int64_t length = have[0] ? need_int(c, at, "truncate", p[0]) : 255;
        jv end = have[2] ? need_str(c, at, "truncate", p[2]) : jv_str("...", 3);
        int64_t leeway = have[3] && p[3].type != JV_NONE ? need_int(c, at, "truncate", p[3]) : 5;
        int64_t n_end = (int64_t)jinja_utf8_count(end.u.s, end.len);
        if (length < n_end) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "truncate: expected length >= %lld, got %lld", (long long)n_end, (long long)length);
        if (leeway < 0) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "truncate: expected leeway >= 0");
        size_t n_cp;
        size_t *offs = NULL;
        n_cp = jinja_utf8_count(str.u.s, str.len);
        if ((int64_t)n_cp <= length + leeway) return str;
        offs = jctx_alloc(c, at, (n_cp + 1) * sizeof(size_t));
        size_t q = 0, k = 0;
        while (q < str.len) { offs[k++] = q; utf8_next(str.u.s, str.len, &q); }
        offs[k] = str.len;
        size_t cut = offs[length - n_end];
        jv head = jv_str(str.u.s, cut);
        if (!opt_bool(c, at, p[1], false)) {
            /* rsplit(" ", 1)[0] */
            const char *sp = NULL;
            for (size_t i = cut; i-- > 0;) if (str.u.s[i] == ' ') { sp = str.u.s + i; break; }
            if (sp) head = jv_str(str.u.s, (size_t)(sp - str.u.s));
        }
        jbuf b;
        jbuf_init(&b, c, at);
        jbuf_add(&b, head.u.s, head.len);
        jbuf_add(&b, end.u.s, end.len);
        return jbuf_value(&b);
    }
    case F_CENTER: {
        BIND("center", 0, "width");
        jv str = jv_stringify(c, at, v);
        int64_t w = have[0] ? need_int(c, at, "center", p[0]) : 80;
        int64_t len = (int64_t)jinja_utf8_count(str.u.s, str.len);
        if (w > 100000) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "center: width too large");
        if (w <= len) return str;
        int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
        jbuf b;
        jbuf_init(&b, c, at);
        for (int64_t k = 0; k < left; k++) jbuf_addc(&b, ' ');
        jbuf_add(&b, str.u.s, str.len);
        for (int64_t k = 0; k < marg - left; k++) jbuf_addc(&b, ' ');
        return jbuf_value(&b);
    }
    case F_TRIM: {
        BIND("trim", 0, "chars");
        return str_strip(c, at, jv_stringify(c, at, v), p[0], 3);
    }
    case F_UNIQUE: {
        BIND("unique", 0, "case_sensitive", "attribute");
        jv l = jinja_iter_list(c, at, v);
        bool cs = opt_bool(c, at, p[0], false);
        jv out = jv_new_list(c, at, l.u.list->n);
        jv seen = jv_new_list(c, at, l.u.list->n);
        for (size_t i = 0; i < l.u.list->n; i++) {
            jv it = l.u.list->items[i];
            jv key = fold(c, at, have[1] && p[1].type != JV_NONE ? get_path(c, at, it, p[1]) : it, cs);
            bool dup = false;
            for (size_t k = 0; k < seen.u.list->n && !dup; k++) dup = jv_equal(seen.u.list->items[k], key);
            if (!dup) { jv_list_push(c, at, seen, key); jv_list_push(c, at, out, it); }
        }
        out.flags = JVF_GENERATOR;
        return out;
    }
    case F_WORDCOUNT: {
        no_args(c, at, "wordcount", args);
        jv s = jv_stringify(c, at, v);
        int64_t n = 0;
        bool in_word = false;
        for (size_t i = 0; i < s.len; i++) {
            unsigned char ch = (unsigned char)s.u.s[i];
            bool w = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch >= 0x80;
            if (w && !in_word) n++;
            in_word = w;
        }
        return jv_int(n);
    }
    }
    jctx_fail(c, at, KILN_ERR_INTERNAL, "unknown filter id %d", id);
}
