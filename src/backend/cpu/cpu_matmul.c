/* cpu_matmul.c — quantized matrix x activation products on the thread pool. */
#include "backend/cpu/cpu_matmul.h"

#include <stdbool.h>
#include <string.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_repack.h"
#include "base/error.h"
#include "formats/blocks.h"
#include "formats/formats.h"

/* activation rows up to which a weight row is walked alone (decode steps of a few sequences): measured 1.7-2x
 * faster there than 4-row weight tiles, whose four weight streams stall on memory at this size */
#define SMALL_B 8
/* multiply-adds below which a product is not split across threads */
#define SMALL_MATMUL (1u << 16)
/* output rows per chunk of the pool: a multiple of a cache line of floats */
#define ROW_GRAIN 16

/* activation bytes per cache block of the tiled product: the block stays in L2 while a thread's weight
 * rows stream past it once */
#define ACT_BLOCK_BYTES (192u << 10)

/* The converted rows, then (Q8_0 activations) their block scales as floats for the tiled product. */
static size_t scales_offset(size_t row, int B) { return (row * (size_t)B + 63) & ~(size_t)63; }

/* ... then (the VNNI rows kernels) the flipped bytes of up to SMALL_B rows, or (the VNNI single-row Q4_K kernel)
 * the row's values in k4 order, or (interleaved weights) the rows' activation sums (cpu_r16_act_sums). */
static size_t flipped_offset(size_t row, int n, int B) {
    return (scales_offset(row, B) + (size_t)B * (size_t)(n / 32 + 1) * sizeof(float) + 63) & ~(size_t)63;
}

size_t cpu_matmul_scratch_bytes(uint32_t type, int n, int B) {
    const kiln_type_info *t = kiln_type_get(type);
    KILN_ASSERT(t);
    size_t row = kiln_row_bytes(t->vec_dot_type, (uint64_t)n);
    const size_t flipped = (size_t)(B < SMALL_B ? B : SMALL_B) * (size_t)n, sums = (size_t)B * (size_t)(n / 32) * sizeof(int32_t);
    return flipped_offset(row, n, B) + (flipped > sums ? flipped : sums);
}

/* Up to CPU_MATMUL_MAX_W weights of one type and input width against the same activation rows, in one pool run
 * over their rows laid end to end: weight i's rows are [first[i], first[i + 1]) of the run. */
typedef struct matmul_job {
    const kiln_weight *W[CPU_MATMUL_MAX_W];
    float *out[CPU_MATMUL_MAX_W];
    int first[CPU_MATMUL_MAX_W + 1];
    int nw;
    const kiln_type_info *ti;
    const float *x;
    const uint8_t *qx;      /* converted activations (B rows of qrow bytes) */
    float *yd;              /* Q8_0 activations: B rows of n/32 block scales as floats, else NULL */
    uint8_t *yu;            /* the rows kernel's flipped bytes (cpu_gemm_rows_flips), the single-row kernel's k4
                             * order (cpu_gemm_row1_reads_yu), else NULL */
    int32_t *ys;            /* interleaved weights (cpu_repack.h): B rows of cpu_r16_act_sums (n/32 words apart), else NULL */
    cpu_gemm_fn r16;        /* interleaved weights: their kernel on this CPU (cpu_gemm_r16_select), else NULL */
    size_t qrow, wrow;
    int B, n;
} matmul_job;

static void convert_rows(void *ctx, int lo, int hi, int ith) {
    matmul_job *j = ctx;
    for (int b = lo; b < hi; b++) {
        uint8_t *q = (uint8_t *)j->qx + (size_t)b * j->qrow;
        kiln_quantize_row_for_dot(j->W[0]->type, j->x + (size_t)b * j->n, q, j->n);
        if (j->ys) cpu_r16_act_sums(j->W[0]->type, q, j->n, j->ys + (size_t)b * (size_t)(j->n / 32));
        if (!j->yd) {
            if (j->yu) cpu_gemm_k4_order_row(q, j->n, j->yu + (size_t)b * j->n);
            continue;
        }
        const int nb = j->n / 32;
        const block_q8_0 *blk = (const block_q8_0 *)q;
        for (int ib = 0; ib < nb; ib++) j->yd[(size_t)b * nb + ib] = kiln_f16_to_f32(blk[ib].d);
        if (j->yu) cpu_gemm_flip_row(q, j->n, j->yu + (size_t)b * j->n);
    }
}

/* Weight rows [lo, hi) of W (rows of it in all) against every activation row. */
static void dot_weight_rows(const matmul_job *j, const kiln_weight *W, float *out, int rows, int lo, int hi) {
    const uint8_t *w = (const uint8_t *)W->data;
    kiln_vec_dot_fn dot = j->ti->vec_dot_fast ? j->ti->vec_dot_fast : j->ti->vec_dot;
    /* this thread's weight rows against the activation rows, one L2-sized block of those at a time
     * (each pair bit-identical to the single dot) */
    const cpu_gemm_args a = {.dot = dot, .n = j->n, .w = w, .w_stride = j->wrow, .y = j->qx, .y_stride = j->qrow,
                             .yd = j->yd, .yu = j->yu, .ys = j->ys, .out = out, .out_stride = (size_t)rows};
    if (j->r16) { /* every row count: one kernel, so a row's result never depends on the batch */
        int step = (int)(ACT_BLOCK_BYTES / j->qrow) / 8 * 8;
        if (step < 8) step = 8;
        for (int b = 0; b < j->B; b += step) j->r16(&a, lo, hi, b, b + step < j->B ? b + step : j->B);
        return;
    }
    if (j->B <= SMALL_B) { /* decode, one or a few rows: one weight row at a time, streamed once */
        const cpu_gemm_fn kernel = j->B == 1 ? cpu_gemm_row1_select(dot) : cpu_gemm_rows_select(dot);
        if (kernel) kernel(&a, lo, hi, 0, j->B);
        else
            for (int r = lo; r < hi; r++) { /* the plain dot */
                if (r + CPU_PREFETCH_ROWS < hi) cpu_prefetch_row(w + (size_t)(r + CPU_PREFETCH_ROWS) * j->wrow, j->wrow);
                dot(j->n, &out[r], w + (size_t)r * j->wrow, j->qx);
            }
        return;
    }
    const cpu_gemm_fn gemm = cpu_gemm_select(dot);
    const int tn = cpu_gemm_tile_rows(gemm); /* whole tiles per activation block */
    int step = (int)(ACT_BLOCK_BYTES / j->qrow) / tn * tn;
    if (step < tn) step = tn;
    for (int b = 0; b < j->B; b += step) gemm(&a, lo, hi, b, b + step < j->B ? b + step : j->B);
}

/* Rows [lo, hi) of the run: the part of each weight's rows that falls inside. */
static void dot_rows(void *ctx, int lo, int hi, int ith) {
    const matmul_job *j = ctx;
    for (int i = 0; i < j->nw; i++) {
        const int a = lo > j->first[i] ? lo : j->first[i], b = hi < j->first[i + 1] ? hi : j->first[i + 1];
        if (a < b) dot_weight_rows(j, j->W[i], j->out[i], j->first[i + 1] - j->first[i], a - j->first[i], b - j->first[i]);
    }
}

/* Whether W[0..nw) can share one conversion and one run: one type, one input width. */
static bool same_input(const kiln_weight *const *W, int nw) {
    for (int i = 1; i < nw; i++)
        if (W[i]->type != W[0]->type || W[i]->ne[0] != W[0]->ne[0] || W[i]->interleave != W[0]->interleave) return false;
    return true;
}

void cpu_matmul_n(kiln_pool *pool, int nw, const kiln_weight *const *W, const float *x, int B, float *const *out,
                  void *scratch) {
    KILN_ASSERT(nw >= 1 && nw <= CPU_MATMUL_MAX_W);
    if (!same_input(W, nw)) {
        for (int i = 0; i < nw; i++) cpu_matmul_n(pool, 1, &W[i], x, B, &out[i], scratch);
        return;
    }
    const kiln_type_info *ti = kiln_type_get(W[0]->type);
    KILN_ASSERT(ti && ti->vec_dot);
    matmul_job j = {
        .nw = nw, .ti = ti, .x = x, .B = B, .n = (int)W[0]->ne[0],
        .wrow = kiln_row_bytes(W[0]->type, W[0]->ne[0]),
        .qrow = kiln_row_bytes(ti->vec_dot_type, W[0]->ne[0]),
    };
    for (int i = 0; i < nw; i++) {
        j.W[i] = W[i];
        j.out[i] = out[i];
        j.first[i + 1] = j.first[i] + (int)W[i]->ne[1];
    }
    const int rows = j.first[nw];
    /* small products run on the calling thread: waking the pool costs more than it saves */
    const bool inline_run = (uint64_t)rows * (uint64_t)j.n * (uint64_t)B < SMALL_MATMUL;
    if (ti->vec_dot_type == KILN_TYPE_F32) {
        j.qx = (const uint8_t *)x;
    } else {
        j.qx = scratch;
        if (ti->vec_dot_type == KILN_TYPE_Q8_0) j.yd = (float *)((uint8_t *)scratch + scales_offset(j.qrow, B));
        const kiln_vec_dot_fn dot = ti->vec_dot_fast ? ti->vec_dot_fast : ti->vec_dot;
        if (W[0]->interleave) {
            j.ys = (int32_t *)((uint8_t *)scratch + flipped_offset(j.qrow, j.n, B));
            j.r16 = cpu_gemm_r16_select(W[0]->type);
        }
        else if ((j.yd && B > 1 && B <= SMALL_B && cpu_gemm_rows_flips(dot)) || (B == 1 && cpu_gemm_row1_reads_yu(dot)))
            j.yu = (uint8_t *)scratch + flipped_offset(j.qrow, j.n, B);
        /* a few rows (decode) convert faster on the caller than a pool run takes to start */
        if (B > SMALL_B && !inline_run) kiln_pool_for(pool, B, 1, convert_rows, &j);
        else convert_rows(&j, 0, B, 0);
    }
    if (inline_run) dot_rows(&j, 0, rows, 0);
    else kiln_pool_for(pool, rows, ROW_GRAIN, dot_rows, &j);
}

void cpu_matmul(kiln_pool *pool, const kiln_weight *W, const float *x, int B, float *out, void *scratch) {
    cpu_matmul_n(pool, 1, &W, x, B, &out, scratch);
}
