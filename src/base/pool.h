/*
 * pool.h — a fixed thread pool created at session open that does not wait for a descheduled thread.
 * A run splits [0, n) into chunks; each thread (the caller is thread 0) first takes the chunks of its own
 * share in order, then steals the remaining chunks of the other shares from their far end. The caller returns
 * as soon as every chunk is done: it never waits for a worker that has not claimed a chunk (a worker that wakes
 * late finds the run's chunks taken), only for chunks already being computed. On a quiet machine every thread
 * computes its own contiguous share, as a static split would. On an oversubscribed machine (the caller waited for
 * a chunk longer than its own part of the run took, i.e. a thread was descheduled inside one: once for over 20 ms,
 * or 3 times within 1024 runs; or the caller's thread got less than 85% of the wall time of sampled runs) the
 * caller computes the next runs alone (1000, a few tokens, doubling while the signs recur, up to 64000) and its
 * workers sleep, so a busy machine costs about the one-thread speed; then, still alone, it asks its probers (one
 * per worker, at the idle scheduling priority, so they take no time from anyone) to spin 5 ms each, and uses its
 * threads again only when every prober got 90% of a core (else another stretch alone). Nothing is allocated per
 * run; workers spin
 * briefly, then sleep on a condition variable. The caller's counter sink (base/alloc.h) is carried to the
 * workers for the run, so what they count belongs to the caller. One run at a time per pool.
 */
#ifndef KILN_BASE_POOL_H
#define KILN_BASE_POOL_H

#include "kiln.h"

typedef struct kiln_pool kiln_pool;
typedef void (*kiln_pool_fn)(void *ctx, int ith, int nth);
/* One chunk of a run: the items [lo, hi), computed on thread ith (0 = the caller, < kiln_pool_size). */
typedef void (*kiln_pool_range_fn)(void *ctx, int lo, int hi, int ith);

kiln_status kiln_pool_open(int n_threads, kiln_pool **out);
void kiln_pool_close(kiln_pool *p);
int kiln_pool_size(const kiln_pool *p);

/* Calls fn on disjoint ranges [lo, hi) that together cover [0, n) exactly once, then returns (n <= 0: no call).
 * Every range starts at a multiple of grain (>= 1) and is a whole number of grains long except where hi == n; the
 * pool picks the length (about 16 ranges per thread; one range, on the caller, when the pool has one thread or
 * runs alone on a busy machine).
 * ith is the thread that computes the range: two calls with the same ith never overlap, so ith may index
 * per-thread scratch. Which thread computes which range varies from run to run: fn must compute each item the
 * same way whatever its range and thread (then the results are bit-identical for any thread count). */
void kiln_pool_for(kiln_pool *p, int n, int grain, kiln_pool_range_fn fn, void *ctx);

/* Calls fn(ctx, i, nth) exactly once for each share i in 0..nth-1 (nth = kiln_pool_size), then returns. The
 * shares run on any threads, possibly several on one thread one after the other (never two calls for the same i
 * at once): fn may index per-share scratch by i, and must not wait for another share. */
void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *ctx);

/* Splits [0, n) into nth near-equal ranges; range ith is [*lo, *hi). */
static inline void kiln_split(int n, int ith, int nth, int *lo, int *hi) {
    int per = (n + nth - 1) / nth;
    *lo = ith * per < n ? ith * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

#endif
