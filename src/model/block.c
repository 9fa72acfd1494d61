/* block.c — the block description of a kiln_model (model/block.h). The only place besides model.c
 * where architecture facts (the hparams' flags) turn into block fields. */
#include "model/block.h"

#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static const kiln_weight *opt(const kiln_weight *w) { return w->data ? w : NULL; }

static void build_block(const kiln_model *m, const kiln_layer *L, kiln_block *b) {
    const kiln_hparams *hp = &m->hp;
    b->attn = (kiln_block_attn){
        .norm = &L->attn_norm, .wq = &L->wq, .wk = &L->wk, .wv = &L->wv, .wo = &L->wo,
        .bq = opt(&L->bq), .bk = opt(&L->bk), .bv = opt(&L->bv),
        .q_norm = opt(&L->q_norm), .k_norm = opt(&L->k_norm),
        .rope = hp->rope_neox ? KILN_ROPE_NEOX : KILN_ROPE_NORM, .n_rot = hp->n_rot, .rope_base = hp->rope_base,
        .rope_freqs = (const float *)m->rope_freqs.data,
        .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
    };
    if (hp->n_expert) {
        b->ffn = (kiln_block_ffn){
            .kind = KILN_FFN_MOE, .norm = &L->ffn_norm, .gate = &L->ffn_gate_exps, .up = &L->ffn_up_exps,
            .down = &L->ffn_down_exps, .n_ff = hp->n_ff_exp, .router = &L->ffn_gate_inp, .n_expert = hp->n_expert,
            .n_expert_used = hp->n_expert_used, .norm_topk = hp->moe_norm_topk,
        };
        return;
    }
    b->ffn = (kiln_block_ffn){
        .kind = KILN_FFN_DENSE_SWIGLU, .norm = &L->ffn_norm, .gate = &L->w_gate, .up = &L->w_up, .down = &L->w_down,
        .n_ff = hp->n_ff,
    };
}

kiln_status kiln_blocks_build(const kiln_model *m, kiln_blocks *out) {
    memset(out, 0, sizeof *out);
    const kiln_hparams *hp = &m->hp;
    kiln_block *blocks = kiln_calloc((size_t)hp->n_layer, sizeof *blocks);
    if (!blocks) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the description of %d blocks", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++) build_block(m, &m->layers[il], &blocks[il]);
    *out = (kiln_blocks){
        .n_block = hp->n_layer, .n_embd = hp->n_embd, .n_vocab = hp->n_vocab, .rms_eps = hp->rms_eps,
        .tok_embd = &m->tok_embd, .output_norm = &m->output_norm, .output = &m->output, .blocks = blocks,
    };
    return KILN_OK;
}

void kiln_blocks_free(kiln_blocks *b) {
    if (!b) return;
    kiln_free(b->blocks);
    memset(b, 0, sizeof *b);
}
