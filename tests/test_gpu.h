/*
 * test_gpu.h — whether the GPU tests can run in this test binary: kiln built with CUDA, not under ASan (the
 * CUDA driver and ASan do not mix; `make test-cuda` runs them), and a GPU present. Otherwise the test is
 * marked skipped with the reason.
 */
#ifndef KILN_TEST_GPU_H
#define KILN_TEST_GPU_H

#include <stdbool.h>

#include "test.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KILN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_TEST_ASAN 1
#endif
#endif

/* True when the GPU tests can run here; otherwise marks the test skipped with the reason. */
static inline bool test_gpu_ready(void) {
#ifndef KILN_HAVE_CUDA
    test_skip("kiln was built without CUDA (nvcc not found)");
    return false;
#elif defined(KILN_TEST_ASAN)
    test_skip("ASan build: the CUDA driver and ASan do not mix; `make test-cuda` runs these on a GPU");
    return false;
#else
    kiln_cuda_device_info di;
    kiln_cuda_probe(&di);
    if (!di.present) {
        test_skip("no GPU: %s", di.reason);
        return false;
    }
    return true;
#endif
}

#endif
