/* test_base.c — the base layer: errors, phases, thread pool, counted allocation. */
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

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
