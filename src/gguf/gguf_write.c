/*
 * gguf_write.c — the GGUF writer: collects metadata (each value kept pre-encoded in its on-disk form) and
 * tensor descriptions, then streams a GGUF v3 file: header, metadata, tensor table, padding to the
 * alignment (general.alignment or 32), and each tensor's bytes padded to the alignment. The file is
 * written to PATH.tmp and renamed over PATH only when everything succeeded; on failure the tmp is removed.
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "formats/formats.h"

typedef struct wkv {
    char *key;
    size_t key_len;
    uint8_t *enc;        /* u32 type + value, exactly as on disk */
    size_t enc_len;
} wkv;

typedef struct wtensor {
    char *name;
    size_t name_len;
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
    const void *data;
} wtensor;

struct gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
};

/* ---------------------------------------------------------------- encoding buffer */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
    bool failed;
} buf;

static void buf_put(buf *b, const void *src, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        uint8_t *np = kiln_realloc(b->p, cap);
        if (!np) { b->failed = true; return; }
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void buf_u32(buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(buf *b, uint64_t v) { buf_put(b, &v, 8); }

static const uint8_t elem_size[GGUF_VT_COUNT] = {
    [GGUF_VT_U8] = 1, [GGUF_VT_I8] = 1, [GGUF_VT_U16] = 2, [GGUF_VT_I16] = 2, [GGUF_VT_U32] = 4,
    [GGUF_VT_I32] = 4, [GGUF_VT_F32] = 4, [GGUF_VT_BOOL] = 1, [GGUF_VT_U64] = 8, [GGUF_VT_I64] = 8,
    [GGUF_VT_F64] = 8,
};

/* ---------------------------------------------------------------- writer lifetime */

kiln_status gguf_writer_open(gguf_writer **out) {
    KILN_ASSERT(out);
    *out = kiln_calloc(1, sizeof **out);
    if (!*out) return kiln_fail(KILN_ERR_NOMEM, "gguf writer: out of memory");
    return KILN_OK;
}

void gguf_writer_close(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        kiln_free(w->kvs[i].key);
        kiln_free(w->kvs[i].enc);
    }
    for (size_t i = 0; i < w->n_tensors; i++) kiln_free(w->tensors[i].name);
    kiln_free(w->kvs);
    kiln_free(w->tensors);
    kiln_free(w);
}

/* ---------------------------------------------------------------- metadata */

static wkv *find_kv(gguf_writer *w, const char *key, size_t n) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (w->kvs[i].key_len == n && !memcmp(w->kvs[i].key, key, n)) return &w->kvs[i];
    return NULL;
}

/* Stores the encoded value of key (takes ownership of b->p), replacing an existing one in place. */
static kiln_status put_kv(gguf_writer *w, const char *key, buf *b) {
    KILN_ASSERT(w && key);
    size_t n = strlen(key);
    if (b->failed) {
        kiln_free(b->p);
        return kiln_fail(KILN_ERR_NOMEM, "gguf writer: key '%s': out of memory", key);
    }
    if (n == 0 || n > GGUF_MAX_KEY_LEN) {
        kiln_free(b->p);
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key length %zu is not in [1, %d]", n, GGUF_MAX_KEY_LEN);
    }
    wkv *kv = find_kv(w, key, n);
    if (kv) {
        kiln_free(kv->enc);
        kv->enc = b->p;
        kv->enc_len = b->n;
        return KILN_OK;
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *np = kiln_realloc(w->kvs, cap * sizeof *np);
        if (!np) { kiln_free(b->p); return kiln_fail(KILN_ERR_NOMEM, "gguf writer: key '%s': out of memory", key); }
        w->kvs = np;
        w->cap_kv = cap;
    }
    char *k = kiln_strndup(key, n);
    if (!k) { kiln_free(b->p); return kiln_fail(KILN_ERR_NOMEM, "gguf writer: key '%s': out of memory", key); }
    w->kvs[w->n_kv++] = (wkv){k, n, b->p, b->n};
    return KILN_OK;
}

static kiln_status set_scalar(gguf_writer *w, const char *key, gguf_vtype t, const void *v) {
    buf b = {0};
    buf_u32(&b, t);
    buf_put(&b, v, elem_size[t]);
    return put_kv(w, key, &b);
}

kiln_status gguf_set_u8(gguf_writer *w, const char *key, uint8_t v) { return set_scalar(w, key, GGUF_VT_U8, &v); }
kiln_status gguf_set_i8(gguf_writer *w, const char *key, int8_t v) { return set_scalar(w, key, GGUF_VT_I8, &v); }
kiln_status gguf_set_u16(gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, GGUF_VT_U16, &v); }
kiln_status gguf_set_i16(gguf_writer *w, const char *key, int16_t v) { return set_scalar(w, key, GGUF_VT_I16, &v); }
kiln_status gguf_set_u32(gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, GGUF_VT_U32, &v); }
kiln_status gguf_set_i32(gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, GGUF_VT_I32, &v); }
kiln_status gguf_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, GGUF_VT_U64, &v); }
kiln_status gguf_set_i64(gguf_writer *w, const char *key, int64_t v) { return set_scalar(w, key, GGUF_VT_I64, &v); }
kiln_status gguf_set_f32(gguf_writer *w, const char *key, float v) { return set_scalar(w, key, GGUF_VT_F32, &v); }
kiln_status gguf_set_f64(gguf_writer *w, const char *key, double v) { return set_scalar(w, key, GGUF_VT_F64, &v); }
kiln_status gguf_set_bool(gguf_writer *w, const char *key, bool v) {
    uint8_t x = v ? 1 : 0;
    return set_scalar(w, key, GGUF_VT_BOOL, &x);
}

kiln_status gguf_set_str(gguf_writer *w, const char *key, const char *s, size_t len) {
    KILN_ASSERT(s || len == 0);
    if (len > GGUF_MAX_STRING)
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key '%s': string of %zu bytes exceeds the limit", key, len);
    buf b = {0};
    buf_u32(&b, GGUF_VT_STRING);
    buf_u64(&b, len);
    buf_put(&b, s, len);
    return put_kv(w, key, &b);
}

kiln_status gguf_set_arr_data(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n) {
    if ((unsigned)elem >= GGUF_VT_COUNT || elem == GGUF_VT_STRING || elem == GGUF_VT_ARRAY)
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key '%s': array element type %s is not a scalar",
                         key, gguf_vtype_name(elem));
    KILN_ASSERT(data || n == 0);
    size_t bytes;
    if (n > SIZE_MAX || !kiln_mul_size((size_t)n, elem_size[elem], &bytes))
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key '%s': array of %llu overflows", key,
                         (unsigned long long)n);
    buf b = {0};
    buf_u32(&b, GGUF_VT_ARRAY);
    buf_u32(&b, elem);
    buf_u64(&b, n);
    buf_put(&b, data, bytes);
    return put_kv(w, key, &b);
}

kiln_status gguf_set_arr_str(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n) {
    KILN_ASSERT(strs || n == 0);
    buf b = {0};
    buf_u32(&b, GGUF_VT_ARRAY);
    buf_u32(&b, GGUF_VT_STRING);
    buf_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        if (strs[i].len > GGUF_MAX_STRING) {
            kiln_free(b.p);
            return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key '%s': string %llu of %llu bytes exceeds the limit",
                             key, (unsigned long long)i, (unsigned long long)strs[i].len);
        }
        buf_u64(&b, strs[i].len);
        buf_put(&b, strs[i].ptr, (size_t)strs[i].len);
    }
    return put_kv(w, key, &b);
}

/* Bytes of an array's elements as encoded in its source file (after the elem/n header). */
static uint64_t arr_body_bytes(const gguf_arr *a) {
    if (a->n == 0) return 0;
    if (a->elem == GGUF_VT_STRING) {
        gguf_str last = gguf_arr_str(a, a->n - 1);
        return a->offsets[a->n - 1] + 8 + last.len;
    }
    if (a->elem == GGUF_VT_ARRAY) {
        gguf_arr last = gguf_arr_sub(a, a->n - 1);
        return a->offsets[a->n - 1] + 12 + arr_body_bytes(&last);
    }
    return a->n * elem_size[a->elem];
}

kiln_status gguf_set_value(gguf_writer *w, const char *key, const gguf_value *v) {
    switch (v->type) {
    case GGUF_VT_U8: return gguf_set_u8(w, key, (uint8_t)v->v.u);
    case GGUF_VT_I8: return gguf_set_i8(w, key, (int8_t)v->v.i);
    case GGUF_VT_U16: return gguf_set_u16(w, key, (uint16_t)v->v.u);
    case GGUF_VT_I16: return gguf_set_i16(w, key, (int16_t)v->v.i);
    case GGUF_VT_U32: return gguf_set_u32(w, key, (uint32_t)v->v.u);
    case GGUF_VT_I32: return gguf_set_i32(w, key, (int32_t)v->v.i);
    case GGUF_VT_U64: return gguf_set_u64(w, key, v->v.u);
    case GGUF_VT_I64: return gguf_set_i64(w, key, v->v.i);
    case GGUF_VT_F32: return gguf_set_f32(w, key, (float)v->v.f);
    case GGUF_VT_F64: return gguf_set_f64(w, key, v->v.f);
    case GGUF_VT_BOOL: return gguf_set_bool(w, key, v->v.u != 0);
    case GGUF_VT_STRING: return gguf_set_str(w, key, v->v.str.ptr, (size_t)v->v.str.len);
    case GGUF_VT_ARRAY: {
        const gguf_arr *a = &v->v.arr;
        if ((unsigned)a->elem >= GGUF_VT_COUNT)
            return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key '%s': bad array element type %u", key, a->elem);
        if ((a->elem == GGUF_VT_STRING || a->elem == GGUF_VT_ARRAY) && a->n && !a->offsets)
            return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key '%s': array of %s without an offsets table",
                             key, gguf_vtype_name(a->elem));
        uint64_t body = arr_body_bytes(a);
        buf b = {0};
        buf_u32(&b, GGUF_VT_ARRAY);
        buf_u32(&b, a->elem);
        buf_u64(&b, a->n);
        buf_put(&b, a->data, (size_t)body);
        return put_kv(w, key, &b);
    }
    default:
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: key '%s': bad value type %u", key, v->type);
    }
}

kiln_status gguf_remove_key(gguf_writer *w, const char *key) {
    wkv *kv = find_kv(w, key, strlen(key));
    if (!kv) return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: no key '%s' to remove", key);
    kiln_free(kv->key);
    kiln_free(kv->enc);
    size_t i = (size_t)(kv - w->kvs);
    memmove(&w->kvs[i], &w->kvs[i + 1], (w->n_kv - i - 1) * sizeof *kv);
    w->n_kv--;
    return KILN_OK;
}

/* ---------------------------------------------------------------- tensors */

kiln_status gguf_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const uint64_t *ne, const void *data) {
    KILN_ASSERT(w && name && ne);
    size_t n = strlen(name);
    if (n == 0 || n > GGUF_MAX_KEY_LEN)
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor name length %zu is not in [1, %d]", n,
                         GGUF_MAX_KEY_LEN);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].name_len == n && !memcmp(w->tensors[i].name, name, n))
            return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor '%s' added twice", name);
    const kiln_type_info *ti = kiln_type_get(type);
    if (!ti) return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor '%s': unknown type %u", name, type);
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor '%s': n_dims %u is not in [1, %d]", name,
                         n_dims, GGUF_MAX_DIMS);
    wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t count = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || __builtin_mul_overflow(count, t.ne[d], &count) || count > (uint64_t)INT64_MAX)
            return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor '%s': dimension %u (%llu) is zero or overflows",
                             name, d, (unsigned long long)t.ne[d]);
    }
    if (t.ne[0] % ti->block_size)
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor '%s': row length %llu is not a multiple of the %s block size %u",
                         name, (unsigned long long)t.ne[0], ti->name, ti->block_size);
    uint64_t row;
    if (__builtin_mul_overflow(t.ne[0] / ti->block_size, (uint64_t)ti->type_size, &row) ||
        __builtin_mul_overflow(row, count / t.ne[0], &t.nbytes))
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor '%s': byte size overflows", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        wtensor *np = kiln_realloc(w->tensors, cap * sizeof *np);
        if (!np) return kiln_fail(KILN_ERR_NOMEM, "gguf writer: tensor '%s': out of memory", name);
        w->tensors = np;
        w->cap_tensors = cap;
    }
    t.name = kiln_strndup(name, n);
    if (!t.name) return kiln_fail(KILN_ERR_NOMEM, "gguf writer: tensor '%s': out of memory", name);
    t.name_len = n;
    w->tensors[w->n_tensors++] = t;
    return KILN_OK;
}

/* ---------------------------------------------------------------- writing */

/* The alignment to use: general.alignment when set to a power-of-two u32, else the default. */
static kiln_status writer_alignment(gguf_writer *w, uint64_t *out) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    wkv *kv = find_kv(w, "general.alignment", strlen("general.alignment"));
    if (!kv) return KILN_OK;
    uint32_t type, a;
    memcpy(&type, kv->enc, 4);
    if (type != GGUF_VT_U32)
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: general.alignment must be a u32, not a %s",
                         gguf_vtype_name((gguf_vtype)type));
    memcpy(&a, kv->enc + 4, 4);
    if (a == 0 || (a & (a - 1)) || a > (1u << 30))
        return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: general.alignment %u is not a power of two in [1, 2^30]", a);
    *out = a;
    return KILN_OK;
}

static kiln_status put(FILE *fp, const char *tmp, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, fp) != n)
        return kiln_fail(KILN_ERR_IO, "gguf writer: %s: write failed: %s", tmp, strerror(errno));
    return KILN_OK;
}

static kiln_status pad(FILE *fp, const char *tmp, uint64_t pos, uint64_t align) {
    static const uint8_t zeros[4096];
    uint64_t n = (align - pos % align) % align;
    while (n) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        KILN_TRY(put(fp, tmp, zeros, k));
        n -= k;
    }
    return KILN_OK;
}

static kiln_status write_body(gguf_writer *w, FILE *fp, const char *tmp, uint64_t align, gguf_tensor_data_fn fn,
                              void *ctx) {
    uint64_t pos = 0, u64;
    uint32_t u32 = GGUF_MAGIC;
    KILN_TRY(put(fp, tmp, &u32, 4));
    u32 = 3;
    KILN_TRY(put(fp, tmp, &u32, 4));
    u64 = w->n_tensors;
    KILN_TRY(put(fp, tmp, &u64, 8));
    u64 = w->n_kv;
    KILN_TRY(put(fp, tmp, &u64, 8));
    pos = 24;
    for (size_t i = 0; i < w->n_kv; i++) {
        u64 = w->kvs[i].key_len;
        KILN_TRY(put(fp, tmp, &u64, 8));
        KILN_TRY(put(fp, tmp, w->kvs[i].key, w->kvs[i].key_len));
        KILN_TRY(put(fp, tmp, w->kvs[i].enc, w->kvs[i].enc_len));
        pos += 8 + w->kvs[i].key_len + w->kvs[i].enc_len;
    }
    uint64_t off = 0, max_bytes = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        t->offset = off;
        off += (t->nbytes + align - 1) / align * align;
        if (t->nbytes > max_bytes) max_bytes = t->nbytes;
        if (!t->data && !fn)
            return kiln_fail(KILN_ERR_INVALID_ARG, "gguf writer: tensor '%s' has no data and no callback was given",
                             t->name);
        u64 = t->name_len;
        KILN_TRY(put(fp, tmp, &u64, 8));
        KILN_TRY(put(fp, tmp, t->name, t->name_len));
        KILN_TRY(put(fp, tmp, &t->n_dims, 4));
        KILN_TRY(put(fp, tmp, t->ne, 8 * t->n_dims));
        KILN_TRY(put(fp, tmp, &t->type, 4));
        KILN_TRY(put(fp, tmp, &t->offset, 8));
        pos += 8 + t->name_len + 4 + 8 * t->n_dims + 4 + 8;
    }
    if (w->n_tensors == 0) return KILN_OK;
    KILN_TRY(pad(fp, tmp, pos, align));
    void *scratch = NULL;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < w->n_tensors && st == KILN_OK; i++) {
        wtensor *t = &w->tensors[i];
        const void *src = t->data;
        if (!src) {
            if (!scratch) {
                scratch = kiln_aligned_alloc(64, (size_t)max_bytes);
                if (!scratch) { st = kiln_fail(KILN_ERR_NOMEM, "gguf writer: cannot allocate %llu bytes",
                                               (unsigned long long)max_bytes); break; }
            }
            st = fn(ctx, i, scratch, t->nbytes);
            if (st) { kiln_fail_prefix(st, "gguf writer: tensor '%s': ", t->name); break; }
            src = scratch;
        }
        st = put(fp, tmp, src, (size_t)t->nbytes);
        if (!st) st = pad(fp, tmp, t->nbytes, align);
    }
    kiln_free(scratch);
    return st;
}

kiln_status gguf_writer_write(gguf_writer *w, const char *path, gguf_tensor_data_fn fn, void *ctx) {
    KILN_ASSERT(w && path);
    uint64_t align;
    KILN_TRY(writer_alignment(w, &align));
    size_t n = strlen(path);
    char *tmp = kiln_malloc(n + 5);
    if (!tmp) return kiln_fail(KILN_ERR_NOMEM, "gguf writer: out of memory");
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        kiln_status st = kiln_fail(KILN_ERR_IO, "gguf writer: cannot create %s: %s", tmp, strerror(errno));
        kiln_free(tmp);
        return st;
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    kiln_status st = write_body(w, fp, tmp, align, fn, ctx);
    if (fflush(fp) != 0 && st == KILN_OK)
        st = kiln_fail(KILN_ERR_IO, "gguf writer: %s: write failed: %s", tmp, strerror(errno));
    /* the bytes reach the disk before the rename makes them the file at PATH (a crash leaves the old file or
     * the new one, never a renamed empty one) */
    if (st == KILN_OK && fsync(fileno(fp)) != 0)
        st = kiln_fail(KILN_ERR_IO, "gguf writer: %s: fsync failed: %s", tmp, strerror(errno));
    if (fclose(fp) != 0 && st == KILN_OK)
        st = kiln_fail(KILN_ERR_IO, "gguf writer: %s: close failed: %s", tmp, strerror(errno));
    if (st == KILN_OK && rename(tmp, path) != 0)
        st = kiln_fail(KILN_ERR_IO, "gguf writer: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != KILN_OK) unlink(tmp);
    kiln_free(tmp);
    return st;
}
