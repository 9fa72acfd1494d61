/*
 * mem_read.c — this machine's memory read bandwidth, the floor of a decode step that streams every weight once
 * (issue 14: decode >= 80% of bytes of weights per token / read bandwidth). T threads (1 and 2 by default) each
 * sum their share of a buffer much larger than the caches, 8 independent 64-bit accumulators so the loads are
 * not serialized; median of 7 passes, wall clock. Pin it like the engines it is compared with (taskset).
 *   usage: mem_read [MiB (default 1024)] [threads...]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_time.h"

#define PASSES 7
#define MAX_THREADS 64

typedef struct {
    const uint64_t *p;
    size_t n; /* words */
    uint64_t sum;
} share;

/* Sum of one share: 8 chains, each word read once. */
static void *read_share(void *arg) {
    share *s = arg;
    const uint64_t *p = s->p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i = 0;
    for (; i + 8 <= s->n; i += 8) {
        a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
        a4 += p[i + 4], a5 += p[i + 5], a6 += p[i + 6], a7 += p[i + 7];
    }
    for (; i < s->n; i++) a0 += p[i];
    s->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}

/* GB/s of one pass over buf (n words) by t threads; *sink keeps the sums observable. */
static double one_pass(const uint64_t *buf, size_t n, int t, uint64_t *sink) {
    pthread_t th[MAX_THREADS];
    share sh[MAX_THREADS];
    const double t0 = bench_wall_s();
    for (int i = 0; i < t; i++) {
        sh[i] = (share){buf + n / t * i, i == t - 1 ? n - n / t * i : n / t, 0};
        if (pthread_create(&th[i], NULL, read_share, &sh[i])) return -1.0;
    }
    for (int i = 0; i < t; i++) {
        pthread_join(th[i], NULL);
        *sink += sh[i].sum;
    }
    return (double)n * 8 / (bench_wall_s() - t0) / 1e9;
}

int main(int argc, char **argv) {
    const long mib = argc > 1 ? strtol(argv[1], NULL, 10) : 1024;
    if (mib < 64 || mib > 65536) {
        fprintf(stderr, "mem_read: buffer size %ld MiB out of range (64..65536)\n", mib);
        return 2;
    }
    const size_t n = (size_t)mib << 17; /* words of 8 bytes */
    uint64_t *buf = malloc(n * 8);
    if (!buf) {
        fprintf(stderr, "mem_read: cannot allocate %ld MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = i; /* touch every page */
    int threads[MAX_THREADS], nt = 0;
    for (int i = 2; i < argc && nt < MAX_THREADS; i++) {
        const int t = atoi(argv[i]);
        if (t < 1 || t > MAX_THREADS) {
            fprintf(stderr, "mem_read: thread count '%s' out of range (1..%d)\n", argv[i], MAX_THREADS);
            free(buf);
            return 2;
        }
        threads[nt++] = t;
    }
    if (!nt) threads[nt++] = 1, threads[nt++] = 2;
    uint64_t sink = 0;
    printf("| threads | read GB/s (median of %d passes over %ld MiB) |\n|---:|---:|\n", PASSES, mib);
    for (int i = 0; i < nt; i++) {
        double g[PASSES];
        for (int r = 0; r < PASSES; r++) g[r] = one_pass(buf, n, threads[i], &sink);
        qsort(g, PASSES, sizeof g[0], bench_cmp_double);
        printf("| %d | %.1f |\n", threads[i], g[PASSES / 2]);
    }
    printf("(checksum %llu)\n", (unsigned long long)sink);
    free(buf);
    return 0;
}
