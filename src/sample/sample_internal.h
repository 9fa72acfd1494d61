/*
 * sample_internal.h — the pieces of the sampler behind include/kiln.h's sampling API.
 *
 * A call never copies the vocabulary. The logits are read in blocks of SAMPLE_BLOCK floats through a
 * "view": the few blocks that hold a penalized id (and the partial last block) are copied into a side
 * buffer with the penalized values substituted (the last block padded with -inf), every other block is
 * read in place. One pass records each block's maximum; later passes skip every block whose maximum is
 * below what they look for, so that top-k and the bands of top-p / min-p / the draw touch only the blocks
 * that can contribute.
 *
 * Files: sample.c (API, the chain), sample_penalty.c (repetition, presence, frequency), sample_view.c (the
 * view and the passes over it), sample_cand.c (candidate sorting, top-n heap), sample_hist.c (top-k off over
 * many candidates by histogram), sample_kernels.c (scalar reference kernels, dispatch) and
 * sample_kernels_avx2.c, sample_kernels_avx512.c (their AVX2 and AVX-512 variants).
 */
#ifndef KILN_SAMPLE_INTERNAL_H
#define KILN_SAMPLE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>

#include "kiln.h"

#define SAMPLE_BLOCK 64

typedef struct cand { int32_t id; float logit; float p; } cand;

/* ---- kernels (sample_kernels.c, sample_kernels_avx2.c) ---- */

/* bm[b] = max of x[b*64 .. b*64+64) for b < nblk (x holds nblk full blocks). */
typedef void (*sample_block_max_fn)(const float *x, int nblk, float *bm);
/* z plus the sum over the nblk blocks of x of the terms (double)expf((x[i] - m) / temp) (the definition's
 * softmax terms: same float expression, same expf), added to z block after block. Exact variants (exp_sum)
 * sum each block in one order, SAMPLE_SUM_ORDER, so that every variant returns the same double. */
typedef double (*sample_exp_sum_fn)(const float *x, int nblk, float m, float temp, double z);
/* SAMPLE_SUM_ORDER: within a block of 64 terms t[], lane l = 0..7 adds t[l], t[l + 8], ..., t[l + 56] in
 * turn from 0, then the block's sum is ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */

/* One block of exact terms (sample_hist.c's exact resolution and its normalizer), x[0..64): e1[j] = expf(x[j] - m) and et[j] = expf((x[j] - m) /
 * temp) bit for bit, bin[j] = min((int)((m - x[j]) * scale), HIST_BINS - 1) where x[j] >= lo, else
 * HIST_BINS + j % HIST_DUMP (also for NaN); returns z plus the block's exact temperature-1 sum (as exp_sum's). */
typedef double (*sample_hist_block_fn)(const float *x, float m, float temp, float lo, float scale, float *e1,
                                       float *et, uint16_t *bin, double z);
/* One block of the histogram's moments (sample_hist.c), x[0..64), bins of width w (a power of two) below m:
 * bin[j] = min((int)((m - x[j]) / w), HIST_BINS - 1) where x[j] >= lo, else HIST_BINS + j % HIST_DUMP (also for
 * NaN); for each id from lo up, in id order, mom[4 bin .. 4 bin + 3] += (1, e, e^2, e^3) in double, where
 * e = (x[j] - m) - c in float is the id's offset from its bin's centre c = -(bin + 1/2) w (x[j] - m being the
 * definition's argument of expf). Returns the highest bin an id went to (-1: none). */
typedef int (*sample_hist_moments_fn)(const float *x, float m, float lo, float w, uint16_t *bin, double *mom);
/* One block's share of an exact cumulative (sample_hist.c): over the ids j of the block with bin[j] < kb, the
 * terms q = (float)(t[j] / norm) summed in SAMPLE_SUM_ORDER (0 for the others) and added to *acc, and *least
 * lowered to the least such q. */
typedef void (*sample_prefix_block_fn)(const float *t, const uint16_t *bin, int kb, double norm, double *acc,
                                       float *least);
/* The indices i < n (n a multiple of 64) with bin[i] == kb, ascending, into ids (room for n + 16: the SIMD
 * variants store whole vectors past the count); returns their count. */
typedef int (*sample_bin_find_fn)(const uint16_t *bin, int n, uint16_t kb, int32_t *ids);

typedef struct sample_kernels {
    sample_block_max_fn block_max;
    sample_exp_sum_fn exp_sum;       /* exact terms, SAMPLE_SUM_ORDER */
    sample_exp_sum_fn exp_sum_fast;  /* terms within SAMPLE_FAST_EXP_ERR of expf's, relatively; any order */
    sample_hist_block_fn hist_block;
    sample_hist_moments_fn hist_moments;
    sample_prefix_block_fn prefix_block;
    sample_bin_find_fn bin_find;
} sample_kernels;

/* glibc's expf (Arm optimized-routines), which the SIMD kernels compute bit for bit: x * 32 / ln 2 in double
 * rounded to k, 2^(k/32) from sample_exp2f_tab (64-byte aligned) times a cubic in the remainder, rounded to
 * float. */
extern const uint64_t sample_exp2f_tab[32];
#define SAMPLE_EXPF_INV_LN2_N (0x1.71547652b82fep+0 * 32)
#define SAMPLE_EXPF_C0 (0x1.c6af84b912394p-5 / 32 / 32 / 32)
#define SAMPLE_EXPF_C1 (0x1.ebfce50fac4f3p-3 / 32 / 32)
#define SAMPLE_EXPF_C2 (0x1.62e42ff0c52d6p-1 / 32)

/* Relative error bound of exp_sum_fast's terms (so of its sum, which is >= 1 where the sampler uses it). */
#define SAMPLE_FAST_EXP_ERR 3e-7
/* A cumulative sum or a min-p ratio computed with the fast normalizer lies within this of the exact one
 * (SAMPLE_FAST_EXP_ERR relative, plus one float rounding per probability), with room to spare. */
#define FAST_MARGIN 1e-6

#define HIST_BINS 4096
#define HIST_DUMP 8 /* slots of bin HIST_BINS: id j of a block in HIST_BINS + j % 8 (the kernels' 8 lanes) */
#define HIST_MIN_BLOCKS 64 /* blocks within 6 of the maximum from which the histogram beats the sorted bands */

/* The scalar references; the AVX2 + FMA variants (call only when kiln_cpu_has_avx2()) and the AVX-512 ones
 * (kiln_cpu_level() >= KILN_CPU_AVX512) return the same values bit for bit for logits without NaN, but for
 * exp_sum_fast's (within its bound of the exact sum). */
void sample_block_max_ref(const float *x, int nblk, float *bm);
double sample_exp_sum_ref(const float *x, int nblk, float m, float temp, double z);
double sample_hist_block_ref(const float *x, float m, float temp, float lo, float scale, float *e1, float *et,
                             uint16_t *bin, double z);
int sample_hist_moments_ref(const float *x, float m, float lo, float w, uint16_t *bin, double *mom);
void sample_prefix_block_ref(const float *t, const uint16_t *bin, int kb, double norm, double *acc, float *least);
int sample_bin_find_ref(const uint16_t *bin, int n, uint16_t kb, int32_t *ids);
void sample_block_max_avx2(const float *x, int nblk, float *bm);
double sample_exp_sum_avx2(const float *x, int nblk, float m, float temp, double z);
double sample_exp_sum_fast_avx2(const float *x, int nblk, float m, float temp, double z);
double sample_hist_block_avx2(const float *x, float m, float temp, float lo, float scale, float *e1, float *et,
                              uint16_t *bin, double z);
int sample_hist_moments_avx2(const float *x, float m, float lo, float w, uint16_t *bin, double *mom);
void sample_prefix_block_avx2(const float *t, const uint16_t *bin, int kb, double norm, double *acc, float *least);
int sample_bin_find_avx2(const uint16_t *bin, int n, uint16_t kb, int32_t *ids);
double sample_exp_sum_avx512(const float *x, int nblk, float m, float temp, double z);
double sample_hist_block_avx512(const float *x, float m, float temp, float lo, float scale, float *e1,
                                float *et, uint16_t *bin, double z);
int sample_hist_moments_avx512(const float *x, float m, float lo, float w, uint16_t *bin, double *mom);
void sample_prefix_block_avx512(const float *t, const uint16_t *bin, int kb, double norm, double *acc, float *least);
int sample_bin_find_avx512(const uint16_t *bin, int n, uint16_t kb, int32_t *ids);
/* The best kernels of the CPU's level (kiln_cpu_level: KILN_CPU_LEVEL, KILN_NO_SIMD lower it). */
sample_kernels sample_kernels_select(void);

/* ---- the view of one call's penalized logits (sample_view.c) ---- */

typedef struct sample_view {
    const float *logits;  /* the caller's logits of the current call */
    int nv, nb;           /* vocabulary size, blocks (the last may be partial) */
    float *side;          /* max_dirty blocks: copies of the dirty blocks */
    int32_t *slot;        /* nb: index of the block's copy in side, or -1 (read in place) */
    int32_t *dirty;       /* the blocks that have a copy, n_dirty of them */
    int n_dirty, max_dirty;
    float *bm;            /* nb: each block's maximum */
    float *scratch;       /* nb floats for sample_view_top */
    float max;            /* the maximum of all (penalized) logits */
} sample_view;

/* Allocates the view's buffers for n_vocab ids and up to max_penalized penalized ids per call. */
int sample_view_init(sample_view *v, int n_vocab, int max_penalized);
void sample_view_free(sample_view *v);
/* Points the view at logits with np penalized values (pid[i] gets pval[i]) and records the block maxima. */
void sample_view_build(sample_view *v, const sample_kernels *k, const float *logits, const int32_t *pid,
                       const float *pval, int np);

static inline const float *sample_view_block(const sample_view *v, int b) {
    return v->slot[b] >= 0 ? v->side + (size_t)v->slot[b] * SAMPLE_BLOCK : v->logits + (size_t)b * SAMPLE_BLOCK;
}
static inline int sample_view_block_len(const sample_view *v, int b) {
    const int rest = v->nv - b * SAMPLE_BLOCK;
    return rest < SAMPLE_BLOCK ? rest : SAMPLE_BLOCK;
}

/* The (penalized) logit of one id. */
float sample_view_logit(const sample_view *v, int32_t id);
/* The lowest id holding the maximum. */
int32_t sample_view_argmax(const sample_view *v);
/* Sum over every id of expf((logit - max) / temp), with fn (k->exp_sum or k->exp_sum_fast), block after block. */
double sample_view_exp_sum(const sample_view *v, sample_exp_sum_fn fn, float temp);
/* Appends to out, in ascending id order, the candidates with lo <= logit < hi (first: lo <= logit, +inf
 * included); returns their count. Visits only the blocks whose maximum is >= lo. */
int sample_view_collect(const sample_view *v, float lo, float hi, int first, cand *out);
/* The k (1 <= k <= nv) largest logits into heap[0..k), sorted best first (ties: lower id first); returns k
 * (fewer only when logits are NaN). When k <= nb, the k-th largest block maximum bounds the k-th largest
 * logit from below (k blocks hold an id at least that large), so only the blocks that reach it are read. */
int sample_view_top(const sample_view *v, int k, cand *heap);

/* ---- penalties (sample_penalty.c) ---- */

/* The window of the last last_n accepted ids and the penalized logits of its distinct ids. */
typedef struct sample_penalty {
    float repeat, presence, frequency;
    int last_n, n_recent, head, n_vocab;
    int cap_last_n;      /* the window the buffers were sized for at open (last_n <= cap_last_n) */
    int32_t *recent;     /* ring of last_n ids */
    uint32_t *stamp;     /* n_vocab: the apply call that last counted the id */
    int32_t *count;      /* n_vocab: occurrences in the window (valid where stamp is current) */
    uint32_t calls;
    int32_t *pid;        /* the distinct ids of the window (at most min(last_n, n_vocab)) */
    float *pval;         /* their penalized logits */
} sample_penalty;

/* The most ids one call penalizes. */
int sample_penalty_max(int last_n, int n_vocab);
int sample_penalty_init(sample_penalty *pen, float repeat, float presence, float frequency, int last_n, int n_vocab);
void sample_penalty_free(sample_penalty *pen);
void sample_penalty_reset(sample_penalty *pen);
void sample_penalty_accept(sample_penalty *pen, int32_t id);
/* Fills pid/pval with each distinct id of the window (ids outside the vocabulary are ignored) and its
 * penalized logit, as llama.cpp's penalties sampler: the repeat penalty divides a positive logit and
 * multiplies a non-positive one, then count * frequency + (count > 0) * presence is subtracted. Returns
 * their count (0 when every penalty is off). */
int sample_penalty_apply(sample_penalty *pen, const float *logits);
/* Whether any penalty applies to the next call (a penalty is on and the window is not empty). */
bool sample_penalty_active(const sample_penalty *pen);
/* The first half of sample_penalty_apply: each distinct id of the window into pid (its count in
 * count[id]); returns their count (0 when no penalty applies). */
int sample_penalty_collect(sample_penalty *pen);

/* ---- candidates (sample_cand.c) ---- */

/* Sorts c[0..n) by logit descending, stably (c must be in ascending id order, so ties end lower id
 * first: the order of the reference comparator; a -0 logit comes back as +0); tmp holds 2n items of
 * scratch. NaN never occurs. */
void sample_cand_sort(cand *c, int n, uint64_t *tmp);
/* Heap of the best k seen so far, worst at the root: push while count < k, then offer. */
void sample_heap_push(cand *h, int *count, cand x);
void sample_heap_offer(cand *h, int k, cand x);
/* Sorts a full heap of k best first (heapsort: pops the worst to the back). */
void sample_heap_sort(cand *h, int k);
/* The k-th largest of x[0..n) (1 <= k <= n); scratch holds k floats. */
float sample_kth_largest(const float *x, int n, int k, float *scratch);

/* ---- top-k off over many candidates by histogram (sample_hist.c) ---- */

/* min-p's floor below the maximum: a logit below it fails min-p whatever the normalizer (a margin over
 * max + log(min_p) for the rounding of the probabilities). */
static inline float sample_min_p_floor(float max, float min_p) {
    return max + logf(min_p) - (1e-3f + 1e-5f * fabsf(max));
}

#define HIST_MAX_GATHER 8 /* bins one call may gather the members of; one more and it gives up (-1) */

typedef struct hist_gathered { int kb, off, n; } hist_gathered; /* bin kb's members: ord[off .. off + n) */

typedef struct sample_hist {
    double *mom;      /* 4 (HIST_BINS + HIST_DUMP): per bin its count and the sums of e, e^2, e^3 (hist_moments;
                       * the last HIST_DUMP slots take the ids below lo, as zeros); zero from bin n_used on */
    double *sums;     /* 2 HIST_BINS: per bin the sums of its terms at temperature 1 and at the call's
                       * temperature, side by side, from the moments (bins below n_used) */
    int n_used;       /* the bins from n_used on have no member */
    float lo, w;      /* the call's bins: width w (a power of two), bin = (max - logit) / w, from lo up */
    float temp;       /* the call's temperature */
    double err1, errt;/* the relative error of a bin's sum at 1 / at the temperature against the exact sum of
                       * exp(logit - max) (/ temp) over its members (the moments' truncation and float sums) */
    double tail1, tailt; /* bounds of the terms below lo at 1 / at the temperature, relative to the maximum's */
    double eps_z;     /* the relative error of the approximate top-p normalizer (0: exact) */
    double z_exact;   /* the exact normalizer once needed (0 until then) */
    float *terms;     /* nb * SAMPLE_BLOCK: the exact resolution's terms at temperature terms_temp (0: none) of
                       * the blocks holding an id of a bin below terms_kb */
    float terms_temp;
    int terms_kb;
    uint16_t *bin;    /* nb * SAMPLE_BLOCK: each id's bin (HIST_BINS + j % HIST_DUMP below lo) */
    int32_t *ids;     /* nb * SAMPLE_BLOCK + 16: one bin's ids as bin_find gives them */
    cand *ord;        /* n_vocab: the gathered bins' members, a run per bin */
    int n_gathered, n_ord;
    hist_gathered gathered[HIST_MAX_GATHER]; /* the call's gathered bins */
} sample_hist;

int sample_hist_init(sample_hist *h, int n_vocab);
void sample_hist_free(sample_hist *h);
/* Whether the view's candidates are spread enough (HIST_MIN_BLOCKS blocks near the maximum) for the histogram. */
bool sample_hist_wanted(const sample_view *v);
/* top-k off, top-p and / or min-p: the id that sample.c's sorted walk (cut_walk with the exact normalizer z at
 * temperature 1, 1 without top-p, then the draw with uniform r) chooses, or -1 where a decision near its boundary
 * cannot be resolved exactly (a term below 2^-29), the walk would reach the ids below the bins, or more than
 * HIST_MAX_GATHER bins would be walked (the caller then walks sorted). tmp: the sort's scratch (2 n_vocab). */
int32_t sample_hist_cut(sample_hist *h, const sample_view *v, const sample_kernels *k, const kiln_sampler_params *p,
                        double r, uint64_t *tmp);
/* top-k off, no cut: the id that sample.c's all_walk (with the exact normalizer at the temperature) draws with
 * uniform r, or -1 as above. */
int32_t sample_hist_draw(sample_hist *h, const sample_view *v, const sample_kernels *k, float temp, double r,
                         uint64_t *tmp);

#endif
