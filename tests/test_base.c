/* test_base.c — the base layer: errors, phases, thread pool, counted allocation. */
#include "test.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/pool.h"
#include "base/timing.h"

TEST(base_error_message_and_prefix) {
    kiln_status st = kiln_fail(KILN_ERR_FORMAT, "key '%s' at offset %d", "general.name", 24);
    CHECK_EQ_INT(st, KILN_ERR_FORMAT);
    CHECK_STR(kiln_last_error(), "key 'general.name' at offset 24");
    kiln_fail_prefix(st, "%s: ", "model.gguf");
    CHECK_STR(kiln_last_error(), "model.gguf: key 'general.name' at offset 24");
    CHECK_STR(kiln_status_name(KILN_ERR_CONTEXT_FULL), "context full");
}

TEST(base_phases_keep_order_and_cap) {
    kiln_phases p = {0};
    kiln_phases_add(&p, "open.map", 5);
    kiln_phases_add(&p, "open.parse", 7);
    CHECK_EQ_INT(p.n, 2);
    CHECK_EQ_INT(kiln_phases_get(&p, "open.parse"), 7);
    CHECK_EQ_INT(kiln_phases_get(&p, "absent"), 0);
    for (int i = 0; i < 100; i++) kiln_phases_add(&p, "x", 1);
    CHECK_EQ_INT(p.n, KILN_MAX_PHASES);
}

typedef struct { _Atomic int hits[64]; int n; } pool_ctx;
static void pool_work(void *ctx, int ith, int nth) {
    pool_ctx *c = ctx;
    int lo, hi;
    kiln_split(c->n, ith, nth, &lo, &hi);
    for (int i = lo; i < hi; i++) atomic_fetch_add(&c->hits[i], 1);
}

TEST(base_pool_covers_every_index_once) {
    kiln_pool *p;
    REQUIRE_OK(kiln_pool_open(3, &p));
    for (int round = 0; round < 200; round++) {
        pool_ctx c = {.n = 61};
        kiln_pool_run(p, pool_work, &c);
        for (int i = 0; i < 61; i++) CHECKF(c.hits[i] == 1, "round %d index %d hit %d times", round, i, (int)c.hits[i]);
        if (test_failures()) break;
    }
    kiln_pool_close(p);
    kiln_pool *bad;
    CHECK_EQ_INT(kiln_pool_open(0, &bad), KILN_ERR_INVALID_ARG);
    CHECK(bad == NULL);
}

/* ---- kiln_pool_for: the chunked run */

#define FOR_MAX 4096
typedef struct for_ctx {
    _Atomic int hits[FOR_MAX];
    _Atomic int by[FOR_MAX];     /* the thread that computed each item */
    _Atomic int busy[8];         /* per thread: inside a call now */
    _Atomic int bad_ith, bad_range, overlap, calls, max_len;
    int n, grain, size, sleep_ith, sleep_us, item_work; /* item_work: extra spin iterations per item */
    int wait_worker_ms;          /* > 0: the caller's first call waits up to this long for a worker to enter a call */
    _Atomic int worker_calls;
    _Atomic int slept;           /* sleep_ith slept once in this run (1) */
    _Atomic int slept_ith;       /* the thread that slept (sleep_ith, or with SLEEP_ANY_WORKER the first worker) */
    uint64_t seed;               /* > 0: some calls sleep a few microseconds (shuffles the interleavings) */
    _Atomic uint64_t caller_out; /* when the caller's last call of the run returned (kiln_now_ns) */
} for_ctx;

#define SLEEP_ANY_WORKER (-2) /* sleep_ith: the first worker (not the caller) to claim a chunk sleeps */

static void for_sleep(int us) { struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000}; nanosleep(&ts, NULL); }

/* Yields until *flag is nonzero or max_ms passed: a caller waiting for a worker to join its run (on a busy machine a
 * worker can wake after the caller has computed every chunk of a short run). */
static void wait_for_flag(_Atomic int *flag, int max_ms) {
    const uint64_t t0 = kiln_now_ns();
    while (!atomic_load(flag) && kiln_now_ns() - t0 < (uint64_t)max_ms * 1000000u) sched_yield();
}

static void for_work(void *ctx, int lo, int hi, int ith) {
    for_ctx *c = ctx;
    atomic_fetch_add(&c->calls, 1);
    if (ith < 0 || ith >= c->size) { atomic_store(&c->bad_ith, 1); return; }
    if (ith > 0) atomic_fetch_add(&c->worker_calls, 1);
    else if (c->wait_worker_ms) wait_for_flag(&c->worker_calls, c->wait_worker_ms), c->wait_worker_ms = 0;
    if (atomic_exchange(&c->busy[ith], 1)) atomic_store(&c->overlap, 1);
    const int len = hi - lo;
    if (lo < 0 || hi > c->n || lo >= hi || lo % c->grain || (hi != c->n && len % c->grain)) atomic_store(&c->bad_range, 1);
    for (int m = atomic_load(&c->max_len); len > m && !atomic_compare_exchange_weak(&c->max_len, &m, len);) {}
    const bool sleeper = ith == c->sleep_ith || (c->sleep_ith == SLEEP_ANY_WORKER && ith > 0);
    if (sleeper && !atomic_exchange(&c->slept, 1)) {
        atomic_store(&c->slept_ith, ith);
        for_sleep(c->sleep_us);
    }
    if (c->seed && ((unsigned)(lo * 2654435761u + c->seed) >> 28) == 0) for_sleep(1 + (lo & 31));
    for (int i = lo > 0 ? lo : 0; i < hi && i < FOR_MAX; i++) {
        atomic_fetch_add(&c->hits[i], 1);
        atomic_store(&c->by[i], ith);
        for (volatile int k = 0; k < 50 + c->item_work; k++) {} /* some work, so that every thread gets to claim */
    }
    atomic_store(&c->busy[ith], 0);
    if (ith == 0) atomic_store(&c->caller_out, kiln_now_ns());
}

/* Checks one finished run: every item computed exactly once, in well-formed ranges, on valid threads. */
static void for_check(for_ctx *c, const char *what, int run) {
    CHECKF(!c->bad_ith && !c->bad_range && !c->overlap, "%s run %d: bad thread %d, bad range %d, overlap %d", what, run,
           (int)c->bad_ith, (int)c->bad_range, (int)c->overlap);
    for (int i = 0; i < c->n && !test_failures(); i++)
        CHECKF(c->hits[i] == 1, "%s run %d: item %d of %d computed %d times", what, run, i, c->n, (int)c->hits[i]);
}

/* n_threads 1..4, sizes 0..4096 and grains 1, 7, 16, 1000 runs each: every item of every run is computed exactly
 * once, each range is grain-aligned, each call's thread is in 0..size-1 and no thread is in two calls at once;
 * one thread computes the whole run in a single call. The pool is reopened every 100 runs (a stall on this busy
 * machine makes a pool compute its next runs alone), and some runs must have used several threads. */
TEST(base_pool_for_computes_every_chunk_once) {
    const int sizes[] = {0, 1, 5, 16, 61, 577, 4096}, grains[] = {1, 7, 16};
    for (int nt = 1; nt <= 4 && !test_failures(); nt++) {
        kiln_pool *p = NULL;
        int shared_runs = 0;
        for (int run = 0; run < 1000 && !test_failures(); run++) {
            if (run % 100 == 0) {
                kiln_pool_close(p);
                REQUIRE_OK(kiln_pool_open(nt, &p));
                CHECK_EQ_INT(kiln_pool_size(p), nt);
            }
            static for_ctx c;
            memset(&c, 0, sizeof c);
            c.n = sizes[run % 7], c.grain = grains[run % 3], c.size = nt, c.sleep_ith = -1, c.seed = run % 5 ? 0 : (uint64_t)run;
            kiln_pool_for(p, c.n, c.grain, for_work, &c);
            for_check(&c, "pool_for", run);
            if (nt == 1) CHECKF(c.calls == (c.n > 0), "1 thread: %d calls for %d items", (int)c.calls, c.n);
            int first = c.n ? c.by[0] : 0, several = 0;
            for (int i = 1; i < c.n; i++) several |= c.by[i] != first;
            shared_runs += several;
        }
        kiln_pool_close(p);
        printf("  %d threads: %d of 1000 runs computed on several threads\n", nt, shared_runs);
        if (nt > 1) CHECKF(shared_runs > 0, "%d threads: no run used more than one thread", nt);
    }
}

/* A worker that stops for 200 ms inside its first chunk costs the run that chunk only: the caller and the other
 * workers take every other chunk of its share (the static pool, where each worker owns its share, left the sleeper
 * its whole share). The sleeper is the first worker to claim a chunk (with more threads than cores a given worker
 * may not run before the others finish); runs until one did (a worker can also wake after every chunk is taken). */
TEST(base_pool_for_takes_over_a_stalled_workers_share) {
    for (int nt = 2; nt <= 4; nt++) {
        int tries = 0;
        static for_ctx c;
        do { /* a fresh pool each time: a busy machine makes a pool run alone for a while */
            kiln_pool *p;
            REQUIRE_OK(kiln_pool_open(nt, &p));
            memset(&c, 0, sizeof c);
            c.n = FOR_MAX, c.grain = 1, c.size = nt, c.sleep_ith = SLEEP_ANY_WORKER, c.sleep_us = 200000, c.item_work = 1000;
            kiln_pool_for(p, c.n, c.grain, for_work, &c);
            for_check(&c, "stalled worker", tries);
            kiln_pool_close(p);
        } while (!c.slept && ++tries < 50 && !test_failures());
        REQUIREF(c.slept, "%d threads: no worker claimed a chunk in 50 runs", nt);
        int mine = 0;
        for (int i = 0; i < c.n; i++) mine += c.by[i] == c.slept_ith;
        CHECKF(mine <= c.max_len, "%d threads: the stalled worker %d computed %d items, more than its one chunk (%d)", nt,
               (int)c.slept_ith, mine, (int)c.max_len);
    }
}

/* A 2-thread pool whose last run had worker 1 stop 300 ms inside a chunk (far longer than the rest of the run takes,
 * even under qemu, and over the pool's 20 ms: a long stall); fresh pools until the worker claimed a chunk, at most
 * 50 (then the test fails and NULL). */
static kiln_pool *pool_after_a_stall(for_ctx *c) {
    for (int tries = 0; tries < 50; tries++) {
        kiln_pool *p;
        if (kiln_pool_open(2, &p) != KILN_OK) break;
        memset(c, 0, sizeof *c);
        c->n = FOR_MAX, c->grain = 1, c->size = 2, c->sleep_ith = 1, c->sleep_us = 300000, c->item_work = 200;
        c->wait_worker_ms = 20;
        kiln_pool_for(p, c->n, c->grain, for_work, c);
        if (c->slept) return p;
        kiln_pool_close(p);
    }
    test_failf(__FILE__, __LINE__, "the worker never claimed a chunk in 50 runs");
    return NULL;
}

/* After a long stall the caller computes the next run alone, in one call. */
TEST(base_pool_for_runs_alone_after_a_stall) {
    static for_ctx c;
    kiln_pool *p = pool_after_a_stall(&c);
    if (!p) return;
    memset(&c, 0, sizeof c);
    c.n = FOR_MAX, c.grain = 1, c.size = 2, c.sleep_ith = -1, c.item_work = 1000;
    kiln_pool_for(p, c.n, c.grain, for_work, &c);
    for_check(&c, "after a stall", 0);
    CHECKF(c.calls == 1 && c.by[c.n - 1] == 0, "after a stall: %d calls, last item on thread %d", (int)c.calls,
           (int)c.by[c.n - 1]);
    kiln_pool_close(p);
}

/* A stall has sent the pool alone; at the end of the stretch (1000 runs) it asks its idle-priority prober to spin
 * 5 ms and goes on alone meanwhile; on a machine with a free core the prober gets it and a run uses both threads
 * again: after more than the stretch's runs (those during the probe) and not before the probe's 5 ms (a try of the
 * threads right after the stretch comes after exactly 1000 runs of a few microseconds). On a busy machine a probe
 * can find no free core and start another stretch: up to 10 s of runs. */
TEST(base_pool_for_probes_the_workers_cores_before_it_returns_to_them) {
    static for_ctx c;
    kiln_pool *p = pool_after_a_stall(&c);
    if (!p) return;
    const uint64_t t0 = kiln_now_ns();
    int runs = 0;
    do {
        memset(&c, 0, sizeof c);
        c.n = 64, c.grain = 1, c.size = 2, c.sleep_ith = -1, c.item_work = -40;
        kiln_pool_for(p, c.n, c.grain, for_work, &c);
        for_check(&c, "after a stall", runs++);
    } while (c.calls == 1 && kiln_now_ns() - t0 < 10000000000u && !test_failures());
    const double ms = (double)(kiln_now_ns() - t0) / 1e6;
    kiln_pool_close(p);
    printf("  back to both threads after %d runs alone, %.1f ms\n", runs - 1, ms);
    CHECKF(c.calls > 1, "no run used both threads in %.0f ms (%d runs) after a stall", ms, runs);
    CHECKF(runs - 1 > 1000 && ms >= 5.0, "both threads again after %d runs alone and %.1f ms: not after a 5 ms "
           "probe that followed the stretch of 1000 runs", runs - 1, ms);
}

/* A short stall: worker 1 stops us microseconds inside its first chunk of a 256-item run (a quiet machine's lost
 * tick, under the pool's 20 ms). Returns whether it slept and the caller then waited for it longer than its own part
 * took plus 0.3 ms (the pool's stall, whose slack is 0.2 ms: a worker that took long to join can leave the caller's
 * own part longer than the wait). */
static bool short_stall_run(kiln_pool *p, for_ctx *c, int run, int us) {
    memset(c, 0, sizeof *c);
    c->n = 256, c->grain = 1, c->size = 2, c->sleep_ith = 1, c->sleep_us = us, c->wait_worker_ms = 20;
    const uint64_t t0 = kiln_now_ns();
    kiln_pool_for(p, c->n, c->grain, for_work, c);
    const uint64_t t2 = kiln_now_ns(), t1 = atomic_load(&c->caller_out);
    for_check(c, "short stall", run);
    return c->slept && t1 && t2 - t1 > t1 - t0 + 300000;
}

/* One run of FOR_MAX items with no sleeper; returns how many calls computed it (1: the caller alone). */
static int plain_run_calls(kiln_pool *p, for_ctx *c, int run) {
    memset(c, 0, sizeof *c);
    c->n = FOR_MAX, c->grain = 1, c->size = 2, c->sleep_ith = -1, c->item_work = 1000, c->wait_worker_ms = 20;
    kiln_pool_for(p, c->n, c->grain, for_work, c);
    for_check(c, "plain run", run);
    return c->calls;
}

/* A lone short stall is not a sign of an oversubscribed machine: a later run still uses both threads (tries until
 * the worker slept in a run, then up to 20 runs for one computed on both threads: a worker may wake too late for a
 * given run). */
TEST(base_pool_for_a_lone_short_stall_keeps_the_threads) {
    static for_ctx c;
    bool slept = false, shared = false;
    for (int tries = 0; tries < 50 && !shared && !test_failures(); tries++) {
        kiln_pool *p;
        REQUIRE_OK(kiln_pool_open(2, &p));
        bool now = false; /* a fresh pool's worker may start after the caller did every chunk: try a few runs */
        for (int run = 0; run < 40 && !now && !test_failures(); run++) now = short_stall_run(p, &c, run, 8000);
        if (now) {
            slept = true;
            for (int run = 0; run < 20 && !shared && !test_failures(); run++) shared = plain_run_calls(p, &c, run) > 1;
        }
        kiln_pool_close(p);
    }
    CHECKF(slept && shared, "worker slept in some try: %d; after one short stall a later run used both threads: %d",
           slept, shared);
}

/* Three short stalls within the pool's window are a sign: the next run is computed alone, in one call. (On a busy
 * machine the caller itself can be descheduled while the worker sleeps, and then the pool rightly sees no stall:
 * such a try is retried, up to 50 fresh pools.) */
/* A fresh 2-thread pool after three short stalls of us microseconds within its first 40 runs, or NULL (closed) when
 * the worker did not stall three times. */
static kiln_pool *pool_after_three_stalls(for_ctx *c, int us) {
    kiln_pool *p;
    if (kiln_pool_open(2, &p) != KILN_OK) return NULL;
    int stalls = 0;
    for (int run = 0; run < 40 && stalls < 3 && !test_failures(); run++) stalls += short_stall_run(p, c, run, us);
    if (stalls == 3) return p;
    kiln_pool_close(p);
    return NULL;
}

TEST(base_pool_for_runs_alone_after_three_short_stalls) {
    static for_ctx c;
    int tries_with_three = 0, calls = 0;
    for (int tries = 0; tries < 50 && !test_failures(); tries++) {
        kiln_pool *p = pool_after_three_stalls(&c, 8000);
        if (!p) continue;
        tries_with_three++;
        calls = plain_run_calls(p, &c, 0);
        kiln_pool_close(p);
        if (calls == 1 && c.by[c.n - 1] == 0) return;
    }
    test_failf(__FILE__, __LINE__, "in 50 tries the worker slept in three runs %d times, and the next run was never "
               "computed alone (last: %d calls)", tries_with_three, calls);
}

/* Three short stalls that cost the caller little (1.5 ms each: ~5 ms, under an eighth of the 50 ms or more the pool
 * weighs them against) are not a sign: a later run still uses both threads. (Going alone for 1000 runs on such
 * stalls, a 2-core VM's lost ticks, cost the MoE model's decode 15-30%.) Tries until the worker slept in three runs
 * of one pool, then up to 20 runs for one computed on both threads. */
TEST(base_pool_for_three_cheap_short_stalls_keep_the_threads) {
    static for_ctx c;
    int tries_with_three = 0;
    bool shared = false;
    for (int tries = 0; tries < 50 && !shared && !test_failures(); tries++) {
        kiln_pool *p = pool_after_three_stalls(&c, 1500);
        if (!p) continue;
        tries_with_three++;
        for (int run = 0; run < 20 && !shared && !test_failures(); run++) shared = plain_run_calls(p, &c, run) > 1;
        kiln_pool_close(p);
    }
    CHECKF(shared, "in 50 tries the worker slept in three runs %d times, and no later run used both threads",
           tries_with_three);
}

/* Whether this system reports a thread's run delay (the pool's CPU-share sign needs it); prints why not. */
static bool run_delay_known(void) {
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    unsigned long long run, delay;
    const bool ok = f && fscanf(f, "%llu %llu", &run, &delay) == 2;
    if (f) fclose(f);
    if (!ok) printf("  skipped: /proc/thread-self/schedstat unreadable: the pool counts every low CPU share\n");
    return ok;
}

/* The caller's CPU share is low but no thread of this machine took its core (it sleeps 300 us in each run's first
 * chunk, as a VM's caller loses time when its host takes the vCPU): not a sign. Over 600 runs (two windows of the
 * CPU-share samples and more) hardly any run is computed alone (a sign would send the next 1000 alone). Up to 5
 * tries: a busy machine can rightly send a try alone. */
TEST(base_pool_for_keeps_the_threads_when_the_caller_loses_time_to_no_other_thread) {
    if (!run_delay_known()) return;
    static for_ctx c;
    int alone = 0;
    for (int tries = 0; tries < 5 && !test_failures(); tries++) {
        kiln_pool *p;
        REQUIRE_OK(kiln_pool_open(2, &p));
        alone = 0;
        for (int run = 0; run < 600 && !test_failures(); run++) {
            memset(&c, 0, sizeof c);
            c.n = 256, c.grain = 1, c.size = 2, c.sleep_ith = 0, c.sleep_us = 300;
            kiln_pool_for(p, c.n, c.grain, for_work, &c);
            for_check(&c, "caller sleeps", run);
            alone += c.calls == 1;
        }
        kiln_pool_close(p);
        printf("  try %d: %d of 600 runs computed in one call\n", tries, alone);
        if (alone < 100) return;
    }
    CHECKF(alone < 100, "%d of 600 runs computed alone: a CPU share lost to no other thread sent the pool alone", alone);
}

typedef struct { _Atomic int stop; int cpu; } spinner_arg;
static void *spin_on_cpu(void *arg) {
    spinner_arg *a = arg;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(a->cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    while (!atomic_load(&a->stop)) {}
    return NULL;
}

/* Another thread shares the caller's core (both pinned to one CPU, the worker free to run on the others): the caller
 * waits for its core and loses CPU share, a sign; the pool computes runs alone (20 in a row) within 10 s. */
TEST(base_pool_for_runs_alone_when_another_thread_shares_the_callers_core) {
    cpu_set_t all, one;
    if (pthread_getaffinity_np(pthread_self(), sizeof all, &all) != 0 || CPU_COUNT(&all) < 2) {
        printf("  skipped: fewer than 2 CPUs to run on\n");
        return;
    }
    int cpu = 0;
    while (!CPU_ISSET(cpu, &all)) cpu++;
    kiln_pool *p;
    REQUIRE_OK(kiln_pool_open(2, &p)); /* before the pinning: the worker keeps every CPU */
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    spinner_arg sa = {.cpu = cpu};
    pthread_t spinner;
    REQUIRE(pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0);
    REQUIRE(pthread_create(&spinner, NULL, spin_on_cpu, &sa) == 0);
    static for_ctx c;
    int in_a_row = 0, runs = 0;
    const uint64_t t0 = kiln_now_ns();
    while (in_a_row < 20 && kiln_now_ns() - t0 < 10000000000u && !test_failures()) {
        memset(&c, 0, sizeof c);
        c.n = 256, c.grain = 1, c.size = 2, c.sleep_ith = -1, c.item_work = 200;
        kiln_pool_for(p, c.n, c.grain, for_work, &c);
        for_check(&c, "shared core", runs++);
        in_a_row = c.calls == 1 && c.by[c.n - 1] == 0 ? in_a_row + 1 : 0;
    }
    atomic_store(&sa.stop, 1);
    pthread_join(spinner, NULL);
    pthread_setaffinity_np(pthread_self(), sizeof all, &all);
    kiln_pool_close(p);
    printf("  %d runs, %.0f ms, until 20 in a row were computed alone\n", runs, (kiln_now_ns() - t0) / 1e6);
    CHECKF(in_a_row >= 20, "the caller's core shared for 10 s (%d runs) and the pool still used both threads", runs);
}

/* What the workers count during a chunked run goes to the caller's sink: every item allocates once, on whichever
 * thread computes it, and the caller's sink holds them all. The caller's items wait (up to 10 s) until the worker
 * has computed one, so that some surely run on the worker however slowly it wakes (a fresh thread on a busy
 * 2-core CI machine can miss a whole run). */
typedef struct { _Atomic int on_worker; } sink_run;
static void alloc_items(void *ctx, int lo, int hi, int ith) {
    sink_run *r = ctx;
    if (!ith) wait_for_flag(&r->on_worker, 10000);
    for (int i = lo; i < hi; i++) {
        kiln_free(kiln_malloc(8));
        if (ith) atomic_fetch_add(&r->on_worker, 1);
    }
}

TEST(base_pool_for_carries_the_counter_sink) {
    sink_run r = {0};
    kiln_pool *p;
    REQUIRE_OK(kiln_pool_open(2, &p));
    kiln_counters sink = {0}, got;
    kiln_counters *prev = kiln_counters_enter(&sink);
    kiln_pool_for(p, 256, 1, alloc_items, &r);
    kiln_counters_leave(prev);
    kiln_counters_snapshot(&sink, &got);
    CHECK_EQ_INT(got.host_allocs, 256);
    CHECKF(r.on_worker > 0, "no item ran on the worker in 10 s");
    kiln_pool_close(p);
}

TEST(base_counted_allocs_are_counted) {
    kiln_counters a, b;
    kiln_counters_read(&a);
    uint64_t h0 = test_heap_calls();
    void *p = kiln_malloc(10);
    kiln_counters_read(&b);
    CHECK_EQ_INT(b.host_allocs - a.host_allocs, 1);
    CHECK(test_heap_calls() > h0);
    kiln_free(p);
}

/* The counter sink is per thread: thread 1 enters sink A, then thread 2 enters sink B and allocates, then
 * thread 1 allocates; each sink holds exactly its own thread's allocation (a process-wide sink would give
 * B both). Leaving restores the previous sink. */
typedef struct sink_ctx {
    kiln_counters *b;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage;
} sink_ctx;

static void sink_wait(sink_ctx *c, int stage) {
    pthread_mutex_lock(&c->mu);
    while (c->stage < stage) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void sink_advance(sink_ctx *c) {
    pthread_mutex_lock(&c->mu);
    c->stage++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *sink_thread2(void *arg) {
    sink_ctx *c = arg;
    sink_wait(c, 1);
    kiln_counters *prev = kiln_counters_enter(c->b);
    kiln_free(kiln_malloc(8));
    sink_advance(c); /* stage 2: thread 1 allocates while this thread is still inside sink B */
    sink_wait(c, 3);
    kiln_counters_leave(prev);
    return NULL;
}

TEST(base_counter_sink_is_per_thread) {
    kiln_counters a = {0}, b = {0};
    sink_ctx c = {.b = &b, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, sink_thread2, &c) == 0);
    kiln_counters *prev = kiln_counters_enter(&a);
    sink_advance(&c); /* stage 1 */
    sink_wait(&c, 2);
    kiln_free(kiln_malloc(8));
    kiln_counters_leave(prev);
    sink_advance(&c); /* stage 3 */
    pthread_join(t, NULL);
    CHECK_EQ_INT(a.host_allocs, 1);
    CHECK_EQ_INT(b.host_allocs, 1);
    CHECK(kiln_counters_sink() == prev);
}
