/* cpu_matmul.c — quantized matrix x activation products on the thread pool. */
#include "backend/cpu/cpu_matmul.h"

#include <string.h>

#include "backend/cpu/cpu_gemm.h"
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

/* ... then (the VNNI rows kernels) the flipped bytes of up to SMALL_B rows. */
static size_t flipped_offset(size_t row, int n, int B) {
    return (scales_offset(row, B) + (size_t)B * (size_t)(n / 32 + 1) * sizeof(float) + 63) & ~(size_t)63;
}

size_t cpu_matmul_scratch_bytes(uint32_t type, int n, int B) {
    const kiln_type_info *t = kiln_type_get(type);
    KILN_ASSERT(t);
    size_t row = kiln_row_bytes(t->vec_dot_type, (uint64_t)n);
    return flipped_offset(row, n, B) + (size_t)(B < SMALL_B ? B : SMALL_B) * (size_t)n;
}

typedef struct matmul_job {
    const kiln_weight *W;
    const kiln_type_info *ti;
    const float *x;
    const uint8_t *qx;      /* converted activations (B rows of qrow bytes) */
    float *yd;              /* Q8_0 activations: B rows of n/32 block scales as floats, else NULL */
    uint8_t *yu;            /* the rows kernel's flipped bytes (cpu_gemm_rows_flips), else NULL */
    size_t qrow, wrow;
    int B, n, rows;
    float *out;
} matmul_job;

static void convert_rows(void *ctx, int lo, int hi, int ith) {
    matmul_job *j = ctx;
    for (int b = lo; b < hi; b++) {
        uint8_t *q = (uint8_t *)j->qx + (size_t)b * j->qrow;
        kiln_quantize_row_for_dot(j->W->type, j->x + (size_t)b * j->n, q, j->n);
        if (!j->yd) continue;
        const int nb = j->n / 32;
        const block_q8_0 *blk = (const block_q8_0 *)q;
        for (int ib = 0; ib < nb; ib++) j->yd[(size_t)b * nb + ib] = kiln_f16_to_f32(blk[ib].d);
        if (j->yu) cpu_gemm_flip_row(q, j->n, j->yu + (size_t)b * j->n);
    }
}

static void dot_rows(void *ctx, int lo, int hi, int ith) {
    matmul_job *j = ctx;
    const uint8_t *w = (const uint8_t *)j->W->data;
    kiln_vec_dot_fn dot = j->ti->vec_dot_fast ? j->ti->vec_dot_fast : j->ti->vec_dot;
    /* this thread's weight rows against the activation rows, one L2-sized block of those at a time
     * (each pair bit-identical to the single dot) */
    const cpu_gemm_args a = {.dot = dot, .n = j->n, .w = w, .w_stride = j->wrow, .y = j->qx, .y_stride = j->qrow,
                             .yd = j->yd, .yu = j->yu, .out = j->out, .out_stride = (size_t)j->rows};
    if (j->B <= SMALL_B) { /* decode, one or a few rows: one weight row at a time, streamed once */
        const cpu_gemm_fn rows = j->B == 1 ? cpu_gemm_row1_select(dot) : cpu_gemm_rows_select(dot);
        if (rows) rows(&a, lo, hi, 0, j->B);
        else
            for (int r = lo; r < hi; r++) { /* the plain dot */
                if (r + CPU_PREFETCH_ROWS < hi) cpu_prefetch_row(w + (size_t)(r + CPU_PREFETCH_ROWS) * j->wrow, j->wrow);
                dot(j->n, &j->out[r], w + (size_t)r * j->wrow, j->qx);
            }
        return;
    }
    const cpu_gemm_fn gemm = cpu_gemm_select(dot);
    int step = (int)(ACT_BLOCK_BYTES / j->qrow) & ~3;
    if (step < 4) step = 4;
    for (int b = 0; b < j->B; b += step) gemm(&a, lo, hi, b, b + step < j->B ? b + step : j->B);
}

void cpu_matmul(kiln_pool *pool, const kiln_weight *W, const float *x, int B, float *out, void *scratch) {
    const kiln_type_info *ti = kiln_type_get(W->type);
    KILN_ASSERT(ti && ti->vec_dot);
    matmul_job j = {
        .W = W, .ti = ti, .x = x, .B = B, .n = (int)W->ne[0], .rows = (int)W->ne[1], .out = out,
        .wrow = kiln_row_bytes(W->type, W->ne[0]),
        .qrow = kiln_row_bytes(ti->vec_dot_type, W->ne[0]),
    };
    /* small products run on the calling thread: waking the pool costs more than it saves */
    const bool inline_run = (uint64_t)j.rows * (uint64_t)j.n * (uint64_t)B < SMALL_MATMUL;
    if (ti->vec_dot_type == KILN_TYPE_F32) {
        j.qx = (const uint8_t *)x;
    } else {
        j.qx = scratch;
        if (ti->vec_dot_type == KILN_TYPE_Q8_0) j.yd = (float *)((uint8_t *)scratch + scales_offset(j.qrow, B));
        if (j.yd && B <= SMALL_B && cpu_gemm_rows_flips(ti->vec_dot_fast ? ti->vec_dot_fast : ti->vec_dot))
            j.yu = (uint8_t *)scratch + flipped_offset(j.qrow, j.n, B);
        /* a few rows (decode) convert faster on the caller than a pool run takes to start */
        if (B > SMALL_B && !inline_run) kiln_pool_for(pool, B, 1, convert_rows, &j);
        else convert_rows(&j, 0, B, 0);
    }
    if (inline_run) dot_rows(&j, 0, j.rows, 0);
    else kiln_pool_for(pool, j.rows, ROW_GRAIN, dot_rows, &j);
}
