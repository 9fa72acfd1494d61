/* sample_penalty.c — the repetition window and the penalties over it (repeat, presence, frequency), in
 * llama.cpp's penalties-sampler semantics. Only the ids of the window are touched; nothing is copied. */
#include <string.h>

#include "base/alloc.h"
#include "sample/sample_internal.h"

int sample_penalty_max(int last_n, int n_vocab) {
    return last_n < n_vocab ? last_n : n_vocab;
}

int sample_penalty_init(sample_penalty *pen, float repeat, float presence, float frequency, int last_n, int n_vocab) {
    memset(pen, 0, sizeof *pen);
    pen->repeat = repeat;
    pen->presence = presence;
    pen->frequency = frequency;
    pen->last_n = pen->cap_last_n = last_n;
    pen->n_vocab = n_vocab;
    const size_t np = (size_t)(sample_penalty_max(last_n, n_vocab) > 0 ? sample_penalty_max(last_n, n_vocab) : 1);
    pen->recent = kiln_calloc((size_t)(last_n ? last_n : 1), sizeof(int32_t));
    pen->stamp = kiln_calloc((size_t)n_vocab, sizeof(uint32_t));
    pen->count = kiln_calloc((size_t)n_vocab, sizeof(int32_t));
    pen->pid = kiln_calloc(np, sizeof(int32_t));
    pen->pval = kiln_calloc(np, sizeof(float));
    return pen->recent && pen->stamp && pen->count && pen->pid && pen->pval ? 0 : -1;
}

void sample_penalty_free(sample_penalty *pen) {
    kiln_free(pen->recent);
    kiln_free(pen->stamp);
    kiln_free(pen->count);
    kiln_free(pen->pid);
    kiln_free(pen->pval);
    memset(pen, 0, sizeof *pen);
}

void sample_penalty_reset(sample_penalty *pen) {
    pen->n_recent = 0;
    pen->head = 0;
}

void sample_penalty_accept(sample_penalty *pen, int32_t id) {
    if (pen->last_n == 0) return;
    pen->recent[pen->head] = id;
    pen->head = (pen->head + 1) % pen->last_n;
    if (pen->n_recent < pen->last_n) pen->n_recent++;
}

bool sample_penalty_active(const sample_penalty *pen) {
    return pen->n_recent && !(pen->repeat == 1.0f && pen->presence == 0.0f && pen->frequency == 0.0f);
}

int sample_penalty_collect(sample_penalty *pen) {
    if (!sample_penalty_active(pen)) return 0;
    if (++pen->calls == 0) { /* the stamps wrapped: forget them all once */
        memset(pen->stamp, 0, (size_t)pen->n_vocab * sizeof(uint32_t));
        pen->calls = 1;
    }
    int np = 0;
    for (int i = 0; i < pen->n_recent; i++) {
        const int32_t id = pen->recent[i];
        if (id < 0 || id >= pen->n_vocab) continue;
        if (pen->stamp[id] != pen->calls) {
            pen->stamp[id] = pen->calls;
            pen->count[id] = 0;
            pen->pid[np++] = id;
        }
        pen->count[id]++;
    }
    return np;
}

int sample_penalty_apply(sample_penalty *pen, const float *logits) {
    const int np = sample_penalty_collect(pen);
    for (int i = 0; i < np; i++) {
        const int32_t id = pen->pid[i], count = pen->count[id];
        float l = logits[id];
        l = l <= 0.0f ? l * pen->repeat : l / pen->repeat;
        l -= (float)count * pen->frequency + (float)(count > 0) * pen->presence;
        pen->pval[i] = l;
    }
    return np;
}
