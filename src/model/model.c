/*
 * model.c — kiln_model_open: map and parse the GGUF, read the hyperparameters of a llama-family
 * architecture (llama, qwen2, qwen3, qwen3moe), bind every tensor by name with its expected shape (the
 * experts of a MoE layer as 3-D tensors, one matrix per expert), load the tokenizer. RoPE: the frequency factors of rope_freqs.weight and linear scaling are applied; every
 * other RoPE scaling (YaRN, LongRoPE, an attention factor) is refused at open, never ignored. A tensor
 * the architecture does not use is a warning (an error with kiln_model_options.strict).
 * Everything is a view into the map; nothing here knows about backends.
 */
#include "model/model.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "formats/formats.h"

/* Hard caps on hyperparameters read from a file. */
#define MAX_EMBD (1 << 16)
#define MAX_HEADS 1024
#define MAX_FF (1 << 20)
#define MAX_VOCAB (1 << 22)
#define MAX_CTX (1 << 24)
#define MAX_EXPERTS 512      /* llama.cpp's LLAMA_MAX_EXPERTS */
#define MAX_EXPERTS_USED 64

typedef struct arch_desc {
    const char *name;
    bool rope_neox, qkv_bias, qk_norm;
    bool moe;   /* the feed-forward of every layer is a mixture of experts (chosen weights renormalized) */
} arch_desc;

static const arch_desc archs[] = {
    {"llama", false, false, false, false},
    {"qwen2", true, true, false, false},
    {"qwen3", true, false, true, false},
    {"qwen3moe", true, false, true, true},
};

/* Reads "<arch>.<suffix>" as a u32 within [lo, hi]; def >= 0 is used when the key is absent. */
static kiln_status read_hparam(const gguf_file *f, const char *arch, const char *suffix, long def,
                               long lo, long hi, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) {
        if (def < 0) return kiln_fail(KILN_ERR_FORMAT, "missing hyperparameter '%s'", key);
        *out = (int)def;
        return KILN_OK;
    }
    int64_t v;
    KILN_TRY(gguf_get_i64(f, key, &v));
    if (v < lo || v > hi)
        return kiln_fail(KILN_ERR_FORMAT, "hyperparameter '%s' = %lld is out of range %ld..%ld", key, (long long)v, lo, hi);
    *out = (int)v;
    return KILN_OK;
}

static kiln_status read_hparam_f32(const gguf_file *f, const char *arch, const char *suffix, float def, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) { *out = def; return KILN_OK; }
    KILN_TRY(gguf_get_f32(f, key, out));
    if (!(*out > 0.0f) || *out > 1e12f)
        return kiln_fail(KILN_ERR_FORMAT, "hyperparameter '%s' = %g is out of range", key, (double)*out);
    return KILN_OK;
}

/* "<arch>.rope.scaling.*" and the older "<arch>.rope.scale_linear", read as llama.cpp does: type absent =
 * linear; factor from .scaling.factor, else .scale_linear; factor 0 = 1; type none never scales. What kiln
 * does not implement (YaRN, LongRoPE, an attention factor != 1, any other scaling key) is refused naming
 * the key. */
static kiln_status read_rope_scaling(const gguf_file *f, const char *a, kiln_hparams *hp) {
    char key[128], prefix[96];
    snprintf(prefix, sizeof prefix, "%s.rope.scaling.", a);
    const size_t np = strlen(prefix);
    for (size_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (kv->key.len < np || memcmp(kv->key.ptr, prefix, np)) continue;
        const gguf_str rest = {kv->key.ptr + np, kv->key.len - np};
        if (gguf_str_eq(rest, "type") || gguf_str_eq(rest, "factor") || gguf_str_eq(rest, "attn_factor") ||
            gguf_str_eq(rest, "original_context_length") || gguf_str_eq(rest, "finetuned"))
            continue;
        return kiln_fail(KILN_ERR_UNSUPPORTED, "metadata key '%.*s' (offset %llu): this RoPE scaling parameter is not "
                         "implemented by kiln (linear scaling and rope_freqs are)", (int)(kv->key.len > 128 ? 128 : kv->key.len),
                         kv->key.ptr, (unsigned long long)kv->offset);
    }
    bool scales = true;
    snprintf(key, sizeof key, "%stype", prefix);
    if (gguf_find(f, key)) {
        gguf_str t;
        KILN_TRY(gguf_get_str(f, key, &t));
        if (gguf_str_eq(t, "none")) scales = false;
        else if (!gguf_str_eq(t, "linear"))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "metadata key '%s' = '%.*s': kiln implements RoPE scaling 'none' and "
                             "'linear' only", key, (int)(t.len > 32 ? 32 : t.len), t.ptr);
    }
    float factor = 0.0f;
    snprintf(key, sizeof key, "%sfactor", prefix);
    if (!gguf_find(f, key)) snprintf(key, sizeof key, "%s.rope.scale_linear", a);
    if (gguf_find(f, key)) {
        KILN_TRY(gguf_get_f32(f, key, &factor));
        if (!(factor >= 0.0f && factor <= 1e6f))
            return kiln_fail(KILN_ERR_FORMAT, "metadata key '%s' = %g is out of range 0..1e6", key, (double)factor);
    }
    hp->rope_freq_scale = scales && factor != 0.0f ? 1.0f / factor : 1.0f;
    snprintf(key, sizeof key, "%sattn_factor", prefix);
    if (gguf_find(f, key)) {
        float af;
        KILN_TRY(gguf_get_f32(f, key, &af));
        if (af != 1.0f)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "metadata key '%s' = %g: a RoPE attention factor other than 1 is not "
                             "implemented by kiln", key, (double)af);
    }
    return KILN_OK;
}

/* "<arch>.expert_count", "expert_used_count" (1 <= used <= count) and "expert_feed_forward_length" of a MoE
 * architecture (qwen3moe renormalizes the chosen experts' weights, as llama.cpp does for it); a dense
 * architecture must not carry expert counts. */
static kiln_status read_moe_hparams(const gguf_file *f, const char *a, bool moe, kiln_hparams *hp) {
    char key[128];
    snprintf(key, sizeof key, "%s.expert_count", a);
    if (!moe) {
        int n = 0;
        KILN_TRY(read_hparam(f, a, "expert_count", 0, 0, MAX_EXPERTS, &n));
        if (n > 0)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "metadata key '%s' = %d: architecture %s has no mixture-of-experts "
                             "layers in kiln", key, n, a);
        return KILN_OK;
    }
    KILN_TRY(read_hparam(f, a, "expert_count", -1, 1, MAX_EXPERTS, &hp->n_expert));
    KILN_TRY(read_hparam(f, a, "expert_used_count", -1, 1, MAX_EXPERTS_USED, &hp->n_expert_used));
    if (hp->n_expert_used > hp->n_expert)
        return kiln_fail(KILN_ERR_FORMAT, "%s.expert_used_count %d is more than %s = %d", a, hp->n_expert_used, key,
                         hp->n_expert);
    KILN_TRY(read_hparam(f, a, "expert_feed_forward_length", -1, 1, MAX_FF, &hp->n_ff_exp));
    hp->moe_norm_topk = true;
    return KILN_OK;
}

static kiln_status read_hparams(const gguf_file *f, kiln_hparams *hp, const arch_desc **desc) {
    gguf_str arch;
    KILN_TRY(gguf_get_str(f, "general.architecture", &arch));
    *desc = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (gguf_str_eq(arch, archs[i].name)) *desc = &archs[i];
    if (!*desc)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "architecture '%.*s' is not supported (llama, qwen2, qwen3, qwen3moe are)",
                         (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    const char *a = (*desc)->name;
    snprintf(hp->arch, sizeof hp->arch, "%s", a);
    KILN_TRY(read_hparam(f, a, "block_count", -1, 1, KILN_MAX_LAYERS, &hp->n_layer));
    KILN_TRY(read_hparam(f, a, "context_length", 2048, 1, MAX_CTX, &hp->n_ctx_train));
    KILN_TRY(read_hparam(f, a, "embedding_length", -1, 1, MAX_EMBD, &hp->n_embd));
    KILN_TRY(read_moe_hparams(f, a, (*desc)->moe, hp));
    KILN_TRY(read_hparam(f, a, "feed_forward_length", hp->n_expert ? 0 : -1, hp->n_expert ? 0 : 1, MAX_FF, &hp->n_ff));
    KILN_TRY(read_hparam(f, a, "attention.head_count", -1, 1, MAX_HEADS, &hp->n_head));
    KILN_TRY(read_hparam(f, a, "attention.head_count_kv", hp->n_head, 1, MAX_HEADS, &hp->n_head_kv));
    if (hp->n_head % hp->n_head_kv)
        return kiln_fail(KILN_ERR_FORMAT, "%s.attention.head_count %d is not a multiple of head_count_kv %d", a,
                         hp->n_head, hp->n_head_kv);
    int def_hd = hp->n_embd % hp->n_head ? -1 : hp->n_embd / hp->n_head;
    KILN_TRY(read_hparam(f, a, "attention.key_length", def_hd, 2, 1024, &hp->head_dim));
    int vlen;
    KILN_TRY(read_hparam(f, a, "attention.value_length", hp->head_dim, 2, 1024, &vlen));
    if (vlen != hp->head_dim)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s.attention.value_length %d != key_length %d", a, vlen, hp->head_dim);
    if (hp->head_dim % 2) return kiln_fail(KILN_ERR_FORMAT, "%s: head dimension %d is odd", a, hp->head_dim);
    KILN_TRY(read_hparam(f, a, "rope.dimension_count", hp->head_dim, 2, hp->head_dim, &hp->n_rot));
    if (hp->n_rot % 2) return kiln_fail(KILN_ERR_FORMAT, "%s.rope.dimension_count %d is odd", a, hp->n_rot);
    KILN_TRY(read_hparam_f32(f, a, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps));
    KILN_TRY(read_hparam_f32(f, a, "rope.freq_base", 10000.0f, &hp->rope_base));
    KILN_TRY(read_rope_scaling(f, a, hp));
    hp->rope_neox = (*desc)->rope_neox;
    hp->has_qkv_bias = (*desc)->qkv_bias;
    hp->has_qk_norm = (*desc)->qk_norm;
    return KILN_OK;
}

/* The file being bound and, per tensor of its table, whether the model uses it. */
typedef struct binder {
    const gguf_file *f;
    bool *used;   /* gguf_n_tensors(f) entries */
} binder;

/* "[a, b, c]" of the first n dimensions. */
static const char *shape_str(char *buf, size_t cap, const uint64_t *ne, int n) {
    int o = snprintf(buf, cap, "[");
    for (int i = 0; i < n && o > 0 && (size_t)o < cap; i++)
        o += snprintf(buf + o, cap - (size_t)o, "%s%llu", i ? ", " : "", (unsigned long long)ne[i]);
    if (o > 0 && (size_t)o < cap) snprintf(buf + o, cap - (size_t)o, "]");
    return buf;
}

/* Binds tensor `name` expecting shape (ne0, ne1, ne2): ne1 == 0 a 1-D tensor of ne0, ne2 == 0 a 2-D one, else
 * 3-D (ne2 matrices of ne1 rows, one per expert). Marks it used. */
static kiln_status bind3(binder *b, const char *name, uint64_t ne0, uint64_t ne1, uint64_t ne2, bool optional,
                         kiln_weight *w) {
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    const int n_dims = !ne1 ? 1 : !ne2 ? 2 : 3;
    const uint64_t want[4] = {ne0, ne1 ? ne1 : 1, ne2 ? ne2 : 1, 1};
    char ws[96], hs[96];
    const gguf_tensor *t = gguf_find_tensor(b->f, name);
    if (!t) {
        if (optional) return KILN_OK;
        return kiln_fail(KILN_ERR_FORMAT, "missing tensor '%s' (expected shape %s)", name, shape_str(ws, sizeof ws, want, n_dims));
    }
    if (memcmp(t->ne, want, sizeof want))
        return kiln_fail(KILN_ERR_FORMAT, "tensor '%s' has shape %s, expected %s", name, shape_str(hs, sizeof hs, t->ne, 4),
                         shape_str(ws, sizeof ws, want, n_dims));
    const kiln_type_info *ti = kiln_type_get(t->type);
    if (!ti || !ti->to_float || !ti->vec_dot)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%s' has type %s, which kiln cannot compute with", name,
                         ti ? ti->name : "unknown");
    if (n_dims == 1 && t->type != KILN_TYPE_F32)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%s' (1-D) has type %s; kiln expects f32", name, ti->name);
    b->used[t - gguf_tensor_at(b->f, 0)] = true;
    w->data = t->data;
    w->type = t->type;
    memcpy(w->ne, want, sizeof w->ne);
    w->nbytes = t->nbytes;
    return KILN_OK;
}

static kiln_status bind(binder *b, const char *name, uint64_t ne0, uint64_t ne1, bool optional, kiln_weight *w) {
    return bind3(b, name, ne0, ne1, 0, optional, w);
}

/* The feed-forward of layer il: dense SwiGLU, or the router and the 3-D experts of a MoE layer. */
static kiln_status bind_ffn(binder *b, const kiln_hparams *hp, int il, kiln_layer *L) {
    char n[64];
    const uint64_t e = (uint64_t)hp->n_embd, ff = (uint64_t)hp->n_ff, fx = (uint64_t)hp->n_ff_exp,
                   nx = (uint64_t)hp->n_expert;
#define B(suffix, d0, d1, d2, dst) snprintf(n, sizeof n, "blk.%d." suffix, il); KILN_TRY(bind3(b, n, d0, d1, d2, false, dst))
    B("ffn_norm.weight", e, 0, 0, &L->ffn_norm);
    if (!hp->n_expert) {
        B("ffn_gate.weight", e, ff, 0, &L->w_gate);
        B("ffn_up.weight", e, ff, 0, &L->w_up);
        B("ffn_down.weight", ff, e, 0, &L->w_down);
        return KILN_OK;
    }
    B("ffn_gate_inp.weight", e, nx, 0, &L->ffn_gate_inp);
    B("ffn_gate_exps.weight", e, fx, nx, &L->ffn_gate_exps);
    B("ffn_up_exps.weight", e, fx, nx, &L->ffn_up_exps);
    B("ffn_down_exps.weight", fx, e, nx, &L->ffn_down_exps);
#undef B
    return KILN_OK;
}

static kiln_status bind_layer(binder *b, const kiln_hparams *hp, int il, kiln_layer *L) {
    char n[64];
    const uint64_t e = (uint64_t)hp->n_embd, qd = (uint64_t)hp->n_head * hp->head_dim,
                   kvd = (uint64_t)hp->n_head_kv * hp->head_dim;
#define B(suffix, r, c, opt, dst) \
    snprintf(n, sizeof n, "blk.%d." suffix, il); KILN_TRY(bind(b, n, r, c, opt, dst))
    B("attn_norm.weight", e, 0, false, &L->attn_norm);
    B("attn_q.weight", e, qd, false, &L->wq);
    B("attn_k.weight", e, kvd, false, &L->wk);
    B("attn_v.weight", e, kvd, false, &L->wv);
    B("attn_output.weight", qd, e, false, &L->wo);
    B("attn_q.bias", qd, 0, !hp->has_qkv_bias, &L->bq);
    B("attn_k.bias", kvd, 0, !hp->has_qkv_bias, &L->bk);
    B("attn_v.bias", kvd, 0, !hp->has_qkv_bias, &L->bv);
    B("attn_q_norm.weight", (uint64_t)hp->head_dim, 0, !hp->has_qk_norm, &L->q_norm);
    B("attn_k_norm.weight", (uint64_t)hp->head_dim, 0, !hp->has_qk_norm, &L->k_norm);
#undef B
    return bind_ffn(b, hp, il, L);
}

/* rope_freqs.weight (optional): n_rot/2 F32 factors, each finite and > 0 (ggml divides by them). */
static kiln_status bind_rope_freqs(binder *b, kiln_model *m) {
    KILN_TRY(bind(b, "rope_freqs.weight", (uint64_t)(m->hp.n_rot / 2), 0, true, &m->rope_freqs));
    const float *ff = m->rope_freqs.data;
    for (int i = 0; ff && i < m->hp.n_rot / 2; i++)
        if (!(ff[i] > 0.0f && ff[i] <= 3.0e38f))
            return kiln_fail(KILN_ERR_FORMAT, "tensor 'rope_freqs.weight' element %d is %g (a RoPE frequency divisor "
                             "must be finite and > 0)", i, (double)ff[i]);
    return KILN_OK;
}

static kiln_status bind_model(kiln_model *m, binder *b) {
    const gguf_file *f = m->file;
    kiln_hparams *hp = &m->hp;
    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te) return kiln_fail(KILN_ERR_FORMAT, "missing tensor 'token_embd.weight' (expected shape [%d, n_vocab])", hp->n_embd);
    if (te->ne[1] < 1 || te->ne[1] > MAX_VOCAB)
        return kiln_fail(KILN_ERR_FORMAT, "tensor 'token_embd.weight' has %llu rows (vocabulary size out of range)",
                         (unsigned long long)te->ne[1]);
    hp->n_vocab = (int)te->ne[1];
    KILN_TRY(bind(b, "token_embd.weight", (uint64_t)hp->n_embd, (uint64_t)hp->n_vocab, false, &m->tok_embd));
    KILN_TRY(bind(b, "output_norm.weight", (uint64_t)hp->n_embd, 0, false, &m->output_norm));
    KILN_TRY(bind(b, "output.weight", (uint64_t)hp->n_embd, (uint64_t)hp->n_vocab, true, &m->output));
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->tied_output = true;
    }
    KILN_TRY(bind_rope_freqs(b, m));
    m->layers = kiln_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kiln_fail(KILN_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++) KILN_TRY(bind_layer(b, hp, il, &m->layers[il]));
    return KILN_OK;
}

/* Every tensor of the file that binding left unused: an error when strict, else a warning naming it
 * (the first few by name, then a count). */
static kiln_status check_unused(const kiln_model *m, const binder *b, bool strict) {
    const size_t n = gguf_n_tensors(m->file);
    size_t n_unused = 0;
    for (size_t i = 0; i < n; i++) {
        if (b->used[i]) continue;
        const gguf_tensor *t = gguf_tensor_at(m->file, i);
        const int len = (int)(t->name.len > 96 ? 96 : t->name.len);
        if (strict)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "tensor '%.*s' is not used by architecture %s (strict open refuses "
                             "files with tensors kiln would ignore)", len, t->name.ptr, m->hp.arch);
        if (n_unused++ < 8)
            KILN_WARN("%s: tensor '%.*s' is not used by architecture %s; ignored", gguf_path(m->file), len, t->name.ptr,
                      m->hp.arch);
    }
    if (n_unused > 8) KILN_WARN("%s: %zu more tensors are not used", gguf_path(m->file), n_unused - 8);
    return KILN_OK;
}

/* Reads the hyperparameters and binds every tensor (the open.model phase). */
static kiln_status build_model(kiln_model *m, bool strict) {
    const arch_desc *desc;
    KILN_TRY(read_hparams(m->file, &m->hp, &desc));
    binder b = {.f = m->file, .used = kiln_calloc(gguf_n_tensors(m->file) + 1, sizeof(bool))};
    if (!b.used) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the tensor table");
    kiln_status st = bind_model(m, &b);
    if (st == KILN_OK) st = check_unused(m, &b, strict);
    kiln_free(b.used);
    return st;
}

kiln_status kiln_model_open(const char *path, kiln_model **out) { return kiln_model_open_ex(path, NULL, out); }

kiln_status kiln_model_open_ex(const char *path, const kiln_model_options *opt, kiln_model **out) {
    if (!out) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_model_open: out is NULL");
    *out = NULL;
    if (!path) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_model_open: path is NULL");
    const bool strict = opt && opt->strict;
    kiln_model *m = kiln_calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "kiln_model_open: out of memory");
    kiln_status st = gguf_open(path, &m->file);
    if (st != KILN_OK) { kiln_free(m); return st; }
    uint64_t map_ns, parse_ns;
    gguf_open_ns(m->file, &map_ns, &parse_ns);
    kiln_phases_add(&m->phases, "open.map", map_ns);
    kiln_phases_add(&m->phases, "open.parse", parse_ns);

    uint64_t t0 = kiln_now_ns();
    st = build_model(m, strict);
    if (st != KILN_OK) {
        kiln_fail_prefix(st, "%s: ", path);
        kiln_model_close(m);
        return st;
    }
    gguf_str name;
    if (gguf_find(m->file, "general.name") && gguf_get_str(m->file, "general.name", &name) == KILN_OK)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len > 127 ? 127 : name.len), name.ptr);
    kiln_phases_add(&m->phases, "open.model", kiln_now_ns() - t0);

    t0 = kiln_now_ns();
    st = kiln_tokenizer_open(m->file, &m->tok);
    if (st != KILN_OK) {
        kiln_fail_prefix(st, "%s: tokenizer: ", path);
        kiln_model_close(m);
        return st;
    }
    if (kiln_tokenizer_n_vocab(m->tok) > m->hp.n_vocab)
        KILN_WARN("%s: the tokenizer has %d tokens but token_embd.weight only %d rows", path,
                  kiln_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
    kiln_phases_add(&m->phases, "open.tokenizer", kiln_now_ns() - t0);
    *out = m;
    return KILN_OK;
}

void kiln_model_close(kiln_model *m) {
    if (!m) return;
    kiln_tokenizer_close(m->tok);
    kiln_free(m->layers);
    gguf_close(m->file);
    kiln_free(m);
}

void kiln_model_get_info(const kiln_model *m, kiln_model_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!m) { /* the neutral answer for no model */
        out->arch = out->name = "";
        out->bos_id = out->eos_id = -1;
        return;
    }
    const kiln_hparams *hp = &m->hp;
    out->arch = hp->arch;
    out->name = m->name;
    out->n_vocab = hp->n_vocab;
    out->n_ctx_train = hp->n_ctx_train;
    out->n_embd = hp->n_embd;
    out->n_layer = hp->n_layer;
    out->n_head = hp->n_head;
    out->n_head_kv = hp->n_head_kv;
    out->n_ff = hp->n_ff;
    out->head_dim = hp->head_dim;
    out->file_bytes = gguf_file_size(m->file);
    uint64_t params = 0;
    for (size_t i = 0; i < gguf_n_tensors(m->file); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->file, i);
        params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    out->n_params = params;
    out->bos_id = m->tok ? kiln_tokenizer_bos(m->tok) : -1;
    out->eos_id = m->tok ? kiln_tokenizer_eos(m->tok) : -1;
    out->add_bos = m->tok ? kiln_tokenizer_add_bos(m->tok) : false;
}
