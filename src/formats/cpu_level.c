/*
 * cpu_level.c — which kernel level the CPU code runs at (formats.h kiln_cpu_level): the best the CPU and the
 * build support, lowered on request through KILN_CPU_LEVEL (tests and benches compare levels in one machine)
 * or KILN_NO_SIMD=1. Decided once per process, before the type table is filled.
 */
#include <pthread.h>
#include <string.h>

#include "base/env.h"
#include "base/log.h"
#include "formats/formats.h"

#if KILN_X86
#include <cpuid.h>

int kiln_cpu_has_avx512vnni(void) {
    __builtin_cpu_init();
    return kiln_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

/* AMD family 19h with AVX-512 is Zen 4 (Zen 3, the same family, has none): 512-bit operations in two 256-bit
 * halves. */
static bool avx512_in_halves(void) {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u; /* "AuthenticAMD" */
    if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const unsigned base = (eax >> 8) & 0xF, family = base == 0xF ? base + ((eax >> 20) & 0xFF) : base;
    return family == 0x19 && kiln_cpu_has_avx512vnni();
}
#else
static bool avx512_in_halves(void) { return false; }
#endif

static const char *const level_names[] = {"scalar", "neon", "avx2", "avx512"};

const char *kiln_cpu_level_name(kiln_isa_level level) {
    return (unsigned)level < sizeof level_names / sizeof level_names[0] ? level_names[level] : "?";
}

kiln_isa_level kiln_cpu_level_best(void) {
#if KILN_X86
    if (kiln_cpu_has_avx512vnni()) return KILN_CPU_AVX512;
    if (kiln_cpu_has_avx2()) return KILN_CPU_AVX2;
    return KILN_CPU_SCALAR;
#elif KILN_NEON
    return KILN_CPU_NEON;
#else
    return KILN_CPU_SCALAR;
#endif
}

/* A requested level runs when it is the scalar one or one the best level includes (AVX512 includes AVX2). */
static bool level_allowed(kiln_isa_level want, kiln_isa_level best) {
    return want == KILN_CPU_SCALAR || want == best || (best == KILN_CPU_AVX512 && want == KILN_CPU_AVX2);
}

static kiln_isa_level chosen;
static bool halves;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    const kiln_isa_level best = kiln_cpu_level_best();
    chosen = best;
    halves = avx512_in_halves();
    if (kiln_env_no_simd()) {
        chosen = KILN_CPU_SCALAR;
        return;
    }
    const char *want = kiln_env_cpu_level();
    if (!want) return;
    for (int l = 0; l < (int)(sizeof level_names / sizeof level_names[0]); l++) {
        if (strcmp(want, level_names[l])) continue;
        if (level_allowed((kiln_isa_level)l, best)) chosen = (kiln_isa_level)l;
        else KILN_WARN("KILN_CPU_LEVEL=%s: this CPU and build support at most %s; using %s", want, level_names[best],
                       level_names[best]);
        return;
    }
}

kiln_isa_level kiln_cpu_level(void) {
    pthread_once(&chosen_once, choose);
    return chosen;
}

bool kiln_cpu_avx512_in_halves(void) {
    pthread_once(&chosen_once, choose);
    return halves;
}
