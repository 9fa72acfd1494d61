/*
 * block.h — the block description: what a backend computes, layer by layer, with no architecture names.
 * The model layer turns an architecture (llama, qwen2, qwen3, ...) into a list of blocks; each block is an
 * attention part and a feed-forward part described by a few fields. A backend implements each kind of
 * block once; a new architecture adds fields or a kind here, never another copy of the forward pass.
 * Every pointer is into the kiln_model (views into the mapped file); the description owns only its array.
 */
#ifndef KILN_MODEL_BLOCK_H
#define KILN_MODEL_BLOCK_H

#include "model/model.h"

typedef enum kiln_rope_style {
    KILN_ROPE_NORM = 0,  /* llama: rotates adjacent pairs (2i, 2i+1) */
    KILN_ROPE_NEOX = 1,  /* qwen2/qwen3 (GPT-NeoX): rotates pairs (i, i + n_rot/2) */
} kiln_rope_style;

typedef enum kiln_ffn_kind {
    KILN_FFN_DENSE_SWIGLU = 0,  /* down(silu(gate x) * up x) */
    KILN_FFN_MOE = 1,           /* mixture of experts: each row's top-k experts by router softmax, their SwiGLU mixed */
} kiln_ffn_kind;

typedef struct kiln_block_attn {
    const kiln_weight *norm;                /* RMSNorm before attention (n_embd) */
    const kiln_weight *wq, *wk, *wv, *wo;
    const kiln_weight *bq, *bk, *bv;        /* NULL when the architecture has no Q/K/V biases */
    const kiln_weight *q_norm, *k_norm;     /* per-head RMSNorm of Q and K (head_dim), NULL when absent */
    kiln_rope_style rope;
    int n_rot;                              /* rotated dimensions of a head (even, <= head_dim) */
    float rope_base;
    const float *rope_freqs;                /* n_rot/2 divisors of the frequencies, NULL when absent */
    int n_head, n_head_kv, head_dim;
} kiln_block_attn;

typedef struct kiln_block_ffn {
    kiln_ffn_kind kind;
    const kiln_weight *norm;                /* RMSNorm before the feed-forward (n_embd) */
    const kiln_weight *gate, *up, *down;    /* dense SwiGLU; MoE: the experts', 3-D (ne[2] = n_expert) */
    int n_ff;                               /* dense: the hidden size; MoE: each expert's */
    /* MoE only: router [n_embd, n_expert] (logits of the experts), experts per row, and whether the
     * chosen experts' softmax weights are renormalized to sum to 1 */
    const kiln_weight *router;
    int n_expert, n_expert_used;
    bool norm_topk;
} kiln_block_ffn;

typedef struct kiln_block {
    kiln_block_attn attn;
    kiln_block_ffn ffn;
} kiln_block;

typedef struct kiln_blocks {
    int n_block, n_embd, n_vocab;
    float rms_eps;
    const kiln_weight *tok_embd, *output_norm, *output;
    kiln_block *blocks;                     /* n_block */
} kiln_blocks;

/* Builds the description of m (one allocation; call at open, never per token). */
kiln_status kiln_blocks_build(const kiln_model *m, kiln_blocks *out);
void kiln_blocks_free(kiln_blocks *b);

#endif
