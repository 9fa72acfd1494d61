/*
 * sample_hist.c — top-k off over many candidates (a flat distribution: thousands of ids within reach of the
 * maximum) without sorting them. One pass over the logits puts every candidate that can matter into HIST_BINS
 * bins linear in the logit, from the lowest logit that can matter (min-p's floor, else HIST_SPAN below it)
 * to the maximum: per id its bin, per bin the sums of its terms (expf's, bit for bit) at
 * temperature 1 and at the sampling temperature; the same pass sums top-p's exact normalizer. Then min-p's
 * boundary, top-p's crossing and the draw's crossing each take whole the bins whose sums lie clearly before
 * them, and gather (a search of the bins for one bin's ids), sort and walk, with the definition's arithmetic
 * (sample.c's cut_walk, draw and all_walk), only the few bins where they may fall. Each decision is the sorted
 * walk's (with the exact normalizer, whose p it computes bit for bit) wherever it lies further than HIST_MARGIN
 * from its boundary (the bins' sums differ from the walk's cumulative only by the float rounding of each
 * probability and the order of the additions); nearer, the walk's cumulative is computed exactly (see "exact
 * resolution" below); where even that cannot be had, -1, and the caller walks sorted.
 */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "sample/sample_internal.h"

/* A cumulative from the bins' sums of exact terms lies within this of the sorted walk's (one float rounding per
 * probability, 2^-24 of the cumulative, and the order of the double additions), with room to spare. */
#define HIST_MARGIN 1e-7

/* The bins span [max - HIST_SPAN, max] (in units of the temperature for the draw without cut), or from min-p's
 * floor where it lies higher: e^-24 ~ 4e-11 of the maximum's term, so a walk that would go further (top-p
 * above 1 - ~1e-5) gives up (-1) instead. Below: bin HIST_BINS, summed but never walked. */
#define HIST_SPAN 24.0f

int sample_hist_init(sample_hist *h, int n_vocab) {
    memset(h, 0, sizeof *h);
    const size_t nid = (size_t)(n_vocab + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK * SAMPLE_BLOCK;
    h->sums = kiln_calloc(2 * (HIST_BINS + HIST_DUMP), sizeof *h->sums);
    h->bin = kiln_calloc(nid, sizeof *h->bin);
    h->ids = kiln_calloc(nid + 16, sizeof *h->ids);
    h->ord = kiln_calloc((size_t)n_vocab, sizeof *h->ord);
    if (!h->sums || !h->bin || !h->ids || !h->ord) return -1;
    /* touched now, so that no later call pays for their pages (first-call contract) */
    memset(h->sums, 0, 2 * (HIST_BINS + HIST_DUMP) * sizeof *h->sums);
    memset(h->bin, 0, nid * sizeof *h->bin);
    memset(h->ids, 0, (nid + 16) * sizeof *h->ids);
    memset(h->ord, 0, (size_t)n_vocab * sizeof *h->ord);
    return 0;
}

void sample_hist_free(sample_hist *h) {
    kiln_free(h->sums);
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

/* One block's terms added to their bins' sums (et NULL: only the temperature-1 sums); the ids below lo are in
 * bin HIST_BINS (summed but never walked), its sums spread over HIST_DUMP slots by id (hist_block's bin values
 * HIST_BINS + j % HIST_DUMP): a run of ids below lo, most of a block under min-p's floor, added into one slot
 * was a chain through memory, 63% of a call over N(0, 1) logits. */
static void scatter(double *restrict sums, const uint16_t *bin, const float *e1, const float *et) {
    if (et) {
        for (int j = 0; j < SAMPLE_BLOCK; j++) {
            double *q = sums + 2 * bin[j];
            q[0] += e1[j];
            q[1] += et[j];
        }
    } else {
        for (int j = 0; j < SAMPLE_BLOCK; j++) sums[2 * bin[j]] += e1[j];
    }
}

/* Bin kb's sums of terms at temperature 1 and at the call's temperature. */
static inline double sum1(const sample_hist *h, int kb) { return h->sums[2 * kb]; }
static inline double sumt(const sample_hist *h, int kb) { return h->sums[2 * kb + h->at_temp]; }

enum { FILL_Z1 = 1, FILL_REST = 2 };

/* The pass: per id its bin (HIST_BINS below lo), per bin the terms' sums. Returns with FILL_Z1 the exact
 * temperature-1 normalizer of every id, sample_view_exp_sum's with k->exp_sum bit for bit (the blocks in the
 * same order, each summed in SAMPLE_SUM_ORDER); with FILL_REST the sum at the temperature of the blocks left
 * out whole (their maximum below lo); else 0. */
static double fill_bins(sample_hist *h, const sample_view *v, const sample_kernels *k, float lo, float scale,
                        float temp, int want) {
    const float max = v->max;
    const float zlo = want == FILL_Z1 ? max - 120.0f : max - 120.0f * temp; /* below: terms that expf makes 0 */
    const float zt = want == FILL_Z1 ? 1.0f : temp;
    const bool one = temp == 1.0f; /* the terms at the temperature are those at 1 */
    memset(h->sums, 0, 2 * (HIST_BINS + HIST_DUMP) * sizeof *h->sums);
    h->at_temp = !one;
    h->lo = lo, h->scale = scale;
    h->n_gathered = h->n_ord = 0;
    float e1[SAMPLE_BLOCK], et[SAMPLE_BLOCK];
    double z = 0.0, rest = 0.0;
    for (int b = 0; b < v->nb; b++) {
        const float *x = sample_view_block(v, b); /* a partial last block is padded with -inf */
        uint16_t *bin = h->bin + (size_t)b * SAMPLE_BLOCK;
        if (!(v->bm[b] >= lo)) {
            for (int j = 0; j < SAMPLE_BLOCK; j++) bin[j] = (uint16_t)(HIST_BINS + j % HIST_DUMP);
            if (want == FILL_Z1 && v->bm[b] >= zlo) z = k->exp_sum(x, 1, max, zt, z);
            if (want == FILL_REST && v->bm[b] >= zlo) rest = k->exp_sum(x, 1, max, zt, rest);
            continue;
        }
        z = k->hist_block(x, max, temp, lo, scale, e1, et, bin, z);
        scatter(h->sums, bin, e1, one ? NULL : et);
    }
    return want == FILL_Z1 ? z : rest;
}

/* The bin of logit l as hist_block gives it (HIST_BINS below lo). */
static inline int bin_of(const sample_hist *h, float max, float l) {
    const float d = (max - l) * h->scale;
    return !(l >= h->lo) ? HIST_BINS : d < (float)HIST_BINS ? (int)d : HIST_BINS - 1;
}

/* Whether bin kb has members: every id in it has a positive term at 1 or at the temperature (lo lies within
 * HIST_SPAN of the maximum, in units of the temperature for the draw without cut). */
static inline bool bin_used(const sample_hist *h, int kb) { return sum1(h, kb) > 0.0 || sumt(h, kb) > 0.0; }

/* Bin kb's members, sorted (sample_cand_sort), into *n; gathered once per call into ord. NULL when the call
 * has gathered HIST_MAX_GATHER bins already. */
static const cand *members(sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, int *n,
                           uint64_t *tmp) {
    for (int g = 0; g < h->n_gathered; g++)
        if (h->gathered[g].kb == kb) { *n = h->gathered[g].n; return h->ord + h->gathered[g].off; }
    if (h->n_gathered == HIST_MAX_GATHER) return NULL;
    const int c = k->bin_find(h->bin, v->nb * SAMPLE_BLOCK, (uint16_t)kb, h->ids);
    cand *o = h->ord + h->n_ord;
    for (int i = 0; i < c; i++) o[i] = (cand){h->ids[i], sample_view_logit(v, h->ids[i]), 0.0f};
    sample_cand_sort(o, c, tmp);
    h->gathered[h->n_gathered++] = (hist_gathered){kb, h->n_ord, c};
    h->n_ord += c;
    *n = c;
    return o;
}

/* ---- exact resolution: where a decision falls within HIST_MARGIN of its boundary, the walk's cumulative is
 * computed exactly instead. A sum in double of floats q >= 2^-29 whose partial sums stay below 2 is exact (each
 * q a multiple of 2^-52), so in whatever order: the sorted walk's cumulative at a bin's start is then the sum
 * over the ids of the bins before it, whatever the order the walk met them in. Where some term is smaller, the
 * resolution gives up (-1). */
#define EXACT_MIN_TERM 0x1p-29

/* The previous bin before kb with members, or -1. */
static int prev_used(const sample_hist *h, int kb) {
    while (--kb >= 0 && !bin_used(h, kb)) {}
    return kb;
}

/* t[j] = expf((x[j] - max) / temp) bit for bit over one block, by the histogram's kernel. */
static void block_terms(const sample_kernels *k, const float *x, float max, float temp, float *t) {
    float e1[SAMPLE_BLOCK];
    uint16_t bin[SAMPLE_BLOCK];
    (void)k->hist_block(x, max, temp, INFINITY, 1.0f, e1, t, bin, 0.0);
}

/* The terms (float)(expf((l - max) / temp) / norm) of the ids whose bin is below kb, summed into *sum (norm 1:
 * the terms themselves); returns the least (1 when none). */
static float prefix_terms(const sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, float temp,
                          double norm, double *sum) {
    double acc = 0.0;
    float least = 1.0f, t[SAMPLE_BLOCK];
    for (int b = 0; b < v->nb; b++) {
        const uint16_t *bin = h->bin + (size_t)b * SAMPLE_BLOCK;
        if (bin_of(h, v->max, v->bm[b]) >= kb) continue; /* the block's maximum's bin is its least */
        block_terms(k, sample_view_block(v, b), v->max, temp, t);
        for (int j = 0; j < SAMPLE_BLOCK; j++) {
            if (bin[j] >= kb) continue;
            const float q = (float)(t[j] / norm);
            acc += q;
            least = q < least ? q : least;
        }
    }
    *sum = acc;
    return least;
}

/* The same over the first n of a bin's sorted members, as the walk meets them. */
static float member_terms(const cand *m, int n, float max, float temp, double norm, double *sum) {
    double acc = 0.0;
    float least = 1.0f;
    for (int i = 0; i < n; i++) {
        const float q = (float)(expf((m[i].logit - max) / temp) / norm);
        acc += q;
        least = q < least ? q : least;
    }
    *sum = acc;
    return least;
}

/* The cumulative of the bins below kb, exactly; false when a term is below EXACT_MIN_TERM (it might not be). */
static bool exact_prefix(const sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, float temp,
                         double norm, double *c) {
    return prefix_terms(h, v, k, kb, temp, norm, c) >= EXACT_MIN_TERM;
}

/* From bin kb, where the exact cumulative is *c, back to the bin whose walk the cumulative crosses `at` in
 * (*c then its start's, still exact; `strict`: crossed means at < cum, else at <= cum): the bin, or -1. */
static int exact_back(sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, float temp,
                      double norm, double at, bool strict, double *c, uint64_t *tmp) {
    while (strict ? at < *c : at <= *c) {
        if ((kb = prev_used(h, kb)) < 0) return -1;
        int n;
        double sum;
        const cand *m = members(h, v, k, kb, &n, tmp);
        if (!m || member_terms(m, n, v->max, temp, norm, &sum) < EXACT_MIN_TERM) return -1;
        *c -= sum;
    }
    return kb;
}

/* cut_walk's walk from bin kb (the first min-p may stop in is at or after it), exactly: the cut as hist_cut
 * gives it, or -1 (a term too small to sum exactly, too many bins, or the walk would go on below lo). */
static int exact_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                     int kb, double z, float thr, bool lo_is_floor, uint64_t *tmp, int *last, int *n_last) {
    const int top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    double c;
    if (!exact_prefix(h, v, k, kb, 1.0f, z, &c)) return -1;
    if (top_p && (kb = exact_back(h, v, k, kb, 1.0f, z, p->top_p, false, &c, tmp)) < 0) return -1;
    for (; kb < HIST_BINS; kb++) {
        if (!bin_used(h, kb)) continue;
        int n;
        const cand *m = members(h, v, k, kb, &n, tmp);
        if (!m) return -1;
        *last = kb, *n_last = -1;
        for (int i = 0; i < n; i++) {
            const float pi = (float)(expf(m[i].logit - v->max) / z);
            if (pi < EXACT_MIN_TERM) return -1;
            if (min_p && !(kb == 0 && i == 0) && pi < thr) { *n_last = i; return 0; }
            c += pi;
            if (top_p && c >= p->top_p) { *n_last = i + 1; return 0; }
        }
    }
    return lo_is_floor ? 0 : -1;
}

/* Whether min-p passes every logit bin kb can hold by far: its lower edge's p clears the threshold with room. */
static bool min_p_passes_bin(int kb, float max, float scale, double z, float thr) {
    const float edge = max - ((float)kb + 1.01f) / scale;
    return (float)(expf(edge - max) / z) >= thr * (1.0f + 4e-6f);
}

/* The bins min-p passes whole: min_p_passes_bin holds for kb below the result and for none from it (its edge
 * falls with kb, and each step of the test is monotone), found by bisection instead of bin by bin. */
static int min_p_whole_bins(float max, float scale, double z, float thr) {
    int lo = 0, hi = HIST_BINS; /* passes below lo, fails from hi */
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (min_p_passes_bin(mid, max, scale, z, thr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The cut: the bin `*last` and the number `*n_last` of its sorted members that the walk keeps (-1: all, the bin
 * taken whole; every member of the bins before it kept), as cut_walk with normalizer z decides; 0, or -1 when
 * the walk would go on below lo (lo not min-p's floor, where the walk ends), it would gather too many bins, or a
 * decision within the margin of its boundary cannot be resolved exactly. */
static int hist_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                    float scale, bool lo_is_floor, double z, uint64_t *tmp, int *last, int *n_last) {
    const float max = v->max;
    const int top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    const float thr = (float)(1.0 / z) * p->min_p; /* the maximum's p times min-p, as cut_walk's first candidate */
    const int minp_whole = min_p ? min_p_whole_bins(max, scale, z, thr) : HIST_BINS;
    double cum = 0.0;
    for (int kb = 0; kb < HIST_BINS; kb++) {
        if (!bin_used(h, kb)) continue;
        /* whole: top-p not reached through this bin, and min-p passes its lowest possible logit by far */
        const bool whole = (!top_p || cum + sum1(h, kb) / z < (double)p->top_p - HIST_MARGIN) && kb < minp_whole;
        *last = kb, *n_last = -1;
        if (whole) {
            cum += sum1(h, kb) / z;
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
                if (cum - p->top_p < HIST_MARGIN || p->top_p - (cum - pi) < HIST_MARGIN)
                    return exact_cut(h, v, k, p, kb, z, thr, lo_is_floor, tmp, last, n_last);
                *n_last = i + 1;
                return 0;
            }
        }
    }
    /* the walk went past every bin: it ends at min-p's floor, else it would go on below lo */
    if (!lo_is_floor || (top_p && (double)p->top_p - cum < HIST_MARGIN)) return -1;
    return 0;
}

/* The draw's normalizer as the definition sums it, exactly: after a cut, draw's softmax sum over the kept
 * candidates (exact when every term is at least 2^-29 of its power of two, so in any order); without a cut,
 * all_walk's (sample_view_exp_sum's). false when it cannot be had exactly. */
static bool exact_norm(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, bool cut,
                       int last, int n_last, uint64_t *tmp, double *s) {
    if (!cut) return *s = sample_view_exp_sum(v, k->exp_sum, temp), true;
    double sum, rest;
    int n;
    const cand *m = members(h, v, k, last, &n, tmp);
    if (!m) return false;
    /* the bins before `last` whole, then the kept members of `last` */
    const float l0 = prefix_terms(h, v, k, last, temp, 1.0, &sum);
    const float l1 = member_terms(m, n_last < 0 ? n : n_last, v->max, temp, 1.0, &rest);
    const float least = l0 < l1 ? l0 : l1;
    *s = sum + rest;
    return least >= ldexpf(1.0f, ilogb(*s) - 29); /* every term a multiple of 2^-52 of the sum's power of two */
}

/* The draw's walk from bin kb (r within the margin of a cumulative there), exactly: the drawn id, or -1. */
static int32_t exact_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, bool cut,
                          double r, int kb, int last, int n_last, uint64_t *tmp) {
    double s, c;
    if (!exact_norm(h, v, k, temp, cut, last, n_last, tmp, &s) || !exact_prefix(h, v, k, kb, temp, s, &c)) return -1;
    if ((kb = exact_back(h, v, k, kb, temp, s, r, true, &c, tmp)) < 0) return -1;
    for (; kb <= last; kb++) {
        if (!bin_used(h, kb)) continue;
        int n;
        const cand *m = members(h, v, k, kb, &n, tmp);
        if (!m) return -1;
        if (kb == last && n_last >= 0) n = n_last;
        for (int i = 0; i < n; i++) {
            const float q = (float)(expf((m[i].logit - v->max) / temp) / s);
            if (q < EXACT_MIN_TERM) return -1;
            c += q;
            if (r < c) return m[i].id;
        }
    }
    return -1;
}

/* The draw over the candidates of the bins before `last` and the first n_last (sorted; -1: all) of `last`:
 * softmax at the temperature with normalizer s, as sample.c's draw (cut) or all_walk walks it; the first whose
 * cumulative passes r, or -1 (r beyond the rounded total: the walk's last, too many bins, or r within
 * HIST_MARGIN of a cumulative that cannot be resolved exactly). */
static int32_t hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, bool cut,
                         double s, double r, int last, int n_last, uint64_t *tmp) {
    const float max = v->max;
    double cum = 0.0;
    for (int kb = 0; kb <= last; kb++) {
        if (!bin_used(h, kb)) continue;
        if (kb < last && cum + sumt(h, kb) / s < r - HIST_MARGIN) {
            cum += sumt(h, kb) / s;
            continue;
        }
        int n;
        const cand *c = members(h, v, k, kb, &n, tmp);
        if (!c) return -1;
        if (kb == last && n_last >= 0) n = n_last;
        for (int i = 0; i < n; i++) {
            const double prev = cum;
            cum += (float)(expf((c[i].logit - max) / temp) / s);
            if (r < cum)
                return cum - r < HIST_MARGIN || r - prev < HIST_MARGIN
                           ? exact_draw(h, v, k, temp, cut, r, kb, last, n_last, tmp)
                           : c[i].id;
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
    float lo = max - HIST_SPAN;
    bool lo_is_floor = false;
    if (p->min_p > 0.0f) {
        const float floor = sample_min_p_floor(max, p->min_p);
        if (floor >= lo) lo = floor, lo_is_floor = true;
    }
    const float scale = (float)HIST_BINS / (max - lo);
    const double zt = fill_bins(h, v, k, lo, scale, temp, top_p ? FILL_Z1 : 0);
    *z = top_p ? zt : 1.0;
    int last = -1, n_last = 0;
    if (hist_cut(h, v, k, p, scale, lo_is_floor, *z, tmp, &last, &n_last) < 0 || last < 0) return -1;
    /* the draw over what the cut keeps: softmax at the temperature, its normalizer from the bins before `last`
     * and the kept members of `last` (the whole bin's sum where it keeps them all) */
    double s = 0.0;
    for (int kb = 0; kb < last; kb++) s += sumt(h, kb);
    if (n_last < 0) {
        s += sumt(h, last);
    } else {
        int n;
        const cand *cl = members(h, v, k, last, &n, tmp); /* gathered by the cut already */
        for (int i = 0; i < n_last; i++) s += expf((cl[i].logit - max) / temp);
    }
    return hist_draw(h, v, k, temp, true, s, r, last, n_last, tmp);
}

int32_t sample_hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, double r,
                         uint64_t *tmp) {
    const float max = v->max;
    if (!isfinite(max)) return -1;
    const float lo = max - HIST_SPAN * temp;
    const double rest = fill_bins(h, v, k, lo, (float)HIST_BINS / (max - lo), temp, FILL_REST);
    int last = HIST_BINS - 1;
    while (last > 0 && !bin_used(h, last)) last--;
    /* the normalizer: the bins', the terms below lo (bin HIST_BINS and the blocks left out): the walk's exact one
     * but for the order of the sums */
    double z = rest;
    for (int kb = 0; kb < HIST_BINS + HIST_DUMP; kb++) z += sumt(h, kb);
    return hist_draw(h, v, k, temp, false, z, r, last, -1, tmp);
}
