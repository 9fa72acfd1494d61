/*
 * jinja_parse.c — the lexer and parser of the Jinja2 subset (see jinja.h).
 *
 * The lexer follows jinja2's rules as Hugging Face configures them: newlines normalized to "\n", one
 * trailing newline dropped (keep_trailing_newline=False), trim_blocks (a block or comment tag eats the
 * newline after it), lstrip_blocks (whitespace between a line start and a block or comment tag is
 * dropped), the `-`/`+` modifiers, and tag ends recognized only outside brackets. The parser builds the
 * AST of jinja.h in the template's arena with jinja2's operator precedence. Every error longjmps back
 * to jinja_parse with a message naming the construct and its line:column.
 */
#include "chat/jinja.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

#define JINJA_MAX_NESTING 200               /* expression and block nesting */
#define JINJA_PARSE_ARENA_LIMIT (256u << 20)

typedef enum ttype {
    T_EOF, T_DATA, T_BLOCK_BEGIN, T_BLOCK_END, T_VAR_BEGIN, T_VAR_END, T_NAME, T_STRING, T_INT, T_FLOAT,
    T_OP,
} ttype;

typedef struct tok {
    uint8_t type;
    uint32_t off;        /* byte offset in the normalized source */
    const char *s;       /* text (names, ops, data) or the decoded string */
    uint32_t len;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    jinja_template *tmpl;
    jinja_arena *arena;
    const char *src;     /* normalized source (in the arena) */
    size_t len;
    const char *name;
    uint32_t *line_starts;
    size_t n_lines;
    tok *toks;
    size_t n_toks, cap_toks, pos;
    int depth;
    int loop_depth;
    jmp_buf fail;
    kiln_status status;
} parser;

/* ---------------------------------------------------------------- errors and positions */

static void pos_of(const parser *p, uint32_t off, uint32_t *line, uint32_t *col) {
    size_t lo = 0, hi = p->n_lines;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (p->line_starts[mid] <= off) lo = mid;
        else hi = mid;
    }
    *line = (uint32_t)lo + 1;
    /* column in code points */
    uint32_t col_n = 1;
    for (uint32_t k = p->line_starts[lo]; k < off && k < p->len; k++)
        if (((unsigned char)p->src[k] & 0xC0) != 0x80) col_n++;
    *col = col_n;
}

__attribute__((noreturn, format(printf, 3, 4)))
static void fail_at(parser *p, uint32_t off, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint32_t line, col;
    pos_of(p, off, &line, &col);
    p->status = kiln_fail(KILN_ERR_UNSUPPORTED, "chat template %s:%u:%u: %s", p->name, line, col, msg);
    longjmp(p->fail, 1);
}

static void *palloc(parser *p, size_t n) {
    void *r = jinja_arena_alloc(p->arena, n);
    if (!r) {
        p->status = kiln_fail(KILN_ERR_NOMEM, "chat template %s: out of memory while parsing", p->name);
        longjmp(p->fail, 1);
    }
    return r;
}

/* ---------------------------------------------------------------- lexer */

static void push_tok(parser *p, ttype type, uint32_t off, const char *s, size_t len) {
    if (p->n_toks == p->cap_toks) {
        size_t cap = p->cap_toks ? p->cap_toks * 2 : 256;
        tok *nt = palloc(p, cap * sizeof(tok));
        if (p->n_toks) memcpy(nt, p->toks, p->n_toks * sizeof(tok));
        p->toks = nt;
        p->cap_toks = cap;
    }
    if (len > UINT32_MAX) fail_at(p, off, "token too long");
    tok *t = &p->toks[p->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->off = off;
    t->s = s;
    t->len = (uint32_t)len;
}

static bool is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static bool is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_name_char(char ch) { return is_name_start(ch) || is_digit(ch); }

static void utf8_put(char **w, uint32_t cp) {
    char *o = *w;
    if (cp < 0x80) *o++ = (char)cp;
    else if (cp < 0x800) { *o++ = (char)(0xC0 | (cp >> 6)); *o++ = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | (cp >> 12)); *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | (cp >> 18)); *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
    }
    *w = o;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Lexes a string literal starting at the quote at *i (Python escape rules). */
static void lex_string(parser *p, size_t *i) {
    const char *s = p->src;
    size_t start = *i;
    char q = s[start];
    size_t k = start + 1;
    while (k < p->len && s[k] != q) {
        if (s[k] == '\\' && k + 1 < p->len) k++;
        k++;
    }
    if (k >= p->len) fail_at(p, (uint32_t)start, "unterminated string literal");
    /* decoded length never exceeds the raw length (+ \U escapes expand at most to 4 bytes from 10) */
    char *out = palloc(p, k - start + 1);
    char *w = out;
    for (size_t r = start + 1; r < k; r++) {
        char ch = s[r];
        if (ch != '\\') { *w++ = ch; continue; }
        char e = s[++r];
        switch (e) {
        case '\n': break;
        case '\\': *w++ = '\\'; break;
        case '\'': *w++ = '\''; break;
        case '"': *w++ = '"'; break;
        case 'a': *w++ = '\a'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'v': *w++ = '\v'; break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < nd; d++) {
                int h = r + 1 + (size_t)d < k ? hexval(s[r + 1 + d]) : -1;
                if (h < 0) fail_at(p, (uint32_t)r, "malformed \\%c escape in string literal", e);
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF) fail_at(p, (uint32_t)r, "\\U escape out of range");
            r += (size_t)nd;
            utf8_put(&w, cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = 0;
                int d = 0;
                while (d < 3 && r < k && s[r] >= '0' && s[r] <= '7') { cp = cp * 8 + (uint32_t)(s[r] - '0'); r++; d++; }
                r--;
                utf8_put(&w, cp);
            } else {
                *w++ = '\\';
                *w++ = e;
            }
        }
    }
    push_tok(p, T_STRING, (uint32_t)start, out, (size_t)(w - out));
    *i = k + 1;
}

static void lex_number(parser *p, size_t *i, bool after_dot) {
    const char *s = p->src;
    size_t start = *i, k = start;
    char buf[128];
    size_t bn = 0;
    bool is_float = false;
    int base = 10;
    if (s[k] == '0' && k + 1 < p->len && strchr("xXoObB", s[k + 1]) && !after_dot) {
        base = (s[k + 1] == 'x' || s[k + 1] == 'X') ? 16 : (s[k + 1] == 'o' || s[k + 1] == 'O') ? 8 : 2;
        k += 2;
        while (k < p->len && (hexval(s[k]) >= 0 || s[k] == '_')) {
            if (s[k] != '_' && bn < sizeof buf - 1) buf[bn++] = s[k];
            k++;
        }
    } else {
        while (k < p->len && (is_digit(s[k]) || (s[k] == '_' && k + 1 < p->len && is_digit(s[k + 1])))) {
            if (s[k] != '_' && bn < sizeof buf - 1) buf[bn++] = s[k];
            k++;
        }
        if (!after_dot && k + 1 < p->len && s[k] == '.' && is_digit(s[k + 1])) {
            is_float = true;
            buf[bn < sizeof buf - 1 ? bn++ : bn] = '.';
            k++;
            while (k < p->len && (is_digit(s[k]) || (s[k] == '_' && k + 1 < p->len && is_digit(s[k + 1])))) {
                if (s[k] != '_' && bn < sizeof buf - 1) buf[bn++] = s[k];
                k++;
            }
        }
        if (!after_dot && k < p->len && (s[k] == 'e' || s[k] == 'E')) {
            size_t m = k + 1;
            if (m < p->len && (s[m] == '+' || s[m] == '-')) m++;
            if (m < p->len && is_digit(s[m])) {
                is_float = true;
                for (size_t q = k; q < m && bn < sizeof buf - 1; q++) buf[bn++] = s[q];
                k = m;
                while (k < p->len && (is_digit(s[k]) || s[k] == '_')) {
                    if (s[k] != '_' && bn < sizeof buf - 1) buf[bn++] = s[k];
                    k++;
                }
            }
        }
    }
    if (bn >= sizeof buf - 1) fail_at(p, (uint32_t)start, "number literal too long");
    if (bn == 0) fail_at(p, (uint32_t)start, "malformed number literal");
    buf[bn] = 0;
    push_tok(p, is_float ? T_FLOAT : T_INT, (uint32_t)start, s + start, k - start);
    tok *t = &p->toks[p->n_toks - 1];
    errno = 0;
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, base);
        if (errno || *end || v > INT64_MAX) fail_at(p, (uint32_t)start, "integer literal out of range (64-bit)");
        t->i = (int64_t)v;
    }
    *i = k;
}

static const char *const OPS[] = {
    "//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", ".", ",", ":", "|",
    "(", ")", "[", "]", "{", "}", ";",
};

/* Lexes the inside of a {{ }} or {% %} tag starting at *i; returns after the end marker. */
static void lex_tag(parser *p, size_t *i, bool is_block, uint32_t tag_off, bool *line_starting) {
    const char *s = p->src;
    size_t k = *i;
    char stack[JINJA_MAX_NESTING];
    int sp = 0;
    for (;;) {
        while (k < p->len && is_space(s[k])) k++;
        if (k >= p->len) fail_at(p, tag_off, "unclosed %s tag (missing '%s')", is_block ? "block" : "variable", is_block ? "%}" : "}}");
        const char *end = is_block ? "%}" : "}}";
        if (sp == 0) {
            size_t m = k;
            char mod = 0;
            if ((s[m] == '-' || (s[m] == '+' && is_block)) && m + 2 < p->len && !strncmp(s + m + 1, end, 2)) mod = s[m++];
            if (m + 1 < p->len && !strncmp(s + m, end, 2)) {
                push_tok(p, is_block ? T_BLOCK_END : T_VAR_END, (uint32_t)k, s + k, m + 2 - k);
                k = m + 2;
                if (mod == '-') {
                    while (k < p->len && is_space(s[k])) k++;
                } else if (mod != '+' && is_block && k < p->len && s[k] == '\n') {
                    k++;
                }
                *line_starting = k > 0 && s[k - 1] == '\n';
                *i = k;
                return;
            }
        }
        char ch = s[k];
        if (ch == '\'' || ch == '"') {
            lex_string(p, &k);
        } else if (is_digit(ch)) {
            bool after_dot = p->n_toks && p->toks[p->n_toks - 1].type == T_OP && p->toks[p->n_toks - 1].len == 1 &&
                             p->toks[p->n_toks - 1].s[0] == '.' && k > 0 && s[k - 1] == '.';
            lex_number(p, &k, after_dot);
        } else if (is_name_start(ch)) {
            size_t st = k;
            while (k < p->len && is_name_char(s[k])) k++;
            push_tok(p, T_NAME, (uint32_t)st, s + st, k - st);
        } else {
            size_t n_ops = sizeof OPS / sizeof OPS[0], hit = n_ops;
            for (size_t o = 0; o < n_ops; o++) {
                size_t ol = strlen(OPS[o]);
                if (k + ol <= p->len && !strncmp(s + k, OPS[o], ol)) { hit = o; break; }
            }
            if (hit == n_ops) fail_at(p, (uint32_t)k, "unexpected character '%c' in tag", ch);
            size_t ol = strlen(OPS[hit]);
            if (ol == 1 && (ch == '(' || ch == '[' || ch == '{')) {
                if (sp >= JINJA_MAX_NESTING) fail_at(p, (uint32_t)k, "brackets nested too deeply");
                stack[sp++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
            } else if (ol == 1 && (ch == ')' || ch == ']' || ch == '}')) {
                if (sp == 0 || stack[sp - 1] != ch) fail_at(p, (uint32_t)k, "unbalanced '%c'", ch);
                sp--;
            }
            push_tok(p, T_OP, (uint32_t)k, s + k, ol);
            k += ol;
        }
    }
}

/* {% raw %}...{% endraw %} at tag (body: after "{%" and its modifier): the content becomes text. jinja2's
 * rules: no trim_blocks after `raw %}`; `-` strips on either side; the endraw tag is lstripped and eats
 * the newline after it. Returns false when the tag is not `raw`. */
static bool lex_raw(parser *p, size_t tag, size_t body, size_t *i, bool *line_starting) {
    const char *s = p->src;
    size_t k = body;
    while (k < p->len && is_space(s[k])) k++;
    if (!(k + 3 <= p->len && !strncmp(s + k, "raw", 3) && (k + 3 == p->len || !is_name_char(s[k + 3])))) return false;
    k += 3;
    while (k < p->len && is_space(s[k])) k++;
    bool strip_after = false;
    if (k < p->len && s[k] == '-') { strip_after = true; k++; }
    if (!(k + 1 < p->len && s[k] == '%' && s[k + 1] == '}')) fail_at(p, (uint32_t)tag, "malformed '{%% raw %%}' tag");
    k += 2;
    if (strip_after) while (k < p->len && is_space(s[k])) k++;
    size_t content = k;
    for (size_t e = content; e + 1 < p->len; e++) {
        if (s[e] != '{' || s[e + 1] != '%') continue;
        size_t q = e + 2;
        char mod = (q < p->len && (s[q] == '-' || s[q] == '+')) ? s[q++] : 0;
        while (q < p->len && is_space(s[q])) q++;
        if (!(q + 6 <= p->len && !strncmp(s + q, "endraw", 6))) continue;
        q += 6;
        while (q < p->len && is_space(s[q])) q++;
        char emod = (q < p->len && (s[q] == '-' || s[q] == '+')) ? s[q++] : 0;
        if (!(q + 1 < p->len && s[q] == '%' && s[q + 1] == '}')) continue;
        q += 2;
        size_t text_end = e;
        if (mod == '-') {
            while (text_end > content && is_space(s[text_end - 1])) text_end--;
        } else if (mod != '+') {
            size_t l_pos = text_end;
            while (l_pos > content && s[l_pos - 1] != '\n') l_pos--;
            bool all_ws = l_pos < text_end;
            for (size_t w = l_pos; w < text_end; w++) if (!is_space(s[w])) { all_ws = false; break; }
            if (all_ws && (l_pos > content || (content > 0 && s[content - 1] == '\n'))) text_end = l_pos;
        }
        if (text_end > content) push_tok(p, T_DATA, (uint32_t)content, s + content, text_end - content);
        if (emod == '-') while (q < p->len && is_space(s[q])) q++;
        else if (emod != '+' && q < p->len && s[q] == '\n') q++;
        *line_starting = q > 0 && s[q - 1] == '\n';
        *i = q;
        return true;
    }
    fail_at(p, (uint32_t)tag, "missing '{%% endraw %%}' for the '{%% raw %%}' here");
}

static void lex(parser *p) {
    const char *s = p->src;
    size_t i = 0;
    bool line_starting = true;
    while (i < p->len) {
        /* find the next tag opener */
        size_t k = i;
        int kind = 0; /* 1 var, 2 block, 3 comment */
        for (; k + 1 < p->len; k++) {
            if (s[k] != '{') continue;
            char n = s[k + 1];
            if (n == '{') { kind = 1; break; }
            if (n == '%') { kind = 2; break; }
            if (n == '#') { kind = 3; break; }
        }
        if (!kind) {
            push_tok(p, T_DATA, (uint32_t)i, s + i, p->len - i);
            break;
        }
        size_t text_end = k;
        char mod = (k + 2 < p->len && (s[k + 2] == '-' || s[k + 2] == '+')) ? s[k + 2] : 0;
        if (mod == '-') {
            while (text_end > i && is_space(s[text_end - 1])) text_end--;
        } else if (mod != '+' && kind != 1) {
            /* lstrip_blocks: drop spaces between the line start and the tag */
            size_t l_pos = text_end;
            while (l_pos > i && s[l_pos - 1] != '\n') l_pos--;
            bool at_line_start = (l_pos > i) || line_starting;
            bool all_ws = l_pos < text_end;
            for (size_t q = l_pos; q < text_end; q++) if (!is_space(s[q])) { all_ws = false; break; }
            if (at_line_start && all_ws) text_end = l_pos;
        }
        if (text_end > i) push_tok(p, T_DATA, (uint32_t)i, s + i, text_end - i);
        size_t body = k + 2 + (mod ? 1 : 0);
        if (kind == 3) {
            size_t e = body;
            while (e + 1 < p->len && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= p->len) fail_at(p, (uint32_t)k, "unclosed comment (missing '#}')");
            size_t after = e + 2;
            if (e > body && s[e - 1] == '-') {
                while (after < p->len && is_space(s[after])) after++;
            } else if (!(e > body && s[e - 1] == '+') && after < p->len && s[after] == '\n') {
                after++;
            }
            line_starting = after > 0 && s[after - 1] == '\n';
            i = after;
            continue;
        }
        if (kind == 2 && lex_raw(p, k, body, &i, &line_starting)) continue;
        push_tok(p, kind == 1 ? T_VAR_BEGIN : T_BLOCK_BEGIN, (uint32_t)k, s + k, body - k);
        i = body;
        lex_tag(p, &i, kind == 2, (uint32_t)k, &line_starting);
    }
    push_tok(p, T_EOF, (uint32_t)p->len, s + p->len, 0);
}

/* ---------------------------------------------------------------- parser helpers */

static tok *cur(parser *p) { return &p->toks[p->pos]; }
static tok *peek(parser *p, size_t ahead) {
    size_t k = p->pos + ahead;
    return &p->toks[k < p->n_toks ? k : p->n_toks - 1];
}
static bool tok_is(const tok *t, ttype type, const char *text) {
    return t->type == type && (!text || (t->len == strlen(text) && !memcmp(t->s, text, t->len)));
}
static bool at_op(parser *p, const char *op) { return tok_is(cur(p), T_OP, op); }
static bool at_name(parser *p, const char *nm) { return tok_is(cur(p), T_NAME, nm); }
static void advance(parser *p) { if (p->pos + 1 < p->n_toks) p->pos++; }

static const char *tok_desc(const tok *t, char *buf, size_t cap) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template text";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_STRING: return "a string";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s); return buf;
    }
}

static void expect_op(parser *p, const char *op) {
    if (!at_op(p, op)) {
        char b[64];
        fail_at(p, cur(p)->off, "expected '%s', got %s", op, tok_desc(cur(p), b, sizeof b));
    }
    advance(p);
}

static void expect_type(parser *p, ttype type, const char *what) {
    if (cur(p)->type != type) {
        char b[64];
        fail_at(p, cur(p)->off, "expected %s, got %s", what, tok_desc(cur(p), b, sizeof b));
    }
    advance(p);
}

static jnode *new_node(parser *p, jnode_kind kind, uint32_t off) {
    jnode *n = palloc(p, sizeof *n);
    n->kind = (uint8_t)kind;
    pos_of(p, off, &n->line, &n->col);
    return n;
}

static jv name_value(const tok *t) { return jv_str(t->s, t->len); }

/* A growable array of node pointers in the arena. */
typedef struct nodevec { jnode **v; uint32_t n, cap; } nodevec;
static void nv_push(parser *p, nodevec *nv, jnode *n) {
    if (nv->n == nv->cap) {
        uint32_t cap = nv->cap ? nv->cap * 2 : 8;
        jnode **nn = palloc(p, cap * sizeof(jnode *));
        if (nv->n) memcpy(nn, nv->v, nv->n * sizeof(jnode *));
        nv->v = nn;
        nv->cap = cap;
    }
    nv->v[nv->n++] = n;
}

static void enter(parser *p) {
    if (++p->depth > JINJA_MAX_NESTING) fail_at(p, cur(p)->off, "template nested too deeply (limit %d)", JINJA_MAX_NESTING);
}
static void leave(parser *p) { p->depth--; }

/* ---------------------------------------------------------------- expressions */

static jnode *parse_expression(parser *p, bool with_condexpr);
static jnode *parse_tuple(parser *p, bool with_condexpr, bool explicit_parens);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *node);

/* (args) of a call, filter or test: positional then keyword (name=value). */
static void parse_call_args(parser *p, jnode *call) {
    expect_op(p, "(");
    nodevec pos = {0}, kwv = {0};
    const char *kwn[64];
    uint32_t kwl[64];
    uint32_t n_kw = 0;
    while (!at_op(p, ")")) {
        if (pos.n + n_kw) expect_op(p, ",");
        if (at_op(p, ")")) break;
        if (at_op(p, "*") || at_op(p, "**")) fail_at(p, cur(p)->off, "*args/**kwargs in calls are not supported");
        if (cur(p)->type == T_NAME && tok_is(peek(p, 1), T_OP, "=")) {
            if (n_kw >= 64) fail_at(p, cur(p)->off, "too many keyword arguments");
            kwn[n_kw] = cur(p)->s;
            kwl[n_kw] = cur(p)->len;
            n_kw++;
            advance(p);
            advance(p);
            nv_push(p, &kwv, parse_expression(p, true));
        } else {
            if (n_kw) fail_at(p, cur(p)->off, "positional argument after keyword argument");
            nv_push(p, &pos, parse_expression(p, true));
        }
    }
    advance(p);
    call->items = pos.v;
    call->n_items = pos.n;
    call->kw_vals = kwv.v;
    call->n_kw = n_kw;
    if (n_kw) {
        call->names = palloc(p, n_kw * sizeof(char *));
        call->name_lens = palloc(p, n_kw * sizeof(uint32_t));
        memcpy(call->names, kwn, n_kw * sizeof(char *));
        memcpy(call->name_lens, kwl, n_kw * sizeof(uint32_t));
    }
}

static jnode *parse_filter(parser *p, jnode *input) {
    /* at '|' */
    advance(p);
    tok *nt = cur(p);
    if (nt->type != T_NAME) fail_at(p, nt->off, "expected a filter name after '|'");
    jnode *f = new_node(p, JN_FILTER, nt->off);
    int id = jinja_filter_id(nt->s, nt->len);
    f->op = id < 0 ? JINJA_UNKNOWN_BUILTIN : (uint16_t)id;
    f->value = name_value(nt);
    f->a = input;
    advance(p);
    if (at_op(p, ".")) fail_at(p, cur(p)->off, "dotted filter names are not supported");
    if (at_op(p, "(")) parse_call_args(p, f);
    return f;
}

static jnode *parse_test(parser *p, jnode *input) {
    uint32_t is_off = cur(p)->off;
    advance(p); /* 'is' */
    bool negated = false;
    if (at_name(p, "not")) { negated = true; advance(p); }
    tok *nt = cur(p);
    if (nt->type != T_NAME) fail_at(p, nt->off, "expected a test name after 'is'");
    jnode *t = new_node(p, JN_TEST, is_off);
    int id = jinja_test_id(nt->s, nt->len);
    t->op = id < 0 ? JINJA_UNKNOWN_BUILTIN : (uint16_t)id;
    t->negated = negated;
    t->value = name_value(nt);
    t->a = input;
    advance(p);
    tok *c = cur(p);
    if (at_op(p, "(")) {
        parse_call_args(p, t);
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                at_op(p, "[") || at_op(p, "{")) &&
               !at_name(p, "else") && !at_name(p, "or") && !at_name(p, "and")) {
        if (at_name(p, "is")) fail_at(p, c->off, "tests cannot be chained with 'is'");
        jnode *arg = parse_postfix(p, parse_primary(p));
        t->items = palloc(p, sizeof(jnode *));
        t->items[0] = arg;
        t->n_items = 1;
    }
    return t;
}

static jnode *parse_filter_expr(parser *p, jnode *node) {
    for (;;) {
        if (at_op(p, "|")) node = parse_filter(p, node);
        else if (at_name(p, "is")) node = parse_test(p, node);
        else if (at_op(p, "(")) {
            jnode *call = new_node(p, JN_CALL, cur(p)->off);
            call->a = node;
            parse_call_args(p, call);
            node = call;
        } else break;
    }
    return node;
}

static jnode *parse_subscript_part(parser *p) {
    /* inside [...]: an expression or a slice */
    uint32_t off = cur(p)->off;
    jnode *args[3] = {NULL, NULL, NULL};
    int part = 0;
    bool is_slice = false;
    if (!at_op(p, ":")) args[0] = parse_expression(p, true);
    while (at_op(p, ":")) {
        is_slice = true;
        advance(p);
        if (++part > 2) fail_at(p, cur(p)->off, "malformed slice");
        if (!at_op(p, ":") && !at_op(p, "]") && !at_op(p, ",")) args[part] = parse_expression(p, true);
    }
    if (!is_slice) return args[0];
    jnode *s = new_node(p, JN_SLICE, off);
    s->b = args[0];
    s->c = args[1];
    s->d = args[2];
    return s;
}

static jnode *parse_postfix(parser *p, jnode *node) {
    for (;;) {
        enter(p);
        if (at_op(p, ".")) {
            uint32_t off = cur(p)->off;
            advance(p);
            tok *t = cur(p);
            if (t->type == T_NAME) {
                jnode *g = new_node(p, JN_GETATTR, off);
                g->a = node;
                g->value = name_value(t);
                advance(p);
                node = g;
            } else if (t->type == T_INT) {
                jnode *g = new_node(p, JN_GETITEM, off);
                g->a = node;
                jnode *k = new_node(p, JN_CONST, t->off);
                k->value = jv_int(t->i);
                g->b = k;
                advance(p);
                node = g;
            } else {
                fail_at(p, t->off, "expected an attribute name after '.'");
            }
        } else if (at_op(p, "[")) {
            uint32_t off = cur(p)->off;
            advance(p);
            jnode *sub = parse_subscript_part(p);
            if (at_op(p, ",")) fail_at(p, cur(p)->off, "tuple subscripts are not supported");
            expect_op(p, "]");
            if (sub->kind == JN_SLICE && sub->a == NULL) {
                sub->a = node;
                node = sub;
            } else {
                jnode *g = new_node(p, JN_GETITEM, off);
                g->a = node;
                g->b = sub;
                node = g;
            }
        } else if (at_op(p, "(")) {
            jnode *call = new_node(p, JN_CALL, cur(p)->off);
            call->line = node->line; /* a call is reported where its callee starts */
            call->col = node->col;
            call->a = node;
            parse_call_args(p, call);
            node = call;
        } else {
            leave(p);
            break;
        }
        leave(p);
    }
    return node;
}

static jnode *parse_primary(parser *p) {
    enter(p);
    tok *t = cur(p);
    jnode *n = NULL;
    if (t->type == T_NAME) {
        static const struct { const char *name; int v; } consts[] = {
            {"true", 1}, {"True", 1}, {"false", 0}, {"False", 0}, {"none", 2}, {"None", 2},
        };
        for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++) {
            if (tok_is(t, T_NAME, consts[k].name)) {
                n = new_node(p, JN_CONST, t->off);
                n->value = consts[k].v == 2 ? jv_none() : jv_bool(consts[k].v);
            }
        }
        if (!n) {
            n = new_node(p, JN_NAME, t->off);
            n->value = name_value(t);
        }
        advance(p);
    } else if (t->type == T_STRING) {
        n = new_node(p, JN_CONST, t->off);
        /* adjacent literals concatenate */
        size_t total = 0, k = p->pos;
        while (p->toks[k].type == T_STRING) total += p->toks[k++].len;
        if (k == p->pos + 1) {
            n->value = jv_str(t->s, t->len);
        } else {
            char *buf = palloc(p, total + 1);
            size_t w = 0;
            for (size_t q = p->pos; q < k; q++) { memcpy(buf + w, p->toks[q].s, p->toks[q].len); w += p->toks[q].len; }
            if (total > UINT32_MAX) fail_at(p, t->off, "string literal too long");
            n->value = jv_str(buf, total);
        }
        p->pos = k;
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        n = new_node(p, JN_CONST, t->off);
        n->value = t->type == T_INT ? jv_int(t->i) : jv_float(t->f);
        advance(p);
    } else if (at_op(p, "(")) {
        advance(p);
        n = parse_tuple(p, true, true);
        expect_op(p, ")");
    } else if (at_op(p, "[")) {
        n = new_node(p, JN_LIST, t->off);
        advance(p);
        nodevec items = {0};
        while (!at_op(p, "]")) {
            if (items.n) expect_op(p, ",");
            if (at_op(p, "]")) break;
            nv_push(p, &items, parse_expression(p, true));
        }
        advance(p);
        n->items = items.v;
        n->n_items = items.n;
    } else if (at_op(p, "{")) {
        n = new_node(p, JN_DICT, t->off);
        advance(p);
        nodevec keys = {0}, vals = {0};
        while (!at_op(p, "}")) {
            if (keys.n) expect_op(p, ",");
            if (at_op(p, "}")) break;
            nv_push(p, &keys, parse_expression(p, true));
            expect_op(p, ":");
            nv_push(p, &vals, parse_expression(p, true));
        }
        advance(p);
        n->items = keys.v;
        n->n_items = keys.n;
        n->kw_vals = vals.v;
        n->n_kw = vals.n;
    } else {
        char b[64];
        fail_at(p, t->off, "unexpected %s in expression", tok_desc(t, b, sizeof b));
    }
    leave(p);
    return n;
}

static jnode *parse_unary(parser *p, bool with_filter) {
    enter(p);
    jnode *n;
    if (at_op(p, "-") || at_op(p, "+")) {
        n = new_node(p, at_op(p, "-") ? JN_NEG : JN_POS, cur(p)->off);
        advance(p);
        n->a = parse_unary(p, false);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    leave(p);
    return n;
}

static jnode *binop(parser *p, jnode_kind kind, jop op, uint32_t off, jnode *a, jnode *b) {
    jnode *n = new_node(p, kind, off);
    n->op = (uint16_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *p) {
    jnode *l = parse_unary(p, true);
    while (at_op(p, "**")) {
        uint32_t off = cur(p)->off;
        advance(p);
        l = binop(p, JN_BINOP, JOP_POW, off, l, parse_unary(p, true));
    }
    return l;
}

/* One level of left-associative binary operators: next parses the operands, ops[] maps operator tokens
 * (longest first where one is a prefix of another) to their jop. */
typedef struct binop_level { const char *tok; jop op; } binop_level;

static jnode *parse_left_assoc(parser *p, jnode *(*next)(parser *), const binop_level *ops, size_t n_ops) {
    jnode *l = next(p);
    for (;;) {
        size_t k = 0;
        while (k < n_ops && !at_op(p, ops[k].tok)) k++;
        if (k == n_ops) return l;
        uint32_t off = cur(p)->off;
        advance(p);
        l = binop(p, JN_BINOP, ops[k].op, off, l, next(p));
    }
}

static jnode *parse_math2(parser *p) {
    static const binop_level ops[] = {{"*", JOP_MUL}, {"/", JOP_DIV}, {"//", JOP_FLOORDIV}, {"%", JOP_MOD}};
    return parse_left_assoc(p, parse_pow, ops, sizeof ops / sizeof ops[0]);
}

static jnode *parse_concat(parser *p) {
    static const binop_level ops[] = {{"~", JOP_CONCAT}};
    return parse_left_assoc(p, parse_math2, ops, 1);
}

static jnode *parse_math1(parser *p) {
    static const binop_level ops[] = {{"+", JOP_ADD}, {"-", JOP_SUB}};
    return parse_left_assoc(p, parse_concat, ops, 2);
}

static jnode *parse_compare(parser *p) {
    jnode *first = parse_math1(p);
    jnode *result = NULL, *left = first;
    for (;;) {
        jop op;
        uint32_t off = cur(p)->off;
        if (at_op(p, "==")) op = JOP_EQ;
        else if (at_op(p, "!=")) op = JOP_NE;
        else if (at_op(p, "<")) op = JOP_LT;
        else if (at_op(p, "<=")) op = JOP_LE;
        else if (at_op(p, ">")) op = JOP_GT;
        else if (at_op(p, ">=")) op = JOP_GE;
        else if (at_name(p, "in")) op = JOP_IN;
        else if (at_name(p, "not") && tok_is(peek(p, 1), T_NAME, "in")) { op = JOP_NOTIN; advance(p); }
        else break;
        advance(p);
        jnode *right = parse_math1(p);
        jnode *cmp = binop(p, JN_COMPARE, op, off, left, right);
        result = result ? binop(p, JN_AND, 0, off, result, cmp) : cmp;
        left = right;
    }
    return result ? result : first;
}

static jnode *parse_not(parser *p) {
    if (at_name(p, "not")) {
        enter(p);
        jnode *n = new_node(p, JN_NOT, cur(p)->off);
        advance(p);
        n->a = parse_not(p);
        leave(p);
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_and(parser *p) {
    jnode *l = parse_not(p);
    while (at_name(p, "and")) {
        uint32_t off = cur(p)->off;
        advance(p);
        l = binop(p, JN_AND, 0, off, l, parse_not(p));
    }
    return l;
}

static jnode *parse_or(parser *p) {
    jnode *l = parse_and(p);
    while (at_name(p, "or")) {
        uint32_t off = cur(p)->off;
        advance(p);
        l = binop(p, JN_OR, 0, off, l, parse_and(p));
    }
    return l;
}

static jnode *parse_expression(parser *p, bool with_condexpr) {
    enter(p);
    jnode *e = parse_or(p);
    if (with_condexpr && at_name(p, "if")) {
        while (at_name(p, "if")) {
            jnode *c = new_node(p, JN_COND, cur(p)->off);
            advance(p);
            c->a = e;
            c->b = parse_or(p);
            if (at_name(p, "else")) {
                advance(p);
                c->c = parse_expression(p, true);
            }
            e = c;
        }
    }
    leave(p);
    return e;
}

static bool tuple_ends(parser *p) {
    tok *t = cur(p);
    return t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF || at_op(p, ")") ||
           at_op(p, "]") || at_op(p, "}") || at_op(p, "=") || at_name(p, "in") || at_name(p, "if");
}

static jnode *parse_tuple(parser *p, bool with_condexpr, bool explicit_parens) {
    uint32_t off = cur(p)->off;
    nodevec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(p, ",");
        if (tuple_ends(p)) break;
        nv_push(p, &items, parse_expression(p, with_condexpr));
        if (at_op(p, ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) {
            char b[64];
            fail_at(p, cur(p)->off, "expected an expression, got %s", tok_desc(cur(p), b, sizeof b));
        }
    }
    jnode *t = new_node(p, JN_TUPLE, off);
    t->items = items.v;
    t->n_items = items.n;
    return t;
}

/* for/set targets: a name, `ns.attr` (when allowed), or a tuple of names. */
static jnode *parse_assign_target(parser *p, bool allow_ns) {
    uint32_t off = cur(p)->off;
    nodevec items = {0};
    bool parens = false;
    if (at_op(p, "(")) { parens = true; advance(p); }
    for (;;) {
        tok *t = cur(p);
        if (t->type != T_NAME) fail_at(p, t->off, "expected a variable name as assignment target");
        static const char *const reserved[] = {"true", "false", "none", "True", "False", "None", "in", "not", "and", "or", "is", "if", "else"};
        for (size_t k = 0; k < sizeof reserved / sizeof reserved[0]; k++)
            if (tok_is(t, T_NAME, reserved[k])) fail_at(p, t->off, "cannot assign to '%s'", reserved[k]);
        jnode *n;
        if (allow_ns && tok_is(peek(p, 1), T_OP, ".") && items.n == 0 && !parens) {
            n = new_node(p, JN_NS_TARGET, t->off);
            jnode *nm = new_node(p, JN_NAME, t->off);
            nm->value = name_value(t);
            n->a = nm;
            advance(p);
            advance(p);
            if (cur(p)->type != T_NAME) fail_at(p, cur(p)->off, "expected an attribute name after '.'");
            n->value = name_value(cur(p));
            advance(p);
            return n;
        }
        n = new_node(p, JN_NAME, t->off);
        n->value = name_value(t);
        advance(p);
        nv_push(p, &items, n);
        if (!at_op(p, ",")) break;
        advance(p);
        if (parens && at_op(p, ")")) break;
    }
    if (parens) expect_op(p, ")");
    if (items.n == 1 && !parens) return items.v[0];
    jnode *t = new_node(p, JN_TUPLE, off);
    t->items = items.v;
    t->n_items = items.n;
    return t;
}

/* ---------------------------------------------------------------- statements */

static jnode *parse_body(parser *p, const char *const *end_tags, size_t n_end, const char *opener, uint32_t opener_off);

static void expect_block_end(parser *p) { expect_type(p, T_BLOCK_END, "'%}'"); }

static jnode *parse_if(parser *p, uint32_t off) {
    jnode *n = new_node(p, JN_IF, off);
    n->a = parse_tuple(p, true, false);
    expect_block_end(p);
    static const char *const ends[] = {"elif", "else", "endif"};
    n->b = parse_body(p, ends, 3, "if", off);
    /* at the name of the end tag */
    if (at_name(p, "elif")) {
        uint32_t eoff = cur(p)->off;
        advance(p);
        n->c = parse_if(p, eoff);
        return n;
    }
    if (at_name(p, "else")) {
        advance(p);
        expect_block_end(p);
        static const char *const ends2[] = {"endif"};
        n->c = parse_body(p, ends2, 1, "if", off);
    }
    advance(p); /* endif */
    expect_block_end(p);
    return n;
}

static jnode *parse_for(parser *p, uint32_t off) {
    jnode *n = new_node(p, JN_FOR, off);
    n->a = parse_assign_target(p, false);
    if (!at_name(p, "in")) fail_at(p, cur(p)->off, "expected 'in' in for loop");
    advance(p);
    n->b = parse_tuple(p, false, false);
    if (at_name(p, "if")) {
        advance(p);
        n->c = parse_expression(p, true);
    }
    if (at_name(p, "recursive")) fail_at(p, cur(p)->off, "recursive for loops are not supported");
    expect_block_end(p);
    static const char *const ends[] = {"else", "endfor"};
    p->loop_depth++;
    n->d = parse_body(p, ends, 2, "for", off);
    p->loop_depth--;
    if (at_name(p, "else")) {
        advance(p);
        expect_block_end(p);
        static const char *const ends2[] = {"endfor"};
        n->e = parse_body(p, ends2, 1, "for", off);
    }
    advance(p);
    expect_block_end(p);
    return n;
}

/* A chain of filters applied to a placeholder input (NULL), for {% filter %} and {% set x | f %}. */
static jnode *parse_filter_chain(parser *p) {
    jnode *chain = NULL;
    bool first = true;
    while (first || at_op(p, "|")) {
        if (first) {
            /* the first filter name has no '|' before it: fake one */
            tok *nt = cur(p);
            if (nt->type != T_NAME) fail_at(p, nt->off, "expected a filter name");
            jnode *f = new_node(p, JN_FILTER, nt->off);
            int id = jinja_filter_id(nt->s, nt->len);
            f->op = id < 0 ? JINJA_UNKNOWN_BUILTIN : (uint16_t)id;
            f->value = name_value(nt);
            advance(p);
            if (at_op(p, "(")) parse_call_args(p, f);
            chain = f;
            first = false;
        } else {
            chain = parse_filter(p, chain);
        }
    }
    return chain;
}

static jnode *parse_set(parser *p, uint32_t off) {
    jnode *target = parse_assign_target(p, true);
    if (at_op(p, "=")) {
        advance(p);
        jnode *n = new_node(p, JN_SET, off);
        n->a = target;
        n->b = parse_tuple(p, true, false);
        expect_block_end(p);
        return n;
    }
    if (target->kind != JN_NAME) fail_at(p, off, "block set needs a single variable name");
    jnode *n = new_node(p, JN_SET_BLOCK, off);
    n->a = target;
    if (at_op(p, "|")) {
        advance(p);
        n->e = parse_filter_chain(p);
    }
    expect_block_end(p);
    static const char *const ends[] = {"endset"};
    int saved = p->loop_depth;
    n->d = parse_body(p, ends, 1, "set", off);
    p->loop_depth = saved;
    advance(p);
    expect_block_end(p);
    return n;
}

/* Bits of JMACRO_* for the names varargs/kwargs/caller read in body (nested macros excluded). */
static uint16_t macro_uses(const jnode *n, int depth) {
    if (!n || depth > 4 * JINJA_MAX_NESTING) return 0;
    if (n->kind == JN_NAME) {
        if (n->value.len == 7 && !memcmp(n->value.u.s, "varargs", 7)) return JMACRO_VARARGS;
        if (n->value.len == 6 && !memcmp(n->value.u.s, "kwargs", 6)) return JMACRO_KWARGS;
        if (n->value.len == 6 && !memcmp(n->value.u.s, "caller", 6)) return JMACRO_CALLER;
        return 0;
    }
    if (n->kind == JN_MACRO) return 0;
    uint16_t r = macro_uses(n->a, depth + 1) | macro_uses(n->b, depth + 1) | macro_uses(n->c, depth + 1) |
                 macro_uses(n->d, depth + 1) | macro_uses(n->e, depth + 1);
    for (uint32_t i = 0; i < n->n_items; i++) r |= macro_uses(n->items[i], depth + 1);
    if (n->kw_vals) for (uint32_t i = 0; i < n->n_kw; i++) r |= macro_uses(n->kw_vals[i], depth + 1);
    return r;
}

/* The parameter list "(a, b=1)" of a macro or a call block's caller into n (names, defaults). */
static void parse_params(parser *p, jnode *n, const tok *nt) {
    expect_op(p, "(");
    nodevec defaults = {0};
    const char *names[64];
    uint32_t lens[64];
    uint32_t count = 0;
    bool seen_default = false;
    while (!at_op(p, ")")) {
        if (count) expect_op(p, ",");
        if (at_op(p, ")")) break;
        tok *a = cur(p);
        if (a->type != T_NAME) fail_at(p, a->off, "expected a parameter name in '%.*s'", (int)nt->len, nt->s);
        if (count >= 64) fail_at(p, a->off, "too many macro parameters");
        names[count] = a->s;
        lens[count] = a->len;
        advance(p);
        jnode *def = NULL;
        if (at_op(p, "=")) {
            advance(p);
            def = parse_expression(p, true);
            seen_default = true;
        } else if (seen_default) {
            fail_at(p, a->off, "non-default parameter follows default parameter");
        }
        nv_push(p, &defaults, def);
        count++;
    }
    advance(p);
    n->items = defaults.v;
    n->n_items = count;
    n->n_kw = count;
    if (count) {
        n->names = palloc(p, count * sizeof(char *));
        n->name_lens = palloc(p, count * sizeof(uint32_t));
        memcpy(n->names, names, count * sizeof(char *));
        memcpy(n->name_lens, lens, count * sizeof(uint32_t));
    }
}

static jnode *parse_macro(parser *p, uint32_t off) {
    tok *nt = cur(p);
    if (nt->type != T_NAME) fail_at(p, nt->off, "expected a macro name");
    jnode *n = new_node(p, JN_MACRO, off);
    n->value = name_value(nt);
    advance(p);
    parse_params(p, n, nt);
    expect_block_end(p);
    static const char *const ends[] = {"endmacro"};
    int saved = p->loop_depth;
    p->loop_depth = 0;
    n->d = parse_body(p, ends, 1, "macro", off);
    p->loop_depth = saved;
    n->op = macro_uses(n->d, 0);
    advance(p);
    if (cur(p)->type == T_NAME) advance(p); /* {% endmacro name %} */
    expect_block_end(p);
    return n;
}

static jnode *parse_statement(parser *p) {
    /* at the tag name after {% */
    tok *t = cur(p);
    uint32_t off = t->off;
    if (t->type != T_NAME) {
        char b[64];
        fail_at(p, off, "expected a tag name after '{%%', got %s", tok_desc(t, b, sizeof b));
    }
    enter(p);
    jnode *n = NULL;
    if (at_name(p, "if")) { advance(p); n = parse_if(p, off); }
    else if (at_name(p, "for")) { advance(p); n = parse_for(p, off); }
    else if (at_name(p, "set")) { advance(p); n = parse_set(p, off); }
    else if (at_name(p, "macro")) { advance(p); n = parse_macro(p, off); }
    else if (at_name(p, "break") || at_name(p, "continue")) {
        bool is_break = at_name(p, "break");
        if (!p->loop_depth) fail_at(p, off, "'%s' outside of a loop", is_break ? "break" : "continue");
        n = new_node(p, is_break ? JN_BREAK : JN_CONTINUE, off);
        advance(p);
        expect_block_end(p);
    } else if (at_name(p, "filter")) {
        advance(p);
        n = new_node(p, JN_FILTER_BLOCK, off);
        n->a = parse_filter_chain(p);
        expect_block_end(p);
        static const char *const ends[] = {"endfilter"};
        n->d = parse_body(p, ends, 1, "filter", off);
        advance(p);
        expect_block_end(p);
    } else if (at_name(p, "call")) {
        tok *ct = cur(p);
        advance(p);
        n = new_node(p, JN_CALL_BLOCK, off);
        jnode *caller = new_node(p, JN_MACRO, off);
        caller->value = jv_str("caller", 6);
        if (at_op(p, "(")) parse_params(p, caller, ct);
        n->a = parse_expression(p, true);
        if (n->a->kind != JN_CALL) fail_at(p, off, "'{%% call %%}' needs a call expression");
        n->b = caller;
        expect_block_end(p);
        static const char *const ends[] = {"endcall"};
        int saved = p->loop_depth;
        p->loop_depth = 0;
        caller->d = parse_body(p, ends, 1, "call", off);
        p->loop_depth = saved;
        caller->op = macro_uses(caller->d, 0);
        advance(p);
        expect_block_end(p);
    } else if (at_name(p, "with")) {
        advance(p);
        n = new_node(p, JN_WITH, off);
        nodevec vals = {0};
        const char *names[64];
        uint32_t lens[64];
        uint32_t count = 0;
        while (cur(p)->type != T_BLOCK_END) {
            if (count) expect_op(p, ",");
            tok *nt = cur(p);
            if (nt->type != T_NAME) fail_at(p, nt->off, "expected a variable name in 'with'");
            if (count >= 64) fail_at(p, nt->off, "too many 'with' assignments");
            names[count] = nt->s;
            lens[count] = nt->len;
            advance(p);
            expect_op(p, "=");
            nv_push(p, &vals, parse_expression(p, true));
            count++;
        }
        expect_block_end(p);
        n->kw_vals = vals.v;
        n->n_kw = count;
        if (count) {
            n->names = palloc(p, count * sizeof(char *));
            n->name_lens = palloc(p, count * sizeof(uint32_t));
            memcpy(n->names, names, count * sizeof(char *));
            memcpy(n->name_lens, lens, count * sizeof(uint32_t));
        }
        static const char *const ends[] = {"endwith"};
        n->d = parse_body(p, ends, 1, "with", off);
        advance(p);
        expect_block_end(p);
    } else if (at_name(p, "generation")) {
        advance(p);
        expect_block_end(p);
        n = new_node(p, JN_GENERATION, off);
        static const char *const ends[] = {"endgeneration"};
        n->d = parse_body(p, ends, 1, "generation", off);
        advance(p);
        expect_block_end(p);
    } else {
        static const char *const known[] = {"include", "import", "from", "extends", "block", "do", "autoescape",
                                            "trans", "endraw"};
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            if (at_name(p, known[k])) fail_at(p, off, "unsupported tag '{%% %s %%}'", known[k]);
        fail_at(p, off, "unknown or unexpected tag '%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s);
    }
    leave(p);
    return n;
}

/* Parses statements until one of end_tags (left at the tag's name token) or the end of the template. */
static jnode *parse_body(parser *p, const char *const *end_tags, size_t n_end, const char *opener, uint32_t opener_off) {
    jnode *body = new_node(p, JN_BODY, cur(p)->off);
    nodevec items = {0};
    enter(p);
    for (;;) {
        tok *t = cur(p);
        if (t->type == T_EOF) {
            if (n_end) {
                uint32_t l, c;
                pos_of(p, opener_off, &l, &c);
                fail_at(p, t->off, "missing '{%% %s %%}' for the '%s' opened at %u:%u", end_tags[n_end - 1], opener, l, c);
            }
            break;
        }
        if (t->type == T_DATA) {
            jnode *n = new_node(p, JN_TEXT, t->off);
            n->value = jv_str(t->s, t->len);
            nv_push(p, &items, n);
            advance(p);
        } else if (t->type == T_VAR_BEGIN) {
            advance(p);
            jnode *n = new_node(p, JN_OUTPUT, t->off);
            n->a = parse_tuple(p, true, false);
            expect_type(p, T_VAR_END, "'}}'");
            nv_push(p, &items, n);
        } else if (t->type == T_BLOCK_BEGIN) {
            advance(p);
            tok *nm = cur(p);
            bool is_end = false;
            for (size_t k = 0; k < n_end; k++) if (tok_is(nm, T_NAME, end_tags[k])) is_end = true;
            if (is_end) break;
            nv_push(p, &items, parse_statement(p));
        } else {
            char b[64];
            fail_at(p, t->off, "unexpected %s", tok_desc(t, b, sizeof b));
        }
    }
    leave(p);
    body->items = items.v;
    body->n_items = items.n;
    return body;
}

/* ---------------------------------------------------------------- validation */

__attribute__((noreturn))
static void fail_node(parser *p, const jnode *n, const char *what) {
    p->status = kiln_fail(KILN_ERR_UNSUPPORTED, "chat template %s:%u:%u: unsupported %s '%.*s'", p->name, n->line, n->col,
                          what, (int)n->value.len, n->value.u.s);
    longjmp(p->fail, 1);
}

/* Unknown filters and tests are errors at compile time except inside an if (its test and bodies) or a
 * conditional expression, where jinja2 defers them to run time; loop, macro and block bodies are not
 * conditional even when nested in an if. */
static void validate(parser *p, const jnode *n, bool soft, int depth) {
    if (!n) return;
    if (depth > 4 * JINJA_MAX_NESTING) return;
    if ((n->kind == JN_FILTER || n->kind == JN_TEST) && n->op == JINJA_UNKNOWN_BUILTIN) {
        if (!soft) fail_node(p, n, n->kind == JN_FILTER ? "filter" : "test");
        if (!p->tmpl->deferred[0])
            snprintf(p->tmpl->deferred, sizeof p->tmpl->deferred, "unsupported %s '%.*s' at %u:%u", n->kind == JN_FILTER ? "filter" : "test",
                     (int)(n->value.len > 60 ? 60 : n->value.len), n->value.u.s, n->line, n->col);
    }
    bool inner = soft;
    switch (n->kind) {
    case JN_IF: case JN_COND: inner = true; break;
    default: break;
    }
    if (n->kind == JN_FOR) {
        validate(p, n->a, soft, depth + 1);
        validate(p, n->b, soft, depth + 1);
        validate(p, n->c, false, depth + 1);
        validate(p, n->d, false, depth + 1);
        validate(p, n->e, false, depth + 1);
        return;
    }
    if (n->kind == JN_CALL_BLOCK) {
        validate(p, n->a, soft, depth + 1);
        validate(p, n->b, false, depth + 1);
        return;
    }
    if (n->kind == JN_WITH) {
        for (uint32_t i = 0; i < n->n_kw; i++) validate(p, n->kw_vals[i], soft, depth + 1);
        validate(p, n->d, false, depth + 1);
        return;
    }
    if (n->kind == JN_MACRO || n->kind == JN_SET_BLOCK || n->kind == JN_FILTER_BLOCK) {
        for (uint32_t i = 0; i < n->n_items; i++) validate(p, n->items[i], false, depth + 1);
        validate(p, n->a, soft, depth + 1);
        validate(p, n->e, soft, depth + 1);
        validate(p, n->d, false, depth + 1);
        return;
    }
    validate(p, n->a, inner, depth + 1);
    validate(p, n->b, inner, depth + 1);
    validate(p, n->c, inner, depth + 1);
    validate(p, n->d, inner, depth + 1);
    validate(p, n->e, inner, depth + 1);
    for (uint32_t i = 0; i < n->n_items; i++) validate(p, n->items[i], inner, depth + 1);
    if (n->kind != JN_MACRO)
        for (uint32_t i = 0; i < n->n_kw; i++) if (n->kw_vals) validate(p, n->kw_vals[i], inner, depth + 1);
}

/* ---------------------------------------------------------------- entry */

kiln_status jinja_parse(const char *src, size_t len, const char *name, jinja_template **out) {
    KILN_ASSERT(out && (src || !len));
    *out = NULL;
    if (!name) name = "template";
    if (len > UINT32_MAX / 2) return kiln_fail(KILN_ERR_INVALID_ARG, "chat template %s: too large (%zu bytes)", name, len);
    /* the source must be UTF-8 (jinja2 reads text) */
    for (size_t i = 0; i < len;) {
        unsigned char c0 = (unsigned char)src[i];
        size_t n = c0 < 0x80 ? 1 : (c0 >= 0xC2 && c0 <= 0xDF) ? 2 : (c0 >= 0xE0 && c0 <= 0xEF) ? 3 : (c0 >= 0xF0 && c0 <= 0xF4) ? 4 : 0;
        bool ok = n && i + n <= len;
        for (size_t k = 1; ok && k < n; k++) ok = ((unsigned char)src[i + k] & 0xC0) == 0x80;
        if (ok && n == 3) {
            unsigned char c1 = (unsigned char)src[i + 1];
            ok = !(c0 == 0xE0 && c1 < 0xA0) && !(c0 == 0xED && c1 >= 0xA0);
        }
        if (ok && n == 4) {
            unsigned char c1 = (unsigned char)src[i + 1];
            ok = !(c0 == 0xF0 && c1 < 0x90) && !(c0 == 0xF4 && c1 >= 0x90);
        }
        if (!ok) return kiln_fail(KILN_ERR_INVALID_ARG, "chat template %s: not valid UTF-8 at byte %zu", name, i);
        i += n;
    }
    jinja_template *t = kiln_calloc(1, sizeof *t);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "chat template %s: out of memory", name);
    t->arena.limit = JINJA_PARSE_ARENA_LIMIT;
    t->name = kiln_strndup(name, strlen(name));
    parser *p = kiln_calloc(1, sizeof *p);
    if (!t->name || !p) {
        kiln_free(p);
        jinja_free(t);
        return kiln_fail(KILN_ERR_NOMEM, "chat template %s: out of memory", name);
    }
    p->tmpl = t;
    p->arena = &t->arena;
    p->name = t->name;
    p->status = KILN_OK;
    if (setjmp(p->fail)) {
        kiln_status st = p->status;
        kiln_free(p);
        jinja_free(t);
        return st;
    }
    /* normalize newlines (\r\n and \r -> \n), drop one trailing newline */
    char *norm = palloc(p, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    p->src = norm;
    p->len = n;
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) if (norm[i] == '\n') lines++;
    p->line_starts = palloc(p, lines * sizeof(uint32_t));
    p->n_lines = 0;
    p->line_starts[p->n_lines++] = 0;
    for (size_t i = 0; i < n; i++) if (norm[i] == '\n') p->line_starts[p->n_lines++] = (uint32_t)(i + 1);
    lex(p);
    p->pos = 0;
    t->root = parse_body(p, NULL, 0, NULL, 0);
    validate(p, t->root, false, 0);
    kiln_free(p);
    *out = t;
    return KILN_OK;
}

const char *jinja_deferred_unsupported(const jinja_template *t) { return t->deferred[0] ? t->deferred : NULL; }

void jinja_free(jinja_template *t) {
    if (!t) return;
    jinja_arena_free(&t->arena);
    kiln_free(t->name);
    kiln_free(t);
}
