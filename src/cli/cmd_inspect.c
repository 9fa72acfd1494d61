/*
 * cmd_inspect.c — `kiln inspect MODEL.gguf [--full] [--json]`: what a person needs to know about a GGUF file:
 * size, version, alignment, data offset, how long the open took (map and parse), every key with its value
 * (arrays summarized with their first items unless --full), every tensor (name, type, shape, offset, bytes)
 * and totals per tensor type. --json prints the same as one JSON object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "formats/formats.h"
#include "gguf/gguf.h"

static const char usage[] =
    "usage: kiln inspect MODEL.gguf [--full] [--json]\n"
    "  Prints a GGUF file's size, version, alignment, data offset, open time (map + parse), every metadata\n"
    "  key with its value, every tensor (name, type, shape, offset in the data section, bytes) and totals\n"
    "  per tensor type.\n"
    "  --full   print every item of array values and whole strings (default: the first few items and\n"
    "           strings cut at 100 bytes)\n"
    "  --json   print the same as one JSON object\n"
    "  --help   this text\n";

#define SUMMARY_ITEMS 8
#define SUMMARY_STRING 100

typedef struct opts {
    bool full, json;
} opts;

/* ---------------------------------------------------------------- text output */

/* The shortest decimal that reads back as the same f32 (or f64) value. */
static void fmt_float(char *buf, size_t cap, double x, bool is_f32) {
    if (x == (double)(long long)x && x > -1e15 && x < 1e15) { snprintf(buf, cap, "%.0f", x); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (is_f32 ? strtof(buf, NULL) == (float)x : strtod(buf, NULL) == x) return;
    }
}

static void print_float(FILE *out, double x, bool is_f32) {
    char buf[64];
    fmt_float(buf, sizeof buf, x, is_f32);
    fputs(buf, out);
}

/* A quoted string for the terminal: C escapes for controls, quotes and invalid bytes; UTF-8 kept. */
static void text_str(FILE *out, const char *s, uint64_t len, bool full) {
    uint64_t n = full || len <= SUMMARY_STRING ? len : SUMMARY_STRING;
    fputc('"', out);
    for (uint64_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t u = cli_utf8_len((const unsigned char *)s + i, (size_t)(len - i));
        if (c == '"' || c == '\\') { fprintf(out, "\\%c", c); i++; }
        else if (c == '\n') { fputs("\\n", out); i++; }
        else if (c == '\t') { fputs("\\t", out); i++; }
        else if (c < 0x20 || c == 0x7f || u == 0) { fprintf(out, "\\x%02x", c); i++; }
        else { fwrite(s + i, 1, u, out); i += u; }
    }
    fputc('"', out);
    if (n < len) fprintf(out, "... (%llu bytes)", (unsigned long long)len);
}

static void text_scalar_item(FILE *out, const gguf_arr *a, uint64_t i) {
    switch (a->elem) {
    case GGUF_VT_F32: case GGUF_VT_F64: print_float(out, gguf_arr_f64(a, i), a->elem == GGUF_VT_F32); break;
    case GGUF_VT_BOOL: fputs(gguf_arr_i64(a, i) ? "true" : "false", out); break;
    case GGUF_VT_U64: fprintf(out, "%llu", (unsigned long long)gguf_arr_i64(a, i)); break;
    default: fprintf(out, "%lld", (long long)gguf_arr_i64(a, i)); break;
    }
}

static void text_array_items(FILE *out, const gguf_arr *a, bool full) {
    uint64_t n = full || a->n <= SUMMARY_ITEMS ? a->n : SUMMARY_ITEMS;
    fputc('[', out);
    for (uint64_t i = 0; i < n; i++) {
        if (i) fputs(", ", out);
        if (a->elem == GGUF_VT_STRING) {
            gguf_str s = gguf_arr_str(a, i);
            text_str(out, s.ptr, s.len, full);
        } else if (a->elem == GGUF_VT_ARRAY) {
            gguf_arr sub = gguf_arr_sub(a, i);
            text_array_items(out, &sub, full);
        } else {
            text_scalar_item(out, a, i);
        }
    }
    if (n < a->n) fprintf(out, ", ... %llu more", (unsigned long long)(a->n - n));
    fputc(']', out);
}

static void text_value(FILE *out, const gguf_value *v, bool full) {
    switch (v->type) {
    case GGUF_VT_U8: case GGUF_VT_U16: case GGUF_VT_U32: case GGUF_VT_U64:
        fprintf(out, "%llu", (unsigned long long)v->v.u);
        break;
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64:
        fprintf(out, "%lld", (long long)v->v.i);
        break;
    case GGUF_VT_F32: print_float(out, v->v.f, true); break;
    case GGUF_VT_F64: print_float(out, v->v.f, false); break;
    case GGUF_VT_BOOL: fputs(v->v.u ? "true" : "false", out); break;
    case GGUF_VT_STRING: text_str(out, v->v.str.ptr, v->v.str.len, full); break;
    case GGUF_VT_ARRAY:
        fprintf(out, "array of %llu %s: ", (unsigned long long)v->v.arr.n, gguf_vtype_name(v->v.arr.elem));
        text_array_items(out, &v->v.arr, full);
        break;
    default: fputs("?", out); break;
    }
}

/* ---------------------------------------------------------------- JSON output */

static void json_num(FILE *out, double x, bool is_f32) {
    if (x != x || x - x != 0) fputs("null", out); /* NaN / inf are not JSON */
    else print_float(out, x, is_f32);
}

static void json_array_items(FILE *out, const gguf_arr *a, bool full) {
    uint64_t n = full || a->n <= SUMMARY_ITEMS ? a->n : SUMMARY_ITEMS;
    fputc('[', out);
    for (uint64_t i = 0; i < n; i++) {
        if (i) fputc(',', out);
        switch (a->elem) {
        case GGUF_VT_STRING: { gguf_str s = gguf_arr_str(a, i); cli_json_str(out, s.ptr, s.len); break; }
        case GGUF_VT_ARRAY: {
            gguf_arr sub = gguf_arr_sub(a, i);
            fprintf(out, "{\"elem\":\"%s\",\"n\":%llu,\"items\":", gguf_vtype_name(sub.elem), (unsigned long long)sub.n);
            json_array_items(out, &sub, full);
            fputc('}', out);
            break;
        }
        case GGUF_VT_F32: case GGUF_VT_F64: json_num(out, gguf_arr_f64(a, i), a->elem == GGUF_VT_F32); break;
        case GGUF_VT_BOOL: fputs(gguf_arr_i64(a, i) ? "true" : "false", out); break;
        case GGUF_VT_U64: fprintf(out, "%llu", (unsigned long long)gguf_arr_i64(a, i)); break;
        default: fprintf(out, "%lld", (long long)gguf_arr_i64(a, i)); break;
        }
    }
    fputc(']', out);
}

static void json_value(FILE *out, const gguf_value *v, bool full) {
    switch (v->type) {
    case GGUF_VT_U8: case GGUF_VT_U16: case GGUF_VT_U32: case GGUF_VT_U64:
        fprintf(out, "%llu", (unsigned long long)v->v.u);
        break;
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64:
        fprintf(out, "%lld", (long long)v->v.i);
        break;
    case GGUF_VT_F32: json_num(out, v->v.f, true); break;
    case GGUF_VT_F64: json_num(out, v->v.f, false); break;
    case GGUF_VT_BOOL: fputs(v->v.u ? "true" : "false", out); break;
    case GGUF_VT_STRING: cli_json_str(out, v->v.str.ptr, v->v.str.len); break;
    case GGUF_VT_ARRAY: json_array_items(out, &v->v.arr, full); break;
    default: fputs("null", out); break;
    }
}

/* ---------------------------------------------------------------- the report */

typedef struct type_total {
    uint64_t tensors, bytes, elements;
} type_total;

static uint64_t n_elements(const gguf_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

static const char *type_name(uint32_t type) {
    const kiln_type_info *ti = kiln_type_get(type);
    return ti ? ti->name : "?";
}

static void format_shape(char *buf, size_t cap, const gguf_tensor *t) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < t->n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%llu", d ? ", " : "", (unsigned long long)t->ne[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static void print_text(FILE *out, const gguf_file *f, const opts *o, const type_total *totals) {
    uint64_t map_ns, parse_ns, data_bytes = 0, all_elements = 0;
    gguf_open_ns(f, &map_ns, &parse_ns);
    for (int t = 0; t < KILN_TYPE_COUNT; t++) { data_bytes += totals[t].bytes; all_elements += totals[t].elements; }
    uint64_t size = gguf_file_size(f);
    fprintf(out, "file       %s\n", gguf_path(f));
    fprintf(out, "size       %llu bytes (%.2f MiB)\n", (unsigned long long)size, size / 1048576.0);
    fprintf(out, "version    GGUF v%u\n", gguf_version(f));
    fprintf(out, "alignment  %u\n", gguf_alignment(f));
    fprintf(out, "data       offset %llu, %llu bytes of tensor data\n", (unsigned long long)gguf_data_offset(f),
            (unsigned long long)data_bytes);
    fprintf(out, "keys       %zu\n", gguf_n_kv(f));
    fprintf(out, "tensors    %zu (%llu elements)\n", gguf_n_tensors(f), (unsigned long long)all_elements);
    fprintf(out, "open %.2f ms (map %.2f, parse %.2f)\n", (map_ns + parse_ns) / 1e6, map_ns / 1e6, parse_ns / 1e6);

    fprintf(out, "\nmetadata (%zu keys)\n", gguf_n_kv(f));
    int keyw = 0;
    for (size_t i = 0; i < gguf_n_kv(f); i++) {
        int n = (int)gguf_kv_at(f, i)->key.len;
        if (n > keyw) keyw = n;
    }
    if (keyw > 48) keyw = 48;
    for (size_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        fprintf(out, "  %-*.*s  ", keyw, (int)kv->key.len, kv->key.ptr);
        if (kv->value.type != GGUF_VT_ARRAY) fprintf(out, "%-6s ", gguf_vtype_name(kv->value.type));
        text_value(out, &kv->value, o->full);
        fputc('\n', out);
    }

    fprintf(out, "\ntensors (%zu)\n", gguf_n_tensors(f));
    if (gguf_n_tensors(f)) {
        int namew = 4;
        for (size_t i = 0; i < gguf_n_tensors(f); i++) {
            int n = (int)gguf_tensor_at(f, i)->name.len;
            if (n > namew) namew = n;
        }
        if (namew > 64) namew = 64;
        fprintf(out, "  %-*s  %-7s  %-22s  %12s  %12s\n", namew, "name", "type", "shape", "offset", "bytes");
        for (size_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            char shape[128];
            format_shape(shape, sizeof shape, t);
            fprintf(out, "  %-*.*s  %-7s  %-22s  %12llu  %12llu\n", namew, (int)t->name.len, t->name.ptr,
                    type_name(t->type), shape, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        }
        fprintf(out, "\ntotals by type\n");
        fprintf(out, "  %-7s  %8s  %14s  %14s  %7s\n", "type", "tensors", "elements", "bytes", "share");
        for (int t = 0; t < KILN_TYPE_COUNT; t++) {
            if (!totals[t].tensors) continue;
            fprintf(out, "  %-7s  %8llu  %14llu  %14llu  %6.1f%%\n", type_name((uint32_t)t),
                    (unsigned long long)totals[t].tensors, (unsigned long long)totals[t].elements,
                    (unsigned long long)totals[t].bytes, data_bytes ? 100.0 * totals[t].bytes / data_bytes : 0.0);
        }
        fprintf(out, "  %-7s  %8zu  %14llu  %14llu  %6.1f%%\n", "all", gguf_n_tensors(f),
                (unsigned long long)all_elements, (unsigned long long)data_bytes, 100.0);
    }
}

static void print_json(FILE *out, const gguf_file *f, const opts *o, const type_total *totals) {
    uint64_t map_ns, parse_ns, data_bytes = 0, all_elements = 0;
    gguf_open_ns(f, &map_ns, &parse_ns);
    for (int t = 0; t < KILN_TYPE_COUNT; t++) { data_bytes += totals[t].bytes; all_elements += totals[t].elements; }
    fputs("{\"file\":", out);
    cli_json_str(out, gguf_path(f), strlen(gguf_path(f)));
    fprintf(out, ",\"size\":%llu,\"version\":%u,\"alignment\":%u,\"data_offset\":%llu,\"data_bytes\":%llu,"
                 "\"n_kv\":%zu,\"n_tensors\":%zu,\"n_elements\":%llu,",
            (unsigned long long)gguf_file_size(f), gguf_version(f), gguf_alignment(f),
            (unsigned long long)gguf_data_offset(f), (unsigned long long)data_bytes, gguf_n_kv(f), gguf_n_tensors(f),
            (unsigned long long)all_elements);
    fprintf(out, "\"open_ms\":{\"total\":%.4f,\"map\":%.4f,\"parse\":%.4f},\n", (map_ns + parse_ns) / 1e6,
            map_ns / 1e6, parse_ns / 1e6);
    fputs("\"metadata\":[", out);
    for (size_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        fputs(i ? ",\n {\"key\":" : "\n {\"key\":", out);
        cli_json_str(out, kv->key.ptr, kv->key.len);
        fprintf(out, ",\"type\":\"%s\"", gguf_vtype_name(kv->value.type));
        if (kv->value.type == GGUF_VT_ARRAY) {
            const gguf_arr *a = &kv->value.v.arr;
            fprintf(out, ",\"elem\":\"%s\",\"n\":%llu,\"complete\":%s", gguf_vtype_name(a->elem),
                    (unsigned long long)a->n, o->full || a->n <= SUMMARY_ITEMS ? "true" : "false");
        }
        fputs(",\"value\":", out);
        json_value(out, &kv->value, o->full);
        fputc('}', out);
    }
    fputs("],\n\"tensors\":[", out);
    for (size_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        fputs(i ? ",\n {\"name\":" : "\n {\"name\":", out);
        cli_json_str(out, t->name.ptr, t->name.len);
        fprintf(out, ",\"type\":\"%s\",\"type_id\":%u,\"shape\":[", type_name(t->type), t->type);
        for (uint32_t d = 0; d < t->n_dims; d++) fprintf(out, "%s%llu", d ? "," : "", (unsigned long long)t->ne[d]);
        fprintf(out, "],\"offset\":%llu,\"file_offset\":%llu,\"bytes\":%llu}", (unsigned long long)t->offset,
                (unsigned long long)(gguf_data_offset(f) + t->offset), (unsigned long long)t->nbytes);
    }
    fputs("],\n\"totals\":[", out);
    bool first = true;
    for (int t = 0; t < KILN_TYPE_COUNT; t++) {
        if (!totals[t].tensors) continue;
        fprintf(out, "%s{\"type\":\"%s\",\"tensors\":%llu,\"elements\":%llu,\"bytes\":%llu}", first ? "\n " : ",\n ",
                type_name((uint32_t)t), (unsigned long long)totals[t].tensors,
                (unsigned long long)totals[t].elements, (unsigned long long)totals[t].bytes);
        first = false;
    }
    fputs("]}\n", out);
}

int cmd_inspect(int argc, char **argv) {
    opts o = {0};
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); return 0; }
        else if (!strcmp(a, "--full")) o.full = true;
        else if (!strcmp(a, "--json")) o.json = true;
        else if (a[0] == '-' && a[1]) return cli_usage_error(argv[0], usage, "unknown option '%s'", a);
        else if (path) return cli_usage_error(argv[0], usage, "one MODEL.gguf at a time (got '%s' and '%s')", path, a);
        else path = a;
    }
    if (!path) return cli_usage_error(argv[0], usage, "missing MODEL.gguf");
    gguf_file *f;
    kiln_status st = gguf_open(path, &f);
    if (st != KILN_OK) return cli_error(argv[0], "%s", kiln_last_error());
    type_total totals[KILN_TYPE_COUNT];
    memset(totals, 0, sizeof totals);
    for (size_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        totals[t->type].tensors++;
        totals[t->type].bytes += t->nbytes;
        totals[t->type].elements += n_elements(t);
    }
    if (o.json) print_json(stdout, f, &o, totals);
    else print_text(stdout, f, &o, totals);
    gguf_close(f);
    if (fflush(stdout) != 0) return cli_error(argv[0], "cannot write the output");
    return 0;
}
