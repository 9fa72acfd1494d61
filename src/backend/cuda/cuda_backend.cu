/*
 * cuda_backend.cu — the CUDA backend (backend.h) and the facts behind `kiln info`.
 *
 * Open does everything once: context, one device arena (weights + F16 KV cache of n_ctx positions per sequence
 * + activations + logits), the upload of every weight from the map through a pinned double-buffered staging
 * area (repacked or converted on the way, see cuda_kernels.cuh), an eager load of every kernel, the capture of
 * the decode step as one CUDA graph per bucket of rows (1, 2, 4, ... up to min(n_seq, max_batch)), and a
 * device warm pass that replays every graph. After open nothing is allocated, loaded or captured.
 *
 * A decode step (rows of distinct sequences): its rows (id, sequence, position; padding rows at position -1
 * up to the bucket) in one host->device copy, the bucket's graph (one row: matvecs with fused epilogues; more:
 * tensor-core GEMMs over all rows, k_gemm_few up to 16 rows; attention in one launch over all rows), the output stage
 * (launch_outputs: logits, the argmax of every row, the device sampler of cuda_sample.cu over the rows that
 * are sampled, one copy back of each row's id), logits copied for the rows that ask.
 * Kernels are chained by programmatic dependent launch (sm_90+). Any other batch (a prefill, several rows of
 * one sequence): the same kernels launched eagerly (all loaded and warmed at open), attention per run of one
 * sequence's rows, the same output stage over the output rows. A mixture-of-experts layer's feed-forward
 * (routing, top-k and the chosen experts, all on the device) is cuda_moe.cu's, in every path: per row for
 * few rows, grouped by expert (tensor-core GEMMs over each expert's rows) for calls of many rows. The test entry
 * points are in cuda_testing.cu (test binaries only).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_sample.cuh"

extern "C" {
#include "backend/cuda/cuda_api.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timing.h"
#include "formats/formats.h"
#include "session/backend.h"
}

#ifndef KILN_CUDA_ARCHS
#define KILN_CUDA_ARCHS ""
#endif
#ifndef KILN_CUDA_PTX
#define KILN_CUDA_PTX 0
#endif

#define STAGE_BYTES ((size_t)8 << 20) /* one half of the pinned upload double buffer */
#define CK_MAX_BUCKETS 16                /* decode-step sizes 1..8, then 16, 32, ..., 256 */
/* The most rows of a decode step that run the multi-row matvecs where they are not on the tensor cores (more
 * rows: the split-K GEMMs). Measured on the H200 (bench/RESULTS.md, multi-row matvec in one wave), step ms
 * matvec / GEMM: llama-3.2-1b Q4_K 2 rows 1.24 / 3.12, 4 rows 1.77 / 3.00, 8 rows 3.27 / 3.26. Steps on the
 * tensor cores (steps_on_mma) take up to CK_MV_MAX_ROWS rows. */
#define STEP_MV_ROWS 4

/* ------------------------------------------------------------------ helpers */

/* Carves n bytes (256-aligned) from a region; with base == NULL only sums. */
static void *carve(uint8_t *base, size_t *off, size_t n) {
    size_t o = align_up(*off, 256);
    *off = o + n;
    return base ? base + o : NULL;
}

/* ------------------------------------------------------------------ state */

typedef struct cu_layer {
    dev_weight wqkv, wq, wk, wv, wo, wg, wu, wd;
    bool qkv_fused, gu_dual;
    float *attn_norm, *ffn_norm;
    float *bqkv, *q_norm, *k_norm;   /* Q|K|V biases, per-head Q/K RMSNorm weights; NULL when absent */
    moe_layer moe;                   /* a MoE layer (moe.n_expert > 0): wg/wu/wd hold every expert's rows */
} cu_layer;

typedef struct cuda_state {
    const kiln_model *m;
    kiln_backend_config cfg;
    int n_sm;
    cudaStream_t stream;
    cudaEvent_t stage_ev[2];
    /* decode steps: one graph per bucket of R rows (1, 2, 4, ... up to max_step), each reading its rows'
     * (id, sequence, position) from device memory */
    int n_buckets, bucket[CK_MAX_BUCKETS], att_split[CK_MAX_BUCKETS];
    cudaGraph_t graphs[CK_MAX_BUCKETS];
    cudaGraphExec_t gexecs[CK_MAX_BUCKETS];
    int max_step;              /* most rows of a decode step: min(n_seq, max_batch) */
    int mv_rows;               /* steps of up to this many rows run the multi-row matvecs (one bucket per size);
                                * larger ones the GEMMs (buckets 2^k, padded) */
    bool steps_mma;            /* every matvec of several rows runs on the tensor cores (steps_on_mma) */
    int max_rows_out;          /* most output rows of one call: max(max_step, max_out) */
    uint8_t *seen;             /* n_seq flags: which sequences a call's rows touch (decode-step test) */
    int cur_seq;               /* the sequence whose cache the eager prefill pieces address */
    bool use_graph;
    bool pdl;           /* programmatic dependent launch for this session's kernels */
    int graph_nodes, graph_pdl_edges;

    char decode_path[96];

    uint8_t *arena;
    size_t arena_bytes, weight_bytes, scratch_off;
    uint64_t file_weight_bytes;
    double upload_gbps;
    int n_converted;
    char converted[256];
    int n_kernels;

    cu_layer *layers;
    dev_weight tok_embd, output;
    float *output_norm;

    /* dimensions */
    int E, Q, KV, F, V, NQKV, Epad, Qpad, Fpad;
    long long seq_stride;  /* halves between two sequences' caches: n_layer * n_ctx * KV */
    bool qkv_post;      /* biases, Q/K norm or NEOX RoPE: Q/K/V go through ck_qkv_post after their matmul */
    /* scratch */
    __half *kc, *vc, *xh, *atth, *hh;
    float *x, *qkv, *g, *u, *hvec, *part, *attn_f, *logits, *arg_val, *rope_freq;
    float *gwork;       /* split-K partials of the GEMMs */
    unsigned *gtiles;   /* the few-rows GEMM's count of finished splits per column of outputs (zero between calls) */
    int *arg_idx, *arg_rows, *rows, *ids;  /* rows: ids | seqs | positions of a decode step (max_step each) */
    unsigned *counter, *att_counters;
    int max_mv_blocks;
    moe_scratch moe;   /* the MoE layers' routing and expert buffers (cuda_moe.cuh) */

    /* pinned host memory */
    uint8_t *pinned;
    uint8_t *h_stage[2];
    int *h_rows, *h_ids, *h_argmax;
    kiln_sample_spec *h_spec, *d_spec; /* a spec per output row (pinned, device): mode NONE unless sampled */
    void *d_sample_scratch;            /* max_rows_out x ck_sample_scratch_bytes: the device sampler's rows */
    float *conv_tmp; /* host floats of one row for conversions (kiln_malloc, open only) */
    int stage_i;
} cuda_state;

/* ------------------------------------------------------------------ probe / info */

extern "C" const char *kiln_cuda_archs_built(void) {
    static char buf[256];
    if (!buf[0]) {
        char archs[128];
        snprintf(archs, sizeof archs, "%s", KILN_CUDA_ARCHS);
        size_t n = 0;
        buf[0] = '\0';
        for (char *tok = strtok(archs, " "); tok; tok = strtok(NULL, " "))
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%ssm_%s", n ? " " : "", tok);
        snprintf(buf + n, sizeof buf - n, "%scompute_%d PTX", n ? " + " : "", KILN_CUDA_PTX);
#ifdef KILN_CUDA_CHECK_BUILD
        n = strlen(buf);
        snprintf(buf + n, sizeof buf - n, " (compile check, unoptimised: build with CUDA_ARCHS=native or all to run)");
#endif
    }
    return buf;
}

/* The newest built SASS arch that runs on cc (same major, minor not above the device's). */
static int sass_for(int major, int minor) {
    char archs[128];
    snprintf(archs, sizeof archs, "%s", KILN_CUDA_ARCHS);
    int best = 0, dev = major * 10 + minor;
    for (char *tok = strtok(archs, " "); tok; tok = strtok(NULL, " ")) {
        int a = atoi(tok);
        if (a / 10 == major && a <= dev && a > best) best = a;
    }
    return best;
}

static bool driver_library_present(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) return false;
    /* keep it loaded: the runtime opens it again */
    return true;
}

extern "C" void kiln_cuda_probe(kiln_cuda_device_info *out) {
    memset(out, 0, sizeof *out);
    if (!driver_library_present()) {
        snprintf(out->reason, sizeof out->reason, "no CUDA driver (libcuda.so.1 not found)");
        return;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(out->reason, sizeof out->reason, "no GPU: %s", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return;
    }
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        snprintf(out->reason, sizeof out->reason, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
        return;
    }
    out->present = true;
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->cc_major = p.major, out->cc_minor = p.minor;
    out->n_sm = p.multiProcessorCount;
    out->mem_bytes = p.totalGlobalMem;
    cudaDriverGetVersion(&out->driver_version);
    cudaRuntimeGetVersion(&out->runtime_version);
    out->sass_arch = sass_for(p.major, p.minor);
    const int dev = p.major * 10 + p.minor;
    out->would_jit = out->sass_arch == 0 && dev >= KILN_CUDA_PTX;
    out->unsupported = out->sass_arch == 0 && dev < KILN_CUDA_PTX;
}

/* ------------------------------------------------------------------ upload */

/* The next pinned staging half, once the copies that read it have finished. */
static kiln_status stage_next(cuda_state *s, int *i) {
    *i = s->stage_i;
    s->stage_i ^= 1;
    CU_TRY(cudaEventSynchronize(s->stage_ev[*i]), "upload: waiting for a staging buffer");
    return KILN_OK;
}

/* Uploads the rows of src into dst (a view whose rows start at row_off), through pinned memory: copied,
 * repacked on the device (the types with metadata slots, ck_layout), or converted to F16 on the host (types
 * without a kernel). */
static kiln_status upload_matrix(cuda_state *s, const kiln_weight *src, const dev_weight *dst, int row_off) {
    const int in = (int)src->ne[0], rows = (int)src->ne[1];
    const size_t src_row = kiln_row_bytes(src->type, (uint64_t)in);
    const bool convert = src->type != (uint32_t)dst->type;
    const size_t stage_row = convert ? (size_t)in * 2 : src_row;
    if (stage_row == 0 || stage_row > STAGE_BYTES)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda: %s: row of %zu bytes does not fit the staging buffer", src->name,
                         stage_row);
    const int chunk = (int)(STAGE_BYTES / stage_row);
    const kiln_type_info *ti = kiln_type_get(src->type);
    uint8_t *dev_stage[2] = {s->arena + s->scratch_off, s->arena + s->scratch_off + STAGE_BYTES};
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int nr = rows - r0 < chunk ? rows - r0 : chunk;
        int i;
        KILN_TRY(stage_next(s, &i));
        const uint8_t *sp = (const uint8_t *)src->data + (size_t)r0 * src_row;
        if (convert) {
            uint16_t *h = (uint16_t *)s->h_stage[i];
            for (int r = 0; r < nr; r++) {
                ti->to_float(sp + (size_t)r * src_row, s->conv_tmp, in);
                for (int k = 0; k < in; k++) h[(size_t)r * in + k] = kiln_f32_to_f16(s->conv_tmp[k]);
            }
        } else {
            memcpy(s->h_stage[i], sp, (size_t)nr * src_row);
        }
        const size_t bytes = (size_t)nr * stage_row;
        uint8_t *dq = (uint8_t *)dst->q + (size_t)(row_off + r0) * (size_t)dst->row_bytes;
        const ck_layout L = ck_layout_of(dst->type);
        if (L.meta_slot) {
            CU_TRY(cudaMemcpyAsync(dev_stage[i], s->h_stage[i], bytes, cudaMemcpyHostToDevice, s->stream), "upload");
            __half *dd = (__half *)dst->d + (size_t)(row_off + r0) * dst->d_per_row;
            ck_repack(dev_stage[i], (long long)nr * (in / L.values), L, dq, dd, s->stream);
            CU_TRY(cudaGetLastError(), "upload: repack kernel");
        } else {
            CU_TRY(cudaMemcpyAsync(dq, s->h_stage[i], bytes, cudaMemcpyHostToDevice, s->stream), "upload");
        }
        CU_TRY(cudaEventRecord(s->stage_ev[i], s->stream), "upload: event");
    }
    s->file_weight_bytes += (uint64_t)rows * src_row;
    return KILN_OK;
}

/* A 1-D weight (norms) as floats. */
static kiln_status upload_vector(cuda_state *s, const kiln_weight *src, float *dst) {
    const int n = (int)src->ne[0];
    const kiln_type_info *ti = kiln_type_get(src->type);
    if (!ti || !ti->to_float) return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda: %s: type %u cannot be read", src->name, src->type);
    if ((size_t)n * 4 > STAGE_BYTES) return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda: %s: too long", src->name);
    int i;
    KILN_TRY(stage_next(s, &i));
    ti->to_float(src->data, (float *)s->h_stage[i], n);
    CU_TRY(cudaMemcpyAsync(dst, s->h_stage[i], (size_t)n * 4, cudaMemcpyHostToDevice, s->stream), "upload");
    CU_TRY(cudaEventRecord(s->stage_ev[i], s->stream), "upload: event");
    s->file_weight_bytes += src->nbytes;
    return KILN_OK;
}

/* The device type of a weight: its own when a kernel reads it, else F16 (counted as a conversion). */
static kiln_status dev_type_of(cuda_state *s, const kiln_weight *w, bool count, uint32_t *out) {
    if (type_has_kernel(w->type)) {
        *out = w->type;
        return KILN_OK;
    }
    const kiln_type_info *ti = kiln_type_get(w->type);
    if (!ti || !ti->to_float)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda: %s: type %s has no kernel and cannot be converted", w->name,
                         ti ? ti->name : "?");
    if (count) {
        if (s->n_converted == 0)
            snprintf(s->converted, sizeof s->converted, "%s->f16", ti->name);
        s->n_converted++;
    }
    *out = CK_F16;
    return KILN_OK;
}

/* ------------------------------------------------------------------ layout */

/* Places a matrix of rows x in (device type t) in the weight region. */
static dev_weight place_matrix(uint8_t *base, size_t *off, uint32_t t, int in, int rows) {
    dev_weight w;
    memset(&w, 0, sizeof w);
    w.type = (int)t;
    w.in = in;
    w.out = rows;
    dev_geometry(t, in, &w.row_bytes, &w.d_per_row);
    w.q = (const uint8_t *)carve(base, off, (size_t)w.row_bytes * rows);
    if (w.d_per_row) w.d = (const __half *)carve(base, off, (size_t)w.d_per_row * rows * 2);
    return w;
}

/* A view of rows [r0, r0 + n) of a placed matrix. */
static dev_weight sub_rows(dev_weight w, int r0, int n) {
    if (w.q) w.q += (size_t)r0 * w.row_bytes;
    if (w.d) w.d += (size_t)r0 * w.d_per_row;
    w.out = n;
    return w;
}

/* The feed-forward matrices of a layer as the device holds them: dense, or (MoE) each 3-D expert tensor as one
 * matrix of n_expert * rows rows. */
static void ffn_matrices(const kiln_layer *L, kiln_weight *g, kiln_weight *u, kiln_weight *d) {
    const bool moe = L->ffn_gate_exps.data != NULL;
    *g = moe ? cm_flat(&L->ffn_gate_exps) : L->w_gate;
    *u = moe ? cm_flat(&L->ffn_up_exps) : L->w_up;
    *d = moe ? cm_flat(&L->ffn_down_exps) : L->w_down;
}

/* A MoE layer's router and experts (placed in D) for cuda_moe; gate and up of different types are both held
 * as F16 (the expert kernel reads them with one type). */
static kiln_status plan_moe(cuda_state *s, const kiln_layer *L, cu_layer *D, uint8_t *base, size_t *off, uint32_t *tg,
                            uint32_t *tu) {
    const kiln_hparams *hp = &s->m->hp;
    memset(&D->moe, 0, sizeof D->moe);
    if (!L->ffn_gate_exps.data) return KILN_OK;
    if (*tg != *tu) {
        if (base) s->n_converted += 2;
        *tg = *tu = CK_F16;
    }
    uint32_t tr;
    KILN_TRY(dev_type_of(s, &L->ffn_gate_inp, base != NULL, &tr));
    D->moe.router = place_matrix(base, off, tr, (int)L->ffn_gate_inp.ne[0], (int)L->ffn_gate_inp.ne[1]);
    D->moe.n_expert = hp->n_expert, D->moe.n_used = hp->n_expert_used, D->moe.n_ff = hp->n_ff_exp;
    D->moe.norm_topk = hp->moe_norm_topk;
    return KILN_OK;
}

static kiln_status plan_weights(cuda_state *s, uint8_t *base, size_t *off) {
    const kiln_model *m = s->m;
    const kiln_hparams *hp = &m->hp;
    const bool count = base != NULL;
    uint32_t t;
    KILN_TRY(dev_type_of(s, &m->tok_embd, count, &t));
    s->tok_embd = place_matrix(base, off, t, (int)m->tok_embd.ne[0], (int)m->tok_embd.ne[1]);
    if (m->output.data == m->tok_embd.data) {
        s->output = s->tok_embd;
    } else {
        KILN_TRY(dev_type_of(s, &m->output, count, &t));
        s->output = place_matrix(base, off, t, (int)m->output.ne[0], (int)m->output.ne[1]);
    }
    s->output_norm = (float *)carve(base, off, (size_t)hp->n_embd * 4);
    for (int il = 0; il < hp->n_layer; il++) {
        const kiln_layer *L = &m->layers[il];
        cu_layer *D = &s->layers[il];
        uint32_t tq, tk, tv, to, tg, tu, td;
        kiln_weight wg, wu, wd;
        ffn_matrices(L, &wg, &wu, &wd);
        KILN_TRY(dev_type_of(s, &L->wq, count, &tq));
        KILN_TRY(dev_type_of(s, &L->wk, count, &tk));
        KILN_TRY(dev_type_of(s, &L->wv, count, &tv));
        KILN_TRY(dev_type_of(s, &L->wo, count, &to));
        KILN_TRY(dev_type_of(s, &wg, count, &tg));
        KILN_TRY(dev_type_of(s, &wu, count, &tu));
        KILN_TRY(dev_type_of(s, &wd, count, &td));
        KILN_TRY(plan_moe(s, L, D, base, off, &tg, &tu));
        const int E = (int)L->wq.ne[0], nq = (int)L->wq.ne[1], nk = (int)L->wk.ne[1], nv = (int)L->wv.ne[1];
        D->qkv_fused = tq == tk && tq == tv;
        if (D->qkv_fused) {
            D->wqkv = place_matrix(base, off, tq, E, nq + nk + nv);
            D->wq = sub_rows(D->wqkv, 0, nq);
            D->wk = sub_rows(D->wqkv, nq, nk);
            D->wv = sub_rows(D->wqkv, nq + nk, nv);
        } else {
            D->wq = place_matrix(base, off, tq, E, nq);
            D->wk = place_matrix(base, off, tk, E, nk);
            D->wv = place_matrix(base, off, tv, E, nv);
        }
        D->wo = place_matrix(base, off, to, (int)L->wo.ne[0], (int)L->wo.ne[1]);
        D->wg = place_matrix(base, off, tg, (int)wg.ne[0], (int)wg.ne[1]);
        D->wu = place_matrix(base, off, tu, (int)wu.ne[0], (int)wu.ne[1]);
        D->gu_dual = tg == tu;
        D->wd = place_matrix(base, off, td, (int)wd.ne[0], (int)wd.ne[1]);
        D->attn_norm = (float *)carve(base, off, (size_t)hp->n_embd * 4);
        D->ffn_norm = (float *)carve(base, off, (size_t)hp->n_embd * 4);
        D->moe.gate = D->wg, D->moe.up = D->wu, D->moe.down = D->wd, D->moe.norm_w = D->ffn_norm;
        D->bqkv = L->bq.data ? (float *)carve(base, off, (size_t)(nq + nk + nv) * 4) : NULL;
        D->q_norm = L->q_norm.data ? (float *)carve(base, off, (size_t)hp->head_dim * 4) : NULL;
        D->k_norm = L->k_norm.data ? (float *)carve(base, off, (size_t)hp->head_dim * 4) : NULL;
    }
    return KILN_OK;
}

static size_t gemm_work_floats(const cuda_state *s);

/* Activations, KV cache, logits and parameters; with base == NULL only sums. */
static void plan_scratch(cuda_state *s, uint8_t *base, size_t *off) {
    const kiln_hparams *hp = &s->m->hp;
    const size_t B = (size_t)s->cfg.max_batch, C = (size_t)s->cfg.n_ctx, M = (size_t)s->max_step;
    const size_t NS = (size_t)s->cfg.n_seq, NO = (size_t)s->max_rows_out;
    size_t n_part = 0; /* attention partials of the largest bucket */
    for (int b = 0; b < s->n_buckets; b++) {
        const size_t p = (size_t)s->bucket[b] * s->att_split[b];
        n_part = p > n_part ? p : n_part;
    }
    s->kc = (__half *)carve(base, off, NS * hp->n_layer * C * s->KV * 2);
    s->vc = (__half *)carve(base, off, NS * hp->n_layer * C * s->KV * 2);
    s->x = (float *)carve(base, off, B * s->E * 4);
    s->qkv = (float *)carve(base, off, B * s->NQKV * 4);
    s->g = (float *)carve(base, off, B * s->F * 4);
    s->u = (float *)carve(base, off, B * s->F * 4);
    s->hvec = (float *)carve(base, off, (size_t)s->mv_rows * s->F * 4);
    s->xh = (__half *)carve(base, off, B * s->Epad * 2);
    s->atth = (__half *)carve(base, off, B * s->Qpad * 2);
    s->hh = (__half *)carve(base, off, B * s->Fpad * 2);
    cm_plan_scratch(&s->moe, cm_dims(s->m), (int)B, s->cfg.cuda_moe_per_row ? 0 : -1, base, off);
    s->part = (float *)carve(base, off, n_part * hp->n_head * (hp->head_dim + 2) * 4);
    s->attn_f = (float *)carve(base, off, (size_t)s->mv_rows * s->Q * 4);
    s->att_counters = (unsigned *)carve(base, off, M * hp->n_head * 4);
    s->logits = (float *)carve(base, off, NO * s->V * 4);
    s->arg_val = (float *)carve(base, off, (size_t)s->mv_rows * s->max_mv_blocks * 4);
    s->arg_idx = (int *)carve(base, off, (size_t)s->mv_rows * s->max_mv_blocks * 4);
    s->counter = (unsigned *)carve(base, off, 4);
    s->arg_rows = (int *)carve(base, off, NO * 4);
    s->rows = (int *)carve(base, off, 3 * M * 4);
    s->ids = (int *)carve(base, off, (B + NO) * 4);
    s->d_spec = (kiln_sample_spec *)carve(base, off, NO * sizeof(kiln_sample_spec));
    s->d_sample_scratch = carve(base, off, NO * ck_sample_scratch_bytes(s->V));
    s->rope_freq = (float *)carve(base, off, (size_t)(hp->n_rot / 2 + 1) * 4);
    s->gwork = (float *)carve(base, off, gemm_work_floats(s) * 4);
    int widest_out = s->NQKV > s->F ? s->NQKV : s->F;
    widest_out = widest_out > s->E ? widest_out : s->E;
    s->gtiles = (unsigned *)carve(base, off, (size_t)ck_gemm_tile_counters(widest_out) * 4);
}

/* ------------------------------------------------------------------ forward pieces */

static int mv_blocks(const cuda_state *s, mv_args &a) { return ck_matvec_plan(a, s->n_sm); }

static void launch_mv(cuda_state *s, mv_args a) {
    const int nb = mv_blocks(s, a);
    ck_matvec(a, nb, s->stream);
}

/* The rows of a decode step in device memory: ids, sequences, positions (max_step each). */
static const int *step_ids(const cuda_state *s) { return s->rows; }
static const int *step_seq(const cuda_state *s) { return s->rows + s->max_step; }
static const int *step_pos(const cuda_state *s) { return s->rows + 2 * s->max_step; }

/* Offset of layer il of sequence `seq`'s cache: (n_seq, n_layer, n_ctx, KV) halves. */
static size_t kv_offset(const cuda_state *s, int seq, int il) {
    return ((size_t)seq * s->m->hp.n_layer + (size_t)il) * s->cfg.n_ctx * s->KV;
}

/* ---- the output stage: logits and argmax of n_out rows of x into s->logits (row k at k * V) and
 * s->arg_rows, the device sampler over them (specs in d_spec), then the ids' copy to h_argmax. Up to mv_rows consecutive rows from `first` (idx_dev NULL):
 * the fused matvec (RMSNorm, logits, argmax per row); else RMSNorm of the rows idx_dev[k] (NULL: rows
 * 0..n_out-1), the GEMM, the row argmax. */
static void launch_outputs(cuda_state *s, int n_out, int first, const int *idx_dev) {
    cudaStream_t st = s->stream;
    if (n_out <= s->mv_rows && (!idx_dev || n_out == 1)) {
        mv_args a = mv_base();
        a.w0 = s->output;
        a.nr = n_out, a.x_stride = s->E, a.y_stride = s->V;
        a.pair = MV_PAIR_ADJ;
        a.in_mode = MV_IN_NORM;
        a.x = s->x + (size_t)first * s->E;
        a.norm_w = s->output_norm;
        a.eps = s->m->hp.rms_eps;
        a.epi = MV_EPI_LOGITS;
        a.y = s->logits;
        a.arg_val = s->arg_val;
        a.arg_idx = s->arg_idx;
        a.counter = s->counter;
        a.arg_out = s->arg_rows;
        launch_mv(s, a);
    } else {
        ck_rmsnorm_rows(s->x, idx_dev, s->output_norm, s->m->hp.rms_eps, s->E, n_out, s->xh, s->Epad, st);
        ck_gemm(s->output, s->xh, s->Epad, n_out, s->logits, s->V, 0, false, st);
        ck_argmax_rows(s->logits, s->V, n_out, s->arg_rows, st);
    }
    /* rows sampled on the device: their drawn ids replace the argmax (d_spec holds one spec per row) */
    ck_sample(s->d_spec, s->logits, s->V, (size_t)s->V, n_out, s->arg_rows, s->d_sample_scratch, st);
    cudaMemcpyAsync(s->h_argmax, s->arg_rows, (size_t)n_out * sizeof(int), cudaMemcpyDeviceToHost, st);
}

/* ---- decode steps of R <= mv_rows rows: matvecs over the R rows (each weight read once) with fused
 * prologues and epilogues */

/* RMSNorm + QKV of R rows (rows of w placed at row_offset of the q|k|v range) + RoPE + KV append. */
static mv_args dec_qkv(const cuda_state *s, int il, const dev_weight &w, int row_offset, int R) {
    const kiln_hparams *hp = &s->m->hp;
    const cu_layer *L = &s->layers[il];
    const size_t kv_off = kv_offset(s, 0, il);
    mv_args a = mv_base();
    a.w0 = w;
    a.nr = R, a.x_stride = s->E, a.y_stride = s->NQKV;
    a.row_offset = row_offset;
    a.pair = MV_PAIR_ADJ;
    a.in_mode = MV_IN_NORM;
    a.x = s->x;
    a.norm_w = L->attn_norm;
    a.eps = hp->rms_eps;
    a.epi = MV_EPI_QKV;
    if (s->qkv_post) a.epi = MV_EPI_STORE, a.y = s->qkv + row_offset; /* ck_qkv_post does the rest */
    a.pos = step_pos(s);
    a.seq = step_seq(s);
    a.seq_stride = s->seq_stride;
    a.nq = s->Q, a.nk = s->KV, a.n_rot = hp->n_rot, a.head_dim = hp->head_dim, a.kv_dim = s->KV;
    a.rope_freq = s->rope_freq;
    a.q_out = s->qkv;
    a.k_cache = s->kc + kv_off;
    a.v_cache = s->vc + kv_off;
    return a;
}

/* The post-matmul work on n rows of s->qkv of layer il: rows at pos0.. of s->cur_seq, or (step) the rows of
 * a decode step, each its own sequence and position from device memory. */
static qkv_post_args qkv_post(const cuda_state *s, int il, int r0, int pos0, bool step) {
    const kiln_hparams *hp = &s->m->hp;
    const cu_layer *L = &s->layers[il];
    const size_t kv_off = kv_offset(s, step ? 0 : s->cur_seq, il);
    qkv_post_args a = {
        .qkv = s->qkv + (size_t)r0 * s->NQKV, .stride = s->NQKV, .pos0 = pos0,
        .pos_dev = step ? step_pos(s) : NULL, .seq_dev = step ? step_seq(s) : NULL, .seq_stride = s->seq_stride,
        .nq = s->Q, .nk = s->KV, .head_dim = hp->head_dim, .n_rot = hp->n_rot, .neox = hp->rope_neox,
        .bias = L->bqkv, .q_norm = L->q_norm, .k_norm = L->k_norm, .eps = hp->rms_eps, .rope_freq = s->rope_freq,
        .k_cache = s->kc + kv_off, .v_cache = s->vc + kv_off, .kv_dim = s->KV,
    };
    return a;
}

/* Attention of the R rows of a decode step (bucket b) over their sequences' caches: into attn_f (float, for
 * the matvecs) or atth (half, for the GEMMs). */
static attn_args step_attn(const cuda_state *s, int il, int b) {
    const kiln_hparams *hp = &s->m->hp;
    const size_t kv_off = kv_offset(s, 0, il);
    attn_args at;
    memset(&at, 0, sizeof at);
    at.q = s->qkv;
    at.q_stride = s->NQKV;
    at.k_cache = s->kc + kv_off;
    at.v_cache = s->vc + kv_off;
    at.seq_stride = s->seq_stride;
    at.kv_dim = s->KV, at.n_head = hp->n_head, at.n_head_kv = hp->n_head_kv, at.head_dim = hp->head_dim;
    at.row_seq = step_seq(s);
    at.row_pos = step_pos(s);
    at.n_split = s->att_split[b];
    at.part = s->part;
    at.counters = s->att_counters;
    if (s->bucket[b] <= s->mv_rows) at.out_f = s->attn_f;
    else at.out = s->atth, at.out_stride = s->Qpad;
    at.scale = 1.0f / sqrtf((float)hp->head_dim);
    return at;
}

/* x += W x_in for R rows (the O projection from attn_f, or the down projection from hvec). */
static mv_args dec_residual(const cuda_state *s, const dev_weight &w, const float *in, int R) {
    mv_args a = mv_base();
    a.w0 = w;
    a.nr = R, a.x_stride = w.in == s->Q ? s->Q : s->F, a.y_stride = s->E;
    a.pair = MV_PAIR_ADJ;
    a.in_mode = MV_IN_PLAIN;
    a.x = in;
    a.epi = MV_EPI_ADD;
    a.y = s->x;
    return a;
}

/* RMSNorm + gate/up of R rows: SwiGLU into hvec when both have one type (dual), else the caller stores g, u. */
static mv_args dec_gate_up(const cuda_state *s, int il, int R) {
    const cu_layer *L = &s->layers[il];
    mv_args a = mv_base();
    a.nr = R, a.x_stride = s->E, a.y_stride = s->F;
    a.in_mode = MV_IN_NORM;
    a.x = s->x;
    a.norm_w = L->ffn_norm;
    a.eps = s->m->hp.rms_eps;
    a.w0 = L->wg, a.w1 = L->wu;
    a.pair = MV_PAIR_DUAL;
    a.epi = MV_EPI_SWIGLU;
    a.y = s->hvec;
    return a;
}

/* The decode step of bucket b (R <= mv_rows rows, no padding): the rows' ids, sequences and positions in
 * s->rows, kernel by kernel. */
static void launch_decode(cuda_state *s, int b) {
    const kiln_hparams *hp = &s->m->hp;
    cudaStream_t st = s->stream;
    const int R = s->bucket[b];
    ck_embed(s->tok_embd, step_ids(s), s->x, R, st);
    for (int il = 0; il < hp->n_layer; il++) {
        const cu_layer *L = &s->layers[il];
        if (L->qkv_fused) {
            launch_mv(s, dec_qkv(s, il, L->wqkv, 0, R));
        } else {
            launch_mv(s, dec_qkv(s, il, L->wq, 0, R));
            launch_mv(s, dec_qkv(s, il, L->wk, s->Q, R));
            launch_mv(s, dec_qkv(s, il, L->wv, s->Q + s->KV, R));
        }
        if (s->qkv_post) ck_qkv_post(qkv_post(s, il, 0, 0, true), R, st);
        ck_attn_decode(step_attn(s, il, b), R, st);
        launch_mv(s, dec_residual(s, L->wo, s->attn_f, R));
        if (L->moe.n_expert) { /* routing and experts on the device (cuda_moe.cu) */
            cm_ffn(L->moe, s->moe, s->x, s->E, hp->rms_eps, R, s->pdl, st);
            continue;
        }
        if (L->gu_dual) {
            launch_mv(s, dec_gate_up(s, il, R));
        } else {
            mv_args a = dec_gate_up(s, il, R);
            a.pair = MV_PAIR_ADJ;
            a.epi = MV_EPI_STORE;
            a.w1 = dev_weight{};
            a.w0 = L->wg, a.y = s->g;
            launch_mv(s, a);
            a.w0 = L->wu, a.y = s->u;
            launch_mv(s, a);
            ck_swiglu_vec(s->g, s->u, R * s->F, s->hvec, st);
        }
        launch_mv(s, dec_residual(s, L->wd, s->hvec, R));
    }
    launch_outputs(s, R, 0, NULL);
}

/* ---- n rows through the matrix products (tensor-core GEMMs over all rows: each weight read once) */

/* C (=|+=) W A over n rows, the k range split where the output tiles alone would leave SMs idle. */
static void gemm(cuda_state *s, const dev_weight &w, const __half *A, int lda, int n, float *C, int ldc, int col_off,
                 bool add) {
    const int ks = ck_gemm_splits(w, n, s->n_sm);
    ck_gemm_split(w, A, lda, n, C, ldc, col_off, add, ks, s->gwork, s->gtiles, s->stream);
}

/* RMSNorm + Q/K/V of n rows of x into s->qkv. */
static void qkv_rows(cuda_state *s, const cu_layer *L, int n) {
    ck_rmsnorm_rows(s->x, NULL, L->attn_norm, s->m->hp.rms_eps, s->E, n, s->xh, s->Epad, s->stream);
    if (L->qkv_fused) {
        gemm(s, L->wqkv, s->xh, s->Epad, n, s->qkv, s->NQKV, 0, false);
    } else {
        gemm(s, L->wq, s->xh, s->Epad, n, s->qkv, s->NQKV, 0, false);
        gemm(s, L->wk, s->xh, s->Epad, n, s->qkv, s->NQKV, s->Q, false);
        gemm(s, L->wv, s->xh, s->Epad, n, s->qkv, s->NQKV, s->Q + s->KV, false);
    }
}

/* x += O(atth), then x += down(SwiGLU(gate, up)(RMSNorm(x))) for n rows (a MoE layer: each row's chosen
 * experts, cuda_moe.cu). */
static void o_ffn_rows(cuda_state *s, const cu_layer *L, int n) {
    cudaStream_t st = s->stream;
    gemm(s, L->wo, s->atth, s->Qpad, n, s->x, s->E, 0, true);
    if (L->moe.n_expert) {
        cm_ffn(L->moe, s->moe, s->x, s->E, s->m->hp.rms_eps, n, s->pdl, st);
        return;
    }
    ck_rmsnorm_rows(s->x, NULL, L->ffn_norm, s->m->hp.rms_eps, s->E, n, s->xh, s->Epad, st);
    gemm(s, L->wg, s->xh, s->Epad, n, s->g, s->F, 0, false);
    gemm(s, L->wu, s->xh, s->Epad, n, s->u, s->F, 0, false);
    ck_swiglu_rows(s->g, s->u, s->F, n, s->hh, s->Fpad, st);
    gemm(s, L->wd, s->hh, s->Fpad, n, s->x, s->E, 0, true);
}

/* The most split-K partials (ks * rows * out floats) any GEMM of n rows asks for: the layers' matrices at n. */
static size_t gemm_work_at(const cuda_state *s, int n) {
    size_t most = 0;
    for (int il = 0; il < s->m->hp.n_layer; il++) {
        const cu_layer *L = &s->layers[il];
        const dev_weight *ws[] = {&L->wqkv, &L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            if (ws[i]->out <= 0) continue;
            const int ks = ck_gemm_splits(*ws[i], n, s->n_sm);
            const size_t f = ks > 1 ? (size_t)ks * n * ws[i]->out : 0;
            most = f > most ? f : most;
        }
    }
    return most;
}

/* Floats of split-K partials for every GEMM a call can run: n rows for every n up to max_batch (prefill and
 * mixed steps; the decode buckets through the GEMMs hold at most max_step <= max_batch rows). */
static size_t gemm_work_floats(const cuda_state *s) {
    size_t most = 0;
    for (int n = 1; n <= s->cfg.max_batch; n++) {
        const size_t f = gemm_work_at(s, n);
        most = f > most ? f : most;
    }
    return most;
}

/* The decode step of bucket b (R > mv_rows rows, each of its own sequence; padding rows have position -1 and
 * append nothing, their outputs are never read) through the GEMMs, then the outputs of all R rows. */
static void launch_step(cuda_state *s, int b) {
    const kiln_hparams *hp = &s->m->hp;
    cudaStream_t st = s->stream;
    const int R = s->bucket[b];
    ck_embed(s->tok_embd, step_ids(s), s->x, R, st);
    for (int il = 0; il < hp->n_layer; il++) {
        const cu_layer *L = &s->layers[il];
        qkv_rows(s, L, R);
        if (s->qkv_post) {
            ck_qkv_post(qkv_post(s, il, 0, 0, true), R, st);
        } else {
            const size_t kv_off = kv_offset(s, 0, il);
            ck_rope_store(s->qkv, s->NQKV, R, 0, step_pos(s), step_seq(s), s->seq_stride, s->Q, s->KV, hp->head_dim,
                          hp->n_rot, s->rope_freq, s->kc + kv_off, s->vc + kv_off, s->KV, st);
        }
        ck_attn_decode(step_attn(s, il, b), R, st);
        o_ffn_rows(s, L, R);
    }
    launch_outputs(s, R, 0, NULL);
}

/* Q/K/V post-processing (RoPE, and what the blocks ask for) and attention of rows [r0, r0 + n) of layer il,
 * which are consecutive positions pos0.. of sequence s->cur_seq. */
static void launch_run_attention(cuda_state *s, int il, int r0, int n, int pos0) {
    const kiln_hparams *hp = &s->m->hp;
    cudaStream_t st = s->stream;
    const size_t kv_off = kv_offset(s, s->cur_seq, il);
    float *qkv = s->qkv + (size_t)r0 * s->NQKV;
    if (s->qkv_post)
        ck_qkv_post(qkv_post(s, il, r0, pos0, false), n, st);
    else
        ck_rope_store(qkv, s->NQKV, n, pos0, NULL, NULL, 0, s->Q, s->KV, hp->head_dim, hp->n_rot, s->rope_freq,
                      s->kc + kv_off, s->vc + kv_off, s->KV, st);
    attn_args at;
    memset(&at, 0, sizeof at);
    at.q = qkv;
    at.q_stride = s->NQKV;
    at.k_cache = s->kc + kv_off;
    at.v_cache = s->vc + kv_off;
    at.kv_dim = s->KV, at.n_head = hp->n_head, at.n_head_kv = hp->n_head_kv, at.head_dim = hp->head_dim;
    at.pos0 = pos0;
    at.out = s->atth + (size_t)r0 * s->Qpad;
    at.out_stride = s->Qpad;
    at.scale = 1.0f / sqrtf((float)hp->head_dim);
    ck_attention(at, n, st);
}

/* n rows (ids already in s->ids) of any sequences through every layer: the matrix products over all rows at
 * once (each weight read once), RoPE, the K/V append and attention per run of one sequence's rows. */
static void launch_rows(cuda_state *s, const kiln_backend_row *rows, int n) {
    const kiln_hparams *hp = &s->m->hp;
    ck_embed(s->tok_embd, s->ids, s->x, n, s->stream);
    for (int il = 0; il < hp->n_layer; il++) {
        const cu_layer *L = &s->layers[il];
        qkv_rows(s, L, n);
        for (int r0 = 0, r1; r0 < n; r0 = r1) {
            for (r1 = r0 + 1; r1 < n && rows[r1].seq == rows[r0].seq; r1++) {}
            s->cur_seq = rows[r0].seq;
            launch_run_attention(s, il, r0, r1 - r0, rows[r0].pos);
        }
        o_ffn_rows(s, L, n);
    }
}

/* ------------------------------------------------------------------ backend ops */

static void cuda_close(void *state) {
    cuda_state *s = (cuda_state *)state;
    if (!s) return;
    if (s->stream) cudaStreamSynchronize(s->stream);
    for (int b = 0; b < s->n_buckets; b++) {
        if (s->gexecs[b]) cudaGraphExecDestroy(s->gexecs[b]);
        if (s->graphs[b]) cudaGraphDestroy(s->graphs[b]);
    }
    kiln_free(s->seen);
    for (int i = 0; i < 2; i++)
        if (s->stage_ev[i]) cudaEventDestroy(s->stage_ev[i]);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (s->arena) cudaFree(s->arena);
    if (s->pinned) cudaFreeHost(s->pinned);
    kiln_free(s->conv_tmp);
    kiln_free(s->layers);
    kiln_free(s);
}

static kiln_status check_model(const kiln_model *m, const kiln_backend_config *cfg) {
    const kiln_hparams *hp = &m->hp;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv || hp->n_head / hp->n_head_kv > CK_ATT_MAX_G)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda: %d query heads over %d KV heads (at most %d per group)", hp->n_head,
                         hp->n_head_kv, CK_ATT_MAX_G);
    if (hp->head_dim > 256 || hp->head_dim % 2 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "cuda: head_dim %d / n_rot %d (need even, head_dim <= 256)", hp->head_dim,
                         hp->n_rot);
    if (cfg->max_batch < 1 || cfg->n_ctx < 2) return kiln_fail(KILN_ERR_INVALID_ARG, "cuda: n_ctx / max_batch too small");
    return KILN_OK;
}

/* Counts the nodes and programmatic (PDL) edges of graph g into the session's facts. */
static void graph_facts(cuda_state *s, cudaGraph_t g) {
    size_t n_nodes = 0, n_edges = 0;
    cudaGraphGetNodes(g, NULL, &n_nodes);
    s->graph_nodes = (int)n_nodes;
    s->graph_pdl_edges = 0;
    if (cudaGraphGetEdges(g, NULL, NULL, NULL, &n_edges) == cudaSuccess && n_edges) {
        cudaGraphNode_t *ends = (cudaGraphNode_t *)kiln_malloc(2 * n_edges * sizeof(cudaGraphNode_t));
        cudaGraphEdgeData *ed = (cudaGraphEdgeData *)kiln_malloc(n_edges * sizeof(cudaGraphEdgeData));
        if (ends && ed && cudaGraphGetEdges(g, ends, ends + n_edges, ed, &n_edges) == cudaSuccess)
            for (size_t i = 0; i < n_edges; i++) s->graph_pdl_edges += ed[i].type == cudaGraphDependencyTypeProgrammatic;
        kiln_free(ends);
        kiln_free(ed);
    }
}

/* The kernels of a decode step of bucket b, after the copy of its rows and their sampling specs to the device. */
static void launch_bucket(cuda_state *s, int b) {
    cudaMemcpyAsync(s->rows, s->h_rows, 3 * (size_t)s->max_step * sizeof(int), cudaMemcpyHostToDevice, s->stream);
    cudaMemcpyAsync(s->d_spec, s->h_spec, (size_t)s->bucket[b] * sizeof(kiln_sample_spec), cudaMemcpyHostToDevice,
                    s->stream);
    if (s->bucket[b] <= s->mv_rows) launch_decode(s, b);
    else launch_step(s, b);
}

/* Captures the decode step of bucket b (every sequence: rows are read from device memory) into graphs[b]. */
static kiln_status capture_graph(cuda_state *s, int b) {
    CU_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal), "graph capture begin");
    launch_bucket(s, b);
    cudaError_t e = cudaStreamEndCapture(s->stream, &s->graphs[b]);
    kiln_count_graph_capture();
    if (e != cudaSuccess) return cuda_fail(e, "graph capture");
    if (b == 0) graph_facts(s, s->graphs[b]);
    CU_TRY(cudaGraphInstantiate(&s->gexecs[b], s->graphs[b], 0), "graph instantiate");
    kiln_count_graph_capture();
    CU_TRY(cudaGraphUpload(s->gexecs[b], s->stream), "graph upload");
    return KILN_OK;
}

/* Whether every matvec of a decode step runs on the tensor cores when it has several rows (k_matvec_mma): a
 * dense model whose layer weights and output all have ck_mv_mma types. */
static bool steps_on_mma(const kiln_model *m) {
    if (m->hp.n_expert) return false;
    if (!ck_mv_mma((int)m->output.type)) return false;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const kiln_layer *L = &m->layers[il];
        const kiln_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (!ck_mv_mma((int)w[i]->type)) return false;
    }
    return true;
}

/* The bucket sizes: 1, 2, ..., mv_rows (the matvec path, no padding), then 2^k above it while below max_step,
 * then max_step; their attention splits. mv_rows: the most rows whose matvec inputs fit in shared memory. */
static void plan_buckets(cuda_state *s, size_t smem_optin) {
    const kiln_hparams *hp = &s->m->hp;
    int widest = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
    widest = widest > s->Q ? widest : s->Q;
    s->steps_mma = steps_on_mma(s->m);
    if (s->steps_mma) {
        s->mv_rows = CK_MV_MAX_ROWS;
        while (s->mv_rows > 1 && ck_matvec_mma_smem(widest, s->mv_rows) > smem_optin) s->mv_rows--;
    } else {
        s->mv_rows = ck_matvec_max_rows(widest, smem_optin);
        s->mv_rows = s->mv_rows < 1 ? 1 : s->mv_rows > STEP_MV_ROWS ? STEP_MV_ROWS : s->mv_rows;
    }
    s->n_buckets = 0;
    for (int r = 1; s->n_buckets < CK_MAX_BUCKETS;) {
        const int R = r < s->max_step ? r : s->max_step;
        s->bucket[s->n_buckets] = R;
        s->att_split[s->n_buckets] = ck_attn_splits(R, hp->n_head, hp->n_head_kv, s->cfg.n_ctx, s->n_sm);
        s->n_buckets++;
        if (R == s->max_step) break;
        if (r < s->mv_rows) {
            r++;
        } else { /* the next power of two above r */
            int p = 1;
            while (p <= r) p *= 2;
            r = p;
        }
    }
}

static kiln_status cuda_forward(void *state, const kiln_backend_batch *b);

/* A warm prefill of n rows of sequence 0 (positions 0..n-1, no outputs) when the session's batch and context hold
 * them (else no call can have n rows): a MoE model's grouped expert path (cuda_moe.cu: calls of at least
 * moe.group_rows rows), and the GEMM tiles of 17-64 and of more rows, which the 2-row prefill does not reach. */
static kiln_status warm_prefill(cuda_state *s, int n) {
    const int V = s->m->hp.n_vocab;
    if (n <= 0 || n > s->cfg.max_batch || n > s->cfg.n_ctx) return KILN_OK;
    kiln_backend_row *rows = (kiln_backend_row *)kiln_calloc((size_t)n, sizeof *rows);
    if (!rows) return kiln_fail(KILN_ERR_NOMEM, "cuda: out of memory");
    for (int i = 0; i < n; i++) rows[i] = (kiln_backend_row){0, i, i % V, KILN_BK_OUT_NONE, NULL};
    int32_t next = 0;
    const kiln_backend_batch b = {rows, n, 0, s->conv_tmp, &next};
    const kiln_status st = cuda_forward(s, &b);
    kiln_free(rows);
    return st;
}

/* The open's warm pass through every path: a prefill of 2 positions of sequence 0 (its outputs through the
 * eager output stage: both rows when max_out allows), a MoE model's grouped prefill, prefills of 64 and 129
 * rows (as far as max_batch and n_ctx allow), each bucket's graph once (rows of sequences 0..R-1, sequence 0 at
 * position 2), a one-row step with logits (into conv_tmp, n_vocab floats or more), then the
 * device sampler in a one-row step and (top-k) in a 2-row prefill. */
static kiln_status warm_paths(cuda_state *s) {
    const int V = s->m->hp.n_vocab, n = s->cfg.max_batch >= 2 ? 2 : 1, last = s->cfg.n_ctx - 1;
    kiln_backend_row rows[2] = {{0, 0, 0, KILN_BK_OUT_ARGMAX}, {0, 1, 1 % V, KILN_BK_OUT_ARGMAX}};
    if (n == 2 && s->cfg.max_out < 2) rows[0].out = KILN_BK_OUT_NONE;
    int32_t next[2] = {0, 0};
    kiln_backend_batch b = {rows, n, 0, s->conv_tmp, next};
    for (int i = 0; i < n; i++) b.n_out += rows[i].out != KILN_BK_OUT_NONE;
    KILN_TRY(cuda_forward(s, &b));
    KILN_TRY(warm_prefill(s, s->moe.group_rows));
    const int most = s->cfg.max_batch < s->cfg.n_ctx ? s->cfg.max_batch : s->cfg.n_ctx;
    KILN_TRY(warm_prefill(s, most < 64 ? most : 64));                    /* the 64-row tiles (17-64 rows) */
    if (most > 64) KILN_TRY(warm_prefill(s, most < 129 ? most : 129)); /* the 128 x 128 tiles, two row tiles */
    const int M = s->max_step;
    for (int bi = 0; bi < s->n_buckets; bi++) {
        for (int i = 0; i < s->bucket[bi]; i++) s->h_rows[i] = i % V, s->h_rows[M + i] = i, s->h_rows[2 * M + i] = 0;
        s->h_rows[2 * M] = n < last ? n : last;
        CU_TRY(cudaGraphLaunch(s->gexecs[bi], s->stream), "graph launch");
        CU_TRY(cudaStreamSynchronize(s->stream), "warm pass");
    }
    const kiln_backend_row one = {0, n + 1 < last ? n + 1 : last, 0, KILN_BK_OUT_LOGITS};
    b = (kiln_backend_batch){&one, 1, 1, s->conv_tmp, next};
    KILN_TRY(cuda_forward(s, &b));
    /* the device sampler: penalties, top-k off with top-p and min-p, through a graph; top-k 40 eagerly */
    kiln_sample_spec sp; /* on the stack: two sessions may open at once */
    memset(&sp, 0, sizeof sp);
    sp.mode = KILN_SPEC_SAMPLE, sp.temperature = 0.8f, sp.top_p = 0.95f, sp.min_p = 0.05f;
    sp.repeat = 1.1f, sp.presence = 0.5f, sp.frequency = 0.5f, sp.n_pen = 1, sp.pen_count[0] = 1;
    sp.u = 0.5;
    const kiln_backend_row dec3 = {0, n < last ? n : last, 0, KILN_BK_OUT_SAMPLE, &sp};
    b = (kiln_backend_batch){&dec3, 1, 1, NULL, next};
    KILN_TRY(cuda_forward(s, &b));
    if (n == 2 && s->cfg.max_out >= 2) {
        const kiln_backend_row two[2] = {{0, 0, 0, KILN_BK_OUT_SAMPLE, &sp}, {0, 1, 1 % V, KILN_BK_OUT_ARGMAX, NULL}};
        sp.top_k = 40;
        b = (kiln_backend_batch){two, 2, 2, NULL, next};
        KILN_TRY(cuda_forward(s, &b));
    }
    return KILN_OK;
}

static kiln_status cuda_open(const kiln_model *m, const kiln_backend_config *cfg, kiln_phases *ph, void **out) {
    *out = NULL;
    KILN_TRY(check_model(m, cfg));
    kiln_cuda_device_info di;
    uint64_t t0 = kiln_now_ns();
    kiln_cuda_probe(&di);
    if (!di.present) return kiln_fail(KILN_ERR_DEVICE, "cuda: %s", di.reason);
    if (di.unsupported)
        return kiln_fail(KILN_ERR_DEVICE, "cuda: %s (sm_%d%d) is older than every arch kiln was built for (%s)", di.name,
                         di.cc_major, di.cc_minor, kiln_cuda_archs_built());
    cuda_state *s = (cuda_state *)kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "cuda: out of memory");
    s->m = m;
    s->cfg = *cfg;
    s->use_graph = !cfg->cuda_no_graph;
    s->n_sm = di.n_sm;
    s->pdl = !cfg->cuda_no_pdl && di.cc_major >= 9;
    ck_set_pdl(s->pdl);
    kiln_status st = KILN_OK;
#define OPEN_TRY(expr)              \
    do {                            \
        st = (expr);                \
        if (st != KILN_OK) goto fail; \
    } while (0)
#define OPEN_CU(expr, what) OPEN_TRY(((expr) == cudaSuccess) ? KILN_OK : cuda_fail(cudaGetLastError(), what))
    {
        cudaError_t e = cudaSetDevice(0);
        if (e == cudaSuccess) e = cudaFree(0); /* creates the context now */
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->stage_ev[0], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->stage_ev[1], cudaEventDisableTiming);
        if (e != cudaSuccess) OPEN_TRY(cuda_fail(e, "context"));
    }
    kiln_phases_add(ph, "open.cuda_init", kiln_now_ns() - t0);

    /* ---- arena */
    t0 = kiln_now_ns();
    {
        const kiln_hparams *hp = &m->hp;
        s->E = hp->n_embd, s->Q = hp->n_head * hp->head_dim, s->KV = hp->n_head_kv * hp->head_dim, s->F = hp->n_ff;
        s->qkv_post = hp->rope_neox || hp->has_qkv_bias || hp->has_qk_norm;
        s->V = hp->n_vocab, s->NQKV = s->Q + 2 * s->KV;
        s->Epad = (int)align_up((size_t)s->E, 32), s->Qpad = (int)align_up((size_t)s->Q, 32);
        s->Fpad = (int)align_up((size_t)s->F, 32);
        s->seq_stride = (long long)hp->n_layer * cfg->n_ctx * s->KV;
        s->max_step = cfg->n_seq < cfg->max_batch ? cfg->n_seq : cfg->max_batch;
        s->max_rows_out = s->max_step > cfg->max_out ? s->max_step : cfg->max_out;
        int optin = 0;
        if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) != cudaSuccess) optin = 48 * 1024;
        plan_buckets(s, (size_t)optin);
        s->max_mv_blocks = s->n_sm * 4;
        s->layers = (cu_layer *)kiln_calloc((size_t)hp->n_layer, sizeof(cu_layer));
        s->seen = (uint8_t *)kiln_calloc((size_t)cfg->n_seq, 1);
        int widest_row = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
        widest_row = hp->n_ff_exp > widest_row ? hp->n_ff_exp : widest_row;
        s->conv_tmp = (float *)kiln_malloc(sizeof(float) * (size_t)widest_row * 2 + sizeof(float) * (size_t)hp->n_vocab);
        if (!s->layers || !s->conv_tmp || !s->seen) OPEN_TRY(kiln_fail(KILN_ERR_NOMEM, "cuda: out of memory"));
        size_t off = 0;
        OPEN_TRY(plan_weights(s, NULL, &off));
        s->weight_bytes = off;
        s->scratch_off = align_up(off, 256);
        size_t soff = 0;
        plan_scratch(s, NULL, &soff);
        if (soff < 2 * STAGE_BYTES) soff = 2 * STAGE_BYTES;
        s->arena_bytes = s->scratch_off + align_up(soff, 256);
        cudaError_t e = cudaMalloc((void **)&s->arena, s->arena_bytes);
        kiln_count_device_alloc();
        if (e != cudaSuccess)
            OPEN_TRY(kiln_fail(KILN_ERR_DEVICE, "cuda: cannot allocate the %.1f MiB arena (n_ctx %d): %s",
                               s->arena_bytes / 1048576.0, cfg->n_ctx, cudaGetErrorString(e)));
        off = 0;
        s->n_converted = 0;
        OPEN_TRY(plan_weights(s, s->arena, &off));
        if (s->n_converted)
            KILN_WARN("cuda: %d weight matrices converted to F16 at open (first: %s): no kernel reads their type, "
                      "so they take 2 bytes a value on the device", s->n_converted, s->converted);
        soff = 0;
        plan_scratch(s, s->arena + s->scratch_off, &soff);
        /* pinned: the staging halves, then a sampling spec per output row, the rows of a decode step, the ids
         * and output rows of an eager call, the id of every output row */
        const size_t n_ints = 3 * (size_t)s->max_step + (size_t)cfg->max_batch + 2 * (size_t)s->max_rows_out;
        const size_t spec_bytes = (size_t)s->max_rows_out * sizeof(kiln_sample_spec);
        const size_t pinned_bytes = 2 * STAGE_BYTES + spec_bytes + n_ints * sizeof(int);
        e = cudaHostAlloc((void **)&s->pinned, pinned_bytes, cudaHostAllocDefault);
        kiln_count_device_alloc();
        if (e != cudaSuccess) OPEN_TRY(cuda_fail(e, "pinned staging buffer"));
        memset(s->pinned + 2 * STAGE_BYTES, 0, spec_bytes + n_ints * sizeof(int)); /* the staging halves are written before use */
        s->h_stage[0] = s->pinned;
        s->h_stage[1] = s->pinned + STAGE_BYTES;
        s->h_spec = (kiln_sample_spec *)(s->pinned + 2 * STAGE_BYTES); /* 2 * STAGE_BYTES: aligned */
        s->h_rows = (int *)(s->pinned + 2 * STAGE_BYTES + spec_bytes);
        s->h_ids = s->h_rows + 3 * s->max_step;
        s->h_argmax = s->h_ids + cfg->max_batch + s->max_rows_out;
        OPEN_CU(cudaMemsetAsync(s->arena, 0, s->arena_bytes, s->stream), "arena memset");
        OPEN_CU(cudaEventRecord(s->stage_ev[0], s->stream), "event");
        OPEN_CU(cudaEventRecord(s->stage_ev[1], s->stream), "event");
    }
    kiln_phases_add(ph, "open.arena", kiln_now_ns() - t0);

    /* ---- weights */
    t0 = kiln_now_ns();
    {
        const kiln_hparams *hp = &m->hp;
        OPEN_TRY(upload_matrix(s, &m->tok_embd, &s->tok_embd, 0));
        if (m->output.data != m->tok_embd.data) OPEN_TRY(upload_matrix(s, &m->output, &s->output, 0));
        OPEN_TRY(upload_vector(s, &m->output_norm, s->output_norm));
        for (int il = 0; il < hp->n_layer; il++) {
            const kiln_layer *L = &m->layers[il];
            cu_layer *D = &s->layers[il];
            if (D->qkv_fused) {
                OPEN_TRY(upload_matrix(s, &L->wq, &D->wqkv, 0));
                OPEN_TRY(upload_matrix(s, &L->wk, &D->wqkv, s->Q));
                OPEN_TRY(upload_matrix(s, &L->wv, &D->wqkv, s->Q + s->KV));
            } else {
                OPEN_TRY(upload_matrix(s, &L->wq, &D->wq, 0));
                OPEN_TRY(upload_matrix(s, &L->wk, &D->wk, 0));
                OPEN_TRY(upload_matrix(s, &L->wv, &D->wv, 0));
            }
            OPEN_TRY(upload_matrix(s, &L->wo, &D->wo, 0));
            kiln_weight wg, wu, wd;
            ffn_matrices(L, &wg, &wu, &wd);
            OPEN_TRY(upload_matrix(s, &wg, &D->wg, 0));
            OPEN_TRY(upload_matrix(s, &wu, &D->wu, 0));
            OPEN_TRY(upload_matrix(s, &wd, &D->wd, 0));
            if (D->moe.n_expert) OPEN_TRY(upload_matrix(s, &L->ffn_gate_inp, &D->moe.router, 0));
            OPEN_TRY(upload_vector(s, &L->attn_norm, D->attn_norm));
            OPEN_TRY(upload_vector(s, &L->ffn_norm, D->ffn_norm));
            if (D->bqkv) {
                OPEN_TRY(upload_vector(s, &L->bq, D->bqkv));
                OPEN_TRY(upload_vector(s, &L->bk, D->bqkv + s->Q));
                OPEN_TRY(upload_vector(s, &L->bv, D->bqkv + s->Q + s->KV));
            }
            if (D->q_norm) OPEN_TRY(upload_vector(s, &L->q_norm, D->q_norm));
            if (D->k_norm) OPEN_TRY(upload_vector(s, &L->k_norm, D->k_norm));
        }
        /* the staging area overlaps the scratch: clear it, then the RoPE frequencies (as the CPU computes them),
         * with the model's frequency divisors (rope_freqs) and linear scaling folded in: every RoPE site
         * (prefill, decode graph) computes theta = pos * rope_freq[i] */
        OPEN_CU(cudaMemsetAsync(s->arena + s->scratch_off, 0, s->arena_bytes - s->scratch_off, s->stream), "memset");
        int i;
        OPEN_TRY(stage_next(s, &i));
        float *fr = (float *)s->h_stage[i];
        const float theta_scale = powf(hp->rope_base, -2.0f / (float)hp->n_rot);
        float f = 1.0f;
        const float *ff = (const float *)m->rope_freqs.data;
        for (int k = 0; k < hp->n_rot / 2; k++, f *= theta_scale) fr[k] = hp->rope_freq_scale * (f / (ff ? ff[k] : 1.0f));
        OPEN_CU(cudaMemcpyAsync(s->rope_freq, fr, (size_t)(hp->n_rot / 2) * 4, cudaMemcpyHostToDevice, s->stream), "upload");
        OPEN_CU(cudaStreamSynchronize(s->stream), "upload");
        OPEN_CU(cudaGetLastError(), "upload");
        const uint64_t dt = kiln_now_ns() - t0;
        s->upload_gbps = dt ? (double)s->file_weight_bytes / (double)dt : 0.0;
        kiln_phases_add(ph, "open.upload", dt);
    }

    /* ---- kernels: load every one now, and raise the shared-memory limit where a matvec needs it */
    t0 = kiln_now_ns();
    {
        s->n_kernels = ck_kernel_count();
        for (int i = 0; i < s->n_kernels; i++) {
            cudaFuncAttributes fa;
            cudaError_t e = cudaFuncGetAttributes(&fa, ck_kernel_at(i));
            kiln_count_module_load();
            if (e != cudaSuccess) OPEN_TRY(cuda_fail(e, ck_kernel_name(i)));
        }
        for (int i = 0; i < cm_kernel_count(); i++, s->n_kernels++) { /* the MoE kernels (cuda_moe.cu) */
            cudaFuncAttributes fa;
            cudaError_t e = cudaFuncGetAttributes(&fa, cm_kernel_at(i));
            kiln_count_module_load();
            if (e != cudaSuccess) OPEN_TRY(cuda_fail(e, cm_kernel_name(i)));
        }
        OPEN_CU(cm_setup(cm_dims(m)), "MoE kernels' shared memory");
        {
            cudaFuncAttributes fa;
            cudaError_t e = cudaFuncGetAttributes(&fa, ck_sample_kernel());
            kiln_count_module_load();
            if (e != cudaSuccess) OPEN_TRY(cuda_fail(e, "k_sample"));
            s->n_kernels++;
        }
        const int widest = m->hp.n_ff > m->hp.n_embd ? m->hp.n_ff : m->hp.n_embd;
        const int in_max = widest > s->Q ? widest : s->Q;
        size_t smem = ck_matvec_smem_rows(in_max, s->steps_mma ? 1 : s->mv_rows);
        if (s->steps_mma && ck_matvec_mma_smem(in_max, s->mv_rows) > smem) smem = ck_matvec_mma_smem(in_max, s->mv_rows);
        if (smem > 48 * 1024) OPEN_CU(ck_set_matvec_smem(smem), "matvec shared memory");
        snprintf(s->decode_path, sizeof s->decode_path, "kernel graph (%s)", s->pdl ? "PDL" : "no PDL");
    }
    kiln_phases_add(ph, "open.kernels", kiln_now_ns() - t0);

    /* ---- the decode graphs: one per bucket */
    t0 = kiln_now_ns();
    for (int b = 0; b < s->n_buckets; b++) OPEN_TRY(capture_graph(s, b));
    kiln_phases_add(ph, "open.graphs", kiln_now_ns() - t0);

    /* ---- device warm pass: every path once (a prefill with its outputs, each bucket's graph with logits, a
     * one-row step with the argmax), then the cache is forgotten */
    t0 = kiln_now_ns();
    OPEN_TRY(warm_paths(s));
    kiln_phases_add(ph, "open.cuda_warm", kiln_now_ns() - t0);
    *out = s;
    return KILN_OK;
fail:
    cuda_close(s);
    return st;
#undef OPEN_TRY
#undef OPEN_CU
}

/* Puts row r's sampling spec (or mode NONE) into h_spec[k]. */
static void stage_spec(cuda_state *s, int k, const kiln_backend_row *r) {
    if (!r || r->out != KILN_BK_OUT_SAMPLE) {
        s->h_spec[k].mode = KILN_SPEC_NONE;
        return;
    }
    /* the fields and the penalty entries in use only (the device reads no further): 2 KiB a row otherwise */
    const kiln_sample_spec *sp = r->spec;
    kiln_sample_spec *d = &s->h_spec[k];
    memcpy(d, sp, offsetof(kiln_sample_spec, pen_id));
    memcpy(d->pen_id, sp->pen_id, (size_t)sp->n_pen * sizeof sp->pen_id[0]);
    memcpy(d->pen_count, sp->pen_count, (size_t)sp->n_pen * sizeof sp->pen_count[0]);
}

/* Whether the rows are a decode step: at most max_step rows, each of its own sequence. */
static bool is_step(cuda_state *s, const kiln_backend_batch *b) {
    if (b->n > s->max_step) return false;
    bool distinct = true;
    for (int i = 0; i < b->n; i++) {
        distinct = distinct && !s->seen[b->rows[i].seq];
        s->seen[b->rows[i].seq] = 1;
    }
    for (int i = 0; i < b->n; i++) s->seen[b->rows[i].seq] = 0;
    return distinct;
}

/* Copies the logits of the output rows that ask for them: output k's (device row src0 + k, or row of the
 * k-th output row for a step) to b->logits + k * V, consecutive ones in one copy; then waits for the stream
 * and takes each output's argmax from h_argmax (same indexing). */
static kiln_status finish_outputs(cuda_state *s, const kiln_backend_batch *b, bool step) {
    const size_t V = (size_t)s->V;
    int k = 0, run_k = -1, run_src = -1, run_n = 0;
    for (int i = 0; i <= b->n; i++) {
        const bool want = i < b->n && b->rows[i].out == KILN_BK_OUT_LOGITS;
        const int src = step ? i : k;
        if (run_n && (!want || src != run_src + run_n || k != run_k + run_n)) {
            cudaMemcpyAsync(b->logits + (size_t)run_k * V, s->logits + (size_t)run_src * V, run_n * V * sizeof(float),
                            cudaMemcpyDeviceToHost, s->stream);
            run_n = 0;
        }
        if (want) {
            if (!run_n) run_k = k, run_src = src;
            run_n++;
        }
        if (i < b->n && b->rows[i].out != KILN_BK_OUT_NONE) k++;
    }
    CU_TRY(cudaGetLastError(), "kernel launch");
    CU_TRY(cudaStreamSynchronize(s->stream), "forward");
    for (int i = 0, k2 = 0; i < b->n; i++)
        if (b->rows[i].out != KILN_BK_OUT_NONE) b->argmax[k2] = s->h_argmax[step ? i : k2], k2++;
    return KILN_OK;
}

/* A decode step: its rows (and padding rows up to the bucket: id 0, position -1) to pinned memory, the
 * bucket's graph (or its kernels, eagerly), then the outputs. */
static kiln_status forward_step(cuda_state *s, const kiln_backend_batch *b) {
    int bi = 0;
    while (s->bucket[bi] < b->n) bi++;
    const int M = s->max_step;
    for (int i = 0; i < s->bucket[bi]; i++) {
        const bool real = i < b->n;
        s->h_rows[i] = real ? b->rows[i].id : 0;
        s->h_rows[M + i] = real ? b->rows[i].seq : 0;
        s->h_rows[2 * M + i] = real ? b->rows[i].pos : -1;
        stage_spec(s, i, real ? &b->rows[i] : NULL);
    }
    if (s->use_graph) CU_TRY(cudaGraphLaunch(s->gexecs[bi], s->stream), "graph launch");
    else launch_bucket(s, bi);
    return finish_outputs(s, b, true);
}

/* Any other batch (a prefill, several rows of one sequence): the ids and the output rows in one copy (their
 * sampling specs in another), the rows through launch_rows, then the output stage over the output rows. */
static kiln_status forward_rows(cuda_state *s, const kiln_backend_batch *b) {
    const int n = b->n, B = s->cfg.max_batch;
    int n_out = 0, first = 0;
    for (int i = 0; i < n; i++) {
        s->h_ids[i] = b->rows[i].id;
        if (b->rows[i].out == KILN_BK_OUT_NONE) continue;
        if (!n_out) first = i;
        stage_spec(s, n_out, &b->rows[i]);
        s->h_ids[B + n_out++] = i;
    }
    cudaMemcpyAsync(s->ids, s->h_ids, (size_t)(B + n_out) * sizeof(int), cudaMemcpyHostToDevice, s->stream);
    if (n_out)
        cudaMemcpyAsync(s->d_spec, s->h_spec, (size_t)n_out * sizeof(kiln_sample_spec), cudaMemcpyHostToDevice, s->stream);
    launch_rows(s, b->rows, n);
    if (n_out) launch_outputs(s, n_out, first, s->ids + B);
    return finish_outputs(s, b, false);
}

/* A decode step (rows of distinct sequences) replays the graph of its bucket; any other batch runs eagerly
 * (kernels all loaded and exercised at open). */
static kiln_status cuda_forward(void *state, const kiln_backend_batch *b) {
    cuda_state *s = (cuda_state *)state;
    ck_set_pdl(s->pdl); /* eager launches take this session's setting */
    KILN_ASSERT(b->n >= 1 && b->n <= s->cfg.max_batch && b->n_out <= s->cfg.max_out);
    return is_step(s, b) ? forward_step(s, b) : forward_rows(s, b);
}

static void cuda_reset(void *state, int seq) {
    (void)state, (void)seq; /* positions restart; stale cache rows are never read */
}

static uint64_t cuda_kv_bytes_per_seq(const void *state) {
    const cuda_state *s = (const cuda_state *)state;
    return (uint64_t)s->m->hp.n_layer * (uint64_t)s->cfg.n_ctx * (uint64_t)s->KV * 2 * sizeof(__half);
}

static const kiln_backend_ops cuda_ops = {
    "cuda", true, cuda_open, cuda_forward, cuda_reset, cuda_kv_bytes_per_seq, cuda_close,
};

extern "C" const kiln_backend_ops *kiln_backend_cuda(void) { return &cuda_ops; }

extern "C" void kiln_cuda_set_use_graph(void *state, bool use_graph) { ((cuda_state *)state)->use_graph = use_graph; }

extern "C" void kiln_cuda_session_get_info(void *state, kiln_cuda_session_info *out) {
    const cuda_state *s = (const cuda_state *)state;
    memset(out, 0, sizeof *out);
    out->arena_bytes = s->arena_bytes;
    out->weight_bytes = s->weight_bytes;
    out->file_weight_bytes = s->file_weight_bytes;
    out->upload_gbps = s->upload_gbps;
    out->n_converted = s->n_converted;
    if (s->n_converted) snprintf(out->converted, sizeof out->converted, "%.200s x%d", s->converted, s->n_converted);
    out->n_kernels = s->n_kernels;
    out->graph_nodes = s->graph_nodes;
    out->graph_pdl_edges = s->graph_pdl_edges;
    snprintf(out->decode_path, sizeof out->decode_path, "%s", s->decode_path);
}
