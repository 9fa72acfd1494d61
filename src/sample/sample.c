/*
 * sample.c — the sampler: penalties over the last N tokens (repeat, presence, frequency), then greedy, or
 * the chain top-k -> top-p -> min-p -> temperature -> draw (llama.cpp's default order), with a seeded RNG
 * so that sampled runs are reproducible. All buffers are allocated at open; kiln_sample allocates nothing.
 *
 * The result is that of the plain definition (copy the vocabulary, sort it, cut, renormalize, walk the
 * sorted candidates until the cumulative probability passes a uniform draw), computed without copying or
 * sorting the vocabulary (see sample_internal.h for the view):
 *   - top-k: a heap of k over the blocks whose maximum can still enter it;
 *   - top-k off: the candidates are taken in bands of logits below the maximum (6, 12, 24, ... units of
 *     1 for top-p / min-p, of the temperature for the draw), each band sorted and walked in turn, until
 *     the cumulative mass reaches top-p, min-p's threshold is crossed, or the draw is decided. Top-p and
 *     the draw without cuts need the softmax's normalizer over the whole vocabulary: one vectorized pass.
 * The walk's arithmetic is the definition's (same expf, same float rounding of each probability, the
 * same double cumulative sums in the same order), so for the same seed the same ids come out. The
 * normalizer of the whole vocabulary is first summed with a fast exp (within SAMPLE_FAST_EXP_ERR); a cut or
 * draw that falls within FAST_MARGIN of a boundary is walked again with the exact normalizer (expf's terms
 * bit for bit), which differs from the definition's only in the order of its double additions. Over a flat
 * distribution the bands would sort most of the vocabulary: there sample_hist.c decides first, from bins of
 * the logit, and the bands walk only where it cannot.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kiln.h"
#include "sample/sample_internal.h"
#include "sample/sample_spec.h"

struct kiln_sampler {
    kiln_sampler_params p;
    int n_vocab;
    uint64_t rng;
    sample_penalty pen;
    sample_view view;
    sample_kernels k;
    sample_hist hist;
    cand *c;         /* n_vocab candidates */
    uint64_t *tmp;   /* 2 n_vocab: the sort's scratch */
    int have_last;   /* a kiln_sample ran since open / reset: the view is that call's */
    int have_logz;
    double logz;     /* log of the temperature-1 normalizer of the last call (for logprobs) */
};

kiln_sampler_params kiln_sampler_defaults(void) {
    kiln_sampler_params p = {
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0x5eed,
        .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
    };
    return p;
}

static kiln_status check_params(const kiln_sampler_params *p, int n_vocab) {
    if (!p) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_sampler_open: params is NULL");
    if (n_vocab < 1) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_sampler_open: n_vocab %d < 1", n_vocab);
    if (!isfinite(p->temperature) || p->temperature > 100.0f)
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: temperature %g out of range (<= 0 greedy, up to 100)", (double)p->temperature);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: top-p %g out of range 0..1", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: min-p %g out of range 0..1", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f && p->repeat_penalty <= 10.0f))
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: repeat penalty %g out of range (0, 10]", (double)p->repeat_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: presence penalty %g out of range -2..2", (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: frequency penalty %g out of range -2..2", (double)p->frequency_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > 1 << 20)
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: repeat-last-n %d out of range 0..%d", p->repeat_last_n, 1 << 20);
    return KILN_OK;
}

kiln_status kiln_sampler_open(const kiln_sampler_params *p, int n_vocab, kiln_sampler **out) {
    if (!out) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_sampler_open: out is NULL");
    *out = NULL;
    kiln_status st = check_params(p, n_vocab);
    if (st != KILN_OK) return st;
    kiln_sampler *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->k = sample_kernels_select();
    const int pen_ok = sample_penalty_init(&s->pen, p->repeat_penalty, p->presence_penalty, p->frequency_penalty,
                                           p->repeat_last_n, n_vocab) == 0;
    const int view_ok = sample_view_init(&s->view, n_vocab, sample_penalty_max(p->repeat_last_n, n_vocab)) == 0;
    s->c = kiln_malloc((size_t)n_vocab * sizeof(cand));
    s->tmp = kiln_malloc((size_t)n_vocab * 2 * sizeof(uint64_t));
    const int hist_ok = sample_hist_init(&s->hist, n_vocab) == 0;
    if (!pen_ok || !view_ok || !hist_ok || !s->c || !s->tmp) {
        kiln_sampler_close(s);
        return kiln_fail(KILN_ERR_NOMEM, "sampler: out of memory for %d candidates", n_vocab);
    }
    /* fault the candidate buffers in now, so that no later call pays for their pages (first-call contract) */
    memset(s->c, 0, (size_t)n_vocab * sizeof(cand));
    memset(s->tmp, 0, (size_t)n_vocab * 2 * sizeof(uint64_t));
    kiln_sampler_reset(s);
    *out = s;
    return KILN_OK;
}

kiln_status kiln_sampler_check(const kiln_sampler_params *p, int n_vocab) { return check_params(p, n_vocab); }

kiln_status kiln_sampler_reconfigure(kiln_sampler *s, const kiln_sampler_params *p) {
    if (!s) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_sampler_reconfigure: sampler is NULL");
    KILN_TRY(check_params(p, s->n_vocab));
    if (p->repeat_last_n > s->pen.cap_last_n)
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: repeat-last-n %d exceeds the window of %d this sampler was opened with",
                         p->repeat_last_n, s->pen.cap_last_n);
    s->p = *p;
    s->pen.repeat = p->repeat_penalty;
    s->pen.presence = p->presence_penalty;
    s->pen.frequency = p->frequency_penalty;
    s->pen.last_n = p->repeat_last_n;
    kiln_sampler_reset(s);
    return KILN_OK;
}

void kiln_sampler_close(kiln_sampler *s) {
    if (!s) return;
    sample_penalty_free(&s->pen);
    sample_view_free(&s->view);
    sample_hist_free(&s->hist);
    kiln_free(s->c);
    kiln_free(s->tmp);
    kiln_free(s);
}

void kiln_sampler_reset(kiln_sampler *s) {
    if (!s) return;
    sample_penalty_reset(&s->pen);
    s->rng = s->p.seed ^ 0x9E3779B97F4A7C15ull;
    s->have_last = 0;
}

void kiln_sampler_accept(kiln_sampler *s, int32_t id) {
    if (!s) return;
    sample_penalty_accept(&s->pen, id);
}

/* splitmix64 -> uniform in [0, 1) */
static double next_uniform(kiln_sampler *s) {
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* Softmax of the first n (sorted) candidates' logits divided by temp into p. */
static void softmax(cand *c, int n, float temp) {
    const float max = c[0].logit;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf((c[i].logit - max) / temp);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* The draw over the kept, sorted candidates c[0..n): softmax at the temperature, walk until the uniform r. */
static int32_t draw(kiln_sampler *s, cand *c, int n, double r) {
    if (n <= 0) return sample_view_argmax(&s->view); /* only when every logit is NaN */
    softmax(c, n, s->p.temperature);
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}

/* top-k on: the heap's k sorted candidates, then top-p and min-p over their softmax, then the draw. */
static int32_t sample_top_k(kiln_sampler *s) {
    cand *c = s->c;
    int n = sample_view_top(&s->view, s->p.top_k, c);
    if (n <= 0) return sample_view_argmax(&s->view); /* only when every logit is NaN */
    softmax(c, n, 1.0f);
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= s->p.top_p) { n = i + 1; break; }
        }
    }
    if (s->p.min_p > 0.0f) {
        const float thr = c[0].p * s->p.min_p;
        int keep = 1;
        while (keep < n && c[keep].p >= thr) keep++;
        n = keep;
    }
    return draw(s, c, n, next_uniform(s));
}

/* The bands of candidates below the maximum: [max - d*unit, hi), d = 6, 12, 24, ... then everything. */
typedef struct band {
    float max, unit, d, hi, floor;
    int n, done, later;  /* later: not the first band (the first has no upper bound) */
} band;

/* Appends the next non-empty band, sorted, to s->c[0..b->n); returns its size (0: no candidates left). */
static int next_band(kiln_sampler *s, band *b) {
    while (!b->done) {
        float lo = b->d > 104.0f ? -INFINITY : b->max - b->d * b->unit; /* expf(-104) is 0 in float */
        if (!(lo > b->floor)) { lo = b->floor; b->done = 1; }
        const int m = sample_view_collect(&s->view, lo, b->hi, !b->later, s->c + b->n);
        b->later = 1;
        sample_cand_sort(s->c + b->n, m, s->tmp);
        b->n += m;
        b->hi = lo;
        b->d *= 2.0f;
        if (m) return m;
    }
    return 0;
}

/* The walk of top-p / min-p over the bands with normalizer z (z = 1 without top-p: min-p then compares
 * expf(logit - max) with min_p). Returns the kept count, or -1 when margin > 0 and a decision came within
 * margin of its boundary (the caller walks again with the exact normalizer). */
static int cut_walk(kiln_sampler *s, band *b, double z, double margin) {
    const kiln_sampler_params *p = &s->p;
    const float max = s->view.max;
    const int top_p = p->top_p < 1.0f, min_p = p->min_p > 0.0f;
    double cum = 0.0;
    float thr = 0.0f;
    for (int i = 0; i < b->n || next_band(s, b); i++) {
        cand *c = &s->c[i];
        c->p = (float)(expf(c->logit - max) / z);
        if (i == 0) thr = c->p * p->min_p;
        else if (min_p) {
            if (margin > 0.0 && fabs((double)c->p - thr) <= margin * thr) return -1;
            if (c->p < thr) return i;
        }
        cum += c->p;
        if (top_p && cum >= p->top_p) {
            if (margin > 0.0 && (cum - p->top_p < margin || p->top_p - (cum - c->p) < margin)) return -1;
            return i + 1;
        }
    }
    if (top_p && margin > 0.0 && p->top_p - cum < margin) return -1;
    return b->n;
}

/* top-k off, top-p and / or min-p on: the kept prefix of the bands, then the draw over it. The fast
 * normalizer decides unless a decision falls within its error; then the exact one walks again. Many
 * candidates near the maximum (a flat distribution): the histogram decides first (sample_hist.c), the bands
 * only where it cannot. */
static int32_t sample_cut(kiln_sampler *s) {
    const kiln_sampler_params *p = &s->p;
    const float max = s->view.max;
    const int top_p = p->top_p < 1.0f;
    band b = {.max = max, .unit = 1.0f, .d = 6.0f, .hi = INFINITY, .floor = -INFINITY};
    if (p->min_p > 0.0f) b.floor = sample_min_p_floor(max, p->min_p);
    const double r = next_uniform(s);
    int n;
    if (sample_hist_wanted(&s->view)) {
        const int32_t id = sample_hist_cut(&s->hist, &s->view, &s->k, p, r, s->tmp);
        if (id >= 0) return id;
        const double z = top_p ? sample_view_exp_sum(&s->view, s->k.exp_sum, 1.0f) : 1.0;
        if (top_p) s->logz = log(z), s->have_logz = 1;
        n = cut_walk(s, &b, z, 0.0); /* z is exact: the sorted walk decides at once */
    } else if ((n = cut_walk(s, &b, top_p ? sample_view_exp_sum(&s->view, s->k.exp_sum_fast, 1.0f) : 1.0,
                             FAST_MARGIN)) < 0) {
        const double z = sample_view_exp_sum(&s->view, s->k.exp_sum, 1.0f);
        s->logz = log(z);
        s->have_logz = 1;
        n = cut_walk(s, &b, z, 0.0);
    }
    return draw(s, s->c, n, r);
}

/* The draw without cuts, walking the bands in units of the temperature with normalizer z: the chosen id,
 * or -1 when margin > 0 and r came within margin of a cumulative boundary. */
static int32_t all_walk(kiln_sampler *s, band *b, double z, double r, double margin) {
    const float temp = s->p.temperature, max = s->view.max;
    double cum = 0.0;
    for (int i = 0; i < b->n || next_band(s, b); i++) {
        const double prev = cum;
        cum += (float)(expf((s->c[i].logit - max) / temp) / z);
        if (r < cum) return margin > 0.0 && (cum - r < margin || r - prev < margin) ? -1 : s->c[i].id;
    }
    if (margin > 0.0 && r - cum < margin) return -1;
    return b->n ? s->c[b->n - 1].id : sample_view_argmax(&s->view);
}

static int32_t sample_all(kiln_sampler *s) {
    const float temp = s->p.temperature;
    const double r = next_uniform(s);
    if (sample_hist_wanted(&s->view)) {
        const int32_t id = sample_hist_draw(&s->hist, &s->view, &s->k, temp, r, s->tmp);
        if (id >= 0) return id;
    }
    band b = {.max = s->view.max, .unit = temp, .d = 6.0f, .hi = INFINITY, .floor = -INFINITY};
    int32_t id = all_walk(s, &b, sample_view_exp_sum(&s->view, s->k.exp_sum_fast, temp), r, FAST_MARGIN);
    if (id < 0) id = all_walk(s, &b, sample_view_exp_sum(&s->view, s->k.exp_sum, temp), r, 0.0);
    return id;
}

int32_t kiln_sample(kiln_sampler *s, const float *logits) {
    if (!s || !logits) return -1;
    const int np = sample_penalty_apply(&s->pen, logits);
    sample_view_build(&s->view, &s->k, logits, s->pen.pid, s->pen.pval, np);
    s->have_last = 1;
    s->have_logz = 0;
    const kiln_sampler_params *p = &s->p;
    if (p->temperature <= 0.0f) return sample_view_argmax(&s->view);
    if (p->top_k > 0 && p->top_k < s->n_vocab) return sample_top_k(s);
    if (p->top_p < 1.0f || p->min_p > 0.0f) return sample_cut(s);
    return sample_all(s);
}

/* log of the temperature-1 normalizer of the last call's penalized logits */
static double last_logz(kiln_sampler *s) {
    if (!s->have_logz) {
        s->logz = log(sample_view_exp_sum(&s->view, s->k.exp_sum, 1.0f));
        s->have_logz = 1;
    }
    return s->logz;
}

int kiln_sampler_top(kiln_sampler *s, int n, int32_t *ids, float *logprobs) {
    if (!s || !s->have_last || n <= 0 || !ids || !logprobs) return 0;
    if (n > s->n_vocab) n = s->n_vocab;
    const double logz = last_logz(s);
    n = sample_view_top(&s->view, n, s->c);
    for (int i = 0; i < n; i++) {
        ids[i] = s->c[i].id;
        logprobs[i] = (float)((double)(s->c[i].logit - s->view.max) - logz);
    }
    return n;
}

float kiln_sampler_logprob(kiln_sampler *s, int32_t id) {
    if (!s || !s->have_last || id < 0 || id >= s->n_vocab) return NAN;
    return (float)((double)(sample_view_logit(&s->view, id) - s->view.max) - last_logz(s));
}

/* ---- the device's sample: the spec of sample_spec.h */

bool kiln_sampler_spec(kiln_sampler *s, kiln_sample_spec *spec, uint64_t *rng_before) {
    if (!s || !spec || !rng_before) return false;
    const int np = sample_penalty_collect(&s->pen);
    if (np > KILN_SAMPLE_SPEC_MAX_PEN) return false;
    const kiln_sampler_params *p = &s->p;
    spec->mode = KILN_SPEC_SAMPLE;
    spec->top_k = p->top_k > 0 && p->top_k < s->n_vocab ? p->top_k : 0;
    spec->temperature = p->temperature;
    spec->top_p = p->top_p;
    spec->min_p = p->min_p;
    spec->repeat = p->repeat_penalty;
    spec->presence = p->presence_penalty;
    spec->frequency = p->frequency_penalty;
    spec->n_pen = np;
    spec->reserved = 0;
    for (int i = 0; i < np; i++) {
        spec->pen_id[i] = s->pen.pid[i];
        spec->pen_count[i] = s->pen.count[s->pen.pid[i]];
    }
    *rng_before = s->rng;
    spec->u = p->temperature > 0.0f ? next_uniform(s) : 0.0;
    s->have_last = 0; /* the logits of this sample stay on the device: no logprobs */
    return true;
}

void kiln_sampler_spec_undo(kiln_sampler *s, uint64_t rng_before) {
    if (s) s->rng = rng_before;
}
