/* cpu_moe.c — the mixture-of-experts feed-forward on the CPU, rows grouped by expert (see cpu_moe.h). */
#include "backend/cpu/cpu_moe.h"

#include <string.h>

#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_ops.h"
#include "base/error.h"

/* ggml clamps the sum of the chosen weights to the smallest normal F16 before dividing by it */
#define MOE_MIN_WEIGHT_SUM 6.103515625e-5f

static void *carve(uint8_t *base, size_t *off, size_t n) {
    size_t o = (*off + 63) & ~(size_t)63;
    *off = o + n;
    return base ? base + o : NULL;
}

size_t cpu_moe_layout(cpu_moe_buf *b, uint8_t *base, const kiln_blocks *d, int max_batch) {
    memset(b, 0, sizeof *b);
    for (int il = 0; il < d->n_block; il++) {
        const kiln_block_ffn *f = &d->blocks[il].ffn;
        if (f->kind != KILN_FFN_MOE) continue;
        b->max_expert = f->n_expert > b->max_expert ? f->n_expert : b->max_expert;
        b->max_used = f->n_expert_used > b->max_used ? f->n_expert_used : b->max_used;
        b->max_ff = f->n_ff > b->max_ff ? f->n_ff : b->max_ff;
    }
    if (!b->max_expert) return 0;
    b->max_batch = max_batch;
    b->n_embd = d->n_embd;
    const size_t B = (size_t)max_batch, E = (size_t)d->n_embd, X = (size_t)b->max_expert, K = (size_t)b->max_used,
                 F = (size_t)b->max_ff;
    size_t off = 0;
    b->probs = carve(base, &off, B * X * 4);
    b->ids = carve(base, &off, B * K * 4);
    b->wts = carve(base, &off, B * K * 4);
    b->first = carve(base, &off, (X + 1) * 4);
    b->entries = carve(base, &off, B * K * 4);
    b->xg = carve(base, &off, B * E * 4);
    b->hg = carve(base, &off, B * F * 4);
    b->hu = carve(base, &off, B * F * 4);
    b->yd = carve(base, &off, B * E * 4);
    b->yk = carve(base, &off, B * K * E * 4);
    return off;
}

void cpu_moe_route(float *probs, int n_expert, int k, bool norm, int32_t *ids, float *w) {
    cpu_softmax(probs, n_expert);
    /* k passes of argmax over the experts not yet taken: the largest first, the lower id on ties */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++) taken = ids[i] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        ids[j] = best;
        w[j] = probs[best];
    }
    if (!norm) return;
    double acc = 0.0; /* ggml's sum_rows accumulates in double */
    for (int j = 0; j < k; j++) acc += w[j];
    float sum = (float)acc;
    if (sum < MOE_MIN_WEIGHT_SUM) sum = MOE_MIN_WEIGHT_SUM;
    for (int j = 0; j < k; j++) w[j] /= sum;
}

/* Groups the (row, slot) entries by expert: first[e] .. first[e+1] are expert e's, rows ascending. */
static void group_by_expert(cpu_moe_buf *b, int n_expert, int k, int B) {
    int32_t *first = b->first;
    memset(first, 0, sizeof(int32_t) * (size_t)(n_expert + 1));
    for (int i = 0; i < B * k; i++) first[b->ids[i] + 1]++;
    for (int e = 0; e < n_expert; e++) first[e + 1] += first[e];
    /* fill with a moving cursor per expert (first[e] is advanced, then restored by shifting) */
    for (int i = 0; i < B * k; i++) b->entries[first[b->ids[i]]++] = i;
    for (int e = n_expert; e > 0; e--) first[e] = first[e - 1];
    first[0] = 0;
}

/* The rows routed to expert e through its three matrices; their weighted outputs go to yk. */
static void run_expert(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int e, cpu_moe_buf *b,
                       void *mm_scratch) {
    const int E = b->n_embd, F = f->n_ff, k = f->n_expert_used;
    const int32_t *ent = b->entries + b->first[e];
    const int n = b->first[e + 1] - b->first[e];
    for (int i = 0; i < n; i++) memcpy(b->xg + (size_t)i * E, x + (size_t)(ent[i] / k) * E, sizeof(float) * (size_t)E);
    const kiln_weight gate = kiln_weight_matrix(f->gate, (uint64_t)e), up = kiln_weight_matrix(f->up, (uint64_t)e),
                      down = kiln_weight_matrix(f->down, (uint64_t)e);
    cpu_matmul(pool, &gate, b->xg, n, b->hg, mm_scratch);
    cpu_matmul(pool, &up, b->xg, n, b->hu, mm_scratch);
    cpu_swiglu(b->hg, b->hu, n * F);
    cpu_matmul(pool, &down, b->hg, n, b->yd, mm_scratch);
    for (int i = 0; i < n; i++) {
        const float w = b->wts[ent[i]];
        float *dst = b->yk + (size_t)ent[i] * E;
        const float *src = b->yd + (size_t)i * E;
        for (int c = 0; c < E; c++) dst[c] = src[c] * w;
    }
    b->expert_bytes_read += gate.nbytes + up.nbytes + down.nbytes;
}

void cpu_moe_ffn(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int B, float *out, cpu_moe_buf *b,
                 void *mm_scratch) {
    const int E = b->n_embd, X = f->n_expert, k = f->n_expert_used;
    KILN_ASSERT(f->kind == KILN_FFN_MOE && B >= 1 && B <= b->max_batch && X <= b->max_expert && k <= b->max_used &&
                f->n_ff <= b->max_ff);
    cpu_matmul(pool, f->router, x, B, b->probs, mm_scratch);
    for (int t = 0; t < B; t++)
        cpu_moe_route(b->probs + (size_t)t * X, X, k, f->norm_topk, b->ids + (size_t)t * k, b->wts + (size_t)t * k);
    group_by_expert(b, X, k, B);
    for (int e = 0; e < X; e++)
        if (b->first[e + 1] > b->first[e]) run_expert(pool, f, x, e, b, mm_scratch);
    /* the k outputs of each row summed in the order of its choice, as llama.cpp adds them */
    for (int t = 0; t < B; t++) {
        float *o = out + (size_t)t * E;
        memcpy(o, b->yk + (size_t)t * k * E, sizeof(float) * (size_t)E);
        for (int j = 1; j < k; j++) cpu_add(o, b->yk + ((size_t)t * k + (size_t)j) * E, E);
    }
}
