/*
 * jinja_eval.c — rendering a parsed template (see jinja.h): scopes, statements, expressions, operators,
 * macro calls, and the value constructors. Every value of one render lives in the render's arena; an
 * error anywhere longjmps to jinja_render, which frees the arena and the output buffer.
 *
 * Scoping follows jinja2: a `for` body gets a fresh scope per iteration (a `set` inside a loop is not
 * seen after it); `if` opens no scope; a macro body runs in a scope whose parent is the template's top
 * level; namespace() objects are shared references, so `set ns.attr` inside a loop persists.
 */
#include "chat/jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

#define JINJA_MAX_EVAL_DEPTH 400
#define JINJA_MAX_MACRO_DEPTH 64
#define JINJA_MAX_STEPS 50000000ull
#define JINJA_RENDER_ARENA_LIMIT (256u << 20)
#define JINJA_DEFAULT_MAX_OUTPUT (64u << 20)

struct jscope {
    jscope *parent;
    size_t n, cap;
    const char **names;
    uint32_t *lens;
    jv *vals;
};

/* ---------------------------------------------------------------- errors and memory */

void jctx_fail(jctx *c, const jnode *at, kiln_status st, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) c->fail_status = kiln_fail(st, "chat template %s:%u:%u: %s", c->tmpl_name, at->line, at->col, msg);
    else c->fail_status = kiln_fail(st, "chat template %s: %s", c->tmpl_name, msg);
    longjmp(c->fail, 1);
}

void *jctx_alloc(jctx *c, const jnode *at, size_t n) {
    void *p = jinja_arena_alloc(&c->arena, n ? n : 1);
    if (!p) jctx_fail(c, at, KILN_ERR_NOMEM, "out of memory (render limit %u MiB)", JINJA_RENDER_ARENA_LIMIT >> 20);
    return p;
}

/* ---------------------------------------------------------------- content tracking */

/* Fills sh[0..n) with the content marks of src[0..n): the shadow where src is render memory, 0 for the
 * template's text, else (static tables, the stack, variables that are not content) 1 inside an operation
 * on content and 0 outside one. */
static void shadow_of(jctx *c, unsigned char *sh, const void *src, size_t n) {
    const unsigned char *from = jinja_arena_shadow(&c->arena, src, n);
    const char *q = src;
    if (!from && c->out && q >= c->out && q < c->out + c->out_len) from = c->out_mask + (q - c->out);
    if (from) memmove(sh, from, n);
    else memset(sh, !jinja_arena_contains(c->tmpl_arena, src) && c->fresh, n);
}

void jtrack_copy(jctx *c, void *dst, const void *src, size_t n) {
    if (!c->track || !n) return;
    unsigned char *sh = jinja_arena_shadow(&c->arena, dst, n);
    KILN_ASSERT(sh);
    shadow_of(c, sh, src, n);
}

/* A string of content: copied into the render arena with its shadow set. */
static jv content_str(jctx *c, const char *s, size_t n) {
    if (n >= UINT32_MAX) jctx_fail(c, NULL, KILN_ERR_INVALID_ARG, "string variable too long");
    char *d = jctx_alloc(c, NULL, n + 1);
    if (n) memcpy(d, s, n);
    memset(jinja_arena_shadow(&c->arena, d, n + 1), 1, n + 1);
    return jv_str(d, n);
}

/* jv_from_json where every string, keys included, is content. */
static jv content_from_json(jctx *c, const json_t *j) {
    if (json_is_string(j)) return content_str(c, json_string_value(j), json_string_length(j));
    if (json_is_array(j)) {
        jv l = jv_new_list(c, NULL, json_array_size(j));
        size_t i;
        json_t *val;
        json_array_foreach(j, i, val) jv_list_push(c, NULL, l, content_from_json(c, val));
        return l;
    }
    if (json_is_object(j)) {
        jv d = jv_new_dict(c, NULL, json_object_size(j));
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)j, k, val) jv_dict_set(c, NULL, d, content_str(c, k, strlen(k)), content_from_json(c, val));
        return d;
    }
    return jv_from_json(c, j);
}

/* The variable `messages` with content tracking: each message's "role" is markup, the rest content. */
static jv messages_from_json(jctx *c, const json_t *j) {
    if (!json_is_array(j)) return content_from_json(c, j);
    jv l = jv_new_list(c, NULL, json_array_size(j));
    size_t i;
    json_t *msg;
    json_array_foreach(j, i, msg) {
        if (!json_is_object(msg)) { jv_list_push(c, NULL, l, content_from_json(c, msg)); continue; }
        jv d = jv_new_dict(c, NULL, json_object_size(msg));
        const char *k;
        json_t *val;
        json_object_foreach(msg, k, val) {
            bool role = !strcmp(k, "role");
            jv_dict_set(c, NULL, d, jv_str(k, strlen(k)), role ? jv_from_json(c, val) : content_from_json(c, val));
        }
        jv_list_push(c, NULL, l, d);
    }
    return l;
}

static jv var_from_json(jctx *c, const char *name, const json_t *j) {
    if (!c->track) return jv_from_json(c, j);
    if (!strcmp(name, "messages")) return messages_from_json(c, j);
    if (!strcmp(name, "tools") || !strcmp(name, "documents")) return content_from_json(c, j);
    return jv_from_json(c, j);
}

/* True when any byte of a string reachable from v is content (conservatively true past a budget of
 * values, so that shared or cyclic structures stay cheap). */
static bool has_content_in(jctx *c, jv v, int *budget) {
    if (--*budget < 0) return true;
    switch (v.type) {
    case JV_STRING: {
        if (!v.len) return false;
        const unsigned char *sh = jinja_arena_shadow(&c->arena, v.u.s, v.len);
        return sh && memchr(sh, 1, v.len);
    }
    case JV_LIST:
        for (size_t i = 0; i < v.u.list->n; i++) if (has_content_in(c, v.u.list->items[i], budget)) return true;
        return false;
    case JV_DICT: case JV_NAMESPACE:
        for (size_t i = 0; i < v.u.dict->n; i++)
            if (has_content_in(c, v.u.dict->keys[i], budget) || has_content_in(c, v.u.dict->vals[i], budget)) return true;
        return false;
    case JV_CALLABLE: return v.u.fn->kind == JFN_METHOD && has_content_in(c, v.u.fn->self, budget);
    case JV_LOOP: return has_content_in(c, v.u.loop->items, budget);
    default: return false;
    }
}

static bool has_content(jctx *c, jv v) {
    int budget = 100000;
    return c->track && has_content_in(c, v, &budget);
}

static bool args_have_content(jctx *c, const jargs *a) {
    if (!c->track) return false;
    for (size_t i = 0; i < a->n_pos; i++) if (has_content(c, a->pos[i])) return true;
    for (size_t i = 0; i < a->n_kw; i++) if (has_content(c, a->kw_vals[i])) return true;
    return false;
}

/* ---------------------------------------------------------------- values */

jv jv_undefined(const char *name, size_t len) {
    jv v = {.type = JV_UNDEFINED, .len = (uint32_t)(len > UINT32_MAX ? 0 : len)};
    v.u.s = name;
    return v;
}
jv jv_none(void) { jv v = {.type = JV_NONE}; return v; }
jv jv_bool(bool b) { jv v = {.type = JV_BOOL}; v.u.b = b; return v; }
jv jv_int(int64_t i) { jv v = {.type = JV_INT}; v.u.i = i; return v; }
jv jv_float(double f) { jv v = {.type = JV_FLOAT}; v.u.f = f; return v; }
jv jv_str(const char *s, size_t len) {
    jv v = {.type = JV_STRING, .len = (uint32_t)len};
    v.u.s = len ? s : "";
    return v;
}

jv jv_str_copy(jctx *c, const jnode *at, const char *s, size_t len) {
    if (len >= UINT32_MAX) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "string too long");
    char *d = jctx_alloc(c, at, len + 1);
    if (len) memcpy(d, s, len);
    jtrack_copy(c, d, s, len);
    return jv_str(d, len);
}

jv jv_new_list(jctx *c, const jnode *at, size_t cap) {
    jv v = {.type = JV_LIST};
    v.u.list = jctx_alloc(c, at, sizeof(jv_list));
    if (cap) {
        if (cap > (SIZE_MAX / sizeof(jv))) jctx_fail(c, at, KILN_ERR_NOMEM, "list too large");
        v.u.list->items = jctx_alloc(c, at, cap * sizeof(jv));
        v.u.list->cap = cap;
    }
    return v;
}

void jv_list_push(jctx *c, const jnode *at, jv list, jv item) {
    jv_list *l = list.u.list;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *ni = jctx_alloc(c, at, cap * sizeof(jv));
        if (l->n) memcpy(ni, l->items, l->n * sizeof(jv));
        l->items = ni;
        l->cap = cap;
    }
    l->items[l->n++] = item;
}

jv jv_new_dict(jctx *c, const jnode *at, size_t cap) {
    jv v = {.type = JV_DICT};
    v.u.dict = jctx_alloc(c, at, sizeof(jv_dict));
    if (cap) {
        if (cap > (SIZE_MAX / sizeof(jv))) jctx_fail(c, at, KILN_ERR_NOMEM, "dict too large");
        v.u.dict->keys = jctx_alloc(c, at, cap * sizeof(jv));
        v.u.dict->vals = jctx_alloc(c, at, cap * sizeof(jv));
        v.u.dict->cap = cap;
    }
    return v;
}

static bool key_equal(jv a, jv b) {
    if (a.type == JV_STRING && b.type == JV_STRING) return a.len == b.len && !memcmp(a.u.s, b.u.s, a.len);
    return jv_equal(a, b);
}

void jv_dict_set(jctx *c, const jnode *at, jv dict, jv key, jv val) {
    jv_dict *d = dict.u.dict;
    for (size_t i = 0; i < d->n; i++) {
        if (key_equal(d->keys[i], key)) { d->vals[i] = val; return; }
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = jctx_alloc(c, at, cap * sizeof(jv));
        jv *nv = jctx_alloc(c, at, cap * sizeof(jv));
        if (d->n) {
            memcpy(nk, d->keys, d->n * sizeof(jv));
            memcpy(nv, d->vals, d->n * sizeof(jv));
        }
        d->keys = nk;
        d->vals = nv;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
}

bool jv_dict_get(jv dict, jv key, jv *out) {
    jv_dict *d = dict.u.dict;
    for (size_t i = 0; i < d->n; i++) {
        if (key_equal(d->keys[i], key)) { *out = d->vals[i]; return true; }
    }
    return false;
}

bool jv_dict_get_str(jv dict, const char *key, jv *out) {
    return jv_dict_get(dict, jv_str(key, strlen(key)), out);
}

jv jv_from_json(jctx *c, const json_t *j) {
    if (!j) return jv_none();
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = jv_new_dict(c, NULL, json_object_size(j));
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)j, k, val) {
            jv_dict_set(c, NULL, d, jv_str(k, strlen(k)), jv_from_json(c, val));
        }
        return d;
    }
    case JSON_ARRAY: {
        jv l = jv_new_list(c, NULL, json_array_size(j));
        size_t i;
        json_t *val;
        json_array_foreach(j, i, val) jv_list_push(c, NULL, l, jv_from_json(c, val));
        return l;
    }
    case JSON_STRING: {
        size_t n = json_string_length(j);
        if (n >= UINT32_MAX) jctx_fail(c, NULL, KILN_ERR_INVALID_ARG, "string variable too long");
        return jv_str(json_string_value(j), n);
    }
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
    }
}

const char *jv_type_name(jv v) {
    switch (v.type) {
    case JV_UNDEFINED: return "undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STRING: return "str";
    case JV_LIST: return v.flags & JVF_TUPLE ? "tuple" : v.flags & JVF_GENERATOR ? "generator" : "list";
    case JV_DICT: return "dict";
    case JV_NAMESPACE: return "Namespace";
    case JV_CALLABLE: return "function";
    case JV_LOOP: return "LoopContext";
    }
    return "?";
}

/* Fails for an undefined operand, naming the variable. */
static void require_defined(jctx *c, const jnode *at, jv v) {
    if (v.type == JV_UNDEFINED) {
        if (v.u.s && v.len) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'%.*s' is undefined", (int)v.len, v.u.s);
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "use of an undefined value");
    }
}

bool jv_truthy(jctx *c, const jnode *at, jv v) {
    switch (v.type) {
    case JV_UNDEFINED: case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STRING: return v.len != 0;
    case JV_LIST: return (v.flags & JVF_GENERATOR) || v.u.list->n != 0;
    case JV_DICT: return v.u.dict->n != 0;
    default: return true;
    }
}

static bool is_number(jv v) { return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL; }
static double num_f(jv v) { return v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t num_i(jv v) { return v.type == JV_INT ? v.u.i : (int64_t)v.u.b; }

bool jv_equal(jv a, jv b) {
    if (is_number(a) && is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
    case JV_UNDEFINED: case JV_NONE: return true;
    case JV_STRING: return a.len == b.len && !memcmp(a.u.s, b.u.s, a.len);
    case JV_LIST: {
        if ((a.flags & JVF_TUPLE) != (b.flags & JVF_TUPLE)) return false;
        if ((a.flags | b.flags) & JVF_GENERATOR) return a.u.list == b.u.list;
        if (a.u.list->n != b.u.list->n) return false;
        for (size_t i = 0; i < a.u.list->n; i++)
            if (!jv_equal(a.u.list->items[i], b.u.list->items[i])) return false;
        return true;
    }
    case JV_DICT: {
        if (a.u.dict->n != b.u.dict->n) return false;
        for (size_t i = 0; i < a.u.dict->n; i++) {
            jv other;
            if (!jv_dict_get(b, a.u.dict->keys[i], &other) || !jv_equal(a.u.dict->vals[i], other)) return false;
        }
        return true;
    }
    case JV_NAMESPACE: return a.u.dict == b.u.dict;
    case JV_CALLABLE: return a.u.fn == b.u.fn;
    case JV_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

int jv_compare(jctx *c, const jnode *at, jv a, jv b) {
    if (is_number(a) && is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) return num_i(a) < num_i(b) ? -1 : num_i(a) > num_i(b);
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y;
    }
    if (a.type == JV_STRING && b.type == JV_STRING) {
        size_t n = a.len < b.len ? a.len : b.len;
        int r = n ? memcmp(a.u.s, b.u.s, n) : 0;
        if (r) return r < 0 ? -1 : 1;
        return a.len < b.len ? -1 : a.len > b.len;
    }
    if (a.type == JV_LIST && b.type == JV_LIST && !((a.flags | b.flags) & JVF_GENERATOR) &&
        (a.flags & JVF_TUPLE) == (b.flags & JVF_TUPLE)) {
        size_t n = a.u.list->n < b.u.list->n ? a.u.list->n : b.u.list->n;
        for (size_t i = 0; i < n; i++) {
            jv x = a.u.list->items[i], y = b.u.list->items[i];
            if (jv_equal(x, y)) continue;
            return jv_compare(c, at, x, y);
        }
        return a.u.list->n < b.u.list->n ? -1 : a.u.list->n > b.u.list->n;
    }
    require_defined(c, at, a);
    require_defined(c, at, b);
    jctx_fail(c, at, KILN_ERR_INVALID_ARG, "cannot order %s and %s", jv_type_name(a), jv_type_name(b));
}

/* ---------------------------------------------------------------- scopes */

static jscope *scope_new(jctx *c, jscope *parent) {
    jscope *s = jctx_alloc(c, NULL, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jctx *c, const jnode *at, jscope *s, const char *name, size_t len, jv val) {
    for (size_t i = 0; i < s->n; i++) {
        if (s->lens[i] == len && !memcmp(s->names[i], name, len)) { s->vals[i] = val; return; }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **nn = jctx_alloc(c, at, cap * sizeof(char *));
        uint32_t *nl = jctx_alloc(c, at, cap * sizeof(uint32_t));
        jv *nv = jctx_alloc(c, at, cap * sizeof(jv));
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof(char *));
            memcpy(nl, s->lens, s->n * sizeof(uint32_t));
            memcpy(nv, s->vals, s->n * sizeof(jv));
        }
        s->names = nn;
        s->lens = nl;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->lens[s->n] = (uint32_t)len;
    s->vals[s->n] = val;
    s->n++;
}

static jv scope_lookup(jscope *s, const char *name, size_t len) {
    for (; s; s = s->parent) {
        for (size_t i = 0; i < s->n; i++)
            if (s->lens[i] == len && !memcmp(s->names[i], name, len)) return s->vals[i];
    }
    jv v;
    if (jinja_builtin_global(name, len, &v)) return v;
    return jv_undefined(name, len);
}

/* ---------------------------------------------------------------- output */

static void out_add(jctx *c, const jnode *at, const char *s, size_t n) {
    if (!n) return;
    if (n > c->out_max || c->out_len > c->out_max - n)
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "rendered output exceeds %zu bytes", c->out_max);
    if (c->out_len + n + 1 > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n + 1) cap *= 2;
        if (c->track) {
            unsigned char *nm = kiln_realloc(c->out_mask, cap);
            if (!nm) jctx_fail(c, at, KILN_ERR_NOMEM, "out of memory for the rendered output");
            c->out_mask = nm;
        }
        char *nb = kiln_realloc(c->out, cap);
        if (!nb) jctx_fail(c, at, KILN_ERR_NOMEM, "out of memory for the rendered output");
        c->out = nb;
        c->out_cap = cap;
    }
    if (c->track) shadow_of(c, c->out_mask + c->out_len, s, n);
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
}

static void out_value(jctx *c, const jnode *at, jv v) {
    if (v.type == JV_STRING) { out_add(c, at, v.u.s, v.len); return; }
    bool fresh = c->fresh;
    c->fresh = fresh || has_content(c, v);
    jbuf b;
    jbuf_init(&b, c, at);
    jv_to_str(&b, v);
    out_add(c, at, b.p, b.n);
    c->fresh = fresh;
}

/* ---------------------------------------------------------------- expressions */

static jv eval(jctx *c, const jnode *n, jscope *s);
typedef enum { SIG_NONE, SIG_BREAK, SIG_CONTINUE } signal_t;
static signal_t exec_body(jctx *c, const jnode *body, jscope *s);

static void step(jctx *c, const jnode *at) {
    if (++c->steps > JINJA_MAX_STEPS) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "evaluation step limit exceeded (%llu)", (unsigned long long)JINJA_MAX_STEPS);
}

static void eval_args(jctx *c, const jnode *n, jscope *s, jargs *a) {
    memset(a, 0, sizeof *a);
    a->n_pos = n->n_items;
    if (n->n_items) {
        a->pos = jctx_alloc(c, n, n->n_items * sizeof(jv));
        for (uint32_t i = 0; i < n->n_items; i++) a->pos[i] = eval(c, n->items[i], s);
    }
    a->n_kw = n->n_kw;
    if (n->n_kw) {
        a->kw_names = n->names;
        a->kw_lens = n->name_lens;
        a->kw_vals = jctx_alloc(c, n, n->n_kw * sizeof(jv));
        for (uint32_t i = 0; i < n->n_kw; i++) a->kw_vals[i] = eval(c, n->kw_vals[i], s);
    }
}

static jv arith(jctx *c, const jnode *at, jop op, jv a, jv b) {
    if (op == JOP_CONCAT) {
        jbuf buf;
        jbuf_init(&buf, c, at);
        jv_to_str(&buf, a);
        jv_to_str(&buf, b);
        return jbuf_value(&buf);
    }
    require_defined(c, at, a);
    require_defined(c, at, b);
    if (is_number(a) && is_number(b)) {
        bool ints = a.type != JV_FLOAT && b.type != JV_FLOAT;
        if (ints) {
            int64_t x = num_i(a), y = num_i(b), r;
            switch (op) {
            case JOP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; return jv_int(r);
            case JOP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; return jv_int(r);
            case JOP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; return jv_int(r);
            case JOP_DIV:
                if (!y) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "division by zero");
                return jv_float((double)x / (double)y);
            case JOP_FLOORDIV: case JOP_MOD: {
                if (!y) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto overflow;
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) { q--; m += y; }
                return jv_int(op == JOP_MOD ? m : q);
            }
            case JOP_POW: {
                if (y < 0) return jv_float(pow((double)x, (double)y));
                int64_t res = 1, base = x;
                while (y) {
                    if (y & 1) { if (__builtin_mul_overflow(res, base, &res)) goto overflow; }
                    y >>= 1;
                    if (y && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                return jv_int(res);
            }
            default: break;
            }
        } else {
            double x = num_f(a), y = num_f(b);
            switch (op) {
            case JOP_ADD: return jv_float(x + y);
            case JOP_SUB: return jv_float(x - y);
            case JOP_MUL: return jv_float(x * y);
            case JOP_DIV:
                if (y == 0) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "float division by zero");
                return jv_float(x / y);
            case JOP_FLOORDIV: case JOP_MOD: {
                if (y == 0) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "float modulo by zero");
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                if (op == JOP_MOD) return jv_float(m);
                double div = (x - m) / y, fl = floor(div);
                if (div - fl > 0.5) fl += 1.0;
                return jv_float(fl);
            }
            case JOP_POW: return jv_float(pow(x, y));
            default: break;
            }
        }
    }
    if (op == JOP_ADD && a.type == JV_STRING && b.type == JV_STRING) {
        if ((a.flags | b.flags) & JVF_SAFE) {
            /* Markup + str escapes the plain side and stays Markup */
            if (!(a.flags & JVF_SAFE)) a = jinja_html_escape(c, at, a);
            if (!(b.flags & JVF_SAFE)) b = jinja_html_escape(c, at, b);
            jbuf buf;
            jbuf_init(&buf, c, at);
            jbuf_add(&buf, a.u.s, a.len);
            jbuf_add(&buf, b.u.s, b.len);
            jv r = jbuf_value(&buf);
            r.flags = JVF_SAFE;
            return r;
        }
        jbuf buf;
        jbuf_init(&buf, c, at);
        jbuf_add(&buf, a.u.s, a.len);
        jbuf_add(&buf, b.u.s, b.len);
        return jbuf_value(&buf);
    }
    if (op == JOP_ADD && a.type == JV_LIST && b.type == JV_LIST && !((a.flags | b.flags) & JVF_GENERATOR) &&
        (a.flags & JVF_TUPLE) == (b.flags & JVF_TUPLE)) {
        jv r = jv_new_list(c, at, a.u.list->n + b.u.list->n);
        for (size_t i = 0; i < a.u.list->n; i++) jv_list_push(c, at, r, a.u.list->items[i]);
        for (size_t i = 0; i < b.u.list->n; i++) jv_list_push(c, at, r, b.u.list->items[i]);
        r.flags = a.flags & JVF_TUPLE;
        return r;
    }
    if (op == JOP_MUL && ((a.type == JV_STRING || a.type == JV_LIST) && (b.type == JV_INT || b.type == JV_BOOL))) {
        jv t = a; a = b; b = t;
    }
    if (op == JOP_MUL && (a.type == JV_INT || a.type == JV_BOOL) && (b.type == JV_STRING || (b.type == JV_LIST && !(b.flags & JVF_GENERATOR)))) {
        int64_t k = num_i(a);
        if (k < 0) k = 0;
        size_t unit = b.type == JV_STRING ? b.len : b.u.list->n;
        size_t total;
        if (!kiln_mul_size(unit, (size_t)k, &total) || total > c->out_max)
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "repetition result too large");
        if (b.type == JV_STRING) {
            jbuf buf;
            jbuf_init(&buf, c, at);
            for (int64_t i = 0; i < k; i++) jbuf_add(&buf, b.u.s, b.len);
            return jbuf_value(&buf);
        }
        jv r = jv_new_list(c, at, total);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < unit; j++) jv_list_push(c, at, r, b.u.list->items[j]);
        r.flags = b.flags & JVF_TUPLE;
        return r;
    }
    if (op == JOP_MOD && a.type == JV_STRING) return jinja_percent_format(c, at, a, b);
    {
        static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "unsupported operand types for %s: %s and %s", names[op], jv_type_name(a), jv_type_name(b));
    }
overflow:
    jctx_fail(c, at, KILN_ERR_INVALID_ARG, "integer overflow (64-bit integers)");
}

static bool contains(jctx *c, const jnode *at, jv needle, jv hay) {
    switch (hay.type) {
    case JV_UNDEFINED: return false;
    case JV_STRING:
        if (needle.type != JV_STRING) {
            require_defined(c, at, needle);
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "'in <string>' requires a string as left operand, not %s", jv_type_name(needle));
        }
        if (!needle.len) return true;
        return hay.len >= needle.len && memmem(hay.u.s, hay.len, needle.u.s, needle.len) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < hay.u.list->n; i++) if (jv_equal(hay.u.list->items[i], needle)) return true;
        return false;
    case JV_DICT: {
        jv dummy;
        return jv_dict_get(hay, needle, &dummy);
    }
    default:
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "argument of type %s is not iterable", jv_type_name(hay));
    }
}

static jv compare_op(jctx *c, const jnode *at, jop op, jv a, jv b) {
    switch (op) {
    case JOP_EQ: return jv_bool(jv_equal(a, b));
    case JOP_NE: return jv_bool(!jv_equal(a, b));
    case JOP_LT: return jv_bool(jv_compare(c, at, a, b) < 0);
    case JOP_LE: return jv_bool(jv_compare(c, at, a, b) <= 0);
    case JOP_GT: return jv_bool(jv_compare(c, at, a, b) > 0);
    case JOP_GE: return jv_bool(jv_compare(c, at, a, b) >= 0);
    case JOP_IN: return jv_bool(contains(c, at, a, b));
    case JOP_NOTIN: return jv_bool(!contains(c, at, a, b));
    default: KILN_ASSERT(0);
    }
    return jv_none();
}

/* Python slice semantics on n elements: fills the selected indices. */
static size_t slice_indices(jctx *c, const jnode *at, jv start, jv stop, jv stepv, size_t n, int64_t **out) {
    int64_t st = 1;
    if (stepv.type != JV_NONE && stepv.type != JV_UNDEFINED) {
        if (stepv.type != JV_INT && stepv.type != JV_BOOL) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "slice step must be an integer");
        st = num_i(stepv);
        if (st == 0) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "slice step cannot be zero");
    }
    int64_t len = (int64_t)n, lo, hi;
    jv bounds[2] = {start, stop};
    int64_t vals[2];
    for (int k = 0; k < 2; k++) {
        jv b = bounds[k];
        if (b.type == JV_NONE || b.type == JV_UNDEFINED) {
            vals[k] = k == 0 ? (st > 0 ? 0 : len - 1) : (st > 0 ? len : -1);
            continue;
        }
        if (b.type != JV_INT && b.type != JV_BOOL) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "slice indices must be integers or none");
        int64_t v = num_i(b);
        if (v < 0) {
            v = v < -len ? -1 : v + len;
            if (v < 0) v = st > 0 ? 0 : -1;
        } else if (v >= len) {
            v = st > 0 ? len : len - 1;
        }
        vals[k] = v;
    }
    lo = vals[0];
    hi = vals[1];
    size_t count = 0;
    if (st > 0 && hi > lo) count = (size_t)((hi - lo + st - 1) / st);
    else if (st < 0 && lo > hi) count = (size_t)((lo - hi + (-st) - 1) / (-st));
    *out = jctx_alloc(c, at, (count ? count : 1) * sizeof(int64_t));
    for (size_t i = 0; i < count; i++) (*out)[i] = lo + (int64_t)i * st;
    return count;
}

/* Byte offsets of every code point of s (plus the end). */
static size_t *utf8_offsets(jctx *c, const jnode *at, jv s, size_t *n_cp) {
    size_t n = jinja_utf8_count(s.u.s, s.len);
    size_t *offs = jctx_alloc(c, at, (n + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < s.len; i++)
        if (((unsigned char)s.u.s[i] & 0xC0) != 0x80) offs[k++] = i;
    offs[k] = s.len;
    *n_cp = n;
    return offs;
}

static jv eval_slice(jctx *c, const jnode *n, jscope *s) {
    jv obj = eval(c, n->a, s);
    jv start = n->b ? eval(c, n->b, s) : jv_none();
    jv stop = n->c ? eval(c, n->c, s) : jv_none();
    jv stp = n->d ? eval(c, n->d, s) : jv_none();
    require_defined(c, n, obj);
    int64_t *idx;
    if (obj.type == JV_STRING) {
        size_t n_cp;
        size_t *offs = utf8_offsets(c, n, obj, &n_cp);
        size_t count = slice_indices(c, n, start, stop, stp, n_cp, &idx);
        jbuf b;
        jbuf_init(&b, c, n);
        for (size_t i = 0; i < count; i++) {
            size_t a = offs[idx[i]], e = offs[idx[i] + 1];
            jbuf_add(&b, obj.u.s + a, e - a);
        }
        return jbuf_value(&b);
    }
    if (obj.type == JV_LIST && !(obj.flags & JVF_GENERATOR)) {
        size_t count = slice_indices(c, n, start, stop, stp, obj.u.list->n, &idx);
        jv r = jv_new_list(c, n, count);
        for (size_t i = 0; i < count; i++) jv_list_push(c, n, r, obj.u.list->items[idx[i]]);
        r.flags = obj.flags & JVF_TUPLE;
        return r;
    }
    return jv_undefined(NULL, 0);
}

/* A filter; its bytes are content when its input or arguments hold any. */
static jv apply_filter(jctx *c, const jnode *f, jv in, const jargs *a) {
    bool fresh = c->fresh;
    c->fresh = fresh || has_content(c, in) || args_have_content(c, a);
    jv r = jinja_apply_filter(c, f, f->op, in, a);
    c->fresh = fresh;
    return r;
}

/* A call; a builtin's bytes are content when the callee (a bound method) or the arguments hold any; a
 * macro's body is tracked as it runs. */
static jv call_fn(jctx *c, const jnode *at, jv fn, const jargs *a) {
    bool fresh = c->fresh;
    if (!(fn.type == JV_CALLABLE && fn.u.fn->kind == JFN_MACRO))
        c->fresh = fresh || has_content(c, fn) || args_have_content(c, a);
    jv r = jinja_call(c, at, fn, a);
    c->fresh = fresh;
    return r;
}

static bool plain_operand(jv v) {
    return (v.type == JV_STRING && !(v.flags & JVF_SAFE)) || v.type == JV_INT || v.type == JV_FLOAT ||
           v.type == JV_BOOL || v.type == JV_NONE || v.type == JV_UNDEFINED;
}

static jv eval(jctx *c, const jnode *n, jscope *s) {
    step(c, n);
    if (++c->depth > JINJA_MAX_EVAL_DEPTH) jctx_fail(c, n, KILN_ERR_INVALID_ARG, "evaluation nested too deeply");
    jv r;
    switch (n->kind) {
    case JN_CONST: r = n->value; break;
    case JN_NAME: r = scope_lookup(s, n->value.u.s, n->value.len); break;
    case JN_GETATTR: r = jinja_getattr(c, n, eval(c, n->a, s), n->value.u.s, n->value.len); break;
    case JN_GETITEM: {
        jv obj = eval(c, n->a, s);
        r = jinja_getitem(c, n, obj, eval(c, n->b, s));
        break;
    }
    case JN_SLICE: r = eval_slice(c, n, s); break;
    case JN_CALL: {
        jv fn = eval(c, n->a, s);
        jargs a;
        eval_args(c, n, s, &a);
        r = call_fn(c, n, fn, &a);
        break;
    }
    case JN_FILTER: {
        if (n->op == JINJA_UNKNOWN_BUILTIN)
            jctx_fail(c, n, KILN_ERR_UNSUPPORTED, "unsupported filter '%.*s'", (int)n->value.len, n->value.u.s);
        jv in = eval(c, n->a, s);
        jargs a;
        eval_args(c, n, s, &a);
        r = apply_filter(c, n, in, &a);
        break;
    }
    case JN_TEST: {
        if (n->op == JINJA_UNKNOWN_BUILTIN)
            jctx_fail(c, n, KILN_ERR_UNSUPPORTED, "unsupported test '%.*s'", (int)n->value.len, n->value.u.s);
        jv in = eval(c, n->a, s);
        jargs a;
        eval_args(c, n, s, &a);
        bool t = jinja_apply_test(c, n, n->op, in, &a);
        r = jv_bool(n->negated ? !t : t);
        break;
    }
    case JN_BINOP: {
        jv a = eval(c, n->a, s), b = eval(c, n->b, s);
        /* joining plain strings and numbers copies bytes (tracked as they go); %, Markup escaping and the
         * printing of containers make new bytes */
        bool fresh = c->fresh;
        if (n->op == JOP_MOD || !plain_operand(a) || !plain_operand(b))
            c->fresh = fresh || has_content(c, a) || has_content(c, b);
        r = arith(c, n, (jop)n->op, a, b);
        c->fresh = fresh;
        break;
    }
    case JN_COMPARE: {
        jv a = eval(c, n->a, s);
        r = compare_op(c, n, (jop)n->op, a, eval(c, n->b, s));
        break;
    }
    case JN_NOT: r = jv_bool(!jv_truthy(c, n, eval(c, n->a, s))); break;
    case JN_NEG: case JN_POS: {
        jv a = eval(c, n->a, s);
        require_defined(c, n, a);
        if (!is_number(a)) jctx_fail(c, n, KILN_ERR_INVALID_ARG, "bad operand type for unary %c: %s", n->kind == JN_NEG ? '-' : '+', jv_type_name(a));
        if (n->kind == JN_POS) r = a.type == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.type == JV_FLOAT) r = jv_float(-a.u.f);
        else {
            if (num_i(a) == INT64_MIN) jctx_fail(c, n, KILN_ERR_INVALID_ARG, "integer overflow");
            r = jv_int(-num_i(a));
        }
        break;
    }
    case JN_AND: {
        jv a = eval(c, n->a, s);
        r = jv_truthy(c, n, a) ? eval(c, n->b, s) : a;
        break;
    }
    case JN_OR: {
        jv a = eval(c, n->a, s);
        r = jv_truthy(c, n, a) ? a : eval(c, n->b, s);
        break;
    }
    case JN_COND:
        if (jv_truthy(c, n, eval(c, n->b, s))) r = eval(c, n->a, s);
        else r = n->c ? eval(c, n->c, s) : jv_undefined(NULL, 0);
        break;
    case JN_LIST: case JN_TUPLE: {
        r = jv_new_list(c, n, n->n_items);
        for (uint32_t i = 0; i < n->n_items; i++) jv_list_push(c, n, r, eval(c, n->items[i], s));
        if (n->kind == JN_TUPLE) r.flags = JVF_TUPLE;
        break;
    }
    case JN_DICT: {
        r = jv_new_dict(c, n, n->n_items);
        for (uint32_t i = 0; i < n->n_items; i++) {
            jv k = eval(c, n->items[i], s);
            if (k.type == JV_LIST && !(k.flags & JVF_TUPLE)) jctx_fail(c, n, KILN_ERR_INVALID_ARG, "unhashable dict key: list");
            if (k.type == JV_DICT || k.type == JV_UNDEFINED) jctx_fail(c, n, KILN_ERR_INVALID_ARG, "unhashable dict key: %s", jv_type_name(k));
            jv_dict_set(c, n, r, k, eval(c, n->kw_vals[i], s));
        }
        break;
    }
    default:
        jctx_fail(c, n, KILN_ERR_INTERNAL, "unexpected node kind %d in an expression", n->kind);
    }
    c->depth--;
    return r;
}

/* ---------------------------------------------------------------- statements */

static void assign(jctx *c, const jnode *target, jscope *s, jv val) {
    if (target->kind == JN_NAME) {
        scope_set(c, target, s, target->value.u.s, target->value.len, val);
    } else if (target->kind == JN_NS_TARGET) {
        jv ns = eval(c, target->a, s);
        if (ns.type != JV_NAMESPACE)
            jctx_fail(c, target, KILN_ERR_INVALID_ARG, "cannot assign attribute '%.*s' on a %s (only namespace() objects)",
                      (int)target->value.len, target->value.u.s, jv_type_name(ns));
        jv_dict_set(c, target, (jv){.type = JV_DICT, .u.dict = ns.u.dict}, target->value, val);
    } else {
        /* tuple unpacking */
        if (val.type == JV_STRING || val.type == JV_DICT) val = jinja_iter_list(c, target, val);
        if (val.type != JV_LIST) jctx_fail(c, target, KILN_ERR_INVALID_ARG, "cannot unpack a %s", jv_type_name(val));
        if (val.u.list->n != target->n_items)
            jctx_fail(c, target, KILN_ERR_INVALID_ARG, "cannot unpack %zu values into %u names", val.u.list->n, target->n_items);
        for (uint32_t i = 0; i < target->n_items; i++) assign(c, target->items[i], s, val.u.list->items[i]);
    }
}

static void render_into(jctx *c, const jnode *body, jscope *s, jv *out_str) {
    size_t mark = c->out_len;
    exec_body(c, body, s);
    *out_str = c->out ? jv_str_copy(c, body, c->out + mark, c->out_len - mark) : jv_str("", 0);
    c->out_len = mark;
}

/* Applies a filter chain whose innermost input is the placeholder (NULL) to v. */
static jv apply_chain(jctx *c, const jnode *f, jscope *s, jv v) {
    if (f->a) v = apply_chain(c, f->a, s, v);
    if (f->op == JINJA_UNKNOWN_BUILTIN)
        jctx_fail(c, f, KILN_ERR_UNSUPPORTED, "unsupported filter '%.*s'", (int)f->value.len, f->value.u.s);
    jargs a;
    eval_args(c, f, s, &a);
    return apply_filter(c, f, v, &a);
}

static signal_t exec_for(jctx *c, const jnode *n, jscope *s) {
    jv seq = jinja_iter_list(c, n->b, eval(c, n->b, s));
    if (n->c) {
        jv kept = jv_new_list(c, n, seq.u.list->n);
        jscope *fs = scope_new(c, s);
        for (size_t i = 0; i < seq.u.list->n; i++) {
            fs->n = 0;
            assign(c, n->a, fs, seq.u.list->items[i]);
            if (jv_truthy(c, n->c, eval(c, n->c, fs))) jv_list_push(c, n, kept, seq.u.list->items[i]);
        }
        seq = kept;
    }
    size_t count = seq.u.list->n;
    jv_loop *lp = jctx_alloc(c, n, sizeof *lp);
    lp->items = seq;
    lp->length = (int64_t)count;
    lp->depth = 1;
    jv loopv = {.type = JV_LOOP};
    loopv.u.loop = lp;
    /* one scope for all iterations, emptied before each (nothing can keep a reference to a scope) */
    jscope *is = scope_new(c, s);
    for (size_t i = 0; i < count; i++) {
        step(c, n);
        is->n = 0;
        lp->index0 = (int64_t)i;
        assign(c, n->a, is, seq.u.list->items[i]);
        scope_set(c, n, is, "loop", 4, loopv);
        signal_t sig = exec_body(c, n->d, is);
        if (sig == SIG_BREAK) break;
    }
    if (!count && n->e) return exec_body(c, n->e, s);
    return SIG_NONE;
}

static signal_t exec_stmt(jctx *c, const jnode *n, jscope *s) {
    step(c, n);
    switch (n->kind) {
    case JN_TEXT: out_add(c, n, n->value.u.s, n->value.len); return SIG_NONE;
    case JN_OUTPUT: out_value(c, n, eval(c, n->a, s)); return SIG_NONE;
    case JN_IF: {
        const jnode *cur = n;
        while (cur) {
            if (cur->kind == JN_IF) {
                if (jv_truthy(c, cur, eval(c, cur->a, s))) return exec_body(c, cur->b, s);
                cur = cur->c;
            } else {
                return exec_body(c, cur, s);
            }
        }
        return SIG_NONE;
    }
    case JN_FOR: return exec_for(c, n, s);
    case JN_SET: assign(c, n->a, s, eval(c, n->b, s)); return SIG_NONE;
    case JN_SET_BLOCK: {
        jv v;
        render_into(c, n->d, s, &v);
        if (n->e) v = apply_chain(c, n->e, s, v);
        assign(c, n->a, s, v);
        return SIG_NONE;
    }
    case JN_CALL_BLOCK: {
        jv_callable *caller = jctx_alloc(c, n, sizeof *caller);
        caller->kind = JFN_MACRO;
        caller->macro = n->b;
        caller->closure = s;
        const jnode *call = n->a;
        jv fn = eval(c, call->a, s);
        jargs a;
        eval_args(c, call, s, &a);
        const char **names = jctx_alloc(c, n, (a.n_kw + 1) * sizeof(char *));
        uint32_t *lens = jctx_alloc(c, n, (a.n_kw + 1) * sizeof(uint32_t));
        jv *kv = jctx_alloc(c, n, (a.n_kw + 1) * sizeof(jv));
        for (size_t k = 0; k < a.n_kw; k++) { names[k] = a.kw_names[k]; lens[k] = a.kw_lens[k]; kv[k] = a.kw_vals[k]; }
        names[a.n_kw] = "caller";
        lens[a.n_kw] = 6;
        kv[a.n_kw] = (jv){.type = JV_CALLABLE, .u.fn = caller};
        a.kw_names = names;
        a.kw_lens = lens;
        a.kw_vals = kv;
        a.n_kw++;
        out_value(c, n, call_fn(c, call, fn, &a));
        return SIG_NONE;
    }
    case JN_MACRO: {
        jv_callable *fn = jctx_alloc(c, n, sizeof *fn);
        fn->kind = JFN_MACRO;
        fn->macro = n;
        jv v = {.type = JV_CALLABLE};
        v.u.fn = fn;
        scope_set(c, n, s, n->value.u.s, n->value.len, v);
        return SIG_NONE;
    }
    case JN_BREAK: return SIG_BREAK;
    case JN_CONTINUE: return SIG_CONTINUE;
    case JN_FILTER_BLOCK: {
        jv v;
        render_into(c, n->d, s, &v);
        out_value(c, n, apply_chain(c, n->a, s, v));
        return SIG_NONE;
    }
    case JN_GENERATION: return exec_body(c, n->d, s);
    case JN_WITH: {
        jv *vals = jctx_alloc(c, n, (n->n_kw ? n->n_kw : 1) * sizeof(jv));
        for (uint32_t i = 0; i < n->n_kw; i++) vals[i] = eval(c, n->kw_vals[i], s);
        jscope *ws = scope_new(c, s);
        for (uint32_t i = 0; i < n->n_kw; i++) scope_set(c, n, ws, n->names[i], n->name_lens[i], vals[i]);
        return exec_body(c, n->d, ws);
    }
    case JN_BODY: return exec_body(c, n, s);
    default:
        jctx_fail(c, n, KILN_ERR_INTERNAL, "unexpected node kind %d as a statement", n->kind);
    }
}

static signal_t exec_body(jctx *c, const jnode *body, jscope *s) {
    if (++c->depth > JINJA_MAX_EVAL_DEPTH) jctx_fail(c, body, KILN_ERR_INVALID_ARG, "evaluation nested too deeply");
    signal_t sig = SIG_NONE;
    for (uint32_t i = 0; i < body->n_items && sig == SIG_NONE; i++) sig = exec_stmt(c, body->items[i], s);
    c->depth--;
    return sig;
}

jv jinja_call_macro(jctx *c, const jnode *at, const jv_callable *fn, const jargs *a) {
    const jnode *m = fn->macro;
    if (c->macro_depth >= JINJA_MAX_MACRO_DEPTH) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "macro calls nested too deeply (limit %d)", JINJA_MAX_MACRO_DEPTH);
    jscope *ms = scope_new(c, fn->closure ? fn->closure : c->root);
    uint32_t np = m->n_kw;
    if (a->n_pos > np && !(m->op & JMACRO_VARARGS))
        jctx_fail(c, at, KILN_ERR_INVALID_ARG, "macro '%.*s' takes at most %u arguments (%zu given)", (int)m->value.len, m->value.u.s, np, a->n_pos);
    bool *have = jctx_alloc(c, at, (np ? np : 1) * sizeof(bool));
    jv *vals = jctx_alloc(c, at, (np ? np : 1) * sizeof(jv));
    jv varargs = jv_new_list(c, at, 0), kwargs = jv_new_dict(c, at, 0), caller = jv_undefined("caller", 6);
    varargs.flags = JVF_TUPLE;
    for (size_t i = 0; i < a->n_pos; i++) {
        if (i < np) { vals[i] = a->pos[i]; have[i] = true; }
        else jv_list_push(c, at, varargs, a->pos[i]);
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        uint32_t i;
        for (i = 0; i < np; i++)
            if (m->name_lens[i] == a->kw_lens[k] && !memcmp(m->names[i], a->kw_names[k], a->kw_lens[k])) break;
        if (i == np) {
            if ((m->op & JMACRO_CALLER) && a->kw_lens[k] == 6 && !memcmp(a->kw_names[k], "caller", 6)) { caller = a->kw_vals[k]; continue; }
            if (m->op & JMACRO_KWARGS) { jv_dict_set(c, at, kwargs, jv_str(a->kw_names[k], a->kw_lens[k]), a->kw_vals[k]); continue; }
            jctx_fail(c, at, KILN_ERR_INVALID_ARG, "macro '%.*s' has no parameter '%.*s'", (int)m->value.len, m->value.u.s, (int)a->kw_lens[k], a->kw_names[k]);
        }
        if (have[i]) jctx_fail(c, at, KILN_ERR_INVALID_ARG, "macro '%.*s' got parameter '%.*s' twice", (int)m->value.len, m->value.u.s, (int)a->kw_lens[k], a->kw_names[k]);
        vals[i] = a->kw_vals[k];
        have[i] = true;
    }
    for (uint32_t i = 0; i < np; i++) {
        jv v;
        if (have[i]) v = vals[i];
        else if (m->items[i]) v = eval(c, m->items[i], ms);
        else v = jv_undefined(m->names[i], m->name_lens[i]);
        scope_set(c, at, ms, m->names[i], m->name_lens[i], v);
    }
    if (m->op & JMACRO_VARARGS) scope_set(c, at, ms, "varargs", 7, varargs);
    if (m->op & JMACRO_KWARGS) scope_set(c, at, ms, "kwargs", 6, kwargs);
    if (m->op & JMACRO_CALLER) scope_set(c, at, ms, "caller", 6, caller);
    jv out;
    c->macro_depth++;
    render_into(c, m->d, ms, &out);
    c->macro_depth--;
    return out;
}

/* ---------------------------------------------------------------- entry */

kiln_status jinja_render(const jinja_template *t, const json_t *vars, const jinja_render_opts *opts,
                         char **out, size_t *out_len) {
    KILN_ASSERT(t && out);
    *out = NULL;
    if (out_len) *out_len = 0;
    if (vars && !json_is_object(vars))
        return kiln_fail(KILN_ERR_INVALID_ARG, "chat template %s: the variables must be a JSON object", t->name);
    jctx *c = kiln_calloc(1, sizeof *c);
    if (!c) return kiln_fail(KILN_ERR_NOMEM, "chat template %s: out of memory", t->name);
    c->arena.limit = JINJA_RENDER_ARENA_LIMIT;
    c->out_max = opts && opts->max_output ? opts->max_output : JINJA_DEFAULT_MAX_OUTPUT;
    c->now = opts ? opts->now : 0;
    c->tmpl_name = t->name;
    c->track = c->arena.shadow = opts && opts->content_mask;
    c->tmpl_arena = &t->arena;
    if (c->track) *opts->content_mask = NULL;
    if (setjmp(c->fail)) {
        kiln_status st = c->fail_status;
        jinja_arena_free(&c->arena);
        kiln_free(c->out);
        kiln_free(c->out_mask);
        kiln_free(c);
        return st;
    }
    c->globals = scope_new(c, NULL);
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v) {
            scope_set(c, NULL, c->globals, k, strlen(k), var_from_json(c, k, v));
        }
    }
    c->root = scope_new(c, c->globals);
    exec_body(c, t->root, c->root);
    if (!c->out) {
        c->out = kiln_malloc(1);
        if (!c->out) jctx_fail(c, NULL, KILN_ERR_NOMEM, "out of memory");
    }
    if (c->track && !c->out_mask) {
        c->out_mask = kiln_malloc(1);
        if (!c->out_mask) jctx_fail(c, NULL, KILN_ERR_NOMEM, "out of memory");
    }
    c->out[c->out_len] = 0;
    if (c->track) *opts->content_mask = c->out_mask;
    *out = c->out;
    if (out_len) *out_len = c->out_len;
    jinja_arena_free(&c->arena);
    kiln_free(c);
    return KILN_OK;
}
