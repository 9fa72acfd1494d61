/* cuda_kernels.cuh of the CPU emulation (tests/cuda/emu): nothing cuda_sample.cu needs */
#pragma once
