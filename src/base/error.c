/* error.c — the thread-local last-error message and the assertion handler. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];

void kiln_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "kiln: %s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

kiln_status kiln_fail(kiln_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

kiln_status kiln_fail_prefix(kiln_status st, const char *fmt, ...) {
    char prefix[512], old[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    size_t np = strlen(prefix);
    if (np >= sizeof last_error) np = sizeof last_error - 1;
    memcpy(last_error, prefix, np);
    size_t no = strnlen(old, sizeof old - 1);
    if (no > sizeof last_error - 1 - np) no = sizeof last_error - 1 - np;
    memcpy(last_error + np, old, no);
    last_error[np + no] = '\0';
    return st;
}

void kiln_clear_error(void) { last_error[0] = '\0'; }

const char *kiln_last_error(void) { return last_error; }

const char *kiln_status_name(kiln_status st) {
    switch (st) {
    case KILN_OK: return "ok";
    case KILN_ERR_IO: return "io";
    case KILN_ERR_FORMAT: return "format";
    case KILN_ERR_UNSUPPORTED: return "unsupported";
    case KILN_ERR_INVALID_ARG: return "invalid argument";
    case KILN_ERR_NOMEM: return "out of memory";
    case KILN_ERR_CONTEXT_FULL: return "context full";
    case KILN_ERR_DEVICE: return "device";
    case KILN_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}
