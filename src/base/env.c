/* env.c — the registry of KILN_* environment knobs; nothing else calls getenv. */
#include "base/env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *name, *help; } knobs[] = {
    {"KILN_LOG", "log level: error|warn|info|debug (default warn)"},
    {"KILN_THREADS", "default CPU thread count (default: online cores)"},
    {"KILN_SHARED", "shared test data folder (tests; default ../shared)"},
    {"KILN_NO_SIMD", "1: scalar reference kernels only"},
    {"KILN_API_KEY", "kiln serve: the API key clients must send (default: none)"},
};

int kiln_env_log_level(void) {
    const char *v = getenv("KILN_LOG");
    if (!v) return 1;
    if (!strcmp(v, "error")) return 0;
    if (!strcmp(v, "warn")) return 1;
    if (!strcmp(v, "info")) return 2;
    if (!strcmp(v, "debug")) return 3;
    return 1;
}

int kiln_env_threads(void) {
    const char *v = getenv("KILN_THREADS");
    if (!v) return 0;
    int n = atoi(v);
    return n > 0 && n <= 1024 ? n : 0;
}

const char *kiln_env_shared(void) {
    const char *v = getenv("KILN_SHARED");
    return v && *v ? v : "../shared";
}

bool kiln_env_no_simd(void) {
    const char *v = getenv("KILN_NO_SIMD");
    return v && v[0] == '1';
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
