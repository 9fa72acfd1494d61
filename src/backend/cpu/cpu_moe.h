/*
 * cpu_moe.h — the mixture-of-experts feed-forward block on the CPU (KILN_FFN_MOE of model/block.h), as
 * llama.cpp computes it for qwen3moe (build_moe_ffn): router logits = W_router x; softmax over all
 * experts; the k = n_expert_used most probable experts (ties: the lower expert id); their probabilities
 * renormalized to sum to 1 (when the block asks, the sum clamped below at 2^-14 as ggml does); each chosen
 * expert's SwiGLU output down(silu(gate x) * up x) scaled by its weight and the k of them summed in the
 * order of the choice (most probable first).
 * The (row, slot) entries of a batch are grouped by expert, so each chosen expert's weights are read once
 * per call and the experts nobody chose are not read at all (decode reads k of n_expert). The fused path
 * (cpu_moe_ffn) takes two thread-pool runs for all experts together: one for gate and up (work items =
 * (chosen expert, block of weight rows), the SwiGLU done by the item on its rows; for one row (decode) the
 * block is all the rows, which the single-row kernel streams whole), one for down (items = (chosen expert,
 * block of output columns)); then the weighted sum in the order of the choice (on the calling thread when
 * small, a third run for a batch). The runs go in chunks of kiln_pool_for, which a late thread cannot hold up
 * (a share of kiln_pool_run could: the pool took the wait for a descheduled thread as a busy machine and ran
 * alone, 30 instead of 52 tok/s of 2-thread qwen3-30b-a3b prefill on a noisy VM). Each row's activations are
 * converted once for the dot. cpu_moe_ffn_ref is the straightforward form it must equal bit for bit (per
 * expert: gather its rows, three cpu_matmul calls). A row's arithmetic does not depend on the other rows of
 * the batch, nor on the number of threads.
 */
#ifndef KILN_CPU_MOE_H
#define KILN_CPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "model/block.h"

/* The buffers of the MoE block for up to max_batch rows (carved from the backend's arena at open).
 * An "entry" is one (row, slot) pair; entries are numbered in their grouped order (by expert, then row). */
typedef struct cpu_moe_buf {
    int max_batch, n_embd, max_expert, max_used, max_ff;
    float *probs;        /* (B, n_expert) router logits, then probabilities */
    int32_t *ids;        /* (B, k) the chosen experts of each row, most probable first */
    float *wts;          /* (B, k) their weights */
    int32_t *first;      /* (n_expert + 1) start of each expert's entries in `entries` */
    int32_t *entries;    /* (B * k) row * k + slot, grouped by expert, rows ascending within an expert */
    int32_t *pos;        /* (B * k) the inverse: the grouped position of row * k + slot */
    int32_t *used;       /* (n_expert) the experts with entries, ascending */
    uint8_t *qx;         /* (B) rows converted for the gate's dot, then (qx_up) for the up's when it differs */
    uint8_t *qx_up;
    uint8_t *qg, *qg_up; /* (B * k) those rows gathered in grouped order */
    float *qg_d, *qg_up_d; /* (B * k, n_embd / 32) Q8_0 block scales of the gathered rows as floats */
    uint8_t *qh;         /* (B * k) the SwiGLU rows converted for the down's dot */
    float *qh_d;         /* (B * k, n_ff / 32) their Q8_0 block scales as floats */
    uint8_t *yu_g, *yu_u, *yu_h; /* one row (decode): the gate's / up's row (n_embd) and the k SwiGLU rows (k, n_ff)
                                  * in the order a single-row kernel reads (cpu_gemm_row1_reads_yu), else unused */
    size_t qrow_e, qrow_f; /* bytes of one converted row of n_embd (gate, up) / n_ff (down) values */
    float *xg;           /* (B, n_embd) the rows routed to one expert, gathered (the reference) */
    float *hg, *hu;      /* (B * k, n_ff) the gate and up outputs per entry (gate: then the SwiGLU) */
    float *yk;           /* (B * k, n_embd) each entry's down output (the reference: already weighted) */
    uint64_t expert_bytes_read;  /* bytes of expert matrices read since open (gate + up + down per chosen expert) */
} cpu_moe_buf;

/* Lays out the buffers for the largest MoE block of d and max_batch rows from base (64-byte aligned);
 * with base == NULL it only computes the size. Returns the bytes used (0 when no block is MoE). */
size_t cpu_moe_layout(cpu_moe_buf *b, uint8_t *base, const kiln_blocks *d, int max_batch);

/* out (B, n_embd) = the MoE feed-forward of the normed rows x (B, n_embd), for block f (kind KILN_FFN_MOE),
 * the fused path: the router's cpu_matmul, then two pool runs for the experts (plus one per conversion
 * of many rows when B is large). mm_scratch: cpu_matmul scratch for B rows of the router. Allocates nothing. */
void cpu_moe_ffn(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int B, float *out, cpu_moe_buf *b,
                 void *mm_scratch);

/* The reference of cpu_moe_ffn (the same result, bit for bit): per chosen expert, its rows gathered and
 * three cpu_matmul calls; mm_scratch for B rows of n_embd and of n_ff. Allocates nothing. */
void cpu_moe_ffn_ref(kiln_pool *pool, const kiln_block_ffn *f, const float *x, int B, float *out, cpu_moe_buf *b,
                     void *mm_scratch);

/* The routing of one row: probs (n_expert) holds the router logits on entry and their softmax on return;
 * ids/w (k) receive the chosen experts (most probable first, the lower id on ties) and their weights
 * (renormalized to sum to 1 when norm). */
void cpu_moe_route(float *probs, int n_expert, int k, bool norm, int32_t *ids, float *w);

#endif
