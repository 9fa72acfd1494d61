/*
 * alloc.h — counted heap allocation and the first-call counters.
 * Every heap allocation kiln makes goes through kiln_malloc/kiln_calloc/kiln_realloc so that the
 * first-call contract (no allocation after session open) can be counted. Backends bump the device
 * counters through kiln_count_*.
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

/* Process-wide counters (atomic). */
typedef struct kiln_counters {
    uint64_t host_allocs, device_allocs, module_loads, graph_captures, jit_compiles;
} kiln_counters;

void kiln_counters_read(kiln_counters *out);
void kiln_count_device_alloc(void);
void kiln_count_module_load(void);
void kiln_count_graph_capture(void);
void kiln_count_jit_compile(void);

/* Overflow-checked size arithmetic: returns 0 on overflow (and leaves *out unspecified). */
static inline int kiln_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline int kiln_add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

#endif
