/*
 * sample_hist.c — top-k off over many candidates (a flat distribution: thousands of ids within reach of the
 * maximum) without sorting them. One pass puts every candidate that can matter into HIST_BINS bins linear in
 * the logit, from the lowest logit that can matter (min-p's floor, else where expf underflows) to the maximum,
 * summing per bin its terms (expf's, bit for bit) at temperature 1 and at the sampling temperature; a second
 * pass lays the candidates out in bin order (ascending id within a bin). Then min-p's boundary, top-p's
 * crossing and the draw's crossing each take whole the bins whose sums lie clearly before them, and sort and
 * walk, with the definition's arithmetic (sample.c's cut_walk, draw and all_walk), only the bins where they may
 * fall. Each decision is the sorted walk's (with the exact normalizer, whose p it computes bit for bit) wherever
 * it lies further than HIST_MARGIN from its boundary (the bins' sums differ from the walk's cumulative only by
 * the float rounding of each probability and the order of the additions); otherwise -1, and the caller walks
 * sorted.
 */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "sample/sample_internal.h"

/* A cumulative from the bins' sums of exact terms lies within this of the sorted walk's (one float rounding per
 * probability, 2^-24 of the cumulative, and the order of the double additions), with room to spare. */
#define HIST_MARGIN 1e-7

int sample_hist_init(sample_hist *h, int n_vocab) {
    memset(h, 0, sizeof *h);
    h->start = kiln_calloc(HIST_BINS + 1, sizeof *h->start);
    h->pos = kiln_calloc(HIST_BINS, sizeof *h->pos);
    h->h1 = kiln_calloc(HIST_BINS, sizeof *h->h1);
    h->ht = kiln_calloc(HIST_BINS, sizeof *h->ht);
    h->ord = kiln_calloc((size_t)n_vocab, sizeof *h->ord);
    if (!h->start || !h->pos || !h->h1 || !h->ht || !h->ord) return -1;
    /* touched now, so that no later call pays for their pages (first-call contract) */
    memset(h->start, 0, (HIST_BINS + 1) * sizeof *h->start);
    memset(h->pos, 0, HIST_BINS * sizeof *h->pos);
    memset(h->h1, 0, HIST_BINS * sizeof *h->h1);
    memset(h->ht, 0, HIST_BINS * sizeof *h->ht);
    memset(h->ord, 0, (size_t)n_vocab * sizeof *h->ord);
    return 0;
}

void sample_hist_free(sample_hist *h) {
    kiln_free(h->start);
    kiln_free(h->pos);
    kiln_free(h->h1);
    kiln_free(h->ht);
    kiln_free(h->ord);
    memset(h, 0, sizeof *h);
}

bool sample_hist_wanted(const sample_view *v) {
    int wide = 0; /* blocks whose maximum is within 6 of the maximum: the first band's blocks */
    for (int b = 0; b < v->nb; b++) wide += v->bm[b] >= v->max - 6.0f;
    return wide >= HIST_MIN_BLOCKS;
}

static inline int bin_of(float l, float max, float scale) {
    const float t = (max - l) * scale;
    return t < (float)HIST_BINS ? (int)t : HIST_BINS - 1;
}

/* The two passes: per bin the count (into start[k + 1]) and the terms' sums, then the candidates in bin order. */
static void fill_bins(sample_hist *h, const sample_view *v, const sample_kernels *k, float lo, float scale,
                      float temp) {
    const float max = v->max;
    memset(h->start, 0, (HIST_BINS + 1) * sizeof *h->start);
    const bool one = temp == 1.0f; /* the terms at the temperature are those at 1 */
    memset(h->h1, 0, HIST_BINS * sizeof *h->h1);
    if (!one) memset(h->ht, 0, HIST_BINS * sizeof *h->ht);
    h->tsum = one ? h->h1 : h->ht;
    float e1[SAMPLE_BLOCK], et[SAMPLE_BLOCK];
    for (int b = 0; b < v->nb; b++) {
        if (!(v->bm[b] >= lo)) continue;
        const float *x = sample_view_block(v, b);
        const int len = sample_view_block_len(v, b);
        k->hist_terms(x, SAMPLE_BLOCK, max, temp, e1, et); /* a partial last block is padded with -inf */
        for (int j = 0; j < len; j++) {
            if (!(x[j] >= lo)) continue;
            const int kb = bin_of(x[j], max, scale);
            h->start[kb + 1]++;
            h->h1[kb] += e1[j];
            if (!one) h->ht[kb] += et[j];
        }
    }
    for (int kb = 0; kb < HIST_BINS; kb++) h->pos[kb] = h->start[kb], h->start[kb + 1] += h->start[kb];
    for (int b = 0; b < v->nb; b++) {
        if (!(v->bm[b] >= lo)) continue;
        const float *x = sample_view_block(v, b);
        const int len = sample_view_block_len(v, b), id0 = b * SAMPLE_BLOCK;
        for (int j = 0; j < len; j++)
            if (x[j] >= lo) h->ord[h->pos[bin_of(x[j], max, scale)]++] = (cand){id0 + j, x[j], 0.0f};
    }
}

/* The cut: the bin `*last` and the number `*n_last` of its sorted members that the walk keeps (every member of
 * the bins before it kept), as cut_walk with normalizer z decides; 0, or -1 when a decision comes within the
 * margin of its boundary or the walk would go on below lo (lo not min-p's floor, where the walk ends). */
static int hist_cut(sample_hist *h, const kiln_sampler_params *p, float max, float scale, bool lo_is_floor,
                    double z, uint64_t *tmp, int *last, int *n_last) {
    const int top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    const float thr = (float)(1.0 / z) * p->min_p; /* the maximum's p times min-p, as cut_walk's first candidate */
    double cum = 0.0;
    for (int kb = 0; kb < HIST_BINS; kb++) {
        const int c0 = (int)h->start[kb], n = (int)h->start[kb + 1] - c0;
        if (!n) continue;
        /* whole: top-p not reached through this bin, and min-p passes its lowest possible logit by far */
        bool whole = !top_p || cum + h->h1[kb] / z < (double)p->top_p - HIST_MARGIN;
        if (whole && min_p) {
            const float edge = max - ((float)kb + 1.01f) / scale;
            whole = (float)(expf(edge - max) / z) >= thr * (1.0f + 4e-6f);
        }
        if (whole) {
            cum += h->h1[kb] / z;
            *last = kb, *n_last = n;
            continue;
        }
        cand *c = h->ord + c0;
        sample_cand_sort(c, n, tmp);
        for (int i = 0; i < n; i++) {
            c[i].p = (float)(expf(c[i].logit - max) / z);
            if (min_p && !(kb == 0 && i == 0) && c[i].p < thr) { *last = kb, *n_last = i; return 0; }
            cum += c[i].p;
            if (top_p && cum >= p->top_p) {
                if (cum - p->top_p < HIST_MARGIN || p->top_p - (cum - c[i].p) < HIST_MARGIN) return -1;
                *last = kb, *n_last = i + 1;
                return 0;
            }
        }
        *last = kb, *n_last = n;
    }
    /* the walk went past every bin: it ends at min-p's floor, else it would go on below lo */
    if (!lo_is_floor || (top_p && (double)p->top_p - cum < HIST_MARGIN)) return -1;
    return 0;
}

/* The draw over the candidates of the bins before `last` and the first n_last of `last` (sorted when the cut
 * walked it): softmax at the temperature with normalizer s, as sample.c's draw and all_walk walk it; the first
 * whose cumulative passes r, or -1 (within HIST_MARGIN, or r beyond the rounded total: the walk's last). */
static int32_t hist_draw(sample_hist *h, float max, float temp, double s, double r, int last, int n_last,
                         uint64_t *tmp) {
    double cum = 0.0;
    for (int kb = 0; kb <= last; kb++) {
        const int c0 = (int)h->start[kb], n = kb == last ? n_last : (int)h->start[kb + 1] - c0;
        if (!n) continue;
        if (kb < last && cum + h->tsum[kb] / s < r - HIST_MARGIN) {
            cum += h->tsum[kb] / s;
            continue;
        }
        cand *c = h->ord + c0;
        sample_cand_sort(c, n, tmp); /* a prefix the cut walked is sorted already */
        for (int i = 0; i < n; i++) {
            const double prev = cum;
            cum += (float)(expf((c[i].logit - max) / temp) / s);
            if (r < cum) return cum - r < HIST_MARGIN || r - prev < HIST_MARGIN ? -1 : c[i].id;
        }
    }
    return -1;
}

int32_t sample_hist_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                        double z, double r, uint64_t *tmp) {
    const float max = v->max, temp = p->temperature;
    if (!isfinite(max)) return -1;
    float lo = max - 104.0f; /* expf below is 0 */
    bool lo_is_floor = false;
    if (p->min_p > 0.0f) {
        const float floor = sample_min_p_floor(max, p->min_p);
        if (floor >= lo) lo = floor, lo_is_floor = true;
    }
    const float scale = (float)HIST_BINS / (max - lo);
    fill_bins(h, v, k, lo, scale, temp);
    int last = -1, n_last = 0;
    if (hist_cut(h, p, max, scale, lo_is_floor, z, tmp, &last, &n_last) < 0 || last < 0) return -1;
    /* the draw over what the cut keeps: softmax at the temperature, its normalizer from the bins before `last`
     * and the kept members of `last` (already sorted) */
    const cand *cl = h->ord + h->start[last];
    double s = 0.0;
    for (int kb = 0; kb < last; kb++) s += h->tsum[kb];
    for (int i = 0; i < n_last; i++) s += expf((cl[i].logit - max) / temp);
    return hist_draw(h, max, temp, s, r, last, n_last, tmp);
}

int32_t sample_hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, double r,
                         uint64_t *tmp) {
    const float max = v->max;
    if (!isfinite(max)) return -1;
    const float lo = max - 104.0f * temp; /* expf((l - max) / temp) below is 0 */
    fill_bins(h, v, k, lo, (float)HIST_BINS / (max - lo), temp);
    int last = HIST_BINS - 1;
    while (last > 0 && h->start[last + 1] == h->start[last]) last--;
    /* the normalizer: every nonzero term is in the bins (the walk's exact one but for the order of the sums) */
    double z = 0.0;
    for (int kb = 0; kb <= last; kb++) z += h->tsum[kb];
    return hist_draw(h, max, temp, z, r, last, (int)(h->start[last + 1] - h->start[last]), tmp);
}
