/*
 * pool.h — a fixed thread pool created at session open. kiln_pool_run(pool, fn, ctx) calls
 * fn(ctx, i, n) on n threads (the caller is thread 0) and returns when all are done. Nothing is
 * allocated per run; workers spin briefly, then sleep on a condition variable. The caller's counter
 * sink (base/alloc.h) is carried to the workers for the run, so what they count belongs to the caller.
 */
#ifndef KILN_BASE_POOL_H
#define KILN_BASE_POOL_H

#include "kiln.h"

typedef struct kiln_pool kiln_pool;
typedef void (*kiln_pool_fn)(void *ctx, int ith, int nth);

kiln_status kiln_pool_open(int n_threads, kiln_pool **out);
void kiln_pool_close(kiln_pool *p);
int kiln_pool_size(const kiln_pool *p);
void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *ctx);

/* Splits [0, n) into nth near-equal ranges; range ith is [*lo, *hi). */
static inline void kiln_split(int n, int ith, int nth, int *lo, int *hi) {
    int per = (n + nth - 1) / nth;
    *lo = ith * per < n ? ith * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

#endif
