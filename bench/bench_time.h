/* bench_time.h — the clocks and the median helper every bench program shares (header-only: bench/run.sh builds
 * each bench program alone). */
#ifndef KILN_BENCH_TIME_H
#define KILN_BENCH_TIME_H

#include <time.h>

/* CPU time of the calling thread, seconds: single-thread figures are not inflated by preemption on a shared box. */
static inline double bench_thread_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wall time, seconds (for runs of several threads). */
static inline double bench_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* qsort comparator of doubles, ascending (medians). */
static inline int bench_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
