/*
 * cuda_moe.cuh — the mixture-of-experts feed-forward (KILN_FFN_MOE of model/block.h) on the CUDA backend,
 * as llama.cpp computes it for qwen3moe: router logits = W_router RMSNorm(x); softmax over all experts; the
 * k = n_used most probable (ties: the lower id); their probabilities renormalized to sum to 1 (the sum clamped
 * below at 2^-14, as ggml does) when the block asks; x += sum over the k of weight * down(silu(gate xn) * up xn).
 * Everything happens on the device: the expert kernels read the chosen ids from device memory and index the
 * expert's rows, so the decode graph holds the whole step and only the chosen experts' weights are read.
 * Three kernels per layer, each over all rows of the call (grid.y = row): route (RMSNorm, router matvec, the
 * last block of a row does softmax / top-k / renormalization), gate_up (SwiGLU of the chosen experts), down
 * (the weighted sum of the chosen experts' down projections added to the residual). C++ (nvcc) only.
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
};

/* A 3-D expert tensor (ne[2] matrices of ne[1] rows) as one 2-D weight of ne[1] * ne[2] rows, for the upload. */
kiln_weight cm_flat(const kiln_weight *w);

/* The sizes of a model's MoE layers (n_expert 0: no MoE layer). */
struct moe_dims {
    int n_embd, n_expert, n_used, n_ff;
};
moe_dims cm_dims(const kiln_model *m);

/* Carves the scratch for max_rows rows of MoE layers of dims d from base at *off (256-aligned); with
 * base == NULL only sums. Nothing when d.n_expert is 0. */
void cm_plan_scratch(moe_scratch *s, moe_dims d, int max_rows, uint8_t *base, size_t *off);

/* Every MoE kernel, for the eager load at open; and the shared-memory limit raised where layers of dims d need
 * more than 48 KiB (call once at open, after the kernels are loaded; cudaErrorInvalidValue beyond the limits
 * of the kernels: 512 experts, 64 used). */
int cm_kernel_count(void);
const void *cm_kernel_at(int i);
const char *cm_kernel_name(int i);
cudaError_t cm_setup(moe_dims d);

/* x (n_rows, n_embd) += the MoE feed-forward of each row, with layer L's weights (n_rows <= s.max_rows).
 * Launches three kernels on st (capturable: no host synchronisation, nothing allocated), with programmatic
 * dependent launch when pdl (the session's setting). */
void cm_ffn(const moe_layer &L, const moe_scratch &s, float *x, int n_embd, float eps, int n_rows, bool pdl,
            cudaStream_t st);

#endif
