/*
 * quantize.c — `kiln quantize` (see quantize.h): the per-tensor type rules of llama-quantize, the plan,
 * and the threaded conversion that streams each tensor into the GGUF writer.
 */
#include "tools/quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/pool.h"
#include "base/timing.h"
#include "gguf/gguf.h"

/* llama_ftype values (general.file_type) */
enum {
    FT_ALL_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7, FT_Q5_0 = 8, FT_Q5_1 = 9, FT_Q2_K = 10,
    FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13, FT_Q4_K_S = 14, FT_Q4_K_M = 15, FT_Q5_K_S = 16, FT_Q5_K_M = 17,
    FT_Q6_K = 18, FT_BF16 = 32,
};

static const kiln_quant_target targets[] = {
    {"F32", FT_ALL_F32, KILN_TYPE_F32},   {"F16", FT_F16, KILN_TYPE_F16},       {"BF16", FT_BF16, KILN_TYPE_BF16},
    {"Q8_0", FT_Q8_0, KILN_TYPE_Q8_0},    {"Q5_1", FT_Q5_1, KILN_TYPE_Q5_1},    {"Q5_0", FT_Q5_0, KILN_TYPE_Q5_0},
    {"Q4_1", FT_Q4_1, KILN_TYPE_Q4_1},    {"Q4_0", FT_Q4_0, KILN_TYPE_Q4_0},    {"Q6_K", FT_Q6_K, KILN_TYPE_Q6_K},
    {"Q5_K_M", FT_Q5_K_M, KILN_TYPE_Q5_K}, {"Q5_K_S", FT_Q5_K_S, KILN_TYPE_Q5_K}, {"Q4_K_M", FT_Q4_K_M, KILN_TYPE_Q4_K},
    {"Q4_K_S", FT_Q4_K_S, KILN_TYPE_Q4_K}, {"Q3_K_L", FT_Q3_K_L, KILN_TYPE_Q3_K}, {"Q3_K_M", FT_Q3_K_M, KILN_TYPE_Q3_K},
    {"Q3_K_S", FT_Q3_K_S, KILN_TYPE_Q3_K}, {"Q2_K", FT_Q2_K, KILN_TYPE_Q2_K},
};
#define N_TARGETS ((int)(sizeof targets / sizeof targets[0]))

const kiln_quant_target *kiln_quant_targets(int *n) {
    *n = N_TARGETS;
    return targets;
}

const kiln_quant_target *kiln_quant_find_target(const char *name) {
    static const struct { const char *alias, *name; } aliases[] = {
        {"Q4_K", "Q4_K_M"}, {"Q3_K", "Q3_K_M"}, {"Q5_K", "Q5_K_M"}};
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcasecmp(name, aliases[i].alias)) name = aliases[i].name;
    for (int i = 0; i < N_TARGETS; i++)
        if (!strcasecmp(name, targets[i].name)) return &targets[i];
    return NULL;
}

/* ------------------------------------------------------------------------------------ the plan */

typedef struct planned {
    const gguf_tensor *src;
    char *name;
    int layer;              /* N of "blk.N.", -1 otherwise */
    kiln_type out_type;
    kiln_type wanted;       /* the rules' choice before a row-length fallback */
    bool convert;           /* false: bytes copied unchanged */
    bool fallback;
    uint64_t n_rows, row_len, out_bytes;
} planned;

/* Model facts the rules need. */
typedef struct rule_state {
    const kiln_quant_target *target;
    bool falcon, is_70b, has_output;
    int n_gqa, n_expert, n_layer;
    int n_attention_wv, i_attention_wv, i_ffn_down;
} rule_state;

static bool contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

static int layer_of(const char *name) {
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) != 1) layer = -1;
    return layer;
}

static int n_dims_of(const gguf_tensor *t) {
    int n = 1;
    for (int i = 1; i < GGUF_MAX_DIMS; i++)
        if (t->ne[i] > 1) n = i + 1;
    return n;
}

/* llama-quantize's "should this tensor be converted at all". */
static bool is_convertible_weight(const char *name, const gguf_tensor *t) {
    const size_t n = strlen(name);
    if (n < 6 || strcmp(name + n - 6, "weight")) return false;
    if (n_dims_of(t) < 2) return false;
    static const char *const never[] = {"_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
                                        "ssm_conv1d.weight", "shortconv.conv.weight", "time_mix_", "attn_rel_b.weight"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (contains(name, never[i])) return false;
    return strcmp(name, "position_embd.weight") && strcmp(name, "token_types.weight");
}

/* The K-quant mix rules of llama-quantize (no importance matrix) for one matrix. */
static kiln_type mix_type(rule_state *qs, kiln_type t, const char *name, const gguf_tensor *tensor) {
    const uint32_t ft = qs->target->ftype;
    if (!strcmp(name, "output.weight") || (!qs->has_output && !strcmp(name, "token_embd.weight"))) {
        const uint32_t qk = kiln_type_get(t)->block_size;
        if (qs->falcon || tensor->ne[0] % qk) t = KILN_TYPE_Q8_0;
        else if (t != KILN_TYPE_Q8_0) t = KILN_TYPE_Q6_K;
    } else if (!strcmp(name, "token_embd.weight")) {
        /* only importance-matrix types change it */
    } else if (contains(name, "attn_v.weight")) {
        if (ft == FT_Q2_K) t = qs->n_gqa >= 4 ? KILN_TYPE_Q4_K : KILN_TYPE_Q3_K;
        else if (ft == FT_Q3_K_M) t = qs->i_attention_wv < 2 ? KILN_TYPE_Q5_K : KILN_TYPE_Q4_K;
        else if (ft == FT_Q3_K_L) t = KILN_TYPE_Q5_K;
        else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && use_more_bits(qs->i_attention_wv, qs->n_attention_wv)) t = KILN_TYPE_Q6_K;
        else if (ft == FT_Q4_K_S && qs->i_attention_wv < 4) t = KILN_TYPE_Q5_K;
        if (qs->is_70b && (t == KILN_TYPE_Q3_K || t == KILN_TYPE_Q4_K)) t = KILN_TYPE_Q5_K;
        if (qs->n_expert == 8) t = KILN_TYPE_Q8_0;
        qs->i_attention_wv++;
    } else if (contains(name, "attn_k.weight")) {
        if (qs->n_expert == 8) t = KILN_TYPE_Q8_0;
    } else if (contains(name, "attn_q.weight")) {
        /* only importance-matrix types change it */
    } else if (contains(name, "ffn_down")) {
        const int n_layer = qs->n_layer;
        const int i_layer = qs->n_expert > 1 && layer_of(name) >= 0 ? layer_of(name) : qs->i_ffn_down;
        if (ft == FT_Q2_K) t = KILN_TYPE_Q3_K;
        else if (ft == FT_Q3_K_M)
            t = i_layer < n_layer / 16 ? KILN_TYPE_Q5_K
                : !qs->falcon || use_more_bits(i_layer, n_layer) ? KILN_TYPE_Q4_K : KILN_TYPE_Q3_K;
        else if (ft == FT_Q3_K_L) t = qs->falcon ? KILN_TYPE_Q4_K : KILN_TYPE_Q5_K;
        else if (ft == FT_Q4_K_M) {
            if (qs->falcon)
                t = i_layer < n_layer / 16 ? KILN_TYPE_Q6_K : use_more_bits(i_layer, n_layer) ? KILN_TYPE_Q5_K : KILN_TYPE_Q4_K;
            else if (use_more_bits(i_layer, n_layer)) t = KILN_TYPE_Q6_K;
        } else if (ft == FT_Q5_K_M && use_more_bits(i_layer, n_layer)) t = KILN_TYPE_Q6_K;
        else if (ft == FT_Q4_K_S && !qs->falcon && i_layer < n_layer / 8) t = KILN_TYPE_Q5_K;
        qs->i_ffn_down++;
    } else if (contains(name, "attn_output.weight")) {
        if (!qs->falcon) {
            if (qs->n_expert == 8) {
                if (ft == FT_Q2_K || ft == FT_Q3_K_S || ft == FT_Q3_K_M || ft == FT_Q4_K_S || ft == FT_Q4_K_M) t = KILN_TYPE_Q5_K;
            } else {
                if (ft == FT_Q2_K) t = KILN_TYPE_Q3_K;
                else if (ft == FT_Q3_K_M) t = KILN_TYPE_Q4_K;
                else if (ft == FT_Q3_K_L) t = KILN_TYPE_Q5_K;
            }
        } else if (ft == FT_Q3_K_L) {
            t = KILN_TYPE_Q4_K;
        }
    } else if (contains(name, "attn_qkv.weight")) {
        if (ft == FT_Q3_K_M || ft == FT_Q3_K_L) t = KILN_TYPE_Q4_K;
        else if (ft == FT_Q4_K_M) t = KILN_TYPE_Q5_K;
        else if (ft == FT_Q5_K_M) t = KILN_TYPE_Q6_K;
    }
    return t;
}

/* A type whose block fits rows of n values, as llama-quantize falls back; sets *fell_back. */
static kiln_status fit_row_length(kiln_type t, uint64_t n, const char *name, kiln_type *out, bool *fell_back) {
    *fell_back = false;
    *out = t;
    if (n % kiln_type_get(t)->block_size == 0) return KILN_OK;
    kiln_type f;
    switch (t) {
    case KILN_TYPE_Q2_K:
    case KILN_TYPE_Q3_K: f = KILN_TYPE_Q4_0; break; /* llama-quantize: IQ4_NL, which kiln does not write */
    case KILN_TYPE_Q4_K: f = KILN_TYPE_Q5_0; break;
    case KILN_TYPE_Q5_K: f = KILN_TYPE_Q5_1; break;
    case KILN_TYPE_Q6_K: f = KILN_TYPE_Q8_0; break;
    default:
        return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%s': row length %llu is not a multiple of the %s block size %u",
                         name, (unsigned long long)n, kiln_type_get(t)->name, kiln_type_get(t)->block_size);
    }
    if (n % kiln_type_get(f)->block_size) f = KILN_TYPE_F16;
    *out = f;
    *fell_back = true;
    return KILN_OK;
}

static int cmp_planned(const void *a, const void *b) {
    const planned *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return strcmp(x->name, y->name);
}

static bool get_u32_opt(const gguf_file *f, const char *arch, const char *suffix, uint32_t *out) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) return false;
    return gguf_get_u32(f, key, out) == KILN_OK;
}

/* ----------------------------------------------------------------------------- the conversion */

#define MAX_CONVERT_THREADS 64

typedef struct convert_job {
    const planned *p;
    const kiln_type_info *in;
    kiln_from_float_fn quantize;  /* same bytes as the reference from_float, fastest variant */
    uint8_t *dst;
    float *row_bufs;        /* one row of floats per thread */
    uint64_t max_row;
    int64_t bad_row[MAX_CONVERT_THREADS]; /* per thread: first row holding a NaN or Inf (-1: none) */
    int64_t bad_col[MAX_CONVERT_THREADS];
} convert_job;

static void convert_rows(void *ctx, int ith, int nth) {
    convert_job *j = ctx;
    const planned *p = j->p;
    int lo, hi;
    kiln_split((int)p->n_rows, ith, nth, &lo, &hi);
    const size_t in_row = kiln_row_bytes(p->src->type, p->row_len), out_row = kiln_row_bytes(p->out_type, p->row_len);
    float *buf = j->row_bufs + (size_t)ith * j->max_row;
    for (int r = lo; r < hi; r++) {
        const uint8_t *src = (const uint8_t *)p->src->data + (size_t)r * in_row;
        const float *x = (const float *)src;
        if (p->src->type != KILN_TYPE_F32) {
            j->in->to_float(src, buf, (int64_t)p->row_len);
            x = buf;
        }
        for (uint64_t c = 0; c < p->row_len; c++)
            if (!isfinite(x[c])) {
                j->bad_row[ith] = r;
                j->bad_col[ith] = (int64_t)c;
                return;
            }
        j->quantize(x, j->dst + (size_t)r * out_row, (int64_t)p->row_len);
    }
}

typedef struct run_state {
    const kiln_quantize_options *o;
    planned *plan;
    size_t n;
    kiln_pool *pool;
    float *row_bufs;
    uint64_t max_row;
    kiln_quantize_report *rep;
} run_state;

static void shape_str(const gguf_tensor *t, char *buf, size_t cap) {
    int k = snprintf(buf, cap, "%llu", (unsigned long long)t->ne[0]);
    for (uint32_t d = 1; d < t->n_dims && k > 0 && (size_t)k < cap; d++)
        k += snprintf(buf + k, cap - (size_t)k, ", %llu", (unsigned long long)t->ne[d]);
}

static kiln_status produce_tensor(void *ctx, size_t i, void *dst, uint64_t nbytes) {
    run_state *rs = ctx;
    const planned *p = &rs->plan[i];
    KILN_ASSERT(nbytes == p->out_bytes);
    const uint64_t t0 = kiln_now_ns();
    if (!p->convert) {
        memcpy(dst, p->src->data, (size_t)nbytes);
    } else {
        convert_job j = {p, kiln_type_get(p->src->type), kiln_from_float_fast(p->out_type), dst, rs->row_bufs, rs->max_row,
                         {0}, {0}};
        for (int t = 0; t < MAX_CONVERT_THREADS; t++) j.bad_row[t] = -1;
        kiln_pool_run(rs->pool, convert_rows, &j);
        rs->rep->convert_seconds += (double)(kiln_now_ns() - t0) * 1e-9;
        for (int t = 0; t < MAX_CONVERT_THREADS; t++)
            if (j.bad_row[t] >= 0)
                return kiln_fail(KILN_ERR_FORMAT, "input %s: row %lld column %lld is not a finite number (NaN or Inf)",
                                 rs->o->in_path, (long long)j.bad_row[t], (long long)j.bad_col[t]);
    }
    if (rs->o->progress) {
        char shape[96];
        shape_str(p->src, shape, sizeof shape);
        fprintf(rs->o->progress, "[%4zu/%4zu] %-36s [%s] %-5s -> %-5s %9.3f MiB -> %9.3f MiB%s\n", i + 1, rs->n, p->name,
                shape, kiln_type_get(p->src->type)->name, kiln_type_get(p->out_type)->name,
                (double)p->src->nbytes / 1048576.0, (double)nbytes / 1048576.0, p->convert ? "" : " (copied)");
        fflush(rs->o->progress);
    }
    return KILN_OK;
}

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return false;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static kiln_status copy_metadata(const gguf_file *in, gguf_writer *w, uint32_t ftype) {
    static const char *const dropped[] = {"general.quantization_version", "general.file_type", "split.no", "split.count",
                                          "split.tensors.count"};
    for (size_t i = 0; i < gguf_n_kv(in); i++) {
        const gguf_kv *kv = gguf_kv_at(in, i);
        char *key = kiln_strndup(kv->key.ptr, (size_t)kv->key.len);
        if (!key) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        bool drop = false;
        for (size_t d = 0; d < sizeof dropped / sizeof dropped[0]; d++)
            if (!strcmp(key, dropped[d])) drop = true;
        kiln_status st = drop ? KILN_OK : gguf_set_value(w, key, &kv->value);
        kiln_free(key);
        KILN_TRY(st);
    }
    KILN_TRY(gguf_set_u32(w, "general.quantization_version", 2));
    return gguf_set_u32(w, "general.file_type", ftype);
}

static kiln_status make_plan(const gguf_file *in, const kiln_quantize_options *o, planned *plan, size_t n,
                             kiln_quantize_report *rep) {
    rule_state qs = {.target = o->target};
    gguf_str arch_s = {"", 0};
    char arch[64] = "";
    if (gguf_find(in, "general.architecture") && gguf_get_str(in, "general.architecture", &arch_s) == KILN_OK)
        snprintf(arch, sizeof arch, "%.*s", (int)(arch_s.len < 60 ? arch_s.len : 60), arch_s.ptr);
    uint32_t n_head = 0, n_head_kv = 0, n_expert = 0, n_layer = 0;
    get_u32_opt(in, arch, "attention.head_count", &n_head);
    if (!get_u32_opt(in, arch, "attention.head_count_kv", &n_head_kv)) n_head_kv = n_head;
    get_u32_opt(in, arch, "expert_count", &n_expert);
    get_u32_opt(in, arch, "block_count", &n_layer);
    qs.falcon = !strcmp(arch, "falcon");
    qs.is_70b = !strcmp(arch, "llama") && n_layer == 80;
    qs.n_gqa = n_head_kv ? (int)(n_head / n_head_kv) : 0;
    qs.n_expert = n_expert > 1 ? (int)n_expert : 1;
    for (size_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(in, i);
        plan[i].src = t;
        plan[i].name = kiln_strndup(t->name.ptr, (size_t)t->name.len);
        if (!plan[i].name) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        plan[i].layer = layer_of(plan[i].name);
        if (contains(plan[i].name, "attn_v.weight") || contains(plan[i].name, "attn_qkv.weight") ||
            contains(plan[i].name, "attn_kv_b.weight"))
            qs.n_attention_wv++;
        else if (!strcmp(plan[i].name, "output.weight"))
            qs.has_output = true;
    }
    if (!n_layer) {
        for (size_t i = 0; i < n; i++)
            if (plan[i].layer + 1 > (int)n_layer) n_layer = (uint32_t)(plan[i].layer + 1);
    }
    qs.n_layer = (int)n_layer;
    qsort(plan, n, sizeof *plan, cmp_planned);
    const bool mixes = kiln_type_get(o->target->default_type)->is_quantized;
    for (size_t i = 0; i < n; i++) {
        planned *p = &plan[i];
        const gguf_tensor *t = p->src;
        const kiln_type_info *in_ti = kiln_type_get(t->type);
        if (!in_ti) return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%s': unknown type %u", p->name, t->type);
        p->row_len = t->ne[0];
        p->n_rows = t->ne[1] * t->ne[2] * t->ne[3];
        kiln_type out = (kiln_type)t->type;
        if (is_convertible_weight(p->name, t)) {
            p->wanted = o->target->default_type;
            if (mixes && !o->pure) p->wanted = mix_type(&qs, p->wanted, p->name, t);
            const bool is_embd = !strcmp(p->name, "token_embd.weight");
            if (o->set_output_type && (!strcmp(p->name, "output.weight") || (is_embd && !qs.has_output)))
                p->wanted = o->output_type;
            if (o->set_embd_type && is_embd) p->wanted = o->embd_type;
            KILN_TRY(fit_row_length(p->wanted, p->row_len, p->name, &out, &p->fallback));
        }
        p->out_type = out;
        p->convert = out != (kiln_type)t->type;
        if (p->convert) {
            if (!in_ti->to_float && t->type != KILN_TYPE_F32)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%s': cannot convert from type %s", p->name, in_ti->name);
            if (p->n_rows > (uint64_t)INT32_MAX)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%s': %llu rows is too many", p->name,
                                 (unsigned long long)p->n_rows);
            if (in_ti->is_quantized) rep->n_requantized++;
        }
        p->out_bytes = kiln_row_bytes(out, p->row_len) * p->n_rows;
        if (p->fallback) {
            rep->n_fallback++;
            if (o->progress)
                fprintf(o->progress, "fallback: %s: row length %llu is not a multiple of %u (required for %s) -> %s\n",
                        p->name, (unsigned long long)p->row_len, kiln_type_get(p->wanted)->block_size,
                        kiln_type_get(p->wanted)->name, kiln_type_get(out)->name);
        }
    }
    return KILN_OK;
}

static void free_plan(planned *plan, size_t n) {
    if (!plan) return;
    for (size_t i = 0; i < n; i++) kiln_free(plan[i].name);
    kiln_free(plan);
}

static void print_summary(FILE *f, const kiln_quantize_options *o, const kiln_quantize_report *r) {
    fprintf(f, "\nsummary: %s -> %s (%s, general.file_type %u)\n", o->in_path, o->out_path, o->target->name,
            o->target->ftype);
    fprintf(f, "  %-6s %8s %12s\n", "type", "tensors", "MiB");
    for (int t = 0; t < KILN_TYPE_COUNT; t++)
        if (r->count_by_type[t])
            fprintf(f, "  %-6s %8d %12.3f\n", kiln_type_get((uint32_t)t)->name, r->count_by_type[t],
                    (double)r->bytes_by_type[t] / 1048576.0);
    fprintf(f, "  %d tensors: %d converted, %d copied; %d fallback%s; %d requantized\n", r->n_tensors, r->n_converted,
            r->n_copied, r->n_fallback, r->n_fallback == 1 ? "" : "s", r->n_requantized);
    fprintf(f, "  tensor data %.3f MiB -> %.3f MiB; %.3f s total, conversion %.3f s (%.1f MB/s of input data)\n",
            (double)r->bytes_in / 1048576.0, (double)r->bytes_out / 1048576.0, r->seconds, r->convert_seconds,
            r->convert_seconds > 0 ? (double)r->bytes_in / 1e6 / r->convert_seconds : 0.0);
}

kiln_status kiln_quantize_file(const kiln_quantize_options *o, kiln_quantize_report *report) {
    KILN_ASSERT(o && o->in_path && o->out_path && o->target && o->n_threads >= 1);
    if ((o->set_output_type && !kiln_from_float_fast(o->output_type)) || (o->set_embd_type && !kiln_from_float_fast(o->embd_type)))
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize: kiln cannot write the requested output / embedding type");
    if (o->n_threads > MAX_CONVERT_THREADS)
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize: %d threads; at most %d", o->n_threads, MAX_CONVERT_THREADS);
    kiln_quantize_report local;
    kiln_quantize_report *rep = report ? report : &local;
    memset(rep, 0, sizeof *rep);
    const uint64_t t0 = kiln_now_ns();

    /* refuse to overwrite the input, by name or through another path to the same file */
    size_t n_out = strlen(o->out_path);
    char *tmp_path = kiln_malloc(n_out + 5);
    if (!tmp_path) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    memcpy(tmp_path, o->out_path, n_out);
    memcpy(tmp_path + n_out, ".tmp", 5);
    const bool clash = !strcmp(o->in_path, o->out_path) || same_file(o->in_path, o->out_path) ||
                       same_file(o->in_path, tmp_path);
    kiln_free(tmp_path);
    if (clash)
        return kiln_fail(KILN_ERR_INVALID_ARG, "output %s is the input file; refusing to overwrite it", o->out_path);

    gguf_file *in = NULL;
    gguf_writer *w = NULL;
    planned *plan = NULL;
    kiln_pool *pool = NULL;
    float *row_bufs = NULL;
    size_t n = 0;
    kiln_status st = gguf_open(o->in_path, &in);
    if (st) goto done;
    n = gguf_n_tensors(in);
    plan = kiln_calloc(n ? n : 1, sizeof *plan);
    if (!plan) { st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); goto done; }
    st = make_plan(in, o, plan, n, rep);
    if (st) { kiln_fail_prefix(st, "%s: ", o->in_path); goto done; }
    if (rep->n_requantized && o->progress)
        fprintf(o->progress, "warning: %d tensor%s of %s already quantized; requantizing loses quality "
                "(start from F32/F16/BF16 where you can)\n", rep->n_requantized, rep->n_requantized == 1 ? " is" : "s are",
                o->in_path);

    uint64_t max_row = 1;
    for (size_t i = 0; i < n; i++)
        if (plan[i].convert && plan[i].row_len > max_row) max_row = plan[i].row_len;
    row_bufs = kiln_malloc(sizeof(float) * (size_t)max_row * (size_t)o->n_threads);
    if (!row_bufs) { st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); goto done; }
    st = kiln_pool_open(o->n_threads, &pool);
    if (st) goto done;

    st = gguf_writer_open(&w);
    if (st) goto done;
    st = copy_metadata(in, w, o->target->ftype);
    for (size_t i = 0; i < n && !st; i++) {
        const planned *p = &plan[i];
        st = gguf_add_tensor(w, p->name, p->out_type, p->src->n_dims, p->src->ne, NULL);
        rep->n_tensors++;
        if (p->convert) {
            rep->n_converted++;
            rep->values_converted += p->row_len * p->n_rows;
        } else {
            rep->n_copied++;
        }
        rep->bytes_in += p->src->nbytes;
        rep->bytes_out += p->out_bytes;
        rep->count_by_type[p->out_type]++;
        rep->bytes_by_type[p->out_type] += p->out_bytes;
    }
    if (st) goto done;
    /* every tensor's bytes come from the callback (copied ones too), in plan order, with a progress line */
    run_state rs = {o, plan, n, pool, row_bufs, max_row, rep};
    st = gguf_writer_write(w, o->out_path, produce_tensor, &rs);
    if (st) { kiln_fail_prefix(st, "%s: ", o->out_path); goto done; }
    rep->seconds = (double)(kiln_now_ns() - t0) * 1e-9;
    if (o->progress) print_summary(o->progress, o, rep);
done:
    gguf_writer_close(w);
    kiln_pool_close(pool);
    kiln_free(row_bufs);
    free_plan(plan, n);
    gguf_close(in);
    return st;
}
