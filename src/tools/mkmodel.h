/*
 * mkmodel.h — writes a GGUF of a real architecture's shape (llama, qwen2, qwen3, qwen3moe) with deterministic random
 * weights, for benchmarks on real model shapes. The shapes carry their published hyperparameters; the
 * vocabulary comes from another GGUF (every tokenizer.* key copied) or from a Hugging Face tokenizer.json
 * (tools/hf_vocab.h). Weights depend only on the seed and the tensor's name (never on the thread count or
 * the machine): each row has its own splitmix64 stream, and each value is an integer Irwin-Hall sum of
 * four 16-bit uniforms scaled to the wanted standard deviation (no libm, so every machine gives the same
 * bits). Matrices are normal with std 0.02 (embeddings and projections), norms are 1.0. Tensor data is
 * generated row by row on a thread pool straight into the writer's buffer, one tensor at a time.
 */
#ifndef KILN_TOOLS_MKMODEL_H
#define KILN_TOOLS_MKMODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln.h"

typedef struct kiln_mk_shape {
    const char *name;          /* "smollm2-135m" */
    const char *model_name;    /* general.name prefix, "SmolLM2-135M" */
    const char *arch;          /* "llama", "qwen2", "qwen3" or "qwen3moe" */
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff;
    int n_vocab;               /* published vocabulary size (the real one comes from --vocab) */
    int n_ctx;                 /* context_length */
    float rope_base, rms_eps;
    bool tied;                 /* no output.weight: the output reuses token_embd */
    bool qk_norm;              /* qwen3: blk.N.attn_q_norm / attn_k_norm */
    bool hidden;               /* a test-only shape, not listed */
    bool qkv_bias;             /* qwen2: blk.N.attn_{q,k,v}.bias */
    int n_expert, n_expert_used, n_ff_exp;  /* qwen3moe: experts per layer, used per token, each one's hidden size */
} kiln_mk_shape;

/* The table of shapes (hidden ones included); *n receives its length. */
const kiln_mk_shape *kiln_mk_shapes(int *n);
/* The shape called name, or NULL. */
const kiln_mk_shape *kiln_mk_find_shape(const char *name);

/* One planned tensor. */
typedef struct kiln_mk_tensor {
    char name[64];
    uint32_t type;        /* kiln_type */
    uint32_t n_dims;
    uint64_t ne[3];       /* ne[0] = row length, ne[1] rows, ne[2] matrices (the experts of a 3-D tensor; else 1) */
    uint64_t nbytes;
    float std;            /* 0: all ones (norms) */
    bool fallback;        /* the requested type did not fit the row length */
} kiln_mk_tensor;

typedef struct kiln_mk_plan {
    kiln_mk_shape shape;  /* with n_layer / n_vocab as planned */
    uint32_t type;        /* the requested type */
    int n_tensors;
    kiln_mk_tensor *tensors;
    uint64_t n_params, data_bytes;
} kiln_mk_plan;

/* Plans the tensors of shape with n_layer layers (0: the shape's own) and n_vocab tokens, weights of
 * type (2-D matrices and the 3-D experts; 1-D norms and biases, and the MoE router, stay F32, as
 * llama-quantize keeps ffn_gate_inp). The output matrix (or the tied token embedding) of a
 * quantized type other than Q8_0 is Q6_K, as llama-quantize does; a matrix whose row length is not a
 * multiple of the type's block falls back (Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0, Q2_K/Q3_K->Q4_0, other
 * 256-blocks->Q8_0; output-type fallback Q8_0). Fails with KILN_ERR_INVALID_ARG for a type that cannot be
 * a weight type. kiln_mk_plan_free releases it. */
kiln_status kiln_mk_plan_make(const kiln_mk_shape *shape, int n_layer, int n_vocab, uint32_t type, kiln_mk_plan *out);
void kiln_mk_plan_free(kiln_mk_plan *plan);

typedef struct kiln_mk_opts {
    const char *shape;        /* shape name */
    uint32_t type;            /* kiln_type of the matrices */
    const char *vocab;        /* a .gguf, a tokenizer.json or a directory holding one */
    uint64_t seed;
    const char *out;          /* output path (written through path.tmp and renamed) */
    int n_layer;              /* 0: the shape's; else a truncated/extended layer count (testing) */
    int n_threads;            /* 0: the number of online CPUs */
    FILE *progress;           /* notes and progress lines go here; NULL: silent */
    bool expert_codes;        /* 3-D expert tensors: random codes with fixed scales instead of quantized
                               * Gaussians (~50x faster; for speed measurements of the largest MoE shapes;
                               * q4_0, q8_0 and q4_K) */
} kiln_mk_opts;

typedef struct kiln_mk_result {
    int n_tensors;
    uint32_t n_vocab;
    uint64_t n_params, data_bytes, file_bytes;
    double seconds;
} kiln_mk_result;

/* Writes the model. Fails with KILN_ERR_INVALID_ARG (unknown shape, bad option), KILN_ERR_UNSUPPORTED
 * (a planned type without a quantizer yet), KILN_ERR_IO / KILN_ERR_FORMAT (vocabulary, output). Leaves no
 * output file behind on failure. result may be NULL. */
kiln_status kiln_mkmodel(const kiln_mk_opts *opts, kiln_mk_result *result);

/* The value generator, exposed for tests: fills y[0..n) with the values of row `row` of the tensor
 * called name (std 0: ones). */
void kiln_mk_fill_row(uint64_t seed, const char *name, uint64_t row, float std, float *y, int64_t n);

#endif
