/*
 * cuda_api.h — what the rest of kiln (CLI, tests, benchmarks) may ask of the CUDA backend besides the
 * backend table: the archs built into the fatbinary, the GPU found, per-session facts (upload rate,
 * conversions), a switch between graph replay and eager launches, and single-kernel entry points that
 * the tests compare with scalar references. Declared only when kiln is built with CUDA (KILN_HAVE_CUDA).
 */
#ifndef KILN_CUDA_API_H
#define KILN_CUDA_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef KILN_HAVE_CUDA

typedef struct kiln_cuda_device_info {
    bool present;              /* a GPU was found and answered */
    char name[256];
    int cc_major, cc_minor;
    int n_sm;
    uint64_t mem_bytes;
    int driver_version, runtime_version;  /* e.g. 13000 */
    int sass_arch;             /* the built SASS arch this GPU runs (e.g. 90); 0 when none fits */
    bool would_jit;            /* no SASS fits: the driver would compile the embedded PTX */
    bool unsupported;          /* neither SASS nor PTX can run on it */
    char reason[256];          /* why present is false */
} kiln_cuda_device_info;

/* The archs compiled into the fatbinary, e.g. "sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 + compute_120 PTX". */
const char *kiln_cuda_archs_built(void);

/* Looks for a GPU (device 0). Never fails: out->present says whether one was found, out->reason why not.
 * When no CUDA driver library is installed it does not touch the CUDA runtime at all. */
void kiln_cuda_probe(kiln_cuda_device_info *out);

/* Per-session facts of an open CUDA backend state (the void *state of its ops). */
typedef struct kiln_cuda_session_info {
    uint64_t arena_bytes, weight_bytes, file_weight_bytes;
    double upload_gbps;        /* file bytes / upload time */
    int n_converted;           /* weights converted at open (types without a kernel) */
    char converted[256];       /* e.g. "q5_1->f16 x14" */
    int n_kernels;             /* kernels loaded at open */
    int graph_nodes;           /* nodes (kernels and copies) in the decode graph */
    int graph_pdl_edges;       /* its programmatic-dependent-launch edges */
    char decode_path[96];      /* e.g. "kernel graph (PDL)" */
} kiln_cuda_session_info;
void kiln_cuda_session_get_info(void *state, kiln_cuda_session_info *out);

/* (PDL is a session option: kiln_session_options.cuda_no_pdl;
 * for a backend opened directly, the same fields of kiln_backend_config.) */

/* Decode through the captured graph (default) or by launching the same kernels eagerly, for an open
 * state (the session option cuda_no_graph sets it at open). */
void kiln_cuda_set_use_graph(void *state, bool use_graph);

/* ---- single kernels for the tests (they allocate; never on a hot path) ---- */

/* y[r] = sum_k W[r][k] * xin[k], W given as GGUF rows of `type` (out rows of in values). With norm_w
 * non-NULL the input is RMSNorm(x) * norm_w (eps 1e-5) as in the decode path. */
kiln_status kiln_cuda_test_matvec(uint32_t type, const void *w, int in, int out, const float *x, const float *norm_w,
                                  float *y);
/* Y[t][r] = sum_k W[r][k] * X[t][k] for t < n_tok through the prefill path (X rounded to F16), its k range
 * split over ks blocks (1: not split). */
kiln_status kiln_cuda_test_gemm(uint32_t type, const void *w, int in, int out, const float *x, int n_tok, int ks,
                                float *y);
/* Causal attention of n_tok queries at positions pos0.. over keys 0..pos0+t (K, V: n_keys x n_head_kv*hd),
 * q: n_tok x n_head*hd, out like q, through the prefill kernel. */
kiln_status kiln_cuda_test_attention(const float *q, const float *k, const float *v, int n_head, int n_head_kv,
                                     int head_dim, int pos0, int n_tok, float *out);
/* The decode kernel over n_rows rows of one step: row r is the query q[r] (n_head*hd) at position pos[r] of
 * sequence seq[r], over keys 0..pos[r] of that sequence (K, V: n_seqs x n_ctx x n_head_kv*hd, n_seqs the
 * largest seq + 1); pos[r] < 0 is a padding row (output zeros). n_split splits (0: what the backend picks for
 * n_rows rows), output as float or (half_out) as half; the kernel runs twice (its counters must reset). */
kiln_status kiln_cuda_test_attention_rows(const float *q, const float *k, const float *v, int n_head, int n_head_kv,
                                          int head_dim, int n_ctx, int n_rows, const int *seq, const int *pos,
                                          int n_split, bool half_out, float *out);

/* The decode matvec over nr input rows (1..8) with any epilogue (kind: KILN_MVB_*), as a continuous batch
 * launches it. w: GGUF rows of `type` (out x in); SWIGLU: w = gate, w1 = up, y receives silu(gate) * up.
 * x: nr x in; norm_w: RMSNorm weight (eps 1e-5) or NULL (plain input); y: nr x out (ADD: the residual in,
 * the sum out). QKV: out = nq + 2 nk, RoPE (adjacent pairs, rope_freq: n_rot/2 inverse frequencies) of row r
 * at pos[r], q into y row r (its first nq values), K and V appended to sequence seq[r]'s cache: kv receives
 * both caches (K then V, n_seq x n_ctx x nk floats each, converted from the device's halves; zeros where
 * nothing was written). LOGITS: y = logits, argmax[r] = each row's argmax. */
typedef struct kiln_cuda_mv_rows {
    uint32_t type;
    const void *w, *w1;
    int in, out, kind, nr;
    const float *x, *norm_w;
    float *y;
    int nq, nk, head_dim, n_rot;   /* QKV */
    const float *rope_freq;
    const int *pos, *seq;
    int n_seq, n_ctx;
    float *kv;
    int32_t *argmax;               /* LOGITS */
} kiln_cuda_mv_rows;
kiln_status kiln_cuda_test_matvec_rows(const kiln_cuda_mv_rows *t);

/* One decode matrix x vector timed alone (test-only microbenchmark): random weights of `type` (out rows of in
 * values; SWIGLU: two such matrices, gate and up), a fixed input, the epilogue of `kind` (QKV: out = nq + 2 nk
 * rows, heads of head_dim, RoPE at position 7 and the K/V append; LOGITS: the argmax too), nr rows of input.
 * n_launch launches back to back (with programmatic dependent launch when pdl) are captured in one graph and
 * replayed reps times: us_l2 = microseconds per launch on one copy of the weights (they stay in L2), us = the
 * same cycling through n_copies copies of >= 192 MB in all (read from HBM, as in a decode step); blocks = the
 * grid, hash = FNV-1a of every output of one launch from zeroed outputs (to compare builds bit for bit). */
enum { KILN_MVB_STORE = 0, KILN_MVB_ADD, KILN_MVB_QKV, KILN_MVB_SWIGLU, KILN_MVB_LOGITS };
typedef struct kiln_cuda_mv_bench {
    uint32_t type;
    int in, out, kind;
    int nq, nk, head_dim;      /* QKV */
    int nr;                    /* rows of input (1..8) */
    int n_launch, reps;
    bool pdl;
    double us, us_l2;          /* out */
    int blocks, n_copies;      /* out */
    uint64_t hash;             /* out */
} kiln_cuda_mv_bench;
kiln_status kiln_cuda_bench_matvec(kiln_cuda_mv_bench *mb);
/* The MoE feed-forward (cuda_moe.cu) of n rows x (n x n_embd): RMSNorm(x) * norm_w (eps), the router (F32,
 * n_expert rows of n_embd), softmax, top-k (k) with the weights renormalized when norm_topk, the experts as GGUF
 * rows of `type` (gate, up: n_expert * n_ff rows of n_embd; down: n_expert * n_embd rows of n_ff), through the
 * path given (KILN_MOE_PER_ROW: each row's chosen experts; KILN_MOE_GROUPED: the rows grouped by expert, the
 * tensor-core GEMMs). Out: probs (n x n_expert, the softmax), ids and wts (n x k), y = x + the mix (n x n_embd),
 * and h (may be NULL; KILN_MOE_PER_ROW only): silu(gate) * up of each chosen expert (n x k x n_ff) as the down
 * kernel's input before its 8-bit quantization. */
enum { KILN_MOE_PER_ROW = 0, KILN_MOE_GROUPED = 1 };
kiln_status kiln_cuda_test_moe(int path, uint32_t type, int n_embd, int n_ff, int n_expert, int k, bool norm_topk,
                               const float *router, const void *gate, const void *up, const void *down,
                               const float *norm_w, float eps, const float *x, int n, float *probs, int32_t *ids,
                               float *wts, float *y, float *h);
/* The grouped path's group kernel alone: ids (n_rows x k, each in 0..n_expert-1; n_rows * k <= 65535,
 * n_expert <= 512) -> offsets (n_expert + 1: expert e's entries at [offsets[e], offsets[e + 1])), list
 * (n_rows * k: the row of each entry in expert order), pos (n_rows * k: entry row * k + j's place in list). */
kiln_status kiln_cuda_test_moe_group(const int32_t *ids, int n_rows, int k, int n_expert, int32_t *offsets,
                                     int32_t *list, int32_t *pos);

/* The device sampler (cuda_sample.cu) on n_rows rows: row r's logits (n_vocab floats at logits + r * n_vocab;
 * the penalties are applied to a device copy) sampled with specs[r] (sample_spec.h); ids[r] gets the id, or
 * stays as it was for a spec of mode KILN_SPEC_NONE. one_block (NULL: not wanted): per row, 1 when the row's
 * id came from the whole chain on one block (what the multi-block passes leave), else 0. */
struct kiln_sample_spec;
kiln_status kiln_cuda_test_sample(const struct kiln_sample_spec *specs, int n_rows, const float *logits, int n_vocab,
                                  int32_t *ids, int32_t *one_block);

#endif /* KILN_HAVE_CUDA */

#ifdef __cplusplus
}
#endif
#endif
