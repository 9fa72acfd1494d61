/*
 * sample_hist.c — top-k off over many candidates (a flat distribution: thousands of ids within reach of the
 * maximum) without sorting them. One pass over the logits puts every id from lo up into HIST_BINS bins of a
 * power-of-two width w below the maximum, and adds per bin its count and the sums of e, e^2 and e^3, e being
 * each id's offset from its bin's centre c (hist_moments): no exponential per id. A bin's terms then sum to
 * exp(c) (n + S1 + S2 / 2 + S3 / 6) at temperature 1 and exp(c / t) (n + S1 / t + ...) at t, within far less
 * than a float's rounding (|e| <= w / 2), and the bins' sums give top-p's normalizer. min-p's boundary, top-p's
 * crossing and the draw's crossing each take whole the bins whose sums lie clearly before them, and gather (a
 * search of the bins for one bin's ids), sort and walk, with the definition's arithmetic (sample.c's cut_walk,
 * draw and all_walk), only the few bins where they may fall. Each decision is the sorted walk's wherever it lies
 * further from its boundary than the bound of the difference between the two cumulatives (the bins' sums are of
 * exp, the definition's of expf, each probability rounded to float, the normalizers differ; see `margins`);
 * nearer, the walk's cumulative is computed exactly (see "exact resolution" below); where even that cannot be
 * had, -1, and the caller walks sorted.
 */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "sample/sample_internal.h"

/* The bins span HIST_SPAN below the maximum for a top-p normalizer or a draw without cut (in units of the
 * temperature there): the terms below, e^-32 of the maximum's each, are left out of the sums (their bound is in
 * the margins). For min-p alone, they span min-p's floor. */
#define HIST_SPAN 32.0f
/* Below this temperature the moments' series (in offsets over the temperature) would not converge usefully: the
 * sorted walk decides (it reads few ids there). */
#define HIST_MIN_TEMP 1e-3f
#define ULP 0x1p-24                  /* a float's relative rounding */
#define EXPF_ERR (1.004 * ULP)       /* glibc's expf: within 0.502 ulp */
#define ABS_SLACK 1e-12              /* the double sums over bins, the recurrences of exp(c) */

int sample_hist_init(sample_hist *h, int n_vocab) {
    memset(h, 0, sizeof *h);
    const size_t nid = (size_t)(n_vocab + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK * SAMPLE_BLOCK;
    h->mom = kiln_calloc(4 * (HIST_BINS + HIST_DUMP), sizeof *h->mom);
    h->sums = kiln_calloc(2 * HIST_BINS, sizeof *h->sums);
    h->bin = kiln_calloc(nid, sizeof *h->bin);
    h->ids = kiln_calloc(nid + 16, sizeof *h->ids);
    h->ord = kiln_calloc((size_t)n_vocab, sizeof *h->ord);
    h->terms = kiln_calloc(nid, sizeof *h->terms);
    if (!h->mom || !h->sums || !h->bin || !h->ids || !h->ord || !h->terms) return -1;
    /* touched now, so that no later call pays for their pages (first-call contract) */
    memset(h->mom, 0, 4 * (HIST_BINS + HIST_DUMP) * sizeof *h->mom);
    memset(h->sums, 0, 2 * HIST_BINS * sizeof *h->sums);
    memset(h->bin, 0, nid * sizeof *h->bin);
    memset(h->ids, 0, (nid + 16) * sizeof *h->ids);
    memset(h->ord, 0, (size_t)n_vocab * sizeof *h->ord);
    memset(h->terms, 0, nid * sizeof *h->terms);
    return 0;
}

void sample_hist_free(sample_hist *h) {
    kiln_free(h->mom);
    kiln_free(h->sums);
    kiln_free(h->bin);
    kiln_free(h->ids);
    kiln_free(h->ord);
    kiln_free(h->terms);
    memset(h, 0, sizeof *h);
}

bool sample_hist_wanted(const sample_view *v) {
    int wide = 0; /* blocks whose maximum is within 6 of the maximum: the first band's blocks */
    for (int b = 0; b < v->nb; b++) wide += v->bm[b] >= v->max - 6.0f;
    return wide >= HIST_MIN_BLOCKS;
}

/* Bin kb's sums of terms at temperature 1 and at the call's temperature; whether it has members. */
static inline double sum1(const sample_hist *h, int kb) { return h->sums[2 * kb]; }
static inline double sumt(const sample_hist *h, int kb) { return h->sums[2 * kb + 1]; }
static inline bool bin_used(const sample_hist *h, int kb) { return kb < h->n_used && h->mom[4 * kb] > 0.0; }

/* Per bin below n_used its sums at 1 and at the temperature from its moments: exp(c / t) (n + S1 / t + S2 / 2t^2
 * + S3 / 6t^3), exp(c) by a recurrence over eight interleaved chains (c = -(kb + 1/2) w). Returns the largest count. */
static double bin_sums(sample_hist *h) {
    const double w = h->w, it = 1.0 / h->temp;
    double e1[8], et[8];
    for (int j = 0; j < 8; j++) e1[j] = exp(-(j + 0.5) * w), et[j] = exp(-(j + 0.5) * w * it);
    const double r1 = exp(-8.0 * w), rt = exp(-8.0 * w * it);
    double n_max = 0.0;
    for (int kb0 = 0; kb0 < h->n_used; kb0 += 8)
        for (int j = 0; j < 8; j++) {
            const double *q = h->mom + 4 * (kb0 + j);
            const double n = q[0], s1 = q[1], s2 = q[2] * 0.5, s3 = q[3] * (1.0 / 6.0);
            h->sums[2 * (kb0 + j)] = e1[j] * (n + (s1 + (s2 + s3)));
            h->sums[2 * (kb0 + j) + 1] = et[j] * (n + it * (s1 + it * (s2 + it * s3)));
            n_max = q[0] > n_max ? q[0] : n_max;
            e1[j] *= r1, et[j] *= rt;
        }
    return n_max;
}

/* The moments' relative error in a bin's sum at scaled half-width a (half the bin over the temperature): the
 * series' truncation after e^3, e's rounding to float (ULP a), and the double sums of e and e^2 (n ids: n 2^-53
 * of sum |e| <= n a). */
static double moment_err(double a, double n_max) {
    return pow(a, 4) / 24.0 * exp(a) + 1.01 * ULP * a + 1.1 * (n_max + 1.0) * 0x1p-53 * a * (1.0 + a) + ABS_SLACK;
}

/* The pass: per id its bin, per bin the moments, then the bins' sums and their error bounds for a call at
 * temperature temp whose bins span at least `span` below the maximum. A block whose maximum lies below `skip`
 * (min-p's floor: none of its ids can be kept) is not binned: its exact temperature-1 terms (expf's, as the
 * definition's) are summed instead and returned, for top-p's normalizer (skip -inf: none; 0 returned). */
static double fill_bins(sample_hist *h, const sample_view *v, const sample_kernels *k, float span, float temp,
                        float skip) {
    const float max = v->max;
    memset(h->mom, 0, 4 * (size_t)h->n_used * sizeof *h->mom); /* the previous call's bins; the rest stayed 0 */
    int ex;
    const float f = frexpf(span / (float)HIST_BINS, &ex);
    h->w = ldexpf(1.0f, f == 0.5f ? ex - 1 : ex); /* the least power of two >= span / HIST_BINS */
    h->lo = max - (float)HIST_BINS * h->w;
    h->temp = temp;
    h->n_gathered = h->n_ord = 0;
    h->z_exact = 0.0;
    h->terms_temp = 0.0f;
    int n_used = 0;
    double skipped = 0.0;
    for (int b = 0; b < v->nb; b++) {
        uint16_t *bin = h->bin + (size_t)b * SAMPLE_BLOCK;
        if (!(v->bm[b] >= h->lo) || v->bm[b] < skip) {
            for (int j = 0; j < SAMPLE_BLOCK; j++) bin[j] = (uint16_t)(HIST_BINS + j % HIST_DUMP);
            if (v->bm[b] < skip) skipped = k->exp_sum(sample_view_block(v, b), 1, max, 1.0f, skipped);
            continue;
        }
        /* a partial block: -inf pads */
        const int top = k->hist_moments(sample_view_block(v, b), max, h->lo, h->w, bin, h->mom);
        n_used = top >= n_used ? top + 1 : n_used;
    }
    h->n_used = n_used;
    const double n_max = bin_sums(h);
    /* half a bin, with room for the rounding of lo and of max - logit */
    const double half = 0.5 * h->w + ldexp(fabs(max) + fabs(h->lo), -22);
    /* plus the double additions of the walk's cumulative and of the bins' (one rounding each per id) */
    const double dsum = 2.0 * (double)v->nv * 0x1p-53;
    h->err1 = moment_err(half, n_max) + dsum;
    h->errt = moment_err(half / temp, n_max) + dsum;
    const double below = (double)max - (double)h->lo; /* every id below lo lies at least this below max */
    h->tail1 = (double)v->nv * exp(-below);
    h->tailt = (double)v->nv * exp(-below / temp);
    return skipped;
}

/* The bin of logit l as hist_moments gives it (HIST_BINS below lo). */
static inline int bin_of(const sample_hist *h, float max, float l) {
    const float d = (max - l) * (1.0f / h->w);
    return !(l >= h->lo) ? HIST_BINS : d < (float)HIST_BINS ? (int)d : HIST_BINS - 1;
}

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

/* ---- margins: how far a cumulative from the bins' sums can lie from the sorted walk's.
 * The walk adds p = (float)(expf(u) / Z) (u = logit - max at temperature 1, fl((logit - max) / t) at t) over the
 * exact normalizer Z; the histogram adds a bin's sum over the approximate normalizer Z' (relative error eps),
 * or a gathered member's (float)(expf(u) / Z'). A bin's sum is of exp((logit - max) / t) within err: against
 * expf(u), EXPF_ERR, plus, at a temperature other than 1, the rounding of u (ULP |u|, |u| < (kb + 1) w / t in bin
 * kb); against p, one rounding (ULP) and eps. A member's term differs from p by two roundings and eps. So a
 * cumulative c through bin kb lies within c (EXPF_ERR + ULP + err + ULP |u|max + eps) + ABS_SLACK of the walk's
 * (EXPF_ERR >= ULP covers the members' second rounding). */

/* At temperature 1 (the cut): the bins' cumulative over the approximate normalizer. */
static double cut_rel(const sample_hist *h) { return EXPF_ERR + ULP + h->err1 + h->eps_z; }

/* A bound of |u| at the temperature for ids at most n bins below the maximum (n w below it): 0 at temperature 1,
 * where u is exact. */
static double u_bound(const sample_hist *h, double n) {
    return h->temp == 1.0f ? 0.0 : n * h->w / h->temp * (1.0 + 1e-6) + 1e-6;
}

/* At the temperature (the draw), through bin kb, with eps the draw's normalizer's error. */
static double draw_rel(const sample_hist *h, int kb, double eps) {
    return EXPF_ERR + ULP + h->errt + ULP * u_bound(h, kb + 1.0) + eps;
}

/* Whether cumulative c (relative error rel) may lie on the other side of `at` than it does. */
static inline bool near(double c, double at, double rel) { return fabs(c - at) <= rel * c + ABS_SLACK; }

/* ---- exact resolution: where a decision falls within its margin of its boundary, the walk's cumulative is
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

/* t[j] = expf((x[j] - max) / temp) bit for bit over one block, by the histogram's kernel; returns z plus the
 * block's exact temperature-1 sum (sample_exp_sum's). */
static double block_terms(const sample_kernels *k, const float *x, float max, float temp, float *t, double z) {
    float e1[SAMPLE_BLOCK];
    uint16_t bin[SAMPLE_BLOCK];
    return k->hist_block(x, max, temp, INFINITY, 1.0f, e1, t, bin, z);
}

/* The terms expf((l - max) / temp) of every block that holds an id of a bin below kb, in h->terms: computed
 * once per call and temperature (a later call for a lower kb reads them). */
static const float *terms_below(sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, float temp) {
    if (h->terms_temp == temp && kb <= h->terms_kb) return h->terms;
    for (int b = 0; b < v->nb; b++)
        if (bin_of(h, v->max, v->bm[b]) < kb) /* the block's maximum's bin is its least */
            (void)block_terms(k, sample_view_block(v, b), v->max, temp, h->terms + (size_t)b * SAMPLE_BLOCK, 0.0);
    h->terms_temp = temp, h->terms_kb = kb;
    return h->terms;
}

/* The exact top-p normalizer (sample_view_exp_sum's with k->exp_sum, bit for bit: the blocks in order, each in
 * SAMPLE_SUM_ORDER), summed once per call when needed; its pass keeps every term at temperature 1. */
static double exact_z(sample_hist *h, const sample_view *v, const sample_kernels *k) {
    if (h->z_exact == 0.0) {
        double z = 0.0;
        for (int b = 0; b < v->nb; b++)
            z = block_terms(k, sample_view_block(v, b), v->max, 1.0f, h->terms + (size_t)b * SAMPLE_BLOCK, z);
        h->z_exact = z;
        h->terms_temp = 1.0f, h->terms_kb = HIST_BINS + 1;
    }
    return h->z_exact;
}

/* The terms (float)(expf((l - max) / temp) / norm) of the ids whose bin is below kb, summed into *sum (norm 1:
 * the terms themselves); returns the least (1 when none). */
static float prefix_terms(sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, float temp,
                          double norm, double *sum) {
    const float *t = terms_below(h, v, k, kb, temp);
    double acc = 0.0;
    float least = 1.0f;
    for (int b = 0; b < v->nb; b++)
        if (bin_of(h, v->max, v->bm[b]) < kb)
            k->prefix_block(t + (size_t)b * SAMPLE_BLOCK, h->bin + (size_t)b * SAMPLE_BLOCK, kb, norm, &acc, &least);
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
static bool exact_prefix(sample_hist *h, const sample_view *v, const sample_kernels *k, int kb, float temp,
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
                     int kb, double z, float thr, bool floor_in_bins, uint64_t *tmp, int *last, int *n_last) {
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
    return floor_in_bins ? 0 : -1;
}

/* exact_cut with the exact normalizer (1 without top-p) and its min-p threshold. */
static int cut_exactly(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                       int kb, bool floor_in_bins, uint64_t *tmp, int *last, int *n_last) {
    const double z = p->top_p < 1.0f ? exact_z(h, v, k) : 1.0;
    return exact_cut(h, v, k, p, kb, z, (float)(1.0 / z) * p->min_p, floor_in_bins, tmp, last, n_last);
}

/* Whether min-p passes every logit bin kb can hold by far: its lower edge's p clears the threshold with room
 * for the roundings and for the normalizer's error. */
static bool min_p_passes_bin(const sample_hist *h, int kb, float max, double z, float thr) {
    const float edge = max - ((float)kb + 1.01f) * h->w;
    return (double)(float)(expf(edge - max) / z) >= (double)thr * (1.0 + 4e-6 + 2.0 * h->eps_z);
}

/* The bins min-p passes whole: min_p_passes_bin holds for kb below the result and for none from it (its edge
 * falls with kb, and each step of the test is monotone), found by bisection instead of bin by bin. */
static int min_p_whole_bins(const sample_hist *h, float max, double z, float thr) {
    int lo = 0, hi = HIST_BINS; /* passes below lo, fails from hi */
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (min_p_passes_bin(h, mid, max, z, thr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The cut: the bin `*last` and the number `*n_last` of its sorted members that the walk keeps (-1: all, the bin
 * taken whole; every member of the bins before it kept), as cut_walk with the exact normalizer decides, from the
 * approximate normalizer z (relative error h->eps_z); 0, or -1 when the walk would go on below lo (min-p's floor
 * not within the bins, where the walk ends), it would gather too many bins, or a decision near its boundary
 * cannot be resolved exactly. */
static int hist_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                    bool floor_in_bins, double z, uint64_t *tmp, int *last, int *n_last) {
    const float max = v->max;
    const int top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    const float thr = (float)(1.0 / z) * p->min_p; /* the maximum's p times min-p, as cut_walk's first candidate */
    const int minp_whole = min_p ? min_p_whole_bins(h, max, z, thr) : HIST_BINS;
    const double rel = cut_rel(h), tp = p->top_p, thr_near = (2.0 * h->eps_z + 6.0 * ULP) * thr;
    double cum = 0.0;
    for (int kb = 0; kb < h->n_used; kb++) {
        if (!bin_used(h, kb)) continue;
        /* whole: top-p not reached through this bin, and min-p passes its lowest possible logit by far */
        const double next = cum + sum1(h, kb) / z;
        *last = kb, *n_last = -1;
        if ((!top_p || (next < tp && !near(next, tp, rel))) && kb < minp_whole) {
            cum = next;
            continue;
        }
        int n;
        const cand *c = members(h, v, k, kb, &n, tmp);
        if (!c) return -1;
        for (int i = 0; i < n; i++) {
            const float pi = (float)(expf(c[i].logit - max) / z);
            if (min_p && !(kb == 0 && i == 0)) {
                if (h->eps_z > 0.0 && fabs((double)pi - thr) <= thr_near)
                    return cut_exactly(h, v, k, p, kb, floor_in_bins, tmp, last, n_last);
                if (pi < thr) { *n_last = i; return 0; }
            }
            cum += pi;
            if (top_p && cum >= tp) {
                if (near(cum, tp, rel) || near(cum - pi, tp, rel))
                    return cut_exactly(h, v, k, p, kb, floor_in_bins, tmp, last, n_last);
                *n_last = i + 1;
                return 0;
            }
        }
    }
    /* the walk went past every bin: it ends at min-p's floor, else it would go on below lo */
    if (!floor_in_bins || (top_p && near(cum, tp, rel))) return -1;
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

/* The draw's walk from bin kb (r near a cumulative there), exactly: the drawn id, or -1. */
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
 * softmax at the call's temperature with approximate normalizer s (relative error eps), as sample.c's draw (cut)
 * or all_walk walks it; the first whose cumulative passes r, or -1 (r beyond the rounded total: the walk's
 * last, too many bins, or r near a cumulative that cannot be resolved exactly). */
static int32_t hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, bool cut, double s,
                         double eps, double r, int last, int n_last, uint64_t *tmp) {
    const float max = v->max, temp = h->temp;
    double cum = 0.0;
    for (int kb = 0; kb <= last; kb++) {
        if (!bin_used(h, kb)) continue;
        const double rel = draw_rel(h, kb, eps), next = cum + sumt(h, kb) / s;
        if (kb < last && next < r && !near(next, r, rel)) {
            cum = next;
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
                return near(cum, r, rel) || near(prev, r, rel)
                           ? exact_draw(h, v, k, temp, cut, r, kb, last, n_last, tmp)
                           : c[i].id;
        }
    }
    return -1;
}

/* The relative error of a draw's normalizer summed from bins 0..last (the sums at the temperature: s_u their sum
 * weighted by kb + 1, for the rounding of u; members' terms are exact), plus `tail` for the terms left out. */
static double draw_norm_err(const sample_hist *h, double s, double s_u, double tail) {
    return EXPF_ERR + h->errt + ULP * u_bound(h, s_u / s) + tail + ABS_SLACK; /* |u| averaged by the terms */
}

int32_t sample_hist_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                        double r, uint64_t *tmp) {
    const float max = v->max, temp = p->temperature;
    const bool top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    if (!isfinite(max) || (!top_p && !min_p) || !(temp >= HIST_MIN_TEMP)) return -1;
    /* the bins: HIST_SPAN for top-p's normalizer, at least down to min-p's floor */
    const float floor = min_p ? sample_min_p_floor(max, p->min_p) : -INFINITY;
    float span = top_p ? HIST_SPAN : 0.0f;
    if (min_p && (max - floor) * 1.001f > span) span = (max - floor) * 1.001f;
    /* the blocks wholly under min-p's floor only add to top-p's normalizer: summed exactly, not binned */
    const double skipped = fill_bins(h, v, k, span, temp, top_p ? floor : -INFINITY);
    const bool floor_in_bins = min_p && floor >= h->lo;
    /* top-p's normalizer from the bins and the skipped blocks (the maximum's term is 1, so the tail's bound is
     * relative; the skipped blocks' terms are exact), else 1 */
    double z = 1.0;
    h->eps_z = 0.0;
    if (top_p) {
        z = skipped;
        for (int kb = 0; kb < h->n_used; kb++) z += sum1(h, kb);
        h->eps_z = EXPF_ERR + h->err1 + h->tail1 + ABS_SLACK;
    }
    int last = -1, n_last = 0;
    if (hist_cut(h, v, k, p, floor_in_bins, z, tmp, &last, &n_last) < 0 || last < 0) return -1;
    /* the draw over what the cut keeps: softmax at the temperature, its normalizer from the bins before `last`
     * and the kept members of `last` (the whole bin's sum where it keeps them all) */
    double s = 0.0, s_u = 0.0;
    for (int kb = 0; kb < last; kb++) s += sumt(h, kb), s_u += sumt(h, kb) * (kb + 1);
    if (n_last < 0) {
        s += sumt(h, last), s_u += sumt(h, last) * (last + 1);
    } else {
        int n;
        const cand *cl = members(h, v, k, last, &n, tmp); /* gathered by the cut already */
        for (int i = 0; i < n_last; i++) s += expf((cl[i].logit - max) / temp);
    }
    return hist_draw(h, v, k, true, s, draw_norm_err(h, s, s_u, 0.0), r, last, n_last, tmp);
}

int32_t sample_hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, double r,
                         uint64_t *tmp) {
    if (!isfinite(v->max) || !(temp >= HIST_MIN_TEMP)) return -1;
    (void)fill_bins(h, v, k, HIST_SPAN * temp, temp, -INFINITY);
    if (h->n_used == 0) return -1;
    /* the normalizer: the bins' sums (the maximum's term is 1), the terms below lo in the error bound */
    double z = 0.0, z_u = 0.0;
    for (int kb = 0; kb < h->n_used; kb++) z += sumt(h, kb), z_u += sumt(h, kb) * (kb + 1);
    return hist_draw(h, v, k, false, z, draw_norm_err(h, z, z_u, h->tailt), r, h->n_used - 1, -1, tmp);
}
