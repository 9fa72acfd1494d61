/*
 * sample.c — the sampler: repetition penalty over the last N tokens, then greedy, or the chain
 * top-k -> top-p -> min-p -> temperature -> draw (llama.cpp's default order), with a seeded RNG so that
 * sampled runs are reproducible. All buffers are allocated at open; kiln_sample allocates nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kiln.h"

typedef struct cand { int32_t id; float logit; float p; } cand;

struct kiln_sampler {
    kiln_sampler_params p;
    int n_vocab;
    uint64_t rng;
    int32_t *recent;   /* ring of the last repeat_last_n ids */
    int n_recent, head;
    uint32_t *stamp;   /* per id: the sample call that last penalized it */
    uint32_t calls;
    cand *c;           /* n_vocab candidates */
};

kiln_sampler_params kiln_sampler_defaults(void) {
    kiln_sampler_params p = {
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0x5eed,
    };
    return p;
}

kiln_status kiln_sampler_open(const kiln_sampler_params *p, int n_vocab, kiln_sampler **out) {
    if (!out) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_sampler_open: out is NULL");
    *out = NULL;
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
    if (p->repeat_last_n < 0 || p->repeat_last_n > 1 << 20)
        return kiln_fail(KILN_ERR_INVALID_ARG, "sampler: repeat-last-n %d out of range", p->repeat_last_n);
    kiln_sampler *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->recent = kiln_calloc((size_t)(p->repeat_last_n ? p->repeat_last_n : 1), sizeof(int32_t));
    s->stamp = kiln_calloc((size_t)n_vocab, sizeof(uint32_t));
    s->c = kiln_calloc((size_t)n_vocab, sizeof(cand));
    if (!s->recent || !s->stamp || !s->c) {
        kiln_sampler_close(s);
        return kiln_fail(KILN_ERR_NOMEM, "sampler: out of memory for %d candidates", n_vocab);
    }
    kiln_sampler_reset(s);
    *out = s;
    return KILN_OK;
}

void kiln_sampler_close(kiln_sampler *s) {
    if (!s) return;
    kiln_free(s->recent);
    kiln_free(s->stamp);
    kiln_free(s->c);
    kiln_free(s);
}

void kiln_sampler_reset(kiln_sampler *s) {
    if (!s) return;
    s->n_recent = 0;
    s->head = 0;
    s->rng = s->p.seed ^ 0x9E3779B97F4A7C15ull;
}

void kiln_sampler_accept(kiln_sampler *s, int32_t id) {
    if (!s || s->p.repeat_last_n == 0) return;
    s->recent[s->head] = id;
    s->head = (s->head + 1) % s->p.repeat_last_n;
    if (s->n_recent < s->p.repeat_last_n) s->n_recent++;
}

/* splitmix64 -> uniform in [0, 1) */
static double next_uniform(kiln_sampler *s) {
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int cand_cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Moves the k largest candidates to the front (unordered), quickselect without allocation. */
static void select_top(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp_desc(&c[i], &pivot) < 0) i++;
            while (cand_cmp_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) { cand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* Softmax of the first n candidates' logits (divided by temp) into p. */
static void softmax(cand *c, int n, float temp) {
    float max = c[0].logit;
    for (int i = 1; i < n; i++) max = c[i].logit > max ? c[i].logit : max;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf((c[i].logit - max) / temp);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

int32_t kiln_sample(kiln_sampler *s, const float *logits) {
    if (!s || !logits) return -1;
    const int nv = s->n_vocab;
    cand *c = s->c;
    for (int i = 0; i < nv; i++) c[i] = (cand){i, logits[i], 0.0f};
    /* repetition penalty: once per distinct recent id */
    if (s->p.repeat_penalty != 1.0f && s->n_recent) {
        s->calls++;
        for (int i = 0; i < s->n_recent; i++) {
            int32_t id = s->recent[i];
            if (id < 0 || id >= nv || s->stamp[id] == s->calls) continue;
            s->stamp[id] = s->calls;
            c[id].logit = c[id].logit > 0 ? c[id].logit / s->p.repeat_penalty : c[id].logit * s->p.repeat_penalty;
        }
    }
    if (s->p.temperature <= 0.0f) {
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (c[i].logit > c[best].logit) best = i;
        return c[best].id;
    }
    int n = nv;
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
    double r = next_uniform(s), cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}
