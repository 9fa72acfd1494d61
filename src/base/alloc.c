/* alloc.c — counted heap allocation, the process-wide totals and the per-thread counter sink. */
#include "base/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t n_host, n_device, n_module, n_graph, n_jit;
static _Thread_local kiln_counters *tl_sink;

/* Adds one to a process-wide total and to the same field of this thread's sink. */
#define COUNT(total, field)                                                         \
    do {                                                                            \
        atomic_fetch_add_explicit(&(total), 1, memory_order_relaxed);               \
        if (tl_sink) __atomic_fetch_add(&tl_sink->field, 1, __ATOMIC_RELAXED);      \
    } while (0)

void *kiln_malloc(size_t n) {
    COUNT(n_host, host_allocs);
    return malloc(n ? n : 1);
}

void *kiln_calloc(size_t count, size_t size) {
    COUNT(n_host, host_allocs);
    return calloc(count ? count : 1, size ? size : 1);
}

void *kiln_realloc(void *p, size_t n) {
    COUNT(n_host, host_allocs);
    return realloc(p, n ? n : 1);
}

void *kiln_aligned_alloc(size_t align, size_t n) {
    COUNT(n_host, host_allocs);
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : 1) != 0) return NULL;
    return p;
}

char *kiln_strndup(const char *s, size_t n) {
    char *p = kiln_malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void kiln_free(void *p) { free(p); }

void kiln_counters_read(kiln_counters *out) {
    out->host_allocs = atomic_load(&n_host);
    out->device_allocs = atomic_load(&n_device);
    out->module_loads = atomic_load(&n_module);
    out->graph_captures = atomic_load(&n_graph);
    out->jit_compiles = atomic_load(&n_jit);
}

kiln_counters *kiln_counters_enter(kiln_counters *sink) {
    kiln_counters *prev = tl_sink;
    tl_sink = sink;
    return prev;
}

void kiln_counters_leave(kiln_counters *prev) { tl_sink = prev; }

kiln_counters *kiln_counters_sink(void) { return tl_sink; }

void kiln_counters_snapshot(const kiln_counters *sink, kiln_counters *out) {
    out->host_allocs = __atomic_load_n(&sink->host_allocs, __ATOMIC_RELAXED);
    out->device_allocs = __atomic_load_n(&sink->device_allocs, __ATOMIC_RELAXED);
    out->module_loads = __atomic_load_n(&sink->module_loads, __ATOMIC_RELAXED);
    out->graph_captures = __atomic_load_n(&sink->graph_captures, __ATOMIC_RELAXED);
    out->jit_compiles = __atomic_load_n(&sink->jit_compiles, __ATOMIC_RELAXED);
}

void kiln_count_device_alloc(void) { COUNT(n_device, device_allocs); }
void kiln_count_module_load(void) { COUNT(n_module, module_loads); }
void kiln_count_graph_capture(void) { COUNT(n_graph, graph_captures); }
void kiln_count_jit_compile(void) { COUNT(n_jit, jit_compiles); }
