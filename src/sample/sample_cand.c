/* sample_cand.c — ordering candidates: a stable sort by logit (insertion sort for a few, an LSD radix sort
 * on the float's bits for many, so that a flat distribution costs O(n), not a comparator-driven qsort), and
 * the bounded heap behind top-k. The order is the reference's: logit descending, then id ascending. */
#include <string.h>

#include "sample/sample_internal.h"

/* Sort key: ascending key = descending logit (-0 and +0 share a key, as they compare equal). */
static inline uint32_t desc_key(float v) {
    v += 0.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

static void insertion_sort(cand *c, int n) {
    for (int i = 1; i < n; i++) {
        const cand x = c[i];
        int j = i;
        while (j > 0 && c[j - 1].logit < x.logit) { c[j] = c[j - 1]; j--; }
        c[j] = x;
    }
}

static inline float key_logit(uint32_t key) {
    uint32_t u = ~key;
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

#define RADIX_BITS 11
#define RADIX_SIZE (1 << RADIX_BITS)
#define RADIX_PASSES 3

/* LSD radix sort of (key << 32 | id) on the key's 32 bits, 11 at a time, skipping a digit that every item
 * shares; stable, so equal keys keep their (ascending id) order. */
void sample_cand_sort(cand *c, int n, uint64_t *tmp) {
    if (n <= 48) { insertion_sort(c, n); return; }
    uint32_t hist[RADIX_PASSES][RADIX_SIZE];
    memset(hist, 0, sizeof hist);
    uint64_t *src = tmp, *dst = tmp + n;
    for (int i = 0; i < n; i++) {
        const uint32_t k = desc_key(c[i].logit);
        src[i] = (uint64_t)k << 32 | (uint32_t)c[i].id;
        for (int p = 0; p < RADIX_PASSES; p++) hist[p][(k >> (p * RADIX_BITS)) & (RADIX_SIZE - 1)]++;
    }
    for (int p = 0; p < RADIX_PASSES; p++) {
        const int shift = 32 + p * RADIX_BITS;
        if (hist[p][(src[0] >> shift) & (RADIX_SIZE - 1)] == (uint32_t)n) continue; /* one digit */
        uint32_t pos = 0;
        for (int d = 0; d < RADIX_SIZE; d++) { const uint32_t h = hist[p][d]; hist[p][d] = pos; pos += h; }
        for (int i = 0; i < n; i++) dst[hist[p][(src[i] >> shift) & (RADIX_SIZE - 1)]++] = src[i];
        uint64_t *t = src; src = dst; dst = t;
    }
    for (int i = 0; i < n; i++) c[i] = (cand){(int32_t)(uint32_t)src[i], key_logit((uint32_t)(src[i] >> 32)), 0.0f};
}

/* a is worse than b: lower logit, or the same logit and a higher id */
static inline int worse(const cand *a, const cand *b) {
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static void sift_down(cand *h, int n, int i) {
    const cand x = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && worse(&h[c + 1], &h[c])) c++;
        if (!worse(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

void sample_heap_push(cand *h, int *count, cand x) {
    int i = (*count)++;
    while (i > 0) {
        const int parent = (i - 1) / 2;
        if (!worse(&x, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = x;
}

void sample_heap_offer(cand *h, int k, cand x) {
    if (!worse(&h[0], &x)) return;
    h[0] = x;
    sift_down(h, k, 0);
}

void sample_heap_sort(cand *h, int k) {
    for (int n = k - 1; n > 0; n--) {
        const cand t = h[0];
        h[0] = h[n];
        h[n] = t;
        sift_down(h, n, 0);
    }
}

/* min-heap of floats: the root is the smallest of the k largest seen */
static void fsift_down(float *h, int n, int i) {
    const float x = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (!(h[c] < x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

float sample_kth_largest(const float *x, int n, int k, float *scratch) {
    memcpy(scratch, x, (size_t)k * sizeof *x);
    for (int i = k / 2 - 1; i >= 0; i--) fsift_down(scratch, k, i);
    for (int i = k; i < n; i++)
        if (x[i] > scratch[0]) {
            scratch[0] = x[i];
            fsift_down(scratch, k, 0);
        }
    return scratch[0];
}
