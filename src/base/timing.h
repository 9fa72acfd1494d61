/*
 * timing.h — a monotonic clock and a small fixed list of named phases (open.map, open.parse, ...).
 * Each phase is measured once; the list never allocates.
 */
#ifndef KILN_BASE_TIMING_H
#define KILN_BASE_TIMING_H

#include <stdint.h>
#include <stddef.h>

#include "kiln.h"

uint64_t kiln_now_ns(void);

#define KILN_MAX_PHASES 32

typedef struct kiln_phases {
    kiln_phase items[KILN_MAX_PHASES];
    size_t n;
} kiln_phases;

/* Appends a phase (name must be a string literal or outlive the list). Extra phases are dropped. */
void kiln_phases_add(kiln_phases *p, const char *name, uint64_t ns);
/* Adds the phases of src to dst. */
void kiln_phases_append(kiln_phases *dst, const kiln_phases *src);
/* ns of the phase with this name, 0 when absent. */
uint64_t kiln_phases_get(const kiln_phases *p, const char *name);

#endif
