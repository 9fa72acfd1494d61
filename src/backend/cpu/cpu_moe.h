/*
 * cpu_moe.h — the mixture-of-experts feed-forward block on the CPU (KILN_FFN_MOE of model/block.h), as
 * llama.cpp computes it for qwen3moe (build_moe_ffn): router logits = W_router x; softmax over all
 * experts; the k = n_expert_used most probable experts (ties: the lower expert id); their probabilities
 * renormalized to sum to 1 (when the block asks, the sum clamped below at 2^-14 as ggml does); each chosen
 * expert's SwiGLU output down(silu(gate x) * up x) scaled by its weight and the k of them summed in the
 * order of the choice (most probable first).
 * The rows of a batch are grouped by expert: for every expert that any row chose, the rows routed to it
 * are gathered and go through one matrix product per projection (gate, up, down), so each chosen expert's
 * weights are read once per call and the experts nobody chose are not read at all (decode reads k of
 * n_expert). A row's arithmetic does not depend on the other rows of the batch.
 */
#ifndef KILN_CPU_MOE_H
#define KILN_CPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "model/block.h"

/* The buffers of the MoE block for up to max_batch rows (carved from the backend's arena at open). */
typedef struct cpu_moe_buf {
    int max_batch, n_embd, max_expert, max_used, max_ff;
    float *probs;        /* (B, n_expert) router logits, then probabilities */
    int32_t *ids;        /* (B, k) the chosen experts of each row, most probable first */
    float *wts;          /* (B, k) their weights */
    int32_t *first;      /* (n_expert + 1) start of each expert's entries in `entries` */
    int32_t *entries;    /* (B * k) row * k + slot, grouped by expert, rows ascending within an expert */
    float *xg;           /* (B, n_embd) the rows routed to one expert, gathered */
    float *hg, *hu;      /* (B, n_ff) that expert's gate and up outputs */
    float *yd;           /* (B, n_embd) its down outputs */
    float *yk;           /* (B * k, n_embd) each (row, slot)'s weighted expert output */
    uint64_t expert_bytes_read;  /* bytes of expert matrices read since open (gate + up + down per chosen expert) */
} cpu_moe_buf;

/* Lays out the buffers for the largest MoE block of d and max_batch rows from base (64-byte aligned);
 * with base == NULL it only computes the size. Returns the bytes used (0 when no block is MoE). */
size_t cpu_moe_layout(cpu_moe_buf *b, uint8_t *base, const kiln_blocks *d, int max_batch);

/* out (B, n_embd) = the MoE feed-forward of the normed rows x (B, n_embd), for block f (kind KILN_FFN_MOE).
 * mm_scratch: cpu_matmul scratch for B rows of the router and expert matrices. Allocates nothing. */
void cpu_moe_ffn(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int B, float *out, cpu_moe_buf *b,
                 void *mm_scratch);

/* The routing of one row: probs (n_expert) holds the router logits on entry and their softmax on return;
 * ids/w (k) receive the chosen experts (most probable first, the lower id on ties) and their weights
 * (renormalized to sum to 1 when norm). */
void cpu_moe_route(float *probs, int n_expert, int k, bool norm, int32_t *ids, float *w);

#endif
