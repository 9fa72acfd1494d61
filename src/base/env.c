/* env.c — the registry of KILN_* environment knobs; nothing else calls getenv. A value that is not one of
 * the accepted ones is a warning on stderr (once per knob, naming the variable, the value and what is
 * accepted) and the default applies; an empty value is the same as unset. */
#include "base/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *name, *help; } knobs[] = {
    {"KILN_LOG", "log level: error|warn|info|debug (default warn)"},
    {"KILN_THREADS", "default CPU thread count (default: online cores)"},
    {"KILN_SHARED", "shared test data folder (tests; default ../shared)"},
    {"KILN_NO_SIMD", "1: scalar reference kernels only"},
    {"KILN_CPU_LEVEL", "CPU kernels: scalar|avx2|avx512|neon, at most the CPU's best (default: best)"},
    {"KILN_API_KEY", "kiln serve: the API key clients must send (default: none)"},
};

/* The knob's value, NULL when unset or empty. */
static const char *value(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Printed directly (not through kiln_log, which itself reads KILN_LOG); *warned keeps it to once. */
static void warn_invalid(bool *warned, const char *name, const char *v, const char *accepted, const char *fallback) {
    if (*warned) return;
    *warned = true;
    fprintf(stderr, "kiln: warning: %s='%s' is not valid (accepted: %s); using %s\n", name, v, accepted, fallback);
}

int kiln_env_log_level(void) {
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    static bool warned;
    const char *v = value("KILN_LOG");
    if (!v) return 1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, levels[i])) return i;
    warn_invalid(&warned, "KILN_LOG", v, "error, warn, info, debug", "warn");
    return 1;
}

int kiln_env_threads(void) {
    static bool warned;
    const char *v = value("KILN_THREADS");
    if (!v) return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || n < 1 || n > 1024) {
        warn_invalid(&warned, "KILN_THREADS", v, "an integer in 1..1024", "all online cores");
        return 0;
    }
    return (int)n;
}

const char *kiln_env_shared(void) {
    const char *v = getenv("KILN_SHARED");
    return v && *v ? v : "../shared";
}

bool kiln_env_no_simd(void) {
    static bool warned;
    const char *v = value("KILN_NO_SIMD");
    if (!v || !strcmp(v, "0")) return false;
    if (!strcmp(v, "1")) return true;
    warn_invalid(&warned, "KILN_NO_SIMD", v, "0, 1", "0 (SIMD kernels where the CPU has them)");
    return false;
}

const char *kiln_env_cpu_level(void) {
    static const char *const levels[] = {"scalar", "avx2", "avx512", "neon"};
    static bool warned;
    const char *v = value("KILN_CPU_LEVEL");
    if (!v) return NULL;
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, levels[i])) return levels[i];
    warn_invalid(&warned, "KILN_CPU_LEVEL", v, "scalar, avx2, avx512, neon", "the CPU's best level");
    return NULL;
}

const char *kiln_env_api_key(void) {
    const char *v = getenv("KILN_API_KEY");
    return v && *v ? v : NULL;
}

void kiln_env_print(void) {
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        const char *v = getenv(knobs[i].name);
        if (v && !strcmp(knobs[i].name, "KILN_API_KEY")) v = "(set)"; /* never print the secret */
        printf("  %-14s %-10s %s\n", knobs[i].name, v ? v : "(unset)", knobs[i].help);
    }
}
