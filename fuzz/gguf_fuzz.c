/*
 * gguf_fuzz.c — libFuzzer target for the GGUF reader: parses the input with gguf_open_memory and, when it
 * parses, walks everything a caller can reach (every key and value, every element of every array, nested
 * arrays included, the typed getters, the tensor table and the name indexes) so that a reader bug that
 * lets a bad offset through shows up as a sanitizer report here.
 * Build: make fuzz (clang -fsanitize=fuzzer,address,undefined); run: build/fuzz/gguf_fuzz fuzz/corpus/
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf.h"

static volatile uint64_t sink;

static void touch_str(gguf_str s) {
    uint64_t h = s.len;
    for (uint64_t i = 0; i < s.len; i++) h = h * 31 + (uint8_t)s.ptr[i];
    sink += h;
}

static void walk_array(const gguf_arr *a, int depth) {
    if (depth > GGUF_MAX_ARRAY_DEPTH) __builtin_trap(); /* the reader must have refused this */
    for (uint64_t i = 0; i < a->n; i++) {
        switch (a->elem) {
        case GGUF_VT_STRING: touch_str(gguf_arr_str(a, i)); break;
        case GGUF_VT_ARRAY: {
            gguf_arr sub = gguf_arr_sub(a, i);
            walk_array(&sub, depth + 1);
            break;
        }
        case GGUF_VT_F32: case GGUF_VT_F64:
            sink += (uint64_t)(gguf_arr_f64(a, i) != 0) + (uint64_t)gguf_arr_i64(a, i);
            break;
        default: sink += (uint64_t)gguf_arr_i64(a, i); break;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = NULL;
    if (gguf_open_memory(data, size, "fuzz.gguf", &f) != KILN_OK) {
        if (f) __builtin_trap(); /* a failed open leaves no handle */
        return 0;
    }
    char name[GGUF_MAX_KEY_LEN + 1];
    for (size_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        touch_str(kv->key);
        if (kv->value.type == GGUF_VT_STRING) touch_str(kv->value.v.str);
        if (kv->value.type == GGUF_VT_ARRAY) walk_array(&kv->value.v.arr, 1);
        memcpy(name, kv->key.ptr, kv->key.len);
        name[kv->key.len] = '\0';
        if (strlen(name) == kv->key.len && gguf_find(f, name) != kv) __builtin_trap();
        uint32_t u;
        int64_t i64;
        float x;
        bool b;
        gguf_str s;
        gguf_arr a;
        (void)gguf_get_u32(f, name, &u);
        (void)gguf_get_i64(f, name, &i64);
        (void)gguf_get_f32(f, name, &x);
        (void)gguf_get_bool(f, name, &b);
        (void)gguf_get_str(f, name, &s);
        (void)gguf_get_arr(f, name, GGUF_VT_COUNT, &a);
    }
    const uint8_t *end = gguf_base(f) + gguf_file_size(f);
    for (size_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        touch_str(t->name);
        const uint8_t *p = t->data;
        if (p < gguf_base(f) + gguf_data_offset(f) || p + t->nbytes > end) __builtin_trap();
        sink += p[0] + p[t->nbytes - 1];
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = '\0';
        if (strlen(name) == t->name.len && gguf_find_tensor(f, name) != t) __builtin_trap();
    }
    gguf_close(f);
    return 0;
}
