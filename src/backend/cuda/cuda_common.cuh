/*
 * cuda_common.cuh — the few host helpers the CUDA backend (cuda_backend.cu) and its test entry points
 * (cuda_testing.cu, linked into the test binaries only) share: error conversion, the types with kernels and
 * their device row layout.
 */
#ifndef KILN_CUDA_COMMON_CUH
#define KILN_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.cuh"
#include <string.h>

extern "C" {
#include "base/error.h"
}

/* A matvec's arguments, all zero. */
static inline mv_args mv_base(void) {
    mv_args a;
    memset(&a, 0, sizeof a);
    return a;
}

static inline kiln_status cuda_fail(cudaError_t e, const char *what) {
    return kiln_fail(KILN_ERR_DEVICE, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CU_TRY(expr, what)                           \
    do {                                             \
        cudaError_t e_ = (expr);                     \
        if (e_ != cudaSuccess) return cuda_fail(e_, what); \
    } while (0)

static inline bool type_has_kernel(uint32_t t) { return t < 64 && ck_layout_of((int)t).values > 0; }

/* Device layout of a matrix of `type` (after conversion): q bytes per row, metadata halves per row. */
static inline void dev_geometry(uint32_t type, int in, long long *row_bytes, int *d_per_row) {
    const ck_layout L = ck_layout_of((int)type);
    const long long blocks = L.values ? in / L.values : 0;
    *row_bytes = blocks * L.q_len;
    *d_per_row = (int)(blocks * L.meta_slot / 2);
}

static inline size_t align_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

#endif
