/* timing.c — monotonic clock and phase lists. */
#include "base/timing.h"

#include <string.h>
#include <time.h>

uint64_t kiln_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kiln_phases_add(kiln_phases *p, const char *name, uint64_t ns) {
    if (p->n >= KILN_MAX_PHASES) return;
    p->items[p->n].name = name;
    p->items[p->n].ns = ns;
    p->n++;
}

void kiln_phases_append(kiln_phases *dst, const kiln_phases *src) {
    for (size_t i = 0; i < src->n; i++) kiln_phases_add(dst, src->items[i].name, src->items[i].ns);
}

uint64_t kiln_phases_get(const kiln_phases *p, const char *name) {
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->items[i].name, name)) return p->items[i].ns;
    return 0;
}
