/* pool.c — the fixed thread pool (generation counter + spin-then-sleep workers). */
#include "base/pool.h"
#include "base/alloc.h"
#include "base/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

/* One spin step: a pause hint on x86, nothing elsewhere. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins before a worker sleeps; after that a waiter yields the core (the machine may be oversubscribed). */
#define SPIN_BEFORE_SLEEP 20000
#define SPIN_BEFORE_YIELD 2000

typedef struct kiln_pool kiln_pool;
typedef struct { kiln_pool *p; int ith; } worker_arg;

struct kiln_pool {
    int n;
    worker_arg *args;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kiln_pool_fn fn;
    void *ctx;
    kiln_counters *sink;   /* the caller's counter sink, carried to the workers for one run */
    _Atomic uint64_t generation;
    _Atomic int pending;
    _Atomic bool quit;
};


static void *worker_main(void *arg) {
    kiln_pool *p = ((worker_arg *)arg)->p;
    int ith = ((worker_arg *)arg)->ith;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->quit)) {
            if (++spins < SPIN_BEFORE_SLEEP) { cpu_relax(); continue; }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = g;
        kiln_counters *prev = kiln_counters_enter(p->sink);
        p->fn(p->ctx, ith, p->n);
        kiln_counters_leave(prev);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

kiln_status kiln_pool_open(int n_threads, kiln_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_pool_open: thread count %d out of range 1..1024", n_threads);
    kiln_pool *p = kiln_calloc(1, sizeof *p);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "kiln_pool_open: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = kiln_calloc((size_t)n_threads, sizeof(pthread_t));
    p->args = kiln_calloc((size_t)n_threads, sizeof(worker_arg));
    if (!p->threads || !p->args) { p->n = 1; kiln_pool_close(p); return kiln_fail(KILN_ERR_NOMEM, "kiln_pool_open: out of memory"); }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = &p->args[i];
        a->p = p;
        a->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
            p->n = i;
            kiln_pool_close(p);
            return kiln_fail(KILN_ERR_INTERNAL, "kiln_pool_open: pthread_create failed");
        }
    }
    *out = p;
    return KILN_OK;
}

void kiln_pool_close(kiln_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    kiln_free(p->threads);
    kiln_free(p->args);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    kiln_free(p);
}

int kiln_pool_size(const kiln_pool *p) { return p->n; }

void kiln_pool_run(kiln_pool *p, kiln_pool_fn fn, void *ctx) {
    if (p->n == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    p->sink = kiln_counters_sink();
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_BEFORE_YIELD) cpu_relax();
        else sched_yield();
    }
}
