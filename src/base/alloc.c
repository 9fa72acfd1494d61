/* alloc.c — counted heap allocation and the process-wide first-call counters. */
#include "base/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t n_host, n_device, n_module, n_graph, n_jit;

void *kiln_malloc(size_t n) {
    atomic_fetch_add_explicit(&n_host, 1, memory_order_relaxed);
    return malloc(n ? n : 1);
}

void *kiln_calloc(size_t count, size_t size) {
    atomic_fetch_add_explicit(&n_host, 1, memory_order_relaxed);
    return calloc(count ? count : 1, size ? size : 1);
}

void *kiln_realloc(void *p, size_t n) {
    atomic_fetch_add_explicit(&n_host, 1, memory_order_relaxed);
    return realloc(p, n ? n : 1);
}

void *kiln_aligned_alloc(size_t align, size_t n) {
    atomic_fetch_add_explicit(&n_host, 1, memory_order_relaxed);
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

void kiln_count_device_alloc(void) { atomic_fetch_add(&n_device, 1); }
void kiln_count_module_load(void) { atomic_fetch_add(&n_module, 1); }
void kiln_count_graph_capture(void) { atomic_fetch_add(&n_graph, 1); }
void kiln_count_jit_compile(void) { atomic_fetch_add(&n_jit, 1); }
