/* cuda_runtime.h of the CPU emulation (tests/cuda/emu): the few CUDA runtime types cuda_sample.cuh names */
#pragma once
#include <cstddef>
typedef void *cudaStream_t;
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
