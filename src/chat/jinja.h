/*
 * jinja.h — a Jinja2-subset interpreter for chat templates.
 *
 * It renders the chat templates published with models the way Hugging Face transformers does
 * (jinja2's ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True, the loopcontrols
 * extension, HF's `tojson` (ensure_ascii=False), and the globals raise_exception() and strftime_now()).
 *
 * Public part: jinja_parse() compiles a template source into an AST (unsupported constructs and syntax
 * errors fail here, naming the construct and its line:column); jinja_render() evaluates it against a
 * JSON object of variables. Both are safe on any input: nesting depth, output size, memory and
 * evaluation steps are bounded, and every failure is a kiln_status with a message.
 *
 * Internal part (below the marker): the arena, the value type and the AST shared by jinja_parse.c
 * (lexer and parser), jinja_eval.c (statements, expressions, scopes) and jinja_builtins.c (filters,
 * tests, methods, globals, string conversion and JSON output).
 *
 * Files: jinja_arena.c, jinja_parse.c, jinja_eval.c, jinja_builtins.c.
 *
 * Content tracking (jinja_render_opts.content_mask), so that a chat prompt can be tokenized with the
 * template's markup parsed for special tokens and message content not: the strings of the variables
 * `messages` (every string, keys included, except each message's "role"), `tools` and `documents` are
 * content. Every byte of the render arena has a shadow byte (1 = content); the shadow follows the bytes
 * wherever they are copied (concatenation, block captures, views such as trim or slices keep pointing at
 * the content itself). An operation that makes new bytes out of its inputs (a filter, a method, a global,
 * `%` formatting, `~` or printing of a list or dict, Markup escaping) with any content among its inputs
 * marks every byte it makes as content, except bytes copied from the template's own text; so no
 * transformation of content (upper, tojson, repr, replace, ...) can turn it into markup. Markup that
 * passes through such an operation together with content may come out marked as content (safe: it is then
 * tokenized as text). The rendered text is the same with tracking on or off.
 *
 * Supported: {{ }}, {% if/elif/else %}, {% for %} (tuple targets, `if` filter, else, loop.index/index0/
 * revindex/revindex0/first/last/length/previtem/nextitem/depth/cycle/changed, break/continue),
 * {% set %} (names, tuples, ns.attr, block set with filters), {% macro %} (defaults, varargs, kwargs,
 * caller), {% call %}, {% filter %}, {% with %}, {% raw %}, {% generation %}, comments and all
 * whitespace control; literals, + - * / // % ** ~, comparisons (chained), and/or/not, in/not in,
 * a if b else c, subscripts, slices, attributes; Markup from |safe/|escape; str, dict and list methods
 * (format and the sandbox's refusals included); 46 filter and 39 test names (see the tables in
 * jinja_builtins.c); globals range, namespace, dict, raise_exception, strftime_now.
 * Not supported (a clear error): include/import/extends/block, recursive loops, star-args and double-star-args in
 * calls, cycler/joiner/lipsum, and a few filters (pprint, urlencode, xmlattr, wordwrap, ...). Known
 * differences from Python in printing only: range objects and dict views print as lists; case mapping
 * covers Latin, Greek, Cyrillic and fullwidth letters.
 */
#ifndef KILN_CHAT_JINJA_H
#define KILN_CHAT_JINJA_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"

typedef struct jinja_template jinja_template;

/* Compiles src (len bytes, need not be NUL-terminated). name is used in error messages ("template",
 * a file name). On failure *out is NULL and the message names the problem and its line:column. */
kiln_status jinja_parse(const char *src, size_t len, const char *name, jinja_template **out);
void jinja_free(jinja_template *t);
/* The first unsupported filter or test that parsing deferred to run time (inside an if or a conditional
 * expression, as jinja2 does), e.g. "unsupported filter 'from_json' at 90:33"; NULL when none. */
const char *jinja_deferred_unsupported(const jinja_template *t);

typedef struct jinja_render_opts {
    /* The time strftime_now() formats: seconds since the epoch, formatted as UTC. 0 = the current
     * local time. Tests set it to get deterministic output. */
    int64_t now;
    /* Upper bound on the rendered size in bytes (0 = 64 MiB). */
    size_t max_output;
    /* When not NULL: content tracking is on and *content_mask receives one byte per output byte (kiln_malloc'd,
     * out_len bytes): 1 where the byte is message content, 0 where it is the template's markup (see below). */
    uint8_t **content_mask;
} jinja_render_opts;

/* Renders t with the variables of the JSON object vars (may be NULL). *out is kiln_malloc'd, NUL-
 * terminated, *out_len bytes (out_len may be NULL); the caller frees it with kiln_free. A template's
 * raise_exception("msg") fails with KILN_ERR_INVALID_ARG and a message containing msg. opts may be NULL. */
kiln_status jinja_render(const jinja_template *t, const json_t *vars, const jinja_render_opts *opts,
                         char **out, size_t *out_len);

/* ================================================================ internal (jinja*.c only) */

/* --- arena: bump allocation in chunks, freed at once; a byte limit makes runaway templates fail. */
typedef struct jinja_arena_chunk jinja_arena_chunk;
typedef struct jinja_arena {
    jinja_arena_chunk *head;
    size_t total;   /* bytes handed out so far */
    size_t limit;   /* 0 = no limit */
    bool shadow;    /* every byte has a shadow byte (content tracking); set before the first allocation */
} jinja_arena;

/* Zeroed memory aligned to 16; NULL when the limit is reached or the heap is exhausted. */
void *jinja_arena_alloc(jinja_arena *a, size_t n);
void jinja_arena_free(jinja_arena *a);
/* The shadow bytes of p[0..n) when those bytes lie in one of a's allocations (a->shadow set); else NULL. */
unsigned char *jinja_arena_shadow(const jinja_arena *a, const void *p, size_t n);
/* True when p points into memory a handed out. */
bool jinja_arena_contains(const jinja_arena *a, const void *p);

/* --- values */
typedef enum jv_type {
    JV_UNDEFINED, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STRING, JV_LIST, JV_DICT,
    JV_NAMESPACE, JV_CALLABLE, JV_LOOP,
} jv_type;

/* list flags: a tuple; a one-shot iterator (jinja's select/map/...: always true, no len, no subscript).
 * string flag: markup marked safe (|safe, |escape): `+` with a plain string HTML-escapes the plain side. */
enum { JVF_TUPLE = 1, JVF_GENERATOR = 2, JVF_SAFE = 4, JVF_UNSAFE_METHOD = 8 /* undefined: a method the
                                                                              * sandbox refuses */,
       JVF_GROUP = 16 /* a groupby result tuple: .grouper and .list */ };

typedef struct jv_list jv_list;
typedef struct jv_dict jv_dict;
typedef struct jv_callable jv_callable;
typedef struct jv_loop jv_loop;

/* 16 bytes, passed by value. Strings are views (bytes in the arena, the template or the AST); an
 * undefined value keeps the name it came from in s/len for messages. */
typedef struct jv {
    uint8_t type;
    uint8_t flags;
    uint32_t len;
    union {
        bool b;
        int64_t i;
        double f;
        const char *s;
        jv_list *list;
        jv_dict *dict;     /* JV_DICT and JV_NAMESPACE */
        jv_callable *fn;
        jv_loop *loop;
    } u;
} jv;

struct jv_list { size_t n, cap; jv *items; };
struct jv_dict { size_t n, cap; jv *keys; jv *vals; };

/* --- AST */
typedef enum jnode_kind {
    /* statements */
    JN_BODY, JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SET_BLOCK, JN_MACRO, JN_BREAK, JN_CONTINUE,
    JN_FILTER_BLOCK, JN_GENERATION, JN_WITH, JN_CALL_BLOCK,
    /* expressions */
    JN_CONST, JN_NAME, JN_GETATTR, JN_GETITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_BINOP,
    JN_COMPARE, JN_NOT, JN_NEG, JN_POS, JN_AND, JN_OR, JN_COND, JN_LIST, JN_TUPLE, JN_DICT,
    JN_NS_TARGET,   /* set target `ns.attr`: a = the namespace name, value = attr */
} jnode_kind;

typedef enum jop {
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
} jop;

typedef struct jnode jnode;
struct jnode {
    uint8_t kind;
    uint8_t negated;     /* JN_TEST: `is not` */
    uint16_t op;         /* JN_BINOP/JN_COMPARE: jop; JN_FILTER/JN_TEST: builtin id */
    uint32_t line, col;
    jnode *a, *b, *c, *d, *e;
    /* JN_BODY: statements; JN_LIST/JN_TUPLE: elements; JN_DICT: keys; calls, filters and tests:
     * positional arguments; JN_MACRO: parameter defaults (NULL entries for none) */
    jnode **items;
    uint32_t n_items;
    /* calls, filters and tests: keyword argument names and values; JN_DICT: values;
     * JN_MACRO: parameter names in names */
    jnode **kw_vals;
    const char **names;
    uint32_t *name_lens;
    uint32_t n_kw;
    jv value;            /* JN_CONST: the value; JN_NAME/JN_GETATTR/JN_FILTER/JN_TEST/JN_MACRO/JN_TEXT:
                          * the name or text as a string */
};
/* Field use per statement: IF a=cond b=then c=else (a BODY or an IF for elif); FOR a=target b=iter
 * c=filter d=body e=else; SET a=target b=value; SET_BLOCK a=target d=body e=filter chain (input NULL);
 * MACRO d=body; FILTER_BLOCK a=filter chain (innermost input NULL) d=body; GENERATION d=body;
 * WITH names/kw_vals = the assignments, d=body; CALL_BLOCK a=the call, b=the caller (a MACRO node).
 * A MACRO's op has bits JMACRO_VARARGS/KWARGS/CALLER when its body reads varargs/kwargs/caller.
 * Expressions: GETATTR a=obj; GETITEM a=obj b=key; SLICE a=obj b/c/d=start/stop/step (may be NULL);
 * CALL a=callee; FILTER/TEST a=input; BINOP/COMPARE/AND/OR a,b; NOT/NEG/POS a; COND a=then b=cond c=else. */

struct jinja_template {
    jinja_arena arena;
    jnode *root;
    char *name;
    char deferred[160];  /* see jinja_deferred_unsupported; "" when none */
};

/* --- builtins: ids resolved at parse time (an unknown filter or test is a parse error) */
int jinja_filter_id(const char *name, size_t len);   /* -1 when unknown */
/* The op of a filter/test node whose name is unknown: allowed (as in jinja2) inside an if or a
 * conditional expression, where it fails only when evaluated. */
#define JINJA_UNKNOWN_BUILTIN 0xFFFFu
int jinja_test_id(const char *name, size_t len);     /* -1 when unknown */

/* --- evaluation context (shared by jinja_eval.c and jinja_builtins.c) */
typedef struct jscope jscope;
typedef struct jctx {
    jinja_arena arena;
    jmp_buf fail;            /* every evaluation error longjmps here (all memory is in the arena) */
    kiln_status fail_status;
    char *out;               /* the output buffer (kiln_realloc'd) */
    size_t out_len, out_cap, out_max;
    jscope *root, *globals;
    uint64_t steps;
    int depth, macro_depth;
    int64_t now;
    const char *tmpl_name;
    /* content tracking (see the top of this file); off: all of these are zero */
    bool track;
    bool fresh;                       /* inside an operation with content among its inputs */
    unsigned char *out_mask;          /* one byte per byte of out (kiln_realloc'd with it) */
    const jinja_arena *tmpl_arena;    /* the template's text: always markup */
} jctx;

/* Fails the render: records "name:line:col: message" and longjmps. */
void jctx_fail(jctx *c, const jnode *at, kiln_status st, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
void *jctx_alloc(jctx *c, const jnode *at, size_t n);
/* Content tracking: records that dst[0..n) (render arena memory) now holds a copy of src[0..n). */
void jtrack_copy(jctx *c, void *dst, const void *src, size_t n);

jv jv_undefined(const char *name, size_t len);
jv jv_none(void);
jv jv_bool(bool b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(const char *s, size_t len);     /* a view; s must outlive the render */
jv jv_str_copy(jctx *c, const jnode *at, const char *s, size_t len);
jv jv_new_list(jctx *c, const jnode *at, size_t cap);
void jv_list_push(jctx *c, const jnode *at, jv list, jv item);
jv jv_new_dict(jctx *c, const jnode *at, size_t cap);
void jv_dict_set(jctx *c, const jnode *at, jv dict, jv key, jv val);
/* Looks key up; true and *out when present. */
bool jv_dict_get(jv dict, jv key, jv *out);
bool jv_dict_get_str(jv dict, const char *key, jv *out);
jv jv_from_json(jctx *c, const json_t *j);

bool jv_truthy(jctx *c, const jnode *at, jv v);
bool jv_equal(jv a, jv b);
/* -1/0/1 like Python's < on numbers, strings and lists; fails on other types. */
int jv_compare(jctx *c, const jnode *at, jv a, jv b);
const char *jv_type_name(jv v);

/* A growable byte string in the arena. */
typedef struct jbuf { jctx *c; const jnode *at; char *p; size_t n, cap; } jbuf;
void jbuf_init(jbuf *b, jctx *c, const jnode *at);
void jbuf_add(jbuf *b, const char *s, size_t n);
void jbuf_addc(jbuf *b, char ch);
void jbuf_addf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv jbuf_value(jbuf *b);

/* Python's printf-style `fmt % args` (args: a tuple, a mapping for %(name)s, or one value). */
jv jinja_percent_format(jctx *c, const jnode *at, jv fmt, jv args);

/* HTML-escapes s (& < > " ') as markupsafe does; the result is marked safe. */
jv jinja_html_escape(jctx *c, const jnode *at, jv s);

/* str(v) as Python prints it (undefined -> ""), appended to b; repr(v) likewise. */
void jv_to_str(jbuf *b, jv v);
void jv_repr(jbuf *b, jv v);
jv jv_stringify(jctx *c, const jnode *at, jv v);
/* json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...); indent NULL = none. */
void jv_to_json(jbuf *b, jv v, const char *indent, size_t indent_len, const char *item_sep,
                const char *key_sep, bool sort_keys, int depth);

/* Number of code points of a UTF-8 string. */
size_t jinja_utf8_count(const char *s, size_t len);

/* Attribute and subscript access with jinja2's sandbox rules. */
jv jinja_getattr(jctx *c, const jnode *at, jv obj, const char *name, size_t len);
jv jinja_getitem(jctx *c, const jnode *at, jv obj, jv key);

/* Arguments of a call after evaluation. */
typedef struct jargs {
    jv *pos; size_t n_pos;
    const char **kw_names; const uint32_t *kw_lens; jv *kw_vals; size_t n_kw;
} jargs;

jv jinja_apply_filter(jctx *c, const jnode *at, int id, jv input, const jargs *args);
bool jinja_apply_test(jctx *c, const jnode *at, int id, jv input, const jargs *args);
/* Calls a callable (builtin global, bound method, macro through jinja_call_macro). */
jv jinja_call(jctx *c, const jnode *at, jv fn, const jargs *args);
jv jinja_call_macro(jctx *c, const jnode *at, const jv_callable *macro, const jargs *args);
/* Looks up a builtin global (range, namespace, dict, raise_exception, strftime_now, ...). */
bool jinja_builtin_global(const char *name, size_t len, jv *out);
/* Iterates v as Python would for a `for` loop into a list value (dict -> keys, string -> chars). */
jv jinja_iter_list(jctx *c, const jnode *at, jv v);

struct jv_callable {
    int kind;            /* JFN_* */
    int id;
    jv self;             /* bound methods: the receiver */
    const jnode *macro;
    jscope *closure;     /* macros: the scope the body runs under (NULL = the template's top level) */
};
enum { JMACRO_VARARGS = 1, JMACRO_KWARGS = 2, JMACRO_CALLER = 4 };
enum { JFN_GLOBAL, JFN_METHOD, JFN_MACRO, JFN_UNSAFE };

struct jv_loop {
    int64_t index0, length;
    jv items;            /* the list iterated */
    int depth;
    bool has_changed;    /* loop.changed(): a previous value was seen */
    jv changed_last;
};

#endif
