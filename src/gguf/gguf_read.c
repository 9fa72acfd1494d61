/*
 * gguf_read.c — the GGUF reader: maps a file read-only (or takes a caller's buffer), parses the header,
 * every metadata value (nested arrays included) and the tensor table, and validates every length, count,
 * offset and alignment against the bytes actually present. Strings and arrays are views into the map;
 * string arrays and arrays of arrays get one offsets table each (in one shared, growable pool), never an
 * allocation per element. Keys and tensor names are indexed by a sorted pointer table (binary search).
 *
 * Layout (v2 and v3; all little-endian, counts and lengths 64-bit):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv × { string key, u32 type, value },
 *   n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset },
 *   padding to general.alignment, tensor data (offsets relative to this data section).
 * A string is { u64 len, bytes }; an array is { u32 elem_type, u64 n, n × elements }.
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timing.h"
#include "formats/formats.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln's GGUF reader assumes a little-endian host"
#endif

#define NO_TABLE UINT64_MAX   /* pool index of an array that needs no offsets table */

struct gguf_file {
    char *path;                       /* name used in messages (owned copy) */
    const uint8_t *base;
    uint64_t size;
    bool mapped;                      /* base is our mmap (unmapped at close) */
    uint32_t version, alignment;
    uint64_t data_offset;
    uint64_t map_ns, parse_ns;
    size_t n_kv, n_tensors;
    gguf_kv *kvs;                     /* file order */
    const gguf_kv **kv_sorted;        /* by key bytes */
    gguf_tensor *tensors;             /* file order */
    const gguf_tensor **tensor_sorted;/* by name bytes */
    uint64_t *kv_table;               /* per kv: pool index of its offsets table (NO_TABLE if none) */
    uint64_t *pool;                   /* offsets tables of all string arrays and arrays of arrays */
    void *block;                      /* the single allocation holding the arrays above (except pool) */
};

/* ---------------------------------------------------------------- small helpers */

static inline uint32_t rd_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static const uint8_t vtype_size[GGUF_VT_COUNT] = {
    [GGUF_VT_U8] = 1, [GGUF_VT_I8] = 1, [GGUF_VT_U16] = 2, [GGUF_VT_I16] = 2, [GGUF_VT_U32] = 4,
    [GGUF_VT_I32] = 4, [GGUF_VT_F32] = 4, [GGUF_VT_BOOL] = 1, [GGUF_VT_STRING] = 0, [GGUF_VT_ARRAY] = 0,
    [GGUF_VT_U64] = 8, [GGUF_VT_I64] = 8, [GGUF_VT_F64] = 8,
};

const char *gguf_vtype_name(gguf_vtype t) {
    static const char *const names[GGUF_VT_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return (unsigned)t < GGUF_VT_COUNT ? names[t] : "invalid";
}

bool gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* Writes a printable, bounded rendering of bytes (for messages): non-printables as \xNN, long names cut. */
static void show_bytes(char *dst, size_t cap, const uint8_t *s, uint64_t len) {
    size_t o = 0;
    for (uint64_t i = 0; i < len; i++) {
        if (o + 8 >= cap) { memcpy(dst + o, "...", 4); return; }
        uint8_t c = s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') dst[o++] = (char)c;
        else o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
    }
    dst[o] = '\0';
}

/* ---------------------------------------------------------------- the parser */

typedef struct parser {
    const uint8_t *base;
    uint64_t size, pos;
    const char *name;        /* file name for messages */
    char ctx[200];           /* what is being parsed: "header", "key 'x'", "tensor 'y'" */
    uint64_t *pool;
    uint64_t pool_n, pool_cap;
} parser;

static kiln_status perr(parser *p, kiln_status st, uint64_t off, const char *fmt, ...) KILN_PRINTF(4, 5);
static kiln_status perr(parser *p, kiln_status st, uint64_t off, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_fail(st, "gguf: %s: %s: %s (offset %llu)", p->name, p->ctx, msg, (unsigned long long)off);
}

static inline uint64_t left(const parser *p) { return p->size - p->pos; }

static kiln_status need(parser *p, uint64_t n, const char *what) {
    if (n > left(p))
        return perr(p, KILN_ERR_FORMAT, p->pos, "%s needs %llu bytes but only %llu are left", what,
                    (unsigned long long)n, (unsigned long long)left(p));
    return KILN_OK;
}

static kiln_status get_u32(parser *p, const char *what, uint32_t *out) {
    KILN_TRY(need(p, 4, what));
    *out = rd_u32(p->base + p->pos);
    p->pos += 4;
    return KILN_OK;
}

static kiln_status get_u64(parser *p, const char *what, uint64_t *out) {
    KILN_TRY(need(p, 8, what));
    *out = rd_u64(p->base + p->pos);
    p->pos += 8;
    return KILN_OK;
}

/* Reads a { u64 len, bytes } string with len <= max. */
static kiln_status get_str(parser *p, const char *what, uint64_t max, gguf_str *out) {
    uint64_t at = p->pos, len;
    KILN_TRY(get_u64(p, what, &len));
    if (len > left(p))
        return perr(p, KILN_ERR_FORMAT, at, "%s length %llu exceeds the %llu bytes left", what,
                    (unsigned long long)len, (unsigned long long)left(p));
    if (len > max)
        return perr(p, KILN_ERR_FORMAT, at, "%s length %llu exceeds the limit of %llu", what,
                    (unsigned long long)len, (unsigned long long)max);
    out->ptr = (const char *)(p->base + p->pos);
    out->len = len;
    p->pos += len;
    return KILN_OK;
}

/* Reserves n entries in the offsets pool; *idx receives the first one's index. */
static kiln_status pool_reserve(parser *p, uint64_t n, uint64_t *idx) {
    if (p->pool_n + n > p->pool_cap) {
        uint64_t cap = p->pool_cap ? p->pool_cap * 2 : 1024;
        if (cap < p->pool_n + n) cap = p->pool_n + n;
        size_t bytes;
        if (!kiln_mul_size((size_t)cap, sizeof(uint64_t), &bytes))
            return perr(p, KILN_ERR_NOMEM, p->pos, "offsets table of %llu entries overflows",
                        (unsigned long long)cap);
        uint64_t *np = kiln_realloc(p->pool, bytes);
        if (!np)
            return perr(p, KILN_ERR_NOMEM, p->pos, "cannot allocate an offsets table of %llu entries",
                        (unsigned long long)cap);
        p->pool = np;
        p->pool_cap = cap;
    }
    *idx = p->pool_n;
    p->pool_n += n;
    return KILN_OK;
}

/* Parses the body of an array ({ u32 elem, u64 n, elements }) at p->pos. depth is 1 for a top-level array.
 * *table receives the pool index of its offsets table, or NO_TABLE. */
static kiln_status parse_array(parser *p, int depth, gguf_arr *arr, uint64_t *table) {
    uint64_t at = p->pos;
    *table = NO_TABLE;
    if (depth > GGUF_MAX_ARRAY_DEPTH)
        return perr(p, KILN_ERR_FORMAT, at, "arrays nested deeper than %d levels", GGUF_MAX_ARRAY_DEPTH);
    uint32_t elem;
    uint64_t n;
    KILN_TRY(get_u32(p, "array element type", &elem));
    if (elem >= GGUF_VT_COUNT)
        return perr(p, KILN_ERR_FORMAT, at, "array element type %u is not a GGUF value type", elem);
    KILN_TRY(get_u64(p, "array length", &n));
    arr->elem = (gguf_vtype)elem;
    arr->n = n;
    arr->data = p->base + p->pos;
    arr->offsets = NULL;
    uint64_t start = p->pos;
    if (elem != GGUF_VT_STRING && elem != GGUF_VT_ARRAY) {
        uint64_t es = vtype_size[elem];
        if (n > left(p) / es)
            return perr(p, KILN_ERR_FORMAT, at + 4, "array of %llu %s needs more than the %llu bytes left",
                        (unsigned long long)n, gguf_vtype_name(arr->elem), (unsigned long long)left(p));
        p->pos += n * es;
        return KILN_OK;
    }
    if (n == 0) return KILN_OK;
    uint64_t min_elem = elem == GGUF_VT_STRING ? 8 : 12;
    if (n > left(p) / min_elem)
        return perr(p, KILN_ERR_FORMAT, at + 4, "array of %llu %s needs more than the %llu bytes left",
                    (unsigned long long)n, gguf_vtype_name(arr->elem), (unsigned long long)left(p));
    uint64_t idx;
    if (elem == GGUF_VT_STRING) {
        KILN_TRY(pool_reserve(p, n, &idx));
        uint64_t *tab = p->pool + idx;
        const uint8_t *base = p->base;
        uint64_t pos = p->pos, size = p->size;
        for (uint64_t i = 0; i < n; i++) {
            if (size - pos < 8) {
                p->pos = pos;
                return perr(p, KILN_ERR_FORMAT, pos, "string %llu of %llu: length needs 8 bytes but only %llu are left",
                            (unsigned long long)i, (unsigned long long)n, (unsigned long long)(size - pos));
            }
            uint64_t len = rd_u64(base + pos);
            if (len > size - pos - 8 || len > GGUF_MAX_STRING) {
                p->pos = pos;
                if (len <= size - pos - 8)
                    return perr(p, KILN_ERR_FORMAT, pos, "string %llu length %llu exceeds the limit of %llu",
                                (unsigned long long)i, (unsigned long long)len, (unsigned long long)GGUF_MAX_STRING);
                return perr(p, KILN_ERR_FORMAT, pos, "string %llu length %llu exceeds the %llu bytes left",
                            (unsigned long long)i, (unsigned long long)len, (unsigned long long)(size - pos - 8));
            }
            tab[i] = pos - start;
            pos += 8 + len;
        }
        p->pos = pos;
        *table = idx;
        return KILN_OK;
    }
    /* array of arrays: entries [0, n) are element offsets, [n, 2n) the sub-table indices relative to idx */
    KILN_TRY(pool_reserve(p, 2 * n, &idx));
    for (uint64_t i = 0; i < n; i++) {
        p->pool[idx + i] = p->pos - start;
        gguf_arr sub;
        uint64_t sub_table;
        KILN_TRY(parse_array(p, depth + 1, &sub, &sub_table));
        p->pool[idx + n + i] = sub_table == NO_TABLE ? NO_TABLE : sub_table - idx;
    }
    *table = idx;
    return KILN_OK;
}

static kiln_status parse_value(parser *p, uint32_t type, gguf_value *v, uint64_t *table) {
    uint64_t at = p->pos;
    *table = NO_TABLE;
    v->type = (gguf_vtype)type;
    switch (type) {
    case GGUF_VT_U8: KILN_TRY(need(p, 1, "u8 value")); v->v.u = p->base[p->pos]; p->pos += 1; break;
    case GGUF_VT_I8: KILN_TRY(need(p, 1, "i8 value")); v->v.i = (int8_t)p->base[p->pos]; p->pos += 1; break;
    case GGUF_VT_BOOL:
        KILN_TRY(need(p, 1, "bool value"));
        if (p->base[p->pos] > 1)
            return perr(p, KILN_ERR_FORMAT, at, "bool value %u is neither 0 nor 1", p->base[p->pos]);
        v->v.u = p->base[p->pos];
        p->pos += 1;
        break;
    case GGUF_VT_U16: {
        uint16_t x;
        KILN_TRY(need(p, 2, "u16 value"));
        memcpy(&x, p->base + p->pos, 2);
        v->v.u = x;
        p->pos += 2;
        break;
    }
    case GGUF_VT_I16: {
        int16_t x;
        KILN_TRY(need(p, 2, "i16 value"));
        memcpy(&x, p->base + p->pos, 2);
        v->v.i = x;
        p->pos += 2;
        break;
    }
    case GGUF_VT_U32: { uint32_t x; KILN_TRY(get_u32(p, "u32 value", &x)); v->v.u = x; break; }
    case GGUF_VT_I32: { uint32_t x; KILN_TRY(get_u32(p, "i32 value", &x)); v->v.i = (int32_t)x; break; }
    case GGUF_VT_F32: {
        float x;
        KILN_TRY(need(p, 4, "f32 value"));
        memcpy(&x, p->base + p->pos, 4);
        v->v.f = x;
        p->pos += 4;
        break;
    }
    case GGUF_VT_U64: KILN_TRY(get_u64(p, "u64 value", &v->v.u)); break;
    case GGUF_VT_I64: { uint64_t x; KILN_TRY(get_u64(p, "i64 value", &x)); v->v.i = (int64_t)x; break; }
    case GGUF_VT_F64: {
        KILN_TRY(need(p, 8, "f64 value"));
        memcpy(&v->v.f, p->base + p->pos, 8);
        p->pos += 8;
        break;
    }
    case GGUF_VT_STRING: KILN_TRY(get_str(p, "string value", GGUF_MAX_STRING, &v->v.str)); break;
    case GGUF_VT_ARRAY: KILN_TRY(parse_array(p, 1, &v->v.arr, table)); break;
    default:
        return perr(p, KILN_ERR_FORMAT, at - 4, "value type %u is not a GGUF value type", type);
    }
    return KILN_OK;
}

static int cmp_bytes(const char *a, uint64_t na, const char *b, uint64_t nb) {
    uint64_t n = na < nb ? na : nb;
    int c = n ? memcmp(a, b, n) : 0;
    if (c) return c;
    return na < nb ? -1 : na > nb;
}

static int cmp_kv(const void *a, const void *b) {
    const gguf_kv *x = *(const gguf_kv *const *)a, *y = *(const gguf_kv *const *)b;
    int c = cmp_bytes(x->key.ptr, x->key.len, y->key.ptr, y->key.len);
    return c ? c : (x->offset > y->offset) - (x->offset < y->offset);
}

static int cmp_tensor_name(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    int c = cmp_bytes(x->name.ptr, x->name.len, y->name.ptr, y->name.len);
    return c ? c : (x->info_offset > y->info_offset) - (x->info_offset < y->info_offset);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static void set_ctx_kv(parser *p, const gguf_kv *kv) {
    char shown[120];
    show_bytes(shown, sizeof shown, (const uint8_t *)kv->key.ptr, kv->key.len);
    snprintf(p->ctx, sizeof p->ctx, "key '%s'", shown);
}

static void set_ctx_tensor(parser *p, const gguf_tensor *t) {
    char shown[120];
    show_bytes(shown, sizeof shown, (const uint8_t *)t->name.ptr, t->name.len);
    snprintf(p->ctx, sizeof p->ctx, "tensor '%s'", shown);
}

/* Reads general.alignment from a parsed kv: any integer type, a power of two in [1, 2^30]. */
static kiln_status read_alignment(parser *p, const gguf_kv *kv, uint32_t *out) {
    uint64_t a;
    switch (kv->value.type) {
    case GGUF_VT_U8: case GGUF_VT_U16: case GGUF_VT_U32: case GGUF_VT_U64: a = kv->value.v.u; break;
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64:
        a = kv->value.v.i < 0 ? 0 : (uint64_t)kv->value.v.i;
        break;
    default:
        return perr(p, KILN_ERR_FORMAT, kv->offset, "is a %s, expected an integer",
                    gguf_vtype_name(kv->value.type));
    }
    if (a == 0 || (a & (a - 1)) || a > (1u << 30))
        return perr(p, KILN_ERR_FORMAT, kv->offset, "alignment %llu is not a power of two in [1, 2^30]",
                    (unsigned long long)a);
    *out = (uint32_t)a;
    return KILN_OK;
}

static kiln_status parse_tensor_info(parser *p, size_t i, gguf_tensor *t) {
    t->info_offset = p->pos;
    snprintf(p->ctx, sizeof p->ctx, "tensor #%zu", i);
    KILN_TRY(get_str(p, "name", GGUF_MAX_KEY_LEN, &t->name));
    if (t->name.len == 0) return perr(p, KILN_ERR_FORMAT, t->info_offset, "the name is empty");
    set_ctx_tensor(p, t);
    uint64_t at = p->pos;
    KILN_TRY(get_u32(p, "n_dims", &t->n_dims));
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return perr(p, KILN_ERR_FORMAT, at, "n_dims %u is not in [1, %d]", t->n_dims, GGUF_MAX_DIMS);
    uint64_t count = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = p->pos;
        KILN_TRY(get_u64(p, "dimension", &t->ne[d]));
        if (t->ne[d] == 0) return perr(p, KILN_ERR_FORMAT, at, "dimension %u is 0", d);
        if (t->ne[d] > (uint64_t)INT64_MAX || __builtin_mul_overflow(count, t->ne[d], &count) ||
            count > (uint64_t)INT64_MAX)
            return perr(p, KILN_ERR_FORMAT, at, "dimension %u (%llu) makes the element count overflow", d,
                        (unsigned long long)t->ne[d]);
    }
    at = p->pos;
    KILN_TRY(get_u32(p, "type", &t->type));
    const kiln_type_info *ti = kiln_type_get(t->type);
    if (!ti) return perr(p, KILN_ERR_FORMAT, at, "unknown tensor type %u", t->type);
    if (t->ne[0] % ti->block_size)
        return perr(p, KILN_ERR_FORMAT, at, "row length %llu is not a multiple of the %s block size %u",
                    (unsigned long long)t->ne[0], ti->name, ti->block_size);
    uint64_t row, rows = count / t->ne[0];
    if (__builtin_mul_overflow(t->ne[0] / ti->block_size, (uint64_t)ti->type_size, &row) ||
        __builtin_mul_overflow(row, rows, &t->nbytes))
        return perr(p, KILN_ERR_FORMAT, t->info_offset, "byte size of %llu rows of %llu %s values overflows",
                    (unsigned long long)rows, (unsigned long long)t->ne[0], ti->name);
    KILN_TRY(get_u64(p, "data offset", &t->offset));
    return KILN_OK;
}

/* Parses and validates the whole file; fills f (whose path/base/size are set). On failure f's arrays may be
 * partly allocated: the caller frees them through gguf_close. */
static kiln_status parse_file(gguf_file *f) {
    parser P = {.base = f->base, .size = f->size, .pos = 0, .name = f->path};
    parser *p = &P;
    snprintf(p->ctx, sizeof p->ctx, "header");
    if (f->size < 24)
        return perr(p, KILN_ERR_FORMAT, 0, "file is %llu bytes, smaller than a GGUF header (24 bytes)",
                    (unsigned long long)f->size);
    uint32_t magic = rd_u32(f->base), version = rd_u32(f->base + 4);
    if (magic != GGUF_MAGIC)
        return perr(p, KILN_ERR_FORMAT, 0, "bad magic %02x %02x %02x %02x, expected \"GGUF\"", f->base[0],
                    f->base[1], f->base[2], f->base[3]);
    if (version == 1)
        return perr(p, KILN_ERR_UNSUPPORTED, 4, "GGUF version 1 (32-bit counts) is not supported; convert to v3");
    if ((version & 0xffff) == 0 && version != 0)
        return perr(p, KILN_ERR_UNSUPPORTED, 4, "big-endian GGUF (version field %08x) is not supported", version);
    if (version != 2 && version != 3)
        return perr(p, KILN_ERR_UNSUPPORTED, 4, "GGUF version %u is not supported (2 and 3 are)", version);
    f->version = version;
    p->pos = 8;
    uint64_t n_tensors, n_kv;
    KILN_TRY(get_u64(p, "tensor count", &n_tensors));
    KILN_TRY(get_u64(p, "key count", &n_kv));
    /* every kv takes >= 13 bytes (key length, type, 1-byte value), every tensor entry >= 32 */
    if (n_kv > left(p) / 13)
        return perr(p, KILN_ERR_FORMAT, 16, "key count %llu cannot fit in the %llu bytes left",
                    (unsigned long long)n_kv, (unsigned long long)left(p));
    if (n_tensors > left(p) / 32 || n_tensors > (left(p) - n_kv * 13) / 32)
        return perr(p, KILN_ERR_FORMAT, 8, "tensor count %llu cannot fit in the %llu bytes left",
                    (unsigned long long)n_tensors, (unsigned long long)left(p));
    f->n_kv = (size_t)n_kv;
    f->n_tensors = (size_t)n_tensors;

    /* one block: kvs, kv index, kv tables, tensors, tensor index */
    size_t sz_kvs = f->n_kv * sizeof(gguf_kv), sz_kvi = f->n_kv * sizeof(gguf_kv *),
           sz_kvt = f->n_kv * sizeof(uint64_t), sz_t = f->n_tensors * sizeof(gguf_tensor),
           sz_ti = f->n_tensors * sizeof(gguf_tensor *);
    uint8_t *block = kiln_calloc(1, sz_kvs + sz_kvi + sz_kvt + sz_t + sz_ti);
    if (!block) return perr(p, KILN_ERR_NOMEM, 8, "cannot allocate the key and tensor tables");
    f->block = block;
    f->kvs = (gguf_kv *)block;
    f->tensors = (gguf_tensor *)(block + sz_kvs);
    f->kv_table = (uint64_t *)(block + sz_kvs + sz_t);
    f->kv_sorted = (const gguf_kv **)(block + sz_kvs + sz_t + sz_kvt);
    f->tensor_sorted = (const gguf_tensor **)(block + sz_kvs + sz_t + sz_kvt + sz_kvi);

    kiln_status st = KILN_OK;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < f->n_kv && st == KILN_OK; i++) {
        gguf_kv *kv = &f->kvs[i];
        kv->offset = p->pos;
        snprintf(p->ctx, sizeof p->ctx, "key #%zu", i);
        st = get_str(p, "key", GGUF_MAX_KEY_LEN, &kv->key);
        if (st) break;
        if (kv->key.len == 0) { st = perr(p, KILN_ERR_FORMAT, kv->offset, "the key is empty"); break; }
        set_ctx_kv(p, kv);
        uint32_t type;
        st = get_u32(p, "value type", &type);
        if (st) break;
        st = parse_value(p, type, &kv->value, &f->kv_table[i]);
        if (st) break;
        if (gguf_str_eq(kv->key, "general.alignment")) st = read_alignment(p, kv, &f->alignment);
    }
    f->pool = P.pool; /* owned by f from here on (freed by gguf_close) */
    if (st) return st;

    /* key index; duplicates are adjacent after sorting */
    for (size_t i = 0; i < f->n_kv; i++) f->kv_sorted[i] = &f->kvs[i];
    qsort(f->kv_sorted, f->n_kv, sizeof *f->kv_sorted, cmp_kv);
    for (size_t i = 1; i < f->n_kv; i++) {
        const gguf_kv *a = f->kv_sorted[i - 1], *b = f->kv_sorted[i];
        if (cmp_bytes(a->key.ptr, a->key.len, b->key.ptr, b->key.len) == 0) {
            set_ctx_kv(p, b);
            return perr(p, KILN_ERR_FORMAT, b->offset, "duplicate key (first at offset %llu)",
                        (unsigned long long)a->offset);
        }
    }
    /* bind offsets tables now that the pool no longer moves */
    for (size_t i = 0; i < f->n_kv; i++)
        if (f->kv_table[i] != NO_TABLE) f->kvs[i].value.v.arr.offsets = f->pool + f->kv_table[i];

    for (size_t i = 0; i < f->n_tensors; i++) KILN_TRY(parse_tensor_info(p, i, &f->tensors[i]));

    /* the data section starts at the end of the table rounded up to the alignment */
    uint64_t table_end = p->pos, a = f->alignment;
    f->data_offset = (table_end + a - 1) / a * a;
    uint64_t data_bytes = f->data_offset <= f->size ? f->size - f->data_offset : 0;
    bool ordered = true;
    for (size_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        set_ctx_tensor(p, t);
        uint64_t at = t->info_offset + 8 + t->name.len + 4 + 8ull * t->n_dims + 4;
        if (t->offset % a)
            return perr(p, KILN_ERR_FORMAT, at, "data offset %llu is not a multiple of the alignment %llu",
                        (unsigned long long)t->offset, (unsigned long long)a);
        if (t->offset > data_bytes || t->nbytes > data_bytes - t->offset)
            return perr(p, KILN_ERR_FORMAT, at,
                        "data [%llu, +%llu bytes) lies outside the %llu data bytes of the file (data section at %llu)",
                        (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                        (unsigned long long)data_bytes, (unsigned long long)f->data_offset);
        t->data = f->base + f->data_offset + t->offset;
        if (i && t->offset < f->tensors[i - 1].offset) ordered = false;
        f->tensor_sorted[i] = t;
    }
    /* overlap: check neighbours in offset order (the usual file is already ordered) */
    if (!ordered) qsort(f->tensor_sorted, f->n_tensors, sizeof *f->tensor_sorted, cmp_tensor_offset);
    for (size_t i = 1; i < f->n_tensors; i++) {
        const gguf_tensor *x = f->tensor_sorted[i - 1], *y = f->tensor_sorted[i];
        if (x->offset + x->nbytes > y->offset) {
            char other[120];
            show_bytes(other, sizeof other, (const uint8_t *)x->name.ptr, x->name.len);
            set_ctx_tensor(p, y);
            return perr(p, KILN_ERR_FORMAT, y->info_offset,
                        "data at %llu overlaps tensor '%s' (data [%llu, %llu))", (unsigned long long)y->offset,
                        other, (unsigned long long)x->offset, (unsigned long long)(x->offset + x->nbytes));
        }
    }
    /* name index */
    qsort(f->tensor_sorted, f->n_tensors, sizeof *f->tensor_sorted, cmp_tensor_name);
    for (size_t i = 1; i < f->n_tensors; i++) {
        const gguf_tensor *x = f->tensor_sorted[i - 1], *y = f->tensor_sorted[i];
        if (cmp_bytes(x->name.ptr, x->name.len, y->name.ptr, y->name.len) == 0) {
            set_ctx_tensor(p, y);
            return perr(p, KILN_ERR_FORMAT, y->info_offset, "duplicate tensor name (first at offset %llu)",
                        (unsigned long long)x->info_offset);
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- open / close */

static kiln_status open_common(const uint8_t *base, uint64_t size, bool mapped, const char *name,
                               uint64_t map_ns, uint64_t t0, gguf_file **out) {
    gguf_file *f = kiln_calloc(1, sizeof *f);
    char *path = kiln_strndup(name, strlen(name));
    if (!f || !path) {
        kiln_free(f);
        kiln_free(path);
        if (mapped) munmap((void *)base, size);
        return kiln_fail(KILN_ERR_NOMEM, "gguf: %s: out of memory", name);
    }
    f->path = path;
    f->base = base;
    f->size = size;
    f->mapped = mapped;
    f->map_ns = map_ns;
    kiln_status st = parse_file(f);
    if (st != KILN_OK) {
        gguf_close(f);
        return st;
    }
    f->parse_ns = kiln_now_ns() - t0;
    *out = f;
    return KILN_OK;
}

kiln_status gguf_open(const char *path, gguf_file **out) {
    KILN_ASSERT(path && out);
    *out = NULL;
    uint64_t t0 = kiln_now_ns();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_fail(KILN_ERR_IO, "gguf: %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return kiln_fail(KILN_ERR_IO, "gguf: %s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln_fail(KILN_ERR_IO, "gguf: %s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 24) {
        close(fd);
        return kiln_fail(KILN_ERR_FORMAT, "gguf: %s: header: file is %llu bytes, smaller than a GGUF header (24 bytes) (offset 0)",
                         path, (unsigned long long)size);
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return kiln_fail(KILN_ERR_IO, "gguf: %s: cannot map %llu bytes: %s", path,
                                          (unsigned long long)size, strerror(e));
    uint64_t t1 = kiln_now_ns();
    return open_common(m, size, true, path, t1 - t0, t1, out);
}

kiln_status gguf_open_memory(const void *buf, size_t len, const char *name, gguf_file **out) {
    KILN_ASSERT(out && (buf || len == 0));
    *out = NULL;
    static const uint8_t empty[1];
    return open_common(buf ? buf : empty, len, false, name ? name : "(memory)", 0, kiln_now_ns(), out);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->mapped) munmap((void *)f->base, (size_t)f->size);
    kiln_free(f->pool);
    kiln_free(f->block);
    kiln_free(f->path);
    kiln_free(f);
}

/* ---------------------------------------------------------------- accessors */

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
uint32_t gguf_alignment(const gguf_file *f) { return f->alignment; }
const uint8_t *gguf_base(const gguf_file *f) { return f->base; }
const char *gguf_path(const gguf_file *f) { return f->path; }

void gguf_open_ns(const gguf_file *f, uint64_t *map_ns, uint64_t *parse_ns) {
    if (map_ns) *map_ns = f->map_ns;
    if (parse_ns) *parse_ns = f->parse_ns;
}

size_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }

const gguf_kv *gguf_kv_at(const gguf_file *f, size_t i) {
    KILN_ASSERT(i < f->n_kv);
    return &f->kvs[i];
}

/* Binary search over an index sorted by the gguf_str at byte offset str_off of each entry. */
static const void *find_sorted(const void *const *sorted, size_t count, size_t str_off, const char *name) {
    size_t n = strlen(name), lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const gguf_str *k = (const gguf_str *)((const char *)sorted[mid] + str_off);
        int c = cmp_bytes(k->ptr, k->len, name, n);
        if (c == 0) return sorted[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    return find_sorted((const void *const *)f->kv_sorted, f->n_kv, offsetof(gguf_kv, key), key);
}

size_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_file *f, size_t i) {
    KILN_ASSERT(i < f->n_tensors);
    return &f->tensors[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    return find_sorted((const void *const *)f->tensor_sorted, f->n_tensors, offsetof(gguf_tensor, name), name);
}

gguf_str gguf_arr_str(const gguf_arr *a, uint64_t i) {
    KILN_ASSERT(a->elem == GGUF_VT_STRING && i < a->n);
    const uint8_t *p = a->data + a->offsets[i];
    gguf_str s = {(const char *)p + 8, rd_u64(p)};
    return s;
}

gguf_arr gguf_arr_sub(const gguf_arr *a, uint64_t i) {
    KILN_ASSERT(a->elem == GGUF_VT_ARRAY && i < a->n);
    const uint8_t *p = a->data + a->offsets[i];
    uint64_t rel = a->offsets[a->n + i];
    gguf_arr s = {(gguf_vtype)rd_u32(p), rd_u64(p + 4), p + 12, rel == NO_TABLE ? NULL : a->offsets + rel};
    return s;
}

double gguf_arr_f64(const gguf_arr *a, uint64_t i) {
    KILN_ASSERT(i < a->n);
    const uint8_t *p = a->data + i * vtype_size[a->elem];
    switch (a->elem) {
    case GGUF_VT_F32: { float x; memcpy(&x, p, 4); return x; }
    case GGUF_VT_F64: { double x; memcpy(&x, p, 8); return x; }
    case GGUF_VT_U64: return (double)rd_u64(p);
    default: return (double)gguf_arr_i64(a, i);
    }
}

/* A float truncated toward zero, saturated to the i64 range (NaN gives 0): never undefined behaviour. */
static int64_t saturate_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775807.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}

int64_t gguf_arr_i64(const gguf_arr *a, uint64_t i) {
    KILN_ASSERT(i < a->n);
    const uint8_t *p = a->data + i * vtype_size[a->elem];
    switch (a->elem) {
    case GGUF_VT_U8: case GGUF_VT_BOOL: return p[0];
    case GGUF_VT_I8: return (int8_t)p[0];
    case GGUF_VT_U16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_VT_I16: { int16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_VT_U32: return rd_u32(p);
    case GGUF_VT_I32: return (int32_t)rd_u32(p);
    case GGUF_VT_U64: return (int64_t)rd_u64(p);
    case GGUF_VT_I64: return (int64_t)rd_u64(p);
    case GGUF_VT_F32: { float x; memcpy(&x, p, 4); return saturate_i64(x); }
    case GGUF_VT_F64: { double x; memcpy(&x, p, 8); return saturate_i64(x); }
    default: KILN_ASSERT(!"gguf_arr_i64 on a string or array element"); return 0;
    }
}

/* ---------------------------------------------------------------- typed getters */

static kiln_status find_or_fail(const gguf_file *f, const char *key, const gguf_kv **out) {
    *out = gguf_find(f, key);
    if (!*out) return kiln_fail(KILN_ERR_FORMAT, "gguf: %s: missing key '%s'", f->path, key);
    return KILN_OK;
}

static kiln_status type_fail(const gguf_file *f, const gguf_kv *kv, const char *expected) {
    return kiln_fail(KILN_ERR_FORMAT, "gguf: %s: key '%.*s' is a %s, expected %s (offset %llu)", f->path,
                     (int)(kv->key.len > 200 ? 200 : kv->key.len), kv->key.ptr, gguf_vtype_name(kv->value.type),
                     expected, (unsigned long long)kv->offset);
}

/* Integer value of kv as a signed 128-bit-free pair: *neg set when negative. */
static bool kv_integer(const gguf_kv *kv, bool *neg, uint64_t *mag) {
    switch (kv->value.type) {
    case GGUF_VT_U8: case GGUF_VT_U16: case GGUF_VT_U32: case GGUF_VT_U64:
        *neg = false; *mag = kv->value.v.u; return true;
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64:
        *neg = kv->value.v.i < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)kv->value.v.i : (uint64_t)kv->value.v.i;
        return true;
    default: return false;
    }
}

kiln_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv;
    KILN_TRY(find_or_fail(f, key, &kv));
    bool neg;
    uint64_t mag;
    if (!kv_integer(kv, &neg, &mag)) return type_fail(f, kv, "an integer");
    if (neg || mag > UINT32_MAX)
        return kiln_fail(KILN_ERR_FORMAT, "gguf: %s: key '%s' value %s%llu does not fit a u32 (offset %llu)",
                         f->path, key, neg ? "-" : "", (unsigned long long)mag, (unsigned long long)kv->offset);
    *out = (uint32_t)mag;
    return KILN_OK;
}

kiln_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv;
    KILN_TRY(find_or_fail(f, key, &kv));
    bool neg;
    uint64_t mag;
    if (!kv_integer(kv, &neg, &mag)) return type_fail(f, kv, "an integer");
    if (!neg && mag > (uint64_t)INT64_MAX)
        return kiln_fail(KILN_ERR_FORMAT, "gguf: %s: key '%s' value %llu does not fit an i64 (offset %llu)",
                         f->path, key, (unsigned long long)mag, (unsigned long long)kv->offset);
    *out = neg ? kv->value.v.i : (int64_t)mag;
    return KILN_OK;
}

kiln_status gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv;
    KILN_TRY(find_or_fail(f, key, &kv));
    if (kv->value.type != GGUF_VT_F32 && kv->value.type != GGUF_VT_F64) return type_fail(f, kv, "a float");
    *out = (float)kv->value.v.f;
    return KILN_OK;
}

kiln_status gguf_get_bool(const gguf_file *f, const char *key, bool *out) {
    const gguf_kv *kv;
    KILN_TRY(find_or_fail(f, key, &kv));
    if (kv->value.type != GGUF_VT_BOOL) return type_fail(f, kv, "a bool");
    *out = kv->value.v.u != 0;
    return KILN_OK;
}

kiln_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv;
    KILN_TRY(find_or_fail(f, key, &kv));
    if (kv->value.type != GGUF_VT_STRING) return type_fail(f, kv, "a string");
    *out = kv->value.v.str;
    return KILN_OK;
}

kiln_status gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype elem, gguf_arr *out) {
    const gguf_kv *kv;
    KILN_TRY(find_or_fail(f, key, &kv));
    if (kv->value.type != GGUF_VT_ARRAY) return type_fail(f, kv, "an array");
    if (elem != GGUF_VT_COUNT && kv->value.v.arr.elem != elem)
        return kiln_fail(KILN_ERR_FORMAT, "gguf: %s: key '%s' is an array of %s, expected an array of %s (offset %llu)",
                         f->path, key, gguf_vtype_name(kv->value.v.arr.elem), gguf_vtype_name(elem),
                         (unsigned long long)kv->offset);
    *out = kv->value.v.arr;
    return KILN_OK;
}
