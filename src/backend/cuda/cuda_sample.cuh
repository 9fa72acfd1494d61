/*
 * cuda_sample.cuh — sampling on the device (cuda_sample.cu): each row's next id drawn from its logits as its
 * kiln_sample_spec says (sample_spec.h), with the math of kiln_sample (src/sample/sample.c), by passes of many
 * blocks per row over slices of the vocabulary, so that only 4 bytes per row come back. Host launchers for
 * cuda_backend.cu and cuda_testing.cu.
 */
#ifndef KILN_CUDA_SAMPLE_CUH
#define KILN_CUDA_SAMPLE_CUH

#include <cuda_runtime.h>
#include <stddef.h>

#include "sample/sample_spec.h"

/* Threads of a block of the sampling kernel. */
#define CK_SAMPLE_THREADS 1024
/* Launches of the sampling kernel per call of ck_sample (its passes). */
#define CK_SAMPLE_PASSES 5

/* The sampling kernel, for the eager load at open (cudaFuncGetAttributes). */
const void *ck_sample_kernel(void);

/* Bytes of device scratch ck_sample needs per row of n_vocab logits. */
size_t ck_sample_scratch_bytes(int n_vocab);

/* Where in a row's scratch an int32 says how the row's last sample was drawn: 0 by the multi-block passes, 1 by
 * the whole chain on one block (for the tests). */
size_t ck_sample_path_offset(void);

/* For each row r < n_rows whose specs[r].mode is KILN_SPEC_SAMPLE: applies the penalties to logits + r * stride
 * in place (n_vocab floats), then writes the chosen id to ids[r]; rows of mode KILN_SPEC_NONE are left alone
 * (ids[r] untouched). scratch: n_rows x ck_sample_scratch_bytes(n_vocab) bytes, zero before the first call
 * (each call leaves it ready for the next: one buffer serves every call, e.g. inside a captured graph). specs,
 * logits, ids and scratch are device memory. CK_SAMPLE_PASSES launches: the first an ordinary one (it starts after the kernel
 * before it has finished), the others programmatic (PDL) launches when PDL is on for this thread. */
void ck_sample(const kiln_sample_spec *specs, float *logits, int n_vocab, size_t stride, int n_rows, int *ids,
               void *scratch, cudaStream_t stream);

#endif
