/*
 * model.h — a llama-family model bound to the tensors of a mapped GGUF file.
 * The model knows its hyperparameters and where every weight lives; it knows nothing of backends.
 */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "base/timing.h"

#define KILN_MAX_LAYERS 512

/* A weight: a view into the map. ne[0] is the row length (input dim), ne[1] the number of rows, ne[2] the
 * number of matrices (a 3-D tensor holds one matrix per expert, each ne[1] rows, one after the other; else 1). */
typedef struct kiln_weight {
    const void *data;
    uint32_t type;      /* kiln_type */
    uint64_t ne[3];
    uint64_t nbytes;    /* all ne[2] matrices */
    char name[64];      /* the tensor's name, for messages */
    uint32_t interleave; /* 0: rows as in the file; else a backend's copy with rows in groups of this many
                          * (backend/cpu/cpu_repack.h), read only by that backend's kernels */
} kiln_weight;

/* Matrix i (< ne[2]) of a weight as a 2-D view: its rows start at i * ne[1] rows. */
static inline kiln_weight kiln_weight_matrix(const kiln_weight *w, uint64_t i) {
    kiln_weight v = *w;
    v.nbytes = w->nbytes / w->ne[2];
    v.data = (const uint8_t *)w->data + i * v.nbytes;
    v.ne[2] = 1;
    return v;
}

typedef struct kiln_layer {
    kiln_weight attn_norm, wq, wk, wv, wo;
    kiln_weight bq, bk, bv;           /* qwen2: biases (data NULL when absent) */
    kiln_weight q_norm, k_norm;       /* qwen3: per-head RMSNorm (data NULL when absent) */
    kiln_weight ffn_norm, w_gate, w_up, w_down;   /* dense feed-forward (data NULL in a MoE layer) */
    /* qwen3moe: the router [n_embd, n_expert] and the experts, 3-D: gate/up [n_embd, n_ff_exp, n_expert],
     * down [n_ff_exp, n_embd, n_expert] (data NULL in a dense layer) */
    kiln_weight ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
} kiln_layer;

typedef struct kiln_hparams {
    char arch[32];
    int n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, n_ff;
    int head_dim;       /* n_embd / n_head unless the file says otherwise */
    int n_rot;          /* rope.dimension_count */
    float rms_eps, rope_base;
    float rope_freq_scale;  /* linear RoPE scaling: positions times this (1/rope.scaling.factor; 1: none) */
    bool rope_neox;     /* false: llama's adjacent pairs; true: halves (qwen2/qwen3) */
    bool has_qkv_bias, has_qk_norm;
    /* mixture of experts (qwen3moe; all 0 / false for a dense model): experts per layer, experts each token
     * uses, each expert's hidden size, and whether the chosen experts' weights are renormalized to sum to 1 */
    int n_expert, n_expert_used, n_ff_exp;
    bool moe_norm_topk;
} kiln_hparams;

struct kiln_model {
    gguf_file *file;
    kiln_hparams hp;
    kiln_weight tok_embd, output_norm, output;
    /* rope_freqs.weight (Llama 3.1+): n_rot/2 F32 divisors of the RoPE frequencies, every one finite and > 0;
     * data NULL when absent (all 1). theta_i(pos) = rope_freq_scale * (pos * base^(-2i/n_rot) / rope_freqs[i]),
     * as ggml's rope with freq_factors computes it. */
    kiln_weight rope_freqs;
    bool tied_output;
    kiln_layer *layers;
    kiln_tokenizer *tok;
    kiln_phases phases;     /* open.map, open.parse, open.model, open.tokenizer */
    char name[128];
};

/* The tokenizer of a model (for the tokenizer layer's public wrappers). */
static inline const kiln_tokenizer *kiln_model_tokenizer(const kiln_model *m) { return m->tok; }

#endif
