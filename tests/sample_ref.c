/* sample_ref.c — the reference sampler of sample_ref.h (kiln's sample.c before the one-pass rewrite, with
 * llama.cpp's presence and frequency penalties added in its penalties-sampler order). */
#include "sample_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct rcand { int32_t id; float logit; float p; } rcand;

struct ref_sampler {
    kiln_sampler_params p;
    int n_vocab;
    uint64_t rng;
    int32_t *recent;
    int n_recent, head;
    int32_t *count;
    rcand *c;
};

ref_sampler *ref_sampler_open(const kiln_sampler_params *p, int n_vocab) {
    if (!p || n_vocab < 1) return NULL;
    ref_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->recent = calloc((size_t)(p->repeat_last_n ? p->repeat_last_n : 1), sizeof(int32_t));
    s->count = calloc((size_t)n_vocab, sizeof(int32_t));
    s->c = calloc((size_t)n_vocab, sizeof(rcand));
    if (!s->recent || !s->count || !s->c) { ref_sampler_close(s); return NULL; }
    ref_sampler_reset(s);
    return s;
}

void ref_sampler_close(ref_sampler *s) {
    if (!s) return;
    free(s->recent);
    free(s->count);
    free(s->c);
    free(s);
}

void ref_sampler_reset(ref_sampler *s) {
    s->n_recent = 0;
    s->head = 0;
    s->rng = s->p.seed ^ 0x9E3779B97F4A7C15ull;
}

void ref_sampler_accept(ref_sampler *s, int32_t id) {
    if (s->p.repeat_last_n == 0) return;
    s->recent[s->head] = id;
    s->head = (s->head + 1) % s->p.repeat_last_n;
    if (s->n_recent < s->p.repeat_last_n) s->n_recent++;
}

static double ref_uniform(ref_sampler *s) {
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int cand_cmp_desc(const void *a, const void *b) {
    const rcand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void select_top(rcand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        rcand pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp_desc(&c[i], &pivot) < 0) i++;
            while (cand_cmp_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) { rcand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

static void softmax(rcand *c, int n, float temp) {
    float max = c[0].logit;
    for (int i = 1; i < n; i++) max = c[i].logit > max ? c[i].logit : max;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf((c[i].logit - max) / temp);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* The copy, the penalties (repeat, then frequency and presence, once per distinct id) and greedy. */
static void penalize(ref_sampler *s, const float *logits) {
    const int nv = s->n_vocab;
    for (int i = 0; i < nv; i++) s->c[i] = (rcand){i, logits[i], 0.0f};
    const kiln_sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    for (int i = 0; i < s->n_recent; i++)
        if (s->recent[i] >= 0 && s->recent[i] < nv) s->count[s->recent[i]]++;
    for (int i = 0; i < s->n_recent; i++) {
        const int32_t id = s->recent[i];
        if (id < 0 || id >= nv || !s->count[id]) continue;
        float l = s->c[id].logit;
        l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)s->count[id] * p->frequency_penalty + (float)(s->count[id] > 0) * p->presence_penalty;
        s->c[id].logit = l;
        s->count[id] = 0;
    }
}

/* The copy and the penalties of explicitly given distinct ids and counts (the spec's form of the window). */
static void penalize_given(ref_sampler *s, const float *logits, const int32_t *pen_id, const int32_t *pen_count,
                           int n_pen) {
    for (int i = 0; i < s->n_vocab; i++) s->c[i] = (rcand){i, logits[i], 0.0f};
    const kiln_sampler_params *p = &s->p;
    for (int i = 0; i < n_pen; i++) {
        const int32_t id = pen_id[i], count = pen_count[i];
        if (id < 0 || id >= s->n_vocab) continue;
        float l = s->c[id].logit;
        l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)count * p->frequency_penalty + (float)(count > 0) * p->presence_penalty;
        s->c[id].logit = l;
    }
}

/* Everything up to the draw: returns the number of kept candidates, whose p is the final distribution. */
static int kept(ref_sampler *s) {
    rcand *c = s->c;
    int n = s->n_vocab;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(c, n, s->p.top_k);
        n = s->p.top_k;
    }
    qsort(c, (size_t)n, sizeof *c, cand_cmp_desc);
    softmax(c, n, 1.0f);
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= s->p.top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (s->p.min_p > 0.0f) {
        const float thr = c[0].p * s->p.min_p;
        int keep = 1;
        while (keep < n && c[keep].p >= thr) keep++;
        n = keep;
    }
    softmax(c, n, s->p.temperature);
    return n;
}

static int32_t greedy(const ref_sampler *s) {
    int best = 0;
    for (int i = 1; i < s->n_vocab; i++)
        if (s->c[i].logit > s->c[best].logit) best = i;
    return best;
}

/* The walk over the kept candidates to r. */
static int32_t walk(ref_sampler *s, int n, double r) {
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->c[i].p;
        if (r < cum) return s->c[i].id;
    }
    return s->c[n - 1].id;
}

int32_t ref_sample(ref_sampler *s, const float *logits) {
    penalize(s, logits);
    if (s->p.temperature <= 0.0f) return greedy(s);
    const int n = kept(s);
    return walk(s, n, ref_uniform(s));
}

int32_t ref_sample_given(ref_sampler *s, const float *logits, const int32_t *pen_id, const int32_t *pen_count,
                         int n_pen, double u) {
    penalize_given(s, logits, pen_id, pen_count, n_pen);
    if (s->p.temperature <= 0.0f) return greedy(s);
    return walk(s, kept(s), u);
}

void ref_sample_distribution(ref_sampler *s, const float *logits, double *prob) {
    memset(prob, 0, (size_t)s->n_vocab * sizeof *prob);
    penalize(s, logits);
    if (s->p.temperature <= 0.0f) { prob[greedy(s)] = 1.0; return; }
    const int n = kept(s);
    for (int i = 0; i < n; i++) prob[s->c[i].id] = s->c[i].p;
}
