/* cpu_moe.c — the mixture-of-experts feed-forward on the CPU: routing, grouping by expert, the fused
 * two-run product and its reference (see cpu_moe.h). */
#include "backend/cpu/cpu_moe.h"

#include <string.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_ops.h"
#include "base/error.h"
#include "formats/blocks.h"
#include "formats/formats.h"

/* ggml clamps the sum of the chosen weights to the smallest normal F16 before dividing by it */
#define MOE_MIN_WEIGHT_SUM 6.103515625e-5f
/* weight rows per work item of the gate/up run, output columns (of one expert) per work item of the down run */
#ifndef MOE_GATE_ROWS
#define MOE_GATE_ROWS 32
#endif
#ifndef MOE_DOWN_COLS
#define MOE_DOWN_COLS 256
#endif
/* below these, work runs on the calling thread: waking the pool costs more than it saves */
#define MOE_SMALL_CONVERT (1 << 16) /* values converted */
#define MOE_SMALL_WORK (1 << 16)    /* multiply-adds */

static void *carve(uint8_t *base, size_t *off, size_t n) {
    size_t o = (*off + 63) & ~(size_t)63;
    *off = o + n;
    return base ? base + o : NULL;
}

static kiln_type vdt(const kiln_weight *w) { return kiln_type_get(w->type)->vec_dot_type; }

/* The sizes over every MoE block of d; returns whether some block converts x differently for gate and up. */
static bool moe_dims(cpu_moe_buf *b, const kiln_blocks *d) {
    bool two = false;
    for (int il = 0; il < d->n_block; il++) {
        const kiln_block_ffn *f = &d->blocks[il].ffn;
        if (f->kind != KILN_FFN_MOE) continue;
        b->max_expert = f->n_expert > b->max_expert ? f->n_expert : b->max_expert;
        b->max_used = f->n_expert_used > b->max_used ? f->n_expert_used : b->max_used;
        b->max_ff = f->n_ff > b->max_ff ? f->n_ff : b->max_ff;
        const size_t qe = kiln_row_bytes(vdt(f->gate), (uint64_t)d->n_embd),
                     qu = kiln_row_bytes(vdt(f->up), (uint64_t)d->n_embd),
                     qf = kiln_row_bytes(vdt(f->down), (uint64_t)f->n_ff);
        b->qrow_e = qe > b->qrow_e ? qe : b->qrow_e;
        b->qrow_e = qu > b->qrow_e ? qu : b->qrow_e;
        b->qrow_f = qf > b->qrow_f ? qf : b->qrow_f;
        two |= vdt(f->gate) != vdt(f->up);
    }
    return two;
}

size_t cpu_moe_layout(cpu_moe_buf *b, uint8_t *base, const kiln_blocks *d, int max_batch) {
    memset(b, 0, sizeof *b);
    const bool two = moe_dims(b, d);
    if (!b->max_expert) return 0;
    b->max_batch = max_batch;
    b->n_embd = d->n_embd;
    const size_t B = (size_t)max_batch, E = (size_t)d->n_embd, X = (size_t)b->max_expert, K = (size_t)b->max_used,
                 F = (size_t)b->max_ff, BK = B * K;
    size_t off = 0;
    b->probs = carve(base, &off, B * X * 4);
    b->ids = carve(base, &off, BK * 4);
    b->wts = carve(base, &off, BK * 4);
    b->first = carve(base, &off, (X + 1) * 4);
    b->entries = carve(base, &off, BK * 4);
    b->pos = carve(base, &off, BK * 4);
    b->used = carve(base, &off, X * 4);
    b->qg = carve(base, &off, BK * b->qrow_e);
    b->qg_d = carve(base, &off, BK * (E / 32) * 4);
    b->qg_up = two ? carve(base, &off, BK * b->qrow_e) : b->qg;
    b->qg_up_d = two ? carve(base, &off, BK * (E / 32) * 4) : b->qg_d;
    b->qh = carve(base, &off, BK * b->qrow_f);
    b->qh_d = carve(base, &off, BK * (F / 32) * 4);
    b->yu_g = carve(base, &off, E);
    b->yu_u = two ? carve(base, &off, E) : b->yu_g;
    b->yu_h = carve(base, &off, K * F);
    b->xg = carve(base, &off, B * E * 4);
    b->hg = carve(base, &off, BK * F * 4);
    b->hu = carve(base, &off, BK * F * 4);
    b->yk = carve(base, &off, BK * E * 4);
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

/* Groups the (row, slot) entries by expert: first[e] .. first[e+1] are expert e's, rows ascending; pos is
 * the inverse and used lists the experts with entries. Returns their number. */
static int group_by_expert(cpu_moe_buf *b, int n_expert, int k, int B) {
    int32_t *first = b->first;
    memset(first, 0, sizeof(int32_t) * (size_t)(n_expert + 1));
    for (int i = 0; i < B * k; i++) first[b->ids[i] + 1]++;
    for (int e = 0; e < n_expert; e++) first[e + 1] += first[e];
    /* fill with a moving cursor per expert (first[e] is advanced, then restored by shifting) */
    for (int i = 0; i < B * k; i++) {
        b->pos[i] = first[b->ids[i]]++;
        b->entries[b->pos[i]] = i;
    }
    for (int e = n_expert; e > 0; e--) first[e] = first[e - 1];
    first[0] = 0;
    int n_used = 0;
    for (int e = 0; e < n_expert; e++)
        if (first[e + 1] > first[e]) b->used[n_used++] = e;
    return n_used;
}

/* The router, the routing of every row and the grouping (both paths); counts the expert bytes to be read. */
static int route_rows(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int B, cpu_moe_buf *b,
                      void *mm_scratch) {
    const int X = f->n_expert, k = f->n_expert_used;
    KILN_ASSERT(f->kind == KILN_FFN_MOE && B >= 1 && B <= b->max_batch && X <= b->max_expert && k <= b->max_used &&
                f->n_ff <= b->max_ff);
    cpu_matmul(pool, f->router, x, B, b->probs, mm_scratch);
    for (int t = 0; t < B; t++)
        cpu_moe_route(b->probs + (size_t)t * X, X, k, f->norm_topk, b->ids + (size_t)t * k, b->wts + (size_t)t * k);
    const int n_used = group_by_expert(b, X, k, B);
    b->expert_bytes_read += (uint64_t)n_used * (f->gate->nbytes + f->up->nbytes + f->down->nbytes) / (uint64_t)X;
    return n_used;
}

/* ---- the fused path ---- */

/* One weight type's dot: the fast single dot and the kernels that reproduce it, tiled and for one row. */
typedef struct moe_dot {
    kiln_vec_dot_fn dot;
    cpu_gemm_fn rows;
    cpu_gemm_fn row1; /* one activation row against many weight rows (decode, cpu_matmul's), or NULL */
    bool row1_yu;     /* row1 reads the activation row's values in k4 order too (cpu_gemm_row1_reads_yu) */
    size_t wrow;      /* bytes of one weight row */
    size_t wmat;      /* bytes of one expert's matrix */
    bool q8_0;        /* the activations are Q8_0 (the tiled kernel reads their scales as floats) */
} moe_dot;

static moe_dot moe_dot_of(const kiln_weight *w) {
    const kiln_type_info *ti = kiln_type_get(w->type);
    KILN_ASSERT(ti && ti->vec_dot);
    moe_dot d = {.dot = ti->vec_dot_fast ? ti->vec_dot_fast : ti->vec_dot, .wrow = kiln_row_bytes(w->type, w->ne[0]),
                 .wmat = (size_t)(w->nbytes / w->ne[2]), .q8_0 = ti->vec_dot_type == KILN_TYPE_Q8_0};
    d.rows = cpu_gemm_select(d.dot);
    d.row1 = cpu_gemm_row1_select(d.dot);
    d.row1_yu = cpu_gemm_row1_reads_yu(d.dot);
    return d;
}

/* Weight rows [r0, r1) of w against one converted row y (its Q8_0 scales yd; yu its k4 order, or NULL) into
 * s[r0..r1): the single-row kernel (two streams, prefetched as cpu_matmul's decode) where it has what it reads,
 * else the plain dot row by row, prefetched CPU_PREFETCH_ROWS ahead; either bit-identical to d->dot. */
static void dot_row1(const moe_dot *d, int n, const uint8_t *w, int r0, int r1, const uint8_t *y, const float *yd,
                     const uint8_t *yu, float *s) {
    if (d->row1 && (yu || !d->row1_yu)) {
        const cpu_gemm_args a = {.dot = d->dot, .n = n, .w = w, .w_stride = d->wrow, .y = y,
                                 .yd = d->q8_0 ? yd : NULL, .yu = yu, .out = s};
        d->row1(&a, r0, r1, 0, 1);
        return;
    }
    for (int r = r0; r < r1; r++) {
        if (r + CPU_PREFETCH_ROWS < r1) cpu_prefetch_row(w + (size_t)(r + CPU_PREFETCH_ROWS) * d->wrow, d->wrow);
        d->dot(n, s + r, w + (size_t)r * d->wrow, y);
    }
}

/* s[i * s_stride] = dot(weight row w, converted row y + i * y_stride) for i < ny: bit-identical to cpu_matmul's. */
static void dot_entries(const moe_dot *d, int n, const uint8_t *w, const uint8_t *y, size_t y_stride, const float *yd,
                        int ny, float *s, size_t s_stride) {
    if (ny == 1) {
        d->dot(n, s, w, y);
        return;
    }
    const cpu_gemm_args a = {.dot = d->dot, .n = n, .w = w, .w_stride = d->wrow, .y = y, .y_stride = y_stride,
                             .yd = d->q8_0 ? yd : NULL, .out = s, .out_stride = s_stride};
    d->rows(&a, 0, 1, 0, ny);
}

/* Converts one row for a weight type's dot into q, and its Q8_0 block scales into qd (when Q8_0). */
static void convert_row(uint32_t type, const float *x, int n, uint8_t *q, float *qd) {
    kiln_quantize_row_for_dot(type, x, q, n);
    if (kiln_type_get(type)->vec_dot_type != KILN_TYPE_Q8_0) return;
    const block_q8_0 *blk = (const block_q8_0 *)q;
    for (int ib = 0; ib < n / 32; ib++) qd[ib] = kiln_f16_to_f32(blk[ib].d);
}

typedef struct moe_job {
    const kiln_block_ffn *f;
    cpu_moe_buf *b;
    const float *x;
    float *out;
    moe_dot gate, up, down;
    int B, k, E, F, n_used, n_blk, blk; /* the run's work items per chosen expert, and rows (columns) per item */
    bool two; /* this block's up dots against other activations than its gate: x converted twice, the up's into
               * qg_up (a buffer of its own only where some block of the model needs it; else qg_up is qg) */
} moe_job;

/* Rows [lo, hi) of x, each converted once (into the grouped position of its first slot), then copied to its
 * other slots. */
static void convert_x(void *ctx, int lo, int hi, int ith) {
    moe_job *j = ctx;
    cpu_moe_buf *b = j->b;
    const int E = j->E, nd = E / 32;
    const bool two = j->two;
    const size_t sd = vdt(j->f->gate) == KILN_TYPE_Q8_0 ? sizeof(float) * (size_t)nd : 0,
                 sdu = vdt(j->f->up) == KILN_TYPE_Q8_0 ? sizeof(float) * (size_t)nd : 0; /* scale bytes copied */
    (void)ith;
    for (int t = lo; t < hi; t++) {
        const size_t p0 = (size_t)b->pos[t * j->k];
        convert_row(j->f->gate->type, j->x + (size_t)t * E, E, b->qg + p0 * b->qrow_e, b->qg_d + p0 * nd);
        if (two) convert_row(j->f->up->type, j->x + (size_t)t * E, E, b->qg_up + p0 * b->qrow_e, b->qg_up_d + p0 * nd);
        if (j->B == 1 && (j->gate.row1_yu || (!two && j->up.row1_yu))) /* the up reads yu_g too when !two */
            cpu_gemm_k4_order_row(b->qg + p0 * b->qrow_e, E, b->yu_g);
        if (j->B == 1 && two && j->up.row1_yu) cpu_gemm_k4_order_row(b->qg_up + p0 * b->qrow_e, E, b->yu_u);
        for (int s = 1; s < j->k; s++) {
            const size_t p = (size_t)b->pos[t * j->k + s];
            memcpy(b->qg + p * b->qrow_e, b->qg + p0 * b->qrow_e, b->qrow_e);
            memcpy(b->qg_d + p * nd, b->qg_d + p0 * nd, sd);
            if (!two) continue;
            memcpy(b->qg_up + p * b->qrow_e, b->qg_up + p0 * b->qrow_e, b->qrow_e);
            memcpy(b->qg_up_d + p * nd, b->qg_up_d + p0 * nd, sdu);
        }
    }
}

/* Entries [lo, hi)'s SwiGLU rows converted for the down's dot. */
static void convert_h(void *ctx, int lo, int hi, int ith) {
    moe_job *j = ctx;
    cpu_moe_buf *b = j->b;
    (void)ith;
    for (int p = lo; p < hi; p++) {
        convert_row(j->f->down->type, b->hg + (size_t)p * j->F, j->F, b->qh + (size_t)p * b->qrow_f,
                    b->qh_d + (size_t)p * (j->F / 32));
        if (j->B == 1 && j->down.row1_yu)
            cpu_gemm_k4_order_row(b->qh + (size_t)p * b->qrow_f, j->F, b->yu_h + (size_t)p * j->F);
    }
}

/* Work item (u, blk): rows blk of chosen expert u's gate and up against all its entries, then their SwiGLU. */
static void gate_up_item(moe_job *j, int u, int blk) {
    cpu_moe_buf *b = j->b;
    const int e = b->used[u], p0 = b->first[e], n = b->first[e + 1] - p0, E = j->E, F = j->F;
    const int r0 = blk * j->blk, r1 = r0 + j->blk < F ? r0 + j->blk : F;
    const uint8_t *G = (const uint8_t *)j->f->gate->data + (size_t)e * j->gate.wmat,
                  *U = (const uint8_t *)j->f->up->data + (size_t)e * j->up.wmat;
    const bool two = j->two; /* else the up reads the gate's conversion, not the other blocks' qg_up */
    const uint8_t *qg = b->qg + (size_t)p0 * b->qrow_e, *qu = (two ? b->qg_up : b->qg) + (size_t)p0 * b->qrow_e;
    const float *qgd = b->qg_d + (size_t)p0 * (E / 32), *qud = (two ? b->qg_up_d : b->qg_d) + (size_t)p0 * (E / 32);
    float *hg = b->hg + (size_t)p0 * F, *hu = b->hu + (size_t)p0 * F;
    if (n == 1) { /* one entry: its row against the block's weight rows, streamed as cpu_matmul's decode */
        const bool one = j->B == 1; /* the k4 order exists for a batch of one row */
        dot_row1(&j->gate, E, G, r0, r1, qg, qgd, one ? b->yu_g : NULL, hg);
        dot_row1(&j->up, E, U, r0, r1, qu, qud, one ? (two ? b->yu_u : b->yu_g) : NULL, hu);
    } else {
        for (int r = r0; r < r1; r++) {
            dot_entries(&j->gate, E, G + (size_t)r * j->gate.wrow, qg, b->qrow_e, qgd, n, hg + r, (size_t)F);
            dot_entries(&j->up, E, U + (size_t)r * j->up.wrow, qu, b->qrow_e, qud, n, hu + r, (size_t)F);
        }
    }
    for (int i = 0; i < n; i++) cpu_swiglu(hg + (size_t)i * F + r0, hu + (size_t)i * F + r0, r1 - r0);
}

/* Work items [lo, hi) of the gate/up run (item it = (it / n_blk, it % n_blk)). */
static void gate_up_run(void *ctx, int lo, int hi, int ith) {
    moe_job *j = ctx;
    (void)ith;
    for (int it = lo; it < hi; it++) gate_up_item(j, it / j->n_blk, it % j->n_blk);
}

/* Columns [c0, c1) of chosen experts [u0, u1)'s down against all their entries, into yk. */
static void down_cols(moe_job *j, int u0, int u1, int c0, int c1) {
    cpu_moe_buf *b = j->b;
    const int E = j->E, F = j->F;
    for (int u = u0; u < u1; u++) {
        const int e = b->used[u], p0 = b->first[e], n = b->first[e + 1] - p0;
        const uint8_t *D = (const uint8_t *)j->f->down->data + (size_t)e * j->down.wmat;
        const uint8_t *qh = b->qh + (size_t)p0 * b->qrow_f;
        const float *qhd = b->qh_d + (size_t)p0 * (F / 32);
        if (n == 1) {
            dot_row1(&j->down, F, D, c0, c1, qh, qhd, j->B == 1 ? b->yu_h + (size_t)p0 * F : NULL,
                     b->yk + (size_t)p0 * E);
            continue;
        }
        for (int c = c0; c < c1; c++) {
            dot_entries(&j->down, F, D + (size_t)c * j->down.wrow, qh, b->qrow_f, qhd, n, b->yk + (size_t)p0 * E + c,
                        (size_t)E);
        }
    }
}

/* Columns [c0, c1) of rows [t0, t1): their k expert outputs weighted and summed in the order of the
 * choice (as llama.cpp adds them). */
static void mix_cols(moe_job *j, int t0, int t1, int c0, int c1) {
    const cpu_moe_buf *b = j->b;
    const int E = j->E, k = j->k;
    for (int t = t0; t < t1; t++) {
        float *o = j->out + (size_t)t * E;
        const float *y0 = b->yk + (size_t)b->pos[t * k] * E, w0 = b->wts[t * k];
        for (int c = c0; c < c1; c++) o[c] = y0[c] * w0;
        for (int s = 1; s < k; s++) {
            const float *y = b->yk + (size_t)b->pos[t * k + s] * E, w = b->wts[t * k + s];
            for (int c = c0; c < c1; c++) {
                const float p = y[c] * w; /* rounded, then added: the reference's two steps */
                o[c] += p;
            }
        }
    }
}

/* Work items [lo, hi) of the down run: item (u, blk) = output columns blk of chosen expert u's down (each
 * expert's matrix read in long runs, also in decode: measured faster there than column blocks of every expert
 * with the mix in the same run); the mix follows in its own run. */
static void down_run(void *ctx, int lo, int hi, int ith) {
    moe_job *j = ctx;
    (void)ith;
    for (int it = lo; it < hi; it++) {
        const int u = it / j->n_blk, c0 = it % j->n_blk * j->blk;
        down_cols(j, u, u + 1, c0, c0 + j->blk < j->E ? c0 + j->blk : j->E);
    }
}

static void mix_run(void *ctx, int lo, int hi, int ith) {
    (void)ith;
    mix_cols(ctx, lo, hi, 0, ((moe_job *)ctx)->E);
}

/* fn over items [0, n) on the pool (in chunks that a late thread's share cannot hold up: kiln_pool_for), or on
 * the calling thread when the work is small. */
static void run_maybe(kiln_pool *pool, kiln_pool_range_fn fn, moe_job *j, int n, bool small) {
    if (small) fn(j, 0, n, 0);
    else kiln_pool_for(pool, n, 1, fn, j);
}

void cpu_moe_ffn(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int B, float *out, cpu_moe_buf *b,
                 void *mm_scratch) {
    const int n_used = route_rows(pool, f, x, B, b, mm_scratch);
    moe_job j = {.f = f, .b = b, .x = x, .out = out, .gate = moe_dot_of(f->gate), .up = moe_dot_of(f->up),
                 .down = moe_dot_of(f->down), .B = B, .k = f->n_expert_used, .E = b->n_embd, .F = f->n_ff,
                 .n_used = n_used, .two = vdt(f->gate) != vdt(f->up)};
    KILN_ASSERT(!j.two || b->qg_up != b->qg);
    const int64_t n_entries = (int64_t)B * j.k, work = n_entries * j.F * j.E;
    run_maybe(pool, convert_x, &j, B, (int64_t)B * j.E < MOE_SMALL_CONVERT);
    /* one row (decode): an item per expert, each matrix streamed whole by the single-row kernel (in 32-row items
     * each stream restarted its prefetch 24 times per matrix) */
    j.blk = B == 1 ? j.F : MOE_GATE_ROWS;
    j.n_blk = (j.F + j.blk - 1) / j.blk;
    run_maybe(pool, gate_up_run, &j, n_used * j.n_blk, 2 * work < MOE_SMALL_WORK);
    run_maybe(pool, convert_h, &j, (int)n_entries, n_entries * j.F < MOE_SMALL_CONVERT);
    j.blk = B == 1 ? j.E : MOE_DOWN_COLS;
    j.n_blk = (j.E + j.blk - 1) / j.blk;
    run_maybe(pool, down_run, &j, n_used * j.n_blk, work < MOE_SMALL_WORK);
    run_maybe(pool, mix_run, &j, B, n_entries * j.E < MOE_SMALL_CONVERT);
}

/* ---- the reference ---- */

/* The rows routed to expert e through its three matrices; their weighted outputs go to yk (grouped order). */
static void ref_expert(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int e, cpu_moe_buf *b,
                       void *mm_scratch) {
    const int E = b->n_embd, F = f->n_ff, k = f->n_expert_used;
    const int32_t *ent = b->entries + b->first[e];
    const int n = b->first[e + 1] - b->first[e];
    for (int i = 0; i < n; i++) memcpy(b->xg + (size_t)i * E, x + (size_t)(ent[i] / k) * E, sizeof(float) * (size_t)E);
    const kiln_weight gate = kiln_weight_matrix(f->gate, (uint64_t)e), up = kiln_weight_matrix(f->up, (uint64_t)e),
                      down = kiln_weight_matrix(f->down, (uint64_t)e);
    float *yd = b->yk + (size_t)b->first[e] * E;
    cpu_matmul(pool, &gate, b->xg, n, b->hg, mm_scratch);
    cpu_matmul(pool, &up, b->xg, n, b->hu, mm_scratch);
    cpu_swiglu(b->hg, b->hu, n * F);
    cpu_matmul(pool, &down, b->hg, n, yd, mm_scratch);
    for (int i = 0; i < n; i++) {
        const float w = b->wts[ent[i]];
        for (int c = 0; c < E; c++) yd[(size_t)i * E + c] *= w;
    }
}

void cpu_moe_ffn_ref(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int B, float *out, cpu_moe_buf *b,
                     void *mm_scratch) {
    const int E = b->n_embd, k = f->n_expert_used;
    const int n_used = route_rows(pool, f, x, B, b, mm_scratch);
    for (int u = 0; u < n_used; u++) ref_expert(pool, f, x, b->used[u], b, mm_scratch);
    /* the k outputs of each row summed in the order of its choice, as llama.cpp adds them */
    for (int t = 0; t < B; t++) {
        float *o = out + (size_t)t * E;
        memcpy(o, b->yk + (size_t)b->pos[t * k] * E, sizeof(float) * (size_t)E);
        for (int j = 1; j < k; j++) cpu_add(o, b->yk + (size_t)b->pos[t * k + j] * E, E);
    }
}
