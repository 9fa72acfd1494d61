/*
 * cpu_backend.c — the forward pass on the CPU over a batch of rows of any mix of sequences, written once
 * over the block description (model/block.h). Open allocates one arena for every activation, one KV
 * region per sequence and the scratch, touches it, prefaults the mapped weights and starts the thread
 * pool; forward then allocates nothing.
 *
 * Shapes (B = rows in this call, E = n_embd, Q = n_head*hd, KV = n_head_kv*hd, F = n_ff, O = output rows):
 *   x (B,E) residual stream     xb (B,E) normed     q (B,Q) k,v (B,KV)     att (B,Q)     hb, hb2 (B,F)
 *   moe: the buffers of the mixture-of-experts blocks (cpu_moe.h), when the model has any
 *   xo (O,E) the output rows, normed              k_cache, v_cache (n_seq, n_layer, n_head_kv, n_ctx, hd) F16
 * Every matrix product covers all B rows at once (each weight row is read once per call for every
 * sequence); attention runs per row over its own sequence's cache. Each row's arithmetic is the same
 * whatever else is in the batch, so a sequence's logits in a batch equal its logits alone, bit for bit.
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
#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_repack.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "formats/formats.h"
#include "model/block.h"
#include "session/backend.h"

typedef struct cpu_state {
    const kiln_model *m;
    kiln_blocks desc;
    kiln_backend_config cfg;
    kiln_pool *pool;
    uint8_t *arena;
    size_t arena_bytes;
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *xo, *scores;
    float *rope_cos, *rope_sin;   /* (n_ctx, n_rot/2) */
    float *qh;                    /* per thread: one head of q rounded to F16 */
    uint16_t *k_cache, *v_cache;  /* (n_seq, n_layer, n_head_kv, n_ctx, hd) F16: a head's keys contiguous */
    size_t kv_per_seq, kv_per_layer; /* elements of one sequence's K (or V) region, of one layer's part of it */
    void *scratch;                /* converted activations for the matmuls */
    cpu_moe_buf moe;              /* the MoE blocks' routing and expert buffers */
    cpu_repacked repacked;        /* the interleaved copies of the Q8_0 / Q4_K matrices desc points at (cpu_repack.h) */
    cpu_attn_kernels attn;        /* attention inner loops for this CPU */
    cpu_argmax_fn argmax;         /* the logits rows' argmax for this CPU */
    kiln_from_float_fn to_f16;    /* F32 -> F16 for the KV store, exactly kiln_f32_to_f16 (the fastest such) */
} cpu_state;

/* Carves n bytes (64-aligned) from the arena; with base == NULL only sums the size. */
static void *carve(uint8_t *base, size_t *off, size_t n) {
    size_t o = (*off + 63) & ~(size_t)63;
    *off = o + n;
    return base ? base + o : NULL;
}

static size_t scratch_for(const kiln_weight *w, int B) { return cpu_matmul_scratch_bytes(w->type, (int)w->ne[0], B); }

/* The largest converted-activation buffer any matmul of the model needs for B rows. */
static size_t max_scratch(const kiln_blocks *d, int B) {
    size_t best = scratch_for(d->output, B);
    for (int il = 0; il < d->n_block; il++) {
        const kiln_block *b = &d->blocks[il];
        const kiln_weight *lw[] = {b->attn.wq, b->attn.wk, b->attn.wv, b->attn.wo, b->ffn.gate, b->ffn.up, b->ffn.down,
                                   b->ffn.router};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++) {
            if (!lw[i]) continue;
            size_t s = scratch_for(lw[i], B);
            best = s > best ? s : best;
        }
    }
    return best;
}

/* Lays out every buffer; with base == NULL it only computes the total. */
static size_t layout(cpu_state *s, uint8_t *base) {
    const kiln_hparams *hp = &s->m->hp;
    const size_t B = (size_t)s->cfg.max_batch, E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
                 KV = (size_t)hp->n_head_kv * hp->head_dim, F = (size_t)hp->n_ff, C = (size_t)s->cfg.n_ctx,
                 O = (size_t)s->cfg.max_out;
    s->kv_per_layer = C * KV;
    s->kv_per_seq = (size_t)hp->n_layer * s->kv_per_layer;
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
    s->xo = carve(base, &off, O * E * 4);
    s->scores = carve(base, &off, (size_t)s->cfg.n_threads * C * 4);
    s->rope_cos = carve(base, &off, C * (size_t)(hp->n_rot / 2) * 4);
    s->rope_sin = carve(base, &off, C * (size_t)(hp->n_rot / 2) * 4);
    s->k_cache = carve(base, &off, (size_t)s->cfg.n_seq * s->kv_per_seq * 2);
    s->v_cache = carve(base, &off, (size_t)s->cfg.n_seq * s->kv_per_seq * 2);
    s->qh = carve(base, &off, (size_t)s->cfg.n_threads * (size_t)hp->head_dim * 4);
    s->scratch = carve(base, &off, max_scratch(&s->desc, (int)B));
    uint8_t *moe = carve(base, &off, cpu_moe_layout(&s->moe, NULL, &s->desc, (int)B));
    cpu_moe_layout(&s->moe, moe, &s->desc, (int)B);
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
    cpu_repack_close(&s->repacked);
    kiln_blocks_free(&s->desc);
    kiln_free(s->arena);
    kiln_free(s);
}

static kiln_status cpu_open(const kiln_model *m, const kiln_backend_config *cfg, kiln_phases *ph, void **out) {
    *out = NULL;
    cpu_state *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "cpu backend: out of memory");
    s->m = m;
    s->cfg = *cfg;
    kiln_status st = kiln_blocks_build(m, &s->desc);
    if (st != KILN_OK) { cpu_close(s); return st; }

    uint64_t t0 = kiln_now_ns();
    s->arena_bytes = layout(s, NULL);
    s->arena = kiln_aligned_alloc(64, s->arena_bytes);
    if (!s->arena) {
        cpu_close(s);
        return kiln_fail(KILN_ERR_NOMEM, "cpu backend: cannot allocate the %.1f MiB arena for %d sequences of n_ctx %d",
                         s->arena_bytes / 1048576.0, cfg->n_seq, cfg->n_ctx);
    }
    memset(s->arena, 0, s->arena_bytes); /* touch every page now, not at the first token */
    layout(s, s->arena);
    cpu_rope_tables(s->rope_cos, s->rope_sin, cfg->n_ctx, m->hp.n_rot, m->hp.rope_base, m->hp.rope_freq_scale,
                    m->rope_freqs.data);
    KILN_INFO("cpu backend: KV cache %.2f MiB per sequence x %d sequences (n_ctx %d); arena %.1f MiB",
              s->kv_per_seq * 4 / 1048576.0, cfg->n_seq, cfg->n_ctx, s->arena_bytes / 1048576.0);
    kiln_phases_add(ph, "open.arena", kiln_now_ns() - t0);

    t0 = kiln_now_ns();
    prefault_weights(m);
    kiln_phases_add(ph, "open.weights", kiln_now_ns() - t0);

    t0 = kiln_now_ns();
    kiln_formats_init();
    s->attn = cpu_attn_select();
    s->argmax = cpu_argmax_select();
    s->to_f16 = kiln_from_float_fast(KILN_TYPE_F16);
    st = kiln_pool_open(cfg->n_threads, &s->pool);
    if (st != KILN_OK) { cpu_close(s); return st; }
    kiln_phases_add(ph, "open.kernels", kiln_now_ns() - t0);

    t0 = kiln_now_ns();
    st = cpu_repack_open(s->pool, &s->desc, &s->repacked);
    if (st != KILN_OK) { cpu_close(s); return st; }
    if (s->repacked.n) KILN_INFO("cpu backend: %d Q8_0 / Q4_K matrices interleaved by %d rows", s->repacked.n, CPU_R16);
    kiln_phases_add(ph, "open.repack", kiln_now_ns() - t0);
    *out = s;
    return KILN_OK;
}

static void embed(const kiln_weight *w, int32_t id, float *dst) {
    const size_t row = kiln_row_bytes(w->type, w->ne[0]);
    kiln_type_get(w->type)->to_float((const uint8_t *)w->data + (size_t)id * row, dst, (int64_t)w->ne[0]);
}

typedef struct attn_job {
    cpu_state *s;
    const kiln_block_attn *a;
    const kiln_backend_row *rows;
    int layer, B;
} attn_job;

/* The K (or V) cache row of (sequence, layer, KV head, position): head-major within a layer, so attention over
 * one head reads its keys as one linear stream of hd halves each (position-major, the head's 2 * hd bytes in
 * every n_head_kv * 2 * hd, read 40-50% slower at 1,000 keys: bench/RESULTS.md). */
static size_t kv_at(const cpu_state *s, int seq, int layer, int head, int pos, int hd) {
    return (size_t)seq * s->kv_per_seq + (size_t)layer * s->kv_per_layer + ((size_t)head * s->cfg.n_ctx + (size_t)pos) * (size_t)hd;
}

/* Causal grouped-query attention for every (row, head) pair of the batch, each row over the positions
 * 0..pos of its own sequence. */
static void attention(void *ctx, int lo, int hi, int ith) {
    attn_job *j = ctx;
    cpu_state *s = j->s;
    const int hd = j->a->head_dim, nh = j->a->n_head, group = nh / j->a->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    float *sc = s->scores + (size_t)ith * s->cfg.n_ctx;
    float *qf = s->qh + (size_t)ith * hd;
    for (int p = lo; p < hi; p++) {
        const int t = p / nh, hh = p % nh, kvh = hh / group, n_keys = j->rows[t].pos + 1;
        const uint16_t *kc = s->k_cache + kv_at(s, j->rows[t].seq, j->layer, kvh, 0, hd);
        const uint16_t *vc = s->v_cache + kv_at(s, j->rows[t].seq, j->layer, kvh, 0, hd);
        memcpy(qf, s->q + (size_t)t * nh * hd + (size_t)hh * hd, (size_t)hd * sizeof *qf);
        s->attn.round_f16(qf, hd);
        s->attn.scores(sc, qf, kc, (size_t)hd, n_keys, hd, scale);
        cpu_softmax(sc, n_keys);
        s->attn.round_f16(sc, n_keys);
        s->attn.mix(s->att + (size_t)t * nh * hd + (size_t)hh * hd, sc, vc, (size_t)hd, n_keys, hd);
    }
}

static void add_bias(float *y, const kiln_weight *b, int B, int n) {
    if (!b) return;
    for (int t = 0; t < B; t++) cpu_add(y + (size_t)t * n, b->data, n);
}

static void rmsnorm_rows(float *y, const float *x, const kiln_weight *w, int B, int n, float eps) {
    for (int t = 0; t < B; t++) cpu_rmsnorm(y + (size_t)t * n, x + (size_t)t * n, w->data, n, eps);
}

/* Per-head Q/K norm and RoPE of every row at its own position, then its K/V into its sequence's cache. */
static void rope_and_store(cpu_state *s, const kiln_block_attn *a, int il, const kiln_backend_row *rows, int B) {
    const int hd = a->head_dim, Q = a->n_head * hd, KV = a->n_head_kv * hd, half = a->n_rot / 2;
    const bool neox = a->rope == KILN_ROPE_NEOX;
    const float eps = s->desc.rms_eps;
    for (int t = 0; t < B; t++) {
        const int p = rows[t].pos;
        const float *c = s->rope_cos + (size_t)p * half, *sn = s->rope_sin + (size_t)p * half;
        for (int h = 0; h < a->n_head; h++) {
            float *qh = s->q + (size_t)t * Q + (size_t)h * hd;
            if (a->q_norm) cpu_rmsnorm(qh, qh, a->q_norm->data, hd, eps);
            cpu_rope_head(qh, c, sn, a->n_rot, neox);
        }
        for (int h = 0; h < a->n_head_kv; h++) {
            float *kh = s->k + (size_t)t * KV + (size_t)h * hd;
            if (a->k_norm) cpu_rmsnorm(kh, kh, a->k_norm->data, hd, eps);
            cpu_rope_head(kh, c, sn, a->n_rot, neox);
        }
        for (int h = 0; h < a->n_head_kv; h++) {
            const size_t at = kv_at(s, rows[t].seq, il, h, p, hd);
            s->to_f16(s->k + (size_t)t * KV + (size_t)h * hd, s->k_cache + at, hd);
            s->to_f16(s->v + (size_t)t * KV + (size_t)h * hd, s->v_cache + at, hd);
        }
    }
}

/* x += Wo · attention(norm(x)) for every row. */
static void attn_block(cpu_state *s, const kiln_block_attn *a, int il, const kiln_backend_row *rows, int B) {
    const int E = s->desc.n_embd, hd = a->head_dim, Q = a->n_head * hd, KV = a->n_head_kv * hd;
    rmsnorm_rows(s->xb, s->x, a->norm, B, E, s->desc.rms_eps);
    const kiln_weight *qkv[3] = {a->wq, a->wk, a->wv};
    float *qkv_out[3] = {s->q, s->k, s->v};
    cpu_matmul_n(s->pool, 3, qkv, s->xb, B, qkv_out, s->scratch);
    add_bias(s->q, a->bq, B, Q);
    add_bias(s->k, a->bk, B, KV);
    add_bias(s->v, a->bv, B, KV);
    rope_and_store(s, a, il, rows, B);
    attn_job aj = {.s = s, .a = a, .rows = rows, .layer = il, .B = B};
    int64_t work = 0; /* multiply-adds of the scores: small ones run on the calling thread */
    for (int t = 0; t < B; t++) work += (int64_t)(rows[t].pos + 1) * a->n_head * hd;
    if (work < (1 << 15)) attention(&aj, 0, B * a->n_head, 0);
    else kiln_pool_for(s->pool, B * a->n_head, 1, attention, &aj);
    cpu_matmul(s->pool, a->wo, s->att, B, s->xb2, s->scratch);
    cpu_add(s->x, s->xb2, B * E);
}

typedef struct swiglu_job {
    float *g;
    const float *u;
    int n;
} swiglu_job;

static void swiglu_rows(void *ctx, int lo, int hi, int ith) {
    const swiglu_job *j = ctx;
    cpu_swiglu(j->g + (size_t)lo * j->n, j->u + (size_t)lo * j->n, (hi - lo) * j->n);
}

/* x += down(silu(gate · norm(x)) * up · norm(x)) for every row (a MoE block: the mix of each row's experts). */
static void ffn_block(cpu_state *s, const kiln_block_ffn *f, int B) {
    const int E = s->desc.n_embd;
    rmsnorm_rows(s->xb, s->x, f->norm, B, E, s->desc.rms_eps);
    if (f->kind == KILN_FFN_MOE) {
        cpu_moe_ffn(s->pool, f, s->xb, B, s->xb2, &s->moe, s->scratch);
        cpu_add(s->x, s->xb2, B * E);
        return;
    }
    KILN_ASSERT(f->kind == KILN_FFN_DENSE_SWIGLU);
    const kiln_weight *gate_up[2] = {f->gate, f->up};
    float *gate_up_out[2] = {s->hb, s->hb2};
    cpu_matmul_n(s->pool, 2, gate_up, s->xb, B, gate_up_out, s->scratch);
    swiglu_job sj = {.g = s->hb, .u = s->hb2, .n = f->n_ff};
    if (B > 1) kiln_pool_for(s->pool, B, 1, swiglu_rows, &sj); /* its exponentials: rows on all threads */
    else swiglu_rows(&sj, 0, 1, 0);
    cpu_matmul(s->pool, f->down, s->hb, B, s->xb2, s->scratch);
    cpu_add(s->x, s->xb2, B * E);
}

/* The output projection over just the rows that ask: logits (n_out, n_vocab) and their argmax. */
static void outputs(cpu_state *s, const kiln_backend_batch *b) {
    const kiln_blocks *d = &s->desc;
    const int E = d->n_embd;
    int k = 0;
    for (int t = 0; t < b->n; t++)
        if (b->rows[t].out != KILN_BK_OUT_NONE)
            cpu_rmsnorm(s->xo + (size_t)(k++) * E, s->x + (size_t)t * E, d->output_norm->data, E, d->rms_eps);
    cpu_matmul(s->pool, d->output, s->xo, b->n_out, b->logits, s->scratch);
    for (k = 0; k < b->n_out; k++) b->argmax[k] = s->argmax(b->logits + (size_t)k * d->n_vocab, d->n_vocab);
}

static kiln_status cpu_forward(void *state, const kiln_backend_batch *b) {
    cpu_state *s = state;
    const kiln_blocks *d = &s->desc;
    const int B = b->n;
    KILN_ASSERT(B >= 1 && B <= s->cfg.max_batch && b->n_out >= 0 && b->n_out <= s->cfg.max_out);
    for (int t = 0; t < B; t++) {
        const kiln_backend_row *r = &b->rows[t];
        KILN_ASSERT(r->seq >= 0 && r->seq < s->cfg.n_seq && r->pos >= 0 && r->pos < s->cfg.n_ctx);
        KILN_ASSERT(r->id >= 0 && r->id < d->n_vocab);
        embed(d->tok_embd, r->id, s->x + (size_t)t * d->n_embd);
    }
    for (int il = 0; il < d->n_block; il++) {
        attn_block(s, &d->blocks[il].attn, il, b->rows, B);
        ffn_block(s, &d->blocks[il].ffn, B);
    }
    if (b->n_out > 0) outputs(s, b);
    return KILN_OK;
}

static void cpu_reset(void *state, int seq) {
    (void)state, (void)seq; /* positions restart; stale cache rows are overwritten before they are read */
}

static uint64_t cpu_kv_bytes_per_seq(const void *state) {
    const cpu_state *s = state;
    return (uint64_t)s->kv_per_seq * 2 * sizeof(uint16_t);
}

static kiln_pool *cpu_pool(void *state) { return ((cpu_state *)state)->pool; }

const kiln_backend_ops kiln_backend_cpu = {
    .name = "cpu",
    .open = cpu_open,
    .forward = cpu_forward,
    .reset = cpu_reset,
    .kv_bytes_per_seq = cpu_kv_bytes_per_seq,
    .pool = cpu_pool,
    .close = cpu_close,
};
