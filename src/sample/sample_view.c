/* sample_view.c — the view of one call's penalized logits (see sample_internal.h) and the passes over it:
 * block maxima, argmax, sum of exponentials, band collection and the top-n heap. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "sample/sample_internal.h"

int sample_view_init(sample_view *v, int n_vocab, int max_penalized) {
    memset(v, 0, sizeof *v);
    v->nv = n_vocab;
    v->nb = (n_vocab + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
    v->max_dirty = max_penalized + 1 < v->nb ? max_penalized + 1 : v->nb; /* + the partial last block */
    v->side = kiln_calloc((size_t)v->max_dirty * SAMPLE_BLOCK, sizeof(float));
    v->slot = kiln_malloc((size_t)v->nb * sizeof(int32_t));
    v->dirty = kiln_malloc((size_t)v->max_dirty * sizeof(int32_t));
    v->bm = kiln_malloc((size_t)v->nb * sizeof(float));
    v->scratch = kiln_malloc((size_t)v->nb * sizeof(float));
    if (!v->side || !v->slot || !v->dirty || !v->bm || !v->scratch) return -1;
    for (int b = 0; b < v->nb; b++) v->slot[b] = -1;
    return 0;
}

void sample_view_free(sample_view *v) {
    kiln_free(v->side);
    kiln_free(v->slot);
    kiln_free(v->dirty);
    kiln_free(v->bm);
    kiln_free(v->scratch);
    memset(v, 0, sizeof *v);
}

/* Copies block b into the side buffer (padding a partial block with -inf). */
static float *make_dirty(sample_view *v, int b) {
    if (v->slot[b] < 0) {
        float *d = v->side + (size_t)v->n_dirty * SAMPLE_BLOCK;
        const int len = sample_view_block_len(v, b);
        memcpy(d, v->logits + (size_t)b * SAMPLE_BLOCK, (size_t)len * sizeof(float));
        for (int j = len; j < SAMPLE_BLOCK; j++) d[j] = -INFINITY;
        v->slot[b] = v->n_dirty;
        v->dirty[v->n_dirty++] = b;
    }
    return v->side + (size_t)v->slot[b] * SAMPLE_BLOCK;
}

void sample_view_build(sample_view *v, const sample_kernels *k, const float *logits, const int32_t *pid,
                       const float *pval, int np) {
    for (int i = 0; i < v->n_dirty; i++) v->slot[v->dirty[i]] = -1;
    v->n_dirty = 0;
    v->logits = logits;
    if (v->nv % SAMPLE_BLOCK) make_dirty(v, v->nb - 1);
    for (int i = 0; i < np; i++) make_dirty(v, pid[i] / SAMPLE_BLOCK)[pid[i] % SAMPLE_BLOCK] = pval[i];
    k->block_max(logits, v->nv / SAMPLE_BLOCK, v->bm);
    for (int i = 0; i < v->n_dirty; i++) k->block_max(v->side + (size_t)i * SAMPLE_BLOCK, 1, &v->bm[v->dirty[i]]);
    float m = v->bm[0];
    for (int b = 1; b < v->nb; b++) m = v->bm[b] > m ? v->bm[b] : m;
    v->max = m;
}

float sample_view_logit(const sample_view *v, int32_t id) {
    return sample_view_block(v, id / SAMPLE_BLOCK)[id % SAMPLE_BLOCK];
}

int32_t sample_view_argmax(const sample_view *v) {
    for (int b = 0; b < v->nb; b++) {
        if (!(v->bm[b] >= v->max)) continue;
        const float *x = sample_view_block(v, b);
        const int len = sample_view_block_len(v, b);
        for (int j = 0; j < len; j++)
            if (x[j] >= v->max) return b * SAMPLE_BLOCK + j;
    }
    return 0; /* no block reaches the maximum: only with NaN logits */
}

double sample_view_exp_sum(const sample_view *v, sample_exp_sum_fn fn, float temp) {
    double z = 0.0;
    for (int b = 0; b < v->nb;) {
        if (v->slot[b] >= 0) {
            z = fn(sample_view_block(v, b), 1, v->max, temp, z);
            b++;
            continue;
        }
        int e = b + 1;
        while (e < v->nb && v->slot[e] < 0) e++;
        z = fn(v->logits + (size_t)b * SAMPLE_BLOCK, e - b, v->max, temp, z);
        b = e;
    }
    return z;
}

int sample_view_collect(const sample_view *v, float lo, float hi, int first, cand *out) {
    int n = 0;
    const int bounded = !first;
    for (int b = 0; b < v->nb; b++) {
        if (!(v->bm[b] >= lo)) continue;
        const float *x = sample_view_block(v, b);
        const int len = sample_view_block_len(v, b), id0 = b * SAMPLE_BLOCK;
        for (int j = 0; j < len; j++)
            if (x[j] >= lo && (!bounded || x[j] < hi)) out[n++] = (cand){id0 + j, x[j], 0.0f};
    }
    return n;
}

int sample_view_top(const sample_view *v, int k, cand *heap) {
    const float floor = k <= v->nb ? sample_kth_largest(v->bm, v->nb, k, v->scratch) : -INFINITY;
    int n = 0;
    for (int b = 0; b < v->nb; b++) {
        if (!(v->bm[b] >= floor) || (n == k && !(v->bm[b] > heap[0].logit))) continue;
        const float *x = sample_view_block(v, b);
        const int len = sample_view_block_len(v, b), id0 = b * SAMPLE_BLOCK;
        for (int j = 0; j < len; j++) {
            if (!(x[j] >= floor)) continue;
            const cand c = {id0 + j, x[j], 0.0f};
            if (n < k) sample_heap_push(heap, &n, c);
            else if (x[j] > heap[0].logit) sample_heap_offer(heap, k, c);
        }
    }
    sample_heap_sort(heap, n);
    return n;
}
