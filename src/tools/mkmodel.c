/* mkmodel.c — real-shaped models with deterministic random weights (see mkmodel.h). */
#include "tools/mkmodel.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/pool.h"
#include "base/timing.h"
#include "formats/formats.h"
#include "gguf/gguf.h"
#include "tools/hf_vocab.h"

/* Published hyperparameters, from each model's Hugging Face config.json:
 *  smollm2-135m   HuggingFaceTB/SmolLM2-135M(-Instruct) config.json (a copy: ../shared/models/tokenizers/
 *                 smollm2-135m-instruct/config.json): hidden 576, 30 layers, 9 heads, 3 KV heads,
 *                 intermediate 1536, vocab 49152, max_position_embeddings 8192, rope_theta 100000,
 *                 rms_norm_eps 1e-5, tie_word_embeddings true.
 *  smollm2-360m   HuggingFaceTB/SmolLM2-360M config.json: hidden 960, 32 layers, 15 heads, 5 KV heads,
 *                 intermediate 2560, vocab 49152, 8192, rope_theta 100000, 1e-5, tied (361,821,120 params).
 *  qwen3-0.6b     Qwen/Qwen3-0.6B config.json: hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128,
 *                 intermediate 3072, vocab 151936, max_position_embeddings 40960, rope_theta 1000000,
 *                 rms_norm_eps 1e-6, tied, per-head q_norm/k_norm.
 *  tinyllama-1.1b TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json: hidden 2048, 22 layers, 32 heads, 4 KV
 *                 heads, intermediate 5632, vocab 32000, 2048, rope_theta 10000, 1e-5, untied.
 *  llama-3.2-1b   meta-llama/Llama-3.2-1B config.json: hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim
 *                 64, intermediate 8192, vocab 128256, max_position_embeddings 131072, rope_theta 500000,
 *                 1e-5, tied. (Its llama3 rope scaling, factor 32 -> rope_freqs.weight, is not written.)
 *  qwen2.5-0.5b   Qwen/Qwen2.5-0.5B config.json: hidden 896, 24 layers, 14 heads, 2 KV heads (head_dim 64),
 *                 intermediate 4864, vocab 151936, max_position_embeddings 32768, rope_theta 1000000,
 *                 rms_norm_eps 1e-6, tied, Q/K/V biases.
 *  qwen3-30b-a3b  Qwen/Qwen3-30B-A3B config.json: hidden 2048, 48 layers, 32 heads, 4 KV heads, head_dim 128,
 *                 intermediate 6144 (written as feed_forward_length; no dense layer uses it), 128 experts,
 *                 8 per token, moe_intermediate_size 768, norm_topk_prob true, vocab 151936,
 *                 max_position_embeddings 40960, rope_theta 1000000, rms_norm_eps 1e-6, untied, q_norm/k_norm.
 *  qwen3moe-tiny  not a published model: qwen3moe with 4 layers of 16 experts (4 used) for quick tests.
 *  llama-3-8b     meta-llama/Meta-Llama-3-8B config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads,
 *                 intermediate 14336, vocab 128256, 8192, rope_theta 500000, 1e-5, untied.
 * The test-* shapes are tiny, for the test suite only. */
static const kiln_mk_shape shapes[] = {
    {"smollm2-135m", "SmolLM2-135M", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, true, false, false, false, 0, 0, 0},
    {"smollm2-360m", "SmolLM2-360M", "llama", 32, 960, 15, 5, 64, 2560, 49152, 8192, 100000.0f, 1e-5f, true, false, false, false, 0, 0, 0},
    {"qwen3-0.6b", "Qwen3-0.6B", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, true, true, false, false, 0, 0, 0},
    {"tinyllama-1.1b", "TinyLlama-1.1B", "llama", 22, 2048, 32, 4, 64, 5632, 32000, 2048, 10000.0f, 1e-5f, false, false, false, false, 0, 0, 0},
    {"llama-3.2-1b", "Llama-3.2-1B", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f, true, false, false, false, 0, 0, 0},
    {"llama-3-8b", "Llama-3-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, false, false, false, false, 0, 0, 0},
    {"qwen2.5-0.5b", "Qwen2.5-0.5B", "qwen2", 24, 896, 14, 2, 64, 4864, 151936, 32768, 1000000.0f, 1e-6f, true, false, false,
     .qkv_bias = true},
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 1000000.0f, 1e-6f, false, true,
     false, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
    {"qwen3moe-tiny", "kiln-qwen3moe-tiny", "qwen3moe", 4, 256, 4, 2, 64, 768, 0, 4096, 1000000.0f, 1e-6f, false, true, false,
     .n_expert = 16, .n_expert_used = 4, .n_ff_exp = 256},
    {"test-llama", "kiln-test-llama", "llama", 2, 256, 4, 2, 64, 512, 0, 512, 10000.0f, 1e-5f, false, false, true, false, 0, 0, 0},
    {"test-qwen3", "kiln-test-qwen3", "qwen3", 2, 128, 4, 2, 64, 256, 0, 512, 1000000.0f, 1e-6f, true, true, true, false, 0, 0, 0},
};

const kiln_mk_shape *kiln_mk_shapes(int *n) {
    *n = (int)(sizeof shapes / sizeof shapes[0]);
    return shapes;
}

const kiln_mk_shape *kiln_mk_find_shape(const char *name) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, name)) return &shapes[i];
    return NULL;
}

/* ------------------------------------------------------------------ values */

#define MK_GOLDEN 0x9E3779B97F4A7C15ull
/* Standard deviation of the sum of four independent uniform 16-bit integers: 2 * sqrt((65536^2 - 1) / 12). */
#define MK_IRWIN_HALL4_STD 37837.2265f

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The start of row `row`'s random stream in the tensor called name: each draw adds MK_GOLDEN and mixes. */
static uint64_t row_stream(uint64_t seed, const char *name, uint64_t row) {
    return mix64(mix64(seed ^ name_hash(name)) + row * MK_GOLDEN);
}

void kiln_mk_fill_row(uint64_t seed, const char *name, uint64_t row, float std, float *y, int64_t n) {
    if (std == 0.0f) {
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f;
        return;
    }
    uint64_t s = row_stream(seed, name, row);
    const float scale = std / MK_IRWIN_HALL4_STD;
    for (int64_t i = 0; i < n; i++) {
        s += MK_GOLDEN;
        uint64_t z = mix64(s);
        int32_t sum = (int32_t)(z & 0xffff) + (int32_t)((z >> 16) & 0xffff) + (int32_t)((z >> 32) & 0xffff) +
                      (int32_t)(z >> 48);
        y[i] = (float)(sum - 131070) * scale; /* exact int->float, one rounding: the same bits everywhere */
    }
}

/* ------------------------------------------------------------------ plan */

static bool is_weight_type(uint32_t t) {
    switch (t) {
    case KILN_TYPE_F32: case KILN_TYPE_F16: case KILN_TYPE_BF16:
    case KILN_TYPE_Q4_0: case KILN_TYPE_Q4_1: case KILN_TYPE_Q5_0: case KILN_TYPE_Q5_1: case KILN_TYPE_Q8_0:
    case KILN_TYPE_Q2_K: case KILN_TYPE_Q3_K: case KILN_TYPE_Q4_K: case KILN_TYPE_Q5_K: case KILN_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

static uint32_t fit_type(uint32_t type, uint64_t ne0, bool *fell_back) {
    *fell_back = false;
    for (int guard = 0; guard < 3; guard++) {
        if (kiln_row_bytes(type, ne0)) return type;
        *fell_back = true;
        switch (type) {
        case KILN_TYPE_Q4_K: type = KILN_TYPE_Q5_0; break;
        case KILN_TYPE_Q5_K: type = KILN_TYPE_Q5_1; break;
        case KILN_TYPE_Q2_K: case KILN_TYPE_Q3_K: type = KILN_TYPE_Q4_0; break;
        case KILN_TYPE_Q6_K: type = KILN_TYPE_Q8_0; break;
        default: type = KILN_TYPE_F16; break;
        }
    }
    return KILN_TYPE_F32;
}

/* Plans a tensor of shape (ne0, ne1, ne2): ne1 == 0 1-D (F32), ne2 == 0 2-D, else ne2 matrices (experts). */
static kiln_status add_planned(kiln_mk_plan *p, int cap, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1,
                               uint64_t ne2, float std) {
    KILN_ASSERT(p->n_tensors < cap);
    kiln_mk_tensor *t = &p->tensors[p->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = !ne1 ? 1 : !ne2 ? 2 : 3;
    t->ne[0] = ne0;
    t->ne[1] = ne1 ? ne1 : 1;
    t->ne[2] = ne2 ? ne2 : 1;
    t->type = ne1 ? fit_type(type, ne0, &t->fallback) : KILN_TYPE_F32;
    t->std = std;
    t->nbytes = kiln_row_bytes(t->type, ne0) * t->ne[1] * t->ne[2];
    p->n_params += ne0 * t->ne[1] * t->ne[2];
    p->data_bytes += t->nbytes;
    return KILN_OK;
}

kiln_status kiln_mk_plan_make(const kiln_mk_shape *shape, int n_layer, int n_vocab, uint32_t type, kiln_mk_plan *out) {
    memset(out, 0, sizeof *out);
    if (!is_weight_type(type))
        return kiln_fail(KILN_ERR_INVALID_ARG, "type %s cannot be a weight type (use f32, f16, bf16, q4_0, q4_1, "
                         "q5_0, q5_1, q8_0, q2_K..q6_K)", kiln_type_get(type) ? kiln_type_get(type)->name : "(unknown)");
    if (n_layer < 0 || n_layer > 512) return kiln_fail(KILN_ERR_INVALID_ARG, "layer count %d is not in 0..512", n_layer);
    if (n_vocab <= 0) return kiln_fail(KILN_ERR_INVALID_ARG, "vocabulary size %d is not positive", n_vocab);
    out->shape = *shape;
    if (n_layer) out->shape.n_layer = n_layer;
    out->shape.n_vocab = n_vocab;
    out->type = type;
    const kiln_mk_shape *s = &out->shape;
    int per_layer = 10 + (s->qk_norm ? 2 : 0) + (s->qkv_bias ? 3 : 0);
    int cap = 3 + s->n_layer * per_layer;
    out->tensors = kiln_calloc((size_t)cap, sizeof *out->tensors);
    if (!out->tensors) return kiln_fail(KILN_ERR_NOMEM, "out of memory planning %d tensors", cap);

    const float w_std = 0.02f;
    uint64_t E = (uint64_t)s->n_embd, V = (uint64_t)n_vocab, F = (uint64_t)s->n_ff;
    uint64_t Q = (uint64_t)s->n_head * (uint64_t)s->head_dim, KV = (uint64_t)s->n_head_kv * (uint64_t)s->head_dim;
    /* The output matrix (the token embedding when tied): Q6_K for quantized types other than Q8_0. */
    bool q = kiln_type_get(type)->is_quantized;
    uint32_t out_type = q && type != KILN_TYPE_Q8_0 ? (E % 256 == 0 ? KILN_TYPE_Q6_K : KILN_TYPE_Q8_0) : type;
    add_planned(out, cap, "token_embd.weight", s->tied ? out_type : type, E, V, 0, w_std);
    char name[64];
    for (int l = 0; l < s->n_layer; l++) {
#define T3(suffix, kind, ty, ne0, ne1, ne2, sd) \
        snprintf(name, sizeof name, "blk.%d.%s." kind, l, suffix); add_planned(out, cap, name, ty, ne0, ne1, ne2, sd)
#define T(suffix, ty, ne0, ne1, sd) T3(suffix, "weight", ty, ne0, ne1, 0, sd)
        T("attn_norm", KILN_TYPE_F32, E, 0, 0.0f);
        T("attn_q", type, E, Q, w_std);
        T("attn_k", type, E, KV, w_std);
        T("attn_v", type, E, KV, w_std);
        if (s->qkv_bias) {
            T3("attn_q", "bias", KILN_TYPE_F32, Q, 0, 0, w_std);
            T3("attn_k", "bias", KILN_TYPE_F32, KV, 0, 0, w_std);
            T3("attn_v", "bias", KILN_TYPE_F32, KV, 0, 0, w_std);
        }
        T("attn_output", type, Q, E, w_std);
        if (s->qk_norm) {
            T("attn_q_norm", KILN_TYPE_F32, (uint64_t)s->head_dim, 0, 0.0f);
            T("attn_k_norm", KILN_TYPE_F32, (uint64_t)s->head_dim, 0, 0.0f);
        }
        T("ffn_norm", KILN_TYPE_F32, E, 0, 0.0f);
        if (s->n_expert) {
            const uint64_t X = (uint64_t)s->n_expert, FX = (uint64_t)s->n_ff_exp;
            T("ffn_gate_inp", KILN_TYPE_F32, E, X, w_std);
            T3("ffn_gate_exps", "weight", type, E, FX, X, w_std);
            T3("ffn_up_exps", "weight", type, E, FX, X, w_std);
            T3("ffn_down_exps", "weight", type, FX, E, X, w_std);
        } else {
            T("ffn_gate", type, E, F, w_std);
            T("ffn_up", type, E, F, w_std);
            T("ffn_down", type, F, E, w_std);
        }
#undef T
#undef T3
    }
    add_planned(out, cap, "output_norm.weight", KILN_TYPE_F32, E, 0, 0, 0.0f);
    if (!s->tied) add_planned(out, cap, "output.weight", out_type, E, V, 0, w_std);
    return KILN_OK;
}

void kiln_mk_plan_free(kiln_mk_plan *plan) {
    if (!plan) return;
    kiln_free(plan->tensors);
    plan->tensors = NULL;
    plan->n_tensors = 0;
}

/* ------------------------------------------------------------------ generation */

typedef struct mk_run {
    const kiln_mk_plan *plan;
    uint64_t seed;
    kiln_pool *pool;
    float *scratch;
    int64_t stride;
    const kiln_mk_tensor *t;    /* the tensor being generated */
    uint8_t *dst;
    size_t row_bytes;
    kiln_from_float_fn from_float;
    FILE *progress;
    bool tty, expert_codes;
    uint64_t done_bytes, t0;
    int last_decile;
} mk_run;

/* Random codes for a block type: every byte of a block drawn at random, then its F16 scale fields set so that
 * the weights have about the tensor's std and mean 0 (Q8_0: d*q, q in -128..127, sd 73.9 d; Q4_0: d*(q-8),
 * sd 4.61 d; Q4_K: d*sc*q - dmin*m with sc, m in 0..63, q in 0..15: dmin = 7.5 d centres it, sd ~260 d). */
typedef struct mk_codes { uint32_t type; int dmin_at; float d_per_std, dmin_per_d; } mk_codes;
static const mk_codes MK_CODES[] = {
    {KILN_TYPE_Q8_0, -1, 1.0f / 73.9f, 0.0f},
    {KILN_TYPE_Q4_0, -1, 1.0f / 4.61f, 0.0f},
    {KILN_TYPE_Q4_K, 2, 1.0f / 260.0f, 7.5f},
};

static const mk_codes *codes_of(uint32_t type) {
    for (size_t i = 0; i < sizeof MK_CODES / sizeof MK_CODES[0]; i++)
        if (MK_CODES[i].type == type) return &MK_CODES[i];
    return NULL;
}

/* Row `row` of tensor t as random codes (d: row_bytes bytes); the same bytes for the same seed. */
static void codes_row(const mk_codes *c, uint64_t seed, const kiln_mk_tensor *t, uint64_t row, uint8_t *d,
                      size_t row_bytes) {
    uint64_t s = row_stream(seed, t->name, row);
    for (size_t i = 0; i < row_bytes; i += 8) {
        s += MK_GOLDEN;
        uint64_t z = mix64(s);
        memcpy(d + i, &z, row_bytes - i < 8 ? row_bytes - i : 8);
    }
    const size_t bb = kiln_type_get(c->type)->type_size;
    const uint16_t hd = kiln_f32_to_f16(t->std * c->d_per_std), hm = kiln_f32_to_f16(t->std * c->d_per_std * c->dmin_per_d);
    for (size_t b = 0; b < row_bytes; b += bb) {
        memcpy(d + b, &hd, 2);  /* d is the first field of each of these blocks */
        if (c->dmin_at >= 0) memcpy(d + b + c->dmin_at, &hm, 2);
    }
}

static void gen_worker(void *ctx, int ith, int nth) {
    mk_run *r = ctx;
    const kiln_mk_tensor *t = r->t;
    int lo, hi;
    kiln_split((int)(t->ne[1] * t->ne[2]), ith, nth, &lo, &hi);  /* the rows of every matrix, one stream each */
    float *buf = r->scratch + (size_t)ith * (size_t)r->stride;
    const mk_codes *codes = r->expert_codes && t->n_dims == 3 ? codes_of(t->type) : NULL;
    for (int row = lo; row < hi; row++) {
        uint8_t *d = r->dst + (size_t)row * r->row_bytes;
        if (codes) {
            codes_row(codes, r->seed, t, (uint64_t)row, d, r->row_bytes);
        } else if (t->type == KILN_TYPE_F32) {
            kiln_mk_fill_row(r->seed, t->name, (uint64_t)row, t->std, (float *)(void *)d, (int64_t)t->ne[0]);
        } else {
            kiln_mk_fill_row(r->seed, t->name, (uint64_t)row, t->std, buf, (int64_t)t->ne[0]);
            r->from_float(buf, d, (int64_t)t->ne[0]);
        }
    }
}

static kiln_status gen_tensor(void *ctx, size_t i, void *dst, uint64_t nbytes) {
    mk_run *r = ctx;
    KILN_ASSERT(i < (size_t)r->plan->n_tensors);
    const kiln_mk_tensor *t = &r->plan->tensors[i];
    if (nbytes != t->nbytes)
        return kiln_fail(KILN_ERR_INTERNAL, "mkmodel: tensor '%s' needs %llu bytes, the writer gave %llu", t->name,
                         (unsigned long long)t->nbytes, (unsigned long long)nbytes);
    r->t = t;
    r->dst = dst;
    r->row_bytes = kiln_row_bytes(t->type, t->ne[0]);
    /* the fastest quantizer that writes the reference's bytes (K types: ~6x the reference's speed) */
    r->from_float = kiln_from_float_fast(t->type);
    kiln_pool_run(r->pool, gen_worker, r);
    r->done_bytes += nbytes;
    if (r->progress) {
        double frac = r->plan->data_bytes ? (double)r->done_bytes / (double)r->plan->data_bytes : 1.0;
        double secs = (double)(kiln_now_ns() - r->t0) * 1e-9;
        if (r->tty) {
            fprintf(r->progress, "\rmkmodel: [%4zu/%d] %5.1f%%  %7.1f MB  %6.1f s  %-32s", i + 1, r->plan->n_tensors,
                    100.0 * frac, (double)r->done_bytes / 1e6, secs, t->name);
            fflush(r->progress);
        } else if ((int)(frac * 10.0) > r->last_decile || i + 1 == (size_t)r->plan->n_tensors) {
            r->last_decile = (int)(frac * 10.0);
            fprintf(r->progress, "mkmodel: %5.1f%%  %7.1f MB  %6.1f s\n", 100.0 * frac, (double)r->done_bytes / 1e6, secs);
        }
    }
    return KILN_OK;
}

/* ------------------------------------------------------------------ vocabulary */

static bool is_gguf_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char m[4] = {0};
    size_t n = fread(m, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(m, "GGUF", 4);
}

/* True when the file's first byte after white space opens a JSON object (a tokenizer.json does). */
static bool looks_like_json_object(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return true; /* the JSON loader reports the open error */
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r') {}
    fclose(f);
    return c == '{';
}

/* Copies the vocabulary's tokenizer.* keys into w; *n_vocab receives its token count. */
static kiln_status put_vocab(const char *path, gguf_writer *w, uint32_t *n_vocab) {
    struct stat st;
    if (stat(path, &st) != 0) return kiln_fail(KILN_ERR_IO, "--vocab %s: no such file or directory", path);
    if (S_ISREG(st.st_mode) && is_gguf_file(path)) {
        gguf_file *f;
        KILN_TRY(gguf_open(path, &f));
        gguf_arr toks;
        kiln_status s = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks);
        if (s == KILN_OK && (toks.n == 0 || toks.n > (1u << 24)))
            s = kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", path, (unsigned long long)toks.n);
        if (s == KILN_OK) *n_vocab = (uint32_t)toks.n;
        for (size_t i = 0; s == KILN_OK && i < gguf_n_kv(f); i++) {
            const gguf_kv *kv = gguf_kv_at(f, i);
            if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
            char key[GGUF_MAX_KEY_LEN + 1];
            memcpy(key, kv->key.ptr, (size_t)kv->key.len);
            key[kv->key.len] = '\0';
            s = gguf_set_value(w, key, &kv->value);
        }
        gguf_close(f);
        if (s != KILN_OK) kiln_fail_prefix(s, "--vocab %s: ", path);
        return s;
    }
    if (S_ISREG(st.st_mode) && !looks_like_json_object(path)) {
        const size_t n = strlen(path);
        const bool dot_model = n >= 6 && !strcmp(path + n - 6, ".model");
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--vocab %s: neither a tokenizer.json nor a GGUF file%s; mkmodel "
                         "needs the model's Hugging Face tokenizer.json (or the folder holding it) or a GGUF with "
                         "tokenizer.* keys", path,
                         dot_model ? " (a SentencePiece or tiktoken tokenizer.model is not supported)" : "");
    }
    kiln_hf_vocab *v;
    KILN_TRY(kiln_hf_vocab_load(path, &v));
    kiln_status s = kiln_hf_vocab_write(v, w);
    *n_vocab = v->n_tokens;
    kiln_hf_vocab_free(v);
    return s;
}

/* ------------------------------------------------------------------ the file */

/* llama.cpp's general.file_type (LLAMA_FTYPE_*) for a file whose matrices are mostly `type`. */
static uint32_t file_type_of(uint32_t type) {
    switch (type) {
    case KILN_TYPE_F32: return 0;
    case KILN_TYPE_F16: return 1;
    case KILN_TYPE_Q4_0: return 2;
    case KILN_TYPE_Q4_1: return 3;
    case KILN_TYPE_Q8_0: return 7;
    case KILN_TYPE_Q5_0: return 8;
    case KILN_TYPE_Q5_1: return 9;
    case KILN_TYPE_Q2_K: return 10;
    case KILN_TYPE_Q3_K: return 11;  /* Q3_K_S */
    case KILN_TYPE_Q4_K: return 14;  /* Q4_K_S */
    case KILN_TYPE_Q5_K: return 16;  /* Q5_K_S */
    case KILN_TYPE_Q6_K: return 18;
    case KILN_TYPE_BF16: return 32;
    default: return 0;
    }
}

static kiln_status put_keys(gguf_writer *w, const kiln_mk_shape *s, uint32_t type, uint64_t seed) {
    char key[128], name[160];
    KILN_TRY(gguf_set_str(w, "general.architecture", s->arch, strlen(s->arch)));
    KILN_TRY(gguf_set_str(w, "general.type", "model", 5));
    int n = snprintf(name, sizeof name, "%s (random weights, kiln mkmodel seed %llu)", s->model_name,
                     (unsigned long long)seed);
    KILN_TRY(gguf_set_str(w, "general.name", name, (size_t)n));
    KILN_TRY(gguf_set_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT));
    KILN_TRY(gguf_set_u32(w, "general.file_type", file_type_of(type)));
    KILN_TRY(gguf_set_u32(w, "general.quantization_version", 2));
#define U32(suffix, v) snprintf(key, sizeof key, "%s." suffix, s->arch); KILN_TRY(gguf_set_u32(w, key, (uint32_t)(v)))
#define F32(suffix, v) snprintf(key, sizeof key, "%s." suffix, s->arch); KILN_TRY(gguf_set_f32(w, key, (v)))
    U32("vocab_size", s->n_vocab);
    U32("context_length", s->n_ctx);
    U32("embedding_length", s->n_embd);
    U32("block_count", s->n_layer);
    U32("feed_forward_length", s->n_ff);
    U32("rope.dimension_count", s->head_dim);
    U32("attention.head_count", s->n_head);
    U32("attention.head_count_kv", s->n_head_kv);
    if (s->qk_norm || s->head_dim * s->n_head != s->n_embd) {
        U32("attention.key_length", s->head_dim);
        U32("attention.value_length", s->head_dim);
    }
    if (s->n_expert) {
        U32("expert_count", s->n_expert);
        U32("expert_used_count", s->n_expert_used);
        U32("expert_feed_forward_length", s->n_ff_exp);
    }
    F32("rope.freq_base", s->rope_base);
    F32("attention.layer_norm_rms_epsilon", s->rms_eps);
#undef U32
#undef F32
    return KILN_OK;
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

kiln_status kiln_mkmodel(const kiln_mk_opts *o, kiln_mk_result *result) {
    if (result) memset(result, 0, sizeof *result);
    const kiln_mk_shape *shape = o->shape ? kiln_mk_find_shape(o->shape) : NULL;
    if (!shape) return kiln_fail(KILN_ERR_INVALID_ARG, "unknown shape '%s'", o->shape ? o->shape : "(none)");
    if (!o->vocab || !o->out) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel needs a vocabulary and an output path");
    if (!kiln_type_get(o->type)) return kiln_fail(KILN_ERR_INVALID_ARG, "unknown type id %u", o->type);
    if (o->n_threads < 0 || o->n_threads > 256) return kiln_fail(KILN_ERR_INVALID_ARG, "thread count %d is not in 0..256", o->n_threads);
    uint64_t t0 = kiln_now_ns();

    gguf_writer *w = NULL;
    kiln_mk_plan plan = {0};
    kiln_pool *pool = NULL;
    float *scratch = NULL;
    uint32_t n_vocab = 0;
    kiln_status st = gguf_writer_open(&w);
    if (st) return st;
    if (!is_weight_type(o->type))
        st = kiln_fail(KILN_ERR_INVALID_ARG, "type %s cannot be a weight type (use f32, f16, bf16, q4_0, q4_1, "
                       "q5_0, q5_1, q8_0, q2_K..q6_K)", kiln_type_get(o->type)->name);
    if (!st && (o->n_layer < 0 || o->n_layer > 512))
        st = kiln_fail(KILN_ERR_INVALID_ARG, "layer count %d is not in 0..512", o->n_layer);
    /* general.* and hyperparameter keys first, then the vocabulary's, then the vocabulary size. */
    kiln_mk_shape keyed = *shape;
    if (o->n_layer) keyed.n_layer = o->n_layer;
    if (!st) st = put_keys(w, &keyed, o->type, o->seed);
    if (!st) st = put_vocab(o->vocab, w, &n_vocab);
    if (!st) {
        char key[64];
        snprintf(key, sizeof key, "%s.vocab_size", shape->arch);
        st = gguf_set_u32(w, key, n_vocab);
    }
    if (!st) st = kiln_mk_plan_make(shape, o->n_layer, (int)n_vocab, o->type, &plan);
    if (!st && o->expert_codes && !shape->n_expert)
        st = kiln_fail(KILN_ERR_INVALID_ARG, "--expert-codes: shape %s has no expert tensors", shape->name);
    if (!st && o->expert_codes && !codes_of(o->type))
        st = kiln_fail(KILN_ERR_INVALID_ARG, "--expert-codes: type %s has no random-code layout (q4_0, q8_0, q4_K)",
                       kiln_type_get(o->type)->name);
    /* Every planned type needs a quantizer (F32 is copied). */
    for (int i = 0; !st && i < plan.n_tensors; i++) {
        const kiln_mk_tensor *t = &plan.tensors[i];
        if (t->type != KILN_TYPE_F32 && !kiln_type_get(t->type)->from_float)
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "type %s has no quantizer in this build (needed for %s)",
                           kiln_type_get(t->type)->name, t->name);
    }
    for (int i = 0; !st && i < plan.n_tensors; i++) {
        const kiln_mk_tensor *t = &plan.tensors[i];
        st = gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL);
    }
    int nth = o->n_threads ? o->n_threads : online_cpus();
    if (!st) st = kiln_pool_open(nth, &pool);
    int64_t stride = 0;
    for (int i = 0; i < plan.n_tensors; i++)
        if ((int64_t)plan.tensors[i].ne[0] > stride) stride = (int64_t)plan.tensors[i].ne[0];
    stride = (stride + 15) & ~(int64_t)15;
    if (!st) {
        scratch = kiln_aligned_alloc(64, (size_t)nth * (size_t)stride * sizeof(float));
        if (!scratch) st = kiln_fail(KILN_ERR_NOMEM, "out of memory for %d row buffers", nth);
    }
    if (!st && o->progress) {
        fprintf(o->progress, "mkmodel: %s (%s), %d layers, vocab %u, %s: %d tensors, %.1fM params, %.1f MB of data, "
                "seed %llu, %d threads\n", shape->name, shape->arch, plan.shape.n_layer, n_vocab,
                kiln_type_get(o->type)->name, plan.n_tensors, (double)plan.n_params / 1e6, (double)plan.data_bytes / 1e6,
                (unsigned long long)o->seed, nth);
        if (shape->n_vocab && (int)n_vocab != shape->n_vocab)
            fprintf(o->progress, "mkmodel: note: the vocabulary has %u tokens; %s was published with %d\n", n_vocab,
                    shape->name, shape->n_vocab);
        for (int i = 0; i < plan.n_tensors; i++) {
            const kiln_mk_tensor *t = &plan.tensors[i];
            if (t->fallback)
                fprintf(o->progress, "mkmodel: note: %s: row length %llu does not fit %s blocks, using %s\n", t->name,
                        (unsigned long long)t->ne[0], kiln_type_get(o->type)->name, kiln_type_get(t->type)->name);
        }
    }
    if (!st) {
        mk_run run = {.plan = &plan, .seed = o->seed, .pool = pool, .scratch = scratch, .stride = stride,
                      .expert_codes = o->expert_codes,
                      .progress = o->progress, .tty = o->progress && isatty(fileno(o->progress)), .t0 = kiln_now_ns()};
        st = gguf_writer_write(w, o->out, gen_tensor, &run);
        if (run.tty) fputc('\n', o->progress);
    }
    if (!st && result) {
        struct stat sb;
        result->n_tensors = plan.n_tensors;
        result->n_vocab = n_vocab;
        result->n_params = plan.n_params;
        result->data_bytes = plan.data_bytes;
        result->file_bytes = stat(o->out, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        result->seconds = (double)(kiln_now_ns() - t0) * 1e-9;
    }
    kiln_free(scratch);
    if (pool) kiln_pool_close(pool);
    kiln_mk_plan_free(&plan);
    gguf_writer_close(w);
    return st;
}
