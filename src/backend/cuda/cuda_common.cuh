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

static inline bool type_has_kernel(uint32_t t) {
    return t == CK_F32 || t == CK_F16 || t == CK_BF16 || t == CK_Q8_0 || t == CK_Q4_0 || t == CK_Q4_K || t == CK_Q6_K;
}

/* Device layout of a matrix of `type` (after conversion): q bytes per row, scales per row. */
static inline void dev_geometry(uint32_t type, int in, long long *row_bytes, int *d_per_row) {
    *d_per_row = 0;
    switch (type) {
    case CK_F32: *row_bytes = (long long)in * 4; break;
    case CK_F16:
    case CK_BF16: *row_bytes = (long long)in * 2; break;
    case CK_Q8_0: *row_bytes = in, *d_per_row = in / 32; break;
    case CK_Q4_0: *row_bytes = in / 2, *d_per_row = in / 32; break;
    case CK_Q4_K: *row_bytes = (long long)(in / 256) * 144; break;
    case CK_Q6_K: *row_bytes = (long long)(in / 256) * 208, *d_per_row = in / 256; break;
    default: *row_bytes = 0; break;
    }
}

static inline size_t align_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

#endif
