/*
 * sample_hist.c — top-k off over many candidates (a flat distribution: thousands of ids within reach of the
 * maximum) without sorting them. One pass over the logits puts every candidate that can matter into HIST_BINS
 * bins linear in the logit, from the lowest logit that can matter (min-p's floor, else where expf underflows)
 * to the maximum: per id its bin, per bin its count and the sums of its terms (expf's, bit for bit) at
 * temperature 1 and at the sampling temperature; the same pass sums top-p's exact normalizer. Then min-p's
 * boundary, top-p's crossing and the draw's crossing each take whole the bins whose sums lie clearly before
 * them, and gather (a search of the bins for one bin's ids), sort and walk, with the definition's arithmetic
 * (sample.c's cut_walk, draw and all_walk), only the few bins where they may fall. Each decision is the sorted
 * walk's (with the exact normalizer, whose p it computes bit for bit) wherever it lies further than HIST_MARGIN
 * from its boundary (the bins' sums differ from the walk's cumulative only by the float rounding of each
 * probability and the order of the additions); otherwise -1, and the caller walks sorted.
 */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "sample/sample_internal.h"

/* A cumulative from the bins' sums of exact terms lies within this of the sorted walk's (one float rounding per
 * probability, 2^-24 of the cumulative, and the order of the double additions), with room to spare. */
#define HIST_MARGIN 1e-7

int sample_hist_init(sample_hist *h, int n_vocab) {
    memset(h, 0, sizeof *h);
    const size_t nid = (size_t)(n_vocab + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK * SAMPLE_BLOCK;
    h->count = kiln_calloc(HIST_BINS + 1, sizeof *h->count);
    h->h1 = kiln_calloc(HIST_BINS + 1, sizeof *h->h1);
    h->ht = kiln_calloc(HIST_BINS + 1, sizeof *h->ht);
    h->bin = kiln_calloc(nid, sizeof *h->bin);
    h->ids = kiln_calloc(nid + 16, sizeof *h->ids);
    h->ord = kiln_calloc((size_t)n_vocab, sizeof *h->ord);
    if (!h->count || !h->h1 || !h->ht || !h->bin || !h->ids || !h->ord) return -1;
    /* touched now, so that no later call pays for their pages (first-call contract) */
    memset(h->count, 0, (HIST_BINS + 1) * sizeof *h->count);
    memset(h->h1, 0, (HIST_BINS + 1) * sizeof *h->h1);
    memset(h->ht, 0, (HIST_BINS + 1) * sizeof *h->ht);
    memset(h->bin, 0, nid * sizeof *h->bin);
    memset(h->ids, 0, (nid + 16) * sizeof *h->ids);
    memset(h->ord, 0, (size_t)n_vocab * sizeof *h->ord);
    return 0;
}

void sample_hist_free(sample_hist *h) {
    kiln_free(h->count);
    kiln_free(h->h1);
    kiln_free(h->ht);
    kiln_free(h->bin);
    kiln_free(h->ids);
    kiln_free(h->ord);
    memset(h, 0, sizeof *h);
}

bool sample_hist_wanted(const sample_view *v) {
    int wide = 0; /* blocks whose maximum is within 6 of the maximum: the first band's blocks */
    for (int b = 0; b < v->nb; b++) wide += v->bm[b] >= v->max - 6.0f;
    return wide >= HIST_MIN_BLOCKS;
}

/* One block's terms added to their bins' counts and sums (ht NULL: only the temperature-1 sums); the ids below
 * lo land in bin HIST_BINS, never read. */
static void scatter(uint32_t *restrict count, double *restrict h1, double *restrict ht, const uint16_t *bin,
                    const float *e1, const float *et) {
    if (ht) {
        for (int j = 0; j < SAMPLE_BLOCK; j++) count[bin[j]]++, h1[bin[j]] += e1[j], ht[bin[j]] += et[j];
    } else {
        for (int j = 0; j < SAMPLE_BLOCK; j++) count[bin[j]]++, h1[bin[j]] += e1[j];
    }
}

/* The pass: per id its bin (HIST_BINS below lo), per bin the count and the terms' sums; returns the exact
 * temperature-1 normalizer, sample_view_exp_sum's with k->exp_sum bit for bit (the blocks in the same order,
 * each summed in SAMPLE_SUM_ORDER) when want_z, else 0. */
static double fill_bins(sample_hist *h, const sample_view *v, const sample_kernels *k, float lo, float scale,
                        float temp, bool want_z) {
    const float max = v->max, zlo = max - 120.0f; /* blocks below hold only terms that expf makes 0 */
    const bool one = temp == 1.0f; /* the terms at the temperature are those at 1 */
    memset(h->count, 0, (HIST_BINS + 1) * sizeof *h->count);
    memset(h->h1, 0, (HIST_BINS + 1) * sizeof *h->h1);
    if (!one) memset(h->ht, 0, (HIST_BINS + 1) * sizeof *h->ht);
    h->tsum = one ? h->h1 : h->ht;
    h->n_gathered = h->n_ord = 0;
    float e1[SAMPLE_BLOCK], et[SAMPLE_BLOCK];
    double z = 0.0;
    for (int b = 0; b < v->nb; b++) {
        const float *x = sample_view_block(v, b); /* a partial last block is padded with -inf */
        uint16_t *bin = h->bin + (size_t)b * SAMPLE_BLOCK;
        if (!(v->bm[b] >= lo)) {
            for (int j = 0; j < SAMPLE_BLOCK; j++) bin[j] = HIST_BINS;
            if (want_z && v->bm[b] >= zlo) z = k->exp_sum(x, 1, max, 1.0f, z);
            continue;
        }
        z = k->hist_block(x, max, temp, lo, scale, e1, et, bin, z);
        scatter(h->count, h->h1, one ? NULL : h->ht, bin, e1, et);
    }
    return want_z ? z : 0.0;
}

/* Bin kb's members, sorted (sample_cand_sort), into *n; gathered once per call into ord. NULL when the call
 * has gathered HIST_MAX_GATHER bins already. */
static const cand *members(sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, int *n,
                           uint64_t *tmp) {
    for (int g = 0; g < h->n_gathered; g++)
        if (h->gathered[g].kb == kb) { *n = h->gathered[g].n; return h->ord + h->gathered[g].off; }
    if (h->n_gathered == HIST_MAX_GATHER) return NULL;
    const int c = k->bin_find(h->bin, v->nb * SAMPLE_BLOCK, (uint16_t)kb, h->ids);
    KILN_ASSERT(c == (int)h->count[kb]);
    cand *o = h->ord + h->n_ord;
    for (int i = 0; i < c; i++) o[i] = (cand){h->ids[i], sample_view_logit(v, h->ids[i]), 0.0f};
    sample_cand_sort(o, c, tmp);
    h->gathered[h->n_gathered++] = (hist_gathered){kb, h->n_ord, c};
    h->n_ord += c;
    *n = c;
    return o;
}

/* The cut: the bin `*last` and the number `*n_last` of its sorted members that the walk keeps (every member of
 * the bins before it kept), as cut_walk with normalizer z decides; 0, or -1 when a decision comes within the
 * margin of its boundary, the walk would go on below lo (lo not min-p's floor, where the walk ends) or it would
 * gather too many bins. */
static int hist_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                    float scale, bool lo_is_floor, double z, uint64_t *tmp, int *last, int *n_last) {
    const float max = v->max;
    const int top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    const float thr = (float)(1.0 / z) * p->min_p; /* the maximum's p times min-p, as cut_walk's first candidate */
    double cum = 0.0;
    for (int kb = 0; kb < HIST_BINS; kb++) {
        if (!h->count[kb]) continue;
        /* whole: top-p not reached through this bin, and min-p passes its lowest possible logit by far */
        bool whole = !top_p || cum + h->h1[kb] / z < (double)p->top_p - HIST_MARGIN;
        if (whole && min_p) {
            const float edge = max - ((float)kb + 1.01f) / scale;
            whole = (float)(expf(edge - max) / z) >= thr * (1.0f + 4e-6f);
        }
        *last = kb, *n_last = (int)h->count[kb];
        if (whole) {
            cum += h->h1[kb] / z;
            continue;
        }
        int n;
        const cand *c = members(h, v, k, kb, &n, tmp);
        if (!c) return -1;
        for (int i = 0; i < n; i++) {
            const float pi = (float)(expf(c[i].logit - max) / z);
            if (min_p && !(kb == 0 && i == 0) && pi < thr) { *n_last = i; return 0; }
            cum += pi;
            if (top_p && cum >= p->top_p) {
                if (cum - p->top_p < HIST_MARGIN || p->top_p - (cum - pi) < HIST_MARGIN) return -1;
                *n_last = i + 1;
                return 0;
            }
        }
    }
    /* the walk went past every bin: it ends at min-p's floor, else it would go on below lo */
    if (!lo_is_floor || (top_p && (double)p->top_p - cum < HIST_MARGIN)) return -1;
    return 0;
}

/* The draw over the candidates of the bins before `last` and the first n_last (sorted) of `last`: softmax at
 * the temperature with normalizer s, as sample.c's draw and all_walk walk it; the first whose cumulative
 * passes r, or -1 (within HIST_MARGIN, r beyond the rounded total: the walk's last, or too many bins). */
static int32_t hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, double s,
                         double r, int last, int n_last, uint64_t *tmp) {
    const float max = v->max;
    double cum = 0.0;
    for (int kb = 0; kb <= last; kb++) {
        if (!h->count[kb]) continue;
        if (kb < last && cum + h->tsum[kb] / s < r - HIST_MARGIN) {
            cum += h->tsum[kb] / s;
            continue;
        }
        int n;
        const cand *c = members(h, v, k, kb, &n, tmp);
        if (!c) return -1;
        if (kb == last) n = n_last;
        for (int i = 0; i < n; i++) {
            const double prev = cum;
            cum += (float)(expf((c[i].logit - max) / temp) / s);
            if (r < cum) return cum - r < HIST_MARGIN || r - prev < HIST_MARGIN ? -1 : c[i].id;
        }
    }
    return -1;
}

int32_t sample_hist_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                        double r, uint64_t *tmp, double *z) {
    const float max = v->max, temp = p->temperature;
    const bool top_p = p->top_p < 1.0f;
    if (!isfinite(max)) {
        *z = top_p ? sample_view_exp_sum(v, k->exp_sum, 1.0f) : 1.0;
        return -1;
    }
    float lo = max - 104.0f; /* expf below is 0 */
    bool lo_is_floor = false;
    if (p->min_p > 0.0f) {
        const float floor = sample_min_p_floor(max, p->min_p);
        if (floor >= lo) lo = floor, lo_is_floor = true;
    }
    const float scale = (float)HIST_BINS / (max - lo);
    const double zt = fill_bins(h, v, k, lo, scale, temp, top_p);
    *z = top_p ? zt : 1.0;
    int last = -1, n_last = 0;
    if (hist_cut(h, v, k, p, scale, lo_is_floor, *z, tmp, &last, &n_last) < 0 || last < 0) return -1;
    /* the draw over what the cut keeps: softmax at the temperature, its normalizer from the bins before `last`
     * and the kept members of `last` (the whole bin's sum where it keeps them all) */
    double s = 0.0;
    for (int kb = 0; kb < last; kb++) s += h->tsum[kb];
    if (n_last == (int)h->count[last]) {
        s += h->tsum[last];
    } else {
        int n;
        const cand *cl = members(h, v, k, last, &n, tmp); /* gathered by the cut already */
        for (int i = 0; i < n_last; i++) s += expf((cl[i].logit - max) / temp);
    }
    return hist_draw(h, v, k, temp, s, r, last, n_last, tmp);
}

int32_t sample_hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, double r,
                         uint64_t *tmp) {
    const float max = v->max;
    if (!isfinite(max)) return -1;
    const float lo = max - 104.0f * temp; /* expf((l - max) / temp) below is 0 */
    fill_bins(h, v, k, lo, (float)HIST_BINS / (max - lo), temp, false);
    int last = HIST_BINS - 1;
    while (last > 0 && !h->count[last]) last--;
    /* the normalizer: every nonzero term is in the bins (the walk's exact one but for the order of the sums) */
    double z = 0.0;
    for (int kb = 0; kb <= last; kb++) z += h->tsum[kb];
    return hist_draw(h, v, k, temp, z, r, last, (int)h->count[last], tmp);
}
