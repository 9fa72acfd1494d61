/*
 * alloc.h — counted heap allocation and the first-call counters.
 * Every heap allocation kiln makes goes through kiln_malloc/kiln_calloc/kiln_realloc so that the
 * first-call contract (no allocation after session open) can be counted. Backends bump the device
 * counters through kiln_count_*.
 *
 * Counts go to the process-wide totals and, while a thread has entered a sink (kiln_counters_enter), to
 * that sink too: a session enters its own counters at the start of each of its calls and leaves them at
 * the end, so its counters hold exactly what happened inside its own calls (a tokenize or a sampler opened
 * by the caller between them does not show). The thread pool carries the caller's sink to its workers.
 */
#ifndef KILN_BASE_ALLOC_H
#define KILN_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

void *kiln_malloc(size_t n);
void *kiln_calloc(size_t count, size_t size);
void *kiln_realloc(void *p, size_t n);
/* Aligned allocation (align: a power of two >= sizeof(void*)); freed with kiln_free. */
void *kiln_aligned_alloc(size_t align, size_t n);
char *kiln_strndup(const char *s, size_t n);
void kiln_free(void *p);

typedef struct kiln_counters {
    uint64_t host_allocs, device_allocs, module_loads, graph_captures, jit_compiles;
} kiln_counters;

/* The process-wide totals. */
void kiln_counters_read(kiln_counters *out);
/* From now on this thread's counts also go to sink (NULL: none; added atomically, so several threads
 * may share one sink). Returns the previous sink, which the caller restores with kiln_counters_leave. */
kiln_counters *kiln_counters_enter(kiln_counters *sink);
void kiln_counters_leave(kiln_counters *prev);
/* This thread's current sink (NULL when none). */
kiln_counters *kiln_counters_sink(void);
/* An atomic snapshot of a sink's counters. */
void kiln_counters_snapshot(const kiln_counters *sink, kiln_counters *out);

void kiln_count_device_alloc(void);
void kiln_count_module_load(void);
void kiln_count_graph_capture(void);
void kiln_count_jit_compile(void);

/* Overflow-checked size arithmetic: returns 0 on overflow (and leaves *out unspecified). */
static inline int kiln_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline int kiln_add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

#endif
