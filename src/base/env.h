/*
 * env.h — the registry of KILN_* environment knobs. This is the one place that reads the environment.
 *   KILN_LOG      error|warn|info|debug (default warn)
 *   KILN_THREADS  default thread count (default: online cores)
 *   KILN_SHARED   the shared test-data folder (tests only; default ../shared)
 *   KILN_NO_SIMD  1: use the scalar reference kernels everywhere (0 or unset: SIMD where the CPU has it)
 *   KILN_CPU_LEVEL  scalar|avx2|avx512|neon: run the CPU kernels at this level, at most the CPU's best
 *                 (formats.h kiln_cpu_level; default: the best)
 * An invalid value is a warning naming the variable and the accepted values; the default then applies.
 *   KILN_API_KEY  kiln serve: the key clients must send as Authorization: Bearer (default: none)
 */
#ifndef KILN_BASE_ENV_H
#define KILN_BASE_ENV_H

#include <stdbool.h>

int kiln_env_log_level(void);
int kiln_env_threads(void);          /* 0 when unset */
const char *kiln_env_shared(void);   /* never NULL */
bool kiln_env_no_simd(void);
const char *kiln_env_cpu_level(void); /* one of "scalar", "avx2", "avx512", "neon"; NULL when unset */
const char *kiln_env_api_key(void);  /* NULL when unset or empty */

/* Prints every knob with its current value (for `kiln info`). */
void kiln_env_print(void);

#endif
