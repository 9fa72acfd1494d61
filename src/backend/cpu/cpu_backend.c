/*
 * cpu_backend.c — the llama forward pass on the CPU (the first implementation of backend.h).
 * Open allocates one arena for every activation, the KV cache (F32, whole context) and the scratch,
 * touches it, prefaults the mapped weights and starts the thread pool; forward then allocates nothing.
 *
 * Shapes (B = tokens in this call, E = n_embd, Q = n_head*hd, KV = n_head_kv*hd, F = n_ff):
 *   x (B,E) residual stream     xb (B,E) normed     q (B,Q) k,v (B,KV)     att (B,Q)
 *   hb, hb2 (B,F)               k_cache, v_cache (n_layer, n_ctx, KV) F16   logits (n_vocab,)
 * The KV cache is F16 like llama.cpp's default, and attention rounds q and the softmax weights to F16
 * before their products with K and V (as ggml's F16 matrix products do), which keeps greedy runs on the
 * reference engine's tokens.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_ops.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "formats/formats.h"
#include "session/backend.h"

typedef struct cpu_state {
    const kiln_model *m;
    kiln_backend_config cfg;
    kiln_pool *pool;
    uint8_t *arena;
    size_t arena_bytes;
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *logits, *scores;
    float *rope_cos, *rope_sin;   /* (n_ctx, n_rot/2) */
    float *qh;                    /* per thread: one head of q rounded to F16 */
    uint16_t *k_cache, *v_cache;  /* (n_layer, n_ctx, KV) F16 */
    void *scratch;                /* converted activations for the matmuls */
    cpu_attn_kernels attn;        /* attention inner loops for this CPU */
} cpu_state;

/* Carves n bytes (64-aligned) from the arena; with base == NULL only sums the size. */
static void *carve(uint8_t *base, size_t *off, size_t n) {
    size_t o = (*off + 63) & ~(size_t)63;
    *off = o + n;
    return base ? base + o : NULL;
}

/* The largest converted-activation buffer any matmul of the model needs for B rows. */
static size_t max_scratch(const kiln_model *m, int B) {
    size_t best = cpu_matmul_scratch_bytes(m->output.type, (int)m->output.ne[0], B);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const kiln_layer *L = &m->layers[il];
        const kiln_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++) {
            size_t s = cpu_matmul_scratch_bytes(lw[i]->type, (int)lw[i]->ne[0], B);
            best = s > best ? s : best;
        }
    }
    return best;
}

/* Lays out every buffer; with base == NULL it only computes the total. */
static size_t layout(cpu_state *s, uint8_t *base) {
    const kiln_hparams *hp = &s->m->hp;
    const size_t B = (size_t)s->cfg.max_batch, E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
                 KV = (size_t)hp->n_head_kv * hp->head_dim, F = (size_t)hp->n_ff, C = (size_t)s->cfg.n_ctx;
    size_t off = 0;
    s->x = carve(base, &off, B * E * 4);
    s->xb = carve(base, &off, B * E * 4);
    s->xb2 = carve(base, &off, B * E * 4);
    s->q = carve(base, &off, B * Q * 4);
    s->k = carve(base, &off, B * KV * 4);
    s->v = carve(base, &off, B * KV * 4);
    s->att = carve(base, &off, B * Q * 4);
    s->hb = carve(base, &off, B * F * 4);
    s->hb2 = carve(base, &off, B * F * 4);
    s->logits = carve(base, &off, (size_t)hp->n_vocab * 4);
    s->scores = carve(base, &off, (size_t)s->cfg.n_threads * C * 4);
    s->rope_cos = carve(base, &off, C * (size_t)(hp->n_rot / 2) * 4);
    s->rope_sin = carve(base, &off, C * (size_t)(hp->n_rot / 2) * 4);
    s->k_cache = carve(base, &off, (size_t)hp->n_layer * C * KV * 2);
    s->v_cache = carve(base, &off, (size_t)hp->n_layer * C * KV * 2);
    s->qh = carve(base, &off, (size_t)s->cfg.n_threads * (size_t)hp->head_dim * 4);
    s->scratch = carve(base, &off, max_scratch(s->m, (int)B));
    return off;
}

/* Locks the tensor data in memory (best effort: a memory limit or a missing privilege only costs the
 * guarantee that the kernel will not reclaim cold weight pages between requests), then reads one byte of
 * every page of every tensor so that no page fault is left for the first token. */
static void prefault_weights(const kiln_model *m) {
    const gguf_file *f = m->file;
    const uint64_t off = gguf_data_offset(f), size = gguf_file_size(f);
    if (off < size && mlock(gguf_base(f) + off, (size_t)(size - off)) != 0)
        KILN_INFO("cpu backend: weights not locked in memory (mlock: %s); cold pages may be reclaimed", strerror(errno));
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        for (uint64_t o = 0; o < t->nbytes; o += 4096) sink ^= p[o];
        if (t->nbytes) sink ^= p[t->nbytes - 1];
    }
    (void)sink;
}

static void cpu_close(void *state) {
    cpu_state *s = state;
    if (!s) return;
    kiln_pool_close(s->pool);
    kiln_free(s->arena);
    kiln_free(s);
}

static kiln_status cpu_open(const kiln_model *m, const kiln_backend_config *cfg, kiln_phases *ph, void **out) {
    *out = NULL;
    cpu_state *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "cpu backend: out of memory");
    s->m = m;
    s->cfg = *cfg;

    uint64_t t0 = kiln_now_ns();
    s->arena_bytes = layout(s, NULL);
    s->arena = kiln_aligned_alloc(64, s->arena_bytes);
    if (!s->arena) {
        cpu_close(s);
        return kiln_fail(KILN_ERR_NOMEM, "cpu backend: cannot allocate the %.1f MiB arena for n_ctx %d",
                         s->arena_bytes / 1048576.0, cfg->n_ctx);
    }
    memset(s->arena, 0, s->arena_bytes); /* touch every page now, not at the first token */
    layout(s, s->arena);
    cpu_rope_tables(s->rope_cos, s->rope_sin, cfg->n_ctx, m->hp.n_rot, m->hp.rope_base, m->hp.rope_freq_scale,
                    m->rope_freqs.data);
    kiln_phases_add(ph, "open.arena", kiln_now_ns() - t0);

    t0 = kiln_now_ns();
    prefault_weights(m);
    kiln_phases_add(ph, "open.weights", kiln_now_ns() - t0);

    t0 = kiln_now_ns();
    kiln_formats_init();
    s->attn = cpu_attn_select();
    kiln_status st = kiln_pool_open(cfg->n_threads, &s->pool);
    if (st != KILN_OK) { cpu_close(s); return st; }
    kiln_phases_add(ph, "open.kernels", kiln_now_ns() - t0);
    *out = s;
    return KILN_OK;
}

static void embed(const kiln_model *m, int32_t id, float *dst) {
    const kiln_weight *w = &m->tok_embd;
    const size_t row = kiln_row_bytes(w->type, w->ne[0]);
    kiln_type_get(w->type)->to_float((const uint8_t *)w->data + (size_t)id * row, dst, (int64_t)w->ne[0]);
}

typedef struct attn_job {
    cpu_state *s;
    int layer, B, pos;
} attn_job;

/* Causal grouped-query attention for every (token, head) pair of the batch. */
static void attention(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    cpu_state *s = j->s;
    const kiln_hparams *hp = &s->m->hp;
    const int hd = hp->head_dim, nh = hp->n_head, KV = hp->n_head_kv * hd, group = hp->n_head / hp->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    const uint16_t *kc = s->k_cache + (size_t)j->layer * s->cfg.n_ctx * KV;
    const uint16_t *vc = s->v_cache + (size_t)j->layer * s->cfg.n_ctx * KV;
    float *sc = s->scores + (size_t)ith * s->cfg.n_ctx;
    float *qf = s->qh + (size_t)ith * hd;
    int lo, hi;
    kiln_split(j->B * nh, ith, nth, &lo, &hi);
    for (int p = lo; p < hi; p++) {
        const int t = p / nh, h = p % nh, kvh = h / group, n_keys = j->pos + t + 1;
        const float *q = s->q + (size_t)t * nh * hd + (size_t)h * hd;
        for (int c = 0; c < hd; c++) qf[c] = kiln_f16_to_f32(kiln_f32_to_f16(q[c]));
        for (int i = 0; i < n_keys; i++) sc[i] = s->attn.dot(qf, kc + (size_t)i * KV + (size_t)kvh * hd, hd) * scale;
        cpu_softmax(sc, n_keys);
        float *o = s->att + (size_t)t * nh * hd + (size_t)h * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int i = 0; i < n_keys; i++)
            s->attn.axpy(o, kiln_f16_to_f32(kiln_f32_to_f16(sc[i])), vc + (size_t)i * KV + (size_t)kvh * hd, hd);
    }
}

static void add_bias(float *y, const kiln_weight *b, int B, int n) {
    if (!b->data) return;
    for (int t = 0; t < B; t++) cpu_add(y + (size_t)t * n, b->data, n);
}

static kiln_status cpu_forward(void *state, const int32_t *ids, int B, int pos, float *logits, int32_t *argmax) {
    cpu_state *s = state;
    const kiln_model *m = s->m;
    const kiln_hparams *hp = &m->hp;
    KILN_ASSERT(B >= 1 && B <= s->cfg.max_batch && pos >= 0 && pos + B <= s->cfg.n_ctx);
    const int E = hp->n_embd, hd = hp->head_dim, Q = hp->n_head * hd, KV = hp->n_head_kv * hd, F = hp->n_ff;
    const int half = hp->n_rot / 2;

    for (int t = 0; t < B; t++) embed(m, ids[t], s->x + (size_t)t * E);

    for (int il = 0; il < hp->n_layer; il++) {
        const kiln_layer *L = &m->layers[il];
        for (int t = 0; t < B; t++) cpu_rmsnorm(s->xb + (size_t)t * E, s->x + (size_t)t * E, L->attn_norm.data, E, hp->rms_eps);
        cpu_matmul(s->pool, &L->wq, s->xb, B, s->q, s->scratch);
        cpu_matmul(s->pool, &L->wk, s->xb, B, s->k, s->scratch);
        cpu_matmul(s->pool, &L->wv, s->xb, B, s->v, s->scratch);
        add_bias(s->q, &L->bq, B, Q);
        add_bias(s->k, &L->bk, B, KV);
        add_bias(s->v, &L->bv, B, KV);
        for (int t = 0; t < B; t++) {
            const int p = pos + t;
            const float *c = s->rope_cos + (size_t)p * half, *sn = s->rope_sin + (size_t)p * half;
            for (int h = 0; h < hp->n_head; h++) {
                float *qh = s->q + (size_t)t * Q + (size_t)h * hd;
                if (L->q_norm.data) cpu_rmsnorm(qh, qh, L->q_norm.data, hd, hp->rms_eps);
                cpu_rope_head(qh, c, sn, hp->n_rot, hp->rope_neox);
            }
            for (int h = 0; h < hp->n_head_kv; h++) {
                float *kh = s->k + (size_t)t * KV + (size_t)h * hd;
                if (L->k_norm.data) cpu_rmsnorm(kh, kh, L->k_norm.data, hd, hp->rms_eps);
                cpu_rope_head(kh, c, sn, hp->n_rot, hp->rope_neox);
            }
            const size_t at = ((size_t)il * s->cfg.n_ctx + (size_t)p) * KV;
            for (int e = 0; e < KV; e++) {
                s->k_cache[at + e] = kiln_f32_to_f16(s->k[(size_t)t * KV + e]);
                s->v_cache[at + e] = kiln_f32_to_f16(s->v[(size_t)t * KV + e]);
            }
        }
        attn_job aj = {.s = s, .layer = il, .B = B, .pos = pos};
        if ((int64_t)B * hp->n_head * (pos + B) * hd < (1 << 15)) attention(&aj, 0, 1);
        else kiln_pool_run(s->pool, attention, &aj);
        cpu_matmul(s->pool, &L->wo, s->att, B, s->xb2, s->scratch);
        cpu_add(s->x, s->xb2, B * E);

        for (int t = 0; t < B; t++) cpu_rmsnorm(s->xb + (size_t)t * E, s->x + (size_t)t * E, L->ffn_norm.data, E, hp->rms_eps);
        cpu_matmul(s->pool, &L->w_gate, s->xb, B, s->hb, s->scratch);
        cpu_matmul(s->pool, &L->w_up, s->xb, B, s->hb2, s->scratch);
        cpu_swiglu(s->hb, s->hb2, B * F);
        cpu_matmul(s->pool, &L->w_down, s->hb, B, s->xb2, s->scratch);
        cpu_add(s->x, s->xb2, B * E);
    }

    if (!logits && !argmax) return KILN_OK;
    cpu_rmsnorm(s->xb, s->x + (size_t)(B - 1) * E, m->output_norm.data, E, hp->rms_eps);
    float *out = logits ? logits : s->logits;
    cpu_matmul(s->pool, &m->output, s->xb, 1, out, s->scratch);
    if (argmax) *argmax = cpu_argmax(out, hp->n_vocab);
    return KILN_OK;
}

static void cpu_reset(void *state) { (void)state; /* positions restart; stale cache rows are overwritten */ }

const kiln_backend_ops kiln_backend_cpu = {
    .name = "cpu",
    .open = cpu_open,
    .forward = cpu_forward,
    .reset = cpu_reset,
    .close = cpu_close,
};
