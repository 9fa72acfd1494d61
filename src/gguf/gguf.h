/*
 * gguf.h — the GGUF container: a zero-copy reader over a read-only map, and a writer.
 *
 * Reader: gguf_open maps the file and parses header, metadata and tensor table. Strings and arrays are
 * views into the map (nothing is allocated per vocabulary entry); keys and tensor names are indexed at
 * open (sorted, binary search). Every length, count, offset and alignment is checked; a failure returns
 * a kiln_status with a message naming the field (key or tensor name) and the byte offset.
 *
 * Writer: gguf_writer collects metadata and tensor descriptions, then streams header, table and
 * 'general.alignment'-padded tensor data to a file.
 */
#ifndef KILN_GGUF_H
#define KILN_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_ARRAY_DEPTH 8        /* hard cap on nested arrays */
#define GGUF_MAX_STRING (1u << 30)    /* hard cap on one string's length */
#define GGUF_MAX_KEY_LEN 65535

/* Metadata value types (stable on-disk numbering). */
typedef enum gguf_vtype {
    GGUF_VT_U8 = 0, GGUF_VT_I8 = 1, GGUF_VT_U16 = 2, GGUF_VT_I16 = 3,
    GGUF_VT_U32 = 4, GGUF_VT_I32 = 5, GGUF_VT_F32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_U64 = 10, GGUF_VT_I64 = 11,
    GGUF_VT_F64 = 12, GGUF_VT_COUNT = 13,
} gguf_vtype;

const char *gguf_vtype_name(gguf_vtype t); /* "u8", "string", "array", ... */

/* A string view (not NUL-terminated). */
typedef struct gguf_str { const char *ptr; uint64_t len; } gguf_str;

/* An array view. For scalar element types, data points at n packed little-endian elements. For
 * strings and nested arrays, elements are variable-sized: use gguf_arr_str / gguf_arr_sub. */
typedef struct gguf_arr {
    gguf_vtype elem;
    uint64_t n;
    const uint8_t *data;        /* first element's encoding in the map */
    const uint64_t *offsets;    /* strings/arrays: byte offset of element i from data (index built at open);
                                 * arrays of arrays keep internal entries after the first n: use gguf_arr_sub */
} gguf_arr;

typedef struct gguf_value {
    gguf_vtype type;
    union {
        uint64_t u;      /* u8, u16, u32, u64, bool */
        int64_t i;       /* i8, i16, i32, i64 */
        double f;        /* f32, f64 */
        gguf_str str;
        gguf_arr arr;
    } v;
} gguf_value;

typedef struct gguf_kv {
    gguf_str key;
    gguf_value value;
    uint64_t offset;    /* byte offset of the key in the file */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (fastest-varying); unused dims are 1 */
    uint32_t type;              /* kiln_type */
    uint64_t offset;            /* relative to the data section */
    uint64_t nbytes;
    const void *data;           /* in the map */
    uint64_t info_offset;       /* byte offset of the tensor's entry in the file */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Opens and parses path (mmap, read-only). *out is NULL on failure. Timings of the map and the parse
 * are recorded (gguf_open_ns). */
kiln_status gguf_open(const char *path, gguf_file **out);
/* Parses a buffer the caller keeps alive (for fuzzing and tests). name is used in messages. */
kiln_status gguf_open_memory(const void *buf, size_t len, const char *name, gguf_file **out);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_file_size(const gguf_file *f);
uint64_t gguf_data_offset(const gguf_file *f);   /* end of the tensor table rounded up to the alignment
                                                  * (past the end of a file without tensors) */
uint32_t gguf_alignment(const gguf_file *f);
const uint8_t *gguf_base(const gguf_file *f);   /* the start of the map */
const char *gguf_path(const gguf_file *f);
void gguf_open_ns(const gguf_file *f, uint64_t *map_ns, uint64_t *parse_ns);

size_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, size_t i);       /* in file order */
const gguf_kv *gguf_find(const gguf_file *f, const char *key);  /* NULL when absent */

size_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, size_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Element i of a string array (i < n). */
gguf_str gguf_arr_str(const gguf_arr *a, uint64_t i);
/* Element i of an array of arrays. */
gguf_arr gguf_arr_sub(const gguf_arr *a, uint64_t i);
/* Element i of a numeric array, converted (bool as 0/1; floats to i64 truncate toward zero, saturate,
 * NaN gives 0). */
double gguf_arr_f64(const gguf_arr *a, uint64_t i);
int64_t gguf_arr_i64(const gguf_arr *a, uint64_t i);

/* Typed getters: return KILN_OK and the value when the key exists with a compatible type (any integer
 * type for integers when the value fits; f32/f64 for floats; bool; string); KILN_ERR_FORMAT with a
 * message naming the key and its actual type otherwise; KILN_ERR_FORMAT "missing key" when absent. */
kiln_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
kiln_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
kiln_status gguf_get_f32(const gguf_file *f, const char *key, float *out);
kiln_status gguf_get_bool(const gguf_file *f, const char *key, bool *out);
kiln_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* gguf_get_arr: elem == GGUF_VT_COUNT accepts an array of any element type. */
kiln_status gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype elem, gguf_arr *out);

/* True when s equals the C string c. */
bool gguf_str_eq(gguf_str s, const char *c);

/* ---------------------------------------------------------------- writer */

typedef struct gguf_writer gguf_writer;

kiln_status gguf_writer_open(gguf_writer **out);   /* GGUF v3, alignment 32 unless general.alignment is set */
void gguf_writer_close(gguf_writer *w);

/* Metadata setters copy their arguments. Setting an existing key replaces it (order kept). */
kiln_status gguf_set_u8(gguf_writer *w, const char *key, uint8_t v);
kiln_status gguf_set_i8(gguf_writer *w, const char *key, int8_t v);
kiln_status gguf_set_u16(gguf_writer *w, const char *key, uint16_t v);
kiln_status gguf_set_i16(gguf_writer *w, const char *key, int16_t v);
kiln_status gguf_set_u32(gguf_writer *w, const char *key, uint32_t v);
kiln_status gguf_set_i32(gguf_writer *w, const char *key, int32_t v);
kiln_status gguf_set_u64(gguf_writer *w, const char *key, uint64_t v);
kiln_status gguf_set_i64(gguf_writer *w, const char *key, int64_t v);
kiln_status gguf_set_f32(gguf_writer *w, const char *key, float v);
kiln_status gguf_set_f64(gguf_writer *w, const char *key, double v);
kiln_status gguf_set_bool(gguf_writer *w, const char *key, bool v);
kiln_status gguf_set_str(gguf_writer *w, const char *key, const char *s, size_t len);
/* An array of scalars: n packed elements of type elem (not string/array). */
kiln_status gguf_set_arr_data(gguf_writer *w, const char *key, gguf_vtype elem, const void *data, uint64_t n);
/* An array of n strings. */
kiln_status gguf_set_arr_str(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n);
/* Copies a value read from another file (any type, nested arrays included; string arrays and arrays of
 * arrays need the offsets table gguf_open builds). */
kiln_status gguf_set_value(gguf_writer *w, const char *key, const gguf_value *v);
kiln_status gguf_remove_key(gguf_writer *w, const char *key);

/* Adds a tensor description; its bytes come later from the data callback or a pointer.
 * data may be NULL when gguf_writer_write is given a callback. */
kiln_status gguf_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const uint64_t *ne, const void *data);

/* Produces the bytes of tensor i (in add order) into dst (nbytes). Returns KILN_OK or an error. */
typedef kiln_status (*gguf_tensor_data_fn)(void *ctx, size_t i, void *dst, uint64_t nbytes);

/* Writes the file to path (fn may be NULL when every tensor was added with data). Writes to
 * path.tmp first and renames at the end, so an interrupted write leaves no half file. */
kiln_status gguf_writer_write(gguf_writer *w, const char *path, gguf_tensor_data_fn fn, void *ctx);

#endif
