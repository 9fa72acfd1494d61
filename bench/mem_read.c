/*
 * mem_read.c — this machine's memory read bandwidth, the floor of a decode step that streams every weight once
 * (issue 14: decode >= 80% of bytes of weights per token / read bandwidth). T threads (1 and 2 by default) each
 * sum their share of a buffer much larger than the caches (on transparent huge pages where the kernel gives them,
 * like kiln's interleaved weights), two ways: "plain", one pass with 8 independent 64-bit accumulators so the
 * loads are not serialized; "streams", the share's two halves at once, each prefetched 2 KB ahead, with 64-byte
 * loads (how kiln's decode kernels read; on a Zen 4 VM one thread reads ~15% more that way than plain, so plain
 * alone understated the floor). Median of 7 passes each, wall clock; the floor is the larger. Pin it like the
 * engines it is compared with (taskset).
 *   usage: mem_read [MiB (default 1024)] [threads...]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* Sum of one share as two streams (its halves), each prefetched 2 KB ahead, with 64-byte vector loads (what
 * kiln's AVX-512 kernels issue: more lines in flight per instruction than 8-byte loads; where the CPU lacks
 * AVX-512 the compiler splits them into what it has). */
typedef uint64_t v8u __attribute__((vector_size(64)));
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "default")))
#endif
static void *read_share_streams(void *arg) {
    share *s = arg;
    const size_t half = s->n / 2 / 32 * 32;
    const uint64_t *p = s->p, *q = s->p + half;
    v8u a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
    for (size_t i = 0; i < half; i += 16) {
        __builtin_prefetch(p + i + 256);
        __builtin_prefetch(q + i + 256);
        v8u x0, x1, y0, y1;
        memcpy(&x0, p + i, 64), memcpy(&x1, p + i + 8, 64), memcpy(&y0, q + i, 64), memcpy(&y1, q + i + 8, 64);
        a0 += x0, a1 += x1, b0 += y0, b1 += y1;
    }
    uint64_t sum = 0;
    for (size_t i = 2 * half; i < s->n; i++) sum += s->p[i];
    for (int k = 0; k < 8; k++) sum += a0[k] + a1[k] + b0[k] + b1[k];
    s->sum = sum;
    return NULL;
}

/* GB/s of one pass over buf (n words) by t threads, each reading its share with fn; *sink keeps the sums
 * observable. */
static double one_pass(void *(*fn)(void *), const uint64_t *buf, size_t n, int t, uint64_t *sink) {
    pthread_t th[MAX_THREADS];
    share sh[MAX_THREADS];
    const double t0 = bench_wall_s();
    for (int i = 0; i < t; i++) {
        sh[i] = (share){buf + n / t * i, i == t - 1 ? n - n / t * i : n / t, 0};
        if (pthread_create(&th[i], NULL, fn, &sh[i])) return -1.0;
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
    uint64_t *buf = aligned_alloc(2u << 20, n * 8);
    if (buf) madvise(buf, n * 8, MADV_HUGEPAGE);
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
    printf("| threads | plain GB/s | streams GB/s | floor GB/s |  (medians of %d passes over %ld MiB)\n"
           "|---:|---:|---:|---:|\n", PASSES, mib);
    for (int i = 0; i < nt; i++) {
        double g[2][PASSES];
        for (int r = 0; r < PASSES; r++) { /* the two ways alternated */
            g[0][r] = one_pass(read_share, buf, n, threads[i], &sink);
            g[1][r] = one_pass(read_share_streams, buf, n, threads[i], &sink);
        }
        for (int w = 0; w < 2; w++) qsort(g[w], PASSES, sizeof g[w][0], bench_cmp_double);
        const double plain = g[0][PASSES / 2], streams = g[1][PASSES / 2];
        printf("| %d | %.1f | %.1f | %.1f |\n", threads[i], plain, streams, plain > streams ? plain : streams);
    }
    printf("(checksum %llu)\n", (unsigned long long)sink);
    free(buf);
    return 0;
}
