/*
 * cmd_info.c — `kiln info`: the version, the CPU and its SIMD features, the CUDA archs built into the
 * fatbinary, the GPU found (and whether it runs kiln's kernels from SASS or would JIT-compile the PTX),
 * and every KILN_* environment knob.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#endif

#include "base/env.h"
#include "cli/cli.h"
#include "formats/formats.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

static const char *usage_text =
    "usage: kiln info\n"
    "Prints the version, the CPU features kiln dispatches on, the CUDA archs built into kiln, the GPU found\n"
    "(and whether kiln's kernels run on it from machine code or would be JIT-compiled), and the KILN_*\n"
    "environment knobs with their current values.\n"
    "  -h, --help   this help\n";

static void cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            const char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                snprintf(buf, cap, "%s", c);
                buf[strcspn(buf, "\n")] = '\0';
            }
            break;
        }
    }
    fclose(f);
}

int cmd_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        return cli_usage_error("info", usage_text, "unknown option '%s'", argv[i]);
    }
    printf("kiln %s\n", KILN_VERSION_STRING);

    char name[256];
    cpu_name(name, sizeof name);
    printf("cpu:      %s, %ld cores online\n", name, sysconf(_SC_NPROCESSORS_ONLN));
    printf("features:");
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) printf(" sse4.2");
    if (__builtin_cpu_supports("avx")) printf(" avx");
    if (__builtin_cpu_supports("avx2")) printf(" avx2");
    if (__builtin_cpu_supports("fma")) printf(" fma");
    unsigned eax, ebx, ecx = 0, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29))) printf(" f16c");
    if (__builtin_cpu_supports("avx512f")) printf(" avx512f");
    if (__builtin_cpu_supports("avx512bw")) printf(" avx512bw");
    if (__builtin_cpu_supports("avx512vl")) printf(" avx512vl");
    if (__builtin_cpu_supports("avx512vnni")) printf(" avx512vnni");
#elif defined(__aarch64__)
    printf(" neon");
#endif
    printf("\n");
    /* the level the CPU kernels run at (KILN_CPU_LEVEL / KILN_NO_SIMD lower it) */
    printf("cpu level: %s (best on this CPU: %s; KILN_CPU_LEVEL lowers it)%s\n", kiln_cpu_level_name(kiln_cpu_level()),
           kiln_cpu_level_name(kiln_cpu_level_best()),
           kiln_cpu_avx512_in_halves() ? "; 512-bit operations in 256-bit halves (Zen 4)" : "");

#ifdef KILN_HAVE_CUDA
    printf("cuda:     built for %s\n", kiln_cuda_archs_built());
    kiln_cuda_device_info di;
    kiln_cuda_probe(&di);
    if (!di.present) {
        printf("gpu:      none (%s)\n", di.reason);
    } else {
        printf("gpu:      %s, compute capability %d.%d, %d SMs, %.1f GiB, driver %d.%d, runtime %d.%d\n", di.name,
               di.cc_major, di.cc_minor, di.n_sm, di.mem_bytes / 1073741824.0, di.driver_version / 1000,
               di.driver_version % 1000 / 10, di.runtime_version / 1000, di.runtime_version % 1000 / 10);
        if (di.sass_arch)
            printf("kernels:  machine code (SASS sm_%d), no JIT\n", di.sass_arch);
        else if (di.would_jit)
            printf("kernels:  no SASS for sm_%d%d: the driver would JIT-compile the PTX at session open\n",
                   di.cc_major, di.cc_minor);
        else
            printf("kernels:  this GPU is older than every arch built: the CUDA backend cannot run on it\n");
    }
#else
    printf("cuda:     not built (nvcc was not found when kiln was built)\n");
#endif
    printf("environment:\n");
    kiln_env_print();
    return 0;
}
