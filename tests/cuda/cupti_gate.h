/*
 * cupti_gate.h — what the CUDA driver does in this process, counted from outside kiln through CUPTI (test
 * binaries only: build/cuda/kiln_tests_cuda links it with -lcupti when the toolkit has libcupti; never part
 * of libkiln). A subscriber to the driver API and resource callback domains counts every allocation, module /
 * kernel load, link, graph capture or instantiation, and CUPTI's activity records count lazy function loads
 * and JIT compilations, whoever makes the call (kiln, the CUDA runtime, a library). Counters are cumulative;
 * a window is the difference of two snapshots.
 */
#ifndef KILN_TEST_CUPTI_GATE_H
#define KILN_TEST_CUPTI_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cg_counts {
    uint64_t device_allocs;  /* cuMemAlloc*, cuMemHostAlloc, cuMemCreate, cuMemHostRegister, cuArray*Create */
    uint64_t module_loads;   /* cuModuleLoad*, cuLibraryLoad*, cuModuleGetFunction, cuLibraryGetKernel,
                              * cuKernelGetFunction, cuLink*, resource MODULE_LOADED, lazy function and
                              * runtime-triggered module loads (activity overhead records) */
    uint64_t graph_captures; /* cuStreamBeginCapture*, cuGraphCreate, cuGraphInstantiate*, cuGraphExecUpdate,
                              * cuGraphClone, cuGraphAdd*, resource GRAPH(EXEC)_CREATED / GRAPH_CLONED */
    uint64_t jit_compiles;   /* JIT activity records, driver-compiler overhead records */
    uint64_t driver_calls;   /* every driver API call seen (proves the subscriber sees the calls at all) */
    char names[512];         /* the counted calls since the previous snapshot, "name xN, ..." */
} cg_counts;

/* Subscribes to the driver API and resource domains and enables the overhead and JIT activity records; call
 * before the first CUDA call of the process. False with the reason in why (another subscriber, such as a
 * profiler, or CUPTI failing). */
bool cg_start(char *why, size_t cap);
/* Flushes the activity records, then copies the counters into out (names: the counted calls since the
 * previous snapshot). */
void cg_snapshot(cg_counts *out);
/* d = b - a for every counter (names taken from b). */
void cg_diff(const cg_counts *a, const cg_counts *b, cg_counts *d);
/* True when any counted call of d is nonzero (driver_calls excluded). */
bool cg_any(const cg_counts *d);
/* Prints one line: label, the counters of d and their names. */
void cg_print(const char *label, const cg_counts *d);
/* The driver's module loading mode (cuModuleGetLoadingMode): 1 lazy, 0 eager, -1 unknown. */
int cg_lazy_loading(void);
/* The device's free memory in bytes (cudaMemGetInfo of the current device); false on failure. */
bool cg_free_device_bytes(uint64_t *free_bytes);

#endif
