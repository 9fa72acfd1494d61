/*
 * test_gguf_corrupt.c — the GGUF reader against damaged input.
 *  - Hand-built files that break one rule each: bad magic and version, huge counts and lengths, nesting
 *    depth, duplicates, bad tensor types, dims, overflowing sizes, offsets, overlap, alignment.
 *  - Systematic damage to every shared GGUF: truncation at every 64th byte of the header/metadata/tensor-table
 *    region (sampled beyond 128 KiB: the first 32 KiB and the last 8 KiB in full plus ~128 random points) and
 *    at random points after it; random byte flips; huge values in every count and length field.
 * Every case must return a clear error naming the field (key or tensor) and the byte offset. ASan/UBSan watch
 * for any stray read: the bytes after a truncation point are poisoned, so the reader cannot peek past the end
 * it was given.
 */
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/formats.h"
#include "gguf/gguf.h"
#include "test.h"

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif
#ifdef HAVE_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* ---------------------------------------------------------------- a raw GGUF builder */

typedef struct rb { uint8_t *p; size_t n, cap; } rb;

static void rb_put(rb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void rb_u8(rb *b, uint8_t v) { rb_put(b, &v, 1); }
static void rb_u32(rb *b, uint32_t v) { rb_put(b, &v, 4); }
static void rb_u64(rb *b, uint64_t v) { rb_put(b, &v, 8); }
static void rb_str(rb *b, const char *s) { rb_u64(b, strlen(s)); rb_put(b, s, strlen(s)); }
static void rb_hdr(rb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    rb_u32(b, GGUF_MAGIC);
    rb_u32(b, version);
    rb_u64(b, n_tensors);
    rb_u64(b, n_kv);
}
static void rb_kv_u32(rb *b, const char *key, uint32_t v) { rb_str(b, key); rb_u32(b, GGUF_VT_U32); rb_u32(b, v); }
static void rb_kv_str(rb *b, const char *key, const char *v) { rb_str(b, key); rb_u32(b, GGUF_VT_STRING); rb_str(b, v); }
static void rb_tensor(rb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    rb_str(b, name);
    rb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) rb_u64(b, ne[d]);
    rb_u32(b, type);
    rb_u64(b, off);
}
static void rb_pad(rb *b, size_t align) { while (b->n % align) rb_u8(b, 0); }
static void rb_zeros(rb *b, size_t n) { for (size_t i = 0; i < n; i++) rb_u8(b, 0); }

/* Parses exactly b->n bytes (a fresh heap copy, so ASan sees the end); returns the status. */
static kiln_status parse_rb(const rb *b, gguf_file **out) {
    uint8_t *copy = malloc(b->n ? b->n : 1);
    memcpy(copy, b->p, b->n);
    gguf_file *f = NULL;
    kiln_status st = gguf_open_memory(copy, b->n, "crafted.gguf", &f);
    if (out) *out = f;   /* the caller keeps copy alive through the leak below only while using f */
    if (!out) gguf_close(f);
    if (!out || !f) free(copy);
    return st;
}

/* The crafted file must fail with status st and a message containing each needle and "(offset OFF)". */
#define EXPECT_FAIL(b, st, off, ...) expect_fail(__LINE__, b, st, off, (const char *[]){__VA_ARGS__, NULL})
static void expect_fail(int line, rb *b, kiln_status st, long long off, const char **needles) {
    kiln_status got = parse_rb(b, NULL);
    const char *msg = kiln_last_error();
    if (got != st) test_failf(__FILE__, line, "status %s, expected %s: %s", kiln_status_name(got), kiln_status_name(st), msg);
    if (strncmp(msg, "gguf: crafted.gguf: ", 20)) test_failf(__FILE__, line, "message lacks the file name: %s", msg);
    for (const char **n = needles; *n; n++)
        if (!strstr(msg, *n)) test_failf(__FILE__, line, "message lacks \"%s\": %s", *n, msg);
    if (off >= 0) {
        char o[64];
        snprintf(o, sizeof o, "(offset %lld)", off);
        if (!strstr(msg, o)) test_failf(__FILE__, line, "message lacks \"%s\": %s", o, msg);
    }
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* A valid two-tensor file (F32 [8], Q4_0 [32 x 2]) with one key, for the tests to damage. */
static size_t good_file(rb *b, uint32_t version) {
    uint64_t ne_a[1] = {8}, ne_b[2] = {32, 2};
    rb_hdr(b, version, 2, 1);
    rb_kv_str(b, "general.architecture", "llama");
    rb_tensor(b, "a", 1, ne_a, KILN_TYPE_F32, 0);
    rb_tensor(b, "b", 2, ne_b, KILN_TYPE_Q4_0, 32);
    size_t data = (b->n + 31) / 32 * 32;
    rb_pad(b, 32);
    rb_zeros(b, 32 + 36);
    return data;
}

TEST(gguf_crafted_valid_v2_v3) {
    for (uint32_t v = 2; v <= 3; v++) {
        rb b = {0};
        size_t data = good_file(&b, v);
        gguf_file *f;
        REQUIRE_OK(parse_rb(&b, &f));
        CHECK_EQ_INT(gguf_version(f), v);
        CHECK_EQ_INT(gguf_data_offset(f), data);
        const gguf_tensor *t = gguf_find_tensor(f, "b");
        REQUIRE(t);
        CHECK_EQ_INT(t->nbytes, 36);
        CHECK_EQ_INT(t->ne[1], 2);
        CHECK_EQ_INT(t->ne[2], 1);
        CHECK(gguf_find_tensor(f, "c") == NULL);
        free((void *)gguf_base(f));
        gguf_close(f);
        free(b.p);
    }
}

TEST(gguf_crafted_header_errors) {
    rb b = {0};
    rb_u32(&b, GGUF_MAGIC);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 0, "smaller than a GGUF header");
    rb_u32(&b, 0x4c4d4747); rb_u32(&b, 3); rb_u64(&b, 0); rb_u64(&b, 0);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 0, "header", "bad magic");
    rb_hdr(&b, 1, 0, 0);
    EXPECT_FAIL(&b, KILN_ERR_UNSUPPORTED, 4, "version 1");
    rb_hdr(&b, 4, 0, 0);
    EXPECT_FAIL(&b, KILN_ERR_UNSUPPORTED, 4, "version 4");
    rb_hdr(&b, 0x03000000, 0, 0);
    EXPECT_FAIL(&b, KILN_ERR_UNSUPPORTED, 4, "big-endian");
    rb_hdr(&b, 3, 0, UINT64_MAX);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 16, "key count 18446744073709551615");
    rb_hdr(&b, 3, UINT64_MAX, 0);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 8, "tensor count");
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "k"); rb_u32(&b, GGUF_VT_U8);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 37, "key 'k'", "u8 value needs 1 bytes but only 0 are left");
}

TEST(gguf_crafted_metadata_errors) {
    rb b = {0};
    /* key length huge */
    rb_hdr(&b, 3, 0, 1); rb_u64(&b, 0xffffffffull); rb_zeros(&b, 16);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24, "key #0", "length 4294967295");
    /* empty key */
    rb_hdr(&b, 3, 0, 1); rb_str(&b, ""); rb_u32(&b, GGUF_VT_U8); rb_u8(&b, 1);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24, "key #0", "empty");
    /* string value length beyond the file */
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "general.name"); rb_u32(&b, GGUF_VT_STRING); rb_u64(&b, 4294967295ull); rb_zeros(&b, 4);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 8 + 12 + 4, "key 'general.name'", "string value length 4294967295 exceeds the 4 bytes left");
    /* string array element length beyond the file */
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "tokenizer.ggml.tokens"); rb_u32(&b, GGUF_VT_ARRAY); rb_u32(&b, GGUF_VT_STRING);
    rb_u64(&b, 3); rb_str(&b, "a"); rb_u64(&b, UINT64_MAX); rb_zeros(&b, 8);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 8 + 21 + 4 + 12 + 9, "key 'tokenizer.ggml.tokens'", "string 1 length 18446744073709551615");
    /* scalar array whose length × element size overflows */
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "x"); rb_u32(&b, GGUF_VT_ARRAY); rb_u32(&b, GGUF_VT_U64);
    rb_u64(&b, 1ull << 61); rb_zeros(&b, 16);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 9 + 4 + 4, "key 'x'", "array of 2305843009213693952 u64");
    /* unknown value type, unknown element type, bad bool */
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "x"); rb_u32(&b, 13); rb_zeros(&b, 8);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 9, "key 'x'", "value type 13");
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "x"); rb_u32(&b, GGUF_VT_ARRAY); rb_u32(&b, 99); rb_u64(&b, 0);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 13, "key 'x'", "element type 99");
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "x"); rb_u32(&b, GGUF_VT_BOOL); rb_u8(&b, 2);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 13, "key 'x'", "bool");
    /* duplicate keys */
    rb_hdr(&b, 3, 0, 2); rb_kv_u32(&b, "a.b", 1); rb_kv_u32(&b, "a.b", 2);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 19, "key 'a.b'", "duplicate key (first at offset 24)");
    /* non-printable key bytes are escaped in messages */
    rb_hdr(&b, 3, 0, 1); rb_str(&b, "k\n"); rb_u32(&b, 77);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, -1, "key 'k\\x0a'");
    /* general.alignment: not a power of two, zero, wrong type */
    rb_hdr(&b, 3, 0, 1); rb_kv_u32(&b, "general.alignment", 48);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24, "key 'general.alignment'", "48 is not a power of two");
    rb_hdr(&b, 3, 0, 1); rb_kv_u32(&b, "general.alignment", 0);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24, "key 'general.alignment'", "alignment 0");
    rb_hdr(&b, 3, 0, 1); rb_kv_str(&b, "general.alignment", "32");
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24, "key 'general.alignment'", "is a string");
}

/* n nested arrays around a u8 array of one element. */
static void rb_nested(rb *b, int depth) {
    for (int d = 1; d < depth; d++) { rb_u32(b, GGUF_VT_ARRAY); rb_u64(b, 1); }
    rb_u32(b, GGUF_VT_U8);
    rb_u64(b, 1);
    rb_u8(b, 42);
}

TEST(gguf_crafted_nested_arrays) {
    /* depth GGUF_MAX_ARRAY_DEPTH parses and reads back through gguf_arr_sub */
    rb b = {0};
    rb_hdr(&b, 3, 0, 2);
    rb_str(&b, "deep"); rb_u32(&b, GGUF_VT_ARRAY); rb_nested(&b, GGUF_MAX_ARRAY_DEPTH);
    /* [[ "x", "yz" ], [], [[1, 2]]] : arrays of different element types */
    rb_str(&b, "mixed"); rb_u32(&b, GGUF_VT_ARRAY); rb_u32(&b, GGUF_VT_ARRAY); rb_u64(&b, 3);
    rb_u32(&b, GGUF_VT_STRING); rb_u64(&b, 2); rb_str(&b, "x"); rb_str(&b, "yz");
    rb_u32(&b, GGUF_VT_I32); rb_u64(&b, 0);
    rb_u32(&b, GGUF_VT_ARRAY); rb_u64(&b, 1); rb_u32(&b, GGUF_VT_I16); rb_u64(&b, 2); rb_u32(&b, 0xfffe0001u);
    gguf_file *f;
    REQUIRE_OK(parse_rb(&b, &f));
    gguf_arr a;
    REQUIRE_OK(gguf_get_arr(f, "deep", GGUF_VT_ARRAY, &a));
    for (int d = 1; d < GGUF_MAX_ARRAY_DEPTH; d++) {
        REQUIRE(a.elem == GGUF_VT_ARRAY && a.n == 1);
        a = gguf_arr_sub(&a, 0);
    }
    CHECK_EQ_INT(a.elem, GGUF_VT_U8);
    CHECK_EQ_INT(gguf_arr_i64(&a, 0), 42);
    REQUIRE_OK(gguf_get_arr(f, "mixed", GGUF_VT_ARRAY, &a));
    REQUIRE(a.n == 3);
    gguf_arr s0 = gguf_arr_sub(&a, 0), s1 = gguf_arr_sub(&a, 1), s2 = gguf_arr_sub(&a, 2);
    REQUIRE(s0.elem == GGUF_VT_STRING && s0.n == 2);
    CHECK(gguf_str_eq(gguf_arr_str(&s0, 0), "x"));
    CHECK(gguf_str_eq(gguf_arr_str(&s0, 1), "yz"));
    CHECK(s1.elem == GGUF_VT_I32 && s1.n == 0);
    REQUIRE(s2.elem == GGUF_VT_ARRAY && s2.n == 1);
    gguf_arr s20 = gguf_arr_sub(&s2, 0);
    REQUIRE(s20.elem == GGUF_VT_I16 && s20.n == 2);
    CHECK_EQ_INT(gguf_arr_i64(&s20, 0), 1);
    CHECK_EQ_INT(gguf_arr_i64(&s20, 1), -2);
    CHECK(gguf_arr_f64(&s20, 1) == -2.0);
    /* the writer copies nested arrays and they read back equal */
    gguf_writer *w;
    REQUIRE_OK(gguf_writer_open(&w));
    for (size_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        CHECK_OK(gguf_set_value(w, key, &kv->value));
    }
    char path[512];
    snprintf(path, sizeof path, "%s/nested.gguf", test_tmpdir());
    CHECK_OK(gguf_writer_write(w, path, NULL, NULL));
    gguf_writer_close(w);
    size_t n;
    char *bytes = test_read_file(path, &n);
    CHECK(bytes && n == b.n && !memcmp(bytes, b.p, n)); /* the same bytes as the hand-built file */
    free(bytes);
    free((void *)gguf_base(f));
    gguf_close(f);
    free(b.p);
    memset(&b, 0, sizeof b);

    /* one level deeper fails, naming the key and the depth */
    rb_hdr(&b, 3, 0, 1);
    rb_str(&b, "deep"); rb_u32(&b, GGUF_VT_ARRAY); rb_nested(&b, GGUF_MAX_ARRAY_DEPTH + 1);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 12 + 4 + 12 * GGUF_MAX_ARRAY_DEPTH, "key 'deep'", "nested deeper than 8");
    /* an array of 2^40 arrays cannot fit */
    rb_hdr(&b, 3, 0, 1);
    rb_str(&b, "x"); rb_u32(&b, GGUF_VT_ARRAY); rb_u32(&b, GGUF_VT_ARRAY); rb_u64(&b, 1ull << 40); rb_zeros(&b, 24);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 9 + 4 + 4, "key 'x'", "array of 1099511627776 array");
}

TEST(gguf_crafted_tensor_errors) {
    uint64_t ne8[1] = {8}, ne0[2] = {8, 0}, nebig[5] = {1ull << 32, 1ull << 32, 4, 1, 1}, ne33[1] = {33};
    size_t t0 = 24 + 8 + 20 + 4 + 8 + 5; /* first tensor entry, after one string kv "general.architecture"="llama" */
    rb b = {0};
#define FILE_WITH(...) do { rb_hdr(&b, 3, 1, 1); rb_kv_str(&b, "general.architecture", "llama"); __VA_ARGS__; \
                            rb_pad(&b, 32); rb_zeros(&b, 64); } while (0)
    FILE_WITH(rb_tensor(&b, "w", 1, ne8, 4, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8, "tensor 'w'", "unknown tensor type 4");
    FILE_WITH(rb_tensor(&b, "w", 1, ne8, 41, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8, "tensor 'w'", "unknown tensor type 41");
    FILE_WITH(rb_tensor(&b, "w", 0, ne8, 0, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9, "tensor 'w'", "n_dims 0");
    FILE_WITH(rb_tensor(&b, "w", 5, nebig, 0, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9, "tensor 'w'", "n_dims 5");
    FILE_WITH(rb_tensor(&b, "w", 2, ne0, 0, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8, "tensor 'w'", "dimension 1 is 0");
    FILE_WITH(rb_tensor(&b, "w", 3, nebig, 0, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8, "tensor 'w'", "overflow");
    uint64_t ne62[1] = {1ull << 62}; /* 2^62 f32 values: 2^64 bytes, which must not wrap to 0 */
    FILE_WITH(rb_tensor(&b, "w", 1, ne62, KILN_TYPE_F32, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0, "tensor 'w'", "byte size", "overflows");
    FILE_WITH(rb_tensor(&b, "w", 1, ne33, KILN_TYPE_Q4_0, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8, "tensor 'w'", "row length 33", "block size 32");
    FILE_WITH(rb_tensor(&b, "w", 1, ne8, 0, 16));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8 + 4, "tensor 'w'", "offset 16 is not a multiple of the alignment 32");
    FILE_WITH(rb_tensor(&b, "w", 1, ne8, 0, 64));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8 + 4, "tensor 'w'", "outside");
    FILE_WITH(rb_tensor(&b, "w", 1, ne8, 0, UINT64_MAX - 31));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0 + 9 + 4 + 8 + 4, "tensor 'w'", "outside");
    FILE_WITH(rb_tensor(&b, "", 1, ne8, 0, 0));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0, "tensor #0", "name is empty");
    FILE_WITH(rb_u64(&b, 1ull << 40));
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, t0, "tensor #0", "name length 1099511627776");
#undef FILE_WITH
    /* duplicate names and overlapping data (two tensors) */
    uint64_t ne16[1] = {16};
    rb_hdr(&b, 3, 2, 0); rb_tensor(&b, "w", 1, ne8, 0, 0); rb_tensor(&b, "w", 1, ne8, 0, 32);
    rb_pad(&b, 32); rb_zeros(&b, 64);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24 + 33, "tensor 'w'", "duplicate tensor name (first at offset 24)");
    rb_hdr(&b, 3, 2, 0); rb_tensor(&b, "u", 1, ne16, 0, 32); rb_tensor(&b, "v", 1, ne16, 0, 0);
    rb_pad(&b, 32); rb_zeros(&b, 96);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, 24, "tensor 'u'", "overlaps tensor 'v'");
    /* general.alignment 64 is honoured: offsets must be multiples of 64 and the data section moves */
    rb_hdr(&b, 3, 1, 1); rb_kv_u32(&b, "general.alignment", 64); rb_tensor(&b, "w", 1, ne8, 0, 32);
    rb_pad(&b, 64); rb_zeros(&b, 128);
    EXPECT_FAIL(&b, KILN_ERR_FORMAT, -1, "tensor 'w'", "not a multiple of the alignment 64");
    rb_hdr(&b, 3, 1, 1); rb_kv_u32(&b, "general.alignment", 64); rb_tensor(&b, "w", 1, ne8, 0, 64);
    size_t data = (b.n + 63) / 64 * 64;
    rb_pad(&b, 64); rb_zeros(&b, 128);
    gguf_file *f;
    REQUIRE_OK(parse_rb(&b, &f));
    CHECK_EQ_INT(gguf_alignment(f), 64);
    CHECK_EQ_INT(gguf_data_offset(f), data);
    CHECK(gguf_tensor_at(f, 0)->data == gguf_base(f) + data + 64);
    free((void *)gguf_base(f));
    gguf_close(f);
    free(b.p);
}

TEST(gguf_getters_type_errors) {
    rb b = {0};
    rb_hdr(&b, 3, 0, 4);
    rb_kv_str(&b, "s", "hello");
    rb_str(&b, "neg"); rb_u32(&b, GGUF_VT_I32); rb_u32(&b, (uint32_t)-5);
    rb_str(&b, "big"); rb_u32(&b, GGUF_VT_U64); rb_u64(&b, 1ull << 40);
    rb_str(&b, "f"); rb_u32(&b, GGUF_VT_F64); uint64_t bits; double d = 0.25; memcpy(&bits, &d, 8); rb_u64(&b, bits);
    gguf_file *f;
    REQUIRE_OK(parse_rb(&b, &f));
    uint32_t u;
    int64_t i;
    float x;
    bool flag;
    gguf_str s;
    gguf_arr a;
    CHECK_EQ_INT(gguf_get_u32(f, "s", &u), KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "key 's' is a string, expected an integer") != NULL);
    CHECK_EQ_INT(gguf_get_u32(f, "neg", &u), KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "-5 does not fit a u32") != NULL);
    CHECK_EQ_INT(gguf_get_u32(f, "big", &u), KILN_ERR_FORMAT);
    CHECK_OK(gguf_get_i64(f, "big", &i));
    CHECK_EQ_INT(i, 1ll << 40);
    CHECK_OK(gguf_get_i64(f, "neg", &i));
    CHECK_EQ_INT(i, -5);
    CHECK_OK(gguf_get_f32(f, "f", &x));
    CHECK(x == 0.25f);
    CHECK_EQ_INT(gguf_get_bool(f, "f", &flag), KILN_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_str(f, "missing", &s), KILN_ERR_FORMAT);
    CHECK(strstr(kiln_last_error(), "missing key 'missing'") != NULL);
    CHECK_EQ_INT(gguf_get_arr(f, "s", GGUF_VT_STRING, &a), KILN_ERR_FORMAT);
    CHECK_OK(gguf_get_str(f, "s", &s));
    CHECK(gguf_str_eq(s, "hello"));
    free((void *)gguf_base(f));
    gguf_close(f);
    free(b.p);
}

/* ---------------------------------------------------------------- systematic damage to shared files */

#define MAX_FILES 64
static char *shared_files[MAX_FILES];
static int n_shared_files;
static int collect(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)ftw;
    size_t n = strlen(path);
    if (flag == FTW_F && n > 5 && !strcmp(path + n - 5, ".gguf") && n_shared_files < MAX_FILES)
        shared_files[n_shared_files++] = strdup(path);
    return 0;
}
static int cmp_path(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static void collect_shared(void) {
    n_shared_files = 0;
    nftw(test_shared("models"), collect, 16, FTW_PHYS);
    nftw(test_shared("quant"), collect, 16, FTW_PHYS);
    qsort(shared_files, n_shared_files, sizeof *shared_files, cmp_path);
}

typedef struct loaded {
    uint8_t *buf;          /* exactly size bytes */
    size_t size;
    size_t region;         /* header + metadata + tensor table (+ padding) */
    uint64_t data_end;     /* end of the last tensor's data (0 without tensors) */
    gguf_file *ref;        /* the intact parse, over buf2 */
    uint8_t *buf2;
    const char *name;
} loaded;

static bool load(const char *path, loaded *L) {
    memset(L, 0, sizeof *L);
    size_t n;
    char *data = test_read_file(path, &n);
    if (!data) return false;
    L->buf = malloc(n);
    L->buf2 = malloc(n);
    memcpy(L->buf, data, n);
    memcpy(L->buf2, data, n);
    free(data);
    L->size = n;
    const char *slash = strrchr(path, '/');
    L->name = slash ? slash + 1 : path;
    if (gguf_open_memory(L->buf2, n, L->name, &L->ref) != KILN_OK) {
        test_failf(__FILE__, __LINE__, "%s: %s", path, kiln_last_error());
        return false;
    }
    L->region = gguf_data_offset(L->ref) < n ? gguf_data_offset(L->ref) : n;
    for (size_t i = 0; i < gguf_n_tensors(L->ref); i++) {
        const gguf_tensor *t = gguf_tensor_at(L->ref, i);
        uint64_t end = gguf_data_offset(L->ref) + t->offset + t->nbytes;
        if (end > L->data_end) L->data_end = end;
    }
    return true;
}

static void unload(loaded *L) {
    gguf_close(L->ref);
    free(L->buf);
    free(L->buf2);
}

/* A failure message must name the file and a byte offset, and (past the fixed header) a key or tensor. */
static bool clear_message(const loaded *L, const char *msg) {
    char prefix[300];
    snprintf(prefix, sizeof prefix, "gguf: %s: ", L->name);
    if (strncmp(msg, prefix, strlen(prefix)) || !strstr(msg, "(offset ")) return false;
    const char *what = msg + strlen(prefix);
    return !strncmp(what, "header: ", 8) || !strncmp(what, "key '", 5) || !strncmp(what, "key #", 5) ||
           !strncmp(what, "tensor '", 8) || !strncmp(what, "tensor #", 8);
}

/* Parses the first len bytes of L->buf with the rest poisoned. */
static kiln_status parse_prefix(loaded *L, size_t len) {
    POISON(L->buf + len, L->size - len);
    gguf_file *f = NULL;
    kiln_status st = gguf_open_memory(L->buf, len, L->name, &f);
    UNPOISON(L->buf + len, L->size - len);
    gguf_close(f);
    return st;
}

/* Truncation points of the header region: every 64th byte, sampled when the region is over 128 KiB (the first
 * 32 KiB and the last 8 KiB in full — the header/first keys and the tensor table / last array — plus ~128
 * random ones). */
TEST(gguf_corrupt_truncate_shared_files) {
    collect_shared();
    REQUIRE(n_shared_files >= 25);
    uint64_t rng = 0x5eed;
    long cases = 0;
    for (int k = 0; k < n_shared_files; k++) {
        loaded L;
        if (!load(shared_files[k], &L)) continue;
        size_t head = 32 * 1024, tail = 8 * 1024; /* a cut near the end costs a whole parse */
        for (size_t cut = 0; cut < L.region; cut += 64) {
            bool take = L.region <= 128 * 1024 || cut < head || cut + tail >= L.region ||
                        test_rand_u64(&rng) % (L.region / 64 / 128 + 1) == 0;
            if (!take) continue;
            kiln_status st = parse_prefix(&L, cut);
            cases++;
            CHECKF(st != KILN_OK, "%s cut at %zu parsed", L.name, cut);
            CHECKF(clear_message(&L, kiln_last_error()), "%s cut at %zu: unclear message: %s", L.name, cut, kiln_last_error());
        }
        /* and right at the end of the region, and at random points in the tensor data */
        for (int r = 0; r < 40 && L.size > L.region; r++) {
            size_t cut = r == 0 ? L.region : L.region + test_rand_u64(&rng) % (L.size - L.region);
            kiln_status st = parse_prefix(&L, cut);
            cases++;
            bool complete = cut >= L.data_end;
            CHECKF((st == KILN_OK) == complete, "%s cut at %zu: %s (data ends at %llu)", L.name, cut,
                   st == KILN_OK ? "parsed" : kiln_last_error(), (unsigned long long)L.data_end);
            if (st != KILN_OK)
                CHECKF(clear_message(&L, kiln_last_error()) && strstr(kiln_last_error(), "tensor '"),
                       "%s cut at %zu: unclear message: %s", L.name, cut, kiln_last_error());
        }
        unload(&L);
    }
    printf("%ld truncations of %d files\n", cases, n_shared_files);
}

/* Offsets of the structural fields (counts, lengths, types, dims, offsets) of a parsed file. */
typedef struct field { uint64_t off; int size; const char *what; } field;

static size_t structural_fields(const loaded *L, field *out, size_t cap) {
    size_t n = 0;
#define ADD(o, s, w) do { if (n < cap) out[n++] = (field){(o), (s), (w)}; } while (0)
    ADD(8, 8, "tensor count");
    ADD(16, 8, "key count");
    for (size_t i = 0; i < gguf_n_kv(L->ref); i++) {
        const gguf_kv *kv = gguf_kv_at(L->ref, i);
        uint64_t type_at = kv->offset + 8 + kv->key.len, val = type_at + 4;
        ADD(kv->offset, 8, "key length");
        ADD(type_at, 4, "value type");
        if (kv->value.type == GGUF_VT_STRING) ADD(val, 8, "string length");
        if (kv->value.type == GGUF_VT_ARRAY) {
            const gguf_arr *a = &kv->value.v.arr;
            ADD(val, 4, "array element type");
            ADD(val + 4, 8, "array length");
            if (a->elem == GGUF_VT_STRING && a->n) {
                uint64_t base = (uint64_t)(a->data - gguf_base(L->ref));
                ADD(base + a->offsets[0], 8, "first string length");
                ADD(base + a->offsets[a->n / 2], 8, "middle string length");
                ADD(base + a->offsets[a->n - 1], 8, "last string length");
            }
        }
    }
    for (size_t i = 0; i < gguf_n_tensors(L->ref); i++) {
        const gguf_tensor *t = gguf_tensor_at(L->ref, i);
        uint64_t o = t->info_offset;
        ADD(o, 8, "tensor name length");
        ADD(o + 8 + t->name.len, 4, "n_dims");
        ADD(o + 12 + t->name.len, 8, "ne[0]");
        ADD(o + 12 + t->name.len + 8ull * t->n_dims, 4, "tensor type");
        ADD(o + 16 + t->name.len + 8ull * t->n_dims, 8, "tensor offset");
    }
#undef ADD
    return n;
}

/* Every count and length field set to huge values must fail with a clear message; for the metadata fields
 * the message names the exact byte offset of the damaged field. */
TEST(gguf_corrupt_huge_counts_and_lengths) {
    collect_shared();
    static field fields[4096];
    const uint64_t huge[] = {UINT64_MAX, 1ull << 63, 0xffffffffull, 1ull << 40};
    long cases = 0;
    for (int k = 0; k < n_shared_files; k++) {
        loaded L;
        if (!load(shared_files[k], &L)) continue;
        size_t nf = structural_fields(&L, fields, 4096);
        for (size_t j = 0; j < nf; j++) {
            field *fd = &fields[j];
            uint8_t saved[8];
            memcpy(saved, L.buf + fd->off, fd->size);
            for (size_t h = 0; h < sizeof huge / sizeof *huge; h++) {
                if (fd->size == 4 && h > 0) break; /* a 4-byte field: one huge value (0xffffffff) */
                uint64_t v = fd->size == 4 ? 0xffffffffull : huge[h];
                memcpy(L.buf + fd->off, &v, fd->size);
                gguf_file *f = NULL;
                kiln_status st = gguf_open_memory(L.buf, L.size, L.name, &f);
                gguf_close(f);
                cases++;
                const char *msg = kiln_last_error();
                CHECKF(st != KILN_OK, "%s: %s at %llu = %llx parsed", L.name, fd->what, (unsigned long long)fd->off,
                       (unsigned long long)v);
                if (st == KILN_OK) continue;
                CHECKF(clear_message(&L, msg), "%s: %s: unclear message: %s", L.name, fd->what, msg);
                bool is_len_or_count = !strstr(fd->what, "type") && strcmp(fd->what, "n_dims") &&
                                       strncmp(fd->what, "ne[", 3) && strcmp(fd->what, "tensor offset");
                if (is_len_or_count) {
                    char o[64];
                    snprintf(o, sizeof o, "(offset %llu)", (unsigned long long)fd->off);
                    CHECKF(strstr(msg, o) != NULL, "%s: %s at %llu: message names another offset: %s", L.name,
                           fd->what, (unsigned long long)fd->off, msg);
                }
            }
            memcpy(L.buf + fd->off, saved, fd->size);
        }
        unload(&L);
    }
    printf("%ld huge-value cases\n", cases);
}

/* Random byte flips in the header region (half on structural fields, half anywhere) must either parse or fail
 * with a clear message; flips confined to tensor data always parse. */
TEST(gguf_corrupt_flip_bytes_shared_files) {
    collect_shared();
    static field fields[4096];
    uint64_t rng = 0xf11b;
    long cases = 0, failed = 0;
    for (int k = 0; k < n_shared_files; k++) {
        loaded L;
        if (!load(shared_files[k], &L)) continue;
        size_t nf = structural_fields(&L, fields, 4096);
        size_t trials = (size_t)(400e6 / (double)L.size);
        if (trials > 400) trials = 400;
        if (trials < 40) trials = 40;
        for (size_t t = 0; t < trials; t++) {
            size_t nflip = 1 + test_rand_u64(&rng) % 4;
            size_t pos[4];
            uint8_t old[4];
            for (size_t j = 0; j < nflip; j++) {
                if (test_rand_u64(&rng) & 1) {
                    field *fd = &fields[test_rand_u64(&rng) % nf];
                    pos[j] = fd->off + test_rand_u64(&rng) % fd->size;
                } else {
                    pos[j] = test_rand_u64(&rng) % L.region;
                }
                old[j] = L.buf[pos[j]];
                L.buf[pos[j]] ^= (uint8_t)(1 + test_rand_u64(&rng) % 255);
            }
            gguf_file *f = NULL;
            kiln_status st = gguf_open_memory(L.buf, L.size, L.name, &f);
            if (f) /* a successful parse still has every tensor inside the buffer */
                for (size_t i = 0; i < gguf_n_tensors(f); i++) {
                    const gguf_tensor *tt = gguf_tensor_at(f, i);
                    CHECK((const uint8_t *)tt->data + tt->nbytes <= L.buf + L.size);
                }
            gguf_close(f);
            cases++;
            if (st != KILN_OK) {
                failed++;
                CHECKF(clear_message(&L, kiln_last_error()), "%s: unclear message: %s", L.name, kiln_last_error());
            }
            for (size_t j = nflip; j-- > 0;) L.buf[pos[j]] = old[j];
        }
        for (int t = 0; t < 8 && L.size > L.region; t++) {
            size_t p = L.region + test_rand_u64(&rng) % (L.size - L.region);
            L.buf[p] ^= 0xff;
            gguf_file *f = NULL;
            CHECK_OK(gguf_open_memory(L.buf, L.size, L.name, &f));
            gguf_close(f);
            L.buf[p] ^= 0xff;
        }
        unload(&L);
    }
    printf("%ld flip cases, %ld rejected\n", cases, failed);
    CHECK(failed > cases / 10);
}

/* The file path (mmap) variant cleans up too: a truncated copy on disk fails with the path in the message. */
TEST(gguf_corrupt_truncated_file_on_disk) {
    size_t n;
    char *data = test_read_file(test_shared("models/stories260K/stories260K.gguf"), &n);
    REQUIRE(data);
    char path[512];
    snprintf(path, sizeof path, "%s/cut.gguf", test_tmpdir());
    FILE *fp = fopen(path, "wb");
    REQUIRE(fp);
    fwrite(data, 1, n / 2, fp);
    fclose(fp);
    free(data);
    gguf_file *f = (gguf_file *)1;
    CHECK_EQ_INT(gguf_open(path, &f), KILN_ERR_FORMAT);
    CHECK(f == NULL);
    CHECK(strstr(kiln_last_error(), path) && strstr(kiln_last_error(), "tensor '") && strstr(kiln_last_error(), "outside"));
    printf("%s\n", kiln_last_error());
}
