/*
 * cuda_moe.cuh — the mixture-of-experts feed-forward (KILN_FFN_MOE of model/block.h) on the CUDA backend,
 * as llama.cpp computes it for qwen3moe: router logits = W_router RMSNorm(x); softmax over all experts; the
 * k = n_used most probable (ties: the lower id); their probabilities renormalized to sum to 1 (the sum clamped
 * below at 2^-14, as ggml does) when the block asks; x += sum over the k of weight * down(silu(gate xn) * up xn).
 * Everything happens on the device: the expert kernels read the chosen ids from device memory and index the
 * expert's rows, so the decode graph holds the whole step and only the chosen experts' weights are read.
 * Two paths, the same math:
 *   per row (calls of few rows: decode steps): three kernels over all rows (grid.y = row): route (RMSNorm,
 *     router matvec, the last block of a row does softmax / top-k / renormalization), gate_up (SwiGLU of the
 *     chosen experts), down (the weighted sum of the chosen experts' down projections added to the residual);
 *     each row reads its own k experts' weights.
 *   grouped (calls of at least group_rows rows: prefill, large steps): route (also storing RMSNorm(x) as half),
 *     group (one block: per-expert counts, offsets, the (row, slot) entries in expert order and each entry's
 *     place in that list), the tensor-core GEMMs of cuda_gemm.cuh over each expert's rows (gate and up into
 *     (entries, n_ff), SwiGLU to half, down into (entries, n_embd)), combine (x += the weighted sum of each row's
 *     k entries, in slot order); each chosen expert's weights are read once per call.
 * C++ (nvcc) only.
 */
#ifndef KILN_CUDA_MOE_CUH
#define KILN_CUDA_MOE_CUH

#include "backend/cuda/cuda_kernels.cuh"

extern "C" {
#include "model/model.h"
}

/* The experts of one MoE layer on the device. gate and up: n_expert * n_ff rows of n_embd (expert e's rows
 * are [e * n_ff, (e + 1) * n_ff)), one device type; down: n_expert * n_embd rows of n_ff (expert e's rows
 * [e * n_embd, (e + 1) * n_embd)); router: n_expert rows of n_embd; norm_w: the ffn RMSNorm weight. */
struct moe_layer {
    dev_weight router, gate, up, down;
    const float *norm_w;
    int n_expert, n_used, n_ff;
    bool norm_topk;
};

/* Device scratch of the MoE feed-forward for up to max_rows rows (carved from the backend's arena). */
struct moe_scratch {
    int max_rows, max_expert, max_used, max_ff;
    float *xn;          /* (rows, n_embd) RMSNorm(x) * norm_w */
    float *probs;       /* (rows, n_expert) router logits, then their softmax */
    int *ids;           /* (rows, k) chosen experts, most probable first */
    float *wts;         /* (rows, k) their weights */
    float *h;           /* (rows, k, n_ff) silu(gate) * up of each chosen expert */
    unsigned *counter;  /* (rows) blocks of the route kernel done; zero between launches */
    int8_t *xq;         /* (rows, n_embd) xn's 8-bit levels (the per-row path, 8-bit input expert types) */
    float *xqm;         /* (rows, n_embd / 32) their blocks' (amax, level sum) */
    int8_t *hq;         /* (rows, k, fp) h's 8-bit levels, fp = n_ff rounded up to 16 (block-quantized down types) */
    float *hqm;         /* (rows, k, fp / 8) their 8-value blocks' (d, d * level sum) */
    /* the grouped path: calls of at least group_rows rows (0: never), at most group_max rows per launch
     * sequence (longer calls go in pieces of group_max rows); entries = rows * k */
    int group_rows, group_max, epad, fpad;
    __half *xh;         /* (group_max, epad) xn as half, zero-padded to epad (n_embd rounded up to 32) */
    int *offsets;       /* (n_expert + 1) expert e's entries are [offsets[e], offsets[e + 1]) of the list */
    int *list;          /* (entries) the row of each entry, experts in order, rows ascending within one */
    int *pos;           /* (entries) the list position of entry (row, slot), at row * k + slot */
    float *cu;          /* (entries, n_ff) up of each entry (gate goes to h) */
    __half *hh;         /* (entries, fpad) silu(gate) * up as half, zero-padded */
    float *y;           /* (entries, n_embd) the expert's down projection of each entry */
};

/* A 3-D expert tensor (ne[2] matrices of ne[1] rows) as one 2-D weight of ne[1] * ne[2] rows, for the upload. */
kiln_weight cm_flat(const kiln_weight *w);

/* The sizes of a model's MoE layers (n_expert 0: no MoE layer). */
struct moe_dims {
    int n_embd, n_expert, n_used, n_ff;
};
moe_dims cm_dims(const kiln_model *m);

/* The fewest rows of a call that take the grouped path by its cost: rows * k choices at least as many as the
 * experts (the per-row kernels read rows * k expert matrices, the grouped ones at most each expert once; from
 * there on the grouped path reads fewer bytes), and at least CM_GROUP_MIN_ROWS (decode steps of a few rows
 * keep the per-row kernels: fewer launches). */
#define CM_GROUP_MIN_ROWS 8
int cm_group_rows(moe_dims d);

/* Carves the scratch for max_rows rows of MoE layers of dims d from base at *off (256-aligned); with
 * base == NULL only sums. Nothing when d.n_expert is 0. group_rows: the grouped path for calls of at least
 * this many rows; -1: cm_group_rows(d); 0: never (nothing carved for it); never when above max_rows. */
void cm_plan_scratch(moe_scratch *s, moe_dims d, int max_rows, int group_rows, uint8_t *base, size_t *off);

/* Every MoE kernel, for the eager load at open; and the shared-memory limit raised where layers of dims d need
 * more than 48 KiB (call once at open, after the kernels are loaded; cudaErrorInvalidValue beyond the limits
 * of the kernels: 512 experts, 64 used). */
int cm_kernel_count(void);
const void *cm_kernel_at(int i);
const char *cm_kernel_name(int i);
cudaError_t cm_setup(moe_dims d);

/* x (n_rows, n_embd) += the MoE feed-forward of each row, with layer L's weights (n_rows <= s.max_rows):
 * the grouped path when n_rows >= s.group_rows > 0, else the per-row kernels. Launches on st only
 * (capturable: no host synchronisation, nothing allocated), with programmatic dependent launch when pdl (the
 * session's setting; the SwiGLU of the grouped path takes the thread's, ck_set_pdl). */
void cm_ffn(const moe_layer &L, const moe_scratch &s, float *x, int n_embd, float eps, int n_rows, bool pdl,
            cudaStream_t st);

/* The group kernel alone (for its test): ids (n_rows, k) of n_expert experts -> s.offsets, s.list, s.pos
 * (n_rows * k <= 65535, n_rows <= s.group_max). */
void cm_group(const moe_scratch &s, const int *ids, int n_rows, int k, int n_expert, bool pdl, cudaStream_t st);

#endif
