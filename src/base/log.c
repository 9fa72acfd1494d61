/* log.c — leveled logging to stderr. */
#include "base/log.h"
#include "base/env.h"

#include <stdarg.h>
#include <stdio.h>

static int log_level = -1;

void kiln_log_set_level(kiln_log_level level) { log_level = (int)level; }

void kiln_log(kiln_log_level level, const char *fmt, ...) {
    if (log_level < 0) log_level = kiln_env_log_level();
    if ((int)level > log_level) return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln: %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
